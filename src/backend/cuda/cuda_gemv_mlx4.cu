/* cuda_gemv_mlx4.cu: the decode GEMV for MLX affine 4-bit weights (DT_U32) on int8
 * activations with __dp4a, on the chunked nibble layout (cuda_mlx4_nibble); weights of other
 * shapes keep the tiled layout and the float kernels of cuda_gemv.cu. Same contract as the other
 * int8-activation GEMVs (xq / xs as quantize_x_q8 writes them); called only from
 * cuda_gemv.cu, which keeps the float kernels for the weights this file does not take.
 * Must not allocate or sync. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* A group's (scale, bias) word (cuda_weight: scale in the low half) as two floats. */
template <bool BF16> static __device__ __forceinline__ float2 mlx4_scale_bias(uint32_t sb) {
    if (BF16) return make_float2(__uint_as_float(sb << 16), __uint_as_float(sb & 0xffff0000u));
    __half2 p;
    memcpy(&p, &sb, 4);
    return __half22float2(p);
}

/* gemv_v3_mlx4: the chunked layout (cuda_mlx4_nibble, tiled == 2), read as gemv_v2_q4_k
 * reads Q4_K. The math: w = s * q + b per group (q in 0..15), x ≈ d_x * qx per int8 block
 * of 32, so a block's share of the row is s * d_x * Σ q·qx + b * (d_x * Σ qx): one exact
 * int32 dp4a sum and the block's xs pair (d_x, d_x * Σ qx).
 *
 * A chunk of 64 weights is 32 bytes, byte i holding weight i (low nibble) and 32 + i (high), so the 16-byte vector h of chunk c holds the runs 64c + 16h + [0, 16) (low
 * nibbles, int8 block 2c) and 64c + 32 + 16h + [0, 16) (high nibbles, block 2c + 1). Lane L
 * reads vector L of each 512-byte slot (chunk L / 2, h = L % 2): every warp load is 512
 * contiguous weight bytes, and each run's activations one contiguous 16-byte load (the
 * warp's: 1 KB contiguous per run). Unpacking is one mask per run: the low run through the signed dp4a (bytes 0..15
 * are the same signed), the high run kept in place (q & 0xF0..) through the unsigned x
 * signed dp4a, its sum 16x the nibble sum, shifted back exactly.
 *
 * A run's share is s * d_x * Σ q·qx, and each int8 block's bias term b * (d_x
 * Σ qx) is added once, block 2c's by lane h = 0 and block 2c + 1's by lane h = 1. A block of
 * 32 lies in one group (groups >= 32), so a run's group is that of its block: groups of 64
 * and more give both runs one (scale, bias) word, groups of 32 two adjacent words (one
 * 8-byte load). Four slots (4096 weights) per step, every load of a step issued before the
 * first is used, and under PDL the first step's weight and scale loads before pdl_wait.
 * The order of a lane's sums does not depend on T (batch-invariant).
 *
 * W: the chunked bytes as uint4 [n][k / 32]; SB: (scale, bias) words [n][k / gs]; k % 64
 * == 0 (a slot is 1024 weights, the last one of a row possibly partial); xq int8 [T][k], xs
 * [T][k / 32]. */
#define M3_SLOTS 4
template <int T, bool BF16, bool G32, bool G = false>
__global__ void __launch_bounds__(V2_WARPS * 32, V2_MIN_BLOCKS(T))
    gemv_v3_mlx4(v2_segs sg, const int8_t *xq, const float2 *xs, int k, int lg) {
    int lane = threadIdx.x % 32;
    int grow = blockIdx.x * V2_WARPS + threadIdx.x / 32;
    v2_pair_x<G>(sg, xq, xs, k);
    v2_row r;
    if (!v2_seg_row<G>(sg, grow, r)) return;
    const uint4 *wr = (const uint4 *)r.W + (size_t)r.row * (k / 32) + lane;
    const uint32_t *sbr = (const uint32_t *)r.S + (size_t)r.row * (k >> lg);
    /* a row is nb 16-byte vectors (one per int8 block); its last slot may be partial (k %
     * 1024 != 0: the lanes past the row's end idle; nb is even, so a chunk's two lanes are in
     * or out together) */
    int nb = k / 32, nslot = (nb + 31) / 32, h = lane % 2;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int s0 = 0; s0 < nslot; s0 += M3_SLOTS) {
        uint4 q[M3_SLOTS];
        uint2 sb[M3_SLOTS]; /* the low run's word, then the high run's (the same unless G32) */
#pragma unroll
        for (int s = 0; s < M3_SLOTS; s++) {
            if ((s0 + s) * 32 + lane < nb) {
                int c = (s0 + s) * 16 + lane / 2; /* the chunk in the row */
                q[s] = load_stream(wr + (size_t)(s0 + s) * 32);
                if (G32) {
                    sb[s] = __ldg((const uint2 *)(sbr + 2 * c));
                } else {
                    uint32_t v = __ldg(sbr + ((64 * c) >> lg));
                    sb[s] = make_uint2(v, v);
                }
            }
        }
        if (s0 == 0) {
            pdl_wait(); /* xq / xs come from the kernel before */
            pdl_trigger();
        }
#pragma unroll
        for (int s = 0; s < M3_SLOTS; s++) {
            if ((s0 + s) * 32 + lane >= nb) continue;
            int c = (s0 + s) * 16 + lane / 2;
            float2 lo_sb = mlx4_scale_bias<BF16>(sb[s].x), hi_sb = mlx4_scale_bias<BF16>(sb[s].y);
            float bias = h ? hi_sb.y : lo_sb.y;
            uint4 lo = make_uint4(q[s].x & 0x0F0F0F0Fu, q[s].y & 0x0F0F0F0Fu, q[s].z & 0x0F0F0F0Fu,
                                  q[s].w & 0x0F0F0F0Fu);
            uint4 hi = make_uint4(q[s].x & 0xF0F0F0F0u, q[s].y & 0xF0F0F0F0u, q[s].z & 0xF0F0F0F0u,
                                  q[s].w & 0xF0F0F0F0u);
            int base = 64 * c + 16 * h;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int8_t *xt = xq + (size_t)t * k + base;
                int4 a = __ldg((const int4 *)xt), b = __ldg((const int4 *)(xt + 32));
                /* (d, d·Σq) of blocks 2c and 2c + 1, one 16-byte load */
                float4 p = __ldg((const float4 *)(xs + (size_t)t * nb + 2 * c));
                int dl = v2_dot16(lo, a), dh = v2_dot16_us(hi, b) >> 4; /* exact: a multiple of 16 */
                /* |dot| <= 16·15·127 < 2^24: exact as floats */
                acc[t] += lo_sb.x * (p.x * (float)dl) + hi_sb.x * (p.z * (float)dh) + bias * (h ? p.w : p.y);
            }
        }
    }
    v2_seg_store<T, G>(acc, sg, grow, lane);
}

/* ---------- host side ---------- */

/* gemv_v3_mlx4 launches as a programmatic dependent (pdl_on: sm_90+; it issues its first
 * weight loads before pdl_wait, as the v2 Q4_K GEMV does). The device is asked at the
 * first MLX 4-bit upload, not inside a graph capture. */
void cuda_mlx4_prepare(void) { (void)pdl_on(); }

void cuda_gemv_mlx4_force_pdl(int mode) { *pdl_force() = mode; }

int cuda_mlx4_int8_takes(const cuda_weight *w) { return w && w->dtype == DT_U32 && w->mlx_tiled == 2; }

template <int T> static void launch_mlx4(const v2_segs &sg, int rows, bool bf16, const int8_t *xq, const float2 *xs,
                                         int k, int lg) {
    dim3 grid((unsigned)((rows + V2_WARPS - 1) / V2_WARPS)), block(V2_WARPS * 32);
    bool g32 = lg == 5;
    auto kernel = bf16 ? (g32 ? gemv_v3_mlx4<T, true, true> : gemv_v3_mlx4<T, true, false>)
                       : (g32 ? gemv_v3_mlx4<T, false, true> : gemv_v3_mlx4<T, false, false>);
    pdl_launch(kernel, grid, block, sg, xq, xs, k, lg);
}

int cuda_gemv_mlx4_groups(const cuda_weight *a, const cuda_weight *b) {
    return cuda_mlx4_int8_takes(a) && cuda_mlx4_int8_takes(b) && a->k == b->k && a->group_size == b->group_size &&
           a->sb_bf16 == b->sb_bf16;
}

int cuda_gemv_mlx4_launch(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float2 *xs,
                          int T) {
    if (nw < 1 || nw > 3) return 0;
    const void *W[3], *S[3];
    int64_t n[3];
    for (int i = 0; i < nw; i++) {
        if (!cuda_gemv_mlx4_groups(ws[0], ws[i]) || ws[i]->n > INT32_MAX / 4) return 0;
        W[i] = ws[i]->data;
        S[i] = ws[i]->scales;
        n[i] = ws[i]->n;
    }
    v2_segs sg;
    int rows = v2_segs_fill(&sg, W, S, ys, n, nw), k = (int)ws[0]->k, lg = __builtin_ctz((unsigned)ws[0]->group_size);
    bool bf16 = ws[0]->sb_bf16;
    return v2_for_rows(T, [&](auto r) { launch_mlx4<decltype(r)::value>(sg, rows, bf16, xq, xs, k, lg); });
}

int cuda_gemv_mlx4_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P, int xdiv,
                           const int8_t *xq, const float2 *xs) {
    const cuda_weight *w = tabs[0].proto;
    if (nw < 1 || nw > 2 || !cuda_mlx4_int8_takes(w) || ((uintptr_t)xq % 16) || ((uintptr_t)xs % 16)) return 0;
    for (int i = 1; i < nw; i++)
        if (!cuda_gemv_mlx4_groups(w, tabs[i].proto)) return 0;
    v2_segs sg;
    int rows = v2_segs_experts(&sg, tabs, nw, ys, sel, xdiv), k = (int)w->k,
        lg = __builtin_ctz((unsigned)w->group_size);
    dim3 grid((unsigned)((rows + V2_WARPS - 1) / V2_WARPS), (unsigned)P), block(V2_WARPS * 32);
    bool g32 = lg == 5;
    auto kernel = w->sb_bf16 ? (g32 ? gemv_v3_mlx4<1, true, true, true> : gemv_v3_mlx4<1, true, false, true>)
                             : (g32 ? gemv_v3_mlx4<1, false, true, true> : gemv_v3_mlx4<1, false, false, true>);
    pdl_launch(kernel, grid, block, sg, xq, xs, k, lg);
    return 1;
}
