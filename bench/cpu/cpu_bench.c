/*
 * cpu_bench.c - times flashc's CPU backend through the public API, and measures the
 * processor's float32 FMA peak, so every figure is also a fraction of what the cores can do.
 *
 *   cpu_bench peak THREADS                 FMA peak on THREADS threads, GFLOP/s
 *   cpu_bench attn THREADS DTYPE MODE N D CAUSAL [HEADS] [BATCH]
 *                                          DTYPE f32|bf16|f16, MODE fwd|bwd, CAUSAL 0|1
 *   cpu_bench varlen THREADS DTYPE MODE SET TOTAL D CAUSAL [HEADS] [HEADS_KV]
 *                                          a packed variable-length batch (SET equal|uniform|
 *                                          ragged, TOTAL tokens) against the same tokens as
 *                                          fixed-length calls grouped by length
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
#include <stdint.h>
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

static flashc_dtype dtype_of(const char *name)
{
    return strcmp(name, "f32") == 0 ? FLASHC_F32 : strcmp(name, "bf16") == 0 ? FLASHC_BF16 : FLASHC_F16;
}

/* The CPU backend on `threads` threads, or NULL (said on stderr). */
static flashc_backend *cpu_backend(int threads)
{
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = threads;
    flashc_backend *be;
    if (flashc_backend_create("cpu", &cfg, &be) != FLASHC_OK) {
        fprintf(stderr, "cpu backend: %s\n", flashc_last_error());
        return NULL;
    }
    return be;
}

static int run_attn(int threads, const char *dts, const char *mode, long n, long d, int causal,
                    long heads, long batch)
{
    const flashc_dtype dt = dtype_of(dts);
    int bwd = strcmp(mode, "bwd") == 0;
    flashc_backend *be = cpu_backend(threads);
    if (!be)
        return 1;
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

/* ---- variable-length batches ---- */

enum { MAX_SEQS = 1024 };

static double uniform01(unsigned *seed)
{
    *seed = *seed * 1664525u + 1013904223u;
    return ((*seed >> 8) + 0.5) / 16777216.0;
}

/* Sequence lengths of one set, summing to total: "equal" four of total / 4; "uniform" drawn
 * from [1, total / 2]; "ragged" lognormal around total / 64 (most short, a few long), with an
 * empty sequence first and last and one of length 1, the edge cases of a sequence lookup.
 * The last drawn length is cut to land on total. Returns the count, 0 for an unknown set. */
static int make_lengths(const char *set, long total, int *len)
{
    unsigned seed = 7;
    int n = 0;
    long left = total;
    const int ragged = strcmp(set, "ragged") == 0;
    if (strcmp(set, "equal") == 0) {
        for (; n < 4; n++)
            len[n] = (int)(total / 4);
        len[3] += (int)(total % 4);
        return n;
    }
    if (!ragged && strcmp(set, "uniform") != 0)
        return 0;
    if (ragged) {
        len[n++] = 0;
        len[n++] = 1;
        left -= 1;
    }
    while (left > 0 && n < MAX_SEQS - 2) {
        long l;
        if (ragged) { /* Box-Muller: exp(log(median) + 1.2 z), clamped to [2, total / 2] */
            double z = sqrt(-2.0 * log(uniform01(&seed))) * cos(6.283185307 * uniform01(&seed));
            l = lround(exp(log(total / 64.0) + 1.2 * z));
            l = l < 2 ? 2 : l > total / 2 ? total / 2 : l;
        } else {
            l = 1 + (long)(uniform01(&seed) * (double)(total / 2));
        }
        l = l > left ? left : l;
        len[n++] = (int)l;
        left -= l;
    }
    if (left > 0) /* out of slots: the rest goes to the last sequence */
        len[n - 1] += (int)left;
    if (ragged)
        len[n++] = 0;
    return n;
}

/* The forward FLOPs of a batch of sequences: 4 H D per visible (query, key) pair, L^2 pairs
 * without a mask and L (L + 1) / 2 under a causal one (equal query and key lengths). */
static double varlen_flops(const int *len, int n, long heads, long d, int causal)
{
    double pairs = 0;
    for (int i = 0; i < n; i++)
        pairs += causal ? 0.5 * len[i] * (len[i] + 1.0) : (double)len[i] * len[i];
    return 4.0 * heads * d * pairs;
}

static double elem_value(flashc_dtype dt, const void *p, size_t i)
{
    if (dt == FLASHC_F32)
        return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i];
    float f;
    if (dt == FLASHC_BF16) {
        u <<= 16;
        memcpy(&f, &u, 4);
        return f;
    }
    /* fp16, normal range (the outputs here are averages of inputs in [-1, 1]) */
    if ((u & 0x7fffu) == 0)
        return (u & 0x8000u) ? -0.0 : 0.0;
    return ((u & 0x8000u) ? -1.0 : 1.0) * ldexp(1.0 + (u & 0x3ffu) / 1024.0, (int)((u >> 10) & 0x1fu) - 15);
}

/* The tensors of one call: inputs, outputs and (backward) gradients, [batch, n, heads, d]. */
typedef struct call_tensors {
    void *buf[8]; /* q k v o dout dq dk dv */
    float *lse;
    flashc_tensor t[8], tl;
} call_tensors;

static int call_tensors_alloc(call_tensors *c, flashc_dtype dt, long batch, long n, long heads,
                              long heads_kv, long d, unsigned *seed)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 8; i++) {
        const long h = i == 1 || i == 2 || i == 6 || i == 7 ? heads_kv : heads;
        c->buf[i] = random_tensor(dt, (size_t)(batch * n * h * d > 0 ? batch * n * h * d : 1), seed);
        if (!c->buf[i])
            return 0;
        c->t[i] = flashc_tensor_contiguous(c->buf[i], dt, batch, n, h, d);
    }
    c->lse = aligned_alloc(64, ((size_t)(batch * heads * n > 0 ? batch * heads * n : 1) * 4 + 63) & ~(size_t)63);
    c->tl = flashc_lse_contiguous(c->lse, batch, heads, n);
    return c->lse != NULL;
}

static void call_tensors_free(call_tensors *c)
{
    for (int i = 0; i < 8; i++)
        free(c->buf[i]);
    free(c->lse);
}

static flashc_status call_run(flashc_backend *be, const flashc_params *p, call_tensors *c, int bwd)
{
    flashc_tensor *t = c->t;
    return bwd ? flashc_backward(be, p, &t[4], &t[0], &t[1], &t[2], &t[3], &c->tl, &t[5], &t[6], &t[7])
               : flashc_forward(be, p, &t[0], &t[1], &t[2], &t[3], &c->tl);
}

static double median_of(double *x, int n)
{
    qsort(x, (size_t)n, sizeof x[0], cmp_double);
    return x[n / 2];
}

/* A packed batch (one call over cu_seqlens) against the same tokens as fixed-length calls,
 * one per distinct length over the sequences of that length, copied out of the packed
 * tensors. The outputs of the two are compared sequence by sequence first (the largest
 * difference is printed; a NaN fails the run). Each round times the varlen call once and
 * each fixed call once; "fixed ms" is the sum of the fixed calls' medians, the time the same
 * work takes when the caller groups equal lengths. ratio = varlen ms / fixed ms. */
static int run_varlen(int threads, const char *dts, const char *mode, const char *set, long total,
                      long d, int causal, long heads, long heads_kv)
{
    const flashc_dtype dt = dtype_of(dts);
    const int bwd = strcmp(mode, "bwd") == 0;
    int len[MAX_SEQS], nseq = make_lengths(set, total, len);
    if (nseq == 0 || total < 1 || heads_kv < 1 || heads % heads_kv != 0) {
        fprintf(stderr, "varlen: unknown set '%s' or bad sizes\n", set);
        return 2;
    }
    int32_t cu[MAX_SEQS + 1];
    int maxlen = 0;
    cu[0] = 0;
    for (int i = 0; i < nseq; i++) {
        cu[i + 1] = cu[i] + len[i];
        maxlen = len[i] > maxlen ? len[i] : maxlen;
    }
    flashc_backend *be = cpu_backend(threads);
    if (!be)
        return 1;
    unsigned seed = 12345;
    call_tensors packed;
    if (!call_tensors_alloc(&packed, dt, 1, total, heads, heads_kv, d, &seed)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    flashc_params pv;
    flashc_params_init(&pv);
    pv.causal = causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;
    pv.cu_seqlens_q = pv.cu_seqlens_k = cu;
    pv.max_seqlen_q = pv.max_seqlen_k = maxlen;
    pv.num_seqs = nseq;
    flashc_params pf;
    flashc_params_init(&pf);
    pf.causal = pv.causal;

    /* the groups: distinct lengths > 0, each with its sequences' rows copied out */
    int glen[MAX_SEQS], gcount[MAX_SEQS], ngroups = 0;
    call_tensors *groups = calloc(MAX_SEQS, sizeof *groups);
    if (!groups) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int i = 0; i < nseq; i++) {
        if (len[i] == 0)
            continue;
        int g = 0;
        while (g < ngroups && glen[g] != len[i])
            g++;
        if (g == ngroups)
            glen[ngroups] = len[i], gcount[ngroups++] = 0;
        gcount[g]++;
    }
    const size_t es = flashc_dtype_size(dt);
    for (int g = 0; g < ngroups; g++) {
        if (!call_tensors_alloc(&groups[g], dt, gcount[g], glen[g], heads, heads_kv, d, &seed)) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        int at = 0;
        for (int i = 0; i < nseq; i++) {
            if (len[i] != glen[g])
                continue;
            for (int t = 0; t < 5; t++) { /* q k v o dout: o for the backward's delta */
                const long h = t == 1 || t == 2 ? heads_kv : heads;
                const size_t row = (size_t)h * d * es;
                memcpy((char *)groups[g].buf[t] + (size_t)at * glen[g] * row,
                       (char *)packed.buf[t] + (size_t)cu[i] * row, (size_t)len[i] * row);
            }
            at++;
        }
    }

    /* warm-up, and the forward outputs the backward reads */
    flashc_status st = call_run(be, &pv, &packed, 0);
    for (int g = 0; g < ngroups && st == FLASHC_OK; g++)
        st = call_run(be, &pf, &groups[g], 0);
    if (bwd) {
        if (st == FLASHC_OK)
            st = call_run(be, &pv, &packed, 1);
        for (int g = 0; g < ngroups && st == FLASHC_OK; g++)
            st = call_run(be, &pf, &groups[g], 1);
    }
    if (st != FLASHC_OK) {
        fprintf(stderr, "varlen %s: %s\n", mode, flashc_last_error());
        return 1;
    }

    /* the two agree sequence by sequence: O (forward) or dQ, dK, dV (backward) */
    double maxdiff = 0;
    for (int g = 0; g < ngroups; g++) {
        int at = 0;
        for (int i = 0; i < nseq; i++) {
            if (len[i] != glen[g])
                continue;
            for (int t = bwd ? 5 : 3; t < (bwd ? 8 : 4); t++) {
                const long h = t == 6 || t == 7 ? heads_kv : heads;
                const size_t n = (size_t)len[i] * h * d;
                for (size_t e = 0; e < n; e++) {
                    const double x = elem_value(dt, packed.buf[t], (size_t)cu[i] * h * d + e);
                    const double y = elem_value(dt, groups[g].buf[t], (size_t)at * glen[g] * h * d + e);
                    const double diff = fabs(x - y);
                    if (!(diff <= maxdiff)) /* NaN included */
                        maxdiff = diff == diff ? diff : INFINITY;
                }
            }
            at++;
        }
    }

    double vt[64], *ft = calloc((size_t)ngroups * 64 + 1, sizeof *ft);
    if (!ft) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    int reps = 0;
    double spent = 0;
    const char *fixed_env = getenv("CPU_BENCH_REPS");
    const int fixed = fixed_env ? atoi(fixed_env) : 0;
    while (reps < 64 && (fixed > 0 ? reps < fixed : reps < 3 || spent < 2.0)) {
        double t0 = now();
        st = call_run(be, &pv, &packed, bwd);
        vt[reps] = now() - t0;
        spent += vt[reps];
        for (int g = 0; g < ngroups && st == FLASHC_OK; g++) {
            t0 = now();
            st = call_run(be, &pf, &groups[g], bwd);
            ft[g * 64 + reps] = now() - t0;
            spent += ft[g * 64 + reps];
        }
        if (st != FLASHC_OK) {
            fprintf(stderr, "varlen %s: %s\n", mode, flashc_last_error());
            return 1;
        }
        reps++;
    }
    const double vmed = median_of(vt, reps);
    double fsum = 0;
    for (int g = 0; g < ngroups; g++)
        fsum += median_of(ft + g * 64, reps);
    const double flops = varlen_flops(len, nseq, heads, d, causal) * (bwd ? 2.5 : 1.0);
    printf("flashc varlen %s %s set=%s total=%ld seqs=%d groups=%d longest=%d d=%ld causal=%d "
           "heads=%ld/%ld threads=%d varlen_ms=%.3f fixed_ms=%.3f ratio=%.3f gflops=%.1f "
           "maxdiff=%.3g  (%s)\n",
           dts, mode, set, total, nseq, ngroups, maxlen, d, causal, heads, heads_kv, threads,
           vmed * 1e3, fsum * 1e3, vmed / fsum, flops / vmed / 1e9, maxdiff,
           flashc_backend_describe(be));
    for (int g = 0; g < ngroups; g++)
        call_tensors_free(&groups[g]);
    free(groups);
    free(ft);
    call_tensors_free(&packed);
    flashc_backend_destroy(be);
    return maxdiff == maxdiff && !isinf(maxdiff) ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 9 && strcmp(argv[1], "varlen") == 0)
        return run_varlen(atoi(argv[2]), argv[3], argv[4], argv[5], atol(argv[6]), atol(argv[7]),
                          atoi(argv[8]), argc > 9 ? atol(argv[9]) : 16,
                          argc > 10 ? atol(argv[10]) : argc > 9 ? atol(argv[9]) : 16);
    if (argc >= 3 && strcmp(argv[1], "peak") == 0)
        return run_peak(atoi(argv[2]));
    if (argc >= 9 && strcmp(argv[1], "attn") == 0)
        return run_attn(atoi(argv[2]), argv[3], argv[4], atol(argv[5]), atol(argv[6]),
                        atoi(argv[7]), argc > 8 ? atol(argv[8]) : 16, argc > 9 ? atol(argv[9]) : 1);
    if (argc >= 8 && strcmp(argv[1], "attn") == 0)
        return run_attn(atoi(argv[2]), argv[3], argv[4], atol(argv[5]), atol(argv[6]),
                        atoi(argv[7]), 16, 1);
    fprintf(stderr,
            "usage: %s peak THREADS | attn THREADS DTYPE fwd|bwd N D CAUSAL [HEADS] [BATCH]\n"
            "     | varlen THREADS DTYPE fwd|bwd equal|uniform|ragged TOTAL D CAUSAL [HEADS] [HEADS_KV]\n",
            argv[0]);
    return 2;
}
