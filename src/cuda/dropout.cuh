/*
 * dropout.cuh - the dropout keep bits of src/philox.h in the fragment layouts of the tensor-core
 * kernels (the mma.sync C fragment and the wgmma accumulator share it: per 8-column tile, lane
 * group g holds rows g and g + 8, lane t % 4 columns 2t and 2t + 1), for the forward's P and
 * for the backward's transposed P^T. The same generator source as the host backends, so the
 * same bits on every backend.
 */
#ifndef FLASHC_CUDA_DROPOUT_CUH
#define FLASHC_CUDA_DROPOUT_CUH

#include <stdint.h>

#define FLASHC_PHILOX_QUALIFIER static __host__ __device__ __forceinline__
#include "philox.h"

#ifndef FC_DEVICE
#define FC_DEVICE static __device__ __forceinline__
#endif

/* The generator's key and the keep threshold of one call (flashc.h's flashc_dropout_keep). */
typedef struct fc_drop {
    uint64_t seed;
    uint32_t threshold; /* keep when the draw >= this */
} fc_drop;

/* Keep bits of an mma C fragment with query rows r_g and r_g + 8 (r_g = row of lane group g)
 * and keys n0 + nt * 8 + 2t + e for nt < NTILE <= 16 (n0 a multiple of 4): bit 2 nt + e of
 * m[0] (row r_g) and m[1] (row r_g + 8). Lanes t and t ^ 1 hold the two halves of the same
 * group of four keys, on both rows, so each computes one row and gives the partner its half:
 * one generator call per 4 entries. The loop is kept rolled: unrolled, the compiler runs the
 * generator calls side by side and runs out of registers. */
template <int NTILE>
FC_DEVICE void fc_keep_rows(const fc_drop &d, uint64_t w, int r_g, int n0, int t, uint32_t m[2])
{
    static_assert(NTILE <= 16, "two bits per 8-key tile in 32 bits");
    const int odd = t & 1;
    const uint32_t row = (uint32_t)(r_g + 8 * odd), th = d.threshold;
    uint32_t own = 0, give = 0;
#pragma unroll 1
    for (int nt = 0; nt < NTILE; nt++) {
        const flashc_philox4 r =
            flashc_dropout_draws(d.seed, w, row, (uint32_t)((n0 >> 2) + nt * 2 + (t >> 1)));
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
FC_DEVICE void fc_keep_cols(const fc_drop &d, uint64_t w, int j_g, int i0, int lane, uint32_t m[4])
{
    static_assert(QT <= 8, "four bits per 8-query tile in 32 bits");
    const int t = lane & 3, k = (lane >> 2) & 3;
    const int hr = k >> 1, e = k & 1;
    const uint32_t th = d.threshold;
    const uint32_t group = (uint32_t)((j_g - k + 8 * hr) >> 2); /* j_g - g % 4 is 4-aligned */
    uint32_t nib = 0;
#pragma unroll 1
    for (int qt = 0; qt < QT; qt++) {
        const flashc_philox4 r =
            flashc_dropout_draws(d.seed, w, (uint32_t)(i0 + qt * 8 + 2 * t + e), group);
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

#endif /* FLASHC_CUDA_DROPOUT_CUH */
