/*
 * kernels_avx2.c - AVX2 + FMA (+ F16C) micro-kernels (built with -mavx2 -mfma -mf16c for this
 * file only).
 * The products come from kernels_simd.inc with 6 x 2 register tiles: 12 ymm accumulators,
 * 2 for B and 1 broadcast fit the 16 registers, as in BLIS's Haswell kernels.
 *
 * exp: x is clamped to >= -88, n = round(x log2 e), r = x - n ln2 (two-constant Cody-Waite),
 * e^r by the degree-6 Cephes expf polynomial, 2^n built in the exponent bits. n = -127
 * (x below about -87.68, and -inf) gives exactly 0 rather than a subnormal: an absolute error
 * below 2^-126. Relative error <= 2 ULP of expf over [-87.3, 1] (test_cpu_exp.c measures it).
 *
 * Decode (kernels.h decode_qk / decode_pv): the AVX-512 set's loops at 8 lanes, f16 rows
 * through F16C, bf16 rows widened by a shift; float32 arithmetic throughout.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "flashc.h"

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

/* ---- decode: products straight from the cache rows ---- */

/* Elements [off, off + 8) of a row of dtype dt (a constant after inlining) as float32; only
 * the first `left` (< 8) when the row ends sooner, the other lanes zero, nothing read past
 * the row's end. */
static inline __attribute__((always_inline)) __m256 avx2_row8(const void *row, int64_t off,
                                                             const int dt, int64_t left)
{
    uint32_t buf[8]; /* room for 8 elements of any dtype */
    if (left < 8) {
        const size_t es = dt == FLASHC_F32 ? 4 : 2;
        __builtin_memset(buf, 0, sizeof buf);
        __builtin_memcpy(buf, (const char *)row + off * (int64_t)es, (size_t)left * es);
        row = buf;
        off = 0;
    }
    if (dt == FLASHC_F32)
        return _mm256_loadu_ps((const float *)row + off);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + off));
    if (dt == FLASHC_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The lines of row c of pf (if there is one) into L2 only, as the AVX-512 kernels ask for
 * them (see avx512_prefetch_row). */
static inline void avx2_prefetch_row(const void *const *pf, int npf, int c, int64_t bytes)
{
    if (c < npf)
        for (int64_t at = 0; at < bytes; at += 64)
            _mm_prefetch((const char *)pf[c] + at, _MM_HINT_T1);
}

/* Lane i = the sum of v[i]'s lanes: the transposing add tree of 8 vectors. */
static inline __m256 avx2_sum8(const __m256 *v)
{
    __m256 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_hadd_ps(v[2 * i], v[2 * i + 1]); /* per 128-bit half: pair sums */
    for (int i = 0; i < 2; i++)
        u[i] = _mm256_hadd_ps(t[2 * i], t[2 * i + 1]); /* per half: the 4 partial sums */
    /* u[0] = (s0 s1 s2 s3 | s0' s1' s2' s3') of inputs 0..3, u[1] of 4..7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                         _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

/* 8 keys at a time, converted once into an L1 buffer; each query row takes 8 dot products
 * against them in 8 accumulators, folded by the add tree. */
static inline __attribute__((always_inline)) void
avx2_qk_dt(int m, int n, int64_t d, const float *q, int dp, const void *const *k, const int dt,
           const void *const *pf, int npf, float *s)
{
    const int nch = (int)((d + 7) / 8), ld = nch * 8;
    const int64_t bytes = d * (dt == FLASHC_F32 ? 4 : 2);
    float tmp[8 * FLASHC_MAX_HEAD_DIM] __attribute__((aligned(32)));
    for (int g0 = 0; g0 < n; g0 += 8) {
        const int gn = n - g0 < 8 ? n - g0 : 8;
        for (int c = 0; c < 8; c++) {
            avx2_prefetch_row(pf, npf, g0 + c, bytes);
            for (int ch = 0; ch < nch; ch++)
                _mm256_store_ps(tmp + c * ld + 8 * ch,
                                c < gn ? avx2_row8(k[g0 + c], 8 * ch, dt, d - 8 * ch)
                                       : _mm256_setzero_ps());
        }
        for (int r = 0; r < m; r++) {
            const float *qr = q + (ptrdiff_t)r * dp;
            __m256 acc[8];
            for (int c = 0; c < 8; c++)
                acc[c] = _mm256_setzero_ps();
            for (int ch = 0; ch < nch; ch++) {
                const __m256 qv = _mm256_load_ps(qr + 8 * ch);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++)
                    acc[c] = _mm256_fmadd_ps(qv, _mm256_load_ps(tmp + c * ld + 8 * ch), acc[c]);
            }
            _mm256_storeu_ps(s + r * FLASHC_CPU_BLOCK_N + g0, avx2_sum8(acc));
        }
    }
}

static void avx2_decode_qk(int m, int n, int64_t d, const float *q, int dp,
                           const void *const *k, int dtype, const void *const *pf, int npf,
                           float *s)
{
    if (dtype == FLASHC_F32)
        avx2_qk_dt(m, n, d, q, dp, k, FLASHC_F32, pf, npf, s);
    else if (dtype == FLASHC_F16)
        avx2_qk_dt(m, n, d, q, dp, k, FLASHC_F16, pf, npf, s);
    else
        avx2_qk_dt(m, n, d, q, dp, k, FLASHC_BF16, pf, npf, s);
}

/* rm (constant) rows of O, 8 dims at a time in registers (rm accumulators, the value and a
 * broadcast: at most 10 of the 16 ymm), while the value rows stream past. */
static inline __attribute__((always_inline)) void
avx2_pv_rows(const int rm, int n, int64_t d, const float *p, const void *const *v, const int dt,
             const void *const *pf, int npf, float *o, int dp)
{
    const int nch = (int)((d + 7) / 8);
    const int64_t es = dt == FLASHC_F32 ? 4 : 2, bytes = d * es;
    for (int ch = 0; ch < nch; ch++) {
        const int64_t line = 8 * ch * es;
        const int pfn = pf && (line & 63) < 8 * es && line < bytes ? npf : 0;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++)
            acc[r] = _mm256_load_ps(o + (ptrdiff_t)r * dp + 8 * ch);
        for (int c = 0; c < n; c++) {
            const __m256 vv = avx2_row8(v[c], 8 * ch, dt, d - 8 * ch);
            if (c < pfn)
                _mm_prefetch((const char *)pf[c] + line, _MM_HINT_T1);
#pragma GCC unroll 8
            for (int r = 0; r < rm; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * FLASHC_CPU_BLOCK_N + c), vv,
                                         acc[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < rm; r++)
            _mm256_store_ps(o + (ptrdiff_t)r * dp + 8 * ch, acc[r]);
    }
}

#define AVX2_PV_ROWS(RM)                                                                     \
    static void avx2_pv_##RM(int n, int64_t d, const float *p, const void *const *v,         \
                             int dtype, const void *const *pf, int npf, float *o, int dp)    \
    {                                                                                         \
        if (dtype == FLASHC_F32)                                                              \
            avx2_pv_rows(RM, n, d, p, v, FLASHC_F32, pf, npf, o, dp);                         \
        else if (dtype == FLASHC_F16)                                                         \
            avx2_pv_rows(RM, n, d, p, v, FLASHC_F16, pf, npf, o, dp);                         \
        else                                                                                  \
            avx2_pv_rows(RM, n, d, p, v, FLASHC_BF16, pf, npf, o, dp);                        \
    }
AVX2_PV_ROWS(1)
AVX2_PV_ROWS(2)
AVX2_PV_ROWS(3)
AVX2_PV_ROWS(4)
AVX2_PV_ROWS(5)
AVX2_PV_ROWS(6)
AVX2_PV_ROWS(7)
AVX2_PV_ROWS(8)
typedef void (*avx2_pv_fn)(int, int64_t, const float *, const void *const *, int,
                           const void *const *, int, float *, int);
static const avx2_pv_fn avx2_pv_tiles[9] = {NULL,        avx2_pv_1, avx2_pv_2,
                                            avx2_pv_3,   avx2_pv_4, avx2_pv_5,
                                            avx2_pv_6,   avx2_pv_7, avx2_pv_8};

static void avx2_decode_pv(int m, int n, int64_t d, const float *p, const void *const *v,
                           int dtype, const void *const *pf, int npf, float *o, int dp)
{
    for (int r0 = 0; r0 < m; r0 += 8) {
        const int rm = m - r0 < 8 ? m - r0 : 8;
        avx2_pv_tiles[rm](n, d, p + r0 * FLASHC_CPU_BLOCK_N, v, dtype, r0 ? NULL : pf, npf,
                          o + (ptrdiff_t)r0 * dp, dp);
    }
}

/* 1 if any of the n rows holds a NaN or inf: an exponent of all ones, 32 bytes at a time. */
static int avx2_rows_nonfinite(const void *const *rows, int n, int64_t d, int dtype)
{
    const int64_t es = dtype == FLASHC_F32 ? 4 : 2, bytes = d * es;
    __m256i bad = _mm256_setzero_si256();
    for (int c = 0; c < n; c++) {
        const char *row = rows[c];
        int64_t at = 0;
        for (; at + 32 <= bytes; at += 32) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(row + at));
            if (dtype == FLASHC_F32) {
                const __m256i e = _mm256_set1_epi32(0x7f800000);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(x, e), e));
            } else {
                const __m256i e = _mm256_set1_epi16(dtype == FLASHC_F16 ? 0x7c00 : 0x7f80);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(x, e), e));
            }
        }
        if (at < bytes) { /* the rest of the row, element by element */
            const void *rest[1] = {row + at};
            if (flashc_cpu_kernels_generic.rows_nonfinite(rest, 1, (bytes - at) / es, dtype))
                return 1;
        }
    }
    return !_mm256_testz_si256(bad, bad);
}

static int avx2_supported(void)
{
    const flashc_cpu_features *f = flashc_cpu_get_features();
    return f->avx2 && f->fma && f->f16c;
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
    .decode_qk = avx2_decode_qk,
    .decode_pv = avx2_decode_pv,
    .rows_nonfinite = avx2_rows_nonfinite,
};
