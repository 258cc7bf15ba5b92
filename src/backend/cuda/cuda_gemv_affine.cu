/* cuda_gemv_affine.cu: decode GEMV and the bf16 dequantizer for the generic affine layout
 * (DT_AFFINE, cuda_affine.h: MLX 2/3/5/6/8-bit, GGUF Q5_0/Q5_1/Q2_K/Q3_K/Q5_K). One warp per
 * output row; lane L takes chunks L, L + 32, ... of 32 weights, four chunks' loads (eight
 * for 8-bit codes: aff_depth) issued before any is used, the first batch before the PDL
 * wait. A chunk's codes come out as bytes, four weights per shift-and-mask,
 * and meet the int8 activations of the same block of 32 in __dp4a (unsigned codes times
 * signed activations: PTX dp4a.u32.s32), so
 *   y += scale · d_x · Σ code·q_x + bias · d_x · Σ q_x
 * per group (cuda_gemv_int8_act's contract). The float kernel (the exact tier's aff_f32act,
 * or inside a capture whose int8 scratch is too small) does the same with float activations. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_affine.h"
}
/* the int8 GEMV is a programmatic dependent on sm_90+ (pdl_on): its first chunks' weight
 * and pair loads go out before it waits for the activations */
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include <cuda_bf16.h>
#include <stdint.h>

#define AFF_WARPS 4 /* rows per block of 128 threads, as cuda_gemv.cu's GEMV_WARPS */

/* Chunks per lane whose loads are in flight together in the int8 GEMV: 8 for 8-bit codes,
 * 4 below (the 20-byte chunks of Q5_K keep enough bytes in flight at 4, and 8 is slower
 * there; bench/results/kernel_choices.md, "CUDA int8 GEMV depth"). */
template <int BITS>
struct aff_depth {
    static constexpr int U = BITS == 8 ? 8 : 4;
};

static __device__ __forceinline__ float aff_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* A chunk's plane words: LO words of the low plane, HI of the high one (HI may be 0). */
template <int BITS>
struct aff_chunk {
    static constexpr int LO = BITS == 8 ? 8 : BITS >= 4 ? 4 : 2, HI = BITS - LO, HN = HI > 0 ? HI : 1;
    uint32_t lo[LO], hi[HN];
    __device__ __forceinline__ void load(const uint32_t *lp, const uint32_t *hp, size_t chunk) {
        const uint32_t *l = lp + chunk * LO;
        if constexpr (LO == 8) {
            uint4 a = __ldg((const uint4 *)l), b = __ldg((const uint4 *)l + 1);
            lo[0] = a.x, lo[1] = a.y, lo[2] = a.z, lo[3] = a.w, lo[4] = b.x, lo[5] = b.y, lo[6] = b.z, lo[7] = b.w;
        } else if constexpr (LO == 4) {
            uint4 a = __ldg((const uint4 *)l);
            lo[0] = a.x, lo[1] = a.y, lo[2] = a.z, lo[3] = a.w;
        } else {
            uint2 a = __ldg((const uint2 *)l);
            lo[0] = a.x, lo[1] = a.y;
        }
        if constexpr (HI == 2) {
            uint2 a = __ldg((const uint2 *)(hp + chunk * 2));
            hi[0] = a.x, hi[1] = a.y;
        } else if constexpr (HI == 1) {
            hi[0] = __ldg(hp + chunk);
        }
    }
    /* The codes of weights 4m .. 4m + 3, one per byte (cuda_affine_slot). */
    __device__ __forceinline__ uint32_t codes(int m) const {
        uint32_t c = (lo[m % LO] >> (LO * (m / LO))) & (((1u << LO) - 1) * 0x01010101u);
        if constexpr (HI > 0) c |= ((hi[m % HN] >> (HN * (m / HN))) & (((1u << HN) - 1) * 0x01010101u)) << LO;
        return c;
    }
};

/* The (scale, bias) pairs of chunk c: one (G >= 32) or two (G = 16). */
template <int G>
static __device__ __forceinline__ float4 aff_pairs(const float2 *sb, size_t row, int k, int c) {
    if (G == 16) return __ldg((const float4 *)(sb + row * (size_t)(k / 16) + 2 * (size_t)c));
    float2 p = __ldg(sb + row * (size_t)(k / G) + (size_t)c * 32 / G);
    return make_float4(p.x, p.y, 0.0f, 0.0f);
}

/* Row row's words in the low plane (*lp) and the high plane (*hp). */
template <int BITS>
static __device__ __forceinline__ void aff_row_planes(const uint32_t *planes, int n, int chunks, int row,
                                                      const uint32_t **lp, const uint32_t **hp) {
    constexpr int LO = aff_chunk<BITS>::LO, HI = aff_chunk<BITS>::HI;
    *lp = planes + (size_t)row * chunks * LO;
    *hp = planes + (size_t)n * chunks * LO + (size_t)row * chunks * HI;
}

template <int T, int BITS, int G, bool GR = false>
__global__ void __launch_bounds__(AFF_WARPS * 32)
    gemv_affine_i8(const uint32_t *planes, const float2 *sb, const int8_t *xq, const float2 *xs, float *y, int n, int k,
                   gemv_grouped gp) {
    constexpr int U = aff_depth<BITS>::U;
    int row = blockIdx.x * AFF_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, chunks = k / 32;
    if (GR) gemv_grouped_pair(gp, planes, sb, xq, xs, y, n, k);
    if (row >= n) {
        pdl_wait();
        return;
    }
    const uint32_t *lp, *hp;
    aff_row_planes<BITS>(planes, n, chunks, row, &lp, &hp);
    float acc[T] = {};
    aff_chunk<BITS> ch[U];
    float4 p[U];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                ch[u].load(lp, hp, (size_t)c);
                p[u] = aff_pairs<G>(sb, (size_t)row, k, c);
            }
        }
    };
    load(lane); /* weights: no kernel writes them, so before the wait */
    pdl_wait(); /* xq / xs come from the kernel before */
    pdl_trigger();
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks) break;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int4 *xv = (const int4 *)(xq + (size_t)t * k + (size_t)c * 32);
                int4 a = __ldg(xv), b = __ldg(xv + 1);
                int q[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                float2 d = __ldg(xs + (size_t)t * chunks + c);
                if (G == 16) {
                    int d0 = 0, d1 = 0, s0 = 0, s1 = 0;
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        d0 = dp4a_us(ch[u].codes(m), q[m], d0);
                        s0 = __dp4a(0x01010101, q[m], s0);
                        d1 = dp4a_us(ch[u].codes(m + 4), q[m + 4], d1);
                        s1 = __dp4a(0x01010101, q[m + 4], s1);
                    }
                    acc[t] += d.x * (p[u].x * (float)d0 + p[u].y * (float)s0 + p[u].z * (float)d1 + p[u].w * (float)s1);
                } else {
                    int dot = 0;
#pragma unroll
                    for (int m = 0; m < 8; m++) dot = dp4a_us(ch[u].codes(m), q[m], dot);
                    acc[t] += p[u].x * d.x * (float)dot + p[u].y * d.y;
                }
            }
        }
        if (c0 + 32 * U < chunks) load(c0 + 32 * U);
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float s = aff_warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * n + row] = s;
    }
}

template <int T, int BITS, int G>
__global__ void __launch_bounds__(AFF_WARPS * 32)
    gemv_affine_f32(const uint32_t *planes, const float2 *sb, const float *x, float *y, int n, int k) {
    int row = blockIdx.x * AFF_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, chunks = k / 32;
    if (row >= n) return;
    const uint32_t *lp, *hp;
    aff_row_planes<BITS>(planes, n, chunks, row, &lp, &hp);
    float acc[T] = {};
    for (int c = lane; c < chunks; c += 32) {
        aff_chunk<BITS> ch;
        ch.load(lp, hp, (size_t)c);
        float4 p = aff_pairs<G>(sb, (size_t)row, k, c);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float4 *xv = (const float4 *)(x + (size_t)t * k + (size_t)c * 32);
            float dq[2] = {0.0f, 0.0f}, sx[2] = {0.0f, 0.0f};
#pragma unroll
            for (int m = 0; m < 8; m++) {
                uint32_t cm = ch.codes(m);
                float4 a = xv[m];
                int h = G == 16 ? m / 4 : 0;
                dq[h] += (float)(cm & 0xff) * a.x + (float)((cm >> 8) & 0xff) * a.y + (float)((cm >> 16) & 0xff) * a.z +
                         (float)(cm >> 24) * a.w;
                sx[h] += (a.x + a.y) + (a.z + a.w);
            }
            acc[t] += p.x * dq[0] + p.y * sx[0] + (G == 16 ? p.z * dq[1] + p.w * sx[1] : 0.0f);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float s = aff_warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * n + row] = s;
    }
}

/* bits and group of a device weight into one of the instantiated kernels. */
template <int T, int BITS>
static void launch_bits(const cuda_weight *w, const int8_t *xq, const float2 *xs, const float *x, float *y) {
    int n = (int)w->n, k = (int)w->k;
    dim3 grid((unsigned)((n + AFF_WARPS - 1) / AFF_WARPS)), block(AFF_WARPS * 32);
    const uint32_t *pl = (const uint32_t *)w->data;
    const float2 *sb = (const float2 *)w->scales;
    cudaStream_t s = cuda_stream();
#define AFF_GO(G)                                                                                                      \
    do {                                                                                                               \
        if (xq)                                                                                                        \
            pdl_launch(gemv_affine_i8<T, BITS, G>, grid, block, pl, sb, xq, xs, y, n, k, gemv_grouped{});              \
        else                                                                                                           \
            gemv_affine_f32<T, BITS, G><<<grid, block, 0, s>>>(pl, sb, x, y, n, k);                                    \
    } while (0)
    switch (w->group_size) {
    case 16: AFF_GO(16); break;
    case 32: AFF_GO(32); break;
    case 64: AFF_GO(64); break;
    default: AFF_GO(128); break; /* cuda_affine_takes: 16, 32, 64 or 128 */
    }
#undef AFF_GO
}

template <int T>
static void launch_t(const cuda_weight *w, const int8_t *xq, const float2 *xs, const float *x, float *y) {
    switch (w->aff_bits) {
    case 2: launch_bits<T, 2>(w, xq, xs, x, y); break;
    case 3: launch_bits<T, 3>(w, xq, xs, x, y); break;
    case 4: launch_bits<T, 4>(w, xq, xs, x, y); break;
    case 5: launch_bits<T, 5>(w, xq, xs, x, y); break;
    case 6: launch_bits<T, 6>(w, xq, xs, x, y); break;
    default: launch_bits<T, 8>(w, xq, xs, x, y); break;
    }
}

void cuda_gemv_affine_launch(const cuda_weight *w, const int8_t *xq, const float2 *xs, const float *x, float *y,
                             int T) {
    switch (T) {
    case 8: launch_t<8>(w, xq, xs, x, y); break;
    case 4: launch_t<4>(w, xq, xs, x, y); break;
    case 3: launch_t<3>(w, xq, xs, x, y); break;
    case 2: launch_t<2>(w, xq, xs, x, y); break;
    default: launch_t<1>(w, xq, xs, x, y); break;
    }
}

/* The grouped launch of one bits / group pair (a pair per blockIdx.y). */
template <int BITS>
static void launch_experts_bits(const cuda_expert_table *tab, float *y, const int32_t *sel, int P, int xdiv,
                                const int8_t *xq, const float2 *xs) {
    const cuda_weight *w = tab->proto;
    int n = (int)w->n, k = (int)w->k;
    dim3 grid((unsigned)((n + AFF_WARPS - 1) / AFF_WARPS), (unsigned)P), block(AFF_WARPS * 32);
    gemv_grouped gp = {sel, tab->data, tab->scales, xdiv};
    const uint32_t *none = NULL;
    const float2 *no_sb = NULL;
    switch (w->group_size) {
    case 16: pdl_launch(gemv_affine_i8<1, BITS, 16, true>, grid, block, none, no_sb, xq, xs, y, n, k, gp); break;
    case 32: pdl_launch(gemv_affine_i8<1, BITS, 32, true>, grid, block, none, no_sb, xq, xs, y, n, k, gp); break;
    case 64: pdl_launch(gemv_affine_i8<1, BITS, 64, true>, grid, block, none, no_sb, xq, xs, y, n, k, gp); break;
    default: pdl_launch(gemv_affine_i8<1, BITS, 128, true>, grid, block, none, no_sb, xq, xs, y, n, k, gp); break;
    }
}

int cuda_gemv_affine_experts(const cuda_expert_table *tab, float *y, const int32_t *sel, int P, int xdiv,
                             const int8_t *xq, const float2 *xs) {
    const cuda_weight *w = tab->proto;
    if (w->dtype != DT_AFFINE || w->aff_f32act || w->k % 32 || !tab->scales) return 0;
    switch (w->aff_bits) {
    case 2: launch_experts_bits<2>(tab, y, sel, P, xdiv, xq, xs); break;
    case 3: launch_experts_bits<3>(tab, y, sel, P, xdiv, xq, xs); break;
    case 4: launch_experts_bits<4>(tab, y, sel, P, xdiv, xq, xs); break;
    case 5: launch_experts_bits<5>(tab, y, sel, P, xdiv, xq, xs); break;
    case 6: launch_experts_bits<6>(tab, y, sel, P, xdiv, xq, xs); break;
    default: launch_experts_bits<8>(tab, y, sel, P, xdiv, xq, xs); break;
    }
    return 1;
}

/* ---------- bf16 dequantization (the prefill path's cuBLAS operand) ----------
 * One thread per four consecutive weights (one word of codes per plane); value =
 * code · scale + bias, rounded once as the reference dequantizers do, then to bf16. */
template <int BITS>
__global__ void dequant_affine_bf16(const uint32_t *planes, const float2 *sb, uint2 *out, size_t quads, int n, int k,
                                    int g) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= quads) return;
    constexpr int LO = aff_chunk<BITS>::LO, HI = aff_chunk<BITS>::HI, HN = aff_chunk<BITS>::HN;
    size_t e = i * 4, chunk = e / 32; /* chunks run over rows in order: chunk = row * k / 32 + c */
    int m = (int)(e % 32) / 4;
    uint32_t c = (__ldg(planes + chunk * LO + m % LO) >> (LO * (m / LO))) & (((1u << LO) - 1) * 0x01010101u);
    if constexpr (HI > 0) {
        const uint32_t *hp = planes + (size_t)n * (size_t)(k / 32) * LO;
        c |= ((__ldg(hp + chunk * HN + m % HN) >> (HN * (m / HN))) & (((1u << HN) - 1) * 0x01010101u)) << LO;
    }
    size_t row = e / (size_t)k, col = e % (size_t)k;
    float2 p = __ldg(sb + row * (size_t)(k / g) + col / (size_t)g); /* four weights never straddle a group */
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = __fadd_rn(__fmul_rn((float)((c >> (8 * j)) & 0xff), p.x), p.y);
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    out[i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
}

void cuda_dequant_affine_launch(const cuda_weight *w, void *out) {
    size_t quads = (size_t)w->n * (size_t)w->k / 4;
    unsigned grid = (unsigned)((quads + 255) / 256);
    const uint32_t *pl = (const uint32_t *)w->data;
    const float2 *sb = (const float2 *)w->scales;
    int n = (int)w->n, k = (int)w->k, g = w->group_size;
    cudaStream_t s = cuda_stream();
    switch (w->aff_bits) {
    case 2: dequant_affine_bf16<2><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    case 3: dequant_affine_bf16<3><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    case 4: dequant_affine_bf16<4><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    case 5: dequant_affine_bf16<5><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    case 6: dequant_affine_bf16<6><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    default: dequant_affine_bf16<8><<<grid, 256, 0, s>>>(pl, sb, (uint2 *)out, quads, n, k, g); break;
    }
}
