/* The machine's arithmetic peak, for benchmarks/kernels/machine_ceiling.py (a benchmark, not a kernel).
 *
 * peak_clock_ghz: the core clock from a chain of dependent integer adds (1 cycle each on x86 cores),
 * on `threads` cores at once (the slowest).
 * peak_gflops: FLOP/s of 12 independent accumulator chains of one instruction on `threads` OpenMP
 * threads (12 chains cover the FMA latency x throughput of current x86 cores, so this is the issue
 * rate, not the latency): kind 0 fp32 vfmadd zmm, 1 fp32 vfmadd ymm, 2 bf16 vdpbf16ps zmm.
 * Returns -1 for a kind this build's CPU lacks. */
#include <immintrin.h>
#include <omp.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double one_clock(long iters) {
    long n = iters, x = 0;
    double t0 = now();
    __asm__ volatile("1:\n .rept 100\n add $1, %0\n .endr\n dec %1\n jnz 1b\n" : "+r"(x), "+r"(n));
    return iters * 100.0 / (now() - t0) / 1e9;
}

/* the slowest of `threads` cores each running the chain at once (all-core clock, not one core's boost) */
double peak_clock_ghz(int threads, long iters) {
    double ghz = 1e9;
#pragma omp parallel num_threads(threads) reduction(min : ghz)
    ghz = one_clock(iters);
    return ghz;
}

/* distinct starting values: equal chains would be merged by the compiler into one */
#define ACC(T, S) T a0 = S(0.f), a1 = S(1.f), a2 = S(2.f), a3 = S(3.f), a4 = S(4.f), a5 = S(5.f), \
    a6 = S(6.f), a7 = S(7.f), a8 = S(8.f), a9 = S(9.f), a10 = S(10.f), a11 = S(11.f);
#define TWELVE(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7) OP(a8) OP(a9) OP(a10) OP(a11)
#define SUM12(ADD) ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))), \
    ADD(ADD(a8, a9), ADD(a10, a11)))

static double chains(int kind, long n, float *sink) {
#if defined(__AVX512F__)
    if (kind == 0) {
        ACC(__m512, _mm512_set1_ps)
        __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
#define F(a) a = _mm512_fmadd_ps(a, b, c);
        for (long i = 0; i < n; i++) { TWELVE(F) }
        *sink += _mm512_reduce_add_ps(SUM12(_mm512_add_ps));
        return n * 12.0 * 16 * 2;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (kind == 1) {
        ACC(__m256, _mm256_set1_ps)
        __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-9f);
#define G(a) a = _mm256_fmadd_ps(a, b, c);
        for (long i = 0; i < n; i++) { TWELVE(G) }
        float o[8];
        _mm256_storeu_ps(o, SUM12(_mm256_add_ps));
        *sink += o[0];
        return n * 12.0 * 8 * 2;
    }
#endif
#if defined(__AVX512BF16__)
    if (kind == 2) {
        ACC(__m512, _mm512_set1_ps)
        __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3000);
#define H(a) a = _mm512_dpbf16_ps(a, b, c);
        for (long i = 0; i < n; i++) { TWELVE(H) }
        *sink += _mm512_reduce_add_ps(SUM12(_mm512_add_ps));
        return n * 12.0 * 32 * 2;
    }
#endif
    (void)n; (void)sink;
    return -1.0;
}

double peak_gflops(int kind, int threads, long n) {
    double flops = 0.0, t0 = now();
    int bad = 0;
    float sink = 0.f;
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink) reduction(| : bad)
    {
        double f = chains(kind, n, &sink);
        if (f < 0) bad = 1; else flops += f;
    }
    double secs = now() - t0;
    if (bad) return -1.0;
    return (flops + (sink == 12345.f)) / secs / 1e9; /* sink: keeps the chains live */
}
