/* test_scheduler.c: the batch scheduler: how a step's token budget is packed (decode
 * rows first, then FIFO prompt chunks), KV admission arithmetic, and, on the tiny llama
 * model with the scalar kernels, that batched requests give exactly the tokens and
 * logprobs each gives alone through hearth_generate, that a burst beyond the KV pool
 * waits and completes, that a request that can never fit fails, and cancellation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "engine/scheduler.h"
#include "hearth.h"
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

/* ---- end to end on the tiny model -------------------------------------------------- */

typedef struct rec {
    int32_t ids[256];
    float lps[256];
    int n, done, cancel_after;
    hearth_status status;
    hearth_generate_result res;
} rec;

static int rec_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    (void)text;
    rec *r = user;
    if (r->n < 256) {
        r->ids[r->n] = id;
        r->lps[r->n++] = lp ? lp->logprob : 0;
    }
    return 0;
}
static int rec_cancelled(void *user) {
    rec *r = user;
    return r->cancel_after && r->n >= r->cancel_after;
}
static void rec_done(void *user, hearth_status s, const hearth_error *err) {
    (void)err;
    rec *r = user;
    r->done++;
    r->status = s;
}

static hearth_model *open_tiny(void) {
    char path[1024];
    const char *cache = getenv("HEARTH_CACHE");
    if (cache)
        snprintf(path, sizeof path, "%s/tiny/llama-f32", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/hearth/tiny/llama-f32", getenv("HOME") ? getenv("HOME") : "");
    hearth_model *m = NULL;
    hearth_error err = {0};
    if (hearth_model_open(path, &m, &err)) fail_msg("tiny model missing (%s): %s; run tools/make_tiny_models.py", path, err.message);
    return m;
}

#define N_REQ 5
static const char *texts[N_REQ] = {"hello world", "the quick brown fox jumps", "a", "numbers 1 2 3 4 5 6 7 8 9",
                                   "once upon a time there was"};

static void run_batch_vs_alone(int kv_blocks, int step_tokens) {
    hearth_model *m = open_tiny();
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
        assert_int_equal(cut.n, 3);
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

int main(void) {
    setenv("HEARTH_CPU", "scalar", 1); /* rows computed independently: bit-identical batches */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_decode_first_then_fifo_prompts),
        cmocka_unit_test(test_blocks_needed),
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_batch_small_pool_and_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
