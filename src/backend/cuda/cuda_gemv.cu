/* cuda_gemv.cu: decode GEMV y[T, n] = x[T, k] · W^T on the device for F32, F16, BF16, MLX 4-bit,
 * Q8_0, Q4_K and Q6_K weights (layouts: cuda_weight; the generic affine layout's kernels are
 * in cuda_gemv_affine.cu). One warp per output row (the int8
 * kernels: 1 to 4 rows); weights are read once with 16-byte non-allocating loads and
 * dequantized in registers; accumulation is float32. Activations are float32, except for
 * Q8_0 / Q4_K / Q6_K and chunked MLX 4-bit (cuda_gemv_mlx4.cu), whose kernels quantize them
 * to int8 blocks once per call and use __dp4a (see "int8 activations" below). Must not
 * synchronize; allocates only when its activation scratch (cuda_gemv_reserve) is too small
 * and no graph is being captured. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_plan.h"
}
#include "backend/cuda/cuda_gemv.cuh"
/* PDL (pdl_on) without an L2 row prefetch: with the prefetch the float GEMVs lose, without
 * it they gain a little (bench/results/kernel_choices.md, "CUDA PDL"). */
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_q8.cuh"
#include <cuda_fp16.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 4 warps (rows) per block of 128 threads: small blocks let the scheduler fill every SM
 * with many independent rows, which is what keeps enough loads in flight for HBM. */
#define GEMV_WARPS 4

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Each warp's T partial sums reduced across lanes; lane 0 writes column `row` of y[T, n]. */
template <int T>
static __device__ __forceinline__ void store_sums(float (&acc)[T], float *y, int n, int row, int lane) {
#pragma unroll
    for (int t = 0; t < T; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * n + row] = s;
    }
}

static __device__ __forceinline__ float half_bits(uint32_t h, bool bf16) {
    return bf16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half((unsigned short)h));
}

/* Eight 16-bit weights in u dotted with x[0..7] (16-byte aligned). */
static __device__ __forceinline__ float dot8_half(uint4 u, const float *x, bool bf16) {
    const float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    float s = half_bits(w[0] & 0xffff, bf16) * a.x;
    s += half_bits(w[0] >> 16, bf16) * a.y;
    s += half_bits(w[1] & 0xffff, bf16) * a.z;
    s += half_bits(w[1] >> 16, bf16) * a.w;
    s += half_bits(w[2] & 0xffff, bf16) * b.x;
    s += half_bits(w[2] >> 16, bf16) * b.y;
    s += half_bits(w[3] & 0xffff, bf16) * b.z;
    s += half_bits(w[3] >> 16, bf16) * b.w;
    return s;
}

/* Up to three weights of one input (q, k and v of a layer) in one launch: blocks are
 * numbered over the rows of all three, so the small k/v projections no longer run as
 * launches too short to reach full bandwidth. Row r of the whole belongs to segment s
 * when r < end[s]; its output is y[s][t * n_s + r - start_s]. */
struct gemv_segs {
    const uint16_t *W[3];
    float *y[3];
    int end[3]; /* cumulative row counts */
};

/* F16/BF16 rows with k % 8 == 0: each lane takes 8 weights (16 bytes) at a time; DEPTH
 * loads (launch_half_segs: 4, which beat 8 on the H200: bench/results/kernel_choices.md,
 * "CUDA float GEMV depth") are issued before the first is used, then four, then one. */
template <int T, bool BF16, int DEPTH>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_half_vec(gemv_segs sg, const float *x, int k) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    /* selects, not a run-time index into the parameter struct (that copies it to local memory) */
    if (row >= sg.end[2]) return;
    int seg = row < sg.end[0] ? 0 : row < sg.end[1] ? 1 : 2;
    int start = seg == 0 ? 0 : seg == 1 ? sg.end[0] : sg.end[1];
    int n = (seg == 0 ? sg.end[0] : seg == 1 ? sg.end[1] : sg.end[2]) - start;
    const uint16_t *W = seg == 0 ? sg.W[0] : seg == 1 ? sg.W[1] : sg.W[2];
    float *y = seg == 0 ? sg.y[0] : seg == 1 ? sg.y[1] : sg.y[2];
    const uint4 *wr = (const uint4 *)(W + (size_t)(row - start) * k);
    pdl_wait(); /* x and y belong to the kernels before */
    pdl_trigger();
    int nv = k / 8, v = lane;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (; DEPTH == 8 && v + 224 < nv; v += 256) {
        uint4 u[8];
#pragma unroll
        for (int j = 0; j < 8; j++) u[j] = load_stream(wr + v + 32 * j);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int t = 0; t < T; t++) acc[t] += dot8_half(u[j], x + (size_t)t * k + (size_t)(v + 32 * j) * 8, BF16);
    }
    for (; v + 96 < nv; v += 128) {
        uint4 u[4];
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = load_stream(wr + v + 32 * j);
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int t = 0; t < T; t++) acc[t] += dot8_half(u[j], x + (size_t)t * k + (size_t)(v + 32 * j) * 8, BF16);
    }
    for (; v < nv; v += 32) {
        uint4 u = load_stream(wr + v);
#pragma unroll
        for (int t = 0; t < T; t++) acc[t] += dot8_half(u, x + (size_t)t * k + (size_t)v * 8, BF16);
    }
    store_sums<T>(acc, y, n, row - start, lane);
}

/* Any k or alignment (odd shapes): one 16-bit weight per lane per step. */
template <int T, bool BF16>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_half_scalar(const uint16_t *W, const float *x, float *y, int n, int k) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const uint16_t *wr = W + (size_t)row * k;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int i = lane; i < k; i += 32) {
        float w = half_bits(wr[i], BF16);
#pragma unroll
        for (int t = 0; t < T; t++) acc[t] += w * x[(size_t)t * k + i];
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* F32 rows (formats expanded at upload, norms-sized odd weights): float4 loads when
 * k % 4 == 0 and x is aligned, else one float per lane per step. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_f32(const float *W, const float *x, float *y, int n, int k, bool vec) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *wr = W + (size_t)row * k;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    if (vec) {
        for (int i = lane * 4; i < k; i += 128) {
            uint4 u = load_stream((const uint4 *)(wr + i));
            float4 w = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float4 a = *(const float4 *)(x + (size_t)t * k + i);
                acc[t] += w.x * a.x + w.y * a.y + w.z * a.z + w.w * a.w;
            }
        }
    } else {
        for (int i = lane; i < k; i += 32) {
            float w = wr[i];
#pragma unroll
            for (int t = 0; t < T; t++) acc[t] += w * x[(size_t)t * k + i];
        }
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* Sixteen int8 quants in u dotted with x[0..15]. */
static __device__ __forceinline__ float dot16_i8(uint4 u, const float *x) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float4 a = *(const float4 *)(x + 4 * j);
        s += (float)(int8_t)(w[j] & 0xff) * a.x;
        s += (float)(int8_t)((w[j] >> 8) & 0xff) * a.y;
        s += (float)(int8_t)((w[j] >> 16) & 0xff) * a.z;
        s += (float)(int8_t)(w[j] >> 24) * a.w;
    }
    return s;
}

/* Q8_0 split planes: each lane takes half a block (16 quants, one 16-byte load) and its
 * block's f16 scale; two loads in flight per lane before use. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_q8_0(const int8_t *Q, const uint16_t *D, const float *x, float *y, int n, int k) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const uint4 *qr = (const uint4 *)(Q + (size_t)row * k);
    const uint16_t *dr = D + (size_t)row * (k / 32);
    int nv = k / 16, v = lane;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (; v + 32 < nv; v += 64) {
        uint4 u0 = load_stream(qr + v), u1 = load_stream(qr + v + 32);
        float d0 = half_bits(dr[v / 2], false), d1 = half_bits(dr[(v + 32) / 2], false);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * k;
            acc[t] += d0 * dot16_i8(u0, xt + (size_t)v * 16) + d1 * dot16_i8(u1, xt + (size_t)(v + 32) * 16);
        }
    }
    for (; v < nv; v += 32) {
        uint4 u = load_stream(qr + v);
        float d = half_bits(dr[v / 2], false);
#pragma unroll
        for (int t = 0; t < T; t++) acc[t] += d * dot16_i8(u, x + (size_t)t * k + (size_t)v * 16);
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* GGUF Q4_K super-block (256 weights, 144 bytes): f16 d, f16 dmin, 12 bytes of packed
 * 6-bit scales and mins for 8 sub-blocks of 32, then 128 bytes of nibbles: byte l of
 * chunk c (32 bytes) holds weight 64c + l (low nibble) and 64c + 32 + l (high nibble). */
static __device__ __forceinline__ uint32_t scale_byte(uint4 hdr, int i) { /* byte i of the 12 */
    uint32_t w = i < 4 ? hdr.y : i < 8 ? hdr.z : hdr.w;
    return (w >> (8 * (i & 3))) & 0xff;
}
static __device__ __forceinline__ void q4k_scale_min(uint4 hdr, int j, bool packed, float *sc, float *m) {
    if (packed) { /* cuda_q4k_scale_min's packed order */
        uint32_t g = cuda_q4k_group_dev(hdr, j / 2);
        *sc = (float)((g >> (6 * (j % 2))) & 63);
        *m = (float)((g >> (12 + 6 * (j % 2))) & 63);
    } else if (j < 4) {
        *sc = (float)(scale_byte(hdr, j) & 63);
        *m = (float)(scale_byte(hdr, j + 4) & 63);
    } else {
        *sc = (float)((scale_byte(hdr, j + 4) & 0xF) | ((scale_byte(hdr, j - 4) >> 6) << 4));
        *m = (float)((scale_byte(hdr, j + 4) >> 4) | ((scale_byte(hdr, j) >> 6) << 4));
    }
}

/* Eight lanes cover one super-block: lane part p reads bytes 16p..16p+15 of the nibbles
 * (chunk p/2, half p%2) plus the 16-byte header, so 32 lanes read 4 super-blocks per step
 * with 16-byte loads; the header load is shared by 8 lanes through L1. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q4_k(const uint8_t *W, const float *x, float *y, int n, int k, bool packed) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    int nsb = k / 256, part = lane % 8, c = part / 2, h = part % 2;
    const uint8_t *wr = W + (size_t)row * nsb * 144;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int sb = lane / 8; sb < nsb; sb += 4) {
        const uint8_t *blk = wr + (size_t)sb * 144;
        uint4 hdr = __ldg((const uint4 *)blk);
        uint4 qv = load_stream((const uint4 *)(blk + 16 + 32 * c + 16 * h));
        float d = half_bits(hdr.x & 0xffff, false), dmin = half_bits(hdr.x >> 16, false);
        float sc0, m0, sc1, m1;
        q4k_scale_min(hdr, 2 * c, packed, &sc0, &m0);
        q4k_scale_min(hdr, 2 * c + 1, packed, &sc1, &m1);
        uint32_t q[4] = {qv.x, qv.y, qv.z, qv.w};
        int base = sb * 256 + 64 * c + 16 * h;
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float *xl = x + (size_t)t * k + base, *xh = xl + 32;
            float dl = 0.0f, dh = 0.0f, sl = 0.0f, sh = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 a = *(const float4 *)(xl + 4 * j), b = *(const float4 *)(xh + 4 * j);
                uint32_t w = q[j];
                dl += (float)(w & 0xF) * a.x + (float)((w >> 8) & 0xF) * a.y + (float)((w >> 16) & 0xF) * a.z +
                      (float)((w >> 24) & 0xF) * a.w;
                dh += (float)((w >> 4) & 0xF) * b.x + (float)((w >> 12) & 0xF) * b.y +
                      (float)((w >> 20) & 0xF) * b.z + (float)((w >> 28) & 0xF) * b.w;
                sl += a.x + a.y + a.z + a.w;
                sh += b.x + b.y + b.z + b.w;
            }
            acc[t] += d * (sc0 * dl + sc1 * dh) - dmin * (m0 * sl + m1 * sh);
        }
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* GGUF Q6_K, split at upload into planes (cuda_weight): ql [n][k/2] low nibbles and qh
 * [n][k/4] high 2-bit pairs in data, int8 sub-block scales [n][k/16] then f16 d [n][k/256]
 * in scales. Super-block weight 128h + 32g + l (h < 2, g < 4, l < 32) takes nibble g/2 of
 * ql[64h + 32(g%2) + l], bits 2g of qh[32h + l] and scale (128h + 32g + l)/16. Four lanes
 * cover a super-block: lane part (h, j) takes l in [16j, 16j + 16) for all four g, with
 * three 16-byte loads (two of ql, one of qh), so a warp reads 8 super-blocks per step. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_q6_k(const uint8_t *QL, const uint8_t *QH, const int8_t *SC,
                                                               const uint16_t *D, const float *x, float *y, int n,
                                                               int k) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    int nsb = k / 256, part = lane % 4, h = part / 2, j = part % 2;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int sb = lane / 4; sb < nsb; sb += 8) {
        size_t bi = (size_t)row * nsb + sb;
        uint4 qa = load_stream((const uint4 *)(QL + bi * 128 + 64 * h + 16 * j));
        uint4 qb = load_stream((const uint4 *)(QL + bi * 128 + 64 * h + 32 + 16 * j));
        uint4 qh = load_stream((const uint4 *)(QH + bi * 64 + 32 * h + 16 * j));
        uint2 scw = __ldg((const uint2 *)(SC + bi * 16 + 8 * h));
        float d = half_bits(D[bi], false);
        uint32_t la[4] = {qa.x, qa.y, qa.z, qa.w}, lb[4] = {qb.x, qb.y, qb.z, qb.w}, hh[4] = {qh.x, qh.y, qh.z, qh.w};
        int base = sb * 256 + 128 * h + 16 * j;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            int sbyte = j + 2 * g; /* byte of the 8 scales of this half */
            uint32_t sw = sbyte < 4 ? scw.x : scw.y;
            float ds = d * (float)(int8_t)((sw >> (8 * (sbyte & 3))) & 0xff);
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float *xg = x + (size_t)t * k + base + 32 * g;
                float dot = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const float4 a = *(const float4 *)(xg + 4 * w);
                    uint32_t lo = g % 2 ? lb[w] : la[w], hi = hh[w];
                    int sl = 4 * (g / 2), sh = 2 * g;
                    float q0 = (float)((int)(((lo >> sl) & 0xF) | (((hi >> sh) & 3) << 4)) - 32);
                    float q1 = (float)((int)(((lo >> (sl + 8)) & 0xF) | (((hi >> (sh + 8)) & 3) << 4)) - 32);
                    float q2 = (float)((int)(((lo >> (sl + 16)) & 0xF) | (((hi >> (sh + 16)) & 3) << 4)) - 32);
                    float q3 = (float)((int)(((lo >> (sl + 24)) & 0xF) | (((hi >> (sh + 24)) & 3) << 4)) - 32);
                    dot += q0 * a.x + q1 * a.y + q2 * a.z + q3 * a.w;
                }
                acc[t] += ds * dot;
            }
        }
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* MLX affine 4-bit: each lane loads 16 bytes = 32 weights of one group (groups are
 * multiples of 32) plus that group's (scale, bias) word, four loads in flight like
 * gemv_half_vec. sum_j (s*q_j + b)*x_j is computed as s*sum(q_j*x_j) + b*sum(x_j). */
template <bool BF16>
static __device__ __forceinline__ float dot32_mlx4(uint4 u, uint32_t sb, const float *x) {
    float s = half_bits(sb & 0xffff, BF16), b = half_bits(sb >> 16, BF16);
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    float dq = 0.0f, sx = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 a = *(const float4 *)(x + 8 * i), c = *(const float4 *)(x + 8 * i + 4);
        uint32_t q = w[i];
        dq += (float)(q & 0xF) * a.x + (float)((q >> 4) & 0xF) * a.y + (float)((q >> 8) & 0xF) * a.z +
              (float)((q >> 12) & 0xF) * a.w + (float)((q >> 16) & 0xF) * c.x + (float)((q >> 20) & 0xF) * c.y +
              (float)((q >> 24) & 0xF) * c.z + (float)(q >> 28) * c.w;
        sx += (a.x + a.y) + (a.z + a.w) + (c.x + c.y) + (c.z + c.w);
    }
    return s * dq + b * sx;
}

template <int T, bool BF16>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_mlx4(const uint32_t *W, const uint32_t *SB, const float *x, float *y, int n, int k, int gs) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const uint4 *wr = (const uint4 *)(W + (size_t)row * (k / 8));
    const uint32_t *sbr = SB + (size_t)row * (k / gs);
    int nv = k / 32, per_group = gs / 32, v = lane;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (; v + 96 < nv; v += 128) {
        uint4 u[4];
        uint32_t sb[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u[j] = load_stream(wr + v + 32 * j);
            sb[j] = __ldg(sbr + (v + 32 * j) / per_group);
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t] += dot32_mlx4<BF16>(u[j], sb[j], x + (size_t)t * k + (size_t)(v + 32 * j) * 32);
    }
    for (; v < nv; v += 32) {
        uint4 u = load_stream(wr + v);
        uint32_t sb = __ldg(sbr + v / per_group);
#pragma unroll
        for (int t = 0; t < T; t++) acc[t] += dot32_mlx4<BF16>(u, sb, x + (size_t)t * k + (size_t)v * 32);
    }
    store_sums<T>(acc, y, n, row, lane);
}

/* A nibble as an exact float without the quarter-rate int-to-float conversion:
 * 0x4B000000 is 2^23, whose ulp is 1, so OR-ing q into its mantissa gives 2^23 + q. */
static __device__ __forceinline__ float nib(uint32_t w, int shift) {
    return __uint_as_float(0x4B000000u | ((w >> shift) & 0xFu)) - 8388608.0f;
}

/* MLX 4-bit, tiled layout (cuda_mlx4_nibble): per 1024-weight tile each lane loads one
 * 16-byte vector; run m (4 weights) of it pairs with x[128m + 4L .. +3], one coalesced
 * float4 across the warp, and with its group's (scale, bias) word (4 weights never cross
 * a group: groups are multiples of 32). Four tiles are loaded before the first is used. */
template <int T, bool BF16>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_mlx4_tiled(const uint32_t *W, const uint32_t *SB, const float *x, float *y, int n, int k, int gs) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const uint4 *wr = (const uint4 *)(W + (size_t)row * (k / 8));
    pdl_wait();
    pdl_trigger();
    const uint32_t *sbr = SB + (size_t)row * (k / gs);
    int nt = k / 1024;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        uint4 u[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (t0 + j < nt) u[j] = load_stream(wr + (size_t)(t0 + j) * 32 + lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (t0 + j >= nt) break;
            uint32_t wd[4] = {u[j].x, u[j].y, u[j].z, u[j].w};
#pragma unroll
            for (int m = 0; m < 8; m++) {
                int c0 = (t0 + j) * 1024 + 128 * m + 4 * lane, sh = 16 * (m % 2);
                uint32_t q = wd[m / 2], sb = __ldg(sbr + c0 / gs);
                float s = half_bits(sb & 0xffff, BF16), b = half_bits(sb >> 16, BF16);
                float q0 = nib(q, sh), q1 = nib(q, sh + 4), q2 = nib(q, sh + 8), q3 = nib(q, sh + 12);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const float4 a = *(const float4 *)(x + (size_t)t * k + c0);
                    float dq = q0 * a.x + q1 * a.y + q2 * a.z + q3 * a.w;
                    acc[t] += s * dq + b * ((a.x + a.y) + (a.z + a.w));
                }
            }
        }
    }
    store_sums<T>(acc, y, n, row, lane);
}

template <int T>
static void launch_half_segs(const cuda_weight *const *ws, float *const *ys, int nw, const float *x) {
    gemv_segs sg = {};
    int rows = 0;
    for (int i = 0; i < 3; i++) {
        if (i < nw) {
            sg.W[i] = (const uint16_t *)ws[i]->data;
            sg.y[i] = ys[i];
            rows += (int)ws[i]->n;
        }
        sg.end[i] = rows;
    }
    dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * 32);
    bool bf = ws[0]->dtype == DT_BF16;
    int k = (int)ws[0]->k;
    if (bf) pdl_launch(gemv_half_vec<T, true, 4>, grid, block, sg, x, k);
    else pdl_launch(gemv_half_vec<T, false, 4>, grid, block, sg, x, k);
}

template <int T>
static void launch_rows(const cuda_weight *w, const float *x, float *y, bool vec) {
    int n = (int)w->n, k = (int)w->k;
    dim3 grid((unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * 32);
    switch (w->dtype) {
    case DT_F32: gemv_f32<T><<<grid, block, 0, cuda_stream()>>>((const float *)w->data, x, y, n, k, w->k % 4 == 0 && ((uintptr_t)x % 16) == 0); break;
    case DT_BF16:
    case DT_F16:
        if (vec) launch_half_segs<T>(&w, &y, 1, x);
        else if (w->dtype == DT_BF16)
            gemv_half_scalar<T, true><<<grid, block, 0, cuda_stream()>>>((const uint16_t *)w->data, x, y, n, k);
        else gemv_half_scalar<T, false><<<grid, block, 0, cuda_stream()>>>((const uint16_t *)w->data, x, y, n, k);
        break;
    case DT_Q8_0: gemv_q8_0<T><<<grid, block, 0, cuda_stream()>>>((const int8_t *)w->data, (const uint16_t *)w->scales, x, y, n, k); break;
    case DT_Q4_K:
        gemv_q4_k<T><<<grid, block, 0, cuda_stream()>>>((const uint8_t *)w->data, x, y, n, k, w->q4k_packed);
        break;
    case DT_Q6_K: {
        size_t nk = (size_t)n * (size_t)k;
        const uint8_t *ql = (const uint8_t *)w->data;
        const int8_t *sc = (const int8_t *)w->scales;
        gemv_q6_k<T><<<grid, block, 0, cuda_stream()>>>(ql, ql + nk / 2, sc, (const uint16_t *)(sc + nk / 16), x, y, n,
                                                        k);
        break;
    }
    case DT_AFFINE: cuda_gemv_affine_launch(w, NULL, NULL, x, y, T); break;
    case DT_U32:
        if (w->mlx_tiled && w->sb_bf16)
            pdl_launch(gemv_mlx4_tiled<T, true>, grid, block, (const uint32_t *)w->data, (const uint32_t *)w->scales,
                       x, y, n, k, (int)w->group_size);
        else if (w->mlx_tiled)
            pdl_launch(gemv_mlx4_tiled<T, false>, grid, block, (const uint32_t *)w->data,
                       (const uint32_t *)w->scales, x, y, n, k, (int)w->group_size);
        else if (w->sb_bf16)
            gemv_mlx4<T, true><<<grid, block, 0, cuda_stream()>>>((const uint32_t *)w->data, (const uint32_t *)w->scales,
                                                                 x, y, n, k, w->group_size);
        else
            gemv_mlx4<T, false><<<grid, block, 0, cuda_stream()>>>((const uint32_t *)w->data,
                                                                  (const uint32_t *)w->scales, x, y, n, k, w->group_size);
        break;
    default: break;
    }
}

/* ---------- int8 activations: Q8_0 / Q4_K / Q6_K with dp4a ----------
 * The float kernels above re-read 4 bytes of activations from L1 for every weight and
 * convert every quant to float (a quarter-rate instruction): they are bound by that, not
 * by HBM. Here the activations are quantized once per GEMV call (per block of 32: d =
 * max|x| / 127, q = round-to-nearest-even(x / d), the CPU fast path's cpu_quantize_row_ref
 * rule), and each kernel multiplies int8 by int8 with __dp4a (4 products per instruction,
 * exact int32 sums per block) and scales the block sum by d_weight * d_x in float. A warp
 * works on R rows (1, 2 or 4, chosen so the grid still covers every SM several times) and
 * always keeps four 16-byte weight loads in flight ("slots": slot s serves row s % R at
 * step s / R along the row). */

/* Scratch for the quantized activations: int8 [T][k] and (d, d * sum q) per block of 32.
 * Sized by cuda_gemv_reserve at model creation; grown here only outside stream capture.
 * A smaller old buffer is never freed: a captured decode graph may still point at it.
 * g_xlock makes "quantize x, then launch the GEMVs that read it" one unit on the one
 * stream when several host threads (engines) enqueue work. */
static int8_t *g_xq;
static float2 *g_xs;
static size_t g_xcap; /* floats of x it holds */
static pthread_mutex_t g_xlock = PTHREAD_MUTEX_INITIALIZER;

static hearth_status reserve_locked(size_t floats, hearth_error *err) {
    size_t quant_bytes, scale_bytes; /* the sizes hearth fit counts (cuda_plan.c) */
    cuda_gemv_act_layout(floats, &quant_bytes, &scale_bytes);
    floats = quant_bytes;
    if (floats <= g_xcap) return HEARTH_OK;
    int8_t *q = NULL;
    float2 *sc = NULL;
    if (cuda_alloc((void **)&q, quant_bytes, "gemv int8 activations", err) ||
        cuda_alloc((void **)&sc, scale_bytes, "gemv activation scales", err)) {
        cuda_free(q);
        return HEARTH_ERR_NOMEM;
    }
    g_xq = q, g_xs = sc, g_xcap = floats;
    return HEARTH_OK;
}

void cuda_gemv_force_pdl(int mode) {
    *pdl_force() = mode;
    cuda_gemv_v2_force_pdl(mode); /* pdl_force is per translation unit */
    cuda_gemv_mlx4_force_pdl(mode);
}

hearth_status cuda_gemv_reserve(size_t floats, hearth_error *err) {
    (void)pdl_on(); /* its one device query happens here, at model creation, not inside a capture */
    (void)pdl_small_on();
    cuda_mmq_prepare(); /* likewise the MMQ kernels' shared-memory opt-in */
    pthread_mutex_lock(&g_xlock);
    hearth_status st = reserve_locked(floats, err);
    pthread_mutex_unlock(&g_xlock);
    return st;
}

int cuda_gemv_int8_act(const cuda_weight *w) {
    return w &&
           (w->dtype == DT_Q8_0 || w->dtype == DT_Q4_K || w->dtype == DT_Q6_K ||
            (w->dtype == DT_AFFINE && !w->aff_f32act) || cuda_mlx4_int8_takes(w)) &&
           w->k % 32 == 0;
}

/* One warp per block of 32 activations (quant_block32). */
__global__ void __launch_bounds__(256) quantize_x_q8(const float *x, int8_t *xq, float2 *xs, int nblocks) {
    int b = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    pdl_wait(); /* x comes from the kernel before; the GEMV before may still read xq */
    pdl_trigger();
    if (b >= nblocks) return;
    quant_block32(x[(size_t)b * 32 + lane], xq + (size_t)b * 32, xs + b, lane);
}

#define QSLOTS 4

/* Sums the slots of each of the warp's R rows, reduces across lanes, lane 0 writes. */
template <int T>
static __device__ __forceinline__ void store_slots(float (&acc)[QSLOTS][T], float *y, int n, int row0, int R, int lane) {
#pragma unroll
    for (int r = 0; r < QSLOTS; r++) {
        if (r >= R || row0 + r >= n) break;
#pragma unroll
        for (int t = 0; t < T; t++) {
            float s = 0.0f;
#pragma unroll
            for (int sl = 0; sl < QSLOTS; sl++)
                if ((sl & (R - 1)) == r) s += acc[sl][t];
            s = warp_sum(s);
            if (lane == 0) y[(size_t)t * n + row0 + r] = s;
        }
    }
}

static __device__ __forceinline__ int dot16_dp4a(uint4 w, int4 a) {
    int s = __dp4a((int)w.x, a.x, 0);
    s = __dp4a((int)w.y, a.y, s);
    s = __dp4a((int)w.z, a.z, s);
    return __dp4a((int)w.w, a.w, s);
}

/* Q8_0 planes: a lane takes 16 quants (half a block) per slot. */
template <int T, bool GR = false>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q8_0_i8(const int8_t *Q, const uint16_t *D, const int8_t *xq, const float2 *xs, float *y, int n, int k, int R,
                 gemv_grouped gp) {
    int warp = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * R;
    if (row0 >= n) return;
    if (GR) gemv_grouped_pair(gp, Q, D, xq, xs, y, n, k);
    pdl_wait(); /* xq / xs come from quantize_x_q8 */
    pdl_trigger();
    int nv = k / 16, nb = k / 32, lgR = R == 4 ? 2 : R == 2 ? 1 : 0, stride = 32 * (QSLOTS / R);
    float acc[QSLOTS][T];
#pragma unroll
    for (int s = 0; s < QSLOTS; s++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[s][t] = 0.0f;
    for (int v0 = lane; v0 < nv; v0 += stride) {
        uint4 u[QSLOTS];
        float dw[QSLOTS];
        bool ok[QSLOTS];
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            int row = row0 + (s & (R - 1)), v = v0 + 32 * (s >> lgR);
            ok[s] = row < n && v < nv;
            if (ok[s]) {
                u[s] = load_stream((const uint4 *)(Q + (size_t)row * k) + v);
                dw[s] = half_bits(__ldg(D + (size_t)row * nb + v / 2), false);
            }
        }
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            if (!ok[s]) continue;
            int v = v0 + 32 * (s >> lgR);
#pragma unroll
            for (int t = 0; t < T; t++) {
                int4 a = *(const int4 *)(xq + (size_t)t * k + (size_t)v * 16);
                float dx = xs[(size_t)t * nb + v / 2].x;
                acc[s][t] += dw[s] * dx * (float)dot16_dp4a(u[s], a);
            }
        }
    }
    store_slots<T>(acc, y, n, row0, R, lane);
}

/* Q4_K with packed scales (q4k_packed, which every upload sets): 4 lanes per super-block; lane
 * c takes chunk c whole (32 nibble bytes, two 16-byte loads): low nibbles = weights 64c +
 * [0, 32) (x block 8 sb + 2c), high = 64c + 32 + [0, 32) (block 8 sb + 2c + 1), so the
 * scale/min unpacking (a few shifts, cuda_q4k_scale_min) serves 64 weights and a warp
 * reads 8 super-blocks per slot step. Each 32-block: one exact int32 dp4a sum, then float
 * multiplies by d * sc * d_x and the min term dmin * m * (d_x * sum q_x). */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q4_k_i8p(const uint8_t *W, const int8_t *xq, const float2 *xs, float *y, int n, int k, int R) {
    int warp = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * R;
    if (row0 >= n) return;
    int nsb = k / 256, nb = k / 32, c = lane % 4;
    pdl_wait();
    pdl_trigger();
    int lgR = R == 4 ? 2 : R == 2 ? 1 : 0, stride = 8 * (QSLOTS / R);
    float acc[QSLOTS][T];
#pragma unroll
    for (int s = 0; s < QSLOTS; s++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[s][t] = 0.0f;
    for (int sb0 = lane / 4; sb0 < nsb; sb0 += stride) {
        uint4 hdr[QSLOTS], q0[QSLOTS], q1[QSLOTS];
        bool ok[QSLOTS];
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            int row = row0 + (s & (R - 1)), sb = sb0 + 8 * (s >> lgR);
            ok[s] = row < n && sb < nsb;
            if (ok[s]) {
                const uint8_t *blk = W + ((size_t)row * nsb + sb) * 144;
                hdr[s] = __ldg((const uint4 *)blk);
                q0[s] = load_stream((const uint4 *)(blk + 16 + 32 * c));
                q1[s] = load_stream((const uint4 *)(blk + 32 + 32 * c));
            }
        }
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            if (!ok[s]) continue;
            int sb = sb0 + 8 * (s >> lgR), base = sb * 256 + 64 * c, bl = sb * 8 + 2 * c;
            float d = half_bits(hdr[s].x & 0xffff, false), dmin = half_bits(hdr[s].x >> 16, false);
            uint32_t g = cuda_q4k_group_dev(hdr[s], c); /* cuda_q4k_scale_min's packed order */
            float sc0 = (float)(g & 63), sc1 = (float)((g >> 6) & 63);
            float m0 = (float)((g >> 12) & 63), m1 = (float)((g >> 18) & 63);
            uint4 l0 =
                make_uint4(q0[s].x & 0x0F0F0F0Fu, q0[s].y & 0x0F0F0F0Fu, q0[s].z & 0x0F0F0F0Fu, q0[s].w & 0x0F0F0F0Fu);
            uint4 l1 =
                make_uint4(q1[s].x & 0x0F0F0F0Fu, q1[s].y & 0x0F0F0F0Fu, q1[s].z & 0x0F0F0F0Fu, q1[s].w & 0x0F0F0F0Fu);
            uint4 h0 = make_uint4((q0[s].x >> 4) & 0x0F0F0F0Fu, (q0[s].y >> 4) & 0x0F0F0F0Fu,
                                  (q0[s].z >> 4) & 0x0F0F0F0Fu, (q0[s].w >> 4) & 0x0F0F0F0Fu);
            uint4 h1 = make_uint4((q1[s].x >> 4) & 0x0F0F0F0Fu, (q1[s].y >> 4) & 0x0F0F0F0Fu,
                                  (q1[s].z >> 4) & 0x0F0F0F0Fu, (q1[s].w >> 4) & 0x0F0F0F0Fu);
            float ds0 = d * sc0, ds1 = d * sc1, dm0 = dmin * m0, dm1 = dmin * m1;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int8_t *xt = xq + (size_t)t * k + base;
                int4 a0 = *(const int4 *)xt, a1 = *(const int4 *)(xt + 16);
                int4 b0 = *(const int4 *)(xt + 32), b1 = *(const int4 *)(xt + 48);
                float2 x0 = xs[(size_t)t * nb + bl], x1 = xs[(size_t)t * nb + bl + 1];
                int dl = dot16_dp4a(l0, a0) + dot16_dp4a(l1, a1), dh = dot16_dp4a(h0, b0) + dot16_dp4a(h1, b1);
                acc[s][t] += ds0 * x0.x * (float)dl + ds1 * x1.x * (float)dh - (dm0 * x0.y + dm1 * x1.y);
            }
        }
    }
    store_slots<T>(acc, y, n, row0, R, lane);
}

/* GGUF -> packed scale order (cuda_q4k_scale_min), one thread per super-block, in place. */
__global__ void q4k_pack_kernel(uint8_t *W, size_t nsb) {
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < nsb) cuda_q4k_pack12(W + b * 144 + 4, W + b * 144 + 4);
}

hearth_status cuda_q4k_pack(cuda_weight *w, hearth_error *err) {
    if (!w || w->dtype != DT_Q4_K || !w->data || w->q4k_packed) return HEARTH_OK;
    size_t nsb = (size_t)w->n * (size_t)(w->k / 256);
    q4k_pack_kernel<<<(unsigned)((nsb + 255) / 256), 256, 0, cuda_stream()>>>((uint8_t *)w->data, nsb);
    if (cuda_launched("q4k_pack", err)) return HEARTH_ERR_IO;
    w->q4k_packed = 1;
    return HEARTH_OK;
}

/* Q6_K planes (layout: gemv_q6_k): 4 lanes per super-block; lane part (h, j) takes, for
 * each g < 4, the 16 weights 128h + 32g + 16j + [0, 16) (one sub-block scale, x block
 * 8 sb + 4h + g). The 6-bit values 0..63 become q - 32 per byte with __vsub4. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q6_k_i8(const uint8_t *QL, const uint8_t *QH, const int8_t *SC, const uint16_t *D, const int8_t *xq,
                 const float2 *xs, float *y, int n, int k, int R) {
    int warp = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * R;
    if (row0 >= n) return;
    int nsb = k / 256, nb = k / 32, part = lane % 4, h = part / 2, j = part % 2;
    pdl_wait();
    pdl_trigger();
    int lgR = R == 4 ? 2 : R == 2 ? 1 : 0, stride = 8 * (QSLOTS / R);
    float acc[QSLOTS][T];
#pragma unroll
    for (int s = 0; s < QSLOTS; s++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[s][t] = 0.0f;
    for (int sb0 = lane / 4; sb0 < nsb; sb0 += stride) {
        uint4 qa[QSLOTS], qb[QSLOTS], qh[QSLOTS];
        uint2 scw[QSLOTS];
        float d[QSLOTS];
        bool ok[QSLOTS];
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            int row = row0 + (s & (R - 1)), sb = sb0 + 8 * (s >> lgR);
            ok[s] = row < n && sb < nsb;
            if (ok[s]) {
                size_t bi = (size_t)row * nsb + sb;
                qa[s] = load_stream((const uint4 *)(QL + bi * 128 + 64 * h + 16 * j));
                qb[s] = load_stream((const uint4 *)(QL + bi * 128 + 64 * h + 32 + 16 * j));
                qh[s] = load_stream((const uint4 *)(QH + bi * 64 + 32 * h + 16 * j));
                scw[s] = __ldg((const uint2 *)(SC + bi * 16 + 8 * h));
                d[s] = half_bits(__ldg(D + bi), false);
            }
        }
#pragma unroll
        for (int s = 0; s < QSLOTS; s++) {
            if (!ok[s]) continue;
            int sb = sb0 + 8 * (s >> lgR), base = sb * 256 + 128 * h + 16 * j;
            uint32_t la[4] = {qa[s].x, qa[s].y, qa[s].z, qa[s].w}, lb[4] = {qb[s].x, qb[s].y, qb[s].z, qb[s].w},
                     hh[4] = {qh[s].x, qh[s].y, qh[s].z, qh[s].w};
#pragma unroll
            for (int g = 0; g < 4; g++) {
                int sbyte = j + 2 * g;
                uint32_t sw = sbyte < 4 ? scw[s].x : scw[s].y;
                float ds = d[s] * (float)(int8_t)((sw >> (8 * (sbyte & 3))) & 0xff);
                int q[4];
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    uint32_t lo = g % 2 ? lb[w] : la[w];
                    uint32_t v6 = ((lo >> (4 * (g / 2))) & 0x0F0F0F0Fu) | (((hh[w] >> (2 * g)) & 0x03030303u) << 4);
                    q[w] = (int)__vsub4(v6, 0x20202020u);
                }
#pragma unroll
                for (int t = 0; t < T; t++) {
                    int4 a = *(const int4 *)(xq + (size_t)t * k + base + 32 * g);
                    int sum = __dp4a(q[0], a.x, 0);
                    sum = __dp4a(q[1], a.y, sum);
                    sum = __dp4a(q[2], a.z, sum);
                    sum = __dp4a(q[3], a.w, sum);
                    acc[s][t] += ds * xs[(size_t)t * nb + sb * 8 + 4 * h + g].x * (float)sum;
                }
            }
        }
    }
    store_slots<T>(acc, y, n, row0, R, lane);
}

/* Rows per warp: as many as keep >= 4 blocks per SM of an H200 (132 SMs) in the grid. */
static int q8act_rows(int n) {
    int R = 4;
    while (R > 1 && (n + GEMV_WARPS * R - 1) / (GEMV_WARPS * R) < 4 * 132) R /= 2;
    return R;
}

/* Rows per warp for gemv_q4_k_i8p: enough that a row's 8-super-block steps fill the
 * QSLOTS slots (k = 4096: 2 steps, so 2 rows), but not so many that the grid drops below
 * 2 blocks per SM of an H200. */
static int q4k_rows(int n, int k) {
    int steps = (k / 256 + 7) / 8, R = 1;
    while (R < 4 && R * steps < QSLOTS && (n + GEMV_WARPS * 2 * R - 1) / (GEMV_WARPS * 2 * R) >= 2 * 132) R *= 2;
    return R;
}

/* batched: not a batch-invariant call (cuda_matmul_q8, cuda_gemv_mmq), so the kernel may
 * depend on T (cuda_gemv_v2_launch_rows). */
template <int T>
static void launch_i8(const cuda_weight *w, const int8_t *xq, const float2 *xs, float *y, int batched = 0) {
    if (cuda_gemv_mlx4_launch(&w, &y, 1, xq, xs, T)) return; /* every U32 weight that reaches here */
    if (batched ? cuda_gemv_v2_launch_rows(w, y, xq, xs, T) : cuda_gemv_v2_launch(&w, &y, 1, xq, xs, T))
        return; /* cuda_gemv_v2_takes */
    if (w->dtype == DT_AFFINE) {
        cuda_gemv_affine_launch(w, xq, xs, NULL, y, T);
        return;
    }
    int n = (int)w->n, k = (int)w->k;
    int R = w->dtype == DT_Q4_K ? q4k_rows(n, k) : q8act_rows(n);
    dim3 grid((unsigned)((n + GEMV_WARPS * R - 1) / (GEMV_WARPS * R))), block(GEMV_WARPS * 32);
    switch (w->dtype) {
    case DT_Q8_0:
        pdl_launch(gemv_q8_0_i8<T>, grid, block, (const int8_t *)w->data, (const uint16_t *)w->scales, xq, xs, y, n, k,
                   R, gemv_grouped{});
        break;
    case DT_Q4_K:
        pdl_launch(gemv_q4_k_i8p<T>, grid, block, (const uint8_t *)w->data, xq, xs, y, n, k, R);
        break;
    case DT_Q6_K: {
        size_t nk = (size_t)n * (size_t)k;
        const uint8_t *ql = (const uint8_t *)w->data;
        const int8_t *sc = (const int8_t *)w->scales;
        pdl_launch(gemv_q6_k_i8<T>, grid, block, ql, (const uint8_t *)(ql + nk / 2), sc,
                   (const uint16_t *)(sc + nk / 16), xq, xs, y, n, k, R);
        break;
    }
    default: break;
    }
}

/* Quantizes x[T, k] into the scratch; false (nothing launched) when the scratch is too
 * small and cannot grow now (inside a stream capture): the caller uses the float path. */
static bool quantize_x(const float *x, int T, int64_t k, hearth_error *err, hearth_status *st) {
    *st = HEARTH_OK;
    size_t need = (size_t)T * (size_t)k;
    if (need > g_xcap) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cuda_stream(), &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            cudaGetLastError();
            return false;
        }
        if ((*st = reserve_locked(need, err))) return false;
    }
    int nblocks = (int)(need / 32);
    pdl_launch(quantize_x_q8, dim3((unsigned)((nblocks + 7) / 8)), dim3(256), x, g_xq, g_xs, nblocks);
    if (cuda_launched("quantize_x_q8", err)) *st = HEARTH_ERR_IO;
    return *st == HEARTH_OK;
}

static bool gemv_i8_locked(const cuda_weight *const *ws, float *const *ys, int nw, const float *x, int T, int64_t k,
                           int mmq, hearth_error *err, hearth_status *st);

/* ys[i] = x · ws[i]^T for weights that all take int8 activations with the same k: x is
 * quantized once (mmq: launch_i8_all's). Returns false when it did nothing (use the float
 * kernels). */
static bool gemv_i8(const cuda_weight *const *ws, float *const *ys, int nw, const float *x, int T, int mmq,
                    hearth_error *err, hearth_status *st) {
    *st = HEARTH_OK;
    for (int i = 0; i < nw; i++)
        if (!cuda_gemv_int8_act(ws[i]) || ws[i]->k != ws[0]->k) return false;
    int64_t k = ws[0]->k;
    pthread_mutex_lock(&g_xlock);
    bool done = gemv_i8_locked(ws, ys, nw, x, T, k, mmq, err, st);
    pthread_mutex_unlock(&g_xlock);
    return done;
}

/* The GEMVs of ws on activations already quantized into xq0 / xs0; with mmq, the batched
 * tensor-core kernel (cuda_mmq.cu) for each weight it takes at T, in one launch. */
static hearth_status launch_i8_all(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq0,
                                   const float2 *xs0, int T, int64_t k, int mmq, hearth_error *err) {
    for (int i = 0; i < nw; i++) {
        if (mmq && cuda_mmq_launch(ws[i], xq0, xs0, ys[i], T)) {
            if (cuda_launched("mmq", err)) return HEARTH_ERR_IO;
            continue;
        }
        /* ws[i] and the v2 weights after it of the same format (q, k, v; gate, up) in one launch per
         * chunk (the v2 kernels' 16-byte activation loads: chunks start at even rows, so every
         * chunk is aligned when the first is) */
        int g = 1, aligned = ((uintptr_t)xq0 % 16) == 0 && ((uintptr_t)xs0 % 16) == 0;
        while (aligned && i + g < nw && g < 3 && (!mmq || !cuda_mmq_takes(ws[i + g], T)) &&
               (cuda_gemv_v2_groups(ws[i], ws[i + g]) || cuda_gemv_mlx4_groups(ws[i], ws[i + g])))
            g++;
        if (g > 1) {
            for (int t0 = 0; t0 < T;) {
                int c = T - t0 >= 8 ? 8 : T - t0 >= 4 ? 4 : T - t0;
                float *yc[3];
                for (int j = 0; j < g; j++) yc[j] = ys[i + j] + (size_t)t0 * ws[i + j]->n;
                const int8_t *xq = xq0 + (size_t)t0 * k;
                const float2 *xs = xs0 + (size_t)t0 * (k / 32);
                if (!cuda_gemv_mlx4_launch(ws + i, yc, g, xq, xs, c) && !cuda_gemv_v2_launch(ws + i, yc, g, xq, xs, c))
                    return err_set(err, HEARTH_ERR_INVALID, "gemv_i8: %d weights could not share a launch", g);
                if (cuda_launched("gemv_i8 group", err)) return HEARTH_ERR_IO;
                t0 += c;
            }
            i += g - 1;
            continue;
        }
        for (int t0 = 0; t0 < T;) {
            int c = T - t0 >= 8 ? 8 : T - t0 >= 4 ? 4 : T - t0;
            const int8_t *xq = xq0 + (size_t)t0 * k;
            const float2 *xs = xs0 + (size_t)t0 * (k / 32);
            float *yc = ys[i] + (size_t)t0 * ws[i]->n;
            switch (c) {
            case 8: launch_i8<8>(ws[i], xq, xs, yc, mmq); break;
            case 4: launch_i8<4>(ws[i], xq, xs, yc, mmq); break;
            case 3: launch_i8<3>(ws[i], xq, xs, yc, mmq); break;
            case 2: launch_i8<2>(ws[i], xq, xs, yc, mmq); break;
            default: launch_i8<1>(ws[i], xq, xs, yc, mmq); break;
            }
            if (cuda_launched("gemv_i8", err)) return HEARTH_ERR_IO;
            t0 += c;
        }
    }
    return HEARTH_OK;
}

static bool gemv_i8_locked(const cuda_weight *const *ws, float *const *ys, int nw, const float *x, int T, int64_t k,
                           int mmq, hearth_error *err, hearth_status *st) {
    if (!quantize_x(x, T, k, err, st)) return *st != HEARTH_OK;
    *st = launch_i8_all(ws, ys, nw, g_xq, g_xs, T, k, mmq, err);
    return true;
}

/* cuda_gemv_multi_q8 (mmq 0) and cuda_matmul_q8 (mmq 1): `what` names the caller in errors. */
static hearth_status multi_q8(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float *xs,
                              int T, int mmq, const char *what, hearth_error *err) {
    if (nw < 1 || !xq || !xs || T < 0) return err_set(err, HEARTH_ERR_INVALID, "%s: missing input", what);
    for (int i = 0; i < nw; i++)
        if (!ws[i] || !ws[i]->data || !ys[i] || !cuda_gemv_int8_act(ws[i]) || ws[i]->k != ws[0]->k ||
            ws[i]->n > INT32_MAX || ws[i]->k > INT32_MAX / 8)
            return err_set(err, HEARTH_ERR_INVALID, "%s: weight %d does not take int8 activations of k=%lld", what, i,
                           (long long)ws[0]->k);
    return launch_i8_all(ws, ys, nw, xq, (const float2 *)xs, T, ws[0]->k, mmq, err);
}

hearth_status cuda_gemv_multi_q8(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq,
                                 const float *xs, int T, hearth_error *err) {
    return multi_q8(ws, ys, nw, xq, xs, T, 0, "cuda_gemv_multi_q8", err);
}

hearth_status cuda_matmul_q8(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float *xs,
                             int T, hearth_error *err) {
    return multi_q8(ws, ys, nw, xq, xs, T, 1, "cuda_matmul_q8", err);
}

/* cuda_gemv; mmq: cuda_gemv_mmq. */
static hearth_status gemv_any(const cuda_weight *w, const float *x, int T, float *y, int mmq, hearth_error *err) {
    if (!w || !w->data || !x || !y || T < 0)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv: missing weight or buffer");
    if (w->n > INT32_MAX || w->k > INT32_MAX / 8)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_gemv: weight [%lld, %lld] too large", (long long)w->n,
                       (long long)w->k);
    /* Vector loads need 16-byte aligned rows of x (k % 4 floats) and of W (k % 8 halves);
     * the quantized formats already guarantee k % 32 == 0. */
    bool vec = w->k % 8 == 0 && ((uintptr_t)x % 16) == 0;
    if ((w->dtype == DT_Q8_0 || w->dtype == DT_Q4_K || w->dtype == DT_Q6_K || w->dtype == DT_U32 ||
         w->dtype == DT_AFFINE) &&
        ((uintptr_t)x % 16) != 0)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv: activations must be 16-byte aligned for %s",
                       tensor_dtype_name(w->dtype));
    hearth_status st;
    if (T > 0 && gemv_i8(&w, &y, 1, x, T, mmq, err, &st)) return st;
    for (int t0 = 0; t0 < T;) {
        int c = T - t0 >= 8 ? 8 : T - t0 >= 4 ? 4 : T - t0;
        const float *xc = x + (size_t)t0 * w->k;
        float *yc = y + (size_t)t0 * w->n;
        switch (c) {
        case 8: launch_rows<8>(w, xc, yc, vec); break;
        case 4: launch_rows<4>(w, xc, yc, vec); break;
        case 3: launch_rows<3>(w, xc, yc, vec); break;
        case 2: launch_rows<2>(w, xc, yc, vec); break;
        default: launch_rows<1>(w, xc, yc, vec); break;
        }
        if (cuda_launched("gemv", err)) return HEARTH_ERR_IO;
        t0 += c;
    }
    return HEARTH_OK;
}

hearth_status cuda_gemv(const cuda_weight *w, const float *x, int T, float *y, hearth_error *err) {
    return gemv_any(w, x, T, y, 0, err);
}

hearth_status cuda_gemv_mmq(const cuda_weight *w, const float *x, int T, float *y, hearth_error *err) {
    return gemv_any(w, x, T, y, 1, err);
}

hearth_status cuda_gemv_multi(const cuda_weight *const *ws, float *const *ys, int nw, const float *x, int T,
                              hearth_error *err) {
    if (nw < 1 || nw > 3) return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_multi: %d weights (1 to 3)", nw);
    bool fused = ((uintptr_t)x % 16) == 0 && ws[0]->k % 8 == 0 && (ws[0]->dtype == DT_BF16 || ws[0]->dtype == DT_F16);
    long long rows = 0;
    for (int i = 0; i < nw; i++) {
        if (!ws[i] || !ws[i]->data || !ys[i]) return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_multi: missing weight");
        fused = fused && ws[i]->dtype == ws[0]->dtype && ws[i]->k == ws[0]->k;
        rows += ws[i]->n;
    }
    if (!fused || rows > INT32_MAX || ws[0]->k > INT32_MAX / 8) {
        hearth_status st;
        bool small = ((uintptr_t)x % 16) == 0 && ws[0]->k <= INT32_MAX / 8;
        for (int i = 0; i < nw; i++) small = small && ws[i]->n <= INT32_MAX;
        if (small && T > 0 && gemv_i8(ws, ys, nw, x, T, 0, err, &st)) return st; /* x quantized once */
        for (int i = 0; i < nw; i++)
            if (cuda_gemv(ws[i], x, T, ys[i], err)) return HEARTH_ERR_INVALID;
        return HEARTH_OK;
    }
    for (int t0 = 0; t0 < T;) {
        int c = T - t0 >= 8 ? 8 : T - t0 >= 4 ? 4 : T - t0;
        const float *xc = x + (size_t)t0 * ws[0]->k;
        float *yc[3];
        for (int i = 0; i < nw; i++) yc[i] = ys[i] + (size_t)t0 * ws[i]->n;
        switch (c) {
        case 8: launch_half_segs<8>(ws, yc, nw, xc); break;
        case 4: launch_half_segs<4>(ws, yc, nw, xc); break;
        case 3: launch_half_segs<3>(ws, yc, nw, xc); break;
        case 2: launch_half_segs<2>(ws, yc, nw, xc); break;
        default: launch_half_segs<1>(ws, yc, nw, xc); break;
        }
        if (cuda_launched("gemv_multi", err)) return HEARTH_ERR_IO;
        t0 += c;
    }
    return HEARTH_OK;
}

int cuda_gemv_experts_takes(const cuda_weight *w) {
    if (!w || w->k % 32 || w->n > INT32_MAX / 4 || w->k > INT32_MAX / 8) return 0;
    if ((w->dtype == DT_Q4_K && w->q4k_packed) || w->dtype == DT_Q6_K) return w->k % 256 == 0;
    return w->dtype == DT_Q8_0 || cuda_mlx4_int8_takes(w) || (w->dtype == DT_AFFINE && !w->aff_f32act);
}

/* The grouped Q8_0 GEMV of one table (the rows per warp of launch_i8's: the same bits). */
static void q8_0_experts(const cuda_expert_table *tab, float *y, const int32_t *sel, int P, int xdiv) {
    int n = (int)tab->proto->n, k = (int)tab->proto->k, R = q8act_rows(n);
    dim3 grid((unsigned)((n + GEMV_WARPS * R - 1) / (GEMV_WARPS * R)), (unsigned)P), block(GEMV_WARPS * 32);
    const int8_t *none = NULL;
    const uint16_t *no_d = NULL;
    pdl_launch(gemv_q8_0_i8<1, true>, grid, block, none, no_d, (const int8_t *)g_xq, (const float2 *)g_xs, y, n, k, R,
               gemv_grouped{sel, tab->data, tab->scales, xdiv});
}

hearth_status cuda_gemv_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P,
                                int xdiv, const float *x, hearth_error *err) {
    if (nw < 1 || nw > 2 || P < 1 || xdiv < 1 || P > 65535 || !sel || !x)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_experts: %d tables, %d pairs", nw, P);
    for (int i = 0; i < nw; i++)
        if (!tabs[i].proto || !tabs[i].data || !ys[i] || !cuda_gemv_experts_takes(tabs[i].proto) ||
            tabs[i].proto->k != tabs[0].proto->k)
            return err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_experts: table %d is not a grouped-GEMV format", i);
    hearth_status st = HEARTH_OK;
    int64_t k = tabs[0].proto->k;
    pthread_mutex_lock(&g_xlock);
    if (quantize_x(x, (P + xdiv - 1) / xdiv, k, err, &st)) {
        /* both tables in one launch where a kernel takes them together (same format and
         * layout), else one table at a time (every format cuda_gemv_experts_takes has a kernel) */
        int done = nw == 2 && (cuda_gemv_v2_experts(tabs, 2, ys, sel, P, xdiv, g_xq, g_xs) ||
                               cuda_gemv_mlx4_experts(tabs, 2, ys, sel, P, xdiv, g_xq, g_xs));
        for (int i = 0; !done && !st && i < nw; i++) {
            const cuda_expert_table *t = &tabs[i];
            int one = cuda_gemv_v2_experts(t, 1, &ys[i], sel, P, xdiv, g_xq, g_xs) ||
                      cuda_gemv_mlx4_experts(t, 1, &ys[i], sel, P, xdiv, g_xq, g_xs) ||
                      cuda_gemv_affine_experts(t, ys[i], sel, P, xdiv, g_xq, g_xs);
            if (!one && t->proto->dtype == DT_Q8_0) {
                q8_0_experts(t, ys[i], sel, P, xdiv);
                one = 1;
            }
            if (!one)
                st = err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_experts: no grouped kernel for %s",
                             tensor_dtype_name(t->proto->dtype));
        }
        if (!st) st = cuda_launched("gemv_experts", err);
    } else if (!st) {
        st =
            err_set(err, HEARTH_ERR_INVALID, "cuda_gemv_experts: the int8 scratch is too small inside a graph capture");
    }
    pthread_mutex_unlock(&g_xlock);
    return st;
}
