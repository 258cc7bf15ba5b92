/* cuda_lora.cu: the grouped low-rank update of LoRA / DoRA adapters (cuda_model.c calls it
 * right after an adapted projection's matmul in steps that have adapters), in two tiers.
 * Exact (--cuda-exact): one block per row of the step; a row's adapters are applied one
 * after the other, each as shrink (u = A x, rank values in shared memory) then expand (y +=
 * scale * B^T u, DoRA rescale), with the CPU's order of float operations (ops.c lora_row),
 * so both backends give the same bits. Fast (serving): every (row, adapter, rank) dot
 * product of up to three projections that share their input at once, one block each, into
 * a scratch, then one thread per (row, output). */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_lora.h"
}

#define LORA_THREADS 256
/* ops.c lora_row sums each row of A in eight interleaved partial sums (lane j takes the
 * elements j, j + 8, ...; the k % 8 tail goes to lane 0), combined pairwise. */
#define LORA_LANES 8
#define LORA_RANKS_PER_PASS (LORA_THREADS / LORA_LANES)

__global__ void __launch_bounds__(LORA_THREADS)
    lora_kernel(const cuda_lora *const *sets, const int32_t *n_set, int idx, int expert, const float *x, int64_t k,
                float *y, int64_t n) {
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
        const float *A = l->a + (size_t)expert * rank * k, *B = l->b + (size_t)expert * rank * n;
        /* shrink: u[r] = A[r] . x, 32 ranks per pass (8 threads each) */
        for (int r0 = 0; r0 < rank; r0 += LORA_RANKS_PER_PASS) {
            int r = r0 + tid / LORA_LANES, lane = tid % LORA_LANES;
            float p = 0.0f;
            if (r < rank) {
                const float *a = A + (size_t)r * k;
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
            for (int r = 0; r < rank; r++) acc = __fadd_rn(acc, __fmul_rn(B[(size_t)r * n + j], u[r]));
            float v = __fadd_rn(yr[j], __fmul_rn(l->scale, acc));
            if (l->dora) v = __fmul_rn(v, l->dora[j]);
            yr[j] = v;
        }
        __syncthreads(); /* u is rewritten by the row's next adapter */
    }
}

/* Fast tier: the projections of one launch pair (up to CUDA_LORA_MAX_GROUP reading the same
 * x), by value. Expand blocks [first_block[g], first_block[g + 1]) cover projection g. */
typedef struct lora_group {
    int np, expert;
    int idx[CUDA_LORA_MAX_GROUP];
    float *y[CUDA_LORA_MAX_GROUP];
    int64_t n[CUDA_LORA_MAX_GROUP];
    int first_block[CUDA_LORA_MAX_GROUP + 1];
} lora_group;

/* v[g] for a g known only at run time, without indexing the kernel's by-value parameters
 * (which would copy them to local memory). */
static_assert(CUDA_LORA_MAX_GROUP == 3, "lora_pick names each projection of a group");
template <class V> __device__ __forceinline__ V lora_pick(const V (&v)[CUDA_LORA_MAX_GROUP], int g) {
    return g == 0 ? v[0] : g == 1 ? v[1] : v[2];
}

/* The rank values of (row of the chunk, projection g, adapter i) in the scratch. */
__device__ __forceinline__ float *lora_u(float *u, int row, int g, int i) {
    return u + (((size_t)row * CUDA_LORA_MAX_GROUP + g) * CUDA_LORA_MAX_SET + i) * CUDA_LORA_MAX_RANK;
}

/* Shrink: block (c, g, row) computes ranks c, c + LORA_SHRINK_RANKS, ... of projection g of
 * each of the row's adapters in turn, each as one dot product of A's row with x over all
 * the block's threads (coalesced float4 loads where A's row and x are 16-byte aligned,
 * scalar loads otherwise), reduced by warp shuffles then across the warps in shared memory.
 * LORA_SHRINK_RANKS blocks per (row, projection): a rank-16 adapter is one rank per block,
 * enough blocks in flight to keep the loads of a 32-row decode step going, and no block
 * per empty adapter slot (a grid over the slots would be mostly blocks that only exit).
 * Every condition and loop bound before a barrier is the block's own. */
#define LORA_SHRINK_THREADS 256
#define LORA_SHRINK_WARPS (LORA_SHRINK_THREADS / 32)
#define LORA_SHRINK_RANKS 16
#define LORA_EXPAND_THREADS 256

__global__ void __launch_bounds__(LORA_SHRINK_THREADS)
    lora_shrink_fast(const cuda_lora *const *sets, const int32_t *n_set, lora_group grp, int t0, const float *x,
                     int64_t k, float *u) {
    __shared__ float part[LORA_SHRINK_WARPS];
    const int row = blockIdx.z, g = blockIdx.y, t = t0 + row, count = n_set[t], idx = lora_pick(grp.idx, g);
    const int tid = threadIdx.x, lane = tid % 32;
    const float *xr = x + (size_t)t * k;
    for (int i = 0; i < count; i++) {
        const cuda_lora *l = &sets[(size_t)t * CUDA_LORA_MAX_SET + i][idx];
        if (!l->a) continue; /* this adapter leaves the projection alone */
        float *ur = lora_u(u, row, g, i);
        for (int r = blockIdx.x; r < l->rank; r += LORA_SHRINK_RANKS) {
            const float *a = l->a + ((size_t)grp.expert * l->rank + r) * k;
            float p = 0.0f;
            int64_t tail = 0; /* the first element the scalar loop takes */
            if ((((uintptr_t)a | (uintptr_t)xr) & 15) == 0) {
                const float4 *a4 = (const float4 *)a, *x4 = (const float4 *)xr;
                const int64_t k4 = k / 4;
#pragma unroll 4
                for (int64_t j = tid; j < k4; j += LORA_SHRINK_THREADS) {
                    const float4 av = __ldg(a4 + j), xv = x4[j];
                    p += av.x * xv.x + av.y * xv.y + av.z * xv.z + av.w * xv.w;
                }
                tail = k4 * 4;
            }
            for (int64_t j = tail + tid; j < k; j += LORA_SHRINK_THREADS) p += __ldg(a + j) * xr[j];
            for (int o = 16; o > 0; o /= 2) p += __shfl_xor_sync(0xffffffffu, p, o);
            if (lane == 0) part[tid / 32] = p;
            __syncthreads();
            if (tid == 0) {
                float sum = 0.0f;
                for (int w = 0; w < LORA_SHRINK_WARPS; w++) sum += part[w];
                ur[r] = sum;
            }
            __syncthreads(); /* part is rewritten for the next rank */
        }
    }
}

/* Expand: thread (j of projection g, row) adds each adapter's scale * sum_r B^T[r][j] u[r]
 * to y_g[row][j], then its DoRA rescale, adapter after adapter in the row's order (ops.c
 * lora_row's semantics); consecutive threads read consecutive entries of B's rows. A row no
 * adapter touches keeps its bits (not even rewritten). */
__global__ void __launch_bounds__(LORA_EXPAND_THREADS)
    lora_expand_fast(const cuda_lora *const *sets, const int32_t *n_set, lora_group grp, int t0, float *u) {
    const int row = blockIdx.y, t = t0 + row, bx = blockIdx.x;
    /* the projection: how many of its later first blocks bx has reached (they never decrease) */
    const int g = (grp.np > 1 && bx >= grp.first_block[1]) + (grp.np > 2 && bx >= grp.first_block[2]);
    const int idx = lora_pick(grp.idx, g), first = g == 0 ? 0 : g == 1 ? grp.first_block[1] : grp.first_block[2];
    const int64_t n = lora_pick(grp.n, g), j = (int64_t)(bx - first) * LORA_EXPAND_THREADS + threadIdx.x;
    const int count = n_set[t];
    if (j >= n || count == 0) return;
    float *yj = lora_pick(grp.y, g) + (size_t)t * n + j;
    float v = *yj;
    int touched = 0;
    for (int i = 0; i < count; i++) {
        const cuda_lora *l = &sets[(size_t)t * CUDA_LORA_MAX_SET + i][idx];
        if (!l->a) continue;
        const float *ur = lora_u(u, row, g, i);
        float acc = 0.0f;
        const float *B = l->b + (size_t)grp.expert * l->rank * n;
        for (int r = 0; r < l->rank; r++) acc += __ldg(B + (size_t)r * n + j) * ur[r];
        v += l->scale * acc;
        if (l->dora) v *= __ldg(l->dora + j);
        touched = 1;
    }
    if (touched) *yj = v;
}

/* Grouped fast tier (cuda_lora_apply_grouped): the step's rows grouped by adapter, so each
 * adapter's A and B are read once per step and projection instead of once per row (a 32-row
 * decode step over 8 adapters read every adapter's factors four times, each row's loads one
 * after the other). groups: the adapter table of each group u (gtab[u]) and the int32 table
 * gi = {U, offsets[0 .. T], rows[T]}: group u's rows are rows[offsets[u] .. offsets[u + 1]).
 * The grid has T group slots (U <= T); slots past U exit at once, so a launch's shape
 * depends on T only. */
#define LORA_GROUP_ROWS 8   /* a group's rows in one pass (register accumulators) */
#define LORA_GROUP_RANKS 16 /* B values a thread holds at once in the expand */

/* Shrink: block (r0, g, u): ranks r0, r0 + LORA_SHRINK_RANKS, ... of projection g of group u's
 * adapter, each row of A read once and dotted with up to LORA_GROUP_ROWS of the group's input
 * rows at a time; the rank values go where the row-major shrink puts them (slot 0). */
__global__ void __launch_bounds__(LORA_SHRINK_THREADS)
    lora_shrink_grouped(const cuda_lora *const *gtab, const int32_t *gi, int T, lora_group grp, const float *x,
                        int64_t k, float *u) {
    __shared__ float part[LORA_SHRINK_WARPS][LORA_GROUP_ROWS];
    const int grp_u = blockIdx.z, g = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (grp_u >= gi[0]) return; /* the block's own condition: no barrier is skipped by part of it */
    const cuda_lora *l = &gtab[grp_u][lora_pick(grp.idx, g)];
    if (!l->a) return;
    const int32_t *off = gi + 1, *rows = gi + 2 + T;
    const int p0 = off[grp_u], p1 = off[grp_u + 1];
    const bool x_vec = (k & 3) == 0 && ((uintptr_t)x & 15) == 0;
    for (int r = blockIdx.x; r < l->rank; r += LORA_SHRINK_RANKS) {
        const float *a = l->a + ((size_t)grp.expert * l->rank + r) * k;
        const bool vec = x_vec && ((uintptr_t)a & 15) == 0;
        const int64_t tail = vec ? k / 4 * 4 : 0;
        for (int q0 = p0; q0 < p1; q0 += LORA_GROUP_ROWS) {
            const int m = min(LORA_GROUP_ROWS, p1 - q0);
            const float *xr[LORA_GROUP_ROWS];
            float acc[LORA_GROUP_ROWS];
#pragma unroll
            for (int i = 0; i < LORA_GROUP_ROWS; i++) acc[i] = 0.0f, xr[i] = x + (size_t)rows[q0 + min(i, m - 1)] * k;
            if (vec) {
                const float4 *a4 = (const float4 *)a;
                for (int64_t j = tid; j < k / 4; j += LORA_SHRINK_THREADS) {
                    const float4 av = __ldg(a4 + j);
#pragma unroll
                    for (int i = 0; i < LORA_GROUP_ROWS; i++)
                        if (i < m) {
                            const float4 xv = ((const float4 *)xr[i])[j];
                            acc[i] += av.x * xv.x + av.y * xv.y + av.z * xv.z + av.w * xv.w;
                        }
                }
            }
            for (int64_t j = tail + tid; j < k; j += LORA_SHRINK_THREADS) {
                const float av = __ldg(a + j);
#pragma unroll
                for (int i = 0; i < LORA_GROUP_ROWS; i++)
                    if (i < m) acc[i] += av * xr[i][j];
            }
#pragma unroll
            for (int i = 0; i < LORA_GROUP_ROWS; i++) {
                float p = acc[i];
                for (int o = 16; o > 0; o /= 2) p += __shfl_xor_sync(0xffffffffu, p, o);
                if (lane == 0) part[warp][i] = p;
            }
            __syncthreads();
            if (tid < m) {
                float sum = 0.0f;
                for (int w = 0; w < LORA_SHRINK_WARPS; w++) sum += part[w][tid];
                lora_u(u, rows[q0 + tid], g, 0)[r] = sum;
            }
            __syncthreads(); /* part is rewritten by the next pass */
        }
    }
}

/* Expand: thread (j of projection g, group u) holds LORA_GROUP_RANKS of B's column j at a
 * time (independent loads) and adds scale * sum_r B^T[r][j] u[r] to y_g[row][j] of each of
 * the group's rows, then the DoRA rescale; each row has this one adapter, so no two blocks
 * write the same output. */
__global__ void __launch_bounds__(LORA_EXPAND_THREADS)
    lora_expand_grouped(const cuda_lora *const *gtab, const int32_t *gi, int T, lora_group grp, const float *u) {
    const int grp_u = blockIdx.y, bx = blockIdx.x;
    if (grp_u >= gi[0]) return;
    const int g = (grp.np > 1 && bx >= grp.first_block[1]) + (grp.np > 2 && bx >= grp.first_block[2]);
    const int idx = lora_pick(grp.idx, g), first = g == 0 ? 0 : g == 1 ? grp.first_block[1] : grp.first_block[2];
    const int64_t n = lora_pick(grp.n, g), j = (int64_t)(bx - first) * LORA_EXPAND_THREADS + threadIdx.x;
    const cuda_lora *l = &gtab[grp_u][idx];
    if (j >= n || !l->a) return;
    const int32_t *off = gi + 1, *rows = gi + 2 + T;
    const int p0 = off[grp_u], p1 = off[grp_u + 1], rank = l->rank;
    const float *B = l->b + (size_t)grp.expert * rank * n + j;
    float *y = lora_pick(grp.y, g);
    const float dora = l->dora ? __ldg(l->dora + j) : 1.0f;
    for (int q0 = p0; q0 < p1; q0 += LORA_GROUP_ROWS) {
        const int m = min(LORA_GROUP_ROWS, p1 - q0);
        float acc[LORA_GROUP_ROWS];
#pragma unroll
        for (int i = 0; i < LORA_GROUP_ROWS; i++) acc[i] = 0.0f;
        for (int r0 = 0; r0 < rank; r0 += LORA_GROUP_RANKS) {
            float bv[LORA_GROUP_RANKS];
#pragma unroll
            for (int rr = 0; rr < LORA_GROUP_RANKS; rr++)
                bv[rr] = r0 + rr < rank ? __ldg(B + (size_t)(r0 + rr) * n) : 0.0f;
#pragma unroll
            for (int i = 0; i < LORA_GROUP_ROWS; i++)
                if (i < m) {
                    const float *ur = lora_u((float *)u, rows[q0 + i], g, 0) + r0;
#pragma unroll
                    for (int rr = 0; rr < LORA_GROUP_RANKS; rr++)
                        if (r0 + rr < rank) acc[i] += bv[rr] * ur[rr];
                }
        }
#pragma unroll
        for (int i = 0; i < LORA_GROUP_ROWS; i++)
            if (i < m) {
                float *yj = y + (size_t)rows[q0 + i] * n + j;
                *yj = (*yj + l->scale * acc[i]) * dora;
            }
    }
}

/* The np projections' lora_group (their table entries, outputs and expand block ranges). */
static hearth_status lora_group_make(int np, const int *idx, int expert, float *const *ys, const int64_t *ns,
                                     lora_group *grp, hearth_error *err) {
    if (np < 1 || np > CUDA_LORA_MAX_GROUP)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: %d projections in one adapter launch (1 to %d)", np,
                       CUDA_LORA_MAX_GROUP);
    *grp = lora_group{};
    grp->np = np;
    grp->expert = expert;
    for (int g = 0; g < np; g++) {
        grp->idx[g] = idx[g], grp->y[g] = ys[g], grp->n[g] = ns[g];
        grp->first_block[g + 1] = grp->first_block[g] + (int)((ns[g] + LORA_EXPAND_THREADS - 1) / LORA_EXPAND_THREADS);
    }
    return HEARTH_OK;
}

extern "C" hearth_status cuda_lora_apply_grouped(const cuda_lora *const *gtab, const int32_t *gi, int np,
                                                 const int *idx, float *const *ys, const int64_t *ns, const float *x,
                                                 int64_t k, int T, float *u, hearth_error *err) {
    if (T <= 0) return HEARTH_OK;
    if (T > CUDA_LORA_FAST_ROWS)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a grouped adapter step of %d rows (at most %d)", T,
                       CUDA_LORA_FAST_ROWS);
    lora_group grp;
    hearth_status st = lora_group_make(np, idx, 0, ys, ns, &grp, err);
    if (st || grp.first_block[np] <= 0) return st;
    lora_shrink_grouped<<<dim3(LORA_SHRINK_RANKS, (unsigned)np, (unsigned)T), dim3(LORA_SHRINK_THREADS), 0,
                          cuda_stream()>>>(gtab, gi, T, grp, x, k, u);
    st = cuda_launched("lora shrink (grouped)", err);
    if (st) return st;
    lora_expand_grouped<<<dim3((unsigned)grp.first_block[np], (unsigned)T), dim3(LORA_EXPAND_THREADS), 0,
                          cuda_stream()>>>(gtab, gi, T, grp, u);
    return cuda_launched("lora expand (grouped)", err);
}

extern "C" hearth_status cuda_lora_apply_fast(const cuda_lora *const *sets, const int32_t *n_set, int np,
                                              const int *idx, int expert, float *const *ys, const int64_t *ns,
                                              const float *x, int64_t k, int T, float *u, hearth_error *err) {
    lora_group grp;
    hearth_status st0 = lora_group_make(np, idx, expert, ys, ns, &grp, err);
    if (st0 || grp.first_block[np] <= 0) return st0;
    /* the scratch holds CUDA_LORA_FAST_ROWS rows: longer steps go in chunks (stream order
     * keeps a chunk's shrink after the previous chunk's expand) */
    for (int t0 = 0; t0 < T; t0 += CUDA_LORA_FAST_ROWS) {
        const int rows = T - t0 < CUDA_LORA_FAST_ROWS ? T - t0 : CUDA_LORA_FAST_ROWS;
        lora_shrink_fast<<<dim3(LORA_SHRINK_RANKS, (unsigned)np, (unsigned)rows), dim3(LORA_SHRINK_THREADS), 0,
                           cuda_stream()>>>(sets, n_set, grp, t0, x, k, u);
        hearth_status st = cuda_launched("lora shrink", err);
        if (st) return st;
        lora_expand_fast<<<dim3((unsigned)grp.first_block[np], (unsigned)rows), dim3(LORA_EXPAND_THREADS), 0,
                           cuda_stream()>>>(sets, n_set, grp, t0, u);
        st = cuda_launched("lora expand", err);
        if (st) return st;
    }
    return HEARTH_OK;
}

extern "C" hearth_status cuda_lora_apply(const cuda_lora *const *sets, const int32_t *n_set, int idx, int expert,
                                         const float *x, int64_t k, float *y, int64_t n, int T, hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    lora_kernel<<<dim3((unsigned)T), dim3(LORA_THREADS), 0, cuda_stream()>>>(sets, n_set, idx, expert, x, k, y, n);
    return cuda_launched("lora", err);
}

/* thread (i, slot j): row i's j-th table pointer, and its count from slot 0 */
__global__ void lora_gather_kernel(const cuda_lora *const *sets, const int32_t *n_set, const int32_t *rows, int n,
                                   const cuda_lora **out_sets, int32_t *out_n) {
    int i = blockIdx.x * blockDim.x / CUDA_LORA_MAX_SET + threadIdx.x / CUDA_LORA_MAX_SET,
        j = threadIdx.x % CUDA_LORA_MAX_SET;
    if (i >= n) return;
    int t = rows[i];
    out_sets[(size_t)i * CUDA_LORA_MAX_SET + j] = sets[(size_t)t * CUDA_LORA_MAX_SET + j];
    if (j == 0) out_n[i] = n_set[t];
}

extern "C" hearth_status cuda_lora_gather_sets(const cuda_lora *const *sets, const int32_t *n_set, const int32_t *rows,
                                               int n, const cuda_lora **out_sets, int32_t *out_n, hearth_error *err) {
    if (n <= 0) return HEARTH_OK;
    const int threads = 32 * CUDA_LORA_MAX_SET; /* 32 rows a block */
    lora_gather_kernel<<<dim3((unsigned)((n + 31) / 32)), dim3(threads), 0, cuda_stream()>>>(sets, n_set, rows, n,
                                                                                             out_sets, out_n);
    return cuda_launched("lora gather", err);
}
