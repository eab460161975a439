/*
 * test_gpu.c - checks the CUDA backend against the float64 "reference" backend of the same
 * library, through the public API only.
 *
 * For every case: fresh random inputs (their gaps, in strided views, filled with NaN so that
 * a read outside the view shows), outputs poisoned with NaN over their whole extent, the
 * CUDA forward and then the backward from the CUDA forward's own O and LSE; the reference
 * computes O, LSE, dQ, dK, dV in float64 (float32 outputs). Reported per tensor: the relative
 * error ||x - ref|| / ||ref||, held to 5e-4 (fp16) or 5e-3 (bf16); every element of a view
 * must be written and finite (LSE -inf exactly where the reference has it), and no element
 * outside a view may change. The seed checks compare elementwise with their own atol/rtol.
 * Deterministic cases run the backward twice and require bitwise-equal gradients.
 *
 * The feature cases (sliding window, softcap, ALiBi per head or per sequence, dropout,
 * variable-length batches with empty and single-row sequences, and their combinations) go
 * through the same comparison: the reference gets the same parameters with host copies of
 * the offsets and slopes. Dropout is compared with the same seed against the reference, which
 * draws the same keep bits, and its cases run the forward twice (and the deterministic
 * backward twice) to require bitwise-equal results.
 *
 *     test_gpu [--small] [--threads N] [--filter SUBSTRING]
 *
 * --small runs a few small shapes that reach every kernel, for compute-sanitizer.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashc.h"
#include "gpu_test_util.h"

enum { LAYOUT_BSHD, LAYOUT_BHSD, LAYOUT_PADDED, LAYOUT_FLAT };
static const char *layout_names[] = {"bshd", "bhsd", "padded", "flat"};
enum { T_OUT, T_LSE, T_DQ, T_DK, T_DV, T_COUNT };
static const char *tensor_names[T_COUNT] = {"out", "lse", "dq", "dk", "dv"};

typedef struct gpu_case {
    char name[160];
    flashc_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int causal;
    float scale;
    int layout;
    double input_std;
    int deterministic;
    double atol, rtol; /* > 0: an elementwise seed check instead of the relative-error bar */
    int check_lse;     /* seed checks: compare LSE too */
    /* features (window -1 = unbounded) */
    int window_left, window_right;
    float softcap;
    int alibi;                   /* 0 off, 1 one slope per head, 2 per (sequence, head) */
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    int nseq;                    /* > 0: varlen, lq / lk the sequence lengths */
    int32_t lq[8], lk[8];
    int max_given;               /* varlen: pass the exact max_seqlen (else 0: flashc's bound) */
    int repeat;                  /* run the forward twice: the same bits */
    /* results */
    double rel[T_COUNT], maxabs[T_COUNT];
    int ok, ran;
    char msg[512];
} gpu_case;

static flashc_backend *g_cuda;


/* ---- strided views ---------------------------------------------------------------------- */

typedef struct view {
    flashc_tensor t;
    size_t extent; /* elements from data[0] to the last element of the view, plus one */
} view;

static view make_view(flashc_dtype dt, int layout, int64_t b, int64_t n, int64_t h, int64_t d)
{
    view v;
    memset(&v, 0, sizeof v);
    int64_t st[4];
    switch (layout) {
    case LAYOUT_BHSD: st[0] = h * n * d, st[1] = d, st[2] = n * d; break;
    case LAYOUT_PADDED: st[2] = d + 8, st[1] = h * (d + 8) + 8, st[0] = n * st[1] + 16; break;
    default: st[0] = n * h * d, st[1] = h * d, st[2] = d; break;
    }
    st[3] = 1;
    v.t.data = NULL;
    v.t.dtype = dt;
    v.t.ndim = 4;
    v.t.shape[0] = b, v.t.shape[1] = n, v.t.shape[2] = h, v.t.shape[3] = d;
    for (int i = 0; i < 4; i++) v.t.stride[i] = st[i];
    v.extent = (size_t)(1 + (b - 1) * st[0] + (n - 1) * st[1] + (h - 1) * st[2] + (d - 1));
    return v;
}

/* Marks the elements of the view in a map of extent bytes. */
static unsigned char *view_map(const view *v)
{
    unsigned char *m = (unsigned char *)calloc(v->extent, 1);
    if (!m) return NULL;
    const int64_t *s = v->t.stride, *n = v->t.shape;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t i = 0; i < n[1]; i++)
            for (int64_t h = 0; h < n[2]; h++)
                memset(m + b * s[0] + i * s[1] + h * s[2], 1, (size_t)n[3]);
    return m;
}

/* Host buffer of a view's extent: the view's elements normal(0, std), the gaps NaN. */
static uint16_t *random_host(const view *v, double std, uint64_t *seed)
{
    uint16_t *x = (uint16_t *)malloc(v->extent * 2);
    unsigned char *m = view_map(v);
    if (!x || !m) { free(x); free(m); return NULL; }
    for (size_t i = 0; i < v->extent; i++)
        x[i] = m[i] ? to_half(v->t.dtype, (float)(std * rng_normal(seed))) : half_nan(v->t.dtype);
    free(m);
    return x;
}

/* ---- comparison ------------------------------------------------------------------------- */

typedef struct cmp {
    double num, den, maxabs;
    long bad_elem;   /* elementwise seed-check failures */
    long nonfinite;  /* NaN/inf where the reference is finite, or unwritten */
    long gap_writes; /* elements outside the view that changed */
} cmp;

static void cmp_value(cmp *c, double x, double r, double atol, double rtol)
{
    if (isinf(r) && x == r) return;
    if (!isfinite(x) || !isfinite(r)) { c->nonfinite++; return; }
    double d = fabs(x - r);
    c->num += d * d;
    c->den += r * r;
    if (d > c->maxabs) c->maxabs = d;
    if (atol > 0 && d > atol + rtol * fabs(r)) c->bad_elem++;
}

/* Compares a 16-bit strided device result (copied to host) with a contiguous f32 reference
 * [b][n][h][d], and checks that the gaps still hold the poison. */
static cmp compare_view(const view *v, const uint16_t *got, const float *ref, double atol, double rtol)
{
    cmp c;
    memset(&c, 0, sizeof c);
    const int64_t *s = v->t.stride, *n = v->t.shape;
    unsigned char *m = view_map(v);
    size_t r = 0;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t i = 0; i < n[1]; i++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++)
                    cmp_value(&c, from_half(v->t.dtype, got[b * s[0] + i * s[1] + h * s[2] + d]), ref[r++],
                              atol, rtol);
    if (m) {
        uint16_t poison = half_nan(v->t.dtype);
        for (size_t i = 0; i < v->extent; i++)
            if (!m[i] && got[i] != poison) c.gap_writes++;
        free(m);
    }
    return c;
}

static double rel_of(const cmp *c)
{
    return c->den > 0 ? sqrt(c->num / c->den) : sqrt(c->num);
}

/* ---- one case ----------------------------------------------------------------------------- */

typedef struct dev_buf {
    void *p;
} dev_buf;

static int dev_alloc_copy(void **dst, const void *src, size_t bytes, gpu_case *c, const char *what)
{
    if (flashc_backend_malloc(g_cuda, bytes, dst) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "malloc %s: %s", what, flashc_last_error());
        return 0;
    }
    if (src && flashc_backend_memcpy(g_cuda, *dst, src, bytes, FLASHC_COPY_TO_BACKEND) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "copy %s: %s", what, flashc_last_error());
        return 0;
    }
    return 1;
}

static int to_host(void *dst, const void *src, size_t bytes, gpu_case *c)
{
    if (flashc_backend_memcpy(g_cuda, dst, src, bytes, FLASHC_COPY_TO_HOST) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "copy back: %s", flashc_last_error());
        return 0;
    }
    return 1;
}

static void run_case(gpu_case *c, uint64_t seed)
{
    const flashc_dtype dt = c->dtype;
    const int64_t B = c->batch, Nq = c->seqlen_q, Nk = c->seqlen_k, Hq = c->heads_q, Hk = c->heads_kv,
                  D = c->head_dim;
    view vq, vk, vv, vo, vdo, vdq, vdk, vdv;
    if (c->layout == LAYOUT_FLAT) { /* [batch*heads, seqlen, head_dim]: heads folded into batch */
        vq = make_view(dt, LAYOUT_BSHD, B * Hq, Nq, 1, D);
        vk = make_view(dt, LAYOUT_BSHD, B * Hk, Nk, 1, D);
    } else {
        vq = make_view(dt, c->layout, B, Nq, Hq, D);
        vk = make_view(dt, c->layout, B, Nk, Hk, D);
    }
    vv = vk, vo = vq, vdo = vq, vdq = vq, vdk = vk, vdv = vk;
    const int64_t rB = vq.t.shape[0], rHq = vq.t.shape[2], rHk = vk.t.shape[2];
    const size_t nq = (size_t)(rB * Nq * rHq * D), nk = (size_t)(rB * Nk * rHk * D), nl = (size_t)(rB * rHq * Nq);

    uint16_t *hq = random_host(&vq, c->input_std, &seed), *hk = random_host(&vk, c->input_std, &seed),
             *hv = random_host(&vv, c->input_std, &seed), *hdo = random_host(&vdo, 1.0, &seed);
    uint16_t *poison_q = (uint16_t *)malloc(vq.extent * 2), *poison_k = (uint16_t *)malloc(vk.extent * 2);
    float *poison_l = (float *)malloc(nl * 4);
    uint16_t *go = (uint16_t *)malloc(vq.extent * 2), *gdq = (uint16_t *)malloc(vq.extent * 2),
             *gdk = (uint16_t *)malloc(vk.extent * 2), *gdv = (uint16_t *)malloc(vk.extent * 2),
             *gdq2 = (uint16_t *)malloc(vq.extent * 2), *gdk2 = (uint16_t *)malloc(vk.extent * 2),
             *gdv2 = (uint16_t *)malloc(vk.extent * 2);
    float *glse = (float *)malloc(nl * 4), *glse2 = (float *)malloc(nl * 4);
    uint16_t *go2 = (uint16_t *)malloc(vq.extent * 2);
    float *ro = (float *)malloc(nq * 4), *rlse = (float *)malloc(nl * 4), *rdq = (float *)malloc(nq * 4),
          *rdk = (float *)malloc(nk * 4), *rdv = (float *)malloc(nk * 4);
    void *dq_ = NULL, *dk_ = NULL, *dv_ = NULL, *ddo = NULL, *dout = NULL, *dlse = NULL, *ddq = NULL,
         *ddk = NULL, *ddv = NULL, *dcuq = NULL, *dcuk = NULL, *dslopes = NULL;
    int32_t cuq[9] = {0}, cuk[9] = {0}, maxq = 0, maxk = 0;
    const int64_t n_slopes = (c->alibi == 2 ? (c->nseq ? c->nseq : B) : 1) * Hq;
    float *slopes = (float *)malloc((size_t)n_slopes * sizeof(float));
    flashc_backend *ref = NULL;
    c->ok = 0;
    if (!hq || !hk || !hv || !hdo || !poison_q || !poison_k || !poison_l || !go || !gdq || !gdk || !gdv ||
        !gdq2 || !gdk2 || !gdv2 || !glse || !ro || !rlse || !rdq || !rdk || !rdv || !glse2 || !go2 || !slopes) {
        snprintf(c->msg, sizeof c->msg, "host out of memory");
        goto done;
    }
    for (size_t i = 0; i < vq.extent; i++) poison_q[i] = half_nan(dt);
    for (size_t i = 0; i < vk.extent; i++) poison_k[i] = half_nan(dt);
    for (size_t i = 0; i < nl; i++) poison_l[i] = NAN;

    if (!dev_alloc_copy(&dq_, hq, vq.extent * 2, c, "q") || !dev_alloc_copy(&dk_, hk, vk.extent * 2, c, "k") ||
        !dev_alloc_copy(&dv_, hv, vk.extent * 2, c, "v") || !dev_alloc_copy(&ddo, hdo, vq.extent * 2, c, "dout") ||
        !dev_alloc_copy(&dout, poison_q, vq.extent * 2, c, "out") ||
        !dev_alloc_copy(&dlse, poison_l, nl * 4, c, "lse") ||
        !dev_alloc_copy(&ddq, poison_q, vq.extent * 2, c, "dq") ||
        !dev_alloc_copy(&ddk, poison_k, vk.extent * 2, c, "dk") ||
        !dev_alloc_copy(&ddv, poison_k, vk.extent * 2, c, "dv"))
        goto done;
    for (int b = 0; b < c->nseq; b++) {
        cuq[b + 1] = cuq[b] + c->lq[b], cuk[b + 1] = cuk[b] + c->lk[b];
        maxq = c->lq[b] > maxq ? c->lq[b] : maxq, maxk = c->lk[b] > maxk ? c->lk[b] : maxk;
    }
    /* ALiBi slopes in the usual geometric series, varied per sequence when per-sequence */
    for (int64_t i = 0; i < n_slopes; i++)
        slopes[i] = (float)(pow(2.0, -8.0 * (double)(i % Hq + 1) / (double)Hq) * (1.0 + 0.25 * (double)(i / Hq)));
    if (c->nseq && (!dev_alloc_copy(&dcuq, cuq, (size_t)(c->nseq + 1) * 4, c, "cu_seqlens_q") ||
                    !dev_alloc_copy(&dcuk, cuk, (size_t)(c->nseq + 1) * 4, c, "cu_seqlens_k")))
        goto done;
    if (c->alibi && !dev_alloc_copy(&dslopes, slopes, (size_t)n_slopes * sizeof(float), c, "alibi_slopes"))
        goto done;

    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal;
    p.softmax_scale = c->scale;
    p.deterministic = c->deterministic;
    p.window_left = c->window_left, p.window_right = c->window_right;
    p.softcap = c->softcap;
    p.dropout_p = c->dropout_p, p.dropout_seed = c->dropout_seed, p.dropout_offset = c->dropout_offset;
    if (c->alibi) {
        p.alibi_slopes = (const float *)dslopes;
        p.alibi_slopes_batch_stride = c->alibi == 2 ? Hq : 0;
    }
    if (c->nseq) {
        p.cu_seqlens_q = (const int32_t *)dcuq, p.cu_seqlens_k = (const int32_t *)dcuk;
        p.num_seqs = c->nseq;
        if (c->max_given) p.max_seqlen_q = maxq, p.max_seqlen_k = maxk;
    }
    flashc_tensor tq = vq.t, tk = vk.t, tv = vv.t, to = vo.t, tdo = vdo.t, tdq = vdq.t, tdk = vdk.t, tdv = vdv.t;
    tq.data = dq_, tk.data = dk_, tv.data = dv_, to.data = dout, tdo.data = ddo, tdq.data = ddq, tdk.data = ddk,
    tdv.data = ddv;
    flashc_tensor tl = flashc_lse_contiguous((float *)dlse, rB, rHq, Nq);
    if (flashc_forward(g_cuda, &p, &tq, &tk, &tv, &to, &tl) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "cuda forward: %s", flashc_last_error());
        goto done;
    }
    if (flashc_backward(g_cuda, &p, &tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "cuda backward: %s", flashc_last_error());
        goto done;
    }
    if (flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "cuda synchronize: %s", flashc_last_error());
        goto done;
    }
    if (!to_host(go, dout, vq.extent * 2, c) || !to_host(glse, dlse, nl * 4, c) ||
        !to_host(gdq, ddq, vq.extent * 2, c) || !to_host(gdk, ddk, vk.extent * 2, c) ||
        !to_host(gdv, ddv, vk.extent * 2, c))
        goto done;
    int det_ok = 1, rep_ok = 1;
    if (c->repeat) { /* a second forward into re-poisoned outputs must give the same bits */
        if (flashc_backend_memcpy(g_cuda, dout, poison_q, vq.extent * 2, FLASHC_COPY_TO_BACKEND) != FLASHC_OK ||
            flashc_backend_memcpy(g_cuda, dlse, poison_l, nl * 4, FLASHC_COPY_TO_BACKEND) != FLASHC_OK ||
            flashc_forward(g_cuda, &p, &tq, &tk, &tv, &to, &tl) != FLASHC_OK ||
            flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
            snprintf(c->msg, sizeof c->msg, "cuda forward (2nd): %s", flashc_last_error());
            goto done;
        }
        if (!to_host(go2, dout, vq.extent * 2, c) || !to_host(glse2, dlse, nl * 4, c))
            goto done;
        rep_ok = !memcmp(go, go2, vq.extent * 2) && !memcmp(glse, glse2, nl * 4);
    }
    if (c->deterministic) { /* a second backward must give the same bits */
        flashc_backend_memcpy(g_cuda, ddq, poison_q, vq.extent * 2, FLASHC_COPY_TO_BACKEND);
        if (flashc_backward(g_cuda, &p, &tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv) != FLASHC_OK ||
            flashc_backend_synchronize(g_cuda, NULL) != FLASHC_OK) {
            snprintf(c->msg, sizeof c->msg, "cuda backward (2nd): %s", flashc_last_error());
            goto done;
        }
        if (!to_host(gdq2, ddq, vq.extent * 2, c) || !to_host(gdk2, ddk, vk.extent * 2, c) ||
            !to_host(gdv2, ddv, vk.extent * 2, c))
            goto done;
        det_ok = !memcmp(gdq, gdq2, vq.extent * 2) && !memcmp(gdk, gdk2, vk.extent * 2) &&
                 !memcmp(gdv, gdv2, vk.extent * 2);
    }

    /* the reference, on the same host inputs */
    if (flashc_backend_create("reference", NULL, &ref) != FLASHC_OK) {
        snprintf(c->msg, sizeof c->msg, "reference backend: %s", flashc_last_error());
        goto done;
    }
    {
        flashc_tensor hq_t = vq.t, hk_t = vk.t, hv_t = vv.t, hdo_t = vdo.t;
        hq_t.data = hq, hk_t.data = hk, hv_t.data = hv, hdo_t.data = hdo;
        flashc_tensor ro_t = flashc_tensor_contiguous(ro, FLASHC_F32, rB, Nq, rHq, D);
        flashc_tensor rl_t = flashc_lse_contiguous(rlse, rB, rHq, Nq);
        flashc_tensor rdq_t = flashc_tensor_contiguous(rdq, FLASHC_F32, rB, Nq, rHq, D);
        flashc_tensor rdk_t = flashc_tensor_contiguous(rdk, FLASHC_F32, rB, Nk, rHk, D);
        flashc_tensor rdv_t = flashc_tensor_contiguous(rdv, FLASHC_F32, rB, Nk, rHk, D);
        flashc_params rp = p;
        rp.deterministic = 0;
        if (c->alibi) rp.alibi_slopes = slopes;
        if (c->nseq) rp.cu_seqlens_q = cuq, rp.cu_seqlens_k = cuk;
        if (flashc_forward(ref, &rp, &hq_t, &hk_t, &hv_t, &ro_t, &rl_t) != FLASHC_OK ||
            flashc_backward(ref, &rp, &hdo_t, &hq_t, &hk_t, &hv_t, &ro_t, &rl_t, &rdq_t, &rdk_t, &rdv_t) !=
                FLASHC_OK) {
            snprintf(c->msg, sizeof c->msg, "reference: %s", flashc_last_error());
            goto done;
        }
    }

    {
        const double atol = c->atol, rtol = c->rtol;
        cmp cs[T_COUNT];
        cs[T_OUT] = compare_view(&vo, go, ro, atol, rtol);
        memset(&cs[T_LSE], 0, sizeof(cmp));
        for (size_t i = 0; i < nl; i++)
            cmp_value(&cs[T_LSE], glse[i], rlse[i], c->check_lse ? atol : 0, rtol);
        cs[T_DQ] = compare_view(&vdq, gdq, rdq, atol, rtol);
        cs[T_DK] = compare_view(&vdk, gdk, rdk, atol, rtol);
        cs[T_DV] = compare_view(&vdv, gdv, rdv, atol, rtol);
        /* fp16 with a softcap: twice the plain bar. Where the scores saturate (a cap well
         * below them), 1 - tanh^2 shrinks dS while the error of delta = rowsum(dO O), which
         * every FlashAttention backward computes from the 16-bit O it is given, stays: an
         * emulation of the kernel's arithmetic in numpy puts that term alone at 5e-4 of dQ
         * and dK on the d256 cap-5 case. */
        const double bar = dt == FLASHC_BF16 ? 5e-3 : (c->softcap > 0 ? 1e-3 : 5e-4);
        int ok = det_ok && rep_ok;
        char *m = c->msg;
        size_t left = sizeof c->msg;
        m[0] = 0;
        for (int t = 0; t < T_COUNT; t++) {
            c->rel[t] = rel_of(&cs[t]);
            c->maxabs[t] = cs[t].maxabs;
            int tok = cs[t].nonfinite == 0 && cs[t].gap_writes == 0;
            if (atol > 0) {
                if (t != T_LSE || c->check_lse) tok = tok && cs[t].bad_elem == 0;
            } else {
                tok = tok && c->rel[t] <= bar;
            }
            if (!tok) {
                int w = snprintf(m, left, "%s: rel %.3g max|d| %.3g nonfinite %ld gap-writes %ld bad %ld; ",
                                 tensor_names[t], c->rel[t], cs[t].maxabs, cs[t].nonfinite, cs[t].gap_writes,
                                 cs[t].bad_elem);
                if (w > 0 && (size_t)w < left) m += w, left -= (size_t)w;
            }
            ok = ok && tok;
        }
        if (!det_ok) {
            int w = snprintf(m, left, "deterministic backward differs between two runs; ");
            if (w > 0 && (size_t)w < left) m += w, left -= (size_t)w;
        }
        if (!rep_ok) snprintf(m, left, "forward differs between two runs");
        c->ok = ok;
    }
done:
    c->ran = 1;
    flashc_backend_destroy(ref);
    void *devs[] = {dq_, dk_, dv_, ddo, dout, dlse, ddq, ddk, ddv, dcuq, dcuk, dslopes};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) flashc_backend_free(g_cuda, devs[i]);
    void *hosts[] = {hq, hk, hv, hdo, poison_q, poison_k, poison_l, go, gdq, gdk, gdv, gdq2, gdk2, gdv2, glse,
                     ro, rlse, rdq, rdk, rdv, glse2, go2, slopes};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) free(hosts[i]);
}

/* ---- the grid --------------------------------------------------------------------------- */

static gpu_case *g_cases;
static int g_ncases, g_cap, g_next;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static gpu_case *add_case(flashc_dtype dt, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hk,
                          int64_t d, int causal, int layout)
{
    if (g_ncases == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 256;
        g_cases = (gpu_case *)realloc(g_cases, (size_t)g_cap * sizeof *g_cases);
        if (!g_cases) { fprintf(stderr, "out of memory\n"); exit(2); }
    }
    gpu_case *c = &g_cases[g_ncases++];
    memset(c, 0, sizeof *c);
    c->dtype = dt, c->batch = b, c->seqlen_q = nq, c->seqlen_k = nk, c->heads_q = hq, c->heads_kv = hk;
    c->head_dim = d, c->causal = causal, c->layout = layout, c->input_std = 1.0;
    c->window_left = c->window_right = -1;
    return c;
}

/* A variable-length case: n sequences of lq[i] queries and lk[i] keys, packed. */
static gpu_case *add_varlen(flashc_dtype dt, int n, const int32_t *lq, const int32_t *lk, int64_t hq,
                            int64_t hk, int64_t d, int causal, int layout)
{
    int64_t tq = 0, tk = 0;
    for (int i = 0; i < n; i++) tq += lq[i], tk += lk[i];
    gpu_case *c = add_case(dt, 1, tq, tk, hq, hk, d, causal, layout);
    c->nseq = n;
    memcpy(c->lq, lq, (size_t)n * sizeof *lq);
    memcpy(c->lk, lk, (size_t)n * sizeof *lk);
    return c;
}

static void name_case(gpu_case *c, const char *tag)
{
    static const char *causal_names[] = {"none", "br", "tl"};
    char feat[96] = "";
    size_t at = 0;
    if (c->nseq) at += (size_t)snprintf(feat + at, sizeof feat - at, " varlen%d%s", c->nseq, c->max_given ? "" : "(max 0)");
    if (c->window_left >= 0 || c->window_right >= 0)
        at += (size_t)snprintf(feat + at, sizeof feat - at, " win(%d,%d)", c->window_left, c->window_right);
    if (c->softcap > 0) at += (size_t)snprintf(feat + at, sizeof feat - at, " cap%g", c->softcap);
    if (c->alibi) at += (size_t)snprintf(feat + at, sizeof feat - at, " alibi%s", c->alibi == 2 ? "/seq" : "");
    if (c->dropout_p > 0) snprintf(feat + at, sizeof feat - at, " drop%g", c->dropout_p);
    snprintf(c->name, sizeof c->name, "%s%s%s b%lld q%lld k%lld h%lld/%lld d%lld causal=%s %s%s%s",
             tag ? tag : "", tag ? ": " : "", c->dtype == FLASHC_BF16 ? "bf16" : "f16", (long long)c->batch,
             (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q, (long long)c->heads_kv,
             (long long)c->head_dim, causal_names[c->causal], layout_names[c->layout],
             c->deterministic ? " det" : "", feat);
}

/* Dropout settings of a case: p, a seed and an offset (the offset moves the counter words). */
static void set_dropout(gpu_case *c, float p, uint64_t seed, uint64_t offset)
{
    c->dropout_p = p, c->dropout_seed = seed, c->dropout_offset = offset, c->repeat = 1;
}

/* The feature grid: every feature alone over the head dims, composed, and on varlen batches. */
static void build_feature_grid(void)
{
    const flashc_dtype dts[2] = {FLASHC_F16, FLASHC_BF16};
    const int dims[6] = {32, 64, 96, 128, 192, 256};
    /* varlen: lengths 0, 1, 17, 128, 129, 1000 mixed (a key side of 0 under a query side > 0
     * makes rows that see nothing); GQA 2:1 */
    const int32_t lq[6] = {17, 0, 1000, 1, 129, 128}, lk[6] = {129, 5, 1000, 0, 17, 128};
    for (int di = 0; di < 2; di++)
        for (int i = 0; i < 6; i++)
            for (int causal = 0; causal <= 2; causal++) {
                if (di == 1 && causal == 2) continue;
                gpu_case *c = add_varlen(dts[di], 6, lq, lk, 4, 2, dims[i], causal, (i + causal) % 3);
                c->max_given = (i + causal) % 2;
                name_case(c, "feat");
            }
    /* varlen with GQA 4:1 and 8:1, and sequences of one row each (max_seqlen 1) */
    for (int di = 0; di < 2; di++) {
        const int32_t l1[5] = {1, 1, 1, 1, 1}, lq2[4] = {300, 64, 0, 77}, lk2[4] = {257, 64, 3, 200};
        gpu_case *c = add_varlen(dts[di], 5, l1, l1, 4, 1, 64, di, LAYOUT_BSHD);
        c->max_given = 1;
        name_case(c, "feat max_seqlen 1");
        c = add_varlen(dts[di], 5, l1, l1, 2, 2, 128, 0, LAYOUT_PADDED);
        name_case(c, "feat max_seqlen 1");
        c = add_varlen(dts[di], 4, lq2, lk2, 16, 2, 128, 1, LAYOUT_BSHD);
        c->max_given = 1;
        name_case(c, "feat gqa8");
        c = add_varlen(dts[di], 4, lq2, lk2, 8, 2, 256, 2, LAYOUT_BHSD);
        c->max_given = 1;
        name_case(c, "feat gqa4");
    }
    /* sliding windows: smaller than a block, one-sided, composed with causal (the
     * intersection), and windows that leave rows with no key at all */
    const int win[][3] = {/* left, right, causal */
                          {5, 3, 0}, {0, 0, 0}, {16, -1, 0}, {-1, 7, 0}, {100, 100, 0},
                          {32, -1, 1}, {5, 10, 1}, {0, -1, 1}, {64, -1, 2}, {3, 2, 2}};
    for (size_t w = 0; w < sizeof win / sizeof win[0]; w++)
        for (int i = 0; i < 6; i++) {
            if (i % 2 != (int)(w % 2) && w > 1) continue; /* half the dims each, all for the smallest */
            gpu_case *c = add_case(dts[(w + (size_t)i) % 2], 2, 300, 333, 4, 2, dims[i], win[w][2],
                                   (int)((w + (size_t)i) % 3));
            c->window_left = win[w][0], c->window_right = win[w][1];
            name_case(c, "feat");
        }
    {
        /* q longer than k under bottom-right alignment with a narrow window: the first rows
         * see nothing; top-left with a window past the keys likewise */
        gpu_case *c = add_case(FLASHC_F16, 1, 400, 70, 2, 1, 64, 1, LAYOUT_BSHD);
        c->window_left = 8;
        name_case(c, "feat masked rows");
        c = add_case(FLASHC_BF16, 1, 400, 70, 2, 2, 128, 0, LAYOUT_BSHD);
        c->window_left = 0, c->window_right = 0;
        name_case(c, "feat masked rows");
        c = add_case(FLASHC_F16, 1, 300, 50, 2, 2, 256, 2, LAYOUT_PADDED);
        c->window_left = 4;
        name_case(c, "feat masked rows");
    }
    /* softcap (mild and strong, with scales that push logits into the flat part) */
    for (int i = 0; i < 6; i++)
        for (int causal = 0; causal <= 1; causal++) {
            gpu_case *c = add_case(dts[(i + causal) % 2], 2, 257, 200, 4, 2, dims[i], causal, (i + causal) % 3);
            c->softcap = causal ? 5.0f : 30.0f;
            if (causal) c->scale = 1.0f;
            name_case(c, "feat");
        }
    /* ALiBi, per head and per sequence */
    for (int i = 0; i < 6; i++)
        for (int kind = 1; kind <= 2; kind++) {
            gpu_case *c = add_case(dts[(i + kind) % 2], 2, 200, 317, 4, 2, dims[i], (i + kind) % 3, LAYOUT_BSHD);
            c->alibi = kind;
            name_case(c, "feat");
        }
    /* dropout: the same keep bits as the reference; forward twice, deterministic backward twice */
    for (int i = 0; i < 6; i++) {
        gpu_case *c = add_case(dts[i % 2], 2, 190, 260, 4, 2, dims[i], i % 3, (int)(i % 3));
        set_dropout(c, i % 2 ? 0.5f : 0.1f, 0x1234567890abcdefull + (uint64_t)i, (uint64_t)i * 1000u);
        c->deterministic = i % 2;
        name_case(c, "feat");
    }
    {
        gpu_case *c = add_case(FLASHC_F16, 1, 1000, 1000, 2, 1, 128, 1, LAYOUT_BHSD);
        set_dropout(c, 0.2f, 42, (uint64_t)1 << 33); /* an offset past 32 bits */
        name_case(c, "feat");
    }
    /* everything at once, on a varlen batch */
    for (int di = 0; di < 2; di++)
        for (int i = 0; i < 6; i++) {
            gpu_case *c = add_varlen(dts[di], 6, lq, lk, 4, 2, dims[i], i % 3, (i + di) % 3);
            c->window_left = 64, c->window_right = i % 2 ? 16 : -1;
            c->softcap = 20.0f, c->alibi = 1 + (i + di) % 2;
            set_dropout(c, 0.15f, 7 + (uint64_t)i, 3);
            c->deterministic = (i + di) % 2, c->max_given = 1;
            name_case(c, "feat all");
        }
}

static void build_grid(int small)
{
    const flashc_dtype dts[2] = {FLASHC_F16, FLASHC_BF16};
    const int dims[6] = {32, 64, 96, 128, 192, 256};
    if (small) { /* every kernel: forward, prep, dK/dV (tiled; two passes in the feature cases), dQ convert, dQ deterministic */
        const int sd[2] = {64, 256};
        for (int i = 0; i < 2; i++)
            for (int causal = 0; causal <= 1; causal++)
                for (int det = 0; det <= 1; det++) {
                    gpu_case *c = add_case(FLASHC_F16, 1, 77, 140, 2, 1, sd[i], causal, LAYOUT_PADDED);
                    c->deterministic = det;
                    name_case(c, "small");
                }
        gpu_case *c = add_case(FLASHC_BF16, 1, 130, 33, 2, 2, 128, 1, LAYOUT_BSHD);
        name_case(c, "small");
        /* the feature kernels: forward, varlen prep and dQ convert, dK/dV (one pass and
         * two), deterministic dQ, every feature on */
        const int32_t lq[4] = {17, 0, 70, 1}, lk[4] = {40, 3, 65, 0};
        for (int i = 0; i < 2; i++)
            for (int det = 0; det <= 1; det++) {
                c = add_varlen(i ? FLASHC_BF16 : FLASHC_F16, 4, lq, lk, 2, 1, sd[i], 1 + det, LAYOUT_PADDED);
                c->window_left = 20, c->window_right = 5, c->softcap = 10.0f, c->alibi = 1 + det;
                set_dropout(c, 0.3f, 99, 1);
                c->deterministic = det, c->max_given = det;
                name_case(c, "small feat");
            }
        c = add_case(FLASHC_F16, 2, 77, 140, 2, 2, 128, 0, LAYOUT_BSHD);
        c->window_left = 9, c->window_right = 0;
        name_case(c, "small feat");
        /* the Hopper kernels with their feature paths: the varlen forward (d64, d128) with
         * every feature on, the feature forward and backward, and dropout alone */
        for (int i = 0; i < 2; i++) {
            c = add_varlen(i ? FLASHC_BF16 : FLASHC_F16, 4, lq, lk, 2, 1, 64 << i, 1, LAYOUT_PADDED);
            c->window_left = 30, c->window_right = 2, c->softcap = 8.0f, c->alibi = 1, c->max_given = i;
            c->deterministic = i;
            name_case(c, "small hopper varlen");
        }
        c = add_case(FLASHC_BF16, 1, 130, 200, 2, 1, 64, 1, LAYOUT_PADDED);
        c->softcap = 6.0f, c->alibi = 2;
        name_case(c, "small hopper feat");
        c = add_case(FLASHC_F16, 1, 150, 150, 2, 2, 128, 0, LAYOUT_BSHD);
        set_dropout(c, 0.25f, 5, 77);
        name_case(c, "small hopper dropout");
        /* the plain kernels' varlen form (no feature; d64 on three consumers), non-causal and
         * bottom-right causal (rows above the diagonal of a short key side see nothing) */
        for (int i = 0; i < 4; i++) {
            c = add_varlen(i & 1 ? FLASHC_BF16 : FLASHC_F16, 4, lq, lk, 2, 1, 64 << (i >> 1), i & 1, LAYOUT_PADDED);
            c->max_given = i >> 1;
            name_case(c, "small hopper varlen plain");
        }
        /* d64 causal on three consumers where a tile's first consumers see fewer key blocks
         * than the tile walks, and the top block runs past its sequence (300 and 1000, each
         * followed by another), so that its V rows must be cleared by every consumer */
        const int32_t lskip[4] = {300, 1000, 129, 5};
        c = add_varlen(FLASHC_BF16, 4, lskip, lskip, 2, 1, 64, 1, LAYOUT_BSHD);
        name_case(c, "small hopper varlen plain");
        return;
    }
    /* odd sizes over every head dim, causal modes, both dtypes; GQA 2:1 */
    const int64_t sizes[][2] = {{1, 1}, {17, 17}, {127, 127}, {128, 128}, {129, 129},
                                {17, 129}, {129, 17}, {1, 128}, {128, 1}};
    for (int di = 0; di < 2; di++)
        for (int i = 0; i < 6; i++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
                for (int causal = 0; causal <= 2; causal++) {
                    int layout = (int)((s + (size_t)causal) % 3);
                    gpu_case *c = add_case(dts[di], 2, sizes[s][0], sizes[s][1], 4, 2, dims[i], causal, layout);
                    name_case(c, NULL);
                }
    /* seqlen 1000, both directions of q != k */
    for (int di = 0; di < 2; di++)
        for (int i = 0; i < 6; i++)
            for (int causal = 0; causal <= 1; causal++) {
                gpu_case *c = add_case(dts[di], 1, 1000, 1000, 2, 1, dims[i], causal, LAYOUT_BHSD);
                name_case(c, NULL);
            }
    const int64_t qk[][2] = {{1000, 301}, {301, 1000}};
    for (int s = 0; s < 2; s++)
        for (int causal = 0; causal <= 2; causal++) {
            gpu_case *c = add_case(FLASHC_F16, 2, qk[s][0], qk[s][1], 2, 2, 128, causal, LAYOUT_PADDED);
            name_case(c, NULL);
            c = add_case(FLASHC_BF16, 1, qk[s][0], qk[s][1], 2, 1, 64, causal, LAYOUT_BSHD);
            name_case(c, NULL);
        }
    /* 4097 */
    for (int causal = 0; causal <= 1; causal++) {
        gpu_case *c = add_case(FLASHC_F16, 1, 4097, 4097, 1, 1, 64, causal, LAYOUT_BSHD);
        name_case(c, NULL);
        c = add_case(FLASHC_BF16, 1, 4097, 4097, 1, 1, 128, causal, LAYOUT_BHSD);
        name_case(c, NULL);
    }
    /* GQA 8:1 and MQA */
    for (int di = 0; di < 2; di++)
        for (int causal = 0; causal <= 1; causal++) {
            gpu_case *c = add_case(dts[di], 2, 257, 300, 16, 2, 128, causal, LAYOUT_BSHD);
            name_case(c, "gqa8");
            c = add_case(dts[di], 1, 300, 257, 8, 1, 64, causal, LAYOUT_PADDED);
            name_case(c, "mqa");
            c = add_case(dts[di], 1, 129, 129, 4, 1, 256, causal, LAYOUT_BHSD);
            name_case(c, "mqa");
        }
    /* head dims served by the next kernel up */
    const int odd_dims[3] = {8, 40, 80};
    for (int i = 0; i < 3; i++) {
        gpu_case *c = add_case(FLASHC_F16, 1, 100, 200, 2, 1, odd_dims[i], 1, LAYOUT_BSHD);
        name_case(c, "dim");
    }
    /* negative and large scales */
    {
        gpu_case *c = add_case(FLASHC_F16, 1, 130, 130, 2, 2, 64, 1, LAYOUT_BSHD);
        c->scale = -0.2f;
        name_case(c, "scale-0.2");
        c = add_case(FLASHC_BF16, 1, 130, 130, 2, 2, 64, 0, LAYOUT_BSHD);
        c->scale = 1.0f;
        name_case(c, "scale1");
    }
    /* deterministic backward */
    for (int i = 0; i < 6; i++) {
        gpu_case *c = add_case(i % 2 ? FLASHC_BF16 : FLASHC_F16, 2, 333, 517, 4, 2, dims[i], i % 3 ? 1 : 0,
                               LAYOUT_PADDED);
        c->deterministic = 1;
        name_case(c, NULL);
    }
    {
        gpu_case *c = add_case(FLASHC_F16, 1, 1000, 1000, 8, 1, 128, 1, LAYOUT_BSHD);
        c->deterministic = 1;
        name_case(c, "mqa");
    }
    /* the seed checks */
    for (int causal = 0; causal <= 1; causal++) {
        gpu_case *c = add_case(FLASHC_F16, 1, 1024, 1024, 2, 2, 64, causal, LAYOUT_BHSD);
        c->scale = 0.5f, c->input_std = 0.5, c->atol = 1e-2, c->rtol = 0;
        name_case(c, "seed phobos/triton");
    }
    {
        gpu_case *c = add_case(FLASHC_BF16, 3, 512, 512, 8, 8, 128, 1, LAYOUT_BHSD);
        c->atol = 1e-2, c->rtol = 1e-2;
        name_case(c, "seed teaching bf16");
    }
    {
        gpu_case *c = add_case(FLASHC_F16, 2, 200, 333, 3, 3, 64, 0, LAYOUT_FLAT);
        c->atol = 1e-2, c->rtol = 1e-2, c->check_lse = 1;
        name_case(c, "seed teenygrad [b*h, n, d]");
        c = add_case(FLASHC_F16, 2, 333, 200, 3, 3, 64, 1, LAYOUT_FLAT);
        c->atol = 1e-2, c->rtol = 1e-2, c->check_lse = 1;
        name_case(c, "seed teenygrad [b*h, n, d]");
    }
    build_feature_grid();
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        int i = g_next++;
        pthread_mutex_unlock(&g_lock);
        if (i >= g_ncases) return NULL;
        run_case(&g_cases[i], 0x5eed0000ull + (uint64_t)i * 7919u);
    }
}

/* ---- error paths ------------------------------------------------------------------------- */

static int expect_status(const char *what, flashc_status got, flashc_status want)
{
    int ok = got == want;
    printf("  %-58s %s  (%s)\n", what, ok ? "PASS" : "FAIL", got == FLASHC_OK ? "ok" : flashc_last_error());
    return ok;
}

static int error_path_checks(void)
{
    int fails = 0;
    const int64_t B = 1, N = 64, H = 2, D = 64;
    const size_t n = (size_t)(B * N * H * D) + 64;
    void *q, *k, *v, *o, *l;
    if (flashc_backend_malloc(g_cuda, n * 2, &q) || flashc_backend_malloc(g_cuda, n * 2, &k) ||
        flashc_backend_malloc(g_cuda, n * 2, &v) || flashc_backend_malloc(g_cuda, n * 2, &o) ||
        flashc_backend_malloc(g_cuda, (size_t)(B * H * N) * 4, &l)) {
        printf("  error paths: allocation failed: %s\n", flashc_last_error());
        return 1;
    }
    uint16_t *host = (uint16_t *)calloc(n, 2);
    flashc_params p;
    flashc_params_init(&p);
    flashc_tensor tq = flashc_tensor_contiguous(q, FLASHC_F16, B, N, H, D);
    flashc_tensor tk = flashc_tensor_contiguous(k, FLASHC_F16, B, N, H, D);
    flashc_tensor tv = flashc_tensor_contiguous(v, FLASHC_F16, B, N, H, D);
    flashc_tensor to = flashc_tensor_contiguous(o, FLASHC_F16, B, N, H, D);
    flashc_tensor tl = flashc_lse_contiguous((float *)l, B, H, N);
    flashc_tensor th = flashc_tensor_contiguous(host, FLASHC_F16, B, N, H, D);
    fails += !expect_status("host pointer for q is rejected", flashc_forward(g_cuda, &p, &th, &tk, &tv, &to, &tl),
                            FLASHC_ERROR_INVALID_POINTER);
    flashc_tensor tmis = tq;
    tmis.data = (uint16_t *)q + 1;
    fails += !expect_status("q data pointer off 16 bytes is rejected",
                            flashc_forward(g_cuda, &p, &tmis, &tk, &tv, &to, &tl), FLASHC_ERROR_INVALID_POINTER);
    flashc_tensor tstr = tq;
    tstr.shape[3] = 60, tstr.stride[2] = 60, tstr.stride[1] = 120, tstr.stride[0] = 120 * N;
    flashc_tensor tk2 = tstr, tv2 = tstr, to2 = tstr;
    tk2.data = k, tv2.data = v, to2.data = o;
    fails += !expect_status("head_dim 60 (strides not multiples of 8) is refused",
                            flashc_forward(g_cuda, &p, &tstr, &tk2, &tv2, &to2, &tl), FLASHC_ERROR_INVALID_HEAD_DIM);
    flashc_tensor tstride = tq;
    tstride.stride[1] = H * D + 4, tstride.shape[1] = N - 1;
    flashc_tensor tks = tk, tvs = tv, tos = to;
    tks.shape[1] = tvs.shape[1] = N - 1;
    tos.shape[1] = N - 1;
    flashc_tensor tl2 = flashc_lse_contiguous((float *)l, B, H, N - 1);
    fails += !expect_status("q seqlen stride not a multiple of 8 is rejected",
                            flashc_forward(g_cuda, &p, &tstride, &tks, &tvs, &tos, &tl2),
                            FLASHC_ERROR_INVALID_POINTER);
    fails += !expect_status("a valid call after the errors still works",
                            flashc_forward(g_cuda, &p, &tq, &tk, &tv, &to, &tl), FLASHC_OK);
    free(host);
    flashc_backend_free(g_cuda, q);
    flashc_backend_free(g_cuda, k);
    flashc_backend_free(g_cuda, v);
    flashc_backend_free(g_cuda, o);
    flashc_backend_free(g_cuda, l);
    return fails;
}

/* Varlen offsets that break their rules (decreasing, negative, past the total) live on the
 * device, where the backend does not read them before the kernels: the call must still
 * return, touch nothing outside its outputs, and (under memcheck) read nothing outside its
 * inputs. Each tensor sits between guard zones whose bytes are checked afterwards. */
static int bad_cu_seqlens_checks(void)
{
    enum { TOTAL = 96, H = 2, D = 64, GUARD = 4096, NT = 9 };
    static const int32_t bad[][5] = {
        {0, 50, 20, 96, 96},      /* decreasing */
        {-40, 10, 5000, 96, 96},  /* negative, past the total */
        {0, 30, 60, 96, 2000000}, /* the last past the total */
        {70, 60, 50, 40, 30},     /* decreasing everywhere, not from 0 */
    };
    const size_t elems = (size_t)TOTAL * H * D, tbytes = elems * 2, lbytes = (size_t)H * TOTAL * 4;
    const size_t sizes[NT] = {tbytes, tbytes, tbytes, tbytes, lbytes, tbytes, tbytes, tbytes, tbytes};
    const char *names[NT] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    size_t total = 0, offs[NT];
    for (int t = 0; t < NT; t++) offs[t] = total + GUARD, total = offs[t] + sizes[t];
    total += GUARD;
    unsigned char *host = (unsigned char *)malloc(total), *back = (unsigned char *)malloc(total);
    void *dev = NULL, *dcu = NULL;
    int fails = 0;
    if (!host || !back || flashc_backend_malloc(g_cuda, total, &dev) != FLASHC_OK ||
        flashc_backend_malloc(g_cuda, sizeof bad, &dcu) != FLASHC_OK) {
        printf("  bad cu_seqlens: allocation failed: %s\n", flashc_last_error());
        free(host), free(back);
        return 1;
    }
    uint64_t seed = 77;
    for (size_t i = 0; i < total; i++) host[i] = (unsigned char)(rng_next(&seed) >> 56);
    for (int t = 0; t < NT; t++) /* inputs and outputs: small normal values, never NaN */
        if (t != 4)
            for (size_t e = 0; e < sizes[t] / 2; e++)
                ((uint16_t *)(host + offs[t]))[e] = to_half(FLASHC_F16, (float)(0.5 * rng_normal(&seed)));
    for (int t = 0; t < NT; t++) /* the LSE input: finite */
        if (t == 4)
            for (size_t e = 0; e < sizes[t] / 4; e++) ((float *)(host + offs[t]))[e] = 1.0f;
    flashc_backend_memcpy(g_cuda, dcu, bad, sizeof bad, FLASHC_COPY_TO_BACKEND);
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        flashc_backend_memcpy(g_cuda, dev, host, total, FLASHC_COPY_TO_BACKEND);
        flashc_tensor tt[NT];
        for (int t = 0; t < NT; t++)
            tt[t] = t == 4 ? flashc_lse_contiguous((float *)((char *)dev + offs[t]), 1, H, TOTAL)
                           : flashc_tensor_contiguous((char *)dev + offs[t], FLASHC_F16, 1, TOTAL, H, D);
        flashc_params p;
        flashc_params_init(&p);
        p.cu_seqlens_q = p.cu_seqlens_k = (const int32_t *)dcu + 5 * c;
        p.num_seqs = 4;
        p.causal = (int32_t)(c % 2);
        flashc_status sf = flashc_forward(g_cuda, &p, &tt[0], &tt[1], &tt[2], &tt[3], &tt[4]);
        flashc_status sb = flashc_backward(g_cuda, &p, &tt[5], &tt[0], &tt[1], &tt[2], &tt[3], &tt[4], &tt[6],
                                           &tt[7], &tt[8]);
        flashc_status sy = flashc_backend_synchronize(g_cuda, NULL);
        flashc_backend_memcpy(g_cuda, back, dev, total, FLASHC_COPY_TO_HOST);
        long changed = 0;
        const char *where = "";
        for (int t = 0; t <= NT; t++) { /* the guard zone before tensor t (and after the last) */
            const size_t g0 = t == 0 ? 0 : offs[t - 1] + sizes[t - 1], g1 = t == NT ? total : offs[t];
            for (size_t i = g0; i < g1; i++)
                if (back[i] != host[i]) changed++, where = t < NT ? names[t] : "the end";
        }
        for (int t = 0; t < 6; t++) /* inputs q, k, v, dout unchanged */
            if ((t < 3 || t == 5) && memcmp(back + offs[t], host + offs[t], sizes[t])) changed++, where = names[t];
        const int ok = changed == 0 && sy == FLASHC_OK && sf == FLASHC_OK && sb == FLASHC_OK;
        char what[96];
        snprintf(what, sizeof what, "bad cu_seqlens set %zu: forward %s, backward %s", c,
                 flashc_status_string(sf), flashc_status_string(sb));
        printf("  %-58s %s%s%s\n", what, ok ? "PASS" : "FAIL", changed ? "  bytes changed before " : "",
               changed ? where : "");
        fails += !ok;
    }
    flashc_backend_free(g_cuda, dev);
    flashc_backend_free(g_cuda, dcu);
    free(host), free(back);
    return fails;
}

/* A varlen batch whose middle sequence holds inf and NaN in Q, K, V and dO: the outputs and
 * gradients of the sequences beside it must come out bitwise as they do with finite values
 * there (a kernel that multiplies the zero probabilities or gradients past a sequence's end
 * by the next sequence's rows fails this). */
static int varlen_neighbour_checks(void)
{
    enum { H = 2, D = 128, NS = 3, NT = 4 }; /* host inputs: q, k, v, dout */
    static const int32_t cu[NS + 1] = {0, 50, 250, 290};
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    const int64_t total = cu[NS];
    const size_t n = (size_t)total * H * D;
    uint16_t *host[NT];
    uint16_t *res[2][4]; /* per run: out, dq, dk, dv */
    uint64_t seed;
    for (int t = 0; t < NT; t++) host[t] = (uint16_t *)malloc(n * 2);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) res[r][t] = (uint16_t *)malloc(n * 2);
    void *dev[8] = {NULL}; /* q, k, v, dout, o, dq, dk, dv */
    void *dl = NULL, *dcu = NULL;
    int fails = 0;
    for (int i = 0; i < 8; i++)
        if (flashc_backend_malloc(g_cuda, n * 2, &dev[i])) dev[i] = NULL;
    if (flashc_backend_malloc(g_cuda, (size_t)H * total * 4, &dl)) dl = NULL;
    if (flashc_backend_malloc(g_cuda, sizeof cu, &dcu)) dcu = NULL;
    int allocated = dl && dcu;
    for (int i = 0; i < 8; i++) allocated &= dev[i] != NULL;
    if (!allocated) {
        printf("  varlen neighbours: allocation failed: %s\n", flashc_last_error());
        fails = 1;
        goto done;
    }
    flashc_backend_memcpy(g_cuda, dcu, cu, sizeof cu, FLASHC_COPY_TO_BACKEND);
    for (int causal = 0; causal <= 1; causal++) {
        for (int run = 0; run < 2; run++) {
            seed = 5 + (uint64_t)causal; /* the same finite values in both runs */
            for (int t = 0; t < 4; t++)
                for (size_t i = 0; i < n; i++) host[t][i] = to_half(FLASHC_F16, (float)rng_normal(&seed) * 0.5f);
            if (run == 1) /* the middle sequence's values: +inf and NaN, in every input */
                for (int t = 0; t < 4; t++)
                    for (int64_t j = cu[1]; j < cu[2]; j++)
                        for (int64_t e = 0; e < H * D; e++) host[t][j * H * D + e] = (j + e + t) % 2 ? 0x7c00 : 0x7e00;
            for (int t = 0; t < 4; t++) flashc_backend_memcpy(g_cuda, dev[t], host[t], n * 2, FLASHC_COPY_TO_BACKEND);
            /* outputs poisoned with NaN, so that an element left unwritten counts as non-finite */
            memset(res[run][0], 0xff, n * 2);
            for (int t = 4; t < 8; t++) flashc_backend_memcpy(g_cuda, dev[t], res[run][0], n * 2, FLASHC_COPY_TO_BACKEND);
            flashc_tensor tt[8];
            for (int t = 0; t < 8; t++) tt[t] = flashc_tensor_contiguous(dev[t], FLASHC_F16, 1, total, H, D);
            flashc_tensor tl = flashc_lse_contiguous((float *)dl, 1, H, total);
            flashc_params p;
            flashc_params_init(&p);
            p.cu_seqlens_q = p.cu_seqlens_k = (const int32_t *)dcu;
            p.num_seqs = NS;
            p.max_seqlen_q = p.max_seqlen_k = 200;
            p.causal = causal;
            if (flashc_forward(g_cuda, &p, &tt[0], &tt[1], &tt[2], &tt[4], &tl) != FLASHC_OK ||
                flashc_backward(g_cuda, &p, &tt[3], &tt[0], &tt[1], &tt[2], &tt[4], &tl, &tt[5], &tt[6], &tt[7]) !=
                    FLASHC_OK) {
                printf("  varlen neighbours: forward or backward failed: %s\n", flashc_last_error());
                fails++;
            }
            for (int t = 0; t < 4; t++)
                flashc_backend_memcpy(g_cuda, res[run][t], dev[4 + t], n * 2, FLASHC_COPY_TO_HOST);
        }
        for (int t = 0; t < 4; t++) {
            long differ = 0, nonfinite = 0;
            for (int64_t j = 0; j < total; j++) {
                if (j >= cu[1] && j < cu[2]) continue; /* the middle sequence itself */
                for (int64_t e = 0; e < H * D; e++) {
                    const size_t i = (size_t)(j * H * D + e);
                    differ += res[0][t][i] != res[1][t][i];
                    nonfinite += !isfinite(from_half(FLASHC_F16, res[1][t][i]));
                }
            }
            const int ok = differ == 0 && nonfinite == 0;
            printf("  varlen, inf/NaN in the middle sequence (%s), %s: %ld elements of its neighbours differ, "
                   "%ld non-finite  %s\n",
                   causal ? "causal" : "non-causal", names[t], differ, nonfinite, ok ? "PASS" : "FAIL");
            fails += !ok;
        }
    }
done:
    for (int i = 0; i < 8; i++)
        if (dev[i]) flashc_backend_free(g_cuda, dev[i]);
    if (dl) flashc_backend_free(g_cuda, dl);
    if (dcu) flashc_backend_free(g_cuda, dcu);
    for (int t = 0; t < NT; t++) free(host[t]);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) free(res[r][t]);
    return fails;
}

/* ---- dropout keep bits, CPU against CUDA ------------------------------------------------ */

/* One dropout forward and backward on a backend whose probabilities are exactly uniform
 * (Q = 0) with V[j] and dO[i] one-hot rows, so that O[i][j] != 0 exactly when key j of query i
 * is kept in the forward, and dV[j][i] != 0 exactly when the backward regenerated the same
 * bit: mask_fwd / mask_bwd get one byte per (b, h, i, j). dev: the backend takes device
 * memory (copies in and out), else host memory. */
static int dropout_masks(flashc_backend *be, int dev, flashc_dtype dt, int64_t B, int64_t N, int64_t Hq,
                         int64_t Hk, int64_t D, float prob, uint64_t seed, uint64_t offset,
                         unsigned char *mask_fwd, unsigned char *mask_bwd)
{
    const size_t nq = (size_t)(B * N * Hq * D), nk = (size_t)(B * N * Hk * D), nl = (size_t)(B * Hq * N);
    uint16_t *hq = (uint16_t *)calloc(nq, 2), *hv = (uint16_t *)calloc(nk, 2), *hdo = (uint16_t *)calloc(nq, 2);
    uint16_t *ho = (uint16_t *)malloc(nq * 2), *hdv = (uint16_t *)malloc(nk * 2);
    const uint16_t one = to_half(dt, 1.0f);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < N; j++) {
            for (int64_t h = 0; h < Hk; h++) hv[((b * N + j) * Hk + h) * D + j] = one;
            for (int64_t h = 0; h < Hq; h++) hdo[((b * N + j) * Hq + h) * D + j] = one;
        }
    void *buf[8] = {0}; /* q, k, v, o, dout, dq, dk, dv; then lse */
    void *lse = NULL;
    const size_t bytes[8] = {nq * 2, nk * 2, nk * 2, nq * 2, nq * 2, nq * 2, nk * 2, nk * 2};
    const void *init[8] = {hq, hq, hv, NULL, hdo, NULL, NULL, NULL}; /* K = 0 too: hq's first nk */
    int ok = 1;
    for (int t = 0; t < 8 && ok; t++) {
        if (dev) {
            ok = flashc_backend_malloc(be, bytes[t], &buf[t]) == FLASHC_OK &&
                 (!init[t] || flashc_backend_memcpy(be, buf[t], init[t], bytes[t], FLASHC_COPY_TO_BACKEND) == FLASHC_OK);
        } else {
            ok = (buf[t] = calloc(bytes[t], 1)) != NULL;
            if (ok && init[t]) memcpy(buf[t], init[t], bytes[t]);
        }
    }
    if (ok) ok = dev ? flashc_backend_malloc(be, nl * 4, &lse) == FLASHC_OK : (lse = calloc(nl, 4)) != NULL;
    if (ok) {
        flashc_tensor q = flashc_tensor_contiguous(buf[0], dt, B, N, Hq, D);
        flashc_tensor k = flashc_tensor_contiguous(buf[1], dt, B, N, Hk, D);
        flashc_tensor v = flashc_tensor_contiguous(buf[2], dt, B, N, Hk, D);
        flashc_tensor o = flashc_tensor_contiguous(buf[3], dt, B, N, Hq, D);
        flashc_tensor dout = flashc_tensor_contiguous(buf[4], dt, B, N, Hq, D);
        flashc_tensor dq = flashc_tensor_contiguous(buf[5], dt, B, N, Hq, D);
        flashc_tensor dk = flashc_tensor_contiguous(buf[6], dt, B, N, Hk, D);
        flashc_tensor dv = flashc_tensor_contiguous(buf[7], dt, B, N, Hk, D);
        flashc_tensor l = flashc_lse_contiguous((float *)lse, B, Hq, N);
        flashc_params p;
        flashc_params_init(&p);
        p.dropout_p = prob, p.dropout_seed = seed, p.dropout_offset = offset;
        ok = flashc_forward(be, &p, &q, &k, &v, &o, &l) == FLASHC_OK &&
             flashc_backward(be, &p, &dout, &q, &k, &v, &o, &l, &dq, &dk, &dv) == FLASHC_OK;
        if (!ok) printf("  dropout masks (%s): %s\n", dev ? "cuda" : "cpu", flashc_last_error());
    }
    if (ok && dev)
        ok = flashc_backend_memcpy(be, ho, buf[3], nq * 2, FLASHC_COPY_TO_HOST) == FLASHC_OK &&
             flashc_backend_memcpy(be, hdv, buf[7], nk * 2, FLASHC_COPY_TO_HOST) == FLASHC_OK;
    else if (ok) {
        memcpy(ho, buf[3], nq * 2);
        memcpy(hdv, buf[7], nk * 2);
    }
    /* GQA: dV of a kv head sums its group's query heads, so only Hq == Hk reads the backward's
     * bits one query head at a time; then each (b, h, i, j) has one term */
    for (int64_t b = 0; ok && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    const size_t m = (size_t)(((b * Hq + h) * N + i) * N + j);
                    mask_fwd[m] = from_half(dt, ho[((b * N + i) * Hq + h) * D + j]) != 0.0f;
                    mask_bwd[m] = Hq == Hk && from_half(dt, hdv[((b * N + j) * Hk + h) * D + i]) != 0.0f;
                }
    for (int t = 0; t < 8; t++) {
        if (!buf[t]) continue;
        if (dev) flashc_backend_free(be, buf[t]);
        else free(buf[t]);
    }
    if (lse) { if (dev) flashc_backend_free(be, lse); else free(lse); }
    free(hq), free(hv), free(hdo), free(ho), free(hdv);
    return ok;
}

/* The CPU and CUDA backends draw the same dropout keep bits for the same seed and offset, in
 * the forward and again in the backward: compared bit for bit. */
static int dropout_cpu_cuda_checks(void)
{
    static const struct { flashc_dtype dt; int64_t B, N, Hq, Hk, D; float p; uint64_t seed, offset; } cs[] = {
        {FLASHC_F16, 2, 100, 2, 2, 128, 0.3f, 0x9e3779b97f4a7c15ull, 5},
        {FLASHC_BF16, 1, 64, 3, 3, 64, 0.5f, 12345, (uint64_t)1 << 33},
        {FLASHC_F16, 2, 77, 4, 1, 96, 0.1f, 7, 0}, /* GQA 4:1: the forward's bits */
    };
    flashc_backend *cpu = NULL;
    if (flashc_backend_create("cpu", NULL, &cpu) != FLASHC_OK) {
        printf("  cpu backend unavailable: %s\n", flashc_last_error());
        return 1;
    }
    int fails = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const size_t n = (size_t)(cs[c].B * cs[c].Hq * cs[c].N * cs[c].N);
        unsigned char *f[2], *g[2];
        for (int k = 0; k < 2; k++) f[k] = (unsigned char *)malloc(n), g[k] = (unsigned char *)malloc(n);
        int ok = 1;
        for (int k = 0; k < 2 && ok; k++)
            ok = dropout_masks(k ? g_cuda : cpu, k, cs[c].dt, cs[c].B, cs[c].N, cs[c].Hq, cs[c].Hk, cs[c].D,
                               cs[c].p, cs[c].seed, cs[c].offset, f[k], g[k]);
        long fdiff = 0, bdiff = 0, kept = 0;
        for (size_t i = 0; ok && i < n; i++) {
            fdiff += f[0][i] != f[1][i];
            bdiff += g[0][i] != g[1][i] || (cs[c].Hq == cs[c].Hk && g[1][i] != f[1][i]);
            kept += f[1][i];
        }
        const double frac = ok ? (double)kept / (double)n : 0.0;
        /* the kept share near 1 - p: a mask of all zeros or all ones on both sides would not pass */
        ok = ok && fdiff == 0 && bdiff == 0 && fabs(frac - (1.0 - cs[c].p)) < 0.03;
        printf("  dropout p=%.2g %s B%lld N%lld H%lld:%lld D%lld: %ld forward / %ld backward bits differ of %zu, "
               "kept %.3f  %s\n", cs[c].p, cs[c].dt == FLASHC_BF16 ? "bf16" : "f16", (long long)cs[c].B,
               (long long)cs[c].N, (long long)cs[c].Hq, (long long)cs[c].Hk, (long long)cs[c].D, fdiff, bdiff, n,
               frac, ok ? "PASS" : "FAIL");
        fails += !ok;
        for (int k = 0; k < 2; k++) free(f[k]), free(g[k]);
    }
    flashc_backend_destroy(cpu);
    return fails;
}

int main(int argc, char **argv)
{
    int small = 0, threads = 8;
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else { fprintf(stderr, "usage: %s [--small] [--threads N] [--filter S]\n", argv[0]); return 2; }
    }
    if (flashc_backend_create("cuda", NULL, &g_cuda) != FLASHC_OK) {
        printf("cuda backend unavailable: %s\n", flashc_last_error());
        return 1;
    }
    printf("%s\n", flashc_backend_describe(g_cuda));
    build_grid(small);
    if (filter) {
        int m = 0;
        for (int i = 0; i < g_ncases; i++)
            if (strstr(g_cases[i].name, filter)) g_cases[m++] = g_cases[i];
        g_ncases = m;
    }
    if (small) threads = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t tid[64];
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);

    int fails = 0;
    double worst[2][T_COUNT] = {{0}};
    for (int i = 0; i < g_ncases; i++) {
        gpu_case *c = &g_cases[i];
        int bi = c->dtype == FLASHC_BF16;
        if (c->atol == 0)
            for (int t = 0; t < T_COUNT; t++)
                if (c->rel[t] > worst[bi][t]) worst[bi][t] = c->rel[t];
        if (!c->ok) fails++;
        if (!c->ok || c->atol > 0 || small)
            printf("%s %-64s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e%s%s\n", c->ok ? "PASS" : "FAIL", c->name,
                   c->rel[0], c->rel[1], c->rel[2], c->rel[3], c->rel[4], c->ok ? "" : "  ", c->ok ? "" : c->msg);
        if (c->atol > 0 && c->ok)
            printf("     %-64s max|diff| out %.2e dq %.2e dk %.2e dv %.2e lse %.2e (atol %g rtol %g)\n", "",
                   c->maxabs[0], c->maxabs[2], c->maxabs[3], c->maxabs[4], c->maxabs[1], c->atol, c->rtol);
    }
    printf("error paths:\n");
    int efails = error_path_checks();
    efails += bad_cu_seqlens_checks();
    efails += varlen_neighbour_checks();
    printf("dropout keep bits, cpu against cuda:\n");
    efails += dropout_cpu_cuda_checks();
    printf("\nsummary: %d cases in %.1f s, %d failed; error paths and dropout bits: %d failed\n", g_ncases,
           (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec), fails, efails);
    for (int bi = 0; bi < 2; bi++)
        printf("worst relative error %-4s (bar %.0e): out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n",
               bi ? "bf16" : "f16", bi ? 5e-3 : 5e-4, worst[bi][0], worst[bi][1], worst[bi][2], worst[bi][3],
               worst[bi][4]);
    flashc_backend_destroy(g_cuda);
    return fails || efails ? 1 : 0;
}
