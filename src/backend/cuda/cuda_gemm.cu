/* cuda_gemm.cu: the prefill matmul y[T, n] = x[T, k] · W^T through cuBLAS (cublasGemmEx):
 * BF16 / F16 weights are read as stored (activations converted to their type); other
 * formats are dequantized into one bf16 scratch sized at start for the largest weight,
 * or (quantized, moderate T) sent to the chunked GEMV by a byte model; f32 accumulation,
 * or f32 operands in exact mode. Small T goes to the GEMV kernels. Allocates only in
 * cuda_gemm_create; never synchronizes. */
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_plan.h"
#include "backend/cuda/cuda_affine.h"
}
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Up to 8 rows the GEMV reads the weight once (cuda_gemv chunks by 8); beyond that see
 * use_gemv's byte model. */
#define GEMM_MIN_T 9

#define GEMM_WORKSPACE_BYTES CUDA_GEMM_WORKSPACE_BYTES /* cuda_plan.h: counted by hearth fit */

/* cuBLAS is opened here, when the first GEMM state is made, not linked into the binary:
 * loading libcublas (and libcublasLt) runs their static constructors, ~90 ms of CPU in every
 * process, which every CLI command (info, tokenize, template...) paid though only a CUDA
 * engine uses cuBLAS. The soname is the major version of the toolkit that built hearth; the
 * binary's run path (-rpath $(CUDA_HOME)/lib64) finds it as the link did. */
#define CUBLAS_STR_(x) #x
#define CUBLAS_STR(x) CUBLAS_STR_(x)
#define CUBLAS_SONAME "libcublas.so." CUBLAS_STR(CUBLAS_VER_MAJOR)
/* cublasGemmEx's C entry point (C++ also sees an inline overload taking a cudaDataType) */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                                     const void *, cudaDataType, int, const void *, cudaDataType, int, const void *,
                                     void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetWorkspace_v2) set_workspace;
    gemm_ex_fn gemm_ex;
    char error[256];
} cublas_lib;
static pthread_once_t cublas_once = PTHREAD_ONCE_INIT;

static void cublas_open(void) {
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cublas_lib.error, sizeof cublas_lib.error, "%s", dlerror());
        return;
    }
    *(void **)&cublas_lib.destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&cublas_lib.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&cublas_lib.set_workspace = dlsym(h, "cublasSetWorkspace_v2");
    *(void **)&cublas_lib.gemm_ex = dlsym(h, "cublasGemmEx");
    void *create = dlsym(h, "cublasCreate_v2");
    if (!create || !cublas_lib.destroy || !cublas_lib.set_stream || !cublas_lib.set_workspace || !cublas_lib.gemm_ex)
        snprintf(cublas_lib.error, sizeof cublas_lib.error, "%s lacks a cuBLAS function hearth calls", CUBLAS_SONAME);
    else
        *(void **)&cublas_lib.create = create; /* set last: non-NULL means every entry is there */
}

struct cuda_gemm {
    cublasHandle_t handle;
    int exact_f32;
    void *w_scratch, *x_scratch; /* dequantized weight / converted activations */
    void *workspace;
    size_t max_w, max_x;
};

hearth_status cuda_gemm_create(cuda_gemm **out, size_t max_weight_elems, size_t max_act_elems, int exact_f32,
                               hearth_error *err) {
    *out = NULL;
    cuda_gemm *g = (cuda_gemm *)calloc(1, sizeof *g);
    if (!g) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory for the GEMM state");
    g->exact_f32 = exact_f32;
    g->max_w = max_weight_elems;
    g->max_x = max_act_elems;
    size_t e = exact_f32 ? 4 : 2;
    pthread_once(&cublas_once, cublas_open);
    if (!cublas_lib.create) {
        free(g);
        return err_set(err, HEARTH_ERR_IO, "cuda: cannot load cuBLAS (%s): %s", CUBLAS_SONAME, cublas_lib.error);
    }
    cublasStatus_t cs = cublas_lib.create(&g->handle);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return err_set(err, HEARTH_ERR_IO, "cuda: cublasCreate failed (status %d)", (int)cs);
    }
    cublas_lib.set_stream(g->handle, cuda_stream()); /* ordered with the backend's kernels */
    hearth_status s = cuda_alloc(&g->w_scratch, max_weight_elems * e, "GEMM weight scratch", err);
    if (!s) s = cuda_alloc(&g->x_scratch, max_act_elems * e, "GEMM activation scratch", err);
    if (!s) s = cuda_alloc(&g->workspace, GEMM_WORKSPACE_BYTES, "cuBLAS workspace", err);
    if (!s && cublas_lib.set_workspace(g->handle, g->workspace, GEMM_WORKSPACE_BYTES) != CUBLAS_STATUS_SUCCESS)
        s = err_set(err, HEARTH_ERR_IO, "cuda: cublasSetWorkspace(%zu bytes) failed", GEMM_WORKSPACE_BYTES);
    if (s) {
        cuda_gemm_free(g);
        return s;
    }
    *out = g;
    return HEARTH_OK;
}

void cuda_gemm_free(cuda_gemm *g) {
    if (!g) return;
    if (g->handle) cublas_lib.destroy(g->handle);
    cuda_free(g->w_scratch);
    cuda_free(g->x_scratch);
    cuda_free(g->workspace);
    free(g);
}

template <bool F32>
__global__ void dequant_kernel(cuda_weight w, void *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)w.n * (size_t)w.k;
    if (i >= total) return;
    int64_t r = (int64_t)(i / w.k), c = (int64_t)(i % w.k);
    float v = dq_elem(w, r, c);
    if (F32) ((float *)out)[i] = v;
    else ((__nv_bfloat16 *)out)[i] = __float2bfloat16(v);
}

/* Eight consecutive elements of one row per thread (k % 8 == 0): one 64-bit division per
 * eight elements instead of one each, and one 16-byte store; same per-element arithmetic. */
__global__ void dequant8_bf16_kernel(cuda_weight w, uint4 *out) {
    size_t i8 = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total8 = (size_t)w.n * (size_t)w.k / 8;
    if (i8 >= total8) return;
    int64_t r = (int64_t)(i8 * 8 / w.k), c0 = (int64_t)(i8 * 8 % w.k);
    uint32_t pk[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        float v[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t c = c0 + j + u;
            v[u] = dq_elem(w, r, c);
        }
        __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);
        pk[j / 2] = *(uint32_t *)&b;
    }
    out[i8] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

/* Q8_0 / Q4_K / Q6_K to bf16, eight consecutive elements per thread (cuda_dequant.cuh
 * dq_flat8: no division by k, one or two 8-byte loads) and one 16-byte store. */
template <int DT>
__global__ void dequant_fast_bf16_kernel(cuda_weight w, uint4 *out, size_t total8) {
    size_t i8 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i8 >= total8) return;
    float v[8];
    dq_flat8<DT>(w, i8 * 8, v);
    uint32_t pk[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * u], v[2 * u + 1]);
        pk[u] = *(uint32_t *)&b;
    }
    out[i8] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

/* MLX affine 4-bit in the tiled layout (k % 1024 == 0, cuda_mlx4_nibble) to bf16: one
 * thread per (row, 1024-weight tile, lane) reads the lane's 16-byte vector of that tile
 * (eight 16-bit halves m = 0..7, each the 4 weights 128 m + 4 lane + j) and writes eight
 * 8-byte runs; a warp's lanes write 256 contiguous bytes per m. Four consecutive weights
 * share a group (gs % 4 == 0). Same arithmetic as mlx4_elem: s * q + b, each rounded. */
__global__ void dequant_mlx4_tiled_bf16_kernel(cuda_weight w, uint2 *out, size_t lanes) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= lanes) return;
    size_t per_row = (size_t)w.k / 1024 * 32, r = i / per_row;
    int t = (int)(i % per_row / 32), lane = (int)(i % 32), gpr = (int)(w.k / w.group_size);
    uint4 u = ((const uint4 *)w.data)[(r * (size_t)w.k / 8 + (size_t)t * 128) / 4 + lane];
    const uint32_t *uw = (const uint32_t *)&u, *sbr = (const uint32_t *)w.scales + r * (size_t)gpr;
#pragma unroll
    for (int m = 0; m < 8; m++) {
        int c = t * 1024 + m * 128 + lane * 4;
        uint32_t sb = sbr[c / w.group_size], half = uw[m / 2] >> (16 * (m % 2));
        float sc = w.sb_bf16 ? __uint_as_float(sb << 16) : h2f((uint16_t)(sb & 0xffff));
        float bi = w.sb_bf16 ? __uint_as_float(sb & 0xffff0000u) : h2f((uint16_t)(sb >> 16));
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = __fadd_rn(__fmul_rn(sc, (float)((half >> (4 * j)) & 0xF)), bi);
        __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        out[(r * (size_t)w.k + (size_t)c) / 4] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
    }
}

/* MLX affine 4-bit in the chunked layout (cuda_mlx4_nibble, tiled == 2) to bf16: one thread
 * per 8 consecutive weights 8i .. 8i + 7, which are the low nibbles (i % 8 < 4) or the high
 * ones (i % 8 >= 4) of the 8 bytes 8 (i % 4) of their 64-weight chunk: a warp reads 4 whole
 * chunks (each 8-byte word by two threads, one transaction) and writes 512 contiguous
 * bytes. Eight weights share a group (gs >= 32). Same arithmetic as mlx4_elem. */
__global__ void dequant_mlx4_chunked_bf16_kernel(cuda_weight w, uint4 *out, unsigned total8) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total8) return;
    /* 32-bit division (the caller checks total8 fits): a 64-bit one per 8 weights cost
     * more issue slots than this store-bound kernel has to spare (MLX prefill -6%) */
    unsigned per_row = (unsigned)(w.k / 8), r = i / per_row, col = (i - r * per_row) * 8, p = i % 8;
    uint2 u = *(const uint2 *)((const uint8_t *)w.data + (size_t)r * (size_t)(w.k / 2) + col / 64 * 32 + 8 * (p % 4));
    uint32_t sb = ((const uint32_t *)w.scales)[(size_t)r * (size_t)(w.k / w.group_size) + col / w.group_size];
    float sc = w.sb_bf16 ? __uint_as_float(sb << 16) : h2f((uint16_t)(sb & 0xffff));
    float bi = w.sb_bf16 ? __uint_as_float(sb & 0xffff0000u) : h2f((uint16_t)(sb >> 16));
    int shift = p >= 4 ? 4 : 0;
    uint32_t pk[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        uint32_t wd = j < 4 ? u.x : u.y;
        float a = __fadd_rn(__fmul_rn(sc, (float)((wd >> (8 * (j % 4) + shift)) & 0xF)), bi);
        float b = __fadd_rn(__fmul_rn(sc, (float)((wd >> (8 * (j % 4 + 1) + shift)) & 0xF)), bi);
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        pk[j / 2] = *(uint32_t *)&h;
    }
    out[i] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

/* Launches the bf16 dequantization of w into out: the flat kernels above where the format
 * has one (k % 8 == 0; 2-4x faster than the generic kernel: bench/results/kernel_choices.md,
 * "CUDA dequantizers"), else the generic kernels. */
static void launch_dequant_bf16(const cuda_weight *w, void *out) {
    size_t wn = (size_t)w->n * (size_t)w->k, total8 = wn / 8;
    unsigned grid = (unsigned)((total8 + 255) / 256);
    int fast = w->k % 8 == 0;
    if (fast && w->dtype == DT_AFFINE) cuda_dequant_affine_launch(w, out);
    else if (fast && w->dtype == DT_Q8_0) dequant_fast_bf16_kernel<DT_Q8_0><<<grid, 256, 0, cuda_stream()>>>(*w, (uint4 *)out, total8);
    else if (fast && w->dtype == DT_Q4_K)
        dequant_fast_bf16_kernel<DT_Q4_K><<<grid, 256, 0, cuda_stream()>>>(*w, (uint4 *)out, total8);
    else if (fast && w->dtype == DT_Q6_K)
        dequant_fast_bf16_kernel<DT_Q6_K><<<grid, 256, 0, cuda_stream()>>>(*w, (uint4 *)out, total8);
    else if (fast && w->dtype == DT_U32 && w->mlx_tiled == 2 && total8 <= 0xffffffffu)
        dequant_mlx4_chunked_bf16_kernel<<<grid, 256, 0, cuda_stream()>>>(*w, (uint4 *)out, (unsigned)total8);
    else if (fast && w->dtype == DT_U32 && w->mlx_tiled == 1 && w->group_size % 4 == 0) {
        size_t lanes = (size_t)w->n * (size_t)(w->k / 1024) * 32;
        dequant_mlx4_tiled_bf16_kernel<<<(unsigned)((lanes + 255) / 256), 256, 0, cuda_stream()>>>(*w, (uint2 *)out, lanes);
    }
    else if (w->k % 8 == 0) dequant8_bf16_kernel<<<grid, 256, 0, cuda_stream()>>>(*w, (uint4 *)out);
    else dequant_kernel<false><<<(unsigned)((wn + 255) / 256), 256, 0, cuda_stream()>>>(*w, out);
}

hearth_status cuda_dequant_bf16(const cuda_weight *w, void *out, hearth_error *err) {
    launch_dequant_bf16(w, out);
    return cuda_launched("dequant", err) ? HEARTH_ERR_IO : HEARTH_OK;
}

__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}

/* Four elements per thread (n % 4 == 0, 16-byte aligned rows). */
__global__ void to_bf16x4_kernel(const float4 *x, uint2 *y, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = x[i];
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    y[i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
}

/* f32 -> f16, saturated to the f16 range (an activation beyond +-65504 becomes the largest
 * finite half, not inf: the GEMM's sums stay finite). */
static __device__ __forceinline__ __half f2h_sat(float v) {
    return __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
}
__global__ void to_f16_kernel(const float *x, __half *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h_sat(x[i]);
}
__global__ void to_f16x4_kernel(const float4 *x, uint2 *y, size_t n4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = x[i];
    __half2 a = __halves2half2(f2h_sat(v.x), f2h_sat(v.y)), b = __halves2half2(f2h_sat(v.z), f2h_sat(v.w));
    y[i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
}

/* Rows from which a weight cuBLAS reads as stored (F16 / BF16) goes to the GEMM instead of
 * the GEMV: the multi-row 16-bit GEMV pays its dot products per row while cuBLAS streams the
 * weight once (H200, 14336 x 4096 F16: GEMV 32.9 us at 1 row, 39.1 at 2, 131.5 at 8; cuBLAS
 * 34.6 at 2, 35.2 at 8), so from 2 rows, inside the decode graphs too. */
#define DIRECT_MIN_T 2

/* Device bytes per weight element of the formats the dequantize path would expand (0: not
 * a quantized format). */
static double quant_bytes_per_elem(const cuda_weight *w) {
    switch (w->dtype) {
    case DT_Q4_K: return 144.0 / 256.0;
    case DT_Q6_K: return 210.0 / 256.0;
    case DT_Q8_0: return 34.0 / 32.0;
    case DT_U32: return 0.5 + 4.0 / (double)(w->group_size > 0 ? w->group_size : 64); /* nibbles + scale/bias */
    case DT_AFFINE: return w->aff_bits / 8.0 + 8.0 / (double)w->group_size; /* codes + f32 scale/bias */
    default: return 0.0;
    }
}

/* GEMV or dequantize + GEMM for a quantized weight and T >= 9 rows. cuda_gemv runs T rows
 * in chunks of 8 (then 4, then the rest) and re-reads the quantized weight (q bytes per
 * element) once per chunk; the GEMM path reads it once, writes a bf16 copy (2 bytes per
 * element) and cuBLAS reads that copy back (2 more). With the flat dequantizers (the
 * default) the crossovers are measured on the H200 (14336 x 4096; the timings are in
 * bench/results/kernel_choices.md, "CUDA GEMV or GEMM"):
 *     Q8_0  GEMV up to 16 rows
 *     Q4_K  GEMM from 9
 *     Q6_K  GEMM from 9; on the v2 GEMV (n >= 2k) GEMV up to 16
 * (Q4_K from 5 to 64 rows goes to the MMQ kernel before this rule is asked: cuda_matmul).
 * Tiled and chunked MLX 4-bit (their flat dequantizers written after that run) take Q4_K's
 * rule until timed. Other formats (untiled MLX 4-bit, the generic dequantizer) use the byte
 * model, GEMV when chunks(T) * q * 2 < q + 4 (the factor 2 matched the generic
 * dequantizer's crossovers: Q4_K GEMV up to 32 rows, Q8_0 16, Q6_K 24). At most
 * CUDA_MATMUL_GEMV_MAX_T rows (the scratch). */
static int use_gemv(const cuda_weight *w, int T) {
    double q = quant_bytes_per_elem(w);
    if (q <= 0.0 || T > CUDA_MATMUL_GEMV_MAX_T) return 0;
    if (w->k % 8 == 0) {
        if (w->dtype == DT_Q8_0) return T <= 16;
        if (w->dtype == DT_Q6_K) return T <= (cuda_gemv_v2_takes(w) ? 16 : 8);
        if (w->dtype == DT_Q4_K) return T <= 8;
        if (w->dtype == DT_U32 && w->mlx_tiled && w->group_size % 4 == 0) return T <= 8; /* as Q4_K (not yet timed) */
    }
    int chunks = T / 8 + (T % 8 >= 4) + (T % 4 > 0);
    return (double)chunks * q * 2.0 < q + 4.0;
}

int cuda_matmul_direct(const cuda_gemm *g, const cuda_weight *w) {
    if (!g) return 0;
    return g->exact_f32 ? w->dtype == DT_F32 : (w->dtype == DT_BF16 || w->dtype == DT_F16);
}

int cuda_matmul_small_direct(const cuda_gemm *g, const cuda_weight *w, int T) {
    return g && !g->exact_f32 && T >= DIRECT_MIN_T && cuda_matmul_direct(g, w);
}

int cuda_matmul_uses_gemv(const cuda_gemm *g, const cuda_weight *w, int T) {
    if (!g) return 1;
    if (T < GEMM_MIN_T) return !cuda_matmul_small_direct(g, w, T);
    return !g->exact_f32 && use_gemv(w, T);
}

int cuda_matmul_uses_mmq(const cuda_gemm *g, const cuda_weight *w, int T) {
    return g && !g->exact_f32 && cuda_gemv_int8_act(w) && cuda_mmq_takes(w, T);
}

/* Where cuda_matmul sends x · w^T at T rows: the MMQ kernel, the GEMV, or cuBLAS with f32
 * operands (exact mode) or with x converted to bf16 / f16 (CUDA_ACT_BF16 / CUDA_ACT_F16). */
enum { PATH_MMQ = -2, PATH_GEMV = -1, PATH_F32 = 0 };
static int matmul_path(const cuda_gemm *g, const cuda_weight *w, const float *x, int T) {
    if (((uintptr_t)x % 16) == 0 && cuda_matmul_uses_mmq(g, w, T)) return PATH_MMQ;
    if (cuda_matmul_uses_gemv(g, w, T)) return PATH_GEMV;
    if (g->exact_f32) return PATH_F32;
    /* F16 weights: cuBLAS reads them as they are, with f16 activations (no weight pass) */
    return w->dtype == DT_F16 ? CUDA_ACT_F16 : CUDA_ACT_BF16;
}

int cuda_matmul_act(const cuda_gemm *g, const cuda_weight *w, const float *x, int T) {
    if (!g || T <= 0) return CUDA_ACT_NONE;
    int path = matmul_path(g, w, x, T);
    return path > 0 ? path : CUDA_ACT_NONE;
}

static hearth_status act_fits(const cuda_gemm *g, int act, size_t n, const char *what, hearth_error *err) {
    if (act != CUDA_ACT_BF16 && act != CUDA_ACT_F16) return err_set(err, HEARTH_ERR_INVALID, "%s: no activation type", what);
    if (n > g->max_x) return err_set(err, HEARTH_ERR_INVALID, "%s: %zu activations exceed the GEMM scratch", what, n);
    return HEARTH_OK;
}

/* out = x as bf16 (n elements): the conversion cuda_matmul_load_x makes for cuBLAS. */
static void launch_to_bf16(const float *x, size_t n, void *out) {
    int v4 = n % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)out & 7) == 0;
    unsigned blocks = (unsigned)(((v4 ? n / 4 : n) + 255) / 256);
    if (v4)
        to_bf16x4_kernel<<<blocks, 256, 0, cuda_stream()>>>((const float4 *)x, (uint2 *)out, n / 4);
    else
        to_bf16_kernel<<<blocks, 256, 0, cuda_stream()>>>(x, (__nv_bfloat16 *)out, n);
}

hearth_status cuda_to_bf16(const float *x, size_t n, void *out, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    launch_to_bf16(x, n, out);
    return cuda_launched("to_bf16", err) ? HEARTH_ERR_IO : HEARTH_OK;
}

hearth_status cuda_matmul_load_x(cuda_gemm *g, int act, const float *x, int T, int64_t k, hearth_error *err) {
    size_t xn = (size_t)T * (size_t)k;
    if (act_fits(g, act, xn, "cuda_matmul_load_x", err)) return HEARTH_ERR_INVALID;
    int v4 = xn % 4 == 0 && ((uintptr_t)x & 15) == 0;
    unsigned blocks = (unsigned)(((v4 ? xn / 4 : xn) + 255) / 256);
    if (act == CUDA_ACT_F16 && v4)
        to_f16x4_kernel<<<blocks, 256, 0, cuda_stream()>>>((const float4 *)x, (uint2 *)g->x_scratch, xn / 4);
    else if (act == CUDA_ACT_F16)
        to_f16_kernel<<<blocks, 256, 0, cuda_stream()>>>(x, (__half *)g->x_scratch, xn);
    else
        launch_to_bf16(x, xn, g->x_scratch);
    return cuda_launched("to_bf16", err) ? HEARTH_ERR_IO : HEARTH_OK;
}

/* act(gate) * up (cuda_act.cuh) rounded once to the GEMM's input type, as silu_mul then
 * to_bf16 / to_f16 would give it: the f32 product never goes to memory. */
template <bool GELU, bool F16> __global__ void gated_to_kernel(const float *gate, const float *up, void *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = GELU ? gelu_tanh_mul_value(gate[i], up[i]) : silu_mul_value(gate[i], up[i]);
    if (F16) ((__half *)out)[i] = f2h_sat(v);
    else ((__nv_bfloat16 *)out)[i] = __float2bfloat16(v);
}

hearth_status cuda_gated_bf16(const float *gate, const float *up, size_t n, int gelu, void *out, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (gelu)
        gated_to_kernel<true, false><<<blocks, 256, 0, cuda_stream()>>>(gate, up, out, n);
    else
        gated_to_kernel<false, false><<<blocks, 256, 0, cuda_stream()>>>(gate, up, out, n);
    return cuda_launched("gated_bf16", err) ? HEARTH_ERR_IO : HEARTH_OK;
}

hearth_status cuda_matmul_load_gated(cuda_gemm *g, int act, const float *gate, const float *up, int T, int64_t k,
                                     int gelu, hearth_error *err) {
    size_t n = (size_t)T * (size_t)k;
    if (act_fits(g, act, n, "cuda_matmul_load_gated", err)) return HEARTH_ERR_INVALID;
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (gelu && act == CUDA_ACT_F16) gated_to_kernel<true, true><<<blocks, 256, 0, cuda_stream()>>>(gate, up, g->x_scratch, n);
    else if (gelu) gated_to_kernel<true, false><<<blocks, 256, 0, cuda_stream()>>>(gate, up, g->x_scratch, n);
    else if (act == CUDA_ACT_F16) gated_to_kernel<false, true><<<blocks, 256, 0, cuda_stream()>>>(gate, up, g->x_scratch, n);
    else gated_to_kernel<false, false><<<blocks, 256, 0, cuda_stream()>>>(gate, up, g->x_scratch, n);
    return cuda_launched("gated_to", err) ? HEARTH_ERR_IO : HEARTH_OK;
}

/* y[T][n] = W · x with W in cuBLAS's input type (dequantized into the scratch unless stored so). */
static hearth_status gemm_run(cuda_gemm *g, const cuda_weight *w, const void *B, cudaDataType_t in_type, int T, float *y,
                              hearth_error *err) {
    size_t wn = (size_t)w->n * (size_t)w->k;
    int as_stored = (in_type == CUDA_R_32F && w->dtype == DT_F32) || (in_type == CUDA_R_16BF && w->dtype == DT_BF16) ||
                    (in_type == CUDA_R_16F && w->dtype == DT_F16);
    if (!as_stored && wn > g->max_w)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_matmul: [%lld, %lld] x %d rows exceeds the GEMM scratch",
                       (long long)w->n, (long long)w->k, T);
    const void *A = w->data;
    if (!as_stored) {
        if (in_type == CUDA_R_32F) dequant_kernel<true><<<(unsigned)((wn + 255) / 256), 256, 0, cuda_stream()>>>(*w, g->w_scratch);
        else launch_dequant_bf16(w, g->w_scratch);
        if (cuda_launched("dequant", err)) return HEARTH_ERR_IO;
        A = g->w_scratch;
    }
    /* Row-major y[T][n] is column-major n x T: y = W (k x n col-major, transposed) · x (k x T). */
    const float alpha = 1.0f, beta = 0.0f;
    int n = (int)w->n, k = (int)w->k;
    cublasStatus_t cs =
        cublas_lib.gemm_ex(g->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, T, k, &alpha, A, in_type, k, B, in_type, k, &beta, y,
                           CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return err_set(err, HEARTH_ERR_IO, "cuda: cublasGemmEx [%d x %d x %d] failed (status %d)", n, T, k, (int)cs);
    return HEARTH_OK;
}

hearth_status cuda_matmul_loaded(cuda_gemm *g, const cuda_weight *w, int act, int T, float *y, hearth_error *err) {
    if (act_fits(g, act, (size_t)T * (size_t)w->k, "cuda_matmul_loaded", err)) return HEARTH_ERR_INVALID;
    return gemm_run(g, w, g->x_scratch, act == CUDA_ACT_F16 ? CUDA_R_16F : CUDA_R_16BF, T, y, err);
}

hearth_status cuda_matmul(cuda_gemm *g, const cuda_weight *w, const float *x, int T, float *y, hearth_error *err) {
    int path = matmul_path(g, w, x, T);
    if (path == PATH_MMQ) return cuda_gemv_mmq(w, x, T, y, err);
    if (path == PATH_GEMV) return cuda_gemv(w, x, T, y, err);
    if (path != PATH_F32) {
        if (cuda_matmul_load_x(g, path, x, T, w->k, err)) return HEARTH_ERR_INVALID;
        return cuda_matmul_loaded(g, w, path, T, y, err);
    }
    if ((size_t)T * (size_t)w->k > g->max_x)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_matmul: [%lld, %lld] x %d rows exceeds the GEMM scratch",
                       (long long)w->n, (long long)w->k, T);
    return gemm_run(g, w, x, CUDA_R_32F, T, y, err);
}
