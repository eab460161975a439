/*
 * runtime.cu - the CUDA backend's shared host helpers (runtime.h): error statuses, the
 * device guard, and the device-pointer and alignment checks of tensors.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "runtime.h"

flashc_status fc_cuda_error(cudaError_t err, const char *what)
{
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    if (err == cudaErrorMemoryAllocation)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "cuda: %s: %s", what, cudaGetErrorString(err));
    return flashc_error(FLASHC_ERROR_DEVICE, "cuda: %s: %s (%s)", what, cudaGetErrorString(err),
                        cudaGetErrorName(err));
}

flashc_status fc_guard_enter(fc_device_guard *g, const fc_cuda_state *s)
{
    g->changed = 0;
    cudaError_t err = cudaGetDevice(&g->previous);
    if (err != cudaSuccess) return fc_cuda_error(err, "cudaGetDevice");
    if (g->previous != s->device) {
        err = cudaSetDevice(s->device);
        if (err != cudaSuccess) return fc_cuda_error(err, "cudaSetDevice");
        g->changed = 1;
    }
    return FLASHC_OK;
}

void fc_guard_leave(const fc_device_guard *g)
{
    if (g->changed) cudaSetDevice(g->previous);
}

flashc_status fc_check_device_pointer(const fc_cuda_state *s, const void *p, const char *what)
{
    cudaPointerAttributes at;
    cudaError_t err = cudaPointerGetAttributes(&at, p);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "cuda: %s: cannot query the pointer (%s); the CUDA backend needs device memory",
                            what, cudaGetErrorString(err));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "cuda: %s points to host memory; the CUDA backend needs device memory "
                            "(cudaMalloc)", what);
    if (at.device != s->device)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "cuda: %s is memory of device %d, but this backend runs on device %d",
                            what, at.device, s->device);
    return FLASHC_OK;
}

/* The kernels move 16 bytes (8 elements) at a time: the data pointer and the strides of
 * batch, seqlen and heads (where that dimension has more than one element) must keep every
 * row 16-byte aligned. */
flashc_status fc_check_tensor(const fc_cuda_state *s, const flashc_tensor *t, const char *what)
{
    flashc_status st = fc_check_device_pointer(s, t->data, what);
    if (st != FLASHC_OK) return st;
    if ((uintptr_t)t->data % 16 != 0)
        return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                            "cuda: %s: data pointer %p is not 16-byte aligned, which the CUDA "
                            "kernels' vector loads need", what, t->data);
    static const char *dims[3] = {"batch", "seqlen", "heads"};
    for (int d = 0; d < 3; d++)
        if (t->shape[d] > 1 && t->stride[d] % 8 != 0)
            return flashc_error(FLASHC_ERROR_INVALID_POINTER,
                                "cuda: %s: stride[%d] (%s) is %lld elements, not a multiple of 8: "
                                "rows would not be 16-byte aligned for the CUDA kernels' vector loads",
                                what, d, dims[d], (long long)t->stride[d]);
    return FLASHC_OK;
}

