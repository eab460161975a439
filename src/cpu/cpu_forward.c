/*
 * cpu_forward.c - the FlashAttention-2 forward on the CPU.
 *
 * Pass 1 packs K and V once per (batch, kv head) and key block into the micro-kernels'
 * layouts (K^T panels, V rows; for bf16 on a set with a bf16 dot product, the pair-interleaved
 * bf16 layouts), so every query block of every query head of the group reuses them instead of
 * converting or transposing again.
 *
 * Pass 2: one task is a block of BLOCK_M queries of one (batch, head). It walks the visible
 * keys BLOCK_N at a time: S = (scale Q) K^T; the online softmax keeps a running row max m and
 * sum l, rescales the accumulator O only for rows whose max grew, and turns S into P (0 where
 * the causal mask hides a key); O += P V. At the end O /= l and LSE = m + log(l). Key blocks
 * past a query block's last visible key are never visited. Tasks are numbered longest first,
 * so under a causal mask the blocks with the most keys start first and the pool's dynamic
 * scheduling balances the rest.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct forward_job {
    const flashc_problem *pr;
    const flashc_cpu_kernels *kern;
    const flashc_tensor *q, *k, *v;
    flashc_tensor *out, *lse;
    int dp;
    int use16; /* bf16 operands through gemm_panel16 / gemm_acc16 */
    int64_t q_blocks, k_blocks;
    size_t block_elems; /* elements of one packed key block: dp * BLOCK_N */
    void *kpack, *vpack; /* [batch * heads_kv][k_blocks][block_elems] */
    cpu_scratch scratch;
} forward_job;

static size_t elem_size(const forward_job *job)
{
    return job->use16 ? sizeof(uint16_t) : sizeof(float);
}

static void *packed_block(const forward_job *job, void *base, int64_t bhk, int64_t kblock)
{
    size_t index = ((size_t)bhk * (size_t)job->k_blocks + (size_t)kblock) * job->block_elems;
    return (char *)base + index * elem_size(job);
}

/* Pass 1: one key block of one (batch, kv head). */
static void pack_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int64_t bhk = task / job->k_blocks, kblock = task % job->k_blocks;
    const int64_t b = bhk / pr->heads_kv, hk = bhk % pr->heads_kv;
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(pr->seqlen_k, j0, FLASHC_CPU_BLOCK_N);
    void *kp = packed_block(job, job->kpack, bhk, kblock);
    void *vp = packed_block(job, job->vpack, bhk, kblock);
    if (job->use16) {
        flashc_cpu_pack_panel16(kp, job->dp, job->k, b, j0, n, hk);
        flashc_cpu_pack_vpair16(vp, job->dp, job->v, b, j0, n, hk);
    } else {
        flashc_cpu_pack_panel(kp, job->dp, job->k, b, j0, n, hk);
        flashc_cpu_pack_rows(vp, job->dp, job->v, b, j0, n, hk, 1.0f);
        memset((float *)vp + (size_t)n * job->dp, 0,
               (size_t)(FLASHC_CPU_BLOCK_N - n) * job->dp * sizeof(float));
    }
}

/* Per-thread scratch, in floats. */
static size_t forward_scratch_floats(int dp)
{
    return flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp) * 2 + /* Q (or Q16), O */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) +   /* S / P */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) + /* P16 */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 3;                     /* max, sum, ncols */
}

/* Pass 2: one block of queries of one (batch, head). */
static void forward_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp;
    const int64_t bh = pr->batch * pr->heads_q;
    const int64_t qblock = job->q_blocks - 1 - task / bh; /* longest first */
    const int64_t b = (task % bh) / pr->heads_q, h = task % pr->heads_q;
    const int64_t hk = h / (pr->heads_q / pr->heads_kv), bhk = b * pr->heads_kv + hk;
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = flashc_cpu_block_len(pr->seqlen_q, i0, FLASHC_CPU_BLOCK_M);

    float *qbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *acc = qbuf + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    float *s = acc + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    uint16_t *p16 = (uint16_t *)(s + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N));
    float *row_max = (float *)p16 + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2);
    float *row_sum = row_max + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    int *ncols = (int *)(row_sum + flashc_cpu_lines(FLASHC_CPU_BLOCK_M));
    uint16_t *q16 = (uint16_t *)qbuf;

    if (job->use16)
        flashc_cpu_pack_rows16(q16, dp, job->q, b, i0, m, h);
    else
        flashc_cpu_pack_rows(qbuf, dp, job->q, b, i0, m, h, pr->scale);
    /* all BLOCK_M rows: tile kernels that work on whole 16-row strips then see zeros */
    memset(acc, 0, (size_t)FLASHC_CPU_BLOCK_M * (size_t)dp * sizeof(float));
    for (int r = 0; r < m; r++) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }

    const int64_t key_end = flashc_key_end(pr, i0 + m - 1); /* the last row sees the most */
    for (int64_t j0 = 0; j0 < key_end; j0 += FLASHC_CPU_BLOCK_N) {
        const int n = flashc_cpu_block_len(key_end, j0, FLASHC_CPU_BLOCK_N);
        const int64_t kblock = j0 / FLASHC_CPU_BLOCK_N;
        const void *kp = packed_block(job, job->kpack, bhk, kblock);
        const void *vp = packed_block(job, job->vpack, bhk, kblock);
        flashc_cpu_block_ncols(pr, ncols, i0, m, j0, n);
        if (job->use16) {
            kern->gemm_panel16(m, dp, q16, dp, kp, s);
            kern->softmax(s, m, n, ncols, pr->scale, row_max, row_sum, acc, dp);
            kern->round_p16(p16, s, m, n);
            kern->gemm_acc16(m, n, dp, p16, vp, acc);
        } else {
            kern->gemm_panel(m, (int)pr->head_dim, qbuf, dp, kp, s);
            kern->softmax(s, m, n, ncols, 1.0f, row_max, row_sum, acc, dp);
            kern->gemm_acc(m, n, dp, s, vp, acc);
        }
    }

    for (int r = 0; r < m; r++) {
        float *arow = acc + (ptrdiff_t)r * dp;
        float lse_r, inv = 1.0f;
        if (row_sum[r] > 0.0f) {
            inv = 1.0f / row_sum[r];
            lse_r = row_max[r] + logf(row_sum[r]);
        } else { /* every key masked */
            memset(arow, 0, (size_t)dp * sizeof(float));
            lse_r = -INFINITY;
        }
        *flashc_lse_ptr(job->lse, b, h, i0 + r) = lse_r;
        flashc_cpu_store_rows(job->out, arow, dp, b, i0 + r, 1, h, inv);
    }
}

flashc_status flashc_cpu_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                 const flashc_tensor *k, const flashc_tensor *v,
                                 flashc_tensor *out, flashc_tensor *lse)
{
    flashc_cpu_state *st = state;
    const flashc_cpu_kernels *kern = st->kernels;
    forward_job job;
    memset(&job, 0, sizeof job);
    job.pr = pr;
    job.kern = kern;
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = out;
    job.lse = lse;
    job.dp = flashc_cpu_padded_dim(pr->head_dim);
    job.use16 = pr->dtype == FLASHC_BF16 && kern->gemm_panel16 && kern->bf16_supported &&
                kern->bf16_supported();
    job.q_blocks = flashc_cpu_blocks(pr->seqlen_q, FLASHC_CPU_BLOCK_M);
    job.k_blocks = flashc_cpu_blocks(pr->seqlen_k, FLASHC_CPU_BLOCK_N);
    job.block_elems = (size_t)job.dp * FLASHC_CPU_BLOCK_N;

    /* everything is allocated before the first output write: packed K, packed V, then the
     * threads' scratch, in one workspace */
    const size_t pack_bytes = flashc_cpu_line_bytes(
        (size_t)(pr->batch * pr->heads_kv * job.k_blocks) * job.block_elems * elem_size(&job));
    const int threads = flashc_threadpool_size(st->pool);
    const size_t scratch_floats = flashc_cpu_lines(forward_scratch_floats(job.dp));
    cpu_workspace ws;
    flashc_status status = flashc_cpu_workspace_get(
        st, 2 * pack_bytes + (size_t)threads * scratch_floats * sizeof(float), &ws);
    if (status != FLASHC_OK)
        return status;
    job.kpack = ws.base;
    job.vpack = ws.base + pack_bytes;
    job.scratch.base = (float *)(ws.base + 2 * pack_bytes);
    job.scratch.floats_per_thread = scratch_floats;
    flashc_threadpool_run(st->pool, pr->batch * pr->heads_kv * job.k_blocks, pack_task, &job);
    flashc_threadpool_run(st->pool, job.q_blocks * pr->batch * pr->heads_q, forward_task, &job);
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
