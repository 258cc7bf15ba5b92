/* cuda_ops.cu: the element-wise ops (rmsnorm, rope, SiLU/GELU-tanh gating) and paged
 * decode attention on the device, with the same arithmetic contract as backend/cpu/cpu_ops.c
 * (float32 arithmetic, max-subtracted softmax; K/V read through cuda_kv_access.cuh in the
 * pool's float32 / int8 / fp8 storage), plus residual/bias adds and row gathers. Must not
 * allocate or synchronize. */
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_kv_access.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_rope.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_q8.cuh"
extern "C" {
#include "backend/cuda/cuda_plan.h"
}
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int cuda_pdl_small_on(void) {
    static int on = -1;
    if (on < 0) on = pdl_device_ok();
    return on;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block of NORM_THREADS per row (cuda_norm.cuh). */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, float shift, int n, float eps) {
    pdl_trigger(); /* a decode GEMV launched after this may start prefetching its weights */
    /* a programmatic dependent (pdl_launch_small): norm_row waits before reading x */
    float *o = out + (size_t)blockIdx.x * n;
    norm_row(x + (size_t)blockIdx.x * n, w, shift, n, eps, [&](int i, float y) { o[i] = y; });
}

hearth_status cuda_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps,
                           hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    pdl_launch_small(rmsnorm_kernel, dim3((unsigned)T), dim3(NORM_THREADS), out, x, w, shift, n, eps);
    return cuda_launched("rmsnorm", err);
}

/* Rows of at most 256 (the per-head q / k norms: T * heads rows of head_dim): one warp per
 * row, 8 rows per block, lane l summing elements l, l + 32, ... then the warp's xor-tree. A
 * block of NORM_THREADS per 128-value row left 7/8 of its threads idle and made 131072
 * blocks per layer for a 4096-token prefill with 32 query heads. */
#define HEADNORM_ROWS 8
__global__ void __launch_bounds__(HEADNORM_ROWS * 32)
    rmsnorm_heads_kernel(float *out, const float *x, const float *w, float shift, int rows, int n, float eps) {
    pdl_trigger();
    int row = blockIdx.x * HEADNORM_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    float wv[8]; /* the weights (no kernel writes them) load while the kernel before drains */
    warp_row_weights(wv, w, n, lane);
    pdl_wait();
    if (row >= rows) return;
    warp_row_norm(out + (size_t)row * n, x + (size_t)row * n, wv, shift, n, eps, lane);
}

hearth_status cuda_rmsnorm_heads(float *out, const float *x, const float *w, float shift, int rows, int n, float eps,
                                 hearth_error *err) {
    if (rows <= 0 || n <= 0) return HEARTH_OK;
    if (n > 256) return cuda_rmsnorm(out, x, w, shift, rows, n, eps, err);
    pdl_launch_small(rmsnorm_heads_kernel, dim3((unsigned)((rows + HEADNORM_ROWS - 1) / HEADNORM_ROWS)),
                     dim3(HEADNORM_ROWS * 32), out, x, w, shift, rows, n, eps);
    return cuda_launched("rmsnorm_heads", err);
}

/* One thread per (token, head, pair). */
__global__ void rope_kernel(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                            int adjacent) {
    pdl_wait();
    int half = head_dim / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)T * n_heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    size_t th = idx / half; /* t * n_heads + h */
    int t = (int)(th / n_heads);
    rope_rotate_pair(x + th * head_dim, i, half, pos[t], inv_freq, adjacent);
}

hearth_status cuda_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                        int adjacent, hearth_error *err) {
    size_t total = (size_t)T * n_heads * (head_dim / 2);
    if (total == 0) return HEARTH_OK;
    pdl_launch_small(rope_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), x, T, n_heads, head_dim, pos, inv_freq,
                     adjacent);
    return cuda_launched("rope", err);
}

__global__ void silu_mul_kernel(float *gate, const float *up, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    gate[i] = silu_mul_value(gate[i], up[i]);
}

__global__ void gelu_tanh_mul_kernel(float *gate, const float *up, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    gate[i] = gelu_tanh_mul_value(gate[i], up[i]);
}

hearth_status cuda_silu_mul(float *gate, const float *up, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(silu_mul_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), gate, up, n);
    return cuda_launched("silu_mul", err);
}

hearth_status cuda_gelu_tanh_mul(float *gate, const float *up, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(gelu_tanh_mul_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), gate, up, n);
    return cuda_launched("gelu_tanh_mul", err);
}

/* Greedy pick per row, the host sampler's rule: the first index of the largest value
 * (NaN never wins). One block of 1024 threads per row: each thread scans its elements in
 * index order (four 16-byte loads in flight when the row is aligned), then warp shuffles
 * and one warp merge the threads' picks; a pick beats another when its value is larger
 * or equal with a lower index, so the merge order does not change the answer. */
struct argmax_pick {
    float v;
    int i;
};
static __device__ __forceinline__ void argmax_take(argmax_pick &b, float v, int i) {
    if (v > b.v || (b.i == INT_MAX && v == b.v)) b.v = v, b.i = i;
}
static __device__ __forceinline__ argmax_pick argmax_merge(argmax_pick a, argmax_pick b) {
    return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}
static __device__ __forceinline__ argmax_pick argmax_warp(argmax_pick p) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        argmax_pick q = {__shfl_xor_sync(0xffffffffu, p.v, o), __shfl_xor_sync(0xffffffffu, p.i, o)};
        p = argmax_merge(p, q);
    }
    return p;
}

template <bool CHECKED>
__global__ void __launch_bounds__(1024) argmax_kernel(const float *logits, int vocab, int32_t *out) {
    __shared__ argmax_pick s_w[32];
    __shared__ int bad;
    pdl_wait();
    if (CHECKED && threadIdx.x == 0) bad = 0;
    if (CHECKED) __syncthreads();
    const float *r = logits + (size_t)blockIdx.x * vocab;
    argmax_pick b = {-INFINITY, INT_MAX};
    int nonfinite = 0, i0 = 0, nt = blockDim.x;
    if (((uintptr_t)r & 15) == 0) {
        const float4 *r4 = (const float4 *)r;
        int n4 = vocab / 4, j = threadIdx.x;
        for (; j + 3 * nt < n4; j += 4 * nt) {
            float4 a[4];
#pragma unroll
            for (int u = 0; u < 4; u++) a[u] = r4[j + u * nt];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = 4 * (j + u * nt);
                if (CHECKED) nonfinite |= !isfinite(a[u].x) | !isfinite(a[u].y) | !isfinite(a[u].z) | !isfinite(a[u].w);
                argmax_take(b, a[u].x, i);
                argmax_take(b, a[u].y, i + 1);
                argmax_take(b, a[u].z, i + 2);
                argmax_take(b, a[u].w, i + 3);
            }
        }
        for (; j < n4; j += nt) {
            float4 a = r4[j];
            if (CHECKED) nonfinite |= !isfinite(a.x) | !isfinite(a.y) | !isfinite(a.z) | !isfinite(a.w);
            argmax_take(b, a.x, 4 * j);
            argmax_take(b, a.y, 4 * j + 1);
            argmax_take(b, a.z, 4 * j + 2);
            argmax_take(b, a.w, 4 * j + 3);
        }
        i0 = 4 * n4;
    }
    for (int i = i0 + threadIdx.x; i < vocab; i += nt) {
        float v = r[i];
        if (CHECKED) nonfinite |= !isfinite(v);
        argmax_take(b, v, i);
    }
    if (CHECKED && nonfinite) bad = 1;
    b = argmax_warp(b);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (nt + 31) / 32;
    if (lane == 0) s_w[warp] = b;
    __syncthreads();
    if (warp == 0) {
        argmax_pick p = lane < nw ? s_w[lane] : argmax_pick{-INFINITY, INT_MAX};
        p = argmax_warp(p);
        if (lane == 0) out[blockIdx.x] = CHECKED && bad ? -1 : p.i == INT_MAX ? 0 : p.i;
    }
}

hearth_status cuda_argmax(const float *logits, int rows, int vocab, int32_t *out, hearth_error *err) {
    if (rows <= 0 || vocab <= 0) return HEARTH_OK;
    pdl_launch_small(argmax_kernel<false>, dim3((unsigned)rows), dim3(1024), logits, vocab, out);
    return cuda_launched("argmax", err);
}

hearth_status cuda_argmax_checked(const float *logits, int rows, int vocab, int32_t *out, hearth_error *err) {
    if (rows <= 0 || vocab <= 0) return HEARTH_OK;
    pdl_launch_small(argmax_kernel<true>, dim3((unsigned)rows), dim3(1024), logits, vocab, out);
    return cuda_launched("argmax", err);
}

__global__ void add_kernel(float *y, const float *x, size_t n) {
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void add_bias_kernel(float *y, const float *bias, size_t total, int n) {
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += bias[i % n];
}

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int width) {
    pdl_wait();
    const float *s = src + (size_t)rows[blockIdx.x] * width;
    float *d = dst + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

hearth_status cuda_add(float *y, const float *x, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(add_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), y, x, n);
    return cuda_launched("add", err);
}

hearth_status cuda_add_bias(float *y, const float *bias, int T, int n, hearth_error *err) {
    size_t total = (size_t)T * n;
    if (!bias || total == 0) return HEARTH_OK;
    pdl_launch_small(add_bias_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), y, bias, total, n);
    return cuda_launched("add_bias", err);
}

/* rows are checked by the caller (cuda_model_forward validates out_rows on the host). */
hearth_status cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n_rows, int width,
                               hearth_error *err) {
    if (n_rows <= 0) return HEARTH_OK;
    pdl_launch_small(gather_rows_kernel, dim3((unsigned)n_rows), dim3(256), dst, src, rows, width);
    return cuda_launched("gather_rows", err);
}

/* Warps per (head, token) block: decode (few tokens) has only n_heads blocks, so each
 * spreads its positions over 16 warps to keep enough loads in flight (4 left one warp
 * per SM and decode latency-bound); prefill has T * n_heads blocks and keeps 4. */
#define ATT_WARPS_DECODE 16
#define ATT_WARPS_PREFILL 4
#define ATT_DMAX 256 /* largest head_dim of the tuned kernels (256, the widest of the fixed-shape models); wider: attention_wide */
#define ATT_PER_LANE (ATT_DMAX / 32)

/* One block per (query head, token, split); each warp runs an online softmax over every
 * ATT_WARPS-th position of the split's range with the head dims spread over its lanes, then
 * the warps' partial (max, sum, accumulator) triples are merged in shared memory. One split
 * (gridDim.z 1): the whole range, the normalized output. S > 1 splits: ceil(len / S)
 * positions each, (max, sum, unnormalized output) into the split scratch for
 * attention_combine, as attention_decode writes them. Positions whose block is missing
 * from the table are skipped rather than read out of bounds. DMAX: the widest head
 * (ATT_DMAX, or CUDA_ATT_WIDE_DMAX for attention_wide). */
template <int ATT_WARPS, int KVQ, int DMAX = ATT_DMAX, bool SPLIT = false>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(cuda_attention_args a, cuda_kv kv) {
    constexpr int ATT_PER_LANE_D = DMAX / 32;
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS], s_acc[ATT_WARPS][DMAX];
    int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = a.head_dim;
    int kvh = h / (a.n_heads / a.n_kv_heads), slot = a.slot[t];
    int p_end = a.pos[t], p_start = 0;
    if (a.window > 0 && p_end - a.window + 1 > 0) p_start = p_end - a.window + 1;
    const int S = SPLIT ? (int)gridDim.z : 1; /* the unsplit instances keep their code as it was */
    if (S > 1) { /* this split's positions */
        int len = p_end - p_start + 1, chunk = max((len + S - 1) / S, 1);
        p_start += (int)blockIdx.z * chunk;
        if (p_start > p_end) return; /* past the sequence: attention_combine reads only the splits before */
        p_end = min(p_start + chunk - 1, p_end);
    }
    const float *q = a.q + ((size_t)t * a.n_heads + h) * d;
    float qr[ATT_PER_LANE_D], acc[ATT_PER_LANE_D];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE_D; i++) {
        int di = lane + 32 * i;
        qr[i] = di < d ? q[di] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = p_start + warp; p <= p_end; p += ATT_WARPS) {
        int b = cuda_kv_block(kv, slot, p);
        if (b < 0) continue;
        size_t row = cuda_kv_row(kv, a.layer, b, kvh, p);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE_D; i++) {
            int di = lane + 32 * i;
            if (di < d) s += qr[i] * cuda_kv_k<KVQ>(kv, row, d, di);
        }
        s = warp_sum(s) * a.scale;
        float m_new = fmaxf(m, s), corr = expf(m - m_new), w = expf(s - m_new);
        l = l * corr + w;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE_D; i++) {
            int di = lane + 32 * i;
            acc[i] = acc[i] * corr + (di < d ? w * cuda_kv_v<KVQ>(kv, row, d, di) : 0.0f);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE_D; i++) s_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w]);
    float L = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    if (S > 1) { /* (m, l, pad, pad, o[d]) of this split, attention_combine's layout */
        float *part = a.split_scratch + (((size_t)t * a.n_heads + h) * S + blockIdx.z) * (size_t)(d + 4);
        if (threadIdx.x == 0) part[0] = M, part[1] = L;
        for (int di = threadIdx.x; di < d; di += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) o += s_acc[w][di] * f[w];
            part[4 + di] = o;
        }
        return;
    }
    float *out = a.out + ((size_t)t * a.n_heads + h) * d;
    for (int di = threadIdx.x; di < d; di += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += s_acc[w][di] * f[w];
        out[di] = L > 0.0f ? o / L : 0.0f;
    }
}

/* Decode attention, GQA-shared and split over the sequence: one block of DA_WARPS warps
 * per (KV head, token, split). The block serves all G query heads of its KV head, so each
 * key and value row is read from the pool once per token instead of once per query head,
 * and the S splits of the sequence run in parallel (S is fixed per launch shape, so a
 * replayed graph stays valid as sequences grow: each split takes ceil(len / S) positions).
 * Within a split, tiles of DA_TILE positions: warps score positions (lanes over the head
 * dims, 16-byte loads, all of a warp's rows of the tile loaded before use, their values too
 * where they fit in registers), warp g updates head g's online softmax over the tile, then
 * warps accumulate values for every head. With S > 1 each split
 * writes (max, sum, unnormalized output) and attention_combine merges them. */
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define DA_WARPS 8
#define DA_TILE 64
#define DA_UNROLL 4
#define DA_ROWS (DA_TILE / DA_WARPS)      /* tile rows per warp */
#define DA_SPLITS_MAX CUDA_ATT_SPLITS_MAX /* cuda_plan.h: the split scratch is sized by it */

/* (Merging the split partials inside the attention launch instead, by the last split of
 * each token and KV head to finish, measured slower on the H200, with dependent loads and
 * with every split load issued before the first use: bench/results/kernel_choices.md,
 * "CUDA split merge".) */
template <int GM, int NV, int KVQ, bool HOLD>
__global__ void __launch_bounds__(DA_WARPS * 32, (HOLD && GM <= 4) ? 2 : 1)
    attention_decode_kernel(cuda_attention_args a, cuda_kv kv, int S, int early) {
    __shared__ float s_p[GM][DA_TILE];
    __shared__ float s_m[GM], s_l[GM], s_corr[GM];
    __shared__ float4 s_red[DA_WARPS][GM * NV * 32];
    /* Before pdl_wait only what the host uploaded before the step (pos, slot, the block
     * tables) and pool rows that earlier steps wrote are read: this step's KV write (the
     * kernel before) adds rows at the positions of its tokens, so with early > 1 (the launch
     * holds the whole step) the rows of the first tile below the lowest position the
     * sequence has in this batch are loaded before the wait. */
    int kvh = blockIdx.x, t = blockIdx.y, split = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int d = a.head_dim, G = a.n_heads / a.n_kv_heads, slot = a.slot[t];
    int p_end = a.pos[t], p_start = 0;
    if (a.window > 0 && p_end - a.window + 1 > 0) p_start = p_end - a.window + 1;
    int len = p_end - p_start + 1, chunk = max((len + S - 1) / S, 1);
    int c0 = p_start + split * chunk, c1 = min(c0 + chunk, p_end + 1);
    if (S > 1 && c0 >= c1) return; /* past the sequence: attention_combine reads only the splits before */
    const bool pre = HOLD && early > 1;
    int p_pre = c0; /* positions [c0, p_pre) of the first tile are loaded before the wait */
    if (pre) {
        p_pre = p_end;
        for (int u = 0; u < a.T; u++)
            if (a.slot[u] == slot) p_pre = min(p_pre, a.pos[u]);
        p_pre = max(c0, min(p_pre, c1));
    }
    const int32_t *table = kv.tables + (size_t)slot * kv.max_blocks_per_slot;
    /* Warp w takes tile rows w + DA_WARPS * r, r < DA_ROWS, in RG-row groups whose loads
     * are all issued before any is used. HOLD (head_dim <= 128): one group, keys and values
     * together, the values kept in registers across the softmax; else groups of DA_UNROLL
     * keys, and the values loaded again after the softmax (the registers of 256 dims). The
     * rows are used in the same order either way, so both give the same bits. */
    constexpr int RG = HOLD ? DA_ROWS : DA_UNROLL;
    float4 kr[RG][NV], vr[RG][NV];
    bool ok[RG];
    auto reset = [&]() {
#pragma unroll
        for (int u = 0; u < RG; u++) {
            ok[u] = false;
#pragma unroll
            for (int v = 0; v < NV; v++) kr[u][v] = vr[u][v] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    /* rows of group g0 at positions [lo, hi): keys and / or values */
    auto load = [&](int t0, int g0, int lo, int hi, bool keys, bool values) {
#pragma unroll
        for (int u = 0; u < RG; u++) {
            int p = t0 + warp + DA_WARPS * (g0 + u);
            if (p < lo || p >= hi) continue;
            int b = table[p / KV_BLOCK_SIZE];
            ok[u] = b >= 0 && b < kv.n_blocks;
            if (!ok[u]) continue;
            size_t row = cuda_kv_row(kv, a.layer, b, kvh, p);
#pragma unroll
            for (int v = 0; v < NV; v++) {
                int di = 4 * lane + 128 * v;
                if (di >= d) continue;
                if (keys) kr[u][v] = cuda_kv_k4<KVQ>(kv, row, d, di);
                if (values) vr[u][v] = cuda_kv_v4<KVQ>(kv, row, d, di);
            }
        }
    };
    reset();
    if (pre) load(c0, 0, c0, p_pre, true, true);
    pdl_wait(); /* q and the new KV rows come from the kernels before */
    pdl_trigger();
    float4 q[GM][NV], acc[GM][NV];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int v = 0; v < NV; v++) {
            int di = 4 * lane + 128 * v;
            const float *qh = a.q + ((size_t)t * a.n_heads + (size_t)kvh * G + g) * d;
            q[g][v] = g < G && di < d ? *(const float4 *)(qh + di) : make_float4(0.f, 0.f, 0.f, 0.f);
            acc[g][v] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    if (threadIdx.x < GM) {
        s_m[threadIdx.x] = -INFINITY;
        s_l[threadIdx.x] = 0.0f;
    }
    for (int t0 = c0; t0 < c1; t0 += DA_TILE) {
        /* scores */
        for (int g0 = 0; g0 < DA_ROWS; g0 += RG) {
            if (!pre || t0 != c0) reset();
            load(t0, g0, t0 == c0 ? p_pre : t0, c1, true, HOLD);
#pragma unroll
            for (int u = 0; u < RG; u++) {
                int j = warp + DA_WARPS * (g0 + u);
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    float sc = 0.0f;
#pragma unroll
                    for (int v = 0; v < NV; v++)
                        sc += q[g][v].x * kr[u][v].x + q[g][v].y * kr[u][v].y + q[g][v].z * kr[u][v].z +
                              q[g][v].w * kr[u][v].w;
                    sc = warp_sum(sc) * a.scale;
                    if (lane == 0) s_p[g][j] = ok[u] ? sc : -INFINITY;
                }
            }
        }
        __syncthreads();
        /* online softmax: warp g owns head g's running max and sum */
        if (warp < G && warp < GM) {
            int g = warp;
            float x0 = s_p[g][lane], x1 = s_p[g][lane + 32];
            float m_old = s_m[g], m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
            float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
            float p0 = m_new == -INFINITY ? 0.0f : expf(x0 - m_new), p1 = m_new == -INFINITY ? 0.0f : expf(x1 - m_new);
            s_p[g][lane] = p0;
            s_p[g][lane + 32] = p1;
            float sum = warp_sum(p0 + p1);
            __syncwarp();
            if (lane == 0) {
                s_l[g] = s_l[g] * corr + sum;
                s_m[g] = m_new;
                s_corr[g] = corr;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float c = g < G ? s_corr[g] : 1.0f;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                acc[g][v].x *= c;
                acc[g][v].y *= c;
                acc[g][v].z *= c;
                acc[g][v].w *= c;
            }
        }
        /* values */
        for (int g0 = 0; g0 < DA_ROWS; g0 += RG) {
            if (!HOLD) {
                reset();
                load(t0, g0, t0, c1, false, true);
            }
#pragma unroll
            for (int u = 0; u < RG; u++) {
                int j = warp + DA_WARPS * (g0 + u);
                if (!ok[u]) continue;
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    float w = s_p[g][j];
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        acc[g][v].x += w * vr[u][v].x;
                        acc[g][v].y += w * vr[u][v].y;
                        acc[g][v].z += w * vr[u][v].z;
                        acc[g][v].w += w * vr[u][v].w;
                    }
                }
            }
        }
        __syncthreads(); /* s_p is rewritten by the next tile */
    }
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int v = 0; v < NV; v++) s_red[warp][(g * NV + v) * 32 + lane] = acc[g][v];
    __syncthreads();
    /* thread i sums float4 i of every warp in a fixed order: (g, v, lane) */
    for (int i = threadIdx.x; i < GM * NV * 32; i += blockDim.x) {
        int g = i / (NV * 32), v = (i / 32) % NV, ln = i % 32, di = 4 * ln + 128 * v;
        if (g >= G || di >= d) continue;
        float4 o = s_red[0][i];
        for (int w = 1; w < DA_WARPS; w++) {
            float4 r = s_red[w][i];
            o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
        }
        int h = kvh * G + g;
        float l = s_l[g];
        if (S == 1) {
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
            *(float4 *)(a.out + ((size_t)t * a.n_heads + h) * d + di) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        } else {
            float *part = a.split_scratch + (((size_t)t * a.n_heads + h) * S + split) * (size_t)(d + 4);
            if (di == 0) {
                part[0] = s_m[g];
                part[1] = l;
            }
            *(float4 *)(part + 4 + di) = o;
        }
    }
}

/* Merges the split results of each (head, token): out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s,
 * over the splits that hold positions of the sequence (the same chunking as attention_decode).
 * Warp 0 reads every split's (m, l) at once (lane s: split s) and leaves the weights
 * e^(m_s - M) / L in shared memory; then each output element's loads over the splits are
 * independent of each other (no chain of dependent reads). Each thread issues the loads of
 * its first element's partials together with warp 0's (m, l) loads, before the barrier:
 * one round trip to L2 instead of two. Fixed order throughout. */
__global__ void attention_combine_kernel(cuda_attention_args a, int S_all) {
    pdl_trigger(); /* the o projection's GEMV may start prefetching its weights */
    pdl_wait();    /* the split partials come from attention_decode */
    __shared__ float s_w[DA_SPLITS_MAX];
    int h = blockIdx.x, t = blockIdx.y, d = a.head_dim;
    const float *part = a.split_scratch + ((size_t)t * a.n_heads + h) * S_all * (size_t)(d + 4);
    int p_end = a.pos[t], p_start = 0;
    if (a.window > 0 && p_end - a.window + 1 > 0) p_start = p_end - a.window + 1;
    int len = p_end - p_start + 1, chunk = max((len + S_all - 1) / S_all, 1);
    int S = min(S_all, (len + chunk - 1) / chunk);
    float pv[DA_SPLITS_MAX];
    if ((int)threadIdx.x < d) {
#pragma unroll
        for (int s = 0; s < DA_SPLITS_MAX; s++) pv[s] = s < S ? part[(size_t)s * (d + 4) + 4 + threadIdx.x] : 0.0f;
    }
    if (threadIdx.x < 32) {
        int s = threadIdx.x;
        float m = -INFINITY, l = 0.0f;
        if (s < S) {
            m = part[(size_t)s * (d + 4)];
            l = part[(size_t)s * (d + 4) + 1];
        }
        bool live = s < S && l > 0.0f;
        float M = warp_max(live ? m : -INFINITY);
        float e = live ? expf(m - M) : 0.0f;
        float L = warp_sum(e * l);
        if (s < S) s_w[s] = L > 0.0f ? e / L : 0.0f;
    }
    __syncthreads();
    for (int di = threadIdx.x; di < d; di += blockDim.x) {
        float o = 0.0f;
        if (di == (int)threadIdx.x) {
#pragma unroll
            for (int s = 0; s < DA_SPLITS_MAX; s++)
                if (s < S) o += s_w[s] * pv[s];
        } else {
#pragma unroll 8
            for (int s = 0; s < S; s++) o += s_w[s] * part[(size_t)s * (d + 4) + 4 + di];
        }
        size_t i = ((size_t)t * a.n_heads + h) * d + di;
        a.out[i] = o;
        /* d % 32 == 0 (cuda_attention_writes_q8) and blockDim.x % 32 == 0: whole warps, one
         * quant block of the row per warp and step */
        if (a.out_xq) quant_block32(o, a.out_xq + (i - threadIdx.x % 32), (float2 *)a.out_xs + i / 32, threadIdx.x % 32);
    }
}

/* The split count for a pool: about one split per DA_TILE positions of the longest
 * sequence the pool holds, at most DA_SPLITS_MAX and what the scratch holds. */
static int decode_splits(const cuda_attention_args *a) {
    int maxpos = a->kv->max_blocks_per_slot * KV_BLOCK_SIZE;
    if (a->window > 0 && a->window < maxpos) maxpos = a->window;
    int S = (maxpos + DA_TILE - 1) / DA_TILE;
    if (S > DA_SPLITS_MAX) S = DA_SPLITS_MAX;
    if (S < 1) S = 1;
    size_t per = (size_t)a->T * a->n_heads * (size_t)(a->head_dim + 4);
    if (!a->split_scratch || per == 0) return 1;
    while (S > 1 && per * (size_t)S > a->split_scratch_floats) S--;
    return S;
}

static bool decode_kernel_fits(const cuda_attention_args *a) {
    int G = a->n_heads / a->n_kv_heads;
    /* the (8 heads, 256 dims) variant would need 64 KB for its cross-warp reduction */
    return a->head_dim % 4 == 0 && a->head_dim <= 256 && (G <= 4 || (G <= 8 && a->head_dim <= 128));
}

int cuda_attention_writes_q8(const cuda_attention_args *a) {
    return a && a->out_xq && a->out_xs && a->T > 0 && a->T <= 8 && a->head_dim % 32 == 0 &&
           ((uintptr_t)a->out_xs % 8) == 0 && decode_kernel_fits(a) && decode_splits(a) > 1;
}

/* How early the GQA decode kernel loads (head_dim <= 128, one value group): 1 the values
 * with the keys and the merge's partials with its weights; 2 also the first tile's rows
 * that earlier steps wrote, before pdl_wait (only when the launch holds the whole step).
 * Each level is faster than the one before (bench/results/kernel_choices.md, "CUDA early
 * loads"). (HOLD && GM <= 4: 128
 * registers, 8 bytes spilled, two blocks per SM for batched steps; the 8-head variant
 * would spill ~700 bytes.) A split takes at least one position: short sequences spread
 * over all S splits. */
/* whole_step: a holds every token of the step (not a slice of it), so a sequence's lowest
 * position in a is its lowest in the step and the rows below it are from earlier steps. */
static hearth_status launch_decode_attention(const cuda_attention_args *a, int whole_step, hearth_error *err) {
    int S = decode_splits(a), G = a->n_heads / a->n_kv_heads, nv = a->head_dim > 128 ? 2 : 1;
    int early = whole_step && a->T <= 8 ? 2 : 1; /* at 2 the kernel scans a's tokens before the wait */
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)a->T, (unsigned)S);
    unsigned threads = DA_WARPS * 32;
    CUDA_KV_DISPATCH(a->kv->quant, KVQ, {
        if (G <= 4 && nv == 1)
            pdl_launch_small(attention_decode_kernel<4, 1, KVQ, true>, grid, dim3(threads), *a, *a->kv, S, early);
        else if (G <= 4)
            pdl_launch_small(attention_decode_kernel<4, 2, KVQ, false>, grid, dim3(threads), *a, *a->kv, S, 0);
        else
            pdl_launch_small(attention_decode_kernel<8, 1, KVQ, true>, grid, dim3(threads), *a, *a->kv, S, early);
    });
    if (cuda_launched("attention_decode", err)) return HEARTH_ERR_IO;
    if (S == 1) return HEARTH_OK;
    pdl_launch_small(attention_combine_kernel, dim3((unsigned)a->n_heads, (unsigned)a->T), dim3(128), *a, S);
    return cuda_launched("attention_combine", err);
}

/* Prefill: one block per (query head, tile of PF_TOKENS consecutive batch tokens of one
 * sequence), one warp per token. The block walks the union of its tokens' position ranges
 * in chunks of 32: the chunk's keys and values are loaded once into shared memory (each
 * read from the pool once per tile instead of once per token), then each warp scores the
 * 32 positions with one position per lane, updates its online softmax once per chunk and
 * accumulates values with the head dims spread over the lanes. */
#define PF_TOKENS 8
#define PF_CHUNK 32


static size_t prefill_smem(int d) { /* K rows padded by one float: lanes read 32 rows at one column */
    return ((size_t)PF_CHUNK * (d + 1) + (size_t)PF_CHUNK * d + (size_t)PF_TOKENS * d) * sizeof(float) +
           PF_CHUNK * sizeof(int);
}

template <int KVQ>
__global__ void __launch_bounds__(PF_TOKENS * 32) attention_prefill_kernel(cuda_attention_args a, cuda_kv kv) {
    extern __shared__ float smem[];
    int d = a.head_dim, h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sK = smem, *sV = sK + PF_CHUNK * (d + 1), *sQ = sV + PF_CHUNK * d;
    int *sOk = (int *)(sQ + PF_TOKENS * d);
    int t0 = blockIdx.y * PF_TOKENS, t = t0 + warp, slot = a.slot[0];
    int kvh = h / (a.n_heads / a.n_kv_heads);
    int tlast = min(t0 + PF_TOKENS, a.T) - 1;
    bool active = t < a.T;
    int p_end = active ? a.pos[t] : -1, p_start = 0;
    if (active && a.window > 0 && p_end - a.window + 1 > 0) p_start = p_end - a.window + 1;
    /* the tile's position range: every token's range lies inside it */
    int lo = INT_MAX, hi = -1;
    for (int u = t0; u <= tlast; u++) {
        int pe = a.pos[u], ps = a.window > 0 && pe - a.window + 1 > 0 ? pe - a.window + 1 : 0;
        lo = min(lo, ps);
        hi = max(hi, pe);
    }
    if (active)
        for (int i = lane; i < d; i += 32) sQ[warp * d + i] = a.q[((size_t)t * a.n_heads + h) * d + i];
    float acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int c = lo; c <= hi; c += PF_CHUNK) {
        __syncthreads(); /* the previous chunk is consumed (and sQ written, the first time) */
        if (threadIdx.x < PF_CHUNK) {
            int p = c + threadIdx.x;
            sOk[threadIdx.x] = p <= hi && cuda_kv_block(kv, slot, p) >= 0;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < PF_CHUNK * d; idx += blockDim.x) {
            int j = idx / d, i = idx % d, p = c + j;
            float kx = 0.0f, vx = 0.0f;
            if (sOk[j]) {
                size_t row = cuda_kv_row(kv, a.layer, cuda_kv_block(kv, slot, p), kvh, p);
                kx = cuda_kv_k<KVQ>(kv, row, d, i);
                vx = cuda_kv_v<KVQ>(kv, row, d, i);
            }
            sK[j * (d + 1) + i] = kx;
            sV[j * d + i] = vx;
        }
        __syncthreads();
        if (!active || c > p_end || c + PF_CHUNK - 1 < p_start) continue;
        int p = c + lane;
        bool ok = p >= p_start && p <= p_end && sOk[lane];
        float s = -INFINITY;
        if (ok) {
            float dot = 0.0f;
            const float *kr = sK + lane * (d + 1), *qr = sQ + warp * d;
            for (int i = 0; i < d; i++) dot += qr[i] * kr[i];
            s = dot * a.scale;
        }
        float m_new = fmaxf(m, warp_max(s));
        if (m_new == -INFINITY) continue; /* nothing valid yet */
        float corr = expf(m - m_new), w = ok ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(w);
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) acc[i] *= corr;
        for (int j = 0; j < PF_CHUNK; j++) {
            float wj = __shfl_sync(0xffffffffu, w, j);
            if (wj == 0.0f) continue;
#pragma unroll
            for (int i = 0; i < ATT_PER_LANE; i++) {
                int di = lane + 32 * i;
                if (di < d) acc[i] += wj * sV[j * d + di];
            }
        }
        m = m_new;
    }
    if (!active) return;
    float *out = a.out + ((size_t)t * a.n_heads + h) * d;
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        int di = lane + 32 * i;
        if (di < d) out[di] = l > 0.0f ? acc[i] / l : 0.0f;
    }
}

template <int KVQ> static hearth_status launch_prefill(const cuda_attention_args *a, hearth_error *err) {
    static int smem_raised; /* > 48 KB of dynamic shared memory needs an opt-in, once per kernel */
    size_t smem = prefill_smem(a->head_dim);
    if (!smem_raised) {
        if (cuda_status(cudaFuncSetAttribute(attention_prefill_kernel<KVQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)prefill_smem(ATT_DMAX)),
                        "cudaFuncSetAttribute(attention_prefill)", err))
            return HEARTH_ERR_IO;
        smem_raised = 1;
    }
    dim3 pgrid((unsigned)a->n_heads, (unsigned)((a->T + PF_TOKENS - 1) / PF_TOKENS));
    attention_prefill_kernel<KVQ><<<pgrid, PF_TOKENS * 32, smem, cuda_stream()>>>(*a, *a->kv);
    return cuda_launched("attention_prefill", err);
}

/* Heads wider than ATT_DMAX (varied models' full layers: 512): the simple kernel above at that
 * width, 8 warps per (query head, token), for any T and any mix of sequences (each token
 * reads its own positions). Decode steps (T <= 8) split the positions as attention_decode
 * does (decode_splits: fixed per launch shape, so graphs stay valid) and attention_combine
 * merges them: one block per query head alone left the GPU nearly idle (bench/results/
 * cuda_newfam.md). Batch-invariant mode keeps one split: the split count follows the step's T. */
static hearth_status attention_wide(const cuda_attention_args *a, hearth_error *err) {
    int S = a->T <= 8 && !a->batch_invariant ? decode_splits(a) : 1;
    dim3 grid((unsigned)a->n_heads, (unsigned)a->T, (unsigned)S);
    if (S == 1) {
        CUDA_KV_DISPATCH(a->kv->quant, KVQ,
                         (attention_kernel<8, KVQ, CUDA_ATT_WIDE_DMAX><<<grid, 8 * 32, 0, cuda_stream()>>>(*a, *a->kv)));
        return cuda_launched("attention_wide", err);
    }
    CUDA_KV_DISPATCH(a->kv->quant, KVQ,
                     (attention_kernel<8, KVQ, CUDA_ATT_WIDE_DMAX, true><<<grid, 8 * 32, 0, cuda_stream()>>>(*a, *a->kv)));
    if (cuda_launched("attention_wide", err)) return HEARTH_ERR_IO;
    pdl_launch_small(attention_combine_kernel, dim3((unsigned)a->n_heads, (unsigned)a->T), dim3(128), *a, S);
    return cuda_launched("attention_combine", err);
}

/* T <= 8 tokens: the GQA-shared split-K kernel where it fits, else one block per (head, token). */
static hearth_status launch_small(const cuda_attention_args *a, int whole_step, hearth_error *err) {
    if (a->head_dim > ATT_DMAX) return attention_wide(a, err);
    if (decode_kernel_fits(a)) return launch_decode_attention(a, whole_step, err);
    dim3 grid((unsigned)a->n_heads, (unsigned)a->T);
    CUDA_KV_DISPATCH(a->kv->quant, KVQ,
                     attention_kernel<ATT_WARPS_DECODE, KVQ><<<grid, ATT_WARPS_DECODE * 32, 0, cuda_stream()>>>(
                         *a, *a->kv));
    return cuda_launched("attention", err);
}

/* Tokens [t0, t0 + n) of a as a launch of their own (q, out, pos, slot offset). */
static cuda_attention_args sub_range(const cuda_attention_args *a, int t0, int n, int single_slot) {
    cuda_attention_args c = *a;
    size_t qoff = (size_t)t0 * a->n_heads * a->head_dim;
    c.T = n;
    c.q = a->q + qoff, c.out = a->out + qoff, c.pos = a->pos + t0, c.slot = a->slot + t0;
    c.host_slot = a->host_slot ? a->host_slot + t0 : NULL;
    c.single_slot = single_slot;
    return c;
}

/* A ragged step (cuda_attention_args.host_slot): runs of more than 8 tokens of one slot go
 * to the prefill kernels (tensor-core where it fits), the stretches between them (decode
 * rows of many sequences, short chunks) to launch_small, whatever their length: the
 * decode kernel handles any T, its split count shrinking to what the split scratch holds
 * (at T > 8 the (KV head, token) blocks alone fill the GPU). Every token's result comes
 * from its own position range, so the split changes no token's inputs. */
static hearth_status attention_ragged(const cuda_attention_args *a, hearth_error *err) {
    int small0 = 0; /* start of the pending stretch for launch_small */
    for (int t = 0; t < a->T;) {
        int e = t + 1;
        while (e < a->T && a->host_slot[e] == a->host_slot[t]) e++;
        if (e - t > 8) {
            if (t > small0) {
                cuda_attention_args c = sub_range(a, small0, t - small0, 0);
                if (launch_small(&c, 0, err)) return HEARTH_ERR_IO;
            }
            cuda_attention_args c = sub_range(a, t, e - t, 1);
            c.host_slot = NULL;
            if (cuda_attention(&c, err)) return HEARTH_ERR_IO;
            small0 = e;
        }
        t = e;
    }
    if (a->T > small0) {
        cuda_attention_args c = sub_range(a, small0, a->T - small0, 0);
        if (launch_small(&c, 0, err)) return HEARTH_ERR_IO;
    }
    return HEARTH_OK;
}

hearth_status cuda_attention(const cuda_attention_args *args, hearth_error *err) {
    if (!args || !args->kv || args->T <= 0) return HEARTH_OK;
    cuda_attention_args local = *args; /* the int8 copy only where the caller is told it is made */
    if (!cuda_attention_writes_q8(args)) local.out_xq = NULL, local.out_xs = NULL;
    const cuda_attention_args *a = &local;
    if (a->head_dim <= 0 || a->head_dim > CUDA_ATT_WIDE_DMAX || a->head_dim != a->kv->head_dim)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_attention: head_dim %d (max %d, pool %d)", a->head_dim,
                       CUDA_ATT_WIDE_DMAX, a->kv->head_dim);
    if (a->n_kv_heads != a->kv->n_kv_heads || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        a->layer < 0 || a->layer >= a->kv->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_attention: heads %d/%d or layer %d do not fit the pool",
                       a->n_heads, a->n_kv_heads, a->layer);
    if (a->head_dim > ATT_DMAX) { /* wider heads: prefill runs on the tensor cores, else the simple kernel */
        if (!a->batch_invariant && a->T > 8) {
            if (!a->single_slot && a->host_slot) return attention_ragged(a, err);
            if (cuda_attention_prefill_tc_fits(a)) return cuda_attention_prefill_tc(a, err);
        }
        return attention_wide(a, err);
    }
    if (a->batch_invariant) { /* the decode kernels only, at most 8 tokens per launch */
        for (int t0 = 0; t0 < a->T; t0 += 8) {
            cuda_attention_args c = *a;
            size_t qoff = (size_t)t0 * a->n_heads * a->head_dim;
            c.T = a->T - t0 < 8 ? a->T - t0 : 8;
            c.q = a->q + qoff, c.out = a->out + qoff, c.pos = a->pos + t0, c.slot = a->slot + t0;
            if (launch_small(&c, a->T <= 8, err)) return HEARTH_ERR_IO;
        }
        return HEARTH_OK;
    }
    if (!a->single_slot && a->T > 8 && a->host_slot) return attention_ragged(a, err);
    if (a->T > 8 && cuda_attention_prefill_tc_fits(a)) return cuda_attention_prefill_tc(a, err);
    if (a->single_slot && a->T > 8) {
        hearth_status st = HEARTH_OK;
        CUDA_KV_DISPATCH(a->kv->quant, KVQ, st = launch_prefill<KVQ>(a, err));
        return st;
    }
    if (a->T <= 8) return launch_small(a, 1, err);
    dim3 grid((unsigned)a->n_heads, (unsigned)a->T);
    CUDA_KV_DISPATCH(a->kv->quant, KVQ,
                     attention_kernel<ATT_WARPS_PREFILL, KVQ><<<grid, ATT_WARPS_PREFILL * 32, 0, cuda_stream()>>>(
                         *a, *a->kv));
    return cuda_launched("attention", err);
}
