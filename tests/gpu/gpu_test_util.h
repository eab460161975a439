/*
 * gpu_test_util.h - what the GPU test programs share: a seeded generator of normal numbers
 * and the 16-bit float conversions (the library's own, src/dtype.h). Header-only, since each
 * program is one C file that tests/gpu/run.sh compiles on its own.
 */
#ifndef FLASHC_GPU_TEST_UTIL_H
#define FLASHC_GPU_TEST_UTIL_H

#include <math.h>
#include <stdint.h>

#include "../../src/dtype.h"

/* SplitMix64 */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* N(0, 1) by Box-Muller */
static inline double rng_normal(uint64_t *s)
{
    double u1 = ((rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (rng_next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A float rounded to fp16 or bf16 (nearest even), and back. */
static inline uint16_t to_half(flashc_dtype dt, float f)
{
    return dt == FLASHC_BF16 ? flashc_f32_to_bf16(f) : flashc_f32_to_f16(f);
}

static inline float from_half(flashc_dtype dt, uint16_t h)
{
    return dt == FLASHC_BF16 ? flashc_bf16_to_f32(h) : flashc_f16_to_f32(h);
}

/* The quiet NaN that poisons outputs before a run. */
static inline uint16_t half_nan(flashc_dtype dt)
{
    return dt == FLASHC_BF16 ? 0x7fc0 : 0x7e00;
}

#endif /* FLASHC_GPU_TEST_UTIL_H */
