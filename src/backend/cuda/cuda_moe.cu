/* cuda_moe.cu: the two small kernels of the mixture-of-experts op (cuda_model.c cu_moe):
 * zeroing its output rows, adding one expert's output rows, each times its token's router
 * weight, into the tokens' rows, and adding the shared expert's sigmoid-gated rows. One IEEE rounding for the product and one for the
 * sum, in the experts' order, as the CPU backend's loop: the same bits on both. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_pdl.cuh"

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
