/* test_kv_layout.c: where the KV pool puts every (layer, block, KV head, position) row.
 * Distinct values go in through kv_store for every cell of several sequences; they are
 * read back at the address the documented layout gives (computed here, independently of
 * kv_row: block-major [block][layer][head][pos][dim] for a pool of one layer shape,
 * layer-major per layer for kv_create_layers), through kv_key / kv_value / kv_row and the
 * layer views, out and back in through kv_slot_rows_read / kv_slot_rows_write and a saved
 * sequence file (kv_file.h), and after kv_copy_rows. An address bug (two cells sharing a
 * row, a stride of the old layout, a view off by a layer) changes a value somewhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mem.h"
#include "kv/kv_cache.h"
#include "kv/kv_file.h"
#include "engine/fit_internal.h"

enum { SLOTS = 3, CONTEXT = 80, BLOCKS = 16 };
static const int lens[SLOTS] = {37, 16, 70}; /* partial, exactly one, and many blocks */

/* The value of element i of the key (value: negated) of a cell: distinct for every cell. */
static float cell(int l, int slot, int p, int h, int i) {
    return (float)(((l * SLOTS + slot) * CONTEXT + p) * 8 + h) + (float)i / 64.0f;
}

/* One (layer, head) of the shape: its heads and dim, and where layer l's row of (block, head,
 * pos) starts, in rows from the array's start, by the layout documented in kv_cache.h. */
typedef struct shape {
    int n_layers, layered;
    const int *heads, *dims;
} shape;

static size_t oracle_row(const shape *s, int l, int b, int h, int p) {
    if (!s->layered) /* block-major: a block holds every layer's rows */
        return (((size_t)b * s->n_layers + l) * s->heads[0] + h) * KV_BLOCK_SIZE + (size_t)p % KV_BLOCK_SIZE;
    size_t before = 0; /* layer-major: layer l's blocks after all of layer l - 1's */
    for (int j = 0; j < l; j++) before += (size_t)BLOCKS * s->heads[j] * KV_BLOCK_SIZE;
    return before + ((size_t)b * s->heads[l] + h) * KV_BLOCK_SIZE + (size_t)p % KV_BLOCK_SIZE;
}
/* Elements before that row: rows of earlier layers have their own dims. */
static size_t oracle_elem(const shape *s, int l, int b, int h, int p) {
    if (!s->layered) return oracle_row(s, l, b, h, p) * s->dims[0];
    size_t before = 0;
    for (int j = 0; j < l; j++) before += (size_t)BLOCKS * s->heads[j] * KV_BLOCK_SIZE * s->dims[j];
    return before + (((size_t)b * s->heads[l] + h) * KV_BLOCK_SIZE + (size_t)p % KV_BLOCK_SIZE) * s->dims[l];
}

/* Element i of a stored row, dequantized; tol: what the format allows. */
static float stored(const kv_cache *kv, int quant, int is_v, size_t elem, size_t row, int i) {
    if (quant == HEARTH_KV_INT8) return (float)(is_v ? kv->v8 : kv->k8)[elem + i] * (is_v ? kv->v_scale : kv->k_scale)[row];
    return (is_v ? kv->v : kv->k)[elem + i];
}

static void expect_cell(float got, float want, int quant, float scale) {
    if (fabsf(got - want) > (quant == HEARTH_KV_INT8 ? scale * 0.51f : 0.0f)) {
        print_error("stored %g, expected %g\n", (double)got, (double)want);
        fail();
    }
}

/* Every cell of slots [0, n) (positions lens[slot]) through the pool's raw arrays at the
 * oracle's address, and through the layer view's kv_row (the kernels' path). */
static void check_cells(const kv_cache *kv, const shape *s, int quant, int n_slots, const int *src_slot) {
    for (int slot = 0; slot < n_slots; slot++)
        for (int l = 0; l < s->n_layers; l++) {
            int hn = s->layered ? s->heads[l] : s->heads[0], d = s->layered ? s->dims[l] : s->dims[0];
            kv_cache view;
            int vl = kv_layer_view(kv, l, &view);
            for (int p = 0; p < lens[src_slot[slot]]; p++)
                for (int h = 0; h < hn; h++) {
                    int b = kv->tables[(size_t)slot * kv->max_blocks_per_slot + p / KV_BLOCK_SIZE];
                    size_t row = oracle_row(s, l, b, h, p), elem = oracle_elem(s, l, b, h, p);
                    size_t vrow = kv_row(&view, vl, slot, p, h);
                    for (int i = 0; i < d; i++) {
                        float want = cell(l, src_slot[slot], p, h, i);
                        float sk = quant == HEARTH_KV_INT8 ? kv->k_scale[row] : 0, sv = quant == HEARTH_KV_INT8 ? kv->v_scale[row] : 0;
                        expect_cell(stored(kv, quant, 0, elem, row, i), want, quant, sk);
                        expect_cell(stored(kv, quant, 1, elem, row, i), -want, quant, sv);
                        /* the view's row: the same bytes */
                        assert_true(stored(&view, quant, 0, vrow * d, vrow, i) == stored(kv, quant, 0, elem, row, i));
                        assert_true(stored(&view, quant, 1, vrow * d, vrow, i) == stored(kv, quant, 1, elem, row, i));
                        if (quant == HEARTH_KV_FLOAT && !s->layered) {
                            assert_true(kv_key(kv, l, slot, p, h)[i] == kv->k[elem + i]);
                            assert_true(kv_value(kv, l, slot, p, h)[i] == kv->v[elem + i]);
                        }
                    }
                }
        }
}

/* Slot `from`'s rows out through kv_slot_rows_read into a saved-sequence file (the layout
 * seq_file.c writes: per layer and head keys, values, scales), parsed back and written
 * into slot `to` through kv_slot_rows_write. */
static void file_round_trip(kv_cache *kv, const shape *s, int quant, int from, int to) {
    int n = lens[from], maxd = kv->head_dim, scaled = quant == HEARTH_KV_INT8;
    size_t eb = kv_elem_bytes(quant), rowb = (size_t)maxd * eb;
    kv_file_shape fs = {.model_id = 7, .kv_quant = (uint32_t)quant, .n_layers = (uint32_t)s->n_layers,
                        .n_kv_heads = (uint32_t)kv->n_kv_heads, .head_dim = (uint32_t)maxd, .n_tokens = (uint32_t)n};
    uint8_t *keys = calloc((size_t)n, rowb), *values = calloc((size_t)n, rowb);
    float *scales = calloc((size_t)2 * n, sizeof(float));
    int32_t *tokens = calloc((size_t)n, sizeof(int32_t));
    FILE *f = tmpfile();
    assert_non_null(f);
    kv_file_writer w;
    kv_file_begin(&w, f, &fs);
    kv_file_put(&w, tokens, (size_t)n * sizeof(int32_t));
    for (int l = 0; l < s->n_layers; l++) {
        kv_cache view;
        int vl = kv_layer_view(kv, l, &view);
        for (int h = 0; h < kv->n_kv_heads; h++) {
            memset(keys, 0, (size_t)n * rowb), memset(values, 0, (size_t)n * rowb), memset(scales, 0, 2 * n * sizeof(float));
            if (h < view.n_kv_heads) { /* rows of the layer's own dim, padded to the largest */
                size_t own = (size_t)view.head_dim * eb;
                uint8_t *k = malloc((size_t)n * own), *v = malloc((size_t)n * own);
                kv_slot_rows_read(&view, vl, from, h, n, k, v, scaled ? scales : NULL, scaled ? scales + n : NULL);
                for (int p = 0; p < n; p++) memcpy(keys + p * rowb, k + p * own, own), memcpy(values + p * rowb, v + p * own, own);
                free(k), free(v);
            }
            kv_file_put(&w, keys, (size_t)n * rowb);
            kv_file_put(&w, values, (size_t)n * rowb);
            if (scaled) kv_file_put(&w, scales, 2 * (size_t)n * sizeof(float));
        }
    }
    assert_int_equal(kv_file_end(&w), 0);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    uint8_t *bytes = malloc((size_t)size);
    rewind(f);
    assert_int_equal(fread(bytes, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    kv_file_view fv;
    assert_int_equal(kv_file_parse(bytes, (size_t)size, "round-trip", &fv, NULL), HEARTH_OK);
    const uint8_t *at = fv.kv;
    size_t head_bytes = (size_t)kv_file_head_bytes(&fv.shape);
    for (int l = 0; l < s->n_layers; l++) {
        kv_cache view;
        int vl = kv_layer_view(kv, l, &view);
        for (int h = 0; h < kv->n_kv_heads; h++, at += head_bytes) {
            if (h >= view.n_kv_heads) continue;
            size_t own = (size_t)view.head_dim * eb;
            uint8_t *k = malloc((size_t)n * own), *v = malloc((size_t)n * own);
            for (int p = 0; p < n; p++) memcpy(k + p * own, at + p * rowb, own), memcpy(v + p * own, at + (size_t)n * rowb + p * rowb, own);
            float sc[2 * CONTEXT];
            if (scaled) memcpy(sc, at + 2 * (size_t)n * rowb, 2 * (size_t)n * sizeof(float));
            kv_slot_rows_write(&view, vl, to, h, n, k, v, scaled ? sc : NULL, scaled ? sc + n : NULL);
            free(k), free(v);
        }
    }
    free(bytes), free(keys), free(values), free(scales), free(tokens);
}

static void run_layout(const shape *s, int quant) {
    kv_cache kv;
    hearth_status st = s->layered ? kv_create_layers(&kv, s->n_layers, s->heads, s->dims, SLOTS + 1, CONTEXT, BLOCKS,
                                                     quant, 1, NULL)
                                  : kv_create_quant(&kv, s->n_layers, s->heads[0], s->dims[0], SLOTS + 1, CONTEXT,
                                                    BLOCKS, quant, NULL);
    assert_int_equal(st, HEARTH_OK);
    float key[64], val[64];
    /* interleaved reservations: the slots' blocks are scattered over the pool */
    for (int p = 1; p <= CONTEXT; p += 16)
        for (int slot = 0; slot < SLOTS; slot++)
            assert_int_equal(kv_reserve(&kv, slot, p < lens[slot] ? p : lens[slot], NULL), HEARTH_OK);
    for (int slot = 0; slot < SLOTS; slot++)
        for (int l = 0; l < s->n_layers; l++)
            for (int p = 0; p < lens[slot]; p++)
                for (int h = 0; h < (s->layered ? s->heads[l] : s->heads[0]); h++) {
                    for (int i = 0; i < (s->layered ? s->dims[l] : s->dims[0]); i++)
                        key[i] = cell(l, slot, p, h, i), val[i] = -key[i];
                    kv_store(&kv, l, slot, p, h, key, val);
                }
    int same[SLOTS + 1] = {0, 1, 2, 0};
    check_cells(&kv, s, quant, SLOTS, same);

    /* slot 0 out to a file and back into slot 3 */
    assert_int_equal(kv_reserve(&kv, SLOTS, lens[0], NULL), HEARTH_OK);
    file_round_trip(&kv, s, quant, 0, SLOTS);
    int from_file[SLOTS + 1] = {0, 1, 2, 0};
    check_cells(&kv, s, quant, SLOTS + 1, from_file);

    /* kv_copy_rows: 7 rows of slot 2's block 1 into slot 3's block 2 (positions 32..38 of
     * slot 3 become slot 2's 16..22); rows 7.. of that block were never written (slot 0
     * holds 37 positions) and stay zero */
    int32_t src = kv.tables[2 * kv.max_blocks_per_slot + 1], dst = kv.tables[3 * kv.max_blocks_per_slot + 2];
    kv_copy_rows(&kv, src, dst, 7);
    for (int l = 0; l < s->n_layers; l++) {
        kv_cache view;
        int vl = kv_layer_view(&kv, l, &view);
        int hn = s->layered ? s->heads[l] : s->heads[0], d = s->layered ? s->dims[l] : s->dims[0];
        for (int h = 0; h < hn; h++)
            for (int r = 0; r < KV_BLOCK_SIZE; r++) {
                size_t row = kv_row(&view, vl, 3, 32 + r, h);
                size_t orow = oracle_row(s, l, dst, h, r), oelem = oracle_elem(s, l, dst, h, r);
                for (int i = 0; i < d; i++) {
                    float got = stored(&view, quant, 0, row * d, row, i);
                    assert_true(got == stored(&kv, quant, 0, oelem, orow, i));
                    if (r < 7) expect_cell(got, cell(l, 2, 16 + r, h, i), quant, quant == HEARTH_KV_INT8 ? view.k_scale[row] : 0);
                    else assert_true(got == 0.0f);
                }
            }
    }
    /* the other slots' cells are untouched by the copy */
    check_cells(&kv, s, quant, SLOTS, same);
    kv_destroy(&kv);
}

static void test_block_major(void **state) {
    (void)state;
    const int heads[1] = {3}, dims[1] = {24};
    shape s = {.n_layers = 5, .layered = 0, .heads = heads, .dims = dims};
    run_layout(&s, HEARTH_KV_FLOAT);
    run_layout(&s, HEARTH_KV_INT8);
}

static void test_layers_of_their_own_shape(void **state) {
    (void)state;
    const int heads[4] = {2, 1, 3, 1}, dims[4] = {16, 64, 8, 40};
    shape s = {.n_layers = 4, .layered = 1, .heads = heads, .dims = dims};
    run_layout(&s, HEARTH_KV_FLOAT);
    run_layout(&s, HEARTH_KV_INT8);
}

/* A block-major pool's key and value arrays are 2 MiB aligned (transparent huge pages
 * can back them) and its resident memory follows the blocks written, within one 2 MiB
 * page per array: 64 blocks of 128 KiB per array written make ~16 MiB resident, not the
 * pool's 1 GiB. */
static void test_resident_follows_blocks(void **state) {
    (void)state;
    kv_cache kv;
    /* 4 layers, 4 KV heads of 128: 128 KiB per block and array; 4096 blocks = 512 MiB each */
    assert_int_equal(kv_create(&kv, 4, 4, 128, 1, 4096 * KV_BLOCK_SIZE, 4096, NULL), HEARTH_OK);
    assert_int_equal((uintptr_t)kv.k % (2u << 20), 0);
    assert_int_equal((uintptr_t)kv.v % (2u << 20), 0);
    long long before = hearth_proc_kb_field("/proc/self/status", "VmRSS") / 1024;
    assert_int_equal(kv_reserve(&kv, 0, 64 * KV_BLOCK_SIZE, NULL), HEARTH_OK);
    float key[128], val[128];
    for (int i = 0; i < 128; i++) key[i] = (float)i, val[i] = -(float)i;
    for (int p = 0; p < 64 * KV_BLOCK_SIZE; p++)
        for (int l = 0; l < 4; l++)
            for (int h = 0; h < 4; h++) kv_store(&kv, l, 0, p, h, key, val);
    long long grown = hearth_proc_kb_field("/proc/self/status", "VmRSS") / 1024 - before, written = 2 * 64 * 128; /* KiB */
    assert_true(grown >= written * 9 / 10);
    assert_true(grown <= written + 2 * 2048 + 1024); /* at most one partial 2 MiB page per array */
    kv_destroy(&kv);
}

/* Whether the mapping holding p carries VmFlag fl in /proc/self/smaps ("hg": MADV_HUGEPAGE). */
static int smaps_flag(const void *p, const char *fl) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            char want[8];
            snprintf(want, sizeof want, " %s", fl);
            found = strstr(line, want) != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

/* mem_set_hugepages (the CLI's --no-hugepages): with it off, neither the KV reservation nor
 * a streamed buffer is advised MADV_HUGEPAGE; on (the default) both are, where the kernel
 * has transparent huge pages. */
static void test_hugepages_switch(void **state) {
    (void)state;
    size_t n = (size_t)8 << 20;
    int thp = access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) == 0;
    void *r = mem_alloc_reserved(n, 1), *w = mem_alloc_stream(n);
    assert_non_null(r);
    assert_non_null(w);
    if (thp) {
        assert_int_equal(smaps_flag(r, "hg"), 1);
        assert_int_equal(smaps_flag(w, "hg"), 1);
    }
    mem_free_reserved(r, n);
    free(w);
    mem_set_hugepages(0);
    r = mem_alloc_reserved(n, 1), w = mem_alloc_stream(n);
    assert_non_null(r);
    assert_non_null(w);
    assert_int_equal(smaps_flag(r, "hg"), 0);
    assert_int_equal(smaps_flag(w, "hg"), 0);
    mem_free_reserved(r, n);
    free(w);
    mem_set_hugepages(1);
}

/* mem_alloc_filled (an adapter's block): every page resident when it returns (VmRSS grows
 * by the whole size before anything is written), read as zeros, released by
 * mem_free_reserved (VmRSS falls back). */
static void test_filled_resident(void **state) {
    (void)state;
    size_t n = (size_t)64 << 20;
    long long before = hearth_proc_kb_field("/proc/self/status", "VmRSS");
    unsigned char *p = mem_alloc_filled(n);
    assert_non_null(p);
    long long grown = hearth_proc_kb_field("/proc/self/status", "VmRSS") - before;
    assert_true(grown >= (long long)(n / 1024) * 95 / 100);
    for (size_t i = 0; i < n; i += 4096) assert_int_equal(p[i], 0);
    p[n - 1] = 7;
    long long held = hearth_proc_kb_field("/proc/self/status", "VmRSS");
    mem_free_reserved(p, n);
    /* the block's pages leave (a sanitizer's shadow of the reads above may stay) */
    long long dropped = held - hearth_proc_kb_field("/proc/self/status", "VmRSS");
    assert_true(dropped >= (long long)(n / 1024) * 3 / 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_block_major),
                                       cmocka_unit_test(test_layers_of_their_own_shape),
                                       cmocka_unit_test(test_resident_follows_blocks),
                                       cmocka_unit_test(test_hugepages_switch), cmocka_unit_test(test_filled_resident)};
    return cmocka_run_group_tests_name("kv_layout", tests, NULL, NULL);
}
