/*
 * seed_checks.h - the correctness checks of the three systems flashc implements, run on any
 * backend against the float64 reference: the Triton/Phobos fused-attention tutorial check,
 * the FlashAttention teaching script's bf16 causal check, and the [batch*heads, seqlen, dim]
 * layout of the teenygrad kernels with seqlen_q != seqlen_k.
 */
#ifndef FLASHC_SEED_CHECKS_H
#define FLASHC_SEED_CHECKS_H

#include "flashc.h"

/* Runs every seed check on be, printing one line per tensor ("PASS"/"FAIL", max abs diff,
 * relative error). Returns the number of failed tensors, or -1 if a call failed. */
int flashc_run_seed_checks(flashc_backend *be);

#endif /* FLASHC_SEED_CHECKS_H */
