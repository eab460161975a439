/*
 * threadpool.h - a fixed pool of worker threads, created once per CPU backend handle, that
 * runs a range of independent tasks with dynamic scheduling (tasks are taken in index order,
 * so a caller that numbers the longest tasks first gets longest-first scheduling).
 */
#ifndef FLASHC_THREADPOOL_H
#define FLASHC_THREADPOOL_H

#include <stdint.h>

typedef struct flashc_threadpool flashc_threadpool;

/* Runs task(ctx, index, thread) for index in [0, n); thread in [0, num_threads). */
typedef void (*flashc_task_fn)(void *ctx, int64_t index, int thread);

/* A pool of num_threads workers in total (the calling thread counts as one). NULL on failure. */
flashc_threadpool *flashc_threadpool_create(int num_threads);
void flashc_threadpool_destroy(flashc_threadpool *pool);
int flashc_threadpool_size(const flashc_threadpool *pool);

/* Runs n tasks on the pool and returns when all are done. Calls from several threads on one
 * pool are serialized. */
void flashc_threadpool_run(flashc_threadpool *pool, int64_t n, flashc_task_fn fn, void *ctx);

#endif /* FLASHC_THREADPOOL_H */
