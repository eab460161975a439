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
#include <string.h>

#include "backend.h"
#include "common.cuh"
#include "features.cuh"

/* ---- the features of a validated problem, for the kernels ------------------------------- */

void fc_feat_from_problem(fc_feat *f, const flashc_problem *pr)
{
    memset(f, 0, sizeof *f);
    const uint32_t on = pr->features;
    f->on = on;
    if (!on) return;
    f->varlen = (on & FLASHC_FEATURE_VARLEN) != 0;
    if (f->varlen) {
        f->cu_q = pr->cu_seqlens_q;
        f->cu_k = pr->cu_seqlens_k;
        f->num_seqs = (int)pr->num_seqs;
    }
    f->max_seqlen_q = (int)pr->max_seqlen_q;
    f->max_seqlen_k = (int)pr->max_seqlen_k;
    f->top_left = pr->causal == FLASHC_CAUSAL_TOP_LEFT;
    /* causal is the band's right edge at the diagonal; a window narrows either edge */
    const int window = (on & FLASHC_FEATURE_WINDOW) != 0;
    const int64_t wl = window ? pr->window_left : -1, wr = window ? pr->window_right : -1;
    const int causal = pr->causal != FLASHC_CAUSAL_NONE;
    f->has_left = wl >= 0;
    f->left = wl >= 0 ? (int)wl : 0;
    f->has_right = causal || wr >= 0;
    f->right = causal ? 0 : (wr >= 0 ? (int)wr : 0); /* causal: min(wr, 0) is 0 */
    if (on & FLASHC_FEATURE_SOFTCAP) {
        f->softcap_on = 1;
        f->softcap_pre = pr->scale / pr->softcap;
        f->softcap_log2 = pr->softcap * 1.4426950408889634f;
    }
    if (on & FLASHC_FEATURE_ALIBI) {
        f->alibi_on = 1;
        f->alibi = pr->alibi_slopes;
        f->alibi_sb = pr->alibi_batch_stride;
    }
    if (on & FLASHC_FEATURE_DROPOUT) {
        f->dropout_on = 1;
        f->drop_threshold = pr->dropout_threshold;
        f->drop_seed = pr->dropout_seed;
        f->drop_offset = pr->dropout_offset;
        f->drop_scale = (float)(1.0 / (1.0 - (double)pr->dropout_p));
    }
}

/* FEAT = 0 is the plain kernel; FEAT = 1 adds everything of fc_feat behind run-time
 * branches: blockIdx.z is then a sequence (varlen or not), the key loop runs over the band
 * [key_lo(first row), key_hi(last row)) only, and the scores get softcap, ALiBi, the band
 * mask and the dropout mask. */
template <int D, int BM, int BN, int NW, int BF16, int FEAT>
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
    fc_seq sq = {};
    if constexpr (FEAT) {
        sq = fc_seq_of(a, b);
        if (m0 >= sq.nq) return; /* past this sequence's end (varlen grids cover the longest) */
    }
    const int seqlen_q = FEAT ? sq.nq : a.seqlen_q, seqlen_k = FEAT ? sq.nk : a.seqlen_k;
    const int64_t bt = FEAT ? sq.batch : b; /* tensor batch */
    const int q_row0 = FEAT ? sq.q0 + m0 : m0, k_row0 = FEAT ? sq.k0 : 0;
    const int rows_valid = seqlen_q - m0;

    const uint16_t *q = a.q + bt * a.q_sb + h * a.q_sh + (int64_t)q_row0 * a.q_ss;
    const uint16_t *k = a.k + bt * a.k_sb + hk * a.k_sh + (int64_t)k_row0 * a.k_ss;
    const uint16_t *v = a.v + bt * a.v_sb + hk * a.v_sh + (int64_t)k_row0 * a.v_ss;
    uint16_t *o = a.o + bt * a.o_sb + h * a.o_sh + (int64_t)q_row0 * a.o_ss;
    float *lse = a.lse + bt * a.lse_sb + h * a.lse_sh + (int64_t)(q_row0 - m0) * a.lse_ss;

    int n_blocks, nb_lo = 0;
    int hi_first = 0, lo_last = 0; /* FEAT: a block needs no mask when lo_last <= n0, n0 + BN <= hi_first */
    if constexpr (FEAT) {
        const int last_row = min(m0 + BM, seqlen_q) - 1;
        const int n_lo = fc_key_lo(a.f, sq, m0), n_hi = fc_key_hi(a.f, sq, last_row);
        hi_first = fc_key_hi(a.f, sq, m0);
        lo_last = fc_key_lo(a.f, sq, last_row);
        n_blocks = n_hi > n_lo ? (n_hi + BN - 1) / BN : 0;
        nb_lo = n_lo / BN;
    } else {
        int n_end = a.seqlen_k;
        if (a.causal) {
            int last_row = min(m0 + BM, a.seqlen_q) - 1;
            n_end = min(n_end, last_row + a.causal_offset + 1);
        }
        n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    }

    if (n_blocks == 0) { /* every row of the block sees no key */
        store_zero_tile<BM, D, NT>(o, a.o_ss, rows_valid, a.head_dim, tid);
        for (int r = tid; r < BM && r < rows_valid; r += NT)
            lse[(int64_t)(m0 + r) * a.lse_ss] = -INFINITY;
        return;
    }

    int nb = n_blocks - 1;
    load_tile_async<BM, D, NT>(sQ, q, a.q_ss, rows_valid, a.head_dim, tid);
    load_tile_async<BN, D, NT>(sK, k + (int64_t)nb * BN * a.k_ss, a.k_ss, seqlen_k - nb * BN,
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
    float slope2 = 0.f;
    uint64_t drop_w = 0;
    if constexpr (FEAT) {
        slope2 = fc_alibi_slope2(a.f, b, h);
        drop_w = fc_drop_word(a.f, b, h, a.heads_q);
    }

    for (; nb >= nb_lo; nb--) {
        const int n0 = nb * BN;
        cp_async_wait<0>();
        __syncthreads(); /* K_nb is in; every warp is done with the previous V */
        load_tile_async<BN, D, NT>(sV, v + (int64_t)n0 * a.v_ss, a.v_ss, seqlen_k - n0,
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

        if constexpr (FEAT) {
            /* softcap (or the scale), ALiBi, then the band: each a uniform branch */
            if (a.f.softcap_on) {
                float th;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int r = 0; r < 4; r++) s[mt][nt][r] = fc_softcap2(a.f, s[mt][nt][r], &th);
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int r = 0; r < 4; r++) s[mt][nt][r] *= a.scale_log2;
            }
            if (a.f.alibi_on) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        /* -slope |i + off - j|; the distance is exact in float below 2^24 */
                        const int d0 = m0 + warp_row0 + mt * 16 + g + 8 * hr + sq.off - n0 - 2 * t;
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                s[mt][nt][2 * hr + e] -= slope2 * fabsf((float)(d0 - nt * 8 - e));
                    }
            }
            if (n0 < lo_last || n0 + BN > hi_first) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int row = m0 + warp_row0 + mt * 16 + g + 8 * hr;
                        const int lo = fc_key_lo(a.f, sq, row) - n0 - 2 * t;
                        const int hi = fc_key_hi(a.f, sq, row) - n0 - 2 * t;
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int c = nt * 8 + e;
                                if (c < lo || c >= hi) s[mt][nt][2 * hr + e] = -INFINITY;
                            }
                    }
            }
        } else {
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

        /* Dropout after the row sums, which stay those of the undropped softmax (the LSE);
         * the 1 / (1 - p) of the kept entries is applied once, at the end. */
        if (FEAT && a.f.dropout_on) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t keep[2];
                fc_keep_rows<NTILE>(fc_drop_of(a.f), drop_w, m0 + warp_row0 + mt * 16 + g, n0, t, keep);
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            if (!((keep[hr] >> (2 * nt + e)) & 1)) s[mt][nt][2 * hr + e] = 0.f;
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
        if (nb > nb_lo) {
            load_tile_async<BN, D, NT>(sK, k + (int64_t)(n0 - BN) * a.k_ss, a.k_ss,
                                       seqlen_k - (n0 - BN), a.head_dim, tid);
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
            const float inv = sum > 0.f ? (FEAT && a.f.dropout_on ? a.f.drop_scale : 1.f) / sum : 0.f;
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
 * rows above, where the O accumulator of 32 rows would not fit in registers. The last three
 * are the tiles of the feature kernel, which carries more per row (band, slopes, keep
 * bits): at d64 and d96 the plain tiles would spill there, so it takes 64 keys or 8 warps
 * (never more shared memory than the plain kernel, which the launch checks size). */
#ifndef FC_FWD_D64_BN
#define FC_FWD_D64_BN 128
#endif
#define FC_FWD_CONFIGS(X)                     \
    X(32, 128, 128, 4, 128, 128, 4)           \
    X(64, 128, FC_FWD_D64_BN, 4, 128, 64, 4)  \
    X(96, 128, 64, 4, 128, 64, 8)             \
    X(128, 128, 64, 4, 128, 64, 4)            \
    X(192, 128, 64, 8, 128, 64, 8)            \
    X(256, 128, 64, 8, 128, 64, 8)

static size_t fwd_smem(int D, int BM, int BN)
{
    return (size_t)(BM + 2 * BN) * (D + FC_PAD) * 2;
}

size_t fc_fwd_smem_bytes(int kernel_head_dim)
{
#define X(D_, BM_, BN_, NW_, FBM_, FBN_, FNW_) \
    if (kernel_head_dim == D_) return fwd_smem(D_, BM_, BN_);
    FC_FWD_CONFIGS(X)
#undef X
    return 0;
}

template <int D, int BM, int BN, int NW, int BF16, int FEAT>
static cudaError_t launch_fwd_kernel(const fc_fwd_args *a, int batch, cudaStream_t stream)
{
    const size_t smem = fwd_smem(D, BM, BN);
    cudaError_t err = cudaFuncSetAttribute(fc_fwd_kernel<D, BM, BN, NW, BF16, FEAT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess) return err;
    /* varlen: blocks over the longest sequence, one grid layer per sequence */
    const int rows = a->f.varlen ? a->f.max_seqlen_q : a->seqlen_q;
    if (rows == 0 || batch == 0) return cudaSuccess;
    dim3 grid((rows + BM - 1) / BM, (unsigned)a->heads_q, (unsigned)batch);
    fc_fwd_kernel<D, BM, BN, NW, BF16, FEAT><<<grid, NW * 32, smem, stream>>>(*a);
    return cudaGetLastError();
}

template <int D, int BM, int BN, int NW, int FBM, int FBN, int FNW, int BF16>
static cudaError_t launch_fwd_cfg(const fc_fwd_args *a, int batch, cudaStream_t stream)
{
    return a->f.on ? launch_fwd_kernel<D, FBM, FBN, FNW, BF16, 1>(a, batch, stream)
                   : launch_fwd_kernel<D, BM, BN, NW, BF16, 0>(a, batch, stream);
}

cudaError_t fc_launch_fwd(const fc_fwd_args *a, int kernel_head_dim, int bf16, int batch,
                          cudaStream_t stream)
{
#define X(D_, BM_, BN_, NW_, FBM_, FBN_, FNW_)                                              \
    if (kernel_head_dim == D_)                                                             \
        return bf16 ? launch_fwd_cfg<D_, BM_, BN_, NW_, FBM_, FBN_, FNW_, 1>(a, batch, stream) \
                    : launch_fwd_cfg<D_, BM_, BN_, NW_, FBM_, FBN_, FNW_, 0>(a, batch, stream);
    FC_FWD_CONFIGS(X)
#undef X
    return cudaErrorInvalidValue;
}
