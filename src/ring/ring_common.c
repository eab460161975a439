/*
 * ring_common.c - the parts of ring attention that do not depend on the transport: checks,
 * the cross-rank descriptor comparison, the zig-zag split, the per-step plan of flashc calls,
 * host conversion helpers and the error message (see ring_common.h).
 */
#include "ring_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"

/* ---- errors ------------------------------------------------------------------------------ */

static _Thread_local char ring_message[768];

const char *flashc_ring_last_error(void)
{
    return ring_message;
}

flashc_status flashc_ring_error_(flashc_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring_message, sizeof ring_message, fmt, ap);
    va_end(ap);
    return status;
}

flashc_status ring_flashc_failed(flashc_status status, const char *where)
{
    return flashc_ring_error_(status, "%s: %s", where, flashc_last_error());
}

/* ---- the split --------------------------------------------------------------------------- */

void flashc_ring_zigzag_rows(int64_t seqlen, int32_t world, int32_t rank, int64_t start[2],
                             int64_t len[2])
{
    const int64_t chunks = 2 * (int64_t)world;
    const int64_t c[2] = {rank, chunks - 1 - rank};
    for (int i = 0; i < 2; i++) {
        start[i] = c[i] * seqlen / chunks;
        len[i] = (c[i] + 1) * seqlen / chunks - start[i];
    }
}

ring_rows ring_rows_of(const ring_desc *all, int32_t world, int32_t j)
{
    ring_rows r;
    memset(&r, 0, sizeof r);
    if (all[j].causal != FLASHC_CAUSAL_NONE) {
        r.n = 2;
        flashc_ring_zigzag_rows(all[j].seqlen, world, j, r.start, r.len);
    } else {
        r.n = 1;
        r.len[0] = all[j].n_local; /* positions do not matter without a mask */
    }
    return r;
}

/* ---- checks ------------------------------------------------------------------------------ */

static flashc_status copy_params(const flashc_params *user, flashc_params *p)
{
    flashc_params_init(p);
    if (user) {
        /* the core's rule: a size a real struct cannot have is garbage, and fields this
         * version does not know must be unset rather than silently ignored */
        if (user->struct_size < sizeof(size_t) || user->struct_size > 4096)
            return flashc_ring_error_(FLASHC_ERROR_INVALID_PARAM,
                                      "params.struct_size is %zu: initialize params with "
                                      "flashc_params_init()",
                                      user->struct_size);
        for (size_t i = sizeof *p; i < user->struct_size; i++)
            if (((const unsigned char *)user)[i] != 0)
                return flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                          "params: set fields that this version of flashc "
                                          "does not know (struct_size %zu > %zu)",
                                          user->struct_size, sizeof *p);
        memcpy(p, user, user->struct_size < sizeof *p ? user->struct_size : sizeof *p);
        p->struct_size = sizeof *p;
    }
    /* these depend on a row's global position or on the call, which the blocks lose */
    if (p->window_left != -1 || p->window_right != -1)
        return flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                  "params.window_left/window_right: sliding windows are not "
                                  "supported by ring attention");
    if (p->alibi_slopes)
        return flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                  "params.alibi_slopes: ALiBi is not supported by ring attention");
    if (p->cu_seqlens_q || p->cu_seqlens_k)
        return flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                  "params.cu_seqlens_q/k: variable-length batches are not "
                                  "supported by ring attention");
    if (p->dropout_p != 0.0f)
        return flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                  "params.dropout_p: dropout is not supported by ring attention");
    if (!isfinite(p->softmax_scale))
        return flashc_ring_error_(FLASHC_ERROR_INVALID_PARAM, "params.softmax_scale is not finite");
    /* checked here, before ranks compare their params: NaN != NaN would otherwise read as a
     * disagreement between ranks */
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return flashc_ring_error_(FLASHC_ERROR_INVALID_PARAM,
                                  "params.softcap must be a finite value >= 0 (0 = off)");
    if (p->causal != FLASHC_CAUSAL_NONE && p->causal != FLASHC_CAUSAL_BOTTOM_RIGHT &&
        p->causal != FLASHC_CAUSAL_TOP_LEFT)
        return flashc_ring_error_(FLASHC_ERROR_INVALID_PARAM,
                                  "params.causal is %d: use FLASHC_CAUSAL_NONE, _BOTTOM_RIGHT "
                                  "or _TOP_LEFT",
                                  (int)p->causal);
    p->workspace = NULL; /* each block's call allocates what its own shapes need */
    p->workspace_size = 0;
    return FLASHC_OK;
}

static flashc_status check_dtype_of(const flashc_tensor *t, const char *name,
                                    const flashc_tensor *q, int allow_f32)
{
    if (t->dtype == q->dtype || (allow_f32 && t->dtype == FLASHC_F32))
        return FLASHC_OK;
    return flashc_ring_error_(FLASHC_ERROR_DTYPE_MISMATCH, "%s: dtype %d differs from q's dtype %d",
                              name, (int)t->dtype, (int)q->dtype);
}

/* q, k, v of the local rows: k shaped like q but for its heads. */
static flashc_status check_qkv(const flashc_tensor *q, const flashc_tensor *k,
                               const flashc_tensor *v, named_span *s)
{
    RING_TRY(check_tensor4(q, "q", 0, &s[0].sp));
    RING_TRY(check_tensor4(k, "k", 0, &s[1].sp));
    RING_TRY(check_dtype_of(k, "k", q, 0));
    const char *what[2] = {"batch", "seqlen (local rows: k and v hold the same rows as q)"};
    for (int d = 0; d < 2; d++)
        if (k->shape[d] != q->shape[d])
            return flashc_ring_error_(FLASHC_ERROR_SHAPE_MISMATCH,
                                      "k: shape[%d] (%s) is %lld but q has %lld", d, what[d],
                                      (long long)k->shape[d], (long long)q->shape[d]);
    if (k->shape[3] != q->shape[3])
        return flashc_ring_error_(FLASHC_ERROR_SHAPE_MISMATCH,
                                  "k: shape[3] (head_dim) is %lld but q has %lld",
                                  (long long)k->shape[3], (long long)q->shape[3]);
    if (q->shape[2] % k->shape[2] != 0)
        return flashc_ring_error_(FLASHC_ERROR_INVALID_HEADS,
                                  "q: heads_q (%lld) is not a multiple of heads_kv (%lld) of k",
                                  (long long)q->shape[2], (long long)k->shape[2]);
    RING_TRY(check_tensor4(v, "v", 0, &s[2].sp));
    RING_TRY(check_dtype_of(v, "v", q, 0));
    return check_same_shape(v, "v", k, "k");
}

static flashc_status check_like4(const flashc_tensor *t, named_span *ns,
                                 const flashc_tensor *like, const char *like_name,
                                 const flashc_tensor *q)
{
    RING_TRY(check_tensor4(t, ns->name, ns->is_output, &ns->sp));
    RING_TRY(check_dtype_of(t, ns->name, q, 1));
    return check_same_shape(t, ns->name, like, like_name);
}

static void fill_desc(ring_desc *d, const flashc_params *p, int64_t seqlen,
                      const flashc_tensor *q, const flashc_tensor *k)
{
    memset(d, 0, sizeof *d);
    d->seqlen = seqlen;
    d->batch = q->shape[0];
    d->n_local = q->shape[1];
    d->heads_q = q->shape[2];
    d->heads_kv = k->shape[2];
    d->head_dim = q->shape[3];
    d->dtype = q->dtype;
    d->causal = p->causal != FLASHC_CAUSAL_NONE;
    d->scale = p->softmax_scale;
    d->softcap = p->softcap;
    d->deterministic = p->deterministic;
}

static flashc_status check_common_args(flashc_backend *be, const flashc_params *user,
                                       flashc_params *p)
{
    if (!be)
        return flashc_ring_error_(FLASHC_ERROR_NULL_POINTER, "backend: handle is NULL");
    return copy_params(user, p);
}

flashc_status ring_check_forward(flashc_backend *be, const flashc_params *user, int64_t seqlen,
                                 const flashc_tensor *q, const flashc_tensor *k,
                                 const flashc_tensor *v, const flashc_tensor *out,
                                 const flashc_tensor *lse, flashc_params *p, ring_desc *d)
{
    memset(d, 0, sizeof *d);
    RING_TRY(check_common_args(be, user, p));
    named_span s[5] = {{"q", {0, 0}, 0}, {"k", {0, 0}, 0}, {"v", {0, 0}, 0},
                       {"out", {0, 0}, 1}, {"lse", {0, 0}, 1}};
    RING_TRY(check_qkv(q, k, v, s));
    RING_TRY(check_like4(out, &s[3], q, "q", q));
    RING_TRY(check_lse_like(lse, "lse", 1, q, "q", &s[4].sp));
    RING_TRY(check_aliasing(s, 5));
    fill_desc(d, p, seqlen, q, k);
    return FLASHC_OK;
}

flashc_status ring_check_backward(flashc_backend *be, const flashc_params *user,
                                  int64_t seqlen, const flashc_tensor *dout,
                                  const flashc_tensor *q, const flashc_tensor *k,
                                  const flashc_tensor *v, const flashc_tensor *out,
                                  const flashc_tensor *lse, const flashc_tensor *dq,
                                  const flashc_tensor *dk, const flashc_tensor *dv,
                                  flashc_params *p, ring_desc *d)
{
    memset(d, 0, sizeof *d);
    RING_TRY(check_common_args(be, user, p));
    named_span s[9] = {{"q", {0, 0}, 0},   {"k", {0, 0}, 0},    {"v", {0, 0}, 0},
                       {"dout", {0, 0}, 0}, {"out", {0, 0}, 0}, {"lse", {0, 0}, 0},
                       {"dq", {0, 0}, 1},   {"dk", {0, 0}, 1},  {"dv", {0, 0}, 1}};
    RING_TRY(check_qkv(q, k, v, s));
    RING_TRY(check_like4(dout, &s[3], q, "q", q));
    RING_TRY(check_like4(out, &s[4], q, "q", q));
    RING_TRY(check_lse_like(lse, "lse", 0, q, "q", &s[5].sp));
    RING_TRY(check_like4(dq, &s[6], q, "q", q));
    RING_TRY(check_like4(dk, &s[7], k, "k", q));
    RING_TRY(check_like4(dv, &s[8], k, "k", q));
    RING_TRY(check_aliasing(s, 9));
    fill_desc(d, p, seqlen, q, k);
    return FLASHC_OK;
}

flashc_status ring_check_all(const ring_desc *all, int32_t world, int32_t rank)
{
    for (int32_t j = 0; j < world; j++)
        if (all[j].status != FLASHC_OK) {
            if (j == rank) /* keep this rank's own message */
                return (flashc_status)all[j].status;
            return flashc_ring_error_((flashc_status)all[j].status,
                                      "rank %d rejected its arguments (%s; its "
                                      "flashc_ring_last_error() says why)",
                                      (int)j, flashc_status_string((flashc_status)all[j].status));
        }
    const ring_desc *a = &all[0];
    for (int32_t j = 1; j < world; j++) {
        const ring_desc *b = &all[j];
#define SAME(field, what)                                                                    \
    if (b->field != a->field)                                                                \
        return flashc_ring_error_(FLASHC_ERROR_SHAPE_MISMATCH,                               \
                                  "rank %d: %s is %g but rank 0 has %g", (int)j, what,       \
                                  (double)b->field, (double)a->field)
        SAME(seqlen, "seqlen");
        SAME(batch, "batch (q.shape[0])");
        SAME(heads_q, "heads_q (q.shape[2])");
        SAME(heads_kv, "heads_kv (k.shape[2])");
        SAME(head_dim, "head_dim (q.shape[3])");
        SAME(dtype, "q's dtype");
        SAME(causal, "params.causal (on or off)");
        SAME(scale, "params.softmax_scale");
        SAME(softcap, "params.softcap");
        SAME(deterministic, "params.deterministic");
#undef SAME
    }
    if (a->causal) {
        if (a->seqlen < 2 * (int64_t)world)
            return flashc_ring_error_(FLASHC_ERROR_INVALID_SIZE,
                                      "seqlen: %lld rows cannot be split into 2 x %d zig-zag "
                                      "chunks of at least one row",
                                      (long long)a->seqlen, (int)world);
        for (int32_t j = 0; j < world; j++) {
            int64_t st[2], len[2];
            flashc_ring_zigzag_rows(a->seqlen, world, j, st, len);
            if (all[j].n_local != len[0] + len[1])
                return flashc_ring_error_(FLASHC_ERROR_SHAPE_MISMATCH,
                                          "rank %d: q holds %lld rows, but the causal zig-zag "
                                          "split of %lld rows over %d ranks gives it %lld "
                                          "(flashc_ring_zigzag_rows)",
                                          (int)j, (long long)all[j].n_local,
                                          (long long)a->seqlen, (int)world,
                                          (long long)(len[0] + len[1]));
        }
    } else {
        int64_t total = 0;
        for (int32_t j = 0; j < world; j++)
            total += all[j].n_local;
        if (total != a->seqlen)
            return flashc_ring_error_(FLASHC_ERROR_SHAPE_MISMATCH,
                                      "seqlen is %lld but the ranks hold %lld rows in all",
                                      (long long)a->seqlen, (long long)total);
    }
    return FLASHC_OK;
}

/* ---- the plan of one step ---------------------------------------------------------------- */

enum { PAIR_NONE = 0, PAIR_FULL = 1, PAIR_PARTIAL = 2 };

/* Global query rows [qa, qb) against keys [ka, kb) under j <= i. */
static int classify(int64_t qa, int64_t qb, int64_t ka, int64_t kb)
{
    if (qb <= qa || kb <= ka || ka >= qb)
        return PAIR_NONE;
    if (kb - 1 <= qa)
        return PAIR_FULL;
    return PAIR_PARTIAL;
}

static void add_call(ring_call *calls, int *n, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                     int32_t causal)
{
    if (nq <= 0 || nk <= 0)
        return;
    ring_call c = {q0, nq, k0, nk, causal};
    calls[(*n)++] = c;
}

int ring_plan(int32_t causal, const ring_rows *qr, const ring_rows *kr, ring_call *calls)
{
    int n = 0;
    int64_t qoff[2] = {0, 0}, koff[2] = {0, 0}, nq = 0, nk = 0;
    for (int i = 0; i < qr->n; i++) {
        qoff[i] = nq;
        nq += qr->len[i];
    }
    for (int j = 0; j < kr->n; j++) {
        koff[j] = nk;
        nk += kr->len[j];
    }
    if (!causal) {
        add_call(calls, &n, 0, nq, 0, nk, FLASHC_CAUSAL_NONE);
        return n;
    }
    int cls[2][2];
    int all_full = 1;
    for (int i = 0; i < qr->n; i++)
        for (int j = 0; j < kr->n; j++) {
            cls[i][j] = classify(qr->start[i], qr->start[i] + qr->len[i], kr->start[j],
                                 kr->start[j] + kr->len[j]);
            if (qr->len[i] > 0 && kr->len[j] > 0 && cls[i][j] != PAIR_FULL)
                all_full = 0;
        }
    if (all_full) {
        add_call(calls, &n, 0, nq, 0, nk, FLASHC_CAUSAL_NONE);
        return n;
    }
    /* a key range that every query range sees in full: one call with all the queries */
    int done[2] = {0, 0};
    for (int j = 0; j < kr->n; j++) {
        int full = kr->len[j] > 0;
        for (int i = 0; i < qr->n; i++)
            if (qr->len[i] > 0 && cls[i][j] != PAIR_FULL)
                full = 0;
        if (full) {
            done[j] = 1;
            add_call(calls, &n, 0, nq, koff[j], kr->len[j], FLASHC_CAUSAL_NONE);
        }
    }
    for (int i = 0; i < qr->n; i++) {
        if (qr->len[i] == 0)
            continue;
        const int64_t qa = qr->start[i], qb = qa + qr->len[i];
        /* a query range that sees the whole block: one call with all the keys */
        int row_full = !done[0] && !done[1];
        for (int j = 0; j < kr->n; j++)
            if (kr->len[j] > 0 && cls[i][j] != PAIR_FULL)
                row_full = 0;
        if (row_full) {
            add_call(calls, &n, qoff[i], qr->len[i], 0, nk, FLASHC_CAUSAL_NONE);
            continue;
        }
        for (int j = 0; j < kr->n; j++) {
            if (done[j] || kr->len[j] == 0 || cls[i][j] == PAIR_NONE)
                continue;
            const int64_t ka = kr->start[j], kb = ka + kr->len[j];
            if (cls[i][j] == PAIR_FULL) {
                add_call(calls, &n, qoff[i], qr->len[i], koff[j], kr->len[j],
                         FLASHC_CAUSAL_NONE);
                continue;
            }
            /* rows before ka see nothing; rows [q0, q1) see keys [ka, i]: bottom-right
             * alignment of those rows against keys [ka, q1) puts query q1-1 on key q1-1;
             * rows from kb on see the whole range */
            int64_t q0 = qa > ka ? qa : ka, q1 = qb < kb ? qb : kb;
            add_call(calls, &n, qoff[i] + (q0 - qa), q1 - q0, koff[j], q1 - ka,
                     FLASHC_CAUSAL_BOTTOM_RIGHT);
            int64_t f0 = qa > kb ? qa : kb;
            add_call(calls, &n, qoff[i] + (f0 - qa), qb - f0, koff[j], kr->len[j],
                     FLASHC_CAUSAL_NONE);
        }
    }
    return n;
}

/* ---- views and host helpers -------------------------------------------------------------- */

flashc_tensor ring_seq_rows(const flashc_tensor *t, int64_t a, int64_t n)
{
    flashc_tensor r = *t;
    r.data = (char *)t->data + a * t->stride[1] * (int64_t)flashc_dtype_size(t->dtype);
    r.shape[1] = n;
    return r;
}

flashc_tensor ring_lse_rows(const flashc_tensor *t, int64_t a, int64_t n)
{
    flashc_tensor r = *t;
    r.data = (float *)t->data + a * t->stride[2];
    r.shape[2] = n;
    return r;
}

void ring_host_add(float *dst, int64_t rows, int64_t r0, const flashc_tensor *src)
{
    const int64_t B = src->shape[0], S = src->shape[1], H = src->shape[2], D = src->shape[3];
    float row[FLASHC_MAX_HEAD_DIM];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                flashc_load_row(row, flashc_row_ptr(src, b, s, h), src->dtype, D);
                float *d = dst + ((b * rows + r0 + s) * H + h) * D;
                for (int64_t x = 0; x < D; x++)
                    d[x] += row[x];
            }
}

void ring_host_pack(void *dst, const flashc_tensor *src)
{
    const int64_t B = src->shape[0], S = src->shape[1], H = src->shape[2], D = src->shape[3];
    const size_t row_bytes = (size_t)D * flashc_dtype_size(src->dtype);
    char *d = (char *)dst;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++, d += row_bytes)
                memcpy(d, flashc_row_ptr(src, b, s, h), row_bytes);
}

void ring_host_store(flashc_tensor *dst, const float *src)
{
    const int64_t B = dst->shape[0], S = dst->shape[1], H = dst->shape[2], D = dst->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                flashc_store_row(flashc_row_ptr(dst, b, s, h), src + ((b * S + s) * H + h) * D,
                                 dst->dtype, D);
}
