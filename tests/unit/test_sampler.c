/* test_sampler.c: the sampler against the definitions it implements: argmax, softmax
 * frequencies at a temperature (chi-square), the support of top-k / top-p / min-p, the
 * mlx-lm penalty formulas, logit bias, seeding and log-probabilities. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "engine/sampler.h"

static hearth_sampling base(void) {
    hearth_sampling p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

static void test_greedy_and_bias(void **state) {
    (void)state;
    sampler s;
    assert_int_equal(sampler_init(&s, 5, NULL), HEARTH_OK);
    float x[5] = {1, 3, 3, -2, 0};
    hearth_sampling p = base();
    assert_int_equal(sampler_sample(&s, x, &p, NULL, 0, NULL), 1); /* ties: the lower id, as argmax */
    int32_t ids[1] = {4};
    float vals[1] = {3.5f};
    p.bias_ids = ids, p.bias_values = vals, p.n_bias = 1;
    assert_int_equal(sampler_sample(&s, x, &p, NULL, 0, NULL), 4);
    assert_true(x[4] == 0); /* the caller's logits are untouched */
    sampler_free(&s);
}

/* Samples x = {2, -1, 1, 0.5} after hist under p; the reported logprobs must be those of
 * the processed logits `want`, whose best is `best`. */
static void expect_penalized(const hearth_sampling *p, const int32_t *hist, size_t n, const float want[4], int best) {
    sampler s;
    sampler_init(&s, 4, NULL);
    float x[4] = {2.0f, -1.0f, 1.0f, 0.5f};
    hearth_logprobs lp = {.n = 4};
    sampler_sample(&s, x, p, hist, n, &lp);
    double lse = 0;
    for (int i = 0; i < 4; i++) lse += exp(want[i]);
    lse = log(lse);
    for (int i = 0; i < lp.n; i++) assert_float_equal(lp.top_logprobs[i], want[lp.top_ids[i]] - lse, 1e-5);
    assert_int_equal(lp.top_ids[0], best);
    sampler_free(&s);
}

/* mlx-lm: repetition divides positive / multiplies negative logits of ids in the window
 * once; presence subtracts once; frequency subtracts per occurrence. */
static void test_penalties(void **state) {
    (void)state;
    int32_t hist[] = {3, 0, 1, 0, 0}; /* window 3: {1, 0, 0} */
    hearth_sampling p = base();
    p.repetition_penalty = 2.0f;
    p.repetition_context_size = 3;
    p.presence_penalty = 0.25f;
    p.frequency_penalty = 0.5f;
    float want[4] = {2.0f / 2 - 0.25f - 0.5f * 2, -1.0f * 2 - 0.25f - 0.5f, 1.0f, 0.5f};
    expect_penalized(&p, hist, 5, want, 2); /* 1.0 is now the best */
}

/* mlx-lm's make_logits_processors: each penalty over its own window of the history. */
static void test_penalty_windows(void **state) {
    (void)state;
    int32_t hist[] = {1, 3, 0, 1, 0, 2};
    hearth_sampling p = base();
    p.repetition_penalty = 2.0f, p.repetition_context_size = 2; /* {0, 2} */
    p.presence_penalty = 0.25f, p.presence_context_size = 4;    /* {0, 1, 2} */
    p.frequency_penalty = 0.5f, p.frequency_context_size = 5;   /* 3 once, 0 twice, 1 once, 2 once */
    float want[4] = {2.0f / 2 - 0.25f - 0.5f * 2, -1.0f - 0.25f - 0.5f, 1.0f / 2 - 0.25f - 0.5f, 0.5f - 0.5f};
    expect_penalized(&p, hist, 6, want, 3); /* 0.0 is now the best */
}

static void test_logprobs(void **state) {
    (void)state;
    sampler s;
    sampler_init(&s, 6, NULL);
    float x[6] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, -3.0f};
    hearth_sampling p = base();
    hearth_logprobs lp = {.n = 3};
    int32_t id = sampler_sample(&s, x, &p, NULL, 0, &lp);
    double lse = 0;
    for (int i = 0; i < 6; i++) lse += exp(x[i]);
    lse = log(lse);
    assert_int_equal(id, 1);
    assert_float_equal(lp.logprob, x[1] - lse, 1e-5);
    assert_int_equal(lp.n, 3);
    int order[3] = {1, 3, 4};
    for (int i = 0; i < 3; i++) assert_int_equal(lp.top_ids[i], order[i]);
    sampler_free(&s);
}

/* Draw counts at temperature 0.7 against softmax(x / 0.7), chi-square with 4 degrees of
 * freedom: 18.47 is the 0.999 quantile, so a correct sampler fails 1 run in 1000 — and
 * the seed is fixed, so this run's outcome never changes. */
static void test_temperature_distribution(void **state) {
    (void)state;
    sampler s;
    sampler_init(&s, 5, NULL);
    sampler_seed(&s, 1234);
    float x[5] = {1.0f, 0.5f, 0.0f, -0.5f, 0.2f};
    hearth_sampling p = base();
    p.temperature = 0.7f;
    int counts[5] = {0}, draws = 20000;
    for (int i = 0; i < draws; i++) counts[sampler_sample(&s, x, &p, NULL, 0, NULL)]++;
    double z = 0, chi = 0;
    for (int i = 0; i < 5; i++) z += exp(x[i] / 0.7);
    for (int i = 0; i < 5; i++) {
        double e = draws * exp(x[i] / 0.7) / z;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    assert_true(chi < 18.47);
    sampler_free(&s);
}

static void support(sampler *s, const float *x, const hearth_sampling *p, int *seen) {
    memset(seen, 0, 6 * sizeof *seen);
    for (int i = 0; i < 4000; i++) seen[sampler_sample(s, x, p, NULL, 0, NULL)] = 1;
}

static void test_filters(void **state) {
    (void)state;
    sampler s;
    sampler_init(&s, 6, NULL);
    sampler_seed(&s, 99);
    /* probabilities 0.5, 0.3, 0.15, 0.05 and two tiny ones */
    float x[6] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f), logf(1e-9f), logf(1e-9f)};
    int seen[6];
    hearth_sampling p = base();
    p.temperature = 1.0f;
    p.top_k = 2;
    support(&s, x, &p, seen);
    assert_true(seen[0] && seen[1] && !seen[2] && !seen[3]);
    p = base();
    p.temperature = 1.0f;
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: the first two */
    support(&s, x, &p, seen);
    assert_true(seen[0] && seen[1] && !seen[2] && !seen[3]);
    p.top_p = 0.9f; /* 0.8 < 0.9 <= 0.95: three */
    support(&s, x, &p, seen);
    assert_true(seen[2] && !seen[3]);
    p = base();
    p.temperature = 1.0f;
    p.min_p = 0.25f; /* keep p >= 0.125: the first three */
    support(&s, x, &p, seen);
    assert_true(seen[0] && seen[1] && seen[2] && !seen[3] && !seen[4]);
    sampler_free(&s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    sampler a, b;
    sampler_init(&a, 50, NULL);
    sampler_init(&b, 50, NULL);
    float x[50];
    for (int i = 0; i < 50; i++) x[i] = sinf((float)i);
    hearth_sampling p = base();
    p.temperature = 1.5f;
    sampler_seed(&a, 7);
    sampler_seed(&b, 7);
    int same = 1, differ = 0;
    int32_t first[64];
    for (int i = 0; i < 64; i++) {
        first[i] = sampler_sample(&a, x, &p, NULL, 0, NULL);
        same &= first[i] == sampler_sample(&b, x, &p, NULL, 0, NULL);
    }
    sampler_seed(&b, 8);
    for (int i = 0; i < 64; i++) differ |= first[i] != sampler_sample(&b, x, &p, NULL, 0, NULL);
    assert_true(same);
    assert_true(differ);
    sampler_free(&a);
    sampler_free(&b);
}


/* A large vocabulary at a temperature with no filter: the draw takes the bucketed path
 * (sampler.c draw_in_order), which must pick, seed for seed, what the full sort's walk
 * picks (top_k = the vocabulary forces that walk without cutting anything), over spread,
 * tied, flat and peaked logits; and its frequencies must follow the softmax (chi-square
 * over the 4 top tokens and the rest, 5 cells: 4 degrees of freedom, 18.47 is p = 0.001). */
static void test_large_vocab_draw(void **state) {
    (void)state;
    enum { V = 50000 };
    static float x[V];
    sampler a, b;
    assert_int_equal(sampler_init(&a, V, NULL), HEARTH_OK);
    assert_int_equal(sampler_init(&b, V, NULL), HEARTH_OK);
    uint64_t lcg = 12345;
    for (int shape = 0; shape < 4; shape++) {
        for (int i = 0; i < V; i++) {
            lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
            float u = (float)((lcg >> 11) * 0x1.0p-53);
            x[i] = shape == 0 ? 12 * u - 6 : shape == 1 ? floorf(8 * u) : shape == 2 ? 0 : (i % 997 == 3 ? 9 + u : -4 * u);
        }
        hearth_sampling p = base(), sorted;
        p.temperature = shape == 3 ? 0.8f : 1.3f;
        sorted = p;
        sorted.top_k = V;
        sampler_seed(&a, 100 + (uint64_t)shape);
        sampler_seed(&b, 100 + (uint64_t)shape);
        for (int i = 0; i < 100; i++)
            assert_int_equal(sampler_sample(&a, x, &p, NULL, 0, NULL), sampler_sample(&b, x, &sorted, NULL, 0, NULL));
    }
    sampler_free(&a);
    sampler_free(&b);
    /* frequencies: 4 tokens carry most of the mass, the rest share the remainder */
    enum { VF = 8192 };
    assert_int_equal(sampler_init(&a, VF, NULL), HEARTH_OK);
    for (int i = 0; i < VF; i++) x[i] = -2.0f - (float)(i % 7) * 0.1f;
    const int top[4] = {17, 4242, 6001, 8191};
    const float lv[4] = {8.0f, 7.5f, 7.0f, 6.0f};
    for (int k = 0; k < 4; k++) x[top[k]] = lv[k];
    hearth_sampling p = base();
    p.temperature = 1.0f;
    double z = 0, pr[5] = {0};
    for (int i = 0; i < VF; i++) z += exp(x[i]);
    for (int k = 0; k < 4; k++) pr[k] = exp(lv[k]) / z;
    pr[4] = 1 - pr[0] - pr[1] - pr[2] - pr[3];
    const int N = 10000;
    int count[5] = {0};
    sampler_seed(&a, 9);
    for (int i = 0; i < N; i++) {
        int32_t t = sampler_sample(&a, x, &p, NULL, 0, NULL);
        int k = 0;
        while (k < 4 && top[k] != t) k++;
        count[k]++;
    }
    double chi2 = 0;
    for (int k = 0; k < 5; k++) chi2 += (count[k] - N * pr[k]) * (count[k] - N * pr[k]) / (N * pr[k]);
    assert_true(chi2 < 18.47);
    sampler_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_bias),          cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_penalty_windows),          cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_temperature_distribution), cmocka_unit_test(test_filters),
        cmocka_unit_test(test_seed_reproducible),        cmocka_unit_test(test_large_vocab_draw),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
