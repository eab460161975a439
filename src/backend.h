/*
 * backend.h - the interface between the validating front end (api.c) and the backends
 * (reference, CPU, CUDA). api.c checks every argument and reduces the call to a
 * flashc_problem; a backend receives only calls that already passed validation.
 */
#ifndef FLASHC_BACKEND_H
#define FLASHC_BACKEND_H

#include "flashc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated call: sizes, dtype, the resolved scale and the mask rule. */
typedef struct flashc_problem {
    int64_t batch;
    int64_t seqlen_q;
    int64_t seqlen_k;
    int64_t heads_q;
    int64_t heads_kv;
    int64_t head_dim;
    flashc_dtype dtype;     /* of q, k, v (and dout) */
    flashc_dtype out_dtype; /* of out (forward) or dq/dk/dv (backward); == dtype except where a
                               backend accepts float32 outputs (the reference) */
    float scale;            /* resolved: never 0 */
    int32_t causal;         /* a flashc_causal */
    int32_t deterministic;
    void *stream;
    void *workspace;
    size_t workspace_size;
} flashc_problem;

/* Offset added to a query index to get the last key it sees under the causal rule:
 * query i sees key j when j <= i + causal_offset. */
static inline int64_t flashc_causal_offset(const flashc_problem *pr)
{
    return pr->causal == FLASHC_CAUSAL_BOTTOM_RIGHT ? pr->seqlen_k - pr->seqlen_q : 0;
}

/* One past the last key that query i sees: seqlen_k when not causal, clamped to [0, seqlen_k]. */
static inline int64_t flashc_key_end(const flashc_problem *pr, int64_t i)
{
    if (pr->causal == FLASHC_CAUSAL_NONE)
        return pr->seqlen_k;
    int64_t end = i + flashc_causal_offset(pr) + 1;
    return end < 0 ? 0 : (end > pr->seqlen_k ? pr->seqlen_k : end);
}

struct flashc_merge_problem; /* defined with the LSE merge, at the end of this file */

/* What a backend provides. Function pointers never see invalid arguments. */
typedef struct flashc_backend_ops {
    const char *name;
    int uses_device_memory;   /* tensors are device pointers */
    int accepts_f32_outputs;  /* out/dq/dk/dv may be FLASHC_F32 whatever the input dtype */
    int (*available)(void);   /* 1 if usable on this machine */
    flashc_status (*create)(const flashc_backend_config *cfg, void **state);
    void (*destroy)(void *state);
    /* Fills buf (size bytes) with a one-line description. */
    void (*describe)(void *state, char *buf, size_t size);
    flashc_status (*forward)(void *state, const flashc_problem *pr, const flashc_tensor *q,
                             const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *out,
                             flashc_tensor *lse);
    flashc_status (*backward)(void *state, const flashc_problem *pr, const flashc_tensor *dout,
                              const flashc_tensor *q, const flashc_tensor *k,
                              const flashc_tensor *v, const flashc_tensor *out,
                              const flashc_tensor *lse, flashc_tensor *dq, flashc_tensor *dk,
                              flashc_tensor *dv);
    size_t (*backward_workspace_size)(void *state, const flashc_problem *pr);
    /* Memory of the backend's kind. NULL for host backends: api.c then uses the C library.
     * All four are set or none. */
    flashc_status (*malloc_fn)(void *state, size_t bytes, void **ptr);
    void (*free_fn)(void *state, void *ptr);
    flashc_status (*memcpy_fn)(void *state, void *dst, const void *src, size_t bytes,
                               flashc_copy_kind kind);
    flashc_status (*synchronize_fn)(void *state, void *stream);
    /* Optional: the LSE merge (flashc_merge, flashc_merge_accumulate; see
     * flashc_merge_problem below). NULL: a host-memory backend gets merge.c's host loop, a
     * device backend answers FLASHC_ERROR_UNSUPPORTED. */
    flashc_status (*merge)(void *state, const struct flashc_merge_problem *pr,
                           const flashc_tensor *outs, const flashc_tensor *lses,
                           flashc_tensor *out, flashc_tensor *lse);
} flashc_backend_ops;

extern const flashc_backend_ops flashc_reference_backend_ops;
extern const flashc_backend_ops flashc_cpu_backend_ops;
#ifdef FLASHC_HAVE_CUDA
extern const flashc_backend_ops flashc_cuda_backend_ops;
#endif

/* Records a detailed message for the calling thread's flashc_last_error() and returns status,
 * so that a backend can write: return flashc_error(FLASHC_ERROR_DEVICE, "cuda: %s", msg); */
flashc_status flashc_error(flashc_status status, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- LSE merge (merge.c) ---------------------------------------------------------------- */

/* A validated merge: n_parts parts of [batch, seqlen, heads, head_dim] out and
 * [batch, heads, seqlen] float32 LSE, each tensor with its own dtype. When in_place is set
 * (flashc_merge_accumulate), out and lse are the very views outs[0] and lses[0]: a backend
 * must read every input of a row before it writes that row. */
typedef struct flashc_merge_problem {
    int64_t batch;
    int64_t seqlen;
    int64_t heads;
    int64_t head_dim;
    int32_t n_parts;
    int32_t in_place;
    void *stream;
} flashc_merge_problem;

/* The host loop, for backends whose tensors live in host memory. */
flashc_status flashc_host_merge(void *state, const flashc_merge_problem *pr,
                                const flashc_tensor *outs, const flashc_tensor *lses,
                                flashc_tensor *out, flashc_tensor *lse);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_BACKEND_H */
