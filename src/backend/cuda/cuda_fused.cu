/* cuda_fused.cu: decode-step kernels that do in one launch what cuda_ops.cu and
 * cuda_gemv.cu do in several, with the same per-element arithmetic (results bit-identical
 * to the unfused sequence): RoPE of q and k together; (residual add +) rmsnorm and the
 * SwiGLU / GeGLU gate, each also writing its output quantized to int8 blocks of 32 for
 * the int8-activation GEMVs (cuda_gemv_multi_q8). Must not allocate or synchronize; owns
 * no KV or attention code. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_q8.cuh"
#include "backend/cuda/cuda_rope.cuh"
#include <limits.h>
#include <math.h>
#include <stdint.h>

/* One thread per (token, head, pair) over the q heads then the k heads; each pair is
 * rotated exactly as rope_kernel (cuda_ops.cu) does it. */
__global__ void rope_qk_kernel(float *q, float *k, int T, int n_heads, int n_kv_heads, int head_dim, const int32_t *pos,
                               const float *inv_freq, int adjacent) {
    pdl_wait(); /* q and k come from the q/k/v GEMV */
    int half = head_dim / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nq = (size_t)T * n_heads * half;
    size_t total = nq + (size_t)T * n_kv_heads * half;
    if (idx >= total) return;
    int kside = idx >= nq, heads = kside ? n_kv_heads : n_heads;
    if (kside) idx -= nq;
    int i = (int)(idx % half);
    size_t th = idx / half; /* t * heads + h */
    int t = (int)(th / heads);
    rope_rotate_pair((kside ? k : q) + th * head_dim, i, half, pos[t], inv_freq, adjacent);
}

hearth_status cuda_rope_qk(float *q, float *k, int T, int n_heads, int n_kv_heads, int head_dim, const int32_t *pos,
                           const float *inv_freq, int adjacent, hearth_error *err) {
    size_t total = (size_t)T * (n_heads + n_kv_heads) * (head_dim / 2);
    if (total == 0) return HEARTH_OK;
    if (total > (size_t)INT32_MAX * 256)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_rope_qk: %zu rotations in one launch", total);
    pdl_launch_small(rope_qk_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), q, k, T, n_heads, n_kv_heads, head_dim,
               pos, inv_freq, adjacent);
    return cuda_launched("rope_qk", err);
}

/* add_rmsnorm_kernel / rmsnorm_kernel of cuda_ops.cu (the reduction of cuda_norm.cuh), plus
 * the int8 copy of out. n % 32 == 0, so the 32 lanes of a warp cover one quant block per
 * step (element i = threadIdx.x + NORM_THREADS j). delta NULL: plain rmsnorm of x. */
__global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_q8_kernel(float *out, float *x, const float *delta, const float *w, float shift, int n, float eps,
                          int8_t *xq, float2 *xs) {
    pdl_trigger(); /* the GEMV after this may start prefetching its weights */
    pdl_wait();    /* x and delta come from the kernels before (pdl_launch_small) */
    float *o = out + (size_t)blockIdx.x * n;
    int lane = threadIdx.x % 32;
    int8_t *qr = xq + (size_t)blockIdx.x * n;
    float2 *sr = xs + (size_t)blockIdx.x * (n / 32);
    norm_row(x + (size_t)blockIdx.x * n, delta ? delta + (size_t)blockIdx.x * n : NULL, w, shift, n, eps,
             [&](int i, float y) { /* uniform per warp: n % 32 == 0 */
                 o[i] = y;
                 quant_block32(y, qr + (i - lane), sr + i / 32, lane);
             });
}

hearth_status cuda_add_rmsnorm_q8(float *out, float *x, const float *delta, const float *w, float shift, int T, int n,
                                  float eps, int8_t *xq, float *xs, hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    if (n % 32) return err_set(err, HEARTH_ERR_INVALID, "cuda_add_rmsnorm_q8: row of %d (not a multiple of 32)", n);
    pdl_launch_small(add_rmsnorm_q8_kernel, dim3((unsigned)T), dim3(NORM_THREADS), out, x, delta, w, shift, n, eps, xq,
                     (float2 *)xs);
    return cuda_launched("add_rmsnorm_q8", err);
}

/* silu_mul_kernel / gelu_tanh_mul_kernel of cuda_ops.cu (cuda_act.cuh), plus the int8
 * copy of the product; n % 32 == 0 and blocks of 256, so each warp is one quant block. */
template <bool GELU>
__global__ void __launch_bounds__(256) gated_q8_kernel(float *gate, const float *up, size_t n, int8_t *xq, float2 *xs) {
    pdl_trigger();
    pdl_wait(); /* gate and up come from the GEMV before (pdl_launch_small) */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; /* whole warps: n % 32 == 0 */
    float v = GELU ? gelu_tanh_mul_value(gate[i], up[i]) : silu_mul_value(gate[i], up[i]);
    gate[i] = v;
    int lane = threadIdx.x % 32;
    quant_block32(v, xq + (i - lane), xs + i / 32, lane);
}

hearth_status cuda_gated_q8(float *gate, const float *up, size_t n, int gelu, int8_t *xq, float *xs,
                            hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    if (n % 32) return err_set(err, HEARTH_ERR_INVALID, "cuda_gated_q8: %zu values (not a multiple of 32)", n);
    unsigned grid = (unsigned)((n + 255) / 256);
    if (gelu)
        pdl_launch_small(gated_q8_kernel<true>, dim3(grid), dim3(256), gate, up, n, xq, (float2 *)xs);
    else
        pdl_launch_small(gated_q8_kernel<false>, dim3(grid), dim3(256), gate, up, n, xq, (float2 *)xs);
    return cuda_launched("gated_q8", err);
}
