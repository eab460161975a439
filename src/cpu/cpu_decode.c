/*
 * cpu_decode.c - flashc_forward_kvcache on the CPU: a few queries against long, contiguous or
 * paged, caches, with split-KV (Flash-Decoding).
 *
 * Decoding is memory-bound: each cached key and value is used by only Nq queries of each
 * query head. So a task takes every query head of one kv head's GQA group at once (the rows
 * of a task are the pairs (query i, head g of the group), up to 64 of them), and each key
 * block of 64 is read from memory once per task and used by all those rows. The products
 * take the cache rows where they lie, through one pointer per key (the block table when
 * paged, so pages need not be contiguous or in order), with no packing into the forward's
 * K^T and V-pair layouts, which cost three times the products: S by dot products over K
 * rows (kernels.h decode_qk), the forward's online softmax, then O += P V as
 * multiply-adds over V rows (decode_pv), each row converted from its dtype as it is read.
 *
 * With a small batch there are fewer (sequence, kv head) pairs than threads, so each
 * sequence's keys are cut into splits that run as separate tasks, each writing a partial
 * (O, LSE) in float32; a second pass combines the splits of every sequence with the host LSE
 * merge of merge.c (flashc_host_merge), the same code flashc_merge runs. The split count
 * comes from flashc_kvcache_num_splits (kvcache.c), unless the caller forces one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"

/* Rows (query, head of the group) of one task, and keys per block. */
enum { ROWS = FLASHC_CPU_BLOCK_M, KEYS = FLASHC_CPU_BLOCK_N };

/* The host merge keeps up to this many parts' weights on its stack; more splits are merged
 * in groups, so the merge never allocates (it runs after the outputs started changing). */
enum { MERGE_GROUP = 16 };

typedef struct decode_job {
    const flashc_kvcache_problem *pr;
    const flashc_cpu_kernels *kern;
    const flashc_tensor *q, *kc, *vc;
    flashc_tensor *out, *lse;
    int dp;
    void (*qk)(int, int, int64_t, const float *, int, const void *const *, int,
               const void *const *, int, float *);
    void (*qk16)(int, int, int64_t, const uint16_t *, int, const void *const *, float,
                 const void *const *, int, float *);
    void (*pv)(int, int, int64_t, const float *, const void *const *, int, const void *const *,
               int, float *, int);
    void (*pv16)(int, int, int64_t, const uint16_t *, const void *const *, const void *const *,
                 int, float *, int);
    int use16; /* bf16 cache and a bf16 dot product: S through qk16, O through pv16 */
    int (*nonfinite)(const void *const *, int, int64_t, int);
    int64_t group;      /* query heads per kv head */
    int64_t rows_total; /* (query, head) pairs of one kv head's group: group * Nq */
    int64_t chunks;     /* row chunks of ROWS per kv head (1 unless rows_total > ROWS) */
    int64_t heads_per_task; /* kv heads whose groups one task takes together */
    int64_t seg_stride; /* rows between their segments (see task_rows) */
    int64_t tiles;      /* tasks per sequence and split along the kv heads */
    int32_t splits;
    int64_t split_keys; /* keys per split (the last may be shorter or empty) */
    float *part_out;    /* splits > 1: [splits][B][Nq][Hq][D] */
    float *part_lse;    /* splits > 1: [splits][B][Hq][Nq] */
    cpu_scratch scratch;
} decode_job;

static size_t decode_scratch_floats(int dp)
{
    return flashc_cpu_lines((size_t)ROWS * dp) * 2 + /* Q, O */
           flashc_cpu_lines(ROWS * KEYS) +           /* S / P */
           flashc_cpu_lines(ROWS * KEYS / 2) +       /* P as bf16 */
           flashc_cpu_lines(ROWS) * 3;               /* max, sum, ncols */
}

/* The sequence as flashc_seq_key_range sees it: Nq queries against L_b keys. */
static flashc_seq seq_of(const flashc_kvcache_problem *pr, int64_t b)
{
    flashc_seq s;
    s.batch = b;
    s.q0 = s.k0 = 0;
    s.nq = pr->base.seqlen_q;
    s.nk = flashc_kvcache_len(pr, b);
    return s;
}

/* Softcap and ALiBi of row r (query i, head h) on columns [a, e) of block j0; the scores
 * are already scaled (Q was packed pre-scaled). */
static void apply_mods(const flashc_kvcache_problem *pr, float *srow, int a, int e, int64_t i,
                       int64_t h, int64_t b, int64_t off, int64_t j0)
{
    const flashc_problem *bp = &pr->base;
    const float cap = (bp->features & FLASHC_FEATURE_SOFTCAP) ? bp->softcap : 0.0f;
    const float slope = flashc_alibi_slope(bp, b, h);
    const int alibi = (bp->features & FLASHC_FEATURE_ALIBI) != 0;
    for (int c = a; c < e; c++) {
        float x = srow[c];
        if (cap > 0.0f)
            x = cap * tanhf(x / cap);
        if (alibi) {
            int64_t dist = i + off - (j0 + c);
            x -= slope * (float)(dist < 0 ? -dist : dist);
        }
        srow[c] = x;
    }
}

/* The rows of keys [j0, min(j0 + KEYS, end)) of kv head h (none when j0 >= end); returns
 * their count. */
static int block_rows(const flashc_kvcache_problem *pr, const flashc_tensor *cache, int64_t b,
                      int64_t h, int64_t j0, int64_t end, const void **rows)
{
    const int n = j0 >= end ? 0 : (int)(end - j0 < KEYS ? end - j0 : KEYS);
    for (int c = 0; c < n; c++)
        rows[c] = flashc_kvcache_row(pr, cache, b, j0 + c, h);
    return n;
}

/* 1 if any of the first n probabilities of the m rows (stride KEYS) is zero. */
static int has_zero(const float *p, int m, int n)
{
    int z = 0;
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++)
            z |= p[(size_t)r * KEYS + c] == 0.0f;
    return z;
}

/* Row r of a task: query i, query head h, kv head hk. The rows are the (query, head) pairs of
 * the task's kv heads, kv head by kv head (a "segment" each), or, when one kv head's group
 * has more than ROWS pairs, ROWS of them from row chunk `chunk`. */
typedef struct task_rows {
    int64_t b, hk0, nheads; /* kv heads [hk0, hk0 + nheads) */
    int64_t r0;             /* first pair of the group (row chunks), else 0 */
    int m;                  /* rows, gaps included */
    int seg;                /* rows per kv head segment (m when nheads == 1) */
    int stride;             /* rows from one segment to the next (seg); rows between
                               segments would be gaps that see no key */
} task_rows;

/* Row r of the task, or 0 for a gap row. */
static int row_of(const decode_job *job, const task_rows *t, int r, int64_t *i, int64_t *h,
                  int64_t *hk)
{
    if (r % t->stride >= t->seg)
        return 0;
    const int64_t pair = t->r0 + r % t->stride;
    *hk = t->hk0 + r / t->stride;
    *i = pair / job->group;
    *h = *hk * job->group + pair % job->group;
    return 1;
}

static void decode_task(void *ctx, int64_t task, int thread)
{
    decode_job *job = ctx;
    const flashc_kvcache_problem *pr = job->pr;
    const flashc_problem *bp = &pr->base;
    const flashc_cpu_kernels *kern = job->kern;
    const int dp = job->dp;
    const int64_t dim = bp->head_dim;
    const int32_t split = (int32_t)(task % job->splits);
    int64_t rest = task / job->splits;
    const int64_t chunk = rest % job->chunks;
    rest /= job->chunks;
    const int64_t tile = rest % job->tiles;
    task_rows tr;
    tr.b = rest / job->tiles;
    tr.hk0 = tile * job->heads_per_task;
    tr.nheads = bp->heads_kv - tr.hk0 < job->heads_per_task ? bp->heads_kv - tr.hk0
                                                            : job->heads_per_task;
    tr.r0 = chunk * ROWS;
    if (job->chunks > 1) {
        tr.m = (int)(job->rows_total - tr.r0 < ROWS ? job->rows_total - tr.r0 : ROWS);
        tr.seg = tr.stride = tr.m;
    } else {
        tr.seg = (int)job->rows_total;
        tr.stride = (int)job->seg_stride;
        tr.m = (int)((tr.nheads - 1) * tr.stride + tr.seg);
    }
    const int64_t b = tr.b, m = tr.m;

    float *qbuf = flashc_cpu_scratch_for(&job->scratch, thread);
    float *acc = qbuf + flashc_cpu_lines((size_t)ROWS * dp);
    float *s = acc + flashc_cpu_lines((size_t)ROWS * dp);
    float *row_max = s + flashc_cpu_lines(ROWS * KEYS);
    float *row_sum = row_max + flashc_cpu_lines(ROWS);
    int *ncols = (int *)(row_sum + flashc_cpu_lines(ROWS));
    uint16_t *p16 = (uint16_t *)(row_sum + 2 * flashc_cpu_lines(ROWS));
    const void *rows[KEYS], *next[KEYS];
    uint16_t *q16 = (uint16_t *)qbuf; /* the bf16 path's Q, in the float Q's place */

    const flashc_seq sq = seq_of(pr, b);
    const int64_t off = flashc_seq_offset(bp, &sq);
    int64_t lo[ROWS], hi[ROWS];
    /* this split's keys, and the part of them some row of the task sees */
    const int64_t ks = (int64_t)split * job->split_keys;
    const int64_t ke = ks + job->split_keys < sq.nk ? ks + job->split_keys : sq.nk;
    /* empty until a row sees a key: a split past a short sequence's end (ks > ke) reads no
     * slot, since a paged sequence's block_table row holds no valid page there */
    int64_t jbeg = INT64_MAX, jend = 0;
    for (int r = 0; r < m; r++) {
        int64_t i, h, hk;
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
        if (!row_of(job, &tr, r, &i, &h, &hk)) { /* a gap: zero Q, no key */
            memset(qbuf + (size_t)r * dp, 0, (size_t)dp * sizeof(float));
            if (job->use16)
                memset(q16 + (size_t)r * dp, 0, (size_t)dp * sizeof(uint16_t));
            lo[r] = hi[r] = 0;
            continue;
        }
        if (job->use16) /* the bf16 rows as they are; the scale goes on S */
            flashc_cpu_pack_rows16(q16 + (size_t)r * dp, dp, job->q, b, i, 1, h);
        else
            flashc_cpu_pack_rows(qbuf + (size_t)r * dp, dp, job->q, b, i, 1, h, bp->scale);
        flashc_seq_key_range(bp, &sq, i, &lo[r], &hi[r]);
        lo[r] = lo[r] > ks ? lo[r] : ks;
        hi[r] = hi[r] < ke ? hi[r] : ke;
        if (lo[r] < hi[r]) {
            jbeg = lo[r] < jbeg ? lo[r] : jbeg;
            jend = hi[r] > jend ? hi[r] : jend;
        }
    }
    /* every row of the kernels' tiles and every padded dim starts at zero, so the products
     * never read stale values */
    memset(acc, 0, (size_t)ROWS * dp * sizeof(float));
    const int mods = flashc_cpu_has_mods(bp);

    /* the kv heads of a task are read together, key by key: a cache row holds them side by
     * side, so the task walks memory forward instead of striding over the other heads (one
     * task per kv head reached a tenth of the bandwidth, stalled on TLB and cache misses).
     * While a head's rows of one block are used, the kernels ask for the same head's rows of
     * the next block, a line at a time between their arithmetic: the hardware's own
     * prefetchers did not keep up with the head-by-head order, and one burst of requests for
     * a whole block (128 KiB at d = 128, bf16, 4 kv heads) only stalled the core. */
    for (int64_t j0 = jbeg; j0 < jend; j0 += KEYS) {
        const int n = (int)(jend - j0 < KEYS ? jend - j0 : KEYS);
        for (int64_t t = 0; t < tr.nheads; t++) {
            block_rows(pr, job->kc, b, tr.hk0 + t, j0, jend, rows);
            const int nn = block_rows(pr, job->kc, b, tr.hk0 + t, j0 + KEYS, jend, next);
            float *st = s + (size_t)t * tr.stride * KEYS;
            if (job->use16)
                job->qk16(tr.seg, n, dim, q16 + (size_t)t * tr.stride * dp, dp, rows,
                          bp->scale, next, nn, st);
            else
                job->qk(tr.seg, n, dim, qbuf + (size_t)t * tr.stride * dp, dp, rows,
                        bp->dtype, next, nn, st);
        }
        for (int r = 0; r < m; r++) {
            int64_t a = lo[r] - j0, e = hi[r] - j0;
            a = a < 0 ? 0 : (a > n ? n : a);
            e = e < 0 ? 0 : (e > n ? n : e);
            float *srow = s + (size_t)r * KEYS;
            if (a >= e) { /* this row sees none of the block */
                ncols[r] = 0;
                continue;
            }
            ncols[r] = (int)e;
            for (int64_t c = 0; c < a; c++) /* the window's left edge */
                srow[c] = -INFINITY;
            int64_t i, h, hk;
            if (mods && row_of(job, &tr, r, &i, &h, &hk))
                apply_mods(pr, srow, (int)a, (int)e, i, h, b, off, j0);
        }
        kern->softmax(s, (int)m, n, ncols, 1.0f, row_max, row_sum, acc, dp);
        for (int64_t t = 0; t < tr.nheads; t++) {
            float *at = acc + (size_t)t * tr.stride * dp;
            const float *pt = s + (size_t)t * tr.stride * KEYS;
            block_rows(pr, job->vc, b, tr.hk0 + t, j0, jend, rows);
            const int nn = block_rows(pr, job->vc, b, tr.hk0 + t, j0 + KEYS, jend, next);
            /* the product that skips zero probabilities only where one is zero and a value
             * row is NaN or inf (0 x inf would be NaN): a block that every row sees whole,
             * the common case, has no zero and needs no scan of V */
            if (has_zero(pt, tr.seg, n) && job->nonfinite(rows, n, dim, bp->dtype)) {
                flashc_cpu_acc_rows_sparse(tr.seg, n, dp, pt, rows, bp->dtype, dim, at);
            } else if (job->use16) {
                uint16_t *p16t = p16 + (size_t)t * tr.stride * KEYS;
                kern->round_p16(p16t, pt, tr.seg, n);
                job->pv16(tr.seg, n, dim, p16t, rows, next, nn, at, dp);
            } else {
                job->pv(tr.seg, n, dim, pt, rows, bp->dtype, next, nn, at, dp);
            }
        }
    }

    for (int r = 0; r < m; r++) {
        int64_t i, h, hk;
        if (!row_of(job, &tr, r, &i, &h, &hk))
            continue;
        float *arow = acc + (size_t)r * dp;
        float lse_r, inv = 1.0f;
        if (row_sum[r] > 0.0f) {
            inv = 1.0f / row_sum[r];
            lse_r = row_max[r] + logf(row_sum[r]);
        } else if (row_sum[r] == 0.0f) { /* no visible key in this split (or at all) */
            memset(arow, 0, (size_t)dp * sizeof(float));
            lse_r = -INFINITY;
        } else { /* a NaN score: NaN, never "masked" (the merge keeps a NaN LSE NaN) */
            for (int64_t d = 0; d < dim; d++)
                arow[d] = NAN;
            lse_r = NAN;
        }
        if (job->splits == 1) {
            *flashc_lse_ptr(job->lse, b, h, i) = lse_r;
            flashc_cpu_store_rows(job->out, arow, dp, b, i, 1, h, inv);
        } else {
            const int64_t B = bp->batch, nq = bp->seqlen_q, hq = bp->heads_q;
            float *po = job->part_out + ((((int64_t)split * B + b) * nq + i) * hq + h) * dim;
            for (int64_t d = 0; d < dim; d++)
                po[d] = arow[d] * inv;
            job->part_lse[(((int64_t)split * B + b) * hq + h) * nq + i] = lse_r;
        }
    }
}

/* Views of split s of sequence b's partial results: [1, Nq, Hq, D] and [1, Hq, Nq]. */
static void part_views(const decode_job *job, int32_t s, int64_t b, flashc_tensor *o,
                       flashc_tensor *l)
{
    const flashc_problem *bp = &job->pr->base;
    const int64_t B = bp->batch, nq = bp->seqlen_q, hq = bp->heads_q, dim = bp->head_dim;
    memset(o, 0, sizeof *o);
    o->data = job->part_out + ((int64_t)s * B + b) * nq * hq * dim;
    o->dtype = FLASHC_F32;
    o->ndim = 4;
    o->shape[0] = 1, o->shape[1] = nq, o->shape[2] = hq, o->shape[3] = dim;
    o->stride[0] = nq * hq * dim, o->stride[1] = hq * dim, o->stride[2] = dim, o->stride[3] = 1;
    memset(l, 0, sizeof *l);
    l->data = job->part_lse + ((int64_t)s * B + b) * hq * nq;
    l->dtype = FLASHC_F32;
    l->ndim = 3;
    l->shape[0] = 1, l->shape[1] = hq, l->shape[2] = nq;
    l->stride[0] = hq * nq, l->stride[1] = nq, l->stride[2] = 1;
}

/* Second pass, one task per sequence: its splits merged into out and lse. */
static void merge_task(void *ctx, int64_t b, int thread)
{
    decode_job *job = ctx;
    const flashc_problem *bp = &job->pr->base;
    flashc_tensor outs[FLASHC_KVCACHE_MAX_SPLITS], lses[FLASHC_KVCACHE_MAX_SPLITS];
    for (int32_t s = 0; s < job->splits; s++)
        part_views(job, s, b, &outs[s], &lses[s]);
    flashc_merge_problem mp;
    memset(&mp, 0, sizeof mp);
    mp.batch = 1;
    mp.seqlen = bp->seqlen_q;
    mp.heads = bp->heads_q;
    mp.head_dim = bp->head_dim;
    int32_t n = job->splits;
    if (n > MERGE_GROUP) { /* groups merged in place into their first part, then the firsts */
        mp.in_place = 1;
        int32_t leaders = 0;
        for (int32_t g = 0; g < n; g += MERGE_GROUP) {
            mp.n_parts = n - g < MERGE_GROUP ? n - g : MERGE_GROUP;
            if (mp.n_parts > 1)
                flashc_host_merge(NULL, &mp, &outs[g], &lses[g], &outs[g], &lses[g]);
            outs[leaders] = outs[g];
            lses[leaders] = lses[g];
            leaders++;
        }
        n = leaders;
        mp.in_place = 0;
    }
    flashc_tensor o = *job->out, l = *job->lse;
    o.data = flashc_row_ptr(job->out, b, 0, 0);
    o.shape[0] = 1;
    l.data = flashc_lse_ptr(job->lse, b, 0, 0);
    l.shape[0] = 1;
    mp.n_parts = n;
    /* at most MERGE_GROUP parts: the host merge's weights stay on its stack, no allocation */
    flashc_host_merge(NULL, &mp, outs, lses, &o, &l);
}

flashc_status flashc_cpu_forward_kvcache(void *state, const flashc_kvcache_problem *pr,
                                         const flashc_tensor *q, flashc_tensor *k_cache,
                                         flashc_tensor *v_cache, const flashc_tensor *k_new,
                                         const flashc_tensor *v_new, flashc_tensor *out,
                                         flashc_tensor *lse)
{
    flashc_cpu_state *st = state;
    const flashc_problem *bp = &pr->base;
    decode_job job;
    memset(&job, 0, sizeof job);
    job.pr = pr;
    job.kern = st->kernels;
    job.q = q;
    job.kc = k_cache;
    job.vc = v_cache;
    job.out = out;
    job.lse = lse;
    job.dp = flashc_cpu_padded_dim(bp->head_dim);
    job.group = bp->heads_q / bp->heads_kv;
    /* sets without decode kernels (AVX2) run the generic set's */
    const flashc_cpu_kernels *gk = &flashc_cpu_kernels_generic;
    job.qk = st->kernels->decode_qk ? st->kernels->decode_qk : gk->decode_qk;
    job.pv = st->kernels->decode_pv ? st->kernels->decode_pv : gk->decode_pv;
    job.qk16 = st->kernels->decode_qk16;
    job.pv16 = st->kernels->decode_pv16;
    job.use16 = bp->dtype == FLASHC_BF16 && job.qk16 && job.pv16 && st->kernels->round_p16 &&
                st->kernels->bf16_supported && st->kernels->bf16_supported();
    job.nonfinite = st->kernels->rows_nonfinite ? st->kernels->rows_nonfinite
                                                : gk->rows_nonfinite;
    job.rows_total = job.group * bp->seqlen_q;
    job.chunks = flashc_cpu_blocks(job.rows_total, ROWS);
    job.heads_per_task = 1;
    job.seg_stride = job.rows_total;
    if (job.chunks == 1) {
        job.heads_per_task = job.seg_stride <= ROWS ? ROWS / job.seg_stride : 1;
        if (job.heads_per_task > bp->heads_kv)
            job.heads_per_task = bp->heads_kv;
    }
    job.tiles = flashc_cpu_blocks(bp->heads_kv, job.heads_per_task);
    const int threads = flashc_threadpool_size(st->pool);
    const int64_t tasks = bp->batch * job.tiles * job.chunks;

    /* a split is at least 16 keys, and no split is left wholly past the longest sequence */
    int32_t splits = pr->num_splits > 0
                         ? pr->num_splits
                         : flashc_kvcache_num_splits(tasks, pr->max_len, threads, 256);
    int64_t per = (pr->max_len + splits - 1) / splits;
    per = per < 16 ? 16 : (per + 15) & ~(int64_t)15;
    job.split_keys = per;
    job.splits = (int32_t)((pr->max_len + per - 1) / per);
    if (job.splits < 1)
        job.splits = 1;

    /* everything is allocated before the append and the first output write */
    const size_t scratch_floats = flashc_cpu_lines(decode_scratch_floats(job.dp));
    size_t part_floats = 0, lse_floats = 0;
    if (job.splits > 1) {
        part_floats = flashc_cpu_lines((size_t)(job.splits * bp->batch * bp->seqlen_q *
                                                bp->heads_q * bp->head_dim));
        lse_floats = flashc_cpu_lines((size_t)(job.splits * bp->batch * bp->heads_q *
                                               bp->seqlen_q));
    }
    cpu_workspace ws;
    flashc_status status = flashc_cpu_workspace_get(
        st, ((size_t)threads * scratch_floats + part_floats + lse_floats) * sizeof(float), &ws);
    if (status != FLASHC_OK)
        return status;
    job.scratch.base = (float *)ws.base;
    job.scratch.floats_per_thread = scratch_floats;
    job.part_out = job.scratch.base + (size_t)threads * scratch_floats;
    job.part_lse = job.part_out + part_floats;

    flashc_host_kvcache_append(pr, k_cache, v_cache, k_new, v_new);
    flashc_threadpool_run(st->pool, tasks * job.splits, decode_task, &job);
    if (job.splits > 1)
        flashc_threadpool_run(st->pool, bp->batch, merge_task, &job);
    flashc_cpu_workspace_put(st, &ws);
    return FLASHC_OK;
}
