/* test_train_ops.c: every training op's forward and backward (src/train/train_ops.c)
 * against an autograd oracle. tools/make_train_grads.py draws random float32 inputs and
 * writes MLX autograd's float64 outputs and gradients to tests/data/train/op_grads.safetensors;
 * each value here must match within 1e-5 * max(1, max |reference|) of its tensor (float32
 * rounding of sums over at most a few dozen terms stays well under it). Two threads, so
 * the threaded matmul paths run too. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/safetensors.h"
#include "train/train_ops.h"

static st_file F;
static threadpool *TP;

/* the fixture's tensors copied out of the mapping (safetensors offsets promise no float
 * alignment) */
static float **ALIGNED;
static const float *T_(const char *name, int64_t *n) {
    for (size_t i = 0; i < F.n_tensors; i++)
        if (!strcmp(F.tensors[i].name, name)) {
            if (n) *n = (int64_t)(F.tensors[i].nbytes / 4);
            return ALIGNED[i];
        }
    fail_msg("fixture has no tensor %s", name);
    return NULL;
}
static float *copy(const char *name) {
    int64_t n;
    const float *p = T_(name, &n);
    float *c = malloc(sizeof(float) * (size_t)n);
    memcpy(c, p, sizeof(float) * (size_t)n);
    return c;
}
static float *zeros(int64_t n) { return calloc((size_t)n, sizeof(float)); }

static void close_to(const char *what, const float *got, const char *ref_name) {
    int64_t n;
    const float *ref = T_(ref_name, &n);
    float mx = 1.0f;
    for (int64_t i = 0; i < n; i++) mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - ref[i]) <= 1e-5f * mx))
            fail_msg("%s[%lld]: %.9g, autograd %.9g (tolerance %.3g)", what, (long long)i, got[i], ref[i], 1e-5f * mx);
}

static int setup(void **state) {
    const char *dir = getenv("HEARTH_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/train/op_grads.safetensors", dir ? dir : "tests/data");
    hearth_error err = {0};
    if (st_open(path, &F, &err)) {
        fprintf(stderr, "%s (run tools/make_train_grads.py)\n", err.message);
        return -1;
    }
    ALIGNED = calloc(F.n_tensors, sizeof *ALIGNED);
    for (size_t i = 0; ALIGNED && i < F.n_tensors; i++)
        if ((ALIGNED[i] = malloc(F.tensors[i].nbytes + 4))) memcpy(ALIGNED[i], F.tensors[i].data, F.tensors[i].nbytes);
    return tp_create(2, &TP, &err) ? -1 : 0;
}
static int teardown(void **state) {
    for (size_t i = 0; ALIGNED && i < F.n_tensors; i++) free(ALIGNED[i]);
    free(ALIGNED);
    st_close(&F);
    tp_destroy(TP);
    tr_gemm_release();
    return 0;
}

static void linear_case(const char *p, int64_t M, int64_t K, int64_t N, int r) {
    char n[64];
#define NM(s) (snprintf(n, sizeof n, "%s.%s", p, s), n)
    const float *x = T_(NM("x"), NULL), *w = T_(NM("w"), NULL), *dy = T_(NM("dy"), NULL);
    tr_lora l = {.a = copy(NM("a")), .b = copy(NM("b")), .ga = zeros(K * r), .gb = zeros(r * N), .r = r,
                 .scale = T_(NM("scale"), NULL)[0]};
    float *y = zeros(M * N), *xa = zeros(M * r), *dx = zeros(M * K), *scratch = zeros(M * r);
    tr_linear_fwd(TP, x, M, K, w, N, NULL, &l, xa, y);
    close_to("linear y", y, NM("y"));
    tr_linear_bwd(TP, x, M, K, w, N, &l, xa, dy, dx, scratch);
    close_to("linear dx", dx, NM("dx"));
    close_to("linear dA", l.ga, NM("ga"));
    close_to("linear dB", l.gb, NM("gb"));
    free(l.a), free(l.b), free(l.ga), free(l.gb), free(y), free(xa), free(dx), free(scratch);
#undef NM
}

static void test_linear_lora(void **state) {
    linear_case("lin1", 6, 27, 13, 4);
    linear_case("lin2", 9, 40, 35, 8);
}

static void test_rmsnorm(void **state) {
    int64_t M = 7, D = 48;
    float *y = zeros(M * D), *rstd = zeros(M), *dx = zeros(M * D);
    tr_rmsnorm_fwd(T_("norm.x", NULL), M, D, T_("norm.w", NULL), 1e-5f, y, rstd);
    close_to("rmsnorm y", y, "norm.y");
    tr_rmsnorm_bwd(T_("norm.x", NULL), M, D, T_("norm.w", NULL), rstd, T_("norm.dy", NULL), dx);
    close_to("rmsnorm dx", dx, "norm.dx");
    free(y), free(rstd), free(dx);
}

static void test_rope(void **state) {
    for (int adj = 0; adj < 2; adj++) {
        char n[32];
        snprintf(n, sizeof n, "rope%d.x", adj);
        float *x = copy(n);
        tr_rope(x, 7, 3, 16, 16, 3, T_("rope.inv_freq", NULL), adj, 1);
        snprintf(n, sizeof n, "rope%d.y", adj);
        close_to("rope y", x, n);
        snprintf(n, sizeof n, "rope%d.dy", adj);
        float *d = copy(n);
        tr_rope(d, 7, 3, 16, 16, 3, T_("rope.inv_freq", NULL), adj, -1);
        snprintf(n, sizeof n, "rope%d.dx", adj);
        close_to("rope dx", d, n);
        free(x), free(d);
    }
}

/* the fixture's case pfx ("attn", "wattn"): T positions, 4 query heads over 2 KV heads of
 * 8, window W (0: causal); outside the window and the causal triangle no weight */
static void check_attention(const char *pfx, int64_t T, int W) {
    int Hq = 4, Hkv = 2, hd = 8;
    char n[64];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", pfx, s), n)
    float *q = copy(NAME("q")), *k = copy(NAME("k")), *v = copy(NAME("v")), *dout = copy(NAME("dout"));
    float *p = zeros(Hq * T * T), *o = zeros(T * Hq * hd), *dq = zeros(T * Hq * hd), *dk = zeros(T * Hkv * hd),
          *dv = zeros(T * Hkv * hd), *scratch = zeros(Hq * T * T);
    float scale = 1.0f / sqrtf((float)hd);
    tr_attn_fwd(TP, q, k, v, T, Hq, Hkv, hd, scale, W, p, o);
    close_to("attention out", o, NAME("out"));
    for (int h = 0; h < Hq; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++)
                if (j > i || (W && j <= i - W)) assert_true(p[(h * T + i) * T + j] == 0.0f);
    tr_attn_bwd(TP, q, k, v, p, dout, T, Hq, Hkv, hd, scale, dq, dk, dv, scratch);
    close_to("attention dq", dq, NAME("dq"));
    close_to("attention dk", dk, NAME("dk"));
    close_to("attention dv", dv, NAME("dv"));
#undef NAME
    free(q), free(k), free(v), free(dout), free(p), free(o), free(dq), free(dk), free(dv), free(scratch);
}

static void test_attention(void **state) { check_attention("attn", 11, 0); }

/* a sliding window of 5 over 13 positions: the keys before the window get no weight and
 * no gradient */
static void test_sliding_window_attention(void **state) {
    assert_int_equal((int)T_("wattn.window", NULL)[0], 5);
    check_attention("wattn", 13, 5);
}

/* a gated product's forward and backward (silu or gelu) against the fixture's case pfx */
static void check_gate(const char *pfx, void (*fwd)(threadpool *, const float *, const float *, int64_t, float *),
                       void (*bwd)(threadpool *, const float *, const float *, const float *, int64_t, float *,
                                   float *)) {
    float h[50], dg[50], du[50];
    char g[32], u[32], dh[32], n[32];
    snprintf(g, sizeof g, "%s.g", pfx), snprintf(u, sizeof u, "%s.u", pfx), snprintf(dh, sizeof dh, "%s.dh", pfx);
    fwd(TP, T_(g, NULL), T_(u, NULL), 50, h);
    snprintf(n, sizeof n, "%s.h", pfx);
    close_to(n, h, n);
    bwd(TP, T_(g, NULL), T_(u, NULL), T_(dh, NULL), 50, dg, du);
    snprintf(n, sizeof n, "%s.dg", pfx);
    close_to(n, dg, n);
    snprintf(n, sizeof n, "%s.du", pfx);
    close_to(n, du, n);
}

static void test_gelu_mul(void **state) { check_gate("gelu", tr_gelu_mul_fwd, tr_gelu_mul_bwd); }

static void test_silu_mul(void **state) { check_gate("silu", tr_silu_mul_fwd, tr_silu_mul_bwd); }

/* the fixture's case pfx ("xent"; "xcap": logits softcapped at softcap) */
static void check_cross_entropy(const char *pfx, float softcap) {
    int64_t M = 6, D = 16, V = 40;
    char n[32], hn[32], wn[32];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", pfx, s), n)
    snprintf(hn, sizeof hn, "%s.h", pfx), snprintf(wn, sizeof wn, "%s.w", pfx);
    float *dh = zeros(M * D), *scratch = zeros(TR_XENT_ROWS * TR_XENT_ROW_FLOATS(V, D)), *ce = zeros(M);
    const int32_t *targets = (const int32_t *)T_(NAME("targets"), NULL);
    const float *weight = T_(NAME("weight"), NULL);
    float loss = (float)tr_xent(TP, T_(hn, NULL), M, D, T_(wn, NULL), V, softcap, targets, weight, dh, ce, scratch);
    close_to("cross-entropy loss", &loss, NAME("loss"));
    close_to("cross-entropy dh", dh, NAME("dh"));
    /* the per-row values (dpo / orpo read them) weigh up to the reference's loss */
    float sum = 0;
    for (int64_t i = 0; i < M; i++) {
        if (weight[i] == 0.0f) assert_true(ce[i] == 0.0f);
        else assert_true(ce[i] > 0.0f);
        sum += weight[i] * ce[i];
    }
    close_to("cross-entropy per-row sum", &sum, NAME("loss"));
    /* without dh (a reference or validation pass): the same loss and per-row values */
    float *ce2 = zeros(M);
    loss = (float)tr_xent(TP, T_(hn, NULL), M, D, T_(wn, NULL), V, softcap, targets, weight, NULL, ce2, scratch);
    close_to("cross-entropy loss without dh", &loss, NAME("loss"));
    assert_memory_equal(ce, ce2, sizeof(float) * (size_t)M);
#undef NAME
    free(dh), free(scratch), free(ce), free(ce2);
}

static void test_cross_entropy(void **state) { check_cross_entropy("xent", 0.0f); }

static void test_cross_entropy_softcap(void **state) { check_cross_entropy("xcap", T_("xcap.softcap", NULL)[0]); }

/* the gated delta rule over the fixture's 6 tokens from a zero state, then its backward
 * token by token from the kept states (Dk 20: a vector body and a tail) */
static void test_delta_rule(void **state) {
    enum { T = 6, Dv = 3, Dk = 20 };
    const float *q = T_("delta.q", NULL), *k = T_("delta.k", NULL), *v = T_("delta.v", NULL);
    const float *g = T_("delta.g", NULL), *beta = T_("delta.beta", NULL), *dy = T_("delta.dy", NULL);
    float S[T + 1][Dv * Dk] = {{0}}, y[T * Dv], dq[T * Dk], dk[T * Dk], dv[T * Dv], dg[T], db[T], dS[Dv * Dk] = {0},
                        work[Dk];
    for (int t = 0; t < T; t++) {
        memcpy(S[t + 1], S[t], sizeof S[t]);
        tr_delta_step(S[t + 1], k + t * Dk, q + t * Dk, v + t * Dv, Dv, Dk, g[t], beta[t], y + t * Dv);
    }
    close_to("delta y", y, "delta.y");
    for (int t = T - 1; t >= 0; t--)
        tr_delta_step_bwd(S[t], S[t + 1], k + t * Dk, q + t * Dk, v + t * Dv, Dv, Dk, g[t], beta[t], dy + t * Dv, dS,
                          dq + t * Dk, dk + t * Dk, dv + t * Dv, &dg[t], &db[t], work);
    close_to("delta dq", dq, "delta.dq");
    close_to("delta dk", dk, "delta.dk");
    close_to("delta dv", dv, "delta.dv");
    close_to("delta dg", dg, "delta.dg");
    close_to("delta dbeta", db, "delta.dbeta");
    /* without the output (the backward's recomputation): the same state */
    float S2[Dv * Dk] = {0};
    for (int t = 0; t < T; t++) tr_delta_step(S2, k + t * Dk, NULL, v + t * Dv, Dv, Dk, g[t], beta[t], NULL);
    assert_memory_equal(S2, S[T], sizeof S2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_lora),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_sliding_window_attention),
        cmocka_unit_test(test_gelu_mul),
        cmocka_unit_test(test_cross_entropy_softcap),
        cmocka_unit_test(test_delta_rule),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
