/* MXFP4 linear for few rows (gpt-oss experts at decode): y[r, o] = sum_i x[r, i] * W[o, i], with W kept
 * as the checkpoint's blocks (two e2m1 codes a byte, low nibble first) and one power-of-two scale per
 * 32 weights (uint8 exponent, bias 127).  A block's 16 bytes are decoded once for all rows: on AVX2 a
 * vpshufb looks up twice each e2m1 value as an int8 (all of them are integers then: 0, 1, 2, 3, 4, 6,
 * 8, 12), the 32 weights are widened to floats and multiplied into the rows' block sums, each block sum
 * scaled by 2^(e - 128) (the halving undoes the doubling).  Exact weights; fp32 sums in another order
 * than a dense matmul's.  Output rows split across threads.  */
#include <math.h>
#include <stdint.h>

#define MAX_ROWS 8

static const float FP4[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 2^(s - 128) built from its bits (a libm ldexpf call per block cost more than the block's products) */
static inline float half_scale(uint8_t s) {
    if (s < 2) return ldexpf(1.f, (int)s - 128);
    union { uint32_t u; float f; } v = {(uint32_t)(s - 1) << 23};
    return v.f;
}

static void row(const float *x, int64_t rows, int64_t in, const uint8_t *blk, const uint8_t *sc, float *y,
                int64_t out) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i low = _mm_set1_epi8(0x0F);
    __m256 acc[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < in / 32; g++) {
        __m128i b = _mm_loadu_si128((const __m128i *)(blk + g * 16));
        __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, low));
        __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), low));
        __m128i w0 = _mm_unpacklo_epi8(lo, hi), w1 = _mm_unpackhi_epi8(lo, hi);  /* weights 0-15, 16-31 */
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w0));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w0, 8)));
        __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w1));
        __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w1, 8)));
        __m256 s = _mm256_set1_ps(half_scale(sc[g]));
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * in + g * 32;
            __m256 t = _mm256_mul_ps(f0, _mm256_loadu_ps(xr));
            t = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xr + 8), t);
            t = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xr + 16), t);
            t = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xr + 24), t);
            acc[r] = _mm256_fmadd_ps(t, s, acc[r]);
        }
    }
    for (int64_t r = 0; r < rows; r++) y[r * out] = hsum8(acc[r]);
}
#else
static void row(const float *x, int64_t rows, int64_t in, const uint8_t *blk, const uint8_t *sc, float *y,
                int64_t out) {
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.f;
        for (int64_t g = 0; g < in / 32; g++) {
            float t = 0.f;
            for (int64_t k = 0; k < 16; k++) {
                uint8_t b = blk[g * 16 + k];
                t += FP4[b & 15] * x[r * in + g * 32 + 2 * k] + FP4[b >> 4] * x[r * in + g * 32 + 2 * k + 1];
            }
            acc += ldexpf(t, (int)sc[g] - 127);
        }
        y[r * out] = acc;
    }
}
#endif

/* x [rows, in] fp32, blocks [out, in/2], scales [out, in/32] -> y [rows, out] fp32; 0 ok, -1 bad shape */
int mxfp4_linear(const float *x, int64_t rows, int64_t in, const uint8_t *blocks, const uint8_t *scales,
                 int64_t out, float *y) {
    if (rows < 1 || rows > MAX_ROWS || in % 32) return -1;
    (void)FP4;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; o++)
        row(x, rows, in, blocks + o * (in / 2), scales + o * (in / 32), y + o, out);
    return 0;
}
