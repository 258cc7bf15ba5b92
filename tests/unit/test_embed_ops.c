/* test_embed_ops.c: the encoder ops (ops_encoder.h) against double-precision definitions:
 * LayerNorm (torch's biased variance), erf GELU, and bidirectional attention over a ragged
 * batch, including that one sequence's output does not depend on another's values and
 * that the thread pool's split gives the same result as one thread. */
// clang-format off: cmocka.h needs these first
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_encoder.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_layernorm(void **state) {
    (void)state;
    enum { T = 3, N = 37 };
    float x[T * N], w[N], b[N], out[T * N];
    unsigned s = 1;
    for (int i = 0; i < T * N; i++) x[i] = 10.0f + 3.0f * frand(&s); /* a large mean, as residual streams have */
    for (int i = 0; i < N; i++) w[i] = frand(&s), b[i] = frand(&s);
    ops_layernorm(out, x, w, b, T, N, 1e-12f);
    for (int t = 0; t < T; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < N; i++) m += x[t * N + i];
        m /= N;
        for (int i = 0; i < N; i++) v += (x[t * N + i] - m) * (x[t * N + i] - m);
        v /= N;
        for (int i = 0; i < N; i++) {
            double want = (x[t * N + i] - m) / sqrt(v + 1e-12) * w[i] + b[i];
            assert_true(fabs(out[t * N + i] - want) < 1e-5); /* float rounding of O(1) values */
        }
    }
    ops_layernorm(x, x, w, b, T, N, 1e-12f); /* in place gives the same */
    assert_memory_equal(x, out, sizeof out);
}

static void test_gelu_erf(void **state) {
    (void)state;
    float x[9] = {-6, -3, -1, -0.5f, 0, 0.5f, 1, 3, 6};
    float y[9];
    memcpy(y, x, sizeof x);
    ops_gelu_erf(y, 9);
    for (int i = 0; i < 9; i++) {
        double want = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
        assert_true(fabs(y[i] - want) < 1e-6);
    }
}

enum { HEADS = 3, DIM = 8, W = HEADS * DIM };

static void reference(const float *q, const float *k, const float *v, const int32_t *start, int n, float *out) {
    for (int s = 0; s < n; s++)
        for (int h = 0; h < HEADS; h++)
            for (int i = start[s]; i < start[s + 1]; i++) {
                double p[64], mx = -1e300, sum = 0;
                for (int j = start[s]; j < start[s + 1]; j++) {
                    double d = 0;
                    for (int c = 0; c < DIM; c++) d += (double)q[i * W + h * DIM + c] * k[j * W + h * DIM + c];
                    p[j - start[s]] = d / sqrt(DIM);
                    if (p[j - start[s]] > mx) mx = p[j - start[s]];
                }
                for (int j = 0; j < start[s + 1] - start[s]; j++) sum += (p[j] = exp(p[j] - mx));
                for (int c = 0; c < DIM; c++) {
                    double o = 0;
                    for (int j = start[s]; j < start[s + 1]; j++) o += p[j - start[s]] / sum * v[j * W + h * DIM + c];
                    out[i * W + h * DIM + c] = (float)o;
                }
            }
}

static void test_bidir_attention(void **state) {
    (void)state;
    int32_t start[] = {0, 1, 6, 23}; /* ragged: 1, 5 and 17 tokens */
    enum { T = 23 };
    float q[T * W], k[T * W], v[T * W], out[T * W], out2[T * W], want[T * W], scratch[4 * 17];
    unsigned s = 7;
    for (int i = 0; i < T * W; i++) q[i] = 2 * frand(&s), k[i] = 2 * frand(&s), v[i] = frand(&s);
    ops_bidir_args a = {.q = q,
                        .k = k,
                        .v = v,
                        .out = out,
                        .seq_start = start,
                        .n_seqs = 3,
                        .n_heads = HEADS,
                        .head_dim = DIM,
                        .max_len = 17,
                        .scale = 1.0f / sqrtf(DIM),
                        .scratch = scratch};
    ops_attention_bidir(&a, NULL);
    reference(q, k, v, start, 3, want);
    for (int i = 0; i < T * W; i++) assert_true(fabs(out[i] - want[i]) < 1e-5);
    /* the thread pool's split is the same arithmetic per (sequence, head) */
    threadpool *tp;
    assert_int_equal(tp_create(4, &tp, NULL), HEARTH_OK);
    a.out = out2;
    ops_attention_bidir(&a, tp);
    assert_memory_equal(out, out2, sizeof out);
    /* changing the last sequence leaves the first two untouched: the padding mask */
    for (int i = start[2] * W; i < T * W; i++) k[i] += 1.0f, v[i] -= 0.5f;
    ops_attention_bidir(&a, tp);
    assert_memory_equal(out, out2, (size_t)start[2] * W * sizeof(float));
    tp_destroy(tp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_bidir_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
