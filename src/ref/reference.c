/*
 * reference.c - the float64 reference forward and backward, and the "reference" backend that
 * exposes them through the public API (outputs rounded to the output tensors' dtype, which
 * may be float32 whatever the input dtype, so that a test can compare against near-exact
 * values). The KV-cache decode gathers each sequence's keys (paged or not, appended or not)
 * into a dense copy and runs the same float64 forward on it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "ref/reference.h"
#include "philox.h"

/* Row of a 4-d tensor as doubles. */
static void load_row_f64(double *dst, const flashc_tensor *t, int64_t b, int64_t s, int64_t h,
                         int64_t n)
{
    const void *row = flashc_row_ptr(t, b, s, h);
    for (int64_t d = 0; d < n; d++)
        dst[d] = (double)flashc_load(row, t->dtype, d);
}

/* Loads rows [s0, s0 + n) of head h of tensor batch b into a dense [n, D] array. */
static void load_head_f64(double *dst, const flashc_tensor *t, int64_t b, int64_t s0, int64_t n,
                          int64_t h)
{
    int64_t dim = t->shape[3];
    for (int64_t s = 0; s < n; s++)
        load_row_f64(dst + s * dim, t, b, s0 + s, h, dim);
}

/* The mask of flashc.h, written out rule by rule (rather than through the key ranges the
 * fast backends use, so that the two are independent): does query i of sequence sq see
 * key j? */
static int visible(const flashc_problem *pr, const flashc_seq *sq, int64_t i, int64_t j)
{
    int64_t off = pr->causal == FLASHC_CAUSAL_TOP_LEFT ? 0 : sq->nk - sq->nq;
    if (pr->causal != FLASHC_CAUSAL_NONE && j > i + off)
        return 0;
    if (pr->features & FLASHC_FEATURE_WINDOW) {
        if (pr->window_left >= 0 && j < i + off - pr->window_left)
            return 0;
        if (pr->window_right >= 0 && j > i + off + pr->window_right)
            return 0;
    }
    return 1;
}

/* The dropout factor D_ij of flashc.h: 1 without dropout, else 0 or 1/(1 - p). */
static double dropout_factor(const flashc_problem *pr, int64_t b, int64_t h, int64_t i,
                             int64_t j)
{
    if (!(pr->features & FLASHC_FEATURE_DROPOUT))
        return 1.0;
    int keep = flashc_dropout_keep(pr->dropout_seed, pr->dropout_offset, pr->dropout_p,
                                   pr->heads_q, b, h, i, j);
    return keep ? 1.0 / (1.0 - (double)pr->dropout_p) : 0.0;
}

/* Logits of query row qi against every key of the sequence, masked entries -inf; returns the
 * row max. dcap (may be NULL) receives d(logit)/d(scale q.k): 1 - tanh^2 under softcap. */
static double score_row(const flashc_problem *pr, const flashc_seq *sq, int64_t b, int64_t h,
                        const double *qi, const double *kh, int64_t i, double *srow,
                        double *dcap)
{
    int64_t dim = pr->head_dim;
    int64_t off = pr->causal == FLASHC_CAUSAL_TOP_LEFT ? 0 : sq->nk - sq->nq;
    double slope = (double)flashc_alibi_slope(pr, b, h);
    double cap = (double)pr->softcap;
    double mx = -INFINITY;
    for (int64_t j = 0; j < sq->nk; j++) {
        if (dcap)
            dcap[j] = 1.0;
        if (!visible(pr, sq, i, j)) {
            srow[j] = -INFINITY;
            continue;
        }
        double acc = 0.0;
        for (int64_t d = 0; d < dim; d++)
            acc += qi[d] * kh[j * dim + d];
        double x = acc * (double)pr->scale;
        if (pr->features & FLASHC_FEATURE_SOFTCAP) {
            double t = tanh(x / cap);
            x = cap * t;
            if (dcap)
                dcap[j] = 1.0 - t * t;
        }
        if (pr->features & FLASHC_FEATURE_ALIBI)
            x -= slope * fabs((double)(i + off - j));
        srow[j] = x;
        if (x > mx || x != x) /* a NaN score makes the row NaN, not "masked" */
            mx = x != x || mx != mx ? NAN : x;
    }
    return mx;
}

/* Softmax of a score row in place; returns the LSE (-inf for a fully masked row, P = 0). */
static double softmax_row(double *srow, int64_t n, double mx)
{
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < n; j++)
            srow[j] = 0.0;
        return -INFINITY;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        srow[j] = srow[j] == -INFINITY ? 0.0 : exp(srow[j] - mx);
        sum += srow[j];
    }
    for (int64_t j = 0; j < n; j++)
        srow[j] /= sum;
    return mx + log(sum);
}

typedef struct ref_scratch {
    double *qh, *kh, *vh, *doh, *srow, *dprow, *dcap;
} ref_scratch;

static void free_scratch(ref_scratch *s)
{
    free(s->qh);
    free(s->kh);
    free(s->vh);
    free(s->doh);
    free(s->srow);
    free(s->dprow);
    free(s->dcap);
}

static flashc_status alloc_scratch(ref_scratch *s, const flashc_problem *pr, int backward)
{
    /* the longest sequence: the whole tensor unless varlen (a problem the tests build by
     * hand leaves max_seqlen 0) */
    const int varlen = (pr->features & FLASHC_FEATURE_VARLEN) != 0;
    size_t dim = (size_t)pr->head_dim;
    size_t nq = (size_t)(varlen ? pr->max_seqlen_q : pr->seqlen_q) + 1;
    size_t nk = (size_t)(varlen ? pr->max_seqlen_k : pr->seqlen_k) + 1;
    memset(s, 0, sizeof *s);
    s->qh = malloc(nq * dim * sizeof(double));
    s->kh = malloc(nk * dim * sizeof(double));
    s->vh = malloc(nk * dim * sizeof(double));
    s->srow = malloc(nk * sizeof(double));
    if (backward) {
        s->doh = malloc(nq * dim * sizeof(double));
        s->dprow = malloc(nk * sizeof(double));
        s->dcap = malloc(nk * sizeof(double));
    }
    if (!s->qh || !s->kh || !s->vh || !s->srow ||
        (backward && (!s->doh || !s->dprow || !s->dcap))) {
        free_scratch(s);
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "reference: out of memory for scratch");
    }
    return FLASHC_OK;
}

flashc_status flashc_ref_forward_f64(const flashc_problem *pr, const flashc_tensor *q,
                                     const flashc_tensor *k, const flashc_tensor *v, double *out,
                                     double *lse)
{
    ref_scratch s;
    if (alloc_scratch(&s, pr, 0) != FLASHC_OK)
        return FLASHC_ERROR_OUT_OF_MEMORY;
    int64_t dim = pr->head_dim, group = pr->heads_q / pr->heads_kv;
    for (int64_t b = 0; b < flashc_num_seqs(pr); b++) {
        const flashc_seq sq = flashc_seq_of(pr, b);
        for (int64_t h = 0; h < pr->heads_q; h++) {
            load_head_f64(s.qh, q, sq.batch, sq.q0, sq.nq, h);
            load_head_f64(s.kh, k, sq.batch, sq.k0, sq.nk, h / group);
            load_head_f64(s.vh, v, sq.batch, sq.k0, sq.nk, h / group);
            for (int64_t i = 0; i < sq.nq; i++) {
                const int64_t row = sq.q0 + i; /* in the tensors */
                double mx = score_row(pr, &sq, b, h, s.qh + i * dim, s.kh, i, s.srow, NULL);
                double l = softmax_row(s.srow, sq.nk, mx);
                if (lse)
                    lse[(sq.batch * pr->heads_q + h) * pr->seqlen_q + row] = l;
                if (!out)
                    continue;
                double *o = out + ((sq.batch * pr->seqlen_q + row) * pr->heads_q + h) * dim;
                for (int64_t d = 0; d < dim; d++)
                    o[d] = 0.0;
                for (int64_t j = 0; j < sq.nk; j++) {
                    double p = s.srow[j] * dropout_factor(pr, b, h, i, j);
                    if (p == 0.0)
                        continue;
                    for (int64_t d = 0; d < dim; d++)
                        o[d] += p * s.vh[j * dim + d];
                }
            }
        }
    }
    free_scratch(&s);
    return FLASHC_OK;
}

flashc_status flashc_ref_backward_f64(const flashc_problem *pr, const flashc_tensor *dout,
                                      const flashc_tensor *q, const flashc_tensor *k,
                                      const flashc_tensor *v, double *dq, double *dk, double *dv)
{
    ref_scratch s;
    if (alloc_scratch(&s, pr, 1) != FLASHC_OK)
        return FLASHC_ERROR_OUT_OF_MEMORY;
    int64_t dim = pr->head_dim, group = pr->heads_q / pr->heads_kv;
    int64_t nq_all = pr->seqlen_q, nk_all = pr->seqlen_k;
    double scale = (double)pr->scale;
    memset(dq, 0, (size_t)(pr->batch * nq_all * pr->heads_q * dim) * sizeof(double));
    memset(dk, 0, (size_t)(pr->batch * nk_all * pr->heads_kv * dim) * sizeof(double));
    memset(dv, 0, (size_t)(pr->batch * nk_all * pr->heads_kv * dim) * sizeof(double));
    for (int64_t b = 0; b < flashc_num_seqs(pr); b++) {
        const flashc_seq sq = flashc_seq_of(pr, b);
        const int64_t nk = sq.nk;
        for (int64_t h = 0; h < pr->heads_q; h++) {
            int64_t hk = h / group;
            load_head_f64(s.qh, q, sq.batch, sq.q0, sq.nq, h);
            load_head_f64(s.kh, k, sq.batch, sq.k0, nk, hk);
            load_head_f64(s.vh, v, sq.batch, sq.k0, nk, hk);
            load_head_f64(s.doh, dout, sq.batch, sq.q0, sq.nq, h);
            for (int64_t i = 0; i < sq.nq; i++) {
                const double *qi = s.qh + i * dim, *doi = s.doh + i * dim;
                double mx = score_row(pr, &sq, b, h, qi, s.kh, i, s.srow, s.dcap);
                softmax_row(s.srow, nk, mx); /* srow = P */
                /* dP_ij = D_ij dO_i . V_j; delta = sum_j P_ij dP_ij = rowsum(dO * O) */
                double delta = 0.0;
                for (int64_t j = 0; j < nk; j++) {
                    double acc = 0.0;
                    for (int64_t d = 0; d < dim; d++)
                        acc += doi[d] * s.vh[j * dim + d];
                    s.dprow[j] = acc * dropout_factor(pr, b, h, i, j);
                    if (s.srow[j] != 0.0) /* a masked key's V (even NaN) adds nothing */
                        delta += s.srow[j] * s.dprow[j];
                }
                double *dqi = dq + ((sq.batch * nq_all + sq.q0 + i) * pr->heads_q + h) * dim;
                for (int64_t j = 0; j < nk; j++) {
                    double p = s.srow[j];
                    if (p == 0.0)
                        continue;
                    /* dS w.r.t. scale q.k: through the softmax, then through the softcap */
                    double ds = p * (s.dprow[j] - delta) * s.dcap[j] * scale;
                    double pd = p * dropout_factor(pr, b, h, i, j);
                    double *dkj = dk + ((sq.batch * nk_all + sq.k0 + j) * pr->heads_kv + hk) * dim;
                    double *dvj = dv + ((sq.batch * nk_all + sq.k0 + j) * pr->heads_kv + hk) * dim;
                    for (int64_t d = 0; d < dim; d++) {
                        dqi[d] += ds * s.kh[j * dim + d];
                        dkj[d] += ds * qi[d];
                        dvj[d] += pd * doi[d];
                    }
                }
            }
        }
    }
    free_scratch(&s);
    return FLASHC_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The "reference" backend                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int ref_available(void)
{
    return 1;
}

static flashc_status ref_create(const flashc_backend_config *cfg, void **state)
{
    *state = NULL;
    return FLASHC_OK;
}

static void ref_destroy(void *state) {}

static void ref_describe(void *state, char *buf, size_t size)
{
    snprintf(buf, size, "reference: float64, single-threaded, exact");
}

/* Writes a dense [B, N, H, D] double array into a 4-d tensor view, rounding to its dtype. */
static void store_dense(flashc_tensor *t, const double *src)
{
    int64_t n = t->shape[1], heads = t->shape[2], dim = t->shape[3];
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < n; s++)
            for (int64_t h = 0; h < heads; h++) {
                void *row = flashc_row_ptr(t, b, s, h);
                const double *x = src + ((b * n + s) * heads + h) * dim;
                for (int64_t d = 0; d < dim; d++)
                    flashc_store(row, t->dtype, d, (float)x[d]);
            }
}

static double *alloc_dense(const flashc_tensor *t)
{
    size_t n = (size_t)(t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]);
    return malloc(n * sizeof(double));
}

static flashc_status ref_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                 const flashc_tensor *k, const flashc_tensor *v,
                                 flashc_tensor *out, flashc_tensor *lse)
{
    double *o = alloc_dense(out);
    double *l = malloc((size_t)(pr->batch * pr->heads_q * pr->seqlen_q) * sizeof(double));
    flashc_status st = FLASHC_ERROR_OUT_OF_MEMORY;
    if (o && l)
        st = flashc_ref_forward_f64(pr, q, k, v, o, l);
    else
        flashc_error(st, "reference: out of memory");
    if (st == FLASHC_OK) {
        store_dense(out, o);
        for (int64_t b = 0; b < pr->batch; b++)
            for (int64_t h = 0; h < pr->heads_q; h++)
                for (int64_t i = 0; i < pr->seqlen_q; i++)
                    *flashc_lse_ptr(lse, b, h, i) =
                        (float)l[(b * pr->heads_q + h) * pr->seqlen_q + i];
    }
    free(o);
    free(l);
    return st;
}

static flashc_status ref_backward(void *state, const flashc_problem *pr,
                                  const flashc_tensor *dout, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v,
                                  const flashc_tensor *out, const flashc_tensor *lse,
                                  flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    double *gq = alloc_dense(dq), *gk = alloc_dense(dk), *gv = alloc_dense(dv);
    flashc_status st = FLASHC_ERROR_OUT_OF_MEMORY;
    if (gq && gk && gv)
        st = flashc_ref_backward_f64(pr, dout, q, k, v, gq, gk, gv);
    else
        flashc_error(st, "reference: out of memory");
    if (st == FLASHC_OK) {
        store_dense(dq, gq);
        store_dense(dk, gk);
        store_dense(dv, gv);
    }
    free(gq);
    free(gk);
    free(gv);
    return st;
}

static size_t ref_workspace_size(void *state, const flashc_problem *pr)
{
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* KV-cache decode: gather each sequence's keys, then the plain float64 forward              */
/* ---------------------------------------------------------------------------------------- */

/* Address of new row t of sequence b, kv head h, in k_new / v_new. */
static const void *new_row(const flashc_tensor *t, int64_t b, int64_t r, int64_t h)
{
    return flashc_row_ptr(t, b, r, h);
}

flashc_status flashc_ref_forward_kvcache_f64(const flashc_kvcache_problem *pr,
                                             const flashc_tensor *q,
                                             const flashc_tensor *k_cache,
                                             const flashc_tensor *v_cache,
                                             const flashc_tensor *k_new,
                                             const flashc_tensor *v_new, double *out,
                                             double *lse)
{
    const flashc_problem *bp = &pr->base;
    const int64_t hkv = bp->heads_kv, dim = bp->head_dim, nq = bp->seqlen_q;
    const size_t row_bytes = (size_t)(dim * pr->elem_size);
    const int64_t longest = pr->max_len > 0 ? pr->max_len : 1;
    /* gathered [1, L_b, Hkv, D] keys and values, in the cache's dtype (an exact copy) */
    char *kg = malloc((size_t)(longest * hkv) * row_bytes);
    char *vg = malloc((size_t)(longest * hkv) * row_bytes);
    double *o = malloc((size_t)(nq * bp->heads_q * dim) * sizeof(double));
    double *l = malloc((size_t)(nq * bp->heads_q) * sizeof(double));
    /* paged append: which new row lands in each slot of the pool (-1: none), so a sequence
     * that reads a slot another one appends into sees the appended value */
    int64_t *writer = NULL;
    const int map = pr->paged && pr->seqlen_new > 0;
    if (map)
        writer = malloc((size_t)(pr->num_pages * pr->page_size) * sizeof(int64_t));
    flashc_status st = FLASHC_OK;
    if (!kg || !vg || !o || !l || (map && !writer)) {
        st = flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "reference: out of memory");
        goto done;
    }
    if (map) {
        for (int64_t i = 0; i < pr->num_pages * pr->page_size; i++)
            writer[i] = -1;
        for (int64_t b = 0; b < bp->batch; b++)
            for (int64_t t = 0; t < pr->seqlen_new; t++) {
                const int64_t j = pr->cache_seqlens[b] + t;
                const int64_t page = pr->block_table[b * pr->block_table_stride +
                                                     (j >> pr->page_shift)];
                writer[page * pr->page_size + (j & (pr->page_size - 1))] =
                    b * pr->seqlen_new + t;
            }
    }
    for (int64_t b = 0; b < bp->batch; b++) {
        const int64_t len = flashc_kvcache_len(pr, b), cached = pr->cache_seqlens[b];
        for (int64_t j = 0; j < len; j++)
            for (int64_t h = 0; h < hkv; h++) {
                const void *ks, *vs;
                int64_t w = -1;
                if (j >= cached)
                    w = b * pr->seqlen_new + (j - cached);
                else if (map) {
                    const int64_t page = pr->block_table[b * pr->block_table_stride +
                                                         (j >> pr->page_shift)];
                    w = writer[page * pr->page_size + (j & (pr->page_size - 1))];
                }
                if (w >= 0) {
                    ks = new_row(k_new, w / pr->seqlen_new, w % pr->seqlen_new, h);
                    vs = new_row(v_new, w / pr->seqlen_new, w % pr->seqlen_new, h);
                } else {
                    ks = flashc_kvcache_row(pr, k_cache, b, j, h);
                    vs = flashc_kvcache_row(pr, v_cache, b, j, h);
                }
                memcpy(kg + (size_t)(j * hkv + h) * row_bytes, ks, row_bytes);
                memcpy(vg + (size_t)(j * hkv + h) * row_bytes, vs, row_bytes);
            }
        /* one sequence as a batch of one: q's batch b, L_b keys; ALiBi slopes of b */
        flashc_tensor qb = *q, kt, vt;
        qb.data = (char *)q->data + b * q->stride[0] * pr->elem_size;
        qb.shape[0] = 1;
        kt = flashc_tensor_contiguous(kg, bp->dtype, 1, len, hkv, dim);
        vt = flashc_tensor_contiguous(vg, bp->dtype, 1, len, hkv, dim);
        flashc_problem sp = *bp;
        sp.batch = 1;
        sp.seqlen_k = sp.max_seqlen_k = len;
        if (sp.features & FLASHC_FEATURE_ALIBI) {
            sp.alibi_slopes = bp->alibi_slopes + b * bp->alibi_batch_stride;
            sp.alibi_batch_stride = 0;
        }
        st = flashc_ref_forward_f64(&sp, &qb, &kt, &vt, o, l);
        if (st != FLASHC_OK)
            goto done;
        memcpy(out + (size_t)(b * nq * bp->heads_q * dim), o,
               (size_t)(nq * bp->heads_q * dim) * sizeof(double));
        memcpy(lse + (size_t)(b * bp->heads_q * nq), l, (size_t)(bp->heads_q * nq) * sizeof(double));
    }
done:
    free(kg);
    free(vg);
    free(o);
    free(l);
    free(writer);
    return st;
}

static flashc_status ref_forward_kvcache(void *state, const flashc_kvcache_problem *pr,
                                         const flashc_tensor *q, flashc_tensor *k_cache,
                                         flashc_tensor *v_cache, const flashc_tensor *k_new,
                                         const flashc_tensor *v_new, flashc_tensor *out,
                                         flashc_tensor *lse)
{
    const flashc_problem *bp = &pr->base;
    double *o = alloc_dense(out);
    double *l = malloc((size_t)(bp->batch * bp->heads_q * bp->seqlen_q) * sizeof(double));
    flashc_status st = FLASHC_ERROR_OUT_OF_MEMORY;
    /* computed before the append (reading the new rows where they will land), so that an
     * allocation failure leaves the cache as it was */
    if (o && l)
        st = flashc_ref_forward_kvcache_f64(pr, q, k_cache, v_cache, k_new, v_new, o, l);
    else
        flashc_error(st, "reference: out of memory");
    if (st == FLASHC_OK) {
        flashc_host_kvcache_append(pr, k_cache, v_cache, k_new, v_new);
        store_dense(out, o);
        for (int64_t b = 0; b < bp->batch; b++)
            for (int64_t h = 0; h < bp->heads_q; h++)
                for (int64_t i = 0; i < bp->seqlen_q; i++)
                    *flashc_lse_ptr(lse, b, h, i) =
                        (float)l[(b * bp->heads_q + h) * bp->seqlen_q + i];
    }
    free(o);
    free(l);
    return st;
}

const flashc_backend_ops flashc_reference_backend_ops = {
    .name = "reference",
    .uses_device_memory = 0,
    .accepts_f32_outputs = 1,
    .available = ref_available,
    .create = ref_create,
    .destroy = ref_destroy,
    .describe = ref_describe,
    .forward = ref_forward,
    .backward = ref_backward,
    .backward_workspace_size = ref_workspace_size,
    .features = FLASHC_FEATURE_WINDOW | FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI |
                FLASHC_FEATURE_VARLEN | FLASHC_FEATURE_DROPOUT,
    .forward_kvcache = ref_forward_kvcache,
};
