/* test_kv_prefix.c: the prefix cache's block metadata (kv_prefix.c): hash chains,
 * attach/commit, reference counts shared between slots, the LRU order of eviction,
 * stale chains after eviction, and that every block is always free, cached or held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "engine/kv_prefix.h"

#define B KV_BLOCK_SIZE

static int held_blocks(const kv_cache *kv) {
    int n = 0;
    for (int s = 0; s < kv->max_slots; s++)
        for (int i = 0; i < kv->max_blocks_per_slot; i++) n += kv->tables[s * kv->max_blocks_per_slot + i] >= 0;
    return n;
}

/* Every block is exactly one of: free, cached (unreferenced), held by a slot. Holds
 * only while no block is held by two slots (callers check that case separately). */
static void assert_accounted(const kv_cache *kv) {
    assert_int_equal(kv->n_free + kv_blocks_cached(kv) + held_blocks(kv), kv->n_blocks);
}

static int32_t block_of(const kv_cache *kv, int slot, int i) { return kv->tables[slot * kv->max_blocks_per_slot + i]; }

static void fill(int32_t *t, int n, int32_t base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

/* A slot that computed tokens[0..n): reserve, then name its full blocks. */
static void compute(kv_cache *kv, int slot, const int32_t *tokens, int n) {
    assert_int_equal(kv_reserve(kv, slot, n, NULL), HEARTH_OK);
    kv_prefix_commit(kv, slot, tokens, n);
}

static void test_hash(void **state) {
    (void)state;
    int32_t a[B], b[B];
    fill(a, B, 100);
    fill(b, B, 100);
    assert_true(kv_block_hash(0, a) == kv_block_hash(0, b));
    b[15]++;
    assert_true(kv_block_hash(0, a) != kv_block_hash(0, b));
    assert_true(kv_block_hash(0, a) != kv_block_hash(1, a)); /* the chain: same tokens, other prefix */
    int32_t z[B] = {0};
    assert_true(kv_block_hash(0, z) != 0);
}

static void test_attach_reuses_full_blocks(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 16, NULL), HEARTH_OK);
    int32_t t[80];
    fill(t, 80, 7);
    assert_int_equal(kv_prefix_attach(&kv, 0, t, 40), 0); /* nothing cached yet */
    compute(&kv, 0, t, 40);                               /* blocks 0,1 full, 2 partial */
    int32_t b0 = block_of(&kv, 0, 0), b1 = block_of(&kv, 0, 1);
    kv_release(&kv, 0);
    assert_int_equal(kv_blocks_cached(&kv), 2); /* the partial block went back to the free list */
    assert_accounted(&kv);
    assert_int_equal(kv_prefix_attach(&kv, 1, t, 40), 32);
    assert_int_equal(kv.n_tokens[1], 32);
    assert_int_equal(block_of(&kv, 1, 0), b0);
    assert_int_equal(block_of(&kv, 1, 1), b1);
    assert_int_equal(kv_blocks_cached(&kv), 0); /* held now, not evictable */
    assert_false(kv_position_writable(&kv, 1, 31));
    assert_int_equal(kv_reserve(&kv, 1, 41, NULL), HEARTH_OK);
    assert_true(kv_position_writable(&kv, 1, 32));
    kv_release(&kv, 1);
    /* exactly 32 tokens: the last block holds the last token, whose logits are needed */
    assert_int_equal(kv_prefix_attach(&kv, 0, t, 32), 16);
    kv_release(&kv, 0);
    /* a different second block: only the first matches */
    int32_t u[40];
    memcpy(u, t, sizeof u);
    u[20] = 99999;
    assert_int_equal(kv_prefix_attach(&kv, 0, u, 40), 16);
    kv_release(&kv, 0);
    /* the same second block after a different first: no match (the chain names the prefix) */
    memcpy(u, t, sizeof u);
    u[0] = 5;
    assert_int_equal(kv_prefix_attach(&kv, 0, u, 40), 0);
    kv_release(&kv, 0);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

static void test_shared_refcounts(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 12, NULL), HEARTH_OK);
    int32_t t[64];
    fill(t, 64, 1);
    compute(&kv, 0, t, 48); /* 3 blocks, all named while slot 0 still runs */
    assert_int_equal(kv_prefix_attach(&kv, 1, t, 64), 48);
    assert_int_equal(kv_prefix_attach(&kv, 2, t, 40), 32);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(block_of(&kv, 1, i), block_of(&kv, 0, i));
        assert_int_equal(block_of(&kv, 2, i), block_of(&kv, 0, i));
    }
    assert_false(kv_position_writable(&kv, 0, 47)); /* shared: nobody writes there */
    assert_int_equal(kv.n_free, 9);
    kv_release(&kv, 0);
    kv_release(&kv, 1);
    assert_int_equal(kv_blocks_cached(&kv), 1); /* block 2: slot 2 still holds blocks 0 and 1 */
    assert_int_equal(kv_blocks_available(&kv), 10);
    kv_release(&kv, 2);
    assert_int_equal(kv_blocks_cached(&kv), 3);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

static void test_lru_eviction(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 2, 128, 4, NULL), HEARTH_OK);
    int32_t a[32], b[32], c[64];
    fill(a, 32, 1000);
    fill(b, 32, 2000);
    fill(c, 64, 3000);
    compute(&kv, 0, a, 32);
    kv_release(&kv, 0); /* a's 2 blocks cached (older) */
    compute(&kv, 0, b, 32);
    kv_release(&kv, 0); /* b's 2 blocks cached (newer) */
    assert_int_equal(kv.n_free, 0);
    assert_int_equal(kv_blocks_cached(&kv), 4);
    assert_int_equal(kv_blocks_available(&kv), 4);
    /* touching a makes it the most recent: b is evicted first */
    assert_int_equal(kv_prefix_attach(&kv, 0, a, 33), 32);
    kv_release(&kv, 0);
    assert_int_equal(kv_reserve(&kv, 1, 17, NULL), HEARTH_OK); /* 2 blocks: both of b's */
    assert_int_equal(kv_prefix_attach(&kv, 0, b, 33), 0);
    assert_int_equal(kv_prefix_attach(&kv, 0, a, 33), 32);
    assert_accounted(&kv);
    hearth_error err = {0};
    assert_int_equal(kv_reserve(&kv, 0, 48, &err), HEARTH_ERR_NOMEM); /* all 4 held */
    kv_release(&kv, 0);
    kv_release(&kv, 1);
    /* within a chain the tail goes first: evicting one block keeps a's first block */
    assert_int_equal(kv_reserve(&kv, 1, 48, NULL), HEARTH_OK); /* 3 of 4: both free + a's tail */
    assert_int_equal(kv_prefix_attach(&kv, 0, a, 33), 16);
    kv_release(&kv, 0);
    kv_release(&kv, 1);
    (void)c;
    assert_accounted(&kv);
    kv_destroy(&kv);
}

/* A slot whose chain runs through a cached copy it does not hold (it computed the same
 * prefix at the same time as another slot): once that copy is evicted, the slot's later
 * blocks are not named (their parent is gone), and nothing stale ever matches. */
static void test_stale_parent(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 6, NULL), HEARTH_OK);
    int32_t t[65], x[32];
    fill(t, 65, 10);
    fill(x, 32, 500);
    compute(&kv, 0, t, 32); /* p0, p1 named */
    assert_int_equal(kv_reserve(&kv, 1, 64, NULL), HEARTH_OK);
    kv_prefix_commit(&kv, 1, t, 40); /* q0, q1 private copies; the chain ends at p1 */
    kv_release(&kv, 0);              /* p1, p0 cached */
    assert_int_equal(kv_blocks_cached(&kv), 2);
    compute(&kv, 2, x, 32); /* evicts both p blocks, names x there */
    assert_int_equal(kv_blocks_cached(&kv), 0);
    kv_prefix_commit(&kv, 1, t, 64); /* q2, q3: their parent p1 is gone, not named */
    kv_release(&kv, 1);
    assert_int_equal(kv_blocks_cached(&kv), 0);
    assert_int_equal(kv_prefix_attach(&kv, 0, t, 65), 0);
    kv_release(&kv, 0);
    assert_int_equal(kv_prefix_attach(&kv, 0, x, 33), 32);
    kv_release(&kv, 0);
    kv_release(&kv, 2);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

/* Two slots that computed the same prefix at once: one copy is named, the other stays
 * private (returned to the free list), and the second slot's later blocks still chain. */
static void test_duplicate_commit(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 8, NULL), HEARTH_OK);
    int32_t t[48];
    fill(t, 48, 77);
    assert_int_equal(kv_reserve(&kv, 0, 32, NULL), HEARTH_OK);
    assert_int_equal(kv_reserve(&kv, 1, 48, NULL), HEARTH_OK);
    kv_prefix_commit(&kv, 0, t, 32);
    kv_prefix_commit(&kv, 1, t, 48); /* blocks 0,1 duplicate slot 0's; block 2 is new */
    kv_release(&kv, 1);
    assert_int_equal(kv_blocks_cached(&kv), 1); /* slot 1's third block */
    assert_int_equal(kv.n_free, 8 - 2 - 1);
    kv_release(&kv, 0);
    assert_int_equal(kv_blocks_cached(&kv), 3);
    assert_int_equal(kv_prefix_attach(&kv, 2, t, 48), 32);
    int32_t u[49];
    memcpy(u, t, sizeof t);
    u[48] = 1;
    kv_release(&kv, 2);
    assert_int_equal(kv_prefix_attach(&kv, 2, u, 49), 48); /* through slot 0's blocks into slot 1's */
    kv_release(&kv, 2);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

/* Many rounds of random prompts over a small pool: the accounting never drifts and
 * every attach returns a chain whose stored tokens are the prompt's. */
static void test_churn(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 2, 256, 24, NULL), HEARTH_OK);
    uint64_t rng = 12345;
    int32_t t[200];
    for (int round = 0; round < 2000; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int family = (int)(rng >> 60) % 4, n = 1 + (int)((rng >> 33) % 150);
        for (int i = 0; i < n; i++) t[i] = family * 1000 + i; /* 4 prompt families sharing prefixes */
        int got = kv_prefix_attach(&kv, 0, t, n);
        assert_true(got % B == 0 && got < n);
        if (kv_reserve(&kv, 0, n, NULL) == HEARTH_OK) kv_prefix_commit(&kv, 0, t, n);
        assert_accounted(&kv);
        kv_release(&kv, 0);
        assert_int_equal(kv.n_free + kv_blocks_cached(&kv), kv.n_blocks);
    }
    kv_destroy(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_attach_reuses_full_blocks),
        cmocka_unit_test(test_shared_refcounts),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_stale_parent),
        cmocka_unit_test(test_duplicate_commit),
        cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests_name("kv_prefix", tests, NULL, NULL);
}
