/* cuda_varied.cu: the kernels of models whose layers differ in shape (op_dims.varied_layers:
 * per-layer head_dim and KV heads, per-layer inputs, logit softcap) that the other CUDA files
 * lack: the RMSNorm without a scale (values), a float copy, the per-layer input combine and
 * gate, and tanh softcap (attention of heads up to 512 wide is cuda_ops.cu's). Each mirrors
 * its CPU op (backend/cpu) in float32 with the same order of operations per element; simple
 * kernels, stream-ordered launches only (no allocation, no synchronization), so a captured
 * graph could hold them; each is a programmatic dependent (pdl_launch_small) that waits
 * before its first global access. */
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include <math.h>

#define ROW_THREADS 128

/* out[r] = x[r] / rms(x[r]) for rows of n (ops_rmsnorm with no weight); one block per row. */
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_plain_kernel(float *x, int n, float eps) {
    pdl_trigger();
    pdl_wait();
    block_row_norm_plain(x + (size_t)blockIdx.x * n, n, eps);
}

extern "C" hearth_status cuda_rmsnorm_plain(float *x, int rows, int n, float eps, hearth_error *err) {
    if (rows <= 0 || n <= 0) return HEARTH_OK;
    pdl_launch_small(rmsnorm_plain_kernel, dim3((unsigned)rows), dim3(ROW_THREADS), x, n, eps);
    return cuda_launched("rmsnorm_plain", err);
}

/* A kernel, not a copy node: the launches around it stay programmatic dependents. */
__global__ void copy_f32_kernel(float *dst, const float *src, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

extern "C" hearth_status cuda_copy_f32(float *dst, const float *src, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(copy_f32_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), dst, src, n);
    return cuda_launched("copy_f32", err);
}

/* in[i] = (proj[i] + in[i]) * s: the per-layer inputs from their two halves. */
__global__ void per_layer_combine_kernel(float *in, const float *proj, float s, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) in[i] = (proj[i] + in[i]) * s;
}

extern "C" hearth_status cuda_per_layer_combine(float *in, const float *proj, float s, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(per_layer_combine_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), in, proj, s, n);
    return cuda_launched("per_layer_combine", err);
}

/* gate[t][i] = gelu_tanh(gate[t][i]) * up[t * up_stride + i] for T rows of n. */
__global__ void gelu_tanh_mul_rows_kernel(float *gate, const float *up, int T, int n, size_t up_stride) {
    pdl_trigger();
    pdl_wait();
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * n) return;
    size_t t = idx / n, i = idx % n;
    gate[idx] = gelu_tanh_mul_value(gate[idx], up[t * up_stride + i]);
}

extern "C" hearth_status cuda_gelu_tanh_mul_rows(float *gate, const float *up, int T, int n, size_t up_stride,
                                                 hearth_error *err) {
    size_t total = (size_t)T * n;
    if (total == 0) return HEARTH_OK;
    pdl_launch_small(gelu_tanh_mul_rows_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), gate, up, T, n,
                     up_stride);
    return cuda_launched("gelu_tanh_mul_rows", err);
}

/* x[i] = tanh(x[i] / cap) * cap (a division, then the product: the host's order). */
__global__ void softcap_kernel(float *x, float cap, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

extern "C" hearth_status cuda_softcap(float *x, float cap, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(softcap_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), x, cap, n);
    return cuda_launched("softcap", err);
}
