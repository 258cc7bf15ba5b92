/* threadpool.h: a fixed set of worker threads, created once, that run fan-out jobs
 * (tp_run) with the calling thread taking part. Workers spin briefly on a generation
 * counter and then sleep on a futex, so back-to-back kernel calls pay no wake-up and no
 * thread creation; tp_run allocates nothing. Knows nothing about what the tasks do. */
#ifndef HEARTH_BASE_THREADPOOL_H
#define HEARTH_BASE_THREADPOOL_H
#include "hearth.h"

typedef struct threadpool threadpool;

/* task: 0..n_tasks-1; thread: 0..tp_threads()-1 (0 is the caller), for per-thread scratch. */
typedef void (*tp_task_fn)(void *ctx, int task, int thread);

/* n_threads counts the caller: 1 makes a pool with no workers (tp_run runs inline). */
hearth_status tp_create(int n_threads, threadpool **out, hearth_error *err);
/* Stops and joins the workers. Must not race with tp_run. NULL is fine. */
void tp_destroy(threadpool *tp);
int tp_threads(const threadpool *tp);
/* Runs fn(ctx, task, thread) for every task and returns when all are done. Tasks are
 * handed out dynamically in index order. tp may be NULL (runs inline). One tp_run at a
 * time per pool: the pool belongs to one engine thread. */
void tp_run(threadpool *tp, int n_tasks, tp_task_fn fn, void *ctx);
#endif
