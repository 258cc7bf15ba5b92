/* op_weight.c: what every backend needs to know of a weight format, in plain C: row
 * sizes, the check that a description is one hearth runs, and the scalar dequantizer that
 * is the bit-exact reference (and makes embedding rows on every backend). No SIMD here. */
#include "ops/op_weight.h"
#include "base/err.h"
#include "base/half.h"
#include "io/ggml_quant.h"

static int is_mlx(const op_weight *w) { return w->dtype == DT_U32; }

size_t op_weight_sb_bytes(const op_weight *w) {
    if (w->dtype != DT_U32 || w->group_size <= 0) return 0;
    return (size_t)w->n * (size_t)(w->k / w->group_size) * (w->sb_dtype == DT_F32 ? 4u : 2u);
}

int64_t op_weight_row_bytes(const op_weight *w) {
    if (w->k <= 0) return 0;
    if (is_mlx(w)) return w->k * w->bits / 8; /* k is a multiple of 32: whole words */
    int be = tensor_dtype_block_elems(w->dtype), bb = tensor_dtype_block_bytes(w->dtype);
    if (be <= 0 || w->k % be) return 0;
    return w->k / be * bb;
}

hearth_status op_weight_check(const op_weight *w, const char *what, hearth_error *err) {
    if (!what) what = "weight";
    /* 2^40 elements per side is far beyond any model and keeps n * row_bytes in int64. */
    if (w->n <= 0 || w->k <= 0 || w->n > ((int64_t)1 << 40) || w->k > ((int64_t)1 << 40))
        return err_set(err, HEARTH_ERR_INVALID, "%s: bad shape [%lld, %lld]", what, (long long)w->n,
                       (long long)w->k);
    if (!w->data) return err_set(err, HEARTH_ERR_INVALID, "%s: no data", what);
    if (is_mlx(w)) {
        if (!op_mlx_bits_ok(w->bits))
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: MLX affine bits %d (want 2, 3, 4, 5, 6 or 8)", what,
                           w->bits);
        if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: MLX group size %d (want 32, 64 or 128)", what,
                           w->group_size);
        if (w->k % w->group_size)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: %lld columns is not a multiple of group size %d", what,
                           (long long)w->k, w->group_size);
        if (w->sb_dtype != DT_F32 && w->sb_dtype != DT_F16 && w->sb_dtype != DT_BF16)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: scales/biases dtype %s (want F32, F16, BF16)",
                           what, tensor_dtype_name(w->sb_dtype));
        if (!w->scales || !w->biases) return err_set(err, HEARTH_ERR_INVALID, "%s: no scales/biases", what);
        return HEARTH_OK;
    }
    switch (w->dtype) {
    case DT_F32: case DT_F16: case DT_BF16: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1:
    case DT_Q8_0: case DT_Q2_K: case DT_Q3_K: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: break;
    default:
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: no matmul for dtype %s", what,
                       tensor_dtype_name(w->dtype));
    }
    int be = tensor_dtype_block_elems(w->dtype);
    if (w->k % be)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %lld columns is not a multiple of the %s block (%d)", what,
                       (long long)w->k, tensor_dtype_name(w->dtype), be);
    return HEARTH_OK;
}


float op_sb_load(tensor_dtype t, const void *p, int64_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* MLX affine: element j of a row sits at bits [j*bits, (j+1)*bits) of the row's
 * little-endian bit stream (for 4 bits: bits 4*(j%8) of word j/8). */
static void dq_mlx(const op_weight *w, int64_t n, int64_t k0, int count, float *o) {
    const uint8_t *row = (const uint8_t *)w->data + n * op_weight_row_bytes(w);
    int64_t gi = n * (w->k / w->group_size) + k0 / w->group_size;
    float s = op_sb_load(w->sb_dtype, w->scales, gi), bias = op_sb_load(w->sb_dtype, w->biases, gi);
    uint32_t mask = (1u << w->bits) - 1;
    for (int j = 0; j < count; j++) {
        uint64_t bit = (uint64_t)(k0 + j) * (uint64_t)w->bits;
        const uint8_t *p = row + bit / 8;
        uint32_t v = p[0] | (bit % 8 + w->bits > 8 ? (uint32_t)p[1] << 8 : 0);
        o[j] = s * (float)((v >> (bit % 8)) & mask) + bias;
    }
}

void op_weight_dequant(const op_weight *w, int64_t n, int64_t k0, int count, float *out) {
    if (w->dtype == DT_U32) {
        dq_mlx(w, n, k0, count, out);
        return;
    }
    /* GGUF and dense formats: io/ggml_quant.c's dequantizer is the bit-exact one (tested
     * against the gguf package); count elements of one row are contiguous blocks. */
    const uint8_t *row = (const uint8_t *)w->data + n * op_weight_row_bytes(w);
    int be = tensor_dtype_block_elems(w->dtype), bb = tensor_dtype_block_bytes(w->dtype);
    if (ggml_dequantize(w->dtype, row + k0 / be * bb, (uint64_t)(count / be) * (uint64_t)bb, out, (uint64_t)count,
                        NULL))
        memset(out, 0, (size_t)count * sizeof *out); /* unreachable: op_weight_check accepted w */
}



void op_weight_dequant_row(const op_weight *w, int64_t n, float *out) {
    /* MLX groups are at least 32 wide, so 32 columns never cross one */
    int chunk = w->dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w->dtype);
    if (chunk <= 1) chunk = 256;
    for (int64_t k0 = 0; k0 < w->k; k0 += chunk) {
        int count = (int)(w->k - k0 < chunk ? w->k - k0 : chunk);
        op_weight_dequant(w, n, k0, count, out + k0);
    }
}
