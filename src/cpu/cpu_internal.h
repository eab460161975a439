/*
 * cpu_internal.h - state of the CPU backend and the pieces its forward and backward share:
 * per-thread scratch, the packing of tensor rows into the micro-kernels' layouts
 * (cpu_pack.c) and the per-row visibility of a block under the causal mask.
 */
#ifndef FLASHC_CPU_INTERNAL_H
#define FLASHC_CPU_INTERNAL_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend.h"
#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "dtype.h"

typedef struct flashc_cpu_state {
    flashc_threadpool *pool;
    const flashc_cpu_kernels *kernels;
    /* A workspace kept between calls, so repeated calls do not pay for fresh pages (page
     * faults and zeroing were 6% of a forward). Guarded by ws_lock; a call that finds it
     * taken by a concurrent call allocates its own. */
    pthread_mutex_t ws_lock;
    void *ws;
    size_t ws_bytes;
} flashc_cpu_state;

/* A 64-byte aligned workspace of at least bytes for one call, all of it obtained before any
 * output is written. NULL (with the error recorded) on failure. */
typedef struct cpu_workspace {
    char *base;
    int cached; /* the handle's cached buffer, held under ws_lock */
} cpu_workspace;

flashc_status flashc_cpu_workspace_get(flashc_cpu_state *st, size_t bytes, cpu_workspace *ws);
void flashc_cpu_workspace_put(flashc_cpu_state *st, cpu_workspace *ws);

/* Per-thread scratch carved from a workspace: thread t's share starts floats_per_thread * t
 * floats after base. */
typedef struct cpu_scratch {
    float *base;
    size_t floats_per_thread;
} cpu_scratch;

static inline float *flashc_cpu_scratch_for(const cpu_scratch *s, int thread)
{
    return s->base + (size_t)thread * s->floats_per_thread;
}

/* 64-byte aligned allocation of bytes (rounded up), NULL on failure or overflow. */
void *flashc_cpu_alloc(size_t bytes);

/* Floats, rounded up to whole cache lines, so consecutive carve-outs stay 64-byte aligned. */
static inline size_t flashc_cpu_lines(size_t floats)
{
    return (floats + 15) & ~(size_t)15;
}

/* Bytes rounded up to whole cache lines. */
static inline size_t flashc_cpu_line_bytes(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* Number of blocks of size block covering n. */
static inline int64_t flashc_cpu_blocks(int64_t n, int64_t block)
{
    return (n + block - 1) / block;
}

static inline int flashc_cpu_block_len(int64_t total, int64_t start, int64_t block)
{
    return (int)(total - start < block ? total - start : block);
}

/* Visible keys of each row of a block (m queries from i0, n keys from j0, both counted in
 * sequence sq): row r sees columns [cbeg[r], ncols[r]) of the block, each in [0, n].
 * Returns 1 when some row has cbeg > 0, i.e. the block needs its left columns masked (a
 * sliding window); the plain and causal masks only ever cut a row's end. */
static inline int flashc_cpu_block_cols(const flashc_problem *pr, const flashc_seq *sq,
                                        int *cbeg, int *ncols, int64_t i0, int m, int64_t j0,
                                        int n)
{
    int left = 0;
    for (int r = 0; r < m; r++) {
        int64_t lo, hi;
        flashc_seq_key_range(pr, sq, i0 + r, &lo, &hi);
        int64_t e = hi - j0, a = lo - j0;
        ncols[r] = e < 0 ? 0 : (e > n ? n : (int)e);
        cbeg[r] = a < 0 ? 0 : (a > n ? n : (int)a);
        left |= cbeg[r] > 0;
    }
    return left;
}

/* The key blocks that a block of queries [i0, i0 + m) of sequence sq visits: [*jb0, *jb1)
 * in units of BLOCK_N, from the block holding the first row's first visible key to the one
 * holding the last row's last (both ends of a row's range grow with the row). */
static inline void flashc_cpu_key_blocks(const flashc_problem *pr, const flashc_seq *sq,
                                         int64_t i0, int m, int64_t *jb0, int64_t *jb1)
{
    int64_t lo, hi, lo_last, hi_first;
    flashc_seq_key_range(pr, sq, i0, &lo, &hi_first);
    flashc_seq_key_range(pr, sq, i0 + m - 1, &lo_last, &hi);
    *jb0 = lo / FLASHC_CPU_BLOCK_N;
    *jb1 = hi <= 0 ? 0 : flashc_cpu_blocks(hi, FLASHC_CPU_BLOCK_N);
}

/* ---- blocks of a batch of sequences: fixed length, or varlen from prefix sums ---- */

/* The query (or key) blocks of every sequence, numbered consecutively: sequence b owns
 * blocks [start(b), start(b + 1)). A fixed-length batch needs no table. */
typedef struct cpu_blocks {
    int64_t nseq;
    int64_t per_seq;      /* fixed length: blocks of every sequence */
    const int64_t *start; /* varlen: [nseq + 1] prefix sums, else NULL */
    int64_t total;
} cpu_blocks;

static inline int64_t flashc_cpu_blocks_start(const cpu_blocks *bl, int64_t b)
{
    return bl->start ? bl->start[b] : b * bl->per_seq;
}

static inline int64_t flashc_cpu_blocks_count(const cpu_blocks *bl, int64_t b)
{
    return flashc_cpu_blocks_start(bl, b + 1) - flashc_cpu_blocks_start(bl, b);
}

/* The sequence that owns block u (binary search for varlen; empty sequences own none). */
static inline int64_t flashc_cpu_blocks_seq(const cpu_blocks *bl, int64_t u)
{
    if (!bl->start)
        return u / bl->per_seq;
    int64_t a = 0, z = bl->nseq - 1; /* the last b with start[b] <= u */
    while (a < z) {
        int64_t mid = (a + z + 1) / 2;
        if (bl->start[mid] <= u)
            a = mid;
        else
            z = mid - 1;
    }
    return a;
}

/* Index of key block kblock of kv head hk of sequence b in the packed K/V layout: the blocks
 * of sequence b start at blocks_start(b) * heads_kv, grouped by kv head (for a fixed-length
 * batch: [batch * heads_kv][k_blocks]). The inverse of flashc_cpu_task_of. */
static inline size_t flashc_cpu_packed_index(const cpu_blocks *kb, int64_t heads_kv, int64_t b,
                                             int64_t hk, int64_t kblock)
{
    return (size_t)(flashc_cpu_blocks_start(kb, b) * heads_kv +
                    hk * flashc_cpu_blocks_count(kb, b) + kblock);
}

/* The (sequence, head, block) of task number task of heads x (blocks of every sequence):
 * sequence by sequence and, within one, head by head, so that consecutive tasks share a
 * head's rows (the packed layout's order for packing tasks; for query-block tasks the blocks
 * of one head follow each other while its packed K/V is in cache). */
static inline void flashc_cpu_task_of(const cpu_blocks *bl, int64_t heads, int64_t task,
                                      int64_t *b, int64_t *h, int64_t *block)
{
    /* sequence b's tasks are [start(b) heads, (start(b) + count(b)) heads) */
    *b = flashc_cpu_blocks_seq(bl, task / heads);
    const int64_t within = task - flashc_cpu_blocks_start(bl, *b) * heads;
    const int64_t count = flashc_cpu_blocks_count(bl, *b);
    *h = within / count;
    *block = within % count;
}

/* Blocks of the query side (keys = 0) or key side (keys = 1) over every sequence. */
static inline int64_t flashc_cpu_total_blocks(const flashc_problem *pr, int keys)
{
    const int64_t block = keys ? FLASHC_CPU_BLOCK_N : FLASHC_CPU_BLOCK_M;
    if (!(pr->features & FLASHC_FEATURE_VARLEN))
        return pr->batch * flashc_cpu_blocks(keys ? pr->seqlen_k : pr->seqlen_q, block);
    const int32_t *cu = keys ? pr->cu_seqlens_k : pr->cu_seqlens_q;
    int64_t total = 0;
    for (int64_t b = 0; b < pr->num_seqs; b++)
        total += flashc_cpu_blocks((int64_t)cu[b + 1] - cu[b], block);
    return total;
}

/* Fills bl for the query side (keys = 0) or key side (keys = 1); table holds nseq + 1
 * entries and is used for varlen only. */
static inline void flashc_cpu_blocks_init(cpu_blocks *bl, const flashc_problem *pr, int keys,
                                          int64_t *table)
{
    const int64_t block = keys ? FLASHC_CPU_BLOCK_N : FLASHC_CPU_BLOCK_M;
    bl->nseq = flashc_num_seqs(pr);
    bl->per_seq = flashc_cpu_blocks(keys ? pr->seqlen_k : pr->seqlen_q, block);
    bl->start = NULL;
    if (pr->features & FLASHC_FEATURE_VARLEN) {
        const int32_t *cu = keys ? pr->cu_seqlens_k : pr->cu_seqlens_q;
        table[0] = 0;
        for (int64_t b = 0; b < bl->nseq; b++)
            table[b + 1] = table[b] + flashc_cpu_blocks((int64_t)cu[b + 1] - cu[b], block);
        bl->start = table;
    }
    bl->total = flashc_cpu_blocks_start(bl, bl->nseq);
}

/* ---- score modifiers (cpu_scores.c): softcap, ALiBi, window edges, dropout ---- */

/* What turns a block of raw scores into logits for one (sequence, head). */
typedef struct cpu_score_mods {
    float scale;   /* applied first (1 when Q was packed pre-scaled) */
    float softcap; /* 0 = off */
    float slope;   /* ALiBi slope, 0 = off */
    int alibi;
    int64_t off;   /* the sequence's diagonal offset */
} cpu_score_mods;

/* 1 if the problem changes logits beyond the mask (softcap or ALiBi). */
static inline int flashc_cpu_has_mods(const flashc_problem *pr)
{
    return (pr->features & (FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI)) != 0;
}

static inline cpu_score_mods flashc_cpu_mods(const flashc_problem *pr, const flashc_seq *sq,
                                             int64_t b, int64_t h, float scale)
{
    cpu_score_mods md;
    md.scale = scale;
    md.softcap = (pr->features & FLASHC_FEATURE_SOFTCAP) ? pr->softcap : 0.0f;
    md.alibi = (pr->features & FLASHC_FEATURE_ALIBI) != 0;
    md.slope = flashc_alibi_slope(pr, b, h);
    md.off = flashc_seq_offset(pr, sq);
    return md;
}

/* s[m][64], raw scores of rows i0.. against keys j0.. (sequence indices), becomes the
 * logits of columns [0, n): scale, then softcap, then ALiBi; columns before cbeg[r] become
 * -inf (the window's left edge). dcap (NULL unless wanted) gets d logit / d(scaled score),
 * 1 - tanh^2 under softcap, for every column below n. */
void flashc_cpu_apply_mods(const cpu_score_mods *md, float *s, int m, int n, int64_t i0,
                           int64_t j0, const int *cbeg, float *dcap);

/* d[m][64] = the dropout factors of rows i0.. and keys j0.. of (sequence b, head h): 0 for a
 * dropped entry, 1/(1-p) for a kept one (flashc.h, src/philox.h); columns n..64 zero. */
void flashc_cpu_dropout_block(const flashc_problem *pr, int64_t b, int64_t h, int64_t i0, int m,
                              int64_t j0, int n, float *d);

/* x[r][c] *= y[r][c] for r < m, c < n, both of row stride 64. */
void flashc_cpu_mul_block(float *x, const float *y, int m, int n);

/* ---- packing (cpu_pack.c): inputs of any dtype and strides into kernel layouts ---- */

/* Rows of a [batch, seq, heads, dim] tensor lie heads x dim elements apart, a stride that the
 * hardware prefetchers do not follow from page to page, so a loop over a block's rows
 * waited on memory at each row's first touch. The loops below ask for the row this far
 * ahead of the one they convert. */
enum { FLASHC_CPU_PREFETCH_ROWS = 8 };

static inline void flashc_cpu_prefetch_row(const flashc_tensor *t, int64_t b, int64_t s,
                                           int64_t h, int for_write)
{
    const char *p = (const char *)flashc_row_ptr(t, b, s, h);
    const int64_t last = t->shape[3] * (int64_t)flashc_dtype_size(t->dtype) - 1;
    for (int64_t at = 0; at < last + 64; at += 64) {
        const char *line = p + (at < last ? at : last);
        if (for_write)
            __builtin_prefetch(line, 1);
        else
            __builtin_prefetch(line, 0);
    }
}

/* Before row r of rows [s0, s0 + n) is read (or written): asks for row r + PREFETCH_ROWS,
 * and at r = 0 for the rows up to it as well. */
static inline void flashc_cpu_prefetch_ahead(const flashc_tensor *t, int64_t b, int64_t s0,
                                             int n, int64_t h, int r, int for_write)
{
    const int first = r == 0 ? 0 : r + FLASHC_CPU_PREFETCH_ROWS;
    const int last = r + FLASHC_CPU_PREFETCH_ROWS < n ? r + FLASHC_CPU_PREFETCH_ROWS : n - 1;
    for (int i = first; i <= last; i++)
        flashc_cpu_prefetch_row(t, b, s0 + i, h, for_write);
}

/* dst[n][dp] = scale * rows [s0, s0 + n) of head h of batch b, as float32, dims d..dp zero. */
void flashc_cpu_pack_rows(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                          int n, int64_t h, float scale);
/* dst[dp][64] = the same rows transposed (one key per column); columns n..64 and dims d..dp
 * zero. */
void flashc_cpu_pack_panel(float *dst, int dp, const flashc_tensor *t, int64_t b, int64_t s0,
                           int n, int64_t h);
/* bf16 tensors only: dst[n][dp] bf16 rows, dims d..dp zero. */
void flashc_cpu_pack_rows16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                            int64_t s0, int n, int64_t h);
/* bf16 tensors only: dst[dp/2][64][2], element (dim, key) at [dim/2][key][dim%2]. */
void flashc_cpu_pack_panel16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h);
/* bf16 tensors only: dst[32][dp][2], element (key, dim) at [key/2][dim][key%2]; keys n..64
 * zero. */
void flashc_cpu_pack_vpair16(uint16_t *dst, int dp, const flashc_tensor *t, int64_t b,
                             int64_t s0, int n, int64_t h);

/* Stores rows [s0, s0 + n) of head h of batch b from src[n][ld] times scale, rounded to the
 * dtype. */
void flashc_cpu_store_rows(flashc_tensor *t, const float *src, int ld, int64_t b, int64_t s0,
                           int n, int64_t h, float scale);

/* ---- float32 on bf16 tiles ---- */

/* Whether float32 inputs may take a set's split float32 path (gemm_panel3 / gemm_acc3 and
 * the backward's split products): only where FLASHC_CPU_F32_SPLIT is "1". It is faster than
 * the FMA kernels on some AMX parts and slower on others (docs/PERF.md), so it is asked for,
 * not assumed. */
static inline int flashc_cpu_split_f32_enabled(void)
{
    const char *env = getenv("FLASHC_CPU_F32_SPLIT");
    return env && env[0] == '1' && env[1] == 0;
}

/* ---- non-finite K/V rows (cpu_nonfinite.c) ---- */

/* 1 if any of the n elements of a row is NaN or inf. */
int flashc_cpu_row_nonfinite(const void *row, flashc_dtype dtype, int64_t n);
/* Bit r set when row s0 + r (r < n <= 64) of head h of batch b holds a NaN or inf. */
uint64_t flashc_cpu_nonfinite_rows(const flashc_tensor *t, int64_t b, int64_t s0, int n,
                                   int64_t h);
/* C[m][dp] += A[m][0:n] * B[n][0:d], A a score block (row stride 64) and row k of B at
 * rows[k] in dtype, skipping the zero entries of A: the product of a block with NaN or inf
 * rows, where the kernels' 0 * NaN would leak a hidden key into a row. */
void flashc_cpu_acc_rows_sparse(int m, int n, int dp, const float *a,
                                const void *const *rows, flashc_dtype dtype, int64_t d,
                                float *c);
/* The same with B = rows [s0, s0 + n) of head h of batch b of t. */
void flashc_cpu_acc_block_sparse(int m, int n, int dp, const float *a, const flashc_tensor *t,
                                 int64_t b, int64_t s0, int64_t h, float *c);

flashc_status flashc_cpu_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                 const flashc_tensor *k, const flashc_tensor *v,
                                 flashc_tensor *out, flashc_tensor *lse);
flashc_status flashc_cpu_backward(void *state, const flashc_problem *pr,
                                  const flashc_tensor *dout, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v,
                                  const flashc_tensor *out, const flashc_tensor *lse,
                                  flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);
size_t flashc_cpu_backward_workspace_size(void *state, const flashc_problem *pr);

/* flashc_forward_kvcache: decode with split-KV (cpu_decode.c). */
flashc_status flashc_cpu_forward_kvcache(void *state, const flashc_kvcache_problem *pr,
                                         const flashc_tensor *q, flashc_tensor *k_cache,
                                         flashc_tensor *v_cache, const flashc_tensor *k_new,
                                         const flashc_tensor *v_new, flashc_tensor *out,
                                         flashc_tensor *lse);

#endif /* FLASHC_CPU_INTERNAL_H */
