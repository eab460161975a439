/*
 * fwd_sm80.cu - the FlashAttention-2 forward on tensor cores with mma.sync (sm_80 and later).
 *
 * One CTA computes a block of BM query rows of one (batch, query head): Q stays in shared
 * memory, and the key/value blocks of BN rows stream through it with cp.async, walked from
 * the last block that any of its rows sees down to the first, so that the blocks needing a
 * mask (the partial last one, the ones crossing the causal diagonal) come first and the rest
 * run without one. Each warp owns MT x 16 query rows:
 *
 *     S = Q K^T           mma.sync, Q and K fragments by ldmatrix, S in fp32 registers
 *     S *= scale*log2(e)  scores in the log2 domain, so that exp is a single ex2
 *     mask, online softmax on the fragments: the row max and sum live in 4 lanes of a quad
 *     O = O * corr + P V  P packed to 16 bits in registers is the A operand; V through
 *                         ldmatrix.trans
 *
 * The V load of block j overlaps S = Q K_j^T and the K load of block j-1 overlaps P V_j.
 * At the end O /= rowsum and LSE = (max + log2(sum)) * ln 2; a row that saw no key gets
 * O = 0 and LSE = -inf. O goes out through shared memory for 16-byte stores.
 */
#include <math.h>

#include "common.cuh"

template <int D, int BM, int BN, int NW, int BF16>
__global__ void __launch_bounds__(NW * 32)
fc_fwd_kernel(const fc_fwd_args a)
{
    constexpr int NT = NW * 32;
    constexpr int P = D + FC_PAD;
    constexpr int MT = BM / (16 * NW); /* 16-row tiles per warp */
    constexpr int NTILE = BN / 8;      /* 8-key column tiles of S */
    constexpr int DTILE = D / 8;       /* 8-column tiles of O */
    static_assert(MT >= 1 && BM == MT * 16 * NW, "BM must be a multiple of 16 * warps");

    extern __shared__ uint4 smem_raw[];
    uint16_t *sQ = (uint16_t *)smem_raw;
    uint16_t *sK = sQ + BM * P;
    uint16_t *sV = sK + BN * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m_block = gridDim.x - 1 - blockIdx.x; /* longest causal rows first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int m0 = m_block * BM;
    const int rows_valid = a.seqlen_q - m0;

    const uint16_t *q = a.q + b * a.q_sb + h * a.q_sh + (int64_t)m0 * a.q_ss;
    const uint16_t *k = a.k + b * a.k_sb + hk * a.k_sh;
    const uint16_t *v = a.v + b * a.v_sb + hk * a.v_sh;
    uint16_t *o = a.o + b * a.o_sb + h * a.o_sh + (int64_t)m0 * a.o_ss;
    float *lse = a.lse + b * a.lse_sb + h * a.lse_sh;

    int n_end = a.seqlen_k;
    if (a.causal) {
        int last_row = min(m0 + BM, a.seqlen_q) - 1;
        n_end = min(n_end, last_row + a.causal_offset + 1);
    }
    const int n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;

    if (n_blocks == 0) { /* every row of the block sees no key */
        store_zero_tile<BM, D, NT>(o, a.o_ss, rows_valid, a.head_dim, tid);
        for (int r = tid; r < BM && r < rows_valid; r += NT)
            lse[(int64_t)(m0 + r) * a.lse_ss] = -INFINITY;
        return;
    }

    int nb = n_blocks - 1;
    load_tile_async<BM, D, NT>(sQ, q, a.q_ss, rows_valid, a.head_dim, tid);
    load_tile_async<BN, D, NT>(sK, k + (int64_t)nb * BN * a.k_ss, a.k_ss, a.seqlen_k - nb * BN,
                               a.head_dim, tid);
    cp_async_commit();

    float acc_o[MT][DTILE][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DTILE; dt++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc_o[mt][dt][r] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    const int warp_row0 = warp * MT * 16;

    for (; nb >= 0; nb--) {
        const int n0 = nb * BN;
        cp_async_wait<0>();
        __syncthreads(); /* K_nb is in; every warp is done with the previous V */
        load_tile_async<BN, D, NT>(sV, v + (int64_t)n0 * a.v_ss, a.v_ss, a.seqlen_k - n0,
                                   a.head_dim, tid);
        cp_async_commit();

        /* S = Q K^T */
        float s[MT][NTILE][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) s[mt][nt][r] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(qa[mt], smem_addr(sQ + (warp_row0 + mt * 16 + (lane & 15)) * P +
                                              kk * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int nt2 = 0; nt2 < NTILE / 2; nt2++) {
                uint32_t kb[4];
                ldmatrix_x4(kb, smem_addr(sK + (nt2 * 16 + (lane & 7) + (lane >> 4) * 8) * P +
                                          kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<BF16>(s[mt][2 * nt2], qa[mt], kb[0], kb[1]);
                    mma_16816<BF16>(s[mt][2 * nt2 + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }

        /* Scale into the log2 domain first, then mask: a negative scale stays correct. */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) s[mt][nt][r] *= a.scale_log2;

        const bool need_mask = n0 + BN > a.seqlen_k ||
                               (a.causal && n0 + BN - 1 > m0 + a.causal_offset);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    int row = m0 + warp_row0 + mt * 16 + g + 8 * hr;
                    int key_end = a.seqlen_k;
                    if (a.causal) key_end = min(key_end, row + a.causal_offset + 1);
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            if (n0 + nt * 8 + 2 * t + e >= key_end)
                                s[mt][nt][2 * hr + e] = -INFINITY;
                }
        }

        /* Online softmax, one row per (mt, hr) spread over the 4 lanes of a quad. */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                float mx = row_max[mt][hr];
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]));
                mx = warp_quad_max(mx);
                /* A row with no key seen yet keeps max -inf; subtract 0 instead of -inf so
                 * that exp2 gives 0, not NaN. */
                const float m_use = mx == -INFINITY ? 0.f : mx;
                const float corr = fast_exp2(row_max[mt][hr] - m_use);
                row_max[mt][hr] = mx;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = fast_exp2(s[mt][nt][2 * hr + e] - m_use);
                        s[mt][nt][2 * hr + e] = p;
                        sum += p;
                    }
                row_sum[mt][hr] = row_sum[mt][hr] * corr + sum; /* quad-partial until the end */
#pragma unroll
                for (int dt = 0; dt < DTILE; dt++) {
                    acc_o[mt][dt][2 * hr] *= corr;
                    acc_o[mt][dt][2 * hr + 1] *= corr;
                }
            }

        /* P as A operands: two adjacent 8-key C tiles make one 16-key A tile. */
        uint32_t pa[MT][BN / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kc = 0; kc < BN / 16; kc++) {
                pa[mt][kc][0] = pack2<BF16>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                pa[mt][kc][1] = pack2<BF16>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                pa[mt][kc][2] = pack2<BF16>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                pa[mt][kc][3] = pack2<BF16>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }

        cp_async_wait<0>();
        __syncthreads(); /* V_nb is in; every warp is done with K_nb */
        if (nb > 0) {
            load_tile_async<BN, D, NT>(sK, k + (int64_t)(n0 - BN) * a.k_ss, a.k_ss,
                                       a.seqlen_k - (n0 - BN), a.head_dim, tid);
            cp_async_commit();
        }

        /* O += P V */
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++)
#pragma unroll
            for (int dt2 = 0; dt2 < DTILE / 2; dt2++) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, smem_addr(sV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P +
                                                dt2 * 16 + (lane >> 4) * 8));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<BF16>(acc_o[mt][2 * dt2], pa[mt][kc], vb[0], vb[1]);
                    mma_16816<BF16>(acc_o[mt][2 * dt2 + 1], pa[mt][kc], vb[2], vb[3]);
                }
            }
    }

    /* Epilogue: normalize, LSE, and O through shared memory (sQ is free: the last S = Q K^T
     * is behind the last barrier). */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float sum = warp_quad_sum(row_sum[mt][hr]);
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            const int r = warp_row0 + mt * 16 + g + 8 * hr;
            if (t == 0 && r < rows_valid)
                lse[(int64_t)(m0 + r) * a.lse_ss] =
                    sum > 0.f ? (row_max[mt][hr] + __log2f(sum)) * 0.69314718055994531f
                              : -INFINITY;
#pragma unroll
            for (int dt = 0; dt < DTILE; dt++)
                *(uint32_t *)(sQ + r * P + dt * 8 + 2 * t) =
                    pack2<BF16>(acc_o[mt][dt][2 * hr] * inv, acc_o[mt][dt][2 * hr + 1] * inv);
        }
    __syncthreads();
    store_tile<BM, D, NT>(o, a.o_ss, sQ, rows_valid, a.head_dim, tid);
}

/* ---- tile configurations per head dim, and the launcher -------------------------------- */

/* BM x BN tiles and warps per head dim: 4 warps of 32 rows each up to d128 (K and V
 * fragments reused over two row tiles halve the shared-memory reads per mma), 8 warps of 16
 * rows above, where the O accumulator of 32 rows would not fit in registers. */
#ifndef FC_FWD_D64_BN
#define FC_FWD_D64_BN 128
#endif
#define FC_FWD_CONFIGS(X)      \
    X(32, 128, 128, 4)         \
    X(64, 128, FC_FWD_D64_BN, 4) \
    X(96, 128, 64, 4)          \
    X(128, 128, 64, 4)         \
    X(192, 128, 64, 8)         \
    X(256, 128, 64, 8)

static size_t fwd_smem(int D, int BM, int BN)
{
    return (size_t)(BM + 2 * BN) * (D + FC_PAD) * 2;
}

size_t fc_fwd_smem_bytes(int kernel_head_dim)
{
#define X(D_, BM_, BN_, NW_) \
    if (kernel_head_dim == D_) return fwd_smem(D_, BM_, BN_);
    FC_FWD_CONFIGS(X)
#undef X
    return 0;
}

template <int D, int BM, int BN, int NW, int BF16>
static cudaError_t launch_fwd_cfg(const fc_fwd_args *a, int batch, cudaStream_t stream)
{
    const size_t smem = fwd_smem(D, BM, BN);
    cudaError_t err = cudaFuncSetAttribute(fc_fwd_kernel<D, BM, BN, NW, BF16>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess) return err;
    dim3 grid((a->seqlen_q + BM - 1) / BM, (unsigned)a->heads_q, (unsigned)batch);
    fc_fwd_kernel<D, BM, BN, NW, BF16><<<grid, NW * 32, smem, stream>>>(*a);
    return cudaGetLastError();
}

cudaError_t fc_launch_fwd(const fc_fwd_args *a, int kernel_head_dim, int bf16, int batch,
                          cudaStream_t stream)
{
#define X(D_, BM_, BN_, NW_)                                                             \
    if (kernel_head_dim == D_)                                                           \
        return bf16 ? launch_fwd_cfg<D_, BM_, BN_, NW_, 1>(a, batch, stream)             \
                    : launch_fwd_cfg<D_, BM_, BN_, NW_, 0>(a, batch, stream);
    FC_FWD_CONFIGS(X)
#undef X
    return cudaErrorInvalidValue;
}
