/*
 * kernels.h - the CPU micro-kernels: the block products of attention, the online softmax of a
 * block of scores and the exponential. The blocked algorithm (cpu_forward.c, cpu_backward.c)
 * calls only these for its arithmetic, so an instruction set replaces a table, not the
 * algorithm.
 *
 * Layouts (all buffers 64-byte aligned, float32 unless marked bf16):
 *   rows   [n][dp]     a block of Q, dO, K or V rows, head dim zero-padded to dp
 *   panel  [dp][64]    a block of 64 keys transposed (K^T or V^T), keys past the block's
 *                      end and dims past head_dim zero
 *   score  [m][64]     S, P, dP, dS of one block: BLOCK_M rows of BLOCK_N = 64 keys
 * dp = flashc_cpu_padded_dim(head_dim), a multiple of 32 so that every row is a whole number
 * of vectors of any supported width and of AMX tile rows (32 bf16).
 *
 * bf16 path (optional, for bf16 inputs on sets with a bf16 dot product):
 *   rows16  [m][dp]           bf16 rows of Q
 *   panel16 [dp/2][64][2]     K^T in pairs of dims: element (d, key) at [d/2][key][d%2]
 *   vpair16 [32][dp][2]       V of one block in pairs of keys: (key, d) at [key/2][d][key%2]
 *   score16 [m][64]           P rounded to bf16
 * These are the "VNNI" layouts that vdpbf16ps and AMX tdpbf16ps consume.
 */
#ifndef FLASHC_CPU_KERNELS_H
#define FLASHC_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Queries per block (rows of S) and keys per block (columns of S). A 64 x 64 float block is
 * 16 KiB, so S stays in L1 between the two products of the forward. */
enum { FLASHC_CPU_BLOCK_M = 64, FLASHC_CPU_BLOCK_N = 64 };

static inline int flashc_cpu_padded_dim(int64_t head_dim)
{
    return (int)((head_dim + 31) & ~(int64_t)31);
}

typedef struct flashc_cpu_kernels {
    const char *name;
    /* 1 if this machine can run the set (for AMX: and the kernel granted the tile state). */
    int (*supported)(void);

    /* C[m][64] = A[m][k] * panel[k][64]           S = Q K^T, dP = dO V^T.
     * A has row stride lda; only the first k rows of the panel are read. m <= 64. */
    void (*gemm_panel)(int m, int k, const float *a, ptrdiff_t lda, const float *panel,
                       float *c);
    /* C[m][dp] += A[m][0:n] * B[n][dp]             O += P V, dQ += dS K.  A is a score block
     * (row stride 64), B rows (stride dp). */
    void (*gemm_acc)(int m, int n, int dp, const float *a, const float *b, float *c);
    /* C[n][dp] += A[m][0:n]^T * B[m][dp]           dV += P^T dO, dK += dS^T Q. */
    void (*gemm_tn_acc)(int n, int m, int dp, const float *a, const float *b, float *c);

    /* Online softmax of one forward block. Row r of s (m rows of 64) holds n scores (multiplied
     * by scale first, unless it is 1), of which
     * the first ncols[r] are visible. Updates the running max and sum of each row, rescales
     * row r of o (stride dp) when its max grew, and turns s into P (0 past ncols[r], up to n).
     * A row with no visible key so far gets P = 0 and keeps max -inf, sum 0. A NaN among a
     * row's visible scores makes its sum NaN (the forward then writes O and LSE NaN). */
    void (*softmax)(float *s, int m, int n, const int *ncols, float scale, float *row_max,
                    float *row_sum, float *o, int dp);
    /* Backward: s = Q K^T (unscaled), dp = dO V^T. Turns s into P = exp(scale s - lse[r]) and
     * dp into dS = P (dP - delta[r]); both 0 past ncols[r] and on rows whose lse is -inf
     * (no visible key), and dS is 0 wherever P is, whatever dP holds. A NaN lse gives NaN. */
    void (*p_ds)(float *s, float *dp, int m, int n, const int *ncols, float scale,
                 const float *lse, const float *delta);
    /* x[i] = exp(x[i] - sub) for i < n (exp(-inf) = 0); returns the sum of the results.
     * sub is finite. The error bound of each set is stated where it is defined. */
    float (*exp_sum)(float *x, int n, float sub);

    /* bf16 forward path, NULL where the set has none: the same products with bf16 operands
     * and float32 accumulation (layouts in the header comment).
     *   gemm_panel16: C[m][64] = A16[m][0:k] * panel16, k a multiple of 2 (zero-padded).
     *   gemm_acc16:   C[m][dp] += P16[m][0:n] * vpair16, n rounded up to even (zero pad).
     *     n may exceed 64 (a forward softmax step): P16 then holds ceil(n / 64) [64][64]
     *     blocks one after the other, and vpair16 as many consecutive blocks.
     * A set that needs a per-thread setup (AMX tile configuration) does it inside.
     * bf16_supported says whether this processor runs them (an AVX-512 part may lack
     * AVX512_BF16); the algorithm takes the path only when it returns 1. */
    int (*bf16_supported)(void);
    void (*gemm_panel16)(int m, int k, const uint16_t *a, ptrdiff_t lda,
                         const uint16_t *panel16, float *c);
    void (*gemm_acc16)(int m, int n, int dp, const uint16_t *p16, const uint16_t *vpair16,
                       float *c);
    /* Rows of a bf16 P: dst[m][64] = bf16(src[m][0:n]), zero from n to 64. */
    void (*round_p16)(uint16_t *dst, const float *src, int m, int n);
    /* One row of a bf16 output: dst[i] = bf16(src[i] * scale) for i < n, rounded to nearest
     * even, NaN kept (quiet), subnormal products flushed to zero; dst of any alignment.
     * NULL where the set has none (the generic conversion then runs); used only where
     * bf16_supported says so. */
    void (*store16)(uint16_t *dst, const float *src, int64_t n, float scale);
    /* softmax, then round_p16(p16, s, m, n), in one pass (NULL where the set has none),
     * for the bf16 forward only: its exponential may be less exact than exp_sum's (relative
     * 3e-6; P is rounded to bf16 next). Only p16 is written; s is scratch afterwards. s and
     * p16 may hold a step of several [64][64] blocks one after the other (n up to 256,
     * ncols[r] in [0, n]), whose max and rescale are then taken once. row_max is the
     * reference P is taken against: it may stay below the row's true max by up to 8, P
     * then reaching e^8, and max + log(sum) is the LSE all the same. */
    void (*softmax16)(float *s, int m, int n, const int *ncols, float scale, float *row_max,
                      float *row_sum, float *o, int dp, uint16_t *p16);

    /* bf16 backward path, NULL where the set has none (the backward then keeps its float32
     * products). With these the five products of a block pair all take bf16 operands:
     * S = Q K^T and dP = dO V^T through gemm_panel16 (Q, dO rows16; K^T, V^T panel16),
     * dQ += dS K through gemm_acc16 (dS through round_p16, K in vpair16), and the two
     * reductions over queries, kept transposed so that the query pairs lie along A's rows:
     *   dV^T[dp][64] += dO^T[dp][0:k] * pair(P),   dK^T[dp][64] += Q^T[dp][0:k] * pair(dS)
     * P and dS are rounded to bf16 only after the float32 feature pass, as FlashAttention
     * does on GPUs; the accumulation stays float32.
     *   gemm_panel16_acc: C[m][64] += A16[m][0:k] * panel16 (row stride lda of A16, 64 of
     *     C); A16's columns and panel16's rows from k up to the next multiple of 32 are zero
     *     and inside the buffers (the tile set reduces over 32 at a time).
     *   pair_p16: dst[32][64][2] = bf16(src[m][0:n]) in pairs of rows, element (r, c) at
     *     [r/2][c][r%2] (the panel16 layout with queries for dims); every element of dst is
     *     written, zero at rows >= m or columns >= n. */
    void (*gemm_panel16_acc)(int m, int k, const uint16_t *a, ptrdiff_t lda,
                             const uint16_t *panel16, float *c);
    void (*pair_p16)(uint16_t *dst, const float *src, int m, int n);

    /* float32 forward on bf16 tiles, NULL where the set has none: each float32 operand is
     * split into three bf16 parts, x = x0 + x1 + x2, and a product is taken as the six
     * largest part products, accumulated in float32 (the error bound is stated where the set
     * defines them). A split buffer holds three parts of 64 * dp bf16 elements each, part i
     * at i * 64 * dp; the order of the elements within a part is the set's own (the tile
     * order its products load fastest), written only by its split3_* and read only by its
     * products:
     *   rows3   Q rows of a query block, [m][dp] (up to 64 rows)
     *   panel3  K^T of a key block, [dp][64]
     *   vpair3  V of a key block, [64][dp]
     *   split3_rows:  rows3 from float rows src[m][dp] (rows m..64 left as they are).
     *   split3_panel: panel3 from a float panel [dp][64]; returns 1 if it holds a NaN or
     *                 inf (0 otherwise), so that packing needs no second pass over K.
     *   split3_vpair: vpair3 from float rows [64][dp].
     *   gemm_panel3:  C[m][64] = A * panel^T over all dp dims (both zero past head_dim).
     *   gemm_acc3:    C[m][dp] += P[m][0:n] * V, P a float score block (row stride 64),
     *                 split inside.
     * The operands of the products must be finite (P may be NaN on rows that end NaN): 0 * inf
     * among the part products would differ from float32's, so blocks with a non-finite Q or
     * K take the float32 kernels. x3_supported says whether this processor runs them.
     * The backward's reductions over queries (NULL where the set has none), with the
     * accumulator transposed as in the bf16 backward: C^T[dp][64] += A^T[dp][0:m] * B[m][64]
     * for dV^T += dO^T P and dK^T += Q^T dS.
     *   split3_rowsT: A's parts from float rows src[m][dp] (Q or dO), zero at rows m..64.
     *   split3_qpair: B's parts from a score block [m][0:n] (row stride 64), zero at rows
     *                 m up to the next 32 and columns n..64; finite, or NaN on NaN rows.
     *   gemm_tn_acc3: C^T (row stride 64) += A^T B over queries [0, m). */
    int (*x3_supported)(void);
    void (*split3_rows)(uint16_t *dst, const float *src, int m, int dp);
    int (*split3_panel)(uint16_t *dst, const float *panel, int dp);
    void (*split3_vpair)(uint16_t *dst, const float *rows, int dp);
    void (*gemm_panel3)(int m, int dp, const uint16_t *a3, const uint16_t *panel3, float *c);
    void (*gemm_acc3)(int m, int n, int dp, const float *p, const uint16_t *vpair3, float *c);
    void (*split3_rowsT)(uint16_t *dst, const float *src, int m, int dp);
    void (*split3_qpair)(uint16_t *dst, const float *p, int m, int n);
    void (*gemm_tn_acc3)(int m, int dp, const uint16_t *at3, const uint16_t *b3, float *ct);

    /* Decode (cpu_decode.c): products straight from the cache rows, no packing. A decode
     * block is n <= 64 keys, each given by the address of its row (any dtype: 1 f32, 2 f16,
     * 3 bf16, the flashc_dtype values; d elements, contiguous, any alignment), against
     * m <= 64 float32 rows (query, head) of Q (stride dp, zero from d to dp). NULL where
     * the set has none: the generic set's then run. pf (NULL or npf row addresses, same
     * dtype and length) are the rows the caller reads next: the kernels ask for them to be
     * brought into cache a few at a time as they go, so the memory requests overlap the
     * arithmetic instead of coming in one burst the core waits for.
     *   decode_qk: s[r][c] = q[r] . k[c]  for r < m, c < n (s of row stride 64; columns up
     *     to the next multiple of 16 may be written).
     *   decode_qk16 (bf16 caches, sets with a bf16 dot product; NULL elsewhere, and used
     *     only where bf16_supported says so): s[r][c] = scale * (q16[r] . k[c]) with q16
     *     bf16 rows of stride dp, zero from d to dp, and float32 accumulation.
     *   decode_pv: o[r][0:d] += sum_c p[r][c] v[c] (p of row stride 64, o of stride dp).
     *     Each value row is read once for all m rows.
     *   decode_pv16 (bf16 caches, with decode_qk16): the same with P rounded to bf16
     *     (p16 [m][64], zero from n to the next even column) and float32 accumulation, as
     *     the forward's gemm_acc16.
     *   rows_nonfinite: 1 if any of the n rows holds a NaN or inf (such a block takes the
     *     product that skips zero probabilities, cpu_nonfinite.c). */
    void (*decode_qk)(int m, int n, int64_t d, const float *q, int dp, const void *const *k,
                      int dtype, const void *const *pf, int npf, float *s);
    void (*decode_qk16)(int m, int n, int64_t d, const uint16_t *q16, int dp,
                        const void *const *k, float scale, const void *const *pf, int npf,
                        float *s);
    void (*decode_pv)(int m, int n, int64_t d, const float *p, const void *const *v,
                      int dtype, const void *const *pf, int npf, float *o, int dp);
    void (*decode_pv16)(int m, int n, int64_t d, const uint16_t *p16, const void *const *v,
                        const void *const *pf, int npf, float *o, int dp);
    int (*rows_nonfinite)(const void *const *rows, int n, int64_t d, int dtype);
} flashc_cpu_kernels;

extern const flashc_cpu_kernels flashc_cpu_kernels_generic;
extern const flashc_cpu_kernels flashc_cpu_kernels_avx2;
extern const flashc_cpu_kernels flashc_cpu_kernels_avx512;
extern const flashc_cpu_kernels flashc_cpu_kernels_amx;
extern const flashc_cpu_kernels flashc_cpu_kernels_neon;

/* The best supported set, or the one named (NULL if that name is unknown or unsupported). */
const flashc_cpu_kernels *flashc_cpu_pick_kernels(const char *name);

/* "generic avx2 ..." : the names of the sets built in. */
const char *flashc_cpu_kernel_names(void);

#endif /* FLASHC_CPU_KERNELS_H */
