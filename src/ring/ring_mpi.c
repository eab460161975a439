/*
 * ring_mpi.c - ring attention across CPU processes over MPI (flashc_ring_forward_mpi,
 * flashc_ring_backward_mpi in flashc_ring.h).
 *
 * Forward, on rank r of R: step s attends the local queries to the K/V block of rank
 * (r - s) mod R while that block is already on its way to r+1 and the next one is arriving
 * from r-1 (MPI_Isend / MPI_Irecv posted before the compute, waited after it). Each flashc
 * call's (out, lse) is folded into a float32 accumulator by flashc_merge_accumulate; the
 * accumulator is written to out and lse once, at the end.
 *
 * Backward: K/V travel the same way. The dK/dV of a block are summed as it travels, one hop
 * behind it: at step s a rank computes the block's contribution into a zeroed buffer while
 * the sum of the earlier ranks' contributions is arriving, adds the two, and sends the sum
 * on, in flight during the next step. After the last step the complete dK/dV of each rank's
 * own block arrive from r-1. dQ is summed locally. Each block's backward is flashc_backward
 * with the global O and LSE, so P and delta are the global ones.
 *
 * Every rank runs the same sequence of messages whatever happens, so a failure on one rank
 * (out of memory, a flashc error) cannot leave another waiting: the failing rank skips its
 * compute, keeps sending and receiving, and all ranks agree on the outcome at the end.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_common.h"

enum { TAG_KV = 0x7c10, TAG_DKV = 0x7c20 };

/* MPI counts are int: a transfer is cut into pieces of at most 1 GiB. */
#define PIECE ((size_t)1 << 30)
#define MAX_REQ 64

typedef struct req_list {
    MPI_Request r[MAX_REQ];
    int n;
} req_list;

static void post(req_list *rl, int is_send, void *buf, size_t bytes, int peer, int tag,
                 MPI_Comm comm)
{
    char *p = (char *)buf;
    for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += PIECE) {
        int count = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        if (is_send)
            MPI_Isend(p + off, count, MPI_BYTE, peer, tag, comm, &rl->r[rl->n++]);
        else
            MPI_Irecv(p + off, count, MPI_BYTE, peer, tag, comm, &rl->r[rl->n++]);
        if (bytes == 0)
            break;
    }
}

static void wait_all(req_list *rl)
{
    if (rl->n)
        MPI_Waitall(rl->n, rl->r, MPI_STATUSES_IGNORE);
    rl->n = 0;
}

/* Agrees on the outcome: the first failing rank's status, or OK. */
static flashc_status agree(flashc_status st, MPI_Comm comm, int rank, const char *when)
{
    int mine = st != FLASHC_OK ? rank : 1 << 30, first;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == 1 << 30)
        return FLASHC_OK;
    int code = (int)st;
    MPI_Bcast(&code, 1, MPI_INT, first, comm);
    if (st != FLASHC_OK)
        return st; /* this rank's own message stands */
    return flashc_ring_error_((flashc_status)code, "rank %d failed %s (%s; its "
                              "flashc_ring_last_error() says why)",
                              first, when, flashc_status_string((flashc_status)code));
}

/* Sizes of the ring: ranks, this rank, the neighbours, the largest block. */
typedef struct ring_ctx {
    MPI_Comm comm;
    int world, rank, next, prev;
    ring_desc *all;
    int64_t nmax;
    size_t esize;
} ring_ctx;

/* The start of every call: this rank's checks, then everyone's descriptors compared. */
static flashc_status ring_begin(ring_ctx *c, MPI_Comm comm, flashc_backend *be,
                                flashc_status local, ring_desc *d)
{
    memset(c, 0, sizeof *c);
    if (comm == MPI_COMM_NULL)
        return flashc_ring_error_(FLASHC_ERROR_INVALID_PARAM, "comm: is MPI_COMM_NULL");
    c->comm = comm;
    MPI_Comm_size(comm, &c->world);
    MPI_Comm_rank(comm, &c->rank);
    c->next = (c->rank + 1) % c->world;
    c->prev = (c->rank + c->world - 1) % c->world;
    if (local == FLASHC_OK && flashc_backend_uses_device_memory(be))
        local = flashc_ring_error_(FLASHC_ERROR_UNSUPPORTED,
                                   "backend: '%s' computes on device memory; use "
                                   "flashc_ring_forward_nccl/backward_nccl",
                                   flashc_backend_name(be));
    d->status = (int32_t)local;
    c->all = (ring_desc *)malloc((size_t)c->world * sizeof *c->all);
    if (!c->all) /* cannot take part in the exchange: MPI itself is out of memory too */
        return flashc_ring_error_(FLASHC_ERROR_OUT_OF_MEMORY, "descriptors: out of memory");
    MPI_Allgather(d, (int)sizeof *d, MPI_BYTE, c->all, (int)sizeof *d, MPI_BYTE, comm);
    flashc_status st = ring_check_all(c->all, c->world, c->rank);
    if (st != FLASHC_OK) {
        free(c->all);
        c->all = NULL;
        return st;
    }
    for (int j = 0; j < c->world; j++)
        if (c->all[j].n_local > c->nmax)
            c->nmax = c->all[j].n_local;
    c->esize = flashc_dtype_size((flashc_dtype)d->dtype);
    return FLASHC_OK;
}

/* Elements of one K (or V) block of rank j. */
static size_t kv_elems(const ring_ctx *c, int j)
{
    const ring_desc *d = &c->all[j];
    return (size_t)(d->batch * d->n_local * d->heads_kv * d->head_dim);
}

static flashc_tensor contiguous(void *data, flashc_dtype dt, const ring_desc *d, int64_t rows,
                                int64_t heads)
{
    return flashc_tensor_contiguous(data, dt, d->batch, rows, heads, d->head_dim);
}

/* K and V of block j, back to back in buf. */
static void block_kv(const ring_ctx *c, int j, void *buf, flashc_tensor *k, flashc_tensor *v)
{
    const ring_desc *d = &c->all[j];
    flashc_dtype dt = (flashc_dtype)d->dtype;
    *k = contiguous(buf, dt, d, d->n_local, d->heads_kv);
    *v = contiguous((char *)buf + kv_elems(c, j) * c->esize, dt, d, d->n_local, d->heads_kv);
}

static void *alloc_all(flashc_status *st, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p && *st == FLASHC_OK)
        *st = flashc_ring_error_(FLASHC_ERROR_OUT_OF_MEMORY,
                                 "ring buffers: out of memory for %zu bytes", bytes);
    return p;
}

/* ---- forward ----------------------------------------------------------------------------- */

typedef struct fwd_state {
    flashc_backend *be;
    const flashc_params *p;
    const flashc_tensor *q;
    flashc_tensor acc_o, acc_l, tmp_o, tmp_l; /* [B, n, Hq, D] f32 / [B, Hq, n] f32, twice */
} fwd_state;

static flashc_status forward_block(fwd_state *f, const ring_ctx *c, int src, void *kvbuf,
                                   int step)
{
    flashc_tensor K, V;
    block_kv(c, src, kvbuf, &K, &V);
    ring_rows qr = ring_rows_of(c->all, c->world, c->rank);
    ring_rows kr = ring_rows_of(c->all, c->world, src);
    ring_call calls[RING_MAX_CALLS];
    int n = ring_plan(c->all[0].causal, &qr, &kr, calls);
    char where[96];
    for (int i = 0; i < n; i++) {
        const ring_call *cl = &calls[i];
        flashc_params pc = *f->p;
        pc.causal = cl->causal;
        flashc_tensor qv = ring_seq_rows(f->q, cl->q0, cl->nq);
        flashc_tensor kv = ring_seq_rows(&K, cl->k0, cl->nk), vv = ring_seq_rows(&V, cl->k0, cl->nk);
        flashc_tensor ov = ring_seq_rows(&f->tmp_o, cl->q0, cl->nq);
        flashc_tensor lv = ring_lse_rows(&f->tmp_l, cl->q0, cl->nq);
        flashc_status st = flashc_forward(f->be, &pc, &qv, &kv, &vv, &ov, &lv);
        if (st == FLASHC_OK) {
            flashc_tensor ao = ring_seq_rows(&f->acc_o, cl->q0, cl->nq);
            flashc_tensor al = ring_lse_rows(&f->acc_l, cl->q0, cl->nq);
            st = flashc_merge_accumulate(f->be, NULL, &ao, &al, &ov, &lv);
        }
        if (st != FLASHC_OK) {
            snprintf(where, sizeof where, "rank %d, step %d (block of rank %d)", c->rank, step,
                     src);
            return ring_flashc_failed(st, where);
        }
    }
    return FLASHC_OK;
}

flashc_status flashc_ring_forward_mpi(MPI_Comm comm, flashc_backend *backend,
                                      const flashc_params *params, int64_t seqlen,
                                      const flashc_tensor *q, const flashc_tensor *k,
                                      const flashc_tensor *v, flashc_tensor *out,
                                      flashc_tensor *lse)
{
    flashc_params p;
    ring_desc d;
    flashc_status st = ring_check_forward(backend, params, seqlen, q, k, v, out, lse, &p, &d);
    ring_ctx c;
    RING_TRY(ring_begin(&c, comm, backend, st, &d));
    const int64_t B = d.batch, n = d.n_local, Hq = d.heads_q, D = d.head_dim;
    const size_t kv_max = (size_t)(B * c.nmax * d.heads_kv * D);
    const size_t q_elems = (size_t)(B * n * Hq * D), l_elems = (size_t)(B * Hq * n);

    st = FLASHC_OK;
    void *kvbuf[2] = {alloc_all(&st, 2 * kv_max * c.esize), alloc_all(&st, 2 * kv_max * c.esize)};
    float *acc_o = (float *)alloc_all(&st, q_elems * sizeof(float));
    float *acc_l = (float *)alloc_all(&st, l_elems * sizeof(float));
    void *tmp_o = alloc_all(&st, q_elems * c.esize);
    float *tmp_l = (float *)alloc_all(&st, l_elems * sizeof(float));
    st = agree(st, comm, c.rank, "to allocate its buffers");

    fwd_state f;
    if (st == FLASHC_OK) {
        f.be = backend;
        f.p = &p;
        f.q = q;
        f.acc_o = contiguous(acc_o, FLASHC_F32, &d, n, Hq);
        f.acc_l = flashc_lse_contiguous(acc_l, B, Hq, n);
        f.tmp_o = contiguous(tmp_o, (flashc_dtype)d.dtype, &d, n, Hq);
        f.tmp_l = flashc_lse_contiguous(tmp_l, B, Hq, n);
        for (size_t i = 0; i < l_elems; i++)
            acc_l[i] = -INFINITY; /* the empty accumulator */
        flashc_tensor K0, V0;
        block_kv(&c, c.rank, kvbuf[0], &K0, &V0);
        ring_host_pack(K0.data, k);
        ring_host_pack(V0.data, v);

        int cur = 0;
        for (int s = 0; s < c.world; s++) {
            int src = (c.rank - s + c.world) % c.world;
            int src_next = (src - 1 + c.world) % c.world;
            req_list rl;
            rl.n = 0;
            if (s < c.world - 1) { /* the next block in flight while this one is computed */
                post(&rl, 1, kvbuf[cur], 2 * kv_elems(&c, src) * c.esize, c.next, TAG_KV, comm);
                post(&rl, 0, kvbuf[cur ^ 1], 2 * kv_elems(&c, src_next) * c.esize, c.prev,
                     TAG_KV, comm);
            }
            if (st == FLASHC_OK)
                st = forward_block(&f, &c, src, kvbuf[cur], s);
            wait_all(&rl);
            cur ^= 1;
        }
        st = agree(st, comm, c.rank, "in the ring");
        if (st == FLASHC_OK) {
            st = flashc_merge(backend, NULL, 1, &f.acc_o, &f.acc_l, out, lse);
            if (st != FLASHC_OK)
                st = ring_flashc_failed(st, "writing out and lse");
        }
    }
    free(kvbuf[0]);
    free(kvbuf[1]);
    free(acc_o);
    free(acc_l);
    free(tmp_o);
    free(tmp_l);
    free(c.all);
    return st;
}

/* ---- backward ---------------------------------------------------------------------------- */

typedef struct bwd_state {
    flashc_backend *be;
    const flashc_params *p;
    const flashc_tensor *dout, *q, *out, *lse;
    float *dq_acc;        /* [B, n, Hq, D] */
    void *tmp_dq;         /* [B, n, Hq, D] of the dtype */
    void *tmp_dk, *tmp_dv; /* [B, nmax, Hkv, D] of the dtype */
} bwd_state;

/* The contribution of block src to dQ (added into dq_acc) and to the block's dK, dV (added
 * into loc: dK then dV, [B, n_src, Hkv, D] float each). */
static flashc_status backward_block(bwd_state *b, const ring_ctx *c, int src, void *kvbuf,
                                    float *loc, int step)
{
    const ring_desc *d = &c->all[src];
    const flashc_dtype dt = (flashc_dtype)d->dtype;
    flashc_tensor K, V;
    block_kv(c, src, kvbuf, &K, &V);
    flashc_tensor tdq = contiguous(b->tmp_dq, dt, &c->all[c->rank], c->all[c->rank].n_local,
                                   d->heads_q);
    flashc_tensor tdk = contiguous(b->tmp_dk, dt, d, d->n_local, d->heads_kv);
    flashc_tensor tdv = contiguous(b->tmp_dv, dt, d, d->n_local, d->heads_kv);
    float *loc_dk = loc, *loc_dv = loc + kv_elems(c, src);
    ring_rows qr = ring_rows_of(c->all, c->world, c->rank);
    ring_rows kr = ring_rows_of(c->all, c->world, src);
    ring_call calls[RING_MAX_CALLS];
    int n = ring_plan(c->all[0].causal, &qr, &kr, calls);
    for (int i = 0; i < n; i++) {
        const ring_call *cl = &calls[i];
        flashc_params pc = *b->p;
        pc.causal = cl->causal;
        flashc_tensor dov = ring_seq_rows(b->dout, cl->q0, cl->nq);
        flashc_tensor qv = ring_seq_rows(b->q, cl->q0, cl->nq);
        flashc_tensor ov = ring_seq_rows(b->out, cl->q0, cl->nq);
        flashc_tensor lv = ring_lse_rows(b->lse, cl->q0, cl->nq);
        flashc_tensor kv = ring_seq_rows(&K, cl->k0, cl->nk), vv = ring_seq_rows(&V, cl->k0, cl->nk);
        flashc_tensor dqv = ring_seq_rows(&tdq, cl->q0, cl->nq);
        flashc_tensor dkv = ring_seq_rows(&tdk, cl->k0, cl->nk);
        flashc_tensor dvv = ring_seq_rows(&tdv, cl->k0, cl->nk);
        flashc_status st =
            flashc_backward(b->be, &pc, &dov, &qv, &kv, &vv, &ov, &lv, &dqv, &dkv, &dvv);
        if (st != FLASHC_OK) {
            char where[96];
            snprintf(where, sizeof where, "rank %d, step %d (block of rank %d), backward",
                     c->rank, step, src);
            return ring_flashc_failed(st, where);
        }
        ring_host_add(b->dq_acc, c->all[c->rank].n_local, cl->q0, &dqv);
        ring_host_add(loc_dk, d->n_local, cl->k0, &dkv);
        ring_host_add(loc_dv, d->n_local, cl->k0, &dvv);
    }
    return FLASHC_OK;
}

flashc_status flashc_ring_backward_mpi(MPI_Comm comm, flashc_backend *backend,
                                       const flashc_params *params, int64_t seqlen,
                                       const flashc_tensor *dout, const flashc_tensor *q,
                                       const flashc_tensor *k, const flashc_tensor *v,
                                       const flashc_tensor *out, const flashc_tensor *lse,
                                       flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv)
{
    flashc_params p;
    ring_desc d;
    flashc_status st = ring_check_backward(backend, params, seqlen, dout, q, k, v, out, lse, dq,
                                           dk, dv, &p, &d);
    ring_ctx c;
    RING_TRY(ring_begin(&c, comm, backend, st, &d));
    const int64_t B = d.batch, n = d.n_local, Hq = d.heads_q, D = d.head_dim;
    const size_t kv_max = (size_t)(B * c.nmax * d.heads_kv * D);
    const size_t q_elems = (size_t)(B * n * Hq * D);

    st = FLASHC_OK;
    void *kvbuf[2] = {alloc_all(&st, 2 * kv_max * c.esize), alloc_all(&st, 2 * kv_max * c.esize)};
    /* dK/dV sums in transit: one being received while the other is still being sent */
    float *dkv[2] = {(float *)alloc_all(&st, 2 * kv_max * sizeof(float)),
                     (float *)alloc_all(&st, 2 * kv_max * sizeof(float))};
    float *loc = (float *)alloc_all(&st, 2 * kv_max * sizeof(float));
    bwd_state b;
    memset(&b, 0, sizeof b);
    b.dq_acc = (float *)calloc(q_elems ? q_elems : 1, sizeof(float));
    if (!b.dq_acc && st == FLASHC_OK)
        st = flashc_ring_error_(FLASHC_ERROR_OUT_OF_MEMORY, "ring buffers: out of memory");
    b.tmp_dq = alloc_all(&st, q_elems * c.esize);
    b.tmp_dk = alloc_all(&st, kv_max * c.esize);
    b.tmp_dv = alloc_all(&st, kv_max * c.esize);
    st = agree(st, comm, c.rank, "to allocate its buffers");

    if (st == FLASHC_OK) {
        b.be = backend;
        b.p = &p;
        b.dout = dout;
        b.q = q;
        b.out = out;
        b.lse = lse;
        flashc_tensor K0, V0;
        block_kv(&c, c.rank, kvbuf[0], &K0, &V0);
        ring_host_pack(K0.data, k);
        ring_host_pack(V0.data, v);

        int cur = 0; /* K/V buffer of this step */
        int t = 0;   /* dK/dV buffer that receives (then sends) this step's sum */
        req_list dsend[2], drecv;
        dsend[0].n = dsend[1].n = drecv.n = 0;
        for (int s = 0; s < c.world; s++) {
            int src = (c.rank - s + c.world) % c.world;
            int src_next = (src - 1 + c.world) % c.world;
            size_t nd = 2 * kv_elems(&c, src); /* floats of the block's dK and dV */
            req_list rl;
            rl.n = 0;
            if (s < c.world - 1) {
                post(&rl, 1, kvbuf[cur], 2 * kv_elems(&c, src) * c.esize, c.next, TAG_KV, comm);
                post(&rl, 0, kvbuf[cur ^ 1], 2 * kv_elems(&c, src_next) * c.esize, c.prev,
                     TAG_KV, comm);
            }
            memset(loc, 0, nd * sizeof(float));
            if (st == FLASHC_OK)
                st = backward_block(&b, &c, src, kvbuf[cur], loc, s);
            /* the sum over the ranks before this one arrived during the compute */
            if (s == 0) {
                memcpy(dkv[t], loc, nd * sizeof(float));
            } else {
                wait_all(&drecv);
                for (size_t i = 0; i < nd; i++)
                    dkv[t][i] += loc[i];
            }
            post(&dsend[t], 1, dkv[t], nd * sizeof(float), c.next, TAG_DKV, comm);
            /* the next sum (after the last step: this rank's own, complete) goes into the
             * other buffer once its previous send has left */
            wait_all(&dsend[t ^ 1]);
            post(&drecv, 0, dkv[t ^ 1], 2 * kv_elems(&c, src_next) * sizeof(float), c.prev,
                 TAG_DKV, comm);
            t ^= 1;
            wait_all(&rl);
            cur ^= 1;
        }
        wait_all(&drecv);
        wait_all(&dsend[0]);
        wait_all(&dsend[1]);
        st = agree(st, comm, c.rank, "in the ring");
        if (st == FLASHC_OK) { /* everything computed: now, and only now, the outputs */
            ring_host_store(dq, b.dq_acc);
            ring_host_store(dk, dkv[t]);
            ring_host_store(dv, dkv[t] + kv_elems(&c, c.rank));
        }
    }
    free(kvbuf[0]);
    free(kvbuf[1]);
    free(dkv[0]);
    free(dkv[1]);
    free(loc);
    free(b.dq_acc);
    free(b.tmp_dq);
    free(b.tmp_dk);
    free(b.tmp_dv);
    free(c.all);
    return st;
}
