/* The host side of the CUDA backend's generic affine layout (cuda_affine.c), on any machine:
 * for every format it takes (MLX 2/3/4/5/6/8-bit with f16, bf16 and f32 scales, GGUF Q5_0,
 * Q5_1, Q2_K, Q3_K, Q5_K), code * scale + bias of each element must equal the CPU reference
 * dequantizer (op_weight_dequant, itself checked against the gguf package and mlx by the
 * parity tests) bit for bit, and the packed planes must give back every code. The device
 * kernels reading these planes are tested against the CPU reference in test_cuda.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_affine.h"
#include "base/half.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* A random weight of format t: random quant bytes, finite f16 scales where the format
 * keeps them (the offsets of each block's d / dmin / m). */
static void *make(tensor_dtype t, int64_t n, int64_t k, int bits, int group, tensor_dtype sb, op_weight *w) {
    *w = (op_weight){.dtype = t, .n = n, .k = k, .bits = bits, .group_size = group, .sb_dtype = sb};
    if (t == DT_U32) {
        size_t code_bytes = (size_t)(n * k) / 8 * (size_t)bits, groups = (size_t)(n * (k / group));
        size_t es = sb == DT_F32 ? 4 : 2;
        uint8_t *d = malloc(code_bytes + 2 * groups * es);
        for (size_t i = 0; i < code_bytes; i++) d[i] = (uint8_t)rnd();
        uint8_t *sc = d + code_bytes, *bi = sc + groups * es;
        for (size_t g = 0; g < groups; g++) {
            float s = rndf() * 0.05f, b = rndf() * 0.5f;
            if (sb == DT_F32) {
                memcpy(sc + 4 * g, &s, 4);
                memcpy(bi + 4 * g, &b, 4);
            } else {
                uint16_t hs = sb == DT_F16 ? f32_to_f16(s) : f32_to_bf16(s), hb = sb == DT_F16 ? f32_to_f16(b) : f32_to_bf16(b);
                memcpy(sc + 2 * g, &hs, 2);
                memcpy(bi + 2 * g, &hb, 2);
            }
        }
        w->data = d, w->scales = sc, w->biases = bi;
        return d;
    }
    int be = tensor_dtype_block_elems(t), bb = tensor_dtype_block_bytes(t);
    size_t blocks = (size_t)(n * (k / be));
    uint8_t *d = malloc(blocks * (size_t)bb);
    for (size_t i = 0; i < blocks * (size_t)bb; i++) d[i] = (uint8_t)rnd();
    static const int offs[][2] = {[DT_Q5_0] = {0, -1}, [DT_Q5_1] = {0, 2}, [DT_Q2_K] = {80, 82}, [DT_Q3_K] = {108, -1},
                                  [DT_Q5_K] = {0, 2}};
    for (size_t b = 0; b < blocks; b++)
        for (int j = 0; j < 2; j++)
            if (offs[t][j] >= 0) {
                uint16_t h = f32_to_f16(rndf() * 0.05f);
                memcpy(d + b * (size_t)bb + offs[t][j], &h, 2);
            }
    w->data = d;
    return d;
}

static void check(tensor_dtype t, int64_t n, int64_t k, int bits, int group, tensor_dtype sbt) {
    op_weight w;
    void *host = make(t, n, k, bits, group, sbt, &w);
    int b = 0, g = 0;
    assert_true(cuda_affine_takes(&w, &b, &g));
    if (t == DT_U32) assert_true(b == bits && g == group);
    uint8_t *codes = malloc((size_t)k), *planes = calloc(cuda_affine_code_bytes(n, k, b), 1);
    float *sb = malloc((size_t)(k / g) * 2 * sizeof(float)), *ref = malloc((size_t)k * sizeof(float));
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        cuda_affine_row(&w, r, b, g, codes, sb);
        cuda_affine_pack_row(codes, n, k, b, r, planes);
        int step = t == DT_U32 ? group : 256; /* one reference call stays inside one MLX group */
        for (int64_t c0 = 0; c0 < k; c0 += step) op_weight_dequant(&w, r, c0, step, ref + c0);
        for (int64_t c = 0; c < k; c++) {
            assert_true(codes[c] < (1u << b));
            float a = (float)codes[c] * sb[2 * (c / g)], v = a + sb[2 * (c / g) + 1];
            if (v != ref[c] && bad++ < 5) /* equal values (a zero may differ in sign only) */
                print_error("%s bits %d group %d (%lld, %lld): code %d * %g + %g = %.9g, reference %.9g\n",
                            tensor_dtype_name(t), b, g, (long long)r, (long long)c, codes[c], sb[2 * (c / g)],
                            sb[2 * (c / g) + 1], v, ref[c]);
        }
    }
    assert_int_equal(bad, 0);
    for (int64_t r = 0; r < n; r++) { /* the planes give every code back (rows packed in any order) */
        cuda_affine_row(&w, r, b, g, codes, sb);
        for (int64_t c = 0; c < k; c++) assert_int_equal(cuda_affine_code(planes, n, k, b, r, c), codes[c]);
    }
    free(codes), free(planes), free(sb), free(ref), free(host);
}

static void test_formats_match_reference(void **state) {
    (void)state;
    static const tensor_dtype gguf[] = {DT_Q5_0, DT_Q5_1, DT_Q2_K, DT_Q3_K, DT_Q5_K};
    for (size_t i = 0; i < sizeof gguf / sizeof gguf[0]; i++) {
        check(gguf[i], 3, 256, 0, 0, DT_F16);
        check(gguf[i], 5, 768, 0, 0, DT_F16);
    }
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {16, 32, 64, 128};
    static const tensor_dtype sbs[] = {DT_F16, DT_BF16, DT_F32};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) check(DT_U32, 3, 384, bits[i], groups[j], sbs[(i + j) % 3]);
}

static void test_takes(void **state) {
    (void)state;
    op_weight w = {.dtype = DT_Q5_K, .n = 4, .k = 256};
    int b, g;
    assert_true(cuda_affine_takes(&w, &b, &g) && b == 5 && g == 32);
    w.k = 288; /* not whole super-blocks */
    assert_false(cuda_affine_takes(&w, NULL, NULL));
    w = (op_weight){.dtype = DT_Q3_K, .n = 4, .k = 512};
    assert_true(cuda_affine_takes(&w, &b, &g) && b == 3 && g == 16);
    w = (op_weight){.dtype = DT_U32, .n = 4, .k = 96, .bits = 8, .group_size = 48, .sb_dtype = DT_F16};
    assert_false(cuda_affine_takes(&w, NULL, NULL)); /* a group the kernels have no instance for (16, 32, 64, 128) */
    w.group_size = 32;
    assert_true(cuda_affine_takes(&w, &b, &g) && b == 8 && g == 32);
    w.k = 80; /* k % 32 != 0 */
    w.group_size = 16;
    assert_false(cuda_affine_takes(&w, NULL, NULL));
    w = (op_weight){.dtype = DT_Q8_0, .n = 4, .k = 256}; /* has its own kernels */
    assert_false(cuda_affine_takes(&w, NULL, NULL));
    assert_int_equal(cuda_affine_code_bytes(4, 256, 6), 4 * 256 * 6 / 8);
    assert_int_equal(cuda_affine_pair_bytes(4, 256, 16), 4 * 16 * 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_formats_match_reference), cmocka_unit_test(test_takes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
