/* mem.c: large streamed buffers on transparent huge pages where the kernel allows them (see
 * mem.h). The advice is best effort: without THP (or with it off) the buffer is ordinary
 * memory and nothing fails. */
#include "base/mem.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEM_HUGE_MIN ((size_t)4 << 20)
#define MEM_HUGE_ALIGN ((size_t)2 << 20)

/* Process-wide: `--no-hugepages` (docs/cli.md) turns the advice off before anything is
 * allocated. */
static int huge_on = 1;

void mem_set_hugepages(int on) { __atomic_store_n(&huge_on, on != 0, __ATOMIC_RELAXED); }

static int huge_allowed(void) { return __atomic_load_n(&huge_on, __ATOMIC_RELAXED); }

void *mem_alloc_stream(size_t bytes) {
    if (!bytes) bytes = 1;
    int huge = bytes >= MEM_HUGE_MIN && huge_allowed();
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
 * and only a fresh mapping promises zero pages that cost nothing until written. huge: the
 * mapping is made 2 MiB aligned (a larger one trimmed at both ends, so mem_free_reserved
 * unmaps exactly page_round(bytes)) and advised MADV_HUGEPAGE: a write then makes the 2 MiB
 * around it resident, so it suits a buffer filled from its start onward. */
void *mem_alloc_reserved(size_t bytes, int huge) {
    size_t len = page_round(bytes ? bytes : 1);
    huge = huge && len >= MEM_HUGE_ALIGN && huge_allowed();
    size_t extra = huge ? MEM_HUGE_ALIGN : 0;
    char *p = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (!huge) return p;
    char *a = (char *)(((uintptr_t)p + MEM_HUGE_ALIGN - 1) / MEM_HUGE_ALIGN * MEM_HUGE_ALIGN);
    if (a > p) munmap(p, (size_t)(a - p));
    if (a + len < p + len + extra) munmap(a + len, (size_t)(p + len + extra - (a + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(a, len, MADV_HUGEPAGE);
#endif
    return a;
}

void mem_free_reserved(void *p, size_t bytes) {
    if (p) munmap(p, page_round(bytes ? bytes : 1));
}

/* MAP_POPULATE: the kernel makes every page resident inside the one call, where a first
 * write to each 4 KiB page would trap once per page (168 MB: 37 ms against 58 on the
 * development machine); no huge pages, whose first allocation can wait for compaction. */
void *mem_alloc_filled(size_t bytes) {
    size_t len = page_round(bytes ? bytes : 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} copy_part;

static void *copy_part_run(void *arg) {
    copy_part *c = arg;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

void mem_copy_wide(void *dst, const void *src, size_t n) {
    enum { MAX_PARTS = 8 };
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = cpus < 1 ? 1 : cpus > MAX_PARTS ? MAX_PARTS : (int)cpus;
    if (n < ((size_t)64 << 20) || parts < 2) {
        memcpy(dst, src, n);
        return;
    }
    size_t each = (n / (size_t)parts + 4095) & ~(size_t)4095; /* whole pages a part */
    copy_part c[MAX_PARTS];
    pthread_t th[MAX_PARTS];
    int started[MAX_PARTS] = {0}, made = 0;
    for (size_t at = 0; at < n && made < parts; made++) {
        size_t len = n - at < each ? n - at : each;
        c[made] = (copy_part){(char *)dst + at, (const char *)src + at, len};
        at += len;
    }
    for (int i = 1; i < made; i++) started[i] = pthread_create(&th[i], NULL, copy_part_run, &c[i]) == 0;
    copy_part_run(&c[0]);
    for (int i = 1; i < made; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            copy_part_run(&c[i]); /* no thread: this one copies that part too */
    }
}
