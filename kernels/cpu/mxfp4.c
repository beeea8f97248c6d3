/* MXFP4 expert linears for few rows (gpt-oss's experts at decode): for each group j of rows
 * [bounds[j], bounds[j+1]) of x, y[r, o] = sum_i x[r, i] * W_e[o, i] with e = experts[j], W kept as the
 * checkpoint's blocks (two e2m1 codes a byte, low nibble first) and one power-of-two scale per 32
 * weights (uint8 exponent, bias 127).  One call covers all the experts a step picked, so a layer costs
 * two calls whatever its top-k.  Output rows of all groups are split across threads.
 *
 * Every e2m1 value doubled is a small integer (0, 1, 2, 3, 4, 6, 8, 12): a vpshufb of the nibbles
 * decodes 32 weights into int8, and a block's scale is 2^(e - 128) (the halving undoes the doubling).
 * Two ways to multiply, chosen by the activation dtype:
 *  - mxfp4_experts_f32 (fp32 activations): the int8 weights widened to floats, fp32 products, so
 *    the result is the dense fp32 matmul's up to summation order (parity with transformers at 1e-4);
 *  - mxfp4_experts_q8 (bf16/fp16 activations): each activation row quantized to int8 per block of 32
 *    (scale max|x| / 127, llama.cpp's Q8_0), a block's 32 products one integer dot product (AVX2
 *    vpmaddubsw + vpmaddwd, or VNNI vpdpbusd where the CPU has it), scaled once.  Its error against
 *    the exact product is at most sum over blocks of (scale_x / 2) * sum |w| (the rounding of x).
 * The activations are stored with each block's even elements first, then its odd ones, so the low
 * nibbles (even weights) and high nibbles (odd weights) need no interleaving; the Q8 codes go further
 * and pair blocks (``even_at``), so one 32-byte load decodes two blocks.  Which instructions run is
 * fixed when the file is built for the machine (-march=native, as every kernel under kernels/cpu): VNNI, else
 * AVX2, else portable C reading the same layouts.  */
#include "common.h"

#define MAX_ROWS 8

/* 2^(e - 128) built from its bits (a libm ldexpf call per block cost more than the block's products) */
static inline float half_scale(uint8_t e) {
    if (e < 2) return ldexpf(1.f, (int)e - 128);
    union { uint32_t u; float f; } v = {(uint32_t)(e - 1) << 23};
    return v.f;
}

/* Where block g's even and odd Q8 codes sit in its row (nb blocks): blocks 2p and 2p + 1 as one
 * 64-byte pair, [evens 2p | evens 2p+1 | odds 2p | odds 2p+1]; an odd last block as [evens | odds] */
static inline int64_t even_at(int64_t g, int64_t nb) {
    return (g | 1) < nb ? (g & ~(int64_t)1) * 32 + (g & 1) * 16 : g * 32;
}
static inline int64_t odd_at(int64_t g, int64_t nb) { return even_at(g, nb) + ((g | 1) < nb ? 32 : 16); }

/* one output of one group: rows x[0..rows) (row stride `in`), weight row `blk`/`sc` -> y (stride out) */
typedef void (*row_fn)(const void *x, const float *dx, int64_t rows, int64_t in, const uint8_t *blk,
                       const uint8_t *sc, float *y, int64_t out);

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* a block's nibbles: the 16 low ones (even weights) in the low lane, the 16 high ones in the high lane */
static inline __m256i nibbles(const uint8_t *b16) {
    __m128i b = _mm_loadu_si128((const __m128i *)b16);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

/* sum of |w| . (x with w's sign) as 8 int32 lanes: unsigned x signed products */
static inline __m256i dot_u8s8(__m256i wabs, __m256i xs) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) /* (AVX-VNNI alone names it _mm256_dpbusd_avx_epi32) */
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, xs);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xs), _mm256_set1_epi16(1));
#endif
}

/* the same over two halves: |w1| . x1 + |w2| . x2 (pairs summed in int16: at most 4 * 12 * 127) */
static inline __m256i dot2_u8s8(__m256i a1, __m256i x1, __m256i a2, __m256i x2) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) /* (AVX-VNNI alone names it _mm256_dpbusd_avx_epi32) */
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), a1, x1), a2, x2);
#else
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(a1, x1), _mm256_maddubs_epi16(a2, x2));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* block g of R rows into acc (R is a constant once inlined, so the accumulators stay in registers) */
static inline __attribute__((always_inline)) void q8_block(const int8_t *xq, const float *dx, const int R,
                                                           int64_t in, const uint8_t *blk, const uint8_t *sc,
                                                           int64_t g, __m256 *acc) {
    const __m256i mag = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
    int64_t nb = in / 32;
    __m256i n = nibbles(blk + g * 16);
    __m256i wabs = _mm256_shuffle_epi8(mag, n);
    __m256i sign = _mm256_slli_epi16(n, 4); /* bit 3 (the e2m1 sign) to each byte's top bit */
    float s = half_scale(sc[g]);
    for (int r = 0; r < R; r++) {
        __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + r * in + g * 32)), sign);
        __m256 p = _mm256_cvtepi32_ps(dot_u8s8(wabs, xs));
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(s * dx[r * nb + g]), acc[r]);
    }
}

/* blocks g and g + 1 of R rows into acc: one 32-byte load holds both blocks' nibbles, the low ones
 * (even weights) meet the rows' even codes of both blocks and the high ones the odd codes (the pair's
 * layout, ``even_at``), so lanes 0-3 sum block g and lanes 4-7 block g + 1: one scale vector a pair */
static inline __attribute__((always_inline)) void q8_pair(const int8_t *xq, const float *dx, const int R,
                                                          int64_t in, const uint8_t *blk, const uint8_t *sc,
                                                          int64_t g, __m256 *acc) {
    const __m256i mag = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
    const __m256i low = _mm256_set1_epi8(0x0F), halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    int64_t nb = in / 32;
    __m256i b = _mm256_loadu_si256((const __m256i *)(blk + g * 16));
    __m256i lo = _mm256_and_si256(b, low), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    __m256i alo = _mm256_shuffle_epi8(mag, lo), ahi = _mm256_shuffle_epi8(mag, hi);
    __m256i slo = _mm256_slli_epi16(lo, 4), shi = _mm256_slli_epi16(hi, 4); /* e2m1 sign to bit 7 */
    __m128 ws = _mm_setr_ps(half_scale(sc[g]), half_scale(sc[g + 1]), 0.f, 0.f);
    for (int r = 0; r < R; r++) {
        const int8_t *xr = xq + r * in + g * 32;
        __m256i e = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xr), slo);
        __m256i o = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xr + 32)), shi);
        __m128 d = _mm_mul_ps(ws, _mm_castpd_ps(_mm_load_sd((const double *)(dx + r * nb + g))));
        __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), halves);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot2_u8s8(alo, e, ahi, o)), s, acc[r]);
    }
}

/* pairs of blocks in two chains, so that a row's sums do not wait on each other's latency; an odd
 * last block alone */
static inline __attribute__((always_inline)) void q8_rows(const int8_t *xq, const float *dx, const int R,
                                                          int64_t in, const uint8_t *blk, const uint8_t *sc,
                                                          float *y, int64_t out) {
    int64_t nb = in / 32, g = 0;
    __m256 a0[MAX_ROWS], a1[MAX_ROWS];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (; g + 3 < nb; g += 4) {
        q8_pair(xq, dx, R, in, blk, sc, g, a0);
        q8_pair(xq, dx, R, in, blk, sc, g + 2, a1);
    }
    if (g + 1 < nb) q8_pair(xq, dx, R, in, blk, sc, g, a0), g += 2;
    if (g < nb) q8_block(xq, dx, R, in, blk, sc, g, a1);
    for (int r = 0; r < R; r++) y[r * out] = hsum8(_mm256_add_ps(a0[r], a1[r]));
}

static void row_q8(const void *xv, const float *dx, int64_t rows, int64_t in, const uint8_t *blk,
                   const uint8_t *sc, float *y, int64_t out) {
    switch (rows) { /* one specialisation a row count */
#define Q8_CASE(R) case R: q8_rows(xv, dx, R, in, blk, sc, y, out); break;
        Q8_CASE(1) Q8_CASE(2) Q8_CASE(3) Q8_CASE(4) Q8_CASE(5) Q8_CASE(6) Q8_CASE(7) Q8_CASE(8)
#undef Q8_CASE
    }
}

static inline __attribute__((always_inline)) void f32_rows(const float *x, const int R, int64_t in,
                                                           const uint8_t *blk, const uint8_t *sc, float *y,
                                                           int64_t out) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < in / 32; g++) {
        __m256i w = _mm256_shuffle_epi8(lut, nibbles(blk + g * 16)); /* even weights | odd weights */
        __m128i w0 = _mm256_castsi256_si128(w), w1 = _mm256_extracti128_si256(w, 1);
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w0));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w0, 8)));
        __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w1));
        __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w1, 8)));
        __m256 s = _mm256_set1_ps(half_scale(sc[g]));
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * in + g * 32; /* deinterleaved: evens then odds */
            __m256 t = _mm256_mul_ps(f0, _mm256_loadu_ps(xr));
            t = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xr + 8), t);
            t = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xr + 16), t);
            t = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xr + 24), t);
            acc[r] = _mm256_fmadd_ps(t, s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * out] = hsum8(acc[r]);
}

static void row_f32(const void *xv, const float *dx, int64_t rows, int64_t in, const uint8_t *blk,
                    const uint8_t *sc, float *y, int64_t out) {
    (void)dx;
    switch (rows) {
#define F32_CASE(R) case R: f32_rows(xv, R, in, blk, sc, y, out); break;
        F32_CASE(1) F32_CASE(2) F32_CASE(3) F32_CASE(4) F32_CASE(5) F32_CASE(6) F32_CASE(7) F32_CASE(8)
#undef F32_CASE
    }
}
#else
static const int8_t FP4X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void row_q8(const void *xv, const float *dx, int64_t rows, int64_t in, const uint8_t *blk,
                   const uint8_t *sc, float *y, int64_t out) {
    const int8_t *xq = xv;
    int64_t nb = in / 32;
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.f;
        for (int64_t g = 0; g < nb; g++) {
            int32_t d = 0;
            const int8_t *ev = xq + r * in + even_at(g, nb), *od = xq + r * in + odd_at(g, nb);
            for (int64_t k = 0; k < 16; k++) {
                uint8_t b = blk[g * 16 + k];
                d += FP4X2[b & 15] * ev[k] + FP4X2[b >> 4] * od[k];
            }
            acc += half_scale(sc[g]) * dx[r * nb + g] * (float)d;
        }
        y[r * out] = acc;
    }
}

static void row_f32(const void *xv, const float *dx, int64_t rows, int64_t in, const uint8_t *blk,
                    const uint8_t *sc, float *y, int64_t out) {
    const float *x = xv;
    (void)dx;
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.f;
        for (int64_t g = 0; g < in / 32; g++) {
            float t = 0.f;
            for (int64_t k = 0; k < 16; k++) {
                uint8_t b = blk[g * 16 + k];
                t += FP4X2[b & 15] * x[r * in + g * 32 + k] + FP4X2[b >> 4] * x[r * in + g * 32 + 16 + k];
            }
            acc += half_scale(sc[g]) * t;
        }
        y[r * out] = acc;
    }
}
#endif

/* each block of 32 with its even elements first, then its odd ones (the nibbles' order) */
static void deinterleave(const float *x, int64_t n, float *xd) {
    for (int64_t b = 0; b < n; b += 32)
        for (int64_t k = 0; k < 16; k++) xd[b + k] = x[b + 2 * k], xd[b + 16 + k] = x[b + 2 * k + 1];
}

/* Q8_0 codes and scales of `rows` rows of `in` floats, per block of 32, in the pair layout */
static void quantize_q8(const float *x, int64_t rows, int64_t in, int8_t *xq, float *dx) {
    int64_t nb = in / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * in + b * 32;
            float amax = 0.f;
            for (int64_t i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
            float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
            int8_t *ev = xq + r * in + even_at(b, nb), *od = xq + r * in + odd_at(b, nb);
            for (int64_t k = 0; k < 16; k++) {
                ev[k] = (int8_t)nearbyintf(xb[2 * k] * id);
                od[k] = (int8_t)nearbyintf(xb[2 * k + 1] * id);
            }
            dx[r * nb + b] = d;
        }
}

static int run_groups(row_fn row, const void *xp, int64_t elem, const float *dx, int64_t in,
                      const int64_t *bounds, const int64_t *experts, int64_t groups, const uint8_t *blocks,
                      const uint8_t *scales, int64_t out, float *y) {
    int64_t nb = in / 32;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < groups * out; j++) {
        int64_t g = j / out, o = j % out, e = experts[g], r0 = bounds[g];
        const uint8_t *blk = blocks + (e * out + o) * (in / 2), *sc = scales + (e * out + o) * nb;
        row((const char *)xp + r0 * in * elem, dx ? dx + r0 * nb : NULL, bounds[g + 1] - r0, in, blk, sc,
            y + r0 * out + o, out);
    }
    return 0;
}

static int check(int64_t in, const int64_t *bounds, int64_t groups) {
    if (in % 32 || groups < 1) return -1;
    for (int64_t g = 0; g < groups; g++)
        if (bounds[g + 1] - bounds[g] < 1 || bounds[g + 1] - bounds[g] > MAX_ROWS) return -1;
    return 0;
}

/* x [rows, in] fp32, group j = rows [bounds[j], bounds[j+1]) (1..8 of them) times expert experts[j]
 * of blocks [E, out, in/2] and scales [E, out, in/32] -> y [rows, out] fp32.
 * 0 ok, -1 bad shape, -2 out of memory.  */
int mxfp4_experts_f32(const float *x, int64_t in, const int64_t *bounds, const int64_t *experts,
                      int64_t groups, const uint8_t *blocks, const uint8_t *scales, int64_t out, float *y) {
    if (check(in, bounds, groups)) return -1;
    int64_t n = bounds[groups] * in;
    float *xd = malloc(n * sizeof(float));
    if (!xd) return -2;
    deinterleave(x, n, xd);
    run_groups(row_f32, xd, sizeof(float), NULL, in, bounds, experts, groups, blocks, scales, out, y);
    free(xd);
    return 0;
}

int mxfp4_experts_q8(const float *x, int64_t in, const int64_t *bounds, const int64_t *experts,
                     int64_t groups, const uint8_t *blocks, const uint8_t *scales, int64_t out, float *y) {
    if (check(in, bounds, groups)) return -1;
    int64_t n = bounds[groups] * in;
    int8_t *xq = malloc(n);
    float *dx = malloc(n / 32 * sizeof(float));
    if (!xq || !dx) {
        free(xq), free(dx);
        return -2;
    }
    quantize_q8(x, bounds[groups], in, xq, dx);
    run_groups(row_q8, xq, 1, dx, in, bounds, experts, groups, blocks, scales, out, y);
    free(xq), free(dx);
    return 0;
}
