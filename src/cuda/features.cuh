/*
 * features.cuh - device code shared by the kernels compiled with the features of flashc.h
 * (variable-length sequences, sliding window, softcap, ALiBi, dropout): where a sequence
 * lies in the tensors, the band of keys a query sees (and of queries a key is seen by),
 * the score modifications and the Philox counter word of a (sequence, head).
 *
 * Everything here follows backend.h's flashc_seq_of / flashc_seq_key_range /
 * flashc_alibi_slope, which define the semantics for every backend.
 */
#ifndef FLASHC_CUDA_FEATURES_CUH
#define FLASHC_CUDA_FEATURES_CUH

#include "common.cuh"
#include "varlen.cuh"

#include "dropout.cuh"

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

/* The generator's key and threshold of a feature call. */
FC_DEVICE fc_drop fc_drop_of(const fc_feat &f)
{
    fc_drop d;
    d.seed = f.drop_seed;
    d.threshold = f.drop_threshold;
    return d;
}

/* The Philox counter word of (sequence b, head h). */
FC_DEVICE uint64_t fc_drop_word(const fc_feat &f, int b, int h, int heads_q)
{
    return f.drop_offset + (uint64_t)((int64_t)b * heads_q + h);
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
