/* test_live_rows.c: a step that delivers logits for only some of its rows computes the last
 * layer's o projection and MLP for those rows alone (cpu_backend.c, live_rows); the logits
 * must be the same bits as when every row's logits are asked for (the oracle: the same step
 * with nothing skipped), on every tiny model (each family and weight format
 * tools/make_tiny_models.py makes) and on the real GGUFs where tools/get_models.sh has put
 * them (SmolLM2 Q4_1's last layer runs the float-activation kernels), with the fast kernels
 * of this machine in deterministic mode (batch-invariant: a row's bits do not depend on how
 * many rows its step computes; the default mode rounds by step size, docs/server.md). Also
 * the keys and values the skipping step stored: a decode step after each gives the same
 * logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model_path.h"

#define N_TOK 12

static const char *prompt = "The quick brown fox jumps over the lazy dog while seven wizards argue about soup.";

/* appends ids[0..n) to a fresh sequence with n_logits rows out, then one more token with
 * one row out; the logits of both calls into out (n_logits + 1 rows) */
static void run(hearth_engine *e, const int32_t *ids, int n, int n_logits, int32_t next, float *out, int vocab) {
    hearth_error err = {0};
    int seq = -1;
    if (hearth_seq_open(e, &seq, &err)) fail_msg("seq_open: %s", err.message);
    if (hearth_seq_append(e, seq, ids, (size_t)n, (size_t)n_logits, out, &err)) fail_msg("append: %s", err.message);
    if (hearth_seq_append(e, seq, &next, 1, 1, out + (size_t)n_logits * vocab, &err))
        fail_msg("decode: %s", err.message);
    hearth_seq_close(e, seq);
}

/* 1 if the model ran, 0 if its family has no CPU support here */
static int check_model(const char *path) {
    hearth_model *m = NULL;
    hearth_error err = {0};
    if (hearth_model_open(path, &m, &err)) fail_msg("%s: %s", path, err.message);
    hearth_engine_options o = {.n_threads = 2, .context_length = 64, .max_sequences = 1, .max_logits_rows = N_TOK,
                               .deterministic = 1};
    hearth_engine *e = NULL;
    hearth_status st = hearth_engine_create(m, &o, &e, &err);
    if (st == HEARTH_ERR_UNSUPPORTED) {
        print_message("%s: not run: %s\n", path, err.message);
        hearth_model_close(m);
        return 0;
    }
    if (st) fail_msg("%s: %s", path, err.message);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(hearth_tokenize(m, prompt, strlen(prompt), 1, &ids, &n_ids, &err), HEARTH_OK);
    assert_true(n_ids >= N_TOK + 1);
    int vocab = hearth_model_vocab_rows(e);
    float *all = malloc((size_t)(N_TOK + 1) * vocab * sizeof(float));
    float *some = malloc((size_t)(N_TOK + 1) * vocab * sizeof(float));
    assert_non_null(all);
    assert_non_null(some);
    run(e, ids, N_TOK, N_TOK, ids[N_TOK], all, vocab); /* every row out: nothing skipped */
    static const int outs[] = {1, 3};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        int k = outs[i];
        run(e, ids, N_TOK, k, ids[N_TOK], some, vocab);
        /* the last k rows of the prompt, then the decode step */
        if (memcmp(some, all + (size_t)(N_TOK - k) * vocab, (size_t)k * vocab * sizeof(float)))
            fail_msg("%s: the last %d logits rows differ when only they are asked for", path, k);
        if (memcmp(some + (size_t)k * vocab, all + (size_t)N_TOK * vocab, (size_t)vocab * sizeof(float)))
            fail_msg("%s: the decode step after a %d-row prompt step differs", path, k);
    }
    free(all);
    free(some);
    free(ids);
    hearth_engine_free(e);
    hearth_model_close(m);
    return 1;
}

static void test_tiny_models(void **st) {
    (void)st;
    char names[64][64];
    int n = tiny_models(names, 64), ran = 0;
    if (!n) fail_msg("no tiny models (run tools/make_tiny_models.py)");
    for (int i = 0; i < n; i++) {
        char path[4400];
        tiny_model_path(path, sizeof path, names[i]);
        ran += check_model(path);
    }
    assert_true(ran >= 10); /* every family, not a lucky few */
}

static void test_real_ggufs(void **st) {
    (void)st;
    static const char *files[] = {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"};
    int ran = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4400];
        hearth_cache_path(path, sizeof path, "models", files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) {
            print_message("%s: not present (tools/get_models.sh fetches it)\n", path);
            continue;
        }
        fclose(f);
        ran += check_model(path);
    }
    if (!ran) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny_models), cmocka_unit_test(test_real_ggufs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
