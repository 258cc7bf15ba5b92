/* cuda_moe_gemm.cu: the grouped expert GEMM of a prefill step (cuda_moe_gemm in
 * cuda_backend.h): every active expert's rows in one launch per weight, where the
 * per-expert form ran a gather, three matmuls, a product and a scatter per expert (about
 * 1,500 launches per layer of a 256-expert model at 4,096 tokens).
 *
 * Design. A block owns MG_ROWS (64) output features of one segment: up to MG_TOK (128)
 * (token, expert) pairs that chose the same expert (the caller orders pairs by expert and
 * cuts each expert's run into segments). k is walked in steps of 64 over two sets of shared
 * tiles (dynamic shared memory, 55,296 bytes a block, opted in at a format's first launch).
 * While the 4 warps run mma.m16n8k16.bf16 on one set (2 x 2 warps of 32 feature rows x 64
 * tokens, fragments by ldmatrix.x4, f32 accumulation), the segment's next 64-wide bf16 input
 * slices land in the other by 16-byte cp.async (gathered through xrow; the caller converts
 * each input once, cuda_to_bf16 / cuda_gated_bf16, not once per block) and the raw bytes of
 * the next 64 x 64 weight tile are loaded into registers (mg_fetch: Q8_0, packed Q4_K, Q6_K,
 * the generic affine layout); after the mma they are dequantized there as bf16 (mg_decode:
 * cuda_dequant.cuh's arithmetic, so a weight rounds as on the dequantize + cuBLAS prefill
 * path); one barrier a step. Shared rows are 72 bf16 apart (144 bytes), so the 8 rows of
 * each ldmatrix matrix hit distinct banks. __launch_bounds__(128, 4): 128 registers, four
 * blocks an SM (bench/results/cuda_newfam.md has the earlier forms' numbers). Precision: the
 * prefill path's (bf16 operands, f32 sums); not batch-invariant (the caller keeps
 * deterministic and exact steps on the per-expert form). Never allocates or synchronizes. */
#include "backend/cuda/cuda_backend.h"
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
#define DQ_MLX4_PLAIN (-2)   /* MLX 4-bit (DT_U32), plain layout (mlx_tiled 0) */
#define DQ_MLX4_CHUNKED (-3) /* MLX 4-bit, chunked layout (mlx_tiled 2); the tiled layout (1) takes DQ_ANY */

static_assert(MG_TOK % 32 == 0 && MG_ROWS == 64 && MG_THREADS == 128, "tile shape: 2 x 2 warps of 32 x MG_TOK / 2");

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

/* The raw bytes of eight weights, loaded a k step ahead (mg_fetch) so that their latency
 * runs under the step's mma, decoded after it (mg_decode). What each field holds:
 *   Q8_0:   q = the eight int8 codes, a.x = the block's f16 scale;
 *   Q4_K:   q = the eight nibble bytes, a = the block's 16-byte header (d, dmin, the
 *           packed scale / min bytes: q4k_packed only);
 *   Q6_K:   q = the low-bit bytes, a.x / a.y = the high-bit bytes, a.z = d, a.w = the
 *           sub-block's int8 scale;
 *   affine: a.x / a.y = the low plane's two words, a.z / a.w = the high plane's, q = the
 *           group's (scale, bias);
 *   MLX 4-bit (DT_U32, plain or chunked layout, cuda_mlx4_nibble): q = the 8 bytes (chunked)
 *           or the word (plain, q.x) holding the eight nibbles, a.x = the group's
 *           (scale, bias) word.
 * Other formats (unpacked Q4_K, MLX 4-bit in the tiled layout, floats) load and decode in
 * mg_decode, element by element where they have no 8-wide form. */
typedef struct mg_raw {
    uint4 a;
    uint2 q;
} mg_raw;

static __device__ __forceinline__ bool mg_prefetched(int DQ, const cuda_weight &w) {
    return DQ == DT_Q8_0 || DQ == DT_Q6_K || DQ == DT_AFFINE || (DQ == DT_Q4_K && w.q4k_packed) ||
           DQ == DQ_MLX4_PLAIN || DQ == DQ_MLX4_CHUNKED;
}

template <int DQ> static __device__ __forceinline__ void mg_fetch(const cuda_weight &w, int r, int c, mg_raw &raw) {
    const size_t e = (size_t)r * (size_t)w.k + (size_t)c;
    if (DQ == DT_Q8_0) {
        raw.q = *(const uint2 *)((const int8_t *)w.data + e);
        raw.a.x = ((const uint16_t *)w.scales)[e / 32];
    } else if (DQ == DT_Q4_K) {
        if (!w.q4k_packed) return;
        const uint8_t *blk = (const uint8_t *)w.data + (e / 256) * 144;
        int j = (int)(e % 256), chunk = j / 64, l = j % 64;
        raw.a = *(const uint4 *)blk;
        raw.q = *(const uint2 *)(blk + 16 + 32 * chunk + (l % 32));
    } else if (DQ == DT_Q6_K) {
        size_t nk = (size_t)w.n * (size_t)w.k, bi = e / 256;
        const uint8_t *ql = (const uint8_t *)w.data, *qh = ql + nk / 2;
        const int8_t *scp = (const int8_t *)w.scales;
        int i = (int)(e % 256), h = i / 128, rr = i % 128;
        raw.q = *(const uint2 *)(ql + bi * 128 + 64 * h + rr % 64);
        uint2 hi8 = *(const uint2 *)(qh + bi * 64 + 32 * h + rr % 32);
        raw.a.x = hi8.x, raw.a.y = hi8.y;
        raw.a.z = ((const uint16_t *)(scp + nk / 16))[bi];
        raw.a.w = (uint32_t)(int32_t)scp[e / 16];
    } else if (DQ == DT_AFFINE) {
        const int bits = w.aff_bits, LO = bits == 8 ? 8 : bits >= 4 ? 4 : 2, HI = bits - LO, HN = HI > 0 ? HI : 1;
        const uint32_t *pl = (const uint32_t *)w.data;
        size_t chunks = (size_t)(w.k / 32), chunk = (size_t)r * chunks + (size_t)(c / 32);
        const uint32_t *hp = pl + (size_t)w.n * chunks * (size_t)LO;
        int m0 = (c % 32) / 4;
        raw.a.x = pl[chunk * LO + m0 % LO];
        raw.a.y = pl[chunk * LO + (m0 + 1) % LO];
        if (HI > 0) {
            raw.a.z = hp[chunk * HN + m0 % HN];
            raw.a.w = hp[chunk * HN + (m0 + 1) % HN];
        }
        raw.q = ((const uint2 *)w.scales)[(size_t)r * (size_t)(w.k / w.group_size) + (size_t)(c / w.group_size)];
    } else if (DQ == DQ_MLX4_PLAIN || DQ == DQ_MLX4_CHUNKED) {
        const uint32_t *row = (const uint32_t *)w.data + (size_t)r * (size_t)(w.k / 8);
        if (DQ == DQ_MLX4_CHUNKED) /* bytes c / 64 * 32 + c % 32 .. + 7: two whole words */
            raw.q = *(const uint2 *)(row + (c / 64 * 32 + c % 32) / 4);
        else
            raw.q.x = row[c / 8];
        raw.a.x = ((const uint32_t *)w.scales)[(size_t)r * (size_t)(w.k / w.group_size) + (size_t)(c / w.group_size)];
    }
}

/* The eight weights of mg_fetch's bytes, with dq_flat8's / dq_affine8's arithmetic (the
 * same operations in the same order: the same floats). */
template <int DQ>
static __device__ __forceinline__ void mg_decode(const cuda_weight &w, int r, int c, const mg_raw &raw, float (&v)[8]) {
    if (!mg_prefetched(DQ, w)) {
        mg_weight8<DQ>(w, r, c, v);
    } else if (DQ == DT_Q8_0) {
        float d = h2f((uint16_t)raw.a.x);
        const int8_t *qb = (const int8_t *)&raw.q;
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = d * (float)qb[u];
    } else if (DQ == DT_Q4_K) {
        const size_t e = (size_t)r * (size_t)w.k + (size_t)c;
        int j = (int)(e % 256), chunk = j / 64, l = j % 64, sh = 6 * (l >= 32);
        uint32_t g = cuda_q4k_group_dev(raw.a, chunk); /* cuda_q4k_scale_min's packed bytes */
        int sc = (int)((g >> sh) & 63), m = (int)((g >> (12 + sh)) & 63);
        const uint8_t *qb = (const uint8_t *)&raw.q;
        float d = h2f((uint16_t)(raw.a.x & 0xffff)), dmin = h2f((uint16_t)(raw.a.x >> 16));
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int x = l < 32 ? (qb[u] & 0xF) : (qb[u] >> 4);
            v[u] = d * (float)sc * (float)x - dmin * (float)m;
        }
    } else if (DQ == DT_Q6_K) {
        const size_t e = (size_t)r * (size_t)w.k + (size_t)c;
        int rr = (int)(e % 256) % 128, ls = 4 * (rr / 64), hs = 2 * (rr / 32);
        uint2 hi8 = make_uint2(raw.a.x, raw.a.y);
        const uint8_t *lb = (const uint8_t *)&raw.q, *hb = (const uint8_t *)&hi8;
        float dl = h2f((uint16_t)raw.a.z) * (float)(int32_t)raw.a.w;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int lo = (lb[u] >> ls) & 0xF, hi = (hb[u] >> hs) & 3;
            v[u] = dl * (float)((lo | (hi << 4)) - 32);
        }
    } else if (DQ == DT_AFFINE) {
        const int bits = w.aff_bits, LO = bits == 8 ? 8 : bits >= 4 ? 4 : 2, HI = bits - LO, HN = HI > 0 ? HI : 1;
        const uint32_t lmask = (LO == 8 ? 0xffu : (1u << LO) - 1u) * 0x01010101u,
                       hmask = ((1u << HN) - 1u) * 0x01010101u;
        const float2 p = make_float2(__uint_as_float(raw.q.x), __uint_as_float(raw.q.y));
        int m0 = (c % 32) / 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int m = m0 + h;
            uint32_t code = ((h ? raw.a.y : raw.a.x) >> (LO * (m / LO))) & lmask;
            if (HI > 0) code |= (((h ? raw.a.w : raw.a.z) >> (HN * (m / HN))) & hmask) << LO;
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[4 * h + j] = __fadd_rn(__fmul_rn((float)((code >> (8 * j)) & 0xffu), p.x), p.y);
        }
    } else if (DQ == DQ_MLX4_PLAIN || DQ == DQ_MLX4_CHUNKED) { /* mlx4_elem's arithmetic */
        const uint32_t sb = raw.a.x;
        const float sc = w.sb_bf16 ? __uint_as_float(sb << 16) : h2f((uint16_t)(sb & 0xffff));
        const float bi = w.sb_bf16 ? __uint_as_float(sb & 0xffff0000u) : h2f((uint16_t)(sb >> 16));
        const int hs = DQ == DQ_MLX4_CHUNKED && c % 64 >= 32 ? 4 : 0;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            uint32_t nib = DQ == DQ_MLX4_CHUNKED ? ((u < 4 ? raw.q.x : raw.q.y) >> (8 * (u % 4) + hs)) & 0xF
                                                 : (raw.q.x >> (4 * u)) & 0xF;
            v[u] = __fadd_rn(__fmul_rn(sc, (float)nib), bi);
        }
    }
}

/* 16-byte copy global -> shared, zero-filled when !on. */
static __device__ __forceinline__ void mg_cp16(void *smem, const void *gmem, bool on) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(on ? 16 : 0));
}

/* A thread's share of the block's weight tile: MG_WH runs of 8 (row tid / 8 + 16 h, columns
 * 8 (tid % 8) ..), rows past n repeating the last (their outputs are not stored). */
#define MG_WH (MG_ROWS * (MG_K / 8) / MG_THREADS)

template <int DQ>
static __device__ __forceinline__ void mg_fetch_w(mg_raw (&raw)[MG_WH], const cuda_weight &w, int row0, int n, int k,
                                                  int k0, int tid) {
#pragma unroll
    for (int h = 0; h < MG_WH; h++) {
        int r = tid / 8 + 16 * h, c = (tid % 8) * 8;
        if (k0 + c < k) mg_fetch<DQ>(w, min(row0 + r, n - 1), k0 + c, raw[h]);
    }
}

/* The weight tile at k0 from the fetched bytes into sw as bf16 (zeros past k). */
template <int DQ>
static __device__ __forceinline__ void mg_store_w(__nv_bfloat16 *sw, const mg_raw (&raw)[MG_WH], const cuda_weight &w,
                                                  int row0, int n, int k, int k0, int tid) {
#pragma unroll
    for (int h = 0; h < MG_WH; h++) {
        int r = tid / 8 + 16 * h, c = (tid % 8) * 8;
        float v[8];
        if (k0 + c < k) {
            mg_decode<DQ>(w, min(row0 + r, n - 1), k0 + c, raw[h], v);
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

/* Four 8 x 8 bf16 matrices from shared memory (rows of 16 bytes, one address per lane). */
static __device__ __forceinline__ void mg_ldsm4(uint32_t (&r)[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}

/* Step kt's mma runs on set kt & 1 while the next step's input rows are copied (cp.async)
 * into the other set and the next weight tile's raw bytes are loaded into registers; after
 * the mma the warps decode those into the other set. The 4 warps split the 64 x MG_TOK
 * tile 2 x 2 (32 feature rows x MG_TOK / 2 tokens each), fragments by ldmatrix. */
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
    const int wm = warp / 2, wn = warp % 2, nk = (k + MG_K - 1) / MG_K;
    /* the warp's n-tiles holding tokens of the segment */
    const int ntw = min(MG_TOK / 16, max(0, ntiles - wn * (MG_TOK / 16)));
    float acc[2][MG_TOK / 16][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < MG_TOK / 16; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

    mg_raw raw[MG_WH];
    mg_load_x(SX(0), a, p0, cnt, ntiles, k, 0, tid);
    mg_fetch_w<DQ>(raw, w, row0, n, k, 0, tid);
    mg_store_w<DQ>(SW(0), raw, w, row0, n, k, 0, tid);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    /* ldmatrix lane addresses: A (rows l % 8 + 8 (l / 8 % 2), k 8 (l / 16)); B (tokens l % 8
     * + 8 (l / 16), k 8 (l / 8 % 2)) */
    const int a_off = (wm * 32 + lane % 8 + 8 * (lane / 8 % 2)) * MG_S + 8 * (lane / 16);
    const int b_off = (wn * (MG_TOK / 2) + lane % 8 + 8 * (lane / 16)) * MG_S + 8 * (lane / 8 % 2);
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt & 1, k0n = (kt + 1) * MG_K;
        if (kt + 1 < nk) {
            mg_load_x(SX(cur ^ 1), a, p0, cnt, ntiles, k, k0n, tid);
            mg_fetch_w<DQ>(raw, w, row0, n, k, k0n, tid);
        }
#pragma unroll
        for (int kk = 0; kk < MG_K; kk += 16) {
            uint32_t af[2][4];
            mg_ldsm4(af[0], SW(cur) + a_off + kk);
            mg_ldsm4(af[1], SW(cur) + a_off + 16 * MG_S + kk);
#pragma unroll
            for (int np = 0; np < MG_TOK / 32; np++)
                if (2 * np < ntw) {
                    uint32_t bf[4];
                    mg_ldsm4(bf, SX(cur) + b_off + 16 * np * MG_S + kk);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mg_mma(acc[mt][2 * np], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[0], bf[1]);
                        if (2 * np + 1 < ntw)
                            mg_mma(acc[mt][2 * np + 1], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[2], bf[3]);
                    }
                }
        }
        if (kt + 1 < nk) mg_store_w<DQ>(SW(cur ^ 1), raw, w, row0, n, k, k0n, tid);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
    }
    /* accumulator i of (mt, nt): feature row 16 mt + g (+ 8 for i >= 2), token 8 nt + 2 q + (i & 1) */
    float *y = a.y[z];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < MG_TOK / 16; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = row0 + wm * 32 + mt * 16 + g + (i >= 2 ? 8 : 0),
                    t = wn * (MG_TOK / 2) + nt * 8 + 2 * q + (i & 1);
                if (nt < ntw && row < n && t < cnt) {
                    size_t p = (size_t)p0 + (size_t)t;
                    size_t yr = a.yrow ? (size_t)a.yrow[p] : p;
                    y[yr * (size_t)n + (size_t)row] = acc[mt][nt][i];
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
    const cuda_weight *w0 = tabs[0].proto;
    if (nw == 2 && tabs[1].proto && tabs[1].proto->mlx_tiled != w0->mlx_tiled) { /* two layouts: a launch each */
        hearth_status st = cuda_moe_gemm(tabs, 1, ys, yrow, segs, nseg, nseg_dev, x, xrow, err);
        return st ? st : cuda_moe_gemm(tabs + 1, 1, ys + 1, yrow, segs, nseg, nseg_dev, x, xrow, err);
    }
    mg_args a = {};
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
    case DT_U32:
        if (w0->mlx_tiled == 1)
            mg_launch<DQ_ANY>(grid, a);
        else if (w0->mlx_tiled == 2)
            mg_launch<DQ_MLX4_CHUNKED>(grid, a);
        else
            mg_launch<DQ_MLX4_PLAIN>(grid, a);
        break;
    default: mg_launch<DQ_ANY>(grid, a); break;
    }
    return cuda_launched("moe_gemm", err);
}
