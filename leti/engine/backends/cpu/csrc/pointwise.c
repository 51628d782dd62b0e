/* The light kernels of a native program (program.c) that real networks put between their convolutions:
 * activations as ops of their own (sigmoid and swish in EfficientNet, hard-swish in MobileNet v3, a ReLU before a
 * separable convolution in NASNet), sums and products with a broadcast operand (squeeze-excite scaling, an unfolded
 * batch norm), depthwise windows of any size (5x5 and 7x7 in MobileNet v3, EfficientNet, GhostNet, NASNet) and the
 * swap of the last two axes (ShuffleNet's channel shuffle). Before, each ran as a NumPy or numba step between two
 * programs: a model that mixed them paid a Python call and a fresh parallel region per op, and its latency was no
 * longer the sum of what its kernels cost alone (what the any-model predictor adds up).
 *
 * Every function covers a range of the work (elements, pixels or rows); program.c splits ranges over threads.
 */
#include <math.h>
#include <stdint.h>

#include "simd.h"

/* e^x for 8 floats: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r (Cephes' expf coefficients; relative
 * error ~2e-7), 2^n written into the exponent. x is clamped to [-87.3, 88.3] (normal results). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* e^x for x <= 0: 0 below -87.3, where exp8 clamps (as libm's expf, whose result there is 0 or a denormal) */
static inline __m256 exp_below0(__m256 x) {
    return _mm256_and_ps(exp8(x), _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GT_OQ));
}

/* y[r] = softmax(beta * x[r]) row by row, as kernels.softmax_rows: the row's maximum subtracted, e^ by exp8 eight at a
 * time (a classifier's 1000 outputs: 0.019 ms with libm's expf one at a time, ~0.002 here), the sum in double */
void leti_softmax_rows(const float *x, float *y, int64_t rows, int64_t c, float beta) {
    const __m256 vb = _mm256_set1_ps(beta);
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        int64_t c8 = c & ~(int64_t)7, o;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (o = 0; o < c8; o += 8) {
            __m256 v = _mm256_mul_ps(vb, _mm256_loadu_ps(xr + o));
            _mm256_storeu_ps(yr + o, v);
            vm = _mm256_max_ps(vm, v);
        }
        float lanes[8], m = -INFINITY;
        _mm256_storeu_ps(lanes, vm);
        for (int l = 0; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
        for (; o < c; ++o) {
            yr[o] = beta * xr[o];
            if (yr[o] > m) m = yr[o];
        }
        const __m256 mv = _mm256_set1_ps(m);
        __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
        for (o = 0; o < c8; o += 8) {
            __m256 e = exp_below0(_mm256_sub_ps(_mm256_loadu_ps(yr + o), mv));
            _mm256_storeu_ps(yr + o, e);
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        double sl[4], sum = 0.0;
        _mm256_storeu_pd(sl, _mm256_add_pd(s0, s1));
        sum = sl[0] + sl[1] + sl[2] + sl[3];
        if (o < c) { /* the tail, masked: lanes past the row are e^-inf = 0 in the sum and not stored */
            __m256i mask = lane_mask(c - o);
            __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(yr + o, mask),
                                        _mm256_castsi256_ps(mask));
            __m256 e = _mm256_and_ps(exp_below0(_mm256_sub_ps(v, mv)), _mm256_castsi256_ps(mask));
            _mm256_maskstore_ps(yr + o, mask, e);
            float el[8];
            _mm256_storeu_ps(el, e);
            for (int l = 0; l < 8; ++l) sum += el[l];
        }
        const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
        for (o = 0; o < c8; o += 8) _mm256_storeu_ps(yr + o, _mm256_mul_ps(_mm256_loadu_ps(yr + o), inv));
        for (; o < c; ++o) yr[o] *= (float)(1.0 / sum);
    }
}

/* the unary op `code` of 8 floats: 1 relu, 2 relu6, 3 sigmoid, 4 hard-swish x * relu6(x + 3) / 6 (in NumPy's order
 * of operations), 5 hard-sigmoid clip(alpha x + beta, 0, 1) */
static inline __attribute__((always_inline)) __m256 unary8(__m256 v, int64_t code, __m256 alpha, __m256 beta) {
    switch (code) {
    case 3: { /* 1 / (1 + e^-x); 0 below -88 (where e^-x overflows float, as NumPy's) */
        __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f),
                                 _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
        return _mm256_and_ps(s, _mm256_cmp_ps(v, _mm256_set1_ps(-88.0f), _CMP_GT_OQ));
    }
    case 4: {
        __m256 t = _mm256_add_ps(v, _mm256_set1_ps(3.0f));
        t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(6.0f));
        return _mm256_mul_ps(v, _mm256_mul_ps(t, _mm256_set1_ps(1.0f / 6.0f)));
    }
    case 5: {
        __m256 t = _mm256_add_ps(_mm256_mul_ps(v, alpha), beta);
        return _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(1.0f));
    }
    default: return activate(v, code);
    }
}

/* y[i] = op(x[i]) for i in i0..i1-1 (y may be x) */
void leti_unary(const float *x, float *y, int64_t code, float alpha, float beta, int64_t i0, int64_t i1) {
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(y + i, unary8(_mm256_loadu_ps(x + i), code, va, vb));
    if (i < i1) {
        __m256i m = lane_mask(i1 - i);
        _mm256_maskstore_ps(y + i, m, unary8(_mm256_maskload_ps(x + i, m), code, va, vb));
    }
}

static inline __attribute__((always_inline)) __m256 binary8(__m256 a, __m256 b, int64_t op) {
    return op ? _mm256_mul_ps(a, b) : _mm256_add_ps(a, b);
}

/* y = act(a op b [+ shift]) (op 0 a sum, 1 a product) over the c channels of one pixel, against b's c channels (the
 * same pixel of a same-shape b, or one vector for every pixel) or, scalar, b[0] for all */
static inline void binary_row(const float *a, const float *b, float *y, const float *shift, int64_t c, int scalar,
                              int64_t op, int64_t act) {
    const __m256 bs = _mm256_set1_ps(b[0]);
    int64_t o = 0;
    for (; o + 8 <= c; o += 8) {
        __m256 v = binary8(_mm256_loadu_ps(a + o), scalar ? bs : _mm256_loadu_ps(b + o), op);
        if (shift) v = _mm256_add_ps(v, _mm256_loadu_ps(shift + o));
        _mm256_storeu_ps(y + o, activate(v, act));
    }
    if (o < c) {
        __m256i m = lane_mask(c - o);
        __m256 v = binary8(_mm256_maskload_ps(a + o, m), scalar ? bs : _mm256_maskload_ps(b + o, m), op);
        if (shift) v = _mm256_add_ps(v, _mm256_maskload_ps(shift + o, m));
        _mm256_maskstore_ps(y + o, m, activate(v, act));
    }
}

/* Pixels p0..p1-1 of a (images x px pixels x c channels), y the same shape: y = act(a op b [+ shift]) where b is
 * mode 0: the same shape as a; 1: a c-vector per image (b + image * bstride; bstride 0: one for all); 2: one scalar.
 * shift, when given, is a c-vector (a batch norm: a * scale + shift, rounded after each, as NumPy). */
void leti_binary(const float *a, const float *b, float *y, const float *shift, int64_t px, int64_t c, int64_t bstride,
                 int64_t mode, int64_t op, int64_t act, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
        binary_row(a + p * c, mode == 0 ? b + p * c : mode == 1 ? b + (p / px) * bstride : b, y + p * c, shift, c,
                   mode == 2, op, act);
}

/* Depthwise convolution (multiplier 1) with a kh x kw window, any stride and dilation, NHWC, bias and activation
 * fused; w is (kh, kw, c). Output rows r0..r1-1 of the (images x oh) rows. Per output row, the window rows inside
 * the input; per run of four columns whose windows lie wholly inside, each tap's weights are loaded once for the four
 * pixels (the 3x3 kernel's strips, dwconv.c); border columns keep the taps inside, one pixel at a time. */
void leti_dwconv(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd, int64_t c,
                 int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                 int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    const int64_t row_in = wd * c, img_in = h * row_in;
    /* the columns whose windows lie inside: xo * sw - pl >= 0 and xo * sw - pl + (kw - 1) * dw <= wd - 1 */
    int64_t fa = (pl + sw - 1) / sw, fb = (wd - 1 - (kw - 1) * dw + pl) / sw + 1;
    if (fa > ow) fa = ow;
    if (fb > ow) fb = ow;
    if (fb < fa) fb = fa;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, yo = r % oh, iy = yo * sh - pt;
        const float *xi = x + n * img_in;
        float *yr = y + r * ow * c;
        int64_t i0 = 0, i1 = kh;
        while (i0 < kh && iy + i0 * dh < 0) ++i0;
        while (i1 > i0 && iy + (i1 - 1) * dh >= h) --i1;
        for (int64_t cb = 0; cb < c; cb += 8) {
            const int full = cb + 8 <= c;
            const __m256i m = lane_mask(full ? 8 : c - cb);
#define LD(p) (full ? _mm256_loadu_ps(p) : _mm256_maskload_ps((p), m))
            const __m256 b = bias ? LD(bias + cb) : _mm256_setzero_ps();
            int64_t xo = 0;
            while (xo < ow) {
                if (xo >= fa && xo + 4 <= fb) { /* four interior pixels */
                    __m256 acc[4] = {b, b, b, b};
                    for (int64_t i = i0; i < i1; ++i) {
                        const float *xr = xi + (iy + i * dh) * row_in + (xo * sw - pl) * c + cb;
                        const float *wr = w + i * kw * c + cb;
                        for (int64_t j = 0; j < kw; ++j) {
                            __m256 wv = LD(wr + j * c);
                            const float *xj = xr + j * dw * c;
                            for (int q = 0; q < 4; ++q) acc[q] = _mm256_fmadd_ps(LD(xj + q * sw * c), wv, acc[q]);
                        }
                    }
                    for (int q = 0; q < 4; ++q) {
                        if (full) _mm256_storeu_ps(yr + (xo + q) * c + cb, activate(acc[q], act));
                        else _mm256_maskstore_ps(yr + (xo + q) * c + cb, m, activate(acc[q], act));
                    }
                    xo += 4;
                    continue;
                }
                int64_t ix = xo * sw - pl, j0 = 0, j1 = kw;
                while (j0 < kw && ix + j0 * dw < 0) ++j0;
                while (j1 > j0 && ix + (j1 - 1) * dw >= wd) --j1;
                __m256 acc = b;
                for (int64_t i = i0; i < i1; ++i) {
                    const float *xr = xi + (iy + i * dh) * row_in + ix * c + cb;
                    const float *wr = w + i * kw * c + cb;
                    for (int64_t j = j0; j < j1; ++j) acc = _mm256_fmadd_ps(LD(xr + j * dw * c), LD(wr + j * c), acc);
                }
                if (full) _mm256_storeu_ps(yr + xo * c + cb, activate(acc, act));
                else _mm256_maskstore_ps(yr + xo * c + cb, m, activate(acc, act));
                ++xo;
            }
#undef LD
        }
    }
}

/* y[l][j][i] = x[l][i][j] for l in l0..l1-1: x (lead, p, q) into y (lead, q, p), the channel shuffle's swap */
void leti_swap_last_two(const float *x, float *y, int64_t p, int64_t q, int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
        const float *xl = x + l * p * q;
        float *yl = y + l * p * q;
        for (int64_t j = 0; j < q; ++j)
            for (int64_t i = 0; i < p; ++i) yl[j * p + i] = xl[i * q + j];
    }
}
