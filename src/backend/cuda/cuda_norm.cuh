/* cuda_norm.cuh: the row reduction that every GPU rmsnorm kernel shares (cuda_ops.cu's
 * rmsnorm, cuda_fused.cu's residual), so that fused and unfused norms
 * of the same row round alike, bit for bit: one block of NORM_THREADS per row, thread t
 * sums the squares of elements t, t + NORM_THREADS, ... in that order, then a warp
 * xor-tree, then the warp sums in order. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_NORM_CUH
#define HEARTH_BACKEND_CUDA_NORM_CUH
#include "backend/cuda/cuda_pdl.cuh"

/* A row of a few thousand floats is a handful of independent loads per thread (256 threads
 * left 16 per thread for a 4096 row, and the fused residual + norm was 12% of a decode step). */
#define NORM_THREADS 1024
/* Rows up to NORM_REG * NORM_THREADS (8192) keep their values in registers: every load of x,
 * delta and w is issued before the first is used (the strided loop waited on one load per
 * step: 8 memory latencies per 4096-row norm, 7.8 us under ncu against 5.9 now). */
#define NORM_REG 8

static __device__ __forceinline__ float norm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 1 / rms of a row from each thread's partial sum of squares. */
static __device__ __forceinline__ float block_inv_rms(float ss, int n, float eps) {
    __shared__ float part[32];
    ss = norm_warp_sum(ss);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < (int)blockDim.x / 32; i++) tot += part[i];
    return 1.0f / sqrtf(tot / (float)n + eps);
}

/* One warp normalizes one short row in place or into out (n <= 256, the per-head q / k
 * norms): lane l sums elements l, l + 32, ... in order, then the xor-tree; out[i] = x[i] *
 * inv_rms * (w[i] + shift). cuda_ops.cu's rmsnorm_heads and cuda_kv.cu's fused RoPE + KV
 * write share it, so both give the same bits. wv: w's elements of this lane, loaded by the
 * caller (they may load before pdl_wait). */
static __device__ __forceinline__ void warp_row_norm(float *out, const float *x, const float (&wv)[8], float shift,
                                                     int n, float eps, int lane) {
    float v[8], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = lane + 32 * j;
        v[j] = i < n ? x[i] : 0.0f;
        if (i < n) ss += v[j] * v[j];
    }
    float inv = 1.0f / sqrtf(norm_warp_sum(ss) / (float)n + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = lane + 32 * j;
        if (i < n) out[i] = v[j] * inv * (wv[j] + shift);
    }
}

/* The lane's weights for warp_row_norm. */
static __device__ __forceinline__ void warp_row_weights(float (&wv)[8], const float *w, int n, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) wv[j] = lane + 32 * j < n ? w[lane + 32 * j] : 0.0f;
}

/* The whole block normalizes one row in place without a weight (the values' norm of op_attn.v_norm,
 * ops_rmsnorm with no weight): thread t sums elements t, t + blockDim.x, ...; x[i] *= inv_rms.
 * cuda_varied.cu's rmsnorm_plain and cuda_kv.cu's fused kernel share it (blocks of 128). */
static __device__ __forceinline__ void block_row_norm_plain(float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    float inv = block_inv_rms(ss, n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * inv;
}

/* The register form (n <= NORM_REG * NORM_THREADS): wv[j] = w[i], then pdl_wait(), then
 * v[j] = x[i], for i = threadIdx.x + j * NORM_THREADS < n (0 past n); returns 1 / rms of
 * the row. The weights, which no kernel writes, load while the kernel before drains. */
static __device__ __forceinline__ float norm_row_load(float (&v)[NORM_REG], float (&wv)[NORM_REG], const float *x,
                                                      const float *w, int n, float eps) {
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        int i = threadIdx.x + j * NORM_THREADS;
        wv[j] = i < n ? w[i] : 0.0f;
    }
    pdl_wait();
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        int i = threadIdx.x + j * NORM_THREADS;
        v[j] = i < n ? x[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        int i = threadIdx.x + j * NORM_THREADS;
        if (i < n) ss += v[j] * v[j];
    }
    return block_inv_rms(ss, n, eps);
}

/* The loop form for longer rows: the same sums; returns 1 / rms. */
static __device__ __forceinline__ float norm_row_loop(const float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = x[i];
        ss += v * v;
    }
    return block_inv_rms(ss, n, eps);
}

/* The whole row: store(i, y) receives out[i] = x[i] * inv_rms * (w[i] + shift) for each of
 * this thread's elements, in order. A warp's 32 lanes take 32 consecutive elements at each
 * step. Calls pdl_wait() before its first read of x (a caller launched as a programmatic
 * dependent reads nothing an earlier kernel wrote before this). */
template <class Store>
static __device__ __forceinline__ void norm_row(const float *x, const float *w, float shift, int n, float eps,
                                                Store store) {
    if (n <= NORM_REG * NORM_THREADS) {
        float v[NORM_REG], wv[NORM_REG];
        float inv = norm_row_load(v, wv, x, w, n, eps);
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < n) store(i, v[j] * inv * (wv[j] + shift));
        }
        return;
    }
    pdl_wait();
    float inv = norm_row_loop(x, n, eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) store(i, x[i] * inv * (w[i] + shift));
}

/* op_residual on one row (cuda_fused.cu's residual kernel): d = delta, normed by dw when DNORM
 * (d * inv_rms(delta) * (dw + shift)), times dscale; x = (x + d) * xscale, written back; then,
 * when w is given, store(i, x[i] * inv_rms(x) * (w[i] + shift)), else, when store_x, store(i,
 * x[i]) (the new x itself). Every step rounds to float as norm_row and the add / scale kernels
 * do, so the result equals those kernels run one after another, bit for bit (__fmul_rn /
 * __fadd_rn keep nvcc from contracting a product and the add that follows it into one FMA).
 * delta NULL: x only scaled. The weights load before pdl_wait(), x and delta after. */
template <bool DNORM, class Store>
static __device__ __forceinline__ void residual_row(float *x, const float *delta, const float *dw, float dscale,
                                                    float xscale, const float *w, float shift, int n, float eps,
                                                    bool store_x, Store store) {
    int wb = delta || xscale != 1.0f; /* x changes (a plain norm leaves it) */
    if (n <= NORM_REG * NORM_THREADS) {
        float v[NORM_REG], d[NORM_REG], dwv[NORM_REG], wv[NORM_REG];
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            dwv[j] = i < n && DNORM ? dw[i] : 0.0f;
            wv[j] = i < n && w ? w[i] : 0.0f;
        }
        pdl_wait();
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) { /* every load issued before the first is used */
            int i = threadIdx.x + j * NORM_THREADS;
            v[j] = i < n ? x[i] : 0.0f;
            d[j] = i < n && delta ? delta[i] : 0.0f;
        }
        float dinv = 1.0f;
        if (DNORM && delta) {
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < NORM_REG; j++)
                if (threadIdx.x + j * NORM_THREADS < n) ss += d[j] * d[j];
            dinv = block_inv_rms(ss, n, eps);
            __syncthreads(); /* block_inv_rms's partial sums are reused below */
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i >= n) continue;
            if (delta) {
                float dj = DNORM ? __fmul_rn(d[j] * dinv, dwv[j] + shift) : d[j];
                v[j] = __fadd_rn(v[j], __fmul_rn(dj, dscale));
            }
            v[j] = __fmul_rn(v[j], xscale);
            if (wb) x[i] = v[j];
            ss += v[j] * v[j];
        }
        if (!w) {
            if (store_x)
#pragma unroll
                for (int j = 0; j < NORM_REG; j++)
                    if (threadIdx.x + j * NORM_THREADS < n) store(threadIdx.x + j * NORM_THREADS, v[j]);
            return;
        }
        float inv = block_inv_rms(ss, n, eps);
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < n) store(i, v[j] * inv * (wv[j] + shift));
        }
        return;
    }
    pdl_wait();
    float dinv = 1.0f;
    if (DNORM && delta) {
        dinv = norm_row_loop(delta, n, eps);
        __syncthreads();
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = x[i];
        if (delta) {
            float dj = DNORM ? __fmul_rn(delta[i] * dinv, dw[i] + shift) : delta[i];
            v = __fadd_rn(v, __fmul_rn(dj, dscale));
        }
        v = __fmul_rn(v, xscale);
        if (wb) x[i] = v;
        ss += v * v;
        if (!w && store_x) store(i, v);
    }
    if (!w) return;
    float inv = block_inv_rms(ss, n, eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) store(i, x[i] * inv * (w[i] + shift));
}
#endif
