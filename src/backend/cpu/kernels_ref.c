/* kernels_ref.c: the scalar reference matmul: dequantize one block of a weight row to
 * float (same arithmetic order as the gguf package's numpy code and mx.dequantize, so
 * values are bit-identical) and accumulate x·w in double. Slow on purpose; the fast
 * kernels are tested against it. Block layouts: gguf/quants.py (GGML block structs). */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <string.h>

float cpu_sb_load(tensor_dtype t, const void *p, int64_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* 6-bit sub-block scale and min of Q4_K/Q5_K, packed in 12 bytes (see quants.py). */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void dq_q4_0(const uint8_t *b, float *o) {
    float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        o[j] = d * (float)((b[2 + j] & 0xF) - 8);
        o[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void dq_q4_1(const uint8_t *b, float *o) {
    float d = f16_at(b), m = f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        o[j] = d * (float)(b[4 + j] & 0xF) + m;
        o[j + 16] = d * (float)(b[4 + j] >> 4) + m;
    }
}

/* Q5_0 (has_min 0) and Q5_1 (has_min 1): 4 bytes of fifth bits, then nibbles. */
static void dq_q5(const uint8_t *b, float *o, int has_min) {
    float d = f16_at(b), m = has_min ? f16_at(b + 2) : 0.0f;
    const uint8_t *p = b + (has_min ? 4 : 2);
    uint32_t qh = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    const uint8_t *qs = p + 4;
    for (int j = 0; j < 32; j++) {
        int q = (j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4) | (int)((qh >> j) & 1) << 4;
        o[j] = has_min ? d * (float)q + m : d * (float)(q - 16);
    }
}

static void dq_q8_0(const uint8_t *b, float *o) {
    float d = f16_at(b);
    for (int j = 0; j < 32; j++) o[j] = (float)(int8_t)b[2 + j] * d;
}

static void dq_q2_k(const uint8_t *b, float *o) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16_at(b + 80), dmin = f16_at(b + 82);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, s = (e % 128) / 32, l = e % 32, g = e / 16;
        int q = (qs[h * 32 + l] >> (2 * s)) & 3;
        o[e] = (d * (float)(sc[g] & 0xF)) * (float)q - dmin * (float)(sc[g] >> 4);
    }
}

static void dq_q3_k(const uint8_t *b, float *o) {
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    float d = f16_at(b + 108);
    for (int e = 0; e < 256; e++) {
        int g = e / 16;
        int lo = g < 8 ? s[g] & 0xF : s[g - 8] >> 4;
        int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        int scale = (int)(int8_t)(uint8_t)(lo | hi << 4) - 32;
        int h = e / 128, sh = (e % 128) / 32, l = e % 32;
        int ql = (qs[h * 32 + l] >> (2 * sh)) & 3;
        int qh = ((hm[e % 32] >> (e / 32)) & 1) ^ 1;
        o[e] = (d * (float)scale) * (float)(ql - (qh << 2));
    }
}

/* Q4_K (has_high 0) and Q5_K (has_high 1). */
static void dq_q45_k(const uint8_t *b, float *o, int has_high) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (has_high ? 48 : 16);
    for (int c = 0; c < 8; c++) {
        int sc, m;
        k4_scale_min(s, c, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int e = c * 32 + l;
            int q = (qs[(c / 2) * 32 + l] >> (4 * (c % 2))) & 0xF;
            if (has_high) q |= ((qh[l] >> c) & 1) << 4;
            o[e] = dl * (float)q - ml;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *o) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_at(b + 208);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, c = (e % 128) / 32, l = e % 32;
        int lo = (ql[h * 64 + (c % 2) * 32 + l] >> (4 * (c / 2))) & 0xF;
        int hi = (qh[h * 32 + l] >> (2 * c)) & 3;
        o[e] = (d * (float)sc[e / 16]) * (float)((lo | hi << 4) - 32);
    }
}

/* MLX affine: element j of a row sits at bits [j*bits, (j+1)*bits) of the row's
 * little-endian bit stream (for 4 bits: bits 4*(j%8) of word j/8). */
static void dq_mlx(const cpu_weight *w, int64_t n, int64_t k0, int count, float *o) {
    const uint8_t *row = (const uint8_t *)w->data + n * cpu_weight_row_bytes(w);
    int64_t gi = n * (w->k / w->group_size) + k0 / w->group_size;
    float s = cpu_sb_load(w->sb_dtype, w->scales, gi), bias = cpu_sb_load(w->sb_dtype, w->biases, gi);
    uint32_t mask = (1u << w->bits) - 1;
    for (int j = 0; j < count; j++) {
        uint64_t bit = (uint64_t)(k0 + j) * (uint64_t)w->bits;
        const uint8_t *p = row + bit / 8;
        uint32_t v = p[0] | (bit % 8 + w->bits > 8 ? (uint32_t)p[1] << 8 : 0);
        o[j] = s * (float)((v >> (bit % 8)) & mask) + bias;
    }
}

void cpu_ref_dequant(const cpu_weight *w, int64_t n, int64_t k0, int count, float *out) {
    if (w->dtype == DT_U32) {
        dq_mlx(w, n, k0, count, out);
        return;
    }
    const uint8_t *row = (const uint8_t *)w->data + n * cpu_weight_row_bytes(w);
    int be = tensor_dtype_block_elems(w->dtype), bb = tensor_dtype_block_bytes(w->dtype);
    for (int done = 0; done < count; done += be) {
        const uint8_t *b = row + (k0 + done) / be * bb;
        float *o = out + done;
        switch (w->dtype) {
        case DT_F32: memcpy(o, b, 4); break;
        case DT_F16: o[0] = f16_at(b); break;
        case DT_BF16: {
            uint16_t h;
            memcpy(&h, b, 2);
            o[0] = bf16_to_f32(h);
            break;
        }
        case DT_Q4_0: dq_q4_0(b, o); break;
        case DT_Q4_1: dq_q4_1(b, o); break;
        case DT_Q5_0: dq_q5(b, o, 0); break;
        case DT_Q5_1: dq_q5(b, o, 1); break;
        case DT_Q8_0: dq_q8_0(b, o); break;
        case DT_Q2_K: dq_q2_k(b, o); break;
        case DT_Q3_K: dq_q3_k(b, o); break;
        case DT_Q4_K: dq_q45_k(b, o, 0); break;
        case DT_Q5_K: dq_q45_k(b, o, 1); break;
        case DT_Q6_K: dq_q6_k(b, o); break;
        default: memset(o, 0, (size_t)be * sizeof *o); break; /* rejected by cpu_weight_check */
        }
    }
}

void cpu_ref_rows(const cpu_weight *w, int64_t n0, int64_t n1, const void *xv, float *y) {
    const float *x = xv;
    /* 256 = the largest block (k-quants); 32-element steps keep MLX inside one group. */
    int step = w->dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w->dtype) == 1 ? 256
                                                                              : tensor_dtype_block_elems(w->dtype);
    float buf[256];
    for (int64_t n = n0; n < n1; n++) {
        double acc = 0;
        for (int64_t k0 = 0; k0 < w->k; k0 += step) {
            int count = w->k - k0 < step ? (int)(w->k - k0) : step;
            cpu_ref_dequant(w, n, k0, count, buf);
            for (int j = 0; j < count; j++) acc += (double)buf[j] * (double)x[k0 + j];
        }
        y[n] = (float)acc;
    }
}
