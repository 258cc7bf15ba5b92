/* cpu_ops.c: the CPU kernels of cpu_ops.h. Plain float32 loops the compiler
 * vectorises; attention (over float or int8 KV) is split over (token, head) pairs on the
 * thread pool, or for prefill on AVX2 over tiles of tokens x the query heads of one KV
 * head. The arithmetic mirrors mlx's (f32 accumulation, max-subtracted softmax) so the
 * reference tier stays within float rounding of mlx-lm. */
#include "backend/cpu/cpu_ops.h"
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
        if (!w)
            for (int i = 0; i < n; i++) o[i] = xr[i] * inv;
        else
            for (int i = 0; i < n; i++) o[i] = xr[i] * inv * (w[i] + shift);
    }
}

void ops_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq, int adjacent) {
    ops_rope_part(x, T, n_heads, head_dim, head_dim, pos, inv_freq, adjacent);
}

void ops_rope_part(float *x, int T, int n_heads, int head_dim, int rot_dims, const int32_t *pos, const float *inv_freq,
                   int adjacent) {
    int half = rot_dims / 2;
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

/* exp(v) for 8 lanes, v clamped to [-87, 88] (finite, normal results): the range reduction
 * and degree-6 polynomial of exp_sum_avx2, relative error ~2e-7. */
__attribute__((target("avx2,fma"))) static inline __m256 exp8_avx2(__m256 v) {
    const __m256 log2e = _mm256_set1_ps(1.44269504f), ln2_hi = _mm256_set1_ps(0.693359375f);
    const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f), one = _mm256_set1_ps(1.0f);
    v = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, ln2_lo, _mm256_fnmadd_ps(k, ln2_hi, v));
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 720), r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* gate = act(gate) * up, 8 lanes at a time: silu(g) = g / (1 + exp(-g)); the tanh GELU
 * 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3). The
 * prefill of a 270M model spent as long in scalar tanhf as in all its matmuls. */
__attribute__((target("avx2,fma"))) static size_t act_mul_avx2(float *gate, const float *up, size_t n, int gelu) {
    const __m256 one = _mm256_set1_ps(1.0f), k2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f);
    const __m256 c = _mm256_set1_ps(0.044715f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), z;
        if (gelu) z = _mm256_mul_ps(k2, _mm256_fmadd_ps(_mm256_mul_ps(c, g), _mm256_mul_ps(g, g), g)); /* -2u */
        else z = _mm256_sub_ps(_mm256_setzero_ps(), g);
        __m256 a = _mm256_div_ps(g, _mm256_add_ps(one, exp8_avx2(z)));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
    }
    return i;
}

void ops_silu_mul(float *gate, const float *up, size_t n) {
    size_t i = cpu_level_active() >= CPU_LEVEL_AVX2 ? act_mul_avx2(gate, up, n, 0) : 0;
    for (; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void ops_gelu_tanh_mul(float *gate, const float *up, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    size_t i = cpu_level_active() >= CPU_LEVEL_AVX2 ? act_mul_avx2(gate, up, n, 1) : 0;
    for (; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}

/* x = cap tanh(x / cap), 8 lanes at a time: tanh(y) = 1 - 2 / (1 + exp(2y)) with the
 * same exp polynomial (absolute error a few float ulps of 1, so ~1e-6 of cap). A 262k-entry
 * vocabulary's logits through libm's tanhf (262,144 calls a token) were 2.7% of a CPU decode. */
__attribute__((target("avx2,fma"))) static size_t softcap_avx2(float *x, size_t n, float cap) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), c = _mm256_set1_ps(cap),
                 k = _mm256_set1_ps(2.0f / cap);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8_avx2(_mm256_mul_ps(k, _mm256_loadu_ps(x + i)));
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(t, c));
    }
    return i;
}

void ops_softcap(float *x, size_t n, float cap) {
    size_t i = cpu_level_active() >= CPU_LEVEL_AVX2 ? softcap_avx2(x, n, cap) : 0;
    for (; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
}

/* The largest of x[0..n) ignoring NaN (x[0] not NaN), 8 lanes at a time: vmaxps returns its
 * second operand when the first is NaN. */
__attribute__((target("avx2"))) static float max_avx2(const float *x, int n, int *done) {
    __m256 m = _mm256_set1_ps(x[0]);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    *done = i;
    return _mm_cvtss_f32(h);
}

/* The first i < n with x[i] == m, 8 lanes at a time (n if none). */
__attribute__((target("avx2"))) static int find_avx2(const float *x, int n, float m) {
    __m256 v = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), v, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return n;
}

int ops_argmax(const float *x, int n) {
    if (n <= 1 || x[0] != x[0]) return 0; /* a NaN first: nothing compares above it */
    int i = 0, avx2 = cpu_level_active() >= CPU_LEVEL_AVX2;
    float m = x[0];
    if (avx2) m = max_avx2(x, n, &i);
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    if (avx2) return find_avx2(x, n, m);
    for (i = 0; i < n; i++)
        if (x[i] == m) break;
    return i;
}

/* Whether any of the 8-lane blocks of x[0..*done) holds an all-ones exponent (Inf or NaN);
 * *done: the values checked. */
__attribute__((target("avx2"))) static int nonfinite_avx2(const float *x, size_t n, size_t *done) {
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    __m256i hit = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), exponent);
        hit = _mm256_or_si256(hit, _mm256_cmpeq_epi32(e, exponent));
    }
    *done = i;
    return !_mm256_testz_si256(hit, hit);
}

int ops_all_finite(const float *x, size_t n) {
    size_t i = 0;
    if (cpu_level_active() >= CPU_LEVEL_AVX2 && nonfinite_avx2(x, n, &i)) return 0;
    for (; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

void ops_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void ops_scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* Query rows per prefill tile (attention_tile_f32_avx2), and the scores a thread buffers
 * for one: 16 rows of 2048 positions (128 KiB). A tile whose rows see more positions than
 * that is cut into tiles of fewer rows; one row always fits (a slot's whole context). */
enum { ATT_TILE_ROWS = 16, ATT_TILE_SCORES = ATT_TILE_ROWS * 2048 };

size_t ops_attention_scratch(const kv_cache *kv) {
    size_t context = (size_t)kv->max_blocks_per_slot * KV_BLOCK_SIZE;
    return (context > ATT_TILE_SCORES ? context : ATT_TILE_SCORES) + (size_t)kv->head_dim;
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

/* Float KV, AVX-512, head_dim a multiple of 16 (<= 512): the 16 positions of a KV block
 * are contiguous rows, so up to 16 scores come from 16 FMA chains reduced together (one
 * transposing reduction instead of a horizontal sum per key), and the weighted sum of
 * values keeps 128 output floats in registers over all positions instead of loading and
 * storing the output row once per position. Same two-pass softmax as attention_task.
 * One task per (token, KV head) takes every query head that shares the KV head (grouped-
 * query attention), block by block of keys and chunk by chunk of values, so each key and
 * value row comes from memory once for the group, not once per query head: SmolLM2-135M
 * (3 query heads per KV head) decode at a 512-token context spent ~2.8 ms per token more
 * than at 16 tokens with one task per head, re-reading float32 K/V from DRAM. Each head's
 * arithmetic is the per-head kernel's, in the same order: the same bits, for rows of up to
 * ATT_SPLIT positions; longer rows are computed in splits merged in order (below), which
 * differs from the one-pass kernels by float rounding (test_cpu_ops_kernels: within the same
 * bound of a double-precision softmax). */
#define ATT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx2")))
_Static_assert(KV_BLOCK_SIZE == 16, "attention_group_f32_avx512 reduces one 16-position KV block per step");
/* Query heads of one group processed together (more share a KV head only in models that
 * have few KV heads, e.g. 14:2; they run as several passes over the keys). */
enum { ATT_GROUP_MAX = 8 };

/* Lane p of the result = sum of the 16 lanes of v[p]. */
ATT_AVX512 static inline __m512 att_reduce16(__m512 v[16]) {
    __m512 w[8], x[4], y[2];
    #pragma GCC unroll 8
    for (int p = 0; p < 8; p++) /* lanes 0-7: key p (8 partials), 8-15: key p + 8 */
        w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[p], v[p + 8], 0x44), _mm512_shuffle_f32x4(v[p], v[p + 8], 0xEE));
    #pragma GCC unroll 4
    for (int p = 0; p < 4; p++) /* quarters: keys p, p + 8, p + 4, p + 12 (4 partials each) */
        x[p] = _mm512_add_ps(_mm512_shuffle_f32x4(w[p], w[p + 4], 0x88), _mm512_shuffle_f32x4(w[p], w[p + 4], 0xDD));
    #pragma GCC unroll 2
    for (int p = 0; p < 2; p++) /* per quarter: 2 partials of x[p]'s key, then 2 of x[p + 2]'s */
        y[p] = _mm512_add_ps(_mm512_shuffle_ps(x[p], x[p + 2], 0x44), _mm512_shuffle_ps(x[p], x[p + 2], 0xEE));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
    /* lane L now holds key perm[L] (an involution, so it is also its own inverse) */
    const __m512i perm = _mm512_set_epi32(15, 13, 14, 12, 7, 5, 6, 4, 11, 9, 10, 8, 3, 1, 2, 0);
    return _mm512_permutexvar_ps(perm, z);
}

/* For NG heads g of a pass (scores of head g at scores + g * len, its output row at out +
 * g * d): out_g[i0 .. i0 + 16 NV) (+)= sum over positions p_first..p_last of
 * scores_g[p - p_start] * inv[g] * value, NG x NV zmm accumulators (always_inline: constant
 * NG and NV keep them in registers). Each value row is loaded once for the NG heads.
 * accumulate: start from out's values (the previous chunk of positions); the FMAs of one
 * output float run in position order either way. */
__attribute__((target("avx512f,avx512bw,avx512vl,fma,avx2"), always_inline)) static inline void
att_values_avx512(const ops_attention_args *a, int slot, int kvh, int p_start, int p_first, int p_last,
                  const float *scores, size_t len, const float *inv, int i0, float *out, const int NV, const int NG,
                  int accumulate) {
    const kv_cache *kv = a->kv;
    const int d = a->head_dim;
    __m512 o[24];
    #pragma GCC unroll 24
    for (int i = 0; i < 24; i++) o[i] = _mm512_setzero_ps(); /* (a non-constant NV: all of them) */
    #pragma GCC unroll 6
    for (int g = 0; g < NG && accumulate; g++)
        #pragma GCC unroll 8
        for (int j = 0; j < NV; j++) o[g * NV + j] = _mm512_loadu_ps(out + (size_t)g * d + i0 + 16 * j);
    for (int p = p_first; p <= p_last;) { /* runs of positions inside one KV block: rows d apart */
        int run_end = (p / KV_BLOCK_SIZE + 1) * KV_BLOCK_SIZE - 1;
        if (run_end > p_last) run_end = p_last;
        const float *vrow = kv->v + (kv_key(kv, a->layer, slot, p, kvh) - kv->k) + i0;
        for (; p <= run_end; p++, vrow += d) {
            __m512 v[8];
            #pragma GCC unroll 8
            for (int j = 0; j < NV; j++) v[j] = _mm512_loadu_ps(vrow + 16 * j);
            #pragma GCC unroll 6
            for (int g = 0; g < NG; g++) {
                __m512 w = _mm512_set1_ps(scores[g * len + (size_t)(p - p_start)] * inv[g]);
                #pragma GCC unroll 8
                for (int j = 0; j < NV; j++) o[g * NV + j] = _mm512_fmadd_ps(w, v[j], o[g * NV + j]);
            }
        }
    }
    #pragma GCC unroll 6
    for (int g = 0; g < NG; g++)
        #pragma GCC unroll 8
        for (int j = 0; j < NV; j++) _mm512_storeu_ps(out + (size_t)g * d + i0 + 16 * j, o[g * NV + j]);
}

/* att_values_avx512 for ng heads of a pass, in register groups of at most 24 accumulators. */
ATT_AVX512 static void att_values_heads_avx512(const ops_attention_args *a, int slot, int kvh, int p_start,
                                               int p_first, int p_last, const float *scores, size_t len,
                                               const float *inv, float *out, int ng, int accumulate) {
    const int d = a->head_dim;
#define ATT_V(NV, NG)                                                                                                \
    att_values_avx512(a, slot, kvh, p_start, p_first, p_last, scores + g * len, len, inv + g, i0, out + (size_t)g * d, \
                      NV, NG, accumulate)
    for (int i0 = 0; i0 < d; i0 += 128) { /* 128 output floats per head at a time */
        int nv = d - i0 < 128 ? (d - i0) / 16 : 8, per = nv == 8 ? 3 : nv == 4 ? 6 : 1;
        for (int g = 0; g < ng; g += per) {
            int k = ng - g < per ? ng - g : per;
            if (nv == 8) {
                if (k == 3) ATT_V(8, 3);
                else if (k == 2) ATT_V(8, 2);
                else ATT_V(8, 1);
            } else if (nv == 4) {
                switch (k) {
                case 6: ATT_V(4, 6); break;
                case 5: ATT_V(4, 5); break;
                case 4: ATT_V(4, 4); break;
                case 3: ATT_V(4, 3); break;
                case 2: ATT_V(4, 2); break;
                default: ATT_V(4, 1); break;
                }
            } else {
                ATT_V(nv, 1);
            }
        }
    }
#undef ATT_V
}

/* scores of one head over one run of a KV block's positions (krow: the block's row 0). */
ATT_AVX512 static inline __m512 att_block_scores_avx512(const float *q, const float *krow, int d, int first, int n,
                                                        __m512 vscale, float *scores, __m512 vmx) {
    __m512 acc[16];
    #pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < d; i += 16) {
        __m512 qv = _mm512_loadu_ps(q + i);
        #pragma GCC unroll 16
        for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(krow + (size_t)r * d + i), acc[r]);
    }
    __mmask16 m = (__mmask16)(((1u << n) - 1) << first);
    __m512 s = _mm512_mul_ps(att_reduce16(acc), vscale);
    _mm512_mask_storeu_ps(scores, (__mmask16)((1u << n) - 1), _mm512_maskz_compress_ps(m, s));
    return _mm512_mask_max_ps(vmx, m, vmx, s);
}

/* Scores of ng query heads (q, rows d apart) over positions [p_lo, p_hi] of (slot, kvh), KV
 * block by block, at scores + g * stride + (p - p_lo); vmx[g] gathers each head's maximum. */
ATT_AVX512 static void att_range_scores(const ops_attention_args *a, const float *q, int ng, int slot, int kvh, int p_lo,
                                        int p_hi, float *scores, size_t stride, __m512 *vmx) {
    const int d = a->head_dim;
    const __m512 vscale = _mm512_set1_ps(a->scale);
    for (int p = p_lo; p <= p_hi;) { /* runs of positions inside one KV block */
        int run_end = (p / KV_BLOCK_SIZE + 1) * KV_BLOCK_SIZE - 1;
        if (run_end > p_hi) run_end = p_hi;
        int first = p % KV_BLOCK_SIZE, n = run_end - p + 1;
        /* all 16 rows of the block (always allocated); lanes outside first..first+n-1 are
         * never stored nor compared */
        const float *krow = kv_key(a->kv, a->layer, slot, p, kvh) - (size_t)first * d;
        for (int g = 0; g < ng; g++)
            vmx[g] = att_block_scores_avx512(q + (size_t)g * d, krow, d, first, n, vscale, scores + g * stride + (p - p_lo),
                                             vmx[g]);
        p = run_end + 1;
    }
}

/* Positions per pass of the weighted sum of values: rows that stay in L1 (16 KiB) while
 * every head of the pass reads them, at least one KV block. */
static int att_value_chunk(int d) {
    int c = 16384 / (d * (int)sizeof(float));
    return c < KV_BLOCK_SIZE ? KV_BLOCK_SIZE : c;
}

/* Rows longer than ATT_SPLIT positions are computed in splits: the fewest doublings of
 * ATT_SPLIT positions that make at most ATT_SPLITS_MAX of them. Each split softmaxes its own
 * positions (its max m_s, sum l_s and unnormalized weighted values o_s), and the splits merge
 * in order: out = sum_s (e^(m_s - M) / L) o_s with M = max m_s, L = sum_s e^(m_s - M) l_s.
 * The splits depend on the row's length only, so a row's bits are the same whatever the
 * batch, the thread count, and whether one task computes every split (prefill, many rows)
 * or each split is its own task (decode with few KV heads: SmolLM2's 3 on 2 threads left
 * one thread with two of them; attention_split_f32_avx512). Rows of up to ATT_SPLIT
 * positions take the one-pass code as before. The split size (256 beat 128 and 64) and the
 * gain are measured in bench/results/kernel_choices.md ("CPU decode attention in splits"). */
enum { ATT_SPLIT = 256, ATT_SPLITS_MAX = 8 };

static int att_split_positions(int len) {
    int c = ATT_SPLIT;
    while ((len + c - 1) / c > ATT_SPLITS_MAX) c *= 2;
    return c;
}

/* Floats of one unit's (token, KV head) partials: per split, group rows of o then group (m, l). */
static size_t att_partial_floats(int nsplit, int group, int d) { return (size_t)nsplit * group * (d + 2); }

/* Splits of a row of len positions (1: the one-pass code): also 1 where a thread's scratch
 * could not hold the partials beside one split's scores (very wide groups). */
static int att_nsplit(const ops_attention_args *a, size_t len) {
    if (len <= ATT_SPLIT) return 1;
    int split = att_split_positions((int)len), nsplit = (int)((len + split - 1) / split);
    size_t cap = ops_attention_scratch(a->kv) - (size_t)a->head_dim;
    return att_partial_floats(nsplit, a->n_heads / a->n_kv_heads, a->head_dim) + (size_t)split > cap ? 1 : nsplit;
}

/* The first position row t attends to (its window's start), and how many it attends to. */
static int att_row_start(const ops_attention_args *a, int t) {
    int p_end = a->pos[t];
    return a->window > 0 && p_end - a->window + 1 > 0 ? p_end - a->window + 1 : 0;
}

static size_t att_row_len(const ops_attention_args *a, int t) { return (size_t)(a->pos[t] - att_row_start(a, t) + 1); }

/* The partials of split s of row (t, kvh) for query heads [h_lo, h_hi) of the group, in
 * passes of as many heads as `cap` floats of scores (this thread's) hold. part: the unit's
 * partials (att_partial_floats). */
ATT_AVX512 static void att_split_partials(const ops_attention_args *a, int t, int kvh, int h_lo, int h_hi, int s,
                                          int split, float *scores, size_t cap, float *part) {
    int group = a->n_heads / a->n_kv_heads, d = a->head_dim;
    int p_end = a->pos[t], p_start = att_row_start(a, t), slot = a->slot[t];
    int p_lo = p_start + s * split, p_hi = p_lo + split - 1 < p_end ? p_lo + split - 1 : p_end;
    size_t n = (size_t)(p_hi - p_lo + 1);
    int per_pass = cap / n < ATT_GROUP_MAX ? (int)(cap / n) : ATT_GROUP_MAX;
    int vchunk = att_value_chunk(d);
    float *o = part + (size_t)s * group * (d + 2), *ml = o + (size_t)group * d;
    for (int g0 = h_lo; g0 < h_hi; g0 += per_pass) {
        int ng = h_hi - g0 < per_pass ? h_hi - g0 : per_pass;
        const float *q = a->q + ((size_t)t * a->n_heads + kvh * group + g0) * d;
        __m512 vmx[ATT_GROUP_MAX];
        float one[ATT_GROUP_MAX];
        for (int g = 0; g < ng; g++) vmx[g] = _mm512_set1_ps(-INFINITY), one[g] = 1.0f;
        att_range_scores(a, q, ng, slot, kvh, p_lo, p_hi, scores, n, vmx);
        for (int g = 0; g < ng; g++) {
            float m = _mm512_reduce_max_ps(vmx[g]);
            ml[2 * (g0 + g)] = m;
            ml[2 * (g0 + g) + 1] = exp_sum_avx2(scores + g * n, (int)n, m);
        }
        for (int p0 = p_lo; p0 <= p_hi; p0 += vchunk) {
            int p1 = p0 + vchunk - 1 < p_hi ? p0 + vchunk - 1 : p_hi;
            att_values_heads_avx512(a, slot, kvh, p_lo, p0, p1, scores, n, one, o + (size_t)g0 * d, ng, p0 > p_lo);
        }
    }
}

/* out of row (t, kvh)'s heads [h_lo, h_hi) from its nsplit partials, in split order. */
ATT_AVX512 static void att_split_merge(const ops_attention_args *a, int t, int kvh, int h_lo, int h_hi, int nsplit,
                                       const float *part) {
    int group = a->n_heads / a->n_kv_heads, d = a->head_dim;
    size_t stride = (size_t)group * (d + 2);
    for (int g = h_lo; g < h_hi; g++) {
        float mx = -INFINITY, w[ATT_SPLITS_MAX], sum = 0.0f, coef[ATT_SPLITS_MAX];
        for (int s = 0; s < nsplit; s++) {
            float m = part[s * stride + (size_t)group * d + 2 * g];
            mx = m > mx ? m : mx;
        }
        for (int s = 0; s < nsplit; s++) {
            const float *ml = part + s * stride + (size_t)group * d + 2 * g;
            w[s] = expf(ml[0] - mx);
            sum += w[s] * ml[1];
        }
        for (int s = 0; s < nsplit; s++) coef[s] = w[s] / sum;
        float *out = a->out + ((size_t)t * a->n_heads + kvh * group + g) * d;
        for (int i = 0; i < d; i += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (int s = 0; s < nsplit; s++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(coef[s]), _mm512_loadu_ps(part + s * stride + (size_t)g * d + i), acc);
            _mm512_storeu_ps(out + i, acc);
        }
    }
}

/* Row t's query heads [h_first, h_end) of KV head kvh, with `cap` floats of this thread's
 * scratch (at `scratch`) for scores and, for a row in splits, the partials above them. */
ATT_AVX512 static void att_group_row(const ops_attention_args *a, int t, int kvh, int h_first, int h_end, float *scratch,
                                     size_t cap) {
    int group = a->n_heads / a->n_kv_heads, d = a->head_dim;
    int p_end = a->pos[t], p_start = att_row_start(a, t), slot = a->slot[t];
    size_t len = (size_t)(p_end - p_start + 1);
    int nsplit = att_nsplit(a, len);
    if (nsplit > 1) { /* in splits, every one by this task: partials at the top of its scratch */
        int split = att_split_positions((int)len);
        size_t pf = att_partial_floats(nsplit, group, d);
        float *part = scratch + cap - pf;
        for (int s = 0; s < nsplit; s++) att_split_partials(a, t, kvh, h_first, h_end, s, split, scratch, cap - pf, part);
        att_split_merge(a, t, kvh, h_first, h_end, nsplit, part);
        return;
    }
    int per_pass = cap / len < ATT_GROUP_MAX ? (int)(cap / len) : ATT_GROUP_MAX; /* >= 1: a context fits */
    int chunk = att_value_chunk(d);
    for (int g0 = h_first; g0 < h_end; g0 += per_pass) {
        int ng = h_end - g0 < per_pass ? h_end - g0 : per_pass, h0 = kvh * group + g0;
        const float *q = a->q + ((size_t)t * a->n_heads + h0) * d;
        float *out = a->out + ((size_t)t * a->n_heads + h0) * d;
        __m512 vmx[ATT_GROUP_MAX];
        float inv[ATT_GROUP_MAX];
        for (int g = 0; g < ng; g++) vmx[g] = _mm512_set1_ps(-INFINITY);
        att_range_scores(a, q, ng, slot, kvh, p_start, p_end, scratch, len, vmx);
        for (int g = 0; g < ng; g++)
            inv[g] = 1.0f / exp_sum_avx2(scratch + g * len, (int)len, _mm512_reduce_max_ps(vmx[g]));
        for (int p0 = p_start; p0 <= p_end; p0 += chunk) {
            int p1 = p0 + chunk - 1 < p_end ? p0 + chunk - 1 : p_end;
            att_values_heads_avx512(a, slot, kvh, p_start, p0, p1, scratch, len, inv, out, ng, p0 > p_start);
        }
    }
}

ATT_AVX512 static void attention_group_f32_avx512(void *ctx, int task, int thread) {
    const ops_attention_args *a = ctx;
    int group = a->n_heads / a->n_kv_heads, parts = (group + a->heads_per_task - 1) / a->heads_per_task;
    int t = task / (a->n_kv_heads * parts), kvh = task / parts % a->n_kv_heads, part = task % parts;
    int h_first = part * a->heads_per_task, h_end = h_first + a->heads_per_task < group ? h_first + a->heads_per_task : group;
    att_group_row(a, t, kvh, h_first, h_end, a->scratch + (size_t)thread * ops_attention_scratch(a->kv),
                  ops_attention_scratch(a->kv) - (size_t)a->head_dim);
}

/* Few rows (decode): one task per (token, KV head, split), ATT_SPLITS_MAX tasks per row
 * (those past its splits return at once). Each writes its split's partials into the shared
 * area (split_part, at the top of thread 0's scratch, set by ops_attention) and counts its
 * arrival (ops_attention zeroes the counts before each call: the area holds other calls'
 * scores in between); the row's last split to arrive merges, in split order.
 * Rows of one split run whole in their task 0. Same bits as attention_group_f32_avx512. */
ATT_AVX512 static void attention_split_f32_avx512(void *ctx, int task, int thread) {
    const ops_attention_args *a = ctx;
    int group = a->n_heads / a->n_kv_heads, d = a->head_dim;
    int u = task / ATT_SPLITS_MAX, s = task % ATT_SPLITS_MAX, t = u / a->n_kv_heads, kvh = u % a->n_kv_heads;
    float *scratch = a->scratch + (size_t)thread * ops_attention_scratch(a->kv);
    size_t len = att_row_len(a, t);
    int nsplit = att_nsplit(a, len);
    if (s >= nsplit) return;
    if (nsplit == 1) {
        att_group_row(a, t, kvh, 0, group, scratch, a->split_cap);
        return;
    }
    float *part = a->split_part + (size_t)u * att_partial_floats(ATT_SPLITS_MAX, group, d);
    att_split_partials(a, t, kvh, 0, group, s, att_split_positions((int)len), scratch, a->split_cap, part);
    if (__atomic_add_fetch(&a->split_count[u], 1, __ATOMIC_ACQ_REL) == nsplit) att_split_merge(a, t, kvh, 0, group, nsplit, part);
}

/* Float KV, AVX2, head_dim a multiple of 8: the AVX-512 scheme above on 256-bit
 * registers: 8 keys' scores from 8 FMA chains reduced together, and the weighted sum of
 * values keeps 64 output floats in registers over a run of positions. Per key and per
 * output float it replaces a call, a horizontal sum and a load/store of the output row.
 * Two task shapes share these helpers: one (token, head) per task (decode), and a tile of
 * query rows that share a KV head (prefill, attention_tile_f32_avx2 below). */
#define ATT_AVX2 __attribute__((target("avx2,fma")))

/* Lane r of the result = sum of the 8 lanes of v[r]. */
ATT_AVX2 static inline __m256 att_reduce8(const __m256 v[8]) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* [keys 0-3 | 0-3], [4-7 | 4-7] halves */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* s16[first .. first + n) = scale * q . key for the rows of one KV block (krow: its row 0),
 * computed in the 8-key halves that hold them (all 16 rows are allocated; scores of rows
 * outside the run are computed and left unused). */
ATT_AVX2 static inline void att_block_scores_avx2(const float *q, const float *krow, int d, int first, int n,
                                                  float scale, float s16[KV_BLOCK_SIZE]) {
    for (int r0 = first / 8 * 8; r0 < first + n; r0 += 8) {
        __m256 acc[8];
        #pragma GCC unroll 8
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            #pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krow + (size_t)(r0 + r) * d + i), acc[r]);
        }
        _mm256_storeu_ps(s16 + r0, _mm256_mul_ps(att_reduce8(acc), _mm256_set1_ps(scale)));
    }
}

/* out[i0 .. i0 + 8 NV) (+)= sum over positions p_first..p_last of w[p - p_first] * inv *
 * value, NV <= 8 accumulators in registers. accumulate: start from out's values (a tile's
 * row, one KV block at a time) instead of zero; the FMAs of one output float run in
 * position order either way, so a row split over blocks gets the same bits as one pass. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
att_values_avx2(const ops_attention_args *a, int slot, int kvh, int p_first, int p_last, const float *w, float inv,
                int i0, float *out, const int NV, int accumulate) {
    const kv_cache *kv = a->kv;
    __m256 o[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) o[j] = accumulate && j < NV ? _mm256_loadu_ps(out + i0 + 8 * j) : _mm256_setzero_ps();
    for (int p = p_first; p <= p_last; p++) {
        const float *vrow = kv->v + (kv_key(kv, a->layer, slot, p, kvh) - kv->k) + i0;
        if (p + KV_BLOCK_SIZE <= p_last) { /* the same row of the next block */
            const float *nk = kv_key(kv, a->layer, slot, p + KV_BLOCK_SIZE, kvh);
            const char *next = (const char *)(kv->v + (nk - kv->k) + i0);
            for (int off = 0; off < NV * 32; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
        }
        __m256 wv = _mm256_set1_ps(w[p - p_first] * inv);
        #pragma GCC unroll 8
        for (int j = 0; j < NV; j++) o[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(vrow + 8 * j), o[j]);
    }
    #pragma GCC unroll 8
    for (int j = 0; j < NV; j++) _mm256_storeu_ps(out + i0 + 8 * j, o[j]);
}

/* The whole output row, 64 floats in registers at a time. */
ATT_AVX2 static void att_row_values_avx2(const ops_attention_args *a, int slot, int kvh, int p_first, int p_last,
                                         const float *w, float inv, float *out, int accumulate) {
    for (int i0 = 0; i0 < a->head_dim; i0 += 64) {
        int nv = a->head_dim - i0 < 64 ? (a->head_dim - i0) / 8 : 8;
        if (nv == 8)
            att_values_avx2(a, slot, kvh, p_first, p_last, w, inv, i0, out, 8, accumulate);
        else if (nv == 4)
            att_values_avx2(a, slot, kvh, p_first, p_last, w, inv, i0, out, 4, accumulate);
        else
            att_values_avx2(a, slot, kvh, p_first, p_last, w, inv, i0, out, nv, accumulate);
    }
}

/* Lanes r < 4 of the result = sum of the 8 lanes of v[r]: att_reduce8's tree for 4 keys. */
ATT_AVX2 static inline __m128 att_reduce4(const __m256 v[4]) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* att_block_scores_avx2 for two query rows at once, in 4-key quarters of the block: each
 * key load feeds both rows (6 loads per 8 FMAs instead of 9). Every score is the same
 * FMA chain and reduction tree as there, so the same bits. */
ATT_AVX2 static inline void att_block_scores2_avx2(const float *qa, const float *qb, const float *krow, int d,
                                                   int first, int n, float scale, float sa[KV_BLOCK_SIZE],
                                                   float sb[KV_BLOCK_SIZE]) {
    for (int r0 = first / 4 * 4; r0 < first + n; r0 += 4) {
        __m256 acc_a[4], acc_b[4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc_a[r] = acc_b[r] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            __m256 qva = _mm256_loadu_ps(qa + i), qvb = _mm256_loadu_ps(qb + i);
            #pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m256 k = _mm256_loadu_ps(krow + (size_t)(r0 + r) * d + i);
                acc_a[r] = _mm256_fmadd_ps(qva, k, acc_a[r]);
                acc_b[r] = _mm256_fmadd_ps(qvb, k, acc_b[r]);
            }
        }
        _mm_storeu_ps(sa + r0, _mm_mul_ps(att_reduce4(acc_a), _mm_set1_ps(scale)));
        _mm_storeu_ps(sb + r0, _mm_mul_ps(att_reduce4(acc_b), _mm_set1_ps(scale)));
    }
}

/* att_values_avx2 (accumulating) for two rows over the same positions: each value load
 * feeds both rows' accumulators, 4 x 8 floats per row (NV <= 4). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
att_values2_avx2(const ops_attention_args *a, int slot, int kvh, int p_first, int p_last, const float *wa, float inva,
                 const float *wb, float invb, int i0, float *outa, float *outb, const int NV) {
    const kv_cache *kv = a->kv;
    __m256 oa[4], ob[4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        oa[j] = j < NV ? _mm256_loadu_ps(outa + i0 + 8 * j) : _mm256_setzero_ps();
        ob[j] = j < NV ? _mm256_loadu_ps(outb + i0 + 8 * j) : _mm256_setzero_ps();
    }
    const float *vrow = kv->v + (kv_key(kv, a->layer, slot, p_first, kvh) - kv->k) + i0;
    for (int p = p_first; p <= p_last; p++, vrow += a->head_dim) { /* rows of one block */
        __m256 wva = _mm256_set1_ps(wa[p - p_first] * inva), wvb = _mm256_set1_ps(wb[p - p_first] * invb);
        #pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            __m256 v = _mm256_loadu_ps(vrow + 8 * j);
            oa[j] = _mm256_fmadd_ps(wva, v, oa[j]);
            ob[j] = _mm256_fmadd_ps(wvb, v, ob[j]);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < NV; j++) _mm256_storeu_ps(outa + i0 + 8 * j, oa[j]), _mm256_storeu_ps(outb + i0 + 8 * j, ob[j]);
}

/* Positions p_first..p_last inside one KV block, for two rows. */
ATT_AVX2 static void att_rows2_values_avx2(const ops_attention_args *a, int slot, int kvh, int p_first, int p_last,
                                           const float *wa, float inva, const float *wb, float invb, float *outa,
                                           float *outb) {
    for (int i0 = 0; i0 < a->head_dim; i0 += 32) {
        int nv = a->head_dim - i0 < 32 ? (a->head_dim - i0) / 8 : 4;
        if (nv == 4)
            att_values2_avx2(a, slot, kvh, p_first, p_last, wa, inva, wb, invb, i0, outa, outb, 4);
        else
            att_values2_avx2(a, slot, kvh, p_first, p_last, wa, inva, wb, invb, i0, outa, outb, nv);
    }
}

/* Prefetches the keys of the KV block holding position p. */
static inline void att_prefetch_block(const kv_cache *kv, int layer, int slot, int p, int kvh) {
    const char *next = (const char *)kv_key(kv, layer, slot, p / KV_BLOCK_SIZE * KV_BLOCK_SIZE, kvh);
    for (int off = 0; off < KV_BLOCK_SIZE * kv->head_dim * (int)sizeof(float); off += 64)
        _mm_prefetch(next + off, _MM_HINT_T0);
}

ATT_AVX2 static void attention_task_f32_avx2(void *ctx, int task, int thread) {
    const ops_attention_args *a = ctx;
    const kv_cache *kv = a->kv;
    int t = task / a->n_heads, h = task % a->n_heads;
    int kvh = h / (a->n_heads / a->n_kv_heads), d = a->head_dim;
    float *scores = a->scratch + (size_t)thread * ops_attention_scratch(kv);
    const float *q = a->q + ((size_t)t * a->n_heads + h) * d;
    float *out = a->out + ((size_t)t * a->n_heads + h) * d;
    int p_end = a->pos[t], p_start = 0, slot = a->slot[t];
    if (a->window > 0 && p_end - a->window + 1 > 0) p_start = p_end - a->window + 1;
    float mx = -INFINITY;
    for (int p = p_start; p <= p_end;) { /* runs of positions inside one KV block */
        int run_end = (p / KV_BLOCK_SIZE + 1) * KV_BLOCK_SIZE - 1;
        if (run_end > p_end) run_end = p_end;
        int first = p % KV_BLOCK_SIZE, n = run_end - p + 1;
        const float *krow = kv_key(kv, a->layer, slot, p, kvh) - (size_t)first * d;
        /* the next block is elsewhere in the pool: fetch its keys now */
        if (run_end < p_end) att_prefetch_block(kv, a->layer, slot, run_end + 1, kvh);
        float s16[KV_BLOCK_SIZE];
        att_block_scores_avx2(q, krow, d, first, n, a->scale, s16);
        for (int j = 0; j < n; j++) {
            float s = s16[first + j];
            scores[p - p_start + j] = s;
            if (s > mx) mx = s;
        }
        p = run_end + 1;
    }
    float sum = exp_sum_avx2(scores, p_end - p_start + 1, mx), inv = 1.0f / sum;
    att_row_values_avx2(a, slot, kvh, p_start, p_end, scores, inv, out, 0);
}

/* Prefill, float KV on AVX2 (head_dim a multiple of 8): a task takes a tile of up to
 * ATT_TILE_ROWS query rows that share one KV head (consecutive tokens x the query heads of
 * its GQA group) and reads each KV block once for all of them, while it sits in L1; the
 * per-(token, head) task streams the sequence's whole K/V from L3 for every row (1 MiB at
 * 512 positions for a head_dim of 256). Each row's arithmetic is
 * attention_task_f32_avx2's operation for operation (att_block_scores_avx2 per block, the
 * same exp_sum_avx2 over the row's buffered scores, att_row_values_avx2 in position order),
 * so a row's result is bit-identical whichever kernel runs and whichever tokens share its
 * tile: batch invariance (--deterministic) holds with either. Rows go in pairs through
 * the block kernels, which then load each key and value once for two rows.
 *
 * A tile: tile_tokens consecutive tokens x tile_heads query heads of one KV head (a
 * group wider than ATT_TILE_ROWS is cut into head_chunks). */
typedef struct att_tiling {
    int group, tile_heads, head_chunks, tile_tokens, n_token_tiles;
} att_tiling;

static att_tiling att_tiling_of(const ops_attention_args *a) {
    att_tiling tl;
    tl.group = a->n_heads / a->n_kv_heads;
    tl.tile_heads = tl.group < ATT_TILE_ROWS ? tl.group : ATT_TILE_ROWS;
    tl.head_chunks = (tl.group + tl.tile_heads - 1) / tl.tile_heads;
    tl.tile_tokens = ATT_TILE_ROWS / tl.tile_heads;
    tl.n_token_tiles = (a->T + tl.tile_tokens - 1) / tl.tile_tokens;
    return tl;
}

typedef struct att_row {
    const float *q;
    float *out, *scores;
    int p_start, p_end;
    float mx;
} att_row;

/* Row r's positions inside the KV block that starts at position bp, as offsets
 * first..last into the block (first > last: none). */
static inline void att_run_in_block(const att_row *r, int bp, int *first, int *last) {
    *first = r->p_start > bp ? r->p_start - bp : 0;
    *last = r->p_end < bp + KV_BLOCK_SIZE - 1 ? r->p_end - bp : KV_BLOCK_SIZE - 1;
}

/* rows[0..n) of one sequence (slot) and KV head kvh: scores block by block, softmax per
 * row, then the weighted values block by block. */
ATT_AVX2 static void attention_tile_rows_avx2(const ops_attention_args *a, att_row *rows, int n, int slot, int kvh) {
    const kv_cache *kv = a->kv;
    int lo = INT32_MAX, hi = -1;
    for (int j = 0; j < n; j++) {
        if (rows[j].p_start < lo) lo = rows[j].p_start;
        if (rows[j].p_end > hi) hi = rows[j].p_end;
    }
    for (int bp = lo / KV_BLOCK_SIZE * KV_BLOCK_SIZE; bp <= hi; bp += KV_BLOCK_SIZE) { /* scores */
        const float *krow = kv_key(kv, a->layer, slot, bp, kvh);
        if (bp + KV_BLOCK_SIZE <= hi) att_prefetch_block(kv, a->layer, slot, bp + KV_BLOCK_SIZE, kvh);
        for (int j = 0; j < n; j += 2) { /* rows in pairs, over the union of their runs */
            int first = KV_BLOCK_SIZE, last = -1, pair = j + 1 < n, f, l;
            for (int k = j; k <= j + pair; k++) {
                att_run_in_block(&rows[k], bp, &f, &l);
                if (f <= l && f < first) first = f;
                if (f <= l && l > last) last = l;
            }
            if (first > last) continue;
            float s16[2][KV_BLOCK_SIZE];
            if (pair)
                att_block_scores2_avx2(rows[j].q, rows[j + 1].q, krow, a->head_dim, first, last - first + 1, a->scale,
                                       s16[0], s16[1]);
            else
                att_block_scores_avx2(rows[j].q, krow, a->head_dim, first, last - first + 1, a->scale, s16[0]);
            for (int k = j; k <= j + pair; k++) {
                att_row *r = &rows[k];
                att_run_in_block(r, bp, &f, &l);
                for (int i = f; i <= l; i++) {
                    float sc = s16[k - j][i];
                    r->scores[bp + i - r->p_start] = sc;
                    if (sc > r->mx) r->mx = sc;
                }
            }
        }
    }
    float inv[ATT_TILE_ROWS];
    for (int j = 0; j < n; j++) {
        att_row *r = &rows[j];
        inv[j] = 1.0f / exp_sum_avx2(r->scores, r->p_end - r->p_start + 1, r->mx);
        memset(r->out, 0, (size_t)a->head_dim * sizeof *r->out);
    }
    for (int bp = lo / KV_BLOCK_SIZE * KV_BLOCK_SIZE; bp <= hi; bp += KV_BLOCK_SIZE) /* weighted values */
        for (int j = 0; j < n;) {
            att_row *r = &rows[j], *r2 = &rows[j + 1];
            int first, last, first2 = 0, last2 = -1;
            att_run_in_block(r, bp, &first, &last);
            if (j + 1 < n) att_run_in_block(r2, bp, &first2, &last2);
            first += bp, last += bp, first2 += bp, last2 += bp;
            if (j + 1 < n && first <= last && first == first2 && last == last2) { /* the same positions */
                att_rows2_values_avx2(a, slot, kvh, first, last, r->scores + (first - r->p_start), inv[j],
                                      r2->scores + (first - r2->p_start), inv[j + 1], r->out, r2->out);
                j += 2;
                continue;
            }
            if (first <= last)
                att_row_values_avx2(a, slot, kvh, first, last, r->scores + (first - r->p_start), inv[j], r->out, 1);
            j++;
        }
}

/* Tiles are handed out last tokens first: with causal masking they have the most
 * positions, and dynamic hand-out then balances the threads. The rows of a tile are cut
 * where the sequence changes and where their scores would overflow the thread's scratch. */
ATT_AVX2 static void attention_tile_f32_avx2(void *ctx, int task, int thread) {
    const ops_attention_args *a = ctx;
    att_tiling tl = att_tiling_of(a);
    int per_tile = a->n_kv_heads * tl.head_chunks;
    int tile = tl.n_token_tiles - 1 - task / per_tile, kvh = task % per_tile / tl.head_chunks;
    int chunk = task % tl.head_chunks, h0 = kvh * tl.group + chunk * tl.tile_heads;
    int nh = tl.group - chunk * tl.tile_heads < tl.tile_heads ? tl.group - chunk * tl.tile_heads : tl.tile_heads;
    int t0 = tile * tl.tile_tokens, t1 = t0 + tl.tile_tokens < a->T ? t0 + tl.tile_tokens : a->T;
    size_t capacity = ops_attention_scratch(a->kv), used = 0;
    float *scratch = a->scratch + (size_t)thread * capacity;
    att_row rows[ATT_TILE_ROWS];
    int n = 0, run_slot = a->slot[t0]; /* the sequence of rows[0..n) */
    for (int t = t0; t < t1; t++) {
        int p_end = a->pos[t], p_start = a->window > 0 && p_end - a->window + 1 > 0 ? p_end - a->window + 1 : 0;
        size_t len = (size_t)(p_end - p_start + 1);
        for (int h = h0; h < h0 + nh; h++) {
            if (n > 0 && (a->slot[t] != run_slot || used + len > capacity)) {
                attention_tile_rows_avx2(a, rows, n, run_slot, kvh);
                n = 0, used = 0;
            }
            run_slot = a->slot[t];
            const float *q = a->q + ((size_t)t * a->n_heads + h) * a->head_dim;
            float *out = a->out + ((size_t)t * a->n_heads + h) * a->head_dim;
            rows[n++] = (att_row){q, out, scratch + used, p_start, p_end, -INFINITY};
            used += len;
        }
    }
    if (n > 0) attention_tile_rows_avx2(a, rows, n, run_slot, kvh);
}

void ops_attention(const ops_attention_args *a, threadpool *tp) {
    ops_attention_args args = *a;
    args.kernels = pick_kernels();
    int f32 = a->kv->quant != HEARTH_KV_INT8;
    tp_task_fn fn = attention_task;
    int n_tasks = a->T * a->n_heads;
    if (f32 && args.kernels == &kernels_avx512 && a->head_dim % 16 == 0) {
        int group = a->n_heads / a->n_kv_heads, units = a->T * a->n_kv_heads, parts = 1;
        /* few rows, some long: their splits as tasks of their own (the same bits either way) */
        if (units < 2 * tp_threads(tp)) {
            size_t S = ops_attention_scratch(a->kv), need = 0;
            size_t region = (size_t)units * (att_partial_floats(ATT_SPLITS_MAX, group, a->head_dim) + 1);
            int any = 0;
            for (int t = 0; t < a->T; t++) {
                size_t len = att_row_len(a, t);
                int ns = att_nsplit(a, len);
                size_t room = ns > 1 ? (size_t)att_split_positions((int)len) : len;
                any |= ns > 1;
                need = room > need ? room : need;
            }
            if (any && region + (size_t)a->head_dim + need <= S) {
                args.split_part = a->scratch + S - region;
                args.split_count = (int *)(args.split_part + (size_t)units * att_partial_floats(ATT_SPLITS_MAX, group,
                                                                                                  a->head_dim));
                memset(args.split_count, 0, (size_t)units * sizeof(int));
                args.split_cap = S - (size_t)a->head_dim - region;
                tp_run(tp, units * ATT_SPLITS_MAX, attention_split_f32_avx512, &args);
                return;
            }
        }
        /* every query head of a KV head in one task, unless that leaves a thread idle (a
         * decode step of a model with fewer KV heads than threads, e.g. one) */
        if (units < tp_threads(tp)) parts = (tp_threads(tp) + units - 1) / units;
        if (parts > group) parts = group;
        args.heads_per_task = (group + parts - 1) / parts;
        fn = attention_group_f32_avx512, n_tasks = units * ((group + args.heads_per_task - 1) / args.heads_per_task);
    } else if (f32 && args.kernels != &kernels_scalar && a->head_dim % 8 == 0) {
        /* tiles (the query heads of one KV head read each key and value row once) when
         * there are at least as many as threads; else one task per (token, head). Same bits
         * either way (tiles beat one task per head in decode too: bench/results/kernel_choices.md,
         * "CPU attention tiles"). */
        att_tiling tl = att_tiling_of(a);
        int n_tiles = tl.n_token_tiles * a->n_kv_heads * tl.head_chunks;
        fn = attention_task_f32_avx2;
        if (n_tiles >= tp_threads(tp)) fn = attention_tile_f32_avx2, n_tasks = n_tiles;
    }
    tp_run(tp, n_tasks, fn, &args);
}
