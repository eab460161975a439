/*
 * tensor.c - constructors of tensor descriptors and params with their defaults.
 */
#include <string.h>

#include "flashc.h"

size_t flashc_dtype_size(flashc_dtype dtype)
{
    switch (dtype) {
    case FLASHC_F32: return 4;
    case FLASHC_F16:
    case FLASHC_BF16: return 2;
    }
    return 0;
}

flashc_tensor flashc_tensor_contiguous(void *data, flashc_dtype dtype, int64_t batch,
                                       int64_t seqlen, int64_t heads, int64_t head_dim)
{
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = 4;
    t.shape[0] = batch;
    t.shape[1] = seqlen;
    t.shape[2] = heads;
    t.shape[3] = head_dim;
    t.stride[3] = 1;
    t.stride[2] = head_dim;
    t.stride[1] = heads * head_dim;
    t.stride[0] = seqlen * heads * head_dim;
    return t;
}

flashc_tensor flashc_tensor_bhsd(void *data, flashc_dtype dtype, int64_t batch, int64_t heads,
                                 int64_t seqlen, int64_t head_dim)
{
    flashc_tensor t = flashc_tensor_contiguous(data, dtype, batch, seqlen, heads, head_dim);
    t.stride[1] = head_dim;
    t.stride[2] = seqlen * head_dim;
    return t;
}

flashc_tensor flashc_lse_contiguous(float *data, int64_t batch, int64_t heads, int64_t seqlen_q)
{
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = FLASHC_F32;
    t.ndim = 3;
    t.shape[0] = batch;
    t.shape[1] = heads;
    t.shape[2] = seqlen_q;
    t.stride[2] = 1;
    t.stride[1] = seqlen_q;
    t.stride[0] = heads * seqlen_q;
    return t;
}

/* Writes min(size, ours) bytes of defaults, and zeroes the tail of a newer caller's longer
 * struct; struct_size records the caller's size, so that a newer caller's fields that this
 * version does not know are checked to be unset rather than silently ignored. */
static void init_versioned(void *dst, size_t size, const void *defaults, size_t ours)
{
    memcpy(dst, defaults, size < ours ? size : ours);
    if (size > ours)
        memset((char *)dst + ours, 0, size - ours);
    memcpy(dst, &size, sizeof size); /* struct_size is the first field of both structs */
}

void flashc_params_init_sized(flashc_params *p, size_t struct_size)
{
    if (!p || struct_size < sizeof(size_t))
        return;
    flashc_params d;
    memset(&d, 0, sizeof d);
    d.window_left = -1;
    d.window_right = -1;
    init_versioned(p, struct_size, &d, sizeof d);
}

void flashc_backend_config_init_sized(flashc_backend_config *cfg, size_t struct_size)
{
    if (!cfg || struct_size < sizeof(size_t))
        return;
    flashc_backend_config d;
    memset(&d, 0, sizeof d);
    d.device = -1;
    init_versioned(cfg, struct_size, &d, sizeof d);
}
