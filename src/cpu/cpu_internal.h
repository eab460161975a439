/*
 * cpu_internal.h - state of the CPU backend and the pieces its forward and backward share:
 * block sizes, per-thread scratch and the loading of blocks of rows as float32.
 */
#ifndef FLASHC_CPU_INTERNAL_H
#define FLASHC_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "dtype.h"

/* Queries per block (rows of S) and keys per block (columns of S): a 64 x 256 float block
 * is 64 KiB, so the Q, K, V and O blocks of the largest head dim stay within L2. */
enum { FLASHC_CPU_BLOCK_M = 64, FLASHC_CPU_BLOCK_N = 64 };

typedef struct flashc_cpu_state {
    flashc_threadpool *pool;
    const flashc_cpu_kernels *kernels;
} flashc_cpu_state;

/* Scratch of all threads in one allocation, made before any output is written so that an
 * allocation failure leaves the outputs untouched. */
typedef struct cpu_scratch {
    float *base;
    size_t floats_per_thread;
} cpu_scratch;

flashc_status flashc_cpu_scratch_alloc(cpu_scratch *s, int threads, size_t floats_per_thread);
void flashc_cpu_scratch_free(cpu_scratch *s);

static inline float *flashc_cpu_scratch_for(const cpu_scratch *s, int thread)
{
    return s->base + (size_t)thread * s->floats_per_thread;
}

/* Loads rows [s0, s0 + n) of head h of batch b into dst[n][dim] as float32. */
static inline void flashc_cpu_load_rows(float *dst, const flashc_tensor *t, int64_t b,
                                        int64_t s0, int64_t n, int64_t h)
{
    int64_t dim = t->shape[3];
    for (int64_t r = 0; r < n; r++)
        flashc_load_row(dst + r * dim, flashc_row_ptr(t, b, s0 + r, h), t->dtype, dim);
}

/* Rows of a float32 tensor used in place (no copy): the first row's address and the stride
 * between rows, in floats. NULL when the tensor is not float32. */
static inline const float *flashc_cpu_direct_rows(const flashc_tensor *t, int64_t b, int64_t s0,
                                                  int64_t h, ptrdiff_t *ld)
{
    if (t->dtype != FLASHC_F32)
        return NULL;
    *ld = (ptrdiff_t)t->stride[1];
    return (const float *)flashc_row_ptr(t, b, s0, h);
}

/* Stores rows [s0, s0 + n) of head h of batch b from src[n][dim], rounded to the dtype. */
static inline void flashc_cpu_store_rows(flashc_tensor *t, const float *src, int64_t b,
                                         int64_t s0, int64_t n, int64_t h)
{
    int64_t dim = t->shape[3];
    for (int64_t r = 0; r < n; r++)
        flashc_store_row(flashc_row_ptr(t, b, s0 + r, h), src + r * dim, t->dtype, dim);
}

/* Number of blocks of size block covering n. */
static inline int64_t flashc_cpu_blocks(int64_t n, int64_t block)
{
    return (n + block - 1) / block;
}

/* Masks S in place: entry (r, c) of a block starting at query i0 and key j0 becomes -inf
 * where key j0 + c is not visible to query i0 + r. */
static inline void flashc_cpu_mask_block(const flashc_problem *pr, float *s, ptrdiff_t lds,
                                         int64_t i0, int m, int64_t j0, int n)
{
    if (pr->causal == FLASHC_CAUSAL_NONE)
        return;
    for (int r = 0; r < m; r++) {
        int64_t end = flashc_key_end(pr, i0 + r) - j0; /* first masked column */
        for (int64_t c = end < 0 ? 0 : end; c < n; c++)
            s[r * lds + c] = -INFINITY;
    }
}

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
