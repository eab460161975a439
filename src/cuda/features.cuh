/*
 * features.cuh - device code shared by the kernels compiled with the features of flashc.h
 * (variable-length sequences, sliding window, softcap, ALiBi, dropout): where a sequence
 * lies in the tensors, the band of keys a query sees (and of queries a key is seen by),
 * the score modifications and the Philox keep bits of src/philox.h.
 *
 * Everything here follows backend.h's flashc_seq_of / flashc_seq_key_range /
 * flashc_alibi_slope, which define the semantics for every backend.
 */
#ifndef FLASHC_CUDA_FEATURES_CUH
#define FLASHC_CUDA_FEATURES_CUH

#include "common.cuh"
#include "varlen.cuh"

/* The generator in device code: the same source as the host backends, so the same bits. */
#define FLASHC_PHILOX_QUALIFIER static __host__ __device__ __forceinline__
#include "philox.h"

/* One sequence: rows [q0, q0 + nq) of q / out / lse and [k0, k0 + nk) of k / v, in tensor
 * batch `batch`; off is the diagonal offset (query i is aligned with key i + off). */
typedef struct fc_seq {
    int64_t batch;
    int q0, nq, k0, nk, off;
} fc_seq;

template <typename A>
FC_DEVICE fc_seq fc_seq_of(const A &a, int b)
{
    fc_seq s;
    if (a.f.varlen) {
        s.batch = 0;
        fc_varlen_rows(a.f.cu_q, a.f.cu_k, b, a.seqlen_q, a.seqlen_k, &s.q0, &s.nq, &s.k0, &s.nk);
    } else {
        s.batch = b;
        s.q0 = s.k0 = 0;
        s.nq = a.seqlen_q;
        s.nk = a.seqlen_k;
    }
    s.off = a.f.top_left ? 0 : s.nk - s.nq;
    return s;
}

FC_DEVICE int fc_clamp64(long long x, int hi)
{
    return (int)(x < 0 ? 0 : (x > hi ? hi : x));
}

/* Keys [fc_key_lo, fc_key_hi) that query i sees, clamped to [0, nk]; both grow with i. The
 * arithmetic is 64-bit because a window may be as wide as INT32_MAX. */
FC_DEVICE int fc_key_lo(const fc_feat &f, const fc_seq &s, int i)
{
    return f.has_left ? fc_clamp64((long long)i + s.off - f.left, s.nk) : 0;
}

FC_DEVICE int fc_key_hi(const fc_feat &f, const fc_seq &s, int i)
{
    return f.has_right ? fc_clamp64((long long)i + s.off + f.right + 1, s.nk) : s.nk;
}

/* Queries [fc_query_lo, fc_query_hi) that see key j (0 <= j < nk), clamped to [0, nq]: the
 * same band read the other way, for the kernels that walk the queries of a key block. */
FC_DEVICE int fc_query_lo(const fc_feat &f, const fc_seq &s, int j)
{
    return f.has_right ? fc_clamp64((long long)j - s.off - f.right, s.nq) : 0;
}

FC_DEVICE int fc_query_hi(const fc_feat &f, const fc_seq &s, int j)
{
    return f.has_left ? fc_clamp64((long long)j - s.off + f.left + 1, s.nq) : s.nq;
}

/* ALiBi slope of (sequence b, head h) times log2(e): the scores live in the log2 domain. */
FC_DEVICE float fc_alibi_slope2(const fc_feat &f, int b, int h)
{
    return f.alibi_on ? f.alibi[(int64_t)b * f.alibi_sb + h] * 1.4426950408889634f : 0.f;
}

/* The Philox counter word of (sequence b, head h). */
FC_DEVICE uint64_t fc_drop_word(const fc_feat &f, int b, int h, int heads_q)
{
    return f.drop_offset + (uint64_t)((int64_t)b * heads_q + h);
}

/* Keep bits of an mma C fragment with query rows r_g and r_g + 8 (r_g = row of lane group g)
 * and keys n0 + nt * 8 + 2t + e for nt < NTILE <= 16 (n0 a multiple of 4): bit 2 nt + e of
 * m[0] (row r_g) and m[1] (row r_g + 8). Lanes t and t ^ 1 hold the two halves of the same
 * group of four keys, on both rows, so each computes one row and gives the partner its half:
 * one generator call per 4 entries. The loop is kept rolled: unrolled, the compiler runs the
 * generator calls side by side and runs out of registers. */
template <int NTILE>
FC_DEVICE void fc_keep_rows(const fc_feat &f, uint64_t w, int r_g, int n0, int t, uint32_t m[2])
{
    static_assert(NTILE <= 16, "two bits per 8-key tile in 32 bits");
    const int odd = t & 1;
    const uint32_t row = (uint32_t)(r_g + 8 * odd), th = f.drop_threshold;
    uint32_t own = 0, give = 0;
#pragma unroll 1
    for (int nt = 0; nt < NTILE; nt++) {
        const flashc_philox4 r =
            flashc_dropout_draws(f.drop_seed, w, row, (uint32_t)((n0 >> 2) + nt * 2 + (t >> 1)));
        const uint32_t b01 = (uint32_t)(r.v[0] >= th) | ((uint32_t)(r.v[1] >= th) << 1);
        const uint32_t b23 = (uint32_t)(r.v[2] >= th) | ((uint32_t)(r.v[3] >= th) << 1);
        own |= (odd ? b23 : b01) << (2 * nt);
        give |= (odd ? b01 : b23) << (2 * nt);
    }
    const uint32_t got = __shfl_xor_sync(0xffffffffu, give, 1);
    m[0] = odd ? got : own;
    m[1] = odd ? own : got;
}

/* The same for a transposed fragment (the dK/dV kernel's S^T): key rows j_g and j_g + 8
 * (j_g = n0 + row of lane group g, a multiple of 8 plus g), queries i0 + qt * 8 + 2t + e for
 * qt < QT <= 8. The four lanes g = 4c .. 4c + 3 (same t) need the same four generator calls
 * (rows hr, columns e), one component each: lane g % 4 = 2 hr + e makes call (hr, e) for every
 * qt, and each lane gathers its bit of every call. Returns in m[2 hr + e] the bits of
 * (key j_g + 8 hr, query i0 + qt * 8 + 2t + e) at bit 4 qt. */
template <int QT>
FC_DEVICE void fc_keep_cols(const fc_feat &f, uint64_t w, int j_g, int i0, int lane, uint32_t m[4])
{
    static_assert(QT <= 8, "four bits per 8-query tile in 32 bits");
    const int t = lane & 3, k = (lane >> 2) & 3;
    const int hr = k >> 1, e = k & 1;
    const uint32_t th = f.drop_threshold;
    const uint32_t group = (uint32_t)((j_g - k + 8 * hr) >> 2); /* j_g - g % 4 is 4-aligned */
    uint32_t nib = 0;
#pragma unroll 1
    for (int qt = 0; qt < QT; qt++) {
        const flashc_philox4 r =
            flashc_dropout_draws(f.drop_seed, w, (uint32_t)(i0 + qt * 8 + 2 * t + e), group);
        nib |= ((uint32_t)(r.v[0] >= th) | ((uint32_t)(r.v[1] >= th) << 1) |
                ((uint32_t)(r.v[2] >= th) << 2) | ((uint32_t)(r.v[3] >= th) << 3))
               << (4 * qt);
    }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const uint32_t x = __shfl_sync(0xffffffffu, nib, (lane & ~12) | (c << 2));
        m[c] = (x >> k) & 0x11111111u;
    }
}

/* The logit of a raw q.k in the log2 domain, before ALiBi: softcap * tanh(scale q.k / softcap)
 * or scale q.k; *t receives the tanh (the softcap's derivative is 1 - t^2). tanhf rather
 * than the approximate instruction, whose error the softcap would multiply. */
FC_DEVICE float fc_softcap2(const fc_feat &f, float raw, float *t)
{
    const float th = tanhf(raw * f.softcap_pre);
    *t = th;
    return f.softcap_log2 * th;
}

#endif /* FLASHC_CUDA_FEATURES_CUH */
