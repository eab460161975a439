/*
 * merge.cu - flashc_merge and flashc_merge_accumulate on the CUDA backend: partial attention
 * results combined through their log-sum-exp, one warp per row (b, s, h), each tensor in its
 * own dtype (F32, F16 or BF16), with merge.c's arithmetic:
 *
 *     m = max_i lse_i   w_i = exp(lse_i - m)   s = sum_i w_i   lse = m + log(s)
 *     out = sum_i (w_i / s) out_i, parts with w_i == 0 (lse_i = -inf) skipped
 *
 * so a masked part's out is never read (it may be garbage or NaN) and a row whose parts are
 * all -inf gets out = 0 and lse = -inf. A NaN lse propagates to its row, as on the host.
 *
 * Parts travel by value in the kernel's arguments, FC_MERGE_PARTS at a time; a merge of more
 * parts goes through a float32 accumulator (the first group is merged into it, every later
 * group together with it, the last one into out), so nothing is rounded to a 16-bit dtype
 * between groups.
 *
 * In place (merge_accumulate), out and lse are the views of part 0: the lane that reads an
 * element (or part 0's lse) of a row is the lane that writes it, after all its reads.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "decode.h"
#include "runtime.h"

#define FC_MERGE_PARTS 16
#define FC_MERGE_WARPS 8

typedef struct fc_merge_view {
    void *o;
    int64_t sb, ss, sh; /* element strides of batch, seqlen, heads */
    float *lse;
    int64_t lb, lh, ls; /* lse strides of batch, heads, seqlen */
    int dtype;
} fc_merge_view;

typedef struct fc_merge_args {
    fc_merge_view part[FC_MERGE_PARTS];
    fc_merge_view out;
    int n;
    int64_t batch, seqlen, heads;
    int head_dim;
} fc_merge_args;

static __device__ __forceinline__ float load_elem(const void *p, int64_t i, int dtype)
{
    if (dtype == FLASHC_F32) return ((const float *)p)[i];
    if (dtype == FLASHC_F16) return __half2float(((const __half *)p)[i]);
    return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
}

static __device__ __forceinline__ void store_elem(void *p, int64_t i, int dtype, float x)
{
    if (dtype == FLASHC_F32)
        ((float *)p)[i] = x;
    else if (dtype == FLASHC_F16)
        ((__half *)p)[i] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

/* max that keeps a NaN, as the host loop does */
static __device__ __forceinline__ float max_nan(float a, float b)
{
    return (b > a || b != b) ? b : a;
}

__global__ void __launch_bounds__(FC_MERGE_WARPS * 32) fc_merge_kernel(const fc_merge_args a)
{
    const int lane = threadIdx.x & 31;
    const int64_t rows = a.batch * a.seqlen * a.heads;
    const int64_t warps = (int64_t)gridDim.x * FC_MERGE_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * FC_MERGE_WARPS + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const int64_t h = r % a.heads, s = (r / a.heads) % a.seqlen,
                      b = r / (a.heads * a.seqlen);
        /* lane i holds part i's lse */
        float l = -INFINITY;
#pragma unroll
        for (int i = 0; i < FC_MERGE_PARTS; i++) /* constant indices keep the views in registers */
            if (i == lane && i < a.n) {
                const fc_merge_view *p = &a.part[i];
                l = p->lse[b * p->lb + h * p->lh + s * p->ls];
            }
        float m = l;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
        const fc_merge_view *o = &a.out;
        const int64_t orow = b * o->sb + s * o->ss + h * o->sh;
        if (m == -INFINITY) { /* every key of every part masked */
            for (int d = lane; d < a.head_dim; d += 32) store_elem(o->o, orow + d, o->dtype, 0.0f);
            if (lane == 0) o->lse[b * o->lb + h * o->lh + s * o->ls] = -INFINITY;
            continue;
        }
        float w = (lane < a.n && l != -INFINITY) ? expf(l - m) : 0.0f;
        float sum = w;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = 1.0f / sum;
        float wt[FC_MERGE_PARTS];
        int64_t prow[FC_MERGE_PARTS];
#pragma unroll
        for (int i = 0; i < FC_MERGE_PARTS; i++) {
            wt[i] = __shfl_sync(0xffffffffu, w, i) * inv;
            const fc_merge_view *p = &a.part[i];
            prow[i] = b * p->sb + s * p->ss + h * p->sh;
        }
        for (int d = lane; d < a.head_dim; d += 32) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < FC_MERGE_PARTS; i++)
                if (i < a.n && wt[i] != 0.0f) /* -inf, or too far below the max to count */
                    acc += wt[i] * load_elem(a.part[i].o, prow[i] + d, a.part[i].dtype);
            store_elem(o->o, orow + d, o->dtype, acc);
        }
        /* lane 0 read part 0's lse above: in place, this overwrites it only afterwards */
        if (lane == 0) o->lse[b * o->lb + h * o->lh + s * o->ls] = m + logf(sum);
    }
}

static fc_merge_view view_of(const flashc_tensor *t, const flashc_tensor *l)
{
    fc_merge_view v;
    v.o = t->data;
    v.sb = t->stride[0], v.ss = t->stride[1], v.sh = t->stride[2];
    v.lse = (float *)l->data;
    v.lb = l->stride[0], v.lh = l->stride[1], v.ls = l->stride[2];
    v.dtype = (int)t->dtype;
    return v;
}

static cudaError_t launch_merge(const fc_merge_args *a, int num_sms, cudaStream_t stream)
{
    const int64_t rows = a->batch * a->seqlen * a->heads;
    int64_t blocks = (rows + FC_MERGE_WARPS - 1) / FC_MERGE_WARPS;
    const int64_t cap = (int64_t)num_sms * 64; /* enough to fill the device; the rest loops */
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    fc_merge_kernel<<<(unsigned)blocks, FC_MERGE_WARPS * 32, 0, stream>>>(*a);
    return cudaGetLastError();
}

flashc_status fc_cuda_merge(void *state, const flashc_merge_problem *pr,
                            const flashc_tensor *outs, const flashc_tensor *lses,
                            flashc_tensor *out, flashc_tensor *lse)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    if (pr->head_dim > 0x7fffffffLL)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "cuda: merge head_dim too large");
    fc_device_guard guard;
    flashc_status st = fc_guard_enter(&guard, s);
    if (st != FLASHC_OK) return st;
    if ((st = fc_check_device_pointer(s, out->data, "out")) != FLASHC_OK ||
        (st = fc_check_device_pointer(s, lse->data, "lse")) != FLASHC_OK) {
        fc_guard_leave(&guard);
        return st;
    }
    for (int32_t i = 0; i < pr->n_parts; i++)
        if ((st = fc_check_device_pointer(s, outs[i].data, "outs[i]")) != FLASHC_OK ||
            (st = fc_check_device_pointer(s, lses[i].data, "lses[i]")) != FLASHC_OK) {
            fc_guard_leave(&guard);
            return st;
        }

    cudaStream_t stream = (cudaStream_t)pr->stream;
    fc_merge_args a;
    memset(&a, 0, sizeof a);
    a.batch = pr->batch;
    a.seqlen = pr->seqlen;
    a.heads = pr->heads;
    a.head_dim = (int)pr->head_dim;
    const int32_t n = pr->n_parts;
    cudaError_t err = cudaSuccess;
    const char *what = "merge kernel launch";

    if (n <= FC_MERGE_PARTS) {
        for (int32_t i = 0; i < n; i++) a.part[i] = view_of(&outs[i], &lses[i]);
        a.n = n;
        a.out = view_of(out, lse);
        err = launch_merge(&a, s->num_sms, stream);
    } else {
        /* a float32 accumulator [batch, seqlen, heads, head_dim] and its lse [batch, heads, seqlen] */
        const size_t rows = (size_t)(pr->batch * pr->seqlen * pr->heads);
        const size_t o_bytes = (rows * (size_t)pr->head_dim * sizeof(float) + 255) & ~(size_t)255;
        char *ws = NULL;
        err = cudaMallocAsync((void **)&ws, o_bytes + rows * sizeof(float), stream);
        if (err != cudaSuccess) {
            fc_guard_leave(&guard);
            return fc_cuda_error(err, "cudaMallocAsync (merge accumulator)");
        }
        fc_merge_view acc;
        acc.o = ws;
        acc.sh = pr->head_dim, acc.ss = pr->heads * pr->head_dim, acc.sb = pr->seqlen * acc.ss;
        acc.lse = (float *)(ws + o_bytes);
        acc.ls = 1, acc.lh = pr->seqlen, acc.lb = pr->heads * pr->seqlen;
        acc.dtype = FLASHC_F32;
        int32_t next = 0;
        while (err == cudaSuccess && next < n) {
            int k = 0;
            if (next > 0) a.part[k++] = acc; /* what the groups before gave */
            while (k < FC_MERGE_PARTS && next < n) {
                a.part[k] = view_of(&outs[next], &lses[next]);
                k++, next++;
            }
            a.n = k;
            a.out = next < n ? acc : view_of(out, lse);
            err = launch_merge(&a, s->num_sms, stream);
        }
        cudaError_t err2 = cudaFreeAsync(ws, stream);
        if (err == cudaSuccess && err2 != cudaSuccess) {
            err = err2;
            what = "cudaFreeAsync (merge accumulator)";
        }
    }
    fc_guard_leave(&guard);
    if (err != cudaSuccess) return fc_cuda_error(err, what);
    return FLASHC_OK;
}
