/* cuda_test_model.h: random weights for the CUDA tests that build a whole model through the
 * op tables (test_cuda_gdn, test_cuda_moe_offload): include after cmocka.h and
 * cuda_test_util.h (its rndf stream). Test code only; not a test itself. */
#ifndef HEARTH_TESTS_CUDA_TEST_MODEL_H
#define HEARTH_TESTS_CUDA_TEST_MODEL_H
#include "io/ggml_quant.h"
#include "ops/ops.h"
#include <math.h>
#include <stdlib.h>

static inline float *rnd_floats(size_t n, float scale, float offset) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = offset + scale * rndf();
    return v;
}

/* A weight [n, k] of random values in format dt (F32 or Q8_0 by ggml's reference quantizer);
 * *keep: its bytes, for the caller to free. */
static inline op_weight make_weight(tensor_dtype dt, int64_t n, int64_t k, void **keep) {
    float *f = rnd_floats((size_t)(n * k), 1.0f / sqrtf((float)k) * 1.7f, 0.0f);
    op_weight w = {.dtype = dt, .n = n, .k = k};
    if (dt == DT_F32) {
        *keep = f;
    } else {
        size_t bytes = (size_t)(n * k) / 32 * 34;
        *keep = malloc(bytes);
        assert_int_equal(ggml_quantize(dt, f, (uint64_t)(n * k), *keep, bytes, NULL), HEARTH_OK);
        free(f);
    }
    w.data = *keep;
    return w;
}
#endif
