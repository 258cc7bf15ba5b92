/* test_kv_state.c: the recurrent-state pool's snapshots (src/kv/kv_state.h): a snapshot is
 * found by (length, chain hash) only, loads back exactly what was saved, a sequence's rolling
 * snapshot is overwritten by its next one and never by another sequence's, a kept one is
 * evicted least recently used first, and a released slot's rolling snapshot becomes an
 * ordinary one; speculation's backup records are never named or reused by the prefix cache. The chain hash names a
 * prefix: it changes with any of its tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_state.h"

enum { SLOTS = 3, LAYERS = 2, FLOATS = 5, SNAPS = 4 };

static void fill(kv_cache *kv, int slot, float v) {
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < FLOATS; i++) kv_state_at(kv, l, slot)[i] = v + l * 10 + i;
}
static int holds(const kv_cache *kv, int slot, float v) {
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < FLOATS; i++)
            if (kv_state_at(kv, l, slot)[i] != v + l * 10 + i) return 0;
    return 1;
}

static void test_snapshots(void **st) {
    (void)st;
    kv_cache kv = {.max_slots = SLOTS};
    hearth_error err = {0};
    assert_int_equal(kv_state_attach(&kv, LAYERS, FLOATS, SNAPS, &err), HEARTH_OK);
    assert_true(holds(&kv, 0, 0.0f) == 0 && kv_state_at(&kv, 1, 2)[4] == 0.0f); /* zeroed */
    fill(&kv, 0, 100), kv_state_snap_save(&kv, 0, 16, 0xA, 0); /* kept */
    fill(&kv, 0, 200), kv_state_snap_save(&kv, 0, 32, 0xB, 1); /* slot 0 rolling */
    fill(&kv, 0, 300), kv_state_snap_save(&kv, 0, 48, 0xC, 1); /* overwrites it */
    assert_int_equal(kv_state_snap_find(&kv, 32, 0xB), -1);
    assert_int_equal(kv_state_snap_find(&kv, 16, 0xB), -1); /* length and hash both */
    int a = kv_state_snap_find(&kv, 16, 0xA), c = kv_state_snap_find(&kv, 48, 0xC);
    assert_true(a >= 0 && c >= 0 && a != c);
    kv_state_snap_load(&kv, a, 1);
    assert_true(holds(&kv, 1, 100));
    kv_state_snap_load(&kv, c, 2);
    assert_true(holds(&kv, 2, 300));
    /* slot 1's rolling snapshots never take slot 0's */
    fill(&kv, 1, 400), kv_state_snap_save(&kv, 1, 16, 0xD, 1);
    fill(&kv, 1, 500), kv_state_snap_save(&kv, 1, 32, 0xE, 1);
    assert_true(kv_state_snap_find(&kv, 48, 0xC) >= 0 && kv_state_snap_find(&kv, 16, 0xD) < 0);
    /* kept ones take the least recently used record that no running sequence rolls into:
     * a (loaded above, so newer) stays; the last free record goes first, then a */
    fill(&kv, 2, 600);
    int f = kv_state_snap_save(&kv, 2, 64, 0xF, 0); /* the record it copied into (a device copy follows it) */
    assert_int_equal(f, kv_state_snap_find(&kv, 64, 0xF));
    fill(&kv, 2, 700), kv_state_snap_save(&kv, 2, 80, 0x10, 0);
    assert_int_equal(kv_state_snap_find(&kv, 16, 0xA), -1);
    assert_true(kv_state_snap_find(&kv, 48, 0xC) >= 0 && kv_state_snap_find(&kv, 32, 0xE) >= 0);
    assert_true(kv_state_snap_find(&kv, 64, 0xF) >= 0 && kv_state_snap_find(&kv, 80, 0x10) >= 0);
    /* the same name again is only refreshed, its content kept */
    fill(&kv, 2, 800);
    assert_int_equal(kv_state_snap_save(&kv, 2, 64, 0xF, 0), -1); /* nothing copied */
    kv_state_snap_load(&kv, kv_state_snap_find(&kv, 64, 0xF), 0);
    assert_true(holds(&kv, 0, 600));
    /* slot 0's sequence ends: its rolling snapshot (0xC) is ordinary now and the oldest */
    kv_state_slot_release(&kv, 0);
    fill(&kv, 2, 900), kv_state_snap_save(&kv, 2, 96, 0x11, 0);
    assert_int_equal(kv_state_snap_find(&kv, 48, 0xC), -1);
    assert_true(kv_state_snap_find(&kv, 32, 0xE) >= 0); /* slot 1 still rolls into its own */
    /* a snapshot whose device copy failed is forgotten */
    kv_state_snap_drop(&kv, kv_state_snap_find(&kv, 96, 0x11));
    assert_int_equal(kv_state_snap_find(&kv, 96, 0x11), -1);
    assert_int_equal(kv_state_bytes(SLOTS, LAYERS, FLOATS, SNAPS),
                     sizeof(kv_state) + (SLOTS + SNAPS) * LAYERS * FLOATS * sizeof(float) + SNAPS * sizeof(kv_snap_meta));
    kv_state_free(&kv);
    assert_null(kv.state);
}

/* Speculation's backups (kv_state_reserve_spec, kv_state_spec_copy): the last records hold a slot's state and give
 * it back exactly; the prefix cache's saves never take them, however many it makes, and a
 * backup is never found by name. */
static void test_spec_backups(void **st) {
    (void)st;
    kv_cache kv = {.max_slots = SLOTS};
    assert_int_equal(kv_state_attach(&kv, LAYERS, FLOATS, SNAPS, NULL), HEARTH_OK);
    kv_state_reserve_spec(&kv, 2);
    assert_int_equal(kv.state->n_spec, 2);
    fill(&kv, 1, 100.0f);
    assert_int_equal(kv_state_spec_record(&kv, 1), SNAPS - 1);
    kv_state_spec_copy(&kv, 1, 1, 1);
    fill(&kv, 1, 7.0f);
    for (int n = 1; n <= 8; n++) { /* more saves than records: only the first two are reused */
        fill(&kv, 0, (float)n);
        int i = kv_state_snap_save(&kv, 0, n * 16, 1000 + (uint64_t)n, 0);
        assert_true(i >= 0 && i < SNAPS - 2);
    }
    kv_state_spec_copy(&kv, 2, 1, 0);
    assert_true(holds(&kv, 2, 100.0f));
    assert_true(holds(&kv, 1, 7.0f));
    kv_state_reserve_spec(&kv, 9); /* at most every record */
    assert_int_equal(kv.state->n_spec, SNAPS);
    assert_int_equal(kv_state_snap_save(&kv, 0, 16, 1, 0), -1);
    kv_state_free(&kv);
}

static void test_chain_hash(void **st) {
    (void)st;
    int32_t t[48];
    for (int i = 0; i < 48; i++) t[i] = i * 7 + 1;
    uint64_t h32 = kv_state_chain_hash(0, t, 32), h48 = kv_state_chain_hash(0, t, 48);
    assert_true(h32 != h48 && h32 != kv_state_chain_hash(0, t, 16));
    assert_true(kv_state_chain_hash(0, t, 40) == h32); /* whole blocks only */
    t[3]++;
    assert_true(kv_state_chain_hash(0, t, 32) != h32 && kv_state_chain_hash(0, t, 48) != h48);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_snapshots), cmocka_unit_test(test_spec_backups),
                                       cmocka_unit_test(test_chain_hash)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
