/* threadpool.c: workers wait for a new generation number, then claim task indices from
 * one 64-bit ticket (task count | next index) and count finished tasks. tp_run returns when
 * every task is done, not when every worker has looked at the job: on a shared, oversubscribed
 * machine a descheduled worker that never claimed a task must not hold up the caller (it
 * did, for milliseconds per call, under load). Linux futex; no per-call malloc. */
#include "base/threadpool.h"
#include "base/err.h"
#include <linux/futex.h>
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long an idle worker spins before sleeping. Decode calls a matmul every few µs
 * (between them the caller does small single-threaded ops), so a worker that spins this
 * long catches the next job without a futex wake-up (~5-20 µs on a VM); longer spinning
 * would only burn a core that other processes could use. */
#define TP_SPIN_NS 30000

typedef struct tp_worker {
    threadpool *tp;
    pthread_t thread;
    int index;
} tp_worker;

struct threadpool {
    int n_threads;
    tp_worker *workers;
    /* Job: written by the caller before the ticket is published; a worker reads them only
     * after claiming a task, when the job cannot finish (and be replaced) before it does. */
    tp_task_fn fn;
    void *ctx;
    /* High 32 bits: the job's task count; low 32: the next unclaimed index. fetch_add claims;
     * a claim at or past the count is a miss (the low half cannot overflow: each thread
     * misses at most once per job before it waits again). One word, so a late worker's
     * claim either lands in the current job (a real task of it) or misses. */
    _Atomic uint64_t ticket;
    atomic_int done;       /* tasks finished in the current job */
    _Atomic uint32_t generation;
    atomic_int sleeping;   /* workers inside (or about to enter) futex wait */
    atomic_int stop;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static void run_tasks(threadpool *tp, int thread) {
    for (;;) {
        uint64_t t = atomic_fetch_add_explicit(&tp->ticket, 1, memory_order_acquire);
        uint32_t index = (uint32_t)t, count = (uint32_t)(t >> 32);
        if (index >= count) break;
        tp->fn(tp->ctx, (int)index, thread);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
    }
}

/* Returns the new generation once it differs from seen: spin first, then sleep. */
static uint32_t wait_generation(threadpool *tp, uint32_t seen) {
    uint32_t g;
    uint64_t start = 0;
    for (int i = 0;; i++) {
        g = atomic_load_explicit(&tp->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if ((i & 63) == 63) { /* clock_gettime costs ~20 ns: check it now and then */
            uint64_t t = now_ns();
            if (!start) start = t;
            else if (t - start > TP_SPIN_NS) break;
        }
    }
    for (;;) {
        /* seq_cst pairs with the caller's bump-then-read-sleeping in tp_run: either the
         * caller sees us sleeping and wakes us, or we see the new generation here. */
        atomic_fetch_add(&tp->sleeping, 1);
        g = atomic_load(&tp->generation);
        if (g == seen) futex_wait(&tp->generation, seen);
        atomic_fetch_sub(&tp->sleeping, 1);
        g = atomic_load_explicit(&tp->generation, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *worker_main(void *arg) {
    tp_worker *w = arg;
    threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_generation(tp, seen);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        run_tasks(tp, w->index);
    }
    return NULL;
}

hearth_status tp_create(int n_threads, threadpool **out, hearth_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return err_set(err, HEARTH_ERR_INVALID, "thread pool: %d threads (want 1..1024)", n_threads);
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return err_set(err, HEARTH_ERR_NOMEM, "thread pool: out of memory");
    tp->n_threads = n_threads;
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            return err_set(err, HEARTH_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        tp_worker *w = &tp->workers[i];
        w->tp = tp;
        w->index = i + 1;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            tp->n_threads = i + 1; /* only the ones started get joined */
            tp_destroy(tp);
            return err_set(err, HEARTH_ERR_NOMEM, "thread pool: could not start thread %d of %d", i + 2,
                           n_threads);
        }
    }
    *out = tp;
    return HEARTH_OK;
}

void tp_destroy(threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    atomic_fetch_add(&tp->generation, 1);
    futex_wake_all(&tp->generation);
    for (int i = 0; i < tp->n_threads - 1; i++) pthread_join(tp->workers[i].thread, NULL);
    free(tp->workers);
    free(tp);
}

int tp_threads(const threadpool *tp) { return tp ? tp->n_threads : 1; }

void tp_run(threadpool *tp, int n_tasks, tp_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!tp || tp->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->ticket, (uint64_t)(uint32_t)n_tasks << 32, memory_order_release);
    atomic_fetch_add(&tp->generation, 1); /* seq_cst: pairs with the sleepers' check */
    if (atomic_load(&tp->sleeping) > 0) futex_wake_all(&tp->generation);
    run_tasks(tp, 0);
    /* Only workers holding a task are waited for; yield only if one was descheduled. */
    for (int i = 0; atomic_load_explicit(&tp->done, memory_order_acquire) < n_tasks; i++) {
        if (i < 2000) cpu_relax(); /* ~100 µs of pause, then give the core away */
        else sched_yield();
    }
}
