/* train_ops.h: the float32 forward and backward of each op a llama- or Gemma-family decoder layer
 * needs for LoRA training (hearth train): a frozen linear with its LoRA update, RMSNorm,
 * RoPE, causal (optionally sliding-window) attention with grouped KV heads, the SiLU- and
 * GELU-gated MLP products and the final
 * cross-entropy over an lm_head. Frozen weights get no gradient; each backward returns the
 * input's gradient (added to dx) and, for LoRA, the A and B gradients (added to ga, gb).
 * Row-major throughout: a [rows, cols] matrix is rows of cols floats. Each backward is
 * checked against PyTorch autograd by tests/unit/test_train_ops.c. tp may be NULL. */
#ifndef HEARTH_TRAIN_TRAIN_OPS_H
#define HEARTH_TRAIN_TRAIN_OPS_H
#include "base/threadpool.h"
#include <stdint.h>

/* C[M,N] = A[M,K] B[K,N] (+= with TR_GEMM_ACC) in float32 (train_gemm.c), any strides:
 * A(m,k) = a[m*sam + k*sak], B(k,n) = b[k*sbk + n*sbn], C(m,n) = c[m*ldc + n]. Each output
 * is one sum in k order whatever the threads. tp may be NULL. For causal attention:
 * TR_GEMM_CAUSAL: outputs with n > m are not wanted (some are left unwritten);
 * TR_GEMM_K_LE_M / TR_GEMM_K_GE_M: A(m,k) is zero for k > m / k < m, so whole blocks of
 * those terms are skipped (the ones near the diagonal are read: they must be zeros). */
/* batch products at once (one round of the pool): product i reads a + i a_bs and
 * b + (i / b_div) b_bs (b_div query heads share a KV head) and writes c + i c_bs. */
void tr_gemm_batch(threadpool *tp, int batch, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam,
                   int64_t sak, int64_t a_bs, const float *b, int64_t sbk, int64_t sbn, int64_t b_bs, int b_div,
                   float *c, int64_t ldc, int64_t c_bs, int flags);
/* The floats of packing workspace a product of batch x [M, K] A panels with these flags
 * takes on `threads` threads (the workspace keeps the largest so far; a long K is packed a
 * slab at a time): for hearth_train_fit. */
size_t tr_gemm_workspace_floats(int batch, int64_t M, int64_t K, int threads, int flags);
/* Frees the calling thread's packing workspace (kept between tr_gemm calls). */
void tr_gemm_release(void);
#define TR_GEMM_ACC 1
#define TR_GEMM_CAUSAL 2
#define TR_GEMM_K_LE_M 4
#define TR_GEMM_K_GE_M 8
void tr_gemm(threadpool *tp, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam, int64_t sak,
             const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc, int flags);

/* y[M,N] = x[M,K] . w[N,K]^T, or += when acc. */
void tr_matmul_nt(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, float *y, int acc);
/* dx[M,K] += dy[M,N] . w[N,K]. */
void tr_matmul_nn(threadpool *tp, const float *dy, int64_t M, int64_t N, const float *w, int64_t K, float *dx);

/* A LoRA pair in MLX's layout: a [K, r], b [r, N]; y gains scale * (x a) b. ga, gb: their
 * gradients (same shapes), added to. DoRA (m set; mlx-lm's DoRALinear): the output before
 * the bias is scaled per column by m / denom, denom [N] the row norms of w + scale (a b)^T,
 * computed by each forward and held constant in the backward (a stop-gradient); gm [N], m's
 * gradient, added to; work: [M, N] floats for the backward. */
typedef struct tr_lora {
    float *a, *b, *ga, *gb;
    int r;
    float scale;
    float *m, *gm, *denom, *work;
} tr_lora;

/* y[M,N] = x w^T (+ scale * (x a) b when l) (times m / denom for DoRA) (+ bias); xa [M, r]:
 * scale * x a, kept for the backward. w NULL (plain LoRA only): y keeps its values and the
 * update is added to them (the base product made elsewhere: the routed experts'). */
void tr_linear_fwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                   const tr_lora *l, float *xa, float *y);
/* dx[M,K] += dy w + scale * (dy b^T) a^T; l->ga += x^T (scale * dy b^T), l->gb += xa^T dy
 * (DoRA: dy scaled by m / denom first, and gm += sum over rows of dy (x w^T + xa b) / denom).
 * dx may be NULL (no input gradient needed); w NULL: the update's terms only. scratch: M * r floats. */
void tr_linear_bwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const tr_lora *l,
                   const float *xa, const float *dy, float *dx, float *scratch);

/* y = x / rms(x) * w over rows of D (w NULL: 1); rstd[M]: the 1 / rms kept for the backward. */
void tr_rmsnorm_fwd(const float *x, int64_t M, int64_t D, const float *w, float eps, float *y, float *rstd);
/* dx += the gradient through the norm (w frozen). */
void tr_rmsnorm_bwd(const float *x, int64_t M, int64_t D, const float *w, const float *rstd, const float *dy,
                    float *dx);

/* Rotates the first rd of each head's hd values of x [T, H, hd] in place by pos t *
 * inv_freq[i] (rd / 2 pairs; rd = hd: all, rd < hd: partial RoPE, the rest untouched):
 * pairs (i, i + rd/2) (HF / MLX "rotate half"), or (2i, 2i+1) when adjacent. sign = -1
 * rotates back, which is the backward (a rotation's transpose). */
void tr_rope(float *x, int64_t T, int H, int hd, int rd, int pos0, const float *inv_freq, int adjacent, int sign);

/* Causal attention of one sequence: q [T, Hq*hd], k, v [T, Hkv*hd], out [T, Hq*hd];
 * p [Hq, T, T]: the softmax probabilities kept for the backward (rows i, columns <= i).
 * window > 0: query i sees keys i - window + 1 .. i only (a sliding-window layer, mlx-lm's
 * mask); 0: every earlier key. The backward reads the window from p's zeros. */
void tr_attn_fwd(threadpool *tp, const float *q, const float *k, const float *v, int64_t T, int Hq, int Hkv, int hd,
                 float scale, int window, float *p, float *out);
/* dq, dk, dv are overwritten (not added to). scratch: Hq * T * T floats. */
void tr_attn_bwd(threadpool *tp, const float *q, const float *k, const float *v, const float *p, const float *dout,
                 int64_t T, int Hq, int Hkv, int hd, float scale, float *dq, float *dk, float *dv, float *scratch);

/* h = silu(g) * u over n values; the backward overwrites dg and du. */
void tr_silu_mul_fwd(threadpool *tp, const float *g, const float *u, int64_t n, float *h);
void tr_silu_mul_bwd(threadpool *tp, const float *g, const float *u, const float *dh, int64_t n, float *dg,
                     float *du);

/* h = gelu_tanh(g) * u (MLX's gelu_approx: Gemma's MLP); the backward overwrites dg, du. */
void tr_gelu_mul_fwd(threadpool *tp, const float *g, const float *u, int64_t n, float *h);
void tr_gelu_mul_bwd(threadpool *tp, const float *g, const float *u, const float *dh, int64_t n, float *dg, float *du);

/* One token of the gated delta rule on one value head's state S [Dv, Dk] (rows of Dk, in
 * place): S *= g; delta = beta (v - S k); S += delta k^T; y = S q (y NULL: not wanted). */
void tr_delta_step(float *S, const float *k, const float *q, const float *v, int Dv, int Dk, float g, float beta,
                   float *y);
/* Its backward: prev and now are the states before and after the token, dy [Dv] the output's
 * gradient; dS, the gradient wrt the state after, becomes the gradient wrt the state before;
 * dq, dk [Dk], dv [Dv], *dg and *dbeta are overwritten. work: Dk floats. */
void tr_delta_step_bwd(const float *prev, const float *now, const float *k, const float *q, const float *v, int Dv,
                       int Dk, float g, float beta, const float *dy, float *dS, float *dq, float *dk, float *dv,
                       float *dg, float *dbeta, float *work);

/* Cross-entropy of the logits h[M,D] w[V,D]^T (softcap > 0: softcap tanh(logits / softcap),
 * Gemma 4's) against targets: rows with weight[i] == 0
 * are skipped. Returns sum_i weight[i] * ce_i (double) and sets dh[M,D] (overwritten; NULL:
 * not wanted, half the work saved) to its gradient; ce (NULL: not wanted) gets each row's
 * ce_i (0 for skipped rows). scratch:
 * TR_XENT_ROWS * TR_XENT_ROW_FLOATS(V, D) floats. */
#define TR_XENT_ROWS 256
/* A chunk row of scratch: its logits (padded by 16 floats, so the rows of a register tile's
 * stores are not a multiple of 4 KiB apart), its hidden state and its gradient. */
#define TR_XENT_ROW_FLOATS(V, D) ((V) + 16 + 2 * (D))
double tr_xent(threadpool *tp, const float *h, int64_t M, int64_t D, const float *w, int64_t V, float softcap,
               const int32_t *targets, const float *weight, float *dh, float *ce, float *scratch);
#endif
