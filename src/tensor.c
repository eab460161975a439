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

void flashc_params_init(flashc_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->window_left = -1;
    p->window_right = -1;
}

void flashc_backend_config_init(flashc_backend_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->device = -1;
}
