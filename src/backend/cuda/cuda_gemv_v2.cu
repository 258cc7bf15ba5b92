/* cuda_gemv_v2.cu: second-generation decode GEMVs with int8 activations for Q4_K (packed
 * scale order) and Q6_K (chosen per format and shape: cuda_gemv_v2_takes): one warp
 * per row, every load of a 4096-weight step issued before the first is used, lane
 * mappings in which each warp load reads contiguous bytes of weights and of activations.
 * Same contract as cuda_gemv.cu's int8 path (activations and their (d, d * sum q) pairs
 * as quantize_x_q8 writes them); called only from there. Must not allocate or sync. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ float v2_f16(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }

/* Under PDL (cuda_pdl.cuh) the kernels issue their first step of weight loads (no kernel
 * writes weights) before waiting for the kernel before, whose outputs (xq, xs) they read
 * next: the weight stream of a GEMV starts while the norm or quantizer before it drains. */
static __device__ __forceinline__ void v2_pdl_start(void) {
    pdl_wait();
    pdl_trigger();
}

/* Q4_K super-blocks with packed scales (cuda_q4k_scale_min, q4k_packed): 8 lanes per
 * super-block; lane part p = 2c + h reads the 16 nibble bytes at 16 + 16p (chunk c, half
 * h): weights 64c + 16h + [0, 16) (low nibbles, sub-block 2c) and 64c + 32 + 16h + [0, 16)
 * (high nibbles, sub-block 2c + 1). A warp load covers 4 super-blocks (512 contiguous
 * quant bytes out of 576); 4 slots = 16 super-blocks per step, with the 16-byte header
 * of each (one broadcast load per 8 lanes). High nibbles stay in place (q & 0xF0..) and
 * go through the unsigned x signed dp4a: the sum is 16x the nibble sum, shifted back
 * exactly. Each sub-block's min term -dmin * m * d_x * sum(q_x) is added once, by lane
 * h = 0 for sub-block 2c and by lane h = 1 for sub-block 2c + 1. */
#define Q4_SLOTS 4
template <int T, bool G = false>
__global__ void __launch_bounds__(V2_WARPS * 32, V2_MIN_BLOCKS(T))
    gemv_v2_q4_k(v2_segs sg, const int8_t *xq, const float2 *xs, int k) {
    int lane = threadIdx.x % 32;
    int grow = blockIdx.x * V2_WARPS + threadIdx.x / 32;
    v2_pair_x<G>(sg, xq, xs, k);
    v2_row r;
    if (!v2_seg_row<G>(sg, grow, r)) return;
    const uint8_t *W = (const uint8_t *)r.W;
    int row = r.row;
    int nsb = k / 256, nb = k / 32, part = lane % 8, c = part / 2, h = part % 2;
    const uint8_t *wr = W + (size_t)row * nsb * 144;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int s0 = 0; s0 < nsb; s0 += 4 * Q4_SLOTS) {
        uint4 hd[Q4_SLOTS], q[Q4_SLOTS];
#pragma unroll
        for (int s = 0; s < Q4_SLOTS; s++) {
            int sb = s0 + 4 * s + lane / 8;
            if (sb < nsb) {
                const uint8_t *blk = wr + (size_t)sb * 144;
                hd[s] = __ldg((const uint4 *)blk);
                q[s] = load_stream(blk + 16 + 16 * part);
            }
        }
        if (s0 == 0) v2_pdl_start();
#pragma unroll
        for (int s = 0; s < Q4_SLOTS; s++) {
            int sb = s0 + 4 * s + lane / 8;
            if (sb >= nsb) continue;
            float d = v2_f16(hd[s].x & 0xffff), dmin = v2_f16(hd[s].x >> 16);
            /* the chunk's scales and mins, two byte permutes (cuda_q4k_scale_min's packed order) */
            uint32_t g = cuda_q4k_group_dev(hd[s], c);
            int sc0 = (int)(g & 63), sc1 = (int)((g >> 6) & 63), m = (int)((g >> (12 + 6 * h)) & 63);
            float fm = dmin * (float)m;
            uint4 lo =
                make_uint4(q[s].x & 0x0F0F0F0Fu, q[s].y & 0x0F0F0F0Fu, q[s].z & 0x0F0F0F0Fu, q[s].w & 0x0F0F0F0Fu);
            uint4 hi =
                make_uint4(q[s].x & 0xF0F0F0F0u, q[s].y & 0xF0F0F0F0u, q[s].z & 0xF0F0F0F0u, q[s].w & 0xF0F0F0F0u);
            int base = sb * 256 + 64 * c + 16 * h, xb = sb * 8 + 2 * c;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int8_t *xt = xq + (size_t)t * k + base;
                int4 a = __ldg((const int4 *)xt), b = __ldg((const int4 *)(xt + 32));
                /* (d, d·Σq) of x blocks 2c and 2c + 1, one 16-byte load (xb even, k % 64 == 0) */
                float4 p = __ldg((const float4 *)(xs + (size_t)t * nb + xb));
                int dl = v2_dot16(lo, a), dh = v2_dot16_us(hi, b) >> 4; /* exact: a multiple of 16 */
                /* |sc·dot| <= 63·16·15·127 < 2^24: the int products convert to float exactly */
                acc[t] += d * ((float)(sc0 * dl) * p.x + (float)(sc1 * dh) * p.z) - fm * (h ? p.w : p.y);
            }
        }
    }
    v2_seg_store<T, G>(acc, sg, grow, lane);
}

/* Q6_K planes (cuda_weight: ql [n][k/2], qh [n][k/4], int8 scales [n][k/16], f16 d
 * [n][k/256]; weight 128h + 32g + l of a super-block is nibble g/2 of ql[64h + 32(g%2) +
 * l] with bits 2g of qh[32h + l], scale (128h + 32g + l) / 16). 16 lanes per
 * super-block: lane i = 8h + 2g + j takes weights 16i + [0, 16) = 128h + 32g + 16j + [0,
 * 16), one sub-block, so a warp's 32 lanes cover 512 consecutive weights and read their
 * int8 activations as one contiguous 512-byte load; its 16 ql bytes are shared with the
 * lane of g ^ 2 and its 16 qh bytes with the lanes of the other three g (same address in
 * one instruction: one transfer). 6-bit q - 32 per byte without a borrow: with bit 1 of
 * each qh pair flipped, t = nibble | pair << 4 is q ^ 32, whose 6-bit two's complement
 * sign-extended to 8 bits (t + (t & 0x20) * 6) is q - 32. 4 slots = 8 super-blocks. */
#define Q6_SLOTS 4
/* T = 1 at 64 registers spilled 16 bytes: 7 blocks (72 registers, 28 warps per SM) */
template <int T, bool G = false>
__global__ void __launch_bounds__(V2_WARPS * 32, (T) == 1 ? 7 : V2_MIN_BLOCKS(T))
    gemv_v2_q6_k(v2_segs sg, const int8_t *xq, const float2 *xs, int k) {
    int lane = threadIdx.x % 32;
    int grow = blockIdx.x * V2_WARPS + threadIdx.x / 32;
    v2_pair_x<G>(sg, xq, xs, k);
    v2_row r;
    if (!v2_seg_row<G>(sg, grow, r)) return;
    /* the planes of this row's weight (cuda_weight: ql, then qh after n k / 2 bytes; scales, then d) */
    size_t nk = (size_t)r.n * (size_t)k;
    const uint8_t *QL = (const uint8_t *)r.W, *QH = QL + nk / 2;
    const int8_t *SC = (const int8_t *)r.S;
    const uint16_t *D = (const uint16_t *)(SC + nk / 16);
    int row = r.row;
    int nsb = k / 256, nb = k / 32, li = lane % 16, h = li / 8, g = (li / 2) % 4, j = li % 2;
    int lshift = 4 * (g / 2), hshift = 2 * g;
    size_t b0 = (size_t)row * nsb;
    /* this lane's bytes of super-block 0 of the row; super-block sb is sb * 128 / 64 / 16 / 1 further */
    const uint8_t *qlr = QL + b0 * 128 + 64 * h + 32 * (g % 2) + 16 * j, *qhr = QH + b0 * 64 + 32 * h + 16 * j;
    const int8_t *scr = SC + b0 * 16 + li;
    const uint16_t *dr = D + b0;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int s0 = 0; s0 < nsb; s0 += 2 * Q6_SLOTS) {
        uint4 ql[Q6_SLOTS], qh[Q6_SLOTS];
        int sc[Q6_SLOTS];
        uint32_t dd[Q6_SLOTS];
#pragma unroll
        for (int s = 0; s < Q6_SLOTS; s++) {
            int sb = s0 + 2 * s + lane / 16;
            if (sb < nsb) {
                ql[s] = load_stream(qlr + sb * 128);
                qh[s] = load_stream(qhr + sb * 64);
                sc[s] = __ldg(scr + sb * 16);
                dd[s] = __ldg(dr + sb);
            }
        }
        if (s0 == 0) v2_pdl_start();
#pragma unroll
        for (int s = 0; s < Q6_SLOTS; s++) {
            int sb = s0 + 2 * s + lane / 16;
            if (sb >= nsb) continue;
            uint32_t l[4] = {ql[s].x, ql[s].y, ql[s].z, ql[s].w}, hw[4] = {qh[s].x, qh[s].y, qh[s].z, qh[s].w};
            int qv[4];
#pragma unroll
            for (int w = 0; w < 4; w++) {
                uint32_t t6 =
                    ((l[w] >> lshift) & 0x0F0F0F0Fu) | ((((hw[w] ^ 0xAAAAAAAAu) >> hshift) & 0x03030303u) << 4);
                qv[w] = (int)(t6 + (t6 & 0x20202020u) * 6u); /* disjoint bits: no carry between bytes */
            }
            float d = v2_f16(dd[s]);
            int base = sb * 256 + 16 * li, xb = sb * 8 + li / 2;
#pragma unroll
            for (int t = 0; t < T; t++) {
                int4 a = __ldg((const int4 *)(xq + (size_t)t * k + base));
                int dot = __dp4a(qv[0], a.x, 0);
                dot = __dp4a(qv[1], a.y, dot);
                dot = __dp4a(qv[2], a.z, dot);
                dot = __dp4a(qv[3], a.w, dot);
                float dx = __ldg(&xs[(size_t)t * nb + xb].x);
                /* |sc·dot| <= 128·16·32·127 < 2^24: exact as a float */
                acc[t] += (d * dx) * (float)(sc[s] * dot);
            }
        }
    }
    v2_seg_store<T, G>(acc, sg, grow, lane);
}

/* ---------- host side ---------- */

/* Which int8 weights go to v2, where each is faster in gemv_bench: packed Q4_K at every
 * shape, Q6_K only for wide rows (n >= 2k), Q8_0 stays on cuda_gemv.cu's kernel (even)
 * (bench/results/kernel_choices.md, "CUDA v2 GEMV"). */
int cuda_gemv_v2_takes(const cuda_weight *w) {
    if (!w || w->k % 32) return 0;
    int q4k = w->dtype == DT_Q4_K && w->q4k_packed && w->k % 256 == 0, q6k = w->dtype == DT_Q6_K && w->k % 256 == 0;
    return q4k || (q6k && w->n >= 2 * w->k);
}

void cuda_gemv_v2_force_pdl(int mode) { *pdl_force() = mode; }

/* The planes a v2 kernel reads of w: its data and, for Q6_K, its scales. */
static const void *v2_scales(const cuda_weight *w) { return w->dtype == DT_Q4_K ? NULL : w->scales; }

template <int T> static void launch_v2(const v2_segs &sg, int rows, tensor_dtype dt, const int8_t *xq,
                                       const float2 *xs, int k) {
    dim3 grid((unsigned)((rows + V2_WARPS - 1) / V2_WARPS)), block(V2_WARPS * 32);
    switch (dt) {
    case DT_Q4_K: pdl_launch(gemv_v2_q4_k<T>, grid, block, sg, xq, xs, k); break;
    case DT_Q6_K: pdl_launch(gemv_v2_q6_k<T>, grid, block, sg, xq, xs, k); break;
    default: break;
    }
}

int cuda_gemv_v2_groups(const cuda_weight *a, const cuda_weight *b) {
    return cuda_gemv_v2_takes(a) && cuda_gemv_v2_takes(b) && a->dtype == b->dtype && a->k == b->k;
}

/* The v2 kernel over ws (checked: one format the kernels have, one k, aligned activations). */
static int v2_launch_segs(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float2 *xs,
                          int T, int any_q6k) {
    /* the Q4_K kernel reads two (d, d·Σq) pairs as one float4 */
    if (nw < 1 || nw > 3 || ((uintptr_t)xs % 16) != 0 || ((uintptr_t)xq % 16) != 0) return 0;
    const void *W[3], *S[3];
    int64_t n[3];
    for (int i = 0; i < nw; i++) {
        int q6k = any_q6k && ws[i]->dtype == DT_Q6_K && ws[0]->dtype == DT_Q6_K && ws[i]->k % 256 == 0 &&
                  ws[i]->k == ws[0]->k;
        if ((!q6k && !cuda_gemv_v2_groups(ws[0], ws[i])) || ws[i]->n > INT32_MAX / 4) return 0;
        W[i] = ws[i]->data;
        S[i] = v2_scales(ws[i]);
        n[i] = ws[i]->n;
    }
    v2_segs sg;
    int rows = v2_segs_fill(&sg, W, S, ys, n, nw), k = (int)ws[0]->k;
    return v2_for_rows(T, [&](auto r) { launch_v2<decltype(r)::value>(sg, rows, ws[0]->dtype, xq, xs, k); });
}

int cuda_gemv_v2_launch(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float2 *xs,
                        int T) {
    return v2_launch_segs(ws, ys, nw, xq, xs, T, 0);
}

/* Every Q6_K weight goes to v2 at 2..8 rows outside batch-invariant steps: gemv_q6_k_i8's
 * cost grows with the rows (H200, 14336 x 4096 Q6_K at 8 rows: v2 37.7 us, gemv_q6_k_i8 102.9; the 8B
 * Q4_K_M decode step of 8 rows spent 1.59 ms in gemv_q6_k_i8 against 0.42 at one row). */
int cuda_gemv_v2_launch_rows(const cuda_weight *w, float *y, const int8_t *xq, const float2 *xs, int T) {
    if (T < 2) return cuda_gemv_v2_launch(&w, &y, 1, xq, xs, T);
    return v2_launch_segs(&w, &y, 1, xq, xs, T, 1);
}

int cuda_gemv_v2_bench(const cuda_weight *w, float *y, const int8_t *xq, const float *xs, int T) {
    return v2_launch_segs(&w, &y, 1, xq, (const float2 *)xs, T, 1);
}

int cuda_gemv_v2_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P, int xdiv,
                         const int8_t *xq, const float2 *xs) {
    const cuda_weight *w = tabs[0].proto;
    int q4k = w->dtype == DT_Q4_K && w->q4k_packed, q6k = w->dtype == DT_Q6_K;
    if (nw < 1 || nw > 2 || (!q4k && !q6k) || w->k % 256 || ((uintptr_t)xq % 16) || ((uintptr_t)xs % 16)) return 0;
    for (int i = 1; i < nw; i++)
        if (tabs[i].proto->dtype != w->dtype || tabs[i].proto->k != w->k || tabs[i].proto->q4k_packed != w->q4k_packed)
            return 0;
    v2_segs sg;
    int rows = v2_segs_experts(&sg, tabs, nw, ys, sel, xdiv), k = (int)w->k;
    dim3 grid((unsigned)((rows + V2_WARPS - 1) / V2_WARPS), (unsigned)P), block(V2_WARPS * 32);
    if (q4k)
        pdl_launch(gemv_v2_q4_k<1, true>, grid, block, sg, xq, xs, k);
    else
        pdl_launch(gemv_v2_q6_k<1, true>, grid, block, sg, xq, xs, k);
    return 1;
}
