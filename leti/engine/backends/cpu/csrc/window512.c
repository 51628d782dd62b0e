/* The sliding-window convolution (gemm.c's window_rows: a stem over RGB, ResNet's 7x7 stem, grouped convolutions
 * with more than 8 output channels per group) in AVX-512 tiles, for a CPU with full-width AVX-512 (Zen 5).
 *
 * gemm.c's AVX2 window keeps 6 pixels x 16 columns in 12 ymm accumulators and, on a core whose FMA units are 512
 * bits wide, does half the work per instruction it could: the 3x3/2 stem over RGB to 32 channels at 224 ran at
 * ~100 GFLOP/s where the products run at 240. Here a tile is up to 12 output pixels x two 16-column panels (24 zmm
 * accumulators, the products' paired tile of gemm.c): per k step two loads of B and one broadcast per pixel feed two
 * FMAs. Pixels come in balanced tiles of at most 12; the last panel of an odd count runs alone; a partial panel is a
 * store mask. The accumulators stay in registers over the whole window; bias, activation and residual are applied
 * before the only store. Called by window_rows (gemm.c) for every n > 8 where the AVX-512 products are on. */
#include "simd.h"

#define NR 16

#define WROW(r)                                                                                     \
    if (mr > r) {                                                                                   \
        if (two) {                                                                                  \
            __m512 av = rows12_bcast(&ra, r);                                                       \
            c##r = _mm512_fmadd_ps(av, b0, c##r);                                                   \
            d##r = _mm512_fmadd_ps(av, b1, d##r);                                                   \
        } else {                                                                                    \
            c##r = rows12_fmadd(&ra, r, b0, c##r);                                                  \
        }                                                                                           \
    }
#define WSTORE(r)                                                                                   \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (res) {                                                                                  \
            c##r = _mm512_add_ps(c##r, _mm512_maskz_loadu_ps(m0, res + r * ldy));                   \
            if (two) d##r = _mm512_add_ps(d##r, _mm512_maskz_loadu_ps(m1, res + r * ldy + NR));     \
        }                                                                                           \
        _mm512_mask_storeu_ps(yr, m0, activate512(_mm512_add_ps(c##r, bias0), act));                \
        if (two) _mm512_mask_storeu_ps(yr + NR, m1, activate512(_mm512_add_ps(d##r, bias1), act));  \
    }

/* mr output pixels (a compile-time constant after inlining) x one panel (two = 0) or two (two = 1) of the packed
 * weights: the window is kh rows of nsub segments of seglen consecutive k rows each; the second panel starts k * NR
 * floats after the first */
static inline AVX512 __attribute__((always_inline)) void
window_tile(const int mr, const int two, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride,
            int64_t sub_stride, const float *restrict a0, int64_t lda, const float *restrict bpanel, int64_t k,
            float *restrict y, int64_t ldy, int64_t nr, int64_t nr2, const float *bias, const float *res, int64_t act) {
    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(), c3 = _mm512_setzero_ps();
    __m512 c4 = _mm512_setzero_ps(), c5 = _mm512_setzero_ps(), c6 = _mm512_setzero_ps(), c7 = _mm512_setzero_ps();
    __m512 c8 = _mm512_setzero_ps(), c9 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps(), d2 = _mm512_setzero_ps(), d3 = _mm512_setzero_ps();
    __m512 d4 = _mm512_setzero_ps(), d5 = _mm512_setzero_ps(), d6 = _mm512_setzero_ps(), d7 = _mm512_setzero_ps();
    __m512 d8 = _mm512_setzero_ps(), d9 = _mm512_setzero_ps(), d10 = _mm512_setzero_ps(), d11 = _mm512_setzero_ps();
    const float *b = bpanel;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < nsub; ++t, b += seglen * NR) {
            rows12 ra = rows12_at(a0 + s * row_stride + t * sub_stride, lda, mr);
            for (int64_t p = 0; p < seglen; ++p, rows12_next(&ra)) {
                __m512 b0 = _mm512_loadu_ps(b + p * NR);
                __m512 b1 = two ? _mm512_loadu_ps(b + k * NR + p * NR) : b0;
                WROW(0) WROW(1) WROW(2) WROW(3) WROW(4) WROW(5) WROW(6) WROW(7) WROW(8) WROW(9) WROW(10) WROW(11)
            }
        }
    }
    __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __m512 bias1 = two && bias ? _mm512_loadu_ps(bias + NR) : _mm512_setzero_ps();
    __mmask16 m0 = nr >= NR ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    __mmask16 m1 = nr2 >= NR ? (__mmask16)0xFFFF : (__mmask16)((1u << nr2) - 1u);
    WSTORE(0) WSTORE(1) WSTORE(2) WSTORE(3) WSTORE(4) WSTORE(5) WSTORE(6) WSTORE(7) WSTORE(8) WSTORE(9)
    WSTORE(10) WSTORE(11)
}

#define WT(mr, two)                                                                                 \
    window_tile(mr, two, kh, nsub, seglen, row_stride, sub_stride, ai, lda, bq, k, yq, ldy, nr, nr2, bs, rs, act); \
    break;

/* gemm.c's window_rows with these tiles: the same arguments and layout */
AVX512 void leti_window_rows512(const float *xp, int64_t wp, int64_t cs, int64_t ci, int64_t kh, int64_t kw,
                                int64_t sh, int64_t sw, const float *bp, int64_t n, float *y, int64_t ow, int64_t ldy,
                                const float *bias, const float *res, int64_t act, int64_t r0, int64_t r1) {
    int64_t panels = (n + NR - 1) / NR, k = kh * kw * ci, row_stride = wp * cs, lda = sw * cs;
    int64_t nsub = cs == ci ? 1 : kw, seglen = cs == ci ? kw * ci : ci, sub_stride = cs;
    for (int64_t oy = r0; oy < r1; ++oy) {
        const float *xrow = xp + oy * sh * wp * cs;
        for (int64_t i = 0, rows; i < ow; i += rows) {
            int64_t left = ow - i, tiles_left = (left + 11) / 12;
            rows = (left + tiles_left - 1) / tiles_left;
            const float *ai = xrow + i * lda;
            for (int64_t q = 0; q < panels; q += 2) {
                int64_t nr = n - q * NR < NR ? n - q * NR : NR;
                int64_t nr2 = q + 1 < panels ? (n - (q + 1) * NR < NR ? n - (q + 1) * NR : NR) : 0;
                const float *bq = bp + q * k * NR;
                int64_t off = (oy * ow + i) * ldy + q * NR;
                float *yq = y + off;
                const float *bs = bias ? bias + q * NR : 0;
                const float *rs = res ? res + off : 0;
                if (nr2 > 0) {
                    switch (rows) {
                    case 12: WT(12, 1) case 11: WT(11, 1) case 10: WT(10, 1) case 9: WT(9, 1) case 8: WT(8, 1)
                    case 7: WT(7, 1) case 6: WT(6, 1) case 5: WT(5, 1) case 4: WT(4, 1) case 3: WT(3, 1)
                    case 2: WT(2, 1) default: WT(1, 1)
                    }
                } else {
                    switch (rows) {
                    case 12: WT(12, 0) case 11: WT(11, 0) case 10: WT(10, 0) case 9: WT(9, 0) case 8: WT(8, 0)
                    case 7: WT(7, 0) case 6: WT(6, 0) case 5: WT(5, 0) case 4: WT(4, 0) case 3: WT(3, 0)
                    case 2: WT(2, 0) default: WT(1, 0)
                    }
                }
            }
        }
    }
}

/* ---- Groups of 8 output channels two at a time (RegNet's grouped 3x3 convolutions) -----------------------------
 * With 8 output channels per group, one zmm holds a pair of groups: the AVX2 window ran one group per ymm, half the
 * width of the FMA units here. The lanes alternate between the two groups (lane 2o: output o of group g, lane
 * 2o + 1: output o of group g + 1), so that one pixel's input for a k step is a single 64-bit broadcast of the two
 * groups' channel c side by side: the padded input rows are first copied with the pair's channels interleaved
 * (x_g[c], x_g+1[c], ...), and the weights likewise, into a per-thread scratch buffer. A tile's accumulators are put
 * back into channel order (group g's 8, then group g + 1's: contiguous in NHWC) by one permute before the store.
 * (Two 32-bit broadcasts merged by a mask instead of one copy ran no faster than the AVX2 window on this Zen 5; the
 * copy costs a few percent.) An odd last group is paired with zeros and its store masked. Output rows go in blocks
 * whose interleaved input stays under PAIR_BLOCK_FLOATS. */
#include <stdlib.h>
#include <string.h>

#define PAIR_BLOCK_FLOATS (256 * 1024)

static __thread float *pair_buf = 0;
static __thread int64_t pair_cap = 0;

/* this thread's scratch of at least n floats (kept for the next call), or NULL */
static float *pair_scratch(int64_t n) {
    if (n > pair_cap) {
        free(pair_buf);
        pair_buf = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
        pair_cap = pair_buf ? n : 0;
    }
    return pair_buf;
}

static inline double two_floats(const float *p) {
    double d;
    memcpy(&d, p, sizeof d);
    return d;
}

/* 16 floats: a[0], b[0], a[1], b[1], ..., a[7], b[7] (the lower halves of a and b interleaved) */
static inline AVX512 __m512 interleave8(__m512 a, __m512 b) {
    const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    return _mm512_permutex2var_ps(a, idx, b);
}

#define PROW(r) \
    if (mr > r) c##r = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(two_floats(a + r * lda + 2 * p))), w, c##r);
#define PSTORE(r)                                                                                   \
    if (mr > r) {                                                                                   \
        __m512 v = _mm512_permutexvar_ps(order, c##r);                                              \
        if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m0, res + r * ldy));                    \
        _mm512_mask_storeu_ps(y + r * ldy, m0, activate512(_mm512_add_ps(v, bias0), act));          \
    }

/* mr pixels (a compile-time constant after inlining) of one pair of groups: a the interleaved input at the tile's
 * first pixel and the pair's channels, wi the pair's interleaved weights (k x 16) */
static inline AVX512 __attribute__((always_inline)) void
pair_tile(const int mr, int64_t kh, int64_t kw, int64_t ci, int64_t row_stride, int64_t pw, const float *restrict a0,
          int64_t lda, const float *restrict wi, float *restrict y, int64_t ldy, __m512 bias0, __mmask16 m0,
          const float *res, int64_t act) {
    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(), c3 = _mm512_setzero_ps();
    __m512 c4 = _mm512_setzero_ps(), c5 = _mm512_setzero_ps(), c6 = _mm512_setzero_ps(), c7 = _mm512_setzero_ps();
    __m512 c8 = _mm512_setzero_ps(), c9 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    const float *b = wi;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < kw; ++t, b += ci * NR) {
            const float *a = a0 + s * row_stride + t * pw;
            for (int64_t p = 0; p < ci; ++p) {
                __m512 w = _mm512_load_ps(b + p * NR);
                PROW(0) PROW(1) PROW(2) PROW(3) PROW(4) PROW(5) PROW(6) PROW(7) PROW(8) PROW(9) PROW(10) PROW(11)
            }
        }
    }
    const __m512i order = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    PSTORE(0) PSTORE(1) PSTORE(2) PSTORE(3) PSTORE(4) PSTORE(5) PSTORE(6) PSTORE(7) PSTORE(8) PSTORE(9)
    PSTORE(10) PSTORE(11)
}

#define PT(mr) \
    case mr: pair_tile(mr, kh, kw, ci, row_stride, pw, ai, lda, wj, yq, ldy, bias0, m0, rs, act); break;

/* leti_conv_window (gemm.c) for co = 8, at least two groups and ci a multiple of 8: the same arguments and layout
 * (xp the zero-padded input, every group's weights one packed panel, bias one padded panel per group or NULL).
 * Returns 0 when it has no scratch memory (the caller runs the AVX2 window), else 1. */
AVX512 int leti_window_pairs512(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw,
                                int64_t sh, int64_t sw, const float *bp, float *y, int64_t ow, const float *bias,
                                const float *res, int64_t act, int64_t r0, int64_t r1) {
    const int64_t co = 8, k = kh * kw * ci, cs = groups * ci, ldy = groups * co, pairs = (groups + 1) / 2;
    const int64_t pw = pairs * 2 * ci, row_floats = wp * pw, row_stride = row_floats, lda = sw * pw;
    int64_t block = (PAIR_BLOCK_FLOATS / row_floats - kh) / sh + 1;
    block = block < 1 ? 1 : block;
    block = block > r1 - r0 ? r1 - r0 : block;
    float *wi = pair_scratch(pairs * k * NR + ((block - 1) * sh + kh) * row_floats);
    if (!wi) return 0;
    float *xi = wi + pairs * k * NR;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i spread = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (int64_t j = 0; j < pairs; ++j) /* the weights, interleaved per pair */
        for (int64_t p = 0; p < k; ++p) {
            __m512 w0 = _mm512_loadu_ps(bp + (2 * j * k + p) * NR);
            __m512 w1 = 2 * j + 1 < groups ? _mm512_loadu_ps(bp + ((2 * j + 1) * k + p) * NR) : zero;
            _mm512_store_ps(wi + (j * k + p) * NR, interleave8(w0, w1));
        }
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
        int64_t b1 = b0 + block < r1 ? b0 + block : r1, ra = b0 * sh, rb = (b1 - 1) * sh + kh;
        for (int64_t row = ra; row < rb; ++row) /* the input rows under these output rows, interleaved per pair */
            for (int64_t px = 0; px < wp; ++px) {
                const float *src = xp + (row * wp + px) * cs;
                float *dst = xi + ((row - ra) * wp + px) * pw;
                int64_t j = 0;
                if (ci == 8) /* RegNet: a whole pair's 16 channels in one load */
                    for (; 2 * j + 1 < groups; ++j)
                        _mm512_storeu_ps(dst + j * 16, _mm512_permutexvar_ps(spread, _mm512_loadu_ps(src + j * 16)));
                for (; j < pairs; ++j)
                    for (int64_t c0 = 0; c0 < ci; c0 += 8) {
                        __m512 g0 = _mm512_maskz_loadu_ps(0x00FF, src + 2 * j * ci + c0);
                        __m512 g1 = 2 * j + 1 < groups ? _mm512_maskz_loadu_ps(0x00FF, src + (2 * j + 1) * ci + c0)
                                                       : zero;
                        _mm512_storeu_ps(dst + j * 2 * ci + 2 * c0, interleave8(g0, g1));
                    }
            }
        for (int64_t oy = b0; oy < b1; ++oy) {
            const float *xrow = xi + (oy * sh - ra) * row_floats;
            for (int64_t j = 0; j < pairs; ++j) {
                const int two = 2 * j + 1 < groups;
                const __mmask16 m0 = two ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
                const float *wj = wi + j * k * NR;
                __m512 bias0 = zero;
                if (bias) {
                    bias0 = _mm512_maskz_loadu_ps(0x00FF, bias + 2 * j * NR);
                    if (two) bias0 = _mm512_mask_loadu_ps(bias0, (__mmask16)0xFF00, bias + (2 * j + 1) * NR - 8);
                }
                for (int64_t i = 0, rows; i < ow; i += rows) {
                    int64_t left = ow - i, tiles_left = (left + 11) / 12;
                    rows = (left + tiles_left - 1) / tiles_left;
                    const float *ai = xrow + i * lda + j * 2 * ci;
                    int64_t off = (oy * ow + i) * ldy + 2 * j * co;
                    float *yq = y + off;
                    const float *rs = res ? res + off : 0;
                    switch (rows) {
                        PT(12) PT(11) PT(10) PT(9) PT(8) PT(7) PT(6) PT(5) PT(4) PT(3) PT(2) PT(1)
                    }
                }
            }
        }
    }
    return 1;
}
