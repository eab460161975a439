/*
 * kvcache.c - flashc_forward_kvcache: decoding against a contiguous or paged KV cache, with an
 * optional in-place append. Every argument is checked here, before a backend sees the call
 * (tensors, the cache geometry, cache_seqlens and block_table values, slots two sequences
 * would both write), so that on any error nothing is written; then the call is reduced to a
 * flashc_kvcache_problem for the backend's forward_kvcache op. Also the pieces the backends
 * share: the choice of the split count and the host append.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"

void flashc_kvcache_params_init_sized(flashc_kvcache_params *p, size_t struct_size)
{
    if (!p || struct_size < sizeof(size_t))
        return;
    flashc_kvcache_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    /* a shorter (older) struct gets the defaults of the fields it has, and its own size */
    size_t n = struct_size < sizeof d ? struct_size : sizeof d;
    memcpy(p, &d, n);
    if (struct_size > sizeof d)
        memset((char *)p + sizeof d, 0, struct_size - sizeof d);
    p->struct_size = struct_size;
}

/* ---------------------------------------------------------------------------------------- */
/* Shared by the backends                                                                   */
/* ---------------------------------------------------------------------------------------- */

int32_t flashc_kvcache_num_splits(int64_t tasks, int64_t max_len, int64_t units,
                                  int64_t min_keys)
{
    if (tasks < 1 || units < 1)
        return 1;
    int64_t most = min_keys > 0 ? max_len / min_keys : max_len;
    if (most > FLASHC_KVCACHE_MAX_SPLITS)
        most = FLASHC_KVCACHE_MAX_SPLITS;
    /* enough independent work already: splitting only adds the merge */
    if (most <= 1 || (double)tasks >= 0.8 * (double)units)
        return 1;
    double eff[FLASHC_KVCACHE_MAX_SPLITS + 1], best = 0.0;
    for (int64_t s = 1; s <= most; s++) {
        double waves = (double)(tasks * s) / (double)units;
        eff[s] = waves / ceil(waves);
        if (eff[s] > best)
            best = eff[s];
    }
    for (int64_t s = 1; s <= most; s++)
        if (eff[s] >= 0.85 * best)
            return (int32_t)s;
    return 1;
}

int32_t flashc_kvcache_num_splits_one_wave(int64_t tasks, int64_t max_len, int64_t units,
                                           int64_t min_keys)
{
    if (tasks < 1 || units < 1 || (double)tasks >= 0.8 * (double)units)
        return 1;
    int64_t most = min_keys > 0 ? max_len / min_keys : max_len;
    if (most > FLASHC_KVCACHE_MAX_SPLITS)
        most = FLASHC_KVCACHE_MAX_SPLITS;
    const int64_t fit = units / tasks;
    const int64_t s = fit < most ? fit : most;
    return s < 1 ? 1 : (int32_t)s;
}

void flashc_host_kvcache_append(const flashc_kvcache_problem *pr, flashc_tensor *k_cache,
                                flashc_tensor *v_cache, const flashc_tensor *k_new,
                                const flashc_tensor *v_new)
{
    const flashc_problem *bp = &pr->base;
    const size_t row_bytes = (size_t)(bp->head_dim * pr->elem_size);
    for (int64_t b = 0; b < bp->batch; b++)
        for (int64_t t = 0; t < pr->seqlen_new; t++) {
            const int64_t j = pr->cache_seqlens[b] + t;
            for (int64_t h = 0; h < bp->heads_kv; h++) {
                memcpy(flashc_kvcache_row(pr, k_cache, b, j, h),
                       (const char *)k_new->data +
                           (b * k_new->stride[0] + t * k_new->stride[1] + h * k_new->stride[2]) *
                               pr->elem_size,
                       row_bytes);
                memcpy(flashc_kvcache_row(pr, v_cache, b, j, h),
                       (const char *)v_new->data +
                           (b * v_new->stride[0] + t * v_new->stride[1] + h * v_new->stride[2]) *
                               pr->elem_size,
                       row_bytes);
            }
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The flashc_params fields a decode uses, range-checked as flashc_forward does, and the ones
 * it does not serve refused by name. */
static flashc_status check_kv_params(const flashc_params *user, flashc_params *p)
{
    TRY(check_shared_params(user, p));
    if (p->cu_seqlens_q || p->cu_seqlens_k || p->num_seqs || p->max_seqlen_q || p->max_seqlen_k)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "params.cu_seqlens_q/cu_seqlens_k (variable-length batch): not "
                            "served by flashc_forward_kvcache, whose ragged batch is "
                            "kv.cache_seqlens");
    if (p->dropout_p != 0.0f)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "params.dropout_p (dropout): not served by flashc_forward_kvcache");
    if (p->workspace_size > 0 && !p->workspace)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "params.workspace is NULL but params.workspace_size is %zu",
                            p->workspace_size);
    return FLASHC_OK;
}

static int is_pow2(int64_t x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

/* Bytes [p, p + n * 4) of an int32 array, as a span for the aliasing check. */
static span int32_span(const int32_t *p, int64_t n)
{
    span s;
    s.begin = (uintptr_t)p;
    s.end = (uintptr_t)p + (uintptr_t)n * sizeof(int32_t);
    return s;
}

/* One run of slots a sequence appends into one page: [lo, hi) of page `page`. */
typedef struct slot_run {
    int64_t page, lo, hi, seq;
} slot_run;

static int cmp_run(const void *a, const void *b)
{
    const slot_run *x = a, *y = b;
    if (x->page != y->page)
        return x->page < y->page ? -1 : 1;
    return x->lo < y->lo ? -1 : (x->lo > y->lo ? 1 : 0);
}

/* Paged append: no slot may be written twice (two sequences, or one sequence whose table
 * names a page twice), or the result would depend on the order of the writes. */
static flashc_status check_distinct_slots(const flashc_kvcache_problem *pr)
{
    const int64_t ps = pr->page_size;
    int64_t n = 0;
    for (int64_t b = 0; b < pr->base.batch; b++) {
        int64_t s0 = pr->cache_seqlens[b], s1 = s0 + pr->seqlen_new;
        n += (s1 - 1) / ps - s0 / ps + 1;
    }
    slot_run *runs = malloc((size_t)n * sizeof *runs);
    if (!runs)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY,
                            "kv.block_table: out of memory checking %lld appended pages",
                            (long long)n);
    int64_t r = 0;
    for (int64_t b = 0; b < pr->base.batch; b++) {
        int64_t s0 = pr->cache_seqlens[b], s1 = s0 + pr->seqlen_new;
        for (int64_t p = s0 / ps; p <= (s1 - 1) / ps; p++) {
            int64_t lo = p * ps > s0 ? p * ps : s0, hi = (p + 1) * ps < s1 ? (p + 1) * ps : s1;
            runs[r].page = pr->block_table[b * pr->block_table_stride + p];
            runs[r].lo = lo - p * ps;
            runs[r].hi = hi - p * ps;
            runs[r].seq = b;
            r++;
        }
    }
    qsort(runs, (size_t)n, sizeof *runs, cmp_run);
    flashc_status st = FLASHC_OK;
    for (int64_t i = 1; i < n && st == FLASHC_OK; i++)
        if (runs[i].page == runs[i - 1].page && runs[i].lo < runs[i - 1].hi)
            st = flashc_error(FLASHC_ERROR_ALIASING,
                              "kv.block_table: sequences %lld and %lld both append into slot "
                              "%lld of page %lld",
                              (long long)runs[i - 1].seq, (long long)runs[i].seq,
                              (long long)runs[i].lo, (long long)runs[i].page);
    free(runs);
    return st;
}

/* cache_seqlens and block_table values, for backends whose memory is the host's. */
static flashc_status check_host_values(flashc_kvcache_problem *pr)
{
    const int64_t limit = pr->capacity - pr->seqlen_new;
    int64_t longest = 0;
    for (int64_t b = 0; b < pr->base.batch; b++) {
        const int64_t s = pr->cache_seqlens[b];
        if (s < 0 || s > limit) {
            if (pr->seqlen_new)
                return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                    "kv.cache_seqlens[%lld] is %lld: with %lld new keys "
                                    "appended it must be in 0..%lld (the cache holds %lld "
                                    "keys per sequence)",
                                    (long long)b, (long long)s, (long long)pr->seqlen_new,
                                    (long long)limit, (long long)pr->capacity);
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "kv.cache_seqlens[%lld] is %lld: it must be in 0..%lld (the "
                                "cache holds %lld keys per sequence)",
                                (long long)b, (long long)s, (long long)limit,
                                (long long)pr->capacity);
        }
        const int64_t len = s + pr->seqlen_new;
        longest = len > longest ? len : longest;
        if (!pr->paged)
            continue;
        const int64_t pages = (len + pr->page_size - 1) >> pr->page_shift;
        for (int64_t p = 0; p < pages; p++) {
            const int64_t e = pr->block_table[b * pr->block_table_stride + p];
            if (e < 0 || e >= pr->num_pages)
                return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                    "kv.block_table[%lld][%lld] is %lld: sequence %lld uses "
                                    "pages 0..%lld of its row, and each must be in 0..%lld "
                                    "(k_cache shape[0])",
                                    (long long)b, (long long)p, (long long)e, (long long)b,
                                    (long long)(pages - 1), (long long)(pr->num_pages - 1));
        }
    }
    pr->max_len = longest;
    if (pr->paged && pr->seqlen_new)
        return check_distinct_slots(pr);
    return FLASHC_OK;
}

static flashc_status check_like_dtype(const flashc_tensor *t, const char *name, flashc_dtype want,
                                      int allow_f32)
{
    if (t->dtype == want || (allow_f32 && t->dtype == FLASHC_F32))
        return FLASHC_OK;
    return flashc_error(FLASHC_ERROR_DTYPE_MISMATCH, "%s: dtype %d differs from q's dtype %d",
                        name, (int)t->dtype, (int)want);
}

/* A tensor whose shape must be {d0, d1, d2, d3} exactly (names for the message). */
static flashc_status check_shape_is(const flashc_tensor *t, const char *name, const int64_t *want,
                                    const char *const *why)
{
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "%s: shape[%d] (%s) is %lld but %s gives %lld", name, d,
                                dim_names[d], (long long)t->shape[d], why[d],
                                (long long)want[d]);
    return FLASHC_OK;
}

/* Validates a flashc_forward_kvcache call (or its workspace query, which takes the same
 * arguments) and describes it in *out_pr; nothing is written. */
static flashc_status build_kvcache(flashc_backend *backend, const flashc_params *params,
                                   const flashc_kvcache_params *kv_user, const flashc_tensor *q,
                                   const flashc_tensor *k_cache, const flashc_tensor *v_cache,
                                   const flashc_tensor *k_new, const flashc_tensor *v_new,
                                   const flashc_tensor *out, const flashc_tensor *lse,
                                   flashc_kvcache_problem *out_pr)
{
    TRY(check_backend(backend));
    const flashc_backend_ops *ops = backend->ops;
    if (!ops->forward_kvcache)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "backend: '%s' does not implement flashc_forward_kvcache in this "
                            "version",
                            ops->name);
    flashc_params p;
    TRY(check_kv_params(params, &p));
    if (!kv_user)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "kv: NULL; pass a flashc_kvcache_params with cache_seqlens");
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    TRY(copy_versioned(&kv, sizeof kv, kv_user, kv_user->struct_size, "kv",
                    "flashc_kvcache_params_init"));
    if (!kv.cache_seqlens)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "kv.cache_seqlens is NULL: it gives the keys already cached per "
                            "sequence");
    if (kv.num_splits < 0 || kv.num_splits > FLASHC_KVCACHE_MAX_SPLITS)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "kv.num_splits is %d: use 0 (automatic) or 1..%d", (int)kv.num_splits,
                            FLASHC_KVCACHE_MAX_SPLITS);
    if ((k_new == NULL) != (v_new == NULL))
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "%s is NULL but %s is given: an append needs both new keys and "
                            "values",
                            k_new ? "v_new" : "k_new", k_new ? "k_new" : "v_new");
    const int append = k_new != NULL;
    const int paged = kv.block_table != NULL;

    enum { S_Q, S_KC, S_VC, S_KN, S_VN, S_OUT, S_LSE, S_SEQ, S_WS, S_BT, N_SPANS };
    named_span s[N_SPANS] = {
        {"q", {0, 0}, 0},         {"k_cache", {0, 0}, append}, {"v_cache", {0, 0}, append},
        {"k_new", {0, 0}, 0},     {"v_new", {0, 0}, 0},        {"out", {0, 0}, 1},
        {"lse", {0, 0}, 1},       {"kv.cache_seqlens", {0, 0}, 0},
        {"params.workspace", {0, 0}, 1}, {"kv.block_table", {0, 0}, 0}};
    TRY(check_tensor4(q, "q", 0, &s[S_Q].sp));
    TRY(check_tensor4(k_cache, "k_cache", append, &s[S_KC].sp));
    TRY(check_like_dtype(k_cache, "k_cache", q->dtype, 0));
    TRY(check_tensor4(v_cache, "v_cache", append, &s[S_VC].sp));
    TRY(check_like_dtype(v_cache, "v_cache", q->dtype, 0));
    TRY(check_same_shape(v_cache, "v_cache", k_cache, "k_cache"));
    const int64_t batch = q->shape[0], nq = q->shape[1], heads_q = q->shape[2];
    const int64_t heads_kv = k_cache->shape[2], dim = q->shape[3];
    if (k_cache->shape[3] != dim)
        return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                            "k_cache: shape[3] (head_dim) is %lld but q has %lld",
                            (long long)k_cache->shape[3], (long long)dim);
    if (heads_q % heads_kv != 0)
        return flashc_error(FLASHC_ERROR_INVALID_HEADS,
                            "q: heads_q (%lld) is not a multiple of heads_kv (%lld) of k_cache",
                            (long long)heads_q, (long long)heads_kv);

    flashc_kvcache_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.paged = paged;
    pr.cache_seqlens = kv.cache_seqlens;
    pr.num_splits = kv.num_splits;
    pr.elem_size = (int64_t)flashc_dtype_size(q->dtype);
    if (paged) {
        const int64_t page_size = k_cache->shape[1];
        if (!is_pow2(page_size) || page_size < 16)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "k_cache: shape[1] (page_size) is %lld; a paged cache needs a "
                                "power of two >= 16",
                                (long long)page_size);
        if (kv.max_pages_per_seq < 1)
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "kv.max_pages_per_seq is %d: a paged cache needs the columns "
                                "of block_table (>= 1)",
                                (int)kv.max_pages_per_seq);
        if (kv.block_table_stride != 0 && kv.block_table_stride < kv.max_pages_per_seq)
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "kv.block_table_stride is %lld: use 0 or at least "
                                "max_pages_per_seq (%d)",
                                (long long)kv.block_table_stride, (int)kv.max_pages_per_seq);
        if ((uintptr_t)kv.block_table % sizeof(int32_t) != 0)
            return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                                "kv.block_table: pointer %p is not aligned to int32",
                                (const void *)kv.block_table);
        pr.page_size = page_size;
        while (((int64_t)1 << pr.page_shift) < page_size)
            pr.page_shift++;
        pr.num_pages = k_cache->shape[0];
        pr.block_table = kv.block_table;
        pr.max_pages_per_seq = kv.max_pages_per_seq;
        pr.block_table_stride = kv.block_table_stride ? kv.block_table_stride
                                                      : kv.max_pages_per_seq;
        pr.capacity = pr.max_pages_per_seq * page_size;
        int64_t entries;
        if (__builtin_mul_overflow(batch - 1, pr.block_table_stride, &entries) ||
            __builtin_add_overflow(entries, pr.max_pages_per_seq, &entries) ||
            entries > (int64_t)(PTRDIFF_MAX / 4) ||
            (uintptr_t)kv.block_table + (uintptr_t)entries * 4 < (uintptr_t)kv.block_table)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "kv.block_table: batch x block_table_stride overflows");
        s[S_BT].sp = int32_span(kv.block_table, entries);
    } else {
        if (kv.max_pages_per_seq != 0 || kv.block_table_stride != 0)
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "kv.max_pages_per_seq/block_table_stride are set but "
                                "kv.block_table is NULL (a contiguous cache)");
        if (k_cache->shape[0] != batch)
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "k_cache: shape[0] (batch) is %lld but q has %lld (a paged "
                                "cache needs kv.block_table)",
                                (long long)k_cache->shape[0], (long long)batch);
        pr.capacity = k_cache->shape[1];
    }
    if ((uintptr_t)kv.cache_seqlens % sizeof(int32_t) != 0)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "kv.cache_seqlens: pointer %p is not aligned to int32",
                            (const void *)kv.cache_seqlens);
    s[S_SEQ].sp = int32_span(kv.cache_seqlens, batch);

    int n_spans = N_SPANS;
    if (append) {
        static const char *const why_new[4] = {"q", "k_new", "k_cache", "q"};
        TRY(check_tensor4(k_new, "k_new", 0, &s[S_KN].sp));
        TRY(check_like_dtype(k_new, "k_new", q->dtype, 0));
        const int64_t want[4] = {batch, k_new->shape[1], heads_kv, dim};
        TRY(check_shape_is(k_new, "k_new", want, why_new));
        TRY(check_tensor4(v_new, "v_new", 0, &s[S_VN].sp));
        TRY(check_like_dtype(v_new, "v_new", q->dtype, 0));
        TRY(check_same_shape(v_new, "v_new", k_new, "k_new"));
        pr.seqlen_new = k_new->shape[1];
        if (pr.seqlen_new > pr.capacity)
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "k_new: shape[1] (seqlen) is %lld, more than the %lld keys the "
                                "cache holds per sequence",
                                (long long)pr.seqlen_new, (long long)pr.capacity);
    } else {
        s[S_KN].name = s[S_VN].name = NULL;
    }
    TRY(check_tensor4(out, "out", 1, &s[S_OUT].sp));
    TRY(check_like_dtype(out, "out", q->dtype, ops->accepts_f32_outputs));
    TRY(check_same_shape(out, "out", q, "q"));
    TRY(check_lse(lse, "lse", 1, q, &s[S_LSE].sp));
    if (!paged) /* drop the unused block_table entry (the last) */
        n_spans--;
    if (p.workspace) { /* scratch the call writes: like an output */
        const uintptr_t begin = (uintptr_t)p.workspace;
        if (begin + p.workspace_size < begin)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "params.workspace + workspace_size wraps the address space");
        s[S_WS].sp.begin = begin;
        s[S_WS].sp.end = begin + p.workspace_size;
    } else { /* drop it: move the entries after it down */
        memmove(&s[S_WS], &s[S_WS + 1], (size_t)(n_spans - S_WS - 1) * sizeof s[0]);
        n_spans--;
    }
    if (!append) { /* and the absent k_new / v_new: move the tail down over them */
        memmove(&s[S_KN], &s[S_VN + 1], (size_t)(n_spans - S_VN - 1) * sizeof s[0]);
        n_spans -= 2;
    }
    TRY(check_aliasing(s, n_spans));

    /* the attention as flashc_forward would see it, with the cache's capacity as seqlen_k */
    flashc_problem *bp = &pr.base;
    bp->batch = batch;
    bp->seqlen_q = nq;
    bp->seqlen_k = pr.capacity;
    bp->heads_q = heads_q;
    bp->heads_kv = heads_kv;
    bp->head_dim = dim;
    bp->dtype = q->dtype;
    bp->out_dtype = out->dtype;
    bp->scale = p.softmax_scale != 0.0f ? p.softmax_scale : (float)(1.0 / sqrt((double)dim));
    bp->causal = p.causal;
    bp->stream = p.stream;
    bp->workspace = p.workspace;
    bp->workspace_size = p.workspace_size;
    bp->max_seqlen_q = nq;
    bp->max_seqlen_k = pr.capacity;
    uint32_t f = 0;
    if (p.window_left >= 0 || p.window_right >= 0)
        f |= FLASHC_FEATURE_WINDOW;
    if (p.softcap > 0.0f)
        f |= FLASHC_FEATURE_SOFTCAP;
    if (p.alibi_slopes)
        f |= FLASHC_FEATURE_ALIBI;
    const uint32_t missing = f & ~ops->features;
    if (missing)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "params.%s: not implemented by the '%s' backend",
                            (missing & FLASHC_FEATURE_WINDOW)    ? "window_left/window_right"
                            : (missing & FLASHC_FEATURE_SOFTCAP) ? "softcap"
                                                                 : "alibi_slopes",
                            ops->name);
    bp->features = f;
    bp->window_left = p.window_left;
    bp->window_right = p.window_right;
    bp->softcap = p.softcap;
    const int host = !ops->uses_device_memory;
    if (f & FLASHC_FEATURE_ALIBI) {
        if ((uintptr_t)p.alibi_slopes % sizeof(float) != 0)
            return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                                "params.alibi_slopes: pointer %p is not aligned to float",
                                (const void *)p.alibi_slopes);
        bp->alibi_slopes = p.alibi_slopes;
        bp->alibi_batch_stride = p.alibi_slopes_batch_stride;
        const int64_t rows = bp->alibi_batch_stride ? batch : 1;
        for (int64_t b = 0; host && b < rows; b++)
            for (int64_t h = 0; h < heads_q; h++)
                if (!isfinite(p.alibi_slopes[b * bp->alibi_batch_stride + h]))
                    return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                        "params.alibi_slopes[%lld] (sequence %lld, head %lld) "
                                        "is not finite",
                                        (long long)(b * bp->alibi_batch_stride + h),
                                        (long long)b, (long long)h);
    }
    pr.max_len = pr.capacity;
    if (host)
        TRY(check_host_values(&pr));
    *out_pr = pr;
    return FLASHC_OK;
}

flashc_status flashc_forward_kvcache(flashc_backend *backend, const flashc_params *params,
                                     const flashc_kvcache_params *kv,
                                     const flashc_tensor *q, flashc_tensor *k_cache,
                                     flashc_tensor *v_cache, const flashc_tensor *k_new,
                                     const flashc_tensor *v_new, flashc_tensor *out,
                                     flashc_tensor *lse)
{
    flashc_kvcache_problem pr;
    TRY(build_kvcache(backend, params, kv, q, k_cache, v_cache, k_new, v_new, out, lse, &pr));
    /* a backend that uses the workspace checks its size against its own plan of the call
     * (planning it here as well would do the work twice on every decode step) */
    return backend->ops->forward_kvcache(backend->state, &pr, q, k_cache, v_cache, k_new, v_new,
                                         out, lse);
}

flashc_status flashc_kvcache_workspace_size(flashc_backend *backend, const flashc_params *params,
                                            const flashc_kvcache_params *kv,
                                            const flashc_tensor *q, const flashc_tensor *k_cache,
                                            const flashc_tensor *v_cache,
                                            const flashc_tensor *k_new, const flashc_tensor *v_new,
                                            const flashc_tensor *out, const flashc_tensor *lse,
                                            size_t *bytes)
{
    if (!bytes)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "bytes: output pointer is NULL");
    flashc_kvcache_problem pr;
    TRY(build_kvcache(backend, params, kv, q, k_cache, v_cache, k_new, v_new, out, lse, &pr));
    const flashc_backend_ops *ops = backend->ops;
    *bytes = ops->kvcache_workspace_size ? ops->kvcache_workspace_size(backend->state, &pr) : 0;
    return FLASHC_OK;
}
