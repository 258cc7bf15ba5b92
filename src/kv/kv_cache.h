/* kv_cache.h: the paged KV pool: a fixed array of blocks, each holding KV_BLOCK_SIZE
 * positions x n_kv_heads x head_dim keys and values of every layer (--kv-quant: float32;
 * int8 with a scale per position and head; fp8 and f16 on the GPU only, whose host copy
 * keeps the layout for the byte counts), and a block table per sequence slot. Full blocks
 * are shared between sequences by content (kv_prefix.h). Reserved once at engine start
 * (pages become resident when first written); adding or dropping a sequence is O(blocks),
 * nothing is copied. Knows nothing of models or sampling.
 *
 * Layout (kv_row): block-major, [block][layer][kv head][position in block][head_dim], so
 * a block's rows for every layer are one contiguous run and the pool's memory grows with
 * the blocks written even on 2 MiB transparent huge pages (the pool's element arrays are
 * advised MADV_HUGEPAGE). Inside a block, the 16 positions of one (layer, KV head) are
 * contiguous rows, head_dim elements apart, which the attention kernels rely on. A pool
 * whose layers have their own shapes (kv_create_layers) stays layer-major,
 * [layer][block][kv head][position][head_dim] with each layer's own heads and head_dim,
 * and off huge pages (its first block would make 2 MiB of every layer's region resident);
 * kernels see one of its layers at a time through kv_layer_view. */
#ifndef HEARTH_KV_KV_CACHE_H
#define HEARTH_KV_KV_CACHE_H
#include "base/threadpool.h"
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>

/* 16 positions per block: small enough that a sequence wastes at most 15 slots and that
 * prefix sharing (kv_prefix.h) matches at a fine grain, large enough that the block
 * lookup is amortised over 16 dot products per head. (vLLM's default is 16 too.) */
#define KV_BLOCK_SIZE 16

typedef struct kv_cache {
    int n_layers, n_kv_heads, head_dim;
    int n_blocks, max_slots, max_blocks_per_slot;
    size_t block_floats;   /* KV_BLOCK_SIZE * n_kv_heads * head_dim */
    /* Rows between block b and b + 1 of a layer, and between layer l and l + 1 of a block
     * (kv_strides): kv_row = b * block_rows + layer * layer_rows + head * KV_BLOCK_SIZE + p % 16. */
    size_t block_rows, layer_rows;
    float *k, *v;          /* [n_blocks][n_layers][n_kv_heads][KV_BLOCK_SIZE][head_dim] (kv_row); NULL when int8 */
    int quant;             /* hearth_kv_quant */
    int8_t *k8, *v8;       /* int8 storage: the same layout as k, v */
    float *k_scale, *v_scale; /* int8: one scale per row, [n_blocks][n_layers][n_kv_heads][KV_BLOCK_SIZE] */
    int32_t *tables;       /* [max_slots][max_blocks_per_slot], -1 = none */
    int32_t *n_tokens;     /* positions stored per slot */
    int32_t *free_list;    /* stack of free block ids */
    int n_free;
    struct kv_prefix *prefix; /* block refcounts, hash chain, LRU of cached blocks (kv_prefix.h) */
    struct kv_state *state;   /* recurrent state of hybrid models (kv_state.h), NULL without */
    /* Layers of their own shape (Gemma 4: sliding and full layers differ in head_dim and KV
     * heads): per layer its KV heads and head_dim, NULL when every layer is n_kv_heads x
     * head_dim (then the maxima). Such a pool is layer-major: layer l's storage (all its
     * blocks) follows layer l - 1's; kernels see one layer at a time through kv_layer_view. */
    int *layer_heads, *layer_dims;
} kv_cache;

/* The row strides of a pool of n_layers layers of n_kv_heads heads and n_blocks blocks:
 * block-major when the layers share one shape, layer-major (layered = 1) when they do not
 * (kv_create_layers' pools and their one-layer views, where the two agree). The device pool
 * (cuda_kv) is layer-major whatever the shapes (nothing on the GPU pages in); cuda_kv_upload
 * reorders a host pool. */
static inline void kv_strides(int n_layers, int n_kv_heads, int n_blocks, int layered, size_t *block_rows,
                              size_t *layer_rows) {
    size_t head_rows = (size_t)n_kv_heads * KV_BLOCK_SIZE;
    *block_rows = layered ? head_rows : (size_t)n_layers * head_rows;
    *layer_rows = layered ? (size_t)n_blocks * head_rows : head_rows;
}

/* hearth_kv_quant properties, the one place that says them: a value the engine knows;
 * stored only by the CUDA backend (fp8, f16); rows carrying one float scale (int8, fp8);
 * bytes of one key or value element; bytes of one (position, KV head) row of head_dim keys
 * or values with its scale. */
static inline int kv_quant_known(int q) { return q >= HEARTH_KV_FLOAT && q <= HEARTH_KV_F16; }
static inline int kv_quant_gpu_only(int q) { return q == HEARTH_KV_FP8 || q == HEARTH_KV_F16; }
static inline int kv_quant_scaled(int q) { return q == HEARTH_KV_INT8 || q == HEARTH_KV_FP8; }
static inline size_t kv_elem_bytes(int q) {
    return kv_quant_scaled(q) ? 1 : q == HEARTH_KV_F16 ? sizeof(uint16_t) : sizeof(float);
}
static inline size_t kv_row_bytes(int q, int head_dim) {
    return (size_t)head_dim * kv_elem_bytes(q) + (kv_quant_scaled(q) ? sizeof(float) : 0);
}

/* quant: hearth_kv_quant (kv_create: float). */
hearth_status kv_create_quant(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots,
                              int max_context, int n_blocks, int quant, hearth_error *err);
/* The block tables, free list and prefix cache of a pool, with its K/V storage when
 * with_storage (else kv_storage_attach adds it later; a pool whose keys and values live
 * on the GPU needs none on the host). kv_storage_attach frees the pool on failure. */
hearth_status kv_create_meta(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context,
                             int n_blocks, int quant, int with_storage, hearth_error *err);
/* The storage is reserved, not touched (zero pages until first written): the pool's memory
 * becomes resident as blocks are used. */
hearth_status kv_storage_attach(kv_cache *kv, hearth_error *err);
/* kv_create_meta for a pool whose layers have their own shapes (heads[l] KV heads of dims[l]
 * each; kv->n_kv_heads and head_dim become the maxima). */
hearth_status kv_create_layers(kv_cache *kv, int n_layers, const int *heads, const int *dims, int max_slots,
                               int max_context, int n_blocks, int quant, int with_storage, hearth_error *err);
/* Bytes of the key and value storage of such a pool. */
size_t kv_storage_bytes_layers(int n_layers, const int *heads, const int *dims, int n_blocks, int quant);
/* A pool of one layer's shape whose layer 0 is layer `layer` of kv (the same block tables,
 * the storage pointers moved to that layer): what the kernels index with their usual
 * arithmetic. Returns the layer index to use with view (0, or `layer` where kv's layers
 * share one shape and view is kv itself). */
int kv_layer_view(const kv_cache *kv, int layer, kv_cache *view);
static inline hearth_status kv_create(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots,
                                      int max_context, int n_blocks, hearth_error *err) {
    return kv_create_quant(kv, n_layers, n_kv_heads, head_dim, max_slots, max_context, n_blocks, HEARTH_KV_FLOAT,
                           err);
}
void kv_destroy(kv_cache *kv);
/* Bytes kv_create allocates for these sizes (for fit predictions). */
size_t kv_bytes(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context, int n_blocks);
/* Bytes of the key and value storage alone for this quantization (part of kv_bytes'
 * count when float; kv_bytes_quant swaps it for int8's). */
size_t kv_storage_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant);
size_t kv_bytes_quant(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context, int n_blocks,
                      int quant);
/* Makes sure slot can hold n_positions, taking blocks from the pool; fails (nothing
 * taken) when the pool or the slot's table is too small. */
hearth_status kv_reserve(kv_cache *kv, int slot, int n_positions, hearth_error *err);
/* Returns all of slot's blocks to the pool. */
void kv_release(kv_cache *kv, int slot);
/* Cuts slot to its first n_positions (fewer than it holds): the blocks past them go back
 * to the pool. Speculative decoding's rollback of rejected positions: those blocks are
 * private (only full blocks within the kept positions are ever named for sharing). */
void kv_truncate(kv_cache *kv, int slot, int n_positions);
/* Row index of position p of slot for a layer and KV head: the key is head_dim values at
 * k (or k8) + row * head_dim, its int8 scale k_scale[row]; the same for values. */
static inline size_t kv_block_row(const kv_cache *kv, int layer, int32_t b, int head) {
    return (size_t)b * kv->block_rows + (size_t)layer * kv->layer_rows + (size_t)head * KV_BLOCK_SIZE;
}
static inline size_t kv_row(const kv_cache *kv, int layer, int slot, int p, int head) {
    int32_t b = kv->tables[(size_t)slot * kv->max_blocks_per_slot + p / KV_BLOCK_SIZE];
    return kv_block_row(kv, layer, b, head) + (size_t)(p % KV_BLOCK_SIZE);
}
/* Writes one position's key and value (head_dim floats each), quantizing them when the
 * pool is int8: the only way K/V enter the pool. */
void kv_store(kv_cache *kv, int layer, int slot, int p, int head, const float *key, const float *value);
/* Copies positions 0..rows of block src into block dst for every layer and KV head
 * (keys, values, int8 scales): a partial prefix match (kv_prefix_attach_partial) on the
 * host pool. */
void kv_copy_rows(kv_cache *kv, int32_t src, int32_t dst, int rows);
/* Positions 0..n of slot (reserved through n) for one layer and KV head, as flat arrays
 * in the pool's storage format: keys and values [n][head_dim] elements of
 * kv_elem_bytes(quant), and for scaled formats their scales [n] (NULL for float pools).
 * Host storage only. A saved sequence (kv_file.h) goes out and back in through these. */
void kv_slot_rows_read(const kv_cache *kv, int layer, int slot, int head, int n, void *keys, void *values,
                       float *k_scale, float *v_scale);
void kv_slot_rows_write(kv_cache *kv, int layer, int slot, int head, int n, const void *keys, const void *values,
                        const float *k_scale, const float *v_scale);
/* Float pool only: */
static inline float *kv_key(const kv_cache *kv, int layer, int slot, int p, int head) {
    return kv->k + kv_row(kv, layer, slot, p, head) * kv->head_dim;
}
static inline float *kv_value(const kv_cache *kv, int layer, int slot, int p, int head) {
    return kv->v + kv_row(kv, layer, slot, p, head) * kv->head_dim;
}
#endif
