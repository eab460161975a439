/*
 * test_nonfinite.c - NaN and inf in the inputs, on every CPU micro-kernel set this processor
 * runs, against the float64 reference:
 *   - NaN or inf in K or V rows a query cannot see (hidden by the causal mask, outside a
 *     sliding window, in another sequence of a varlen batch, in KV-cache slots past
 *     cache_seqlens) must not reach that query's O, LSE or gradients;
 *   - a NaN score in a visible entry (NaN in Q or K) makes exactly the rows NaN that the
 *     reference makes NaN, instead of looking masked (O = 0, LSE = -inf).
 * Each output element must fall in the reference's class (NaN, +inf, -inf, finite), and
 * the finite ones must be within the dtype's tolerance.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "dtype.h"
#include "../../src/cpu/kernels.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const flashc_dtype dtypes[] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};

/* A contiguous tensor that owns its buffer. */
typedef struct buf {
    flashc_tensor t;
    size_t elems;
} buf;

static buf buf_alloc(flashc_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d)
{
    buf x;
    x.elems = (size_t)(b * s * h * d);
    void *data = calloc(x.elems, flashc_dtype_size(dt));
    x.t = flashc_tensor_contiguous(data, dt, b, s, h, d);
    return x;
}

static buf lse_alloc(int64_t b, int64_t h, int64_t s)
{
    buf x;
    x.elems = (size_t)(b * h * s);
    x.t = flashc_lse_contiguous(calloc(x.elems, sizeof(float)), b, h, s);
    return x;
}

static void buf_free(buf *x)
{
    free(x->t.data);
    x->t.data = NULL;
}

static void buf_fill(buf *x, test_rng *r)
{
    for (size_t i = 0; i < x->elems; i++)
        flashc_store(x->t.data, x->t.dtype, (int64_t)i, (float)rng_normal(r));
}

/* Element (b, s, h, d) of a 4-d buffer. */
static void buf_set(buf *x, int64_t b, int64_t s, int64_t h, int64_t d, float v)
{
    flashc_store(flashc_row_ptr(&x->t, b, s, h), x->t.dtype, d, v);
}

static int cls(double x)
{
    return isnan(x) ? 3 : isinf(x) ? (x > 0 ? 1 : 2) : 0;
}

/* Compares got (any dtype, or LSE) with ref (F32, same shape) element by element: the same
 * class everywhere, and the finite part within tol. Returns the number of NaN in ref. */
static int64_t compare(const char *what, const char *name, const buf *got, const buf *ref,
                       double tol)
{
    const int lse = got->t.ndim == 3;
    double num = 0, den = 0;
    int64_t nan_ref = 0, bad = 0;
    for (size_t i = 0; i < got->elems; i++) {
        double g = lse ? ((float *)got->t.data)[i] : flashc_load(got->t.data, got->t.dtype, i);
        double r = lse ? ((float *)ref->t.data)[i] : flashc_load(ref->t.data, FLASHC_F32, i);
        nan_ref += isnan(r);
        if (cls(g) != cls(r)) {
            if (bad++ < 3)
                CHECK(0, "%s: %s[%zu] = %g where the reference has %g", what, name, i, g, r);
            continue;
        }
        if (cls(r) == 0) {
            num += (g - r) * (g - r);
            den += r * r;
        }
    }
    if (bad > 3)
        CHECK(0, "%s: %s: %lld elements in all of another class than the reference's", what,
              name, (long long)bad);
    test_checks++;
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(rel <= tol, "%s: %s relative error %.3g > %.3g on the finite elements", what, name,
          rel, tol);
    return nan_ref;
}

/* Where to plant a non-finite value: tensor 'q', 'k' or 'v', row, head, dim. */
typedef struct plant {
    char tensor;
    int64_t row, head, dim;
    float value;
} plant;

typedef struct attn_case {
    const char *name;
    int64_t nq, nk, heads_q, heads_kv, dim;
    int32_t causal, window_left, window_right;
    int32_t nseq; /* varlen: sequences (lengths below), 0 = batch 1 of nq x nk */
    int32_t lq[4], lk[4];
    plant plants[3];
    int backward;
    int expect_nan; /* the case must produce NaN somewhere in the reference's O */
} attn_case;

static void run_attn(flashc_backend *cpu, flashc_backend *ref, const char *isa,
                     const attn_case *c, flashc_dtype dt, uint64_t seed)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s %s", isa, c->name, dtype_name(dt));
    test_rng rng;
    rng_seed(&rng, seed);
    int64_t nq = c->nq, nk = c->nk;
    int32_t cuq[5] = {0}, cuk[5] = {0};
    if (c->nseq) {
        for (int s = 0; s < c->nseq; s++) {
            cuq[s + 1] = cuq[s] + c->lq[s];
            cuk[s + 1] = cuk[s] + c->lk[s];
        }
        nq = cuq[c->nseq];
        nk = cuk[c->nseq];
    }
    buf q = buf_alloc(dt, 1, nq, c->heads_q, c->dim), k = buf_alloc(dt, 1, nk, c->heads_kv, c->dim);
    buf v = buf_alloc(dt, 1, nk, c->heads_kv, c->dim), dout = buf_alloc(dt, 1, nq, c->heads_q, c->dim);
    buf_fill(&q, &rng);
    buf_fill(&k, &rng);
    buf_fill(&v, &rng);
    buf_fill(&dout, &rng);
    for (int i = 0; i < COUNT(c->plants); i++) {
        const plant *pl = &c->plants[i];
        buf *t = pl->tensor == 'q' ? &q : pl->tensor == 'k' ? &k : pl->tensor == 'v' ? &v : NULL;
        if (t)
            buf_set(t, 0, pl->row, pl->head, pl->dim, pl->value);
    }
    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    if (c->nseq) {
        p.cu_seqlens_q = cuq;
        p.cu_seqlens_k = cuk;
        p.num_seqs = c->nseq;
    }
    buf o = buf_alloc(dt, 1, nq, c->heads_q, c->dim), lse = lse_alloc(1, c->heads_q, nq);
    buf ro = buf_alloc(FLASHC_F32, 1, nq, c->heads_q, c->dim), rl = lse_alloc(1, c->heads_q, nq);
    flashc_status st = flashc_forward(cpu, &p, &q.t, &k.t, &v.t, &o.t, &lse.t);
    CHECK(st == FLASHC_OK, "%s: cpu forward: %s", what, flashc_last_error());
    st = flashc_forward(ref, &p, &q.t, &k.t, &v.t, &ro.t, &rl.t);
    CHECK(st == FLASHC_OK, "%s: reference forward: %s", what, flashc_last_error());
    const double tol = 2 * tolerance_for(dt);
    int64_t nans = compare(what, "O", &o, &ro, tol);
    compare(what, "LSE", &lse, &rl, 1e-4);
    CHECK(!c->expect_nan || nans > 0, "%s: the case gives no NaN row: it tests nothing", what);
    CHECK(nans < (int64_t)o.elems, "%s: every row is NaN: it tests nothing", what);

    if (c->backward) {
        buf dq = buf_alloc(dt, 1, nq, c->heads_q, c->dim);
        buf dk = buf_alloc(dt, 1, nk, c->heads_kv, c->dim), dv = buf_alloc(dt, 1, nk, c->heads_kv, c->dim);
        buf rq = buf_alloc(FLASHC_F32, 1, nq, c->heads_q, c->dim);
        buf rk = buf_alloc(FLASHC_F32, 1, nk, c->heads_kv, c->dim);
        buf rv = buf_alloc(FLASHC_F32, 1, nk, c->heads_kv, c->dim);
        /* both from the CPU's own O and LSE (the reference recomputes P from the inputs) */
        st = flashc_backward(cpu, &p, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t, &dq.t, &dk.t, &dv.t);
        CHECK(st == FLASHC_OK, "%s: cpu backward: %s", what, flashc_last_error());
        st = flashc_backward(ref, &p, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t, &rq.t, &rk.t, &rv.t);
        CHECK(st == FLASHC_OK, "%s: reference backward: %s", what, flashc_last_error());
        const double gtol = 4 * tolerance_for(dt);
        compare(what, "dQ", &dq, &rq, gtol);
        compare(what, "dK", &dk, &rk, gtol);
        compare(what, "dV", &dv, &rv, gtol);
        buf_free(&dq), buf_free(&dk), buf_free(&dv), buf_free(&rq), buf_free(&rk), buf_free(&rv);
    }
    buf_free(&q), buf_free(&k), buf_free(&v), buf_free(&dout);
    buf_free(&o), buf_free(&lse), buf_free(&ro), buf_free(&rl);
}

#define BR FLASHC_CAUSAL_BOTTOM_RIGHT
#define TL FLASHC_CAUSAL_TOP_LEFT

/* Backward runs only where no row's LSE is NaN: for a row with a NaN score the reference's
 * P is NaN at every key of the sequence, masked ones included (0 / NaN in its softmax), so
 * every dK and dV of the head is NaN there; the CPU backward gives NaN only on the keys of
 * the blocks that row visits. A NaN or inf in V alone, or in keys that no row sees, keeps
 * every LSE finite (the V rows then give O, and through delta dQ and dK, NaN exactly on the
 * rows and keys the reference does). */
static const attn_case attn_cases[] = {
    /* a key in the diagonal block: the rows before it in the same block must stay clean */
    {"causal V NaN", 130, 130, 2, 1, 64, BR, -1, -1, 0, {0}, {0},
     {{'v', 100, 0, 5, NAN}, {'v', 20, 0, 63, NAN}}, 1, 1},
    {"causal K NaN", 130, 130, 2, 1, 64, BR, -1, -1, 0, {0}, {0},
     {{'k', 100, 0, 5, NAN}, {'k', 127, 0, 0, NAN}}, 0, 1},
    {"causal V inf", 130, 130, 2, 1, 64, BR, -1, -1, 0, {0}, {0},
     {{'v', 110, 0, 7, INFINITY}, {'v', 30, 0, 1, -INFINITY}}, 1, 0},
    {"causal K inf", 100, 100, 2, 2, 32, BR, -1, -1, 0, {0}, {0},
     {{'k', 90, 1, 3, INFINITY}}, 0, 0},
    /* top-left with more keys than queries: keys 70..127 lie in a visited block that no row
     * sees (the backward's dS K takes all 64); an odd head dim */
    {"causal top-left hidden K/V NaN", 70, 150, 3, 1, 17, TL, -1, -1, 0, {0}, {0},
     {{'k', 100, 0, 16, NAN}, {'v', 120, 0, 0, NAN}, {'k', 70, 0, 3, INFINITY}}, 1, 0},
    {"causal top-left V NaN", 70, 150, 3, 1, 17, TL, -1, -1, 0, {0}, {0},
     {{'v', 65, 0, 4, NAN}, {'v', 127, 0, 16, NAN}, {'k', 110, 0, 0, NAN}}, 1, 1},
    /* a sliding window: rows past the window's left edge must forget the key again */
    {"window V NaN", 150, 150, 2, 1, 64, FLASHC_CAUSAL_NONE, 20, 7, 0, {0}, {0},
     {{'v', 75, 0, 9, NAN}, {'v', 100, 0, 2, NAN}}, 1, 1},
    {"window K NaN", 150, 150, 2, 1, 64, FLASHC_CAUSAL_NONE, 20, 7, 0, {0}, {0},
     {{'k', 75, 0, 9, NAN}, {'k', 140, 0, 2, NAN}}, 0, 1},
    {"causal window V inf", 150, 150, 2, 1, 80, BR, 33, 0, 0, {0}, {0},
     {{'v', 64, 0, 9, INFINITY}, {'v', 140, 0, 2, NAN}}, 1, 1},
    /* varlen: the first key of a sequence just past the previous sequence's last one */
    {"varlen V NaN", 0, 0, 2, 1, 64, BR, -1, -1, 3, {40, 70, 33}, {50, 90, 20},
     {{'v', 135, 0, 3, NAN}, {'v', 50, 0, 3, NAN}, {'v', 140, 0, 3, NAN}}, 1, 1},
    {"varlen K NaN", 0, 0, 2, 1, 64, BR, -1, -1, 3, {40, 70, 33}, {50, 90, 20},
     {{'k', 135, 0, 3, NAN}, {'k', 50, 0, 3, NAN}, {'k', 140, 0, 3, NAN}}, 0, 1},
    {"varlen K inf", 0, 0, 2, 2, 32, FLASHC_CAUSAL_NONE, -1, -1, 2, {65, 3}, {64, 65},
     {{'k', 64, 1, 3, INFINITY}, {'v', 63, 0, 3, NAN}}, 0, 1},
    /* a visible NaN score: one NaN key among finite ones, and rows with only NaN scores */
    {"visible Q NaN", 100, 120, 2, 1, 64, FLASHC_CAUSAL_NONE, -1, -1, 0, {0}, {0},
     {{'q', 7, 1, 5, NAN}, {'q', 70, 0, 0, NAN}}, 0, 1},
    {"visible Q NaN causal", 100, 100, 2, 1, 64, BR, -1, -1, 0, {0}, {0},
     {{'q', 0, 0, 5, NAN}, {'q', 99, 1, 0, NAN}}, 0, 1},
    {"visible K NaN window", 100, 120, 2, 1, 64, FLASHC_CAUSAL_NONE, 10, 10, 0, {0}, {0},
     {{'k', 50, 0, 5, NAN}}, 0, 1},
    /* head dim 128, where the float32 backward's gradient products take the split bf16 tiles
     * on AMX: the blocks of rows that see no bad key take them (and must stay finite), the
     * blocks holding a NaN or inf in K or V, or rows whose O and so delta are not finite, keep
     * the float32 kernels (an inf in delta or dS would turn into NaN through a split) */
    {"causal V NaN inf d128", 200, 200, 2, 1, 128, BR, -1, -1, 0, {0}, {0},
     {{'v', 150, 0, 7, NAN}, {'v', 170, 0, 100, INFINITY}, {'v', 199, 0, 0, -INFINITY}}, 1, 1},
    {"causal K NaN d128", 200, 200, 2, 1, 128, BR, -1, -1, 0, {0}, {0},
     {{'k', 140, 0, 64, NAN}}, 0, 1},
    /* more than 256 keys: past a row's first softmax step the bf16 path takes P against the
     * row's kept max in one pass, and a second pass where the max passes it by more than 8 */
    {"long rows K NaN", 70, 600, 2, 2, 64, FLASHC_CAUSAL_NONE, -1, -1, 0, {0}, {0},
     {{'k', 400, 0, 5, NAN}}, 0, 1},
    {"long rows K inf", 70, 600, 2, 2, 64, FLASHC_CAUSAL_NONE, -1, -1, 0, {0}, {0},
     {{'k', 450, 0, 3, INFINITY}, {'k', 300, 1, 3, -INFINITY}}, 0, 1},
    {"long rows max jumps", 70, 600, 2, 2, 64, FLASHC_CAUSAL_NONE, -1, -1, 0, {0}, {0},
     {{'k', 500, 0, 3, 200.0f}, {'k', 300, 1, 3, -200.0f}, {'k', 599, 1, 4, 300.0f}}, 0, 0},
    /* finite scores near 1e29 (head dim 64: a power-of-two scale; 80: not): a row's exponents
     * must be taken against its max without the max's rounding error (about 1e22 there),
     * else P overflows or vanishes and O turns NaN; a NaN in V at key 120 sends the block of
     * rows 64..127 through the float softmax, rows 100..119 seeing key 100 but not it */
    {"huge scores", 70, 600, 2, 2, 64, FLASHC_CAUSAL_NONE, -1, -1, 0, {0}, {0},
     {{'k', 100, 0, 3, 1e30f}, {'k', 300, 1, 3, -1e30f}, {'k', 599, 1, 4, 1e37f}}, 0, 0},
    {"huge scores d80", 600, 600, 2, 2, 80, BR, -1, -1, 0, {0}, {0},
     {{'k', 500, 0, 3, 1e30f}, {'k', 100, 1, 3, -1e30f}, {'v', 120, 1, 0, NAN}}, 0, 1},
    /* a row's max on either side of the bound past which its exponents take x sc rounded
     * first (|max| 45000): the same softmax either way, in the bf16 softmax and, for the
     * block that the NaN in V sends there, in the float one */
    {"scores near the exact bound d80", 600, 600, 2, 2, 80, BR, -1, -1, 0, {0}, {0},
     {{'q', 400, 1, 3, 1.9e5f}, {'q', 450, 1, 3, 4e5f}, {'v', 120, 1, 0, NAN}}, 0, 1},
    /* more queries than keys, bottom-right: rows that see no key beside rows that do, in
     * softmax steps of several blocks */
    {"causal masked rows", 400, 300, 2, 1, 64, BR, -1, -1, 0, {0}, {0},
     {{'k', 5, 0, 5, NAN}, {'v', 290, 0, 3, NAN}, {'k', 250, 0, 6, INFINITY}}, 0, 1},
    {"varlen long rows", 0, 0, 2, 1, 64, BR, -1, -1, 4, {1, 0, 300, 70}, {0, 5, 520, 300},
     {{'k', 300, 0, 3, NAN}, {'k', 100, 0, 3, 500.0f}, {'v', 400, 0, 3, NAN}}, 0, 1},
};

/* ---- KV cache ---- */

typedef struct kv_case {
    const char *name;
    int64_t batch, nq, capacity, heads_q, heads_kv, dim;
    int32_t causal;
    int32_t seqlens[2];
    int poison_tail; /* 1: every slot past cache_seqlens holds NaN, 2: +inf */
    plant plants[2]; /* rows of sequence 0 */
    int expect_nan;
} kv_case;

static const kv_case kv_cases[] = {
    {"kvcache tail NaN", 2, 1, 300, 4, 2, 64, FLASHC_CAUSAL_NONE, {150, 37}, 1, {{0}}, 0},
    {"kvcache tail inf", 2, 1, 300, 4, 2, 128, FLASHC_CAUSAL_NONE, {150, 37}, 2, {{0}}, 0},
    {"kvcache causal tail NaN", 2, 4, 200, 8, 2, 64, BR, {130, 64}, 1, {{0}}, 0},
    /* a key only the last queries see */
    {"kvcache causal V/K NaN", 2, 4, 200, 8, 2, 64, BR, {130, 64},
     1, {{'v', 128, 1, 3, NAN}, {'k', 127, 0, 3, NAN}}, 1},
    {"kvcache visible Q NaN", 1, 3, 100, 2, 1, 32, BR, {77, 0}, 1, {{'q', 1, 1, 3, NAN}}, 1},
};

static void run_kv(flashc_backend *cpu, flashc_backend *ref, const char *isa, const kv_case *c,
                   flashc_dtype dt, int32_t splits, uint64_t seed)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s %s splits=%d", isa, c->name, dtype_name(dt), splits);
    test_rng rng;
    rng_seed(&rng, seed);
    buf q = buf_alloc(dt, c->batch, c->nq, c->heads_q, c->dim);
    buf kc = buf_alloc(dt, c->batch, c->capacity, c->heads_kv, c->dim);
    buf vc = buf_alloc(dt, c->batch, c->capacity, c->heads_kv, c->dim);
    buf_fill(&q, &rng);
    buf_fill(&kc, &rng);
    buf_fill(&vc, &rng);
    const float tail = c->poison_tail == 2 ? INFINITY : NAN;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t j = c->seqlens[b]; j < c->capacity; j++)
            for (int64_t h = 0; h < c->heads_kv; h++)
                for (int64_t d = 0; d < c->dim; d++) {
                    buf_set(&kc, b, j, h, d, tail);
                    buf_set(&vc, b, j, h, d, tail);
                }
    for (int i = 0; i < COUNT(c->plants); i++) {
        const plant *pl = &c->plants[i];
        buf *t = pl->tensor == 'q' ? &q : pl->tensor == 'k' ? &kc : pl->tensor == 'v' ? &vc : NULL;
        if (t)
            buf_set(t, 0, pl->row, pl->head, pl->dim, pl->value);
    }
    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = c->seqlens;
    kv.num_splits = splits;
    buf o = buf_alloc(dt, c->batch, c->nq, c->heads_q, c->dim), lse = lse_alloc(c->batch, c->heads_q, c->nq);
    buf ro = buf_alloc(FLASHC_F32, c->batch, c->nq, c->heads_q, c->dim);
    buf rl = lse_alloc(c->batch, c->heads_q, c->nq);
    flashc_status st = flashc_forward_kvcache(cpu, &p, &kv, &q.t, &kc.t, &vc.t, NULL, NULL, &o.t, &lse.t);
    CHECK(st == FLASHC_OK, "%s: cpu: %s", what, flashc_last_error());
    st = flashc_forward_kvcache(ref, &p, &kv, &q.t, &kc.t, &vc.t, NULL, NULL, &ro.t, &rl.t);
    CHECK(st == FLASHC_OK, "%s: reference: %s", what, flashc_last_error());
    int64_t nans = compare(what, "O", &o, &ro, 2 * tolerance_for(dt));
    compare(what, "LSE", &lse, &rl, 1e-4);
    CHECK(!c->expect_nan || nans > 0, "%s: the case gives no NaN row: it tests nothing", what);
    CHECK(nans < (int64_t)o.elems, "%s: every row is NaN: it tests nothing", what);
    buf_free(&q), buf_free(&kc), buf_free(&vc), buf_free(&o), buf_free(&lse), buf_free(&ro),
        buf_free(&rl);
}

int main(void)
{
    const char *sets[] = TEST_CPU_SETS;
    flashc_backend *ref = NULL;
    CHECK(flashc_backend_create("reference", NULL, &ref) == FLASHC_OK, "reference backend: %s",
          flashc_last_error());
    int ran = 0;
    for (int i = 0; i < COUNT(sets) && ref; i++) {
        if (!flashc_cpu_pick_kernels(sets[i]))
            continue;
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.cpu_isa = sets[i];
        cfg.num_threads = 2;
        flashc_backend *cpu = NULL;
        CHECK(flashc_backend_create("cpu", &cfg, &cpu) == FLASHC_OK, "cpu backend with %s: %s",
              sets[i], flashc_last_error());
        if (!cpu)
            continue;
        printf("%s\n", flashc_backend_describe(cpu));
        int before = test_failures;
        uint64_t seed = 1;
        for (int di = 0; di < COUNT(dtypes); di++) {
            for (int c = 0; c < COUNT(attn_cases); c++)
                run_attn(cpu, ref, sets[i], &attn_cases[c], dtypes[di], seed++);
            for (int c = 0; c < COUNT(kv_cases); c++) {
                run_kv(cpu, ref, sets[i], &kv_cases[c], dtypes[di], 1, seed);
                run_kv(cpu, ref, sets[i], &kv_cases[c], dtypes[di], 3, seed++);
            }
        }
        printf("  %s: %s\n", sets[i], test_failures == before ? "ok" : "FAILED");
        flashc_backend_destroy(cpu);
        ran++;
    }
    CHECK(ran >= 1, "no CPU micro-kernel set ran");
    flashc_backend_destroy(ref);
    return test_finish("test_nonfinite");
}
