/*
 * decode.cu - flashc_forward_kvcache on CUDA (Flash-Decoding): a few new queries against
 * long, contiguous or paged, fp16/bf16 caches, with an optional in-place append and split-KV.
 *
 * Decoding is memory-bound: a cached key and value is used by only Nq queries of each query
 * head. So one CTA takes DEC_ROWS (query, head) pairs of one kv head's GQA group (group x Nq
 * pairs, in chunks of 16 when there are more), and reads each of that kv head's keys once for
 * all of them: S = Q K^T and O += P V are mma.sync m16n8k16 products with the pairs as the
 * 16 rows. The CTA's four warps each stream their own tiles of DEC_KT keys (tiles w, w + 4,
 * ...) through a private cp.async pipeline of STAGES tiles - no block barrier in the key
 * loop - keep their own online softmax, and are combined through shared memory at the end.
 *
 * Split-KV: when batch x kv heads x row chunks leaves SMs idle, each sequence's keys are cut
 * into num_splits ranges run by separate CTAs, each writing a normalized partial O and its
 * LSE in float32 to a workspace; a second kernel combines the splits of every row by their
 * LSE (the merge of merge.c). The append, when asked for, is a first kernel on the stream,
 * so every key the attention reads - appended ones included - is in the cache by then.
 *
 * A key at or past a sequence's length is never read: its rows are zero-filled by cp.async
 * (src-size 0) and its scores masked, so whatever the slot holds (NaN bit patterns in fresh
 * memory) cannot reach the output. cache_seqlens and block_table live in device memory and
 * are not checked by the front end; out-of-range values are clamped (a length to
 * [0, capacity], a page outside the pool read as zeros) so that no memory outside the
 * caches is touched.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "decode.h"
#include "ptx.cuh"
#include "runtime.h"

#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * 32)
#define DEC_ROWS 16 /* (query, head) pairs per CTA: one mma tile of rows */
#define DEC_KT 16   /* keys per warp tile */
#define DEC_PAD 8   /* elements of padding per shared row (conflict-free ldmatrix) */
#define DEC_MIN_SPLIT_KEYS 128
#define DEC_LOG2E 1.4426950408889634f
#define DEC_LN2 0.6931471805599453f

typedef struct fc_decode_args {
    const uint16_t *q;
    const uint16_t *kc, *vc;
    uint16_t *o;
    float *lse;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t lse_sb, lse_sh, lse_ss;
    const int32_t *cache_seqlens;
    const int32_t *block_table; /* NULL: contiguous */
    int64_t bt_stride;
    int page_shift, num_pages;
    int seqlen_new, capacity;
    int batch, nq, heads_q, heads_kv, group, rows_total, chunks, head_dim;
    float scale;
    int causal;                     /* a flashc_causal */
    int window_left, window_right;  /* -1: unbounded */
    float softcap;                  /* 0: off */
    const float *alibi;             /* NULL: off */
    int64_t alibi_bstride;
    int splits, split_keys;
    float *part_o;   /* splits > 1: [splits][B][Nq][Hq][head_dim] */
    float *part_lse; /* splits > 1: [splits][B][Hq][Nq] */
} fc_decode_args;

typedef struct fc_append_args {
    const uint16_t *kn, *vn;
    uint16_t *kc, *vc;
    int64_t kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh;
    int64_t k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
    const int32_t *cache_seqlens;
    const int32_t *block_table;
    int64_t bt_stride;
    int page_shift, num_pages, capacity;
    int batch, seqlen_new, heads_kv, head_dim;
} fc_append_args;

/* L_b, clamped to what the cache holds. */
static __device__ __forceinline__ int seq_len(const int32_t *cache_seqlens, int b, int seqlen_new,
                                              int capacity)
{
    long long l = (long long)cache_seqlens[b] + seqlen_new;
    return l < 0 ? 0 : (l > capacity ? capacity : (int)l);
}

/* Element offset of key j of sequence b, kv head h, in a cache with strides (sb, ss, sh);
 * 0 when paged and the page is outside the pool. */
static __device__ __forceinline__ bool cache_offset(const int32_t *block_table, int64_t bt_stride,
                                                    int page_shift, int num_pages, int b, int j,
                                                    int64_t *outer, int64_t *slot)
{
    if (!block_table) {
        *outer = b;
        *slot = j;
        return true;
    }
    const int page = block_table[(int64_t)b * bt_stride + (j >> page_shift)];
    *outer = page;
    *slot = j & ((1 << page_shift) - 1);
    return page >= 0 && page < num_pages;
}

/* ---- append ------------------------------------------------------------------------------ */

/* One thread per 16 bytes of a new key or value row: k_new[b, t, h] goes to slot
 * cache_seqlens[b] + t of sequence b. */
__global__ void __launch_bounds__(256) fc_append_kernel(const fc_append_args a)
{
    pdl_wait();
    pdl_launch_dependents();
    const int ch_per_row = a.head_dim / 8;
    const int64_t total = (int64_t)a.batch * a.seqlen_new * a.heads_kv * ch_per_row;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < total;
         c += (int64_t)gridDim.x * blockDim.x) {
        const int ch = (int)(c % ch_per_row);
        int64_t rest = c / ch_per_row;
        const int h = (int)(rest % a.heads_kv);
        rest /= a.heads_kv;
        const int t = (int)(rest % a.seqlen_new);
        const int b = (int)(rest / a.seqlen_new);
        const long long j = (long long)a.cache_seqlens[b] + t;
        if (j < 0 || j >= a.capacity) continue;
        int64_t outer, slot;
        if (!cache_offset(a.block_table, a.bt_stride, a.page_shift, a.num_pages, b, (int)j, &outer,
                          &slot))
            continue;
        const int64_t col = (int64_t)ch * 8;
        *(uint4 *)(a.kc + outer * a.k_sb + slot * a.k_ss + h * a.k_sh + col) =
            *(const uint4 *)(a.kn + b * a.kn_sb + t * a.kn_ss + h * a.kn_sh + col);
        *(uint4 *)(a.vc + outer * a.v_sb + slot * a.v_ss + h * a.v_sh + col) =
            *(const uint4 *)(a.vn + b * a.vn_sb + t * a.vn_ss + h * a.vn_sh + col);
    }
}

/* ---- attention --------------------------------------------------------------------------- */

/* The keys query i (of the call's nq) sees within its split [ks, ke): [*lo, *hi), the rules
 * of flashc_seq_key_range (backend.h) with Nk = L. Every pair of query i (its group's heads)
 * shares them. */
static __device__ __forceinline__ void query_range(const fc_decode_args &a, int i, int L, int off,
                                                   int ks, int ke, int *lo, int *hi)
{
    const long long diag = (long long)i + off;
    long long s = 0, e = L;
    if (a.causal != FLASHC_CAUSAL_NONE && diag + 1 < e) e = diag + 1;
    if (a.window_right >= 0 && diag + a.window_right + 1 < e) e = diag + a.window_right + 1;
    if (a.window_left >= 0 && diag - a.window_left > s) s = diag - a.window_left;
    if (s < ks) s = ks;
    if (e > ke) e = ke;
    if (s >= e) s = e = 0;
    *lo = (int)s;
    *hi = (int)e;
}

/* The same for row `pair` of the CTA; pairs past the group are empty. */
static __device__ __forceinline__ void pair_range(const fc_decode_args &a, int pair, int L,
                                                  int off, int ks, int ke, int *lo, int *hi)
{
    if (pair >= a.rows_total) {
        *lo = *hi = 0;
        return;
    }
    query_range(a, pair / a.group, L, off, ks, ke, lo, hi);
}

template <int D>
struct dec_config {
    static constexpr int STAGES = D <= 128 ? 3 : 2;
    static constexpr int P = D + DEC_PAD; /* shared pitch in elements */
    static constexpr int TILE_ELEMS = 2 * DEC_KT * P; /* one stage: K then V */
    static constexpr size_t SMEM =
        (size_t)(DEC_ROWS * P + DEC_WARPS * STAGES * TILE_ELEMS) * sizeof(uint16_t);
    static constexpr bool Q_IN_REGS = D <= 128;
};

/* MODS: the softcap and ALiBi code is compiled in (1) or left out (0): in the key loop every
 * instruction counts, since with 8 warps per SM the loop's issue rate, not DRAM, is what
 * limits a long split. */
template <int D, int BF16, int MODS>
__global__ void __launch_bounds__(DEC_THREADS) fc_decode_kernel(const fc_decode_args a)
{
    using C = dec_config<D>;
    constexpr int P = C::P, CH = D / 8, STAGES = C::STAGES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint16_t *qs = (uint16_t *)smem_raw;
    uint16_t *stage_base = qs + DEC_ROWS * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int chunk = blockIdx.x % a.chunks, split = blockIdx.x / a.chunks;
    const int hk = blockIdx.y, b = blockIdx.z;
    /* launched as a dependent of the append (or of whatever ran before): it may start early,
     * and the combine after it may start as soon as every CTA of this grid is running */
    pdl_wait();
    pdl_launch_dependents();
    const int L = seq_len(a.cache_seqlens, b, a.seqlen_new, a.capacity);
    const int off = a.causal == FLASHC_CAUSAL_TOP_LEFT ? 0 : L - a.nq;
    const int ks = split * a.split_keys;
    const int ke = ks + a.split_keys < L ? ks + a.split_keys : L;
    const int pair0 = chunk * DEC_ROWS;

    /* Q of the 16 pairs (zeros for pairs past the group and columns past head_dim) into
     * registers here, where the compiler issues their loads beside the cache length's, and
     * to shared memory only once the first tiles are asked for: at batch 1 a CTA has a few
     * tiles per warp, and round trips before the first of them are much of its time
     * (docs/PERF.md, "Batch 1: the query off the first loads' path") */
    auto q_chunk = [&](int r, int ch) { /* 16 bytes of row r */
        const int pair = pair0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (pair < a.rows_total && ch * 8 < a.head_dim) {
            const int i = pair / a.group, h = hk * a.group + pair % a.group;
            v = *(const uint4 *)(a.q + b * a.q_sb + i * a.q_ss + h * a.q_sh + ch * 8);
        }
        return v;
    };
    constexpr int QCH = (DEC_ROWS * CH + DEC_THREADS - 1) / DEC_THREADS;
    uint4 qv[QCH];
#pragma unroll
    for (int u = 0; u < QCH; u++) {
        const int c = tid + u * DEC_THREADS;
        qv[u] = c < DEC_ROWS * CH ? q_chunk(c / CH, c % CH) : make_uint4(0, 0, 0, 0);
    }

    /* over the queries of the CTA's real pairs (a few: the pairs are a group's heads): the
     * union of their key ranges, which the CTA walks, and their intersection - a tile inside
     * [all_lo, all_hi) needs no mask (the padding pairs past the group are never stored) */
    int jbeg = 0x7fffffff, jend = 0, all_lo = 0, all_hi = 0x7fffffff;
    const int last_pair = (pair0 + DEC_ROWS < a.rows_total ? pair0 + DEC_ROWS : a.rows_total) - 1;
    for (int i = pair0 / a.group; i <= last_pair / a.group; i++) {
        int lo, hi;
        query_range(a, i, L, off, ks, ke, &lo, &hi);
        if (lo < hi) {
            jbeg = lo < jbeg ? lo : jbeg;
            jend = hi > jend ? hi : jend;
        }
        all_lo = lo > all_lo ? lo : all_lo;
        all_hi = hi < all_hi ? hi : all_hi;
    }
    if (jend == 0) jbeg = 0;
    int rlo[2], rhi[2], rdiag[2];
    float slope[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int pair = pair0 + g + 8 * k;
        pair_range(a, pair, L, off, ks, ke, &rlo[k], &rhi[k]);
        rdiag[k] = pair / a.group + off;
        slope[k] = 0.0f;
        if (MODS && a.alibi && pair < a.rows_total)
            slope[k] = a.alibi[b * a.alibi_bstride + hk * a.group + pair % a.group];
    }

    /* once Q is in shared memory (after the first tiles are asked for, below): its fragments
     * (up to d128) and the accumulators */
    uint32_t qf[C::Q_IN_REGS ? D / 16 : 1][4];
    const uint32_t q_lane_addr =
        smem_addr(qs + ((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8);
    float oacc[D / 8][4];
    float row_m[2], row_l[2];
    auto q_ready = [&]() {
        __syncthreads();
        if (C::Q_IN_REGS) {
#pragma unroll
            for (int kk = 0; kk < (C::Q_IN_REGS ? D / 16 : 0); kk++)
                ldmatrix_x4(qf[kk], q_lane_addr + kk * 32);
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.0f;
        row_m[0] = row_m[1] = -INFINITY;
        row_l[0] = row_l[1] = 0.0f;
    };
    const int ntiles = (jend - jbeg + DEC_KT - 1) / DEC_KT;
    const int mine = ntiles > warp ? (ntiles - warp + DEC_WARPS - 1) / DEC_WARPS : 0;
    uint16_t *wbase = stage_base + warp * STAGES * C::TILE_ELEMS;

    /* issues the cp.async copies of this warp's tile `it` into stage st: the tile's 16 rows of
     * CH 16-byte chunks, chunk c = lane + 32 i of row c / CH. A contiguous cache, or a paged
     * one whose tile lies in one page (always, for tiles aligned to 16 keys), gives row r's
     * offset as the tile's base + r x row stride; where CH divides 32 every lane keeps one
     * column and steps a pointer down the rows. A tile across pages (a window that starts
     * mid-page) looks each row's page up. */
    constexpr int CHUNKS = DEC_KT * CH / 32; /* per lane */
    auto load_tile = [&](int it, int st) {
        const int j0 = jbeg + (warp + it * DEC_WARPS) * DEC_KT;
        const uint32_t kd = smem_addr(wbase + st * C::TILE_ELEMS), vd = kd + DEC_KT * P * 2;
        const int rows = jend - j0; /* rows of the tile that hold keys */
        int64_t outer = b, slot = j0;
        bool ok = true, straddles = false;
        if (a.block_table) {
            const int last = rows < DEC_KT ? jend - 1 : j0 + DEC_KT - 1;
            straddles = (j0 >> a.page_shift) != (last >> a.page_shift);
            ok = cache_offset(a.block_table, a.bt_stride, a.page_shift, a.num_pages, b, j0, &outer,
                              &slot);
        }
        if (straddles) {
#pragma unroll
            for (int i = 0; i < CHUNKS; i++) {
                const int c = lane + 32 * i, r = c / CH, col = (c % CH) * 8, jr = j0 + r;
                int64_t o = 0, sl = 0;
                const int v = col < a.head_dim && jr < jend &&
                              cache_offset(a.block_table, a.bt_stride, a.page_shift, a.num_pages,
                                           b, jr, &o, &sl);
                const uint32_t sm = (r * P + col) * 2;
                cp_async_16(kd + sm,
                            v ? a.kc + o * a.k_sb + sl * a.k_ss + hk * a.k_sh + col : a.kc, v);
                cp_async_16(vd + sm,
                            v ? a.vc + o * a.v_sb + sl * a.v_ss + hk * a.v_sh + col : a.vc, v);
            }
            return;
        }
        const uint16_t *k_tile = a.kc + outer * a.k_sb + slot * a.k_ss + hk * a.k_sh;
        const uint16_t *v_tile = a.vc + outer * a.v_sb + slot * a.v_ss + hk * a.v_sh;
        if constexpr (32 % CH == 0) {
            constexpr int ROW_STEP = 32 / CH;
            const int r0 = lane / CH, col = (lane % CH) * 8;
            const bool col_ok = ok && col < a.head_dim;
            const uint16_t *kp = k_tile + r0 * a.k_ss + col, *vp = v_tile + r0 * a.v_ss + col;
            const uint32_t sm = (r0 * P + col) * 2;
#pragma unroll
            for (int i = 0; i < CHUNKS; i++) {
                const int v = col_ok && r0 + ROW_STEP * i < rows;
                cp_async_16(kd + sm + i * ROW_STEP * P * 2, v ? kp : a.kc, v);
                cp_async_16(vd + sm + i * ROW_STEP * P * 2, v ? vp : a.vc, v);
                kp += ROW_STEP * a.k_ss;
                vp += ROW_STEP * a.v_ss;
            }
        } else {
#pragma unroll
            for (int i = 0; i < CHUNKS; i++) {
                const int c = lane + 32 * i, r = c / CH, col = (c % CH) * 8;
                const int v = ok && col < a.head_dim && r < rows;
                const uint32_t sm = (r * P + col) * 2;
                cp_async_16(kd + sm, v ? k_tile + r * a.k_ss + col : a.kc, v);
                cp_async_16(vd + sm, v ? v_tile + r * a.v_ss + col : a.vc, v);
            }
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < mine) load_tile(s, s);
        cp_async_commit();
    }
    /* the query rows to shared memory, behind the first tiles' copies */
#pragma unroll
    for (int u = 0; u < QCH; u++) {
        const int c = tid + u * DEC_THREADS;
        if (c < DEC_ROWS * CH) *(uint4 *)(qs + (c / CH) * P + (c % CH) * 8) = qv[u];
    }
    q_ready();
    const float cap = MODS ? a.softcap : 0.0f;
    const int alibi = MODS && a.alibi != NULL;
    for (int it = 0; it < mine; it++) {
        if (it + STAGES - 1 < mine) load_tile(it + STAGES - 1, (it + STAGES - 1) % STAGES);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncwarp();
        const uint16_t *kd = wbase + (it % STAGES) * C::TILE_ELEMS, *vd = kd + DEC_KT * P;
        const int j0 = jbeg + (warp + it * DEC_WARPS) * DEC_KT;

        /* S = Q K^T: 16 pairs x 16 keys, two n-tiles of 8 keys */
        float sacc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const uint32_t k_lane_addr =
            smem_addr(kd + ((lane >> 4) * 8 + (lane & 7)) * P + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t kb[4], qa[4];
            ldmatrix_x4(kb, k_lane_addr + kk * 32);
            if (C::Q_IN_REGS) {
                qa[0] = qf[C::Q_IN_REGS ? kk : 0][0], qa[1] = qf[C::Q_IN_REGS ? kk : 0][1];
                qa[2] = qf[C::Q_IN_REGS ? kk : 0][2], qa[3] = qf[C::Q_IN_REGS ? kk : 0][3];
            } else {
                ldmatrix_x4(qa, q_lane_addr + kk * 32);
            }
            mma_16816<BF16>(sacc[0], qa, kb[0], kb[1]);
            mma_16816<BF16>(sacc[1], qa, kb[2], kb[3]);
        }

        /* scale, softcap, ALiBi, mask; then into the log2 domain */
        /* a tile every real row sees whole needs no mask (bounds that pass every key) */
        const bool unmasked = j0 >= all_lo && j0 + DEC_KT <= all_hi;
        const int mlo[2] = {unmasked ? INT_MIN : rlo[0], unmasked ? INT_MIN : rlo[1]};
        const int mhi[2] = {unmasked ? INT_MAX : rhi[0], unmasked ? INT_MAX : rhi[1]};
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = e >> 1, j = j0 + n * 8 + 2 * t4 + (e & 1);
                float x = sacc[n][e] * a.scale;
                if constexpr (MODS != 0) {
                    if (cap > 0.0f) x = cap * tanhf(x / cap);
                    if (alibi) {
                        const int dist = rdiag[k] - j;
                        x -= slope[k] * (float)(dist < 0 ? -dist : dist);
                    }
                }
                x = ((j >= mlo[k]) & (j < mhi[k])) ? x * DEC_LOG2E : -INFINITY;
                sacc[n][e] = x;
                tmax[k] = fmaxf(tmax[k], x);
            }
        float alpha[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float mnew = fmaxf(row_m[k], warp_quad_max(tmax[k]));
            const float muse = mnew == -INFINITY ? 0.0f : mnew;
            alpha[k] = fast_exp2(row_m[k] - muse);
            row_m[k] = mnew;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < 2; n++) {
                sacc[n][2 * k] = fast_exp2(sacc[n][2 * k] - muse);
                sacc[n][2 * k + 1] = fast_exp2(sacc[n][2 * k + 1] - muse);
                sum += sacc[n][2 * k] + sacc[n][2 * k + 1];
            }
            row_l[k] = row_l[k] * alpha[k] + sum;
        }
        /* once the running maxima settle, most tiles leave them alone: skip the rescale */
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                oacc[n][0] *= alpha[0], oacc[n][1] *= alpha[0];
                oacc[n][2] *= alpha[1], oacc[n][3] *= alpha[1];
            }
        }

        /* O += P V: P (two S tiles) is the A operand as it stands */
        uint32_t pa[4];
        pa[0] = pack2<BF16>(sacc[0][0], sacc[0][1]);
        pa[1] = pack2<BF16>(sacc[0][2], sacc[0][3]);
        pa[2] = pack2<BF16>(sacc[1][0], sacc[1][1]);
        pa[3] = pack2<BF16>(sacc[1][2], sacc[1][3]);
        const uint32_t v_lane_addr =
            smem_addr(vd + ((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, v_lane_addr + dp * 32);
            mma_16816<BF16>(oacc[2 * dp], pa, vb[0], vb[1]);
            mma_16816<BF16>(oacc[2 * dp + 1], pa, vb[2], vb[3]);
        }
        __syncwarp();
    }
    cp_async_wait<0>();

    /* the warps' partial results combined through shared memory (the stages are free now) */
    __syncthreads();
    constexpr int RP = D + 4; /* float pitch of the reduction rows */
    float *red = (float *)stage_base;                  /* [warps][16][RP] */
    float *wm = red + DEC_WARPS * DEC_ROWS * RP;        /* [warps][16] */
    float *wl = wm + DEC_WARPS * DEC_ROWS;              /* [warps][16] */
#pragma unroll
    for (int k = 0; k < 2; k++) row_l[k] = warp_quad_sum(row_l[k]);
    if (t4 == 0) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            wm[warp * DEC_ROWS + g + 8 * k] = row_m[k];
            wl[warp * DEC_ROWS + g + 8 * k] = row_l[k];
        }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int r = g + 8 * k;
        float mx = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++) mx = fmaxf(mx, wm[w * DEC_ROWS + r]);
        float tot = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++) {
            const float m = wm[w * DEC_ROWS + r];
            if (m != -INFINITY) tot += wl[w * DEC_ROWS + r] * fast_exp2(m - mx);
        }
        const float own = row_m[k] == -INFINITY ? 0.0f : fast_exp2(row_m[k] - mx);
        const float f = tot > 0.0f ? own / tot : 0.0f;
        float *dst = red + (warp * DEC_ROWS + r) * RP + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(float2 *)(dst + n * 8) = make_float2(oacc[n][2 * k] * f, oacc[n][2 * k + 1] * f);
    }
    __syncthreads();

    const int nrows = a.rows_total - pair0 < DEC_ROWS ? a.rows_total - pair0 : DEC_ROWS;
    for (int c = tid; c < nrows * (D / 4); c += DEC_THREADS) {
        const int r = c / (D / 4), col = (c % (D / 4)) * 4;
        if (col >= a.head_dim) continue;
        float4 s = *(const float4 *)(red + r * RP + col);
#pragma unroll
        for (int w = 1; w < DEC_WARPS; w++) {
            const float4 x = *(const float4 *)(red + (w * DEC_ROWS + r) * RP + col);
            s.x += x.x, s.y += x.y, s.z += x.z, s.w += x.w;
        }
        const int pair = pair0 + r, i = pair / a.group, h = hk * a.group + pair % a.group;
        if (a.splits == 1) {
            uint2 v;
            v.x = pack2<BF16>(s.x, s.y);
            v.y = pack2<BF16>(s.z, s.w);
            *(uint2 *)(a.o + b * a.o_sb + i * a.o_ss + h * a.o_sh + col) = v;
        } else {
            const int64_t row = (((int64_t)split * a.batch + b) * a.nq + i) * a.heads_q + h;
            *(float4 *)(a.part_o + row * a.head_dim + col) = s;
        }
    }
    if (tid < nrows) {
        const int r = tid, pair = pair0 + r, i = pair / a.group, h = hk * a.group + pair % a.group;
        float mx = -INFINITY, tot = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++) mx = fmaxf(mx, wm[w * DEC_ROWS + r]);
        for (int w = 0; w < DEC_WARPS; w++) {
            const float m = wm[w * DEC_ROWS + r];
            if (m != -INFINITY) tot += wl[w * DEC_ROWS + r] * fast_exp2(m - mx);
        }
        const float lse = tot > 0.0f ? (mx + log2f(tot)) * DEC_LN2 : -INFINITY;
        if (a.splits == 1)
            a.lse[b * a.lse_sb + h * a.lse_sh + i * a.lse_ss] = lse;
        else
            a.part_lse[(((int64_t)split * a.batch + b) * a.heads_q + h) * a.nq + i] = lse;
    }
}

/* ---- split combine ----------------------------------------------------------------------- */

#define COMBINE_WARPS 4
#define COMBINE_SPLITS_PER_WARP (FLASHC_KVCACHE_MAX_SPLITS / COMBINE_WARPS)

/* One CTA per output row (b, i, h), warp w taking splits [16w, 16w + 16): the splits' partial
 * O weighted by exp(lse_s - lse). Every load a row needs - its LSEs and the partial rows of
 * the warp's splits - is issued before the first is used, so a row costs one L2 round trip
 * (at batch 1 the combine is on the critical path of every call). */
template <int BF16>
__global__ void __launch_bounds__(COMBINE_WARPS * 32)
fc_decode_combine_kernel(const fc_decode_args a)
{
    __shared__ float weight[FLASHC_KVCACHE_MAX_SPLITS];
    __shared__ float4 partial[COMBINE_WARPS][32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = blockIdx.x;
    const int h = (int)(r % a.heads_q), i = (int)((r / a.heads_q) % a.nq),
              b = (int)(r / ((int64_t)a.heads_q * a.nq));
    const int64_t bstride = (int64_t)a.batch * a.heads_q * a.nq;
    const int64_t lrow = ((int64_t)b * a.heads_q + h) * a.nq + i;
    const int64_t ostride = bstride * a.head_dim; /* floats between one split and the next */
    const float *po = a.part_o + (((int64_t)b * a.nq + i) * a.heads_q + h) * a.head_dim;
    uint16_t *orow = a.o + b * a.o_sb + i * a.o_ss + h * a.o_sh;
    const int s0 = warp * COMBINE_SPLITS_PER_WARP;
    pdl_wait();
    pdl_launch_dependents();

    /* the first 128 columns of the warp's splits (a split that saw no key wrote zeros and has
     * weight 0: read, never used), and every split's LSE */
    float4 x[COMBINE_SPLITS_PER_WARP];
#pragma unroll
    for (int u = 0; u < COMBINE_SPLITS_PER_WARP; u++)
        x[u] = s0 + u < a.splits && lane * 4 < a.head_dim
                   ? *(const float4 *)(po + (s0 + u) * ostride + lane * 4)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    const float l0 = lane < a.splits ? a.part_lse[lane * bstride + lrow] : -INFINITY;
    const float l1 = lane + 32 < a.splits ? a.part_lse[(lane + 32) * bstride + lrow] : -INFINITY;

    float m = fmaxf(l0, l1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (m == -INFINITY) { /* no split saw a key (the same in every warp) */
        for (int col = tid * 4; col < a.head_dim; col += COMBINE_WARPS * 128)
            *(uint2 *)(orow + col) = make_uint2(0, 0);
        if (tid == 0) a.lse[b * a.lse_sb + h * a.lse_sh + i * a.lse_ss] = -INFINITY;
        return;
    }
    const float w0 = l0 == -INFINITY ? 0.0f : expf(l0 - m);
    const float w1 = l1 == -INFINITY ? 0.0f : expf(l1 - m);
    float sum = w0 + w1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (warp == 0) {
        const float inv = 1.0f / sum;
        weight[lane] = w0 * inv;
        weight[lane + 32] = w1 * inv;
        if (lane == 0) a.lse[b * a.lse_sb + h * a.lse_sh + i * a.lse_ss] = m + logf(sum);
    }
    __syncthreads();
    float w[COMBINE_SPLITS_PER_WARP];
#pragma unroll
    for (int u = 0; u < COMBINE_SPLITS_PER_WARP; u++) w[u] = weight[s0 + u];

    for (int c0 = 0; c0 < a.head_dim; c0 += 128) {
        const int col = c0 + lane * 4;
        if (c0 > 0) {
#pragma unroll
            for (int u = 0; u < COMBINE_SPLITS_PER_WARP; u++)
                x[u] = s0 + u < a.splits && col < a.head_dim
                           ? *(const float4 *)(po + (s0 + u) * ostride + col)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < COMBINE_SPLITS_PER_WARP; u++)
            if (w[u] != 0.0f)
                acc.x += w[u] * x[u].x, acc.y += w[u] * x[u].y, acc.z += w[u] * x[u].z,
                    acc.w += w[u] * x[u].w;
        partial[warp][lane] = acc;
        __syncthreads();
        if (warp == 0 && col < a.head_dim) {
#pragma unroll
            for (int v = 1; v < COMBINE_WARPS; v++) {
                const float4 y = partial[v][lane];
                acc.x += y.x, acc.y += y.y, acc.z += y.z, acc.w += y.w;
            }
            uint2 o;
            o.x = pack2<BF16>(acc.x, acc.y);
            o.y = pack2<BF16>(acc.z, acc.w);
            *(uint2 *)(orow + col) = o;
        }
        __syncthreads();
    }
}

/* Launches kernel<<<grid, threads, smem, stream>>>(args); on sm_90 and later as a
 * programmatic dependent launch (see pdl_wait), so that the launch of each of the call's
 * kernels overlaps the end of the one before. Only code compiled for sm_90 or later waits
 * (pdl_wait is empty below it): a library built for sm_80 alone, run on Hopper through the
 * sm_80 PTX, launches the ordinary way. */
template <typename Args>
static cudaError_t launch_dependent(void (*kernel)(Args), dim3 grid, int threads, size_t smem,
                                    cudaStream_t stream, int programmatic, const Args &args)
{
    if (programmatic) {
        cudaFuncAttributes fa;
        const cudaError_t query = cudaFuncGetAttributes(&fa, (const void *)kernel);
        if (query != cudaSuccess) cudaGetLastError(); /* it only means an ordinary launch */
        programmatic = query == cudaSuccess && fa.ptxVersion >= 90;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = programmatic ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args);
}

/* ---- host -------------------------------------------------------------------------------- */

typedef void (*decode_fn)(const fc_decode_args);

typedef struct decode_kernel {
    decode_fn fn;
    size_t smem;
} decode_kernel;

template <int D>
static decode_kernel pick_d(int bf16, int mods)
{
    decode_kernel k;
    k.fn = mods ? (bf16 ? fc_decode_kernel<D, 1, 1> : fc_decode_kernel<D, 0, 1>)
                : (bf16 ? fc_decode_kernel<D, 1, 0> : fc_decode_kernel<D, 0, 0>);
    k.smem = dec_config<D>::SMEM;
    return k;
}

/* The compiled head dim that serves head_dim (a multiple of 8 up to 256; the extra
 * columns are zero-filled and never stored), or a kernel with fn NULL. */
static decode_kernel pick_kernel(int head_dim, int bf16, int mods)
{
    decode_kernel none = {NULL, 0};
    if (head_dim <= 0 || head_dim % 8 != 0) return none;
    if (head_dim <= 32) return pick_d<32>(bf16, mods);
    if (head_dim <= 64) return pick_d<64>(bf16, mods);
    if (head_dim <= 96) return pick_d<96>(bf16, mods);
    if (head_dim <= 128) return pick_d<128>(bf16, mods);
    if (head_dim <= 192) return pick_d<192>(bf16, mods);
    if (head_dim <= 256) return pick_d<256>(bf16, mods);
    return none;
}

static flashc_status check_args(const fc_cuda_state *s, const flashc_kvcache_problem *pr,
                                const flashc_tensor *q, const flashc_tensor *k_cache,
                                const flashc_tensor *v_cache, const flashc_tensor *k_new,
                                const flashc_tensor *v_new, const flashc_tensor *out,
                                const flashc_tensor *lse)
{
    flashc_status st;
    if ((st = fc_check_tensor(s, q, "q")) != FLASHC_OK) return st;
    if ((st = fc_check_tensor(s, k_cache, "k_cache")) != FLASHC_OK) return st;
    if ((st = fc_check_tensor(s, v_cache, "v_cache")) != FLASHC_OK) return st;
    if (k_new && (st = fc_check_tensor(s, k_new, "k_new")) != FLASHC_OK) return st;
    if (v_new && (st = fc_check_tensor(s, v_new, "v_new")) != FLASHC_OK) return st;
    if ((st = fc_check_tensor(s, out, "out")) != FLASHC_OK) return st;
    if ((st = fc_check_device_pointer(s, lse->data, "lse")) != FLASHC_OK) return st;
    if ((st = fc_check_device_pointer(s, pr->cache_seqlens, "kv.cache_seqlens")) != FLASHC_OK)
        return st;
    if (pr->paged &&
        (st = fc_check_device_pointer(s, pr->block_table, "kv.block_table")) != FLASHC_OK)
        return st;
    if ((pr->base.features & FLASHC_FEATURE_ALIBI) &&
        (st = fc_check_device_pointer(s, pr->base.alibi_slopes, "params.alibi_slopes")) != FLASHC_OK)
        return st;
    return FLASHC_OK;
}

static int clamp_window(int64_t w)
{
    return w < 0 ? -1 : (w > 0x7fffffffLL ? 0x7fffffff : (int)w);
}

/* What a call launches: the kernel, the row chunks, the split-KV cut of the keys, and the
 * float32 partial results the splits need (none with one split). Needs the device current. */
typedef struct decode_plan {
    decode_kernel kern;
    int chunks, splits, split_keys;
    size_t o_bytes;  /* partial O, 256-byte rounded; the partial LSEs follow */
    size_t ws_bytes; /* both: 0 with one split */
} decode_plan;

static flashc_status plan_decode(const fc_cuda_state *s, const flashc_kvcache_problem *pr,
                                 decode_plan *pl)
{
    const flashc_problem *bp = &pr->base;
    if (bp->dtype != FLASHC_F16 && bp->dtype != FLASHC_BF16)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: the KV cache must be fp16 or bf16 (float32 is served by the "
                            "CPU backend)");
    if (bp->out_dtype != bp->dtype)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "cuda: out must have q's dtype");
    const int bf16 = bp->dtype == FLASHC_BF16;
    const int mods = (bp->features & (FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI)) != 0;
    pl->kern = pick_kernel((int)bp->head_dim, bf16, mods);
    if (!pl->kern.fn)
        return flashc_error(FLASHC_ERROR_INVALID_HEAD_DIM,
                            "cuda: head_dim %lld is not served: the CUDA kernels need a multiple "
                            "of 8 up to 256",
                            (long long)bp->head_dim);
    const int64_t group = bp->heads_q / bp->heads_kv;
    if (pr->capacity > 0x7fff0000LL || bp->seqlen_q * group > 0x7fff0000LL ||
        pr->seqlen_new > 0x7fff0000LL)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: cache capacity and seqlen_q x (heads_q / heads_kv) above "
                            "2^31 - 2^16 are not served");
    if (bp->batch > 65535 || bp->heads_kv > 65535)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: batch and heads_kv must each be at most 65535 (grid limits)");
    if (pl->kern.smem > s->smem_optin)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: head_dim %lld needs %zu bytes of shared memory per block; %s "
                            "allows %zu",
                            (long long)bp->head_dim, pl->kern.smem, s->name, s->smem_optin);
    cudaError_t err = cudaFuncSetAttribute((const void *)pl->kern.fn,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)pl->kern.smem);
    int per_sm = 0;
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)pl->kern.fn,
                                                            DEC_THREADS, pl->kern.smem);
    if (err != cudaSuccess) return fc_cuda_error(err, "decode kernel attributes");

    const int rows_total = (int)(group * bp->seqlen_q);
    pl->chunks = (rows_total + DEC_ROWS - 1) / DEC_ROWS;
    /* split-KV: the device does not know the lengths without a copy, so the splits cut the
     * capacity (pr->max_len); a split past a sequence's end is a CTA that writes -inf */
    const int64_t tasks = bp->batch * bp->heads_kv * pl->chunks;
    const int64_t units = (int64_t)s->num_sms * (per_sm > 0 ? per_sm : 1);
    int32_t splits = pr->num_splits > 0
                         ? pr->num_splits
                         : flashc_kvcache_num_splits_one_wave(tasks, pr->max_len, units,
                                                              DEC_MIN_SPLIT_KEYS);
    int64_t per = (pr->max_len + splits - 1) / splits;
    per = per < DEC_KT ? DEC_KT : (per + DEC_KT - 1) / DEC_KT * DEC_KT;
    splits = (int32_t)((pr->max_len + per - 1) / per);
    if (splits < 1) splits = 1;
    pl->splits = splits;
    pl->split_keys = (int)per;
    if ((int64_t)splits * pl->chunks > 0x7fffffffLL)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "cuda: too many query rows for one grid");
    pl->o_bytes = pl->ws_bytes = 0;
    if (splits > 1) {
        const size_t rows = (size_t)splits * (size_t)(bp->batch * bp->seqlen_q * bp->heads_q);
        pl->o_bytes = (rows * (size_t)bp->head_dim * sizeof(float) + 255) & ~(size_t)255;
        pl->ws_bytes = pl->o_bytes + rows * sizeof(float);
    }
    return FLASHC_OK;
}

size_t fc_cuda_kvcache_workspace_size(void *state, const flashc_kvcache_problem *pr)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    fc_device_guard guard;
    if (fc_guard_enter(&guard, s) != FLASHC_OK) return 0;
    decode_plan pl;
    const flashc_status st = plan_decode(s, pr, &pl);
    fc_guard_leave(&guard);
    /* a call that cannot run needs nothing: it fails with the same message */
    return st == FLASHC_OK ? pl.ws_bytes : 0;
}

flashc_status fc_cuda_forward_kvcache(void *state, const flashc_kvcache_problem *pr,
                                      const flashc_tensor *q, flashc_tensor *k_cache,
                                      flashc_tensor *v_cache, const flashc_tensor *k_new,
                                      const flashc_tensor *v_new, flashc_tensor *out,
                                      flashc_tensor *lse)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    const flashc_problem *bp = &pr->base;
    fc_device_guard guard;
    flashc_status st = fc_guard_enter(&guard, s);
    if (st != FLASHC_OK) return st;
    decode_plan pl;
    if ((st = plan_decode(s, pr, &pl)) != FLASHC_OK ||
        (st = check_args(s, pr, q, k_cache, v_cache, k_new, v_new, out, lse)) != FLASHC_OK) {
        fc_guard_leave(&guard);
        return st;
    }
    /* a caller's workspace: large enough for this plan, device memory, 256-byte aligned */
    if (bp->workspace && pl.ws_bytes > 0) {
        if (bp->workspace_size < pl.ws_bytes)
            st = flashc_error(FLASHC_ERROR_WORKSPACE_TOO_SMALL,
                              "params.workspace_size is %zu but this decode needs %zu bytes "
                              "(flashc_kvcache_workspace_size)",
                              bp->workspace_size, pl.ws_bytes);
        else if ((st = fc_check_device_pointer(s, bp->workspace, "params.workspace")) == FLASHC_OK &&
                 (uintptr_t)bp->workspace % 256 != 0)
            st = flashc_error(FLASHC_ERROR_INVALID_POINTER,
                              "params.workspace: pointer %p is not 256-byte aligned", bp->workspace);
        if (st != FLASHC_OK) {
            fc_guard_leave(&guard);
            return st;
        }
    }
    cudaStream_t stream = (cudaStream_t)bp->stream;
    const int bf16 = bp->dtype == FLASHC_BF16;
    const int64_t group = bp->heads_q / bp->heads_kv;
    const decode_kernel kern = pl.kern;
    cudaError_t err = cudaSuccess;

    fc_decode_args a;
    memset(&a, 0, sizeof a);
    a.q = (const uint16_t *)q->data;
    a.kc = (const uint16_t *)k_cache->data;
    a.vc = (const uint16_t *)v_cache->data;
    a.o = (uint16_t *)out->data;
    a.lse = (float *)lse->data;
    a.q_sb = q->stride[0], a.q_ss = q->stride[1], a.q_sh = q->stride[2];
    a.k_sb = k_cache->stride[0], a.k_ss = k_cache->stride[1], a.k_sh = k_cache->stride[2];
    a.v_sb = v_cache->stride[0], a.v_ss = v_cache->stride[1], a.v_sh = v_cache->stride[2];
    a.o_sb = out->stride[0], a.o_ss = out->stride[1], a.o_sh = out->stride[2];
    a.lse_sb = lse->stride[0], a.lse_sh = lse->stride[1], a.lse_ss = lse->stride[2];
    a.cache_seqlens = pr->cache_seqlens;
    if (pr->paged) {
        a.block_table = pr->block_table;
        a.bt_stride = pr->block_table_stride;
        a.page_shift = pr->page_shift;
        a.num_pages = pr->num_pages > 0x7fffffffLL ? 0x7fffffff : (int)pr->num_pages;
    }
    a.seqlen_new = (int)pr->seqlen_new;
    a.capacity = (int)pr->capacity;
    a.batch = (int)bp->batch;
    a.nq = (int)bp->seqlen_q;
    a.heads_q = (int)bp->heads_q;
    a.heads_kv = (int)bp->heads_kv;
    a.group = (int)group;
    a.rows_total = (int)(group * bp->seqlen_q);
    a.chunks = pl.chunks;
    a.head_dim = (int)bp->head_dim;
    a.scale = bp->scale;
    a.causal = bp->causal;
    a.window_left = a.window_right = -1;
    if (bp->features & FLASHC_FEATURE_WINDOW) {
        a.window_left = clamp_window(bp->window_left);
        a.window_right = clamp_window(bp->window_right);
    }
    a.softcap = (bp->features & FLASHC_FEATURE_SOFTCAP) ? bp->softcap : 0.0f;
    if (bp->features & FLASHC_FEATURE_ALIBI) {
        a.alibi = bp->alibi_slopes;
        a.alibi_bstride = bp->alibi_batch_stride;
    }

    a.splits = pl.splits;
    a.split_keys = pl.split_keys;
    const int splits = pl.splits;

    /* everything is allocated before the append and the first output write */
    char *ws = NULL, *own_ws = NULL;
    if (splits > 1) {
        if (bp->workspace) {
            ws = (char *)bp->workspace;
        } else {
            err = cudaMallocAsync((void **)&own_ws, pl.ws_bytes, stream);
            if (err != cudaSuccess) {
                fc_guard_leave(&guard);
                return fc_cuda_error(err, "cudaMallocAsync (split-KV workspace)");
            }
            ws = own_ws;
        }
        a.part_o = (float *)ws;
        a.part_lse = (float *)(ws + pl.o_bytes);
    }

    const int pdl = s->sm_major >= 9;
    const char *what = "append kernel launch";
    if (pr->seqlen_new > 0) {
        fc_append_args ap;
        memset(&ap, 0, sizeof ap);
        ap.kn = (const uint16_t *)k_new->data, ap.vn = (const uint16_t *)v_new->data;
        ap.kc = (uint16_t *)k_cache->data, ap.vc = (uint16_t *)v_cache->data;
        ap.kn_sb = k_new->stride[0], ap.kn_ss = k_new->stride[1], ap.kn_sh = k_new->stride[2];
        ap.vn_sb = v_new->stride[0], ap.vn_ss = v_new->stride[1], ap.vn_sh = v_new->stride[2];
        ap.k_sb = a.k_sb, ap.k_ss = a.k_ss, ap.k_sh = a.k_sh;
        ap.v_sb = a.v_sb, ap.v_ss = a.v_ss, ap.v_sh = a.v_sh;
        ap.cache_seqlens = a.cache_seqlens;
        ap.block_table = a.block_table;
        ap.bt_stride = a.bt_stride;
        ap.page_shift = a.page_shift;
        ap.num_pages = a.num_pages;
        ap.capacity = a.capacity;
        ap.batch = a.batch;
        ap.seqlen_new = a.seqlen_new;
        ap.heads_kv = a.heads_kv;
        ap.head_dim = a.head_dim;
        const int64_t chunks16 = bp->batch * pr->seqlen_new * bp->heads_kv * (bp->head_dim / 8);
        int64_t blocks = (chunks16 + 255) / 256;
        const int64_t most = (int64_t)s->num_sms * 16;
        blocks = blocks > most ? most : (blocks < 1 ? 1 : blocks);
        err = launch_dependent(fc_append_kernel, dim3((unsigned)blocks), 256, 0, stream, pdl, ap);
    }
    if (err == cudaSuccess) {
        what = "decode kernel launch";
        dim3 grid((unsigned)(splits * a.chunks), (unsigned)a.heads_kv, (unsigned)a.batch);
        err = launch_dependent(kern.fn, grid, DEC_THREADS, kern.smem, stream, pdl, a);
    }
    if (err == cudaSuccess && splits > 1) {
        what = "split combine kernel launch";
        const int64_t rows = bp->batch * bp->seqlen_q * bp->heads_q;
        if (rows > 0x7fffffffLL)
            err = cudaErrorInvalidConfiguration;
        else
            err = launch_dependent(bf16 ? fc_decode_combine_kernel<1> : fc_decode_combine_kernel<0>,
                                   dim3((unsigned)rows), COMBINE_WARPS * 32, 0, stream, pdl, a);
    }
    if (own_ws) {
        cudaError_t err2 = cudaFreeAsync(own_ws, stream);
        if (err == cudaSuccess && err2 != cudaSuccess) {
            err = err2;
            what = "cudaFreeAsync (split-KV workspace)";
        }
    }
    fc_guard_leave(&guard);
    if (err != cudaSuccess) return fc_cuda_error(err, what);
    return FLASHC_OK;
}
