/*
 * bwd_sm90.h - the host entry of the Hopper (sm_90a) attention backward: a delta pre-pass, a
 * warp-specialized TMA + mbarrier + wgmma main kernel over key blocks, and a dQ conversion
 * pass (bwd_sm90.cu describes them).
 *
 * Plain C like fwd_sm90.h: the caller asks fc_sm90_backward_supported first and falls back to
 * the mma.sync backward on 0. The scratch memory (base-2 LSE, delta = rowsum(dO * O), the fp32
 * dQ accumulator, in deterministic mode the per-block semaphores, and with GQA outside it the
 * fp32 dK and dV of a group split over CTAs) is the caller's:
 * fc_sm90_backward_workspace_size says how much, and nothing is allocated inside.
 */
#ifndef FLASHC_CUDA_BWD_SM90_H
#define FLASHC_CUDA_BWD_SM90_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fc_sm90_bwd_args {
    const void *q, *k, *v; /* fp16 or bf16, [batch, seqlen, heads, head_dim] views */
    const void *o, *dout;  /* same dtype, [batch, seqlen_q, heads_q, head_dim] */
    const float *lse;      /* [batch, heads_q, seqlen_q], natural log, -inf for a row with no key */
    void *dq;              /* same dtype and shape as q */
    void *dk, *dv;         /* same dtype and shape as k and v */
    /* element strides of dims batch, seqlen, heads (head_dim is contiguous) */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
    int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh;
    int64_t dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int64_t lse_sb, lse_sh, lse_ss;
    void *workspace; /* fc_sm90_backward_workspace_size bytes, 256-byte aligned */
    size_t workspace_bytes;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int bf16;          /* 1: bf16, 0: fp16 */
    float scale;       /* softmax scale the forward used */
    int causal;        /* a flashc_causal: 0 none, 1 bottom-right, 2 top-left */
    int deterministic; /* 1: dQ summed in a fixed order, bitwise identical run to run */
    int num_sms;       /* the device's SMs: a GQA group is split over CTAs when its heaviest
                          CTA would outlast the grid's work per SM (0: never split) */
    /* The features of flashc.h, as the forward took them (fwd_sm90.h). All off when the
     * struct is zeroed. */
    int window;                 /* nonzero: window_left / window_right apply */
    int64_t window_left;        /* keys before the diagonal a query sees; -1 = unbounded */
    int64_t window_right;       /* keys after the diagonal; -1 = unbounded */
    float softcap;              /* logit softcap, 0 = off */
    const float *alibi_slopes;  /* device floats, NULL = off: slope of (b, h) at
                                   alibi_slopes[b * alibi_batch_stride + h] */
    int64_t alibi_batch_stride; /* 0: one [heads_q] set for every sequence */
    /* Variable-length batches (fwd_sm90.h): batch 1, seqlen_q / seqlen_k the packed totals,
     * sequence b the rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) against keys
     * [cu_seqlens_k[b], cu_seqlens_k[b + 1]); max_seqlen_q / max_seqlen_k (both >= 1) size the
     * grids. NULL: fixed lengths. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int num_seqs, max_seqlen_q, max_seqlen_k;
    /* Dropout on P (flashc.h's flashc_dropout_keep): off while dropout_p is 0. */
    float dropout_p;            /* in [0, 1) */
    uint32_t dropout_threshold; /* keep when the Philox draw >= this */
    uint64_t dropout_seed, dropout_offset;
} fc_sm90_bwd_args;

/* 1 when fc_sm90_backward serves this call on a device of compute capability
 * sm_major.sm_minor with per-block shared-memory opt-in limit smem_optin; 0 otherwise (head
 * dim not 64/128, a seqlen of 0, rows not 16-byte aligned, not sm_90, ...). */
int fc_sm90_backward_supported(const fc_sm90_bwd_args *a, int sm_major, int sm_minor,
                               size_t smem_optin);

/* Workspace bytes fc_sm90_backward needs for these sizes (batch, seqlens, heads, head_dim,
 * deterministic and, for a varlen batch, num_seqs with cu_seqlens_q set are read). */
size_t fc_sm90_backward_workspace_size(const fc_sm90_bwd_args *a);

/* Dynamic shared memory the main kernel for head_dim uses (0 if none is compiled for it). */
size_t fc_sm90_backward_smem_bytes(int head_dim);

/* Launches the three kernels on stream; returns the CUDA error of a launch, or
 * cudaErrorInvalidValue when a tensor map is rejected or the workspace is too small. Only
 * calls that fc_sm90_backward_supported accepted are valid. */
cudaError_t fc_sm90_backward(const fc_sm90_bwd_args *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_BWD_SM90_H */
