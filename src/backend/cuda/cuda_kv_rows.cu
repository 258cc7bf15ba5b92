/* cuda_kv_rows.cu: a sequence's KV rows between the device pool and host memory, in the
 * host pool's element types (kv_slot_rows_read / write's form): what saved KV files
 * (engine/seq_file.c) need on the GPU. One launch per (layer, KV head) copies every row of
 * the sequence through a pinned, device-mapped host stage; no device memory is allocated.
 * Never called inside a step or a graph capture. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_kv_rows.h"
#include "kv/kv_cache.h"
}
#include <string.h>

void cuda_rows_stage_free(cuda_rows_stage *s) {
    if (s->host) cudaFreeHost(s->host);
    s->host = s->dev = NULL;
    s->bytes = 0;
}

static hearth_status stage_reserve(cuda_rows_stage *s, size_t bytes, hearth_error *err) {
    if (s->bytes >= bytes) return HEARTH_OK;
    cuda_rows_stage_free(s);
    hearth_status st = cuda_status(cudaHostAlloc(&s->host, bytes, cudaHostAllocMapped), "pinned KV rows stage", err);
    if (st) {
        s->host = NULL;
        return st;
    }
    if ((st = cuda_status(cudaHostGetDevicePointer(&s->dev, s->host, 0), "mapping the KV rows stage", err))) {
        cuda_rows_stage_free(s);
        return st;
    }
    s->bytes = bytes;
    return HEARTH_OK;
}

#define ROWS_THREADS 128

/* One CUDA block per position t of [0, n): the key and value rows of KV head `head` of the
 * pool `kv` (one layer's view, layer index `layer` in it) at position t, whose pool block is
 * blocks[t / KV_BLOCK_SIZE], to or from row t of hk / hv (`row` bytes each), and their scales
 * to or from hks[t] / hvs[t] (NULL: a float or f16 pool). The row index is cuda_kv_row's
 * (cuda_kv_access.cuh): ((layer * n_blocks + block) * n_kv_heads + head) * KV_BLOCK_SIZE + t % KV_BLOCK_SIZE. */
__global__ void __launch_bounds__(ROWS_THREADS)
    kv_rows_kernel(cuda_kv kv, int layer, const int32_t *blocks, int head, size_t row, char *hk, char *hv, float *hks,
                   float *hvs, int to_host) {
    int t = blockIdx.x;
    size_t r = (((size_t)layer * kv.n_blocks + blocks[t / KV_BLOCK_SIZE]) * kv.n_kv_heads + head) * KV_BLOCK_SIZE +
               (size_t)(t % KV_BLOCK_SIZE);
    char *dk = (char *)kv.k + r * row, *dv = (char *)kv.v + r * row;
    char *sk = hk + (size_t)t * row, *sv = hv + (size_t)t * row;
    for (size_t i = threadIdx.x; i < row; i += ROWS_THREADS) {
        if (to_host)
            sk[i] = dk[i], sv[i] = dv[i];
        else
            dk[i] = sk[i], dv[i] = sv[i];
    }
    if (hks && threadIdx.x == 0) {
        if (to_host)
            hks[t] = kv.k_scale[r], hvs[t] = kv.v_scale[r];
        else
            kv.k_scale[r] = hks[t], kv.v_scale[r] = hvs[t];
    }
}

/* The stage holds keys, values, key scales, value scales and the block ids, each part on an
 * 8-byte boundary (a row of int8 elements may be any number of bytes). */
static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

hearth_status cuda_kv_rows(const cuda_kv *dkv, cuda_rows_stage *stage, const int32_t *tables, int layer, int slot,
                           int head, int n, void *keys, void *values, float *k_scale, float *v_scale, int to_host,
                           hearth_error *err) {
    if (layer < 0 || layer >= dkv->n_layers || slot < 0 || slot >= dkv->max_slots || n < 0 ||
        n > dkv->max_blocks_per_slot * KV_BLOCK_SIZE)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_rows: layer %d, slot %d, %d rows", layer, slot, n);
    cuda_kv view; /* the layer's own shape where layers differ */
    int vl = cuda_kv_layer_view(dkv, layer, &view);
    if (head < 0 || head >= view.n_kv_heads)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_rows: KV head %d of %d", head, view.n_kv_heads);
    int scaled = kv_quant_scaled(dkv->quant);
    if (scaled && (!k_scale || !v_scale))
        return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_rows: a scaled pool's rows need their scales");
    if (n == 0) return HEARTH_OK;
    size_t row = (size_t)view.head_dim * kv_elem_bytes(dkv->quant), data = align8((size_t)n * row);
    size_t scales = scaled ? align8((size_t)n * sizeof(float)) : 0;
    int n_blocks = (n + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
    hearth_status st = stage_reserve(stage, 2 * data + 2 * scales + (size_t)n_blocks * sizeof(int32_t), err);
    if (st) return st;
    /* the parts, at the same offsets in the host's view (h*) and the device's (d*) of the stage */
    size_t o_kscale = 2 * data, o_vscale = o_kscale + scales, o_blocks = o_vscale + scales;
    char *hk = (char *)stage->host, *hv = hk + data, *dk = (char *)stage->dev, *dv = dk + data;
    float *hks = scaled ? (float *)(hk + o_kscale) : NULL, *hvs = scaled ? (float *)(hk + o_vscale) : NULL;
    float *dks = scaled ? (float *)(dk + o_kscale) : NULL, *dvs = scaled ? (float *)(dk + o_vscale) : NULL;
    int32_t *blocks = (int32_t *)(hk + o_blocks);
    for (int b = 0; b < n_blocks; b++) {
        blocks[b] = tables[(size_t)slot * dkv->max_blocks_per_slot + b];
        if (blocks[b] < 0 || blocks[b] >= dkv->n_blocks)
            return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_rows: position %d of slot %d has no KV block",
                           b * KV_BLOCK_SIZE, slot);
    }
    if (!to_host) {
        memcpy(hk, keys, (size_t)n * row);
        memcpy(hv, values, (size_t)n * row);
        if (scaled) memcpy(hks, k_scale, (size_t)n * sizeof(float)), memcpy(hvs, v_scale, (size_t)n * sizeof(float));
    }
    kv_rows_kernel<<<n, ROWS_THREADS, 0, cuda_stream()>>>(view, vl, (const int32_t *)(dk + o_blocks), head, row, dk, dv,
                                                          dks, dvs, to_host);
    if ((st = cuda_launched("kv_rows", err))) return st;
    /* the stage is read (to the host) or reused (next call) only after the kernel is done */
    if ((st = cuda_status(cudaStreamSynchronize(cuda_stream()), "kv_rows", err))) return st;
    if (to_host) {
        memcpy(keys, hk, (size_t)n * row);
        memcpy(values, hv, (size_t)n * row);
        if (scaled) memcpy(k_scale, hks, (size_t)n * sizeof(float)), memcpy(v_scale, hvs, (size_t)n * sizeof(float));
    }
    return HEARTH_OK;
}
