/*
 * common.cuh - what the CUDA kernels and their host launchers share: the kernel argument
 * structs (plain C structs passed by value), the shared-memory tile layout, the tile loader
 * built on cp.async, and the declarations of the launch functions that launch.cu calls.
 *
 * Shared-memory tiles are row-major [rows][head_dim] with every row padded by 8 elements
 * (16 bytes). With a pitch of (head_dim + 8) * 2 bytes, the 8 row addresses of one ldmatrix
 * 8x8 matrix fall on 8 different 16-byte bank groups for every head dim we serve (the
 * pitch in 16-byte units, head_dim / 8 + 1, is odd), so neither ldmatrix nor the transposed
 * form conflicts; a padding works for head dims 96 and 192, where an XOR swizzle over
 * 8 chunks does not.
 */
#ifndef FLASHC_CUDA_COMMON_CUH
#define FLASHC_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "ptx.cuh"

#define FC_PAD 8 /* elements of padding per shared-memory row */

/* The features of flashc.h beyond plain attention, for the kernels compiled with them (the
 * plain kernels never read this). Appended last to both argument structs, so that the plain
 * kernels see every other field where they always did. */
typedef struct fc_feat {
    uint32_t on;                /* FLASHC_FEATURE_* bits; 0 = the plain kernels */
    int varlen;                 /* cu_seqlens: sequence b = blockIdx.z is a segment of batch 0 */
    const int32_t *cu_q, *cu_k; /* num_seqs + 1 device prefix sums */
    int num_seqs, max_seqlen_q, max_seqlen_k;
    int top_left;               /* diagonal offset 0 (causal top-left) instead of nk - nq */
    /* query i of a sequence sees key j when j >= i + off - left (has_left) and
     * j <= i + off + right (has_right): causal and the window folded into one band */
    int has_left, has_right, left, right;
    int softcap_on, alibi_on, dropout_on;
    float softcap_pre;          /* scale / softcap: tanh's argument from a raw q.k */
    float softcap_log2;         /* softcap * log2(e) */
    const float *alibi;         /* slope of (sequence b, head h) at b * alibi_sb + h */
    int64_t alibi_sb;
    uint32_t drop_threshold;    /* keep when the Philox draw >= this */
    uint64_t drop_seed, drop_offset;
    float drop_scale;           /* 1 / (1 - p) */
} fc_feat;

/* Forward: O = softmax(scale Q K^T) V and LSE, for one (batch, query head) per grid row. */
typedef struct fc_fwd_args {
    const uint16_t *q, *k, *v;
    uint16_t *o;
    float *lse;
    /* element strides of dims batch, seqlen, heads */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t lse_sb, lse_sh, lse_ss; /* LSE is [batch, heads_q, seqlen_q] */
    int seqlen_q, seqlen_k, heads_q, heads_kv, group, head_dim;
    float scale_log2;  /* softmax scale * log2(e): scores live in the log2 domain */
    int causal;        /* nonzero: query i sees key j when j <= i + causal_offset */
    int causal_offset; /* seqlen_k - seqlen_q (bottom-right) or 0 (top-left) */
    fc_feat f;
} fc_fwd_args;

/* Backward. The workspace holds per (batch, query head) rows padded to nq_pad:
 * lse2 = LSE * log2(e) (+inf for rows that see no key, so that their P is 0),
 * delta = rowsum(dO * O), and, when dQ goes through atomics, dq_accum in fp32. */
typedef struct fc_bwd_args {
    const uint16_t *q, *k, *v, *o, *dout;
    const float *lse;
    uint16_t *dq, *dk, *dv;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int64_t lse_sb, lse_sh, lse_ss;
    float *lse2, *delta, *dq_accum;
    int seqlen_q, seqlen_k, heads_q, heads_kv, group, head_dim;
    int nq_pad;      /* rows per (batch, head) in the workspace: seqlen_q rounded up to 128 */
    int dq_pitch;    /* columns per row of dq_accum (the kernel's head dim) */
    float scale, scale_log2;
    int causal, causal_offset;
    int compute_dq;  /* the dK/dV kernel also adds dS K into dq_accum with atomics */
    int dq_bulk;     /* (sm_90) ... through shared memory and bulk reductions instead */
    fc_feat f;       /* varlen: the workspace rows of (sequence b, head h) start at
                        h * nq_pad + fc_varlen_ws_start(q0, b), see varlen.cuh */
} fc_bwd_args;

#define FC_NQ_PAD_MULTIPLE 128

/* Copies a [ROWS][D] tile whose row r starts at g + r * row_stride into shared memory with
 * pitch D + FC_PAD, asynchronously. Rows >= rows_valid and 8-column chunks past cols_valid
 * are zero-filled instead of read. Row 0 must be a valid row (rows_valid >= 1). */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void load_tile_async(uint16_t *s, const uint16_t *g,
                                                       int64_t row_stride, int rows_valid,
                                                       int cols_valid, int tid)
{
    constexpr int CH = D / 8;
    constexpr int TOTAL = ROWS * CH;
    constexpr int ITERS = (TOTAL + NT - 1) / NT;
    if (NT % CH == 0) {
        /* Each thread keeps one column chunk and steps down the rows: one pointer and one
         * shared address to carry instead of one per chunk (registers are scarce). */
        constexpr int ROW_STEP = NT / CH;
        const int row0 = tid / CH, ch = tid - row0 * CH;
        const int col_ok = ch * 8 < cols_valid;
        const uint16_t *src = g + row0 * row_stride + ch * 8;
        const uint32_t dst = smem_addr(s + row0 * (D + FC_PAD) + ch * 8);
#pragma unroll
        for (int i = 0; i < ITERS; i++) {
            if (TOTAL % NT == 0 || row0 + i * ROW_STEP < ROWS) {
                int ok = col_ok && row0 + i * ROW_STEP < rows_valid;
                cp_async_16(dst + i * ROW_STEP * (D + FC_PAD) * 2, ok ? src : g, ok);
            }
            src += ROW_STEP * row_stride;
        }
    } else {
#pragma unroll
        for (int i = 0; i < ITERS; i++) {
            int c = tid + i * NT;
            if (TOTAL % NT == 0 || c < TOTAL) {
                int row = c / CH, ch = c - row * CH;
                int ok = row < rows_valid && ch * 8 < cols_valid;
                const uint16_t *src = ok ? g + row * row_stride + ch * 8 : g;
                cp_async_16(smem_addr(s + row * (D + FC_PAD) + ch * 8), src, ok);
            }
        }
    }
}

/* Stores a [ROWS][D] shared tile (pitch D + FC_PAD) to global rows g + r * row_stride, for
 * rows < rows_valid and columns < cols_valid, 16 bytes at a time. */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void store_tile(uint16_t *g, int64_t row_stride,
                                                  const uint16_t *s, int rows_valid,
                                                  int cols_valid, int tid)
{
    constexpr int CH = D / 8;
    constexpr int TOTAL = ROWS * CH;
    constexpr int ITERS = (TOTAL + NT - 1) / NT;
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        int c = tid + i * NT;
        if (TOTAL % NT == 0 || c < TOTAL) {
            int row = c / CH, ch = c - row * CH;
            if (row < rows_valid && ch * 8 < cols_valid)
                *(uint4 *)(g + row * row_stride + ch * 8) =
                    *(const uint4 *)(s + row * (D + FC_PAD) + ch * 8);
        }
    }
}

/* Writes zeros to the same region store_tile would write. */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void store_zero_tile(uint16_t *g, int64_t row_stride,
                                                       int rows_valid, int cols_valid, int tid)
{
    constexpr int CH = D / 8;
    constexpr int TOTAL = ROWS * CH;
    constexpr int ITERS = (TOTAL + NT - 1) / NT;
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        int c = tid + i * NT;
        if (TOTAL % NT == 0 || c < TOTAL) {
            int row = c / CH, ch = c - row * CH;
            if (row < rows_valid && ch * 8 < cols_valid)
                *(uint4 *)(g + row * row_stride + ch * 8) = make_uint4(0, 0, 0, 0);
        }
    }
}

/* ---- host side: launchers (fwd_sm80.cu, bwd_sm80.cu) ------------------------------------ */

struct flashc_problem;

/* The fc_feat of a validated problem (all zero when it uses no feature). */
void fc_feat_from_problem(fc_feat *f, const struct flashc_problem *pr);

/* The head dim a kernel is compiled for that serves a requested head dim (0 = none). */
int fc_kernel_head_dim(int head_dim);

/* Dynamic shared memory the forward / backward kernels need, for the device-limit check. */
size_t fc_fwd_smem_bytes(int kernel_head_dim);
size_t fc_bwd_smem_bytes(int kernel_head_dim, int deterministic, size_t smem_optin, int sm_major);
size_t fc_bwd_feat_smem_bytes(int kernel_head_dim, int deterministic);

/* Each returns the CUDA error of the launches (cudaSuccess when all were accepted). batch is
 * the number of sequences; a->f.on picks the feature kernels. */
cudaError_t fc_launch_fwd(const fc_fwd_args *a, int kernel_head_dim, int bf16, int batch,
                          cudaStream_t stream);
cudaError_t fc_launch_bwd(const fc_bwd_args *a, int kernel_head_dim, int bf16, int batch,
                          int deterministic, size_t smem_optin, int sm_major, cudaStream_t stream);

#endif /* FLASHC_CUDA_COMMON_CUH */
