/* test_tokenizer.c: the tokenizer on small hand-built tokenizer.json strings (byte-level
 * BPE, SentencePiece-style BPE with byte fallback, WordPiece), its error paths, and the
 * streaming-decode invariants on random id sequences. Parity with HF on real
 * vocabularies lives in tests/parity/test_tokenizer_parity.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "tok/tok_internal.h"

static const char *BYTE_LEVEL =
    "{\"added_tokens\":[{\"id\":13,\"content\":\"<|end|>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"\xC4\xA0\":4,\"w\":5,\"r\":6,\"d\":7,"
    "\"he\":8,\"ll\":9,\"hell\":10,\"hello\":11,\"\xC4\xA0w\":12,\"<|end|>\":13},"
    "\"merges\":[\"h e\",\"l l\",[\"he\",\"ll\"],\"hell o\",\"\xC4\xA0 w\"]}}";

static const char *SENTENCEPIECE =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0xE2>\":2,\"<0x82>\":3,\"<0xAC>\":4,\"\xE2\x96\x81\":5,\"a\":6,\"b\":7,"
    "\"\xE2\x96\x81" "a\":8,\"ab\":9,\"\xE2\x96\x81" "ab\":10},"
    "\"merges\":[\"\xE2\x96\x81 a\",\"a b\",\"\xE2\x96\x81" "a b\"]}}";

static const char *WORDPIECE =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"[PAD]\",\"special\":true},{\"id\":1,\"content\":\"[UNK]\",\"special\":true},"
    "{\"id\":2,\"content\":\"[CLS]\",\"special\":true},{\"id\":3,\"content\":\"[SEP]\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]},"
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
    "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,"
    "\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"hello\":4,\"world\":5,\"##s\":6,\"un\":7,\"##aff\":8,\"##able\":9,\",\":10}}}";

static tok_tokenizer *load(const char *json) {
    tok_tokenizer *t = NULL;
    hearth_error err = {0};
    hearth_status st = tok_load_hf_json(json, strlen(json), NULL, "test.json", &t, &err);
    if (st != HEARTH_OK) fail_msg("load failed: %s", err.message);
    return t;
}

static void expect_ids(const tok_tokenizer *t, const char *text, int add, const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t nid = 0;
    hearth_error err = {0};
    assert_int_equal(tok_encode(t, text, strlen(text), add, &ids, &nid, &err), HEARTH_OK);
    assert_int_equal(nid, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

static void expect_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want) {
    char *out = NULL;
    hearth_error err = {0};
    assert_int_equal(tok_decode(t, ids, n, skip, &out, &err), HEARTH_OK);
    assert_string_equal(out, want);
    free(out);
}

static void test_byte_level_bpe(void **state) {
    (void)state;
    tok_tokenizer *t = load(BYTE_LEVEL);
    assert_string_equal(tok_kind(t), "bpe-byte-level");
    const int32_t want[] = {11, 12, 3, 6, 2, 7};
    expect_ids(t, "hello world", 1, want, 6);
    const int32_t want2[] = {11, 13, 8};
    expect_ids(t, "hello<|end|>he", 0, want2, 3);
    expect_decode(t, want, 6, 0, "hello world");
    expect_decode(t, want2, 3, 1, "hellohe");
    expect_decode(t, want2, 3, 0, "hello<|end|>he");
    assert_int_equal(tok_token_id(t, "hello"), 11);
    assert_int_equal(tok_token_id(t, "<|end|>"), 13);
    assert_true(tok_is_special(t, 13));
    assert_int_equal(tok_vocab_size(t), 14);
    tok_free(t);
}

static void test_sentencepiece_bpe(void **state) {
    (void)state;
    tok_tokenizer *t = load(SENTENCEPIECE);
    assert_string_equal(tok_kind(t), "bpe-sentencepiece");
    const int32_t want[] = {1, 10, 5, 2, 3, 4};
    expect_ids(t, "ab \xE2\x82\xAC", 1, want, 6); /* the euro sign falls back to its three bytes */
    const int32_t want_plain[] = {10, 5, 2, 3, 4};
    expect_ids(t, "ab \xE2\x82\xAC", 0, want_plain, 5);
    const int32_t unk[] = {5, 0}; /* 'z' and 'q' are unknown, no byte tokens: one fused <unk> */
    expect_ids(t, "zq", 0, unk, 2);
    expect_decode(t, want, 6, 1, "ab \xE2\x82\xAC");
    const int32_t lone[] = {10, 2};
    expect_decode(t, lone, 2, 0, "ab\xEF\xBF\xBD"); /* an unfinished byte run is U+FFFD */
    assert_int_equal(tok_bos_id(t), 1);
    tok_free(t);
}

/* The bytes a token stands for inside a text (what grammar masks match), hand-derived from
 * the vocabulary strings: no decoder step such as the leading-space strip applies. */
static void expect_bytes(const tok_tokenizer *t, int32_t id, const char *want, size_t n) {
    char buf[64];
    int l = tok_token_bytes(t, id, buf, sizeof buf);
    assert_int_equal(l, (int)n);
    assert_memory_equal(buf, want, n);
}

static void test_token_bytes(void **state) {
    (void)state;
    tok_tokenizer *t = load(BYTE_LEVEL);
    expect_bytes(t, 12, " w", 2);        /* \u0120 is the byte-level alphabet's space */
    expect_bytes(t, 11, "hello", 5);
    expect_bytes(t, 13, "<|end|>", 7);   /* an added token: its text */
    assert_int_equal(tok_token_bytes(t, 14, NULL, 0), -1);
    assert_int_equal(tok_token_bytes(t, -1, NULL, 0), -1);
    tok_free(t);
    t = load(SENTENCEPIECE);
    expect_bytes(t, 10, " ab", 3);       /* U+2581 is a space */
    expect_bytes(t, 2, "\xE2", 1);       /* <0xE2>: that byte */
    expect_bytes(t, 5, " ", 1);
    tok_free(t);
}

static void test_wordpiece(void **state) {
    (void)state;
    tok_tokenizer *t = load(WORDPIECE);
    assert_string_equal(tok_kind(t), "wordpiece");
    const int32_t want[] = {2, 4, 10, 5, 6, 7, 8, 9, 1, 3};
    expect_ids(t, "H\xC3\xA9llo, Worlds unaffable xyz", 1, want, 10);
    expect_decode(t, want, 10, 1, "hello, worlds unaffable"); /* [UNK] is special too */
    expect_decode(t, want, 10, 0, "[CLS] hello, worlds unaffable [UNK] [SEP]");
    tok_free(t);
}

static void expect_load_error(const char *json, hearth_status st, const char *needle) {
    tok_tokenizer *t = NULL;
    hearth_error err = {0};
    assert_int_equal(tok_load_hf_json(json, strlen(json), NULL, "bad.json", &t, &err), st);
    assert_null(t);
    if (!strstr(err.message, needle)) fail_msg("message '%s' lacks '%s'", err.message, needle);
}

static void test_load_errors(void **state) {
    (void)state;
    expect_load_error("{\"model\": {", HEARTH_ERR_FORMAT, "invalid JSON");
    expect_load_error("[]", HEARTH_ERR_FORMAT, "no model");
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", HEARTH_ERR_UNSUPPORTED, "Unigram");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a zz\"]}}", HEARTH_ERR_FORMAT, "merge 0");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a\"]}}", HEARTH_ERR_FORMAT, "not in the vocabulary");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"aa\"]}}", HEARTH_ERR_FORMAT, "merge 0");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-5},\"merges\":[]}}", HEARTH_ERR_FORMAT, "out of range");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}}", HEARTH_ERR_FORMAT, "out of range");
    expect_load_error("{\"added_tokens\":[{\"id\":-1,\"content\":\"x\"}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      HEARTH_ERR_FORMAT, "out of range");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", HEARTH_ERR_UNSUPPORTED, "regex");
    expect_load_error("{\"normalizer\":{\"type\":\"Precompiled\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                      HEARTH_ERR_UNSUPPORTED, "Precompiled");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", HEARTH_ERR_FORMAT, "[UNK]");
}

static void test_bad_input(void **state) {
    (void)state;
    tok_tokenizer *t = load(BYTE_LEVEL);
    int32_t *ids = NULL;
    size_t n = 0;
    hearth_error err = {0};
    assert_int_equal(tok_encode(t, "\xC3\x28", 2, 0, &ids, &n, &err), HEARTH_ERR_INVALID);
    assert_null(ids);
    assert_int_equal(tok_encode(t, "", 0, 1, &ids, &n, &err), HEARTH_OK);
    assert_int_equal(n, 0);
    free(ids);
    const int32_t odd[] = {-1, 11, 1000000, 14, 12};
    expect_decode(t, odd, 5, 0, "hello w"); /* unknown ids are skipped, as HF does */
    tok_free(t);
}

/* Concatenated stream output equals tok_decode where that has no U+FFFD (with the
 * SentencePiece chain the stream replaces invalid bytes as mlx-lm's streaming
 * detokenizer does: tests/parity/test_tokenizer_parity.py checks those against it), and
 * every chunk is valid UTF-8. */
static void check_stream(const tok_tokenizer *t, unsigned seed) {
    srand(seed);
    int byte_fallback = 0; /* the SentencePiece chain: Replace, ByteFallback, Fuse[, Strip] */
    for (size_t k = 0; t->dec && t->dec->kind == TOK_DEC_SEQUENCE && k < t->dec->n_kids; k++)
        byte_fallback |= t->dec->kids[k]->kind == TOK_DEC_BYTEFALLBACK;
    int32_t nv = tok_vocab_size(t);
    for (int round = 0; round < 300; round++) {
        int32_t ids[24];
        size_t n = (size_t)(rand() % 24);
        for (size_t i = 0; i < n; i++) ids[i] = rand() % (nv + 2) - 1;
        for (int skip = 0; skip < 2; skip++) {
            char *full = NULL;
            hearth_error err = {0};
            assert_int_equal(tok_decode(t, ids, n, skip, &full, &err), HEARTH_OK);
            tok_stream *s = tok_stream_new(t, skip);
            sbuf acc;
            sbuf_init(&acc);
            for (size_t i = 0; i <= n; i++) {
                const char *c = i < n ? tok_stream_push(s, ids[i]) : tok_stream_finish(s);
                assert_true(tok_utf8_valid(c, strlen(c)));
                sbuf_puts(&acc, c);
            }
            if (!byte_fallback || !strstr(full, "\xEF\xBF\xBD")) assert_string_equal(acc.data ? acc.data : "", full);
            sbuf_free(&acc);
            tok_stream_free(s);
            free(full);
        }
    }
}

static void test_stream_invariants(void **state) {
    (void)state;
    const char *all[] = {BYTE_LEVEL, SENTENCEPIECE, WORDPIECE};
    for (unsigned i = 0; i < 3; i++) {
        tok_tokenizer *t = load(all[i]);
        check_stream(t, 17 + i);
        tok_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level_bpe),  cmocka_unit_test(test_sentencepiece_bpe),
        cmocka_unit_test(test_wordpiece),       cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_bad_input),       cmocka_unit_test(test_stream_invariants),
        cmocka_unit_test(test_token_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
