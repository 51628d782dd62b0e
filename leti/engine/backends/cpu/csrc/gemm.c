/* LETI's own single-precision GEMM for the CPU backend (AVX2 + FMA), with the bias and activation
 * fused into the micro-kernel's store.
 *
 *   y[m x n] = act(a[m x k] . B[k x n] + bias)
 *
 * B is the layer's weights, packed once when a session is prepared (the shapes are static): panels
 * of NR = 16 columns, each panel k x 16 contiguous and zero-padded past n (ckernels.pack). a and y
 * are row-major with row strides lda / ldy, used in place: an NHWC feature map is already the
 * (pixels x channels) matrix, so nothing is copied on the activation side.
 *
 * Blocking (Zen 3: 32 KiB L1d, 512 KiB L2 per core): k in blocks of KC = 256 (AVX-512: kc512, 512; a 16 KiB B
 * micro-panel stays in L1 while six rows of a stream past it), panels in chunks of PC = 16 (256 KiB
 * of B in L2, reused by every row group). The micro-kernel keeps a 6 x 16 block of y in 12 ymm
 * registers: per k, two loads of B, six broadcasts of a, twelve FMAs. Rows past a multiple of 6
 * run the same kernel with fewer rows; columns past n are computed against the zero padding and
 * stored with a mask, except in a last panel of at most 8 columns (n = 24, 40, ...), which runs one
 * vector of columns: half the FMAs (3136 x 144 x 24: 1.20x; 12544 x 32 x 8: 1.48x, one thread). Later k blocks add to what the earlier ones stored; the last one applies the
 * bias and the activation (0 none, 1 relu, 2 relu6) before its store, while the block is still in
 * registers; a residual (a shortcut added after a convolution) is added there too.
 *
 * One call is single-threaded: the engine splits rows (or panels, for few rows) over numba's
 * thread pool and calls this once per part. Built at first use by leti/engine/backends/cpu/ckernels.py.
 */
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define MR 6
#define NR 16
#define KC 256
#define PC 16

static inline __attribute__((always_inline)) __m256 finish(__m256 v, __m256 b, int64_t act) {
    return activate(_mm256_add_ps(v, b), act);
}

#define ROW(r)                                                                                      \
    if (mr > r) {                                                                                   \
        __m256 av = _mm256_broadcast_ss(a + r * lda + p);                                           \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                 \
        if (!half) c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                      \
    }

#define STORE(r)                                                                                    \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (nr == NR) {                                                                             \
            if (!first) {                                                                           \
                c##r##0 = _mm256_add_ps(c##r##0, _mm256_loadu_ps(yr));                              \
                c##r##1 = _mm256_add_ps(c##r##1, _mm256_loadu_ps(yr + 8));                          \
            }                                                                                       \
            if (last) {                                                                             \
                if (res) {                                                                          \
                    c##r##0 = _mm256_add_ps(c##r##0, _mm256_loadu_ps(res + r * ldy));                \
                    c##r##1 = _mm256_add_ps(c##r##1, _mm256_loadu_ps(res + r * ldy + 8));            \
                }                                                                                   \
                c##r##0 = finish(c##r##0, bias0, act);                                              \
                c##r##1 = finish(c##r##1, bias1, act);                                              \
            }                                                                                       \
            _mm256_storeu_ps(yr, c##r##0);                                                          \
            _mm256_storeu_ps(yr + 8, c##r##1);                                                      \
        } else {                                                                                    \
            if (!first) {                                                                           \
                c##r##0 = _mm256_add_ps(c##r##0, _mm256_maskload_ps(yr, m0));                       \
                if (!half) c##r##1 = _mm256_add_ps(c##r##1, _mm256_maskload_ps(yr + 8, m1));        \
            }                                                                                       \
            if (last) {                                                                             \
                if (res) {                                                                          \
                    c##r##0 = _mm256_add_ps(c##r##0, _mm256_maskload_ps(res + r * ldy, m0));         \
                    if (!half)                                                                      \
                        c##r##1 = _mm256_add_ps(c##r##1, _mm256_maskload_ps(res + r * ldy + 8, m1)); \
                }                                                                                   \
                c##r##0 = finish(c##r##0, bias0, act);                                              \
                if (!half) c##r##1 = finish(c##r##1, bias1, act);                                   \
            }                                                                                       \
            _mm256_maskstore_ps(yr, m0, c##r##0);                                                   \
            if (!half) _mm256_maskstore_ps(yr + 8, m1, c##r##1);                                    \
        }                                                                                           \
    }

/* y[mr x nr] (op)= a[mr x kc] . b[kc x 16]; mr is a compile-time constant after inlining */
static inline __attribute__((always_inline)) void
micro(const int mr, const int half, int64_t kc, const float *restrict a, int64_t lda, const float *restrict b,
      float *restrict y, int64_t ldy, int64_t nr, int first, int last, const float *bias, const float *res,
      int64_t act, const float *pfb) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; ++p) {
        if (pfb) _mm_prefetch((const char *)(pfb + p * NR), _MM_HINT_T1); /* one line of the next panel */
        __m256 b0 = _mm256_load_ps(b + p * NR);
        __m256 b1 = half ? b0 : _mm256_load_ps(b + p * NR + 8);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
    if (last && bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
    }
    __m256i m0 = lane_mask(nr < 8 ? nr : 8), m1 = lane_mask(nr > 8 ? nr - 8 : 0);
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
}

/* one micro-kernel call, its row count turned into a compile-time constant (half is a literal at every call) */
static inline __attribute__((always_inline)) void
tile(int64_t rows, const int half, int64_t kc, const float *a, int64_t lda, const float *b, float *y, int64_t ldy,
     int64_t nr, int first, int last, const float *bias, const float *res, int64_t act, const float *pfb) {
    switch (rows) {
    case 6: micro(6, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 5: micro(5, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 4: micro(4, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 3: micro(3, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 2: micro(2, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    default: micro(1, half, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    }
}

/* rows/pixels r of a 12-high tile of one vector of columns (mr of them live; mr a compile-time constant), shared by
 * micro_h12 and micro_window_h12; a window has one k block (first = last = 1) */
#define ROWH(r) \
    if (mr > r) c##r = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * lda + p), b0, c##r);
#define STOREH(r)                                                                                   \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (!first) c##r = _mm256_add_ps(c##r, _mm256_maskload_ps(yr, m0));                         \
        if (last) {                                                                                 \
            if (res) c##r = _mm256_add_ps(c##r, _mm256_maskload_ps(res + r * ldy, m0));             \
            c##r = finish(c##r, bias0, act);                                                        \
        }                                                                                           \
        if (nr == 8) _mm256_storeu_ps(yr, c##r);                                                    \
        else _mm256_maskstore_ps(yr, m0, c##r);                                                     \
    }

/* A half-empty last panel (at most 8 columns) over 12 rows: twelve accumulators of one vector each, where
 * micro's six-row tile keeps six and leaves the FMA pipes waiting on their latency (n = 24: 112 x 112 x 32 ->
 * 24, RegNetX's first 1x1, 1.2x). Later k blocks add to what the earlier ones stored, as in micro. */
static void micro_h12(int64_t kc, const float *restrict a, int64_t lda, const float *restrict b, float *restrict y,
                      int64_t ldy, int64_t nr, int first, int last, const float *bias, const float *res, int64_t act) {
    const int mr = 12;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    __m256 c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps(), c6 = _mm256_setzero_ps(), c7 = _mm256_setzero_ps();
    __m256 c8 = _mm256_setzero_ps(), c9 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; ++p) {
        __m256 b0 = _mm256_load_ps(b + p * NR);
        ROWH(0) ROWH(1) ROWH(2) ROWH(3) ROWH(4) ROWH(5) ROWH(6) ROWH(7) ROWH(8) ROWH(9) ROWH(10) ROWH(11)
    }
    __m256 bias0 = last && bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    __m256i m0 = lane_mask(nr);
    STOREH(0) STOREH(1) STOREH(2) STOREH(3) STOREH(4) STOREH(5) STOREH(6) STOREH(7) STOREH(8) STOREH(9)
    STOREH(10) STOREH(11)
}

/* Three rows x two full panels (32 columns) in the same twelve accumulators as micro's 6 x 16: per k step three
 * broadcasts of a and four loads of B instead of six and two. Within +-4 % on this Zen 3 when the core is ours
 * alone, but when the host runs another tenant on the core's other hardware thread the leaner k step takes 0.85-0.95x
 * the time (12544 x 32 x 64, 784 x 32 x 192, 3136 x 24 x 144; bench_cpu_gemm.py, docs/engine.md) - like ONNX
 * Runtime's NCHWc kernels, which broadcast one input per four weight vectors. It reads a as micro (kh = nsub = 1,
 * seglen = k) or as micro_window (the window's segments); panel two is pstride floats after panel one. Each element
 * sums the same products in the same order as micro, so the outputs are the same bit for bit. */
#define PROW(r)                                                                                     \
    if (mr > r) {                                                                                   \
        __m256 av = _mm256_broadcast_ss(a + r * lda + p);                                           \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                 \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                 \
        c##r##2 = _mm256_fmadd_ps(av, b2, c##r##2);                                                 \
        c##r##3 = _mm256_fmadd_ps(av, b3, c##r##3);                                                 \
    }
#define PSTORE1(r, j)                                                                               \
    {                                                                                               \
        if (!first) c##r##j = _mm256_add_ps(c##r##j, _mm256_loadu_ps(yr + 8 * j));                  \
        if (last) {                                                                                 \
            if (res) c##r##j = _mm256_add_ps(c##r##j, _mm256_loadu_ps(res + r * ldy + 8 * j));       \
            c##r##j = finish(c##r##j, bias##j, act);                                                \
        }                                                                                           \
        _mm256_storeu_ps(yr + 8 * j, c##r##j);                                                      \
    }
#define PSTORE(r)                                                                                   \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        PSTORE1(r, 0) PSTORE1(r, 1) PSTORE1(r, 2) PSTORE1(r, 3)                                     \
    }

static inline __attribute__((always_inline)) void
micro_pair(const int mr, const int first, const int last, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride,
           int64_t sub_stride, const float *restrict a0, int64_t lda, const float *restrict bpanel, int64_t pstride,
           float *restrict y, int64_t ldy, const float *bias, const float *res, int64_t act, const float *pfb) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c22 = _mm256_setzero_ps(), c23 = _mm256_setzero_ps();
    const float *b = bpanel;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < nsub; ++t, b += seglen * NR) {
            const float *a = a0 + s * row_stride + t * sub_stride, *bb = b + pstride;
            for (int64_t p = 0; p < seglen; ++p) {
                if (pfb) _mm_prefetch((const char *)(pfb + p * NR), _MM_HINT_T1); /* one line of the next panel */
                __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
                __m256 b2 = _mm256_load_ps(bb + p * NR), b3 = _mm256_load_ps(bb + p * NR + 8);
                PROW(0) PROW(1) PROW(2)
            }
        }
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = bias0, bias2 = bias0, bias3 = bias0;
    if (last && bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
        bias2 = _mm256_loadu_ps(bias + 16);
        bias3 = _mm256_loadu_ps(bias + 24);
    }
    PSTORE(0) PSTORE(1) PSTORE(2)
}

static int pair_panels = 1;
/* pairs of full panels in micro_pair tiles (1, the default) or each panel in micro's (0); < 0 only asks */
int64_t leti_set_pair_panels(int64_t on) {
    if (on >= 0) pair_panels = (int)on;
    return pair_panels;
}

/* A tile of at most 6 rows (pixels) over a pair of full panels as two micro_pair tiles of at most 3, mr a constant
 * after inlining; the first prefetches one line per k step of pf1, the second of pf2 (either may be 0). */
static inline __attribute__((always_inline)) void
pair_tile(int64_t rows, const int first, const int last, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride,
          int64_t sub_stride, const float *a, int64_t lda, const float *b, int64_t pstride, float *y, int64_t ldy,
          const float *bias, const float *res, int64_t act, const float *pf1, const float *pf2) {
    int64_t top = (rows + 1) / 2;
#define PAIR(MR_, A_, Y_, RES_, PF_)                                                                \
    micro_pair(MR_, first, last, kh, nsub, seglen, row_stride, sub_stride, A_, lda, b, pstride, Y_, ldy, bias, RES_, \
               act, PF_)
    switch (top) {
    case 3: PAIR(3, a, y, res, pf1); break;
    case 2: PAIR(2, a, y, res, pf1); break;
    default: PAIR(1, a, y, res, pf1); break;
    }
    const float *a2 = a + top * lda, *r2 = res ? res + top * ldy : 0;
    float *y2 = y + top * ldy;
    switch (rows - top) {
    case 3: PAIR(3, a2, y2, r2, pf2); break;
    case 2: PAIR(2, a2, y2, r2, pf2); break;
    case 1: PAIR(1, a2, y2, r2, pf2); break;
    default: break;
    }
#undef PAIR
}

/* Four rows x 24 columns: the last full panel and a half panel of exactly 8 columns after it (n = 24, 56, 152: RegNet,
 * MobileNet v2's 24-channel products), read as micro_pair reads a; per k step four broadcasts and three loads for twelve
 * FMAs, where the full panel's 6 x 16 tiles and the half panel's 12 x 8 ones take eighteen broadcasts per 24 FMAs. */
#define TROW(r)                                                                                     \
    if (mr > r) {                                                                                   \
        __m256 av = _mm256_broadcast_ss(a + r * lda + p);                                           \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                 \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                 \
        c##r##2 = _mm256_fmadd_ps(av, b2, c##r##2);                                                 \
    }
#define TSTORE1(r, j)                                                                               \
    {                                                                                               \
        if (res) c##r##j = _mm256_add_ps(c##r##j, _mm256_loadu_ps(res + r * ldy + 8 * j));           \
        _mm256_storeu_ps(y + r * ldy + 8 * j, finish(c##r##j, bias##j, act));                       \
    }
#define TSTORE(r) if (mr > r) { TSTORE1(r, 0) TSTORE1(r, 1) TSTORE1(r, 2) }

static inline __attribute__((always_inline)) void
micro_24(const int mr, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride, int64_t sub_stride,
         const float *restrict a0, int64_t lda, const float *restrict bpanel, int64_t pstride, float *restrict y,
         int64_t ldy, const float *bias, const float *res, int64_t act) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c22 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c32 = _mm256_setzero_ps();
    const float *b = bpanel;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < nsub; ++t, b += seglen * NR) {
            const float *a = a0 + s * row_stride + t * sub_stride, *bb = b + pstride;
            for (int64_t p = 0; p < seglen; ++p) {
                __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
                __m256 b2 = _mm256_load_ps(bb + p * NR);
                TROW(0) TROW(1) TROW(2) TROW(3)
            }
        }
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = bias0, bias2 = bias0;
    if (bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
        bias2 = _mm256_loadu_ps(bias + 16);
    }
    TSTORE(0) TSTORE(1) TSTORE(2) TSTORE(3)
}

/* rows r0..r1-1 in balanced tiles of at most 4 over the last full panel and the 8-column one after it (micro_24) */
static inline __attribute__((always_inline)) void
tail24_rows(int64_t r0, int64_t r1, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride, int64_t sub_stride,
            const float *a, int64_t lda, const float *b, int64_t pstride, float *y, int64_t ldy, const float *bias,
            const float *res, int64_t act) {
    for (int64_t i = r0, rows; i < r1; i += rows) {
        int64_t left = r1 - i, tiles_left = (left + 3) / 4;
        rows = (left + tiles_left - 1) / tiles_left;
        const float *ai = a + i * lda, *rs = res ? res + i * ldy : 0;
        float *yi = y + i * ldy;
#define T24(MR_) micro_24(MR_, kh, nsub, seglen, row_stride, sub_stride, ai, lda, b, pstride, yi, ldy, bias, rs, act)
        switch (rows) {
        case 4: T24(4); break;
        case 3: T24(3); break;
        case 2: T24(2); break;
        default: T24(1); break;
        }
#undef T24
    }
}

static int tail24 = 1;
/* the last full panel and an 8-column one after it in micro_24 tiles (1, the default) or in micro's and micro_h12's
 * (0); < 0 only asks */
int64_t leti_set_wide_tail(int64_t on) {
    if (on >= 0) tail24 = (int)on;
    return tail24;
}

/* ---- AVX-512 (session 21) ---------------------------------------------------------------------------------------
 * A host with full-width AVX-512 (Zen 5) runs a 512-bit FMA in the time of a 256-bit one, and the peers of
 * bench_engine_cpu.py use it there (MobileNet v1 at one thread: TFLite 5.1 ms, the AVX2 engine 9.4, 6.5 with this).
 * A full panel of 16 columns is one zmm, so this micro-kernel keeps a 12 x 16 block of y in 12 zmm accumulators: per
 * k, one load of B, twelve broadcasts of a, twelve FMAs; a partial panel is a store mask. Compiled for avx512f by the
 * target attribute, used when the CPU has it unless LETI_AVX512=0 (or leti_set_avx512(0)); half panels (at most 8
 * columns) keep the AVX2 tiles. (On a Zen 4, whose 512-bit FMAs are two 256-bit halves, session 18 measured a
 * similar kernel at 0.94-1.16x the AVX2 one.) */
#define MR512 12

static int use512 = -1;

static inline int avx512_on(void) {
    if (use512 < 0) {
        const char *e = getenv("LETI_AVX512");
        use512 = !(e && e[0] == '0') && __builtin_cpu_supports("avx512f");
    }
    return use512;
}

/* ask for the AVX-512 products (on = 1) or the AVX2 ones (on = 0), or only ask which are used (on < 0); returns
 * whether AVX-512 is used (the CPU must have avx512f) */
int64_t leti_set_avx512(int64_t on) {
    if (on >= 0) use512 = on && __builtin_cpu_supports("avx512f");
    return avx512_on();
}

/* ---- Which products and windows take the AVX-512 tiles on a core that runs them as two 256-bit halves (session 50) --
 * A Zen 4 (AMD family 0x19 with avx512f) issues a 512-bit FMA as two 256-bit ones: the AVX-512 tiles do no more FMAs
 * per cycle than the AVX2 ones, and lose where their lanes idle. Measured there (one thread, leti_sgemm alone, the
 * two ISAs interleaved; docs/engine.md, session 50): the AVX-512 tiles take 1.31-1.44x the AVX2 time on products to
 * 24 columns (a 32-column paired tile with 8 columns masked off), 1.05-1.25x to 56 and 152, 1.01-1.10x at k < 128,
 * where the 6 x 64 quads and the 12-row tiles set up more than they compute; from k = 128 on with whole 16-column
 * panels they take 0.81-0.99x (fewer loads and broadcasts per FMA), and 0.83-0.85x on a single row (a classifier).
 * RegNet's groups of 8 in pairs (leti_window_pairs512) take ~1.4x the AVX2 windows that skip the padding in place.
 * Under 100 rows the AVX-512 tiles won on every shape tried (0.84-0.96x), and from k = 128 on, or past 192 columns at
 * 256-392 rows, the AVX2 ones lost by up to 24 %. So there a product takes the AVX2 tiles when its last panel is at
 * most half full (from NARROW_MIN_ROWS rows) or its depth is under NARROW_MIN_K (from NARROW_MIN_ROWS_K rows, at most
 * NARROW_MAX_N_K columns), and groups of at most 8 outputs take the AVX2 windows. On a full-width core (Zen
 * 5, where session 24 measured the pairs at 0.6-0.75x the AVX2 windows) nothing changes. LETI_NARROW512=0/1 or
 * leti_set_narrow512 overrides the detection. */
#define NARROW_MIN_ROWS 128
#define NARROW_MIN_K 128
#define NARROW_MIN_ROWS_K 256
#define NARROW_MAX_N_K 192

static int narrow512 = -1;

static int detect_narrow512(void) {
    const char *e = getenv("LETI_NARROW512");
    if (e && e[0]) return e[0] != '0';
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u /* "Auth" */) return 0; /* AuthenticAMD */
    __get_cpuid(1, &a, &b, &c, &d);
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    return family == 0x19 && __builtin_cpu_supports("avx512f"); /* Zen 4 (Zen 3, also 0x19, has no avx512f) */
}

/* ask for the narrow-core choices (on = 1) or none (on = 0), or only ask (on < 0); returns whether they apply */
int64_t leti_set_narrow512(int64_t on) {
    if (on >= 0) narrow512 = (int)on;
    else if (narrow512 < 0) narrow512 = detect_narrow512();
    return narrow512;
}

/* whether a product of m_whole rows, n columns and depth k takes the AVX-512 tiles (the same for every part of it, so
 * that a product run in parts sums as the whole one) */
static inline int product512(int64_t m_whole, int64_t n, int64_t k) {
    if (!avx512_on()) return 0;
    if (!leti_set_narrow512(-1)) return 1;
    int64_t tail = n % NR;
    int half = tail > 0 && tail <= NR / 2;
    int shallow = k < NARROW_MIN_K && n <= NARROW_MAX_N_K && m_whole >= NARROW_MIN_ROWS_K;
    return !((half && m_whole >= NARROW_MIN_ROWS) || shallow);
}

/* product512 for the tests (tests/engine/test_narrow512.py): a product's rows, columns and depth */
int64_t leti_product512(int64_t m, int64_t n, int64_t k) {
    return product512(m, n, k);
}

/* whether a window of co outputs a group takes the AVX-512 windows (leti_window_rows512, leti_window_pairs512) */
int64_t leti_window512(int64_t co) {
    return avx512_on() && !(co <= 8 && leti_set_narrow512(-1));
}

#define ROWZ(r) \
    if (mr > r) c##r = rows12_fmadd(&ra, r, b0, c##r);
#define STOREZ(r)                                                                                   \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (!first) c##r = _mm512_add_ps(c##r, _mm512_maskz_loadu_ps(m0, yr));                      \
        if (last) {                                                                                 \
            if (res) c##r = _mm512_add_ps(c##r, _mm512_maskz_loadu_ps(m0, res + r * ldy));          \
            c##r = activate512(_mm512_add_ps(c##r, bias0), act);                                    \
        }                                                                                           \
        _mm512_mask_storeu_ps(yr, m0, c##r);                                                        \
    }

static inline AVX512 __attribute__((always_inline)) void
micro512(const int mr, int64_t kc, const float *restrict a, int64_t lda, const float *restrict b, float *restrict y,
         int64_t ldy, int64_t nr, int first, int last, const float *bias, const float *res, int64_t act,
         const float *pfb) {
    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(), c3 = _mm512_setzero_ps();
    __m512 c4 = _mm512_setzero_ps(), c5 = _mm512_setzero_ps(), c6 = _mm512_setzero_ps(), c7 = _mm512_setzero_ps();
    __m512 c8 = _mm512_setzero_ps(), c9 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    rows12 ra = rows12_at(a, lda, mr);
    for (int64_t p = 0; p < kc; ++p, rows12_next(&ra)) {
        if (pfb) _mm_prefetch((const char *)(pfb + p * NR), _MM_HINT_T1); /* one line of the next panel */
        __m512 b0 = _mm512_loadu_ps(b + p * NR);
        ROWZ(0) ROWZ(1) ROWZ(2) ROWZ(3) ROWZ(4) ROWZ(5) ROWZ(6) ROWZ(7) ROWZ(8) ROWZ(9) ROWZ(10) ROWZ(11)
    }
    __m512 bias0 = last && bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __mmask16 m0 = nr >= NR ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    STOREZ(0) STOREZ(1) STOREZ(2) STOREZ(3) STOREZ(4) STOREZ(5) STOREZ(6) STOREZ(7) STOREZ(8) STOREZ(9)
    STOREZ(10) STOREZ(11)
}

static AVX512 void tile512(int64_t rows, int64_t kc, const float *a, int64_t lda, const float *b, float *y,
                           int64_t ldy, int64_t nr, int first, int last, const float *bias, const float *res,
                           int64_t act, const float *pfb) {
    switch (rows) {
    case 12: micro512(12, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 11: micro512(11, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 10: micro512(10, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 9: micro512(9, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 8: micro512(8, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 7: micro512(7, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 6: micro512(6, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 5: micro512(5, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 4: micro512(4, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 3: micro512(3, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    case 2: micro512(2, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    default: micro512(1, kc, a, lda, b, y, ldy, nr, first, last, bias, res, act, pfb); break;
    }
}

/* Two panels at once (32 columns): per k, two loads of B, up to twelve broadcasts of a, twice as many FMAs. The
 * one-panel tile issues a load for every FMA (twelve broadcasts and B against twelve FMAs), which bounds it by the
 * load ports rather than the FMA units; a pair of panels halves the loads per FMA. 24 accumulators, two B vectors
 * and one broadcast: 27 of the 32 zmm registers. The second panel may be partial (a store mask). */
#define ROWZ2(r)                                                                                    \
    if (mr > r) {                                                                                   \
        __m512 av = rows12_bcast(&ra, r);                                                           \
        c##r = _mm512_fmadd_ps(av, b0, c##r);                                                       \
        d##r = _mm512_fmadd_ps(av, b1, d##r);                                                       \
    }
#define STOREZ2(r)                                                                                  \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (!first) {                                                                               \
            c##r = _mm512_add_ps(c##r, _mm512_loadu_ps(yr));                                        \
            d##r = _mm512_add_ps(d##r, _mm512_maskz_loadu_ps(m1, yr + NR));                         \
        }                                                                                           \
        if (last) {                                                                                 \
            if (res) {                                                                              \
                c##r = _mm512_add_ps(c##r, _mm512_loadu_ps(res + r * ldy));                         \
                d##r = _mm512_add_ps(d##r, _mm512_maskz_loadu_ps(m1, res + r * ldy + NR));          \
            }                                                                                       \
            c##r = activate512(_mm512_add_ps(c##r, bias0), act);                                    \
            d##r = activate512(_mm512_add_ps(d##r, bias1), act);                                    \
        }                                                                                           \
        _mm512_storeu_ps(yr, c##r);                                                                 \
        if (nr2 >= NR)                                                                              \
            _mm512_storeu_ps(yr + NR, d##r);                                                        \
        else                                                                                        \
            _mm512_mask_storeu_ps(yr + NR, m1, d##r);                                               \
    }

static inline AVX512 __attribute__((always_inline)) void
micro512x2(const int mr, int64_t kc, const float *restrict a, int64_t lda, const float *restrict b,
           const float *restrict b2, float *restrict y, int64_t ldy, int64_t nr2, int first, int last,
           const float *bias, const float *res, int64_t act, const float *pfb, const float *pfb2) {
    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(), c3 = _mm512_setzero_ps();
    __m512 c4 = _mm512_setzero_ps(), c5 = _mm512_setzero_ps(), c6 = _mm512_setzero_ps(), c7 = _mm512_setzero_ps();
    __m512 c8 = _mm512_setzero_ps(), c9 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps(), d2 = _mm512_setzero_ps(), d3 = _mm512_setzero_ps();
    __m512 d4 = _mm512_setzero_ps(), d5 = _mm512_setzero_ps(), d6 = _mm512_setzero_ps(), d7 = _mm512_setzero_ps();
    __m512 d8 = _mm512_setzero_ps(), d9 = _mm512_setzero_ps(), d10 = _mm512_setzero_ps(), d11 = _mm512_setzero_ps();
    rows12 ra = rows12_at(a, lda, mr);
    for (int64_t p = 0; p < kc; ++p, rows12_next(&ra)) {
        if (pfb) {
            _mm_prefetch((const char *)(pfb + p * NR), _MM_HINT_T1);
            _mm_prefetch((const char *)(pfb2 + p * NR), _MM_HINT_T1);
        }
        __m512 b0 = _mm512_loadu_ps(b + p * NR), b1 = _mm512_loadu_ps(b2 + p * NR);
        ROWZ2(0) ROWZ2(1) ROWZ2(2) ROWZ2(3) ROWZ2(4) ROWZ2(5) ROWZ2(6) ROWZ2(7) ROWZ2(8) ROWZ2(9) ROWZ2(10) ROWZ2(11)
    }
    __m512 bias0 = last && bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __m512 bias1 = last && bias ? _mm512_loadu_ps(bias + NR) : _mm512_setzero_ps();
    __mmask16 m1 = nr2 >= NR ? (__mmask16)0xFFFF : (__mmask16)((1u << nr2) - 1u);
    STOREZ2(0) STOREZ2(1) STOREZ2(2) STOREZ2(3) STOREZ2(4) STOREZ2(5) STOREZ2(6) STOREZ2(7) STOREZ2(8) STOREZ2(9)
    STOREZ2(10) STOREZ2(11)
}

/* micro512x2 with its row count made a compile-time constant; the flags stay constants where the caller's are
 * (pair_rows512), run-time values elsewhere (tile512x2) */
static inline AVX512 __attribute__((always_inline)) void
rows512x2(int64_t rows, int64_t kc, const float *a, int64_t lda, const float *b, const float *b2, float *y,
          int64_t ldy, int64_t nr2, int first, int last, const float *bias, const float *res, int64_t act,
          const float *pfb, const float *pfb2) {
#define T2(n) micro512x2(n, kc, a, lda, b, b2, y, ldy, nr2, first, last, bias, res, act, pfb, pfb2); break;
    switch (rows) {
    case 12: T2(12) case 11: T2(11) case 10: T2(10) case 9: T2(9) case 8: T2(8) case 7: T2(7)
    case 6: T2(6) case 5: T2(5) case 4: T2(4) case 3: T2(3) case 2: T2(2) default: T2(1)
    }
#undef T2
}

static AVX512 void tile512x2(int64_t rows, int64_t kc, const float *a, int64_t lda, const float *b, const float *b2,
                             float *y, int64_t ldy, int64_t nr2, int first, int last, const float *bias,
                             const float *res, int64_t act, const float *pfb, const float *pfb2) {
    rows512x2(rows, kc, a, lda, b, b2, y, ldy, nr2, first, last, bias, res, act, pfb, pfb2);
}

static int pair512 = -1;
/* the paired-panel tiles on (1) or off (0), or only ask (< 0); LETI_GEMM_PAIR=0 turns them off */
int64_t leti_set_pair512(int64_t on) {
    if (on >= 0) pair512 = (int)on;
    if (pair512 < 0) {
        const char *e = getenv("LETI_GEMM_PAIR");
        pair512 = !(e && e[0] == '0');
    }
    return pair512;
}

/* Panel q (and q + 1, when they pair: returns how many) of a row tile at a k block with the AVX-512 tiles; pfb, pfb2:
 * weights to fetch into L2 meanwhile, or 0 (block512). */
static inline AVX512 __attribute__((always_inline)) int64_t
panels512(int64_t rows, int64_t n, int64_t k, int64_t k0, int64_t kc, int first, int last, int64_t q, int64_t q1,
          int pair, const float *ai, int64_t lda, const float *bp, float *yi, int64_t ldy, const float *bias,
          const float *ri, int64_t act, const float *pfb, const float *pfb2) {
    int64_t nr = n - q * NR < NR ? n - q * NR : NR, nr2 = n - (q + 1) * NR < NR ? n - (q + 1) * NR : NR;
    const float *bq = bp + (q * k + k0) * NR, *bs = bias ? bias + q * NR : 0, *rs = ri ? ri + q * NR : 0;
    float *yq = yi + q * NR;
    if (pair && q + 1 < q1 && nr == NR && nr2 > 0) {
        /* two panels, the second one's columns by mask, a half one too (24 columns: 154 -> 179 GFLOP/s on 3136 x 96
         * x 24, 113 -> 152 on 12544 x 16 x 24, one thread), where the AVX2 tiles under a one-panel tile read A again
         * and broadcast each element twice */
        tile512x2(rows, kc, ai, lda, bq, bq + k * NR, yq, ldy, nr2, first, last, bs, rs, act, pfb, pfb2);
        return 2;
    }
    if (nr > 8) {
        tile512(rows, kc, ai, lda, bq, yq, ldy, nr, first, last, bs, rs, act, pfb);
    } else if (rows == 2 * MR) {
        micro_h12(kc, ai, lda, bq, yq, ldy, nr, first, last, bs, rs, act);
    } else { /* a half panel under fewer than 12 rows: the AVX2 tiles, at most 6 rows each */
        for (int64_t j = 0, r; j < rows; j += r) {
            r = rows - j > MR ? (rows - j + 1) / 2 : rows - j;
            tile(r, 1, kc, ai + j * lda, lda, bq, yq + j * ldy, ldy, nr, first, last, bs, rs ? rs + j * ldy : 0, act, 0);
        }
    }
    return 1;
}

static AVX512 void tail512(int64_t rows, int64_t n, int64_t k, int64_t k0, int64_t kc, int first, int last, int64_t q,
                           int64_t q1, const float *ai, int64_t lda, const float *bp, float *yi, int64_t ldy,
                           const float *bias, int64_t act) {
    while (q < q1) q += panels512(rows, n, k, k0, kc, first, last, q, q1, 1, ai, lda, bp, yi, ldy, bias, 0, act, 0, 0);
}

/* Row tiles i0.. of a k block (first, last: compile-time constants) against panels q0..q1-1, no residual, no weights to
 * fetch ahead: block512's tiles after its first two. The full pairs of panels are inlined into this loop with their
 * flags as constants, so that they compile without the flags' tests and the loop keeps its registers (the panels past
 * them, tail512, as block512 runs them); through block512's general loop and a call per tile, products of few inner
 * products had lost 2-8 % to the tiles' entries and exits (one thread, a C harness built with the library's flags:
 * 12544 x 32 x 64 189 -> 210 GFLOP/s, 3136 x 128 x 128 221 -> 226, 196 x 512 x 512 225 -> 229; MobileNet v1 / v2 1-2 %
 * faster, paired in one process against leti_set_pair_rows(0)). */
static inline AVX512 __attribute__((always_inline)) void
pair_rows512(const int first, const int last, int64_t i0, int64_t m, int64_t n, int64_t k, int64_t k0, int64_t kc,
             int64_t q0, int64_t q1, const float *a, int64_t lda, const float *bp, float *y, int64_t ldy,
             const float *bias, int64_t act) {
    int64_t full = n / NR < q1 ? n / NR : q1, qt = q0 + (full - q0) / 2 * 2; /* the full pairs: q0..qt-1 */
    for (int64_t i = i0, rows; i < m; i += rows) {
        int64_t left = m - i, tiles_left = (left + MR512 - 1) / MR512;
        rows = (left + tiles_left - 1) / tiles_left;
        const float *ai = a + i * lda + k0;
        for (int64_t q = q0; q < qt; q += 2) {
            const float *bq = bp + (q * k + k0) * NR, *bs = bias ? bias + q * NR : 0;
            rows512x2(rows, kc, ai, lda, bq, bq + k * NR, y + i * ldy + q * NR, ldy, NR, first, last, bs, 0, act, 0, 0);
        }
        if (qt < q1) tail512(rows, n, k, k0, kc, first, last, qt, q1, ai, lda, bp, y + i * ldy, ldy, bias, act);
    }
}

#define PAIR_ROWS(f, l)                                                                                             \
    static AVX512 void pair_rows512_##f##l(int64_t i0, int64_t m, int64_t n, int64_t k, int64_t k0, int64_t kc,      \
                                           int64_t q0, int64_t q1, const float *a, int64_t lda, const float *bp,    \
                                           float *y, int64_t ldy, const float *bias, int64_t act) {                \
        pair_rows512(f, l, i0, m, n, k, k0, kc, q0, q1, a, lda, bp, y, ldy, bias, act);                             \
    }
PAIR_ROWS(1, 1)
PAIR_ROWS(1, 0)
PAIR_ROWS(0, 1)
PAIR_ROWS(0, 0)
#undef PAIR_ROWS

/* ---- Tiles of 6 rows x 64 columns for products of few inner products (session 45) ----------------------------------
 * With k <= QUAD_MAX_K (a 1x1 convolution over 16-96 channels: MobileNets' first expansions) a 12 x 32 tile spends a
 * large share of its time outside its FMAs (the bias, activation and 24 stores per 12 x 32 x k FMAs) and broadcasts
 * each element of a twice per 64 columns. Four panels under six rows: the same 24 accumulators, per k step six
 * broadcasts and four loads of B for 24 FMAs (12 + 2 with the pair), each row's 64 outputs stored as four whole lines.
 * One thread, warm, a C harness built with the library's flags (Zen 5): 12544 x 32 x 64 194 -> 207 GFLOP/s, 3136 x 64
 * x 128 222 -> 231, 12544 x 16 x 64 169 -> 185, 196 x 64 x 384 223 -> 238, 196 x 96 x 576 222 -> 227; at k = 128 and
 * more no better (3136 x 128 x 128 +1.5 %, 784 x 128 x 256 -0.4 %). Whole k (k <= QUAD_MAX_K < every k block), each
 * output the same FMAs in the same order as every other tile's: the same sums bit for bit whatever the columns' split.
 * The columns past the last whole 64 take the tiles below. leti_set_quad512(0) turns it off. */
#define QUAD_MAX_K 96
static int quad512 = 1;

/* the 6 x 64 tiles on (1) or off (0), or only ask (< 0) */
int64_t leti_set_quad512(int64_t on) {
    if (on >= 0) quad512 = (int)on;
    return quad512;
}

#define Q4ZERO(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define Q4FMA(r)                                                                                    \
    if (mr > r) {                                                                                   \
        __m512 av = _mm512_set1_ps(a##r[p]);                                                        \
        c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);                                                 \
        c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);                                                 \
        c##r##2 = _mm512_fmadd_ps(av, b2, c##r##2);                                                 \
        c##r##3 = _mm512_fmadd_ps(av, b3, c##r##3);                                                 \
    }
#define Q4STORE(r)                                                                                  \
    if (mr > r) {                                                                                   \
        float *yr = y + r * ldy;                                                                    \
        if (res) {                                                                                  \
            const float *rr = res + r * ldy;                                                        \
            c##r##0 = _mm512_add_ps(c##r##0, _mm512_loadu_ps(rr));                                  \
            c##r##1 = _mm512_add_ps(c##r##1, _mm512_loadu_ps(rr + NR));                             \
            c##r##2 = _mm512_add_ps(c##r##2, _mm512_loadu_ps(rr + 2 * NR));                         \
            c##r##3 = _mm512_add_ps(c##r##3, _mm512_loadu_ps(rr + 3 * NR));                         \
        }                                                                                           \
        _mm512_storeu_ps(yr, activate512(_mm512_add_ps(c##r##0, bias0), act));                      \
        _mm512_storeu_ps(yr + NR, activate512(_mm512_add_ps(c##r##1, bias1), act));                 \
        _mm512_storeu_ps(yr + 2 * NR, activate512(_mm512_add_ps(c##r##2, bias2), act));             \
        _mm512_storeu_ps(yr + 3 * NR, activate512(_mm512_add_ps(c##r##3, bias3), act));             \
    }

/* mr (compile-time) rows of a against four panels (b, the first; bstride floats apart), whole k, the epilogue of the
 * pair's last k block (the residual, then the bias and activation) */
static inline AVX512 __attribute__((always_inline)) void
micro512x4(const int mr, int64_t k, const float *restrict a, int64_t lda, const float *restrict b, int64_t bstride,
           float *restrict y, int64_t ldy, const float *bias, const float *res, int64_t act) {
    Q4ZERO(0) Q4ZERO(1) Q4ZERO(2) Q4ZERO(3) Q4ZERO(4) Q4ZERO(5)
    const float *a0 = a, *a1 = mr > 1 ? a + lda : a, *a2 = mr > 2 ? a + 2 * lda : a, *a3 = mr > 3 ? a + 3 * lda : a;
    const float *a4 = mr > 4 ? a + 4 * lda : a, *a5 = mr > 5 ? a + 5 * lda : a;
    for (int64_t p = 0; p < k; ++p) {
        const float *bk = b + p * NR;
        __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + bstride), b2 = _mm512_loadu_ps(bk + 2 * bstride);
        __m512 b3 = _mm512_loadu_ps(bk + 3 * bstride);
        Q4FMA(0) Q4FMA(1) Q4FMA(2) Q4FMA(3) Q4FMA(4) Q4FMA(5)
    }
    __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __m512 bias1 = bias ? _mm512_loadu_ps(bias + NR) : _mm512_setzero_ps();
    __m512 bias2 = bias ? _mm512_loadu_ps(bias + 2 * NR) : _mm512_setzero_ps();
    __m512 bias3 = bias ? _mm512_loadu_ps(bias + 3 * NR) : _mm512_setzero_ps();
    Q4STORE(0) Q4STORE(1) Q4STORE(2) Q4STORE(3) Q4STORE(4) Q4STORE(5)
}

/* columns 0..64 quads - 1 of y = act(a . B + bias + res), k <= QUAD_MAX_K: rows in balanced tiles of at most 6 */
static AVX512 void quads512(int64_t m, int64_t quads, int64_t k, const float *a, int64_t lda, const float *bp,
                            float *y, int64_t ldy, const float *bias, const float *res, int64_t act) {
    for (int64_t i = 0, rows; i < m; i += rows) {
        int64_t left = m - i, tiles_left = (left + 5) / 6;
        rows = (left + tiles_left - 1) / tiles_left;
        for (int64_t q = 0; q < quads; ++q) {
            const float *ai = a + i * lda, *bq = bp + 4 * q * k * NR, *bs = bias ? bias + 4 * q * NR : 0;
            const float *rs = res ? res + i * ldy + 4 * q * NR : 0;
            float *yq = y + i * ldy + 4 * q * NR;
#define Q4(R) case R: micro512x4(R, k, ai, lda, bq, k * NR, yq, ldy, bs, rs, act); break;
            switch (rows) { Q4(6) Q4(5) Q4(4) Q4(3) Q4(2) default: Q4(1) }
#undef Q4
        }
    }
}

/* The AVX-512 products' k block: 512 (a 12-row tile's 24 KiB of a stay in the 48 KiB L1 while a pair of panels'
 * 64 KiB of weights stream from L2, and y is read back half as often as with 256). Paired in one process against 256
 * (Zen 5, benchmarks' arms of leti_set_kc512, 80 rounds): MobileNet v1 0.977-0.989 / 0.973-0.986 the time (one / two
 * threads), v2 0.986 / 0.993, ResNet50 0.962, RegNetX-200MF 0.986 (one thread); 1024 no better than 512. Session 43
 * had measured 512 within +-0.5 % in the networks, with the tiles' flags still tested at run time. */
static int64_t kc512 = 512;
/* set the AVX-512 products' k block (kc > 0) or only ask; returns the value in force */
int64_t leti_set_kc512(int64_t kc) {
    if (kc > 0) kc512 = kc;
    return kc512;
}

static int pair_rows = 1;
/* block512's tiles after its first two through pair_rows512 (1) or its general loop (0), or only ask (< 0) */
int64_t leti_set_pair_rows(int64_t on) {
    if (on >= 0) pair_rows = (int)on;
    return pair_rows;
}

/* leti_sgemm's k block and chunk of panels q0..q1-1 with the AVX-512 tiles: rows in balanced tiles of at most 12 */
static AVX512 void block512(int64_t m, int64_t n, int64_t k, int64_t k0, int64_t kc, int first, int last, int64_t q0,
                            int64_t q1, const float *a, int64_t lda, const float *bp, float *y, int64_t ldy,
                            const float *bias, const float *res, int64_t act, const float *next, int64_t next_panels) {
    const int pair = (int)leti_set_pair512(-1), lean = pair_rows && pair && !res;
    int64_t i = 0;
    for (int64_t rows, tile_no = 0; i < m && !(lean && tile_no == 2); i += rows, ++tile_no) {
        int64_t left = m - i, tiles_left = (left + MR512 - 1) / MR512;
        rows = (left + tiles_left - 1) / tiles_left;
        const float *ai = a + i * lda + k0;
        for (int64_t q = q0, used; q < q1; q += used) {
            /* the first row tile fetches the next panel of this chunk into L2 while it works on this one; the
             * second fetches the same panel of the next chunk (next: its first panel at this k block, next_panels
             * of them), so that the next chunk's first tile finds its weights in L2 instead of memory (a 7x7 map's
             * products with megabytes of weights: ~15 % over their time with warm weights without it) */
            const float *ahead = tile_no == 1 && q - q0 < next_panels ? next + (q - q0) * k * NR : 0;
            const float *bq = bp + (q * k + k0) * NR;
            int64_t nr = n - q * NR < NR ? n - q * NR : NR, nr2 = n - (q + 1) * NR < NR ? n - (q + 1) * NR : NR;
            const float *pfb, *pfb2;
            if (pair && q + 1 < q1 && nr == NR && nr2 > 0) { /* a pair: its prefetches */
                pfb = i == 0 && q + 2 < q1 ? bq + 2 * k * NR : ahead;
                pfb2 = pfb == ahead ? (ahead && q + 1 - q0 < next_panels ? ahead + k * NR : 0) : pfb + k * NR;
                if (!pfb2) pfb2 = pfb;
            } else {
                pfb = i == 0 && q + 1 < q1 ? bq + k * NR : ahead;
                pfb2 = 0;
            }
            used = panels512(rows, n, k, k0, kc, first, last, q, q1, pair, ai, lda, bp, y + i * ldy, ldy, bias,
                             res ? res + i * ldy : 0, act, pfb, pfb2);
        }
    }
    if (i < m) {
        if (first && last) pair_rows512_11(i, m, n, k, k0, kc, q0, q1, a, lda, bp, y, ldy, bias, act);
        else if (first) pair_rows512_10(i, m, n, k, k0, kc, q0, q1, a, lda, bp, y, ldy, bias, act);
        else if (last) pair_rows512_01(i, m, n, k, k0, kc, q0, q1, a, lda, bp, y, ldy, bias, act);
        else pair_rows512_00(i, m, n, k, k0, kc, q0, q1, a, lda, bp, y, ldy, bias, act);
    }
}

/* y = act(a . B + bias + res) for rows 0..m-1 and columns 0..n-1; bp: packed B (ckernels.pack, 64-byte
 * aligned), bias: NULL or ceil(n/16)*16 floats (zero-padded), res: NULL or a residual laid out like y
 * (row stride ldy: a ResNet shortcut added in the same epilogue). */
/* The AVX2 products of more than FULL_MIN_ROWS rows and at most FULL_MAX_K inner products run K whole (no k blocks:
 * y is stored once, with the bias and activation) in blocks of rows whose slice of a fits FULL_BLOCK bytes (L2): a
 * block meets every panel in turn, each panel's k x 16 weights stay in L1 while the block's row tiles pass them. On
 * the Zen 3 host of session 25 (medians of 301 calls interleaved with the k-blocked order below, one thread, warm):
 * MobileNet v1's products 1-25 % faster (12544 x 32 x 64: 72 -> 89 GFLOP/s, 3136 x 64 x 128: 70 -> 77, 196 x 512 x
 * 512: 93 -> 97), MobileNet v2's 12544 x 16 x 96 41 -> 62, im2col products of k 576-2304 8-15 %; with 49 rows
 * (a 7 x 7 map) the k-blocked order stays ahead on three of five shapes, so a few rows keep it. */
#define FULL_MIN_ROWS 64
#define FULL_MAX_K 2304
#define FULL_BLOCK (128 << 10)

static int full_k = -1;
/* the whole-k row blocks on (1) or off (0), or only ask (< 0); LETI_GEMM_FULLK=0 turns them off */
int64_t leti_set_full_k(int64_t on) {
    if (on >= 0) full_k = (int)on;
    if (full_k < 0) {
        const char *e = getenv("LETI_GEMM_FULLK");
        full_k = !(e && e[0] == '0');
    }
    return full_k;
}

static void sgemm_full_k(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp, float *y,
                         int64_t ldy, const float *bias, const float *res, int64_t act) {
    int64_t panels = (n + NR - 1) / NR;
    /* a half-empty last panel takes 12-row tiles first (the rest below, 6 rows at a time), as in leti_sgemm */
    int64_t qh = n - (panels - 1) * NR <= 8 ? panels - 1 : panels, mh = qh < panels ? m / (2 * MR) * (2 * MR) : 0;
    /* a last full panel and an 8-column one after it: 4 x 24 tiles (micro_24), no 12-row ones */
    int t24 = tail24 && n % NR == 8 && panels >= 2;
    int64_t qend = t24 ? panels - 2 : panels;
    if (t24) mh = 0;
    int64_t paired = pair_panels ? (n / NR < qend ? n / NR : qend) / 2 * 2 : 0; /* full panels two at a time (micro_pair) */
    int64_t mb = FULL_BLOCK / (k * 4) / (2 * MR) * (2 * MR);
    if (mb < 2 * MR) mb = 2 * MR;
    for (int64_t i0 = 0; i0 < m;) {
        int64_t i1 = i0 + mb < m ? i0 + mb : m;
        if (m - i1 < 2 * MR) i1 = m; /* no block of a few rows at the end */
        /* a half-empty last panel: the block's 12-row tiles first, while its rows of a are in L2 */
        for (int64_t i = i0; i < (i1 < mh ? i1 : mh); i += 2 * MR) {
            int64_t off = (panels - 1) * NR;
            micro_h12(k, a + i * lda, lda, bp + qh * k * NR, y + i * ldy + off, ldy, n - off, 1, 1,
                      bias ? bias + off : 0, res ? res + i * ldy + off : 0, act);
        }
        if (t24)
            tail24_rows(i0, i1, 1, 1, k, 0, 0, a, lda, bp + qend * k * NR, k * NR, y + qend * NR, ldy,
                        bias ? bias + qend * NR : 0, res ? res + qend * NR : 0, act);
        for (int64_t q = 0, step; q < qend; q += step) {
            step = q < paired ? 2 : 1;
            int64_t nr = n - q * NR < NR ? n - q * NR : NR;
            const float *bq = bp + q * k * NR;
            /* the first block meets every panel first, from memory when the weights are cold: its first tile
             * fetches the next panel(s) into L2 (one line per k step) */
            const float *pfb = i0 == 0 && q + step < panels ? bq + step * k * NR : 0;
            const float *pf2 = pfb && step == 2 && q + 3 < panels ? pfb + k * NR : 0;
            for (int64_t i = i0, rows; i < i1; i += rows) {
                int64_t left = i1 - i, tiles_left = (left + MR - 1) / MR;
                rows = i < mh ? MR : (left + tiles_left - 1) / tiles_left; /* below mh: whole tiles */
                if (i < mh && q >= qh) continue;
                const float *ai = a + i * lda, *bs = bias ? bias + q * NR : 0, *rs = res ? res + i * ldy + q * NR : 0;
                float *yq = y + i * ldy + q * NR;
                if (step == 2)
                    pair_tile(rows, 1, 1, 1, 1, k, 0, 0, ai, lda, bq, k * NR, yq, ldy, bs, rs, act, i == i0 ? pfb : 0,
                              i == i0 ? pf2 : 0);
                else if (nr <= 8)
                    tile(rows, 1, k, ai, lda, bq, yq, ldy, nr, 1, 1, bs, rs, act, i == i0 ? pfb : 0);
                else
                    tile(rows, 0, k, ai, lda, bq, yq, ldy, nr, 1, 1, bs, rs, act, i == i0 ? pfb : 0);
            }
        }
        i0 = i1;
    }
}

void leti_sgemm_part(int64_t m_whole, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp,
                     float *y, int64_t ldy, const float *bias, const float *res, int64_t act);

void leti_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp, float *y,
                int64_t ldy, const float *bias, const float *res, int64_t act) {
    leti_sgemm_part(m, m, n, k, a, lda, bp, y, ldy, bias, res, act);
}

/* m rows of a product of m_whole rows, in the order (whole k or k blocks) the whole product takes, so that its sums are
 * the whole product's bit for bit: a native program's product run in bands (program.c, STEP_GEMM_DWCONV) */
void leti_sgemm_part(int64_t m_whole, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp,
                     float *y, int64_t ldy, const float *bias, const float *res, int64_t act) {
    const int z = product512(m_whole, n, k);
    if (quad512 && k <= QUAD_MAX_K && n >= 4 * NR && z) { /* whole 64s of columns by 6 x 64 tiles */
        int64_t done = n / (4 * NR) * 4 * NR;
        quads512(m, done / (4 * NR), k, a, lda, bp, y, ldy, bias, res, act);
        if (done == n) return;
        n -= done, bp += done * k, y += done, bias = bias ? bias + done : 0, res = res ? res + done : 0;
    }
    int64_t panels = (n + NR - 1) / NR;
    if (m_whole > FULL_MIN_ROWS && k <= FULL_MAX_K && !z &&
        (full_k > 0 || (full_k < 0 && leti_set_full_k(-1)))) {
        sgemm_full_k(m, n, k, a, lda, bp, y, ldy, bias, res, act);
        return;
    }
    const int64_t kb = z ? kc512 : KC;
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
        int64_t kc = k - k0 < kb ? k - k0 : kb;
        int first = k0 == 0, last = k0 + kc >= k;
        for (int64_t q0 = 0; q0 < panels; q0 += PC) {
            int64_t q1 = q0 + PC < panels ? q0 + PC : panels;
            if (z) {
                /* the chunk after this one: the next panels at this k block, or the first ones at the next */
                int64_t nq0 = q1 < panels ? q1 : 0, nk0 = q1 < panels ? k0 : k0 + kb;
                int64_t nnp = nk0 >= k ? 0 : (nq0 + PC < panels ? PC : panels - nq0);
                block512(m, n, k, k0, kc, first, last, q0, q1, a, lda, bp, y, ldy, bias, res, act,
                         bp + (nq0 * k + nk0) * NR, nnp);
                continue;
            }
            /* a half-empty last panel in this chunk takes 12-row tiles first (the rest below, 6 rows at a time) */
            int64_t qh = n - (q1 - 1) * NR <= 8 ? q1 - 1 : q1, mh = qh < q1 ? m / (2 * MR) * (2 * MR) : 0;
            for (int64_t i = 0; i < mh; i += 2 * MR) {
                int64_t off = (q1 - 1) * NR;
                micro_h12(kc, a + i * lda + k0, lda, bp + (qh * k + k0) * NR, y + i * ldy + off, ldy, n - off, first,
                          last, bias ? bias + off : 0, res ? res + i * ldy + off : 0, act);
            }
            /* rows in balanced tiles of at most MR: 49 rows as 5 x 5 + 4 x 6 rather than 8 x 6 + a one-row tile that
             * loads two vectors of B per two FMAs (a 7x7 map's products 1.5-5 % faster alone, others unchanged) */
            for (int64_t i = 0, rows; i < m; i += rows) {
                int64_t left = m - i, tiles_left = (left + MR - 1) / MR;
                rows = i < mh ? MR : (left + tiles_left - 1) / tiles_left; /* below mh: whole tiles (mh is a multiple) */
                const float *ai = a + i * lda + k0;
                for (int64_t q = q0; q < (i < mh ? qh : q1); ++q) {
                    int64_t nr = n - q * NR < NR ? n - q * NR : NR;
                    const float *bq = bp + (q * k + k0) * NR;
                    float *yq = y + i * ldy + q * NR;
                    const float *bs = bias ? bias + q * NR : 0;
                    const float *rs = res ? res + i * ldy + q * NR : 0;
                    /* the first row group meets every panel of this k block first, straight from memory when
                     * the weights are cold (a network's later layers: a few pixels, megabytes of weights);
                     * it fetches the next panel into L2 while it works on this one (weight-bound products
                     * 25-40 % faster cold, 4 x 4608 x 512: 0.68 -> 0.46 ms; nothing changes when B is cached) */
                    const float *pfb = i == 0 && q + 1 < q1 ? bq + k * NR : 0;
                    if (nr <= 8) /* a half-empty last panel: one vector of columns, half the FMAs */
                        tile(rows, 1, kc, ai, lda, bq, yq, ldy, nr, first, last, bs, rs, act, pfb);
                    else
                        tile(rows, 0, kc, ai, lda, bq, yq, ldy, nr, first, last, bs, rs, act, pfb);
                }
            }
        }
    }
}

/* The sliding-window convolution as an implicit GEMM, for windows over few input channels (a stem's
 * 3x3 over RGB) and for grouped convolutions: no column matrix. Row j of a tile of 6 output pixels reads
 * its patch straight from a zero-padded copy of the input (xp, width wp, cs channels per pixel): for each
 * window row, kw segments of ci contiguous floats (one segment of kw * ci when the window reads every
 * channel, cs == ci), and pixel j + 1 starts sw * cs floats after pixel j. B is the (kh * kw * ci) x n
 * weights packed as for leti_sgemm, so the window's segments are consecutive k rows of every panel. The
 * 12 accumulators stay in registers over the whole window; the bias, activation and residual are applied
 * before the only store; a last panel of at most 8 columns runs one vector of columns, as in leti_sgemm. */
static inline __attribute__((always_inline)) void
micro_window(const int mr, const int half, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride,
             int64_t sub_stride, const float *restrict a0, int64_t lda, const float *restrict bpanel,
             float *restrict y, int64_t ldy, int64_t nr, const float *bias, const float *res, int64_t act) {
    const int first = 1, last = 1;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    const float *b = bpanel;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < nsub; ++t, b += seglen * NR) {
            const float *a = a0 + s * row_stride + t * sub_stride;
            for (int64_t p = 0; p < seglen; ++p) {
                __m256 b0 = _mm256_load_ps(b + p * NR);
                __m256 b1 = half ? b0 : _mm256_load_ps(b + p * NR + 8);
                ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
            }
        }
    }
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
    if (bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
    }
    __m256i m0 = lane_mask(nr < 8 ? nr : 8), m1 = lane_mask(nr > 8 ? nr - 8 : 0);
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
}

/* The window for at most 8 output columns (a grouped convolution's group of 8: RegNet) over 7..12 pixels: one
 * vector of columns, so twelve accumulators fit where micro_window's six-pixel tile keeps six. Six independent
 * FMA chains cannot cover the FMA latency of two pipes (4 cycles x 2); twelve can, and the one weight load of a
 * k step is shared by twice the pixels. */
static inline __attribute__((always_inline)) void
micro_window_h12(const int mr, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride, int64_t sub_stride,
                 const float *restrict a0, int64_t lda, const float *restrict bpanel, float *restrict y, int64_t ldy,
                 int64_t nr, const float *bias, const float *res, int64_t act) {
    const int first = 1, last = 1;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    __m256 c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps(), c6 = _mm256_setzero_ps(), c7 = _mm256_setzero_ps();
    __m256 c8 = _mm256_setzero_ps(), c9 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    const float *b = bpanel;
    for (int64_t s = 0; s < kh; ++s) {
        for (int64_t t = 0; t < nsub; ++t, b += seglen * NR) {
            const float *a = a0 + s * row_stride + t * sub_stride;
            if (seglen == 8) { /* RegNet's groups of 8 channels: the segment unrolled */
                for (int64_t p = 0; p < 8; ++p) {
                    __m256 b0 = _mm256_load_ps(b + p * NR);
                    ROWH(0) ROWH(1) ROWH(2) ROWH(3) ROWH(4) ROWH(5) ROWH(6) ROWH(7) ROWH(8) ROWH(9) ROWH(10) ROWH(11)
                }
                continue;
            }
            for (int64_t p = 0; p < seglen; ++p) {
                __m256 b0 = _mm256_load_ps(b + p * NR);
                ROWH(0) ROWH(1) ROWH(2) ROWH(3) ROWH(4) ROWH(5) ROWH(6) ROWH(7) ROWH(8) ROWH(9) ROWH(10) ROWH(11)
            }
        }
    }
    __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    __m256i m0 = lane_mask(nr);
    STOREH(0) STOREH(1) STOREH(2) STOREH(3) STOREH(4) STOREH(5) STOREH(6) STOREH(7) STOREH(8) STOREH(9)
    STOREH(10) STOREH(11)
}

#define HALF12(mr) \
    micro_window_h12(mr, kh, nsub, seglen, row_stride, sub_stride, ai, lda, bh, yq, ldy, hn, biash, rs, act)

/* one micro_window call of at most 6 pixels, the count turned into a compile-time constant (half a literal at each call,
 * as tile() for micro) */
static inline __attribute__((always_inline)) void
window_tile(int64_t rows, const int half, int64_t kh, int64_t nsub, int64_t seglen, int64_t row_stride,
            int64_t sub_stride, const float *ai, int64_t lda, const float *bq, float *yq, int64_t ldy, int64_t nr,
            const float *bs, const float *rs, int64_t act) {
#define WINDOW(mr) micro_window(mr, half, kh, nsub, seglen, row_stride, sub_stride, ai, lda, bq, yq, ldy, nr, bs, rs, act)
    switch (rows) {
    case 6: WINDOW(6); break;
    case 5: WINDOW(5); break;
    case 4: WINDOW(4); break;
    case 3: WINDOW(3); break;
    case 2: WINDOW(2); break;
    default: WINDOW(1); break;
    }
#undef WINDOW
}

/* Output rows r0..r1-1 of one image for the ci input channels at xp and the n output channels at y:
 * y (oh x ow, row stride ldy per pixel) = act(conv(xp, W) + bias + res), xp the zero-padded input
 * (hp x wp x cs, already padded by pt/pl; the window reads channels 0..ci-1 of each pixel), stride sh/sw, no
 * dilation; bp the packed (kh * kw * ci) x n weights, bias padded to whole panels or NULL, res laid out like
 * y or NULL. */
void leti_window_rows512(const float *xp, int64_t wp, int64_t cs, int64_t ci, int64_t kh, int64_t kw, int64_t sh,
                         int64_t sw, const float *bp, int64_t n, float *y, int64_t ow, int64_t ldy, const float *bias,
                         const float *res, int64_t act, int64_t r0, int64_t r1);

int leti_window_pairs512(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                          int64_t sw, const float *bp, float *y, int64_t ow, const float *bias, const float *res,
                          int64_t act, int64_t r0, int64_t r1);

/* One output row's pixels 0..ow-1 (a segment of a row) for the ci input channels at xrow, the window origin of pixel 0
 * (row_stride floats between input rows, sw * cs between pixels), into y (ldy per pixel; res alike or NULL). */
static void window_seg(const float *xrow, int64_t row_stride, int64_t cs, int64_t ci, int64_t kh, int64_t kw, int64_t sw,
                       const float *bp, int64_t n, float *y, int64_t ow, int64_t ldy, const float *bias, const float *res,
                       int64_t act) {
    int64_t panels = (n + NR - 1) / NR, k = kh * kw * ci, lda = sw * cs;
    int64_t nsub = cs == ci ? 1 : kw, seglen = cs == ci ? kw * ci : ci, sub_stride = cs;
    /* a last panel of at most 8 columns (n = 8, 24, 56, 152: RegNet) runs apart from the full ones, one vector of
     * columns over tiles of 7-12 pixels while 7 or more are left, balanced (a 14-pixel row as 7 + 7, not 12 + a 2-pixel
     * tile whose two accumulators wait on the FMA latency: RegNetX-200MF 1.1-1.6 % faster at one thread, session 25);
     * until session 28 only n <= 8 did, and a half panel after full ones ran micro_window's six accumulators */
    int64_t qh = panels - 1, hn = n - qh * NR, full = hn <= 8 ? qh : panels;
    const float *bh = bp + qh * k * NR, *biash = bias ? bias + qh * NR : 0;
    int t24 = tail24 && hn == 8 && panels >= 2; /* the last full panel and the half one: 4 x 24 tiles (micro_24) */
    if (t24) full = panels - 2;
    int64_t i = 0;
    if (t24)
        tail24_rows(0, ow, kh, nsub, seglen, row_stride, sub_stride, xrow, lda, bp + full * k * NR, k * NR,
                    y + full * NR, ldy, bias ? bias + full * NR : 0, res ? res + full * NR : 0, act);
    else if (full < panels) {
        for (int64_t rows; ow - i > MR; i += rows) {
            int64_t left = ow - i, tiles_left = (left + 2 * MR - 1) / (2 * MR);
            rows = (left + tiles_left - 1) / tiles_left;
            int64_t off = i * ldy + qh * NR;
            const float *ai = xrow + i * lda, *rs = res ? res + off : 0;
            float *yq = y + off;
            switch (rows) {
            case 12: HALF12(12); break;
            case 11: HALF12(11); break;
            case 10: HALF12(10); break;
            case 9: HALF12(9); break;
            case 8: HALF12(8); break;
            default: HALF12(7); break;
            }
        }
        for (int64_t rows; i < ow; i += rows) { /* the last 1-6 pixels */
            int64_t left = ow - i, tiles_left = (left + MR - 1) / MR;
            rows = (left + tiles_left - 1) / tiles_left;
            int64_t off = i * ldy + qh * NR;
            window_tile(rows, 1, kh, nsub, seglen, row_stride, sub_stride, xrow + i * lda, lda, bh, y + off, ldy, hn,
                        biash, res ? res + off : 0, act);
        }
    }
    for (int64_t rows, j = 0; full > 0 && j < ow; j += rows) {
        int64_t left = ow - j, tiles_left = (left + MR - 1) / MR;
        rows = (left + tiles_left - 1) / tiles_left; /* balanced, as the products' row tiles */
        const float *ai = xrow + j * lda;
        for (int64_t q = 0, step; q < full; q += step) {
            step = pair_panels && (q + 2) * NR <= n ? 2 : 1; /* two full panels: micro_pair */
            const float *bq = bp + q * k * NR;
            int64_t off = j * ldy + q * NR;
            float *yq = y + off;
            const float *bs = bias ? bias + q * NR : 0;
            const float *rs = res ? res + off : 0;
            if (step == 2)
                pair_tile(rows, 1, 1, kh, nsub, seglen, row_stride, sub_stride, ai, lda, bq, k * NR, yq, ldy, bs, rs,
                          act, 0, 0);
            else
                window_tile(rows, 0, kh, nsub, seglen, row_stride, sub_stride, ai, lda, bq, yq, ldy,
                            n - q * NR < NR ? n - q * NR : NR, bs, rs, act);
        }
    }
}

static void window_rows(const float *xp, int64_t wp, int64_t cs, int64_t ci, int64_t kh, int64_t kw, int64_t sh,
                        int64_t sw, const float *bp, int64_t n, float *y, int64_t ow, int64_t ldy, const float *bias,
                        const float *res, int64_t act, int64_t r0, int64_t r1) {
    if (n > 8 && avx512_on()) { /* whole 16-column panels: the AVX-512 tiles of window512.c */
        leti_window_rows512(xp, wp, cs, ci, kh, kw, sh, sw, bp, n, y, ow, ldy, bias, res, act, r0, r1);
        return;
    }
    for (int64_t oy = r0; oy < r1; ++oy)
        window_seg(xp + oy * sh * wp * cs, wp * cs, cs, ci, kh, kw, sw, bp, n, y + oy * ow * ldy, ow, ldy, bias,
                   res ? res + oy * ow * ldy : 0, act);
}

/* Output rows r0..r1-1 of one image: y (oh x ow x groups*co, NHWC) = act(conv(xp, W) + bias + res), xp the
 * zero-padded input (hp x wp x groups*ci). Group g reads input channels g*ci .. in place and writes output
 * channels g*co .. with its own packed (kh * kw * ci) x co weights (bp: groups such stacks, each ceil(co/16)
 * panels) and its bias padded to whole panels (bias: groups such rows, or NULL); res is laid out like y or NULL.
 * groups = 1 is a plain convolution. Per output row, every group in turn: the input rows under the window stay in
 * cache across groups. */
void leti_conv_window(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                      int64_t sw, const float *bp, int64_t co, float *y, int64_t ow, const float *bias, const float *res,
                      int64_t act, int64_t r0, int64_t r1) {
    int64_t panels = (co + NR - 1) / NR, k = kh * kw * ci, cs = groups * ci, ldy = groups * co;
    /* RegNet's groups of 8: two per zmm (window512.c) */
    if (co == 8 && groups >= 2 && ci % 8 == 0 && leti_window512(co) &&
        leti_window_pairs512(xp, wp, ci, groups, kh, kw, sh, sw, bp, y, ow, bias, res, act, r0, r1))
        return;
    for (int64_t oy = r0; oy < r1; ++oy)
        for (int64_t g = 0; g < groups; ++g)
            window_rows(xp + g * ci, wp, cs, ci, kh, kw, sh, sw, bp + g * panels * k * NR, co, y + g * co, ow, ldy,
                        bias ? bias + g * panels * NR : 0, res ? res + g * co : 0, act, oy, oy + 1);
}

/* Work units u0..u1-1 of leti_conv_window's rows x groups, unit u = (output row u / groups, group u % groups), in that
 * order (each row's groups together, as leti_conv_window runs them). A native program splits a grouped window over its
 * threads by units rather than rows (program.c): a 7x7 map's 7 rows split 4 + 3 over two threads, its 7 x 46 units
 * 161 + 161. Each unit is computed as leti_conv_window computes it, so the outputs are the same bit for bit. */
void leti_conv_window_units(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                            int64_t sw, const float *bp, int64_t co, float *y, int64_t ow, const float *bias,
                            const float *res, int64_t act, int64_t u0, int64_t u1) {
    int64_t panels = (co + NR - 1) / NR, k = kh * kw * ci, cs = groups * ci, ldy = groups * co;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t oy = u / groups, g = u % groups;
        window_rows(xp + g * ci, wp, cs, ci, kh, kw, sh, sw, bp + g * panels * k * NR, co, y + g * co, ow, ldy,
                    bias ? bias + g * panels * NR : 0, res ? res + g * co : 0, act, oy, oy + 1);
    }
}

/* Columns j0..j1-1 of kh rows of the zero-padded input, the rows from iy0 on (rows past the input's are zeros), into
 * buf (kh rows of wp pixels of cs floats): column j holds x's column j - pl, or zeros. */
static void pad_rows(const float *x, int64_t h, int64_t wd, int64_t cs, int64_t iy0, int64_t kh, int64_t pl, float *buf,
                     int64_t wp, int64_t j0, int64_t j1) {
    for (int64_t s = 0; s < kh; ++s) {
        int64_t iy = iy0 + s;
        float *dst = buf + s * wp * cs;
        /* x's columns are j = pl .. pl+wd-1: zeros before a and from b on */
        int64_t a = pl < j0 ? j0 : pl > j1 ? j1 : pl, b = pl + wd < j0 ? j0 : pl + wd > j1 ? j1 : pl + wd;
        if (iy < 0 || iy >= h) a = b = j1; /* a row of zeros */
        if (a > j0) memset(dst + j0 * cs, 0, (size_t)((a - j0) * cs) * sizeof(float));
        if (b > a) memcpy(dst + a * cs, x + (iy * wd + a - pl) * cs, (size_t)((b - a) * cs) * sizeof(float));
        if (j1 > b) memset(dst + b * cs, 0, (size_t)((j1 - b) * cs) * sizeof(float));
    }
}

#define BORDER_PIXELS 12

/* window_edges.c: grouped windows of at most 8 columns a group read in place, taps on padding skipped */
int leti_edge_windows_take(int64_t co, int64_t pl, int64_t pr);
void leti_conv_window_edges(const float *x, int64_t h, int64_t wd, int64_t ci, int64_t groups, int64_t kh, int64_t kw,
                            int64_t sh, int64_t sw, int64_t pt, int64_t pl, const float *bp, int64_t co, float *y,
                            int64_t ow, const float *bias, const float *res, int64_t act, int64_t u0, int64_t u1);

/* leti_conv_window's units u0..u1-1 (unit u: output row u / groups, group u % groups) over x itself, the input
 * (h x wd x groups*ci) without a padded copy: a window reading padding (pt, pl, and past the bottom and right edges)
 * reads the rows under it from a copy of just those rows and columns, zeros outside the input, while the pixels whose
 * windows lie inside the input read x in place. Until session 28 a program first copied the whole input into a padded
 * buffer (a step of its own: RegNetX-200MF's 112 x 112 x 24 map, 1.2 MB, 0.05 ms of a 6-8 ms run; ~0.17 ms in all
 * its windows). Each output is computed as from the padded copy, so the results are the same bit for bit. */
void leti_conv_window_inplace(const float *x, int64_t h, int64_t wd, int64_t ci, int64_t groups, int64_t kh, int64_t kw,
                              int64_t sh, int64_t sw, int64_t pt, int64_t pl, const float *bp, int64_t co, float *y,
                              int64_t ow, const float *bias, const float *res, int64_t act, int64_t u0, int64_t u1) {
    int64_t panels = (co + NR - 1) / NR, k = kh * kw * ci, cs = groups * ci, ldy = groups * co, wp = (ow - 1) * sw + kw;
    if (!leti_window512(co) && leti_edge_windows_take(co, pl, wp - pl - wd)) { /* no copy: taps on padding skipped */
        leti_conv_window_edges(x, h, wd, ci, groups, kh, kw, sh, sw, pt, pl, bp, co, y, ow, bias, res, act, u0, u1);
        return;
    }
    /* the pixels whose windows lie inside the input's columns: lo .. hi-1 */
    int64_t lo = (pl + sw - 1) / sw, hi = wd + pl - kw >= 0 ? (wd + pl - kw) / sw + 1 : 0;
    if (lo > ow) lo = ow;
    if (hi > ow) hi = ow;
    if (hi < lo) hi = lo;
    /* border segments of at least BORDER_PIXELS, so that the tiles at a row's ends keep their width (a border pixel
     * alone in a one-pixel tile has one FMA chain: RegNetX's 7 x 7 windows ran 1.6x slower split 1 + 5 + 1); a map
     * whose rows have fewer than twice that many pixels is padded whole, the rows of these units once (a row's copy per
     * output row would copy each input row kh / sh times: its 14 x 14 windows 1.25x slower) */
    int whole_rows = lo == hi || ow <= 2 * BORDER_PIXELS;
    if (lo > 0 && lo < BORDER_PIXELS) lo = BORDER_PIXELS;
    if (hi < ow && hi > ow - BORDER_PIXELS) hi = ow - BORDER_PIXELS;
    if (hi <= lo) whole_rows = 1;
    if (whole_rows && lo == 0 && hi == ow) whole_rows = 0; /* no border at all */
    if (whole_rows || leti_window512(co)) { /* small maps, and the AVX-512 windows (whole padded rows: window512.c): the rows
                                       * of units u0..u1-1 padded once, as the padded copy held them */
        int64_t oy0 = u0 / groups, oy1 = (u1 + groups - 1) / groups, rows = (oy1 - oy0 - 1) * sh + kh;
        float *buf = malloc((size_t)(rows * wp * cs + 8) * sizeof(float));
        if (!buf) return; /* out of memory: the outputs keep what they held */
        pad_rows(x, h, wd, cs, oy0 * sh - pt, rows, pl, buf, wp, 0, wp);
        for (int64_t u = u0; u < u1; ++u) {
            int64_t oy = u / groups, g = u % groups;
            window_rows(buf + (oy - oy0) * sh * wp * cs + g * ci, wp, cs, ci, kh, kw, sh, sw, bp + g * panels * k * NR,
                        co, y + oy * ow * ldy + g * co, ow, ldy, bias ? bias + g * panels * NR : 0,
                        res ? res + oy * ow * ldy + g * co : 0, act, 0, 1);
        }
        free(buf);
        return;
    }
    float *buf = malloc((size_t)(kh * wp * cs + 8) * sizeof(float));
    if (!buf) return; /* out of memory: the outputs keep what they held */
    int64_t built = -1; /* the output row whose rows are in buf */
    for (int64_t u = u0; u < u1; ++u) {
        int64_t oy = u / groups, g = u % groups, iy0 = oy * sh - pt;
        int inside = iy0 >= 0 && iy0 + kh <= h;
        if (built != oy) {
            if (!inside)
                pad_rows(x, h, wd, cs, iy0, kh, pl, buf, wp, 0, wp);
            else { /* the columns of the border pixels only */
                if (lo > 0) pad_rows(x, h, wd, cs, iy0, kh, pl, buf, wp, 0, (lo - 1) * sw + kw);
                if (hi < ow) pad_rows(x, h, wd, cs, iy0, kh, pl, buf, wp, hi * sw, wp);
            }
            built = oy;
        }
        const float *bg = bp + g * panels * k * NR, *bsg = bias ? bias + g * panels * NR : 0;
        float *yr = y + oy * ow * ldy + g * co;
        const float *rr = res ? res + oy * ow * ldy + g * co : 0;
        if (!inside) {
            window_rows(buf + g * ci, wp, cs, ci, kh, kw, sh, sw, bg, co, yr, ow, ldy, bsg, rr, act, 0, 1);
            continue;
        }
        if (lo > 0)
            window_seg(buf + g * ci, wp * cs, cs, ci, kh, kw, sw, bg, co, yr, lo, ldy, bsg, rr, act);
        if (hi > lo)
            window_seg(x + (iy0 * wd + lo * sw - pl) * cs + g * ci, wd * cs, cs, ci, kh, kw, sw, bg, co, yr + lo * ldy,
                       hi - lo, ldy, bsg, rr ? rr + lo * ldy : 0, act);
        if (hi < ow)
            window_seg(buf + hi * sw * cs + g * ci, wp * cs, cs, ci, kh, kw, sw, bg, co, yr + hi * ldy, ow - hi, ldy,
                       bsg, rr ? rr + hi * ldy : 0, act);
    }
    free(buf);
}

/* Rows r0..r1-1 of the zero-padded copy xp (hp x wp x c) of x (h x wd x c), x placed at (pt, pl). */
void leti_pad_nhwc(const float *x, int64_t h, int64_t wd, int64_t c, float *xp, int64_t hp, int64_t wp, int64_t pt,
                   int64_t pl, int64_t r0, int64_t r1) {
    (void)hp;
    pad_rows(x, h, wd, c, r0 - pt, r1 - r0, pl, xp + r0 * wp * c, wp, 0, wp);
}
