/*
 * cpu_scores.c - the parts of the CPU algorithm that change scores beyond the plain mask:
 * logit softcap, ALiBi, the left edge of a sliding window, and the dropout factors.
 *
 * They run as a separate pass over a 64 x 64 score block, only on blocks that need them (a
 * call with none of these features never enters this file), so the plain path's fused
 * micro-kernels stay as they are; the micro-kernels then see ordinary logits with scale 1
 * (and -inf where the window hides a key, which they already treat as masked).
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "philox.h"

void flashc_cpu_apply_mods(const cpu_score_mods *md, float *s, int m, int n, int64_t i0,
                           int64_t j0, const int *cbeg, float *dcap)
{
    const float scale = md->scale, cap = md->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int r = 0; r < m; r++) {
        float *row = s + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N;
        float *drow = dcap ? dcap + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N : NULL;
        if (scale != 1.0f)
            for (int c = 0; c < n; c++)
                row[c] *= scale;
        if (cap > 0.0f) {
            for (int c = 0; c < n; c++) {
                float t = tanhf(row[c] * inv_cap);
                row[c] = cap * t;
                if (drow)
                    drow[c] = 1.0f - t * t;
            }
        } else if (drow) {
            for (int c = 0; c < n; c++)
                drow[c] = 1.0f;
        }
        if (md->alibi) {
            /* -slope * |i + off - j|: the distance is exact in float up to 2^24 */
            const int64_t d0 = i0 + r + md->off - j0;
            const float slope = md->slope;
            for (int c = 0; c < n; c++) {
                int64_t dist = d0 - c;
                row[c] -= slope * (float)(dist < 0 ? -dist : dist);
            }
        }
        for (int c = 0; c < cbeg[r]; c++)
            row[c] = -INFINITY;
    }
}

void flashc_cpu_dropout_block(const flashc_problem *pr, int64_t b, int64_t h, int64_t i0, int m,
                              int64_t j0, int n, float *d)
{
    const float kept = (float)(1.0 / (1.0 - (double)pr->dropout_p));
    const uint32_t threshold = pr->dropout_threshold;
    const uint64_t w = pr->dropout_offset + (uint64_t)(b * pr->heads_q + h);
    for (int r = 0; r < m; r++) {
        float *row = d + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N;
        const uint32_t i = (uint32_t)(i0 + r);
        /* j0 is a multiple of 64, so each group of four keys is one generator call */
        for (int c = 0; c < n; c += 4) {
            flashc_philox4 rnd =
                flashc_dropout_draws(pr->dropout_seed, w, i, (uint32_t)((j0 + c) >> 2));
            for (int e = 0; e < 4; e++)
                row[c + e] = rnd.v[e] >= threshold ? kept : 0.0f;
        }
        for (int c = n; c < FLASHC_CPU_BLOCK_N; c++)
            row[c] = 0.0f;
    }
}

void flashc_cpu_mul_block(float *x, const float *y, int m, int n)
{
    for (int r = 0; r < m; r++) {
        float *xr = x + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N;
        const float *yr = y + (ptrdiff_t)r * FLASHC_CPU_BLOCK_N;
        for (int c = 0; c < n; c++)
            xr[c] *= yr[c];
    }
}
