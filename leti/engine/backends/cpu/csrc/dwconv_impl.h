/* The 3x3 depthwise kernel's register code over vectors of DW_LANES channels, included twice by dwconv.c: AVX2
 * (8 lanes, __m256) and AVX-512 (16 lanes, __m512, compiled for avx512f by DW_TARGET). The includer defines V, VLOAD,
 * VSTORE, VFMA, VADD, VZERO, VACT (the fused activation), DW(name) (the variant's suffix), DW_TARGET and DW_LANES. */

/* acc = b + the taps of rows I0..I1-1 and columns J0..J1-1 of the window (compile-time bounds once inlined:
 * every tap unrolled, the weights from registers). x0, x1, x2: the window's input rows at the pixel's first
 * column; d: the column step of one tap. Three accumulators keep three FMA chains going. */
static inline __attribute__((always_inline)) DW_TARGET V DW(dw_taps)(const float *x0, const float *x1, const float *x2,
                                                            int64_t d, const V wk[9], V b, int I0,
                                                            int I1, int J0, int J1) {
    const float *r[3] = {x0, x1, x2};
    V acc[3] = {b, VZERO(), VZERO()};
    for (int i = 0; i < 3; ++i) {
        if (i < I0 || i >= I1) continue;
        for (int j = 0; j < 3; ++j) {
            if (j < J0 || j >= J1) continue;
            acc[j] = VFMA(VLOAD(r[i] + j * d), wk[i * 3 + j], acc[j]);
        }
    }
    return VADD(VADD(acc[0], acc[1]), acc[2]);
}

/* One window row of a strip of four adjacent output pixels (stride 1, dilation 1) of one channel block: the row's six
 * input vectors are loaded once and shared by the pixels whose windows overlap, each of its three taps' weights once
 * for all four. row: the first pixel's window row at its first column; c: the pixel step; wrow: the row's first tap. */
static inline __attribute__((always_inline)) DW_TARGET void DW(dw_strip_row)(const float *row, int64_t c, const float *wrow,
                                                               V acc[4]) {
    V in[6];
    for (int q = 0; q < 6; ++q) in[q] = VLOAD(row + q * c);
    for (int j = 0; j < 3; ++j) {
        V wv = VLOAD(wrow + j * c);
        for (int p = 0; p < 4; ++p) acc[p] = VFMA(in[p + j], wv, acc[p]);
    }
}

/* Four adjacent output pixels of one channel block whose windows keep rows I0..I1-1 and all three columns (stride 1,
 * dilation 1): 27 + 9 loads for 36 FMAs, against 46 when the taps stay in registers and every pixel loads its own
 * nine inputs. x0..x2: the first pixel's window rows at its first column; wt: the block's first tap. */
static inline __attribute__((always_inline)) DW_TARGET void DW(dw_strip)(float *out, const float *x0, const float *x1,
                                                           const float *x2, int64_t c, const float *wt, V b,
                                                           int64_t act, int I0, int I1) {
    const float *r[3] = {x0, x1, x2};
    V acc[4] = {b, b, b, b};
    for (int i = I0; i < I1; ++i) DW(dw_strip_row)(r[i], c, wt + i * 3 * c, acc);
    for (int p = 0; p < 4; ++p) VSTORE(out + p * c, VACT(acc[p], act));
}

#if DW_LANES == 8
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
        DW(dw_strip_row)(r[i], c, wt + i * 3 * c, acc0);
        DW(dw_strip_row)(r[i] + 8, c, wt + i * 3 * c + 8, acc1);
    }
    for (int p = 0; p < 4; ++p) {
        _mm256_storeu_ps(out + p * c, activate(acc0[p], act));
        _mm256_storeu_ps(out + p * c + 8, activate(acc1[p], act));
    }
}
#endif

/* output columns from xa whose windows keep rows I0..I1-1 and all three columns (stride 1): strips of four pixels
 * while four remain before xb; returns the first column not done (the rest go through dw_segment's per-pixel path,
 * faster than strips of one). Chunks of four columns outer so that a chunk's inputs stay in L1 while every channel
 * block passes over them. */
static inline __attribute__((always_inline)) DW_TARGET int64_t DW(dw_strips)(float *yr, const float *const r[3], const float *w,
                                                               const float *bias, int64_t c, int64_t cfull,
                                                               int64_t xa, int64_t xb, int64_t pl, int64_t act,
                                                               int I0, int I1) {
    const float *x0 = r[0], *x1 = r[1], *x2 = r[2];
    int64_t xs = xa;
    for (; xs + 4 <= xb; xs += 4) {
        int64_t s = (xs - pl) * c;
        int64_t cb = 0;
#if DW_LANES == 8 /* with 16 lanes a vector is the whole line */
        for (; c % 256 == 0 && cb + 16 <= cfull; cb += 16) {  /* pixels a multiple of 1 KiB apart */
            __m256 b0 = bias ? _mm256_loadu_ps(bias + cb) : _mm256_setzero_ps();
            __m256 b1 = bias ? _mm256_loadu_ps(bias + cb + 8) : _mm256_setzero_ps();
            dw_strip2(yr + xs * c + cb, x0 + s + cb, x1 + s + cb, x2 + s + cb, c, w + cb, b0, b1, act, I0, I1);
        }
#endif
        for (; cb < cfull; cb += DW_LANES) {
            V b = bias ? VLOAD(bias + cb) : VZERO();
            DW(dw_strip)(yr + xs * c + cb, x0 + s + cb, x1 + s + cb, x2 + s + cb, c, w + cb, b, act, I0, I1);
        }
    }
    return xs;
}

/* output columns xa..xb-1 of a row, every pixel keeping taps I0..I1 x J0..J1 of its window: chunks of XC
 * columns, then blocks of 8 channels (the block's taps loaded into registers once per chunk), then the chunk's
 * columns. With constant bounds (the callers) the taps are unrolled. */
static inline __attribute__((always_inline)) DW_TARGET void DW(dw_segment)(float *yr, const float *const r[3], const float *w,
                                                             const float *bias, int64_t c, int64_t cfull,
                                                             int64_t xa, int64_t xb, int64_t sw, int64_t pl,
                                                             int64_t d, int64_t act, int I0, int I1, int J0,
                                                             int J1) {
    if (J0 == 0 && J1 == 3 && d == c && sw == 1) xa = DW(dw_strips)(yr, r, w, bias, c, cfull, xa, xb, pl, act, I0, I1);
    const float *x0 = r[0], *x1 = r[1], *x2 = r[2];
    for (int64_t xs = xa; xs < xb; xs += XC) {
        int64_t xe = xs + XC < xb ? xs + XC : xb;
        for (int64_t cb = 0; cb < cfull; cb += DW_LANES) {
            V wk[9];
            for (int k = 0; k < 9; ++k) wk[k] = VLOAD(w + k * c + cb);
            V b = bias ? VLOAD(bias + cb) : VZERO();
            for (int64_t xo = xs; xo < xe; ++xo) {
                int64_t s = (xo * sw - pl) * c + cb;
                VSTORE(yr + xo * c + cb, VACT(DW(dw_taps)(x0 + s, x1 + s, x2 + s, d, wk, b, I0, I1, J0, J1), act));
            }
        }
    }
}

/* a run of pixels whose windows keep the same taps, by the unrolled case of that subset; 0 when it has none (a
 * window clipped on both sides, dilation or padding over 1: the caller's tap-by-tap path) */
#define SEG(I0, I1, J0, J1) DW(dw_segment)(yr, r, w, bias, c, cfull, xa, xb, sw, pl, d, act, I0, I1, J0, J1)
static DW_TARGET int DW(dw_run)(float *yr, const float *const r[3], const float *w, const float *bias, int64_t c,
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

/* one output row's whole channel blocks (cfull channels): the interior columns fa..fb-1 (all three horizontal taps
 * inside) in one run, each border column alone, each by the unrolled case of its taps; rows: the window rows (those
 * outside the input, i0..i1 exclusive, are never read) */
static DW_TARGET void DW(dw_row)(float *yr, const float *const rows[3], const float *w, const float *bias, int64_t c,
                                 int64_t cfull, int64_t ow, int64_t fa, int64_t fb, int64_t sw, int64_t pl, int64_t dw,
                                 int64_t wd, int64_t act, int64_t i0, int64_t i1) {
    const int64_t d = dw * c;
    for (int64_t xo = 0; xo < ow && cfull; ) {
        int64_t xe = xo < fa ? xo + 1 : xo < fb ? fb : xo + 1, j0, j1;
        dw_cols(xo, sw, pl, dw, wd, &j0, &j1);
        if (!DW(dw_run)(yr, rows, w, bias, c, cfull, xo, xe, sw, pl, d, act, i0, i1, j0, j1)) {
            for (int64_t xt = xo; xt < xe; ++xt) {  /* tap by tap */
                int64_t ix = xt * sw - pl;
                for (int64_t cb = 0; cb < cfull; cb += DW_LANES) {
                    V acc = bias ? VLOAD(bias + cb) : VZERO();
                    for (int64_t i = i0; i < i1; ++i)
                        for (int64_t j = j0; j < j1; ++j)
                            acc = VFMA(VLOAD(rows[i] + (ix + j * dw) * c + cb), VLOAD(w + (i * 3 + j) * c + cb), acc);
                    VSTORE(yr + xt * c + cb, VACT(acc, act));
                }
            }
        }
        xo = xe;
    }
}
