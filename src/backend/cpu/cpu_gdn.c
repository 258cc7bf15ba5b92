/* cpu_gdn.c: the Gated DeltaNet layer's middle on the CPU (op_gdn, ops.h): the causal conv1d
 * over each sequence's kept inputs, the L2 normalisation of q and k, the gated delta rule on
 * each sequence's state and the gated RMSNorm of its output, in float32 as mlx-lm's
 * gated_delta_ops (the sequential form it runs off the GPU) computes them. */
#include "backend/cpu/cpu_ops.h"
#include "kv/kv_state.h"
#include <math.h>
#include <string.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
/* mlx's softplus: logaddexp(x, 0) = max(x, 0) + log1p(exp(-|x|)). */
static float softplusf(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

/* mlx-lm normalize_qk: rms_norm with eps * inv^2, times inv^2 (q) or inv (k), inv = dim^-1/2. */
static void l2norm(float *x, int n, float factor, float inv) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + 1e-6f * inv * inv);
    for (int i = 0; i < n; i++) x[i] = factor * (x[i] * r);
}

/* Token t's conv over its sequence's last conv_k - 1 inputs (then kept: the state shifts by
 * one), SiLU, and q / k normalised in place in qkv. */
static void conv_token(const ops_gdn_args *a, int t) {
    int C = 2 * a->k_heads * a->k_dim + a->v_heads * a->v_dim, K = a->conv_k;
    float *rec = kv_state_at(a->kv, a->layer, a->slot[t]);
    if (a->pos[t] == 0) /* a sequence starts: its conv inputs and delta state are zero */
        memset(rec, 0, a->kv->state->layer_floats * sizeof(float));
    float *x = a->qkv + (size_t)t * C;
    for (int c = 0; c < C; c++) {
        const float *w = a->conv + (size_t)c * K;
        float in = x[c], sum = 0.0f;
        for (int k = 0; k < K - 1; k++) sum += w[k] * rec[(size_t)k * C + c];
        sum += w[K - 1] * in;
        for (int k = 0; k + 1 < K - 1; k++) rec[(size_t)k * C + c] = rec[(size_t)(k + 1) * C + c];
        if (K > 1) rec[(size_t)(K - 2) * C + c] = in;
        x[c] = sum * sigmoidf(sum);
    }
    float inv = 1.0f / sqrtf((float)a->k_dim);
    for (int h = 0; h < a->k_heads; h++) {
        l2norm(x + (size_t)h * a->k_dim, a->k_dim, inv * inv, inv);
        l2norm(x + (size_t)(a->k_heads + h) * a->k_dim, a->k_dim, inv, inv);
    }
}

/* Value head h over every token of the step in order, each on its sequence's state. */
static void head_task(void *ctx, int h, int thread) {
    (void)thread;
    const ops_gdn_args *a = ctx;
    int Dk = a->k_dim, Dv = a->v_dim, Hv = a->v_heads, hk = h / (Hv / a->k_heads);
    int C = 2 * a->k_heads * Dk + Hv * Dv;
    size_t conv_floats = (size_t)(a->conv_k - 1) * C;
    float A = expf(a->A_log[h]);
    for (int t = 0; t < a->T; t++) {
        float *S = kv_state_at(a->kv, a->layer, a->slot[t]) + conv_floats + (size_t)h * Dv * Dk;
        const float *x = a->qkv + (size_t)t * C, *q = x + (size_t)hk * Dk, *k = x + (size_t)(a->k_heads + hk) * Dk;
        const float *v = x + (size_t)2 * a->k_heads * Dk + (size_t)h * Dv;
        float g = expf(-A * softplusf(a->a[(size_t)t * Hv + h] + a->dt_bias[h]));
        float beta = sigmoidf(a->b[(size_t)t * Hv + h]);
        float *y = a->y + (size_t)t * Hv * Dv + (size_t)h * Dv;
        for (int i = 0; i < Dv; i++) {
            float *row = S + (size_t)i * Dk, mem = 0.0f;
            for (int j = 0; j < Dk; j++) mem += (row[j] *= g) * k[j];
            float delta = (v[i] - mem) * beta, out = 0.0f;
            for (int j = 0; j < Dk; j++) out += (row[j] += k[j] * delta) * q[j];
            y[i] = out;
        }
        /* gated RMSNorm: rmsnorm(y) * norm * silu(z) */
        const float *z = a->z + (size_t)t * Hv * Dv + (size_t)h * Dv;
        float ss = 0.0f;
        for (int i = 0; i < Dv; i++) ss += y[i] * y[i];
        float r = 1.0f / sqrtf(ss / (float)Dv + a->norm_eps);
        for (int i = 0; i < Dv; i++) y[i] = z[i] * sigmoidf(z[i]) * (y[i] * r * a->norm[i]);
    }
}

void ops_gated_delta(const ops_gdn_args *a, threadpool *tp) {
    for (int t = 0; t < a->T; t++) conv_token(a, t); /* in order: a sequence's tokens chain through its conv state */
    tp_run(tp, a->v_heads, head_task, (void *)a);
}
