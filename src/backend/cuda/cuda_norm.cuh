/* cuda_norm.cuh: the row reduction that every GPU rmsnorm kernel shares (cuda_ops.cu's
 * rmsnorm / add_rmsnorm, cuda_fused.cu's add_rmsnorm_q8), so that fused and unfused norms
 * of the same row round alike, bit for bit: one block of NORM_THREADS per row, thread t
 * sums the squares of elements t, t + NORM_THREADS, ... in that order, then a warp
 * xor-tree, then the warp sums in order. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_NORM_CUH
#define HEARTH_BACKEND_CUDA_NORM_CUH

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

/* The register form (n <= NORM_REG * NORM_THREADS): v[j] = x[i] (+ delta[i], written back to
 * x when delta is given) and wv[j] = w[i] for i = threadIdx.x + j * NORM_THREADS < n (0
 * past n); returns 1 / rms of the row. */
static __device__ __forceinline__ float norm_row_load(float (&v)[NORM_REG], float (&wv)[NORM_REG], float *x,
                                                      const float *delta, const float *w, int n, float eps) {
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        int i = threadIdx.x + j * NORM_THREADS;
        v[j] = i < n ? (delta ? x[i] + delta[i] : x[i]) : 0.0f;
        wv[j] = i < n ? w[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        int i = threadIdx.x + j * NORM_THREADS;
        if (i < n) {
            if (delta) x[i] = v[j];
            ss += v[j] * v[j];
        }
    }
    return block_inv_rms(ss, n, eps);
}

/* The loop form for longer rows: the same sums (x += delta first when delta is given);
 * returns 1 / rms. The caller reads x[i] again for the output. */
static __device__ __forceinline__ float norm_row_loop(float *x, const float *delta, int n, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = delta ? x[i] + delta[i] : x[i];
        if (delta) x[i] = v;
        ss += v * v;
    }
    return block_inv_rms(ss, n, eps);
}

/* The whole row: store(i, y) receives out[i] = x'[i] * inv_rms * (w[i] + shift) for each of
 * this thread's elements, in order (x' = x + delta, written back, when delta is given). A
 * warp's 32 lanes take 32 consecutive elements at each step. */
template <class Store>
static __device__ __forceinline__ void norm_row(float *x, const float *delta, const float *w, float shift, int n,
                                                float eps, Store store) {
    if (n <= NORM_REG * NORM_THREADS) {
        float v[NORM_REG], wv[NORM_REG];
        float inv = norm_row_load(v, wv, x, delta, w, n, eps);
#pragma unroll
        for (int j = 0; j < NORM_REG; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < n) store(i, v[j] * inv * (wv[j] + shift));
        }
        return;
    }
    float inv = norm_row_loop(x, delta, n, eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) store(i, x[i] * inv * (w[i] + shift));
}
#endif
