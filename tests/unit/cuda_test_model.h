/* cuda_test_model.h: random weights for the CUDA tests that build a whole model through the
 * op tables (test_cuda_gdn, test_cuda_moe_offload): include after cmocka.h and
 * cuda_test_util.h (its rndf stream). Test code only; not a test itself. */
#ifndef HEARTH_TESTS_CUDA_TEST_MODEL_H
#define HEARTH_TESTS_CUDA_TEST_MODEL_H
#include "io/ggml_quant.h"
#include "ops/op_weight.h"
#include "ops/ops.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float *rnd_floats(size_t n, float scale, float offset) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = offset + scale * rndf();
    return v;
}

/* A weight [n, k] of random values in format dt (F32, or a GGUF block format ggml_quantize
 * writes: Q8_0, Q5_0, Q4_K, Q6_K...); *keep: its bytes, for the caller to free. */
static inline op_weight make_weight(tensor_dtype dt, int64_t n, int64_t k, void **keep) {
    float *f = rnd_floats((size_t)(n * k), 1.0f / sqrtf((float)k) * 1.7f, 0.0f);
    op_weight w = {.dtype = dt, .n = n, .k = k};
    if (dt == DT_F32) {
        *keep = f;
    } else {
        size_t bytes = (size_t)(n * op_weight_row_bytes(&w));
        *keep = malloc(bytes);
        assert_int_equal(ggml_quantize(dt, f, (uint64_t)(n * k), *keep, bytes, NULL), HEARTH_OK);
        free(f);
    }
    w.data = *keep;
    return w;
}

/* An MLX affine 4-bit weight [n, k] (group 64, bf16 scales and biases): random codes, scales
 * around 1.7 / sqrt(k) / 4.6 (the codes' spread) and biases centring them; *keep: one block
 * holding words, scales and biases, for the caller to free. */
static inline op_weight make_weight_mlx4(int64_t n, int64_t k, void **keep) {
    size_t words = (size_t)(n * k / 8), groups = (size_t)(n * k / 64);
    uint8_t *b = malloc(words * 4 + 2 * groups * 2);
    for (size_t i = 0; i < words * 4; i++) b[i] = (uint8_t)(rndf() * 127.0f + 128.0f);
    uint16_t *sc = (uint16_t *)(b + words * 4), *bi = sc + groups;
    for (size_t g = 0; g < groups; g++) {
        float s = (0.75f + 0.25f * rndf()) * 1.7f / sqrtf((float)k) / 4.6f, bias = -7.5f * s;
        uint32_t u, v;
        memcpy(&u, &s, 4);
        memcpy(&v, &bias, 4);
        sc[g] = (uint16_t)(u >> 16), bi[g] = (uint16_t)(v >> 16); /* truncated to bf16: any value is valid */
    }
    *keep = b;
    return (op_weight){.dtype = DT_U32,
                       .data = b,
                       .n = n,
                       .k = k,
                       .bits = 4,
                       .group_size = 64,
                       .sb_dtype = DT_BF16,
                       .scales = sc,
                       .biases = bi};
}
#endif
