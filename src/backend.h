/*
 * backend.h - the interface between the validating front end (api.c) and the backends
 * (reference, CPU, CUDA). api.c checks every argument and reduces the call to a
 * flashc_problem; a backend receives only calls that already passed validation.
 */
#ifndef FLASHC_BACKEND_H
#define FLASHC_BACKEND_H

#include "flashc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated call: sizes, dtype, the resolved scale and the mask rule. */
typedef struct flashc_problem {
    int64_t batch;
    int64_t seqlen_q;
    int64_t seqlen_k;
    int64_t heads_q;
    int64_t heads_kv;
    int64_t head_dim;
    flashc_dtype dtype;     /* of q, k, v (and dout) */
    flashc_dtype out_dtype; /* of out (forward) or dq/dk/dv (backward); == dtype except where a
                               backend accepts float32 outputs (the reference) */
    float scale;            /* resolved: never 0 */
    int32_t causal;         /* a flashc_causal */
    int32_t deterministic;
    void *stream;
    void *workspace;
    size_t workspace_size;
    /* ---- features (appended; all zero is the plain function, so a problem built with
     * memset keeps meaning what it meant before they existed) ---- */
    uint32_t features;           /* FLASHC_FEATURE_* bits this call uses */
    int64_t window_left;         /* FEATURE_WINDOW: -1 = unbounded, else >= 0 */
    int64_t window_right;
    float softcap;               /* FEATURE_SOFTCAP: > 0 */
    const float *alibi_slopes;   /* FEATURE_ALIBI: slope of (b, h) at [b * stride + h] */
    int64_t alibi_batch_stride;
    int64_t num_seqs;            /* FEATURE_VARLEN: sequences; batch is then 1 */
    const int32_t *cu_seqlens_q; /* FEATURE_VARLEN: num_seqs + 1 validated prefix sums */
    const int32_t *cu_seqlens_k;
    int64_t max_seqlen_q;        /* longest sequence: seqlen_q/k when not varlen */
    int64_t max_seqlen_k;
    float dropout_p;             /* FEATURE_DROPOUT: in (0, 1) */
    uint32_t dropout_threshold;  /* flashc_dropout_threshold(dropout_p) */
    uint64_t dropout_seed;
    uint64_t dropout_offset;
} flashc_problem;

/* Offset added to a query index to get the last key it sees under the causal rule:
 * query i sees key j when j <= i + causal_offset. */
static inline int64_t flashc_causal_offset(const flashc_problem *pr)
{
    return pr->causal == FLASHC_CAUSAL_BOTTOM_RIGHT ? pr->seqlen_k - pr->seqlen_q : 0;
}

/* One past the last key that query i sees: seqlen_k when not causal, clamped to [0, seqlen_k]. */
static inline int64_t flashc_key_end(const flashc_problem *pr, int64_t i)
{
    if (pr->causal == FLASHC_CAUSAL_NONE)
        return pr->seqlen_k;
    int64_t end = i + flashc_causal_offset(pr) + 1;
    return end < 0 ? 0 : (end > pr->seqlen_k ? pr->seqlen_k : end);
}

struct flashc_merge_problem; /* defined with the LSE merge, at the end of this file */
struct flashc_kvcache_problem; /* defined with the KV-cache decode, at the end */

/* What a backend provides. Function pointers never see invalid arguments. */
typedef struct flashc_backend_ops {
    const char *name;
    int uses_device_memory;   /* tensors are device pointers */
    int accepts_f32_outputs;  /* out/dq/dk/dv may be FLASHC_F32 whatever the input dtype */
    int (*available)(void);   /* 1 if usable on this machine */
    flashc_status (*create)(const flashc_backend_config *cfg, void **state);
    void (*destroy)(void *state);
    /* Fills buf (size bytes) with a one-line description. */
    void (*describe)(void *state, char *buf, size_t size);
    flashc_status (*forward)(void *state, const flashc_problem *pr, const flashc_tensor *q,
                             const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *out,
                             flashc_tensor *lse);
    flashc_status (*backward)(void *state, const flashc_problem *pr, const flashc_tensor *dout,
                              const flashc_tensor *q, const flashc_tensor *k,
                              const flashc_tensor *v, const flashc_tensor *out,
                              const flashc_tensor *lse, flashc_tensor *dq, flashc_tensor *dk,
                              flashc_tensor *dv);
    size_t (*backward_workspace_size)(void *state, const flashc_problem *pr);
    /* Memory of the backend's kind. NULL for host backends: api.c then uses the C library.
     * All four are set or none. */
    flashc_status (*malloc_fn)(void *state, size_t bytes, void **ptr);
    void (*free_fn)(void *state, void *ptr);
    flashc_status (*memcpy_fn)(void *state, void *dst, const void *src, size_t bytes,
                               flashc_copy_kind kind);
    flashc_status (*synchronize_fn)(void *state, void *stream);
    /* Optional: the LSE merge (flashc_merge, flashc_merge_accumulate; see
     * flashc_merge_problem below). NULL: a host-memory backend gets merge.c's host loop, a
     * device backend answers FLASHC_ERROR_UNSUPPORTED. */
    flashc_status (*merge)(void *state, const struct flashc_merge_problem *pr,
                           const flashc_tensor *outs, const flashc_tensor *lses,
                           flashc_tensor *out, flashc_tensor *lse);
    /* FLASHC_FEATURE_* bits the backend implements (appended last, so that a positional
     * initializer that predates it leaves 0: no features, every one rejected by api.c). */
    uint32_t features;
    /* Optional: flashc_forward_kvcache (the decode problem is defined at the end of this
     * file). Appended after features, so a positional table written before it leaves NULL,
     * which api answers with FLASHC_ERROR_UNSUPPORTED. The op appends k_new/v_new (when
     * given) and then attends; it must allocate everything it needs before either. */
    flashc_status (*forward_kvcache)(void *state, const struct flashc_kvcache_problem *pr,
                                     const flashc_tensor *q, flashc_tensor *k_cache,
                                     flashc_tensor *v_cache, const flashc_tensor *k_new,
                                     const flashc_tensor *v_new, flashc_tensor *out,
                                     flashc_tensor *lse);
    /* Optional: bytes of pr->base.workspace that forward_kvcache uses when one is given (0 or
     * NULL: it never uses one). A forward_kvcache that uses a workspace answers one smaller
     * than this with FLASHC_ERROR_WORKSPACE_TOO_SMALL before it writes anything. */
    size_t (*kvcache_workspace_size)(void *state, const struct flashc_kvcache_problem *pr);
} flashc_backend_ops;

extern const flashc_backend_ops flashc_reference_backend_ops;
extern const flashc_backend_ops flashc_cpu_backend_ops;
#ifdef FLASHC_HAVE_CUDA
extern const flashc_backend_ops flashc_cuda_backend_ops;
#endif

/* Records a detailed message for the calling thread's flashc_last_error() and returns status,
 * so that a backend can write: return flashc_error(FLASHC_ERROR_DEVICE, "cuda: %s", msg); */
flashc_status flashc_error(flashc_status status, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- LSE merge (merge.c) ---------------------------------------------------------------- */

/* A validated merge: n_parts parts of [batch, seqlen, heads, head_dim] out and
 * [batch, heads, seqlen] float32 LSE, each tensor with its own dtype. When in_place is set
 * (flashc_merge_accumulate), out and lse are the very views outs[0] and lses[0]: a backend
 * must read every input of a row before it writes that row. */
typedef struct flashc_merge_problem {
    int64_t batch;
    int64_t seqlen;
    int64_t heads;
    int64_t head_dim;
    int32_t n_parts;
    int32_t in_place;
    void *stream;
} flashc_merge_problem;

/* The host loop, for backends whose tensors live in host memory. */
flashc_status flashc_host_merge(void *state, const flashc_merge_problem *pr,
                                const flashc_tensor *outs, const flashc_tensor *lses,
                                flashc_tensor *out, flashc_tensor *lse);

/* ---- features beyond plain attention (flashc.h documents the function they compute) ---- */

enum {
    FLASHC_FEATURE_WINDOW = 1u << 0,  /* window_left / window_right */
    FLASHC_FEATURE_SOFTCAP = 1u << 1, /* softcap */
    FLASHC_FEATURE_ALIBI = 1u << 2,   /* alibi_slopes */
    FLASHC_FEATURE_VARLEN = 1u << 3,  /* cu_seqlens_q / cu_seqlens_k */
    FLASHC_FEATURE_DROPOUT = 1u << 4  /* dropout_p */
};

/* One sequence of a problem: its rows in the tensors and its lengths. For a fixed-length
 * batch, sequence b is tensor batch b from row 0; for a varlen one, tensor batch 0 from the
 * cu_seqlens offsets. */
typedef struct flashc_seq {
    int64_t batch;  /* index into the tensors' batch dimension */
    int64_t q0, nq; /* first row and length in q / out / lse */
    int64_t k0, nk; /* first row and length in k / v */
} flashc_seq;

static inline int64_t flashc_num_seqs(const flashc_problem *pr)
{
    return (pr->features & FLASHC_FEATURE_VARLEN) ? pr->num_seqs : pr->batch;
}

static inline flashc_seq flashc_seq_of(const flashc_problem *pr, int64_t b)
{
    flashc_seq s;
    if (pr->features & FLASHC_FEATURE_VARLEN) {
        s.batch = 0;
        s.q0 = pr->cu_seqlens_q[b];
        s.nq = pr->cu_seqlens_q[b + 1] - s.q0;
        s.k0 = pr->cu_seqlens_k[b];
        s.nk = pr->cu_seqlens_k[b + 1] - s.k0;
    } else {
        s.batch = b;
        s.q0 = s.k0 = 0;
        s.nq = pr->seqlen_q;
        s.nk = pr->seqlen_k;
    }
    return s;
}

/* The diagonal offset "off" of flashc.h: query i of the sequence is aligned with key i + off. */
static inline int64_t flashc_seq_offset(const flashc_problem *pr, const flashc_seq *s)
{
    return pr->causal == FLASHC_CAUSAL_TOP_LEFT ? 0 : s->nk - s->nq;
}

/* The keys query i of sequence s sees: [*lo, *hi), clamped to [0, nk]; empty when
 * *lo >= *hi. Both ends grow with i, so a block of queries sees [lo(first), hi(last)). */
static inline void flashc_seq_key_range(const flashc_problem *pr, const flashc_seq *s,
                                        int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t diag = i + flashc_seq_offset(pr, s);
    int64_t a = 0, e = s->nk;
    if (pr->causal != FLASHC_CAUSAL_NONE && diag + 1 < e)
        e = diag + 1;
    if (pr->features & FLASHC_FEATURE_WINDOW) {
        if (pr->window_right >= 0 && diag + pr->window_right + 1 < e)
            e = diag + pr->window_right + 1;
        if (pr->window_left >= 0 && diag - pr->window_left > a)
            a = diag - pr->window_left;
    }
    if (e < 0)
        e = 0;
    if (a > s->nk)
        a = s->nk;
    *lo = a;
    *hi = e;
}

/* ALiBi slope of sequence b, query head h (0 when ALiBi is off). */
static inline float flashc_alibi_slope(const flashc_problem *pr, int64_t b, int64_t h)
{
    return (pr->features & FLASHC_FEATURE_ALIBI)
               ? pr->alibi_slopes[b * pr->alibi_batch_stride + h]
               : 0.0f;
}


/* ---- KV-cache decode (kvcache.c) ---------------------------------------------------------- */

/* A validated flashc_forward_kvcache. base describes the attention as flashc_forward would:
 * batch, seqlen_q (Nq), heads, head_dim, dtype, out_dtype, scale, causal and the features
 * (window, softcap, ALiBi; never varlen or dropout), with seqlen_k = the cache capacity.
 * Sequence b holds flashc_kvcache_len(pr, b) keys; key j of it is at
 * flashc_kvcache_row(pr, cache, b, j, kv_head). */
typedef struct flashc_kvcache_problem {
    flashc_problem base;
    int64_t seqlen_new;          /* rows of k_new / v_new appended; 0 = no append */
    int64_t capacity;            /* keys a sequence can hold */
    int64_t max_len;             /* longest L_b (host backends: exact; device: capacity) */
    const int32_t *cache_seqlens; /* [batch] */
    int32_t paged;
    int32_t page_shift;          /* paged: log2(page_size) */
    int64_t page_size;
    int64_t num_pages;
    const int32_t *block_table;  /* paged: row b at b * block_table_stride */
    int64_t block_table_stride;
    int64_t max_pages_per_seq;
    int32_t num_splits;          /* 0: the backend picks with flashc_kvcache_num_splits */
    int64_t elem_size;           /* bytes of one element of q's dtype */
} flashc_kvcache_problem;

/* L_b: keys of sequence b once the new ones are appended. */
static inline int64_t flashc_kvcache_len(const flashc_kvcache_problem *pr, int64_t b)
{
    return (int64_t)pr->cache_seqlens[b] + pr->seqlen_new;
}

/* Address of key j (0 <= j < capacity) of sequence b, kv head h, in a cache view. */
static inline void *flashc_kvcache_row(const flashc_kvcache_problem *pr,
                                       const flashc_tensor *cache, int64_t b, int64_t j,
                                       int64_t h)
{
    int64_t outer = b, slot = j;
    if (pr->paged) {
        outer = pr->block_table[b * pr->block_table_stride + (j >> pr->page_shift)];
        slot = j & (pr->page_size - 1);
    }
    int64_t off = outer * cache->stride[0] + slot * cache->stride[1] + h * cache->stride[2];
    return (char *)cache->data + off * pr->elem_size;
}

/* The number of key chunks per (sequence, kv head), in one place for every backend: tasks
 * is the number of independent pieces without splitting (batch * kv heads * row chunks),
 * units the processors that run them (threads; SMs times resident blocks on CUDA), min_keys
 * the fewest keys worth a chunk of its own. Picks the fewest splits whose waves over the
 * units come within 85% of the best efficiency, as FlashAttention's heuristic does. */
int32_t flashc_kvcache_num_splits(int64_t tasks, int64_t max_len, int64_t units,
                                  int64_t min_keys);

/* The GPU's choice, same arguments: the most splits whose CTAs still fit one wave (tasks x
 * splits <= units), no split when the tasks already come near the units. At batch 1 a
 * GPU's time is a wave's, so every unit left idle is bandwidth lost, while a few more
 * partial rows to merge cost little. */
int32_t flashc_kvcache_num_splits_one_wave(int64_t tasks, int64_t max_len, int64_t units,
                                           int64_t min_keys);

/* For host-memory backends: copies k_new / v_new into the cache slots (no-op without an
 * append). Called by a backend's op after its allocations, before it attends. */
void flashc_host_kvcache_append(const flashc_kvcache_problem *pr, flashc_tensor *k_cache,
                                flashc_tensor *v_cache, const flashc_tensor *k_new,
                                const flashc_tensor *v_new);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_BACKEND_H */
