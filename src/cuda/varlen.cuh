/*
 * varlen.cuh - where one sequence of a variable-length batch lies, for every CUDA kernel
 * (mma.sync and Hopper): its rows in the packed tensors from the device-side prefix sums,
 * and its first row in a backward workspace that pads each sequence to whole query blocks.
 *
 * The offsets live in device memory and the host cannot check them: they are clamped into
 * the packed tensors and made non-decreasing here, so offsets that break their rules give
 * wrong rows, never an access outside the tensors or the workspace.
 */
#ifndef FLASHC_CUDA_VARLEN_CUH
#define FLASHC_CUDA_VARLEN_CUH

#include <stdint.h>

static __device__ __forceinline__ int fc_varlen_clamp(int x, int lo, int hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Sequence b: query rows [*q0, *q0 + *nq) of total_q packed rows, key rows [*k0, *k0 + *nk)
 * of total_k. */
static __device__ __forceinline__ void fc_varlen_rows(const int32_t *cu_q, const int32_t *cu_k, int b,
                                                      int total_q, int total_k, int *q0, int *nq, int *k0,
                                                      int *nk)
{
    *q0 = fc_varlen_clamp(cu_q[b], 0, total_q);
    *nq = fc_varlen_clamp(cu_q[b + 1], *q0, total_q) - *q0;
    *k0 = fc_varlen_clamp(cu_k[b], 0, total_k);
    *nk = fc_varlen_clamp(cu_k[b + 1], *k0, total_k) - *k0;
}

/* Rows a varlen backward workspace holds per head: the packed queries with every sequence
 * padded as fc_varlen_ws_start places it. */
#define FC_VARLEN_WS_ROWS(total_q, num_seqs) \
    (((int64_t)(total_q) + 128 * (int64_t)(num_seqs) + 127) / 128 * 128)

/* First workspace row of sequence b (its packed rows start at q0): a multiple of 128 at least
 * 128 rows past the previous sequence's start plus its length, so a sequence's query blocks
 * padded to 128 rows (or 64) never reach the next one's, and their rows stay 16-byte aligned. */
static __device__ __forceinline__ int64_t fc_varlen_ws_start(int q0, int b)
{
    return ((int64_t)q0 + 128 * (int64_t)b) / 128 * 128;
}

/* The same for 80-row query blocks (the Hopper backward's plain kernels): sequence b starts
 * at a multiple of 4 rows (16-byte aligned fp32 vectors) at least 81 rows past the previous
 * sequence's start plus its length, so its blocks padded to 80 rows never reach the next
 * sequence's; the rows per head are a whole number of 80-row blocks. */
#define FC_VARLEN_WS_ROWS80(total_q, num_seqs) (((int64_t)(total_q) + 84 * (int64_t)(num_seqs) + 79) / 80 * 80)

static __device__ __forceinline__ int64_t fc_varlen_ws_start80(int q0, int b)
{
    return ((int64_t)q0 + 84 * (int64_t)b) / 4 * 4;
}

#endif /* FLASHC_CUDA_VARLEN_CUH */
