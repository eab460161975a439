/*
 * cpu_pack.c - conversion of input rows (float32, fp16 or bf16, any row strides) into the
 * layouts of kernels.h, and of float32 results back into the output's dtype. Packing runs
 * once per (batch, kv head) and key block, O(N d) work beside the O(N^2 d) of the products.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"

void *flashc_cpu_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - 64)
        return NULL;
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

void flashc_cpu_pack_rows(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                          int n, int64_t h, float scale)
{
    const int64_t d = t->shape[3];
    for (int r = 0; r < n; r++) {
        float *row = dst + (ptrdiff_t)r * dp;
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        flashc_load_row(row, flashc_row_ptr(t, b, s0 + r, h), t->dtype, d);
        if (scale != 1.0f)
            for (int64_t c = 0; c < d; c++)
                row[c] *= scale;
        for (int64_t c = d; c < dp; c++)
            row[c] = 0.0f;
    }
}

void flashc_cpu_pack_panel(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                           int n, int64_t h)
{
    const int64_t d = t->shape[3];
    float row[FLASHC_MAX_HEAD_DIM];
    memset(dst, 0, (size_t)dp * FLASHC_CPU_BLOCK_N * sizeof(float));
    for (int r = 0; r < n; r++) {
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        flashc_load_row(row, flashc_row_ptr(t, b, s0 + r, h), t->dtype, d);
        for (int64_t c = 0; c < d; c++)
            dst[c * FLASHC_CPU_BLOCK_N + r] = row[c];
    }
}

void flashc_cpu_pack_rows16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                            int64_t s0, int n, int64_t h)
{
    const int64_t d = t->shape[3];
    for (int r = 0; r < n; r++) {
        uint16_t *row = dst + (ptrdiff_t)r * dp;
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        memcpy(row, flashc_row_ptr(t, b, s0 + r, h), (size_t)d * sizeof(uint16_t));
        memset(row + d, 0, (size_t)(dp - d) * sizeof(uint16_t));
    }
}

/* The two dims of a pair are adjacent in the source row and in the panel, so the panel is a
 * transpose of 32-bit pairs: one store per pair, into a panel not cleared beforehand. */
void flashc_cpu_pack_panel16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h)
{
    const int64_t d = t->shape[3];
    const int full = (int)(d / 2), pairs = (int)((d + 1) / 2);
    uint32_t *out = (uint32_t *)dst;
    for (int r = 0; r < n; r++) {
        const uint16_t *src = flashc_row_ptr(t, b, s0 + r, h);
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        for (int p = 0; p < full; p++) {
            uint32_t pair;
            memcpy(&pair, src + 2 * p, sizeof pair);
            out[p * FLASHC_CPU_BLOCK_N + r] = pair;
        }
        if (full < pairs) /* odd head dim: the last pair's second dim is padding */
            out[full * FLASHC_CPU_BLOCK_N + r] = src[d - 1];
    }
    for (int p = 0; p < pairs; p++) /* keys past the block's end */
        for (int r = n; r < FLASHC_CPU_BLOCK_N; r++)
            out[p * FLASHC_CPU_BLOCK_N + r] = 0;
    memset(out + (ptrdiff_t)pairs * FLASHC_CPU_BLOCK_N, 0,
           (size_t)(dp / 2 - pairs) * FLASHC_CPU_BLOCK_N * sizeof(uint32_t));
}

/* Keys r and r + 1 interleave into one row of 32-bit pairs (r in the low half): two
 * contiguous source rows in, one contiguous row out, which the compiler vectorizes. */
void flashc_cpu_pack_vpair16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h)
{
    const int64_t d = t->shape[3];
    for (int r = 0; r < FLASHC_CPU_BLOCK_N; r += 2) {
        uint32_t *out = (uint32_t *)dst + (ptrdiff_t)(r / 2) * dp;
        if (r >= n) {
            memset(out, 0, (size_t)dp * sizeof(uint32_t));
            continue;
        }
        const uint16_t *lo = flashc_row_ptr(t, b, s0 + r, h);
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        if (r + 1 < n) {
            flashc_cpu_prefetch_ahead(t, b, s0, n, h, r + 1, 0);
            const uint16_t *hi = flashc_row_ptr(t, b, s0 + r + 1, h);
            for (int64_t c = 0; c < d; c++)
                out[c] = (uint32_t)lo[c] | (uint32_t)hi[c] << 16;
        } else {
            for (int64_t c = 0; c < d; c++)
                out[c] = lo[c];
        }
        for (int64_t c = d; c < dp; c++)
            out[c] = 0;
    }
}

void flashc_cpu_store_rows(flashc_tensor *t, const float *src, int ld, int64_t b, int64_t s0,
                           int n, int64_t h, float scale)
{
    const int64_t d = t->shape[3];
    float row[FLASHC_MAX_HEAD_DIM];
    for (int r = 0; r < n; r++) {
        const float *s = src + (ptrdiff_t)r * ld;
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 1);
        if (scale != 1.0f) {
            for (int64_t c = 0; c < d; c++)
                row[c] = s[c] * scale;
            s = row;
        }
        flashc_store_row(flashc_row_ptr(t, b, s0 + r, h), s, t->dtype, d);
    }
}
