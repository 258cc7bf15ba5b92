/* cuda_dequant.cuh: one weight element, or eight consecutive ones of a row, as float from
 * a weight in its device layout (cuda_weight): the arithmetic of the GEMV kernels and of
 * ggml's / MLX's reference dequantizers, shared by the dequantize-then-cuBLAS prefill path
 * (cuda_gemm.cu) and the grouped expert GEMM (cuda_moe_gemm.cu), so both read a weight
 * alike. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_DEQUANT_CUH
#define HEARTH_BACKEND_CUDA_DEQUANT_CUH
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_affine.h"
}
#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Element (r, c) of a weight in its device layout (cuda_weight), as float: the same
 * arithmetic as the GEMV kernels and ggml's reference dequantizers. */
static __device__ float weight_elem(tensor_dtype dt, const void *data, const void *scales, int64_t k, int64_t r,
                                    int64_t c, int q4k_packed) {
    switch (dt) {
    case DT_F32: return ((const float *)data)[r * k + c];
    case DT_F16: return h2f(((const uint16_t *)data)[r * k + c]);
    case DT_BF16: return __uint_as_float((uint32_t)((const uint16_t *)data)[r * k + c] << 16);
    case DT_Q8_0: return h2f(((const uint16_t *)scales)[(r * k + c) / 32]) * (float)((const int8_t *)data)[r * k + c];
    case DT_Q4_K: {
        const uint8_t *blk = (const uint8_t *)data + (r * (k / 256) + c / 256) * 144;
        int j = (int)(c % 256), chunk = j / 64, l = j % 64, sub = 2 * chunk + (l >= 32);
        int s, m;
        cuda_q4k_scale_min(blk + 4, sub, q4k_packed, &s, &m);
        uint8_t q = blk[16 + 32 * chunk + (l % 32)];
        int v = l < 32 ? (q & 0xF) : (q >> 4);
        float d = h2f((uint16_t)(blk[0] | blk[1] << 8)), dmin = h2f((uint16_t)(blk[2] | blk[3] << 8));
        return d * (float)s * (float)v - dmin * (float)m;
    }
    default: return 0.0f;
    }
}

/* MLX affine 4-bit element: nibble c % 8 of word c / 8, times the group's scale plus its
 * bias, rounded as mx.dequantize and kernels_ref.c do (no fused multiply-add). */
static __device__ float mlx4_elem(const cuda_weight &w, int64_t r, int64_t c) {
    int64_t wi;
    int shift;
    cuda_mlx4_nibble(c, w.mlx_tiled, &wi, &shift);
    uint32_t word = ((const uint32_t *)w.data)[r * (w.k / 8) + wi];
    uint32_t sb = ((const uint32_t *)w.scales)[r * (w.k / w.group_size) + c / w.group_size];
    float s = w.sb_bf16 ? __uint_as_float(sb << 16) : h2f((uint16_t)(sb & 0xffff));
    float b = w.sb_bf16 ? __uint_as_float(sb & 0xffff0000u) : h2f((uint16_t)(sb >> 16));
    return __fadd_rn(__fmul_rn(s, (float)((word >> shift) & 0xF)), b);
}

/* Q6_K element from the split planes (cuda_weight): the arithmetic of ggml's reference
 * (d times the int8 sub-block scale, then times q - 32). */
static __device__ float q6k_elem(const cuda_weight &w, int64_t r, int64_t c) {
    size_t nk = (size_t)w.n * (size_t)w.k, bi = (size_t)(r * (w.k / 256) + c / 256);
    const uint8_t *ql = (const uint8_t *)w.data, *qh = ql + nk / 2;
    const int8_t *sc = (const int8_t *)w.scales;
    const uint16_t *D = (const uint16_t *)(sc + nk / 16);
    int i = (int)(c % 256), h = i / 128, rr = i % 128;
    int lo = (ql[bi * 128 + 64 * h + rr % 64] >> (4 * (rr / 64))) & 0xF;
    int hi = (qh[bi * 64 + 32 * h + rr % 32] >> (2 * (rr / 32))) & 3;
    float dl = h2f(D[bi]) * (float)sc[(size_t)r * (w.k / 16) + c / 16];
    return dl * (float)((lo | (hi << 4)) - 32);
}

/* Element (r, c) of the generic affine layout (cuda_affine.h): code · scale + bias, rounded
 * once as the reference dequantizers do. */
static __device__ float aff_elem(const cuda_weight &w, int64_t r, int64_t c) {
    int lo = cuda_affine_lo_bits(w.aff_bits), hi = w.aff_bits - lo, word, bit;
    size_t chunk = (size_t)(r * (w.k / 32) + c / 32);
    const uint32_t *pl = (const uint32_t *)w.data;
    cuda_affine_slot((int)(c % 32), lo, &word, &bit);
    uint32_t code = (pl[chunk * lo + word] >> bit) & ((1u << lo) - 1);
    if (hi) {
        cuda_affine_slot((int)(c % 32), hi, &word, &bit);
        code |= ((pl[(size_t)w.n * (size_t)(w.k / 32) * lo + chunk * hi + word] >> bit) & ((1u << hi) - 1)) << lo;
    }
    float2 p = ((const float2 *)w.scales)[r * (w.k / w.group_size) + c / w.group_size];
    return __fadd_rn(__fmul_rn((float)code, p.x), p.y);
}

/* Element (r, c) of any layout. */
static __device__ __forceinline__ float dq_elem(const cuda_weight &w, int64_t r, int64_t c) {
    return w.dtype == DT_U32      ? mlx4_elem(w, r, c)
           : w.dtype == DT_AFFINE ? aff_elem(w, r, c)
           : w.dtype == DT_Q6_K   ? q6k_elem(w, r, c)
                                  : weight_elem(w.dtype, w.data, w.scales, w.k, r, c, w.q4k_packed);
}

/* The generic affine layout (cuda_affine.h): elements c .. c + 7 of row r (c % 8 == 0, so
 * one group's scale and bias): two words of codes per plane, code · scale + bias rounded as
 * aff_elem rounds it (the per-quad bf16 dequantizer's extraction, bits chosen at run time). */
static __device__ __forceinline__ void dq_affine8(const cuda_weight &w, int64_t r, int64_t c, float (&v)[8]) {
    const int bits = w.aff_bits, LO = bits == 8 ? 8 : bits >= 4 ? 4 : 2, HI = bits - LO, HN = HI > 0 ? HI : 1;
    const uint32_t *pl = (const uint32_t *)w.data;
    size_t chunks = (size_t)(w.k / 32), chunk = (size_t)r * chunks + (size_t)(c / 32);
    const uint32_t *hp = pl + (size_t)w.n * chunks * (size_t)LO;
    const uint32_t lmask = (LO == 8 ? 0xffu : (1u << LO) - 1u) * 0x01010101u, hmask = ((1u << HN) - 1u) * 0x01010101u;
    float2 p = ((const float2 *)w.scales)[(size_t)r * (size_t)(w.k / w.group_size) + (size_t)(c / w.group_size)];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int m = (int)(c % 32) / 4 + h;
        uint32_t code = (pl[chunk * LO + m % LO] >> (LO * (m / LO))) & lmask;
        if (HI > 0) code |= ((hp[chunk * HN + m % HN] >> (HN * (m / HN))) & hmask) << LO;
#pragma unroll
        for (int j = 0; j < 4; j++) v[4 * h + j] = __fadd_rn(__fmul_rn((float)((code >> (8 * j)) & 0xffu), p.x), p.y);
    }
}

/* Q8_0 / Q4_K / Q6_K: elements e .. e + 7 (e % 8 == 0) of the flat device layout
 * (cuda_plan.c cuda_weight_layout: flat over rows, so element e's block, sub-block and
 * scale follow from e alone, no division by k; the eight quants are one 8-byte load, or
 * 8 + 8 for Q6_K). Same per-element arithmetic as weight_elem / q6k_elem: a test compares
 * the two bit for bit. */
template <int DT> static __device__ __forceinline__ void dq_flat8(const cuda_weight &w, size_t e, float (&v)[8]) {
    if (DT == DT_Q8_0) {
        uint2 q = *(const uint2 *)((const int8_t *)w.data + e);
        float d = h2f(((const uint16_t *)w.scales)[e / 32]);
        const int8_t *qb = (const int8_t *)&q;
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = d * (float)qb[u];
    } else if (DT == DT_Q4_K) {
        const uint8_t *blk = (const uint8_t *)w.data + (e / 256) * 144;
        int j = (int)(e % 256), chunk = j / 64, l = j % 64, sub = 2 * chunk + (l >= 32);
        int sc, m;
        cuda_q4k_scale_min(blk + 4, sub, w.q4k_packed, &sc, &m);
        uint2 q = *(const uint2 *)(blk + 16 + 32 * chunk + (l % 32));
        const uint8_t *qb = (const uint8_t *)&q;
        uint32_t dd = *(const uint32_t *)blk;
        float d = h2f((uint16_t)(dd & 0xffff)), dmin = h2f((uint16_t)(dd >> 16));
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int x = l < 32 ? (qb[u] & 0xF) : (qb[u] >> 4);
            v[u] = d * (float)sc * (float)x - dmin * (float)m;
        }
    } else { /* DT_Q6_K */
        size_t nk = (size_t)w.n * (size_t)w.k, bi = e / 256;
        const uint8_t *ql = (const uint8_t *)w.data, *qh = ql + nk / 2;
        const int8_t *scp = (const int8_t *)w.scales;
        const uint16_t *D = (const uint16_t *)(scp + nk / 16);
        int i = (int)(e % 256), h = i / 128, rr = i % 128;
        uint2 lo8 = *(const uint2 *)(ql + bi * 128 + 64 * h + rr % 64);
        uint2 hi8 = *(const uint2 *)(qh + bi * 64 + 32 * h + rr % 32);
        const uint8_t *lb = (const uint8_t *)&lo8, *hb = (const uint8_t *)&hi8;
        float dl = h2f(D[bi]) * (float)scp[e / 16];
        int ls = 4 * (rr / 64), hs = 2 * (rr / 32);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int lo = (lb[u] >> ls) & 0xF, hi = (hb[u] >> hs) & 3;
            v[u] = dl * (float)((lo | (hi << 4)) - 32);
        }
    }
}

#endif
