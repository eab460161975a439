/*
 * bwd_sm80.cu - the FlashAttention-2 backward on tensor cores with mma.sync (sm_80 and later).
 *
 * Kernels, in launch order:
 *
 *   fc_bwd_prep     one warp per query row: delta = rowsum(dO * O) in fp32, and the LSE moved
 *                   into the log2 domain (+inf for a row that saw no key, so its P is 0).
 *   fc_bwd_tiled    dK, dV and dQ like fc_bwd_dkdv below, but with a warp grid per product
 *                   and P, dS staged in shared memory, so each warp reads fewer operand
 *                   bytes per mma, and dK, dV split over the warps along the head dim, so
 *                   that one pass does all three at every head dim (see the kernel's comment).
 *   fc_bwd_dkdv     (the feature backward, and parts with too little shared memory for the
 *                   tiled kernel)
 *                   one CTA per block of BN keys of one (batch, kv head); it loops over the
 *                   query blocks that see those keys and over the query heads of the GQA
 *                   group, so dK and dV are summed in registers and written once. The
 *                   products are taken with the keys as rows, so that P^T and dS^T come out
 *                   of the mma in exactly the register layout of the next A operand:
 *
 *                       S^T  = K Q^T               P^T = exp2(S^T * scale log2 e - lse2)
 *                       dV  += P^T dO              (P^T from registers, dO by ldmatrix.trans)
 *                       dP^T = V dO^T              dS^T = P^T * (dP^T - delta)
 *                       dK  += dS^T Q              (dS^T from registers, Q by ldmatrix.trans)
 *                       dQ  += dS K                (dS^T through shared memory; fp32 atomics)
 *
 *                   Each warp owns 16 keys; Q, dO, lse2 and delta of the next query block are
 *                   fetched with cp.async while the current one is computed. For head dims
 *                   above 128 the dK and dV accumulators of 16 x D would not both fit in
 *                   registers, so the kernel runs twice: once for dV, once for dK (and dQ).
 *   fc_bwd_dq       (deterministic mode) one CTA per block of queries, looping over the keys:
 *                   dQ = sum_j dS_j K_j with no atomics, so the result is bitwise the same on
 *                   every run; the dK/dV kernel then skips dQ.
 *   fc_bwd_dq_convert   dq_accum * scale -> dQ in the input type, strided.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "common.cuh"
#include "features.cuh"

#define FC_LOG2E 1.4426950408889634f

/* ---- the feature kernels (FEAT = 1) --------------------------------------------------------
 *
 * Every kernel below takes FEAT: 0 is the plain kernel, 1 serves the features of fc_feat
 * behind run-time branches. blockIdx.z is then a sequence (of a varlen batch or not), blocks
 * past its length leave at once, the loops run over the band of the causal / window mask
 * only, and the workspace rows of a varlen problem are laid out per head over the packed
 * sequences (fc_varlen_ws_start). With softcap, dS gets the tanh derivative 1 - t^2; with
 * dropout, dV takes P D and dS = P (D dP - delta), D the regenerated keep mask times
 * 1 / (1 - p). The feature backward always runs the 16-keys-per-warp dK/dV kernel. */

/* Sequence b's first token in the packed tensors at or below token tok: the b with
 * cu_q[b] <= tok < cu_q[b + 1] (empty sequences skipped). */
static __device__ __forceinline__ int fc_seq_of_token(const fc_feat &f, int tok)
{
    int lo = 0, hi = f.num_seqs;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (f.cu_q[mid] <= tok) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* First workspace row of (sequence b, query head h) for the feature kernels. */
static __device__ __forceinline__ int64_t fc_ws_row(const fc_bwd_args &a, int b, int h)
{
    return a.f.varlen ? (int64_t)h * a.nq_pad + fc_varlen_ws_start(fc_seq_of(a, b).q0, b)
                      : (int64_t)(b * a.heads_q + h) * a.nq_pad;
}

/* Varlen: the workspace row of packed token i of query head h, or -1 when the token lies in
 * no sequence (only offsets that break their rules leave such tokens). */
static __device__ __forceinline__ int64_t fc_token_ws_row(const fc_bwd_args &a, int h, int i)
{
    const int sb = fc_seq_of_token(a.f, i);
    const fc_seq s = fc_seq_of(a, sb);
    if (i < s.q0 || i >= s.q0 + s.nq) return -1;
    return (int64_t)h * a.nq_pad + fc_varlen_ws_start(s.q0, sb) + (i - s.q0);
}

/* FC_DQ_BULK: the dQ tile of the tiled kernel through shared memory and the copy engine's
 * bulk reductions (sm_90), one reduction of D floats per row, instead of vector atomics.
 * Measured 13-30% slower on the H200 (the rows queue in the copy engine and one warp waits
 * for their reads every step): kept off. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(FC_DQ_BULK)
#define FC_HAVE_BULK 1
#else
#define FC_HAVE_BULK 0
#endif

/* dst[0] += x, dst[1] += y in global memory; one vector reduction on sm_90, two before. */
static __device__ __forceinline__ void atomic_add2(float *dst, float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FC_NO_VECTOR_RED)
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

#ifdef FC_DQ_RED4 /* measured slower than two 8-byte reductions on the H200: kept off */
/* dst[0..3] += x, y, z, w (sm_90: one 16-byte vector reduction; dst 16-byte aligned). */
static __device__ __forceinline__ void atomic_add4(float *dst, float x, float y, float z, float w)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(x), "f"(y), "f"(z),
                 "f"(w)
                 : "memory");
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
    atomicAdd(dst + 2, z);
    atomicAdd(dst + 3, w);
#endif
}
#endif

/* ---- warp-tile products ------------------------------------------------------------------
 *
 * The mma.sync products of the kernels below, on one warp's tile of MT x NT accumulators of
 * 16 x 8 (acc[mt][nt]: rows 16 mt.., columns 8 nt..), summed over KS steps of 16 along k, with
 * the 16-bit operands in shared memory of pitch PA, PB elements. The 16-keys-per-warp kernel's
 * tiles of 16 rows, acc[NT][4], have versions of their own without the loop over row tiles: a
 * loop of one trip compiles to different code in some of its instantiations. */

/* acc = 0 (an accumulator array of any shape), before a product is summed into it. */
static __device__ __forceinline__ void zero_acc(float &acc) { acc = 0.f; }

template <typename T, int N>
static __device__ __forceinline__ void zero_acc(T (&acc)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) zero_acc(acc[i]);
}

/* acc += A B^T, A [m][k] from row a_row0 and B [n][k] from row b_row0: the products over the
 * head dim, S = Q K^T and dP = dO V^T (or their transposes). */
template <int BF16, int KS, int PA, int PB, int MT, int NT>
static __device__ __forceinline__ void warp_mma_abt(float (&acc)[MT][NT][4], const uint16_t *a, int a_row0,
                                                    const uint16_t *b, int b_row0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldmatrix_x4(af[mt],
                        smem_addr(a + (a_row0 + mt * 16 + (lane & 15)) * PA + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; nt2++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, smem_addr(b + (b_row0 + nt2 * 16 + (lane & 7) + (lane >> 4) * 8) * PB + kk * 16 +
                                      ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816<BF16>(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
                mma_16816<BF16>(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* The same for a warp tile of 16 rows (S^T = K Q^T and dP^T = V dO^T of the 16-keys-per-warp
 * kernel). */
template <int BF16, int KS, int PA, int PB, int NT>
static __device__ __forceinline__ void warp_mma_abt(float (&acc)[NT][4], const uint16_t *a, int a_row0,
                                                    const uint16_t *b, int b_row0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[4];
        ldmatrix_x4(af, smem_addr(a + (a_row0 + (lane & 15)) * PA + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; nt2++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, smem_addr(b + (b_row0 + nt2 * 16 + (lane & 7) + (lane >> 4) * 8) * PB + kk * 16 +
                                      ((lane >> 3) & 1) * 8));
            mma_16816<BF16>(acc[2 * nt2], af, bf[0], bf[1]);
            mma_16816<BF16>(acc[2 * nt2 + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc += A B, A [m][k] from row a_row0 and B [k][n] from column b_col0: a product over keys
 * with the result over the head dim, dQ = dS K. */
template <int BF16, int KS, int PA, int PB, int MT, int NT>
static __device__ __forceinline__ void warp_mma_ab(float (&acc)[MT][NT][4], const uint16_t *a, int a_row0,
                                                   const uint16_t *b, int b_col0, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KS; kc++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldmatrix_x4(af[mt],
                        smem_addr(a + (a_row0 + mt * 16 + (lane & 15)) * PA + kc * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; nt2++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, smem_addr(b + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PB + b_col0 +
                                            nt2 * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816<BF16>(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
                mma_16816<BF16>(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* acc += A^T B, A [k][m] from column a_col0 and B [k][n] from column b_col0: the key-side
 * gradients dV += P^T dO and dK += dS^T Q, k over the queries, from P and dS stored [query][key]. */
template <int BF16, int KS, int PA, int PB, int MT, int NT>
static __device__ __forceinline__ void warp_mma_atb(float (&acc)[MT][NT][4], const uint16_t *a, int a_col0,
                                                    const uint16_t *b, int b_col0, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KS; kc++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldmatrix_x4_trans(af[mt], smem_addr(a + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * PA + a_col0 +
                                                mt * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; nt2++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, smem_addr(b + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PB + b_col0 +
                                            nt2 * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816<BF16>(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
                mma_16816<BF16>(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* The same for the 16-row tile (a_tile, b_tile) of a grid of 16 x 8 NT tiles: A from column
 * 16 a_tile, B from column 8 NT b_tile (dQ = dS K from the dS^T tile of the 16-keys-per-warp
 * kernel). */
template <int BF16, int KS, int PA, int PB, int NT>
static __device__ __forceinline__ void warp_mma_atb_tile16(float (&acc)[NT][4], const uint16_t *a, int a_tile,
                                                           const uint16_t *b, int b_tile, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KS; kc++) {
        uint32_t af[4];
        ldmatrix_x4_trans(af, smem_addr(a + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * PA + a_tile * 16 +
                                        ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; nt2++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, smem_addr(b + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PB +
                                            b_tile * (NT * 8) + nt2 * 16 + (lane >> 4) * 8));
            mma_16816<BF16>(acc[2 * nt2], af, bf[0], bf[1]);
            mma_16816<BF16>(acc[2 * nt2 + 1], af, bf[2], bf[3]);
        }
    }
}

/* The 16 x 16 tile held in two accumulators of 16 x 8 (columns 0-7 in c0, 8-15 in c1) as the
 * 16-bit A operand of a next mma: the layouts agree, so a result feeds the next product without
 * a trip through shared memory. */
template <int BF16>
static __device__ __forceinline__ void acc_to_a_frag(uint32_t (&a)[4], const float (&c0)[4],
                                                     const float (&c1)[4])
{
    a[0] = pack2<BF16>(c0[0], c0[1]);
    a[1] = pack2<BF16>(c0[2], c0[3]);
    a[2] = pack2<BF16>(c1[0], c1[1]);
    a[3] = pack2<BF16>(c1[2], c1[3]);
}

/* acc += a B for one step of 16 along k, a a 16 x 16 A fragment in registers and B [k][n] from
 * row k0: a product whose left operand this warp has just computed (dS, dS^T). */
template <int BF16, int PB, int NT>
static __device__ __forceinline__ void warp_mma_ab_rega_k16(float (&acc)[NT][4], const uint32_t a[4],
                                                            const uint16_t *b, int k0, int lane)
{
#pragma unroll
    for (int nt2 = 0; nt2 < NT / 2; nt2++) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, smem_addr(b + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * PB + nt2 * 16 +
                                        (lane >> 4) * 8));
        mma_16816<BF16>(acc[2 * nt2], a, bf[0], bf[1]);
        mma_16816<BF16>(acc[2 * nt2 + 1], a, bf[2], bf[3]);
    }
}

/* acc += A B over KS steps of 16 along k, the A fragments in registers (a[kc]): dK += dS^T Q of
 * the 16-keys-per-warp kernel, whose dS^T never leaves registers. */
template <int BF16, int PB, int KS, int NT>
static __device__ __forceinline__ void warp_mma_ab_rega(float (&acc)[NT][4], const uint32_t (&a)[KS][4],
                                                        const uint16_t *b, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KS; kc++) warp_mma_ab_rega_k16<BF16, PB>(acc, a[kc], b, kc * 16, lane);
}

/* ---- pre-pass ---------------------------------------------------------------------------- */

/* FEAT with varlen: one warp per (head, token) of the packed tensors, the workspace rows
 * between the sequences zeroed beforehand by the launcher; otherwise as the plain kernel. */
template <int BF16, int FEAT>
__global__ void __launch_bounds__(256) fc_bwd_prep_kernel(const fc_bwd_args a, int batch)
{
    const int lane = threadIdx.x & 31;
    const int64_t row_id = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    int64_t ws_at = row_id;
    int b, h, i;
    if (FEAT && a.f.varlen) {
        if (row_id >= (int64_t)a.heads_q * a.seqlen_q) return;
        h = (int)(row_id / a.seqlen_q);
        i = (int)(row_id - (int64_t)h * a.seqlen_q); /* the token: batch 0, row i */
        ws_at = fc_token_ws_row(a, h, i);
        if (ws_at < 0) return;
        b = 0;
    } else {
        if (row_id >= (int64_t)batch * a.heads_q * a.nq_pad) return;
        const int bh = (int)(row_id / a.nq_pad);
        i = (int)(row_id - (int64_t)bh * a.nq_pad);
        b = bh / a.heads_q, h = bh - b * a.heads_q;
    }
    float dot = 0.f, lse2 = INFINITY;
    if (i < a.seqlen_q) {
        if (lane * 8 < a.head_dim) { /* head_dim <= 256: one 8-element chunk per lane */
            const uint4 ov = *(const uint4 *)(a.o + b * a.o_sb + h * a.o_sh + (int64_t)i * a.o_ss + lane * 8);
            const uint4 dv = *(const uint4 *)(a.dout + b * a.do_sb + h * a.do_sh + (int64_t)i * a.do_ss + lane * 8);
            const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
            for (int j = 0; j < 4; j++)
                dot += to_float<BF16>(ow[j]) * to_float<BF16>(dw[j]) +
                       to_float<BF16>(ow[j] >> 16) * to_float<BF16>(dw[j] >> 16);
        }
        const float lse = a.lse[b * a.lse_sb + h * a.lse_sh + (int64_t)i * a.lse_ss];
        lse2 = lse == -INFINITY ? INFINITY : lse * FC_LOG2E;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) {
        a.delta[ws_at] = dot;
        a.lse2[ws_at] = lse2;
    }
}

/* ---- dK, dV (and dQ through atomics) ----------------------------------------------------- */

/* Fetches Q, dO, lse2 and delta of step it of the dK/dV loop (query head it / n_m of the
 * group, query block m_block_begin + it % n_m) into one pipeline stage. */
template <int D, int BM, int NT>
static __device__ __forceinline__ void bwd_prefetch(const fc_bwd_args &a, int b, int hk, int it,
                                                    int n_m, int m_block_begin, uint16_t *sQ,
                                                    uint16_t *sdO, float *sLse, float *sDelta,
                                                    int tid)
{
    const int h = hk * a.group + it / n_m;
    const int m0 = (m_block_begin + it % n_m) * BM;
    const uint16_t *q = a.q + b * a.q_sb + h * a.q_sh + (int64_t)m0 * a.q_ss;
    const uint16_t *dO = a.dout + b * a.do_sb + h * a.do_sh + (int64_t)m0 * a.do_ss;
    load_tile_async<BM, D, NT>(sQ, q, a.q_ss, a.seqlen_q - m0, a.head_dim, tid);
    load_tile_async<BM, D, NT>(sdO, dO, a.do_ss, a.seqlen_q - m0, a.head_dim, tid);
    const int64_t row = (int64_t)(b * a.heads_q + h) * a.nq_pad + m0;
    if (tid < BM / 4)
        cp_async_16(smem_addr(sLse + tid * 4), a.lse2 + row + tid * 4, 1);
    else if (tid < BM / 2)
        cp_async_16(smem_addr(sDelta + (tid - BM / 4) * 4), a.delta + row + (tid - BM / 4) * 4, 1);
}

/* bwd_prefetch for the feature kernels: query head h, query block m0 of sequence sq (b). */
template <int D, int BM, int NT>
static __device__ __forceinline__ void bwd_prefetch_feat(const fc_bwd_args &a, const fc_seq &sq,
                                                         int b, int h, int m0, uint16_t *sQ,
                                                         uint16_t *sdO, float *sLse,
                                                         float *sDelta, int tid)
{
    const int64_t r0 = sq.q0 + m0;
    const uint16_t *q = a.q + sq.batch * a.q_sb + h * a.q_sh + r0 * a.q_ss;
    const uint16_t *dO = a.dout + sq.batch * a.do_sb + h * a.do_sh + r0 * a.do_ss;
    load_tile_async<BM, D, NT>(sQ, q, a.q_ss, sq.nq - m0, a.head_dim, tid);
    load_tile_async<BM, D, NT>(sdO, dO, a.do_ss, sq.nq - m0, a.head_dim, tid);
    const int64_t row = fc_ws_row(a, b, h) + m0;
    if (tid < BM / 4)
        cp_async_16(smem_addr(sLse + tid * 4), a.lse2 + row + tid * 4, 1);
    else if (tid < BM / 2)
        cp_async_16(smem_addr(sDelta + (tid - BM / 4) * 4), a.delta + row + (tid - BM / 4) * 4, 1);
}

/* PASS 0: dK, dV and (if a.compute_dq) dQ; PASS 1: dV only; PASS 2: dK and dQ only. */
template <int D, int BM, int NW, int BF16, int PASS, int FEAT>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1)
fc_bwd_dkdv_kernel(const fc_bwd_args a)
{
    constexpr int BN = 16 * NW; /* keys per CTA: 16 per warp */
    constexpr int NT = NW * 32;
    constexpr int P = D + FC_PAD;
    constexpr int PS = BM + FC_PAD; /* pitch of the dS^T tile */
    constexpr int QT = BM / 8;      /* 8-query column tiles of S^T */
    constexpr int DT = D / 8;
    constexpr bool DO_DV = PASS != 2, DO_DK = PASS != 1;
    /* dQ = dS K over a WM x WN grid of warps, each 16 queries x DW columns */
    constexpr int WM = BM / 16, WN = NW / WM, DW = D / WN;
    static_assert(WM * WN == NW && DW % 16 == 0, "dQ warp grid must tile BM x D");

    extern __shared__ uint4 smem_raw[];
    uint16_t *sK = (uint16_t *)smem_raw;
    uint16_t *sV = sK + BN * P;
    uint16_t *sQ = sV + BN * P;           /* [2][BM][P] */
    uint16_t *sdO = sQ + 2 * BM * P;      /* [2][BM][P] */
    uint16_t *sdS = sdO + 2 * BM * P;     /* [BN][PS] */
    float *sLse = (float *)(sdS + BN * PS); /* [2][BM] */
    float *sDelta = sLse + 2 * BM;          /* [2][BM] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int n0 = n_block * BN;
    fc_seq sq = {};
    if constexpr (FEAT) {
        sq = fc_seq_of(a, b);
        if (n0 >= sq.nk) return; /* past this sequence's keys */
    }
    const int64_t bt = FEAT ? sq.batch : b;
    const int k_row0 = FEAT ? sq.k0 + n0 : n0;
    const int keys_valid = (FEAT ? sq.nk : a.seqlen_k) - n0;

    const uint16_t *k = a.k + bt * a.k_sb + hk * a.k_sh + (int64_t)k_row0 * a.k_ss;
    const uint16_t *v = a.v + bt * a.v_sb + hk * a.v_sh + (int64_t)k_row0 * a.v_ss;

    int m_block_begin, n_m;
    /* FEAT: this warp's two key rows see queries [qlo, qhi) (empty past the keys); a query
     * block [m0, m0 + BM) needs no mask when m_full_lo <= m0 and m0 + BM <= m_full_hi. */
    int qlo[2] = {0, 0}, qhi[2] = {0, 0}, m_full_lo = 0, m_full_hi = 0;
    if constexpr (FEAT) {
        const int last_key = min(n0 + BN, sq.nk) - 1;
        const int m_lo = fc_query_lo(a.f, sq, n0), m_hi = fc_query_hi(a.f, sq, last_key);
        m_block_begin = m_lo / BM;
        n_m = m_hi > m_lo ? (m_hi + BM - 1) / BM - m_block_begin : 0;
        m_full_lo = n0 + BN > sq.nk ? INT_MAX : fc_query_lo(a.f, sq, last_key);
        m_full_hi = min(fc_query_hi(a.f, sq, n0), sq.nq);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int key = n0 + warp * 16 + g + 8 * hr;
            if (key < sq.nk) {
                qlo[hr] = fc_query_lo(a.f, sq, key);
                qhi[hr] = fc_query_hi(a.f, sq, key);
            }
        }
    } else {
    /* The queries that see a key of this block: i >= n0 - causal_offset. */
    const int m_begin = a.causal ? max(0, n0 - a.causal_offset) : 0;
    m_block_begin = m_begin / BM;
    n_m = m_begin < a.seqlen_q ? (a.seqlen_q + BM - 1) / BM - m_block_begin : 0;
    }
    const int iters = n_m * a.group;

    load_tile_async<BN, D, NT>(sK, k, a.k_ss, keys_valid, a.head_dim, tid);
    if (DO_DK) load_tile_async<BN, D, NT>(sV, v, a.v_ss, keys_valid, a.head_dim, tid);
    cp_async_commit();

    float acc_dv[DT][4], acc_dk[DT][4];
    zero_acc(acc_dv);
    zero_acc(acc_dk);

    if (iters > 0) {
        if constexpr (FEAT)
            bwd_prefetch_feat<D, BM, NT>(a, sq, b, hk * a.group, m_block_begin * BM, sQ, sdO, sLse,
                                         sDelta, tid);
        else
            bwd_prefetch<D, BM, NT>(a, b, hk, 0, n_m, m_block_begin, sQ, sdO, sLse, sDelta, tid);
    }
    cp_async_commit();

    const int key_row0 = warp * 16; /* this warp's keys within the block */

    for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        if (it + 1 < iters) {
            if constexpr (FEAT)
                bwd_prefetch_feat<D, BM, NT>(a, sq, b, hk * a.group + (it + 1) / n_m,
                                             (m_block_begin + (it + 1) % n_m) * BM,
                                             sQ + (st ^ 1) * BM * P, sdO + (st ^ 1) * BM * P,
                                             sLse + (st ^ 1) * BM, sDelta + (st ^ 1) * BM, tid);
            else
            bwd_prefetch<D, BM, NT>(a, b, hk, it + 1, n_m, m_block_begin, sQ + (st ^ 1) * BM * P,
                                    sdO + (st ^ 1) * BM * P, sLse + (st ^ 1) * BM,
                                    sDelta + (st ^ 1) * BM, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const int h = hk * a.group + it / n_m;
        const int m0 = (m_block_begin + it % n_m) * BM;
        const uint16_t *sQs = sQ + st * BM * P, *sdOs = sdO + st * BM * P;
        const float *sLs = sLse + st * BM, *sDs = sDelta + st * BM;

        /* S^T = K Q^T: 16 keys x BM queries per warp */
        float s[QT][4];
        zero_acc(s);
        warp_mma_abt<BF16, D / 16, P, P>(s, sK, key_row0, sQs, 0, lane);

        /* FEAT: P^T D packed for dV as it is made, s = P^T (1 - t^2) kept for dS^T, and the
         * keep bits of the block in keep[2 hr + e] (bit 4 qt) */
        uint32_t pa_f[BM / 16][4];
        uint32_t keep[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
        if constexpr (FEAT) {
            const bool need_mask = m0 < m_full_lo || m0 + BM > m_full_hi;
            const float slope2 = fc_alibi_slope2(a.f, b, h);
            const float pv_scale = a.f.dropout_on ? a.f.drop_scale : 1.f;
            if (a.f.dropout_on)
                fc_keep_cols<QT>(fc_drop_of(a.f), fc_drop_word(a.f, b, h, a.heads_q), n0 + key_row0 + g, m0,
                                 lane, keep);
#pragma unroll
            for (int qt = 0; qt < QT; qt++) {
                float l2[2];
#pragma unroll
                for (int e = 0; e < 2; e++) l2[e] = sLs[qt * 8 + 2 * t + e];
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    float pv[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int qi = m0 + qt * 8 + 2 * t + e;
                        const int key = n0 + key_row0 + g + 8 * hr;
                        float x, dc = 1.f;
                        if (a.f.softcap_on) {
                            float th;
                            x = fc_softcap2(a.f, s[qt][2 * hr + e], &th);
                            dc = 1.f - th * th;
                        } else {
                            x = s[qt][2 * hr + e] * a.scale_log2;
                        }
                        if (a.f.alibi_on) x -= slope2 * fabsf((float)(qi + sq.off - key));
                        float p = fast_exp2(x - l2[e]);
                        if (need_mask && (qi < qlo[hr] || qi >= qhi[hr])) p = 0.f;
                        pv[e] = ((keep[2 * hr + e] >> (4 * qt)) & 1) ? p * pv_scale : 0.f;
                        s[qt][2 * hr + e] = p * dc;
                    }
                    if (DO_DV) pa_f[qt / 2][(qt & 1) * 2 + hr] = pack2<BF16>(pv[0], pv[1]);
                }
            }
        } else {
        /* P^T = exp2(S^T * scale log2 e - lse2[query]), masked */
        const bool need_mask = n0 + BN > a.seqlen_k ||
                               (a.causal && n0 + BN - 1 > m0 + a.causal_offset);
#pragma unroll
        for (int qt = 0; qt < QT; qt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = qt * 8 + 2 * t + e;
                const float l2 = sLs[col];
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    float p = fast_exp2(s[qt][2 * hr + e] * a.scale_log2 - l2);
                    if (need_mask) {
                        const int key = n0 + key_row0 + g + 8 * hr;
                        if (key >= a.seqlen_k || (a.causal && key > m0 + col + a.causal_offset))
                            p = 0.f;
                    }
                    s[qt][2 * hr + e] = p;
                }
            }
        }

        if (DO_DV) {
            /* dV += P^T dO */
            uint32_t pa[BM / 16][4];
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++) {
                if constexpr (FEAT) {
#pragma unroll
                    for (int r = 0; r < 4; r++) pa[kc][r] = pa_f[kc][r];
                } else {
                    acc_to_a_frag<BF16>(pa[kc], s[2 * kc], s[2 * kc + 1]);
                }
            }
            /* Written out, not warp_mma_ab_rega as for dK below: through the helper the PTX of
             * the d256 feature dV pass comes out different (the same products, other code). */
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++)
#pragma unroll
                for (int dt2 = 0; dt2 < DT / 2; dt2++) {
                    uint32_t ob[4];
                    ldmatrix_x4_trans(ob, smem_addr(sdOs + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P +
                                                    dt2 * 16 + (lane >> 4) * 8));
                    mma_16816<BF16>(acc_dv[2 * dt2], pa[kc], ob[0], ob[1]);
                    mma_16816<BF16>(acc_dv[2 * dt2 + 1], pa[kc], ob[2], ob[3]);
                }
        }

        if (DO_DK) {
            /* dP^T = V dO^T */
            float dp[QT][4];
            zero_acc(dp);
            warp_mma_abt<BF16, D / 16, P, P>(dp, sV, key_row0, sdOs, 0, lane);
            /* dS^T = P^T * (dP^T - delta[query]) */
            if constexpr (FEAT) {
                /* with dropout dP^T is D (V dO^T); s carries the softcap derivative */
                const float dscale = a.f.dropout_on ? a.f.drop_scale : 1.f;
#pragma unroll
                for (int qt = 0; qt < QT; qt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float d = sDs[qt * 8 + 2 * t + e];
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const float dpk = ((keep[2 * hr + e] >> (4 * qt)) & 1) ? dp[qt][2 * hr + e] * dscale : 0.f;
                            dp[qt][2 * hr + e] = s[qt][2 * hr + e] * (dpk - d);
                        }
                    }
            } else {
#pragma unroll
            for (int qt = 0; qt < QT; qt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float d = sDs[qt * 8 + 2 * t + e];
#pragma unroll
                    for (int hr = 0; hr < 2; hr++)
                        dp[qt][2 * hr + e] = s[qt][2 * hr + e] * (dp[qt][2 * hr + e] - d);
                }
            }
            uint32_t dsa[BM / 16][4];
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++) acc_to_a_frag<BF16>(dsa[kc], dp[2 * kc], dp[2 * kc + 1]);
            if (a.compute_dq) {
                /* dS^T to shared memory for the dQ product, which needs it the other way. */
#pragma unroll
                for (int kc = 0; kc < BM / 16; kc++) {
                    *(uint32_t *)(sdS + (key_row0 + g) * PS + kc * 16 + 2 * t) = dsa[kc][0];
                    *(uint32_t *)(sdS + (key_row0 + g + 8) * PS + kc * 16 + 2 * t) = dsa[kc][1];
                    *(uint32_t *)(sdS + (key_row0 + g) * PS + kc * 16 + 8 + 2 * t) = dsa[kc][2];
                    *(uint32_t *)(sdS + (key_row0 + g + 8) * PS + kc * 16 + 8 + 2 * t) = dsa[kc][3];
                }
            }
            /* dK += dS^T Q */
            warp_mma_ab_rega<BF16, P>(acc_dk, dsa, sQs, lane);
            if (a.compute_dq) {
                __syncthreads(); /* the whole dS^T tile is in */
                /* dQ[BM][D] += dS (BM x BN) K (BN x D); warp (wm, wn) takes 16 x DW */
                const int wm = warp % WM, wn = warp / WM;
                float dq[DW / 8][4];
                zero_acc(dq);
                warp_mma_atb_tile16<BF16, BN / 16, PS, P>(dq, sdS, wm, sK, wn, lane);
                float *dqa = a.dq_accum + ((FEAT ? fc_ws_row(a, b, h) : (int64_t)(b * a.heads_q + h) * a.nq_pad) +
                                           m0 + wm * 16) * a.dq_pitch + wn * DW;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(FC_DQ_RED4)
                /* Lanes t and t^1 trade half their pairs so that each holds 4 consecutive
                 * columns of one row: even t row g, odd t row g + 8; one 16-byte reduction. */
                const int odd = t & 1;
#pragma unroll
                for (int dt = 0; dt < DW / 8; dt++) {
                    const float give0 = odd ? dq[dt][0] : dq[dt][2], give1 = odd ? dq[dt][1] : dq[dt][3];
                    const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
                    const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
                    float *dst = dqa + (g + 8 * odd) * a.dq_pitch + dt * 8 + 2 * (t & 2);
                    if (odd)
                        atomic_add4(dst, got0, got1, dq[dt][2], dq[dt][3]);
                    else
                        atomic_add4(dst, dq[dt][0], dq[dt][1], got0, got1);
                }
#else
#pragma unroll
                for (int dt = 0; dt < DW / 8; dt++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        float *dst = dqa + (g + 8 * hr) * a.dq_pitch + dt * 8 + 2 * t;
                        atomic_add2(dst, dq[dt][2 * hr], dq[dt][2 * hr + 1]);
                    }
#endif
            }
        }
        __syncthreads(); /* stage st and the dS^T tile may be overwritten now */
    }

    /* Epilogue: dK *= scale; both through shared memory (sK, sV are free) for 16-byte stores.
     * The wait and barrier matter when the loop ran no step: K and V may still be landing. */
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = key_row0 + g + 8 * hr;
            if (DO_DV)
                *(uint32_t *)(sV + r * P + dt * 8 + 2 * t) =
                    pack2<BF16>(acc_dv[dt][2 * hr], acc_dv[dt][2 * hr + 1]);
            if (DO_DK)
                *(uint32_t *)(sK + r * P + dt * 8 + 2 * t) =
                    pack2<BF16>(acc_dk[dt][2 * hr] * a.scale, acc_dk[dt][2 * hr + 1] * a.scale);
        }
    __syncthreads();
    if (DO_DV)
        store_tile<BN, D, NT>(a.dv + bt * a.dv_sb + hk * a.dv_sh + (int64_t)k_row0 * a.dv_ss, a.dv_ss, sV,
                              keys_valid, a.head_dim, tid);
    if (DO_DK)
        store_tile<BN, D, NT>(a.dk + bt * a.dk_sb + hk * a.dk_sh + (int64_t)k_row0 * a.dk_ss, a.dk_ss, sK,
                              keys_valid, a.head_dim, tid);
}

/* ---- dK, dV, dQ with P and dS staged in shared memory ------------------------------------ */

/* One CTA of 8 warps per block of BN keys, looping over query blocks of BM, like the kernel
 * above, but each product gets its own warp grid, so that every warp owns a square-ish tile
 * and reads fewer operand bytes from shared memory per mma:
 *
 *   S  = Q K^T, dP = dO V^T   BM x BN, warps WMS (queries) x 8/WMS (keys)
 *   P, dS (16-bit)            written to shared memory as [query][key]
 *   dV += P^T dO, dK += dS^T Q   BN x D, warps WKV (keys) x 8/WKV (columns); P^T and dS^T
 *                             read with ldmatrix.trans
 *   dQ  = dS K                BM x D, warps WMQ (queries) x 8/WMQ (columns); fp32 vector
 *                             reductions into dq_accum
 *
 * Two barriers per step: after the cp.async wait (the stage is in, and every warp is past the
 * previous step's reads of P, dS and the other stage, which the prefetch then refills), and
 * after P and dS are written. */
template <int D, int BM, int BN, int WMS, int WKV, int WMQ, int BF16>
__global__ void __launch_bounds__(256, 1)
fc_bwd_tiled_kernel(const fc_bwd_args a)
{
    constexpr int NW = 8, NT = 256;
    constexpr int P = D + FC_PAD, PS = BN + FC_PAD;
    constexpr int MS = BM / WMS, NS = BN / (NW / WMS);  /* S tile of a warp */
    constexpr int KW = BN / WKV, DV = D / (NW / WKV);   /* dK / dV tile of a warp */
    constexpr int MQ = BM / WMQ, DQ = D / (NW / WMQ);   /* dQ tile of a warp */
    constexpr int SMT = MS / 16, SNT = NS / 8, KMT = KW / 16, VNT = DV / 8, QMT = MQ / 16, QNT = DQ / 8;
    static_assert(MS % 16 == 0 && NS % 16 == 0 && KW % 16 == 0 && DV % 16 == 0 && MQ % 16 == 0 &&
                      DQ % 16 == 0, "warp tiles must be multiples of 16");

    extern __shared__ uint4 smem_raw[];
    uint16_t *sK = (uint16_t *)smem_raw;
    uint16_t *sV = sK + BN * P;
    uint16_t *sQ = sV + BN * P;             /* [2][BM][P] */
    uint16_t *sdO = sQ + 2 * BM * P;        /* [2][BM][P] */
    uint16_t *sP = sdO + 2 * BM * P;        /* [BM][PS] */
    uint16_t *sdS = sP + BM * PS;           /* [BM][PS] */
    float *sLse = (float *)(sdS + BM * PS); /* [2][BM] */
    float *sDelta = sLse + 2 * BM;          /* [2][BM] */
#if FC_HAVE_BULK
    constexpr int QP = D + 4;               /* pitch of the fp32 dQ tile (bank-conflict free) */
    float *sdQ = sDelta + 2 * BM;           /* [BM][QP], only when a.dq_bulk */
    float *dq_pending = NULL;               /* where the dQ tile in sdQ is still to be added */
#endif

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int n0 = n_block * BN;
    const int keys_valid = a.seqlen_k - n0;

    const int m0s = (warp % WMS) * MS, n0s = (warp / WMS) * NS;
    const int k0v = (warp % WKV) * KW, d0v = (warp / WKV) * DV;
    const int m0q = (warp % WMQ) * MQ, d0q = (warp / WMQ) * DQ;

    const uint16_t *k = a.k + b * a.k_sb + hk * a.k_sh + (int64_t)n0 * a.k_ss;
    const uint16_t *v = a.v + b * a.v_sb + hk * a.v_sh + (int64_t)n0 * a.v_ss;

    const int m_begin = a.causal ? max(0, n0 - a.causal_offset) : 0;
    const int m_block_begin = m_begin / BM;
    const int n_m = m_begin < a.seqlen_q ? (a.seqlen_q + BM - 1) / BM - m_block_begin : 0;
    const int iters = n_m * a.group;

    load_tile_async<BN, D, NT>(sK, k, a.k_ss, keys_valid, a.head_dim, tid);
    load_tile_async<BN, D, NT>(sV, v, a.v_ss, keys_valid, a.head_dim, tid);
    if (iters > 0)
        bwd_prefetch<D, BM, NT>(a, b, hk, 0, n_m, m_block_begin, sQ, sdO, sLse, sDelta, tid);
    cp_async_commit();

    float acc_dv[KMT][VNT][4], acc_dk[KMT][VNT][4];
    zero_acc(acc_dv);
    zero_acc(acc_dk);

    for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < iters) {
            bwd_prefetch<D, BM, NT>(a, b, hk, it + 1, n_m, m_block_begin, sQ + (st ^ 1) * BM * P,
                                    sdO + (st ^ 1) * BM * P, sLse + (st ^ 1) * BM,
                                    sDelta + (st ^ 1) * BM, tid);
            cp_async_commit();
        }
#if FC_HAVE_BULK
        /* The previous step's dQ tile is complete in sdQ (the barrier above): one warp hands it
         * to the copy engine, a row per bulk reduction, and waits for the reads before the
         * barrier below, after which sdQ is written again. */
        if (dq_pending && warp == 0) {
            for (int r = lane; r < BM; r += 32)
                bulk_reduce_add_f32(dq_pending + (int64_t)r * a.dq_pitch, smem_addr(sdQ + r * QP), D * 4);
            bulk_commit();
        }
#endif

        const int h = hk * a.group + it / n_m;
        const int m0 = (m_block_begin + it % n_m) * BM;
        const uint16_t *sQs = sQ + st * BM * P, *sdOs = sdO + st * BM * P;
        const float *sLs = sLse + st * BM, *sDs = sDelta + st * BM;

        /* S = Q K^T on this warp's MS x NS tile */
        float s[SMT][SNT][4];
        zero_acc(s);
        warp_mma_abt<BF16, D / 16, P, P>(s, sQs, m0s, sK, n0s, lane);

        /* P = exp2(S * scale log2 e - lse2[query]), masked; to shared memory as 16 bits */
        const bool need_mask = n0 + BN > a.seqlen_k || (a.causal && n0 + BN - 1 > m0 + a.causal_offset);
#pragma unroll
        for (int mt = 0; mt < SMT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int row = m0s + mt * 16 + g + 8 * hr;
                const float l2 = sLs[row];
                int key_end = a.seqlen_k - n0; /* keys of this block the row sees: col < key_end */
                if (a.causal) key_end = min(key_end, m0 + row + a.causal_offset + 1 - n0);
#pragma unroll
                for (int nt = 0; nt < SNT; nt++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = fast_exp2(s[mt][nt][2 * hr + e] * a.scale_log2 - l2);
                        if (need_mask && n0s + nt * 8 + 2 * t + e >= key_end) p = 0.f;
                        s[mt][nt][2 * hr + e] = p;
                    }
                    *(uint32_t *)(sP + row * PS + n0s + nt * 8 + 2 * t) =
                        pack2<BF16>(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]);
                }
            }

        /* dP = dO V^T on the same tile; dS = P * (dP - delta[query]) to shared memory */
        {
            float dp[SMT][SNT][4];
            zero_acc(dp);
            warp_mma_abt<BF16, D / 16, P, P>(dp, sdOs, m0s, sV, n0s, lane);
#pragma unroll
            for (int mt = 0; mt < SMT; mt++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int row = m0s + mt * 16 + g + 8 * hr;
                    const float d = sDs[row];
#pragma unroll
                    for (int nt = 0; nt < SNT; nt++)
                        *(uint32_t *)(sdS + row * PS + n0s + nt * 8 + 2 * t) =
                            pack2<BF16>(s[mt][nt][2 * hr] * (dp[mt][nt][2 * hr] - d),
                                        s[mt][nt][2 * hr + 1] * (dp[mt][nt][2 * hr + 1] - d));
                }
        }
#if FC_HAVE_BULK
        if (dq_pending && warp == 0) bulk_wait_read();
#endif
        __syncthreads(); /* P and dS of the whole block are in (and sdQ is free again) */

        /* dV += P^T dO */
        warp_mma_atb<BF16, BM / 16, PS, P>(acc_dv, sP, k0v, sdOs, d0v, lane);

        /* dQ = dS K, added into dq_accum (issued before dK so the reductions drain under it) */
        if (a.compute_dq) {
            float dq[QMT][QNT][4];
            zero_acc(dq);
            warp_mma_ab<BF16, BN / 16, PS, P>(dq, sdS, m0q, sK, d0q, lane);
            float *dq_row0 = a.dq_accum + ((int64_t)(b * a.heads_q + h) * a.nq_pad + m0) * a.dq_pitch;
#if FC_HAVE_BULK
            if (a.dq_bulk) {
#pragma unroll
                for (int mt = 0; mt < QMT; mt++)
#pragma unroll
                    for (int nt = 0; nt < QNT; nt++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++)
                            *(float2 *)(sdQ + (m0q + mt * 16 + g + 8 * hr) * QP + d0q + nt * 8 + 2 * t) =
                                make_float2(dq[mt][nt][2 * hr], dq[mt][nt][2 * hr + 1]);
                fence_proxy_async_shared();
                dq_pending = dq_row0;
            } else
#endif
            {
                float *dqa = dq_row0 + (int64_t)m0q * a.dq_pitch + d0q;
#pragma unroll
                for (int mt = 0; mt < QMT; mt++)
#pragma unroll
                    for (int nt = 0; nt < QNT; nt++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++)
                            atomic_add2(dqa + (mt * 16 + g + 8 * hr) * a.dq_pitch + nt * 8 + 2 * t,
                                        dq[mt][nt][2 * hr], dq[mt][nt][2 * hr + 1]);
            }
        }

        /* dK += dS^T Q */
        warp_mma_atb<BF16, BM / 16, PS, P>(acc_dk, sdS, k0v, sQs, d0v, lane);
    }

    /* Epilogue as above: dV and dK * scale through sV, sK for 16-byte stores. */
    cp_async_wait<0>();
    __syncthreads();
#if FC_HAVE_BULK
    if (dq_pending && warp == 0) { /* the last step's dQ tile */
        for (int r = lane; r < BM; r += 32)
            bulk_reduce_add_f32(dq_pending + (int64_t)r * a.dq_pitch, smem_addr(sdQ + r * QP), D * 4);
        bulk_commit();
        bulk_wait();
    }
#endif
#pragma unroll
    for (int mt = 0; mt < KMT; mt++)
#pragma unroll
        for (int nt = 0; nt < VNT; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = k0v + mt * 16 + g + 8 * hr, c = d0v + nt * 8 + 2 * t;
                *(uint32_t *)(sV + r * P + c) = pack2<BF16>(acc_dv[mt][nt][2 * hr], acc_dv[mt][nt][2 * hr + 1]);
                *(uint32_t *)(sK + r * P + c) =
                    pack2<BF16>(acc_dk[mt][nt][2 * hr] * a.scale, acc_dk[mt][nt][2 * hr + 1] * a.scale);
            }
    __syncthreads();
    store_tile<BN, D, NT>(a.dv + b * a.dv_sb + hk * a.dv_sh + (int64_t)n0 * a.dv_ss, a.dv_ss, sV, keys_valid,
                          a.head_dim, tid);
    store_tile<BN, D, NT>(a.dk + b * a.dk_sb + hk * a.dk_sh + (int64_t)n0 * a.dk_ss, a.dk_ss, sK, keys_valid,
                          a.head_dim, tid);
}

/* ---- deterministic dQ: a block of queries per CTA over the keys --------------------------- */

template <int D, int BN, int NW, int BF16, int FEAT>
__global__ void __launch_bounds__(NW * 32)
fc_bwd_dq_kernel(const fc_bwd_args a)
{
    constexpr int BM = 16 * NW;
    constexpr int NT = NW * 32;
    constexpr int P = D + FC_PAD;
    constexpr int NTILE = BN / 8, DT = D / 8;

    extern __shared__ uint4 smem_raw[];
    uint16_t *sQ = (uint16_t *)smem_raw;
    uint16_t *sdO = sQ + BM * P;
    uint16_t *sK = sdO + BM * P; /* [2][BN][P] */
    uint16_t *sV = sK + 2 * BN * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int bh = b * a.heads_q + h;
    const int m0 = m_block * BM;
    int rows_valid = a.seqlen_q - m0;
    const uint16_t *q = a.q + b * a.q_sb + h * a.q_sh + (int64_t)m0 * a.q_ss;
    const uint16_t *dO = a.dout + b * a.do_sb + h * a.do_sh + (int64_t)m0 * a.do_ss;
    const uint16_t *k = a.k + b * a.k_sb + hk * a.k_sh;
    const uint16_t *v = a.v + b * a.v_sb + hk * a.v_sh;
    uint16_t *dq = a.dq + b * a.dq_sb + h * a.dq_sh + (int64_t)m0 * a.dq_ss;

    int n_end = a.seqlen_k;
    if (a.causal) n_end = min(n_end, min(m0 + BM, a.seqlen_q) - 1 + a.causal_offset + 1);
    int n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    int64_t ws_base = (int64_t)bh * a.nq_pad;

    /* FEAT: the same for sequence b and the band of keys its rows see */
    fc_seq sq = {};
    int seqlen_k = a.seqlen_k, nb_lo = 0, hi_first = 0, lo_last = 0;
    if constexpr (FEAT) {
        sq = fc_seq_of(a, b);
        if (m0 >= sq.nq) return;
        seqlen_k = sq.nk;
        rows_valid = sq.nq - m0;
        const int64_t qr = sq.q0 + m0, kr = sq.k0;
        q = a.q + sq.batch * a.q_sb + h * a.q_sh + qr * a.q_ss;
        dO = a.dout + sq.batch * a.do_sb + h * a.do_sh + qr * a.do_ss;
        k = a.k + sq.batch * a.k_sb + hk * a.k_sh + kr * a.k_ss;
        v = a.v + sq.batch * a.v_sb + hk * a.v_sh + kr * a.v_ss;
        dq = a.dq + sq.batch * a.dq_sb + h * a.dq_sh + qr * a.dq_ss;
        const int last_row = min(m0 + BM, sq.nq) - 1;
        const int n_lo = fc_key_lo(a.f, sq, m0), n_hi = fc_key_hi(a.f, sq, last_row);
        hi_first = fc_key_hi(a.f, sq, m0);
        lo_last = fc_key_lo(a.f, sq, last_row);
        n_blocks = n_hi > n_lo ? (n_hi + BN - 1) / BN : 0;
        nb_lo = n_hi > n_lo ? n_lo / BN : 0;
        ws_base = fc_ws_row(a, b, h);
    }

    const int row_base = warp * 16;
    const int64_t ws_row = ws_base + m0 + row_base + g;
    const float l2[2] = {a.lse2[ws_row], a.lse2[ws_row + 8]};
    const float dl[2] = {a.delta[ws_row], a.delta[ws_row + 8]};

    float acc[DT][4];
    zero_acc(acc);

    load_tile_async<BM, D, NT>(sQ, q, a.q_ss, rows_valid, a.head_dim, tid);
    load_tile_async<BM, D, NT>(sdO, dO, a.do_ss, rows_valid, a.head_dim, tid);
    float slope2 = 0.f;
    uint64_t drop_w = 0;
    if constexpr (FEAT) {
        slope2 = fc_alibi_slope2(a.f, b, h);
        drop_w = fc_drop_word(a.f, b, h, a.heads_q);
    }
    if constexpr (FEAT) {
        if (n_blocks > nb_lo) {
            const int64_t n1 = (int64_t)nb_lo * BN;
            load_tile_async<BN, D, NT>(sK, k + n1 * a.k_ss, a.k_ss, seqlen_k - (int)n1, a.head_dim, tid);
            load_tile_async<BN, D, NT>(sV, v + n1 * a.v_ss, a.v_ss, seqlen_k - (int)n1, a.head_dim, tid);
        }
    } else if (n_blocks > 0) {
        load_tile_async<BN, D, NT>(sK, k, a.k_ss, a.seqlen_k, a.head_dim, tid);
        load_tile_async<BN, D, NT>(sV, v, a.v_ss, a.seqlen_k, a.head_dim, tid);
    }
    cp_async_commit();

    for (int nb = FEAT ? nb_lo : 0; nb < n_blocks; nb++) {
        const int st = FEAT ? (nb - nb_lo) & 1 : nb & 1, n0 = nb * BN;
        if (nb + 1 < n_blocks) {
            const int n1 = n0 + BN;
            load_tile_async<BN, D, NT>(sK + (st ^ 1) * BN * P, k + (int64_t)n1 * a.k_ss, a.k_ss,
                                       seqlen_k - n1, a.head_dim, tid);
            load_tile_async<BN, D, NT>(sV + (st ^ 1) * BN * P, v + (int64_t)n1 * a.v_ss, a.v_ss,
                                       seqlen_k - n1, a.head_dim, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *sKs = sK + st * BN * P, *sVs = sV + st * BN * P;

        float s[NTILE][4], dp[NTILE][4];
        zero_acc(s);
        zero_acc(dp);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[4], oa[4];
            ldmatrix_x4(qa, smem_addr(sQ + (row_base + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8));
            ldmatrix_x4(oa, smem_addr(sdO + (row_base + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int nt2 = 0; nt2 < NTILE / 2; nt2++) {
                uint32_t kb[4], vb[4];
                const int off = (nt2 * 16 + (lane & 7) + (lane >> 4) * 8) * P + kk * 16 + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(kb, smem_addr(sKs + off));
                ldmatrix_x4(vb, smem_addr(sVs + off));
                mma_16816<BF16>(s[2 * nt2], qa, kb[0], kb[1]);
                mma_16816<BF16>(s[2 * nt2 + 1], qa, kb[2], kb[3]);
                mma_16816<BF16>(dp[2 * nt2], oa, vb[0], vb[1]);
                mma_16816<BF16>(dp[2 * nt2 + 1], oa, vb[2], vb[3]);
            }
        }
        if constexpr (FEAT) {
            const bool need_mask = n0 < lo_last || n0 + BN > hi_first;
            uint32_t keep[2] = {0xffffffffu, 0xffffffffu};
            if (a.f.dropout_on) fc_keep_rows<NTILE>(fc_drop_of(a.f), drop_w, m0 + row_base + g, n0, t, keep);
            const float dscale = a.f.dropout_on ? a.f.drop_scale : 1.f;
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int row = m0 + row_base + g + 8 * hr;
                const int lo = fc_key_lo(a.f, sq, row) - n0 - 2 * t;
                const int hi = fc_key_hi(a.f, sq, row) - n0 - 2 * t;
                const int d0 = row + sq.off - n0 - 2 * t;
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int c = nt * 8 + e;
                        float x, dc = 1.f;
                        if (a.f.softcap_on) {
                            float th;
                            x = fc_softcap2(a.f, s[nt][2 * hr + e], &th);
                            dc = 1.f - th * th;
                        } else {
                            x = s[nt][2 * hr + e] * a.scale_log2;
                        }
                        if (a.f.alibi_on) x -= slope2 * fabsf((float)(d0 - c));
                        float p = fast_exp2(x - l2[hr]);
                        if (need_mask && (c < lo || c >= hi)) p = 0.f;
                        const float dpk = ((keep[hr] >> (2 * nt + e)) & 1) ? dp[nt][2 * hr + e] * dscale : 0.f;
                        dp[nt][2 * hr + e] = p * dc * (dpk - dl[hr]);
                    }
            }
        } else {
        const bool need_mask = n0 + BN > a.seqlen_k || (a.causal && n0 + BN - 1 > m0 + a.causal_offset);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int row = m0 + row_base + g + 8 * hr;
            int key_end = a.seqlen_k;
            if (a.causal) key_end = min(key_end, row + a.causal_offset + 1);
#pragma unroll
            for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = fast_exp2(s[nt][2 * hr + e] * a.scale_log2 - l2[hr]);
                    if (need_mask && n0 + nt * 8 + 2 * t + e >= key_end) p = 0.f;
                    dp[nt][2 * hr + e] = p * (dp[nt][2 * hr + e] - dl[hr]);
                }
        }
        }
        /* dQ += dS K */
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t da[4];
            acc_to_a_frag<BF16>(da, dp[2 * kc], dp[2 * kc + 1]);
            warp_mma_ab_rega_k16<BF16, P>(acc, da, sKs, kc * 16, lane);
        }
        __syncthreads(); /* stage st may be refilled */
    }

    /* dQ * scale through shared memory (sQ: every warp is past its last read of it; with no
     * key block at all the Q load may still be landing, hence the wait). */
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
            *(uint32_t *)(sQ + (row_base + g + 8 * hr) * P + dt * 8 + 2 * t) =
                pack2<BF16>(acc[dt][2 * hr] * a.scale, acc[dt][2 * hr + 1] * a.scale);
    __syncthreads();
    store_tile<BM, D, NT>(dq, a.dq_ss, sQ, rows_valid, a.head_dim, tid);
}

/* ---- dq_accum (fp32) * scale -> dQ --------------------------------------------------------- */

template <int BF16, int FEAT>
__global__ void __launch_bounds__(256) fc_bwd_dq_convert_kernel(const fc_bwd_args a, int batch)
{
    /* one thread per 8 columns of a row */
    const int chunks = (a.head_dim + 7) / 8;
    const int64_t id = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const int64_t rows = (int64_t)batch * a.heads_q * a.seqlen_q;
    if (id >= rows * chunks) return;
    const int64_t row = id / chunks;
    const int ch = (int)(id - row * chunks);
    const int bh = (int)(row / a.seqlen_q), i = (int)(row - (int64_t)bh * a.seqlen_q);
    const int b = bh / a.heads_q, h = bh - b * a.heads_q;
    int64_t ws_at = (int64_t)bh * a.nq_pad + i;
    if (FEAT && a.f.varlen) { /* batch 1: bh is the head, i the token */
        ws_at = fc_token_ws_row(a, bh, i);
        if (ws_at < 0) return;
    }
    const float *src = a.dq_accum + ws_at * a.dq_pitch + ch * 8;
    const float4 x = *(const float4 *)src, y = *(const float4 *)(src + 4);
    uint4 out;
    out.x = pack2<BF16>(x.x * a.scale, x.y * a.scale);
    out.y = pack2<BF16>(x.z * a.scale, x.w * a.scale);
    out.z = pack2<BF16>(y.x * a.scale, y.y * a.scale);
    out.w = pack2<BF16>(y.z * a.scale, y.w * a.scale);
    *(uint4 *)(a.dq + b * a.dq_sb + h * a.dq_sh + (int64_t)i * a.dq_ss + ch * 8) = out;
}

/* ---- configurations and the launcher ------------------------------------------------------ */

/* The first kernel (the feature backward, and parts with too little shared memory for the
 * tiled kernel): D, BM (queries per step), warps (16 keys each),
 * whether it runs as two passes (dV, then dK and dQ), and BN, warps of the deterministic dQ
 * kernel. */
#define FC_BWD_CONFIGS(X)          \
    X(32, 64, 8, 0, 64, 4)         \
    X(64, 64, 8, 0, 64, 4)         \
    X(96, 64, 8, 0, 64, 4)         \
    X(128, 64, 8, 0, 64, 4)        \
    X(192, 32, 8, 1, 64, 4)        \
    X(256, 32, 8, 1, 32, 4)

/* The tiled kernel: D, BM, BN, WMS, WKV, WMQ (the warp grids, see the kernel), and BN, warps
 * of the deterministic dQ kernel. Above 128, 64 x 64 blocks: 173 KB of shared memory at d192,
 * 222 KB at d256, and with these grids (those that read the fewest operand bytes) 255
 * registers without spills; docs/PERF.md has the grids measured. */
#define FC_BWD_TILED_CONFIGS(X)             \
    X(32, 128, 128, 2, 4, 4, 64, 4)         \
    X(64, 128, 128, 2, 4, 4, 64, 4)         \
    X(96, 64, 128, 2, 4, 4, 64, 4)          \
    X(128, 64, 128, 2, 4, 2, 64, 4)         \
    X(192, 64, 64, 4, 2, 2, 64, 4)          \
    X(256, 64, 64, 4, 2, 2, 32, 4)

static size_t tiled_smem(int D, int BM, int BN, int bulk)
{
    return (size_t)(2 * BN + 4 * BM) * (D + FC_PAD) * 2 + (size_t)2 * BM * (BN + FC_PAD) * 2 +
           4 * BM * sizeof(float) + (bulk ? (size_t)BM * (D + 4) * sizeof(float) : 0);
}

/* Which dK/dV kernel serves a head dim on this device: 1 the tiled kernel (dQ by vector
 * atomics), 2 the same with dQ through bulk reductions (FC_DQ_BULK builds, sm_90), 0 the first
 * kernel (16 keys per warp), which needs less shared memory: parts whose limit is under the
 * tiled kernel's 131-222 KB (A100 at d64, d128, d192 and d256; consumer parts) take it. */
static int tiled_choice(int D, int BM, int BN, int deterministic, size_t smem_optin, int sm_major)
{
    static int variant = -1; /* FC_BWD_VARIANT (measurement builds): 2 = first kernel, 3 = no bulk dQ */
#ifdef FC_BWD_MEASURE_VARIANTS
    if (variant < 0) {
        const char *e = getenv("FC_BWD_VARIANT");
        variant = e ? atoi(e) : 0;
    }
#else
    variant = 0;
#endif
    if (variant == 2) return 0;
#ifdef FC_DQ_BULK
    if (!deterministic && sm_major >= 9 && variant != 3 && tiled_smem(D, BM, BN, 1) <= smem_optin) return 2;
#else
    (void)deterministic;
    (void)sm_major;
#endif
    if (tiled_smem(D, BM, BN, 0) <= smem_optin) return 1;
    return 0;
}

static size_t dkdv_smem(int D, int BM, int NW)
{
    const int BN = 16 * NW;
    return (size_t)(2 * BN + 4 * BM) * (D + FC_PAD) * 2 + (size_t)BN * (BM + FC_PAD) * 2 +
           4 * BM * sizeof(float);
}

static size_t dq_smem(int D, int BN, int NW)
{
    return (size_t)(2 * 16 * NW + 4 * BN) * (D + FC_PAD) * 2;
}

static size_t fc_bwd_smem_bytes_first(int kernel_head_dim, int deterministic)
{
#define X(D_, BM_, NW_, SPLIT_, DQBN_, DQNW_)                                            \
    if (kernel_head_dim == D_) {                                                         \
        size_t s1 = dkdv_smem(D_, BM_, NW_), s2 = dq_smem(D_, DQBN_, DQNW_);             \
        return deterministic && s2 > s1 ? s2 : s1;                                       \
    }
    FC_BWD_CONFIGS(X)
#undef X
    return 0;
}

/* The feature backward always runs the first kernel (and the deterministic dQ kernel). */
size_t fc_bwd_feat_smem_bytes(int kernel_head_dim, int deterministic)
{
    return fc_bwd_smem_bytes_first(kernel_head_dim, deterministic);
}

size_t fc_bwd_smem_bytes(int kernel_head_dim, int deterministic, size_t smem_optin, int sm_major)
{
#define X(D_, BM_, BN_, WMS_, WKV_, WMQ_, DQBN_, DQNW_)                                   \
    if (kernel_head_dim == D_) {                                                         \
        const int c = tiled_choice(D_, BM_, BN_, deterministic, smem_optin, sm_major);   \
        size_t s1 = c ? tiled_smem(D_, BM_, BN_, c == 2) : fc_bwd_smem_bytes_first(D_, deterministic); \
        size_t s2 = dq_smem(D_, DQBN_, DQNW_);                                           \
        return deterministic && s2 > s1 ? s2 : s1;                                       \
    }
    FC_BWD_TILED_CONFIGS(X)
#undef X
    return fc_bwd_smem_bytes_first(kernel_head_dim, deterministic);
}

template <typename K>
static cudaError_t set_smem(K kernel, size_t bytes)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int BF16, int FEAT = 0>
static cudaError_t launch_bwd_prep(const fc_bwd_args &a, int batch, cudaStream_t stream)
{
    /* varlen: one row per (head, token); the launcher zeroed the rows between sequences */
    const int64_t prep_rows = FEAT && a.f.varlen ? (int64_t)a.heads_q * a.seqlen_q
                                                 : (int64_t)batch * a.heads_q * a.nq_pad;
    fc_bwd_prep_kernel<BF16, FEAT><<<(unsigned)((prep_rows + 7) / 8), 256, 0, stream>>>(a, batch);
    return cudaGetLastError();
}

/* After the dK/dV kernel: the deterministic dQ kernel, or the dq_accum conversion. */
template <int D, int DQBN, int DQNW, int BF16, int FEAT = 0>
static cudaError_t launch_bwd_dq(const fc_bwd_args &a, int batch, int deterministic, cudaStream_t stream)
{
    cudaError_t err;
    if (deterministic) {
        const size_t s2 = dq_smem(D, DQBN, DQNW);
        if ((err = set_smem(fc_bwd_dq_kernel<D, DQBN, DQNW, BF16, FEAT>, s2)) != cudaSuccess) return err;
        const int rows = FEAT && a.f.varlen ? a.f.max_seqlen_q : a.seqlen_q;
        if (rows == 0) return cudaSuccess;
        dim3 g2((rows + 16 * DQNW - 1) / (16 * DQNW), (unsigned)a.heads_q, (unsigned)batch);
        fc_bwd_dq_kernel<D, DQBN, DQNW, BF16, FEAT><<<g2, DQNW * 32, s2, stream>>>(a);
    } else {
        /* varlen: batch 1 over the packed tokens (batch is then the number of sequences) */
        const int64_t n = (int64_t)(FEAT && a.f.varlen ? 1 : batch) * a.heads_q * a.seqlen_q *
                          ((a.head_dim + 7) / 8);
        fc_bwd_dq_convert_kernel<BF16, FEAT><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
            a, FEAT && a.f.varlen ? 1 : batch);
    }
    return cudaGetLastError();
}

template <int D, int BM, int BN, int WMS, int WKV, int WMQ, int DQBN, int DQNW, int BF16>
static cudaError_t launch_bwd_tiled(const fc_bwd_args *a0, int batch, int deterministic, int bulk,
                                    cudaStream_t stream)
{
    fc_bwd_args a = *a0;
    cudaError_t err;
    if ((err = launch_bwd_prep<BF16>(a, batch, stream)) != cudaSuccess) return err;
    const size_t smem = tiled_smem(D, BM, BN, bulk);
    a.dq_bulk = bulk;
    dim3 grid((a.seqlen_k + BN - 1) / BN, (unsigned)a.heads_kv, (unsigned)batch);
    a.compute_dq = !deterministic;
    auto kernel = fc_bwd_tiled_kernel<D, BM, BN, WMS, WKV, WMQ, BF16>;
    if ((err = set_smem(kernel, smem)) != cudaSuccess) return err;
    kernel<<<grid, 256, smem, stream>>>(a);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    return launch_bwd_dq<D, DQBN, DQNW, BF16>(a, batch, deterministic, stream);
}

template <int D, int BM, int NW, int SPLIT, int DQBN, int DQNW, int BF16, int FEAT = 0>
static cudaError_t launch_bwd_cfg(const fc_bwd_args *a0, int batch, int deterministic,
                                  cudaStream_t stream)
{
    fc_bwd_args a = *a0;
    cudaError_t err;
    if ((err = launch_bwd_prep<BF16, FEAT>(a, batch, stream)) != cudaSuccess) return err;

    const size_t smem = dkdv_smem(D, BM, NW);
    const int keys = FEAT && a.f.varlen ? a.f.max_seqlen_k : a.seqlen_k;
    dim3 grid((keys + 16 * NW - 1) / (16 * NW), (unsigned)a.heads_kv, (unsigned)batch);
    a.compute_dq = !deterministic;
    if (keys > 0) {
        if constexpr (SPLIT != 0) {
            if ((err = set_smem(fc_bwd_dkdv_kernel<D, BM, NW, BF16, 1, FEAT>, smem)) != cudaSuccess) return err;
            if ((err = set_smem(fc_bwd_dkdv_kernel<D, BM, NW, BF16, 2, FEAT>, smem)) != cudaSuccess) return err;
            fc_bwd_dkdv_kernel<D, BM, NW, BF16, 1, FEAT><<<grid, NW * 32, smem, stream>>>(a);
            if ((err = cudaGetLastError()) != cudaSuccess) return err;
            fc_bwd_dkdv_kernel<D, BM, NW, BF16, 2, FEAT><<<grid, NW * 32, smem, stream>>>(a);
        } else {
            if ((err = set_smem(fc_bwd_dkdv_kernel<D, BM, NW, BF16, 0, FEAT>, smem)) != cudaSuccess) return err;
            fc_bwd_dkdv_kernel<D, BM, NW, BF16, 0, FEAT><<<grid, NW * 32, smem, stream>>>(a);
        }
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    return launch_bwd_dq<D, DQBN, DQNW, BF16, FEAT>(a, batch, deterministic, stream);
}

cudaError_t fc_launch_bwd(const fc_bwd_args *a, int kernel_head_dim, int bf16, int batch,
                          int deterministic, size_t smem_optin, int sm_major, cudaStream_t stream)
{
    if (a->f.on) {
#define X(D_, BM_, NW_, SPLIT_, DQBN_, DQNW_)                                                     \
        if (kernel_head_dim == D_)                                                                \
            return bf16 ? launch_bwd_cfg<D_, BM_, NW_, SPLIT_, DQBN_, DQNW_, 1, 1>(a, batch, deterministic, stream) \
                        : launch_bwd_cfg<D_, BM_, NW_, SPLIT_, DQBN_, DQNW_, 0, 1>(a, batch, deterministic, stream);
        FC_BWD_CONFIGS(X)
#undef X
        return cudaErrorInvalidValue;
    }
#define X(D_, BM_, BN_, WMS_, WKV_, WMQ_, DQBN_, DQNW_)                                                \
    if (kernel_head_dim == D_) {                                                                       \
        const int c = tiled_choice(D_, BM_, BN_, deterministic, smem_optin, sm_major);                 \
        if (c)                                                                                         \
            return bf16 ? launch_bwd_tiled<D_, BM_, BN_, WMS_, WKV_, WMQ_, DQBN_, DQNW_, 1>(a, batch, deterministic, c == 2, stream) \
                        : launch_bwd_tiled<D_, BM_, BN_, WMS_, WKV_, WMQ_, DQBN_, DQNW_, 0>(a, batch, deterministic, c == 2, stream); \
    }
    FC_BWD_TILED_CONFIGS(X)
#undef X
#define X(D_, BM_, NW_, SPLIT_, DQBN_, DQNW_)                                                     \
    if (kernel_head_dim == D_)                                                                    \
        return bf16 ? launch_bwd_cfg<D_, BM_, NW_, SPLIT_, DQBN_, DQNW_, 1>(a, batch, deterministic, stream) \
                    : launch_bwd_cfg<D_, BM_, NW_, SPLIT_, DQBN_, DQNW_, 0>(a, batch, deterministic, stream);
    FC_BWD_CONFIGS(X)
#undef X
    return cudaErrorInvalidValue;
}
