/*
 * ring_nccl.cu - ring attention across GPUs over NCCL (flashc_ring_forward_nccl,
 * flashc_ring_backward_nccl in flashc_ring.h). The same schedule as ring_mpi.c, with the
 * transfers on a stream of their own: at step s the K/V block moves (ncclSend to r+1,
 * ncclRecv from r-1, one group) on the transfer stream while the caller's stream computes
 * on the current block; events order "block received" before its compute and "block
 * computed" before its buffer is received into again. The backward sends each block's dK/dV
 * sum one hop behind, as over MPI.
 *
 * The CUDA backend has no LSE merge yet, so the float32 accumulation (merge, gradient sums,
 * packing and the final conversion) is done by the small row kernels below: one thread per
 * (batch, row, head), memory-bound and tiny next to the attention itself.
 *
 * Run with NCCL_NVLS_ENABLE=0 on shared machines: NVLink multicast is not needed here.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "ring_common.h"

/* ---- row kernels ------------------------------------------------------------------------- */

__device__ static float ld(const void *p, int dt, int64_t i)
{
    if (dt == FLASHC_F32) return ((const float *)p)[i];
    if (dt == FLASHC_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

__device__ static void st(void *p, int dt, int64_t i, float x)
{
    if (dt == FLASHC_F32) ((float *)p)[i] = x;
    else if (dt == FLASHC_F16) ((__half *)p)[i] = __float2half_rn(x);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

/* Element offsets of a [B, S, H, D] view, passed by value. */
struct view4 {
    void *data;
    int dt;
    int64_t B, S, H, D, s0, s1, s2;
};

static view4 v4(const flashc_tensor *t)
{
    view4 v = {t->data, (int)t->dtype, t->shape[0], t->shape[1], t->shape[2], t->shape[3],
               t->stride[0], t->stride[1], t->stride[2]};
    return v;
}

#define ROW_INDEX                                                                            \
    int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;                            \
    if (row >= v.B * v.S * v.H)                                                              \
        return;                                                                              \
    int64_t h = row % v.H, s = (row / v.H) % v.S, b = row / (v.H * v.S);                     \
    int64_t off = b * v.s0 + s * v.s1 + h * v.s2

/* dst (contiguous, dt) <- a strided view: K/V packing. */
__global__ static void k_pack(view4 v, void *dst)
{
    ROW_INDEX;
    for (int64_t d = 0; d < v.D; d++)
        st(dst, v.dt, row * v.D + d, ld(v.data, v.dt, off + d));
}

/* A strided view <- contiguous float rows (the final outputs). */
__global__ static void k_store(view4 v, const float *src)
{
    ROW_INDEX;
    for (int64_t d = 0; d < v.D; d++)
        st(v.data, v.dt, off + d, src[row * v.D + d]);
}

/* dst rows [r0, r0 + v.S) of a contiguous float [B, rows, H, D] += the view v. */
__global__ static void k_add(view4 v, float *dst, int64_t rows, int64_t r0)
{
    ROW_INDEX;
    float *o = dst + ((b * rows + r0 + s) * v.H + h) * v.D;
    for (int64_t d = 0; d < v.D; d++)
        o[d] += ld(v.data, v.dt, off + d);
}

/* The in-place LSE merge of a part (view v, lse pl [B, H, v.S] contiguous rows at pl0 of
 * a [B, H, n] buffer) into acc rows [r0, ...) of [B, n, H, D] / [B, H, n] float. */
__global__ static void k_merge(view4 v, const float *pl, float *acc, float *acc_l, int64_t n,
                               int64_t r0)
{
    ROW_INDEX;
    const int64_t li = (b * v.H + h) * n + r0 + s;
    const float la = acc_l[li], lp = pl[li];
    if (lp == -INFINITY)
        return; /* the part adds nothing */
    float *o = acc + ((b * n + r0 + s) * v.H + h) * v.D;
    if (la == -INFINITY) { /* empty accumulator: take the part */
        for (int64_t d = 0; d < v.D; d++)
            o[d] = ld(v.data, v.dt, off + d);
        acc_l[li] = lp;
        return;
    }
    const float m = fmaxf(la, lp), wa = expf(la - m), wp = expf(lp - m), inv = 1.0f / (wa + wp);
    for (int64_t d = 0; d < v.D; d++)
        o[d] = (wa * o[d] + wp * ld(v.data, v.dt, off + d)) * inv;
    acc_l[li] = m + logf(wa + wp);
}

__global__ static void k_fill(float *p, int64_t n, float x)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = x;
}

/* lse view (strided) <- contiguous [B, H, n]. */
__global__ static void k_store_lse(float *dst, int64_t B, int64_t H, int64_t n, int64_t s0,
                                   int64_t s1, int64_t s2, const float *src)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * H * n)
        return;
    int64_t s = i % n, h = (i / n) % H, b = i / (n * H);
    dst[b * s0 + h * s1 + s * s2] = src[i];
}

static unsigned grid_of(int64_t n)
{
    return (unsigned)((n + 127) / 128);
}

#define ROWS(v) grid_of((v).B * (v).S * (v).H), 128

/* ---- errors and the ring's frame ---------------------------------------------------------- */

static flashc_status cuda_failed(cudaError_t e, const char *what)
{
    return flashc_ring_error_(FLASHC_ERROR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

static flashc_status nccl_failed(ncclResult_t r, const char *what)
{
    return flashc_ring_error_(FLASHC_ERROR_DEVICE, "%s: %s", what, ncclGetErrorString(r));
}

#define CU(expr, what)                                                                       \
    do {                                                                                     \
        cudaError_t cu_e_ = (expr);                                                          \
        if (cu_e_ != cudaSuccess && st == FLASHC_OK)                                         \
            st = cuda_failed(cu_e_, what);                                                   \
    } while (0)
#define NC(expr, what)                                                                       \
    do {                                                                                     \
        ncclResult_t nc_r_ = (expr);                                                         \
        if (nc_r_ != ncclSuccess && st == FLASHC_OK)                                         \
            st = nccl_failed(nc_r_, what);                                                   \
    } while (0)

typedef struct nring {
    ncclComm_t comm;
    cudaStream_t stream, cs; /* compute (the caller's) and transfers (ours) */
    cudaEvent_t ev_comm, ev_comp, ev_loc; /* K/V received, block computed, loc consumed */
    int world, rank, next, prev;
    ring_desc *all;
    int64_t nmax;
    size_t esize;
    void *dscratch; /* device memory for the small collectives */
} nring;

/* A small collective through device memory, on the transfer stream, waited for. */
static flashc_status all_gather_desc(nring *r, ring_desc *mine)
{
    flashc_status st = FLASHC_OK;
    char *d = (char *)r->dscratch;
    CU(cudaMemcpyAsync(d, mine, sizeof *mine, cudaMemcpyHostToDevice, r->cs), "descriptor copy");
    NC(ncclAllGather(d, d + sizeof *mine, sizeof *mine, ncclUint8, r->comm, r->cs),
       "ncclAllGather of the descriptors");
    CU(cudaMemcpyAsync(r->all, d + sizeof *mine, (size_t)r->world * sizeof *mine,
                       cudaMemcpyDeviceToHost, r->cs),
       "descriptor copy");
    CU(cudaStreamSynchronize(r->cs), "descriptor exchange");
    return st;
}

/* Every rank's outcome: the lowest failing rank's status, or OK. */
static flashc_status agree(nring *r, flashc_status st, const char *when)
{
    int mine[2] = {st != FLASHC_OK ? r->rank : 1 << 30, (int)st}, got[2];
    int *d = (int *)r->dscratch;
    flashc_status t = FLASHC_OK;
    cudaMemcpyAsync(d, mine, sizeof mine, cudaMemcpyHostToDevice, r->cs);
    ncclAllReduce(d, d + 2, 1, ncclInt32, ncclMin, r->comm, r->cs);
    cudaMemcpyAsync(got, d + 2, sizeof(int), cudaMemcpyDeviceToHost, r->cs);
    if (cudaStreamSynchronize(r->cs) != cudaSuccess)
        t = flashc_ring_error_(FLASHC_ERROR_DEVICE, "agreeing on the outcome failed");
    if (st != FLASHC_OK)
        return st;
    if (t != FLASHC_OK)
        return t;
    if (got[0] != 1 << 30)
        return flashc_ring_error_(FLASHC_ERROR_DEVICE,
                                  "rank %d failed %s (its flashc_ring_last_error() says why)",
                                  got[0], when);
    return FLASHC_OK;
}

static flashc_status ring_open(nring *r, ncclComm_t comm, cudaStream_t stream,
                               flashc_backend *be, flashc_status local, ring_desc *d)
{
    memset(r, 0, sizeof *r);
    flashc_status st = FLASHC_OK;
    r->comm = comm;
    r->stream = stream;
    NC(ncclCommCount(comm, &r->world), "comm");
    NC(ncclCommUserRank(comm, &r->rank), "comm");
    RING_TRY(st);
    r->next = (r->rank + 1) % r->world;
    r->prev = (r->rank + r->world - 1) % r->world;
    CU(cudaStreamCreateWithFlags(&r->cs, cudaStreamNonBlocking), "transfer stream");
    CU(cudaEventCreateWithFlags(&r->ev_comm, cudaEventDisableTiming), "event");
    CU(cudaEventCreateWithFlags(&r->ev_comp, cudaEventDisableTiming), "event");
    CU(cudaEventCreateWithFlags(&r->ev_loc, cudaEventDisableTiming), "event");
    CU(cudaMalloc(&r->dscratch, (size_t)(r->world + 1) * sizeof(ring_desc) + 64), "scratch");
    r->all = (ring_desc *)calloc((size_t)r->world, sizeof *r->all);
    RING_TRY(st);
    if (!r->all)
        return flashc_ring_error_(FLASHC_ERROR_OUT_OF_MEMORY, "descriptors: out of memory");
    if (local == FLASHC_OK && !flashc_backend_uses_device_memory(be))
        local = flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                   "backend: '%s' computes on host memory; use "
                                   "flashc_ring_forward_mpi/backward_mpi",
                                   flashc_backend_name(be));
    d->status = (int32_t)local;
    RING_TRY(all_gather_desc(r, d));
    RING_TRY(ring_check_all(r->all, r->world, r->rank));
    for (int j = 0; j < r->world; j++)
        if (r->all[j].n_local > r->nmax)
            r->nmax = r->all[j].n_local;
    r->esize = flashc_dtype_size((flashc_dtype)d->dtype);
    return FLASHC_OK;
}

static void ring_close(nring *r)
{
    if (r->cs) cudaStreamDestroy(r->cs);
    if (r->ev_comm) cudaEventDestroy(r->ev_comm);
    if (r->ev_comp) cudaEventDestroy(r->ev_comp);
    if (r->ev_loc) cudaEventDestroy(r->ev_loc);
    if (r->dscratch) cudaFree(r->dscratch);
    free(r->all);
}

static size_t kv_elems(const nring *r, int j)
{
    const ring_desc *d = &r->all[j];
    return (size_t)(d->batch * d->n_local * d->heads_kv * d->head_dim);
}

static void block_kv(const nring *r, int j, void *buf, flashc_tensor *k, flashc_tensor *v)
{
    const ring_desc *d = &r->all[j];
    flashc_dtype dt = (flashc_dtype)d->dtype;
    *k = flashc_tensor_contiguous(buf, dt, d->batch, d->n_local, d->heads_kv, d->head_dim);
    *v = flashc_tensor_contiguous((char *)buf + kv_elems(r, j) * r->esize, dt, d->batch,
                                  d->n_local, d->heads_kv, d->head_dim);
}

/* Step s's transfer: this block on to r+1, the next one in from r-1, after the compute that
 * last used the receiving buffer; the compute of step s+1 waits for it. */
static flashc_status exchange(nring *r, void *send, size_t send_bytes, void *recv,
                              size_t recv_bytes)
{
    flashc_status st = FLASHC_OK;
    CU(cudaStreamWaitEvent(r->cs, r->ev_comp, 0), "event wait");
    NC(ncclGroupStart(), "ncclGroupStart");
    NC(ncclSend(send, send_bytes, ncclUint8, r->next, r->comm, r->cs), "ncclSend");
    NC(ncclRecv(recv, recv_bytes, ncclUint8, r->prev, r->comm, r->cs), "ncclRecv");
    NC(ncclGroupEnd(), "ncclGroupEnd");
    CU(cudaEventRecord(r->ev_comm, r->cs), "event record");
    return st;
}

/* ---- forward ----------------------------------------------------------------------------- */

extern "C" flashc_status flashc_ring_forward_nccl(ncclComm_t comm, cudaStream_t stream,
                                                  flashc_backend *backend,
                                                  const flashc_params *params, int64_t seqlen,
                                                  const flashc_tensor *q, const flashc_tensor *k,
                                                  const flashc_tensor *v, flashc_tensor *out,
                                                  flashc_tensor *lse)
{
    flashc_params p;
    ring_desc d;
    flashc_status st = ring_check_forward(backend, params, seqlen, q, k, v, out, lse, &p, &d);
    nring r;
    st = ring_open(&r, comm, stream, backend, st, &d);
    if (st != FLASHC_OK) {
        ring_close(&r);
        return st;
    }
    p.stream = stream;
    const int64_t B = d.batch, n = d.n_local, Hq = d.heads_q, D = d.head_dim;
    const size_t kv_max = (size_t)(B * r.nmax * d.heads_kv * D);
    const size_t q_elems = (size_t)(B * n * Hq * D), l_elems = (size_t)(B * Hq * n);
    void *kvbuf[2] = {NULL, NULL}, *tmp_o = NULL;
    float *acc_o = NULL, *acc_l = NULL, *tmp_l = NULL;
    CU(cudaMalloc(&kvbuf[0], 2 * kv_max * r.esize), "ring buffers");
    CU(cudaMalloc(&kvbuf[1], 2 * kv_max * r.esize), "ring buffers");
    CU(cudaMalloc((void **)&acc_o, q_elems * sizeof(float)), "ring buffers");
    CU(cudaMalloc((void **)&acc_l, l_elems * sizeof(float)), "ring buffers");
    CU(cudaMalloc(&tmp_o, q_elems * r.esize), "ring buffers");
    CU(cudaMalloc((void **)&tmp_l, l_elems * sizeof(float)), "ring buffers");
    st = agree(&r, st, "to allocate its buffers");
    if (st == FLASHC_OK) {
        k_fill<<<grid_of((int64_t)l_elems), 128, 0, stream>>>(acc_l, (int64_t)l_elems, -INFINITY);
        flashc_tensor K0, V0;
        block_kv(&r, r.rank, kvbuf[0], &K0, &V0);
        view4 vk = v4(k), vv = v4(v);
        k_pack<<<ROWS(vk), 0, stream>>>(vk, K0.data);
        k_pack<<<ROWS(vv), 0, stream>>>(vv, V0.data);
        CU(cudaEventRecord(r.ev_comp, stream), "event record");
        flashc_tensor tmp_ot = flashc_tensor_contiguous(tmp_o, (flashc_dtype)d.dtype, B, n, Hq, D);
        flashc_tensor tmp_lt = flashc_lse_contiguous(tmp_l, B, Hq, n);
        ring_rows qr = ring_rows_of(r.all, r.world, r.rank);
        int cur = 0;
        for (int s = 0; s < r.world; s++) {
            int src = (r.rank - s + r.world) % r.world, src_next = (src - 1 + r.world) % r.world;
            if (s < r.world - 1) {
                flashc_status e = exchange(&r, kvbuf[cur], 2 * kv_elems(&r, src) * r.esize,
                                           kvbuf[cur ^ 1], 2 * kv_elems(&r, src_next) * r.esize);
                if (st == FLASHC_OK)
                    st = e;
            }
            flashc_tensor K, V;
            block_kv(&r, src, kvbuf[cur], &K, &V);
            ring_rows kr = ring_rows_of(r.all, r.world, src);
            ring_call calls[RING_MAX_CALLS];
            int nc = ring_plan(d.causal, &qr, &kr, calls);
            for (int i = 0; i < nc && st == FLASHC_OK; i++) {
                const ring_call *cl = &calls[i];
                flashc_params pc = p;
                pc.causal = cl->causal;
                flashc_tensor qv = ring_seq_rows(q, cl->q0, cl->nq);
                flashc_tensor kv = ring_seq_rows(&K, cl->k0, cl->nk);
                flashc_tensor vv2 = ring_seq_rows(&V, cl->k0, cl->nk);
                flashc_tensor ov = ring_seq_rows(&tmp_ot, cl->q0, cl->nq);
                flashc_tensor lv = ring_lse_rows(&tmp_lt, cl->q0, cl->nq);
                flashc_status e = flashc_forward(backend, &pc, &qv, &kv, &vv2, &ov, &lv);
                if (e != FLASHC_OK) {
                    char where[96];
                    snprintf(where, sizeof where, "rank %d, step %d (block of rank %d)", r.rank,
                             s, src);
                    st = ring_flashc_failed(e, where);
                    break;
                }
                view4 pv = v4(&ov);
                k_merge<<<ROWS(pv), 0, stream>>>(pv, tmp_l, acc_o, acc_l, n, cl->q0);
            }
            CU(cudaEventRecord(r.ev_comp, stream), "event record");
            if (s < r.world - 1)
                CU(cudaStreamWaitEvent(stream, r.ev_comm, 0), "event wait");
            cur ^= 1;
        }
        CU(cudaGetLastError(), "ring kernels");
        CU(cudaStreamSynchronize(stream), "ring forward");
        st = agree(&r, st, "in the ring");
        if (st == FLASHC_OK) {
            view4 vo = v4(out);
            k_store<<<ROWS(vo), 0, stream>>>(vo, acc_o);
            k_store_lse<<<grid_of((int64_t)l_elems), 128, 0, stream>>>(
                (float *)lse->data, B, Hq, n, lse->stride[0], lse->stride[1], lse->stride[2], acc_l);
            CU(cudaStreamSynchronize(stream), "writing out and lse");
        }
    }
    cudaFree(kvbuf[0]);
    cudaFree(kvbuf[1]);
    cudaFree(acc_o);
    cudaFree(acc_l);
    cudaFree(tmp_o);
    cudaFree(tmp_l);
    ring_close(&r);
    return st;
}

/* ---- backward ---------------------------------------------------------------------------- */

extern "C" flashc_status flashc_ring_backward_nccl(
    ncclComm_t comm, cudaStream_t stream, flashc_backend *backend, const flashc_params *params,
    int64_t seqlen, const flashc_tensor *dout, const flashc_tensor *q, const flashc_tensor *k,
    const flashc_tensor *v, const flashc_tensor *out, const flashc_tensor *lse,
    flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    flashc_params p;
    ring_desc d;
    flashc_status st = ring_check_backward(backend, params, seqlen, dout, q, k, v, out, lse, dq,
                                           dk, dv, &p, &d);
    nring r;
    st = ring_open(&r, comm, stream, backend, st, &d);
    if (st != FLASHC_OK) {
        ring_close(&r);
        return st;
    }
    p.stream = stream;
    const flashc_dtype dt = (flashc_dtype)d.dtype;
    const int64_t B = d.batch, n = d.n_local, Hq = d.heads_q, Hkv = d.heads_kv, D = d.head_dim;
    const size_t kv_max = (size_t)(B * r.nmax * Hkv * D), q_elems = (size_t)(B * n * Hq * D);
    void *kvbuf[2] = {NULL, NULL}, *tmp_dq = NULL, *tmp_dk = NULL, *tmp_dv = NULL;
    float *dkv[2] = {NULL, NULL}, *loc = NULL, *dq_acc = NULL;
    CU(cudaMalloc(&kvbuf[0], 2 * kv_max * r.esize), "ring buffers");
    CU(cudaMalloc(&kvbuf[1], 2 * kv_max * r.esize), "ring buffers");
    CU(cudaMalloc((void **)&dkv[0], 2 * kv_max * sizeof(float)), "ring buffers");
    CU(cudaMalloc((void **)&dkv[1], 2 * kv_max * sizeof(float)), "ring buffers");
    CU(cudaMalloc((void **)&loc, 2 * kv_max * sizeof(float)), "ring buffers");
    CU(cudaMalloc((void **)&dq_acc, q_elems * sizeof(float)), "ring buffers");
    CU(cudaMalloc(&tmp_dq, q_elems * r.esize), "ring buffers");
    CU(cudaMalloc(&tmp_dk, kv_max * r.esize), "ring buffers");
    CU(cudaMalloc(&tmp_dv, kv_max * r.esize), "ring buffers");
    st = agree(&r, st, "to allocate its buffers");
    if (st == FLASHC_OK) {
        CU(cudaMemsetAsync(dq_acc, 0, q_elems * sizeof(float), stream), "memset");
        flashc_tensor K0, V0;
        block_kv(&r, r.rank, kvbuf[0], &K0, &V0);
        view4 vk = v4(k), vv = v4(v);
        k_pack<<<ROWS(vk), 0, stream>>>(vk, K0.data);
        k_pack<<<ROWS(vv), 0, stream>>>(vv, V0.data);
        CU(cudaEventRecord(r.ev_comp, stream), "event record");
        flashc_tensor tdq = flashc_tensor_contiguous(tmp_dq, dt, B, n, Hq, D);
        ring_rows qr = ring_rows_of(r.all, r.world, r.rank);
        int cur = 0, t = 0;
        for (int s = 0; s < r.world; s++) {
            int src = (r.rank - s + r.world) % r.world, src_next = (src - 1 + r.world) % r.world;
            const ring_desc *ds = &r.all[src];
            size_t nd = 2 * kv_elems(&r, src);
            if (s < r.world - 1) {
                flashc_status e = exchange(&r, kvbuf[cur], nd * r.esize, kvbuf[cur ^ 1],
                                           2 * kv_elems(&r, src_next) * r.esize);
                if (st == FLASHC_OK)
                    st = e;
            }
            CU(cudaMemsetAsync(loc, 0, nd * sizeof(float), stream), "memset");
            flashc_tensor K, V;
            block_kv(&r, src, kvbuf[cur], &K, &V);
            flashc_tensor tdk = flashc_tensor_contiguous(tmp_dk, dt, B, ds->n_local, Hkv, D);
            flashc_tensor tdv = flashc_tensor_contiguous(tmp_dv, dt, B, ds->n_local, Hkv, D);
            ring_rows kr = ring_rows_of(r.all, r.world, src);
            ring_call calls[RING_MAX_CALLS];
            int nc = ring_plan(d.causal, &qr, &kr, calls);
            for (int i = 0; i < nc && st == FLASHC_OK; i++) {
                const ring_call *cl = &calls[i];
                flashc_params pc = p;
                pc.causal = cl->causal;
                flashc_tensor dov = ring_seq_rows(dout, cl->q0, cl->nq);
                flashc_tensor qv = ring_seq_rows(q, cl->q0, cl->nq);
                flashc_tensor ov = ring_seq_rows(out, cl->q0, cl->nq);
                flashc_tensor lv = ring_lse_rows(lse, cl->q0, cl->nq);
                flashc_tensor kv = ring_seq_rows(&K, cl->k0, cl->nk);
                flashc_tensor vv2 = ring_seq_rows(&V, cl->k0, cl->nk);
                flashc_tensor dqv = ring_seq_rows(&tdq, cl->q0, cl->nq);
                flashc_tensor dkv2 = ring_seq_rows(&tdk, cl->k0, cl->nk);
                flashc_tensor dvv = ring_seq_rows(&tdv, cl->k0, cl->nk);
                flashc_status e = flashc_backward(backend, &pc, &dov, &qv, &kv, &vv2, &ov, &lv,
                                                  &dqv, &dkv2, &dvv);
                if (e != FLASHC_OK) {
                    char where[96];
                    snprintf(where, sizeof where, "rank %d, step %d (block of rank %d), backward",
                             r.rank, s, src);
                    st = ring_flashc_failed(e, where);
                    break;
                }
                view4 a = v4(&dqv), bk = v4(&dkv2), bv = v4(&dvv);
                k_add<<<ROWS(a), 0, stream>>>(a, dq_acc, n, cl->q0);
                k_add<<<ROWS(bk), 0, stream>>>(bk, loc, ds->n_local, cl->k0);
                k_add<<<ROWS(bv), 0, stream>>>(bv, loc + nd / 2, ds->n_local, cl->k0);
            }
            CU(cudaEventRecord(r.ev_comp, stream), "event record");
            /* the earlier ranks' sum (received on the transfer stream during the compute)
             * plus this rank's part, sent on; the next sum is received into the other buffer */
            CU(cudaStreamWaitEvent(r.cs, r.ev_comp, 0), "event wait");
            if (s == 0)
                CU(cudaMemcpyAsync(dkv[t], loc, nd * sizeof(float), cudaMemcpyDeviceToDevice,
                                   r.cs),
                   "dK/dV copy");
            else {
                view4 lv4 = {loc, FLASHC_F32, 1, (int64_t)nd, 1, 1, 0, 1, 0};
                k_add<<<ROWS(lv4), 0, r.cs>>>(lv4, dkv[t], (int64_t)nd, 0);
            }
            CU(cudaEventRecord(r.ev_loc, r.cs), "event record");
            NC(ncclGroupStart(), "ncclGroupStart");
            NC(ncclSend(dkv[t], nd * sizeof(float), ncclUint8, r.next, r.comm, r.cs), "ncclSend");
            NC(ncclRecv(dkv[t ^ 1], 2 * kv_elems(&r, src_next) * sizeof(float), ncclUint8, r.prev,
                        r.comm, r.cs),
               "ncclRecv");
            NC(ncclGroupEnd(), "ncclGroupEnd");
            /* the next compute waits for its K/V (ev_comm, recorded by exchange before this
             * dK/dV transfer) and for loc to be read, not for the dK/dV transfer itself */
            if (s < r.world - 1)
                CU(cudaStreamWaitEvent(stream, r.ev_comm, 0), "event wait");
            CU(cudaStreamWaitEvent(stream, r.ev_loc, 0), "event wait");
            t ^= 1;
            cur ^= 1;
        }
        CU(cudaGetLastError(), "ring kernels");
        CU(cudaStreamSynchronize(stream), "ring backward");
        CU(cudaStreamSynchronize(r.cs), "ring backward transfers");
        st = agree(&r, st, "in the ring");
        if (st == FLASHC_OK) {
            view4 a = v4(dq), bk = v4(dk), bv = v4(dv);
            k_store<<<ROWS(a), 0, stream>>>(a, dq_acc);
            k_store<<<ROWS(bk), 0, stream>>>(bk, dkv[t]);
            k_store<<<ROWS(bv), 0, stream>>>(bv, dkv[t] + kv_elems(&r, r.rank));
            CU(cudaStreamSynchronize(stream), "writing dq, dk, dv");
        }
    }
    cudaFree(kvbuf[0]);
    cudaFree(kvbuf[1]);
    cudaFree(dkv[0]);
    cudaFree(dkv[1]);
    cudaFree(loc);
    cudaFree(dq_acc);
    cudaFree(tmp_dq);
    cudaFree(tmp_dk);
    cudaFree(tmp_dv);
    ring_close(&r);
    return st;
}
