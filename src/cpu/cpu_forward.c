/*
 * cpu_forward.c - the FlashAttention-2 forward on the CPU.
 *
 * Pass 1 packs K and V once per (batch, kv head) and key block into the micro-kernels'
 * layouts (K^T panels, V rows; for bf16 on a set with a bf16 dot product, the pair-interleaved
 * bf16 layouts; for float32 on a set with split products, the three bf16 parts of each
 * value, kernels.h), so every query block of every query head of the group reuses them
 * instead of converting or transposing again. It also notes the blocks whose V holds a NaN or inf: their
 * P V skips the masked entries (cpu_nonfinite.c), so a hidden key never leaks into a row.
 *
 * Pass 2: one task is a block of BLOCK_M queries of one (batch, head), or two of them where a
 * head's packed K/V outgrows L2 (forward_task). It walks the visible keys: S = (scale Q) K^T
 * per BLOCK_N keys; the online softmax keeps a running row max m and sum l, rescales the
 * accumulator O only for rows whose max grew, and turns S into P (0 where the causal mask
 * hides a key); O += P V. On the bf16 path one softmax step takes up to STEP_BLOCKS key
 * blocks (the max, the rescale and O's tile loads once per step) and rounds P to bf16 as it
 * makes it (softmax16); blocks with features, dropout or a non-finite V go one at a time
 * through the float P. On the split float32 path S and P V take the split products, except
 * that S of a block pair whose Q or K holds a NaN or inf takes the float32 kernel (the part
 * products would turn inf * 0 into NaN where float32 gives inf). At the end O /= l and
 * LSE = m + log(l). Key blocks past a query
 * block's last visible key are never visited. Tasks are numbered head by head (the blocks of
 * one head share its packed K/V while it is in cache) and, within a head, longest first, so
 * under a causal mask the pool's dynamic scheduling is left with short blocks to balance the
 * threads at the end.
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
    int use3;  /* float32 split into three bf16 parts, through gemm_panel3 / gemm_acc3 */
    cpu_blocks qb, kb; /* query and key blocks of every sequence */
    size_t block_elems; /* elements of one packed key block: dp * BLOCK_N */
    void *kpack, *vpack; /* per sequence b: [heads_kv][key blocks of b][block_elems] */
    uint64_t *vbad;      /* per packed block: its V rows that hold a NaN or inf */
    uint64_t *kbad;      /* split path: per packed block, 1 if its K holds a NaN or inf */
    int group;           /* query blocks per task, at most (sizes the scratch) */
    int forced_group;    /* FLASHC_CPU_FWD_GROUP, 0 if unset */
    int blocks_to_pair;  /* query blocks enough to run them in pairs (task_group) */
    cpu_blocks tasks;    /* the tasks of one head of each sequence (forward_task) */
    cpu_scratch scratch;
} forward_job;

/* One query block while its key blocks run: where it is, its Q and O and running max and
 * sum (its own share of the thread's scratch), and what its keys are. */
typedef struct fwd_block {
    int64_t b, h, hk, i0, jb0, jb1, key_end;
    int m;
    int qbad; /* split path: Q holds a NaN or inf, so S takes the float32 kernel */
    flashc_seq sq;
    cpu_score_mods md;
    float *qbuf, *acc, *row_max, *row_sum;
    uint16_t *q3; /* split path: Q's three bf16 parts (rows3) */
} fwd_block;

/* The thread's scratch that a block uses only within one step: S (or P), the dropout
 * factors, P16 and the rows' visible columns. */
typedef struct fwd_step_bufs {
    float *s, *drop, *kf; /* kf: a float K^T panel, for S of a non-finite block pair */
    uint16_t *p16;
    int *ncols, *cbeg;
} fwd_step_bufs;

static size_t elem_size(const forward_job *job)
{
    return job->use3 ? 3 * sizeof(uint16_t) : job->use16 ? sizeof(uint16_t) : sizeof(float);
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
    flashc_cpu_task_of(&job->kb, pr->heads_kv, task, &b, &hk, &kblock);
    const flashc_seq sq = flashc_seq_of(pr, b);
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(sq.nk, j0, FLASHC_CPU_BLOCK_N);
    void *kp = packed_block(job, job->kpack, b, hk, kblock);
    void *vp = packed_block(job, job->vpack, b, hk, kblock);
    job->vbad[flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock)] =
        flashc_cpu_nonfinite_rows(job->v, sq.batch, sq.k0 + j0, n, hk);
    if (job->use3) { /* through float buffers in the thread's scratch, then split */
        float *tmp = flashc_cpu_scratch_for(&job->scratch, thread);
        flashc_cpu_pack_panel(tmp, job->dp, job->k, sq.batch, sq.k0 + j0, n, hk);
        job->kbad[flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock)] =
            (uint64_t)job->kern->split3_panel(kp, tmp, job->dp);
        flashc_cpu_pack_rows(tmp, job->dp, job->v, sq.batch, sq.k0 + j0, n, hk, 1.0f);
        memset(tmp + (size_t)n * job->dp, 0,
               (size_t)(FLASHC_CPU_BLOCK_N - n) * job->dp * sizeof(float));
        job->kern->split3_vpair(vp, tmp, job->dp);
    } else if (job->use16) {
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

/* Query blocks per task, at most (see forward_task). */
enum { MAX_GROUP = 2 };

/* Per-thread scratch, in floats: one step's buffers, then each block's own. The S / P
 * buffers come first: packing on the split path uses them for its float rows (up to
 * 64 x 256 floats, which they hold). */
static size_t step_scratch_floats(int dp)
{
    return flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * STEP_BLOCKS + /* S / P */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) +               /* dropout */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) * STEP_BLOCKS + /* P16 */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 2 + /* ncols, cbeg */
           flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_N * dp); /* kf */
}

static size_t block_scratch_floats(int dp)
{
    return flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp) * 2 + /* Q (or Q16), O */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 2 +              /* max, sum */
           flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp * 3 / 2); /* Q's parts */
}

static size_t forward_scratch_floats(int dp, int group)
{
    return step_scratch_floats(dp) + block_scratch_floats(dp) * (size_t)group;
}

static fwd_step_bufs step_bufs_of(float *scratch)
{
    fwd_step_bufs w;
    w.s = scratch;
    w.drop = w.s + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * STEP_BLOCKS;
    w.p16 = (uint16_t *)(w.drop + flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N));
    w.ncols = (int *)((float *)w.p16 +
                      flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) * STEP_BLOCKS);
    w.cbeg = w.ncols + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    w.kf = (float *)w.cbeg + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    return w;
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

/* The split path's packed K and V of a key block are 1.5 times the float32 ones and the
 * tiles go through them 2.5 times as fast as the FMA kernels: at head dim 128 a block is
 * 96 KiB, a head's 3 MiB at 2k keys, and the products waited on L3 for each block. The
 * next block's are asked into L2 while this one runs. */
static void prefetch_next_block(const forward_job *job, const fwd_block *blk, int64_t kblock)
{
    const size_t bytes = job->block_elems * elem_size(job);
    const char *kp = packed_block(job, job->kpack, blk->b, blk->hk, kblock);
    const char *vp = packed_block(job, job->vpack, blk->b, blk->hk, kblock);
    for (size_t at = 0; at < bytes; at += 64) {
        __builtin_prefetch(kp + at, 0, 2);
        __builtin_prefetch(vp + at, 0, 2);
    }
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

/* Pass 2, one query block: its place, its Q packed, O cleared and the running max and sum
 * reset. */
static void block_begin(const forward_job *job, fwd_block *blk, int64_t b, int64_t h,
                        int64_t qblock, float *scratch)
{
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    blk->b = b;
    blk->h = h;
    blk->sq = flashc_seq_of(pr, b);
    blk->hk = h / (pr->heads_q / pr->heads_kv);
    blk->i0 = qblock * FLASHC_CPU_BLOCK_M;
    blk->m = flashc_cpu_block_len(blk->sq.nq, blk->i0, FLASHC_CPU_BLOCK_M);
    blk->qbuf = scratch;
    blk->acc = blk->qbuf + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    blk->row_max = blk->acc + flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp);
    blk->row_sum = blk->row_max + flashc_cpu_lines(FLASHC_CPU_BLOCK_M);
    blk->q3 = (uint16_t *)(blk->row_sum + flashc_cpu_lines(FLASHC_CPU_BLOCK_M));
    /* the scale still to apply to S: Q is packed pre-scaled on the float32 path */
    blk->md = flashc_cpu_mods(pr, &blk->sq, b, h, job->use16 ? pr->scale : 1.0f);
    flashc_cpu_key_blocks(pr, &blk->sq, blk->i0, blk->m, &blk->jb0, &blk->jb1);
    int64_t lo_first; /* the last row ends last */
    flashc_seq_key_range(pr, &blk->sq, blk->i0 + blk->m - 1, &lo_first, &blk->key_end);

    if (job->use16)
        flashc_cpu_pack_rows16((uint16_t *)blk->qbuf, dp, job->q, blk->sq.batch,
                               blk->sq.q0 + blk->i0, blk->m, h);
    else
        flashc_cpu_pack_rows(blk->qbuf, dp, job->q, blk->sq.batch, blk->sq.q0 + blk->i0, blk->m,
                             h, pr->scale);
    blk->qbad = 0;
    if (job->use3) { /* the parts for the tiles; the float rows stay for non-finite blocks */
        job->kern->split3_rows(blk->q3, blk->qbuf, blk->m, dp);
        for (int r = 0; r < blk->m && !blk->qbad; r++)
            blk->qbad = flashc_cpu_row_nonfinite(blk->qbuf + (ptrdiff_t)r * dp, FLASHC_F32, dp);
    }
    /* all BLOCK_M rows: tile kernels that work on whole 16-row strips then see zeros */
    memset(blk->acc, 0, (size_t)FLASHC_CPU_BLOCK_M * (size_t)dp * sizeof(float));
    for (int r = 0; r < blk->m; r++) {
        blk->row_max[r] = -INFINITY;
        blk->row_sum[r] = 0.0f;
    }
}

/* One key block of the general path: features, dropout, non-finite V, float32 products. */
static void block_one_key_block(const forward_job *job, fwd_block *blk, const fwd_step_bufs *w,
                                int64_t kblock, int n, int left)
{
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp, m = blk->m;
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int dropout = (pr->features & FLASHC_FEATURE_DROPOUT) != 0;
    const void *kp = packed_block(job, job->kpack, blk->b, blk->hk, kblock);
    const void *vp = packed_block(job, job->vpack, blk->b, blk->hk, kblock);
    float *s = w->s;
    float sc = blk->md.scale;
    const size_t at = flashc_cpu_packed_index(&job->kb, pr->heads_kv, blk->b, blk->hk, kblock);
    if (job->use16) {
        kern->gemm_panel16(m, dp, (const uint16_t *)blk->qbuf, dp, kp, s);
    } else if (job->use3 && !blk->qbad && !job->kbad[at]) {
        kern->gemm_panel3(m, dp, blk->q3, kp, s);
    } else if (job->use3) {
        /* a NaN or inf in Q or K: float32 products, so that inf * 0 and inf - inf come out as
         * float32's (part products would differ); K^T packed again from the input */
        flashc_cpu_pack_panel(w->kf, dp, job->k, blk->sq.batch, blk->sq.k0 + j0,
                              flashc_cpu_block_len(blk->sq.nk, j0, FLASHC_CPU_BLOCK_N), blk->hk);
        kern->gemm_panel(m, (int)pr->head_dim, blk->qbuf, dp, w->kf, s);
    } else {
        kern->gemm_panel(m, (int)pr->head_dim, blk->qbuf, dp, kp, s);
    }
    if (flashc_cpu_has_mods(pr) || left) { /* feature blocks only: the plain path goes on */
        flashc_cpu_apply_mods(&blk->md, s, m, n, blk->i0, j0, w->cbeg, NULL);
        sc = 1.0f;
    }
    const int bad = job->vbad[at] != 0;
    if (job->use16 && kern->softmax16 && !dropout && !bad) { /* P rounded as it is made */
        kern->softmax16(s, m, n, w->ncols, sc, blk->row_max, blk->row_sum, blk->acc, dp, w->p16);
        kern->gemm_acc16(m, n, dp, w->p16, vp, blk->acc);
        return;
    }
    kern->softmax(s, m, n, w->ncols, sc, blk->row_max, blk->row_sum, blk->acc, dp);
    if (dropout) { /* after the softmax, so row_sum (and the LSE) stay un-dropped */
        flashc_cpu_dropout_block(pr, blk->b, blk->h, blk->i0, m, j0, n, w->drop);
        flashc_cpu_mul_block(s, w->drop, m, n);
    }
    if (bad) {
        /* a NaN or inf in V: P V without the 0 * NaN of the keys a row does not see */
        flashc_cpu_acc_block_sparse(m, n, dp, s, job->v, blk->sq.batch, blk->sq.k0 + j0, blk->hk,
                                    blk->acc);
    } else if (job->use16) {
        kern->round_p16(w->p16, s, m, n);
        kern->gemm_acc16(m, n, dp, w->p16, vp, blk->acc);
    } else if (job->use3) {
        kern->gemm_acc3(m, n, dp, s, vp, blk->acc);
    } else {
        kern->gemm_acc(m, n, dp, s, vp, blk->acc);
    }
}

/* The block's key blocks in [from, to) (within its own [jb0, jb1)): softmax steps of up to
 * STEP_BLOCKS plain blocks on the bf16 path, else one block at a time. */
static void block_keys(const forward_job *job, fwd_block *blk, const fwd_step_bufs *w,
                       int64_t from, int64_t to)
{
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp, m = blk->m;
    const int64_t start = from > blk->jb0 ? from : blk->jb0, end = to < blk->jb1 ? to : blk->jb1;
    const int dropout = (pr->features & FLASHC_FEATURE_DROPOUT) != 0;
    /* steps of several blocks: plain scores (no feature pass between the products and the
     * softmax) and P made by softmax16 */
    const int steps = job->use16 && kern->softmax16 && !dropout && !flashc_cpu_has_mods(pr);
    int nb;
    for (int64_t kblock = start; kblock < end; kblock += nb) {
        const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
        nb = steps ? step_blocks(job, blk->b, blk->hk, kblock, end) : 1;
        int n = flashc_cpu_block_len(blk->key_end, j0, (int64_t)nb * FLASHC_CPU_BLOCK_N);
        int left = flashc_cpu_block_cols(pr, &blk->sq, w->cbeg, w->ncols, blk->i0, m, j0, n);
        if (left && nb > 1) { /* a window's left edge: its mask is applied block by block */
            nb = 1;
            n = flashc_cpu_block_len(blk->key_end, j0, FLASHC_CPU_BLOCK_N);
            left = flashc_cpu_block_cols(pr, &blk->sq, w->cbeg, w->ncols, blk->i0, m, j0, n);
        }
        prefetch_out_rows(job, &blk->sq, blk->i0, m, blk->h, kblock - blk->jb0,
                          kblock + nb - blk->jb0, blk->jb1 - blk->jb0);
        if (job->use3 && kblock + 1 < blk->jb1) /* see prefetch_next_block */
            prefetch_next_block(job, blk, kblock + 1);
        if (nb == 1) {
            block_one_key_block(job, blk, w, kblock, n, left);
            continue;
        }
        for (int k = 0; k < nb; k++)
            kern->gemm_panel16(m, dp, (const uint16_t *)blk->qbuf, dp,
                               packed_block(job, job->kpack, blk->b, blk->hk, kblock + k),
                               w->s + k * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N);
        kern->softmax16(w->s, m, n, w->ncols, blk->md.scale, blk->row_max, blk->row_sum,
                        blk->acc, dp, w->p16);
        kern->gemm_acc16(m, n, dp, w->p16, packed_block(job, job->vpack, blk->b, blk->hk, kblock),
                         blk->acc);
    }
}

/* O /= l, LSE = m + log(l), and both stored. */
static void block_end(const forward_job *job, fwd_block *blk)
{
    const int dp = job->dp;
    float inv[FLASHC_CPU_BLOCK_M]; /* what each row of O is multiplied by as it is stored */
    for (int r = 0; r < blk->m; r++) {
        float *arow = blk->acc + (ptrdiff_t)r * dp;
        const float sum = blk->row_sum[r];
        float lse_r;
        inv[r] = 1.0f;
        if (sum > 0.0f) {
            inv[r] = 1.0f / sum;
            lse_r = blk->row_max[r] + logf(sum);
        } else if (sum == 0.0f) { /* every key masked */
            memset(arow, 0, (size_t)dp * sizeof(float));
            lse_r = -INFINITY;
        } else { /* a NaN score (or scores past float's range): say so, never "masked" */
            for (ptrdiff_t d = 0; d < dp; d++)
                arow[d] = NAN;
            lse_r = NAN;
        }
        *flashc_lse_ptr(job->lse, blk->sq.batch, blk->h, blk->sq.q0 + blk->i0 + r) = lse_r;
    }
    store_out_rows(job, blk->acc, &blk->sq, blk->i0, blk->m, blk->h, inv);
}

/* Query blocks per task for a sequence of nk keys: two where a head's packed K/V would fill
 * a core's L2 (2 MiB on the Xeons measured), or where the call has blocks enough for pairs to
 * leave every thread PAIRED_TASKS_PER_THREAD tasks or more; one otherwise. Pairs pay with
 * many threads: tasks go head by head, so a head's blocks go one each to as many threads,
 * and each of them brings the head's K/V in from L3 for one block, where a pair shares the
 * read (docs/PERF.md: 6-8% at 1k and 16 threads). FLASHC_CPU_FWD_GROUP=1 or 2 sets it for
 * every sequence, so that tests reach both on small shapes (the result is the same either
 * way). */
enum { PAIRED_TASKS_PER_THREAD = 4 };

static int task_group(const forward_job *job, int64_t nk)
{
    if (job->forced_group)
        return job->forced_group;
    if (job->blocks_to_pair)
        return MAX_GROUP;
    return 2 * (size_t)nk * (size_t)job->dp * elem_size(job) >= ((size_t)2 << 20) ? MAX_GROUP : 1;
}

static int forced_group(void)
{
    const char *env = getenv("FLASHC_CPU_FWD_GROUP");
    const int g = env ? atoi(env) : 0;
    return g >= 1 && g <= MAX_GROUP ? g : 0;
}

/* Pass 2: one task is task_group() query blocks of one (sequence, head). The group's blocks
 * take each softmax step's keys in turn, so the packed K/V of the step is read from memory
 * once for all of them while it is in cache: at 4k keys and head dim 128
 * a head's packed K/V (2 MiB) no longer fits L2 and was read again for every block. Each
 * block runs the same steps in the same order whatever the group, so the result does not
 * depend on it. */
static void forward_task(void *ctx, int64_t task, int thread)
{
    forward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    float *scratch = flashc_cpu_scratch_for(&job->scratch, thread);
    const fwd_step_bufs w = step_bufs_of(scratch);
    fwd_block blks[MAX_GROUP];
    int nblk = 0;
    /* The tasks of a sequence run head by head, so the threads working on a head read its
     * packed K/V from their own L2 rather than each task bringing in another head's; within
     * a head the last blocks (longest under causal) first, so the shortest tasks are the
     * ones left to balance the threads at the end. */
    int64_t b, h, nth;
    flashc_cpu_task_of(&job->tasks, pr->heads_q, task, &b, &h, &nth);
    const int group = task_group(job, flashc_seq_of(pr, b).nk);
    const int64_t first = flashc_cpu_blocks_count(&job->qb, b) - 1 - nth * group;
    for (int g = 0; g < group && first - g >= 0; g++, nblk++)
        block_begin(job, &blks[g], b, h, first - g,
                    scratch + step_scratch_floats(job->dp) + block_scratch_floats(job->dp) * g);
    /* steps on a grid of STEP_BLOCKS from key block 0, the same for every block */
    int64_t start = blks[0].jb0, end = 0;
    for (int g = 0; g < nblk; g++) {
        start = blks[g].jb0 < start ? blks[g].jb0 : start;
        end = blks[g].jb1 > end ? blks[g].jb1 : end;
    }
    for (int64_t k0 = start / STEP_BLOCKS * STEP_BLOCKS; k0 < end; k0 += STEP_BLOCKS)
        for (int g = 0; g < nblk; g++)
            block_keys(job, &blks[g], &w, k0, k0 + STEP_BLOCKS);
    for (int g = 0; g < nblk; g++)
        block_end(job, &blks[g]);
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
    job.use3 = pr->dtype == FLASHC_F32 && flashc_cpu_split_f32_enabled() && kern->gemm_panel3 &&
               kern->x3_supported && kern->x3_supported();
    job.block_elems = (size_t)job.dp * FLASHC_CPU_BLOCK_N;
    const int64_t nseq = flashc_num_seqs(pr);
    const int varlen = (pr->features & FLASHC_FEATURE_VARLEN) != 0;

    /* everything is allocated before the first output write: packed K, packed V, the varlen
     * block tables, then the threads' scratch, in one workspace */
    const size_t table_bytes =
        varlen ? flashc_cpu_line_bytes(3 * (size_t)(nseq + 1) * sizeof(int64_t)) : 0;
    cpu_workspace ws;
    const int64_t ktotal = flashc_cpu_total_blocks(pr, 1);
    const size_t pack_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) *
                                                    job.block_elems * elem_size(&job));
    const int threads = flashc_threadpool_size(st->pool);
    job.forced_group = forced_group();
    job.blocks_to_pair = flashc_cpu_total_blocks(pr, 0) * pr->heads_q >=
                         (int64_t)MAX_GROUP * PAIRED_TASKS_PER_THREAD * threads;
    job.group = task_group(&job, pr->max_seqlen_k);
    const size_t scratch_floats = flashc_cpu_lines(forward_scratch_floats(job.dp, job.group));
    const size_t bad_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) * 8) * 2;
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
    job.kbad = (uint64_t *)(ws.base + 2 * pack_bytes + bad_bytes / 2);
    int64_t *tables = (int64_t *)(ws.base + 2 * pack_bytes + bad_bytes);
    flashc_cpu_blocks_init(&job.qb, pr, 0, tables);
    flashc_cpu_blocks_init(&job.kb, pr, 1, tables + nseq + 1);
    job.scratch.base = (float *)(ws.base + 2 * pack_bytes + bad_bytes + table_bytes);
    job.scratch.floats_per_thread = scratch_floats;
    flashc_threadpool_run(st->pool, job.kb.total * pr->heads_kv, pack_task, &job);
    /* tasks per head of each sequence: its query blocks over its group */
    job.tasks.nseq = nseq;
    job.tasks.per_seq = flashc_cpu_blocks(job.qb.per_seq, job.group);
    job.tasks.start = NULL;
    if (varlen) {
        int64_t *start = tables + 2 * (nseq + 1);
        start[0] = 0;
        for (int64_t b = 0; b < nseq; b++)
            start[b + 1] = start[b] + flashc_cpu_blocks(flashc_cpu_blocks_count(&job.qb, b),
                                                        task_group(&job, flashc_seq_of(pr, b).nk));
        job.tasks.start = start;
    }
    job.tasks.total = flashc_cpu_blocks_start(&job.tasks, nseq);
    flashc_threadpool_run(st->pool, job.tasks.total * pr->heads_q, forward_task, &job);
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
