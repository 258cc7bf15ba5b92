/* mem.c: large streamed buffers on transparent huge pages where the kernel allows them (see
 * mem.h). The advice is best effort: without THP (or with it off) the buffer is ordinary
 * memory and nothing fails. */
#include "base/mem.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
