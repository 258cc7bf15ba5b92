/* kv_cache.c: paged KV pool and block tables (see kv_cache.h). */
#include "engine/kv_cache.h"
#include "base/err.h"
#include <stdlib.h>
#include <string.h>

static int blocks_for(int positions) { return (positions + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE; }

size_t kv_bytes(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context, int n_blocks) {
    size_t block_floats = (size_t)KV_BLOCK_SIZE * n_kv_heads * head_dim;
    size_t per_slot = (size_t)blocks_for(max_context);
    return 2 * (size_t)n_layers * n_blocks * block_floats * sizeof(float) +
           (size_t)max_slots * per_slot * sizeof(int32_t) + (size_t)max_slots * sizeof(int32_t) +
           (size_t)n_blocks * sizeof(int32_t);
}

hearth_status kv_create(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context,
                        int n_blocks, hearth_error *err) {
    memset(kv, 0, sizeof *kv);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || max_slots <= 0 || max_context <= 0 || n_blocks <= 0)
        return err_set(err, HEARTH_ERR_INVALID, "kv cache: invalid sizes");
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->n_blocks = n_blocks;
    kv->max_slots = max_slots;
    kv->max_blocks_per_slot = blocks_for(max_context);
    kv->block_floats = (size_t)KV_BLOCK_SIZE * n_kv_heads * head_dim;
    size_t floats = (size_t)n_layers * n_blocks * kv->block_floats;
    /* 64-byte alignment: one cache line, and what AVX-512 loads like */
    if (posix_memalign((void **)&kv->k, 64, floats * sizeof(float)) ||
        posix_memalign((void **)&kv->v, 64, floats * sizeof(float))) {
        kv_destroy(kv);
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: cannot allocate %.1f MiB",
                       2.0 * floats * sizeof(float) / (1024.0 * 1024.0));
    }
    memset(kv->k, 0, floats * sizeof(float)); /* touch now: resident from the start */
    memset(kv->v, 0, floats * sizeof(float));
    kv->tables = malloc((size_t)max_slots * kv->max_blocks_per_slot * sizeof(int32_t));
    kv->n_tokens = calloc((size_t)max_slots, sizeof(int32_t));
    kv->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!kv->tables || !kv->n_tokens || !kv->free_list) {
        kv_destroy(kv);
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: out of memory");
    }
    memset(kv->tables, 0xff, (size_t)max_slots * kv->max_blocks_per_slot * sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i; /* block 0 handed out first */
    kv->n_free = n_blocks;
    return HEARTH_OK;
}

void kv_destroy(kv_cache *kv) {
    free(kv->k);
    free(kv->v);
    free(kv->tables);
    free(kv->n_tokens);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

hearth_status kv_reserve(kv_cache *kv, int slot, int n_positions, hearth_error *err) {
    if (slot < 0 || slot >= kv->max_slots) return err_set(err, HEARTH_ERR_INVALID, "kv cache: bad slot %d", slot);
    int need = blocks_for(n_positions);
    if (need > kv->max_blocks_per_slot)
        return err_set(err, HEARTH_ERR_INVALID, "%d positions exceed the context length (%d)", n_positions,
                       kv->max_blocks_per_slot * KV_BLOCK_SIZE);
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    int have = 0;
    while (have < kv->max_blocks_per_slot && table[have] >= 0) have++;
    if (need - have > kv->n_free)
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: %d more blocks needed, %d free", need - have, kv->n_free);
    for (int i = have; i < need; i++) table[i] = kv->free_list[--kv->n_free];
    if (kv->n_tokens[slot] < n_positions) kv->n_tokens[slot] = n_positions;
    return HEARTH_OK;
}

void kv_release(kv_cache *kv, int slot) {
    if (slot < 0 || slot >= kv->max_slots) return;
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    for (int i = 0; i < kv->max_blocks_per_slot && table[i] >= 0; i++) {
        kv->free_list[kv->n_free++] = table[i];
        table[i] = -1;
    }
    kv->n_tokens[slot] = 0;
}
