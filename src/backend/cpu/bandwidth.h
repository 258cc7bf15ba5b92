/* bandwidth.h: measures this machine's memory read bandwidth (the decode roofline)
 * with a streaming read over a buffer larger than the caches. For benchmarks only. */
#ifndef HEARTH_BACKEND_CPU_BANDWIDTH_H
#define HEARTH_BACKEND_CPU_BANDWIDTH_H
#include "base/threadpool.h"
#include <stddef.h>

/* Best of `reps` streaming reads of `bytes` (rounded down to 64 KiB multiples) in GB/s
 * (1e9 bytes/s), split over the pool's threads; 0 if the buffer cannot be allocated. */
double cpu_read_bandwidth_gbs(threadpool *tp, size_t bytes, int reps);
#endif
