/* test_cpu_threadpool.c: the thread pool (every task runs exactly once per tp_run, under
 * many rapid calls, after workers fell asleep, with 0/1/many tasks, across create/destroy
 * cycles) and the CPU feature level override (HEARTH_CPU only ever lowers the level). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/cpu_features.h"
#include "base/threadpool.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TASKS 64

typedef struct count_ctx {
    atomic_int runs[MAX_TASKS];
    atomic_int bad_thread;
    int n_threads;
    uint64_t generation; /* tasks write it into out[] to show they ran for this call */
    uint64_t out[MAX_TASKS];
} count_ctx;

static void count_task(void *p, int task, int thread) {
    count_ctx *c = p;
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
    atomic_fetch_add(&c->runs[task], 1);
    c->out[task] = c->generation;
}

static void run_many(threadpool *tp, int calls, int sleep_every) {
    static count_ctx c;
    memset(&c, 0, sizeof c);
    c.n_threads = tp_threads(tp);
    for (int i = 0; i < calls; i++) {
        int n = i % (MAX_TASKS + 1); /* includes 0 and 1 */
        c.generation = (uint64_t)i + 1;
        for (int t = 0; t < MAX_TASKS; t++) atomic_store(&c.runs[t], 0);
        tp_run(tp, n, count_task, &c);
        /* tp_run returned: every task's effects must be visible, and exactly once. */
        for (int t = 0; t < n; t++) {
            if (atomic_load(&c.runs[t]) != 1 || c.out[t] != c.generation)
                fail_msg("call %d task %d of %d: ran %d times, out %llu", i, t, n, atomic_load(&c.runs[t]),
                         (unsigned long long)c.out[t]);
        }
        for (int t = n; t < MAX_TASKS; t++) assert_int_equal(atomic_load(&c.runs[t]), 0);
        if (sleep_every && i % sleep_every == 0) usleep(300); /* past the spin: workers sleep */
    }
    assert_int_equal(atomic_load(&c.bad_thread), 0);
}

static void test_rapid_calls(void **state) {
    for (int threads = 1; threads <= 3; threads++) { /* 3 > cores here: workers get preempted */
        threadpool *tp = NULL;
        assert_int_equal(tp_create(threads, &tp, NULL), HEARTH_OK);
        assert_int_equal(tp_threads(tp), threads);
        run_many(tp, 4000, 0);
        tp_destroy(tp);
    }
}

static void test_calls_after_sleep(void **state) {
    threadpool *tp = NULL;
    assert_int_equal(tp_create(2, &tp, NULL), HEARTH_OK);
    run_many(tp, 300, 1);
    tp_destroy(tp);
}

static void test_create_destroy_cycles(void **state) {
    for (int i = 0; i < 50; i++) {
        threadpool *tp = NULL;
        assert_int_equal(tp_create(1 + i % 3, &tp, NULL), HEARTH_OK);
        if (i % 2) run_many(tp, 5, 0);
        tp_destroy(tp); /* also right after creation, before workers reached their wait */
    }
    tp_destroy(NULL);
}

static void test_null_pool_and_bad_args(void **state) {
    static count_ctx c;
    memset(&c, 0, sizeof c);
    c.n_threads = 1;
    tp_run(NULL, 7, count_task, &c);
    for (int t = 0; t < 7; t++) assert_int_equal(atomic_load(&c.runs[t]), 1);
    assert_int_equal(tp_threads(NULL), 1);
    threadpool *tp = (threadpool *)1;
    hearth_error err = {0};
    assert_int_equal(tp_create(0, &tp, &err), HEARTH_ERR_INVALID);
    assert_null(tp);
}

static void test_level_override(void **state) {
    cpu_level hw = cpu_level_hardware();
    const cpu_features *f = cpu_features_get();
    if (hw >= CPU_LEVEL_AVX2) assert_true(f->avx2 && f->fma && f->f16c);
    if (hw == CPU_LEVEL_AVX512) assert_true(f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni);
    unsetenv("HEARTH_CPU");
    assert_int_equal(cpu_level_active(), hw);
    setenv("HEARTH_CPU", "scalar", 1);
    assert_int_equal(cpu_level_active(), CPU_LEVEL_SCALAR);
    setenv("HEARTH_CPU", "avx2", 1);
    assert_int_equal(cpu_level_active(), hw < CPU_LEVEL_AVX2 ? hw : CPU_LEVEL_AVX2);
    setenv("HEARTH_CPU", "avx512", 1);
    assert_int_equal(cpu_level_active(), hw); /* never above the hardware */
    setenv("HEARTH_CPU", "bogus", 1);
    assert_int_equal(cpu_level_active(), hw);
    unsetenv("HEARTH_CPU");
    assert_string_equal(cpu_level_name(CPU_LEVEL_AVX2), "avx2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rapid_calls),
        cmocka_unit_test(test_calls_after_sleep),
        cmocka_unit_test(test_create_destroy_cycles),
        cmocka_unit_test(test_null_pool_and_bad_args),
        cmocka_unit_test(test_level_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
