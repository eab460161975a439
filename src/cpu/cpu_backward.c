/*
 * cpu_backward.c - the FlashAttention-2 backward on the CPU, recomputing P from the LSE.
 *
 * Three passes over the thread pool, each output element written by exactly one task in a
 * fixed order, so the result is race-free and bitwise identical for any thread count:
 *   1. delta = rowsum(dO * O), one task per block of query rows;
 *   2. dK, dV: one task per block of keys of one (batch, kv head), walking every query head
 *      of its group and every query block that sees the keys:
 *          P = exp(scale S - LSE), dV += P^T dO, dP = dO V^T, dS = P (dP - delta),
 *          dK += scale dS^T Q;
 *   3. dQ: one task per block of queries, walking the visible keys: dQ += scale dS K.
 * Pass 3 recomputes S and dP a second time; that costs two of seven block products, and buys
 * the absence of any reduction between threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct backward_job {
    const flashc_problem *pr;
    const flashc_cpu_kernels *kern;
    const flashc_tensor *dout, *q, *k, *v, *out, *lse;
    flashc_tensor *dq, *dk, *dv;
    float *delta; /* [batch, heads_q, seqlen_q] */
    cpu_scratch scratch;
    int64_t q_blocks, k_blocks;
} backward_job;

static float *delta_row(const backward_job *job, int64_t b, int64_t h)
{
    return job->delta + (b * job->pr->heads_q + h) * job->pr->seqlen_q;
}

static int block_rows(int64_t total, int64_t start, int64_t block)
{
    return (int)(total - start < block ? total - start : block);
}

/* Pass 1: delta for a block of query rows of one (batch, head). */
static void delta_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int64_t dim = pr->head_dim;
    const int64_t qblock = task % job->q_blocks, bh = task / job->q_blocks;
    const int64_t b = bh / pr->heads_q, h = bh % pr->heads_q;
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = block_rows(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
    float *obuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *dobuf = obuf + FLASHC_CPU_BLOCK_M * dim;
    flashc_cpu_load_rows(obuf, job->out, b, i0, m, h);
    flashc_cpu_load_rows(dobuf, job->dout, b, i0, m, h);
    float *delta = delta_row(job, b, h) + i0;
    for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; d++)
            acc += obuf[r * dim + d] * dobuf[r * dim + d];
        delta[r] = acc;
    }
}

/* Given s = Q K^T of a block (m queries from i0, n keys from j0) and dp = dO V^T, turns s into
 * P = exp(scale S - LSE) (0 where masked or the row has no visible key) and dp into
 * dS = P (dP - delta). */
static void recompute_p_and_ds(const backward_job *job, float *s, float *dp, int64_t b,
                               int64_t h, int64_t i0, int m, int64_t j0, int n)
{
    const flashc_problem *pr = job->pr;
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++)
            s[r * FLASHC_CPU_BLOCK_N + c] *= pr->scale;
    flashc_cpu_mask_block(pr, s, FLASHC_CPU_BLOCK_N, i0, m, j0, n);
    const float *delta = delta_row(job, b, h) + i0;
    for (int r = 0; r < m; r++) {
        float *srow = s + r * FLASHC_CPU_BLOCK_N, *dprow = dp + r * FLASHC_CPU_BLOCK_N;
        float lse_r = *flashc_lse_ptr(job->lse, b, h, i0 + r);
        if (!(lse_r > -INFINITY) || isinf(lse_r)) { /* no visible key (or a corrupt LSE) */
            memset(srow, 0, (size_t)n * sizeof(float));
            memset(dprow, 0, (size_t)n * sizeof(float));
            continue;
        }
        job->kern->exp_sum(srow, n, lse_r);
        for (int c = 0; c < n; c++)
            dprow[c] = srow[c] * (dprow[c] - delta[r]);
    }
}

/* Rows of a tensor block: in place for float32, else converted into buf. */
static const float *block_rows_f32(const flashc_tensor *t, int64_t b, int64_t s0, int n,
                                   int64_t h, float *buf, ptrdiff_t *ld)
{
    const float *direct = flashc_cpu_direct_rows(t, b, s0, h, ld);
    if (direct)
        return direct;
    flashc_cpu_load_rows(buf, t, b, s0, n, h);
    *ld = (ptrdiff_t)t->shape[3];
    return buf;
}

/* First query that sees key j (the causal rule inverted), clamped to [0, seqlen_q]. */
static int64_t first_query_seeing(const flashc_problem *pr, int64_t j)
{
    if (pr->causal == FLASHC_CAUSAL_NONE)
        return 0;
    int64_t i = j - flashc_causal_offset(pr);
    return i < 0 ? 0 : (i > pr->seqlen_q ? pr->seqlen_q : i);
}

/* Pass 2: dK and dV of a block of keys of one (batch, kv head). */
static void dkdv_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int64_t dim = pr->head_dim, bhk = pr->batch * pr->heads_kv;
    const int64_t kblock = task / bhk; /* causal: the first key blocks see the most queries */
    const int64_t b = (task % bhk) / pr->heads_kv, hk = task % pr->heads_kv;
    const int64_t group = pr->heads_q / pr->heads_kv;
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = block_rows(pr->seqlen_k, j0, FLASHC_CPU_BLOCK_N);

    float *kbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *vbuf = kbuf + FLASHC_CPU_BLOCK_N * dim;
    float *dkacc = vbuf + FLASHC_CPU_BLOCK_N * dim;
    float *dvacc = dkacc + FLASHC_CPU_BLOCK_N * dim;
    float *qbuf = dvacc + FLASHC_CPU_BLOCK_N * dim;
    float *dobuf = qbuf + FLASHC_CPU_BLOCK_M * dim;
    float *s = dobuf + FLASHC_CPU_BLOCK_M * dim;
    float *dp = s + FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;

    ptrdiff_t ldk, ldv, ldq, lddo;
    const float *kb = block_rows_f32(job->k, b, j0, n, hk, kbuf, &ldk);
    const float *vb = block_rows_f32(job->v, b, j0, n, hk, vbuf, &ldv);
    memset(dkacc, 0, (size_t)n * (size_t)dim * sizeof(float));
    memset(dvacc, 0, (size_t)n * (size_t)dim * sizeof(float));

    const int64_t i_start = first_query_seeing(pr, j0);
    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t i0 = i_start; i0 < pr->seqlen_q; i0 += FLASHC_CPU_BLOCK_M) {
            const int m = block_rows(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
            const float *qb = block_rows_f32(job->q, b, i0, m, h, qbuf, &ldq);
            const float *dob = block_rows_f32(job->dout, b, i0, m, h, dobuf, &lddo);
            kern->gemm_nt(m, n, (int)dim, qb, ldq, kb, ldk, s, FLASHC_CPU_BLOCK_N);
            kern->gemm_nt(m, n, (int)dim, dob, lddo, vb, ldv, dp, FLASHC_CPU_BLOCK_N);
            recompute_p_and_ds(job, s, dp, b, h, i0, m, j0, n);
            kern->gemm_tn_acc(n, (int)dim, m, s, FLASHC_CPU_BLOCK_N, dob, lddo, dvacc, dim);
            kern->gemm_tn_acc(n, (int)dim, m, dp, FLASHC_CPU_BLOCK_N, qb, ldq, dkacc, dim);
        }
    for (int64_t e = 0; e < (int64_t)n * dim; e++)
        dkacc[e] *= pr->scale;
    flashc_cpu_store_rows(job->dk, dkacc, b, j0, n, hk);
    flashc_cpu_store_rows(job->dv, dvacc, b, j0, n, hk);
}

/* Pass 3: dQ of a block of queries of one (batch, head). */
static void dq_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int64_t dim = pr->head_dim, bh = pr->batch * pr->heads_q;
    const int64_t qblock = job->q_blocks - 1 - task / bh; /* longest first */
    const int64_t b = (task % bh) / pr->heads_q, h = task % pr->heads_q;
    const int64_t hk = h / (pr->heads_q / pr->heads_kv);
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = block_rows(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);

    float *qbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *dobuf = qbuf + FLASHC_CPU_BLOCK_M * dim;
    float *dqacc = dobuf + FLASHC_CPU_BLOCK_M * dim;
    float *kbuf = dqacc + FLASHC_CPU_BLOCK_M * dim;
    float *vbuf = kbuf + FLASHC_CPU_BLOCK_N * dim;
    float *s = vbuf + FLASHC_CPU_BLOCK_N * dim;
    float *dp = s + FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;

    ptrdiff_t ldq, lddo, ldk, ldv;
    const float *qb = block_rows_f32(job->q, b, i0, m, h, qbuf, &ldq);
    const float *dob = block_rows_f32(job->dout, b, i0, m, h, dobuf, &lddo);
    memset(dqacc, 0, (size_t)m * (size_t)dim * sizeof(float));

    const int64_t key_end = flashc_key_end(pr, i0 + m - 1);
    for (int64_t j0 = 0; j0 < key_end; j0 += FLASHC_CPU_BLOCK_N) {
        const int n = block_rows(key_end, j0, FLASHC_CPU_BLOCK_N);
        const float *kb = block_rows_f32(job->k, b, j0, n, hk, kbuf, &ldk);
        const float *vb = block_rows_f32(job->v, b, j0, n, hk, vbuf, &ldv);
        kern->gemm_nt(m, n, (int)dim, qb, ldq, kb, ldk, s, FLASHC_CPU_BLOCK_N);
        kern->gemm_nt(m, n, (int)dim, dob, lddo, vb, ldv, dp, FLASHC_CPU_BLOCK_N);
        recompute_p_and_ds(job, s, dp, b, h, i0, m, j0, n);
        kern->gemm_nn_acc(m, (int)dim, n, dp, FLASHC_CPU_BLOCK_N, kb, ldk, dqacc, dim);
    }
    for (int64_t e = 0; e < (int64_t)m * dim; e++)
        dqacc[e] *= pr->scale;
    flashc_cpu_store_rows(job->dq, dqacc, b, i0, m, h);
}

size_t flashc_cpu_backward_workspace_size(void *state, const flashc_problem *pr)
{
    return (size_t)(pr->batch * pr->heads_q * pr->seqlen_q) * sizeof(float) + 64;
}

flashc_status flashc_cpu_backward(void *state, const flashc_problem *pr,
                                  const flashc_tensor *dout, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v,
                                  const flashc_tensor *out, const flashc_tensor *lse,
                                  flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    flashc_cpu_state *st = state;
    backward_job job = {pr, st->kernels, dout, q, k, v, out, lse, dq, dk, dv,
                        NULL, {NULL, 0}, 0, 0};
    job.q_blocks = flashc_cpu_blocks(pr->seqlen_q, FLASHC_CPU_BLOCK_M);
    job.k_blocks = flashc_cpu_blocks(pr->seqlen_k, FLASHC_CPU_BLOCK_N);

    void *owned = NULL;
    if (pr->workspace) {
        uintptr_t p = ((uintptr_t)pr->workspace + 63) & ~(uintptr_t)63;
        job.delta = (float *)p;
    } else {
        owned = aligned_alloc(64, (flashc_cpu_backward_workspace_size(state, pr) + 63) & ~63ul);
        if (!owned)
            return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY,
                                "cpu backward: out of memory for the delta workspace");
        job.delta = owned;
    }
    size_t dim = (size_t)pr->head_dim;
    size_t floats = 4 * FLASHC_CPU_BLOCK_N * dim + 3 * FLASHC_CPU_BLOCK_M * dim +
                    2 * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    int threads = flashc_threadpool_size(st->pool);
    flashc_status status = flashc_cpu_scratch_alloc(&job.scratch, threads, floats);
    if (status != FLASHC_OK) {
        free(owned);
        return status;
    }
    int64_t bhq = pr->batch * pr->heads_q, bhk = pr->batch * pr->heads_kv;
    flashc_threadpool_run(st->pool, bhq * job.q_blocks, delta_task, &job);
    flashc_threadpool_run(st->pool, bhk * job.k_blocks, dkdv_task, &job);
    flashc_threadpool_run(st->pool, bhq * job.q_blocks, dq_task, &job);
    flashc_cpu_scratch_free(&job.scratch);
    free(owned);
    return FLASHC_OK;
}
