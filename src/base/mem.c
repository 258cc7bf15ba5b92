/* mem.c: large streamed buffers on transparent huge pages where the kernel allows them (see
 * mem.h). The advice is best effort: without THP (or with it off) the buffer is ordinary
 * memory and nothing fails. */
#include "base/mem.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEM_HUGE_MIN ((size_t)4 << 20)
#define MEM_HUGE_ALIGN ((size_t)2 << 20)

void *mem_alloc_stream(size_t bytes) {
    if (!bytes) bytes = 1;
    const char *env = getenv("HEARTH_HUGEPAGES");
    int huge = bytes >= MEM_HUGE_MIN && !(env && !strcmp(env, "0"));
    void *p;
    if (posix_memalign(&p, huge ? MEM_HUGE_ALIGN : 64, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(p, bytes / MEM_HUGE_ALIGN * MEM_HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    return p;
}

static size_t page_round(size_t bytes) {
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    return (bytes + pg - 1) / pg * pg;
}

/* mmap, not malloc: glibc may serve even a large request from heap it has touched before,
 * and only a fresh mapping promises zero pages that cost nothing until written. No huge
 * pages: one would make 2 MiB resident for the first 16-position block of each layer, and
 * the resident size would no longer follow the blocks written. */
void *mem_alloc_reserved(size_t bytes) {
    void *p = mmap(NULL, page_round(bytes ? bytes : 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void mem_free_reserved(void *p, size_t bytes) {
    if (p) munmap(p, page_round(bytes ? bytes : 1));
}
