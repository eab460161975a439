/*
 * launch.cu - the CUDA backend's entry points (flashc_cuda_backend_ops): device selection,
 * the checks a kernel needs beyond api.c's validation (device memory, 16-byte alignment,
 * limits of the grid and of shared memory), the backward workspace, dispatch to the kernels
 * by head dim and dtype, and every CUDA error turned into a status with a message.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common.cuh"
#include "decode.h"
#include "runtime.h"
#include "varlen.cuh"
#ifdef FLASHC_HAVE_SM90
#include "hopper/bwd_sm90.h"
#include "hopper/fwd_sm90.h"
#endif

/* Points a kernel argument struct's field ptr at the data of the [batch, seqlen, heads,
 * head_dim] view t, in the pointer type the struct gives it, and copies the view's element
 * strides into its <prefix>_sb / _ss / _sh fields (every launcher's structs name them so);
 * FC_LSE_VIEW the same for a [batch, heads, seqlen] LSE (lse, lse_sb / lse_sh / lse_ss). */
#define FC_VIEW(args, ptr, prefix, t)                                                          \
    ((args).ptr = static_cast<decltype((args).ptr)>((t)->data), (args).prefix##_sb = (t)->stride[0], \
     (args).prefix##_ss = (t)->stride[1], (args).prefix##_sh = (t)->stride[2])
#define FC_LSE_VIEW(args, t)                                                                   \
    ((args).lse = static_cast<decltype((args).lse)>((t)->data), (args).lse_sb = (t)->stride[0], \
     (args).lse_sh = (t)->stride[1], (args).lse_ss = (t)->stride[2])

static const int kernel_head_dims[] = {32, 64, 96, 128, 192, 256};

/* A head dim that is a multiple of 8 runs on the next compiled size up: the extra columns
 * are zero-filled on load and never stored. */
int fc_kernel_head_dim(int head_dim)
{
    if (head_dim <= 0 || head_dim % 8 != 0) return 0;
    for (size_t i = 0; i < sizeof kernel_head_dims / sizeof kernel_head_dims[0]; i++)
        if (head_dim <= kernel_head_dims[i]) return kernel_head_dims[i];
    return 0;
}

static int cuda_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    for (int d = 0; d < n; d++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess &&
            major >= 8)
            return 1;
    }
    return 0;
}

static flashc_status cuda_create(const flashc_backend_config *cfg, void **state)
{
    *state = NULL;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE, "cuda: no CUDA device found (%s)",
                            err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    }
    int device = cfg ? cfg->device : -1;
    if (device < 0) {
        err = cudaGetDevice(&device);
        if (err != cudaSuccess) return fc_cuda_error(err, "cudaGetDevice");
    }
    if (device >= count)
        return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                            "cuda: device %d asked for, but only %d device(s) present", device, count);
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) return fc_cuda_error(err, "cudaGetDeviceProperties");
    if (prop.major < 8)
        return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                            "cuda: device %d (%s) is sm_%d%d; the CUDA backend needs sm_80 or later",
                            device, prop.name, prop.major, prop.minor);
    const char *kernels = cfg ? cfg->cuda_kernels : NULL;
    const char *env = getenv("FLASHC_CUDA_KERNELS");
    if ((!kernels || !*kernels || strcmp(kernels, "auto") == 0) && env && *env) kernels = env;
    int force_mma = 0;
    if (kernels && *kernels && strcmp(kernels, "auto") != 0) {
        if (strcmp(kernels, "mma") != 0)
            return flashc_error(FLASHC_ERROR_INVALID_PARAM,
                                "cuda_kernels: '%.32s' is not a kernel family: use \"auto\" or "
                                "\"mma\"", kernels);
        force_mma = 1;
    }
    fc_cuda_state *s = (fc_cuda_state *)calloc(1, sizeof *s);
    if (!s) return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "cuda: out of host memory");
    s->device = device;
    s->sm_major = prop.major;
    s->sm_minor = prop.minor;
    s->num_sms = prop.multiProcessorCount;
    s->smem_optin = prop.sharedMemPerBlockOptin;
#ifdef FLASHC_HAVE_SM90
    s->use_wgmma = !force_mma && prop.major == 9 && prop.minor == 0;
#else
    (void)force_mma;
#endif
    snprintf(s->name, sizeof s->name, "%s", prop.name);
    *state = s;
    return FLASHC_OK;
}

static void cuda_destroy(void *state)
{
    free(state);
}

static void cuda_describe(void *state, char *buf, size_t size)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    snprintf(buf, size, "cuda: device %d, %s (sm_%d%d, %d SMs), %s", s->device, s->name,
             s->sm_major, s->sm_minor, s->num_sms,
             s->use_wgmma ? "wgmma forward (head dims 40..256) and backward (64, 128), mma.sync kernels otherwise"
                          : "mma.sync kernels");
}

/* ---- argument checks the kernels need -------------------------------------------------- */

static flashc_status check_problem(const fc_cuda_state *s, const flashc_problem *pr, int backward,
                                   int *kernel_d)
{
    if (pr->dtype != FLASHC_F16 && pr->dtype != FLASHC_BF16)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: inputs must be fp16 or bf16 (float32 is served by the CPU backend)");
    if (pr->out_dtype != pr->dtype)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "cuda: outputs must have the inputs' dtype");
    *kernel_d = fc_kernel_head_dim((int)pr->head_dim);
    if (*kernel_d == 0)
        return flashc_error(FLASHC_ERROR_INVALID_HEAD_DIM,
                            "cuda: head_dim %lld is not served: the CUDA kernels need a multiple "
                            "of 8 up to 256", (long long)pr->head_dim);
    if (pr->seqlen_q > 0x7fff0000LL || pr->seqlen_k > 0x7fff0000LL)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED, "cuda: seqlen above 2^31 - 2^16 is not served");
    if (pr->heads_q > 65535 || pr->batch > 65535)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: batch and heads must each be at most 65535 (grid limits)");
    if ((pr->features & FLASHC_FEATURE_VARLEN) && pr->num_seqs > 65535)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: num_seqs %lld is above 65535 (grid limit)", (long long)pr->num_seqs);
    /* the sequences' offsets and the slopes live in device memory: api.c could not read
     * them, so at least make sure a kernel can */
    flashc_status st = FLASHC_OK;
    if (pr->features & FLASHC_FEATURE_VARLEN) {
        if ((st = fc_check_device_pointer(s, pr->cu_seqlens_q, "params.cu_seqlens_q")) != FLASHC_OK ||
            (st = fc_check_device_pointer(s, pr->cu_seqlens_k, "params.cu_seqlens_k")) != FLASHC_OK)
            return st;
    }
    if ((pr->features & FLASHC_FEATURE_ALIBI) &&
        (st = fc_check_device_pointer(s, pr->alibi_slopes, "params.alibi_slopes")) != FLASHC_OK)
        return st;
    size_t need = backward ? (pr->features ? fc_bwd_feat_smem_bytes(*kernel_d, pr->deterministic)
                                           : fc_bwd_smem_bytes(*kernel_d, pr->deterministic,
                                                               s->smem_optin, s->sm_major))
                           : fc_fwd_smem_bytes(*kernel_d);
    if (need > s->smem_optin)
        return flashc_error(FLASHC_ERROR_UNSUPPORTED,
                            "cuda: head_dim %lld needs %zu bytes of shared memory per block; %s "
                            "allows %zu", (long long)pr->head_dim, need, s->name, s->smem_optin);
    return FLASHC_OK;
}

/* A tensor of a call, named as its error messages name it. fc_check_tensor's checks are those
 * of a [batch, seqlen, heads, head_dim] view read in 16-byte vectors; the LSE, float [batch,
 * heads, seqlen] read one value at a time, gets only the pointer check (pointer_only). */
typedef struct named_tensor {
    const flashc_tensor *t;
    const char *what;
    int pointer_only;
} named_tensor;

/* What the forward and the backward check before anything runs, in this order: the problem,
 * the backend's device made current, then each tensor in the order given, so that the first
 * bad one is the one reported. FLASHC_OK with the guard entered, or the error with it not
 * held. */
static flashc_status enter_checked(const fc_cuda_state *s, const flashc_problem *pr, int backward, int *kernel_d,
                                   fc_device_guard *guard, const named_tensor *tensors, size_t n)
{
    flashc_status st = check_problem(s, pr, backward, kernel_d);
    if (st != FLASHC_OK) return st;
    if ((st = fc_guard_enter(guard, s)) != FLASHC_OK) return st;
    for (size_t i = 0; i < n; i++) {
        const named_tensor *t = &tensors[i];
        st = t->pointer_only ? fc_check_device_pointer(s, t->t->data, t->what) : fc_check_tensor(s, t->t, t->what);
        if (st != FLASHC_OK) {
            fc_guard_leave(guard);
            return st;
        }
    }
    return FLASHC_OK;
}

/* ---- kernel arguments ------------------------------------------------------------------ */

/* q, k, v, out and lse in a kernel argument struct: the four launchers' structs (mma.sync and
 * Hopper, forward and backward) name their fields alike and differ only in the pointers'
 * types. */
template <typename A>
static void set_views(A *a, const flashc_tensor *q, const flashc_tensor *k, const flashc_tensor *v,
                      const flashc_tensor *out, const flashc_tensor *lse)
{
    FC_VIEW(*a, q, q, q);
    FC_VIEW(*a, k, k, k);
    FC_VIEW(*a, v, v, v);
    FC_VIEW(*a, o, o, out);
    FC_LSE_VIEW(*a, lse);
}

/* The same for the backward's dout, dq, dk and dv (both backward structs). */
template <typename A>
static void set_grad_views(A *a, const flashc_tensor *dout, const flashc_tensor *dq, const flashc_tensor *dk,
                           const flashc_tensor *dv)
{
    FC_VIEW(*a, dout, do, dout);
    FC_VIEW(*a, dq, dq, dq);
    FC_VIEW(*a, dk, dk, dk);
    FC_VIEW(*a, dv, dv, dv);
}

/* A zeroed mma.sync argument struct (fc_fwd_args or fc_bwd_args) with the problem's sizes,
 * scale, causal diagonal and features, which both name alike. */
template <typename A>
static void mma_args_init(A *a, const flashc_problem *pr)
{
    memset(a, 0, sizeof *a);
    a->seqlen_q = (int)pr->seqlen_q;
    a->seqlen_k = (int)pr->seqlen_k;
    a->heads_q = (int)pr->heads_q;
    a->heads_kv = (int)pr->heads_kv;
    a->group = (int)(pr->heads_q / pr->heads_kv);
    a->head_dim = (int)pr->head_dim;
    a->scale_log2 = pr->scale * 1.4426950408889634f;
    a->causal = pr->causal != FLASHC_CAUSAL_NONE;
    a->causal_offset = (int)flashc_causal_offset(pr);
    fc_feat_from_problem(&a->f, pr);
}

/* ---- forward --------------------------------------------------------------------------- */

#ifdef FLASHC_HAVE_SM90
/* The features the Hopper kernels compute themselves (their feature instantiations): window,
 * softcap, ALiBi, varlen and dropout, forward and backward. */
static int sm90_serves_features(const flashc_problem *pr)
{
    const uint32_t served = FLASHC_FEATURE_WINDOW | FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI |
                            FLASHC_FEATURE_VARLEN | FLASHC_FEATURE_DROPOUT;
    return (pr->features & ~served) == 0;
}

/* A zeroed Hopper argument struct (forward or backward, which name these fields alike) with
 * the problem: sizes, dtype, scale, causal mask, and the window, softcap, ALiBi, dropout and
 * varlen batch of the features it uses (a feature off stays zero, the kernels' "off"). */
template <typename A>
static void sm90_args_init(A *h, const flashc_problem *pr)
{
    memset(h, 0, sizeof *h);
    h->batch = (int)pr->batch, h->seqlen_q = (int)pr->seqlen_q, h->seqlen_k = (int)pr->seqlen_k;
    h->heads_q = (int)pr->heads_q, h->heads_kv = (int)pr->heads_kv, h->head_dim = (int)pr->head_dim;
    h->bf16 = pr->dtype == FLASHC_BF16;
    h->scale = pr->scale;
    h->causal = pr->causal;
    h->window = (pr->features & FLASHC_FEATURE_WINDOW) != 0;
    h->window_left = pr->window_left;
    h->window_right = pr->window_right;
    h->softcap = (pr->features & FLASHC_FEATURE_SOFTCAP) ? pr->softcap : 0.0f;
    h->alibi_slopes = (pr->features & FLASHC_FEATURE_ALIBI) ? pr->alibi_slopes : NULL;
    h->alibi_batch_stride = pr->alibi_batch_stride;
    if (pr->features & FLASHC_FEATURE_DROPOUT) {
        h->dropout_p = pr->dropout_p;
        h->dropout_threshold = pr->dropout_threshold;
        h->dropout_seed = pr->dropout_seed;
        h->dropout_offset = pr->dropout_offset;
    }
    if (pr->features & FLASHC_FEATURE_VARLEN) {
        h->cu_seqlens_q = pr->cu_seqlens_q;
        h->cu_seqlens_k = pr->cu_seqlens_k;
        h->num_seqs = (int)pr->num_seqs;
        h->max_seqlen_q = (int)pr->max_seqlen_q;
        h->max_seqlen_k = (int)pr->max_seqlen_k;
    }
}

/* sm90_args_init for the backward, with what its workspace size also depends on: the
 * deterministic mode and the SM count (a split GQA group's fp32 dK and dV). The size is asked
 * for before the call (cuda_backward_workspace_size) and at it (try_sm90_backward): a
 * workspace sized by the first must serve the second. */
static void sm90_bwd_args_init(fc_sm90_bwd_args *h, const fc_cuda_state *s, const flashc_problem *pr)
{
    sm90_args_init(h, pr);
    h->deterministic = pr->deterministic != 0;
    h->num_sms = s->num_sms;
}

/* Runs the forward on the Hopper kernel when it serves the call (plain attention or window,
 * softcap, ALiBi; a head dim it covers, TMA-compatible views): returns 1 with *err set, or 0
 * to use mma.sync. */
static int try_sm90_forward(const fc_cuda_state *s, const flashc_problem *pr, const flashc_tensor *q,
                            const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *out,
                            flashc_tensor *lse, cudaError_t *err)
{
    if (!s->use_wgmma || !sm90_serves_features(pr)) return 0;
    fc_sm90_fwd_args h;
    sm90_args_init(&h, pr);
    set_views(&h, q, k, v, out, lse);
    if (!fc_sm90_forward_supported(&h, s->sm_major, s->sm_minor, s->smem_optin)) return 0;
    *err = fc_sm90_forward(&h, (cudaStream_t)pr->stream);
    return 1;
}
#endif

static flashc_status cuda_forward(void *state, const flashc_problem *pr, const flashc_tensor *q,
                                  const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *out,
                                  flashc_tensor *lse)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    const named_tensor tensors[] = {{q, "q", 0}, {k, "k", 0}, {v, "v", 0}, {out, "out", 0}, {lse, "lse", 1}};
    int kd = 0;
    fc_device_guard guard;
    flashc_status st = enter_checked(s, pr, 0, &kd, &guard, tensors, sizeof tensors / sizeof tensors[0]);
    if (st != FLASHC_OK) return st;

    fc_fwd_args a;
    mma_args_init(&a, pr);
    set_views(&a, q, k, v, out, lse);

    cudaError_t err = cudaSuccess;
#ifdef FLASHC_HAVE_SM90
    if (!try_sm90_forward(s, pr, q, k, v, out, lse, &err))
#endif
        err = fc_launch_fwd(&a, kd, pr->dtype == FLASHC_BF16, (int)flashc_num_seqs(pr),
                            (cudaStream_t)pr->stream);
    fc_guard_leave(&guard);
    if (err != cudaSuccess) return fc_cuda_error(err, "forward kernel launch");
    return FLASHC_OK;
}

/* ---- backward -------------------------------------------------------------------------- */

typedef struct bwd_layout {
    int64_t nq_pad;
    size_t lse2_off, delta_off, dq_off, total;
} bwd_layout;

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static bwd_layout workspace_layout(const flashc_problem *pr)
{
    bwd_layout l;
    const int kd = fc_kernel_head_dim((int)pr->head_dim);
    l.nq_pad = (pr->seqlen_q + FC_NQ_PAD_MULTIPLE - 1) / FC_NQ_PAD_MULTIPLE * FC_NQ_PAD_MULTIPLE;
    if (pr->features & FLASHC_FEATURE_VARLEN) /* per head: the packed sequences, each padded
                                                 (varlen.cuh) */
        l.nq_pad = FC_VARLEN_WS_ROWS(pr->seqlen_q, pr->num_seqs);
    const size_t rows = (size_t)pr->batch * (size_t)pr->heads_q * (size_t)l.nq_pad;
    l.lse2_off = 0;
    l.delta_off = align_up(rows * sizeof(float), 256);
    l.dq_off = l.delta_off + align_up(rows * sizeof(float), 256);
    l.total = l.dq_off + (pr->deterministic ? 0 : align_up(rows * (size_t)kd * sizeof(float), 256));
    return l;
}

/* Frees, behind the stream's kernels, a backward workspace the call allocated itself. A
 * failed free becomes the call's error only when all before it succeeded: the first error
 * says the most. */
static void free_own_workspace(void *ws, cudaStream_t stream, cudaError_t *err, const char **what)
{
    const cudaError_t err2 = cudaFreeAsync(ws, stream);
    if (*err == cudaSuccess && err2 != cudaSuccess) {
        *err = err2;
        *what = "cudaFreeAsync (backward workspace)";
    }
}

#ifdef FLASHC_HAVE_SM90
/* Runs the backward on the Hopper kernels when they serve the call (plain attention, head dim
 * 64 or 128, TMA-compatible views), with their own workspace layout: returns 1 with *st set,
 * or 0 to use mma.sync. */
static int try_sm90_backward(const fc_cuda_state *s, const flashc_problem *pr,
                             const flashc_tensor *dout, const flashc_tensor *q,
                             const flashc_tensor *k, const flashc_tensor *v,
                             const flashc_tensor *out, const flashc_tensor *lse, flashc_tensor *dq,
                             flashc_tensor *dk, flashc_tensor *dv, flashc_status *st)
{
    if (!s->use_wgmma || !sm90_serves_features(pr)) return 0;
    fc_sm90_bwd_args h;
    sm90_bwd_args_init(&h, s, pr);
    set_views(&h, q, k, v, out, lse);
    set_grad_views(&h, dout, dq, dk, dv);
    if (!fc_sm90_backward_supported(&h, s->sm_major, s->sm_minor, s->smem_optin)) return 0;
    const size_t need = fc_sm90_backward_workspace_size(&h);
    cudaStream_t stream = (cudaStream_t)pr->stream;
    void *ws = pr->workspace;
    if (ws) {
        /* A caller's workspace the kernels cannot use (too small for this layout, or not
         * 256-byte aligned) goes to the mma.sync path, which checks it itself. */
        if (pr->workspace_size < need || (uintptr_t)ws % 256 != 0) return 0;
        if ((*st = fc_check_device_pointer(s, ws, "workspace")) != FLASHC_OK) return 1;
    } else {
        cudaError_t err = cudaMallocAsync(&ws, need, stream);
        if (err != cudaSuccess) {
            *st = fc_cuda_error(err, "cudaMallocAsync (backward workspace)");
            return 1;
        }
    }
    h.workspace = ws;
    h.workspace_bytes = need;
    cudaError_t err = fc_sm90_backward(&h, stream);
    const char *what = "backward kernel launch (sm_90a)";
    if (!pr->workspace) free_own_workspace(ws, stream, &err, &what);
    *st = err == cudaSuccess ? FLASHC_OK : fc_cuda_error(err, what);
    return 1;
}
#endif

static size_t cuda_backward_workspace_size(void *state, const flashc_problem *pr)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    if (fc_kernel_head_dim((int)pr->head_dim) == 0) return 0;
    size_t total = workspace_layout(pr).total;
#ifdef FLASHC_HAVE_SM90
    /* Enough for either path: which one runs depends on the views, known only at the call. */
    if (s && s->use_wgmma && sm90_serves_features(pr)) {
        fc_sm90_bwd_args h;
        sm90_bwd_args_init(&h, s, pr);
        if (fc_sm90_backward_smem_bytes(h.head_dim) != 0) {
            const size_t need = fc_sm90_backward_workspace_size(&h);
            if (need > total) total = need;
        }
    }
#else
    (void)s;
#endif
    return total;
}

static flashc_status cuda_backward(void *state, const flashc_problem *pr, const flashc_tensor *dout,
                                   const flashc_tensor *q, const flashc_tensor *k,
                                   const flashc_tensor *v, const flashc_tensor *out,
                                   const flashc_tensor *lse, flashc_tensor *dq, flashc_tensor *dk,
                                   flashc_tensor *dv)
{
    const fc_cuda_state *s = (const fc_cuda_state *)state;
    const named_tensor tensors[] = {{dout, "dout", 0}, {q, "q", 0},   {k, "k", 0},   {v, "v", 0},  {out, "out", 0},
                                    {lse, "lse", 1},   {dq, "dq", 0}, {dk, "dk", 0}, {dv, "dv", 0}};
    int kd = 0;
    fc_device_guard guard;
    flashc_status st = enter_checked(s, pr, 1, &kd, &guard, tensors, sizeof tensors / sizeof tensors[0]);
    if (st != FLASHC_OK) return st;
#ifdef FLASHC_HAVE_SM90
    if (try_sm90_backward(s, pr, dout, q, k, v, out, lse, dq, dk, dv, &st)) {
        fc_guard_leave(&guard);
        return st;
    }
#endif

    const bwd_layout lay = workspace_layout(pr);
    cudaStream_t stream = (cudaStream_t)pr->stream;
    unsigned char *ws = (unsigned char *)pr->workspace;
    int owned = 0;
    cudaError_t err = cudaSuccess;
    if (ws) {
        if (pr->workspace_size < lay.total) {
            fc_guard_leave(&guard);
            return flashc_error(FLASHC_ERROR_WORKSPACE_TOO_SMALL,
                                "cuda: workspace of %zu bytes, the backward needs %zu",
                                pr->workspace_size, lay.total);
        }
        if ((uintptr_t)ws % 16 != 0) {
            fc_guard_leave(&guard);
            return flashc_error(FLASHC_ERROR_INVALID_POINTER, "cuda: workspace is not 16-byte aligned");
        }
        if ((st = fc_check_device_pointer(s, ws, "workspace")) != FLASHC_OK) {
            fc_guard_leave(&guard);
            return st;
        }
    } else {
        /* Stream-ordered: the memory is ready for this stream's kernels and is freed behind
         * them, without a device-wide synchronization. */
        err = cudaMallocAsync((void **)&ws, lay.total, stream);
        if (err != cudaSuccess) {
            fc_guard_leave(&guard);
            return fc_cuda_error(err, "cudaMallocAsync (backward workspace)");
        }
        owned = 1;
    }

    fc_bwd_args a;
    mma_args_init(&a, pr);
    set_views(&a, q, k, v, out, lse);
    set_grad_views(&a, dout, dq, dk, dv);
    a.lse2 = (float *)(ws + lay.lse2_off);
    a.delta = (float *)(ws + lay.delta_off);
    a.dq_accum = pr->deterministic ? NULL : (float *)(ws + lay.dq_off);
    a.nq_pad = (int)lay.nq_pad;
    a.dq_pitch = kd;
    a.scale = pr->scale;

    const char *what = "backward kernel launch";
    if (pr->features & FLASHC_FEATURE_VARLEN) {
        /* the rows between the sequences, which the kernels read as padding: LSE and delta 0
         * (finite, so that a masked entry's dS stays 0) */
        err = cudaMemsetAsync(ws, 0, lay.dq_off, stream);
        what = "cudaMemsetAsync (backward workspace)";
    }
    if (err == cudaSuccess && !pr->deterministic) {
        err = cudaMemsetAsync(ws + lay.dq_off, 0, lay.total - lay.dq_off, stream);
        what = "cudaMemsetAsync (dQ accumulator)";
    }
    if (err == cudaSuccess) {
        err = fc_launch_bwd(&a, kd, pr->dtype == FLASHC_BF16, (int)flashc_num_seqs(pr), pr->deterministic != 0,
                            s->smem_optin, s->sm_major, stream);
        what = "backward kernel launch";
    }
    if (owned) free_own_workspace(ws, stream, &err, &what);
    fc_guard_leave(&guard);
    if (err != cudaSuccess) return fc_cuda_error(err, what);
    return FLASHC_OK;
}

/* ---- memory of the backend's kind --------------------------------------------------------- */

static flashc_status cuda_malloc(void *state, size_t bytes, void **ptr)
{
    fc_device_guard guard;
    flashc_status st = fc_guard_enter(&guard, (const fc_cuda_state *)state);
    if (st != FLASHC_OK) return st;
    cudaError_t err = cudaMalloc(ptr, bytes); /* 256-byte aligned */
    fc_guard_leave(&guard);
    if (err != cudaSuccess) {
        *ptr = NULL;
        return fc_cuda_error(err, "cudaMalloc");
    }
    return FLASHC_OK;
}

static void cuda_free(void *state, void *ptr)
{
    fc_device_guard guard;
    if (fc_guard_enter(&guard, (const fc_cuda_state *)state) != FLASHC_OK) return;
    cudaFree(ptr);
    cudaGetLastError();
    fc_guard_leave(&guard);
}

static flashc_status cuda_memcpy(void *state, void *dst, const void *src, size_t bytes,
                                 flashc_copy_kind kind)
{
    fc_device_guard guard;
    flashc_status st = fc_guard_enter(&guard, (const fc_cuda_state *)state);
    if (st != FLASHC_OK) return st;
    cudaError_t err = cudaMemcpy(dst, src, bytes,
                                 kind == FLASHC_COPY_TO_BACKEND ? cudaMemcpyHostToDevice
                                                                : cudaMemcpyDeviceToHost);
    fc_guard_leave(&guard);
    return err == cudaSuccess ? FLASHC_OK : fc_cuda_error(err, "cudaMemcpy");
}

static flashc_status cuda_synchronize(void *state, void *stream)
{
    fc_device_guard guard;
    flashc_status st = fc_guard_enter(&guard, (const fc_cuda_state *)state);
    if (st != FLASHC_OK) return st;
    cudaError_t err = cudaStreamSynchronize((cudaStream_t)stream);
    fc_guard_leave(&guard);
    return err == cudaSuccess ? FLASHC_OK : fc_cuda_error(err, "cudaStreamSynchronize");
}

extern "C" const flashc_backend_ops flashc_cuda_backend_ops = {
    "cuda",
    1, /* uses_device_memory */
    0, /* accepts_f32_outputs */
    cuda_available,
    cuda_create,
    cuda_destroy,
    cuda_describe,
    cuda_forward,
    cuda_backward,
    cuda_backward_workspace_size,
    cuda_malloc,
    cuda_free,
    cuda_memcpy,
    cuda_synchronize,
    fc_cuda_merge,
    FLASHC_FEATURE_WINDOW | FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI | FLASHC_FEATURE_VARLEN |
        FLASHC_FEATURE_DROPOUT, /* features */
    fc_cuda_forward_kvcache,
    fc_cuda_kvcache_workspace_size,
};
