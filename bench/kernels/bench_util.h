/* bench_util.h: what the kernel benchmark programs share: a monotonic clock in seconds and
 * a xorshift64 generator for random weights (deterministic across runs). Bench code only. */
#ifndef HEARTH_BENCH_KERNELS_UTIL_H
#define HEARTH_BENCH_KERNELS_UTIL_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* HEARTH_BENCH_CPU_CLOCK=1: the process's CPU time instead of wall time, for one-thread
 * runs on a machine other work shares (time the process was not running is not counted). */
static inline double now_s(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = getenv("HEARTH_BENCH_CPU_CLOCK") && *getenv("HEARTH_BENCH_CPU_CLOCK") == '1';
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}
#endif
