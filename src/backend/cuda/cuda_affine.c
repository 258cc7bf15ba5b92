/* cuda_affine.c: the host side of the generic affine device layout (cuda_affine.h): which
 * weights take it, its sizes, and each format's codes, scales and biases. Plain C, built
 * with or without nvcc (hearth fit plans GPU footprints on any machine). */
#include "backend/cuda/cuda_affine.h"
#include "backend/cuda/cuda_backend.h"
#include "ops/op_weight.h"
#include "base/half.h"
#include <string.h>

static int group_ok(int g) { return g == 16 || g == 32 || g == 64 || g == 128; }

int cuda_affine_takes(const op_weight *w, int *bits, int *group) {
    int b = 0, g = 0;
    if (!w || w->n <= 0 || w->k <= 0 || w->k % 32) return 0;
    switch (w->dtype) {
    case DT_U32:
        if (!op_mlx_bits_ok(w->bits) || !group_ok(w->group_size) || w->k % w->group_size) return 0;
        if (w->sb_dtype != DT_F16 && w->sb_dtype != DT_BF16 && w->sb_dtype != DT_F32) return 0;
        b = w->bits, g = w->group_size;
        break;
    case DT_Q5_0:
    case DT_Q5_1: b = 5, g = 32; break;
    case DT_Q2_K: b = 2, g = 16; break;
    case DT_Q3_K: b = 3, g = 16; break;
    case DT_Q5_K: b = 5, g = 32; break;
    default: return 0;
    }
    if (w->dtype >= DT_Q2_K && w->k % 256) return 0;
    if (bits) *bits = b;
    if (group) *group = g;
    return 1;
}

size_t cuda_affine_code_bytes(int64_t n, int64_t k, int bits) { return (size_t)n * (size_t)k / 8 * (size_t)bits; }

size_t cuda_affine_pair_bytes(int64_t n, int64_t k, int group) {
    return (size_t)n * (size_t)(k / group) * 2 * sizeof(float);
}

static float rd_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One super-block / block of a GGUF format: codes[be], sb[2 * be / group]. */
static void gguf_block(tensor_dtype t, const uint8_t *b, uint8_t *codes, float *sb) {
    switch (t) {
    case DT_Q5_0:
    case DT_Q5_1: {
        int one = t == DT_Q5_1;
        float d = rd_f16(b);
        uint32_t qh = rd32(b + (one ? 4 : 2));
        const uint8_t *qs = b + (one ? 8 : 6);
        for (int l = 0; l < 16; l++) {
            codes[l] = (uint8_t)((qs[l] & 15) | ((qh >> l) & 1) << 4);
            codes[16 + l] = (uint8_t)((qs[l] >> 4) | ((qh >> (16 + l)) & 1) << 4);
        }
        sb[0] = d;
        sb[1] = one ? rd_f16(b + 2) : -16.0f * d;
        break;
    }
    case DT_Q2_K: {
        float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
        for (int i = 0; i < 256; i++) codes[i] = (uint8_t)((b[16 + i / 128 * 32 + i % 32] >> (i % 128 / 32 * 2)) & 3);
        for (int j = 0; j < 16; j++) {
            sb[2 * j] = d * (float)(b[j] & 15);
            sb[2 * j + 1] = -(dmin * (float)(b[j] >> 4));
        }
        break;
    }
    case DT_Q3_K: {
        uint32_t s[4];
        op_q3k_scales(b, s);
        float d = rd_f16(b + 108);
        for (int i = 0; i < 256; i++) {
            int low = (b[32 + i / 128 * 32 + i % 32] >> (i % 128 / 32 * 2)) & 3, hbit = (b[i % 32] >> (i / 32)) & 1;
            codes[i] = (uint8_t)(low | hbit << 2);
        }
        for (int j = 0; j < 16; j++) {
            float dl = d * (float)((int)((s[j / 4] >> (8 * (j % 4))) & 63) - 32);
            sb[2 * j] = dl;
            sb[2 * j + 1] = -4.0f * dl;
        }
        break;
    }
    case DT_Q5_K: {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            cuda_q4k_scale_min(b + 4, j, 0, &sc, &mn); /* Q5_K packs them as Q4_K does (GGUF order) */
            sb[2 * j] = d * (float)sc;
            sb[2 * j + 1] = -(dmin * (float)mn);
            for (int l = 0; l < 32; l++)
                codes[32 * j + l] = (uint8_t)(((b[48 + j / 2 * 32 + l] >> (4 * (j % 2))) & 15) | ((b[16 + l] >> j) & 1) << 4);
        }
        break;
    }
    default: break;
    }
}

void cuda_affine_row(const op_weight *w, int64_t r, int bits, int group, uint8_t *codes, float *sb) {
    const uint8_t *row = (const uint8_t *)w->data + r * op_weight_row_bytes(w);
    if (w->dtype == DT_U32) {
        uint32_t mask = (1u << bits) - 1;
        for (int64_t c = 0; c < w->k; c++) {
            uint64_t bit = (uint64_t)c * (uint64_t)bits;
            const uint8_t *p = row + bit / 8;
            uint32_t v = p[0] | (bit % 8 + (uint64_t)bits > 8 ? (uint32_t)p[1] << 8 : 0);
            codes[c] = (uint8_t)((v >> (bit % 8)) & mask);
        }
        int64_t groups = w->k / group, g0 = r * groups;
        for (int64_t g = 0; g < groups; g++) {
            sb[2 * g] = op_sb_load(w->sb_dtype, w->scales, g0 + g);
            sb[2 * g + 1] = op_sb_load(w->sb_dtype, w->biases, g0 + g);
        }
        return;
    }
    int be = tensor_dtype_block_elems(w->dtype), bb = tensor_dtype_block_bytes(w->dtype);
    for (int64_t blk = 0; blk < w->k / be; blk++)
        gguf_block(w->dtype, row + blk * bb, codes + blk * be, sb + blk * be / group * 2);
}

/* Row r's chunk words in the low plane (hi = 0) or in the high plane of width hi. */
static uint32_t *plane_row(uint8_t *planes, int64_t n, int64_t k, int lo, int hi, int64_t r) {
    size_t base = hi ? cuda_affine_code_bytes(n, k, lo) : 0;
    return (uint32_t *)(planes + base) + (size_t)r * (size_t)(k / 32) * (size_t)(hi ? hi : lo);
}

void cuda_affine_pack_row(const uint8_t *codes, int64_t n, int64_t k, int bits, int64_t r, uint8_t *planes) {
    int lo = cuda_affine_lo_bits(bits), hi = bits - lo;
    for (int p = 0; p < (hi ? 2 : 1); p++) {
        int w = p ? hi : lo, shift = p ? lo : 0;
        /* four codes at a time: weights 4m .. 4m + 3 of a chunk are bytes 0..3 of word m % w at
         * bit w (m / w) of each byte (cuda_affine_slot); shift + w <= 8, so shifting the four
         * bytes together and masking each keeps every code's bits in its own byte */
        uint32_t mask = ((1u << w) - 1) * 0x01010101u;
        uint32_t *words = plane_row(planes, n, k, lo, p ? hi : 0, r);
        for (int64_t c0 = 0; c0 < k; c0 += 32, words += w) {
            for (int i = 0; i < w; i++) words[i] = 0;
            for (int m = 0; m < 8; m++) {
                uint32_t four;
                memcpy(&four, codes + c0 + 4 * m, 4); /* little-endian: code 4m + j in byte j */
                words[m % w] |= ((four >> shift) & mask) << (w * (m / w));
            }
        }
    }
}

int cuda_affine_code(const uint8_t *planes, int64_t n, int64_t k, int bits, int64_t r, int64_t c) {
    int lo = cuda_affine_lo_bits(bits), hi = bits - lo, code = 0;
    for (int p = 0; p < (hi ? 2 : 1); p++) {
        int w = p ? hi : lo, word, bit;
        const uint32_t *words = plane_row((uint8_t *)planes, n, k, lo, p ? hi : 0, r);
        cuda_affine_slot((int)(c % 32), w, &word, &bit);
        code |= (int)((words[c / 32 * w + word] >> bit) & ((1u << w) - 1)) << (p ? lo : 0);
    }
    return code;
}
