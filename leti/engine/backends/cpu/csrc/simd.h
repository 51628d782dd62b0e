/* Helpers shared by LETI's C kernels (AVX2, and AVX-512 in functions compiled for it by the AVX512 attribute). */
#ifndef LETI_SIMD_H
#define LETI_SIMD_H
#include <immintrin.h>
#include <stdint.h>

/* lanes 0..lanes-1 set (lanes in 0..8): the mask of a tail shorter than a vector */
static inline __m256i lane_mask(int64_t lanes) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)lanes), idx);
}

/* the fused activation: 0 none, 1 relu, 2 relu6 */
static inline __attribute__((always_inline)) __m256 activate(__m256 v, int64_t act) {
    if (act >= 1) v = _mm256_max_ps(v, _mm256_setzero_ps());
    if (act == 2) v = _mm256_min_ps(v, _mm256_set1_ps(6.0f));
    return v;
}

/* the same for one float */
static inline float activate1(float v, int64_t act) {
    if (act >= 1 && v < 0.0f) v = 0.0f;
    if (act == 2 && v > 6.0f) v = 6.0f;
    return v;
}

/* a function compiled for avx512f (called only where the CPU has it) */
#define AVX512 __attribute__((target("avx512f")))

/* the fused activation on 16 lanes */
static inline AVX512 __attribute__((always_inline)) __m512 activate512(__m512 v, int64_t act) {
    if (act >= 1) v = _mm512_max_ps(v, _mm512_setzero_ps());
    if (act == 2) v = _mm512_min_ps(v, _mm512_set1_ps(6.0f));
    return v;
}

/* Up to twelve rows of a matrix read one k step at a time (the AVX-512 tiles' broadcasts of a): two row pointers
 * (rows 0-5 and 6-11) and three strides (lda, 3 lda and 5 lda in bytes), row r at base + stride * scale, five
 * registers in all. Written as a[r * lda + p], GCC keeps one register per row, and with the B pointers and the loop
 * bound it runs out of the sixteen: on a 12 x 32 tile it spilled row pointers to xmm registers and the stack inside
 * the k loop (51 instructions a k step, 41 with this; products 3-5 % faster on a Zen 4, bit for bit the same). */
typedef struct {
    const char *lo, *hi;
    int64_t l1, l3, l5;
} rows12;

/* rows 0..mr-1 of a (row stride lda floats) at column 0 */
static inline __attribute__((always_inline)) rows12 rows12_at(const float *a, int64_t lda, const int mr) {
    rows12 r = {(const char *)a, (const char *)(mr > 6 ? a + 6 * lda : a), lda * 4, lda * 12, lda * 20};
    return r;
}

/* the next column */
static inline __attribute__((always_inline)) void rows12_next(rows12 *r) {
    r->lo += 4;
    r->hi += 4;
}

/* the twelve rows' addressing modes (two row pointers, strides lda, 3 lda, 5 lda): OP(base, mode) for `row` */
#define ROWS12_SWITCH(OP)                                                                           \
    switch (row) {                                                                                  \
    case 0: OP(r->lo, "(%1)"); break;                                                               \
    case 1: OP(r->lo, "(%1,%2,1)"); break;                                                          \
    case 2: OP(r->lo, "(%1,%2,2)"); break;                                                          \
    case 3: OP(r->lo, "(%1,%3,1)"); break;                                                          \
    case 4: OP(r->lo, "(%1,%2,4)"); break;                                                          \
    case 5: OP(r->lo, "(%1,%4,1)"); break;                                                          \
    case 6: OP(r->hi, "(%1)"); break;                                                               \
    case 7: OP(r->hi, "(%1,%2,1)"); break;                                                          \
    case 8: OP(r->hi, "(%1,%2,2)"); break;                                                          \
    case 9: OP(r->hi, "(%1,%3,1)"); break;                                                          \
    case 10: OP(r->hi, "(%1,%2,4)"); break;                                                         \
    default: OP(r->hi, "(%1,%4,1)"); break;                                                         \
    }

/* row `row` (a compile-time constant after inlining) of the current column, broadcast to 16 lanes; the "m"
 * operand tells the compiler that the asm reads the rows */
static inline AVX512 __attribute__((always_inline)) __m512 rows12_bcast(const rows12 *r, const int row) {
    __m512 v;
#define ROWS12_BCAST_OP(base, mode)                                                                \
    __asm__("vbroadcastss " mode ", %0"                                                            \
            : "=v"(v)                                                                               \
            : "r"(base), "r"(r->l1), "r"(r->l3), "r"(r->l5), "m"(*(const char(*)[])base))
    ROWS12_SWITCH(ROWS12_BCAST_OP)
#undef ROWS12_BCAST_OP
    return v;
}

/* c + b * row `row` of the current column, the row's element broadcast by the FMA itself (one instruction: where
 * each element feeds a single FMA, a separate broadcast made single-panel products 14-17 % slower on the Zen 4) */
static inline AVX512 __attribute__((always_inline)) __m512 rows12_fmadd(const rows12 *r, const int row, __m512 b,
                                                                         __m512 c) {
#define ROWS12_FMA_OP(base, mode)                                                                  \
    __asm__("vfmadd231ps " mode "%{1to16%}, %5, %0"                                                 \
            : "+v"(c)                                                                               \
            : "r"(base), "r"(r->l1), "r"(r->l3), "r"(r->l5), "v"(b), "m"(*(const char(*)[])base))
    ROWS12_SWITCH(ROWS12_FMA_OP)
#undef ROWS12_FMA_OP
    return c;
}
#undef ROWS12_SWITCH

#endif
