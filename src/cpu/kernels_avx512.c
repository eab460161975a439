/*
 * kernels_avx512.c - AVX-512 micro-kernels (AVX-512F/BW/VL; built with those flags only for
 * this file). The float32 products come from kernels_simd.inc with 6 x 4 register tiles
 * (24 zmm accumulators, 64 columns), as do the guards of the softmax (a negative scale, a max
 * far from 0), which the 16-row softmax here shares with the other sets; the bf16 forward
 * and backward products use AVX512_BF16 vdpbf16ps, which does two multiply-adds per lane
 * per instruction: twice the float32 FMA rate where the core issues it at the FMA rate
 * (measured so on Zen 4).
 *
 * exp: x is clamped to >= -150 (exp(-inf) and anything below -103.97 give exactly 0 through
 * vscalefps underflow), n = round(x log2 e), r = x - n ln2 (two-constant Cody-Waite, exact
 * first product), e^r by a degree-6 minimax polynomial (the Cephes expf one), then
 * scalef(p, n). Relative error <= 2 ULP of expf over [-87.3, 1] (tests/c/test_cpu_exp.c
 * measures it); subnormal results keep an absolute error below 2^-126.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "flashc.h"

#define KN(x) avx512_##x
#define VW 16
typedef __m512 vf;
#define VLOAD(p) _mm512_load_ps(p)
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_store_ps((p), (v))
#define VSTOREU(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define TILE_MR 6
#define TILE_NV 4
#define TILE_NV2 2

static inline __mmask16 avx512_lanes_below(int c0, int nc)
{
    int k = nc - c0;
    return k >= 16 ? (__mmask16)0xffff : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1);
}
#define VSELECT_LT(c0, nc, v, w) _mm512_mask_blend_ps(avx512_lanes_below((c0), (nc)), (w), (v))
#define VKEEP_NZ(p, v) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((p), _mm512_setzero_ps(), _CMP_NEQ_UQ), (v))

static inline vf avx512_vexp(vf x)
{
    /* the clamp second: maxps returns its second operand when either is NaN, so a NaN
     * argument stays NaN (a NaN score must not turn into P = 0) */
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    vf p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    vf r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

#define KN_OWN_SOFTMAX /* 16 rows at a time, below, on the shared guards */
#include "cpu/kernels_simd.inc"

static int avx512_supported(void)
{
    const flashc_cpu_features *f = flashc_cpu_get_features();
    return f->avx512f && f->avx512bw && f->avx512vl && f->fma;
}

/* Lane i = v[i]'s lanes folded by max (use_max, a constant after inlining) or by sum: a
 * transposing tree, 15 steps of two shuffles and an operation for 16 results, where 16
 * separate reductions would take 16 x 4. */
static inline __attribute__((always_inline)) __m512 avx512_fold16(const __m512 *v,
                                                                  const int use_max)
{
#define FOLD(a, b) (use_max ? _mm512_max_ps((a), (b)) : _mm512_add_ps((a), (b)))
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) */
        t[i] = FOLD(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                    _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: the lane's sums of 4 inputs */
        u[i] = FOLD(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                    _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xee));
    for (int i = 0; i < 2; i++) /* then across the four 128-bit lanes */
        w[i] = FOLD(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                    _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd));
    return FOLD(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
#undef FOLD
}

static inline __m512 avx512_sum16(const __m512 *v)
{
    return avx512_fold16(v, 0);
}

/* ---- bf16 products (AVX512_BF16), used only when the processor has it ---- */

/* The bf16 functions need the extra instruction set; the attribute keeps the rest of the file
 * runnable on AVX-512 parts without it. */
#define BF16_FN __attribute__((target("avx512bf16")))

/* C[mr][64] = A16[mr][0:k] * panel16: per pair of dims, broadcast one 32-bit (d, d+1) pair of
 * each row and dot it with 4 zmm of 16 keys x 2 dims. */
static inline __attribute__((always_inline)) BF16_FN void
avx512_panel16_tile(const int mr, int k, const uint16_t *a, ptrdiff_t lda,
                    const uint16_t *panel, float *c, const int accumulate)
{
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[r][v] = accumulate ? _mm512_load_ps(c + r * FLASHC_CPU_BLOCK_N + v * 16)
                                   : _mm512_setzero_ps();
    for (int p = 0; p < k; p += 2) {
        const uint16_t *bp = panel + (ptrdiff_t)p * FLASHC_CPU_BLOCK_N; /* [p/2][64][2] */
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)(bp + 0));
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 32));
        __m512bh b2 = (__m512bh)_mm512_load_si512((const void *)(bp + 64));
        __m512bh b3 = (__m512bh)_mm512_load_si512((const void *)(bp + 96));
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            int32_t pair;
            __builtin_memcpy(&pair, a + r * lda + p, sizeof pair);
            __m512bh ar = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], ar, b2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], ar, b3);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm512_store_ps(c + r * FLASHC_CPU_BLOCK_N + v * 16, acc[r][v]);
}

#define PANEL16_TILE(MR)                                                                     \
    static BF16_FN void avx512_panel16_##MR(int k, const uint16_t *a, ptrdiff_t lda,         \
                                            const uint16_t *panel, float *c)                 \
    {                                                                                         \
        avx512_panel16_tile(MR, k, a, lda, panel, c, 0);                                      \
    }                                                                                         \
    static BF16_FN void avx512_panel16acc_##MR(int k, const uint16_t *a, ptrdiff_t lda,      \
                                               const uint16_t *panel, float *c)              \
    {                                                                                         \
        avx512_panel16_tile(MR, k, a, lda, panel, c, 1);                                      \
    }
PANEL16_TILE(1)
PANEL16_TILE(2)
PANEL16_TILE(3)
PANEL16_TILE(4)
PANEL16_TILE(5)
PANEL16_TILE(6)
typedef void (*panel16_fn)(int, const uint16_t *, ptrdiff_t, const uint16_t *, float *);
static const panel16_fn panel16_tiles[7] = {NULL, avx512_panel16_1, avx512_panel16_2,
                                            avx512_panel16_3, avx512_panel16_4,
                                            avx512_panel16_5, avx512_panel16_6};
static const panel16_fn panel16acc_tiles[7] = {NULL, avx512_panel16acc_1, avx512_panel16acc_2,
                                               avx512_panel16acc_3, avx512_panel16acc_4,
                                               avx512_panel16acc_5, avx512_panel16acc_6};

static void avx512_gemm_panel16(int m, int k, const uint16_t *a, ptrdiff_t lda,
                                const uint16_t *panel16, float *c)
{
    for (int r0 = 0; r0 < m; r0 += 6) {
        int mr = m - r0 < 6 ? m - r0 : 6;
        panel16_tiles[mr](k, a + r0 * lda, lda, panel16, c + r0 * FLASHC_CPU_BLOCK_N);
    }
}

/* C[m][64] += A16 * panel16: the backward's dV^T and dK^T, m = dp rows of dO^T or Q^T,
 * k the queries of the block (rounded up to a pair; the zero padding adds nothing). */
static void avx512_gemm_panel16_acc(int m, int k, const uint16_t *a, ptrdiff_t lda,
                                    const uint16_t *panel16, float *c)
{
    k = (k + 1) & ~1;
    for (int r0 = 0; r0 < m; r0 += 6) {
        int mr = m - r0 < 6 ? m - r0 : 6;
        panel16acc_tiles[mr](k, a + r0 * lda, lda, panel16, c + r0 * FLASHC_CPU_BLOCK_N);
    }
}

/* C[mr][nv*16] += P16[mr][0:n] * vpair16[n/2][dp][2] over pairs of keys. */
static inline __attribute__((always_inline)) BF16_FN void
avx512_acc16_tile(const int mr, const int nv, int n, int dp, const uint16_t *p16,
                  const uint16_t *vp, float *c)
{
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            acc[r][v] = _mm512_load_ps(c + (ptrdiff_t)r * dp + v * 16);
    for (int kk = 0; kk < n; kk += 2) {
        const uint16_t *bk = vp + (ptrdiff_t)(kk / 2) * dp * 2;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = (__m512bh)_mm512_load_si512((const void *)(bk + v * 32));
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            int32_t pair;
            __builtin_memcpy(&pair, p16 + r * FLASHC_CPU_BLOCK_N + kk, sizeof pair);
            __m512bh ar = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            _mm512_store_ps(c + (ptrdiff_t)r * dp + v * 16, acc[r][v]);
}

#define ACC16_TILE(MR)                                                                       \
    static BF16_FN void avx512_acc16_##MR##_4(int n, int dp, const uint16_t *p,              \
                                              const uint16_t *vp, float *c)                  \
    {                                                                                         \
        avx512_acc16_tile(MR, 4, n, dp, p, vp, c);                                            \
    }                                                                                         \
    static BF16_FN void avx512_acc16_##MR##_2(int n, int dp, const uint16_t *p,              \
                                              const uint16_t *vp, float *c)                  \
    {                                                                                         \
        avx512_acc16_tile(MR, 2, n, dp, p, vp, c);                                            \
    }
ACC16_TILE(1)
ACC16_TILE(2)
ACC16_TILE(3)
ACC16_TILE(4)
ACC16_TILE(5)
ACC16_TILE(6)
typedef void (*acc16_fn)(int, int, const uint16_t *, const uint16_t *, float *);
static const acc16_fn acc16_tiles[7][2] = {
    {NULL, NULL},
    {avx512_acc16_1_4, avx512_acc16_1_2},
    {avx512_acc16_2_4, avx512_acc16_2_2},
    {avx512_acc16_3_4, avx512_acc16_3_2},
    {avx512_acc16_4_4, avx512_acc16_4_2},
    {avx512_acc16_5_4, avx512_acc16_5_2},
    {avx512_acc16_6_4, avx512_acc16_6_2},
};

static void avx512_gemm_acc16_block(int m, int n, int dp, const uint16_t *p16,
                                    const uint16_t *vpair16, float *c)
{
    int n2 = (n + 1) & ~1;
    for (int c0 = 0; c0 < dp;) {
        int wide = dp - c0 >= 64;
        for (int r0 = 0; r0 < m; r0 += 6) {
            int mr = m - r0 < 6 ? m - r0 : 6;
            acc16_tiles[mr][wide ? 0 : 1](n2, dp, p16 + r0 * FLASHC_CPU_BLOCK_N,
                                          vpair16 + (ptrdiff_t)c0 * 2,
                                          c + (ptrdiff_t)r0 * dp + c0);
        }
        c0 += wide ? 64 : 32;
    }
}

/* A step of several key blocks: one block's product after the other. */
static void avx512_gemm_acc16(int m, int n, int dp, const uint16_t *p16,
                              const uint16_t *vpair16, float *c)
{
    for (int k0 = 0; k0 < n; k0 += FLASHC_CPU_BLOCK_N)
        avx512_gemm_acc16_block(m, n - k0 < FLASHC_CPU_BLOCK_N ? n - k0 : FLASHC_CPU_BLOCK_N,
                                dp, p16 + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK,
                                vpair16 + (ptrdiff_t)k0 * dp, c);
}

/* bf16 rounding to nearest even of P, 16 at a time with vcvtneps2bf16. Columns from n to 64
 * become 0, so a kernel that reduces over whole 32-key tiles (AMX) adds nothing there. */
static BF16_FN void avx512_round_p16(uint16_t *dst, const float *src, int m, int n)
{
    for (int r = 0; r < m; r++) {
        const float *sr = src + r * FLASHC_CPU_BLOCK_N;
        uint16_t *dr = dst + r * FLASHC_CPU_BLOCK_N;
        for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 16) {
            __m512 x = _mm512_maskz_mov_ps(avx512_lanes_below(c0, n), _mm512_load_ps(sr + c0));
            _mm256_store_si256((__m256i *)(dr + c0), (__m256i)_mm512_cvtneps_pbh(x));
        }
    }
}

/* vcvtneps2bf16 rounds to nearest even and keeps NaN quiet, as the generic conversion does;
 * the tail through lane masks, so nothing past n is read or written. */
static BF16_FN void avx512_store16(uint16_t *dst, const float *src, int64_t n, float scale)
{
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = avx512_lanes_below(0, (int)(n - i < 16 ? n - i : 16));
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), vs);
        _mm256_mask_storeu_epi16(dst + i, k, (__m256i)_mm512_cvtneps_pbh(x));
    }
}

/* 2^t for the bf16 forward's softmax: t clamped to >= -200 (exactly 0 below 2^-149, NaN
 * stays NaN as in avx512_vexp), n = round(t), f = t - n exact, 2^f by a degree-4 relative
 * minimax fit on [-1/2, 1/2] with its constant term set to 1 (relative error 2.9e-6 in
 * float), then scalef. Five operations fewer than e^x with its Cody-Waite reduction and
 * degree-6 polynomial; P is rounded to bf16 next (relative 2^-9), and the row sums take a
 * bias below 3e-6, a third of the LSE's 1e-5 bound. */
static inline __m512 avx512_vexp2_p16(__m512 t)
{
    t = _mm512_max_ps(_mm512_set1_ps(-200.0f), t);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(9.5828564255e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5906433356e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4024098606e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9312419241e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)); /* 2^0 = 1 exactly: P = 1 at the max */
    return _mm512_scalef_ps(p, n);
}

/* Lane r = the largest visible score of row r of s (-inf for r >= g): each row folded to
 * one vector over the step's blocks, then the 16 vectors by one transposing tree. */
static inline __m512 avx512_rows_max16(const float *s, int g, const int *ncols)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 v[16];
    for (int r = 0; r < 16; r++) {
        const int nc = r < g ? ncols[r] : 0;
        __m512 mx = neg_inf;
        for (int k0 = 0; k0 < nc; k0 += FLASHC_CPU_BLOCK_N) {
            const float *srow = s + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK + r * FLASHC_CPU_BLOCK_N;
            const int bnc = nc - k0;
            if (bnc >= FLASHC_CPU_BLOCK_N) /* every key visible, as in most blocks */
                for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 16)
                    mx = _mm512_max_ps(mx, _mm512_load_ps(srow + c0));
            else
                for (int c0 = 0; c0 < bnc; c0 += 16)
                    mx = _mm512_max_ps(mx,
                                       VSELECT_LT(c0, bnc, _mm512_load_ps(srow + c0), neg_inf));
        }
        v[r] = mx;
    }
    return avx512_fold16(v, 1);
}

/* A row with nothing visible so far: P = 0 over the step's blocks (into prow as bf16, or
 * over s's first n columns where prow is NULL), and its sum NaN when a visible score is (the
 * vector max drops NaN, so it is looked for here, off the hot path). */
static void avx512_row_dead(float *srow, int n, int nc, float *row_sum, uint16_t *prow)
{
    for (int c = 0; c < nc; c++)
        if (srow[c / FLASHC_CPU_BLOCK_N * SCORE_BLOCK + c % FLASHC_CPU_BLOCK_N] !=
            srow[c / FLASHC_CPU_BLOCK_N * SCORE_BLOCK + c % FLASHC_CPU_BLOCK_N])
            *row_sum = NAN;
    for (int k0 = 0; k0 < n; k0 += FLASHC_CPU_BLOCK_N) {
        if (prow) {
            memset(prow + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK, 0,
                   FLASHC_CPU_BLOCK_N * sizeof(uint16_t));
            continue;
        }
        float *sb = srow + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK;
        for (int c0 = 0; c0 < n - k0 && c0 < FLASHC_CPU_BLOCK_N; c0 += 16)
            _mm512_store_ps(sb + c0, _mm512_setzero_ps());
    }
}

/* One row's float P = e^(x sc - max) in place, over its first n columns (the float
 * softmax's exponential, avx512_vexp); returns the sum, lane by lane. */
static inline __m512 avx512_pf_row(float *srow, int n, int nc, float sc, float max)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), vnegmax = _mm512_set1_ps(-max);
    const __m512 vsc = _mm512_set1_ps(avx512_exact_max_sc(srow, n, sc, max));
    __m512 vsum = _mm512_setzero_ps();
    for (int k0 = 0; k0 < n; k0 += FLASHC_CPU_BLOCK_N) {
        float *sb = srow + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK;
        const int bnc = nc - k0;
        for (int c0 = 0; c0 < n - k0 && c0 < FLASHC_CPU_BLOCK_N; c0 += 16) {
            __m512 x = _mm512_fmadd_ps(_mm512_load_ps(sb + c0), vsc, vnegmax);
            if (bnc < FLASHC_CPU_BLOCK_N)
                x = VSELECT_LT(c0, bnc, x, neg_inf);
            const __m512 e = avx512_vexp(x);
            _mm512_store_ps(sb + c0, e);
            vsum = _mm512_add_ps(vsum, e);
        }
    }
    return vsum;
}

/* 2^t of the 16 scores from column c0 of a block (zero from bn on; -inf past the visible
 * bnc when the block is not all visible). t = x c1 - m1 in one FMA, or, two_step (a
 * constant after inlining), (x c1 - m1) l2e: x sc - max first, for the rows whose max is far
 * from 0 (KN_EXACT_MAX) or whose sc log2 e would not be finite. */
static inline __attribute__((always_inline)) __m512
avx512_p16_exp(const float *sb, int c0, int bn, int bnc, __m512 c1, __m512 negm1,
               const int two_step, __m512 *vmax)
{
    if (c0 >= bn)
        return _mm512_setzero_ps();
    const __m512 x = _mm512_load_ps(sb + c0);
    if (vmax) /* the visible scores' max, on the way */
        *vmax = _mm512_max_ps(*vmax, bnc < FLASHC_CPU_BLOCK_N
                                         ? VSELECT_LT(c0, bnc, x, _mm512_set1_ps(-INFINITY))
                                         : x);
    __m512 t = _mm512_fmadd_ps(x, c1, negm1);
    if (two_step)
        t = _mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f));
    if (bnc < FLASHC_CPU_BLOCK_N)
        t = VSELECT_LT(c0, bnc, t, _mm512_set1_ps(-INFINITY));
    return avx512_vexp2_p16(t);
}

static inline __attribute__((always_inline)) BF16_FN __m512
avx512_p16_row_body(const float *srow, int n, int nc, __m512 c1, __m512 negm1, uint16_t *prow,
                    const int two_step, __m512 *vmax_out)
{
    /* the max in a local: through the pointer, each P store (which may alias it) would
     * reload it */
    __m512 vsum = _mm512_setzero_ps(), vmax_local = _mm512_set1_ps(-INFINITY);
    __m512 *vmax = vmax_out ? &vmax_local : NULL;
    for (int k0 = 0; k0 < n; k0 += FLASHC_CPU_BLOCK_N) {
        const float *sb = srow + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK;
        uint16_t *pb = prow + (k0 / FLASHC_CPU_BLOCK_N) * SCORE_BLOCK;
        const int bn = n - k0, bnc = nc - k0;
        for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 32) {
            const __m512 e0 = avx512_p16_exp(sb, c0, bn, bnc, c1, negm1, two_step, vmax);
            const __m512 e1 = avx512_p16_exp(sb, c0 + 16, bn, bnc, c1, negm1, two_step, vmax);
            _mm512_store_si512((void *)(pb + c0), (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            vsum = _mm512_add_ps(vsum, _mm512_add_ps(e0, e1));
        }
    }
    if (vmax_out)
        *vmax_out = vmax_local;
    return vsum;
}

/* One row's P = 2^(x sc log2 e - max log2 e) over the step's blocks, rounded to bf16 into
 * prow two vectors at a time (one vcvtne2ps2bf16; zero from n to the end of its block);
 * returns the float exponentials' sum, lane by lane. */
static BF16_FN __m512 avx512_p16_row(float *srow, int n, int nc, float sc, float max,
                                     uint16_t *prow)
{
    const float l2e = 1.44269504088896341f;
    if (avx512_max_folds(max) && sc * l2e <= 3.0e38f)
        return avx512_p16_row_body(srow, n, nc, _mm512_set1_ps(sc * l2e),
                                   _mm512_set1_ps(-max * l2e), prow, 0, NULL);
    /* a max far from 0 (KN_EXACT_MAX): (x sc - max) log2 e, with x sc rounded first (in
     * place; s is scratch after the softmax) so that no exponent of the row is above 0.
     * Unlike the float softmax's guard (avx512_exact_max_sc), sc = 1 is no exemption here:
     * log2 e is folded into both constants all the same. */
    avx512_scale_row(srow, n, sc);
    return avx512_p16_row_body(srow, n, nc, _mm512_set1_ps(1.0f), _mm512_set1_ps(-max), prow, 1,
                               NULL);
}

/* The same against a row's kept reference max ref (|ref| within KN_EXACT_MAX), one pass:
 * *vmax gets the lanes' max of the visible raw scores. */
static BF16_FN __m512 avx512_p16_row_ref(const float *srow, int n, int nc, float sc, float ref,
                                         uint16_t *prow, __m512 *vmax)
{
    const float l2e = 1.44269504088896341f;
    return avx512_p16_row_body(srow, n, nc, _mm512_set1_ps(sc * l2e), _mm512_set1_ps(-ref * l2e),
                               prow, 0, vmax);
}

/* The online softmax of up to 16 rows (g) of a step. The rows' maxima, sums and rescale
 * factors are the lanes of one vector, so the bookkeeping that a 64-key row paid alone (two
 * horizontal reductions and a scalar exp) is shared by 16 rows. out16 (a constant after
 * inlining): P rounded to bf16 into p16 by avx512_vexp2_p16, s is scratch afterwards; else
 * float P in s. The rescale factor e^(old max - new max) is avx512_vexp's: exactly 1 where
 * the max stayed, 0 from -inf. */
static inline __attribute__((always_inline)) void
avx512_softmax_rows(float *s, int g, int n, const int *ncols, float sc, float *row_max,
                    float *row_sum, float *o, int dp, uint16_t *p16, const int out16)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    const __mmask16 rows = (__mmask16)((1u << g) - 1);
    const __m512 old = _mm512_mask_loadu_ps(neg_inf, rows, row_max);
    /* sc > 0 keeps the order, -inf stays -inf; a NaN lane keeps the old max (maxps' second
     * operand) */
    const __m512 newm =
        _mm512_max_ps(_mm512_mul_ps(avx512_rows_max16(s, g, ncols), _mm512_set1_ps(sc)), old);
    const __mmask16 dead = _mm512_mask_cmp_ps_mask(rows, newm, neg_inf, _CMP_EQ_OQ);
    float maxes[16] __attribute__((aligned(64)));
    _mm512_store_ps(maxes, newm);
    __m512 sums[16];
    for (int r = 0; r < 16; r++) {
        float *srow = s + r * FLASHC_CPU_BLOCK_N;
        uint16_t *prow = out16 ? p16 + r * FLASHC_CPU_BLOCK_N : NULL;
        sums[r] = _mm512_setzero_ps();
        if (r >= g)
            continue;
        if (dead >> r & 1)
            avx512_row_dead(srow, n, ncols[r], row_sum + r, prow);
        else if (out16)
            sums[r] = avx512_p16_row(srow, n, ncols[r], sc, maxes[r], prow);
        else
            sums[r] = avx512_pf_row(srow, n, ncols[r], sc, maxes[r]);
    }
    const __mmask16 live = rows & ~dead;
    const __m512 alpha = _mm512_maskz_mov_ps(live, avx512_vexp(_mm512_sub_ps(old, newm)));
    const __m512 sum = _mm512_maskz_loadu_ps(live, row_sum);
    _mm512_mask_storeu_ps(row_sum, live, _mm512_fmadd_ps(sum, alpha, avx512_sum16(sums)));
    _mm512_mask_storeu_ps(row_max, live, newm);
    /* lazy: only rows whose max grew (NaN counts, as alpha != 1 does) */
    unsigned grew = _mm512_mask_cmp_ps_mask(live, alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
    float alphas[16] __attribute__((aligned(64)));
    _mm512_store_ps(alphas, alpha);
    for (; grew; grew &= grew - 1) {
        const int r = __builtin_ctz(grew);
        const __m512 va = _mm512_set1_ps(alphas[r]);
        float *orow = o + (ptrdiff_t)r * dp;
        for (int d = 0; d < dp; d += 16)
            _mm512_store_ps(orow + d, _mm512_mul_ps(_mm512_load_ps(orow + d), va));
    }
}

/* Exponentials that underflow (the masked keys' exp(-inf), keys more than 87 below the
 * row's max) made the processor fix each subnormal or zero result up in microcode, a hundred
 * cycles and more per vector: a causal diagonal block took 13 times as long per score as a
 * full one. The softmax therefore runs with results below 2^-126 flushed to zero (FTZ) and
 * such inputs read as zero (DAZ), which moves P by less than 2^-126 against a row sum of at
 * least 1; the caller's control bits are put back after. */
static unsigned avx512_flush_begin(void)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | _MM_FLUSH_ZERO_ON | 0x0040u /* DAZ */);
    return csr;
}

/* The backward's P and dS, under the same flush as the softmax (masked keys' exp(-inf)). */
static void avx512_p_ds_flushed(float *s, float *dp, int m, int n, const int *ncols,
                                float scale, const float *lse, const float *delta)
{
    const unsigned csr = avx512_flush_begin();
    avx512_p_ds(s, dp, m, n, ncols, scale, lse, delta);
    _mm_setcsr(csr);
}

/* How far (in logits) a row's max may pass the reference its P is taken against before the
 * reference moves: P then stays below e^8 (about 3000), whose sums and products float holds
 * with room. */
#define P16_REF_SLACK 8.0f

/* The bf16 softmax of up to 16 rows that all have a reference max already (every step but a
 * row's first), in one pass over S: P = e^(x sc - ref) against the kept reference, the
 * scores' max gathered on the way. The result is the same softmax (O and l are scaled alike,
 * and LSE = ref + log l); only rows whose max passed ref + P16_REF_SLACK take a second pass
 * against their new max, with O rescaled. Two passes (max, then P) read S twice, which was a
 * sixth of the softmax's time. */
static BF16_FN void avx512_softmax16_rows_ref(float *s, int g, int n, const int *ncols, float sc,
                                              float *row_max, float *row_sum, float *o, int dp,
                                              uint16_t *p16)
{
    const __mmask16 rows = (__mmask16)((1u << g) - 1);
    const __m512 ref = _mm512_maskz_loadu_ps(rows, row_max);
    float refs[16] __attribute__((aligned(64)));
    _mm512_store_ps(refs, ref);
    __m512 sums[16], maxv[16];
    for (int r = 0; r < 16; r++) {
        sums[r] = _mm512_setzero_ps();
        maxv[r] = _mm512_set1_ps(-INFINITY);
        if (r < g)
            sums[r] = avx512_p16_row_ref(s + r * FLASHC_CPU_BLOCK_N, n, ncols[r], sc, refs[r],
                                         p16 + r * FLASHC_CPU_BLOCK_N, &maxv[r]);
    }
    const __m512 bmax = _mm512_mul_ps(avx512_fold16(maxv, 1), _mm512_set1_ps(sc));
    unsigned over = _mm512_mask_cmp_ps_mask(
        rows, bmax, _mm512_add_ps(ref, _mm512_set1_ps(P16_REF_SLACK)), _CMP_GT_OQ);
    const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), (__mmask16)over,
                                            avx512_vexp(_mm512_sub_ps(ref, bmax)));
    float maxes[16] __attribute__((aligned(64))), alphas[16] __attribute__((aligned(64)));
    _mm512_store_ps(maxes, bmax);
    _mm512_store_ps(alphas, alpha);
    _mm512_mask_storeu_ps(row_max, (__mmask16)over, bmax);
    for (; over; over &= over - 1) { /* rare: P against the new max, O rescaled */
        const int r = __builtin_ctz(over);
        sums[r] = avx512_p16_row(s + r * FLASHC_CPU_BLOCK_N, n, ncols[r], sc, maxes[r],
                                 p16 + r * FLASHC_CPU_BLOCK_N);
        const __m512 va = _mm512_set1_ps(alphas[r]);
        float *orow = o + (ptrdiff_t)r * dp;
        for (int d = 0; d < dp; d += 16)
            _mm512_store_ps(orow + d, _mm512_mul_ps(_mm512_load_ps(orow + d), va));
    }
    const __m512 sum = _mm512_maskz_loadu_ps(rows, row_sum);
    _mm512_mask_storeu_ps(row_sum, rows, _mm512_fmadd_ps(sum, alpha, avx512_sum16(sums)));
}

/* 1 when every row of the group has a reference max that may fold into one FMA
 * (avx512_max_folds, 16 rows at a time), and the scale's multiple by log2 e is finite with
 * room (the one-pass softmax's condition). */
static int avx512_rows_have_ref(const float *row_max, int g, float sc)
{
    const __mmask16 rows = (__mmask16)((1u << g) - 1);
    const __m512 ref = _mm512_maskz_loadu_ps(rows, row_max);
    const __m512 big = _mm512_set1_ps(KN_EXACT_MAX);
    const __mmask16 ok = _mm512_mask_cmp_ps_mask(rows, _mm512_abs_ps(ref), big, _CMP_LE_OQ);
    return ok == rows && sc <= 2.0e38f;
}

/* The online softmax of the bf16 forward (softmax16), 16 rows at a time. */
static BF16_FN void avx512_softmax16(float *s, int m, int n, const int *ncols, float scale,
                                     float *row_max, float *row_sum, float *o, int dp,
                                     uint16_t *p16)
{
    const unsigned csr = avx512_flush_begin();
    scale = avx512_prescale(s, m, n, scale);
    for (int r0 = 0; r0 < m; r0 += 16) {
        const int g = m - r0 < 16 ? m - r0 : 16;
        if (avx512_rows_have_ref(row_max + r0, g, scale))
            avx512_softmax16_rows_ref(s + r0 * FLASHC_CPU_BLOCK_N, g, n, ncols + r0, scale,
                                      row_max + r0, row_sum + r0, o + (ptrdiff_t)r0 * dp, dp,
                                      p16 + r0 * FLASHC_CPU_BLOCK_N);
        else
            avx512_softmax_rows(s + r0 * FLASHC_CPU_BLOCK_N, g, n, ncols + r0, scale,
                                row_max + r0, row_sum + r0, o + (ptrdiff_t)r0 * dp, dp,
                                p16 + r0 * FLASHC_CPU_BLOCK_N, 1);
    }
    _mm_setcsr(csr);
}

/* The float online softmax (softmax of kernels.h), 16 rows at a time. */
static void avx512_softmax(float *s, int m, int n, const int *ncols, float scale,
                           float *row_max, float *row_sum, float *o, int dp)
{
    const unsigned csr = avx512_flush_begin();
    scale = avx512_prescale(s, m, n, scale);
    for (int r0 = 0; r0 < m; r0 += 16)
        avx512_softmax_rows(s + r0 * FLASHC_CPU_BLOCK_N, m - r0 < 16 ? m - r0 : 16, n,
                            ncols + r0, scale, row_max + r0, row_sum + r0,
                            o + (ptrdiff_t)r0 * dp, dp, NULL, 0);
    _mm_setcsr(csr);
}

/* Rows r, r+1 of src become the 32-bit pairs (r, c), (r + 1, c) of row r/2 of dst: both rows
 * rounded to bf16 in one vcvtne2ps2bf16 (x in the low half, y in the high), then
 * interleaved with one vpermw. Rows past m and columns past n are zero. */
static BF16_FN void avx512_pair_p16(uint16_t *dst, const float *src, int m, int n)
{
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                           9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                           17, 1, 16, 0);
    for (int r = 0; r < FLASHC_CPU_BLOCK_M; r += 2) {
        uint16_t *dr = dst + r * FLASHC_CPU_BLOCK_N;
        if (r >= m) {
            for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 16)
                _mm512_store_si512((void *)(dr + 2 * c0), _mm512_setzero_si512());
            continue;
        }
        const float *s0 = src + r * FLASHC_CPU_BLOCK_N, *s1 = s0 + FLASHC_CPU_BLOCK_N;
        for (int c0 = 0; c0 < FLASHC_CPU_BLOCK_N; c0 += 16) {
            const __mmask16 k = avx512_lanes_below(c0, n);
            __m512 x = _mm512_maskz_mov_ps(k, _mm512_load_ps(s0 + c0));
            __m512 y = r + 1 < m ? _mm512_maskz_mov_ps(k, _mm512_load_ps(s1 + c0))
                                 : _mm512_setzero_ps();
            __m512i xy = (__m512i)_mm512_cvtne2ps_pbh(y, x);
            _mm512_store_si512((void *)(dr + 2 * c0), _mm512_permutexvar_epi16(inter, xy));
        }
    }
}

static int avx512_bf16_supported(void)
{
    return avx512_supported() && flashc_cpu_get_features()->avx512bf16;
}

/* ---- decode: products straight from the cache rows ---- */

/* Elements [off, off + 16) of a row of any dtype as float32, lanes outside mask zero (and
 * not read: a masked load does not touch memory past the row's end). */
static inline __m512 avx512_row16(const void *row, int64_t off, int dtype, __mmask16 mask)
{
    if (dtype == FLASHC_F32)
        return _mm512_maskz_loadu_ps(mask, (const float *)row + off);
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + off);
    if (dtype == FLASHC_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __mmask16 avx512_tail_mask(int64_t d)
{
    return (d & 15) ? (__mmask16)((1u << (d & 15)) - 1) : (__mmask16)0xffff;
}

/* The lines of row c of pf (if there is one), asked for while row c of the block is used,
 * into L2 only: a block's K and V over the kv heads (128 KiB at d = 128, bf16) is more than L1
 * holds, and brought into L1 ahead of use they pushed out the lines in use (docs/PERF.md,
 * "CPU decode: the next block into L2"). */
static inline void avx512_prefetch_row(const void *const *pf, int npf, int c, int64_t bytes)
{
    if (c < npf)
        for (int64_t at = 0; at < bytes; at += 64)
            _mm_prefetch((const char *)pf[c] + at, _MM_HINT_T1);
}

/* 16 keys at a time: their rows are converted once into an L1 buffer, then each query row
 * takes 16 dot products against it and the add tree turns the 16 accumulators into 16
 * scores. Every key row is read from memory once for all m rows. */
static void avx512_decode_qk(int m, int n, int64_t d, const float *q, int dp,
                             const void *const *k, int dtype, const void *const *pf, int npf,
                             float *s)
{
    const int nch = (int)((d + 15) / 16), ld = nch * 16;
    const __mmask16 tail = avx512_tail_mask(d);
    const int64_t bytes = d * (dtype == FLASHC_F32 ? 4 : 2);
    float tmp[16 * FLASHC_MAX_HEAD_DIM] __attribute__((aligned(64)));
    for (int g0 = 0; g0 < n; g0 += 16) {
        const int gn = n - g0 < 16 ? n - g0 : 16;
        for (int c = 0; c < 16; c++) {
            avx512_prefetch_row(pf, npf, g0 + c, bytes);
            for (int ch = 0; ch < nch; ch++)
                _mm512_store_ps(tmp + c * ld + 16 * ch,
                                c < gn ? avx512_row16(k[g0 + c], 16 * ch, dtype,
                                                      ch == nch - 1 ? tail : 0xffff)
                                       : _mm512_setzero_ps());
        }
        for (int r = 0; r < m; r++) {
            const float *qr = q + (ptrdiff_t)r * dp;
            __m512 acc[16];
            for (int c = 0; c < 16; c++)
                acc[c] = _mm512_setzero_ps();
            for (int ch = 0; ch < nch; ch++) {
                const __m512 qv = _mm512_load_ps(qr + 16 * ch);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++)
                    acc[c] = _mm512_fmadd_ps(qv, _mm512_load_ps(tmp + c * ld + 16 * ch), acc[c]);
            }
            _mm512_storeu_ps(s + r * FLASHC_CPU_BLOCK_N + g0, avx512_sum16(acc));
        }
    }
}

/* bf16 keys against bf16 Q with vdpbf16ps, straight from the rows: no conversion, no
 * buffer, and half the multiply-add instructions of the float32 loop. Two query rows at a
 * time take eight keys' dot products in 16 accumulators (two dims per lane per instruction):
 * each key chunk loaded serves both rows, so the loop loads 10 vectors per 16 products where
 * one row against 16 keys loaded 17, and the core's one vector load per cycle held it back.
 * The add tree folds the 16 accumulators into the two rows' 8 scores. The first pair of rows
 * brings the 16 key rows (8 KiB at most) into L1; the others read them there. */
static BF16_FN void avx512_decode_qk16(int m, int n, int64_t d, const uint16_t *q16, int dp,
                                       const void *const *k, float scale,
                                       const void *const *pf, int npf, float *s)
{
    const int nch = (int)((d + 31) / 32);
    const __mmask32 tail = (d & 31) ? (__mmask32)((1u << (d & 31)) - 1) : (__mmask32)~0u;
    const __m512 vscale = _mm512_set1_ps(scale);
    const uint16_t *rows[16];
    for (int g0 = 0; g0 < n; g0 += 16) {
        const int gn = n - g0 < 16 ? n - g0 : 16;
        for (int c = 0; c < 16; c++) { /* keys past n: the first again, scores unused */
            rows[c] = (const uint16_t *)k[g0 + (c < gn ? c : 0)];
            avx512_prefetch_row(pf, npf, g0 + c, d * 2);
        }
        for (int r = 0; r < m; r += 2) {
            const int pair = r + 1 < m; /* an odd last row runs alone (its twin's lanes unused) */
            const uint16_t *qa = q16 + (ptrdiff_t)r * dp, *qb = pair ? qa + dp : qa;
            for (int c0 = 0; c0 < 16; c0 += 8) {
                __m512 acc[16]; /* [0, 8): row r, keys c0 + i; [8, 16): row r + 1 */
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_setzero_ps();
                for (int ch = 0; ch < nch; ch++) {
                    const __mmask32 mk = ch == nch - 1 ? tail : (__mmask32)~0u;
                    const __m512bh a = (__m512bh)_mm512_loadu_si512((const void *)(qa + 32 * ch));
                    const __m512bh b = (__m512bh)_mm512_loadu_si512((const void *)(qb + 32 * ch));
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        const __m512bh kv =
                            (__m512bh)_mm512_maskz_loadu_epi16(mk, rows[c0 + i] + 32 * ch);
                        acc[i] = _mm512_dpbf16_ps(acc[i], a, kv);
                        acc[8 + i] = _mm512_dpbf16_ps(acc[8 + i], b, kv);
                    }
                }
                const __m512 sc = _mm512_mul_ps(avx512_sum16(acc), vscale);
                _mm256_storeu_ps(s + r * FLASHC_CPU_BLOCK_N + g0 + c0, _mm512_castps512_ps256(sc));
                if (pair)
                    _mm256_storeu_ps(s + (r + 1) * FLASHC_CPU_BLOCK_N + g0 + c0,
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sc), 1)));
            }
        }
    }
}

/* rm (constant after inlining) rows of O, 16 dims at a time in registers, while the value
 * rows stream past: one load and conversion of each 16 values serves all rm rows. */
static inline __attribute__((always_inline)) void
avx512_pv_rows(const int rm, int n, int64_t d, const float *p, const void *const *v,
               const int dtype,
               const void *const *pf, int npf, float *o, int dp)
{
    const int nch = (int)((d + 15) / 16);
    const __mmask16 tail = avx512_tail_mask(d);
    const int64_t es = dtype == FLASHC_F32 ? 4 : 2, bytes = d * es;
    for (int ch = 0; ch < nch; ch++) {
        const __mmask16 mask = ch == nch - 1 ? tail : 0xffff;
        /* the next rows' line that holds these dims, if it starts here, one per key */
        const int64_t line = 16 * ch * es;
        const int pfn = pf && (line & 63) < 16 * es && line < bytes ? npf : 0;
        __m512 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++)
            acc[r] = _mm512_load_ps(o + (ptrdiff_t)r * dp + 16 * ch);
        for (int c = 0; c < n; c++) {
            const __m512 vv = avx512_row16(v[c], 16 * ch, dtype, mask);
            if (c < pfn)
                _mm_prefetch((const char *)pf[c] + line, _MM_HINT_T1);
#pragma GCC unroll 8
            for (int r = 0; r < rm; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * FLASHC_CPU_BLOCK_N + c]), vv,
                                         acc[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++)
            _mm512_store_ps(o + (ptrdiff_t)r * dp + 16 * ch, acc[r]);
    }
}

/* one copy per dtype, so the conversion is chosen once, not per key */
#define PV_ROWS(RM)                                                                          \
    static void avx512_pv_##RM(int n, int64_t d, const float *p, const void *const *v,       \
                               int dtype, const void *const *pf, int npf, float *o, int dp)  \
    {                                                                                         \
        if (dtype == FLASHC_F32)                                                              \
            avx512_pv_rows(RM, n, d, p, v, FLASHC_F32, pf, npf, o, dp);                       \
        else if (dtype == FLASHC_F16)                                                         \
            avx512_pv_rows(RM, n, d, p, v, FLASHC_F16, pf, npf, o, dp);                       \
        else                                                                                  \
            avx512_pv_rows(RM, n, d, p, v, FLASHC_BF16, pf, npf, o, dp);                      \
    }
PV_ROWS(1)
PV_ROWS(2)
PV_ROWS(3)
PV_ROWS(4)
PV_ROWS(5)
PV_ROWS(6)
PV_ROWS(7)
PV_ROWS(8)
typedef void (*pv_fn)(int, int64_t, const float *, const void *const *, int,
                      const void *const *, int, float *, int);
static const pv_fn pv_tiles[9] = {NULL,      avx512_pv_1, avx512_pv_2, avx512_pv_3, avx512_pv_4,
                                  avx512_pv_5, avx512_pv_6, avx512_pv_7, avx512_pv_8};

static void avx512_decode_pv(int m, int n, int64_t d, const float *p, const void *const *v,
                             int dtype, const void *const *pf, int npf, float *o, int dp)
{
    for (int r0 = 0; r0 < m; r0 += 8) { /* the first pass over the rows asks for the next */
        const int rm = m - r0 < 8 ? m - r0 : 8;
        pv_tiles[rm](n, d, p + r0 * FLASHC_CPU_BLOCK_N, v, dtype, r0 ? NULL : pf, npf,
                     o + (ptrdiff_t)r0 * dp, dp);
    }
}

/* bf16 values against P rounded to bf16 (as the forward's bf16 path rounds it) with
 * vdpbf16ps over pairs of keys: the rows of keys c and c + 1 are interleaved in registers
 * (two vpermt2w per 32 dims), and each row of O takes two multiply-adds per lane per
 * instruction, with no conversion of V. rm (constant after inlining) rows of O, 32 dims at a
 * time, stay in registers while the value rows stream past. */
static inline __attribute__((always_inline)) BF16_FN void
avx512_pv16_rows(const int rm, int n, int64_t d, const uint16_t *p16, const void *const *v,
                 const void *const *pf, int npf, float *o, int dp)
{
    const int nch = (int)((d + 31) / 32);
    const __mmask32 tail = (d & 31) ? (__mmask32)((1u << (d & 31)) - 1) : (__mmask32)~0u;
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41,
                                            9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2,
                                            33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int ch = 0; ch < nch; ch++) {
        const __mmask32 mk = ch == nch - 1 ? tail : (__mmask32)~0u;
        const int pfn = pf ? npf : 0; /* 32 bf16: one line of each next row */
        __m512 lo[8], hi[8];
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++) {
            lo[r] = _mm512_load_ps(o + (ptrdiff_t)r * dp + 32 * ch);
            hi[r] = _mm512_load_ps(o + (ptrdiff_t)r * dp + 32 * ch + 16);
        }
        for (int c = 0; c < n; c += 2) {
            const __m512i a = _mm512_maskz_loadu_epi16(mk, (const uint16_t *)v[c] + 32 * ch);
            /* past an odd n: zeros (its P is zero too, and a row there may not exist) */
            const __m512i b = c + 1 < n ? _mm512_maskz_loadu_epi16(
                                              mk, (const uint16_t *)v[c + 1] + 32 * ch)
                                        : _mm512_setzero_si512();
            if (c < pfn)
                _mm_prefetch((const char *)pf[c] + 64 * ch, _MM_HINT_T1);
            if (c + 1 < pfn)
                _mm_prefetch((const char *)pf[c + 1] + 64 * ch, _MM_HINT_T1);
            const __m512bh vl = (__m512bh)_mm512_permutex2var_epi16(a, lo_idx, b);
            const __m512bh vh = (__m512bh)_mm512_permutex2var_epi16(a, hi_idx, b);
#pragma GCC unroll 8
            for (int r = 0; r < rm; r++) {
                int32_t pair;
                __builtin_memcpy(&pair, p16 + r * FLASHC_CPU_BLOCK_N + c, sizeof pair);
                const __m512bh pr = (__m512bh)_mm512_set1_epi32(pair);
                lo[r] = _mm512_dpbf16_ps(lo[r], pr, vl);
                hi[r] = _mm512_dpbf16_ps(hi[r], pr, vh);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++) {
            _mm512_store_ps(o + (ptrdiff_t)r * dp + 32 * ch, lo[r]);
            _mm512_store_ps(o + (ptrdiff_t)r * dp + 32 * ch + 16, hi[r]);
        }
    }
}

#define PV16_ROWS(RM)                                                                        \
    static BF16_FN void avx512_pv16_##RM(int n, int64_t d, const uint16_t *p,                \
                                         const void *const *v, const void *const *pf,        \
                                         int npf, float *o, int dp)                          \
    {                                                                                         \
        avx512_pv16_rows(RM, n, d, p, v, pf, npf, o, dp);                                     \
    }
PV16_ROWS(1)
PV16_ROWS(2)
PV16_ROWS(3)
PV16_ROWS(4)
PV16_ROWS(5)
PV16_ROWS(6)
PV16_ROWS(7)
PV16_ROWS(8)
typedef void (*pv16_fn)(int, int64_t, const uint16_t *, const void *const *,
                        const void *const *, int, float *, int);
static const pv16_fn pv16_tiles[9] = {NULL,         avx512_pv16_1, avx512_pv16_2,
                                      avx512_pv16_3, avx512_pv16_4, avx512_pv16_5,
                                      avx512_pv16_6, avx512_pv16_7, avx512_pv16_8};

static void avx512_decode_pv16(int m, int n, int64_t d, const uint16_t *p16,
                               const void *const *v, const void *const *pf, int npf, float *o,
                               int dp)
{
    for (int r0 = 0; r0 < m; r0 += 8) {
        const int rm = m - r0 < 8 ? m - r0 : 8;
        pv16_tiles[rm](n, d, p16 + r0 * FLASHC_CPU_BLOCK_N, v, r0 ? NULL : pf, npf,
                       o + (ptrdiff_t)r0 * dp, dp);
    }
}

static int avx512_rows_nonfinite(const void *const *rows, int n, int64_t d, int dtype)
{
    const int64_t per = dtype == FLASHC_F32 ? 16 : 32; /* elements per 64-byte load */
    __mmask64 bad = 0;
    for (int c = 0; c < n; c++)
        for (int64_t x = 0; x < d; x += per) {
            const int64_t left = d - x;
            if (dtype == FLASHC_F32) {
                const __mmask16 k = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
                __m512i e = _mm512_and_si512(
                    _mm512_maskz_loadu_epi32(k, (const uint32_t *)rows[c] + x),
                    _mm512_set1_epi32(0x7f800000));
                bad |= _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0x7f800000));
            } else {
                const __mmask32 k = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
                const short ex = dtype == FLASHC_F16 ? 0x7c00 : 0x7f80;
                __m512i e = _mm512_and_si512(
                    _mm512_maskz_loadu_epi16(k, (const uint16_t *)rows[c] + x),
                    _mm512_set1_epi16(ex));
                bad |= _mm512_cmpeq_epi16_mask(e, _mm512_set1_epi16(ex));
            }
        }
    return bad != 0;
}

/* The bf16 entries are used only where bf16_supported says the processor has AVX512_BF16. */
const flashc_cpu_kernels flashc_cpu_kernels_avx512 = {
    .name = "avx512",
    .supported = avx512_supported,
    .gemm_panel = avx512_gemm_panel,
    .gemm_acc = avx512_gemm_acc,
    .gemm_tn_acc = avx512_gemm_tn_acc,
    .softmax = avx512_softmax,
    .p_ds = avx512_p_ds_flushed,
    .exp_sum = avx512_exp_sum,
    .gemm_panel16 = avx512_gemm_panel16,
    .gemm_acc16 = avx512_gemm_acc16,
    .round_p16 = avx512_round_p16,
    .store16 = avx512_store16,
    .softmax16 = avx512_softmax16,
    .gemm_panel16_acc = avx512_gemm_panel16_acc,
    .pair_p16 = avx512_pair_p16,
    .bf16_supported = avx512_bf16_supported,
    .decode_qk = avx512_decode_qk,
    .decode_qk16 = avx512_decode_qk16,
    .decode_pv = avx512_decode_pv,
    .decode_pv16 = avx512_decode_pv16,
    .rows_nonfinite = avx512_rows_nonfinite,
};
