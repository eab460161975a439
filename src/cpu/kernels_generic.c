/*
 * kernels_generic.c - portable C micro-kernels: plain loops in the order that keeps the
 * innermost loop contiguous, so a compiler can vectorize them for whatever target it builds.
 */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"

static int generic_supported(void)
{
    return 1;
}

static void generic_gemm_nt(int m, int n, int k, const float *a, ptrdiff_t lda, const float *b,
                            ptrdiff_t ldb, float *c, ptrdiff_t ldc)
{
    for (int i = 0; i < m; i++) {
        const float *ai = a + i * lda;
        for (int j = 0; j < n; j++) {
            const float *bj = b + j * ldb;
            float acc = 0.0f;
            for (int p = 0; p < k; p++)
                acc += ai[p] * bj[p];
            c[i * ldc + j] = acc;
        }
    }
}

static void generic_gemm_nn_acc(int m, int n, int k, const float *a, ptrdiff_t lda,
                                const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc)
{
    for (int i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int p = 0; p < k; p++) {
            float aip = a[i * lda + p];
            if (aip == 0.0f)
                continue;
            const float *bp = b + p * ldb;
            for (int j = 0; j < n; j++)
                ci[j] += aip * bp[j];
        }
    }
}

static void generic_gemm_tn_acc(int m, int n, int k, const float *a, ptrdiff_t lda,
                                const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc)
{
    for (int p = 0; p < k; p++) {
        const float *ap = a + p * lda, *bp = b + p * ldb;
        for (int i = 0; i < m; i++) {
            float api = ap[i];
            if (api == 0.0f)
                continue;
            float *ci = c + i * ldc;
            for (int j = 0; j < n; j++)
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

const flashc_cpu_kernels flashc_cpu_kernels_generic = {
    .name = "generic",
    .supported = generic_supported,
    .gemm_nt = generic_gemm_nt,
    .gemm_nn_acc = generic_gemm_nn_acc,
    .gemm_tn_acc = generic_gemm_tn_acc,
    .exp_sum = generic_exp_sum,
};

/* Sets in order of preference; SIMD sets are added ahead of the generic one. */
static const flashc_cpu_kernels *const kernel_sets[] = {
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
    return "generic";
}
