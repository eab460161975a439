/*
 * cpu_backward.c - the FlashAttention-2 backward on the CPU, recomputing P from the LSE.
 *
 * Pass 0 packs, per (batch, kv head) and key block, K^T and V^T panels (for S = Q K^T and
 * dP = dO V^T) and K rows (for dQ += dS K), and per (batch, query head) and query block the Q
 * and dO operands, with delta. Then, for a query block i and key block j:
 *     P = exp(scale S - LSE), dS = P (dP - delta),  delta = rowsum(dO * O)
 *     dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j
 * and dK, dQ are multiplied by scale at the end. Where the forward takes the split float32
 * products (kernels.h), S takes the same kernel on the same parts, so that P matches the
 * forward's LSE, and dQ, dK, dV take split products too; dP stays float32 (backward_job.use3
 * says why). Masked entries have P = dS = 0 whatever
 * dP holds, and a key block whose K holds a NaN or inf takes dS K through the product that
 * skips zero entries (cpu_nonfinite.c), so keys a row cannot see never reach its gradients.
 *
 * The key blocks of each sequence are split into up to four key chunks, a split fixed by the
 * shape alone. dQ_i is summed chunk by chunk: each chunk's partial sum over its key blocks j
 * ascending, from zero, then the partials added in chunk order.
 *
 * Two schedules, chosen from the shape and thread count, giving bitwise the same result:
 *   one pass: one task per (batch, kv head, key chunk) walks its query heads h, query blocks
 *     i and the chunk's visible key blocks j in that order, with dK and dV of the chunk in its
 *     scratch: five block products per (i, j). Its dQ partials go to a workspace slot per
 *     (chunk, head, query block) and a last pass adds them up; with one chunk the task stores
 *     dQ itself. Used when there are enough such tasks to keep every thread busy; the chunks
 *     are there so that one late thread does not hold up the rest at the end.
 *   three passes: delta per query block; dK, dV per key block (walking (h, i)); dQ per query
 *     block (walking the chunks). S and dP are recomputed in the third pass (seven products),
 *     and there are many small tasks, for shapes with few heads.
 * Either way every output element is summed by one task in a fixed order - dK_j and dV_j over
 * (h, i) ascending, dQ_i as above - from the same kernels on the same block boundaries, so the
 * result is race-free and bitwise identical for any thread count, with or without
 * params.deterministic.
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
    int use16; /* bf16 products (kernels.h's bf16 backward path) */
    /* float32 inputs where the forward takes the split products (kernels.h): S = Q K^T
     * through gemm_panel3 as well, from K^T split once here (kt3) and Q per query block. S is
     * then the forward's S to the bit (same parts, same kernel; the scale is applied after,
     * exactly where it is a power of two), so P = exp(scale S - LSE) stays consistent with
     * the forward's LSE: where scores are large (a scale of 1 on inputs of standard deviation
     * 2), float32 FMA S against the split forward's LSE doubled the gradients' error. dP =
     * dO V^T keeps the FMA kernel: dS = P (dP - delta) cancels, and the split product's
     * slightly larger error per term (dropped terms) raised dQ's error at head dim 256 past
     * the float32 tolerance. The three gradient products take split products: dQ += dS K
     * through gemm_acc3 with K split once here (kr3, in vpair3), dV^T += dO^T P and dK^T +=
     * Q^T dS through gemm_tn_acc3 with Q^T and dO^T split once per query block; P and dS are
     * split per block pair as the forward splits P (dP's error is already in dS, and the
     * split's error per term is below the FMA loop's). dK and dV are then accumulated
     * transposed, [dp][64] per key block, as on the bf16 path. The split needs finite
     * operands (0 * inf among the part products), so a block pair takes it only where Q, dO,
     * K, V and delta are all finite (an inf in dO, V or delta can make dS inf, which the split
     * turns into NaN); the others take the float32 kernels (tn_acc_t for the transposed dK, dV). */
    int use3;
    /* use3 at padded head dims of 128 and more: the gradient products split as well. At 64
     * the split products ran no faster than the FMA kernels in cache (a 64 x 64 x 64 block:
     * 2.4 us either way, the split of P or dS a third of it) and the backward 4-11% slower. */
    int grad3;
    void *kt3, *kr3;
    /* use3: per query slot, QBAD_Q if its Q holds a NaN or inf, QBAD_DO if its dO does,
     * QBAD_DELTA if its delta does (an inf in O, from an inf in V anywhere in the row) */
    uint8_t *qbad;
    uint8_t *vbad; /* grad3: per packed block, 1 if its V holds a NaN or inf */
    float *delta; /* three passes: laid out like the LSE, [batch, heads_q, seqlen_q] */
    /* packed; per sequence b: [heads_kv][key blocks of b][dp * BLOCK_N] elements: K^T, V^T
     * panels and K rows as float32, or (use16) K^T, V^T in panel16 and K in vpair16 */
    void *kt, *vt, *kr;
    /* packed once per (query block, query head), see query_slot: Q and dO rows as float32,
     * or (use16) Q, dO rows and Q^T, dO^T in bf16 */
    void *qpack;
    uint64_t *kbad; /* per packed block: its K rows that hold a NaN or inf */
    int64_t chunks; /* key chunks per sequence (fewer for a sequence of fewer key blocks) */
    /* one pass with chunks > 1: dQ partials, [chunk][query block][head][BLOCK_M * dp] */
    float *dq_part;
    cpu_scratch scratch;
    cpu_blocks qb, kb; /* query and key blocks of every sequence */
} backward_job;

enum { QBAD_Q = 1, QBAD_DO = 2, QBAD_DELTA = 4 };

/* Block kblock of (b, hk) in the split kt3 or kr3: 64 x dp elements of three parts. */
static uint16_t *packed3(const backward_job *job, void *base, int64_t b, int64_t hk,
                         int64_t kblock)
{
    return (uint16_t *)base + flashc_cpu_packed_index(&job->kb, job->pr->heads_kv, b, hk, kblock) *
                                  (size_t)job->dp * FLASHC_CPU_BLOCK_N * 3;
}

static void *packed(const backward_job *job, void *base, int64_t b, int64_t hk,
                    int64_t kblock)
{
    const size_t esize = job->use16 ? sizeof(uint16_t) : sizeof(float);
    return (char *)base + flashc_cpu_packed_index(&job->kb, job->pr->heads_kv, b, hk, kblock) *
                              (size_t)job->dp * FLASHC_CPU_BLOCK_N * esize;
}

static void pack_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    int64_t b, hk, kblock;
    flashc_cpu_task_of(&job->kb, pr->heads_kv, task, &b, &hk, &kblock);
    const flashc_seq sq = flashc_seq_of(pr, b);
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N, s0 = sq.k0 + j0;
    const int n = flashc_cpu_block_len(sq.nk, j0, FLASHC_CPU_BLOCK_N);
    job->kbad[flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock)] =
        flashc_cpu_nonfinite_rows(job->k, sq.batch, s0, n, hk);
    if (job->use16) {
        flashc_cpu_pack_panel16(packed(job, job->kt, b, hk, kblock), job->dp, job->k, sq.batch,
                                s0, n, hk);
        flashc_cpu_pack_panel16(packed(job, job->vt, b, hk, kblock), job->dp, job->v, sq.batch,
                                s0, n, hk);
        flashc_cpu_pack_vpair16(packed(job, job->kr, b, hk, kblock), job->dp, job->k, sq.batch,
                                s0, n, hk);
        return;
    }
    flashc_cpu_pack_panel(packed(job, job->kt, b, hk, kblock), job->dp, job->k, sq.batch, s0, n,
                          hk);
    flashc_cpu_pack_panel(packed(job, job->vt, b, hk, kblock), job->dp, job->v, sq.batch, s0, n,
                          hk);
    flashc_cpu_pack_rows(packed(job, job->kr, b, hk, kblock), job->dp, job->k, sq.batch, s0, n,
                         hk, 1.0f);
    if (job->use3)
        job->kern->split3_panel(packed3(job, job->kt3, b, hk, kblock),
                                packed(job, job->kt, b, hk, kblock), job->dp);
    if (job->grad3) {
        const size_t at = flashc_cpu_packed_index(&job->kb, pr->heads_kv, b, hk, kblock);
        float *kr = packed(job, job->kr, b, hk, kblock);
        /* K rows past the block's end zero: the split dS K reduces over 32 keys at a time */
        memset(kr + (size_t)n * job->dp, 0,
               (size_t)(FLASHC_CPU_BLOCK_N - n) * job->dp * sizeof(float));
        job->kern->split3_vpair(packed3(job, job->kr3, b, hk, kblock), kr, job->dp);
        job->vbad[at] = flashc_cpu_nonfinite_rows(job->v, sq.batch, s0, n, hk) != 0;
    }
}

/* dst[dp][64] = rows [s0, s0 + m) of a bf16 tensor transposed, element (row r, dim c) at
 * [c][r], zero at r >= m and c >= head_dim: Q^T and dO^T for the reductions over queries. */
static void pack_t16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                     int m, int64_t h)
{
    const int64_t d = t->shape[3];
    memset(dst, 0, (size_t)dp * FLASHC_CPU_BLOCK_M * sizeof(uint16_t));
    for (int r = 0; r < m; r++) {
        const uint16_t *src = flashc_row_ptr(t, b, s0 + r, h);
        for (int64_t c = 0; c < d; c++)
            dst[c * FLASHC_CPU_BLOCK_M + r] = src[c];
    }
}

/* Stores keys [s0, s0 + n) of head h from a transposed accumulator panel[dp][64] times
 * scale: the use16 and grad3 layout of dK and dV. The panel is read along its rows into tmp[n][dp]
 * (strided writes into a buffer that stays in L1), then stored as rows. */
static void store_t(flashc_tensor *t, const float *panel, float *tmp, int dp, int64_t b,
                    int64_t s0, int n, int64_t h, float scale)
{
    const int64_t d = t->shape[3];
    for (int64_t c = 0; c < d; c++) {
        const float *pr = panel + c * FLASHC_CPU_BLOCK_N;
        for (int r = 0; r < n; r++)
            tmp[(ptrdiff_t)r * dp + c] = pr[r];
    }
    flashc_cpu_store_rows(t, tmp, dp, b, s0, n, h, scale);
}

/* delta[r] = rowsum(dO * O) of m rows from row s0 of the tensors, in float32 in dim order. */
static void compute_delta(const backward_job *job, int64_t tb, int64_t h, int64_t s0, int m,
                          float *obuf, const float *dobuf, float *delta)
{
    const int dp = job->dp;
    flashc_cpu_pack_rows(obuf, dp, job->out, tb, s0, m, h, 1.0f);
    for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        for (int d = 0; d < dp; d++)
            acc += obuf[r * dp + d] * dobuf[r * dp + d];
        delta[r] = acc;
    }
}

static void load_lse(const backward_job *job, int64_t tb, int64_t h, int64_t s0, int m,
                     float *lse)
{
    for (int r = 0; r < m; r++)
        lse[r] = *flashc_lse_ptr(job->lse, tb, h, s0 + r);
}

/* Scratch carve-up shared by both schedules (floats): Q, dO, O, dQ blocks, S, dP, the
 * softcap derivative and dropout factors, and small rows; the one-pass schedule adds dK and
 * dV of a whole sequence. */
typedef struct bwd_scratch {
    float *q, *dout, *o, *dq, *dqc, *s, *dpb, *dcap, *drop, *lse, *delta, *dk, *dv;
    int *ncols, *cbeg;
    /* use16: Q, dO as bf16 rows and transposed; P, dS in query pairs; dS as bf16 rows */
    uint16_t *q16, *do16, *qt16, *dot16, *pp16, *dsp16, *ds16;
    /* use3: Q split (rows3), Q and dO split transposed (rowsT3), and whether they hold a
     * NaN or inf; the split P and dS (qpair3) reuse the bf16 P and dS buffers */
    uint16_t *q3, *qt3, *dot3;
    uint8_t *qbad;
} bwd_scratch;

/* One (sequence, query head) that a query block belongs to. */
typedef struct bwd_head {
    int64_t b, h, hk;
    flashc_seq sq;
    cpu_score_mods md;
} bwd_head;

static bwd_head head_of(const backward_job *job, int64_t b, int64_t h)
{
    bwd_head hd;
    hd.b = b;
    hd.h = h;
    hd.hk = h / (job->pr->heads_q / job->pr->heads_kv);
    hd.sq = flashc_seq_of(job->pr, b);
    hd.md = flashc_cpu_mods(job->pr, &hd.sq, b, h, job->pr->scale);
    return hd;
}

/* C^T[dp][64] += A[m][0:n]^T B[m][dp] in float32: dK^T and dV^T on the split path for a
 * block pair whose operands hold a NaN or inf, every product added as the FMA kernel adds
 * it, so the NaN and inf it makes are the same. */
static void tn_acc_t(int n, int m, int dp, const float *a, const float *b, float *ct)
{
    for (int r = 0; r < m; r++) {
        const float *ar = a + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N;
        for (int d = 0; d < dp; d++) {
            const float x = b[(ptrdiff_t)r * dp + d];
            float *c = ct + (ptrdiff_t)d * FLASHC_CPU_BLOCK_N;
            for (int k = 0; k < n; k++)
                c[k] += ar[k] * x;
        }
    }
}

/* The products of one (query block, key block) pair of a head, i0 and j0 counted in its
 * sequence. dq may be NULL (three-pass dK/dV pass) and dk/dv NULL (three-pass dQ pass). */
static void block_pair(const backward_job *job, const bwd_head *hd, int64_t i0, int m,
                       int64_t j0, const bwd_scratch *w, float *dq, float *dk, float *dv)
{
    const flashc_problem *pr = job->pr;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp, d = (int)pr->head_dim;
    const int64_t kblock = j0 / FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(hd->sq.nk, j0, FLASHC_CPU_BLOCK_N);
    float *s = w->s, *dpb = w->dpb;
    const int left = flashc_cpu_block_cols(pr, &hd->sq, w->cbeg, w->ncols, i0, m, j0, n);
    const size_t at = flashc_cpu_packed_index(&job->kb, pr->heads_kv, hd->b, hd->hk, kblock);
    if (job->use16) {
        kern->gemm_panel16(m, dp, w->q16, dp, packed(job, job->kt, hd->b, hd->hk, kblock), s);
        kern->gemm_panel16(m, dp, w->do16, dp, packed(job, job->vt, hd->b, hd->hk, kblock),
                           dpb);
    } else if (job->use3 && !(*w->qbad & QBAD_Q) && !job->kbad[at]) {
        kern->gemm_panel3(m, dp, w->q3, packed3(job, job->kt3, hd->b, hd->hk, kblock), s);
        kern->gemm_panel(m, d, w->dout, dp, packed(job, job->vt, hd->b, hd->hk, kblock), dpb);
    } else { /* float32 products; on the split path for the blocks whose Q or K holds a NaN
              * or inf, as in the forward, whose S these then match */
        kern->gemm_panel(m, d, w->q, dp, packed(job, job->kt, hd->b, hd->hk, kblock), s);
        kern->gemm_panel(m, d, w->dout, dp, packed(job, job->vt, hd->b, hd->hk, kblock), dpb);
    }
    const int dropout = (pr->features & FLASHC_FEATURE_DROPOUT) != 0;
    const int softcap = (pr->features & FLASHC_FEATURE_SOFTCAP) != 0;
    if (dropout) { /* dP of the dropped P: dO V^T times the factors */
        flashc_cpu_dropout_block(pr, hd->b, hd->h, i0, m, j0, n, w->drop);
        flashc_cpu_mul_block(dpb, w->drop, m, n);
    }
    float sc = pr->scale;
    if (flashc_cpu_has_mods(pr) || left) { /* feature blocks only */
        flashc_cpu_apply_mods(&hd->md, s, m, n, i0, j0, w->cbeg, softcap ? w->dcap : NULL);
        sc = 1.0f;
    }
    kern->p_ds(s, dpb, m, n, w->ncols, sc, w->lse, w->delta);
    if (softcap) /* dS through tanh: d(cap tanh(x / cap)) / dx = 1 - tanh^2 */
        flashc_cpu_mul_block(dpb, w->dcap, m, n);
    if (dropout) /* dV takes the dropped P */
        flashc_cpu_mul_block(s, w->drop, m, n);
    /* a NaN or inf in K: dS K without the 0 * NaN of the keys a row does not see (dS is 0
     * there); dK and dV take Q and dO, which hidden keys do not touch */
    const int kbad = dq && job->kbad[at];
    if (kbad)
        flashc_cpu_acc_block_sparse(m, n, dp, dpb, job->k, hd->sq.batch, hd->sq.k0 + j0, hd->hk,
                                    dq);
    if (job->use16) { /* P and dS rounded to bf16 here, after every float32 feature */
        if (dv) {
            kern->pair_p16(w->pp16, s, m, n);
            kern->gemm_panel16_acc(dp, m, w->dot16, FLASHC_CPU_BLOCK_M, w->pp16, dv);
            kern->pair_p16(w->dsp16, dpb, m, n);
            kern->gemm_panel16_acc(dp, m, w->qt16, FLASHC_CPU_BLOCK_M, w->dsp16, dk);
        }
        if (dq && !kbad) {
            kern->round_p16(w->ds16, dpb, m, n);
            kern->gemm_acc16(m, n, dp, w->ds16, packed(job, job->kr, hd->b, hd->hk, kblock),
                             dq);
        }
        return;
    }
    /* the split products where every operand is finite (backward_job.use3) */
    const int split = job->grad3 && !*w->qbad && !job->kbad[at] && !job->vbad[at];
    if (dv && split) { /* dK^T, dV^T: transposed on the split path, as for use16 */
        kern->split3_qpair(w->pp16, s, m, n);
        kern->gemm_tn_acc3(m, dp, w->dot3, w->pp16, dv);
        kern->split3_qpair(w->pp16, dpb, m, n);
        kern->gemm_tn_acc3(m, dp, w->qt3, w->pp16, dk);
    } else if (dv && job->grad3) {
        tn_acc_t(n, m, dp, s, w->dout, dv);
        tn_acc_t(n, m, dp, dpb, w->q, dk);
    } else if (dv) {
        kern->gemm_tn_acc(n, m, dp, s, w->dout, dv);
        kern->gemm_tn_acc(n, m, dp, dpb, w->q, dk);
    }
    if (dq && !kbad) {
        if (split)
            kern->gemm_acc3(m, n, dp, dpb, packed3(job, job->kr3, hd->b, hd->hk, kblock), dq);
        else
            kern->gemm_acc(m, n, dp, dpb, packed(job, job->kr, hd->b, hd->hk, kblock), dq);
    }
}

/* First query block that may see key block j0 of sequence sq: where the right edge of the
 * band (causal and window_right) reaches j0. */
static int64_t first_query_block(const flashc_problem *pr, const flashc_seq *sq, int64_t j0)
{
    int64_t right = -1; /* -1: no right edge */
    if (pr->causal != FLASHC_CAUSAL_NONE)
        right = 0;
    if ((pr->features & FLASHC_FEATURE_WINDOW) && pr->window_right >= 0 &&
        (right < 0 || pr->window_right < right))
        right = pr->window_right;
    if (right < 0)
        return 0;
    int64_t i = j0 - flashc_seq_offset(pr, sq) - right;
    if (i < 0)
        i = 0;
    return i / FLASHC_CPU_BLOCK_M;
}

static size_t bwd_scratch_floats(int dp, size_t dkdv_rows)
{
    return flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp) * 5 +
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N) * 4 +
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M) * 4 +
           flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * dp / 2) * 4 + /* bf16 Q, dO */
           flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2) * 3 + /* bf16 P, dS */
           flashc_cpu_lines(dkdv_rows * dp) * 2;
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
    w.dqc = w.dq + blk;
    w.s = w.dqc + blk;
    w.dpb = w.s + sc;
    w.dcap = w.dpb + sc;
    w.drop = w.dcap + sc;
    w.lse = w.drop + sc;
    w.delta = w.lse + row;
    w.ncols = (int *)(w.delta + row);
    w.cbeg = w.ncols + row;
    const size_t blk16 = flashc_cpu_lines((size_t)FLASHC_CPU_BLOCK_M * job->dp / 2);
    const size_t sc16 = flashc_cpu_lines(FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N / 2);
    float *p = (float *)w.cbeg + row;
    w.q16 = (uint16_t *)p;
    w.do16 = (uint16_t *)(p += blk16);
    w.qt16 = (uint16_t *)(p += blk16);
    w.dot16 = (uint16_t *)(p += blk16);
    /* pp16, dsp16 and ds16 are contiguous, 3 x 64 x 64 bf16: the split path's qpair3 (three
     * parts of a 64 x 64 score block, split3_qpair) is written from pp16 across all three */
    w.pp16 = (uint16_t *)(p += blk16);
    w.dsp16 = (uint16_t *)(p += sc16);
    w.ds16 = (uint16_t *)(p += sc16);
    w.dk = p + sc16;
    w.dv = w.dk + flashc_cpu_lines(dkdv_rows * job->dp);
    return w;
}

/* Rows of the dQ block to clear: all of them for the bf16 and split products, whose tile
 * kernels accumulate whole 16-row strips. */
static int dq_rows(const backward_job *job, int m)
{
    return job->use16 || job->grad3 ? FLASHC_CPU_BLOCK_M : m;
}

/* ---- the query-side operands ---- */

/* The (sequence, head, query block) of a query-block task, longest first for a fixed-length
 * batch (as the forward numbers them). */
static void query_task(const backward_job *job, int64_t task, int64_t *b, int64_t *h,
                       int64_t *qblock)
{
    const flashc_problem *pr = job->pr;
    if (!job->qb.start) {
        const int64_t bh = pr->batch * pr->heads_q;
        *qblock = job->qb.per_seq - 1 - task / bh;
        *b = (task % bh) / pr->heads_q;
        *h = task % pr->heads_q;
    } else {
        const int64_t u = task / pr->heads_q;
        *h = task % pr->heads_q;
        *b = flashc_cpu_blocks_seq(&job->qb, u);
        *qblock = u - flashc_cpu_blocks_start(&job->qb, *b);
    }
}

static float *delta_row(const backward_job *job, int64_t tb, int64_t h)
{
    return job->delta + (tb * job->pr->heads_q + h) * job->pr->seqlen_q;
}

/* A query-block task's block: its sequence, head, block and rows [i0, i0 + m) (s0 in the
 * batch row). */
typedef struct bwd_qblock {
    int64_t b, h, qblock, i0, s0;
    int m;
    flashc_seq sq;
} bwd_qblock;

static bwd_qblock qblock_of(const backward_job *job, int64_t task)
{
    bwd_qblock q;
    query_task(job, task, &q.b, &q.h, &q.qblock);
    q.sq = flashc_seq_of(job->pr, q.b);
    q.i0 = q.qblock * FLASHC_CPU_BLOCK_M;
    q.s0 = q.sq.q0 + q.i0;
    q.m = flashc_cpu_block_len(q.sq.nq, q.i0, FLASHC_CPU_BLOCK_M);
    return q;
}

/* Bytes per element of a query slot: Q and dO rows as float32 (8), and on the split path
 * Q's three bf16 parts (6 more), and with grad3 those of Q^T and dO^T (12 more). */
static size_t qslot_elem_bytes(const backward_job *job)
{
    return job->grad3 ? 26 : job->use3 ? 14 : 8;
}

/* Points w's query operands at the packed ones of query block qblock of head h of sequence b
 * (row s0 of its batch row tb), and its delta at the rows' delta. */
static void point_queries(const backward_job *job, bwd_scratch *w, int64_t b, int64_t h,
                          int64_t qblock, int64_t tb, int64_t s0)
{
    const size_t elems = (size_t)FLASHC_CPU_BLOCK_M * job->dp;
    const int64_t u = flashc_cpu_blocks_start(&job->qb, b) + qblock;
    const size_t index = (size_t)(u * job->pr->heads_q + h);
    char *slot = (char *)job->qpack + index * elems * qslot_elem_bytes(job);
    if (job->use3) { /* after the float rows: Q's parts */
        w->q3 = (uint16_t *)(slot + elems * 8);
        w->qt3 = w->q3 + 3 * elems;
        w->dot3 = w->qt3 + 3 * elems;
        w->qbad = job->qbad + index;
    }
    if (job->use16) {
        w->q16 = (uint16_t *)slot;
        w->do16 = w->q16 + elems;
        w->qt16 = w->do16 + elems;
        w->dot16 = w->qt16 + elems;
    } else {
        w->q = (float *)slot;
        w->dout = w->q + elems;
    }
    w->delta = delta_row(job, tb, h) + s0;
}

/* Packs the query-side operands of one query block (the bf16 ones also transposed, for the
 * reductions over queries in dK and dV) and computes its delta in float32 from the float32
 * dO, whichever products run. */
static void query_pack_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const int dp = job->dp;
    const bwd_qblock qb = qblock_of(job, task);
    bwd_scratch w = carve(job, thread, 0);
    float *dout32 = w.dout;
    point_queries(job, &w, qb.b, qb.h, qb.qblock, qb.sq.batch, qb.s0);
    if (job->use16) {
        flashc_cpu_pack_rows16(w.q16, dp, job->q, qb.sq.batch, qb.s0, qb.m, qb.h);
        flashc_cpu_pack_rows16(w.do16, dp, job->dout, qb.sq.batch, qb.s0, qb.m, qb.h);
        pack_t16(w.qt16, dp, job->q, qb.sq.batch, qb.s0, qb.m, qb.h);
        pack_t16(w.dot16, dp, job->dout, qb.sq.batch, qb.s0, qb.m, qb.h);
        flashc_cpu_pack_rows(dout32, dp, job->dout, qb.sq.batch, qb.s0, qb.m, qb.h, 1.0f);
    } else {
        flashc_cpu_pack_rows(w.q, dp, job->q, qb.sq.batch, qb.s0, qb.m, qb.h, 1.0f);
        flashc_cpu_pack_rows(w.dout, dp, job->dout, qb.sq.batch, qb.s0, qb.m, qb.h, 1.0f);
        dout32 = w.dout;
        if (job->use3) {
            job->kern->split3_rows(w.q3, w.q, qb.m, dp);
            if (job->grad3) {
                job->kern->split3_rowsT(w.qt3, w.q, qb.m, dp);
                job->kern->split3_rowsT(w.dot3, w.dout, qb.m, dp);
            }
            int bad = 0;
            for (int r = 0; r < qb.m && !(bad & QBAD_Q); r++)
                if (flashc_cpu_row_nonfinite(w.q + (ptrdiff_t)r * dp, FLASHC_F32, dp))
                    bad |= QBAD_Q;
            for (int r = 0; r < qb.m && !(bad & QBAD_DO); r++)
                if (flashc_cpu_row_nonfinite(w.dout + (ptrdiff_t)r * dp, FLASHC_F32, dp))
                    bad |= QBAD_DO;
            *w.qbad = (uint8_t)bad;
        }
    }
    compute_delta(job, qb.sq.batch, qb.h, qb.s0, qb.m, w.o, dout32, w.delta);
    if (job->use3 && flashc_cpu_row_nonfinite(w.delta, FLASHC_F32, qb.m))
        *w.qbad |= QBAD_DELTA;
}

/* ---- key chunks and the dQ partials ---- */

/* Chunks per sequence for this call: up to four, fewer when the (sequence, kv head) pairs are
 * already many tasks, and fewer where the one-pass partials would pass 128 MB. The shape alone
 * decides, never the thread count, so every run sums dQ the same way. */
static int64_t call_chunks(const flashc_problem *pr, int dp)
{
    const int64_t pairs = flashc_num_seqs(pr) * pr->heads_kv;
    int64_t chunks = (64 + pairs - 1) / pairs;
    if (chunks > 4)
        chunks = 4;
    const size_t per_chunk = (size_t)(flashc_cpu_total_blocks(pr, 0) * pr->heads_q) *
                             FLASHC_CPU_BLOCK_M * (size_t)dp * sizeof(float);
    while (chunks > 1 && per_chunk * (size_t)chunks > ((size_t)128 << 20))
        chunks--;
    /* FLASHC_CPU_BWD_CHUNKS=N sets the count, for benchmarks: dQ is then summed another way,
     * so results differ in the last bits from the default */
    const char *force = getenv("FLASHC_CPU_BWD_CHUNKS");
    if (force && atoi(force) >= 1)
        chunks = atoi(force);
    return chunks;
}

/* Chunks of sequence b: one per key block when it has fewer blocks than the call's chunks,
 * one for an empty key sequence. */
static int64_t seq_chunks(const backward_job *job, int64_t b)
{
    const int64_t nkb = flashc_cpu_blocks_count(&job->kb, b);
    return nkb < job->chunks ? (nkb > 0 ? nkb : 1) : job->chunks;
}

/* Key blocks [*cb0, *cb1) of chunk c of sequence b: near-equal ranges. */
static void chunk_range(const backward_job *job, int64_t b, int64_t c, int64_t *cb0,
                        int64_t *cb1)
{
    const int64_t nkb = flashc_cpu_blocks_count(&job->kb, b), cs = seq_chunks(job, b);
    *cb0 = c * nkb / cs;
    *cb1 = (c + 1) * nkb / cs;
}

/* The key blocks of chunk c that query block i0 (m rows) of sequence b visits; 0 if none. */
static int chunk_visit(const backward_job *job, const flashc_seq *sq, int64_t b, int64_t c,
                       int64_t i0, int m, int64_t *jb0, int64_t *jb1)
{
    int64_t cb0, cb1;
    flashc_cpu_key_blocks(job->pr, sq, i0, m, jb0, jb1);
    chunk_range(job, b, c, &cb0, &cb1);
    if (*jb0 < cb0)
        *jb0 = cb0;
    if (*jb1 > cb1)
        *jb1 = cb1;
    return *jb0 < *jb1;
}

static float *dq_slot(const backward_job *job, int64_t c, int64_t b, int64_t h, int64_t qblock)
{
    const int64_t u = flashc_cpu_blocks_start(&job->qb, b) + qblock;
    return job->dq_part + (size_t)((c * job->qb.total + u) * job->pr->heads_q + h) *
                              FLASHC_CPU_BLOCK_M * (size_t)job->dp;
}

/* dq += add, over m rows of dp: the one step in which chunk partials meet. */
static void add_rows(float *dq, const float *add, int m, int dp)
{
    for (size_t e = 0; e < (size_t)m * dp; e++)
        dq[e] += add[e];
}

/* ---- one pass ---- */

/* Task (chunk c, sequence b, kv head hk), chunk-major: under causal masking the first chunks
 * see the most queries, so they are taken first. */
static void onepass_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    const int64_t pairs = flashc_num_seqs(pr) * pr->heads_kv;
    const int64_t c = task / pairs, b = task % pairs / pr->heads_kv, hk = task % pr->heads_kv;
    if (c >= seq_chunks(job, b))
        return;
    const int64_t group = pr->heads_q / pr->heads_kv;
    const int single = seq_chunks(job, b) == 1; /* this task sums and stores dQ itself */
    const flashc_seq sq = flashc_seq_of(pr, b);
    int64_t cb0, cb1;
    chunk_range(job, b, c, &cb0, &cb1);
    const int64_t kfirst = cb0 * FLASHC_CPU_BLOCK_N; /* the chunk's first key, in its sequence */
    const int64_t kend = cb1 * FLASHC_CPU_BLOCK_N < sq.nk ? cb1 * FLASHC_CPU_BLOCK_N : sq.nk;
    const int64_t nkc = kend - kfirst; /* the chunk's keys */
    const size_t rows = (size_t)(cb1 - cb0) * FLASHC_CPU_BLOCK_N;
    const int64_t max_nkb = flashc_cpu_blocks(pr->max_seqlen_k, FLASHC_CPU_BLOCK_N);
    bwd_scratch w =
        carve(job, thread, (size_t)flashc_cpu_blocks(max_nkb, job->chunks) * FLASHC_CPU_BLOCK_N);
    memset(w.dk, 0, rows * dp * sizeof(float));
    memset(w.dv, 0, rows * dp * sizeof(float));

    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const bwd_head hd = head_of(job, b, h);
        for (int64_t ib = 0; ib < flashc_cpu_blocks_count(&job->qb, b); ib++) {
            const int64_t i0 = ib * FLASHC_CPU_BLOCK_M, s0 = sq.q0 + i0;
            const int m = flashc_cpu_block_len(sq.nq, i0, FLASHC_CPU_BLOCK_M);
            int64_t jb0, jb1;
            if (!chunk_visit(job, &sq, b, c, i0, m, &jb0, &jb1) && !single)
                continue; /* the last pass finds no partial of this chunk here */
            point_queries(job, &w, b, h, ib, sq.batch, s0);
            load_lse(job, sq.batch, h, s0, m, w.lse);
            float *dq = single ? w.dq : dq_slot(job, c, b, h, ib);
            memset(dq, 0, (size_t)dq_rows(job, m) * dp * sizeof(float));
            for (int64_t jb = jb0; jb < jb1; jb++) {
                const int64_t j0 = jb * FLASHC_CPU_BLOCK_N;
                block_pair(job, &hd, i0, m, j0, &w, dq, w.dk + (size_t)(j0 - kfirst) * dp,
                           w.dv + (size_t)(j0 - kfirst) * dp);
            }
            if (single)
                flashc_cpu_store_rows(job->dq, w.dq, dp, sq.batch, s0, m, h, pr->scale);
        }
    }
    if (job->use16 || job->grad3) { /* transposed */
        for (int64_t j0 = kfirst; j0 < kfirst + nkc; j0 += FLASHC_CPU_BLOCK_N) {
            const int n = flashc_cpu_block_len(sq.nk, j0, FLASHC_CPU_BLOCK_N);
            const size_t at = (size_t)(j0 - kfirst) * dp;
            store_t(job->dk, w.dk + at, w.o, dp, sq.batch, sq.k0 + j0, n, hk, pr->scale);
            store_t(job->dv, w.dv + at, w.o, dp, sq.batch, sq.k0 + j0, n, hk, 1.0f);
        }
        return;
    }
    flashc_cpu_store_rows(job->dk, w.dk, dp, sq.batch, sq.k0 + kfirst, (int)nkc, hk, pr->scale);
    flashc_cpu_store_rows(job->dv, w.dv, dp, sq.batch, sq.k0 + kfirst, (int)nkc, hk, 1.0f);
}

/* One pass, after the chunk tasks: dQ of a query block of a sequence with several chunks, from
 * the partials of the chunks that visit it, in chunk order. */
static void dq_sum_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const int dp = job->dp;
    const bwd_qblock qb = qblock_of(job, task);
    const int64_t b = qb.b, h = qb.h, qblock = qb.qblock, i0 = qb.i0;
    const flashc_seq sq = qb.sq;
    const int m = qb.m;
    if (seq_chunks(job, b) == 1)
        return; /* stored by its chunk task */
    bwd_scratch w = carve(job, thread, 0);
    int first = 1;
    memset(w.dq, 0, (size_t)m * dp * sizeof(float));
    for (int64_t c = 0; c < seq_chunks(job, b); c++) {
        int64_t jb0, jb1;
        if (!chunk_visit(job, &sq, b, c, i0, m, &jb0, &jb1))
            continue;
        const float *part = dq_slot(job, c, b, h, qblock);
        if (first)
            memcpy(w.dq, part, (size_t)m * dp * sizeof(float));
        else
            add_rows(w.dq, part, m, dp);
        first = 0;
    }
    flashc_cpu_store_rows(job->dq, w.dq, dp, sq.batch, qb.s0, m, h, job->pr->scale);
}

/* ---- three passes ---- */

static void dkdv_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    int64_t kblock, b, hk;
    if (!job->kb.start) { /* causal: the first key blocks see the most */
        const int64_t bhk_count = pr->batch * pr->heads_kv, bhk = task % bhk_count;
        kblock = task / bhk_count;
        b = bhk / pr->heads_kv;
        hk = bhk % pr->heads_kv;
    } else {
        const int64_t u = task / pr->heads_kv;
        hk = task % pr->heads_kv;
        b = flashc_cpu_blocks_seq(&job->kb, u);
        kblock = u - flashc_cpu_blocks_start(&job->kb, b);
    }
    const int64_t group = pr->heads_q / pr->heads_kv;
    const flashc_seq sq = flashc_seq_of(pr, b);
    const int64_t j0 = kblock * FLASHC_CPU_BLOCK_N;
    const int n = flashc_cpu_block_len(sq.nk, j0, FLASHC_CPU_BLOCK_N);
    bwd_scratch w = carve(job, thread, FLASHC_CPU_BLOCK_N);
    /* the whole block: the use16 and grad3 layout is transposed, [dp][64] */
    memset(w.dk, 0, (size_t)FLASHC_CPU_BLOCK_N * dp * sizeof(float));
    memset(w.dv, 0, (size_t)FLASHC_CPU_BLOCK_N * dp * sizeof(float));

    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const bwd_head hd = head_of(job, b, h);
        const int64_t nqb = flashc_cpu_blocks_count(&job->qb, b);
        for (int64_t ib = first_query_block(pr, &sq, j0); ib < nqb; ib++) {
            const int64_t i0 = ib * FLASHC_CPU_BLOCK_M, s0 = sq.q0 + i0;
            const int m = flashc_cpu_block_len(sq.nq, i0, FLASHC_CPU_BLOCK_M);
            int64_t jb0, jb1; /* the same pairs as the one-pass walk */
            flashc_cpu_key_blocks(pr, &sq, i0, m, &jb0, &jb1);
            if (kblock < jb0) /* the window's left edge has passed this key block */
                break;
            if (kblock >= jb1)
                continue;
            point_queries(job, &w, b, h, ib, sq.batch, s0);
            load_lse(job, sq.batch, h, s0, m, w.lse);
            block_pair(job, &hd, i0, m, j0, &w, NULL, w.dk, w.dv);
        }
    }
    if (job->use16 || job->grad3) { /* transposed */
        store_t(job->dk, w.dk, w.o, dp, sq.batch, sq.k0 + j0, n, hk, pr->scale);
        store_t(job->dv, w.dv, w.o, dp, sq.batch, sq.k0 + j0, n, hk, 1.0f);
        return;
    }
    flashc_cpu_store_rows(job->dk, w.dk, dp, sq.batch, sq.k0 + j0, n, hk, pr->scale);
    flashc_cpu_store_rows(job->dv, w.dv, dp, sq.batch, sq.k0 + j0, n, hk, 1.0f);
}

static void dq_task(void *ctx, int64_t task, int thread)
{
    backward_job *job = ctx;
    const flashc_problem *pr = job->pr;
    const int dp = job->dp;
    const bwd_qblock qb = qblock_of(job, task);
    const int64_t b = qb.b, h = qb.h, qblock = qb.qblock, i0 = qb.i0, s0 = qb.s0;
    const bwd_head hd = head_of(job, b, h);
    const flashc_seq sq = qb.sq;
    const int m = qb.m;
    bwd_scratch w = carve(job, thread, 0);
    point_queries(job, &w, b, h, qblock, sq.batch, s0);
    load_lse(job, sq.batch, h, s0, m, w.lse);
    memset(w.dq, 0, (size_t)dq_rows(job, m) * dp * sizeof(float));
    int first = 1;
    for (int64_t c = 0; c < seq_chunks(job, b); c++) { /* the one-pass sum: chunk by chunk */
        int64_t jb0, jb1;
        if (!chunk_visit(job, &sq, b, c, i0, m, &jb0, &jb1))
            continue;
        float *part = first ? w.dq : w.dqc;
        if (!first)
            memset(part, 0, (size_t)dq_rows(job, m) * dp * sizeof(float));
        for (int64_t jb = jb0; jb < jb1; jb++)
            block_pair(job, &hd, i0, m, jb * FLASHC_CPU_BLOCK_N, &w, part, NULL, NULL);
        if (!first)
            add_rows(w.dq, w.dqc, m, dp);
        first = 0;
    }
    flashc_cpu_store_rows(job->dq, w.dq, dp, sq.batch, s0, m, h, pr->scale);
}

size_t flashc_cpu_backward_workspace_size(void *state, const flashc_problem *pr)
{
    return (size_t)(pr->batch * pr->heads_q * pr->seqlen_q) * sizeof(float) + 64;
}

/* One pass when the (sequence, kv head) tasks fill the threads to at least 80% (e.g. 16 heads
 * on 2, 4, 8 or 16 threads); the three-pass schedule's finer tasks otherwise. */
static int use_one_pass(const flashc_problem *pr, int64_t chunks, int threads)
{
    /* FLASHC_CPU_BACKWARD=onepass|threepass forces a schedule, for benchmarks; the result is
     * the same either way */
    const char *force = getenv("FLASHC_CPU_BACKWARD");
    if (force && strcmp(force, "onepass") == 0)
        return 1;
    if (force && strcmp(force, "threepass") == 0)
        return 0;
    if (!(pr->features & FLASHC_FEATURE_VARLEN)) { /* a short key sequence has fewer chunks */
        const int64_t nkb = flashc_cpu_blocks(pr->seqlen_k, FLASHC_CPU_BLOCK_N);
        chunks = nkb < chunks ? (nkb > 0 ? nkb : 1) : chunks;
    }
    int64_t tasks = flashc_num_seqs(pr) * pr->heads_kv * chunks;
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
    /* bf16 inputs on a set with the bf16 products; fp16 stays float32 (bf16 operands would
     * lose three of its mantissa bits). Head dims below 32 stay float32 too: they gain
     * nothing (the bf16 kernels reduce over the padded 32 dims) and dQ = sum_j dS_j K_j, whose
     * terms nearly cancel (sum_j dS_j = 0), loses relatively more to the rounding of dS when
     * few dims carry it (seqlen_q 1, 70 keys, head dim 1: 1.5e-2 against 5.5e-3). */
    const flashc_cpu_kernels *kern = job.kern;
    job.use16 = pr->dtype == FLASHC_BF16 && pr->head_dim >= 32 && kern->gemm_panel16 && kern->gemm_acc16 &&
                kern->round_p16 && kern->gemm_panel16_acc && kern->pair_p16 &&
                kern->bf16_supported && kern->bf16_supported();
    job.use3 = pr->dtype == FLASHC_F32 && flashc_cpu_split_f32_enabled() && kern->gemm_panel3 &&
               kern->x3_supported && kern->x3_supported();
    job.grad3 = job.use3 && job.dp >= 128 && kern->gemm_acc3 && kern->split3_vpair &&
                kern->split3_rowsT && kern->split3_qpair && kern->gemm_tn_acc3;
    const int threads = flashc_threadpool_size(st->pool);
    job.chunks = call_chunks(pr, job.dp);
    const int one_pass = use_one_pass(pr, job.chunks, threads);
    const int64_t nseq = flashc_num_seqs(pr);
    const int varlen = (pr->features & FLASHC_FEATURE_VARLEN) != 0;

    /* everything is allocated before the first output write, in one workspace: packed K^T,
     * V^T and K, the delta rows (when the caller gave no workspace), the varlen block tables,
     * the dQ partials (one pass, several chunks), the packed queries, then the threads'
     * scratch */
    const int64_t ktotal = flashc_cpu_total_blocks(pr, 1);
    const size_t pack_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) *
                                                    (size_t)job.dp * FLASHC_CPU_BLOCK_N *
                                                    (job.use16 ? sizeof(uint16_t)
                                                               : sizeof(float)));
    const size_t delta_bytes =
        pr->workspace ? 0 : flashc_cpu_line_bytes(flashc_cpu_backward_workspace_size(state, pr));
    /* one query block's slot: 64 rows of dp, 8 bytes per element (see point_queries) */
    const size_t qslots = (size_t)(flashc_cpu_total_blocks(pr, 0) * pr->heads_q);
    const size_t qslot_bytes = (size_t)FLASHC_CPU_BLOCK_M * (size_t)job.dp * qslot_elem_bytes(&job);
    const size_t qpack_bytes = flashc_cpu_line_bytes(qslots * qslot_bytes);
    const size_t table_bytes =
        varlen ? flashc_cpu_line_bytes(2 * (size_t)(nseq + 1) * sizeof(int64_t)) : 0;
    const size_t part_bytes =
        one_pass && job.chunks > 1
            ? flashc_cpu_line_bytes((size_t)job.chunks * qslots * FLASHC_CPU_BLOCK_M *
                                    (size_t)job.dp * sizeof(float))
            : 0;
    /* one pass: dK and dV of the longest key chunk */
    const size_t rows =
        one_pass ? (size_t)flashc_cpu_blocks(
                       flashc_cpu_blocks(pr->max_seqlen_k, FLASHC_CPU_BLOCK_N), job.chunks) *
                       FLASHC_CPU_BLOCK_N
                 : FLASHC_CPU_BLOCK_N;
    const size_t scratch_floats = flashc_cpu_lines(bwd_scratch_floats(job.dp, rows));
    const size_t bad_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv) * 8);
    /* use3: split K^T and the query slots' flags; grad3: split K and the key blocks' V flags */
    const size_t pack3_bytes =
        job.use3 ? flashc_cpu_line_bytes(pack_bytes / sizeof(float) * 6) : 0;
    const size_t vbad_bytes = flashc_cpu_line_bytes((size_t)(ktotal * pr->heads_kv));
    const size_t use3_bytes =
        job.use3 ? (job.grad3 ? 2 : 1) * pack3_bytes + flashc_cpu_line_bytes(qslots) +
                       (job.grad3 ? vbad_bytes : 0)
                 : 0;
    cpu_workspace ws;
    flashc_status status = flashc_cpu_workspace_get(
        st,
        3 * pack_bytes + delta_bytes + table_bytes + bad_bytes + part_bytes + qpack_bytes +
            (size_t)threads * scratch_floats * sizeof(float) + use3_bytes,
        &ws);
    if (status != FLASHC_OK)
        return status;
    job.kt = ws.base;
    job.vt = ws.base + pack_bytes;
    job.kr = ws.base + 2 * pack_bytes;
    job.delta = pr->workspace ? (float *)(((uintptr_t)pr->workspace + 63) & ~(uintptr_t)63)
                              : (float *)(ws.base + 3 * pack_bytes);
    int64_t *tables = (int64_t *)(ws.base + 3 * pack_bytes + delta_bytes);
    flashc_cpu_blocks_init(&job.qb, pr, 0, tables);
    flashc_cpu_blocks_init(&job.kb, pr, 1, tables + nseq + 1);
    job.kbad = (uint64_t *)(ws.base + 3 * pack_bytes + delta_bytes + table_bytes);
    char *after_bad = ws.base + 3 * pack_bytes + delta_bytes + table_bytes + bad_bytes;
    job.dq_part = part_bytes ? (float *)after_bad : NULL;
    job.qpack = after_bad + part_bytes;
    job.scratch.base = (float *)(after_bad + part_bytes + qpack_bytes);
    job.scratch.floats_per_thread = scratch_floats;
    if (job.use3) {
        char *p = (char *)job.scratch.base + (size_t)threads * scratch_floats * sizeof(float);
        job.kt3 = p;
        job.qbad = (uint8_t *)(p + pack3_bytes);
        if (job.grad3) {
            job.kr3 = p + pack3_bytes + flashc_cpu_line_bytes(qslots);
            job.vbad = (uint8_t *)job.kr3 + pack3_bytes;
        }
    }

    const int64_t qtasks = job.qb.total * pr->heads_q, ktasks = job.kb.total * pr->heads_kv;
    flashc_threadpool_run(st->pool, ktasks, pack_task, &job);
    flashc_threadpool_run(st->pool, qtasks, query_pack_task, &job);
    if (one_pass) {
        flashc_threadpool_run(st->pool, job.chunks * nseq * pr->heads_kv, onepass_task, &job);
        if (job.dq_part)
            flashc_threadpool_run(st->pool, qtasks, dq_sum_task, &job);
    } else {
        flashc_threadpool_run(st->pool, ktasks, dkdv_task, &job);
        flashc_threadpool_run(st->pool, qtasks, dq_task, &job);
    }
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
