/* Shared by the plain-C CPU kernels: bf16 <-> float as torch rounds, and a vectorisable exp. */
#ifndef KVREUSE_CPU_COMMON_H
#define KVREUSE_CPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

static inline float bf2f(bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline bf16 f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* the round trip torch makes when an op returns a bf16 tensor (identity in fp32) */
static inline float rnd_bf(float f) { return bf2f(f2bf(f)); }
static inline float rnd_f(float f) { return f; }

/* exp for the softmax, written so that `omp simd` loops vectorise it (libm's expf stays scalar
 * without -ffast-math): 2^n * e^r with |r| <= ln2/2 and a degree-6 Taylor polynomial, ~2 ulp.  */
static inline float vexp(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x); /* e^-87 ~ 1.6e-38 counts as 0; e^88 ~ FLT_MAX */
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.f + r * (1.f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f
                  + r * 0.0013888889f)))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

static inline float ld_f(float x) { return x; }
static inline float st_f(float x) { return x; }

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
/* 16 bf16 as floats */
static inline __m512 ld_bf16x16(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* rnd_bf of 16 floats: round to bf16 (nearest even) and back */
static inline __m512 rnd_bf16x16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), 16));
}

/* acc += b . (the bf16 pair at `pair`, broadcast to all 16 lanes) */
static inline __m512 dp_bcast(__m512 acc, __m512bh b, const void *pair) {
    int32_t v;
    memcpy(&v, pair, 4);
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(v), b);
}
#endif

#endif
