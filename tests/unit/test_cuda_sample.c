/* test_cuda_sample.c: the device sampler (cuda_sample.cu) against the host sampler
 * (engine/sampler.c, the oracle) on random logits rows with per-row parameters: greedy ids,
 * the surviving token set of every filter, logprobs, the draw's distribution (chi-square
 * against the host's probabilities), and (seed, position) determinism across batch order
 * and size. Philox's known answers are checked everywhere; where no GPU exists it says
 * loudly that the device tests did NOT run (exit 0, as test_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_sample: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO device sampler test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sample.h"
#include "engine/sampler.h"

/* Random123's published known-answer vectors for Philox4x32-10. */
static void test_philox_known_answers(void **state) {
    (void)state;
    uint32_t zero[4] = {0}, zk[2] = {0}, ones[4] = {~0u, ~0u, ~0u, ~0u}, ok[2] = {~0u, ~0u}, out[4];
    cuda_sample_philox(zero, zk, out);
    assert_true(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
    cuda_sample_philox(ones, ok, out);
    assert_true(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */
static int pick(int n) { return (int)(rnd() % (uint32_t)n); }

#define MAX_ROWS 48
#define HIST 64

/* One test row: logits, its parameters, history, bias, and the reference's results. */
typedef struct trow {
    hearth_sampling p;
    int32_t hist[HIST];
    int32_t bias_ids[6];
    float bias_vals[6];
    hearth_logprobs lp;
} trow;

static void make_logits(float *x, int V, int kind) {
    for (int i = 0; i < V; i++) {
        float g = rndf() + rndf() + rndf(); /* roughly normal */
        x[i] = kind == 0 ? 3.0f * g : kind == 1 ? roundf(2.0f * g) / 2.0f /* many ties */ : 8.0f * g;
    }
}

static void make_params(trow *t, int V, int greedy) {
    static const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f}, top_ps[] = {1.0f, 0.5f, 0.9f, 0.95f, 0.0f};
    static const int top_ks[] = {0, 1, 5, 40, 1000, 0};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.2f};
    hearth_sampling *p = &t->p;
    memset(t, 0, sizeof *t);
    p->temperature = greedy ? 0.0f : temps[pick(4)];
    p->top_p = top_ps[pick(5)];
    p->top_k = top_ks[pick(6)];
    p->min_p = min_ps[pick(4)];
    p->repetition_penalty = pick(2) ? 1.0f : 1.3f;
    p->repetition_context_size = pick(2) ? 0 : 48;
    p->presence_penalty = pick(3) ? 0.0f : 0.5f;
    p->frequency_penalty = pick(3) ? 0.0f : 0.25f;
    for (int i = 0; i < HIST; i++) t->hist[i] = pick(4) ? pick(V < 40 ? V : 40) : pick(V); /* repeats */
    int nb = pick(4) ? 0 : 1 + pick(6);
    for (int i = 0; i < nb; i++) {
        t->bias_ids[i] = i > 0 && pick(3) == 0 ? t->bias_ids[0] : pick(V); /* a repeated id adds twice */
        t->bias_vals[i] = 6.0f * rndf();
    }
    p->bias_ids = t->bias_ids, p->bias_values = t->bias_vals, p->n_bias = (size_t)nb;
    static const int tops[] = {0, 1, 5, 20};
    p->top_logprobs = tops[pick(4)];
}

/* Relative to max(1, |b|): logprobs near 0 would make a pure relative test meaningless. */
static void assert_close(float a, float b, double tol, const char *what, int row) {
    double d = fabs((double)a - b), lim = tol * (fabs((double)b) > 1 ? fabs((double)b) : 1.0);
    if (!(d <= lim)) {
        printf("row %d %s: device %.9g host %.9g (diff %.3g > %.3g)\n", row, what, a, b, d, lim);
        fail();
    }
}

/* R rows of vocabulary V: greedy ids, survivor sets and logprobs against the host sampler.
 * Every constrained_every-th row (0: none) carries a constraint's token mask (a random third
 * of the tokens below a random allow_n, the end of the vocabulary past it forbidden); the
 * host's reference is its sampler on the row with the forbidden tokens at -inf, as
 * generate.c's constrained_logits hands it. */
static void check_rows_c(int V, int R, int kind, int greedy_every, int constrained_every) {
    float *x = malloc((size_t)R * V * sizeof *x);
    float *hx = malloc((size_t)R * V * sizeof *hx); /* the host's rows: masked where constrained */
    uint8_t *mask = malloc((size_t)R * V);
    trow *rows = calloc((size_t)R, sizeof *rows);
    int words = (V + 31) / 32, n_constrained = 0;
    uint32_t *allow = calloc((size_t)R * words, sizeof *allow);
    cuda_sample_req req[MAX_ROWS];
    int32_t ids[MAX_ROWS];
    for (int r = 0; r < R; r++) {
        make_logits(x + (size_t)r * V, V, kind);
        make_params(&rows[r], V, greedy_every && r % greedy_every == 0);
        rows[r].lp.n = rows[r].p.top_logprobs;
        req[r] = (cuda_sample_req){.p = &rows[r].p,
                                   .history = rows[r].hist,
                                   .n_history = HIST,
                                   .seed = rnd() | (uint64_t)rnd() << 32,
                                   .lp = rows[r].p.top_logprobs || r % 2 ? &rows[r].lp : NULL};
        memcpy(hx + (size_t)r * V, x + (size_t)r * V, (size_t)V * sizeof *x);
        if (!constrained_every || r % constrained_every) continue;
        uint32_t *a = allow + (size_t)r * words;
        int n = V - pick(V / 4 + 1), some = pick(n); /* one allowed token at least */
        for (int v = 0; v < n; v++)
            if (v == some || pick(3) == 0) a[v >> 5] |= 1u << (v & 31);
        for (int v = 0; v < V; v++)
            if (v >= n || !(a[v >> 5] >> (v & 31) & 1)) hx[(size_t)r * V + v] = -INFINITY;
        req[r].allow = a, req[r].allow_n = n;
        n_constrained++;
    }
    cuda_sampler *s;
    hearth_error e = {0};
    assert_int_equal(cuda_sampler_create(MAX_ROWS, V, &s, &e), HEARTH_OK);
    cuda_sampler_sizes z; /* what cuda_plan (hearth fit --device cuda) counts for it */
    cuda_sampler_sizes_make(MAX_ROWS, V, &z);
    assert_int_equal(cuda_sampler_device_bytes(s), cuda_sampler_sizes_device(&z));
    float *dx;
    uint8_t *dm;
    assert_int_equal(cuda_alloc((void **)&dx, (size_t)R * V * sizeof *x, "logits", &e), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&dm, (size_t)R * V, "mask", &e), HEARTH_OK);
    assert_int_equal(cuda_upload(dx, x, (size_t)R * V * sizeof *x, &e), HEARTH_OK);
    hearth_status st = cuda_sampler_run_masked(s, dx, R, req, ids, dm, &e);
    if (st) printf("cuda_sampler_run: %s\n", e.message);
    assert_int_equal(st, HEARTH_OK);
    assert_int_equal(cuda_download(mask, dm, (size_t)R * V, &e), HEARTH_OK);
    sampler h;
    assert_int_equal(sampler_init(&h, V, &e), HEARTH_OK);
    uint8_t *hm = malloc((size_t)V);
    int sizes[4] = {0}; /* survivors: 1, <=40, <=1000, more (shows what the rows exercised) */
    for (int r = 0; r < R; r++) {
        const float *row = hx + (size_t)r * V;
        const hearth_sampling *p = &rows[r].p;
        int n = sampler_survivors(&h, row, p, rows[r].hist, HIST);
        sizes[n == 1 ? 0 : n <= 40 ? 1 : n <= 1000 ? 2 : 3]++;
        memset(hm, 0, (size_t)V);
        for (int i = 0; i < n; i++) hm[h.cand[i]] = 1;
        int diff = 0, first = -1;
        for (int v = 0; v < V; v++)
            if (hm[v] != mask[(size_t)r * V + v]) diff++, first = first < 0 ? v : first;
        if (diff) {
            printf("V %d row %d (T %.2f top_k %d top_p %.2f min_p %.2f rep %.2f pres %.2f freq %.2f bias %zu): "
                   "%d tokens differ in the survivor set (host keeps %d), first id %d (host %d device %d)\n",
                   V, r, p->temperature, p->top_k, p->top_p, p->min_p, p->repetition_penalty, p->presence_penalty,
                   p->frequency_penalty, p->n_bias, diff, n, first, hm[first], mask[(size_t)r * V + first]);
            fail();
        }
        assert_true(mask[(size_t)r * V + ids[r]]); /* the draw comes from the survivors */
        hearth_logprobs hl = {.n = p->top_logprobs};
        int32_t hid = sampler_sample(&h, row, p, rows[r].hist, HIST, &hl);
        if (p->temperature <= 0) assert_int_equal(ids[r], hid); /* greedy: identical ids */
        if (!req[r].lp) continue;
        /* logprobs are x - lse in float on both sides; lse's double sum differs only in its
         * order (and by 1 ulp of exp/log on the device), so the floats agree to about an ulp
         * of lse: 1e-5 relative leaves room and still catches any wrong term (>= 1e-3) */
        float lse = h.work[hid] - hl.logprob;
        assert_close(rows[r].lp.logprob, h.work[ids[r]] - lse, 1e-5, "chosen logprob", r);
        assert_int_equal(rows[r].lp.n, hl.n);
        for (int i = 0; i < hl.n; i++) {
            if (rows[r].lp.top_ids[i] != hl.top_ids[i]) {
                printf("V %d row %d top logprob %d: device id %d host id %d\n", V, r, i, rows[r].lp.top_ids[i],
                       hl.top_ids[i]);
                fail();
            }
            assert_close(rows[r].lp.top_logprobs[i], hl.top_logprobs[i], 1e-5, "top logprob", r);
        }
    }
    printf("  V %d, %d rows (logits kind %d, %d with a token mask): survivor sets 1:%d <=40:%d <=1000:%d more:%d, all "
           "equal the host's\n",
           V, R, kind, n_constrained, sizes[0], sizes[1], sizes[2], sizes[3]);
    sampler_free(&h);
    free(hm);
    cuda_free(dx);
    cuda_free(dm);
    cuda_sampler_free(s);
    free(x);
    free(hx);
    free(allow);
    free(mask);
    free(rows);
}

static void check_rows(int V, int R, int kind, int greedy_every) { check_rows_c(V, R, kind, greedy_every, 0); }

static void test_rows_against_host(void **state) {
    (void)state;
    if (getenv("HEARTH_SAMPLE_QUICK")) { /* a small run for compute-sanitizer (racecheck is slow) */
        check_rows(151, 8, 1, 4);
        check_rows(2100, 4, 0, 4);
        return;
    }
    check_rows(32000, MAX_ROWS, 0, 4);
    check_rows(151, MAX_ROWS, 0, 4);
    check_rows(151, MAX_ROWS, 1, 5); /* ties everywhere: the id passes decide */
    check_rows(32000, MAX_ROWS, 1, 5);
    check_rows(128256, 16, 2, 4); /* Llama-3's vocabulary: 17-bit ids */
}

/* Constrained rows (a token mask each) beside unconstrained ones in one launch. */
static void test_constraint_masks(void **state) {
    (void)state;
    check_rows_c(151, MAX_ROWS, 0, 4, 2);
    check_rows_c(32000, MAX_ROWS, 1, 3, 2);
    check_rows_c(128256, 16, 2, 4, 1);
}

/* Draws of one row under many (seed, position) keys against the host's probabilities. */
static void test_distribution(void **state) {
    (void)state;
    enum { V = 151, R = MAX_ROWS, ROUNDS = 420 }; /* 20160 draws */
    float x[V];
    for (int i = 0; i < V; i++) x[i] = rndf() + rndf() + rndf(); /* flat: dozens of survivors */
    hearth_sampling p = {.temperature = 0.8f, .top_p = 0.95f, .top_k = 60, .min_p = 0.2f, .repetition_penalty = 1};
    sampler h;
    hearth_error e = {0};
    assert_int_equal(sampler_init(&h, V, &e), HEARTH_OK);
    int n = sampler_survivors(&h, x, &p, NULL, 0);
    double prob[V] = {0}, tot = 0, mx = h.work[h.cand[0]];
    for (int i = 0; i < n; i++) tot += prob[h.cand[i]] = exp((double)(h.work[h.cand[i]] - (float)mx) * (1.0 / 0.8));
    for (int v = 0; v < V; v++) prob[v] /= tot;
    cuda_sampler *s;
    assert_int_equal(cuda_sampler_create(R, V, &s, &e), HEARTH_OK);
    float *dx;
    assert_int_equal(cuda_alloc((void **)&dx, sizeof x * R, "logits", &e), HEARTH_OK);
    for (int r = 0; r < R; r++) assert_int_equal(cuda_upload(dx + r * V, x, sizeof x, &e), HEARTH_OK);
    long count[V] = {0};
    cuda_sample_req req[R];
    int32_t ids[R];
    for (int k = 0; k < ROUNDS; k++) {
        for (int r = 0; r < R; r++) /* half vary the seed, half the position */
            req[r] = (cuda_sample_req){.p = &p,
                                       .n_history = r % 2 ? (size_t)(k * R + r) : 7,
                                       .seed = r % 2 ? 42 : (uint64_t)(k * R + r) * 0x9E3779B97F4A7C15ull};
        assert_int_equal(cuda_sampler_run(s, dx, R, req, ids, &e), HEARTH_OK);
        for (int r = 0; r < R; r++) count[ids[r]]++;
    }
    double N = (double)R * ROUNDS, chi = 0, pool_o = 0, pool_e = 0;
    int bins = 0;
    for (int v = 0; v < V; v++) {
        if (prob[v] == 0) {
            if (count[v]) printf("token %d drawn %ld times but the host's filters drop it\n", v, count[v]);
            assert_int_equal(count[v], 0);
            continue;
        }
        if (prob[v] * N < 5) {
            pool_o += count[v], pool_e += prob[v] * N;
            continue;
        } /* chi-square needs >= 5 */
        chi += (count[v] - prob[v] * N) * (count[v] - prob[v] * N) / (prob[v] * N), bins++;
    }
    if (pool_e > 0) chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
    int df = bins - 1;
    /* df + 6 sqrt(2 df): beyond the 1e-6 tail of chi-square for these df (a fair sampler
     * fails about once in a million runs; a biased one by a few percent fails always) */
    double lim = df + 6.0 * sqrt(2.0 * df);
    printf("  distribution: %d survivors, %.0f draws, chi-square %.1f over %d df (limit %.1f)\n", n, N, chi, df, lim);
    assert_true(df >= 5 && chi < lim);
    sampler_free(&h);
    cuda_free(dx);
    cuda_sampler_free(s);
}

/* The same (seed, position) gives the same token whatever the batch's order and size. */
static void test_batch_invariance(void **state) {
    (void)state;
    enum { V = 32000, R = 24 };
    float *x = malloc(sizeof(float) * V * R);
    trow rows[R];
    static int32_t hist[R][HIST + 1024]; /* positions up to HIST + 1023 below */
    cuda_sample_req req[R], one[R];
    int32_t a[R], b[R], c[1];
    for (int r = 0; r < R; r++) {
        make_logits(x + (size_t)r * V, V, 0);
        make_params(&rows[r], V, r % 6 == 0);
        for (int i = 0; i < HIST + 1024; i++) hist[r][i] = pick(V);
        req[r] = (cuda_sample_req){.p = &rows[r].p, .history = hist[r], .n_history = HIST + r, .seed = 1000 + r};
    }
    cuda_sampler *s;
    hearth_error e = {0};
    assert_int_equal(cuda_sampler_create(R, V, &s, &e), HEARTH_OK);
    float *dx;
    assert_int_equal(cuda_alloc((void **)&dx, sizeof(float) * V * R, "logits", &e), HEARTH_OK);
    assert_int_equal(cuda_upload(dx, x, sizeof(float) * V * R, &e), HEARTH_OK);
    assert_int_equal(cuda_sampler_run(s, dx, R, req, a, &e), HEARTH_OK);
    for (int r = 0; r < R; r++) { /* reversed order, logits fresh (the run rewrites them in place) */
        one[r] = req[R - 1 - r];
        assert_int_equal(cuda_upload(dx + (size_t)r * V, x + (size_t)(R - 1 - r) * V, sizeof(float) * V, &e), 0);
    }
    assert_int_equal(cuda_sampler_run(s, dx, R, one, b, &e), HEARTH_OK);
    for (int r = 0; r < R; r++) assert_int_equal(a[r], b[R - 1 - r]);
    for (int r = 0; r < R; r++) { /* alone */
        assert_int_equal(cuda_upload(dx, x + (size_t)r * V, sizeof(float) * V, &e), HEARTH_OK);
        assert_int_equal(cuda_sampler_run(s, dx, 1, &req[r], c, &e), HEARTH_OK);
        assert_int_equal(a[r], c[0]);
    }
    int moved = 0; /* and a different position draws afresh (not a constant) */
    for (int r = 0; r < R; r++) {
        cuda_sample_req q = req[r];
        q.n_history += 999;
        assert_int_equal(cuda_upload(dx, x + (size_t)r * V, sizeof(float) * V, &e), HEARTH_OK);
        assert_int_equal(cuda_sampler_run(s, dx, 1, &q, c, &e), HEARTH_OK);
        moved += c[0] != a[r];
    }
    printf("  batch invariance: %d rows equal in batch, reversed and alone; %d of them moved at another position\n", R,
           moved);
    assert_true(moved > 0);
    free(x);
    cuda_free(dx);
    cuda_sampler_free(s);
}

/* A NaN or infinity in a row is the engine's non-finite logits error. */
static void test_non_finite(void **state) {
    (void)state;
    enum { V = 151 };
    float x[2 * V];
    make_logits(x, 2 * V, 0);
    x[V + 77] = INFINITY;
    hearth_sampling g = {.repetition_penalty = 1}, t = {.temperature = 1, .top_p = 0.9f, .repetition_penalty = 1};
    /* the infinity sits on a token row 1's constraint forbids: still the model's error */
    uint32_t allow[(V + 31) / 32];
    memset(allow, 0xff, sizeof allow);
    allow[77 >> 5] &= ~(1u << (77 & 31));
    cuda_sample_req req[2] = {{.p = &g}, {.p = &t, .allow = allow, .allow_n = V}};
    cuda_sampler *s;
    hearth_error e = {0};
    assert_int_equal(cuda_sampler_create(2, V, &s, &e), HEARTH_OK);
    float *dx;
    int32_t ids[2];
    assert_int_equal(cuda_alloc((void **)&dx, sizeof x, "logits", &e), HEARTH_OK);
    assert_int_equal(cuda_upload(dx, x, sizeof x, &e), HEARTH_OK);
    assert_int_equal(cuda_sampler_run(s, dx, 2, req, ids, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "non-finite"));
    cuda_free(dx);
    cuda_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest host[] = {cmocka_unit_test(test_philox_known_answers)};
    if (cuda_device_count() == 0) {
        printf("test_cuda_sample: skipped: no CUDA device. The device sampler tests did NOT run and do not count "
               "as passed; only Philox's known answers (host copy) are checked below.\n");
        return cmocka_run_group_tests(host, NULL, NULL);
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda_sample: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull; /* fresh rows each run; the seed is printed */
    printf("test_cuda_sample on %s, input seed %llu\n", info.name, (unsigned long long)rng_state);
    if (getenv("HEARTH_SAMPLE_QUICK")) {
        const struct CMUnitTest quick[] = {cmocka_unit_test(test_rows_against_host), cmocka_unit_test(test_non_finite),
                                           cmocka_unit_test(test_constraint_masks)};
        return cmocka_run_group_tests(quick, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers), cmocka_unit_test(test_rows_against_host),
        cmocka_unit_test(test_distribution),         cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_non_finite),           cmocka_unit_test(test_constraint_masks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
