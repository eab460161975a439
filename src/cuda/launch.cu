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

/* Copies the element strides of a [batch, seqlen, heads, head_dim] view into a kernel
 * argument struct's <prefix>_sb / _ss / _sh fields (every launcher's structs name them so),
 * and those of a [batch, heads, seqlen] LSE into its lse_sb / lse_sh / lse_ss. */
#define FC_VIEW_STRIDES(args, prefix, t) \
    ((args).prefix##_sb = (t)->stride[0], (args).prefix##_ss = (t)->stride[1], \
     (args).prefix##_sh = (t)->stride[2])
#define FC_LSE_STRIDES(args, t) \
    ((args).lse_sb = (t)->stride[0], (args).lse_sh = (t)->stride[1], (args).lse_ss = (t)->stride[2])

/* The sizes of a problem into a Hopper kernel's argument struct (forward and backward name
 * them alike). */
#define FC_SM90_SIZES(args, pr)                                                            \
    ((args).batch = (int)(pr)->batch, (args).seqlen_q = (int)(pr)->seqlen_q,               \
     (args).seqlen_k = (int)(pr)->seqlen_k, (args).heads_q = (int)(pr)->heads_q,           \
     (args).heads_kv = (int)(pr)->heads_kv, (args).head_dim = (int)(pr)->head_dim)

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

/* The window, softcap, ALiBi and dropout of pr in the Hopper argument struct a (forward or backward,
 * whose feature fields have the same names). */
#define FC_SM90_FEATURES(a, pr)                                                              \
    do {                                                                                     \
        (a).window = ((pr)->features & FLASHC_FEATURE_WINDOW) != 0;                          \
        (a).window_left = (pr)->window_left;                                                 \
        (a).window_right = (pr)->window_right;                                               \
        (a).softcap = ((pr)->features & FLASHC_FEATURE_SOFTCAP) ? (pr)->softcap : 0.0f;      \
        (a).alibi_slopes = ((pr)->features & FLASHC_FEATURE_ALIBI) ? (pr)->alibi_slopes : NULL; \
        (a).alibi_batch_stride = (pr)->alibi_batch_stride;                                   \
        if ((pr)->features & FLASHC_FEATURE_DROPOUT) {                                       \
            (a).dropout_p = (pr)->dropout_p;                                                 \
            (a).dropout_threshold = (pr)->dropout_threshold;                                 \
            (a).dropout_seed = (pr)->dropout_seed;                                           \
            (a).dropout_offset = (pr)->dropout_offset;                                       \
        }                                                                                    \
    } while (0)

/* The varlen batch of pr in a Hopper argument struct (fields named alike in both). */
#define FC_SM90_VARLEN(a, pr)                                                                \
    do {                                                                                     \
        if ((pr)->features & FLASHC_FEATURE_VARLEN) {                                        \
            (a).cu_seqlens_q = (pr)->cu_seqlens_q;                                           \
            (a).cu_seqlens_k = (pr)->cu_seqlens_k;                                           \
            (a).num_seqs = (int)(pr)->num_seqs;                                              \
            (a).max_seqlen_q = (int)(pr)->max_seqlen_q;                                      \
            (a).max_seqlen_k = (int)(pr)->max_seqlen_k;                                      \
        }                                                                                    \
    } while (0)

/* Runs the forward on the Hopper kernel when it serves the call (plain attention or window,
 * softcap, ALiBi; a head dim it covers, TMA-compatible views): returns 1 with *err set, or 0
 * to use mma.sync. */
static int try_sm90_forward(const fc_cuda_state *s, const flashc_problem *pr, const flashc_tensor *q,
                            const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *out,
                            flashc_tensor *lse, cudaError_t *err)
{
    if (!s->use_wgmma || !sm90_serves_features(pr)) return 0;
    fc_sm90_fwd_args h;
    memset(&h, 0, sizeof h);
    h.q = q->data, h.k = k->data, h.v = v->data, h.o = out->data;
    h.lse = (float *)lse->data;
    FC_VIEW_STRIDES(h, q, q);
    FC_VIEW_STRIDES(h, k, k);
    FC_VIEW_STRIDES(h, v, v);
    FC_VIEW_STRIDES(h, o, out);
    FC_LSE_STRIDES(h, lse);
    FC_SM90_SIZES(h, pr);
    h.bf16 = pr->dtype == FLASHC_BF16;
    h.scale = pr->scale;
    h.causal = pr->causal;
    FC_SM90_FEATURES(h, pr);
    FC_SM90_VARLEN(h, pr);
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
    int kd = 0;
    flashc_status st = check_problem(s, pr, 0, &kd);
    if (st != FLASHC_OK) return st;
    fc_device_guard guard;
    if ((st = fc_guard_enter(&guard, s)) != FLASHC_OK) return st;
    if ((st = fc_check_tensor(s, q, "q")) != FLASHC_OK || (st = fc_check_tensor(s, k, "k")) != FLASHC_OK ||
        (st = fc_check_tensor(s, v, "v")) != FLASHC_OK || (st = fc_check_tensor(s, out, "out")) != FLASHC_OK ||
        (st = fc_check_device_pointer(s, lse->data, "lse")) != FLASHC_OK) {
        fc_guard_leave(&guard);
        return st;
    }

    fc_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = (const uint16_t *)q->data;
    a.k = (const uint16_t *)k->data;
    a.v = (const uint16_t *)v->data;
    a.o = (uint16_t *)out->data;
    a.lse = (float *)lse->data;
    FC_VIEW_STRIDES(a, q, q);
    FC_VIEW_STRIDES(a, k, k);
    FC_VIEW_STRIDES(a, v, v);
    FC_VIEW_STRIDES(a, o, out);
    FC_LSE_STRIDES(a, lse);
    a.seqlen_q = (int)pr->seqlen_q;
    a.seqlen_k = (int)pr->seqlen_k;
    a.heads_q = (int)pr->heads_q;
    a.heads_kv = (int)pr->heads_kv;
    a.group = (int)(pr->heads_q / pr->heads_kv);
    a.head_dim = (int)pr->head_dim;
    a.scale_log2 = pr->scale * 1.4426950408889634f;
    a.causal = pr->causal != FLASHC_CAUSAL_NONE;
    a.causal_offset = (int)flashc_causal_offset(pr);
    fc_feat_from_problem(&a.f, pr);

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
    memset(&h, 0, sizeof h);
    h.q = q->data, h.k = k->data, h.v = v->data, h.o = out->data, h.dout = dout->data;
    h.lse = (const float *)lse->data;
    h.dq = dq->data, h.dk = dk->data, h.dv = dv->data;
    FC_VIEW_STRIDES(h, q, q);
    FC_VIEW_STRIDES(h, k, k);
    FC_VIEW_STRIDES(h, v, v);
    FC_VIEW_STRIDES(h, o, out);
    FC_VIEW_STRIDES(h, do, dout);
    FC_VIEW_STRIDES(h, dq, dq);
    FC_VIEW_STRIDES(h, dk, dk);
    FC_VIEW_STRIDES(h, dv, dv);
    FC_LSE_STRIDES(h, lse);
    FC_SM90_SIZES(h, pr);
    h.bf16 = pr->dtype == FLASHC_BF16;
    h.scale = pr->scale;
    h.causal = pr->causal;
    h.deterministic = pr->deterministic != 0;
    h.num_sms = s->num_sms;
    FC_SM90_FEATURES(h, pr);
    FC_SM90_VARLEN(h, pr);
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
    if (!pr->workspace) {
        const cudaError_t err2 = cudaFreeAsync(ws, stream);
        if (err == cudaSuccess && err2 != cudaSuccess) {
            err = err2;
            what = "cudaFreeAsync (backward workspace)";
        }
    }
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
        memset(&h, 0, sizeof h);
        FC_SM90_SIZES(h, pr);
        FC_SM90_VARLEN(h, pr);
        FC_SM90_FEATURES(h, pr);
        h.causal = pr->causal;
        h.deterministic = pr->deterministic != 0;
        h.num_sms = s->num_sms; /* the GQA split's fp32 dK and dV depend on it */
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
    int kd = 0;
    flashc_status st = check_problem(s, pr, 1, &kd);
    if (st != FLASHC_OK) return st;
    fc_device_guard guard;
    if ((st = fc_guard_enter(&guard, s)) != FLASHC_OK) return st;
    if ((st = fc_check_tensor(s, dout, "dout")) != FLASHC_OK || (st = fc_check_tensor(s, q, "q")) != FLASHC_OK ||
        (st = fc_check_tensor(s, k, "k")) != FLASHC_OK || (st = fc_check_tensor(s, v, "v")) != FLASHC_OK ||
        (st = fc_check_tensor(s, out, "out")) != FLASHC_OK ||
        (st = fc_check_device_pointer(s, lse->data, "lse")) != FLASHC_OK ||
        (st = fc_check_tensor(s, dq, "dq")) != FLASHC_OK || (st = fc_check_tensor(s, dk, "dk")) != FLASHC_OK ||
        (st = fc_check_tensor(s, dv, "dv")) != FLASHC_OK) {
        fc_guard_leave(&guard);
        return st;
    }
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
    memset(&a, 0, sizeof a);
    a.q = (const uint16_t *)q->data;
    a.k = (const uint16_t *)k->data;
    a.v = (const uint16_t *)v->data;
    a.o = (const uint16_t *)out->data;
    a.dout = (const uint16_t *)dout->data;
    a.lse = (const float *)lse->data;
    a.dq = (uint16_t *)dq->data;
    a.dk = (uint16_t *)dk->data;
    a.dv = (uint16_t *)dv->data;
    FC_VIEW_STRIDES(a, q, q);
    FC_VIEW_STRIDES(a, k, k);
    FC_VIEW_STRIDES(a, v, v);
    FC_VIEW_STRIDES(a, o, out);
    FC_VIEW_STRIDES(a, do, dout);
    FC_VIEW_STRIDES(a, dq, dq);
    FC_VIEW_STRIDES(a, dk, dk);
    FC_VIEW_STRIDES(a, dv, dv);
    FC_LSE_STRIDES(a, lse);
    a.lse2 = (float *)(ws + lay.lse2_off);
    a.delta = (float *)(ws + lay.delta_off);
    a.dq_accum = pr->deterministic ? NULL : (float *)(ws + lay.dq_off);
    a.seqlen_q = (int)pr->seqlen_q;
    a.seqlen_k = (int)pr->seqlen_k;
    a.heads_q = (int)pr->heads_q;
    a.heads_kv = (int)pr->heads_kv;
    a.group = (int)(pr->heads_q / pr->heads_kv);
    a.head_dim = (int)pr->head_dim;
    a.nq_pad = (int)lay.nq_pad;
    a.dq_pitch = kd;
    a.scale = pr->scale;
    a.scale_log2 = pr->scale * 1.4426950408889634f;
    a.causal = pr->causal != FLASHC_CAUSAL_NONE;
    a.causal_offset = (int)flashc_causal_offset(pr);
    fc_feat_from_problem(&a.f, pr);

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
    if (owned) {
        cudaError_t err2 = cudaFreeAsync(ws, stream);
        if (err == cudaSuccess && err2 != cudaSuccess) {
            err = err2;
            what = "cudaFreeAsync (backward workspace)";
        }
    }
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
