/* cuda_norm_tail.cuh: the residual add and rmsnorm (+ int8 copy) of one row at the end of
 * the decode GEMV that makes the residual delta (o_proj, down) at T = 1, so no norm kernel
 * is launched after it: every block counts its arrival on a ticket, and the last one to
 * arrive does x += delta, out = rmsnorm(x) with its 128 threads standing in for
 * norm_row's NORM_THREADS (cuda_norm.cuh) in the same order, so the bits are
 * cuda_add_rmsnorm's / cuda_add_rmsnorm_q8's. Header-only; one ticket per translation unit. */
#ifndef HEARTH_BACKEND_CUDA_NORM_TAIL_CUH
#define HEARTH_BACKEND_CUDA_NORM_TAIL_CUH
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_q8.cuh"
#include <stdint.h>

/* A kernel parameter: what the last block computes (cuda_norm_after, plus the GEMV's own
 * output row as delta). xq NULL: no int8 copy. */
struct norm_tail {
    float *x, *out;
    const float *delta, *w;
    int8_t *xq;
    float2 *xs;
    float shift, eps;
    int n;
    int mode; /* norm_tail_run's ticket (HEARTH_CUDA_NORM_TAIL, A/B runs only) */
};

/* Zero between launches: each launch's last block resets it, so a replayed graph finds it
 * at zero. Launches that use it are stream-ordered (a PDL dependent takes its ticket only
 * after its griddepcontrol.wait, i.e. after the launch before it has completed). */
static __device__ unsigned norm_tail_ticket;

/* Rows up to this many values (norm_row's register form). */
#define NORM_TAIL_MAX (NORM_REG * NORM_THREADS)
/* Warps per block of the GEMVs that end with the norm (16 rows, one row per warp at T = 1):
 * with 4 (the GEMVs' own blocks) the last block's 128 threads took 4 dependent rounds of
 * loads per pass and 32 serial quantized blocks per warp, ~16 us per launch on the H200
 * (round 19); 512 threads hold a 4096 row in one round (8 values and 8 weights each). */
#define NORM_TAIL_WARPS 16

/* The last block's work, its NORM_TAIL_WARPS warps standing in for norm_row's 32 (warp a
 * takes stand-in warps a, a + NORM_TAIL_WARPS, ...): J values per stand-in thread
 * (elements i = 32 vw + lane + NORM_THREADS j), VW stand-in warps per loop step. */
template <int J, int VW> static __device__ __forceinline__ void norm_tail_row(const norm_tail &a, float *part) {
    constexpr int warps = NORM_TAIL_WARPS, VWS = NORM_THREADS / 32;
    constexpr bool ONE = VW * warps >= VWS; /* one step: the weights load with x, values stay in registers */
    const int lane = threadIdx.x % 32, n = a.n;
    float v[VW][J], wv[VW][J];
    /* x += delta and each stand-in thread's sum of squares, in norm_row_load's order */
#pragma unroll
    for (int vw0 = threadIdx.x / 32; vw0 < VWS; vw0 += VW * warps) {
#pragma unroll
        for (int u = 0; u < VW; u++)
#pragma unroll
            for (int j = 0; j < J; j++) {
                int i = (vw0 + u * warps) * 32 + lane + j * NORM_THREADS;
                bool in = vw0 + u * warps < VWS && i < n;
                v[u][j] = in ? __ldcg(a.x + i) + __ldcg(a.delta + i) : 0.0f;
                if (ONE) wv[u][j] = in ? __ldg(a.w + i) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < VW; u++) {
            if (vw0 + u * warps >= VWS) break;
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
                int i = (vw0 + u * warps) * 32 + lane + j * NORM_THREADS;
                if (i < n) {
                    a.x[i] = v[u][j];
                    ss += v[u][j] * v[u][j];
                }
            }
            ss = norm_warp_sum(ss);
            if (lane == 0) part[vw0 + u * warps] = ss;
        }
    }
    __syncthreads();
    float tot = 0.0f; /* block_inv_rms's sum of the warp sums, in warp order */
    for (int i = 0; i < VWS; i++) tot += part[i];
    float inv = 1.0f / sqrtf(tot / (float)n + a.eps);
    /* out (and its int8 blocks: a stand-in warp's 32 lanes hold one block per j, n % 32 == 0) */
#pragma unroll
    for (int vw0 = threadIdx.x / 32; vw0 < VWS; vw0 += VW * warps) {
        if (!ONE)
#pragma unroll
            for (int u = 0; u < VW; u++)
#pragma unroll
                for (int j = 0; j < J; j++) {
                    int i = (vw0 + u * warps) * 32 + lane + j * NORM_THREADS;
                    bool in = vw0 + u * warps < VWS && i < n;
                    v[u][j] = in ? a.x[i] : 0.0f; /* this thread's own store above */
                    wv[u][j] = in ? __ldg(a.w + i) : 0.0f;
                }
#pragma unroll
        for (int u = 0; u < VW; u++) {
            if (vw0 + u * warps >= VWS) break;
#pragma unroll
            for (int j = 0; j < J; j++) {
                int i = (vw0 + u * warps) * 32 + lane + j * NORM_THREADS;
                if (i >= n) break; /* uniform per warp when xq is given */
                float y = v[u][j] * inv * (wv[u][j] + a.shift);
                a.out[i] = y;
                if (a.xq) quant_block32(y, a.xq + (i - lane), a.xs + i / 32, lane);
            }
        }
    }
}

/* Called by every thread of every block of the GEMV (blocks of NORM_TAIL_WARPS warps) after
 * its outputs are written. */
static __device__ __forceinline__ void norm_tail_run(const norm_tail &a) {
    __shared__ unsigned last;
    __shared__ float part[NORM_THREADS / 32];
    if (a.mode == 3) return; /* timing only: the GEMV's own cost in this form */
    __syncthreads();         /* this block's rows of delta are written */
    if (threadIdx.x == 0) {
        unsigned t;
        if (a.mode == 1) { /* sequentially consistent fences around a relaxed atomic */
            __threadfence();
            t = atomicAdd(&norm_tail_ticket, 1u);
        } else { /* release: the block's writes before it (the barrier above); acquire: every
                  * earlier block's, for the last one (the pattern of a CUTLASS semaphore) */
            asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(t) : "l"(&norm_tail_ticket) : "memory");
        }
        last = t == gridDim.x - 1;
        if (last) {
            norm_tail_ticket = 0; /* for the next launch */
            if (a.mode == 1) __threadfence();
        }
    }
    __syncthreads();
    if (!last || a.mode == 2) return; /* 2: timing only, the ticket without the norm */
    pdl_wait();                       /* x comes from earlier kernels (a no-op where this thread already waited) */
    if (a.n <= NORM_THREADS * 4)
        norm_tail_row<4, 2>(a, part);
    else
        norm_tail_row<NORM_REG, 1>(a, part);
}
#endif
