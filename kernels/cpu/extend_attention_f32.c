/* fp32 extend (prefill) attention over the paged KV pool: a flash kernel, causal over the cached
 * prefix, with sliding windows and sinks.
 *
 * Why: torch's CPU attention for an extend (new rows over a long cached prefix) needs two calls and a
 * log-sum-exp merge, or a mask that makes every query score every key (kernels/reference.py), and
 * its small per-block GEMMs run well below the fp32 FMA rate.  Here a tile of query rows walks its
 * keys once: scores stay in L1, the online softmax rescales once per block of KEYS keys, and both
 * products are register-blocked FMAs (ROWS rows x NC vectors of accumulators).
 *
 * Layouts (kernels/reference.py): caches [num_slots, Hkv, D]; page_table [B, stride] int32;
 * cu_q [B + 1] int32; seq_lens [B] int32 (keys including the new ones, which are the last q_len).
 * Query position i of sequence b sees keys lo(i) .. seq_len - q_len + i (bottom-right causal), where
 * lo(i) = 0, or with a window W the key after (seq_len - q_len + i - W).  Keys before the first
 * query's lo are never read (a window layer's ring reuses their pages): they are packed as zeros.
 *
 * Packed per call (phase 1) from the pages, per (sequence, KV head):
 *   K, per VW-key block:  [D][VW keys]   vector j = dim j of VW keys   (q k: lane = key)
 *   V, per key:           [D]            a key's row as in the pool    (p v: lane = dim)
 * q and p are broadcast one scalar at a time.
 *
 * Vectors are GCC/clang vector extensions of VW floats, so one source compiles to AVX-512 (VW 16,
 * 6 rows), AVX2 (VW 8, 3 rows) or plain 4-wide code (SSE, NEON or scalar); the FMAs are explicit
 * where the ISA has them (the build turns implicit contraction off).
 */
#include "common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
#define ROWS 6 /* 6 x 4 accumulators + 4 loaded vectors fit 32 registers */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VW 8
#define ROWS 3 /* 3 x 4 accumulators + 4 loaded vectors fit 16 registers */
#else
#define VW 4
#define ROWS 2
#endif
#define NC 4      /* vectors of keys (q k) or of dims (p v) a step */
#define KEYS 128  /* keys a softmax block */
#define TILES 8   /* tiles that share each block of keys */
#define PAD 64    /* keys packed per run, a multiple of NC * VW in every build */
#define MAX_D 256 /* and D % 64 == 0, so a p v step of NC * VW dims divides it */

typedef float vf __attribute__((vector_size(VW * 4), aligned(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4))); /* an unaligned load */
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf fma_v(vf a, vf b, vf c) { /* a * b + c, one rounding where the ISA fuses */
#if VW == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif VW == 8
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline vf splat(float x) { return (vf){0} + x; }
static inline vi splat_i(int32_t x) { return (vi){0} + x; }
static inline vf ld(const float *p) { return *(const vfu *)p; }
static inline void st(float *p, vf x) { *(vfu *)p = x; }
static inline vf select_v(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

static inline vi iota(void) {
    vi r;
    for (int i = 0; i < VW; i++) r[i] = i;
    return r;
}

static inline float hmax(vf x) {
    float m = x[0];
    for (int i = 1; i < VW; i++) m = fmaxf(m, x[i]);
    return m;
}

static inline float hsum(vf x) {
    float s = 0.f;
    for (int i = 0; i < VW; i++) s += x[i];
    return s;
}

/* 2^t for t <= 0: 2^n 2^f, |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (truncation below
 * 1e-8, under fp32's own rounding). */
static inline vf exp2_neg(vf t) {
    t = select_v(t < splat(-126.f), splat(-126.f), t);
    vf n = (t + splat(12582912.f)) - splat(12582912.f); /* round to nearest (|t| < 2^22) */
    vf f = t - n;
    vf p = splat(1.525273380405984e-5f);
    p = fma_v(p, f, splat(1.5403530393381608e-4f));
    p = fma_v(p, f, splat(1.3333558146428443e-3f));
    p = fma_v(p, f, splat(9.618129107628477e-3f));
    p = fma_v(p, f, splat(5.550410866482158e-2f));
    p = fma_v(p, f, splat(2.402265069591007e-1f));
    p = fma_v(p, f, splat(6.931471805599453e-1f));
    p = fma_v(p, f, splat(1.f));
    vi e = (__builtin_convertvector(n, vi) + splat_i(127)) << 23;
    return p * (vf)e;
}

static inline int64_t slot_of(const int32_t *pages, int64_t page_size, int64_t t) {
    return (int64_t)pages[t / page_size] * page_size + t % page_size;
}

/* Keys [k0, k0 + PAD) of one (sequence, KV head) into kp / vp (both indexed from key k0): zeros
 * before lo (pages never read) and from lk on. */
static void pack_run(const float *kc, const float *vc, const int32_t *pages, int64_t page_size, int64_t nkv,
                     int64_t hk, int64_t d, int64_t k0, int64_t lo, int64_t lk, float *kp, float *vp) {
    for (int64_t t = 0; t < PAD; t++) {
        float *kb = kp + (t / VW) * d * VW + t % VW, *vb = vp + t * d;
        int64_t key = k0 + t;
        if (key >= lo && key < lk) {
            int64_t off = (slot_of(pages, page_size, key) * nkv + hk) * d;
            for (int64_t j = 0; j < d; j++) kb[j * VW] = kc[off + j];
            memcpy(vb, vc + off, d * sizeof(float));
        } else {
            for (int64_t j = 0; j < d; j++) kb[j * VW] = 0.f;
            memset(vb, 0, d * sizeof(float));
        }
    }
}

/* s[r][col + VW c + i] = q_r . key (VW c + i) of the NC packed blocks at kp, for c < nc. */
static inline __attribute__((always_inline)) void qk_block(const float *const *qr, const float *kp, int64_t d,
                                                          int64_t nc, float (*s)[KEYS], int64_t col) {
    vf acc[ROWS][NC];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) acc[r][c] = splat(0.f);
    for (int64_t j = 0; j < d; j++) {
        vf kv[NC];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) kv[c] = ld(kp + c * VW * d + j * VW);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            vf qb = splat(qr[r][j]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) acc[r][c] = fma_v(qb, kv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            if (c < nc) st(&s[r][col + VW * c], acc[r][c]);
}

/* o[r][:] = o[r][:] * cr[r] + sum over keys t in [t0, t1) of p[r][t] v_t. */
static inline __attribute__((always_inline)) void pv_block(float (*p)[KEYS], const float *vp, int64_t d,
                                                          int64_t t0, int64_t t1, float (*o)[MAX_D], const float *cr) {
    for (int64_t dc = 0; dc < d; dc += NC * VW) {
        vf acc[ROWS][NC];
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            vf c = splat(cr[r]);
#pragma GCC unroll 4
            for (int k = 0; k < NC; k++) acc[r][k] = ld(&o[r][dc + VW * k]) * c;
        }
        for (int64_t t = t0; t < t1; t++) {
            const float *vt = vp + t * d + dc;
            vf vv[NC];
#pragma GCC unroll 4
            for (int k = 0; k < NC; k++) vv[k] = ld(vt + VW * k);
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; r++) {
                vf pb = splat(p[r][t]);
#pragma GCC unroll 4
                for (int k = 0; k < NC; k++) acc[r][k] = fma_v(pb, vv[k], acc[r][k]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
            for (int k = 0; k < NC; k++) st(&o[r][dc + VW * k], acc[r][k]);
    }
}

/* Running state of ROWS folded rows of one (sequence, KV head): row r is position r / g, query head
 * hk * g + r % g; rows past nr repeat the last row (computed, never stored).  Rows are in position
 * order, so lo[] and lim[] never decrease along the tile. */
typedef struct {
    float o[ROWS][MAX_D] __attribute__((aligned(64))); /* unnormalised sum of p v */
    float m[ROWS], l[ROWS];                             /* running max (unscaled scores), sum of p */
    float sink[ROWS];                                   /* the head's sink logit (scaled), or -inf */
    const float *qr[ROWS];
    float *dst[ROWS];
    int64_t lo[ROWS], lim[ROWS], nr; /* row r sees keys lo[r] <= key < lim[r] */
} Tile;

static void tile_init(Tile *t, const float *q, int64_t q_stride, int64_t d, int64_t g, int64_t hk, int64_t prefix,
                      int64_t window, int64_t r0, int64_t nr, float *out, int64_t o_stride, const float *sinks) {
    t->nr = nr;
    for (int r = 0; r < ROWS; r++) {
        int64_t rr = r0 + (r < nr ? r : nr - 1), pos = rr / g, head = hk * g + rr % g;
        t->qr[r] = q + pos * q_stride + head * d;
        t->dst[r] = out + pos * o_stride + head * d;
        t->lim[r] = prefix + pos + 1;
        t->lo[r] = window > 0 && t->lim[r] > window ? t->lim[r] - window : 0;
        t->m[r] = -INFINITY, t->l[r] = 0.f;
        t->sink[r] = sinks ? sinks[head] : -INFINITY;
        memset(t->o[r], 0, d * sizeof(float));
    }
}

/* One block of up to KEYS keys from kb0 (packed at kp / vp, which start at key kbase) into the
 * tile's running state. */
static void tile_block(Tile *t, const float *kp, const float *vp, int64_t d, int64_t kbase, int64_t kb0, float a) {
    float s[ROWS][KEYS] __attribute__((aligned(64)));
    float cr[ROWS];
    int64_t end = t->lim[ROWS - 1], n = end - kb0 < KEYS ? end - kb0 : KEYS, nv = (n + VW - 1) / VW;
    int64_t first = t->lo[0] - kb0 > 0 ? (t->lo[0] - kb0) / VW : 0; /* vectors before it: no row sees */
    for (int64_t c0 = first / NC * NC; c0 < nv; c0 += NC)
        qk_block(t->qr, kp + (kb0 - kbase + c0 * VW) * d, d, nv - c0, s, c0 * VW);
    int64_t t0 = n, t1 = 0; /* the keys some row sees */
    const vi lanes = iota();
    const vf av = splat(a);
    for (int r = 0; r < ROWS; r++) {
        int64_t lo = t->lo[r] - kb0, hi = t->lim[r] - kb0;
        lo = lo < 0 ? 0 : lo;
        hi = hi > n ? n : hi;
        if (hi <= lo) { /* nothing seen in this block: p = 0, state unchanged */
            cr[r] = 1.f;
            for (int64_t j = 0; j < nv * VW; j += VW) st(&s[r][j], splat(0.f));
            continue;
        }
        t0 = lo < t0 ? lo : t0, t1 = hi > t1 ? hi : t1;
        const vi vlo = splat_i((int32_t)lo), vhi = splat_i((int32_t)hi);
        vf mx = splat(-INFINITY);
        for (int64_t j = lo / VW * VW; j < hi; j += VW) {
            vi idx = lanes + splat_i((int32_t)j), seen = (idx >= vlo) & (idx < vhi);
            vf x = ld(&s[r][j]);
            mx = select_v(seen & (x > mx), x, mx);
        }
        float m = t->m[r], mnew = fmaxf(m, hmax(mx));
        cr[r] = exp2f((m - mnew) * a); /* 0 on the first block seen (m = -inf) */
        vf ma = splat(mnew * a), sum = splat(0.f);
        for (int64_t j = 0; j < nv * VW; j += VW) {
            vi idx = lanes + splat_i((int32_t)j), seen = (idx >= vlo) & (idx < vhi);
            vf e = select_v(seen, exp2_neg(fma_v(ld(&s[r][j]), av, -ma)), splat(0.f));
            sum += e;
            st(&s[r][j], e);
        }
        t->l[r] = t->l[r] * cr[r] + hsum(sum);
        t->m[r] = mnew;
    }
    if (t1 > t0) pv_block(s, vp + (kb0 - kbase) * d, d, t0, t1, t->o, cr); /* else every cr is 1 */
}

/* A sink joins the denominator only: with m the row's max in scaled units, out = o c / (l c + e),
 * c = exp(m - max(m, sink)), e = exp(sink - max(m, sink)); no sink (-inf) gives c = 1, e = 0. */
static void tile_store(const Tile *t, int64_t d, float scale) {
    for (int r = 0; r < t->nr; r++) {
        float ms = t->m[r] * scale, mf = fmaxf(ms, t->sink[r]), c = expf(ms - mf);
        vf inv = splat(c / (t->l[r] * c + expf(t->sink[r] - mf)));
        for (int64_t i = 0; i < d; i += VW) st(t->dst[r] + i, ld(&t->o[r][i]) * inv);
    }
}

/* TILES tiles (rows r0 .. r0 + nr) walk the keys together, block by block: a block's packed keys and
 * values (2 x KEYS x D floats, 64 KiB at D = 64) are read from memory once and reused by every tile
 * from L1/L2, where one tile at a time would stream a long prefix from L3 for ROWS rows. */
static void row_block(const float *q, int64_t q_stride, const float *kp, const float *vp, int64_t kbase, int64_t d,
                      int64_t g, int64_t hk, int64_t prefix, int64_t window, int64_t r0, int64_t nr, float scale,
                      float *out, int64_t o_stride, const float *sinks) {
    Tile tiles[TILES];
    int64_t nt = (nr + ROWS - 1) / ROWS;
    for (int64_t i = 0; i < nt; i++) {
        int64_t left = nr - i * ROWS;
        tile_init(&tiles[i], q, q_stride, d, g, hk, prefix, window, r0 + i * ROWS, left < ROWS ? left : ROWS, out,
                  o_stride, sinks);
    }
    const float a = scale * 1.4426950408889634f; /* exp(scale x) = 2^(a x) */
    for (int64_t kb0 = tiles[0].lo[0] / PAD * PAD; kb0 < tiles[nt - 1].lim[ROWS - 1]; kb0 += KEYS)
        for (int64_t i = 0; i < nt; i++)
            if (kb0 < tiles[i].lim[ROWS - 1] && kb0 + KEYS > tiles[i].lo[0])
                tile_block(&tiles[i], kp, vp, d, kbase, kb0, a);
    for (int64_t i = 0; i < nt; i++) tile_store(&tiles[i], d, scale);
}

/* Where one sequence's packed keys start (its first query's first key, down to PAD) and how many. */
static inline int64_t pack_lo(int64_t lq, int64_t lk, int64_t window) {
    int64_t first = lk - lq + 1; /* keys the first new row sees, itself included */
    return window > 0 && first > window ? (first - window) / PAD * PAD : 0;
}

/* out [total_q, nh, d] (rows nh * d apart) = attention of q rows (q_stride apart, heads d apart)
 * over each sequence's keys, read from its pages; window: a sliding-window layer's W (0: none);
 * sinks [nh] or NULL: a learned logit per query head in the softmax's denominator (gpt-oss).
 * 0 on success; -1 unsupported shape; -2 no memory. */
int extend_attention_f32(const float *q, int64_t q_stride, const float *kc, const float *vc,
                         const int32_t *page_table, int64_t pt_stride, const int32_t *cu_q, const int32_t *seq_lens,
                         int64_t bsz, int64_t nh, int64_t nkv, int64_t d, int64_t page_size, float scale,
                         int64_t window, const float *sinks, float *out) {
    if (d % 64 || d > MAX_D || nh % nkv) return -1;
    int64_t g = nh / nkv;
    int64_t *base = malloc((bsz + 1) * sizeof(int64_t) * 3);
    if (!base) return -2;
    int64_t *runs = base + bsz + 1, *tiles = runs + bsz + 1; /* prefix sums of work items */
    base[0] = runs[0] = tiles[0] = 0;
    for (int64_t b = 0; b < bsz; b++) {
        int64_t lq = cu_q[b + 1] - cu_q[b], lk = lq ? seq_lens[b] : 0;
        int64_t kpad = lq ? (lk + PAD - 1) / PAD * PAD - pack_lo(lq, lk, window) : 0;
        base[b + 1] = base[b] + nkv * kpad * d;
        runs[b + 1] = runs[b] + nkv * (kpad / PAD);
        tiles[b + 1] = tiles[b] + nkv * ((lq * g + TILES * ROWS - 1) / (TILES * ROWS));
    }
    float *kp = malloc(2 * base[bsz] * sizeof(float) + 64), *vp = kp + base[bsz];
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
            int64_t lq = cu_q[b + 1] - cu_q[b], lk = seq_lens[b], k_lo = pack_lo(lq, lk, window);
            int64_t per = (runs[b + 1] - runs[b]) / nkv, i = it - runs[b];
            int64_t hk = i / per, k0 = (i % per) * PAD, off = base[b] + (hk * per * PAD + k0) * d;
            int64_t lo = window > 0 && lk - lq + 1 > window ? lk - lq + 1 - window : 0;
            pack_run(kc, vc, page_table + b * pt_stride, page_size, nkv, hk, d, k_lo + k0, lo, lk, kp + off, vp + off);
        }
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < tiles[bsz]; it++) {
            int64_t b = 0;
            while (tiles[b + 1] <= it) b++;
            int64_t lq = cu_q[b + 1] - cu_q[b], lk = seq_lens[b], per = (tiles[b + 1] - tiles[b]) / nkv;
            int64_t i = it - tiles[b], hk = i / per, r0 = (i % per) * TILES * ROWS, nr = lq * g - r0;
            int64_t k_lo = pack_lo(lq, lk, window), kpad = (lk + PAD - 1) / PAD * PAD - k_lo;
            int64_t off = base[b] + hk * kpad * d;
            row_block(q + cu_q[b] * q_stride, q_stride, kp + off, vp + off, k_lo, d, g, hk, lk - lq, window, r0,
                      nr < TILES * ROWS ? nr : TILES * ROWS, scale, out + cu_q[b] * nh * d, nh * d, sinks);
        }
    }
    free(kp);
    free(base);
    return 0;
}
