/* ggml_quant.c: scalar reference dequantizers for every GGUF weight format and the
 * reference quantizers for the 32-element formats, Q4_K and Q6_K. Layouts and the order of
 * float operations follow the gguf package's numpy code (gguf/quants.py), and for the
 * K-quants ggml's reference quantizers, so results are bitwise equal to them. Must stay
 * plain C: fast kernels live in backend/cpu. */
#include "io/ggml_quant.h"
#include "base/cpu_features.h"
#include "base/err.h"
#include "base/half.h"
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Bit-exactness needs every multiply and add rounded on its own: a fused multiply-add
 * (which GCC forms across statements on FMA targets) would differ from numpy. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define QK 32    /* elements per block of Q4_0..Q8_0 (ggml QK4_0 etc.) */
#define QK_K 256 /* elements per k-quant super-block (ggml QK_K) */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static float rd_f16(const uint8_t *p) { return f16_to_f32(rd16(p)); }
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ---- 32-element block formats ---------------------------------------------- */

static void dq_q4_0(const uint8_t *b, float *y) {
    float d = rd_f16(b);
    for (int l = 0; l < QK / 2; l++) {
        y[l] = d * (float)((int)(b[2 + l] & 0x0f) - 8);
        y[l + QK / 2] = d * (float)((int)(b[2 + l] >> 4) - 8);
    }
}

static void dq_q4_1(const uint8_t *b, float *y) {
    float d = rd_f16(b), m = rd_f16(b + 2);
    for (int l = 0; l < QK / 2; l++) {
        float lo = d * (float)(b[4 + l] & 0x0f), hi = d * (float)(b[4 + l] >> 4);
        y[l] = lo + m;
        y[l + QK / 2] = hi + m;
    }
}

/* Q5_0/Q5_1 keep the fifth bit of element l in bit l of a little-endian u32. */
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void dq_q5_0(const uint8_t *b, float *y) {
    float d = rd_f16(b);
    uint32_t qh = rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int l = 0; l < QK / 2; l++) {
        int lo = (qs[l] & 0x0f) | (int)(((qh >> l) & 1u) << 4);
        int hi = (qs[l] >> 4) | (int)(((qh >> (l + QK / 2)) & 1u) << 4);
        y[l] = d * (float)(lo - 16);
        y[l + QK / 2] = d * (float)(hi - 16);
    }
}

static void dq_q5_1(const uint8_t *b, float *y) {
    float d = rd_f16(b), m = rd_f16(b + 2);
    uint32_t qh = rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int l = 0; l < QK / 2; l++) {
        int lo = (qs[l] & 0x0f) | (int)(((qh >> l) & 1u) << 4);
        int hi = (qs[l] >> 4) | (int)(((qh >> (l + QK / 2)) & 1u) << 4);
        float a = d * (float)lo, c = d * (float)hi;
        y[l] = a + m;
        y[l + QK / 2] = c + m;
    }
}

static void dq_q8_0(const uint8_t *b, float *y) {
    float d = rd_f16(b);
    for (int l = 0; l < QK; l++) y[l] = (float)(int8_t)b[2 + l] * d;
}

/* ---- k-quants (256-element super-blocks) ------------------------------------ */

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. */
static void dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *qs = b + 16;
    float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, shift = ((i % 128) / 32) * 2, l = i % 32;
        int q = (qs[half * 32 + l] >> shift) & 3;
        uint8_t sc = scales[i / 16];
        float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
        float a = dl * (float)q;
        y[i] = a - ml;
    }
}

/* Q3_K: hmask[32], qs[64], 12 bytes of packed 6-bit scales, d. */
static void dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    float d = rd_f16(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        int lo = (i < 8 ? sc[i] : sc[i - 8] >> 4) & 0x0f;
        int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        dl[i] = d * (float)((lo | (hi << 4)) - 32);
    }
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, shift = ((i % 128) / 32) * 2, l = i % 32;
        int ql = (qs[half * 32 + l] >> shift) & 3;
        int hbit = (hmask[l] >> (i / 32)) & 1;
        /* a clear high bit means "subtract 4" (ggml's hmask convention) */
        y[i] = dl[i / 16] * (float)(ql - ((hbit ^ 1) << 2));
    }
}

/* The 12-byte scale/min packing shared by Q4_K and Q5_K: eight 6-bit pairs. */
static void k_scale_min(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        mn[j] = s[4 + j] & 0x3f;
        sc[4 + j] = (uint8_t)((s[8 + j] & 0x0f) | ((s[j] >> 2) & 0x30));
        mn[4 + j] = (uint8_t)((s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30));
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]; Q5_K adds qh[32] before qs. */
static void dq_q45_k(const uint8_t *b, float *y, int five_bit) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    uint8_t sc[8], mn[8];
    k_scale_min(b + 4, sc, mn);
    const uint8_t *qh = b + 16, *qs = five_bit ? b + 48 : b + 16;
    for (int k = 0; k < 8; k++) {
        float dk = d * (float)sc[k], mk = dmin * (float)mn[k];
        for (int l = 0; l < 32; l++) {
            int q = (qs[(k / 2) * 32 + l] >> (4 * (k % 2))) & 0x0f;
            if (five_bit) q |= ((qh[l] >> k) & 1) << 4;
            float a = dk * (float)q;
            y[k * 32 + l] = a - mk;
        }
    }
}

/* Q6_K: ql[128] (low nibbles), qh[64] (2 high bits), int8 scales[16], d. */
static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = rd_f16(b + 208);
    for (int i = 0; i < QK_K; i++) {
        int half = i / 128, r = i % 128;
        int lo = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        int hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        float dl = d * (float)scales[i / 16];
        y[i] = dl * (float)((lo | (hi << 4)) - 32);
    }
}

typedef void (*dq_block_fn)(const uint8_t *block, float *out);

static void dq_q4_k(const uint8_t *b, float *y) { dq_q45_k(b, y, 0); }
static void dq_q5_k(const uint8_t *b, float *y) { dq_q45_k(b, y, 1); }

static dq_block_fn block_dequantizer(tensor_dtype t) {
    switch (t) {
    case DT_Q4_0: return dq_q4_0;
    case DT_Q4_1: return dq_q4_1;
    case DT_Q5_0: return dq_q5_0;
    case DT_Q5_1: return dq_q5_1;
    case DT_Q8_0: return dq_q8_0;
    case DT_Q2_K: return dq_q2_k;
    case DT_Q3_K: return dq_q3_k;
    case DT_Q4_K: return dq_q4_k;
    case DT_Q5_K: return dq_q5_k;
    case DT_Q6_K: return dq_q6_k;
    default: return NULL;
    }
}

/* Checks n against the block size and nbytes against what n elements need. */
static hearth_status check_sizes(const char *what, tensor_dtype t, uint64_t n, uint64_t nbytes, uint64_t *need,
                                 hearth_error *err) {
    int be = tensor_dtype_block_elems(t);
    if (be <= 0 || n % (uint64_t)be)
        return err_set(err, HEARTH_ERR_INVALID, "%s %s: %llu elements is not a whole number of %d-element blocks", what,
                       tensor_dtype_name(t), (unsigned long long)n, be);
    *need = tensor_dtype_nbytes(t, n);
    if (n && !*need)
        return err_set(err, HEARTH_ERR_INVALID, "%s %s: size of %llu elements overflows", what, tensor_dtype_name(t),
                       (unsigned long long)n);
    if (nbytes < *need)
        return err_set(err, HEARTH_ERR_FORMAT, "%s %s: %llu elements need %llu bytes, have %llu", what,
                       tensor_dtype_name(t), (unsigned long long)n, (unsigned long long)*need,
                       (unsigned long long)nbytes);
    return HEARTH_OK;
}

/* F16 to f32, n values: the hardware conversion (F16C) eight at a time where the CPU has it,
 * f16_to_f32 for the rest and for any group of eight holding a NaN (the hardware quiets a
 * signalling NaN; f16_to_f32 keeps its bits), so the output bits are f16_to_f32's for every
 * input (test_gguf checks all 65536). The table rows of an F16 model's embeddings go through
 * here once per prompt token: 4096 rows of 4096 took 20 ms on one core element by element,
 * and on the GPU path the device waits for them. */
#if defined(__x86_64__)
__attribute__((target("avx,f16c,sse4.1"))) static void f16_row_f16c(const uint8_t *s, float *dst, uint64_t n) {
    const __m128i absm = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + 2 * i));
        if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, absm), inf))) { /* a NaN among the eight */
            for (uint64_t j = i; j < i + 8; j++) dst[j] = f16_to_f32(rd16(s + 2 * j));
            continue;
        }
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = f16_to_f32(rd16(s + 2 * i));
}
#endif

static void f16_row(const uint8_t *s, float *dst, uint64_t n) {
#if defined(__x86_64__)
    /* the hardware's features, not HEARTH_CPU's level: the bits are the same either way */
    const cpu_features *f = cpu_features_get();
    int have = f->f16c && f->avx2;
    if (have) {
        f16_row_f16c(s, dst, n);
        return;
    }
#endif
    for (uint64_t i = 0; i < n; i++) dst[i] = f16_to_f32(rd16(s + 2 * i));
}

hearth_status ggml_dequantize(tensor_dtype t, const void *src, uint64_t nbytes, float *dst, uint64_t n,
                              hearth_error *err) {
    const uint8_t *s = src;
    dq_block_fn fn = block_dequantizer(t);
    if (!fn && t != DT_F32 && t != DT_F16 && t != DT_BF16)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "dequantize: dtype %s is not a GGUF weight format",
                       tensor_dtype_name(t));
    uint64_t need;
    hearth_status st = check_sizes("dequantize", t, n, nbytes, &need, err);
    if (st) return st;
    if (t == DT_F32) {
        if (n) memcpy(dst, s, n * 4);
    } else if (t == DT_F16) {
        f16_row(s, dst, n);
    } else if (t == DT_BF16) {
        for (uint64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(rd16(s + 2 * i));
    } else {
        uint64_t be = (uint64_t)tensor_dtype_block_elems(t), bb = (uint64_t)tensor_dtype_block_bytes(t);
        for (uint64_t blk = 0; blk < n / be; blk++) fn(s + blk * bb, dst + blk * be);
    }
    return HEARTH_OK;
}

/* ---- reference quantizers ---------------------------------------------------- */

/* Float to small unsigned int as numpy's trunc(v).astype(uint8).clip(0, hi) does for
 * in-range values; NaN (no defined numpy result) maps to 0 instead of being UB. */
static uint8_t trunc_clip(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    float t = truncf(v);
    return t >= (float)hi ? (uint8_t)hi : (uint8_t)t;
}

/* Round half away from zero, the same as gguf's np_roundf on finite input. */
static float round_away(float v) { return roundf(v); }

static float inverse_or_zero(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

/* Q4_0 and Q5_0: symmetric, d = (value of largest magnitude) / -(2^(bits-1)). */
static void q_sym(const float *x, uint8_t *b, int five_bit) {
    int imax = 0;
    for (int l = 1; l < QK; l++)
        if (fabsf(x[l]) > fabsf(x[imax])) imax = l; /* first max wins, like argmax */
    float d = x[imax] / (five_bit ? -16.0f : -8.0f), id = inverse_or_zero(d);
    uint8_t q[QK];
    for (int l = 0; l < QK; l++) {
        float scaled = x[l] * id;
        q[l] = trunc_clip(scaled + (five_bit ? 16.5f : 8.5f), five_bit ? 31 : 15);
    }
    wr16(b, f32_to_f16(d));
    uint8_t *qs = b + 2;
    if (five_bit) {
        uint32_t qh = 0;
        for (int l = 0; l < QK; l++) qh |= (uint32_t)(q[l] >> 4) << l;
        for (int i = 0; i < 4; i++) b[2 + i] = (uint8_t)(qh >> (8 * i));
        qs = b + 6;
    }
    for (int l = 0; l < QK / 2; l++) qs[l] = (uint8_t)((q[l] & 0x0f) | (q[l + QK / 2] << 4));
}

/* Q4_1 and Q5_1: affine, d = (max - min) / (2^bits - 1), stored with min. */
static void q_affine(const float *x, uint8_t *b, int five_bit) {
    float mx = x[0], mn = x[0];
    for (int l = 1; l < QK; l++) {
        if (x[l] > mx) mx = x[l];
        if (x[l] < mn) mn = x[l];
    }
    float d = (mx - mn) / (five_bit ? 31.0f : 15.0f), id = inverse_or_zero(d);
    uint8_t q[QK];
    for (int l = 0; l < QK; l++) {
        float shifted = x[l] - mn, scaled = shifted * id;
        q[l] = trunc_clip(scaled + 0.5f, five_bit ? 31 : 15);
    }
    wr16(b, f32_to_f16(d));
    wr16(b + 2, f32_to_f16(mn));
    uint8_t *qs = b + 4;
    if (five_bit) {
        uint32_t qh = 0;
        for (int l = 0; l < QK; l++) qh |= (uint32_t)(q[l] >> 4) << l;
        for (int i = 0; i < 4; i++) b[4 + i] = (uint8_t)(qh >> (8 * i));
        qs = b + 8;
    }
    for (int l = 0; l < QK / 2; l++) qs[l] = (uint8_t)((q[l] & 0x0f) | (q[l + QK / 2] << 4));
}

static void q_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int l = 0; l < QK; l++)
        if (fabsf(x[l]) > amax) amax = fabsf(x[l]);
    float d = amax / 127.0f, id = inverse_or_zero(d);
    wr16(b, f32_to_f16(d));
    for (int l = 0; l < QK; l++) {
        float r = round_away(x[l] * id);
        b[2 + l] = (uint8_t)(int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r == r ? (int)r : 0);
    }
}

/* ---- k-quant reference quantizers (Q4_K, Q6_K) --------------------------------
 * The same arithmetic as ggml's reference quantizers without an importance matrix, in the
 * same float order (no contraction, see the pragma above), so the bytes equal llama.cpp's
 * llama_model_quantize output (tests/parity/test_convert_gguf_kquant.py). */

/* Round to the nearest integer, ties to even: what ggml's nearest_int computes (it adds
 * 1.5 * 2^23 and reads the mantissa) for |v| < 2^22; NaN and out-of-range map to 0. */
static int nearest_even(float v) { return fabsf(v) <= 4194303.0f ? (int)rintf(v) : 0; }

/* v rounded to the nearest integer (ties to even, as ggml's nearest_int) and clamped to [lo, hi],
 * kept in float: adding and removing 1.5 * 2^23 rounds exactly for |v| < 2^22, and the form
 * vectorizes. NaN gives lo. */
static inline float round_clamp(float v, float lo, float hi) {
    float r = (v + 12582912.0f) - 12582912.0f;
    return r > lo ? (r < hi ? r : hi) : lo;
}

/* Symmetric levels for n values in [-nmax, nmax-1] (stored + nmax in levels) with the
 * scale that minimises the x^2-weighted squared error over 19 trial inverse scales around
 * -nmax / (value of largest magnitude); returns the scale, 0 for an all-zero group. The
 * trials are independent, so their sums run side by side (each in ggml's order: the bits
 * do not change) and the winner is picked after, in ggml's trial order. */
enum { K_SYM_TRIALS = 19 };
static float k_sym_levels(int n, int nmax, const float *x, int8_t *levels) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (amax < 1e-15f) { /* ggml's GROUP_MAX_EPS */
        memset(levels, 0, (size_t)n);
        return 0.0f;
    }
    float inv[K_SYM_TRIALS], sum_xl[K_SYM_TRIALS] = {0}, sum_ll[K_SYM_TRIALS] = {0};
    float lo = (float)-nmax, hi = (float)(nmax - 1);
    inv[0] = (float)-nmax / max; /* trial 0: the plain scale; then tweaks -9..-1, 1..9 tenths */
    for (int t = 1; t < K_SYM_TRIALS; t++) inv[t] = -((float)nmax + 0.1f * (float)(t <= 9 ? t - 10 : t - 9)) / max;
    for (int i = 0; i < n; i++) {
        float w = x[i] * x[i], wx = w * x[i];
        for (int t = 0; t < K_SYM_TRIALS; t++) {
            float l = round_clamp(inv[t] * x[i], lo, hi);
            sum_xl[t] += wx * l;
            sum_ll[t] += w * l * l;
        }
    }
    int best_trial = 0;
    float scale = sum_ll[0] != 0.0f ? sum_xl[0] / sum_ll[0] : 0.0f, best = scale * sum_xl[0];
    for (int t = 1; t < K_SYM_TRIALS; t++)
        if (sum_ll[t] > 0.0f && sum_xl[t] * sum_xl[t] > best * sum_ll[t]) {
            best_trial = t;
            scale = sum_xl[t] / sum_ll[t];
            best = scale * sum_xl[t];
        }
    for (int i = 0; i < n; i++) levels[i] = (int8_t)(nmax + (int)round_clamp(inv[best_trial] * x[i], lo, hi));
    return scale;
}

/* Affine levels 0..nmax for n (at most 32) values with weights: x ~ scale * level - min_out.
 * Starts from the group's range (min clamped to at most 0) and tries nstep + 1 widened level
 * counts, each refitted by weighted least squares, keeping the lowest weighted squared
 * error; a kept trial's min moves the later trials, as in ggml, so they run in order. */
enum { K_AFFINE_GROUP_MAX = 32 }; /* values per group: ggml's Q4_K and Q5_K groups */
static float k_affine_levels(int n, int nmax, const float *x, const float *w, uint8_t *levels, float *min_out,
                             float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    if (hi == lo) {
        memset(levels, 0, (size_t)n);
        *min_out = -lo;
        return 0.0f;
    }
    float top = (float)nmax, inv0 = top / (hi - lo), scale = 1.0f / inv0, best_err = 0.0f;
    float level_inv = inv0, level_lo = lo; /* what the kept levels were computed with */
    for (int i = 0; i < n; i++) {
        float diff = scale * round_clamp(inv0 * (x[i] - lo), 0.0f, top) + lo - x[i];
        best_err += w[i] * (diff * diff);
    }
    for (int t = 0; t <= nstep; t++) {
        float inv = (rmin + rdelta * (float)t + top) / (hi - lo), l[K_AFFINE_GROUP_MAX];
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) l[i] = round_clamp(inv * (x[i] - lo), 0.0f, top);
        for (int i = 0; i < n; i++) {
            sl += w[i] * l[i];
            sl2 += w[i] * l[i] * l[i];
            sxl += w[i] * l[i] * x[i];
        }
        float det = sum_w * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float ts = (sum_w * sxl - sum_x * sl) / det, tm = (sl2 * sum_x - sl * sxl) / det, err = 0.0f;
        if (tm > 0.0f) tm = 0.0f, ts = sxl / sl2;
        for (int i = 0; i < n; i++) {
            float diff = ts * l[i] + tm - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best_err) level_inv = inv, level_lo = lo, best_err = err, scale = ts, lo = tm;
    }
    for (int i = 0; i < n; i++) levels[i] = (uint8_t)round_clamp(level_inv * (x[i] - level_lo), 0.0f, top);
    *min_out = -lo;
    return scale;
}

/* Q6_K: sixteen 16-value groups with int8 scales under one f16 d; levels -32..31. */
static void q_q6_k(const float *x, uint8_t *b) {
    int8_t levels[QK_K];
    float scales[16], max_scale = 0.0f, max_abs = 0.0f;
    for (int g = 0; g < 16; g++) {
        scales[g] = k_sym_levels(16, 32, x + 16 * g, levels + 16 * g);
        if (fabsf(scales[g]) > max_abs) max_abs = fabsf(scales[g]), max_scale = scales[g];
    }
    memset(b, 0, 210);
    if (max_abs < 1e-15f) return; /* ggml's GROUP_MAX_EPS: an all-zero block */
    float inv = -128.0f / max_scale;
    uint16_t d16 = f32_to_f16(1.0f / inv);
    wr16(b + 208, d16);
    int8_t *sc = (int8_t *)(b + 192);
    for (int g = 0; g < 16; g++) {
        int s = nearest_even(inv * scales[g]);
        sc[g] = (int8_t)(s > 127 ? 127 : s);
    }
    for (int g = 0; g < 16; g++) {
        float d = f16_to_f32(d16) * (float)sc[g];
        if (d == 0.0f) continue; /* keep the group's own levels */
        for (int i = 0; i < 16; i++)
            levels[16 * g + i] = (int8_t)(32 + (int)round_clamp(x[16 * g + i] / d, -32.0f, 31.0f));
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int half = 0; half < 2; half++) {
        const uint8_t *L = (const uint8_t *)levels + 128 * half;
        for (int l = 0; l < 32; l++) {
            ql[64 * half + l] = (uint8_t)((L[l] & 0x0f) | ((L[l + 64] & 0x0f) << 4));
            ql[64 * half + l + 32] = (uint8_t)((L[l + 32] & 0x0f) | ((L[l + 96] & 0x0f) << 4));
            qh[32 * half + l] =
                (uint8_t)((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) | ((L[l + 96] >> 4) << 6));
        }
    }
}

/* Q4_K: eight 32-value groups, each with a 6-bit scale and a 6-bit min under the f16 pair
 * (d, dmin); levels 0..15. Weights are rms(group) + |x|, 21 trial level counts. */
static void q_q4_k(const float *x, uint8_t *b) {
    uint8_t levels[QK_K];
    float w[32], scales[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int g = 0; g < 8; g++) {
        const float *xg = x + 32 * g;
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) sum_x2 += xg[l] * xg[l];
        float rms = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xg[l]);
        scales[g] = k_affine_levels(32, 15, xg, w, levels + 32 * g, &mins[g], -1.0f, 0.1f, 20);
        if (scales[g] > max_scale) max_scale = scales[g];
        if (mins[g] > max_min) max_min = mins[g];
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t sc[8], mn[8], *packed = b + 4;
    for (int g = 0; g < 8; g++) {
        /* ggml stores nearest_int's result in a uint8_t before the clamp: a negative scale wraps */
        uint8_t s = (uint8_t)nearest_even(inv_scale * scales[g]), m = (uint8_t)nearest_even(inv_min * mins[g]);
        sc[g] = s > 63 ? 63 : s;
        mn[g] = m > 63 ? 63 : m;
    }
    for (int j = 0; j < 4; j++) { /* the layout k_scale_min reads */
        packed[j] = (uint8_t)(sc[j] | ((sc[4 + j] >> 4) << 6));
        packed[4 + j] = (uint8_t)(mn[j] | ((mn[4 + j] >> 4) << 6));
        packed[8 + j] = (uint8_t)((sc[4 + j] & 0x0f) | ((mn[4 + j] & 0x0f) << 4));
    }
    uint16_t d16 = f32_to_f16(max_scale / 63.0f), dmin16 = f32_to_f16(max_min / 63.0f);
    wr16(b, d16);
    wr16(b + 2, dmin16);
    for (int g = 0; g < 8; g++) {
        float d = f16_to_f32(d16) * (float)sc[g];
        if (d == 0.0f) continue; /* keep the group's own levels */
        float dm = f16_to_f32(dmin16) * (float)mn[g];
        for (int l = 0; l < 32; l++) levels[32 * g + l] = (uint8_t)round_clamp((x[32 * g + l] + dm) / d, 0.0f, 15.0f);
    }
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) qs[32 * c + l] = (uint8_t)(levels[64 * c + l] | (levels[64 * c + l + 32] << 4));
}

static void q_q4_0(const float *x, uint8_t *b) { q_sym(x, b, 0); }
static void q_q5_0(const float *x, uint8_t *b) { q_sym(x, b, 1); }
static void q_q4_1(const float *x, uint8_t *b) { q_affine(x, b, 0); }
static void q_q5_1(const float *x, uint8_t *b) { q_affine(x, b, 1); }

hearth_status ggml_quantize(tensor_dtype t, const float *src, uint64_t n, void *dst, uint64_t nbytes,
                            hearth_error *err) {
    void (*fn)(const float *, uint8_t *) = NULL;
    switch (t) {
    case DT_Q4_0: fn = q_q4_0; break;
    case DT_Q4_1: fn = q_q4_1; break;
    case DT_Q5_0: fn = q_q5_0; break;
    case DT_Q5_1: fn = q_q5_1; break;
    case DT_Q8_0: fn = q_q8_0; break;
    case DT_Q4_K: fn = q_q4_k; break;
    case DT_Q6_K: fn = q_q6_k; break;
    case DT_F32:
    case DT_F16:
    case DT_BF16: break;
    default:
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "quantize: no reference quantizer for %s", tensor_dtype_name(t));
    }
    uint64_t need;
    hearth_status st = check_sizes("quantize", t, n, nbytes, &need, err);
    if (st) return st;
    uint8_t *d = dst;
    if (t == DT_F32) {
        if (n) memcpy(d, src, n * 4);
    } else if (t == DT_F16) {
        for (uint64_t i = 0; i < n; i++) wr16(d + 2 * i, f32_to_f16(src[i]));
    } else if (t == DT_BF16) {
        for (uint64_t i = 0; i < n; i++) wr16(d + 2 * i, f32_to_bf16(src[i]));
    } else {
        uint64_t bb = (uint64_t)tensor_dtype_block_bytes(t), be = (uint64_t)tensor_dtype_block_elems(t);
        for (uint64_t blk = 0; blk < n / be; blk++) fn(src + blk * be, d + blk * bb);
    }
    return HEARTH_OK;
}
