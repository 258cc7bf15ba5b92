/* kv_cache.c: paged KV pool and block tables (see kv_cache.h). */
#include "kv/kv_cache.h"
#include "base/mem.h"
#include "base/err.h"
#include "kv/kv_prefix.h"
#include "kv/kv_state.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int blocks_for(int positions) { return (positions + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE; }

/* int8 rows: head_dim bytes plus one float scale per position and head. Per row rather
 * than per block: a row is quantized once when appended and never touched again (a block
 * scale would have to requantize the block whenever a new row raised its maximum), and
 * one outlier token does not flatten its 15 neighbours. Costs 4 / head_dim extra. */
size_t kv_storage_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant) {
    size_t rows = (size_t)n_layers * n_blocks * n_kv_heads * KV_BLOCK_SIZE;
    return 2 * rows * kv_row_bytes(quant, head_dim);
}

size_t kv_bytes_quant(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context, int n_blocks,
                      int quant) {
    return kv_bytes(n_layers, n_kv_heads, head_dim, max_slots, max_context, n_blocks) -
           kv_storage_bytes(n_layers, n_kv_heads, head_dim, n_blocks, HEARTH_KV_FLOAT) +
           kv_storage_bytes(n_layers, n_kv_heads, head_dim, n_blocks, quant);
}

size_t kv_bytes(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context, int n_blocks) {
    size_t per_slot = (size_t)blocks_for(max_context);
    return kv_storage_bytes(n_layers, n_kv_heads, head_dim, n_blocks, HEARTH_KV_FLOAT) +
           (size_t)max_slots * per_slot * sizeof(int32_t) + (size_t)max_slots * sizeof(int32_t) +
           (size_t)n_blocks * sizeof(int32_t) + kv_prefix_bytes(n_blocks, max_slots);
}

/* Bytes of each storage array (k, v, k8, v8, k_scale, v_scale) for the pool's shape and
 * quantization; 0 for the arrays it does not have. */
/* Rows (positions x heads) and elements of layers [0, n) of a pool. */
static void layer_extent(const kv_cache *kv, int n, size_t *rows, size_t *elems) {
    size_t per_block = (size_t)kv->n_blocks * KV_BLOCK_SIZE;
    *rows = *elems = 0;
    for (int l = 0; l < n; l++) {
        int heads = kv->layer_heads ? kv->layer_heads[l] : kv->n_kv_heads;
        int dim = kv->layer_dims ? kv->layer_dims[l] : kv->head_dim;
        *rows += per_block * heads;
        *elems += per_block * heads * dim;
    }
}

size_t kv_storage_bytes_layers(int n_layers, const int *heads, const int *dims, int n_blocks, int quant) {
    size_t total = 0;
    for (int l = 0; l < n_layers; l++) total += kv_storage_bytes(1, heads[l], dims[l], n_blocks, quant);
    return total;
}

int kv_layer_view(const kv_cache *kv, int layer, kv_cache *view) {
    *view = *kv;
    if (!kv->layer_heads) return layer;
    size_t rows, elems, eb = kv_elem_bytes(kv->quant);
    layer_extent(kv, layer, &rows, &elems);
    view->n_layers = 1;
    view->n_kv_heads = kv->layer_heads[layer];
    view->head_dim = kv->layer_dims[layer];
    view->block_floats = (size_t)KV_BLOCK_SIZE * view->n_kv_heads * view->head_dim;
    kv_strides(1, view->n_kv_heads, kv->n_blocks, 1, &view->block_rows, &view->layer_rows);
    view->layer_heads = view->layer_dims = NULL;
    if (kv->k) view->k = kv->k + elems, view->v = kv->v + elems;
    if (kv->k8) view->k8 = (int8_t *)((char *)kv->k8 + elems * eb), view->v8 = (int8_t *)((char *)kv->v8 + elems * eb);
    if (kv->k_scale) view->k_scale = kv->k_scale + rows, view->v_scale = kv->v_scale + rows;
    return 0;
}

static void storage_sizes(const kv_cache *kv, int quant, size_t sizes[6]) {
    size_t rows, elems, eb = kv_elem_bytes(quant);
    layer_extent(kv, kv->n_layers, &rows, &elems);
    int host_float = quant == HEARTH_KV_FLOAT, scaled = kv_quant_scaled(quant);
    sizes[0] = sizes[1] = host_float ? elems * eb : 0;
    sizes[2] = sizes[3] = host_float ? 0 : elems * eb; /* int8, and fp8 / f16's host copy */
    sizes[4] = sizes[5] = scaled ? rows * sizeof(float) : 0;
}

/* The storage is reserved, not touched (mem_alloc_reserved): fresh anonymous pages read as
 * zeros and become resident as blocks are first written, so a server holds the KV memory
 * its requests have used and starts without faulting in the whole pool (page-aligned, so
 * cache-line aligned as AVX-512 loads like). hearth fit reports both: the pool untouched at
 * start and the whole pool written (the peak). A block-major pool's key and value arrays
 * are on transparent huge pages (mem_alloc_reserved's huge): consecutive blocks are
 * consecutive memory, so a 2 MiB page is made resident by the blocks written into it, and
 * the attention kernels, which walk a sequence's blocks across the pool, take fewer TLB
 * misses. The scale arrays (1 / head_dim of the elements) stay on 4 KiB pages. */
static void storage_free(kv_cache *kv) {
    size_t sizes[6];
    storage_sizes(kv, kv->quant, sizes);
    void *arrays[6] = {kv->k, kv->v, kv->k8, kv->v8, kv->k_scale, kv->v_scale};
    for (int i = 0; i < 6; i++) mem_free_reserved(arrays[i], sizes[i]);
    kv->k = kv->v = NULL;
    kv->k8 = kv->v8 = NULL;
    kv->k_scale = kv->v_scale = NULL;
}

static hearth_status storage_create(kv_cache *kv, int quant, hearth_error *err) {
    if (!kv_quant_known(quant)) return err_set(err, HEARTH_ERR_INVALID, "kv cache: unknown quantization %d", quant);
    kv->quant = quant;
    size_t sizes[6];
    storage_sizes(kv, quant, sizes);
    void **arrays[6] = {(void **)&kv->k, (void **)&kv->v,       (void **)&kv->k8,
                        (void **)&kv->v8, (void **)&kv->k_scale, (void **)&kv->v_scale};
    int ok = 1;
    for (int i = 0; i < 6; i++)
        if (sizes[i] && !(*arrays[i] = mem_alloc_reserved(sizes[i], i < 4 && !kv->layer_heads))) ok = 0;
    if (ok) return HEARTH_OK;
    size_t rows, elems;
    layer_extent(kv, kv->n_layers, &rows, &elems);
    return err_set(err, HEARTH_ERR_NOMEM, "kv cache: cannot reserve %.1f MiB",
                   (double)(2 * (elems * kv_elem_bytes(quant) + (kv_quant_scaled(quant) ? rows * sizeof(float) : 0))) /
                       (1024.0 * 1024.0));
}

/* Symmetric absmax: q = round(x / s), s = max|x| / 127, so x = s * q to within s / 2. */
static void quantize_row(int8_t *q, float *scale, const float *x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int8_t)lrintf(x[i] * inv); /* |x * inv| <= 127 */
    *scale = s;
}

int hearth_kv_quant_parse(const char *name, int *out) {
    if (!name) return 0;
    if (!strcmp(name, "none") || !strcmp(name, "float") || !strcmp(name, "f32")) *out = HEARTH_KV_FLOAT;
    else if (!strcmp(name, "int8")) *out = HEARTH_KV_INT8;
    else if (!strcmp(name, "fp8") || !strcmp(name, "fp8_e4m3")) *out = HEARTH_KV_FP8;
    else if (!strcmp(name, "f16") || !strcmp(name, "fp16") || !strcmp(name, "float16")) *out = HEARTH_KV_F16;
    else return 0;
    return 1;
}

const char *hearth_kv_quant_name(int quant) {
    return quant == HEARTH_KV_FLOAT  ? "none"
           : quant == HEARTH_KV_INT8 ? "int8"
           : quant == HEARTH_KV_FP8  ? "fp8"
           : quant == HEARTH_KV_F16  ? "f16"
                                     : "?";
}

void kv_store(kv_cache *kv, int layer, int slot, int p, int head, const float *key, const float *value) {
    if (kv->layer_heads) {
        kv_cache view;
        int vl = kv_layer_view(kv, layer, &view);
        kv_store(&view, vl, slot, p, head, key, value);
        return;
    }
    size_t row = kv_row(kv, layer, slot, p, head), off = row * (size_t)kv->head_dim;
    if (kv->quant == HEARTH_KV_INT8) {
        quantize_row(kv->k8 + off, kv->k_scale + row, key, kv->head_dim);
        quantize_row(kv->v8 + off, kv->v_scale + row, value, kv->head_dim);
        return;
    }
    memcpy(kv->k + off, key, (size_t)kv->head_dim * sizeof(float));
    memcpy(kv->v + off, value, (size_t)kv->head_dim * sizeof(float));
}

void kv_copy_rows(kv_cache *kv, int32_t src, int32_t dst, int rows) {
    if (kv->layer_heads) {
        for (int l = 0; l < kv->n_layers; l++) {
            kv_cache view;
            kv_layer_view(kv, l, &view);
            kv_copy_rows(&view, src, dst, rows);
        }
        return;
    }
    size_t d = (size_t)kv->head_dim;
    size_t eb = kv_elem_bytes(kv->quant); /* fp8 and f16 live in k8 / v8 too */
    char *k = kv->k ? (char *)kv->k : (char *)kv->k8, *v = kv->v ? (char *)kv->v : (char *)kv->v8;
    for (int l = 0; l < kv->n_layers; l++)
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t from = kv_block_row(kv, l, src, h), to = kv_block_row(kv, l, dst, h);
            memcpy(k + to * d * eb, k + from * d * eb, (size_t)rows * d * eb);
            memcpy(v + to * d * eb, v + from * d * eb, (size_t)rows * d * eb);
            if (kv->k_scale) {
                memcpy(kv->k_scale + to, kv->k_scale + from, (size_t)rows * sizeof(float));
                memcpy(kv->v_scale + to, kv->v_scale + from, (size_t)rows * sizeof(float));
            }
        }
}

hearth_status kv_create_quant(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots,
                              int max_context, int n_blocks, int quant, hearth_error *err) {
    return kv_create_meta(kv, n_layers, n_kv_heads, head_dim, max_slots, max_context, n_blocks, quant, 1, err);
}

hearth_status kv_storage_attach(kv_cache *kv, hearth_error *err) {
    hearth_status st = storage_create(kv, kv->quant, err);
    if (st) kv_destroy(kv);
    return st;
}

hearth_status kv_create_meta(kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_context,
                             int n_blocks, int quant, int with_storage, hearth_error *err) {
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
    kv_strides(n_layers, n_kv_heads, n_blocks, 0, &kv->block_rows, &kv->layer_rows);
    kv->quant = quant;
    hearth_status st = HEARTH_OK;
    if (!kv_quant_known(quant)) {
        kv_destroy(kv);
        return err_set(err, HEARTH_ERR_INVALID, "kv cache: unknown quantization %d", quant);
    }
    if (with_storage && (st = kv_storage_attach(kv, err))) return st;
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
    if ((st = kv_prefix_create(kv, err))) kv_destroy(kv);
    return st;
}

hearth_status kv_create_layers(kv_cache *kv, int n_layers, const int *heads, const int *dims, int max_slots,
                               int max_context, int n_blocks, int quant, int with_storage, hearth_error *err) {
    int max_heads = 0, max_dim = 0;
    for (int l = 0; l < n_layers; l++) {
        if (heads[l] <= 0 || dims[l] <= 0) return err_set(err, HEARTH_ERR_INVALID, "kv cache: invalid layer shape");
        max_heads = heads[l] > max_heads ? heads[l] : max_heads;
        max_dim = dims[l] > max_dim ? dims[l] : max_dim;
    }
    hearth_status st = kv_create_meta(kv, n_layers, max_heads, max_dim, max_slots, max_context, n_blocks, quant, 0, err);
    if (st) return st;
    kv->layer_heads = malloc((size_t)n_layers * sizeof(int));
    kv->layer_dims = malloc((size_t)n_layers * sizeof(int));
    if (!kv->layer_heads || !kv->layer_dims) {
        kv_destroy(kv);
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: out of memory");
    }
    memcpy(kv->layer_heads, heads, (size_t)n_layers * sizeof(int));
    memcpy(kv->layer_dims, dims, (size_t)n_layers * sizeof(int));
    kv_strides(n_layers, max_heads, n_blocks, 1, &kv->block_rows, &kv->layer_rows); /* layer-major */
    return with_storage ? kv_storage_attach(kv, err) : HEARTH_OK;
}

void kv_destroy(kv_cache *kv) {
    storage_free(kv);
    free(kv->layer_heads);
    free(kv->layer_dims);
    free(kv->tables);
    free(kv->n_tokens);
    free(kv->free_list);
    kv_prefix_free(kv);
    kv_state_free(kv);
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
    /* cached blocks nobody holds count as free: taking one evicts it (LRU) */
    if (need - have > kv_blocks_available(kv))
        return err_set(err, HEARTH_ERR_NOMEM, "kv cache: %d more blocks needed, %d free", need - have,
                       kv_blocks_available(kv));
    for (int i = have; i < need; i++) table[i] = kv_block_take(kv);
    if (kv->n_tokens[slot] < n_positions) kv->n_tokens[slot] = n_positions;
    return HEARTH_OK;
}

void kv_truncate(kv_cache *kv, int slot, int n_positions) {
    if (slot < 0 || slot >= kv->max_slots || n_positions < 0 || n_positions >= kv->n_tokens[slot]) return;
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    for (int i = kv->max_blocks_per_slot - 1; i >= blocks_for(n_positions); i--)
        if (table[i] >= 0) {
            kv_block_drop(kv, table[i]);
            table[i] = -1;
        }
    kv->n_tokens[slot] = n_positions;
}

void kv_release(kv_cache *kv, int slot) {
    if (slot < 0 || slot >= kv->max_slots) return;
    kv_state_slot_release(kv, slot);
    int32_t *table = kv->tables + (size_t)slot * kv->max_blocks_per_slot;
    int n = 0;
    while (n < kv->max_blocks_per_slot && table[n] >= 0) n++;
    /* last block first: the LRU then evicts a chain from its tail, keeping the shared
     * beginnings (which every continuation needs) longest */
    for (int i = n - 1; i >= 0; i--) {
        kv_block_drop(kv, table[i]);
        table[i] = -1;
    }
    kv->n_tokens[slot] = 0;
    kv_prefix_slot_reset(kv, slot);
}

/* Runs of one (layer, head)'s positions 0..n of slot, a block at a time: the rows of a
 * block are contiguous in the pool, so each run is one memcpy each way. to_pool: copy
 * from the flat arrays into the pool, else out of it. */
static void slot_rows(kv_cache *kv, int layer, int slot, int head, int n, uint8_t *keys, uint8_t *values,
                      float *k_scale, float *v_scale, int to_pool) {
    size_t eb = kv_elem_bytes(kv->quant), row = (size_t)kv->head_dim * eb;
    uint8_t *k = kv->k ? (uint8_t *)kv->k : (uint8_t *)kv->k8, *v = kv->v ? (uint8_t *)kv->v : (uint8_t *)kv->v8;
    for (int p = 0; p < n; p += KV_BLOCK_SIZE) {
        int run = n - p < KV_BLOCK_SIZE ? n - p : KV_BLOCK_SIZE;
        size_t r = kv_row(kv, layer, slot, p, head);
        uint8_t *pk = k + r * row, *pv = v + r * row, *fk = keys + (size_t)p * row, *fv = values + (size_t)p * row;
        memcpy(to_pool ? pk : fk, to_pool ? fk : pk, (size_t)run * row);
        memcpy(to_pool ? pv : fv, to_pool ? fv : pv, (size_t)run * row);
        if (kv->k_scale && k_scale) {
            float *sk = kv->k_scale + r, *sv = kv->v_scale + r;
            memcpy(to_pool ? sk : k_scale + p, to_pool ? k_scale + p : sk, (size_t)run * sizeof(float));
            memcpy(to_pool ? sv : v_scale + p, to_pool ? v_scale + p : sv, (size_t)run * sizeof(float));
        }
    }
}

void kv_slot_rows_read(const kv_cache *kv, int layer, int slot, int head, int n, void *keys, void *values,
                       float *k_scale, float *v_scale) {
    slot_rows((kv_cache *)kv, layer, slot, head, n, keys, values, k_scale, v_scale, 0);
}

void kv_slot_rows_write(kv_cache *kv, int layer, int slot, int head, int n, const void *keys, const void *values,
                        const float *k_scale, const float *v_scale) {
    slot_rows(kv, layer, slot, head, n, (uint8_t *)keys, (uint8_t *)values, (float *)k_scale, (float *)v_scale, 1);
}
