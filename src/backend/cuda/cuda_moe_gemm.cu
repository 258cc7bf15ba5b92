/* cuda_moe_gemm.cu: the grouped expert GEMM of a prefill step (cuda_moe_gemm in
 * cuda_backend.h): every active expert's rows in one launch per weight, where the
 * per-expert form ran a gather, three matmuls, a product and a scatter per expert (about
 * 1,500 launches per layer of a 256-expert model at 4,096 tokens).
 *
 * Design. A block owns MG_ROWS (64) output features of one segment: up to MG_TOK (128)
 * (token, expert) pairs that chose the same expert (the caller orders pairs by expert and
 * cuts each expert's run into segments). k is walked in steps of 32: the block dequantizes
 * its 64 x 32 weight tile into shared memory as bf16 (cuda_dequant.cuh, the arithmetic of
 * the dequantize + cuBLAS prefill path, so a weight rounds the same on both), copies the
 * segment's 32-wide bf16 input slices (gathered through xrow; the caller converts each input
 * once, cuda_to_bf16 / cuda_gated_bf16, not once per block), and each of its 4 warps runs
 * mma.m16n8k16.bf16 on 16 feature rows x 8 tokens per n-tile, f32 accumulation. Shared
 * rows are 40 bf16 apart (80 bytes), so the 32-bit fragment loads of a warp (8 rows x 4
 * lanes) hit 32 distinct banks. Precision: the prefill path's (bf16 operands, f32 sums);
 * not batch-invariant (the caller keeps deterministic and exact steps on the per-expert
 * form). Never allocates or synchronizes. */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_internal.h"
#include <cuda_bf16.h>
#include <stdint.h>

#define MG_ROWS 64
#define MG_TOK CUDA_MOE_GEMM_TOKENS
#define MG_K 32
#define MG_S 40
#define MG_THREADS 128
#define DQ_ANY (-1)

static_assert(MG_TOK % 8 == 0 && MG_ROWS == 16 * (MG_THREADS / 32), "tile shape");

typedef struct mg_args {
    cuda_weight w[2];
    const void *const *data[2];
    const void *const *scales[2];
    float *y[2];
    const int32_t *segs, *nseg, *xrow, *yrow;
    const __nv_bfloat16 *x;
} mg_args;

/* c += A (16 x 16 bf16, row) · B (16 x 8 bf16, col), f32 accumulators (sm_80+). */
static __device__ __forceinline__ void mg_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap(); /* the build targets sm_80 and newer only */
#endif
}

static __device__ __forceinline__ uint32_t mg_ld32(const __nv_bfloat16 *p) { return *(const uint32_t *)p; }

static __device__ __forceinline__ void mg_store8(__nv_bfloat16 *dst, const float (&v)[8]) {
    uint32_t pk[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * u], v[2 * u + 1]);
        pk[u] = *(uint32_t *)&b;
    }
    *(uint4 *)dst = make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

/* Elements c .. c + 7 of row r (c % 8 == 0): the 8-wide dequantizers where the format has
 * one, else element by element. */
template <int DQ> static __device__ __forceinline__ void mg_weight8(const cuda_weight &w, int r, int c, float (&v)[8]) {
    if (DQ == DT_Q8_0 || DQ == DT_Q4_K || DQ == DT_Q6_K) {
        dq_flat8<DQ>(w, (size_t)r * (size_t)w.k + (size_t)c, v);
    } else if (DQ == DT_AFFINE) {
        dq_affine8(w, r, c, v);
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = dq_elem(w, r, c + u);
    }
}

template <int DQ> __global__ void __launch_bounds__(MG_THREADS) moe_gemm_kernel(mg_args a) {
    __shared__ __align__(16) __nv_bfloat16 sw[MG_ROWS * MG_S];
    __shared__ __align__(16) __nv_bfloat16 sx[MG_TOK * MG_S];
    if (a.nseg && (int)blockIdx.y >= *a.nseg) return; /* past the routing's segments */
    const int z = blockIdx.z;
    const int32_t *sg = a.segs + 3 * blockIdx.y;
    const int e = sg[0], p0 = sg[1], cnt = sg[2];
    cuda_weight w = a.w[z];
    w.data = (void *)a.data[z][e];
    w.scales = a.scales[z] ? (void *)a.scales[z][e] : NULL;
    const int n = (int)w.n, k = (int)w.k, row0 = blockIdx.x * MG_ROWS, ntiles = (cnt + 7) / 8;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    float acc[MG_TOK / 8][4];
#pragma unroll
    for (int nt = 0; nt < MG_TOK / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += MG_K) {
        /* the weight tile: 64 rows x 4 runs of 8 (rows past n repeat the last; not stored) */
#pragma unroll
        for (int h = 0; h < MG_ROWS * 4 / MG_THREADS; h++) {
            int gi = tid + MG_THREADS * h, r = gi / 4, c = (gi % 4) * 8;
            float v[8];
            mg_weight8<DQ>(w, min(row0 + r, n - 1), k0 + c, v);
            mg_store8(sw + r * MG_S + c, v);
        }
        /* the inputs (bf16 rows): the segment's tokens padded with zeros to whole n-tiles */
        for (int gi = tid; gi < ntiles * 8 * 4; gi += MG_THREADS) {
            int t = gi / 4, c = (gi % 4) * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (t < cnt) {
                size_t p = (size_t)p0 + (size_t)t, row = a.xrow ? (size_t)a.xrow[p] : p;
                v = *(const uint4 *)(a.x + row * (size_t)k + (size_t)(k0 + c));
            }
            *(uint4 *)(sx + t * MG_S + c) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MG_K; kk += 16) {
            /* A: rows g and g + 8 of the warp's 16, k slots 2q, 2q + 1 and 2q + 8, 2q + 9 */
            const __nv_bfloat16 *wa = sw + (warp * 16 + g) * MG_S + kk + 2 * q;
            uint32_t a0 = mg_ld32(wa), a1 = mg_ld32(wa + 8 * MG_S), a2 = mg_ld32(wa + 8),
                     a3 = mg_ld32(wa + 8 * MG_S + 8);
#pragma unroll
            for (int nt = 0; nt < MG_TOK / 8; nt++)
                if (nt < ntiles) { /* B: token g of the n-tile, the same k slots */
                    const __nv_bfloat16 *xb = sx + (nt * 8 + g) * MG_S + kk + 2 * q;
                    mg_mma(acc[nt], a0, a1, a2, a3, mg_ld32(xb), mg_ld32(xb + 8));
                }
        }
        __syncthreads();
    }
    /* accumulator i: feature row g (+ 8 for i >= 2), token 8 nt + 2 q + (i & 1) */
    float *y = a.y[z];
#pragma unroll
    for (int nt = 0; nt < MG_TOK / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = row0 + warp * 16 + g + (i >= 2 ? 8 : 0), t = nt * 8 + 2 * q + (i & 1);
            if (nt < ntiles && row < n && t < cnt) {
                size_t p = (size_t)p0 + (size_t)t;
                size_t yr = a.yrow ? (size_t)a.yrow[p] : p;
                y[yr * (size_t)n + (size_t)row] = acc[nt][i];
            }
        }
}

extern "C" int cuda_moe_gemm_takes(const cuda_weight *w) {
    if (!w || w->n <= 0 || w->k <= 0 || w->k % 32 || (size_t)w->n * (size_t)w->k > (size_t)INT32_MAX) return 0;
    switch (w->dtype) {
    case DT_Q4_K:
    case DT_Q6_K: return w->k % 256 == 0;
    case DT_F32:
    case DT_F16:
    case DT_BF16:
    case DT_Q8_0:
    case DT_AFFINE: return 1;
    case DT_U32: return w->group_size > 0 && w->k % w->group_size == 0;
    default: return 0;
    }
}

template <int DQ> static void mg_launch(dim3 grid, const mg_args &a) {
    moe_gemm_kernel<DQ><<<grid, MG_THREADS, 0, cuda_stream()>>>(a);
}

extern "C" hearth_status cuda_moe_gemm(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *yrow,
                                       const int32_t *segs, int nseg, const int32_t *nseg_dev, const void *x,
                                       const int32_t *xrow, hearth_error *err) {
    if (nseg <= 0) return HEARTH_OK;
    if (nw < 1 || nw > 2 || !segs || !x || nseg > 65535)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_moe_gemm: bad arguments (%d tables, %d segments)", nw, nseg);
    mg_args a = {};
    const cuda_weight *w0 = tabs[0].proto;
    for (int i = 0; i < nw; i++) {
        const cuda_weight *w = tabs[i].proto;
        if (!cuda_moe_gemm_takes(w) || w->dtype != w0->dtype || w->n != w0->n || w->k != w0->k || !tabs[i].data)
            return err_set(err, HEARTH_ERR_INVALID, "cuda_moe_gemm: table %d: a format or shape it does not take", i);
        a.w[i] = *w;
        a.data[i] = tabs[i].data;
        a.scales[i] = tabs[i].scales;
        a.y[i] = ys[i];
    }
    a.segs = segs, a.nseg = nseg_dev, a.xrow = xrow, a.yrow = yrow, a.x = (const __nv_bfloat16 *)x;
    dim3 grid((unsigned)((w0->n + MG_ROWS - 1) / MG_ROWS), (unsigned)nseg, (unsigned)nw);
    switch (w0->dtype) {
    case DT_Q8_0: mg_launch<DT_Q8_0>(grid, a); break;
    case DT_Q4_K: mg_launch<DT_Q4_K>(grid, a); break;
    case DT_Q6_K: mg_launch<DT_Q6_K>(grid, a); break;
    case DT_AFFINE: mg_launch<DT_AFFINE>(grid, a); break;
    default: mg_launch<DQ_ANY>(grid, a); break;
    }
    return cuda_launched("moe_gemm", err);
}
