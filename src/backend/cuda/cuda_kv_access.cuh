/* cuda_kv_access.cuh: the one place that knows how a key/value element is stored in the
 * device KV pool (cuda_kv): float32, IEEE half (f16), int8 or fp8 e4m3, the last two with
 * one float scale per (layer, block, KV head, position) row. Every kernel that reads or writes the pool goes
 * through these inline functions; none of them allocates, synchronizes or launches.
 *
 * API (device code; KVQ is a hearth_kv_quant value as a template argument):
 *   size_t cuda_kv_row(kv, layer, block, head, p)   row index of position p (p % KV_BLOCK_SIZE
 *                     is the row inside the block): element i of that row is element
 *                     row * head_dim + i of kv.k / kv.v, its scale kv.k_scale[row] / kv.v_scale[row]
 *   int  cuda_kv_block(kv, slot, p)                 block of position p of slot (-1: none)
 *   float  cuda_kv_load<KVQ>(data, scales, row, d, i)     element i of row, dequantized
 *   float4 cuda_kv_load4<KVQ>(data, scales, row, d, i)    elements i..i+3 (i % 4 == 0, d % 4 == 0)
 *   cuda_kv_k<KVQ>(kv, row, d, i) / cuda_kv_v / cuda_kv_k4 / cuda_kv_v4: the same on kv.k, kv.v
 *   float cuda_kv_scale<KVQ>(amax)                  a row's scale from its max |x| (1 for float)
 *   void  cuda_kv_store<KVQ>(data, row, d, i, x, inv)     stores x * inv (inv = 1 / scale, or 0)
 *   CUDA_KV_DISPATCH(quant, KVQ, statement)         runs statement with constexpr KVQ = quant
 *
 * Quantization rules (writers: kv_write_kernel in cuda_kv.cu):
 *   int8: s = max|x| / 127, q = round-half-even(x * (1 / s)): kv_cache.c's quantize_row
 *         exactly, so a device row holds the bytes and scale the CPU's int8 pool would.
 *   fp8 (e4m3, OCP "fn": max 448, no inf): s = max|x| / 448, q = e4m3(x * (1 / s)) rounded
 *         to nearest even, saturating; a row's largest element becomes 448, so a row keeps
 *         4 mantissa bits of relative precision whatever its magnitude.
 *   f16: x rounded to nearest even, saturated to +-65504 (no inf: a huge key stays finite);
 *         no scale (cuda_kv_scale gives 1, the scale arrays are NULL).
 *   A row of zeros has s = 0 and stores zeros. */
#ifndef HEARTH_BACKEND_CUDA_KV_ACCESS_CUH
#define HEARTH_BACKEND_CUDA_KV_ACCESS_CUH
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "kv/kv_cache.h"
}
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define CUDA_KV_DISPATCH(quant, KVQ, ...)                                                                              \
    do {                                                                                                               \
        if ((quant) == HEARTH_KV_INT8) {                                                                               \
            constexpr int KVQ = HEARTH_KV_INT8;                                                                        \
            __VA_ARGS__;                                                                                               \
        } else if ((quant) == HEARTH_KV_FP8) {                                                                         \
            constexpr int KVQ = HEARTH_KV_FP8;                                                                         \
            __VA_ARGS__;                                                                                               \
        } else if ((quant) == HEARTH_KV_F16) {                                                                         \
            constexpr int KVQ = HEARTH_KV_F16;                                                                         \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            constexpr int KVQ = HEARTH_KV_FLOAT;                                                                       \
            __VA_ARGS__;                                                                                               \
        }                                                                                                              \
    } while (0)

static __device__ __forceinline__ size_t cuda_kv_row(const cuda_kv &kv, int layer, int block, int head, int p) {
    return (((size_t)layer * kv.n_blocks + block) * kv.n_kv_heads + head) * KV_BLOCK_SIZE + (size_t)(p % KV_BLOCK_SIZE);
}

static __device__ __forceinline__ int cuda_kv_block(const cuda_kv &kv, int slot, int p) {
    int b = kv.tables[(size_t)slot * kv.max_blocks_per_slot + p / KV_BLOCK_SIZE];
    return b >= 0 && b < kv.n_blocks ? b : -1;
}

static __device__ __forceinline__ float cuda_kv_fp8_to_float(uint8_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}

/* 4 e4m3 bytes (element 0 in the low byte) to floats. */
static __device__ __forceinline__ float4 cuda_kv_fp8x4_to_float4(uint32_t w) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <int KVQ>
static __device__ __forceinline__ float cuda_kv_load(const void *data, const float *scales, size_t row, int d, int i) {
    size_t off = row * (size_t)d + i;
    if (KVQ == HEARTH_KV_INT8) return __ldg(scales + row) * (float)__ldg((const int8_t *)data + off);
    if (KVQ == HEARTH_KV_FP8) return __ldg(scales + row) * cuda_kv_fp8_to_float(__ldg((const uint8_t *)data + off));
    if (KVQ == HEARTH_KV_F16) return __half2float(__ldg((const __half *)data + off));
    return __ldg((const float *)data + off);
}

template <int KVQ>
static __device__ __forceinline__ float4 cuda_kv_load4(const void *data, const float *scales, size_t row, int d,
                                                       int i) {
    size_t off = row * (size_t)d + i;
    if (KVQ == HEARTH_KV_FLOAT) return __ldg((const float4 *)((const float *)data + off));
    if (KVQ == HEARTH_KV_F16) { /* 8-byte load of 4 halves */
        uint2 u = __ldg((const uint2 *)((const __half *)data + off));
        float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    float s = __ldg(scales + row);
    if (KVQ == HEARTH_KV_INT8) {
        char4 c = __ldg((const char4 *)((const int8_t *)data + off));
        return make_float4(s * (float)c.x, s * (float)c.y, s * (float)c.z, s * (float)c.w);
    }
    float4 f = cuda_kv_fp8x4_to_float4(__ldg((const unsigned int *)((const uint8_t *)data + off)));
    return make_float4(s * f.x, s * f.y, s * f.z, s * f.w);
}

template <int KVQ> static __device__ __forceinline__ float cuda_kv_k(const cuda_kv &kv, size_t row, int d, int i) {
    return cuda_kv_load<KVQ>(kv.k, kv.k_scale, row, d, i);
}
template <int KVQ> static __device__ __forceinline__ float cuda_kv_v(const cuda_kv &kv, size_t row, int d, int i) {
    return cuda_kv_load<KVQ>(kv.v, kv.v_scale, row, d, i);
}
template <int KVQ> static __device__ __forceinline__ float4 cuda_kv_k4(const cuda_kv &kv, size_t row, int d, int i) {
    return cuda_kv_load4<KVQ>(kv.k, kv.k_scale, row, d, i);
}
template <int KVQ> static __device__ __forceinline__ float4 cuda_kv_v4(const cuda_kv &kv, size_t row, int d, int i) {
    return cuda_kv_load4<KVQ>(kv.v, kv.v_scale, row, d, i);
}

/* Plain IEEE division (nvcc's default -prec-div): the same float the CPU's amax / 127 gives. */
template <int KVQ> static __device__ __forceinline__ float cuda_kv_scale(float amax) {
    if (KVQ == HEARTH_KV_INT8) return amax / 127.0f;
    if (KVQ == HEARTH_KV_FP8) return amax / 448.0f;
    return 1.0f;
}

template <int KVQ>
static __device__ __forceinline__ void cuda_kv_store(void *data, size_t row, int d, int i, float x, float inv) {
    size_t off = row * (size_t)d + i;
    if (KVQ == HEARTH_KV_INT8)
        ((int8_t *)data)[off] = (int8_t)__float2int_rn(x * inv); /* |x * inv| <= 127 */
    else if (KVQ == HEARTH_KV_FP8)
        ((uint8_t *)data)[off] = (uint8_t)__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3);
    else if (KVQ == HEARTH_KV_F16)
        ((__half *)data)[off] = __float2half_rn(fminf(fmaxf(x, -65504.0f), 65504.0f));
    else
        ((float *)data)[off] = x;
}
#endif
