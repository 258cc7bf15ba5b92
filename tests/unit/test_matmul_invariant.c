/* test_matmul_invariant.c: the promise deterministic mode rests on (cpu_matmul_invariant):
 * row t of a T-row matmul is bit-identical to a T = 1 call on that row alone, for every
 * weight format with a fast kernel, T in {2, 5, 16, 37}, 1 to 3 threads, at every ISA
 * level this machine has. Random weight bytes (scale fields set to finite f16 values). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* Byte offsets of the f16 scale fields per GGUF block (gguf-py quants.py layouts): random
 * bytes there could be NaN or huge. */
static const struct { tensor_dtype t; int f16[2], n_f16; } formats[] = {
    {DT_Q4_0, {0}, 1}, {DT_Q4_1, {0, 2}, 2}, {DT_Q5_0, {0}, 1}, {DT_Q5_1, {0, 2}, 2}, {DT_Q8_0, {0}, 1},
    {DT_Q2_K, {80, 82}, 2}, {DT_Q3_K, {108}, 1}, {DT_Q4_K, {0, 2}, 2}, {DT_Q5_K, {0, 2}, 2}, {DT_Q6_K, {208}, 1},
    {DT_F32, {0}, 0}, {DT_F16, {0}, 0}, {DT_BF16, {0}, 0}, {DT_U32, {0}, 0} /* MLX 4-bit, group 64 */
};

#define N_ROWS 200 /* not a multiple of the kernels' 4-row tiles nor of the 16-row task unit */
#define K_COLS 512

static void *make_weight(tensor_dtype t, const int *f16, int n_f16, op_weight *w, float **sb) {
    memset(w, 0, sizeof *w);
    w->dtype = t, w->n = N_ROWS, w->k = K_COLS;
    *sb = NULL;
    if (t == DT_U32) {
        w->bits = 4, w->group_size = 64, w->sb_dtype = DT_F32;
        size_t ng = (size_t)N_ROWS * K_COLS / 64;
        *sb = malloc(2 * ng * sizeof(float));
        for (size_t i = 0; i < 2 * ng; i++) (*sb)[i] = rndf() * 0.1f;
        w->scales = *sb, w->biases = *sb + ng;
    }
    size_t bytes = (size_t)op_weight_row_bytes(w) * N_ROWS;
    uint8_t *d = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)rnd();
    if (t == DT_F32)
        for (size_t i = 0; i < bytes / 4; i++) ((float *)d)[i] = rndf();
    if (t == DT_F16 || t == DT_BF16)
        for (size_t i = 0; i < bytes / 2; i++) {
            uint16_t h = t == DT_F16 ? f32_to_f16(rndf()) : f32_to_bf16(rndf());
            memcpy(d + 2 * i, &h, 2);
        }
    int bb = tensor_dtype_block_bytes(t);
    for (int j = 0; j < n_f16; j++)
        for (size_t b = 0; b + (size_t)bb <= bytes; b += (size_t)bb) {
            uint16_t h = f32_to_f16(0.01f + 0.02f * (float)(rnd() % 100) / 100.0f);
            memcpy(d + b + f16[j], &h, 2);
        }
    w->data = d;
    return d;
}

static void check_level(cpu_level level) {
    cpu_matmul_set_level(level);
    threadpool *tp[4] = {NULL};
    for (int th = 1; th <= 3; th++) assert_int_equal(tp_create(th, &tp[th], NULL), HEARTH_OK);
    int Ts[] = {2, 5, 16, 37};
    float *x = malloc(37 * K_COLS * sizeof(float)), *y = malloc(37 * N_ROWS * sizeof(float));
    float *y1 = malloc(N_ROWS * sizeof(float));
    /* the largest activation scratch any format asks for at T = 37 (BF16 on AVX512_BF16: the
     * rows rounded to bf16, 2 bytes per value; the int8 formats: a q8 block per 32 values) */
    size_t ss = 37 * (size_t)K_COLS * 2;
    if (ss < 37 * (K_COLS / 32) * sizeof(cpu_q8_block)) ss = 37 * (K_COLS / 32) * sizeof(cpu_q8_block);
    void *scratch = malloc(ss);
    for (int i = 0; i < 37 * K_COLS; i++) x[i] = rndf() * (i % 97 == 0 ? 8.0f : 1.0f); /* a few outliers */
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        op_weight w;
        float *sb;
        void *d = make_weight(formats[f].t, formats[f].f16, formats[f].n_f16, &w, &sb);
        assert_true(cpu_matmul_scratch_size(&w, 37) <= ss);
        for (int th = 1; th <= 3; th++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                int T = Ts[ti];
                assert_int_equal(cpu_matmul_invariant(&w, x, T, y, scratch, ss, tp[th], NULL), HEARTH_OK);
                for (int t = 0; t < T; t++) {
                    assert_int_equal(cpu_matmul(&w, x + (size_t)t * K_COLS, 1, y1, scratch, ss, tp[th], NULL),
                                     HEARTH_OK);
                    if (memcmp(y1, y + (size_t)t * N_ROWS, N_ROWS * sizeof(float)))
                        fail_msg("%s at level %s, %d threads, T=%d: row %d differs from its T=1 result",
                                 tensor_dtype_name(w.dtype), cpu_level_name(level), th, T, t);
                }
            }
        free(d);
        free(sb);
    }
    free(x), free(y), free(y1), free(scratch);
    for (int th = 1; th <= 3; th++) tp_destroy(tp[th]);
}

static void test_invariant_every_level(void **state) {
    (void)state;
    cpu_level hw = cpu_level_hardware();
    for (int l = CPU_LEVEL_SCALAR; l <= (int)hw; l++) check_level((cpu_level)l);
    cpu_matmul_set_level(hw);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_invariant_every_level)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
