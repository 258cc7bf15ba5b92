/* test_hybrid.c: a hybrid model (the tiny Qwen3.5: Gated DeltaNet layers with per-sequence
 * recurrent state, and gated attention) in the engine: requests batched in one ragged step,
 * through small prefill chunks and a KV pool small enough that requests wait, give exactly
 * what each gives alone; a second chat turn that repeats the first turn's prompt and answer
 * takes them from the prefix cache (KV blocks + a state snapshot) and answers exactly as a
 * fresh engine does. The reference kernels (HEARTH_CPU=scalar) compute every row
 * independently, so token ids and logprobs must be bit-identical. Token-level parity with
 * mlx-lm is tests/parity/test_forward_parity.py's (goldens qwen3_5-*). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearth.h"
#include "tiny_model_path.h"

#define MAXT REC_MAX
static hearth_generate_params greedy(int max_tokens) { return greedy_params(max_tokens, 1); }

/* one request on a fresh engine: the answer with nothing cached */
static void run_alone(hearth_model *m, const hearth_engine_options *o, const int32_t *ids, size_t n,
                      const hearth_generate_params *p, rec *out) {
    hearth_error err = {0};
    hearth_engine *e = NULL;
    assert_int_equal(hearth_engine_create(m, o, &e, &err), HEARTH_OK);
    memset(out, 0, sizeof *out);
    assert_int_equal(hearth_generate(e, ids, n, p, rec_token, out, &out->res, &err), HEARTH_OK);
    hearth_engine_free(e);
}

#define N_REQ 5
static const char *texts[N_REQ] = {
    "hello world", "the quick brown fox jumps over the lazy dog and keeps running far away",
    "a", "numbers 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26",
    "once upon a time there was a model whose state was carried from one step to the next"};

/* Five requests of different lengths submitted at once: decode rows and prefill chunks of
 * different sequences share steps, each on its own recurrent state. */
static void batch_vs_alone(const char *model, int kv_blocks, int step_tokens, int max_tokens) {
    hearth_model *m = open_tiny(model);
    hearth_error err = {0};
    hearth_engine_options o = {.n_threads = 2, .context_length = 256, .max_sequences = 4, .kv_blocks = kv_blocks,
                               .max_step_tokens = step_tokens};
    hearth_engine *e = NULL;
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    int32_t *ids[N_REQ];
    size_t n_ids[N_REQ];
    hearth_generate_params p[N_REQ];
    static rec alone[N_REQ], batched[N_REQ];
    memset(batched, 0, sizeof batched);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(hearth_tokenize(m, texts[i], strlen(texts[i]), 1, &ids[i], &n_ids[i], &err), HEARTH_OK);
        p[i] = greedy(max_tokens + 7 * i);
        hearth_engine_options whole = o; /* alone: a pool of every sequence's whole context */
        whole.kv_blocks = 0;
        run_alone(m, &whole, ids[i], n_ids[i], &p[i], &alone[i]);
        assert_int_equal(alone[i].n, p[i].max_tokens);
    }
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    for (int i = 0; i < N_REQ; i++) {
        hearth_batch_request r = {.prompt = ids[i], .n_prompt = n_ids[i], .params = &p[i], .on_token = rec_token,
                                  .on_done = rec_done, .result = &batched[i].res, .user = &batched[i]};
        assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
    }
    size_t max_running = 0, steps = 0;
    while (hearth_batch_step(b)) {
        if (hearth_batch_running(b) > max_running) max_running = hearth_batch_running(b);
        assert_true(++steps < 10000);
    }
    assert_true(max_running >= 2);
    hearth_batch_stats bs;
    hearth_batch_stats_get(b, &bs);
    print_message("%s, %d blocks, %d-token chunks: %llu steps, %llu preemptions\n", model, kv_blocks, step_tokens,
                  (unsigned long long)bs.steps, (unsigned long long)bs.preemptions);
    if (kv_blocks) assert_true(bs.preemptions > 0);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(batched[i].done, 1);
        assert_int_equal(batched[i].status, HEARTH_OK);
        assert_int_equal(batched[i].n, alone[i].n);
        assert_memory_equal(batched[i].ids, alone[i].ids, sizeof(int32_t) * (size_t)alone[i].n);
        assert_memory_equal(batched[i].lps, alone[i].lps, sizeof(float) * (size_t)alone[i].n);
    }
    hearth_batch_free(b);
    for (int i = 0; i < N_REQ; i++) hearth_free(ids[i]);
    hearth_engine_free(e);
    hearth_model_close(m);
}

static void test_batch_equals_alone(void **st) {
    (void)st;
    batch_vs_alone("qwen3_5-f32", 0, 256, 12);
}

/* Qwen3.5-MoE: routed experts grouped over the step's rows, the shared expert on every row */
static void test_moe_batch_equals_alone(void **st) {
    (void)st;
    batch_vs_alone("qwen3_5_moe-f32", 0, 256, 12);
}

/* 7-token prefill chunks and a pool of 10 blocks (160 positions; the longest request needs 8): the state carries across chunks, requests wait for blocks, and decoding ones are
 * preempted and recomputed from position 0 (their state restarts there). */
static void test_small_chunks_and_pool(void **st) {
    (void)st;
    batch_vs_alone("qwen3_5-f32", 10, 7, 50);
}

/* Turn 1: a ~250-token prompt (7 sentences of ~36 tokens) and 60 generated tokens. Turn 2: turn 1's prompt and answer
 * followed by new tokens (the next chat turn). Turn 2 finds in the cache every full block of
 * what turn 1 computed (its prompt and the 59 answer tokens it fed back), since the last
 * block boundary of turn 1's decode kept its state, and answers exactly as a fresh engine. */
static void test_second_turn_from_cache(void **st) {
    (void)st;
    hearth_model *m = open_tiny("qwen3_5-f32");
    hearth_error err = {0};
    hearth_engine_options o = {.n_threads = 2, .context_length = 512, .max_sequences = 2};
    hearth_engine *e = NULL;
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    char text[4096] = "";
    for (int i = 0; i < 7; i++)
        strcat(text, "The quick brown fox jumps over the lazy dog while wizards vex the king. ");
    int32_t *first;
    size_t n_first;
    assert_int_equal(hearth_tokenize(m, text, strlen(text), 1, &first, &n_first, &err), HEARTH_OK);
    assert_true(n_first > 150 && n_first < 400);
    static rec t1, t2, alone;
    hearth_generate_params p1 = greedy(60), p2 = greedy(24);
    memset(&t1, 0, sizeof t1);
    hearth_batch_request q1 = {.prompt = first, .n_prompt = n_first, .params = &p1, .on_token = rec_token,
                               .on_done = rec_done, .result = &t1.res, .user = &t1};
    assert_int_equal(hearth_batch_submit(b, &q1, &err), HEARTH_OK);
    size_t steps = 0;
    while (hearth_batch_step(b)) assert_true(++steps < 10000);
    assert_int_equal(t1.status, HEARTH_OK);
    assert_int_equal(t1.n, 60);
    assert_int_equal(t1.res.cached_tokens, 0);
    static int32_t second[MAXT];
    size_t n = n_first;
    memcpy(second, first, n_first * sizeof *second);
    memcpy(second + n, t1.ids, 60 * sizeof *second), n += 60;
    const int32_t tail[] = {5, 17, 29, 3, 11, 42, 7};
    memcpy(second + n, tail, sizeof tail), n += sizeof tail / sizeof tail[0];
    size_t shared = n_first + 59; /* turn 1 computed its prompt and fed back 59 of its 60 tokens */
    memset(&t2, 0, sizeof t2);
    hearth_batch_request q2 = {.prompt = second, .n_prompt = n, .params = &p2, .on_token = rec_token,
                               .on_done = rec_done, .result = &t2.res, .user = &t2};
    assert_int_equal(hearth_batch_submit(b, &q2, &err), HEARTH_OK);
    while (hearth_batch_step(b)) assert_true(++steps < 20000);
    assert_int_equal(t2.status, HEARTH_OK);
    print_message("second turn: %zu of %zu shared tokens cached\n", t2.res.cached_tokens, shared);
    assert_int_equal(t2.res.cached_tokens, shared / 16 * 16);
    assert_true(t2.res.cached_tokens * 10 >= shared * 9);
    run_alone(m, &o, second, n, &p2, &alone);
    assert_int_equal(alone.res.cached_tokens, 0);
    assert_int_equal(t2.n, 24);
    assert_int_equal(alone.n, 24);
    assert_memory_equal(t2.ids, alone.ids, sizeof(int32_t) * 24);
    assert_memory_equal(t2.lps, alone.lps, sizeof(float) * 24);
    /* the same prompt again: from the snapshot at its own last block boundary */
    static rec t3;
    memset(&t3, 0, sizeof t3);
    hearth_batch_request q3 = {.prompt = second, .n_prompt = n, .params = &p2, .on_token = rec_token,
                               .on_done = rec_done, .result = &t3.res, .user = &t3};
    assert_int_equal(hearth_batch_submit(b, &q3, &err), HEARTH_OK);
    while (hearth_batch_step(b)) assert_true(++steps < 30000);
    assert_int_equal(t3.res.cached_tokens, (n - 1) / 16 * 16);
    assert_memory_equal(t3.ids, alone.ids, sizeof(int32_t) * 24);
    assert_memory_equal(t3.lps, alone.lps, sizeof(float) * 24);
    hearth_batch_free(b);
    hearth_free(first);
    hearth_engine_free(e);
    hearth_model_close(m);
}

int main(void) {
    setenv("HEARTH_CPU", "scalar", 1); /* rows computed independently: bit-identical batches */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_small_chunks_and_pool),
        cmocka_unit_test(test_moe_batch_equals_alone),
        cmocka_unit_test(test_second_turn_from_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
