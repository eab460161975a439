/*
 * ptx.cuh - thin, named wrappers around the PTX instructions the sm_80 kernels use:
 * cp.async (global -> shared copies that bypass registers), ldmatrix (shared -> register
 * fragments in the tensor-core layout), mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate),
 * conversions between fp32 and 16-bit floats, the fast exp2, and the two halves of a
 * programmatic dependent launch (sm_90; nothing on sm_80).
 *
 * The fragment layouts of mma.sync m16n8k16, with g = lane / 4 and t = lane % 4:
 *   A (16 x 16, row-major), 4 registers of 2 halves:
 *     a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]   a2 = A[g][2t+8..]   a3 = A[g+8][2t+8..]
 *   B (16 x 8, "col": k runs along the register pairs), 2 registers:
 *     b0 = B[2t..2t+1][g]   b1 = B[2t+8..2t+9][g]
 *   C/D (16 x 8, fp32), 4 registers:
 *     c0, c1 = C[g][2t], C[g][2t+1]      c2, c3 = C[g+8][2t], C[g+8][2t+1]
 * So two adjacent C tiles (16 x 16 of fp32), packed to 16 bits, are exactly one A operand:
 * that is how P (and dS) are fed back into the next product without going through shared
 * memory.
 */
#ifndef FLASHC_CUDA_PTX_CUH
#define FLASHC_CUDA_PTX_CUH

#include <stdint.h>

#define FC_DEVICE static __device__ __forceinline__

/* The 32-bit shared-memory address of a generic pointer into shared memory. */
FC_DEVICE uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- programmatic dependent launch ----------------------------------------------------
 * A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while
 * the kernel before it on the stream is still running. pdl_wait blocks until that kernel has
 * finished and its writes are visible, so nothing the kernel reads may come before it;
 * pdl_launch_dependents lets the kernel after this one start (it waits in turn). Both are
 * no-ops when the kernel was launched the ordinary way, and on sm_80. */
FC_DEVICE void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

FC_DEVICE void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* ---- cp.async --------------------------------------------------------------------------- */

/* Copies 16 bytes from global to shared memory without stalling the thread. When valid is 0
 * nothing is read and the 16 shared bytes are zero-filled: out-of-range rows of a tile become
 * zeros, which the kernels rely on (a zero V row times a zero probability stays zero). */
FC_DEVICE void cp_async_16(uint32_t dst, const void *src, int valid)
{
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

FC_DEVICE void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most n of this thread's committed groups are still in flight. */
template <int n>
FC_DEVICE void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

/* ---- ldmatrix ---------------------------------------------------------------------------- */

/* Four 8x8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix l / 8. */
FC_DEVICE void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* The same, each 8x8 matrix transposed on the way (for operands stored k-major, like V). */
FC_DEVICE void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* ---- bulk asynchronous reduction (sm_90) ------------------------------------------------- */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* dst[0 .. bytes/4) += src[...] in fp32, from shared to global memory by the copy engine; the
 * source must be written before (and fenced with fence_proxy_async_shared), both addresses and
 * bytes multiples of 16. Completes as a bulk group (bulk_commit, bulk_wait_read / bulk_wait). */
FC_DEVICE void bulk_reduce_add_f32(float *dst, uint32_t src, int bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

FC_DEVICE void bulk_commit(void)
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until the bulk groups of this thread have finished reading their shared source. */
FC_DEVICE void bulk_wait_read(void)
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* Waits until the bulk groups of this thread are complete. */
FC_DEVICE void bulk_wait(void)
{
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* Orders this thread's ordinary shared-memory writes before later reads by the copy engine. */
FC_DEVICE void fence_proxy_async_shared(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

/* ---- mma.sync ---------------------------------------------------------------------------- */

/* c += a * b for one 16x8x16 tile; BF16 picks the input type at compile time. */
template <int BF16>
FC_DEVICE void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

/* ---- conversions ------------------------------------------------------------------------- */

/* Two fp32 values rounded to nearest into one register of two 16-bit floats, lo in the low
 * half (the element with the smaller column index). */
template <int BF16>
FC_DEVICE uint32_t pack2(float lo, float hi)
{
    uint32_t r;
    if (BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* One 16-bit float (in the low bits of h) widened to fp32. */
template <int BF16>
FC_DEVICE float to_float(uint32_t h)
{
    if (BF16)
        return __uint_as_float((h & 0xffffu) << 16);
    float f;
    unsigned short s = (unsigned short)(h & 0xffffu);
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(s));
    return f;
}

/* ---- math -------------------------------------------------------------------------------- */

/* 2^x on the special-function unit; exp2(-inf) = 0, which masking relies on. */
FC_DEVICE float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- small helpers ----------------------------------------------------------------------- */

FC_DEVICE float warp_quad_max(float x)
{
    /* The 4 lanes of a quad (same g) hold one fragment row between them. */
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

FC_DEVICE float warp_quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

#endif /* FLASHC_CUDA_PTX_CUH */
