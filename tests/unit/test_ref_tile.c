/* test_ref_tile.c: prefill on the scalar tier (HEARTH_CPU=scalar) goes through
 * cpu_ref_tile, which dequantizes each weight block once per group of tokens. Its promise
 * is bit-identity with the per-token reference (cpu_ref_rows, which test_cpu_matmul.c
 * checks against gguf / mlx fixtures): a T-row cpu_matmul must equal T one-row calls,
 * byte for byte, for every format, odd T and odd row counts, 1 and 2 threads. The one-row
 * reference itself (four rows interleaved, 256 elements per dequantize call) must equal its
 * definition: one block dequantized at a time, x·w summed in double in k order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "base/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float rndf(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* the weights: the fixtures test_cpu_matmul.c reads (made by gguf / mlx) */
static const struct { const char *file; tensor_dtype t; } fixtures[] = {
    {"q4_0", DT_Q4_0}, {"q4_1", DT_Q4_1}, {"q5_0", DT_Q5_0}, {"q5_1", DT_Q5_1}, {"q8_0", DT_Q8_0},
    {"q2_k", DT_Q2_K}, {"q3_k", DT_Q3_K}, {"q4_k", DT_Q4_K}, {"q5_k", DT_Q5_K}, {"q6_k", DT_Q6_K},
    {"mlx2_g32", DT_U32}, {"mlx4_g32", DT_U32}, {"mlx6_g64", DT_U32}, {"mlx8_g64", DT_U32},
};

static uint8_t *load(const char *name, op_weight *w) {
    const char *dir = getenv("HEARTH_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/cpu_quant/%s.bin", dir ? dir : "tests/data", name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("missing fixture %s (run tools/make_cpu_quant_fixtures.py)", path);
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len);
    assert_int_equal(fread(buf, 1, len, f), len);
    fclose(f);
    uint32_t h[3];
    memcpy(h, buf, sizeof h); /* n, k, data bytes; then bits, group, sb type, sb bytes */
    size_t pos = 12;
    w->n = h[0];
    w->k = h[1];
    w->data = buf + pos;
    pos += h[2];
    uint32_t t[4];
    memcpy(t, buf + pos, sizeof t);
    pos += sizeof t;
    w->bits = (int)t[0];
    w->group_size = (int)t[1];
    w->sb_dtype = t[2] == 0 ? DT_F32 : t[2] == 1 ? DT_F16 : DT_BF16;
    w->scales = buf + pos;
    w->biases = buf + pos + t[3];
    return buf;
}

static void test_tile_equals_rows(void **state) {
    assert_int_equal(cpu_matmul_set_level(CPU_LEVEL_SCALAR), CPU_LEVEL_SCALAR);
    threadpool *tps[2];
    for (int i = 0; i < 2; i++) assert_int_equal(tp_create(i + 1, &tps[i], NULL), HEARTH_OK);
    static const int Ts[] = {2, 5, 16, 17, 37};
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        op_weight w = {.dtype = fixtures[f].t};
        uint8_t *buf = load(fixtures[f].file, &w);
        assert_int_equal(op_weight_check(&w, fixtures[f].file, NULL), HEARTH_OK);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            float *x = malloc(sizeof(float) * (size_t)(T * w.k));
            float *y = malloc(sizeof(float) * (size_t)(T * w.n)), *want = malloc(sizeof(float) * (size_t)(T * w.n));
            for (int64_t i = 0; i < T * w.k; i++) x[i] = rndf();
            for (int p = 0; p < 2; p++) {
                for (int t = 0; t < T; t++)
                    assert_int_equal(cpu_matmul(&w, x + t * w.k, 1, want + t * w.n, NULL, 0, tps[p], NULL), HEARTH_OK);
                memset(y, 0xff, sizeof(float) * (size_t)(T * w.n));
                assert_int_equal(cpu_matmul(&w, x, T, y, NULL, 0, tps[p], NULL), HEARTH_OK);
                if (memcmp(y, want, sizeof(float) * (size_t)(T * w.n)))
                    fail_msg("%s T=%d threads=%d: tile differs from per-token reference", fixtures[f].file, T, p + 1);
                /* and straight, on an odd sub-range of rows */
                int64_t n0 = w.n > 2 ? 1 : 0, n1 = w.n;
                memset(y, 0xff, sizeof(float) * (size_t)(T * w.n));
                cpu_ref_tile(&w, n0, n1, x, w.k, T, y, w.n);
                for (int t = 0; t < T; t++)
                    for (int64_t n = n0; n < n1; n++)
                        if (memcmp(&y[t * w.n + n], &want[t * w.n + n], sizeof(float)))
                            fail_msg("%s T=%d: cpu_ref_tile row %lld token %d differs", fixtures[f].file, T,
                                     (long long)n, t);
            }
            free(x);
            free(y);
            free(want);
        }
        free(buf);
    }
    for (int i = 0; i < 2; i++) tp_destroy(tps[i]);
}

/* the definition of the reference: block by block, one row at a time */
static float definition(const op_weight *w, int64_t n, const float *x) {
    int be = w->dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w->dtype);
    float buf[256];
    double acc = 0;
    for (int64_t k0 = 0; k0 < w->k; k0 += be) {
        op_weight_dequant(w, n, k0, be, buf);
        for (int j = 0; j < be; j++) acc += (double)buf[j] * (double)x[k0 + j];
    }
    return (float)acc;
}

static void test_rows_equal_definition(void **state) {
    assert_int_equal(cpu_matmul_set_level(CPU_LEVEL_SCALAR), CPU_LEVEL_SCALAR);
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        op_weight w = {.dtype = fixtures[f].t};
        uint8_t *buf = load(fixtures[f].file, &w);
        float *x = malloc(sizeof(float) * (size_t)w.k), *y = malloc(sizeof(float) * (size_t)w.n);
        for (int64_t i = 0; i < w.k; i++) x[i] = rndf();
        for (int64_t n0 = 0; n0 < 3 && n0 < w.n; n0++) { /* row ranges starting off the 4-row grid */
            memset(y, 0xff, sizeof(float) * (size_t)w.n);
            cpu_ref_rows(&w, n0, w.n, x, y);
            for (int64_t n = n0; n < w.n; n++) {
                float d = definition(&w, n, x);
                if (memcmp(&y[n], &d, sizeof d))
                    fail_msg("%s row %lld (from %lld): %.9g vs definition %.9g", fixtures[f].file, (long long)n,
                             (long long)n0, y[n], d);
            }
        }
        free(x);
        free(y);
        free(buf);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows_equal_definition),
                                       cmocka_unit_test(test_tile_equals_rows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
