/*
 * kernels_neon.c - AArch64 Advanced SIMD (NEON) micro-kernels: the float32 products, softmax
 * and exponential of kernels_simd.inc at 4 lanes. NEON is part of every AArch64 processor, so
 * the set needs no run-time probe beyond the architecture.
 *
 * Register tiles of 6 x 4 vectors (6 rows x 16 columns): 24 accumulators, 4 vectors of B and
 * the broadcasts fit the 32 vector registers. fp16 and bf16 inputs are converted to float32
 * by the blocked algorithm's packing, as on the other float32 sets; the decode products use
 * the generic set's loops.
 *
 * exp: the AVX2 set's algorithm lane for lane (x clamped to >= -88, n = round(x log2 e) to
 * nearest even, two-constant Cody-Waite reduction, the degree-6 Cephes polynomial, 2^n in the
 * exponent bits; n = -127, x below about -87.68 and -inf, gives exactly 0). Relative error
 * <= 2 ULP of expf over [-87.3, 1], absolute error below 2^-126 under it (test_cpu_exp.c).
 * NaN stays NaN: FMAX returns NaN when either operand is NaN, where the x86 sets rely on maxps
 * returning its second operand.
 */
#include <arm_neon.h>
#include <math.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

#define KN(x) neon_##x
#define VW 4
typedef float32x4_t vf;
#define VLOAD(p) vld1q_f32(p)
#define VLOADU(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32((p), (v))
#define VSTOREU(p, v) vst1q_f32((p), (v))
#define VSET1(x) vdupq_n_f32(x)
#define VZERO() vdupq_n_f32(0.0f)
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))
#define VMUL(a, b) vmulq_f32((a), (b))
#define VADD(a, b) vaddq_f32((a), (b))
#define VSUB(a, b) vsubq_f32((a), (b))
#define VMAX(a, b) vmaxq_f32((a), (b))
#define VHMAX(v) vmaxvq_f32(v)
#define VHSUM(v) vaddvq_f32(v)
#define TILE_MR 6
#define TILE_NV 4
#define TILE_NV2 2

/* Lane i keeps v where c0 + i < nc, else takes w. */
static inline vf neon_select_lt(int c0, int nc, vf v, vf w)
{
    static const int32_t lane[4] = {0, 1, 2, 3};
    const int32x4_t idx = vaddq_s32(vld1q_s32(lane), vdupq_n_s32(c0));
    return vbslq_f32(vcltq_s32(idx, vdupq_n_s32(nc)), v, w);
}
#define VSELECT_LT(c0, nc, v, w) neon_select_lt((c0), (nc), (v), (w))

/* Lane i keeps v where p is nonzero or NaN (p == 0 is false for NaN), else 0. */
#define VKEEP_NZ(p, v) \
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), vceqq_f32((p), vdupq_n_f32(0.0f))))

static inline vf neon_vexp(vf x)
{
    x = vmaxq_f32(vdupq_n_f32(-88.0f), x);
    const vf n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    vf r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    vf p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    const vf r2 = vmulq_f32(r, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, r2);
    /* 2^n for n in [-127, 128): (n + 127) << 23; n = -127 gives the bits of +0 */
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

#include "cpu/kernels_simd.inc"

static int neon_supported(void)
{
    return flashc_cpu_get_features()->neon;
}

const flashc_cpu_kernels flashc_cpu_kernels_neon = {
    .name = "neon",
    .supported = neon_supported,
    .gemm_panel = neon_gemm_panel,
    .gemm_acc = neon_gemm_acc,
    .gemm_tn_acc = neon_gemm_tn_acc,
    .softmax = neon_softmax,
    .p_ds = neon_p_ds,
    .exp_sum = neon_exp_sum,
};
