/* cmocka.h (shim): the few cmocka calls tests/unit/test_cuda.c uses, for tools/cuda_check
 * on GPU machines that lack the cmocka package. Not a cmocka replacement: a failed
 * assertion prints its message and ends the current test (longjmp), counted as failed. */
#ifndef HEARTH_CMOCKA_SHIM_H
#define HEARTH_CMOCKA_SHIM_H
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>

struct CMUnitTest {
    const char *name;
    void (*fn)(void **state);
};
#define cmocka_unit_test(f) {#f, f}
static jmp_buf shim_jump;
static void shim_fail(const char *file, int line, const char *msg) {
    printf("[  ERROR   ] %s:%d: %s\n", file, line, msg);
    longjmp(shim_jump, 1);
}
#define fail_msg(...)                                                                                            \
    do {                                                                                                         \
        char shim_m_[512];                                                                                       \
        snprintf(shim_m_, sizeof shim_m_, __VA_ARGS__);                                                          \
        shim_fail(__FILE__, __LINE__, shim_m_);                                                                  \
    } while (0)
#define assert_int_equal(a, b)                                                                                   \
    do {                                                                                                         \
        long long shim_a_ = (long long)(a), shim_b_ = (long long)(b);                                            \
        if (shim_a_ != shim_b_) fail_msg("%lld != %lld (%s)", shim_a_, shim_b_, #a);                              \
    } while (0)
#define assert_non_null(p)                                                                                       \
    do {                                                                                                         \
        if (!(p)) fail_msg("%s is NULL", #p);                                                                    \
    } while (0)
#define cmocka_run_group_tests(tests, setup, teardown)                                                           \
    shim_run((tests), (int)(sizeof(tests) / sizeof((tests)[0])))
static int shim_run(const struct CMUnitTest *t, int n) {
    volatile int failed = 0;
    printf("[==========] Running %d test(s) (cmocka shim).\n", n);
    for (int i = 0; i < n; i++) {
        printf("[ RUN      ] %s\n", t[i].name);
        fflush(stdout);
        if (setjmp(shim_jump) == 0) {
            t[i].fn(NULL);
            printf("[       OK ] %s\n", t[i].name);
        } else {
            printf("[  FAILED  ] %s\n", t[i].name);
            failed++;
        }
    }
    printf("[==========] %d test(s) run, %d failed.\n", n, failed);
    if (!failed) printf("[  PASSED  ] %d test(s).\n", n);
    return failed;
}
#endif
