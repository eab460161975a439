/*
 * bwd_sm90.cu - the FlashAttention backward for Hopper (sm_90a): a delta pre-pass, a
 * warp-specialized main kernel (TMA + mbarrier ring, wgmma for all five products) and a dQ
 * conversion pass. Build for -gencode=arch=compute_90a,code=sm_90a.
 *
 * 1. fc_sm90_bwd_pre: per query row, delta = rowsum(dO * O) in fp32 and lse2 = LSE * log2(e)
 *    (+inf for a row that sees no key, so that its P is exp2(-inf) = 0 whatever its scores);
 *    rows past seqlen_q up to the padded length get delta 0 and lse2 +inf. It also zeroes the
 *    fp32 dQ accumulator and the deterministic-mode semaphores.
 *
 * 2. fc_sm90_bwd_kernel: one CTA per (key block of BN = 128 keys, kv head, batch), three
 *    warpgroups (384 threads):
 *      warpgroup 0, producer (setmaxnreg.dec 24): one elected thread loads K and V of the
 *        block once, then for every query head of the kv head's group and every query block
 *        i that sees a key of the block, Q_i and dO_i (TMA, 128-byte swizzle) and lse2_i,
 *        delta_i (1-D bulk copies) into a STAGES-deep ring with full/empty mbarriers. A
 *        second elected thread (warp 1) adds the consumers' dQ units, handed over in shared
 *        memory, into the fp32 accumulator with one bulk reduction (cp.reduce.async.bulk
 *        .add.f32) each, in deterministic mode in the key block's turn.
 *      warpgroups 1 and 2, consumers (setmaxnreg.inc 240): consumer c owns keys
 *        [64c, 64c + 64) of the block and keeps their dK and dV in fp32 registers for the
 *        whole loop. Per query block (BM rows), with keys on the wgmma M side ("swapped"):
 *            S^T  = K_c Q^T                    wgmma SS, both K-major (d64: RS, K_c's A
 *            dP^T = V_c dO^T                   fragments loaded into registers once per CTA)
 *            P^T  = exp2(S^T scale log2e - lse2)   (masked entries set to 0)
 *            dS^T = P^T (dP^T - delta)
 *            dV  += P^T dO                      wgmma RS: P^T from registers, dO MN-major
 *            dK  += dS^T Q                      wgmma RS: dS^T from registers, Q MN-major
 *            dS -> shared memory, transposed by stmatrix (query rows, K-major), both halves
 *            dQ_unit = dS K                     wgmma SS, dS K-major, K MN-major
 *        and the dQ unit (64 x 64 fp32, see below) is added into the fp32 accumulator in the
 *        accumulator-fragment order (thread t's registers 4g..4g+3 at float 512 g + 4 t):
 *        through shared memory and the producer's bulk reduction (or, with FC_SM90B_DQ_BULK
 *        or FC_SM90B_DQ_BULK64 off, with red.global.add.v4.f32 from the registers, a warp's
 *        reductions covering 512 contiguous bytes).
 *        In deterministic mode a semaphore per (batch, query head, query block, unit) makes
 *        the key blocks add in a fixed order (sm90b_det_rank).
 *      The S and dP accumulators of a row that sees no key, or of a key past seqlen_k (TMA
 *      zero-fills rows outside the tensor), give P = 0 and so contribute nothing. dK is
 *      scaled by the softmax scale in the epilogue; dK and dV are stored directly (rows past
 *      seqlen_k skipped). GQA: the CTA walks all query heads of its kv head, so dK and dV sum
 *      the group in registers, deterministically; when the heaviest CTA would outlast the
 *      rest of the grid (and not in deterministic mode) the group's query heads are split
 *      over several CTAs, which add their dK and dV into fp32 accumulators instead
 *      (sm90b_group_split).
 *
 * 3. fc_sm90_bwd_post: dQ = scale * accumulator, to 16 bits, from the fragment order back to
 *    [row][column]; with a split group, fc_sm90_bwd_kv_post converts dK and dV likewise.
 *
 * BM = 80 query rows per block in the plain kernels (fixed-length and varlen), 64 in the
 * feature kernels (SM90B_BM). Head dim 128: consumer c's dQ unit is head-dim columns
 * [64c, 64c + 64) over all 128 keys (so it reads both consumers' dS); with 80 rows, which
 * wgmma's 64-row M cannot hold, the unit is computed transposed, dQ^T = K^T dS^T. Head dim 64: each
 * consumer computes the whole 64 x 64 dQ over its own 64 keys, so it reads only its own half
 * of dS and the two consumers do not wait for each other's dS (one's exponentials run beside
 * the other's products); it issues the dQ product first so that the reduction runs beside
 * dK and dV. The two partials are summed in shared memory (consumer 0 stores, consumer 1
 * adds and stores the sum back for the reducing warp): one addition per block, half the
 * reduction traffic of two and, in deterministic mode, half the turns, none of them waited
 * for by a consumer. Every GEMM uses an operand form (K-major
 * SS, MN-major B in SS and RS) that the forward's layout probe checked, and the transposed
 * dQ an M-major A (SS), checked against the reference by the backward's tests.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bwd_sm90.h"
#include "sm90_env.h"
#include "sm90_ptx.cuh"
#include "sm90_tmap.h"
#include "../dropout.cuh"
#include "../varlen.cuh"

#define SM90B_BN 128      /* keys per CTA: 64 per consumer warpgroup */
#define SM90B_THREADS 384 /* producer warpgroup + 2 consumer warpgroups */
#define SM90B_STAGES 2
#define SM90B_PRODUCER_REGS 24
#define SM90B_CONSUMER_REGS 240

/* Named barriers: 0 is __syncthreads; 1 gathers both consumers once dS is in shared memory
 * (d128, where each dQ unit reads both halves); 2 and 3 order one consumer's threads around a
 * deterministic-mode semaphore; 4 joins both consumers once they have cleared the rows of a
 * varlen block that belong to the next sequence; 5 and 6 gather one consumer once its half of
 * dS is in (d64, where its dQ reads only that half). */
#define SM90B_BAR_DS 1
#define SM90B_BAR_SEM0 2
#define SM90B_BAR_TAIL 4
#define SM90B_BAR_DS_OWN0 5
/* d64: consumer 0's partial dQ handed to consumer 1 through shared memory: 7 + 2 b publishes
 * it in buffer b, 11 + b hands buffer b back. */
#define SM90B_BAR_DQ_FULL0 7
#define SM90B_BAR_DQ_EMPTY0 11
/* d128 with FC_SM90B_PINGPONG: 13 + c, consumer c's turn on the tensor cores */
#define SM90B_BAR_TURN0 13

/* d64: the consumers keep their K and V rows in registers as wgmma A fragments (S^T and dP^T
 * register-sourced) instead of reading them from shared memory for every query block. */
#ifndef FC_SM90B_KV_REGS
#define FC_SM90B_KV_REGS 1
#endif

/* dS^T goes to shared memory through transposing stmatrix (four 8 x 8 matrices per
 * instruction) instead of one 16-bit store per element. */
#ifndef FC_SM90B_DS_STSM
#define FC_SM90B_DS_STSM 1
#endif

/* d128: each consumer stores its dQ unit in shared memory and a second producer warp adds it
 * into the accumulator with one bulk reduction (16 KB), instead of the consumer's 32
 * reductions per thread, whose source registers held up the next block (and, in
 * deterministic mode, the wait for the turn and for the reductions to be performed). */
#ifndef FC_SM90B_DQ_BULK
#define FC_SM90B_DQ_BULK 1
#endif

/* d64: the consumers' summed dQ unit (the pair sum below) goes to the reducing warp the same
 * way: consumer 1 writes the sum back into the pair's buffer and the warp adds it with one
 * bulk reduction (in deterministic mode in the key block's turn), which hands the buffer back
 * to consumer 0. */
#ifndef FC_SM90B_DQ_BULK64
#define FC_SM90B_DQ_BULK64 1
#endif

/* d128: the dQ unit's product issued first, as at d64, so that its store into the reducing
 * warp's buffer runs while dV and dK are on the tensor cores, rather than after all three
 * with the tensor cores idle. Measured +8-11% on the d128 rows outside deterministic mode
 * (docs/PERF.md, "The d128 backward's dQ product first"), at the cost of a 4-byte spill in
 * the plain fixed-length kernels (one reload per block); 0 waits for all three products. */
#ifndef FC_SM90B_DQ_FIRST128
#define FC_SM90B_DQ_FIRST128 1
#endif

/* d128: the consumers may run apart. Each block's dQ unit is computed LAG (1 or 2) blocks
 * later, once the other consumer's half of that block's dS is in (an mbarrier per consumer
 * and dS buffer, and one for "read", in place of the named barrier on which both consumers
 * meet every block), so that one consumer's exponentials can run beside the other's
 * products. The first LAG iterations issue the first block's unit, unused, so that every
 * iteration issues the same products (a product under a run-time condition serializes them);
 * the last LAG units follow the loop. dS then needs LAG + 1 buffers.
 *
 * With a lag of 2 the consumers can also take turns on the tensor cores (two named barriers,
 * "ping-pong"), a turn being one block's dV, dK and dQ products and the next block's S^T and
 * dP^T, so that one consumer's exponentials run while the other's products hold the tensor
 * cores rather than at the same time (a lag of 1 does not allow it: the leader's dQ unit
 * would wait for the dS the follower computes during the leader's turn).
 *
 * Measured (docs/PERF.md), both off: a lag of 1 gains 2-5% on causal rows and loses 4-6% on
 * non-causal ones; the turns lose 5-8% in the plain kernel and 15% in deterministic mode, and
 * gain 0-5% in the feature kernels (more work per score between the products). */
#ifndef FC_SM90B_DS_LAG
#define FC_SM90B_DS_LAG 0
#endif
#ifndef FC_SM90B_PINGPONG
#define FC_SM90B_PINGPONG 0
#endif

/* 1 steps the backward's wgmma descriptors from each operand's low word (sm90_desc_step):
 * measured level at d128 and 1% slower at d64 (docs/PERF.md), so off. */
#ifndef FC_SM90B_DESC_STEP
#define FC_SM90B_DESC_STEP 0
#endif

/* A persistent grid for the plain fixed-length kernel outside deterministic mode, without a
 * mask or with a bottom-right causal one (PST): one CTA per SM, taking the tiles (key block,
 * kv head, batch) from a counter in the order the one-CTA-per-tile grid would dispatch them,
 * each CTA its next tile two blocks before the end of the current one. The Q/dO ring and the
 * dS and dQ buffers run on across tiles; a CTA's next tile's first Q and dO load while it
 * finishes the last one, its K and V once the consumers have released the last tile's
 * (kv_empty) and, fetched into L2 before, from there, so that they overlap the dK and dV
 * stores instead of following them. The tile's coordinates pass to the consumers through
 * shared memory (two slots, by tile parity), read once per tile into warp-uniform values; each
 * dQ hand-over tells the reducing warp its workspace row. Off: +0.5-3% at 2k, level at 4k,
 * -0.5-0.7% at 16k, and its producer spills (docs/PERF.md, "A persistent backward,
 * coordinates in shared memory"). FLASHC_SM90B_CTAS=n forces n CTAs (tests: few CTAs walk
 * many tiles). */
#ifndef FC_SM90B_PERSIST
#define FC_SM90B_PERSIST 0
#endif
/* Whether the persistent kernel is built for head dim D: it runs on the default dQ hand-over
 * (no lag, no turns, bulk reductions); otherwise every launch keeps one CTA per tile. */
#define SM90B_PST_BUILT(D)                                                                         \
    (FC_SM90B_PERSIST && ((D) != 128 || FC_SM90B_DS_LAG == 0) && FC_SM90B_DQ_BULK && FC_SM90B_DQ_BULK64)

/* A varlen batch without window, softcap, ALiBi or dropout on the plain kernel's code with
 * per-sequence bounds (FEAT 3) rather than the feature kernel's (FEAT 2); 0 keeps FEAT 2 for
 * every varlen batch, for comparisons. */
#ifndef FC_SM90B_VARLEN_PLAIN
#define FC_SM90B_VARLEN_PLAIN 1
#endif

/* Query rows per block: 80 in the plain kernels (FEAT 0, and FEAT 3 over a varlen batch, whose
 * workspace then places sequences by fc_varlen_ws_start80) at head dim 128 (FC_SM90B_BM80)
 * and 64 (FC_SM90B_BM80_D64), 64 otherwise. With 80 rows the per-block costs (the waits and
 * barriers, the LSE and delta loads, the exponentials' setup, the dQ unit's hand-over) carry a
 * quarter more products, and the K and V operands are read from shared memory once per 80
 * query rows instead of 64. An 80-row dQ unit does not fit wgmma's 64-row M, so there the unit
 * is computed transposed, dQ^T = K^T dS^T (head-dim columns on M, queries on N). The feature
 * kernels keep 64 (their dropout keep bits are laid out for 64-row blocks). */
#ifndef FC_SM90B_BM80
#define FC_SM90B_BM80 1
#endif
#ifndef FC_SM90B_BM80_D64
#define FC_SM90B_BM80_D64 1
#endif
#define SM90B_BM(D, FEAT)                                                                         \
    ((((D) == 128 && FC_SM90B_BM80) || ((D) == 64 && FC_SM90B_BM80_D64)) && ((FEAT) == 0 || (FEAT) == 3) ? 80 : 64)

/* 1: the consumer index made warp-uniform (sm90_warp_uniform). Without it, the K and V panel
 * addresses built from it count as per-lane: every wgmma descriptor of the key loop is then
 * assembled in per-thread registers and moved to uniform ones before its product (four
 * R2UR moves per product; 150-162 in each d128 kernel, 38-48 with the broadcast). The same
 * broadcast made the forward's diagonal skip pay (docs/PERF.md, "The causal blocks past a
 * consumer's own diagonal"). Not in the varlen feature kernels (FEAT 2), which spill with it.
 * Measured +1-2% in the ordinary mode, -2-4% in the deterministic mode without a mask at d128
 * (docs/PERF.md); 0 builds the kernels without it. */
#ifndef FC_SM90B_UNIFORM_C
#define FC_SM90B_UNIFORM_C 1
#endif

typedef struct sm90_bwd_params {
    const float *lse2, *delta; /* [batch * heads_q][sqr] */
    float *dq_acc;             /* [batch * heads_q][sqr][D], fragment order inside a block */
    int *sem;                  /* [batch * heads_q][m_blocks][2] */
    void *dk, *dv;
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int seqlen_q, seqlen_k, sqr, heads_q, group, m_blocks;
    int causal, causal_offset, deterministic;
    int det_desc;   /* deterministic turns in descending key-block order (sm90b_det_rank) */
    int det_stride; /* > 0: key block nb walks its units from nb x det_stride on (the same) */
    float scale_log2, scale; /* scale_log2 is 1 in a feature kernel whose scores are
                                transformed into the log2 domain first */
    /* Read only by the feature kernels (FEAT = 1): query i sees key j when
     * -left <= j - i - off (has_left) and j - i - off <= right (has_right), j < seqlen_k. */
    int off;           /* flashc.h's diagonal offset: 0 top-left, else seqlen_k - seqlen_q */
    int has_left, has_right, left, right;
    int transform, softcap_on, alibi_on;
    float score_log2;   /* softmax scale * log2(e), for the transform without softcap */
    float softcap_pre;  /* scale / softcap */
    float softcap_log2; /* softcap * log2(e) */
    const float *alibi;
    int64_t alibi_sb;
    /* Variable-length batches (FEAT = 2): CTA batch b is sequence b (sm90b_seq_of); the
     * workspace holds sqr rows per head, sequence b's from fc_varlen_ws_start on. */
    int top_left, max_q;
    const int32_t *cu_q, *cu_k;
    /* GQA with few CTAs: the query heads of a kv head's group are split over hsplit CTAs
     * (blockIdx.y = kv head * hsplit + part), each adding its scaled dK and its dV into the
     * fp32 accumulators [batch][seqlen_k][heads_kv][D] that fc_sm90_bwd_kv_post converts.
     * hsplit 1: the CTA walks the whole group and stores dK, dV itself. */
    int hsplit, heads_kv;
    float *dk_acc, *dv_acc;
    /* Dropout (FEAT >= 1): the forward's keep bits regenerated for P^T (word drop_offset +
     * b * heads_q + h); dV = drop_scale (P^T Z) dO, dS^T = P^T (drop_scale Z dP^T - delta). */
    int drop_on;
    fc_drop drop;
    uint64_t drop_offset;
    float drop_scale;
    /* A persistent grid (PST): tiles in all, the key blocks per (kv head, batch) and the CTAs
     * per batch element along y (kv heads x hsplit), as the plain grid lays them out. */
    int tiles, k_blocks, tile_y;
    /* PST: the next tile is gridDim.x + atomicAdd(tile_counter, 1), so that the CTAs take the
     * tiles as they free up (causal tiles differ in length, and SMs in speed) */
    int *tile_counter;
} sm90_bwd_params;

/* Tile t of a persistent grid: the plain grid's CTA t in dispatch order (x fastest). */
typedef struct sm90b_tile {
    int nb, hk, b, qh0;
} sm90b_tile;

static __device__ __forceinline__ sm90b_tile sm90b_tile_of(const sm90_bwd_params &p, int tile)
{
    /* unsigned: every count is positive, and the unsigned divisions take fewer registers */
    const unsigned t = (unsigned)tile, kb = (unsigned)p.k_blocks, ty = (unsigned)p.tile_y;
    const unsigned hs = (unsigned)p.hsplit, ty_t = t / kb, y = ty_t % ty;
    sm90b_tile r;
    r.nb = (int)(t - ty_t * kb);
    r.b = (int)(ty_t / ty);
    r.hk = (int)(y / hs);
    r.qh0 = r.hk * p.group + (int)(y - (unsigned)r.hk * hs) * (p.group / p.hsplit);
    return r;
}

/* The sequence of a CTA: query rows q0 .. q0 + nq of the tensors' batch tb against keys
 * k0 .. k0 + nk, query i on the diagonal of key i + off; its rows of head h in the workspace
 * start at ws0 + h * sqr (a varlen workspace laid out for query blocks of bm rows). A varlen
 * sequence longer than max_seqlen_q has only its first max_seqlen_q rows computed (nq is cut
 * there; off keeps the real lengths). */
typedef struct sm90b_seq {
    int q0, nq, k0, nk, off, tb;
    int64_t ws0;
} sm90b_seq;

template <int FEAT, typename P>
static __device__ __forceinline__ sm90b_seq sm90b_seq_of(const P &p, int b, int heads_q, int sqr, int bm)
{
    sm90b_seq s;
    if (FEAT >= 2) {
        fc_varlen_rows(p.cu_q, p.cu_k, b, p.seqlen_q, p.seqlen_k, &s.q0, &s.nq, &s.k0, &s.nk);
        s.off = p.top_left ? 0 : s.nk - s.nq;
        if (s.nq > p.max_q) s.nq = p.max_q;
        s.tb = 0;
        s.ws0 = bm == 80 ? fc_varlen_ws_start80(s.q0, b) : fc_varlen_ws_start(s.q0, b);
    } else {
        s.q0 = s.k0 = 0;
        s.nq = p.seqlen_q;
        s.nk = p.seqlen_k;
        s.off = 0; /* read from the kernel's own parameters where it matters */
        s.tb = b;
        s.ws0 = (int64_t)b * heads_q * sqr;
    }
    return s;
}

/* Shared memory, every tile 1024-byte aligned: K, V, the Q ring, the dO ring, two dS buffers
 * (the next block's dS is written while the other consumer may still read this one), the
 * lse2/delta vectors per stage, the mbarriers. */
template <int D, int BM, int PST = 0>
struct sm90_bwd_layout {
    static constexpr int BN = SM90B_BN, STAGES = SM90B_STAGES;
    static constexpr uint32_t KV_BYTES = BN * D * 2;
    static constexpr uint32_t QT_BYTES = BM * D * 2;
    static constexpr uint32_t DS_BYTES = BM * BN * 2;
    static constexpr uint32_t VEC_BYTES = 2 * BM * 4;
    static constexpr uint32_t K_OFF = 0;
    static constexpr uint32_t V_OFF = KV_BYTES;
    static constexpr uint32_t Q_OFF = 2 * KV_BYTES;
    static constexpr uint32_t DO_OFF = Q_OFF + STAGES * QT_BYTES;
    static constexpr uint32_t DS_OFF = DO_OFF + STAGES * QT_BYTES;
    /* 64 x 64 fp32 dQ buffers in fragment order: d64, two of consumer 0's partial dQ; d128
     * with FC_SM90B_DQ_BULK, one per consumer's unit, read by the bulk reductions */
    static constexpr uint32_t DQ_BYTES = D == 64 || FC_SM90B_DQ_BULK ? BM * 64 * 4 : 0;
    static constexpr int LAG = D == 128 ? FC_SM90B_DS_LAG : 0;
    static constexpr int DS_BUFS = LAG ? LAG + 1 : 2;
    static_assert(LAG >= 0 && LAG <= 2, "lag");
    static constexpr uint32_t DQ_OFF = DS_OFF + DS_BUFS * DS_BYTES;
    static constexpr uint32_t VEC_OFF = DQ_OFF + 2 * DQ_BYTES;
    static constexpr uint32_t BAR_OFF = VEC_OFF + STAGES * VEC_BYTES;
    /* kv_full, q_full[STAGES], q_empty[STAGES], dq_full[2], dq_empty[2]; d128 with a lag:
     * ds_full[consumer][buffer], ds_read[consumer][buffer] */
    static constexpr uint32_t BARS = 1 + 2 * STAGES + 4 + (LAG ? 4 * DS_BUFS : 0) + PST; /* PST: kv_empty */
    /* varlen: the CTA's sequence; PST: two tile slots of 8 ints (sm90b slot fields), then
     * HDR_OFF: the workspace row of the dQ unit in each hand-over buffer (int64, -1: the end) */
    static constexpr uint32_t SEQ_OFF = BAR_OFF + BARS * 8;
    static constexpr uint32_t HDR_OFF = SEQ_OFF + 64;
    static constexpr uint32_t PSLOT_OFF = HDR_OFF + 16; /* PST: the producer's own copy of its tile */
    static constexpr uint32_t TOTAL = SEQ_OFF + (PST ? 64 + 16 + 32 : 32) + 1024; /* + alignment slack */
    static_assert(TOTAL <= 232448, "more shared memory than an sm_90 block may have");
};

/* ---- 1. pre-pass ----------------------------------------------------------------------------- */

typedef struct sm90_bwd_pre_params {
    const void *o, *dout;
    const float *lse;
    int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, lse_sb, lse_sh, lse_ss;
    float *lse2, *delta, *dq_acc;
    int *sem; /* NULL unless deterministic */
    int seqlen_q, seqlen_k, sqr, heads_q, bm, m_blocks;
    int top_left, max_q; /* varlen (FEAT = 2), as sm90_bwd_params */
    const int32_t *cu_q, *cu_k;
} sm90_bwd_pre_params;

template <int BF16>
static __device__ __forceinline__ float sm90b_lo(uint32_t w)
{
    return BF16 ? __uint_as_float(w << 16) : __half2float(__ushort_as_half((unsigned short)(w & 0xffff)));
}

template <int BF16>
static __device__ __forceinline__ float sm90b_hi(uint32_t w)
{
    return BF16 ? __uint_as_float(w & 0xffff0000u) : __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

/* Rows per block of the pre-pass: D / 8 threads per row, each reading 16 bytes of O and of
 * dO (eight elements), so that every load is a full 16-byte one and a warp covers whole rows
 * (four at d64, two at d128) rather than one row in 4-byte pieces. */
#define SM90B_PRE_THREADS 256
#define SM90B_PRE_ROWS(D) (SM90B_PRE_THREADS / ((D) / 8))

template <int BF16>
static __device__ __forceinline__ float sm90b_dot8(uint4 a, uint4 b)
{
    return sm90b_lo<BF16>(a.x) * sm90b_lo<BF16>(b.x) + sm90b_hi<BF16>(a.x) * sm90b_hi<BF16>(b.x) +
           sm90b_lo<BF16>(a.y) * sm90b_lo<BF16>(b.y) + sm90b_hi<BF16>(a.y) * sm90b_hi<BF16>(b.y) +
           sm90b_lo<BF16>(a.z) * sm90b_lo<BF16>(b.z) + sm90b_hi<BF16>(a.z) * sm90b_hi<BF16>(b.z) +
           sm90b_lo<BF16>(a.w) * sm90b_lo<BF16>(b.w) + sm90b_hi<BF16>(a.w) * sm90b_hi<BF16>(b.w);
}

/* D / 8 lanes per row (a power of two, at most a warp), a butterfly sum over them. Row i of
 * the (padded) query blocks of batch b (varlen: sequence b), head h. */
template <int D, int BF16, int FEAT>
__global__ void __launch_bounds__(SM90B_PRE_THREADS) fc_sm90_bwd_pre(const sm90_bwd_pre_params p)
{
    constexpr int TPR = D / 8; /* threads per row */
    static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "head dim");
    const int x = threadIdx.x % TPR;
    const int i = blockIdx.x * SM90B_PRE_ROWS(D) + threadIdx.x / TPR, h = blockIdx.y, b = blockIdx.z;
    const sm90b_seq sq = sm90b_seq_of<FEAT>(p, b, p.heads_q, p.sqr, p.bm);
    /* rows past the padded length do nothing, but their lanes stay for the butterfly */
    const bool in_ws = i < (FEAT == 2 ? (sq.nq + p.bm - 1) / p.bm * p.bm : p.sqr);
    const int64_t row = sq.ws0 + (int64_t)h * p.sqr + i; /* in the workspace */
    float sum = 0.f;
    float l2 = INFINITY;
    if (in_ws && i < sq.nq) {
        const int64_t tok = sq.q0 + i;
        const uint4 ow = ((const uint4 *)((const uint16_t *)p.o + sq.tb * p.o_sb + tok * p.o_ss + h * p.o_sh))[x];
        const uint4 dw = ((const uint4 *)((const uint16_t *)p.dout + sq.tb * p.do_sb + tok * p.do_ss + h * p.do_sh))[x];
        sum = sm90b_dot8<BF16>(ow, dw);
        const float lse = p.lse[sq.tb * p.lse_sb + h * p.lse_sh + tok * p.lse_ss];
        l2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!in_ws) return;
    if (x == 0) {
        p.delta[row] = sum;
        p.lse2[row] = l2;
    }
    float4 *acc = (float4 *)(p.dq_acc + row * D);
#pragma unroll
    for (int c = x; c < D / 4; c += TPR) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    /* one semaphore pair per query block: its first row is a multiple of bm */
    if (p.sem && i % p.bm == 0 && x < 2) p.sem[row / p.bm * 2 + x] = 0;
}

/* ---- 2. main kernel -------------------------------------------------------------------------- */

/* Issues d = A B^T over the head dim, D / 16 wgmmas: A is 64 rows of a [BN][D] tile (K or V),
 * B the [BM][D] tile (Q or dO), both K-major in 64-column panels. */
template <int D, int BM, int BF16, bool STEP>
static __device__ __forceinline__ void sm90b_issue_kt(float (&d)[BM / 2], uint32_t a_rows, uint32_t b_tile)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t koff = (kk & 3) * 32;
        const uint64_t da = sm90_desc_kmajor<STEP>(a_rows, (kk >> 2) * (SM90B_BN * 128), koff);
        const uint64_t db = sm90_desc_kmajor<STEP>(b_tile, (kk >> 2) * (BM * 128), koff);
        sm90_wgmma_ss<BM, BF16, 0>(d, da, db, kk > 0);
    }
    sm90_wgmma_commit();
}

/* The A fragments of 64 rows of a [BN][64] tile (K or V, one 128-byte-swizzled panel) for
 * the four k16 steps over its columns, in registers: fragment [kk][r] holds row 16 w + lane / 4
 * + 8 (r & 1), columns 16 kk + 8 (r >> 1) + 2 (lane & 3) + {0, 1}, w = warp in the warpgroup. */
static __device__ __forceinline__ void sm90b_load_a_frags(uint32_t (&f)[4][4], uint32_t rows, int warp, int lane)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = 16 * (warp & 3) + (lane >> 2) + 8 * (r & 1);
            const int col = 16 * kk + 8 * (r >> 1) + 2 * (lane & 3);
            f[kk][r] = sm90_ld_shared_b32(rows + row * 128 + ((((col >> 3) ^ (row & 7)) << 4) | ((col & 7) * 2)));
        }
}

/* d64: issues d = A B^T over the head dim with A (64 rows of K or V) from registers and B the
 * [BM][64] tile (Q or dO), K-major: the K, V halves are read from shared memory once per CTA
 * instead of once per query block. */
template <int BM, int BF16, bool STEP>
static __device__ __forceinline__ void sm90b_issue_kt_rs(float (&d)[BM / 2], const uint32_t (&a)[4][4], uint32_t b_tile)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        sm90_wgmma_rs<BM, BF16, 0>(d, a[kk], sm90_desc_kmajor<STEP>(b_tile, kk * 32), kk > 0);
    sm90_wgmma_commit();
}

/* Issues acc += A^T X over the BM queries, A^T from registers (the packed S^T or dS^T
 * accumulator), X a [BM][D] tile (dO or Q) read MN-major. */
template <int D, int BM, int BF16, bool STEP>
static __device__ __forceinline__ void sm90b_issue_rs(float (&acc)[D / 2], const uint32_t (&a)[BM / 16][4],
                                                      uint32_t x_tile)
{
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++) {
        const uint64_t db = sm90_desc_mnmajor<STEP>(x_tile, BM * 128, kk * 16 * 128);
        sm90_wgmma_rs<D, BF16, 1>(acc, a[kk], db, 1);
    }
}

/* A thread's N registers of a dQ unit (32, or 40 for an 80-row unit) into its shared-memory
 * buffer in fragment order (its registers 4g..4g+3 at buf + 2048 g bytes; buf is the buffer
 * plus 16 t for thread t). */
template <int N>
static __device__ __forceinline__ void sm90b_store_dq(const float (&d)[N], uint32_t buf)
{
#pragma unroll
    for (int g = 0; g < N / 4; g++) sm90_st_shared_v4(buf + g * 2048, d[4 * g], d[4 * g + 1], d[4 * g + 2], d[4 * g + 3]);
}

/* d64: the partial dQ of two consumers that each ran over their own 64 keys, summed in shared
 * memory at buf (this thread's floats, 16 bytes apart per 4 registers; buffer b = it & 1 of
 * the caller): consumer 0 stores its registers, consumer 1 adds them to its own. Thread t of
 * one reads what thread t of the other wrote. TO_BULK (FC_SM90B_DQ_BULK64): consumer 1 writes
 * the sum back into buffer b and arrives on full for the reducing warp, which adds it into
 * global memory and arrives on empty once the buffer is read; consumer 0 first waits
 * (wait_empty) on empty (phase empty_phase), two blocks on. Otherwise consumer 1 keeps the sum
 * in its registers and hands the buffer back on a named barrier when a block two on will use
 * it (give_back), so that no arrival is left pending at the end. HDR (with TO_BULK): consumer 1's
 * first thread also writes the unit's workspace row into *hdr for the reducing warp. */
template <bool TO_BULK, bool HDR, int N>
static __device__ __forceinline__ void sm90b_dq_pair_sum(float (&d)[N], uint32_t buf, int c, int b, bool wait_empty,
                                                         bool give_back, uint32_t empty_phase, uint64_t *full,
                                                         uint64_t *empty, volatile int64_t *hdr, int64_t row)
{
    if (c == 0) {
        if (wait_empty) {
            if constexpr (TO_BULK) sm90_mbar_wait(empty, empty_phase);
            else sm90_bar_sync(SM90B_BAR_DQ_EMPTY0 + b, 256);
        }
        sm90b_store_dq(d, buf);
        sm90_bar_arrive(SM90B_BAR_DQ_FULL0 + 2 * b, 256);
    } else {
        sm90_bar_sync(SM90B_BAR_DQ_FULL0 + 2 * b, 256);
#pragma unroll
        for (int g = 0; g < N / 4; g++) {
            const float4 v = sm90_ld_shared_v4(buf + g * 2048);
            d[4 * g] += v.x, d[4 * g + 1] += v.y, d[4 * g + 2] += v.z, d[4 * g + 3] += v.w;
            if constexpr (TO_BULK) sm90_st_shared_v4(buf + g * 2048, d[4 * g], d[4 * g + 1], d[4 * g + 2], d[4 * g + 3]);
        }
        if constexpr (TO_BULK) {
            if (HDR && threadIdx.x % 128 == 0) *hdr = row;
            sm90_fence_proxy_async();
            sm90_mbar_arrive(full);
        } else if (give_back) {
            sm90_bar_arrive(SM90B_BAR_DQ_EMPTY0 + b, 256);
        }
    }
}

/* Deterministic mode: how many key blocks add into the dQ unit of query block row m0 before
 * key block nb does. Key blocks take their turns ascending from nb0 (the first that reaches
 * the query block), or with desc (causal fixed-length grids whose key blocks of one head are
 * all resident at once) descending from the last one that sees it: each key block walks its
 * query blocks from its first one that sees a key of it, so under a causal mask key block
 * nb + 1 reaches a query block before nb does, and descending turns are taken in the order the
 * blocks get there, where ascending ones make each block wait for the one before it to catch
 * up (a delay that grows with the key block). With desc a block waits for one launched after
 * it, which cannot hold up the grid only if every block of the head can be resident at once. */
/* The key block holding key j0 of a sequence of len_k keys (0 for j0 <= 0): the first key block
 * that reaches a query block under a left window edge. */
static __device__ __forceinline__ int sm90b_first_key_block(long long j0, int len_k, int bn)
{
    return j0 <= 0 ? 0 : (int)(min(j0, (long long)len_k) / bn);
}

template <int BM>
static __device__ __forceinline__ int sm90b_det_rank(const sm90_bwd_params &p, int nb, int m0, int nb0, int unit)
{
    if (p.det_stride > 0) {
        /* Without a mask every key block walks the same units, so turns in any fixed order of
         * key blocks would keep all but the first waiting at every unit. Instead key block nb
         * starts its walk at unit nb x stride (wrapping around), and the turns on a unit go in
         * the order the key blocks reach it: first the last block k0 whose start is at or
         * before the unit, then k0 - 1, ..., 0, then the ones that reach it after wrapping,
         * from the last key block down. */
        const int nk = (p.seqlen_k + SM90B_BN - 1) / SM90B_BN;
        const int k0 = min(nk - 1, unit / p.det_stride);
        return nb <= k0 ? k0 - nb : k0 + nk - nb;
    }
    if (!p.det_desc) return nb - nb0;
    const int last_row = min(m0 + BM - 1, p.seqlen_q - 1) + p.causal_offset;
    return min(last_row / SM90B_BN, (p.seqlen_k - 1) / SM90B_BN) - nb;
}

/* Adds a dQ unit into the fp32 accumulator acc (this thread's floats, fragment order: its
 * registers 4g..4g+3 at acc + 512 g). In deterministic mode the adders of a unit take turns
 * through its semaphore: this one waits until rank adders have been. */
template <int N>
static __device__ __forceinline__ void sm90b_add_dq(const float (&d)[N], float *acc, bool det, int *sem, int rank,
                                                    int c, int t)
{
    if (det) {
        if (t == 0)
            while (sm90_ld_acquire_gpu(sem) < rank) {
            }
        sm90_bar_sync(SM90B_BAR_SEM0 + c, 128);
    }
#pragma unroll
    for (int g = 0; g < N / 4; g++) sm90_red_add_v4(acc + g * 512, d[4 * g], d[4 * g + 1], d[4 * g + 2], d[4 * g + 3]);
    if (det) {
        __threadfence();
        sm90_bar_sync(SM90B_BAR_SEM0 + c, 128);
        if (t == 0) {
            __threadfence();
            atomicAdd(sem, 1);
        }
    }
}

template <int BF16>
static __device__ __forceinline__ void sm90b_store_pair(void *base, int64_t off, float x, float y)
{
    *(uint32_t *)((uint16_t *)base + off) = sm90_pack2<BF16>(x, y);
}

/* FEAT = 0: plain attention (causal or not). FEAT = 1 adds the window, softcap, ALiBi and
 * dropout of sm90_bwd_params behind uniform run-time branches: the CTA walks only the query
 * blocks in its key block's band, and the scores get the forward's transform and band mask;
 * dS gets the softcap's derivative 1 - tanh^2, dP and P the forward's keep bits. FEAT = 2 is
 * FEAT = 1 over a variable-length batch (CTA batch b is sequence b), FEAT = 3 is FEAT = 0 over
 * one (per-sequence bounds and the causal mask only). A varlen CTA's blocks may reach into
 * the next sequence's rows: the K, V rows past the sequence's keys and the Q, dO rows past its
 * queries are zeroed in shared memory before use (so that a zero P or dS never meets the
 * neighbour's inf or NaN), and the padded workspace rows past its queries have lse2 = +inf,
 * so P is 0 there. */
template <int D, int BF16, int FEAT, int PST = 0>
__global__ void __launch_bounds__(SM90B_THREADS, 1)
fc_sm90_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                   const sm90_bwd_params p)
{
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = SM90B_BM(D, FEAT), BN = SM90B_BN, STAGES = SM90B_STAGES;
    typedef sm90_bwd_layout<D, BM, PST> L;
    constexpr int PANELS = D / 64;
    static_assert((D == 64 || D == 128) && (BM == 64 || (BM == 80 && (FEAT == 0 || FEAT == 3) && L::LAG == 0)),
                  "tile shape");
    /* the dQ unit: 64 x 64 (dQ = dS K, queries on M), or 64 head-dim columns x 80 queries
     * (DQ_T: dQ^T = K^T dS^T) */
    constexpr bool DQ_T = BM != 64;
    constexpr int DQN = DQ_T ? BM / 2 : 32; /* its accumulator registers per thread */
    /* FEAT 2 and 3: a varlen batch; FEAT 1 and 2: window, softcap, ALiBi, dropout */
    constexpr bool VARLEN = FEAT >= 2, FEATS = FEAT == 1 || FEAT == 2;

    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = sm90_smem_addr(smem_raw);
    uint8_t *smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    const uint32_t sbase = sm90_smem_addr(smem);
    uint64_t *bars = (uint64_t *)(smem + L::BAR_OFF);
    uint64_t *kv_full = bars, *q_full = bars + 1, *q_empty = bars + 1 + STAGES;
    uint64_t *dq_full = bars + 1 + 2 * STAGES, *dq_empty = dq_full + 2;
    constexpr int LAG = L::LAG, NDS = L::DS_BUFS;
    /* not varlen, whose consumers meet at a barrier inside a block when it clears tail rows */
    constexpr bool PINGPONG = LAG == 2 && FC_SM90B_PINGPONG && !VARLEN;
    /* wgmma descriptors stepped from each operand's first (FC_SM90B_DESC_STEP), never in the
     * d128 feature kernel, where ptxas then spills */
    constexpr bool DESC_STEP = FC_SM90B_DESC_STEP && !(D == 128 && FEAT == 1);
    uint64_t *ds_full = dq_empty + 2, *ds_read = ds_full + 2 * NDS; /* [consumer * NDS + buffer] */
    uint64_t *kv_empty = bars + L::BARS - 1; /* PST: the consumers are done with K and V */
    static_assert(!PST || (FEAT == 0 && SM90B_PST_BUILT(D) && LAG == 0 && !PINGPONG),
                  "the persistent grid runs on the plain kernel's bulk dQ hand-over");
    /* dQ units through shared memory and bulk reductions (d64: the pair's sum; in
     * deterministic mode the reducing warp takes the semaphore turns, so that the consumers
     * never wait on them) */
    const bool dq_bulk = D == 128 ? FC_SM90B_DQ_BULK : FC_SM90B_DQ_BULK64;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const int nb = blockIdx.x, hk = blockIdx.y / p.hsplit, b = blockIdx.z;
    const int heads_cta = p.group / p.hsplit;                           /* query heads this CTA walks */
    const int qh0 = hk * p.group + (blockIdx.y % p.hsplit) * heads_cta; /* the first of them */
    const int n0 = nb * BN;
    /* PST: the k-th tile's slot, written by the producer before the tile's kv_full arrival and
     * read by the consumers once that has completed: its key block (-1: the walk has ended),
     * kv head, batch, first query head, and the blocks the CTA walked before it (the running
     * count of the Q/dO ring and the dS and dQ buffers). */
#define SM90B_SLOT_NB 0
#define SM90B_SLOT_HK 1
#define SM90B_SLOT_B 2
#define SM90B_SLOT_QH0 3
#define SM90B_SLOT_G0 4
#define SM90B_TILE_S(i_) ((int)((volatile const int *)(smem + L::SEQ_OFF))[(k & 1) * 8 + (i_)])
    /* PST: the row of the dQ unit handed over in buffer i_ (the reducing warp's only source) */
#define SM90B_HDR(i_) (((volatile int64_t *)(smem + L::HDR_OFF))[i_])
    /* Every thread reads its sequence from the prefix sums for the band below, which runs
     * before the barrier that publishes thread 0's copy in shared memory. */
    const sm90b_seq sq = sm90b_seq_of<FEAT>(p, b, p.heads_q, p.sqr, BM);
    if (VARLEN && n0 >= sq.nk) return; /* a key block past a shorter sequence's end */
    if (VARLEN && tid == 0) {
        int *seq = (int *)(smem + L::SEQ_OFF);
        seq[0] = sq.off, seq[1] = sq.nq, seq[2] = sq.nk, seq[3] = (int)sq.ws0, seq[4] = sq.q0, seq[5] = sq.k0;
    }
    /* The CTA's sequence past the first barrier (varlen: from shared memory, reloaded past
     * every barrier, which keeps it out of the consumers' registers across the loop; fixed
     * lengths: the parameters): the band's diagonal offset (off), the lengths, the first
     * rows, and the workspace row of (query head qh, block row m0). */
    const int *seq_s = (const int *)(smem + L::SEQ_OFF);
#define SM90B_OFF (VARLEN ? seq_s[0] : p.off)
#define SM90B_LEN_Q (VARLEN ? seq_s[1] : p.seqlen_q)
#define SM90B_LEN_K (VARLEN ? seq_s[2] : p.seqlen_k)
#define SM90B_Q0 (VARLEN ? seq_s[4] : 0)
#define SM90B_K0 (VARLEN ? seq_s[5] : 0)
#define SM90B_TB (VARLEN ? 0 : b)
#define SM90B_WS_ROW(qh_, m0_)                                                                 \
    (VARLEN ? (int64_t)seq_s[3] + (int64_t)(qh_) * p.sqr + (m0_) : ((int64_t)b * p.heads_q + (qh_)) * p.sqr + (m0_))

    /* Query blocks [m_min, m_blocks) see a key of this block: with causal masking, query i
     * sees key j when j <= i + offset, so the first row that sees key n0 is n0 - offset.
     * Producer and consumers walk the same (query head, query block) list. */
    int m_min = 0, nm = p.m_blocks;
    if (FEATS) {
        /* the band read the other way: query i sees key j when
         * j - off - right <= i <= j - off + left, for the block's first and last key */
        const int len_q = VARLEN ? sq.nq : p.seqlen_q, len_k = VARLEN ? sq.nk : p.seqlen_k;
        const int off = VARLEN ? sq.off : p.off;
        const long long j_last = min(n0 + BN, len_k) - 1;
        long long q_lo = 0, q_hi = len_q;
        if (p.has_right) q_lo = max(q_lo, (long long)n0 - off - p.right);
        if (p.has_left) q_hi = min(q_hi, j_last - off + p.left + 1);
        if (q_lo >= q_hi) nm = 0;
        else {
            m_min = (int)(q_lo / BM);
            nm = (int)((q_hi + BM - 1) / BM) - m_min;
        }
    } else if (VARLEN) { /* the sequence's own query blocks, from the first row that sees n0 */
        const int first = p.causal ? max(n0 - sq.off, 0) : 0;
        if (first >= sq.nq) nm = 0;
        else {
            m_min = first / BM;
            nm = (sq.nq + BM - 1) / BM - m_min;
        }
    } else if (!PST && p.causal) {
        const int first = n0 - p.causal_offset;
        if (first > p.seqlen_q - 1) nm = 0;
        else {
            m_min = max(first, 0) / BM;
            nm = p.m_blocks - m_min;
        }
    }
    const int n_iter = nm * heads_cta;
    /* The CTA's it-th (query head, query block): its walk starts at unit nb x det_stride
     * (d128 in deterministic mode without a mask, sm90b_det_rank), else at unit 0. */
#define SM90B_UNIT(it_) (!PST && D == 128 && p.det_stride ? ((it_) + (int)blockIdx.x * p.det_stride) % n_iter : (it_))
    /* Deterministic mode: this key block's turn (sm90b_det_rank) on the dQ unit of block row
     * m0_, the CTA's it_-th. With a left window edge the key blocks that reach this query block
     * start at the one holding its first row's first key, not at 0 (the visitors are a
     * contiguous run of key blocks, both band edges growing). */
#define SM90B_DET_RANK(m0_, it_)                                                                       \
    sm90b_det_rank<BM>(p, nb, (m0_),                                                                 \
                       FEATS && p.has_left ? sm90b_first_key_block((long long)(m0_) + SM90B_OFF - p.left, \
                                                                   SM90B_LEN_K, BN)                    \
                                           : 0,                                                        \
                       SM90B_UNIT(it_))

    if (tid == 0) {
        sm90_mbar_init(kv_full, 1);
        for (int s = 0; s < STAGES; s++) {
            sm90_mbar_init(&q_full[s], 1);
            /* Every consumer thread arrives: each has read the stage's LSE/delta vectors
             * itself, so each must order its own reads before the refill. */
            sm90_mbar_init(&q_empty[s], 256);
        }
        for (int u = 0; u < 2; u++) {
            /* every thread of consumer u (d64: of consumer 1, for buffer u), after its stores */
            sm90_mbar_init(&dq_full[u], 128);
            sm90_mbar_init(&dq_empty[u], 1);  /* the reducing thread, once the unit is read */
        }
        if constexpr (PST) sm90_mbar_init(kv_empty, 256); /* every consumer thread, after its last product */
        if constexpr (LAG > 0)
            for (int i = 0; i < 2 * NDS; i++) {
                sm90_mbar_init(&ds_full[i], 128); /* consumer i / NDS's half of buffer i % NDS written */
                sm90_mbar_init(&ds_read[i], 128); /* consumer i / NDS done reading buffer i % NDS */
            }
        sm90_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---------------- producer ---------------- */
        sm90_setmaxnreg_dec<SM90B_PRODUCER_REGS>();
        if (warp == 0 && sm90_elect_one() && n_iter > 0) {
            sm90_tma_prefetch_desc(&tm_q);
            sm90_tma_prefetch_desc(&tm_k);
            sm90_tma_prefetch_desc(&tm_v);
            sm90_tma_prefetch_desc(&tm_do);
            int s = 0;
            uint32_t ph = 0;
            int tile = blockIdx.x, g0 = 0; /* PST: this tile and the blocks walked before it */
            for (int k = 0; PST || k < 1; k++) {
                if (PST && tile >= p.tiles) {
                    /* the end of the walk, for the consumers: a slot without a key block */
                    sm90_mbar_wait(kv_empty, (uint32_t)((k - 1) & 1));
                    int *slot = (int *)(smem + L::SEQ_OFF) + (k & 1) * 8;
                    slot[SM90B_SLOT_NB] = -1, slot[SM90B_SLOT_G0] = g0;
                    sm90_mbar_arrive(kv_full);
                    break;
                }
                /* this tile's coordinates and query blocks, in the names of the CTA's */
                const sm90b_tile tl = PST ? sm90b_tile_of(p, tile) : sm90b_tile{nb, hk, b, qh0};
                const int t_min = PST && p.causal ? max(tl.nb * BN - p.causal_offset, 0) / BM : m_min;
                const int t_nm = PST && p.causal ? p.m_blocks - t_min : nm;
                const int t_iter = PST && p.causal ? t_nm * heads_cta : n_iter;
                const int n0 = tl.nb * BN, hk = tl.hk, b = tl.b, qh0 = tl.qh0;
                const int m_min = t_min, nm = t_nm, n_iter = t_iter;
                /* PST: the tile's values the stage loop needs, kept in shared memory and read
                 * per block, since the producer's 24 registers cannot hold them across it */
#define SM90B_PT(i_, own_) (PST ? ((volatile int *)(smem + L::PSLOT_OFF))[i_] : (own_))
                if (PST) {
                    volatile int *pt = (volatile int *)(smem + L::PSLOT_OFF);
                    pt[0] = qh0, pt[1] = b, pt[2] = m_min, pt[3] = nm, pt[4] = n_iter;
                }
                /* K and V, and (PST) the tile's slot for the consumers; a later tile's once the
                 * consumers have released the last one's */
#define SM90B_LOAD_KV()                                                                                          \
    do {                                                                                                         \
        if (PST && k > 0) sm90_mbar_wait(kv_empty, (uint32_t)((k - 1) & 1));                                     \
        if (PST) {                                                                                               \
            int *slot_ = (int *)(smem + L::SEQ_OFF) + (k & 1) * 8;                                               \
            slot_[SM90B_SLOT_NB] = tl.nb, slot_[SM90B_SLOT_HK] = hk, slot_[SM90B_SLOT_B] = b;                    \
            slot_[SM90B_SLOT_QH0] = qh0, slot_[SM90B_SLOT_G0] = g0;                                              \
        }                                                                                                        \
        sm90_mbar_arrive_expect_tx(kv_full, 2 * L::KV_BYTES);                                                    \
        _Pragma("unroll") for (int pn = 0; pn < PANELS; pn++) {                                                  \
            const int at_ = pn * (BN * 128);                                                                     \
            sm90_tma_load_4d(sbase + L::K_OFF + at_, &tm_k, kv_full, pn * 64, SM90B_K0 + n0, hk, SM90B_TB);      \
            sm90_tma_load_4d(sbase + L::V_OFF + at_, &tm_v, kv_full, pn * 64, SM90B_K0 + n0, hk, SM90B_TB);      \
        }                                                                                                        \
    } while (0)
                /* Q, dO and the vectors of the tile's it_-th block into the next stage */
#define SM90B_LOAD_STAGE(it_)                                                                                    \
    do {                                                                                                         \
        const int v = SM90B_UNIT(it_);                                                                           \
        const int qh = qh0 + v / nm, m0 = (m_min + v % nm) * BM;                                                 \
        const int64_t row = SM90B_WS_ROW(qh, m0);                                                                \
        const uint32_t sq_t = sbase + L::Q_OFF + s * L::QT_BYTES;                                                \
        const uint32_t sdo_t = sbase + L::DO_OFF + s * L::QT_BYTES;                                              \
        const uint32_t svec = sbase + L::VEC_OFF + s * L::VEC_BYTES;                                             \
        sm90_mbar_wait(&q_empty[s], ph ^ 1);                                                                     \
        sm90_mbar_arrive_expect_tx(&q_full[s], 2 * L::QT_BYTES + L::VEC_BYTES);                                  \
        _Pragma("unroll") for (int pn = 0; pn < PANELS; pn++) {                                                  \
            sm90_tma_load_4d(sq_t + pn * (BM * 128), &tm_q, &q_full[s], pn * 64, SM90B_Q0 + m0, qh, SM90B_TB);   \
            sm90_tma_load_4d(sdo_t + pn * (BM * 128), &tm_do, &q_full[s], pn * 64, SM90B_Q0 + m0, qh, SM90B_TB); \
        }                                                                                                        \
        sm90_bulk_load(svec, p.lse2 + row, BM * 4, &q_full[s]);                                                  \
        sm90_bulk_load(svec + BM * 4, p.delta + row, BM * 4, &q_full[s]);                                        \
        if (++s == STAGES) s = 0, ph ^= 1;                                                                       \
    } while (0)
                /* a later tile's K and V behind its first stage, which was freed a block earlier */
                if (PST && k > 0) {
                    SM90B_LOAD_STAGE(0);
                    SM90B_LOAD_KV();
                } else {
                    SM90B_LOAD_KV();
                }
                for (int it = PST && k > 0 ? 1 : 0; it < SM90B_PT(4, n_iter); it++) {
                    const int qh0 = SM90B_PT(0, tl.qh0), b = SM90B_PT(1, tl.b);
                    const int m_min = SM90B_PT(2, t_min), nm = SM90B_PT(3, t_nm);
                    SM90B_LOAD_STAGE(it);
                }
                /* PST: the next tile, taken now rather than when this one started: a CTA that
                 * holds its next tile for a whole tile can leave it waiting while other CTAs
                 * run out of work (a tail of up to one of the longest causal tiles); two blocks
                 * before the end, the atomic's latency is hidden */
                const int next_t = PST ? (int)gridDim.x + atomicAdd(p.tile_counter, 1) : 0;
                if (PST && next_t < p.tiles) {
                    /* the next tile's K and V into L2 while the consumers are on this tile's last
                     * blocks, to be there when this tile's are released */
                    const sm90b_tile nx = sm90b_tile_of(p, next_t);
#pragma unroll
                    for (int pn = 0; pn < PANELS; pn++) {
                        sm90_tma_prefetch_4d(&tm_k, pn * 64, nx.nb * BN, nx.hk, nx.b);
                        sm90_tma_prefetch_4d(&tm_v, pn * 64, nx.nb * BN, nx.hk, nx.b);
                    }
                }
                g0 += SM90B_PT(4, n_iter), tile = next_t;
            }
#undef SM90B_PT
#undef SM90B_LOAD_STAGE
#undef SM90B_LOAD_KV
        } else if (PST && warp == 1 && sm90_elect_one()) {
            /* PST: the dQ units as the consumers hand them over, whatever tile they belong to:
             * each comes with its workspace row in the buffer's header, and a row of -1 ends
             * the walk */
            constexpr int UNITS = D == 128 ? 2 : 1;
            for (int g = 0;; g++) {
                /* the first unit's header (d128: consumer 0's; both carry the same row) */
                sm90_mbar_wait(&dq_full[D == 128 ? 0 : (g & 1)], D == 128 ? (g & 1) : ((g >> 1) & 1));
                const int64_t row = SM90B_HDR(D == 128 ? 0 : (g & 1));
                if (row < 0) break;
                for (int u = 0; u < UNITS; u++) {
                    const int buf = D == 128 ? u : (g & 1);
                    if (u > 0) sm90_mbar_wait(&dq_full[buf], (uint32_t)(g & 1));
                    sm90_bulk_reduce_add_f32(p.dq_acc + row * D + u * (BM * 64), sbase + L::DQ_OFF + buf * L::DQ_BYTES,
                                             L::DQ_BYTES);
                }
                sm90_bulk_commit();
                sm90_bulk_wait_read();
                for (int u = 0; u < UNITS; u++) sm90_mbar_arrive(&dq_empty[D == 128 ? u : (g & 1)]);
            }
            sm90_bulk_wait(); /* the additions performed before the conversion pass reads them */
        } else if (!PST && dq_bulk && warp == 1 && sm90_elect_one() && n_iter > 0) {
            /* the dQ units of each (query head, query block), as the consumers hand them over;
             * in deterministic mode in this key block's turn on the units' semaphores, each
             * turn handed on once the reductions are performed */
            for (int it = 0; it < n_iter; it++) {
                const int v = SM90B_UNIT(it);
                const int qh = qh0 + v / nm, m0 = (m_min + v % nm) * BM;
                const int64_t row = SM90B_WS_ROW(qh, m0);
                float *acc = p.dq_acc + row * D;
                int *sem = p.deterministic ? p.sem + row / BM * 2 : nullptr;
                if (sem) {
                    const int rank = SM90B_DET_RANK(m0, it);
                    while (sm90_ld_acquire_gpu(sem) < rank || (D == 128 && sm90_ld_acquire_gpu(sem + 1) < rank)) {
                    }
                    sm90_fence_proxy_async_global();
                }
                /* d128: the consumers' units 0 and 1, each in its consumer's buffer; d64: unit 0,
                 * the pair's sum, in buffer it & 1 */
                constexpr int UNITS = D == 128 ? 2 : 1;
                for (int u = 0; u < UNITS; u++) {
                    const int slot = D == 128 ? u : (it & 1);
                    sm90_mbar_wait(&dq_full[slot], D == 128 ? (it & 1) : ((it >> 1) & 1));
                    sm90_bulk_reduce_add_f32(acc + u * (BM * 64), sbase + L::DQ_OFF + slot * L::DQ_BYTES, L::DQ_BYTES);
                }
                sm90_bulk_commit();
                if (sem) {
                    sm90_bulk_wait();
                    sm90_fence_proxy_async_global();
                    for (int u = 0; u < UNITS; u++) sm90_red_release_add_gpu(sem + u);
                } else {
                    sm90_bulk_wait_read();
                }
                for (int u = 0; u < UNITS; u++) sm90_mbar_arrive(&dq_empty[D == 128 ? u : (it & 1)]);
            }
            sm90_bulk_wait(); /* the additions performed before the conversion pass reads them */
        }
    } else {
        /* ---------------- consumers ---------------- */
        sm90_setmaxnreg_inc<SM90B_CONSUMER_REGS>();
        /* consumer index: keys [64c, 64c + 64) of the block */
        const int c = FC_SM90B_UNIFORM_C && FEAT != 2 ? sm90_warp_uniform(wg - 1) : wg - 1;
        const int t = tid - 128 * wg; /* thread within the warpgroup */
        const int kw0 = n0 + 64 * c;  /* first key of this consumer */
        /* PST: the tile's first key of this consumer, kv head, batch and first query head, and
         * its query blocks (causal: from its first key), from the tile's values read at its
         * start (tile_*, below) */
#define SM90B_KW0 (PST ? tile_nb * BN + 64 * c : kw0)
#define SM90B_EHK (PST ? tile_hk : hk)
#define SM90B_ETB (PST ? tile_b : SM90B_TB)
#define SM90B_QH0 (PST ? tile_qh0 : qh0)
#define SM90B_MMIN (PST && p.causal ? tile_mmin : m_min)
#define SM90B_NM (PST && p.causal ? p.m_blocks - tile_mmin : nm)
#define SM90B_NITER (PST && p.causal ? SM90B_NM * heads_cta : n_iter)
        /* PST: the workspace row of (query head qh_, block row m0_) of the tile */
#define SM90B_PST_ROW(qh_, m0_) (((int64_t)tile_b * p.heads_q + (qh_)) * p.sqr + (m0_))
        const int kr_l = (warp & 3) * 16 + (lane >> 2); /* this thread's key rows: +0, +8 */
        const int qc_l = 2 * (lane & 3);                /* its query columns: 8g + qc_l + {0, 1} */
        /* d128: consumer c computes head-dim panel c of the block's dQ over all 128 keys
         * (unit c); d64: the whole 64 x 64 dQ over its own 64 keys, both adding into unit 0 */
        const int pb = D == 128 ? c : 0, unit = D == 128 ? c : 0;
        constexpr int KQ = D == 128 ? BN / 16 : 4;
        const uint32_t sK = sbase + L::K_OFF, sV = sbase + L::V_OFF;

        /* Adds dQ unit u_ of (query head qh, block row m0), in deterministic mode in its turn:
         * one adder per key block (d64: consumer 1, with the pair's sum; d128 without the
         * reducing warp: consumer c for unit c), in sm90b_det_rank's order. The addresses are
         * computed here, after the products, so that they hold no registers across them. */
#define SM90B_ADD_DQ(regs_, u_)                                                                    \
    do {                                                                                           \
        const int64_t wrow_ = SM90B_WS_ROW(qh, m0);                                                \
        sm90b_add_dq(regs_, p.dq_acc + wrow_ * D + (u_) * (BM * 64) + t * 4, p.deterministic,      \
                     p.deterministic ? p.sem + (wrow_ / BM * 2 + (u_)) : nullptr,                  \
                     p.deterministic ? SM90B_DET_RANK(m0, j) : 0, c, t);                            \
    } while (0)
        for (int k = 0; PST || k < 1; k++) {
            /* PST: the tile's slot, read once and broadcast from lane 0, so that the compiler
             * knows the values are the warp's (uniform registers: the descriptors and stage
             * addresses computed from them stay on the uniform datapath, as they do from the
             * CTA's own coordinates; read at each use instead, they cost the key loop a fifth
             * more instructions) */
            if (PST) sm90_mbar_wait(kv_full, (uint32_t)(k & 1));
            const int tile_nb = PST ? sm90_warp_uniform(SM90B_TILE_S(SM90B_SLOT_NB)) : 0;
            const int tile_g0 = PST ? sm90_warp_uniform(SM90B_TILE_S(SM90B_SLOT_G0)) : 0;
            if (PST) {
                if (tile_nb < 0) {
                    /* the end of the walk: a last hand-over with the row -1 tells the reducing
                     * warp (d128: in each consumer's buffer; d64: consumer 1's, in the next
                     * buffer of the pair sum, once the reducer has read it) */
                    const int g = tile_g0;
                    if (D == 128 || c == 1) {
                        const int buf = D == 128 ? c : (g & 1);
                        if (D == 128 && g > 0) sm90_mbar_wait(&dq_empty[c], (uint32_t)((g - 1) & 1));
                        if (D == 64 && g >= 2) sm90_mbar_wait(&dq_empty[buf], (uint32_t)(((g >> 1) + 1) & 1));
                        if (t == 0) SM90B_HDR(buf) = -1;
                        sm90_mbar_arrive(&dq_full[buf]);
                    }
                    break;
                }
            }
            const int tile_hk = PST ? sm90_warp_uniform(SM90B_TILE_S(SM90B_SLOT_HK)) : 0;
            const int tile_b = PST ? sm90_warp_uniform(SM90B_TILE_S(SM90B_SLOT_B)) : 0;
            const int tile_qh0 = PST ? sm90_warp_uniform(SM90B_TILE_S(SM90B_SLOT_QH0)) : 0;
            const int tile_mmin = PST && p.causal ? max(tile_nb * BN - p.causal_offset, 0) / BM : 0;
            float dv[D / 2], dk[D / 2];
#pragma unroll
            for (int j = 0; j < D / 2; j++) dv[j] = 0.f, dk[j] = 0.f;
            /* This consumer's dQ unit into dqa (an array of the expanding scope) over the dS buffer
             * at buf_, one commit group: dS (K-major A) times K panel pb (MN-major B), or with
             * DQ_T, K panel pb read as an M-major A times dS^T (the same tile as a K-major B). */
#define SM90B_ISSUE_DQ(buf_)                                                                          \
    do {                                                                                              \
        _Pragma("unroll") for (int k_ = 0; k_ < KQ; k_++) {                                           \
            const int kk_ = D == 128 ? k_ : 4 * c + k_; /* 16-key step within the block */            \
            const uint64_t ds_ = sm90_desc_kmajor<DESC_STEP>((buf_), (kk_ >> 2) * (BM * 128), (kk_ & 3) * 32); \
            const uint64_t k_desc_ = sm90_desc_mnmajor<DESC_STEP>(sK, BN * 128, pb * (BN * 128), kk_ * 16 * 128); \
            if constexpr (DQ_T)                                                                       \
                sm90_wgmma_ss<BM, BF16, 0, 1>(dqa, k_desc_, ds_, k_ > 0);                             \
            else                                                                                      \
                sm90_wgmma_ss<64, BF16, 1>(dqa, ds_, k_desc_, k_ > 0);                                \
        }                                                                                             \
        sm90_wgmma_commit();                                                                          \
    } while (0)
            /* dqa, the dQ unit of the CTA's j_-th (query head qh_, query block row m0_), into the
             * accumulator: through shared memory and the reducing warp (dq_bulk: d128 unit c into
             * its buffer once the reduction of the one before has read it; d64 already handed over
             * by the pair sum), or by reductions from the registers. */
#define SM90B_ADD_DQ_UNIT(j_, qh_, m0_)                                                               \
    do {                                                                                              \
        const int j = (j_), qh_n_ = (qh_), m0_n_ = (m0_);                                             \
        const int qh = qh_n_, m0 = m0_n_;                                                             \
        if (dq_bulk && D == 64) {                                                                     \
            /* handed to the reducing warp by the pair sum */                                         \
        } else if (dq_bulk) {                                                                         \
            const uint32_t buf = sbase + L::DQ_OFF + c * L::DQ_BYTES + t * 16;                        \
            if (j > 0) sm90_mbar_wait(&dq_empty[c], (j - 1) & 1);                                     \
            if (PST && t == 0) SM90B_HDR(c) = SM90B_PST_ROW(qh, m0);                                  \
            sm90b_store_dq(dqa, buf);                                                                 \
            sm90_fence_proxy_async();                                                                 \
            sm90_mbar_arrive(&dq_full[c]);                                                            \
        } else if (D == 128 || c == 1) {                                                              \
            SM90B_ADD_DQ(dqa, unit);                                                                  \
        }                                                                                             \
    } while (0)

            /* d64: this consumer's K and V rows as wgmma A fragments, for the whole loop */
            constexpr bool KV_REGS = D == 64 && FC_SM90B_KV_REGS;
            uint32_t kfrag[4][4], vfrag[4][4];
            if (n_iter > 0) {
                if (!PST) sm90_mbar_wait(kv_full, 0);
                if (VARLEN && n0 + BN > SM90B_LEN_K) {
                    sm90_zero_tile_rows<PANELS>(sK, BN, SM90B_LEN_K - n0, tid - 128, 256);
                    sm90_zero_tile_rows<PANELS>(sV, BN, SM90B_LEN_K - n0, tid - 128, 256);
                    sm90_bar_sync(SM90B_BAR_TAIL, 256);
                }
                if constexpr (KV_REGS) {
                    sm90b_load_a_frags(kfrag, sK + 64 * c * 128, warp, lane);
                    sm90b_load_a_frags(vfrag, sV + 64 * c * 128, warp, lane);
                }
                for (int it = 0; it < SM90B_NITER; it++) {
                    /* the ring's and the buffers' running count */
                    const int g = PST ? tile_g0 + it : it;
                    const int s = g % STAGES;
                    const uint32_t ph = (uint32_t)((g / STAGES) & 1);
                    const int v = SM90B_UNIT(it);
                    const int qh = SM90B_QH0 + v / SM90B_NM, m0 = (SM90B_MMIN + v % SM90B_NM) * BM;
                    const uint32_t sq_t = sbase + L::Q_OFF + s * L::QT_BYTES;
                    const uint32_t sdo_t = sbase + L::DO_OFF + s * L::QT_BYTES;
                    const float *vec = (const float *)(smem + L::VEC_OFF + s * L::VEC_BYTES);
                    const uint32_t sds = sbase + L::DS_OFF + ((uint32_t)g % NDS) * L::DS_BYTES;

                    float sc[BM / 2], dp[BM / 2];
                    /* the slope of this query head, read before the GEMMs hide its latency */
                    const float slope2 =
                        FEATS && p.alibi_on ? p.alibi[b * p.alibi_sb + qh] * 1.4426950408889634f : 0.f;
                    sm90_mbar_wait(&q_full[s], ph);
                    if (VARLEN && m0 + BM > SM90B_LEN_Q) {
                        sm90_zero_tile_rows<PANELS>(sq_t, BM, SM90B_LEN_Q - m0, tid - 128, 256);
                        sm90_zero_tile_rows<PANELS>(sdo_t, BM, SM90B_LEN_Q - m0, tid - 128, 256);
                        sm90_bar_sync(SM90B_BAR_TAIL, 256);
                    }
                    /* ping-pong: consumer 1's first turn follows consumer 0's first products */
                    if (PINGPONG && c == 1 && it == 0) sm90_bar_sync(SM90B_BAR_TURN0 + 1, 256);
                    sm90_wgmma_fence();
                    if constexpr (KV_REGS) {
                        sm90b_issue_kt_rs<BM, BF16, DESC_STEP>(sc, kfrag, sq_t);
                        sm90b_issue_kt_rs<BM, BF16, DESC_STEP>(dp, vfrag, sdo_t);
                    } else {
                        sm90b_issue_kt<D, BM, BF16, DESC_STEP>(sc, sK + 64 * c * 128, sq_t);
                        sm90b_issue_kt<D, BM, BF16, DESC_STEP>(dp, sV + 64 * c * 128, sdo_t);
                    }
                    sm90_fence_regs(sc);
                    sm90_fence_regs(dp);
                    if (PINGPONG) sm90_bar_arrive(SM90B_BAR_TURN0 + 1 - c, 256); /* the other's turn */
                    sm90_wgmma_wait<1>(); /* S^T is in; dP^T may still run while P^T is computed */
                    sm90_fence_regs(sc);

                    /* P^T = exp2(S^T * scale * log2e - lse2), query columns from the stage's vector.
                     * Keys past seqlen_k, or past the causal diagonal of the block's first row,
                     * get 0 (a lse2 of +inf, a row that sees no key, gives 0 too). Register pair
                     * (j, j + 1), j = 8 kk + 2 r, is key row kr_l + 8 (r % 2) and query columns
                     * 16 kk + 8 (r / 2) + qc_l + {0, 1}. */
                    bool need_mask;
                    /* the plain kernels' diagonal: the parameters', or the varlen sequence's */
                    const int coff = VARLEN ? SM90B_OFF : p.causal_offset;
                    if (FEATS) {
                        /* whether some pair of this 64 x 64 block is outside the band: 64-bit, a
                         * window may be as wide as INT32_MAX */
                        const long long dmin = (long long)kw0 - (m0 + 63) - SM90B_OFF,
                                        dmax = (long long)kw0 + 63 - m0 - SM90B_OFF;
                        need_mask = kw0 + 64 > SM90B_LEN_K || (p.has_left && dmin < -(long long)p.left) ||
                                    (p.has_right && dmax > p.right);
                    } else {
                        need_mask = SM90B_KW0 + 64 > SM90B_LEN_K || (p.causal && SM90B_KW0 + 63 > m0 + coff);
                    }
                    /* Feature kernel, per score of register j: its ALiBi distance i + off - key,
                     * and whether the band hides it. */
                    const float alibi_d0 = FEATS ? (float)(m0 + qc_l + SM90B_OFF - kw0 - kr_l) : 0.f;
#define SM90B_DIST(j_) (alibi_d0 + (float)(8 * ((j_) >> 2) + ((j_) & 1) - 8 * (((j_) >> 1) & 1)))
#define SM90B_HIDDEN(j_)                                                                           \
    ({                                                                                             \
        const int key_ = kw0 + kr_l + 8 * (((j_) >> 1) & 1);                                       \
        const int rel_ = key_ - (m0 + 8 * ((j_) >> 2) + qc_l + ((j_) & 1)) - SM90B_OFF; /* |.| < 2^31 */   \
        key_ >= SM90B_LEN_K || (p.has_left && rel_ < -p.left) || (p.has_right && rel_ > p.right);         \
    })
                    /* With softcap, P^T needs the tanh of every score again for dS^T (the
                     * derivative 1 - tanh^2): the tanh is computed now, over the dP^T product, and
                     * kept in sc; P^T follows once dP^T is in (keeping both would spill). */
                    const bool late = FEATS && p.softcap_on;
                    if (late) {
#pragma unroll
                        for (int j = 0; j < BM / 2; j++) sc[j] = tanhf(sc[j] * p.softcap_pre);
                    } else {
                        if (FEATS && p.alibi_on) {
                            /* scale, then -slope |i + off - j|, into the log2 domain */
#pragma unroll
                            for (int j = 0; j < BM / 2; j++) sc[j] = fmaf(sc[j], p.score_log2, -slope2 * fabsf(SM90B_DIST(j)));
                        }
                        if (FEATS && need_mask) {
#pragma unroll
                            for (int j = 0; j < BM / 2; j++)
                                if (SM90B_HIDDEN(j)) sc[j] = -INFINITY;
                        } else if (need_mask) {
                            /* -inf: exp2 makes it 0, whatever lse2 is */
                            const int key0 = SM90B_KW0 + kr_l;
#pragma unroll
                            for (int j = 0; j < BM / 2; j++) {
                                const int key = key0 + 8 * ((j >> 1) & 1);
                                const int qi = m0 + 8 * (j >> 2) + qc_l + (j & 1);
                                if (key >= SM90B_LEN_K || (p.causal && key > qi + coff)) sc[j] = -INFINITY;
                            }
                        }
#pragma unroll
                        for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                const int j = 8 * kk + 2 * r, q = 16 * kk + 8 * (r >> 1) + qc_l;
                                const float2 l2 = *(const float2 *)(vec + q);
                                const float p0 = sm90_exp2(fmaf(sc[j], p.scale_log2, -l2.x));
                                const float p1 = sm90_exp2(fmaf(sc[j + 1], p.scale_log2, -l2.y));
                                sc[j] = p0, sc[j + 1] = p1;
                            }
                    }
                    /* Dropout: the keep bits of this 64 x 64 block while dP^T is still being
                     * computed; dP^T becomes Z dP^T / (1 - p) (so that dS^T below is the dropout
                     * backward's), and the packed P^T loses its dropped entries (dV is scaled by
                     * 1 / (1 - p) in the epilogue). Register j is key row kr_l + 8 ((j >> 1) & 1),
                     * query column 8 (j >> 2) + qc_l + (j & 1): bit 4 (j >> 2) of keep[2 ((j >> 1)
                     * & 1) + (j & 1)]. */
                    uint32_t keep[4];
                    if constexpr (FEATS)
                        if (p.drop_on)
                            fc_keep_cols<BM / 8>(p.drop, p.drop_offset + (uint64_t)((int64_t)b * p.heads_q + qh), kw0 + kr_l,
                                                 m0, lane, keep);
#define SM90B_KEPT(j_) ((keep[2 * (((j_) >> 1) & 1) + ((j_) & 1)] >> (4 * ((j_) >> 2))) & 1)
                    uint32_t pf[BM / 16][4], dsf[BM / 16][4];
                    sm90_wgmma_wait<0>();
                    sm90_fence_regs(dp);
                    if (FEATS && p.drop_on) {
#pragma unroll
                        for (int j = 0; j < BM / 2; j++) dp[j] = SM90B_KEPT(j) ? dp[j] * p.drop_scale : 0.f;
                    }
                    if (late) {
                        /* x = softcap tanh - slope |i + SM90B_OFF - j| (log2 domain), P^T = exp2(x -
                         * lse2), dS^T = P^T (dP^T - delta) (1 - tanh^2) */
#pragma unroll
                        for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                const int j = 8 * kk + 2 * r, q = 16 * kk + 8 * (r >> 1) + qc_l;
                                const float2 l2 = *(const float2 *)(vec + q);
                                const float2 dl = *(const float2 *)(vec + BM + q);
                                const float t0 = sc[j], t1 = sc[j + 1];
                                float x0 = p.softcap_log2 * t0, x1 = p.softcap_log2 * t1;
                                if (p.alibi_on) {
                                    x0 -= slope2 * fabsf(SM90B_DIST(j));
                                    x1 -= slope2 * fabsf(SM90B_DIST(j + 1));
                                }
                                if (need_mask) {
                                    if (SM90B_HIDDEN(j)) x0 = -INFINITY;
                                    if (SM90B_HIDDEN(j + 1)) x1 = -INFINITY;
                                }
                                const float p0 = sm90_exp2(x0 - l2.x), p1 = sm90_exp2(x1 - l2.y);
                                pf[kk][r] = sm90_pack2<BF16>(p0, p1);
                                dsf[kk][r] = sm90_pack2<BF16>(p0 * (dp[j] - dl.x) * (1.f - t0 * t0),
                                                              p1 * (dp[j + 1] - dl.y) * (1.f - t1 * t1));
                            }
                    } else {
                        /* dS^T = P^T (dP^T - delta), packed */
#pragma unroll
                        for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                const int j = 8 * kk + 2 * r, q = 16 * kk + 8 * (r >> 1) + qc_l;
                                const float2 dl = *(const float2 *)(vec + BM + q);
                                const float p0 = sc[j], p1 = sc[j + 1];
                                pf[kk][r] = sm90_pack2<BF16>(p0, p1);
                                dsf[kk][r] = sm90_pack2<BF16>(p0 * (dp[j] - dl.x), p1 * (dp[j + 1] - dl.y));
                            }
                    }
                    if (FEATS && p.drop_on) {
#pragma unroll
                        for (int j = 0; j < BM / 2; j += 2)
                            pf[j >> 3][(j >> 1) & 3] &=
                                (SM90B_KEPT(j) ? 0xffffu : 0u) | (SM90B_KEPT(j + 1) ? 0xffff0000u : 0u);
                    }
#undef SM90B_KEPT
#undef SM90B_DIST
#undef SM90B_HIDDEN
                    /* dS into panel c of the dS tile, [query][key] with the 128-byte swizzle
                     * (the K-major A of dQ = dS K). Lanes of one store hit 16 distinct words. */
                    if (LAG && it >= NDS) /* the other consumer's dQ product has read this buffer */
                        sm90_mbar_wait(&ds_read[(1 - c) * NDS + it % NDS], ((it - NDS) / NDS) & 1);
                    if constexpr (FC_SM90B_DS_STSM) {
                        /* dsf[kk] holds four 8 x 8 matrices of dS^T: key half r & 1 of the warp's 16
                         * keys, query octet 2 kk + (r >> 1); stored transposed, lane 8 i + r of the
                         * warp addresses query row 16 kk + 8 (i >> 1) + r, keys 8 (i & 1) on */
                        const uint32_t panel = sds + c * (BM * 128);
                        const int mi = lane >> 3, key = (warp & 3) * 16 + 8 * (mi & 1);
#pragma unroll
                        for (int kk = 0; kk < BM / 16; kk++) {
                            const int q = 16 * kk + 8 * (mi >> 1) + (lane & 7);
                            sm90_stmatrix_x4_trans(panel + q * 128 + (((key >> 3) ^ (q & 7)) << 4), dsf[kk][0], dsf[kk][1],
                                                   dsf[kk][2], dsf[kk][3]);
                        }
                    } else {
                        const uint32_t panel = sds + c * (BM * 128);
#pragma unroll
                        for (int j = 0; j < BM / 2; j++) {
                            const int kr = kr_l + 8 * ((j >> 1) & 1);
                            const int q = 8 * (j >> 2) + qc_l + (j & 1);
                            const uint32_t w = dsf[j >> 3][(j >> 1) & 3];
                            const uint16_t v = (uint16_t)((j & 1) ? (w >> 16) : (w & 0xffffu));
                            sm90_st_shared_b16(panel + q * 128 + ((((kr >> 3) ^ (q & 7)) << 4) | ((kr & 7) * 2)), v);
                        }
                    }
                    sm90_fence_proxy_async();
                    /* d128: both halves of dS are in; d64: this consumer's is, and the two
                     * consumers stay free of each other, so one's exponentials can run beside the
                     * other's products */
                    /* LAG: the unit of block dq_blk (LAG blocks back; in the first LAG iterations
                     * the first block's, unused) comes next; wait for the other consumer's half of
                     * its dS here, before this block's products are in flight */
                    const bool dq_real = it >= LAG;
                    const int dq_blk = dq_real ? it - LAG : 0;
                    if constexpr (LAG > 0) {
                        sm90_mbar_arrive(&ds_full[c * NDS + it % NDS]);
                        sm90_mbar_wait(&ds_full[(1 - c) * NDS + dq_blk % NDS], (dq_blk / NDS) & 1);
                    } else if constexpr (D == 128)
                        sm90_bar_sync(SM90B_BAR_DS, 256);
                    else
                        sm90_bar_sync(SM90B_BAR_DS_OWN0 + c, 128);

                    /* dQ's product first, in a commit group of its own, then dV and dK, so that
                     * the dQ unit's store or reduction (and, in deterministic mode, the wait for
                     * its turn) runs while the tensor cores work on dV and dK; d128 with the
                     * lag or FC_SM90B_DQ_FIRST128 off waits for all three first. */
                    constexpr bool DQ_FIRST = D == 64 || (FC_SM90B_DQ_FIRST128 && LAG == 0);
                    float dqa[DQN];
                    if (PINGPONG) sm90_bar_sync(SM90B_BAR_TURN0 + c, 256); /* this consumer's turn */
                    sm90_wgmma_fence();
                    if constexpr (!DQ_FIRST) {
                        sm90b_issue_rs<D, BM, BF16, DESC_STEP>(dv, pf, sdo_t);
                        sm90b_issue_rs<D, BM, BF16, DESC_STEP>(dk, dsf, sq_t);
                        sm90_wgmma_commit();
                    }
                    SM90B_ISSUE_DQ(LAG ? sbase + L::DS_OFF + (dq_blk % NDS) * L::DS_BYTES : sds);
                    /* the turn ends with the next block's S^T and dP^T; after the last block's
                     * products the leader hands over once more, for the follower's last turn */
                    if (PINGPONG && c == 0 && it == n_iter - 1) sm90_bar_arrive(SM90B_BAR_TURN0 + 1, 256);
                    if constexpr (DQ_FIRST) {
                        sm90b_issue_rs<D, BM, BF16, DESC_STEP>(dv, pf, sdo_t);
                        sm90b_issue_rs<D, BM, BF16, DESC_STEP>(dk, dsf, sq_t);
                        sm90_wgmma_commit();
                    }
                    sm90_fence_regs(dv);
                    sm90_fence_regs(dk);
                    sm90_fence_regs(pf);
                    sm90_fence_regs(dsf);
                    sm90_fence_regs(dqa);
                    if constexpr (DQ_FIRST) {
                        sm90_wgmma_wait<1>(); /* dQ is in; dV and dK may still run */
                    } else {
                        sm90_wgmma_wait<0>();
                        sm90_fence_regs(dv);
                        sm90_fence_regs(dk);
                        sm90_mbar_arrive(&q_empty[s]); /* Q, dO and the vectors are read */
                        if (LAG && dq_real) sm90_mbar_arrive(&ds_read[c * NDS + dq_blk % NDS]);
                    }
                    sm90_fence_regs(dqa);

                    /* d64: the two consumers' partial dQ (each over its own 64 keys) are summed
                     * in shared memory and added to global memory once (by the reducing warp, or
                     * by consumer 1): half the adds into L2, and in deterministic mode half the
                     * turns. Consumer 0 stores its partial and goes on (it waits only for a buffer
                     * not yet read, two blocks back). */
                    if constexpr (D == 64) {
                        const uint32_t pbuf = sbase + L::DQ_OFF + (g & 1) * L::DQ_BYTES + t * 16;
                        sm90b_dq_pair_sum<(bool)FC_SM90B_DQ_BULK64, (bool)PST>(
                            dqa, pbuf, c, g & 1, g >= 2, it + 2 < n_iter, (uint32_t)(((g >> 1) + 1) & 1), &dq_full[g & 1],
                            &dq_empty[g & 1], PST ? &SM90B_HDR(g & 1) : nullptr, PST ? SM90B_PST_ROW(qh, m0) : 0);
                    }
                    /* dQ unit c (d64: the consumers' sum, from consumer 1) into the accumulator,
                     * fragment order (LAG: not the first iterations' repeats) */
                    if (!LAG || dq_real)
                        SM90B_ADD_DQ_UNIT(PST ? g : dq_blk, LAG ? qh0 + SM90B_UNIT(dq_blk) / nm : qh,
                                          LAG ? (m_min + SM90B_UNIT(dq_blk) % nm) * BM : m0);
                    if constexpr (DQ_FIRST) {
                        sm90_wgmma_wait<0>();
                        sm90_fence_regs(dv);
                        sm90_fence_regs(dk);
                        sm90_mbar_arrive(&q_empty[s]); /* Q, dO and the vectors are read */
                    }
                }
                if constexpr (LAG > 0) {
                    /* the last LAG blocks' units (with fewer blocks, the first block's repeated,
                     * unused, for the blocks before it) */
#pragma unroll
                    for (int u = 0; u < LAG; u++) {
                        const int blk = n_iter - LAG + u, rb = max(blk, 0);
                        float dqa[DQN];
                        sm90_mbar_wait(&ds_full[(1 - c) * NDS + rb % NDS], (rb / NDS) & 1);
                        sm90_wgmma_fence();
                        SM90B_ISSUE_DQ(sbase + L::DS_OFF + (rb % NDS) * L::DS_BYTES);
                        sm90_fence_regs(dqa);
                        sm90_wgmma_wait<0>();
                        sm90_fence_regs(dqa);
                        if (blk >= 0)
                            SM90B_ADD_DQ_UNIT(blk, qh0 + SM90B_UNIT(blk) / nm, (m_min + SM90B_UNIT(blk) % nm) * BM);
                    }
                }
                if constexpr (PST) sm90_mbar_arrive(kv_empty); /* this tile's last product has read K and V */
            }

            /* ---------------- epilogue: dK (scaled) and dV, 16-bit, straight to global ---------------- */
            if (FEATS && p.drop_on) {
#pragma unroll
                for (int j = 0; j < D / 2; j++) dv[j] *= p.drop_scale;
            }
            const int kw0_e = SM90B_KW0, hk_e = SM90B_EHK, tb_e = SM90B_ETB; /* the tile's */
#pragma unroll
            for (int j = 0; j < D / 2; j += 2) {
                const int key = kw0_e + kr_l + 8 * ((j >> 1) & 1);
                const int col = 8 * (j >> 2) + qc_l;
                if (key < SM90B_LEN_K) {
                    const int64_t tok = SM90B_K0 + key;
                    if (p.hsplit > 1) {
                        const int64_t at = (((int64_t)tb_e * p.seqlen_k + tok) * p.heads_kv + hk_e) * D + col;
                        sm90_red_add_v2(p.dk_acc + at, dk[j] * p.scale, dk[j + 1] * p.scale);
                        sm90_red_add_v2(p.dv_acc + at, dv[j], dv[j + 1]);
                        continue;
                    }
                    sm90b_store_pair<BF16>(p.dk, tb_e * p.dk_sb + tok * p.dk_ss + hk_e * p.dk_sh + col, dk[j] * p.scale,
                                           dk[j + 1] * p.scale);
                    sm90b_store_pair<BF16>(p.dv, tb_e * p.dv_sb + tok * p.dv_ss + hk_e * p.dv_sh + col, dv[j],
                                           dv[j + 1]);
                }
            }
        }
    }
#undef SM90B_KW0
#undef SM90B_EHK
#undef SM90B_ETB
#undef SM90B_QH0
#undef SM90B_MMIN
#undef SM90B_NM
#undef SM90B_NITER
#undef SM90B_PST_ROW
#undef SM90B_TILE_S
#undef SM90B_HDR
#undef SM90B_SLOT_NB
#undef SM90B_SLOT_HK
#undef SM90B_SLOT_B
#undef SM90B_SLOT_QH0
#undef SM90B_SLOT_G0
#undef SM90B_ADD_DQ
#undef SM90B_UNIT
#undef SM90B_DET_RANK
#undef SM90B_ISSUE_DQ
#undef SM90B_ADD_DQ_UNIT
#undef SM90B_WS_ROW
#undef SM90B_OFF
#undef SM90B_LEN_Q
#undef SM90B_LEN_K
#undef SM90B_Q0
#undef SM90B_K0
#undef SM90B_TB
#endif
}

/* ---- 3. dQ conversion ------------------------------------------------------------------------ */

typedef struct sm90_bwd_post_params {
    const float *dq_acc;
    void *dq;
    int64_t dq_sb, dq_ss, dq_sh;
    int seqlen_q, seqlen_k, sqr, heads_q, bm;
    float scale;
    int top_left, max_q; /* varlen (FEAT = 2), as sm90_bwd_params */
    const int32_t *cu_q, *cu_k;
} sm90_bwd_post_params;

template <int BF16>
static __device__ __forceinline__ void sm90b_store_one(void *base, int64_t off, float x)
{
    ((uint16_t *)base)[off] = (uint16_t)(sm90_pack2<BF16>(x, 0.f) & 0xffffu);
}

/* One block per (query block, head, batch or varlen sequence). Float 4i of the block's
 * accumulator holds, for unit u = 4i / (64 bm), thread tt = (4i % 512) / 4 (warp w, lane l)
 * and group g = (4i % (64 bm)) / 512, the registers 4g..4g+3 of the unit's wgmma fragment:
 * fragment rows 16 w + l / 4 and 8 more, columns 8g + 2 (l % 4) + {0, 1}. A 64-row block's
 * unit is dQ (rows are queries, columns head-dim columns 64 u on); an 80-row block's is dQ^T
 * (rows are head-dim columns, columns are queries). */
template <int D, int BF16, int FEAT>
__global__ void __launch_bounds__(256) fc_sm90_bwd_post(const sm90_bwd_post_params p)
{
    const int mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int m0 = mb * p.bm, unit = p.bm * 64;
    const bool transposed = p.bm != 64;
    const sm90b_seq sq = sm90b_seq_of<FEAT>(p, b, p.heads_q, p.sqr, p.bm);
    if (m0 >= sq.nq) return;
    const float4 *acc = (const float4 *)(p.dq_acc + (sq.ws0 + (int64_t)h * p.sqr + m0) * D);
    const int64_t base = sq.tb * p.dq_sb + h * p.dq_sh;
    for (int i = threadIdx.x; i < p.bm * D / 4; i += 256) {
        const int pos = 4 * i, u = pos / unit, g = (pos - u * unit) >> 9, tt = (pos & 511) >> 2;
        const int w = tt >> 5, l = tt & 31;
        const int fr = 16 * w + (l >> 2), fc = 8 * g + 2 * (l & 3);
        const float4 v = acc[i];
        if (transposed) { /* (query fc, column fr), (fc + 1, fr), (fc, fr + 8), (fc + 1, fr + 8) */
            const int col = 64 * u + fr;
            const int64_t row0 = (int64_t)(sq.q0 + m0 + fc) * p.dq_ss;
            if (m0 + fc < sq.nq) {
                sm90b_store_one<BF16>(p.dq, base + row0 + col, v.x * p.scale);
                sm90b_store_one<BF16>(p.dq, base + row0 + col + 8, v.z * p.scale);
            }
            if (m0 + fc + 1 < sq.nq) {
                sm90b_store_one<BF16>(p.dq, base + row0 + p.dq_ss + col, v.y * p.scale);
                sm90b_store_one<BF16>(p.dq, base + row0 + p.dq_ss + col + 8, v.w * p.scale);
            }
            continue;
        }
        const int r0 = m0 + fr, r1 = m0 + fr + 8, col = fc + 64 * u;
        if (r0 < sq.nq)
            sm90b_store_pair<BF16>(p.dq, base + (int64_t)(sq.q0 + r0) * p.dq_ss + col, v.x * p.scale, v.y * p.scale);
        if (r1 < sq.nq)
            sm90b_store_pair<BF16>(p.dq, base + (int64_t)(sq.q0 + r1) * p.dq_ss + col, v.z * p.scale, v.w * p.scale);
    }
}

/* dK and dV of a split GQA group: the fp32 accumulators (dK already scaled) to 16 bits. One
 * block per (key block of SM90B_BN keys, kv head, batch or varlen sequence), the key rows
 * the main kernel's CTA of the same coordinates covers, so that rows of no sequence stay
 * untouched as they do without the split. */
typedef struct sm90_bwd_kv_post_params {
    const float *dk_acc, *dv_acc;
    void *dk, *dv;
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int seqlen_q, seqlen_k, heads_kv;
    int top_left, max_q; /* varlen (FEAT = 2), as sm90_bwd_params */
    const int32_t *cu_q, *cu_k;
} sm90_bwd_kv_post_params;

template <int D, int BF16, int FEAT>
__global__ void __launch_bounds__(256) fc_sm90_bwd_kv_post(const sm90_bwd_kv_post_params p)
{
    const int n0 = blockIdx.x * SM90B_BN, hk = blockIdx.y, b = blockIdx.z;
    const sm90b_seq sq = sm90b_seq_of<FEAT>(p, b, 0, 0, 64); /* keys only */
    const int rows = min(SM90B_BN, sq.nk - n0);
    for (int i = threadIdx.x; i < rows * (D / 2); i += 256) {
        const int64_t tok = sq.k0 + n0 + i / (D / 2);
        const int col = 2 * (i % (D / 2));
        const int64_t at = (((int64_t)sq.tb * p.seqlen_k + tok) * p.heads_kv + hk) * D + col;
        const float2 gk = *(const float2 *)(p.dk_acc + at), gv = *(const float2 *)(p.dv_acc + at);
        sm90b_store_pair<BF16>(p.dk, sq.tb * p.dk_sb + tok * p.dk_ss + hk * p.dk_sh + col, gk.x, gk.y);
        sm90b_store_pair<BF16>(p.dv, sq.tb * p.dv_sb + tok * p.dv_ss + hk * p.dv_sh + col, gv.x, gv.y);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

/* The kernel a call takes: a window, a softcap, ALiBi or dropout select the feature kernel
 * (FEAT 1), a varlen batch its own instantiation of it (FEAT 2), or of the plain kernel
 * without them (FEAT 3); causal alone stays plain (FEAT 0). */
static int sm90b_feat(const fc_sm90_bwd_args *a)
{
    const int feat = (a->window && (a->window_left >= 0 || a->window_right >= 0)) || a->softcap > 0.f ||
                     a->alibi_slopes != NULL || a->dropout_p > 0.f;
    if (a->cu_seqlens_q) return feat || !FC_SM90B_VARLEN_PLAIN ? 2 : 3;
    return feat;
}

/* The query rows per block of the kernel the call takes (as that kernel's SM90B_BM). */
static int sm90b_bm(const fc_sm90_bwd_args *a)
{
    return SM90B_BM(a->head_dim, sm90b_feat(a));
}

/* The most any of the head dim's kernels takes: the plain kernels' blocks or the feature
 * kernels' 64 rows. */
template <int D>
static size_t sm90b_smem_most(void)
{
    const size_t plain = sm90_bwd_layout<D, SM90B_BM(D, 0), FC_SM90B_PERSIST>::TOTAL,
                 feat = sm90_bwd_layout<D, 64>::TOTAL;
    return plain > feat ? plain : feat;
}

size_t fc_sm90_backward_smem_bytes(int head_dim)
{
    if (head_dim == 64) return sm90b_smem_most<64>();
    if (head_dim == 128) return sm90b_smem_most<128>();
    return 0;
}

/* Padded lengths and the workspace carve-up, each part 256-byte aligned. */
typedef struct sm90_bwd_ws {
    int bm, m_blocks, sqr;
    size_t lse2_off, delta_off, acc_off, sem_off, kv_off, counter_off, total;
} sm90_bwd_ws;

static size_t sm90b_align(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* How many CTAs share the query heads of one kv head's group: 1 (the CTA walks the group,
 * dK and dV summed in registers) unless the CTA with the most work would outlast half the
 * grid's share of work per SM; then the smallest divisor of the group that brings it under
 * that, or the whole group. CTAs taken in turn by the SMs finish within the share plus the
 * heaviest CTA, so half keeps a grid within 1.5 times its share. A split into one query head
 * per CTA pays the most fp32 dK and dV adds for the work it does, so where the half share
 * asks for it, the smallest divisor under the whole share is taken instead when there is one
 * (docs/PERF.md: a ragged causal GQA batch ran 4% slower split in eight than in four).
 * Work is counted in (query block x key block x query head) steps: the heaviest CTA is the
 * first key block of the longest sequence, which every query block of it sees; the grid's
 * work is a lower bound (a varlen batch's lengths are on the device: one sequence at the
 * longest, the other tokens spread evenly over the rest), so an unequal batch splits when it
 * may need to. Never in deterministic mode, whose dK and dV must not depend on the order of
 * fp32 additions. FLASHC_SM90B_HSPLIT=n forces n (a divisor of the group) outside
 * deterministic mode, for comparisons. */
static int sm90b_group_split(const fc_sm90_bwd_args *a)
{
    const int group = a->heads_kv > 0 ? a->heads_q / a->heads_kv : 1;
    if (group <= 1 || a->deterministic || a->num_sms <= 0) return 1;
    static const long forced = sm90_env_long("FLASHC_SM90B_HSPLIT", 0);
    if (forced >= 1 && forced <= group && group % forced == 0) return (int)forced;
    const double bm = sm90b_bm(a), bn = SM90B_BN;
    /* a causal mask leaves at least about half of the blocks (a window: counted as none) */
    const double live = a->causal && !a->window ? 0.5 : 1.0;
    double heaviest, work;
    if (a->cu_seqlens_q) {
        const double mq = a->max_seqlen_q, mk = a->max_seqlen_k;
        heaviest = ceil(mq / bm) * group;
        work = ceil(mq / bm) * ceil(mk / bn);
        const int rest = a->num_seqs - 1;
        const double rq = (a->seqlen_q - mq) / (rest > 0 ? rest : 1), rk = (a->seqlen_k - mk) / (rest > 0 ? rest : 1);
        if (rest > 0 && rq > 0 && rk > 0) work += rest * ceil(rq / bm) * ceil(rk / bn);
        work *= live * group * a->heads_kv;
    } else {
        const double qb = ceil(a->seqlen_q / bm), kb = ceil(a->seqlen_k / bn);
        heaviest = qb * group;
        work = live * qb * kb * group * a->heads_kv * a->batch;
    }
    const double share = work / a->num_sms;
    int under_half = group, under_whole = group; /* the smallest divisors under each bound */
    for (int d = group; d >= 1; d--) {
        if (group % d) continue;
        if (heaviest / d <= share / 2) under_half = d;
        if (heaviest / d <= share) under_whole = d;
    }
    return under_half < group ? under_half : under_whole;
}

/* CTAs of the persistent grid (FC_SM90B_PERSIST) for the plain fixed-length kernel, or 0 for
 * one CTA per tile. The CTAs take the tiles in dispatch order from a counter as they free up
 * (under a bottom-right causal mask, or none). Not top-left causal (whose last key blocks may
 * see no query at all), nor deterministic mode, whose turns rely on each key block's CTA
 * running once the ones before it have started. One CTA per SM, where there are more tiles
 * than SMs; FLASHC_SM90B_CTAS=n forces n, for tests and comparisons. */
static int sm90b_persistent_ctas(const fc_sm90_bwd_args *a, int64_t tiles)
{
    if (!FC_SM90B_PERSIST || a->causal == 2 || a->deterministic || tiles >= 0x7fffffff - 65536 || a->num_sms <= 0)
        return 0;
    static const long forced = sm90_env_long("FLASHC_SM90B_CTAS", 0);
    /* at most 65536 CTAs, so that a tile index plus the grid stays an int */
    if (forced >= 1) return (int)(forced < tiles ? (forced < 65536 ? forced : 65536) : tiles);
    return tiles > a->num_sms ? a->num_sms : 0;
}

static sm90_bwd_ws sm90b_workspace(const fc_sm90_bwd_args *a)
{
    sm90_bwd_ws w;
    memset(&w, 0, sizeof w);
    w.bm = sm90b_bm(a);
    w.m_blocks = (a->seqlen_q + w.bm - 1) / w.bm;
    w.sqr = w.m_blocks * w.bm;
    if (a->cu_seqlens_q) { /* per head: the packed sequences, each padded (varlen.cuh) */
        w.sqr = (int)(w.bm == 80 ? FC_VARLEN_WS_ROWS80(a->seqlen_q, a->num_seqs)
                                 : FC_VARLEN_WS_ROWS(a->seqlen_q, a->num_seqs));
        w.m_blocks = w.sqr / w.bm;
    }
    const size_t rows = (size_t)a->batch * a->heads_q * w.sqr;
    w.lse2_off = 0;
    w.delta_off = sm90b_align(rows * 4);
    w.acc_off = w.delta_off + sm90b_align(rows * 4);
    w.sem_off = w.acc_off + sm90b_align(rows * a->head_dim * 4);
    w.kv_off = w.sem_off + (a->deterministic ? sm90b_align((size_t)a->batch * a->heads_q * w.m_blocks * 2 * 4) : 0);
    /* the fp32 dK and dV of a split GQA group: 2 x seqlen_k x heads_kv x head_dim floats */
    const int split = sm90b_group_split(a) > 1;
    w.counter_off = w.kv_off + (split ? 2 * sm90b_align((size_t)a->batch * a->seqlen_k * a->heads_kv * a->head_dim * 4) : 0);
    /* the persistent causal grid's tile counter */
    w.total = w.counter_off + (FC_SM90B_PERSIST ? 256 : 0);
    return w;
}

size_t fc_sm90_backward_workspace_size(const fc_sm90_bwd_args *a)
{
    return sm90b_workspace(a).total;
}

static int sm90b_stride_ok(int64_t stride, int64_t extent)
{
    if (extent <= 1) return 1; /* never stepped along */
    return stride > 0 && stride % 8 == 0 && stride < (1ll << 39);
}

int fc_sm90_backward_supported(const fc_sm90_bwd_args *a, int sm_major, int sm_minor, size_t smem_optin)
{
    if (sm_major != 9 || sm_minor != 0) return 0;
    const size_t need = fc_sm90_backward_smem_bytes(a->head_dim);
    if (need == 0 || need > smem_optin) return 0;
    if (!(a->scale > 0.f) || !isfinite(a->scale)) return 0; /* masked scores are -inf */
    if (a->causal < 0 || a->causal > 2) return 0;
    if (a->window && (a->window_left < -1 || a->window_right < -1)) return 0;
    if (!(a->softcap >= 0.f) || !isfinite(a->softcap)) return 0;
    if (!(a->dropout_p >= 0.f && a->dropout_p < 1.f)) return 0;
    if (a->alibi_slopes && ((uintptr_t)a->alibi_slopes % 4 != 0 || a->alibi_batch_stride < 0)) return 0;
    if (a->batch < 1 || a->batch > 65535 || a->heads_q < 1 || a->heads_q > 65535) return 0;
    if (a->heads_kv < 1 || a->heads_q % a->heads_kv != 0) return 0;
    if (a->seqlen_q < 1 || a->seqlen_k < 1 || a->seqlen_q > 0x7fff0000 || a->seqlen_k > 0x7fff0000) return 0;
    if (a->cu_seqlens_q || a->cu_seqlens_k) {
        if (!a->cu_seqlens_q || !a->cu_seqlens_k || a->batch != 1 || a->num_seqs < 1 || a->num_seqs > 65535 ||
            a->max_seqlen_q < 1 || a->max_seqlen_k < 1 || (uintptr_t)a->cu_seqlens_q % 4 != 0 ||
            (uintptr_t)a->cu_seqlens_k % 4 != 0 || FC_VARLEN_WS_ROWS(a->seqlen_q, a->num_seqs) > 0x7fff0000 ||
            FC_VARLEN_WS_ROWS80(a->seqlen_q, a->num_seqs) > 0x7fff0000)
            return 0;
    }
    const void *ptrs[8] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 8; i++)
        if (!ptrs[i] || (uintptr_t)ptrs[i] % 16 != 0) return 0;
    if (!a->lse) return 0;
    const int64_t B = a->batch, SQ = a->seqlen_q, SK = a->seqlen_k, HQ = a->heads_q, HK = a->heads_kv;
    const int64_t st[8][3] = {{a->q_sb, a->q_ss, a->q_sh},    {a->k_sb, a->k_ss, a->k_sh},
                              {a->v_sb, a->v_ss, a->v_sh},    {a->o_sb, a->o_ss, a->o_sh},
                              {a->do_sb, a->do_ss, a->do_sh}, {a->dq_sb, a->dq_ss, a->dq_sh},
                              {a->dk_sb, a->dk_ss, a->dk_sh}, {a->dv_sb, a->dv_ss, a->dv_sh}};
    const int64_t ext[8][3] = {{B, SQ, HQ}, {B, SK, HK}, {B, SK, HK}, {B, SQ, HQ},
                               {B, SQ, HQ}, {B, SQ, HQ}, {B, SK, HK}, {B, SK, HK}};
    for (int i = 0; i < 8; i++)
        for (int d = 0; d < 3; d++)
            if (!sm90b_stride_ok(st[i][d], ext[i][d])) return 0;
    return 1;
}

template <int D, int BF16, int FEAT>
static cudaError_t sm90b_launch(const fc_sm90_bwd_args *a, const sm90_bwd_ws *w, cudaStream_t stream)
{
    constexpr int BM = SM90B_BM(D, FEAT);
    uint8_t *ws = (uint8_t *)a->workspace;
    float *lse2 = (float *)(ws + w->lse2_off), *delta = (float *)(ws + w->delta_off);
    float *acc = (float *)(ws + w->acc_off);
    int *sem = a->deterministic ? (int *)(ws + w->sem_off) : NULL;

    CUtensorMap tq, tk, tv, tdo;
    if (!fc_sm90_encode_map(&tq, a->q, BF16, D, a->seqlen_q, a->heads_q, a->batch, a->q_ss, a->q_sh, a->q_sb, BM) ||
        !fc_sm90_encode_map(&tk, a->k, BF16, D, a->seqlen_k, a->heads_kv, a->batch, a->k_ss, a->k_sh, a->k_sb,
                      SM90B_BN) ||
        !fc_sm90_encode_map(&tv, a->v, BF16, D, a->seqlen_k, a->heads_kv, a->batch, a->v_ss, a->v_sh, a->v_sb,
                      SM90B_BN) ||
        !fc_sm90_encode_map(&tdo, a->dout, BF16, D, a->seqlen_q, a->heads_q, a->batch, a->do_ss, a->do_sh, a->do_sb, BM))
        return cudaErrorInvalidValue;

    sm90_bwd_pre_params pre;
    memset(&pre, 0, sizeof pre);
    pre.o = a->o, pre.dout = a->dout, pre.lse = a->lse;
    pre.o_sb = a->o_sb, pre.o_ss = a->o_ss, pre.o_sh = a->o_sh;
    pre.do_sb = a->do_sb, pre.do_ss = a->do_ss, pre.do_sh = a->do_sh;
    pre.lse_sb = a->lse_sb, pre.lse_sh = a->lse_sh, pre.lse_ss = a->lse_ss;
    pre.lse2 = lse2, pre.delta = delta, pre.dq_acc = acc, pre.sem = sem;
    pre.seqlen_q = a->seqlen_q, pre.seqlen_k = a->seqlen_k, pre.sqr = w->sqr, pre.heads_q = a->heads_q;
    pre.bm = BM, pre.m_blocks = w->m_blocks;
    /* varlen: the CTA batch is the sequence, max_seqlen_q rows (and keys) each */
    const int varlen = FEAT >= 2;
    const int seqs = varlen ? a->num_seqs : a->batch;
    const int q_rows = varlen ? (a->max_seqlen_q + BM - 1) / BM * BM : w->sqr;
    const int k_rows = varlen ? a->max_seqlen_k : a->seqlen_k;
    pre.top_left = a->causal == 2, pre.max_q = a->max_seqlen_q;
    pre.cu_q = a->cu_seqlens_q, pre.cu_k = a->cu_seqlens_k;
    /* the pre- and post-passes only tell fixed lengths (0) from varlen (2) */
    constexpr int PF = FEAT >= 2 ? 2 : 0;
    fc_sm90_bwd_pre<D, BF16, PF><<<dim3((q_rows + SM90B_PRE_ROWS(D) - 1) / SM90B_PRE_ROWS(D), a->heads_q, seqs),
                                   SM90B_PRE_THREADS, 0, stream>>>(pre);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    sm90_bwd_params p;
    memset(&p, 0, sizeof p);
    p.lse2 = lse2, p.delta = delta, p.dq_acc = acc, p.sem = sem;
    p.dk = a->dk, p.dv = a->dv;
    p.dk_sb = a->dk_sb, p.dk_ss = a->dk_ss, p.dk_sh = a->dk_sh;
    p.dv_sb = a->dv_sb, p.dv_ss = a->dv_ss, p.dv_sh = a->dv_sh;
    p.seqlen_q = a->seqlen_q, p.seqlen_k = a->seqlen_k, p.sqr = w->sqr, p.heads_q = a->heads_q;
    p.group = a->heads_q / a->heads_kv, p.m_blocks = w->m_blocks;
    p.causal = a->causal != 0;
    p.causal_offset = a->causal == 1 ? a->seqlen_k - a->seqlen_q : 0; /* as flashc_key_end */
    p.deterministic = a->deterministic != 0;
    /* The deterministic turns (sm90b_det_rank) of the fixed-length plain kernel, where a
     * head's key blocks fit on the device at once (one CTA per SM): descending under a causal
     * mask, in walks that start apart without one at d128 (at d64 the walks apart measured
     * +4% at 2k and -11 to -14% at 8k-16k, so its walks stay ascending).
     * FLASHC_SM90B_DET_ORDER=ascending keeps the ascending turns everywhere, for comparisons. */
    {
        const int nk = (a->seqlen_k + SM90B_BN - 1) / SM90B_BN, units = w->m_blocks * p.group;
        static const int ascending = sm90_env_is("FLASHC_SM90B_DET_ORDER", "ascending");
        const int spread = p.deterministic && FEAT == 0 && nk <= a->num_sms && !ascending;
        p.det_desc = spread && p.causal;
        p.det_stride = spread && !p.causal && D == 128 ? units / nk : 0;
    }
    p.scale = a->scale;
    p.scale_log2 = a->scale * 1.4426950408889634f;
    if (FEAT) {
        /* as the forward's launcher: causal is the band's right edge at the diagonal */
        const int window = a->window && (a->window_left >= 0 || a->window_right >= 0);
        const int64_t wl = window ? a->window_left : -1, wr = window ? a->window_right : -1;
        const int64_t big = 0x7fffffff;
        p.off = a->causal == 2 ? 0 : a->seqlen_k - a->seqlen_q;
        p.has_left = wl >= 0;
        p.left = (int)(wl > big ? big : (wl < 0 ? 0 : wl));
        p.has_right = a->causal != 0 || wr >= 0;
        p.right = a->causal != 0 ? 0 : (int)(wr > big ? big : (wr < 0 ? 0 : wr));
        p.softcap_on = a->softcap > 0.f;
        p.alibi_on = a->alibi_slopes != NULL;
        p.transform = p.softcap_on || p.alibi_on;
        p.score_log2 = p.scale_log2;
        if (p.softcap_on) {
            p.softcap_pre = a->scale / a->softcap;
            p.softcap_log2 = a->softcap * 1.4426950408889634f;
        }
        p.alibi = a->alibi_slopes;
        p.alibi_sb = a->alibi_batch_stride;
        if (p.transform) p.scale_log2 = 1.f;
        p.top_left = a->causal == 2, p.max_q = a->max_seqlen_q;
        p.cu_q = a->cu_seqlens_q, p.cu_k = a->cu_seqlens_k;
        p.drop_on = a->dropout_p > 0.f;
        p.drop.seed = a->dropout_seed;
        p.drop.threshold = a->dropout_threshold;
        p.drop_offset = a->dropout_offset;
        p.drop_scale = p.drop_on ? (float)(1.0 / (1.0 - (double)a->dropout_p)) : 1.f;
    }
    const uint32_t smem = sm90_bwd_layout<D, BM>::TOTAL;
    err = cudaFuncSetAttribute(fc_sm90_bwd_kernel<D, BF16, FEAT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    const int k_blocks = (k_rows + SM90B_BN - 1) / SM90B_BN;
    p.heads_kv = a->heads_kv;
    p.hsplit = sm90b_group_split(a);
    if (p.hsplit > 1) {
        p.dk_acc = (float *)(ws + w->kv_off);
        p.dv_acc = p.dk_acc + (size_t)a->batch * a->seqlen_k * a->heads_kv * D;
        err = cudaMemsetAsync(p.dk_acc, 0, 2 * (size_t)a->batch * a->seqlen_k * a->heads_kv * D * 4, stream);
        if (err != cudaSuccess) return err;
    }
    /* Key blocks ascending along x: with the in-order dispatch of CTAs, the block a
     * deterministic-mode semaphore waits for was started before the waiting one. */
    dim3 grid(k_blocks, a->heads_kv * p.hsplit, seqs);
    constexpr bool PST_OK = FEAT == 0 && SM90B_PST_BUILT(D);
    const int64_t tiles = (int64_t)k_blocks * grid.y * seqs;
    int ctas = 0;
    if constexpr (PST_OK) ctas = sm90b_persistent_ctas(a, tiles);
    if (ctas > 0) {
        if constexpr (PST_OK) {
            p.tiles = (int)tiles, p.k_blocks = k_blocks, p.tile_y = (int)grid.y;
            p.tile_counter = (int *)(ws + w->counter_off);
            err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
            if (err != cudaSuccess) return err;
            const uint32_t smem_p = sm90_bwd_layout<D, BM, 1>::TOTAL;
            err = cudaFuncSetAttribute(fc_sm90_bwd_kernel<D, BF16, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem_p);
            if (err != cudaSuccess) return err;
            fc_sm90_bwd_kernel<D, BF16, 0, 1><<<ctas, SM90B_THREADS, smem_p, stream>>>(tq, tk, tv, tdo, p);
        }
    } else {
        fc_sm90_bwd_kernel<D, BF16, FEAT><<<grid, SM90B_THREADS, smem, stream>>>(tq, tk, tv, tdo, p);
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    if (p.hsplit > 1) {
        sm90_bwd_kv_post_params kp;
        memset(&kp, 0, sizeof kp);
        kp.dk_acc = p.dk_acc, kp.dv_acc = p.dv_acc, kp.dk = a->dk, kp.dv = a->dv;
        kp.dk_sb = a->dk_sb, kp.dk_ss = a->dk_ss, kp.dk_sh = a->dk_sh;
        kp.dv_sb = a->dv_sb, kp.dv_ss = a->dv_ss, kp.dv_sh = a->dv_sh;
        kp.seqlen_q = a->seqlen_q, kp.seqlen_k = a->seqlen_k, kp.heads_kv = a->heads_kv;
        kp.top_left = a->causal == 2, kp.max_q = a->max_seqlen_q;
        kp.cu_q = a->cu_seqlens_q, kp.cu_k = a->cu_seqlens_k;
        fc_sm90_bwd_kv_post<D, BF16, PF><<<dim3(k_blocks, a->heads_kv, seqs), 256, 0, stream>>>(kp);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }

    sm90_bwd_post_params post;
    memset(&post, 0, sizeof post);
    post.dq_acc = acc, post.dq = a->dq;
    post.dq_sb = a->dq_sb, post.dq_ss = a->dq_ss, post.dq_sh = a->dq_sh;
    post.seqlen_q = a->seqlen_q, post.seqlen_k = a->seqlen_k, post.sqr = w->sqr, post.heads_q = a->heads_q;
    post.bm = BM, post.scale = a->scale;
    post.top_left = a->causal == 2, post.max_q = a->max_seqlen_q;
    post.cu_q = a->cu_seqlens_q, post.cu_k = a->cu_seqlens_k;
    fc_sm90_bwd_post<D, BF16, PF><<<dim3(q_rows / BM, a->heads_q, seqs), 256, 0, stream>>>(post);
    return cudaGetLastError();
}

cudaError_t fc_sm90_backward(const fc_sm90_bwd_args *a, cudaStream_t stream)
{
    const sm90_bwd_ws w = sm90b_workspace(a);
    if (!a->workspace || a->workspace_bytes < w.total || (uintptr_t)a->workspace % 256 != 0)
        return cudaErrorInvalidValue;
#define SM90B_GO(D_, F_) \
    return a->bf16 ? sm90b_launch<D_, 1, F_>(a, &w, stream) : sm90b_launch<D_, 0, F_>(a, &w, stream)
#define SM90B_GO_FEAT(D_)             \
    switch (sm90b_feat(a)) {          \
    case 1: SM90B_GO(D_, 1);          \
    case 2: SM90B_GO(D_, 2);          \
    case 3: SM90B_GO(D_, 3);          \
    default: SM90B_GO(D_, 0);         \
    }
    if (a->head_dim == 64) SM90B_GO_FEAT(64);
    if (a->head_dim == 128) SM90B_GO_FEAT(128);
#undef SM90B_GO_FEAT
#undef SM90B_GO
    return cudaErrorInvalidValue;
}
