/*
 * runtime.h - what every module of the CUDA backend shares on the host: the backend's state
 * (device and its limits), CUDA errors turned into statuses, the guard that makes the
 * backend's device current for one call, and the checks that a tensor is device memory of
 * that device with rows aligned for 16-byte vector loads.
 */
#ifndef FLASHC_CUDA_RUNTIME_H
#define FLASHC_CUDA_RUNTIME_H

#include <cuda_runtime.h>

#include "backend.h"

typedef struct fc_cuda_state {
    int device;
    int sm_major, sm_minor;
    int num_sms;
    size_t smem_optin; /* largest dynamic shared memory a block may ask for */
    int use_wgmma;     /* the Hopper (sm_90a) kernels serve what they can; else mma.sync */
    char name[256];
} fc_cuda_state;

/* Makes the backend's device current for the duration of a call and puts the caller's back. */
typedef struct fc_device_guard {
    int previous;
    int changed;
} fc_device_guard;

/* A CUDA error as a status with a message naming what failed; clears a non-sticky error. */
flashc_status fc_cuda_error(cudaError_t err, const char *what);

flashc_status fc_guard_enter(fc_device_guard *g, const fc_cuda_state *s);
void fc_guard_leave(const fc_device_guard *g);

/* p is device (or managed) memory of the backend's device. */
flashc_status fc_check_device_pointer(const fc_cuda_state *s, const void *p, const char *what);

/* fc_check_device_pointer, plus a 16-byte aligned data pointer and batch/seqlen/heads strides
 * that keep every row 16-byte aligned. */
flashc_status fc_check_tensor(const fc_cuda_state *s, const flashc_tensor *t, const char *what);

#endif /* FLASHC_CUDA_RUNTIME_H */
