/*
 * threadpool.c - pthread worker pool with an atomic task counter. Workers sleep on a
 * condition variable between jobs; the calling thread works on the job too.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/threadpool.h"

struct flashc_threadpool {
    int num_threads;
    pthread_t *workers;    /* num_threads - 1 of them */
    pthread_mutex_t lock;  /* guards the job fields and generation */
    pthread_cond_t wake;   /* a new job or shutdown */
    pthread_cond_t done;   /* the last worker left the job */
    pthread_mutex_t run_lock; /* serializes flashc_threadpool_run callers */
    uint64_t generation;   /* bumped for each job */
    int shutdown;
    int busy_workers;      /* workers still inside the current job */
    flashc_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next_task;
};

typedef struct worker_arg {
    flashc_threadpool *pool;
    int thread;
} worker_arg;

static void drain_tasks(flashc_threadpool *pool, int thread)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (i >= pool->n_tasks)
            return;
        pool->fn(pool->ctx, i, thread);
    }
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    free(p);
    flashc_threadpool *pool = arg.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->shutdown && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->shutdown)
            break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        drain_tasks(pool, arg.thread);
        pthread_mutex_lock(&pool->lock);
        if (--pool->busy_workers == 0)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

flashc_threadpool *flashc_threadpool_create(int num_threads)
{
    if (num_threads < 1)
        num_threads = 1;
    flashc_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    pool->num_threads = num_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    atomic_init(&pool->next_task, 0);
    if (num_threads > 1) {
        pool->workers = calloc((size_t)num_threads - 1, sizeof(pthread_t));
        if (!pool->workers) {
            flashc_threadpool_destroy(pool);
            return NULL;
        }
    }
    for (int t = 1; t < num_threads; t++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = pool;
            arg->thread = t;
        }
        if (!arg || pthread_create(&pool->workers[t - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->num_threads = t; /* only t - 1 workers exist: destroy joins those */
            flashc_threadpool_destroy(pool);
            return NULL;
        }
    }
    return pool;
}

void flashc_threadpool_destroy(flashc_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->shutdown = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int t = 1; t < pool->num_threads; t++)
        pthread_join(pool->workers[t - 1], NULL);
    free(pool->workers);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool);
}

int flashc_threadpool_size(const flashc_threadpool *pool)
{
    return pool->num_threads;
}

void flashc_threadpool_run(flashc_threadpool *pool, int64_t n, flashc_task_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    pthread_mutex_lock(&pool->run_lock);
    if (pool->num_threads == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        pthread_mutex_unlock(&pool->run_lock);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n;
    atomic_store(&pool->next_task, 0);
    pool->busy_workers = pool->num_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    drain_tasks(pool, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->busy_workers > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&pool->run_lock);
}
