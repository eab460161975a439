/*
 * kernels_amx_decode.c - the decode's two products for bf16 caches (kernels.h: decode_qk16,
 * decode_pv16) on AMX tiles. fp16 and fp32 caches take the AVX-512 kernels (kernels_amx.c).
 * Built with the AMX set's flags (sources.cmake).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu/kernels_amx_internal.h"

/* ---- decode, bf16 caches: both products on tiles, straight from the cache rows ----
 *
 * A decode block is up to 64 keys against the few rows (query, head of a GQA group) of one
 * kv head: on AVX512_BF16 dot products the instructions per key, not memory, bound it. On
 * tiles S^T = K Q^T takes the key rows as A tiles where they lie (16 keys x 32 dims, the row
 * stride of the cache: contiguous, or within a page) against Q^T as the B tile, and O += P V
 * takes P as A against V rows interleaved by key pairs (B). The rows of a task's Q, P and O
 * are few (8 for GQA 8:1 and one query) and lie beside other heads' rows in the caller's
 * buffers, so the tiles read and write them through 16-row copies whose extra rows are zero:
 * a tile row never reaches another head's rows, and an inf in V only ever meets those zeros
 * in rows that are thrown away. */

enum { DEC_MAX_STEPS = FLASHC_MAX_HEAD_DIM / 32 };

/* The lines of the rows the caller reads next, asked for into L2 a few at a time between the
 * tile products: memory stays busy while the tiles work, where one burst of requests would
 * stall on the core's few line-fill buffers and leave memory idle for the rest of the call
 * (docs/PERF.md has the placements measured). */
typedef struct amx_prefetcher {
    const void *const *rows;
    int n, row;
    int64_t bytes, at;
} amx_prefetcher;

static inline void amx_prefetch_some(amx_prefetcher *p, int lines)
{
    for (; lines > 0 && p->row < p->n; lines--) {
        _mm_prefetch((const char *)p->rows[p->row] + p->at, _MM_HINT_T1);
        p->at += 64;
        if (p->at >= p->bytes) {
            p->at = 0;
            p->row++;
        }
    }
}

/* One tile product of the decode: tile t loaded from (ptr, stride), then C tile c += a b (t
 * is a or b), then a few of the prefetcher's lines. Tile numbers are immediates, hence a
 * macro. */
#define AMX_LOAD_PRODUCT(c, a, b, t, ptr, stride, pfc)                                           \
    do {                                                                                       \
        _tile_loadd(t, ptr, stride);                                                           \
        _tile_dpbf16ps(c, a, b);                                                               \
        amx_prefetch_some(pfc, 4);                                                             \
    } while (0)

/* Rows j < mr of S from the C tiles of `groups` key groups holding S^T (st[g][key][row]):
 * s[j][16 g + key] = scale S^T; a gather down each column, a few prefetches after each. */
static void amx_decode_s_rows(float st[4][256], int groups, float scale, float *s, int mr,
                              amx_prefetcher *pfc)
{
    const __m512i down = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(16));
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int j = 0; j < mr; j++)
        for (int g = 0; g < groups; g++, amx_prefetch_some(pfc, 2))
            _mm512_storeu_ps(s + (ptrdiff_t)j * FLASHC_CPU_BLOCK_N + 16 * g,
                             _mm512_mul_ps(vscale,
                                           _mm512_i32gather_ps(down, st[g] + j, sizeof(float))));
}

/* A 16 x 16 matrix of 32-bit units, one row per register, transposed in place. */
static inline void amx_transpose16_epi32(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) { /* 2 x 2 blocks of units */
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* 4 x 4 blocks */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 8; i++) { /* 128-bit lanes: 8 x 8, then 16 x 16 */
        const int a = (i & 3) + (i & 4 ? 8 : 0);
        t[a] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0x88);
        t[a + 4] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Q^T of rows [r0, r0 + 16) of q16 (stride dp), one B tile per 32 dims: unit k of row j of
 * tile `step` is the dim pair (32 step + 2k, + 1) of row r0 + j; rows past m are zero. The
 * rows' dim pairs are 32-bit units, so this is a transposition of 16 x 16 units per tile. */
static void amx_decode_qt(uint32_t *qt, const uint16_t *q16, int r0, int m, int dp)
{
    const int mr = m - r0 < 16 ? m - r0 : 16;
    for (int step = 0; step < dp / 32; step++) {
        __m512i r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j < mr ? _mm512_loadu_si512((const void *)(q16 + (ptrdiff_t)(r0 + j) * dp +
                                                               32 * step))
                          : _mm512_setzero_si512();
        amx_transpose16_epi32(r);
        for (int k = 0; k < 16; k++)
            _mm512_store_si512((void *)(qt + (size_t)step * 256 + 16 * k), r[k]);
    }
}

/* The A operand of 16 keys from g0: the cache rows themselves when the 16 lie at one stride
 * and every dim of a tile row belongs to the head (d a multiple of 32), else a copy with
 * zeros past d and past n. Returns the rows' stride in bytes. */
static const void *amx_decode_keys(const void *const *k, int g0, int n, int64_t d, int dp,
                                   uint16_t *copy, size_t *stride)
{
    const int gn = n - g0 < 16 ? n - g0 : 16;
    if (gn == 16 && d == dp) {
        const ptrdiff_t st = (const char *)k[g0 + 1] - (const char *)k[g0];
        int same = st > 0;
        for (int c = 2; c < 16 && same; c++)
            same = (const char *)k[g0 + c] - (const char *)k[g0 + c - 1] == st;
        if (same) {
            *stride = (size_t)st;
            return k[g0];
        }
    }
    const __mmask32 tail = (d & 31) ? (__mmask32)((1u << (d & 31)) - 1) : (__mmask32)~0u;
    for (int c = 0; c < 16; c++)
        for (int ch = 0; ch < dp / 32; ch++)
            _mm512_store_si512((void *)(copy + (ptrdiff_t)c * dp + 32 * ch),
                               c < gn ? _mm512_maskz_loadu_epi16(
                                            ch == dp / 32 - 1 ? tail : (__mmask32)~0u,
                                            (const uint16_t *)k[g0 + c] + 32 * ch)
                                      : _mm512_setzero_si512());
    *stride = (size_t)dp * sizeof(uint16_t);
    return copy;
}

/* Below these rows per call (MHA decode, a GQA group of 2) the tiles' fixed costs - Q^T,
 * the S^T gather, the V pairs - outweigh what they save: the AVX512_BF16 kernels are as fast
 * or faster there (one call of 64 keys, in L1: S 218 against 227 ns at one row, P V 535
 * against 333 ns at one row, 532 against 463 at two, 556 against 735 at four). */
enum { QK_TILE_ROWS = 2, PV_TILE_ROWS = 4 };

void flashc_amx_decode_qk16(int m, int n, int64_t d, const uint16_t *q16, int dp,
                            const void *const *k, float scale, const void *const *pf, int npf,
                            float *s)
{
    if (m < QK_TILE_ROWS) {
        flashc_cpu_kernels_avx512.decode_qk16(m, n, d, q16, dp, k, scale, pf, npf, s);
        return;
    }
    flashc_amx_configure();
    const int steps = dp / 32;
    uint32_t qt[DEC_MAX_STEPS * 256] __attribute__((aligned(64)));
    uint16_t copy[4][16 * FLASHC_MAX_HEAD_DIM] __attribute__((aligned(64)));
    float st[4][256] __attribute__((aligned(64))); /* S^T of 4 x 16 keys, 16 rows each */
    amx_prefetcher pfc = {pf, npf, 0, d * 2, 0};
    for (int r0 = 0; r0 < m; r0 += 16) {
        const int mr = m - r0 < 16 ? m - r0 : 16;
        amx_decode_qt(qt, q16, r0, m, dp);
        for (int g0 = 0; g0 < n; g0 += 64) {
            const void *a[4];
            size_t as[4];
            const int groups = (n - g0 + 15) / 16 < 4 ? (n - g0 + 15) / 16 : 4;
            for (int g = 0; g < groups; g++)
                a[g] = amx_decode_keys(k, g0 + 16 * g, n, d, dp, copy[g], &as[g]);
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int step = 0; step < steps; step++) {
                _tile_loadd(4, qt + step * 256, 64);
                /* the A tiles alternate, so a load need not wait for the product before */
                AMX_LOAD_PRODUCT(0, 5, 4, 5, (const char *)a[0] + 64 * step, as[0], &pfc);
                if (groups > 1)
                    AMX_LOAD_PRODUCT(1, 6, 4, 6, (const char *)a[1] + 64 * step, as[1], &pfc);
                if (groups > 2)
                    AMX_LOAD_PRODUCT(2, 7, 4, 7, (const char *)a[2] + 64 * step, as[2], &pfc);
                if (groups > 3)
                    AMX_LOAD_PRODUCT(3, 5, 4, 5, (const char *)a[3] + 64 * step, as[3], &pfc);
            }
            _tile_stored(0, st[0], 64);
            _tile_stored(1, st[1], 64);
            _tile_stored(2, st[2], 64);
            _tile_stored(3, st[3], 64);
            amx_decode_s_rows(st, groups, scale, s + (ptrdiff_t)r0 * FLASHC_CPU_BLOCK_N + g0, mr,
                              &pfc);
        }
    }
    amx_prefetch_some(&pfc, npf * 8);
}

/* Row kp of the B tiles of dims [32 ch, 32 ch + 32) from 32 bf16 of key rows a and b (a key
 * pair): tile 2 ch takes the first 16 dims interleaved (a0 b0 a1 b1 ...), tile 2 ch + 1 the
 * rest. The tiles of one 32-key step lie 512 elements apart. */
static inline void amx_store_pair(uint16_t *vp, int kp, int ch, __m512i a, __m512i b)
{
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41,
                                            9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2,
                                            33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    _mm512_store_si512((void *)(vp + (ptrdiff_t)(2 * ch) * 512 + 32 * kp),
                       _mm512_permutex2var_epi16(a, lo_idx, b));
    _mm512_store_si512((void *)(vp + (ptrdiff_t)(2 * ch + 1) * 512 + 32 * kp),
                       _mm512_permutex2var_epi16(a, hi_idx, b));
}

/* V rows of keys [32 ks, 32 ks + 32) as B tiles, one per 16 dims: row k of tile x holds dims
 * [16 x, 16 x + 16) of keys 2k and 2k + 1 interleaved; keys past n and dims past d zero. */
static void amx_decode_vpairs(uint16_t *vp, const void *const *v, int ks, int n, int64_t d,
                              int dp, amx_prefetcher *pfc)
{
    const __mmask32 tail = (d & 31) ? (__mmask32)((1u << (d & 31)) - 1) : (__mmask32)~0u;
    for (int kp = 0; kp < 16; kp++) {
        const int c = 32 * ks + 2 * kp;
        for (int ch = 0; ch < dp / 32; ch++) {
            const __mmask32 mk = ch == dp / 32 - 1 ? tail : (__mmask32)~0u;
            const __m512i a = c < n ? _mm512_maskz_loadu_epi16(mk, (const uint16_t *)v[c] + 32 * ch)
                                    : _mm512_setzero_si512();
            const __m512i b = c + 1 < n
                                  ? _mm512_maskz_loadu_epi16(mk, (const uint16_t *)v[c + 1] + 32 * ch)
                                  : _mm512_setzero_si512();
            amx_prefetch_some(pfc, 1);
            amx_store_pair(vp, kp, ch, a, b);
        }
    }
}

void flashc_amx_decode_pv16(int m, int n, int64_t d, const uint16_t *p16, const void *const *v,
                            const void *const *pf, int npf, float *o, int dp)
{
    if (m < PV_TILE_ROWS) {
        flashc_cpu_kernels_avx512.decode_pv16(m, n, d, p16, v, pf, npf, o, dp);
        return;
    }
    flashc_amx_configure();
    const int ksteps = (n + 31) / 32, slabs = dp / 16;
    uint16_t vp[2][FLASHC_MAX_HEAD_DIM / 16 * 512] __attribute__((aligned(64)));
    uint16_t pa[16 * FLASHC_CPU_BLOCK_N] __attribute__((aligned(64)));
    float ct[16 * FLASHC_MAX_HEAD_DIM] __attribute__((aligned(64)));
    amx_prefetcher pfc = {pf, npf, 0, d * 2, 0};
    for (int ks = 0; ks < ksteps; ks++)
        amx_decode_vpairs(vp[ks], v, ks, n, d, dp, &pfc);
    /* P's columns up to n, rounded up to a key pair (zero there by contract); zero after */
    const int ncol = (n + 1) & ~1;
    const __mmask32 plo = ncol >= 32 ? (__mmask32)~0u : (__mmask32)((1u << ncol) - 1);
    const __mmask32 phi = ncol >= 64 ? (__mmask32)~0u
                          : ncol > 32 ? (__mmask32)((1u << (ncol - 32)) - 1)
                                      : 0;
    for (int r0 = 0; r0 < m; r0 += 16) {
        const int mr = m - r0 < 16 ? m - r0 : 16;
        for (int r = 0; r < 16; r++) {
            const uint16_t *prow = p16 + (ptrdiff_t)(r0 + r) * FLASHC_CPU_BLOCK_N;
            _mm512_store_si512((void *)(pa + r * FLASHC_CPU_BLOCK_N),
                               r < mr ? _mm512_maskz_loadu_epi16(plo, prow) : _mm512_setzero_si512());
            _mm512_store_si512((void *)(pa + r * FLASHC_CPU_BLOCK_N + 32),
                               r < mr ? _mm512_maskz_loadu_epi16(phi, prow + 32) : _mm512_setzero_si512());
            amx_prefetch_some(&pfc, 2);
            for (int x = 0; x < dp; x += 16)
                _mm512_store_ps(ct + (ptrdiff_t)r * dp + x,
                                r < mr ? _mm512_load_ps(o + (ptrdiff_t)(r0 + r) * dp + x)
                                       : _mm512_setzero_ps());
        }
        const size_t cs = (size_t)dp * sizeof(float);
        for (int x0 = 0; x0 < slabs; x0 += 4) {
            const int xs = slabs - x0 < 4 ? slabs - x0 : 4;
            float *c0 = ct + 16 * x0;
            _tile_loadd(0, c0, cs);
            if (xs > 1) _tile_loadd(1, c0 + 16, cs);
            if (xs > 2) _tile_loadd(2, c0 + 32, cs);
            if (xs > 3) _tile_loadd(3, c0 + 48, cs);
            for (int ks = 0; ks < ksteps; ks++) {
                const uint16_t *b = vp[ks] + (ptrdiff_t)x0 * 512;
                _tile_loadd(4, pa + 32 * ks, FLASHC_CPU_BLOCK_N * sizeof(uint16_t));
                AMX_LOAD_PRODUCT(0, 4, 5, 5, b, 64, &pfc);
                if (xs > 1)
                    AMX_LOAD_PRODUCT(1, 4, 6, 6, b + 512, 64, &pfc);
                if (xs > 2)
                    AMX_LOAD_PRODUCT(2, 4, 7, 7, b + 1024, 64, &pfc);
                if (xs > 3)
                    AMX_LOAD_PRODUCT(3, 4, 5, 5, b + 1536, 64, &pfc);
            }
            _tile_stored(0, c0, cs);
            if (xs > 1) _tile_stored(1, c0 + 16, cs);
            if (xs > 2) _tile_stored(2, c0 + 32, cs);
            if (xs > 3) _tile_stored(3, c0 + 48, cs);
        }
        for (int r = 0; r < mr; r++)
            for (int x = 0; x < dp; x += 16)
                _mm512_store_ps(o + (ptrdiff_t)(r0 + r) * dp + x,
                                _mm512_load_ps(ct + (ptrdiff_t)r * dp + x));
    }
    amx_prefetch_some(&pfc, npf * 8);
}
