/*
 * philox.h - the counter-based generator behind attention dropout: Philox4x32-10 (Salmon,
 * Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", 2011) and the map
 * from an attention entry (sequence b, query head h, row i, key column j) to its keep bit.
 *
 * Every backend includes this one header (plain C99 with static inline functions and
 * fixed-width integers, nothing C-only and nothing CUDA-only, so nvcc compiles it as is in
 * device code once FLASHC_PHILOX_QUALIFIER is defined as __host__ __device__), which is
 * what makes the mask bitwise the same on the CPU, the reference and a GPU for the same seed
 * and offset. The layout is documented beside flashc_dropout_keep in flashc.h:
 *
 *     key     = {seed_lo, seed_hi}
 *     counter = {j / 4, i, w_lo, w_hi},  w = offset + b * heads_q + h
 *     r       = philox4x32_10(counter, key)[j % 4]
 *     keep    = r >= threshold,  threshold = (uint32)floor(p * 2^32)
 *
 * One generator call serves four consecutive keys of a row, so a backend that walks a row
 * four columns at a time calls it once per group.
 */
#ifndef FLASHC_PHILOX_H
#define FLASHC_PHILOX_H

#include <stdint.h>

#ifndef FLASHC_PHILOX_QUALIFIER
#define FLASHC_PHILOX_QUALIFIER static inline
#endif

/* Round and key-schedule constants of Philox4x32 (Random123's PHILOX_M4x32_0/1 and
 * PHILOX_W32_0/1). */
#define FLASHC_PHILOX_M0 0xD2511F53u
#define FLASHC_PHILOX_M1 0xCD9E8D57u
#define FLASHC_PHILOX_W0 0x9E3779B9u
#define FLASHC_PHILOX_W1 0xBB67AE85u

typedef struct flashc_philox4 {
    uint32_t v[4];
} flashc_philox4;

/* Philox4x32 with 10 rounds: out = f(counter, key). */
FLASHC_PHILOX_QUALIFIER flashc_philox4 flashc_philox4x32_10(flashc_philox4 c, uint32_t k0,
                                                             uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += FLASHC_PHILOX_W0;
            k1 += FLASHC_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)FLASHC_PHILOX_M0 * c.v[0];
        uint64_t p1 = (uint64_t)FLASHC_PHILOX_M1 * c.v[2];
        flashc_philox4 n;
        n.v[0] = (uint32_t)(p1 >> 32) ^ c.v[1] ^ k0;
        n.v[1] = (uint32_t)p1;
        n.v[2] = (uint32_t)(p0 >> 32) ^ c.v[3] ^ k1;
        n.v[3] = (uint32_t)p0;
        c = n;
    }
    return c;
}

/* The threshold a uniform 32-bit draw must reach for its entry to be kept:
 * floor(p * 2^32), computed exactly (a float times a power of two is exact in double). */
FLASHC_PHILOX_QUALIFIER uint32_t flashc_dropout_threshold(float p)
{
    double t = (double)p * 4294967296.0;
    return t <= 0.0 ? 0u : (t >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)t);
}

/* The four draws of keys 4g .. 4g+3 of row i of (sequence b, head h): w is
 * offset + b * heads_q + h. */
FLASHC_PHILOX_QUALIFIER flashc_philox4 flashc_dropout_draws(uint64_t seed, uint64_t w,
                                                            uint32_t i, uint32_t g)
{
    flashc_philox4 c;
    c.v[0] = g;
    c.v[1] = i;
    c.v[2] = (uint32_t)w;
    c.v[3] = (uint32_t)(w >> 32);
    return flashc_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
}

#endif /* FLASHC_PHILOX_H */
