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
#include "common.h"

#define KEY_BLOCK 64  /* keys scored at once: the online softmax rescales once a block */
#define SPLIT_KEYS 512 /* keys per work item: lets 2 threads share one sequence's heads */
/* A sliding-window layer (window > 0) reads only each sequence's last `window` keys. */
#define FIRST_KEY(b) (window > 0 && seq_lens[b] > window ? seq_lens[b] - window : 0)
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
    if (silu_fast_##SUF(gu, out, rows, inter)) return;                                               \
    _Pragma("omp parallel for if (rows >= 32)")                                                      \
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
    _Pragma("omp parallel for if (rows >= 32)") /* prefill rows (distinct slots); decode stays serial */ \
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
 * head, run of SPLIT_KEYS keys); the runs merge by their max and sums.  window > 0: only the last \
 * `window` keys (a sliding-window layer).  sinks != NULL: a learned logit per query head joins the \
 * merge's max and denominator with no value behind it (gpt-oss; kernels/reference.py).  */        \
int decode_attention_##SUF(const T *q, int64_t q_stride, const T *kc, const T *vc, const int32_t *page_table,         \
                           int64_t pt_stride, const int32_t *seq_lens, int64_t bsz, int64_t nh,     \
                           int64_t nkv, int64_t d, int64_t page_size, float scale, int64_t window,  \
                           const float *sinks, T *out) {                                            \
    int64_t g = nh / nkv, max_split = 1;                                                             \
    if (g > MAX_GROUP || d > MAX_D) return -1;                                                       \
    for (int64_t b = 0; b < bsz; b++) {                                                              \
        int64_t ns = (seq_lens[b] - FIRST_KEY(b) + SPLIT_KEYS - 1) / SPLIT_KEYS;                     \
        if (ns > max_split) max_split = ns;                                                          \
    }                                                                                                \
    int64_t items = bsz * nkv * max_split;                                                           \
    float *part = malloc(items * g * (d + 2) * sizeof(float));                                       \
    if (!part) return -2;                                                                            \
    _Pragma("omp parallel for schedule(dynamic)")                                                    \
    for (int64_t it = 0; it < items; it++) {                                                         \
        int64_t b = it / (nkv * max_split), hk = (it / max_split) % nkv, sp = it % max_split;        \
        int64_t k0 = FIRST_KEY(b) + sp * SPLIT_KEYS, k1 = k0 + SPLIT_KEYS;                           \
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
                float sink = sinks ? sinks[hk * g + j] : -INFINITY;                                  \
                float mx = sink, l = 0.f, o[MAX_D] = {0};                                            \
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
                if (sinks) l += expf(sink - mx);                                                     \
                T *dst = out + (b * nh + hk * g + j) * d;                                            \
                for (int64_t i = 0; i < d; i++) dst[i] = ST(o[i] / l);                               \
            }                                                                                        \
    free(part);                                                                                      \
    return 0;                                                                                        \
}

/* SwiGLU with AVX-512: the portable loop did not vectorise (its exp and the bf16 conversions),
 * ~20 us a 1536-wide row, more than the row's matmuls.  Same exp (vexp's polynomial, written
 * with intrinsics) and the same rounding points.  */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
static inline __m512 vexp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
    __m512 n = _mm512_floor_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _mm512_set1_ps(0.5f)));
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                             _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187e-06f)));
    __m512 p = _mm512_set1_ps(0.0013888889f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.008333334f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.041666668f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.16666667f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}
static inline __m512 silu16(__m512 a) {
    return _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), vexp16(_mm512_sub_ps(_mm512_setzero_ps(), a))));
}
static int silu_fast_bf16(const bf16 *gu, bf16 *out, int64_t rows, int64_t inter) {
    if (inter % 16) return 0;
#pragma omp parallel for if (rows >= 32)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < inter; i += 16) {
            const bf16 *g = gu + r * 2 * inter + i;
            __m512 v = _mm512_mul_ps(rnd_bf16x16(silu16(ld_bf16x16(g))), ld_bf16x16(g + inter));
            _mm256_storeu_si256((__m256i *)(out + r * inter + i), (__m256i)_mm512_cvtneps_pbh(v));
        }
    return 1;
}
static int silu_fast_f32(const float *gu, float *out, int64_t rows, int64_t inter) {
    if (inter % 16) return 0;
#pragma omp parallel for if (rows >= 32)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < inter; i += 16) {
            const float *g = gu + r * 2 * inter + i;
            _mm512_storeu_ps(out + r * inter + i,
                             _mm512_mul_ps(silu16(_mm512_loadu_ps(g)), _mm512_loadu_ps(g + inter)));
        }
    return 1;
}
#else
static int silu_fast_bf16(const bf16 *gu, bf16 *out, int64_t rows, int64_t inter) { return 0; }
static int silu_fast_f32(const float *gu, float *out, int64_t rows, int64_t inter) { return 0; }
#endif

/* bf16 decode attention with AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed in fp32), both
 * products on the dot-product unit.  Same contract as attend_part.  Returns 0 where it does not
 * apply (the caller's loop runs).  Per block of up to KEY_BLOCK keys:
 *
 *   q k^T   per head, 16 keys at a time: each key's d/32 dot-product vectors, then one transposing
 *           add tree turns the 16 vectors into one vector of 16 scores (a full horizontal sum per
 *           key and head cost ~3x as much);
 *   softmax vectorised over those scores, probabilities rounded to bf16 for p v;
 *   p v     the block's values interleaved once as key pairs (unpack of two rows: within each
 *           128-bit lane, dims 0-3 of the pair in `lo`, dims 4-7 in `hi`), then per head one
 *           vdpbf16ps per pair and 16 dims, the pair's probabilities broadcast; the accumulator's
 *           dims come out in that lane order and are put back in place at the end.  */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* lane i = sum of the 16 lanes of v[i] */
static inline __m512 sum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

static int attend_fast_bf16(const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *pages,
                            int64_t page_size, int64_t nkv, int64_t hk, int64_t g, int64_t d, float scale,
                            int64_t k0, int64_t k1, float *m, float *l, float *acc) {
    if (d % 32 || d > 128) return 0;
    const int nv = (int)(d / 32), nf = (int)(d / 16);
    static const bf16 zeros[128];
    const bf16 *krow[KEY_BLOCK], *vrow[KEY_BLOCK + 1];
    float s[KEY_BLOCK] __attribute__((aligned(64)));
    bf16 p[MAX_GROUP][KEY_BLOCK + 2] __attribute__((aligned(64)));
    bf16 vp[KEY_BLOCK / 2 * 128 * 2] __attribute__((aligned(64))); /* [pair][d][2] */
    __m512 o[MAX_GROUP][8];
    int64_t pi = k0 / page_size, off = k0 % page_size;
    for (int64_t j = 0; j < g; j++) {
        m[j] = -INFINITY, l[j] = 0.f;
        for (int c = 0; c < nf; c++) o[j][c] = _mm512_setzero_ps();
    }
    for (int64_t b0 = k0; b0 < k1; b0 += KEY_BLOCK) {
        int64_t n = k1 - b0 < KEY_BLOCK ? k1 - b0 : KEY_BLOCK, n16 = (n + 15) / 16 * 16;
        for (int64_t t = 0; t < n; t++) {
            int64_t r = ((int64_t)pages[pi] * page_size + off) * nkv * d + hk * d;
            krow[t] = kc + r, vrow[t] = vc + r;
            if (++off == page_size) off = 0, pi++;
        }
        for (int64_t t = n; t < n16; t++) krow[t] = zeros;
        if (n % 2) vrow[n] = zeros;
        for (int64_t t = 0; t < n; t += 2) /* values as key pairs, 32 dims a vector */
            for (int c = 0; c < nv; c++) {
                __m512i a = _mm512_loadu_si512(vrow[t] + c * 32), b = _mm512_loadu_si512(vrow[t + 1] + c * 32);
                _mm512_store_si512(vp + (t / 2) * 2 * d + c * 64, _mm512_unpacklo_epi16(a, b));
                _mm512_store_si512(vp + (t / 2) * 2 * d + c * 64 + 32, _mm512_unpackhi_epi16(a, b));
            }
        for (int64_t j = 0; j < g; j++) {
            __m512bh qv[4];
            for (int c = 0; c < nv; c++) qv[c] = (__m512bh)_mm512_loadu_si512(q + j * d + c * 32);
            for (int64_t t0 = 0; t0 < n16; t0 += 16) {
                __m512 dots[16];
                for (int t = 0; t < 16; t++) {
                    __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(krow[t0 + t]));
                    for (int c = 1; c < nv; c++)
                        a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_loadu_si512(krow[t0 + t] + c * 32));
                    dots[t] = a;
                }
                _mm512_store_ps(s + t0, _mm512_mul_ps(sum16(dots), _mm512_set1_ps(scale)));
            }
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int64_t t = 0; t < n; t += 16) {
                __mmask16 k = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
                mx = _mm512_mask_max_ps(mx, k, mx, _mm512_load_ps(s + t));
            }
            float mnew = fmaxf(m[j], _mm512_reduce_max_ps(mx)), c = expf(m[j] - mnew);
            __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(mnew);
            for (int64_t t = 0; t < n16; t += 16) {
                __mmask16 k = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
                __m512 e = _mm512_maskz_mov_ps(k, vexp16(_mm512_sub_ps(_mm512_load_ps(s + t), mv)));
                sum = _mm512_add_ps(sum, e);
                _mm256_storeu_si256((__m256i *)&p[j][t], (__m256i)_mm512_cvtneps_pbh(e));
            }
            p[j][n16] = p[j][n16 + 1] = 0;
            l[j] = l[j] * c + _mm512_reduce_add_ps(sum);
            m[j] = mnew;
            __m512 cv = _mm512_set1_ps(c);
            for (int f = 0; f < nf; f++) o[j][f] = _mm512_mul_ps(o[j][f], cv);
            for (int64_t t = 0; t < n; t += 2) {
                const bf16 *pair = vp + (t / 2) * 2 * d;
                for (int f = 0; f < nf; f++)
                    o[j][f] = dp_bcast(o[j][f], (__m512bh)_mm512_load_si512(pair + f * 32), &p[j][t]);
            }
        }
    }
    /* accumulator f = 2 c + h (c: 32-dim vector, h: lo / hi) lane i holds dim 32 c + 8 (i / 4) + 4 h + i % 4 */
    for (int64_t j = 0; j < g; j++)
        for (int f = 0; f < nf; f++) {
            float lane[16];
            _mm512_storeu_ps(lane, o[j][f]);
            for (int i = 0; i < 16; i++) acc[j * d + 32 * (f / 2) + 8 * (i / 4) + 4 * (f % 2) + i % 4] = lane[i];
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

DEFINE_OPS(f32, float, ld_f, st_f, rnd_f)
DEFINE_OPS(bf16, bf16, bf2f, f2bf, rnd_bf)
