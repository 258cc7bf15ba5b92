/* cuda_gemv_mlx4.cu: the decode GEMVs for MLX affine 4-bit weights (DT_U32) on int8
 * activations with __dp4a: v3 (the default) on the chunked nibble layout, v2 on the tiled
 * one (HEARTH_CUDA_MLX4=v2; =v1 keeps the float-activation kernels of cuda_gemv.cu). Same contract as the other
 * int8-activation GEMVs (xq / xs as quantize_x_q8 writes them); called only from
 * cuda_gemv.cu, which keeps the float kernels for the weights this file does not take.
 * Must not allocate or sync. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A group's (scale, bias) word (cuda_weight: scale in the low half) as two floats. */
template <bool BF16> static __device__ __forceinline__ float2 mlx4_scale_bias(uint32_t sb) {
    if (BF16) return make_float2(__uint_as_float(sb << 16), __uint_as_float(sb & 0xffff0000u));
    __half2 p;
    memcpy(&p, &sb, 4);
    return __half22float2(p);
}

/* gemv_v2_mlx4. The math: w = s * q + b per group (q in 0..15), x ≈ d_x * qx per int8
 * block of 32, so a block's share of the row is s * d_x * Σ q·qx + b * (d_x * Σ qx): one
 * exact int32 dp4a sum and the block's xs pair (d_x, d_x * Σ qx). A block lies inside one
 * group (groups are powers of two >= 32), so groups of 32, 64 and 128 are the same loop.
 *
 * The tiled layout (cuda_mlx4_nibble): a tile of 1024 weights is 32 vectors of 16 bytes;
 * vector V holds, for m < 8, the run of 4 weights 128m + 4V + [0, 4) in half m % 2 of its
 * word m / 2 (weight j at bit 4j of the half). So the 8 vectors 8q .. 8q + 7 (one 128-byte
 * line) hold the 8 int8 blocks 4m + q of the tile whole, vector 8q + r giving run r (weights
 * 4r .. 4r + 3) of each of them.
 *
 * Lane mapping. Lanes 2p and 2p + 1 (a pair, h = lane % 2) share line q = p % 4 of tile
 * p / 4 of the step (4 tiles = 4096 weights, all four loads of a lane issued before the
 * first is used); lane h loads vectors 8q + 2i + h, i < 4. Each warp load thus reads both
 * 16-byte halves of 16 sectors of 32 bytes: 512 useful bytes, no sector fetched twice. (One
 * lane per line would own whole blocks, but each of its loads would use half a sector, and
 * with L1 bypassed every weight sector would cross L2 -> SM twice.) Lane h holds runs
 * 2i + h of the blocks 4m + q: per block and row of x, four 4-byte activation loads (words
 * 2i + h of the block's 32 int8: every other word, so no 16-byte load fits, and two of them
 * plus selects cost more instructions and registers: T = 8 spilled), 4 dp4a, one int to
 * float, an FMA with s * d_x and one with b * (d_x Σ qx), the latter on lane h = 0 only (b
 * is 0 on h = 1), so each block's bias term is added once. The order of a lane's sums and
 * of the warp reduction does not depend on T: batch-invariant. ptxas (sm_90a, CUDA 13):
 * 64 / 80 / 128 registers for T = 1 / 2 / >= 3, no spills.
 *
 * Nibbles to bytes: for word u, lo = u & 0x0F0F0F0F holds weights (0, 2) of run 2w and (0,
 * 2) of run 2w + 1 in its bytes, hi = (u >> 4) & 0x0F0F0F0F weights (1, 3) of each; two
 * byte_perms interleave them into run 2w = (lo0, hi0, lo1, hi1) and run 2w + 1 = (lo2, hi2,
 * lo3, hi3): 5 instructions per 8 weights, shared by the T rows. The bytes are 0..15, so
 * the signed dp4a reads them as they are. |Σ| <= 16 · 15 · 127 per lane and block: exact.
 *
 * W: the row-major tiled words as uint4 [n][k / 32]; SB: (scale, bias) words [n][k / gs],
 * gs = 1 << lg; xq int8 [T][k], xs [T][k / 32]; k % 1024 == 0. */
/* SHFL (the default, HEARTH_CUDA_MLX4_SHFL=0 for the mapping above): the same weight loads,
 * then each pair trades half of them (two uint4 through __shfl_xor) so that lane h holds
 * runs 4h .. 4h + 3 of its blocks: their activations are one contiguous 16-byte load per
 * block and row of x instead of four 4-byte ones (per step and row of x, 8 loads where
 * there were 32, for 8 shuffles). Run 4h + j comes from vector 8q + 2(2h + j / 2) + j % 2:
 * lane 0 keeps runs 0 and 2 (its u[0], u[1]) and takes 1 and 3 (the partner's u[0], u[1]);
 * lane 1 keeps 5 and 7 (u[2], u[3]) and takes 4 and 6 (the partner's u[2], u[3]). The sums
 * are integers per block, so only the float order of the lane partials changes. */
template <int T, bool BF16, bool SHFL>
__global__ void __launch_bounds__(V2_WARPS * 32, V2_MIN_BLOCKS(T))
    gemv_v2_mlx4(v2_segs sg, const int8_t *xq, const float2 *xs, int k, int lg) {
    int lane = threadIdx.x % 32;
    int grow = blockIdx.x * V2_WARPS + threadIdx.x / 32;
    v2_row r;
    if (!v2_seg_row(sg, grow, r)) return;
    const uint4 *W = (const uint4 *)r.W;
    const uint32_t *SB = (const uint32_t *)r.S;
    int row = r.row;
    int nt = k / 1024, nb = k / 32, h = lane % 2, q = (lane / 2) % 4, tp = lane / 8;
    const uint4 *wr = W + (size_t)row * (k / 32) + 8 * q + h;
    const uint32_t *sbr = SB + (size_t)row * (k >> lg);
    const int8_t *xr = xq + 4 * h;
    pdl_wait(); /* xq / xs come from the kernel before */
    pdl_trigger();
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int tile = tp; tile < nt; tile += 4) {
        uint4 u[4];
        uint32_t sb[8];
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = load_stream(wr + (size_t)tile * 32 + 2 * i);
#pragma unroll
        for (int m = 0; m < 8; m++) sb[m] = __ldg(sbr + ((tile * 1024 + 128 * m + 32 * q) >> lg));
        if (SHFL) { /* u[j] becomes run 4h + j (see above); the 8 lanes of tile group tp run
                     * the same trip count (k / 1024 need not be a multiple of 4) */
            unsigned pm = 0xffu << (8 * tp);
            uint4 s0 = h ? u[0] : u[2], s1 = h ? u[1] : u[3], a, b;
            a.x = __shfl_xor_sync(pm, s0.x, 1), a.y = __shfl_xor_sync(pm, s0.y, 1);
            a.z = __shfl_xor_sync(pm, s0.z, 1), a.w = __shfl_xor_sync(pm, s0.w, 1);
            b.x = __shfl_xor_sync(pm, s1.x, 1), b.y = __shfl_xor_sync(pm, s1.y, 1);
            b.z = __shfl_xor_sync(pm, s1.z, 1), b.w = __shfl_xor_sync(pm, s1.w, 1);
            uint4 r0 = h ? a : u[0], r1 = h ? u[2] : a, r2 = h ? b : u[1], r3 = h ? u[3] : b;
            u[0] = r0, u[1] = r1, u[2] = r2, u[3] = r3;
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t run[2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t x = w == 0 ? u[i].x : w == 1 ? u[i].y : w == 2 ? u[i].z : u[i].w;
                uint32_t lo = x & 0x0F0F0F0Fu, hi = (x >> 4) & 0x0F0F0F0Fu;
                run[0][i] = __byte_perm(lo, hi, 0x5140);
                run[1][i] = __byte_perm(lo, hi, 0x7362);
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int m = 2 * w + e, blk = tile * 32 + 4 * m + q;
                float2 sbf = mlx4_scale_bias<BF16>(sb[m]);
                float s = sbf.x, b = h ? 0.0f : sbf.y;
#pragma unroll
                for (int t = 0; t < T; t++) {
                    float2 d = __ldg(xs + (size_t)t * nb + blk);
                    int dot;
                    if (SHFL) { /* runs 4h .. 4h + 3: words 4h .. 4h + 3 of the block */
                        int4 a = __ldg((const int4 *)(xq + (size_t)t * k) + 2 * blk + h);
                        dot = __dp4a((int)run[e][0], a.x, 0);
                        dot = __dp4a((int)run[e][1], a.y, dot);
                        dot = __dp4a((int)run[e][2], a.z, dot);
                        dot = __dp4a((int)run[e][3], a.w, dot);
                    } else {
                        const int *xa = (const int *)(xr + (size_t)t * k) + 8 * blk; /* run h of the block */
                        dot = __dp4a((int)run[e][0], __ldg(xa), 0);
                        dot = __dp4a((int)run[e][1], __ldg(xa + 2), dot);
                        dot = __dp4a((int)run[e][2], __ldg(xa + 4), dot);
                        dot = __dp4a((int)run[e][3], __ldg(xa + 6), dot);
                    }
                    acc[t] += (s * d.x) * (float)dot + b * d.y;
                }
            }
        }
    }
    v2_seg_store<T>(acc, sg, grow, lane);
}

/* gemv_v3_mlx4: the chunked layout (cuda_mlx4_nibble, tiled == 2), read as gemv_v2_q4_k
 * reads Q4_K: a chunk of 64 weights is 32 bytes, byte i holding weight i (low nibble) and
 * 32 + i (high), so the 16-byte vector h of chunk c holds the runs 64c + 16h + [0, 16) (low
 * nibbles, int8 block 2c) and 64c + 32 + 16h + [0, 16) (high nibbles, block 2c + 1). Lane L
 * reads vector L of each 512-byte slot (chunk L / 2, h = L % 2): every warp load is 512
 * contiguous weight bytes, and each run's activations one contiguous 16-byte load (the
 * warp's: 1 KB contiguous per run). Unpacking is one mask per run (v2 needed two masks, a
 * shift and two byte_perms per 8 weights): the low run through the signed dp4a (bytes 0..15
 * are the same signed), the high run kept in place (q & 0xF0..) through the unsigned x
 * signed dp4a, its sum 16x the nibble sum, shifted back exactly.
 *
 * Math as v2: a run's share is s * d_x * Σ q·qx, and each int8 block's bias term b * (d_x
 * Σ qx) is added once, block 2c's by lane h = 0 and block 2c + 1's by lane h = 1. A block of
 * 32 lies in one group (groups >= 32), so a run's group is that of its block: groups of 64
 * and more give both runs one (scale, bias) word, groups of 32 two adjacent words (one
 * 8-byte load). Four slots (4096 weights) per step, every load of a step issued before the
 * first is used, and under PDL the first step's weight and scale loads before pdl_wait.
 * The order of a lane's sums does not depend on T (batch-invariant).
 *
 * W: the chunked bytes as uint4 [n][k / 32]; SB: (scale, bias) words [n][k / gs]; k % 1024
 * == 0 (a slot is 1024 weights); xq int8 [T][k], xs [T][k / 32]. */
#define M3_SLOTS 4
template <int T, bool BF16, bool G32>
__global__ void __launch_bounds__(V2_WARPS * 32, V2_MIN_BLOCKS(T))
    gemv_v3_mlx4(v2_segs sg, const int8_t *xq, const float2 *xs, int k, int lg) {
    int lane = threadIdx.x % 32;
    int grow = blockIdx.x * V2_WARPS + threadIdx.x / 32;
    v2_row r;
    if (!v2_seg_row(sg, grow, r)) return;
    const uint4 *wr = (const uint4 *)r.W + (size_t)r.row * (k / 32) + lane;
    const uint32_t *sbr = (const uint32_t *)r.S + (size_t)r.row * (k >> lg);
    int nslot = k / 1024, nb = k / 32, h = lane % 2;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int s0 = 0; s0 < nslot; s0 += M3_SLOTS) {
        uint4 q[M3_SLOTS];
        uint2 sb[M3_SLOTS]; /* the low run's word, then the high run's (the same unless G32) */
#pragma unroll
        for (int s = 0; s < M3_SLOTS; s++) {
            if (s0 + s < nslot) {
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
            if (s0 + s >= nslot) continue;
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
    v2_seg_store<T>(acc, sg, grow, lane);
}

/* ---------- host side ---------- */

/* -1: read HEARTH_CUDA_MLX4 on first use; 2: v3 on the chunked layout (the default, the
 * fastest: bench/results/kernel_choices.md, "CUDA MLX 4-bit GEMV"); 1: v2 on the tiled
 * layout (HEARTH_CUDA_MLX4=v2); 0: the float kernels (HEARTH_CUDA_MLX4=v1). */
static int g_mlx4_mode = -1, g_mlx4_shfl = -1;

/* HEARTH_CUDA_MLX4_SHFL=0: gemv_v2_mlx4 without the pair shuffle (A/B runs). */
static bool mlx4_shfl(void) {
    if (g_mlx4_shfl < 0) {
        const char *e = getenv("HEARTH_CUDA_MLX4_SHFL");
        g_mlx4_shfl = !(e && !strcmp(e, "0"));
    }
    return g_mlx4_shfl;
}

/* Whether gemv_v3_mlx4 launches as a programmatic dependent (it issues its first weight
 * loads before pdl_wait, as the v2 Q4_K GEMV does; gemv_v2_mlx4, which waits first, stays a
 * plain launch as cuda_pdl.cuh says): on sm_90+ unless HEARTH_CUDA_PDL=0 or
 * HEARTH_CUDA_MLX4_PDL=0; cuda_gemv_mlx4_force_pdl overrides. Read with the mode, at the
 * first upload (no device query inside a graph capture). */
static int g_v3_pdl = -1;

int cuda_mlx4_v2_on(void) {
    if (g_mlx4_mode < 0) {
        const char *e = getenv("HEARTH_CUDA_MLX4");
        g_mlx4_mode = e && !strcmp(e, "v1") ? 0 : e && !strcmp(e, "v2") ? 1 : 2;
    }
    if (g_v3_pdl < 0) {
        const char *e = getenv("HEARTH_CUDA_PDL"), *m = getenv("HEARTH_CUDA_MLX4_PDL");
        g_v3_pdl = !(e && !strcmp(e, "0")) && !(m && !strcmp(m, "0")) && pdl_device_ok();
    }
    return g_mlx4_mode;
}

static int v3_pdl(void) { return *pdl_force() >= 0 ? *pdl_force() : g_v3_pdl > 0; }

void cuda_mlx4_v2_force(int mode) { g_mlx4_mode = mode < 0 ? -1 : mode > 2 ? 2 : mode; }

void cuda_gemv_mlx4_force_pdl(int mode) { *pdl_force() = mode; }

int cuda_mlx4_v2_takes(const cuda_weight *w) {
    if (!w || w->dtype != DT_U32) return 0;
    if (w->mlx_tiled == 2) return 1; /* upload checked the shape; only gemv_v3_mlx4 reads it */
    if (!cuda_mlx4_v2_on()) return 0;
    return w->mlx_tiled == 1 && cuda_mlx4_int8_shape(w->k, w->group_size);
}

template <int T> static void launch_mlx4(const v2_segs &sg, int rows, int layout, bool bf16, const int8_t *xq,
                                         const float2 *xs, int k, int lg) {
    dim3 grid((unsigned)((rows + V2_WARPS - 1) / V2_WARPS)), block(V2_WARPS * 32);
    if (layout == 2) {
        bool g32 = lg == 5;
        auto kernel = bf16 ? (g32 ? gemv_v3_mlx4<T, true, true> : gemv_v3_mlx4<T, true, false>)
                           : (g32 ? gemv_v3_mlx4<T, false, true> : gemv_v3_mlx4<T, false, false>);
        pdl_launch_if(v3_pdl(), kernel, grid, block, sg, xq, xs, k, lg);
        return;
    }
    /* every T alike (T = 8 spills 16 bytes with it, ptxas sm_90a): a row's float order must
     * not depend on the batch (test_gemv_batch_invariant, --deterministic) */
    bool shfl = mlx4_shfl();
    auto kernel = bf16 ? (shfl ? gemv_v2_mlx4<T, true, true> : gemv_v2_mlx4<T, true, false>)
                       : (shfl ? gemv_v2_mlx4<T, false, true> : gemv_v2_mlx4<T, false, false>);
    pdl_launch(kernel, grid, block, sg, xq, xs, k, lg);
}

int cuda_gemv_mlx4_groups(const cuda_weight *a, const cuda_weight *b) {
    return cuda_mlx4_v2_takes(a) && cuda_mlx4_v2_takes(b) && a->k == b->k && a->group_size == b->group_size &&
           a->sb_bf16 == b->sb_bf16 && a->mlx_tiled == b->mlx_tiled;
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
    int layout = ws[0]->mlx_tiled;
    return v2_for_rows(T, [&](auto r) { launch_mlx4<decltype(r)::value>(sg, rows, layout, bf16, xq, xs, k, lg); });
}
