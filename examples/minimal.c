/*
 * minimal.c - the smallest complete flashc program: causal attention forward and backward on
 * the best backend present, with every status checked. Build against an installed flashc:
 *
 *   cc minimal.c $(pkg-config --cflags --libs flashc) -o minimal && ./minimal
 */
#include <flashc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        flashc_status st_ = (call);                                                          \
        if (st_ != FLASHC_OK) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #call, flashc_last_error());                  \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void)
{
    enum { B = 1, N = 256, H = 4, D = 64 };
    const size_t n = (size_t)B * N * H * D;
    flashc_backend *be;
    CHECK(flashc_backend_create("auto", NULL, &be));

    /* host data, copied into the backend's memory (a no-op copy on the CPU) */
    float *host = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    flashc_dtype dt = flashc_backend_uses_device_memory(be) ? FLASHC_BF16 : FLASHC_F32;
    size_t bytes = n * flashc_dtype_size(dt);
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *lse;
    void **bufs[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++)
        CHECK(flashc_backend_malloc(be, bytes, bufs[i]));
    CHECK(flashc_backend_malloc(be, (size_t)B * H * N * sizeof(float), &lse));
    if (dt == FLASHC_BF16) /* bf16 is the top half of a float32: truncate in place */
        for (size_t i = 0; i < n; i++) {
            unsigned int bits;
            memcpy(&bits, &host[i], 4);
            ((unsigned short *)host)[i] = (unsigned short)(bits >> 16);
        }
    for (int i = 0; i < 5; i++)
        CHECK(flashc_backend_memcpy(be, *bufs[i], host, bytes, FLASHC_COPY_TO_BACKEND));

    flashc_tensor tq = flashc_tensor_contiguous(q, dt, B, N, H, D);
    flashc_tensor tk = flashc_tensor_contiguous(k, dt, B, N, H, D);
    flashc_tensor tv = flashc_tensor_contiguous(v, dt, B, N, H, D);
    flashc_tensor to = flashc_tensor_contiguous(o, dt, B, N, H, D);
    flashc_tensor tdo = flashc_tensor_contiguous(dout, dt, B, N, H, D);
    flashc_tensor tdq = flashc_tensor_contiguous(dq, dt, B, N, H, D);
    flashc_tensor tdk = flashc_tensor_contiguous(dk, dt, B, N, H, D);
    flashc_tensor tdv = flashc_tensor_contiguous(dv, dt, B, N, H, D);
    flashc_tensor tlse = flashc_lse_contiguous(lse, B, H, N);

    flashc_params p;
    flashc_params_init(&p);
    p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    CHECK(flashc_forward(be, &p, &tq, &tk, &tv, &to, &tlse));
    CHECK(flashc_backward(be, &p, &tdo, &tq, &tk, &tv, &to, &tlse, &tdq, &tdk, &tdv));
    CHECK(flashc_backend_synchronize(be, NULL));

    float first_lse;
    CHECK(flashc_backend_memcpy(be, &first_lse, lse, sizeof first_lse, FLASHC_COPY_TO_HOST));
    printf("flashc %s on %s: LSE of the first query %.4f (one visible key: its score)\n",
           flashc_version(), flashc_backend_name(be), first_lse);
    for (int i = 0; i < 8; i++)
        flashc_backend_free(be, *bufs[i]);
    flashc_backend_free(be, lse);
    free(host);
    flashc_backend_destroy(be);
    return 0;
}
