/*
 * test_ring_mpi.c - ring attention over MPI against the single-process result. Run under
 * mpirun with any number of ranks: every rank builds the same full problem from one seed,
 * computes flashc_forward / flashc_backward on the whole sequence, then runs the ring on
 * its own rows (the zig-zag split when causal, a deliberately uneven split when not) and
 * compares its rows of O, LSE, dQ, dK, dV. Errors are summed over the ranks, so rank 0
 * reports the global relative error. Then bad arguments on one rank: every rank must
 * return an error (none left waiting).
 *
 *     mpirun --oversubscribe -np 4 ./test_ring_mpi
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashc_ring.h"
#include "dtype.h"

static int rank, world, failures, checks;
static flashc_backend *be;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        checks++;                                                                            \
        if (!(cond)) {                                                                       \
            failures++;                                                                      \
            fprintf(stderr, "rank %d FAIL %s:%d: ", rank, __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

static uint64_t rng_state;
static double normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        u[i] = ((double)((z ^ (z >> 31)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

typedef struct ring_case {
    flashc_dtype dtype;
    int64_t batch, seqlen, heads_q, heads_kv, head_dim;
    int causal;
    int bhsd; /* local tensors as views of [batch, heads, seqlen, dim] buffers */
} ring_case;

/* A full contiguous [B, N, H, D] array of the dtype. */
static void *random_full(const ring_case *c, int64_t heads)
{
    size_t n = (size_t)(c->batch * c->seqlen * heads * c->head_dim);
    void *a = malloc(n * flashc_dtype_size(c->dtype));
    for (size_t i = 0; i < n; i++)
        flashc_store(a, c->dtype, (int64_t)i, (float)normal());
    return a;
}

/* This rank's global rows, in local order. */
static int64_t local_rows(const ring_case *c, int64_t *rows)
{
    int64_t n = 0;
    if (c->causal) {
        int64_t st[2], len[2];
        flashc_ring_zigzag_rows(c->seqlen, world, rank, st, len);
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < len[i]; j++)
                rows[n++] = st[i] + j;
    } else { /* uneven: rank r gets about (r + 1) shares of 1 + 2 + ... + world */
        int64_t shares = (int64_t)world * (world + 1) / 2, before = (int64_t)rank * (rank + 1) / 2;
        int64_t a = c->seqlen * before / shares, b = c->seqlen * (before + rank + 1) / shares;
        for (int64_t j = a; j < b; j++)
            rows[n++] = j;
    }
    return n;
}

/* A local [B, n, H, D] tensor (contiguous or a BHSD view) in a fresh buffer. */
static flashc_tensor local_tensor(const ring_case *c, flashc_dtype dt, int64_t n, int64_t heads)
{
    void *buf = calloc((size_t)(c->batch * n * heads * c->head_dim), flashc_dtype_size(dt));
    return c->bhsd ? flashc_tensor_bhsd(buf, dt, c->batch, heads, n, c->head_dim)
                   : flashc_tensor_contiguous(buf, dt, c->batch, n, heads, c->head_dim);
}

/* Copies the local rows of a full contiguous array into a local view. */
static void gather(flashc_tensor *dst, const void *full, const ring_case *c, const int64_t *rows)
{
    const int64_t H = dst->shape[2], D = dst->shape[3], esz = (int64_t)flashc_dtype_size(dst->dtype);
    for (int64_t b = 0; b < dst->shape[0]; b++)
        for (int64_t s = 0; s < dst->shape[1]; s++)
            for (int64_t h = 0; h < H; h++)
                memcpy(flashc_row_ptr(dst, b, s, h),
                       (const char *)full + (((b * c->seqlen + rows[s]) * H + h) * D) * esz,
                       (size_t)(D * esz));
}

/* Sums of squared differences and of squared reference values over this rank's rows,
 * reduced over the ranks: the global relative error. */
static double rel_error(const flashc_tensor *x, const void *full, flashc_dtype full_dt,
                        const ring_case *c, const int64_t *rows)
{
    const int64_t H = x->shape[2], D = x->shape[3];
    double sums[2] = {0, 0}, tot[2];
    for (int64_t b = 0; b < x->shape[0]; b++)
        for (int64_t s = 0; s < x->shape[1]; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    double got = flashc_load(flashc_row_ptr(x, b, s, h), x->dtype, d);
                    double want =
                        flashc_load(full, full_dt, ((b * c->seqlen + rows[s]) * H + h) * D + d);
                    if (!isfinite(got))
                        sums[0] = INFINITY;
                    sums[0] += (got - want) * (got - want);
                    sums[1] += want * want;
                }
    MPI_Allreduce(sums, tot, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return tot[1] > 0 ? sqrt(tot[0] / tot[1]) : sqrt(tot[0]);
}

static double lse_error(const flashc_tensor *l, const float *full, const ring_case *c,
                        const int64_t *rows)
{
    double m = 0, all;
    for (int64_t b = 0; b < l->shape[0]; b++)
        for (int64_t h = 0; h < l->shape[1]; h++)
            for (int64_t s = 0; s < l->shape[2]; s++) {
                double got = *flashc_lse_ptr(l, b, h, s);
                double want = full[(b * c->heads_q + h) * c->seqlen + rows[s]];
                double e = fabs(got - want) / (fabs(want) > 1 ? fabs(want) : 1);
                if (!(e <= m))
                    m = isnan(e) ? INFINITY : e;
            }
    MPI_Allreduce(&m, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

static double worst[5];

static void run_case(const ring_case *c, uint64_t seed)
{
    rng_state = seed;
    const int64_t B = c->batch, N = c->seqlen, Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim;
    const flashc_dtype dt = c->dtype;
    void *q = random_full(c, Hq), *k = random_full(c, Hkv), *v = random_full(c, Hkv);
    void *dout = random_full(c, Hq);
    size_t esz = flashc_dtype_size(dt);
    void *o = malloc((size_t)(B * N * Hq * D) * esz), *dq = malloc((size_t)(B * N * Hq * D) * esz);
    void *dk = malloc((size_t)(B * N * Hkv * D) * esz), *dv = malloc((size_t)(B * N * Hkv * D) * esz);
    float *lse = malloc((size_t)(B * Hq * N) * sizeof(float));

    /* the single-process result */
    flashc_params p;
    flashc_params_init(&p);
    p.causal = c->causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;
    flashc_tensor tq = flashc_tensor_contiguous(q, dt, B, N, Hq, D);
    flashc_tensor tk = flashc_tensor_contiguous(k, dt, B, N, Hkv, D);
    flashc_tensor tv = flashc_tensor_contiguous(v, dt, B, N, Hkv, D);
    flashc_tensor to = flashc_tensor_contiguous(o, dt, B, N, Hq, D);
    flashc_tensor tdo = flashc_tensor_contiguous(dout, dt, B, N, Hq, D);
    flashc_tensor tdq = flashc_tensor_contiguous(dq, dt, B, N, Hq, D);
    flashc_tensor tdk = flashc_tensor_contiguous(dk, dt, B, N, Hkv, D);
    flashc_tensor tdv = flashc_tensor_contiguous(dv, dt, B, N, Hkv, D);
    flashc_tensor tl = flashc_lse_contiguous(lse, B, Hq, N);
    CHECK(flashc_forward(be, &p, &tq, &tk, &tv, &to, &tl) == FLASHC_OK, "full forward: %s",
          flashc_last_error());
    CHECK(flashc_backward(be, &p, &tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv) == FLASHC_OK,
          "full backward: %s", flashc_last_error());

    /* the ring on this rank's rows */
    int64_t *rows = malloc((size_t)N * sizeof *rows);
    int64_t n = local_rows(c, rows);
    flashc_tensor lq = local_tensor(c, dt, n, Hq), lk = local_tensor(c, dt, n, Hkv);
    flashc_tensor lv = local_tensor(c, dt, n, Hkv), ldo = local_tensor(c, dt, n, Hq);
    flashc_tensor lo = local_tensor(c, dt, n, Hq), ldq = local_tensor(c, dt, n, Hq);
    flashc_tensor ldk = local_tensor(c, dt, n, Hkv), ldv = local_tensor(c, dt, n, Hkv);
    flashc_tensor ll = flashc_lse_contiguous(calloc((size_t)(B * Hq * n), sizeof(float)), B, Hq, n);
    gather(&lq, q, c, rows);
    gather(&lk, k, c, rows);
    gather(&lv, v, c, rows);
    gather(&ldo, dout, c, rows);
    flashc_status st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N, &lq, &lk, &lv, &lo, &ll);
    CHECK(st == FLASHC_OK, "ring forward: %s", flashc_ring_last_error());
    st = flashc_ring_backward_mpi(MPI_COMM_WORLD, be, &p, N, &ldo, &lq, &lk, &lv, &lo, &ll, &ldq,
                                  &ldk, &ldv);
    CHECK(st == FLASHC_OK, "ring backward: %s", flashc_ring_last_error());

    double e[5] = {rel_error(&lo, o, dt, c, rows), lse_error(&ll, lse, c, rows),
                   rel_error(&ldq, dq, dt, c, rows), rel_error(&ldk, dk, dt, c, rows),
                   rel_error(&ldv, dv, dt, c, rows)};
    /* fp32: the same sums in another order; fp16/bf16: each block's result is rounded to
     * the dtype before the merge, the single-process one once */
    double tol = dt == FLASHC_F32 ? 1e-5 : dt == FLASHC_F16 ? 1e-3 : 1e-2;
    const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    for (int i = 0; i < 5; i++) {
        CHECK(e[i] <= (i == 1 ? 1e-5 : tol),
              "%s N=%lld h%lld/%lld d%lld causal=%d b%lld: %s rel err %.3g vs single process",
              dt == FLASHC_F32 ? "f32" : dt == FLASHC_F16 ? "f16" : "bf16", (long long)N,
              (long long)Hq, (long long)Hkv, (long long)D, c->causal, (long long)B, names[i],
              e[i]);
        if (dt == FLASHC_F32 && e[i] > worst[i])
            worst[i] = e[i];
    }
    if (rank == 0)
        printf("  %-4s N=%-4lld h%lld/%lld d%-3lld causal=%d %s  O %.1e LSE %.1e dQ %.1e dK %.1e "
               "dV %.1e\n",
               dt == FLASHC_F32 ? "f32" : dt == FLASHC_F16 ? "f16" : "bf16", (long long)N,
               (long long)Hq, (long long)Hkv, (long long)D, c->causal, c->bhsd ? "bhsd" : "bshd",
               e[0], e[1], e[2], e[3], e[4]);

    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, rows, lq.data, lk.data, lv.data, ldo.data,
                    lo.data, ldq.data, ldk.data, ldv.data, ll.data};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* Bad arguments on one rank: every rank gets an error, and the named rank its own message. */
static void test_errors(void)
{
    enum { N = 24, H = 2, D = 16 };
    ring_case c = {FLASHC_F32, 1, N, H, H, D, 1, 0};
    int64_t rows[N];
    int64_t n = local_rows(&c, rows);
    float *buf = calloc((size_t)(6 * n * H * D + H * n), sizeof(float));
    flashc_tensor q = flashc_tensor_contiguous(buf, FLASHC_F32, 1, n, H, D);
    flashc_tensor k = flashc_tensor_contiguous(buf + n * H * D, FLASHC_F32, 1, n, H, D);
    flashc_tensor v = flashc_tensor_contiguous(buf + 2 * n * H * D, FLASHC_F32, 1, n, H, D);
    flashc_tensor o = flashc_tensor_contiguous(buf + 3 * n * H * D, FLASHC_F32, 1, n, H, D);
    flashc_tensor l = flashc_lse_contiguous(buf + 6 * n * H * D, 1, H, n);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = FLASHC_CAUSAL_BOTTOM_RIGHT;
    const int bad = world - 1;

    /* a shape error on the last rank */
    flashc_tensor kb = k;
    if (rank == bad)
        kb.shape[3] = D / 2;
    flashc_status st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N, &q, &kb, &v, &o, &l);
    CHECK(st == FLASHC_ERROR_SHAPE_MISMATCH, "bad k on rank %d: got %s (%s)", bad,
          flashc_status_string(st), flashc_ring_last_error());
    if (rank == bad)
        CHECK(strstr(flashc_ring_last_error(), "k: shape[3] (head_dim)") != NULL, "message '%s'",
              flashc_ring_last_error());
    else
        CHECK(strstr(flashc_ring_last_error(), "rejected its arguments") != NULL, "message '%s'",
              flashc_ring_last_error());

    /* ranks that disagree on the sequence length */
    st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, rank == bad && world > 1 ? N + 1 : N, &q,
                                 &k, &v, &o, &l);
    if (world > 1)
        CHECK(st == FLASHC_ERROR_SHAPE_MISMATCH && strstr(flashc_ring_last_error(), "seqlen"),
              "disagreeing seqlen: %s (%s)", flashc_status_string(st), flashc_ring_last_error());

    /* not the zig-zag rows */
    st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N + 2 * world, &q, &k, &v, &o, &l);
    CHECK(st == FLASHC_ERROR_SHAPE_MISMATCH && strstr(flashc_ring_last_error(), "zig-zag"),
          "wrong rows: %s (%s)", flashc_status_string(st), flashc_ring_last_error());

    /* position-dependent features */
    flashc_params pw = p;
    pw.window_left = 4;
    st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &pw, N, &q, &k, &v, &o, &l);
    CHECK(st == FLASHC_ERROR_UNSUPPORTED, "window: %s", flashc_status_string(st));

    /* out overlapping q */
    flashc_tensor oq = q;
    st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N, &q, &k, &v, &oq, &l);
    CHECK(st == FLASHC_ERROR_ALIASING, "out aliasing q: %s", flashc_status_string(st));

    /* and a valid call still works afterwards: the ranks are in step */
    st = flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N, &q, &k, &v, &o, &l);
    CHECK(st == FLASHC_OK, "valid call after errors: %s", flashc_ring_last_error());
    free(buf);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (flashc_backend_create("cpu", NULL, &be) != FLASHC_OK) {
        fprintf(stderr, "%s\n", flashc_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("ring attention over MPI, %d ranks, against the single-process result:\n", world);
    /* odd lengths that split unevenly; GQA and MQA; a head dim off the SIMD width */
    const ring_case cases[] = {
        {FLASHC_F32, 2, 67, 4, 2, 32, 0, 0},  {FLASHC_F32, 2, 67, 4, 2, 32, 1, 0},
        {FLASHC_F32, 1, 203, 4, 1, 64, 1, 1}, {FLASHC_F32, 1, 203, 2, 2, 40, 0, 1},
        {FLASHC_F32, 1, 130, 3, 3, 16, 1, 0}, {FLASHC_F32, 1, 8, 2, 1, 8, 1, 0},
        {FLASHC_BF16, 1, 157, 4, 2, 64, 1, 0}, {FLASHC_F16, 2, 61, 2, 1, 64, 0, 0},
    };
    uint64_t seed = 7;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].causal && cases[i].seqlen < 2 * world)
            continue;
        if (!cases[i].causal && cases[i].seqlen < (int64_t)world * (world + 1) / 2)
            continue;
        run_case(&cases[i], seed++);
    }
    test_errors();
    if (rank == 0)
        printf("f32 worst rel err: O %.1e LSE %.1e dQ %.1e dK %.1e dV %.1e\n", worst[0], worst[1],
               worst[2], worst[3], worst[4]);
    int total[2], mine[2] = {failures, checks};
    MPI_Allreduce(mine, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_ring_mpi (%d ranks): %d checks, %d failed\n", world, total[1], total[0]);
    flashc_backend_destroy(be);
    MPI_Finalize();
    return total[0] ? 1 : 0;
}
