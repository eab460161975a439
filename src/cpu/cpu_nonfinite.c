/*
 * cpu_nonfinite.c - what keeps NaN and inf of keys a row cannot see out of that row.
 *
 * The block products multiply every key of a block by its probability (or dS), and a masked
 * key's 0 times a NaN or inf in its V (or K) row is NaN. Rather than select inside the
 * register-blocked kernels, packing notes which rows of each key block hold a non-finite
 * value (one bitmask per block, O(N d) beside the O(N^2 d) of the products), and only a
 * block with such a row takes the product below, which skips the zero entries exactly as
 * the float64 reference does. Every other block keeps the fast kernels untouched.
 */
#include <string.h>

#include "cpu/cpu_internal.h"

int flashc_cpu_row_nonfinite(const void *row, flashc_dtype dtype, int64_t n)
{
    /* an all-ones exponent, read from the bits: no conversion, and exact for every dtype */
    unsigned bad = 0;
    if (dtype == FLASHC_F32) {
        const uint32_t *x = row;
        for (int64_t i = 0; i < n; i++)
            bad |= (x[i] & 0x7f800000u) == 0x7f800000u;
    } else {
        const uint16_t *x = row;
        const uint16_t e = dtype == FLASHC_F16 ? 0x7c00u : 0x7f80u;
        for (int64_t i = 0; i < n; i++)
            bad |= (x[i] & e) == e;
    }
    return bad != 0;
}

uint64_t flashc_cpu_nonfinite_rows(const flashc_tensor *t, int64_t b, int64_t s0, int n,
                                   int64_t h)
{
    uint64_t mask = 0;
    for (int r = 0; r < n; r++) {
        flashc_cpu_prefetch_ahead(t, b, s0, n, h, r, 0);
        if (flashc_cpu_row_nonfinite(flashc_row_ptr(t, b, s0 + r, h), t->dtype, t->shape[3]))
            mask |= (uint64_t)1 << r;
    }
    return mask;
}

void flashc_cpu_acc_rows_sparse(int m, int n, int dp, const float *a,
                                const void *const *rows, flashc_dtype dtype, int64_t d,
                                float *c)
{
    float row[FLASHC_MAX_HEAD_DIM];
    for (int k = 0; k < n; k++) {
        int any = 0;
        for (int r = 0; r < m && !any; r++)
            any = a[(ptrdiff_t)r * FLASHC_CPU_BLOCK_N + k] != 0.0f;
        if (!any)
            continue;
        flashc_load_row(row, rows[k], dtype, d);
        for (int r = 0; r < m; r++) {
            const float w = a[(ptrdiff_t)r * FLASHC_CPU_BLOCK_N + k];
            if (w == 0.0f) /* masked (or dropped, or underflowed): adds nothing, even NaN */
                continue;
            float *cr = c + (ptrdiff_t)r * dp;
            for (int64_t x = 0; x < d; x++)
                cr[x] += w * row[x];
        }
    }
}

void flashc_cpu_acc_block_sparse(int m, int n, int dp, const float *a, const flashc_tensor *t,
                                 int64_t b, int64_t s0, int64_t h, float *c)
{
    const void *rows[FLASHC_CPU_BLOCK_N];
    for (int k = 0; k < n; k++)
        rows[k] = flashc_row_ptr(t, b, s0 + k, h);
    flashc_cpu_acc_rows_sparse(m, n, dp, a, rows, t->dtype, t->shape[3], c);
}
