/* test_sampler_rows.c: sampler_sample_rows (all rows of a step in one pass, over the
 * thread pool) against sampler_sample called row by row: with the same seeds, every
 * row's tokens and log-probabilities must be bit-identical, whatever the thread count,
 * for a mix of greedy and sampled rows with penalties, filters and top logprobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

#define ROWS 13
#define VOCAB 1000
#define STEPS 24

static uint64_t rng_state = 0x12345678abcdefULL;
static float rnd(void) { /* xorshift: fixed test data */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0));
}

/* Row r's parameters: every fourth row greedy, the others sampled with different filters. */
static hearth_sampling params(int r) {
    hearth_sampling p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    if (r % 4 == 0) return p;
    p.temperature = 0.3f + 0.2f * (float)(r % 5);
    if (r % 3 == 1) p.top_k = 20 + r;
    if (r % 3 == 2) p.top_p = 0.9f;
    if (r % 5 == 3) p.min_p = 0.05f;
    if (r % 2) p.repetition_penalty = 1.3f, p.presence_penalty = 0.2f, p.frequency_penalty = 0.1f;
    p.top_logprobs = r % 6;
    return p;
}

typedef struct run {
    int32_t tokens[ROWS][STEPS];
    hearth_logprobs lp[ROWS][STEPS];
} run;

/* STEPS steps of ROWS rows; per_row: sampler_sample in a loop, else sampler_sample_rows
 * on tp. Each step's logits are the same for both (fixed data), histories grow with the
 * rows' own tokens. */
static void run_rows(const float *logits, int per_row, threadpool *tp, run *out) {
    sampler s[ROWS];
    hearth_sampling p[ROWS];
    int32_t hist[ROWS][STEPS + 4];
    for (int r = 0; r < ROWS; r++) {
        assert_int_equal(sampler_init(&s[r], VOCAB, NULL), HEARTH_OK);
        sampler_seed(&s[r], 1000 + (uint64_t)r);
        p[r] = params(r);
        for (int i = 0; i < 4; i++) hist[r][i] = (r * 37 + i * 11) % VOCAB;
    }
    for (int step = 0; step < STEPS; step++) {
        sampler_row rows[ROWS];
        for (int r = 0; r < ROWS; r++) {
            out->lp[r][step].n = p[r].top_logprobs;
            rows[r] = (sampler_row){.s = &s[r], .logits = logits + ((size_t)step * ROWS + r) * VOCAB, .p = &p[r],
                                    .history = hist[r], .n_history = (size_t)(4 + step), .lp = &out->lp[r][step]};
        }
        if (per_row)
            for (int r = 0; r < ROWS; r++)
                rows[r].token = sampler_sample(rows[r].s, rows[r].logits, rows[r].p, rows[r].history,
                                               rows[r].n_history, rows[r].lp);
        else
            sampler_sample_rows(rows, ROWS, tp);
        for (int r = 0; r < ROWS; r++) {
            out->tokens[r][step] = rows[r].token;
            hist[r][4 + step] = rows[r].token;
        }
    }
    for (int r = 0; r < ROWS; r++) sampler_free(&s[r]);
}

static void test_rows_equal_per_row(void **state) {
    (void)state;
    size_t n = (size_t)STEPS * ROWS * VOCAB;
    float *logits = malloc(n * sizeof *logits);
    assert_non_null(logits);
    for (size_t i = 0; i < n; i++) logits[i] = 8.0f * rnd() - 4.0f;
    run *want = calloc(1, sizeof *want), *got = calloc(1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    run_rows(logits, 1, NULL, want);
    int distinct = 0; /* the sampled rows really sample: not all one token */
    for (int s = 1; s < STEPS; s++) distinct += want->tokens[1][s] != want->tokens[1][0];
    assert_true(distinct > 0);
    int thread_counts[] = {1, 2, 4};
    for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
        threadpool *tp;
        assert_int_equal(tp_create(thread_counts[t], &tp, NULL), HEARTH_OK);
        memset(got, 0, sizeof *got);
        run_rows(logits, 0, tp, got);
        /* bit-identical, logprobs included: the same function runs on the same inputs */
        assert_memory_equal(got->tokens, want->tokens, sizeof want->tokens);
        for (int r = 0; r < ROWS; r++)
            for (int s = 0; s < STEPS; s++) {
                const hearth_logprobs *a = &got->lp[r][s], *b = &want->lp[r][s];
                assert_memory_equal(&a->logprob, &b->logprob, sizeof a->logprob);
                assert_int_equal(a->n, b->n);
                assert_memory_equal(a->top_ids, b->top_ids, (size_t)b->n * sizeof b->top_ids[0]);
                assert_memory_equal(a->top_logprobs, b->top_logprobs, (size_t)b->n * sizeof b->top_logprobs[0]);
            }
        tp_destroy(tp);
    }
    free(want);
    free(got);
    free(logits);
}

static void test_zero_and_one_row(void **state) {
    (void)state;
    sampler s;
    assert_int_equal(sampler_init(&s, 4, NULL), HEARTH_OK);
    float x[4] = {0, 2, 1, -1};
    hearth_sampling p = params(0);
    sampler_row row = {.s = &s, .logits = x, .p = &p, .token = -7};
    sampler_sample_rows(&row, 0, NULL);
    assert_int_equal(row.token, -7); /* nothing to do */
    sampler_sample_rows(&row, 1, NULL);
    assert_int_equal(row.token, 1);
    sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_equal_per_row),
        cmocka_unit_test(test_zero_and_one_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
