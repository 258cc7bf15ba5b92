/* ggml_quant.h: dequantization of GGUF tensor data (F32, F16, BF16 and the block
 * formats Q4_0..Q8_0, Q2_K..Q6_K) to float32, bit-exact against the gguf package's
 * numpy dequantizers. Scalar reference code; fast kernels live in backend/cpu. */
#ifndef HEARTH_IO_GGML_QUANT_H
#define HEARTH_IO_GGML_QUANT_H
#include "io/tensor.h"

/* Dequantizes n elements (a multiple of the block size) from src (nbytes long) to dst.
 * Fails cleanly if nbytes is too small or the dtype is not a GGUF type. */
hearth_status ggml_dequantize(tensor_dtype t, const void *src, uint64_t nbytes, float *dst, uint64_t n,
                              hearth_error *err);
/* Quantizes n floats into dst (reference quantizers: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, and Q4_K, Q6_K as llama.cpp without an importance matrix); other types fail
 * with HEARTH_ERR_UNSUPPORTED. */
hearth_status ggml_quantize(tensor_dtype t, const float *src, uint64_t n, void *dst, uint64_t nbytes,
                            hearth_error *err);
#endif
