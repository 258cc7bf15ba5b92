/* ops_cpu.c: CPU implementations of the ops in ops.h. Plain float32 loops the compiler
 * vectorises; attention (over float or int8 KV) is split over (token, head) pairs on the
 * thread pool. The arithmetic mirrors mlx's (f32 accumulation, max-subtracted softmax)
 * so the reference tier stays within float rounding of mlx-lm. */
#include "ops/ops.h"
#include "base/cpu_features.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Dot products of attention scores, vectorised by hand: plain C reductions stay scalar
 * under strict IEEE semantics. The summation order differs from a serial loop by float
 * rounding only (the parity tests' reference tier allows 2e-3 on logits). */
static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Two FMA chains of 8 lanes, then a horizontal sum; LOAD8 turns 8 entries of b into floats
 * (float keys as they are, int8 keys widened). One body for both, so their summation
 * orders stay the same. */
#define DEFINE_DOT_AVX2(NAME, BTYPE, LOAD8)                                                        \
    __attribute__((target("avx2,fma"))) static float NAME(const float *a, const BTYPE *b, int n) { \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                            \
        int i = 0;                                                                                 \
        for (; i + 16 <= n; i += 16) {                                                             \
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LOAD8(b + i), acc0);                    \
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LOAD8(b + i + 8), acc1);            \
        }                                                                                          \
        for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LOAD8(b + i), acc0); \
        __m256 acc = _mm256_add_ps(acc0, acc1);                                                    \
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));         \
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                                    \
        h = _mm_add_ss(h, _mm_movehdup_ps(h));                                                     \
        float s = _mm_cvtss_f32(h);                                                                \
        for (; i < n; i++) s += a[i] * (float)b[i];                                                \
        return s;                                                                                  \
    }

__attribute__((target("avx2,fma"))) static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) static inline __m256 load8_q8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

DEFINE_DOT_AVX2(dot_avx2, float, load8_f32)
DEFINE_DOT_AVX2(dot_q8_avx2, int8_t, load8_q8)

/* x[i] = exp(x[i] - mx), returns the sum. Degree-6 polynomial on the reduced range
 * [-ln2/2, ln2/2] times 2^n: relative error ~2e-7, below float32 rounding of the sum. */
__attribute__((target("avx2,fma"))) static float exp_sum_avx2(float *x, int n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    const __m256 c6 = _mm256_set1_ps(1.0f / 720), c5 = _mm256_set1_ps(1.0f / 120), c4 = _mm256_set1_ps(1.0f / 24);
    const __m256 c3 = _mm256_set1_ps(1.0f / 6), c2 = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx), lo);
        __m256 k = _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fnmadd_ps(k, ln2_lo, _mm256_fnmadd_ps(k, ln2_hi, v));
        __m256 p = _mm256_fmadd_ps(c6, r, c5);
        p = _mm256_fmadd_ps(p, r, c4);
        p = _mm256_fmadd_ps(p, r, c3);
        p = _mm256_fmadd_ps(p, r, c2);
        p = _mm256_fmadd_ps(p, r, one);
        p = _mm256_fmadd_ps(p, r, one);
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(x + i, y);
        acc = _mm256_add_ps(acc, y);
    }
    float t[8], sum = 0.0f;
    _mm256_storeu_ps(t, acc);
    for (int j = 0; j < 8; j++) sum += t[j];
    for (; i < n; i++) sum += x[i] = expf(x[i] - mx);
    return sum;
}

static float exp_sum_scalar(float *x, int n, float mx) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i] = expf(x[i] - mx);
    return sum;
}

/* y[i] += w * x[i]: the weighted sum of values (GCC's -O2 vectoriser leaves it scalar). */
__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float w, const float *x, int n) {
    __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * x[i];
}

static void axpy_scalar(float *y, float w, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}

/* int8 KV rows (kv_store's symmetric absmax): the dot product and the weighted sum take
 * the int8 values and apply the row's scale once, outside the loop. The same order of
 * operations for every batch size: a row's result never depends on the step around it. */
static float dot_q8_scalar(const float *a, const int8_t *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * (float)b[i];
    return s;
}

static void axpy_q8_scalar(float *y, float w, const int8_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * (float)x[i];
}

__attribute__((target("avx2,fma"))) static void axpy_q8_avx2(float *y, float w, const int8_t *x, int n) {
    __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, load8_q8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * (float)x[i];
}

/* 16 int8 values per step: one xmm load widened to a zmm of floats. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float dot_q8_avx512(const float *a, const int8_t *b,
                                                                                 int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i),
                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + i)))),
                              acc);
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) s += a[i] * (float)b[i];
    return s;
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void axpy_q8_avx512(float *y, float w, const int8_t *x,
                                                                                int n) {
    __m512 vw = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x + i))));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vw, v, _mm512_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += w * (float)x[i];
}

/* The kernels one attention call uses, chosen once per call from the ISA level. */
typedef struct ops_attention_kernels {
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float *, float, const float *, int);
    float (*dot_q8)(const float *, const int8_t *, int);
    void (*axpy_q8)(float *, float, const int8_t *, int);
    float (*exp_sum)(float *, int, float);
} ops_attention_kernels;

static const ops_attention_kernels kernels_scalar = {dot_scalar, axpy_scalar, dot_q8_scalar, axpy_q8_scalar,
                                                     exp_sum_scalar};
static const ops_attention_kernels kernels_avx2 = {dot_avx2, axpy_avx2, dot_q8_avx2, axpy_q8_avx2, exp_sum_avx2};
static const ops_attention_kernels kernels_avx512 = {dot_avx2, axpy_avx2, dot_q8_avx512, axpy_q8_avx512,
                                                     exp_sum_avx2};

static const ops_attention_kernels *pick_kernels(void) {
    cpu_level level = cpu_level_active();
    return level >= CPU_LEVEL_AVX512 ? &kernels_avx512 : level >= CPU_LEVEL_AVX2 ? &kernels_avx2 : &kernels_scalar;
}

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
    const ops_attention_kernels *k = a->kernels;
    const kv_cache *kv = a->kv;
    int t = task / a->n_heads, h = task % a->n_heads;
    int kvh = h / (a->n_heads / a->n_kv_heads), d = a->head_dim;
    float *scores = a->scratch + (size_t)thread * ops_attention_scratch(kv);
    const float *q = a->q + ((size_t)t * a->n_heads + h) * d;
    float *out = a->out + ((size_t)t * a->n_heads + h) * d;
    int p_end = a->pos[t], p_start = 0, slot = a->slot[t], q8 = kv->quant == HEARTH_KV_INT8;
    if (a->window > 0 && p_end - a->window + 1 > 0) p_start = p_end - a->window + 1;
    float mx = -INFINITY;
    for (int p = p_start; p <= p_end; p++) {
        size_t row = kv_row(kv, a->layer, slot, p, kvh), off = row * (size_t)d;
        float s = q8 ? k->dot_q8(q, kv->k8 + off, d) * kv->k_scale[row] : k->dot(q, kv->k + off, d);
        s *= a->scale;
        scores[p - p_start] = s;
        if (s > mx) mx = s;
    }
    float sum = k->exp_sum(scores, p_end - p_start + 1, mx);
    memset(out, 0, (size_t)d * sizeof *out);
    float inv = 1.0f / sum;
    for (int p = p_start; p <= p_end; p++) {
        size_t row = kv_row(kv, a->layer, slot, p, kvh), off = row * (size_t)d;
        float w = scores[p - p_start] * inv;
        if (q8) k->axpy_q8(out, w * kv->v_scale[row], kv->v8 + off, d);
        else k->axpy(out, w, kv->v + off, d);
    }
}

void ops_attention(const ops_attention_args *a, threadpool *tp) {
    ops_attention_args args = *a;
    args.kernels = pick_kernels();
    tp_run(tp, a->T * a->n_heads, attention_task, &args);
}
