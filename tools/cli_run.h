/*
 * cli_run.h - runs attention on any backend from host arrays: allocates the backend's memory,
 * copies the inputs in, times the forward and backward with the backend synchronized, and
 * brings the outputs back as dense float32. Shared by the CLI's demo, check and bench.
 */
#ifndef FLASHC_CLI_RUN_H
#define FLASHC_CLI_RUN_H

#include <stdint.h>

#include "flashc.h"

typedef struct cli_problem {
    flashc_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t causal;
    float scale;     /* 0: 1/sqrt(head_dim) */
    int layout_bhsd; /* 1: buffers are [batch, heads, seqlen, dim]; 0: [batch, seqlen, heads, dim] */
} cli_problem;

/* Host arrays of the problem's dtype, in the problem's layout. dout may be NULL (no backward). */
typedef struct cli_inputs {
    const void *q, *k, *v, *dout;
} cli_inputs;

/* Dense float32 results: o, dq like q, dk and dv like k ([batch, seqlen, heads, dim] whatever
 * the input layout), lse [batch, heads_q, seqlen_q]. Allocated by cli_run; cli_outputs_free. */
typedef struct cli_outputs {
    float *o, *lse, *dq, *dk, *dv;
    double forward_seconds, backward_seconds; /* best of the timed repetitions */
} cli_outputs;

/* Runs forward (and backward when in->dout) repeat times (>= 1) and keeps the last results.
 * Returns the first failing status, with flashc_last_error() set. */
flashc_status cli_run(flashc_backend *be, const cli_problem *p, const cli_inputs *in, int repeat,
                      cli_outputs *out);
void cli_outputs_free(cli_outputs *out);

/* A host array of n elements of dtype with normal(0, std) values from a seeded generator. */
void *cli_random_array(flashc_dtype dtype, size_t n, double std, uint64_t *seed);

/* Elements of the problem's q and k tensors. */
size_t cli_q_elems(const cli_problem *p);
size_t cli_k_elems(const cli_problem *p);

/* FLOPs of the forward by the usual count 4 B H Nq Nk D (halved when causal and square). */
double cli_forward_flops(const cli_problem *p);

/* Seconds on a monotonic clock. */
double cli_now(void);

flashc_dtype cli_parse_dtype(const char *s); /* 0 if unknown */
const char *cli_dtype_name(flashc_dtype d);

#endif /* FLASHC_CLI_RUN_H */
