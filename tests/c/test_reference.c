/*
 * test_reference.c - trusts the float64 reference by checking it against first principles:
 * its backward against central finite differences of its forward on tiny shapes (every mask
 * mode, GQA, a fully masked row), its LSE against log(sum(exp(S))) summed directly, and
 * its forward against a closed form (identical keys give O = mean(V)).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_check.h"
#include "../../src/ref/reference.h"

static flashc_problem tiny_problem(int64_t nq, int64_t nk, int64_t hq, int64_t hkv, int64_t d,
                                   int32_t causal)
{
    flashc_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.batch = 1;
    pr.seqlen_q = nq;
    pr.seqlen_k = nk;
    pr.heads_q = hq;
    pr.heads_kv = hkv;
    pr.head_dim = d;
    pr.dtype = pr.out_dtype = FLASHC_F32;
    pr.scale = 0.7f;
    pr.causal = causal;
    return pr;
}

/* L = sum(dO * O) in float64, the scalar whose gradients the backward returns. */
static double loss(const flashc_problem *pr, test_tensor *q, test_tensor *k, test_tensor *v,
                   const test_tensor *dout, double *o)
{
    flashc_ref_forward_f64(pr, &q->t, &k->t, &v->t, o, NULL);
    double l = 0;
    for (int64_t s = 0; s < pr->seqlen_q; s++)
        for (int64_t h = 0; h < pr->heads_q; h++)
            for (int64_t d = 0; d < pr->head_dim; d++)
                l += tt_get(dout, 0, s, h, d) * o[(s * pr->heads_q + h) * pr->head_dim + d];
    return l;
}

/* Central difference of L along every element of t against the analytic gradient g. The
 * step is taken between the float32 values actually stored, so the quotient is exact up to
 * the O(h^2) truncation. */
static double fd_error(const flashc_problem *pr, test_tensor *t, const double *g,
                       test_tensor *q, test_tensor *k, test_tensor *v, const test_tensor *dout,
                       double *o)
{
    double num = 0, den = 0;
    float *data = t->buffer;
    for (size_t i = 0; i < t->buffer_elems; i++) {
        float x = data[i];
        float h = 1e-2f * (fabsf(x) > 1 ? fabsf(x) : 1);
        data[i] = x + h;
        double lp = loss(pr, q, k, v, dout, o);
        double xp = data[i];
        data[i] = x - h;
        double lm = loss(pr, q, k, v, dout, o);
        double xm = data[i];
        data[i] = x;
        double fd = (lp - lm) / (xp - xm);
        num += (fd - g[i]) * (fd - g[i]);
        den += g[i] * g[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_gradients(int64_t nq, int64_t nk, int64_t hq, int64_t hkv, int64_t d,
                            int32_t causal, uint64_t seed)
{
    flashc_problem pr = tiny_problem(nq, nk, hq, hkv, d, causal);
    test_rng rng;
    rng_seed(&rng, seed);
    test_tensor q = tt_alloc(FLASHC_F32, 1, nq, hq, d, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, 1, nk, hkv, d, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, 1, nk, hkv, d, LAYOUT_BSHD);
    test_tensor dout = tt_alloc(FLASHC_F32, 1, nq, hq, d, LAYOUT_BSHD);
    tt_fill_normal(&q, &rng, 1.0);
    tt_fill_normal(&k, &rng, 1.0);
    tt_fill_normal(&v, &rng, 1.0);
    tt_fill_normal(&dout, &rng, 1.0);
    double *gq = malloc(q.buffer_elems * sizeof(double));
    double *gk = malloc(k.buffer_elems * sizeof(double));
    double *gv = malloc(v.buffer_elems * sizeof(double));
    double *o = malloc(q.buffer_elems * sizeof(double));
    flashc_ref_backward_f64(&pr, &dout.t, &q.t, &k.t, &v.t, gq, gk, gv);
    double eq = fd_error(&pr, &q, gq, &q, &k, &v, &dout, o);
    double ek = fd_error(&pr, &k, gk, &q, &k, &v, &dout, o);
    double ev = fd_error(&pr, &v, gv, &q, &k, &v, &dout, o);
    printf("finite differences q%lld k%lld h%lld/%lld d%lld causal=%d: rel err dQ %.2e dK %.2e "
           "dV %.2e\n",
           (long long)nq, (long long)nk, (long long)hq, (long long)hkv, (long long)d, causal, eq,
           ek, ev);
    /* truncation error of a central difference with h = 1e-2 is ~h^2 times the third
     * derivative: well under 1e-3 for these magnitudes; a wrong term is off by O(1) */
    CHECK(eq < 1e-3 && ek < 1e-3 && ev < 1e-3, "reference gradients disagree with finite "
          "differences (dQ %.3g dK %.3g dV %.3g)", eq, ek, ev);
    free(gq);
    free(gk);
    free(gv);
    free(o);
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
    tt_free(&dout);
}

/* LSE against log(sum_j exp(S_ij)) summed in the most direct way, and masked rows. */
static void check_lse_and_masking(void)
{
    flashc_problem pr = tiny_problem(6, 4, 1, 1, 3, FLASHC_CAUSAL_BOTTOM_RIGHT);
    test_rng rng;
    rng_seed(&rng, 5);
    test_tensor q = tt_alloc(FLASHC_F32, 1, 6, 1, 3, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, 1, 4, 1, 3, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, 1, 4, 1, 3, LAYOUT_BSHD);
    tt_fill_normal(&q, &rng, 1.0);
    tt_fill_normal(&k, &rng, 1.0);
    tt_fill_normal(&v, &rng, 1.0);
    double o[18], lse[6];
    flashc_ref_forward_f64(&pr, &q.t, &k.t, &v.t, o, lse);
    for (int64_t i = 0; i < 6; i++) {
        /* bottom-right: query i sees key j when j <= i + 4 - 6 */
        int64_t visible = i - 2 + 1;
        if (visible <= 0) {
            CHECK(isinf(lse[i]) && lse[i] < 0, "row %lld: fully masked row must have LSE -inf",
                  (long long)i);
            for (int d = 0; d < 3; d++)
                CHECK(o[i * 3 + d] == 0.0, "row %lld: fully masked row must have O = 0",
                      (long long)i);
            continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < visible; j++) {
            double s = 0;
            for (int d = 0; d < 3; d++)
                s += tt_get(&q, 0, i, 0, d) * tt_get(&k, 0, j, 0, d);
            sum += exp((double)pr.scale * s);
        }
        CHECK(fabs(lse[i] - log(sum)) < 1e-12, "row %lld: LSE %.17g != %.17g", (long long)i,
              lse[i], log(sum));
    }
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
}

/* With every key equal, P is uniform over the visible keys and O is the mean of their V. */
static void check_closed_form(void)
{
    flashc_problem pr = tiny_problem(3, 5, 1, 1, 2, FLASHC_CAUSAL_TOP_LEFT);
    test_tensor q = tt_alloc(FLASHC_F32, 1, 3, 1, 2, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, 1, 5, 1, 2, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, 1, 5, 1, 2, LAYOUT_BSHD);
    float *qf = q.buffer, *kf = k.buffer, *vf = v.buffer;
    for (int i = 0; i < 6; i++)
        qf[i] = (float)(i + 1);
    for (int j = 0; j < 10; j++) {
        kf[j] = 0.5f;
        vf[j] = (float)j;
    }
    double o[6];
    flashc_ref_forward_f64(&pr, &q.t, &k.t, &v.t, o, NULL);
    for (int i = 0; i < 3; i++) /* top-left: query i sees keys 0..i */
        for (int d = 0; d < 2; d++) {
            double mean = 0;
            for (int j = 0; j <= i; j++)
                mean += vf[j * 2 + d];
            mean /= i + 1;
            CHECK(fabs(o[i * 2 + d] - mean) < 1e-12, "closed form: O[%d][%d] %.17g != %.17g", i,
                  d, o[i * 2 + d], mean);
        }
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
}

/* Garbage (NaN) in a key or value that a row cannot see must not reach that row, and a NaN
 * score in a visible entry must make its row NaN rather than "fully masked". */
static void check_nan_isolation(void)
{
    flashc_problem pr = tiny_problem(4, 4, 1, 1, 2, FLASHC_CAUSAL_BOTTOM_RIGHT);
    test_rng rng;
    rng_seed(&rng, 8);
    test_tensor q = tt_alloc(FLASHC_F32, 1, 4, 1, 2, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, 1, 4, 1, 2, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, 1, 4, 1, 2, LAYOUT_BSHD);
    test_tensor dout = tt_alloc(FLASHC_F32, 1, 4, 1, 2, LAYOUT_BSHD);
    tt_fill_normal(&q, &rng, 1.0);
    tt_fill_normal(&k, &rng, 1.0);
    tt_fill_normal(&v, &rng, 1.0);
    tt_fill_normal(&dout, &rng, 1.0);
    ((float *)v.buffer)[3 * 2] = NAN; /* key 3: seen by query 3 only */
    ((float *)k.buffer)[3 * 2 + 1] = NAN;
    double o[8], lse[4], dq[8], dk[8], dv[8];
    flashc_ref_forward_f64(&pr, &q.t, &k.t, &v.t, o, lse);
    flashc_ref_backward_f64(&pr, &dout.t, &q.t, &k.t, &v.t, dq, dk, dv);
    for (int i = 0; i < 3; i++)
        for (int d = 0; d < 2; d++)
            CHECK(isfinite(o[i * 2 + d]) && isfinite(dq[i * 2 + d]) && isfinite(lse[i]),
                  "row %d, which cannot see key 3, was reached by its NaN", i);
    CHECK(isnan(o[3 * 2]) && isnan(lse[3]), "row 3 sees a NaN score: O and LSE must be NaN");
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
    tt_free(&dout);
}

int main(void)
{
    check_gradients(4, 5, 1, 1, 3, FLASHC_CAUSAL_NONE, 1);
    check_gradients(5, 3, 2, 1, 2, FLASHC_CAUSAL_BOTTOM_RIGHT, 2); /* two fully masked rows */
    check_gradients(3, 6, 4, 2, 4, FLASHC_CAUSAL_TOP_LEFT, 3);
    check_gradients(1, 1, 1, 1, 1, FLASHC_CAUSAL_NONE, 4);
    check_lse_and_masking();
    check_closed_form();
    check_nan_isolation();
    return test_finish("test_reference");
}
