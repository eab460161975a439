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
    st->pool = flashc_threadpool_create(pick_threads(cfg));
    if (!st->pool) {
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

flashc_status flashc_cpu_scratch_alloc(cpu_scratch *s, int threads, size_t floats_per_thread)
{
    /* round each thread's share up to a 64-byte multiple so threads never share a line */
    floats_per_thread = (floats_per_thread + 15) & ~(size_t)15;
    s->floats_per_thread = floats_per_thread;
    s->base = aligned_alloc(64, (size_t)threads * floats_per_thread * sizeof(float));
    if (!s->base)
        return flashc_error(FLASHC_ERROR_OUT_OF_MEMORY,
                            "cpu: out of memory for %zu bytes of scratch",
                            (size_t)threads * floats_per_thread * sizeof(float));
    return FLASHC_OK;
}

void flashc_cpu_scratch_free(cpu_scratch *s)
{
    free(s->base);
    s->base = NULL;
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
};
