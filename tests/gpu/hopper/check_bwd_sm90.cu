/*
 * check_bwd_sm90.cu - standalone check and timing of the Hopper backward (src/cuda/hopper).
 *
 * Builds from the kernel's own files only (build_bwd.sh): no libflashc, no CMake. It
 *   1. runs the backward on random inputs of odd sizes (seqlen 1, 17, 1000, one 4097 case;
 *      seqlen_q != seqlen_k both ways; head dims 64 and 128; no mask, causal bottom-right and
 *      top-left; GQA 8:1 and 2:1; a [batch, heads, seqlen, head_dim] strided view; the
 *      deterministic mode; and the feature kernel: sliding windows narrower than a block, with
 *      causal in both alignments, one-sided, softcap, ALiBi per head and per (batch, head),
 *      all three at once, rows and keys that see nothing), with dQ, dK and dV poisoned with
 *      NaN first, against a float64 CPU
 *      reference (the forward's O and LSE come from a float64 forward; the kernel gets O
 *      rounded to 16 bits): relative error ||x - ref|| / ||ref|| at most 1e-3 for fp16 and
 *      1e-2 for bf16 for each of dQ, dK, dV, no NaN, and exact zeros for the query rows that
 *      see no key and the keys that no query sees;
 *   2. checks that the deterministic mode gives bitwise identical results twice;
 *   3. times the backward (all three kernels) with CUDA events at the benchmark shapes (16k
 *      tokens, hidden 2048, d64 and d128, seqlen 2k..16k, causal and not, bf16 and fp16, both
 *      modes); TFLOP/s = 2.5 * 4 b h s^2 d / t, halved when causal; then the feature kernel at
 *      one shape (window, softcap, ALiBi) beside the plain one.
 *
 * Usage: check_bwd_sm90 [--check-only | --bench-only | --small]. --small runs only the cases
 * with at most 20000 scores per head, no timing (for compute-sanitizer). Exit status 0 when
 * every check passed; a kernel that does not finish within 30 s (or FLASHC_HANG_SECONDS) is
 * reported as HANG and the program exits 3.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_common.h"
#include "check_util.h"
#include "../../../src/cuda/hopper/bwd_sm90.h"

/* ---- float64 reference ---------------------------------------------------------------------- */

typedef struct bcase {
    int batch, sq, sk, hq, hkv, d, causal, bf16, bhsd, det;
    /* features (the feature kernel): a window (wl, wr; -1 = unbounded side) when window is
     * set, a softcap (0 = off), ALiBi slopes (0 off, 1 one set per head, 2 per batch and head) */
    int window, wl, wr;
    float softcap;
    int alibi;
} bcase;

/* One (batch, query head) of the reference: q, dO [sq][d], k, v [sk][d] as doubles. */
typedef struct ref_head {
    int sq, sk, d, causal;
    double scale;
    const double *q, *k, *v, *dout;
    double *o, *lse, *dq; /* [sq][d], [sq], [sq][d] */
    double *p, *ds;       /* [sq][sk] */
    double *dk, *dv;      /* [sk][d], accumulated over the group */
    const bcase *c;       /* the mask and the features */
    double slope;         /* ALiBi slope of this (batch, head), 0 when off */
} ref_head;

static void ref_rows(void *ctx, long lo, long hi)
{
    ref_head *r = (ref_head *)ctx;
    const int sk = r->sk, d = r->d;
    double *dpv = (double *)malloc((size_t)sk * 8), *dcap = (double *)malloc((size_t)sk * 8);
    unsigned char *vis = (unsigned char *)malloc((size_t)sk);
    const bcase *c = r->c;
    const long off = c->causal == 2 ? 0 : (long)c->sk - c->sq;
    for (long i = lo; i < hi; i++) {
        int e = 0; /* keys seen */
        for (int j = 0; j < sk; j++) e += vis[j] = (unsigned char)visible(c, (int)i, j);
        const double *qi = r->q + i * d, *doi = r->dout + i * d;
        double *pi = r->p + i * sk, *dsi = r->ds + i * sk, *oi = r->o + i * d, *dqi = r->dq + i * d;
        for (int j = 0; j < sk; j++) pi[j] = 0, dsi[j] = 0;
        for (int x = 0; x < d; x++) oi[x] = 0, dqi[x] = 0;
        if (e == 0) {
            r->lse[i] = -INFINITY;
            continue;
        }
        double mx = -INFINITY;
        for (int j = 0; j < sk; j++) {
            if (!vis[j]) continue;
            const double *kj = r->k + (size_t)j * d;
            double s = 0;
            for (int x = 0; x < d; x++) s += qi[x] * kj[x];
            double xs = s * r->scale; /* scale, softcap, ALiBi: flashc.h's order */
            dcap[j] = 1.0;
            if (c->softcap > 0) {
                const double t = tanh(xs / c->softcap);
                xs = c->softcap * t;
                dcap[j] = 1.0 - t * t;
            }
            if (c->alibi) xs -= r->slope * fabs((double)(i + off - j));
            pi[j] = xs;
            if (pi[j] > mx) mx = pi[j];
        }
        double sum = 0;
        for (int j = 0; j < sk; j++)
            if (vis[j]) sum += exp(pi[j] - mx);
        const double lse = mx + log(sum);
        r->lse[i] = lse;
        double delta = 0;
        for (int j = 0; j < sk; j++) {
            if (!vis[j]) continue;
            pi[j] = exp(pi[j] - lse);
            const double *vj = r->v + (size_t)j * d;
            double dp = 0;
            for (int x = 0; x < d; x++) {
                oi[x] += pi[j] * vj[x];
                dp += doi[x] * vj[x];
            }
            dpv[j] = dp;
            delta += pi[j] * dp;
        }
        for (int j = 0; j < sk; j++) {
            if (!vis[j]) continue;
            dsi[j] = pi[j] * (dpv[j] - delta) * dcap[j]; /* d/d(scale q.k), softcap included */
            const double *kj = r->k + (size_t)j * d;
            for (int x = 0; x < d; x++) dqi[x] += r->scale * dsi[j] * kj[x];
        }
    }
    free(dpv), free(dcap), free(vis);
}

static void ref_keys(void *ctx, long lo, long hi)
{
    ref_head *r = (ref_head *)ctx;
    const int sq = r->sq, sk = r->sk, d = r->d;
    for (long j = lo; j < hi; j++) {
        double *dkj = r->dk + j * d, *dvj = r->dv + j * d;
        for (int i = 0; i < sq; i++) {
            const double p = r->p[(size_t)i * sk + j], ds = r->ds[(size_t)i * sk + j];
            if (p == 0 && ds == 0) continue;
            const double *qi = r->q + (size_t)i * d, *doi = r->dout + (size_t)i * d;
            for (int x = 0; x < d; x++) {
                dkj[x] += r->scale * ds * qi[x];
                dvj[x] += p * doi[x];
            }
        }
    }
}

/* ---- 1. one case ------------------------------------------------------------------------------ */

typedef struct dev_case {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
    float *lse;
    fc_sm90_bwd_args a;
} dev_case;

static int run_case(const bcase *c, const cudaDeviceProp *prop)
{
    const int B = c->batch, SQ = c->sq, SK = c->sk, HQ = c->hq, HK = c->hkv, D = c->d, bf = c->bf16;
    const int group = HQ / HK;
    const size_t nq = (size_t)B * SQ * HQ * D, nk = (size_t)B * SK * HK * D;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh;
    view_strides(c->bhsd, SQ, HQ, D, &q_sb, &q_ss, &q_sh);
    view_strides(c->bhsd, SK, HK, D, &k_sb, &k_ss, &k_sh);
    uint16_t *hq = (uint16_t *)malloc(nq * 2), *hk = (uint16_t *)malloc(nk * 2), *hv = (uint16_t *)malloc(nk * 2);
    uint16_t *hdo = (uint16_t *)malloc(nq * 2), *ho = (uint16_t *)malloc(nq * 2);
    uint16_t *gdq = (uint16_t *)malloc(nq * 2), *gdk = (uint16_t *)malloc(nk * 2), *gdv = (uint16_t *)malloc(nk * 2);
    float *hl = (float *)malloc((size_t)B * HQ * SQ * 4);
    for (size_t i = 0; i < nq; i++) hq[i] = to16(frand(), bf);
    for (size_t i = 0; i < nk; i++) hk[i] = to16(frand(), bf);
    for (size_t i = 0; i < nk; i++) hv[i] = to16(frand(), bf);
    for (size_t i = 0; i < nq; i++) hdo[i] = to16(frand(), bf);
    int n_slopes;
    float *hs = case_slopes(c->alibi, B, HQ, &n_slopes);

    /* reference, head by head; dQ in the q layout, dK / dV in the k layout */
    const double scale = 1.0 / sqrt((double)D);
    double *rdq = (double *)calloc(nq, 8), *rdk = (double *)calloc(nk, 8), *rdv = (double *)calloc(nk, 8);
    unsigned char *dq_zero = (unsigned char *)calloc((size_t)B * HQ * SQ, 1); /* rows seeing no key */
    unsigned char *dk_zero = (unsigned char *)calloc((size_t)B * HK * SK, 1); /* keys no query sees */
    {
        double *q = (double *)malloc((size_t)SQ * D * 8), *dout = (double *)malloc((size_t)SQ * D * 8);
        double *k = (double *)malloc((size_t)SK * D * 8), *v = (double *)malloc((size_t)SK * D * 8);
        double *o = (double *)malloc((size_t)SQ * D * 8), *lse = (double *)malloc((size_t)SQ * 8);
        double *dq = (double *)malloc((size_t)SQ * D * 8);
        double *p = (double *)malloc((size_t)SQ * SK * 8), *ds = (double *)malloc((size_t)SQ * SK * 8);
        double *dk = (double *)malloc((size_t)SK * D * 8), *dv = (double *)malloc((size_t)SK * D * 8);
        for (int b = 0; b < B; b++)
            for (int g = 0; g < HK; g++) {
                for (int j = 0; j < SK; j++)
                    for (int x = 0; x < D; x++) {
                        const size_t at = b * k_sb + j * k_ss + g * k_sh + x;
                        k[(size_t)j * D + x] = from16(hk[at], bf);
                        v[(size_t)j * D + x] = from16(hv[at], bf);
                    }
                memset(dk, 0, (size_t)SK * D * 8);
                memset(dv, 0, (size_t)SK * D * 8);
                for (int h = g * group; h < (g + 1) * group; h++) {
                    for (int i = 0; i < SQ; i++)
                        for (int x = 0; x < D; x++) {
                            const size_t at = b * q_sb + i * q_ss + h * q_sh + x;
                            q[(size_t)i * D + x] = from16(hq[at], bf);
                            dout[(size_t)i * D + x] = from16(hdo[at], bf);
                        }
                    ref_head r = {SQ, SK, D, c->causal, scale, q, k, v, dout, o, lse, dq, p, ds, dk, dv, c, 0.0};
                    if (c->alibi) r.slope = hs[c->alibi == 2 ? b * HQ + h : h];
                    par_for(SQ, ref_rows, &r);
                    par_for(SK, ref_keys, &r);
                    for (int i = 0; i < SQ; i++) {
                        hl[((size_t)b * HQ + h) * SQ + i] = (float)lse[i];
                        if (lse[i] == -INFINITY) dq_zero[((size_t)b * HQ + h) * SQ + i] = 1;
                        for (int x = 0; x < D; x++) {
                            const size_t at = b * q_sb + i * q_ss + h * q_sh + x;
                            ho[at] = to16((float)o[(size_t)i * D + x], bf);
                            rdq[at] = dq[(size_t)i * D + x];
                        }
                    }
                }
                for (int j = 0; j < SK; j++) {
                    int seen = 0;
                    for (int i = 0; i < SQ && !seen; i++) seen = visible(c, i, j);
                    if (!seen) dk_zero[((size_t)b * HK + g) * SK + j] = 1;
                    for (int x = 0; x < D; x++) {
                        const size_t at = b * k_sb + j * k_ss + g * k_sh + x;
                        rdk[at] = dk[(size_t)j * D + x];
                        rdv[at] = dv[(size_t)j * D + x];
                    }
                }
            }
        free(q), free(dout), free(k), free(v), free(o), free(lse), free(dq), free(p), free(ds), free(dk), free(dv);
    }

    char name[320], feat[100];
    case_features(c, feat, sizeof feat);
    snprintf(name, sizeof name, "b%d sq%d sk%d hq%d hkv%d d%d causal=%s %s %s%s%s", B, SQ, SK, HQ, HK, D,
             causal_name(c->causal), bf ? "bf16" : "fp16", c->bhsd ? "bhsd-view" : "bshd",
             c->det ? " deterministic" : "", feat);

    dev_case g;
    memset(&g, 0, sizeof g);
    CK(cudaMalloc(&g.q, nq * 2 + 16));
    CK(cudaMalloc(&g.o, nq * 2 + 16));
    CK(cudaMalloc(&g.dout, nq * 2 + 16));
    CK(cudaMalloc(&g.dq, nq * 2 + 16));
    CK(cudaMalloc(&g.k, nk * 2 + 16));
    CK(cudaMalloc(&g.v, nk * 2 + 16));
    CK(cudaMalloc(&g.dk, nk * 2 + 16));
    CK(cudaMalloc(&g.dv, nk * 2 + 16));
    CK(cudaMalloc(&g.lse, (size_t)B * HQ * SQ * 4 + 16));
    CK(cudaMemcpy(g.q, hq, nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.o, ho, nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.dout, hdo, nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.k, hk, nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.v, hv, nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.lse, hl, (size_t)B * HQ * SQ * 4, cudaMemcpyHostToDevice));
    fc_sm90_bwd_args *a = &g.a;
    a->q = g.q, a->k = g.k, a->v = g.v, a->o = g.o, a->dout = g.dout, a->lse = g.lse;
    a->dq = g.dq, a->dk = g.dk, a->dv = g.dv;
    a->q_sb = a->o_sb = a->do_sb = a->dq_sb = q_sb;
    a->q_ss = a->o_ss = a->do_ss = a->dq_ss = q_ss;
    a->q_sh = a->o_sh = a->do_sh = a->dq_sh = q_sh;
    a->k_sb = a->v_sb = a->dk_sb = a->dv_sb = k_sb;
    a->k_ss = a->v_ss = a->dk_ss = a->dv_ss = k_ss;
    a->k_sh = a->v_sh = a->dk_sh = a->dv_sh = k_sh;
    a->lse_sb = (int64_t)HQ * SQ, a->lse_sh = SQ, a->lse_ss = 1;
    a->batch = B, a->seqlen_q = SQ, a->seqlen_k = SK, a->heads_q = HQ, a->heads_kv = HK, a->head_dim = D;
    a->bf16 = bf, a->scale = (float)scale, a->causal = c->causal, a->deterministic = c->det;
    a->num_sms = prop->multiProcessorCount;
    a->window = c->window, a->window_left = c->wl, a->window_right = c->wr;
    a->softcap = c->softcap;
    float *dslopes = slopes_on_device(c->alibi, hs, n_slopes);
    a->alibi_slopes = dslopes, a->alibi_batch_stride = c->alibi == 2 ? HQ : 0;
    a->workspace_bytes = fc_sm90_backward_workspace_size(a);
    CK(cudaMalloc(&g.ws, a->workspace_bytes));
    a->workspace = g.ws;

    int ok = 1;
    if (!fc_sm90_backward_supported(a, prop->major, prop->minor, prop->sharedMemPerBlockOptin)) {
        printf("FAIL %s: not supported\n", name);
        ok = 0;
    } else {
        const int runs = c->det ? 2 : 1;
        int same = 1;
        for (int run = 0; run < runs && ok; run++) {
            CK(cudaMemset(g.dq, 0xff, nq * 2)); /* 0xffff is a NaN in fp16 and bf16 */
            CK(cudaMemset(g.dk, 0xff, nk * 2));
            CK(cudaMemset(g.dv, 0xff, nk * 2));
            CK(cudaMemset(g.ws, 0xff, a->workspace_bytes)); /* the pre-pass must set all it reads */
            CK(fc_sm90_backward(a, 0));
            sync_or_die(name);
            uint16_t *xq = gdq, *xk = gdk, *xv = gdv;
            if (run == 1) {
                xq = (uint16_t *)malloc(nq * 2), xk = (uint16_t *)malloc(nk * 2), xv = (uint16_t *)malloc(nk * 2);
            }
            CK(cudaMemcpy(xq, g.dq, nq * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(xk, g.dk, nk * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(xv, g.dv, nk * 2, cudaMemcpyDeviceToHost));
            if (run == 1) {
                same = !memcmp(xq, gdq, nq * 2) && !memcmp(xk, gdk, nk * 2) && !memcmp(xv, gdv, nk * 2);
                free(xq), free(xk), free(xv);
            }
        }
        /* compare */
        const uint16_t *got[3] = {gdq, gdk, gdv};
        const double *ref[3] = {rdq, rdk, rdv};
        const size_t n[3] = {nq, nk, nk};
        double rel[3];
        long nans = 0, bad_zero = 0;
        for (int t = 0; t < 3; t++) {
            double e2 = 0, r2 = 0;
            for (size_t i = 0; i < n[t]; i++) {
                const float x = from16(got[t][i], bf);
                if (isnan(x)) {
                    nans++;
                    continue;
                }
                e2 += (x - ref[t][i]) * (x - ref[t][i]);
                r2 += ref[t][i] * ref[t][i];
            }
            rel[t] = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HQ; h++)
                for (int i = 0; i < SQ; i++)
                    if (dq_zero[((size_t)b * HQ + h) * SQ + i])
                        for (int x = 0; x < D; x++)
                            if (from16(gdq[b * q_sb + i * q_ss + h * q_sh + x], bf) != 0.f) bad_zero++;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HK; h++)
                for (int j = 0; j < SK; j++)
                    if (dk_zero[((size_t)b * HK + h) * SK + j])
                        for (int x = 0; x < D; x++) {
                            const size_t at = b * k_sb + j * k_ss + h * k_sh + x;
                            if (from16(gdk[at], bf) != 0.f || from16(gdv[at], bf) != 0.f) bad_zero++;
                        }
        const double tol = bf ? 1e-2 : 1e-3;
        ok = nans == 0 && bad_zero == 0 && rel[0] <= tol && rel[1] <= tol && rel[2] <= tol && same;
        printf("%s %s: rel err dQ %.2e dK %.2e dV %.2e (tol %.0e), NaN %ld, nonzero where zero %ld%s\n",
               ok ? "PASS" : "FAIL", name, rel[0], rel[1], rel[2], tol, nans, bad_zero,
               c->det ? (same ? ", two runs bitwise equal" : ", TWO RUNS DIFFER") : "");
    }
    cudaFree(g.q), cudaFree(g.o), cudaFree(g.dout), cudaFree(g.dq), cudaFree(g.k), cudaFree(g.v);
    cudaFree(g.dk), cudaFree(g.dv), cudaFree(g.lse), cudaFree(g.ws);
    if (dslopes) cudaFree(dslopes);
    free(hs);
    free(hq), free(hk), free(hv), free(hdo), free(ho), free(gdq), free(gdk), free(gdv), free(hl);
    free(rdq), free(rdk), free(rdv), free(dq_zero), free(dk_zero);
    return ok;
}

/* ---- 3. timing --------------------------------------------------------------------------- */

/* bench_args, plus the backward's dout in buf[4] and dq, dk, dv in buf[5..7], laid out as q, k
 * and v are. */
static void bench_bwd_args(fc_sm90_bwd_args *a, void *const *buf, float *lse, int B, int S, int H, int D, int bf16,
                           int causal)
{
    bench_args(a, buf, lse, B, S, H, D, bf16, causal);
    a->dout = buf[4], a->dq = buf[5], a->dk = buf[6], a->dv = buf[7];
    a->do_sb = a->dq_sb = a->dk_sb = a->dv_sb = (int64_t)S * H * D;
    a->do_ss = a->dq_ss = a->dk_ss = a->dv_ss = (int64_t)H * D;
    a->do_sh = a->dq_sh = a->dk_sh = a->dv_sh = D;
}

/* Gives a the timing's one workspace, grown when a needs more: no allocation per shape. */
static void bench_workspace(fc_sm90_bwd_args *a, void **ws, size_t *ws_bytes)
{
    const size_t need = fc_sm90_backward_workspace_size(a);
    if (need > *ws_bytes) {
        if (*ws) CK(cudaFree(*ws));
        CK(cudaMalloc(ws, need));
        *ws_bytes = need;
    }
    a->workspace = *ws, a->workspace_bytes = *ws_bytes;
}

/* Completes a timed shape's arguments (the device's SM count, the timing's workspace) and says
 * whether the Hopper backward serves the shape. */
static int bench_ready(fc_sm90_bwd_args *a, const cudaDeviceProp *prop, void **ws, size_t *ws_bytes)
{
    a->num_sms = prop->multiProcessorCount;
    bench_workspace(a, ws, ws_bytes);
    return fc_sm90_backward_supported(a, prop->major, prop->minor, prop->sharedMemPerBlockOptin);
}

static void bench(const cudaDeviceProp *prop)
{
    printf("\nbench: 16k tokens, hidden 2048 (TFLOP/s = 2.5 * 4 b h s^2 d / t, halved when causal)\n");
    printf("%-6s %-4s %-7s %-6s %6s %6s %6s %10s %10s\n", "dtype", "d", "causal", "determ", "seqlen", "batch",
           "heads", "ms", "TFLOP/s");
    const int dims[2] = {64, 128};
    const int seqs[4] = {2048, 4096, 8192, 16384};
    const size_t elems = (size_t)16384 * 2048, bytes = elems * 2;
    void *buf[8]; /* q k v o dout dq dk dv */
    for (int i = 0; i < 8; i++) CK(cudaMalloc(&buf[i], bytes));
    {
        uint16_t *h = (uint16_t *)malloc(bytes);
        for (int i = 0; i < 5; i++) {
            for (size_t e = 0; e < elems; e++) h[e] = to16(frand() * 0.5f, 1);
            CK(cudaMemcpy(buf[i], h, bytes, cudaMemcpyHostToDevice));
        }
        free(h);
    }
    float *lse;
    const size_t nl = (size_t)16384 * 32;
    CK(cudaMalloc(&lse, nl * 4));
    void *ws = NULL;
    size_t ws_bytes = 0;
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal <= 1; causal++)
                for (int det = 0; det <= 1; det++)
                    for (int si = 0; si < 4; si++) {
                        const int D = dims[di], S = seqs[si], H = 2048 / D, B = 16384 / S;
                        if (bench_shape_skipped(bf16, D, causal, S)) continue;
                        {
                            /* LSE of a near-uniform row, so that P stays in range */
                            float *hl = (float *)malloc(nl * 4);
                            for (size_t i = 0; i < nl; i++) hl[i] = logf((float)S);
                            CK(cudaMemcpy(lse, hl, nl * 4, cudaMemcpyHostToDevice));
                            free(hl);
                        }
                        fc_sm90_bwd_args a;
                        bench_bwd_args(&a, buf, lse, B, S, H, D, bf16, causal);
                        a.deterministic = det;
                        if (!bench_ready(&a, prop, &ws, &ws_bytes)) {
                            printf("%-6s %-4d %-7d %-6d %6d: not supported\n", bf16 ? "bf16" : "fp16", D, causal, det, S);
                            continue;
                        }
                        const float ms = time_launch(fc_sm90_backward, &a, 2, 5, "bench");
                        const double flops = 2.5 * 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
                        printf("%-6s %-4d %-7d %-6d %6d %6d %6d %10.3f %10.1f\n", bf16 ? "bf16" : "fp16", D, causal,
                               det, S, B, H, ms, flops / (ms * 1e-3) / 1e12);
                        fflush(stdout);
                    }
    /* The feature kernel at one shape: a window must cost about its share of the blocks. */
    if (bench_features_skipped()) return;
    printf("\nfeatures: bf16 d128, seqlen 8192, batch 2, 16 heads (ms; TFLOP/s over the visible pairs)\n");
    float *slopes = bench_slopes();
    {
        float *hl = (float *)malloc(nl * 4);
        for (size_t i = 0; i < nl; i++) hl[i] = logf(8192.f);
        CK(cudaMemcpy(lse, hl, nl * 4, cudaMemcpyHostToDevice));
        free(hl);
    }
    static const struct { const char *name; int causal, window, wl, wr; float cap; int alibi, det; } fb[] = {
        {"none (plain kernel)", 0, 0, -1, -1, 0.f, 0, 0}, {"causal (plain kernel)", 1, 0, -1, -1, 0.f, 0, 0},
        {"window (-1, 0) (feature kernel)", 0, 1, -1, 0, 0.f, 0, 0},
        {"window (512, 512)", 0, 1, 512, 512, 0.f, 0, 0}, {"causal + window (1024, 0)", 1, 1, 1024, -1, 0.f, 0, 0},
        {"softcap 30", 0, 0, -1, -1, 30.f, 0, 0}, {"ALiBi, causal", 1, 0, -1, -1, 0.f, 1, 0},
        {"softcap + ALiBi + window (1024, 1024)", 0, 1, 1024, 1024, 30.f, 1, 0},
        {"softcap 30, deterministic", 0, 0, -1, -1, 30.f, 0, 1},
        {"window (-1, 0), deterministic", 0, 1, -1, 0, 0.f, 0, 1},
    };
    for (size_t f = 0; f < sizeof fb / sizeof fb[0]; f++) {
        const int D = 128, S = 8192, H = 16, B = 2;
        fc_sm90_bwd_args a;
        bench_bwd_args(&a, buf, lse, B, S, H, D, 1, fb[f].causal);
        a.window = fb[f].window, a.window_left = fb[f].wl, a.window_right = fb[f].wr;
        a.softcap = fb[f].cap, a.alibi_slopes = fb[f].alibi ? slopes : NULL;
        a.deterministic = fb[f].det;
        if (!bench_ready(&a, prop, &ws, &ws_bytes)) {
            printf("  %-40s not supported\n", fb[f].name);
            continue;
        }
        const float ms = time_launch(fc_sm90_backward, &a, 2, 5, "feature bench");
        const double pairs = visible_pairs(&a, S);
        printf("  %-40s %8.3f ms %8.1f TFLOP/s\n", fb[f].name, ms, 2.5 * 4.0 * B * H * pairs * D / (ms * 1e-3) / 1e12);
        fflush(stdout);
    }
    cudaFree(slopes);
    for (int i = 0; i < 8; i++) cudaFree(buf[i]);
    cudaFree(lse);
    if (ws) cudaFree(ws);
}

/* The backward's cases (with --small those of at most 20000 scores). */
static void checks(const cudaDeviceProp *prop, int small, int *pass, int *fail)
{
    /* batch, sq, sk, hq, hkv, d, causal, bf16, bhsd, deterministic */
    static const bcase cases[] = {
        {1, 1, 1, 2, 2, 64, 0, 0, 0, 0},        {1, 1, 1, 2, 2, 128, 1, 1, 0, 0},
        {2, 17, 17, 2, 2, 64, 0, 1, 0, 0},      {2, 17, 17, 2, 2, 128, 1, 0, 0, 0},
        {1, 17, 1000, 2, 1, 128, 1, 1, 0, 0},   {1, 1000, 17, 2, 1, 128, 1, 0, 0, 0},
        {1, 1000, 17, 2, 1, 64, 2, 1, 0, 0},    {1, 17, 1000, 2, 2, 64, 2, 0, 0, 0},
        {1, 130, 140, 4, 1, 64, 1, 0, 1, 1},    {1, 17, 300, 2, 1, 128, 0, 1, 0, 1},
        {1, 1000, 1000, 2, 2, 64, 0, 0, 0, 0},  {1, 1000, 1000, 2, 2, 128, 0, 1, 0, 0},
        {1, 1000, 1000, 2, 2, 128, 1, 0, 0, 0}, {1, 1000, 1000, 2, 2, 64, 2, 1, 0, 0},
        {1, 1000, 1000, 8, 1, 128, 0, 0, 0, 0}, {1, 1000, 1000, 8, 1, 64, 1, 1, 0, 0},
        {2, 1000, 1000, 2, 2, 128, 0, 0, 1, 0}, {2, 300, 1000, 4, 2, 64, 1, 1, 1, 0},
        {1, 1000, 700, 4, 1, 128, 1, 1, 0, 1},  {1, 700, 1000, 2, 2, 64, 0, 0, 0, 1},
        {1, 1000, 1000, 8, 1, 128, 2, 0, 0, 1}, {1, 4097, 4097, 1, 1, 128, 1, 1, 0, 0},
        /* deterministic without a mask, walks started apart (sm90b_det_rank) */
        {1, 1000, 1000, 2, 2, 128, 0, 1, 0, 1}, {2, 1000, 600, 4, 1, 128, 0, 0, 0, 1},
        /* d64 deterministic: the pair's dQ sum added in turn by the reducing warp */
        {1, 1000, 1000, 8, 1, 64, 1, 1, 0, 1},  {2, 1000, 600, 4, 1, 64, 0, 0, 1, 1},
        {1, 17, 1000, 2, 2, 64, 2, 1, 0, 1},
        /* features: ..., deterministic, window, wl, wr, softcap, alibi */
        {1, 130, 150, 2, 1, 64, 0, 0, 0, 0, 1, 20, 10, 0.f, 0},     /* window; blocks skipped */
        {1, 130, 150, 2, 2, 128, 1, 1, 0, 1, 1, 5, -1, 0.f, 0},     /* window + causal */
        {1, 100, 180, 2, 2, 128, 0, 0, 1, 0, 0, 0, 0, 10.f, 1},     /* softcap + ALiBi */
        {2, 120, 150, 2, 1, 64, 2, 1, 0, 0, 1, 30, 0, 5.f, 2},      /* all, per-batch slopes */
        {1, 150, 100, 2, 2, 64, 0, 0, 0, 0, 1, 0, 0, 0.f, 0},       /* rows that see no key */
        {1, 100, 150, 2, 2, 128, 0, 1, 0, 1, 1, 0, 0, 0.f, 0},      /* keys no row sees */
        {1, 1000, 1000, 2, 2, 128, 0, 1, 0, 0, 1, 37, 20, 0.f, 0},  /* window inside a block */
        {1, 1000, 1000, 2, 2, 64, 1, 0, 0, 0, 1, 100, -1, 0.f, 0},  /* window + causal */
        {2, 700, 1000, 4, 1, 64, 0, 1, 0, 1, 1, 200, 30, 10.f, 1},  /* d64 deterministic, all three */
        {2, 1000, 700, 4, 2, 128, 2, 1, 0, 1, 1, 300, -1, 0.f, 0},  /* top-left + window, GQA */
        {1, 1000, 1000, 2, 2, 128, 0, 0, 0, 0, 1, -1, 0, 0.f, 0},   /* (-1, 0) is causal */
        {1, 1000, 1000, 2, 2, 64, 0, 0, 0, 0, 1, 0, -1, 0.f, 0},    /* left edge only */
        {1, 1000, 1000, 2, 2, 128, 1, 1, 0, 0, 0, 0, 0, 30.f, 0},   /* softcap */
        {1, 1000, 1000, 2, 2, 64, 0, 0, 0, 0, 0, 0, 0, 5.f, 0},
        {2, 300, 1000, 4, 2, 64, 0, 0, 1, 0, 0, 0, 0, 0.f, 1},      /* ALiBi per head */
        {2, 1000, 1000, 2, 1, 128, 1, 1, 0, 0, 0, 0, 0, 0.f, 2},    /* ALiBi per batch */
        {1, 1000, 1000, 4, 2, 128, 0, 1, 0, 1, 1, 200, 50, 20.f, 2}, /* all three */
        {1, 1000, 17, 2, 1, 64, 1, 0, 0, 0, 1, 3, -1, 5.f, 1},      /* rows with no key */
        {1, 1000, 300, 2, 2, 128, 0, 1, 0, 0, 1, 0, 0, 0.f, 0},     /* whole blocks with none */
        {1, 300, 1000, 2, 2, 128, 2, 0, 1, 0, 1, 50, 2, 8.f, 2},    /* top-left ignores wr */
    };
    run_cases(cases, sizeof cases / sizeof cases[0], run_case, prop, small, 20000, pass, fail);
}

int main(int argc, char **argv)
{
    return check_main(argc, argv, checks, bench);
}
