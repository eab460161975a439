/*
 * kernels.h - the CPU micro-kernels: the block products of attention and the exponential of
 * a score row. The blocked algorithm (cpu_forward.c, cpu_backward.c) calls only these for
 * its arithmetic, so a SIMD implementation replaces a table, not the algorithm.
 *
 * Matrices are row-major float32 with explicit leading dimensions (elements between rows).
 */
#ifndef FLASHC_CPU_KERNELS_H
#define FLASHC_CPU_KERNELS_H

#include <stddef.h>

typedef struct flashc_cpu_kernels {
    const char *name;
    /* 1 if this machine can run the set. */
    int (*supported)(void);
    /* C[m x n] = A[m x k] * B[n x k]^T          (S = Q K^T, dP = dO V^T) */
    void (*gemm_nt)(int m, int n, int k, const float *a, ptrdiff_t lda, const float *b,
                    ptrdiff_t ldb, float *c, ptrdiff_t ldc);
    /* C[m x n] += A[m x k] * B[k x n]           (O += P V, dQ += dS K) */
    void (*gemm_nn_acc)(int m, int n, int k, const float *a, ptrdiff_t lda, const float *b,
                        ptrdiff_t ldb, float *c, ptrdiff_t ldc);
    /* C[m x n] += A[k x m]^T * B[k x n]         (dV += P^T dO, dK += dS^T Q) */
    void (*gemm_tn_acc)(int m, int n, int k, const float *a, ptrdiff_t lda, const float *b,
                        ptrdiff_t ldb, float *c, ptrdiff_t ldc);
    /* x[i] = exp(x[i] - sub) for i < n, exp(-inf) = 0; returns the sum of the results.
     * sub is finite. */
    float (*exp_sum)(float *x, int n, float sub);
} flashc_cpu_kernels;

extern const flashc_cpu_kernels flashc_cpu_kernels_generic;

/* The best supported set, or the one named (NULL if that name is unknown or unsupported). */
const flashc_cpu_kernels *flashc_cpu_pick_kernels(const char *name);

/* "generic avx2 ..." : the names of the sets built in. */
const char *flashc_cpu_kernel_names(void);

#endif /* FLASHC_CPU_KERNELS_H */
