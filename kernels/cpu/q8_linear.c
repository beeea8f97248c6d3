/* The Q8_0 linear of the fused CPU kernels (the LM head of a GGUF model): see block_int8.py. */
#include "common.h"

/* The Q8_0 linear (the LM head) multiplies as llama.cpp does: each activation row is quantized to
 * int8 per block of 32 (scale max|x| / 127, its Q8_0), and a block's 32 products are one integer dot
 * product (AVX-512 VNNI vpdpbusd: 4 products a lane), scaled once.  SmolLM2's 49152 x 576 head: 1.1 ms
 * a row on 2 threads, where oneDNN's packed bf16 head takes 3.4 ms and a float dot product of the
 * codes 2.8 ms.  */
static void quantize_rows_q8(const float *x, int64_t blocks, int8_t *xq, float *dx) {
    for (int64_t g = 0; g < blocks; g++) {
        const float *xb = x + g * 32;
        float amax = 0.f;
        for (int64_t i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int64_t i = 0; i < 32; i++) xq[g * 32 + i] = (int8_t)nearbyintf(xb[i] * id);
        dx[g] = d;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* signed x signed through vpdpbusd (unsigned x signed): |c| times x carrying c's sign */
static inline __m256i q8_dot(const int8_t *c, const int8_t *x) {
    __m256i cv = _mm256_loadu_si256((const __m256i *)c), xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(cv), _mm256_sign_epi8(xv, cv));
}

static inline float q8_row(const int8_t *c, const float *sc, const int8_t *xq, const float *dx, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b] * dx[b]), _mm256_cvtepi32_ps(q8_dot(c + b * 32, xq + b * 32)), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b + 1] * dx[b + 1]),
                             _mm256_cvtepi32_ps(q8_dot(c + b * 32 + 32, xq + b * 32 + 32)), a1);
    }
    if (b < nb)
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b] * dx[b]), _mm256_cvtepi32_ps(q8_dot(c + b * 32, xq + b * 32)), a0);
    return hsum8(_mm256_add_ps(a0, a1));
}
#else
static inline float q8_row(const int8_t *c, const float *sc, const int8_t *xq, const float *dx, int64_t nb) {
    float acc = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t d = 0;
        for (int64_t i = 0; i < 32; i++) d += c[b * 32 + i] * xq[b * 32 + i];
        acc += sc[b] * dx[b] * (float)d;
    }
    return acc;
}
#endif

/* y[r, :] = x[r, :] W^T, W[o, 32 b + i] = codes[o, 32 b + i] * scales[o, b]; the rows are converted
 * and quantized once, then each thread runs its range of outputs, reading each weight row once for
 * all rows (a decode batch).  */
#define DEFINE_Q8(SUF, T, LD, ST)                                                                    \
int q8_linear_##SUF(const T *x, int64_t rows, const int8_t *codes, const float *scales, int64_t n,  \
                    int64_t k, T *y) {                                                               \
    int64_t nb = k / 32;                                                                             \
    float *xf = malloc((rows * k + rows * nb) * sizeof(float));                                      \
    int8_t *xq = malloc(rows * k);                                                                   \
    if (!xf || !xq) {                                                                                \
        free(xf), free(xq);                                                                          \
        return -2;                                                                                   \
    }                                                                                                \
    float *dx = xf + rows * k;                                                                       \
    for (int64_t i = 0; i < rows * k; i++) xf[i] = LD(x[i]);                                         \
    quantize_rows_q8(xf, rows * nb, xq, dx);                                                         \
    _Pragma("omp parallel for schedule(static)")                                                     \
    for (int64_t o = 0; o < n; o++)                                                                  \
        for (int64_t r = 0; r < rows; r++)                                                           \
            y[r * n + o] = ST(q8_row(codes + o * k, scales + o * nb, xq + r * k, dx + r * nb, nb));  \
    free(xf), free(xq);                                                                              \
    return 0;                                                                                        \
}

DEFINE_Q8(f32, float, ld_f, st_f)
DEFINE_Q8(bf16, bf16, bf2f, f2bf)

/* The same Q8_0 linear for a few rows at a time (a speculative draft's verification: up to 17 rows),
 * where q8_linear's cost grows with every row (a row's 32-wide dot product, signs moved onto x, and
 * a horizontal sum per output).  The blocks are re-laid out in tiles of 16 outputs (Q8Tiles in
 * block_int8.py): per tile and block of 32 inputs, 8 groups of 64 bytes, byte 4i + j of group g the
 * code of output i and input 4g + j plus 128 (unsigned, as vpdpbusd takes it), then the tile's 16
 * scales.  One vpdpbusd multiplies 16 outputs by 4 inputs; the 128 offset comes back out exactly, as
 * 128 * sum(xq) per row and block.  Each row's result is the same whatever the row count.  */
#define TILE_ROWS_MAX 32

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
static inline void q8_tile_rows(int R, const uint8_t *w, const float *sc, int64_t nb, int64_t k,
                                const int8_t *xq, const float *dx, const int32_t *sq, float *out) {
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 512;
        __m512i i0[4], i1[4];
        for (int r = 0; r < R; r++) i0[r] = i1[r] = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2) {
            __m512i v0 = _mm512_loadu_si512((const void *)(wb + g * 64));
            __m512i v1 = _mm512_loadu_si512((const void *)(wb + g * 64 + 64));
            for (int r = 0; r < R; r++) {
                int32_t a, c;
                memcpy(&a, xq + r * k + b * 32 + g * 4, 4);
                memcpy(&c, xq + r * k + b * 32 + g * 4 + 4, 4);
                i0[r] = _mm512_dpbusd_epi32(i0[r], v0, _mm512_set1_epi32(a));
                i1[r] = _mm512_dpbusd_epi32(i1[r], v1, _mm512_set1_epi32(c));
            }
        }
        __m512 s = _mm512_loadu_ps(sc + b * 16);
        for (int r = 0; r < R; r++) {
            __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(i0[r], i1[r]), _mm512_set1_epi32(128 * sq[r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(dx[r * nb + b])), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * 16, acc[r]);
}

static void q8_tile(const uint8_t *w, const float *sc, int64_t nb, int64_t k, const int8_t *xq, const float *dx,
                    const int32_t *sq, int64_t rows, float *out) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) q8_tile_rows(4, w, sc, nb, k, xq + r * k, dx + r * nb, sq + r * nb, out + r * 16);
    switch (rows - r) {
    case 3: q8_tile_rows(3, w, sc, nb, k, xq + r * k, dx + r * nb, sq + r * nb, out + r * 16); break;
    case 2: q8_tile_rows(2, w, sc, nb, k, xq + r * k, dx + r * nb, sq + r * nb, out + r * 16); break;
    case 1: q8_tile_rows(1, w, sc, nb, k, xq + r * k, dx + r * nb, sq + r * nb, out + r * 16); break;
    default: break;
    }
}
#else
static void q8_tile(const uint8_t *w, const float *sc, int64_t nb, int64_t k, const int8_t *xq, const float *dx,
                    const int32_t *sq, int64_t rows, float *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < 16; i++) {
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t dot = 0;
                for (int g = 0; g < 8; g++)
                    for (int j = 0; j < 4; j++) dot += w[b * 512 + g * 64 + i * 4 + j] * xq[r * k + b * 32 + g * 4 + j];
                acc = fmaf((float)(dot - 128 * sq[r * nb + b]), sc[b * 16 + i] * dx[r * nb + b], acc);
            }
            out[r * 16 + i] = acc;
        }
}
#endif

#define DEFINE_Q8_TILES(SUF, T, LD, ST)                                                              \
int q8_tiles_##SUF(const T *x, int64_t rows, const uint8_t *w, const float *sc, int64_t n, int64_t k, \
                   T *y) {                                                                           \
    if (rows > TILE_ROWS_MAX || k % 32) return -1;                                                   \
    int64_t nb = k / 32, tiles = (n + 15) / 16;                                                      \
    float *xf = malloc((rows * k + rows * nb) * sizeof(float));                                      \
    int8_t *xq = malloc(rows * k);                                                                   \
    int32_t *sq = malloc(rows * nb * sizeof(int32_t));                                               \
    if (!xf || !xq || !sq) {                                                                         \
        free(xf), free(xq), free(sq);                                                                \
        return -2;                                                                                   \
    }                                                                                                \
    float *dx = xf + rows * k;                                                                       \
    for (int64_t i = 0; i < rows * k; i++) xf[i] = LD(x[i]);                                         \
    quantize_rows_q8(xf, rows * nb, xq, dx);                                                         \
    for (int64_t i = 0; i < rows * nb; i++) {                                                        \
        int32_t s = 0;                                                                               \
        for (int j = 0; j < 32; j++) s += xq[i * 32 + j];                                            \
        sq[i] = s;                                                                                   \
    }                                                                                                \
    _Pragma("omp parallel for schedule(static)")                                                     \
    for (int64_t t = 0; t < tiles; t++) {                                                            \
        float out[TILE_ROWS_MAX * 16];                                                               \
        q8_tile(w + t * nb * 512, sc + t * nb * 16, nb, k, xq, dx, sq, rows, out);                   \
        int64_t width = n - t * 16 < 16 ? n - t * 16 : 16;                                           \
        for (int64_t r = 0; r < rows; r++)                                                           \
            for (int64_t i = 0; i < width; i++) y[r * n + t * 16 + i] = ST(out[r * 16 + i]);         \
    }                                                                                                \
    free(xf), free(xq), free(sq);                                                                    \
    return 0;                                                                                        \
}

DEFINE_Q8_TILES(f32, float, ld_f, st_f)
DEFINE_Q8_TILES(bf16, bf16, bf2f, f2bf)
