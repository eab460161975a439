/*
 * merge.c - flashc_merge and flashc_merge_accumulate: partial attention results over
 * disjoint key sets combined through their log-sum-exp, with the same argument checks as
 * the attention entry points, and the host loop that the CPU and reference backends run.
 *
 * Per row (b, s, h), with m = max_i lse_i:
 *     w_i = exp(lse_i - m)   s = sum_i w_i   lse = m + log(s)   out = sum_i (w_i / s) out_i
 * Subtracting the max keeps every exponent <= 0, so nothing overflows; parts at -inf are
 * skipped rather than weighted by 0, so a masked part's out (possibly garbage, possibly NaN
 * in an uninitialized accumulator) never reaches the result.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "api_internal.h"
#include "dtype.h"

/* ---------------------------------------------------------------------------------------- */
/* Host loop                                                                                */
/* ---------------------------------------------------------------------------------------- */

flashc_status flashc_host_merge(void *state, const flashc_merge_problem *pr,
                                const flashc_tensor *outs, const flashc_tensor *lses,
                                flashc_tensor *out, flashc_tensor *lse)
{
    (void)state;
    const int32_t n = pr->n_parts;
    const int64_t d = pr->head_dim;
    /* per-part weights of one row; parts beyond the stack buffer need the heap, allocated
     * before anything is written so that a failure leaves the outputs untouched */
    float w_stack[16];
    float *w = w_stack;
    if (n > 16) {
        w = (float *)malloc((size_t)n * sizeof *w);
        if (!w)
            return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "merge: out of memory for %d parts",
                                (int)n);
    }
    float acc[FLASHC_MAX_HEAD_DIM], row[FLASHC_MAX_HEAD_DIM];
    for (int64_t b = 0; b < pr->batch; b++)
        for (int64_t h = 0; h < pr->heads; h++)
            for (int64_t s = 0; s < pr->seqlen; s++) {
                float m = -INFINITY;
                for (int32_t i = 0; i < n; i++) {
                    float l = *flashc_lse_ptr(&lses[i], b, h, s);
                    w[i] = l;
                    if (l > m || isnan(l))
                        m = l;
                }
                float *lse_out = flashc_lse_ptr(lse, b, h, s);
                void *out_row = flashc_row_ptr(out, b, s, h);
                if (m == -INFINITY) { /* every key of every part masked */
                    for (int64_t j = 0; j < d; j++)
                        acc[j] = 0.0f;
                    flashc_store_row(out_row, acc, out->dtype, d);
                    *lse_out = -INFINITY;
                    continue;
                }
                float sum = 0.0f;
                for (int32_t i = 0; i < n; i++) {
                    w[i] = w[i] == -INFINITY ? 0.0f : expf(w[i] - m);
                    sum += w[i];
                }
                float inv = 1.0f / sum;
                for (int64_t j = 0; j < d; j++)
                    acc[j] = 0.0f;
                for (int32_t i = 0; i < n; i++) {
                    if (w[i] == 0.0f) /* -inf, or so far below the max that it adds nothing */
                        continue;
                    float wi = w[i] * inv;
                    flashc_load_row(row, flashc_row_ptr(&outs[i], b, s, h), outs[i].dtype, d);
                    for (int64_t j = 0; j < d; j++)
                        acc[j] += wi * row[j];
                }
                /* in place, out_row is outs[0]'s row: it was read above, before this write */
                flashc_store_row(out_row, acc, out->dtype, d);
                *lse_out = m + logf(sum);
            }
    if (w != w_stack)
        free(w);
    return FLASHC_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* The part's out and lse against the result's shape. */
static flashc_status check_part(const flashc_tensor *po, const char *po_name,
                                const flashc_tensor *pl, const char *pl_name,
                                const flashc_tensor *out, const char *out_name, span *so,
                                span *sl)
{
    TRY(check_tensor4(po, po_name, 0, so));
    TRY(check_same_shape(po, po_name, out, out_name));
    return check_lse_like(pl, pl_name, 0, out, out_name, sl);
}

static flashc_status dispatch(flashc_backend *backend, const flashc_merge_problem *pr,
                              const flashc_tensor *outs, const flashc_tensor *lses,
                              flashc_tensor *out, flashc_tensor *lse)
{
    const flashc_backend_ops *ops = backend->ops;
    if (ops->merge)
        return ops->merge(backend->state, pr, outs, lses, out, lse);
    if (!ops->uses_device_memory)
        return flashc_host_merge(backend->state, pr, outs, lses, out, lse);
    return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                        "backend: '%s' does not implement the LSE merge in this version",
                        ops->name);
}

static void fill_merge_problem(flashc_merge_problem *pr, const flashc_tensor *out, int32_t n,
                               int in_place, void *stream)
{
    memset(pr, 0, sizeof *pr);
    pr->batch = out->shape[0];
    pr->seqlen = out->shape[1];
    pr->heads = out->shape[2];
    pr->head_dim = out->shape[3];
    pr->n_parts = n;
    pr->in_place = in_place;
    pr->stream = stream;
}

flashc_status flashc_merge(flashc_backend *backend, void *stream, int32_t n,
                           const flashc_tensor *outs, const flashc_tensor *lses,
                           flashc_tensor *out, flashc_tensor *lse)
{
    TRY(check_backend(backend));
    if (n < 1)
        return flashc_error(FLASHC_ERROR_INVALID_SIZE, "n: %d parts; merge at least one",
                            (int)n);
    if (!outs)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "outs: array of %d tensors is NULL",
                            (int)n);
    if (!lses)
        return flashc_error(FLASHC_ERROR_NULL_POINTER, "lses: array of %d tensors is NULL",
                            (int)n);
    /* out, lse, then one part at a time: the spans of the two outputs are checked against
     * each part, so no array of 2n spans is needed */
    named_span s[4] = {{"out", {0, 0}, 1}, {"lse", {0, 0}, 1}, {NULL, {0, 0}, 0},
                       {NULL, {0, 0}, 0}};
    TRY(check_tensor4(out, "out", 1, &s[0].sp));
    TRY(check_lse_like(lse, "lse", 1, out, "out", &s[1].sp));
    TRY(check_aliasing(s, 2));
    for (int32_t i = 0; i < n; i++) {
        char on[32], ln[32];
        snprintf(on, sizeof on, "outs[%d]", (int)i);
        snprintf(ln, sizeof ln, "lses[%d]", (int)i);
        s[2].name = on;
        s[3].name = ln;
        TRY(check_part(&outs[i], on, &lses[i], ln, out, "out", &s[2].sp, &s[3].sp));
        TRY(check_aliasing(s, 4));
    }
    flashc_merge_problem pr;
    fill_merge_problem(&pr, out, n, 0, stream);
    return dispatch(backend, &pr, outs, lses, out, lse);
}

flashc_status flashc_merge_accumulate(flashc_backend *backend, void *stream,
                                      flashc_tensor *acc_out, flashc_tensor *acc_lse,
                                      const flashc_tensor *part_out,
                                      const flashc_tensor *part_lse)
{
    TRY(check_backend(backend));
    named_span s[4] = {{"acc_out", {0, 0}, 1}, {"acc_lse", {0, 0}, 1},
                       {"part_out", {0, 0}, 0}, {"part_lse", {0, 0}, 0}};
    TRY(check_tensor4(acc_out, "acc_out", 1, &s[0].sp));
    TRY(check_lse_like(acc_lse, "acc_lse", 1, acc_out, "acc_out", &s[1].sp));
    TRY(check_part(part_out, "part_out", part_lse, "part_lse", acc_out, "acc_out", &s[2].sp,
                   &s[3].sp));
    TRY(check_aliasing(s, 4));
    /* the accumulator is part 0 and the destination: the in-place form of the same op */
    const flashc_tensor outs[2] = {*acc_out, *part_out};
    const flashc_tensor lses[2] = {*acc_lse, *part_lse};
    flashc_merge_problem pr;
    fill_merge_problem(&pr, acc_out, 2, 1, stream);
    return dispatch(backend, &pr, outs, lses, acc_out, acc_lse);
}
