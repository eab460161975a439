/*
 * cpu_forward.c - the FlashAttention-2 forward on the CPU.
 *
 * One task is a block of BLOCK_M queries of one (batch, head). It walks the visible keys
 * BLOCK_N at a time: S = (scale Q) K^T, masked; a running row max m and sum l rescale the
 * accumulator O as each block's exp(S - m) arrives (online softmax); O += P V. At the end
 * O /= l and LSE = m + log(l). Tasks are numbered longest first, so that under a causal mask
 * the blocks with the most keys start first.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct forward_job {
    const flashc_problem *pr;
    const flashc_cpu_kernels *kern;
    const flashc_tensor *q, *k, *v;
    flashc_tensor *out, *lse;
    cpu_scratch scratch;
    int64_t q_blocks;
} forward_job;

/* One block of rows: rescale the accumulator by the new max and turn S into P. */
static void online_softmax_block(const flashc_cpu_kernels *kern, float *s, int m, int n,
                                 float *row_max, float *row_sum, float *acc, int64_t dim)
{
    for (int r = 0; r < m; r++) {
        float *srow = s + r * FLASHC_CPU_BLOCK_N;
        float block_max = -INFINITY;
        for (int c = 0; c < n; c++)
            block_max = srow[c] > block_max ? srow[c] : block_max;
        float new_max = block_max > row_max[r] ? block_max : row_max[r];
        if (new_max == -INFINITY) { /* nothing visible yet in this row */
            memset(srow, 0, (size_t)n * sizeof(float));
            continue;
        }
        float alpha = expf(row_max[r] - new_max); /* 0 when row_max was -inf */
        row_sum[r] = row_sum[r] * alpha + kern->exp_sum(srow, n, new_max);
        row_max[r] = new_max;
        if (alpha != 1.0f) {
            float *arow = acc + r * dim;
            for (int64_t d = 0; d < dim; d++)
                arow[d] *= alpha;
        }
    }
}

static void forward_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int64_t dim = pr->head_dim, bh = pr->batch * pr->heads_q;
    const int64_t qblock = job->q_blocks - 1 - task / bh; /* longest first */
    const int64_t b = (task % bh) / pr->heads_q, h = task % pr->heads_q;
    const int64_t hk = h / (pr->heads_q / pr->heads_kv);
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = (int)(pr->seqlen_q - i0 < FLASHC_CPU_BLOCK_M ? pr->seqlen_q - i0
                                                              : FLASHC_CPU_BLOCK_M);

    float *qbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *acc = qbuf + FLASHC_CPU_BLOCK_M * dim;
    float *kbuf = acc + FLASHC_CPU_BLOCK_M * dim;
    float *vbuf = kbuf + FLASHC_CPU_BLOCK_N * dim;
    float *s = vbuf + FLASHC_CPU_BLOCK_N * dim;
    float *row_max = s + FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    float *row_sum = row_max + FLASHC_CPU_BLOCK_M;

    flashc_cpu_load_rows(qbuf, job->q, b, i0, m, h);
    for (int64_t e = 0; e < (int64_t)m * dim; e++)
        qbuf[e] *= pr->scale;
    memset(acc, 0, (size_t)m * (size_t)dim * sizeof(float));
    for (int r = 0; r < m; r++) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }

    const int64_t key_end = flashc_key_end(pr, i0 + m - 1); /* the last row sees the most */
    for (int64_t j0 = 0; j0 < key_end; j0 += FLASHC_CPU_BLOCK_N) {
        const int n = (int)(key_end - j0 < FLASHC_CPU_BLOCK_N ? key_end - j0
                                                               : FLASHC_CPU_BLOCK_N);
        ptrdiff_t ldk = dim, ldv = dim;
        const float *kb = flashc_cpu_direct_rows(job->k, b, j0, hk, &ldk);
        const float *vb = flashc_cpu_direct_rows(job->v, b, j0, hk, &ldv);
        if (!kb) {
            flashc_cpu_load_rows(kbuf, job->k, b, j0, n, hk);
            kb = kbuf;
        }
        if (!vb) {
            flashc_cpu_load_rows(vbuf, job->v, b, j0, n, hk);
            vb = vbuf;
        }
        kern->gemm_nt(m, n, (int)dim, qbuf, dim, kb, ldk, s, FLASHC_CPU_BLOCK_N);
        flashc_cpu_mask_block(pr, s, FLASHC_CPU_BLOCK_N, i0, m, j0, n);
        online_softmax_block(kern, s, m, n, row_max, row_sum, acc, dim);
        kern->gemm_nn_acc(m, (int)dim, n, s, FLASHC_CPU_BLOCK_N, vb, ldv, acc, dim);
    }

    for (int r = 0; r < m; r++) {
        float *arow = acc + r * dim;
        float lse_r;
        if (row_sum[r] > 0.0f) {
            float inv = 1.0f / row_sum[r];
            for (int64_t d = 0; d < dim; d++)
                arow[d] *= inv;
            lse_r = row_max[r] + logf(row_sum[r]);
        } else { /* every key masked */
            memset(arow, 0, (size_t)dim * sizeof(float));
            lse_r = -INFINITY;
        }
        *flashc_lse_ptr(job->lse, b, h, i0 + r) = lse_r;
    }
    flashc_cpu_store_rows(job->out, acc, b, i0, m, h);
}

flashc_status flashc_cpu_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                 const flashc_tensor *k, const flashc_tensor *v,
                                 flashc_tensor *out, flashc_tensor *lse)
{
    flashc_cpu_state *st = state;
    forward_job job = {pr, st->kernels, q, k, v, out, lse, {NULL, 0}, 0};
    job.q_blocks = flashc_cpu_blocks(pr->seqlen_q, FLASHC_CPU_BLOCK_M);
    size_t dim = (size_t)pr->head_dim;
    size_t floats = 2 * FLASHC_CPU_BLOCK_M * dim + 2 * FLASHC_CPU_BLOCK_N * dim +
                    FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N + 2 * FLASHC_CPU_BLOCK_M;
    int threads = flashc_threadpool_size(st->pool);
    flashc_status status = flashc_cpu_scratch_alloc(&job.scratch, threads, floats);
    if (status != FLASHC_OK)
        return status;
    flashc_threadpool_run(st->pool, job.q_blocks * pr->batch * pr->heads_q, forward_task, &job);
    flashc_cpu_scratch_free(&job.scratch);
    return FLASHC_OK;
}
