/*
 * bench_ring_mpi.c - times ring attention over MPI: forward and backward of one sequence
 * split over the ranks, median of a few runs, with the attention FLOP count of the whole
 * sequence (4*B*H*N*N*D forward, x2.5 backward, x0.5 causal) over the wall time of the
 * slowest rank. Rank 0 prints one table row.
 *
 *     mpirun -np 4 ./bench_ring_mpi --seqlen 8192 --heads 8 --kv-heads 2 --dim 64 --causal
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashc_ring.h"
#include "dtype.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int64_t N = 4096, B = 1, H = 8, Hkv = 8, D = 64;
    int causal = 0, reps = 3;
    flashc_dtype dt = FLASHC_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seqlen") && i + 1 < argc) N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) Hkv = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) D = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--causal")) causal = 1;
        else if (!strcmp(argv[i], "--bf16")) dt = FLASHC_BF16;
        else {
            if (rank == 0)
                fprintf(stderr, "usage: bench_ring_mpi [--seqlen N] [--batch B] [--heads H] "
                                "[--kv-heads H] [--dim D] [--reps R] [--causal] [--bf16]\n");
            MPI_Finalize();
            return 2;
        }
    }
    flashc_backend *be;
    if (flashc_backend_create("cpu", NULL, &be) != FLASHC_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* this rank's rows: the zig-zag split (which also serves the non-causal case) */
    int64_t st[2], len[2];
    flashc_ring_zigzag_rows(N, world, rank, st, len);
    int64_t n = len[0] + len[1];
    size_t esz = flashc_dtype_size(dt), nq = (size_t)(B * n * H * D), nk = (size_t)(B * n * Hkv * D);
    void *buf[8];
    size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    uint64_t s = 12345 + (uint64_t)rank;
    for (int i = 0; i < 8; i++) {
        buf[i] = malloc(sizes[i] * esz);
        for (size_t j = 0; j < sizes[i]; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            flashc_store(buf[i], dt, (int64_t)j, (float)((double)(s >> 40) / 16777216.0 - 0.5));
        }
    }
    float *lse = malloc((size_t)(B * H * n) * sizeof(float));
    flashc_tensor q = flashc_tensor_contiguous(buf[0], dt, B, n, H, D);
    flashc_tensor k = flashc_tensor_contiguous(buf[1], dt, B, n, Hkv, D);
    flashc_tensor v = flashc_tensor_contiguous(buf[2], dt, B, n, Hkv, D);
    flashc_tensor o = flashc_tensor_contiguous(buf[3], dt, B, n, H, D);
    flashc_tensor dO = flashc_tensor_contiguous(buf[4], dt, B, n, H, D);
    flashc_tensor dq = flashc_tensor_contiguous(buf[5], dt, B, n, H, D);
    flashc_tensor dk = flashc_tensor_contiguous(buf[6], dt, B, n, Hkv, D);
    flashc_tensor dv = flashc_tensor_contiguous(buf[7], dt, B, n, Hkv, D);
    flashc_tensor l = flashc_lse_contiguous(lse, B, H, n);
    flashc_params p;
    flashc_params_init(&p);
    p.causal = causal ? FLASHC_CAUSAL_BOTTOM_RIGHT : FLASHC_CAUSAL_NONE;

    double *tf = malloc((size_t)reps * sizeof(double)), *tb = malloc((size_t)reps * sizeof(double));
    int ok = 1;
    for (int r = 0; r <= reps; r++) { /* run 0 warms up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        ok &= flashc_ring_forward_mpi(MPI_COMM_WORLD, be, &p, N, &q, &k, &v, &o, &l) == FLASHC_OK;
        double t1 = MPI_Wtime(), t1max, t0min;
        ok &= flashc_ring_backward_mpi(MPI_COMM_WORLD, be, &p, N, &dO, &q, &k, &v, &o, &l, &dq,
                                       &dk, &dv) == FLASHC_OK;
        double t2 = MPI_Wtime(), t2max;
        MPI_Allreduce(&t0, &t0min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&t1, &t1max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&t2, &t2max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r > 0) {
            tf[r - 1] = t1max - t0min;
            tb[r - 1] = t2max - t1max;
        }
    }
    if (!ok)
        fprintf(stderr, "rank %d: %s\n", rank, flashc_ring_last_error());
    qsort(tf, (size_t)reps, sizeof *tf, cmp_double);
    qsort(tb, (size_t)reps, sizeof *tb, cmp_double);
    double flops = 4.0 * (double)B * (double)H * (double)N * (double)N * (double)D * (causal ? 0.5 : 1.0);
    if (rank == 0)
        printf("| %d | %s | %lld | %lld | %lld/%lld | %lld | %d | %.3f | %.2f | %.3f | %.2f |%s\n",
               world, dt == FLASHC_F32 ? "f32" : "bf16", (long long)N, (long long)B, (long long)H,
               (long long)Hkv, (long long)D, causal, tf[reps / 2], flops / tf[reps / 2] * 1e-9,
               tb[reps / 2], 2.5 * flops / tb[reps / 2] * 1e-9, ok ? "" : " FAILED");
    for (int i = 0; i < 8; i++)
        free(buf[i]);
    free(lse);
    free(tf);
    free(tb);
    flashc_backend_destroy(be);
    MPI_Finalize();
    return ok ? 0 : 1;
}
