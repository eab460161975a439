/*
 * flashc_ring.h - context-parallel (ring) attention on top of flashc: one sequence split
 * across the ranks of a communicator the caller owns, for sequences longer than one device
 * or process holds. Link libflashc_ring (built when MPI or NCCL is found) beside libflashc.
 *
 * Each rank holds its rows of Q, K, V (and of dO, O, LSE for the backward). The K/V blocks
 * travel around the ring, rank r sending to r+1 and receiving from r-1; each rank attends
 * its queries to every block as it passes and merges the partial results through their LSE
 * (flashc_merge_accumulate), the next block already in flight while the current one is
 * computed. The backward sends K/V the same way and, one hop behind, the dK/dV accumulated
 * for each block, which arrive back at the block's owner after a full turn; dQ stays local.
 * Every block's backward uses the global O and LSE, so the result is the single-process
 * one up to the order of float32 sums.
 *
 * Which rows a rank holds:
 *   - causal: the zig-zag split, which balances the causal triangle. The sequence is cut
 *     into 2R chunks (chunk c is rows [c*N/(2R), (c+1)*N/(2R)), lengths differ by at most
 *     one when N does not divide), and rank r holds chunk r followed by chunk 2R-1-r, in
 *     that order, as its local rows; flashc_ring_zigzag_rows gives them. Needs N >= 2R.
 *   - not causal: any rows, any number >= 1 per rank (a query attends to every key,
 *     wherever it sits); seqlen is then the sum of the local lengths.
 * The ring is self-attention: queries and keys are the same positions (seqlen_q ==
 * seqlen_k globally, so both causal modes mean j <= i).
 *
 * Tensors are the local rows, laid out as in flashc.h: q, out, dout, dq [batch, n_local,
 * heads_q, head_dim]; k, v, dk, dv [batch, n_local, heads_kv, head_dim]; lse [batch,
 * heads_q, n_local] float32. Every rank must pass the same seqlen, batch, heads, head_dim,
 * dtype and params; they are compared across ranks before any data moves, and a mismatch
 * or a bad argument on any rank makes every rank return an error (no rank is left waiting).
 *
 * params: flashc_params as for flashc_forward; softmax_scale, causal, softcap and
 * deterministic are used; sliding windows, ALiBi, varlen and dropout are position- or
 * call-dependent and answer FLASHC_ERROR_UNSUPPORTED; the workspace fields are ignored.
 * On error, flashc_ring_last_error() says what and where (on which rank, in which step).
 */
#ifndef FLASHC_RING_H
#define FLASHC_RING_H

#include "flashc.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FLASHC_RING_API __attribute__((visibility("default")))
#else
#define FLASHC_RING_API
#endif

/* The local rows of rank `rank` of `world` under the zig-zag split of a sequence of seqlen
 * rows: global rows [start[0], start[0] + len[0]) then [start[1], start[1] + len[1]). */
FLASHC_RING_API void flashc_ring_zigzag_rows(int64_t seqlen, int32_t world, int32_t rank,
                                             int64_t start[2], int64_t len[2]);

/* The detailed message of the calling thread's last failed ring call, "" if none. */
FLASHC_RING_API const char *flashc_ring_last_error(void);

/* ---- CPU processes over MPI (declared when <mpi.h> is included first) ------------------ */
#if defined(MPI_VERSION)
/* backend: a host-memory backend ("cpu" or "reference"). Collective over comm. */
FLASHC_RING_API flashc_status flashc_ring_forward_mpi(MPI_Comm comm, flashc_backend *backend,
                                                      const flashc_params *params,
                                                      int64_t seqlen, const flashc_tensor *q,
                                                      const flashc_tensor *k,
                                                      const flashc_tensor *v,
                                                      flashc_tensor *out, flashc_tensor *lse);

FLASHC_RING_API flashc_status flashc_ring_backward_mpi(
    MPI_Comm comm, flashc_backend *backend, const flashc_params *params, int64_t seqlen,
    const flashc_tensor *dout, const flashc_tensor *q, const flashc_tensor *k,
    const flashc_tensor *v, const flashc_tensor *out, const flashc_tensor *lse,
    flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);
#endif

/* ---- GPUs over NCCL (declared when <nccl.h> is included first) ------------------------- */
#if defined(NCCL_MAJOR)
/* backend: the "cuda" backend; tensors in device memory; the work is queued on stream
 * (compute) and on an internal stream for the transfers, ordered by events; the call
 * returns when the result is complete on stream. Collective over comm. */
FLASHC_RING_API flashc_status flashc_ring_forward_nccl(ncclComm_t comm, cudaStream_t stream,
                                                       flashc_backend *backend,
                                                       const flashc_params *params,
                                                       int64_t seqlen, const flashc_tensor *q,
                                                       const flashc_tensor *k,
                                                       const flashc_tensor *v,
                                                       flashc_tensor *out, flashc_tensor *lse);

FLASHC_RING_API flashc_status flashc_ring_backward_nccl(
    ncclComm_t comm, cudaStream_t stream, flashc_backend *backend, const flashc_params *params,
    int64_t seqlen, const flashc_tensor *dout, const flashc_tensor *q, const flashc_tensor *k,
    const flashc_tensor *v, const flashc_tensor *out, const flashc_tensor *lse,
    flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);
#endif

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_RING_H */
