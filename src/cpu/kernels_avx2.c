/*
 * kernels_avx2.c - AVX2 + FMA micro-kernels (built with -mavx2 -mfma for this file only).
 * The products come from kernels_simd.inc with 6 x 2 register tiles: 12 ymm accumulators,
 * 2 for B and 1 broadcast fit the 16 registers, as in BLIS's Haswell kernels.
 *
 * exp: x is clamped to >= -88, n = round(x log2 e), r = x - n ln2 (two-constant Cody-Waite),
 * e^r by the degree-6 Cephes expf polynomial, 2^n built in the exponent bits. n = -127
 * (x below about -87.68, and -inf) gives exactly 0 rather than a subnormal: an absolute error
 * below 2^-126. Relative error <= 2 ULP of expf over [-87.3, 1] (test_cpu_exp.c measures it).
 */
#include <immintrin.h>
#include <math.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

#define KN(x) avx2_##x
#define VW 8
typedef __m256 vf;
#define VLOAD(p) _mm256_load_ps(p)
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_store_ps((p), (v))
#define VSTOREU(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define TILE_MR 6
#define TILE_NV 2
#define TILE_NV2 2

static inline float avx2_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define VHMAX(v) avx2_hmax(v)
#define VHSUM(v) avx2_hsum(v)

static inline __m256 avx2_select_lt(int c0, int nc, __m256 v, __m256 w)
{
    __m256 idx = _mm256_add_ps(_mm256_set_ps(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_ps((float)c0));
    __m256 keep = _mm256_cmp_ps(idx, _mm256_set1_ps((float)nc), _CMP_LT_OQ);
    return _mm256_blendv_ps(w, v, keep);
}
#define VSELECT_LT(c0, nc, v, w) avx2_select_lt((c0), (nc), (v), (w))
#define VKEEP_NZ(p, v) _mm256_and_ps(_mm256_cmp_ps((p), _mm256_setzero_ps(), _CMP_NEQ_UQ), (v))

static inline vf avx2_vexp(vf x)
{
    /* the clamp second: maxps returns its second operand when either is NaN, so a NaN
     * argument stays NaN (a NaN score must not turn into P = 0) */
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
    vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    vf p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    vf r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n for n in [-127, 128): (n + 127) << 23; n = -127 gives the bits of +0 */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#include "cpu/kernels_simd.inc"

static int avx2_supported(void)
{
    const flashc_cpu_features *f = flashc_cpu_get_features();
    return f->avx2 && f->fma;
}

const flashc_cpu_kernels flashc_cpu_kernels_avx2 = {
    .name = "avx2",
    .supported = avx2_supported,
    .gemm_panel = avx2_gemm_panel,
    .gemm_acc = avx2_gemm_acc,
    .gemm_tn_acc = avx2_gemm_tn_acc,
    .softmax = avx2_softmax,
    .p_ds = avx2_p_ds,
    .exp_sum = avx2_exp_sum,
};
