/* cuda_kv.cu: the device KV pool: its byte count, allocation (zeroed, in the pool's quant),
 * the upload of a host pool (tests), and kv_write, the only kernel that stores keys and
 * values (quantizing int8 / fp8 rows, rounding f16 ones, by cuda_kv_access.cuh's rules). Allocates only in
 * cuda_kv_alloc / cuda_kv_upload, which run once at start. */
#include "backend/cuda/cuda_kv_access.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_rope.cuh"
extern "C" {
#include "backend/cuda/cuda_plan.h"
}
#include <stdlib.h>
#include <string.h>

/* Rows (positions x heads) and elements of layers [0, n) of a pool (kv_cache.c's layer_extent). */
static void layer_extent(const cuda_kv *kv, int n, size_t *rows, size_t *elems) {
    size_t per_block = (size_t)kv->n_blocks * KV_BLOCK_SIZE;
    *rows = *elems = 0;
    for (int l = 0; l < n; l++) {
        int heads = kv->layer_heads ? kv->layer_heads[l] : kv->n_kv_heads;
        int dim = kv->layer_dims ? kv->layer_dims[l] : kv->head_dim;
        *rows += per_block * heads;
        *elems += per_block * heads * dim;
    }
}

static size_t elem_bytes(int quant) {
    int dtype = cuda_kv_device_dtype(quant);
    return dtype == CUDA_KV_F32 ? sizeof(float) : dtype == CUDA_KV_F16 ? 2 : 1;
}

int cuda_kv_layer_view(const cuda_kv *kv, int layer, cuda_kv *view) {
    *view = *kv;
    if (!kv->layer_heads) return layer;
    size_t rows, elems, eb = elem_bytes(kv->quant);
    layer_extent(kv, layer, &rows, &elems);
    view->n_layers = 1;
    view->n_kv_heads = kv->layer_heads[layer];
    view->head_dim = kv->layer_dims[layer];
    view->layer_heads = view->layer_dims = NULL;
    view->k = (char *)kv->k + elems * eb;
    view->v = (char *)kv->v + elems * eb;
    if (kv->k_scale) view->k_scale = kv->k_scale + rows, view->v_scale = kv->v_scale + rows;
    return 0;
}

static hearth_status kv_create(cuda_kv *dkv, const kv_cache *kv, int quant, hearth_error *err) {
    memset(dkv, 0, sizeof *dkv);
    if (kv->layer_heads) { /* host copies of the layers' shapes (cuda_kv_layer_view) */
        dkv->layer_heads = (int *)malloc((size_t)kv->n_layers * sizeof(int));
        dkv->layer_dims = (int *)malloc((size_t)kv->n_layers * sizeof(int));
        if (!dkv->layer_heads || !dkv->layer_dims) {
            cuda_kv_free(dkv);
            return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
        }
        memcpy(dkv->layer_heads, kv->layer_heads, (size_t)kv->n_layers * sizeof(int));
        memcpy(dkv->layer_dims, kv->layer_dims, (size_t)kv->n_layers * sizeof(int));
    }
    dkv->n_layers = kv->n_layers;
    dkv->n_kv_heads = kv->n_kv_heads;
    dkv->head_dim = kv->head_dim;
    dkv->n_blocks = kv->n_blocks;
    dkv->max_slots = kv->max_slots;
    dkv->max_blocks_per_slot = kv->max_blocks_per_slot;
    dkv->quant = quant;
    if (!kv_quant_known(quant))
        return err_set(err, HEARTH_ERR_INVALID,
                       "cuda: unknown KV quantization %d (--kv-quant takes none, int8, fp8 or f16)", quant);
    int scaled = kv_quant_scaled(quant);
    size_t eb, sb; /* the sizes hearth fit counts (cuda_plan.c) */
    cuda_kv_pool_parts(kv, cuda_kv_device_dtype(quant), &eb, &sb);
    size_t tb = (size_t)kv->max_slots * kv->max_blocks_per_slot * sizeof(int32_t);
    hearth_status s = cuda_alloc(&dkv->k, eb, "KV keys", err);
    if (!s) s = cuda_alloc(&dkv->v, eb, "KV values", err);
    if (!s && scaled) s = cuda_alloc((void **)&dkv->k_scale, sb, "KV key scales", err);
    if (!s && scaled) s = cuda_alloc((void **)&dkv->v_scale, sb, "KV value scales", err);
    if (!s) s = cuda_alloc((void **)&dkv->tables, tb, "KV block tables", err);
    /* zeroed so a position read before it was written is 0, never NaN from stale memory */
    if (!s) s = cuda_status(cudaMemset(dkv->k, 0, eb), "cudaMemset KV", err);
    if (!s) s = cuda_status(cudaMemset(dkv->v, 0, eb), "cudaMemset KV", err);
    if (!s && dkv->k_scale) s = cuda_status(cudaMemset(dkv->k_scale, 0, sb), "cudaMemset KV", err);
    if (!s && dkv->v_scale) s = cuda_status(cudaMemset(dkv->v_scale, 0, sb), "cudaMemset KV", err);
    if (!s) s = cuda_upload(dkv->tables, kv->tables, tb, err);
    if (s) cuda_kv_free(dkv);
    return s;
}

hearth_status cuda_kv_alloc(cuda_kv *dkv, const kv_cache *kv, int quant, hearth_error *err) {
    return kv_create(dkv, kv, quant, err);
}

/* One of a host pool's arrays (bytes in all, rows of row_bytes) to the device in the device
 * pool's order: the device pool is layer-major ([layer][block][head][position], cuda_kv_row),
 * the host pool block-major where its layers share one shape (kv_cache.h), so each (layer,
 * block)'s run of n_kv_heads x KV_BLOCK_SIZE rows moves; a pool of layers of their own
 * shapes is layer-major on both sides and goes as it is. */
static hearth_status upload_rows(void *dst, const void *src, size_t bytes, size_t row_bytes, const kv_cache *kv,
                                 hearth_error *err) {
    if (kv->layer_heads || kv->n_layers == 1) return cuda_upload(dst, src, bytes, err);
    char *stage = (char *)malloc(bytes);
    if (!stage) return err_set(err, HEARTH_ERR_NOMEM, "cuda_kv_upload: out of memory");
    size_t run = (size_t)kv->n_kv_heads * KV_BLOCK_SIZE * row_bytes;
    for (int l = 0; l < kv->n_layers; l++)
        for (int b = 0; b < kv->n_blocks; b++)
            memcpy(stage + ((size_t)l * kv->n_blocks + b) * run, (const char *)src + kv_block_row(kv, l, b, 0) * row_bytes,
                   run);
    hearth_status s = cuda_upload(dst, stage, bytes, err);
    free(stage);
    return s;
}

hearth_status cuda_kv_upload(cuda_kv *dkv, const kv_cache *kv, hearth_error *err) {
    if (kv->quant != HEARTH_KV_FLOAT && kv->quant != HEARTH_KV_INT8)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_kv_upload: a host pool holds float or int8 KV only");
    hearth_status s = kv_create(dkv, kv, kv->quant, err);
    if (s) return s;
    size_t rows, elems; /* over all layers */
    layer_extent(dkv, dkv->n_layers, &rows, &elems);
    size_t eb = kv->quant == HEARTH_KV_FLOAT ? sizeof(float) : 1, row = (size_t)kv->head_dim * eb;
    s = upload_rows(dkv->k, kv->k ? (const void *)kv->k : kv->k8, elems * eb, row, kv, err);
    if (!s) s = upload_rows(dkv->v, kv->v ? (const void *)kv->v : kv->v8, elems * eb, row, kv, err);
    if (!s && kv->quant == HEARTH_KV_INT8) {
        s = upload_rows(dkv->k_scale, kv->k_scale, rows * sizeof(float), sizeof(float), kv, err);
        if (!s) s = upload_rows(dkv->v_scale, kv->v_scale, rows * sizeof(float), sizeof(float), kv, err);
    }
    if (s) cuda_kv_free(dkv);
    return s;
}

void cuda_kv_free(cuda_kv *dkv) {
    cuda_free(dkv->k);
    cuda_free(dkv->v);
    cuda_free(dkv->k_scale);
    cuda_free(dkv->v_scale);
    cuda_free(dkv->tables);
    free(dkv->layer_heads);
    free(dkv->layer_dims);
    memset(dkv, 0, sizeof *dkv);
}

#define KVW_THREADS 128

/* max |x| over the block's threads (KVW_THREADS), every thread gets it. */
static __device__ __forceinline__ float block_amax(float a, float *part) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = a;
    __syncthreads();
    a = 0.0f;
#pragma unroll
    for (int i = 0; i < KVW_THREADS / 32; i++) a = fmaxf(a, part[i]);
    return a;
}

/* Token t's key and value rows of KV head h (ks, vs: head_dim floats) into the pool of
 * `layer`, by one block of KVW_THREADS; a position whose block is missing from the table is
 * not written (the host reserved every position before the step). Quantized pools: the
 * row's max |x| (exact in any order), its scale, then every element. */
template <int KVQ>
static __device__ __forceinline__ void kv_write_row(const cuda_kv &kv, int layer, const float *ks, const float *vs,
                                                    int h, int p, int slot) {
    __shared__ float part_k[KVW_THREADS / 32], part_v[KVW_THREADS / 32];
    int d = kv.head_dim, b = cuda_kv_block(kv, slot, p);
    if (b < 0) return; /* the whole block leaves: no barrier below is half-reached */
    size_t row = cuda_kv_row(kv, layer, b, h, p);
    float inv_k = 1.0f, inv_v = 1.0f;
    if (KVQ == HEARTH_KV_INT8 || KVQ == HEARTH_KV_FP8) {
        float ak = 0.0f, av = 0.0f;
        for (int i = threadIdx.x; i < d; i += KVW_THREADS) {
            ak = fmaxf(ak, fabsf(ks[i]));
            av = fmaxf(av, fabsf(vs[i]));
        }
        ak = block_amax(ak, part_k);
        av = block_amax(av, part_v);
        float sk = cuda_kv_scale<KVQ>(ak), sv = cuda_kv_scale<KVQ>(av);
        inv_k = sk > 0.0f ? 1.0f / sk : 0.0f;
        inv_v = sv > 0.0f ? 1.0f / sv : 0.0f;
        if (threadIdx.x == 0) {
            kv.k_scale[row] = sk;
            kv.v_scale[row] = sv;
        }
    }
    for (int i = threadIdx.x; i < d; i += KVW_THREADS) {
        cuda_kv_store<KVQ>(kv.k, row, d, i, ks[i], inv_k);
        cuda_kv_store<KVQ>(kv.v, row, d, i, vs[i], inv_v);
    }
}

/* One block per (token, KV head). */
template <int KVQ>
__global__ void __launch_bounds__(KVW_THREADS)
    kv_write_kernel(cuda_kv kv, int layer, const float *k, const float *v, const int32_t *pos, const int32_t *slot) {
    pdl_wait(); /* k and v come from the kernels before (pdl_launch_small) */
    pdl_trigger();
    int t = blockIdx.x, h = blockIdx.y;
    size_t off = ((size_t)t * kv.n_kv_heads + h) * kv.head_dim;
    kv_write_row<KVQ>(kv, layer, k + off, v + off, h, pos[t], slot[t]);
}

/* RoPE of q and k (cuda_rope_qk) and kv_write in one launch, for the decode steps: blocks
 * (t, h) with h < nkv rotate key head h of token t in place, then store it and its value
 * row; the others rotate query head h - nkv in place (nkv 0: queries only). Before that,
 * each head's own norm when hn asks for it: q / k by warp 0 (warp_row_norm, the order of
 * cuda_rmsnorm_heads; head_dim <= 256), v by the block (block_row_norm_plain, the order of
 * cuda_rmsnorm_plain). Every rotation is rope_rotate_pair, so q, k and the pool rows equal
 * those of the separate launches bit for bit. Only the first 2 half dims of each head rotate
 * (partial RoPE; half = head_dim / 2: all). */
template <int KVQ>
__global__ void __launch_bounds__(KVW_THREADS)
    rope_kv_write_kernel(cuda_kv kv, int layer, float *q, float *k, float *v, int n_heads, const int32_t *pos,
                         const int32_t *slot, const float *inv_freq, int adjacent, int half, cuda_head_norms hn,
                         int nkv) {
    pdl_trigger();
    int t = blockIdx.x, h = blockIdx.y, d = kv.head_dim, lane = threadIdx.x % 32, is_q = h >= nkv;
    const float *nw = is_q ? hn.q : hn.k;
    float wv[8]; /* the norm's weights (no kernel writes them) load before the wait */
    if (nw && threadIdx.x < 32) warp_row_weights(wv, nw, d, lane);
    pdl_wait(); /* q, k and v come from the q/k/v GEMV (pdl_launch_small) */
    int p = pos[t];
    float *row = is_q ? q + ((size_t)t * n_heads + (h - nkv)) * d : k + ((size_t)t * kv.n_kv_heads + h) * d;
    if (nw) {
        if (threadIdx.x < 32) warp_row_norm(row, row, wv, hn.shift, d, hn.eps, lane);
        __syncthreads(); /* the normed row, written by warp 0 */
    }
    if (is_q) {
        for (int i = threadIdx.x; i < half; i += KVW_THREADS) rope_rotate_pair(row, i, half, p, inv_freq, adjacent);
        return;
    }
    size_t off = ((size_t)t * kv.n_kv_heads + h) * d;
    if (hn.v) block_row_norm_plain(v + off, d, hn.eps);
    for (int i = threadIdx.x; i < half; i += KVW_THREADS) rope_rotate_pair(row, i, half, p, inv_freq, adjacent);
    __syncthreads(); /* the rotated row (and the normed values), written by other threads of the block */
    kv_write_row<KVQ>(kv, layer, row, v + off, h, p, slot[t]);
}

hearth_status cuda_norm_rope_kv_write(const cuda_kv *dkv, int layer, float *q, float *k, float *v, int T, int n_heads,
                                      const int32_t *pos, const int32_t *slot, const float *inv_freq, int adjacent,
                                      int rot_dims, const cuda_head_norms *hn, int q_only, hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    if (rot_dims == 0) rot_dims = dkv->head_dim;
    if (rot_dims < 0 || rot_dims > dkv->head_dim || rot_dims % 2)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_rope_kv_write: RoPE on %d of %d dims", rot_dims,
                       dkv->head_dim);
    if (layer < 0 || layer >= dkv->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_rope_kv_write: layer %d of %d", layer, dkv->n_layers);
    if (dkv->head_dim % 2)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_rope_kv_write: odd head_dim %d", dkv->head_dim);
    cuda_head_norms none = {0}, h = hn ? *hn : none;
    if ((h.q || h.k) && dkv->head_dim > 256)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_norm_rope_kv_write: head norms of %d dims (at most 256)",
                       dkv->head_dim);
    int nkv = q_only ? 0 : dkv->n_kv_heads;
    dim3 grid((unsigned)T, (unsigned)(nkv + n_heads));
    CUDA_KV_DISPATCH(dkv->quant, KVQ,
                     pdl_launch_small(rope_kv_write_kernel<KVQ>, grid, dim3(KVW_THREADS), *dkv, layer, q, k, v, n_heads,
                                      pos, slot, inv_freq, adjacent, rot_dims / 2, h, nkv));
    return cuda_launched("rope_kv_write", err);
}

hearth_status cuda_rope_kv_write(const cuda_kv *dkv, int layer, float *q, float *k, const float *v, int T, int n_heads,
                                 const int32_t *pos, const int32_t *slot, const float *inv_freq, int adjacent,
                                 int rot_dims, hearth_error *err) {
    /* v is only written when a value norm is asked for */
    return cuda_norm_rope_kv_write(dkv, layer, q, k, (float *)v, T, n_heads, pos, slot, inv_freq, adjacent, rot_dims,
                                   NULL, 0, err);
}

hearth_status cuda_kv_write(const cuda_kv *dkv, int layer, const float *k, const float *v, int T, const int32_t *pos,
                            const int32_t *slot, hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    if (layer < 0 || layer >= dkv->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_write: layer %d of %d", layer, dkv->n_layers);
    dim3 grid((unsigned)T, (unsigned)dkv->n_kv_heads);
    CUDA_KV_DISPATCH(dkv->quant, KVQ,
                     pdl_launch_small(kv_write_kernel<KVQ>, grid, dim3(KVW_THREADS), *dkv, layer, k, v, pos, slot));
    return cuda_launched("kv_write", err);
}

/* Positions [0, rows) of block src into block dst, one CUDA block per (layer, KV head):
 * the rows' bytes in the pool's own element type, and their scales. */
__global__ void kv_copy_rows_kernel(cuda_kv kv, size_t row_bytes, int src, int dst, int rows) {
    int l = blockIdx.x / kv.n_kv_heads, h = blockIdx.x % kv.n_kv_heads;
    size_t from = (((size_t)l * kv.n_blocks + src) * kv.n_kv_heads + h) * KV_BLOCK_SIZE;
    size_t to = (((size_t)l * kv.n_blocks + dst) * kv.n_kv_heads + h) * KV_BLOCK_SIZE;
    const char *ks = (const char *)kv.k + from * row_bytes, *vs = (const char *)kv.v + from * row_bytes;
    char *kd = (char *)kv.k + to * row_bytes, *vd = (char *)kv.v + to * row_bytes;
    for (size_t i = threadIdx.x; i < (size_t)rows * row_bytes; i += blockDim.x) kd[i] = ks[i], vd[i] = vs[i];
    if (kv.k_scale)
        for (int i = threadIdx.x; i < rows; i += blockDim.x)
            kv.k_scale[to + i] = kv.k_scale[from + i], kv.v_scale[to + i] = kv.v_scale[from + i];
}

hearth_status cuda_kv_copy_rows(const cuda_kv *dkv, int32_t src, int32_t dst, int rows, hearth_error *err) {
    if (src < 0 || dst < 0 || src >= dkv->n_blocks || dst >= dkv->n_blocks || rows < 0 || rows > KV_BLOCK_SIZE)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_kv_copy_rows: blocks %d -> %d, %d rows", src, dst, rows);
    if (rows == 0) return HEARTH_OK;
    size_t eb = elem_bytes(dkv->quant);
    if (dkv->layer_heads) { /* layers of their own shape: one launch per layer, on its view */
        for (int l = 0; l < dkv->n_layers; l++) {
            cuda_kv view;
            cuda_kv_layer_view(dkv, l, &view);
            kv_copy_rows_kernel<<<view.n_kv_heads, 256, 0, cuda_stream()>>>(view, eb * view.head_dim, src, dst, rows);
            if (cuda_launched("kv_copy_rows", err)) return HEARTH_ERR_IO;
        }
        return HEARTH_OK;
    }
    kv_copy_rows_kernel<<<dkv->n_layers * dkv->n_kv_heads, 256, 0, cuda_stream()>>>(*dkv, eb * dkv->head_dim, src,
                                                                                    dst, rows);
    return cuda_launched("kv_copy_rows", err);
}
