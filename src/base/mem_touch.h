/* mem_touch.h: makes a buffer resident now by writing one zero byte per page. Used after
 * memset on malloc'd memory: the compiler may fuse malloc + memset(0) into calloc, which
 * leaves fresh pages unmapped, and fit predicts footprints assuming they are resident.
 * Only for memory that already holds zeros. */
#ifndef HEARTH_BASE_MEM_TOUCH_H
#define HEARTH_BASE_MEM_TOUCH_H
#include <stddef.h>

static inline void mem_touch(void *p, size_t n) {
    volatile unsigned char *b = p;
    for (size_t i = 0; i < n; i += 4096) b[i] = 0; /* 4096: the smallest page size we run on */
    if (n) b[n - 1] = 0;
}
#endif
