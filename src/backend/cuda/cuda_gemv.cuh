/* cuda_gemv.cuh: what the decode GEMV files (cuda_gemv.cu, cuda_gemv_v2.cu,
 * cuda_gemv_mlx4.cu) share: the streaming weight load, and for the v2 kernels their launch
 * shape, fixed-order lane reduction and dispatch over T. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_GEMV_CUH
#define HEARTH_BACKEND_CUDA_GEMV_CUH
#include "backend/cuda/cuda_pdl.cuh"
#include <stdint.h>
#include <type_traits>

/* 4 warps (rows) per block: the block scheduler refills an SM as soon as four rows are
 * done, so the end of a launch idles at most four rows' worth of an SM. */
#define V2_WARPS 4
/* Registers: at most 64 per thread for T = 1 (8 blocks = 32 warps per SM, enough for
 * all 4096 rows of a 4096-row weight to be in flight at once on 132 SMs), 80 for T = 2
 * (6 blocks), 128 above (4 blocks); fewer spill (ptxas -v, sm_90a). */
#define V2_MIN_BLOCKS(T) ((T) == 1 ? 8 : (T) == 2 ? 6 : 4)

/* Weight bytes are read once per GEMV: keep them out of L1 so the activations stay there. */
static __device__ __forceinline__ uint4 load_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Sixteen signed int8 products (w and a both signed). */
static __device__ __forceinline__ int v2_dot16(uint4 w, int4 a) {
    int s = __dp4a((int)w.x, a.x, 0);
    s = __dp4a((int)w.y, a.y, s);
    s = __dp4a((int)w.z, a.z, s);
    return __dp4a((int)w.w, a.w, s);
}

/* Sixteen products of unsigned weight bytes (0..255) with signed activation bytes. */
static __device__ __forceinline__ int v2_dp4a_us(uint32_t w, int a, int c) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(a), "r"(c));
    return r;
}
static __device__ __forceinline__ int v2_dot16_us(uint4 w, int4 a) {
    int s = v2_dp4a_us(w.x, a.x, 0);
    s = v2_dp4a_us(w.y, a.y, s);
    s = v2_dp4a_us(w.z, a.z, s);
    return v2_dp4a_us(w.w, a.w, s);
}

/* Lane sums of the warp's row, reduced by a fixed butterfly (the same order whatever T,
 * so a row's result does not depend on the batch: test_gemv_batch_invariant). */
template <int T> static __device__ __forceinline__ void v2_store(float (&acc)[T], float *y, int n, int row, int lane) {
#pragma unroll
    for (int t = 0; t < T; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[(size_t)t * n + row] = s;
    }
}

/* Up to three weights of one format that read the same activations (q, k and v of a layer;
 * gate and up) in one launch: warps are numbered over the rows of all of them, so a small
 * projection (k / v: 1024 rows) is no launch of its own, too short to reach the HBM rate.
 * Row r of the whole is segment s's when r < end[s] (cumulative counts; unused segments
 * repeat the last end); its output is y[s][t * n_s + r - start_s]. W: the weight's data, S:
 * its scale plane where the format has one (Q8_0 d, Q6_K int8 scales, MLX scale/bias
 * words). A row's arithmetic does not depend on its segment or neighbours: grouping
 * changes no result bit. */
struct v2_segs {
    const void *W[3], *S[3];
    float *y[3];
    int end[3];
    /* grouped experts (cuda_gemv_experts; kernels instantiated with G = true, T = 1): W[i]
     * and S[i] are device tables of E pointers, one per expert slice; launch row blockIdx.y
     * is pair p, which reads expert sel[p]'s slice and activation row p / xdiv, and writes
     * row p of y[i] ([P][n_i]) */
    const int32_t *sel;
    int xdiv;
};
struct v2_row {
    const void *W, *S;
    float *y;
    int n, row;
};
/* Entry e of a device table of expert-slice addresses (cuda_expert_table), read-only path. */
static __device__ __forceinline__ const void *table_entry(const void *const *t, int e) {
    return (const void *)__ldg((const unsigned long long *)t + e);
}

/* Segment lookup by selects, not a run-time index into the parameter struct (that would
 * copy it to local memory); false past the last row. G: the grouped form (v2_segs.sel). */
template <bool G = false> static __device__ __forceinline__ bool v2_seg_row(const v2_segs &sg, int grow, v2_row &r) {
    if (grow >= sg.end[2]) return false;
    int s = grow < sg.end[0] ? 0 : grow < sg.end[1] ? 1 : 2;
    int start = s == 0 ? 0 : s == 1 ? sg.end[0] : sg.end[1];
    r.n = (s == 0 ? sg.end[0] : s == 1 ? sg.end[1] : sg.end[2]) - start;
    r.W = s == 0 ? sg.W[0] : s == 1 ? sg.W[1] : sg.W[2];
    r.S = s == 0 ? sg.S[0] : s == 1 ? sg.S[1] : sg.S[2];
    r.y = s == 0 ? sg.y[0] : s == 1 ? sg.y[1] : sg.y[2];
    r.row = grow - start;
    if (G) {
        int p = blockIdx.y, e = __ldg(sg.sel + p);
        r.W = table_entry((const void *const *)r.W, e);
        r.S = r.S ? table_entry((const void *const *)r.S, e) : NULL;
        r.y += (size_t)p * r.n;
    }
    return true;
}

/* The grouped form's activations: pair blockIdx.y's row of xq [rows][k] and xs [rows][k /
 * 32]. Its expert ids come from the routing kernel, so a grouped GEMV waits for the kernels
 * before it (pdl_wait) before it reads them, and issues no weight load earlier. */
static __device__ __forceinline__ void grouped_x(int xdiv, const int8_t *&xq, const float2 *&xs, int k) {
    pdl_wait();
    size_t x = (size_t)(blockIdx.y / xdiv);
    xq += x * (size_t)k;
    xs += x * (size_t)(k / 32);
}
template <bool G>
static __device__ __forceinline__ void v2_pair_x(const v2_segs &sg, const int8_t *&xq, const float2 *&xs, int k) {
    if (G) grouped_x(sg.xdiv, xq, xs, k);
}
/* The segments of ws[0..nw) (nw <= 3) with outputs ys; returns the total row count. */
static inline int v2_segs_fill(v2_segs *sg, const void *const *W, const void *const *S, float *const *ys,
                               const int64_t *n, int nw) {
    int rows = 0;
    for (int i = 0; i < 3; i++) {
        if (i < nw) {
            sg->W[i] = W[i];
            sg->S[i] = S[i];
            sg->y[i] = ys[i];
            rows += (int)n[i];
        } else {
            sg->W[i] = sg->S[i] = NULL;
            sg->y[i] = NULL;
        }
        sg->end[i] = rows;
    }
    sg->sel = NULL;
    sg->xdiv = 1;
    return rows;
}

/* The grouped form of the one-weight int8 kernels (the affine and Q8_0 GEMVs, GR = true,
 * T = 1): launch row blockIdx.y is pair p, which reads slice sel[p] (its planes through the
 * tables W / S), activation row p / xdiv, and writes row p of y [P][n]. */
struct gemv_grouped {
    const int32_t *sel;
    const void *const *W, *const *S;
    int xdiv;
};
/* Points a grouped kernel's weight planes, activations and output at pair blockIdx.y's.
 * The ids come from the routing kernel: read after pdl_wait. */
template <typename W, typename S>
static __device__ __forceinline__ void gemv_grouped_pair(const gemv_grouped &gp, const W *&w, const S *&sc,
                                                         const int8_t *&xq, const float2 *&xs, float *&y, int n,
                                                         int k) {
    grouped_x(gp.xdiv, xq, xs, k);
    int p = blockIdx.y, e = __ldg(gp.sel + p);
    w = (const W *)table_entry(gp.W, e);
    sc = (const S *)table_entry(gp.S, e);
    y += (size_t)p * n;
}

/* The segments of a grouped launch (cuda_gemv_experts): the slices' tables in W / S, their
 * row counts, the pairs' expert ids. */
static inline int v2_segs_experts(v2_segs *sg, const cuda_expert_table *tabs, int nw, float *const *ys,
                                  const int32_t *sel, int xdiv) {
    const void *W[3], *S[3];
    int64_t n[3];
    for (int i = 0; i < nw; i++) {
        W[i] = tabs[i].data;
        S[i] = tabs[i].scales;
        n[i] = tabs[i].proto->n;
    }
    int rows = v2_segs_fill(sg, W, S, ys, n, nw);
    sg->sel = sel;
    sg->xdiv = xdiv;
    return rows;
}

/* v2_store to the row's segment, looked up again here rather than kept in registers
 * through the kernel's loop (the lookup is a few selects on the parameter bank). */
template <int T, bool G = false>
static __device__ __forceinline__ void v2_seg_store(float (&acc)[T], const v2_segs &sg, int grow, int lane) {
    v2_row r;
    v2_seg_row<G>(sg, grow, r);
    v2_store<T>(acc, r.y, r.n, r.row, lane);
}

/* launch(std::integral_constant<int, T>()) for the row counts the v2 kernels are built for
 * (cuda_gemv.cu's chunks: 8, 4, 3, 2, 1); 0 (nothing launched) for any other T. */
template <typename F> static inline int v2_for_rows(int T, F &&launch) {
    switch (T) {
    case 1: launch(std::integral_constant<int, 1>()); return 1;
    case 2: launch(std::integral_constant<int, 2>()); return 1;
    case 3: launch(std::integral_constant<int, 3>()); return 1;
    case 4: launch(std::integral_constant<int, 4>()); return 1;
    case 8: launch(std::integral_constant<int, 8>()); return 1;
    default: return 0;
    }
}
#endif
