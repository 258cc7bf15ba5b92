/* bandwidth.c: streaming-read bandwidth measurement (see bandwidth.h). Sums 64-bit lanes
 * with AVX2 where present so the loop is limited by memory, not by the core. */
#include "backend/cpu/bandwidth.h"
#include "base/cpu_features.h"
#include "base/mem.h"
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct read_job {
    const uint8_t *buf;
    size_t chunk;
    int vector;
    volatile uint64_t sink[64];
} read_job;

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n) {
    const __m256i *a = (const __m256i *)p;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 4 <= n / 32; i += 4) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(a + i));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(a + i + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(a + i + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(a + i + 3));
    }
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return o[0] + o[1] + o[2] + o[3];
}

static uint64_t sum_scalar(const uint8_t *p, size_t n) {
    const uint64_t *a = (const uint64_t *)p;
    uint64_t s = 0;
    for (size_t i = 0; i < n / 8; i++) s += a[i];
    return s;
}

static void read_task(void *ctx, int task, int thread) {
    read_job *j = ctx;
    const uint8_t *p = j->buf + (size_t)task * j->chunk;
    j->sink[thread % 64] += j->vector ? sum_avx2(p, j->chunk) : sum_scalar(p, j->chunk);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double cpu_read_bandwidth_gbs(threadpool *tp, size_t bytes, int reps) {
    int tasks = tp_threads(tp) * 8; /* several chunks per thread evens out their speeds */
    read_job j = {.vector = cpu_level_active() >= CPU_LEVEL_AVX2};
    j.chunk = bytes / (size_t)tasks / 65536 * 65536;
    if (!j.chunk) return 0;
    uint8_t *buf;
    /* the same allocation as the weight arena (model/load.c), so both stream from the same
     * kind of pages */
    if (!(buf = mem_alloc_stream(j.chunk * tasks))) return 0;
    memset(buf, 1, j.chunk * tasks); /* fault every page in before timing */
    j.buf = buf;
    double best = 0;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = now_seconds();
        tp_run(tp, tasks, read_task, &j);
        double gbs = (double)j.chunk * tasks / (now_seconds() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}
