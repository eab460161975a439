/*
 * cpu_backward.c - the FlashAttention-2 backward on the CPU, recomputing P from the LSE.
 *
 * Pass 0 packs, per (batch, kv head) and key block, K^T and V^T panels (for S = Q K^T and
 * dP = dO V^T) and K rows (for dQ += dS K). Then, for a query block i and key block j:
 *     P = exp(scale S - LSE), dS = P (dP - delta),  delta = rowsum(dO * O)
 *     dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j
 * and dK, dQ are multiplied by scale at the end.
 *
 * Two schedules, chosen from the shape and thread count, giving bitwise the same result:
 *   one pass: one task per (batch, kv head) walks its query heads h, query blocks i and
 *     visible key blocks j in that order, with dK and dV of the whole head in its scratch:
 *     five block products per (i, j). Used when there are enough (batch, kv head) tasks to
 *     keep every thread busy.
 *   three passes: delta per query block; dK, dV per key block (walking (h, i)); dQ per query
 *     block (walking j). S and dP are recomputed in the third pass (seven products), and
 *     there are many small tasks, for shapes with few heads.
 * Either way every output element is summed by one task in a fixed order - dK_j and dV_j over
 * (h, i) ascending, dQ_i over j ascending - from the same kernels on the same block
 * boundaries, so the result is race-free and bitwise identical for any thread count, with or
 * without params.deterministic.
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
    int dp;
    float *delta; /* three passes: [batch, heads_q, seqlen_q] */
    float *kt, *vt, *kr; /* packed, [batch * heads_kv][k_blocks][dp * BLOCK_N] */
    cpu_scratch scratch;
    int64_t q_blocks, k_blocks;
} backward_job;

static float *packed(const backward_job *job, float *base, int64_t bhk, int64_t kblock)
{
    return base + ((size_t)bhk * (size_t)job->k_blocks + (size_t)kblock) * (size_t)job->dp *
                      FLASHC_CPU_BLOCK_N;
}

static void pack_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int64_t bhk = task / job->k_blocks, kblock = task % job->k_blocks;
    const int64_t b = bhk / pr->heads_kv, hk = bhk % pr->heads_kv;
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(pr->seqlen_k, j0, FLASHC_CPU_BLOCK_N);
    flashc_cpu_pack_panel(packed(job, job->kt, bhk, kblock), job->dp, job->k, b, j0, n, hk);
    flashc_cpu_pack_panel(packed(job, job->vt, bhk, kblock), job->dp, job->v, b, j0, n, hk);
    flashc_cpu_pack_rows(packed(job, job->kr, bhk, kblock), job->dp, job->k, b, j0, n, hk, 1.0f);
}

/* delta[r] = rowsum(dO * O) of m rows from i0, computed in float32 in dim order. */
static void compute_delta(const backward_job *job, int64_t b, int64_t h, int64_t i0, int m,
                          float *obuf, const float *dobuf, float *delta)
{
    const int dp = job->dp;
    flashc_cpu_pack_rows(obuf, dp, job->out, b, i0, m, h, 1.0f);
    for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        for (int d = 0; d < dp; d++)
            acc += obuf[r * dp + d] * dobuf[r * dp + d];
        delta[r] = acc;
    }
}

static void load_lse(const backward_job *job, int64_t b, int64_t h, int64_t i0, int m,
                     float *lse)
{
    for (int r = 0; r < m; r++)
        lse[r] = *flashc_lse_ptr(job->lse, b, h, i0 + r);
}

/* The products of one (query block, key block) pair, s and dpb being score scratch. dq may be
 * NULL (three-pass dK/dV pass) and dk/dv NULL (three-pass dQ pass). */
static void block_pair(const backward_job *job, int64_t bhk, int64_t i0, int m, int64_t j0,
                       const float *qb, const float *dob, const float *lse, const float *delta,
                       int *ncols, float *s, float *dpb, float *dq, float *dk, float *dv)
{
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp, d = (int)pr->head_dim;
    const int64_t kblock = j0 / FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(pr->seqlen_k, j0, FLASHC_CPU_BLOCK_N);
    flashc_cpu_block_ncols(pr, ncols, i0, m, j0, n);
    kern->gemm_panel(m, d, qb, dp, packed(job, job->kt, bhk, kblock), s);
    kern->gemm_panel(m, d, dob, dp, packed(job, job->vt, bhk, kblock), dpb);
    kern->p_ds(s, dpb, m, n, ncols, pr->scale, lse, delta);
    if (dv) {
        kern->gemm_tn_acc(n, m, dp, s, dob, dv);
        kern->gemm_tn_acc(n, m, dp, dpb, qb, dk);
    }
    if (dq)
        kern->gemm_acc(m, n, dp, dpb, packed(job, job->kr, bhk, kblock), dq);
}

/* First query block that has a query seeing key j0 (the causal rule inverted). */
static int64_t first_query_block(const flashc_problem *pr, int64_t j0)
{
    if (pr->causal == FLASHC_CAUSAL_NONE)
        return 0;
    int64_t i = j0 - flashc_causal_offset(pr);
    if (i < 0)
        i = 0;
    return i / FLASHC_CPU_BLOCK_M;
}

/* Scratch carve-up shared by both schedules (floats): Q, dO, O, dQ blocks, S, dP, and small
 * rows; the one-pass schedule adds dK and dV of a whole head. */
typedef struct bwd_scratch {
    float *q, *dout, *o, *dq, *s, *dpb, *lse, *delta, *dk, *dv;
    int *ncols;
} bwd_scratch;

static size_t bwd_scratch_floats(int dp, size_t dkdv_rows)
{
    return flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp) * 4 +
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * 2 +
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 3 + flashc_cpu_lines(dkdv_rows * dp) * 2;
}

static bwd_scratch carve(const backward_job *job, int thread, size_t dkdv_rows)
{
    const size_t blk = flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * job->dp);
    const size_t sc = flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N);
    const size_t row = flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    bwd_scratch w;
    w.q = flashc_cpu_scratch_for(&job->scratch, thread);
    w.dout = w.q + blk;
    w.o = w.dout + blk;
    w.dq = w.o + blk;
    w.s = w.dq + blk;
    w.dpb = w.s + sc;
    w.lse = w.dpb + sc;
    w.delta = w.lse + row;
    w.ncols = (int *)(w.delta + row);
    w.dk = (float *)w.ncols + row;
    w.dv = w.dk + flashc_cpu_lines(dkdv_rows * job->dp);
    return w;
}

/* ---- one pass ---- */

static void onepass_task(void *ctx, int64_t bhk, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    const int64_t b = bhk / pr->heads_kv, hk = bhk % pr->heads_kv;
    const int64_t group = pr->heads_q / pr->heads_kv;
    const size_t rows = (size_t)job->k_blocks * FLASHC_CPU_BLOCK_N;
    bwd_scratch w = carve(job, thread, rows);
    memset(w.dk, 0, rows * dp * sizeof(float));
    memset(w.dv, 0, rows * dp * sizeof(float));

    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t ib = 0; ib < job->q_blocks; ib++) {
            const int64_t i0 = ib * FLASHC_CPU_BLOCK_M;
            const int m = flashc_cpu_block_len(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
            flashc_cpu_pack_rows(w.q, dp, job->q, b, i0, m, h, 1.0f);
            flashc_cpu_pack_rows(w.dout, dp, job->dout, b, i0, m, h, 1.0f);
            compute_delta(job, b, h, i0, m, w.o, w.dout, w.delta);
            load_lse(job, b, h, i0, m, w.lse);
            memset(w.dq, 0, (size_t)m * dp * sizeof(float));
            const int64_t key_end = flashc_key_end(pr, i0 + m - 1);
            for (int64_t j0 = 0; j0 < key_end; j0 += FLASHC_CPU_BLOCK_N) {
                float *dk = w.dk + (size_t)j0 * dp, *dv = w.dv + (size_t)j0 * dp;
                block_pair(job, bhk, i0, m, j0, w.q, w.dout, w.lse, w.delta, w.ncols, w.s,
                           w.dpb, w.dq, dk, dv);
            }
            flashc_cpu_store_rows(job->dq, w.dq, dp, b, i0, m, h, pr->scale);
        }
    flashc_cpu_store_rows(job->dk, w.dk, dp, b, 0, (int)pr->seqlen_k, hk, pr->scale);
    flashc_cpu_store_rows(job->dv, w.dv, dp, b, 0, (int)pr->seqlen_k, hk, 1.0f);
}

/* ---- three passes ---- */

static float *delta_row(const backward_job *job, int64_t b, int64_t h)
{
    return job->delta + (b * job->pr->heads_q + h) * job->pr->seqlen_q;
}

static void delta_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int64_t qblock = task % job->q_blocks, bh = task / job->q_blocks;
    const int64_t b = bh / pr->heads_q, h = bh % pr->heads_q;
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = flashc_cpu_block_len(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
    bwd_scratch w = carve(job, thread, 0);
    flashc_cpu_pack_rows(w.dout, job->dp, job->dout, b, i0, m, h, 1.0f);
    compute_delta(job, b, h, i0, m, w.o, w.dout, delta_row(job, b, h) + i0);
}

static void dkdv_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    const int64_t bhk_count = pr->batch * pr->heads_kv;
    const int64_t kblock = task / bhk_count; /* causal: the first key blocks see the most */
    const int64_t bhk = task % bhk_count;
    const int64_t b = bhk / pr->heads_kv, hk = bhk % pr->heads_kv;
    const int64_t group = pr->heads_q / pr->heads_kv;
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(pr->seqlen_k, j0, FLASHC_CPU_BLOCK_N);
    bwd_scratch w = carve(job, thread, FLASHC_CPU_BLOCK_N);
    memset(w.dk, 0, (size_t)n * dp * sizeof(float));
    memset(w.dv, 0, (size_t)n * dp * sizeof(float));

    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t ib = first_query_block(pr, j0); ib < job->q_blocks; ib++) {
            const int64_t i0 = ib * FLASHC_CPU_BLOCK_M;
            const int m = flashc_cpu_block_len(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
            if (flashc_key_end(pr, i0 + m - 1) <= j0) /* same pairs as the one-pass walk */
                continue;
            flashc_cpu_pack_rows(w.q, dp, job->q, b, i0, m, h, 1.0f);
            flashc_cpu_pack_rows(w.dout, dp, job->dout, b, i0, m, h, 1.0f);
            load_lse(job, b, h, i0, m, w.lse);
            block_pair(job, bhk, i0, m, j0, w.q, w.dout, w.lse, delta_row(job, b, h) + i0,
                       w.ncols, w.s, w.dpb, NULL, w.dk, w.dv);
        }
    flashc_cpu_store_rows(job->dk, w.dk, dp, b, j0, n, hk, pr->scale);
    flashc_cpu_store_rows(job->dv, w.dv, dp, b, j0, n, hk, 1.0f);
}

static void dq_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    const int64_t bh = pr->batch * pr->heads_q;
    const int64_t qblock = job->q_blocks - 1 - task / bh; /* longest first */
    const int64_t b = (task % bh) / pr->heads_q, h = task % pr->heads_q;
    const int64_t hk = h / (pr->heads_q / pr->heads_kv), bhk = b * pr->heads_kv + hk;
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = flashc_cpu_block_len(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);
    bwd_scratch w = carve(job, thread, 0);
    flashc_cpu_pack_rows(w.q, dp, job->q, b, i0, m, h, 1.0f);
    flashc_cpu_pack_rows(w.dout, dp, job->dout, b, i0, m, h, 1.0f);
    load_lse(job, b, h, i0, m, w.lse);
    memset(w.dq, 0, (size_t)m * dp * sizeof(float));
    const int64_t key_end = flashc_key_end(pr, i0 + m - 1);
    for (int64_t j0 = 0; j0 < key_end; j0 += FLASHC_CPU_BLOCK_N)
        block_pair(job, bhk, i0, m, j0, w.q, w.dout, w.lse, delta_row(job, b, h) + i0,
                   w.ncols, w.s, w.dpb, w.dq, NULL, NULL);
    flashc_cpu_store_rows(job->dq, w.dq, dp, b, i0, m, h, pr->scale);
}

size_t flashc_cpu_backward_workspace_size(void *state, const flashc_problem *pr)
{
    return (size_t)(pr->batch * pr->heads_q * pr->seqlen_q) * sizeof(float) + 64;
}

/* One pass when the (batch, kv head) tasks fill the threads to at least 80% (e.g. 16 heads
 * on 2, 4, 8 or 16 threads); the three-pass schedule's finer tasks otherwise. */
static int use_one_pass(const flashc_problem *pr, int threads)
{
    /* FLASHC_CPU_BACKWARD=onepass|threepass forces a schedule, for benchmarks; the result is
     * the same either way */
    const char *force = getenv("FLASHC_CPU_BACKWARD");
    if (force && strcmp(force, "onepass") == 0)
        return 1;
    if (force && strcmp(force, "threepass") == 0)
        return 0;
    int64_t tasks = pr->batch * pr->heads_kv;
    int64_t rounds = (tasks + threads - 1) / threads;
    return tasks * 5 >= rounds * threads * 4;
}

flashc_status flashc_cpu_backward(void *state, const flashc_problem *pr,
                                  const flashc_tensor *dout, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v,
                                  const flashc_tensor *out, const flashc_tensor *lse,
                                  flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    flashc_cpu_state *st = state;
    backward_job job;
    memset(&job, 0, sizeof job);
    job.pr = pr;
    job.kern = st->kernels;
    job.dout = dout;
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = out;
    job.lse = lse;
    job.dq = dq;
    job.dk = dk;
    job.dv = dv;
    job.dp = flashc_cpu_padded_dim(pr->head_dim);
    job.q_blocks = flashc_cpu_blocks(pr->seqlen_q, FLASHC_CPU_BLOCK_M);
    job.k_blocks = flashc_cpu_blocks(pr->seqlen_k, FLASHC_CPU_BLOCK_N);
    const int threads = flashc_threadpool_size(st->pool);
    const int one_pass = use_one_pass(pr, threads);

    /* everything is allocated before the first output write, in one workspace: packed K^T,
     * V^T and K, the delta rows (three passes, when the caller gave no workspace), then the
     * threads' scratch */
    const size_t pack_bytes = flashc_cpu_line_bytes(
        (size_t)(pr->batch * pr->heads_kv * job.k_blocks) * (size_t)job.dp *
        FLASHC_CPU_BLOCK_N * sizeof(float));
    const size_t delta_bytes =
        one_pass || pr->workspace
            ? 0
            : flashc_cpu_line_bytes(flashc_cpu_backward_workspace_size(state, pr));
    const size_t rows = one_pass ? (size_t)job.k_blocks * FLASHC_CPU_BLOCK_N : FLASHC_CPU_BLOCK_N;
    const size_t scratch_floats = flashc_cpu_lines(bwd_scratch_floats(job.dp, rows));
    cpu_workspace ws;
    flashc_status status = flashc_cpu_workspace_get(
        st, 3 * pack_bytes + delta_bytes + (size_t)threads * scratch_floats * sizeof(float), &ws);
    if (status != FLASHC_OK)
        return status;
    job.kt = (float *)ws.base;
    job.vt = (float *)(ws.base + pack_bytes);
    job.kr = (float *)(ws.base + 2 * pack_bytes);
    if (!one_pass)
        job.delta = pr->workspace
                        ? (float *)(((uintptr_t)pr->workspace + 63) & ~(uintptr_t)63)
                        : (float *)(ws.base + 3 * pack_bytes);
    job.scratch.base = (float *)(ws.base + 3 * pack_bytes + delta_bytes);
    job.scratch.floats_per_thread = scratch_floats;

    const int64_t bhq = pr->batch * pr->heads_q, bhk = pr->batch * pr->heads_kv;
    flashc_threadpool_run(st->pool, bhk * job.k_blocks, pack_task, &job);
    if (one_pass) {
        flashc_threadpool_run(st->pool, bhk, onepass_task, &job);
    } else {
        flashc_threadpool_run(st->pool, bhq * job.q_blocks, delta_task, &job);
        flashc_threadpool_run(st->pool, bhk * job.k_blocks, dkdv_task, &job);
        flashc_threadpool_run(st->pool, bhq * job.q_blocks, dq_task, &job);
    }
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
