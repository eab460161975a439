/*
 * cpu_bench.c - times flashc's CPU backend through the public API, and measures the
 * processor's float32 FMA peak, so every figure is also a fraction of what the cores can do.
 *
 *   cpu_bench peak THREADS                 FMA peak on THREADS threads, GFLOP/s
 *   cpu_bench attn THREADS DTYPE MODE N D CAUSAL [HEADS] [BATCH]
 *                                          DTYPE f32|bf16|f16, MODE fwd|bwd, CAUSAL 0|1
 *
 * Each attention line prints "flashc <dtype> <mode> n=<N> d=<D> causal=<c> threads=<T>
 * ms=<median> gflops=<rate>", with the usual FLOP count: 4 B H N^2 D forward, 2.5x that
 * backward (the products only, recomputation not counted), half of each under a causal mask.
 * The time is the median of at least 3 runs after a warm-up, and of as many as fit in about
 * a second (exactly CPU_BENCH_REPS runs when that is set). The peak is a loop of independent FMAs on registers (the micro-kernels' inner
 * operation without memory traffic): AVX-512 where the processor has it, else AVX2+FMA.
 * Both also print cpu_gflops: the rate over the process's CPU time divided by the thread
 * count, which on a busy shared machine measures the code rather than the neighbours.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashc.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU time of the whole process: on a shared machine, time slices lost to other processes
 * do not count, so rates computed from it (per thread) are steadier than wall-clock ones. */
static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- FMA peak ---- */

#define PEAK_ITERS 50000000L

#if defined(__x86_64__)
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
__attribute__((target("avx512f"))) static double peak_avx512(void)
{
#define D5(i) __m512 a##i = _mm512_set1_ps(0.001f * (i));
    R12(D5)
    __m512 b = _mm512_set1_ps(0.99999f), c = _mm512_set1_ps(1e-6f);
    for (long it = 0; it < PEAK_ITERS; it++) {
#define F5(i) a##i = _mm512_fmadd_ps(a##i, b, c);
        R12(F5)
    }
    float s = 0;
#define S5(i) s += _mm512_reduce_add_ps(a##i);
    R12(S5)
    return s;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(void)
{
#define D2(i) __m256 a##i = _mm256_set1_ps(0.001f * (i));
    R12(D2)
    __m256 b = _mm256_set1_ps(0.99999f), c = _mm256_set1_ps(1e-6f);
    for (long it = 0; it < PEAK_ITERS; it++) {
#define F2(i) a##i = _mm256_fmadd_ps(a##i, b, c);
        R12(F2)
    }
    float s = 0;
    float t[8];
#define S2(i) _mm256_storeu_ps(t, a##i); s += t[0];
    R12(S2)
    return s;
}
#endif

static int peak_lanes(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 8;
#endif
    return 0;
}

static void *peak_thread(void *arg)
{
    double *sink = arg;
#if defined(__x86_64__)
    *sink = peak_lanes() == 16 ? peak_avx512() : peak_avx2();
#else
    *sink = 0;
#endif
    return NULL;
}

static int run_peak(int threads)
{
    int lanes = peak_lanes();
    if (!lanes) {
        printf("peak unavailable on this processor\n");
        return 1;
    }
    double best = 0, best_cpu = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t tid[1024];
        double sink[1024];
        double t0 = now(), c0 = cpu_now();
        for (int t = 0; t < threads; t++)
            pthread_create(&tid[t], NULL, peak_thread, &sink[t]);
        for (int t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
        double dt = now() - t0, dc = (cpu_now() - c0) / threads;
        double flops = (double)threads * PEAK_ITERS * 12.0 * lanes * 2.0;
        best = flops / dt / 1e9 > best ? flops / dt / 1e9 : best;
        best_cpu = flops / dc / 1e9 > best_cpu ? flops / dc / 1e9 : best_cpu;
    }
    printf("peak threads=%d lanes=%d gflops=%.1f cpu_gflops=%.1f\n", threads, lanes, best,
           best_cpu);
    return 0;
}

/* ---- attention ---- */

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* fp16 by rounding the float's bits (normal range only: the inputs are in [-1, 1]). */
static uint16_t to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a < 0x38800000u) /* below the smallest normal half: flush to zero */
        return (uint16_t)sign;
    a += 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

static void *random_tensor(flashc_dtype dt, size_t n, unsigned *seed)
{
    size_t es = flashc_dtype_size(dt);
    void *p = aligned_alloc(64, (n * es + 63) & ~(size_t)63);
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        float x = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
        if (dt == FLASHC_F32)
            ((float *)p)[i] = x;
        else if (dt == FLASHC_BF16)
            ((uint16_t *)p)[i] = to_bf16(x);
        else
            ((uint16_t *)p)[i] = to_f16(x);
    }
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_attn(int threads, const char *dts, const char *mode, long n, long d, int causal,
                    long heads, long batch)
{
    flashc_dtype dt = strcmp(dts, "f32") == 0 ? FLASHC_F32
                      : strcmp(dts, "bf16") == 0 ? FLASHC_BF16
                                                 : FLASHC_F16;
    int bwd = strcmp(mode, "bwd") == 0;
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = threads;
    flashc_backend *be;
    if (flashc_backend_create("cpu", &cfg, &be) != FLASHC_OK) {
        fprintf(stderr, "cpu backend: %s\n", flashc_last_error());
        return 1;
    }
    size_t elems = (size_t)batch * n * heads * d;
    unsigned seed = 12345;
    void *q = random_tensor(dt, elems, &seed), *k = random_tensor(dt, elems, &seed);
    void *v = random_tensor(dt, elems, &seed), *o = random_tensor(dt, elems, &seed);
    void *dout = random_tensor(dt, elems, &seed), *dq = random_tensor(dt, elems, &seed);
    void *dk = random_tensor(dt, elems, &seed), *dv = random_tensor(dt, elems, &seed);
    float *lse = aligned_alloc(64, ((size_t)batch * heads * n * 4 + 63) & ~(size_t)63);
    if (!q || !k || !v || !o || !dout || !dq || !dk || !dv || !lse) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    flashc_tensor tq = flashc_tensor_contiguous(q, dt, batch, n, heads, d);
    flashc_tensor tk = flashc_tensor_contiguous(k, dt, batch, n, heads, d);
    flashc_tensor tv = flashc_tensor_contiguous(v, dt, batch, n, heads, d);
    flashc_tensor to = flashc_tensor_contiguous(o, dt, batch, n, heads, d);
    flashc_tensor tdo = flashc_tensor_contiguous(dout, dt, batch, n, heads, d);
    flashc_tensor tdq = flashc_tensor_contiguous(dq, dt, batch, n, heads, d);
    flashc_tensor tdk = flashc_tensor_contiguous(dk, dt, batch, n, heads, d);
    flashc_tensor tdv = flashc_tensor_contiguous(dv, dt, batch, n, heads, d);
    flashc_tensor tl = flashc_lse_contiguous(lse, batch, heads, n);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;

    if (flashc_forward(be, &p, &tq, &tk, &tv, &to, &tl) != FLASHC_OK) {
        fprintf(stderr, "forward: %s\n", flashc_last_error());
        return 1;
    }
    double times[64], ctimes[64];
    int reps = 0;
    double total = 0;
    /* CPU_BENCH_REPS=N: exactly N timed runs, so that two builds timed as whole processes
     * do the same work */
    const char *fixed_env = getenv("CPU_BENCH_REPS");
    const int fixed = fixed_env ? atoi(fixed_env) : 0;
    while (reps < 64 && (fixed > 0 ? reps < fixed : reps < 3 || total < 1.0)) {
        double t0 = now(), c0 = cpu_now();
        flashc_status st = bwd ? flashc_backward(be, &p, &tdo, &tq, &tk, &tv, &to, &tl, &tdq,
                                                 &tdk, &tdv)
                               : flashc_forward(be, &p, &tq, &tk, &tv, &to, &tl);
        double t = now() - t0, ct = (cpu_now() - c0) / threads;
        if (st != FLASHC_OK) {
            fprintf(stderr, "%s: %s\n", mode, flashc_last_error());
            return 1;
        }
        if (reps == 0 && total == 0 && bwd) { /* first backward: warm-up */
            total = 1e-12;
            continue;
        }
        ctimes[reps] = ct;
        times[reps++] = t;
        total += t;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    qsort(ctimes, (size_t)reps, sizeof ctimes[0], cmp_double);
    double med = times[reps / 2], cmed = ctimes[reps / 2];
    double flops = 4.0 * batch * heads * (double)n * (double)n * d * (bwd ? 2.5 : 1.0) *
                   (causal ? 0.5 : 1.0);
    printf("flashc %s %s n=%ld d=%ld causal=%d threads=%d ms=%.3f gflops=%.1f cpu_gflops=%.1f"
           "  (%s)\n",
           dts, mode, n, d, causal, threads, med * 1e3, flops / med / 1e9, flops / cmed / 1e9,
           flashc_backend_describe(be));
    free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
    flashc_backend_destroy(be);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "peak") == 0)
        return run_peak(atoi(argv[2]));
    if (argc >= 9 && strcmp(argv[1], "attn") == 0)
        return run_attn(atoi(argv[2]), argv[3], argv[4], atol(argv[5]), atol(argv[6]),
                        atoi(argv[7]), argc > 8 ? atol(argv[8]) : 16, argc > 9 ? atol(argv[9]) : 1);
    if (argc >= 8 && strcmp(argv[1], "attn") == 0)
        return run_attn(atoi(argv[2]), argv[3], argv[4], atol(argv[5]), atol(argv[6]),
                        atoi(argv[7]), 16, 1);
    fprintf(stderr, "usage: %s peak THREADS | attn THREADS DTYPE fwd|bwd N D CAUSAL [HEADS] [BATCH]\n",
            argv[0]);
    return 2;
}
