/*
 * ring_common.h - what the MPI and NCCL ring paths share: argument checks (the core's own,
 * from api_internal.h), the descriptor compared across ranks, the zig-zag split, the plan
 * of flashc calls for one (query rows, key block) pair under the causal rule, and the
 * calling thread's error message.
 */
#ifndef FLASHC_RING_COMMON_H
#define FLASHC_RING_COMMON_H

/* The core's checks report through flashc_error, which libflashc does not export: inside
 * the ring library the same calls set the ring's own message instead. */
#define flashc_error flashc_ring_error_
#include "api_internal.h"
#undef flashc_error

#include "flashc_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RING_TRY(expr)                                                                       \
    do {                                                                                     \
        flashc_status ring_try_ = (expr);                                                    \
        if (ring_try_ != FLASHC_OK)                                                          \
            return ring_try_;                                                                \
    } while (0)

/* Sets the ring's message for flashc_ring_last_error() and returns status. */
flashc_status flashc_ring_error_(flashc_status status, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A failed flashc call: the ring's message becomes "<where>: <flashc_last_error()>". */
flashc_status ring_flashc_failed(flashc_status status, const char *where);

/* What every rank must agree on, exchanged before any data moves. */
typedef struct ring_desc {
    int64_t seqlen, batch, n_local, heads_q, heads_kv, head_dim;
    int32_t dtype, causal;
    float scale, softcap;
    int32_t status; /* FLASHC_OK if this rank's own checks passed */
    int32_t deterministic;
} ring_desc;

/* This rank's checks. backward: dout, out and lse are inputs, dq/dk/dv outputs. Fills the
 * descriptor and the params the block calls use (workspace cleared). */
flashc_status ring_check_forward(flashc_backend *be, const flashc_params *user, int64_t seqlen,
                                 const flashc_tensor *q, const flashc_tensor *k,
                                 const flashc_tensor *v, const flashc_tensor *out,
                                 const flashc_tensor *lse, flashc_params *p, ring_desc *d);
flashc_status ring_check_backward(flashc_backend *be, const flashc_params *user,
                                  int64_t seqlen, const flashc_tensor *dout,
                                  const flashc_tensor *q, const flashc_tensor *k,
                                  const flashc_tensor *v, const flashc_tensor *out,
                                  const flashc_tensor *lse, const flashc_tensor *dq,
                                  const flashc_tensor *dk, const flashc_tensor *dv,
                                  flashc_params *p, ring_desc *d);

/* The descriptors of all ranks (all[world]) against each other and the split rule; a rank
 * whose own checks failed makes every other rank fail too. */
flashc_status ring_check_all(const ring_desc *all, int32_t world, int32_t rank);

/* Global rows of a rank's local tensor: one or two ranges, back to back locally. */
typedef struct ring_rows {
    int32_t n;
    int64_t start[2], len[2];
} ring_rows;

/* Rows of rank j: the zig-zag ranges when causal, else one range (positions unused). */
ring_rows ring_rows_of(const ring_desc *all, int32_t world, int32_t j);

/* One flashc call of a step: local query rows [q0, q0+nq) against rows [k0, k0+nk) of the
 * block, with flashc's causal mode (bottom-right alignment expresses each diagonal band). */
typedef struct ring_call {
    int64_t q0, nq, k0, nk;
    int32_t causal;
} ring_call;

#define RING_MAX_CALLS 16

/* The calls that attend queries qr to the key block kr: every visible (query, key) pair
 * exactly once, fully masked pairs skipped, adjacent full pairs fused into one call. */
int ring_plan(int32_t causal, const ring_rows *qr, const ring_rows *kr, ring_call *calls);

/* Rows [a, a+n) of a [batch, seqlen, heads, dim] view and of a [batch, heads, seqlen] one. */
flashc_tensor ring_seq_rows(const flashc_tensor *t, int64_t a, int64_t n);
flashc_tensor ring_lse_rows(const flashc_tensor *t, int64_t a, int64_t n);

/* Host helpers. dst contiguous float [batch, rows, heads, dim]: rows [r0, r0 + src rows)
 * += src (any dtype, any strides). */
void ring_host_add(float *dst, int64_t rows, int64_t r0, const flashc_tensor *src);
/* Copies a view into contiguous memory of its dtype, and a contiguous float buffer into a
 * view of any dtype (rounded). */
void ring_host_pack(void *dst, const flashc_tensor *src);
void ring_host_store(flashc_tensor *dst, const float *src);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_RING_COMMON_H */
