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

#endif
