/* test_kv_cache.c: the paged KV pool: blocks handed out and returned, slots isolated,
 * positions addressed through block tables, limits refused without side effects; the
 * storage reserved, read as zeros and resident only where written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "kv/kv_cache.h"
#include "engine/fit_internal.h"
#include "hearth.h"

static void test_reserve_release(void **state) {
    (void)state;
    kv_cache kv;
    /* 2 layers, 2 KV heads of 8, 3 slots, context 40 (3 blocks per slot), 5 blocks */
    assert_int_equal(kv_create(&kv, 2, 2, 8, 3, 40, 5, NULL), HEARTH_OK);
    assert_int_equal(kv.max_blocks_per_slot, 3);
    assert_int_equal(kv_reserve(&kv, 0, 17, NULL), HEARTH_OK); /* 2 blocks */
    assert_int_equal(kv.n_free, 3);
    assert_int_equal(kv_reserve(&kv, 0, 20, NULL), HEARTH_OK); /* still 2 */
    assert_int_equal(kv.n_free, 3);
    assert_int_equal(kv_reserve(&kv, 1, 48, NULL), HEARTH_OK); /* 3 blocks */
    assert_int_equal(kv.n_free, 0);
    hearth_error err = {0};
    assert_int_equal(kv_reserve(&kv, 2, 1, &err), HEARTH_ERR_NOMEM); /* pool empty */
    assert_int_equal(kv.n_tokens[2], 0);
    assert_int_equal(kv_reserve(&kv, 0, 49, &err), HEARTH_ERR_INVALID); /* past the block table */
    /* every position of every slot maps to its own storage */
    for (int p = 0; p < 20; p++) kv_key(&kv, 1, 0, p, 1)[3] = (float)p;
    for (int p = 0; p < 48; p++) kv_key(&kv, 1, 1, p, 1)[3] = 100.0f + p;
    for (int p = 0; p < 20; p++) assert_true(kv_key(&kv, 1, 0, p, 1)[3] == (float)p);
    assert_true(kv_key(&kv, 0, 0, 5, 1) != kv_key(&kv, 1, 0, 5, 1));
    assert_true(kv_key(&kv, 1, 0, 5, 0) != kv_key(&kv, 1, 0, 5, 1));
    assert_true(kv_value(&kv, 1, 0, 5, 1) != kv_key(&kv, 1, 0, 5, 1));
    kv_release(&kv, 1);
    assert_int_equal(kv.n_free, 3);
    assert_int_equal(kv_reserve(&kv, 2, 33, NULL), HEARTH_OK);
    for (int p = 0; p < 20; p++) assert_true(kv_key(&kv, 1, 0, p, 1)[3] == (float)p); /* slot 0 untouched */
    kv_release(&kv, 0);
    kv_release(&kv, 2);
    assert_int_equal(kv.n_free, 5);
    kv_destroy(&kv);
}

static void test_bad_sizes(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 0, 2, 8, 1, 16, 1, NULL), HEARTH_ERR_INVALID);
    assert_int_equal(kv_create(&kv, 1, 1, 8, 1, 16, 1, NULL), HEARTH_OK);
    assert_int_equal(kv_reserve(&kv, 5, 1, NULL), HEARTH_ERR_INVALID);
    kv_release(&kv, -1); /* ignored */
    kv_destroy(&kv);
}

static long long rss(void) { return hearth_proc_kb_field("/proc/self/status", "VmRSS"); }

/* A 1 GiB float pool costs no resident memory until written, reads as zeros, and writing
 * one block makes that block's pages resident (16 positions x 4 heads x 128 floats = 32 KiB
 * per layer and array, one 256 KiB run per array in the block-major pool): on transparent
 * huge pages, the 2 MiB page holding it, not a page for each of the 8 layers. */
static void test_storage_is_reserved_not_touched(void **state) {
    (void)state;
    kv_cache kv;
    long long before = rss();
    /* 8 layers, 4 KV heads of 128, 2048 blocks: 2 x 8 x 2048 x 4 x 16 x 128 x 4 = 1 GiB */
    assert_int_equal(kv_create(&kv, 8, 4, 128, 4, 8192, 2048, NULL), HEARTH_OK);
    long long reserved = rss();
    assert_true(reserved - before < (16 << 20)); /* the tables only, not the 1 GiB */
    assert_int_equal(kv_reserve(&kv, 0, 16, NULL), HEARTH_OK);
    for (int l = 0; l < 8; l++)
        for (int h = 0; h < 4; h++)
            for (int p = 0; p < 16; p++) {
                assert_true(kv_key(&kv, l, 0, p, h)[127] == 0.0f && kv_value(&kv, l, 0, p, h)[0] == 0.0f);
                kv_key(&kv, l, 0, p, h)[0] = 1.0f;
                kv_value(&kv, l, 0, p, h)[0] = 2.0f;
            }
    long long used = rss();
    assert_true(used - reserved < 2 * (2 << 20) + (1 << 20)); /* the block's pages, not more */
    assert_true(kv_key(&kv, 7, 0, 15, 3)[0] == 1.0f && kv_value(&kv, 7, 0, 15, 3)[0] == 2.0f);
    kv_destroy(&kv);
    assert_true(rss() - before < (16 << 20)); /* returned */
}

/* Layers of their own shapes (Gemma 4): each layer's rows are where its view says, disjoint
 * from every other layer's, stored and copied (float and int8) through the view, and the
 * storage is the sum of the layers' (kv_storage_bytes_layers, what fit counts). */
static void test_layers_of_their_own_shape(void **state) {
    (void)state;
    const int heads[3] = {2, 1, 2}, dims[3] = {8, 32, 16};
    for (int quant = HEARTH_KV_FLOAT; quant <= HEARTH_KV_INT8; quant++) {
        kv_cache kv;
        assert_int_equal(kv_create_layers(&kv, 3, heads, dims, 2, 64, 6, quant, 1, NULL), HEARTH_OK);
        assert_int_equal(kv.n_kv_heads, 2);
        assert_int_equal(kv.head_dim, 32);
        assert_int_equal(kv_reserve(&kv, 0, 40, NULL), HEARTH_OK); /* 3 blocks */
        assert_int_equal(kv_reserve(&kv, 1, 20, NULL), HEARTH_OK); /* 2 blocks */
        float key[32], val[32], back[32];
        for (int l = 0; l < 3; l++)
            for (int slot = 0; slot < 2; slot++)
                for (int p = 0; p < (slot ? 20 : 40); p++)
                    for (int h = 0; h < heads[l]; h++) {
                        for (int i = 0; i < dims[l]; i++) key[i] = (float)(l * 1000 + slot * 100 + p + h * 7 + i), val[i] = -key[i];
                        kv_store(&kv, l, slot, p, h, key, val);
                    }
        for (int l = 0; l < 3; l++) {
            kv_cache view;
            int vl = kv_layer_view(&kv, l, &view);
            assert_int_equal(vl, 0);
            assert_int_equal(view.n_kv_heads, heads[l]);
            assert_int_equal(view.head_dim, dims[l]);
            for (int slot = 0; slot < 2; slot++)
                for (int p = 0; p < (slot ? 20 : 40); p++)
                    for (int h = 0; h < heads[l]; h++) {
                        size_t row = kv_row(&view, vl, slot, p, h), off = row * (size_t)dims[l];
                        for (int i = 0; i < dims[l]; i++)
                            back[i] = quant == HEARTH_KV_INT8 ? view.k8[off + i] * view.k_scale[row] : view.k[off + i];
                        for (int i = 0; i < dims[l]; i++) {
                            float want = (float)(l * 1000 + slot * 100 + p + h * 7 + i);
                            /* int8: within half a step of the row's scale (amax / 127) */
                            assert_true(fabsf(back[i] - want) <= (quant == HEARTH_KV_INT8 ? view.k_scale[row] * 0.51f : 0.0f));
                        }
                    }
        }
        /* a partial block copied for every layer: block 0 of slot 0 into slot 1's block 0 */
        int32_t src = kv.tables[0], dst = kv.tables[kv.max_blocks_per_slot];
        kv_copy_rows(&kv, src, dst, 5);
        for (int l = 0; l < 3; l++) {
            kv_cache view;
            int vl = kv_layer_view(&kv, l, &view);
            size_t a = kv_row(&view, vl, 0, 3, heads[l] - 1), b = kv_row(&view, vl, 1, 3, heads[l] - 1);
            if (quant == HEARTH_KV_INT8) assert_memory_equal(view.k8 + a * dims[l], view.k8 + b * dims[l], (size_t)dims[l]);
            else assert_memory_equal(view.k + a * dims[l], view.k + b * dims[l], (size_t)dims[l] * sizeof(float));
        }
        size_t want = 0;
        for (int l = 0; l < 3; l++) want += kv_storage_bytes(1, heads[l], dims[l], 6, quant);
        assert_int_equal(kv_storage_bytes_layers(3, heads, dims, 6, quant), want);
        kv_destroy(&kv);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reserve_release), cmocka_unit_test(test_bad_sizes),
                                       cmocka_unit_test(test_storage_is_reserved_not_touched),
                                       cmocka_unit_test(test_layers_of_their_own_shape)};
    return cmocka_run_group_tests_name("kv_cache", tests, NULL, NULL);
}
