/* mem.h: allocation of large buffers: streamed ones (model weights, the bandwidth probe)
 * aligned so the kernel can back them with transparent huge pages, and advised to; and
 * reservations made resident only where written (the KV pool). Knows nothing about what is
 * stored in them. */
#ifndef HEARTH_BASE_MEM_H
#define HEARTH_BASE_MEM_H
#include <stddef.h>

/* 64-byte aligned memory of `bytes` (at least 1); from 4 MiB on, 2 MiB aligned and advised
 * MADV_HUGEPAGE (one TLB entry per 2 MiB instead of per 4 KiB while a decode step streams
 * every weight), unless mem_set_hugepages(0). NULL when out of memory; release with free(). */
void *mem_alloc_stream(size_t bytes);

/* A page-aligned reservation that is filled a part at a time (the KV pool): anonymous
 * pages, read as zeros and made resident only when first written, so the process holds
 * what it has used, not what it reserved. Made resident 4 KiB at a time, or with huge (and
 * bytes >= 2 MiB, unless mem_set_hugepages(0)) 2 MiB aligned and advised MADV_HUGEPAGE, so
 * up to 2 MiB at a time: for a buffer whose used part is one run from its start. NULL when
 * the address space is short; release with mem_free_reserved and the same byte count. */
void *mem_alloc_reserved(size_t bytes, int huge);
void mem_free_reserved(void *p, size_t bytes);
/* Page-aligned memory of `bytes` made resident at once (for a buffer that is written whole
 * right away: an adapter's factors), without huge pages. NULL when out of memory; release
 * with mem_free_reserved and the same byte count. */
void *mem_alloc_filled(size_t bytes);
/* 0: no huge-page alignment or advice for what is allocated from now on (the CLI's
 * --no-hugepages, for machines where transparent huge pages misbehave); 1: the default. */
void mem_set_hugepages(int on);

/* memcpy of n bytes, split over up to 8 threads (the online CPUs) from 64 MiB on: a model's
 * load copies every weight into its arena, and the copy and the kernel's zeroing of the fresh
 * pages it faults in are most of that time on one thread. The same bytes as memcpy. */
void mem_copy_wide(void *dst, const void *src, size_t n);
#endif
