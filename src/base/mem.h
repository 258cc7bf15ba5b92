/* mem.h: allocation of large buffers that are streamed (model weights, the bandwidth probe):
 * aligned so the kernel can back them with transparent huge pages, and advised to.
 * Knows nothing about what is stored in them. */
#ifndef HEARTH_BASE_MEM_H
#define HEARTH_BASE_MEM_H
#include <stddef.h>

/* 64-byte aligned memory of `bytes` (at least 1); from 4 MiB on, 2 MiB aligned and advised
 * MADV_HUGEPAGE (one TLB entry per 2 MiB instead of per 4 KiB while a decode step streams
 * every weight), unless HEARTH_HUGEPAGES=0. NULL when out of memory; release with free(). */
void *mem_alloc_stream(size_t bytes);
#endif
