/*
 * cpu_internal.h - state of the CPU backend and the pieces its forward and backward share:
 * per-thread scratch, the packing of tensor rows into the micro-kernels' layouts
 * (cpu_pack.c) and the per-row visibility of a block under the causal mask.
 */
#ifndef FLASHC_CPU_INTERNAL_H
#define FLASHC_CPU_INTERNAL_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "dtype.h"

typedef struct flashc_cpu_state {
    flashc_threadpool *pool;
    const flashc_cpu_kernels *kernels;
    /* A workspace kept between calls, so repeated calls do not pay for fresh pages (page
     * faults and zeroing were 6% of a forward). Guarded by ws_lock; a call that finds it
     * taken by a concurrent call allocates its own. */
    pthread_mutex_t ws_lock;
    void *ws;
    size_t ws_bytes;
} flashc_cpu_state;

/* A 64-byte aligned workspace of at least bytes for one call, all of it obtained before any
 * output is written. NULL (with the error recorded) on failure. */
typedef struct cpu_workspace {
    char *base;
    int cached; /* the handle's cached buffer, held under ws_lock */
} cpu_workspace;

flashc_status flashc_cpu_workspace_get(flashc_cpu_state *st, size_t bytes, cpu_workspace *ws);
void flashc_cpu_workspace_put(flashc_cpu_state *st, cpu_workspace *ws);

/* Per-thread scratch carved from a workspace: thread t's share starts floats_per_thread * t
 * floats after base. */
typedef struct cpu_scratch {
    float *base;
    size_t floats_per_thread;
} cpu_scratch;

static inline float *flashc_cpu_scratch_for(const cpu_scratch *s, int thread)
{
    return s->base + (size_t)thread * s->floats_per_thread;
}

/* 64-byte aligned allocation of bytes (rounded up), NULL on failure or overflow. */
void *flashc_cpu_alloc(size_t bytes);

/* Floats, rounded up to whole cache lines, so consecutive carve-outs stay 64-byte aligned. */
static inline size_t flashc_cpu_lines(size_t floats)
{
    return (floats + 15) & ~(size_t)15;
}

/* Bytes rounded up to whole cache lines. */
static inline size_t flashc_cpu_line_bytes(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* Number of blocks of size block covering n. */
static inline int64_t flashc_cpu_blocks(int64_t n, int64_t block)
{
    return (n + block - 1) / block;
}

static inline int flashc_cpu_block_len(int64_t total, int64_t start, int64_t block)
{
    return (int)(total - start < block ? total - start : block);
}

/* Visible keys of each row of a block (m queries from i0, n keys from j0), in [0, n]. */
static inline void flashc_cpu_block_ncols(const flashc_problem *pr, int *ncols, int64_t i0,
                                          int m, int64_t j0, int n)
{
    for (int r = 0; r < m; r++) {
        int64_t e = flashc_key_end(pr, i0 + r) - j0;
        ncols[r] = e < 0 ? 0 : (e > n ? n : (int)e);
    }
}

/* ---- packing (cpu_pack.c): inputs of any dtype and strides into kernel layouts ---- */

/* dst[n][dp] = scale * rows [s0, s0 + n) of head h of batch b, as float32, dims d..dp zero. */
void flashc_cpu_pack_rows(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                          int n, int64_t h, float scale);
/* dst[dp][64] = the same rows transposed (one key per column); columns n..64 and dims d..dp
 * zero. */
void flashc_cpu_pack_panel(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                           int n, int64_t h);
/* bf16 tensors only: dst[n][dp] bf16 rows, dims d..dp zero. */
void flashc_cpu_pack_rows16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                            int64_t s0, int n, int64_t h);
/* bf16 tensors only: dst[dp/2][64][2], element (dim, key) at [dim/2][key][dim%2]. */
void flashc_cpu_pack_panel16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h);
/* bf16 tensors only: dst[32][dp][2], element (key, dim) at [key/2][dim][key%2]; keys n..64
 * zero. */
void flashc_cpu_pack_vpair16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h);

/* Stores rows [s0, s0 + n) of head h of batch b from src[n][ld] times scale, rounded to the
 * dtype. */
void flashc_cpu_store_rows(flashc_tensor *t, const float *src, int ld, int64_t b, int64_t s0,
                           int n, int64_t h, float scale);

flashc_status flashc_cpu_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                 const flashc_tensor *k, const flashc_tensor *v,
                                 flashc_tensor *out, flashc_tensor *lse);
flashc_status flashc_cpu_backward(void *state, const flashc_problem *pr,
                                  const flashc_tensor *dout, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v,
                                  const flashc_tensor *out, const flashc_tensor *lse,
                                  flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);
size_t flashc_cpu_backward_workspace_size(void *state, const flashc_problem *pr);

#endif /* FLASHC_CPU_INTERNAL_H */
