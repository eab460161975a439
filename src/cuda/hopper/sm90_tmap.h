/*
 * sm90_tmap.h - the TMA tensor maps of the Hopper kernels (forward and backward): one 4-D map
 * per [batch, seqlen, heads, head_dim] view with the caller's strides, built on the host.
 */
#ifndef FLASHC_CUDA_SM90_TMAP_H
#define FLASHC_CUDA_SM90_TMAP_H

#include <cuda.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A map {head_dim, seqlen, heads, batch} over a 16-bit view (element strides ss, sh, sb; the
 * head dim contiguous), boxes of 64 columns x box_rows rows, 128-byte swizzle, zeros read
 * outside the tensor. Returns 1, or 0 when the driver's encoder is missing or rejects the
 * view. */
int fc_sm90_encode_map(CUtensorMap *map, const void *ptr, int bf16, int64_t d, int64_t seqlen,
                       int64_t heads, int64_t batch, int64_t ss, int64_t sh, int64_t sb,
                       int box_rows);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_SM90_TMAP_H */
