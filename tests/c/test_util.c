/*
 * test_util.c - implementation of the shared test helpers (see test_util.h).
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/dtype.h"

int test_failures = 0;
int test_checks = 0;

int test_finish(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

void rng_seed(test_rng *r, uint64_t seed)
{
    r->state = seed ^ 0x9e3779b97f4a7c15ull;
}

uint64_t rng_next(test_rng *r) /* splitmix64 */
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_uniform(test_rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double rng_normal(test_rng *r)
{
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t rng_range(test_rng *r, int64_t n)
{
    return (int64_t)(rng_next(r) % (uint64_t)n);
}

const char *layout_name(test_layout layout)
{
    switch (layout) {
    case LAYOUT_BSHD: return "bshd";
    case LAYOUT_BHSD: return "bhsd";
    case LAYOUT_PADDED: return "padded";
    default: return "?";
    }
}

const char *dtype_name(flashc_dtype dtype)
{
    switch (dtype) {
    case FLASHC_F32: return "f32";
    case FLASHC_F16: return "f16";
    case FLASHC_BF16: return "bf16";
    }
    return "?";
}

double tolerance_for(flashc_dtype dtype)
{
    return dtype == FLASHC_F32 ? 1e-5 : dtype == FLASHC_F16 ? 5e-4 : 5e-3;
}

static void store_poison(void *buf, flashc_dtype dtype, size_t i)
{
    switch (dtype) {
    case FLASHC_F32: ((uint32_t *)buf)[i] = 0x7fc00000u; break;
    case FLASHC_F16: ((uint16_t *)buf)[i] = 0x7e00u; break;
    default: ((uint16_t *)buf)[i] = 0x7fc0u; break;
    }
}

static int is_poison(const void *buf, flashc_dtype dtype, size_t i)
{
    switch (dtype) {
    case FLASHC_F32: return ((const uint32_t *)buf)[i] == 0x7fc00000u;
    case FLASHC_F16: return ((const uint16_t *)buf)[i] == 0x7e00u;
    default: return ((const uint16_t *)buf)[i] == 0x7fc0u;
    }
}

static int64_t view_offset(const flashc_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                           int64_t i3)
{
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

static void finish_alloc(test_tensor *tt)
{
    flashc_tensor *t = &tt->t;
    int64_t last = 0;
    for (int d = 0; d < t->ndim; d++)
        last += (t->shape[d] - 1) * t->stride[d];
    tt->buffer_elems = (size_t)last + 1;
    size_t esize = flashc_dtype_size(t->dtype);
    tt->buffer = malloc(tt->buffer_elems * esize);
    tt->covered = calloc(tt->buffer_elems, 1);
    t->data = tt->buffer;
    int64_t s3 = t->ndim == 4 ? t->shape[3] : 1;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < s3; d++)
                    tt->covered[view_offset(t, a, b, c, d)] = 1;
    tt_poison(tt);
}

test_tensor tt_alloc(flashc_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
                     test_layout layout)
{
    test_tensor tt;
    memset(&tt, 0, sizeof tt);
    if (layout == LAYOUT_BHSD) {
        tt.t = flashc_tensor_bhsd(NULL, dtype, b, h, s, d);
    } else {
        tt.t = flashc_tensor_contiguous(NULL, dtype, b, s, h, d);
        if (layout == LAYOUT_PADDED) {
            tt.t.stride[2] = d + 3;
            tt.t.stride[1] = h * (d + 3) + 5;
            tt.t.stride[0] = s * tt.t.stride[1] + 7;
        }
    }
    finish_alloc(&tt);
    return tt;
}

test_tensor tt_alloc_lse(int64_t b, int64_t h, int64_t s, int padded)
{
    test_tensor tt;
    memset(&tt, 0, sizeof tt);
    tt.t = flashc_lse_contiguous(NULL, b, h, s);
    if (padded) {
        tt.t.stride[2] = 2;
        tt.t.stride[1] = 2 * s + 1;
        tt.t.stride[0] = h * tt.t.stride[1] + 3;
    }
    finish_alloc(&tt);
    return tt;
}

void tt_free(test_tensor *t)
{
    free(t->buffer);
    free(t->covered);
    t->buffer = NULL;
    t->covered = NULL;
}

void tt_fill_normal(test_tensor *tt, test_rng *r, double std)
{
    for (size_t i = 0; i < tt->buffer_elems; i++)
        if (tt->covered[i])
            flashc_store(tt->buffer, tt->t.dtype, (int64_t)i, (float)(std * rng_normal(r)));
}

void tt_poison(test_tensor *tt)
{
    for (size_t i = 0; i < tt->buffer_elems; i++)
        store_poison(tt->buffer, tt->t.dtype, i);
}

int tt_gaps_intact(const test_tensor *tt)
{
    for (size_t i = 0; i < tt->buffer_elems; i++)
        if (!tt->covered[i] && !is_poison(tt->buffer, tt->t.dtype, i))
            return 0;
    return 1;
}

double tt_get(const test_tensor *tt, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (double)flashc_load(tt->buffer, tt->t.dtype, view_offset(&tt->t, i0, i1, i2, i3));
}

size_t tt_bytes(const test_tensor *t)
{
    return t->buffer_elems * flashc_dtype_size(t->t.dtype);
}

void *tt_snapshot(const test_tensor *t)
{
    void *copy = malloc(tt_bytes(t));
    memcpy(copy, t->buffer, tt_bytes(t));
    return copy;
}

int tt_unchanged(const test_tensor *t, const void *snapshot)
{
    return memcmp(t->buffer, snapshot, tt_bytes(t)) == 0;
}

static void accumulate(test_error *e, double *num, double *den, double x, double ref)
{
    if (!isfinite(x) && isfinite(ref)) {
        e->nonfinite++;
        return;
    }
    double diff = (isinf(ref) && x == ref) ? 0.0 : x - ref;
    if (isinf(ref) && x != ref) {
        e->nonfinite++;
        return;
    }
    *num += diff * diff;
    if (isfinite(ref))
        *den += ref * ref;
    if (fabs(diff) > e->max_abs)
        e->max_abs = fabs(diff);
}

static test_error finish_error(test_error e, double num, double den)
{
    e.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (e.nonfinite)
        e.rel = INFINITY;
    return e;
}

test_error compare_dense(const test_tensor *x, const double *ref)
{
    test_error e = {0, 0, 0};
    double num = 0, den = 0;
    const flashc_tensor *t = &x->t;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    double r = ref[((a * t->shape[1] + s) * t->shape[2] + h) * t->shape[3] + d];
                    accumulate(&e, &num, &den, tt_get(x, a, s, h, d), r);
                }
    return finish_error(e, num, den);
}

test_error compare_lse(const test_tensor *x, const double *ref)
{
    test_error e = {0, 0, 0};
    double num = 0, den = 0;
    const flashc_tensor *t = &x->t;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t s = 0; s < t->shape[2]; s++) {
                double r = ref[(a * t->shape[1] + h) * t->shape[2] + s];
                accumulate(&e, &num, &den, tt_get(x, a, h, s, 0), r);
            }
    return finish_error(e, num, den);
}
