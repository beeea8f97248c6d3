/* Weight dequantization of runtime/models/quant_linear.py's QuantLinear, for a prefill matmul.
 *
 * A prefill chunk multiplies hundreds of rows by every weight, so the weight is dequantized for the
 * call and multiplied densely.  In torch that is four elementwise passes (two nibble copies, the
 * scale, the offset): ~3 ms a layer of the embedded model, 18% of its 512-row GEMMs.  One pass here.
 *
 * Rounding is torch's: in bf16, ``q * scale`` rounds to bf16, then ``+ low`` rounds again (the two
 * in-place ops of QuantLinear.dequantize); in fp32 both are fp32 ops.  Results are bit-identical.
 *
 * int4 codes: [n, k / 32, 16] bytes, byte j of a group holding code j (low nibble) and j + 16 (high);
 * scale, low: [n, k / 32] bf16.  int8 codes: [n, k] int8, scale [n] bf16.
 */
#include "common.h"

#define DEFINE_DEQUANT(SUF, T, ST, RND)                                                              \
void dequant_int4_##SUF(const uint8_t *codes, const bf16 *scale, const bf16 *low, int64_t n,         \
                        int64_t k, T *out) {                                                         \
    int64_t groups = k / 32;                                                                         \
    _Pragma("omp parallel for schedule(static) if (n * k > 65536)")                                 \
    for (int64_t r = 0; r < n; r++)                                                                  \
        for (int64_t g = 0; g < groups; g++) {                                                       \
            const uint8_t *c = codes + (r * groups + g) * 16;                                        \
            float s = bf2f(scale[r * groups + g]), l = bf2f(low[r * groups + g]);                    \
            T *o = out + r * k + g * 32;                                                             \
            _Pragma("omp simd")                                                                      \
            for (int j = 0; j < 16; j++) {                                                           \
                o[j] = ST(RND(RND((float)(c[j] & 15) * s) + l));                                     \
                o[j + 16] = ST(RND(RND((float)(c[j] >> 4) * s) + l));                                \
            }                                                                                        \
        }                                                                                            \
}                                                                                                    \
                                                                                                     \
void dequant_int8_##SUF(const int8_t *codes, const bf16 *scale, int64_t n, int64_t k, T *out) {     \
    _Pragma("omp parallel for schedule(static) if (n * k > 65536)")                                 \
    for (int64_t r = 0; r < n; r++) {                                                                \
        float s = bf2f(scale[r]);                                                                    \
        _Pragma("omp simd")                                                                          \
        for (int64_t j = 0; j < k; j++) out[r * k + j] = ST(RND((float)codes[r * k + j] * s));       \
    }                                                                                                \
}

DEFINE_DEQUANT(f32, float, st_f, rnd_f)

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* bf16 int4 with AVX512-BF16: a group in ~12 instructions (the portable loop's conversions did not
 * vectorise well: it ran no faster than torch's four passes). */

void dequant_int4_bf16(const uint8_t *codes, const bf16 *scale, const bf16 *low, int64_t n, int64_t k,
                       bf16 *out) {
    int64_t groups = k / 32;
#pragma omp parallel for schedule(static) if (n * k > 65536)
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < groups; g++) {
            __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + (r * groups + g) * 16)));
            __m512 s = _mm512_set1_ps(bf2f(scale[r * groups + g])), l = _mm512_set1_ps(bf2f(low[r * groups + g]));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15)));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
            lo = _mm512_add_ps(rnd_bf16x16(_mm512_mul_ps(lo, s)), l);
            hi = _mm512_add_ps(rnd_bf16x16(_mm512_mul_ps(hi, s)), l);
            _mm512_storeu_si512(out + r * k + g * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}

void dequant_int8_bf16(const int8_t *codes, const bf16 *scale, int64_t n, int64_t k, bf16 *out) {
#pragma omp parallel for schedule(static) if (n * k > 65536)
    for (int64_t r = 0; r < n; r++) {
        float s = bf2f(scale[r]);
        for (int64_t j = 0; j < k; j++) out[r * k + j] = f2bf((float)codes[r * k + j] * s);
    }
}
#else
DEFINE_DEQUANT(bf16, bf16, f2bf, rnd_bf)
#endif
