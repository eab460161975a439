/*
 * threadpool.c - pthread worker pool with an atomic task counter. The calling thread works on
 * the job too. Between jobs a worker first watches for the next one for a short while
 * (SPIN_NS), then sleeps on a condition variable: waking a sleeping thread costs tens of
 * microseconds (a futex wake and a context switch), as much as a whole decode step over a
 * short cache, and the calls of a model's layers follow each other closely. The caller
 * likewise watches for the workers to finish before it sleeps. A pool with more threads than
 * the process has CPUs does not watch: its spinning threads would take the CPUs from the
 * ones with work.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_features.h"
#include "cpu/threadpool.h"

struct flashc_threadpool {
    int num_threads;
    int spin;              /* watch before sleeping (no more threads than CPUs) */
    pthread_t *workers;    /* num_threads - 1 of them */
    pthread_mutex_t lock;  /* guards the job fields and generation */
    pthread_cond_t wake;   /* a new job or shutdown */
    pthread_cond_t done;   /* the last worker left the job */
    pthread_mutex_t run_lock; /* serializes flashc_threadpool_run callers */
    atomic_uint_fast64_t generation; /* bumped for each job (under lock) */
    atomic_int shutdown;
    atomic_int busy_workers; /* workers still inside the current job (changed under lock) */
    flashc_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next_task;
};

/* How long a thread watches for a change before it sleeps. */
enum { SPIN_NS = 50000 };

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Polls ready(pool, arg) for up to SPIN_NS; the caller then sleeps if it is still not. */
static void spin_until(int (*ready)(flashc_threadpool *, uint64_t), flashc_threadpool *pool,
                       uint64_t arg)
{
    if (!pool->spin)
        return;
    const int64_t end = monotonic_ns() + SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (ready(pool, arg))
                return;
            cpu_relax();
        }
        if (monotonic_ns() > end)
            return;
    }
}

static int new_generation(flashc_threadpool *pool, uint64_t seen)
{
    return atomic_load_explicit(&pool->generation, memory_order_acquire) != seen;
}

static int workers_done(flashc_threadpool *pool, uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&pool->busy_workers, memory_order_acquire) == 0;
}

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
    for (;;) {
        /* a new job (or shutdown, which bumps the generation too) often comes soon */
        spin_until(new_generation, pool, seen);
        pthread_mutex_lock(&pool->lock);
        while (!atomic_load(&pool->shutdown) && atomic_load(&pool->generation) == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (atomic_load(&pool->shutdown))
            break;
        seen = atomic_load(&pool->generation);
        pthread_mutex_unlock(&pool->lock);
        drain_tasks(pool, arg.thread);
        pthread_mutex_lock(&pool->lock);
        if (atomic_fetch_sub(&pool->busy_workers, 1) == 1)
            pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
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
    pool->spin = num_threads <= flashc_cpu_count();
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
    pool->generation++; /* ends a worker's watch too */
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

    spin_until(workers_done, pool, 0);
    pthread_mutex_lock(&pool->lock);
    while (pool->busy_workers > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&pool->run_lock);
}
