/*
 * test_features.c - the attention features beyond the plain mask, CPU backend against the
 * float64 reference, forward and backward: sliding windows (with and without causal, both
 * alignments, a window narrower than a block, windows that leave rows with no key), logit
 * softcap, ALiBi (per head and per sequence), dropout (the same Philox mask on both sides,
 * so the usual error bar applies), variable-length batches (empty sequences, sequences of
 * length 1, GQA, every feature at once), and the combinations. Outputs are poisoned before
 * each run and their gaps checked after; fully masked rows must give O = 0 exactly and
 * LSE = -inf. Every case runs on each micro-kernel set this processor supports and under
 * both backward schedules. Also: Philox4x32-10 against Random123's known answers, the
 * dropout rate, and varlen against the same sequences run as a fixed-length batch.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_check.h"
#include "../../src/cpu/kernels.h"
#include "../../src/philox.h"
#include "../../src/ref/reference.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_SEQS 8

typedef struct feat_case {
    const char *label;
    flashc_dtype dtype;
    /* fixed length: batch, seqlen_q, seqlen_k; varlen when nseq > 0 (batch and seqlens
     * then come from the lengths) */
    int64_t batch, seqlen_q, seqlen_k;
    int64_t heads_q, heads_kv, head_dim;
    int nseq;
    int32_t lens_q[MAX_SEQS], lens_k[MAX_SEQS];
    int32_t causal;
    int32_t window_left, window_right;
    float softcap;
    int alibi; /* 0 off, 1 per head, 2 per sequence */
    float dropout;
    float scale;
    double input_std;
    test_layout layout;
} feat_case;

typedef struct feat_result {
    attention_errors e;
    int64_t masked_rows; /* rows the reference says see no key */
} feat_result;

static const char *g_isa = "";
static const char *g_schedule = "";

static void describe(const feat_case *c, char *buf, size_t size)
{
    snprintf(buf, size,
             "[%s/%s] %s: %s %s hq%lld/%lld d%lld causal=%d win=(%d,%d) cap=%g alibi=%d "
             "drop=%g %s",
             g_isa, g_schedule, c->label, dtype_name(c->dtype), c->nseq ? "varlen" : "fixed",
             (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim, c->causal,
             c->window_left, c->window_right, c->softcap, c->alibi, c->dropout,
             layout_name(c->layout));
}

static void check_error(const char *what, const char *name, test_error e, double tol)
{
    CHECK(e.nonfinite == 0, "%s: %s has %lld non-finite elements", what, name,
          (long long)e.nonfinite);
    CHECK(e.rel <= tol, "%s: %s relative error %.3g > %.3g (max abs %.3g)", what, name, e.rel,
          tol, e.max_abs);
}

/* The problem api.c builds for these params, written out by hand for the reference. */
static flashc_problem problem_of(const feat_case *c, const flashc_params *p, int64_t batch,
                                 int64_t nq, int64_t nk, int32_t max_q, int32_t max_k)
{
    flashc_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.batch = batch;
    pr.seqlen_q = nq;
    pr.seqlen_k = nk;
    pr.heads_q = c->heads_q;
    pr.heads_kv = c->heads_kv;
    pr.head_dim = c->head_dim;
    pr.dtype = pr.out_dtype = c->dtype;
    pr.scale = c->scale != 0.0f ? c->scale : (float)(1.0 / sqrt((double)c->head_dim));
    pr.causal = c->causal;
    if (p->window_left >= 0 || p->window_right >= 0)
        pr.features |= FLASHC_FEATURE_WINDOW;
    pr.window_left = p->window_left;
    pr.window_right = p->window_right;
    if (p->softcap > 0) {
        pr.features |= FLASHC_FEATURE_SOFTCAP;
        pr.softcap = p->softcap;
    }
    if (p->alibi_slopes) {
        pr.features |= FLASHC_FEATURE_ALIBI;
        pr.alibi_slopes = p->alibi_slopes;
        pr.alibi_batch_stride = p->alibi_slopes_batch_stride;
    }
    pr.max_seqlen_q = nq;
    pr.max_seqlen_k = nk;
    if (p->cu_seqlens_q) {
        pr.features |= FLASHC_FEATURE_VARLEN;
        pr.num_seqs = p->num_seqs;
        pr.cu_seqlens_q = p->cu_seqlens_q;
        pr.cu_seqlens_k = p->cu_seqlens_k;
        pr.max_seqlen_q = max_q;
        pr.max_seqlen_k = max_k;
    }
    if (p->dropout_p > 0) {
        pr.features |= FLASHC_FEATURE_DROPOUT;
        pr.dropout_p = p->dropout_p;
        pr.dropout_threshold = flashc_dropout_threshold(p->dropout_p);
        pr.dropout_seed = p->dropout_seed;
        pr.dropout_offset = p->dropout_offset;
    }
    return pr;
}

static feat_result run_case(flashc_backend *be, const feat_case *c, uint64_t seed)
{
    feat_result res;
    memset(&res, 0, sizeof res);
    char what[256];
    describe(c, what, sizeof what);

    /* geometry: varlen packs every sequence into batch 1 */
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1], max_q = 0, max_k = 0;
    int64_t batch = c->batch, nq = c->seqlen_q, nk = c->seqlen_k, nseq = c->batch;
    if (c->nseq) {
        cu_q[0] = cu_k[0] = 0;
        for (int b = 0; b < c->nseq; b++) {
            cu_q[b + 1] = cu_q[b] + c->lens_q[b];
            cu_k[b + 1] = cu_k[b] + c->lens_k[b];
            max_q = c->lens_q[b] > max_q ? c->lens_q[b] : max_q;
            max_k = c->lens_k[b] > max_k ? c->lens_k[b] : max_k;
        }
        batch = 1;
        nq = cu_q[c->nseq];
        nk = cu_k[c->nseq];
        nseq = c->nseq;
    }
    float slopes[64];
    for (int i = 0; i < COUNT(slopes); i++) /* the geometric ALiBi slopes, cycled */
        slopes[i] = ldexpf(1.0f, -1 - (i % 8));

    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.softmax_scale = c->scale;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.softcap = c->softcap;
    if (c->alibi) {
        p.alibi_slopes = slopes;
        /* per sequence: a stride past heads_q, so a mix-up of sequence and head shows */
        p.alibi_slopes_batch_stride = c->alibi == 2 ? c->heads_q + 1 : 0;
        CHECK(nseq * (c->heads_q + 1) <= COUNT(slopes), "%s: too few slopes", what);
    }
    if (c->nseq) {
        p.cu_seqlens_q = cu_q;
        p.cu_seqlens_k = cu_k;
        p.num_seqs = c->nseq;
        p.max_seqlen_q = max_q;
    }
    p.dropout_p = c->dropout;
    p.dropout_seed = 0x243f6a8885a308d3ull ^ seed;
    p.dropout_offset = seed * 1000;
    flashc_problem pr = problem_of(c, &p, batch, nq, nk, max_q, max_k);
    res.e = run_attention_params(be, what, &p, &pr, c->layout,
                                 c->input_std > 0 ? c->input_std : 1.0, 1, seed,
                                 &res.masked_rows);
    return res;
}

/* ---- the grid ---- */

#define FIXED(b, nq, nk, hq, hkv, d) b, nq, nk, hq, hkv, d, 0, {0}, {0}
#define VARLEN(hq, hkv, d, n, ...) 1, 0, 0, hq, hkv, d, n, __VA_ARGS__

/* Feature cases, each run for every dtype. */
static const feat_case cases[] = {
    /* sliding windows */
    {"window both sides", 0, FIXED(2, 17, 17, 2, 2, 32), FLASHC_CAUSAL_NONE, 4, 3, 0, 0, 0},
    {"window left only", 0, FIXED(1, 40, 17, 4, 1, 64), FLASHC_CAUSAL_NONE, 5, -1, 0, 0, 0},
    {"window right only", 0, FIXED(1, 17, 40, 6, 2, 80), FLASHC_CAUSAL_NONE, -1, 7, 0, 0, 0},
    {"window + causal", 0, FIXED(1, 130, 200, 2, 1, 64), FLASHC_CAUSAL_BOTTOM_RIGHT, 70, -1, 0,
     0, 0},
    {"window + top-left causal", 0, FIXED(2, 150, 90, 2, 2, 32), FLASHC_CAUSAL_TOP_LEFT, 33, 9,
     0, 0, 0},
    /* narrower than a block: most key blocks are skipped, the band crosses block edges */
    {"window 2/1 in long rows", 0, FIXED(1, 200, 260, 2, 1, 128), FLASHC_CAUSAL_NONE, 2, 1, 0,
     0, 0},
    /* (0, 0): the diagonal key only; with nq > nk the first rows see nothing */
    {"window 0/0, masked rows", 0, FIXED(1, 40, 17, 2, 2, 16), FLASHC_CAUSAL_NONE, 0, 0, 0, 0,
     0},
    {"causal window 3, masked rows", 0, FIXED(1, 90, 20, 3, 1, 64),
     FLASHC_CAUSAL_BOTTOM_RIGHT, 3, -1, 0, 0, 0},
    {"window, seqlen 1", 0, FIXED(2, 1, 1, 2, 1, 256), FLASHC_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0,
     0},
    {"window, one query 70 keys", 0, FIXED(1, 1, 70, 2, 2, 32), FLASHC_CAUSAL_NONE, 10, -1, 0,
     0, 0},
    /* logit softcap: a small cap with large logits, where tanh bends */
    {"softcap", 0, FIXED(2, 17, 40, 2, 2, 64), FLASHC_CAUSAL_NONE, -1, -1, 5.0f, 0, 0, 1.0f,
     2.0},
    {"softcap + causal", 0, FIXED(1, 130, 65, 4, 1, 128), FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1,
     2.0f, 0, 0},
    {"softcap 30, d 256", 0, FIXED(1, 70, 70, 2, 2, 256), FLASHC_CAUSAL_NONE, -1, -1, 30.0f, 0,
     0},
    /* ALiBi */
    {"alibi per head", 0, FIXED(2, 40, 17, 4, 2, 64), FLASHC_CAUSAL_NONE, -1, -1, 0, 1, 0},
    {"alibi per sequence + causal", 0, FIXED(3, 100, 130, 2, 1, 32),
     FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 2, 0},
    {"alibi + top-left", 0, FIXED(1, 70, 20, 2, 2, 80), FLASHC_CAUSAL_TOP_LEFT, -1, -1, 0, 1,
     0},
    /* dropout */
    {"dropout 0.1", 0, FIXED(2, 17, 40, 2, 2, 64), FLASHC_CAUSAL_NONE, -1, -1, 0, 0, 0.1f},
    {"dropout 0.5 + causal", 0, FIXED(1, 130, 130, 4, 2, 32), FLASHC_CAUSAL_BOTTOM_RIGHT, -1,
     -1, 0, 0, 0.5f},
    {"dropout 0.9, d 1", 0, FIXED(1, 40, 70, 2, 1, 1), FLASHC_CAUSAL_NONE, -1, -1, 0, 0, 0.9f},
    /* everything together */
    {"window + causal + softcap + alibi", 0, FIXED(2, 130, 150, 4, 2, 64),
     FLASHC_CAUSAL_BOTTOM_RIGHT, 40, -1, 8.0f, 2, 0},
    {"all features", 0, FIXED(1, 100, 140, 6, 2, 128), FLASHC_CAUSAL_BOTTOM_RIGHT, 50, 0, 10.0f,
     1, 0.2f},
    {"all features, window both sides", 0, FIXED(1, 70, 70, 2, 2, 32), FLASHC_CAUSAL_NONE, 9,
     17, 4.0f, 2, 0.3f},
    /* variable-length batches */
    {"varlen", 0, VARLEN(2, 2, 64, 5, {5, 0, 1, 70, 33}, {5, 3, 1, 70, 100}),
     FLASHC_CAUSAL_NONE, -1, -1, 0, 0, 0},
    {"varlen causal", 0, VARLEN(4, 2, 32, 4, {17, 130, 1, 64}, {40, 65, 1, 64}),
     FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0},
    {"varlen top-left", 0, VARLEN(2, 1, 80, 3, {40, 3, 20}, {17, 30, 20}),
     FLASHC_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0},
    {"varlen empty key sequences", 0, VARLEN(2, 2, 32, 3, {3, 4, 0}, {0, 4, 5}),
     FLASHC_CAUSAL_NONE, -1, -1, 0, 0, 0},
    {"varlen max_seqlen 1", 0, VARLEN(2, 1, 64, 5, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}),
     FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0},
    {"varlen GQA 6/2", 0, VARLEN(6, 2, 128, 4, {33, 0, 90, 7}, {50, 12, 90, 1}),
     FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0},
    {"varlen MQA, window", 0, VARLEN(4, 1, 64, 3, {100, 64, 9}, {140, 64, 9}),
     FLASHC_CAUSAL_NONE, 20, 5, 0, 0, 0},
    {"varlen all features", 0, VARLEN(4, 2, 64, 5, {70, 0, 1, 45, 130}, {90, 7, 1, 45, 130}),
     FLASHC_CAUSAL_BOTTOM_RIGHT, 30, 0, 6.0f, 2, 0.25f},
};

static void run_grid(flashc_backend *be, uint64_t *seed)
{
    static const flashc_dtype dtypes[] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
    for (int di = 0; di < COUNT(dtypes); di++) {
        error_summary sum;
        memset(&sum, 0, sizeof sum);
        int64_t masked = 0;
        for (int ci = 0; ci < COUNT(cases); ci++) {
            feat_case c = cases[ci];
            c.dtype = dtypes[di];
            c.layout = (test_layout)((ci + di) % LAYOUT_COUNT);
            feat_result r = run_case(be, &c, (*seed)++);
            summary_add(&sum, &r.e);
            masked += r.masked_rows;
        }
        char label[96];
        snprintf(label, sizeof label, "%s/%s %s", g_isa, g_schedule, dtype_name(dtypes[di]));
        summary_print(label, &sum);
        CHECK(masked > 0, "%s: no case had a fully masked row", label);
    }
}

/* The errors of each case, once, for the report (best set, default schedule, f32/bf16). */
static void report_cases(flashc_backend *be)
{
    for (int ci = 0; ci < COUNT(cases); ci++) {
        feat_case c = cases[ci];
        c.dtype = FLASHC_F32;
        c.layout = LAYOUT_BSHD;
        feat_result r = run_case(be, &c, 5000 + (uint64_t)ci);
        printf("  %-36s f32  O %.1e LSE %.1e dQ %.1e dK %.1e dV %.1e\n", c.label, r.e.out.rel,
               r.e.lse.rel, r.e.dq.rel, r.e.dk.rel, r.e.dv.rel);
    }
}

/* ---- Philox and dropout ---- */

static void test_philox(void)
{
    /* Random123's known answers for Philox4x32-10 (its kat_vectors) */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
         0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
         0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int t = 0; t < 3; t++) {
        flashc_philox4 c = {{kat[t][0], kat[t][1], kat[t][2], kat[t][3]}};
        flashc_philox4 r = flashc_philox4x32_10(c, kat[t][4], kat[t][5]);
        for (int e = 0; e < 4; e++)
            CHECK(r.v[e] == kat[t][6 + e], "philox KAT %d word %d: %08x, want %08x", t, e,
                  r.v[e], kat[t][6 + e]);
    }
    /* the threshold is floor(p 2^32), exactly */
    CHECK(flashc_dropout_threshold(0.0f) == 0, "threshold(0)");
    CHECK(flashc_dropout_threshold(0.5f) == 0x80000000u, "threshold(0.5)");
    CHECK(flashc_dropout_threshold(0.25f) == 0x40000000u, "threshold(0.25)");
    CHECK(flashc_dropout_threshold(0.1f) == (uint32_t)((double)0.1f * 4294967296.0),
          "threshold(0.1)");
    /* the public keep bit follows the documented layout */
    const uint64_t seed = 0x0123456789abcdefull, offset = 77;
    const int64_t heads = 5, b = 3, h = 2, i = 41, j = 130;
    flashc_philox4 c = {{(uint32_t)(j / 4), (uint32_t)i, (uint32_t)(offset + b * heads + h),
                         (uint32_t)((offset + b * heads + h) >> 32)}};
    flashc_philox4 r = flashc_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    int want = r.v[j % 4] >= flashc_dropout_threshold(0.3f);
    CHECK(flashc_dropout_keep(seed, offset, 0.3f, heads, b, h, i, j) == want,
          "flashc_dropout_keep differs from the documented layout");
    CHECK(flashc_dropout_keep(seed, offset, 0.0f, heads, b, h, i, j) == 1, "p = 0 keeps all");
    /* the keep rate, over 2^18 entries: within 5 standard deviations of 1 - p */
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int pi = 0; pi < 3; pi++) {
        int64_t kept = 0, n = 0;
        for (int64_t row = 0; row < 512; row++)
            for (int64_t col = 0; col < 512; col++, n++)
                kept += flashc_dropout_keep(seed, 0, ps[pi], 4, row % 3, row % 4, row, col);
        double rate = (double)kept / (double)n, want_rate = 1.0 - ps[pi];
        double sd = sqrt(want_rate * (1 - want_rate) / (double)n);
        printf("dropout p=%.1f: keep rate %.5f (want %.5f +- %.5f)\n", ps[pi], rate, want_rate,
               sd);
        CHECK(fabs(rate - want_rate) < 5 * sd, "dropout p=%g keep rate %g", ps[pi], rate);
    }
}

/* A varlen batch of equal lengths is the fixed-length batch: bitwise the same outputs (same
 * blocks, same kernels, the same dropout counters since b is the sequence either way). */
static void test_varlen_matches_fixed(flashc_backend *be)
{
    const int64_t B = 3, N = 75, H = 4, HK = 2, D = 64;
    test_rng rng;
    rng_seed(&rng, 99);
    test_tensor q = tt_alloc(FLASHC_F32, B, N, H, D, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, B, N, HK, D, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, B, N, HK, D, LAYOUT_BSHD);
    test_tensor dout = tt_alloc(FLASHC_F32, B, N, H, D, LAYOUT_BSHD);
    tt_fill_normal(&q, &rng, 1);
    tt_fill_normal(&k, &rng, 1);
    tt_fill_normal(&v, &rng, 1);
    tt_fill_normal(&dout, &rng, 1);
    test_tensor outs[2][5]; /* o, lse, dq, dk, dv of each run */
    float slopes[3 * 4]; /* [B, H]: per sequence and head */
    for (int i = 0; i < 12; i++)
        slopes[i] = 0.1f * (float)(i + 1);
    int32_t cu[4] = {0, (int32_t)N, (int32_t)(2 * N), (int32_t)(3 * N)};
    for (int run = 0; run < 2; run++) {
        flashc_params p;
        flashc_params_init(&p);
        p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
        p.window_left = 20;
        p.softcap = 5.0f;
        p.alibi_slopes = slopes;
        p.alibi_slopes_batch_stride = H;
        p.dropout_p = 0.3f;
        p.dropout_seed = 5;
        flashc_tensor tq = q.t, tk = k.t, tv = v.t, tdo = dout.t;
        int64_t b = B, n = N;
        if (run == 1) { /* the same memory as one packed batch */
            p.cu_seqlens_q = p.cu_seqlens_k = cu;
            p.num_seqs = (int32_t)B;
            b = 1;
            n = B * N;
            flashc_tensor *ts[4] = {&tq, &tk, &tv, &tdo};
            for (int t = 0; t < 4; t++) {
                ts[t]->shape[0] = 1;
                ts[t]->shape[1] = B * N;
            }
        }
        outs[run][0] = tt_alloc(FLASHC_F32, b, n, H, D, LAYOUT_BSHD);
        outs[run][1] = tt_alloc_lse(b, H, n, 0);
        outs[run][2] = tt_alloc(FLASHC_F32, b, n, H, D, LAYOUT_BSHD);
        outs[run][3] = tt_alloc(FLASHC_F32, b, n, HK, D, LAYOUT_BSHD);
        outs[run][4] = tt_alloc(FLASHC_F32, b, n, HK, D, LAYOUT_BSHD);
        flashc_status st = flashc_forward(be, &p, &tq, &tk, &tv, &outs[run][0].t, &outs[run][1].t);
        CHECK(st == FLASHC_OK, "varlen vs fixed, run %d forward: %s", run, flashc_last_error());
        st = flashc_backward(be, &p, &tdo, &tq, &tk, &tv, &outs[run][0].t, &outs[run][1].t,
                             &outs[run][2].t, &outs[run][3].t, &outs[run][4].t);
        CHECK(st == FLASHC_OK, "varlen vs fixed, run %d backward: %s", run, flashc_last_error());
    }
    static const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    /* the fixed batch's [B, H, N] LSE is not the varlen [1, H, B*N] one: compare by index */
    for (int t = 0; t < 5; t++) {
        if (t == 1) {
            int same = 1;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < N; i++)
                        same &= tt_get(&outs[0][1], b, h, i, 0) ==
                                tt_get(&outs[1][1], 0, h, b * N + i, 0);
            CHECK(same, "varlen vs fixed: lse differs");
        } else {
            CHECK(tt_bytes(&outs[0][t]) == tt_bytes(&outs[1][t]) &&
                      memcmp(outs[0][t].buffer, outs[1][t].buffer, tt_bytes(&outs[0][t])) == 0,
                  "varlen vs fixed: %s is not bitwise the same", names[t]);
        }
        tt_free(&outs[0][t]);
        tt_free(&outs[1][t]);
    }
    tt_free(&q);
    tt_free(&k);
    tt_free(&v);
    tt_free(&dout);
}

int main(void)
{
    test_philox();
    const char *sets[] = TEST_CPU_SETS;
    const char *schedules[] = {"onepass", "threepass"};
    uint64_t seed = 1;
    int ran = 0;
    for (int i = 0; i < COUNT(sets); i++) {
        if (!flashc_cpu_pick_kernels(sets[i]))
            continue;
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.cpu_isa = sets[i];
        cfg.num_threads = 2;
        flashc_backend *be = NULL;
        flashc_status st = flashc_backend_create("cpu", &cfg, &be);
        CHECK(st == FLASHC_OK, "cpu backend with %s: %s", sets[i], flashc_last_error());
        if (!be)
            continue;
        g_isa = sets[i];
        for (int s = 0; s < COUNT(schedules); s++) {
            /* the backward reads the override on every call */
            setenv("FLASHC_CPU_BACKWARD", schedules[s], 1);
            g_schedule = schedules[s];
            run_grid(be, &seed);
        }
        unsetenv("FLASHC_CPU_BACKWARD");
        g_schedule = "auto";
        test_varlen_matches_fixed(be);
        flashc_backend_destroy(be);
        ran++;
    }
    CHECK(ran >= 1, "no CPU micro-kernel set ran");
    flashc_backend *best = NULL;
    if (flashc_backend_create("cpu", NULL, &best) == FLASHC_OK) {
        g_isa = "auto";
        printf("per case (%s):\n", flashc_backend_describe(best));
        report_cases(best);
        flashc_backend_destroy(best);
    }
    return test_finish("test_features");
}
