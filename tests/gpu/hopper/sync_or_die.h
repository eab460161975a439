/*
 * sync_or_die.h - waiting for the device with a time limit, for the standalone Hopper checks:
 * a deadlocked pipeline (or a semaphore that never arrives) is reported as HANG and the
 * program exits 3, instead of hanging the run. The limit is 30 s, or FLASHC_HANG_SECONDS:
 * under compute-sanitizer's racecheck every shared-memory access is instrumented and a
 * kernel that takes milliseconds can take minutes.
 */
#ifndef FLASHC_TESTS_SYNC_OR_DIE_H
#define FLASHC_TESTS_SYNC_OR_DIE_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long hang_limit_seconds(void)
{
    const char *env = getenv("FLASHC_HANG_SECONDS");
    const long s = env ? strtol(env, NULL, 10) : 0;
    return s > 0 ? s : 30;
}

static void sync_or_die(const char *what)
{
    const time_t t0 = time(NULL);
    const long limit = hang_limit_seconds();
    for (;;) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            fprintf(stderr, "FAIL %s: %s\n", what, cudaGetErrorString(e));
            exit(2);
        }
        if (time(NULL) - t0 > limit) {
            printf("HANG %s: kernel did not finish in %ld s\n", what, limit);
            fflush(stdout);
            exit(3);
        }
    }
}

#endif
