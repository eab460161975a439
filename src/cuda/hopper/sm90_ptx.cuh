/*
 * sm90_ptx.cuh - named wrappers around the Hopper (sm_90a) PTX that the warp-specialized
 * kernels use: wgmma (warpgroup matrix multiply, asynchronous, A and B from shared memory or
 * A from registers), the shared-memory matrix descriptors it reads, TMA tile loads and stores
 * (cp.async.bulk.tensor) completing on mbarriers, the mbarrier operations themselves, named
 * barriers, proxy fences, setmaxnreg and elect.sync.
 *
 * Standalone on purpose: it includes nothing from the mma.sync path, so the Hopper kernel and
 * its test build from this directory alone. Every name carries the sm90_ prefix so that a
 * translation unit may include it beside ptx.cuh.
 *
 * Shared-memory tiles are what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B: a [rows][64]
 * panel of 16-bit elements, 128 bytes per row, where inside each 8-row (1024-byte) atom the
 * 16-byte chunk c of row r is stored at chunk c ^ (r % 8). A head dim of D is D / 64 such
 * panels side by side. Every panel starts on a 1024-byte boundary, which is what lets a
 * descriptor carry base offset 0.
 *
 * The accumulator fragment of m64nN (fp32, N / 2 registers per thread), for thread t of the
 * warpgroup, warp w = t / 32, lane l, register j:
 *     row = 16 w + l / 4 + 8 ((j / 2) % 2)        col = 8 (j / 4) + 2 (l % 4) + (j % 2)
 * i.e. the mma.sync m16n8 C layout repeated along N, one 16-row slice per warp. The A
 * fragment of the register form (m64k16, 4 x 32 bits) is the mma.sync m16n8k16 A layout per
 * warp, so registers 8s .. 8s+7 of an accumulator, packed in pairs to 16 bits, are exactly the
 * A operand for k-slice s: that is how P goes from S = Q K^T into O += P V without shared
 * memory.
 */
#ifndef FLASHC_CUDA_SM90_PTX_CUH
#define FLASHC_CUDA_SM90_PTX_CUH

#include <cuda.h> /* CUtensorMap: the type only, nothing of libcuda is linked */
#include <stdint.h>

#define SM90_DEVICE static __device__ __forceinline__

SM90_DEVICE uint32_t sm90_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- shared-memory matrix descriptors ----------------------------------------------------
 * 64 bits: start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride byte
 * offset >> 4 in 32-45, base offset in 49-51 (0: tiles are 1024-aligned), swizzle mode in
 * 62-63 (1 = 128-byte). */

/* A descriptor in two parts: its low word (start address and leading byte offset), which
 * differs from one operand and k step to the next, and the rest (stride byte offset 1024 and
 * the 128-byte swizzle for every operand here). The start field holds an address below 2^18
 * (all of an sm_90 block's shared memory), so a step of b bytes (a multiple of 16) adds b >> 4
 * to the low word without carrying into the next field. */
SM90_DEVICE uint32_t sm90_desc_lo(uint32_t saddr, uint32_t lbo_bytes)
{
    return ((saddr & 0x3ffffu) >> 4) | (((lbo_bytes & 0x3ffffu) >> 4) << 16);
}

SM90_DEVICE uint64_t sm90_desc_of(uint32_t lo)
{
    return (uint64_t)lo | ((uint64_t)(1024u >> 4) << 32) | (1ull << 62);
}

/* The descriptor of an operand's k step, step_bytes + sub_bytes past its start saddr (a
 * panel's offset and a step within the panel). STEP: the operand's low word (the same for
 * all its steps, so computed once) plus the offsets, one uniform add per wgmma; else built
 * whole at each step (a mask, a shift and an or), which one kernel keeps because ptxas
 * spills two of its registers with the other. FC_SM90_DESC_STEP picks the default, which the
 * forward takes (stepped: measured +0.6-0.9% at d256, level elsewhere); the backward picks its
 * own (FC_SM90B_DESC_STEP). */
#ifndef FC_SM90_DESC_STEP
#define FC_SM90_DESC_STEP 1
#endif
template <bool STEP>
SM90_DEVICE uint64_t sm90_desc_step(uint32_t saddr, uint32_t lbo_bytes, uint32_t step_bytes, uint32_t sub_bytes)
{
    return STEP ? sm90_desc_of(sm90_desc_lo(saddr, lbo_bytes) + ((step_bytes + sub_bytes) >> 4))
                : sm90_desc_of(sm90_desc_lo(saddr + step_bytes + sub_bytes, lbo_bytes));
}

/* K-major operand (the reduction dim contiguous: Q and K rows, [rows][64] panels): 8-row
 * groups 1024 bytes apart (SBO); LBO is not used by the 128-byte swizzle when one k16 step
 * (32 bytes) lies inside a panel row, so it holds the conventional 16. A k16 step inside a
 * panel is 32 bytes on; the next panel is a panel's bytes on. */
template <bool STEP = (bool)FC_SM90_DESC_STEP>
SM90_DEVICE uint64_t sm90_desc_kmajor(uint32_t saddr, uint32_t step_bytes = 0, uint32_t sub_bytes = 0)
{
    return sm90_desc_step<STEP>(saddr, 16, step_bytes, sub_bytes);
}

/* MN-major operand (the output dim contiguous: V as [keys][64 head-dim columns] panels, the
 * B of O = P V). The canonical 128-byte-swizzled MN-major layout is, in elements,
 * ((8,8,m),(8,k)) : ((1,8,LBO),(64,SBO)): 64 contiguous columns per panel row, panels LBO
 * bytes apart, 8-key groups SBO = 1024 bytes apart. A k16 step is 16 rows = 2048 bytes on. */
template <bool STEP = (bool)FC_SM90_DESC_STEP>
SM90_DEVICE uint64_t sm90_desc_mnmajor(uint32_t saddr, uint32_t panel_bytes, uint32_t step_bytes = 0,
                                       uint32_t sub_bytes = 0)
{
    return sm90_desc_step<STEP>(saddr, panel_bytes, step_bytes, sub_bytes);
}

/* ---- wgmma ------------------------------------------------------------------------------- */

/* Orders this warpgroup's earlier register writes (accumulators, A fragments) before the
 * wgmma that follows; needed before the first wgmma of a batch. */
SM90_DEVICE void sm90_wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

SM90_DEVICE void sm90_wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Waits until at most N committed wgmma groups of this warpgroup are still running. */
template <int N>
SM90_DEVICE void sm90_wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* An empty asm that claims to read and write each register: keeps the compiler from moving
 * accumulator reads or writes across an issue/wait pair (which would either read a register
 * the tensor core is still writing, or make ptxas serialize the wgmma pipeline). */
template <int N>
SM90_DEVICE void sm90_fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
SM90_DEVICE void sm90_fence_regs(uint32_t (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* x as lane 0 of the warp holds it, for a value that is the same in every lane but derived
 * from the thread index (a warpgroup's index, a count built from it): the compiler takes such
 * a value as differing between lanes and keeps everything computed from it (stage addresses,
 * wgmma descriptors) in per-thread registers, moved to uniform ones before each use. After
 * the broadcast it knows better. */
SM90_DEVICE int sm90_warp_uniform(int x)
{
    return __shfl_sync(0xffffffffu, x, 0);
}

/* The A fragments of the register form, [k16 slices][4]: the tensor core reads them after
 * the issuing instruction, so they must stay in place until the wait. */
template <int N>
SM90_DEVICE void sm90_fence_regs(uint32_t (&r)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) asm volatile("" : "+r"(r[i][k])::"memory");
}

/* The m64nNk16 instructions, one macro per N. Each expects in scope: d (float[N/2]), desc_a /
 * a (uint64_t / uint32_t[4]), desc_b (uint64_t), scale_d (int: 0 gives d = A B, 1 gives
 * d += A B) and the constants TRANS_B (1: B is MN-major) and, for SS, TRANS_A (1: A is
 * M-major). An instruction names its R = N / 2
 * accumulators one by one: SM90_D_<R> lists the operands "+f"(d[0]) .. "+f"(d[R - 1]) and
 * SM90_S_<R> their placeholders "%0" .. "%R-1", both composed eight at a time; the operands
 * after them are numbered from R on (desc_a, desc_b, scale_d, TRANS_A, TRANS_B; or a[0..3],
 * desc_b, scale_d, TRANS_B), which SM90_WGMMA_SS / SM90_WGMMA_RS take as arguments. */
// clang-format off
#define SM90_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define SM90_D_8 SM90_D8(0)
#define SM90_S_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define SM90_D_16 SM90_D_8, SM90_D8(8)
#define SM90_S_16 SM90_S_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define SM90_D_24 SM90_D_16, SM90_D8(16)
#define SM90_S_24 SM90_S_16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define SM90_D_32 SM90_D_24, SM90_D8(24)
#define SM90_S_32 SM90_S_24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define SM90_D_40 SM90_D_32, SM90_D8(32)
#define SM90_S_40 SM90_S_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define SM90_D_48 SM90_D_40, SM90_D8(40)
#define SM90_S_48 SM90_S_40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define SM90_D_56 SM90_D_48, SM90_D8(48)
#define SM90_S_56 SM90_S_48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define SM90_D_64 SM90_D_56, SM90_D8(56)
#define SM90_S_64 SM90_S_56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define SM90_D_72 SM90_D_64, SM90_D8(64)
#define SM90_S_72 SM90_S_64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define SM90_D_80 SM90_D_72, SM90_D8(72)
#define SM90_S_80 SM90_S_72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define SM90_D_88 SM90_D_80, SM90_D8(80)
#define SM90_S_88 SM90_S_80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define SM90_D_96 SM90_D_88, SM90_D8(88)
#define SM90_S_96 SM90_S_88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define SM90_D_104 SM90_D_96, SM90_D8(96)
#define SM90_S_104 SM90_S_96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define SM90_D_112 SM90_D_104, SM90_D8(104)
#define SM90_S_112 SM90_S_104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define SM90_D_120 SM90_D_112, SM90_D8(112)
#define SM90_S_120 SM90_S_112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define SM90_D_128 SM90_D_120, SM90_D8(120)
#define SM90_S_128 SM90_S_120 ", %120, %121, %122, %123, %124, %125, %126, %127"

#define SM90_WGMMA_SS(N, R, TY, A, B, SC, TA, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SC ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" SM90_S_##R \
    "}, %" #A ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n" \
    : SM90_D_##R \
    : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))

#define SM90_WGMMA_RS(N, R, TY, A0, A1, A2, A3, B, SC, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SC ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" SM90_S_##R \
    "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, %" #TB ";\n}\n" \
    : SM90_D_##R \
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define SM90_WGMMA_SS_N16(TY) SM90_WGMMA_SS(16, 8, TY, 8, 9, 10, 11, 12)
#define SM90_WGMMA_RS_N16(TY) SM90_WGMMA_RS(16, 8, TY, 8, 9, 10, 11, 12, 13, 14)
#define SM90_WGMMA_SS_N32(TY) SM90_WGMMA_SS(32, 16, TY, 16, 17, 18, 19, 20)
#define SM90_WGMMA_RS_N32(TY) SM90_WGMMA_RS(32, 16, TY, 16, 17, 18, 19, 20, 21, 22)
#define SM90_WGMMA_SS_N64(TY) SM90_WGMMA_SS(64, 32, TY, 32, 33, 34, 35, 36)
#define SM90_WGMMA_RS_N64(TY) SM90_WGMMA_RS(64, 32, TY, 32, 33, 34, 35, 36, 37, 38)
#define SM90_WGMMA_SS_N80(TY) SM90_WGMMA_SS(80, 40, TY, 40, 41, 42, 43, 44)
#define SM90_WGMMA_RS_N80(TY) SM90_WGMMA_RS(80, 40, TY, 40, 41, 42, 43, 44, 45, 46)
#define SM90_WGMMA_SS_N96(TY) SM90_WGMMA_SS(96, 48, TY, 48, 49, 50, 51, 52)
#define SM90_WGMMA_RS_N96(TY) SM90_WGMMA_RS(96, 48, TY, 48, 49, 50, 51, 52, 53, 54)
#define SM90_WGMMA_SS_N112(TY) SM90_WGMMA_SS(112, 56, TY, 56, 57, 58, 59, 60)
#define SM90_WGMMA_RS_N112(TY) SM90_WGMMA_RS(112, 56, TY, 56, 57, 58, 59, 60, 61, 62)
#define SM90_WGMMA_SS_N128(TY) SM90_WGMMA_SS(128, 64, TY, 64, 65, 66, 67, 68)
#define SM90_WGMMA_RS_N128(TY) SM90_WGMMA_RS(128, 64, TY, 64, 65, 66, 67, 68, 69, 70)
#define SM90_WGMMA_SS_N144(TY) SM90_WGMMA_SS(144, 72, TY, 72, 73, 74, 75, 76)
#define SM90_WGMMA_RS_N144(TY) SM90_WGMMA_RS(144, 72, TY, 72, 73, 74, 75, 76, 77, 78)
#define SM90_WGMMA_SS_N160(TY) SM90_WGMMA_SS(160, 80, TY, 80, 81, 82, 83, 84)
#define SM90_WGMMA_RS_N160(TY) SM90_WGMMA_RS(160, 80, TY, 80, 81, 82, 83, 84, 85, 86)
#define SM90_WGMMA_SS_N176(TY) SM90_WGMMA_SS(176, 88, TY, 88, 89, 90, 91, 92)
#define SM90_WGMMA_RS_N176(TY) SM90_WGMMA_RS(176, 88, TY, 88, 89, 90, 91, 92, 93, 94)
#define SM90_WGMMA_SS_N192(TY) SM90_WGMMA_SS(192, 96, TY, 96, 97, 98, 99, 100)
#define SM90_WGMMA_RS_N192(TY) SM90_WGMMA_RS(192, 96, TY, 96, 97, 98, 99, 100, 101, 102)
#define SM90_WGMMA_SS_N256(TY) SM90_WGMMA_SS(256, 128, TY, 128, 129, 130, 131, 132)
#define SM90_WGMMA_RS_N256(TY) SM90_WGMMA_RS(256, 128, TY, 128, 129, 130, 131, 132, 133, 134)

#define SM90_WGMMA_FOR_EACH_N(X) X(16) X(32) X(64) X(80) X(96) X(112) X(128) X(144) X(160) X(176) X(192) X(256)
// clang-format on

/* d (+)= A B for one k16 step, A (64 x 16) and B (16 x N) from shared memory. BF16 picks
 * bf16 or fp16 inputs; TRANS_B = 1 when B is MN-major, TRANS_A = 1 when A is M-major. */
template <int N, int BF16, int TRANS_B, int TRANS_A = 0>
SM90_DEVICE void sm90_wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d)
{
#define SM90_SS_CASE(NN)                      \
    if constexpr (N == NN) {                  \
        if constexpr (BF16) SM90_WGMMA_SS_N##NN("bf16"); \
        else SM90_WGMMA_SS_N##NN("f16");       \
    }
    SM90_WGMMA_FOR_EACH_N(SM90_SS_CASE)
#undef SM90_SS_CASE
}

/* d (+)= A B for one k16 step, A from registers (the fragment described at the top), B from
 * shared memory. */
template <int N, int BF16, int TRANS_B>
SM90_DEVICE void sm90_wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                               int scale_d)
{
#define SM90_RS_CASE(NN)                      \
    if constexpr (N == NN) {                  \
        if constexpr (BF16) SM90_WGMMA_RS_N##NN("bf16"); \
        else SM90_WGMMA_RS_N##NN("f16");       \
    }
    SM90_WGMMA_FOR_EACH_N(SM90_RS_CASE)
#undef SM90_RS_CASE
}

/* ---- mbarrier ------------------------------------------------------------------------------ */

SM90_DEVICE void sm90_mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm90_smem_addr(bar)), "r"(count)
                 : "memory");
}

/* Makes the initialized barriers visible to the async proxy (TMA completes on them) and to
 * the other threads; follow it with a CTA-wide barrier. */
SM90_DEVICE void sm90_mbar_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also announces bytes of transactions (TMA writes) the phase waits for. */
SM90_DEVICE void sm90_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm90_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

SM90_DEVICE void sm90_mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm90_smem_addr(bar)) : "memory");
}

/* Nonzero once the phase with the given parity has completed. */
SM90_DEVICE uint32_t sm90_mbar_try_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(sm90_smem_addr(bar)), "r"(parity)
                 : "memory");
    return ok;
}

/* Spins (try_wait suspends the thread for a while inside each probe) until the phase of the
 * given parity completes. A freshly initialized barrier counts its "previous" phase, parity
 * 1, as complete: a producer waiting on an empty barrier starts with parity 1 and passes. */
SM90_DEVICE void sm90_mbar_wait(uint64_t *bar, uint32_t parity)
{
    while (!sm90_mbar_try_wait(bar, parity)) {
    }
}

/* ---- TMA ------------------------------------------------------------------------------------ */

SM90_DEVICE void sm90_tma_prefetch_desc(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* Copies the box at element coordinates (c0 innermost .. c3) of a 4-D tensor map into shared
 * memory, completing bytes of transactions on bar. Out-of-range elements are written as zeros
 * and still count toward the bytes. */
SM90_DEVICE void sm90_tma_load_4d(uint32_t dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                  int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(sm90_smem_addr(bar))
                 : "memory");
}

/* A 4-D tile of map at (c0, c1, c2, c3) fetched into L2 only (no shared memory, no
 * barrier): a later load of the same tile then waits on L2 rather than on device memory. */
SM90_DEVICE void sm90_tma_prefetch_4d(const CUtensorMap *map, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"((uint64_t)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/* The same for 3-D and 2-D maps. */
SM90_DEVICE void sm90_tma_load_3d(uint32_t dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                  int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(sm90_smem_addr(bar))
                 : "memory");
}

SM90_DEVICE void sm90_tma_load_2d(uint32_t dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(sm90_smem_addr(bar))
                 : "memory");
}

/* Writes a shared-memory box to global memory; elements outside the tensor are dropped, which
 * is how a partial last row block is clipped. Completes as a bulk group of this thread. */
SM90_DEVICE void sm90_tma_store_4d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

SM90_DEVICE void sm90_tma_store_2d(const CUtensorMap *map, uint32_t src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}

SM90_DEVICE void sm90_bulk_commit(void)
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until this thread's bulk stores have read their shared-memory source. */
SM90_DEVICE void sm90_bulk_wait_read(void)
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* Waits until they have completed (their writes are performed). */
SM90_DEVICE void sm90_bulk_wait(void)
{
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* ---- fences, barriers, registers ------------------------------------------------------------ */

/* Orders this thread's ordinary shared-memory writes before later reads by the async proxy
 * (a TMA store, or wgmma reading an operand that st.shared wrote). */
SM90_DEVICE void sm90_fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Orders this thread's global-memory accesses through the generic proxy (a semaphore's
 * acquire or release) against its bulk copies and reductions through the async proxy. */
SM90_DEVICE void sm90_fence_proxy_async_global(void)
{
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* Named barrier id (1..15; 0 is __syncthreads) over nthreads (a multiple of 32). sync waits
 * for nthreads arrivals including its own; arrive counts one and does not wait. */
SM90_DEVICE void sm90_bar_sync(int id, int nthreads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

SM90_DEVICE void sm90_bar_arrive(int id, int nthreads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

/* Zeroes rows [from, rows) of a swizzled tile of PANELS panels of `rows` rows each (the
 * swizzle only permutes chunks within a row, so whole rows are cleared the same way), thread
 * t of nthreads taking every nthreads-th 16-byte chunk; then orders the writes before the
 * async proxy's reads. The caller joins the writers (a named barrier) before any wgmma reads
 * the tile. Used on the rows of a varlen sequence's last block that belong to the next
 * sequence: a zero P or dS times one of its inf or NaN values would carry them over. */
template <int PANELS>
SM90_DEVICE void sm90_zero_tile_rows(uint32_t tile, int rows, int from, int t, int nthreads)
{
    constexpr int CHUNKS = PANELS * 8; /* 16-byte chunks of one row */
#pragma unroll 1
    for (int c = t; c < (rows - from) * CHUNKS; c += nthreads) {
        const int r = from + c / CHUNKS, pn = (c % CHUNKS) / 8, ch = c % 8;
        const uint32_t addr = tile + pn * (rows * 128) + r * 128 + ch * 16;
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
    }
    sm90_fence_proxy_async();
}

/* Register reallocation between warpgroups: every warp of the warpgroup executes it. It
 * takes effect only when the kernel has a register cap at entry (__launch_bounds__ with a
 * minimum of 1 block); ptxas warns (C7508) when it cannot honour it. */
template <int N>
SM90_DEVICE void sm90_setmaxnreg_inc(void)
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
SM90_DEVICE void sm90_setmaxnreg_dec(void)
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Nonzero in exactly one active lane of the warp. */
SM90_DEVICE uint32_t sm90_elect_one(void)
{
    uint32_t pred = 0;
    asm volatile("{\n.reg .b32 r;\n.reg .pred p;\n"
                 "elect.sync r|p, %1;\n"
                 "selp.b32 %0, 1, 0, p;\n}\n"
                 : "=r"(pred)
                 : "r"(0xffffffffu));
    return pred;
}

/* ---- conversions and math -------------------------------------------------------------------- */

/* Two fp32 rounded to nearest into one register of two 16-bit floats, lo in the low half. */
template <int BF16>
SM90_DEVICE uint32_t sm90_pack2(float lo, float hi)
{
    uint32_t r;
    if (BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 2^x on the special-function unit; exp2(-inf) = 0, which masking relies on. */
SM90_DEVICE float sm90_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

SM90_DEVICE float sm90_quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

SM90_DEVICE float sm90_quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---- additions for the backward ------------------------------------------------------------- */

/* Copies bytes (a multiple of 16; both addresses 16-byte aligned) of contiguous global memory
 * into shared memory, completing as transactions on bar: how the backward's producer brings
 * the per-row LSE and delta vectors in beside the Q and dO tiles. */
SM90_DEVICE void sm90_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     dst),
                 "l"((uint64_t)src), "r"(bytes), "r"(sm90_smem_addr(bar))
                 : "memory");
}

/* Adds bytes (a multiple of 16; both addresses 16-byte aligned) of float32 shared memory into
 * contiguous global memory, element by element, as one asynchronous bulk reduction of this
 * thread's bulk group: the backward's dQ units, handed over by the consumers. */
SM90_DEVICE void sm90_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     (uint64_t)dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

/* Two fp32 additions into 8 contiguous, 8-byte aligned bytes of global memory, one
 * reduction instruction (sm_90): a split GQA group's dK and dV, with no value returned. */
SM90_DEVICE void sm90_red_add_v2(float *p, float a, float b)
{
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

/* Four fp32 additions into 16 contiguous, 16-byte aligned bytes of global memory, one
 * reduction instruction (sm_90): the dQ accumulation, with no value returned. */
SM90_DEVICE void sm90_red_add_v4(float *p, float a, float b, float c, float d)
{
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

/* A load with acquire semantics at GPU scope: spinning on a semaphore that another CTA
 * releases, after which that CTA's earlier writes are visible. */
SM90_DEVICE int sm90_ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Adds 1 with release semantics at GPU scope: hands a semaphore on once this thread's earlier
 * writes are visible to the CTA that acquires it. */
SM90_DEVICE void sm90_red_release_add_gpu(int *p)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p) : "memory");
}

/* Four floats to and from shared memory (16-byte aligned): a thread's part of a partial
 * accumulator that another warpgroup's thread of the same index adds. */
SM90_DEVICE void sm90_st_shared_v4(uint32_t addr, float a, float b, float c, float d)
{
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

SM90_DEVICE float4 sm90_ld_shared_v4(uint32_t addr)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

/* One 32-bit load from shared memory (two 16-bit elements of an operand fragment). */
SM90_DEVICE uint32_t sm90_ld_shared_b32(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/* Four 8 x 8 matrices of 16-bit elements stored transposed: lane 4 r + w holds elements
 * (r, 2 w), (r, 2 w + 1) of matrix i in register i (the accumulator's packed pairs), and lane
 * 8 i + r gives the 16-byte row of shared memory that receives column r of matrix i. */
SM90_DEVICE void sm90_stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* One 16-bit store to shared memory (a transposed write of an accumulator element). */
SM90_DEVICE void sm90_st_shared_b16(uint32_t addr, uint16_t v)
{
    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

#endif /* FLASHC_CUDA_SM90_PTX_CUH */
