/* cuda_l2pf.cuh: the device half of cuda_l2pf (cuda_backend.h): the extra blocks a small
 * decode kernel launches to prefetch the next GEMV's weights into L2. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_L2PF_CUH
#define HEARTH_BACKEND_CUDA_L2PF_CUH
#include "backend/cuda/cuda_internal.h"

/* CUDA_L2PF_CHUNK bytes per prefetch instruction: a 16 MB prefix is 256 of them. */
#define L2PF_CHUNK CUDA_L2PF_CHUNK

/* Extra blocks a launch needs for pf (0 when there is nothing to prefetch). */
static inline int l2pf_blocks(const cuda_l2pf *pf) { return pf && pf->spans > 0 ? pf->blocks : 0; }

/* Block `part` of the pf.blocks prefetch blocks: chunk c of a span goes to block c % blocks,
 * thread c / blocks (a strided walk when a span has more chunks than threads). Only
 * addresses inside the spans are touched; call it after pdl_wait or before, as the caller
 * likes (weights are never written by a kernel). */
static __device__ __forceinline__ void l2pf_run(const cuda_l2pf &pf, int part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int s = 0; s < pf.spans; s++) {
        uint32_t n = pf.n[s], chunks = (n + L2PF_CHUNK - 1) / L2PF_CHUNK;
        for (uint32_t c = (uint32_t)part + (uint32_t)pf.blocks * threadIdx.x; c < chunks;
             c += (uint32_t)pf.blocks * blockDim.x) {
            uint32_t off = c * L2PF_CHUNK, len = n - off < L2PF_CHUNK ? n - off : L2PF_CHUNK;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)pf.p[s] + off), "r"(len)
                         : "memory");
        }
    }
#else
    (void)pf, (void)part;
#endif
}

#endif
