/*
 * check_util.h - what the standalone Hopper checks share: the CUDA error check, host
 * conversions to and from fp16/bf16 bit patterns, the xorshift generator of their inputs, and
 * waiting for the device with a time limit: a deadlocked pipeline (or a semaphore that never
 * arrives) is reported as HANG and the program exits 3, instead of hanging the run. The limit
 * is 30 s, or FLASHC_HANG_SECONDS: under compute-sanitizer's racecheck every shared-memory
 * access is instrumented and a kernel that takes milliseconds can take minutes. Also a
 * parallel for over all cores, for the float64 references, and a filter of the timed shapes.
 */
#ifndef FLASHC_TESTS_CHECK_UTIL_H
#define FLASHC_TESTS_CHECK_UTIL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

/* FC_BENCH_SHAPE="bf16,128,0,4096" (dtype, head dim, causal, seqlen) keeps the timing part to
 * that one shape and drops the feature timings, so a profiler sees few launches. */
static int bench_shape_skipped(int bf16, int d, int causal, int seqlen)
{
    const char *f = getenv("FC_BENCH_SHAPE");
    if (!f || !*f) return 0;
    char dt[8];
    int fd, fc, fs;
    if (sscanf(f, "%7[^,],%d,%d,%d", dt, &fd, &fc, &fs) != 4) return 0;
    return strcmp(dt, bf16 ? "bf16" : "fp16") || fd != d || fc != causal || fs != seqlen;
}

static int bench_features_skipped(void) { return getenv("FC_BENCH_SHAPE") && *getenv("FC_BENCH_SHAPE"); }

static uint16_t to16(float x, int bf16)
{
    if (bf16) {
        __nv_bfloat16 h = __float2bfloat16_rn(x);
        uint16_t u;
        memcpy(&u, &h, 2);
        return u;
    }
    __half h = __float2half_rn(x);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float from16(uint16_t u, int bf16)
{
    if (bf16) {
        uint32_t w = (uint32_t)u << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

static long hang_limit_seconds(void)
{
    const char *env = getenv("FLASHC_HANG_SECONDS");
    const long s = env ? strtol(env, NULL, 10) : 0;
    return s > 0 ? s : 30;
}

static void sync_or_die(const char *what)
{
    const time_t t0 = time(NULL);
    const long limit = hang_limit_seconds();
    for (;;) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            fprintf(stderr, "FAIL %s: %s\n", what, cudaGetErrorString(e));
            exit(2);
        }
        if (time(NULL) - t0 > limit) {
            printf("HANG %s: kernel did not finish in %ld s\n", what, limit);
            fflush(stdout);
            exit(3);
        }
    }
}

/* ---- a parallel for over [0, n) on all cores ----------------------------------------------- */

typedef void (*range_fn)(void *ctx, long lo, long hi);
typedef struct par_job {
    range_fn fn;
    void *ctx;
    long n, next;
    pthread_mutex_t mu;
} par_job;

static void *par_worker(void *arg)
{
    par_job *j = (par_job *)arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        const long lo = j->next;
        const long chunk = j->n / 256 + 1;
        j->next += chunk;
        pthread_mutex_unlock(&j->mu);
        if (lo >= j->n) break;
        j->fn(j->ctx, lo, lo + chunk < j->n ? lo + chunk : j->n);
    }
    return NULL;
}

static void par_for(long n, range_fn fn, void *ctx)
{
    static int nthreads = 0;
    if (!nthreads) {
        nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (nthreads < 1) nthreads = 1;
        if (nthreads > 64) nthreads = 64;
    }
    par_job j;
    j.fn = fn, j.ctx = ctx, j.n = n, j.next = 0;
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[64];
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, par_worker, &j);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
}

#endif
