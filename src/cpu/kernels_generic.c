/*
 * kernels_generic.c - portable C micro-kernels (plain loops, innermost loop contiguous so a
 * compiler can vectorize them for whatever target it builds), and the table of sets with the
 * run-time choice among them.
 *
 * exp_sum here calls the C library's expf: its error is the libm's (glibc: < 1 ULP).
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "dtype.h"

static int generic_supported(void)
{
    return 1;
}

static void generic_gemm_panel(int m, int k, const float *a, ptrdiff_t lda, const float *panel,
                               float *c)
{
    for (int i = 0; i < m; i++) {
        float acc[FLASHC_CPU_BLOCK_N] = {0};
        const float *ai = a + i * lda;
        for (int p = 0; p < k; p++) {
            const float *bp = panel + (ptrdiff_t)p * FLASHC_CPU_BLOCK_N;
            for (int j = 0; j < FLASHC_CPU_BLOCK_N; j++)
                acc[j] += ai[p] * bp[j];
        }
        memcpy(c + i * FLASHC_CPU_BLOCK_N, acc, sizeof acc);
    }
}

static void generic_gemm_acc(int m, int n, int dp, const float *a, const float *b, float *c)
{
    for (int i = 0; i < m; i++) {
        float *ci = c + (ptrdiff_t)i * dp;
        for (int p = 0; p < n; p++) {
            float aip = a[i * FLASHC_CPU_BLOCK_N + p];
            const float *bp = b + (ptrdiff_t)p * dp;
            for (int j = 0; j < dp; j++)
                ci[j] += aip * bp[j];
        }
    }
}

static void generic_gemm_tn_acc(int n, int m, int dp, const float *a, const float *b, float *c)
{
    for (int p = 0; p < m; p++) {
        const float *ap = a + p * FLASHC_CPU_BLOCK_N, *bp = b + (ptrdiff_t)p * dp;
        for (int i = 0; i < n; i++) {
            float api = ap[i];
            float *ci = c + (ptrdiff_t)i * dp;
            for (int j = 0; j < dp; j++)
                ci[j] += api * bp[j];
        }
    }
}

static float generic_exp_sum(float *x, int n, float sub)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - sub); /* expf(-inf) == 0 */
        sum += x[i];
    }
    return sum;
}

static void generic_softmax(float *s, int m, int n, const int *ncols, float scale, float *row_max,
                            float *row_sum, float *o, int dp)
{
    for (int r = 0; r < m; r++) {
        float *srow = s + r * FLASHC_CPU_BLOCK_N;
        int nc = ncols[r];
        if (scale != 1.0f)
            for (int c = 0; c < n; c++)
                srow[c] *= scale;
        float block_max = -INFINITY;
        for (int c = 0; c < nc; c++)
            block_max = srow[c] > block_max ? srow[c] : block_max;
        float new_max = block_max > row_max[r] ? block_max : row_max[r];
        if (new_max == -INFINITY) { /* nothing visible yet in this row */
            /* or only NaN, which the comparison above skips: the row is NaN, not masked */
            for (int c = 0; c < nc; c++)
                if (srow[c] != srow[c])
                    row_sum[r] = NAN;
            memset(srow, 0, (size_t)n * sizeof(float));
            continue;
        }
        float alpha = expf(row_max[r] - new_max); /* 0 when row_max was -inf */
        row_sum[r] = row_sum[r] * alpha + generic_exp_sum(srow, nc, new_max);
        for (int c = nc; c < n; c++)
            srow[c] = 0.0f;
        row_max[r] = new_max;
        if (alpha != 1.0f) {
            float *orow = o + (ptrdiff_t)r * dp;
            for (int d = 0; d < dp; d++)
                orow[d] *= alpha;
        }
    }
}

static void generic_p_ds(float *s, float *dp, int m, int n, const int *ncols, float scale,
                         const float *lse, const float *delta)
{
    for (int r = 0; r < m; r++) {
        float *srow = s + r * FLASHC_CPU_BLOCK_N, *dprow = dp + r * FLASHC_CPU_BLOCK_N;
        /* -inf: no visible key; a NaN LSE makes P NaN, as in the reference */
        int nc = lse[r] == -INFINITY ? 0 : ncols[r];
        for (int c = 0; c < nc; c++) {
            float p = expf(srow[c] * scale - lse[r]);
            srow[c] = p;
            /* P = 0 (the window's left edge): dS = 0 even where dP is NaN */
            dprow[c] = p != 0.0f ? p * (dprow[c] - delta[r]) : 0.0f;
        }
        for (int c = nc; c < n; c++)
            srow[c] = dprow[c] = 0.0f;
    }
}

static void generic_decode_qk(int m, int n, int64_t d, const float *q, int dp,
                              const void *const *k, int dtype, const void *const *pf, int npf,
                              float *s)
{
    (void)pf, (void)npf; /* plain C leaves the memory requests to the hardware */
    float row[FLASHC_MAX_HEAD_DIM];
    for (int c = 0; c < n; c++) {
        flashc_load_row(row, k[c], (flashc_dtype)dtype, d);
        for (int r = 0; r < m; r++) {
            const float *qr = q + (ptrdiff_t)r * dp;
            float acc = 0.0f;
            for (int64_t x = 0; x < d; x++)
                acc += qr[x] * row[x];
            s[r * FLASHC_CPU_BLOCK_N + c] = acc;
        }
    }
}

static void generic_decode_pv(int m, int n, int64_t d, const float *p, const void *const *v,
                              int dtype, const void *const *pf, int npf, float *o, int dp)
{
    (void)pf, (void)npf;
    float row[FLASHC_MAX_HEAD_DIM];
    for (int c = 0; c < n; c++) {
        flashc_load_row(row, v[c], (flashc_dtype)dtype, d);
        for (int r = 0; r < m; r++) {
            const float w = p[r * FLASHC_CPU_BLOCK_N + c];
            float *orow = o + (ptrdiff_t)r * dp;
            for (int64_t x = 0; x < d; x++)
                orow[x] += w * row[x];
        }
    }
}

static int generic_rows_nonfinite(const void *const *rows, int n, int64_t d, int dtype)
{
    unsigned bad = 0;
    for (int c = 0; c < n; c++) {
        if (dtype == FLASHC_F32) {
            const uint32_t *x = rows[c];
            for (int64_t i = 0; i < d; i++)
                bad |= (x[i] & 0x7f800000u) == 0x7f800000u;
        } else {
            const uint16_t *x = rows[c];
            const uint16_t e = dtype == FLASHC_F16 ? 0x7c00u : 0x7f80u;
            for (int64_t i = 0; i < d; i++)
                bad |= (x[i] & e) == e;
        }
    }
    return bad != 0;
}

const flashc_cpu_kernels flashc_cpu_kernels_generic = {
    .name = "generic",
    .supported = generic_supported,
    .gemm_panel = generic_gemm_panel,
    .gemm_acc = generic_gemm_acc,
    .gemm_tn_acc = generic_gemm_tn_acc,
    .softmax = generic_softmax,
    .p_ds = generic_p_ds,
    .exp_sum = generic_exp_sum,
    .decode_qk = generic_decode_qk,
    .decode_pv = generic_decode_pv,
    .rows_nonfinite = generic_rows_nonfinite,
};

/* Sets in order of preference, best first; the generic set runs anywhere. */
static const flashc_cpu_kernels *const kernel_sets[] = {
#if defined(FLASHC_CPU_X86)
    &flashc_cpu_kernels_amx,
    &flashc_cpu_kernels_avx512,
    &flashc_cpu_kernels_avx2,
#endif
#if defined(FLASHC_CPU_NEON)
    &flashc_cpu_kernels_neon,
#endif
    &flashc_cpu_kernels_generic,
};

const flashc_cpu_kernels *flashc_cpu_pick_kernels(const char *name)
{
    size_t n = sizeof kernel_sets / sizeof kernel_sets[0];
    int want_auto = !name || !*name || strcmp(name, "auto") == 0;
    for (size_t i = 0; i < n; i++) {
        if (!want_auto && strcmp(kernel_sets[i]->name, name) != 0)
            continue;
        if (kernel_sets[i]->supported())
            return kernel_sets[i];
        if (!want_auto)
            return NULL;
    }
    return NULL;
}

const char *flashc_cpu_kernel_names(void)
{
#if defined(FLASHC_CPU_X86)
    return "amx avx512 avx2 generic";
#elif defined(FLASHC_CPU_NEON)
    return "neon generic";
#else
    return "generic";
#endif
}
