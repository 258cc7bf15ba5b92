/* test_cpu_ops_kernels.c: the vectorized CPU ops. (1) attention over the paged float KV pool
 * (ops_attention) against a naive double-precision softmax attention written here from the definition, at
 * every ISA level the machine has: head_dim 64, 80 (not a multiple of 16: the generic
 * path on AVX-512; on AVX2 a 64-float and a 16-float output pass), 256 (the AVX-512 path's
 * output in two 128-float passes, AVX2's in four of 64); GQA (3 query heads per KV
 * head); prefill of many tokens and decode of several slots whose lengths and windows start
 * and end inside KV blocks; 1 and 2 threads. Prefill tiles against the same tokens one at
 * a time, bit for bit (batch invariance), over head_dim 64/80/256 and GQA groups 1/4/8/20.
 * (2) ops_silu_mul / ops_gelu_tanh_mul against
 * the textbook formulas in double (libm exp / tanh), at every level, odd lengths.
 * (3) ops_argmax against the greedy rule written as its loop, at every level: ties, NaN
 * (first and elsewhere), -inf rows, lengths around the 8-lane step. (4) ops_all_finite
 * against isfinite. (5) op_expf (op_exp.h, the routing rule's exp) against libm's double exp:
 * within 2 ulp over its whole range, 0 below it, inf above, NaN through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_ops.h"
#include "base/cpu_features.h"
#include "base/threadpool.h"
#include "kv/kv_cache.h"
#include "ops/op_exp.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint32_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* softmax(q . k_p * scale) . v_p over p in the window ending at pos, in double. */
static void naive(const kv_cache *kv, int layer, int slot, int pos, int kvh, int window, const float *q, int d,
                  float scale, double *out) {
    int p0 = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    double mx = -INFINITY, *s = malloc(sizeof(double) * (size_t)(pos + 1)), sum = 0;
    for (int p = p0; p <= pos; p++) {
        const float *k = kv_key(kv, layer, slot, p, kvh);
        double dot = 0;
        for (int i = 0; i < d; i++) dot += (double)q[i] * k[i];
        s[p] = dot * scale;
        mx = fmax(mx, s[p]);
    }
    for (int p = p0; p <= pos; p++) sum += s[p] = exp(s[p] - mx);
    for (int i = 0; i < d; i++) out[i] = 0;
    for (int p = p0; p <= pos; p++) {
        const float *v = kv->v + (kv_key(kv, layer, slot, p, kvh) - kv->k);
        for (int i = 0; i < d; i++) out[i] += s[p] / sum * v[i];
    }
    free(s);
}

static void check(int head_dim, int window, int prefill, threadpool *tp) {
    enum { LAYERS = 2, KVH = 2, HEADS = 6, SLOTS = 3, TMAX = 45 };
    int T = prefill ? TMAX : 4;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, LAYERS, KVH, head_dim, SLOTS, 300, 64, NULL), HEARTH_OK);
    int lens[SLOTS] = {1 + (int)(rnd() % 40), 150 + (int)(rnd() % 100), 17};
    for (int s = 0; s < SLOTS; s++) assert_int_equal(kv_reserve(&kv, s, lens[s], NULL), HEARTH_OK);
    size_t nf = (size_t)LAYERS * kv.n_blocks * kv.block_floats;
    for (size_t i = 0; i < nf; i++) {
        kv.k[i] = rndf() * 2;
        kv.v[i] = rndf();
    }
    int32_t slot[TMAX] = {0, 1, 2, 1}, pos[TMAX] = {0};
    for (int t = 0; t < T; t++) {
        if (prefill) slot[t] = 1;
        pos[t] = prefill ? lens[1] - T + t : lens[slot[t]] - 1 - (t == 3 ? 20 : 0);
    }
    size_t nq = (size_t)T * HEADS * head_dim;
    float *q = malloc(nq * 4), *out = malloc(nq * 4);
    float *scratch = malloc(ops_attention_scratch(&kv) * 4 * (size_t)tp_threads(tp));
    for (size_t i = 0; i < nq; i++) q[i] = rndf();
    ops_attention_args a = {.kv = &kv, .layer = 1, .q = q, .out = out, .T = T, .n_heads = HEADS,
                            .n_kv_heads = KVH, .head_dim = head_dim, .pos = pos, .slot = slot,
                            .window = window, .scale = 1.0f / sqrtf((float)head_dim), .scratch = scratch};
    ops_attention(&a, tp);
    double *want = malloc(sizeof(double) * (size_t)head_dim);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HEADS; h++) {
            const float *qh = q + ((size_t)t * HEADS + h) * head_dim;
            naive(&kv, 1, slot[t], pos[t], h / (HEADS / KVH), window, qh, head_dim, a.scale, want);
            for (int i = 0; i < head_dim; i++) {
                float got = out[((size_t)t * HEADS + h) * head_dim + i];
                /* a convex combination of values in [-1, 1]; float scores differ from double by
                 * ~d * 2^-24 relative, which moves the weights by ~1e-5 at most */
                if (!(fabs(got - want[i]) <= 2e-5))
                    fail_msg("%s d=%d window=%d prefill=%d threads=%d: t %d head %d [%d] = %.8g, want %.8g",
                             cpu_level_name(cpu_level_active()), head_dim, window, prefill, tp_threads(tp), t, h,
                             i, got, want[i]);
            }
        }
    free(want);
    free(q);
    free(out);
    free(scratch);
    kv_destroy(&kv);
}

static void test_attention_matches_naive(void **state) {
    (void)state;
    threadpool *tps[2];
    assert_int_equal(tp_create(1, &tps[0], NULL), HEARTH_OK);
    assert_int_equal(tp_create(2, &tps[1], NULL), HEARTH_OK);
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        static const int dims[] = {64, 80, 256}, windows[] = {0, 20};
        for (int di = 0; di < 3; di++)
            for (int wi = 0; wi < 2; wi++)
                for (int prefill = 0; prefill < 2; prefill++)
                    for (int th = 0; th < 2; th++) check(dims[di], windows[wi], prefill, tps[th]);
    }
    unsetenv("HEARTH_CPU");
    tp_destroy(tps[0]);
    tp_destroy(tps[1]);
}

/* Prefill tiles (several tokens x the query heads of one KV head per task) against the
 * same tokens one at a time (one task per (token, head)) and against naive(). The batch:
 * a prefill chunk of slot 0 starting inside a KV block, one of slot 1, a decode token of
 * slot 2, back to back, so tiles straddle sequences and T is not a multiple of any tile.
 * The AVX2 tile path takes a call with at least one tile per thread: with 2 KV heads a lone
 * token makes at most 4 (group 20: two head chunks), fewer than the 8 threads it runs on,
 * and the 45-token batch at least 6 (group 1: 16 tokens per tile), enough for its 1 or 2; so
 * the two calls take the two paths. On AVX-512 both take the grouped kernel, the lone token
 * with its query heads split over tasks (fewer KV heads than threads). */
static void check_tiles(int head_dim, int group, int window, int context, threadpool *tp_batch,
                        threadpool *tp_single) {
    enum { LAYERS = 2, KVH = 2, SLOTS = 3, TMAX = 45 };
    int heads = KVH * group;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, LAYERS, KVH, head_dim, SLOTS, context, context / KV_BLOCK_SIZE + 16, NULL),
                     HEARTH_OK);
    int lens[SLOTS] = {40 + (int)(rnd() % 30), context - 100 + (int)(rnd() % 90), 1 + (int)(rnd() % 50)};
    int chunk0 = 13 + (int)(rnd() % 20), T = TMAX;
    for (int s = 0; s < SLOTS; s++) assert_int_equal(kv_reserve(&kv, s, lens[s], NULL), HEARTH_OK);
    size_t nf = (size_t)LAYERS * kv.n_blocks * kv.block_floats;
    for (size_t i = 0; i < nf; i++) {
        kv.k[i] = rndf() * 2;
        kv.v[i] = rndf();
    }
    int32_t slot[TMAX], pos[TMAX];
    for (int t = 0; t < T; t++) {
        int s = t < chunk0 ? 0 : t < T - 1 ? 1 : 2;
        int first = s == 0 ? lens[0] - chunk0 : s == 1 ? lens[1] - (T - 1 - chunk0) : lens[2] - 1;
        int index = s == 0 ? t : s == 1 ? t - chunk0 : 0;
        slot[t] = s;
        pos[t] = first + index;
    }
    size_t row = (size_t)heads * head_dim, nq = (size_t)T * row;
    float *q = malloc(nq * 4), *out = malloc(nq * 4), *one = malloc(row * 4);
    int threads = tp_threads(tp_batch) > tp_threads(tp_single) ? tp_threads(tp_batch) : tp_threads(tp_single);
    float *scratch = malloc(ops_attention_scratch(&kv) * 4 * (size_t)threads);
    for (size_t i = 0; i < nq; i++) q[i] = rndf();
    ops_attention_args a = {.kv = &kv, .layer = 1, .q = q, .out = out, .T = T, .n_heads = heads,
                            .n_kv_heads = KVH, .head_dim = head_dim, .pos = pos, .slot = slot,
                            .window = window, .scale = 1.0f / sqrtf((float)head_dim), .scratch = scratch};
    ops_attention(&a, tp_batch);
    double *want = malloc(sizeof(double) * (size_t)head_dim);
    for (int t = 0; t < T; t++) {
        ops_attention_args a1 = a;
        a1.q = q + t * row, a1.out = one, a1.T = 1, a1.pos = pos + t, a1.slot = slot + t;
        ops_attention(&a1, tp_single);
        for (int h = 0; h < heads; h++) {
            const float *got = out + t * row + (size_t)h * head_dim;
            naive(&kv, 1, slot[t], pos[t], h / group, window, q + t * row + (size_t)h * head_dim, head_dim, a.scale,
                  want);
            for (int i = 0; i < head_dim; i++) {
                /* the same operations in the same order on both paths (batch invariance):
                 * bit for bit, not within a tolerance */
                if (memcmp(&got[i], &one[(size_t)h * head_dim + i], sizeof(float)))
                    fail_msg("%s d=%d group=%d window=%d: token %d (slot %d pos %d) head %d [%d]: tile %.9g, alone "
                             "%.9g",
                             cpu_level_name(cpu_level_active()), head_dim, group, window, t, slot[t], pos[t], h, i,
                             got[i], one[(size_t)h * head_dim + i]);
                /* the bound of check(): float scores against double move the weights ~1e-5 */
                if (!(fabs(got[i] - want[i]) <= 2e-5))
                    fail_msg("%s d=%d group=%d window=%d: token %d head %d [%d] = %.8g, want %.8g",
                             cpu_level_name(cpu_level_active()), head_dim, group, window, t, h, i, got[i], want[i]);
            }
        }
    }
    free(want);
    free(q);
    free(out);
    free(one);
    free(scratch);
    kv_destroy(&kv);
}

static void test_attention_tiles_match_tokens(void **state) {
    (void)state;
    threadpool *tps[3];
    assert_int_equal(tp_create(1, &tps[0], NULL), HEARTH_OK);
    assert_int_equal(tp_create(2, &tps[1], NULL), HEARTH_OK);
    assert_int_equal(tp_create(8, &tps[2], NULL), HEARTH_OK); /* the lone tokens (check_tiles) */
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    /* groups: MHA, Gemma 3's 4, Llama 3's 8, and 20 > ATT_TILE_ROWS (a group cut in two) */
    static const int dims[] = {64, 80, 256}, groups[] = {1, 4, 8, 20}, windows[] = {0, 37};
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        for (int di = 0; di < 3; di++)
            for (int gi = 0; gi < 4; gi++)
                for (int wi = 0; wi < 2; wi++)
                    for (int th = 0; th < 2; th++)
                        check_tiles(dims[di], groups[gi], windows[wi], 300, tps[th], tps[2]);
        /* a context past the tile's 2048 positions of scratch per row: rows of slot 1 see
         * ~2500 positions and go one per tile */
        check_tiles(64, 4, 0, 2600, tps[0], tps[2]);
    }
    unsetenv("HEARTH_CPU");
    for (int i = 0; i < 3; i++) tp_destroy(tps[i]);
}

/* Decode rows long enough to run in splits (more than 256 positions; ops_cpu.c
 * attention_split_f32_avx512 when rows are few): one or two tokens, 1 or 3 KV heads with 3
 * query heads each (SmolLM2's shape), windows, on 1, 2 and 8 threads. Within the bound of
 * check() against naive(), and bit for bit the same on every thread count and whether the
 * splits ran as tasks of their own or inside one task (a batch of 12 rows of the same
 * tokens: too many rows for split tasks). */
static void check_splits(int head_dim, int kvh, int window, int context, threadpool **tps, int ntp) {
    enum { LAYERS = 2, GROUP = 3, TB = 12 };
    int heads = kvh * GROUP;
    kv_cache kv;
    assert_int_equal(kv_create(&kv, LAYERS, kvh, head_dim, 2, context, 2 * (context / KV_BLOCK_SIZE) + 4, NULL),
                     HEARTH_OK);
    int lens[2] = {context - (int)(rnd() % 200), 257 + (int)(rnd() % 300)};
    for (int s = 0; s < 2; s++) assert_int_equal(kv_reserve(&kv, s, lens[s], NULL), HEARTH_OK);
    size_t nf = (size_t)LAYERS * kv.n_blocks * kv.block_floats;
    for (size_t i = 0; i < nf; i++) {
        kv.k[i] = rndf() * 2;
        kv.v[i] = rndf();
    }
    int32_t slot[TB], pos[TB];
    for (int t = 0; t < TB; t++) slot[t] = t % 2, pos[t] = lens[t % 2] - 1;
    size_t row = (size_t)heads * head_dim;
    float *q = malloc(TB * row * 4), *first = malloc(2 * row * 4), *out = malloc(TB * row * 4);
    for (size_t i = 0; i < 2 * row; i++) q[i] = rndf();
    for (int t = 2; t < TB; t++) memcpy(q + t * row, q + (t % 2) * row, row * 4);
    float *scratch = malloc(ops_attention_scratch(&kv) * 4 * 8);
    double *want = malloc(sizeof(double) * (size_t)head_dim);
    for (int i = 0; i <= ntp; i++) {
        int T = i < ntp ? 2 : TB; /* the last run: the batch */
        threadpool *tp = tps[i < ntp ? i : 0];
        ops_attention_args a = {.kv = &kv, .layer = 1, .q = q, .out = out, .T = T, .n_heads = heads,
                                .n_kv_heads = kvh, .head_dim = head_dim, .pos = pos, .slot = slot,
                                .window = window, .scale = 1.0f / sqrtf((float)head_dim), .scratch = scratch};
        for (size_t j = 0; j < TB * row; j++) out[j] = NAN; /* nothing left over from the run before */
        ops_attention(&a, tp);
        if (i == 0) memcpy(first, out, 2 * row * 4);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++) {
                naive(&kv, 1, slot[t], pos[t], h / GROUP, window, q + t * row + (size_t)h * head_dim, head_dim, a.scale,
                      want);
                for (int j = 0; j < head_dim; j++) {
                    size_t o = t * row + (size_t)h * head_dim + j;
                    if (memcmp(&out[o], &first[(t % 2) * row + (size_t)h * head_dim + j], 4))
                        fail_msg("%s d=%d kvh=%d window=%d run %d (T=%d, %d threads): token %d head %d [%d] %.9g, "
                                 "first run %.9g",
                                 cpu_level_name(cpu_level_active()), head_dim, kvh, window, i, T, tp_threads(tp), t, h,
                                 j, out[o], first[(t % 2) * row + (size_t)h * head_dim + j]);
                    if (!(fabs(out[o] - want[j]) <= 2e-5))
                        fail_msg("%s d=%d kvh=%d window=%d: token %d head %d [%d] = %.8g, want %.8g",
                                 cpu_level_name(cpu_level_active()), head_dim, kvh, window, t, h, j, out[o], want[j]);
                }
            }
    }
    free(want);
    free(q);
    free(first);
    free(out);
    free(scratch);
    kv_destroy(&kv);
}

static void test_attention_splits(void **state) {
    (void)state;
    threadpool *tps[3];
    assert_int_equal(tp_create(1, &tps[0], NULL), HEARTH_OK);
    assert_int_equal(tp_create(2, &tps[1], NULL), HEARTH_OK);
    assert_int_equal(tp_create(8, &tps[2], NULL), HEARTH_OK);
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        static const int dims[] = {64, 256}, kvhs[] = {1, 3}, windows[] = {0, 700}, contexts[] = {1200, 4100};
        for (int di = 0; di < 2; di++)
            for (int ki = 0; ki < 2; ki++)
                for (int wi = 0; wi < 2; wi++)
                    for (int ci = 0; ci < 2; ci++) check_splits(dims[di], kvhs[ki], windows[wi], contexts[ci], tps, 3);
    }
    unsetenv("HEARTH_CPU");
    for (int i = 0; i < 3; i++) tp_destroy(tps[i]);
}

static void test_activations_match_double(void **state) {
    (void)state;
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    enum { N = 1003 };
    float *g = malloc(N * 4), *u = malloc(N * 4), *out = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        g[i] = rndf() * (i % 5 == 0 ? 40.0f : 6.0f); /* some far into both saturated tails */
        u[i] = rndf() * 3;
    }
    g[0] = 0, g[1] = 100, g[2] = -100, g[3] = 1e-30f, g[4] = -88.5f;
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        for (int gelu = 0; gelu < 2; gelu++) {
            memcpy(out, g, N * 4);
            if (gelu) ops_gelu_tanh_mul(out, u, N);
            else ops_silu_mul(out, u, N);
            for (int i = 0; i < N; i++) {
                double x = g[i], want;
                if (gelu) want = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i];
                else want = x / (1 + exp(-x)) * u[i];
                /* ~1e-6 relative (exp polynomial 2e-7, a division, products), plus float
                 * rounding of 1 + tanh(u) near tanh = -1 (the scalar path's cancellation):
                 * ~6e-8 absolute on the factor, so 1e-7 * |g * up| */
                if (!(fabs(out[i] - want) <= 2e-6 * fabs(want) + 1e-7 * fabs(x * u[i]) + 1e-30))
                    fail_msg("%s %s(%.9g) * %.9g = %.9g, want %.9g", levels[lv], gelu ? "gelu" : "silu", g[i], u[i],
                             out[i], want);
            }
        }
    }
    unsetenv("HEARTH_CPU");
    free(g);
    free(u);
    free(out);
}

/* ops_softcap against cap * tanh(x / cap) in double, at every level: logits far into both
 * tails, zero and tiny ones, odd lengths. The vector path's error is absolute (a few ulps
 * of 1 before the product by cap): 1e-6 of cap, and 1e-6 relative. */
static void test_softcap_matches_double(void **state) {
    (void)state;
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    enum { N = 1003 };
    float *x = malloc(N * 4), *out = malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = rndf() * (i % 7 == 0 ? 400.0f : 40.0f);
    x[0] = 0, x[1] = 1e-30f, x[2] = -3e4f, x[3] = 3e4f, x[4] = 1e-3f;
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        for (int ci = 0; ci < 2; ci++) {
            float cap = ci ? 30.0f : 50.0f; /* Gemma 4's final softcap, Gemma 2's attention one */
            for (int n = N; n >= N - 9; n -= 3) {
                memcpy(out, x, N * 4);
                ops_softcap(out, (size_t)n, cap);
                for (int i = 0; i < N; i++) {
                    double want = i < n ? cap * tanh((double)x[i] / cap) : x[i];
                    if (!(fabs(out[i] - want) <= 1e-6 * cap + 1e-6 * fabs(want)))
                        fail_msg("%s softcap(%.9g, cap %g, n %d)[%d] = %.9g, want %.9g", levels[lv], x[i], cap, n, i,
                                 out[i], want);
                }
            }
        }
    }
    unsetenv("HEARTH_CPU");
    free(x);
    free(out);
}

/* The rule ops_argmax promises: the loop `if (x[i] > x[best]) best = i`. */
static int argmax_rule(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_argmax_matches_rule(void **state) {
    (void)state;
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    enum { N = 262144 + 5 };
    float *x = malloc(N * sizeof *x);
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        for (int c = 0; c < 400; c++) {
            int n = c < 40 ? 1 + c : c < 399 ? 1 + (int)(rnd() % 3000) : N;
            int kind = c % 5;
            for (int i = 0; i < n; i++) {
                x[i] = kind == 1 ? (float)(rnd() % 4) : rndf() * 10; /* kind 1: many ties */
                if (kind == 2 && rnd() % 7 == 0) x[i] = NAN;
                if (kind == 3) x[i] = -INFINITY;
            }
            if (kind == 4) x[0] = NAN; /* nothing compares above a NaN first */
            if (kind == 2 && n > 1) x[rnd() % n] = 1e30f;
            int got = ops_argmax(x, n), want = argmax_rule(x, n);
            if (got != want) fail_msg("%s n %d kind %d: argmax %d, rule %d", levels[lv], n, kind, got, want);
        }
    }
    unsetenv("HEARTH_CPU");
    free(x);
}

/* ops_all_finite against isfinite over every value, at every level: clean rows of every
 * length around the 8-lane step, and one Inf, -Inf or NaN (quiet or signalling, either sign)
 * at every position of them, in the lane blocks and the tail. */
static void test_all_finite_matches_isfinite(void **state) {
    (void)state;
    static const char *levels[] = {"scalar", "avx2", "avx512"};
    uint32_t bad_bits[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u};
    float x[41];
    for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
        setenv("HEARTH_CPU", levels[lv], 1);
        for (int n = 0; n <= 41; n++) {
            for (int i = 0; i < n; i++) x[i] = rndf() * 3e38f; /* large, finite */
            if (n) x[rnd() % n] = 3.4028235e38f;               /* FLT_MAX: finite */
            assert_int_equal(ops_all_finite(x, (size_t)n), 1);
            for (int at = 0; at < n; at++) {
                float keep = x[at];
                memcpy(&x[at], &bad_bits[(size_t)at % 5], sizeof x[at]);
                if (ops_all_finite(x, (size_t)n))
                    fail_msg("%s n %d: %08x at %d not seen", levels[lv], n, bad_bits[at % 5], at);
                x[at] = keep;
            }
        }
    }
    unsetenv("HEARTH_CPU");
}

static void test_op_expf_matches_double(void **state) {
    (void)state;
    double worst = 0.0;
    for (float x = -103.0f; x <= 88.7f; x = nextafterf(x, 100.0f) + 1e-4f * fabsf(x) * 0.37f + 1e-7f) {
        double want = exp((double)x), got = op_expf(x);
        /* one ulp of want as a float: its spacing at want's binade (subnormals: the fixed 2^-149) */
        double ulp = want < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
        double err = fabs(got - want) / ulp;
        if (err > worst) worst = err;
        if (!(err <= 2.0)) printf("op_expf(%.9g) = %.9g, exp = %.17g: %.2f ulp\n", x, got, want, err);
        assert_true(err <= 2.0);
    }
    printf("op_expf: largest error %.3f ulp\n", worst);
    assert_true(op_expf(0.0f) == 1.0f);
    assert_true(op_expf(-200.0f) == 0.0f && op_expf(-INFINITY) == 0.0f);
    assert_true(isinf(op_expf(100.0f)) && isinf(op_expf(INFINITY)));
    assert_true(isnan(op_expf(NAN)));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention_matches_naive),
                                       cmocka_unit_test(test_attention_tiles_match_tokens),
                                       cmocka_unit_test(test_attention_splits),
                                       cmocka_unit_test(test_activations_match_double),
                                       cmocka_unit_test(test_softcap_matches_double),
                                       cmocka_unit_test(test_argmax_matches_rule),
                                       cmocka_unit_test(test_all_finite_matches_isfinite),
                                       cmocka_unit_test(test_op_expf_matches_double)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
