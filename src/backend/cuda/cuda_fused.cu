/* cuda_fused.cu: decode-step kernels that do in one launch what cuda_ops.cu and
 * cuda_gemv.cu do in several, with the same per-element arithmetic (results bit-identical
 * to the unfused sequence): RoPE of q and k together; the residual join (op_residual: the
 * delta's norm and scale, the add, x's scale, the next rmsnorm) and the SwiGLU / GeGLU gate,
 * each also writing its output quantized to int8 blocks of 32 for
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

/* op_residual, one block of NORM_THREADS per row (residual_row, cuda_norm.cuh): x = (x +
 * d) * xscale with d the (normed, scaled) delta; out = rmsnorm(x) * (w + shift) when w is
 * given, and with Q8 its int8 copy, or without w the new x's (n % 32 == 0, so the 32 lanes
 * of a warp cover one quant block per step: element i = threadIdx.x + NORM_THREADS j). */
template <bool DNORM, bool Q8>
__global__ void __launch_bounds__(NORM_THREADS)
    residual_kernel(float *out, float *x, const float *delta, const float *dw, float dscale, float xscale,
                    const float *w, float shift, int n, float eps, int8_t *xq, float2 *xs) {
    pdl_trigger(); /* the GEMV after this may start prefetching its weights */
    /* x and delta come from the kernels before (pdl_launch_small): residual_row waits */
    size_t r = blockIdx.x;
    float *o = out ? out + r * n : NULL;
    int lane = threadIdx.x % 32;
    int8_t *qr = Q8 ? xq + r * n : NULL;
    float2 *sr = Q8 ? xs + r * (n / 32) : NULL;
    residual_row<DNORM>(x + r * n, delta ? delta + r * n : NULL, dw, dscale, xscale, w, shift, n, eps, Q8 && !w,
                        [&](int i, float y) { /* uniform per warp with Q8: n % 32 == 0 */
                            if (o) o[i] = y;
                            if (Q8) quant_block32(y, qr + (i - lane), sr + i / 32, lane);
                        });
}

hearth_status cuda_residual(const cuda_residual_args *a, hearth_error *err) {
    if (a->T <= 0 || a->n <= 0) return HEARTH_OK;
    int q8 = a->xq != NULL, dnorm = a->delta_norm != NULL && a->delta != NULL;
    if (q8 && a->n % 32) return err_set(err, HEARTH_ERR_INVALID, "cuda_residual: row of %d (not a multiple of 32)", a->n);
    if (a->w && !a->out) return err_set(err, HEARTH_ERR_INVALID, "cuda_residual: a norm weight without an output");
    void (*k)(float *, float *, const float *, const float *, float, float, const float *, float, int, float, int8_t *,
              float2 *) = dnorm ? (q8 ? residual_kernel<true, true> : residual_kernel<true, false>)
                                : (q8 ? residual_kernel<false, true> : residual_kernel<false, false>);
    pdl_launch_small(k, dim3((unsigned)a->T), dim3(NORM_THREADS), a->w ? a->out : NULL, a->x, a->delta, a->delta_norm,
                     a->delta_scale, a->x_scale, a->w, a->shift, a->n, a->eps, q8 ? a->xq : NULL,
                     (float2 *)(q8 ? a->xs : NULL));
    return cuda_launched("residual", err);
}

hearth_status cuda_add_rmsnorm_q8(float *out, float *x, const float *delta, const float *w, float shift, int T, int n,
                                  float eps, int8_t *xq, float *xs, hearth_error *err) {
    cuda_residual_args a = {.x = x, .delta = delta, .delta_scale = 1.0f, .x_scale = 1.0f, .w = w, .shift = shift,
                            .out = out, .xq = xq, .xs = xs, .T = T, .n = n, .eps = eps};
    return cuda_residual(&a, err);
}

hearth_status cuda_add_rmsnorm(float *out, float *x, const float *delta, const float *w, float shift, int T, int n,
                               float eps, hearth_error *err) {
    return cuda_add_rmsnorm_q8(out, x, delta, w, shift, T, n, eps, NULL, NULL, err);
}

/* silu_mul_kernel / gelu_tanh_mul_kernel of cuda_ops.cu (cuda_act.cuh), plus the int8
 * copy of the product; n % 32 == 0 and blocks of 256, so each warp is one quant block. up
 * of element i is up[(i / row) * up_stride + i % row] (row n, stride 0: up[i]; the per-layer
 * gate's rows read their layer's slice of a wider row). */
template <bool GELU>
__global__ void __launch_bounds__(256)
    gated_q8_kernel(float *gate, const float *up, size_t n, size_t row, size_t up_stride, int8_t *xq, float2 *xs) {
    pdl_trigger();
    pdl_wait(); /* gate and up come from the GEMV before (pdl_launch_small) */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; /* whole warps: n % 32 == 0 */
    float u = up[(i / row) * up_stride + i % row];
    float v = GELU ? gelu_tanh_mul_value(gate[i], u) : silu_mul_value(gate[i], u);
    gate[i] = v;
    int lane = threadIdx.x % 32;
    quant_block32(v, xq + (i - lane), xs + i / 32, lane);
}

static hearth_status gated_q8_launch(float *gate, const float *up, size_t n, size_t row, size_t up_stride, int gelu,
                                     int8_t *xq, float *xs, hearth_error *err) {
    if (n == 0) return HEARTH_OK;
    if (n % 32 || row % 32)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_gated_q8: rows of %zu values (not a multiple of 32)", row);
    unsigned grid = (unsigned)((n + 255) / 256);
    if (gelu)
        pdl_launch_small(gated_q8_kernel<true>, dim3(grid), dim3(256), gate, up, n, row, up_stride, xq, (float2 *)xs);
    else
        pdl_launch_small(gated_q8_kernel<false>, dim3(grid), dim3(256), gate, up, n, row, up_stride, xq, (float2 *)xs);
    return cuda_launched("gated_q8", err);
}

hearth_status cuda_gated_q8(float *gate, const float *up, size_t n, int gelu, int8_t *xq, float *xs,
                            hearth_error *err) {
    return gated_q8_launch(gate, up, n, n ? n : 1, 0, gelu, xq, xs, err);
}

hearth_status cuda_gelu_tanh_mul_rows_q8(float *gate, const float *up, int T, int n, size_t up_stride, int8_t *xq,
                                         float *xs, hearth_error *err) {
    if (T <= 0 || n <= 0) return HEARTH_OK;
    return gated_q8_launch(gate, up, (size_t)T * n, (size_t)n, up_stride, 1, xq, xs, err);
}
