/*
 * test_gpu_decode.c - checks the CUDA backend's flashc_forward_kvcache and flashc_merge /
 * flashc_merge_accumulate against the float64 "reference" backend, through the public API.
 *
 * Decode: fresh random q, caches and new K/V per case; every cache slot at or past a
 * sequence's length is NaN (and so are the gaps between heads of the padded cache rows and
 * the spare pages of a paged pool), so a read of one shows up as a NaN in the output. out
 * and lse are poisoned with NaN before the call. The reference runs on host copies of the
 * same caches; after the call the CUDA caches must equal the reference's bit for bit (the
 * appended slots hold k_new / v_new, no other byte changed). out is held to a relative error
 * ||x - ref|| / ||ref|| of 1e-3 (fp16) or 6e-3 (bf16), lse to 2e-3 absolute, -inf exactly
 * where the reference has it, and every element finite otherwise. Each case runs with the
 * automatic split count and a few forced ones.
 *
 * Merge: parts of mixed dtypes (strided views whose gaps are NaN), rows where some parts are
 * -inf (their out rows NaN: they must not be read) and rows where all are, 1 to 40 parts
 * (beyond the 16 a launch takes), and the accumulate form, against the reference's merge.
 *
 *     test_gpu_decode [--small] [--filter SUBSTRING] [--backend NAME]
 *
 * --small runs a few small cases that reach every kernel, for compute-sanitizer. --backend
 * checks another backend the same way ("cpu": a check of the checks on a machine without a
 * GPU; the device-pointer error paths are then left out).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashc.h"
#include "gpu_test_util.h"

static flashc_backend *g_cuda, *g_ref;
static const char *g_filter, *g_backend = "cuda";
static int g_small, g_cases, g_fails, g_skips;

/* Element i of a buffer of dtype dt, and the store of x there (rounded to nearest). */
static float get_elem(const void *p, flashc_dtype dt, size_t i)
{
    return flashc_load(p, dt, (int64_t)i);
}

static void set_elem(void *p, flashc_dtype dt, size_t i, float x)
{
    flashc_store(p, dt, (int64_t)i, x);
}

static void fill_nan(void *p, flashc_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) set_elem(p, dt, i, NAN);
}

static const char *dt_name(flashc_dtype dt)
{
    return dt == FLASHC_F32 ? "f32" : dt == FLASHC_F16 ? "f16" : "bf16";
}

/* ---- device buffers ------------------------------------------------------------------------ */

static void *dev_from(const void *src, size_t bytes)
{
    void *d = NULL;
    if (flashc_backend_malloc(g_cuda, bytes ? bytes : 16, &d) != FLASHC_OK) return NULL;
    if (src && bytes &&
        flashc_backend_memcpy(g_cuda, d, src, bytes, FLASHC_COPY_TO_BACKEND) != FLASHC_OK) {
        flashc_backend_free(g_cuda, d);
        return NULL;
    }
    return d;
}

static int dev_to_host(void *dst, const void *src, size_t bytes)
{
    return flashc_backend_memcpy(g_cuda, dst, src, bytes, FLASHC_COPY_TO_HOST) == FLASHC_OK;
}

static int selected(const char *name)
{
    return !g_filter || strstr(name, g_filter);
}

static void report(const char *name, int ok, const char *msg)
{
    g_cases++;
    if (!ok) g_fails++;
    if (!ok || g_small) printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, msg[0] ? "  " : "", msg);
}

/* ---- comparison ------------------------------------------------------------------------ */

typedef struct cmp {
    double num, den, maxabs;
    long nonfinite; /* NaN/inf where the reference is finite (or the -inf pattern differs) */
    long n;
} cmp;

static void cmp_value(cmp *c, double x, double r)
{
    c->n++;
    if (isinf(r) && x == r) return;
    if (!isfinite(x) || !isfinite(r)) {
        c->nonfinite++;
        return;
    }
    double d = fabs(x - r);
    c->num += d * d;
    c->den += r * r;
    if (d > c->maxabs) c->maxabs = d;
}

static double rel_of(const cmp *c)
{
    return c->den > 0 ? sqrt(c->num / c->den) : sqrt(c->num);
}

/* =========================================================================================== */
/* Decode                                                                                      */
/* =========================================================================================== */

typedef struct dec_case {
    flashc_dtype dtype;
    int64_t batch, nq, hq, hk, dim;
    const int32_t *lens; /* [batch], before the append */
    int64_t nnew;        /* 0: no append */
    int64_t page;        /* 0: contiguous */
    int32_t causal, wl, wr;
    float softcap;
    int alibi;           /* 1: [hq] slopes, 2: [batch, hq] */
    const int32_t *splits; /* forced split counts to run besides 0 (auto), ending with -1 */
} dec_case;

static const int32_t splits_std[] = {1, 3, 17, -1};
static const int32_t splits_one[] = {-1};

static void dec_name(const dec_case *c, char *buf, size_t n)
{
    char lens[96] = "";
    size_t at = 0;
    for (int64_t b = 0; b < c->batch && at + 12 < sizeof lens; b++)
        at += (size_t)snprintf(lens + at, sizeof lens - at, "%s%d", b ? "," : "", (int)c->lens[b]);
    snprintf(buf, n,
             "decode %s b%lld lens[%s] nq%lld h%lld:%lld d%lld %s%s new%lld causal%d win(%d,%d) "
             "cap%g alibi%d",
             dt_name(c->dtype), (long long)c->batch, lens, (long long)c->nq, (long long)c->hq,
             (long long)c->hk, (long long)c->dim, c->page ? "page" : "contig",
             c->page == 16 ? "16" : c->page == 256 ? "256" : "", (long long)c->nnew, (int)c->causal,
             (int)c->wl, (int)c->wr, (double)c->softcap, c->alibi);
}

/* The device inputs and outputs of one decode call, and the host bytes its caches start from
 * (each run appends into fresh copies). */
typedef struct dec_call {
    flashc_params p;
    flashc_kvcache_params kv;
    flashc_tensor q, kc, vc, kn, vn, out, lse;
    int append;
    const void *kc_init, *vc_init, *out_poison, *lse_poison;
    size_t cache_bytes, out_bytes, lse_bytes;
} dec_call;

static flashc_status dec_run(const dec_call *c)
{
    if (flashc_backend_memcpy(g_cuda, c->kc.data, c->kc_init, c->cache_bytes, FLASHC_COPY_TO_BACKEND) ||
        flashc_backend_memcpy(g_cuda, c->vc.data, c->vc_init, c->cache_bytes, FLASHC_COPY_TO_BACKEND) ||
        flashc_backend_memcpy(g_cuda, c->out.data, c->out_poison, c->out_bytes, FLASHC_COPY_TO_BACKEND) ||
        flashc_backend_memcpy(g_cuda, c->lse.data, c->lse_poison, c->lse_bytes, FLASHC_COPY_TO_BACKEND))
        return FLASHC_ERROR_DEVICE;
    flashc_tensor kc = c->kc, vc = c->vc, out = c->out, lse = c->lse;
    flashc_status st = flashc_forward_kvcache(g_cuda, &c->p, &c->kv, &c->q, &kc, &vc,
                                              c->append ? &c->kn : NULL, c->append ? &c->vn : NULL,
                                              &out, &lse);
    return st != FLASHC_OK ? st : flashc_backend_synchronize(g_cuda, NULL);
}

/* The call again with a caller workspace of exactly the size flashc_kvcache_workspace_size
 * gives (none needed: nothing to do): the same output bits as the call that allocates its
 * own (gout, glse), and the 4 KiB past the workspace's end untouched. */
static int dec_workspace_same(const dec_call *c, const void *gout, const float *glse, char *msg,
                              size_t msg_n)
{
    dec_call w = *c;
    size_t bytes = 0;
    flashc_tensor kc = c->kc, vc = c->vc, out = c->out, lse = c->lse;
    if (flashc_kvcache_workspace_size(g_cuda, &c->p, &c->kv, &c->q, &kc, &vc, c->append ? &c->kn : NULL,
                                      c->append ? &c->vn : NULL, &out, &lse, &bytes) != FLASHC_OK) {
        snprintf(msg, msg_n, "workspace query: %s", flashc_last_error());
        return 0;
    }
    if (!bytes) return 1;
    const size_t guard = 4096;
    unsigned char *pattern = (unsigned char *)malloc(bytes + guard), *back = (unsigned char *)malloc(guard);
    void *out2 = malloc(c->out_bytes);
    float *lse2 = (float *)malloc(c->lse_bytes);
    memset(pattern, 0xA5, bytes + guard);
    void *ws = dev_from(pattern, bytes + guard);
    int ok = ws && pattern && back && out2 && lse2;
    if (!ok) snprintf(msg, msg_n, "workspace allocation: %s", flashc_last_error());
    w.p.workspace = ws;
    w.p.workspace_size = bytes;
    flashc_status st = ok ? dec_run(&w) : FLASHC_OK;
    if (ok && st != FLASHC_OK) {
        snprintf(msg, msg_n, "with a workspace of %zu bytes: %s", bytes, flashc_last_error());
        ok = 0;
    }
    if (ok && (!dev_to_host(out2, c->out.data, c->out_bytes) || !dev_to_host(lse2, c->lse.data, c->lse_bytes) ||
               !dev_to_host(back, (char *)ws + bytes, guard))) {
        snprintf(msg, msg_n, "workspace run, copy back: %s", flashc_last_error());
        ok = 0;
    }
    if (ok && (memcmp(out2, gout, c->out_bytes) || memcmp(lse2, glse, c->lse_bytes))) {
        snprintf(msg, msg_n, "with a workspace of %zu bytes: output bits differ from the call "
                 "that allocates", bytes);
        ok = 0;
    }
    if (ok && memcmp(back, pattern, guard)) {
        snprintf(msg, msg_n, "a write past the end of a %zu-byte workspace", bytes);
        ok = 0;
    }
    if (ws) flashc_backend_free(g_cuda, ws);
    free(pattern), free(back), free(out2), free(lse2);
    return ok;
}

/* One decode case: builds the host inputs, runs the reference once and the CUDA backend with
 * every split count, compares. */
static void run_decode(const dec_case *c, uint64_t seed)
{
    char name[256], msg[512] = "";
    dec_name(c, name, sizeof name);
    if (!selected(name)) return;
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, nq = c->nq, hq = c->hq, hk = c->hk, D = c->dim;
    const int64_t hstride = D + 8; /* padded cache rows: the gaps are NaN */
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++)
        if (c->lens[b] + c->nnew > longest) longest = c->lens[b] + c->nnew;
    int64_t outer, rows_per_outer, max_pages = 0, num_pages = 0;
    int32_t *table = NULL;
    if (c->page) {
        max_pages = (longest + 5 + c->page - 1) / c->page;
        num_pages = B * max_pages + 3; /* spare pages stay NaN */
        table = (int32_t *)malloc((size_t)(B * max_pages) * 4);
        int32_t *perm = (int32_t *)malloc((size_t)num_pages * 4);
        for (int64_t i = 0; i < num_pages; i++) perm[i] = (int32_t)i;
        for (int64_t i = num_pages - 1; i > 0; i--) { /* pages in a shuffled order */
            int64_t j = (int64_t)(rng_next(&seed) % (uint64_t)(i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int64_t i = 0; i < B * max_pages; i++) table[i] = perm[i];
        free(perm);
        outer = num_pages, rows_per_outer = c->page;
    } else {
        outer = B, rows_per_outer = longest + 5;
    }
    const int64_t cs[4] = {rows_per_outer * hk * hstride, hk * hstride, hstride, 1};
    const size_t cache_n = (size_t)(outer * cs[0]);
    uint16_t *kc = (uint16_t *)malloc(cache_n * 2), *vc = (uint16_t *)malloc(cache_n * 2);
    fill_nan(kc, dt, cache_n);
    fill_nan(vc, dt, cache_n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < c->lens[b]; j++) {
            int64_t o = b, s = j;
            if (c->page) o = table[b * max_pages + j / c->page], s = j % c->page;
            for (int64_t h = 0; h < hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    size_t at = (size_t)(o * cs[0] + s * cs[1] + h * cs[2] + d);
                    set_elem(kc, dt, at, (float)rng_normal(&seed));
                    set_elem(vc, dt, at, (float)rng_normal(&seed));
                }
        }
    const size_t q_n = (size_t)(B * nq * hq * D), new_n = (size_t)(B * c->nnew * hk * D);
    uint16_t *q = (uint16_t *)malloc(q_n * 2), *kn = (uint16_t *)malloc(new_n * 2 + 2),
             *vn = (uint16_t *)malloc(new_n * 2 + 2);
    for (size_t i = 0; i < q_n; i++) set_elem(q, dt, i, (float)rng_normal(&seed));
    for (size_t i = 0; i < new_n; i++) {
        set_elem(kn, dt, i, (float)rng_normal(&seed));
        set_elem(vn, dt, i, (float)rng_normal(&seed));
    }
    const int64_t nslopes = c->alibi == 2 ? B * hq : hq;
    float *slopes = (float *)malloc((size_t)nslopes * 4);
    for (int64_t i = 0; i < nslopes; i++) slopes[i] = 0.05f + 0.5f * (float)(i % hq) / (float)hq;

    /* the reference on host copies */
    uint16_t *rkc = (uint16_t *)malloc(cache_n * 2), *rvc = (uint16_t *)malloc(cache_n * 2);
    memcpy(rkc, kc, cache_n * 2);
    memcpy(rvc, vc, cache_n * 2);
    const size_t lse_n = (size_t)(B * hq * nq);
    float *rout = (float *)malloc(q_n * 4), *rlse = (float *)malloc(lse_n * 4);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.softcap = c->softcap;
    p.alibi_slopes = c->alibi ? slopes : NULL;
    p.alibi_slopes_batch_stride = c->alibi == 2 ? hq : 0;
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = c->lens;
    kv.block_table = table;
    kv.max_pages_per_seq = (int32_t)max_pages;
    flashc_tensor tq = flashc_tensor_contiguous(q, dt, B, nq, hq, D);
    flashc_tensor tkc = {rkc, dt, 4, {outer, rows_per_outer, hk, D}, {cs[0], cs[1], cs[2], 1}};
    flashc_tensor tvc = tkc;
    tvc.data = rvc;
    flashc_tensor tkn = flashc_tensor_contiguous(kn, dt, B, c->nnew, hk, D);
    flashc_tensor tvn = flashc_tensor_contiguous(vn, dt, B, c->nnew, hk, D);
    flashc_tensor tro = flashc_tensor_contiguous(rout, FLASHC_F32, B, nq, hq, D);
    flashc_tensor trl = flashc_lse_contiguous(rlse, B, hq, nq);
    const flashc_tensor *pkn = c->nnew ? &tkn : NULL, *pvn = c->nnew ? &tvn : NULL;
    int ok = 1;
    if (flashc_forward_kvcache(g_ref, &p, &kv, &tq, &tkc, &tvc, pkn, pvn, &tro, &trl) != FLASHC_OK) {
        snprintf(msg, sizeof msg, "reference: %s", flashc_last_error());
        ok = 0;
    }

    /* device copies (fresh caches for every run, so each run appends into the original) */
    void *dq = dev_from(q, q_n * 2), *dkn = dev_from(kn, new_n * 2), *dvn = dev_from(vn, new_n * 2);
    void *dlens = dev_from(c->lens, (size_t)B * 4);
    void *dtable = table ? dev_from(table, (size_t)(B * max_pages) * 4) : NULL;
    void *dslopes = dev_from(slopes, (size_t)nslopes * 4);
    void *dkc = dev_from(NULL, cache_n * 2), *dvc = dev_from(NULL, cache_n * 2);
    void *dout = dev_from(NULL, q_n * 2), *dlse = dev_from(NULL, lse_n * 4);
    uint16_t *gout = (uint16_t *)malloc(q_n * 2), *gkc = (uint16_t *)malloc(cache_n * 2),
             *gvc = (uint16_t *)malloc(cache_n * 2), *poison = (uint16_t *)malloc(q_n * 2);
    float *glse = (float *)malloc(lse_n * 4), *lpoison = (float *)malloc(lse_n * 4);
    fill_nan(poison, dt, q_n);
    for (size_t i = 0; i < lse_n; i++) lpoison[i] = NAN;
    if (ok && (!dq || !dkn || !dvn || !dlens || (table && !dtable) || !dslopes || !dkc || !dvc ||
               !dout || !dlse)) {
        snprintf(msg, sizeof msg, "device allocation: %s", flashc_last_error());
        ok = 0;
    }
    double worst_out = 0, worst_lse = 0;
    int skipped = 0;
    for (int si = -1; ok && (si < 0 || c->splits[si] >= 0); si++) {
        const int32_t splits = si < 0 ? 0 : c->splits[si];
        if (flashc_backend_memcpy(g_cuda, dkc, kc, cache_n * 2, FLASHC_COPY_TO_BACKEND) ||
            flashc_backend_memcpy(g_cuda, dvc, vc, cache_n * 2, FLASHC_COPY_TO_BACKEND) ||
            flashc_backend_memcpy(g_cuda, dout, poison, q_n * 2, FLASHC_COPY_TO_BACKEND) ||
            flashc_backend_memcpy(g_cuda, dlse, lpoison, lse_n * 4, FLASHC_COPY_TO_BACKEND)) {
            snprintf(msg, sizeof msg, "copy: %s", flashc_last_error());
            ok = 0;
            break;
        }
        flashc_params gp = p;
        gp.alibi_slopes = c->alibi ? (const float *)dslopes : NULL;
        flashc_kvcache_params gkv = kv;
        gkv.cache_seqlens = (const int32_t *)dlens;
        gkv.block_table = (const int32_t *)dtable;
        gkv.num_splits = splits;
        flashc_tensor gq = tq, gkn = tkn, gvn = tvn, gkct = tkc, gvct = tvc;
        gq.data = dq, gkn.data = dkn, gvn.data = dvn, gkct.data = dkc, gvct.data = dvc;
        flashc_tensor go = flashc_tensor_contiguous(dout, dt, B, nq, hq, D);
        flashc_tensor gl = flashc_lse_contiguous((float *)dlse, B, hq, nq);
        flashc_status st = flashc_forward_kvcache(g_cuda, &gp, &gkv, &gq, &gkct, &gvct,
                                                  c->nnew ? &gkn : NULL, c->nnew ? &gvn : NULL,
                                                  &go, &gl);
        if (st == FLASHC_ERROR_UNSUPPORTED && (c->wl >= 0 || c->wr >= 0 || c->softcap > 0 || c->alibi)) {
            snprintf(msg, sizeof msg, "skipped: %s", flashc_last_error());
            skipped = 1;
            break;
        }
        if (st != FLASHC_OK || flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
            snprintf(msg, sizeof msg, "splits %d: %s", (int)splits, flashc_last_error());
            ok = 0;
            break;
        }
        if (!dev_to_host(gout, dout, q_n * 2) || !dev_to_host(glse, dlse, lse_n * 4) ||
            !dev_to_host(gkc, dkc, cache_n * 2) || !dev_to_host(gvc, dvc, cache_n * 2)) {
            snprintf(msg, sizeof msg, "copy back: %s", flashc_last_error());
            ok = 0;
            break;
        }
        dec_call dc = {gp, gkv, gq, gkct, gvct, gkn, gvn, go, gl, c->nnew > 0, kc, vc, poison, lpoison,
                       cache_n * 2, q_n * 2, lse_n * 4};
        if (!dec_workspace_same(&dc, gout, glse, msg, sizeof msg)) {
            ok = 0;
            break;
        }
        cmp co, cl;
        memset(&co, 0, sizeof co);
        memset(&cl, 0, sizeof cl);
        for (size_t i = 0; i < q_n; i++) cmp_value(&co, get_elem(gout, dt, i), rout[i]);
        for (size_t i = 0; i < lse_n; i++) cmp_value(&cl, glse[i], rlse[i]);
        long cache_diff = 0;
        for (size_t i = 0; i < cache_n; i++) cache_diff += (gkc[i] != rkc[i]) + (gvc[i] != rvc[i]);
        const double bar = dt == FLASHC_BF16 ? 6e-3 : 1e-3;
        if (rel_of(&co) > worst_out) worst_out = rel_of(&co);
        if (cl.maxabs > worst_lse) worst_lse = cl.maxabs;
        if (co.nonfinite || cl.nonfinite || rel_of(&co) > bar || cl.maxabs > 2e-3 || cache_diff) {
            snprintf(msg, sizeof msg,
                     "splits %d: out rel %.2e (bar %.0e), lse max %.2e, non-finite out %ld lse "
                     "%ld, cache elements differing from the reference %ld",
                     (int)splits, rel_of(&co), bar, cl.maxabs, co.nonfinite, cl.nonfinite,
                     cache_diff);
            ok = 0;
        }
    }
    if (skipped) {
        g_skips++;
        printf("SKIP %s  %s\n", name, msg);
    } else {
        if (ok) snprintf(msg, sizeof msg, "out rel %.2e lse %.2e", worst_out, worst_lse);
        report(name, ok, msg);
    }
    void *devs[] = {dq, dkn, dvn, dlens, dtable, dslopes, dkc, dvc, dout, dlse};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) flashc_backend_free(g_cuda, devs[i]);
    free(table), free(kc), free(vc), free(q), free(kn), free(vn), free(slopes), free(rkc);
    free(rvc), free(rout), free(rlse), free(gout), free(gkc), free(gvc), free(poison), free(glse);
    free(lpoison);
}

static const int32_t lens5[] = {0, 1, 17, 1000, 4097};
static const int32_t lens8[] = {17, 1000, 0, 4097, 1, 300, 2048, 64};
static const int32_t lens1[] = {4097};
static const int32_t lens2[] = {1, 17};
static const int32_t lens_small[] = {0, 1, 17, 70};

static dec_case base_case(flashc_dtype dt, int64_t dim)
{
    dec_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.batch = 5, c.lens = lens5;
    c.nq = 1, c.hq = 16, c.hk = 2, c.dim = dim;
    c.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    c.wl = c.wr = -1;
    c.splits = splits_std;
    return c;
}

static void decode_grid(void)
{
    uint64_t seed = 0x5eed;
    const flashc_dtype dts[2] = {FLASHC_BF16, FLASHC_F16};
    if (g_small) {
        /* every head-dim kernel once, paged and contiguous, append, a forced split, features */
        const int64_t dims[] = {32, 40, 64, 96, 128, 192, 256};
        for (int i = 0; i < 7; i++) {
            dec_case c = base_case(i % 2 ? FLASHC_F16 : FLASHC_BF16, dims[i]);
            c.batch = 4, c.lens = lens_small, c.nq = i % 3 == 0 ? 4 : 1;
            c.nnew = i % 2 ? c.nq : 0;
            c.page = i % 3 == 1 ? 16 : 0;
            static const int32_t sp[] = {1, 3, -1};
            c.splits = sp;
            run_decode(&c, seed++);
        }
        dec_case c = base_case(FLASHC_BF16, 64);
        c.batch = 4, c.lens = lens_small, c.nq = 3, c.nnew = 3, c.page = 16;
        c.wl = 20, c.wr = 0, c.softcap = 20.0f, c.alibi = 1;
        run_decode(&c, seed++);
        c.hq = 12, c.hk = 1, c.nq = 2, c.causal = FLASHC_CAUSAL_TOP_LEFT, c.wl = 10, c.wr = 5;
        run_decode(&c, seed++);
        return;
    }
    /* A: dtype x head dim x cache layout */
    const int64_t dims[] = {64, 128, 256, 40, 96};
    const int64_t pages[] = {0, 16, 256};
    for (int di = 0; di < 2; di++)
        for (int hi = 0; hi < 5; hi++)
            for (int pi = 0; pi < 3; pi++) {
                dec_case c = base_case(dts[di], dims[hi]);
                c.page = pages[pi];
                c.nnew = 1;
                run_decode(&c, seed++);
            }
    /* B: queries x heads x append x lengths */
    const int64_t nqs[] = {1, 4, 17};
    const int64_t heads[2][2] = {{16, 2}, {12, 1}};
    for (int ni = 0; ni < 3; ni++)
        for (int hi = 0; hi < 2; hi++)
            for (int ai = 0; ai < 2; ai++)
                for (int li = 0; li < 3; li++)
                    for (int pi = 0; pi < 2; pi++) {
                        dec_case c = base_case(FLASHC_BF16, 128);
                        c.nq = nqs[ni];
                        c.hq = heads[hi][0], c.hk = heads[hi][1];
                        c.nnew = ai ? c.nq : 0;
                        c.lens = li == 0 ? lens8 : li == 1 ? lens1 : lens2;
                        c.batch = li == 0 ? 8 : li == 1 ? 1 : 2;
                        c.page = pi ? 16 : 0;
                        c.causal = (ni + li) % 3 == 2 ? FLASHC_CAUSAL_NONE : FLASHC_CAUSAL_BOTTOM_RIGHT;
                        run_decode(&c, seed++);
                    }
    /* C: the mask and score features */
    struct { int32_t causal, wl, wr; float cap; int alibi; } feats[] = {
        {FLASHC_CAUSAL_NONE, -1, -1, 0, 0},        {FLASHC_CAUSAL_TOP_LEFT, -1, -1, 0, 0},
        {FLASHC_CAUSAL_BOTTOM_RIGHT, 100, 0, 0, 0}, {FLASHC_CAUSAL_NONE, 50, 20, 0, 0},
        {FLASHC_CAUSAL_NONE, 0, 0, 0, 0},           {FLASHC_CAUSAL_NONE, -1, 3, 0, 0},
        {FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 30.0f, 0}, {FLASHC_CAUSAL_NONE, -1, -1, 5.0f, 0},
        {FLASHC_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 1}, {FLASHC_CAUSAL_NONE, -1, -1, 0, 2},
        {FLASHC_CAUSAL_TOP_LEFT, 10, 2, 20.0f, 1},  {FLASHC_CAUSAL_BOTTOM_RIGHT, 300, -1, 10.0f, 2},
    };
    for (size_t fi = 0; fi < sizeof feats / sizeof feats[0]; fi++)
        for (int di = 0; di < 2; di++)
            for (int pi = 0; pi < 2; pi++) {
                dec_case c = base_case(dts[di], di ? 64 : 128);
                c.nq = 4, c.nnew = 4;
                c.page = pi ? 256 : 0;
                c.causal = feats[fi].causal, c.wl = feats[fi].wl, c.wr = feats[fi].wr;
                c.softcap = feats[fi].cap, c.alibi = feats[fi].alibi;
                run_decode(&c, seed++);
            }
    /* D: forced split counts on one long sequence, GQA 8:1 and MQA */
    static const int32_t many[] = {1, 2, 3, 8, 16, 64, -1};
    for (int hi = 0; hi < 2; hi++) {
        dec_case c = base_case(FLASHC_BF16, 128);
        c.batch = 1, c.lens = lens1, c.hq = hi ? 8 : 32, c.hk = hi ? 1 : 4;
        c.splits = many;
        run_decode(&c, seed++);
        c.page = 16, c.nnew = 1, c.dtype = FLASHC_F16;
        run_decode(&c, seed++);
    }
    (void)splits_one;
}

/* =========================================================================================== */
/* Merge                                                                                       */
/* =========================================================================================== */

typedef struct mtensor {
    void *h, *d;        /* host and device copies of the whole extent */
    flashc_tensor t;    /* with d as its data */
    size_t extent, esize;
} mtensor;

/* An out-like [B, S, H, D] tensor with padded rows (gaps NaN), values normal. */
static mtensor make_out(flashc_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D, int padded,
                        uint64_t *seed)
{
    mtensor m;
    memset(&m, 0, sizeof m);
    const int64_t hs = D + (padded ? 3 : 0), ss = H * hs + (padded ? 5 : 0), bs = S * ss;
    m.extent = (size_t)(B * bs);
    m.esize = flashc_dtype_size(dt);
    m.h = malloc(m.extent * m.esize);
    fill_nan(m.h, dt, m.extent);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    set_elem(m.h, dt, (size_t)(b * bs + s * ss + h * hs + d), (float)rng_normal(seed));
    m.d = dev_from(m.h, m.extent * m.esize);
    flashc_tensor t = {m.d, dt, 4, {B, S, H, D}, {bs, ss, hs, 1}};
    m.t = t;
    return m;
}

/* A [B, H, S] lse: values around 2, a row -inf where (row + part) % 4 == 0 (its out row made
 * NaN, which must not be read), every part -inf on rows % 7 == 3. */
static mtensor make_lse(int64_t B, int64_t H, int64_t S, int part, mtensor *out, uint64_t *seed)
{
    mtensor m;
    memset(&m, 0, sizeof m);
    m.extent = (size_t)(B * H * S);
    m.esize = 4;
    float *l = (float *)malloc(m.extent * 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++) {
                const int64_t row = (b * H + h) * S + s;
                float v = (float)(2.0 + 3.0 * rng_normal(seed));
                if ((row + part) % 4 == 0 || row % 7 == 3) {
                    v = -INFINITY;
                    if (out) {
                        const int64_t *st = out->t.stride;
                        for (int64_t d = 0; d < out->t.shape[3]; d++)
                            set_elem(out->h, out->t.dtype, (size_t)(b * st[0] + s * st[1] + h * st[2] + d), NAN);
                    }
                }
                l[row] = v;
            }
    m.h = l;
    m.d = dev_from(l, m.extent * 4);
    m.t = flashc_lse_contiguous((float *)m.d, B, H, S);
    if (out) flashc_backend_memcpy(g_cuda, out->d, out->h, out->extent * out->esize, FLASHC_COPY_TO_BACKEND);
    return m;
}

static void free_m(mtensor *m)
{
    flashc_backend_free(g_cuda, m->d);
    free(m->h);
}

/* A view of m with host data, for the reference. */
static flashc_tensor host_view(const mtensor *m)
{
    flashc_tensor t = m->t;
    t.data = m->h;
    return t;
}

/* Compares the device result (copied back into got) with the reference's host result. */
static int compare_merge(const mtensor *out, const mtensor *lse, const void *ref_out,
                         const float *ref_lse, char *msg, size_t n)
{
    void *got = malloc(out->extent * out->esize);
    float *gl = (float *)malloc(lse->extent * 4);
    int ok = dev_to_host(got, out->d, out->extent * out->esize) && dev_to_host(gl, lse->d, lse->extent * 4);
    if (!ok) {
        snprintf(msg, n, "copy back: %s", flashc_last_error());
        free(got), free(gl);
        return 0;
    }
    cmp co, cl;
    memset(&co, 0, sizeof co);
    memset(&cl, 0, sizeof cl);
    const flashc_tensor *t = &out->t;
    long gap = 0;
    unsigned char *inview = (unsigned char *)calloc(out->extent, 1);
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    size_t at = (size_t)(b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d);
                    inview[at] = 1;
                    cmp_value(&co, get_elem(got, t->dtype, at), get_elem(ref_out, t->dtype, at));
                }
    for (size_t i = 0; i < out->extent; i++)
        if (!inview[i] && memcmp((char *)got + i * out->esize, (char *)ref_out + i * out->esize, out->esize))
            gap++;
    for (size_t i = 0; i < lse->extent; i++) cmp_value(&cl, gl[i], ref_lse[i]);
    const double bar = t->dtype == FLASHC_F32 ? 1e-5 : t->dtype == FLASHC_F16 ? 1e-3 : 8e-3;
    ok = !co.nonfinite && !cl.nonfinite && rel_of(&co) <= bar && cl.maxabs <= 1e-4 && !gap;
    snprintf(msg, n, "out rel %.2e (bar %.0e) lse max %.2e non-finite %ld/%ld gap writes %ld",
             rel_of(&co), bar, cl.maxabs, co.nonfinite, cl.nonfinite, gap);
    free(got), free(gl), free(inview);
    return ok;
}

static void run_merge(int n, flashc_dtype out_dt, int64_t D, uint64_t seed)
{
    char name[160], msg[512] = "";
    snprintf(name, sizeof name, "merge n%d out %s d%lld parts mixed", n, dt_name(out_dt), (long long)D);
    if (!selected(name)) return;
    const int64_t B = 2, S = 3, H = 5;
    const flashc_dtype dts[3] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
    mtensor *po = (mtensor *)calloc((size_t)n, sizeof *po), *pl = (mtensor *)calloc((size_t)n, sizeof *pl);
    flashc_tensor *go = (flashc_tensor *)calloc((size_t)n, sizeof *go), *gl = (flashc_tensor *)calloc((size_t)n, sizeof *gl);
    flashc_tensor *ho = (flashc_tensor *)calloc((size_t)n, sizeof *ho), *hl = (flashc_tensor *)calloc((size_t)n, sizeof *hl);
    for (int i = 0; i < n; i++) {
        po[i] = make_out(dts[(i + (int)D) % 3], B, S, H, D, i % 2, &seed);
        pl[i] = make_lse(B, H, S, i, &po[i], &seed);
        go[i] = po[i].t, gl[i] = pl[i].t;
        ho[i] = host_view(&po[i]), hl[i] = host_view(&pl[i]);
    }
    mtensor out = make_out(out_dt, B, S, H, D, 1, &seed), lse = make_lse(B, H, S, 0, NULL, &seed);
    /* poison the outputs; the reference writes the same host buffers' copies */
    fill_nan(out.h, out_dt, out.extent);
    for (size_t i = 0; i < lse.extent; i++) ((float *)lse.h)[i] = NAN;
    flashc_backend_memcpy(g_cuda, out.d, out.h, out.extent * out.esize, FLASHC_COPY_TO_BACKEND);
    flashc_backend_memcpy(g_cuda, lse.d, lse.h, lse.extent * 4, FLASHC_COPY_TO_BACKEND);
    flashc_tensor hout = host_view(&out), hlse = host_view(&lse);
    int ok = 1;
    if (flashc_merge(g_ref, NULL, n, ho, hl, &hout, &hlse) != FLASHC_OK) {
        snprintf(msg, sizeof msg, "reference: %s", flashc_last_error());
        ok = 0;
    } else if (flashc_merge(g_cuda, NULL, n, go, gl, &out.t, &lse.t) != FLASHC_OK ||
               flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
        snprintf(msg, sizeof msg, "cuda: %s", flashc_last_error());
        ok = 0;
    } else {
        ok = compare_merge(&out, &lse, out.h, (const float *)lse.h, msg, sizeof msg);
    }
    report(name, ok, msg);
    for (int i = 0; i < n; i++) free_m(&po[i]), free_m(&pl[i]);
    free_m(&out), free_m(&lse);
    free(po), free(pl), free(go), free(gl), free(ho), free(hl);
}

static void run_accumulate(flashc_dtype acc_dt, flashc_dtype part_dt, int64_t D, uint64_t seed)
{
    char name[160], msg[512] = "";
    snprintf(name, sizeof name, "merge_accumulate acc %s part %s d%lld", dt_name(acc_dt),
             dt_name(part_dt), (long long)D);
    if (!selected(name)) return;
    const int64_t B = 3, S = 2, H = 4;
    mtensor acc = make_out(acc_dt, B, S, H, D, 1, &seed);
    mtensor acc_l = make_lse(B, H, S, 1, &acc, &seed); /* -inf rows: an empty accumulator there */
    mtensor part = make_out(part_dt, B, S, H, D, 0, &seed);
    mtensor part_l = make_lse(B, H, S, 2, &part, &seed);
    flashc_tensor ha = host_view(&acc), hal = host_view(&acc_l), hp = host_view(&part),
                  hpl = host_view(&part_l);
    int ok = 1;
    if (flashc_merge_accumulate(g_ref, NULL, &ha, &hal, &hp, &hpl) != FLASHC_OK) {
        snprintf(msg, sizeof msg, "reference: %s", flashc_last_error());
        ok = 0;
    } else if (flashc_merge_accumulate(g_cuda, NULL, &acc.t, &acc_l.t, &part.t, &part_l.t) != FLASHC_OK ||
               flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
        snprintf(msg, sizeof msg, "cuda: %s", flashc_last_error());
        ok = 0;
    } else {
        ok = compare_merge(&acc, &acc_l, acc.h, (const float *)acc_l.h, msg, sizeof msg);
    }
    report(name, ok, msg);
    free_m(&acc), free_m(&acc_l), free_m(&part), free_m(&part_l);
}

static void merge_grid(void)
{
    uint64_t seed = 0xa11ce;
    const flashc_dtype dts[3] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
    const int ns_full[] = {1, 2, 5, 16, 17, 40}, ns_small[] = {2, 17};
    const int64_t ds_full[] = {128, 64, 40, 3}, ds_small[] = {64, 3};
    const int nn = g_small ? 2 : 6, nd = g_small ? 2 : 4;
    for (int ni = 0; ni < nn; ni++)
        for (int di = 0; di < nd; di++)
            for (int oi = 0; oi < 3; oi++)
                run_merge(g_small ? ns_small[ni] : ns_full[ni], dts[oi], g_small ? ds_small[di] : ds_full[di], seed++);
    for (int ai = 0; ai < 3; ai++)
        for (int pi = 0; pi < 3; pi++) run_accumulate(dts[ai], dts[pi], g_small ? 64 : 128, seed++);
    run_accumulate(FLASHC_BF16, FLASHC_F16, 40, seed++);
}

/* =========================================================================================== */
/* Error paths                                                                                 */
/* =========================================================================================== */

static int expect_status(const char *what, flashc_status got, flashc_status want)
{
    int ok = got == want;
    printf("  %-62s %s  (%s)\n", what, ok ? "PASS" : "FAIL", got == FLASHC_OK ? "ok" : flashc_last_error());
    return ok;
}

static int error_paths(void)
{
    int fails = 0;
    const int64_t B = 2, cap = 64, H = 2, D = 64;
    const size_t cn = (size_t)(B * cap * H * D);
    int32_t lens[2] = {5, 9};
    void *q = dev_from(NULL, (size_t)(B * H * D) * 2 * 2), *kc = dev_from(NULL, cn * 2),
         *vc = dev_from(NULL, cn * 2), *o = dev_from(NULL, (size_t)(B * H * D) * 2 * 2),
         *l = dev_from(NULL, (size_t)(B * H) * 4 * 2), *dl = dev_from(lens, sizeof lens);
    uint16_t *host = (uint16_t *)calloc(cn, 2);
    if (!q || !kc || !vc || !o || !l || !dl || !host) {
        printf("  error paths: allocation failed: %s\n", flashc_last_error());
        return 1;
    }
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    kv.cache_seqlens = (const int32_t *)dl;
    flashc_tensor tq = flashc_tensor_contiguous(q, FLASHC_BF16, B, 1, H, D);
    flashc_tensor tk = flashc_tensor_contiguous(kc, FLASHC_BF16, B, cap, H, D);
    flashc_tensor tv = flashc_tensor_contiguous(vc, FLASHC_BF16, B, cap, H, D);
    flashc_tensor to = flashc_tensor_contiguous(o, FLASHC_BF16, B, 1, H, D);
    flashc_tensor tl = flashc_lse_contiguous((float *)l, B, H, 1);
    fails += !expect_status("decode: a valid call works",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                            FLASHC_OK);
    flashc_tensor th = tk;
    th.data = host;
    fails += !expect_status("decode: host k_cache is rejected",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tq, &th, &tv, NULL, NULL, &to, &tl),
                            FLASHC_ERROR_INVALID_POINTER);
    flashc_kvcache_params hkv = kv;
    hkv.cache_seqlens = lens;
    fails += !expect_status("decode: host cache_seqlens is rejected",
                            flashc_forward_kvcache(g_cuda, NULL, &hkv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                            FLASHC_ERROR_INVALID_POINTER);
    flashc_tensor tmis = tq;
    tmis.data = (uint16_t *)q + 4;
    flashc_tensor tomis = to;
    tomis.data = (uint16_t *)o + 4;
    fails += !expect_status("decode: q off 16-byte alignment is rejected",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tmis, &tk, &tv, NULL, NULL, &tomis, &tl),
                            FLASHC_ERROR_INVALID_POINTER);
    flashc_tensor tq36 = flashc_tensor_contiguous(q, FLASHC_BF16, B, 1, H, 36);
    flashc_tensor tk36 = flashc_tensor_contiguous(kc, FLASHC_BF16, B, cap, H, 36);
    flashc_tensor tv36 = flashc_tensor_contiguous(vc, FLASHC_BF16, B, cap, H, 36);
    flashc_tensor to36 = flashc_tensor_contiguous(o, FLASHC_BF16, B, 1, H, 36);
    fails += !expect_status("decode: head_dim 36 is refused",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tq36, &tk36, &tv36, NULL, NULL, &to36, &tl),
                            FLASHC_ERROR_INVALID_HEAD_DIM);
    flashc_tensor tqf = flashc_tensor_contiguous(q, FLASHC_F32, B, 1, H, D / 2);
    flashc_tensor tkf = flashc_tensor_contiguous(kc, FLASHC_F32, B, cap, H, D / 2);
    flashc_tensor tvf = flashc_tensor_contiguous(vc, FLASHC_F32, B, cap, H, D / 2);
    flashc_tensor tof = flashc_tensor_contiguous(o, FLASHC_F32, B, 1, H, D / 2);
    fails += !expect_status("decode: float32 caches are refused",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tqf, &tkf, &tvf, NULL, NULL, &tof, &tl),
                            FLASHC_ERROR_UNSUPPORTED);
    flashc_tensor ho = to;
    ho.data = host;
    flashc_tensor tl_part = flashc_lse_contiguous((float *)l + B * H, B, H, 1);
    fails += !expect_status("merge: a host part is rejected",
                            flashc_merge(g_cuda, NULL, 1, &ho, &tl_part, &to, &tl),
                            FLASHC_ERROR_INVALID_POINTER);
    {
        /* a caller workspace: the query's size works; one byte less, an address off 256-byte
         * alignment or host memory are refused before anything is written */
        flashc_kvcache_params skv = kv;
        skv.num_splits = 4;
        size_t need = 0;
        fails += !expect_status("decode: workspace query",
                                flashc_kvcache_workspace_size(g_cuda, NULL, &skv, &tq, &tk, &tv, NULL,
                                                              NULL, &to, &tl, &need),
                                FLASHC_OK);
        if (need == 0) {
            printf("  %-62s FAIL  (4 splits need a workspace, the query says 0)\n", "decode: workspace size");
            fails++;
        }
        void *ws = dev_from(NULL, need + 512);
        flashc_params wp;
        flashc_params_init(&wp);
        wp.workspace = ws;
        wp.workspace_size = need;
        fails += !expect_status("decode: a workspace of the queried size works",
                                flashc_forward_kvcache(g_cuda, &wp, &skv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                                FLASHC_OK);
        wp.workspace_size = need - 1;
        fails += !expect_status("decode: a workspace one byte short is refused",
                                flashc_forward_kvcache(g_cuda, &wp, &skv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                                FLASHC_ERROR_WORKSPACE_TOO_SMALL);
        wp.workspace = (char *)ws + 16;
        wp.workspace_size = need;
        fails += !expect_status("decode: a workspace off 256-byte alignment is refused",
                                flashc_forward_kvcache(g_cuda, &wp, &skv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                                FLASHC_ERROR_INVALID_POINTER);
        void *hws = aligned_alloc(256, (need + 255) / 256 * 256); /* refused as host memory */
        wp.workspace = hws;
        fails += !expect_status("decode: a host workspace is refused",
                                flashc_forward_kvcache(g_cuda, &wp, &skv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                                FLASHC_ERROR_INVALID_POINTER);
        free(hws);
        flashc_backend_free(g_cuda, ws);
    }
    fails += !expect_status("decode: a valid call after the errors still works",
                            flashc_forward_kvcache(g_cuda, NULL, &kv, &tq, &tk, &tv, NULL, NULL, &to, &tl),
                            FLASHC_OK);
    void *devs[] = {q, kc, vc, o, l, dl};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) flashc_backend_free(g_cuda, devs[i]);
    free(host);
    return fails;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) g_backend = argv[++i];
        else { fprintf(stderr, "usage: %s [--small] [--filter S] [--backend NAME]\n", argv[0]); return 2; }
    }
    if (flashc_backend_create(g_backend, NULL, &g_cuda) != FLASHC_OK) {
        printf("%s backend unavailable: %s\n", g_backend, flashc_last_error());
        return 1;
    }
    if (flashc_backend_create("reference", NULL, &g_ref) != FLASHC_OK) {
        printf("reference backend unavailable: %s\n", flashc_last_error());
        return 1;
    }
    printf("%s\n", flashc_backend_describe(g_cuda));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    decode_grid();
    merge_grid();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int efails = 0;
    if (flashc_backend_uses_device_memory(g_cuda)) {
        printf("error paths:\n");
        efails = error_paths();
    }
    printf("\nsummary: %d cases in %.1f s, %d failed, %d skipped (features the backend does not "
           "advertise); error paths: %d failed\n",
           g_cases, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec), g_fails, g_skips,
           efails);
    flashc_backend_destroy(g_ref);
    flashc_backend_destroy(g_cuda);
    return g_fails || efails ? 1 : 0;
}
