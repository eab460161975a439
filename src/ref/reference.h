/*
 * reference.h - the float64 reference: attention computed the straightforward O(N^2) way,
 * every product and sum in double. The truth the fast backends are measured against.
 */
#ifndef FLASHC_REFERENCE_H
#define FLASHC_REFERENCE_H

#include "backend.h"

/* Forward in float64. out: contiguous [B, Nq, Hq, D]; lse: contiguous [B, Hq, Nq]. Either may
 * be NULL. Returns FLASHC_ERROR_OUT_OF_MEMORY if scratch cannot be allocated. */
flashc_status flashc_ref_forward_f64(const flashc_problem *pr, const flashc_tensor *q,
                                     const flashc_tensor *k, const flashc_tensor *v, double *out,
                                     double *lse);

/* Backward in float64: the exact gradients of the forward function, P and
 * delta = rowsum(dO * O) recomputed from q, k, v (the caller's out and lse are not used).
 * dq: contiguous [B, Nq, Hq, D]; dk, dv: contiguous [B, Nk, Hkv, D]. */
flashc_status flashc_ref_backward_f64(const flashc_problem *pr, const flashc_tensor *dout,
                                      const flashc_tensor *q, const flashc_tensor *k,
                                      const flashc_tensor *v, double *dq, double *dk, double *dv);

#endif /* FLASHC_REFERENCE_H */
