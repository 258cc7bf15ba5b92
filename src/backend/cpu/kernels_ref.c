/* kernels_ref.c: the scalar reference matmul: dequantize one block of a weight row to
 * float (GGUF formats through io/ggml_quant.c, MLX affine here in mx.dequantize's order,
 * so values are bit-identical to the oracles) and accumulate x·w in double. Slow on
 * purpose; the fast kernels are tested against it. */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include "io/ggml_quant.h"
#include <string.h>

float cpu_sb_load(tensor_dtype t, const void *p, int64_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
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
    /* GGUF and dense formats: io/ggml_quant.c's dequantizer is the bit-exact one (tested
     * against the gguf package); count elements of one row are contiguous blocks. */
    const uint8_t *row = (const uint8_t *)w->data + n * cpu_weight_row_bytes(w);
    int be = tensor_dtype_block_elems(w->dtype), bb = tensor_dtype_block_bytes(w->dtype);
    if (ggml_dequantize(w->dtype, row + k0 / be * bb, (uint64_t)(count / be) * (uint64_t)bb, out, (uint64_t)count,
                        NULL))
        memset(out, 0, (size_t)count * sizeof *out); /* unreachable: cpu_weight_check accepted w */
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
