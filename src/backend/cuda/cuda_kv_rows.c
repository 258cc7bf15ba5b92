/* cuda_kv_rows.c: a sequence's KV rows and recurrent-state record between the device pools
 * and host memory, in the host pool's element types (kv_slot_rows_read / write's form):
 * what saved KV files (engine/seq_file.c) need on the GPU. Host-side C: stream-ordered
 * copies only, no kernels, no allocation; never called inside a step or a graph capture. */
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_kv_rows.h"
#include "base/err.h"
#include "kv/kv_cache.h"
#include <stdint.h>

/* Rows are copied block by block (a sequence's blocks are anywhere in the pool): one copy
 * of keys, one of values and, for int8 / fp8, one of each scale row per block of the
 * sequence. The device row of position p of (layer, head) in block b is
 * ((layer * n_blocks + b) * n_kv_heads + head) * KV_BLOCK_SIZE + p % KV_BLOCK_SIZE, as
 * cuda_kv_row (cuda_kv_access.cuh) indexes it. */
hearth_status cuda_kv_rows(const cuda_kv *dkv, const int32_t *tables, int layer, int slot, int head, int n, void *keys,
                           void *values, float *k_scale, float *v_scale, int to_host, hearth_error *err) {
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
    size_t row = (size_t)view.head_dim * kv_elem_bytes(dkv->quant);
    for (int p0 = 0; p0 < n; p0 += KV_BLOCK_SIZE) {
        int rows = n - p0 < KV_BLOCK_SIZE ? n - p0 : KV_BLOCK_SIZE;
        int32_t b = tables[(size_t)slot * dkv->max_blocks_per_slot + p0 / KV_BLOCK_SIZE];
        if (b < 0 || b >= dkv->n_blocks)
            return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_rows: position %d of slot %d has no KV block", p0, slot);
        size_t first = (((size_t)vl * view.n_blocks + b) * view.n_kv_heads + head) * KV_BLOCK_SIZE;
        char *dk = (char *)view.k + first * row, *dv = (char *)view.v + first * row;
        char *hk = (char *)keys + (size_t)p0 * row, *hv = (char *)values + (size_t)p0 * row;
        size_t bytes = (size_t)rows * row, sbytes = (size_t)rows * sizeof(float);
        hearth_status s;
        if (to_host) {
            s = cuda_download_async(hk, dk, bytes, err);
            if (!s) s = cuda_download_async(hv, dv, bytes, err);
            if (!s && scaled) s = cuda_download_async(k_scale + p0, view.k_scale + first, sbytes, err);
            if (!s && scaled) s = cuda_download_async(v_scale + p0, view.v_scale + first, sbytes, err);
        } else {
            s = cuda_upload_async(dk, hk, bytes, err);
            if (!s) s = cuda_upload_async(dv, hv, bytes, err);
            if (!s && scaled) s = cuda_upload_async(view.k_scale + first, k_scale + p0, sbytes, err);
            if (!s && scaled) s = cuda_upload_async(view.v_scale + first, v_scale + p0, sbytes, err);
        }
        if (s) return s;
    }
    /* the caller reuses or frees its buffers next: every copy done, either way */
    return cuda_stream_sync(err);
}
#endif
