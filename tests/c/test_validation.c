/*
 * test_validation.c - every entry point on bad input: each mistake gets its own status and a
 * message that names the argument, and no output buffer is touched (each is compared byte
 * for byte with a snapshot taken before the call). The feature parameters (window, softcap,
 * ALiBi, varlen offsets, dropout) each get their range errors, and a backend that lacks a
 * feature must refuse it with FLASHC_ERROR_UNSUPPORTED.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "../../src/api_internal.h"

static flashc_backend *be;
static test_tensor tq, tk, tv, to, tlse, tdo, tdq, tdk, tdv;

/* Arguments of one call, valid until a test changes one of them. */
typedef struct call_args {
    flashc_tensor q, k, v, o, lse, dout, dq, dk, dv;
    const flashc_tensor *qp, *kp, *vp, *op, *lsep, *doutp, *dqp, *dkp, *dvp;
    flashc_params params;
    const flashc_params *paramsp; /* NULL: &params */
    int null_params;              /* pass params == NULL */
    flashc_backend *backend;
} call_args;

static call_args valid_args(void)
{
    call_args a;
    memset(&a, 0, sizeof a);
    a.q = tq.t;
    a.k = tk.t;
    a.v = tv.t;
    a.o = to.t;
    a.lse = tlse.t;
    a.dout = tdo.t;
    a.dq = tdq.t;
    a.dk = tdk.t;
    a.dv = tdv.t;
    flashc_params_init(&a.params);
    a.backend = be;
    return a;
}

/* Stands for a NULL descriptor in call_args (whose NULL means "the default one"). */
static const flashc_tensor null_desc;
#define NULL_DESC (&null_desc)

/* Resolves the pointers to the args' own descriptors unless a test set them. */
static void bind(call_args *a)
{
#define BIND(x) if (!a->x##p) a->x##p = &a->x; else if (a->x##p == NULL_DESC) a->x##p = NULL
    BIND(q); BIND(k); BIND(v); BIND(o); BIND(lse); BIND(dout); BIND(dq); BIND(dk); BIND(dv);
#undef BIND
    if (!a->paramsp)
        a->paramsp = &a->params;
    if (a->null_params)
        a->paramsp = NULL;
}

static test_tensor *outputs[] = {&to, &tlse, &tdq, &tdk, &tdv};
#define N_OUTPUTS 5

static void expect(const char *label, int backward, call_args a, flashc_status want,
                   const char *needle)
{
    bind(&a);
    void *snap[N_OUTPUTS];
    for (int i = 0; i < N_OUTPUTS; i++)
        snap[i] = tt_snapshot(outputs[i]);
    flashc_status st;
    if (backward)
        st = flashc_backward(a.backend, a.paramsp, a.doutp, a.qp, a.kp, a.vp, a.op, a.lsep,
                             (flashc_tensor *)a.dqp, (flashc_tensor *)a.dkp,
                             (flashc_tensor *)a.dvp);
    else
        st = flashc_forward(a.backend, a.paramsp, a.qp, a.kp, a.vp, (flashc_tensor *)a.op,
                            (flashc_tensor *)a.lsep);
    const char *msg = flashc_last_error();
    CHECK(st == want, "%s: got %s, want %s (message: %s)", label, flashc_status_string(st),
          flashc_status_string(want), msg);
    if (want != FLASHC_OK && needle)
        CHECK(strstr(msg, needle) != NULL, "%s: message '%s' does not name '%s'", label, msg,
              needle);
    if (want != FLASHC_OK)
        for (int i = 0; i < N_OUTPUTS; i++)
            CHECK(tt_unchanged(outputs[i], snap[i]), "%s: output %d was written", label, i);
    for (int i = 0; i < N_OUTPUTS; i++)
        free(snap[i]);
}

#define FWD(label, mutate, status, needle)                                                   \
    do {                                                                                     \
        call_args a = valid_args();                                                          \
        mutate;                                                                              \
        expect(label, 0, a, status, needle);                                                 \
    } while (0)
#define BWD(label, mutate, status, needle)                                                   \
    do {                                                                                     \
        call_args a = valid_args();                                                          \
        mutate;                                                                              \
        expect(label, 1, a, status, needle);                                                 \
    } while (0)
#define BOTH(label, mutate, status, needle)                                                  \
    do {                                                                                     \
        FWD(label " (forward)", mutate, status, needle);                                     \
        BWD(label " (backward)", mutate, status, needle);                                    \
    } while (0)

static void tensor_errors(void)
{
    BOTH("backend NULL", a.backend = NULL, FLASHC_ERROR_NULL_POINTER, "backend");
    BOTH("q descriptor NULL", a.qp = NULL_DESC, FLASHC_ERROR_NULL_POINTER, "q");
    BOTH("k data NULL", a.k.data = NULL, FLASHC_ERROR_NULL_POINTER, "k");
    BOTH("v data NULL", a.v.data = NULL, FLASHC_ERROR_NULL_POINTER, "v");
    BOTH("q dtype unknown", a.q.dtype = (flashc_dtype)99, FLASHC_ERROR_INVALID_DTYPE, "q");
    BOTH("k dtype differs", a.k.dtype = FLASHC_F16, FLASHC_ERROR_DTYPE_MISMATCH, "k");
    BOTH("v dtype differs", a.v.dtype = FLASHC_BF16, FLASHC_ERROR_DTYPE_MISMATCH, "v");
    BOTH("q data misaligned", a.q.data = (char *)tq.buffer + 1, FLASHC_ERROR_INVALID_POINTER,
         "q");
    BOTH("q ndim 3", a.q.ndim = 3, FLASHC_ERROR_INVALID_SIZE, "q");
    BOTH("head_dim 0", a.q.shape[3] = 0, FLASHC_ERROR_INVALID_HEAD_DIM, "head_dim");
    BOTH("head_dim 257", (a.q.shape[3] = 257, a.k.shape[3] = 257, a.v.shape[3] = 257),
         FLASHC_ERROR_INVALID_HEAD_DIM, "q");
    BOTH("k head_dim differs", a.k.shape[3] = 4, FLASHC_ERROR_SHAPE_MISMATCH, "head_dim");
    BOTH("k batch differs", a.k.shape[0] = 2, FLASHC_ERROR_SHAPE_MISMATCH, "batch");
    BOTH("v seqlen differs from k", a.v.shape[1] = 4, FLASHC_ERROR_SHAPE_MISMATCH, "v");
    BOTH("heads_q not a multiple of heads_kv", (a.k.shape[2] = 3, a.v.shape[2] = 3),
         FLASHC_ERROR_INVALID_HEADS, "heads");
    BOTH("q last stride 2", a.q.stride[3] = 2, FLASHC_ERROR_INVALID_STRIDE, "q");
    BOTH("k negative stride", a.k.stride[1] = -8, FLASHC_ERROR_INVALID_STRIDE, "k");
    BOTH("q seqlen 0", a.q.shape[1] = 0, FLASHC_ERROR_INVALID_SIZE, "q");
    BOTH("k seqlen negative", (a.k.shape[1] = -5, a.v.shape[1] = -5), FLASHC_ERROR_INVALID_SIZE,
         "k");
    BOTH("q batch 2^40", a.q.shape[0] = (int64_t)1 << 40, FLASHC_ERROR_INVALID_SIZE, "q");
    BOTH("k strides overflow int64", (a.k.stride[1] = INT64_MAX / 2),
         FLASHC_ERROR_INVALID_SIZE, "k");
    BOTH("v extent wraps the address space",
         (a.v.data = (void *)((UINTPTR_MAX - 64) & ~(uintptr_t)63)), FLASHC_ERROR_INVALID_SIZE, "v");

    BOTH("q broadcast (stride 0) to 2^45 elements",
         (a.q.shape[0] = (int64_t)1 << 20, a.q.shape[1] = (int64_t)1 << 21,
          a.q.stride[0] = a.q.stride[1] = 0),
         FLASHC_ERROR_INVALID_SIZE, "2^40");
    FWD("out NULL", a.op = NULL_DESC, FLASHC_ERROR_NULL_POINTER, "out");
    FWD("lse NULL", a.lsep = NULL_DESC, FLASHC_ERROR_NULL_POINTER, "lse");
    FWD("out dtype differs", a.o.dtype = FLASHC_F16, FLASHC_ERROR_DTYPE_MISMATCH, "out");
    FWD("lse dtype f16", a.lse.dtype = FLASHC_F16, FLASHC_ERROR_DTYPE_MISMATCH, "lse");
    FWD("out shape differs", a.o.shape[1] = 3, FLASHC_ERROR_SHAPE_MISMATCH, "out");
    FWD("lse shape differs", a.lse.shape[2] = 3, FLASHC_ERROR_SHAPE_MISMATCH, "lse");
    FWD("lse ndim 4", a.lse.ndim = 4, FLASHC_ERROR_INVALID_SIZE, "lse");
    FWD("out heads overlap (stride 0)", a.o.stride[2] = 0, FLASHC_ERROR_INVALID_STRIDE, "out");
    FWD("lse rows overlap", a.lse.stride[2] = 0, FLASHC_ERROR_INVALID_STRIDE, "lse");
    FWD("out aliases q", a.o.data = tq.buffer, FLASHC_ERROR_ALIASING, "out");
    FWD("lse inside out", a.lse.data = to.buffer, FLASHC_ERROR_ALIASING, "out");

    BWD("dout NULL", a.doutp = NULL_DESC, FLASHC_ERROR_NULL_POINTER, "dout");
    BWD("dq NULL", a.dqp = NULL_DESC, FLASHC_ERROR_NULL_POINTER, "dq");
    BWD("dv data NULL", a.dv.data = NULL, FLASHC_ERROR_NULL_POINTER, "dv");
    BWD("dout dtype differs", a.dout.dtype = FLASHC_F16, FLASHC_ERROR_DTYPE_MISMATCH, "dout");
    BWD("out dtype differs", a.o.dtype = FLASHC_BF16, FLASHC_ERROR_DTYPE_MISMATCH, "out");
    BWD("dk dtype differs", a.dk.dtype = FLASHC_F16, FLASHC_ERROR_DTYPE_MISMATCH, "dk");
    BWD("dout shape differs", a.dout.shape[2] = 1, FLASHC_ERROR_SHAPE_MISMATCH, "dout");
    BWD("dq shape differs", a.dq.shape[1] = 5, FLASHC_ERROR_SHAPE_MISMATCH, "dq");
    BWD("dk shape differs", a.dk.shape[3] = 4, FLASHC_ERROR_SHAPE_MISMATCH, "dk");
    BWD("dv shape differs", a.dv.shape[1] = 4, FLASHC_ERROR_SHAPE_MISMATCH, "dv");
    BWD("lse shape differs", a.lse.shape[1] = 1, FLASHC_ERROR_SHAPE_MISMATCH, "lse");
    BWD("dk aliases dv", a.dk.data = tdv.buffer, FLASHC_ERROR_ALIASING, "dk");
    BWD("dq aliases dout", a.dq.data = tdo.buffer, FLASHC_ERROR_ALIASING, "dq");
    BWD("dv rows overlap", a.dv.stride[1] = 0, FLASHC_ERROR_INVALID_STRIDE, "dv");
}

/* The CPU backend's handle with a copy of its table that claims no features: what a backend
 * written before the features (the CUDA one today) looks like to api.c. */
static flashc_backend_ops featureless_ops;

static flashc_backend *make_featureless_backend(void)
{
    flashc_backend *b = NULL;
    CHECK(flashc_backend_create("cpu", NULL, &b) == FLASHC_OK, "cpu backend");
    featureless_ops = *b->ops;
    featureless_ops.features = 0;
    b->ops = &featureless_ops;
    return b;
}

static void destroy_featureless_backend(flashc_backend *b)
{
    flashc_backend_destroy(b);
}

static void param_errors(void)
{
    BOTH("params NULL is the defaults", a.null_params = 1, FLASHC_OK, NULL);
    BOTH("struct_size 0", a.params.struct_size = 0, FLASHC_ERROR_INVALID_PARAM, "struct_size");
    BOTH("struct_size 1 MiB", a.params.struct_size = (size_t)1 << 20, FLASHC_ERROR_INVALID_PARAM,
         "struct_size");
    BOTH("scale NaN", a.params.softmax_scale = NAN, FLASHC_ERROR_INVALID_PARAM, "softmax_scale");
    BOTH("scale inf", a.params.softmax_scale = INFINITY, FLASHC_ERROR_INVALID_PARAM,
         "softmax_scale");
    BOTH("causal 7", a.params.causal = 7, FLASHC_ERROR_INVALID_PARAM, "causal");
    BOTH("window -2", a.params.window_left = -2, FLASHC_ERROR_INVALID_PARAM, "window");
    BOTH("window 16", a.params.window_left = 16, FLASHC_OK, NULL);
    BOTH("window right -3", a.params.window_right = -3, FLASHC_ERROR_INVALID_PARAM,
         "window_right");
    BOTH("softcap negative", a.params.softcap = -1.0f, FLASHC_ERROR_INVALID_PARAM, "softcap");
    BOTH("softcap NaN", a.params.softcap = NAN, FLASHC_ERROR_INVALID_PARAM, "softcap");
    BOTH("softcap inf", a.params.softcap = INFINITY, FLASHC_ERROR_INVALID_PARAM, "softcap");
    BOTH("softcap 30", a.params.softcap = 30.0f, FLASHC_OK, NULL);
    static const float slopes[4] = {0.5f, 0.25f, NAN, 0.125f};
    BOTH("alibi", a.params.alibi_slopes = slopes, FLASHC_OK, NULL);
    BOTH("alibi slope NaN", a.params.alibi_slopes = slopes + 1, FLASHC_ERROR_INVALID_PARAM,
         "alibi_slopes[1]");
    BOTH("alibi misaligned", a.params.alibi_slopes = (const float *)((const char *)slopes + 1),
         FLASHC_ERROR_INVALID_POINTER, "alibi_slopes");
    BOTH("alibi batch stride negative",
         (a.params.alibi_slopes = slopes, a.params.alibi_slopes_batch_stride = -2),
         FLASHC_ERROR_INVALID_PARAM, "alibi_slopes_batch_stride");
    BOTH("alibi batch stride without slopes", a.params.alibi_slopes_batch_stride = 2,
         FLASHC_ERROR_NULL_POINTER, "alibi_slopes");
    static const int32_t cu_q[3] = {0, 1, 4}, cu_k[3] = {0, 2, 5};
#define VARLEN_OK (a.params.cu_seqlens_q = cu_q, a.params.cu_seqlens_k = cu_k, a.params.num_seqs = 2)
    BOTH("varlen", VARLEN_OK, FLASHC_OK, NULL);
    BOTH("varlen max_seqlen given", (VARLEN_OK, a.params.max_seqlen_q = 3, a.params.max_seqlen_k = 9),
         FLASHC_OK, NULL);
    BOTH("varlen without cu_seqlens_k", (a.params.cu_seqlens_q = cu_q, a.params.num_seqs = 2),
         FLASHC_ERROR_NULL_POINTER, "cu_seqlens_k");
    BOTH("varlen without cu_seqlens_q", (a.params.cu_seqlens_k = cu_k, a.params.num_seqs = 2),
         FLASHC_ERROR_NULL_POINTER, "cu_seqlens_q");
    BOTH("varlen num_seqs 0", (VARLEN_OK, a.params.num_seqs = 0), FLASHC_ERROR_INVALID_PARAM,
         "num_seqs");
    BOTH("num_seqs without cu_seqlens", a.params.num_seqs = 2, FLASHC_ERROR_INVALID_PARAM,
         "num_seqs");
    BOTH("max_seqlen without cu_seqlens", a.params.max_seqlen_k = 5, FLASHC_ERROR_INVALID_PARAM,
         "max_seqlen_k");
    BOTH("max_seqlen negative", (VARLEN_OK, a.params.max_seqlen_q = -1),
         FLASHC_ERROR_INVALID_PARAM, "max_seqlen_q");
    BOTH("max_seqlen_q below the longest", (VARLEN_OK, a.params.max_seqlen_q = 2),
         FLASHC_ERROR_INVALID_PARAM, "max_seqlen_q");
    static const int32_t cu_first1[3] = {1, 2, 4}, cu_down[4] = {0, 3, 2, 4},
                         cu_short[3] = {0, 1, 3}, cu_past[3] = {0, 6, 4}, cu_k_short[3] = {0, 2, 4};
    BOTH("cu_seqlens_q not from 0", (VARLEN_OK, a.params.cu_seqlens_q = cu_first1),
         FLASHC_ERROR_INVALID_PARAM, "cu_seqlens_q[0]");
    BOTH("cu_seqlens_q decreasing",
         (VARLEN_OK, a.params.cu_seqlens_q = cu_down, a.params.cu_seqlens_k = cu_down,
          a.params.num_seqs = 3),
         FLASHC_ERROR_INVALID_PARAM, "cu_seqlens_q[2]");
    BOTH("cu_seqlens_q last below the total", (VARLEN_OK, a.params.cu_seqlens_q = cu_short),
         FLASHC_ERROR_INVALID_PARAM, "cu_seqlens_q[num_seqs]");
    BOTH("cu_seqlens_q past the total", (VARLEN_OK, a.params.cu_seqlens_q = cu_past),
         FLASHC_ERROR_INVALID_PARAM, "cu_seqlens_q[1]");
    BOTH("cu_seqlens_k last below the total", (VARLEN_OK, a.params.cu_seqlens_k = cu_k_short),
         FLASHC_ERROR_INVALID_PARAM, "cu_seqlens_k[num_seqs]");
    BOTH("cu_seqlens_k misaligned",
         (VARLEN_OK, a.params.cu_seqlens_k = (const int32_t *)((const char *)cu_k + 2)),
         FLASHC_ERROR_INVALID_POINTER, "cu_seqlens_k");
    BOTH("alibi per sequence with varlen",
         (VARLEN_OK, a.params.alibi_slopes = slopes, a.params.alibi_slopes_batch_stride = 1),
         FLASHC_ERROR_INVALID_PARAM, "alibi_slopes[2]");
    BOTH("dropout 1.5", a.params.dropout_p = 1.5f, FLASHC_ERROR_INVALID_PARAM, "dropout_p");
    BOTH("dropout 1", a.params.dropout_p = 1.0f, FLASHC_ERROR_INVALID_PARAM, "dropout_p");
    BOTH("dropout NaN", a.params.dropout_p = NAN, FLASHC_ERROR_INVALID_PARAM, "dropout_p");
    BOTH("dropout 0.1", a.params.dropout_p = 0.1f, FLASHC_OK, NULL);
    BOTH("all features",
         (VARLEN_OK, a.params.window_left = 1, a.params.causal = FLASHC_CAUSAL_BOTTOM_RIGHT,
          a.params.softcap = 5, a.params.alibi_slopes = slopes, a.params.dropout_p = 0.5f),
         FLASHC_OK, NULL);

    /* a backend that implements none of the features rejects each one, naming it */
    flashc_backend *plain = make_featureless_backend();
    BOTH("no window support", (a.backend = plain, a.params.window_right = 0),
         FLASHC_ERROR_UNSUPPORTED, "window");
    BOTH("no softcap support", (a.backend = plain, a.params.softcap = 1), FLASHC_ERROR_UNSUPPORTED,
         "softcap");
    BOTH("no alibi support", (a.backend = plain, a.params.alibi_slopes = slopes),
         FLASHC_ERROR_UNSUPPORTED, "alibi_slopes");
    BOTH("no varlen support", (a.backend = plain, VARLEN_OK), FLASHC_ERROR_UNSUPPORTED,
         "cu_seqlens");
    BOTH("no dropout support", (a.backend = plain, a.params.dropout_p = 0.1f),
         FLASHC_ERROR_UNSUPPORTED, "dropout_p");
    BOTH("no support, plain call", a.backend = plain, FLASHC_OK, NULL);
    destroy_featureless_backend(plain);

    /* a varlen batch is packed into batch 1 */
    {
        flashc_params p;
        flashc_params_init(&p);
        p.cu_seqlens_q = cu_q;
        p.cu_seqlens_k = cu_k;
        p.num_seqs = 2;
        flashc_tensor q2 = tq.t, k2 = tk.t;
        q2.shape[0] = k2.shape[0] = 2;
        q2.stride[0] = k2.stride[0] = 0;
        size_t bytes = 0;
        flashc_status st = flashc_backward_workspace_size(be, &p, &q2, &k2, &bytes);
        CHECK(st == FLASHC_ERROR_SHAPE_MISMATCH && strstr(flashc_last_error(), "batch"),
              "varlen with batch 2: %s (%s)", flashc_status_string(st), flashc_last_error());
        st = flashc_backward_workspace_size(be, &p, &tq.t, &tk.t, &bytes);
        CHECK(st == FLASHC_OK, "varlen workspace query: %s", flashc_last_error());
    }
#undef VARLEN_OK
    BOTH("workspace NULL with a size", a.params.workspace_size = 64, FLASHC_ERROR_NULL_POINTER,
         "workspace");
    BWD("workspace overlaps q", (a.params.workspace = tq.buffer, a.params.workspace_size = 4096),
        FLASHC_ERROR_ALIASING, "workspace");
    char small[8];
    BWD("workspace too small", (a.params.workspace = small, a.params.workspace_size = 8),
        FLASHC_ERROR_WORKSPACE_TOO_SMALL, "workspace_size");

    /* a newer caller's longer struct: accepted when the unknown tail is zero */
    struct {
        flashc_params p;
        uint64_t future_field;
    } longer;
    memset(&longer, 0, sizeof longer);
    flashc_params_init(&longer.p);
    longer.p.struct_size = sizeof longer;
    FWD("longer params, zero tail", a.paramsp = &longer.p; (void)0, FLASHC_OK, NULL);
    longer.future_field = 1;
    FWD("longer params, unknown field set", a.paramsp = &longer.p; (void)0,
        FLASHC_ERROR_UNSUPPORTED, "struct_size");
    /* initializing an older caller's shorter struct writes no byte past it */
    unsigned char raw[sizeof(flashc_params) + 16];
    memset(raw, 0xab, sizeof raw);
    flashc_params_init_sized((flashc_params *)(void *)raw, 24);
    size_t recorded;
    memcpy(&recorded, raw, sizeof recorded);
    int tail_intact = 1;
    for (size_t i = 24; i < sizeof raw; i++)
        tail_intact &= raw[i] == 0xab;
    CHECK(recorded == 24 && tail_intact, "params_init_sized(24) wrote past 24 bytes");
    /* and a newer caller's longer one gets a zeroed tail and its own struct_size */
    memset(raw, 0xab, sizeof raw);
    flashc_params_init_sized((flashc_params *)(void *)raw, sizeof raw);
    memcpy(&recorded, raw, sizeof recorded);
    int tail_zero = 1;
    for (size_t i = sizeof(flashc_params); i < sizeof raw; i++)
        tail_zero &= raw[i] == 0;
    CHECK(recorded == sizeof raw && tail_zero, "params_init_sized(longer): tail not zeroed");
    /* an older caller's shorter struct: the missing fields keep their defaults */
    flashc_params older;
    flashc_params_init(&older);
    older.struct_size = offsetof(flashc_params, window_left);
    older.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    older.window_left = 12345; /* beyond struct_size: must be ignored */
    FWD("shorter params", a.paramsp = &older; (void)0, FLASHC_OK, NULL);
}

/* dq, dk and dv interleaved in one packed [b, s, 3, h, d] buffer (FlashAttention's qkvpacked
 * layout): their byte ranges meet but no element is shared, so the backward must accept
 * them and write what it writes into separate buffers. */
static void packed_gradients(void)
{
    enum { N = 5, H = 2, D = 8 };
    test_rng rng;
    rng_seed(&rng, 21);
    test_tensor q = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    test_tensor k = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    test_tensor v = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    test_tensor dout = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    test_tensor o = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    test_tensor lse = tt_alloc_lse(1, H, N, 0);
    test_tensor g[3];
    tt_fill_normal(&q, &rng, 1);
    tt_fill_normal(&k, &rng, 1);
    tt_fill_normal(&v, &rng, 1);
    tt_fill_normal(&dout, &rng, 1);
    for (int i = 0; i < 3; i++)
        g[i] = tt_alloc(FLASHC_F32, 1, N, H, D, LAYOUT_BSHD);
    CHECK(flashc_forward(be, NULL, &q.t, &k.t, &v.t, &o.t, &lse.t) == FLASHC_OK, "packed: fwd");
    CHECK(flashc_backward(be, NULL, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t, &g[0].t, &g[1].t,
                          &g[2].t) == FLASHC_OK, "packed: separate backward");
    float *packed = calloc(N * 3 * H * D, sizeof(float));
    flashc_tensor views[3];
    for (int i = 0; i < 3; i++) {
        views[i] = flashc_tensor_contiguous(packed + i * H * D, FLASHC_F32, 1, N, H, D);
        views[i].stride[1] = 3 * H * D;
        views[i].stride[0] = N * 3 * H * D;
    }
    flashc_status st = flashc_backward(be, NULL, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t,
                                       &views[0], &views[1], &views[2]);
    CHECK(st == FLASHC_OK, "packed dq/dk/dv rejected: %s", flashc_last_error());
    int same = 1;
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < N; s++)
            same &= memcmp(packed + (s * 3 + i) * H * D,
                           (float *)g[i].buffer + s * H * D, H * D * sizeof(float)) == 0;
    CHECK(same, "packed gradients differ from separately written ones");
    /* shifted by one element, dk's heads run into dv's: that must still be refused */
    views[1].data = packed + H * D + 1;
    views[2].data = packed + 2 * H * D;
    views[1].shape[3] = views[2].shape[3] = D;
    st = flashc_backward(be, NULL, &dout.t, &q.t, &k.t, &v.t, &o.t, &lse.t, &views[0], &views[1],
                         &views[2]);
    CHECK(st == FLASHC_ERROR_ALIASING, "overlapping packed views accepted: %s",
          flashc_status_string(st));
    free(packed);
    test_tensor *all[] = {&q, &k, &v, &dout, &o, &lse, &g[0], &g[1], &g[2]};
    for (int i = 0; i < 9; i++)
        tt_free(all[i]);
}

static void backend_errors(void)
{
    flashc_backend *b = (flashc_backend *)1;
    flashc_status st = flashc_backend_create("tpu", NULL, &b);
    CHECK(st == FLASHC_ERROR_BACKEND_UNAVAILABLE && b == NULL, "unknown backend: %s",
          flashc_status_string(st));
    CHECK(strstr(flashc_last_error(), "tpu") != NULL, "unknown backend message: %s",
          flashc_last_error());
    if (!flashc_backend_available("cuda")) {
        st = flashc_backend_create("cuda", NULL, &b);
        CHECK(st == FLASHC_ERROR_BACKEND_UNAVAILABLE && b == NULL, "cuda without a device: %s",
              flashc_status_string(st));
        CHECK(strstr(flashc_last_error(), "cuda") != NULL, "cuda message: %s",
              flashc_last_error());
    }
    st = flashc_backend_create("cpu", NULL, NULL);
    CHECK(st == FLASHC_ERROR_NULL_POINTER && strstr(flashc_last_error(), "out"),
          "NULL out: %s", flashc_status_string(st));
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = -1;
    st = flashc_backend_create("cpu", &cfg, &b);
    CHECK(st == FLASHC_ERROR_INVALID_PARAM && strstr(flashc_last_error(), "num_threads"),
          "negative threads: %s", flashc_status_string(st));
    flashc_backend_config_init(&cfg);
    cfg.cpu_isa = "quantum";
    st = flashc_backend_create("cpu", &cfg, &b);
    CHECK(st == FLASHC_ERROR_BACKEND_UNAVAILABLE && strstr(flashc_last_error(), "quantum"),
          "unknown ISA: %s", flashc_status_string(st));
    flashc_backend_config_init(&cfg);
    cfg.struct_size = 0;
    st = flashc_backend_create("cpu", &cfg, &b);
    CHECK(st == FLASHC_ERROR_INVALID_PARAM && strstr(flashc_last_error(), "struct_size"),
          "config struct_size 0: %s", flashc_status_string(st));

    size_t bytes = 0;
    flashc_params p;
    flashc_params_init(&p);
    st = flashc_backward_workspace_size(be, &p, &tq.t, &tk.t, NULL);
    CHECK(st == FLASHC_ERROR_NULL_POINTER && strstr(flashc_last_error(), "bytes"),
          "workspace query NULL: %s", flashc_status_string(st));
    flashc_tensor badk = tk.t;
    badk.shape[3] = 3;
    st = flashc_backward_workspace_size(be, &p, &tq.t, &badk, &bytes);
    CHECK(st == FLASHC_ERROR_SHAPE_MISMATCH, "workspace query bad k: %s",
          flashc_status_string(st));
    st = flashc_backward_workspace_size(be, &p, &tq.t, &tk.t, &bytes);
    CHECK(st == FLASHC_OK && bytes > 0, "workspace query: %s", flashc_status_string(st));

    CHECK(strncmp(flashc_status_string(FLASHC_ERROR_ALIASING), "FLASHC_ERROR_ALIASING", 21) == 0,
          "status string");
    CHECK(strstr(flashc_status_string((flashc_status)12345), "UNKNOWN") != NULL,
          "unknown status string");
    void *ptr = (void *)1;
    st = flashc_backend_malloc(NULL, 16, &ptr);
    CHECK(st == FLASHC_ERROR_NULL_POINTER && ptr == NULL, "malloc NULL backend");
    st = flashc_backend_memcpy(be, NULL, &bytes, 8, FLASHC_COPY_TO_HOST);
    CHECK(st == FLASHC_ERROR_NULL_POINTER && strstr(flashc_last_error(), "dst"), "memcpy NULL");
    st = flashc_backend_memcpy(be, &ptr, &bytes, 8, (flashc_copy_kind)9);
    CHECK(st == FLASHC_ERROR_INVALID_PARAM && strstr(flashc_last_error(), "kind"), "memcpy kind");
}

int main(void)
{
    CHECK(flashc_backend_create("cpu", NULL, &be) == FLASHC_OK, "cpu backend");
    /* batch 1, q 4 rows, k 5 rows, 2 query heads sharing 1 kv head, head dim 8 */
    tq = tt_alloc(FLASHC_F32, 1, 4, 2, 8, LAYOUT_BSHD);
    tk = tt_alloc(FLASHC_F32, 1, 5, 1, 8, LAYOUT_BSHD);
    tv = tt_alloc(FLASHC_F32, 1, 5, 1, 8, LAYOUT_BSHD);
    tdo = tt_alloc(FLASHC_F32, 1, 4, 2, 8, LAYOUT_BSHD);
    to = tt_alloc(FLASHC_F32, 1, 4, 2, 8, LAYOUT_BSHD);
    tlse = tt_alloc_lse(1, 2, 4, 0);
    tdq = tt_alloc(FLASHC_F32, 1, 4, 2, 8, LAYOUT_BSHD);
    tdk = tt_alloc(FLASHC_F32, 1, 5, 1, 8, LAYOUT_BSHD);
    tdv = tt_alloc(FLASHC_F32, 1, 5, 1, 8, LAYOUT_BSHD);
    test_rng rng;
    rng_seed(&rng, 3);
    tt_fill_normal(&tq, &rng, 1);
    tt_fill_normal(&tk, &rng, 1);
    tt_fill_normal(&tv, &rng, 1);
    tt_fill_normal(&tdo, &rng, 1);
    tt_fill_normal(&to, &rng, 1);
    tt_fill_normal(&tlse, &rng, 1);

    tensor_errors();
    param_errors();
    packed_gradients();
    backend_errors();

    flashc_backend_destroy(be);
    test_tensor *all[] = {&tq, &tk, &tv, &tdo, &to, &tlse, &tdq, &tdk, &tdv};
    for (int i = 0; i < 9; i++)
        tt_free(all[i]);
    return test_finish("test_validation");
}
