/* cuda_ops.cu: the element-wise ops (rmsnorm, rope, SiLU/GELU-tanh gating) and paged
 * decode attention on the device, with the same arithmetic contract as ops/ops_cpu.c
 * (float32 throughout, max-subtracted softmax). Must not allocate or synchronize, except
 * cuda_kv_upload, which runs once at start. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "engine/kv_cache.h"
}
#include <math.h>
#include <string.h>

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block of 256 threads per row: a row of a few thousand floats is one pass. */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, float shift, int n, float eps) {
    __shared__ float part[8];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < (int)blockDim.x / 32; i++) tot += part[i];
    float inv = 1.0f / sqrtf(tot / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * inv * (w[i] + shift);
}

hearth_status cuda_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps,
                           hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    rmsnorm_kernel<<<T, 256>>>(out, x, w, shift, n, eps);
    return cuda_launched("rmsnorm", err);
}

/* One thread per (token, head, pair). */
__global__ void rope_kernel(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                            int adjacent) {
    int half = head_dim / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)T * n_heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    size_t th = idx / half; /* t * n_heads + h */
    int t = (int)(th / n_heads);
    float theta = (float)pos[t] * inv_freq[i];
    float c = cosf(theta), s = sinf(theta);
    float *v = x + th * head_dim;
    int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

hearth_status cuda_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                        int adjacent, hearth_error *err) {
    size_t total = (size_t)T * n_heads * (head_dim / 2);
    if (total == 0) return HEARTH_OK;
    rope_kernel<<<(unsigned)((total + 255) / 256), 256>>>(x, T, n_heads, head_dim, pos, inv_freq, adjacent);
    return cuda_launched("rope", err);
}

__global__ void silu_mul_kernel(float *gate, const float *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ void gelu_tanh_mul_kernel(float *gate, const float *up, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi), as ops_cpu.c */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
}

hearth_status cuda_silu_mul(float *gate, const float *up, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256>>>(gate, up, n);
    return cuda_launched("silu_mul", err);
}

hearth_status cuda_gelu_tanh_mul(float *gate, const float *up, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    gelu_tanh_mul_kernel<<<(unsigned)((n + 255) / 256), 256>>>(gate, up, n);
    return cuda_launched("gelu_tanh_mul", err);
}

hearth_status cuda_kv_upload(cuda_kv *dkv, const kv_cache *kv, hearth_error *err) {
    memset(dkv, 0, sizeof *dkv);
    dkv->n_layers = kv->n_layers;
    dkv->n_kv_heads = kv->n_kv_heads;
    dkv->head_dim = kv->head_dim;
    dkv->n_blocks = kv->n_blocks;
    dkv->max_slots = kv->max_slots;
    dkv->max_blocks_per_slot = kv->max_blocks_per_slot;
    size_t kvb = (size_t)kv->n_layers * kv->n_blocks * kv->block_floats * sizeof(float);
    size_t tb = (size_t)kv->max_slots * kv->max_blocks_per_slot * sizeof(int32_t);
    hearth_status s = cuda_alloc((void **)&dkv->k, kvb, "KV keys", err);
    if (!s) s = cuda_alloc((void **)&dkv->v, kvb, "KV values", err);
    if (!s) s = cuda_alloc((void **)&dkv->tables, tb, "KV block tables", err);
    if (!s) s = cuda_upload(dkv->k, kv->k, kvb, err);
    if (!s) s = cuda_upload(dkv->v, kv->v, kvb, err);
    if (!s) s = cuda_upload(dkv->tables, kv->tables, tb, err);
    if (s) cuda_kv_free(dkv);
    return s;
}

void cuda_kv_free(cuda_kv *dkv) {
    cuda_free(dkv->k);
    cuda_free(dkv->v);
    cuda_free(dkv->tables);
    memset(dkv, 0, sizeof *dkv);
}

#define ATT_WARPS 4
#define ATT_DMAX 256 /* largest head_dim of the supported families (gemma3: 256) */
#define ATT_PER_LANE (ATT_DMAX / 32)

/* One block per (query head, token); each warp runs an online softmax over every
 * ATT_WARPS-th position with the head dims spread over its lanes, then the warps' partial
 * (max, sum, accumulator) triples are merged in shared memory. Positions whose block is
 * missing from the table are skipped rather than read out of bounds. */
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(cuda_attention_args a, cuda_kv kv) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS], s_acc[ATT_WARPS][ATT_DMAX];
    int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = a.head_dim;
    int kvh = h / (a.n_heads / a.n_kv_heads), slot = a.slot[t];
    int p_end = a.pos[t], p_start = 0;
    if (a.window > 0 && p_end - a.window + 1 > 0) p_start = p_end - a.window + 1;
    const float *q = a.q + ((size_t)t * a.n_heads + h) * d;
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        int di = lane + 32 * i;
        qr[i] = di < d ? q[di] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    size_t head_stride = (size_t)KV_BLOCK_SIZE * d;
    for (int p = p_start + warp; p <= p_end; p += ATT_WARPS) {
        int b = kv.tables[(size_t)slot * kv.max_blocks_per_slot + p / KV_BLOCK_SIZE];
        if (b < 0 || b >= kv.n_blocks) continue;
        size_t off = (((size_t)a.layer * kv.n_blocks + b) * kv.n_kv_heads + kvh) * head_stride +
                     (size_t)(p % KV_BLOCK_SIZE) * d;
        const float *kp = kv.k + off, *vp = kv.v + off;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            int di = lane + 32 * i;
            if (di < d) s += qr[i] * kp[di];
        }
        s = warp_sum(s) * a.scale;
        float m_new = fmaxf(m, s), corr = expf(m - m_new), w = expf(s - m_new);
        l = l * corr + w;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            int di = lane + 32 * i;
            acc[i] = acc[i] * corr + (di < d ? w * vp[di] : 0.0f);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) s_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w]);
    float L = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    float *out = a.out + ((size_t)t * a.n_heads + h) * d;
    for (int di = threadIdx.x; di < d; di += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += s_acc[w][di] * f[w];
        out[di] = L > 0.0f ? o / L : 0.0f;
    }
}

hearth_status cuda_attention(const cuda_attention_args *a, hearth_error *err) {
    if (!a || !a->kv || a->T <= 0) return HEARTH_OK;
    if (a->head_dim <= 0 || a->head_dim > ATT_DMAX || a->head_dim != a->kv->head_dim)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_attention: head_dim %d (max %d, pool %d)", a->head_dim,
                       ATT_DMAX, a->kv->head_dim);
    if (a->n_kv_heads != a->kv->n_kv_heads || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        a->layer < 0 || a->layer >= a->kv->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_attention: heads %d/%d or layer %d do not fit the pool",
                       a->n_heads, a->n_kv_heads, a->layer);
    dim3 grid((unsigned)a->n_heads, (unsigned)a->T);
    attention_kernel<<<grid, ATT_WARPS * 32>>>(*a, *a->kv);
    return cuda_launched("attention", err);
}
