/*
 * test_merge.c - flashc_merge and flashc_merge_accumulate. The keys of a problem are split
 * into 1..5 uneven chunks, flashc_forward runs on each chunk (under the causal rule, the
 * chunk's rows split into a causal band, whose first rows see no key of the chunk, and rows
 * that see all of it), and the merge of the parts must reproduce the unsplit attention,
 * measured against the float64 reference at the storage dtype's tolerance: for fp32, fp16
 * and bf16, into an output of the parts' dtype or float32, and accumulated in place into a
 * float32 or storage-dtype accumulator. Then the edge cases (every part masked, NaN in a
 * masked part, far-apart LSEs, many parts) and the argument checks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "../../src/ref/reference.h"

/* Rows [a, b) of a [batch, seqlen, heads, dim] view. */
static flashc_tensor seq_rows(const flashc_tensor *t, int64_t a, int64_t b)
{
    flashc_tensor r = *t;
    r.data = (char *)t->data + a * t->stride[1] * (int64_t)flashc_dtype_size(t->dtype);
    r.shape[1] = b - a;
    return r;
}

/* Rows [a, b) of a [batch, heads, seqlen] LSE view. */
static flashc_tensor lse_rows(const flashc_tensor *t, int64_t a, int64_t b)
{
    flashc_tensor r = *t;
    r.data = (float *)t->data + a * t->stride[2];
    r.shape[2] = b - a;
    return r;
}

typedef struct merge_case {
    flashc_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t causal; /* NONE or BOTTOM_RIGHT */
    test_layout layout;
} merge_case;

static double max_rel[4][4]; /* [dtype][variant] largest error seen, for the report */
static const char *const variant_names[4] = {"merge->dtype", "merge->f32", "acc f32",
                                             "acc dtype"};

/* The forward of keys [a, b) for every query, into the part (po, pl). Under the bottom-right
 * causal rule query i sees global key j when j <= i + off, off = Nk - Nq: rows [0, qb) with
 * qb = b - off see the chunk causally, which bottom-right alignment of those rows against
 * the chunk's keys expresses exactly (their first rows see none of it: LSE -inf, from the
 * forward itself); rows [qb, Nq) see all of it. */
static int chunk_forward(flashc_backend *be, const merge_case *c, const test_tensor *q,
                         const test_tensor *k, const test_tensor *v, int64_t a, int64_t b,
                         test_tensor *po, test_tensor *pl)
{
    flashc_params p;
    flashc_params_init(&p);
    flashc_tensor kc = seq_rows(&k->t, a, b), vc = seq_rows(&v->t, a, b);
    int64_t qb = 0;
    if (c->causal != FLASHC_CAUSAL_NONE) {
        qb = b - (c->seqlen_k - c->seqlen_q);
        qb = qb < 0 ? 0 : (qb > c->seqlen_q ? c->seqlen_q : qb);
    }
    flashc_status st = FLASHC_OK;
    if (qb > 0) {
        p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
        flashc_tensor qv = seq_rows(&q->t, 0, qb), ov = seq_rows(&po->t, 0, qb);
        flashc_tensor lv = lse_rows(&pl->t, 0, qb);
        st = flashc_forward(be, &p, &qv, &kc, &vc, &ov, &lv);
    }
    if (st == FLASHC_OK && qb < c->seqlen_q) {
        p.causal = FLASHC_CAUSAL_NONE;
        flashc_tensor qv = seq_rows(&q->t, qb, c->seqlen_q), ov = seq_rows(&po->t, qb, c->seqlen_q);
        flashc_tensor lv = lse_rows(&pl->t, qb, c->seqlen_q);
        st = flashc_forward(be, &p, &qv, &kc, &vc, &ov, &lv);
    }
    CHECK(st == FLASHC_OK, "chunk [%lld, %lld) forward: %s", (long long)a, (long long)b,
          flashc_last_error());
    return st == FLASHC_OK;
}

/* Rows of a part whose LSE is -inf: their out is overwritten with NaN, which the merge must
 * ignore. Returns how many rows were masked. */
static int64_t poison_masked_rows(test_tensor *po, const test_tensor *pl)
{
    int64_t masked = 0;
    const flashc_tensor *o = &po->t;
    for (int64_t b = 0; b < o->shape[0]; b++)
        for (int64_t s = 0; s < o->shape[1]; s++)
            for (int64_t h = 0; h < o->shape[2]; h++) {
                if (tt_get(pl, b, h, s, 0) != -INFINITY)
                    continue;
                masked++;
                for (int64_t d = 0; d < o->shape[3]; d++) {
                    int64_t off = b * o->stride[0] + s * o->stride[1] + h * o->stride[2] + d;
                    if (o->dtype == FLASHC_F32)
                        ((float *)po->buffer)[off] = NAN;
                    else
                        ((uint16_t *)po->buffer)[off] = o->dtype == FLASHC_F16 ? 0x7e00u : 0x7fc0u;
                }
            }
    return masked;
}

static int dtype_index(flashc_dtype d)
{
    return d == FLASHC_F32 ? 0 : d == FLASHC_F16 ? 1 : 2;
}

static void record(const merge_case *c, int variant, const char *what, test_error eo,
                   test_error el, double tol)
{
    double *m = &max_rel[dtype_index(c->dtype)][variant];
    if (eo.rel > *m)
        *m = eo.rel;
    CHECK(eo.nonfinite == 0 && eo.rel <= tol, "%s %s: out rel err %.3g > %.3g (%lld non-finite)",
          what, variant_names[variant], eo.rel, tol, (long long)eo.nonfinite);
    CHECK(el.nonfinite == 0 && el.rel <= 1e-5, "%s %s: lse rel err %.3g (%lld non-finite)",
          what, variant_names[variant], el.rel, (long long)el.nonfinite);
}

static void run_split_case(flashc_backend *be, const merge_case *c, int n_chunks, uint64_t seed)
{
    char what[200];
    snprintf(what, sizeof what, "%s %s b%lld q%lld k%lld h%lld/%lld d%lld causal=%d %s chunks=%d",
             flashc_backend_name(be), dtype_name(c->dtype), (long long)c->batch,
             (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, c->causal, layout_name(c->layout),
             n_chunks);
    test_rng rng;
    rng_seed(&rng, seed);
    const int64_t B = c->batch, Nq = c->seqlen_q, Nk = c->seqlen_k, Hq = c->heads_q,
                  Hkv = c->heads_kv, D = c->head_dim;
    int padded = c->layout == LAYOUT_PADDED;
    test_tensor q = tt_alloc(c->dtype, B, Nq, Hq, D, c->layout);
    test_tensor k = tt_alloc(c->dtype, B, Nk, Hkv, D, c->layout);
    test_tensor v = tt_alloc(c->dtype, B, Nk, Hkv, D, c->layout);
    tt_fill_normal(&q, &rng, 1.0);
    tt_fill_normal(&k, &rng, 1.0);
    tt_fill_normal(&v, &rng, 1.0);

    /* the truth: the unsplit problem in float64 */
    flashc_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.batch = B;
    pr.seqlen_q = Nq;
    pr.seqlen_k = Nk;
    pr.heads_q = Hq;
    pr.heads_kv = Hkv;
    pr.head_dim = D;
    pr.dtype = pr.out_dtype = c->dtype;
    pr.scale = (float)(1.0 / sqrt((double)D));
    pr.causal = c->causal;
    double *ref_o = malloc((size_t)(B * Nq * Hq * D) * sizeof(double));
    double *ref_lse = malloc((size_t)(B * Hq * Nq) * sizeof(double));
    flashc_ref_forward_f64(&pr, &q.t, &k.t, &v.t, ref_o, ref_lse);

    /* uneven chunk boundaries: n_chunks - 1 distinct cuts in (0, Nk) */
    int64_t cut[6];
    cut[0] = 0;
    cut[n_chunks] = Nk;
    for (int i = 1; i < n_chunks; i++) {
        int64_t lo = cut[i - 1] + 1, hi = Nk - (n_chunks - i); /* room for the chunks after */
        cut[i] = lo + rng_range(&rng, hi - lo + 1);
    }
    test_tensor po[5], pl[5];
    flashc_tensor outs[5], lses[5];
    int ok = 1;
    int64_t masked = 0;
    for (int i = 0; i < n_chunks; i++) {
        po[i] = tt_alloc(c->dtype, B, Nq, Hq, D, c->layout);
        pl[i] = tt_alloc_lse(B, Hq, Nq, padded);
        ok &= chunk_forward(be, c, &q, &k, &v, cut[i], cut[i + 1], &po[i], &pl[i]);
        masked += poison_masked_rows(&po[i], &pl[i]);
        outs[i] = po[i].t;
        lses[i] = pl[i].t;
    }
    if (c->causal != FLASHC_CAUSAL_NONE && n_chunks > 1 && Nq >= Nk)
        CHECK(masked > 0, "%s: expected rows that see none of a chunk", what);
    double tol = tolerance_for(c->dtype);

    for (int variant = 0; ok && variant < 4; variant++) {
        flashc_dtype od = variant == 0 || variant == 3 ? c->dtype : FLASHC_F32;
        test_tensor o = tt_alloc(od, B, Nq, Hq, D, c->layout);
        test_tensor l = tt_alloc_lse(B, Hq, Nq, padded);
        flashc_status st = FLASHC_OK;
        if (variant < 2) {
            st = flashc_merge(be, NULL, n_chunks, outs, lses, &o.t, &l.t);
        } else {
            /* an empty accumulator: lse -inf, out left as NaN poison (must not be read) */
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t s = 0; s < Nq; s++)
                        ((float *)l.buffer)[b * l.t.stride[0] + h * l.t.stride[1] +
                                            s * l.t.stride[2]] = -INFINITY;
            for (int i = 0; i < n_chunks && st == FLASHC_OK; i++)
                st = flashc_merge_accumulate(be, NULL, &o.t, &l.t, &outs[i], &lses[i]);
        }
        CHECK(st == FLASHC_OK, "%s %s: %s", what, variant_names[variant], flashc_last_error());
        CHECK(tt_gaps_intact(&o) && tt_gaps_intact(&l), "%s %s: wrote outside the output view",
              what, variant_names[variant]);
        /* a storage-dtype accumulator is rounded after each of up to 5 steps, not once */
        double vtol = variant == 3 && c->dtype != FLASHC_F32 ? 2 * tol : tol;
        record(c, variant, what, compare_dense(&o, ref_o), compare_lse(&l, ref_lse), vtol);
        tt_free(&o);
        tt_free(&l);
    }
    for (int i = 0; i < n_chunks; i++) {
        tt_free(&po[i]);
        tt_free(&pl[i]);
    }
    free(ref_o);
    free(ref_lse);
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
}

static void test_splits(flashc_backend *be, int quick)
{
    const flashc_dtype dtypes[3] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
    /* odd lengths; Nq < Nk (chunked prefill: the new queries at the end), Nq == Nk, Nq > Nk;
     * GQA; a head dim that is not a multiple of 8 */
    const merge_case shapes[] = {
        {FLASHC_F32, 2, 37, 101, 4, 2, 64, 0, LAYOUT_BSHD},
        {FLASHC_F32, 1, 77, 77, 3, 1, 40, 0, LAYOUT_PADDED},
        {FLASHC_F32, 2, 50, 23, 2, 2, 13, 0, LAYOUT_BHSD},
        {FLASHC_F32, 1, 5, 130, 8, 2, 128, 0, LAYOUT_BSHD},
    };
    uint64_t seed = 1;
    for (int di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int causal = 0; causal <= 1; causal++)
                for (int n = 1; n <= 5; n++) {
                    if (quick && n != 1 && n != 3)
                        continue;
                    merge_case c = shapes[si];
                    c.dtype = dtypes[di];
                    c.causal = causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;
                    if (n > c.seqlen_k)
                        continue;
                    run_split_case(be, &c, n, seed++);
                }
}

/* ---- edge cases ------------------------------------------------------------------------ */

static flashc_backend *cpu;

static void fill_f32(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static void test_edges(void)
{
    enum { N = 3, H = 2, D = 8, P = 20 };
    /* every part masked, outs full of NaN: out 0, lse -inf */
    float po[2][N * H * D], pl[2][H * N], o[N * H * D], l[H * N];
    fill_f32(&po[0][0], 2 * N * H * D, NAN);
    fill_f32(&pl[0][0], 2 * H * N, -INFINITY);
    fill_f32(o, N * H * D, 7.0f);
    flashc_tensor outs[2], lses[2];
    for (int i = 0; i < 2; i++) {
        outs[i] = flashc_tensor_contiguous(po[i], FLASHC_F32, 1, N, H, D);
        lses[i] = flashc_lse_contiguous(pl[i], 1, H, N);
    }
    flashc_tensor to = flashc_tensor_contiguous(o, FLASHC_F32, 1, N, H, D);
    flashc_tensor tl = flashc_lse_contiguous(l, 1, H, N);
    CHECK(flashc_merge(cpu, NULL, 2, outs, lses, &to, &tl) == FLASHC_OK, "all masked: %s",
          flashc_last_error());
    int good = 1;
    for (int i = 0; i < N * H * D; i++)
        good &= o[i] == 0.0f && !signbit(o[i]);
    for (int i = 0; i < H * N; i++)
        good &= l[i] == -INFINITY;
    CHECK(good, "all parts masked: want out 0 and lse -inf");

    /* one part: reproduced exactly; far-apart LSEs: no overflow, the small one vanishes */
    for (int i = 0; i < N * H * D; i++) {
        po[0][i] = (float)i * 0.25f - 3.0f;
        po[1][i] = 100.0f;
    }
    for (int i = 0; i < H * N; i++) {
        pl[0][i] = 1000.0f + (float)i;
        pl[1][i] = -1000.0f;
    }
    CHECK(flashc_merge(cpu, NULL, 1, outs, lses, &to, &tl) == FLASHC_OK, "one part");
    CHECK(memcmp(o, po[0], sizeof o) == 0 && memcmp(l, pl[0], sizeof l) == 0,
          "one part: not reproduced bit for bit");
    CHECK(flashc_merge(cpu, NULL, 2, outs, lses, &to, &tl) == FLASHC_OK, "far apart");
    CHECK(memcmp(o, po[0], sizeof o) == 0 && memcmp(l, pl[0], sizeof l) == 0,
          "far-apart LSEs: the negligible part changed the result");

    /* equal LSEs: the mean, lse + log 2; more parts than the stack buffer holds */
    static float many_o[P][N * H * D], many_l[P][H * N];
    flashc_tensor mo[P], ml[P];
    for (int p = 0; p < P; p++) {
        fill_f32(many_o[p], N * H * D, (float)p);
        fill_f32(many_l[p], H * N, p == 3 ? -INFINITY : 0.5f);
        mo[p] = flashc_tensor_contiguous(many_o[p], FLASHC_F32, 1, N, H, D);
        ml[p] = flashc_lse_contiguous(many_l[p], 1, H, N);
    }
    CHECK(flashc_merge(cpu, NULL, P, mo, ml, &to, &tl) == FLASHC_OK, "%d parts", P);
    double want = 0;
    for (int p = 0; p < P; p++)
        want += p == 3 ? 0 : p;
    want /= P - 1;
    CHECK(fabs(o[5] - want) < 1e-5 && fabs(l[1] - (0.5 + log(P - 1.0))) < 1e-5,
          "%d parts: out %g (want %g), lse %g (want %g)", P, o[5], want, l[1],
          0.5 + log(P - 1.0));
}

/* ---- argument checks ------------------------------------------------------------------- */

static void expect(flashc_status st, flashc_status want, const char *needle, const char *what)
{
    CHECK(st == want, "%s: got %s, want %s (%s)", what, flashc_status_string(st),
          flashc_status_string(want), flashc_last_error());
    CHECK(strstr(flashc_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          flashc_last_error(), needle);
}

static void test_validation(void)
{
    enum { N = 4, H = 2, D = 8 };
    float a[N * H * D], b[N * H * D], c[2 * N * H * D], la[H * N], lb[H * N], lc[H * N];
    fill_f32(a, N * H * D, 1);
    fill_f32(b, N * H * D, 2);
    fill_f32(c, 2 * N * H * D, 3);
    fill_f32(la, H * N, 0);
    fill_f32(lb, H * N, 0);
    fill_f32(lc, H * N, 9);
    flashc_tensor outs[2] = {flashc_tensor_contiguous(a, FLASHC_F32, 1, N, H, D),
                             flashc_tensor_contiguous(b, FLASHC_F32, 1, N, H, D)};
    flashc_tensor lses[2] = {flashc_lse_contiguous(la, 1, H, N), flashc_lse_contiguous(lb, 1, H, N)};
    flashc_tensor o = flashc_tensor_contiguous(c, FLASHC_F32, 1, N, H, D);
    flashc_tensor l = flashc_lse_contiguous(lc, 1, H, N);
    float c_snap[sizeof c / sizeof c[0]], lc_snap[H * N];
    memcpy(c_snap, c, sizeof c);
    memcpy(lc_snap, lc, sizeof lc);

    expect(flashc_merge(NULL, NULL, 2, outs, lses, &o, &l), FLASHC_ERROR_NULL_POINTER, "backend",
           "NULL backend");
    expect(flashc_merge(cpu, NULL, 0, outs, lses, &o, &l), FLASHC_ERROR_INVALID_SIZE, "n:",
           "n = 0");
    expect(flashc_merge(cpu, NULL, 2, NULL, lses, &o, &l), FLASHC_ERROR_NULL_POINTER, "outs",
           "NULL outs");
    expect(flashc_merge(cpu, NULL, 2, outs, NULL, &o, &l), FLASHC_ERROR_NULL_POINTER, "lses",
           "NULL lses");
    expect(flashc_merge(cpu, NULL, 2, outs, lses, NULL, &l), FLASHC_ERROR_NULL_POINTER, "out",
           "NULL out");
    flashc_tensor bad[2] = {outs[0], outs[1]};
    bad[1].shape[2] = 1;
    expect(flashc_merge(cpu, NULL, 2, bad, lses, &o, &l), FLASHC_ERROR_SHAPE_MISMATCH,
           "outs[1]: shape[2] (heads)", "part shape");
    bad[1] = outs[1];
    bad[1].dtype = (flashc_dtype)9;
    expect(flashc_merge(cpu, NULL, 2, bad, lses, &o, &l), FLASHC_ERROR_INVALID_DTYPE, "outs[1]",
           "part dtype");
    bad[1] = outs[1];
    bad[1].stride[3] = 2;
    expect(flashc_merge(cpu, NULL, 2, bad, lses, &o, &l), FLASHC_ERROR_INVALID_STRIDE,
           "outs[1]: stride[3]", "part stride");
    flashc_tensor badl[2] = {lses[0], lses[1]};
    badl[0].shape[2] = N + 1;
    expect(flashc_merge(cpu, NULL, 2, outs, badl, &o, &l), FLASHC_ERROR_SHAPE_MISMATCH,
           "lses[0]: shape[2] (seqlen_q)", "part lse shape");
    badl[0] = lses[0];
    badl[0].dtype = FLASHC_F16;
    expect(flashc_merge(cpu, NULL, 2, outs, badl, &o, &l), FLASHC_ERROR_DTYPE_MISMATCH, "lses[0]",
           "part lse dtype");
    flashc_tensor ol = l;
    ol.shape[1] = 1;
    expect(flashc_merge(cpu, NULL, 2, outs, lses, &o, &ol), FLASHC_ERROR_SHAPE_MISMATCH, "lse:",
           "lse shape");
    flashc_tensor oo = o;
    oo.stride[1] = 0;
    expect(flashc_merge(cpu, NULL, 2, outs, lses, &oo, &l), FLASHC_ERROR_INVALID_STRIDE, "out:",
           "out overlapping itself");
    /* the result may not overwrite a part (that is what flashc_merge_accumulate is for) */
    flashc_tensor in_part = flashc_tensor_contiguous(a, FLASHC_F32, 1, N, H, D);
    expect(flashc_merge(cpu, NULL, 2, outs, lses, &in_part, &l), FLASHC_ERROR_ALIASING,
           "out: output memory overlaps input outs[0]", "out aliasing a part");
    flashc_tensor lse_in_out = flashc_lse_contiguous(c + N * H * D - 1, 1, H, N);
    expect(flashc_merge(cpu, NULL, 2, outs, lses, &o, &lse_in_out), FLASHC_ERROR_ALIASING,
           "lse", "lse aliasing out");
    CHECK(memcmp(c, c_snap, sizeof c) == 0 && memcmp(lc, lc_snap, sizeof lc) == 0,
          "a failed merge wrote its outputs");

    /* accumulate */
    expect(flashc_merge_accumulate(cpu, NULL, &o, &l, &o, &lses[0]), FLASHC_ERROR_ALIASING,
           "acc_out: output memory overlaps input part_out", "part is the accumulator");
    expect(flashc_merge_accumulate(cpu, NULL, &o, &l, &outs[0], NULL), FLASHC_ERROR_NULL_POINTER,
           "part_lse", "NULL part_lse");
    expect(flashc_merge_accumulate(cpu, NULL, NULL, &l, &outs[0], &lses[0]),
           FLASHC_ERROR_NULL_POINTER, "acc_out", "NULL acc_out");
    bad[0] = outs[0];
    bad[0].shape[1] = 2;
    expect(flashc_merge_accumulate(cpu, NULL, &o, &l, &bad[0], &lses[0]),
           FLASHC_ERROR_SHAPE_MISMATCH, "part_out: shape[1] (seqlen) is 2 but acc_out has 4",
           "part shape");
    ol = l;
    ol.dtype = FLASHC_BF16;
    expect(flashc_merge_accumulate(cpu, NULL, &o, &ol, &outs[0], &lses[0]),
           FLASHC_ERROR_DTYPE_MISMATCH, "acc_lse", "acc_lse dtype");
    CHECK(memcmp(c, c_snap, sizeof c) == 0 && memcmp(lc, lc_snap, sizeof lc) == 0,
          "a failed accumulate wrote its outputs");

    /* a valid accumulate of mixed dtypes: f32 accumulator, bf16 part */
    uint16_t pb[N * H * D];
    for (int i = 0; i < N * H * D; i++)
        pb[i] = 0x4000; /* 2.0 in bf16 */
    flashc_tensor part = flashc_tensor_contiguous(pb, FLASHC_BF16, 1, N, H, D);
    fill_f32(lc, H * N, 0.0f);
    fill_f32(c, N * H * D, 1.0f);
    CHECK(flashc_merge_accumulate(cpu, NULL, &o, &l, &part, &lses[0]) == FLASHC_OK,
          "mixed dtypes: %s", flashc_last_error());
    CHECK(c[0] == 1.5f && fabsf(lc[0] - logf(2.0f)) < 1e-6f, "mixed dtypes: out %g lse %g",
          c[0], lc[0]);
}

int main(void)
{
    flashc_backend *ref;
    if (flashc_backend_create("cpu", NULL, &cpu) != FLASHC_OK ||
        flashc_backend_create("reference", NULL, &ref) != FLASHC_OK) {
        fprintf(stderr, "backend: %s\n", flashc_last_error());
        return 1;
    }
    test_splits(cpu, 0);
    printf("cpu backend, chunked forward + merge against the unsplit float64 reference, "
           "max rel err of out:\n");
    for (int di = 0; di < 3; di++)
        printf("  %-5s %s %.2e  %s %.2e  %s %.2e  %s %.2e\n",
               dtype_name(di == 0 ? FLASHC_F32 : di == 1 ? FLASHC_F16 : FLASHC_BF16),
               variant_names[0], max_rel[di][0], variant_names[1], max_rel[di][1],
               variant_names[2], max_rel[di][2], variant_names[3], max_rel[di][3]);
    test_splits(ref, 1); /* the merge is the same host loop: a few cases suffice */
    test_edges();
    test_validation();
    flashc_backend_destroy(ref);
    flashc_backend_destroy(cpu);
    return test_finish("test_merge");
}
