/*
 * kernels_neon.c - AArch64 Advanced SIMD (NEON) micro-kernels: the float32 products, softmax
 * and exponential of kernels_simd.inc at 4 lanes, and on processors with the BF16 extension
 * (Armv8.6: BFDOT, BFCVT; the kernel reports it in HWCAP2) the bf16 products of kernels.h's
 * bf16 forward and backward paths. NEON itself is part of every AArch64 processor.
 *
 * Register tiles of 6 x 4 vectors (6 rows x 16 columns): 24 accumulators, 4 vectors of B and
 * the broadcasts fit the 32 vector registers, for the float32 and the bf16 products alike.
 * fp16 inputs are converted to float32 by the blocked algorithm's packing, as on the other
 * sets; the decode products use the generic set's loops.
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

/* ---- bf16 products (BFDOT, Armv8.6 BF16), used only when the processor has it ---- */

/* The bf16 functions need the extension; the attribute keeps the rest of the file runnable on
 * every AArch64 processor. BFDOT adds, per float32 lane, the dot product of one pair of bf16
 * values of each operand: the "VNNI" pair layouts of kernels.h, as vdpbf16ps does on x86. */
#define BF16_FN __attribute__((target("arch=armv8.2-a+bf16")))

static int neon_bf16_supported(void)
{
    return flashc_cpu_get_features()->neon_bf16;
}

/* A 32-bit pair of bf16 values of a row, in every lane. */
static inline __attribute__((always_inline)) BF16_FN bfloat16x8_t neon_pair(const uint16_t *p)
{
    uint32_t pair;
    __builtin_memcpy(&pair, p, sizeof pair);
    return vreinterpretq_bf16_u32(vdupq_n_u32(pair));
}

/* C[mr][16] (+)= sum over pairs kk < k of A[r][kk..kk+1] . B[kk/2][0:16][2], 4 vectors of
 * 4 columns: A rows of stride lda, B pair rows of stride ldb (in bf16 elements), C of ldc. */
static inline __attribute__((always_inline)) BF16_FN void
neon_bf16_tile(const int mr, int k, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
               ptrdiff_t ldb, float *c, ptrdiff_t ldc, const int accumulate)
{
    float32x4_t acc[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[r][v] = accumulate ? vld1q_f32(c + r * ldc + v * 4) : vdupq_n_f32(0.0f);
    for (int kk = 0; kk < k; kk += 2) {
        const bfloat16_t *bk = (const bfloat16_t *)(b + (ptrdiff_t)(kk / 2) * ldb);
        bfloat16x8_t bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            bv[v] = vld1q_bf16(bk + v * 8);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const bfloat16x8_t ar = neon_pair(a + r * lda + kk);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[r][v] = vbfdotq_f32(acc[r][v], ar, bv[v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            vst1q_f32(c + r * ldc + v * 4, acc[r][v]);
}

#define NEON_BF16_TILES(MR)                                                                  \
    static BF16_FN void neon_bf16_tile_##MR(int k, const uint16_t *a, ptrdiff_t lda,         \
                                            const uint16_t *b, ptrdiff_t ldb, float *c,      \
                                            ptrdiff_t ldc)                                   \
    {                                                                                         \
        neon_bf16_tile(MR, k, a, lda, b, ldb, c, ldc, 0);                                     \
    }                                                                                         \
    static BF16_FN void neon_bf16_tile_acc_##MR(int k, const uint16_t *a, ptrdiff_t lda,     \
                                                const uint16_t *b, ptrdiff_t ldb, float *c,  \
                                                ptrdiff_t ldc)                               \
    {                                                                                         \
        neon_bf16_tile(MR, k, a, lda, b, ldb, c, ldc, 1);                                     \
    }
NEON_BF16_TILES(1)
NEON_BF16_TILES(2)
NEON_BF16_TILES(3)
NEON_BF16_TILES(4)
NEON_BF16_TILES(5)
NEON_BF16_TILES(6)
typedef void (*neon_bf16_fn)(int, const uint16_t *, ptrdiff_t, const uint16_t *, ptrdiff_t,
                             float *, ptrdiff_t);
static const neon_bf16_fn neon_bf16_tiles[2][7] = {
    {NULL, neon_bf16_tile_1, neon_bf16_tile_2, neon_bf16_tile_3, neon_bf16_tile_4,
     neon_bf16_tile_5, neon_bf16_tile_6},
    {NULL, neon_bf16_tile_acc_1, neon_bf16_tile_acc_2, neon_bf16_tile_acc_3,
     neon_bf16_tile_acc_4, neon_bf16_tile_acc_5, neon_bf16_tile_acc_6},
};

/* C[rows][cols] (+)= A16 B16 over k (pairs), cols a multiple of 16: B's pair rows hold 2 bf16
 * per column (a panel16 of 64 columns, or a vpair16 of dp). */
static void neon_bf16_mm(int rows, int cols, int k, const uint16_t *a, ptrdiff_t lda,
                         const uint16_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    k = (k + 1) & ~1; /* a zero-padded last pair adds nothing */
    for (int c0 = 0; c0 < cols; c0 += 16)
        for (int r0 = 0; r0 < rows; r0 += 6) {
            const int mr = rows - r0 < 6 ? rows - r0 : 6;
            neon_bf16_tiles[accumulate][mr](k, a + r0 * lda, lda, b + 2 * c0, ldb,
                                            c + r0 * ldc + c0, ldc);
        }
}

static void neon_gemm_panel16(int m, int k, const uint16_t *a, ptrdiff_t lda,
                              const uint16_t *panel16, float *c)
{
    neon_bf16_mm(m, FLASHC_CPU_BLOCK_N, k, a, lda, panel16, 2 * FLASHC_CPU_BLOCK_N, c,
                 FLASHC_CPU_BLOCK_N, 0);
}

static void neon_gemm_panel16_acc(int m, int k, const uint16_t *a, ptrdiff_t lda,
                                  const uint16_t *panel16, float *c)
{
    neon_bf16_mm(m, FLASHC_CPU_BLOCK_N, k, a, lda, panel16, 2 * FLASHC_CPU_BLOCK_N, c,
                 FLASHC_CPU_BLOCK_N, 1);
}

static void neon_gemm_acc16(int m, int n, int dp, const uint16_t *p16, const uint16_t *vpair16,
                            float *c)
{
    neon_bf16_mm(m, dp, n, p16, FLASHC_CPU_BLOCK_N, vpair16, 2 * dp, c, dp, 1);
}

/* Four floats of a row from column c0, 0 at and past column n. */
static inline float32x4_t neon_row4(const float *row, int c0, int n)
{
    if (c0 + 4 <= n)
        return vld1q_f32(row + c0);
    float t[4];
    for (int i = 0; i < 4; i++)
        t[i] = c0 + i < n ? row[c0 + i] : 0.0f;
    return vld1q_f32(t);
}

/* bf16 rounding to nearest even of P (BFCVTN), zero from column n to 64. */
static BF16_FN void neon_round_p16(uint16_t *dst, const float *src, int m, int n)
{
    for (int r = 0; r < m; r++) {
        const float *sr = src + r * FLASHC_CPU_BLOCK_N;
        bfloat16_t *dr = (bfloat16_t *)(dst + r * FLASHC_CPU_BLOCK_N);
        for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 8) {
            const bfloat16x8_t lo = vcvtq_low_bf16_f32(neon_row4(sr, c0, n));
            vst1q_bf16(dr + c0, vcvtq_high_bf16_f32(lo, neon_row4(sr, c0 + 4, n)));
        }
    }
}

/* Rows r, r + 1 of src become the 32-bit pairs (r, c), (r + 1, c) of row r/2 of dst, every
 * element written: zero at rows >= m and columns >= n. */
static BF16_FN void neon_pair_p16(uint16_t *dst, const float *src, int m, int n)
{
    for (int r = 0; r < FLASHC_CPU_BLOCK_M; r += 2) {
        uint16_t *dr = dst + r * FLASHC_CPU_BLOCK_N;
        const float *s0 = src + r * FLASHC_CPU_BLOCK_N, *s1 = s0 + FLASHC_CPU_BLOCK_N;
        for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 4) {
            const float32x4_t x = r < m ? neon_row4(s0, c0, n) : vdupq_n_f32(0.0f);
            const float32x4_t y = r + 1 < m ? neon_row4(s1, c0, n) : vdupq_n_f32(0.0f);
            const uint16x4_t xb = vreinterpret_u16_bf16(vcvt_bf16_f32(x));
            const uint16x4_t yb = vreinterpret_u16_bf16(vcvt_bf16_f32(y));
            vst1q_u16(dr + 2 * c0, vcombine_u16(vzip1_u16(xb, yb), vzip2_u16(xb, yb)));
        }
    }
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
    .bf16_supported = neon_bf16_supported,
    .gemm_panel16 = neon_gemm_panel16,
    .gemm_acc16 = neon_gemm_acc16,
    .round_p16 = neon_round_p16,
    .gemm_panel16_acc = neon_gemm_panel16_acc,
    .pair_p16 = neon_pair_p16,
};
