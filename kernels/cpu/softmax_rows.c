/* Row softmax of bf16 attention scores with the causal corner (AVX512-BF16): see kernels/cpu_softmax.py. */
#include <immintrin.h>
#include <stdint.h>

/* Only the kernel is built for AVX512: kv_supported must run on any x86-64 CPU. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

int kv_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512bf16");
}

AVX512 static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* exp(x) for x <= 0: 2^(x log2 e) = 2^n 2^f, |f| <= 1/2, 2^f by Taylor to degree 5. */
AVX512 static inline __m512 exp_neg(__m512 x) {
    __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-100.f)), _mm512_set1_ps(1.4426950408889634f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Row r of s [rows, ld] sees columns < min(cols, prefix + (row0 + r) / g + 1); the rest become 0. */
AVX512 void kv_softmax_rows(uint16_t *s, float *sums, int64_t rows, int64_t ld, int64_t cols,
                     int64_t prefix, int64_t row0, int64_t g) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *x = s + r * ld;
        int64_t vis = prefix + (row0 + r) / g + 1;
        if (vis > cols) vis = cols;
        __m512 mx = _mm512_set1_ps(-__builtin_inff());
        for (int64_t j = 0; j < vis; j += 16) {
            __mmask16 m = vis - j >= 16 ? 0xFFFF : (__mmask16)((1u << (vis - j)) - 1);
            mx = _mm512_mask_max_ps(mx, m, mx, load_bf16(x + j, m));
        }
        __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < vis; j += 16) {
            __mmask16 m = vis - j >= 16 ? 0xFFFF : (__mmask16)((1u << (vis - j)) - 1);
            __m512 e = _mm512_maskz_mov_ps(m, exp_neg(_mm512_sub_ps(load_bf16(x + j, m), top)));
            acc = _mm512_add_ps(acc, e);
            _mm256_mask_storeu_epi16(x + j, m, (__m256i)_mm512_cvtneps_pbh(e));
        }
        for (int64_t j = vis; j < cols; j++) x[j] = 0;
        sums[r] = _mm512_reduce_add_ps(acc);
    }
}
