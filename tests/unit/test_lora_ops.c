/* test_lora_ops.c: op_lora_apply (ops/ops.c), the low-rank update every backend applies
 * after an adapted projection: against a double-precision reference on random ragged
 * batches where rows use one adapter, two summed, a DoRA adapter or none; rows without
 * adapters keep their exact bits; a projection an adapter leaves alone is untouched; the
 * result does not depend on the thread count; routed experts' pairs on gathered rows
 * (op_lora_apply_expert). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h> /* after the headers it needs */

#include "ops/ops.h"

enum { LAYERS = 2, T = 19, K = 24, N = 40 };

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

typedef struct test_adapter {
    op_lora proj[LAYERS * OP_N_PROJ];
    float a[8 * K], b[N * 8], dora[N];
    op_adapter ops;
} test_adapter;

/* An adapter of rank r on projection p of layer 1 only. */
static void make(test_adapter *t, int r, float scale, int dora, op_proj p, uint64_t *seed) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < r * K; i++) t->a[i] = frand(seed);
    for (int i = 0; i < N * r; i++) t->b[i] = frand(seed);
    for (int i = 0; i < N; i++) t->dora[i] = 0.5f + frand(seed);
    t->proj[1 * OP_N_PROJ + p] = (op_lora){.a = t->a, .b = t->b, .rank = r, .scale = scale, .dora = dora ? t->dora : NULL};
    t->ops.proj = t->proj;
}

static double ref_update(const test_adapter *t, op_proj p, const float *x, int j) {
    const op_lora *l = &t->proj[1 * OP_N_PROJ + p];
    if (!l->a) return 0;
    double acc = 0;
    for (int q = 0; q < l->rank; q++) {
        double u = 0;
        for (int i = 0; i < K; i++) u += (double)l->a[q * K + i] * x[i];
        acc += (double)l->b[q * N + j] * u; /* B transposed: [rank, n] */
    }
    return l->scale * acc;
}

static void run(threadpool *tp) {
    uint64_t seed = 42;
    test_adapter A, B, D;
    make(&A, 4, 2.0f, 0, OP_PROJ_V, &seed);
    make(&B, 8, 0.5f, 0, OP_PROJ_V, &seed);
    make(&D, 3, 1.5f, 1, OP_PROJ_V, &seed);
    const op_adapter *only_a[] = {&A.ops}, *a_b[] = {&A.ops, &B.ops}, *only_d[] = {&D.ops};
    op_adapter_set sa = {1, only_a}, sab = {2, a_b}, sd = {1, only_d};
    const op_adapter_set *rows[T];
    for (int t = 0; t < T; t++) rows[t] = t % 4 == 0 ? NULL : t % 4 == 1 ? &sa : t % 4 == 2 ? &sab : &sd;
    float x[T * K], y[T * N], y0[T * N];
    for (int i = 0; i < T * K; i++) x[i] = frand(&seed);
    for (int i = 0; i < T * N; i++) y0[i] = y[i] = frand(&seed);
    op_batch b = {.T = T, .row_adapters = rows};
    /* layer 0 and the q projection of layer 1: no adapter updates them */
    op_lora_apply(&b, 0, OP_PROJ_V, x, K, y, N, tp);
    op_lora_apply(&b, 1, OP_PROJ_Q, x, K, y, N, tp);
    assert_memory_equal(y, y0, sizeof y);
    op_lora_apply(&b, 1, OP_PROJ_V, x, K, y, N, tp);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < N; j++) {
            double want = y0[t * N + j];
            const float *xt = x + t * K;
            if (rows[t] == &sa) want += ref_update(&A, OP_PROJ_V, xt, j);
            if (rows[t] == &sab) want += ref_update(&A, OP_PROJ_V, xt, j) + ref_update(&B, OP_PROJ_V, xt, j);
            if (rows[t] == &sd) want = (want + ref_update(&D, OP_PROJ_V, xt, j)) * D.dora[j];
            if (!rows[t]) /* the base alone: the same bits */
                assert_memory_equal(&y[t * N + j], &y0[t * N + j], sizeof(float));
            /* float32 sums of 24 and 8 products of values < 1: a few ulp of results ~1 */
            assert_true(fabs(y[t * N + j] - want) <= 1e-5 * (1 + fabs(want)));
        }
}

static void test_against_reference(void **state) {
    (void)state;
    run(NULL); /* tp_run without a pool runs inline */
    threadpool *tp;
    assert_int_equal(tp_create(3, &tp, NULL), HEARTH_OK);
    run(tp);
    tp_destroy(tp);
}

static void test_no_adapters(void **state) {
    (void)state;
    float x[K] = {1}, y[N] = {2}, y0[N];
    memcpy(y0, y, sizeof y);
    const op_adapter_set *rows[1] = {NULL};
    op_batch none = {.T = 1, .row_adapters = NULL}, empty = {.T = 1, .row_adapters = rows};
    assert_false(op_batch_has_adapters(&none));
    assert_false(op_batch_has_adapters(&empty));
    op_lora_apply(&none, 0, OP_PROJ_Q, x, K, y, N, NULL);
    op_lora_apply(&empty, 0, OP_PROJ_Q, x, K, y, N, NULL);
    assert_memory_equal(y, y0, sizeof y);
}

/* Routed experts' pairs (op_lora.experts: E stacked pairs) on rows gathered for expert e:
 * row i takes its token tok[i]'s adapters and expert e's pair, against the reference; a
 * token without adapters keeps its row's bits; op_lora_apply leaves such pairs alone;
 * op_batch_adapts tells which projections a step's adapters update. */
static void test_expert_rows(void **state) {
    (void)state;
    enum { E = 3, R = 4, M = 7 };
    uint64_t seed = 7;
    static float a[E * R * K], bt[E * R * N];
    for (int i = 0; i < E * R * K; i++) a[i] = frand(&seed);
    for (int i = 0; i < E * R * N; i++) bt[i] = frand(&seed);
    test_adapter A;
    memset(&A, 0, sizeof A);
    A.proj[1 * OP_N_PROJ + OP_PROJ_EXP_UP] = (op_lora){.a = a, .b = bt, .rank = R, .scale = 0.75f, .experts = E};
    A.ops.proj = A.proj;
    const op_adapter *only[] = {&A.ops};
    op_adapter_set sa = {1, only};
    const op_adapter_set *rows[T];
    for (int t = 0; t < T; t++) rows[t] = t % 3 ? &sa : NULL;
    op_batch b = {.T = T, .row_adapters = rows};
    assert_true(op_batch_adapts(&b, 1, OP_PROJ_EXP_UP));
    assert_false(op_batch_adapts(&b, 1, OP_PROJ_EXP_GATE));
    assert_false(op_batch_adapts(&b, 0, OP_PROJ_EXP_UP));
    int32_t tok[M] = {0, 1, 2, 4, 5, 9, 17};
    float x[M * K], y[M * N], y0[M * N];
    for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
    for (int i = 0; i < M * N; i++) y0[i] = y[i] = frand(&seed);
    op_lora_apply(&b, 1, OP_PROJ_EXP_UP, x, K, y, N, NULL); /* the dense entry point: no expert, no update */
    assert_memory_equal(y, y0, sizeof y);
    for (int e = 0; e < E; e++) {
        memcpy(y, y0, sizeof y);
        op_lora_apply_expert(&b, 1, OP_PROJ_EXP_UP, e, tok, M, x, K, y, N, NULL);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                if (!rows[tok[i]]) {
                    assert_memory_equal(&y[i * N + j], &y0[i * N + j], sizeof(float));
                    continue;
                }
                double acc = 0;
                for (int q = 0; q < R; q++) {
                    double u = 0;
                    for (int k = 0; k < K; k++) u += (double)a[(e * R + q) * K + k] * x[i * K + k];
                    acc += (double)bt[(e * R + q) * N + j] * u;
                }
                double want = y0[i * N + j] + 0.75 * acc;
                assert_true(fabs(y[i * N + j] - want) <= 1e-5 * (1 + fabs(want)));
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_no_adapters),
        cmocka_unit_test(test_expert_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
