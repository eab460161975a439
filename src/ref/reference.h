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


/* The decode of flashc_forward_kvcache in float64, as if k_new / v_new (NULL: none) had been
 * appended first, without writing the cache: key j of sequence b is read from k_new / v_new
 * when it is one of b's new keys, or when another sequence appends into the same paged slot,
 * and from the cache otherwise. Each sequence's keys are gathered and handed to
 * flashc_ref_forward_f64. out: contiguous [B, Nq, Hq, D]; lse: contiguous [B, Hq, Nq]. */
flashc_status flashc_ref_forward_kvcache_f64(const flashc_kvcache_problem *pr,
                                             const flashc_tensor *q,
                                             const flashc_tensor *k_cache,
                                             const flashc_tensor *v_cache,
                                             const flashc_tensor *k_new,
                                             const flashc_tensor *v_new, double *out,
                                             double *lse);

#endif /* FLASHC_REFERENCE_H */
