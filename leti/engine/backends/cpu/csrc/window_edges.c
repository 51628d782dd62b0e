/* Grouped windows of at most 8 output columns per group (RegNet's groups of 8) read in place, with no padded copy
 * (session 46, a Zen 3: AVX2 + FMA).
 *
 * leti_conv_window_inplace used to copy the rows under a small map's windows into a zero-padded buffer, whole, once
 * per run (14 x 14 x 368 at stride 2: 331 KB; 28 x 28 x 152: 511 KB), and on wider maps the border columns of every
 * output row; timed alone (a C harness over the library, medians of 301 calls) the copy was 10-25 % of the
 * convolution: 14 x 14 x 368 / 2 68 us in place against 53 from a padded input, 28 x 28 x 152 / 2 107 against 84,
 * 28 x 28 x 56 125 against 101 (XNNPACK, single-layer models: 50, 79 and 101 us).
 *
 * Here nothing is copied. A tap that would read padding multiplies a zero, so it is left out: rows of the window above
 * or below the input are skipped for the whole tile (kh is cut), and a column left or right of the input only
 * concerns a tile's first or last pixel (pads of at most one pixel a side), whose FMA for that tap is skipped; the
 * tile's loop is written four times (first / last pixel skipped or not), chosen once per tap. Each output sums the
 * other products in the padded copy's order, and adding a product of zero changes no bit of a finite sum, so the
 * outputs are those of the padded copy, bit for bit. */
#include <stdint.h>

#include "simd.h"

#define NR 16 /* the packed weights' panel width (gemm.c) */

static int edge_windows = 1;
/* grouped windows of at most 8 columns a group read in place, taps on padding skipped (1, the default), or through
 * leti_conv_window_inplace's padded copies (0); < 0 only asks */
int64_t leti_set_edge_windows(int64_t on) {
    if (on >= 0) edge_windows = (int)on;
    return edge_windows;
}

#define ROWE(r)                                                                                     \
    if (mr > r && r >= F && r < mr - B)                                                             \
        c##r = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * lda + p), b0, c##r);
#define TAP(F_, B_)                                                                                 \
    {                                                                                               \
        const int F = F_, B = B_;                                                                   \
        for (int64_t p = 0; p < seglen; ++p) {                                                      \
            __m256 b0 = _mm256_load_ps(b + p * NR);                                                 \
            ROWE(0) ROWE(1) ROWE(2) ROWE(3) ROWE(4) ROWE(5) ROWE(6) ROWE(7) ROWE(8) ROWE(9)         \
            ROWE(10) ROWE(11)                                                                       \
        }                                                                                           \
    }
#define STOREE(r)                                                                                   \
    if (mr > r) {                                                                                   \
        if (res) c##r = _mm256_add_ps(c##r, _mm256_maskload_ps(res + r * ldy, m0));                 \
        c##r = activate(_mm256_add_ps(c##r, bias0), act);                                           \
        if (nr == 8) _mm256_storeu_ps(y + r * ldy, c##r);                                           \
        else _mm256_maskstore_ps(y + r * ldy, m0, c##r);                                            \
    }

/* mr (1..12) pixels, lda floats apart, of one output row: input rows s0..s1-1 of the window (a0: the window origin of
 * the tile's first pixel in row 0 of the window, which may lie left of the input; rows row_stride floats apart, taps
 * cs floats apart), weights b of the group (kh * kw * seglen rows of NR floats, the first nr columns used); the first
 * pixel skips taps kx < skip_first, the last pixel taps kx >= skip_last_from. */
static inline __attribute__((always_inline)) void
edge_tile(const int mr, const float *restrict a0, int64_t s0, int64_t s1, int64_t kw, int64_t seglen, int64_t row_stride,
          int64_t cs, int64_t lda, const float *restrict bg, int64_t skip_first, int64_t skip_last_from,
          float *restrict y, int64_t ldy, int64_t nr, const float *bias, const float *res, int64_t act) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    __m256 c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps(), c6 = _mm256_setzero_ps(), c7 = _mm256_setzero_ps();
    __m256 c8 = _mm256_setzero_ps(), c9 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    for (int64_t s = s0; s < s1; ++s) {
        const float *b = bg + s * kw * seglen * NR;
        for (int64_t t = 0; t < kw; ++t, b += seglen * NR) {
            const float *a = a0 + s * row_stride + t * cs;
            switch ((t < skip_first) | (t >= skip_last_from) << 1) {
            case 0: TAP(0, 0) break;
            case 1: TAP(1, 0) break;
            case 2: TAP(0, 1) break;
            default: TAP(1, 1) break;
            }
        }
    }
    __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    __m256i m0 = lane_mask(nr);
    STOREE(0) STOREE(1) STOREE(2) STOREE(3) STOREE(4) STOREE(5) STOREE(6) STOREE(7) STOREE(8) STOREE(9) STOREE(10)
    STOREE(11)
}

/* Whether leti_conv_window_edges computes this window: the switch on, at most 8 columns a group, pads of at most one
 * pixel left and right (pr: the columns the last pixel's window reaches past the input) */
int leti_edge_windows_take(int64_t co, int64_t pl, int64_t pr) {
    return edge_windows && co <= 8 && pl <= 1 && pr <= 1;
}

/* leti_conv_window_inplace's units u0..u1-1 (unit u: output row u / groups, group u % groups) for windows that
 * leti_edge_windows_take; x the input (h x wd x groups*ci), bp the groups' packed weights (one panel each). */
void leti_conv_window_edges(const float *x, int64_t h, int64_t wd, int64_t ci, int64_t groups, int64_t kh, int64_t kw,
                            int64_t sh, int64_t sw, int64_t pt, int64_t pl, const float *bp, int64_t co, float *y,
                            int64_t ow, const float *bias, const float *res, int64_t act, int64_t u0, int64_t u1) {
    int64_t cs = groups * ci, ldy = groups * co, k = kh * kw * ci, lda = sw * cs, row_stride = wd * cs;
    int64_t pr = (ow - 1) * sw - pl + kw - wd; /* the columns past the input that the last pixel reads */
    for (int64_t u = u0; u < u1; ++u) {
        int64_t oy = u / groups, g = u % groups, iy0 = oy * sh - pt;
        int64_t s0 = iy0 < 0 ? -iy0 : 0, s1 = iy0 + kh > h ? h - iy0 : kh;
        const float *bg = bp + g * k * NR, *bsg = bias ? bias + g * NR : 0;
        const float *xr = x + (iy0 * wd - pl) * cs + g * ci; /* the window origin of pixel 0, row 0 of the window */
        float *yr = y + oy * ow * ldy + g * co;
        const float *rr = res ? res + oy * ow * ldy + g * co : 0;
        for (int64_t rows, j = 0; j < ow; j += rows) {
            int64_t left = ow - j, tiles_left = (left + 11) / 12;
            rows = (left + tiles_left - 1) / tiles_left; /* balanced: 14 pixels as 7 + 7 */
            int64_t first = j == 0 ? pl : 0, last = j + rows == ow ? kw - pr : kw;
            const float *a0 = xr + j * lda;
            float *yt = yr + j * ldy;
            const float *rt = rr ? rr + j * ldy : 0;
#define EDGE(MR_) edge_tile(MR_, a0, s0, s1, kw, ci, row_stride, cs, lda, bg, first, last, yt, ldy, co, bsg, rt, act)
            switch (rows) {
            case 12: EDGE(12); break;
            case 11: EDGE(11); break;
            case 10: EDGE(10); break;
            case 9: EDGE(9); break;
            case 8: EDGE(8); break;
            case 7: EDGE(7); break;
            case 6: EDGE(6); break;
            case 5: EDGE(5); break;
            case 4: EDGE(4); break;
            case 3: EDGE(3); break;
            case 2: EDGE(2); break;
            default: EDGE(1); break;
            }
#undef EDGE
        }
    }
}
