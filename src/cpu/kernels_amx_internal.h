/*
 * kernels_amx_internal.h - what the AMX set's two files share: the tile configuration, which
 * each thread loads once, and the decode kernels of kernels_amx_decode.c that the set's table
 * in kernels_amx.c lists (their contracts are those of kernels.h).
 */
#ifndef FLASHC_KERNELS_AMX_INTERNAL_H
#define FLASHC_KERNELS_AMX_INTERNAL_H

#include <stdint.h>

#include "cpu/kernels.h"
#include "flashc.h"

/* Palette 1, eight tiles of 16 rows x 64 bytes; a no-op after the thread's first call. */
void flashc_amx_configure(void);

void flashc_amx_decode_qk16(int m, int n, int64_t d, const uint16_t *q16, int dp,
                            const void *const *k, float scale, const void *const *pf, int npf,
                            float *s);
void flashc_amx_decode_pv16(int m, int n, int64_t d, const uint16_t *p16, const void *const *v,
                            const void *const *pf, int npf, float *o, int dp);

#endif /* FLASHC_KERNELS_AMX_INTERNAL_H */
