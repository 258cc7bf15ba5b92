/* kv_prefix.c: block metadata of the KV pool: reference counts, the hash chain of full
 * blocks (prefix caching), bucket lists to find a block by name, a second index that
 * finds a cached block by its parent and first token (partial matches), and the LRU list
 * of unreferenced cached blocks (see kv_prefix.h). Must not touch key/value storage nor
 * know about requests: the scheduler decides what to attach and when to commit. */
#include "kv/kv_prefix.h"
#include "base/err.h"
#include <stdlib.h>
#include <string.h>

typedef struct kv_block_meta {
    uint64_t hash;     /* chain name, valid while cached (full blocks) */
    uint64_t part_key; /* (parent, first token): the partial-match index, valid while cached */
    uint64_t ns;       /* the namespace of its chain (kv_prefix_slot_namespace) */
    uint32_t gen;  /* bumped whenever the block's content is given up (evicted) */
    uint32_t parent_gen;
    int32_t parent;    /* block id before this one in its chain, -1 for the first */
    int32_t refs;      /* slots whose table holds this block */
    int32_t hash_next; /* bucket list */
    int32_t lru_prev, lru_next;
    int32_t part_next; /* partial-match index bucket list */
    int32_t cached;    /* 1: named and findable */
    int32_t n_valid;   /* positions that hold content: KV_BLOCK_SIZE, or fewer for a kept tail */
    int32_t tokens[KV_BLOCK_SIZE];
} kv_block_meta;

/* Per slot: how far its table has been named, and the chain's tail to continue from. */
typedef struct kv_slot_chain {
    int32_t named; /* leading blocks named (attached or committed); -1: chain broken */
    int32_t last;  /* block id that names position named*16-1's block, -1 none */
    uint32_t last_gen;
    uint64_t last_hash;
    uint64_t ns; /* its namespace: 0, or the adapters the slot computes with */
} kv_slot_chain;

struct kv_prefix {
    kv_block_meta *meta; /* [n_blocks] */
    int32_t *buckets;    /* [n_buckets], -1 empty: full blocks by chain name */
    int32_t *part_buckets; /* [n_buckets]: every cached block by (parent, first token) */
    uint64_t bucket_mask;
    int32_t lru_head, lru_tail; /* head: least recently used */
    int n_cached;
    kv_slot_chain *chain; /* [max_slots] */
};

static size_t bucket_count(int n_blocks) {
    size_t n = 1;
    while (n < (size_t)n_blocks) n <<= 1; /* load factor <= 1: short bucket lists */
    return n;
}

size_t kv_prefix_bytes(int n_blocks, int max_slots) {
    return sizeof(struct kv_prefix) + (size_t)n_blocks * sizeof(kv_block_meta) +
           2 * bucket_count(n_blocks) * sizeof(int32_t) + (size_t)max_slots * sizeof(kv_slot_chain);
}

hearth_status kv_prefix_create(kv_cache *kv, hearth_error *err) {
    struct kv_prefix *p = calloc(1, sizeof *p);
    size_t nb = bucket_count(kv->n_blocks);
    if (p) {
        p->meta = malloc((size_t)kv->n_blocks * sizeof *p->meta);
        p->buckets = malloc(nb * sizeof *p->buckets);
        p->part_buckets = malloc(nb * sizeof *p->part_buckets);
        p->chain = malloc((size_t)kv->max_slots * sizeof *p->chain);
    }
    if (!p || !p->meta || !p->buckets || !p->part_buckets || !p->chain) {
        if (p) free(p->meta), free(p->buckets), free(p->part_buckets), free(p->chain);
        free(p);
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: out of memory for block metadata");
    }
    /* written in full now: resident from the start, as fit predicts */
    for (int b = 0; b < kv->n_blocks; b++)
        p->meta[b] = (kv_block_meta){.parent = -1, .hash_next = -1, .part_next = -1, .lru_prev = -1, .lru_next = -1};
    memset(p->buckets, 0xff, nb * sizeof *p->buckets);
    memset(p->part_buckets, 0xff, nb * sizeof *p->part_buckets);
    p->bucket_mask = nb - 1;
    p->lru_head = p->lru_tail = -1;
    kv->prefix = p;
    for (int s = 0; s < kv->max_slots; s++) kv_prefix_slot_reset(kv, s);
    return HEARTH_OK;
}

void kv_prefix_free(kv_cache *kv) {
    if (!kv->prefix) return;
    free(kv->prefix->meta);
    free(kv->prefix->buckets);
    free(kv->prefix->part_buckets);
    free(kv->prefix->chain);
    free(kv->prefix);
    kv->prefix = NULL;
}

/* splitmix64's finalizer: a bijection with full avalanche, so chained names of distinct
 * prefixes collide only by chance (2^-64 per pair); matches verify tokens anyway. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens) {
    uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < KV_BLOCK_SIZE; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + ((uint64_t)i << 32)));
    return h;
}

static void lru_unlink(struct kv_prefix *p, int32_t b) {
    kv_block_meta *m = &p->meta[b];
    if (m->lru_prev >= 0)
        p->meta[m->lru_prev].lru_next = m->lru_next;
    else
        p->lru_head = m->lru_next;
    if (m->lru_next >= 0)
        p->meta[m->lru_next].lru_prev = m->lru_prev;
    else
        p->lru_tail = m->lru_prev;
    m->lru_prev = m->lru_next = -1;
    p->n_cached--;
}

static void lru_push_tail(struct kv_prefix *p, int32_t b) {
    kv_block_meta *m = &p->meta[b];
    m->lru_prev = p->lru_tail;
    m->lru_next = -1;
    if (p->lru_tail >= 0)
        p->meta[p->lru_tail].lru_next = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static int32_t *link_of(struct kv_prefix *p, int32_t b, int part) {
    return part ? &p->meta[b].part_next : &p->meta[b].hash_next;
}

/* Removes b from the bucket list that starts at *pp (part: the partial-match index). */
static void bucket_unlink(struct kv_prefix *p, int32_t *pp, int32_t b, int part) {
    while (*pp >= 0 && *pp != b) pp = link_of(p, *pp, part);
    if (*pp == b) *pp = *link_of(p, b, part);
    *link_of(p, b, part) = -1;
}

/* The partial-match index's key: the chain before the block and its first token. */
static uint64_t part_key(uint64_t parent_hash, int32_t first) {
    return mix64(parent_hash ^ mix64((uint64_t)(uint32_t)first + 0x632be59bd9b4e019ull));
}

/* Makes block b findable as the block after chain c holding tokens[0..n): in the
 * partial-match index always, under its chain name h when it is full. */
static void name_block(struct kv_prefix *p, int32_t b, uint64_t h, const kv_slot_chain *c, const int32_t *tokens,
                       int n) {
    kv_block_meta *m = &p->meta[b];
    m->hash = h, m->parent = c->last, m->parent_gen = c->last_gen, m->cached = 1, m->n_valid = n, m->ns = c->ns;
    memset(m->tokens, 0, sizeof m->tokens);
    memcpy(m->tokens, tokens, (size_t)n * sizeof *tokens);
    if (n == KV_BLOCK_SIZE) {
        m->hash_next = p->buckets[h & p->bucket_mask];
        p->buckets[h & p->bucket_mask] = b;
    }
    m->part_key = part_key(c->last_hash, tokens[0]);
    m->part_next = p->part_buckets[m->part_key & p->bucket_mask];
    p->part_buckets[m->part_key & p->bucket_mask] = b;
}

int32_t kv_block_take(kv_cache *kv) {
    struct kv_prefix *p = kv->prefix;
    int32_t b;
    if (kv->n_free > 0)
        b = kv->free_list[--kv->n_free];
    else if (p->lru_head >= 0) { /* evict: its content is given up, its children become unreachable */
        b = p->lru_head;
        lru_unlink(p, b);
        if (p->meta[b].n_valid == KV_BLOCK_SIZE)
            bucket_unlink(p, &p->buckets[p->meta[b].hash & p->bucket_mask], b, 0);
        bucket_unlink(p, &p->part_buckets[p->meta[b].part_key & p->bucket_mask], b, 1);
        p->meta[b].cached = 0;
        p->meta[b].gen++;
    } else
        return -1;
    p->meta[b].refs = 1;
    return b;
}

void kv_block_drop(kv_cache *kv, int32_t b) {
    struct kv_prefix *p = kv->prefix;
    if (--p->meta[b].refs > 0) return;
    if (p->meta[b].cached)
        lru_push_tail(p, b);
    else
        kv->free_list[kv->n_free++] = b;
}

int kv_blocks_available(const kv_cache *kv) { return kv->n_free + kv->prefix->n_cached; }
int kv_blocks_cached(const kv_cache *kv) { return kv->prefix->n_cached; }

void kv_prefix_slot_reset(kv_cache *kv, int slot) { kv->prefix->chain[slot] = (kv_slot_chain){.named = 0, .last = -1}; }

void kv_prefix_slot_namespace(kv_cache *kv, int slot, uint64_t ns) {
    kv_slot_chain *c = &kv->prefix->chain[slot];
    if (c->named || c->last >= 0) return; /* only an empty chain changes namespace */
    c->ns = ns;
    c->last_hash = ns; /* the chain's first name depends on it too */
}

/* The cached block named h with these tokens whose parent is (parent, parent_gen). */
static int32_t find_block(const struct kv_prefix *p, uint64_t h, const int32_t *tokens, int32_t parent,
                          uint32_t parent_gen, uint64_t ns) {
    for (int32_t b = p->buckets[h & p->bucket_mask]; b >= 0; b = p->meta[b].hash_next) {
        const kv_block_meta *m = &p->meta[b];
        if (m->hash == h && m->cached && m->n_valid == KV_BLOCK_SIZE && m->parent == parent && m->ns == ns &&
            (parent < 0 || m->parent_gen == parent_gen) && !memcmp(m->tokens, tokens, sizeof m->tokens))
            return b;
    }
    return -1;
}

/* The cached block after chain c that shares the most leading tokens with tokens[0..n)
 * (n <= KV_BLOCK_SIZE), full or a kept tail: its id and that count in *len (the first
 * found on a tie); -1 when none starts with tokens[0]. */
static int32_t find_partial(const struct kv_prefix *p, const kv_slot_chain *c, const int32_t *tokens, int n,
                            int *len) {
    uint64_t key = part_key(c->last_hash, tokens[0]);
    int32_t best = -1;
    *len = 0;
    for (int32_t b = p->part_buckets[key & p->bucket_mask]; b >= 0; b = p->meta[b].part_next) {
        const kv_block_meta *m = &p->meta[b];
        if (m->part_key != key || !m->cached || m->parent != c->last || m->ns != c->ns || (c->last >= 0 && m->parent_gen != c->last_gen))
            continue;
        int k = 0, lim = n < m->n_valid ? n : m->n_valid;
        while (k < lim && m->tokens[k] == tokens[k]) k++;
        if (k > *len) best = b, *len = k;
    }
    return best;
}

int kv_prefix_attach(kv_cache *kv, int slot, const int32_t *tokens, int n) {
    struct kv_prefix *p = kv->prefix;
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    kv_slot_chain *c = &p->chain[slot];
    if (table[0] >= 0 || n < 1) return 0; /* only an empty slot starts from the cache */
    int full = (n - 1) / KV_BLOCK_SIZE;   /* never the last token: its logits are needed */
    if (full > kv->max_blocks_per_slot) full = kv->max_blocks_per_slot;
    int i = 0;
    for (; i < full; i++) {
        uint64_t h = kv_block_hash(c->last_hash, tokens + (size_t)i * KV_BLOCK_SIZE);
        int32_t b = find_block(p, h, tokens + (size_t)i * KV_BLOCK_SIZE, c->last, c->last_gen, c->ns);
        if (b < 0) break;
        if (p->meta[b].refs++ == 0) lru_unlink(p, b);
        table[i] = b;
        c->last = b, c->last_gen = p->meta[b].gen, c->last_hash = h;
    }
    c->named = i;
    kv->n_tokens[slot] = i * KV_BLOCK_SIZE;
    return i * KV_BLOCK_SIZE;
}

void kv_prefix_commit(kv_cache *kv, int slot, const int32_t *tokens, int n) {
    struct kv_prefix *p = kv->prefix;
    const int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    kv_slot_chain *c = &p->chain[slot];
    int full = n / KV_BLOCK_SIZE;
    if (full > kv->max_blocks_per_slot) full = kv->max_blocks_per_slot;
    for (; c->named >= 0 && c->named < full; c->named++) {
        int32_t b = table[c->named];
        /* the chain may run through a block this slot does not hold (see below); once
         * that block was evicted the rest of this slot's blocks cannot be named */
        if (c->last >= 0 && p->meta[c->last].gen != c->last_gen) {
            c->named = -1;
            return;
        }
        const int32_t *t = tokens + (size_t)c->named * KV_BLOCK_SIZE;
        uint64_t h = kv_block_hash(c->last_hash, t);
        int32_t same = find_block(p, h, t, c->last, c->last_gen, c->ns);
        if (same < 0 && b >= 0 && !p->meta[b].cached) {
            name_block(p, b, h, c, t, KV_BLOCK_SIZE);
            same = b;
        }
        if (same < 0) { /* an unheld slot entry: nothing to name (not reached by the scheduler) */
            c->named = -1;
            return;
        }
        /* the same content computed twice (two requests prefilled one prefix at once):
         * the chain continues through the cached copy, this slot's copy stays private */
        c->last = same, c->last_gen = p->meta[same].gen, c->last_hash = h;
    }
}

int kv_prefix_attach_partial(kv_cache *kv, int slot, const int32_t *tokens, int n, kv_block_copy *copy) {
    struct kv_prefix *p = kv->prefix;
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    const kv_slot_chain *c = &p->chain[slot];
    *copy = (kv_block_copy){.src = -1, .dst = -1};
    int i = c->named; /* the block after the attached full ones */
    if (i < 0 || i >= kv->max_blocks_per_slot || table[i] >= 0 || kv->n_tokens[slot] != i * KV_BLOCK_SIZE) return 0;
    int want = n - 1 - i * KV_BLOCK_SIZE; /* never the last token */
    if (want > KV_BLOCK_SIZE) want = KV_BLOCK_SIZE;
    if (want < 1) return 0;
    int len;
    int32_t src = find_partial(p, c, tokens + (size_t)i * KV_BLOCK_SIZE, want, &len);
    if (src < 0) return 0;
    if (p->meta[src].refs++ == 0) lru_unlink(p, src); /* held while copied: taking dst must not evict it */
    int32_t dst = kv_block_take(kv);
    if (dst < 0) {
        kv_block_drop(kv, src);
        return 0;
    }
    table[i] = dst;
    kv->n_tokens[slot] = i * KV_BLOCK_SIZE + len;
    *copy = (kv_block_copy){.src = src, .dst = dst, .rows = len};
    return len;
}

void kv_prefix_commit_tail(kv_cache *kv, int slot, const int32_t *tokens, int n) {
    struct kv_prefix *p = kv->prefix;
    kv_prefix_commit(kv, slot, tokens, n);
    const kv_slot_chain *c = &p->chain[slot];
    int full = n / KV_BLOCK_SIZE, rest = n % KV_BLOCK_SIZE;
    if (rest == 0 || c->named != full || full >= kv->max_blocks_per_slot) return;
    if (c->last >= 0 && p->meta[c->last].gen != c->last_gen) return; /* its chain was evicted */
    int32_t b = kv->tables[(size_t)slot * kv->max_blocks_per_slot + full];
    if (b < 0 || p->meta[b].refs != 1 || p->meta[b].cached) return;
    const int32_t *t = tokens + (size_t)full * KV_BLOCK_SIZE;
    int len;
    if (find_partial(p, c, t, rest, &len) >= 0 && len == rest) return; /* held already: this copy is freed */
    name_block(p, b, 0, c, t, rest);
}

int kv_position_writable(const kv_cache *kv, int slot, int p) {
    if (slot < 0 || slot >= kv->max_slots || p < 0 || p / KV_BLOCK_SIZE >= kv->max_blocks_per_slot) return 0;
    int32_t b = kv->tables[(size_t)slot * kv->max_blocks_per_slot + p / KV_BLOCK_SIZE];
    return b >= 0 && kv->prefix->meta[b].refs == 1 && !kv->prefix->meta[b].cached;
}
