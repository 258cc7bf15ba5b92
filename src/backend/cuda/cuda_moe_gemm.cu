/* cuda_moe_gemm.cu: the grouped expert GEMM of a prefill step (cuda_moe_gemm in
 * cuda_backend.h): every active expert's rows in one launch per weight, where the
 * per-expert form ran a gather, three matmuls, a product and a scatter per expert (about
 * 1,500 launches per layer of a 256-expert model at 4,096 tokens).
 *
 * Design. A block owns MG_ROWS (64) output features of one segment: up to MG_TOK (128)
 * (token, expert) pairs that chose the same expert (the caller orders pairs by expert and
 * cuts each expert's run into segments). k is walked in steps of 64 over two sets of shared
 * tiles (dynamic shared memory, 55,296 bytes a block, opted in at a format's first launch):
 * while the 4 warps run mma.m16n8k16.bf16 on one set (16 feature rows x 8 tokens per n-tile,
 * f32 accumulation), the segment's next 64-wide bf16 input slices land in the other by
 * 16-byte cp.async (gathered through xrow; the caller converts each input once,
 * cuda_to_bf16 / cuda_gated_bf16, not once per block), and after the mma the block
 * dequantizes its next 64 x 64 weight tile there as bf16 (cuda_dequant.cuh, the arithmetic of
 * the dequantize + cuBLAS prefill path, so a weight rounds the same on both); one barrier a
 * step. Shared rows are 72 bf16 apart (144 bytes), so the 32-bit fragment loads of a warp
 * (8 rows x 4 lanes) hit 32 distinct banks. __launch_bounds__(128, 4): 128 registers, four
 * blocks an SM (it replaced a single-buffered form with 32-wide steps, two barriers a step
 * and synchronous loads: bench/results/cuda_newfam.md). Precision: the prefill path's (bf16
 * operands, f32 sums); not batch-invariant (the caller keeps deterministic and exact steps
 * on the per-expert form). Never allocates or synchronizes. */
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_internal.h"
#include <cuda_bf16.h>
#include <stdint.h>

#define MG_ROWS 64
#define MG_TOK CUDA_MOE_GEMM_TOKENS
#define MG_K 64
#define MG_S 72
#define MG_SMEM (2 * (MG_ROWS + MG_TOK) * MG_S * 2)
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

/* 16-byte copy global -> shared, zero-filled when !on. */
static __device__ __forceinline__ void mg_cp16(void *smem, const void *gmem, bool on) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(on ? 16 : 0));
}

/* The block's weight tile at k0 into sw as bf16: 64 rows x 8 runs of 8 (zeros past k; rows
 * past n repeat the last, whose outputs are not stored). */
template <int DQ>
static __device__ __forceinline__ void mg_load_w(__nv_bfloat16 *sw, const cuda_weight &w, int row0, int n, int k,
                                                 int k0, int tid) {
#pragma unroll
    for (int h = 0; h < MG_ROWS * (MG_K / 8) / MG_THREADS; h++) {
        int gi = tid + MG_THREADS * h, r = gi / (MG_K / 8), c = (gi % (MG_K / 8)) * 8;
        float v[8];
        if (k0 + c < k) {
            mg_weight8<DQ>(w, min(row0 + r, n - 1), k0 + c, v);
        } else {
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = 0.0f;
        }
        mg_store8(sw + r * MG_S + c, v);
    }
}

/* The segment's input rows at k0 into sx by cp.async, 8 bf16 a copy (zeros past its cnt
 * tokens, up to whole n-tiles, and past k), committed as one group. */
static __device__ __forceinline__ void mg_load_x(__nv_bfloat16 *sx, const mg_args &a, int p0, int cnt, int ntiles,
                                                 int k, int k0, int tid) {
    for (int gi = tid; gi < ntiles * 8 * (MG_K / 8); gi += MG_THREADS) {
        int t = gi / (MG_K / 8), c = (gi % (MG_K / 8)) * 8;
        bool on = t < cnt && k0 + c < k;
        size_t row = 0;
        if (on) {
            size_t p = (size_t)p0 + (size_t)t;
            row = a.xrow ? (size_t)a.xrow[p] : p;
        }
        mg_cp16(sx + t * MG_S + c, a.x + (on ? row * (size_t)k + (size_t)(k0 + c) : 0), on);
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Step kt's mma runs on set kt & 1 while the next step's input rows are copied (cp.async)
 * into the other set; after the mma the warps dequantize the next weight tile into it. */
template <int DQ> __global__ void __launch_bounds__(MG_THREADS, 4) moe_gemm_kernel(mg_args a) {
    extern __shared__ __align__(16) __nv_bfloat16 mg_sh[]; /* MG_SMEM bytes: above the 48 KB of static shared memory */
#define SW(b) (mg_sh + (b) * (MG_ROWS * MG_S))
#define SX(b) (mg_sh + 2 * MG_ROWS * MG_S + (b) * (MG_TOK * MG_S))
    if (a.nseg && (int)blockIdx.y >= *a.nseg) return; /* past the routing's segments */
    const int z = blockIdx.z;
    const int32_t *sg = a.segs + 3 * blockIdx.y;
    const int e = sg[0], p0 = sg[1], cnt = sg[2];
    cuda_weight w = a.w[z];
    w.data = (void *)a.data[z][e];
    w.scales = a.scales[z] ? (void *)a.scales[z][e] : NULL;
    const int n = (int)w.n, k = (int)w.k, row0 = blockIdx.x * MG_ROWS, ntiles = (cnt + 7) / 8;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int nk = (k + MG_K - 1) / MG_K;
    float acc[MG_TOK / 8][4];
#pragma unroll
    for (int nt = 0; nt < MG_TOK / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    mg_load_x(SX(0), a, p0, cnt, ntiles, k, 0, tid);
    mg_load_w<DQ>(SW(0), w, row0, n, k, 0, tid);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt & 1, k0n = (kt + 1) * MG_K;
        if (kt + 1 < nk) mg_load_x(SX(cur ^ 1), a, p0, cnt, ntiles, k, k0n, tid);
#pragma unroll
        for (int kk = 0; kk < MG_K; kk += 16) {
            const __nv_bfloat16 *wa = SW(cur) + (warp * 16 + g) * MG_S + kk + 2 * q;
            uint32_t a0 = mg_ld32(wa), a1 = mg_ld32(wa + 8 * MG_S), a2 = mg_ld32(wa + 8),
                     a3 = mg_ld32(wa + 8 * MG_S + 8);
#pragma unroll
            for (int nt = 0; nt < MG_TOK / 8; nt++)
                if (nt < ntiles) {
                    const __nv_bfloat16 *xb = SX(cur) + (nt * 8 + g) * MG_S + kk + 2 * q;
                    mg_mma(acc[nt], a0, a1, a2, a3, mg_ld32(xb), mg_ld32(xb + 8));
                }
        }
        if (kt + 1 < nk) mg_load_w<DQ>(SW(cur ^ 1), w, row0, n, k, k0n, tid);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
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
    static bool opted; /* per instantiation, once (the first launch of each format) */
    if (!opted)
        cudaFuncSetAttribute(moe_gemm_kernel<DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, MG_SMEM), opted = true;
    moe_gemm_kernel<DQ><<<grid, MG_THREADS, MG_SMEM, cuda_stream()>>>(a);
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
