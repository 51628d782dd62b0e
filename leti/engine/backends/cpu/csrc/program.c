/* A run of kernel calls executed as one program: the steps of a network that LETI's C kernels run
 * (matrix products, 3x3 depthwise convolutions, zero-padded copies, windows over few channels or groups),
 * in order, inside a single OpenMP parallel region with a barrier between steps.
 *
 * Driven one step at a time from Python, every step costs a numba dispatch and a parallel region of its
 * own: ~3 us at one thread, ~6 us at two, where the second thread is woken for each op. A MobileNet v2
 * has 52 such steps in a row, ~5-9 % of its run. Here the whole run is one call, the threads are started
 * once and each step ends at a barrier.
 *
 * A program is n records of RECORD int64 each: the kind, then the kernel's arguments (pointers as
 * integers). Every kind splits its work over the threads as the numba driver of the same kernel does
 * (leti/engine/backends/cpu/gemm.py, dwconv.py), so the results are the same bit for bit.
 * Built with the other kernels into one library (ckernels.py), with OpenMP when the compiler has it
 * (the same libgomp as numba's thread pool, so both share one pool of threads).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define RECORD 20
#define MR 6
#define NR 16

enum { STEP_GEMM = 1, STEP_DWCONV = 2, STEP_PAD = 3, STEP_WINDOW = 4, STEP_MEAN = 5, STEP_SOFTMAX = 6, STEP_GEMV = 7,
       STEP_IM2COL = 8 };

void leti_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *bp, float *y,
                int64_t ldy, const float *bias, const float *res, int64_t act);
void leti_dwconv3x3(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd,
                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1);
void leti_conv_window(const float *xp, int64_t wp, int64_t ci, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                      int64_t sw, const float *bp, int64_t co, float *y, int64_t ow, const float *bias, const float *res,
                      int64_t act, int64_t r0, int64_t r1);
void leti_pad_nhwc(const float *x, int64_t h, int64_t wd, int64_t c, float *xp, int64_t hp, int64_t wp, int64_t pt,
                   int64_t pl, int64_t r0, int64_t r1);

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

/* y[r] = softmax(beta * x[r]) row by row, as kernels.softmax_rows */
static void softmax_rows(const float *x, float *y, int64_t rows, int64_t c, float beta) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * c;
        float *yr = y + r * c, m = -INFINITY;
        for (int64_t o = 0; o < c; ++o) {
            float v = beta * xr[o];
            yr[o] = v;
            if (v > m) m = v;
        }
        double sum = 0.0;
        for (int64_t o = 0; o < c; ++o) {
            float e = expf(yr[o] - m);
            yr[o] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t o = 0; o < c; ++o) yr[o] *= inv;
    }
}

/* y[o] = act(x . wt[o] + bias[o]) for outputs o0..o1-1: a fully connected layer at batch 1, wt (n x k) row-major,
 * four outputs at a time sharing the loads of x */
static void gemv_rows(const float *x, const float *wt, float *y, const float *bias, int64_t k, int64_t act, int64_t o0,
                      int64_t o1) {
    int64_t k8 = k & ~(int64_t)7;
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) {
        const float *w0 = wt + o * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t j = 0; j < k8; j += 8) {
            __m256 xv = _mm256_loadu_ps(x + j);
            a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + j), a0);
            a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w1 + j), a1);
            a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w2 + j), a2);
            a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w3 + j), a3);
        }
        float t[4][8];
        _mm256_storeu_ps(t[0], a0), _mm256_storeu_ps(t[1], a1), _mm256_storeu_ps(t[2], a2), _mm256_storeu_ps(t[3], a3);
        for (int q = 0; q < 4; ++q) {
            float v = ((t[q][0] + t[q][4]) + (t[q][1] + t[q][5])) + ((t[q][2] + t[q][6]) + (t[q][3] + t[q][7]));
            for (int64_t j = k8; j < k; ++j) v += x[j] * wt[(o + q) * k + j];
            if (bias) v += bias[o + q];
            y[o + q] = act >= 1 ? (v < 0.0f ? 0.0f : (act == 2 && v > 6.0f ? 6.0f : v)) : v;
        }
    }
    for (; o < o1; ++o) {
        float v = 0.0f;
        for (int64_t j = 0; j < k; ++j) v += x[j] * wt[o * k + j];
        if (bias) v += bias[o];
        y[o] = act >= 1 ? (v < 0.0f ? 0.0f : (act == 2 && v > 6.0f ? 6.0f : v)) : v;
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

#define F(i) ((float *)(intptr_t)s[i])
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* part t of T of step s */
static void step_part(const int64_t *s, int64_t t, int64_t T) {
    switch (s[0]) {
    case STEP_GEMM: { /* m n k a lda bp y ldy bias res act: rows split in multiples of MR, or panels for few rows */
        int64_t m = s[1], n = s[2], k = s[3], lda = s[5], ldy = s[8], act = s[11];
        const float *a = F(4), *bp = F(6), *bias = F(9), *res = F(10);
        float *y = F(7);
        int64_t panels = (n + NR - 1) / NR;
        int by_rows = m >= 4 * MR * T || panels < T;
        int64_t parts = MAX(1, MIN(T, by_rows ? m / MR : panels));
        if (t >= parts) return;
        if (by_rows) {
            int64_t r0 = (t * m / parts) / MR * MR, r1 = t == parts - 1 ? m : ((t + 1) * m / parts) / MR * MR;
            leti_sgemm(r1 - r0, n, k, a + r0 * lda, lda, bp, y + r0 * ldy, ldy, bias, res ? res + r0 * ldy : 0, act);
        } else {
            int64_t q0 = t * panels / parts, q1 = (t + 1) * panels / parts, cols = MIN(n, q1 * NR) - q0 * NR;
            leti_sgemm(m, cols, k, a, lda, bp + q0 * k * NR, y + q0 * NR, ldy, bias ? bias + q0 * NR : 0,
                       res ? res + q0 * NR : 0, act);
        }
        return;
    }
    case STEP_DWCONV: { /* x y w9 bias h wd c oh ow sh sw dh dw pt pl act rows: output rows split */
        int64_t rows = s[17], parts = MAX(1, MIN(T, rows));
        if (t < parts)
            leti_dwconv3x3(F(1), F(2), F(3), F(4), s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
                           s[15], s[16], t * rows / parts, (t + 1) * rows / parts);
        return;
    }
    case STEP_PAD: { /* x h wd c xp hp wp pt pl: padded rows split */
        int64_t hp = s[6], parts = MAX(1, MIN(T, hp));
        if (t < parts) leti_pad_nhwc(F(1), s[2], s[3], s[4], F(5), hp, s[7], s[8], s[9], t * hp / parts, (t + 1) * hp / parts);
        return;
    }
    case STEP_WINDOW: { /* src row ci groups kh kw sh sw bp co y ow bias res act oh: output rows split */
        int64_t oh = s[16], parts = MAX(1, MIN(T, oh));
        if (t < parts)
            leti_conv_window(F(1), s[2], s[3], s[4], s[5], s[6], s[7], s[8], F(9), s[10], F(11), s[12], F(13), F(14),
                             s[15], t * oh / parts, (t + 1) * oh / parts);
        return;
    }
    case STEP_MEAN: /* x y nb p c: one thread (a few thousand additions) */
        if (t == 0) spatial_mean(F(1), F(2), s[3], s[4], s[5]);
        return;
    case STEP_SOFTMAX: { /* x y rows c beta (the float's bits): one thread */
        float beta;
        int32_t bits = (int32_t)s[5];
        memcpy(&beta, &bits, sizeof beta);
        if (t == 0) softmax_rows(F(1), F(2), s[3], s[4], beta);
        return;
    }
    case STEP_GEMV: { /* x wt y bias k n act: outputs split in multiples of 4 */
        int64_t n = s[6], parts = MAX(1, MIN(T, n / 4));
        if (t < parts) {
            int64_t o0 = t == 0 ? 0 : (t * n / parts) & ~(int64_t)3, o1 = t == parts - 1 ? n : ((t + 1) * n / parts) & ~(int64_t)3;
            gemv_rows(F(1), F(2), F(3), F(4), s[5], s[7], o0, o1);
        }
        return;
    }
    case STEP_IM2COL: { /* x col h wd c kh kw sh sw dh dw pt pl oh ow rows: rows of nb x oh split */
        int64_t rows = s[16], parts = MAX(1, MIN(T, rows));
        if (t < parts)
            im2col_rows(F(1), F(2), s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15],
                        t * rows / parts, (t + 1) * rows / parts);
        return;
    }
    default: return;
    }
}

/* Run the n steps of prog on `threads` threads (one region, a barrier after every step but the last). */
void leti_run_program(const int64_t *prog, int64_t n, int64_t threads) {
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
            for (int64_t i = 0; i < n; ++i) {
                step_part(prog + i * RECORD, t, T);
                if (i + 1 < n) {
#pragma omp barrier
                }
            }
        }
        return;
    }
#endif
    (void)threads;
    for (int64_t i = 0; i < n; ++i) step_part(prog + i * RECORD, 0, 1);
}

/* whether the library was built with OpenMP (a program runs on one thread without it) */
int64_t leti_program_threads_supported(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
