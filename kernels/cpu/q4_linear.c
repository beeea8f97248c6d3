/* The int4 linear of QuantLinear for a few rows (decode, and a speculative draft's verification).
 *
 * torch's int4 CPU kernel costs about as much per row as one row does (8 rows ~7x one), so checking
 * k drafted tokens cost ~k decode steps.  Here each weight block is unpacked once and applied to
 * every row, as llama.cpp's Q4_1 x Q8_1 dot products do: each activation row is quantized to int8
 * per block of 32 (step d = max|x| / 127), and with W = q * s + low per block (q in 0..15, unsigned:
 * vpdpbusd's unsigned x signed as it is),
 *
 *     y[r, o] = sum_b  s[o, b] * d[r, b] * dot(q[o, b], xq[r, b])  +  low[o, b] * sum(x[r, b]).
 *
 * A row's result never depends on the other rows: its quantization, integer dots (exact) and float
 * operations run in one fixed order whatever the row count, so decoding a token alone and verifying
 * it among k drafted rows give the same bits (the speculative greedy output equals plain decoding's).
 *
 * Layout (built by QuantLinear.use_native): the output columns in tiles of 16, and per tile and block
 * of 32 inputs, 4 groups of 64 bytes: byte 4i + j of group g holds output i's code of input 8g + j
 * (low nibble) and 8g + 4 + j (high), so one vpdpbusd multiplies 16 outputs by 4 inputs; then the
 * tile's 16 scales and 16 lows (bf16) per block, [tiles, blocks, 2, 16].
 */
#include "common.h"

#define ROWS_MAX 32 /* the most rows the caller routes here (a draft of 16 and its first token, or a small batch) */

/* per row and block: int8 codes, step and the sum of the unquantized block */
static void quantize_row_q8s(const float *x, int64_t blocks, int8_t *xq, float *dx, float *sx) {
    for (int64_t g = 0; g < blocks; g++) {
        const float *xb = x + g * 32;
        float amax = 0.f, sum = 0.f;
        for (int i = 0; i < 32; i++) {
            amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
            sum += xb[i];
        }
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int i = 0; i < 32; i++) xq[g * 32 + i] = (int8_t)nearbyintf(xb[i] * id);
        dx[g] = d;
        sx[g] = sum;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

static inline __m512 ld_bf16x16_q4(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One tile's 16 outputs for R rows (R constant at each call site, so the loops unroll and the
 * accumulators stay in registers).  Per row the float operations are the same for every R. */
static inline void tile_rows(int R, const uint8_t *w, const bf16 *sl, int64_t nb, int64_t k, const int8_t *xq,
                             const float *dx, const float *sx, float *out /* [R, 16] */) {
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 256;
        __m512i i0[4], i1[4];
        for (int r = 0; r < R; r++) i0[r] = i1[r] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) {
            __m512i v = _mm512_loadu_si512((const void *)(wb + g * 64));
            __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int r = 0; r < R; r++) {
                const int8_t *xr = xq + r * k + b * 32 + g * 8;
                i0[r] = _mm512_dpbusd_epi32(i0[r], lo, bcast4(xr));
                i1[r] = _mm512_dpbusd_epi32(i1[r], hi, bcast4(xr + 4));
            }
        }
        __m512 s = ld_bf16x16_q4(sl + b * 32), l = ld_bf16x16_q4(sl + b * 32 + 16);
        for (int r = 0; r < R; r++) {
            __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(i0[r], i1[r]));
            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(dx[r * nb + b])), acc[r]);
            acc[r] = _mm512_fmadd_ps(l, _mm512_set1_ps(sx[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * 16, acc[r]);
}

static void tile(const uint8_t *w, const bf16 *sl, int64_t nb, int64_t k, const int8_t *xq, const float *dx,
                 const float *sx, int64_t rows, float *out) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) tile_rows(4, w, sl, nb, k, xq + r * k, dx + r * nb, sx + r * nb, out + r * 16);
    switch (rows - r) {
    case 3: tile_rows(3, w, sl, nb, k, xq + r * k, dx + r * nb, sx + r * nb, out + r * 16); break;
    case 2: tile_rows(2, w, sl, nb, k, xq + r * k, dx + r * nb, sx + r * nb, out + r * 16); break;
    case 1: tile_rows(1, w, sl, nb, k, xq + r * k, dx + r * nb, sx + r * nb, out + r * 16); break;
    default: break;
    }
}
#else
/* portable: the same sums in the same float order per row (one lane at a time) */
static void tile(const uint8_t *w, const bf16 *sl, int64_t nb, int64_t k, const int8_t *xq, const float *dx,
                 const float *sx, int64_t rows, float *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < 16; i++) {
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t dot = 0;
                for (int g = 0; g < 4; g++)
                    for (int j = 0; j < 4; j++) {
                        uint8_t c = w[b * 256 + g * 64 + i * 4 + j];
                        dot += (c & 15) * xq[r * k + b * 32 + g * 8 + j] + (c >> 4) * xq[r * k + b * 32 + g * 8 + 4 + j];
                    }
                acc = fmaf((float)dot, bf2f(sl[b * 32 + i]) * dx[r * nb + b], acc);
                acc = fmaf(bf2f(sl[b * 32 + 16 + i]), sx[r * nb + b], acc);
            }
            out[r * 16 + i] = acc;
        }
}
#endif

/* y [rows, n] = x [rows, k] W^T; rows <= ROWS_MAX, k % 32 == 0.  Returns -1 for more rows, -2 when
 * out of memory.  Threads split the tiles of output columns. */
#define DEFINE_Q4(SUF, T, LD, ST)                                                                    \
int q4_linear_##SUF(const T *x, int64_t rows, const uint8_t *w, const bf16 *sl, int64_t n, int64_t k, \
                    T *y) {                                                                          \
    if (rows > ROWS_MAX || k % 32) return -1;                                                        \
    int64_t nb = k / 32, tiles = (n + 15) / 16;                                                      \
    float *xf = malloc((rows * k + 2 * rows * nb) * sizeof(float));                                 \
    int8_t *xq = malloc(rows * k);                                                                   \
    if (!xf || !xq) {                                                                                \
        free(xf), free(xq);                                                                          \
        return -2;                                                                                   \
    }                                                                                                \
    float *dx = xf + rows * k, *sx = dx + rows * nb;                                                 \
    for (int64_t i = 0; i < rows * k; i++) xf[i] = LD(x[i]);                                         \
    for (int64_t r = 0; r < rows; r++) quantize_row_q8s(xf + r * k, nb, xq + r * k, dx + r * nb, sx + r * nb); \
    _Pragma("omp parallel for schedule(static)")                                                     \
    for (int64_t t = 0; t < tiles; t++) {                                                            \
        float out[ROWS_MAX * 16];                                                                    \
        tile(w + t * nb * 256, sl + t * nb * 32, nb, k, xq, dx, sx, rows, out);                      \
        int64_t width = n - t * 16 < 16 ? n - t * 16 : 16;                                           \
        for (int64_t r = 0; r < rows; r++)                                                           \
            for (int64_t i = 0; i < width; i++) y[r * n + t * 16 + i] = ST(out[r * 16 + i]);         \
    }                                                                                                \
    free(xf), free(xq);                                                                              \
    return 0;                                                                                        \
}

DEFINE_Q4(f32, float, ld_f, st_f)
DEFINE_Q4(bf16, bf16, bf2f, f2bf)
