/*
 * flashc.c - the command-line tool.
 *
 *   flashc demo   one realistic attention, forward and backward, on the best backend present;
 *                 a sample checked against the float64 reference; error, time and GFLOP/s
 *   flashc check  the seed checks (Triton tutorial, teaching script, teenygrad layout)
 *   flashc bench  times forward and backward for a shape
 *   flashc info   version, backends, CPU features
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "flashc.h"
#include "seed_checks.h"

typedef struct cli_options {
    const char *backend;
    int threads;
    int repeat;
    int backward;
    cli_problem problem;
} cli_options;

static void print_usage(const char *cmd)
{
    if (!cmd) {
        printf("usage: flashc <command> [options]\n\n"
               "commands:\n"
               "  demo    run one attention forward and backward, check a sample, time it\n"
               "  check   run the seed correctness checks against the float64 reference\n"
               "  bench   time forward and backward for one shape\n"
               "  info    print version, backends and CPU features\n\n"
               "'flashc <command> --help' lists the options of a command.\n");
        return;
    }
    printf("usage: flashc %s [options]\n\n", cmd);
    if (strcmp(cmd, "info") == 0) {
        printf("Prints the version, the backends built in and usable here, and CPU features.\n");
        return;
    }
    printf("options:\n"
           "  --backend NAME   auto (default), cpu, cuda or reference\n"
           "  --threads N      CPU worker threads (default: all cores)\n");
    if (strcmp(cmd, "check") == 0)
        return;
    printf("  --batch N        batch size (default 1)\n"
           "  --heads N        query heads (default 8)\n"
           "  --kv-heads N     key/value heads, dividing --heads (default: --heads)\n"
           "  --seqlen N       query length (default 2048)\n"
           "  --seqlen-k N     key length (default: --seqlen)\n"
           "  --dim N          head dim, 1..256 (default 64)\n"
           "  --dtype T        f32, f16 or bf16 (default bf16)\n"
           "  --causal MODE    none, bottom-right (default) or top-left\n"
           "  --no-causal      same as --causal none\n"
           "  --scale X        softmax scale (default 1/sqrt(dim))\n"
           "  --forward-only   skip the backward\n");
    if (strcmp(cmd, "bench") == 0)
        printf("  --repeat N       timed repetitions after one warm-up (default 5)\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* Parses argv[2..]; returns 0 and prints why on a bad option, 2 for --help. */
static int parse_options(const char *cmd, int argc, char **argv, cli_options *o)
{
    long kv_heads = 0, seqlen_k = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_usage(cmd);
            return 2;
        } else if (strcmp(a, "--no-causal") == 0) {
            o->problem.causal = FLASHC_CAUSAL_NONE;
            continue;
        } else if (strcmp(a, "--forward-only") == 0) {
            o->backward = 0;
            continue;
        }
        if (!val) {
            fprintf(stderr, "flashc %s: option %s needs a value (see --help)\n", cmd, a);
            return 0;
        }
        i++;
        if (strcmp(a, "--backend") == 0) {
            o->backend = val;
        } else if (strcmp(a, "--dtype") == 0) {
            o->problem.dtype = cli_parse_dtype(val);
            if (!o->problem.dtype) {
                fprintf(stderr, "flashc %s: --dtype must be f32, f16 or bf16\n", cmd);
                return 0;
            }
        } else if (strcmp(a, "--causal") == 0) {
            if (strcmp(val, "none") == 0 || strcmp(val, "0") == 0)
                o->problem.causal = FLASHC_CAUSAL_NONE;
            else if (strcmp(val, "bottom-right") == 0 || strcmp(val, "1") == 0)
                o->problem.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
            else if (strcmp(val, "top-left") == 0)
                o->problem.causal = FLASHC_CAUSAL_TOP_LEFT;
            else {
                fprintf(stderr, "flashc %s: --causal must be none, bottom-right or top-left\n",
                        cmd);
                return 0;
            }
        } else if (strcmp(a, "--scale") == 0) {
            char *end;
            double s = strtod(val, &end);
            if (*end != '\0' || !isfinite(s)) {
                fprintf(stderr, "flashc %s: --scale must be a number\n", cmd);
                return 0;
            }
            o->problem.scale = (float)s;
        } else {
            struct {
                const char *name;
                long lo, hi;
                long *dst;
            } ints[] = {{"--batch", 1, 1 << 20, NULL}, {"--heads", 1, 4096, NULL},
                        {"--kv-heads", 1, 4096, &kv_heads}, {"--seqlen", 1, 1 << 24, NULL},
                        {"--seqlen-k", 1, 1 << 24, &seqlen_k}, {"--dim", 1, 256, NULL},
                        {"--threads", 1, 4096, NULL}, {"--repeat", 1, 10000, NULL}};
            size_t j;
            for (j = 0; j < sizeof ints / sizeof ints[0]; j++)
                if (strcmp(a, ints[j].name) == 0)
                    break;
            if (j == sizeof ints / sizeof ints[0]) {
                fprintf(stderr, "flashc %s: unknown option %s (see --help)\n", cmd, a);
                return 0;
            }
            if (!parse_int(val, ints[j].lo, ints[j].hi, &n)) {
                fprintf(stderr, "flashc %s: %s must be an integer in %ld..%ld\n", cmd, a,
                        ints[j].lo, ints[j].hi);
                return 0;
            }
            if (ints[j].dst)
                *ints[j].dst = n;
            else if (j == 0)
                o->problem.batch = n;
            else if (j == 1)
                o->problem.heads_q = n;
            else if (j == 3)
                o->problem.seqlen_q = n;
            else if (j == 5)
                o->problem.head_dim = n;
            else if (j == 6)
                o->threads = (int)n;
            else
                o->repeat = (int)n;
        }
    }
    o->problem.heads_kv = kv_heads ? kv_heads : o->problem.heads_q;
    o->problem.seqlen_k = seqlen_k ? seqlen_k : o->problem.seqlen_q;
    if (o->problem.heads_q % o->problem.heads_kv != 0) {
        fprintf(stderr, "flashc %s: --heads must be a multiple of --kv-heads\n", cmd);
        return 0;
    }
    return 1;
}

static flashc_backend *open_backend(const cli_options *o)
{
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = o->threads;
    flashc_backend *be = NULL;
    if (flashc_backend_create(o->backend, &cfg, &be) != FLASHC_OK) {
        fprintf(stderr, "flashc: cannot open backend '%s': %s\n", o->backend ? o->backend : "auto",
                flashc_last_error());
        return NULL;
    }
    return be;
}

static int cmd_info(void)
{
    printf("flashc %s\n", flashc_version());
    const char *names[] = {"cpu", "cuda", "reference"};
    for (size_t i = 0; i < 3; i++) {
        flashc_backend *be = NULL;
        if (flashc_backend_create(names[i], NULL, &be) == FLASHC_OK) {
            printf("  backend %-9s available: %s\n", names[i], flashc_backend_describe(be));
            flashc_backend_destroy(be);
        } else {
            printf("  backend %-9s not available: %s\n", names[i], flashc_last_error());
        }
    }
    return 0;
}

static int cmd_check(const cli_options *o)
{
    flashc_backend *be = open_backend(o);
    if (!be)
        return 1;
    printf("seed checks on %s\n", flashc_backend_describe(be));
    int failed = flashc_run_seed_checks(be);
    flashc_backend_destroy(be);
    if (failed < 0)
        return 1;
    printf("%s: %d tensors failed\n", failed ? "FAILED" : "all seed checks passed", failed);
    return failed ? 1 : 0;
}

/* Copies rows [s0, s0 + n) of kv/q head h of batch 0 from a [B, S, H, D] host array into a
 * [1, n, 1, D] one. */
static void *slice_rows(const cli_problem *p, const void *src, int64_t seqlen, int64_t heads,
                        int64_t s0, int64_t n, int64_t h)
{
    size_t esize = flashc_dtype_size(p->dtype), row = (size_t)p->head_dim * esize;
    char *dst = malloc((size_t)n * row);
    for (int64_t s = 0; s < n && dst; s++)
        memcpy(dst + (size_t)s * row,
               (const char *)src + (size_t)(((s0 + s) * heads + h) * p->head_dim) * esize, row);
    (void)seqlen;
    return dst;
}

/* Relative error of rows [g0, g0 + n) of head h of a dense [1.., S, H, D] result against a
 * dense [1, n, 1, D] reference. */
static double sample_error(const cli_problem *p, const float *got, int64_t heads, int64_t g0,
                           int64_t n, int64_t h, const float *ref)
{
    double num = 0, den = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t d = 0; d < p->head_dim; d++) {
            double x = got[((g0 + s) * heads + h) * p->head_dim + d];
            double r = ref[s * p->head_dim + d];
            if (x != x)
                return INFINITY;
            num += (x - r) * (x - r);
            den += r * r;
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmd_demo_or_bench(const cli_options *o, int demo)
{
    const cli_problem *p = &o->problem;
    flashc_backend *be = open_backend(o);
    if (!be)
        return 1;
    printf("flashc %s on %s\n", flashc_version(), flashc_backend_describe(be));
    printf("shape: batch %lld, heads %lld/%lld, seqlen %lld x %lld, head dim %lld, %s, causal %s\n",
           (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv,
           (long long)p->seqlen_q, (long long)p->seqlen_k, (long long)p->head_dim,
           cli_dtype_name(p->dtype),
           p->causal == FLASHC_CAUSAL_NONE ? "none"
           : p->causal == FLASHC_CAUSAL_TOP_LEFT ? "top-left" : "bottom-right");
    uint64_t seed = 7;
    size_t qn = cli_q_elems(p), kn = cli_k_elems(p);
    void *q = cli_random_array(p->dtype, qn, 1.0, &seed);
    void *k = cli_random_array(p->dtype, kn, 1.0, &seed);
    void *v = cli_random_array(p->dtype, kn, 1.0, &seed);
    void *dout = o->backward ? cli_random_array(p->dtype, qn, 1.0, &seed) : NULL;
    cli_inputs in = {q, k, v, dout};
    cli_outputs out;
    int rc = 1;
    /* one untimed warm-up for bench; the demo times its single run */
    int repeat = demo ? 1 : o->repeat + 1;
    if (cli_run(be, p, &in, repeat, &out) != FLASHC_OK) {
        fprintf(stderr, "flashc: run failed: %s\n", flashc_last_error());
        goto done;
    }
    double flops = cli_forward_flops(p);
    printf("forward   %9.3f ms  %9.1f GFLOP/s\n", 1e3 * out.forward_seconds,
           flops / out.forward_seconds * 1e-9);
    if (o->backward)
        printf("backward  %9.3f ms  %9.1f GFLOP/s\n", 1e3 * out.backward_seconds,
               2.5 * flops / out.backward_seconds * 1e-9);
    rc = 0;
    if (demo) {
        /* The last n queries of batch 0, head 0, against all keys of its kv head: with a
         * bottom-right causal mask that sub-problem holds every query that sees the last n
         * keys, so their dK and dV are exact too. (Top-left: the first n queries.) */
        int64_t n = p->seqlen_q < 128 ? p->seqlen_q : 128, q0 = p->seqlen_q - n;
        /* top-left alignment counts from query 0: a sub-problem of the first n queries
         * keeps every one of their masks */
        if (p->causal == FLASHC_CAUSAL_TOP_LEFT)
            q0 = 0;
        cli_problem sub = *p;
        sub.batch = 1;
        sub.heads_q = sub.heads_kv = 1;
        sub.seqlen_q = n;
        sub.layout_bhsd = 0;
        void *sq = slice_rows(p, q, p->seqlen_q, p->heads_q, q0, n, 0);
        void *sk = slice_rows(p, k, p->seqlen_k, p->heads_kv, 0, p->seqlen_k, 0);
        void *sv = slice_rows(p, v, p->seqlen_k, p->heads_kv, 0, p->seqlen_k, 0);
        void *sdo = dout ? slice_rows(p, dout, p->seqlen_q, p->heads_q, q0, n, 0) : NULL;
        flashc_backend *ref = NULL;
        cli_outputs want;
        cli_inputs sin = {sq, sk, sv, sdo};
        if (flashc_backend_create("reference", NULL, &ref) == FLASHC_OK &&
            cli_run(ref, &sub, &sin, 1, &want) == FLASHC_OK) {
            double tol = p->dtype == FLASHC_F32 ? 1e-5 : p->dtype == FLASHC_F16 ? 5e-4 : 5e-3;
            double e_o = sample_error(p, out.o, p->heads_q, q0, n, 0, want.o);
            printf("check of the last %lld queries of head 0 against the float64 reference "
                   "(relative error, bound %.0e):\n  O %.2e", (long long)n, tol, e_o);
            double worst = e_o;
            if (o->backward) {
                double e_dq = sample_error(p, out.dq, p->heads_q, q0, n, 0, want.dq);
                printf("  dQ %.2e", e_dq);
                worst = e_dq > worst ? e_dq : worst;
                int exact_kv = p->causal == FLASHC_CAUSAL_BOTTOM_RIGHT && p->heads_q == p->heads_kv;
                int64_t kn0 = p->seqlen_k - n;
                if (exact_kv && kn0 >= 0) {
                    double e_dk = sample_error(p, out.dk, p->heads_kv, kn0, n, 0,
                                               want.dk + kn0 * p->head_dim);
                    double e_dv = sample_error(p, out.dv, p->heads_kv, kn0, n, 0,
                                               want.dv + kn0 * p->head_dim);
                    printf("  dK %.2e  dV %.2e (last %lld keys)", e_dk, e_dv, (long long)n);
                    worst = e_dk > worst ? e_dk : worst;
                    worst = e_dv > worst ? e_dv : worst;
                } else {
                    printf("  (dK/dV are sampled only for bottom-right causal MHA)");
                }
            }
            printf("\n%s\n", worst <= tol ? "sample check PASSED" : "sample check FAILED");
            rc = worst <= tol ? 0 : 1;
            cli_outputs_free(&want);
        } else {
            fprintf(stderr, "flashc: reference failed: %s\n", flashc_last_error());
            rc = 1;
        }
        flashc_backend_destroy(ref);
        free(sq);
        free(sk);
        free(sv);
        free(sdo);
    }
    cli_outputs_free(&out);
done:
    free(q);
    free(k);
    free(v);
    free(dout);
    flashc_backend_destroy(be);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_usage(NULL);
        return argc < 2 ? 1 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "demo") != 0 && strcmp(cmd, "check") != 0 && strcmp(cmd, "bench") != 0 &&
        strcmp(cmd, "info") != 0) {
        fprintf(stderr, "flashc: unknown command '%s'\n\n", cmd);
        print_usage(NULL);
        return 1;
    }
    cli_options o = {NULL, 0, 5, 1,
                     {FLASHC_BF16, 1, 2048, 2048, 8, 8, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, 0.0f, 0}};
    int parsed = parse_options(cmd, argc, argv, &o);
    if (parsed == 2)
        return 0;
    if (!parsed)
        return 1;
    if (strcmp(cmd, "info") == 0)
        return cmd_info();
    if (strcmp(cmd, "check") == 0)
        return cmd_check(&o);
    return cmd_demo_or_bench(&o, strcmp(cmd, "demo") == 0);
}
