/* op_weight.h: one weight matrix as a forward pass sees it, in its native storage format
 * (F32/F16/BF16, GGUF blocks, MLX affine), format-neutral and owned below the model and the
 * backends: the model layer fills it at load, every backend reads it (the CPU in place, the
 * CUDA backend as the source of its device copy). Describes memory; owns none. */
#ifndef HEARTH_OPS_OP_WEIGHT_H
#define HEARTH_OPS_OP_WEIGHT_H
#include "hearth.h"
#include "io/tensor.h"
#include <string.h>
#include <stdint.h>

/* One weight matrix. dtype is the storage format; MLX affine weights use DT_U32 (the
 * packed words) and fill the mlx fields. Rows are contiguous, row n at
 * data + n * op_weight_row_bytes(w). */
typedef struct op_weight {
    tensor_dtype dtype;
    const void *data;
    int64_t n, k;          /* output rows, input columns */
    /* MLX affine only: w = scale * q + bias, per group of group_size columns. */
    int bits;              /* 2, 3, 4, 5, 6, 8 (op_mlx_bits_ok) */
    int group_size;        /* 32, 64, 128 */
    tensor_dtype sb_dtype; /* F32, F16 or BF16 scales and biases, each [n, k / group_size] */
    const void *scales, *biases;
} op_weight;

/* The MLX affine widths hearth runs: 2, 3, 4, 5, 6 and 8 bits (MLX's own set). */
static inline int op_mlx_bits_ok(int bits) { return bits >= 2 && bits <= 8 && bits != 7; }

/* Checks that the description is one the backends handle (format, K a multiple of the
 * block or group, pointers set). The message names `what` (e.g. the tensor name). */
hearth_status op_weight_check(const op_weight *w, const char *what, hearth_error *err);
/* Bytes of one row of packed weight data (0 if the weight is invalid). */
int64_t op_weight_row_bytes(const op_weight *w);
/* Bytes of an MLX affine weight's scales (and as many of its biases): [n, k / group_size]
 * in sb_dtype; 0 for the other formats. */
size_t op_weight_sb_bytes(const op_weight *w);
/* Dequantizes elements [k0, k0 + count) of row n to out, bit-exactly as the format's
 * reference does (GGUF through io/ggml_quant.c, MLX affine in mx.dequantize's order);
 * count <= 256 and k0, count are multiples of the format's block; for MLX affine, inside
 * one group. Scalar: the reference every backend's kernels are checked against. */
void op_weight_dequant(const op_weight *w, int64_t n, int64_t k0, int count, float *out);
/* Dequantizes all k elements of row n to out with op_weight_dequant (bit-exact), a block
 * or group at a time. */
void op_weight_dequant_row(const op_weight *w, int64_t n, float *out);
/* Reads one MLX scale or bias (F32/F16/BF16) by element index. */
float op_sb_load(tensor_dtype t, const void *p, int64_t i);
/* Q3_K: the 16 6-bit sub-block scales (stored + 32, 0..63) from the 12 bytes at offset 96 of
 * a 110-byte super-block, as bytes in sub-block order (word i holds sub-blocks 4i..4i+3). */
static inline void op_q3k_scales(const uint8_t *blk, uint32_t out[4]) {
    uint32_t a0, a1, a2;
    memcpy(&a0, blk + 96, 4);
    memcpy(&a1, blk + 100, 4);
    memcpy(&a2, blk + 104, 4);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    out[0] = (a0 & m4) | ((a2 & m2) << 4);
    out[1] = (a1 & m4) | (((a2 >> 2) & m2) << 4);
    out[2] = ((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4);
    out[3] = ((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4);
}

#endif
