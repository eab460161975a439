/*
 * test_cpu_determinism.c - the CPU backend gives bitwise the same forward and backward for
 * any thread count, with params.deterministic set, for every micro-kernel set this processor
 * runs. The runs past the first force the backward's one-pass and three-pass schedules in
 * turn, so this also checks that the two agree bit for bit, on shapes with one key chunk and
 * with several.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "../../src/cpu/kernels.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct shape {
    flashc_dtype dtype;
    int64_t b, nq, nk, hq, hkv, d;
    int32_t causal;
} shape;

typedef struct outputs {
    void *o, *dq, *dk, *dv;
    float *lse;
} outputs;

static void *random_buffer(flashc_dtype dt, size_t n, test_rng *r)
{
    size_t es = flashc_dtype_size(dt);
    unsigned char *p = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float x = (float)rng_normal(r);
        if (dt == FLASHC_F32) {
            memcpy(p + i * 4, &x, 4);
        } else {
            uint32_t u;
            memcpy(&u, &x, 4);
            /* bf16 by truncation, fp16 from a small integer grid: any valid bits will do */
            uint16_t h = dt == FLASHC_BF16 ? (uint16_t)(u >> 16)
                                           : (uint16_t)(0x3c00u + (rng_next(r) & 0x3ffu));
            memcpy(p + i * 2, &h, 2);
        }
    }
    return p;
}

static outputs run(const shape *s, int threads, const char *isa, void *q, void *k, void *v,
                   void *dout)
{
    outputs out;
    size_t es = flashc_dtype_size(s->dtype);
    size_t nq = (size_t)(s->b * s->nq * s->hq * s->d), nk = (size_t)(s->b * s->nk * s->hkv * s->d);
    out.o = calloc(nq, es);
    out.dq = calloc(nq, es);
    out.dk = calloc(nk, es);
    out.dv = calloc(nk, es);
    out.lse = calloc((size_t)(s->b * s->hq * s->nq), sizeof(float));
    flashc_backend_config cfg;
    flashc_backend_config_init(&cfg);
    cfg.num_threads = threads;
    cfg.cpu_isa = isa;
    flashc_backend *be = NULL;
    CHECK(flashc_backend_create("cpu", &cfg, &be) == FLASHC_OK, "create: %s", flashc_last_error());
    if (!be)
        return out;
    flashc_tensor tq = flashc_tensor_contiguous(q, s->dtype, s->b, s->nq, s->hq, s->d);
    flashc_tensor tk = flashc_tensor_contiguous(k, s->dtype, s->b, s->nk, s->hkv, s->d);
    flashc_tensor tv = flashc_tensor_contiguous(v, s->dtype, s->b, s->nk, s->hkv, s->d);
    flashc_tensor tdo = flashc_tensor_contiguous(dout, s->dtype, s->b, s->nq, s->hq, s->d);
    flashc_tensor to = flashc_tensor_contiguous(out.o, s->dtype, s->b, s->nq, s->hq, s->d);
    flashc_tensor tdq = flashc_tensor_contiguous(out.dq, s->dtype, s->b, s->nq, s->hq, s->d);
    flashc_tensor tdk = flashc_tensor_contiguous(out.dk, s->dtype, s->b, s->nk, s->hkv, s->d);
    flashc_tensor tdv = flashc_tensor_contiguous(out.dv, s->dtype, s->b, s->nk, s->hkv, s->d);
    flashc_tensor tl = flashc_lse_contiguous(out.lse, s->b, s->hq, s->nq);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = s->causal;
    p.deterministic = 1;
    CHECK(flashc_forward(be, &p, &tq, &tk, &tv, &to, &tl) == FLASHC_OK, "forward: %s",
          flashc_last_error());
    CHECK(flashc_backward(be, &p, &tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv) == FLASHC_OK,
          "backward: %s", flashc_last_error());
    flashc_backend_destroy(be);
    return out;
}

static void free_outputs(outputs *o)
{
    free(o->o), free(o->dq), free(o->dk), free(o->dv), free(o->lse);
}

int main(void)
{
    const shape shapes[] = {
        {FLASHC_F32, 1, 200, 200, 4, 2, 64, FLASHC_CAUSAL_BOTTOM_RIGHT},
        {FLASHC_BF16, 2, 130, 190, 6, 3, 80, FLASHC_CAUSAL_TOP_LEFT},
        {FLASHC_F16, 1, 150, 97, 2, 1, 128, FLASHC_CAUSAL_BOTTOM_RIGHT},
        {FLASHC_F32, 3, 65, 129, 2, 2, 32, FLASHC_CAUSAL_NONE},
        /* ten key blocks in four uneven key chunks, causal and not */
        {FLASHC_BF16, 1, 300, 600, 4, 2, 64, FLASHC_CAUSAL_NONE},
        {FLASHC_F32, 1, 600, 600, 2, 1, 96, FLASHC_CAUSAL_BOTTOM_RIGHT},
        /* a head's packed K/V of 2 MiB: the forward's tasks take two query blocks each, here
         * three blocks (the last task one) */
        {FLASHC_F32, 1, 150, 1024, 2, 1, 256, FLASHC_CAUSAL_BOTTOM_RIGHT},
        {FLASHC_BF16, 1, 150, 2050, 2, 1, 256, FLASHC_CAUSAL_BOTTOM_RIGHT},
    };
    const int thread_counts[] = {1, 2, 3, 5, 8};
    const char *sets[] = TEST_CPU_SETS;
    for (int si = 0; si < COUNT(sets); si++) {
        if (!flashc_cpu_pick_kernels(sets[si]))
            continue;
        int identical = 0, compared = 0;
        for (int c = 0; c < COUNT(shapes); c++) {
            const shape *s = &shapes[c];
            test_rng rng;
            rng_seed(&rng, 77 + (uint64_t)c);
            size_t nq = (size_t)(s->b * s->nq * s->hq * s->d);
            size_t nk = (size_t)(s->b * s->nk * s->hkv * s->d);
            void *q = random_buffer(s->dtype, nq, &rng), *k = random_buffer(s->dtype, nk, &rng);
            void *v = random_buffer(s->dtype, nk, &rng), *dout = random_buffer(s->dtype, nq, &rng);
            size_t es = flashc_dtype_size(s->dtype);
            outputs base = run(s, thread_counts[0], sets[si], q, k, v, dout);
            for (int t = 1; t < COUNT(thread_counts); t++) {
                /* the base takes the schedule the shape picks; the others alternate forced ones */
                setenv("FLASHC_CPU_BACKWARD", t % 2 ? "threepass" : "onepass", 1);
                outputs o = run(s, thread_counts[t], sets[si], q, k, v, dout);
                unsetenv("FLASHC_CPU_BACKWARD");
                int same = memcmp(o.o, base.o, nq * es) == 0 &&
                           memcmp(o.lse, base.lse, (size_t)(s->b * s->hq * s->nq) * 4) == 0 &&
                           memcmp(o.dq, base.dq, nq * es) == 0 &&
                           memcmp(o.dk, base.dk, nk * es) == 0 &&
                           memcmp(o.dv, base.dv, nk * es) == 0;
                CHECK(same, "%s: shape %d differs between 1 and %d threads", sets[si], c,
                      thread_counts[t]);
                identical += same;
                compared++;
                free_outputs(&o);
            }
            free_outputs(&base);
            free(q), free(k), free(v), free(dout);
        }
        printf("  %-8s %d/%d thread-count runs bitwise identical to 1 thread\n", sets[si],
               identical, compared);
    }
    return test_finish("test_cpu_determinism");
}
