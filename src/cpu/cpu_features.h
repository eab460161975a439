/*
 * cpu_features.h - what the processor supports, read once from cpuid (x86) and the OS.
 */
#ifndef FLASHC_CPU_FEATURES_H
#define FLASHC_CPU_FEATURES_H

#include <stddef.h>

typedef struct flashc_cpu_features {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512bf16, avx512fp16;
    int amx_tile, amx_bf16, amx_fp16;
    int neon, neon_bf16; /* AArch64: Advanced SIMD, and its BF16 extension (BFDOT, BFCVT) */
} flashc_cpu_features;

/* The features of this machine (computed once, thread-safe). */
const flashc_cpu_features *flashc_cpu_get_features(void);

/* "avx2 fma avx512f ..." into buf. */
void flashc_cpu_features_string(char *buf, size_t size);

/* Logical processors available to this process. */
int flashc_cpu_count(void);

#endif /* FLASHC_CPU_FEATURES_H */
