/* cpu_gdn.c: the Gated DeltaNet layer's middle on the CPU (op_gdn, ops.h): the causal conv1d
 * over each sequence's kept inputs, the L2 normalisation of q and k, the gated delta rule on
 * each sequence's state and the gated RMSNorm of its output, in float32 as mlx-lm's
 * gated_delta_ops (the sequential form it runs off the GPU) computes them. */
#include "backend/cpu/cpu_ops.h"
#include "base/cpu_features.h"
#include "kv/kv_state.h"
#include <immintrin.h>
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
    float *x = a->qkv + (size_t)t * C, *jr = a->journal ? a->journal[t] : NULL;
    if (jr) memcpy(jr, x, (size_t)C * sizeof(float));
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
    if (jr) memcpy(jr + C, x, (size_t)C * sizeof(float));
}

size_t ops_gdn_journal_floats(int k_heads, int v_heads, int k_dim, int v_dim) {
    return 2 * (2 * (size_t)k_heads * k_dim + (size_t)v_heads * v_dim) + 2 * (size_t)v_heads;
}

/* One value row i of a head's state S (Dk floats): S_i *= g; delta = (v_i - S_i . k) * beta;
 * S_i += k * delta; returns S_i . q. The scalar reference. */
static float row_update(float *row, const float *k, const float *q, int Dk, float g, float v, float beta) {
    float mem = 0.0f, out = 0.0f;
    for (int j = 0; j < Dk; j++) mem += (row[j] *= g) * k[j];
    float delta = (v - mem) * beta;
    for (int j = 0; j < Dk; j++) out += (row[j] += k[j] * delta) * q[j];
    return out;
}

static inline float hsum8(__m256 v) __attribute__((target("avx2,fma")));
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The same, 8 lanes with FMA (Dk a multiple of 8); each row's two passes stay in L1. */
__attribute__((target("avx2,fma"))) static float row_update_avx2(float *row, const float *k, const float *q, int Dk,
                                                                 float g, float v, float beta) {
    __m256 vg = _mm256_set1_ps(g), m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= Dk; j += 16) {
        __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + j), vg), r1 = _mm256_mul_ps(_mm256_loadu_ps(row + j + 8), vg);
        _mm256_storeu_ps(row + j, r0), _mm256_storeu_ps(row + j + 8, r1);
        m0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(k + j), m0), m1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(k + j + 8), m1);
    }
    for (; j < Dk; j += 8) {
        __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + j), vg);
        _mm256_storeu_ps(row + j, r0);
        m0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(k + j), m0);
    }
    __m256 vd = _mm256_set1_ps((v - hsum8(_mm256_add_ps(m0, m1))) * beta), o0 = _mm256_setzero_ps(),
           o1 = _mm256_setzero_ps();
    for (j = 0; j + 16 <= Dk; j += 16) {
        __m256 r0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j), vd, _mm256_loadu_ps(row + j));
        __m256 r1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j + 8), vd, _mm256_loadu_ps(row + j + 8));
        _mm256_storeu_ps(row + j, r0), _mm256_storeu_ps(row + j + 8, r1);
        o0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(q + j), o0), o1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(q + j + 8), o1);
    }
    for (; j < Dk; j += 8) {
        __m256 r0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j), vd, _mm256_loadu_ps(row + j));
        _mm256_storeu_ps(row + j, r0);
        o0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(q + j), o0);
    }
    return hsum8(_mm256_add_ps(o0, o1));
}

/* Value head h over every token of the step in order, each on its sequence's state. */
static void head_task(void *ctx, int h, int thread) {
    (void)thread;
    const ops_gdn_args *a = ctx;
    int Dk = a->k_dim, Dv = a->v_dim, Hv = a->v_heads, hk = a->v_tiled ? h % a->k_heads : h / (Hv / a->k_heads);
    int C = 2 * a->k_heads * Dk + Hv * Dv;
    size_t conv_floats = (size_t)(a->conv_k - 1) * C;
    float A = expf(a->A_log[h]);
    int vec = Dk % 8 == 0 && cpu_level_active() >= CPU_LEVEL_AVX2;
    for (int t = 0; t < a->T; t++) {
        float *S = kv_state_at(a->kv, a->layer, a->slot[t]) + conv_floats + (size_t)h * Dv * Dk;
        const float *x = a->qkv + (size_t)t * C, *q = x + (size_t)hk * Dk, *k = x + (size_t)(a->k_heads + hk) * Dk;
        const float *v = x + (size_t)2 * a->k_heads * Dk + (size_t)h * Dv;
        float g = expf(-A * softplusf(a->a[(size_t)t * Hv + h] + a->dt_bias[h]));
        float beta = sigmoidf(a->b[(size_t)t * Hv + h]);
        if (a->journal && a->journal[t]) a->journal[t][2 * C + h] = g, a->journal[t][2 * C + Hv + h] = beta;
        float *y = a->y + (size_t)t * Hv * Dv + (size_t)h * Dv;
        for (int i = 0; i < Dv; i++)
            y[i] = vec ? row_update_avx2(S + (size_t)i * Dk, k, q, Dk, g, v[i], beta)
                       : row_update(S + (size_t)i * Dk, k, q, Dk, g, v[i], beta);
        /* gated RMSNorm: rmsnorm(y) * norm * silu(z) */
        const float *z = a->z + (size_t)t * Hv * Dv + (size_t)h * Dv;
        float ss = 0.0f;
        for (int i = 0; i < Dv; i++) ss += y[i] * y[i];
        float r = 1.0f / sqrtf(ss / (float)Dv + a->norm_eps);
        for (int i = 0; i < Dv; i++) y[i] = z[i] * sigmoidf(z[i]) * (y[i] * r * a->norm[i]);
    }
}

void ops_gdn_replay(const ops_gdn_args *a, int slot, float *const *entries, int n) {
    int Dk = a->k_dim, Dv = a->v_dim, Hv = a->v_heads, K = a->conv_k, C = 2 * a->k_heads * Dk + Hv * Dv;
    float *rec = kv_state_at(a->kv, a->layer, slot);
    int vec = Dk % 8 == 0 && cpu_level_active() >= CPU_LEVEL_AVX2;
    for (int u = 0; u < n; u++) {
        const float *in = entries[u], *x = in + C, *gb = in + 2 * C;
        for (int c = 0; K > 1 && c < C; c++) { /* the conv's kept inputs move by one, as conv_token moves them */
            for (int k = 0; k + 1 < K - 1; k++) rec[(size_t)k * C + c] = rec[(size_t)(k + 1) * C + c];
            rec[(size_t)(K - 2) * C + c] = in[c];
        }
        for (int h = 0; h < Hv; h++) {
            int hk = a->v_tiled ? h % a->k_heads : h / (Hv / a->k_heads);
            float *S = rec + (size_t)(K - 1) * C + (size_t)h * Dv * Dk;
            const float *q = x + (size_t)hk * Dk, *k = x + (size_t)(a->k_heads + hk) * Dk;
            const float *v = x + (size_t)2 * a->k_heads * Dk + (size_t)h * Dv;
            for (int i = 0; i < Dv; i++)
                (void)(vec ? row_update_avx2(S + (size_t)i * Dk, k, q, Dk, gb[h], v[i], gb[Hv + h])
                           : row_update(S + (size_t)i * Dk, k, q, Dk, gb[h], v[i], gb[Hv + h]));
        }
    }
}

void ops_gated_delta(const ops_gdn_args *a, threadpool *tp) {
    for (int t = 0; t < a->T; t++) conv_token(a, t); /* in order: a sequence's tokens chain through its conv state */
    tp_run(tp, a->v_heads, head_task, (void *)a);
}
