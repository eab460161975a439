/*
 * test_kvcache.c - flashc_forward_kvcache on the CPU backend against the float64 reference:
 * contiguous and paged caches (pages shuffled in the pool, one page shared by two sequences),
 * cache lengths 0, 1, 17, 1000 and 5000 in one batch, GQA 8:1, 1 and 4 new queries, the
 * in-place append (the appended slots hold the new rows and every other byte of the cache is
 * unchanged; slots past each sequence's length are NaN, so reading one would show), fp32,
 * fp16 and bf16, causal, window, softcap and ALiBi, and forced split counts 1..8 agreeing
 * within float32 reordering. Then the error paths: each mistake gets its status and a message
 * naming the argument, and neither the outputs nor the cache change.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "../../src/backend.h"
#include "../../src/dtype.h"
#include "../../src/ref/reference.h"

static flashc_backend *cpu, *refbe;

typedef struct kv_case {
    flashc_dtype dtype;
    int64_t batch, nq, heads_q, heads_kv, dim;
    const int32_t *seqlens; /* [batch], before the append */
    int64_t nnew;           /* 0: no append */
    int64_t page_size;      /* 0: contiguous */
    int32_t causal;
    int32_t window_left, window_right;
    float softcap;
    int alibi;
    int share_page; /* paged: sequences 0 and 1 share their first page (read only) */
} kv_case;

/* The largest split-to-split difference seen and the largest error against float64. */
static double worst_split_diff, worst_out[4], worst_lse;

typedef struct cache {
    test_tensor k, v;
    int32_t *table;
    int64_t max_pages, capacity;
} cache;

static int64_t max_len(const kv_case *c)
{
    int64_t m = 0;
    for (int64_t b = 0; b < c->batch; b++)
        m = c->seqlens[b] + c->nnew > m ? c->seqlens[b] + c->nnew : m;
    return m;
}

/* Pages of sequence b's block_table row that hold its keys, the new ones included. */
static int64_t used_pages(const kv_case *c, int64_t b)
{
    return (c->seqlens[b] + c->nnew + c->page_size - 1) / c->page_size;
}

/* A cache with room for every sequence (plus slack), values normal, slots at or past each
 * sequence's length NaN. Paged: pages handed out in a shuffled order, a few spare. */
static cache make_cache(const kv_case *c, test_rng *rng)
{
    cache ch;
    memset(&ch, 0, sizeof ch);
    const int64_t need = max_len(c) + 5;
    if (c->page_size) {
        ch.max_pages = (need + c->page_size - 1) / c->page_size;
        ch.capacity = ch.max_pages * c->page_size;
        const int64_t pages = c->batch * ch.max_pages + 3;
        ch.k = tt_alloc(c->dtype, pages, c->page_size, c->heads_kv, c->dim, LAYOUT_PADDED);
        ch.v = tt_alloc(c->dtype, pages, c->page_size, c->heads_kv, c->dim, LAYOUT_BSHD);
        int64_t *perm = malloc((size_t)pages * sizeof *perm);
        for (int64_t i = 0; i < pages; i++)
            perm[i] = i;
        for (int64_t i = pages - 1; i > 0; i--) {
            int64_t j = rng_range(rng, i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        ch.table = malloc((size_t)(c->batch * ch.max_pages) * sizeof(int32_t));
        for (int64_t i = 0; i < c->batch * ch.max_pages; i++)
            ch.table[i] = (int32_t)perm[i];
        if (c->share_page && c->batch > 1)
            ch.table[ch.max_pages] = ch.table[0];
        /* the pages past a sequence's end name no page: a read of one faults */
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t pg = used_pages(c, b); pg < ch.max_pages; pg++)
                ch.table[b * ch.max_pages + pg] = INT32_MAX;
        free(perm);
    } else {
        ch.capacity = need;
        ch.k = tt_alloc(c->dtype, c->batch, need, c->heads_kv, c->dim, LAYOUT_PADDED);
        ch.v = tt_alloc(c->dtype, c->batch, need, c->heads_kv, c->dim, LAYOUT_BHSD);
    }
    tt_fill_normal(&ch.k, rng, 1.0);
    tt_fill_normal(&ch.v, rng, 1.0);
    return ch;
}

static void *slot(const kv_case *c, const cache *ch, const test_tensor *t, int64_t b, int64_t j,
                  int64_t h)
{
    int64_t outer = b, s = j;
    if (c->page_size) {
        outer = ch->table[b * ch->max_pages + j / c->page_size];
        s = j % c->page_size;
    }
    return flashc_row_ptr(&t->t, outer, s, h);
}

static void poison_tail(const kv_case *c, cache *ch)
{
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t j = c->seqlens[b];
             j < (c->page_size ? used_pages(c, b) * c->page_size : ch->capacity); j++)
            for (int64_t h = 0; h < c->heads_kv; h++) {
                if (c->share_page && c->page_size && b == 1 && j < c->page_size)
                    continue; /* the shared page belongs to sequence 0 */
                void *kr = slot(c, ch, &ch->k, b, j, h), *vr = slot(c, ch, &ch->v, b, j, h);
                for (int64_t d = 0; d < c->dim; d++) {
                    flashc_store(kr, c->dtype, d, NAN);
                    flashc_store(vr, c->dtype, d, NAN);
                }
            }
}

/* The problem flashc_forward_kvcache hands a backend, built by hand for the reference. */
static flashc_kvcache_problem problem_of(const kv_case *c, const cache *ch, const float *slopes)
{
    flashc_kvcache_problem pr;
    memset(&pr, 0, sizeof pr);
    flashc_problem *bp = &pr.base;
    bp->batch = c->batch;
    bp->seqlen_q = bp->max_seqlen_q = c->nq;
    bp->seqlen_k = bp->max_seqlen_k = ch->capacity;
    bp->heads_q = c->heads_q;
    bp->heads_kv = c->heads_kv;
    bp->head_dim = c->dim;
    bp->dtype = bp->out_dtype = c->dtype;
    bp->scale = (float)(1.0 / sqrt((double)c->dim));
    bp->causal = c->causal;
    bp->window_left = c->window_left;
    bp->window_right = c->window_right;
    if (c->window_left >= 0 || c->window_right >= 0)
        bp->features |= FLASHC_FEATURE_WINDOW;
    if (c->softcap > 0) {
        bp->features |= FLASHC_FEATURE_SOFTCAP;
        bp->softcap = c->softcap;
    }
    if (c->alibi) {
        bp->features |= FLASHC_FEATURE_ALIBI;
        bp->alibi_slopes = slopes;
        bp->alibi_batch_stride = c->heads_q;
    }
    pr.seqlen_new = c->nnew;
    pr.capacity = ch->capacity;
    pr.max_len = max_len(c);
    pr.cache_seqlens = c->seqlens;
    pr.elem_size = (int64_t)flashc_dtype_size(c->dtype);
    if (c->page_size) {
        pr.paged = 1;
        pr.page_size = c->page_size;
        while ((1 << pr.page_shift) < c->page_size)
            pr.page_shift++;
        pr.num_pages = ch->k.t.shape[0];
        pr.block_table = ch->table;
        pr.block_table_stride = pr.max_pages_per_seq = ch->max_pages;
    }
    return pr;
}

static void describe(const kv_case *c, char *buf, size_t n)
{
    int at = snprintf(buf, n, "%s b%lld nq%lld h%lld/%lld d%lld new%lld %s%lld causal=%d",
                      dtype_name(c->dtype), (long long)c->batch, (long long)c->nq,
                      (long long)c->heads_q, (long long)c->heads_kv, (long long)c->dim,
                      (long long)c->nnew, c->page_size ? "page" : "contig",
                      (long long)c->page_size, c->causal);
    if (c->window_left >= 0 || c->window_right >= 0)
        at += snprintf(buf + at, n - at, " win(%d,%d)", c->window_left, c->window_right);
    if (c->softcap > 0)
        at += snprintf(buf + at, n - at, " cap%g", c->softcap);
    if (c->alibi)
        at += snprintf(buf + at, n - at, " alibi");
    snprintf(buf + at, n - at, " lens");
    for (int64_t b = 0; b < c->batch && at < (int)n - 8; b++)
        at += snprintf(buf + strlen(buf), n - strlen(buf), "%s%d", b ? "," : " ", c->seqlens[b]);
}

/* Runs c with each split count in splits (0-terminated), checking each against float64 and
 * against the first. */
static void run_case(const kv_case *c, const int32_t *splits, uint64_t seed)
{
    char what[256];
    describe(c, what, sizeof what);
    test_rng rng;
    rng_seed(&rng, seed);
    cache ch = make_cache(c, &rng);
    poison_tail(c, &ch);
    test_tensor q = tt_alloc(c->dtype, c->batch, c->nq, c->heads_q, c->dim, LAYOUT_BHSD);
    test_tensor kn = tt_alloc(c->dtype, c->batch, c->nnew ? c->nnew : 1, c->heads_kv, c->dim,
                              LAYOUT_PADDED);
    test_tensor vn = tt_alloc(c->dtype, c->batch, c->nnew ? c->nnew : 1, c->heads_kv, c->dim,
                              LAYOUT_BSHD);
    test_tensor o = tt_alloc(c->dtype, c->batch, c->nq, c->heads_q, c->dim, LAYOUT_PADDED);
    test_tensor lse = tt_alloc_lse(c->batch, c->heads_q, c->nq, 1);
    test_tensor o1 = tt_alloc(FLASHC_F32, c->batch, c->nq, c->heads_q, c->dim, LAYOUT_BSHD);
    tt_fill_normal(&q, &rng, 1.0);
    tt_fill_normal(&kn, &rng, 1.0);
    tt_fill_normal(&vn, &rng, 1.0);
    float *slopes = malloc((size_t)(c->batch * c->heads_q) * sizeof(float));
    for (int64_t i = 0; i < c->batch * c->heads_q; i++)
        slopes[i] = (float)(0.05 + 0.3 * rng_uniform(&rng));

    /* the cache as it must be afterwards: as before, plus the new rows in their slots */
    void *want_k = tt_snapshot(&ch.k), *want_v = tt_snapshot(&ch.v);
    const size_t row_bytes = (size_t)c->dim * flashc_dtype_size(c->dtype);
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t t = 0; t < c->nnew; t++)
            for (int64_t h = 0; h < c->heads_kv; h++) {
                const int64_t j = c->seqlens[b] + t;
                memcpy((char *)want_k + ((char *)slot(c, &ch, &ch.k, b, j, h) - (char *)ch.k.buffer),
                       flashc_row_ptr(&kn.t, b, t, h), row_bytes);
                memcpy((char *)want_v + ((char *)slot(c, &ch, &ch.v, b, j, h) - (char *)ch.v.buffer),
                       flashc_row_ptr(&vn.t, b, t, h), row_bytes);
            }

    flashc_kvcache_problem pr = problem_of(c, &ch, slopes);
    const size_t nout = (size_t)(c->batch * c->nq * c->heads_q * c->dim);
    double *ref_o = malloc(nout * sizeof(double));
    double *ref_l = malloc((size_t)(c->batch * c->heads_q * c->nq) * sizeof(double));
    flashc_status st = flashc_ref_forward_kvcache_f64(&pr, &q.t, &ch.k.t, &ch.v.t,
                                                      c->nnew ? &kn.t : NULL,
                                                      c->nnew ? &vn.t : NULL, ref_o, ref_l);
    CHECK(st == FLASHC_OK, "%s: reference failed", what);

    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.softcap = c->softcap;
    if (c->alibi) {
        p.alibi_slopes = slopes;
        p.alibi_slopes_batch_stride = c->heads_q;
    }
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = c->seqlens;
    if (c->page_size) {
        kv.block_table = ch.table;
        kv.max_pages_per_seq = (int32_t)ch.max_pages;
    }
    const double tol = tolerance_for(c->dtype);
    for (int si = 0; splits[si] || si == 0; si++) {
        kv.num_splits = splits[si];
        tt_poison(&o);
        tt_poison(&lse);
        st = flashc_forward_kvcache(cpu, &p, &kv, &q.t, &ch.k.t, &ch.v.t,
                                    c->nnew ? &kn.t : NULL, c->nnew ? &vn.t : NULL, &o.t,
                                    &lse.t);
        CHECK(st == FLASHC_OK, "%s splits=%d: returned %s (%s)", what, splits[si],
              flashc_status_string(st), flashc_last_error());
        if (st != FLASHC_OK)
            break;
        test_error eo = compare_dense(&o, ref_o), el = compare_lse(&lse, ref_l);
        CHECK(eo.nonfinite == 0 && eo.rel <= tol, "%s splits=%d: out rel err %.3g > %.3g "
              "(%lld non-finite)", what, splits[si], eo.rel, tol, (long long)eo.nonfinite);
        CHECK(el.nonfinite == 0 && el.rel <= 1e-5, "%s splits=%d: lse rel err %.3g (%lld "
              "non-finite or -inf mismatches)", what, splits[si], el.rel,
              (long long)el.nonfinite);
        CHECK(tt_gaps_intact(&o) && tt_gaps_intact(&lse), "%s splits=%d: wrote outside out/lse",
              what, splits[si]);
        CHECK(tt_unchanged(&ch.k, want_k) && tt_unchanged(&ch.v, want_v),
              "%s splits=%d: the cache differs from the expected append", what, splits[si]);
        if (eo.rel > worst_out[c->dtype])
            worst_out[c->dtype] = eo.rel;
        if (el.rel > worst_lse)
            worst_lse = el.rel;
        /* a sequence with no key at all: O = 0 */
        for (int64_t b = 0; b < c->batch; b++)
            if (c->seqlens[b] + c->nnew == 0)
                for (int64_t h = 0; h < c->heads_q; h++)
                    for (int64_t d = 0; d < c->dim; d++)
                        CHECK(tt_get(&o, b, c->nq - 1, h, d) == 0.0, "%s: empty sequence %lld "
                              "has O != 0", what, (long long)b);
        /* against the first split count: float32 reordering only */
        double num = 0, den = 0;
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t i = 0; i < c->nq; i++)
                for (int64_t h = 0; h < c->heads_q; h++)
                    for (int64_t d = 0; d < c->dim; d++) {
                        double x = tt_get(&o, b, i, h, d);
                        float *f = (float *)flashc_row_ptr(&o1.t, b, i, h) + d;
                        if (si == 0)
                            *f = (float)x;
                        num += (x - *f) * (x - *f);
                        den += (double)*f * *f;
                    }
        double diff = den > 0 ? sqrt(num / den) : sqrt(num);
        if (diff > worst_split_diff && c->dtype == FLASHC_F32)
            worst_split_diff = diff;
        CHECK(diff <= (c->dtype == FLASHC_F32 ? 1e-5 : 2 * tol), "%s: splits=%d differs from "
              "splits=%d by %.3g", what, splits[si], splits[0], diff);
    }
    /* the reference backend through the public API: float32 outputs, the same append */
    test_tensor ro = tt_alloc(FLASHC_F32, c->batch, c->nq, c->heads_q, c->dim, LAYOUT_PADDED);
    test_tensor rl = tt_alloc_lse(c->batch, c->heads_q, c->nq, 0);
    kv.num_splits = 0;
    st = flashc_forward_kvcache(refbe, &p, &kv, &q.t, &ch.k.t, &ch.v.t, c->nnew ? &kn.t : NULL,
                                c->nnew ? &vn.t : NULL, &ro.t, &rl.t);
    CHECK(st == FLASHC_OK, "%s: reference backend returned %s (%s)", what,
          flashc_status_string(st), flashc_last_error());
    test_error ero = compare_dense(&ro, ref_o), erl = compare_lse(&rl, ref_l);
    CHECK(ero.rel <= 1e-6 && erl.rel <= 1e-6 && !ero.nonfinite && !erl.nonfinite,
          "%s: reference backend differs from float64 by %.3g / %.3g", what, ero.rel, erl.rel);
    CHECK(tt_gaps_intact(&ro) && tt_unchanged(&ch.k, want_k) && tt_unchanged(&ch.v, want_v),
          "%s: reference backend wrote outside out or the appended slots", what);
    tt_free(&ro);
    tt_free(&rl);
    free(ref_o);
    free(ref_l);
    free(want_k);
    free(want_v);
    free(slopes);
    free(ch.table);
    tt_free(&ch.k);
    tt_free(&ch.v);
    tt_free(&q);
    tt_free(&kn);
    tt_free(&vn);
    tt_free(&o);
    tt_free(&lse);
    tt_free(&o1);
}

static void test_grid(void)
{
    static const int32_t lens_mixed[4] = {17, 1, 1000, 0};
    static const int32_t lens_long[2] = {5000, 17};
    static const int32_t lens_one[1] = {1};
    const int32_t auto_only[] = {0, 0};
    const int32_t split_set[] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    const flashc_dtype dtypes[3] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
    uint64_t seed = 1;
    for (int di = 0; di < 3; di++)
        for (int paged = 0; paged < 3; paged++) /* contiguous, pages of 16, pages of 64 */
            for (int nqi = 0; nqi < 2; nqi++)
                for (int append = 0; append < 2; append++) {
                    kv_case c;
                    memset(&c, 0, sizeof c);
                    c.dtype = dtypes[di];
                    c.batch = 4;
                    c.seqlens = lens_mixed;
                    c.nq = nqi ? 4 : 1;
                    c.heads_q = 8;
                    c.heads_kv = 1;
                    /* dims that leave a partial vector of every width (8, 16, 32) */
                    c.dim = paged == 2 ? (di == 0 ? 36 : di == 1 ? 44 : 100) : di == 1 ? 40 : 64;
                    c.nnew = append ? c.nq : 0;
                    c.page_size = paged == 0 ? 0 : paged == 1 ? 16 : 64;
                    c.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
                    c.window_left = c.window_right = -1;
                    c.share_page = paged == 1 && !append;
                    run_case(&c, di == 0 && append ? split_set : auto_only, seed++);
                }
    /* long caches: 5000 keys, GQA 8:1 and 4:2, every split count; the last bf16 again in
     * pages of 16 (the tile kernels read a page's rows in place, 16 keys at a time) */
    for (int di = 0; di < 4; di++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        c.dtype = dtypes[di < 3 ? di : 2];
        c.batch = 2;
        c.seqlens = lens_long;
        c.nq = 4;
        c.heads_q = di == 2 ? 4 : 8;
        c.heads_kv = di == 2 ? 2 : 1;
        c.dim = 128;
        c.nnew = 4;
        c.page_size = di == 1 ? 64 : di == 3 ? 16 : 0;
        c.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
        c.window_left = c.window_right = -1;
        run_case(&c, split_set, seed++);
    }
    /* features: not causal, window, softcap, ALiBi, top-left causal; a cache of one key;
     * 16 new queries of an 8:1 group (128 rows: two row chunks per kv head), in bf16 too */
    for (int f = 0; f < 8; f++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        c.dtype = FLASHC_F32;
        c.batch = 4;
        c.seqlens = lens_mixed;
        c.nq = 4;
        c.heads_q = 8;
        c.heads_kv = 2;
        c.dim = 32;
        c.nnew = 2;
        c.page_size = f % 2 ? 16 : 0;
        c.causal = f == 0 ? FLASHC_CAUSAL_NONE : f == 4 ? FLASHC_CAUSAL_TOP_LEFT
                                                         : FLASHC_CAUSAL_BOTTOM_RIGHT;
        c.window_left = f == 1 ? 40 : -1;
        c.window_right = f == 1 ? 0 : -1;
        c.softcap = f == 2 ? 5.0f : 0.0f;
        c.alibi = f == 3 || f == 1;
        if (f == 5) {
            c.batch = 1;
            c.seqlens = lens_one;
            c.nnew = 0;
            c.nq = 1;
        }
        if (f >= 6) {
            c.dtype = f == 6 ? FLASHC_F32 : FLASHC_BF16;
            c.nq = c.nnew = 16;
            c.heads_kv = 1;
        }
        run_case(&c, split_set, seed++);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Error paths                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* A valid paged call with an append, and the buffers it would write. */
static test_tensor eq, ekc, evc, ekn, evn, eo, else_;
static int32_t eseq[2] = {5, 20};
static int32_t etable[2 * 2] = {3, 0, 1, 2};

typedef struct err_args {
    flashc_backend *be;
    flashc_params p;
    flashc_kvcache_params kv;
    flashc_tensor q, kc, vc, kn, vn, o, lse;
    int no_kv, no_kn, no_vn; /* pass NULL instead of kv, k_new, v_new */
} err_args;

static err_args valid(void)
{
    err_args a;
    memset(&a, 0, sizeof a);
    a.be = cpu;
    flashc_params_init(&a.p);
    flashc_kvcache_params_init(&a.kv);
    a.kv.cache_seqlens = eseq;
    a.kv.block_table = etable;
    a.kv.max_pages_per_seq = 2;
    a.q = eq.t;
    a.kc = ekc.t;
    a.vc = evc.t;
    a.kn = ekn.t;
    a.vn = evn.t;
    a.o = eo.t;
    a.lse = else_.t;
    return a;
}

static void expect(const char *label, err_args a, flashc_status want, const char *needle)
{
    test_tensor *outs[4] = {&eo, &else_, &ekc, &evc};
    void *snap[4];
    for (int i = 0; i < 4; i++)
        snap[i] = tt_snapshot(outs[i]);
    flashc_status st = flashc_forward_kvcache(a.be, &a.p, a.no_kv ? NULL : &a.kv, &a.q, &a.kc,
                                              &a.vc, a.no_kn ? NULL : &a.kn,
                                              a.no_vn ? NULL : &a.vn, &a.o, &a.lse);
    const char *msg = flashc_last_error();
    CHECK(st == want, "%s: status %s, want %s (%s)", label, flashc_status_string(st),
          flashc_status_string(want), msg);
    if (want != FLASHC_OK)
        CHECK(strstr(msg, needle) != NULL, "%s: message '%s' does not name '%s'", label, msg,
              needle);
    for (int i = 0; i < 4; i++) {
        if (want != FLASHC_OK)
            CHECK(tt_unchanged(outs[i], snap[i]), "%s: buffer %d was written on error", label, i);
        free(snap[i]);
    }
}

static void test_errors(void)
{
    test_rng rng;
    rng_seed(&rng, 99);
    /* q [2, 1, 4, 16]; pool of 4 pages of 16; table rows {3, 0}, {1, 2}; 1 new key */
    eq = tt_alloc(FLASHC_F32, 2, 1, 4, 16, LAYOUT_BSHD);
    ekc = tt_alloc(FLASHC_F32, 4, 16, 2, 16, LAYOUT_BSHD);
    evc = tt_alloc(FLASHC_F32, 4, 16, 2, 16, LAYOUT_BSHD);
    ekn = tt_alloc(FLASHC_F32, 2, 1, 2, 16, LAYOUT_BSHD);
    evn = tt_alloc(FLASHC_F32, 2, 1, 2, 16, LAYOUT_BSHD);
    eo = tt_alloc(FLASHC_F32, 2, 1, 4, 16, LAYOUT_BSHD);
    else_ = tt_alloc_lse(2, 4, 1, 0);
    test_tensor *all[] = {&eq, &ekc, &evc, &ekn, &evn};
    for (int i = 0; i < 5; i++)
        tt_fill_normal(all[i], &rng, 1.0);
    err_args a;

    a = valid();
    expect("valid call", a, FLASHC_OK, "");
    a = valid();
    a.be = NULL;
    expect("NULL backend", a, FLASHC_ERROR_NULL_POINTER, "backend");
    a = valid();
    a.no_kv = 1;
    expect("NULL kv", a, FLASHC_ERROR_NULL_POINTER, "kv");
    a = valid();
    a.kv.cache_seqlens = NULL;
    expect("NULL cache_seqlens", a, FLASHC_ERROR_NULL_POINTER, "kv.cache_seqlens");
    a = valid();
    a.kv.struct_size = 0;
    expect("kv struct_size 0", a, FLASHC_ERROR_INVALID_PARAM, "kv.struct_size");
    a = valid();
    a.kv.num_splits = FLASHC_KVCACHE_MAX_SPLITS + 1;
    expect("num_splits too large", a, FLASHC_ERROR_INVALID_PARAM, "kv.num_splits");
    a = valid();
    a.kv.num_splits = -1;
    expect("num_splits negative", a, FLASHC_ERROR_INVALID_PARAM, "kv.num_splits");
    a = valid();
    a.no_vn = 1;
    expect("k_new without v_new", a, FLASHC_ERROR_NULL_POINTER, "v_new");
    a = valid();
    a.no_kn = 1;
    expect("v_new without k_new", a, FLASHC_ERROR_NULL_POINTER, "k_new");
    a = valid();
    a.kn.shape[2] = 1;
    expect("k_new heads", a, FLASHC_ERROR_SHAPE_MISMATCH, "k_new");
    a = valid();
    a.vn.shape[1] = 1;
    a.vn.shape[3] = 8;
    expect("v_new shape", a, FLASHC_ERROR_SHAPE_MISMATCH, "v_new");
    a = valid();
    a.kc.dtype = FLASHC_F16;
    expect("k_cache dtype", a, FLASHC_ERROR_DTYPE_MISMATCH, "k_cache");
    a = valid();
    a.vc.shape[0] = 3;
    expect("v_cache shape", a, FLASHC_ERROR_SHAPE_MISMATCH, "v_cache");
    a = valid();
    a.kc.shape[3] = a.vc.shape[3] = 8;
    expect("cache head_dim", a, FLASHC_ERROR_SHAPE_MISMATCH, "k_cache");
    a = valid();
    a.q.shape[2] = 3;
    a.o.shape[2] = 3;
    expect("heads not a multiple", a, FLASHC_ERROR_INVALID_HEADS, "heads_q");
    a = valid();
    a.kc.shape[1] = a.vc.shape[1] = 12;
    expect("page size not a power of two", a, FLASHC_ERROR_INVALID_SIZE, "page_size");
    a = valid();
    a.kc.shape[1] = a.vc.shape[1] = 8;
    expect("page size below 16", a, FLASHC_ERROR_INVALID_SIZE, "page_size");
    a = valid();
    a.kv.max_pages_per_seq = 0;
    expect("max_pages_per_seq 0", a, FLASHC_ERROR_INVALID_PARAM, "kv.max_pages_per_seq");
    a = valid();
    a.kv.block_table_stride = 1;
    expect("block_table_stride too small", a, FLASHC_ERROR_INVALID_PARAM,
           "kv.block_table_stride");
    a = valid();
    a.kv.block_table = NULL;
    expect("pages fields without a table", a, FLASHC_ERROR_INVALID_PARAM, "kv.block_table");
    a = valid();
    a.kv.block_table = NULL;
    a.kv.max_pages_per_seq = 0;
    expect("contiguous cache batch", a, FLASHC_ERROR_SHAPE_MISMATCH, "k_cache");
    {
        int32_t bad[2] = {5, 32}; /* 32 + 1 new > 2 pages x 16 */
        a = valid();
        a.kv.cache_seqlens = bad;
        expect("cache_seqlens past capacity", a, FLASHC_ERROR_INVALID_PARAM,
               "kv.cache_seqlens[1]");
        int32_t neg[2] = {-1, 3};
        a.kv.cache_seqlens = neg;
        expect("cache_seqlens negative", a, FLASHC_ERROR_INVALID_PARAM, "kv.cache_seqlens[0]");
        int32_t full[2] = {31, 3}; /* 31 + 1 new fills sequence 0's two pages */
        a = valid();
        a.kv.cache_seqlens = full;
        expect("append up to the capacity", a, FLASHC_OK, "");
        full[0] = 32; /* no append: a full cache is fine */
        a.no_kn = a.no_vn = 1;
        expect("full cache without append", a, FLASHC_OK, "");
    }
    {
        int32_t table[4] = {3, 4, 1, 2}; /* page 4 does not exist (sequence 0 uses 2 pages) */
        int32_t seq[2] = {20, 3};
        a = valid();
        a.kv.block_table = table;
        a.kv.cache_seqlens = seq;
        expect("block_table entry out of range", a, FLASHC_ERROR_INVALID_PARAM,
               "kv.block_table[0][1]");
        table[1] = -1;
        expect("block_table entry negative", a, FLASHC_ERROR_INVALID_PARAM,
               "kv.block_table[0][1]");
        int32_t table_unused[4] = {3, 99, 1, 2}; /* entry 99 past sequence 0's pages: unread */
        int32_t seq_short[2] = {5, 3};
        a.kv.block_table = table_unused;
        a.kv.cache_seqlens = seq_short;
        expect("unused block_table entry", a, FLASHC_OK, "");
        int32_t table_same[4] = {3, 0, 3, 2}; /* both append into page 3, slot 5 */
        int32_t seq_same[2] = {5, 5};
        a.kv.block_table = table_same;
        a.kv.cache_seqlens = seq_same;
        expect("two sequences append into one slot", a, FLASHC_ERROR_ALIASING,
               "kv.block_table");
        a.no_kn = a.no_vn = 1;
        expect("shared page without append", a, FLASHC_OK, "");
    }
    a = valid();
    a.o.data = ekc.t.data;
    a.o = ekc.t;
    a.o.shape[0] = 2;
    a.o.shape[1] = 1;
    a.o.shape[2] = 4;
    expect("out overlaps k_cache", a, FLASHC_ERROR_ALIASING, "out");
    a = valid();
    a.vc = a.kc;
    expect("k_cache and v_cache the same memory, appending", a, FLASHC_ERROR_ALIASING, "cache");
    a = valid();
    a.kc.stride[1] = 0;
    expect("appended cache overlapping itself", a, FLASHC_ERROR_INVALID_STRIDE, "k_cache");
    a = valid();
    a.kn = a.kc;
    a.kn.shape[0] = 2;
    a.kn.shape[1] = 1;
    expect("k_new inside k_cache", a, FLASHC_ERROR_ALIASING, "k_cache");
    a = valid();
    a.lse.shape[2] = 2;
    expect("lse shape", a, FLASHC_ERROR_SHAPE_MISMATCH, "lse");
    a = valid();
    a.o.dtype = FLASHC_F16;
    expect("out dtype", a, FLASHC_ERROR_DTYPE_MISMATCH, "out");
    a = valid();
    a.p.dropout_p = 0.1f;
    expect("dropout", a, FLASHC_ERROR_UNSUPPORTED, "dropout");
    {
        int32_t cu[3] = {0, 1, 2};
        a = valid();
        a.p.cu_seqlens_q = a.p.cu_seqlens_k = cu;
        a.p.num_seqs = 2;
        expect("varlen", a, FLASHC_ERROR_UNSUPPORTED, "cu_seqlens");
    }
    a = valid();
    a.p.causal = 7;
    expect("causal mode", a, FLASHC_ERROR_INVALID_PARAM, "params.causal");
    a = valid();
    a.p.softmax_scale = NAN;
    expect("scale NaN", a, FLASHC_ERROR_INVALID_PARAM, "softmax_scale");
    {
        float slopes[4] = {0.1f, NAN, 0.2f, 0.3f};
        a = valid();
        a.p.alibi_slopes = slopes;
        expect("ALiBi slope NaN", a, FLASHC_ERROR_INVALID_PARAM, "alibi_slopes[1]");
    }
    /* params.workspace: the CPU decode takes none (the query says 0) and accepts one; one
     * that overlaps an output or an input is refused like any aliasing */
    {
        unsigned char scratch[256];
        size_t bytes = 12345;
        a = valid();
        flashc_status st = flashc_kvcache_workspace_size(a.be, &a.p, &a.kv, &a.q, &a.kc, &a.vc,
                                                         &a.kn, &a.vn, &a.o, &a.lse, &bytes);
        CHECK(st == FLASHC_OK && bytes == 0, "CPU workspace query: status %s, %zu bytes",
              flashc_status_string(st), bytes);
        st = flashc_kvcache_workspace_size(a.be, &a.p, &a.kv, &a.q, &a.kc, &a.vc, &a.kn, &a.vn,
                                           &a.o, &a.lse, NULL);
        CHECK(st == FLASHC_ERROR_NULL_POINTER, "workspace query, NULL bytes: %s",
              flashc_status_string(st));
        a.kv.cache_seqlens = NULL;
        st = flashc_kvcache_workspace_size(a.be, &a.p, &a.kv, &a.q, &a.kc, &a.vc, &a.kn, &a.vn,
                                           &a.o, &a.lse, &bytes);
        CHECK(st == FLASHC_ERROR_NULL_POINTER, "workspace query validates like the call: %s",
              flashc_status_string(st));
        a = valid();
        a.p.workspace = scratch;
        a.p.workspace_size = sizeof scratch;
        expect("a workspace the CPU does not need", a, FLASHC_OK, "");
        a = valid();
        a.p.workspace = eo.t.data;
        a.p.workspace_size = 64;
        expect("workspace overlapping out", a, FLASHC_ERROR_ALIASING, "params.workspace");
        a = valid();
        a.p.workspace = ekn.t.data;
        a.p.workspace_size = 64;
        expect("workspace overlapping k_new", a, FLASHC_ERROR_ALIASING, "params.workspace");
        a = valid();
        a.p.workspace = NULL;
        a.p.workspace_size = 64;
        expect("workspace_size without a workspace", a, FLASHC_ERROR_NULL_POINTER,
               "params.workspace");
    }
    for (int i = 0; i < 5; i++)
        tt_free(all[i]);
    tt_free(&eo);
    tt_free(&else_);
}

/* The split choice shared by the backends: no split when the work already fills the units,
 * about one wave when it does not, never more than the maximum. */
static void test_split_choice(void)
{
    CHECK(flashc_kvcache_num_splits(64, 100000, 16, 256) == 1, "many tasks: no split");
    int32_t s = flashc_kvcache_num_splits(1, 100000, 16, 256);
    CHECK(s >= 13 && s <= 16, "one task, 16 units: %d splits", s);
    CHECK(flashc_kvcache_num_splits(1, 300, 16, 256) == 1, "short cache: no split");
    CHECK(flashc_kvcache_num_splits(4, 1 << 20, 132, 128) >= 28, "132 SMs, 4 tasks");
    CHECK(flashc_kvcache_num_splits(1, 1 << 24, 1000, 1) <= FLASHC_KVCACHE_MAX_SPLITS,
          "capped at the maximum");
    /* the GPU's: the most splits in one wave of 264 blocks (132 SMs x 2) */
    CHECK(flashc_kvcache_num_splits_one_wave(4, 131072, 264, 128) == 64, "4 tasks: 64 splits");
    CHECK(flashc_kvcache_num_splits_one_wave(16, 131072, 264, 128) == 16, "16 tasks: 16 splits");
    CHECK(flashc_kvcache_num_splits_one_wave(64, 131072, 264, 128) == 4, "64 tasks: 4 splits");
    CHECK(flashc_kvcache_num_splits_one_wave(4, 4096, 264, 128) == 32, "4096 keys: 32 of 128");
    CHECK(flashc_kvcache_num_splits_one_wave(4, 200, 264, 128) == 1, "short cache: no split");
    CHECK(flashc_kvcache_num_splits_one_wave(256, 131072, 264, 128) == 1, "a wave already");
}

int main(void)
{
    if (flashc_backend_create("reference", NULL, &refbe) != FLASHC_OK) {
        fprintf(stderr, "cannot create the reference backend: %s\n", flashc_last_error());
        return 1;
    }
    test_split_choice();
    /* the grid on every micro-kernel set this processor runs */
    static const char *const isas[] = TEST_CPU_SETS;
    for (int i = 0; i < (int)(sizeof isas / sizeof isas[0]); i++) {
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.num_threads = 3; /* more than one, and not a power of two */
        cfg.cpu_isa = isas[i];
        if (flashc_backend_create("cpu", &cfg, &cpu) != FLASHC_OK)
            continue;
        printf("micro-kernels: %s\n", isas[i]);
        test_grid();
        flashc_backend_destroy(cpu);
    }
    flashc_backend_create("cpu", NULL, &cpu);
    test_errors();
    printf("kvcache vs float64: max rel err O  f32 %.2e  f16 %.2e  bf16 %.2e   LSE %.2e\n",
           worst_out[FLASHC_F32], worst_out[FLASHC_F16], worst_out[FLASHC_BF16], worst_lse);
    printf("kvcache f32: split counts 1..8 differ from 1 split by at most %.2e (rel)\n",
           worst_split_diff);
    flashc_backend_destroy(cpu);
    flashc_backend_destroy(refbe);
    return test_finish("test_kvcache");
}
