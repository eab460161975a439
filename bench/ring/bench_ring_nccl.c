/*
 * bench_ring_nccl.c - times ring attention over NCCL against one GPU: for each total
 * sequence length and causal mode, flashc_forward / flashc_backward of the whole sequence on
 * one GPU, then flashc_ring_forward_nccl / _backward_nccl with the sequence split over W GPUs
 * (the zig-zag split, which also serves the non-causal case), one process with one thread
 * per GPU. Prints each row and writes a markdown table to bench/results/.
 *
 * Times are the median of a few runs (one when a run is long). A ring call's time runs from
 * the earliest rank's start to the latest rank's return, and includes what the call does
 * besides attention (its buffers, the K/V packing, the merges), as a caller sees it; the
 * one-GPU backward gets its workspace up front. Scaling efficiency is T(1 GPU) / (W * T(ring)).
 * FLOPs count the whole sequence: 4*B*H*N^2*D forward, x2.5 backward, x0.5 causal.
 *
 *     bench_ring_nccl [--ranks W] [--seqlens 131072,262144,524288,1048576] [--batch 1]
 *                     [--heads 16] [--kv-heads 16] [--dim 128] [--f16] [--causal | --no-causal]
 *                     [--reps 3] [--quick] [--no-single] [--commit HASH] [--out FILE]
 *
 * --quick: 32k and 128k tokens, 2 runs each. With W = 1 the ring has one rank, and the rows
 * measure its overhead over one flashc call rather than any scaling.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv, clock_gettime under -std=c11 */
#endif
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "flashc_ring.h"

#define MAX_RANKS 64
#define MAX_SEQLENS 32
#define MAX_REPS 16

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

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- settings and ranks ---------------------------------------------------------------- */

static int64_t g_B = 1, g_H = 16, g_Hkv = 16, g_D = 128;
static flashc_dtype g_dt = FLASHC_BF16;
static int g_reps = 3, g_world;
/* a measurement stops after this many seconds of runs, however few */
static const double g_budget = 8.0;

typedef struct rank_ctx {
    int rank, device;
    ncclComm_t comm;
    cudaStream_t stream;
    flashc_backend *be;
    /* one configuration */
    int64_t N;
    int causal;
    flashc_status st;
    char msg[600];
    double t[MAX_REPS][4]; /* forward start, end, backward start, end */
} rank_ctx;

static rank_ctx g_ranks[MAX_RANKS];
static pthread_barrier_t g_barrier;
static int g_runs; /* runs done by the ring, decided by rank 0 between runs */
static volatile int g_stop;

/* Fills device memory with pseudo-random values of the dtype in [-1, 1): one host chunk,
 * then doubling device-to-device copies (the values repeat; the timing does not care). */
static int fill(void *dst, size_t elems, uint64_t seed)
{
    const size_t chunk = elems < ((size_t)1 << 22) ? elems : ((size_t)1 << 22);
    if (elems == 0)
        return 1;
    uint16_t *h = malloc(chunk * 2);
    if (!h)
        return 0;
    for (size_t i = 0; i < chunk; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float f = (float)((double)(seed >> 40) / 8388608.0 - 1.0);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (g_dt == FLASHC_BF16) {
            h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        } else { /* |f| < 1: a normal or zero fp16, truncated - fine for timing */
            uint32_t e = (u >> 23) & 0xff;
            h[i] = (uint16_t)(((u >> 16) & 0x8000u) |
                              (e < 113 ? 0 : (((e - 112) << 10) | ((u >> 13) & 0x3ffu))));
        }
    }
    int ok = cudaMemcpy(dst, h, chunk * 2, cudaMemcpyHostToDevice) == cudaSuccess;
    free(h);
    for (size_t done = chunk; ok && done < elems; done *= 2) {
        size_t n = elems - done < done ? elems - done : done;
        ok = cudaMemcpy((uint16_t *)dst + done, dst, n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess;
    }
    return ok && cudaDeviceSynchronize() == cudaSuccess;
}

/* ---- one GPU ------------------------------------------------------------------------------ */

/* flashc_forward / flashc_backward of the whole sequence on rank 0's device: medians in tf,
 * tb; 0 when it does not run (memory), with the reason in msg. */
static int single_gpu(int64_t N, int causal, double *tf, double *tb, int *runs, char *msg,
                      size_t cap)
{
    rank_ctx *x = &g_ranks[0];
    cudaSetDevice(x->device);
    const size_t nq = (size_t)(g_B * N * g_H * g_D), nk = (size_t)(g_B * N * g_Hkv * g_D);
    const size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk}; /* q k v o dO dq dk dv */
    void *d[8] = {0}, *lse = NULL, *ws = NULL;
    int ok = 1;
    for (int i = 0; i < 8 && ok; i++)
        ok = flashc_backend_malloc(x->be, sizes[i] * 2, &d[i]) == FLASHC_OK;
    ok = ok && flashc_backend_malloc(x->be, (size_t)(g_B * g_H * N) * 4, &lse) == FLASHC_OK;
    flashc_tensor t[8];
    const int64_t heads[8] = {g_H, g_Hkv, g_Hkv, g_H, g_H, g_H, g_Hkv, g_Hkv};
    for (int i = 0; i < 8; i++)
        t[i] = flashc_tensor_contiguous(d[i], g_dt, g_B, N, heads[i], g_D);
    flashc_tensor tl = flashc_lse_contiguous(lse, g_B, g_H, N);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;
    p.stream = x->stream;
    size_t wsb = 0;
    ok = ok && flashc_backward_workspace_size(x->be, &p, &t[0], &t[1], &wsb) == FLASHC_OK;
    ok = ok && (wsb == 0 || flashc_backend_malloc(x->be, wsb, &ws) == FLASHC_OK);
    if (!ok) {
        snprintf(msg, cap, "one GPU: %s", flashc_last_error());
        goto out;
    }
    p.workspace = ws, p.workspace_size = wsb;
    ok = fill(d[0], nq, 1) && fill(d[1], nk, 2) && fill(d[2], nk, 3) && fill(d[4], nq, 4);
    if (!ok) {
        snprintf(msg, cap, "one GPU: filling the inputs failed");
        goto out;
    }
    double f[MAX_REPS], b[MAX_REPS], spent = 0;
    int n = 0;
    while (n < g_reps && (n == 0 || spent < g_budget)) {
        double t0 = now();
        ok = flashc_forward(x->be, &p, &t[0], &t[1], &t[2], &t[3], &tl) == FLASHC_OK &&
             cudaStreamSynchronize(x->stream) == cudaSuccess;
        double t1 = now();
        ok = ok && flashc_backward(x->be, &p, &t[4], &t[0], &t[1], &t[2], &t[3], &tl, &t[5], &t[6],
                                   &t[7]) == FLASHC_OK &&
             cudaStreamSynchronize(x->stream) == cudaSuccess;
        double t2 = now();
        if (!ok) {
            snprintf(msg, cap, "one GPU: %s", flashc_last_error());
            goto out;
        }
        f[n] = t1 - t0, b[n] = t2 - t1, spent += t2 - t0;
        n++;
    }
    *tf = median(f, n), *tb = median(b, n), *runs = n;
out:
    for (int i = 0; i < 8; i++)
        flashc_backend_free(x->be, d[i]);
    flashc_backend_free(x->be, lse);
    flashc_backend_free(x->be, ws);
    return ok;
}

/* ---- the ring ----------------------------------------------------------------------------- */

static void *rank_run(void *arg)
{
    rank_ctx *x = arg;
    x->st = FLASHC_OK, x->msg[0] = 0;
    cudaSetDevice(x->device);
    int64_t st[2], len[2];
    flashc_ring_zigzag_rows(x->N, g_world, x->rank, st, len);
    const int64_t n = len[0] + len[1];
    const size_t nq = (size_t)(g_B * n * g_H * g_D), nk = (size_t)(g_B * n * g_Hkv * g_D);
    const size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    void *d[8] = {0}, *lse = NULL;
    int ok = 1;
    for (int i = 0; i < 8 && ok; i++)
        ok = flashc_backend_malloc(x->be, sizes[i] * 2, &d[i]) == FLASHC_OK;
    ok = ok && flashc_backend_malloc(x->be, (size_t)(g_B * g_H * n) * 4, &lse) == FLASHC_OK;
    ok = ok && fill(d[0], nq, 11 + (uint64_t)x->rank) && fill(d[1], nk, 23 + (uint64_t)x->rank) &&
         fill(d[2], nk, 37 + (uint64_t)x->rank) && fill(d[4], nq, 41 + (uint64_t)x->rank);
    if (!ok) {
        x->st = FLASHC_ERROR_OUT_OF_MEMORY;
        snprintf(x->msg, sizeof x->msg, "rank %d: setup: %s", x->rank, flashc_last_error());
    }
    flashc_tensor t[8];
    const int64_t heads[8] = {g_H, g_Hkv, g_Hkv, g_H, g_H, g_H, g_Hkv, g_Hkv};
    for (int i = 0; i < 8; i++)
        t[i] = flashc_tensor_contiguous(d[i], g_dt, g_B, n, heads[i], g_D);
    flashc_tensor tl = flashc_lse_contiguous(lse, g_B, g_H, n);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = x->causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;
    /* every rank calls the ring whatever its setup did: a rank that failed passes tensors
     * with NULL data, is refused by its own checks, and every other rank is told */
    for (int r = 0;; r++) {
        pthread_barrier_wait(&g_barrier);
        x->t[r][0] = now();
        flashc_status s = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, x->N, &t[0],
                                                   &t[1], &t[2], &t[3], &tl);
        x->t[r][1] = now();
        if (s == FLASHC_OK) {
            pthread_barrier_wait(&g_barrier);
            x->t[r][2] = now();
            s = flashc_ring_backward_nccl(x->comm, x->stream, x->be, &p, x->N, &t[4], &t[0], &t[1],
                                          &t[2], &t[3], &tl, &t[5], &t[6], &t[7]);
            x->t[r][3] = now();
        }
        if (s != FLASHC_OK && x->st == FLASHC_OK) {
            x->st = s;
            snprintf(x->msg, sizeof x->msg, "rank %d: %s", x->rank, flashc_ring_last_error());
        }
        /* every rank has the same outcome (the ring agrees on it), so every rank leaves the
         * loop at the same run */
        pthread_barrier_wait(&g_barrier);
        if (x->rank == 0) {
            double spent = 0;
            for (int i = 0; i <= r; i++)
                spent += x->t[i][3] - x->t[i][0];
            g_runs = r + 1;
            g_stop = s != FLASHC_OK || r + 1 >= g_reps || spent >= g_budget;
        }
        pthread_barrier_wait(&g_barrier);
        if (g_stop)
            break;
    }
    for (int i = 0; i < 8; i++)
        flashc_backend_free(x->be, d[i]);
    flashc_backend_free(x->be, lse);
    return NULL;
}

/* The ring on every rank; medians of the slowest-rank spans in tf, tb. */
static int ring(int64_t N, int causal, double *tf, double *tb, int *runs, char *msg, size_t cap)
{
    pthread_t th[MAX_RANKS];
    pthread_barrier_init(&g_barrier, NULL, (unsigned)g_world);
    g_stop = 0;
    for (int r = 0; r < g_world; r++) {
        g_ranks[r].N = N, g_ranks[r].causal = causal;
        pthread_create(&th[r], NULL, rank_run, &g_ranks[r]);
    }
    for (int r = 0; r < g_world; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g_barrier);
    for (int r = 0; r < g_world; r++)
        if (g_ranks[r].st != FLASHC_OK) {
            snprintf(msg, cap, "ring: %s", g_ranks[r].msg);
            return 0;
        }
    double f[MAX_REPS], b[MAX_REPS];
    for (int i = 0; i < g_runs; i++) {
        double f0 = INFINITY, f1 = -INFINITY, b0 = INFINITY, b1 = -INFINITY;
        for (int r = 0; r < g_world; r++) {
            const double *t = g_ranks[r].t[i];
            f0 = fmin(f0, t[0]), f1 = fmax(f1, t[1]), b0 = fmin(b0, t[2]), b1 = fmax(b1, t[3]);
        }
        f[i] = f1 - f0, b[i] = b1 - b0;
    }
    *tf = median(f, g_runs), *tb = median(b, g_runs), *runs = g_runs;
    return 1;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int parse_list(const char *s, int64_t *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s)
            break;
        if (*end == 'k' || *end == 'K')
            v *= 1024, end++;
        else if (*end == 'm' || *end == 'M')
            v *= 1024 * 1024, end++;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_ring_nccl [--ranks W] [--seqlens N,N,...] [--batch B] [--heads H] "
                    "[--kv-heads H] [--dim D] [--f16] [--causal | --no-causal] [--reps R] "
                    "[--quick] [--no-single] [--commit HASH] [--out FILE]\n");
}

int main(int argc, char **argv)
{
    int want = 0, modes = 3 /* bit 0: not causal, bit 1: causal */, quick = 0, with_single = 1;
    int64_t seqlens[MAX_SEQLENS] = {131072, 262144, 524288, 1048576};
    int nseq = 4;
    const char *commit = "unknown", *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ranks") && v) want = atoi(v), i++;
        else if (!strcmp(a, "--seqlens") && v) nseq = parse_list(v, seqlens, MAX_SEQLENS), i++;
        else if (!strcmp(a, "--batch") && v) g_B = atoll(v), i++;
        else if (!strcmp(a, "--heads") && v) g_H = atoll(v), i++;
        else if (!strcmp(a, "--kv-heads") && v) g_Hkv = atoll(v), i++;
        else if (!strcmp(a, "--dim") && v) g_D = atoll(v), i++;
        else if (!strcmp(a, "--reps") && v) g_reps = atoi(v), i++;
        else if (!strcmp(a, "--commit") && v) commit = v, i++;
        else if (!strcmp(a, "--out") && v) out_path = v, i++;
        else if (!strcmp(a, "--f16")) g_dt = FLASHC_F16;
        else if (!strcmp(a, "--causal")) modes = 2;
        else if (!strcmp(a, "--no-causal")) modes = 1;
        else if (!strcmp(a, "--no-single")) with_single = 0;
        else if (!strcmp(a, "--quick")) quick = 1;
        else {
            usage();
            return 2;
        }
    }
    if (quick) {
        seqlens[0] = 32768, seqlens[1] = 131072, nseq = 2;
        g_reps = 2;
    }
    if (g_reps < 1) g_reps = 1;
    if (g_reps > MAX_REPS) g_reps = MAX_REPS;
    if (nseq < 1 || g_B < 1 || g_H < 1 || g_Hkv < 1 || g_H % g_Hkv || g_D < 8) {
        usage();
        return 2;
    }
    /* NVLink multicast (NVLS) is not needed by point-to-point rings; keep it off */
    setenv("NCCL_NVLS_ENABLE", "0", 1);

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_ring_nccl: no CUDA device\n");
        return 1;
    }
    if (ndev > MAX_RANKS) ndev = MAX_RANKS;
    g_world = want > 0 ? want : ndev;
    if (g_world > ndev) {
        fprintf(stderr, "--ranks %d: only %d device(s) visible\n", want, ndev);
        return 2;
    }
    int devs[MAX_RANKS];
    ncclComm_t comms[MAX_RANKS];
    for (int r = 0; r < g_world; r++)
        devs[r] = r;
    ncclResult_t nr = ncclCommInitAll(comms, g_world, devs);
    if (nr != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetErrorString(nr));
        return 1;
    }
    for (int r = 0; r < g_world; r++) {
        rank_ctx *x = &g_ranks[r];
        x->rank = r, x->device = devs[r], x->comm = comms[r];
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.device = devs[r];
        cudaSetDevice(devs[r]);
        if (cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess ||
            flashc_backend_create("cuda", &cfg, &x->be) != FLASHC_OK) {
            fprintf(stderr, "device %d: %s\n", devs[r], flashc_last_error());
            return 1;
        }
    }

    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int nccl_v = 0, rt_v = 0, drv_v = 0;
    ncclGetVersion(&nccl_v);
    cudaRuntimeGetVersion(&rt_v);
    cudaDriverGetVersion(&drv_v);
    char date[16], gpu[sizeof prop.name];
    time_t tnow = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&tnow));
    snprintf(gpu, sizeof gpu, "%s", prop.name);
    for (char *c = gpu; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            *c = '_';
    char path[sizeof gpu + 128];
    if (!out_path) {
        snprintf(path, sizeof path, "bench/results/ring_nccl_%s_%s_x%d%s.md", date, gpu, g_world,
                 quick ? "_quick" : "");
        out_path = path;
    }

    /* one small run of each path first: module loading, NCCL connections, allocator pools */
    {
        double a, b;
        int n, saved = g_reps;
        char m[600];
        g_reps = 1;
        if (!single_gpu(4096, 1, &a, &b, &n, m, sizeof m) || !ring(4096, 1, &a, &b, &n, m, sizeof m))
            fprintf(stderr, "warm-up: %s\n", m);
        g_reps = saved;
    }

    char head[2048];
    snprintf(head, sizeof head,
             "# Ring attention over NCCL: %d x %s, %s\n\n"
             "Commit %s; NCCL %d.%d.%d; CUDA runtime %d.%d, driver %d.%d; %s.\n"
             "Batch %lld, heads %lld/%lld, head dim %lld, %s; one process, one thread per GPU;\n"
             "NCCL_NVLS_ENABLE=0. The ring holds the zig-zag split, N/W rows per GPU.\n"
             "Seconds: median of up to %d runs (fewer once a configuration has run %.0f s); a ring call\n"
             "is timed from the first rank's start to the last rank's return, its own buffers and merges\n"
             "included; the one-GPU backward has its workspace allocated beforehand.\n"
             "Speedup = T(1 GPU) / T(ring); efficiency = speedup / W. TFLOP/s per GPU counts the whole\n"
             "sequence (4*B*H*N^2*D forward, x2.5 backward, x0.5 causal) over W GPUs.\n",
             g_world, prop.name, date, commit, nccl_v / 10000, (nccl_v / 100) % 100, nccl_v % 100,
             rt_v / 1000, (rt_v % 1000) / 10, drv_v / 1000, (drv_v % 1000) / 10,
             flashc_backend_describe(g_ranks[0].be), (long long)g_B, (long long)g_H,
             (long long)g_Hkv, (long long)g_D, g_dt == FLASHC_BF16 ? "bf16" : "fp16", g_reps,
             g_budget);
    const char *caveat =
        g_world == 1 ? "\n**One GPU:** the ring has a single rank, so these rows show what the ring "
                       "adds to one flashc call\n(its buffers, packing, merges, the split into "
                       "planned calls), not scaling.\n"
                     : "";
    const char *cols =
        "\n| GPUs | seqlen | rows/GPU | causal | 1 GPU fwd s | ring fwd s | fwd speedup | fwd eff. "
        "| ring fwd TFLOP/s/GPU | 1 GPU bwd s | ring bwd s | bwd speedup | bwd eff. "
        "| ring bwd TFLOP/s/GPU | runs |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    printf("%s%s%s", head, caveat, cols);
    fflush(stdout);
    char *rows = calloc(1, 1 << 16);
    size_t used = 0;
    int failed = 0;
    for (int m = 0; m < 2; m++) {
        if (!(modes & (1 << m)))
            continue;
        const int causal = m;
        for (int i = 0; i < nseq; i++) {
            const int64_t N = seqlens[i];
            char line[1024], msg[600] = "", e1[32] = "-", e2[32] = "-", e3[32] = "-", e4[32] = "-";
            char e5[32] = "-", e6[32] = "-";
            double sf = 0, sb = 0, rf = 0, rb = 0;
            int sruns = 0, rruns = 0;
            if (N < 2 * (int64_t)g_world) {
                fprintf(stderr, "seqlen %lld: fewer than 2 rows per GPU, skipped\n", (long long)N);
                continue;
            }
            int s_ok = with_single && single_gpu(N, causal, &sf, &sb, &sruns, msg, sizeof msg);
            if (with_single && !s_ok)
                fprintf(stderr, "seqlen %lld causal %d: %s\n", (long long)N, causal, msg);
            int r_ok = ring(N, causal, &rf, &rb, &rruns, msg, sizeof msg);
            if (!r_ok) {
                fprintf(stderr, "seqlen %lld causal %d: %s\n", (long long)N, causal, msg);
                failed = 1;
            }
            const double flops = 4.0 * (double)g_B * (double)g_H * (double)N * (double)N *
                                 (double)g_D * (causal ? 0.5 : 1.0);
            if (s_ok) {
                snprintf(e1, sizeof e1, "%.4f", sf);
                snprintf(e4, sizeof e4, "%.4f", sb);
            }
            if (r_ok) {
                snprintf(e2, sizeof e2, "%.4f", rf);
                snprintf(e5, sizeof e5, "%.4f", rb);
            }
            char sp_f[48] = "-", sp_b[48] = "-";
            if (s_ok && r_ok) {
                snprintf(sp_f, sizeof sp_f, "%.2fx | %.0f%%", sf / rf, 100.0 * sf / (g_world * rf));
                snprintf(sp_b, sizeof sp_b, "%.2fx | %.0f%%", sb / rb, 100.0 * sb / (g_world * rb));
            } else {
                snprintf(sp_f, sizeof sp_f, "- | -");
                snprintf(sp_b, sizeof sp_b, "- | -");
            }
            if (r_ok) {
                snprintf(e3, sizeof e3, "%.1f", flops / rf / g_world * 1e-12);
                snprintf(e6, sizeof e6, "%.1f", 2.5 * flops / rb / g_world * 1e-12);
            }
            snprintf(line, sizeof line,
                     "| %d | %lld | %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d/%d |%s\n",
                     g_world, (long long)N, (long long)(N / g_world), causal ? "yes" : "no", e1, e2,
                     sp_f, e3, e4, e5, sp_b, e6, sruns, rruns, r_ok ? "" : " ring FAILED");
            printf("%s", line);
            fflush(stdout);
            size_t l = strlen(line);
            if (rows && used + l < (1 << 16)) {
                memcpy(rows + used, line, l + 1);
                used += l;
            }
        }
    }
    FILE *f = fopen(out_path, "w");
    if (f) {
        fprintf(f, "%s%s%s%s", head, caveat, cols, rows ? rows : "");
        fclose(f);
        printf("written: %s\n", out_path);
    } else {
        fprintf(stderr, "cannot write %s (run from the repository root, or pass --out)\n", out_path);
    }
    free(rows);
    for (int r = 0; r < g_world; r++) {
        flashc_backend_destroy(g_ranks[r].be);
        cudaSetDevice(g_ranks[r].device);
        cudaStreamDestroy(g_ranks[r].stream);
        ncclCommDestroy(g_ranks[r].comm);
    }
    return failed;
}
