/*
 * fuzz_api.c - libFuzzer target: random tensor descriptors and params thrown at
 * flashc_forward, flashc_backward, flashc_backward_workspace_size, flashc_merge_accumulate,
 * flashc_forward_kvcache (contiguous and paged caches, with and without append) and
 * flashc_kvcache_workspace_size on the CPU
 * and reference backends, with the features' parameters among them (a window, softcap,
 * dropout, ALiBi slopes, variable-length offsets, sound or broken). Every tensor points into
 * one poisoned arena; after each call the harness checks that a failed call changed no byte,
 * and that a successful one changed only bytes inside the views of its outputs. Sanitizers
 * (address, undefined) catch the rest.
 *
 *   clang -fsanitize=fuzzer,address,undefined ... ; ./fuzz_api -max_total_time=60
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashc.h"

#define ARENA_BYTES (1 << 17)

static unsigned char *arena, *before;
static flashc_backend *cpu, *reference;

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t next_u8(reader *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
}

static uint32_t next_u32(reader *r)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = (v << 8) | next_u8(r);
    return v;
}

/* Mostly small valid sizes; sometimes 0, negative or huge. */
static int64_t fuzz_size(reader *r, int64_t typical)
{
    uint8_t sel = next_u8(r);
    switch (sel % 16) {
    case 0: return 0;
    case 1: return -(int64_t)next_u8(r);
    case 2: return (int64_t)next_u32(r) << (next_u8(r) % 32);
    default: return 1 + (int64_t)(next_u8(r) % typical);
    }
}

typedef struct fuzz_shape {
    int64_t batch, nq, nk, hq, hkv, dim;
} fuzz_shape;

/* A descriptor of the given logical shape with fuzzed dtype, strides and placement. */
static flashc_tensor fuzz_tensor(reader *r, int ndim, const int64_t *shape, flashc_dtype base)
{
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    uint8_t mode = next_u8(r);
    t.dtype = (mode % 8 == 0) ? (flashc_dtype)(next_u8(r) % 6) : base;
    t.ndim = (mode % 16 == 1) ? (int32_t)(next_u8(r) % 6) : ndim;
    for (int d = 0; d < 4; d++)
        t.shape[d] = d < ndim ? shape[d] : 0;
    if (mode % 8 == 2) /* perturb one size */
        t.shape[next_u8(r) % 4] = fuzz_size(r, 8);
    /* contiguous strides, then maybe a padded, transposed or broken variant */
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.stride[d] = s;
        int64_t ext = t.shape[d] > 0 && t.shape[d] < 4096 ? t.shape[d] : 1;
        s *= ext + (mode % 8 == 3 ? (next_u8(r) % 3) : 0);
    }
    if (mode % 8 == 4 && ndim == 4) { /* the [batch, heads, seqlen, dim] view */
        int64_t hs = t.stride[2];
        t.stride[2] = t.stride[1];
        t.stride[1] = hs;
    }
    if (mode % 16 == 5)
        t.stride[next_u8(r) % 4] = (int64_t)(int32_t)next_u32(r);
    size_t esize = flashc_dtype_size(t.dtype) ? flashc_dtype_size(t.dtype) : 2;
    size_t offset = ((size_t)next_u32(r) % (ARENA_BYTES / 2)) & ~(size_t)(esize - 1);
    if (mode % 32 == 6)
        offset |= 1; /* misaligned */
    t.data = (mode % 32 == 7) ? NULL : arena + offset;
    return t;
}

/* Byte range a descriptor covers if the library could accept it; 0 when it must reject it
 * (unknown dtype, NULL data, a size < 1 or > INT32_MAX, a negative stride, an overflow). */
static int extent(const flashc_tensor *t, size_t *begin, size_t *end)
{
    size_t esize = flashc_dtype_size(t->dtype);
    if (!t->data || !esize || t->ndim < 1 || t->ndim > 4)
        return 0;
    __int128 last = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 1 || t->shape[d] > INT32_MAX || t->stride[d] < 0)
            return 0;
        last += (__int128)(t->shape[d] - 1) * t->stride[d];
    }
    __int128 b = (unsigned char *)t->data - arena, e = b + (last + 1) * (__int128)esize;
    if (e > ((__int128)1 << 62))
        e = (__int128)1 << 62;
    *begin = (size_t)b;
    *end = (size_t)e;
    return 1;
}

/* The int32 and float tables of a call (cache lengths, page table, varlen offsets, ALiBi
 * slopes) live in the arena's last TABLE_BYTES, which no view reaches. */
#define TABLE_BYTES 4096

/* A call is made only if every plausibly valid view lies inside the arena, before its
 * tables: the library may read any valid view, so one reaching past them would be the
 * harness's bug (and an output over the tables would change them under the call). */
static int inside_arena(const flashc_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++) {
        size_t b, e;
        if (ts[i] && extent(ts[i], &b, &e) && e > ARENA_BYTES - TABLE_BYTES)
            return 0;
    }
    return 1;
}

/* num_seqs + 1 varlen offsets over total tokens: mostly sound prefix sums (sequences of any
 * length, empty ones included), sometimes with one entry out of order, negative or anything. */
static void fuzz_offsets(reader *r, int32_t *cu, int n, int64_t total)
{
    const uint8_t mode = next_u8(r);
    cu[0] = 0;
    for (int i = 1; i < n; i++) {
        const int64_t left = total - cu[i - 1];
        cu[i] = cu[i - 1] + (int32_t)(left > 0 ? next_u8(r) % (left + 1) : 0);
    }
    cu[n] = (int32_t)total;
    if (mode % 8 == 0)
        cu[next_u8(r) % (n + 1)] = (int32_t)next_u32(r);
    else if (mode % 8 == 1)
        cu[next_u8(r) % (n + 1)] -= 1 + next_u8(r) % 3;
}

/* Marks the bytes of the elements of a 4-d (or 3-d) view. */
static void mark_view(const flashc_tensor *t, unsigned char *mask)
{
    size_t esize = flashc_dtype_size(t->dtype);
    int64_t s3 = t->ndim == 4 ? t->shape[3] : 1;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < s3; d++) {
                    int64_t off = a * t->stride[0] + b * t->stride[1] + c * t->stride[2] +
                                  d * (t->ndim == 4 ? t->stride[3] : 0);
                    memset(mask + ((unsigned char *)t->data - arena) + off * (int64_t)esize, 1,
                           esize);
                }
}

static void check_writes(flashc_status st, flashc_tensor *const *outs, int n_outs,
                         const flashc_params *p)
{
    if (st != FLASHC_OK) {
        if (memcmp(arena, before, ARENA_BYTES) != 0)
            abort(); /* a failed call wrote memory */
        return;
    }
    unsigned char *mask = calloc(ARENA_BYTES, 1);
    for (int i = 0; i < n_outs; i++)
        mark_view(outs[i], mask);
    if (p && p->workspace) /* the backward's scratch is the caller's to lend */
        memset(mask + ((unsigned char *)p->workspace - arena), 1, p->workspace_size);
    for (size_t i = 0; i < ARENA_BYTES; i++)
        if (arena[i] != before[i] && !mask[i])
            abort(); /* a write outside the outputs */
    free(mask);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!arena) {
        arena = malloc(ARENA_BYTES);
        before = malloc(ARENA_BYTES);
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.num_threads = 2;
        if (flashc_backend_create("cpu", &cfg, &cpu) != FLASHC_OK ||
            flashc_backend_create("reference", NULL, &reference) != FLASHC_OK)
            abort();
    }
    reader r = {data, size};
    uint8_t op = next_u8(&r);
    flashc_backend *be = (op & 1) ? reference : cpu;
    if (op % 64 == 2)
        be = NULL;
    flashc_dtype dt = (flashc_dtype)(1 + next_u8(&r) % 3);
    fuzz_shape s = {1 + next_u8(&r) % 3, 1 + next_u8(&r) % 9, 1 + next_u8(&r) % 9, 0, 0, 0};
    s.hkv = 1 + next_u8(&r) % 3;
    s.hq = s.hkv * (1 + next_u8(&r) % 3);
    s.dim = (next_u8(&r) % 16 == 0) ? fuzz_size(&r, 300) : 1 + next_u8(&r) % 40;

    const int64_t qs[4] = {s.batch, s.nq, s.hq, s.dim}, ks[4] = {s.batch, s.nk, s.hkv, s.dim};
    const int64_t ls[3] = {s.batch, s.hq, s.nq};
    flashc_tensor q = fuzz_tensor(&r, 4, qs, dt), k = fuzz_tensor(&r, 4, ks, dt);
    flashc_tensor v = fuzz_tensor(&r, 4, ks, dt), o = fuzz_tensor(&r, 4, qs, dt);
    flashc_tensor lse = fuzz_tensor(&r, 3, ls, FLASHC_F32), dout = fuzz_tensor(&r, 4, qs, dt);
    flashc_tensor dq = fuzz_tensor(&r, 4, qs, dt), dk = fuzz_tensor(&r, 4, ks, dt);
    flashc_tensor dv = fuzz_tensor(&r, 4, ks, dt);
    flashc_tensor part_lse = fuzz_tensor(&r, 3, ls, FLASHC_F32);

    /* a KV cache: contiguous [B, capacity, Hkv, D] (k's shape) or paged [pages, page, Hkv, D] */
    uint8_t km = next_u8(&r);
    int paged = km & 1, append = (km >> 1) & 1;
    const int64_t page_size = (km & 4) ? 16 : ((km & 8) ? 32 : 17), pages = 1 + km % 5;
    const int64_t ps[4] = {pages, page_size, s.hkv, s.dim};
    flashc_tensor kc = paged ? fuzz_tensor(&r, 4, ps, dt) : k;
    flashc_tensor vc = paged ? fuzz_tensor(&r, 4, ps, dt) : v;
    flashc_kvcache_params kv;
    flashc_kvcache_params_init(&kv);
    /* the tables live at the end of the arena (int32 from tables[0]: cache lengths, page
     * table, varlen offsets at 32 and 40; float ALiBi slopes at 48), written after the poison
     * fill below */
    int32_t *tables = (int32_t *)(arena + ARENA_BYTES - TABLE_BYTES);
    const int max_pages = 1 + next_u8(&r) % 4, table_stride = max_pages + next_u8(&r) % 2;
    int32_t seqlens[3], table[3 * 5], cu_q[4] = {0}, cu_k[4] = {0};
    float slopes[16] = {0};
    for (int b = 0; b < 3; b++)
        seqlens[b] = (next_u8(&r) % 16 == 0) ? (int32_t)next_u32(&r)
                                              : (int32_t)(next_u8(&r) % (page_size * max_pages + 2));
    for (int i = 0; i < 3 * 5; i++)
        table[i] = (next_u8(&r) % 16 == 0) ? (int32_t)next_u32(&r) : (int32_t)(next_u8(&r) % pages);
    kv.cache_seqlens = tables;
    if (paged) {
        kv.block_table = tables + 8;
        kv.max_pages_per_seq = max_pages;
        kv.block_table_stride = table_stride;
    }
    kv.num_splits = next_u8(&r) % 8;

    flashc_params p;
    flashc_params_init(&p);
    uint8_t pm = next_u8(&r);
    p.causal = (pm % 8 == 7) ? (int32_t)next_u8(&r) : pm % 3;
    if (pm & 8) {
        uint32_t bits = next_u32(&r);
        memcpy(&p.softmax_scale, &bits, sizeof bits);
    }
    if (pm & 16)
        p.deterministic = 1;
    switch (next_u8(&r) % 16) {
    case 0:
        p.window_left = (int32_t)next_u8(&r) - 2;
        if (next_u8(&r) % 2)
            p.window_right = (int32_t)next_u8(&r) - 2;
        break;
    case 1: p.softcap = (float)next_u8(&r) - 1.0f; break;
    case 2: p.dropout_p = (float)next_u8(&r) / 128.0f; break;
    case 3: p.struct_size = next_u8(&r) % (sizeof p + 1); break; /* honest: never past p */
    case 4: p.workspace_size = next_u8(&r); break;
    case 5: /* a workspace before the tables */
        p.workspace = arena + ARENA_BYTES / 2;
        p.workspace_size = next_u32(&r) % (ARENA_BYTES / 2 - TABLE_BYTES);
        break;
    case 6: { /* a variable-length batch over q's and k's tokens ([1, total, heads, dim]) */
        const int n = 1 + next_u8(&r) % 3;
        p.num_seqs = (next_u8(&r) % 16 == 0) ? (int32_t)next_u8(&r) - 2 : n;
        fuzz_offsets(&r, cu_q, n, s.nq);
        fuzz_offsets(&r, cu_k, n, s.nk);
        p.cu_seqlens_q = tables + 32;
        p.cu_seqlens_k = tables + 40;
        if (next_u8(&r) % 4 == 0)
            p.max_seqlen_q = (int32_t)next_u8(&r) % 12 - 1;
        if (next_u8(&r) % 4 == 0)
            p.max_seqlen_k = (int32_t)next_u8(&r) % 12 - 1;
        break;
    }
    case 7: { /* ALiBi slopes, per head or per sequence and head; now and then not finite */
        for (int i = 0; i < 16; i++) {
            const uint8_t x = next_u8(&r);
            slopes[i] = x == 255 ? INFINITY : x == 254 ? NAN : (float)x / 64.0f;
        }
        p.alibi_slopes = (const float *)(tables + 48);
        if (next_u8(&r) % 16 == 0) /* misaligned */
            p.alibi_slopes = (const float *)((const char *)p.alibi_slopes + 1 + next_u8(&r) % 3);
        if (next_u8(&r) % 4 == 0)
            p.alibi_slopes_batch_stride = (int64_t)next_u8(&r) % 8 - 1;
        break;
    }
    default: break;
    }

    const flashc_tensor *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, &part_lse, &kc, &vc};
    if (!inside_arena(all, 12))
        return 0;

    for (size_t i = 0; i < ARENA_BYTES; i++)
        arena[i] = (unsigned char)(i * 131u + 7u);
    memcpy(tables, seqlens, sizeof seqlens);
    memcpy(tables + 8, table, sizeof table);
    memcpy(tables + 32, cu_q, sizeof cu_q);
    memcpy(tables + 40, cu_k, sizeof cu_k);
    memcpy(tables + 48, slopes, sizeof slopes);
    memcpy(before, arena, ARENA_BYTES);

    flashc_status st;
    (void)st;
    switch ((op >> 1) % 6) {
    case 0: {
        st = flashc_forward(be, &p, &q, &k, &v, &o, &lse);
        flashc_tensor *outs[] = {&o, &lse};
        check_writes(st, outs, 2, NULL);
        break;
    }
    case 1: {
        st = flashc_backward(be, &p, &dout, &q, &k, &v, &o, &lse, &dq, &dk, &dv);
        flashc_tensor *outs[] = {&dq, &dk, &dv};
        check_writes(st, outs, 3, &p);
        break;
    }
    case 2: {
        size_t bytes;
        st = flashc_backward_workspace_size(be, &p, &q, &k, &bytes);
        check_writes(FLASHC_ERROR_INTERNAL, NULL, 0, NULL); /* a query writes nothing */
        break;
    }
    case 3: {
        st = flashc_merge_accumulate(be, NULL, &o, &lse, &dout, &part_lse);
        flashc_tensor *outs[] = {&o, &lse};
        check_writes(st, outs, 2, NULL);
        break;
    }
    case 4: {
        size_t bytes;
        st = flashc_kvcache_workspace_size(be, &p, &kv, &q, &kc, &vc, append ? &dk : NULL,
                                           append ? &dv : NULL, &o, &lse, &bytes);
        check_writes(FLASHC_ERROR_INTERNAL, NULL, 0, NULL); /* a query writes nothing */
        break;
    }
    default: {
        /* k_new/v_new shaped like k ([B, Nk, Hkv, D]): dk and dv's descriptors */
        st = flashc_forward_kvcache(be, &p, &kv, &q, &kc, &vc, append ? &dk : NULL,
                                    append ? &dv : NULL, &o, &lse);
        /* an append may write any slot of the caches; nothing else beyond out and lse */
        flashc_tensor *outs[] = {&o, &lse, &kc, &vc};
        check_writes(st, outs, append ? 4 : 2, NULL);
        break;
    }
    }
    return 0;
}
