/*
 * attention_check.h - runs one attention case on a backend (forward, then backward from the
 * backend's own O and LSE) and measures it against the float64 reference, with every output
 * poisoned beforehand and its untouched gaps verified afterwards.
 */
#ifndef FLASHC_ATTENTION_CHECK_H
#define FLASHC_ATTENTION_CHECK_H

#include "test_util.h"
#include "backend.h"

typedef struct attention_case {
    flashc_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t causal;
    float scale; /* 0: default */
    test_layout layout;
    double input_std;
    int check_backward;
} attention_case;

/* Errors of one run, relative to the reference, per tensor. */
typedef struct attention_errors {
    test_error out, lse, dq, dk, dv;
    int gaps_ok;  /* no output element outside its view was written */
    int status_ok;
} attention_errors;

/* Runs c on backend be with inputs from seed. Fails CHECKs on any error beyond the dtype's
 * tolerance, any non-finite output or any write outside a view; returns the figures. */
attention_errors run_attention_case(flashc_backend *be, const attention_case *c, uint64_t seed);

/* The same for any params (features included) and the reference problem pr that describes
 * them: tensors of pr's shape in the given layout, filled from seed. With masked_rows, rows
 * that see no key are also counted and checked to give O exactly 0 and LSE -inf. */
attention_errors run_attention_params(flashc_backend *be, const char *what,
                                      const flashc_params *p, const flashc_problem *pr,
                                      test_layout layout, double std, int check_backward,
                                      uint64_t seed, int64_t *masked_rows);

/* "f16 b2 q17 k40 h4/2 d64 causal=1 bshd" */
void describe_case(const attention_case *c, char *buf, size_t size);

/* Largest relative error of each tensor seen so far, for the closing report. */
typedef struct error_summary {
    double out, lse, dq, dk, dv;
    int cases;
} error_summary;

void summary_add(error_summary *s, const attention_errors *e);
void summary_print(const char *label, const error_summary *s);

#endif /* FLASHC_ATTENTION_CHECK_H */
