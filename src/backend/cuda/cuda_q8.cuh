/* cuda_q8.cuh: the int8 activation blocks that every int8-activation GEMV reads, written by
 * one device function wherever they are made (quantize_x_q8, the fused norm and gate
 * kernels, the split-attention merge), so that every producer rounds alike, bit for bit.
 * Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_Q8_CUH
#define HEARTH_BACKEND_CUDA_Q8_CUH
#include <stdint.h>

/* One block of 32 consecutive values, one per lane of a full warp: d = max|v| / 127,
 * q = round-half-even(v / d) clamped to +-127, (d, d * sum q) per block. A NaN anywhere in
 * the block makes d NaN, so the GEMV output is NaN too (the engine's non-finite check must
 * still see it). */
static __device__ __forceinline__ void quant_block32(float v, int8_t *xq, float2 *xs, int lane) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    float d = a / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    int q = __float2int_rn(v * id);
    q = q > 127 ? 127 : q < -127 ? -127 : q;
    xq[lane] = (int8_t)q;
    int sq = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    if (__any_sync(0xffffffffu, v != v)) d = __int_as_float(0x7fc00000);
    if (lane == 0) *xs = make_float2(d, d * (float)sq);
}

#endif
