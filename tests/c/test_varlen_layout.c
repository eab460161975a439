/*
 * test_varlen_layout.c - the CUDA backward's workspace layouts for varlen batches
 * (src/cuda/varlen.cuh), checked on the host. The kernels place each sequence's rows by these
 * formulas alone (nothing records the layout), so if one sequence's query blocks, padded to
 * the block height, reached the next sequence's first row, the two would share LSE, delta and
 * dQ accumulator rows. For random batches (empty and one-row sequences among them, up to
 * thousands of sequences), every padded sequence must end at or before the next one's start
 * and inside the rows the layout reserves per head, and every start must keep the fp32 rows
 * 16-byte aligned for the bulk copies: 64- and 128-row blocks on the layout of
 * fc_varlen_ws_start (starts at multiples of 128), 80-row blocks on fc_varlen_ws_start80
 * (multiples of 4).
 */
#include <stdint.h>
#include <stdio.h>

/* the header's device qualifiers, as plain host functions */
#define __device__
#define __forceinline__ inline
#include "cuda/varlen.cuh"

#define MAX_SEQS 4096

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* A sequence length: a third empty or one row, a third short, a third up to 5000. */
static int draw_length(void)
{
    const uint32_t kind = rng() % 3;
    if (kind == 0) return (int)(rng() % 2);
    if (kind == 1) return 2 + (int)(rng() % 200);
    return (int)(rng() % 5001);
}

static int failures = 0;

static void fail(const char *layout, int bm, int b, int num_seqs, const char *what, long long a, long long c)
{
    if (failures++ < 10)
        fprintf(stderr, "FAIL %s layout, %d-row blocks, sequence %d of %d: %s (%lld, %lld)\n", layout, bm, b,
                num_seqs, what, a, c);
}

/* Checks one batch of lengths len[0..n) on one layout and block height. */
static void check_layout(const int *len, int n, int bm, int use80)
{
    const char *name = use80 ? "80-row" : "128-aligned";
    const int align = use80 ? 4 : 128;
    int64_t q0 = 0, total = 0;
    for (int b = 0; b < n; b++) total += len[b];
    const int64_t rows = use80 ? FC_VARLEN_WS_ROWS80(total, n) : FC_VARLEN_WS_ROWS(total, n);
    if (rows % bm != 0) fail(name, bm, -1, n, "rows per head not whole blocks", rows, bm);
    int64_t prev_end = 0;
    for (int b = 0; b < n; b++) {
        const int64_t start = use80 ? fc_varlen_ws_start80((int)q0, b) : fc_varlen_ws_start((int)q0, b);
        const int64_t end = start + (len[b] + bm - 1) / bm * bm; /* its blocks, padded */
        if (start % align != 0) fail(name, bm, b, n, "start not aligned", start, align);
        if (start < prev_end) fail(name, bm, b, n, "start inside the previous sequence's blocks", start, prev_end);
        if (end > rows) fail(name, bm, b, n, "blocks past the rows per head", end, rows);
        prev_end = end;
        q0 += len[b];
    }
}

int main(void)
{
    static int len[MAX_SEQS];
    int batches = 0;
    for (int trial = 0; trial < 3000; trial++) {
        /* mostly small batches, now and then a large one */
        const int n = trial % 100 == 0 ? 1 + (int)(rng() % MAX_SEQS) : 1 + (int)(rng() % 64);
        for (int b = 0; b < n; b++) len[b] = draw_length();
        if (trial % 7 == 0) /* runs of equal lengths at a block's edge */
            for (int b = 0; b < n; b++) len[b] = (b % 2) ? 80 : 81;
        check_layout(len, n, 64, 0);
        check_layout(len, n, 128, 0);
        check_layout(len, n, 80, 1);
        batches++;
    }
    printf("varlen workspace layouts: %d batches, 64-, 80- and 128-row blocks, %d failures\n", batches, failures);
    return failures != 0;
}
