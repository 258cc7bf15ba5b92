/* cuda_gemv.cuh: what the decode GEMV files (cuda_gemv.cu, cuda_gemv_v2.cu,
 * cuda_gemv_mlx4.cu) share: the streaming weight load, and for the v2 kernels their launch
 * shape, fixed-order lane reduction and dispatch over T. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_GEMV_CUH
#define HEARTH_BACKEND_CUDA_GEMV_CUH
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
