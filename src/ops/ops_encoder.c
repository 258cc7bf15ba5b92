/* ops_encoder.c: CPU implementations of ops_encoder.h. Plain float32 loops (the compiler
 * vectorises the element-wise ones); attention is split over (sequence, head) pairs on the
 * thread pool, with a max-subtracted softmax accumulated in float as torch does. */
#include "ops/ops_encoder.h"
#include <math.h>
#include <string.h>

void ops_layernorm(float *out, const float *x, const float *w, const float *b, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *o = out + (size_t)t * n;
        /* two passes in double: rows are short (hidden size) and the mean of large
         * activations would lose digits in float */
        double sum = 0, sq = 0;
        for (int i = 0; i < n; i++) sum += xr[i];
        double mean = sum / n;
        for (int i = 0; i < n; i++) sq += (xr[i] - mean) * (xr[i] - mean);
        float inv = (float)(1.0 / sqrt(sq / n + eps)), m = (float)mean;
        for (int i = 0; i < n; i++) o[i] = (xr[i] - m) * inv * w[i] + b[i];
    }
}

void ops_gelu_erf(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void ops_add_rows(float *y, const float *bias, int T, int n) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += bias[i];
}

static void bidir_task(void *ctx, int task, int thread) {
    const ops_bidir_args *a = ctx;
    int s = task / a->n_heads, h = task % a->n_heads, d = a->head_dim;
    int start = a->seq_start[s], len = a->seq_start[s + 1] - start;
    size_t width = (size_t)a->n_heads * d;
    float *p = a->scratch + (size_t)thread * a->max_len;
    for (int i = 0; i < len; i++) {
        const float *q = a->q + (size_t)(start + i) * width + (size_t)h * d;
        float mx = -INFINITY;
        for (int j = 0; j < len; j++) {
            const float *k = a->k + (size_t)(start + j) * width + (size_t)h * d;
            float dot = 0.0f;
            for (int c = 0; c < d; c++) dot += q[c] * k[c];
            p[j] = dot * a->scale;
            if (p[j] > mx) mx = p[j];
        }
        float sum = 0.0f;
        for (int j = 0; j < len; j++) sum += (p[j] = expf(p[j] - mx));
        float inv = 1.0f / sum, *o = a->out + (size_t)(start + i) * width + (size_t)h * d;
        memset(o, 0, (size_t)d * sizeof *o);
        for (int j = 0; j < len; j++) {
            const float *v = a->v + (size_t)(start + j) * width + (size_t)h * d;
            float pj = p[j] * inv;
            for (int c = 0; c < d; c++) o[c] += pj * v[c];
        }
    }
}

void ops_attention_bidir(const ops_bidir_args *a, threadpool *tp) {
    tp_run(tp, a->n_seqs * a->n_heads, bidir_task, (void *)a);
}
