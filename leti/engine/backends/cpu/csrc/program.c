/* A run of kernel calls executed as one program: the steps of a network that LETI's C kernels run
 * (matrix products, 3x3 depthwise convolutions, zero-padded copies, windows over few channels or groups),
 * in order, inside a single OpenMP parallel region, each step waiting for the one before (leti_set_step_waits).
 *
 * Driven one step at a time from Python, every step costs a numba dispatch and a parallel region of its
 * own: ~3 us at one thread, ~6 us at two, where the second thread is woken for each op. A MobileNet v2
 * has 52 such steps in a row, ~5-9 % of its run. Here the whole run is one call, the threads are started
 * once and each step ends when its last chunk is done.
 *
 * A program is n records of RECORD int64 each: the kind, then the kernel's arguments (pointers as
 * integers). Every kind splits its work over the threads as the numba driver of the same kernel does
 * (leti/engine/backends/cpu/gemm.py, dwconv.py), so the results are the same bit for bit; on more than one thread
 * the parts are cut into chunks that an idle thread may take from a slower one (leti_run_program).
 * Built with the other kernels into one library (ckernels.py), with OpenMP when the compiler has it
 * (the same libgomp as numba's thread pool, so both share one pool of threads).
 */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "simd.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define RECORD 20
#define MR 6
#define NR 16

enum { STEP_GEMM = 1, STEP_DWCONV = 2, STEP_PAD = 3, STEP_WINDOW = 4, STEP_MEAN = 5, STEP_SOFTMAX = 6, STEP_GEMV = 7,
       STEP_IM2COL = 8, STEP_POOL = 9, STEP_COPY_CHANNELS = 10, STEP_WINOGRAD_IN = 11, STEP_WINOGRAD_PRODUCTS = 12,
       STEP_WINOGRAD_OUT = 13, STEP_UNARY = 14, STEP_BINARY = 15, STEP_DWCONV_K = 16, STEP_SWAP_LAST_TWO = 17,
       STEP_WINDOW_IN_PLACE = 18, STEP_GEMM_DWCONV = 19 };

void leti_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp, float *y,
                int64_t ldy, const float *bias, const float *res, int64_t act);
void leti_sgemm_part(int64_t m_whole, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp,
                     float *y, int64_t ldy, const float *bias, const float *res, int64_t act);
void leti_dwconv3x3(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd,
                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1);
void leti_conv_window(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                      int64_t sw, const float *bp, int64_t co, float *y, int64_t ow, const float *bias, const float *res,
                      int64_t act, int64_t r0, int64_t r1);
void leti_pad_nhwc(const float *x, int64_t h, int64_t wd, int64_t c, float *xp, int64_t hp, int64_t wp, int64_t pt,
                   int64_t pl, int64_t r0, int64_t r1);
void leti_conv_window_units(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                            int64_t sw, const float *bp, int64_t co, float *y, int64_t ow, const float *bias,
                            const float *res, int64_t act, int64_t u0, int64_t u1);
void leti_conv_window_inplace(const float *x, int64_t h, int64_t wd, int64_t ci, int64_t groups, int64_t kh, int64_t kw,
                              int64_t sh, int64_t sw, int64_t pt, int64_t pl, const float *bp, int64_t co, float *y,
                              int64_t ow, const float *bias, const float *res, int64_t act, int64_t u0, int64_t u1);
int64_t leti_set_avx512(int64_t on);
int64_t leti_window512(int64_t co); /* gemm.c: whether a window of co outputs a group takes the AVX-512 tiles */
void leti_dwconv3x3_band(const float *x, int64_t x_row0, float *y, const float *w, const float *bias, int64_t h,
                         int64_t wd, int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                         int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1);
/* pointwise.c */
void leti_unary(const float *x, float *y, int64_t code, float alpha, float beta, int64_t i0, int64_t i1);
void leti_binary(const float *a, const float *b, float *y, const float *shift, int64_t px, int64_t c, int64_t bstride,
                 int64_t mode, int64_t op, int64_t act, int64_t p0, int64_t p1);
void leti_dwconv(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd, int64_t c,
                 int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                 int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1);
void leti_swap_last_two(const float *x, float *y, int64_t p, int64_t q, int64_t l0, int64_t l1);

/* y[b][o] = mean over the p pixels of x[b][.][o]: a float64 sum per channel in pixel order, as the numba kernel
 * (kernels.spatial_mean) */
static void spatial_mean(const float *x, float *y, int64_t nb, int64_t p, int64_t c) {
    double acc[1024];
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t o0 = 0; o0 < c; o0 += 1024) {
            int64_t oc = c - o0 < 1024 ? c - o0 : 1024;
            for (int64_t o = 0; o < oc; ++o) acc[o] = 0.0;
            for (int64_t i = 0; i < p; ++i) {
                const float *xr = x + (b * p + i) * c + o0;
                for (int64_t o = 0; o < oc; ++o) acc[o] += xr[o];
            }
            for (int64_t o = 0; o < oc; ++o) y[b * c + o0 + o] = (float)(acc[o] / (double)p);
        }
}

/* y[r] = softmax(beta * x[r]) row by row (pointwise.c) */
void leti_softmax_rows(const float *x, float *y, int64_t rows, int64_t c, float beta);

/* y[o] = act(x . w[:, o] + bias[o]) for the outputs of panels p0..p1-1: a fully connected layer at batch 1, its
 * weights packed as the products' (ckernels.pack: ceil(n/16) panels of k x 16, zero-padded). Why packed and not
 * one row per output: the weights are read once per inference, from memory when the network's working set has
 * left the cache, and one linear stream is what the prefetchers follow best. Measured on this Zen 3 host, 8 MB
 * of weights after 64 MB of other data: four rows at a time 0.31 ms, the packed stream 0.2 ms (XNNPACK 0.19-0.21);
 * warm (the kernel timed alone) the two are level. Two input elements per step, four accumulators. */
static void gemv_panels(const float *x, const float *wp, float *y, const float *bias, int64_t k, int64_t n,
                        int64_t act, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
        const float *w = wp + p * k * NR;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 2 <= k; j += 2, w += 2 * NR) {
            _mm_prefetch((const char *)(w + 1024), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + 1040), _MM_HINT_T0);
            __m256 x0 = _mm256_broadcast_ss(x + j), x1 = _mm256_broadcast_ss(x + j + 1);
            a0 = _mm256_fmadd_ps(x0, _mm256_load_ps(w), a0);
            a1 = _mm256_fmadd_ps(x0, _mm256_load_ps(w + 8), a1);
            a2 = _mm256_fmadd_ps(x1, _mm256_load_ps(w + 16), a2);
            a3 = _mm256_fmadd_ps(x1, _mm256_load_ps(w + 24), a3);
        }
        if (j < k) {
            __m256 x0 = _mm256_broadcast_ss(x + j);
            a0 = _mm256_fmadd_ps(x0, _mm256_load_ps(w), a0);
            a1 = _mm256_fmadd_ps(x0, _mm256_load_ps(w + 8), a1);
        }
        float t[NR];
        _mm256_storeu_ps(t, _mm256_add_ps(a0, a2)), _mm256_storeu_ps(t + 8, _mm256_add_ps(a1, a3));
        for (int64_t q = 0, o = p * NR; q < NR && o < n; ++q, ++o) y[o] = activate1(t[q] + (bias ? bias[o] : 0.0f), act);
    }
}

/* rows r0..r1-1 (of nb x oh) of the column matrix of a sliding window, as kernels.im2col:
 * col[(n*oh + y)*ow + x][(i*kw + j)*c + ch] = x[n][y*sh - pt + i*dh][x*sw - pl + j*dw][ch], 0 outside */
static void im2col_rows(const float *x, float *col, int64_t h, int64_t wd, int64_t c, int64_t kh, int64_t kw,
                        int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh,
                        int64_t ow, int64_t r0, int64_t r1) {
    size_t run = (size_t)c * sizeof(float);
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, y = r % oh;
        const float *xi = x + n * h * wd * c;
        for (int64_t xo = 0; xo < ow; ++xo) {
            float *dst = col + (r * ow + xo) * kh * kw * c;
            for (int64_t i = 0; i < kh; ++i) {
                int64_t yy = y * sh - pt + i * dh;
                for (int64_t j = 0; j < kw; ++j, dst += c) {
                    int64_t xx = xo * sw - pl + j * dw;
                    if (yy < 0 || yy >= h || xx < 0 || xx >= wd) memset(dst, 0, run);
                    else memcpy(dst, xi + (yy * wd + xx) * c, run);
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) __m256 pool_op(__m256 a, __m256 b, int is_max) {
    return is_max ? _mm256_max_ps(a, b) : _mm256_add_ps(a, b);
}

/* dst[t] = op over k < taps of src[t + k * step] (times scale for an average), t < cnt: one vector loop over a contiguous
 * run, as the numba kernel's (pooling.py) */
static inline __attribute__((always_inline)) void
fold(float *dst, const float *src, int64_t step, int64_t taps, int64_t cnt, int is_max, float scale, int64_t act) {
    const __m256 sv = _mm256_set1_ps(scale);
    int64_t t = 0;
    for (; t + 8 <= cnt; t += 8) {
        __m256 v = _mm256_loadu_ps(src + t);
        if (taps == 3) { /* the usual 3x3 window: unrolled */
            v = pool_op(v, _mm256_loadu_ps(src + step + t), is_max);
            v = pool_op(v, _mm256_loadu_ps(src + 2 * step + t), is_max);
        } else
            for (int64_t k = 1; k < taps; ++k) v = pool_op(v, _mm256_loadu_ps(src + k * step + t), is_max);
        if (!is_max && scale != 1.0f) v = _mm256_mul_ps(v, sv);
        _mm256_storeu_ps(dst + t, activate(v, act));
    }
    for (; t < cnt; ++t) {
        float v = src[t];
        for (int64_t k = 1; k < taps; ++k) v = is_max ? (src[k * step + t] > v ? src[k * step + t] : v) : v + src[k * step + t];
        dst[t] = activate1(is_max ? v : v * scale, act);
    }
}

/* rows r0..r1-1 (of nb x oh) of a max (is_max) or average pooling of x (nb x h x w x c) into y (nb x oh x ow x c):
 * the window's rows folded into tmp (w x c) in one run, then its columns: at stride 1 the interior columns (the
 * whole window inside) in one run too, the border columns one by one; averages over the taps inside the input
 * (TFLite's 'same' padding); act as in gemm.c */
static void pool_rows(const float *x, float *y, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int is_max, int64_t act, float *tmp,
                      int64_t r0, int64_t r1) {
    int64_t wc = w * c;
    int64_t xa = pl < ow ? pl : ow, xb = xa; /* stride 1: output columns xa..xb-1 read kw columns inside */
    if (sw == 1) {
        xb = w - kw + pl + 1 < ow ? w - kw + pl + 1 : ow;
        if (xb < xa) xb = xa;
    }
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, y0 = (r % oh) * sh - pt;
        int64_t a = y0 < 0 ? 0 : y0, b = y0 + kh < h ? y0 + kh : h, rows = b - a;
        float *yr = y + r * ow * c;
        if (rows <= 0) { /* a window wholly in the padding (never with 'same'): zeros */
            memset(yr, 0, (size_t)(ow * c) * sizeof(float));
            continue;
        }
        fold(tmp, x + (n * h + a) * wc, wc, rows, wc, is_max, 1.0f, 0);
        if (xb > xa)
            fold(yr + xa * c, tmp + (xa - pl) * c, c, kw, (xb - xa) * c, is_max, 1.0f / (float)(rows * kw), act);
        for (int64_t xo = 0; xo < ow; ++xo) {
            if (xo >= xa && xo < xb) continue;
            int64_t x0 = xo * sw - pl, c0 = x0 < 0 ? 0 : x0, c1 = x0 + kw < w ? x0 + kw : w;
            if (c1 <= c0) {
                memset(yr + xo * c, 0, (size_t)c * sizeof(float));
                continue;
            }
            fold(yr + xo * c, tmp + c0 * c, c, c1 - c0, c, is_max, 1.0f / (float)(rows * (c1 - c0)), act);
        }
    }
}

/* Winograd F(n x n, k x k), alpha = n + k - 1 <= 8, as winograd_transforms.py (the numba kernels): the input
 * transform of tiles r0+t0 .. r0+t1-1 of the batch (th x tw tiles per image, stride n, the tile's window at
 * (ty*n - pt, tx*n - pl), zero outside) into v[(a*alpha + b)][t][c] = (Bt d B)[a][b]; bt is Bt, alpha x alpha
 * row-major. Eight channels at a time (full: a whole vector, else masked), alpha and full compile-time constants
 * once inlined so that every loop below unrolls. */
/* sum over k < len of f[k] * s[k * stride] (plus *init when given): one row of a transform's small matrix against
 * len vectors */
static inline __attribute__((always_inline)) __m256 taps(const float *f, const __m256 *s, int stride, int len,
                                                         const __m256 *init) {
    __m256 acc = init ? _mm256_fmadd_ps(_mm256_set1_ps(f[0]), s[0], *init) : _mm256_mul_ps(_mm256_set1_ps(f[0]), s[0]);
    for (int k = 1; k < len; ++k) acc = _mm256_fmadd_ps(_mm256_set1_ps(f[k]), s[k * stride], acc);
    return acc;
}

#define WLOAD(p) (full ? _mm256_loadu_ps(p) : _mm256_maskload_ps((p), mask))
#define WSTORE(p, v) (full ? _mm256_storeu_ps((p), (v)) : _mm256_maskstore_ps((p), mask, (v)))

/* vec vectors of 8 channels from cb (vec = 2: a whole 64-byte line of every plane written at once; the planes lie
 * cnt * c floats apart, often a multiple of 4 KiB, so that all of them fall into one L1 set) */
static inline __attribute__((always_inline)) void
wino_in_block(const int alpha, const int full, const int inside, const int vec, const float *xb, const float *bt,
              float *v, __m256i mask, int64_t cnt, int64_t row, int64_t h, int64_t w, int64_t c, int64_t y0,
              int64_t x0, int64_t cb) {
    __m256 d[8][8][2], tmp[8][8][2];
    for (int i = 0; i < alpha; ++i)
        for (int j = 0; j < alpha; ++j) {
            int64_t yy = y0 + i, xx = x0 + j;
            int out = !inside && (yy < 0 || yy >= h || xx < 0 || xx >= w);
            for (int e = 0; e < vec; ++e)
                d[i][j][e] = out ? _mm256_setzero_ps() : WLOAD(xb + (yy * w + xx) * c + cb + 8 * e);
        }
    for (int a = 0; a < alpha; ++a) /* tmp = Bt d */
        for (int j = 0; j < alpha; ++j)
            for (int e = 0; e < vec; ++e) tmp[a][j][e] = taps(bt + a * alpha, &d[0][j][e], 16, alpha, 0);
    for (int a = 0; a < alpha; ++a) /* v = tmp B */
        for (int bb = 0; bb < alpha; ++bb)
            for (int e = 0; e < vec; ++e)
                WSTORE(v + ((a * alpha + bb) * cnt + row) * c + cb + 8 * e, taps(bt + bb * alpha, &tmp[a][0][e], 2, alpha, 0));
}

static inline __attribute__((always_inline)) void
wino_in_tiles(const int alpha, const float *x, const float *bt, float *v, int64_t cnt, int64_t n, int64_t pt,
              int64_t pl, int64_t th, int64_t tw, int64_t h, int64_t w, int64_t c, int64_t r0, int64_t t0, int64_t t1) {
    int64_t tiles = th * tw, c8 = c & ~(int64_t)7;
    __m256i mask = lane_mask(c - c8);
    for (int64_t row = t0; row < t1; ++row) {
        int64_t b = (r0 + row) / tiles, t = (r0 + row) % tiles, y0 = (t / tw) * n - pt, x0 = (t % tw) * n - pl;
        const float *xb = x + b * h * w * c;
        int64_t cb = 0;
        if (y0 >= 0 && x0 >= 0 && y0 + alpha <= h && x0 + alpha <= w) /* the tile inside the input: no bounds */
            for (; cb + 16 <= c8; cb += 16) wino_in_block(alpha, 1, 1, 2, xb, bt, v, mask, cnt, row, h, w, c, y0, x0, cb);
        else
            for (; cb + 16 <= c8; cb += 16) wino_in_block(alpha, 1, 0, 2, xb, bt, v, mask, cnt, row, h, w, c, y0, x0, cb);
        for (; cb < c8; cb += 8) wino_in_block(alpha, 1, 0, 1, xb, bt, v, mask, cnt, row, h, w, c, y0, x0, cb);
        if (c8 < c) wino_in_block(alpha, 0, 0, 1, xb, bt, v, mask, cnt, row, h, w, c, y0, x0, c8);
    }
}

/* the output transform: y[b][ty*n + i][tx*n + j][:] = act((At M A)[i][j] + bias) inside y (oh x ow), M's planes
 * m[p][t][oc] for tiles r0+t0 .. r0+t1-1; at is At, n x alpha row-major */
static inline __attribute__((always_inline)) void
wino_out_block(const int alpha, const int n, const int full, const int vec, const float *m, const float *at,
               float *yb, const float *bias, int64_t act, __m256i mask, int64_t cnt, int64_t row, int64_t oh,
               int64_t ow, int64_t oc, int64_t y0, int64_t x0, int64_t cb) {
    __m256 mm[8][8][2], tmp[8][8][2];
    const __m256 zero = _mm256_setzero_ps();
    for (int a = 0; a < alpha; ++a)
        for (int bb = 0; bb < alpha; ++bb)
            for (int e = 0; e < vec; ++e) mm[a][bb][e] = WLOAD(m + ((a * alpha + bb) * cnt + row) * oc + cb + 8 * e);
    for (int i = 0; i < n; ++i) /* tmp = At M */
        for (int bb = 0; bb < alpha; ++bb)
            for (int e = 0; e < vec; ++e) tmp[i][bb][e] = taps(at + i * alpha, &mm[0][bb][e], 16, alpha, 0);
    for (int e = 0; e < vec; ++e) {
        __m256 bv = bias ? WLOAD(bias + cb + 8 * e) : zero;
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {
                __m256 acc = activate(taps(at + j * alpha, &tmp[i][0][e], 2, alpha, &bv), act);
                if (y0 + i < oh && x0 + j < ow) WSTORE(yb + ((y0 + i) * ow + x0 + j) * oc + cb + 8 * e, acc);
            }
    }
}

static inline __attribute__((always_inline)) void
wino_out_tiles(const int alpha, const int n, const float *m, const float *at, float *y, const float *bias,
               int64_t act, int64_t cnt, int64_t th, int64_t tw, int64_t oh, int64_t ow, int64_t oc, int64_t r0,
               int64_t t0, int64_t t1) {
    int64_t tiles = th * tw, c8 = oc & ~(int64_t)7;
    __m256i mask = lane_mask(oc - c8);
    for (int64_t row = t0; row < t1; ++row) {
        int64_t b = (r0 + row) / tiles, t = (r0 + row) % tiles, y0 = (t / tw) * n, x0 = (t % tw) * n;
        float *yb = y + b * oh * ow * oc;
        int64_t cb = 0;
        for (; cb + 16 <= c8; cb += 16)
            wino_out_block(alpha, n, 1, 2, m, at, yb, bias, act, mask, cnt, row, oh, ow, oc, y0, x0, cb);
        for (; cb < c8; cb += 8) wino_out_block(alpha, n, 1, 1, m, at, yb, bias, act, mask, cnt, row, oh, ow, oc, y0, x0, cb);
        if (c8 < oc) wino_out_block(alpha, n, 0, 1, m, at, yb, bias, act, mask, cnt, row, oh, ow, oc, y0, x0, c8);
    }
}
#undef WLOAD
#undef WSTORE

#define F(i) ((float *)(intptr_t)s[i])
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* A product with more columns than rows splits its weight panels over the threads rather than its rows where its
 * weights (k x n floats) reach weights_split percent of its input and output together (m x (k + n)): each thread then
 * reads its share of the weights instead of all of them, while the next step, split by rows, finds half of each row
 * in the other core's cache. Measured in one process, the settings interleaved (two threads, Zen 5): MobileNet v1
 * 0-3 % faster with its 14x14 and 7x7 products split by panels, ResNet50 0.5-0.9 % slower with its 14x14 ones
 * (weights 105 % of input and output) split so, RegNetX and MobileNet v2 unchanged; hence 120. The run-to-run spread of
 * a fresh session was 3 %, so these are small effects. leti_set_weights_split changes the percentage (a negative
 * argument only asks). */
static int64_t weights_split = 120;

int64_t leti_set_weights_split(int64_t percent) {
    if (percent >= 0) weights_split = percent;
    return weights_split;
}

/* A grouped window on more than one thread split by rows x groups (leti_conv_window_units) rather than rows: RegNetX's
 * 7x7 grouped convolutions on two threads (see docs/engine.md, session 26). leti_set_window_units(0) splits rows. */
static int window_units = 1;

int64_t leti_set_window_units(int64_t on) {
    if (on >= 0) window_units = (int)on;
    return window_units;
}

/* A product split by weight panels on more than one thread (few rows, large weights: the 14x14 and 7x7 maps' 1x1
 * convolutions) gives each thread its share of the panels and cuts that share into chunks of rows (at least PANEL_ROWS
 * of them) for stealing, so that a chunk runs every panel of its thread's share: a tile of a's rows is loaded into L1
 * once and multiplied by all of them. Cutting the panels themselves into chunks (leti_set_panel_rows(0), as before
 * session 34) ran each tile of a against one or two panels per call, from L2 each time. Paired, two threads, 300 pairs
 * twice (benchmarks/bench_engine_ab.py, Zen 5): MobileNet v2 2.6-2.7 % faster, RegNetX-200MF 3.9 %, MobileNet v1
 * 0-0.6 %, ResNet50 -0.3 %; outputs the same bit for bit (each output's sums are the same tile's). */
#define PANEL_ROWS 48
/* 2 (the default): row chunks where a thread's share of the panels and a chunk of a's rows fit half the core's L2
 * together, else panel chunks; 1: row chunks always; 0: panel chunks always. Why: where the share does not stay in L2,
 * each row chunk reads it again from L3; and half, because on these VMs the core's other hardware thread runs another
 * tenant's work, whose data share the L2. Paired on a Zen 3 (512 KiB L2, two threads, bench_engine_ab.py, session 47):
 * panel chunks everywhere took 0.950x the time of row chunks everywhere on MobileNet v1 (its 14 x 14 x 512 -> 512
 * products: a 512 KiB share per thread), 0.994x on v2, 0.980x on RegNetX-200MF, 0.991x on ResNet50; against a rule
 * of the whole L2 (RegNetX's 354 KiB shares in row chunks), 0.98x and 0.94x on RegNetX, 0.97x on v2 with one vCPU
 * contended. Session 34's gain from row chunks (v2 2.6 %, RegNetX 3.9 %, v1 0-0.6 %) was measured on a Zen 5,
 * whose 1 MiB L2 takes v2's and RegNetX's shares under this rule too. */
static int panel_rows = 2;

int64_t leti_set_panel_rows(int64_t on) {
    if (on >= 0) panel_rows = (int)on;
    return panel_rows;
}

/* the core's L2 in bytes (512 KiB where the C library cannot tell) */
static int64_t l2_bytes(void) {
    static int64_t l2 = 0;
    if (!l2) {
        long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        l2 = v > 0 ? v : 512 << 10;
    }
    return l2;
}

/* whether a panel-split product of m rows, k inner products and `panels` panels on `threads` threads cuts each
 * thread's share into row chunks of m / rchunks rows (panel_rows above); the same answer for every chunk of a step */
static int row_chunks(int64_t m, int64_t k, int64_t panels, int64_t threads, int64_t rchunks) {
    if (panel_rows != 2) return panel_rows;
    int64_t share = (panels + threads - 1) / threads * NR * k * 4, chunk = (m + rchunks - 1) / rchunks * k * 4;
    return share + chunk <= l2_bytes() / 2;
}

/* A 1x1 convolution whose output only a 3x3 depthwise convolution reads, run as one step (STEP_GEMM_DWCONV): the
 * depthwise output rows of a thread's part in bands, each band's input rows computed by the product into a buffer of
 * the thread's (about fuse_band_kb KiB) just before the depthwise convolution reads them, the rows two bands share
 * moved to the buffer's start instead of computed again. The product's output (MobileNet v2's expansions: 4.8 MB at
 * 112 x 112 x 96) then never leaves the core's L2 for the L3 and comes back; each value is the same sum as unfused,
 * bit for bit. leti_set_fuse_band_kb(0) runs the product whole into the buffer, then the depthwise (for A/B). */
static int64_t fuse_band_kb = 384;

int64_t leti_set_fuse_band_kb(int64_t kb) {
    if (kb >= 0) fuse_band_kb = kb;
    return fuse_band_kb;
}

static __thread float *fuse_buf = 0;
static __thread size_t fuse_cap = 0;

/* this thread's band buffer of at least `floats` floats (kept for the thread's later runs), or 0 */
static float *fuse_buffer(size_t floats) {
    if (floats > fuse_cap) {
        free(fuse_buf);
        size_t bytes = (floats * sizeof(float) + 4095) / 4096 * 4096;
        fuse_buf = aligned_alloc(4096, bytes);
        fuse_cap = fuse_buf ? bytes / sizeof(float) : 0;
    }
    return fuse_buf;
}

/* depthwise output rows o0..o1-1 of a STEP_GEMM_DWCONV record s (one image):
 * a lda k bp c gbias gact w9 dbias h wd oh ow sh sw pt pl dact y */
static void gemm_dwconv_rows(const int64_t *s, int64_t o0, int64_t o1) {
    const float *a = F(1), *bp = F(4), *gbias = F(6), *w9 = F(8), *dbias = F(9);
    int64_t lda = s[2], k = s[3], c = s[5], gact = s[7], h = s[10], wd = s[11], oh = s[12], ow = s[13], sh = s[14],
            sw = s[15], pt = s[16], pl = s[17], dact = s[18];
    float *y = F(19);
    int64_t row = wd * c; /* floats per input row of the depthwise convolution */
    int64_t band = fuse_band_kb > 0 ? MAX(1, ((int64_t)fuse_band_kb * 1024 / (row * 4) - 3) / sh + 1) : o1 - o0;
    int64_t lo_all = MAX(0, o0 * sh - pt), hi_all = MIN(h, (o1 - 1) * sh - pt + 3);
    int64_t cap = fuse_band_kb > 0 ? MIN((band - 1) * sh + 3, hi_all - lo_all) : hi_all - lo_all;
    float *buf = fuse_buffer((size_t)(MAX(cap, 1) * row));
    if (!buf) return; /* out of memory: the outputs keep what they held */
    int64_t slo = 0, shi = 0; /* the buffer holds input rows slo..shi-1 from its start */
    for (int64_t b0 = o0; b0 < o1; b0 += band) {
        int64_t b1 = MIN(o1, b0 + band);
        int64_t lo = MAX(0, b0 * sh - pt), hi = MIN(h, (b1 - 1) * sh - pt + 3);
        if (lo >= slo && lo < shi) {
            if (lo > slo) memmove(buf, buf + (lo - slo) * row, (size_t)((shi - lo) * row) * sizeof(float));
        } else {
            shi = lo;
        }
        slo = lo;
        if (hi > shi) {
            leti_sgemm_part(h * wd, (hi - shi) * wd, c, k, a + shi * wd * lda, lda, bp, buf + (shi - slo) * row, c,
                            gbias, 0, gact);
            shi = hi;
        }
        leti_dwconv3x3_band(buf, slo, y, w9, dbias, h, wd, c, oh, ow, sh, sw, 1, 1, pt, pl, dact, b0, b1);
    }
}

/* Which of `parts` equal parts chunk t of T (a step cut for work stealing, leti_run_program) runs, or -1: the first
 * chunk of every part, so that a step of fewer parts than chunks still has them spread over the threads' chunks. */
static inline int64_t part_of(int64_t t, int64_t T, int64_t parts) {
    int64_t p = t * parts / T;
    return t == 0 || (t - 1) * parts / T != p ? p : -1;
}

/* chunk t of T of step s, on `threads` threads (what a step's split chooses, rows or panels, depends on the threads;
 * which rows or panels, on t and T) */
static void step_part(const int64_t *s, int64_t t, int64_t T, int64_t threads) {
    switch (s[0]) {
    case STEP_GEMM: { /* m n k a lda bp y ldy bias res act: rows split in multiples of MR, or panels (gemm.py) */
        int64_t m = s[1], n = s[2], k = s[3], lda = s[5], ldy = s[8], act = s[11];
        const float *a = F(4), *bp = F(6), *bias = F(9), *res = F(10);
        float *y = F(7);
        int64_t panels = (n + NR - 1) / NR;
        int by_rows = panels < threads || (m >= 4 * MR * threads && (m >= n || 100 * k * n < weights_split * m * (k + n)));
        int64_t K = T / threads, rchunks = MAX(1, MIN(K, m / PANEL_ROWS));
        if (!by_rows && T > threads && row_chunks(m, k, panels, threads, rchunks)) {
            /* panels split over the threads, each thread's panels cut into row chunks of at least PANEL_ROWS rows for
             * stealing: a chunk runs all its thread's panels, so a tile of a's rows stays in L1 across them */
            int64_t u = t / K, j = t % K;
            if (j >= rchunks) return;
            int64_t q0 = u * panels / threads, q1 = (u + 1) * panels / threads;
            if (q1 <= q0) return;
            int64_t r0 = j * m / rchunks, r1 = (j + 1) * m / rchunks, cols = MIN(n, q1 * NR) - q0 * NR;
            /* in the order of the whole product (on AVX2, whole k above 64 rows), whatever the chunk's rows */
            leti_sgemm_part(m, r1 - r0, cols, k, a + r0 * lda, lda, bp + q0 * k * NR, y + r0 * ldy + q0 * NR, ldy,
                            bias ? bias + q0 * NR : 0, res ? res + r0 * ldy + q0 * NR : 0, act);
            return;
        }
        /* parts of more than 64 rows keep the whole-k order of the product they cut (gemm.c, FULL_MIN_ROWS): the
         * same sums whatever the number of parts */
        int64_t parts = MAX(1, MIN(T, by_rows ? (m > 64 ? MAX(threads, m / 72) : m / MR) : panels));
        if ((t = part_of(t, T, parts)) < 0) return;
        if (by_rows) {
            int64_t r0 = (t * m / parts) / MR * MR, r1 = t == parts - 1 ? m : ((t + 1) * m / parts) / MR * MR;
            leti_sgemm(r1 - r0, n, k, a + r0 * lda, lda, bp, y + r0 * ldy, ldy, bias, res ? res + r0 * ldy : 0, act);
        } else {
            int64_t even = panels >= 4 * parts; /* part boundaries on pairs of panels (the paired tiles) */
            int64_t q0 = t * panels / parts, q1 = t == parts - 1 ? panels : (t + 1) * panels / parts;
            if (even) q0 = (q0 + 1) / 2 * 2, q1 = t == parts - 1 ? panels : (q1 + 1) / 2 * 2;
            int64_t cols = MIN(n, q1 * NR) - q0 * NR;
            leti_sgemm(m, cols, k, a, lda, bp + q0 * k * NR, y + q0 * NR, ldy, bias ? bias + q0 * NR : 0,
                       res ? res + q0 * NR : 0, act);
        }
        return;
    }
    case STEP_DWCONV: { /* x y w9 bias h wd c oh ow sh sw dh dw pt pl act rows: output rows split */
        int64_t rows = s[17], parts = MAX(1, MIN(T, rows));
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_dwconv3x3(F(1), F(2), F(3), F(4), s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
                       s[15], s[16], t * rows / parts, (t + 1) * rows / parts);
        return;
    }
    case STEP_PAD: { /* x h wd c xp hp wp pt pl: padded rows split */
        int64_t hp = s[6], parts = MAX(1, MIN(T, hp));
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_pad_nhwc(F(1), s[2], s[3], s[4], F(5), hp, s[7], s[8], s[9], t * hp / parts, (t + 1) * hp / parts);
        return;
    }
    case STEP_WINDOW: { /* src row ci groups kh kw sh sw bp co y ow bias res act oh: output rows split, or rows x groups */
        int64_t oh = s[16], groups = s[4], parts = MAX(1, MIN(T, oh));
        if (threads > 1 && groups > 1 && window_units && !leti_window512(s[10])) { /* AVX-512: pairs of groups, rows split */
            int64_t units = oh * groups;
            leti_conv_window_units(F(1), s[2], s[3], s[4], s[5], s[6], s[7], s[8], F(9), s[10], F(11), s[12], F(13),
                                   F(14), s[15], t * units / T, (t + 1) * units / T);
            return;
        }
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_conv_window(F(1), s[2], s[3], s[4], s[5], s[6], s[7], s[8], F(9), s[10], F(11), s[12], F(13), F(14),
                         s[15], t * oh / parts, (t + 1) * oh / parts);
        return;
    }
    case STEP_WINDOW_IN_PLACE: { /* x h wd ci groups kh kw sh sw pt pl bp co y ow bias res act oh: the window without a
                                  * padded copy (gemm.c); output rows split, or rows x groups as STEP_WINDOW */
        int64_t oh = s[19], groups = s[5], units = oh * groups, u0, u1;
        if (threads > 1 && groups > 1 && window_units && !leti_window512(s[13])) {
            u0 = t * units / T, u1 = (t + 1) * units / T;
        } else {
            int64_t parts = MAX(1, MIN(T, oh));
            if ((t = part_of(t, T, parts)) < 0) return;
            u0 = t * oh / parts * groups, u1 = (t + 1) * oh / parts * groups;
        }
        leti_conv_window_inplace(F(1), s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], F(12), s[13], F(14),
                                 s[15], F(16), F(17), s[18], u0, u1);
        return;
    }
    case STEP_MEAN: /* x y nb p c: one thread (a few thousand additions) */
        if (t == 0) spatial_mean(F(1), F(2), s[3], s[4], s[5]);
        return;
    case STEP_SOFTMAX: { /* x y rows c beta (the float's bits): one thread */
        float beta;
        int32_t bits = (int32_t)s[5];
        memcpy(&beta, &bits, sizeof beta);
        if (t == 0) leti_softmax_rows(F(1), F(2), s[3], s[4], beta);
        return;
    }
    case STEP_GEMV: { /* x wp y bias k n act: panels of 16 outputs split */
        int64_t panels = (s[6] + NR - 1) / NR, parts = MAX(1, MIN(T, panels));
        if ((t = part_of(t, T, parts)) < 0) return;
        gemv_panels(F(1), F(2), F(3), F(4), s[5], s[6], s[7], t * panels / parts, (t + 1) * panels / parts);
        return;
    }
    case STEP_IM2COL: { /* x col h wd c kh kw sh sw dh dw pt pl oh ow rows: rows of nb x oh split */
        int64_t rows = s[16], parts = MAX(1, MIN(T, rows));
        if ((t = part_of(t, T, parts)) < 0) return;
        im2col_rows(F(1), F(2), s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15],
                    t * rows / parts, (t + 1) * rows / parts);
        return;
    }
    case STEP_POOL: { /* x y h w c oh ow kh kw sh sw pt pl is_max act rows: rows of nb x oh split */
        int64_t rows = s[16], parts = MAX(1, MIN(T, rows));
        if ((t = part_of(t, T, parts)) < 0) return;
        float *tmp = malloc((size_t)(s[4] * s[5] + 8) * sizeof(float));
        if (!tmp) return; /* out of memory: the outputs keep what they held */
        pool_rows(F(1), F(2), s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], (int)s[14],
                  s[15], tmp, t * rows / parts, (t + 1) * rows / parts);
        free(tmp);
        return;
    }
    case STEP_COPY_CHANNELS: { /* src dst pixels n src_stride dst_stride: n floats of each pixel (a channel range) */
        int64_t px = s[3], n = s[4], ss = s[5], ds = s[6], parts = MAX(1, MIN(T, px));
        if ((t = part_of(t, T, parts)) < 0) return;
        const float *src = F(1);
        float *dst = F(2);
        for (int64_t p = t * px / parts; p < (t + 1) * px / parts; ++p)
            memcpy(dst + p * ds, src + p * ss, (size_t)n * sizeof(float));
        return;
    }
    case STEP_UNARY: { /* x y count code alpha beta (float bits): split in multiples of 64 floats */
        int64_t cnt = s[3], blocks = (cnt + 63) / 64, parts = MAX(1, MIN(T, blocks));
        if ((t = part_of(t, T, parts)) < 0) return;
        int32_t ab[2] = {(int32_t)s[5], (int32_t)s[6]};
        float fa, fb;
        memcpy(&fa, ab, 4);
        memcpy(&fb, ab + 1, 4);
        leti_unary(F(1), F(2), s[4], fa, fb, t * blocks / parts * 64, MIN(cnt, (t + 1) * blocks / parts * 64));
        return;
    }
    case STEP_BINARY: { /* a b y shift pixels px c bstride mode op act: pixels split */
        int64_t pixels = s[5], parts = MAX(1, MIN(T, pixels));
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_binary(F(1), F(2), F(3), F(4), s[6], s[7], s[8], s[9], s[10], s[11], t * pixels / parts,
                    (t + 1) * pixels / parts);
        return;
    }
    case STEP_GEMM_DWCONV: { /* a lda k bp c gbias gact w9 dbias h wd oh ow sh sw pt pl dact y: output rows split in
                              * one part per thread (a part's first band computes the rows it shares with the part
                              * before: fewer parts, fewer rows computed twice) */
        int64_t oh = s[12], parts = MAX(1, MIN(threads, oh));
        if ((t = part_of(t, T, parts)) < 0) return;
        gemm_dwconv_rows(s, t * oh / parts, (t + 1) * oh / parts);
        return;
    }
    case STEP_DWCONV_K: { /* x y w bias h wd c oh ow kh kw sh sw dh dw pt pl act rows: rows split */
        int64_t rows = s[19], parts = MAX(1, MIN(T, rows));
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_dwconv(F(1), F(2), F(3), F(4), s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
                    s[15], s[16], s[17], s[18], t * rows / parts, (t + 1) * rows / parts);
        return;
    }
    case STEP_SWAP_LAST_TWO: { /* x y lead p q: the lead split */
        int64_t lead = s[3], parts = MAX(1, MIN(T, lead));
        if ((t = part_of(t, T, parts)) < 0) return;
        leti_swap_last_two(F(1), F(2), s[4], s[5], t * lead / parts, (t + 1) * lead / parts);
        return;
    }
    case STEP_WINOGRAD_IN: { /* x bt v n pt pl th tw alpha h w c r0 cnt: the block's tiles split */
        int64_t cnt = s[14], parts = MAX(1, MIN(T, cnt)), alpha = s[9];
        if ((t = part_of(t, T, parts)) < 0) return;
        int64_t t0 = t * cnt / parts, t1 = (t + 1) * cnt / parts;
#define WIN(A) wino_in_tiles(A, F(1), F(2), F(3), cnt, s[4], s[5], s[6], s[7], s[8], s[10], s[11], s[12], s[13], t0, t1)
        switch (alpha) {
        case 4: WIN(4); break;
        case 5: WIN(5); break;
        case 6: WIN(6); break;
        default: WIN((int)alpha); break;
        }
#undef WIN
        return;
    }
    case STEP_WINOGRAD_PRODUCTS: { /* v up m positions cnt ic oc: m[p] = v[p] . U[p], positions split */
        int64_t positions = s[4], cnt = s[5], ic = s[6], oc = s[7], panels = (oc + NR - 1) / NR;
        int64_t parts = MAX(1, MIN(T, positions));
        if ((t = part_of(t, T, parts)) < 0) return;
        for (int64_t p = t * positions / parts; p < (t + 1) * positions / parts; ++p)
            leti_sgemm(cnt, oc, ic, F(1) + p * cnt * ic, ic, F(2) + p * panels * ic * NR, F(3) + p * cnt * oc, oc, 0, 0, 0);
        return;
    }
    case STEP_WINOGRAD_OUT: { /* m at y bias act n alpha th tw oh ow oc r0 cnt: the block's tiles split */
        int64_t cnt = s[14], parts = MAX(1, MIN(T, cnt)), alpha = s[7], n = s[6];
        if ((t = part_of(t, T, parts)) < 0) return;
        int64_t t0 = t * cnt / parts, t1 = (t + 1) * cnt / parts;
#define WOUT(A, N) wino_out_tiles(A, N, F(1), F(2), F(3), F(4), s[5], cnt, s[8], s[9], s[10], s[11], s[12], s[13], t0, t1)
        if (alpha == 4 && n == 2) WOUT(4, 2);
        else if (alpha == 5 && n == 3) WOUT(5, 3);
        else if (alpha == 6 && n == 4) WOUT(6, 4);
        else WOUT((int)alpha, (int)n);
#undef WOUT
        return;
    }
    default: return;
    }
}

/* Chunks per thread of each step on more than one thread (leti_set_steal_chunks; 1: each thread its fixed part).
 * A step's work is cut into threads x steal_chunks parts, thread t owning parts t*K .. t*K+K-1; a thread runs its
 * own parts first and then takes the parts the other threads have not started (one atomic counter per thread and
 * step), so a thread that the machine slows (a vCPU the hypervisor shares, another process) no longer holds the
 * barrier for the whole step. Parts are ranges of rows, panels, pixels or tiles as before, so results are the same
 * bit for bit; mostly each thread still works on the rows it worked on in the step before. */
static int64_t steal_chunks = 8;
int64_t leti_set_steal_chunks(int64_t k) {
    if (k >= 1) steal_chunks = k;
    return steal_chunks;
}

#define COUNTER_STRIDE 8 /* int64 per counter: one cache line each, no false sharing between threads */

/* The step clock (a profiler's, off by default): where set, a program run writes CLOCK_MONOTONIC nanoseconds into
 * clock[0] before its first step and into clock[i + 1] once step i has ended on every thread (after its barrier), so
 * that clock[i + 1] - clock[i] is step i's time inside the running program: its inputs as the steps before left them
 * in the caches, its threads already awake, its load imbalance included. Why: a step timed as a program of its own
 * (Session.profile) pays a region's start and finds its data warm from its own last run. One clock read per step, on
 * one thread. The array must hold n + 1 values for every program run while it is set; leti_set_step_clock(0) unsets. */
static int64_t *step_clock = 0;

int64_t leti_set_step_clock(int64_t *clock) {
    step_clock = clock;
    return 1;
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* How a thread waits for the step before to be done (leti_set_step_waits): 1, the default, on a count of the step's
 * finished chunks, so a thread that took every chunk goes on while the other one is descheduled (it passes the steps it
 * missed later, finding their chunks taken); 0, an OpenMP barrier after every step, which every thread must reach.
 * Why: with another process on one of two cores, both threads share the other core in time slices and every barrier
 * waited for a thread the scheduler had put aside: MobileNet v1 at two threads took 2.0x TFLite's time with a
 * spinner on one core 30 % of every 10 ms (13.2 against 6.5 ms; 3.3 ms unloaded), OMP_WAIT_POLICY=passive or not. */
static int step_waits = 1;
int64_t leti_set_step_waits(int64_t on) {
    if (on >= 0) step_waits = (int)on;
    return step_waits;
}

/* until *done reaches target (acquire: the chunks' outputs are then visible): a short spin, then yielding the core,
 * which may be the one the thread still running a chunk waits for */
static inline void wait_chunks(const int64_t *done, int64_t target) {
    for (int spins = 0; __atomic_load_n(done, __ATOMIC_ACQUIRE) < target; ++spins) {
        if (spins < 1000)
            __builtin_ia32_pause();
        else
            sched_yield();
    }
}

/* Run the n steps of prog on `threads` threads (one region; each step waits for the one before, see step_waits). */
void leti_run_program(const int64_t *prog, int64_t n, int64_t threads) {
    int64_t *clock = step_clock;
    if (clock) clock[0] = now_ns();
#ifdef _OPENMP
    if (threads > 1) {
        int64_t K = steal_chunks;
        const int counted = step_waits;
        /* per step: a claim counter per owner thread, then (counted) one count of finished chunks */
        int64_t *next = calloc((size_t)(n * (threads + 1) * COUNTER_STRIDE), sizeof(int64_t));
        if (!next) K = 1;
        int64_t *done = next ? next + n * threads * COUNTER_STRIDE : 0;
#pragma omp parallel num_threads(threads)
        {
            int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
            for (int64_t i = 0; i < n; ++i) {
                const int64_t *s = prog + i * RECORD;
                if (!next) {
                    step_part(s, t, T, T);
                } else {
                    int64_t ran = 0;
                    /* its own chunks, then (K > 1) the others' not yet started */
                    for (int64_t v = 0; v < (K > 1 ? T : 1); ++v) {
                        int64_t u = (t + v) % T, j;
                        int64_t *counter = next + (i * T + u) * COUNTER_STRIDE;
                        while ((j = __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED)) < K) {
                            step_part(s, u * K + j, T * K, T);
                            ++ran;
                        }
                    }
                    if (counted && ran) __atomic_add_fetch(done + i * COUNTER_STRIDE, ran, __ATOMIC_RELEASE);
                }
                if (i + 1 < n) {
                    if (next && counted) {
                        wait_chunks(done + i * COUNTER_STRIDE, T * K);
                    } else {
#pragma omp barrier
                    }
                    if (clock && t == 0) clock[i + 1] = now_ns();
                }
            }
        }
        if (clock) clock[n] = now_ns();
        free(next);
        return;
    }
#endif
    (void)threads;
    for (int64_t i = 0; i < n; ++i) {
        step_part(prog + i * RECORD, 0, 1, 1);
        if (clock) clock[i + 1] = now_ns();
    }
}

/* whether the library was built with OpenMP (a program runs on one thread without it) */
int64_t leti_program_threads_supported(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
