/* ops_cpu.c: CPU implementations of the ops in ops.h. Plain float32 loops the compiler
 * vectorises; attention is split over (token, head) pairs on the thread pool. The
 * arithmetic mirrors mlx's (f32 accumulation, max-subtracted softmax) so the reference
 * tier stays within float rounding of mlx-lm. */
#include "ops/ops.h"
#include <math.h>
#include <string.h>

void ops_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *o = out + (size_t)t * n;
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) o[i] = xr[i] * inv * (w[i] + shift);
    }
}

void ops_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq, int adjacent) {
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float theta = (float)pos[t] * inv_freq[i];
            float c = cosf(theta), s = sinf(theta);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)t * n_heads + h) * head_dim;
                int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

void ops_silu_mul(float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void ops_gelu_tanh_mul(float *gate, const float *up, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void ops_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void ops_scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

size_t ops_attention_scratch(const kv_cache *kv) {
    return (size_t)kv->max_blocks_per_slot * KV_BLOCK_SIZE + (size_t)kv->head_dim;
}

static void attention_task(void *ctx, int task, int thread) {
    const ops_attention_args *a = ctx;
    int t = task / a->n_heads, h = task % a->n_heads;
    int kvh = h / (a->n_heads / a->n_kv_heads), d = a->head_dim;
    float *scores = a->scratch + (size_t)thread * ops_attention_scratch(a->kv);
    const float *q = a->q + ((size_t)t * a->n_heads + h) * d;
    float *out = a->out + ((size_t)t * a->n_heads + h) * d;
    int p_end = a->pos[t], p_start = 0, slot = a->slot[t];
    if (a->window > 0 && p_end - a->window + 1 > 0) p_start = p_end - a->window + 1;
    float mx = -INFINITY;
    for (int p = p_start; p <= p_end; p++) {
        const float *k = kv_key(a->kv, a->layer, slot, p, kvh);
        float s = 0.0f;
        for (int i = 0; i < d; i++) s += q[i] * k[i];
        s *= a->scale;
        scores[p - p_start] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int p = p_start; p <= p_end; p++) {
        float e = expf(scores[p - p_start] - mx);
        scores[p - p_start] = e;
        sum += e;
    }
    memset(out, 0, (size_t)d * sizeof *out);
    float inv = 1.0f / sum;
    for (int p = p_start; p <= p_end; p++) {
        const float *v = kv_value(a->kv, a->layer, slot, p, kvh);
        float w = scores[p - p_start] * inv;
        for (int i = 0; i < d; i++) out[i] += w * v[i];
    }
}

void ops_attention(const ops_attention_args *a, threadpool *tp) {
    tp_run(tp, a->T * a->n_heads, attention_task, (void *)a);
}
