/*
 * kernels_amx.c - AMX-BF16 micro-kernels (built with -mamx-tile -mamx-bf16 and the AVX-512
 * flags for this file only). The two products of the bf16 forward run on tiles: S = Q K^T as
 * 16-row strips of four 16 x 16 float32 C tiles, A = 16 rows x 32 dims of Q, B = 16 dim pairs
 * x 16 keys of the packed K^T; O += P V the same way over 32 keys at a time. The bf16
 * backward's five products use the same two kernels (S, dP, and dV^T, dK^T with an
 * accumulating C; dQ += dS K as O += P V).
 *
 * Float32 inputs: the forward's two products and four of the backward's five (S, so that it
 * matches the forward's, and dQ, dK, dV; dK and dV as transposed C tiles, as in the bf16
 * backward) run on the same tiles with each float32 operand split into three bf16 parts and
 * six part products summed in float32, which keeps float32 accuracy (the bound is derived
 * where the split is defined) at 6 tile products per float32 one: the tiles do 16 times the
 * multiply-adds of AVX-512 FMAs a cycle. Everything else (fp16 inputs, the softmax, the
 * backward's dP, the pairing and rounding of P and dS) is the AVX-512 set's: rounding fp16
 * or fp32 inputs to a single bf16 would break their accuracy bounds.
 *
 * Linux hands out the tile data state only on request: supported() asks once with
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) and reports 0 if it is refused. Each
 * thread loads the tile configuration the first time it runs a tile kernel.
 *
 * Tile kernels read and write whole 16-row strips: the blocked algorithm gives them 64-row
 * buffers, so the rows past m are scratch, computed and never used. The decode's bf16
 * products are on tiles too, in kernels_amx_decode.c (its rows are few and lie beside other
 * heads' rows, so it works through 16-row copies instead).
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
#include "cpu/kernels_amx_internal.h"

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

void flashc_amx_configure(void)
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
    /* the compiler does not see ldtilecfg read the struct: without this it may drop the
     * stores above (it did once the function stopped being inlined) */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
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
    flashc_amx_configure();
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
    flashc_amx_configure();
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

/* ---- float32 on bf16 tiles: each operand split into three bf16 parts ----
 *
 * x = x0 + x1 + x2 with x0 = bf16(x), x1 = bf16(x - x0), x2 = bf16(x - x0 - x1), each rounded
 * to nearest even. x - x0 is exact (x0 is x's leading 8 bits, rounded), so x1 carries the next
 * 8 and x2 the 8 after those: the three parts hold x's 24-bit significand to within 2^-24 |x|
 * (exactly, unless a rounding carries across a binade). With |a1| <= 2^-8 |a| and
 * |a2| <= 2^-16 |a| (and the same for b), the product a b is taken as the six terms
 *   a2 b0 + a1 b1 + a0 b2 + a1 b0 + a0 b1 + a0 b0
 * and the three left out (a1 b2, a2 b1, a2 b2) sum to at most (2^-23 + 2^-32) |a b|: every term
 * kept is exact in float32 (8-bit by 8-bit significands) and tdpbf16ps accumulates them in
 * float32, so a dot product of k terms has the float32 FMA loop's error (k roundings of the
 * running sum, at most 2^-24 relative each) plus at most 2^-23 sum |a_i b_i| from the dropped
 * terms, whose signs vary with the rounding of each part. The small terms go first, so the
 * roundings of their sums are relative to small partial sums. Measured on 64 x 64 blocks of
 * random operands spanning e^+-3 (S, head dims 64-256) the worst error is 3.3-4.2 times
 * 2^-24 sum |a_i b_i|, against 9.6-11.2 for the AVX-512 FMA kernels (P V: 1.8-1.9 against
 * 5.5-6.0): the tiles' float32 accumulation rounds no more often than the FMA loop.
 * Subnormal values and parts are read as zero (the conversion and the tiles flush them): a
 * part is subnormal only where |x| < 2^-110, and then the product a b loses at most
 * 2^-118 |b| in absolute terms (2^-126 |b| for a subnormal a itself), far below the
 * rounding of any score or output those terms enter, unless every term is that small (and
 * such a score is near zero either way).
 *
 * Layout: the parts are stored tile by tile, each 16 x 32 bf16 tile (1 KiB) contiguous, so
 * that every tile load reads 16 consecutive cache lines. Rows of Q laid out as rows16 (a tile
 * row of 64 bytes every 2 dp bytes) and K^T as panel16 (every 256 bytes) spread each load
 * over lines shared with other tiles, and the products ran at 40% of the tiles' rate once
 * the operands outgrew L1 (head dim 128); contiguous tiles stream from L2 at nearly the full
 * rate. Part i of a buffer is 64 dp elements after part i - 1 (kernels.h), and within a part:
 *   rows3  (Q, A of S):     tile (strip r/16, dims c/32) at (r/16 * dp/32 + c/32) * 512,
 *                           element (r%16) * 32 + c%32
 *   panel3 (K^T, B of S):   tile (keys k/16, dims d/32) at (k/16 * dp/32 + d/32) * 512,
 *                           element (d%32)/2 * 32 + (k%16) * 2 + d%2
 *   vpair3 (V, B of P V):   tile (dims c/16, keys k/32) at (c/16 * 2 + k/32) * 512,
 *                           element (k%32)/2 * 32 + (c%16) * 2 + k%2
 *   P's parts (A of P V):   tile (strip r/16, keys k/32) at (r/16 * 2 + k/32) * 512,
 *                           element (r%16) * 32 + k%32
 * and for the backward's reductions over queries, dV^T += dO^T P and dK^T += Q^T dS (C kept
 * transposed, [dp][64], so that queries lie along A's rows, as in the bf16 backward):
 *   rowsT3 (Q^T, dO^T, A):  tile (dims d/16, queries r/32) at (d/16 * 2 + r/32) * 512,
 *                           element (d%16) * 32 + r%32
 *   qpair3 (P, dS, B):      tile (keys k/16, queries r/32) at (k/16 * 2 + r/32) * 512,
 *                           element (r%32)/2 * 32 + (k%16) * 2 + r%2
 */

enum { TILE = 512 }; /* bf16 elements of one 16 x 32 tile */

/* The six products, small first: part of A, part of B. */
static const int x3_terms[6][2] = {{2, 0}, {1, 1}, {0, 2}, {1, 0}, {0, 1}, {0, 0}};

static inline __attribute__((always_inline)) __m512 bf16_widen(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) __m256i bf16_round(__m512 x)
{
    return (__m256i)_mm512_cvtneps_pbh(x);
}

/* 16 floats into three bf16 parts, for P: finite values far from overflow (or NaN, which
 * then leaves x1 and x2 NaN, the row being NaN already). */
static inline __attribute__((always_inline)) void split3_fast(__m512 x, __m256i *h0, __m256i *h1,
                                                              __m256i *h2)
{
    *h0 = bf16_round(x);
    const __m512 d = _mm512_sub_ps(x, bf16_widen(*h0));
    *h1 = bf16_round(d);
    *h2 = bf16_round(_mm512_sub_ps(d, bf16_widen(*h1)));
}

/* The same for any input (Q, K and V as packed): where |x| >= 2^127 the leading part is x
 * truncated rather than rounded, so that a finite value near FLT_MAX does not round to inf
 * (x0 + x1 + x2 stays x, x1 then up to 2^-7 |x|); inf and NaN give (x, 0, 0). Non-finite Q
 * or K never reach the products (the forward routes those blocks through the float32
 * kernels: 0 * inf among the part products would give NaN where float32 gives inf), and
 * non-finite V rows take the sparse product; the parts are only kept well defined. */
static inline __attribute__((always_inline)) void split3_safe(__m512 x, __m256i *h0, __m256i *h1,
                                                              __m256i *h2)
{
    const __m512i xi = _mm512_castps_si512(x);
    const __m512i expo = _mm512_and_si512(xi, _mm512_set1_epi32(0x7f800000));
    const __mmask16 big = _mm512_cmpge_epi32_mask(expo, _mm512_set1_epi32(0x7f000000));
    const __mmask16 bad = _mm512_cmpeq_epi32_mask(expo, _mm512_set1_epi32(0x7f800000));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i x0i = _mm512_castps_si512(bf16_widen(bf16_round(x)));
    x0i = _mm512_mask_and_epi32(x0i, big, xi, _mm512_set1_epi32((int)0xffff0000u));
    x0i = _mm512_mask_mov_epi32(x0i, nan, _mm512_set1_epi32(0x7fc00000));
    *h0 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(x0i, 16));
    const __m512 d = _mm512_maskz_sub_ps((__mmask16)~bad, x, _mm512_castsi512_ps(x0i));
    *h1 = bf16_round(d);
    *h2 = bf16_round(_mm512_sub_ps(d, bf16_widen(*h1)));
}

static inline __attribute__((always_inline)) void store3(uint16_t *o, ptrdiff_t part, __m256i h0,
                                                         __m256i h1, __m256i h2)
{
    _mm256_store_si256((__m256i *)o, h0);
    _mm256_store_si256((__m256i *)(o + part), h1);
    _mm256_store_si256((__m256i *)(o + 2 * part), h2);
}

/* Two sets of 16 values, lo and hi, interleaved as 16 bf16 pairs (lo in the low half): one
 * 64-byte tile row, for each part. */
static inline __attribute__((always_inline)) void store3_pairs(uint16_t *o, ptrdiff_t part,
                                                               const __m256i lo[3],
                                                               const __m256i hi[3])
{
    for (int i = 0; i < 3; i++) {
        const __m512i l = _mm512_cvtepu16_epi32(lo[i]), h = _mm512_cvtepu16_epi32(hi[i]);
        _mm512_store_si512((void *)(o + i * part), _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
    }
}

/* rows3 from float rows src[m][dp]; rows m up to the strip's end are left as they are (the
 * tile kernels' scratch rows). */
static void amx_split3_rows(uint16_t *dst, const float *src, int m, int dp)
{
    const ptrdiff_t part = (ptrdiff_t)FLASHC_CPU_BLOCK_M * dp;
    for (int r = 0; r < m; r++)
        for (int c = 0; c < dp; c += 16) {
            __m256i h0, h1, h2;
            split3_safe(_mm512_load_ps(src + (ptrdiff_t)r * dp + c), &h0, &h1, &h2);
            store3(dst + ((r / 16) * (dp / 32) + c / 32) * TILE + (r % 16) * 32 + c % 32, part,
                   h0, h1, h2);
        }
}

/* panel3 from the float panel [dp][64] (K^T); 1 if it holds a NaN or inf. */
static int amx_split3_panel(uint16_t *dst, const float *panel, int dp)
{
    const ptrdiff_t part = (ptrdiff_t)FLASHC_CPU_BLOCK_N * dp;
    const __m512i expo = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (int d = 0; d < dp; d += 2)
        for (int k = 0; k < FLASHC_CPU_BLOCK_N; k += 16) {
            __m256i a[3], b[3];
            const __m512 x = _mm512_load_ps(panel + d * FLASHC_CPU_BLOCK_N + k);
            const __m512 y = _mm512_load_ps(panel + (d + 1) * FLASHC_CPU_BLOCK_N + k);
            bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), expo), expo) |
                   _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(y), expo), expo);
            split3_safe(x, &a[0], &a[1], &a[2]);
            split3_safe(y, &b[0], &b[1], &b[2]);
            store3_pairs(dst + ((k / 16) * (dp / 32) + d / 32) * TILE + (d % 32) / 2 * 32, part, a,
                         b);
        }
    return bad != 0;
}

/* vpair3 from float rows [64][dp] of V (zero past the block's keys). */
static void amx_split3_vpair(uint16_t *dst, const float *rows, int dp)
{
    const ptrdiff_t part = (ptrdiff_t)FLASHC_CPU_BLOCK_N * dp;
    for (int k = 0; k < FLASHC_CPU_BLOCK_N; k += 2)
        for (int c = 0; c < dp; c += 16) {
            __m256i a[3], b[3];
            split3_safe(_mm512_load_ps(rows + (ptrdiff_t)k * dp + c), &a[0], &a[1], &a[2]);
            split3_safe(_mm512_load_ps(rows + (ptrdiff_t)(k + 1) * dp + c), &b[0], &b[1], &b[2]);
            store3_pairs(dst + ((c / 16) * 2 + k / 32) * TILE + (k % 32) / 2 * 32, part, a, b);
        }
}

/* C tiles 0-3 (rows of strips s and s + 1, columns of groups g and g + 1: tile (i, j) at
 * c + (s + i) 16 ldc + (g + j) 16) (+)= sum over the six terms and nk steps of
 * A(strip, step) B(group, step), A's tile (strip, step) at a + (strip * astrips + step) TILE
 * and B's (group, step) at b + (group * bgroups + step) TILE, the parts of A apart apart
 * and those of B bpart. two_strips = 0 (a constant where it is inlined) does strip s alone:
 * tiles 0 and 1, for a last odd strip. */
static inline __attribute__((always_inline)) void
amx_x3_tiles(int s, int g, int nk, const uint16_t *a, int astrips, const uint16_t *b, int bgroups,
             ptrdiff_t apart, ptrdiff_t bpart, float *c, int ldc, const int accumulate,
             const int two_strips)
{
    const size_t cstride = (size_t)ldc * sizeof(float);
    float *c0 = c + (ptrdiff_t)s * 16 * ldc + g * 16, *c1 = c0 + (ptrdiff_t)16 * ldc;
    if (two_strips) {
        amx_c_load(c0, c0 + 16, c1, c1 + 16, cstride, accumulate);
    } else if (accumulate) {
        _tile_loadd(0, c0, cstride);
        _tile_loadd(1, c0 + 16, cstride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
    }
    for (int t = 0; t < 6; t++) {
        const uint16_t *a0 = a + x3_terms[t][0] * apart + (ptrdiff_t)s * astrips * TILE;
        const uint16_t *a1 = a0 + (ptrdiff_t)astrips * TILE;
        const uint16_t *b0 = b + x3_terms[t][1] * bpart + (ptrdiff_t)g * bgroups * TILE;
        const uint16_t *b1 = b0 + (ptrdiff_t)bgroups * TILE;
        for (int p = 0; p < nk; p++) {
            _tile_loadd(4, a0 + p * TILE, 64);
            _tile_loadd(6, b0 + p * TILE, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, b1 + p * TILE, 64);
            _tile_dpbf16ps(1, 4, 7);
            if (two_strips) {
                _tile_loadd(5, a1 + p * TILE, 64);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
    }
    if (two_strips) {
        amx_c_store(c0, c0 + 16, c1, c1 + 16, cstride);
    } else {
        _tile_stored(0, c0, cstride);
        _tile_stored(1, c0 + 16, cstride);
    }
}

/* S[64-row buffer][64] = Q K^T from rows3 and panel3, over all dp dims (both zero past the
 * head dim): strips in pairs, a last odd one alone. */
static void amx_gemm_panel3(int m, int dp, const uint16_t *a3, const uint16_t *panel3, float *c)
{
    flashc_amx_configure();
    const ptrdiff_t part = (ptrdiff_t)FLASHC_CPU_BLOCK_N * dp;
    const int nk = dp / 32, strips = (m + 15) / 16;
    int s = 0;
    for (; s + 1 < strips; s += 2)
        for (int g = 0; g < 4; g += 2)
            amx_x3_tiles(s, g, nk, a3, nk, panel3, nk, part, part, c, FLASHC_CPU_BLOCK_N, 0, 1);
    if (s < strips)
        for (int g = 0; g < 4; g += 2)
            amx_x3_tiles(s, g, nk, a3, nk, panel3, nk, part, part, c, FLASHC_CPU_BLOCK_N, 0, 0);
}

/* P's parts: p3 (tile order, see above) from P[m][0:n] (row stride 64), zero at rows m up
 * to the strip's end and columns n up to the next 32. */
static void amx_split3_p(uint16_t *p3, const float *p, int m, int n)
{
    const int strips = (m + 15) / 16, nk = (n + 31) / 32;
    const ptrdiff_t ppart = FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    __mmask16 keep[4];
    for (int v = 0; v < 4; v++) {
        const int left = n - 16 * v;
        keep[v] = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    for (int r = 0; r < strips * 16; r++) {
        const float *pr = p + r * FLASHC_CPU_BLOCK_N;
        const int live = r < m;
        for (int v = 0; v < nk * 2; v++) {
            __m256i h0, h1, h2;
            split3_fast(_mm512_maskz_load_ps(live ? keep[v] : 0, pr + 16 * v), &h0, &h1, &h2);
            store3(p3 + ((r / 16) * 2 + v / 2) * TILE + (r % 16) * 32 + (v % 2) * 16, ppart, h0,
                   h1, h2);
        }
    }
}

/* P's parts for gemm_acc3, per thread. */
static __thread uint16_t p3_buf[3 * FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N]
    __attribute__((aligned(64)));

/* O[64-row buffer][dp] += P[m][0:n] V: P (float, row stride 64) split here, rows m up to the
 * strip's end and columns n up to the next 32 as zero; V from vpair3 (zero past the block's
 * keys). */
static void amx_gemm_acc3(int m, int n, int dp, const float *p, const uint16_t *vpair3,
                          float *c)
{
    flashc_amx_configure();
    const int strips = (m + 15) / 16, nk = (n + 31) / 32;
    const ptrdiff_t ppart = FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    amx_split3_p(p3_buf, p, m, n);
    const ptrdiff_t vpart = (ptrdiff_t)FLASHC_CPU_BLOCK_N * dp;
    const int groups = dp / 16;
    int s = 0;
    for (; s + 1 < strips; s += 2)
        for (int g = 0; g < groups; g += 2)
            amx_x3_tiles(s, g, nk, p3_buf, 2, vpair3, 2, ppart, vpart, c, dp, 1, 1);
    if (s < strips)
        for (int g = 0; g < groups; g += 2)
            amx_x3_tiles(s, g, nk, p3_buf, 2, vpair3, 2, ppart, vpart, c, dp, 1, 0);
}

/* rowsT3 from float rows src[m][dp] (Q or dO of a query block), transposed: dims along the
 * tile rows, queries along the columns, zero at queries m..64. Once per query block, so a
 * gather per 16 queries of a dim is cheap enough. */
static void amx_split3_rowsT(uint16_t *dst, const float *src, int m, int dp)
{
    const ptrdiff_t part = (ptrdiff_t)FLASHC_CPU_BLOCK_M * dp;
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(dp));
    for (int r = 0; r < FLASHC_CPU_BLOCK_M; r += 16) {
        const int left = m - r;
        const __mmask16 live = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        for (int d = 0; d < dp; d++) {
            __m256i h0, h1, h2;
            const __m512 x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx,
                                                      src + (ptrdiff_t)r * dp + d, 4);
            split3_safe(x, &h0, &h1, &h2);
            store3(dst + ((d / 16) * 2 + r / 32) * TILE + (d % 16) * 32 + r % 32, part, h0, h1,
                   h2);
        }
    }
}

/* qpair3 from a score block (P or dS) [m][0:n] (row stride 64), split as P is for P V:
 * zero at rows m up to the next 32 and columns n..64. */
static void amx_split3_qpair(uint16_t *dst, const float *p, int m, int n)
{
    const ptrdiff_t part = FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    const int rows = (m + 31) / 32 * 32;
    __mmask16 keep[4];
    for (int v = 0; v < 4; v++) {
        const int left = n - 16 * v;
        keep[v] = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    for (int r = 0; r < rows; r += 2) {
        const float *p0 = p + r * FLASHC_CPU_BLOCK_N, *p1 = p0 + FLASHC_CPU_BLOCK_N;
        for (int v = 0; v < 4; v++) {
            __m256i a[3], b[3];
            split3_fast(_mm512_maskz_load_ps(r < m ? keep[v] : 0, p0 + 16 * v), &a[0], &a[1],
                        &a[2]);
            split3_fast(_mm512_maskz_load_ps(r + 1 < m ? keep[v] : 0, p1 + 16 * v), &b[0], &b[1],
                        &b[2]);
            store3_pairs(dst + (v * 2 + r / 32) * TILE + (r % 32) / 2 * 32, part, a, b);
        }
    }
}

/* C^T[dp][64] += A^T[dp][0:m] B[0:m][64]: A from rowsT3, B from qpair3, both zero past
 * query m up to the next 32. */
static void amx_gemm_tn_acc3(int m, int dp, const uint16_t *at3, const uint16_t *b3, float *ct)
{
    flashc_amx_configure();
    const int nk = (m + 31) / 32;
    const ptrdiff_t apart = (ptrdiff_t)FLASHC_CPU_BLOCK_M * dp;
    const ptrdiff_t bpart = FLASHC_CPU_BLOCK_M * FLASHC_CPU_BLOCK_N;
    for (int s = 0; s < dp / 16; s += 2)
        for (int g = 0; g < 4; g += 2)
            amx_x3_tiles(s, g, nk, at3, 2, b3, 2, apart, bpart, ct, FLASHC_CPU_BLOCK_N, 1, 1);
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

static void amx_decode_pv(int m, int n, int64_t d, const float *p, const void *const *v,
                          int dtype, const void *const *pf, int npf, float *o, int dp)
{
    flashc_cpu_kernels_avx512.decode_pv(m, n, d, p, v, dtype, pf, npf, o, dp);
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
    .x3_supported = amx_supported,
    .split3_rows = amx_split3_rows,
    .split3_panel = amx_split3_panel,
    .split3_vpair = amx_split3_vpair,
    .gemm_panel3 = amx_gemm_panel3,
    .gemm_acc3 = amx_gemm_acc3,
    .split3_rowsT = amx_split3_rowsT,
    .split3_qpair = amx_split3_qpair,
    .gemm_tn_acc3 = amx_gemm_tn_acc3,
    .decode_qk = amx_decode_qk,
    .decode_qk16 = flashc_amx_decode_qk16,
    .decode_pv = amx_decode_pv,
    .decode_pv16 = flashc_amx_decode_pv16,
    .rows_nonfinite = amx_rows_nonfinite,
};
