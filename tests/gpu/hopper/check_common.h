/*
 * check_common.h - what the forward and backward Hopper checks do alike with an attention
 * case and a benchmark shape: the mask and feature rules of the float64 references, the
 * case's name, views and ALiBi slopes, the timed launches, and main. Templates where the two
 * checks' structs (fcase / bcase, fc_sm90_fwd_args / fc_sm90_bwd_args) name the same fields.
 * A header, so that each check stays the one .cu file of its own that build.sh compiles;
 * check_util.h holds the plumbing under it.
 */
#ifndef FLASHC_TESTS_CHECK_COMMON_H
#define FLASHC_TESTS_CHECK_COMMON_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"

/* ---- the cases --------------------------------------------------------------------------- */

static const char *causal_name(int c)
{
    return c == 0 ? "none" : c == 1 ? "bottom-right" : "top-left";
}

/* flashc.h's rules, written out one by one: does query i see key j? */
template <typename C>
static int visible(const C *c, int i, int j)
{
    const long off = c->causal == 2 ? 0 : (long)c->sk - c->sq;
    if (c->causal && j > i + off) return 0;
    if (c->window && c->wl >= 0 && j < i + off - c->wl) return 0;
    if (c->window && c->wr >= 0 && j > i + off + c->wr) return 0;
    return 1;
}

/* The features of a case as its name ends, e.g. " window=(37,20) softcap=30"; "" for none. */
template <typename C>
static void case_features(const C *c, char *feat, size_t size)
{
    feat[0] = '\0';
    if (c->window) snprintf(feat + strlen(feat), size - strlen(feat), " window=(%d,%d)", c->wl, c->wr);
    if (c->softcap > 0) snprintf(feat + strlen(feat), size - strlen(feat), " softcap=%g", c->softcap);
    if (c->alibi) snprintf(feat + strlen(feat), size - strlen(feat), " alibi=%s", c->alibi == 2 ? "batch" : "head");
}

/* Element strides of a tensor of seqlen x heads rows of d: BSHD, or the [b, h, s, d] view
 * when the case asks for it (bhsd), so that a strided view is checked too. */
static void view_strides(int bhsd, int seqlen, int heads, int d, int64_t *sb, int64_t *ss, int64_t *sh)
{
    if (bhsd) {
        *sb = (int64_t)heads * seqlen * d, *sh = (int64_t)seqlen * d, *ss = d;
    } else {
        *sb = (int64_t)seqlen * heads * d, *ss = (int64_t)heads * d, *sh = d;
    }
}

/* Host ALiBi slopes of both kinds: [heads] (alibi 1) or [batch, heads] (alibi 2), as ALiBi's
 * geometric ones are, times a random factor so that batches differ; *n of them. They come
 * from the inputs' frand stream: a call moved elsewhere changes every later case's inputs. */
static float *case_slopes(int alibi, int batch, int heads, int *n)
{
    *n = alibi == 2 ? batch * heads : heads;
    float *hs = (float *)malloc((size_t)*n * 4);
    for (int i = 0; i < *n; i++) hs[i] = powf(2.f, -8.f * (float)((i % heads) + 1) / heads) * (1.5f + frand());
    return hs;
}

/* The slopes in device memory, or NULL when the case has no ALiBi (the kernels' "off"). */
static float *slopes_on_device(int alibi, const float *hs, int n)
{
    float *d = NULL;
    if (alibi) {
        CK(cudaMalloc(&d, (size_t)n * 4));
        CK(cudaMemcpy(d, hs, (size_t)n * 4, cudaMemcpyHostToDevice));
    }
    return d;
}

/* ---- the timing -------------------------------------------------------------------------- */

/* The benchmark shapes' views: q, k, v and o in buf[0..3], all [B, S, H, D], and an LSE of
 * [B, H, S], in a zeroed Hopper argument struct (forward or backward name them alike). */
template <typename A>
static void bench_args(A *a, void *const *buf, float *lse, int B, int S, int H, int D, int bf16, int causal)
{
    memset(a, 0, sizeof *a);
    a->q = buf[0], a->k = buf[1], a->v = buf[2], a->o = buf[3], a->lse = lse;
    a->q_sb = a->k_sb = a->v_sb = a->o_sb = (int64_t)S * H * D;
    a->q_ss = a->k_ss = a->v_ss = a->o_ss = (int64_t)H * D;
    a->q_sh = a->k_sh = a->v_sh = a->o_sh = D;
    a->lse_sb = (int64_t)H * S, a->lse_sh = S, a->lse_ss = 1;
    a->batch = B, a->seqlen_q = a->seqlen_k = S, a->heads_q = a->heads_kv = H, a->head_dim = D;
    a->bf16 = bf16, a->scale = 1.f / sqrtf((float)D), a->causal = causal;
}

/* Milliseconds of one launch: the mean over iters, after warm launches that take the first
 * launch's costs out of it. what names the waits in a HANG report. The two events live as
 * long as the program: every timing of a check reuses them. */
template <typename A>
static float time_launch(cudaError_t (*launch)(const A *, cudaStream_t), const A *a, int warm, int iters,
                         const char *what)
{
    static cudaEvent_t e0, e1;
    if (!e0) {
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
    }
    char warm_what[64];
    snprintf(warm_what, sizeof warm_what, "%s warm-up", what);
    for (int w = 0; w < warm; w++) CK(launch(a, 0));
    sync_or_die(warm_what);
    CK(cudaEventRecord(e0, 0));
    for (int it = 0; it < iters; it++) CK(launch(a, 0));
    CK(cudaEventRecord(e1, 0));
    sync_or_die(what);
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / iters;
}

/* The feature timing's 16 ALiBi slopes in device memory, geometric as ALiBi's are. */
static float *bench_slopes(void)
{
    float *slopes;
    CK(cudaMalloc(&slopes, 16 * 4));
    float hs[16];
    for (int i = 0; i < 16; i++) hs[i] = powf(2.f, -0.5f * (i + 1));
    CK(cudaMemcpy(slopes, hs, sizeof hs, cudaMemcpyHostToDevice));
    return slopes;
}

/* The (query, key) pairs one head of a's mask and window lets through when both seqlens are S:
 * a feature timing's TFLOP/s counts only the work a window leaves. */
template <typename A>
static double visible_pairs(const A *a, int S)
{
    double pairs = 0;
    for (long i = 0; i < S; i++) {
        long lo = 0, hi = S;
        if (a->causal && i + 1 < hi) hi = i + 1;
        if (a->window && a->window_right >= 0 && i + a->window_right + 1 < hi) hi = i + a->window_right + 1;
        if (a->window && a->window_left >= 0 && i - a->window_left > lo) lo = i - a->window_left;
        if (hi > lo) pairs += (double)(hi - lo);
    }
    return pairs;
}

/* ---- main ------------------------------------------------------------------------------ */

/* Runs the cases, with --small only those of at most small_scores scores per head (what
 * compute-sanitizer gets through in reasonable time), adding them to *pass and *fail. */
template <typename C>
static void run_cases(const C *cases, size_t n, int (*run_case)(const C *, const cudaDeviceProp *),
                      const cudaDeviceProp *prop, int small, long small_scores, int *pass, int *fail)
{
    for (size_t i = 0; i < n; i++) {
        if (small && (long)cases[i].sq * cases[i].sk > small_scores) continue;
        if (run_case(&cases[i], prop)) (*pass)++;
        else (*fail)++;
        fflush(stdout);
    }
}

/* The main of both checks, whose options (argv[1]: --check-only, --bench-only or --small),
 * output and exit status run.sh and tests/gpu/run.sh rely on: checks (small: --small) then
 * the SUMMARY line, then the timing; 0 when every check passed, 1 on a failure or a device
 * other than sm_90. */
static int check_main(int argc, char **argv,
                      void (*checks)(const cudaDeviceProp *, int small, int *pass, int *fail),
                      void (*bench)(const cudaDeviceProp *))
{
    int do_check = 1, do_bench = 1, small = 0;
    if (argc > 1 && !strcmp(argv[1], "--check-only")) do_bench = 0;
    if (argc > 1 && !strcmp(argv[1], "--bench-only")) do_check = 0;
    if (argc > 1 && !strcmp(argv[1], "--small")) do_bench = 0, small = 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d%d, %d SMs, %zu bytes shared memory per block (opt-in)\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, (size_t)prop.sharedMemPerBlockOptin);
    if (prop.major != 9 || prop.minor != 0) {
        printf("not an sm_90 device: nothing to check\n");
        return 1;
    }
    int pass = 0, fail = 0;
    if (do_check) {
        checks(&prop, small, &pass, &fail);
        printf("\nSUMMARY: %d passed, %d failed\n", pass, fail);
    }
    if (do_bench) bench(&prop);
    return fail == 0 ? 0 : 1;
}

#endif
