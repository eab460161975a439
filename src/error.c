/*
 * error.c - status names and the per-thread message of the last failed call.
 */
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"

static _Thread_local char last_error_message[512];

const char *flashc_status_string(flashc_status status)
{
    switch (status) {
    case FLASHC_OK: return "FLASHC_OK: success";
    case FLASHC_ERROR_NULL_POINTER: return "FLASHC_ERROR_NULL_POINTER: a required pointer is NULL";
    case FLASHC_ERROR_INVALID_DTYPE: return "FLASHC_ERROR_INVALID_DTYPE: unknown dtype";
    case FLASHC_ERROR_DTYPE_MISMATCH: return "FLASHC_ERROR_DTYPE_MISMATCH: tensors of different dtypes";
    case FLASHC_ERROR_SHAPE_MISMATCH: return "FLASHC_ERROR_SHAPE_MISMATCH: tensor shapes do not agree";
    case FLASHC_ERROR_INVALID_HEAD_DIM: return "FLASHC_ERROR_INVALID_HEAD_DIM: head_dim out of range";
    case FLASHC_ERROR_INVALID_HEADS: return "FLASHC_ERROR_INVALID_HEADS: heads_q is not a multiple of heads_kv";
    case FLASHC_ERROR_INVALID_STRIDE: return "FLASHC_ERROR_INVALID_STRIDE: invalid strides";
    case FLASHC_ERROR_INVALID_SIZE: return "FLASHC_ERROR_INVALID_SIZE: invalid size or ndim";
    case FLASHC_ERROR_ALIASING: return "FLASHC_ERROR_ALIASING: an output overlaps another tensor";
    case FLASHC_ERROR_INVALID_PARAM: return "FLASHC_ERROR_INVALID_PARAM: a parameter is out of range";
    case FLASHC_ERROR_UNSUPPORTED: return "FLASHC_ERROR_UNSUPPORTED: not supported by this backend";
    case FLASHC_ERROR_BACKEND_UNAVAILABLE: return "FLASHC_ERROR_BACKEND_UNAVAILABLE: backend not available";
    case FLASHC_ERROR_OUT_OF_MEMORY: return "FLASHC_ERROR_OUT_OF_MEMORY: allocation failed";
    case FLASHC_ERROR_DEVICE: return "FLASHC_ERROR_DEVICE: device runtime error";
    case FLASHC_ERROR_INVALID_POINTER: return "FLASHC_ERROR_INVALID_POINTER: wrong memory kind or misaligned";
    case FLASHC_ERROR_WORKSPACE_TOO_SMALL: return "FLASHC_ERROR_WORKSPACE_TOO_SMALL: workspace too small";
    case FLASHC_ERROR_INTERNAL: return "FLASHC_ERROR_INTERNAL: internal error";
    }
    return "FLASHC_ERROR_UNKNOWN: not a flashc status";
}

const char *flashc_last_error(void)
{
    return last_error_message;
}

flashc_status flashc_error(flashc_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error_message, sizeof last_error_message, fmt, ap);
    va_end(ap);
    return status;
}
