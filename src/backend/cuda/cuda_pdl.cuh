/* cuda_pdl.cuh: Programmatic Dependent Launch (sm_90+) for the decode GEMVs. A kernel
 * launched with pdl_launch may start while the kernel before it on the stream is still
 * running; it must call pdl_wait() before its first read of anything an earlier kernel
 * writes and before its first global write (weights, which no kernel writes, may be
 * loaded before). pdl_trigger() lets the next PDL kernel's blocks start early. On older
 * GPUs launches are ordinary and both calls do nothing. Header-only, C++; no state besides
 * the cached device answer and the tests' override. */
#ifndef HEARTH_BACKEND_CUDA_PDL_CUH
#define HEARTH_BACKEND_CUDA_PDL_CUH
#include "backend/cuda/cuda_internal.h"
#include <utility>

/* Waits until every kernel before this one on the stream has finished and its writes are
 * visible (returns at once when this kernel was not launched as a dependent). */
static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel (if launched with pdl_launch) be scheduled now; its own pdl_wait
 * still waits for this kernel to complete, so this is only a scheduling hint. */
static __device__ __forceinline__ void pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* The test override of pdl_on in this translation unit: -1 leaves the default, 0 / 1 force. */
static inline int *pdl_force(void) {
    static int force = -1;
    return &force;
}

/* Whether device 0 can launch programmatic dependents (sm_90+); 0 when it cannot be asked. */
static inline int pdl_device_ok(void) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) {
        cudaGetLastError();
        major = 0;
    }
    return major >= 9;
}

/* 1 when the GEMVs launch as programmatic dependents: device 0 is sm_90+ (or the tests'
 * override says so). The int8 GEMVs, which issue their first weight loads before pdl_wait,
 * gain, and the float GEMVs gain too once they do not prefetch rows into L2
 * (bench/results/kernel_choices.md, "CUDA PDL"). */
static inline int pdl_on(void) {
    static int on = -1;
    if (*pdl_force() >= 0) return *pdl_force();
    if (on < 0) on = pdl_device_ok();
    return on;
}

/* 1 when the decode step's small kernels (norms, RoPE + KV write, attention and its merge,
 * the gated product, bias, gather, argmax) are launched as programmatic dependents: each of
 * them calls pdl_wait() before its first global access, so its blocks may be scheduled
 * while the kernel before it drains. On wherever the device is sm_90+; asked once, at model
 * creation (cuda_gemv_reserve). */
int cuda_pdl_small_on(void); /* cuda_ops.cu: one cached answer for every translation unit */
static inline int pdl_small_on(void) { return cuda_pdl_small_on(); }

/* kernel<<<grid, block, 0, cuda_stream()>>>(args...), as a programmatic dependent of the
 * previous kernel when `on`; errors surface through cudaGetLastError as for <<<>>>. */
template <typename... P, typename... A>
static inline void pdl_launch_if(int on, void (*kernel)(P...), dim3 grid, dim3 block, A &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = cuda_stream();
    cfg.attrs = attr;
    cfg.numAttrs = on ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

/* pdl_launch_if(pdl_on(), ...): the GEMVs' switch. */
template <typename... P, typename... A>
static inline void pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block, A &&...args) {
    pdl_launch_if(pdl_on(), kernel, grid, block, std::forward<A>(args)...);
}

/* pdl_launch_if(pdl_small_on(), ...): the small kernels' switch. */
template <typename... P, typename... A>
static inline void pdl_launch_small(void (*kernel)(P...), dim3 grid, dim3 block, A &&...args) {
    pdl_launch_if(pdl_small_on(), kernel, grid, block, std::forward<A>(args)...);
}
#endif
