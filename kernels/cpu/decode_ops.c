/* Fused CPU kernels for one decode step (one new token per sequence), fp32 and bf16.
 *
 * A CPU decode step of a small model is bound by dispatch, not arithmetic: ~40 small torch ops a
 * layer around its four matmuls.  These kernels do the elementwise work of a layer in four calls
 * and read the paged KV pool in place (no gather copy of every key), so a layer costs its matmuls
 * plus a few microseconds.  Loaded by ``kernels/native_cpu.py`` (compiled once per machine, called
 * through ctypes); ``kernels/reference.py`` is the oracle they are tested against.
 *
 * Rounding follows torch's eager ops exactly where torch rounds: every op whose torch counterpart
 * returns a bf16 tensor rounds to bf16 (round-to-nearest-even) at the same point, so the only
 * differences left are fp32 summation order.
 *
 * Layouts (see kernels/reference.py): caches [num_slots, Hkv, D]; page_table [B, stride] int32;
 * seq_lens [B] int32 (keys including the new token); slot_mapping [B] int64.
 */
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

#define KEY_BLOCK 64  /* keys scored at once: the online softmax rescales once a block */
#define SPLIT_KEYS 512 /* keys per work item: lets 2 threads share one sequence's heads */
#define MAX_GROUP 16
#define MAX_D 256

/* Instantiated for T = float (fp32 models) and T = bf16; LD loads one element as float, ST stores,
 * RND rounds a float as the dtype's tensors would. */
#define DEFINE_OPS(SUF, T, LD, ST, RND)                                                              \
                                                                                                     \
/* out = w * norm(x) per row; with res != NULL first x += res (the residual add, rounded).  */       \
void rms_norm_##SUF(T *x, const T *res, const T *w, T *out, int64_t rows, int64_t dim, float eps) { \
    _Pragma("omp parallel for if (rows > 1)")                                                        \
    for (int64_t r = 0; r < rows; r++) {                                                             \
        T *xr = x + r * dim;                                                                         \
        T *o = out + r * dim;                                                                        \
        float ss = 0.f;                                                                              \
        if (res) {                                                                                   \
            const T *rr = res + r * dim;                                                             \
            for (int64_t i = 0; i < dim; i++) xr[i] = ST(LD(xr[i]) + LD(rr[i]));                      \
        }                                                                                            \
        _Pragma("omp simd reduction(+ : ss)")                                                        \
        for (int64_t i = 0; i < dim; i++) ss += LD(xr[i]) * LD(xr[i]);                               \
        float inv = 1.f / sqrtf(ss / (float)dim + eps);                                              \
        for (int64_t i = 0; i < dim; i++) o[i] = ST(LD(w[i]) * RND(LD(xr[i]) * inv));                 \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* out = silu(gate) * up for gate_up rows [gate | up] of width 2 * inter.  */                        \
void silu_mul_##SUF(const T *gu, T *out, int64_t rows, int64_t inter) {                              \
    for (int64_t r = 0; r < rows; r++) {                                                             \
        const T *g = gu + r * 2 * inter, *u = g + inter;                                             \
        T *o = out + r * inter;                                                                      \
        _Pragma("omp simd")                                                                          \
        for (int64_t i = 0; i < inter; i++) {                                                        \
            float a = LD(g[i]);                                                                      \
            o[i] = ST(RND(a / (1.f + vexp(-a))) * LD(u[i]));                                         \
        }                                                                                            \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* One head in place: optional per-head RMSNorm (weight qn), then the non-interleaved rotation.  */  \
static void head_norm_rope_##SUF(T *x, const T *qn, float eps, const float *cs, const float *sn,    \
                                 int64_t d) {                                                        \
    float buf[MAX_D];                                                                                \
    int64_t h = d / 2;                                                                               \
    if (qn) {                                                                                        \
        float ss = 0.f;                                                                              \
        for (int64_t i = 0; i < d; i++) ss += LD(x[i]) * LD(x[i]);                                   \
        float inv = 1.f / sqrtf(ss / (float)d + eps);                                                \
        for (int64_t i = 0; i < d; i++) buf[i] = RND(LD(qn[i]) * RND(LD(x[i]) * inv));               \
    } else {                                                                                         \
        for (int64_t i = 0; i < d; i++) buf[i] = LD(x[i]);                                           \
    }                                                                                                \
    for (int64_t i = 0; i < h; i++) {                                                                \
        float x1 = buf[i], x2 = buf[i + h];                                                          \
        x[i] = ST(x1 * cs[i] - x2 * sn[i]);                                                          \
        x[i + h] = ST(x2 * cs[i] + x1 * sn[i]);                                                      \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* qkv rows [q heads | k heads | v heads]: norm + rotate q and k in place, write k, v to the pool. */\
void rope_store_##SUF(T *qkv, int64_t rows, int64_t nh, int64_t nkv, int64_t d, const float *cos_t, \
                      const float *sin_t, const T *qn, const T *kn, float eps, T *kc, T *vc,        \
                      const int64_t *slots) {                                                        \
    int64_t width = (nh + 2 * nkv) * d;                                                              \
    for (int64_t r = 0; r < rows; r++) {                                                             \
        T *row = qkv + r * width;                                                                    \
        const float *cs = cos_t + r * (d / 2), *sn = sin_t + r * (d / 2);                            \
        for (int64_t hh = 0; hh < nh; hh++) head_norm_rope_##SUF(row + hh * d, qn, eps, cs, sn, d);  \
        for (int64_t hh = 0; hh < nkv; hh++)                                                         \
            head_norm_rope_##SUF(row + (nh + hh) * d, kn, eps, cs, sn, d);                           \
        memcpy(kc + slots[r] * nkv * d, row + nh * d, nkv * d * sizeof(T));                          \
        memcpy(vc + slots[r] * nkv * d, row + (nh + nkv) * d, nkv * d * sizeof(T));                  \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* Partial attention of `g` query heads (one KV group) over keys [k0, k1) of one sequence:          \
 * m = running max, l = sum of exp, acc = unnormalised sum of p * v (all fp32).  */                 \
static inline __attribute__((always_inline)) void attend_part_##SUF(const T *q, const T *kc, const T *vc, const int32_t *pages,           \
                              int64_t page_size, int64_t nkv, int64_t hk, int64_t g, int64_t d,     \
                              float scale, int64_t k0, int64_t k1, float *m, float *l, float *acc) {\
    float qf[MAX_GROUP * MAX_D], s[MAX_GROUP * KEY_BLOCK];                                           \
    for (int64_t j = 0; j < g * d; j++) qf[j] = LD(q[j]) * scale;                                    \
    for (int64_t j = 0; j < g; j++) m[j] = -INFINITY, l[j] = 0.f;                                    \
    memset(acc, 0, g * d * sizeof(float));                                                           \
    int64_t row[KEY_BLOCK], pi = k0 / page_size, off = k0 % page_size;                              \
    for (int64_t b0 = k0; b0 < k1; b0 += KEY_BLOCK) {                                                \
        int64_t n = k1 - b0 < KEY_BLOCK ? k1 - b0 : KEY_BLOCK;                                       \
        for (int64_t t = 0; t < n; t++) { /* element offset of each key's head, no division */       \
            row[t] = ((int64_t)pages[pi] * page_size + off) * nkv * d + hk * d;                       \
            if (++off == page_size) off = 0, pi++;                                                   \
        }                                                                                            \
        for (int64_t t = 0; t < n; t++) {                                                            \
            const T *k = kc + row[t];                                                                \
            for (int64_t j = 0; j < g; j++) {                                                        \
                const float *qj = qf + j * d;                                                        \
                float dot = 0.f;                                                                     \
                _Pragma("omp simd reduction(+ : dot)")                                               \
                for (int64_t i = 0; i < d; i++) dot = fmaf(qj[i], LD(k[i]), dot);                             \
                s[j * KEY_BLOCK + t] = dot;                                                          \
            }                                                                                        \
        }                                                                                            \
        for (int64_t j = 0; j < g; j++) {                                                            \
            float mx = m[j];                                                                         \
            for (int64_t t = 0; t < n; t++) mx = fmaxf(mx, s[j * KEY_BLOCK + t]);                    \
            float c = expf(m[j] - mx);                                                               \
            l[j] *= c;                                                                               \
            for (int64_t i = 0; i < d; i++) acc[j * d + i] *= c;                                     \
            float lj = 0.f, *sj = s + j * KEY_BLOCK;                                                 \
            _Pragma("omp simd reduction(+ : lj)")                                                    \
            for (int64_t t = 0; t < n; t++) {                                                        \
                float p = vexp(sj[t] - mx);                                                          \
                sj[t] = p;                                                                           \
                lj += p;                                                                             \
            }                                                                                        \
            l[j] += lj;                                                                              \
            m[j] = mx;                                                                               \
        }                                                                                            \
        for (int64_t t = 0; t < n; t++) {                                                            \
            const T *v = vc + row[t];                                                                \
            for (int64_t j = 0; j < g; j++) {                                                        \
                float p = s[j * KEY_BLOCK + t];                                                      \
                float *a = acc + j * d;                                                              \
                _Pragma("omp simd")                                                                  \
                for (int64_t i = 0; i < d; i++) a[i] = fmaf(p, LD(v[i]), a[i]);                                \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* out[b, h, :] = softmax(q k^T * scale) v over sequence b's keys, read from its pages in place.    \
 * q rows are q_stride elements apart (a view into the qkv rows).  Work items are (sequence, KV     \
 * head, run of SPLIT_KEYS keys); the runs merge by their max and sums.  */                        \
int decode_attention_##SUF(const T *q, int64_t q_stride, const T *kc, const T *vc, const int32_t *page_table,         \
                           int64_t pt_stride, const int32_t *seq_lens, int64_t bsz, int64_t nh,     \
                           int64_t nkv, int64_t d, int64_t page_size, float scale, T *out) {        \
    int64_t g = nh / nkv, max_split = 1;                                                             \
    if (g > MAX_GROUP || d > MAX_D) return -1;                                                       \
    for (int64_t b = 0; b < bsz; b++) {                                                              \
        int64_t ns = (seq_lens[b] + SPLIT_KEYS - 1) / SPLIT_KEYS;                                    \
        if (ns > max_split) max_split = ns;                                                          \
    }                                                                                                \
    int64_t items = bsz * nkv * max_split;                                                           \
    float *part = malloc(items * g * (d + 2) * sizeof(float));                                       \
    if (!part) return -2;                                                                            \
    _Pragma("omp parallel for schedule(dynamic)")                                                    \
    for (int64_t it = 0; it < items; it++) {                                                         \
        int64_t b = it / (nkv * max_split), hk = (it / max_split) % nkv, sp = it % max_split;        \
        int64_t k0 = sp * SPLIT_KEYS, k1 = k0 + SPLIT_KEYS;                                          \
        if (k1 > seq_lens[b]) k1 = seq_lens[b];                                                      \
        float *p = part + it * g * (d + 2);                                                          \
        if (k0 >= k1) {                                                                              \
            for (int64_t j = 0; j < g; j++) p[j] = -INFINITY, p[g + j] = 0.f;                        \
            memset(p + 2 * g, 0, g * d * sizeof(float));                                             \
            continue;                                                                                \
        }                                                                                            \
        const T *qb = q + b * q_stride + hk * g * d;                                                 \
        const int32_t *pages = page_table + b * pt_stride;                                           \
        /* constant head sizes let the compiler unroll the 64/128-wide dot products */               \
        if (attend_fast_##SUF(qb, kc, vc, pages, page_size, nkv, hk, g, d, scale, k0, k1, p, p + g,  \
                              p + 2 * g))                                                            \
            ;                                                                                        \
        else if (d == 64)                                                                            \
            attend_part_##SUF(qb, kc, vc, pages, page_size, nkv, hk, g, 64, scale, k0, k1, p, p + g, \
                              p + 2 * g);                                                            \
        else if (d == 128)                                                                           \
            attend_part_##SUF(qb, kc, vc, pages, page_size, nkv, hk, g, 128, scale, k0, k1, p, p + g,\
                              p + 2 * g);                                                            \
        else                                                                                         \
            attend_part_##SUF(qb, kc, vc, pages, page_size, nkv, hk, g, d, scale, k0, k1, p, p + g,  \
                              p + 2 * g);                                                            \
    }                                                                                                \
    for (int64_t b = 0; b < bsz; b++)                                                                \
        for (int64_t hk = 0; hk < nkv; hk++)                                                         \
            for (int64_t j = 0; j < g; j++) {                                                        \
                float mx = -INFINITY, l = 0.f, o[MAX_D] = {0};                                       \
                for (int64_t sp = 0; sp < max_split; sp++) {                                         \
                    float *p = part + ((b * nkv + hk) * max_split + sp) * g * (d + 2);               \
                    mx = fmaxf(mx, p[j]);                                                            \
                }                                                                                    \
                for (int64_t sp = 0; sp < max_split; sp++) {                                         \
                    float *p = part + ((b * nkv + hk) * max_split + sp) * g * (d + 2);               \
                    if (p[g + j] == 0.f) continue;                                                   \
                    float c = expf(p[j] - mx);                                                       \
                    l += p[g + j] * c;                                                               \
                    for (int64_t i = 0; i < d; i++) o[i] += p[2 * g + j * d + i] * c;                \
                }                                                                                    \
                T *dst = out + (b * nh + hk * g + j) * d;                                            \
                for (int64_t i = 0; i < d; i++) dst[i] = ST(o[i] / l);                               \
            }                                                                                        \
    free(part);                                                                                      \
    return 0;                                                                                        \
}

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


/* bf16 decode attention with AVX512-BF16 (vdpbf16ps: 32 bf16 products a lane pair, fp32 sums): the
 * q k^T dot products read the keys as they are stored, without converting them; p v stays fp32.
 * Same contract as attend_part.  Returns 0 where it does not apply (the caller's loop runs).  */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
static int attend_fast_bf16(const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *pages,
                            int64_t page_size, int64_t nkv, int64_t hk, int64_t g, int64_t d, float scale,
                            int64_t k0, int64_t k1, float *m, float *l, float *acc) {
    if (d % 32 || d > 128) return 0;
    int64_t nv = d / 32, nf = d / 16;
    __m512bh qv[MAX_GROUP][4];
    float s[MAX_GROUP * KEY_BLOCK];
    int64_t row[KEY_BLOCK], pi = k0 / page_size, off = k0 % page_size;
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++) qv[j][c] = (__m512bh)_mm512_loadu_si512(q + j * d + c * 32);
    for (int64_t j = 0; j < g; j++) m[j] = -INFINITY, l[j] = 0.f;
    memset(acc, 0, g * d * sizeof(float));
    for (int64_t b0 = k0; b0 < k1; b0 += KEY_BLOCK) {
        int64_t n = k1 - b0 < KEY_BLOCK ? k1 - b0 : KEY_BLOCK;
        for (int64_t t = 0; t < n; t++) {
            row[t] = ((int64_t)pages[pi] * page_size + off) * nkv * d + hk * d;
            if (++off == page_size) off = 0, pi++;
        }
        for (int64_t t = 0; t < n; t++) {
            const bf16 *k = kc + row[t];
            __m512bh kv[4];
            for (int64_t c = 0; c < nv; c++) kv[c] = (__m512bh)_mm512_loadu_si512(k + c * 32);
            for (int64_t j = 0; j < g; j++) {
                __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[j][0], kv[0]);
                for (int64_t c = 1; c < nv; c++) a = _mm512_dpbf16_ps(a, qv[j][c], kv[c]);
                s[j * KEY_BLOCK + t] = _mm512_reduce_add_ps(a) * scale;
            }
        }
        for (int64_t j = 0; j < g; j++) {
            float mx = m[j], lj = 0.f, *sj = s + j * KEY_BLOCK;
            for (int64_t t = 0; t < n; t++) mx = fmaxf(mx, sj[t]);
            float c = expf(m[j] - mx);
            for (int64_t i = 0; i < d; i++) acc[j * d + i] *= c;
#pragma omp simd reduction(+ : lj)
            for (int64_t t = 0; t < n; t++) {
                float p = vexp(sj[t] - mx);
                sj[t] = p;
                lj += p;
            }
            l[j] = l[j] * c + lj;
            m[j] = mx;
        }
        for (int64_t t = 0; t < n; t++) {
            const bf16 *v = vc + row[t];
            __m512 vf[8];
            for (int64_t c = 0; c < nf; c++)
                vf[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + c * 16))), 16));
            for (int64_t j = 0; j < g; j++) {
                __m512 p = _mm512_set1_ps(s[j * KEY_BLOCK + t]);
                float *a = acc + j * d;
                for (int64_t c = 0; c < nf; c++)
                    _mm512_storeu_ps(a + c * 16, _mm512_fmadd_ps(p, vf[c], _mm512_loadu_ps(a + c * 16)));
            }
        }
    }
    return 1;
}
#else
static int attend_fast_bf16(const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *pages,
                            int64_t page_size, int64_t nkv, int64_t hk, int64_t g, int64_t d, float scale,
                            int64_t k0, int64_t k1, float *m, float *l, float *acc) {
    return 0;
}
#endif
static int attend_fast_f32(const float *q, const float *kc, const float *vc, const int32_t *pages,
                           int64_t page_size, int64_t nkv, int64_t hk, int64_t g, int64_t d, float scale,
                           int64_t k0, int64_t k1, float *m, float *l, float *acc) {
    return 0; /* fp32 keys: the portable loop already multiplies them as they are stored */
}

static inline float ld_f(float x) { return x; }
static inline float st_f(float x) { return x; }

DEFINE_OPS(f32, float, ld_f, st_f, rnd_f)
DEFINE_OPS(bf16, bf16, bf2f, f2bf, rnd_bf)
DEFINE_Q8(f32, float, ld_f, st_f)
DEFINE_Q8(bf16, bf16, bf2f, f2bf)
