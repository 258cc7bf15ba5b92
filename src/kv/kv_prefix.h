/* kv_prefix.h: the block metadata of the paged KV pool (kv_cache.h): reference counts,
 * the hash chain that names a full block by its tokens and everything before them
 * (automatic prefix caching), and the LRU list of unreferenced cached blocks that are
 * evicted when the free list runs dry. Touches no key or value storage. */
#ifndef HEARTH_KV_KV_PREFIX_H
#define HEARTH_KV_KV_PREFIX_H
#include "kv/kv_cache.h"

/* Bytes kv_prefix_create allocates (counted in kv_bytes, so fit stays exact). */
size_t kv_prefix_bytes(int n_blocks, int max_slots);
/* Allocates kv->prefix for kv's n_blocks and max_slots (called by kv_create). */
hearth_status kv_prefix_create(kv_cache *kv, hearth_error *err);
void kv_prefix_free(kv_cache *kv);

/* The 64-bit name of a full block: its KV_BLOCK_SIZE tokens chained to the name of
 * the block before it (parent 0 for the first block). */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens);

/* Block lifecycle (kv_cache.c): a block for a slot, from the free list or else by
 * evicting the least recently used cached block (-1: none left); and a reference
 * dropped: at zero a cached block joins the LRU tail, any other the free list. */
int32_t kv_block_take(kv_cache *kv);
void kv_block_drop(kv_cache *kv, int32_t block);
/* Blocks a reservation can get now: free plus cached-unreferenced. */
int kv_blocks_available(const kv_cache *kv);
/* Unreferenced blocks kept for their cached content. */
int kv_blocks_cached(const kv_cache *kv);
/* Forgets slot's chain (kv_release calls it after dropping the slot's blocks). */
void kv_prefix_slot_reset(kv_cache *kv, int slot);

/* Puts the empty slot's chain in namespace ns (0: the default): its blocks are found only
 * by slots of the same namespace (the engine's adapter sets, so a prefix computed with
 * one adapter is never reused with another). kv_prefix_slot_reset returns it to 0. */
void kv_prefix_slot_namespace(kv_cache *kv, int slot, uint64_t ns);

/* Attaches to the empty slot every cached full block that starts tokens[0..n): block i
 * matches when its hash, its 16 tokens and its parent block (id and generation) all
 * agree, so a hash collision can never hand out wrong KV. The last token is never
 * covered (its logits must be computed). Returns the positions attached (a multiple of
 * KV_BLOCK_SIZE); the slot's n_tokens is set to them. */
int kv_prefix_attach(kv_cache *kv, int slot, const int32_t *tokens, int n);
/* Names every full block of slot among its first n positions (tokens: the slot's token
 * history) that is not named yet, so later requests can reuse it. A block whose content
 * is already cached under another id stays private (freed on release). */
void kv_prefix_commit(kv_cache *kv, int slot, const int32_t *tokens, int n);
/* Partial blocks. After kv_prefix_attach, the block that follows the attached ones may
 * still share its first tokens with a cached block: a full one whose chain went on
 * differently (the prompt diverges inside the block), or the tail a finished sequence
 * left (kv_prefix_commit_tail). Sequences append to their last block, so that content
 * is copied, not shared: kv_prefix_attach_partial takes a fresh block for the slot and
 * returns the rows to copy into it (src is held until the caller, having copied rows
 * positions of every layer and KV head, drops it with kv_block_drop). */
typedef struct kv_block_copy {
    int32_t src, dst; /* -1: nothing to copy */
    int rows;
} kv_block_copy;
/* Rows matched (0: none, copy->src = -1) of tokens[0..n) after the full blocks attached;
 * never covers the last token; the slot's n_tokens grows by them. */
int kv_prefix_attach_partial(kv_cache *kv, int slot, const int32_t *tokens, int n, kv_block_copy *copy);
/* kv_prefix_commit, then keeps the slot's last, partly filled block (positions
 * n / KV_BLOCK_SIZE * KV_BLOCK_SIZE .. n) findable for kv_prefix_attach_partial once the
 * slot is released (called just before kv_release, with the positions computed). A
 * tail whose content is held already stays private. */
void kv_prefix_commit_tail(kv_cache *kv, int slot, const int32_t *tokens, int n);
/* Whether position p of slot may be written: its block is held by this slot alone and
 * is not cached. Sequences only append, shared blocks are always full and partial
 * matches are copied, so this holds for every write; the engine checks it. */
int kv_position_writable(const kv_cache *kv, int slot, int p);
#endif
