/* test_train_gemm.c: tr_gemm (src/train/train_gemm.c), the packed float32 product under
 * hearth train, against a double-precision triple loop: every layout of A and B (row- and
 * column-major, so the register transposes and their scalar edges run), ragged shapes
 * around the 8 x 48 tile, 16-wide transpose blocks and the 512-deep K blocks, a K packed in
 * slabs, a product of a few columns (run transposed), accumulate,
 * the causal flags (outputs above the diagonal never compared, zeros promised where A is
 * zero), batches (each product as a call of its own), one and two threads, and each ISA tier HEARTH_CPU can select.
 * Tolerance: 1e-5 of the sum of |terms| of each output (float32 rounding of a sum of K products). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train/train_ops.h"

static uint64_t seed = 0x243f6a8885a308d3ull;
static float rnd(void) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return (float)(seed % 20001) / 10000.0f - 1.0f;
}

/* C = A B (+ C) for one shape and layout, compared in full. */
static void check(threadpool *tp, int64_t M, int64_t N, int64_t K, int a_cols, int b_cols, int flags) {
    int64_t sam = a_cols ? 1 : K, sak = a_cols ? M : 1, sbk = b_cols ? 1 : N, sbn = b_cols ? K : 1, ldc = N + 3;
    float *a = malloc(sizeof(float) * (size_t)(M * K + 1)), *b = malloc(sizeof(float) * (size_t)(K * N + 1));
    float *c = malloc(sizeof(float) * (size_t)(M * ldc + 1)), *c0 = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            int zero = (flags & TR_GEMM_K_LE_M && k > m) || (flags & TR_GEMM_K_GE_M && k < m);
            a[m * sam + k * sak] = zero ? 0.0f : rnd();
        }
    for (int64_t i = 0; i < K * N; i++) b[i] = rnd();
    for (int64_t i = 0; i < M * ldc; i++) c[i] = c0[i] = rnd();
    tr_gemm(tp, M, N, K, a, sam, sak, b, sbk, sbn, c, ldc, flags);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            if (flags & TR_GEMM_CAUSAL && n > m) continue;
            double r = flags & TR_GEMM_ACC ? c0[m * ldc + n] : 0, mag = fabs(r);
            for (int64_t k = 0; k < K; k++) {
                double t = (double)a[m * sam + k * sak] * b[k * sbk + n * sbn];
                r += t, mag += fabs(t);
            }
            if (!(fabs(c[m * ldc + n] - r) <= 1e-5 * (mag + 1e-30)))
                fail_msg("M %lld N %lld K %lld layout %d%d flags %d: C[%lld][%lld] = %.9g, want %.9g", (long long)M,
                         (long long)N, (long long)K, a_cols, b_cols, flags, (long long)m, (long long)n,
                         c[m * ldc + n], r);
        }
        for (int64_t n = N; n < ldc; n++) /* past the row's N columns: untouched */
            if (c[m * ldc + n] != c0[m * ldc + n]) fail_msg("C[%lld][%lld] past N was written", (long long)m, (long long)n);
    }
    free(a), free(b), free(c), free(c0);
}

static void run_shapes(threadpool *tp) {
    /* the last two: a few columns, run as C^T */
    static const int64_t shapes[][3] = {{1, 1, 1},       {7, 47, 5},    {8, 48, 16},   {9, 49, 17},
                                        {16, 96, 33},    {33, 17, 64},  {64, 200, 31}, {100, 50, 520},
                                        {24, 130, 1100}, {520, 8, 600}, {100, 13, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int lay = 0; lay < 4; lay++)
            for (int acc = 0; acc < 2; acc++)
                check(tp, shapes[s][0], shapes[s][1], shapes[s][2], lay & 1, lay >> 1, acc ? TR_GEMM_ACC : 0);
    /* a K long enough for this M to be packed in slabs (512 + 512 + 276: the cross-entropy's
     * input gradient against the vocabulary is one of these) */
    for (int lay = 0; lay < 4; lay += 3)
        for (int acc = 0; acc < 2; acc++) check(tp, 1100, 20, 1300, lay & 1, lay >> 1, acc ? TR_GEMM_ACC : 0);
    /* attention's square products, as tr_attn_fwd / tr_attn_bwd call them */
    static const int64_t T[] = {1, 9, 50, 97, 530};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        check(tp, T[i], T[i], 24, 0, 1, TR_GEMM_CAUSAL);
        check(tp, T[i], 24, T[i], 0, 0, TR_GEMM_K_LE_M);
        check(tp, T[i], 70, T[i], 1, 0, TR_GEMM_K_GE_M);
        check(tp, T[i], 70, T[i], 1, 0, TR_GEMM_K_GE_M | TR_GEMM_ACC);
    }
}

/* A batch (b shared by pairs of products, as query heads share a KV head) gives each
 * product exactly what a call of its own gives. */
static void check_batch(threadpool *tp) {
    int64_t M = 37, N = 53, K = 70, batch = 5;
    float *a = malloc(sizeof(float) * (size_t)(batch * M * K)), *b = malloc(sizeof(float) * (size_t)(3 * K * N));
    float *c = malloc(sizeof(float) * (size_t)(batch * M * N)), *one = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < batch * M * K; i++) a[i] = rnd();
    for (int64_t i = 0; i < 3 * K * N; i++) b[i] = rnd();
    tr_gemm_batch(tp, (int)batch, M, N, K, a, K, 1, M * K, b, 1, K, K * N, 2, c, N, M * N, 0);
    for (int64_t i = 0; i < batch; i++) {
        tr_gemm(tp, M, N, K, a + i * M * K, K, 1, b + (i / 2) * K * N, 1, K, one, N, 0);
        assert_memory_equal(one, c + i * M * N, sizeof(float) * (size_t)(M * N));
    }
    free(a), free(b), free(c), free(one);
}

static void test_gemm(void **state) {
    threadpool *tp2;
    assert_int_equal(tp_create(2, &tp2, NULL), 0);
    static const char *const tiers[] = {NULL, "avx2", "scalar"}; /* the machine's best, then lower */
    for (size_t i = 0; i < 3; i++) {
        if (tiers[i]) setenv("HEARTH_CPU", tiers[i], 1);
        run_shapes(NULL);
        run_shapes(tp2);
        check_batch(NULL);
        check_batch(tp2);
    }
    unsetenv("HEARTH_CPU");
    tp_destroy(tp2);
    tr_gemm_release();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gemm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
