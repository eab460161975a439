/*
 * cli_run.c - attention on any backend from host arrays (see cli_run.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "cli_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

flashc_dtype cli_parse_dtype(const char *s)
{
    if (strcmp(s, "f32") == 0 || strcmp(s, "fp32") == 0 || strcmp(s, "float32") == 0)
        return FLASHC_F32;
    if (strcmp(s, "f16") == 0 || strcmp(s, "fp16") == 0 || strcmp(s, "float16") == 0)
        return FLASHC_F16;
    if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0)
        return FLASHC_BF16;
    return (flashc_dtype)0;
}

const char *cli_dtype_name(flashc_dtype d)
{
    return d == FLASHC_F32 ? "f32" : d == FLASHC_F16 ? "f16" : d == FLASHC_BF16 ? "bf16" : "?";
}

size_t cli_q_elems(const cli_problem *p)
{
    return (size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim);
}

size_t cli_k_elems(const cli_problem *p)
{
    return (size_t)(p->batch * p->seqlen_k * p->heads_kv * p->head_dim);
}

double cli_forward_flops(const cli_problem *p)
{
    double f = 4.0 * (double)p->batch * (double)p->heads_q * (double)p->seqlen_q *
               (double)p->seqlen_k * (double)p->head_dim;
    return p->causal ? 0.5 * f : f;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void *cli_random_array(flashc_dtype dtype, size_t n, double std, uint64_t *seed)
{
    void *a = malloc(n * flashc_dtype_size(dtype) + 1);
    if (!a)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        double u1 = ((double)(splitmix(seed) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (double)(splitmix(seed) >> 11) * (1.0 / 9007199254740992.0);
        double x = std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        flashc_store(a, dtype, (int64_t)i, (float)x);
    }
    return a;
}

static flashc_tensor view(const cli_problem *p, void *data, flashc_dtype dtype, int64_t seqlen,
                          int64_t heads)
{
    return p->layout_bhsd ? flashc_tensor_bhsd(data, dtype, p->batch, heads, seqlen, p->head_dim)
                          : flashc_tensor_contiguous(data, dtype, p->batch, seqlen, heads,
                                                     p->head_dim);
}

/* Backend buffers of one run. */
typedef struct run_buffers {
    void *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
} run_buffers;

static void free_buffers(flashc_backend *be, run_buffers *b)
{
    void **all[] = {&b->q, &b->k, &b->v, &b->dout, &b->o, &b->lse, &b->dq, &b->dk, &b->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        flashc_backend_free(be, *all[i]);
        *all[i] = NULL;
    }
}

/* Converts a backend output (dtype, problem layout) to dense float32 [B, S, H, D]. */
static float *to_dense_f32(const cli_problem *p, const void *host, flashc_dtype dtype,
                           int64_t seqlen, int64_t heads)
{
    size_t n = (size_t)(p->batch * seqlen * heads * p->head_dim);
    float *d = malloc(n * sizeof(float));
    if (!d)
        return NULL;
    flashc_tensor t = view(p, (void *)host, dtype, seqlen, heads);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t s = 0; s < seqlen; s++)
            for (int64_t h = 0; h < heads; h++) {
                const void *row = flashc_row_ptr(&t, b, s, h);
                flashc_load_row(d + ((b * seqlen + s) * heads + h) * p->head_dim, row, dtype,
                                p->head_dim);
            }
    return d;
}

static flashc_status fetch(flashc_backend *be, const cli_problem *p, const void *dev,
                           flashc_dtype dtype, int64_t seqlen, int64_t heads, float **dst)
{
    size_t bytes = (size_t)(p->batch * seqlen * heads * p->head_dim) * flashc_dtype_size(dtype);
    void *host = malloc(bytes);
    if (!host)
        return FLASHC_ERROR_OUT_OF_MEMORY;
    flashc_status st = flashc_backend_memcpy(be, host, dev, bytes, FLASHC_COPY_TO_HOST);
    if (st == FLASHC_OK) {
        *dst = to_dense_f32(p, host, dtype, seqlen, heads);
        if (!*dst)
            st = FLASHC_ERROR_OUT_OF_MEMORY;
    }
    free(host);
    return st;
}

#define TRY_RUN(expr)                                                                        \
    do {                                                                                     \
        st = (expr);                                                                         \
        if (st != FLASHC_OK)                                                                 \
            goto done;                                                                       \
    } while (0)

flashc_status cli_run(flashc_backend *be, const cli_problem *p, const cli_inputs *in, int repeat,
                      cli_outputs *out)
{
    memset(out, 0, sizeof *out);
    run_buffers b;
    memset(&b, 0, sizeof b);
    flashc_status st = FLASHC_OK;
    /* the reference backend can keep its float64 results to float32 precision */
    flashc_dtype odt = strcmp(flashc_backend_name(be), "reference") == 0 ? FLASHC_F32 : p->dtype;
    size_t esize = flashc_dtype_size(p->dtype), osize = flashc_dtype_size(odt);
    size_t qn = cli_q_elems(p), kn = cli_k_elems(p);
    size_t lse_bytes = (size_t)(p->batch * p->heads_q * p->seqlen_q) * sizeof(float);
    int backward = in->dout != NULL;

    TRY_RUN(flashc_backend_malloc(be, qn * esize, &b.q));
    TRY_RUN(flashc_backend_malloc(be, kn * esize, &b.k));
    TRY_RUN(flashc_backend_malloc(be, kn * esize, &b.v));
    TRY_RUN(flashc_backend_malloc(be, qn * osize, &b.o));
    TRY_RUN(flashc_backend_malloc(be, lse_bytes, &b.lse));
    TRY_RUN(flashc_backend_memcpy(be, b.q, in->q, qn * esize, FLASHC_COPY_TO_BACKEND));
    TRY_RUN(flashc_backend_memcpy(be, b.k, in->k, kn * esize, FLASHC_COPY_TO_BACKEND));
    TRY_RUN(flashc_backend_memcpy(be, b.v, in->v, kn * esize, FLASHC_COPY_TO_BACKEND));
    if (backward) {
        TRY_RUN(flashc_backend_malloc(be, qn * esize, &b.dout));
        TRY_RUN(flashc_backend_malloc(be, qn * osize, &b.dq));
        TRY_RUN(flashc_backend_malloc(be, kn * osize, &b.dk));
        TRY_RUN(flashc_backend_malloc(be, kn * osize, &b.dv));
        TRY_RUN(flashc_backend_memcpy(be, b.dout, in->dout, qn * esize, FLASHC_COPY_TO_BACKEND));
    }

    flashc_params params;
    flashc_params_init(&params);
    params.causal = p->causal;
    params.softmax_scale = p->scale;
    flashc_tensor q = view(p, b.q, p->dtype, p->seqlen_q, p->heads_q);
    flashc_tensor k = view(p, b.k, p->dtype, p->seqlen_k, p->heads_kv);
    flashc_tensor v = view(p, b.v, p->dtype, p->seqlen_k, p->heads_kv);
    flashc_tensor o = view(p, b.o, odt, p->seqlen_q, p->heads_q);
    flashc_tensor lse = flashc_lse_contiguous(b.lse, p->batch, p->heads_q, p->seqlen_q);
    /* the backward reads O in the inputs' dtype: the reference's float32 O is accepted too */
    flashc_tensor dout = view(p, b.dout, p->dtype, p->seqlen_q, p->heads_q);
    flashc_tensor dq = view(p, b.dq, odt, p->seqlen_q, p->heads_q);
    flashc_tensor dk = view(p, b.dk, odt, p->seqlen_k, p->heads_kv);
    flashc_tensor dv = view(p, b.dv, odt, p->seqlen_k, p->heads_kv);

    out->forward_seconds = out->backward_seconds = INFINITY;
    for (int r = 0; r < (repeat < 1 ? 1 : repeat); r++) {
        double t0 = cli_now();
        TRY_RUN(flashc_forward(be, &params, &q, &k, &v, &o, &lse));
        TRY_RUN(flashc_backend_synchronize(be, NULL));
        double t1 = cli_now();
        if (t1 - t0 < out->forward_seconds)
            out->forward_seconds = t1 - t0;
        if (!backward)
            continue;
        TRY_RUN(flashc_backward(be, &params, &dout, &q, &k, &v, &o, &lse, &dq, &dk, &dv));
        TRY_RUN(flashc_backend_synchronize(be, NULL));
        double t2 = cli_now();
        if (t2 - t1 < out->backward_seconds)
            out->backward_seconds = t2 - t1;
    }

    TRY_RUN(fetch(be, p, b.o, odt, p->seqlen_q, p->heads_q, &out->o));
    out->lse = malloc(lse_bytes);
    if (!out->lse) {
        st = FLASHC_ERROR_OUT_OF_MEMORY;
        goto done;
    }
    TRY_RUN(flashc_backend_memcpy(be, out->lse, b.lse, lse_bytes, FLASHC_COPY_TO_HOST));
    if (backward) {
        TRY_RUN(fetch(be, p, b.dq, odt, p->seqlen_q, p->heads_q, &out->dq));
        TRY_RUN(fetch(be, p, b.dk, odt, p->seqlen_k, p->heads_kv, &out->dk));
        TRY_RUN(fetch(be, p, b.dv, odt, p->seqlen_k, p->heads_kv, &out->dv));
    }
done:
    free_buffers(be, &b);
    if (st != FLASHC_OK)
        cli_outputs_free(out);
    return st;
}

void cli_outputs_free(cli_outputs *out)
{
    free(out->o);
    free(out->lse);
    free(out->dq);
    free(out->dk);
    free(out->dv);
    out->o = out->lse = out->dq = out->dk = out->dv = NULL;
}
