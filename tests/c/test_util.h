/*
 * test_util.h - helpers shared by the C tests: a seeded random generator, tensors in several
 * memory layouts with poisoned gaps, comparison against the float64 reference with the
 * relative error reported, and a minimal check/report vocabulary.
 */
#ifndef FLASHC_TEST_UTIL_H
#define FLASHC_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "flashc.h"

/* ---- checks ---------------------------------------------------------------------------- */

extern int test_failures;
extern int test_checks;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        test_checks++;                                                                       \
        if (!(cond)) {                                                                       \
            test_failures++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                             \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

/* Prints "<name>: N checks, M failed" and returns the process exit code. */
int test_finish(const char *name);

/* The CPU micro-kernel sets by name, for the tests that run each one this processor
 * supports (flashc_cpu_pick_kernels says which). */
#define TEST_CPU_SETS {"generic", "avx2", "avx512", "amx", "neon"}

/* ---- random numbers -------------------------------------------------------------------- */

typedef struct test_rng {
    uint64_t state;
} test_rng;

void rng_seed(test_rng *r, uint64_t seed);
uint64_t rng_next(test_rng *r);
double rng_uniform(test_rng *r);          /* [0, 1) */
double rng_normal(test_rng *r);           /* N(0, 1) */
int64_t rng_range(test_rng *r, int64_t n); /* [0, n) */

/* ---- tensors --------------------------------------------------------------------------- */

typedef enum test_layout {
    LAYOUT_BSHD = 0,   /* contiguous [batch, seqlen, heads, dim] */
    LAYOUT_BHSD = 1,   /* a view of contiguous [batch, heads, seqlen, dim] */
    LAYOUT_PADDED = 2, /* gaps between heads, rows and batches: a slice of a larger buffer */
    LAYOUT_COUNT = 3
} test_layout;

const char *layout_name(test_layout layout);

/* A tensor and the buffer behind it; the gaps of the buffer that the view does not cover
 * are filled with a poison pattern, so a write outside the view is detected. */
typedef struct test_tensor {
    flashc_tensor t;
    void *buffer;
    size_t buffer_elems;
    unsigned char *covered; /* 1 where an element of the view lives */
} test_tensor;

test_tensor tt_alloc(flashc_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
                     test_layout layout);
test_tensor tt_alloc_lse(int64_t b, int64_t h, int64_t s, int padded);
void tt_free(test_tensor *t);
/* Fills the view with normal(0, std) values (rounded to the dtype). */
void tt_fill_normal(test_tensor *t, test_rng *r, double std);
/* Fills the whole buffer, view and gaps, with NaN. */
void tt_poison(test_tensor *t);
/* 1 if every element outside the view still holds the poison. */
int tt_gaps_intact(const test_tensor *t);
/* Element (b, s, h, d) (or (b, h, s) for LSE) as double. */
double tt_get(const test_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
/* A byte-for-byte copy of the buffer, to prove that a call did not touch it. */
void *tt_snapshot(const test_tensor *t);
int tt_unchanged(const test_tensor *t, const void *snapshot);
size_t tt_bytes(const test_tensor *t);

/* ---- comparison ------------------------------------------------------------------------ */

typedef struct test_error {
    double rel;     /* ||x - ref|| / ||ref|| (absolute norm if ||ref|| == 0) */
    double max_abs; /* max |x - ref| */
    int64_t nonfinite; /* elements of x that are NaN or inf where ref is finite */
} test_error;

/* Compares a 4-d view against a dense double [B, S, H, D] reference. */
test_error compare_dense(const test_tensor *x, const double *ref);
/* Compares an LSE view against a dense double [B, H, S] reference (-inf must match). */
test_error compare_lse(const test_tensor *x, const double *ref);

/* Tolerance of the relative error for a storage dtype. */
double tolerance_for(flashc_dtype dtype);
const char *dtype_name(flashc_dtype dtype);

#endif /* FLASHC_TEST_UTIL_H */
