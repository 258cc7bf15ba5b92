/* cuda_attn_prefill.cu: tensor-core flash attention for prefill chunks of one sequence
 * (single_slot): causal, sliding window, grouped KV heads, head_dim 16..512. A first launch
 * copies the sequence's keys and values from the paged device pool (any pool format)
 * through the block table into a contiguous bf16 stage; the attention launch then streams
 * key tiles from it with cp.async, two tiles in flight. bf16 operands on mma.sync
 * m16n8k16 with f32 accumulation, online softmax in f32. Heads of 512 (the widest full-attention
 * layers) split their output dims over two blocks, each scoring the whole head (an
 * accumulator of 512 dims per row would not fit a thread's registers). Must not allocate or synchronize;
 * the f32 kernels in cuda_ops.cu stay the reference and the ragged path. */
#include "backend/cuda/cuda_kv_access.cuh"
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 4 consecutive head dims [d0, d0 + 4) of the key and the value at row `r` (position within
 * the block) of block `b`, KV head `h`, as packed bf16 pairs, read through
 * cuda_kv_access.cuh in the pool's format (float32, or int8 / fp8 dequantized with the
 * row's scale; the branch on kv.quant is uniform over the grid). */
static __device__ __forceinline__ void pf_load_kv4(const cuda_kv &kv, int layer, int b, int h, int r, int d0, uint2 *k4,
                                                   uint2 *v4) {
    size_t row = cuda_kv_row(kv, layer, b, h, r);
    int d = kv.head_dim;
    float4 k, v;
    if (kv.quant == HEARTH_KV_INT8)
        k = cuda_kv_k4<HEARTH_KV_INT8>(kv, row, d, d0), v = cuda_kv_v4<HEARTH_KV_INT8>(kv, row, d, d0);
    else if (kv.quant == HEARTH_KV_FP8)
        k = cuda_kv_k4<HEARTH_KV_FP8>(kv, row, d, d0), v = cuda_kv_v4<HEARTH_KV_FP8>(kv, row, d, d0);
    else if (kv.quant == HEARTH_KV_F16)
        k = cuda_kv_k4<HEARTH_KV_F16>(kv, row, d, d0), v = cuda_kv_v4<HEARTH_KV_F16>(kv, row, d, d0);
    else
        k = cuda_kv_k4<HEARTH_KV_FLOAT>(kv, row, d, d0), v = cuda_kv_v4<HEARTH_KV_FLOAT>(kv, row, d, d0);
    __nv_bfloat162 k01 = __floats2bfloat162_rn(k.x, k.y), k23 = __floats2bfloat162_rn(k.z, k.w);
    __nv_bfloat162 v01 = __floats2bfloat162_rn(v.x, v.y), v23 = __floats2bfloat162_rn(v.z, v.w);
    *k4 = make_uint2(*(uint32_t *)&k01, *(uint32_t *)&k23);
    *v4 = make_uint2(*(uint32_t *)&v01, *(uint32_t *)&v23);
}

static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two 16x8 B fragments (keys k0..k0+15 by dims n0..n0+15) of row-major V in shared memory. */
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared without registers (cached in L2 only: each stage row is read by
 * the few blocks of its KV head). */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
/* Waits until at most one committed group is still in flight. */
static __device__ __forceinline__ void cp_async_wait1(void) { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

#define FA_PAD 8 /* bf16 per shared row beyond D: rows land 16 bytes apart in the banks */
#define FA_STAGE_TILE 64 /* stage rows per staging block; every key tile (BN 32 or 64) divides it */

/* The stage (cuda_attention_stage_bytes): bf16 K [n_kv_heads][rows][D], then V alike, then
 * one flag byte per row (1: the position is mapped to a pool block and not past the chunk). */
struct fa_stage {
    __nv_bfloat16 *k, *v;
    uint8_t *ok;
    int rows;
};
static inline fa_stage stage_of(const cuda_attention_args *a) {
    fa_stage st;
    st.rows = (int)cuda_attention_stage_rows(a->kv->max_blocks_per_slot);
    size_t plane = (size_t)a->kv->n_kv_heads * st.rows * a->head_dim;
    st.k = (__nv_bfloat16 *)a->stage;
    st.v = st.k + plane;
    st.ok = (uint8_t *)(st.v + plane);
    return st;
}

/* The chunk's position range over all its tokens: hi the last position, lo the first any
 * token attends to (its window's start); block-wide, thread 0's view after the barrier. */
static __device__ __forceinline__ void chunk_range(const cuda_attention_args &a, int *lo, int *hi) {
    __shared__ int s_lo, s_hi;
    int l = INT_MAX, h = -1;
    for (int t = threadIdx.x; t < a.T; t += blockDim.x) {
        int p = a.pos[t];
        l = min(l, a.window > 0 ? max(0, p - a.window + 1) : 0);
        h = max(h, p);
    }
    if (threadIdx.x == 0) s_lo = INT_MAX, s_hi = -1;
    __syncthreads();
    atomicMin(&s_lo, l);
    atomicMax(&s_hi, h);
    __syncthreads();
    *lo = s_lo, *hi = s_hi;
}

/* Stage rows [64 blockIdx.x, +64) of KV head blockIdx.y: bf16 of the pool's values (the
 * rounding the attention kernel's operands always had), zeros and flag 0 where the row is
 * unmapped or past the chunk's last position. Tiles wholly outside [lo, hi] are skipped: the
 * attention kernel reads only rows from lo rounded down to its key tile up to hi's tile. */
__global__ void __launch_bounds__(256) attention_stage_kernel(cuda_attention_args a, cuda_kv kv, fa_stage st) {
    int lo, hi;
    chunk_range(a, &lo, &hi);
    const int D = a.head_dim, kvh = blockIdx.y, r0 = blockIdx.x * FA_STAGE_TILE;
    if (r0 > hi || r0 + FA_STAGE_TILE <= lo - lo % FA_STAGE_TILE) return;
    const int32_t *table = kv.tables + (size_t)a.slot[0] * kv.max_blocks_per_slot;
    for (int idx = threadIdx.x; idx < FA_STAGE_TILE * (D / 4); idx += blockDim.x) {
        int j = idx / (D / 4), d0 = (idx % (D / 4)) * 4, p = r0 + j;
        int b = p <= hi ? table[p / KV_BLOCK_SIZE] : -1;
        bool ok = b >= 0 && b < kv.n_blocks;
        uint2 k4 = make_uint2(0u, 0u), v4 = make_uint2(0u, 0u);
        if (ok) pf_load_kv4(kv, a.layer, b, kvh, p % KV_BLOCK_SIZE, d0, &k4, &v4);
        size_t at = ((size_t)kvh * st.rows + p) * D + d0;
        *(uint2 *)(st.k + at) = k4;
        *(uint2 *)(st.v + at) = v4;
        if (kvh == 0 && d0 == 0) st.ok[p] = ok;
    }
}

/* DV: the output dims one block computes (D, or half of it: blockIdx.z picks the half). */
template <int D, int DV, int WARPS, int BN> struct fa_cfg {
    static constexpr int BM = 16 * WARPS, LD = D + FA_PAD, LDV = DV + FA_PAD;
    static constexpr int STAGE = BN * (LD + LDV); /* bf16 per stage: a K tile, then its V tile's DV dims */
    /* Q tile, then two stages of (K tile, V tile), then two stages of row flags */
    static constexpr size_t smem = ((size_t)BM * LD + 2 * (size_t)STAGE) * 2 + 2 * BN;
};

/* One block per (KV head, tile of `tpt` consecutive tokens): tile row r is token
 * t0 + r / G with query head kvh * G + r % G, so the G heads of a group share each K/V
 * tile. Warp w owns rows 16w..16w+15; a lane holds rows g and g + 8 of them (g = lane / 4)
 * as the mma fragments lay them out. The block walks key tiles of BN positions over the
 * union of its rows' ranges [max(0, pos - window + 1), pos], loading tile i + 1 from the
 * stage while it computes tile i; masked or unmapped keys score -inf. */
template <int D, int DV, int WARPS, int BN>
__global__ void __launch_bounds__(WARPS * 32, 2)
    attention_prefill_tc_kernel(cuda_attention_args a, fa_stage st, int tpt) {
    typedef fa_cfg<D, DV, WARPS, BN> C;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)fa_smem, *sK0 = sQ + C::BM * C::LD;
    uint8_t *sOk0 = (uint8_t *)(sK0 + 2 * C::STAGE);
    const int dv0 = (int)blockIdx.z * DV; /* this block's output dims [dv0, dv0 + DV) */
    const int G = a.n_heads / a.n_kv_heads, kvh = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, tq = lane % 4;
    const int tile = gridDim.y - 1 - blockIdx.y; /* the longest (last) tiles start first */
    const int t0 = tile * tpt, ntok = min(tpt, a.T - t0), rows = ntok * G;

    /* the block's range: every row's range lies inside it */
    int lo = INT_MAX, hi = -1;
    for (int u = 0; u < ntok; u++) {
        int p = a.pos[t0 + u];
        lo = min(lo, a.window > 0 ? max(0, p - a.window + 1) : 0);
        hi = max(hi, p);
    }
    lo -= lo % BN;
    /* key tile i (positions lo + BN i ..) into stage i % 2: K and V rows, 16 bytes a copy */
    auto load_tile = [&](int i) { /* addresses from the parameters: no registers held across tiles */
        int c0 = lo + i * BN, sb = i & 1;
        __nv_bfloat16 *sK = sK0 + sb * C::STAGE, *sV = sK + BN * C::LD;
        size_t row0 = (size_t)blockIdx.x * st.rows + c0;
        for (int idx = threadIdx.x; idx < BN * (D / 8); idx += blockDim.x) {
            int j = idx / (D / 8), c = (idx % (D / 8)) * 8;
            cp_async16(sK + j * C::LD + c, st.k + (row0 + j) * D + c);
        }
        for (int idx = threadIdx.x; idx < BN * (DV / 8); idx += blockDim.x) {
            int j = idx / (DV / 8), c = (idx % (DV / 8)) * 8;
            cp_async16(sV + j * C::LDV + c, st.v + (row0 + j) * D + dv0 + c);
        }
        if (threadIdx.x < BN / 16) cp_async16(sOk0 + sb * BN + 16 * threadIdx.x, st.ok + c0 + 16 * threadIdx.x);
    };
    const int ntiles = hi >= lo ? (hi - lo) / BN + 1 : 0;
    if (ntiles > 0) load_tile(0);
    cp_async_commit();

    /* Q tile into shared memory as bf16 (zero rows past the tile), while tile 0 streams in */
    for (int idx = threadIdx.x; idx < C::BM * (D / 4); idx += blockDim.x) {
        int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows) x = *(const float4 *)(a.q + ((size_t)(t0 + r / G) * a.n_heads + kvh * G + r % G) * D + c);
        *(uint2 *)(sQ + r * C::LD + c) = make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
    }
    /* this lane's two rows: their key ranges (empty for padding rows) */
    int pe[2], ps[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = warp * 16 + g + 8 * i;
        pe[i] = r < rows ? a.pos[t0 + r / G] : -1;
        ps[i] = a.window > 0 ? max(0, pe[i] - a.window + 1) : 0;
        if (r >= rows) ps[i] = INT_MAX;
    }
    int wlo = min(ps[0], ps[1]), whi = max(pe[0], pe[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }

    float o_acc[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DV / 8; n++) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units: exp2 below */

    for (int it = 0; it < ntiles; it++) {
        const int c0 = lo + it * BN, sb = it & 1;
        if (it + 1 < ntiles) load_tile(it + 1); /* into the other stage, freed at the end of it - 1 */
        cp_async_commit();
        cp_async_wait1(); /* tile it has landed (this thread's copies) */
        __syncthreads();  /* ... and every thread's; sQ is written (the first time) */
        const __nv_bfloat16 *sK = sK0 + sb * C::STAGE, *sV = sK + BN * C::LD;
        const uint8_t *sOk = sOk0 + sb * BN;
        if (!(c0 > whi || c0 + BN - 1 < wlo)) { /* else nothing of this warp's rows here */
            /* S = Q K^T for the warp's 16 rows by BN keys (K fragments by 32-bit shared loads:
             * ldmatrix.x4 measured no faster: bench/results/kernel_choices.md) */
            float s[BN / 8][4];
#pragma unroll
            for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const __nv_bfloat16 *q0 = sQ + (warp * 16 + g) * C::LD + 2 * tq, *q1 = q0 + 8 * C::LD;
#pragma unroll
            for (int kk = 0; kk < D; kk += 16) {
                uint32_t af[4] = {*(const uint32_t *)(q0 + kk), *(const uint32_t *)(q1 + kk),
                                  *(const uint32_t *)(q0 + kk + 8), *(const uint32_t *)(q1 + kk + 8)};
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    const __nv_bfloat16 *kr = sK + (n * 8 + g) * C::LD + kk + 2 * tq;
                    mma_bf16(s[n], af, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                }
            }
            /* mask, scale, online softmax (each row's values live in the 4 lanes of a quad) */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = e / 2, j = n * 8 + 2 * tq + (e & 1), p = c0 + j;
                    bool ok = p >= ps[i] && p <= pe[i] && sOk[j];
                    s[n][e] = ok ? s[n][e] * sl2 : -INFINITY;
                    mx[i] = fmaxf(mx[i], s[n][e]);
                }
            float corr[2], base[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                float mn = fmaxf(m[i], mx[i]);
                base[i] = mn == -INFINITY ? 0.0f : mn; /* a row with nothing valid yet stays at 0 */
                corr[i] = fast_exp2(m[i] - base[i]);
                m[i] = mn;
                l[i] *= corr[i];
            }
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[n][e] = fast_exp2(s[n][e] - base[e / 2]);
                    l[e / 2] += s[n][e];
                }
#pragma unroll
            for (int n = 0; n < DV / 8; n++) {
                o_acc[n][0] *= corr[0];
                o_acc[n][1] *= corr[0];
                o_acc[n][2] *= corr[1];
                o_acc[n][3] *= corr[1];
            }
            /* O += P V: P's accumulator layout is the A fragment of the next mma */
#pragma unroll
            for (int kj = 0; kj < BN / 16; kj++) {
                uint32_t pf[4] = {pack_bf16(s[2 * kj][0], s[2 * kj][1]), pack_bf16(s[2 * kj][2], s[2 * kj][3]),
                                  pack_bf16(s[2 * kj + 1][0], s[2 * kj + 1][1]),
                                  pack_bf16(s[2 * kj + 1][2], s[2 * kj + 1][3])};
                const __nv_bfloat16 *vrow =
                    sV + (kj * 16 + (lane % 8) + ((lane / 8) & 1) * 8) * C::LDV + (lane / 16) * 8;
#pragma unroll
                for (int n0 = 0; n0 < DV; n0 += 16) {
                    uint32_t vb[4];
                    ldsm_x4_trans(vb, vrow + n0);
                    mma_bf16(o_acc[n0 / 8], pf, vb[0], vb[1]);
                    mma_bf16(o_acc[n0 / 8 + 1], pf, vb[2], vb[3]);
                }
            }
        }
        __syncthreads(); /* stage sb is read by all warps before tile it + 2 is loaded into it */
    }
    /* the row sums are split over the quad's lanes until here */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = warp * 16 + g + 8 * i;
        if (r >= rows) continue;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float *out = a.out + ((size_t)(t0 + r / G) * a.n_heads + kvh * G + r % G) * D + dv0 + 2 * tq;
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
            *(float2 *)(out + n * 8) = make_float2(o_acc[n][2 * i] * inv, o_acc[n][2 * i + 1] * inv);
    }
}

template <int D, int DV, int WARPS, int BN>
static hearth_status launch_tc(const cuda_attention_args *a, hearth_error *err) {
    typedef fa_cfg<D, DV, WARPS, BN> C;
    static int raised; /* > 48 KB of dynamic shared memory needs an opt-in, once per variant */
    if (!raised) {
        if (cuda_status(cudaFuncSetAttribute(attention_prefill_tc_kernel<D, DV, WARPS, BN>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem),
                        "cudaFuncSetAttribute(attention_prefill_tc)", err))
            return HEARTH_ERR_IO;
        raised = 1;
    }
    fa_stage st = stage_of(a);
    dim3 sgrid((unsigned)(st.rows / FA_STAGE_TILE), (unsigned)a->n_kv_heads);
    attention_stage_kernel<<<sgrid, 256, 0, cuda_stream()>>>(*a, *a->kv, st);
    if (cuda_launched("attention_stage", err)) return HEARTH_ERR_IO;
    int G = a->n_heads / a->n_kv_heads, tpt = C::BM / G;
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)((a->T + tpt - 1) / tpt), (unsigned)(D / DV));
    attention_prefill_tc_kernel<D, DV, WARPS, BN><<<grid, WARPS * 32, C::smem, cuda_stream()>>>(*a, st, tpt);
    return cuda_launched("attention_prefill_tc", err);
}

int cuda_attention_prefill_tc_fits(const cuda_attention_args *a) {
    int d = a->head_dim, G = a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 0;
    return !a->exact_f32 && a->single_slot && (d == 16 || d == 32 || d == 64 || d == 128 || d == 256 || d == 512) &&
           G >= 1 && G <= 64 && a->stage &&
           a->stage_bytes >= cuda_attention_stage_bytes(a->kv->max_blocks_per_slot, a->kv->n_kv_heads, d);
}

hearth_status cuda_attention_prefill_tc(const cuda_attention_args *a, hearth_error *err) {
    if (!a->stage ||
        a->stage_bytes < cuda_attention_stage_bytes(a->kv->max_blocks_per_slot, a->kv->n_kv_heads, a->head_dim))
        return err_set(err, HEARTH_ERR_INVALID, "cuda_attention_prefill_tc: no stage of %zu bytes for the keys and values",
                       cuda_attention_stage_bytes(a->kv->max_blocks_per_slot, a->kv->n_kv_heads, a->head_dim));
    switch (a->head_dim) {
    case 16: return launch_tc<16, 16, 8, 64>(a, err); /* the tiny test models */
    case 32: return launch_tc<32, 32, 8, 64>(a, err);
    case 64: return launch_tc<64, 64, 8, 64>(a, err);
    case 128: return launch_tc<128, 128, 8, 64>(a, err);
    case 256: return launch_tc<256, 256, 4, 32>(a, err);
    case 512: return launch_tc<512, 256, 4, 32>(a, err); /* 167 KB of shared memory: one block per SM */
    default:
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_attention_prefill_tc: head_dim %d (16, 32, 64, 128, 256 or 512)",
                       a->head_dim);
    }
}
