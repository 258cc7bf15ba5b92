/* cuda_mmq.cu: the batched int8 tensor-core matmul ("MMQ") for packed-scale Q4_K weights
 * and 5..64 rows of int8 activations (quantize_x_q8's layout; cuda_mmq_force for tests):
 * the weight is streamed once for all rows, where the GEMVs re-read it per
 * chunk of 8 (timed on the H200: see g_mmq_mode below). Not batch-invariant (a row's float sums do not depend on T, but the
 * callers never use it in deterministic mode anyway). Called only from cuda_gemv.cu; must
 * not allocate or synchronize (it runs inside decode graph captures).
 *
 * Design. y[t][r] = sum over sub-blocks j (32 weights) of
 *     d_r·sc_rj · dx_tj · C_rtj  -  dmin_r·m_rj · (dx_tj·Σq_x,tj)
 * with C_rtj = Σ_k q_rk·qx_tk (nibble 0..15 times int8) from one
 * mma.sync.m16n8k32.s8.s8.s32 per (16 weight rows, 8 tokens, sub-block): the weight
 * tile is A (16 rows x 32 k), the activations B (32 k x 8 tokens), the second term uses
 * the (d, d·Σq) pairs quantize_x_q8 already writes. A block of MMQ_WARPS warps owns
 * MMQ_ROWS weight rows (16 per warp) and all T tokens padded to NT·8 (pad tokens repeat
 * token T - 1 and are never stored); k is streamed one super-block (256) per pipeline
 * stage, copied into shared memory with 16-byte cp.async by the whole block (coalesced:
 * each row's 144 bytes are contiguous, so are each token's 256 activations) and consumed
 * STAGES - 1 super-blocks behind the copies, so that many weight bytes are in flight.
 * The order of k inside a sub-block is free as long as A and B agree: lane (g, q) of the
 * mma owns k slots 4q..4q+3 and 16+4q..16+4q+3 of both, and here those slots are the
 * physical weights 8q..8q+7, so a lane's A and B fragments are each one 8-byte shared
 * load (a GGUF chunk's 32 bytes hold sub-blocks 2c (low nibbles) and 2c + 1 (high)).
 * Shared strides are padded so those loads are conflict-free (see MMQ_*_STRIDE), and the
 * activation scale pairs are stored transposed ([sub-block][token]) so the two tokens of
 * a lane's accumulators are one 16-byte load. The float epilogue (per accumulator: int to
 * float, two FMAs) costs about as much issue as the tensor cores: at T = 64 it, not the
 * weight stream, is the expected bound (about 2x the streaming time on an H200, still
 * well under dequantize + cuBLAS). A weight with too few 64-row tiles to fill the GPU
 * splits k across blockIdx.y (mmq_splits): each split
 * writes partial sums to a scratch and the tile's last split to arrive adds them in split
 * order (fixed, so a launch gives the same bits every run). Not done (yet): Q8_0, Q6_K. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_plan.h"
}
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MMQ_WARPS 4
#define MMQ_ROWS (16 * MMQ_WARPS)
/* 2..64 tokens: NT = ceil(T / 8) mma n-tiles of 8 */
#define MMQ_MIN_T 2
#define MMQ_MAX_T 64
/* Shared row strides in bytes. Weights: 144-byte super-block + 16: rows 40 words apart, so
 * the 8-byte loads of 16 lanes (4 rows x 4 lanes, 2 words each) hit 32 distinct banks.
 * Activations: 256 + 32: 72 words apart (72 % 32 = 8), likewise for 4 tokens x 4 lanes.
 * Scale pairs: [8 sub-blocks][tokens] float2 + 16 bytes of pad per sub-block row. */
#define MMQ_W_STRIDE 160
#define MMQ_X_STRIDE 288
/* Shared memory per block the stage count aims at: two blocks per SM on sm_80 / sm_90
 * (164 / 228 KB per SM); sm_89 (99 KB per block) runs the shapes that fit and leaves the
 * rest to the GEMVs (cuda_mmq_launch returns 0). */
#define MMQ_SMEM_BUDGET (110 * 1024)

static __host__ __device__ constexpr int mmq_scale_stride(int NT) { return NT * 8 * 8 + 16; }
static __host__ __device__ constexpr int mmq_stage_bytes(int NT) {
    return MMQ_ROWS * MMQ_W_STRIDE + NT * 8 * MMQ_X_STRIDE + 8 * mmq_scale_stride(NT);
}
static __host__ __device__ constexpr int mmq_stages(int NT) {
    return MMQ_SMEM_BUDGET / mmq_stage_bytes(NT) > 8 ? 8 : MMQ_SMEM_BUDGET / mmq_stage_bytes(NT);
}

static __device__ __forceinline__ void mmq_cp16(void *dst, const void *src) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
static __device__ __forceinline__ void mmq_cp8(void *dst, const void *src) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(src) : "memory");
}
static __device__ __forceinline__ void mmq_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void mmq_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* c += A (16 x 32 int8, row) · B (32 x 8 int8, col), int32 accumulators (sm_80+). */
static __device__ __forceinline__ void mmq_mma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap(); /* the build targets sm_80 and newer only */
#endif
}

/* |v| < 2^22 to float in two full-rate integer / float adds (I2F is quarter rate): the
 * bits of 2^23 + 2^22 + v as a float are exactly that value. */
static __device__ __forceinline__ float mmq_i2f(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }

static __device__ __forceinline__ float mmq_f16(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* Copies super-block sb of the block's rows, its activations and their scale pairs into
 * one stage. Rows past n and tokens past T repeat the last one (valid memory; not stored). */
template <int NT>
static __device__ __forceinline__ void mmq_load_stage(uint8_t *st, const uint8_t *W, const int8_t *xq, const float2 *xs,
                                                      int row0, int n, int k, int T, int sb) {
    const int nsb = k / 256, nb = k / 32, tid = threadIdx.x;
    uint8_t *sw = st, *sx = st + MMQ_ROWS * MMQ_W_STRIDE, *ss = sx + NT * 8 * MMQ_X_STRIDE;
    for (int c = tid; c < MMQ_ROWS * 9; c += MMQ_WARPS * 32) {
        int r = c / 9, p = c % 9, row = min(row0 + r, n - 1);
        mmq_cp16(sw + r * MMQ_W_STRIDE + 16 * p, W + ((size_t)row * nsb + sb) * 144 + 16 * p);
    }
    for (int c = tid; c < NT * 8 * 16; c += MMQ_WARPS * 32) {
        int tk = c / 16, p = c % 16, tok = min(tk, T - 1);
        mmq_cp16(sx + tk * MMQ_X_STRIDE + 16 * p, xq + (size_t)tok * k + (size_t)sb * 256 + 16 * p);
    }
    for (int c = tid; c < NT * 8 * 8; c += MMQ_WARPS * 32) { /* transposed: [j][token] */
        int tk = c / 8, j = c % 8, tok = min(tk, T - 1);
        mmq_cp8(ss + j * mmq_scale_stride(NT) + tk * 8, xs + (size_t)tok * nb + (size_t)sb * 8 + j);
    }
}

/* Sub-block j's 6-bit scale and min from a packed-order header (cuda_q4k_scale_min, packed). */
static __device__ __forceinline__ void mmq_q4k_sm(uint4 h, int j, float *s, float *m) {
    uint32_t g = cuda_q4k_group_dev(h, j / 2);
    *s = (float)((g >> (6 * (j % 2))) & 63);
    *m = (float)((g >> (12 + 6 * (j % 2))) & 63);
}

template <int NT>
__global__ void __launch_bounds__(MMQ_WARPS * 32, 2)
    mmq_q4_k(const uint8_t *W, const int8_t *xq, const float2 *xs, float *y, int n, int k, int T, float *part,
             unsigned *count) {
    constexpr int STAGES = mmq_stages(NT), SBYTES = mmq_stage_bytes(NT);
    static_assert(STAGES >= 2, "one stage does not pipeline");
    extern __shared__ __align__(16) uint8_t mmq_smem[];
    /* split-k: blockIdx.y takes super-blocks [sb0, sb0 + nsb) of the row tile's k */
    const int KS = gridDim.y, per = (k / 256 + KS - 1) / KS, sb0 = blockIdx.y * per;
    const int nsb = max(0, min(k / 256, sb0 + per) - sb0), row0 = blockIdx.x * MMQ_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nsb) mmq_load_stage<NT>(mmq_smem + s * SBYTES, W, xq, xs, row0, n, k, T, sb0 + s);
        mmq_commit(); /* empty groups keep the wait count uniform */
    }
    for (int sb = 0; sb < nsb; sb++) {
        mmq_wait<STAGES - 2>(); /* this thread's copies of super-block sb have landed */
        __syncthreads();        /* everyone's have; and everyone is done with sb - 1's stage */
        int next = sb + STAGES - 1;
        if (next < nsb) mmq_load_stage<NT>(mmq_smem + (next % STAGES) * SBYTES, W, xq, xs, row0, n, k, T, sb0 + next);
        mmq_commit();

        const uint8_t *st = mmq_smem + (sb % STAGES) * SBYTES;
        const uint8_t *w0 = st + (warp * 16 + g) * MMQ_W_STRIDE, *w1 = w0 + 8 * MMQ_W_STRIDE;
        const uint8_t *sx = st + MMQ_ROWS * MMQ_W_STRIDE + g * MMQ_X_STRIDE + 8 * q;
        const uint8_t *ss = st + MMQ_ROWS * MMQ_W_STRIDE + NT * 8 * MMQ_X_STRIDE + 2 * q * 8;
        uint4 h0 = *(const uint4 *)w0, h1 = *(const uint4 *)w1;
        float d0 = mmq_f16(h0.x & 0xffff), dm0 = mmq_f16(h0.x >> 16);
        float d1 = mmq_f16(h1.x & 0xffff), dm1 = mmq_f16(h1.x >> 16);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            /* rows g and g + 8: weights 64c + 8q .. +7 (low nibbles) and 64c + 32 + 8q .. (high) */
            uint2 q0 = *(const uint2 *)(w0 + 16 + 32 * c + 8 * q), q1 = *(const uint2 *)(w1 + 16 + 32 * c + 8 * q);
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int j = 2 * c + hi;
                uint32_t a0 = (q0.x >> (4 * hi)) & 0x0F0F0F0Fu, a2 = (q0.y >> (4 * hi)) & 0x0F0F0F0Fu;
                uint32_t a1 = (q1.x >> (4 * hi)) & 0x0F0F0F0Fu, a3 = (q1.y >> (4 * hi)) & 0x0F0F0F0Fu;
                float s0, m0, s1, m1;
                mmq_q4k_sm(h0, j, &s0, &m0);
                mmq_q4k_sm(h1, j, &s1, &m1);
                const float ds0 = d0 * s0, ds1 = d1 * s1, mm0 = dm0 * m0, mm1 = dm1 * m1;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint2 b = *(const uint2 *)(sx + nt * 8 * MMQ_X_STRIDE + 32 * j);
                    int cc[4] = {0, 0, 0, 0};
                    mmq_mma(cc, a0, a1, a2, a3, b.x, b.y);
                    /* (d, d·Σq) of tokens 8nt + 2q and 8nt + 2q + 1, sub-block j */
                    float4 x = *(const float4 *)(ss + j * mmq_scale_stride(NT) + nt * 64);
                    /* |C| <= 32·15·127 < 2^22: mmq_i2f is exact */
                    acc[nt][0] = fmaf(-mm0, x.y, fmaf(ds0 * x.x, mmq_i2f(cc[0]), acc[nt][0]));
                    acc[nt][1] = fmaf(-mm0, x.w, fmaf(ds0 * x.z, mmq_i2f(cc[1]), acc[nt][1]));
                    acc[nt][2] = fmaf(-mm1, x.y, fmaf(ds1 * x.x, mmq_i2f(cc[2]), acc[nt][2]));
                    acc[nt][3] = fmaf(-mm1, x.w, fmaf(ds1 * x.z, mmq_i2f(cc[3]), acc[nt][3]));
                }
            }
        }
    }
    mmq_wait<0>();
    /* accumulator i: row g (+ 8 for i >= 2), token 8nt + 2q + (i & 1); with splits, the
     * split's partial sums, and the tile's last split to finish adds them up in split order */
    float *dst = KS == 1 ? y : part + (size_t)blockIdx.y * T * n;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = row0 + warp * 16 + g + (i >= 2 ? 8 : 0), tok = nt * 8 + 2 * q + (i & 1);
            if (row < n && tok < T) dst[(size_t)tok * n + row] = acc[nt][i];
        }
    if (KS == 1) return;
    __shared__ unsigned s_last;
    __threadfence(); /* this block's partials are visible before its count */
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&count[blockIdx.x], 1u) == (unsigned)KS - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int e = threadIdx.x; e < MMQ_ROWS * T; e += blockDim.x) {
        int row = row0 + e % MMQ_ROWS, tok = e / MMQ_ROWS;
        if (row >= n) continue;
        float sum = 0.0f;
        for (int s = 0; s < KS; s++) sum += __ldcg(part + ((size_t)s * T + tok) * n + row);
        y[(size_t)tok * n + row] = sum;
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0; /* ready for the next launch (graph replays) */
}

/* ---------- host side ---------- */

/* 2, the default: 5..64 rows; 1 (cuda_mmq_force, tests): 2..64 rows; 0 (cuda_mmq_force,
 * tests and batch_bench): off. batch_bench on the H200 has MMQ even with the GEMVs at 4 rows
 * and ahead from 8 (it pads to 8 tokens, so 5..7 cost what 8 does while the GEMVs run 4 +
 * the rest; bench/results/kernel_choices.md, "CUDA MMQ"). */
#define MMQ_AUTO_MIN_T 5
static int g_mmq_mode = 2;
static unsigned long g_mmq_launches;

unsigned long cuda_mmq_launch_count(void) { return g_mmq_launches; }

void cuda_mmq_force(int mode) { g_mmq_mode = mode == 0 ? 0 : mode == 1 ? 1 : 2; }

static int mmq_fits(int T);

int cuda_mmq_takes(const cuda_weight *w, int T) {
    return g_mmq_mode && w && w->dtype == DT_Q4_K && w->q4k_packed && w->k % 256 == 0 && w->n > 0 &&
           w->n <= INT32_MAX - MMQ_ROWS && w->k <= INT32_MAX / 64 && T >= (g_mmq_mode == 2 ? MMQ_AUTO_MIN_T : MMQ_MIN_T) && T <= MMQ_MAX_T &&
           mmq_fits(T);
}

typedef void (*mmq_kernel)(const uint8_t *, const int8_t *, const float2 *, float *, int, int, int, float *,
                           unsigned *);
static const mmq_kernel mmq_kernels[8] = {mmq_q4_k<1>, mmq_q4_k<2>, mmq_q4_k<3>, mmq_q4_k<4>,
                                          mmq_q4_k<5>, mmq_q4_k<6>, mmq_q4_k<7>, mmq_q4_k<8>};
static const int mmq_smem_bytes[8] = {mmq_stages(1) * mmq_stage_bytes(1), mmq_stages(2) * mmq_stage_bytes(2),
                                      mmq_stages(3) * mmq_stage_bytes(3), mmq_stages(4) * mmq_stage_bytes(4),
                                      mmq_stages(5) * mmq_stage_bytes(5), mmq_stages(6) * mmq_stage_bytes(6),
                                      mmq_stages(7) * mmq_stage_bytes(7), mmq_stages(8) * mmq_stage_bytes(8)};
/* per NT: -1 not prepared; 0 does not fit this device; 1 ready */
static int mmq_ready[8] = {-1, -1, -1, -1, -1, -1, -1, -1};

/* Split-k scratch (cuda_plan.h: CUDA_MMQ_PART_FLOATS partial sums, CUDA_MMQ_TILES_MAX
 * counters, counted by hearth fit), allocated once with the first prepare, outside any
 * capture; without it (allocation failed) no launch splits. */
static float *g_part;
static unsigned *g_count;
static int g_sms;

static void mmq_scratch(void) {
    if (g_part) return;
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) g_sms = 0;
    if (cuda_alloc((void **)&g_part, CUDA_MMQ_PART_FLOATS * sizeof(float), "mmq split-k partials", NULL) ||
        cuda_alloc((void **)&g_count, CUDA_MMQ_TILES_MAX * sizeof(unsigned), "mmq split-k counts", NULL) ||
        cudaMemset(g_count, 0, CUDA_MMQ_TILES_MAX * sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        cuda_free(g_part);
        cuda_free(g_count);
        g_part = NULL, g_count = NULL;
    }
}

/* Splits of k for a launch with fewer row tiles than SMs: enough that the grid fills every
 * SM twice, at most one per super-block and what the scratch holds. H200, 8 rows, under
 * ncu: 1024 x 4096 Q4_K 15.5 us in 16 blocks, 7.6 us in 16 x 16 splits; 4096 x 4096 19.0
 * us, 15.8 in 64 x 5; but 14336 x 4096 (224 tiles) 25 us unsplit, 32 in 224 x 2. */
static int mmq_splits(int n, int k, int T) {
    int tiles = (n + MMQ_ROWS - 1) / MMQ_ROWS, nsb = k / 256;
    if (!g_part || g_sms <= 0 || tiles > CUDA_MMQ_TILES_MAX || tiles >= g_sms) return 1;
    int ks = (2 * g_sms + tiles - 1) / tiles;
    if (ks > 16) ks = 16;
    if (ks > nsb) ks = nsb;
    while (ks > 1 && (size_t)ks * T * n > CUDA_MMQ_PART_FLOATS) ks--;
    return ks < 1 ? 1 : ks;
}

/* The kernels need more than the 48 KB of shared memory a launch gets by default; the
 * opt-in is a function attribute, set here outside any capture (cuda_gemv_reserve calls
 * this at model creation; the first launch otherwise). */
void cuda_mmq_prepare(void) {
    mmq_scratch();
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    for (int i = 0; i < 8; i++) {
        if (mmq_ready[i] >= 0) continue;
        if (mmq_smem_bytes[i] > optin) {
            mmq_ready[i] = 0;
            continue;
        }
        cudaError_t e =
            cudaFuncSetAttribute(mmq_kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, mmq_smem_bytes[i]);
        if (e != cudaSuccess) cudaGetLastError();
        mmq_ready[i] = e == cudaSuccess;
    }
}

/* Whether the kernel for T rows can launch on this device, preparing it first when no
 * capture is running; while one is (and it was never prepared, which cuda_gemv_reserve
 * avoids) 0: no attribute calls inside a capture, the GEMVs take the call. */
static int mmq_fits(int T) {
    int i = (T + 7) / 8 - 1;
    if (mmq_ready[i] < 0) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cuda_stream(), &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            cudaGetLastError();
            return 0;
        }
        cuda_mmq_prepare();
    }
    return mmq_ready[i] == 1;
}

int cuda_mmq_launch(const cuda_weight *w, const int8_t *xq, const float2 *xs, float *y, int T) {
    if (!cuda_mmq_takes(w, T) || ((uintptr_t)xq % 16) != 0 || ((uintptr_t)xs % 16) != 0) return 0;
    int i = (T + 7) / 8 - 1, n = (int)w->n, k = (int)w->k;
    dim3 grid((unsigned)((n + MMQ_ROWS - 1) / MMQ_ROWS), (unsigned)mmq_splits(n, k, T)), block(MMQ_WARPS * 32);
    g_mmq_launches++;
    mmq_kernels[i]<<<grid, block, (size_t)mmq_smem_bytes[i], cuda_stream()>>>((const uint8_t *)w->data, xq, xs, y, n, k,
                                                                              T, g_part, g_count);
    return 1;
}
