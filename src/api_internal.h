/*
 * api_internal.h - what the public entry points share: the backend handle and the argument
 * checks (sizes, strides, extents, self-overlap, aliasing), used by api.c for attention and
 * by merge.c for the LSE merge, so that both validate tensors the same way and name the
 * argument in the same words.
 *
 * Header-only (static inline) on purpose: the checks stay private to the library's
 * translation units instead of becoming global symbols of the static library.
 */
#ifndef FLASHC_API_INTERNAL_H
#define FLASHC_API_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"

struct flashc_backend {
    const flashc_backend_ops *ops;
    void *state;
    char description[256];
};

static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};
static const char *const lse_dim_names[3] = {"batch", "heads", "seqlen_q"};

/* Largest size of one dimension: keeps every index product far from int64 overflow. */
#define MAX_DIM_SIZE ((int64_t)INT32_MAX)

/* Largest element count of one tensor's logical shape (2^40), whatever its strides: a
 * broadcast (stride 0) view may be small in memory but a backend's scratch and packed copies
 * grow with the logical shape, and this bound keeps all of their sizes far from overflow. */
#define MAX_TENSOR_ELEMENTS ((int64_t)1 << 40)

/* Byte range [begin, end) a view touches. Filled once its sizes are known to be safe. */
typedef struct span {
    uintptr_t begin, end;
} span;

/* Checks sizes, strides and that the view's extent neither overflows nor wraps the address
 * space; fills the byte span. ndim dims of t are used. */
static inline flashc_status check_extent(const flashc_tensor *t, const char *name, int ndim,
                                         const char *const *names, span *sp)
{
    size_t esize = flashc_dtype_size(t->dtype);
    int64_t last = 0; /* offset of the last element */
    for (int d = 0; d < ndim; d++) {
        if (t->shape[d] < 1 || t->shape[d] > MAX_DIM_SIZE)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "%s: shape[%d] (%s) is %lld; each size must be in 1..%lld", name,
                                d, names[d], (long long)t->shape[d], (long long)MAX_DIM_SIZE);
        if (t->stride[d] < 0)
            return flashc_error(FLASHC_ERROR_INVALID_STRIDE,
                                "%s: stride[%d] (%s) is %lld; strides must be >= 0", name, d,
                                names[d], (long long)t->stride[d]);
        int64_t reach;
        if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &reach) ||
            __builtin_add_overflow(last, reach, &last))
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "%s: shape and strides overflow a 64-bit offset", name);
    }
    int64_t logical = 1;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(logical, t->shape[d], &logical) ||
            logical > MAX_TENSOR_ELEMENTS)
            return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                                "%s: its shape holds more than 2^40 elements", name);
    int64_t bytes;
    if (__builtin_add_overflow(last, 1, &bytes) ||
        __builtin_mul_overflow(bytes, (int64_t)esize, &bytes) || bytes > (int64_t)PTRDIFF_MAX)
        return flashc_error(FLASHC_ERROR_INVALID_SIZE, "%s: the view's extent overflows", name);
    uintptr_t begin = (uintptr_t)t->data;
    if (begin + (uintptr_t)bytes < begin)
        return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                            "%s: data + extent wraps around the address space", name);
    sp->begin = begin;
    sp->end = begin + (uintptr_t)bytes;
    return FLASHC_OK;
}

/* An output must not write one element twice: sorted by stride, each stride must step past
 * everything the smaller strides reach. */
static inline flashc_status check_no_self_overlap(const flashc_tensor *t, const char *name,
                                                  int ndim)
{
    int order[4];
    int n = 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] > 1)
            order[n++] = d;
    for (int i = 1; i < n; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int64_t reach = 0; /* largest offset the dims so far reach */
    for (int i = 0; i < n; i++) {
        int d = order[i];
        if (t->stride[d] <= reach)
            return flashc_error(FLASHC_ERROR_INVALID_STRIDE,
                                "%s: stride[%d] is %lld, which makes elements of this output "
                                "overlap",
                                name, d, (long long)t->stride[d]);
        reach += (t->shape[d] - 1) * t->stride[d];
    }
    return FLASHC_OK;
}

static inline flashc_status check_common(const flashc_tensor *t, const char *name)
{
    if (!t)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "%s: tensor descriptor is NULL", name);
    if (!t->data)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "%s: data pointer is NULL", name);
    size_t esize = flashc_dtype_size(t->dtype);
    if (esize == 0)
        return flashc_error(FLASHC_ERROR_INVALID_DTYPE, "%s: dtype %d is not a flashc_dtype",
                            name, (int)t->dtype);
    if ((uintptr_t)t->data % esize != 0)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "%s: data pointer %p is not aligned to its %zu-byte elements", name,
                            t->data, esize);
    return FLASHC_OK;
}

/* A [batch, seqlen, heads, head_dim] tensor. */
static inline flashc_status check_tensor4(const flashc_tensor *t, const char *name,
                                          int is_output, span *sp)
{
    flashc_status st = check_common(t, name);
    if (st != FLASHC_OK)
        return st;
    if (t->ndim != 4)
        return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                            "%s: ndim is %d; attention tensors are 4-d [batch, seqlen, heads, "
                            "head_dim]",
                            name, (int)t->ndim);
    if (t->shape[3] < 1 || t->shape[3] > FLASHC_MAX_HEAD_DIM)
        return flashc_error(FLASHC_ERROR_INVALID_HEAD_DIM,
                            "%s: head_dim (shape[3]) is %lld; it must be in 1..%d", name,
                            (long long)t->shape[3], FLASHC_MAX_HEAD_DIM);
    if (t->stride[3] != 1)
        return flashc_error(FLASHC_ERROR_INVALID_STRIDE,
                            "%s: stride[3] is %lld; the head_dim dimension must be contiguous "
                            "(stride 1)",
                            name, (long long)t->stride[3]);
    st = check_extent(t, name, 4, dim_names, sp);
    if (st == FLASHC_OK && is_output)
        st = check_no_self_overlap(t, name, 4);
    return st;
}

/* A [batch, heads, seqlen] float32 LSE whose shape follows the 4-d tensor like
 * ([batch, seqlen, heads, ...]); like_name names it in messages. */
static inline flashc_status check_lse_like(const flashc_tensor *t, const char *name,
                                           int is_output, const flashc_tensor *like,
                                           const char *like_name, span *sp)
{
    flashc_status st = check_common(t, name);
    if (st != FLASHC_OK)
        return st;
    if (t->dtype != FLASHC_F32)
        return flashc_error(FLASHC_ERROR_DTYPE_MISMATCH, "%s: dtype must be FLASHC_F32", name);
    if (t->ndim != 3)
        return flashc_error(FLASHC_ERROR_INVALID_SIZE,
                            "%s: ndim is %d; lse is 3-d [batch, heads_q, seqlen_q]", name,
                            (int)t->ndim);
    st = check_extent(t, name, 3, lse_dim_names, sp);
    if (st != FLASHC_OK)
        return st;
    const int64_t want[3] = {like->shape[0], like->shape[2], like->shape[1]};
    for (int d = 0; d < 3; d++)
        if (t->shape[d] != want[d])
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "%s: shape[%d] (%s) is %lld but %s gives %lld", name, d,
                                lse_dim_names[d], (long long)t->shape[d], like_name,
                                (long long)want[d]);
    return is_output ? check_no_self_overlap(t, name, 3) : FLASHC_OK;
}

/* The [batch, heads_q, seqlen_q] float32 LSE of an attention call. */
static inline flashc_status check_lse(const flashc_tensor *t, const char *name, int is_output,
                                      const flashc_tensor *q, span *sp)
{
    return check_lse_like(t, name, is_output, q, "q", sp);
}

static inline flashc_status check_same_shape(const flashc_tensor *t, const char *name,
                                             const flashc_tensor *like, const char *like_name)
{
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != like->shape[d])
            return flashc_error(FLASHC_ERROR_SHAPE_MISMATCH,
                                "%s: shape[%d] (%s) is %lld but %s has %lld", name, d,
                                dim_names[d], (long long)t->shape[d], like_name,
                                (long long)like->shape[d]);
    return FLASHC_OK;
}

typedef struct named_span {
    const char *name;
    span sp;
    int is_output;
    const flashc_tensor *t; /* the view, for the exact test; NULL for raw ranges */
} named_span;

/* Whether element offset delta is a difference of two indices of the view: some c with
 * |c[d]| < shape[d] and sum c[d] * stride[d] == delta. dims are sorted by decreasing stride
 * and each stride exceeds the reach of the smaller ones (the view does not overlap itself),
 * so at each dim only the two multiples around delta / stride can lead to a solution. */
static inline int offset_reachable(const int64_t *shape, const int64_t *stride, int n,
                                   int64_t delta)
{
    if (n == 0)
        return delta == 0;
    int64_t lo = delta / stride[0] - 1, hi = delta / stride[0] + 1;
    for (int64_t c = lo; c <= hi; c++)
        if (c > -shape[0] && c < shape[0] &&
            offset_reachable(shape + 1, stride + 1, n - 1, delta - c * stride[0]))
            return 1;
    return 0;
}

/* Exact test for two views of one layout (same dtype, shape and strides, as packed q/k/v
 * or dq/dk/dv buffers are): they share an element iff their offset is reachable. Returns -1
 * when the layouts differ or the view could overlap itself (the caller then compares byte
 * ranges). */
static inline int same_layout_views_overlap(const flashc_tensor *a, const flashc_tensor *b)
{
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || a->ndim < 1 || a->ndim > 4)
        return -1;
    int64_t shape[4], stride[4];
    int n = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d])
            return -1;
        if (a->shape[d] > 1) {
            int k = n++;
            while (k > 0 && stride[k - 1] < a->stride[d]) { /* insert, decreasing stride */
                shape[k] = shape[k - 1];
                stride[k] = stride[k - 1];
                k--;
            }
            shape[k] = a->shape[d];
            stride[k] = a->stride[d];
        }
    }
    int64_t reach = 0;
    for (int k = n - 1; k >= 0; k--) {
        if (stride[k] <= reach)
            return -1;
        reach += (shape[k] - 1) * stride[k];
    }
    size_t esize = flashc_dtype_size(a->dtype);
    intptr_t bytes = (intptr_t)((uintptr_t)b->data - (uintptr_t)a->data);
    if (bytes % (intptr_t)esize != 0)
        return -1;
    return offset_reachable(shape, stride, n, (int64_t)(bytes / (intptr_t)esize));
}

/* Each output's elements must be disjoint from every other tensor's: byte ranges that do
 * not meet are disjoint; ranges that meet are tested element by element when both views
 * have one layout (interleaved q/k/v or dq/dk/dv of a packed buffer). */
static inline flashc_status check_aliasing(const named_span *spans, int n)
{
    for (int i = 0; i < n; i++) {
        if (!spans[i].is_output)
            continue;
        for (int j = 0; j < n; j++) {
            if (j == i || (spans[j].is_output && j < i))
                continue;
            if (spans[i].sp.begin < spans[j].sp.end && spans[j].sp.begin < spans[i].sp.end &&
                same_layout_views_overlap(spans[i].t, spans[j].t) != 0)
                return flashc_error(FLASHC_ERROR_ALIASING,
                                    "%s: output memory overlaps %s %s", spans[i].name,
                                    spans[j].is_output ? "output" : "input", spans[j].name);
        }
    }
    return FLASHC_OK;
}

#define TRY(expr)                                                                            \
    do {                                                                                     \
        flashc_status try_status_ = (expr);                                                  \
        if (try_status_ != FLASHC_OK)                                                        \
            return try_status_;                                                              \
    } while (0)

static inline flashc_status check_backend(const flashc_backend *backend)
{
    if (!backend)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "backend: handle is NULL (create one with flashc_backend_create)");
    return FLASHC_OK;
}

/* Copies a caller's struct of struct_size bytes into a defaulted one of ours: an older,
 * shorter struct keeps our defaults for the fields it lacks; a newer, longer one is
 * accepted only if the fields we do not know are zero (so that nothing is silently ignored). */
static inline flashc_status copy_versioned(void *dst, size_t dst_size, const void *src,
                                           size_t src_size, const char *what,
                                           const char *init_fn)
{
    /* a real struct of a later version stays far below 4 KiB; a larger size is garbage, and
     * scanning that many bytes of the caller's memory could fault */
    if (src_size < sizeof(size_t) || src_size > 4096)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "%s.struct_size is %zu: initialize %s with %s()", what, src_size,
                            what, init_fn);
    if (src_size > dst_size) {
        const unsigned char *extra = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < src_size - dst_size; i++)
            if (extra[i] != 0)
                return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                                    "%s: set fields that this version (%s) of flashc does "
                                    "not know (struct_size %zu > %zu)",
                                    what, FLASHC_VERSION_STRING, src_size, dst_size);
        src_size = dst_size;
    }
    memcpy(dst, src, src_size);
    return FLASHC_OK;
}

/* The flashc_params every attention entry point reads: the caller's struct copied over the
 * defaults (see copy_versioned), then the ranges every entry point shares. */
static inline flashc_status check_shared_params(const flashc_params *user, flashc_params *p)
{
    flashc_params_init(p);
    if (user) {
        flashc_status st = copy_versioned(p, sizeof *p, user, user->struct_size, "params",
                                          "flashc_params_init");
        if (st != FLASHC_OK)
            return st;
    }
    if (!isfinite(p->softmax_scale))
        return flashc_error(FLASHC_ERROR_INVALID_PARAM, "params.softmax_scale is not finite");
    if (p->causal != FLASHC_CAUSAL_NONE && p->causal != FLASHC_CAUSAL_BOTTOM_RIGHT &&
        p->causal != FLASHC_CAUSAL_TOP_LEFT)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.causal is %d: use FLASHC_CAUSAL_NONE, _BOTTOM_RIGHT or "
                            "_TOP_LEFT",
                            (int)p->causal);
    if (p->window_left < -1 || p->window_right < -1)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.window_left/window_right is %d/%d: each must be >= -1 "
                            "(-1 = unbounded)",
                            (int)p->window_left, (int)p->window_right);
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.softcap must be a finite value >= 0 (0 = off)");
    if (p->alibi_slopes_batch_stride < 0)
        return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                            "params.alibi_slopes_batch_stride is %lld: use 0 (slopes shared by "
                            "the batch) or a positive stride",
                            (long long)p->alibi_slopes_batch_stride);
    if (p->alibi_slopes_batch_stride > 0 && !p->alibi_slopes)
        return flashc_error(FLASHC_ERROR_NULL_POINTER,
                            "params.alibi_slopes is NULL but params.alibi_slopes_batch_stride "
                            "is set");
    return FLASHC_OK;
}

#endif /* FLASHC_API_INTERNAL_H */
