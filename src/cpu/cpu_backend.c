/*
 * cpu_backend.c - the "cpu" backend: handle creation (thread pool, micro-kernel choice),
 * description and the table of entry points. The algorithm is in cpu_forward.c and
 * cpu_backward.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_features.h"
#include "cpu/cpu_internal.h"

static int cpu_available(void)
{
    return 1;
}

/* Thread count: the config's, else FLASHC_NUM_THREADS, else every core this process has. */
static int pick_threads(const flashc_backend_config *cfg)
{
    if (cfg->num_threads > 0)
        return cfg->num_threads;
    const char *env = getenv("FLASHC_NUM_THREADS");
    if (env && *env) {
        long n = strtol(env, NULL, 10);
        if (n > 0 && n <= 4096)
            return (int)n;
    }
    return flashc_cpu_count();
}

static flashc_status cpu_create(const flashc_backend_config *cfg, void **state)
{
    const char *isa = cfg->cpu_isa;
    const char *env = getenv("FLASHC_CPU_ISA");
    if ((!isa || !*isa || strcmp(isa, "auto") == 0) && env && *env)
        isa = env;
    const flashc_cpu_kernels *kernels = flashc_cpu_pick_kernels(isa);
    if (!kernels)
        return flashc_error(FLASHC_ERROR_BACKEND_UNAVAILABLE,
                            "cpu_isa: micro-kernel set '%.32s' is unknown or not supported by "
                            "this processor (built in: %s)",
                            isa, flashc_cpu_kernel_names());
    flashc_cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "cpu: out of memory");
    st->kernels = kernels;
    pthread_mutex_init(&st->ws_lock, NULL);
    st->pool = flashc_threadpool_create(pick_threads(cfg));
    if (!st->pool) {
        pthread_mutex_destroy(&st->ws_lock);
        free(st);
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "cpu: cannot start worker threads");
    }
    *state = st;
    return FLASHC_OK;
}

static void cpu_destroy(void *state)
{
    flashc_cpu_state *st = state;
    flashc_threadpool_destroy(st->pool);
    pthread_mutex_destroy(&st->ws_lock);
    free(st->ws);
    free(st);
}

static void cpu_describe(void *state, char *buf, size_t size)
{
    flashc_cpu_state *st = state;
    char features[256];
    flashc_cpu_features_string(features, sizeof features);
    snprintf(buf, size, "cpu: %d threads, %s micro-kernels (cpu: %s)",
             flashc_threadpool_size(st->pool), st->kernels->name, features);
}

flashc_status flashc_cpu_workspace_get(flashc_cpu_state *st, size_t bytes, cpu_workspace *ws)
{
    ws->base = NULL;
    ws->cached = 0;
    if (pthread_mutex_trylock(&st->ws_lock) == 0) {
        if (st->ws_bytes < bytes) {
            free(st->ws);
            st->ws = flashc_cpu_alloc(bytes);
            st->ws_bytes = st->ws ? bytes : 0;
        }
        if (st->ws) {
            ws->base = st->ws;
            ws->cached = 1;
            return FLASHC_OK;
        }
        pthread_mutex_unlock(&st->ws_lock);
    } else {
        ws->base = flashc_cpu_alloc(bytes);
    }
    if (!ws->base)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY, "cpu: out of memory for %zu bytes of workspace",
                            bytes);
    return FLASHC_OK;
}

void flashc_cpu_workspace_put(flashc_cpu_state *st, cpu_workspace *ws)
{
    if (ws->cached)
        pthread_mutex_unlock(&st->ws_lock);
    else
        free(ws->base);
    ws->base = NULL;
    ws->cached = 0;
}

const flashc_backend_ops flashc_cpu_backend_ops = {
    .name = "cpu",
    .uses_device_memory = 0,
    .accepts_f32_outputs = 0,
    .available = cpu_available,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .forward = flashc_cpu_forward,
    .backward = flashc_cpu_backward,
    .backward_workspace_size = flashc_cpu_backward_workspace_size,
    .features = FLASHC_FEATURE_WINDOW | FLASHC_FEATURE_SOFTCAP | FLASHC_FEATURE_ALIBI |
                FLASHC_FEATURE_VARLEN | FLASHC_FEATURE_DROPOUT,
    .forward_kvcache = flashc_cpu_forward_kvcache,
};
