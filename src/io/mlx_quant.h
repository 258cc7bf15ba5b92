/* mlx_quant.h: MLX affine quantization: the config ("quantization" or
 * "quantization_config" in config.json, bits 2/3/4/6/8, group_size 32/64/128,
 * per-layer overrides), dequantization of weight/scales/biases triples and
 * quantization of float rows, both bit-exact against mx.dequantize / mx.quantize. */
#ifndef HEARTH_IO_MLX_QUANT_H
#define HEARTH_IO_MLX_QUANT_H
#include "io/tensor.h"
#include <jansson.h>

typedef struct mlxq_override { char *path; int quantized; int bits, group_size; } mlxq_override;

typedef struct mlxq_config {
    int present;          /* config.json has a quantization section */
    int bits, group_size; /* defaults */
    char *mode;           /* "affine" (the only mode supported) */
    mlxq_override *overrides;
    size_t n_overrides;
} mlxq_config;

hearth_status mlxq_config_parse(const json_t *config, const char *fname, mlxq_config *out, hearth_error *err);
void mlxq_config_free(mlxq_config *c);
/* Quantization of the module at `path` (e.g. "model.layers.0.self_attn.q_proj"):
 * returns 1 and fills bits/group_size if quantized, 0 if not. As in mlx-lm, a path the
 * overrides do not name gets the defaults; the caller still checks that
 * "<path>.scales" exists (mlx-lm leaves modules without scales unquantized). */
int mlxq_lookup(const mlxq_config *c, const char *path, int *bits, int *group_size);
/* bits/group_size from the packed shapes and the layer's unquantized input width, as
 * mlx-lm's infer_quant_config does for paths the config does not name. */
hearth_status mlxq_infer(const tensor_info *w, const tensor_info *scales, int64_t in_dims, int *bits,
                         int *group_size, hearth_error *err);
/* Dequantizes a [rows, cols*bits/32] uint32 weight with [rows, cols/group] scales and
 * biases (F32/F16/BF16) to float32 [rows, cols]. Checks every shape and dtype and
 * names the tensor in errors. */
hearth_status mlxq_dequantize(const tensor_info *w, const tensor_info *scales, const tensor_info *biases,
                              int bits, int group_size, float *out, uint64_t out_elems, hearth_error *err);
/* mx.quantize(w, group_size, bits) of a row-major [rows, cols] float matrix. packed: rows x
 * cols*bits/8 bytes (MLX's uint32 words, a little-endian bit stream); scales and biases:
 * rows x cols/group_size, in float32 (mlx then rounds them to the weight's dtype, which the
 * caller does when writing). cols must be a multiple of group_size and of 32. */
void mlxq_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group_size, uint8_t *packed,
                   float *scales, float *biases);
/* The same affine format with each group's (scale, bias) chosen to minimise the squared
 * error of the dequantized group, the scale and bias as stored (rounded to dt: F32, F16
 * or BF16): mx.quantize's pair and least-squares refits from several starting steps are
 * tried, the least error kept, so no group comes out worse than mlxq_quantize's (in
 * float32 arithmetic). Not bit-identical to mx.quantize; mlx-lm loads it the same way. */
void mlxq_quantize_fit(const float *w, int64_t rows, int64_t cols, int bits, int group_size, tensor_dtype dt,
                       uint8_t *packed, float *scales, float *biases);
#endif
