/*
 * check_fwd_sm90.cu - standalone check and timing of the Hopper forward (src/cuda/hopper).
 *
 * Builds from the kernel's own files only (build.sh): no libflashc, no CMake. It
 *   1. runs a wgmma layout probe: one warpgroup multiplies small tiles (two 64-column panels
 *      each) written into shared memory in the 128-byte-swizzled layout, S = Q K^T through
 *      K-major descriptors and O = P V through the register form and an MN-major descriptor,
 *      against the CPU. When the
 *      forward is wrong, this says whether the descriptors are;
 *   2. runs the forward on random inputs of odd sizes (seqlen 1, 17, 1000, 4097; seqlen_q !=
 *      seqlen_k; head dims 64, 128, 256; no mask, causal bottom-right and top-left; GQA 8:1;
 *      a [batch, heads, seqlen, head_dim] strided view; and the feature kernel: sliding
 *      windows narrower than a block, with causal in both alignments, one-sided, softcap,
 *      ALiBi slopes per head and per (batch, head), all three at once, rows and whole tiles
 *      that see no key), with O and LSE poisoned with NaN
 *      first, against a float64 CPU reference: relative error ||O - ref|| / ||ref|| at most
 *      5e-4 for fp16 and 5e-3 for bf16, LSE within 1e-3 absolute (and -inf exactly where a row
 *      sees no key);
 *   3. times the kernel with CUDA events at the benchmark shapes (16k tokens, hidden 2048) and
 *      prints TFLOP/s (4 * batch * heads * seqlen^2 * head_dim, halved when causal), then the
 *      feature kernel at one shape (window, softcap, ALiBi) beside the plain one.
 *
 * Usage: check_fwd_sm90 [--check-only | --bench-only | --small]. --small runs the probe and the
 * cases with at most 1000 x 1000 scores per head, no timing (for compute-sanitizer, which is
 * slow). Exit status 0 when every check passed. A kernel that does not finish within 30 s (or
 * FLASHC_HANG_SECONDS) is reported as a hang and the program exits 3.
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

#include "check_common.h"
#include "check_util.h"
#include "../../../src/cuda/hopper/fwd_sm90.h"
#include "../../../src/cuda/hopper/sm90_ptx.cuh"

/* ---- 1. wgmma layout probe ----------------------------------------------------------------
 * One warpgroup; Q [64][128], K [64 keys][128], V [64 keys][128], each two 128-byte-swizzled
 * [64][64] panels (so the panel steps are exercised, not only the atoms). S = Q K^T (SS,
 * K-major, N = 64, 8 k-steps over two panels), then P = bf16(S / 16) and O = P V (RS, V
 * MN-major with LBO = the panel stride, N = 128). Writes S [64][64] and O [64][128] in fp32. */
#define PR_D 128
#define PR_PANEL 8192 /* bytes of one [64][64] panel */

__device__ __forceinline__ uint32_t swz(int r, int c) /* byte offset of (r, c) in a tile */
{
    const int pn = c >> 6;
    c &= 63;
    return pn * PR_PANEL + r * 128 + ((((c >> 3) ^ (r & 7)) << 4) | ((c & 7) * 2));
}

__global__ void __launch_bounds__(128, 1) probe_kernel(const uint16_t *q, const uint16_t *k,
                                                       const uint16_t *v, float *s_out, float *o_out)
{
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(1024) uint8_t sm[3 * 2 * PR_PANEL];
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    for (int i = t; i < 64 * PR_D; i += 128) {
        const int r = i / PR_D, c = i % PR_D;
        *(uint16_t *)(sm + swz(r, c)) = q[i];
        *(uint16_t *)(sm + 2 * PR_PANEL + swz(r, c)) = k[i];
        *(uint16_t *)(sm + 4 * PR_PANEL + swz(r, c)) = v[i];
    }
    sm90_fence_proxy_async(); /* ordinary stores, read next by the tensor core */
    __syncthreads();
    const uint32_t base = sm90_smem_addr(sm);
    float s[32], o[64];
    for (int j = 0; j < 64; j++) o[j] = 0.f;
    sm90_wgmma_fence();
    for (int kk = 0; kk < PR_D / 16; kk++) {
        const uint32_t panel = (kk >> 2) * PR_PANEL, off = (kk & 3) * 32;
        sm90_wgmma_ss<64, 1, 0>(s, sm90_desc_kmajor(base, panel, off), sm90_desc_kmajor(base + 2 * PR_PANEL, panel, off),
                                kk > 0);
    }
    sm90_wgmma_commit();
    sm90_fence_regs(s);
    sm90_wgmma_wait<0>();
    sm90_fence_regs(s);
    uint32_t pf[4][4];
    for (int kk = 0; kk < 4; kk++)
        for (int r = 0; r < 4; r++)
            pf[kk][r] = sm90_pack2<1>(s[8 * kk + 2 * r] * 0.0625f, s[8 * kk + 2 * r + 1] * 0.0625f);
    sm90_wgmma_fence();
    for (int kk = 0; kk < 4; kk++)
        sm90_wgmma_rs<128, 1, 1>(o, pf[kk], sm90_desc_mnmajor(base + 4 * PR_PANEL, PR_PANEL, kk * 2048), 1);
    sm90_wgmma_commit();
    sm90_fence_regs(o);
    sm90_wgmma_wait<0>();
    sm90_fence_regs(o);
    for (int j = 0; j < 64; j++) {
        const int row = 16 * warp + (lane >> 2) + 8 * ((j >> 1) & 1);
        const int col = 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
        if (j < 32) s_out[row * 64 + col] = s[j];
        o_out[row * PR_D + col] = o[j];
    }
#endif
}

static int run_probe(void)
{
    enum { N = 64 * PR_D };
    static uint16_t hq[N], hk[N], hv[N];
    for (int i = 0; i < N; i++) {
        hq[i] = to16(frand(), 1);
        hk[i] = to16(frand(), 1);
        hv[i] = to16(frand(), 1);
    }
    uint16_t *dq, *dk, *dv;
    float *ds, *dout;
    CK(cudaMalloc(&dq, N * 2));
    CK(cudaMalloc(&dk, N * 2));
    CK(cudaMalloc(&dv, N * 2));
    CK(cudaMalloc(&ds, 64 * 64 * 4));
    CK(cudaMalloc(&dout, N * 4));
    CK(cudaMemcpy(dq, hq, N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk, N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv, N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(ds, 0xff, 64 * 64 * 4));
    CK(cudaMemset(dout, 0xff, N * 4));
    probe_kernel<<<1, 128>>>(dq, dk, dv, ds, dout);
    CK(cudaGetLastError());
    sync_or_die("wgmma probe");
    static float s[64 * 64], o[N], p[64 * 64];
    CK(cudaMemcpy(s, ds, sizeof s, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(o, dout, sizeof o, cudaMemcpyDeviceToHost));
    double es = 0, ns = 0, eo = 0, no = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++) {
            double acc = 0;
            for (int c = 0; c < PR_D; c++) acc += (double)from16(hq[i * PR_D + c], 1) * from16(hk[j * PR_D + c], 1);
            es += (s[i * 64 + j] - acc) * (s[i * 64 + j] - acc);
            ns += acc * acc;
            p[i * 64 + j] = from16(to16(s[i * 64 + j] * 0.0625f, 1), 1); /* what the kernel fed in */
        }
    for (int i = 0; i < 64; i++)
        for (int c = 0; c < PR_D; c++) {
            double acc = 0;
            for (int j = 0; j < 64; j++) acc += (double)p[i * 64 + j] * from16(hv[j * PR_D + c], 1);
            eo += (o[i * PR_D + c] - acc) * (o[i * PR_D + c] - acc);
            no += acc * acc;
        }
    const double rs = sqrt(es / ns), ro = sqrt(eo / no);
    const int ok = rs < 1e-5 && ro < 1e-5; /* fp32 accumulation of exact products */
    printf("%s wgmma probe: S = Q K^T (SS, K-major, 2 panels) rel err %.2e; "
           "O = P V (RS, MN-major V, 2 panels) rel err %.2e\n",
           ok ? "PASS" : "FAIL", rs, ro);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(ds), cudaFree(dout);
    return ok;
}

/* ---- 2. forward against the float64 reference --------------------------------------------- */

typedef struct fcase {
    int batch, sq, sk, hq, hkv, d, causal, bf16, bhsd;
    /* features (the feature kernel): a window (wl, wr; -1 = unbounded side) when window is
     * set, a softcap (0 = off), ALiBi slopes (0 off, 1 one set per head, 2 per batch and head) */
    int window, wl, wr;
    float softcap;
    int alibi;
} fcase;

/* The ALiBi slope of (b, h), as the case stores it: 0 when off. */
static float case_slope(const fcase *c, const float *slopes, int b, int h)
{
    if (!c->alibi) return 0.f;
    return slopes[c->alibi == 2 ? b * c->hq + h : h];
}

/* One query row's share of the comparison with the float64 reference. */
typedef struct ref_row {
    double err2, ref2, lse_err;
    long nan_o, bad_lse;
} ref_row;

/* What the reference rows read: the case, its inputs as doubles (in the 16-bit tensors'
 * layout), the kernel's O and LSE, and a slot per row ([b][h][i]) for the results. */
typedef struct ref_job {
    const fcase *c;
    const float *hs;
    const uint16_t *ho;
    const float *hl;
    double *qd, *kd, *vd;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh;
    ref_row *rows;
} ref_job;

static double *to_doubles(const uint16_t *x, size_t n, int bf16)
{
    double *d = (double *)malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = from16(x[i], bf16);
    return d;
}

/* Rows [lo, hi) of [batch][heads_q][seqlen_q]: softmax(scale Q K^T + features) V in float64
 * against the kernel's O, and the LSE against the kernel's. */
static void ref_rows(void *ctx, long lo, long hi)
{
    const ref_job *j = (const ref_job *)ctx;
    const fcase *c = j->c;
    const int SQ = c->sq, SK = c->sk, HQ = c->hq, D = c->d, group = c->hq / c->hkv;
    const double scale = 1.0 / sqrt((double)D);
    const long off = c->causal == 2 ? 0 : (long)SK - SQ;
    double *sc = (double *)malloc((size_t)SK * 8), *acc = (double *)malloc((size_t)D * 8);
    int *vis = (int *)malloc((size_t)SK * sizeof(int));
    for (long r = lo; r < hi; r++) {
        const int i = (int)(r % SQ), h = (int)(r / SQ % HQ), b = (int)(r / SQ / HQ), hk_ = h / group;
        ref_row *out = &j->rows[r];
        const double *qr = j->qd + b * j->q_sb + i * j->q_ss + h * j->q_sh;
        const uint16_t *orow = j->ho + b * j->q_sb + i * j->q_ss + h * j->q_sh;
        const double slope = case_slope(c, j->hs, b, h);
        double mx = -INFINITY;
        int e = 0; /* keys seen */
        for (int k = 0; k < SK; k++) {
            vis[k] = visible(c, i, k);
            if (!vis[k]) continue;
            e++;
            const double *kr = j->kd + b * j->k_sb + k * j->k_ss + hk_ * j->k_sh;
            double dot = 0;
            for (int x = 0; x < D; x++) dot += qr[x] * kr[x];
            double xs = dot * scale; /* scale, softcap, ALiBi: flashc.h's order */
            if (c->softcap > 0) xs = c->softcap * tanh(xs / c->softcap);
            if (c->alibi) xs -= slope * fabs((double)(i + off - k));
            sc[k] = xs;
            if (sc[k] > mx) mx = sc[k];
        }
        double sum = 0;
        for (int x = 0; x < D; x++) acc[x] = 0;
        for (int k = 0; k < SK; k++) {
            if (!vis[k]) continue;
            const double pk = exp(sc[k] - mx);
            sum += pk;
            const double *vr = j->vd + b * j->k_sb + k * j->k_ss + hk_ * j->k_sh;
            for (int x = 0; x < D; x++) acc[x] += pk * vr[x];
        }
        for (int x = 0; x < D; x++) {
            const double ref = e > 0 ? acc[x] / sum : 0.0;
            const float got = from16(orow[x], c->bf16);
            if (isnan(got)) out->nan_o++;
            out->err2 += (got - ref) * (got - ref);
            out->ref2 += ref * ref;
        }
        const double lref = e > 0 ? mx + log(sum) : -INFINITY;
        const float lgot = j->hl[(size_t)b * HQ * SQ + (size_t)h * SQ + i];
        if (e == 0) {
            if (!(isinf(lgot) && lgot < 0)) out->bad_lse++;
        } else if (!isfinite(lgot) || fabs(lgot - lref) > 1e-3) {
            out->bad_lse++;
        } else {
            out->lse_err = fabs(lgot - lref);
        }
    }
    free(sc), free(acc), free(vis);
}

static int run_case(const fcase *c, const cudaDeviceProp *prop)
{
    const int B = c->batch, SQ = c->sq, SK = c->sk, HQ = c->hq, HK = c->hkv, D = c->d;
    const size_t nq = (size_t)B * SQ * HQ * D, nk = (size_t)B * SK * HK * D;
    uint16_t *hq = (uint16_t *)malloc(nq * 2), *hk = (uint16_t *)malloc(nk * 2),
             *hv = (uint16_t *)malloc(nk * 2), *ho = (uint16_t *)malloc(nq * 2);
    float *hl = (float *)malloc((size_t)B * HQ * SQ * 4);
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh;
    view_strides(c->bhsd, SQ, HQ, D, &q_sb, &q_ss, &q_sh);
    view_strides(c->bhsd, SK, HK, D, &k_sb, &k_ss, &k_sh);
    for (size_t i = 0; i < nq; i++) hq[i] = to16(frand(), c->bf16);
    for (size_t i = 0; i < nk; i++) hk[i] = to16(frand(), c->bf16);
    for (size_t i = 0; i < nk; i++) hv[i] = to16(frand(), c->bf16);
    int n_slopes;
    float *hs = case_slopes(c->alibi, B, HQ, &n_slopes);

    void *dq, *dk, *dv, *dout;
    float *dl;
    CK(cudaMalloc(&dq, nq * 2 + 16));
    CK(cudaMalloc(&dk, nk * 2 + 16));
    CK(cudaMalloc(&dv, nk * 2 + 16));
    CK(cudaMalloc(&dout, nq * 2 + 16));
    CK(cudaMalloc(&dl, (size_t)B * HQ * SQ * 4 + 16));
    CK(cudaMemcpy(dq, hq, nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk, nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv, nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, nq * 2)); /* 0xffff is a NaN in fp16 and bf16 */
    CK(cudaMemset(dl, 0xff, (size_t)B * HQ * SQ * 4));
    float *dslopes = slopes_on_device(c->alibi, hs, n_slopes);

    fc_sm90_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = dq, a.k = dk, a.v = dv, a.o = dout, a.lse = dl;
    a.q_sb = q_sb, a.q_ss = q_ss, a.q_sh = q_sh;
    a.k_sb = k_sb, a.k_ss = k_ss, a.k_sh = k_sh;
    a.v_sb = k_sb, a.v_ss = k_ss, a.v_sh = k_sh;
    a.o_sb = q_sb, a.o_ss = q_ss, a.o_sh = q_sh; /* O in the same layout as Q */
    a.lse_sb = (int64_t)HQ * SQ, a.lse_sh = SQ, a.lse_ss = 1;
    a.batch = B, a.seqlen_q = SQ, a.seqlen_k = SK, a.heads_q = HQ, a.heads_kv = HK, a.head_dim = D;
    a.bf16 = c->bf16;
    a.scale = 1.f / sqrtf((float)D);
    a.causal = c->causal;
    a.window = c->window, a.window_left = c->wl, a.window_right = c->wr;
    a.softcap = c->softcap;
    a.alibi_slopes = dslopes, a.alibi_batch_stride = c->alibi == 2 ? HQ : 0;

    char name[300], feat[100];
    case_features(c, feat, sizeof feat);
    snprintf(name, sizeof name, "b%d sq%d sk%d hq%d hkv%d d%d causal=%s %s %s%s", B, SQ, SK, HQ, HK, D,
             causal_name(c->causal), c->bf16 ? "bf16" : "fp16", c->bhsd ? "bhsd-view" : "bshd", feat);
    if (!fc_sm90_forward_supported(&a, prop->major, prop->minor, prop->sharedMemPerBlockOptin)) {
        printf("FAIL %s: not supported\n", name);
        return 0;
    }
    CK(fc_sm90_forward(&a, 0));
    sync_or_die(name);
    CK(cudaMemcpy(ho, dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl, dl, (size_t)B * HQ * SQ * 4, cudaMemcpyDeviceToHost));

    /* float64 reference, row by row on all cores; each row's error terms land in its own
     * slot and are summed in row order, so the figures do not depend on the thread count */
    ref_job rj;
    rj.c = c, rj.hs = hs, rj.ho = ho, rj.hl = hl;
    rj.q_sb = q_sb, rj.q_ss = q_ss, rj.q_sh = q_sh, rj.k_sb = k_sb, rj.k_ss = k_ss, rj.k_sh = k_sh;
    rj.qd = to_doubles(hq, nq, c->bf16), rj.kd = to_doubles(hk, nk, c->bf16), rj.vd = to_doubles(hv, nk, c->bf16);
    const long rows = (long)B * HQ * SQ;
    rj.rows = (ref_row *)calloc((size_t)rows, sizeof(ref_row));
    par_for(rows, ref_rows, &rj);
    double err2 = 0, ref2 = 0, lse_err = 0;
    long nan_o = 0, bad_lse = 0;
    for (long r = 0; r < rows; r++) {
        err2 += rj.rows[r].err2, ref2 += rj.rows[r].ref2;
        nan_o += rj.rows[r].nan_o, bad_lse += rj.rows[r].bad_lse;
        if (rj.rows[r].lse_err > lse_err) lse_err = rj.rows[r].lse_err;
    }
    free(rj.rows), free(rj.qd), free(rj.kd), free(rj.vd);
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    const double tol = c->bf16 ? 5e-3 : 5e-4;
    const int ok = nan_o == 0 && bad_lse == 0 && rel <= tol;
    printf("%s %s: O rel err %.2e (tol %.0e), LSE max abs err %.2e, NaN in O %ld, bad LSE rows %ld\n",
           ok ? "PASS" : "FAIL", name, rel, tol, lse_err, nan_o, bad_lse);
    free(hs);
    if (dslopes) cudaFree(dslopes);
    free(hq), free(hk), free(hv), free(ho), free(hl);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dl);
    return ok;
}

/* ---- 3. timing --------------------------------------------------------------------------- */

static void bench(const cudaDeviceProp *prop)
{
    printf("\nbench: 16k tokens, hidden 2048 (TFLOP/s = 4 b h s^2 d / t, halved when causal)\n");
    printf("%-6s %-5s %-7s %6s %6s %6s %10s %10s\n", "dtype", "d", "causal", "seqlen", "batch", "heads",
           "ms", "TFLOP/s");
    const int dims[3] = {64, 128, 256};
    const int seqs[4] = {2048, 4096, 8192, 16384};
    void *buf[4];
    const size_t bytes = (size_t)16384 * 2048 * 2;
    for (int i = 0; i < 4; i++) {
        CK(cudaMalloc(&buf[i], bytes));
        CK(cudaMemset(buf[i], 0, bytes));
    }
    /* fill q, k, v with small random values so the exponentials are not degenerate */
    {
        uint16_t *h = (uint16_t *)malloc(bytes);
        for (int i = 0; i < 3; i++) {
            for (size_t e = 0; e < bytes / 2; e++) h[e] = to16(frand() * 0.5f, 1);
            CK(cudaMemcpy(buf[i], h, bytes, cudaMemcpyHostToDevice));
        }
        free(h);
    }
    float *lse;
    CK(cudaMalloc(&lse, (size_t)16384 * 32 * 4));
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (int di = 0; di < 3; di++)
            for (int causal = 0; causal <= 1; causal++)
                for (int si = 0; si < 4; si++) {
                    const int D = dims[di], S = seqs[si], H = 2048 / D, B = 16384 / S;
                    if (bench_shape_skipped(bf16, D, causal, S)) continue;
                    fc_sm90_fwd_args a;
                    bench_args(&a, buf, lse, B, S, H, D, bf16, causal);
                    if (!fc_sm90_forward_supported(&a, prop->major, prop->minor, prop->sharedMemPerBlockOptin)) {
                        printf("%-6s %-5d %-7d %6d: not supported\n", bf16 ? "bf16" : "fp16", D, causal, S);
                        continue;
                    }
                    const float ms = time_launch(fc_sm90_forward, &a, 3, 10, "bench");
                    const double flops = 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
                    printf("%-6s %-5d %-7d %6d %6d %6d %10.3f %10.1f\n", bf16 ? "bf16" : "fp16", D, causal, S, B,
                           H, ms, flops / (ms * 1e-3) / 1e12);
                }
    /* The feature kernel at one shape: a window must cost about its share of the blocks. */
    if (bench_features_skipped()) return;
    printf("\nfeatures: bf16 d128, seqlen 8192, batch 2, 16 heads (ms; TFLOP/s over the visible pairs)\n");
    float *slopes = bench_slopes();
    static const struct { const char *name; int causal, window, wl, wr; float cap; int alibi; } fb[] = {
        {"none (plain kernel)", 0, 0, -1, -1, 0.f, 0}, {"causal (plain kernel)", 1, 0, -1, -1, 0.f, 0},
        {"window (-1, -1) (plain kernel)", 0, 1, -1, -1, 0.f, 0},
        {"window (-1, 0) (feature kernel)", 0, 1, -1, 0, 0.f, 0},
        {"window (512, 512)", 0, 1, 512, 512, 0.f, 0}, {"causal + window (1024, 0)", 1, 1, 1024, -1, 0.f, 0},
        {"softcap 30", 0, 0, -1, -1, 30.f, 0}, {"ALiBi, causal", 1, 0, -1, -1, 0.f, 1},
        {"softcap + ALiBi + window (1024, 1024)", 0, 1, 1024, 1024, 30.f, 1},
    };
    for (size_t f = 0; f < sizeof fb / sizeof fb[0]; f++) {
        const int D = 128, S = 8192, H = 16, B = 2;
        fc_sm90_fwd_args a;
        bench_args(&a, buf, lse, B, S, H, D, 1, fb[f].causal);
        a.window = fb[f].window, a.window_left = fb[f].wl, a.window_right = fb[f].wr;
        a.softcap = fb[f].cap, a.alibi_slopes = fb[f].alibi ? slopes : NULL;
        if (!fc_sm90_forward_supported(&a, prop->major, prop->minor, prop->sharedMemPerBlockOptin)) {
            printf("  %-40s not supported\n", fb[f].name);
            continue;
        }
        const float ms = time_launch(fc_sm90_forward, &a, 3, 10, "feature bench");
        const double pairs = visible_pairs(&a, S);
        printf("  %-40s %8.3f ms %8.1f TFLOP/s\n", fb[f].name, ms, 4.0 * B * H * pairs * D / (ms * 1e-3) / 1e12);
    }
    cudaFree(slopes);
    for (int i = 0; i < 4; i++) cudaFree(buf[i]);
    cudaFree(lse);
}

/* The layout probe, then the forward's cases (--small: those of at most 1000 x 1000 scores). */
static void checks(const cudaDeviceProp *prop, int small, int *pass, int *fail)
{
    if (run_probe()) (*pass)++;
    else (*fail)++;
    /* batch, sq, sk, hq, hkv, d, causal, bf16, bhsd */
    static const fcase cases[] = {
        {1, 1, 1, 2, 2, 64, 0, 0, 0},          {1, 1, 1, 2, 2, 128, 1, 1, 0},
        {2, 17, 17, 2, 2, 64, 0, 1, 0},        {2, 17, 17, 2, 2, 128, 1, 0, 0},
        {1, 17, 1000, 2, 1, 128, 1, 1, 0},     {1, 1000, 17, 2, 1, 128, 1, 0, 0},
        {1, 1000, 17, 2, 1, 64, 2, 1, 0},      {1, 1000, 1000, 2, 2, 64, 0, 0, 0},
        {1, 1000, 1000, 2, 2, 128, 0, 1, 0},   {1, 1000, 1000, 2, 2, 128, 1, 0, 0},
        {1, 1000, 1000, 2, 2, 64, 2, 1, 0},    {1, 1000, 1000, 8, 1, 128, 0, 0, 0},
        {1, 1000, 1000, 8, 1, 64, 1, 1, 0},    {2, 1000, 1000, 2, 2, 128, 0, 0, 1},
        {2, 300, 1000, 4, 2, 64, 1, 1, 1},     {1, 4097, 4097, 1, 1, 128, 0, 1, 0},
        {1, 4097, 4097, 1, 1, 64, 1, 0, 0},    {1, 4097, 4097, 1, 1, 128, 1, 0, 0},
        {1, 17, 17, 2, 2, 256, 0, 1, 0},       {1, 1000, 1000, 2, 1, 256, 1, 0, 0},
        {1, 1000, 300, 2, 2, 256, 1, 1, 1},
        {1, 1000, 300, 2, 2, 64, 1, 1, 0},     /* d64 rows that see no key: whole tiles, and warpgroups of a tile */
        /* features: batch, sq, sk, hq, hkv, d, causal, bf16, bhsd, window, wl, wr, softcap, alibi */
        {1, 17, 17, 2, 2, 128, 0, 0, 0, 1, 2, 3, 10.f, 1},
        {1, 1000, 1000, 2, 2, 128, 0, 1, 0, 1, 37, 20, 0.f, 0},   /* window inside a block */
        {1, 1000, 1000, 2, 2, 64, 1, 0, 0, 1, 100, -1, 0.f, 0},   /* window + causal */
        {2, 1000, 700, 4, 2, 128, 2, 1, 0, 1, 300, -1, 0.f, 0},   /* top-left + window, GQA */
        {1, 1000, 1000, 2, 2, 128, 0, 0, 0, 1, -1, 0, 0.f, 0},    /* (-1, 0) is causal */
        {1, 1000, 1000, 2, 2, 256, 0, 0, 0, 1, 0, -1, 0.f, 0},    /* left edge only */
        {1, 1000, 1000, 2, 2, 128, 1, 1, 0, 0, 0, 0, 30.f, 0},    /* softcap */
        {1, 1000, 1000, 2, 2, 64, 0, 0, 0, 0, 0, 0, 5.f, 0},
        {2, 300, 1000, 4, 2, 64, 0, 0, 1, 0, 0, 0, 0.f, 1},       /* ALiBi per head */
        {2, 1000, 1000, 2, 1, 128, 1, 1, 0, 0, 0, 0, 0.f, 2},     /* ALiBi per batch */
        {1, 1000, 1000, 2, 2, 256, 0, 1, 0, 1, 200, 50, 20.f, 2}, /* all three */
        {1, 1000, 17, 2, 1, 64, 1, 0, 0, 1, 3, -1, 5.f, 1},       /* rows with no key */
        {1, 1000, 300, 2, 2, 128, 0, 1, 0, 1, 0, 0, 0.f, 0},      /* whole tiles with none */
        {1, 300, 1000, 2, 2, 128, 2, 0, 1, 1, 50, 2, 8.f, 2},     /* causal top-left ignores wr */
        {1, 4097, 4097, 1, 1, 128, 1, 1, 0, 1, 1000, -1, 0.f, 0},
        {1, 4097, 4097, 2, 2, 64, 0, 0, 0, 1, 256, 256, 50.f, 1},
    };
    run_cases(cases, sizeof cases / sizeof cases[0], run_case, prop, small, 1000000, pass, fail);
}

int main(int argc, char **argv)
{
    return check_main(argc, argv, checks, bench);
}
