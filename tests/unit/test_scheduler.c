/* test_scheduler.c: the batch scheduler: how a step's token budget is packed (decode
 * rows first, then FIFO prompt chunks), KV admission arithmetic, and, on the tiny llama
 * model with the scalar kernels, that batched requests give exactly the tokens and
 * logprobs each gives alone through hearth_generate, that a burst beyond the KV pool
 * waits and completes, that a request that can never fit fails, and cancellation; and
 * that requests submitted together with a long common prefix compute it once (the others
 * wait for the first one's blocks), also when the first is cancelled mid-prompt; and that
 * requests run one after another reuse the longest token prefix any earlier one computed,
 * partial blocks included, with answers equal to their lone runs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "engine/scheduler.h"
#include "engine/spec.h"
#include "hearth.h"
#include "tiny_model_path.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_pack_decode_first_then_fifo_prompts(void **st) {
    (void)st;
    size_t rem[] = {100, 0, 300, 0, 5};
    int take[5];
    assert_int_equal(sched_pack(rem, 5, 64, take), 64);
    /* two decode rows take 1 each, then the first prompt gets the remaining 62 */
    assert_int_equal(take[1], 1);
    assert_int_equal(take[3], 1);
    assert_int_equal(take[0], 62);
    assert_int_equal(take[2], 0);
    assert_int_equal(take[4], 0);
    size_t rem2[] = {10, 20, 5};
    assert_int_equal(sched_pack(rem2, 3, 256, take), 35); /* all prompts fit whole */
    assert_int_equal(take[0], 10);
    assert_int_equal(take[1], 20);
    assert_int_equal(take[2], 5);
    size_t rem3[] = {0, 0, 0};
    assert_int_equal(sched_pack(rem3, 3, 2, take), 2); /* never beyond the budget */
    assert_int_equal(take[2], 0);
    assert_int_equal(sched_pack(rem3, 0, 2, take), 0);
}

static void test_blocks_needed(void **st) {
    (void)st;
    assert_int_equal(sched_blocks_needed(10, 6, 1024), 1);   /* 16 positions: one block */
    assert_int_equal(sched_blocks_needed(10, 7, 1024), 2);
    assert_int_equal(sched_blocks_needed(1000, 5000, 1024), 64); /* capped by the context */
    assert_int_equal(sched_blocks_needed(1, 0, 1024), 1);
}

static void test_shared_blocks(void **st) {
    (void)st;
    int32_t a[100], c[100];
    for (int i = 0; i < 100; i++) a[i] = c[i] = i;
    assert_int_equal(sched_shared_blocks(a, 100, c, 100), 6); /* 99 coverable tokens: 6 whole blocks */
    assert_int_equal(sched_shared_blocks(a, 97, c, 100), 6);  /* 96 coverable */
    assert_int_equal(sched_shared_blocks(a, 96, c, 100), 5);  /* the last token is never covered */
    assert_int_equal(sched_shared_blocks(a, 100, c, 40), 2);  /* the other prompt is shorter */
    c[47] = -1;
    assert_int_equal(sched_shared_blocks(a, 100, c, 100), 2); /* differs inside block 2 */
    c[47] = 47, c[48] = -1;
    assert_int_equal(sched_shared_blocks(a, 100, c, 100), 3);
    assert_int_equal(sched_shared_tokens(a, 100, c, 100), 48); /* the same, in tokens */
    c[48] = 48;
    assert_int_equal(sched_shared_tokens(a, 100, c, 100), 99);
    assert_int_equal(sched_shared_tokens(a, 100, c, 40), 40);
    assert_int_equal(sched_shared_tokens(a, 1, c, 100), 0);
    c[0] = -1;
    assert_int_equal(sched_shared_blocks(a, 100, c, 100), 0);
    assert_int_equal(sched_shared_tokens(a, 100, c, 100), 0);
    assert_int_equal(sched_shared_blocks(a, 0, c, 100), 0);
    assert_int_equal(sched_shared_blocks(a, 1, c, 100), 0);
}

/* ---- end to end on the tiny model -------------------------------------------------- */


#define N_REQ 5
static const char *texts[N_REQ] = {"hello world", "the quick brown fox jumps", "a", "numbers 1 2 3 4 5 6 7 8 9",
                                   "once upon a time there was"};

static void run_batch_vs_alone(int kv_blocks, int step_tokens) {
    hearth_model *m = open_tiny("llama-f32");
    hearth_error err = {0};
    hearth_engine *e = NULL;
    hearth_engine_options o = {.n_threads = 1, .context_length = 512, .max_sequences = 4, .kv_blocks = kv_blocks,
                               .max_step_tokens = step_tokens};
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    int32_t *ids[N_REQ];
    size_t n_ids[N_REQ];
    hearth_generate_params p[N_REQ];
    static rec alone[N_REQ], batched[N_REQ];
    memset(alone, 0, sizeof alone);
    memset(batched, 0, sizeof batched);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(hearth_tokenize(m, texts[i], strlen(texts[i]), 1, &ids[i], &n_ids[i], &err), HEARTH_OK);
        memset(&p[i], 0, sizeof p[i]);
        hearth_sampling_defaults(NULL, &p[i].sampling);
        p[i].sampling.top_logprobs = 1;
        p[i].max_tokens = 20 + 9 * i;
        p[i].ignore_eos = 1;
        assert_int_equal(hearth_generate(e, ids[i], n_ids[i], &p[i], rec_token, &alone[i], &alone[i].res, &err),
                         HEARTH_OK);
        assert_int_equal(alone[i].n, p[i].max_tokens);
    }
    /* the result and the token callback are optional (hearth.h) */
    assert_int_equal(hearth_generate(e, ids[0], n_ids[0], &p[0], NULL, NULL, NULL, &err), HEARTH_OK);
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    for (int i = 0; i < N_REQ; i++) {
        hearth_batch_request r = {.prompt = ids[i], .n_prompt = n_ids[i], .params = &p[i], .on_token = rec_token,
                                  .is_cancelled = rec_cancelled, .on_done = rec_done, .result = &batched[i].res,
                                  .user = &batched[i]};
        assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
    }
    size_t max_running = 0, max_waiting_with_running = 0, steps = 0;
    while (hearth_batch_step(b)) {
        if (hearth_batch_running(b) > max_running) max_running = hearth_batch_running(b);
        if (hearth_batch_running(b) && hearth_batch_waiting(b) > max_waiting_with_running)
            max_waiting_with_running = hearth_batch_waiting(b);
        assert_true(++steps < 10000);
    }
    assert_true(max_running >= 2);                 /* requests really ran together */
    if (kv_blocks) assert_true(max_waiting_with_running >= 1); /* and some waited for blocks */
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(batched[i].done, 1);
        assert_int_equal(batched[i].status, HEARTH_OK);
        assert_int_equal(batched[i].res.finish, HEARTH_FINISH_LENGTH);
        assert_int_equal(batched[i].n, alone[i].n);
        assert_memory_equal(batched[i].ids, alone[i].ids, sizeof(int32_t) * (size_t)alone[i].n);
        assert_memory_equal(batched[i].lps, alone[i].lps, sizeof(float) * (size_t)alone[i].n);
    }
    /* a request that can never fit the pool fails; a cancelled one stops early */
    if (kv_blocks) {
        rec big = {0}, cut = {.cancel_after = 3};
        hearth_generate_params pb = p[0];
        pb.max_tokens = kv_blocks * 16 + 1;
        hearth_batch_request r = {.prompt = ids[0], .n_prompt = n_ids[0], .params = &pb, .on_token = rec_token,
                                  .on_done = rec_done, .result = &big.res, .user = &big};
        assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
        hearth_batch_request rc = {.prompt = ids[1], .n_prompt = n_ids[1], .params = &p[4], .on_token = rec_token,
                                   .is_cancelled = rec_cancelled, .on_done = rec_done, .result = &cut.res, .user = &cut};
        assert_int_equal(hearth_batch_submit(b, &rc, &err), HEARTH_OK);
        while (hearth_batch_step(b)) assert_true(++steps < 20000);
        assert_int_equal(big.done, 1);
        assert_int_equal(big.status, HEARTH_ERR_INVALID);
        assert_int_equal(cut.done, 1);
        assert_int_equal(cut.res.finish, HEARTH_FINISH_CANCELLED);
        /* polled before each step: the step that made the third token ends it, and that step
         * may have emitted up to SPEC_MAX_DRAFT accepted proposals with it (the same prompt was
         * answered above, so prompt lookup finds the answer among the recent ones) */
        assert_true(cut.n >= 3 && cut.n <= 2 + 1 + SPEC_MAX_DRAFT);
    }
    /* invalid requests fail at submit */
    hearth_generate_params bad = p[0];
    bad.max_tokens = 0;
    hearth_batch_request r = {.prompt = ids[0], .n_prompt = n_ids[0], .params = &bad, .result = &batched[0].res};
    assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_ERR_INVALID);
    hearth_batch_free(b);
    for (int i = 0; i < N_REQ; i++) hearth_free(ids[i]);
    hearth_engine_free(e);
    hearth_model_close(m);
}

static void test_batch_equals_alone(void **st) {
    (void)st;
    run_batch_vs_alone(0, 256);
}
static void test_batch_small_pool_and_budget(void **st) {
    (void)st;
    run_batch_vs_alone(8, 7); /* 128 positions: requests wait; 7-token steps split prompts */
}

/* Longest common prefix of two token arrays, never covering b's last token: the positions
 * a request with b can take from the cache after one with a computed its tokens. */
static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t c = 0;
    while (c < na && c < nb && a[c] == b[c]) c++;
    if (c > nb - 1) c = nb - 1;
    return c;
}

/* Greedy, 8 tokens whatever the model would end with, the chosen token's logprob. */
static hearth_generate_params greedy_eight(void) {
    hearth_generate_params p;
    memset(&p, 0, sizeof p);
    hearth_sampling_defaults(NULL, &p.sampling);
    p.sampling.top_logprobs = 1;
    p.max_tokens = 8;
    p.ignore_eos = 1;
    return p;
}

#define N_SHARE 4
/* Four requests with a ~450-token common prefix submitted at once (plus one unrelated
 * short request behind them): the prefix is computed once, the unrelated request is not
 * held up, and every answer equals its lone run. With cancel_first, the first request is
 * cancelled after its first 64-token step: the next one takes over from the blocks it had
 * committed, and all others still finish with their lone answers. */
static void run_shared_prefix(int cancel_first) {
    hearth_model *m = open_tiny("llama-f32");
    hearth_error err = {0};
    hearth_engine *e = NULL;
    hearth_engine_options o = {.n_threads = 1, .context_length = 1024, .max_sequences = 6, .kv_blocks = 256,
                               .max_step_tokens = 64}; /* room for all five at once */
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    char prefix[4096] = "";
    for (int i = 0; i < 90; i++) {
        char w[32];
        snprintf(w, sizeof w, "word%d alpha ", i % 13);
        strcat(prefix, w);
    }
    static const char *tails[N_SHARE + 1] = {"first question?", "second one here", "and a third",
                                             "the fourth and last", "unrelated short prompt"};
    int32_t *ids[N_SHARE + 1];
    size_t n_ids[N_SHARE + 1];
    hearth_generate_params p = greedy_eight();
    static rec alone[N_SHARE + 1], batched[N_SHARE + 1];
    memset(alone, 0, sizeof alone);
    memset(batched, 0, sizeof batched);
    for (int i = 0; i <= N_SHARE; i++) {
        char text[4200];
        snprintf(text, sizeof text, "%s%s", i < N_SHARE ? prefix : "", tails[i]);
        assert_int_equal(hearth_tokenize(m, text, strlen(text), 1, &ids[i], &n_ids[i], &err), HEARTH_OK);
        hearth_engine *e1 = NULL; /* a fresh engine each: nothing cached */
        assert_int_equal(hearth_engine_create(m, &o, &e1, &err), HEARTH_OK);
        assert_int_equal(hearth_generate(e1, ids[i], n_ids[i], &p, rec_token, &alone[i], &alone[i].res, &err),
                         HEARTH_OK);
        hearth_engine_free(e1);
        assert_int_equal(alone[i].n, p.max_tokens);
    }
    assert_true(n_ids[0] > 400);
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    for (int i = 0; i <= N_SHARE; i++) {
        hearth_batch_request r = {.prompt = ids[i], .n_prompt = n_ids[i], .params = &p, .on_token = rec_token,
                                  .is_cancelled = rec_cancelled, .on_done = rec_done, .result = &batched[i].res,
                                  .user = &batched[i]};
        assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
    }
    assert_true(hearth_batch_step(b) > 0);
    /* the first sharer and the unrelated request run; the other three wait for the prefix */
    assert_int_equal(hearth_batch_running(b), 2);
    assert_int_equal(hearth_batch_waiting(b), N_SHARE - 1);
    if (cancel_first) batched[0].cancel_now = 1;
    size_t steps = 0;
    while (hearth_batch_step(b)) assert_true(++steps < 10000);
    for (int i = 0; i <= N_SHARE; i++) {
        assert_int_equal(batched[i].done, 1);
        assert_int_equal(batched[i].status, HEARTH_OK);
        if (i == 0 && cancel_first) {
            assert_int_equal(batched[i].res.finish, HEARTH_FINISH_CANCELLED);
            assert_int_equal(batched[i].n, 0);
            continue;
        }
        assert_int_equal(batched[i].res.finish, HEARTH_FINISH_LENGTH);
        assert_int_equal(batched[i].n, alone[i].n);
        assert_memory_equal(batched[i].ids, alone[i].ids, sizeof(int32_t) * (size_t)alone[i].n);
        assert_memory_equal(batched[i].lps, alone[i].lps, sizeof(float) * (size_t)alone[i].n);
    }
    /* who computed what: the unrelated request nothing cached; the first sharer (or, when
     * it was cancelled, the second, from the 64 positions the first had committed) the
     * whole prefix; every later one takes at least the token prefix it shares with that
     * leader (it waited for the leader's block holding the last shared token) */
    int lead = cancel_first ? 1 : 0;
    assert_int_equal(batched[N_SHARE].res.cached_tokens, 0);
    assert_int_equal(batched[lead].res.cached_tokens, cancel_first ? 64 : 0);
    size_t computed = 0, alone_sum = 0;
    for (int i = lead; i < N_SHARE; i++) {
        if (i > lead) {
            size_t want = common_prefix(ids[lead], n_ids[lead], ids[i], n_ids[i]);
            assert_true(want > 400);
            assert_true(batched[i].res.cached_tokens >= want);
        }
        computed += n_ids[i] - batched[i].res.cached_tokens;
        alone_sum += n_ids[i];
    }
    /* one prefix plus tails: far below every request computing its own prompt */
    size_t shared = common_prefix(ids[0], n_ids[0], ids[1], n_ids[1]);
    assert_true(computed <= alone_sum - (size_t)(N_SHARE - 1 - lead) * shared);
    hearth_batch_stats s;
    hearth_batch_stats_get(b, &s);
    assert_int_equal(s.preemptions, 0);
    hearth_batch_free(b);
    for (int i = 0; i <= N_SHARE; i++) hearth_free(ids[i]);
    hearth_engine_free(e);
    hearth_model_close(m);
}

static void test_shared_prefix_computed_once(void **st) {
    (void)st;
    run_shared_prefix(0);
}
static void test_shared_prefix_leader_cancelled(void **st) {
    (void)st;
    run_shared_prefix(1);
}

/* Requests one after another on one engine: each must find in the cache exactly the
 * longest prefix it shares with what an earlier request computed (its prompt and the
 * tokens it generated and fed back: all but the last), never its own last token, whether
 * that prefix ends on a block boundary, inside a block another prompt went on from, or
 * inside the last block a finished request left; and each answer must equal its run on a
 * fresh engine, token for token and logprob for logprob. */
static void test_partial_prefix_reuse(void **st) {
    (void)st;
    hearth_model *m = open_tiny("llama-f32");
    hearth_error err = {0};
    hearth_engine_options o = {.n_threads = 1, .context_length = 512, .max_sequences = 2, .kv_blocks = 256};
    hearth_engine *e = NULL;
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    const char *text = "The quick brown fox jumps over the lazy dog while seven wizards quietly vex the jolly king.";
    int32_t *base;
    size_t n_base;
    assert_int_equal(hearth_tokenize(m, text, strlen(text), 1, &base, &n_base, &err), HEARTH_OK);
    assert_true(n_base > 20 && n_base % 16 != 0 && n_base < 100);
    hearth_generate_params p = greedy_eight();
    enum { N_RUNS = 6, MAXT = 160 };
    static int32_t seqs[N_RUNS][MAXT]; /* what each run computed: prompt + generated, less the last */
    size_t n_seqs[N_RUNS];
    int32_t prompt[MAXT];
    static rec got, alone;
    for (int r = 0; r < N_RUNS; r++) {
        size_t n = n_base;
        memcpy(prompt, base, n_base * sizeof *prompt);
        switch (r) {
        case 0: break; /* computes everything */
        case 1: break; /* the same prompt: all but its last token */
        case 2:        /* first run's prompt and 5 of its answer's tokens, then its own */
            memcpy(prompt + n, seqs[0] + n_base, 5 * sizeof *prompt), n += 5;
            prompt[n] = (seqs[0][n] + 1) % 600, n++;
            prompt[n++] = 42;
            break;
        case 3: /* diverges inside the prompt's second block */
            n = 30;
            prompt[21] = (prompt[21] + 1) % 600;
            break;
        case 4: /* the first answer in full (past the last token it fed back) and more */
            memcpy(prompt + n, got.ids, 8 * sizeof *prompt), n += 8;
            prompt[n++] = 7, prompt[n++] = 8;
            break;
        case 5: /* shorter than one block */
            n = 9;
            break;
        }
        size_t want = 0;
        for (int j = 0; j < r; j++) {
            size_t c = common_prefix(seqs[j], n_seqs[j], prompt, n);
            if (c > want) want = c;
        }
        memset(&got, 0, sizeof got);
        memset(&alone, 0, sizeof alone);
        hearth_batch_request q = {.prompt = prompt, .n_prompt = n, .params = &p, .on_token = rec_token,
                                  .on_done = rec_done, .result = &got.res, .user = &got};
        assert_int_equal(hearth_batch_submit(b, &q, &err), HEARTH_OK);
        size_t steps = 0;
        while (hearth_batch_step(b)) assert_true(++steps < 1000);
        assert_int_equal(got.done, 1);
        assert_int_equal(got.status, HEARTH_OK);
        assert_int_equal(got.res.cached_tokens, want);
        hearth_engine *e1 = NULL;
        assert_int_equal(hearth_engine_create(m, &o, &e1, &err), HEARTH_OK);
        assert_int_equal(hearth_generate(e1, prompt, n, &p, rec_token, &alone, &alone.res, &err), HEARTH_OK);
        hearth_engine_free(e1);
        assert_int_equal(got.n, 8);
        assert_int_equal(alone.n, 8);
        assert_memory_equal(got.ids, alone.ids, sizeof(int32_t) * 8);
        assert_memory_equal(got.lps, alone.lps, sizeof(float) * 8);
        memcpy(seqs[r], prompt, n * sizeof *prompt);
        memcpy(seqs[r] + n, got.ids, 7 * sizeof *prompt);
        n_seqs[r] = n + 7;
    }
    hearth_batch_stats s;
    hearth_batch_stats_get(b, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks);
    hearth_batch_free(b);
    hearth_free(base);
    hearth_engine_free(e);
    hearth_model_close(m);
}

int main(void) {
    setenv("HEARTH_CPU", "scalar", 1); /* rows computed independently: bit-identical batches */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_decode_first_then_fifo_prompts),
        cmocka_unit_test(test_blocks_needed),
        cmocka_unit_test(test_shared_blocks),
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_batch_small_pool_and_budget),
        cmocka_unit_test(test_shared_prefix_computed_once),
        cmocka_unit_test(test_shared_prefix_leader_cancelled),
        cmocka_unit_test(test_partial_prefix_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
