/*
 * test_cpu_exp.c - the exponential of every CPU micro-kernel set against exp in double, over
 * the range the softmax feeds it (x - max <= 0 down to where exp underflows, a little above 0
 * for the backward's exp(S - LSE)), and the masked cases: exp(-inf) is exactly 0, masked
 * columns of a softmax block become exactly 0, a row with every key masked keeps max -inf
 * and sum 0 and gets P = 0 (no NaN).
 *
 * Bound checked (the one the kernel files state): relative error <= 2 ULP of the float result
 * where the result is a normal float (x >= -87.3), absolute error <= 2^-126 below.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "../../src/cpu/kernels.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* One ULP of the float nearest r (r a positive normal value). */
static double ulp_of(double r)
{
    int e;
    frexp(r, &e);              /* r = f * 2^e, f in [0.5, 1) */
    return ldexp(1.0, e - 24); /* 24-bit significand */
}

static void check_range(const flashc_cpu_kernels *k)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float));
    const double lo = -104.0, hi = 1.0;
    double max_ulp = 0, max_abs_sub = 0, worst_x = 0;
    for (int pass = 0; pass < 4; pass++) {
        /* four interleaved grids, so the points are not all on one lattice */
        for (int i = 0; i < N; i++)
            x[i] = (float)(lo + (hi - lo) * ((double)i + 0.25 * pass) / N);
        float *ref_in = malloc(N * sizeof(float));
        memcpy(ref_in, x, N * sizeof(float));
        double sum_ref = 0;
        for (int i = 0; i < N; i++)
            sum_ref += exp((double)ref_in[i]);
        float sum = k->exp_sum(x, N, 0.0f);
        for (int i = 0; i < N; i++) {
            double r = exp((double)ref_in[i]);
            double err = fabs((double)x[i] - r);
            if (r >= FLT_MIN) {
                double u = err / ulp_of(r);
                if (u > max_ulp) {
                    max_ulp = u;
                    worst_x = ref_in[i];
                }
            } else if (err > max_abs_sub) {
                max_abs_sub = err;
            }
            CHECK(isfinite(x[i]) && x[i] >= 0, "%s: exp(%g) = %g", k->name, ref_in[i], x[i]);
        }
        CHECK(fabs(sum - sum_ref) <= 1e-5 * sum_ref, "%s: sum %g vs %g", k->name, sum, sum_ref);
        free(ref_in);
    }
    printf("  %-8s exp over [%g, %g]: max %.3f ULP (at x = %.6g), below FLT_MIN max abs err %.2e\n",
           k->name, lo, hi, max_ulp, worst_x, max_abs_sub);
    CHECK(max_ulp <= 2.0, "%s: exp error %.3f ULP exceeds the stated 2", k->name, max_ulp);
    CHECK(max_abs_sub <= ldexp(1.0, -126), "%s: subnormal-range error %g", k->name, max_abs_sub);
    free(x);
}

static void check_masked(const flashc_cpu_kernels *k)
{
    /* -inf anywhere in a vector and in the tail; lengths around the vector widths, with guard
     * values after n that must stay untouched */
    for (int n = 1; n <= 40; n++) {
        float buf[48];
        for (int i = 0; i < 48; i++)
            buf[i] = i < n ? (i % 3 == 0 ? -INFINITY : -0.5f * (float)i) : 12345.0f;
        double ref = 0;
        for (int i = 0; i < n; i++)
            ref += buf[i] == -INFINITY ? 0.0 : exp((double)buf[i] - 1.0);
        float sum = k->exp_sum(buf, n, 1.0f);
        for (int i = 0; i < n; i++)
            if (i % 3 == 0)
                CHECK(buf[i] == 0.0f && !signbit(buf[i]), "%s: exp(-inf) = %g (n %d)", k->name,
                      buf[i], n);
        for (int i = n; i < 48; i++)
            CHECK(buf[i] == 12345.0f, "%s: exp_sum wrote past n = %d", k->name, n);
        CHECK(fabs(sum - ref) <= 1e-6 * (ref + 1), "%s: masked sum %g vs %g", k->name, sum, ref);
    }

    /* a softmax block: row 0 fully masked, row 1 half masked, row 2 all visible */
    float s[3 * FLASHC_CPU_BLOCK_N] __attribute__((aligned(64)));
    float o[3 * 32] __attribute__((aligned(64)));
    int ncols[3] = {0, 20, 37};
    float row_max[3] = {-INFINITY, -INFINITY, -INFINITY}, row_sum[3] = {0, 0, 0};
    for (int i = 0; i < 3 * FLASHC_CPU_BLOCK_N; i++)
        s[i] = (float)((i * 37) % 11) - 5.0f;
    for (int i = 0; i < 3 * 32; i++)
        o[i] = 0.0f;
    k->softmax(s, 3, 37, ncols, 0.5f, row_max, row_sum, o, 32);
    CHECK(row_max[0] == -INFINITY && row_sum[0] == 0.0f, "%s: masked row max %g sum %g",
          k->name, row_max[0], row_sum[0]);
    for (int c = 0; c < 37; c++)
        CHECK(s[c] == 0.0f, "%s: masked row P[%d] = %g", k->name, c, s[c]);
    for (int c = 20; c < 37; c++)
        CHECK(s[FLASHC_CPU_BLOCK_N + c] == 0.0f, "%s: masked column %d: P = %g", k->name, c,
              s[FLASHC_CPU_BLOCK_N + c]);
    for (int r = 1; r < 3; r++) {
        double sum = 0;
        for (int c = 0; c < ncols[r]; c++) {
            float p = s[r * FLASHC_CPU_BLOCK_N + c];
            CHECK(isfinite(p) && p > 0 && p <= 1.0f + 1e-6f, "%s: P = %g", k->name, p);
            sum += p;
        }
        CHECK(fabs(sum - row_sum[r]) <= 1e-5 * sum, "%s: row sum %g vs %g", k->name, row_sum[r],
              sum);
    }

    /* backward: a row whose LSE is -inf (no visible key) gets P = dS = 0 */
    float dp[FLASHC_CPU_BLOCK_N] __attribute__((aligned(64)));
    for (int c = 0; c < FLASHC_CPU_BLOCK_N; c++) {
        s[c] = 1.0f;
        dp[c] = 2.0f;
    }
    float lse = -INFINITY, delta = 0.5f;
    int nc = 10;
    k->p_ds(s, dp, 1, 16, &nc, 1.0f, &lse, &delta);
    for (int c = 0; c < 16; c++)
        CHECK(s[c] == 0.0f && dp[c] == 0.0f, "%s: p_ds of a masked row: %g %g", k->name, s[c],
              dp[c]);
}

int main(void)
{
    const char *sets[] = TEST_CPU_SETS;
    int ran = 0;
    for (int i = 0; i < COUNT(sets); i++) {
        const flashc_cpu_kernels *k = flashc_cpu_pick_kernels(sets[i]);
        if (!k)
            continue;
        check_range(k);
        check_masked(k);
        ran++;
    }
    CHECK(ran >= 1, "no CPU micro-kernel set ran");
    return test_finish("test_cpu_exp");
}
