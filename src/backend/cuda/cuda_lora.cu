/* cuda_lora.cu: the grouped low-rank update of LoRA / DoRA adapters (cuda_model.c calls it
 * right after an adapted projection's matmul in steps that have adapters). One block per
 * row of the step; a row's adapters are applied one after the other, each as shrink (u =
 * A x, rank values in shared memory) then expand (y += scale * B^T u, DoRA rescale), with
 * the CPU's order of float operations (ops.c lora_row), so both backends give the same bits. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_lora.h"
}

#define LORA_THREADS 256
/* ops.c lora_row sums each row of A in eight interleaved partial sums (lane j takes the
 * elements j, j + 8, ...; the k % 8 tail goes to lane 0), combined pairwise. */
#define LORA_LANES 8
#define LORA_RANKS_PER_PASS (LORA_THREADS / LORA_LANES)

__global__ void __launch_bounds__(LORA_THREADS) lora_kernel(const cuda_lora *const *sets, const int32_t *n_set, int idx,
                                                            const float *x, int64_t k, float *y, int64_t n) {
    __shared__ float u[CUDA_LORA_MAX_RANK];
    __shared__ float part[LORA_THREADS];
    const int t = blockIdx.x, tid = threadIdx.x;
    const int count = n_set[t]; /* the same for the whole block: every __syncthreads below is reached by all */
    const float *xr = x + (size_t)t * k;
    float *yr = y + (size_t)t * n;
    const int64_t k8 = k / LORA_LANES * LORA_LANES;
    for (int i = 0; i < count; i++) {
        const cuda_lora *l = &sets[(size_t)t * CUDA_LORA_MAX_SET + i][idx];
        if (!l->a) continue; /* this adapter leaves the projection alone */
        const int rank = l->rank;
        /* shrink: u[r] = A[r] . x, 32 ranks per pass (8 threads each) */
        for (int r0 = 0; r0 < rank; r0 += LORA_RANKS_PER_PASS) {
            int r = r0 + tid / LORA_LANES, lane = tid % LORA_LANES;
            float p = 0.0f;
            if (r < rank) {
                const float *a = l->a + (size_t)r * k;
                for (int64_t j = lane; j < k8; j += LORA_LANES) p = __fadd_rn(p, __fmul_rn(a[j], xr[j]));
                if (lane == 0)
                    for (int64_t j = k8; j < k; j++) p = __fadd_rn(p, __fmul_rn(a[j], xr[j]));
            }
            part[tid] = p;
            __syncthreads();
            if (tid < LORA_RANKS_PER_PASS && r0 + tid < rank) {
                const float *q = part + tid * LORA_LANES;
                u[r0 + tid] = __fadd_rn(__fadd_rn(__fadd_rn(q[0], q[1]), __fadd_rn(q[2], q[3])),
                                        __fadd_rn(__fadd_rn(q[4], q[5]), __fadd_rn(q[6], q[7])));
            }
            __syncthreads();
        }
        /* expand: B is stored transposed, [rank, n]: consecutive threads read consecutive outputs */
        for (int64_t j = tid; j < n; j += LORA_THREADS) {
            float acc = 0.0f;
            for (int r = 0; r < rank; r++) acc = __fadd_rn(acc, __fmul_rn(l->b[(size_t)r * n + j], u[r]));
            float v = __fadd_rn(yr[j], __fmul_rn(l->scale, acc));
            if (l->dora) v = __fmul_rn(v, l->dora[j]);
            yr[j] = v;
        }
        __syncthreads(); /* u is rewritten by the row's next adapter */
    }
}

extern "C" hearth_status cuda_lora_apply(const cuda_lora *const *sets, const int32_t *n_set, int idx, const float *x,
                                         int64_t k, float *y, int64_t n, int T, hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    lora_kernel<<<dim3((unsigned)T), dim3(LORA_THREADS), 0, cuda_stream()>>>(sets, n_set, idx, x, k, y, n);
    return cuda_launched("lora", err);
}
