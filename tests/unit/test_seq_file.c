/* test_seq_file.c: saved KV files (hearth_seq_save / hearth_seq_load) on the tiny llama
 * model with the scalar kernels: a loaded sequence continues with bit-identical logits
 * and the same greedy tokens as the one that was saved (float and int8 KV), the longest
 * common prefix is what loads, and a truncated, corrupted, foreign-version, other-model
 * or other-KV-format file is refused with an error that says so, leaving the sequence
 * empty. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four headers above first */
#include <cmocka.h>

#include "hearth.h"
#include "tiny_model_path.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static hearth_engine *engine(hearth_model *m, int kv_quant) {
    hearth_engine_options o = {.n_threads = 1, .context_length = 256, .max_sequences = 3, .kv_quant = kv_quant};
    hearth_engine *e = NULL;
    hearth_error err = {0};
    if (hearth_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.message);
    return e;
}

#define N_PROMPT 70 /* four full blocks of 16 and a partial one */
static void prompt_ids(int32_t *ids, int n, int salt) {
    for (int i = 0; i < n; i++) ids[i] = 5 + (i * 37 + salt) % 200;
}

static char tmp_path[64];
static void make_tmp(void) { snprintf(tmp_path, sizeof tmp_path, "/tmp/test_seq_file_%ld.hkv", (long)getpid()); }

/* Prefills a sequence with the prompt and saves it to tmp_path; returns the sequence. */
static int prefill_and_save(hearth_engine *e, const int32_t *ids, int n) {
    int seq;
    hearth_error err = {0};
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_append(e, seq, ids, (size_t)n, 0, NULL, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_save(e, seq, tmp_path, &err), HEARTH_OK);
    return seq;
}

/* An engine on llama-f32 with N_PROMPT tokens saved to tmp_path (*m: the model). */
static hearth_engine *saved_engine(hearth_model **m) {
    *m = open_tiny("llama-f32");
    hearth_engine *e = engine(*m, HEARTH_KV_FLOAT);
    int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, 0);
    hearth_seq_close(e, prefill_and_save(e, ids, N_PROMPT));
    return e;
}

typedef struct toks {
    int32_t ids[64];
    int n;
} toks;
static int on_tok(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    (void)text;
    (void)lp;
    toks *t = user;
    if (t->n < 64) t->ids[t->n++] = id;
    return 0;
}

static void roundtrip_model(const char *name, int kv_quant) {
    hearth_model *m = open_tiny(name);
    hearth_engine *e = engine(m, kv_quant);
    int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, 0);
    int a = prefill_and_save(e, ids, N_PROMPT), b;
    hearth_error err = {0};
    assert_int_equal(hearth_seq_open(e, &b, &err), HEARTH_OK);
    size_t loaded = 0;
    assert_int_equal(hearth_seq_load(e, b, tmp_path, NULL, 0, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, N_PROMPT);
    assert_int_equal(hearth_seq_length(e, b), N_PROMPT);
    /* the next token on both: the attention reads the same bytes, so the logits agree exactly */
    int32_t vocab = hearth_model_vocab_rows(e), next = 42;
    float *la = malloc(sizeof(float) * (size_t)vocab), *lb = malloc(sizeof(float) * (size_t)vocab);
    assert_int_equal(hearth_seq_append(e, a, &next, 1, 1, la, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_append(e, b, &next, 1, 1, lb, &err), HEARTH_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)vocab);
    hearth_seq_close(e, a);
    hearth_seq_close(e, b);
    free(la);
    free(lb);
    hearth_engine_free(e);
    hearth_model_close(m);
}
static void roundtrip(int kv_quant) { roundtrip_model("llama-f32", kv_quant); }
static void test_roundtrip_float(void **st) {
    (void)st;
    roundtrip(HEARTH_KV_FLOAT);
}
static void test_roundtrip_int8(void **st) {
    (void)st;
    roundtrip(HEARTH_KV_INT8);
}
/* Gemma 4: sliding and full layers of different shapes, and shared-KV layers (the file
 * stores each layer padded to the largest shape) */
static void test_roundtrip_varied_layers(void **st) {
    (void)st;
    roundtrip_model("gemma4-f32", HEARTH_KV_FLOAT);
    roundtrip_model("gemma4-q4g64", HEARTH_KV_INT8);
}
/* Qwen3.5: the Gated DeltaNet layers' recurrent state travels with the KV; it is the state
 * after every saved token, so only a prompt that continues all of them loads the file */
static void test_roundtrip_hybrid(void **st) {
    (void)st;
    roundtrip_model("qwen3_5-f32", HEARTH_KV_FLOAT);
    roundtrip_model("qwen3_5_moe-f32", HEARTH_KV_FLOAT);
    hearth_model *m = open_tiny("qwen3_5-f32");
    hearth_engine *e = engine(m, HEARTH_KV_FLOAT);
    int32_t ids[N_PROMPT + 10];
    prompt_ids(ids, N_PROMPT + 10, 0);
    hearth_seq_close(e, prefill_and_save(e, ids, N_PROMPT));
    hearth_error err = {0};
    int seq;
    size_t loaded = 99;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, 0); /* the same prompt: all but its last token cannot be cut from the state */
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT + 10, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, N_PROMPT);
    /* generation on it: the tokens of a fresh prefill */
    hearth_generate_params p = {.max_tokens = 12, .ignore_eos = 1};
    toks fresh = {0}, cached = {0};
    hearth_generate_result r;
    assert_int_equal(hearth_generate_seq(e, seq, ids, N_PROMPT + 10, &p, on_tok, &cached, &r, &err), HEARTH_OK);
    assert_int_equal(r.cached_tokens, N_PROMPT);
    hearth_seq_close(e, seq);
    assert_int_equal(hearth_generate(e, ids, N_PROMPT + 10, &p, on_tok, &fresh, &r, &err), HEARTH_OK);
    assert_int_equal(cached.n, 12);
    assert_memory_equal(fresh.ids, cached.ids, sizeof(int32_t) * 12);
    hearth_engine_free(e);
    hearth_model_close(m);
}


/* generate on a loaded prefix: the same greedy tokens as a fresh prefill; the longest
 * common prefix loads, never the last prompt token */
static void test_generate_from_prefix(void **st) {
    (void)st;
    hearth_model *m = open_tiny("llama-f32");
    hearth_engine *e = engine(m, HEARTH_KV_FLOAT);
    int32_t ids[N_PROMPT + 10];
    prompt_ids(ids, N_PROMPT + 10, 0);
    hearth_seq_close(e, prefill_and_save(e, ids, N_PROMPT));
    hearth_generate_params p = {.max_tokens = 12, .ignore_eos = 1};
    hearth_error err = {0};
    toks fresh = {0}, cached = {0};
    hearth_generate_result r;
    assert_int_equal(hearth_generate(e, ids, N_PROMPT + 10, &p, on_tok, &fresh, &r, &err), HEARTH_OK);
    assert_int_equal(r.cached_tokens, 0);
    int seq;
    size_t loaded;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT + 10, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, N_PROMPT);
    assert_int_equal(hearth_generate_seq(e, seq, ids, N_PROMPT + 10, &p, on_tok, &cached, &r, &err), HEARTH_OK);
    assert_int_equal(r.cached_tokens, N_PROMPT);
    assert_int_equal(fresh.n, 12);
    assert_int_equal(cached.n, 12);
    assert_memory_equal(fresh.ids, cached.ids, sizeof(int32_t) * 12);
    /* the sequence now holds prompt + generated tokens but the last */
    assert_int_equal(hearth_seq_length(e, seq), N_PROMPT + 10 + 11);
    hearth_seq_close(e, seq);
    /* the same prompt: all but its last token; a prompt that diverges at 40: 40 */
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, N_PROMPT - 1);
    hearth_seq_close(e, seq);
    ids[40] = 3;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT, &loaded, &err), HEARTH_OK);
    assert_int_equal(loaded, 40);
    /* a sequence that holds tokens cannot load; generate_seq refuses a non-prefix */
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, NULL, 0, &loaded, &err), HEARTH_ERR_INVALID);
    ids[10] = 4;
    assert_int_equal(hearth_generate_seq(e, seq, ids, N_PROMPT, &p, on_tok, &cached, &r, &err), HEARTH_ERR_INVALID);
    hearth_seq_close(e, seq);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, NULL, 0, &loaded, &err), HEARTH_ERR_INVALID); /* closed */
    hearth_engine_free(e);
    hearth_model_close(m);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 16);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}
static void spill(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Loads path into a fresh sequence and expects status with `needle` in the message and
 * nothing loaded. */
static void expect_refused(hearth_engine *e, const char *path, hearth_status want, const char *needle) {
    int seq;
    hearth_error err = {0};
    size_t loaded = 99;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    hearth_status got = hearth_seq_load(e, seq, path, NULL, 0, &loaded, &err);
    if (got != want || !strstr(err.message, needle))
        fail_msg("want %s with '%s', got %s: %s", hearth_status_name(want), needle, hearth_status_name(got),
                 err.message);
    assert_int_equal(loaded, 0);
    assert_int_equal(hearth_seq_length(e, seq), 0);
    hearth_seq_close(e, seq);
}

static void test_damaged_files_refused(void **st) {
    (void)st;
    hearth_model *m;
    hearth_engine *e = saved_engine(&m);
    int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, 0);
    size_t n;
    unsigned char *good = slurp(tmp_path, &n), *bad = malloc(n + 16);
    char path[96];
    snprintf(path, sizeof path, "%s.bad", tmp_path);
    size_t cuts[] = {0, 7, 64, 127, 128, 200, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) { /* truncated anywhere */
        spill(path, good, cuts[i]);
        expect_refused(e, path, HEARTH_ERR_FORMAT, cuts[i] < 128 ? "not a hearth KV file" : "truncated");
    }
    memcpy(bad, good, n);
    memcpy(bad + n, "junk", 4);
    spill(path, bad, n + 4);
    expect_refused(e, path, HEARTH_ERR_FORMAT, "after the KV file's payload");
    size_t flips[] = {128 + 5, 128 + N_PROMPT * 4 + 9, n / 2, n - 1};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) { /* one bit of the data */
        memcpy(bad, good, n);
        bad[flips[i]] ^= 0x10;
        spill(path, bad, n);
        expect_refused(e, path, HEARTH_ERR_FORMAT, "data is corrupted");
    }
    memcpy(bad, good, n);
    bad[40] ^= 1; /* n_tokens in the header */
    spill(path, bad, n);
    expect_refused(e, path, HEARTH_ERR_FORMAT, "header is corrupted");
    memcpy(bad, good, n);
    bad[8] = 9; /* a version from the future */
    spill(path, bad, n);
    expect_refused(e, path, HEARTH_ERR_UNSUPPORTED, "version 9");
    memcpy(bad, good, n);
    bad[0] = 'X';
    spill(path, bad, n);
    expect_refused(e, path, HEARTH_ERR_FORMAT, "not a hearth KV file");
    expect_refused(e, "/nonexistent/dir/x.hkv", HEARTH_ERR_IO, "/nonexistent/dir/x.hkv");
    /* saving where it cannot be written names the file */
    int seq;
    hearth_error err = {0};
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_save(e, seq, tmp_path, &err), HEARTH_ERR_INVALID); /* empty */
    assert_int_equal(hearth_seq_append(e, seq, ids, 5, 0, NULL, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_save(e, seq, "/nonexistent/dir/x.hkv", &err), HEARTH_ERR_IO);
    assert_non_null(strstr(err.message, "/nonexistent/dir/x.hkv"));
    hearth_seq_close(e, seq);
    unlink(path);
    free(good);
    free(bad);
    hearth_engine_free(e);
    hearth_model_close(m);
}

/* a file from another model, or saved with another KV format, is refused */
static void test_mismatch_refused(void **st) {
    (void)st;
    hearth_model *m;
    hearth_engine *e = saved_engine(&m);
    hearth_engine *e8 = engine(m, HEARTH_KV_INT8);
    expect_refused(e8, tmp_path, HEARTH_ERR_INVALID, "--kv-quant none");
    hearth_engine_free(e8);
    hearth_engine_free(e);
    hearth_model_close(m);
    const char *others[] = {"llama-bf16", "qwen3-f32"}; /* the same shapes in another dtype; another family */
    for (int i = 0; i < 2; i++) {
        hearth_model *o = open_tiny(others[i]);
        hearth_engine *eo = engine(o, HEARTH_KV_FLOAT);
        expect_refused(eo, tmp_path, HEARTH_ERR_INVALID, "another model");
        hearth_engine_free(eo);
        hearth_model_close(o);
    }
    unlink(tmp_path);
}

int main(void) {
    setenv("HEARTH_CPU", "scalar", 1); /* rows computed independently: bit-identical continuations */
    make_tmp();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_float),      cmocka_unit_test(test_roundtrip_int8),
        cmocka_unit_test(test_generate_from_prefix), cmocka_unit_test(test_damaged_files_refused),
        cmocka_unit_test(test_mismatch_refused),     cmocka_unit_test(test_roundtrip_varied_layers),
        cmocka_unit_test(test_roundtrip_hybrid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
