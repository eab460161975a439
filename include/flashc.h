/*
 * flashc.h - the public C API of flashc, exact FlashAttention-2 forward and backward.
 *
 * The one header a user includes. Every function validates its arguments and returns a
 * flashc_status; on failure nothing the caller owns has been written, and
 * flashc_last_error() tells, for the calling thread, what was wrong and which argument.
 *
 * Computed, for batch b and query head h (key/value head h / (heads_q / heads_kv)):
 *
 *     S = scale * Q K^T                 scale 0 means 1/sqrt(head_dim)
 *     S[i][j] = -inf where masked       causal: see flashc_causal
 *     P = softmax(S) row-wise           a row with every key masked: P = 0, O = 0, LSE = -inf
 *     O = P V
 *     LSE[i] = log(sum_j exp(S[i][j]))  natural log, float32, [batch, heads_q, seqlen_q]
 *
 * Tensors are [batch, seqlen, heads, head_dim] with any non-negative element strides for the
 * first three dimensions and a contiguous last dimension, so [batch, heads, seqlen, head_dim]
 * and [batch*heads, seqlen, head_dim] buffers are described as views, without copies.
 *
 * Quick start (CPU):
 *
 *     flashc_backend *be;
 *     flashc_backend_create("auto", NULL, &be);
 *     flashc_params p;  flashc_params_init(&p);  p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
 *     flashc_tensor q = flashc_tensor_contiguous(qbuf, FLASHC_BF16, B, N, H, D);  ... k, v, o
 *     flashc_tensor lse = flashc_lse_contiguous(lsebuf, B, H, N);
 *     if (flashc_forward(be, &p, &q, &k, &v, &o, &lse) != FLASHC_OK)
 *         fprintf(stderr, "%s\n", flashc_last_error());
 *     flashc_backend_destroy(be);
 */
#ifndef FLASHC_H
#define FLASHC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FLASHC_BUILDING_SHARED)
#define FLASHC_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FLASHC_API __attribute__((visibility("default")))
#else
#define FLASHC_API
#endif

#define FLASHC_VERSION_MAJOR 0
#define FLASHC_VERSION_MINOR 1
#define FLASHC_VERSION_PATCH 0
#define FLASHC_VERSION_STRING "0.1.0"

/* Largest head dimension any backend serves. */
#define FLASHC_MAX_HEAD_DIM 256

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                             */
/* ---------------------------------------------------------------------------------------- */

typedef enum flashc_status {
    FLASHC_OK = 0,
    FLASHC_ERROR_NULL_POINTER = 1,        /* a required pointer argument or tensor data is NULL */
    FLASHC_ERROR_INVALID_DTYPE = 2,       /* a dtype value that is not a flashc_dtype */
    FLASHC_ERROR_DTYPE_MISMATCH = 3,      /* tensors that must share a dtype do not, or LSE not f32 */
    FLASHC_ERROR_SHAPE_MISMATCH = 4,      /* shapes that must agree between tensors do not */
    FLASHC_ERROR_INVALID_HEAD_DIM = 5,    /* head_dim 0, above FLASHC_MAX_HEAD_DIM, or not served */
    FLASHC_ERROR_INVALID_HEADS = 6,       /* heads_q not a positive multiple of heads_kv */
    FLASHC_ERROR_INVALID_STRIDE = 7,      /* last stride != 1, negative, or an output overlapping itself */
    FLASHC_ERROR_INVALID_SIZE = 8,        /* a size < 1, a wrong ndim, or sizes whose extent overflows */
    FLASHC_ERROR_ALIASING = 9,            /* an output overlaps an input or another output */
    FLASHC_ERROR_INVALID_PARAM = 10,      /* a params field out of range (scale NaN, unknown causal mode) */
    FLASHC_ERROR_UNSUPPORTED = 11,        /* a valid request this backend does not implement */
    FLASHC_ERROR_BACKEND_UNAVAILABLE = 12,/* the backend asked for is not built in or finds no device */
    FLASHC_ERROR_OUT_OF_MEMORY = 13,      /* an allocation (host or device) failed */
    FLASHC_ERROR_DEVICE = 14,             /* the device runtime reported an error */
    FLASHC_ERROR_INVALID_POINTER = 15,    /* memory of the wrong kind for the backend, or misaligned */
    FLASHC_ERROR_WORKSPACE_TOO_SMALL = 16,/* a caller workspace smaller than the query returned */
    FLASHC_ERROR_INTERNAL = 17            /* a bug in flashc: please report it */
} flashc_status;

/* A fixed, human-readable name for a status ("FLASHC_ERROR_SHAPE_MISMATCH: ..."). Never NULL. */
FLASHC_API const char *flashc_status_string(flashc_status status);

/* The detailed message of the last failed call on the calling thread, naming the argument
 * ("k: shape[3] (head_dim) is 80 but q has 64"). "" if no call on this thread has failed.
 * The pointer stays valid until the next flashc call on the same thread. */
FLASHC_API const char *flashc_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH". */
FLASHC_API const char *flashc_version(void);

/* ---------------------------------------------------------------------------------------- */
/* Tensors                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef enum flashc_dtype {
    FLASHC_F32 = 1,  /* IEEE binary32 */
    FLASHC_F16 = 2,  /* IEEE binary16 */
    FLASHC_BF16 = 3  /* bfloat16: the top 16 bits of a binary32 */
} flashc_dtype;

/* Size in bytes of one element, 0 for a value that is not a flashc_dtype. */
FLASHC_API size_t flashc_dtype_size(flashc_dtype dtype);

/* A strided view of memory the caller owns.
 * Q, K, V, O, dO, dQ, dK, dV: ndim 4, shape {batch, seqlen, heads, head_dim}, stride[3] == 1.
 * LSE: ndim 3, shape {batch, heads_q, seqlen_q}, dtype FLASHC_F32, any non-negative strides.
 * Strides count elements, not bytes. Dimensions past ndim are ignored. */
typedef struct flashc_tensor {
    void *data;
    flashc_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    int64_t stride[4];
} flashc_tensor;

/* A contiguous [batch, seqlen, heads, head_dim] view of data. */
FLASHC_API flashc_tensor flashc_tensor_contiguous(void *data, flashc_dtype dtype, int64_t batch,
                                                  int64_t seqlen, int64_t heads, int64_t head_dim);

/* A [batch, seqlen, heads, head_dim] view of a contiguous [batch, heads, seqlen, head_dim]
 * buffer (PyTorch SDPA's layout). */
FLASHC_API flashc_tensor flashc_tensor_bhsd(void *data, flashc_dtype dtype, int64_t batch,
                                            int64_t heads, int64_t seqlen, int64_t head_dim);

/* A contiguous float32 LSE view, [batch, heads, seqlen_q]. */
FLASHC_API flashc_tensor flashc_lse_contiguous(float *data, int64_t batch, int64_t heads,
                                               int64_t seqlen_q);

/* ---------------------------------------------------------------------------------------- */
/* Parameters                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef enum flashc_causal {
    FLASHC_CAUSAL_NONE = 0,
    /* Query i sees key j when j <= i + seqlen_k - seqlen_q (FlashAttention >= 2.1). Queries
     * i < seqlen_q - seqlen_k then see no key: their O is 0 and their LSE is -inf. */
    FLASHC_CAUSAL_BOTTOM_RIGHT = 1,
    /* Query i sees key j when j <= i (PyTorch SDPA's is_causal for seqlen_q != seqlen_k). */
    FLASHC_CAUSAL_TOP_LEFT = 2
} flashc_causal;

/*
 * The mask and the score, in full. For one sequence of Nq queries and Nk keys (the whole
 * tensor for a fixed-length batch, one segment of it for a variable-length one), query i
 * and key j are compared through the diagonal offset
 *
 *     off = 0            when causal == FLASHC_CAUSAL_TOP_LEFT
 *     off = Nk - Nq      otherwise (bottom-right alignment, FlashAttention's convention)
 *
 * and query i sees key j (0 <= j < Nk) when every rule that is on holds:
 *
 *     causal (either mode)      j <= i + off
 *     window_left  >= 0         j >= i + off - window_left
 *     window_right >= 0         j <= i + off + window_right
 *
 * so window_left = window_right = -1 is no window, causal is the window (-1, 0), and causal
 * with a window keeps the intersection (FlashAttention's local attention). A window of
 * (w, 0) is "the query and the w keys before it". A query that sees no key gets O = 0 and
 * LSE = -inf.
 *
 * The logit of a visible pair, in this order:
 *
 *     x = softmax_scale * q_i . k_j
 *     x = softcap * tanh(x / softcap)                  if softcap > 0 (scale applied before)
 *     x = x - slope * |i + off - j|                    if alibi_slopes (FlashAttention's ALiBi)
 *
 * LSE is log(sum_j exp(x_ij)) over the visible keys; P = exp(x - LSE). With dropout_p > 0,
 * O = sum_j P_ij * D_ij * v_j with D_ij = 1/(1 - dropout_p) for a kept entry and 0 for a
 * dropped one (flashc_dropout_keep below); LSE stays that of the un-dropped softmax, and the
 * backward regenerates D from the same seed rather than storing it.
 *
 * Variable-length batches: cu_seqlens_q and cu_seqlens_k (int32, num_seqs + 1 entries,
 * host memory for the host backends) are prefix sums of the sequence lengths over packed
 * tensors: q is [1, total_q, heads_q, head_dim] with sequence b in rows
 * [cu_seqlens_q[b], cu_seqlens_q[b+1]), k and v [1, total_k, heads_kv, head_dim] likewise,
 * and lse [1, heads_q, total_q]. The offsets must start at 0, never decrease and end at the
 * tensor's total (q.shape[1], k.shape[1]); sequences of length 0 are allowed (the tensors
 * must still hold at least one row in all). Every rule above, the causal alignment
 * included, applies per sequence, with i and j counted from the start of the sequence;
 * the b of ALiBi's per-batch slopes and of the dropout counter is the sequence index.
 */

/* Options of one call. Always start from flashc_params_init(), which sets struct_size and
 * the defaults, then set the fields you need: a caller compiled against an older, shorter
 * struct keeps working, since flashc reads only the first struct_size bytes.
 * A backend that does not implement a feature that is asked for returns
 * FLASHC_ERROR_UNSUPPORTED rather than ignoring it. */
typedef struct flashc_params {
    size_t struct_size;          /* sizeof(flashc_params) of the caller; set by flashc_params_init */
    float softmax_scale;         /* 0: 1/sqrt(head_dim). Must be finite. */
    int32_t causal;              /* a flashc_causal */
    int32_t window_left;         /* sliding window: keys before the diagonal; -1 = unbounded */
    int32_t window_right;        /* keys after the diagonal; -1 = unbounded */
    float softcap;               /* logit softcap, 0 = off; finite and >= 0 */
    const float *alibi_slopes;   /* ALiBi slopes, NULL = off: [heads_q], or per sequence (see
                                    alibi_slopes_batch_stride); finite */
    const int32_t *cu_seqlens_q; /* varlen: num_seqs + 1 prefix sums of query lengths, NULL =
                                    fixed length; set both or neither */
    const int32_t *cu_seqlens_k; /* varlen: num_seqs + 1 prefix sums of key lengths */
    int32_t max_seqlen_q;        /* varlen: longest query sequence, or 0 to let flashc find it;
                                    a value below the longest is an error. Device backends
                                    cannot read the offsets: there 0 means the packed total
                                    (slower: most tiles are empty), and a value below the
                                    longest leaves that sequence's later rows unwritten */
    int32_t max_seqlen_k;        /* varlen: longest key sequence, or 0 */
    float dropout_p;             /* dropout probability on P, in [0, 1); 0 = off */
    uint64_t dropout_seed;       /* the Philox key (flashc_dropout_keep) */
    uint64_t dropout_offset;     /* added to the Philox counter's high word: a call uses the
                                    words [offset, offset + batch * heads_q) */
    int32_t deterministic;       /* nonzero: bitwise identical results run to run (backward) */
    void *stream;                /* CUDA backend: the cudaStream_t to run on; NULL = legacy default */
    void *workspace;             /* scratch of workspace_size bytes for the backward and the
                                    KV-cache decode, or NULL to let flashc allocate (see
                                    flashc_backward_workspace_size and
                                    flashc_kvcache_workspace_size) */
    size_t workspace_size;
    /* ---- fields added in 0.2 (after workspace_size, so older callers keep their layout) ---- */
    int32_t num_seqs;            /* varlen: number of sequences (>= 1); 0 with no cu_seqlens */
    int64_t alibi_slopes_batch_stride; /* 0: one [heads_q] set of slopes for every sequence;
                                    s > 0: slopes of sequence b at alibi_slopes[b * s + h]
                                    ([batch, heads_q] with s = heads_q) */
} flashc_params;

/* Dropout mask, identical on every backend: entry (b, h, i, j) - sequence b, query head h,
 * query row i and key column j counted within the sequence - is kept when
 *
 *     r = philox4x32_10(counter, key)[j % 4]  >=  threshold
 *     key       = {(uint32)seed, (uint32)(seed >> 32)}
 *     counter   = {j / 4, i, (uint32)w, (uint32)(w >> 32)},  w = offset + b * heads_q + h
 *     threshold = (uint32)floor(dropout_p * 2^32)      (dropout_p as float, exact in double)
 *
 * Philox4x32-10 is Salmon et al.'s (Random123) generator; src/philox.h implements it for C
 * and CUDA. */
FLASHC_API int flashc_dropout_keep(uint64_t seed, uint64_t offset, float dropout_p,
                                   int64_t heads_q, int64_t b, int64_t h, int64_t i, int64_t j);

/* Fills p with the defaults: scale 0 (1/sqrt(d)), not causal, no window, no extras, and
 * struct_size. A macro, so that the size is the caller's own sizeof(flashc_params): a program
 * built against an older, shorter struct never has more written than it holds. Bindings from
 * other languages call flashc_params_init_sized with the size of their struct. */
#define flashc_params_init(p) flashc_params_init_sized((p), sizeof(flashc_params))
FLASHC_API void flashc_params_init_sized(flashc_params *p, size_t struct_size);

/* ---------------------------------------------------------------------------------------- */
/* Backends                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct flashc_backend flashc_backend;

/* Options of a backend handle. Start from flashc_backend_config_init(). */
typedef struct flashc_backend_config {
    size_t struct_size;  /* sizeof(flashc_backend_config); set by flashc_backend_config_init */
    int32_t num_threads; /* CPU: worker threads, 0 = FLASHC_NUM_THREADS or all cores */
    int32_t device;      /* CUDA: device ordinal, -1 = the current device */
    const char *cpu_isa; /* CPU: "auto" or NULL, or force a micro-kernel set by name
                            (FLASHC_CPU_ISA in the environment does the same) */
    const char *cuda_kernels; /* CUDA: "auto" or NULL (the fastest kernels the device runs:
                                 wgmma on sm_90, mma.sync elsewhere), or "mma" to force the
                                 mma.sync kernels (FLASHC_CUDA_KERNELS does the same) */
} flashc_backend_config;

/* The defaults (threads 0, device -1, ISA auto); a macro for the same reason as
 * flashc_params_init. */
#define flashc_backend_config_init(cfg)                                                      \
    flashc_backend_config_init_sized((cfg), sizeof(flashc_backend_config))
FLASHC_API void flashc_backend_config_init_sized(flashc_backend_config *cfg, size_t struct_size);

/* Creates a backend handle. name: "auto" (or NULL) picks CUDA when built in and a device is
 * present, else the CPU; "cpu", "cuda" or "reference" (the float64 reference: slow, exact,
 * host memory) ask for one. cfg may be NULL for the defaults. On failure *out is NULL. */
FLASHC_API flashc_status flashc_backend_create(const char *name, const flashc_backend_config *cfg,
                                               flashc_backend **out);

/* Frees a handle and what it owns (threads, device workspace). NULL is a no-op. */
FLASHC_API void flashc_backend_destroy(flashc_backend *backend);

/* The handle's backend name: "cpu", "cuda" or "reference". */
FLASHC_API const char *flashc_backend_name(const flashc_backend *backend);

/* Whether data for this backend lives in device memory (CUDA) rather than host memory. */
FLASHC_API int flashc_backend_uses_device_memory(const flashc_backend *backend);

/* 1 if a backend of that name is built in and usable on this machine, else 0. */
FLASHC_API int flashc_backend_available(const char *name);

/* A one-line description of the backend as set up (threads, ISA, device name...). */
FLASHC_API const char *flashc_backend_describe(const flashc_backend *backend);

/* Memory of the kind the backend computes on (device memory for CUDA, host memory for the
 * others), so that a C program can run any backend without its own runtime calls.
 * flashc_backend_malloc returns 64-byte aligned memory; flashc_backend_free(NULL) is a no-op. */
FLASHC_API flashc_status flashc_backend_malloc(flashc_backend *backend, size_t bytes, void **ptr);
FLASHC_API void flashc_backend_free(flashc_backend *backend, void *ptr);

typedef enum flashc_copy_kind {
    FLASHC_COPY_TO_BACKEND = 1, /* host -> backend memory */
    FLASHC_COPY_TO_HOST = 2     /* backend memory -> host */
} flashc_copy_kind;

/* Copies bytes between host memory and backend memory; returns when the copy is done. */
FLASHC_API flashc_status flashc_backend_memcpy(flashc_backend *backend, void *dst,
                                               const void *src, size_t bytes,
                                               flashc_copy_kind kind);

/* Waits until work the backend queued on stream (a cudaStream_t for CUDA, NULL for the
 * default stream) has finished. The host backends finish each call before returning. */
FLASHC_API flashc_status flashc_backend_synchronize(flashc_backend *backend, void *stream);

/* ---------------------------------------------------------------------------------------- */
/* Attention                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Forward: writes out (same shape and dtype as q) and lse ([batch, heads_q, seqlen_q] f32).
 * q: [B, Nq, Hq, D]; k, v: [B, Nk, Hkv, D], Hq a multiple of Hkv; all one dtype.
 * params may be NULL for the defaults. */
FLASHC_API flashc_status flashc_forward(flashc_backend *backend, const flashc_params *params,
                                        const flashc_tensor *q, const flashc_tensor *k,
                                        const flashc_tensor *v, flashc_tensor *out,
                                        flashc_tensor *lse);

/* Backward: given dout and the forward's q, k, v, out and lse, writes dq (like q) and dk, dv
 * (like k and v; for GQA summed over the query heads sharing a key head). P is recomputed
 * from lse; the same params as the forward must be passed. */
FLASHC_API flashc_status flashc_backward(flashc_backend *backend, const flashc_params *params,
                                         const flashc_tensor *dout, const flashc_tensor *q,
                                         const flashc_tensor *k, const flashc_tensor *v,
                                         const flashc_tensor *out, const flashc_tensor *lse,
                                         flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);

/* Bytes of caller scratch the backward can use for these shapes (0 when it needs none). On
 * CUDA, a params->workspace of at least this size makes the backward free of device
 * allocations (and so capturable in a CUDA graph without the stream-ordered allocator). The
 * CPU backend takes its delta rows from it and keeps the rest of its scratch (packed panels,
 * per-thread blocks) in the handle, allocated on first use and reused by later calls. */
FLASHC_API flashc_status flashc_backward_workspace_size(flashc_backend *backend,
                                                        const flashc_params *params,
                                                        const flashc_tensor *q,
                                                        const flashc_tensor *k, size_t *bytes);

/* ---------------------------------------------------------------------------------------- */
/* Decoding from a KV cache                                                                 */
/* (this section belongs to the KV-cache entry point; src/kvcache.c implements it)         */
/* ---------------------------------------------------------------------------------------- */

/* Options of flashc_forward_kvcache beyond flashc_params: where each sequence's keys are.
 * Start from flashc_kvcache_params_init(), which sets struct_size (the ABI rule of
 * flashc_params: an older caller's shorter struct keeps the defaults). */
typedef struct flashc_kvcache_params {
    size_t struct_size;            /* set by flashc_kvcache_params_init */
    const int32_t *cache_seqlens;  /* [batch]: tokens already in each sequence's cache
                                      (required; host memory for the host backends) */
    const int32_t *block_table;    /* NULL: a contiguous cache. Else a paged one: sequence b's
                                      page p is page block_table[b * block_table_stride + p]
                                      of the pool ([batch, max_pages_per_seq] int32, host
                                      memory for the host backends) */
    int32_t max_pages_per_seq;     /* paged: columns of block_table (>= 1) */
    int64_t block_table_stride;    /* paged: entries between rows; 0 = max_pages_per_seq */
    int32_t num_splits;            /* split-KV: 0 = chosen by flashc from the batch, the
                                      heads, the cache length and the threads (or SMs);
                                      1..FLASHC_KVCACHE_MAX_SPLITS forces that many chunks of
                                      each sequence's keys, merged through their LSE */
} flashc_kvcache_params;

#define FLASHC_KVCACHE_MAX_SPLITS 64

#define flashc_kvcache_params_init(p)                                                        \
    flashc_kvcache_params_init_sized((p), sizeof(flashc_kvcache_params))
FLASHC_API void flashc_kvcache_params_init_sized(flashc_kvcache_params *p, size_t struct_size);

/* Attention of a few new queries against each sequence's cached keys (decoding), with an
 * optional in-place append of the new keys and values first.
 *
 *   q            [B, Nq, Hq, D]    the new queries (Nq is typically 1..16; any Nq >= 1 works)
 *   k_cache,     contiguous: [B, capacity, Hkv, D], any strides with D contiguous;
 *   v_cache      paged (kv->block_table set): [num_pages, page_size, Hkv, D], page_size a
 *                power of two >= 16. Both one shape, q's dtype.
 *   k_new, v_new NULL (both), or [B, Nnew, Hkv, D]: appended into the cache at positions
 *                cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1 of sequence b BEFORE the
 *                attention, for every sequence, so the caches are then outputs too.
 *                cache_seqlens itself is not updated: the caller advances it by Nnew.
 *   out, lse     like flashc_forward's: out like q, lse [B, Hq, Nq] float32.
 *
 * Sequence b then holds L_b = cache_seqlens[b] + Nnew keys (0 is allowed: its rows get O = 0
 * and LSE = -inf), and its queries attend to keys [0, L_b) under flashc_params' rules with
 * Nk = L_b per sequence: causal is aligned bottom-right (query i sees key j <= i + L_b - Nq,
 * so the last new query sees every key; FLASHC_CAUSAL_TOP_LEFT keeps its j <= i), and
 * window_left/right, softcap and ALiBi apply as in flashc_forward. Hq a multiple of Hkv
 * (GQA, MQA). Not supported here (answered FLASHC_ERROR_UNSUPPORTED): dropout and
 * cu_seqlens (cache_seqlens is the ragged batch).
 *
 * Checked before anything is written: every cache_seqlens[b] >= 0 and L_b <= capacity
 * (capacity = cache shape[1], or max_pages_per_seq * page_size when paged); every block_table
 * entry that sequence b uses (pages 0 .. ceil(L_b / page_size) - 1) in [0, num_pages); with an
 * append, no two sequences writing the same cache slot, a cache view whose elements do not
 * overlap, and caches disjoint from every other tensor (k_cache and v_cache included). On an
 * error nothing is written; on success only out, lse and the appended slots are.
 * Pages that sequences share (a common prefix) may be read by several of them; a slot that
 * one sequence appends and another reads is read after the write.
 *
 * Split-KV (Flash-Decoding): each (sequence, kv head)'s keys are cut into kv->num_splits
 * chunks computed in parallel and combined as flashc_merge does, so a small batch still uses
 * every thread; a result may differ from the unsplit one by float32 reordering. On CUDA the
 * partial results go to params->workspace when one is given (flashc_kvcache_workspace_size
 * says how much; smaller is FLASHC_ERROR_WORKSPACE_TOO_SMALL), else to memory the call
 * allocates and frees on the stream.
 * params may be NULL for the defaults; kv is required (for cache_seqlens). */
FLASHC_API flashc_status flashc_forward_kvcache(flashc_backend *backend,
                                                const flashc_params *params,
                                                const flashc_kvcache_params *kv,
                                                const flashc_tensor *q, flashc_tensor *k_cache,
                                                flashc_tensor *v_cache,
                                                const flashc_tensor *k_new,
                                                const flashc_tensor *v_new, flashc_tensor *out,
                                                flashc_tensor *lse);

/* Bytes of params->workspace that flashc_forward_kvcache with these same arguments uses (0
 * when it needs none: no split, or a backend that keeps its scratch itself). On CUDA, a
 * workspace of at least this size makes the decode free of device allocations, so that a
 * CUDA graph of decode steps holds only the kernels (a caller's allocator, such as PyTorch's,
 * owns the memory). Validates the arguments as the call would; nothing is written. The size
 * depends on the shapes, the split count and the device, not on the tensors' contents. */
FLASHC_API flashc_status flashc_kvcache_workspace_size(
    flashc_backend *backend, const flashc_params *params, const flashc_kvcache_params *kv,
    const flashc_tensor *q, const flashc_tensor *k_cache, const flashc_tensor *v_cache,
    const flashc_tensor *k_new, const flashc_tensor *v_new, const flashc_tensor *out,
    const flashc_tensor *lse, size_t *bytes);

/* ---------------------------------------------------------------------------------------- */
/* Merging partial results by their LSE                                                     */
/* (this section is appended and kept separate: it belongs to the merge and ring attention) */
/* ---------------------------------------------------------------------------------------- */

/* Combines n partial attention results for the same queries, each computed over a disjoint
 * set of keys (split-KV decoding, chunked prefill, ring attention), into the result over the
 * union of the keys:
 *
 *     lse = log(sum_i exp(lse_i))          out = sum_i exp(lse_i - lse) * out_i
 *
 * A part whose lse_i is -inf (every one of its keys masked) contributes nothing, and its
 * out_i is not used, whatever it holds; a row where every part is -inf gets out = 0 and
 * lse = -inf, never NaN. lse values are expected finite or -inf, as flashc_forward writes
 * them; a NaN or +inf in an lse gives NaN in that row.
 *
 * outs[i] and out: [batch, seqlen_q, heads, head_dim] (the layout of flashc_forward's out),
 * any strides with the last dimension contiguous, each its own dtype (F32, F16 or BF16:
 * parts may be fp16 and the result float32, or the other way round).
 * lses[i] and lse: [batch, heads, seqlen_q] float32, any strides.
 * n >= 1. out and lse must not overlap each other nor any part. Sums are taken in float32.
 * stream: for a device backend, the cudaStream_t to run on (NULL: the default stream);
 * ignored by the host backends ("cpu", "reference"), which finish before returning. */
FLASHC_API flashc_status flashc_merge(flashc_backend *backend, void *stream, int32_t n,
                                      const flashc_tensor *outs, const flashc_tensor *lses,
                                      flashc_tensor *out, flashc_tensor *lse);

/* The in-place form, for a loop that receives one part at a time (ring attention, chunked
 * prefill): (acc_out, acc_lse) becomes the merge of itself and (part_out, part_lse).
 * An empty accumulator is acc_lse filled with -INFINITY (acc_out then needs no
 * initialization). Keep acc_out in F32 across many parts to avoid rounding at each step,
 * or in the storage dtype to save memory; part_out may have any of the three dtypes.
 * Shapes as in flashc_merge; the part must not overlap the accumulator. */
FLASHC_API flashc_status flashc_merge_accumulate(flashc_backend *backend, void *stream,
                                                 flashc_tensor *acc_out, flashc_tensor *acc_lse,
                                                 const flashc_tensor *part_out,
                                                 const flashc_tensor *part_lse);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_H */
