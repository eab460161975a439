/*
 * fwd_sm90.h - the host entry of the Hopper (sm_90a) attention forward: warp-specialized,
 * TMA + mbarrier pipeline, wgmma tensor-core GEMMs (fwd_sm90.cu describes the kernel).
 *
 * Plain C, so that the backend's dispatcher can call it beside the mma.sync launcher: it
 * asks fc_sm90_forward_supported first and falls back to the mma.sync path on 0. The
 * arguments mirror the mma.sync forward's (element strides of batch, seqlen, heads; the head
 * dim contiguous), with the causal mode given as a flashc_causal value so that the mask
 * follows flashc_key_end exactly.
 */
#ifndef FLASHC_CUDA_FWD_SM90_H
#define FLASHC_CUDA_FWD_SM90_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fc_sm90_fwd_args {
    const void *q, *k, *v; /* fp16 or bf16, [batch, seqlen, heads, head_dim] views */
    void *o;               /* same dtype, [batch, seqlen_q, heads_q, head_dim] */
    float *lse;            /* [batch, heads_q, seqlen_q], natural log */
    /* element strides of dims batch, seqlen, heads */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t lse_sb, lse_sh, lse_ss;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int bf16;    /* 1: bf16, 0: fp16 */
    float scale; /* softmax scale, > 0 */
    int causal;  /* a flashc_causal: 0 none, 1 bottom-right, 2 top-left */
    /* The features of flashc.h (its "mask and score" comment defines them). All off when the
     * struct is zeroed, so a caller that does not know them gets plain attention. */
    int window;                    /* nonzero: window_left / window_right apply */
    int64_t window_left;           /* keys before the diagonal a query sees; -1 = unbounded */
    int64_t window_right;          /* keys after the diagonal; -1 = unbounded */
    float softcap;                 /* logit softcap: softcap * tanh(x / softcap); 0 = off */
    const float *alibi_slopes;     /* device floats, NULL = off: slope of (b, h) at
                                      alibi_slopes[b * alibi_batch_stride + h] */
    int64_t alibi_batch_stride;    /* 0: one [heads_q] set for every batch */
    /* Variable-length batches (flashc.h): NULL = fixed lengths. Otherwise batch is 1, the
     * seqlens are the packed totals, and sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
     * of q / o / lse against [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k / v (device int32,
     * num_seqs + 1 each); max_seqlen_q bounds the sequences' query lengths (the tiles). */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int num_seqs, max_seqlen_q, max_seqlen_k;
    /* Dropout on P (flashc.h's flashc_dropout_keep): off while dropout_p is 0. */
    float dropout_p;            /* in [0, 1) */
    uint32_t dropout_threshold; /* keep when the Philox draw >= this */
    uint64_t dropout_seed, dropout_offset;
} fc_sm90_fwd_args;

/* 1 when fc_sm90_forward serves this call on a device of compute capability
 * sm_major.sm_minor whose per-block shared-memory opt-in limit is smem_optin; 0 otherwise
 * (head dim not served, scale <= 0, rows not 16-byte aligned, not sm_90, ...). */
int fc_sm90_forward_supported(const fc_sm90_fwd_args *a, int sm_major, int sm_minor,
                              size_t smem_optin);

/* The compiled head dim (64, 128 or 256) that serves head_dim; 0 when none does (head dims
 * up to 32, above 256, or not a multiple of 8). */
int fc_sm90_kernel_head_dim(int head_dim);

/* Dynamic shared memory the kernel for head_dim uses (0 if none is compiled for it). */
size_t fc_sm90_forward_smem_bytes(int head_dim);

/* Launches the forward on stream; returns the CUDA error of the launch (or of building the
 * tensor maps: cudaErrorInvalidValue when the driver rejects one). Only calls that
 * fc_sm90_forward_supported accepted are valid. */
cudaError_t fc_sm90_forward(const fc_sm90_fwd_args *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_FWD_SM90_H */
