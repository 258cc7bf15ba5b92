/* cuda_moe.cu: the small kernels of the mixture-of-experts op (cuda_model.c cu_moe): the
 * host-routed form's zeroing and per-expert scatter-add, the device-routed form's routing
 * (op_moe_route's rule to the bit) and combine, and the shared expert's sigmoid-gated add.
 * One IEEE rounding for each product and each sum, in the experts' order, as the CPU
 * backend's loop: the same bits on both. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "ops/op_exp.h"

__global__ void zero_kernel(float *x, size_t n) {
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.0f;
}

/* dst[rows[i], :] += src[i, :] * w[i]; the rows of one launch are distinct tokens. */
__global__ void scatter_add_kernel(float *dst, const float *src, const int32_t *rows, const float *w, int width) {
    pdl_wait();
    int i = blockIdx.y, h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < width) {
        float *y = dst + (size_t)rows[i] * width + h;
        *y = __fadd_rn(*y, __fmul_rn(src[(size_t)i * width + h], w[i]));
    }
}

/* y[t, :] += sigmoid(g[t]) * o[t, :] (the shared expert's gated output, as the CPU: the
 * sigmoid as 1 / (1 + exp(-g)), one rounding for the product and one for the sum). */
__global__ void add_sigmoid_scaled_kernel(float *y, const float *o, const float *g, int width) {
    pdl_wait();
    int t = blockIdx.y, h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < width) {
        float s = 1.0f / (1.0f + expf(-g[t]));
        size_t i = (size_t)t * width + h;
        y[i] = __fadd_rn(y[i], __fmul_rn(s, o[i]));
    }
}

extern "C" hearth_status cuda_add_sigmoid_scaled(float *y, const float *o, const float *g, int T, int width,
                                                 hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    pdl_launch_small(add_sigmoid_scaled_kernel, dim3((unsigned)((width + 255) / 256), (unsigned)T), dim3(256), y, o, g,
                     width);
    return cuda_launched("add_sigmoid_scaled", err);
}

extern "C" hearth_status cuda_zero(float *x, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(zero_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), x, n);
    return cuda_launched("zero", err);
}

extern "C" hearth_status cuda_scatter_add_rows(float *dst, const float *src, const int32_t *rows, const float *w,
                                               int n_rows, int width, hearth_error *err) {
    if (n_rows <= 0) return HEARTH_OK;
    pdl_launch_small(scatter_add_kernel, dim3((unsigned)((width + 255) / 256), (unsigned)n_rows), dim3(256), dst, src,
                     rows, w, width);
    return cuda_launched("scatter_add_rows", err);
}

/* ---- routing and combining on the device (decode steps: no host round trip) ---- */

#define ROUTE_THREADS 256
#define ROUTE_MAX_K 16

/* The better of two (logit, expert) candidates by op_moe_route's scan: the larger value, the
 * lower expert on a tie (and on incomparable values), a real expert over none (-1). */
static __device__ __forceinline__ void route_better(float &v, int &i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (!(v > v2) && i2 < i)) v = v2, i = i2;
}

/* One block per token. g and the taken flags in shared memory; the parallel parts are the
 * order-free ones (max, exp, divide, arg-max); every sum runs on one thread in the host's
 * order. */
__global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route_kernel(const float *logits, int E, int K, int topk_softmax, int norm_topk, const float *escale,
                     int32_t *sel_out, float *w_out) {
    extern __shared__ float g[]; /* [E] logits, then [E] taken flags as ints */
    int *taken = (int *)(g + E);
    __shared__ float red_v[ROUTE_THREADS / 32], sum;
    __shared__ int red_i[ROUTE_THREADS / 32], sel[ROUTE_MAX_K];
    int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int e = tid; e < E; e += ROUTE_THREADS) g[e] = logits[(size_t)t * E + e], taken[e] = 0;
    __syncthreads();
    if (!topk_softmax) {
        /* mx: the host's running max is the max (order-free for finite logits) */
        float mx = g[0];
        for (int e = tid; e < E; e += ROUTE_THREADS) mx = g[e] > mx ? g[e] : mx;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, mx, o);
            mx = m2 > mx ? m2 : mx;
        }
        if (lane == 0) red_v[warp] = mx;
        __syncthreads();
        mx = red_v[0];
        for (int i = 1; i < ROUTE_THREADS / 32; i++) mx = red_v[i] > mx ? red_v[i] : mx;
        for (int e = tid; e < E; e += ROUTE_THREADS) g[e] = op_expf(__fsub_rn(g[e], mx));
        __syncthreads();
        if (tid == 0) {
            float s = 0.0f;
            for (int e = 0; e < E; e++) s = __fadd_rn(s, g[e]);
            sum = s;
        }
        __syncthreads();
        for (int e = tid; e < E; e += ROUTE_THREADS) g[e] = __fdiv_rn(g[e], sum);
        __syncthreads();
    }
    for (int k = 0; k < K; k++) {
        float v = 0.0f;
        int i = -1;
        for (int e = tid; e < E; e += ROUTE_THREADS)
            if (!taken[e]) route_better(v, i, g[e], e);
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            int i2 = __shfl_xor_sync(0xffffffffu, i, o);
            route_better(v, i, v2, i2);
        }
        if (lane == 0) red_v[warp] = v, red_i[warp] = i;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < ROUTE_THREADS / 32; w++) route_better(v, i, red_v[w], red_i[w]);
            sel[k] = i;
            taken[i] = 1;
        }
        __syncthreads();
    }
    if (tid) return;
    /* the weights exactly as op_moe_route computes them, in top-K order */
    float w[ROUTE_MAX_K], total = 0.0f;
    for (int k = 0; k < K; k++) total = __fadd_rn(total, w[k] = g[sel[k]]);
    if (topk_softmax) {
        float top = w[0], z = 0.0f;
        for (int k = 0; k < K; k++) z = __fadd_rn(z, w[k] = op_expf(__fsub_rn(w[k], top)));
        for (int k = 0; k < K; k++) w[k] = __fmul_rn(__fdiv_rn(w[k], z), escale[sel[k]]);
    } else if (norm_topk) {
        for (int k = 0; k < K; k++) w[k] = __fdiv_rn(w[k], total);
    }
    /* out in ascending expert order (insertion sort of K <= 16) */
    int32_t *so = sel_out + (size_t)t * K;
    float *wo = w_out + (size_t)t * K;
    for (int k = 0; k < K; k++) {
        int j = k;
        while (j > 0 && so[j - 1] > sel[k]) so[j] = so[j - 1], wo[j] = wo[j - 1], j--;
        so[j] = sel[k], wo[j] = w[k];
    }
}

/* The grouped expert GEMM's tables from the routing (cuda_moe_sort). One block: counts per
 * expert in shared memory, their running sums and the segments on one thread (E + P / tok
 * steps), then each pair placed with a shared atomic. The order of pairs within an expert
 * follows the atomics; cuda_moe_gemm's output row of a pair does not depend on it (each pair
 * is its own column of a tile), so the bits do not either. */
#define SORT_THREADS 1024
__global__ void __launch_bounds__(SORT_THREADS)
    moe_sort_kernel(const int32_t *sel, int P, int K, int E, int tok, int32_t *rows, int32_t *dst, int32_t *segs,
                    int32_t *nseg) {
    extern __shared__ int sort_sh[]; /* [E] counts, then [E] next free place */
    int *cnt = sort_sh, *cur = sort_sh + E, tid = threadIdx.x;
    for (int e = tid; e < E; e += SORT_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < P; i += SORT_THREADS) atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    if (tid == 0) {
        int at = 0, ns = 0;
        for (int e = 0; e < E; e++) {
            cur[e] = at;
            for (int p = 0; p < cnt[e]; p += tok, ns++) {
                segs[3 * ns] = e;
                segs[3 * ns + 1] = at + p;
                segs[3 * ns + 2] = cnt[e] - p < tok ? cnt[e] - p : tok;
            }
            at += cnt[e];
        }
        *nseg = ns;
    }
    __syncthreads();
    for (int i = tid; i < P; i += SORT_THREADS) {
        int c = atomicAdd(&cur[sel[i]], 1);
        rows[c] = i / K;
        dst[c] = i;
    }
}

extern "C" hearth_status cuda_moe_sort(const int32_t *sel, int T, int K, int E, int tok, int32_t *rows, int32_t *dst,
                                       int32_t *segs, int32_t *nseg, hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    if (E < 1 || E > 4096 || K < 1 || tok < 1 || (size_t)T * K > INT32_MAX)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_moe_sort: %d tokens, %d of %d experts", T, K, E);
    moe_sort_kernel<<<1, SORT_THREADS, (size_t)E * 2 * sizeof(int), cuda_stream()>>>(sel, T * K, K, E, tok, rows, dst,
                                                                                     segs, nseg);
    return cuda_launched("moe_sort", err);
}

extern "C" hearth_status cuda_moe_route(const float *logits, int T, int E, int K, int topk_softmax, int norm_topk,
                                        const float *expert_scale, int32_t *sel, float *w, hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    if (E < 1 || E > 4096 || K < 1 || K > ROUTE_MAX_K || K > E || (topk_softmax && !expert_scale))
        return err_set(err, HEARTH_ERR_INVALID, "cuda_moe_route: %d of %d experts", K, E);
    moe_route_kernel<<<T, ROUTE_THREADS, (size_t)E * 2 * sizeof(float), cuda_stream()>>>(
        logits, E, K, topk_softmax, norm_topk, expert_scale, sel, w);
    return cuda_launched("moe_route", err);
}

__global__ void moe_combine_kernel(float *out, const float *o, const float *w, int K, int width) {
    pdl_wait();
    int t = blockIdx.y, h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= width) return;
    float y = 0.0f;
    for (int k = 0; k < K; k++) {
        size_t p = (size_t)t * K + k;
        y = __fadd_rn(y, __fmul_rn(o[p * width + h], w[p]));
    }
    out[(size_t)t * width + h] = y;
}

extern "C" hearth_status cuda_moe_combine(float *out, const float *o, const float *w, int T, int K, int width,
                                          hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    pdl_launch_small(moe_combine_kernel, dim3((unsigned)((width + 255) / 256), (unsigned)T), dim3(256), out, o, w, K,
                     width);
    return cuda_launched("moe_combine", err);
}
