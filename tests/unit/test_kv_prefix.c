/* test_kv_prefix.c: the prefix cache's block metadata (kv_prefix.c): hash chains,
 * attach/commit, reference counts shared between slots, the LRU order of eviction,
 * stale chains after eviction, partial matches (a prompt that diverges inside a block,
 * the kept tail of a finished sequence) with their row copies, and that every block is
 * always free, cached or held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "kv/kv_prefix.h"

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

/* The KV row these tests store at position p of a prompt t: its token, its position and
 * a hash of every token up to it (two 24-bit halves, exact as floats). A row found in the
 * cache must have been computed from exactly this prompt's prefix: the oracle for what
 * attach and the partial copy hand out. */
static void row_of(const int32_t *t, int p, float key[4], float value[4]) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i <= p; i++) h = (h ^ (uint32_t)t[i]) * 1099511628211ull;
    key[0] = (float)t[p], key[1] = (float)p, key[2] = (float)(h & 0xffffff), key[3] = (float)((h >> 24) & 0xffffff);
    for (int i = 0; i < 4; i++) value[i] = -key[3 - i];
}

static void write_rows(kv_cache *kv, int slot, const int32_t *t, int from, int to) {
    float k[4], v[4];
    for (int p = from; p < to; p++) row_of(t, p, k, v), kv_store(kv, 0, slot, p, 0, k, v);
}

static void check_rows(const kv_cache *kv, int slot, const int32_t *t, int n) {
    float k[4], v[4];
    for (int p = 0; p < n; p++) {
        row_of(t, p, k, v);
        assert_memory_equal(kv_key(kv, 0, slot, p, 0), k, sizeof k);
        assert_memory_equal(kv_value(kv, 0, slot, p, 0), v, sizeof v);
    }
}

/* attach, then the partial block with its copy done as the scheduler does it */
static int attach_all(kv_cache *kv, int slot, const int32_t *t, int n) {
    int got = kv_prefix_attach(kv, slot, t, n);
    kv_block_copy cp;
    int part = kv_prefix_attach_partial(kv, slot, t, n, &cp);
    if (part) {
        assert_int_equal(cp.rows, part);
        assert_true(cp.src >= 0 && cp.dst >= 0 && cp.src != cp.dst && part < B);
        assert_int_equal(block_of(kv, slot, got / B), cp.dst);
        kv_copy_rows(kv, cp.src, cp.dst, cp.rows);
        kv_block_drop(kv, cp.src);
    } else {
        assert_int_equal(cp.src, -1);
    }
    assert_int_equal(kv->n_tokens[slot], got + part);
    return got + part;
}

/* A slot that computed tokens[0..n) with rows, named its full blocks and kept its tail. */
static void compute_rows(kv_cache *kv, int slot, const int32_t *t, int n) {
    int have = attach_all(kv, slot, t, n);
    assert_int_equal(kv_reserve(kv, slot, n, NULL), HEARTH_OK);
    write_rows(kv, slot, t, have, n);
    kv_prefix_commit_tail(kv, slot, t, n);
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

/* Namespaces (the engine's adapter sets): a prefix computed in one is found in that one only,
 * full blocks and the kept tail alike; a released slot is back in the default namespace. */
static void test_namespaces(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 16, NULL), HEARTH_OK);
    int32_t t[40];
    fill(t, 40, 7);
    kv_prefix_slot_namespace(&kv, 0, 77);
    compute_rows(&kv, 0, t, 40);
    kv_release(&kv, 0);
    assert_int_equal(kv_blocks_cached(&kv), 3);
    assert_int_equal(attach_all(&kv, 1, t, 40), 0); /* the default namespace */
    kv_release(&kv, 1);
    kv_prefix_slot_namespace(&kv, 1, 78);
    assert_int_equal(attach_all(&kv, 1, t, 40), 0); /* another adapter set */
    kv_release(&kv, 1);
    kv_prefix_slot_namespace(&kv, 1, 77);
    assert_int_equal(attach_all(&kv, 1, t, 40), 39);
    check_rows(&kv, 1, t, 39);
    kv_release(&kv, 1);
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
        int family = (int)(rng >> 60) % 4, n = 1 + (int)((rng >> 33) % 150), split = (int)((rng >> 20) % 160);
        /* 4 prompt families sharing prefixes, each prompt leaving its family at a random point */
        for (int i = 0; i < n; i++) t[i] = i < split ? family * 1000 + i : 100000 + (int)(rng >> 45) % 3;
        int got;
        if (round % 2) { /* every other round with partial matches */
            got = attach_all(&kv, 0, t, n);
            assert_true(got < n);
            check_rows(&kv, 0, t, got);
            if (kv_reserve(&kv, 0, n, NULL) == HEARTH_OK) {
                write_rows(&kv, 0, t, got, n);
                kv_prefix_commit_tail(&kv, 0, t, n);
            }
        } else {
            got = kv_prefix_attach(&kv, 0, t, n);
            assert_true(got % B == 0 && got < n);
            check_rows(&kv, 0, t, got);
            if (kv_reserve(&kv, 0, n, NULL) == HEARTH_OK) {
                write_rows(&kv, 0, t, got, n);
                kv_prefix_commit(&kv, 0, t, n);
            }
        }
        assert_accounted(&kv);
        kv_release(&kv, 0);
        assert_int_equal(kv.n_free + kv_blocks_cached(&kv), kv.n_blocks);
    }
    kv_destroy(&kv);
}

/* A prompt that diverges inside a cached block reuses that block's leading rows as a
 * private copy; a finished sequence's last partial block is kept (once per content) and
 * reused by a prompt that starts the same way; the last token is never covered. */
static void test_partial_blocks(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 128, 16, NULL), HEARTH_OK);
    int32_t t[64], u[64];
    fill(t, 64, 7);
    compute_rows(&kv, 0, t, 40); /* blocks 0, 1 full, block 2 holds 8 */
    int32_t b1 = block_of(&kv, 0, 1);
    kv_release(&kv, 0);
    assert_int_equal(kv_blocks_cached(&kv), 3); /* the tail is kept */
    assert_accounted(&kv);
    memcpy(u, t, sizeof u);
    u[21] = 99999; /* diverges at position 21: 16 shared + 5 rows of block 1 */
    assert_int_equal(attach_all(&kv, 1, u, 40), 21);
    assert_true(block_of(&kv, 1, 1) != b1);
    assert_true(kv_position_writable(&kv, 1, 21)); /* the copy is the slot's own */
    check_rows(&kv, 1, u, 21);
    assert_int_equal(kv_blocks_cached(&kv), 2); /* block 1 went back to the LRU after the copy */
    kv_release(&kv, 1);
    /* the same 40 tokens: 32 attached, 7 rows of the kept tail (not the last token) */
    assert_int_equal(attach_all(&kv, 1, t, 40), 39);
    check_rows(&kv, 1, t, 39);
    kv_release(&kv, 1);
    /* a longer prompt: the whole tail (8 rows) */
    assert_int_equal(attach_all(&kv, 1, t, 60), 40);
    check_rows(&kv, 1, t, 40);
    kv_release(&kv, 1);
    /* a tail whose content is kept already stays private; a longer one is kept too */
    compute_rows(&kv, 1, t, 38);
    kv_release(&kv, 1);
    assert_int_equal(kv_blocks_cached(&kv), 3);
    compute_rows(&kv, 1, t, 45);
    kv_release(&kv, 1);
    assert_int_equal(kv_blocks_cached(&kv), 4);
    assert_int_equal(attach_all(&kv, 2, t, 60), 45); /* the longest of the two tails */
    check_rows(&kv, 2, t, 45);
    kv_release(&kv, 2);
    /* a prompt shorter than a block: a tail with no parent */
    fill(u, 10, 5000);
    compute_rows(&kv, 0, u, 10);
    kv_release(&kv, 0);
    assert_int_equal(attach_all(&kv, 0, u, 10), 9);
    check_rows(&kv, 0, u, 9);
    kv_release(&kv, 0);
    assert_int_equal(attach_all(&kv, 0, u, 1), 0); /* one token: its logits are needed */
    kv_release(&kv, 0);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

/* The partial source is held while the destination is taken: with no free block and only
 * the source evictable, there is no partial match (and the source survives); evicted
 * tails and tails of evicted chains are never matched. */
static void test_partial_eviction(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 1, 1, 4, 3, 64, 3, NULL), HEARTH_OK);
    int32_t t[40], x[40];
    fill(t, 40, 100);
    fill(x, 40, 900);
    compute_rows(&kv, 0, t, 20); /* a full block and a tail of 4 */
    kv_release(&kv, 0);
    assert_int_equal(kv_blocks_cached(&kv), 2);
    assert_int_equal(kv_reserve(&kv, 2, 1, NULL), HEARTH_OK); /* the last free block */
    assert_int_equal(kv.n_free, 0);
    /* 16 attached; the tail is the only evictable block: no copy into itself */
    assert_int_equal(attach_all(&kv, 1, t, 30), 16);
    assert_int_equal(kv_blocks_cached(&kv), 1);
    kv_release(&kv, 1);
    kv_release(&kv, 2);
    assert_int_equal(attach_all(&kv, 1, t, 30), 20); /* the tail was kept */
    kv_release(&kv, 1);
    /* x evicts the tail first (released first: the LRU's oldest), then t's full block */
    compute_rows(&kv, 0, x, 17);
    kv_release(&kv, 0);
    assert_int_equal(attach_all(&kv, 1, t, 30), 16);
    check_rows(&kv, 1, t, 16);
    kv_release(&kv, 1);
    compute_rows(&kv, 0, x, 40);
    kv_release(&kv, 0);
    assert_int_equal(attach_all(&kv, 1, t, 30), 0);
    kv_release(&kv, 1);
    assert_accounted(&kv);
    kv_destroy(&kv);
}

/* int8 pools copy the rows' bytes and their scales. */
static void test_copy_rows_int8(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create_quant(&kv, 2, 2, 8, 2, 64, 4, HEARTH_KV_INT8, NULL), HEARTH_OK);
    assert_int_equal(kv_reserve(&kv, 0, 16, NULL), HEARTH_OK);
    float k[8], v[8];
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 16; p++) {
                for (int i = 0; i < 8; i++) k[i] = (float)(l * 100 + h * 10 + p + i), v[i] = -k[i] * 0.5f;
                kv_store(&kv, l, 0, p, h, k, v);
            }
    int32_t src = block_of(&kv, 0, 0);
    assert_int_equal(kv_reserve(&kv, 1, 16, NULL), HEARTH_OK);
    int32_t dst = block_of(&kv, 1, 0);
    kv_copy_rows(&kv, src, dst, 5);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 16; p++) {
                size_t a = kv_row(&kv, l, 0, p, h), b = kv_row(&kv, l, 1, p, h);
                int same = !memcmp(kv.k8 + a * 8, kv.k8 + b * 8, 8) && !memcmp(kv.v8 + a * 8, kv.v8 + b * 8, 8) &&
                           kv.k_scale[a] == kv.k_scale[b] && kv.v_scale[a] == kv.v_scale[b];
                assert_int_equal(same, p < 5); /* rows past 5 stay as they were (zero) */
            }
    kv_destroy(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_attach_reuses_full_blocks),
        cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_shared_refcounts),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_stale_parent),
        cmocka_unit_test(test_duplicate_commit),
        cmocka_unit_test(test_churn),
        cmocka_unit_test(test_partial_blocks),
        cmocka_unit_test(test_partial_eviction),
        cmocka_unit_test(test_copy_rows_int8),
    };
    return cmocka_run_group_tests_name("kv_prefix", tests, NULL, NULL);
}
