/*
 * fwd_sm90.cu - the FlashAttention forward for Hopper (sm_90a): warp specialization, a TMA +
 * mbarrier pipeline for K and V, and wgmma for both products. Build for
 * -gencode=arch=compute_90a,code=sm_90a (wgmma and setmaxnreg exist only on the "a" target).
 *
 * One CTA = a producer warpgroup and NC = 2 or 3 consumer warpgroups computes BM = 64 NC query
 * rows of one (batch, query head) (the tile shapes per head dim are listed before the host code):
 *
 *   warpgroup 0, producer: gives its registers away (setmaxnreg.dec to 24); one elected thread
 *     loads Q once, then walks the key blocks from the last one any row sees down to the
 *     first, loading K_j and V_j by TMA into a STAGES-deep ring. Each stage has a "full"
 *     mbarrier (TMA transaction bytes) and an "empty" one (one arrival per consumer).
 *   warpgroups 1 .. NC, consumers: take the registers (setmaxnreg.inc to 240, or 160 for
 *     three) and own 64 query rows each. Per key block j, in a two-stage software pipeline:
 *         issue S_j = Q K_j^T       (wgmma SS: Q and K from swizzled shared memory)
 *         issue O += P_{j-1} V_{j-1} (wgmma RS: P from registers, V from shared memory)
 *         wait for S_j; release K_j; mask; online softmax in the log2 domain (one FFMA + EX2
 *         per score, scale folded into the exponent)
 *         wait for the PV product; release V_{j-1}; rescale O; pack P_j to 16 bits
 *     so the exponentials of block j overlap the P V product of block j-1. The consumers
 *     also take turns issuing their GEMMs (a token passed round them on named barriers,
 *     "ping-pong" for two), so the others' softmax runs while one's GEMMs hold the tensor
 *     cores.
 *   epilogue: O /= rowsum, written as 16-bit into the consumer's own rows of an O tile (in
 *     the swizzled layout) and stored by TMA, which clips rows past seqlen_q; at head dim 256,
 *     which has no room for one, the Q tile's rows stage it. LSE is stored directly. A row
 *     that sees no key gets O = 0, LSE = -inf.
 *
 * Blocks are walked from the last key block down, so the blocks that need a mask (the partial
 * last one, the ones crossing the causal diagonal) come first; the rest run without one. TMA
 * zero-fills key rows past seqlen_k (the seqlen dimension of the tensor map bounds them), so
 * a partial block brings zeros, which the mask then removes.
 *
 * The grid is persistent (one CTA per SM): each CTA's producer picks tiles in the order of
 * sm90_tile (causal ones longest first, taken from an atomic counter as CTAs free up;
 * non-causal ones in fixed strides) and loads the next tile's K and Q while its consumers
 * store the last tile's O.
 *
 * The tensors reach the kernel as one 4-D tensor map each, {head_dim, seqlen, heads, batch}
 * with the caller's strides, 128-byte swizzle, boxes of 64 columns: any strided view whose rows
 * are 16-byte aligned works without a copy.
 *
 * Checked on an H200 against a float64 reference (tests/gpu/hopper/check_fwd_sm90.cu and the
 * library's GPU tests); docs/HOPPER_PLAN.md has the design notes and measurements.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_sm90.h"
#include "sm90_env.h"
#include "sm90_ptx.cuh"
#include "sm90_tmap.h"
#include "../dropout.cuh"
#include "../varlen.cuh"

/* What the kernel needs besides the tensor maps. */
typedef struct sm90_fwd_params {
    float *lse;
    int64_t lse_sb, lse_sh, lse_ss;
    int seqlen_q, seqlen_k, group, heads_q;
    int causal;        /* nonzero: query i sees key j when j <= i + causal_offset */
    /* The tile schedule (sm90_tile): num_tiles = m_blocks * heads_q * batch tiles of BM rows.
     * CTA c starts with tile c; its next tile is gridDim.x + atomicAdd(tile_counter, 1) when
     * tile_counter is set (zeroed before the launch), else its last one + gridDim.x. Causal
     * tiles go in sections of section_bh (batch, head) pairs, longest first within one. */
    int num_tiles, m_blocks, section_bh;
    int *tile_counter;
    int causal_offset; /* seqlen_k - seqlen_q (bottom-right) or 0 (top-left) */
    float scale_log2;  /* the exponent's factor: softmax scale * log2(e), > 0; 1 in a feature
                          kernel whose scores are transformed into the log2 domain first */
} sm90_fwd_params;

/* What only the feature kernels (FEAT = 1) read: a kernel parameter of its own, so that the
 * plain kernels' parameters, and with them their code, stay as they were. Query i sees key j
 * when j >= i + off - left (has_left) and j <= i + off + right (has_right), j < seqlen_k:
 * causal and the window folded into one band. */
typedef struct sm90_fwd_feat {
    int off;           /* flashc.h's diagonal offset: 0 top-left, else seqlen_k - seqlen_q */
    int has_left, has_right, left, right;
    int transform;     /* softcap or ALiBi: scores go to the log2 domain before the max */
    int softcap_on, alibi_on;
    float score_log2;  /* softmax scale * log2(e), for the transform without softcap */
    float softcap_pre; /* scale / softcap: tanh's argument from a raw q.k */
    float softcap_log2; /* softcap * log2(e) */
    const float *alibi; /* slope of (b, h) at alibi[b * alibi_sb + h] */
    int64_t alibi_sb;
    /* Variable-length batches: tile batch b is sequence b, rows [cu_q[b], cu_q[b+1]) of the
     * packed q / out / lse (tensor batch 0) against keys [cu_k[b], cu_k[b+1]). O rows of a
     * sequence's last, partial tile are stored without TMA (whose clipping stops only at the
     * packed tensor's end), so that o, its strides and the real head dim are here too. */
    int varlen, top_left;
    const int32_t *cu_q, *cu_k;
    uint16_t *o;
    int64_t o_sb, o_ss, o_sh;
    int head_dim;
    /* Dropout: the keep bits of P in the Philox layout of flashc.h, word drop_offset +
     * b * heads_q + h; O is scaled by drop_scale = 1 / (1 - p) in the epilogue. */
    int drop_on;
    fc_drop drop;
    uint64_t drop_offset;
    float drop_scale;
} sm90_fwd_feat;

/* The sequence of a tile: its rows q0 .. q0 + nq of the tensors' batch tb against keys
 * k0 .. k0 + nk, query i on the diagonal of key i + off. Plain kernels: batch b of fixed
 * lengths. Offsets from the device are clamped into the packed tensors and made
 * non-decreasing, so offsets that break their rules give wrong rows, never an access outside
 * the tensors. */
typedef struct sm90_seq {
    int q0, nq, k0, nk, off, tb;
} sm90_seq;

/* A CTA is a producer warpgroup and NC consumer warpgroups of 64 query rows each (NC = 2 or
 * 3). The registers are split so that 128 x 24 + NC x 128 x consumer regs stays within the
 * 65,536 of an SM: 240 each for two consumers (64,512), 160 each for three (64,512). */
#define SM90_PRODUCER_REGS 24
#define SM90_MAX_CONSUMERS 3
template <int NC> struct sm90_cta {
    static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
    static constexpr int BM = 64 * NC;          /* query rows per tile */
    static constexpr int THREADS = 128 * (NC + 1);
    static constexpr int CONSUMER_REGS = NC == 2 ? 240 : 160;
};

/* Named barriers: 0 is __syncthreads; 1 .. NC order the consumers' GEMM issue (a token passed
 * round the consumers: ping-pong for two); the next NC gather one consumer before its O store;
 * the last joins the consumers once they have cleared the rows of a varlen sequence's last V
 * block that belong to the next sequence. */
#define SM90_BAR_SCHED0 1
#define SM90_BAR_EPI0 (SM90_BAR_SCHED0 + SM90_MAX_CONSUMERS)
#define SM90_BAR_VTAIL (SM90_BAR_EPI0 + SM90_MAX_CONSUMERS)
#define SM90_BAR_O_IN_V (SM90_BAR_VTAIL + 1)

/* The token at a tile's end. Off: the last consumer hands consumer 0 the token at the start of
 * its next tile, so consumer 0's first S = Q K^T of a tile waits for the last consumer's whole
 * epilogue. On: the last consumer hands it over right after issuing its last P V product, as
 * the others do, and consumer 0 takes the one left over when the CTA runs out of tiles. */
#ifndef FC_SM90_FWD_EARLY_TOKEN
#define FC_SM90_FWD_EARLY_TOKEN 0
#endif

/* 1: where shared memory has no room for an O tile of its own (head dim 256), O is staged for
 * its TMA store in the V ring rather than in the Q tile, as FlashAttention-3 does, so that the
 * Q tile is free after the tile's last S = Q K^T and the next tile's Q loads over the last
 * block's softmax, P V and the epilogue instead of after the O store. The consumers meet once
 * per tile before writing O (the other one may still be reading the last V block), and the
 * producer loads the next tile's first V block only once the copy engine has read O out
 * (o_empty). Measured +1-2.5% on the d256 rows at 2k-8k (docs/PERF.md, "The d256 forward's O
 * staged in the V ring"); 0 stages O in the Q tile. */
#ifndef FC_SM90_FWD_O_IN_V
#define FC_SM90_FWD_O_IN_V 1
#endif

/* 1: a consumer skips the key blocks at the top of its tile's walk that lie wholly past the
 * causal diagonal of its own 64 rows (all masked for it, though not for the tile's later rows):
 * it only takes its turn and releases their K and V stages, so that the tensor cores and
 * exponentials go to the blocks its rows see. Plain kernels, fixed-length and varlen, whose
 * tiles are taller than their blocks (d64): +5% on causal d64 at 2k, +2.5% at 4k (docs/PERF.md,
 * "The causal blocks past a consumer's own diagonal"); 0 builds the kernels without it. */
#ifndef FC_SM90_FWD_DIAG_SKIP
#define FC_SM90_FWD_DIAG_SKIP 1
#endif

/* 1: the consumer index made warp-uniform (sm90_warp_uniform). The Q rows' wgmma descriptors
 * built from it then live in uniform registers: at d128 the key loop loses the eight
 * descriptors it keeps in per-thread registers (16 of them) and the two R2UR moves before each
 * S = Q K^T product. All but the d256 feature kernels, which spill with it. Measured +1-2.5%
 * (d256 non-causal 2k-4k +2.5%, d64 +2%, d128 +1%; docs/PERF.md, "The consumer index made
 * warp-uniform"); 0 builds the kernels without it. */
#ifndef FC_SM90_FWD_UNIFORM_CW
#define FC_SM90_FWD_UNIFORM_CW 1
#endif

/* Tile t of the schedule: its m-block and (batch, head). Non-causal tiles run m-block fastest,
 * so that the CTAs in flight share the K/V of a few heads in L2. Causal tiles differ in length
 * (a row block sees keys up to its diagonal), so they go longest first, in sections of
 * section_bh (batch, head) pairs whose K/V fit in L2 together: within a section, every pair's
 * last m-block, then every pair's one before it, and so on. CTAs that take the next tile of
 * this order whenever they finish one (the atomic counter) schedule longest processing time
 * first, which balances them. */
static __device__ __forceinline__ void sm90_tile(int t, const sm90_fwd_params &p, int &m_block,
                                                 int &h, int &b)
{
    int bh;
    if (!p.causal) {
        bh = t / p.m_blocks;
        m_block = t - bh * p.m_blocks;
    } else {
        const int per_section = p.section_bh * p.m_blocks;
        const int sec = t / per_section;
        const int n_bh = p.num_tiles / p.m_blocks;
        const int first = sec * p.section_bh;
        const int count = min(p.section_bh, n_bh - first);
        const int r = t - sec * per_section;
        m_block = p.m_blocks - 1 - r / count;
        bh = first + r % count;
    }
    b = bh / p.heads_q;
    h = bh - b * p.heads_q;
}

template <int FEAT>
static __device__ __forceinline__ sm90_seq sm90_seq_of(const sm90_fwd_params &p, const sm90_fwd_feat &f, int b)
{
    sm90_seq s;
    if (FEAT >= 2) {
        fc_varlen_rows(f.cu_q, f.cu_k, b, p.seqlen_q, p.seqlen_k, &s.q0, &s.nq, &s.k0, &s.nk);
        s.off = f.top_left ? 0 : s.nk - s.nq;
        s.tb = 0;
    } else {
        s.q0 = s.k0 = 0;
        s.nq = p.seqlen_q;
        s.nk = p.seqlen_k;
        s.off = FEAT ? f.off : p.causal_offset;
        s.tb = b;
    }
    return s;
}

/* Shared memory, every tile 1024-byte aligned (the 128-byte swizzle atom): Q, then the K
 * ring, then the V ring, then (SEP_O) the O tile, then the mbarriers. Where shared memory has
 * room (head dims up to 128), O is staged for its TMA store in a tile of its own (SEP_O), so
 * that the next tile's Q can load as soon as the last S = Q K^T has read this one, over the
 * last block's softmax, P V and the epilogue; otherwise (head dim 256) O is staged in the V
 * ring (O_IN_V, FC_SM90_FWD_O_IN_V), with the same early Q, or in the Q tile, and the next Q
 * then waits until the copy engine has read O out of it. */
template <int D, int BN, int STAGES, int NC>
struct sm90_fwd_layout {
    static constexpr int PANELS = D / 64;
    static constexpr uint32_t Q_BYTES = sm90_cta<NC>::BM * D * 2;
    static constexpr uint32_t KV_BYTES = BN * D * 2;
    static constexpr uint32_t K_OFF = Q_BYTES;
    static constexpr uint32_t V_OFF = K_OFF + STAGES * KV_BYTES;
    static constexpr bool SEP_O =
        V_OFF + STAGES * KV_BYTES + Q_BYTES + (2 + 4 * STAGES) * 8 + 16 + 1024 <= 232448; /* 227 KB */
    static constexpr bool O_IN_V = !SEP_O && FC_SM90_FWD_O_IN_V && STAGES * KV_BYTES >= Q_BYTES;
    static constexpr bool Q_FREE_EARLY = SEP_O || O_IN_V; /* Q released after the last S */
    /* q_full, the K/V ring's, q_empty, and (O_IN_V) o_empty */
    static constexpr uint32_t BARS = 2 + 4 * STAGES + (O_IN_V ? 1 : 0);
    /* the barriers, the tile slot and the alignment slack: the dynamic shared-memory base is
     * only 16-byte aligned */
    static constexpr uint32_t TAIL = BARS * 8 + 16 + 1024;
    static constexpr uint32_t O_OFF = SEP_O ? V_OFF + STAGES * KV_BYTES : O_IN_V ? V_OFF : 0;
    static constexpr uint32_t BAR_OFF = V_OFF + STAGES * KV_BYTES + (SEP_O ? Q_BYTES : 0);
    static constexpr uint32_t TILE_OFF = BAR_OFF + BARS * 8; /* the tile handed to consumers */
    static constexpr uint32_t TOTAL = BAR_OFF + TAIL;
};

/* Row max and sum of one accumulator row pair, folded into the running state; s becomes
 * exp2(s * scale_log2 - max). m is the running max in the log2 domain (-inf until a key is
 * seen), l the thread-local part of the running sum. Returns nothing; corr[hr] is the factor
 * by which O must be rescaled. */
template <int BN>
static __device__ __forceinline__ void sm90_online_softmax(float (&s)[BN / 2], float (&m)[2],
                                                           float (&l)[2], float (&corr)[2],
                                                           float scale_log2)
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < BN / 2; j++)
            if (((j >> 1) & 1) == hr) mx = fmaxf(mx, s[j]);
        mx = sm90_quad_max(mx);
        const float m_new = fmaxf(m[hr], mx * scale_log2);
        /* A row with no key seen yet keeps max -inf; subtract 0 instead so that exp2 gives
         * 0, not NaN ((-inf) - (-inf)). */
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        corr[hr] = sm90_exp2(m[hr] - m_use);
        m[hr] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < BN / 2; j++)
            if (((j >> 1) & 1) == hr) {
                const float p = sm90_exp2(fmaf(s[j], scale_log2, -m_use));
                s[j] = p;
                sum += p;
            }
        l[hr] = l[hr] * corr[hr] + sum; /* quad-partial until the end */
    }
}

/* The band of keys query i sees, [sm90_key_lo, sm90_key_hi), clamped to [0, nk]; both
 * grow with i. 64-bit, because a window may be as wide as INT32_MAX. */
static __device__ __forceinline__ int sm90_key_lo(const sm90_seq &q, const sm90_fwd_feat &f, int i)
{
    if (!f.has_left) return 0;
    const long long x = (long long)i + q.off - f.left;
    return x < 0 ? 0 : (x > q.nk ? q.nk : (int)x);
}

static __device__ __forceinline__ int sm90_key_hi(const sm90_seq &q, const sm90_fwd_feat &f, int i)
{
    if (!f.has_right) return q.nk;
    const long long x = (long long)i + q.off + f.right + 1;
    return x < 0 ? 0 : (x > q.nk ? q.nk : (int)x);
}

/* Key blocks [first, first + n) that some row of the m-block starting at m0 sees. The plain
 * kernels walk from block 0 to the causal end; a feature kernel only over the band of its
 * first and last row, so the blocks outside a window are never loaded. Producer and
 * consumers compute the same range for the same tile, which keeps the pipeline's phases in
 * step. */
template <int BM, int BN, int FEAT>
static __device__ __forceinline__ void sm90_key_blocks(const sm90_fwd_params &p, const sm90_fwd_feat &f,
                                                       const sm90_seq &q, int m0, int &first, int &n)
{
    const int last = min(m0 + BM, q.nq) - 1;
    first = 0;
    if (FEAT >= 2 && m0 >= q.nq) { /* varlen: an m-block past a short sequence's end */
        n = 0;
    } else if (FEAT == 0 || FEAT == 3) {
        int n_end = q.nk;
        if (p.causal) n_end = min(n_end, last + q.off + 1);
        n = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    } else {
        const int lo = sm90_key_lo(q, f, m0), hi = sm90_key_hi(q, f, last);
        n = 0;
        if (lo < hi) {
            first = lo / BN;
            n = (hi + BN - 1) / BN - first;
        }
    }
}

/* Softcap and ALiBi on a block of raw scores, into the log2 domain (flashc.h's order: scale,
 * softcap, then the bias -slope |i + off - j|). slope2 is the slope times log2(e); d0 is
 * row0 + off - n0 - 2 (lane % 4), the distance of this thread's first score. tanhf rather than
 * the approximate instruction, whose error the softcap would multiply. */
template <int BN>
static __device__ __forceinline__ void sm90_transform(float (&s)[BN / 2], const sm90_fwd_feat &f,
                                                      float slope2, int d0)
{
    if (f.softcap_on) {
#pragma unroll
        for (int j = 0; j < BN / 2; j++) s[j] = f.softcap_log2 * tanhf(s[j] * f.softcap_pre);
    } else {
#pragma unroll
        for (int j = 0; j < BN / 2; j++) s[j] *= f.score_log2;
    }
    if (f.alibi_on) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            /* exact in float while the distance is below 2^24 */
            const float fd = (float)(d0 + 8 * hr);
#pragma unroll
            for (int j = 0; j < BN / 2; j++)
                if (((j >> 1) & 1) == hr) {
                    const int c = 8 * (j >> 2) + (j & 1);
                    s[j] -= slope2 * fabsf(fd - (float)c);
                }
        }
    }
}

/* The band mask of a feature kernel: -inf outside [key_lo(row), key_hi(row)) of each row. */
template <int BN>
static __device__ __forceinline__ void sm90_mask_band(float (&s)[BN / 2], int n0, int row0,
                                                      const sm90_seq &q, const sm90_fwd_feat &f,
                                                      int lane)
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = row0 + 8 * hr;
        const int lo = sm90_key_lo(q, f, row) - n0 - 2 * (lane & 3);
        const int hi = sm90_key_hi(q, f, row) - n0 - 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < BN / 2; j++)
            if (((j >> 1) & 1) == hr) {
                const int c = 8 * (j >> 2) + (j & 1);
                if (c < lo || c >= hi) s[j] = -INFINITY;
            }
    }
}

/* Sets to -inf the scores of keys that row r (two per thread) does not see. */
template <int BN>
static __device__ __forceinline__ void sm90_mask(float (&s)[BN / 2], int n0, int row0,
                                                 const sm90_fwd_params &p, const sm90_seq &q, int lane)
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = row0 + 8 * hr;
        int key_end = q.nk;
        if (p.causal) key_end = min(key_end, row + q.off + 1);
        const int lim = key_end - n0 - 2 * (lane & 3); /* column index bound in this block */
#pragma unroll
        for (int j = 0; j < BN / 2; j++)
            if (((j >> 1) & 1) == hr) {
                const int c = 8 * (j >> 2) + (j & 1);
                if (c >= lim) s[j] = -INFINITY;
            }
    }
}

/* Dropout on a block of P, after its row sums (which stay those of the undropped softmax, as
 * the LSE does): the dropped entries of rows row0 and row0 + 8 of tile (b, h) become 0, the
 * kept ones get their 1 / (1 - p) once, in the epilogue. */
template <int BN>
static __device__ __forceinline__ void sm90_dropout(float (&s)[BN / 2], const sm90_fwd_feat &f,
                                                    const sm90_fwd_params &p, int b, int h,
                                                    int row0, int n0, int lane)
{
    static_assert(BN <= 128, "two keep bits per 8-key tile in 32 bits");
    const uint64_t w = f.drop_offset + (uint64_t)((int64_t)b * p.heads_q + h);
    uint32_t keep[2];
    fc_keep_rows<BN / 8>(f.drop, w, row0, n0, lane & 3, keep);
#pragma unroll
    for (int j = 0; j < BN / 2; j++)
        if (!((keep[(j >> 1) & 1] >> (2 * (j >> 2) + (j & 1))) & 1)) s[j] = 0.f;
}

template <int BN, int BF16>
static __device__ __forceinline__ void sm90_pack_p(uint32_t (&pf)[BN / 16][4],
                                                   const float (&s)[BN / 2])
{
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) pf[kk][r] = sm90_pack2<BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

/* Issues S = Q_wg K^T over the head dim, D / 16 wgmmas, as one commit group (the Q tile's
 * 64-column panels are BM rows apart). */
template <int D, int BN, int BM, int BF16>
static __device__ __forceinline__ void sm90_issue_qk(float (&s)[BN / 2], uint32_t q_rows,
                                                     uint32_t k_tile)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t koff = (kk & 3) * 32;
        const uint64_t da = sm90_desc_kmajor(q_rows, (kk >> 2) * (BM * 128), koff);
        const uint64_t db = sm90_desc_kmajor(k_tile, (kk >> 2) * (BN * 128), koff);
        sm90_wgmma_ss<BN, BF16, 0>(s, da, db, kk > 0);
    }
    sm90_wgmma_commit();
}

/* Issues O += P V over the BN keys of the block, BN / 16 wgmmas, as one commit group. */
template <int D, int BN, int BF16>
static __device__ __forceinline__ void sm90_issue_pv(float (&o)[D / 2],
                                                     const uint32_t (&pf)[BN / 16][4],
                                                     uint32_t v_tile)
{
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        const uint64_t db = sm90_desc_mnmajor(v_tile, BN * 128, kk * 16 * 128);
        sm90_wgmma_rs<D, BF16, 1>(o, pf[kk], db, 1);
    }
    sm90_wgmma_commit();
}

/* Zeroes rows [from, BN) of a V tile: in a varlen batch they hold the next sequence's first
 * values, which P (zero there) would otherwise multiply. Each of the NC consumer warpgroups
 * clears its share of the chunks; all wait for each other before any P V product reads the
 * tile. */
template <int D, int BN, int NC>
static __device__ __forceinline__ void sm90_zero_v_rows(uint32_t v_tile, int from, int cw, int t)
{
    sm90_zero_tile_rows<D / 64>(v_tile, BN, from, cw * 128 + t, NC * 128);
    sm90_bar_sync(SM90_BAR_VTAIL, NC * 128);
}

/* Stores rows [0, nrows) of a consumer's 64 O rows from the swizzled Q tile with plain 16-byte
 * stores (a varlen sequence's last tile, whose rows past the sequence belong to the next). */
template <int D, int BM>
static __device__ __forceinline__ void sm90_store_o_rows(const sm90_fwd_feat &f, uint32_t q_rows, const sm90_seq &sq,
                                                         int wrow0, int nrows, int h, int t)
{
    constexpr int CHUNKS = D / 8;
    for (int c = t; c < nrows * CHUNKS; c += 128) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        if (ch * 8 >= f.head_dim) continue; /* the padded columns of a smaller head dim */
        const uint32_t addr = q_rows + (ch >> 3) * (BM * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        uint32_t v0, v1, v2, v3;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                     : "r"(addr));
        uint16_t *dst = f.o + sq.tb * f.o_sb + (int64_t)(sq.q0 + wrow0 + r) * f.o_ss + h * f.o_sh + ch * 8;
        *(uint4 *)dst = make_uint4(v0, v1, v2, v3);
    }
}

/* FEAT = 0: plain attention (causal or not). FEAT = 1 adds the window, softcap, ALiBi and
 * dropout of sm90_fwd_feat behind uniform run-time branches: the key loop covers the tile's
 * band only, each block's scores are transformed and band-masked before the softmax, and its
 * P loses the dropped entries after it. FEAT = 2
 * is FEAT = 1 over a variable-length batch (its own instantiation: the per-sequence bounds
 * live in registers, which the fixed-length kernels read from the parameters instead), and
 * FEAT = 3 is FEAT = 0 over one: per-sequence bounds and causal masking only, without the
 * band, transform and dropout state that would otherwise hold registers across the loop. */
template <int D, int BN, int STAGES, int NC, int BF16, int FEAT>
__global__ void __launch_bounds__(sm90_cta<NC>::THREADS, 1)
fc_sm90_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                   const sm90_fwd_params p, const sm90_fwd_feat f)
{
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef sm90_fwd_layout<D, BN, STAGES, NC> L;
    constexpr int BM = sm90_cta<NC>::BM;
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256, "tile shape");
    constexpr bool VARLEN = FEAT >= 2, FEATS = FEAT == 1 || FEAT == 2;

    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = sm90_smem_addr(smem_raw);
    uint8_t *smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    const uint32_t sbase = sm90_smem_addr(smem);
    const uint32_t sQ = sbase;
    uint64_t *bars = (uint64_t *)(smem + L::BAR_OFF);
    uint64_t *q_full = bars;
    uint64_t *k_full = bars + 1, *k_empty = bars + 1 + STAGES;
    uint64_t *v_full = bars + 1 + 2 * STAGES, *v_empty = bars + 1 + 3 * STAGES;

    uint64_t *q_empty = bars + 1 + 4 * STAGES;
    uint64_t *o_empty = bars + 2 + 4 * STAGES; /* O_IN_V only */
    volatile int *tile_slot = (volatile int *)(smem + L::TILE_OFF);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;

    if (tid == 0) {
        sm90_mbar_init(q_full, 1);
        /* Every consumer thread arrives once it is done with the Q tile: after the tile's last
         * S = Q K^T where O has a tile of its own or the V ring stages it, else once it has
         * written its O into the Q tile (the phase then completes after both O stores have
         * also been read out by the copy engine). */
        sm90_mbar_init(q_empty, NC * 128);
        /* O_IN_V: every consumer thread arrives once the copy engine has read its O out of the
         * V ring (the thread that issued the store waits for that first) */
        if (L::O_IN_V) sm90_mbar_init(o_empty, NC * 128);
        for (int s = 0; s < STAGES; s++) {
            sm90_mbar_init(&k_full[s], 1);
            sm90_mbar_init(&v_full[s], 1);
            sm90_mbar_init(&k_empty[s], NC); /* one arrival per consumer warpgroup */
            sm90_mbar_init(&v_empty[s], NC);
        }
        sm90_mbar_init_fence();
    }
    __syncthreads();

    /* The CTA is persistent. The producer picks each tile and hands its index to the
     * consumers in tile_slot, published by the q_full arrival (release) and read after the
     * q_full wait (acquire); index num_tiles tells them to stop. The K/V ring's stage and
     * parity run on across tiles (it counts every key block this CTA has loaded), and the Q
     * tile is refilled (and tile_slot rewritten) only once every consumer is done with it
     * (q_empty): with a separate O tile or O in the V ring, once its last S = Q K^T has
     * retired; where the Q tile also stages the O store, once that store has read it. The next tile's first K block
     * loads during the epilogue either way. */
    if (wg == 0) {
        /* ---------------- producer ---------------- */
        sm90_setmaxnreg_dec<SM90_PRODUCER_REGS>();
        if (warp == 0 && sm90_elect_one()) {
            sm90_tma_prefetch_desc(&tm_q);
            sm90_tma_prefetch_desc(&tm_k);
            sm90_tma_prefetch_desc(&tm_v);
            int s = 0;
            uint32_t ph = 0, tile_ph = 0;
            for (int tile = blockIdx.x;;) {
                if (tile >= p.num_tiles) {
                    sm90_mbar_wait(q_empty, tile_ph ^ 1);
                    *tile_slot = p.num_tiles;
                    sm90_mbar_arrive(q_full);
                    break;
                }
                int m_block, h, b;
                sm90_tile(tile, p, m_block, h, b);
                const sm90_seq sq = sm90_seq_of<FEAT>(p, f, b);
                const int hk = h / p.group, m0 = m_block * BM;
                int first_block, n_blocks;
                sm90_key_blocks<BM, BN, FEAT>(p, f, sq, m0, first_block, n_blocks);
                /* q_full completes once per tile, also for a tile that sees no key (its
                 * consumers only store zeros): that keeps the consumers from running more
                 * than one q_empty phase ahead of the producer's wait, which parity waits
                 * cannot tell apart. */
                if (n_blocks == 0) {
                    sm90_mbar_wait(q_empty, tile_ph ^ 1);
                    tile_ph ^= 1;
                    /* O_IN_V: the last tile's O read out before this one's consumers (who load
                     * no V) can stage theirs, so that o_empty runs no more than a phase ahead */
                    if (L::O_IN_V) sm90_mbar_wait(o_empty, tile_ph);
                    *tile_slot = tile;
                    sm90_mbar_arrive(q_full);
                }
                for (int i = 0; i < n_blocks; i++) {
                    const int n0 = (first_block + n_blocks - 1 - i) * BN;
                    const uint32_t kt = sbase + L::K_OFF + s * L::KV_BYTES;
                    const uint32_t vt = sbase + L::V_OFF + s * L::KV_BYTES;
                    sm90_mbar_wait(&k_empty[s], ph ^ 1);
                    sm90_mbar_arrive_expect_tx(&k_full[s], L::KV_BYTES);
#pragma unroll
                    for (int pn = 0; pn < L::PANELS; pn++)
                        sm90_tma_load_4d(kt + pn * (BN * 128), &tm_k, &k_full[s], pn * 64, sq.k0 + n0, hk, sq.tb);
                    if (i == 0) {
                        /* Q after the first K block, so that K is already on its way while
                         * the consumers store the previous tile's O out of the Q tile. */
                        sm90_mbar_wait(q_empty, tile_ph ^ 1);
                        tile_ph ^= 1;
                        *tile_slot = tile;
                        sm90_mbar_arrive_expect_tx(q_full, L::Q_BYTES);
#pragma unroll
                        for (int pn = 0; pn < L::PANELS; pn++)
                            sm90_tma_load_4d(sQ + pn * (BM * 128), &tm_q, q_full, pn * 64, sq.q0 + m0, h, sq.tb);
                        /* O_IN_V: the V ring is free once the last tile's O is read out */
                        if (L::O_IN_V) sm90_mbar_wait(o_empty, tile_ph);
                    }
                    sm90_mbar_wait(&v_empty[s], ph ^ 1);
                    sm90_mbar_arrive_expect_tx(&v_full[s], L::KV_BYTES);
#pragma unroll
                    for (int pn = 0; pn < L::PANELS; pn++)
                        sm90_tma_load_4d(vt + pn * (BN * 128), &tm_v, &v_full[s], pn * 64, sq.k0 + n0, hk, sq.tb);
                    if (++s == STAGES) s = 0, ph ^= 1;
                }
                tile = p.tile_counter ? (int)gridDim.x + atomicAdd(p.tile_counter, 1)
                                      : tile + (int)gridDim.x;
            }
        }
        /* The other producer threads have nothing to do; they leave (no barrier below counts
         * them). */
    } else {
        /* ---------------- consumers ---------------- */
        sm90_setmaxnreg_inc<sm90_cta<NC>::CONSUMER_REGS>();
        /* consumer index 0 .. NC-1 */
        const int cw = FC_SM90_FWD_UNIFORM_CW && (D <= 128 || FEAT == 0) ? sm90_warp_uniform(wg - 1) : wg - 1;
        const int t = tid - 128 * wg;      /* thread within the warpgroup */
        const uint32_t q_rows = sQ + cw * 64 * 128;
        const uint32_t o_rows = (L::SEP_O || L::O_IN_V ? sbase + L::O_OFF : sQ) + cw * 64 * 128;
        const int my_bar = SM90_BAR_SCHED0 + cw, other_bar = SM90_BAR_SCHED0 + (cw + 1) % NC;
        int blocks_done = 0;   /* key blocks of earlier tiles: the ring position */
        uint32_t q_ph = 0;     /* parity of q_full: flips on every tile */
        bool token_out = false; /* early token: the last consumer has handed one over */

        for (;;) {
            sm90_mbar_wait(q_full, q_ph); /* Q is in, or (no key) the tile is ours to store */
            q_ph ^= 1;
            const int tile = *tile_slot;
            if (tile >= p.num_tiles) break;
            int m_block, h, b;
            sm90_tile(tile, p, m_block, h, b);
            const sm90_seq sq = sm90_seq_of<FEAT>(p, f, b);
            const int m0 = m_block * BM;
            int first_block, n_blocks;
            sm90_key_blocks<BM, BN, FEAT>(p, f, sq, m0, first_block, n_blocks);
            const int wrow0 = m0 + cw * 64;    /* first query row of this warpgroup */
            const int row0 = wrow0 + (warp & 3) * 16 + (lane >> 2); /* this thread's rows: +0, +8 */

            float o[D / 2];
#pragma unroll
            for (int j = 0; j < D / 2; j++) o[j] = 0.f;
            float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

            if (n_blocks > 0) {
                float s[BN / 2];
                uint32_t pf[BN / 16][4];
                float corr[2];
                /* Whether a block needs the mask: it reaches past seqlen_k or crosses the causal
                 * diagonal of this warpgroup's first row; in a feature kernel, it reaches past
                 * the band's end of the warpgroup's first row or before the band's start of
                 * its last row. */
                int band_lo_last = 0, band_hi_first = 0, alibi_d0 = 0;
                float slope2 = 0.f;
                if (FEATS) {
                    band_lo_last = sm90_key_lo(sq, f, wrow0 + 63);
                    band_hi_first = sm90_key_hi(sq, f, wrow0);
                    alibi_d0 = row0 + sq.off - 2 * (lane & 3);
                    if (f.alibi_on) slope2 = f.alibi[b * f.alibi_sb + h] * 1.4426950408889634f;
                }
#define SM90_NEED_MASK(n0_)                                                                     \
        (FEATS ? ((n0_) < band_lo_last || (n0_) + BN > band_hi_first)                            \
              : ((n0_) + BN > sq.nk || (p.causal && (n0_) + BN - 1 > wrow0 + sq.off)))
#define SM90_SCORES(n0_)                                                                        \
        do {                                                                                    \
            if (FEATS) {                                                                        \
                if (f.transform) sm90_transform<BN>(s, f, slope2, alibi_d0 - (n0_));            \
                if (SM90_NEED_MASK(n0_)) sm90_mask_band<BN>(s, n0_, row0, sq, f, lane);         \
            } else if (SM90_NEED_MASK(n0_)) {                                                   \
                sm90_mask<BN>(s, n0_, row0, p, sq, lane);                                       \
            }                                                                                   \
        } while (0)

                /* consumer 0 issues first: the last one hands it the token (with the early
                 * token, only before its first tile; then at each tile's last P V) */
                if (cw == NC - 1 && !(FC_SM90_FWD_EARLY_TOKEN && token_out))
                    sm90_bar_arrive(SM90_BAR_SCHED0, 256);
                token_out = true;

                /* Block i (i = 0 .. nb-1) is key block nb-1-i; K_i and V_i sit in ring slot
                 * (blocks_done + i) % STAGES, filled for the ((blocks_done + i) / STAGES)-th
                 * time (the parity). */
#define SM90_STAGE(i_) ((blocks_done + (i_)) % STAGES)
#define SM90_PHASE(i_) ((uint32_t)(((blocks_done + (i_)) / STAGES) & 1))

                int n0 = (first_block + n_blocks - 1) * BN;
                /* varlen: the rows of the top block's V tile from vtail on are the next
                 * sequence's */
                const int vtail = VARLEN && n0 + BN > sq.nk && sq.k0 + sq.nk < p.seqlen_k ? sq.nk - n0 : BN;
                /* The blocks at the top of the walk that none of this warpgroup's rows sees
                 * (at least one block is kept: a warpgroup whose rows see no key at all runs
                 * one masked block, as before). d128 tiles are as tall as their blocks; at
                 * d256 the skip spills. */
                int skip = 0;
                if (FC_SM90_FWD_DIAG_SKIP && BM > BN && D <= 128 && (FEAT == 0 || FEAT == 3) && p.causal) {
                    const int own_end = min(sq.nk, min(wrow0 + 64, sq.nq) + sq.off); /* keys it sees */
                    const int own_blocks = own_end > 0 ? (own_end + BN - 1) / BN : 0;
                    skip = max(0, min(n_blocks - own_blocks, n_blocks - 1));
                    /* all consumers clear those rows together, on one barrier reached from the
                     * same place in every warp: a tile that has them skips nothing */
                    if (VARLEN && vtail < BN) skip = 0;
                    /* the ring position follows the count: without this, its stage addresses
                     * and descriptors leave the uniform registers (non-causal tiles too, -12%) */
                    skip = sm90_warp_uniform(skip);
                }
                for (int i = 0; i < skip; i++) {
                    /* a stage is released only once it is filled: an arrival before the fill
                     * would count towards the release of the fill before it */
                    sm90_mbar_wait(&k_full[SM90_STAGE(i)], SM90_PHASE(i));
                    if (t == 0) sm90_mbar_arrive(&k_empty[SM90_STAGE(i)]);
                    sm90_bar_sync(my_bar, 256);
                    sm90_bar_arrive(other_bar, 256);
                    sm90_mbar_wait(&v_full[SM90_STAGE(i)], SM90_PHASE(i));
                    if (t == 0) sm90_mbar_arrive(&v_empty[SM90_STAGE(i)]);
                }
                blocks_done += skip;
                const int nb = n_blocks - skip; /* the blocks this warpgroup computes */
                n0 -= skip * BN;

                /* Block 0: S only. */
                sm90_mbar_wait(&k_full[SM90_STAGE(0)], SM90_PHASE(0));
                sm90_bar_sync(my_bar, 256);
                sm90_wgmma_fence();
                sm90_issue_qk<D, BN, BM, BF16>(s, q_rows, sbase + L::K_OFF + SM90_STAGE(0) * L::KV_BYTES);
                sm90_bar_arrive(other_bar, 256);
                sm90_fence_regs(s);
                sm90_wgmma_wait<0>();
                sm90_fence_regs(s);
                if (t == 0) sm90_mbar_arrive(&k_empty[SM90_STAGE(0)]);
                if (L::Q_FREE_EARLY && nb == 1) sm90_mbar_arrive(q_empty); /* Q's last reader retired */
                SM90_SCORES(n0);
                sm90_online_softmax<BN>(s, m, l, corr, p.scale_log2);
                if constexpr (FEATS)
                    if (f.drop_on) sm90_dropout<BN>(s, f, p, b, h, row0, n0, lane);

                for (int i = 1; i < nb; i++) {
                    /* Finish block i-1 first: wait for the P V product of block i-2 (issued in the
                     * previous iteration, overlapped with the softmax of block i-1), then rescale
                     * O and pack P_{i-1} over the A registers that product was reading. Doing this
                     * at the top of the loop, not right after the softmax, keeps the wait in
                     * another basic block than the exponentials: in one block, ptxas hoists the
                     * wait above them (to let the packs, which overwrite the registers the
                     * in-flight product reads, interleave with the exponentials) and the overlap
                     * is lost. */
                    sm90_wgmma_wait<0>();
                    sm90_fence_regs(o);
                    sm90_fence_regs(pf);
                    if (i >= 2 && t == 0) sm90_mbar_arrive(&v_empty[SM90_STAGE(i - 2)]);
#pragma unroll
                    for (int j = 0; j < D / 2; j++) o[j] *= corr[(j >> 1) & 1];
                    sm90_pack_p<BN, BF16>(pf, s);

                    n0 -= BN;
                    sm90_mbar_wait(&k_full[SM90_STAGE(i)], SM90_PHASE(i));
                    sm90_mbar_wait(&v_full[SM90_STAGE(i - 1)], SM90_PHASE(i - 1));
                    if (VARLEN && i == 1 && vtail < BN)
                        sm90_zero_v_rows<D, BN, NC>(sbase + L::V_OFF + SM90_STAGE(0) * L::KV_BYTES, vtail, cw, t);
                    sm90_bar_sync(my_bar, 256);
                    sm90_wgmma_fence();
                    sm90_issue_qk<D, BN, BM, BF16>(s, q_rows, sbase + L::K_OFF + SM90_STAGE(i) * L::KV_BYTES);
                    sm90_issue_pv<D, BN, BF16>(o, pf, sbase + L::V_OFF + SM90_STAGE(i - 1) * L::KV_BYTES);
                    sm90_bar_arrive(other_bar, 256);
                    sm90_fence_regs(s);
                    sm90_fence_regs(o);
                    sm90_fence_regs(pf);
                    sm90_wgmma_wait<1>(); /* S_i is in; the P V product may still run */
                    sm90_fence_regs(s);
                    if (t == 0) sm90_mbar_arrive(&k_empty[SM90_STAGE(i)]);
                    if (L::Q_FREE_EARLY && i == nb - 1) sm90_mbar_arrive(q_empty);
                    SM90_SCORES(n0);
                    sm90_online_softmax<BN>(s, m, l, corr, p.scale_log2);
                    if constexpr (FEATS)
                        if (f.drop_on) sm90_dropout<BN>(s, f, p, b, h, row0, n0, lane);
                }

                /* Last: finish block nb-1 and issue its P V. Without the early token the
                 * last consumer skips the hand-over (it hands consumer 0 the token at the next
                 * tile's start), so that every arrival on a scheduling barrier meets a sync
                 * within the tile. */
                sm90_wgmma_wait<0>();
                sm90_fence_regs(o);
                sm90_fence_regs(pf);
                if (nb >= 2 && t == 0) sm90_mbar_arrive(&v_empty[SM90_STAGE(nb - 2)]);
#pragma unroll
                for (int j = 0; j < D / 2; j++) o[j] *= corr[(j >> 1) & 1];
                sm90_pack_p<BN, BF16>(pf, s);
                sm90_mbar_wait(&v_full[SM90_STAGE(nb - 1)], SM90_PHASE(nb - 1));
                if (VARLEN && nb == 1 && vtail < BN)
                    sm90_zero_v_rows<D, BN, NC>(sbase + L::V_OFF + SM90_STAGE(0) * L::KV_BYTES, vtail, cw, t);
                sm90_bar_sync(my_bar, 256);
                sm90_wgmma_fence();
                sm90_issue_pv<D, BN, BF16>(o, pf, sbase + L::V_OFF + SM90_STAGE(nb - 1) * L::KV_BYTES);
                if (cw != NC - 1 || FC_SM90_FWD_EARLY_TOKEN) sm90_bar_arrive(other_bar, 256);
                sm90_fence_regs(o);
                sm90_fence_regs(pf);
                sm90_wgmma_wait<0>();
                sm90_fence_regs(o);
                if (t == 0) sm90_mbar_arrive(&v_empty[SM90_STAGE(nb - 1)]);
                blocks_done += nb;
#undef SM90_STAGE
#undef SM90_PHASE
#undef SM90_NEED_MASK
#undef SM90_SCORES
            }

            /* ---------------- epilogue ---------------- */
            /* the tile's rows again, read anew rather than kept live through the key loop (at
             * d256 the registers are short) */
            const sm90_seq so = sm90_seq_of<FEAT>(p, f, b);
            float inv[2], lse_v[2];
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const float sum = sm90_quad_sum(l[hr]);
                inv[hr] = sum > 0.f ? (FEATS && f.drop_on ? f.drop_scale : 1.f) / sum : 0.f;
                lse_v[hr] = sum > 0.f ? (m[hr] + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
            }
            /* O in 16 bits into this warpgroup's 64 rows of the O tile, in the 128-byte-swizzled
             * layout the O tensor map expects. A separate O tile is free once the copy engine
             * has read the last tile's O out of it; the Q tile (without one) is, since its
             * last reader, S = Q K^T, has retired. */
            if (L::SEP_O) {
                if (t == 0) sm90_bulk_wait_read();
                sm90_bar_sync(SM90_BAR_EPI0 + cw, 128);
            }
            /* O_IN_V: every consumer's last P V has read the V ring (the producer loads no V of
             * the next tile before o_empty) */
            if (L::O_IN_V) sm90_bar_sync(SM90_BAR_O_IN_V, NC * 128);
            const int lr = (warp & 3) * 16 + (lane >> 2); /* row within the warpgroup's 64 */
#pragma unroll
            for (int j = 0; j < D / 2; j += 2) {
                const int hr = (j >> 1) & 1;
                const int r = lr + 8 * hr;
                const int col = 8 * (j >> 2) + 2 * (lane & 3);
                const int pn = col >> 6, c = col & 63;
                const uint32_t addr = o_rows + pn * (BM * 128) + r * 128 +
                                      ((((c >> 3) ^ (r & 7)) << 4) | ((c & 7) * 2));
                const uint32_t v = sm90_pack2<BF16>(o[j] * inv[hr], o[j + 1] * inv[hr]);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
            }
            sm90_fence_proxy_async();
            sm90_bar_sync(SM90_BAR_EPI0 + cw, 128);
            /* TMA clips rows only at the tensor's end: a varlen sequence's last rows go by hand */
            const bool by_hand = VARLEN && wrow0 < so.nq && wrow0 + 64 > so.nq;
            const bool by_tma = wrow0 < so.nq && !by_hand;
            if (t == 0 && by_tma) {
#pragma unroll
                for (int pn = 0; pn < L::PANELS; pn++)
                    sm90_tma_store_4d(&tm_o, o_rows + pn * (BM * 128), pn * 64, so.q0 + wrow0, h, so.tb);
                sm90_bulk_commit();
            }
            if (VARLEN && by_hand) sm90_store_o_rows<D, BM>(f, o_rows, so, wrow0, so.nq - wrow0, h, t);
            if ((lane & 3) == 0) {
                float *lse = p.lse + so.tb * p.lse_sb + h * p.lse_sh;
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    if (row0 + 8 * hr < so.nq) lse[(int64_t)(so.q0 + row0 + 8 * hr) * p.lse_ss] = lse_v[hr];
            }
            /* Without a separate O tile, the Q tile may be refilled (the next tile's Q) once the
             * copy engine has read this warpgroup's O out of it; the other threads' shared
             * stores are ordered before the store by the named barrier above. With one, Q was
             * released after the last S, or here for a tile that saw no key. */
            if (L::O_IN_V) {
                if (t == 0 && by_tma) sm90_bulk_wait_read();
                sm90_mbar_arrive(o_empty);
                if (n_blocks == 0) sm90_mbar_arrive(q_empty);
            } else if (!L::SEP_O) {
                if (t == 0 && by_tma) sm90_bulk_wait_read();
                sm90_mbar_arrive(q_empty);
            } else if (n_blocks == 0) {
                sm90_mbar_arrive(q_empty);
            }
        }
        /* early token: the last consumer's hand-over after the CTA's last tile */
        if (FC_SM90_FWD_EARLY_TOKEN && cw == 0 && token_out) sm90_bar_sync(SM90_BAR_SCHED0, 256);
        /* the last O store must have read its tile before the CTA's shared memory goes */
        if (L::SEP_O && t == 0) sm90_bulk_wait_read();
    }
#endif
}

/* ---- host side ------------------------------------------------------------------------------ */

/* Tile shapes per head dim and kernel kind, SM90_PLAIN (causal or not, fixed-length or varlen)
 * or SM90_FEAT (window, softcap, ALiBi, dropout): keys per block BN, pipeline stages and
 * consumer warpgroups NC (query rows BM = 64 NC). Registers per consumer thread: S BN/2 + P
 * BN/4 + O D/2. d64 plain: three consumers of 160 registers (64 + 32 + 32 live), so that two
 * warpgroups' exponentials run while the third's GEMMs hold the tensor cores (d64 is the head
 * dim where the exponentials nearly match the GEMM time); its feature kernels keep two (with
 * three, the band and ALiBi state spill 56-68 bytes; sm90_launch_kind). d128: 128 x 128
 * (176-key blocks measured 0-4% slower at 2k-4k). d256 plain: 80-key blocks (Q 64 KB + 2
 * stages of K and V at 40 KB fill 225 KB of shared memory); its feature kernels keep 64 (at
 * 80 they spill).
 * FC_SM90_FWD_TILES=0 builds the earlier shapes (BM 128 everywhere, BN 128 / 128 / 64), kept
 * for same-run comparisons in the standalone check. */
#define SM90_PLAIN 0
#define SM90_FEAT 1
/* A varlen batch without window, softcap, ALiBi or dropout on the plain kernels' tile shapes
 * and code (FEAT 3) rather than the feature kernel's (FEAT 2); 0 keeps FEAT 2 for every varlen
 * batch, for comparisons. */
#ifndef FC_SM90_FWD_VARLEN_PLAIN
#define FC_SM90_FWD_VARLEN_PLAIN 1
#endif
#if defined(FC_SM90_FWD_TILES) && FC_SM90_FWD_TILES == 0
#define FC_SM90_FWD_TILES_DEFAULT 0
#define FC_SM90_FWD_CONFIGS(X)                                                                  \
    X(64, SM90_PLAIN, 128, 2, 2) X(128, SM90_PLAIN, 128, 2, 2) X(256, SM90_PLAIN, 64, 2, 2)     \
    X(64, SM90_FEAT, 128, 2, 2) X(128, SM90_FEAT, 128, 2, 2) X(256, SM90_FEAT, 64, 2, 2)
#else
#define FC_SM90_FWD_TILES_DEFAULT 1
#define FC_SM90_FWD_CONFIGS(X)                                                                  \
    X(64, SM90_PLAIN, 128, 2, 3) X(128, SM90_PLAIN, 128, 2, 2) X(256, SM90_PLAIN, 80, 2, 2)     \
    X(64, SM90_FEAT, 128, 2, 2) X(128, SM90_FEAT, 128, 2, 2) X(256, SM90_FEAT, 64, 2, 2)
#endif

/* The compiled head dim that serves head_dim: a multiple of 8 above 32 runs on the next
 * kernel up, its extra columns zero-filled by TMA on load and clipped on store (d32 and below
 * do better on the mma.sync path, where half a 64-column panel is not wasted). 0 = none. */
int fc_sm90_kernel_head_dim(int head_dim)
{
    if (head_dim <= 32 || head_dim > 256 || head_dim % 8 != 0) return 0;
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/* The most that any kind of kernel for head_dim takes. */
size_t fc_sm90_forward_smem_bytes(int head_dim)
{
    const int kd = fc_sm90_kernel_head_dim(head_dim);
    size_t most = 0;
#define X(D_, KIND_, BN_, ST_, NC_) \
    if (kd == D_ && sm90_fwd_layout<D_, BN_, ST_, NC_>::TOTAL > most) most = sm90_fwd_layout<D_, BN_, ST_, NC_>::TOTAL;
    FC_SM90_FWD_CONFIGS(X)
#undef X
    return most;
}

static int stride_ok(int64_t stride, int64_t extent)
{
    /* a dimension of one element is never stepped along: its stride does not matter */
    if (extent <= 1) return 1;
    return stride > 0 && stride % 8 == 0 && stride < (1ll << 39);
}

int fc_sm90_forward_supported(const fc_sm90_fwd_args *a, int sm_major, int sm_minor,
                              size_t smem_optin)
{
    if (sm_major != 9 || sm_minor != 0) return 0; /* sm_90a code runs on 9.0 only */
    const size_t need = fc_sm90_forward_smem_bytes(a->head_dim);
    if (need == 0 || need > smem_optin) return 0;
    if (!(a->scale > 0.f) || !isfinite(a->scale)) return 0; /* the row max is taken unscaled */
    if (a->causal < 0 || a->causal > 2) return 0;
    if (a->window && (a->window_left < -1 || a->window_right < -1)) return 0;
    if (!(a->softcap >= 0.f) || !isfinite(a->softcap)) return 0;
    if (!(a->dropout_p >= 0.f && a->dropout_p < 1.f)) return 0;
    if (a->alibi_slopes && ((uintptr_t)a->alibi_slopes % 4 != 0 || a->alibi_batch_stride < 0))
        return 0;
    if (a->batch < 0 || a->batch > 65535 || a->heads_q < 1 || a->heads_q > 65535) return 0;
    if (a->heads_kv < 1 || a->heads_q % a->heads_kv != 0) return 0;
    if (a->seqlen_q < 0 || a->seqlen_k < 0 || a->seqlen_q > 0x7fff0000 || a->seqlen_k > 0x7fff0000)
        return 0;
    if (a->cu_seqlens_q || a->cu_seqlens_k) {
        /* varlen up to d128: at d256 the per-sequence bounds would spill (mma.sync serves it) */
        if (fc_sm90_kernel_head_dim(a->head_dim) > 128) return 0;
        if (!a->cu_seqlens_q || !a->cu_seqlens_k || a->batch != 1 || a->num_seqs < 1 ||
            a->max_seqlen_q < 1 || a->max_seqlen_k < 0 || (uintptr_t)a->cu_seqlens_q % 4 != 0 ||
            (uintptr_t)a->cu_seqlens_k % 4 != 0)
            return 0;
        /* the tile count must fit an int (at the smallest tile, 64 rows) */
        const int64_t tiles = (int64_t)(a->max_seqlen_q + 63) / 64 * a->heads_q * a->num_seqs;
        if (tiles > 0x7fff0000) return 0;
    }
    const void *ptrs[4] = {a->q, a->k, a->v, a->o};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0) return 0; /* TMA needs 16-byte aligned tensors */
    if (!stride_ok(a->q_sb, a->batch) || !stride_ok(a->q_ss, a->seqlen_q) || !stride_ok(a->q_sh, a->heads_q) ||
        !stride_ok(a->k_sb, a->batch) || !stride_ok(a->k_ss, a->seqlen_k) || !stride_ok(a->k_sh, a->heads_kv) ||
        !stride_ok(a->v_sb, a->batch) || !stride_ok(a->v_ss, a->seqlen_k) || !stride_ok(a->v_sh, a->heads_kv) ||
        !stride_ok(a->o_sb, a->batch) || !stride_ok(a->o_ss, a->seqlen_q) || !stride_ok(a->o_sh, a->heads_q))
        return 0;
    return 1;
}

/* rows and seqs: the query rows and sequences that the tiles of BM rows cover. */
template <int D, int BN, int STAGES, int NC, int BF16, int FEAT>
static cudaError_t sm90_launch(const fc_sm90_fwd_args *a, const sm90_fwd_params *p, const sm90_fwd_feat *f,
                               int rows, int seqs, cudaStream_t stream)
{
    constexpr int BM = sm90_cta<NC>::BM;
    CUtensorMap tq, tk, tv, to;
    if (!fc_sm90_encode_map(&tq, a->q, BF16, a->head_dim, a->seqlen_q, a->heads_q, a->batch, a->q_ss, a->q_sh, a->q_sb,
                     BM) ||
        !fc_sm90_encode_map(&tk, a->k, BF16, a->head_dim, a->seqlen_k, a->heads_kv, a->batch, a->k_ss, a->k_sh, a->k_sb, BN) ||
        !fc_sm90_encode_map(&tv, a->v, BF16, a->head_dim, a->seqlen_k, a->heads_kv, a->batch, a->v_ss, a->v_sh, a->v_sb, BN) ||
        !fc_sm90_encode_map(&to, a->o, BF16, a->head_dim, a->seqlen_q, a->heads_q, a->batch, a->o_ss, a->o_sh, a->o_sb, 64))
        return cudaErrorInvalidValue;
    const uint32_t smem = sm90_fwd_layout<D, BN, STAGES, NC>::TOTAL;
    cudaError_t err = cudaFuncSetAttribute(fc_sm90_fwd_kernel<D, BN, STAGES, NC, BF16, FEAT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    sm90_fwd_params kp = *p;
    kp.m_blocks = (rows + BM - 1) / BM;
    kp.num_tiles = kp.m_blocks * a->heads_q * seqs;
    if (kp.num_tiles == 0) return cudaSuccess;
    p = &kp;
    /* Persistent: one CTA per SM (each takes a whole SM's shared memory) walks the tiles.
     * FLASHC_SM90_CTAS overrides the count for tests and comparisons: 0 launches one CTA per
     * tile, n > 0 at most n CTAs (so that each walks many tiles). */
    int ctas = p->num_tiles;
    static const long ctas_forced = sm90_env_long("FLASHC_SM90_CTAS", LONG_MIN); /* LONG_MIN: unset */
    if (ctas_forced != LONG_MIN) {
        if (ctas_forced > 0 && ctas_forced < ctas) ctas = (int)ctas_forced;
    } else {
        int dev = 0, sms = 0;
        err = cudaGetDevice(&dev);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (err != cudaSuccess) return err;
        if (sms > 0 && sms < ctas) ctas = sms;
    }
    /* Causal tiles differ in length: they are taken from a counter as CTAs free up (a
     * stream-ordered int, zeroed before the kernel and freed behind it). Equal non-causal
     * tiles are walked in fixed strides. FLASHC_SM90_SCHED=static forces strides. */
    static const int sched_static = sm90_env_is("FLASHC_SM90_SCHED", "static");
    /* A band (causal or a window) makes tiles unequal too, and so do varlen sequences. */
    const int dynamic =
        (p->causal || f->has_left || f->has_right || f->varlen) && ctas < p->num_tiles && !sched_static;
    if (dynamic) {
        err = cudaMallocAsync((void **)&kp.tile_counter, sizeof(int), stream);
        if (err != cudaSuccess) return err;
        err = cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream);
    }
    if (err == cudaSuccess) {
        fc_sm90_fwd_kernel<D, BN, STAGES, NC, BF16, FEAT><<<dim3((unsigned)ctas), sm90_cta<NC>::THREADS, smem, stream>>>(
            tq, tk, tv, to, kp, *f);
        err = cudaGetLastError();
    }
    if (dynamic) {
        const cudaError_t err2 = cudaFreeAsync(kp.tile_counter, stream);
        if (err == cudaSuccess) err = err2;
    }
    return err;
}

/* The kernel of one kind: plain (FEAT 0; FEAT 3 for a varlen batch, on the plain kernel's
 * tile shape: three consumer warpgroups at d64, no spills) or features (FEAT 1; FEAT 2 for a
 * varlen batch), the varlen ones compiled up to d128 only. The d64 feature kernels keep two
 * consumers: with three, ptxas spills their band state (56-68 bytes). Without
 * FC_SM90_FWD_VARLEN_PLAIN every d64 varlen batch took FEAT 2 on three consumers, spills and
 * all (1-8% faster than two there, docs/PERF.md). */
template <int D, int KIND, int BN, int STAGES, int NC, int BF16>
static cudaError_t sm90_launch_kind(const fc_sm90_fwd_args *a, const sm90_fwd_params *p, const sm90_fwd_feat *f,
                                    int rows, int seqs, cudaStream_t stream)
{
    if constexpr (KIND != SM90_FEAT) {
        if constexpr (D <= 128 && FC_SM90_FWD_VARLEN_PLAIN)
            if (f->varlen) return sm90_launch<D, BN, STAGES, NC, BF16, 3>(a, p, f, rows, seqs, stream);
        return sm90_launch<D, BN, STAGES, NC, BF16, 0>(a, p, f, rows, seqs, stream);
    } else {
        constexpr int VARLEN_NC = D == 64 && FC_SM90_FWD_TILES_DEFAULT && !FC_SM90_FWD_VARLEN_PLAIN ? 3 : NC;
        if constexpr (D <= 128)
            if (f->varlen) return sm90_launch<D, BN, STAGES, VARLEN_NC, BF16, 2>(a, p, f, rows, seqs, stream);
        return sm90_launch<D, BN, STAGES, NC, BF16, 1>(a, p, f, rows, seqs, stream);
    }
}

cudaError_t fc_sm90_forward(const fc_sm90_fwd_args *a, cudaStream_t stream)
{
    if (a->batch == 0 || a->seqlen_q == 0) return cudaSuccess; /* nothing to write */
    sm90_fwd_params p;
    memset(&p, 0, sizeof p);
    p.lse = a->lse;
    p.lse_sb = a->lse_sb, p.lse_sh = a->lse_sh, p.lse_ss = a->lse_ss;
    p.seqlen_q = a->seqlen_q;
    p.seqlen_k = a->seqlen_k;
    p.group = a->heads_q / a->heads_kv;
    p.heads_q = a->heads_q;
    /* the tiles' batch: the sequences of a varlen batch, each given max_seqlen_q rows */
    const int varlen = a->cu_seqlens_q != NULL;
    const int seqs = varlen ? a->num_seqs : a->batch;
    const int rows = varlen ? a->max_seqlen_q : a->seqlen_q;
    const int keys = varlen ? (a->max_seqlen_k > 0 ? a->max_seqlen_k : a->seqlen_k / seqs) : a->seqlen_k;
    /* Causal sections: as many (batch, head) pairs as keep their K/V within about half of
     * the L2 (K/V of a KV head serve its whole group of query heads). */
    const double kv_bytes = 4.0 * (keys > 0 ? keys : 1) * a->head_dim / p.group;
    const double l2_budget = 25e6;
    p.section_bh = kv_bytes > l2_budget ? 1 : (int)(l2_budget / kv_bytes);
    if (p.section_bh > a->heads_q * seqs) p.section_bh = a->heads_q * seqs;
    p.causal = a->causal != 0;
    p.causal_offset = a->causal == 1 ? a->seqlen_k - a->seqlen_q : 0; /* as flashc_key_end */
    p.scale_log2 = a->scale * 1.4426950408889634f;
    /* The features: a window, a softcap or ALiBi selects the feature kernel; causal alone
     * stays on the plain one. */
    const int window = a->window && (a->window_left >= 0 || a->window_right >= 0);
    const int dropout = a->dropout_p > 0.f;
    /* a varlen batch without these runs on the plain kernels' varlen form (FEAT 3) */
    const int feat = window || a->softcap > 0.f || a->alibi_slopes != NULL || dropout ||
                     (varlen && !FC_SM90_FWD_VARLEN_PLAIN);
    sm90_fwd_feat f;
    memset(&f, 0, sizeof f);
    if (feat || varlen) {
        f.off = a->causal == 2 ? 0 : a->seqlen_k - a->seqlen_q;
        const int64_t wl = window ? a->window_left : -1, wr = window ? a->window_right : -1;
        const int64_t big = 0x7fffffff; /* wider than any sequence: the same as unbounded */
        f.has_left = wl >= 0;
        f.left = (int)(wl > big ? big : (wl < 0 ? 0 : wl));
        /* causal is the band's right edge at the diagonal: min(window_right, 0) = 0 */
        f.has_right = a->causal != 0 || wr >= 0;
        f.right = a->causal != 0 ? 0 : (int)(wr > big ? big : (wr < 0 ? 0 : wr));
        f.softcap_on = a->softcap > 0.f;
        f.alibi_on = a->alibi_slopes != NULL;
        f.transform = f.softcap_on || f.alibi_on;
        f.score_log2 = p.scale_log2;
        if (f.softcap_on) {
            f.softcap_pre = a->scale / a->softcap;
            f.softcap_log2 = a->softcap * 1.4426950408889634f;
        }
        f.alibi = a->alibi_slopes;
        f.alibi_sb = a->alibi_batch_stride;
        if (f.transform) p.scale_log2 = 1.f; /* the scores are in the log2 domain already */
        f.varlen = varlen;
        f.top_left = a->causal == 2;
        f.cu_q = a->cu_seqlens_q;
        f.cu_k = a->cu_seqlens_k;
        f.o = (uint16_t *)a->o;
        f.o_sb = a->o_sb, f.o_ss = a->o_ss, f.o_sh = a->o_sh;
        f.head_dim = a->head_dim;
        f.drop_on = dropout;
        f.drop.seed = a->dropout_seed;
        f.drop.threshold = a->dropout_threshold;
        f.drop_offset = a->dropout_offset;
        f.drop_scale = dropout ? (float)(1.0 / (1.0 - (double)a->dropout_p)) : 1.f;
    }
    const int kd = fc_sm90_kernel_head_dim(a->head_dim);
    if (varlen && kd > 128) return cudaErrorInvalidValue; /* not supported */
    const int kind = feat ? SM90_FEAT : SM90_PLAIN;
#define X(D_, KIND_, BN_, ST_, NC_)                                                          \
    if (kd == D_ && kind == KIND_)                                                           \
        return a->bf16 ? sm90_launch_kind<D_, KIND_, BN_, ST_, NC_, 1>(a, &p, &f, rows, seqs, stream) \
                       : sm90_launch_kind<D_, KIND_, BN_, ST_, NC_, 0>(a, &p, &f, rows, seqs, stream);
    FC_SM90_FWD_CONFIGS(X)
#undef X
    return cudaErrorInvalidValue;
}
