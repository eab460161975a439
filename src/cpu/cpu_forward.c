/*
 * cpu_forward.c - the FlashAttention-2 forward on the CPU.
 *
 * Pass 1 packs K and V once per (batch, kv head) and key block into the micro-kernels'
 * layouts (K^T panels, V rows; for bf16 on a set with a bf16 dot product, the pair-interleaved
 * bf16 layouts), so every query block of every query head of the group reuses them instead of
 * converting or transposing again. It also notes the blocks whose V holds a NaN or inf: their
 * P V skips the masked entries (cpu_nonfinite.c), so a hidden key never leaks into a row.
 *
 * Pass 2: one task is a block of BLOCK_M queries of one (batch, head). It walks the visible
 * keys BLOCK_N at a time: S = (scale Q) K^T; the online softmax keeps a running row max m and
 * sum l, rescales the accumulator O only for rows whose max grew, and turns S into P (0 where
 * the causal mask hides a key); O += P V. At the end O /= l and LSE = m + log(l). Key blocks
 * past a query block's last visible key are never visited. Tasks are numbered head by head
 * (the blocks of one head share its packed K/V while it is in cache) and, within a head,
 * longest first, so under a causal mask the pool's dynamic scheduling is left with short
 * blocks to balance the threads at the end. On the bf16 path the softmax also rounds P
 * (softmax16), where no dropout or non-finite V needs the float P afterwards.
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
    cpu_blocks qb, kb; /* query and key blocks of every sequence */
    size_t block_elems; /* elements of one packed key block: dp * BLOCK_N */
    void *kpack, *vpack; /* per sequence b: [heads_kv][key blocks of b][block_elems] */
    uint64_t *vbad;      /* per packed block: its V rows that hold a NaN or inf */
    cpu_scratch scratch;
} forward_job;

static size_t elem_size(const forward_job *job)
{
    return job->use16 ? sizeof(uint16_t) : sizeof(float);
}

/* Key block kblock of kv head hk of sequence b. For a fixed-length batch this is
 * [batch * heads_kv][k_blocks], as before sequences had their own lengths. */
static void *packed_block(const forward_job *job, void *base, int64_t b, int64_t hk,
                          int64_t kblock)
{
    size_t index =
        flashc_cpu_packed_index(&job->kb, job->pr->heads_kv, b, hk, kblock) * job->block_elems;
    return (char *)base + index * elem_size(job);
}

/* Pass 1: one key block of one (sequence, kv head); task numbers follow the packed layout. */
static void pack_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    int64_t b, hk, kblock;
    flashc_cpu_pack_task_of(&job->kb, pr->heads_kv, task, &b, &hk, &kblock);
    const flashc_seq sq = flashc_seq_of(pr, b);
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(sq.nk, j0, FLASHC_CPU_BLOCK_N);
    void *kp = packed_block(job, job->kpack, b, hk, kblock);
    void *vp = packed_block(job, job->vpack, b, hk, kblock);
    job->vbad[flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock)] =
        flashc_cpu_nonfinite_rows(job->v, sq.batch, sq.k0 + j0, n, hk);
    if (job->use16) {
        flashc_cpu_pack_panel16(kp, job->dp, job->k, sq.batch, sq.k0 + j0, n, hk);
        flashc_cpu_pack_vpair16(vp, job->dp, job->v, sq.batch, sq.k0 + j0, n, hk);
    } else {
        flashc_cpu_pack_panel(kp, job->dp, job->k, sq.batch, sq.k0 + j0, n, hk);
        flashc_cpu_pack_rows(vp, job->dp, job->v, sq.batch, sq.k0 + j0, n, hk, 1.0f);
        memset((float *)vp + (size_t)n * job->dp, 0,
               (size_t)(FLASHC_CPU_BLOCK_N - n) * job->dp * sizeof(float));
    }
}

/* Key blocks of one online-softmax step on the bf16 path: the products still run per
 * 64-key block, but the running max, the rescale of O and the O tiles' load and store
 * happen once per step. */
enum { STEP_BLOCKS = 4 };

/* Per-thread scratch, in floats. */
static size_t forward_scratch_floats(int dp)
{
    return flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp) * 2 + /* Q (or Q16), O */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * STEP_BLOCKS + /* S / P */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) +               /* dropout */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) * STEP_BLOCKS + /* P16 */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 4; /* max, sum, ncols, cbeg */
}

/* The key blocks, from kblock on (before jb1), that one softmax step of the bf16 path
 * takes: up to STEP_BLOCKS, ending before a block whose V holds a NaN or inf (that one
 * takes the product that skips masked keys); at least 1. */
static int step_blocks(const forward_job *job, int64_t b, int64_t hk, int64_t kblock,
                       int64_t jb1)
{
    const size_t at = flashc_cpu_packed_index(&job->kb, job->pr->heads_kv, b, hk, kblock);
    int nb = 1;
    while (nb < STEP_BLOCKS && kblock + nb < jb1 && !job->vbad[at] && !job->vbad[at + nb])
        nb++;
    return nb;
}

/* The block's output rows are written once, at its end, and lie a whole row of heads apart:
 * they are asked for a few at a time while its key blocks run (blocks done to upto of
 * steps), so that
 * their first touch does not wait on memory then. */
static void prefetch_out_rows(const forward_job *job, const flashc_seq *sq, int64_t i0, int m,
                              int64_t h, int64_t done, int64_t upto, int64_t steps)
{
    const int r0 = (int)(m * done / steps), r1 = (int)(m * upto / steps);
    for (int r = r0; r < r1; r++)
        flashc_cpu_prefetch_row(job->out, sq->batch, sq->q0 + i0 + r, h, 1);
}

/* Rows [i0, i0 + m) of O of head h, row r scaled by inv[r]: bf16 outputs through the set's
 * store16 where it has one, one pass from the float rows, else scaled in place and rounded
 * by the generic conversion (the same rounding, to nearest even). */
static void store_out_rows(const forward_job *job, float *acc, const flashc_seq *sq, int64_t i0,
                           int m, int64_t h, const float *inv)
{
    const int dp = job->dp;
    if (job->use16 && job->kern->store16 && job->out->dtype == FLASHC_BF16) {
        for (int r = 0; r < m; r++)
            job->kern->store16(flashc_row_ptr(job->out, sq->batch, sq->q0 + i0 + r, h),
                               acc + (ptrdiff_t)r * dp, job->pr->head_dim, inv[r]);
        return;
    }
    for (int r = 0; r < m; r++) {
        float *arow = acc + (ptrdiff_t)r * dp;
        if (inv[r] != 1.0f)
            for (ptrdiff_t d = 0; d < dp; d++)
                arow[d] *= inv[r];
    }
    flashc_cpu_store_rows(job->out, acc, dp, sq->batch, sq->q0 + i0, m, h, 1.0f);
}

/* Pass 2: one block of queries of one (sequence, head). */
static void forward_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp;
    int64_t b, h, qblock;
    if (!job->qb.start) {
        /* fixed length: the query blocks of one head in a row, so the threads working on a
         * head read its packed K/V from their own L2 rather than each task bringing in
         * another head's; within a head the last blocks (longest under causal) first, so
         * the shortest tasks are the ones left to balance the threads at the end */
        const int64_t bh = task / job->qb.per_seq;
        qblock = job->qb.per_seq - 1 - task % job->qb.per_seq;
        b = bh / pr->heads_q;
        h = bh % pr->heads_q;
    } else {
        const int64_t u = task / pr->heads_q;
        h = task % pr->heads_q;
        b = flashc_cpu_blocks_seq(&job->qb, u);
        qblock = flashc_cpu_blocks_count(&job->qb, b) - 1 -
                 (u - flashc_cpu_blocks_start(&job->qb, b));
    }
    const flashc_seq sq = flashc_seq_of(pr, b);
    const int64_t hk = h / (pr->heads_q / pr->heads_kv);
    const int64_t i0 = qblock * FLASHC_CPU_BLOCK_M;
    const int m = flashc_cpu_block_len(sq.nq, i0, FLASHC_CPU_BLOCK_M);

    float *qbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *acc = qbuf + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    float *s = acc + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    float *drop = s + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * STEP_BLOCKS;
    uint16_t *p16 =
        (uint16_t *)(drop + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N));
    float *row_max = (float *)p16 + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) *
                                        STEP_BLOCKS;
    float *row_sum = row_max + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    int *ncols = (int *)(row_sum + flashc_cpu_lines(FLASHC_CPU_BLOCK_M));
    int *cbeg = ncols + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    uint16_t *q16 = (uint16_t *)qbuf;

    if (job->use16)
        flashc_cpu_pack_rows16(q16, dp, job->q, sq.batch, sq.q0 + i0, m, h);
    else
        flashc_cpu_pack_rows(qbuf, dp, job->q, sq.batch, sq.q0 + i0, m, h, pr->scale);
    /* all BLOCK_M rows: tile kernels that work on whole 16-row strips then see zeros */
    memset(acc, 0, (size_t)FLASHC_CPU_BLOCK_M * (size_t)dp * sizeof(float));
    for (int r = 0; r < m; r++) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }

    /* the scale still to apply to S: Q was packed pre-scaled on the float32 path */
    const float s_scale = job->use16 ? pr->scale : 1.0f;
    const int mods = flashc_cpu_has_mods(pr);
    const int dropout = (pr->features & FLASHC_FEATURE_DROPOUT) != 0;
    const cpu_score_mods md = flashc_cpu_mods(pr, &sq, b, h, s_scale);
    int64_t jb0, jb1; /* key blocks outside the band are never visited */
    flashc_cpu_key_blocks(pr, &sq, i0, m, &jb0, &jb1);
    int64_t lo_first, key_end;
    flashc_seq_key_range(pr, &sq, i0 + m - 1, &lo_first, &key_end); /* the last row ends last */
    /* steps of several blocks: plain scores (no feature pass between the products and the
     * softmax) and P made by softmax16 */
    const int steps = job->use16 && kern->softmax16 && !dropout && !mods;
    int nb;
    for (int64_t kblock = jb0; kblock < jb1; kblock += nb) {
        const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
        nb = steps ? step_blocks(job, b, hk, kblock, jb1) : 1;
        int n = flashc_cpu_block_len(key_end, j0, (int64_t)nb * FLASHC_CPU_BLOCK_N);
        int left = flashc_cpu_block_cols(pr, &sq, cbeg, ncols, i0, m, j0, n);
        if (left && nb > 1) { /* a window's left edge: its mask is applied block by block */
            nb = 1;
            n = flashc_cpu_block_len(key_end, j0, FLASHC_CPU_BLOCK_N);
            left = flashc_cpu_block_cols(pr, &sq, cbeg, ncols, i0, m, j0, n);
        }
        const void *kp = packed_block(job, job->kpack, b, hk, kblock);
        const void *vp = packed_block(job, job->vpack, b, hk, kblock);
        prefetch_out_rows(job, &sq, i0, m, h, kblock - jb0, kblock + nb - jb0, jb1 - jb0);
        if (nb > 1) {
            for (int k = 0; k < nb; k++)
                kern->gemm_panel16(m, dp, q16, dp, packed_block(job, job->kpack, b, hk, kblock + k),
                                   s + k * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N);
            kern->softmax16(s, m, n, ncols, s_scale, row_max, row_sum, acc, dp, p16);
            kern->gemm_acc16(m, n, dp, p16, vp, acc);
            continue;
        }
        float sc = s_scale;
        if (job->use16)
            kern->gemm_panel16(m, dp, q16, dp, kp, s);
        else
            kern->gemm_panel(m, (int)pr->head_dim, qbuf, dp, kp, s);
        if (mods || left) { /* feature blocks only: the plain path goes straight on */
            flashc_cpu_apply_mods(&md, s, m, n, i0, j0, cbeg, NULL);
            sc = 1.0f;
        }
        const int bad =
            job->vbad[flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock)] != 0;
        if (job->use16 && kern->softmax16 && !dropout && !bad) { /* P rounded as it is made */
            kern->softmax16(s, m, n, ncols, sc, row_max, row_sum, acc, dp, p16);
            kern->gemm_acc16(m, n, dp, p16, vp, acc);
            continue;
        }
        kern->softmax(s, m, n, ncols, sc, row_max, row_sum, acc, dp);
        if (dropout) { /* after the softmax, so row_sum (and the LSE) stay un-dropped */
            flashc_cpu_dropout_block(pr, b, h, i0, m, j0, n, drop);
            flashc_cpu_mul_block(s, drop, m, n);
        }
        if (bad) {
            /* a NaN or inf in V: P V without the 0 * NaN of the keys a row does not see */
            flashc_cpu_acc_block_sparse(m, n, dp, s, job->v, sq.batch, sq.k0 + j0, hk, acc);
        } else if (job->use16) {
            kern->round_p16(p16, s, m, n);
            kern->gemm_acc16(m, n, dp, p16, vp, acc);
        } else {
            kern->gemm_acc(m, n, dp, s, vp, acc);
        }
    }

    float inv[FLASHC_CPU_BLOCK_M]; /* what each row of O is multiplied by as it is stored */
    for (int r = 0; r < m; r++) {
        float *arow = acc + (ptrdiff_t)r * dp;
        float lse_r;
        inv[r] = 1.0f;
        if (row_sum[r] > 0.0f) {
            inv[r] = 1.0f / row_sum[r];
            lse_r = row_max[r] + logf(row_sum[r]);
        } else if (row_sum[r] == 0.0f) { /* every key masked */
            memset(arow, 0, (size_t)dp * sizeof(float));
            lse_r = -INFINITY;
        } else { /* a NaN score (or scores past float's range): say so, never "masked" */
            for (ptrdiff_t d = 0; d < dp; d++)
                arow[d] = NAN;
            lse_r = NAN;
        }
        *flashc_lse_ptr(job->lse, sq.batch, h, sq.q0 + i0 + r) = lse_r;
    }
    store_out_rows(job, acc, &sq, i0, m, h, inv);
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
    job.block_elems = (size_t)job.dp * FLASHC_CPU_BLOCK_N;
    const int64_t nseq = flashc_num_seqs(pr);
    const int varlen = (pr->features & FLASHC_FEATURE_VARLEN) != 0;

    /* everything is allocated before the first output write: packed K, packed V, the varlen
     * block tables, then the threads' scratch, in one workspace */
    const size_t table_bytes =
        varlen ? flashc_cpu_line_bytes(2 * (size_t)(nseq + 1) * sizeof(int64_t)) : 0;
    cpu_workspace ws;
    const int64_t ktotal = flashc_cpu_total_blocks(pr, 1);
    const size_t pack_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) *
                                                    job.block_elems * elem_size(&job));
    const int threads = flashc_threadpool_size(st->pool);
    const size_t scratch_floats = flashc_cpu_lines(forward_scratch_floats(job.dp));
    const size_t bad_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) * 8);
    flashc_status status = flashc_cpu_workspace_get(
        st,
        2 * pack_bytes + bad_bytes + table_bytes +
            (size_t)threads * scratch_floats * sizeof(float),
        &ws);
    if (status != FLASHC_OK)
        return status;
    job.kpack = ws.base;
    job.vpack = ws.base + pack_bytes;
    job.vbad = (uint64_t *)(ws.base + 2 * pack_bytes);
    int64_t *tables = (int64_t *)(ws.base + 2 * pack_bytes + bad_bytes);
    flashc_cpu_blocks_init(&job.qb, pr, 0, tables);
    flashc_cpu_blocks_init(&job.kb, pr, 1, tables + nseq + 1);
    job.scratch.base = (float *)(ws.base + 2 * pack_bytes + bad_bytes + table_bytes);
    job.scratch.floats_per_thread = scratch_floats;
    flashc_threadpool_run(st->pool, job.kb.total * pr->heads_kv, pack_task, &job);
    flashc_threadpool_run(st->pool, job.qb.total * pr->heads_q, forward_task, &job);
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
