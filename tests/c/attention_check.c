/*
 * attention_check.c - one attention case against the float64 reference (attention_check.h).
 */
#include "attention_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/ref/reference.h"

void describe_case(const attention_case *c, char *buf, size_t size)
{
    snprintf(buf, size, "%s b%lld q%lld k%lld h%lld/%lld d%lld causal=%d %s", dtype_name(c->dtype),
             (long long)c->batch, (long long)c->seqlen_q, (long long)c->seqlen_k,
             (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim, c->causal,
             layout_name(c->layout));
}

static flashc_problem problem_of(const attention_case *c)
{
    flashc_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.batch = c->batch;
    pr.seqlen_q = c->seqlen_q;
    pr.seqlen_k = c->seqlen_k;
    pr.heads_q = c->heads_q;
    pr.heads_kv = c->heads_kv;
    pr.head_dim = c->head_dim;
    pr.dtype = pr.out_dtype = c->dtype;
    pr.scale = c->scale != 0.0f ? c->scale : (float)(1.0 / sqrt((double)c->head_dim));
    pr.causal = c->causal;
    return pr;
}

static void check_error(const char *what, const char *name, test_error e, double tol)
{
    CHECK(e.nonfinite == 0, "%s: %s has %lld non-finite elements", what, name,
          (long long)e.nonfinite);
    CHECK(e.rel <= tol, "%s: %s relative error %.3g > %.3g (max abs %.3g)", what, name, e.rel,
          tol, e.max_abs);
}

attention_errors run_attention_params(flashc_backend *be, const char *what,
                                      const flashc_params *p, const flashc_problem *pr,
                                      test_layout layout, double std, int check_backward,
                                      uint64_t seed, int64_t *masked_rows)
{
    attention_errors res;
    memset(&res, 0, sizeof res);
    test_rng rng;
    rng_seed(&rng, seed);
    const flashc_dtype dt = pr->dtype;
    const int64_t b = pr->batch, nq = pr->seqlen_q, nk = pr->seqlen_k, hq = pr->heads_q,
                  hkv = pr->heads_kv, d = pr->head_dim;

    test_tensor q = tt_alloc(dt, b, nq, hq, d, layout);
    test_tensor k = tt_alloc(dt, b, nk, hkv, d, layout);
    test_tensor v = tt_alloc(dt, b, nk, hkv, d, layout);
    test_tensor o = tt_alloc(dt, b, nq, hq, d, layout);
    test_tensor lse = tt_alloc_lse(b, hq, nq, layout == LAYOUT_PADDED);
    tt_fill_normal(&q, &rng, std);
    tt_fill_normal(&k, &rng, std);
    tt_fill_normal(&v, &rng, std);
    const double tol = tolerance_for(dt);

    size_t nq_el = (size_t)(b * nq * hq * d), nk_el = (size_t)(b * nk * hkv * d);
    double *ref_o = malloc(nq_el * sizeof(double));
    double *ref_lse = malloc((size_t)(b * hq * nq) * sizeof(double));
    CHECK(flashc_ref_forward_f64(pr, &q.t, &k.t, &v.t, ref_o, ref_lse) == FLASHC_OK,
          "%s: reference forward", what);

    flashc_status st = flashc_forward(be, p, &q.t, &k.t, &v.t, &o.t, &lse.t);
    CHECK(st == FLASHC_OK, "%s: forward returned %s (%s)", what, flashc_status_string(st),
          flashc_last_error());
    res.status_ok = st == FLASHC_OK;
    res.out = compare_dense(&o, ref_o);
    res.lse = compare_lse(&lse, ref_lse);
    res.gaps_ok = tt_gaps_intact(&o) && tt_gaps_intact(&lse);
    check_error(what, "out", res.out, tol);
    check_error(what, "lse", res.lse, 1e-5);
    CHECK(res.gaps_ok, "%s: forward wrote outside its output views", what);
    if (masked_rows) /* a row that sees no key: O exactly 0 and LSE -inf, never NaN */
        for (int64_t bb = 0; bb < b; bb++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < nq; i++) {
                    if (ref_lse[(bb * hq + h) * nq + i] != -INFINITY)
                        continue;
                    (*masked_rows)++;
                    double l = tt_get(&lse, bb, h, i, 0);
                    CHECK(l == -INFINITY, "%s: masked row %lld head %lld: LSE %g, not -inf",
                          what, (long long)i, (long long)h, l);
                    for (int64_t x = 0; x < d; x++)
                        if (tt_get(&o, bb, i, h, x) != 0.0) {
                            CHECK(0, "%s: masked row %lld head %lld: O[%lld] = %g, not 0",
                                  what, (long long)i, (long long)h, (long long)x,
                                  tt_get(&o, bb, i, h, x));
                            break;
                        }
                }

    if (check_backward && st == FLASHC_OK) {
        test_tensor dout = tt_alloc(dt, b, nq, hq, d, layout);
        test_tensor dq = tt_alloc(dt, b, nq, hq, d, layout);
        test_tensor dk = tt_alloc(dt, b, nk, hkv, d, layout);
        test_tensor dv = tt_alloc(dt, b, nk, hkv, d, layout);
        tt_fill_normal(&dout, &rng, 1.0);
        double *ref_dq = malloc(nq_el * sizeof(double));
        double *ref_dk = malloc(nk_el * sizeof(double));
        double *ref_dv = malloc(nk_el * sizeof(double));
        CHECK(flashc_ref_backward_f64(pr, &dout.t, &q.t, &k.t, &v.t, ref_dq, ref_dk, ref_dv) ==
                  FLASHC_OK,
              "%s: reference backward", what);
        st = flashc_backward(be, p, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t, &dq.t, &dk.t, &dv.t);
        CHECK(st == FLASHC_OK, "%s: backward returned %s (%s)", what, flashc_status_string(st),
              flashc_last_error());
        res.status_ok &= st == FLASHC_OK;
        res.dq = compare_dense(&dq, ref_dq);
        res.dk = compare_dense(&dk, ref_dk);
        res.dv = compare_dense(&dv, ref_dv);
        int gaps = tt_gaps_intact(&dq) && tt_gaps_intact(&dk) && tt_gaps_intact(&dv);
        res.gaps_ok &= gaps;
        /* delta = rowsum(dO * O) is taken from O as stored, rounded to the dtype (as in
         * FlashAttention); dS = P (dP - delta) is a difference of nearly equal terms, and with
         * a head dim of a few elements that rounding is relatively larger in it */
        double grad_tol = d < 16 && dt != FLASHC_F32 ? 2 * tol : tol;
        check_error(what, "dq", res.dq, grad_tol);
        check_error(what, "dk", res.dk, grad_tol);
        check_error(what, "dv", res.dv, grad_tol);
        CHECK(gaps, "%s: backward wrote outside its output views", what);
        free(ref_dq);
        free(ref_dk);
        free(ref_dv);
        tt_free(&dout);
        tt_free(&dq);
        tt_free(&dk);
        tt_free(&dv);
    }
    free(ref_o);
    free(ref_lse);
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
    tt_free(&o);
    tt_free(&lse);
    return res;
}

attention_errors run_attention_case(flashc_backend *be, const attention_case *c, uint64_t seed)
{
    char what[160];
    describe_case(c, what, sizeof what);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.softmax_scale = c->scale;
    flashc_problem pr = problem_of(c);
    return run_attention_params(be, what, &p, &pr, c->layout,
                                c->input_std > 0 ? c->input_std : 1.0, c->check_backward, seed,
                                NULL);
}

static double max2(double a, double b)
{
    return a > b ? a : b;
}

void summary_add(error_summary *s, const attention_errors *e)
{
    s->out = max2(s->out, e->out.rel);
    s->lse = max2(s->lse, e->lse.rel);
    s->dq = max2(s->dq, e->dq.rel);
    s->dk = max2(s->dk, e->dk.rel);
    s->dv = max2(s->dv, e->dv.rel);
    s->cases++;
}

void summary_print(const char *label, const error_summary *s)
{
    printf("%-28s %4d cases  max rel err  O %.2e  LSE %.2e  dQ %.2e  dK %.2e  dV %.2e\n", label,
           s->cases, s->out, s->lse, s->dq, s->dk, s->dv);
}
