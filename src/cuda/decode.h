/*
 * decode.h - the CUDA backend's LSE merge (merge.cu) and KV-cache decode (decode.cu), with
 * the signatures of the ops table (backend.h) so that launch.cu can name them there.
 */
#ifndef FLASHC_CUDA_DECODE_H
#define FLASHC_CUDA_DECODE_H

#include "backend.h"

flashc_status fc_cuda_merge(void *state, const flashc_merge_problem *pr,
                            const flashc_tensor *outs, const flashc_tensor *lses,
                            flashc_tensor *out, flashc_tensor *lse);

flashc_status fc_cuda_forward_kvcache(void *state, const flashc_kvcache_problem *pr,
                                      const flashc_tensor *q, flashc_tensor *k_cache,
                                      flashc_tensor *v_cache, const flashc_tensor *k_new,
                                      const flashc_tensor *v_new, flashc_tensor *out,
                                      flashc_tensor *lse);

size_t fc_cuda_kvcache_workspace_size(void *state, const flashc_kvcache_problem *pr);

#endif /* FLASHC_CUDA_DECODE_H */
