/*
 * sm90_env.h - the Hopper launchers' comparison switches (FLASHC_SM90_*), read from the
 * environment. Each call site keeps its switch in a function-local static, so the environment
 * is read once per process, at the first launch that asks, not on every call.
 */
#ifndef FLASHC_CUDA_SM90_ENV_H
#define FLASHC_CUDA_SM90_ENV_H

#include <stdlib.h>
#include <string.h>

/* NAME as a decimal integer (0 for text that is not one), or unset_value when NAME is unset
 * or empty. */
static inline long sm90_env_long(const char *name, long unset_value)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : unset_value;
}

/* 1 when NAME is set to exactly value. */
static inline int sm90_env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

#endif /* FLASHC_CUDA_SM90_ENV_H */
