/* 3x3 depthwise convolution (channel multiplier 1, any stride and dilation), NHWC float32, with the
 * bias and activation fused (AVX2 + FMA).
 *
 * Each output row is cut into runs of columns whose windows keep the same taps: the interior (all three
 * horizontal taps inside the input) and each border column alone. The row's window rows (all three, or
 * fewer at the top and bottom) and a run's columns select one of nine unrolled cases (dw_run), so border
 * pixels run the same register code as interior ones with the outside taps left out: before, they took a
 * tap-by-tap loop that cost 10-35 % of a padded layer (14x14x576: 0.0545 -> 0.0479 ms alone; 7x7x960
 * 0.0332 -> 0.0270). Runs over all three columns at dilation 1 and stride 1 go in strips of four pixels
 * (dw_strip): each window row's input vectors are loaded once for the four pixels and each tap's weights
 * once (36 loads per 36 FMAs), another 5-10 % (28x28x192 0.0525 -> 0.0454 ms); at stride 2 strips were
 * 8-14 % slower. Other runs (and a run's last columns short of a strip) keep the nine taps of a channel block in registers over chunks of XC columns (dw_segment).
 * Going over whole rows per channel block instead strode through memory by the channel count: with 512
 * channels (a 2 KiB stride) every access fell into two L1 sets, and a 14x14x512 layer ran at 8 GFLOP/s;
 * chunks of a few columns keep their inputs in L1 while every channel block passes over them. A channel
 * count that is not a multiple of 8 runs its last block masked, tap by tap.
 *
 * One call covers output rows r0..r1-1 of the (batch x out-height) rows; the engine splits rows over
 * numba's thread pool. Built with gemm.c into one library (ckernels.py).
 */
#include "simd.h"

/* output columns per chunk: the chunk's inputs stay in L1 while every channel block passes over them */
#define XC 4

/* acc = b + the taps of rows I0..I1-1 and columns J0..J1-1 of the window (compile-time bounds once inlined:
 * every tap unrolled, the weights from registers). x0, x1, x2: the window's input rows at the pixel's first
 * column; d: the column step of one tap. Three accumulators keep three FMA chains going. */
static inline __attribute__((always_inline)) __m256 dw_taps(const float *x0, const float *x1, const float *x2,
                                                            int64_t d, const __m256 wk[9], __m256 b, int I0,
                                                            int I1, int J0, int J1) {
    const float *r[3] = {x0, x1, x2};
    __m256 acc[3] = {b, _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < 3; ++i) {
        if (i < I0 || i >= I1) continue;
        for (int j = 0; j < 3; ++j) {
            if (j < J0 || j >= J1) continue;
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(r[i] + j * d), wk[i * 3 + j], acc[j]);
        }
    }
    return _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), acc[2]);
}

/* One window row of a strip of four adjacent output pixels (stride 1, dilation 1) of one channel block: the row's six
 * input vectors are loaded once and shared by the pixels whose windows overlap, each of its three taps' weights once
 * for all four. row: the first pixel's window row at its first column; c: the pixel step; wrow: the row's first tap. */
static inline __attribute__((always_inline)) void dw_strip_row(const float *row, int64_t c, const float *wrow,
                                                               __m256 acc[4]) {
    __m256 in[6];
    for (int q = 0; q < 6; ++q) in[q] = _mm256_loadu_ps(row + q * c);
    for (int j = 0; j < 3; ++j) {
        __m256 wv = _mm256_loadu_ps(wrow + j * c);
        for (int p = 0; p < 4; ++p) acc[p] = _mm256_fmadd_ps(in[p + j], wv, acc[p]);
    }
}

/* Four adjacent output pixels of one channel block whose windows keep rows I0..I1-1 and all three columns (stride 1,
 * dilation 1): 27 + 9 loads for 36 FMAs, against 46 when the taps stay in registers and every pixel loads its own
 * nine inputs. x0..x2: the first pixel's window rows at its first column; wt: the block's first tap. */
static inline __attribute__((always_inline)) void dw_strip(float *out, const float *x0, const float *x1,
                                                           const float *x2, int64_t c, const float *wt, __m256 b,
                                                           int64_t act, int I0, int I1) {
    const float *r[3] = {x0, x1, x2};
    __m256 acc[4] = {b, b, b, b};
    for (int i = I0; i < I1; ++i) dw_strip_row(r[i], c, wt + i * 3 * c, acc);
    for (int p = 0; p < 4; ++p) _mm256_storeu_ps(out + p * c, activate(acc[p], act));
}

/* dw_strip over two adjacent channel blocks (16 channels: one 64-byte line of each pixel), row by row: a window row's
 * lines are read for the first block and at once again for the second. With one block at a time the second half of
 * each line came back a channel block later, after the strip's 18 other lines; when a pixel is a multiple of 2 KiB
 * (512 or 1024 channels) all of them fall into one or two L1 sets of 8 ways and the line was gone (alone, a C harness:
 * 14x14x512 0.064 -> 0.051 ms, 7x7x1024 0.061 -> 0.050); at 1 KiB (256 channels: four sets) too, 28x28x256 0.070 ->
 * 0.067. Elsewhere it is 10 % slower than one block at a time (56x56x144: 0.127 -> 0.142 ms; 56x56x128, a 512-byte
 * pixel: 0.107 -> 0.116), so only such channel counts take it. */
static inline __attribute__((always_inline)) void dw_strip2(float *out, const float *x0, const float *x1,
                                                            const float *x2, int64_t c, const float *wt, __m256 b0,
                                                            __m256 b1, int64_t act, int I0, int I1) {
    const float *r[3] = {x0, x1, x2};
    __m256 acc0[4] = {b0, b0, b0, b0}, acc1[4] = {b1, b1, b1, b1};
    for (int i = I0; i < I1; ++i) {
        dw_strip_row(r[i], c, wt + i * 3 * c, acc0);
        dw_strip_row(r[i] + 8, c, wt + i * 3 * c + 8, acc1);
    }
    for (int p = 0; p < 4; ++p) {
        _mm256_storeu_ps(out + p * c, activate(acc0[p], act));
        _mm256_storeu_ps(out + p * c + 8, activate(acc1[p], act));
    }
}

/* output columns from xa whose windows keep rows I0..I1-1 and all three columns (stride 1): strips of four pixels
 * while four remain before xb; returns the first column not done (the rest go through dw_segment's per-pixel path,
 * faster than strips of one). Chunks of four columns outer so that a chunk's inputs stay in L1 while every channel
 * block passes over them. */
static inline __attribute__((always_inline)) int64_t dw_strips(float *yr, const float *const r[3], const float *w,
                                                               const float *bias, int64_t c, int64_t cfull,
                                                               int64_t xa, int64_t xb, int64_t pl, int64_t act,
                                                               int I0, int I1) {
    const float *x0 = r[0], *x1 = r[1], *x2 = r[2];
    int64_t xs = xa;
    for (; xs + 4 <= xb; xs += 4) {
        int64_t s = (xs - pl) * c;
        int64_t cb = 0;
        for (; c % 256 == 0 && cb + 16 <= cfull; cb += 16) {  /* pixels a multiple of 1 KiB apart */
            __m256 b0 = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
            __m256 b1 = bias ? _mm256_loadu_ps(bias + cb + 8) : _mm256_setzero_ps();
            dw_strip2(yr + xs * c + cb, x0 + s + cb, x1 + s + cb, x2 + s + cb, c, w + cb, b0, b1, act, I0, I1);
        }
        for (; cb < cfull; cb += 8) {
            __m256 b = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
            dw_strip(yr + xs * c + cb, x0 + s + cb, x1 + s + cb, x2 + s + cb, c, w + cb, b, act, I0, I1);
        }
    }
    return xs;
}

/* output columns xa..xb-1 of a row, every pixel keeping taps I0..I1 x J0..J1 of its window: chunks of XC
 * columns, then blocks of 8 channels (the block's taps loaded into registers once per chunk), then the chunk's
 * columns. With constant bounds (the callers) the taps are unrolled. */
static inline __attribute__((always_inline)) void dw_segment(float *yr, const float *const r[3], const float *w,
                                                             const float *bias, int64_t c, int64_t cfull,
                                                             int64_t xa, int64_t xb, int64_t sw, int64_t pl,
                                                             int64_t d, int64_t act, int I0, int I1, int J0,
                                                             int J1) {
    if (J0 == 0 && J1 == 3 && d == c && sw == 1) xa = dw_strips(yr, r, w, bias, c, cfull, xa, xb, pl, act, I0, I1);
    const float *x0 = r[0], *x1 = r[1], *x2 = r[2];
    for (int64_t xs = xa; xs < xb; xs += XC) {
        int64_t xe = xs + XC < xb ? xs + XC : xb;
        for (int64_t cb = 0; cb < cfull; cb += 8) {
            __m256 wk[9];
            for (int k = 0; k < 9; ++k) wk[k] = _mm256_loadu_ps(w + k * c + cb);
            __m256 b = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
            for (int64_t xo = xs; xo < xe; ++xo) {
                int64_t s = (xo * sw - pl) * c + cb;
                _mm256_storeu_ps(yr + xo * c + cb,
                                 activate(dw_taps(x0 + s, x1 + s, x2 + s, d, wk, b, I0, I1, J0, J1), act));
            }
        }
    }
}

/* a run of pixels whose windows keep the same taps, by the unrolled case of that subset; 0 when it has none (a
 * window clipped on both sides, dilation or padding over 1: the caller's tap-by-tap path) */
#define SEG(I0, I1, J0, J1) dw_segment(yr, r, w, bias, c, cfull, xa, xb, sw, pl, d, act, I0, I1, J0, J1)
static int dw_run(float *yr, const float *const r[3], const float *w, const float *bias, int64_t c,
                  int64_t cfull, int64_t xa, int64_t xb, int64_t sw, int64_t pl, int64_t d, int64_t act,
                  int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    switch (i0 * 64 + i1 * 16 + j0 * 4 + j1) {
        case 0 * 64 + 3 * 16 + 0 * 4 + 3: SEG(0, 3, 0, 3); return 1;
        case 0 * 64 + 3 * 16 + 1 * 4 + 3: SEG(0, 3, 1, 3); return 1;
        case 0 * 64 + 3 * 16 + 0 * 4 + 2: SEG(0, 3, 0, 2); return 1;
        case 1 * 64 + 3 * 16 + 0 * 4 + 3: SEG(1, 3, 0, 3); return 1;
        case 1 * 64 + 3 * 16 + 1 * 4 + 3: SEG(1, 3, 1, 3); return 1;
        case 1 * 64 + 3 * 16 + 0 * 4 + 2: SEG(1, 3, 0, 2); return 1;
        case 0 * 64 + 2 * 16 + 0 * 4 + 3: SEG(0, 2, 0, 3); return 1;
        case 0 * 64 + 2 * 16 + 1 * 4 + 3: SEG(0, 2, 1, 3); return 1;
        case 0 * 64 + 2 * 16 + 0 * 4 + 2: SEG(0, 2, 0, 2); return 1;
        default: return 0;
    }
}
#undef SEG

/* the taps j0..j1-1 of the window of output column xo that fall inside the input */
static inline void dw_cols(int64_t xo, int64_t sw, int64_t pl, int64_t dw, int64_t wd, int64_t *j0, int64_t *j1) {
    int64_t ix = xo * sw - pl;
    *j0 = 0, *j1 = 3;
    while (*j0 < 3 && ix + *j0 * dw < 0) ++*j0;
    while (*j1 > *j0 && ix + (*j1 - 1) * dw >= wd) --*j1;
}

void leti_dwconv3x3(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd,
                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    const int64_t row_in = wd * c, img_in = h * row_in, row_out = ow * c, d = dw * c;
    const int64_t cfull = c & ~(int64_t)7;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, yo = r % oh;
        int64_t iy = yo * sh - pt;
        const float *xi = x + n * img_in;
        float *yr = y + r * row_out;
        /* the window rows inside the input (i0..i1-1), the same for the whole output row */
        int64_t i0 = 0, i1 = 3;
        while (i0 < 3 && iy + i0 * dh < 0) ++i0;
        while (i1 > i0 && iy + (i1 - 1) * dh >= h) --i1;
        const float *rows[3];
        for (int i = 0; i < 3; ++i) rows[i] = (i >= i0 && i < i1) ? xi + (iy + i * dh) * row_in : xi;
        /* whole channel blocks: the interior columns fa..fb-1 (all three horizontal taps inside) in one run,
         * each border column alone, each by the unrolled case of its taps */
        int64_t fa = (pl + sw - 1) / sw, fb = (wd - 1 - 2 * dw + pl) / sw + 1;
        if (fa > ow) fa = ow;
        if (fb > ow) fb = ow;
        if (fb < fa) fb = fa;
        for (int64_t xo = 0; xo < ow && cfull; ) {
            int64_t xe = xo < fa ? xo + 1 : xo < fb ? fb : xo + 1, j0, j1;
            dw_cols(xo, sw, pl, dw, wd, &j0, &j1);
            if (!dw_run(yr, rows, w, bias, c, cfull, xo, xe, sw, pl, d, act, i0, i1, j0, j1)) {
                for (int64_t xt = xo; xt < xe; ++xt) {  /* tap by tap */
                    int64_t ix = xt * sw - pl;
                    for (int64_t cb = 0; cb < cfull; cb += 8) {
                        __m256 acc = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
                        for (int64_t i = i0; i < i1; ++i)
                            for (int64_t j = j0; j < j1; ++j)
                                acc = _mm256_fmadd_ps(_mm256_loadu_ps(rows[i] + (ix + j * dw) * c + cb),
                                                      _mm256_loadu_ps(w + (i * 3 + j) * c + cb), acc);
                        _mm256_storeu_ps(yr + xt * c + cb, activate(acc, act));
                    }
                }
            }
            xo = xe;
        }
        /* the masked tail block of a channel count that is not a multiple of 8 */
        if (cfull == c) continue;
        __m256i m = lane_mask(c - cfull);
        for (int64_t xo = 0; xo < ow; ++xo) {
            int64_t ix = xo * sw - pl, j0, j1;
            dw_cols(xo, sw, pl, dw, wd, &j0, &j1);
            __m256 acc = bias ? _mm256_maskload_ps(bias + cfull, m) : _mm256_setzero_ps();
            for (int64_t i = i0; i < i1; ++i)
                for (int64_t j = j0; j < j1; ++j)
                    acc = _mm256_fmadd_ps(_mm256_maskload_ps(rows[i] + (ix + j * dw) * c + cfull, m),
                                          _mm256_maskload_ps(w + (i * 3 + j) * c + cfull, m), acc);
            _mm256_maskstore_ps(yr + xo * c + cfull, m, activate(acc, act));
        }
    }
}
