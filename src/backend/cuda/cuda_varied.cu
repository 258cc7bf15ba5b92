/* cuda_varied.cu: the kernels of models whose layers differ in shape (op_dims.varied_layers:
 * per-layer head_dim and KV heads, per-layer inputs, logit softcap) that the other CUDA files
 * lack: the RMSNorm without a scale (values), a float copy, the per-layer input combine and
 * gate, and tanh softcap (attention of heads up to 512 wide is cuda_ops.cu's). Each mirrors
 * its CPU op (backend/cpu) in float32 with the same order of operations per element; simple
 * kernels, stream-ordered launches only (no allocation, no synchronization), so a captured
 * graph could hold them. */
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_norm.cuh"
#include <math.h>

#define ROW_THREADS 128

/* out[r] = x[r] / rms(x[r]) for rows of n (ops_rmsnorm with no weight); one block per row. */
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_plain_kernel(float *x, int n, float eps) {
    float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) ss += xr[i] * xr[i];
    float inv = block_inv_rms(ss, n, eps);
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) xr[i] = xr[i] * inv;
}

extern "C" hearth_status cuda_rmsnorm_plain(float *x, int rows, int n, float eps, hearth_error *err) {
    if (rows <= 0 || n <= 0) return HEARTH_OK;
    rmsnorm_plain_kernel<<<(unsigned)rows, ROW_THREADS, 0, cuda_stream()>>>(x, n, eps);
    return cuda_launched("rmsnorm_plain", err);
}

extern "C" hearth_status cuda_copy_f32(float *dst, const float *src, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    return cuda_status(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()),
                       "cudaMemcpyAsync (device copy)", err);
}

/* in[i] = (proj[i] + in[i]) * s: the per-layer inputs from their two halves. */
__global__ void per_layer_combine_kernel(float *in, const float *proj, float s, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) in[i] = (proj[i] + in[i]) * s;
}

extern "C" hearth_status cuda_per_layer_combine(float *in, const float *proj, float s, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    per_layer_combine_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(in, proj, s, n);
    return cuda_launched("per_layer_combine", err);
}

/* gate[t][i] = gelu_tanh(gate[t][i]) * up[t * up_stride + i] for T rows of n. */
__global__ void gelu_tanh_mul_rows_kernel(float *gate, const float *up, int T, int n, size_t up_stride) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * n) return;
    size_t t = idx / n, i = idx % n;
    gate[idx] = gelu_tanh_mul_value(gate[idx], up[t * up_stride + i]);
}

extern "C" hearth_status cuda_gelu_tanh_mul_rows(float *gate, const float *up, int T, int n, size_t up_stride,
                                                 hearth_error *err) {
    size_t total = (size_t)T * n;
    if (total == 0) return HEARTH_OK;
    gelu_tanh_mul_rows_kernel<<<(unsigned)((total + 255) / 256), 256, 0, cuda_stream()>>>(gate, up, T, n, up_stride);
    return cuda_launched("gelu_tanh_mul_rows", err);
}

/* x[i] = tanh(x[i] / cap) * cap (a division, then the product: the host's order). */
__global__ void softcap_kernel(float *x, float cap, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

extern "C" hearth_status cuda_softcap(float *x, float cap, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    softcap_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(x, cap, n);
    return cuda_launched("softcap", err);
}
