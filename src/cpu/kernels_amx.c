/*
 * kernels_amx.c - AMX-BF16 micro-kernels for bf16 attention (built with -mamx-tile
 * -mamx-bf16 and the AVX-512 flags for this file only). The two products of the forward run
 * on tiles: S = Q K^T as 16-row strips of four 16 x 16 float32 C tiles, A = 16 rows x 32
 * dims of Q, B = 16 dim pairs x 16 keys of the packed K^T; O += P V the same way over 32
 * keys at a time. The backward's five products use the same two kernels (S, dP, and dV^T,
 * dK^T with an accumulating C; dQ += dS K as O += P V). Everything else (float32 and fp16
 * inputs, the softmax, the pairing and rounding of P and dS) is the AVX-512 set's:
 * AMX-BF16 multiplies bf16 only, and rounding fp16 or fp32 inputs to bf16
 * would break their accuracy bounds.
 *
 * Linux hands out the tile data state only on request: supported() asks once with
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) and reports 0 if it is refused. Each
 * thread loads the tile configuration the first time it runs a tile kernel.
 *
 * Tile kernels read and write whole 16-row strips: the blocked algorithm gives them 64-row
 * buffers, so the rows past m are scratch, computed and never used.
 */
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_permitted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_request(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    amx_permitted = 0;
#endif
}

static int amx_supported(void)
{
    const flashc_cpu_features *f = flashc_cpu_get_features();
    if (!(f->amx_tile && f->amx_bf16 && f->avx512f && f->avx512bw && f->avx512vl &&
          f->avx512bf16 && f->fma))
        return 0;
    pthread_once(&amx_once, amx_request);
    return amx_permitted;
}

/* Palette 1: tiles 0-3 are C (16 x 16 float32); 4-7 hold A and B (16 rows x 64 bytes):
 * 4 is A and 5, 6 are B for one strip, or 4, 5 are A and 6, 7 are B for a pair of strips. */
typedef struct __attribute__((packed)) amx_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

static __thread int amx_configured;

static void amx_configure(void)
{
    if (amx_configured)
        return;
    amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    amx_configured = 1;
}

/* C tiles 0-3 from four places of row stride stride (or zero where not accumulating), and
 * back. */
static inline __attribute__((always_inline)) void
amx_c_load(float *c0, float *c1, float *c2, float *c3, size_t stride, const int accumulate)
{
    if (accumulate) {
        _tile_loadd(0, c0, stride);
        _tile_loadd(1, c1, stride);
        _tile_loadd(2, c2, stride);
        _tile_loadd(3, c3, stride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
}

static inline __attribute__((always_inline)) void amx_c_store(float *c0, float *c1, float *c2,
                                                              float *c3, size_t stride)
{
    _tile_stored(0, c0, stride);
    _tile_stored(1, c1, stride);
    _tile_stored(2, c2, stride);
    _tile_stored(3, c3, stride);
}

/* Rows r0.. and r0 + 16.. of C, keys from kp (32 of them), (+)= A16 * panel16 over k: a 2 x 2
 * block of C tiles, each A and B tile loaded serving two products. */
static inline __attribute__((always_inline)) void
amx_panel16_pair(int r0, int kp, int k, const uint16_t *a, ptrdiff_t lda,
                 const uint16_t *panel16, float *c, const int accumulate)
{
    const size_t bstride = FLASHC_CPU_BLOCK_N * 2 * sizeof(uint16_t); /* one dim pair */
    const size_t cstride = FLASHC_CPU_BLOCK_N * sizeof(float);
    const size_t astride = (size_t)lda * sizeof(uint16_t);
    float *c0 = c + r0 * FLASHC_CPU_BLOCK_N + kp, *c1 = c0 + 16 * FLASHC_CPU_BLOCK_N;
    amx_c_load(c0, c0 + 16, c1, c1 + 16, cstride, accumulate);
    for (int p = 0; p < k; p += 32) {
        const uint16_t *bp = panel16 + (ptrdiff_t)p * FLASHC_CPU_BLOCK_N + kp * 2;
        _tile_loadd(4, a + r0 * lda + p, astride);
        _tile_loadd(6, bp, bstride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bp + 32, bstride);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + (r0 + 16) * lda + p, astride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    amx_c_store(c0, c0 + 16, c1, c1 + 16, cstride);
}

/* C[16-row strips][64] (+)= A16 * panel16 over k rounded up to 32 (the callers zero A16's
 * columns and panel16's rows up to there). The forward's S = Q K^T (k = dp) and the
 * backward's S, dP (overwriting) and dV^T, dK^T (accumulating, k = the block's queries). */
static inline __attribute__((always_inline)) void
amx_panel16(int m, int k, const uint16_t *a, ptrdiff_t lda, const uint16_t *panel16, float *c,
            const int accumulate)
{
    amx_configure();
    const size_t bstride = FLASHC_CPU_BLOCK_N * 2 * sizeof(uint16_t); /* one dim pair */
    const size_t cstride = FLASHC_CPU_BLOCK_N * sizeof(float);
    int r0 = 0;
    for (; r0 + 16 < m; r0 += 32) { /* strips in pairs */
        amx_panel16_pair(r0, 0, k, a, lda, panel16, c, accumulate);
        amx_panel16_pair(r0, 32, k, a, lda, panel16, c, accumulate);
    }
    for (; r0 < m; r0 += 16) { /* a last odd strip */
        float *cr = c + r0 * FLASHC_CPU_BLOCK_N;
        amx_c_load(cr, cr + 16, cr + 32, cr + 48, cstride, accumulate);
        for (int p = 0; p < k; p += 32) {
            const uint16_t *bp = panel16 + (ptrdiff_t)p * FLASHC_CPU_BLOCK_N;
            _tile_loadd(4, a + r0 * lda + p, lda * (ptrdiff_t)sizeof(uint16_t));
            _tile_loadd(5, bp + 0 * 32, bstride);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, bp + 1 * 32, bstride);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, bp + 2 * 32, bstride);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(6, bp + 3 * 32, bstride);
            _tile_dpbf16ps(3, 4, 6);
        }
        amx_c_store(cr, cr + 16, cr + 32, cr + 48, cstride);
    }
}

/* S[64-row buffer][64] = A16 * panel16, in strips of 16 rows; k a multiple of 32. */
static void amx_gemm_panel16(int m, int k, const uint16_t *a, ptrdiff_t lda,
                             const uint16_t *panel16, float *c)
{
    amx_panel16(m, k, a, lda, panel16, c, 0);
}

/* dV^T, dK^T [dp][64] += (dO^T or Q^T)[dp][64] * pair(P or dS): m = dp is a multiple of 32,
 * so the strips are exact; the queries past the block are zero in both operands. */
static void amx_gemm_panel16_acc(int m, int k, const uint16_t *a, ptrdiff_t lda,
                                 const uint16_t *panel16, float *c)
{
    amx_panel16(m, k, a, lda, panel16, c, 1);
}

/* One 16-row strip of O, tiles columns c0.. (nt = 4 or 2 of them), += P16 * vpair16 over
 * whole 32-key steps: the C tiles stay loaded over all n keys of the step, which may span
 * several [64][64] blocks of P16 (and as many consecutive blocks of vpair16). */
static inline __attribute__((always_inline)) void
amx_acc16_strip(const int nt, int n, int dp, const uint16_t *ar, const uint16_t *vpair16,
                int c0, float *cr)
{
    const size_t astride = FLASHC_CPU_BLOCK_N * sizeof(uint16_t);
    const size_t bstride = (size_t)dp * 2 * sizeof(uint16_t); /* one key pair */
    const size_t cstride = (size_t)dp * sizeof(float);
    _tile_loadd(0, cr + c0 + 0, cstride);
    _tile_loadd(1, cr + c0 + 16, cstride);
    if (nt == 4) {
        _tile_loadd(2, cr + c0 + 32, cstride);
        _tile_loadd(3, cr + c0 + 48, cstride);
    }
    for (int kb = 0; kb < n; kb += 32) {
        const uint16_t *bp = vpair16 + (ptrdiff_t)(kb / 2) * dp * 2 + c0 * 2;
        _tile_loadd(4, ar + (kb / FLASHC_CPU_BLOCK_N) * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N +
                           kb % FLASHC_CPU_BLOCK_N,
                    astride);
        _tile_loadd(5, bp + 0 * 32, bstride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, bp + 1 * 32, bstride);
        _tile_dpbf16ps(1, 4, 6);
        if (nt == 4) {
            _tile_loadd(5, bp + 2 * 32, bstride);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(6, bp + 3 * 32, bstride);
            _tile_dpbf16ps(3, 4, 6);
        }
    }
    _tile_stored(0, cr + c0 + 0, cstride);
    _tile_stored(1, cr + c0 + 16, cstride);
    if (nt == 4) {
        _tile_stored(2, cr + c0 + 32, cstride);
        _tile_stored(3, cr + c0 + 48, cstride);
    }
}

/* Two 16-row strips of O (rows r0.. and r0 + 16..) times 32 columns from c0, += P16 * vpair16
 * over whole 32-key steps: a 2 x 2 block of C tiles, so each A tile (P16) and each B tile
 * (V) loaded serves two products, and V is read once for two strips, where one strip at a
 * time read the step's whole V (64 KiB at head dim 128, more than L1) for each strip. */
static void amx_acc16_pair(int n, int dp, const uint16_t *ar, const uint16_t *vpair16, int c0,
                           float *cr)
{
    const size_t astride = FLASHC_CPU_BLOCK_N * sizeof(uint16_t);
    const size_t bstride = (size_t)dp * 2 * sizeof(uint16_t); /* one key pair */
    const size_t cstride = (size_t)dp * sizeof(float);
    const ptrdiff_t a16 = 16 * FLASHC_CPU_BLOCK_N; /* the second strip of P16 */
    float *cr16 = cr + 16 * (ptrdiff_t)dp;         /* and of O */
    amx_c_load(cr + c0, cr + c0 + 16, cr16 + c0, cr16 + c0 + 16, cstride, 1);
    for (int kb = 0; kb < n; kb += 32) {
        const uint16_t *ak = ar + (kb / FLASHC_CPU_BLOCK_N) * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N +
                             kb % FLASHC_CPU_BLOCK_N;
        const uint16_t *bp = vpair16 + (ptrdiff_t)(kb / 2) * dp * 2 + c0 * 2;
        _tile_loadd(4, ak, astride);
        _tile_loadd(6, bp, bstride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bp + 32, bstride);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, ak + a16, astride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    amx_c_store(cr + c0, cr + c0 + 16, cr16 + c0, cr16 + c0 + 16, cstride);
}

/* O[64-row buffer][dp] += P16 * vpair16 (P16 is 0 past n): strips in pairs, a last odd one
 * alone. */
static void amx_gemm_acc16(int m, int n, int dp, const uint16_t *p16, const uint16_t *vpair16,
                           float *c)
{
    amx_configure();
    int r0 = 0;
    for (; r0 + 16 < m; r0 += 32) {
        const uint16_t *ar = p16 + r0 * FLASHC_CPU_BLOCK_N;
        float *cr = c + (ptrdiff_t)r0 * dp;
        for (int c0 = 0; c0 < dp; c0 += 32)
            amx_acc16_pair(n, dp, ar, vpair16, c0, cr);
    }
    if (r0 < m) {
        const uint16_t *ar = p16 + r0 * FLASHC_CPU_BLOCK_N;
        float *cr = c + (ptrdiff_t)r0 * dp;
        int c0 = 0;
        for (; c0 + 64 <= dp; c0 += 64)
            amx_acc16_strip(4, n, dp, ar, vpair16, c0, cr);
        if (c0 < dp) /* dp is a multiple of 32: one group of two tiles left */
            amx_acc16_strip(2, n, dp, ar, vpair16, c0, cr);
    }
}

/* The rest is the AVX-512 set's, called through its table. */
static void amx_gemm_panel(int m, int k, const float *a, ptrdiff_t lda, const float *panel,
                           float *c)
{
    flashc_cpu_kernels_avx512.gemm_panel(m, k, a, lda, panel, c);
}

static void amx_gemm_acc(int m, int n, int dp, const float *a, const float *b, float *c)
{
    flashc_cpu_kernels_avx512.gemm_acc(m, n, dp, a, b, c);
}

static void amx_gemm_tn_acc(int n, int m, int dp, const float *a, const float *b, float *c)
{
    flashc_cpu_kernels_avx512.gemm_tn_acc(n, m, dp, a, b, c);
}

static void amx_softmax(float *s, int m, int n, const int *ncols, float scale, float *row_max,
                        float *row_sum, float *o, int dp)
{
    flashc_cpu_kernels_avx512.softmax(s, m, n, ncols, scale, row_max, row_sum, o, dp);
}

static void amx_p_ds(float *s, float *dp, int m, int n, const int *ncols, float scale,
                     const float *lse, const float *delta)
{
    flashc_cpu_kernels_avx512.p_ds(s, dp, m, n, ncols, scale, lse, delta);
}

static float amx_exp_sum(float *x, int n, float sub)
{
    return flashc_cpu_kernels_avx512.exp_sum(x, n, sub);
}

static void amx_round_p16(uint16_t *dst, const float *src, int m, int n)
{
    flashc_cpu_kernels_avx512.round_p16(dst, src, m, n);
}

static void amx_store16(uint16_t *dst, const float *src, int64_t n, float scale)
{
    flashc_cpu_kernels_avx512.store16(dst, src, n, scale);
}

static void amx_softmax16(float *s, int m, int n, const int *ncols, float scale,
                          float *row_max, float *row_sum, float *o, int dp, uint16_t *p16)
{
    flashc_cpu_kernels_avx512.softmax16(s, m, n, ncols, scale, row_max, row_sum, o, dp, p16);
}

static void amx_pair_p16(uint16_t *dst, const float *src, int m, int n)
{
    flashc_cpu_kernels_avx512.pair_p16(dst, src, m, n);
}

static void amx_decode_qk(int m, int n, int64_t d, const float *q, int dp, const void *const *k,
                          int dtype, const void *const *pf, int npf, float *s)
{
    flashc_cpu_kernels_avx512.decode_qk(m, n, d, q, dp, k, dtype, pf, npf, s);
}

static void amx_decode_qk16(int m, int n, int64_t d, const uint16_t *q16, int dp,
                            const void *const *k, float scale, const void *const *pf, int npf,
                            float *s)
{
    flashc_cpu_kernels_avx512.decode_qk16(m, n, d, q16, dp, k, scale, pf, npf, s);
}

static void amx_decode_pv(int m, int n, int64_t d, const float *p, const void *const *v,
                          int dtype, const void *const *pf, int npf, float *o, int dp)
{
    flashc_cpu_kernels_avx512.decode_pv(m, n, d, p, v, dtype, pf, npf, o, dp);
}

static void amx_decode_pv16(int m, int n, int64_t d, const uint16_t *p16, const void *const *v,
                            const void *const *pf, int npf, float *o, int dp)
{
    flashc_cpu_kernels_avx512.decode_pv16(m, n, d, p16, v, pf, npf, o, dp);
}

static int amx_rows_nonfinite(const void *const *rows, int n, int64_t d, int dtype)
{
    return flashc_cpu_kernels_avx512.rows_nonfinite(rows, n, d, dtype);
}

const flashc_cpu_kernels flashc_cpu_kernels_amx = {
    .name = "amx",
    .supported = amx_supported,
    .gemm_panel = amx_gemm_panel,
    .gemm_acc = amx_gemm_acc,
    .gemm_tn_acc = amx_gemm_tn_acc,
    .softmax = amx_softmax,
    .p_ds = amx_p_ds,
    .exp_sum = amx_exp_sum,
    .gemm_panel16 = amx_gemm_panel16,
    .gemm_acc16 = amx_gemm_acc16,
    .round_p16 = amx_round_p16,
    .store16 = amx_store16,
    .softmax16 = amx_softmax16,
    .gemm_panel16_acc = amx_gemm_panel16_acc,
    .pair_p16 = amx_pair_p16,
    .bf16_supported = amx_supported,
    .decode_qk = amx_decode_qk,
    .decode_qk16 = amx_decode_qk16,
    .decode_pv = amx_decode_pv,
    .decode_pv16 = amx_decode_pv16,
    .rows_nonfinite = amx_rows_nonfinite,
};
