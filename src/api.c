/*
 * api.c - the public entry points: argument validation, backend handles and dispatch.
 *
 * Every check happens here, before a backend sees the call, so that a bad argument returns
 * a status with a message naming it and nothing the caller owns is written.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "philox.h"

const char *flashc_version(void)
{
    return FLASHC_VERSION_STRING;
}

/* ---------------------------------------------------------------------------------------- */
/* Backends                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static const flashc_backend_ops *const all_backends[] = {
#ifdef FLASHC_HAVE_CUDA
    &flashc_cuda_backend_ops,
#endif
    &flashc_cpu_backend_ops,
    &flashc_reference_backend_ops,
};
#define N_BACKENDS (sizeof all_backends / sizeof all_backends[0])

static const flashc_backend_ops *find_backend(const char *name)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(all_backends[i]->name, name) == 0)
            return all_backends[i];
    return NULL;
}

static int is_known_backend_name(const char *name)
{
    return strcmp(name, "cpu") == 0 || strcmp(name, "cuda") == 0 ||
           strcmp(name, "reference") == 0;
}

int flashc_backend_available(const char *name)
{
    if (!name)
        return 0;
    if (strcmp(name, "auto") == 0)
        return 1;
    const flashc_backend_ops *ops = find_backend(name);
    return ops && ops->available();
}

flashc_status flashc_backend_create(const char *name, const flashc_backend_config *cfg,
                                    flashc_backend **out)
{
    if (!out)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "out: pointer to the handle is NULL");
    *out = NULL;

    flashc_backend_config config;
    flashc_backend_config_init(&config);
    if (cfg) {
        flashc_status st = copy_versioned(&config, sizeof config, cfg, cfg->struct_size,
                                          "cfg", "flashc_backend_config_init");
        if (st != FLASHC_OK)
            return st;
        config.struct_size = sizeof config;
    }
    if (config.num_threads < 0)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "cfg.num_threads is %d: use 0 for the default or a positive count",
                            config.num_threads);
    if (config.num_threads > 4096)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "cfg.num_threads is %d: at most 4096 threads", config.num_threads);

    const flashc_backend_ops *ops = NULL;
    if (!name || strcmp(name, "auto") == 0) {
        for (size_t i = 0; i < N_BACKENDS && !ops; i++)
            if (strcmp(all_backends[i]->name, "reference") != 0 && all_backends[i]->available())
                ops = all_backends[i];
    } else {
        ops = find_backend(name);
        if (!ops) {
            if (is_known_backend_name(name))
                return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                                    "name: backend '%s' is not built into this library", name);
            return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                                "name: unknown backend '%.64s' (known: auto, cpu, cuda, "
                                "reference)",
                                name);
        }
        if (!ops->available())
            return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                                "name: backend '%s' is built in but not usable on this machine "
                                "(no device found)",
                                name);
    }
    if (!ops)
        return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE, "no backend is available");

    flashc_backend *be = (flashc_backend *)calloc(1, sizeof *be);
    if (!be)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "backend handle: out of memory");
    be->ops = ops;
    flashc_status st = ops->create(&config, &be->state);
    if (st != FLASHC_OK) {
        free(be);
        return st;
    }
    ops->describe(be->state, be->description, sizeof be->description);
    *out = be;
    return FLASHC_OK;
}

void flashc_backend_destroy(flashc_backend *backend)
{
    if (!backend)
        return;
    backend->ops->destroy(backend->state);
    free(backend);
}

const char *flashc_backend_name(const flashc_backend *backend)
{
    return backend ? backend->ops->name : "";
}

int flashc_backend_uses_device_memory(const flashc_backend *backend)
{
    return backend ? backend->ops->uses_device_memory : 0;
}

const char *flashc_backend_describe(const flashc_backend *backend)
{
    return backend ? backend->description : "";
}

flashc_status flashc_backend_malloc(flashc_backend *backend, size_t bytes, void **ptr)
{
    if (!ptr)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "ptr: output pointer is NULL");
    *ptr = NULL;
    if (!backend)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "backend: handle is NULL");
    if (bytes == 0)
        bytes = 1;
    if (backend->ops->malloc_fn)
        return backend->ops->malloc_fn(backend->state, bytes, ptr);
    if (bytes > (size_t)PTRDIFF_MAX - 64)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "bytes: %zu is too large", bytes);
    *ptr = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!*ptr)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "out of memory for %zu bytes", bytes);
    return FLASHC_OK;
}

void flashc_backend_free(flashc_backend *backend, void *ptr)
{
    if (!backend || !ptr)
        return;
    if (backend->ops->free_fn)
        backend->ops->free_fn(backend->state, ptr);
    else
        free(ptr);
}

flashc_status flashc_backend_memcpy(flashc_backend *backend, void *dst, const void *src,
                                    size_t bytes, flashc_copy_kind kind)
{
    if (!backend)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "backend: handle is NULL");
    if (kind != FLASHC_COPY_TO_BACKEND && kind != FLASHC_COPY_TO_HOST)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM, "kind: %d is not a flashc_copy_kind",
                            (int)kind);
    if (bytes == 0)
        return FLASHC_OK;
    if (!dst || !src)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "%s: pointer is NULL",
                            dst ? "src" : "dst");
    if (backend->ops->memcpy_fn)
        return backend->ops->memcpy_fn(backend->state, dst, src, bytes, kind);
    memmove(dst, src, bytes);
    return FLASHC_OK;
}

flashc_status flashc_backend_synchronize(flashc_backend *backend, void *stream)
{
    if (!backend)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "backend: handle is NULL");
    if (backend->ops->synchronize_fn)
        return backend->ops->synchronize_fn(backend->state, stream);
    return FLASHC_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Tensor checks                                                                            */
/* ---------------------------------------------------------------------------------------- */

static flashc_status check_dtype(const flashc_tensor *t, const char *name, flashc_dtype want,
                                 int allow_f32)
{
    if (t->dtype == want || (allow_f32 && t->dtype == FLASHC_F32))
        return FLASHC_OK;
    return flashc_error(FLASHC_ERROR_DTYPE_MISMATCH, "%s: dtype %d differs from q's dtype %d",
                        name, (int)t->dtype, (int)want);
}

/* q against k: batch and head_dim agree, heads_q a multiple of heads_kv. */
static flashc_status check_q_k(const flashc_tensor *q, const flashc_tensor *k)
{
    if (k->shape[0] != q->shape[0])
        return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                            "k: shape[0] (batch) is %lld but q has %lld",
                            (long long)k->shape[0], (long long)q->shape[0]);
    if (k->shape[3] != q->shape[3])
        return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                            "k: shape[3] (head_dim) is %lld but q has %lld",
                            (long long)k->shape[3], (long long)q->shape[3]);
    if (q->shape[2] % k->shape[2] != 0)
        return flashc_error(FLASHC_ERROR_INVALID_HEADS,
                            "q: heads_q (%lld) is not a multiple of heads_kv (%lld) of k",
                            (long long)q->shape[2], (long long)k->shape[2]);
    return FLASHC_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Params                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static flashc_status check_params(const flashc_params *user, flashc_params *p)
{
    TRY(check_shared_params(user, p));
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "params.%s is NULL but params.%s is set: a variable-length batch "
                            "needs both",
                            p->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
                            p->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
    if (p->max_seqlen_q < 0 || p->max_seqlen_k < 0)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.max_seqlen_q/max_seqlen_k is %d/%d: must be >= 0",
                            (int)p->max_seqlen_q, (int)p->max_seqlen_k);
    if (!p->cu_seqlens_q && (p->num_seqs || p->max_seqlen_q || p->max_seqlen_k))
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.num_seqs, max_seqlen_q and max_seqlen_k describe a "
                            "variable-length batch: set cu_seqlens_q/cu_seqlens_k too, or "
                            "leave them 0");
    if (p->cu_seqlens_q && p->num_seqs < 1)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.num_seqs is %d: a variable-length batch needs the number "
                            "of sequences (cu_seqlens_q/k hold num_seqs + 1 offsets)",
                            (int)p->num_seqs);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return flashc_error(FLASHC_ERROR_INVALID_PARAM, "params.dropout_p must be in [0, 1)");
    if (p->workspace_size > 0 && !p->workspace)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "params.workspace is NULL but params.workspace_size is %zu",
                            p->workspace_size);
    return FLASHC_OK;
}

static void fill_problem(flashc_problem *pr, const flashc_params *p, const flashc_tensor *q,
                         const flashc_tensor *k, flashc_dtype out_dtype)
{
    memset(pr, 0, sizeof *pr);
    pr->batch = q->shape[0];
    pr->seqlen_q = q->shape[1];
    pr->heads_q = q->shape[2];
    pr->head_dim = q->shape[3];
    pr->seqlen_k = k->shape[1];
    pr->heads_kv = k->shape[2];
    pr->dtype = q->dtype;
    pr->out_dtype = out_dtype;
    pr->scale = p->softmax_scale != 0.0f ? p->softmax_scale
                                         : (float)(1.0 / sqrt((double)pr->head_dim));
    pr->causal = p->causal;
    pr->deterministic = p->deterministic;
    pr->stream = p->stream;
    pr->workspace = p->workspace;
    pr->workspace_size = p->workspace_size;
}

/* Name of the params field that asks for a feature, for messages. */
static const char *feature_field(uint32_t bit)
{
    switch (bit) {
    case FLASHC_FEATURE_WINDOW: return "params.window_left/window_right (sliding window)";
    case FLASHC_FEATURE_SOFTCAP: return "params.softcap (logit softcap)";
    case FLASHC_FEATURE_ALIBI: return "params.alibi_slopes (ALiBi)";
    case FLASHC_FEATURE_VARLEN: return "params.cu_seqlens_q/cu_seqlens_k (variable-length batch)";
    case FLASHC_FEATURE_DROPOUT: return "params.dropout_p (dropout)";
    default: return "params";
    }
}

/* The prefix sums of one side of a varlen batch: first 0, never decreasing, last == total.
 * Returns the longest sequence in *longest. */
static flashc_status check_cu_seqlens(const int32_t *cu, const char *name, int64_t n,
                                      int64_t total, const char *total_name, int32_t max_given,
                                      const char *max_name, int64_t *longest)
{
    if ((uintptr_t)cu % sizeof(int32_t) != 0)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "params.%s: pointer %p is not aligned to int32", name,
                            (const void *)cu);
    if (cu[0] != 0)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.%s[0] is %d: the offsets must start at 0", name, (int)cu[0]);
    int64_t mx = 0;
    for (int64_t b = 0; b < n; b++) {
        if (cu[b + 1] < cu[b])
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "params.%s[%lld] is %d, below %s[%lld] = %d: the offsets must "
                                "not decrease",
                                name, (long long)(b + 1), (int)cu[b + 1], name, (long long)b,
                                (int)cu[b]);
        if (cu[b + 1] > total)
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "params.%s[%lld] is %d, past the %lld rows of %s", name,
                                (long long)(b + 1), (int)cu[b + 1], (long long)total,
                                total_name);
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        mx = len > mx ? len : mx;
    }
    if (cu[n] != total)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.%s[num_seqs] is %d but %s holds %lld rows: the last offset "
                            "must be the total",
                            name, (int)cu[n], total_name, (long long)total);
    if (max_given != 0 && max_given < mx)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.%s is %d but the longest sequence of %s has %lld rows",
                            max_name, (int)max_given, name, (long long)mx);
    *longest = mx;
    return FLASHC_OK;
}

/* The features a call asks for, checked against the backend and against the tensors, and
 * recorded in the problem. The offsets and slopes are read here only for backends whose
 * memory is the host's; a device backend that implements them validates its own copy. */
static flashc_status resolve_features(const flashc_backend *backend, const flashc_params *p,
                                      const flashc_tensor *q, const flashc_tensor *k,
                                      flashc_problem *pr)
{
    uint32_t f = 0;
    if (p->window_left >= 0 || p->window_right >= 0)
        f |= FLASHC_FEATURE_WINDOW;
    if (p->softcap > 0.0f)
        f |= FLASHC_FEATURE_SOFTCAP;
    if (p->alibi_slopes)
        f |= FLASHC_FEATURE_ALIBI;
    if (p->cu_seqlens_q)
        f |= FLASHC_FEATURE_VARLEN;
    if (p->dropout_p > 0.0f)
        f |= FLASHC_FEATURE_DROPOUT;
    uint32_t missing = f & ~backend->ops->features;
    if (missing) {
        uint32_t bit = missing & (~missing + 1u);
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "%s: not implemented by the '%s' backend",
                            feature_field(bit), backend->ops->name);
    }
    pr->features = f;
    pr->window_left = p->window_left;
    pr->window_right = p->window_right;
    pr->softcap = p->softcap;
    pr->max_seqlen_q = pr->seqlen_q;
    pr->max_seqlen_k = pr->seqlen_k;
    const int host = !backend->ops->uses_device_memory;
    if (f & FLASHC_FEATURE_VARLEN) {
        if (q->shape[0] != 1)
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "q: shape[0] (batch) is %lld; a variable-length batch is packed "
                                "along seqlen, with batch 1 (params.cu_seqlens_q)",
                                (long long)q->shape[0]);
        pr->num_seqs = p->num_seqs;
        pr->cu_seqlens_q = p->cu_seqlens_q;
        pr->cu_seqlens_k = p->cu_seqlens_k;
        if (host) {
            TRY(check_cu_seqlens(p->cu_seqlens_q, "cu_seqlens_q", p->num_seqs, q->shape[1],
                                 "q", p->max_seqlen_q, "max_seqlen_q", &pr->max_seqlen_q));
            TRY(check_cu_seqlens(p->cu_seqlens_k, "cu_seqlens_k", p->num_seqs, k->shape[1],
                                 "k", p->max_seqlen_k, "max_seqlen_k", &pr->max_seqlen_k));
        } else {
            pr->max_seqlen_q = p->max_seqlen_q ? p->max_seqlen_q : pr->seqlen_q;
            pr->max_seqlen_k = p->max_seqlen_k ? p->max_seqlen_k : pr->seqlen_k;
        }
    }
    if (f & FLASHC_FEATURE_ALIBI) {
        if ((uintptr_t)p->alibi_slopes % sizeof(float) != 0)
            return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                                "params.alibi_slopes: pointer %p is not aligned to float",
                                (const void *)p->alibi_slopes);
        pr->alibi_slopes = p->alibi_slopes;
        pr->alibi_batch_stride = p->alibi_slopes_batch_stride;
        int64_t rows = pr->alibi_batch_stride ? flashc_num_seqs(pr) : 1, last_slope;
        if (__builtin_mul_overflow(rows - 1, pr->alibi_batch_stride, &last_slope) ||
            __builtin_add_overflow(last_slope, pr->heads_q, &last_slope) ||
            last_slope > (int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(float)) ||
            (uintptr_t)p->alibi_slopes + (uintptr_t)last_slope * sizeof(float) <
                (uintptr_t)p->alibi_slopes)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "params.alibi_slopes_batch_stride %lld: the slopes of %lld "
                                "sequences would reach past the address space",
                                (long long)pr->alibi_batch_stride, (long long)rows);
        if (host) {
            for (int64_t b = 0; b < rows; b++)
                for (int64_t h = 0; h < pr->heads_q; h++) {
                    int64_t at = b * pr->alibi_batch_stride + h;
                    if (!isfinite(p->alibi_slopes[at]))
                        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                            "params.alibi_slopes[%lld] (sequence %lld, head "
                                            "%lld) is not finite",
                                            (long long)at, (long long)b, (long long)h);
                }
        }
    }
    if (f & FLASHC_FEATURE_DROPOUT) {
        pr->dropout_p = p->dropout_p;
        pr->dropout_threshold = flashc_dropout_threshold(p->dropout_p);
        pr->dropout_seed = p->dropout_seed;
        pr->dropout_offset = p->dropout_offset;
    }
    return FLASHC_OK;
}

int flashc_dropout_keep(uint64_t seed, uint64_t offset, float dropout_p, int64_t heads_q,
                        int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (!(dropout_p > 0.0f))
        return 1;
    flashc_philox4 r = flashc_dropout_draws(seed, offset + (uint64_t)(b * heads_q + h),
                                            (uint32_t)i, (uint32_t)(j >> 2));
    return r.v[j & 3] >= flashc_dropout_threshold(dropout_p);
}

/* Validates the tensors shared by forward, backward and the workspace query: q and k. */
static flashc_status check_q_k_tensors(const flashc_tensor *q, const flashc_tensor *k, span *sq,
                                       span *sk)
{
    TRY(check_tensor4(q, "q", 0, sq));
    TRY(check_tensor4(k, "k", 0, sk));
    TRY(check_dtype(k, "k", q->dtype, 0));
    return check_q_k(q, k);
}

/* A tensor that must look like another (q or k): its own checks, then the same shape and
 * q's dtype (or float32 where the backend accepts float32 outputs). */
static flashc_status check_like(const flashc_tensor *t, named_span *ns, const flashc_tensor *like,
                                const char *like_name, flashc_dtype dtype, int allow_f32)
{
    TRY(check_tensor4(t, ns->name, ns->is_output, &ns->sp));
    TRY(check_dtype(t, ns->name, dtype, allow_f32));
    return check_same_shape(t, ns->name, like, like_name);
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

flashc_status flashc_forward(flashc_backend *backend, const flashc_params *params,
                             const flashc_tensor *q, const flashc_tensor *k,
                             const flashc_tensor *v, flashc_tensor *out, flashc_tensor *lse)
{
    TRY(check_backend(backend));
    flashc_params p;
    TRY(check_params(params, &p));
    int f32_ok = backend->ops->accepts_f32_outputs;
    named_span s[5] = {{"q", {0, 0}, 0}, {"k", {0, 0}, 0}, {"v", {0, 0}, 0},
                       {"out", {0, 0}, 1}, {"lse", {0, 0}, 1}};
    const flashc_tensor *views[5] = {q, k, v, out, lse};
    for (int i = 0; i < 5; i++)
        s[i].t = views[i];
    TRY(check_q_k_tensors(q, k, &s[0].sp, &s[1].sp));
    TRY(check_like(v, &s[2], k, "k", q->dtype, 0));
    TRY(check_like(out, &s[3], q, "q", q->dtype, f32_ok));
    TRY(check_lse(lse, "lse", 1, q, &s[4].sp));
    TRY(check_aliasing(s, 5));

    flashc_problem pr;
    fill_problem(&pr, &p, q, k, out->dtype);
    TRY(resolve_features(backend, &p, q, k, &pr));
    return backend->ops->forward(backend->state, &pr, q, k, v, out, lse);
}

flashc_status flashc_backward(flashc_backend *backend, const flashc_params *params,
                              const flashc_tensor *dout, const flashc_tensor *q,
                              const flashc_tensor *k, const flashc_tensor *v,
                              const flashc_tensor *out, const flashc_tensor *lse,
                              flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    TRY(check_backend(backend));
    flashc_params p;
    TRY(check_params(params, &p));
    int f32_ok = backend->ops->accepts_f32_outputs;
    named_span s[10] = {{"dout", {0, 0}, 0}, {"q", {0, 0}, 0},  {"k", {0, 0}, 0},
                        {"v", {0, 0}, 0},    {"out", {0, 0}, 0}, {"lse", {0, 0}, 0},
                        {"dq", {0, 0}, 1},   {"dk", {0, 0}, 1},  {"dv", {0, 0}, 1},
                        {"params.workspace", {0, 0}, 1}};
    const flashc_tensor *views[9] = {dout, q, k, v, out, lse, dq, dk, dv};
    for (int i = 0; i < 9; i++)
        s[i].t = views[i];
    TRY(check_q_k_tensors(q, k, &s[1].sp, &s[2].sp));
    TRY(check_like(v, &s[3], k, "k", q->dtype, 0));
    TRY(check_like(dout, &s[0], q, "q", q->dtype, f32_ok));
    TRY(check_like(out, &s[4], q, "q", q->dtype, f32_ok));
    TRY(check_lse(lse, "lse", 0, q, &s[5].sp));
    TRY(check_like(dq, &s[6], q, "q", q->dtype, f32_ok));
    TRY(check_like(dk, &s[7], k, "k", q->dtype, f32_ok));
    TRY(check_like(dv, &s[8], k, "k", q->dtype, f32_ok));
    int n_spans = 9;
    if (p.workspace) { /* the workspace is scratch written by the call: like an output */
        uintptr_t begin = (uintptr_t)p.workspace;
        if (begin + p.workspace_size < begin)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "params.workspace + workspace_size wraps the address space");
        s[9].sp.begin = begin;
        s[9].sp.end = begin + p.workspace_size;
        n_spans = 10;
    }
    TRY(check_aliasing(s, n_spans));

    flashc_problem pr;
    fill_problem(&pr, &p, q, k, dq->dtype);
    TRY(resolve_features(backend, &p, q, k, &pr));
    if (pr.workspace) {
        size_t need = backend->ops->backward_workspace_size(backend->state, &pr);
        if (pr.workspace_size < need)
            return flashc_error(FLASHC_ERROR_WORKSPACE_TOO_SMALL,
                                "params.workspace_size is %zu but this backward needs %zu bytes",
                                pr.workspace_size, need);
    }
    return backend->ops->backward(backend->state, &pr, dout, q, k, v, out, lse, dq, dk, dv);
}

flashc_status flashc_backward_workspace_size(flashc_backend *backend,
                                             const flashc_params *params,
                                             const flashc_tensor *q, const flashc_tensor *k,
                                             size_t *bytes)
{
    if (!bytes)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "bytes: output pointer is NULL");
    TRY(check_backend(backend));
    flashc_params p;
    TRY(check_params(params, &p));
    span sq, sk;
    TRY(check_q_k_tensors(q, k, &sq, &sk));
    flashc_problem pr;
    fill_problem(&pr, &p, q, k, q->dtype);
    TRY(resolve_features(backend, &p, q, k, &pr));
    *bytes = backend->ops->backward_workspace_size(backend->state, &pr);
    return FLASHC_OK;
}
