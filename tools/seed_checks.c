/*
 * seed_checks.c - the seed checks (see seed_checks.h).
 */
#include "seed_checks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_run.h"

typedef struct seed_check {
    const char *name;
    cli_problem problem;
    double input_std;
    double atol, rtol;
    int check_lse;
} seed_check;

/* Compares n values; prints a line; returns 1 if every |x - r| <= atol + rtol |r|. */
static int compare_tensor(const char *check, const char *tensor, const float *x, const float *r,
                          size_t n, double atol, double rtol)
{
    double max_abs = 0, num = 0, den = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], ri = r[i];
        if (isinf(ri) && xi == ri)
            continue;
        double d = fabs(xi - ri);
        if (!(d <= atol + rtol * fabs(ri))) /* NaN fails */
            ok = 0;
        if (d > max_abs || d != d)
            max_abs = d;
        num += d * d;
        den += ri * ri;
    }
    printf("  %-36s %-4s max|diff| %.3g  rel err %.3g  (atol %g, rtol %g)  %s\n", check, tensor,
           max_abs, den > 0 ? sqrt(num / den) : sqrt(num), atol, rtol, ok ? "PASS" : "FAIL");
    return ok;
}

static int run_one(flashc_backend *be, flashc_backend *ref, const seed_check *c, uint64_t seed)
{
    const cli_problem *p = &c->problem;
    size_t qn = cli_q_elems(p), kn = cli_k_elems(p);
    void *q = cli_random_array(p->dtype, qn, c->input_std, &seed);
    void *k = cli_random_array(p->dtype, kn, c->input_std, &seed);
    void *v = cli_random_array(p->dtype, kn, c->input_std, &seed);
    void *dout = cli_random_array(p->dtype, qn, 1.0, &seed);
    int failed = -1;
    cli_outputs got, want;
    cli_inputs in = {q, k, v, dout};
    if (!q || !k || !v || !dout)
        goto done;
    if (cli_run(be, p, &in, 1, &got) != FLASHC_OK) {
        printf("  %s: %s failed: %s\n", c->name, flashc_backend_name(be), flashc_last_error());
        goto done;
    }
    if (cli_run(ref, p, &in, 1, &want) != FLASHC_OK) {
        printf("  %s: reference failed: %s\n", c->name, flashc_last_error());
        cli_outputs_free(&got);
        goto done;
    }
    failed = 0;
    failed += !compare_tensor(c->name, "out", got.o, want.o, qn, c->atol, c->rtol);
    failed += !compare_tensor(c->name, "dq", got.dq, want.dq, qn, c->atol, c->rtol);
    failed += !compare_tensor(c->name, "dk", got.dk, want.dk, kn, c->atol, c->rtol);
    failed += !compare_tensor(c->name, "dv", got.dv, want.dv, kn, c->atol, c->rtol);
    if (c->check_lse)
        failed += !compare_tensor(c->name, "lse", got.lse, want.lse,
                                  (size_t)(p->batch * p->heads_q * p->seqlen_q), c->atol, c->rtol);
    cli_outputs_free(&got);
    cli_outputs_free(&want);
done:
    free(q);
    free(k);
    free(v);
    free(dout);
    return failed;
}

int flashc_run_seed_checks(flashc_backend *be)
{
    const seed_check checks[] = {
        /* Triton tutorial 06 test_op (the Phobos port): Z 1, H 2, N_CTX 1024, HEAD_DIM 64,
         * fp16, sm_scale 0.5, inputs normal(0, 0.5), [Z, H, N, D] buffers */
        {"triton-tutorial full", {FLASHC_F16, 1, 1024, 1024, 2, 2, 64, FLASHC_CAUSAL_NONE, 0.5f, 1},
         0.5, 1e-2, 0.0, 0},
        {"triton-tutorial causal",
         {FLASHC_F16, 1, 1024, 1024, 2, 2, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, 0.5f, 1}, 0.5, 1e-2, 0.0, 0},
        /* the teaching script: batch 3, seqlen 512, 8 heads, dim 128, bf16, causal,
         * scale 1/sqrt(128), [batch, seqlen, heads, dim] */
        {"teaching-script bf16 causal",
         {FLASHC_BF16, 3, 512, 512, 8, 8, 128, FLASHC_CAUSAL_BOTTOM_RIGHT, 0.0f, 0}, 0.5, 1e-2,
         1e-2, 0},
        /* teenygrad: [batch*heads, seqlen, dim] buffers, seqlen_q != seqlen_k, LSE kept */
        {"teenygrad-layout f32 q100 k177",
         {FLASHC_F32, 2, 100, 177, 3, 3, 64, FLASHC_CAUSAL_NONE, 0.0f, 1}, 1.0, 1e-2, 0.0, 1},
        {"teenygrad-layout f16 q177 k100",
         {FLASHC_F16, 2, 177, 100, 3, 3, 64, FLASHC_CAUSAL_NONE, 0.0f, 1}, 1.0, 1e-2, 0.0, 1},
    };
    flashc_backend *ref = NULL;
    if (flashc_backend_create("reference", NULL, &ref) != FLASHC_OK) {
        printf("reference backend: %s\n", flashc_last_error());
        return -1;
    }
    int failed = 0;
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        int f = run_one(be, ref, &checks[i], 20 + i);
        if (f < 0) {
            failed = -1;
            break;
        }
        failed += f;
    }
    flashc_backend_destroy(ref);
    return failed;
}
