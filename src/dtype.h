/*
 * dtype.h - conversions between the storage dtypes (fp32, fp16, bf16) and float, on the host.
 * fp16 and bf16 are rounded to nearest even; NaN stays NaN and infinities stay infinite.
 */
#ifndef FLASHC_DTYPE_H
#define FLASHC_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "flashc.h"

static inline uint32_t flashc_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float flashc_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float flashc_bf16_to_f32(uint16_t h)
{
    return flashc_bits_f32((uint32_t)h << 16);
}

static inline uint16_t flashc_f32_to_bf16(float f)
{
    uint32_t u = flashc_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float flashc_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) /* inf or NaN */
        return flashc_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return flashc_bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return flashc_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t flashc_f32_to_f16(float f)
{
    uint32_t u = flashc_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a = flashc_bits_f32(absu);
        /* adding 0.5 (2^-1) aligns the half subnormal ulp (2^-24) to the float ulp of 0.5 */
        float t = a + 0.5f;
        uint32_t tb = flashc_f32_bits(t) - 0x3f000000u;
        return (uint16_t)(sign | (uint16_t)tb);
    }
    uint32_t mant_odd = (absu >> 13) & 1u;
    absu += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round to nearest even */
    return (uint16_t)(sign | (uint16_t)(absu >> 13));
}

/* Reads element i of a buffer of the given dtype as float. */
static inline float flashc_load(const void *base, flashc_dtype dtype, int64_t i)
{
    switch (dtype) {
    case FLASHC_F32: return ((const float *)base)[i];
    case FLASHC_F16: return flashc_f16_to_f32(((const uint16_t *)base)[i]);
    default: return flashc_bf16_to_f32(((const uint16_t *)base)[i]);
    }
}

/* Writes float x, rounded to the dtype, to element i. */
static inline void flashc_store(void *base, flashc_dtype dtype, int64_t i, float x)
{
    switch (dtype) {
    case FLASHC_F32: ((float *)base)[i] = x; break;
    case FLASHC_F16: ((uint16_t *)base)[i] = flashc_f32_to_f16(x); break;
    default: ((uint16_t *)base)[i] = flashc_f32_to_bf16(x); break;
    }
}

/* Converts n contiguous elements to float. */
static inline void flashc_load_row(float *dst, const void *src, flashc_dtype dtype, int64_t n)
{
    if (dtype == FLASHC_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    if (dtype == FLASHC_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = flashc_f16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = flashc_bf16_to_f32(s[i]);
}

/* Rounds n floats into contiguous elements of the dtype. */
static inline void flashc_store_row(void *dst, const float *src, flashc_dtype dtype, int64_t n)
{
    if (dtype == FLASHC_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    if (dtype == FLASHC_F16)
        for (int64_t i = 0; i < n; i++) d[i] = flashc_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] = flashc_f32_to_bf16(src[i]);
}

/* Address of element (b, s, h, 0) of a 4-d tensor view. */
static inline void *flashc_row_ptr(const flashc_tensor *t, int64_t b, int64_t s, int64_t h)
{
    int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2];
    return (char *)t->data + off * (int64_t)flashc_dtype_size(t->dtype);
}

/* Address of element (b, h, s) of the LSE view. */
static inline float *flashc_lse_ptr(const flashc_tensor *t, int64_t b, int64_t h, int64_t s)
{
    return (float *)t->data + b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
}

#endif /* FLASHC_DTYPE_H */
