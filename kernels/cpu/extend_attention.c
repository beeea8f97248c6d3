/* bf16 extend (prefill) attention over the paged KV pool: a flash kernel on AVX512-BF16.
 *
 * Why: without AMX, bf16 attention from library GEMMs (kernels/cpu_matmul_attention.py) runs at about
 * half the bf16 dot-product peak: the q k^T GEMM has a contraction of only head_dim, its scores make
 * a round trip through memory, and the softmax is a third pass.  Here a tile of query rows walks its
 * keys once: scores stay in L1, the online softmax rescales once per block of KEYS keys, and both
 * products run on vdpbf16ps (pairs of bf16 products summed in fp32).
 *
 * Layouts (kernels/reference.py): caches [num_slots, Hkv, D]; page_table [B, stride] int32;
 * cu_q [B + 1] int32 (query rows of sequence b are cu_q[b] .. cu_q[b+1]); seq_lens [B] int32 (keys
 * including the new ones, which are the last q_len).  Query position i of sequence b sees keys
 * 0 .. seq_len - q_len + i (bottom-right causal).
 *
 * vdpbf16ps acc, a, b: acc[i] += a[2i] b[2i] + a[2i+1] b[2i+1].  So each product broadcasts a pair of
 * one operand and reads 16 pairs of the other, packed once per call (phase 1) from the pages:
 *
 *   K packed, per 16-key block:  [D/2][16 keys][2]   vector j = dims 2j, 2j+1 of 16 keys  (q k: lane = key)
 *   V packed, per key pair:      [D][2]              vector c = 16 dims of keys 2t, 2t+1  (p v: lane = dim)
 *
 * and the query pairs (q[2j], q[2j+1]) and probability pairs (p[2t], p[2t+1]) are read where they lie.
 * The rounding matches transformers' eager bf16 attention up to fp32 summation order, except that
 * scores stay fp32 (eager rounds them to bf16; this is the more accurate side).
 */
#include "common.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)

#define ROWS 6    /* query rows a tile: 6 x 4 fp32 accumulators + 4 loaded vectors fit 32 registers */
#define KEYS 256  /* keys a softmax block (best of 64 / 128 / 256) */
#define TILES 8   /* tiles that share each block of keys */
#define PAD 64    /* keys packed per run: q k reads 4 blocks of 16 at a time */
#define MAX_D 256

int extend_supported(void) { return 1; }

static inline int64_t slot_of(const int32_t *pages, int64_t page_size, int64_t t) {
    return (int64_t)pages[t / page_size] * page_size + t % page_size;
}

/* Keys [k0, k0 + PAD) of one (sequence, KV head) into kp / vp (zeros past lk). */
static void pack_run(const bf16 *kc, const bf16 *vc, const int32_t *pages, int64_t page_size,
                     int64_t nkv, int64_t hk, int64_t d, int64_t k0, int64_t lk, bf16 *kp, bf16 *vp) {
    uint32_t *kw = (uint32_t *)kp;
    for (int64_t t = k0; t < k0 + PAD; t++) {
        uint32_t *kb = kw + (t / 16) * (d / 2) * 16 + t % 16; /* block t/16, lane t%16 */
        bf16 *vb = vp + (t / 2) * 2 * d + t % 2;
        if (t < lk) {
            int64_t off = (slot_of(pages, page_size, t) * nkv + hk) * d;
            const uint32_t *ks = (const uint32_t *)(kc + off);
            const bf16 *vs = vc + off;
            for (int64_t j = 0; j < d / 2; j++) kb[j * 16] = ks[j];
            for (int64_t i = 0; i < d; i++) vb[2 * i] = vs[i];
        } else {
            for (int64_t j = 0; j < d / 2; j++) kb[j * 16] = 0;
            for (int64_t i = 0; i < d; i++) vb[2 * i] = 0;
        }
    }
}

/* 2^t for t <= 0: 2^n 2^f, |f| <= 1/2, 2^f by a degree-4 least-squares fit of relative error (max
 * 2.7e-6, far below bf16's 3.9e-3: the probabilities are rounded to bf16 for p v). */
static inline __m512 exp2_neg(__m512 t) {
    t = _mm512_max_ps(t, _mm512_set1_ps(-126.f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(0.009560510516166687f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05591703951358795f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24024981260299683f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931219696998596f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999991655349731f));
    return _mm512_scalef_ps(p, n);
}

/* s[r][col + 16c + i] = q_r . key (16 c + i) of the 4 packed blocks at kp, for c < nc. */
static inline __attribute__((always_inline)) void qk_block(const bf16 *const *qr, const bf16 *kp, int64_t d,
                                                          int64_t nc, float (*s)[KEYS], int64_t col) {
    __m512 acc[ROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < d / 2; j++) {
        __m512bh kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) kv[c] = (__m512bh)_mm512_loadu_si512(kp + c * 16 * d + j * 32);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) acc[r][c] = dp_bcast(acc[r][c], kv[c], qr[r] + 2 * j);
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            if (c < nc) _mm512_store_ps(&s[r][col + 16 * c], acc[r][c]);
}

/* o[r][:] = o[r][:] * cr[r] + sum over key pairs t < npair of p[r][2t, 2t+1] . packed pair t. */
static inline __attribute__((always_inline)) void pv_block(bf16 (*p)[KEYS], const bf16 *vp, int64_t d,
                                                          int64_t npair, float (*o)[MAX_D], const float *cr) {
    for (int64_t dc = 0; dc < d; dc += 64) {
        __m512 acc[ROWS][4];
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            __m512 c = _mm512_set1_ps(cr[r]);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) acc[r][k] = _mm512_mul_ps(_mm512_load_ps(&o[r][dc + 16 * k]), c);
        }
        for (int64_t t = 0; t < npair; t++) {
            const bf16 *vt = vp + t * 2 * d + dc * 2;
            __m512bh vv[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) vv[k] = (__m512bh)_mm512_loadu_si512(vt + 32 * k);
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) acc[r][k] = dp_bcast(acc[r][k], vv[k], &p[r][2 * t]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) _mm512_store_ps(&o[r][dc + 16 * k], acc[r][k]);
    }
}

/* Running state of ROWS folded rows of one (sequence, KV head): row r is position r / g, query head
 * hk * g + r % g; rows past nr repeat the last row (computed, never stored). */
typedef struct {
    float o[ROWS][MAX_D] __attribute__((aligned(64))); /* unnormalised sum of p v */
    float m[ROWS], l[ROWS];                             /* running max (unscaled scores), sum of p */
    float sink[ROWS];                                   /* the head's sink logit (scaled), or -inf */
    const bf16 *qr[ROWS];
    bf16 *dst[ROWS];
    int64_t lim[ROWS], nr; /* row r sees keys < lim[r] */
} Tile;

static void tile_init(Tile *t, const bf16 *q, int64_t q_stride, int64_t d, int64_t g, int64_t hk,
                      int64_t prefix, int64_t r0, int64_t nr, bf16 *out, int64_t o_stride, const float *sinks) {
    t->nr = nr;
    for (int r = 0; r < ROWS; r++) {
        int64_t rr = r0 + (r < nr ? r : nr - 1), pos = rr / g, head = hk * g + rr % g;
        t->qr[r] = q + pos * q_stride + head * d;
        t->dst[r] = out + pos * o_stride + head * d;
        t->lim[r] = prefix + pos + 1;
        t->m[r] = -INFINITY, t->l[r] = 0.f;
        t->sink[r] = sinks ? sinks[head] : -INFINITY;
        memset(t->o[r], 0, d * sizeof(float));
    }
}

/* One block of up to KEYS keys from kb0 (packed at kp / vp) into the tile's running state. */
static void tile_block(Tile *t, const bf16 *kp, const bf16 *vp, int64_t d, int64_t kb0, float a) {
    float s[ROWS][KEYS] __attribute__((aligned(64)));
    bf16 p[ROWS][KEYS] __attribute__((aligned(64)));
    float cr[ROWS];
    int64_t end = t->lim[ROWS - 1], n = end - kb0 < KEYS ? end - kb0 : KEYS, n16 = (n + 15) / 16;
    for (int64_t c0 = 0; c0 < n16; c0 += 4) qk_block(t->qr, kp + (kb0 / 16 + c0) * 16 * d, d, n16 - c0, s, c0 * 16);
    for (int r = 0; r < ROWS; r++) {
        int64_t vis = t->lim[r] - kb0;
        vis = vis < 0 ? 0 : (vis > n ? n : vis);
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < vis; j += 16) {
            __mmask16 k = vis - j >= 16 ? 0xFFFF : (__mmask16)((1u << (vis - j)) - 1);
            mx = _mm512_mask_max_ps(mx, k, mx, _mm512_load_ps(&s[r][j]));
        }
        float m = t->m[r], mnew = vis ? fmaxf(m, _mm512_reduce_max_ps(mx)) : m;
        cr[r] = vis ? exp2f((m - mnew) * a) : 1.f; /* 0 on the first block (m = -inf) */
        __m512 ma = _mm512_set1_ps(mnew * a), av = _mm512_set1_ps(a), sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < n16 * 16; j += 16) {
            int64_t left = vis - j;
            __mmask16 k = left >= 16 ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1));
            __m512 e = _mm512_maskz_mov_ps(k, exp2_neg(_mm512_fmsub_ps(_mm512_load_ps(&s[r][j]), av, ma)));
            sum = _mm512_add_ps(sum, e);
            _mm256_store_si256((__m256i *)&p[r][j], (__m256i)_mm512_cvtneps_pbh(e));
        }
        t->l[r] = t->l[r] * cr[r] + _mm512_reduce_add_ps(sum);
        t->m[r] = mnew;
    }
    pv_block(p, vp + kb0 * d, d, (n + 1) / 2, t->o, cr);
}

/* A sink joins the denominator only: with m the row's max in scaled units, out = o c / (l c + e),
 * c = exp(m - max(m, sink)), e = exp(sink - max(m, sink)); no sink (-inf) gives c = 1, e = 0. */
static void tile_store(const Tile *t, int64_t d, float scale) {
    for (int r = 0; r < t->nr; r++) {
        float ms = t->m[r] * scale, mf = fmaxf(ms, t->sink[r]), c = expf(ms - mf);
        __m512 inv = _mm512_set1_ps(c / (t->l[r] * c + expf(t->sink[r] - mf)));
        for (int64_t i = 0; i < d; i += 16)
            _mm256_storeu_si256((__m256i *)(t->dst[r] + i),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(&t->o[r][i]), inv)));
    }
}

/* TILES tiles (rows r0 .. r0 + nr) walk the keys together, block by block: a block's packed keys and
 * values (2 x KEYS x D bf16, 32 KiB at D = 64) are read from memory once and reused from L1 by every
 * tile, where one tile at a time would stream a long prefix from L3 (1 MiB L2 a core) for 6 rows. */
static void row_block(const bf16 *q, int64_t q_stride, const bf16 *kp, const bf16 *vp, int64_t d, int64_t g,
                      int64_t hk, int64_t prefix, int64_t r0, int64_t nr, float scale, bf16 *out,
                      int64_t o_stride, const float *sinks) {
    Tile tiles[TILES];
    int64_t nt = (nr + ROWS - 1) / ROWS;
    for (int64_t i = 0; i < nt; i++) {
        int64_t left = nr - i * ROWS;
        tile_init(&tiles[i], q, q_stride, d, g, hk, prefix, r0 + i * ROWS, left < ROWS ? left : ROWS, out, o_stride,
                  sinks);
    }
    const float a = scale * 1.4426950408889634f; /* exp(scale x) = 2^(a x) */
    for (int64_t kb0 = 0; kb0 < tiles[nt - 1].lim[ROWS - 1]; kb0 += KEYS)
        for (int64_t i = 0; i < nt; i++)
            if (kb0 < tiles[i].lim[ROWS - 1]) tile_block(&tiles[i], kp, vp, d, kb0, a);
    for (int64_t i = 0; i < nt; i++) tile_store(&tiles[i], d, scale);
}

/* out [total_q, nh, d] (rows nh * d apart) = attention of q rows (q_stride apart, heads d apart)
 * over each sequence's keys, read from its pages; sinks [nh] or NULL: a learned logit per query head
 * in the softmax's denominator (gpt-oss).  0 on success; -1 unsupported shape; -2 no memory. */
int extend_attention_bf16(const bf16 *q, int64_t q_stride, const bf16 *kc, const bf16 *vc,
                          const int32_t *page_table, int64_t pt_stride, const int32_t *cu_q,
                          const int32_t *seq_lens, int64_t bsz, int64_t nh, int64_t nkv, int64_t d,
                          int64_t page_size, float scale, const float *sinks, bf16 *out) {
    if (d % 64 || d > MAX_D || nh % nkv) return -1;
    int64_t g = nh / nkv;
    int64_t *base = malloc((bsz + 1) * sizeof(int64_t) * 3);
    if (!base) return -2;
    int64_t *runs = base + bsz + 1, *tiles = runs + bsz + 1; /* prefix sums of work items */
    base[0] = runs[0] = tiles[0] = 0;
    for (int64_t b = 0; b < bsz; b++) {
        int64_t lq = cu_q[b + 1] - cu_q[b], lk = lq ? seq_lens[b] : 0, kpad = (lk + PAD - 1) / PAD * PAD;
        base[b + 1] = base[b] + nkv * kpad * d;
        runs[b + 1] = runs[b] + nkv * (kpad / PAD);
        tiles[b + 1] = tiles[b] + nkv * ((lq * g + TILES * ROWS - 1) / (TILES * ROWS));
    }
    bf16 *kp = malloc(2 * base[bsz] * sizeof(bf16) + 64), *vp = kp + base[bsz];
    if (!kp) {
        free(base);
        return -2;
    }
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t it = 0; it < runs[bsz]; it++) {
            int64_t b = 0;
            while (runs[b + 1] <= it) b++;
            int64_t lk = seq_lens[b], per = (runs[b + 1] - runs[b]) / nkv, i = it - runs[b];
            int64_t hk = i / per, k0 = (i % per) * PAD, off = base[b] + hk * per * PAD * d;
            pack_run(kc, vc, page_table + b * pt_stride, page_size, nkv, hk, d, k0, lk, kp + off, vp + off);
        }
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < tiles[bsz]; it++) {
            int64_t b = 0;
            while (tiles[b + 1] <= it) b++;
            int64_t lq = cu_q[b + 1] - cu_q[b], lk = seq_lens[b], per = (tiles[b + 1] - tiles[b]) / nkv;
            int64_t i = it - tiles[b], hk = i / per, r0 = (i % per) * TILES * ROWS, nr = lq * g - r0;
            int64_t kpad = (lk + PAD - 1) / PAD * PAD, off = base[b] + hk * kpad * d;
            row_block(q + cu_q[b] * q_stride, q_stride, kp + off, vp + off, d, g, hk, lk - lq, r0,
                      nr < TILES * ROWS ? nr : TILES * ROWS, scale, out + cu_q[b] * nh * d, nh * d, sinks);
        }
    }
    free(kp);
    free(base);
    return 0;
}

#else
int extend_supported(void) { return 0; }
int extend_attention_bf16(const bf16 *q, int64_t q_stride, const bf16 *kc, const bf16 *vc,
                          const int32_t *page_table, int64_t pt_stride, const int32_t *cu_q,
                          const int32_t *seq_lens, int64_t bsz, int64_t nh, int64_t nkv, int64_t d,
                          int64_t page_size, float scale, const float *sinks, bf16 *out) {
    return -1;
}
#endif
