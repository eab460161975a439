/*
 * test_ring_nccl.c - ring attention over NCCL (flashc_ring_forward_nccl / _backward_nccl)
 * against flashc_forward / flashc_backward on the whole sequence on one device (CUDA
 * backend) and, on the cases small enough, against the float64 "reference" backend.
 *
 * One process drives every rank: one host thread per GPU, each with its own communicator
 * (from one ncclCommInitAll), stream and CUDA backend handle, since a ring call is
 * collective and blocks its thread until every rank has taken part. For each case the full
 * Q, K, V and dO are drawn on the host; each rank takes its rows - the zig-zag split of
 * flashc_ring.h when causal, deliberately unequal contiguous blocks when not - into a
 * contiguous, BHSD or padded local layout whose gaps hold NaN, and its outputs start as NaN
 * over their whole extent. After the ring forward and backward every element of every output
 * view must be written and finite, no gap may change, and the gathered O, LSE, dQ, dK, dV
 * are held to the bars of test_ring_mpi: relative error 1e-3 (fp16) or 1e-2 (bf16), LSE
 * 1e-5. Deterministic cases run the backward twice and require the same bits. Then bad
 * arguments on one rank: every rank must return an error (none left waiting), and a valid
 * call must work afterwards.
 *
 *     test_ring_nccl [--ranks N] [--quick] [--filter SUBSTRING] [--timeout SECONDS]
 *
 * The world is every visible GPU, or the first N. Exit status: 0 when every check passed, 1
 * when one failed, 77 when there is no CUDA device (ctest reads it as a skip), 3 when a ring
 * call hangs (a watchdog ends the process, since a collective that waits forever is the
 * failure that matters most here).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv, sysconf, clock_gettime under -std=c11 */
#endif
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "flashc_ring.h"

#define MAX_RANKS 64

/* ---- 16-bit floats and random numbers ----------------------------------------------------- */

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00;
    if (ax >= 0x477ff000u) /* 65520 and up round to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, rounded to nearest even */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    uint32_t r = ax - 0x38000000u; /* exponent bias 127 -> 15 */
    r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
    return sign | (uint16_t)r;
}

static float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_half(flashc_dtype dt, float f)
{
    return dt == FLASHC_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

static float from_half(flashc_dtype dt, uint16_t h)
{
    return dt == FLASHC_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static uint16_t half_nan(flashc_dtype dt)
{
    return dt == FLASHC_BF16 ? 0x7fc0 : 0x7e00;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(splitmix(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- local layouts ------------------------------------------------------------------------ */

enum { L_BSHD, L_BHSD, L_PADDED };
static const char *layout_names[] = {"bshd", "bhsd", "padded"};

/* A [b, n, h, d] view with the case's layout and the elements it spans from data[0]. The
 * padded one leaves gaps after each head, each row and each batch (strides stay multiples of
 * 8, as the CUDA kernels' vector loads need). */
typedef struct view {
    flashc_tensor t;
    size_t extent;
} view;

static view make_view(flashc_dtype dt, int layout, int64_t b, int64_t n, int64_t h, int64_t d)
{
    view v;
    memset(&v, 0, sizeof v);
    int64_t *st = v.t.stride;
    if (layout == L_BHSD) {
        st[0] = h * n * d, st[1] = d, st[2] = n * d;
    } else if (layout == L_PADDED) {
        st[2] = d + 16, st[1] = h * st[2] + 8, st[0] = n * st[1] + 24;
    } else {
        st[0] = n * h * d, st[1] = h * d, st[2] = d;
    }
    st[3] = 1;
    v.t.dtype = dt;
    v.t.ndim = 4;
    v.t.shape[0] = b, v.t.shape[1] = n, v.t.shape[2] = h, v.t.shape[3] = d;
    v.extent = (size_t)(1 + (b - 1) * st[0] + (n - 1) * st[1] + (h - 1) * st[2] + (d - 1));
    return v;
}

/* The LSE [b, h, n]: contiguous, or with gaps after each head's row and each batch. */
static view make_lse_view(int layout, int64_t b, int64_t h, int64_t n)
{
    view v;
    memset(&v, 0, sizeof v);
    v.t.dtype = FLASHC_F32;
    v.t.ndim = 3;
    v.t.shape[0] = b, v.t.shape[1] = h, v.t.shape[2] = n;
    int64_t *st = v.t.stride;
    st[2] = 1;
    st[1] = layout == L_PADDED ? n + 5 : n;
    st[0] = layout == L_PADDED ? h * st[1] + 3 : h * n;
    v.extent = (size_t)(1 + (b - 1) * st[0] + (h - 1) * st[1] + (n - 1));
    return v;
}

/* 1 for the elements of the view, 0 for its gaps. */
static unsigned char *view_map(const view *v)
{
    unsigned char *m = calloc(v->extent, 1);
    if (!m)
        return NULL;
    const int64_t *s = v->t.stride, *n = v->t.shape;
    if (v->t.ndim == 3) {
        for (int64_t b = 0; b < n[0]; b++)
            for (int64_t h = 0; h < n[1]; h++)
                memset(m + b * s[0] + h * s[1], 1, (size_t)n[2]);
        return m;
    }
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t i = 0; i < n[1]; i++)
            for (int64_t h = 0; h < n[2]; h++)
                memset(m + b * s[0] + i * s[1] + h * s[2], 1, (size_t)n[3]);
    return m;
}

/* ---- cases -------------------------------------------------------------------------------- */

enum { N_FIXED = 0, N_FEWEST = 1, N_FEWEST_PLUS_ONE = 2 };

typedef struct ring_case {
    const char *tag;
    flashc_dtype dtype;
    int64_t batch, seqlen, heads_q, heads_kv, head_dim;
    int causal; /* a flashc_causal */
    int layout;
    float scale;
    int deterministic;
    int quick;       /* part of --quick */
    int seqlen_rule; /* N_FEWEST: the fewest rows the split allows for this world */
} ring_case;

static const ring_case cases[] = {
    {"odd length, GQA 4:1", FLASHC_BF16, 1, 1000, 8, 2, 128, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BSHD, 0, 0, 1, 0},
    {"odd length, MQA", FLASHC_F16, 2, 517, 4, 1, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BHSD, 0, 0, 1, 0},
    {"unequal blocks", FLASHC_BF16, 1, 1531, 4, 4, 64, FLASHC_CAUSAL_NONE, L_PADDED, 0, 0, 1, 0},
    {"GQA 2:1, scale 0.3", FLASHC_F16, 2, 263, 4, 2, 128, FLASHC_CAUSAL_NONE, L_BSHD, 0.3f, 0, 0, 0},
    {"top-left causal", FLASHC_F16, 1, 389, 2, 2, 128, FLASHC_CAUSAL_TOP_LEFT, L_PADDED, 0, 0, 0, 0},
    {"deterministic", FLASHC_F16, 1, 777, 4, 2, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BSHD, 0, 1, 1, 0},
    {"deterministic", FLASHC_BF16, 1, 555, 2, 1, 128, FLASHC_CAUSAL_NONE, L_BHSD, 0, 1, 0, 0},
    {"fewest rows", FLASHC_F16, 1, 0, 2, 1, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BSHD, 0, 0, 1, N_FEWEST},
    {"fewest rows + 1", FLASHC_BF16, 2, 0, 2, 2, 128, FLASHC_CAUSAL_BOTTOM_RIGHT, L_PADDED, 0, 0, 0,
     N_FEWEST_PLUS_ONE},
    {"fewest rows", FLASHC_F16, 1, 0, 2, 1, 64, FLASHC_CAUSAL_NONE, L_BSHD, 0, 0, 0, N_FEWEST},
    {"batch 3", FLASHC_BF16, 3, 2053, 4, 2, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BSHD, 0, 0, 0, 0},
    {"long", FLASHC_BF16, 1, 16389, 8, 2, 128, FLASHC_CAUSAL_BOTTOM_RIGHT, L_BSHD, 0, 0, 0, 0},
    {"long", FLASHC_F16, 1, 8195, 8, 8, 64, FLASHC_CAUSAL_NONE, L_BHSD, 0, 0, 0, 0},
};

/* The float64 reference runs where B * Hq * N^2 * D stays below this (seconds on a few cores). */
#define REF_LIMIT 2.5e9

/* ---- the ranks ------------------------------------------------------------------------------ */

typedef struct rank_ctx {
    int rank, device;
    ncclComm_t comm;
    cudaStream_t stream;
    flashc_backend *be;
    /* one case's outcome on this rank */
    int failed;
    char msg[700];
    long nonfinite, gap_writes;
    int det_differs;
    /* the argument checks */
    int checks, fails;
} rank_ctx;

/* What every rank of one case shares: the full inputs and where the gathered results go. */
typedef struct job {
    const ring_case *c;
    int64_t N;
    flashc_params p;
    const uint16_t *q, *k, *v, *dout;   /* full, contiguous [B, N, H, D] */
    float *o, *lse, *dq, *dk, *dv;      /* the ring's results, gathered, same layouts */
} job;

static int g_world;
static rank_ctx g_ranks[MAX_RANKS];
static job g_job;
static int g_timeout = 600;

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "HANG: a ring call did not return within the watchdog's time (if "
                            "CUDA_MODULE_LOADING=EAGER makes it pass, a lazy kernel load waited "
                            "on a transfer)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(3);
}

/* Runs fn on every rank, one thread each, under the watchdog. */
static void run_ranks(void *(*fn)(void *))
{
    pthread_t th[MAX_RANKS];
    alarm((unsigned)g_timeout);
    for (int r = 0; r < g_world; r++)
        if (pthread_create(&th[r], NULL, fn, &g_ranks[r]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(2);
        }
    for (int r = 0; r < g_world; r++)
        pthread_join(th[r], NULL);
    alarm(0);
}

static void fail(rank_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(rank_ctx *x, const char *fmt, ...)
{
    if (x->failed)
        return; /* the first failure explains the rest */
    x->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->msg, sizeof x->msg, fmt, ap);
    va_end(ap);
}

/* This rank's global rows, in local order: the zig-zag chunks r and 2W-1-r when causal,
 * else a contiguous block of about (r + 1) shares of 1 + 2 + ... + W, so that the ranks
 * hold different numbers of rows. */
static int64_t local_rows(int causal, int64_t N, int world, int rank, int64_t *rows)
{
    int64_t n = 0;
    if (causal) {
        int64_t st[2], len[2];
        flashc_ring_zigzag_rows(N, world, rank, st, len);
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < len[i]; j++)
                rows[n++] = st[i] + j;
    } else {
        int64_t shares = (int64_t)world * (world + 1) / 2, before = (int64_t)rank * (rank + 1) / 2;
        int64_t a = N * before / shares, b = N * (before + rank + 1) / shares;
        for (int64_t j = a; j < b; j++)
            rows[n++] = j;
    }
    return n;
}

/* Host copy of a local view: the rows of a full contiguous array, NaN in the gaps. */
static uint16_t *host_local(const view *v, const uint16_t *full, int64_t N, const int64_t *rows)
{
    uint16_t *x = malloc(v->extent * 2);
    if (!x)
        return NULL;
    const uint16_t nan16 = half_nan(v->t.dtype);
    for (size_t i = 0; i < v->extent; i++)
        x[i] = nan16;
    if (!full)
        return x;
    const int64_t *s = v->t.stride, H = v->t.shape[2], D = v->t.shape[3];
    for (int64_t b = 0; b < v->t.shape[0]; b++)
        for (int64_t i = 0; i < v->t.shape[1]; i++)
            for (int64_t h = 0; h < H; h++)
                memcpy(x + b * s[0] + i * s[1] + h * s[2], full + ((b * N + rows[i]) * H + h) * D,
                       (size_t)D * 2);
    return x;
}

/* Writes a local result into the full float array, counting unwritten or non-finite elements
 * and changed gaps. */
static void scatter(rank_ctx *x, const view *v, const uint16_t *got, float *full, int64_t N,
                    const int64_t *rows)
{
    unsigned char *m = view_map(v);
    if (!m) {
        fail(x, "host out of memory");
        return;
    }
    const flashc_dtype dt = v->t.dtype;
    const uint16_t nan16 = half_nan(dt);
    for (size_t i = 0; i < v->extent; i++)
        if (!m[i] && got[i] != nan16)
            x->gap_writes++;
    free(m);
    const int64_t *s = v->t.stride, H = v->t.shape[2], D = v->t.shape[3];
    for (int64_t b = 0; b < v->t.shape[0]; b++)
        for (int64_t i = 0; i < v->t.shape[1]; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    float f = from_half(dt, got[b * s[0] + i * s[1] + h * s[2] + d]);
                    if (!isfinite(f))
                        x->nonfinite++;
                    full[((b * N + rows[i]) * H + h) * D + d] = f;
                }
}

static void scatter_lse(rank_ctx *x, const view *v, const float *got, float *full, int64_t N,
                        const int64_t *rows)
{
    unsigned char *m = view_map(v);
    if (!m) {
        fail(x, "host out of memory");
        return;
    }
    for (size_t i = 0; i < v->extent; i++)
        if (!m[i] && !isnan(got[i]))
            x->gap_writes++;
    free(m);
    const int64_t *s = v->t.stride, H = v->t.shape[1];
    for (int64_t b = 0; b < v->t.shape[0]; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < v->t.shape[2]; i++) {
                float f = got[b * s[0] + h * s[1] + i];
                if (!isfinite(f))
                    x->nonfinite++;
                full[(b * H + h) * N + rows[i]] = f;
            }
}

/* Device copy of a host buffer (NULL src: no copy). */
static void *to_device(rank_ctx *x, const void *src, size_t bytes)
{
    void *d = NULL;
    if (flashc_backend_malloc(x->be, bytes, &d) != FLASHC_OK) {
        fail(x, "device allocation of %zu bytes: %s", bytes, flashc_last_error());
        return NULL;
    }
    if (src && flashc_backend_memcpy(x->be, d, src, bytes, FLASHC_COPY_TO_BACKEND) != FLASHC_OK)
        fail(x, "copy to the device: %s", flashc_last_error());
    return d;
}

static void to_host(rank_ctx *x, void *dst, const void *src, size_t bytes)
{
    if (flashc_backend_memcpy(x->be, dst, src, bytes, FLASHC_COPY_TO_HOST) != FLASHC_OK)
        fail(x, "copy to the host: %s", flashc_last_error());
}

enum { T_Q, T_K, T_V, T_DO, T_O, T_DQ, T_DK, T_DV, T_N };

/* One case on one rank: its rows in, the ring forward and backward, its rows out. */
static void *rank_case(void *arg)
{
    rank_ctx *x = arg;
    const job *jb = &g_job;
    const ring_case *c = jb->c;
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, N = jb->N, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    x->failed = 0, x->msg[0] = 0, x->nonfinite = 0, x->gap_writes = 0, x->det_differs = 0;
    if (cudaSetDevice(x->device) != cudaSuccess) {
        fail(x, "cudaSetDevice(%d) failed", x->device);
        return NULL;
    }
    int64_t *rows = malloc((size_t)N * sizeof *rows);
    view vw[T_N], vl;
    uint16_t *host[T_N] = {0}, *again[3] = {0};
    void *dev[T_N] = {0}, *dlse = NULL;
    float *hlse = NULL;
    if (!rows) {
        fail(x, "host out of memory");
        return NULL;
    }
    const int64_t n = local_rows(c->causal != FLASHC_CAUSAL_NONE, N, g_world, x->rank, rows);
    const int64_t heads[T_N] = {Hq, Hkv, Hkv, Hq, Hq, Hq, Hkv, Hkv};
    const uint16_t *src[T_N] = {jb->q, jb->k, jb->v, jb->dout, NULL, NULL, NULL, NULL};
    /* a rank whose setup fails still takes part in the ring calls: its NULL tensors are
     * refused by its own checks and every rank returns the error, none is left waiting */
    for (int i = 0; i < T_N; i++) {
        vw[i] = make_view(dt, c->layout, B, n, heads[i], D);
        host[i] = host_local(&vw[i], src[i], N, rows);
        if (!host[i])
            fail(x, "host out of memory");
        else
            dev[i] = to_device(x, host[i], vw[i].extent * 2); /* outputs: NaN everywhere */
        vw[i].t.data = dev[i];
    }
    vl = make_lse_view(c->layout, B, Hq, n);
    hlse = malloc(vl.extent * sizeof(float));
    if (hlse) {
        for (size_t i = 0; i < vl.extent; i++)
            hlse[i] = NAN;
        dlse = to_device(x, hlse, vl.extent * sizeof(float));
    } else {
        fail(x, "host out of memory");
    }
    vl.t.data = dlse;
    /* the legacy stream's uploads are complete before the ring's non-blocking stream reads */
    if (cudaDeviceSynchronize() != cudaSuccess)
        fail(x, "cudaDeviceSynchronize after the uploads failed");

    flashc_status st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &jb->p, N, &vw[T_Q].t,
                                                &vw[T_K].t, &vw[T_V].t, &vw[T_O].t, &vl.t);
    if (st != FLASHC_OK) { /* every rank fails alike, so every rank skips the backward */
        fail(x, "ring forward: %s: %s", flashc_status_string(st), flashc_ring_last_error());
        goto done;
    }
    st = flashc_ring_backward_nccl(x->comm, x->stream, x->be, &jb->p, N, &vw[T_DO].t, &vw[T_Q].t,
                                   &vw[T_K].t, &vw[T_V].t, &vw[T_O].t, &vl.t, &vw[T_DQ].t,
                                   &vw[T_DK].t, &vw[T_DV].t);
    if (st != FLASHC_OK) {
        fail(x, "ring backward: %s: %s", flashc_status_string(st), flashc_ring_last_error());
        goto done;
    }
    if (cudaStreamSynchronize(x->stream) != cudaSuccess)
        fail(x, "cudaStreamSynchronize after the ring failed");
    if (!x->failed) {
        for (int i = T_O; i < T_N; i++)
            to_host(x, host[i], dev[i], vw[i].extent * 2);
        to_host(x, hlse, dlse, vl.extent * sizeof(float));
    }

    if (c->deterministic) { /* the same bits from a second backward into re-poisoned outputs */
        for (int i = 0; i < 3; i++) {
            const view *w = &vw[T_DQ + i];
            again[i] = host_local(w, NULL, N, rows);
            if (!again[i])
                fail(x, "host out of memory");
            else if (flashc_backend_memcpy(x->be, dev[T_DQ + i], again[i], w->extent * 2,
                                           FLASHC_COPY_TO_BACKEND) != FLASHC_OK)
                fail(x, "copy to the device: %s", flashc_last_error());
        }
        if (cudaDeviceSynchronize() != cudaSuccess)
            fail(x, "re-poisoning the gradients failed");
        /* called whatever happened above, since the other ranks call it too */
        st = flashc_ring_backward_nccl(x->comm, x->stream, x->be, &jb->p, N, &vw[T_DO].t,
                                       &vw[T_Q].t, &vw[T_K].t, &vw[T_V].t, &vw[T_O].t, &vl.t,
                                       &vw[T_DQ].t, &vw[T_DK].t, &vw[T_DV].t);
        if (st != FLASHC_OK || cudaStreamSynchronize(x->stream) != cudaSuccess) {
            fail(x, "second ring backward: %s: %s", flashc_status_string(st),
                 flashc_ring_last_error());
            goto done;
        }
        for (int i = 0; i < 3 && !x->failed; i++) {
            to_host(x, again[i], dev[T_DQ + i], vw[T_DQ + i].extent * 2);
            if (memcmp(again[i], host[T_DQ + i], vw[T_DQ + i].extent * 2) != 0)
                x->det_differs = 1;
        }
    }
    if (x->failed)
        goto done;

    scatter(x, &vw[T_O], host[T_O], jb->o, N, rows);
    scatter_lse(x, &vl, hlse, jb->lse, N, rows);
    scatter(x, &vw[T_DQ], host[T_DQ], jb->dq, N, rows);
    scatter(x, &vw[T_DK], host[T_DK], jb->dk, N, rows);
    scatter(x, &vw[T_DV], host[T_DV], jb->dv, N, rows);
done:
    for (int i = 0; i < T_N; i++) {
        flashc_backend_free(x->be, dev[i]);
        free(host[i]);
    }
    for (int i = 0; i < 3; i++)
        free(again[i]);
    flashc_backend_free(x->be, dlse);
    free(hlse);
    free(rows);
    return NULL;
}

/* ---- the single-device and float64 results ------------------------------------------------- */

typedef struct full_result {
    float *o, *lse, *dq, *dk, *dv;
} full_result;

static int alloc_result(full_result *r, size_t nq, size_t nk, size_t nl)
{
    r->o = malloc(nq * 4), r->dq = malloc(nq * 4), r->dk = malloc(nk * 4), r->dv = malloc(nk * 4);
    r->lse = malloc(nl * 4);
    return r->o && r->dq && r->dk && r->dv && r->lse;
}

static void free_result(full_result *r)
{
    free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
    memset(r, 0, sizeof *r);
}

/* flashc_forward and flashc_backward on the whole sequence, on one device. */
static int single_device(flashc_backend *be, const job *jb, full_result *r, char *msg, size_t cap)
{
    const ring_case *c = jb->c;
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, N = jb->N, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const size_t nq = (size_t)(B * N * Hq * D), nk = (size_t)(B * N * Hkv * D), nl = (size_t)(B * Hq * N);
    const size_t bytes[T_N] = {nq * 2, nk * 2, nk * 2, nq * 2, nq * 2, nq * 2, nk * 2, nk * 2};
    const void *src[T_N] = {jb->q, jb->k, jb->v, jb->dout, NULL, NULL, NULL, NULL};
    void *d[T_N] = {0}, *dl = NULL;
    uint16_t *h = malloc(nq > nk ? nq * 2 : nk * 2);
    int ok = h != NULL;
    for (int i = 0; i < T_N && ok; i++)
        ok = flashc_backend_malloc(be, bytes[i], &d[i]) == FLASHC_OK &&
             (!src[i] || flashc_backend_memcpy(be, d[i], src[i], bytes[i], FLASHC_COPY_TO_BACKEND) ==
                             FLASHC_OK);
    ok = ok && flashc_backend_malloc(be, nl * 4, &dl) == FLASHC_OK;
    if (!ok) {
        snprintf(msg, cap, "single device: setup: %s", flashc_last_error());
        goto out;
    }
    flashc_tensor t[T_N];
    const int64_t heads[T_N] = {Hq, Hkv, Hkv, Hq, Hq, Hq, Hkv, Hkv};
    for (int i = 0; i < T_N; i++)
        t[i] = flashc_tensor_contiguous(d[i], dt, B, N, heads[i], D);
    flashc_tensor tl = flashc_lse_contiguous(dl, B, Hq, N);
    if (flashc_forward(be, &jb->p, &t[T_Q], &t[T_K], &t[T_V], &t[T_O], &tl) != FLASHC_OK ||
        flashc_backward(be, &jb->p, &t[T_DO], &t[T_Q], &t[T_K], &t[T_V], &t[T_O], &tl, &t[T_DQ],
                        &t[T_DK], &t[T_DV]) != FLASHC_OK ||
        flashc_backend_synchronize(be, NULL) != FLASHC_OK) {
        snprintf(msg, cap, "single device: %s", flashc_last_error());
        ok = 0;
        goto out;
    }
    float *dst[T_N] = {0};
    dst[T_O] = r->o, dst[T_DQ] = r->dq, dst[T_DK] = r->dk, dst[T_DV] = r->dv;
    for (int i = T_O; i < T_N && ok; i++) {
        ok = flashc_backend_memcpy(be, h, d[i], bytes[i], FLASHC_COPY_TO_HOST) == FLASHC_OK;
        for (size_t e = 0; ok && e < bytes[i] / 2; e++)
            dst[i][e] = from_half(dt, h[e]);
    }
    ok = ok && flashc_backend_memcpy(be, r->lse, dl, nl * 4, FLASHC_COPY_TO_HOST) == FLASHC_OK;
    if (!ok)
        snprintf(msg, cap, "single device: copy back: %s", flashc_last_error());
out:
    for (int i = 0; i < T_N; i++)
        flashc_backend_free(be, d[i]);
    flashc_backend_free(be, dl);
    free(h);
    return ok;
}

/* The float64 reference, one thread per (batch, kv head) slice: each slice is an
 * independent problem, a view of the full tensors, so the single-threaded backend runs on
 * every core. */
typedef struct ref_slice {
    const job *jb;
    full_result *r;
    int64_t b, g;
    int ok;
    char msg[300];
} ref_slice;

static flashc_tensor slice(const flashc_tensor *t, int64_t b, int64_t h0, int64_t nh)
{
    flashc_tensor s = *t;
    s.data = (char *)t->data +
             (b * t->stride[0] + h0 * t->stride[2]) * (int64_t)flashc_dtype_size(t->dtype);
    s.shape[0] = 1, s.shape[2] = nh;
    return s;
}

static void *ref_worker(void *arg)
{
    ref_slice *s = arg;
    const job *jb = s->jb;
    const ring_case *c = jb->c;
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, N = jb->N, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const int64_t G = Hq / Hkv;
    flashc_backend *ref = NULL;
    if (flashc_backend_create("reference", NULL, &ref) != FLASHC_OK) {
        snprintf(s->msg, sizeof s->msg, "reference backend: %s", flashc_last_error());
        return NULL;
    }
    flashc_tensor q = flashc_tensor_contiguous((void *)jb->q, dt, B, N, Hq, D);
    flashc_tensor k = flashc_tensor_contiguous((void *)jb->k, dt, B, N, Hkv, D);
    flashc_tensor v = flashc_tensor_contiguous((void *)jb->v, dt, B, N, Hkv, D);
    flashc_tensor dout = flashc_tensor_contiguous((void *)jb->dout, dt, B, N, Hq, D);
    flashc_tensor o = flashc_tensor_contiguous(s->r->o, FLASHC_F32, B, N, Hq, D);
    flashc_tensor dq = flashc_tensor_contiguous(s->r->dq, FLASHC_F32, B, N, Hq, D);
    flashc_tensor dk = flashc_tensor_contiguous(s->r->dk, FLASHC_F32, B, N, Hkv, D);
    flashc_tensor dv = flashc_tensor_contiguous(s->r->dv, FLASHC_F32, B, N, Hkv, D);
    flashc_tensor l = flashc_lse_contiguous(s->r->lse, B, Hq, N);
    const int64_t b = s->b, h0 = s->g * G;
    flashc_tensor sq = slice(&q, b, h0, G), sk = slice(&k, b, s->g, 1), sv = slice(&v, b, s->g, 1);
    flashc_tensor sdo = slice(&dout, b, h0, G), so = slice(&o, b, h0, G), sdq = slice(&dq, b, h0, G);
    flashc_tensor sdk = slice(&dk, b, s->g, 1), sdv = slice(&dv, b, s->g, 1);
    flashc_tensor sl = l;
    sl.data = s->r->lse + b * l.stride[0] + h0 * l.stride[1];
    sl.shape[0] = 1, sl.shape[1] = G;
    flashc_params p = jb->p;
    p.deterministic = 0;
    if (flashc_forward(ref, &p, &sq, &sk, &sv, &so, &sl) != FLASHC_OK ||
        flashc_backward(ref, &p, &sdo, &sq, &sk, &sv, &so, &sl, &sdq, &sdk, &sdv) != FLASHC_OK)
        snprintf(s->msg, sizeof s->msg, "reference: %s", flashc_last_error());
    else
        s->ok = 1;
    flashc_backend_destroy(ref);
    return NULL;
}

static int reference(const job *jb, full_result *r, char *msg, size_t cap)
{
    const ring_case *c = jb->c;
    const int64_t slices = c->batch * c->heads_kv;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1)
        cores = 1;
    ref_slice *s = calloc((size_t)slices, sizeof *s);
    pthread_t *th = calloc((size_t)slices, sizeof *th);
    char *started = calloc((size_t)slices, 1);
    int ok = s && th && started;
    for (int64_t i0 = 0; ok && i0 < slices; i0 += cores) {
        const int64_t i1 = i0 + cores < slices ? i0 + cores : slices;
        for (int64_t i = i0; i < i1; i++) {
            s[i].jb = jb, s[i].r = r, s[i].b = i / c->heads_kv, s[i].g = i % c->heads_kv;
            started[i] = pthread_create(&th[i], NULL, ref_worker, &s[i]) == 0;
            if (!started[i])
                ref_worker(&s[i]);
        }
        for (int64_t i = i0; i < i1; i++)
            if (started[i])
                pthread_join(th[i], NULL);
    }
    for (int64_t i = 0; ok && i < slices; i++)
        if (!s[i].ok) {
            snprintf(msg, cap, "%s", s[i].msg);
            ok = 0;
        }
    if (!(s && th && started))
        snprintf(msg, cap, "reference: host out of memory");
    free(started);
    free(s);
    free(th);
    return ok;
}

/* ---- comparison ------------------------------------------------------------------------------ */

/* ||got - want|| / ||want||; infinity if got has a non-finite element. */
static double rel_error(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* max |got - want| / max(1, |want|) over the LSE. */
static double lse_error(const float *got, const float *want, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) && got[i] == want[i])
            continue;
        double e = fabs((double)got[i] - want[i]) / (fabs(want[i]) > 1 ? fabs(want[i]) : 1);
        if (!(e <= m))
            m = isnan(e) ? INFINITY : e;
    }
    return m;
}

static int g_checks, g_failures;

/* The five errors of the ring's result against r, held to the bars. */
static int compare(const char *against, const job *jb, const full_result *r, double e[5])
{
    const ring_case *c = jb->c;
    const size_t nq = (size_t)(c->batch * jb->N * c->heads_q * c->head_dim);
    const size_t nk = (size_t)(c->batch * jb->N * c->heads_kv * c->head_dim);
    const size_t nl = (size_t)(c->batch * c->heads_q * jb->N);
    e[0] = rel_error(jb->o, r->o, nq);
    e[1] = lse_error(jb->lse, r->lse, nl);
    e[2] = rel_error(jb->dq, r->dq, nq);
    e[3] = rel_error(jb->dk, r->dk, nk);
    e[4] = rel_error(jb->dv, r->dv, nk);
    /* each block's partial result is rounded to the dtype before it is merged or summed,
     * the single-device one once: the bars of test_ring_mpi */
    const double tol = c->dtype == FLASHC_F16 ? 1e-3 : 1e-2;
    static const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        g_checks++;
        if (!(e[i] <= (i == 1 ? 1e-5 : tol))) {
            g_failures++;
            ok = 0;
            printf("FAIL %s: %s rel err %.3g vs %s (bar %g)\n", c->tag, names[i], e[i], against,
                   i == 1 ? 1e-5 : tol);
        }
    }
    return ok;
}

static const char *causal_name(int causal)
{
    return causal == FLASHC_CAUSAL_NONE ? "none" : causal == FLASHC_CAUSAL_TOP_LEFT ? "tl" : "br";
}

static void run_case(const ring_case *c, uint64_t seed)
{
    job *jb = &g_job;
    memset(jb, 0, sizeof *jb);
    jb->c = c;
    int64_t N = c->seqlen;
    const int causal = c->causal != FLASHC_CAUSAL_NONE;
    if (c->seqlen_rule != N_FIXED)
        N = (causal ? 2 * (int64_t)g_world : (int64_t)g_world * (g_world + 1) / 2) +
            (c->seqlen_rule == N_FEWEST_PLUS_ONE);
    jb->N = N;
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const size_t nq = (size_t)(B * N * Hq * D), nk = (size_t)(B * N * Hkv * D), nl = (size_t)(B * Hq * N);
    char label[200];
    snprintf(label, sizeof label, "%-4s b%lld N=%-5lld h%lld/%lld d%-3lld causal=%-4s %-6s%s",
             dt == FLASHC_BF16 ? "bf16" : "f16", (long long)B, (long long)N, (long long)Hq,
             (long long)Hkv, (long long)D, causal_name(c->causal), layout_names[c->layout],
             c->deterministic ? " det" : "");

    flashc_params_init(&jb->p);
    jb->p.causal = c->causal;
    jb->p.softmax_scale = c->scale;
    jb->p.deterministic = c->deterministic;

    uint16_t *in[4] = {malloc(nq * 2), malloc(nk * 2), malloc(nk * 2), malloc(nq * 2)};
    full_result ring = {0}, single = {0}, ref = {0};
    int ok = in[0] && in[1] && in[2] && in[3] && alloc_result(&ring, nq, nk, nl) &&
             alloc_result(&single, nq, nk, nl);
    const int with_ref = (double)B * Hq * N * N * D <= REF_LIMIT;
    if (ok && with_ref)
        ok = alloc_result(&ref, nq, nk, nl);
    if (!ok) {
        printf("FAIL %s: host out of memory\n", label);
        g_checks++, g_failures++;
        goto out;
    }
    const size_t counts[4] = {nq, nk, nk, nq};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < counts[t]; i++)
            in[t][i] = to_half(dt, (float)normal(&seed));
    jb->q = in[0], jb->k = in[1], jb->v = in[2], jb->dout = in[3];
    jb->o = ring.o, jb->lse = ring.lse, jb->dq = ring.dq, jb->dk = ring.dk, jb->dv = ring.dv;
    for (size_t i = 0; i < nq; i++)
        ring.o[i] = ring.dq[i] = NAN; /* rows no rank returns stay NaN and fail */
    for (size_t i = 0; i < nk; i++)
        ring.dk[i] = ring.dv[i] = NAN;
    for (size_t i = 0; i < nl; i++)
        ring.lse[i] = NAN;

    char msg[400] = "";
    g_checks++;
    if (!single_device(g_ranks[0].be, jb, &single, msg, sizeof msg)) {
        printf("FAIL %s: %s\n", label, msg);
        g_failures++;
        goto out;
    }
    g_checks++;
    if (with_ref && !reference(jb, &ref, msg, sizeof msg)) {
        printf("FAIL %s: %s\n", label, msg);
        g_failures++;
        goto out;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(rank_case);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int ran = 1;
    for (int r = 0; r < g_world; r++) {
        rank_ctx *x = &g_ranks[r];
        g_checks += 3;
        if (x->failed) {
            printf("FAIL %s: rank %d: %s\n", label, r, x->msg);
            g_failures++;
            ran = 0;
            continue;
        }
        if (x->nonfinite || x->gap_writes) {
            printf("FAIL %s: rank %d: %ld output elements unwritten or not finite, %ld gap "
                   "elements changed\n",
                   label, r, x->nonfinite, x->gap_writes);
            g_failures++;
        }
        if (x->det_differs) {
            printf("FAIL %s: rank %d: a second deterministic backward gave other bits\n", label, r);
            g_failures++;
        }
    }
    if (!ran)
        goto out;
    double es[5], er[5];
    int ok_single = compare("single device", jb, &single, es);
    int ok_ref = with_ref ? compare("float64 reference", jb, &ref, er) : 1;
    printf("  %s %-22s %5.2fs  vs cuda: O %.1e LSE %.1e dQ %.1e dK %.1e dV %.1e", label, c->tag,
           (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec), es[0], es[1], es[2], es[3],
           es[4]);
    if (with_ref)
        printf("  vs f64: O %.1e LSE %.1e dQ %.1e dK %.1e dV %.1e", er[0], er[1], er[2], er[3],
               er[4]);
    printf("%s\n", ok_single && ok_ref ? "" : "  FAIL");
out:
    fflush(stdout);
    for (int t = 0; t < 4; t++)
        free(in[t]);
    free_result(&ring);
    free_result(&single);
    free_result(&ref);
}

/* ---- bad arguments ---------------------------------------------------------------------------- */

#define ECHECK(x, cond, ...)                                                                 \
    do {                                                                                     \
        (x)->checks++;                                                                       \
        if (!(cond)) {                                                                       \
            (x)->fails++;                                                                    \
            char m_[400];                                                                    \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                            \
            printf("FAIL rank %d, %s:%d: %s\n", (x)->rank, __FILE__, __LINE__, m_);          \
        }                                                                                    \
    } while (0)

/* Every rank calls with the same small causal problem; one rank's arguments are wrong. */
static void *rank_errors(void *arg)
{
    rank_ctx *x = arg;
    enum { H = 2, D = 64 };
    const int64_t N = 8 * (int64_t)g_world + 3;
    const int bad = g_world - 1;
    flashc_backend *host_be = NULL;
    if (cudaSetDevice(x->device) != cudaSuccess) {
        ECHECK(x, 0, "cudaSetDevice(%d) failed", x->device);
        return NULL;
    }
    int64_t rows[8 * MAX_RANKS + 3];
    const int64_t n = local_rows(1, N, g_world, x->rank, rows);
    const size_t elems = (size_t)(n * H * D);
    /* q k v o dout dq dk dv, then the LSE */
    uint16_t *h = malloc(8 * elems * 2 + (size_t)(H * n) * 4);
    void *d = NULL;
    if (!h || flashc_backend_malloc(x->be, 8 * elems * 2 + (size_t)(H * n) * 4, &d) != FLASHC_OK) {
        ECHECK(x, 0, "setup: out of memory");
        free(h);
        return NULL;
    }
    uint64_t seed = 99 + (uint64_t)x->rank;
    for (size_t i = 0; i < 8 * elems; i++)
        h[i] = i < 5 * elems ? f32_to_f16((float)normal(&seed)) : 0x7e00;
    flashc_backend_memcpy(x->be, d, h, 8 * elems * 2, FLASHC_COPY_TO_BACKEND);
    cudaDeviceSynchronize();
    flashc_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = flashc_tensor_contiguous((uint16_t *)d + i * elems, FLASHC_F16, 1, n, H, D);
    flashc_tensor q = t[0], k = t[1], v = t[2], o = t[3], dout = t[4], dq = t[5], dk = t[6], dv = t[7];
    flashc_tensor l = flashc_lse_contiguous((float *)((uint16_t *)d + 8 * elems), 1, H, n);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    const char *e;

    /* a shape error on the last rank; nothing written anywhere */
    cudaMemset(o.data, 0xff, elems * 2);
    cudaDeviceSynchronize();
    flashc_tensor kb = k;
    if (x->rank == bad)
        kb.shape[3] = D / 2;
    flashc_status st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, N, &q, &kb, &v, &o, &l);
    e = flashc_ring_last_error();
    ECHECK(x, st == FLASHC_ERROR_SHAPE_MISMATCH, "bad k on rank %d: got %s (%s)", bad,
           flashc_status_string(st), e);
    if (x->rank == bad)
        ECHECK(x, strstr(e, "k: shape[3] (head_dim)") != NULL, "message '%s'", e);
    else
        ECHECK(x, strstr(e, "rejected its arguments") != NULL, "message '%s'", e);
    uint16_t *back = malloc(elems * 2);
    if (back) {
        flashc_backend_memcpy(x->be, back, o.data, elems * 2, FLASHC_COPY_TO_HOST);
        size_t changed = 0;
        for (size_t i = 0; i < elems; i++)
            changed += back[i] != 0xffff;
        ECHECK(x, changed == 0, "a rejected call wrote %zu elements of out", changed);
        free(back);
    }

    /* ranks that disagree on the sequence length */
    if (g_world > 1) {
        st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, x->rank == bad ? N + 1 : N,
                                      &q, &k, &v, &o, &l);
        e = flashc_ring_last_error();
        ECHECK(x, st == FLASHC_ERROR_SHAPE_MISMATCH && strstr(e, "seqlen"),
               "disagreeing seqlen: %s (%s)", flashc_status_string(st), e);
    }

    /* rows that are not the zig-zag split of the length passed */
    st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, N + 2 * g_world, &q, &k, &v, &o, &l);
    e = flashc_ring_last_error();
    ECHECK(x, st == FLASHC_ERROR_SHAPE_MISMATCH && strstr(e, "zig-zag"), "wrong rows: %s (%s)",
           flashc_status_string(st), e);

    /* a position-dependent feature */
    flashc_params pw = p;
    pw.window_left = 4;
    st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &pw, N, &q, &k, &v, &o, &l);
    ECHECK(x, st == FLASHC_ERROR_UNSUPPORTED, "window: %s", flashc_status_string(st));

    /* out overlapping q */
    st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, N, &q, &k, &v, &q, &l);
    ECHECK(x, st == FLASHC_ERROR_ALIASING, "out aliasing q: %s", flashc_status_string(st));

    /* a host backend on one rank */
    if (flashc_backend_create("reference", NULL, &host_be) == FLASHC_OK) {
        st = flashc_ring_forward_nccl(x->comm, x->stream, x->rank == bad ? host_be : x->be, &p, N,
                                      &q, &k, &v, &o, &l);
        e = flashc_ring_last_error();
        ECHECK(x, st == FLASHC_ERROR_UNSUPPORTED, "host backend on rank %d: %s (%s)", bad,
               flashc_status_string(st), e);
        if (x->rank == bad)
            ECHECK(x, strstr(e, "host memory") != NULL, "message '%s'", e);
        flashc_backend_destroy(host_be);
    }

    /* a valid call works afterwards: the ranks are still in step */
    st = flashc_ring_forward_nccl(x->comm, x->stream, x->be, &p, N, &q, &k, &v, &o, &l);
    ECHECK(x, st == FLASHC_OK, "valid forward after errors: %s", flashc_ring_last_error());

    /* the backward: a dv of the wrong shape on rank 0, then a valid call */
    flashc_tensor dvb = dv;
    if (x->rank == 0)
        dvb.shape[2] = 1;
    st = flashc_ring_backward_nccl(x->comm, x->stream, x->be, &p, N, &dout, &q, &k, &v, &o, &l,
                                   &dq, &dk, &dvb);
    ECHECK(x, st == FLASHC_ERROR_SHAPE_MISMATCH, "bad dv on rank 0: %s (%s)",
           flashc_status_string(st), flashc_ring_last_error());
    st = flashc_ring_backward_nccl(x->comm, x->stream, x->be, &p, N, &dout, &q, &k, &v, &o, &l,
                                   &dq, &dk, &dv);
    ECHECK(x, st == FLASHC_OK, "valid backward after errors: %s", flashc_ring_last_error());
    flashc_backend_free(x->be, d);
    free(h);
    return NULL;
}

/* ---- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    int want = 0, quick = 0;
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
            want = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            g_timeout = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: test_ring_nccl [--ranks N] [--quick] [--filter SUBSTRING] "
                            "[--timeout SECONDS]\n");
            return 2;
        }
    }
    /* NVLink multicast (NVLS) is not needed by point-to-point rings; keep it off */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    signal(SIGALRM, on_alarm);

    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("test_ring_nccl: no CUDA device (%s): skipped\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "device count is 0");
        return 77;
    }
    if (ndev > MAX_RANKS)
        ndev = MAX_RANKS;
    g_world = want > 0 ? want : ndev;
    if (g_world > ndev) {
        fprintf(stderr, "--ranks %d: only %d device(s) visible (one rank per device)\n", want, ndev);
        return 2;
    }
    int devs[MAX_RANKS];
    ncclComm_t comms[MAX_RANKS];
    for (int r = 0; r < g_world; r++)
        devs[r] = r;
    ncclResult_t nr = ncclCommInitAll(comms, g_world, devs);
    if (nr != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll over %d devices: %s\n", g_world, ncclGetErrorString(nr));
        return 1;
    }
    for (int r = 0; r < g_world; r++) {
        rank_ctx *x = &g_ranks[r];
        x->rank = r, x->device = devs[r], x->comm = comms[r];
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.device = devs[r];
        if (cudaSetDevice(devs[r]) != cudaSuccess ||
            cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "device %d: stream creation failed\n", devs[r]);
            return 1;
        }
        if (flashc_backend_create("cuda", &cfg, &x->be) != FLASHC_OK) {
            fprintf(stderr, "device %d: %s\n", devs[r], flashc_last_error());
            return 1;
        }
    }
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("ring attention over NCCL %d, %d rank(s) on %d visible %s, one thread each; against "
           "one device and the float64 reference:\n",
           nccl_version, g_world, ndev, prop.name);
    printf("  %s\n", flashc_backend_describe(g_ranks[0].be));

    uint64_t seed = 2024;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, seed += 1000003) {
        const ring_case *c = &cases[i];
        if (quick && !c->quick)
            continue;
        if (filter && !strstr(c->tag, filter))
            continue;
        if (c->seqlen_rule == N_FIXED) { /* the split needs enough rows for every rank */
            int64_t fewest = c->causal != FLASHC_CAUSAL_NONE ? 2 * (int64_t)g_world
                                                              : (int64_t)g_world * (g_world + 1) / 2;
            if (c->seqlen < fewest)
                continue;
        }
        run_case(c, seed);
    }

    printf("  bad arguments on one rank:\n");
    run_ranks(rank_errors);
    int echecks = 0, efails = 0;
    for (int r = 0; r < g_world; r++)
        echecks += g_ranks[r].checks, efails += g_ranks[r].fails;
    printf("  %d argument checks over %d rank(s), %d failed\n", echecks, g_world, efails);
    g_checks += echecks;
    g_failures += efails;

    for (int r = 0; r < g_world; r++) {
        flashc_backend_destroy(g_ranks[r].be);
        cudaSetDevice(g_ranks[r].device);
        cudaStreamDestroy(g_ranks[r].stream);
        ncclCommDestroy(g_ranks[r].comm);
    }
    printf("summary: test_ring_nccl (%d rank(s)): %d checks, %d failed\n", g_world, g_checks,
           g_failures);
    return g_failures ? 1 : 0;
}
