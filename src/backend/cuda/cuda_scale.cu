/* cuda_scale.cu: x *= s or x /= s over a float buffer (the op table's scale op, and
 * the division of the normed rows before lm_head (op_logits' div)): one IEEE rounding per element, as
 * the CPU backend's loop, so both backends give the same bits. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_pdl.cuh"

__global__ void scale_kernel(float *x, float s, int divide, size_t n) {
    pdl_wait(); /* a programmatic dependent (pdl_launch_small): x comes from the kernel before */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = divide ? __fdiv_rn(x[i], s) : __fmul_rn(x[i], s);
}

extern "C" hearth_status cuda_scale(float *x, float s, int divide, size_t n, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    pdl_launch_small(scale_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), x, s, divide, n);
    return cuda_launched("scale", err);
}
