/* 3x3 depthwise convolution (channel multiplier 1, any stride and dilation), NHWC float32, with the
 * bias and activation fused (AVX2 + FMA).
 *
 * Loop order per output row: chunks of XC output columns, then blocks of 8 channels, then the chunk's
 * columns, so a block's nine taps and bias are loaded into registers once per chunk and each output
 * vector costs about nine input loads and nine FMAs (the numba kernel it replaces streamed the taps
 * too: 19 loads per 9 FMAs). Going over whole rows per channel block instead kept the taps longer
 * but strode through memory by the channel count: with 512 channels (a 2 KiB stride) every access
 * fell into two L1 sets, and a 14x14x512 layer ran at 8 GFLOP/s. Pixels whose window lies wholly
 * inside the input take the unrolled nine-tap path; border pixels skip the taps that fall outside
 * (zero padding); a channel count that is not a multiple of 8 runs its last block masked.
 *
 * One call covers output rows r0..r1-1 of the (batch x out-height) rows; the engine splits rows over
 * numba's thread pool. Built with gemm.c into one library (ckernels.py).
 */
#include "simd.h"

/* output columns per chunk: the chunk's inputs stay in L1 while every channel block passes over them */
#define XC 4

void leti_dwconv3x3(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd,
                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    /* first and one-past-last output columns whose three horizontal taps are all inside */
    int64_t xa = (pl + sw - 1) / sw;
    int64_t xb = (wd - 1 - 2 * dw + pl) / sw + 1;
    if (xa > ow) xa = ow;
    if (xb > ow) xb = ow;
    if (xb < xa) xb = xa;
    const int64_t row_in = wd * c, img_in = h * row_in, row_out = ow * c;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, yo = r % oh;
        int64_t iy = yo * sh - pt;
        const float *xi = x + n * img_in;
        float *yr = y + r * row_out;
        int rows_ok = iy >= 0 && iy + 2 * dh < h;
        int64_t fa = rows_ok ? xa : 0, fb = rows_ok ? xb : 0;
        const int64_t cfull = c & ~(int64_t)7;
        if (fb > fa) {
            const float *x0 = xi + iy * row_in, *x1 = x0 + dh * row_in, *x2 = x1 + dh * row_in;
            const int64_t d1 = dw * c, d2 = 2 * dw * c;
            for (int64_t xs = fa; xs < fb; xs += XC) {
                int64_t xe = xs + XC < fb ? xs + XC : fb;
                for (int64_t cb = 0; cb < cfull; cb += 8) {
                    __m256 wk[9];
                    for (int k = 0; k < 9; ++k) wk[k] = _mm256_loadu_ps(w + k * c + cb);
                    __m256 b = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
                    for (int64_t xo = xs; xo < xe; ++xo) {
                        int64_t s = (xo * sw - pl) * c + cb;
                        __m256 acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + s), wk[0], b);
                        __m256 acc1 = _mm256_mul_ps(_mm256_loadu_ps(x0 + s + d1), wk[1]);
                        __m256 acc2 = _mm256_mul_ps(_mm256_loadu_ps(x0 + s + d2), wk[2]);
                        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + s), wk[3], acc0);
                        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + s + d1), wk[4], acc1);
                        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + s + d2), wk[5], acc2);
                        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + s), wk[6], acc0);
                        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + s + d1), wk[7], acc1);
                        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + s + d2), wk[8], acc2);
                        _mm256_storeu_ps(yr + xo * c + cb,
                                         activate(_mm256_add_ps(_mm256_add_ps(acc0, acc1), acc2), act));
                    }
                }
            }
        }
        /* border pixels (and the masked tail block of interior ones): only the taps inside the input */
        int64_t i0 = 0, i1 = 3;
        while (i0 < 3 && iy + i0 * dh < 0) ++i0;
        while (i1 > i0 && iy + (i1 - 1) * dh >= h) --i1;
        for (int64_t xo = 0; xo < ow; ++xo) {
            int full = xo >= fa && xo < fb;
            if (full && cfull == c) continue;
            int64_t ix = xo * sw - pl, j0 = 0, j1 = 3;
            while (j0 < 3 && ix + j0 * dw < 0) ++j0;
            while (j1 > j0 && ix + (j1 - 1) * dw >= wd) --j1;
            for (int64_t cb = full ? cfull : 0; cb < c; cb += 8) {
                if (cb + 8 <= c) {
                    __m256 acc = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
                    for (int64_t i = i0; i < i1; ++i)
                        for (int64_t j = j0; j < j1; ++j)
                            acc = _mm256_fmadd_ps(_mm256_loadu_ps(xi + (iy + i * dh) * row_in + (ix + j * dw) * c + cb),
                                                  _mm256_loadu_ps(w + (i * 3 + j) * c + cb), acc);
                    _mm256_storeu_ps(yr + xo * c + cb, activate(acc, act));
                } else {
                    __m256i m = lane_mask(c - cb);
                    __m256 acc = bias ? _mm256_maskload_ps(bias + cb, m) : _mm256_setzero_ps();
                    for (int64_t i = i0; i < i1; ++i)
                        for (int64_t j = j0; j < j1; ++j)
                            acc = _mm256_fmadd_ps(_mm256_maskload_ps(xi + (iy + i * dh) * row_in + (ix + j * dw) * c + cb, m),
                                                  _mm256_maskload_ps(w + (i * 3 + j) * c + cb, m), acc);
                    _mm256_maskstore_ps(yr + xo * c + cb, m, activate(acc, act));
                }
            }
        }
    }
}
