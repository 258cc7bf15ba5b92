/* test_cuda_graph.c: the decode-speed pieces of the CUDA backend against CPU references:
 * the fused residual add + rmsnorm (ops_rmsnorm after a host add), the whole residual join
 * (cuda_residual: the delta's norm and scale, x's scale; against the separate kernels and
 * the CPU's ops), the norm / gate kernels
 * that also write int8 activations (cpu_quantize_row_ref), the on-device greedy
 * argmax (the sampler's first-maximum rule, ties and -inf rows included) and a CUDA graph
 * replayed with new input values (must equal the same kernels run eagerly), also one
 * holding cuBLAS calls (F16 / BF16 at 2..8 rows). Where no GPU
 * exists it says loudly that nothing ran (exit 0, like test_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_graph: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "base/half.h"
#include "backend/cpu/cpu_ops.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rndf(void) { /* xorshift64*, [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cuda_alloc(&d, bytes, "test buffer", NULL), HEARTH_OK);
    assert_int_equal(cuda_upload(d, host, bytes, NULL), HEARTH_OK);
    return d;
}
static void host_copy(void *host, const void *dev, size_t bytes) {
    assert_int_equal(cuda_sync(NULL), HEARTH_OK);
    assert_int_equal(cuda_download(host, dev, bytes, NULL), HEARTH_OK);
}
static float *rnd_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = rndf() * scale;
    return v;
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    static const int ns[] = {1, 333, 4096, 5003};
    for (size_t c = 0; c < 4; c++)
        for (int shift = 0; shift < 2; shift++) {
            int T = 3, n = ns[c];
            size_t tn = (size_t)T * n;
            float *x = rnd_vec(tn, 3.0f), *delta = rnd_vec(tn, 2.0f), *w = rnd_vec((size_t)n, 1.0f);
            float *sum = malloc(tn * 4), *ref = malloc(tn * 4), *out = malloc(tn * 4), *xo = malloc(tn * 4);
            for (size_t i = 0; i < tn; i++) sum[i] = x[i] + delta[i]; /* one f32 add: exact on both sides */
            ops_rmsnorm(ref, sum, w, (float)shift, T, n, 1e-6f);
            float *dx = dev_copy(x, tn * 4), *dd = dev_copy(delta, tn * 4), *dw = dev_copy(w, (size_t)n * 4),
                  *dout = dev_copy(x, tn * 4);
            assert_int_equal(cuda_add_rmsnorm(dout, dx, dd, dw, (float)shift, T, n, 1e-6f, NULL), HEARTH_OK);
            host_copy(out, dout, tn * 4);
            host_copy(xo, dx, tn * 4);
            for (size_t i = 0; i < tn; i++) {
                if (xo[i] != sum[i]) fail_msg("add_rmsnorm n=%d: x[%zu] = %.9g, expected %.9g", n, i, xo[i], sum[i]);
                /* same bound as test_cuda's rmsnorm: the sums of squares differ only in order */
                if (!(fabsf(out[i] - ref[i]) <= 1e-4f * fabsf(ref[i]) + 1e-7f))
                    fail_msg("add_rmsnorm n=%d shift=%d: out[%zu] = %.9g, reference %.9g", n, shift, i, out[i], ref[i]);
            }
            cuda_free(dx), cuda_free(dd), cuda_free(dw), cuda_free(dout);
            free(x), free(delta), free(w), free(sum), free(ref), free(out), free(xo);
        }
}

/* The int8 copy a fused kernel wrote for rows of n values (GPU float output `v`) against
 * the CPU's quantizer (cpu_quantize_row_ref) on those same floats: the rule is the same
 * float arithmetic (d = max / 127, q = lrint(x * (1 / d)), clamp), so bytes, d and d * sum q
 * must be exactly equal. */
static void check_q8(const char *what, const float *v, const int8_t *xq, const float *xs, int rows, int n) {
    cpu_q8_block *b = malloc((size_t)(n / 32) * sizeof *b);
    for (int r = 0; r < rows; r++) {
        cpu_quantize_row_ref(v + (size_t)r * n, n, b, 0);
        for (int j = 0; j < n / 32; j++) {
            const float *sd = xs + 2 * ((size_t)r * (n / 32) + j);
            float want_s = b[j].d * (float)(b[j].sum16[0] + b[j].sum16[1]);
            if (memcmp(&sd[0], &b[j].d, 4) || memcmp(&sd[1], &want_s, 4))
                fail_msg("%s n=%d row %d block %d: (d, d*sum) = (%.9g, %.9g), CPU (%.9g, %.9g)", what, n, r, j, sd[0],
                         sd[1], b[j].d, want_s);
            for (int i = 0; i < 32; i++)
                if (xq[(size_t)r * n + 32 * j + i] != b[j].q[i])
                    fail_msg("%s n=%d row %d: q[%d] = %d, CPU %d (x %.9g)", what, n, r, 32 * j + i,
                             xq[(size_t)r * n + 32 * j + i], b[j].q[i], v[(size_t)r * n + 32 * j + i]);
        }
    }
    free(b);
}

/* cuda_add_rmsnorm_q8 / cuda_gated_q8: the float output bit-identical to the unfused
 * kernel, the int8 copy equal to the CPU quantizer's, and a Q8_0 GEMV fed the fused int8
 * copy (cuda_gemv_multi_q8) bit-identical to cuda_gemv quantizing the float itself. Rows
 * of 32 up to 14336 (an 8B's ffn), T = 1..8, with and without the residual add. */
static void check_fused_gemv(const float *dv, const int8_t *dq, const float *ds, int T, int k) {
    enum { N = 45 }; /* rows: not a multiple of the GEMV's rows per block */
    size_t nb = (size_t)N * (k / 32);
    uint8_t *wq = malloc(nb * 34);
    for (size_t b = 0; b < nb; b++) {
        uint16_t d = f32_to_f16(rndf() * 0.01f);
        memcpy(wq + 34 * b, &d, 2);
        for (int i = 0; i < 32; i++) wq[34 * b + 2 + i] = (uint8_t)(int8_t)(int)(rndf() * 127.0f);
    }
    op_weight w = {.dtype = DT_Q8_0, .data = wq, .n = N, .k = k};
    cuda_weight dw;
    assert_int_equal(cuda_weight_upload(&dw, &w, "fused q8 test", NULL), HEARTH_OK);
    assert_int_equal(cuda_gemv_int8_act(&dw), 1); /* Q8_0 always takes int8 activations */
    float *y1 = NULL, *y2 = NULL;
    assert_int_equal(cuda_alloc((void **)&y1, (size_t)T * N * 4, "y1", NULL), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&y2, (size_t)T * N * 4, "y2", NULL), HEARTH_OK);
    const cuda_weight *ws[1] = {&dw};
    assert_int_equal(cuda_gemv(&dw, dv, T, y1, NULL), HEARTH_OK);
    assert_int_equal(cuda_gemv_multi_q8(ws, &y2, 1, dq, ds, T, NULL), HEARTH_OK);
    float *h1 = malloc((size_t)T * N * 4), *h2 = malloc((size_t)T * N * 4);
    host_copy(h1, y1, (size_t)T * N * 4);
    host_copy(h2, y2, (size_t)T * N * 4);
    if (memcmp(h1, h2, (size_t)T * N * 4)) fail_msg("gemv_multi_q8 k=%d T=%d differs from cuda_gemv", k, T);
    cuda_free(y1), cuda_free(y2), cuda_weight_free(&dw);
    free(h1), free(h2), free(wq);
}

static void test_fused_q8(void **state) {
    (void)state;
    static const int ns[] = {32, 4096, 5024, 14336};
    static const int Ts[] = {1, 3, 8};
    for (size_t c = 0; c < 4; c++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int add = 0; add < 2; add++) {
                int T = Ts[ti], n = ns[c];
                size_t tn = (size_t)T * n;
                float *x = rnd_vec(tn, 3.0f), *delta = rnd_vec(tn, 2.0f), *w = rnd_vec((size_t)n, 1.0f);
                float *o1 = malloc(tn * 4), *o2 = malloc(tn * 4), *x1 = malloc(tn * 4), *x2 = malloc(tn * 4);
                float *hs = calloc(tn / 32, 8);
                int8_t *hq = calloc(tn, 1);
                float *dx1 = dev_copy(x, tn * 4), *dx2 = dev_copy(x, tn * 4), *dd = dev_copy(delta, tn * 4),
                      *dw = dev_copy(w, (size_t)n * 4), *do1 = dev_copy(x, tn * 4), *do2 = dev_copy(x, tn * 4);
                int8_t *dq = dev_copy(hq, tn);
                float *ds = dev_copy(hs, tn / 32 * 8);
                assert_int_equal(
                    cuda_add_rmsnorm_q8(do1, dx1, add ? dd : NULL, dw, (float)add, T, n, 1e-6f, dq, ds, NULL),
                    HEARTH_OK);
                if (add) assert_int_equal(cuda_add(dx2, dd, tn, NULL), HEARTH_OK);
                assert_int_equal(cuda_rmsnorm(do2, dx2, dw, (float)add, T, n, 1e-6f, NULL), HEARTH_OK);
                host_copy(o1, do1, tn * 4), host_copy(o2, do2, tn * 4);
                host_copy(x1, dx1, tn * 4), host_copy(x2, dx2, tn * 4);
                host_copy(hq, dq, tn), host_copy(hs, ds, tn / 32 * 8);
                if (memcmp(o1, o2, tn * 4) || memcmp(x1, x2, tn * 4))
                    fail_msg("add_rmsnorm_q8 n=%d T=%d add=%d: float output differs from the unfused kernel", n, T,
                             add);
                check_q8("add_rmsnorm_q8", o1, hq, hs, T, n);
                check_fused_gemv(do1, dq, ds, T, n);
                /* the gate: gate <- act(gate) * up over the same T x n values */
                for (int gelu = 0; gelu < 2; gelu++) {
                    float *dg1 = dev_copy(x, tn * 4), *dg2 = dev_copy(x, tn * 4);
                    assert_int_equal(cuda_gated_q8(dg1, dd, tn, gelu, dq, ds, NULL), HEARTH_OK);
                    assert_int_equal(gelu ? cuda_gelu_tanh_mul(dg2, dd, tn, NULL) : cuda_silu_mul(dg2, dd, tn, NULL),
                                     HEARTH_OK);
                    host_copy(o1, dg1, tn * 4), host_copy(o2, dg2, tn * 4);
                    host_copy(hq, dq, tn), host_copy(hs, ds, tn / 32 * 8);
                    if (memcmp(o1, o2, tn * 4))
                        fail_msg("gated_q8 gelu=%d n=%d T=%d: output differs from the unfused kernel", gelu, n, T);
                    check_q8(gelu ? "gelu_q8" : "silu_q8", o1, hq, hs, T, n);
                    check_fused_gemv(dg1, dq, ds, T, n);
                    cuda_free(dg1), cuda_free(dg2);
                }
                /* the per-layer gate's form: T rows of n, each row's up the middle third of a 3n-wide row */
                if (n <= 4096) {
                    float *wide = rnd_vec(3 * tn, 1.0f);
                    float *dwide = dev_copy(wide, 3 * tn * 4), *dg1 = dev_copy(x, tn * 4), *dg2 = dev_copy(x, tn * 4);
                    assert_int_equal(cuda_gelu_tanh_mul_rows_q8(dg1, dwide + n, T, n, 3 * (size_t)n, dq, ds, NULL),
                                     HEARTH_OK);
                    assert_int_equal(cuda_gelu_tanh_mul_rows(dg2, dwide + n, T, n, 3 * (size_t)n, NULL), HEARTH_OK);
                    host_copy(o1, dg1, tn * 4), host_copy(o2, dg2, tn * 4);
                    host_copy(hq, dq, tn), host_copy(hs, ds, tn / 32 * 8);
                    if (memcmp(o1, o2, tn * 4))
                        fail_msg("gelu_tanh_mul_rows_q8 n=%d T=%d: output differs from the unfused kernel", n, T);
                    check_q8("gelu_rows_q8", o1, hq, hs, T, n);
                    cuda_free(dwide), cuda_free(dg1), cuda_free(dg2);
                    free(wide);
                }
                cuda_free(dx1), cuda_free(dx2), cuda_free(dd), cuda_free(dw), cuda_free(do1), cuda_free(do2);
                cuda_free(dq), cuda_free(ds);
                free(x), free(delta), free(w), free(o1), free(o2), free(x1), free(x2), free(hs), free(hq);
            }
}

/* cuda_residual (op_residual in one launch) against the separate kernels it replaces, run
 * in turn on the same inputs (cuda_rmsnorm of delta, cuda_scale, cuda_add, cuda_scale,
 * cuda_rmsnorm of x): x and the normed output bit-identical, the int8 copy (of the normed
 * output, or of x without a norm weight) the CPU quantizer's; and against the
 * CPU backend's sequence (ops_rmsnorm, ops_scale, ops_add) within the norms' reordering
 * bound. Rows up to 10240 (the loop form past 8192), with and without each part. */
static void test_residual(void **state) {
    (void)state;
    static const int ns[] = {32, 2560, 5024, 10240};
    static const int Ts[] = {1, 4};
    for (size_t c = 0; c < 4; c++)
        for (size_t ti = 0; ti < 2; ti++)
            for (int form = 0; form < 24; form++) {
                int T = Ts[ti], n = ns[c], has_delta = form % 3 != 0, dnorm = form % 3 == 2, q8 = (form / 3) % 2,
                    has_w = (form / 6) % 2;
                float dscale = (form / 12) % 2 ? 0.37f : 1.0f, xscale = form % 2 ? 1.7f : 1.0f, shift = form % 4 ? 1.0f : 0.0f;
                size_t tn = (size_t)T * n;
                float *x = rnd_vec(tn, 3.0f), *delta = rnd_vec(tn, 2.0f), *dw = rnd_vec((size_t)n, 1.0f),
                      *w = rnd_vec((size_t)n, 1.0f);
                /* the CPU backend's order */
                float *cx = malloc(tn * 4), *cd = malloc(tn * 4), *cout = malloc(tn * 4);
                memcpy(cx, x, tn * 4), memcpy(cd, delta, tn * 4);
                if (has_delta) {
                    if (dnorm) ops_rmsnorm(cd, cd, dw, shift, T, n, 1e-6f);
                    ops_scale(cd, dscale, tn);
                    ops_add(cx, cd, tn);
                }
                ops_scale(cx, xscale, tn);
                if (has_w) ops_rmsnorm(cout, cx, w, shift, T, n, 1e-6f);
                /* fused */
                float *dx1 = dev_copy(x, tn * 4), *dd1 = dev_copy(delta, tn * 4), *ddw = dev_copy(dw, (size_t)n * 4),
                      *dwt = dev_copy(w, (size_t)n * 4), *do1 = dev_copy(x, tn * 4);
                int8_t *hq = calloc(tn, 1), *dq = dev_copy(hq, tn);
                float *hs = calloc(tn / 32, 8), *ds = dev_copy(hs, tn / 32 * 8);
                cuda_residual_args a = {.x = dx1, .delta = has_delta ? dd1 : NULL, .delta_norm = dnorm ? ddw : NULL,
                                        .delta_scale = dscale, .x_scale = xscale, .w = has_w ? dwt : NULL,
                                        .shift = shift, .out = do1, .xq = q8 ? dq : NULL, .xs = q8 ? ds : NULL,
                                        .T = T, .n = n, .eps = 1e-6f};
                assert_int_equal(cuda_residual(&a, NULL), HEARTH_OK);
                /* unfused */
                float *dx2 = dev_copy(x, tn * 4), *dd2 = dev_copy(delta, tn * 4), *do2 = dev_copy(x, tn * 4);
                if (has_delta) {
                    if (dnorm) assert_int_equal(cuda_rmsnorm(dd2, dd2, ddw, shift, T, n, 1e-6f, NULL), HEARTH_OK);
                    if (dscale != 1.0f) assert_int_equal(cuda_scale(dd2, dscale, 0, tn, NULL), HEARTH_OK);
                    assert_int_equal(cuda_add(dx2, dd2, tn, NULL), HEARTH_OK);
                }
                if (xscale != 1.0f) assert_int_equal(cuda_scale(dx2, xscale, 0, tn, NULL), HEARTH_OK);
                if (has_w) assert_int_equal(cuda_rmsnorm(do2, dx2, dwt, shift, T, n, 1e-6f, NULL), HEARTH_OK);
                float *x1 = malloc(tn * 4), *x2 = malloc(tn * 4), *o1 = malloc(tn * 4), *o2 = malloc(tn * 4);
                host_copy(x1, dx1, tn * 4), host_copy(x2, dx2, tn * 4);
                host_copy(o1, do1, tn * 4), host_copy(o2, do2, tn * 4);
                if (memcmp(x1, x2, tn * 4))
                    fail_msg("residual n=%d T=%d form=%d: x differs from the separate kernels", n, T, form);
                if (has_w && memcmp(o1, o2, tn * 4))
                    fail_msg("residual n=%d T=%d form=%d: out differs from the separate kernels", n, T, form);
                if (!has_w && memcmp(o1, x, tn * 4))
                    fail_msg("residual n=%d T=%d form=%d: out written without a norm weight", n, T, form);
                for (size_t i = 0; i < tn; i++) {
                    float bx = 1e-4f * (fabsf(cx[i]) + (has_delta ? fabsf(cd[i]) : 0.0f)) + 1e-6f;
                    if (!(fabsf(x1[i] - cx[i]) <= bx))
                        fail_msg("residual n=%d form=%d: x[%zu] = %.9g, CPU %.9g", n, form, i, x1[i], cx[i]);
                    if (has_w && !(fabsf(o1[i] - cout[i]) <= 2e-4f * fabsf(cout[i]) + 1e-5f))
                        fail_msg("residual n=%d form=%d: out[%zu] = %.9g, CPU %.9g", n, form, i, o1[i], cout[i]);
                }
                if (q8) { /* xn's int8 copy, or without a norm weight x's */
                    host_copy(hq, dq, tn), host_copy(hs, ds, tn / 32 * 8);
                    check_q8(has_w ? "residual xn" : "residual x", has_w ? o1 : x1, hq, hs, T, n);
                }
                cuda_free(dx1), cuda_free(dd1), cuda_free(ddw), cuda_free(dwt), cuda_free(do1), cuda_free(dq);
                cuda_free(ds), cuda_free(dx2), cuda_free(dd2), cuda_free(do2);
                free(x), free(delta), free(dw), free(w), free(cx), free(cd), free(cout), free(hq), free(hs);
                free(x1), free(x2), free(o1), free(o2);
            }
}

static int32_t host_argmax(const float *x, int n) { /* sampler.c's greedy rule */
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_argmax(void **state) {
    (void)state;
    static const int vocabs[] = {1, 7, 1025, 49152, 128256};
    for (size_t c = 0; c < 5; c++) {
        int rows = 5, v = vocabs[c];
        float *x = rnd_vec((size_t)rows * v, 10.0f);
        /* row 1: a tie between two late positions (the first must win); row 2: all -inf
         * (index 0, as the host loop gives); row 3: the maximum at the last index */
        if (v > 3) x[(size_t)v + v - 3] = x[(size_t)v + v - 1] = 100.0f;
        for (int i = 0; i < v; i++) x[2 * (size_t)v + i] = -INFINITY;
        x[3 * (size_t)v + v - 1] = 1000.0f;
        float *dx = dev_copy(x, (size_t)rows * v * 4);
        int32_t *dids = NULL, ids[5];
        assert_int_equal(cuda_alloc((void **)&dids, sizeof ids, "ids", NULL), HEARTH_OK);
        assert_int_equal(cuda_argmax(dx, rows, v, dids, NULL), HEARTH_OK);
        host_copy(ids, dids, sizeof ids);
        for (int r = 0; r < rows; r++)
            if (ids[r] != host_argmax(x + (size_t)r * v, v))
                fail_msg("argmax vocab %d row %d: device %d, host %d", v, r, ids[r], host_argmax(x + (size_t)r * v, v));
        /* the engine's variant (hearth_seq_append_greedy on the GPU): the same ids, and -1
         * for a row with a non-finite logit (row 2's -inf; row 4 gets a NaN), which the
         * engine reports as its non-finite-logits error like its host check */
        x[4 * (size_t)v + v / 2] = NAN;
        cuda_free(dx);
        dx = dev_copy(x, (size_t)rows * v * 4);
        assert_int_equal(cuda_argmax_checked(dx, rows, v, dids, NULL), HEARTH_OK);
        host_copy(ids, dids, sizeof ids);
        for (int r = 0; r < rows; r++) {
            int32_t want = r == 2 || r == 4 ? -1 : host_argmax(x + (size_t)r * v, v);
            if (ids[r] != want) fail_msg("argmax_checked vocab %d row %d: device %d, want %d", v, r, ids[r], want);
        }
        cuda_free(dx), cuda_free(dids);
        free(x);
    }
}

/* A graph of (add_rmsnorm, GEMV, argmax) captured once and replayed with new inputs
 * uploaded into the same buffers must give exactly the eager results (same kernels,
 * same order: bitwise equal). */
static void test_graph_replay(void **state) {
    (void)state;
    int n = 1000, k = 777, T = 2;
    float *wh = rnd_vec((size_t)n * k, 1.0f), *norm = rnd_vec((size_t)k, 1.0f);
    op_weight w = {.dtype = DT_F32, .data = wh, .n = n, .k = k};
    cuda_weight dw;
    assert_int_equal(cuda_weight_upload(&dw, &w, "graph test weight", NULL), HEARTH_OK);
    float *dx, *dd, *dxn, *dy, *dnorm = dev_copy(norm, (size_t)k * 4);
    int32_t *dids;
    assert_int_equal(cuda_alloc((void **)&dx, (size_t)T * k * 4, "x", NULL), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&dd, (size_t)T * k * 4, "d", NULL), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&dxn, (size_t)T * k * 4, "xn", NULL), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&dy, (size_t)T * n * 4, "y", NULL), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&dids, (size_t)T * 4, "ids", NULL), HEARTH_OK);
    hearth_error e = {0};
    assert_int_equal(cuda_capture_begin(&e), HEARTH_OK);
    hearth_status st = cuda_add_rmsnorm(dxn, dx, dd, dnorm, 0.0f, T, k, 1e-6f, &e);
    if (!st) st = cuda_gemv(&dw, dxn, T, dy, &e);
    if (!st) st = cuda_argmax(dy, T, n, dids, &e);
    cuda_graph *g = NULL;
    assert_int_equal(st, HEARTH_OK);
    if (cuda_capture_end(1, &g, &e)) fail_msg("capture: %s", e.message);
    float *y_graph = malloc((size_t)T * n * 4), *y_eager = malloc((size_t)T * n * 4);
    int32_t ids_graph[2], ids_eager[2];
    for (int rep = 0; rep < 3; rep++) {
        float *x = rnd_vec((size_t)T * k, 1.0f), *d = rnd_vec((size_t)T * k, 1.0f);
        assert_int_equal(cuda_upload_async(dx, x, (size_t)T * k * 4, NULL), HEARTH_OK);
        assert_int_equal(cuda_upload_async(dd, d, (size_t)T * k * 4, NULL), HEARTH_OK);
        assert_int_equal(cuda_graph_launch(g, &e), HEARTH_OK);
        assert_int_equal(cuda_stream_sync(&e), HEARTH_OK);
        host_copy(y_graph, dy, (size_t)T * n * 4);
        host_copy(ids_graph, dids, sizeof ids_graph);
        assert_int_equal(cuda_upload(dx, x, (size_t)T * k * 4, NULL), HEARTH_OK);
        assert_int_equal(cuda_add_rmsnorm(dxn, dx, dd, dnorm, 0.0f, T, k, 1e-6f, NULL), HEARTH_OK);
        assert_int_equal(cuda_gemv(&dw, dxn, T, dy, NULL), HEARTH_OK);
        assert_int_equal(cuda_argmax(dy, T, n, dids, NULL), HEARTH_OK);
        host_copy(y_eager, dy, (size_t)T * n * 4);
        host_copy(ids_eager, dids, sizeof ids_eager);
        if (memcmp(y_graph, y_eager, (size_t)T * n * 4)) fail_msg("replay %d: graph output differs from eager", rep);
        for (int t = 0; t < T; t++) {
            assert_int_equal(ids_graph[t], ids_eager[t]);
            assert_int_equal(ids_graph[t], host_argmax(y_eager + (size_t)t * n, n));
        }
        free(x), free(d);
    }
    cuda_graph_free(g);
    cuda_weight_free(&dw);
    cuda_free(dx), cuda_free(dd), cuda_free(dxn), cuda_free(dy), cuda_free(dids), cuda_free(dnorm);
    free(wh), free(norm), free(y_graph), free(y_eager);
}

/* F16 / BF16 weights at 2..8 rows go to cuBLAS inside the decode graphs (the default since
 * 2026-12-02): a captured cuda_matmul replayed with new inputs must equal the eager call
 * bitwise, and the CPU reference (double sums of the rounded weights) within the rounding
 * of the activations to bf16 / f16 (relative <= 2^-9 each, independent signs): six
 * standard deviations, 6 * 2^-9 * sqrt(sum (w x)^2), plus 1e-3 for the f32 sums. A dropped
 * or misread block of 8 weights is ~30 times that. */
static void test_graph_cublas(void **state) {
    (void)state;
    static const int dts[] = {DT_F16, DT_BF16}, Ts[] = {2, 5, 8};
    int n = 515, k = 1024;
    cuda_gemm *gm = NULL;
    assert_int_equal(cuda_gemm_create(&gm, (size_t)n * k, 8 * (size_t)k, 0, NULL), HEARTH_OK);
    for (int di = 0; di < 2; di++) {
        float *wf = rnd_vec((size_t)n * k, 1.0f);
        uint16_t *wh = malloc((size_t)n * k * 2);
        for (size_t i = 0; i < (size_t)n * k; i++) {
            wh[i] = dts[di] == DT_F16 ? f32_to_f16(wf[i]) : f32_to_bf16(wf[i]);
            wf[i] = dts[di] == DT_F16 ? f16_to_f32(wh[i]) : bf16_to_f32(wh[i]); /* the reference's weights */
        }
        op_weight w = {.dtype = dts[di], .data = wh, .n = n, .k = k};
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "graph cublas weight", NULL), HEARTH_OK);
        for (int ti = 0; ti < 3; ti++) {
            int T = Ts[ti];
            assert_false(cuda_matmul_uses_gemv(gm, &dw, T)); /* else this tested the GEMV again */
            float *dx, *dy;
            assert_int_equal(cuda_alloc((void **)&dx, (size_t)T * k * 4, "x", NULL), HEARTH_OK);
            assert_int_equal(cuda_alloc((void **)&dy, (size_t)T * n * 4, "y", NULL), HEARTH_OK);
            hearth_error e = {0};
            assert_int_equal(cuda_capture_begin(&e), HEARTH_OK);
            hearth_status st = cuda_matmul(gm, &dw, dx, T, dy, &e);
            cuda_graph *g = NULL;
            if (cuda_capture_end(!st, &g, &e) || st) fail_msg("capture of cuBLAS at T=%d: %s", T, e.message);
            float *yg = malloc((size_t)T * n * 4), *ye = malloc((size_t)T * n * 4);
            for (int rep = 0; rep < 2; rep++) {
                float *x = rnd_vec((size_t)T * k, 1.0f);
                assert_int_equal(cuda_upload(dx, x, (size_t)T * k * 4, NULL), HEARTH_OK);
                assert_int_equal(cuda_graph_launch(g, &e), HEARTH_OK);
                assert_int_equal(cuda_stream_sync(&e), HEARTH_OK);
                host_copy(yg, dy, (size_t)T * n * 4);
                assert_int_equal(cuda_matmul(gm, &dw, dx, T, dy, NULL), HEARTH_OK);
                host_copy(ye, dy, (size_t)T * n * 4);
                if (memcmp(yg, ye, (size_t)T * n * 4)) fail_msg("T=%d rep %d: graph replay differs from eager", T, rep);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < n; r++) {
                        double ref = 0, sq = 0;
                        for (int j = 0; j < k; j++) {
                            double p = (double)wf[(size_t)r * k + j] * x[(size_t)t * k + j];
                            ref += p, sq += p * p;
                        }
                        if (fabs(ref - ye[(size_t)t * n + r]) > 6.0 / 512.0 * sqrt(sq) + 1e-3)
                            fail_msg("dtype %d T=%d y[%d][%d] = %g, reference %g", dts[di], T, t, r, ye[(size_t)t * n + r], ref);
                    }
                free(x);
            }
            cuda_graph_free(g);
            cuda_free(dx), cuda_free(dy);
            free(yg), free(ye);
        }
        cuda_weight_free(&dw);
        free(wf), free(wh);
    }
    cuda_gemm_free(gm);
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("test_cuda_graph: skipped: no CUDA device; the fused-norm (+ int8), argmax and graph tests did NOT run "
               "and do not count as passed\n");
        return 0;
    }
    hearth_error e = {0};
    if (cuda_device_open(0, NULL, &e)) {
        printf("test_cuda_graph: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x2545f4914f6cdd1dull; /* fresh random inputs every run */
    printf("test_cuda_graph: seed %llx\n", (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_add_rmsnorm), cmocka_unit_test(test_fused_q8), cmocka_unit_test(test_residual),
                                       cmocka_unit_test(test_argmax), cmocka_unit_test(test_graph_replay),
                                       cmocka_unit_test(test_graph_cublas)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
