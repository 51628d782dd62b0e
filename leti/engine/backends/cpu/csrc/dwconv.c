/* 3x3 depthwise convolution (channel multiplier 1, any stride and dilation), NHWC float32, with the
 * bias and activation fused: 16 channels a vector (AVX-512) where the CPU has it and the channel count is a multiple
 * of 16, else 8 (AVX2 + FMA); the register code of both is dwconv_impl.h, included once per width.
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
 *
 * The weights w are the taps row by row (9 x c) followed by their packed copy with the bias (10 c floats,
 * ckernels.dw3x3_weights), which the pixel-at-a-time path below reads instead of w9 and bias.
 */
#include "simd.h"

/* output columns per chunk: the chunk's inputs stay in L1 while every channel block passes over them */
#define XC 4

/* the taps j0..j1-1 of the window of output column xo that fall inside the input */
static inline void dw_cols(int64_t xo, int64_t sw, int64_t pl, int64_t dw, int64_t wd, int64_t *j0, int64_t *j1) {
    int64_t ix = xo * sw - pl;
    *j0 = 0, *j1 = 3;
    while (*j0 < 3 && ix + *j0 * dw < 0) ++*j0;
    while (*j1 > *j0 && ix + (*j1 - 1) * dw >= wd) --*j1;
}

int64_t leti_set_avx512(int64_t on); /* gemm.c: whether the AVX-512 kernels are used */
int64_t leti_set_narrow512(int64_t on); /* gemm.c: whether the core runs 512-bit FMAs as two 256-bit halves */

/* whether a depthwise convolution at these strides takes the 16-lane packed strips: where the CPU has AVX-512, but not
 * at stride 1 on a core that runs 512-bit FMAs as two halves (a Zen 4, session 50: single-layer models at stride 1
 * from 256 channels up took 0.94-1.25x the 8-lane code's time there, MobileNet v2's 14 x 14 x 576 0.68 against 0.54x
 * XNNPACK's; strided ones 0.78-0.80x, as on the Zen 5) */
static inline int dw_packed16(int strided) {
    return leti_set_avx512(-1) && (strided || !leti_set_narrow512(-1));
}

#define DW_LANES 8
#define V __m256
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
#define VZERO _mm256_setzero_ps
#define VACT activate
#define DW(name) name##_8
#define DW_TARGET
#include "dwconv_impl.h"
#undef DW_LANES
#undef V
#undef VLOAD
#undef VSTORE
#undef VFMA
#undef VADD
#undef VZERO
#undef VACT
#undef DW
#undef DW_TARGET

#define DW_LANES 16
#define V __m512
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VZERO _mm512_setzero_ps
#define VACT activate512
#define DW(name) name##_16
#define DW_TARGET AVX512
#include "dwconv_impl.h"

/* ---- One pixel at a time over packed weights (AVX-512, session 43) ----------------------------------------------
 * The strips above walk the channel blocks of four pixels with the taps' weights read from w9 (9 x c, a tap every c
 * floats). With large pixels (256 channels and more: 1 KiB and up) a strip's lines of input, weights and output come
 * to ~62 KB per sweep of the channels at 512 channels, more than the 48 KB L1: they are evicted before the next strip
 * wants them (14 x 14 x 512 at stride 1 ran ~29 us in MobileNet v1 where XNNPACK takes ~22). Here, as in XNNPACK's
 * depthwise micro-kernels, each output pixel is done for a chunk of at most DWP_CHUNK channels (equal chunks of whole
 * 32-channel blocks) with its nine input pixels (pointers; a tap outside the input reads zeros) and the chunk's
 * weights packed block by block after w9 (ckernels.dw3x3_weights: per 32 channels the bias, then the nine taps, 40
 * lines in a row): at most ~30 KB of weights and inputs per pixel, in L1 for the next pixel, which shares six of the
 * nine input pixels. Per 32 channels: eighteen FMAs from twenty weight and eighteen input loads, two stores. Each sum
 * is the strips' (the bias, then the taps row by row), a border tap adding 0 x w.
 * Paired in one process against the strips (one thread, warm, 64-byte aligned, Zen 5; the two runs of the chunk's
 * final form): stride 1 14 x 14 x 512 0.80-0.91x the time, 28 x 28 x 256 0.81-0.83, 14 x 14 x 384 0.93, 14 x 14 x 576
 * 0.88-0.89, 7 x 7 x 1024 0.71-0.73, 7 x 7 x 960 0.76; stride 2 14 x 14 x 512 0.80-0.82, 28 x 28 x 256 0.84-0.85,
 * 56 x 56 x 128 0.93-0.95, 28 x 28 x 192 0.95-1.02, 112 x 112 x 96 0.98-1.03. Not taken: stride 1 below 256 channels
 * (56 x 56 x 128 0.99-1.06), stride 2 below 128 (112 x 112 x 64 1.04) or with a half block (56 x 56 x 144 1.09-1.19).
 * ckernels.set_dw_packed(False) turns it off. */
#define DWP_CHUNK 384
#define DWP_MIN_C 256
#define DWP_MIN_C_STRIDED 128
static const float dwp_zero[DWP_CHUNK] __attribute__((aligned(64)));
static int dw_packed = 1;

/* the packed path on (1) or off (0), or only ask (< 0) */
int64_t leti_set_dw_packed(int64_t on) {
    if (on >= 0) dw_packed = (int)on;
    return dw_packed;
}

/* The same on AVX2 hosts (session 46, a Zen 3: 32 KB of L1): chunks of at most DWP_CHUNK8 channels. There the strips
 * read the nine taps' weights and the pixels c floats apart; with 512 or 1024 channels (2 or 4 KiB) all of them fall
 * into one or two of the L1's 64 sets, and 7 x 7 x 1024 at stride 1 (a third of its pixels at a border, each done
 * alone) ran at 83 us as a single-layer model where XNNPACK takes 48, 14 x 14 x 512 at stride 2 52 against 27. */
#define DWP_CHUNK8 256
#define DWP8_MIN_C 1024
#define DWP8_MIN_C_STRIDED 128

/* whether leti_dwconv3x3 runs a convolution of c channels at these strides from the packed weights */
static int dw_takes_packed(int64_t c, int64_t sh, int64_t sw) {
    if (!dw_packed || c % 32) return 0;
    int strided = sh > 1 || sw > 1;
    if (dw_packed16(strided)) return c >= (strided ? DWP_MIN_C_STRIDED : DWP_MIN_C);
    return c >= (strided ? DWP8_MIN_C_STRIDED : DWP8_MIN_C);
}

/* the pixel's nine input pointers for channels c0.. (a tap outside the input reads zeros) */
static inline void dwp_inputs(const float *in[9], const float *xi, int64_t x_row0, int64_t h, int64_t wd, int64_t c,
                              int64_t iy, int64_t ix, int64_t dh, int64_t dw, int64_t c0) {
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            int64_t yy = iy + i * dh, xx = ix + j * dw;
            in[i * 3 + j] = yy < 0 || yy >= h || xx < 0 || xx >= wd ? dwp_zero - c0 : xi + ((yy - x_row0) * wd + xx) * c;
        }
}

/* dw_pixels_packed with 8-lane vectors: four per 32-channel block, the same sums bit for bit */
static void dw_pixels_packed8(const float *x, int64_t x_row0, float *y, const float *wp, int64_t h, int64_t wd,
                              int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                              int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    const int64_t parts = (c + DWP_CHUNK8 - 1) / DWP_CHUNK8, chunk = ((c + parts - 1) / parts + 31) / 32 * 32;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, iy = (r % oh) * sh - pt;
        const float *xi = x + n * h * wd * c;
        float *yr = y + r * ow * c;
        for (int64_t c0 = 0; c0 < c; c0 += chunk) {
            int64_t c1 = c - c0 < chunk ? c : c0 + chunk;
            for (int64_t xo = 0; xo < ow; ++xo) {
                const float *in[9];
                dwp_inputs(in, xi, x_row0, h, wd, c, iy, xo * sw - pl, dh, dw, c0);
                float *o = yr + xo * c;
                const float *w = wp + 10 * c0;
                for (int64_t cb = c0; cb < c1; cb += 32, w += 320) {
                    __m256 a0 = _mm256_loadu_ps(w), a1 = _mm256_loadu_ps(w + 8);
                    __m256 a2 = _mm256_loadu_ps(w + 16), a3 = _mm256_loadu_ps(w + 24);
                    for (int k = 0; k < 9; ++k) {
                        const float *ik = in[k] + cb, *wk = w + 32 + 32 * k;
                        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(ik), _mm256_loadu_ps(wk), a0);
                        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(ik + 8), _mm256_loadu_ps(wk + 8), a1);
                        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(ik + 16), _mm256_loadu_ps(wk + 16), a2);
                        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(ik + 24), _mm256_loadu_ps(wk + 24), a3);
                    }
                    _mm256_storeu_ps(o + cb, activate(a0, act));
                    _mm256_storeu_ps(o + cb + 8, activate(a1, act));
                    _mm256_storeu_ps(o + cb + 16, activate(a2, act));
                    _mm256_storeu_ps(o + cb + 24, activate(a3, act));
                }
            }
        }
    }
}

static AVX512 void dw_pixels_packed(const float *x, int64_t x_row0, float *y, const float *wp, int64_t h, int64_t wd,
                                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    /* chunks of equal size, whole 32-channel blocks, at most DWP_CHUNK (384: 2 x 192, not 256 + 128) */
    const int64_t parts = (c + DWP_CHUNK - 1) / DWP_CHUNK, chunk = ((c + parts - 1) / parts + 31) / 32 * 32;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / oh, iy = (r % oh) * sh - pt;
        const float *xi = x + n * h * wd * c;
        float *yr = y + r * ow * c;
        for (int64_t c0 = 0; c0 < c; c0 += chunk) {
            int64_t c1 = c - c0 < chunk ? c : c0 + chunk;
            for (int64_t xo = 0; xo < ow; ++xo) {
                const float *in[9];
                dwp_inputs(in, xi, x_row0, h, wd, c, iy, xo * sw - pl, dh, dw, c0);
                float *o = yr + xo * c;
                const float *w = wp + 10 * c0;
                int64_t cb = c0;
                for (; cb < c1; cb += 32, w += 320) {
                    __m512 a = _mm512_loadu_ps(w), b = _mm512_loadu_ps(w + 16);
                    for (int k = 0; k < 9; ++k) {
                        a = _mm512_fmadd_ps(_mm512_loadu_ps(in[k] + cb), _mm512_loadu_ps(w + 32 + 32 * k), a);
                        b = _mm512_fmadd_ps(_mm512_loadu_ps(in[k] + cb + 16), _mm512_loadu_ps(w + 48 + 32 * k), b);
                    }
                    _mm512_storeu_ps(o + cb, activate512(a, act));
                    _mm512_storeu_ps(o + cb + 16, activate512(b, act));
                }
            }
        }
    }
}

/* leti_dwconv3x3 over an input of which only rows x_row0.. are held, from x on (a band of the input, one image: a
 * native program's fused product and depthwise step, program.c); the rows the outputs r0..r1-1 read must be held */
void leti_dwconv3x3_band(const float *x, int64_t x_row0, float *y, const float *w, const float *bias, int64_t h,
                         int64_t wd, int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                         int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1);

void leti_dwconv3x3(const float *x, float *y, const float *w, const float *bias, int64_t h, int64_t wd,
                    int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    leti_dwconv3x3_band(x, 0, y, w, bias, h, wd, c, oh, ow, sh, sw, dh, dw, pt, pl, act, r0, r1);
}

void leti_dwconv3x3_band(const float *x, int64_t x_row0, float *y, const float *w, const float *bias, int64_t h,
                         int64_t wd, int64_t c, int64_t oh, int64_t ow, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                         int64_t pt, int64_t pl, int64_t act, int64_t r0, int64_t r1) {
    if (dw_takes_packed(c, sh, sw)) {
        (dw_packed16(sh > 1 || sw > 1) ? dw_pixels_packed : dw_pixels_packed8)(x, x_row0, y, w + 9 * c, h, wd, c, oh,
                                                                               ow, sh, sw, dh, dw, pt, pl, act, r0, r1);
        return;
    }
    const int64_t row_in = wd * c, img_in = h * row_in, row_out = ow * c;
    /* 16 channels a vector where the CPU has AVX-512, the channels come in whole 16s and the stride is 2 or more,
     * else 8. One thread, 64-byte aligned data (benchmarks/bench_dwconv.py, Zen 5): at stride 2 the 16-lane code takes
     * 0.79-0.93x the 8-lane one's time (112x112x64 0.064 -> 0.051 ms), at stride 1 0.91-1.26x (56x56x144 0.082 ->
     * 0.100 ms: its strips of four pixels at 16 lanes run at 80 GFLOP/s against 95-100 at 8) */
    const int wide = c % 16 == 0 && (sw > 1 || sh > 1) && leti_set_avx512(-1);
    const int64_t cfull = wide ? c : c & ~(int64_t)7;
    /* the interior columns: all three horizontal taps inside the input */
    int64_t fa = (pl + sw - 1) / sw, fb = (wd - 1 - 2 * dw + pl) / sw + 1;
    if (fa > ow) fa = ow;
    if (fb > ow) fb = ow;
    if (fb < fa) fb = fa;
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
        for (int i = 0; i < 3; ++i) rows[i] = (i >= i0 && i < i1) ? xi + (iy + i * dh - x_row0) * row_in : xi;
        if (wide)
            dw_row_16(yr, rows, w, bias, c, cfull, ow, fa, fb, sw, pl, dw, wd, act, i0, i1);
        else
            dw_row_8(yr, rows, w, bias, c, cfull, ow, fa, fb, sw, pl, dw, wd, act, i0, i1);
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
