/*
 * decode_bench.c - decoding on the CPU backend (flashc_forward_kvcache): one new query per
 * sequence against caches of 1k..128k keys, GQA 8:1 (32 query heads, 4 kv heads), head dim
 * 128, bf16 (or f16, f32), batch 1..64, contiguous and paged (pages of 64 keys, shuffled in
 * the pool).
 * Decoding is memory-bound, so each row reports the bytes of K and V read per second beside
 * this machine's copy rate measured in the same run on the same threads (memcpy of a buffer
 * far larger than the caches, bytes copied per second; the memory bus carries twice that,
 * a read and a write per byte) and a read-only streaming rate (a sum over the buffer).
 *
 *   cc -O2 -std=gnu11 -Iinclude bench/cpu/decode_bench.c -Lbuild -lflashc -lpthread -lm \
 *      -Wl,-rpath,$PWD/build -o build/decode_bench
 *   build/decode_bench [THREADS] [MAX_KV_GIB] [DTYPE] [CASES]
 *     THREADS 0 = all cores; caches whose K+V exceed MAX_KV_GIB (default 2) are skipped;
 *     DTYPE bf16 (default), f16 or f32; CASES a comma-separated list of BATCHxKEYS (e.g.
 *     1x8k,1x128k,8x32k) to run only those shapes (both layouts), default all
 *
 * Prints a markdown table. Each time is the median of 5 calls (DECODE_BENCH_REPS=N: N) after a
 * warm-up; the result of
 * the first call is checked against flashc's reference backend on a small case beforehand.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flashc.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the machine's own rates ---- */

typedef struct stream_arg {
    char *dst;
    const char *src;
    size_t bytes;
    int copy;
    double sum;
} stream_arg;

static void *stream_thread(void *p)
{
    stream_arg *a = p;
    if (a->copy) {
        memcpy(a->dst, a->src, a->bytes);
    } else { /* read only: a sum the compiler cannot drop */
        const uint64_t *s = (const uint64_t *)a->src;
        uint64_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
        for (size_t i = 0; i + 4 <= a->bytes / 8; i += 4) {
            acc0 += s[i];
            acc1 += s[i + 1];
            acc2 += s[i + 2];
            acc3 += s[i + 3];
        }
        a->sum = (double)(acc0 ^ acc1 ^ acc2 ^ acc3);
    }
    return NULL;
}

/* Bytes per second over `threads` threads, each streaming its slice; best of 5. */
static double stream_rate(int threads, size_t bytes, int copy)
{
    char *src = malloc(bytes), *dst = copy ? malloc(bytes) : NULL;
    memset(src, 1, bytes);
    if (dst)
        memset(dst, 0, bytes);
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t tid[256];
        stream_arg args[256];
        size_t slice = bytes / (size_t)threads & ~(size_t)63;
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            args[t].dst = dst ? dst + t * slice : NULL;
            args[t].src = src + t * slice;
            args[t].bytes = slice;
            args[t].copy = copy;
            pthread_create(&tid[t], NULL, stream_thread, &args[t]);
        }
        for (int t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
        double rate = (double)(slice * threads) / (now() - t0);
        best = rate > best ? rate : best;
    }
    free(src);
    free(dst);
    return best;
}

/* ---- decode ---- */

enum { HQ = 32, HKV = 4, D = 128, PAGE = 64 };

typedef struct decode_case {
    int64_t batch, len;
    int paged;
    flashc_dtype dtype;
} decode_case;

static size_t dtype_bytes(flashc_dtype t)
{
    return t == FLASHC_F32 ? 4 : 2;
}

/* 0.1 + a little noise in each dtype (the bytes, not the values, are what is measured, but
 * denormals or NaN would take other paths) */
static void fill(void *buf, size_t n, flashc_dtype t, float base)
{
    for (size_t i = 0; i < n; i++) {
        const float x = base * (1.0f + (float)((uint32_t)(i * 2654435761u) >> 28) / 64.0f);
        if (t == FLASHC_F32) {
            ((float *)buf)[i] = x;
        } else if (t == FLASHC_BF16) {
            uint32_t u;
            memcpy(&u, &x, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        } else { /* f16 of a normal positive x in [2^-14, 65504) */
            uint32_t u;
            memcpy(&u, &x, 4);
            ((uint16_t *)buf)[i] =
                (uint16_t)((((u >> 23) & 0xff) - 112) << 10 | ((u >> 13) & 0x3ff));
        }
    }
}

/* Median seconds of one decode step, or -1 on an error (printed). */
static double time_decode(flashc_backend *be, const decode_case *c, double *kv_bytes)
{
    const int64_t B = c->batch, L = c->len;
    const size_t es = dtype_bytes(c->dtype), row = (size_t)HKV * D * es;
    const int64_t pages_per_seq = (L + PAGE - 1) / PAGE;
    const int64_t cap = c->paged ? pages_per_seq * PAGE : L;
    const size_t cache_bytes = (size_t)(B * cap) * row;
    void *kc = malloc(cache_bytes), *vc = malloc(cache_bytes);
    void *q = malloc((size_t)B * HQ * D * es), *o = malloc((size_t)B * HQ * D * es);
    float *lse = malloc((size_t)B * HQ * sizeof(float));
    int32_t *seqlens = malloc((size_t)B * sizeof(int32_t));
    int32_t *table = malloc((size_t)(B * pages_per_seq) * sizeof(int32_t));
    if (!kc || !vc || !q || !o || !lse || !seqlens || !table) {
        fprintf(stderr, "out of memory for b=%lld len=%lld\n", (long long)B, (long long)L);
        return -1;
    }
    fill(kc, cache_bytes / es, c->dtype, 0.1f);
    fill(vc, cache_bytes / es, c->dtype, 0.1f);
    fill(q, (size_t)(B * HQ * D), c->dtype, 1.0f);
    for (int64_t b = 0; b < B; b++)
        seqlens[b] = (int32_t)L;
    /* pages in a scrambled order, as a serving pool ends up */
    const int64_t np = B * pages_per_seq;
    for (int64_t i = 0; i < np; i++)
        table[i] = (int32_t)((i * 7919) % np);
    int64_t g = 1, a = 7919 % (np ? np : 1);
    for (int64_t x = np, y = a; y; ) { int64_t t = x % y; x = y; y = t; g = x; }
    if (g != 1) /* 7919 not coprime with np: identity order */
        for (int64_t i = 0; i < np; i++)
            table[i] = (int32_t)i;

    flashc_tensor tq = flashc_tensor_contiguous(q, c->dtype, B, 1, HQ, D);
    flashc_tensor to = flashc_tensor_contiguous(o, c->dtype, B, 1, HQ, D);
    flashc_tensor tl = flashc_lse_contiguous(lse, B, HQ, 1);
    flashc_tensor tk, tv;
    if (c->paged) {
        tk = flashc_tensor_contiguous(kc, c->dtype, np, PAGE, HKV, D);
        tv = flashc_tensor_contiguous(vc, c->dtype, np, PAGE, HKV, D);
    } else {
        tk = flashc_tensor_contiguous(kc, c->dtype, B, L, HKV, D);
        tv = flashc_tensor_contiguous(vc, c->dtype, B, L, HKV, D);
    }
    flashc_params p;
    flashc_params_init(&p);
    p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = seqlens;
    if (c->paged) {
        kv.block_table = table;
        kv.max_pages_per_seq = (int32_t)pages_per_seq;
    }
    /* DECODE_BENCH_REPS=N: N timed calls (for profiles), else 5 */
    const char *reps_env = getenv("DECODE_BENCH_REPS");
    const int reps = reps_env && atoi(reps_env) > 5 ? atoi(reps_env) : 5;
    double *times = malloc((size_t)reps * sizeof(double)), result = -1;
    if (!times) {
        fprintf(stderr, "out of memory\n");
        goto done;
    }
    flashc_status st = flashc_forward_kvcache(be, &p, &kv, &tq, &tk, &tv, NULL, NULL, &to, &tl);
    if (st != FLASHC_OK) {
        fprintf(stderr, "flashc_forward_kvcache: %s\n", flashc_last_error());
        goto done;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        flashc_forward_kvcache(be, &p, &kv, &tq, &tk, &tv, NULL, NULL, &to, &tl);
        times[r] = now() - t0;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    result = times[reps / 2];
    *kv_bytes = 2.0 * (double)(B * L) * (double)row;
done:
    free(times);
    free(kc);
    free(vc);
    free(q);
    free(o);
    free(lse);
    free(seqlens);
    free(table);
    return result;
}

/* The decode against the reference backend on a small paged case, so a fast wrong answer
 * cannot be reported. */
static int sanity(flashc_backend *be)
{
    flashc_backend *ref;
    if (flashc_backend_create("reference", NULL, &ref) != FLASHC_OK)
        return 0;
    enum { B = 2, L = 300, NP = 12 };
    static float k[NP * PAGE * HKV * D], v[NP * PAGE * HKV * D], q[B * HQ * D];
    static float o1[B * HQ * D], o2[B * HQ * D], l1[B * HQ], l2[B * HQ];
    uint32_t x = 1;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        x = x * 1664525u + 1013904223u;
        k[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
        x = x * 1664525u + 1013904223u;
        v[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    int32_t lens[B] = {L, 77}, table[B * 6] = {11, 3, 5, 0, 1, 2, 4, 6, 7, 8, 9, 10};
    flashc_tensor tq = flashc_tensor_contiguous(q, FLASHC_F32, B, 1, HQ, D);
    flashc_tensor tk = flashc_tensor_contiguous(k, FLASHC_F32, NP, PAGE, HKV, D);
    flashc_tensor tv = flashc_tensor_contiguous(v, FLASHC_F32, NP, PAGE, HKV, D);
    flashc_tensor ta = flashc_tensor_contiguous(o1, FLASHC_F32, B, 1, HQ, D);
    flashc_tensor tb = flashc_tensor_contiguous(o2, FLASHC_F32, B, 1, HQ, D);
    flashc_tensor la = flashc_lse_contiguous(l1, B, HQ, 1), lb = flashc_lse_contiguous(l2, B, HQ, 1);
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = lens;
    kv.block_table = table;
    kv.max_pages_per_seq = 6;
    int ok = flashc_forward_kvcache(be, NULL, &kv, &tq, &tk, &tv, NULL, NULL, &ta, &la) == 0 &&
             flashc_forward_kvcache(ref, NULL, &kv, &tq, &tk, &tv, NULL, NULL, &tb, &lb) == 0;
    double num = 0, den = 0;
    for (int i = 0; i < B * HQ * D; i++) {
        num += (o1[i] - o2[i]) * (double)(o1[i] - o2[i]);
        den += (double)o2[i] * o2[i];
    }
    flashc_backend_destroy(ref);
    printf("check: decode vs reference, relative error %.2e\n\n", sqrt(num / den));
    return ok && sqrt(num / den) < 1e-5;
}

/* 1 if BATCHxKEYS (keys as 8k or 8192) is in the comma-separated list, or there is none. */
static int wanted(const char *list, int64_t batch, int64_t len)
{
    if (!list)
        return 1;
    for (const char *p = list; *p;) {
        char *end;
        long long b = strtoll(p, &end, 10);
        if (*end != 'x')
            return 0;
        long long l = strtoll(end + 1, &end, 10);
        if (*end == 'k')
            l *= 1024, end++;
        if (b == batch && l == len)
            return 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    double max_gib = argc > 2 ? atof(argv[2]) : 2.0;
    const char *dname = argc > 3 ? argv[3] : "bf16", *cases = argc > 4 ? argv[4] : NULL;
    flashc_dtype dtype = FLASHC_BF16;
    if (strcmp(dname, "f16") == 0)
        dtype = FLASHC_F16;
    else if (strcmp(dname, "f32") == 0)
        dtype = FLASHC_F32;
    else if (strcmp(dname, "bf16") != 0) {
        fprintf(stderr, "dtype %s: bf16, f16 or f32\n", dname);
        return 1;
    }
    if (threads <= 0)
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = threads;
    flashc_backend *be;
    if (flashc_backend_create("cpu", &cfg, &be) != FLASHC_OK) {
        fprintf(stderr, "%s\n", flashc_last_error());
        return 1;
    }
    printf("backend: %s\n", flashc_backend_describe(be));
    if (!sanity(be)) {
        fprintf(stderr, "decode disagrees with the reference: no timings\n");
        return 1;
    }
    const size_t stream_bytes = (size_t)1 << 30;
    const double copy = stream_rate(threads, stream_bytes, 1);
    const double read = stream_rate(threads, stream_bytes, 0);
    printf("threads %d: memcpy %.2f GB/s (bytes copied; the bus moves twice that), "
           "read-only stream %.2f GB/s\n\n",
           threads, copy / 1e9, read / 1e9);
    printf("dtype %s\n\n", dname);
    printf("| batch | cache | layout | ms | K+V GB/s | %% of copy | %% of read |\n");
    printf("|---|---|---|---|---|---|---|\n");
    const int64_t batches[] = {1, 8, 64}, lens[] = {1024, 8192, 32768, 131072};
    for (int bi = 0; bi < 3; bi++)
        for (int li = 0; li < 4; li++)
            for (int paged = 0; paged < 2; paged++) {
                decode_case c = {batches[bi], lens[li], paged, dtype};
                double gib = 2.0 * (double)(c.batch * c.len) * HKV * D *
                             (double)dtype_bytes(dtype) / (1 << 30);
                if (gib > max_gib || !wanted(cases, c.batch, c.len))
                    continue;
                double bytes = 0, t = time_decode(be, &c, &bytes);
                if (t < 0)
                    return 1;
                double rate = bytes / t;
                printf("| %lld | %lldk | %s | %.3f | %.2f | %.0f%% | %.0f%% |\n",
                       (long long)c.batch, (long long)(c.len / 1024),
                       paged ? "paged 64" : "contiguous", 1e3 * t, rate / 1e9,
                       100.0 * rate / copy, 100.0 * rate / read);
                fflush(stdout);
            }
    flashc_backend_destroy(be);
    return 0;
}
