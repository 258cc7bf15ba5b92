/* A load that maps the weights (model_load with use_mmap, what a GPU engine does by default)
 * gives the backends op_model.release_host: after it, a released weight's pages are no
 * longer in the process's page tables (/proc/self/pagemap's present bit), its bytes read
 * back the same from the file, and memory outside the file mappings (anonymous pages, the
 * arena's vectors) is never dropped. A copied load has no hook. On the tiny llama-f32
 * model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// clang-format off: cmocka.h needs the four headers above first
#include <cmocka.h>
// clang-format on
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hearth.h"
#include "model/model.h"
#include "ops/ops.h"
#include "tiny_model_path.h"

static hearth_model *hm;

static int setup(void **state) {
    (void)state;
    char path[1024];
    tiny_model_path(path, sizeof path, "llama-f32");
    hearth_error err = {0};
    if (hearth_model_open(path, &hm, &err)) {
        fprintf(stderr, "tiny model missing (%s): %s; run tools/make_tiny_models.py\n", path, err.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    hearth_model_close(hm);
    return 0;
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Whether the page at p is mapped into this process now (pagemap bit 63). */
static int page_present(const void *p) {
    int fd = open("/proc/self/pagemap", O_RDONLY);
    assert_true(fd >= 0);
    uint64_t e = 0;
    off_t at = (off_t)((uintptr_t)p / page_size() * sizeof e);
    assert_int_equal(pread(fd, &e, sizeof e, at), (ssize_t)sizeof e);
    close(fd);
    return (int)(e >> 63);
}

static uint64_t checksum(const void *p, size_t n) {
    const volatile uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t weight_bytes(const op_weight *w) { return (size_t)w->n * (size_t)op_weight_row_bytes(w); }

static void test_copied_load_has_no_hook(void **state) {
    (void)state;
    model *m = NULL;
    hearth_error err = {0};
    assert_int_equal(model_load(hm, 0, &m, &err), HEARTH_OK);
    assert_null(model_ops(m)->release_host);
    model_free(m);
}

static void test_release_drops_pages_and_they_read_back(void **state) {
    (void)state;
    model *m = NULL;
    hearth_error err = {0};
    assert_int_equal(model_load(hm, 1, &m, &err), HEARTH_OK);
    const op_model *om = model_ops(m);
    assert_non_null(om->release_host);
    int checked = 0;
    for (int i = 0; i < om->n_items; i++) {
        const op_weight *w = om->items[i].w;
        if (!w || weight_bytes(w) < 3 * page_size()) continue;
        size_t n = weight_bytes(w);
        uint64_t before = checksum(w->data, n); /* faults every page in */
        uintptr_t first = ((uintptr_t)w->data + page_size() - 1) & ~(uintptr_t)(page_size() - 1);
        assert_true(page_present((const void *)first));
        om->release_host(om->release_ctx, w->data, n);
        for (uintptr_t pg = first; pg + page_size() <= (uintptr_t)w->data + n; pg += page_size())
            assert_false(page_present((const void *)pg));
        assert_true(checksum(w->data, n) == before); /* faulted back from the file, unchanged */
        checked++;
    }
    assert_true(checked >= 3);
    model_free(m);
}

/* Bytes outside every file mapping (a weight the load converted into its arena, or the
 * caller's own memory) are never dropped: a release there leaves them as they are, where
 * MADV_DONTNEED would have zeroed anonymous pages. */
static void test_release_leaves_other_memory_alone(void **state) {
    (void)state;
    model *m = NULL;
    hearth_error err = {0};
    assert_int_equal(model_load(hm, 1, &m, &err), HEARTH_OK);
    const op_model *om = model_ops(m);
    size_t n = (size_t)1 << 20;
    uint8_t *anon = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(anon != MAP_FAILED);
    memset(anon, 0xA5, n);
    om->release_host(om->release_ctx, anon, n);
    om->release_host(om->release_ctx, anon + 4096, 1);
    for (size_t i = 0; i < n; i++)
        if (anon[i] != 0xA5) fail_msg("byte %zu of anonymous memory changed to %d", i, anon[i]);
    munmap(anon, n);
    /* the model's vectors live in its arena: a release of one changes nothing either */
    for (int i = 0; i < om->n_items; i++) {
        const op_item *it = &om->items[i];
        if (it->w || !it->vec || it->n < 1024) continue;
        uint64_t before = checksum(it->vec, (size_t)it->n * sizeof(float));
        om->release_host(om->release_ctx, it->vec, (size_t)it->n * sizeof(float));
        assert_true(checksum(it->vec, (size_t)it->n * sizeof(float)) == before);
    }
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copied_load_has_no_hook),
        cmocka_unit_test(test_release_drops_pages_and_they_read_back),
        cmocka_unit_test(test_release_leaves_other_memory_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
