/* test_kv_quant.c: int8 KV storage (kv_store, kv_bytes_quant) and attention over it.
 * (1) a stored row dequantizes to within half a quantization step of the input;
 * (2) attention over an int8 pool equals attention over a float pool holding the same
 *     dequantized values (scale * q), at every ISA level this machine has, for ragged
 *     batches over two sequences, grouped heads, a sliding window and head sizes with
 *     vector tails: int8 reading is exactly dequantization, nothing more;
 * (3) the byte counts the fit prediction uses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/cpu_features.h"
#include "backend/cpu/cpu_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x1234abcd5678ef01ull;
static float rndf(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void test_store_roundtrip(void **state) {
    (void)state;
    kv_cache kv;
    assert_int_equal(kv_create_quant(&kv, 2, 2, 40, 1, 64, 4, HEARTH_KV_INT8, NULL), HEARTH_OK);
    assert_null(kv.k);
    assert_int_equal(kv_reserve(&kv, 0, 20, NULL), HEARTH_OK);
    float k[40], v[40], zero[40] = {0};
    for (int p = 0; p < 20; p++) {
        for (int i = 0; i < 40; i++) k[i] = rndf() * (p + 1), v[i] = rndf() * (i == 7 ? 50.0f : 1.0f);
        kv_store(&kv, 1, 0, p, 1, k, p == 3 ? zero : v);
        size_t row = kv_row(&kv, 1, 0, p, 1);
        float ks = kv.k_scale[row], vs = kv.v_scale[row];
        for (int i = 0; i < 40; i++) {
            /* half a step, plus float rounding of x / s */
            assert_true(fabsf(ks * kv.k8[row * 40 + i] - k[i]) <= ks * 0.5f * 1.0001f);
            if (p == 3) assert_true(vs == 0 && kv.v8[row * 40 + i] == 0);
            else assert_true(fabsf(vs * kv.v8[row * 40 + i] - v[i]) <= vs * 0.5f * 1.0001f);
        }
    }
    kv_destroy(&kv);
    assert_int_equal(kv_create_quant(&kv, 1, 1, 8, 1, 16, 1, 7, NULL), HEARTH_ERR_INVALID);
}

static void test_bytes(void **state) {
    (void)state;
    /* 3 layers, 2 heads, head_dim 64, 10 blocks: rows = 3 * 10 * 2 * 16 = 960 per K or V */
    assert_int_equal(kv_storage_bytes(3, 2, 64, 10, HEARTH_KV_FLOAT), 2 * 960 * 64 * 4);
    assert_int_equal(kv_storage_bytes(3, 2, 64, 10, HEARTH_KV_INT8), 2 * 960 * (64 + 4));
    assert_int_equal(kv_bytes(3, 2, 64, 2, 100, 10) - kv_bytes_quant(3, 2, 64, 2, 100, 10, HEARTH_KV_INT8),
                     2 * 960 * (64 * 4 - 68));
    assert_int_equal(kv_bytes_quant(3, 2, 64, 2, 100, 10, HEARTH_KV_FLOAT), kv_bytes(3, 2, 64, 2, 100, 10));
}

/* One ragged step: T tokens over two sequences (slot 0 at positions 0..39, slot 1 at
 * 0..22, the step's tokens being the last few of each), attention at layer 1. */
static void attention_pair(int head_dim, int window) {
    enum { LAYERS = 2, KVH = 2, HEADS = 4, SLOTS = 2, CTX = 64, BLOCKS = 8, T = 5 };
    kv_cache q8, f;
    assert_int_equal(kv_create_quant(&q8, LAYERS, KVH, head_dim, SLOTS, CTX, BLOCKS, HEARTH_KV_INT8, NULL), HEARTH_OK);
    assert_int_equal(kv_create(&f, LAYERS, KVH, head_dim, SLOTS, CTX, BLOCKS, NULL), HEARTH_OK);
    int len[SLOTS] = {40, 23};
    float *k = malloc((size_t)head_dim * sizeof(float)), *v = malloc((size_t)head_dim * sizeof(float));
    for (int s = 0; s < SLOTS; s++) {
        assert_int_equal(kv_reserve(&q8, s, len[s], NULL), HEARTH_OK);
        assert_int_equal(kv_reserve(&f, s, len[s], NULL), HEARTH_OK);
        for (int p = 0; p < len[s]; p++)
            for (int h = 0; h < KVH; h++) {
                for (int i = 0; i < head_dim; i++) k[i] = rndf() * 2, v[i] = rndf();
                kv_store(&q8, 1, s, p, h, k, v);
                size_t row = kv_row(&q8, 1, s, p, h);
                for (int i = 0; i < head_dim; i++) { /* the float pool holds the dequantized values */
                    k[i] = q8.k_scale[row] * q8.k8[row * head_dim + i];
                    v[i] = q8.v_scale[row] * q8.v8[row * head_dim + i];
                }
                kv_store(&f, 1, s, p, h, k, v);
            }
    }
    int32_t pos[T] = {37, 38, 39, 21, 22}, slot[T] = {0, 0, 0, 1, 1};
    size_t qn = (size_t)T * HEADS * head_dim;
    float *q = malloc(qn * sizeof(float)), *out_q8 = malloc(qn * sizeof(float)), *out_f = malloc(qn * sizeof(float));
    float *scratch = malloc(2 * ops_attention_scratch(&f) * sizeof(float));
    for (size_t i = 0; i < qn; i++) q[i] = rndf();
    threadpool *tp;
    assert_int_equal(tp_create(2, &tp, NULL), HEARTH_OK);
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    for (int l = 0; l <= (int)cpu_level_hardware(); l++) {
        setenv("HEARTH_CPU", levels[l], 1);
        ops_attention_args a = {.kv = &q8, .layer = 1, .q = q, .out = out_q8, .T = T, .n_heads = HEADS,
                                .n_kv_heads = KVH, .head_dim = head_dim, .pos = pos, .slot = slot, .window = window,
                                .scale = 0.125f, .scratch = scratch};
        ops_attention(&a, tp);
        a.kv = &f, a.out = out_f;
        ops_attention(&a, tp);
        /* same values, different order of rounding (scale applied after the dot product):
         * a few float32 ulps of outputs that are convex combinations of values <= 1 */
        for (size_t i = 0; i < qn; i++)
            if (fabsf(out_q8[i] - out_f[i]) > 1e-5f)
                fail_msg("level %s head_dim %d window %d: out[%zu] %g vs float %g", levels[l], head_dim, window, i,
                         out_q8[i], out_f[i]);
    }
    unsetenv("HEARTH_CPU");
    tp_destroy(tp);
    free(q), free(out_q8), free(out_f), free(scratch), free(k), free(v);
    kv_destroy(&q8);
    kv_destroy(&f);
}

static void test_attention_int8_equals_dequantized(void **state) {
    (void)state;
    int dims[] = {64, 72, 256, 13};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        attention_pair(dims[i], 0);
        attention_pair(dims[i], 9);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_roundtrip),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_attention_int8_equals_dequantized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
