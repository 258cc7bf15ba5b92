/* test_grammar.c: the grammar engine against hand-checked languages (regex, GBNF, JSON
 * Schema: strings that must match and strings that must not), error messages that name
 * the problem, and token masks against a brute-force oracle (each token tried alone on a
 * fresh matcher replaying the same prefix). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// clang-format off: cmocka.h needs the four headers above first
#include <cmocka.h>
// clang-format on
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_vocab.h"

/* Every single byte plus some multi-byte tokens and one special token last; id 0 is eos. */
static const char *EXTRA[] = {"{\"", "\":",      "\"}",  "true", "false", "null",         "ab",         "abc",
                              "12",  "\xc3\xa9", "\xc3", "\xa9", " \"",   "\",\"",        "e\"",        "\\n",
                              "0.",  "-1",       "[\"",  "\"]",  "aaaa",  "\xe2\x82\xac", "<tool_call>"};
#define N_EXTRA (sizeof EXTRA / sizeof *EXTRA)
#define N_VOCAB (1 + 256 + N_EXTRA) /* eos, bytes, multi, one special */

static gvocab *test_vocab(void) {
    uint8_t special[N_EXTRA] = {0};
    special[N_EXTRA - 1] = 1;
    return byte_vocab(EXTRA, special, N_EXTRA);
}

static grammar *compile_ok(grammar_kind k, const char *src) {
    grammar *g = NULL;
    hearth_error err = {0};
    hearth_status st = grammar_compile(k, src, strlen(src), NULL, &g, &err);
    if (st) fprintf(stderr, "compile failed: %s\n  source: %s\n", err.message, src);
    assert_int_equal(st, HEARTH_OK);
    return g;
}

static void compile_fails(grammar_kind k, const char *src, const char *needle) {
    grammar *g = NULL;
    hearth_error err = {0};
    hearth_status st = grammar_compile(k, src, strlen(src), NULL, &g, &err);
    if (!st || !strstr(err.message, needle))
        fprintf(stderr, "expected an error naming '%s' for: %s\n  got: %s\n", needle, src, st ? err.message : "(ok)");
    assert_int_not_equal(st, HEARTH_OK);
    assert_null(g);
    assert_non_null(strstr(err.message, needle));
}

/* the whole text is a sentence of g */
static int full_match(const grammar *g, const gvocab *v, const char *text) {
    gmatcher *m = gmatcher_new(g, v);
    assert_non_null(m);
    int ok = gmatcher_accept_bytes(m, text, strlen(text)) && gmatcher_can_end(m);
    gmatcher_free(m);
    return ok;
}

static void expect_language(grammar_kind k, const char *src, const char *const *yes, const char *const *no) {
    gvocab *v = test_vocab();
    grammar *g = compile_ok(k, src);
    for (; yes && *yes; yes++) {
        if (!full_match(g, v, *yes)) fprintf(stderr, "%s: should accept '%s'\n", src, *yes);
        assert_true(full_match(g, v, *yes));
    }
    for (; no && *no; no++) {
        if (full_match(g, v, *no)) fprintf(stderr, "%s: should reject '%s'\n", src, *no);
        assert_false(full_match(g, v, *no));
    }
    grammar_free(g);
    gvocab_free(v);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_regex(void **state) {
    (void)state;
    expect_language(GRAMMAR_REGEX, "a(b|c)*d", L("ad", "abd", "acbcbd"), L("", "a", "abe", "adx"));
    expect_language(GRAMMAR_REGEX, "[0-9]{2,3}-\\d+", L("12-3", "123-45"), L("1-2", "1234-5", "12-"));
    expect_language(GRAMMAR_REGEX, "^x?y+$", L("y", "xyy"), L("x", "xxy"));
    expect_language(GRAMMAR_REGEX, "[^a-c]", L("d", "\xc3\xa9", "\xe2\x82\xac", "\n"), L("a", "b", "dd", ""));
    expect_language(GRAMMAR_REGEX, "(?:ab){2}|\\.", L("abab", "."), L("ab", "x", "ababab"));
    expect_language(GRAMMAR_REGEX, "\\w+\\s\\W", L("a_1 !"), L("a  b", "a !!"));
    expect_language(GRAMMAR_REGEX, ".", L("a", "\xc3\xa9"), L("\n", "\xc3", "ab"));
    expect_language(GRAMMAR_REGEX, "[\\u00e0-\\u00ff]+", L("\xc3\xa9", "\xc3\xa0\xc3\xbf"), L("a", "\xc4\x80"));
    compile_fails(GRAMMAR_REGEX, "(?=a)b", "not supported");
    compile_fails(GRAMMAR_REGEX, "(a)\\1", "\\1");
    compile_fails(GRAMMAR_REGEX, "(ab", "unbalanced");
    compile_fails(GRAMMAR_REGEX, "a)", "unbalanced");
    compile_fails(GRAMMAR_REGEX, "[z-a]", "out of order");
    compile_fails(GRAMMAR_REGEX, "*a", "nothing to repeat");
}

static const char *JSON_GBNF = "# a JSON grammar in llama.cpp's style\n"
                               "root   ::= object\n"
                               "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
                               "object ::=\n"
                               "  \"{\" ws (\n"
                               "            string \":\" ws value\n"
                               "    (\",\" ws string \":\" ws value)*\n"
                               "  )? \"}\" ws\n"
                               "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
                               "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                               "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
                               "number ::= (\"-\"? ([0-9] | [1-9] [0-9]*)) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
                               "ws ::= ([ \\t\\n] ws)?\n";

static void test_gbnf(void **state) {
    (void)state;
    expect_language(GRAMMAR_GBNF, JSON_GBNF,
                    L("{}", "{\"a\": [1, -2.5e3, true, null]}", "{\"\\u00e9\":{\"b\":\"x\\n\"}}"),
                    L("", "[]", "{\"a\"}", "{\"a\":01x}", "{\"a\":tru}"));
    expect_language(GRAMMAR_GBNF,
                    "root ::= expr\nexpr ::= term ((\"+\"|\"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
                    L("1+2", "(1-2)+30", "((4))"), L("1+", "(1", "+1"));
    expect_language(GRAMMAR_GBNF, "root ::= \"a\"{2,3} [xyz]? .", L("aab", "aaax\xc3\xa9"), L("ab", "aaaaa"));
    compile_fails(GRAMMAR_GBNF, "root ::= foo", "1:10: undefined rule 'foo'");
    compile_fails(GRAMMAR_GBNF, "root ::= \"a\"\nx ::= [abc", "2:7: unterminated character class");
    compile_fails(GRAMMAR_GBNF, "root ::= \"a\nb\"", "1:10: unterminated string literal");
    compile_fails(GRAMMAR_GBNF, "start ::= \"a\"", "no 'root' rule");
    compile_fails(GRAMMAR_GBNF, "root ::= root \"a\" | \"b\"", "left recursion");
    compile_fails(GRAMMAR_GBNF, "root ::= x\nx ::= \"\"? x \"a\"", "left recursion");
    compile_fails(GRAMMAR_GBNF, "root ::= \"a\" )", "unexpected character ')'");
    compile_fails(GRAMMAR_GBNF, "root ::= \"a\"\nroot ::= \"b\"", "defined twice");
}

static void test_schema_types(void **state) {
    (void)state;
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                    "\"required\":[\"a\"],\"additionalProperties\":false}",
                    L("{\"a\":1}", "{\"a\": -20, \"b\": \"x\"}", "{\n  \"a\": 0,\n  \"b\": \"\\\"\"\n}"),
                    L("{}", "{\"b\":\"x\"}", "{\"a\":1.5}", "{\"a\":1,\"c\":2}", "{\"a\":01}", "{\"a\":1,}"));
    /* additional properties allowed by default, but a declared key keeps its schema */
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"boolean\"}}}",
                    L("{}", "{\"ab\":true}", "{\"x\":[1,{}]}", "{\"a\":1}", "{\"abc\":1}", "{\"ab\":false,\"b\":null}"),
                    L("{\"ab\":1}", "{\"x\":1,\"ab\":1}"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}",
                    L("-5", "0", "7", "99", "119"), L("-6", "120", "1000", "-0", "5.0e1"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":37}", L("37", "99", "100", "123456"),
                    L("36", "7", "-40"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":0}", L("0", "1.5", "2e-3"), L("-1", "-0.5"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                    L("\"ab\"", "\"\xc3\xa9\xc3\xa9\"", "\"a\\nb\""), L("\"a\"", "\"abcd\"", "\"\xc3\xa9\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[a-z]+-[0-9]$\"}", L("\"ab-1\""),
                    L("\"ab-12\"", "\"-1\"", "\"AB-1\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"x\\\\d\"}", L("\"x1\"", "\"aax9bb\""),
                    L("\"x\"", "\"ab\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", L("\"2024-02-29\""),
                    L("\"2024-13-01\"", "\"24-01-01\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"enum\":[\"red\",1,null,{\"k\":[true]}]}",
                    L("\"red\"", "1", "null", "{\"k\":[true]}", "{ \"k\": [ true ] }"), L("\"blue\"", "2", "{}"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":[\"string\",\"null\"]}", L("\"a\"", "null"), L("1", "{}"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{}", L("1", "\"s\"", "[1,[2,{}]]", "{\"a\":{\"b\":null}}"),
                    L("", "[1,]", "tru"));
}

/* Keywords with exact grammars only in some forms: non-integer number bounds (plain
 * decimals), patternProperties (keys matching the pattern), minProperties 1, pattern
 * with a length that narrows one repeat. Each checked against values jsonschema agrees on. */
static void test_schema_bounds(void **state) {
    (void)state;
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":0.5,\"maximum\":10.25}",
                    L("0.5", "0.50", "0.6", "1", "9.99", "10", "10.25", "10.250", "3.14159"),
                    L("0.4", "0.49999", "-1", "10.26", "10.3", "11", "0", "100"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":-1.5,\"exclusiveMaximum\":2}",
                    L("-1.49", "-1", "-0.5", "0", "-0", "1.999", "1"), L("-1.5", "-1.50", "-2", "2", "2.0", "2.001"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"maximum\":-0.05}", L("-0.05", "-0.1", "-7", "-100.5"),
                    L("-0.04", "0", "-0", "0.05", "1"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":1e-3}", L("0.001", "0.0011", "5", "12.5"),
                    L("0.0009", "0", "-1"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
                    L("0", "0.0", "0.5", "1", "1.0", "1.000"), L("1.01", "-0.1", "2"));
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"type\":\"object\",\"patternProperties\":{\"^x-[a-z]+$\":{\"type\":\"integer\"}},"
                    "\"additionalProperties\":false}",
                    L("{}", "{\"x-a\":1}", "{\"x-ab\":1,\"x-c\":-2}"),
                    L("{\"x-a\":\"s\"}", "{\"y\":1}", "{\"x-\":1}", "{\"x-A\":1}"));
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"properties\":{\"id\":{\"type\":\"string\"}},\"patternProperties\":{\"^[0-9]+$\":{\"type\":"
                    "\"boolean\"}},\"required\":[\"id\"]}",
                    L("{\"id\":\"a\"}", "{\"id\":\"a\",\"12\":true}"),
                    L("{\"id\":\"a\",\"12\":1}", "{\"12\":true}", "{\"id\":1}"));
    compile_fails(GRAMMAR_JSON_SCHEMA,
                  "{\"properties\":{\"ab\":{}},\"patternProperties\":{\"^a\":{\"type\":\"integer\"}}}", "matches");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"patternProperties\":{\"^a\":{\"type\":\"integer\"},\"^b\":{}}}",
                  "different schemas");
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"minProperties\":1}",
                    L("{\"a\":1}", "{\"a\":1,\"b\":2}"), L("{}", "{ }"));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"minProperties\":2}", "minProperties");
    /* the oracle-checked cases are tests/parity/test_schema_keywords.py; these need no model */
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":7}",
                    L("0", "7", "-14", "700000000000000000007"), L("1", "-8", "71"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"maxProperties\":1}", L("{}", "{\"a\":1}"),
                    L("{\"a\":1,\"b\":2}"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"not\":{\"enum\":[\"ab\",\"\"]}}",
                    L("\"a\"", "\"abc\"", "\"b\""), L("\"ab\"", "\"\"", "\"a\\u0062\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"enum\":[1,2,3,4],\"multipleOf\":2,\"not\":{\"const\":4}}", L("2"),
                    L("1", "3", "4"));
    /* fractional steps, taken exactly (0.07 is a multiple of 0.01); the oracle-checked
     * cases are tests/parity/test_schema_keywords.py */
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.01}",
                    L("0", "0.07", "-12.5", "3.10", "3.100", "19.99", "7"), L("0.001", "0.071", "1e2", "3.1001"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.01,\"minimum\":0,\"maximum\":99.99}",
                    L("0", "99.99", "5.5", "0.01"), L("-0.01", "100", "99.991", "5.555"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.01,\"exclusiveMinimum\":0.005}",
                    L("0.01", "3"), L("0", "0.00", "0.005", "-1"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.5}",
                    L("0", "0.5", "-1.5", "2", "2.50", "0.0"), L("0.25", "1.51", "0.05"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.25,\"minimum\":0}",
                    L("0.75", "1.25", "1.5", "3"), L("-0.25", "0.2", "0.125"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":2.5,\"minimum\":-5,\"maximum\":5}",
                    L("-5", "-2.5", "0", "2.5", "5"), L("7.5", "1", "-7.5", "2.50"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":2.5}", L("0", "5", "-10"),
                    L("2", "7", "2.5"));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.3333}", "multipleOf 0.3333");
    /* other bounds: a digit automaton over the value in units of the step */
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.5,\"minimum\":1}",
                    L("1", "1.5", "2.50", "1000000000000000000000.5"), L("0.5", "0", "1.25", "-1", "1.05"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":1,\"maximum\":100000}",
                    L("7", "99995", "700"), L("0", "100002", "8", "-7"));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":10,\"exclusiveMaximum\":100}",
                    L("90", "0", "-1000", "90.0"), L("100", "95", "110"));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"multipleOf\":0.25,\"minimum\":1e17,\"maximum\":1e18}",
                  "multipleOf 0.25 with a bound beyond");
    /* no prefix is taken that cannot be finished: "0.1" leads to no multiple of 0.25 (0.1,
     * 0.1x and 0.1 followed by zeros are none), "0.2" does (0.25) */
    {
        gvocab *v = test_vocab();
        grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.25}");
        gmatcher *m = gmatcher_new(g, v);
        assert_false(gmatcher_accept_bytes(m, "0.1", 3));
        assert_true(gmatcher_accept_bytes(m, "0.2", 3));
        gmatcher_free(m);
        grammar_free(g);
        gvocab_free(v);
    }
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[A-Za-z][a-z0-9_]*$\",\"maxLength\":4}",
                    L("\"a\"", "\"Ab_1\""), L("\"\"", "\"Ab_12\"", "\"1a\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[0-9]{16}$\",\"minLength\":15}",
                    L("\"1234567890123456\""), L("\"123456789012345\""));
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"type\":\"string\",\"pattern\":\"^(ab|[0-9]+)$\",\"minLength\":2,\"maxLength\":3}",
                    L("\"ab\"", "\"12\"", "\"123\""), L("\"1\"", "\"1234\"", "\"abab\""));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":4}", "min/maxLength");
}

/* Matchers of one grammar share its parse states: two threads following different outputs
 * at once get exactly the masks a grammar of their own gives. */
#define SHARED_WORDS ((N_VOCAB + 31) / 32)
static const char *SHARED_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
    "\"n\":{\"type\":\"number\",\"minimum\":-2.5}},\"required\":[\"n\"]}";
static const char *SHARED_TEXT[2] = {"{\"name\":\"ab\xc3\xa9\",\"n\":-1.25}", "{\"n\":3,\"zz\":[true,{\"k\":\"v\"}]}"};
typedef struct {
    const grammar *g;
    const gvocab *v;
    const char *text;
    uint32_t masks[64][SHARED_WORDS];
    int n;
} shared_run;

static void *shared_follow(void *arg) {
    shared_run *r = arg;
    for (int rep = 0; rep < 20; rep++) {
        gmatcher *m = gmatcher_new(r->g, r->v);
        r->n = 0;
        for (const char *p = r->text; m && *p && r->n < 64; p++) {
            gmatcher_mask(m, r->masks[r->n++]);
            if (!gmatcher_accept_bytes(m, p, 1)) break;
        }
        gmatcher_free(m);
    }
    return NULL;
}

static void test_shared_matchers(void **state) {
    (void)state;
    gvocab *v = test_vocab();
    grammar *shared = compile_ok(GRAMMAR_JSON_SCHEMA, SHARED_SCHEMA);
    static shared_run run[2], ref[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ref[i] = (shared_run){.g = compile_ok(GRAMMAR_JSON_SCHEMA, SHARED_SCHEMA), .v = v, .text = SHARED_TEXT[i]};
        shared_follow(&ref[i]);
        run[i] = (shared_run){.g = shared, .v = v, .text = SHARED_TEXT[i]};
    }
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, shared_follow, &run[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run[i].n, (int)strlen(SHARED_TEXT[i]));
        assert_int_equal(run[i].n, ref[i].n);
        assert_memory_equal(run[i].masks, ref[i].masks, sizeof run[i].masks[0] * (size_t)run[i].n);
        grammar_free((grammar *)ref[i].g);
    }
    grammar_free(shared);
    gvocab_free(v);
}

static void test_schema_structure(void **state) {
    (void)state;
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
                    L("[1]", "[1, 2,3]"), L("[]", "[1,2,3,4]", "[\"a\"]"));
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"boolean\"}],\"items\":false}",
        L("[]", "[\"a\"]", "[\"a\",true]"), L("[true]", "[\"a\",true,1]"));
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
        "{\"type\":\"null\"}]}},\"required\":[\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
        L("{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"), L("{}", "{\"next\":{}}", "null"));
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
        "{\"properties\":{\"a\":{\"minimum\":3}}}]}",
        L("{\"a\":3}", "{\"a\":30,\"z\":1}"), L("{\"a\":2}", "{}"));
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"}},\"anyOf\":[{\"required\":[\"x\"]},"
        "{\"required\":[\"y\"]}]}",
        L("{\"kind\":\"a\",\"x\":1}", "{\"y\":2}"), L("{\"kind\":\"a\"}", "{\"kind\":\"b\",\"x\":1}"));
    expect_language(GRAMMAR_JSON_OBJECT, "", L("{}", "{\"a\": [1, \"b\"]}"), L("[]", "1", "\"x\""));
    /* oneOf: tagged unions and distinct types are exact; overlapping branches are refused */
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"}},\"required\":[\"t\"]},"
        "{\"type\":\"object\",\"properties\":{\"t\":{\"enum\":[\"b\"]}},\"required\":[\"t\"]},{\"type\":\"string\"}]}",
        L("{\"t\":\"a\"}", "{\"t\":\"b\",\"u\":1}", "\"s\""), L("{\"t\":\"c\"}", "{}", "1"));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"required\":[\"x\"]},{\"required\":[\"y\"]}]}",
                  "oneOf branches 0 and 1 may both match");
    /* drafts 4-7: keywords beside $ref are ignored; 2019-09 on: they apply */
    expect_language(
        GRAMMAR_JSON_SCHEMA,
        "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"definitions\":{\"o\":{\"type\":\"object\"}},"
        "\"type\":\"string\",\"$ref\":\"#/definitions/o\"}",
        L("{}"), L("\"s\""));
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"$defs\":{\"n\":{\"type\":\"integer\"}},\"maximum\":3,\"$ref\":\"#/$defs/n\"}", L("3"),
                    L("4", "\"s\""));
    expect_language(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"enum\":[\"a\",1]}", L("\"a\""), L("1"));
    /* additionalProperties false sees only its own properties, not those of allOf */
    expect_language(GRAMMAR_JSON_SCHEMA,
                    "{\"allOf\":[{\"properties\":{\"w\":{\"type\":\"integer\"}}}],\"properties\":{\"id\":{\"type\":"
                    "\"string\"}},\"additionalProperties\":false}",
                    L("{\"id\":\"x\"}", "{}"), L("{\"w\":1}", "{\"id\":\"x\",\"w\":1}"));
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"ipv6\"}", "format 'ipv6' is not supported");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"not\":{\"type\":\"string\",\"pattern\":\"a\"}}",
                  "keyword 'pattern' inside 'not' is not supported");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", "'#/$defs/missing' points at nothing");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"http://x/y.json\"}", "only references inside the document");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", "unknown type 'strin'");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":", "invalid JSON");
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", "not supported");
}

/* Masks against brute force: after each prefix of a valid text, a token is in the mask
 * exactly when a fresh matcher fed prefix + token bytes accepts them. */
static void check_masks(const char *src, grammar_kind k, const char *text) {
    gvocab *v = test_vocab();
    grammar *g = compile_ok(k, src);
    gmatcher *m = gmatcher_new(g, v);
    uint32_t mask[(N_VOCAB + 31) / 32];
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) {
        size_t allowed = gmatcher_mask(m, mask), counted = 0;
        for (int32_t t = 0; t < (int32_t)N_VOCAB; t++) {
            gmatcher *b = gmatcher_new(g, v);
            assert_true(gmatcher_accept_bytes(b, text, i));
            int want = gmatcher_accept(b, t);
            int got = (mask[t >> 5] >> (t & 31)) & 1;
            if (want != got)
                fprintf(stderr, "%s: after %zu bytes token %d: mask %d, oracle %d\n", src, i, t, got, want);
            assert_int_equal(want, got);
            counted += (size_t)got;
            gmatcher_free(b);
        }
        assert_int_equal(allowed, counted);
        assert_int_equal(mask[(N_VOCAB - 1) >> 5] >> ((N_VOCAB - 1) & 31) & 1, 0); /* specials never */
        if (i < n) assert_true(gmatcher_accept_bytes(m, text + i, 1));
    }
    /* eos only at the end */
    assert_true(gmatcher_can_end(m));
    assert_true(gmatcher_accept(m, 0));
    assert_true(gmatcher_is_done(m));
    assert_false(gmatcher_accept(m, 1 + 'a'));
    gmatcher_free(m);
    grammar_free(g);
    gvocab_free(v);
}

/* A constraint nothing satisfies is refused when compiled (a 400 naming it at the API),
 * not served as a turn that ends at once with no output; a part nothing satisfies inside
 * an alternative or an optional place leaves the rest in force. */
static void test_unsatisfiable(void **state) {
    (void)state;
    const char *none = "accepts no output at all";
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"not\": {}}", none);
    compile_fails(GRAMMAR_JSON_SCHEMA, "false", none);
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\", \"required\": [\"a\"], \"properties\": {\"a\": false}}",
                  none);
    compile_fails(GRAMMAR_JSON_SCHEMA, "{\"type\": \"array\", \"minItems\": 1, \"items\": {\"not\": {}}}", none);
    compile_fails(GRAMMAR_GBNF, "root ::= x\nx ::= \"a\" x", none); /* recursion without a way out */
    gvocab *v = test_vocab();
    struct {
        const char *schema, *yes, *no;
    } ok[] = {
        {"{\"anyOf\": [{\"not\": {}}, {\"type\": \"null\"}]}", "null", "1"},
        {"{\"type\": \"object\", \"properties\": {\"a\": false, \"b\": {\"type\": \"integer\"}}}", "{\"b\":1}",
         "{\"a\":1}"},
        {"{\"type\": \"array\", \"items\": {\"not\": {}}}", "[]", "[1]"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, ok[i].schema);
        assert_true(full_match(g, v, ok[i].yes));
        assert_false(full_match(g, v, ok[i].no));
        grammar_free(g);
    }
    gvocab_free(v);
}

static void test_masks(void **state) {
    (void)state;
    check_masks("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}",
                GRAMMAR_JSON_SCHEMA, "{\"ab\":\"\xc3\xa9\\n\",\"n\":-12}");
    check_masks(JSON_GBNF, GRAMMAR_GBNF, "{\"a\": [true, null]}");
    /* a length bound far away, then close: short plain tokens at once, then walked */
    check_masks("{\"type\":\"string\",\"maxLength\":21}", GRAMMAR_JSON_SCHEMA,
                "\"aaaa ab\xc3\xa9 abc\xe2\x82\xac aaaa\"");
    check_masks("(ab|abc)+\xe2\x82\xac?", GRAMMAR_REGEX, "abcab\xe2\x82\xac");
}

static void test_accept_refuses(void **state) {
    (void)state;
    gvocab *v = test_vocab();
    grammar *g = compile_ok(GRAMMAR_REGEX, "ab");
    gmatcher *m = gmatcher_new(g, v);
    assert_false(gmatcher_accept(m, 0));           /* eos before the end */
    assert_false(gmatcher_accept(m, 1 + 'b'));     /* wrong byte: state unchanged */
    assert_false(gmatcher_accept(m, N_VOCAB - 1)); /* special */
    assert_false(gmatcher_accept(m, -1));
    assert_false(gmatcher_accept(m, N_VOCAB));
    /* a proposal is allowed up to its first token the grammar forbids; m does not move */
    int32_t proposal[] = {1 + 'a', 1 + 'b', 0, 1 + 'a'};
    assert_int_equal(gmatcher_allowed_prefix(m, proposal, 4), 3); /* a, b, eos; then nothing */
    int32_t wrong[] = {1 + 'a', 1 + 'a'};
    assert_int_equal(gmatcher_allowed_prefix(m, wrong, 2), 1);
    assert_int_equal(gmatcher_allowed_prefix(m, proposal + 1, 3), 0);
    assert_true(gmatcher_accept(m, 257 + 6)); /* "ab": m was where it started */
    assert_true(gmatcher_is_done(m));
    uint32_t mask[(N_VOCAB + 31) / 32];
    assert_int_equal(gmatcher_mask(m, mask), 1); /* only eos */
    assert_true(mask[0] & 1);
    gmatcher_free(m);
    grammar_free(g);
    gvocab_free(v);
}

/* Proposals from the grammar: the bytes it forces, spelled by the longest tokens that fit
 * inside them (checked by hand against the vocabulary above), after any tokens given. */
static void test_extend_forced(void **state) {
    (void)state;
    gvocab *v = test_vocab();
    grammar *g = compile_ok(GRAMMAR_REGEX, "ab");
    gmatcher *m = gmatcher_new(g, v);
    int32_t t[8];
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, NULL, NULL), 1); /* "ab", not "abc": 'c' is not forced */
    assert_int_equal(t[0], 257 + 6);
    t[0] = 1 + 'a';
    assert_int_equal(gmatcher_extend_forced(m, t, 1, 8, NULL, NULL), 2); /* after a given "a": "b" */
    assert_int_equal(t[1], 1 + 'b');
    assert_int_equal(gmatcher_extend_forced(m, t, 1, 1, NULL, NULL), 1); /* no room */
    t[0] = 1 + 'b';
    assert_int_equal(gmatcher_extend_forced(m, t, 1, 8, NULL, NULL), 1); /* a given token it forbids: as given */
    assert_true(gmatcher_accept(m, 257 + 6));
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, NULL, NULL), 0); /* complete: it may end, nothing forced */
    gmatcher_free(m);
    grammar_free(g);
    /* an object with one required key: its letters and closing quote are forced, then a
     * choice (a space or ':') */
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"abc\":{\"type\":\"string\"}},"
                                        "\"required\":[\"abc\"],\"additionalProperties\":false}");
    m = gmatcher_new(g, v);
    assert_true(gmatcher_accept(m, 257 + 0)); /* {" */
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, NULL, NULL), 2);
    assert_int_equal(t[0], 257 + 7); /* abc */
    assert_int_equal(t[1], 1 + '"');
    assert_int_equal(gmatcher_allowed_prefix(m, t, 2), 2);
    gmatcher_free(m);
    grammar_free(g);
    gvocab_free(v);
}

/* Speller stand-ins: "\n    \"f\":" spelled otherwise than by the longest tokens (the
 * closing quote and ':' apart), and a token the grammar forbids there. */
static size_t spell_apart(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap) {
    (void)ctx;
    static const int32_t ids[] = {1 + '\n', 1 + ' ', 1 + ' ', 1 + ' ', 257 + 12, 1 + 'f', 1 + '"', 1 + ':'};
    assert_int_equal(n, 9);
    assert_memory_equal(bytes, "\n    \"f\":", 9);
    size_t k = cap < 8 ? cap : 8;
    memcpy(out, ids, k * sizeof *ids);
    return k;
}

static size_t spell_part(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap) {
    size_t k = spell_apart(ctx, bytes, n, out, cap);
    out[5] = 1 + 'x'; /* forbidden after "\n    \"": the longest tokens go on from there */
    return k;
}

static size_t spell_other(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap) {
    (void)ctx, (void)bytes, (void)n, (void)cap;
    out[0] = 1 + '\n', out[1] = 1 + '\t', out[2] = 1 + ' '; /* a tab where the bytes have a space */
    return 3;
}

static size_t spell_wrong(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap) {
    (void)ctx, (void)bytes, (void)n, (void)cap;
    out[0] = 1 + 'x';
    return 1;
}

/* The bytes a JSON output's layout lets a forced run go through: whitespace between two
 * bytes is guessed as the output wrote it between the same two before, where the grammar
 * chose between whitespace and that byte (a newline keeps the indentation relative to the
 * first byte's line); a pair not seen yet ends the run. */
static void test_forced_through_layout(void **state) {
    (void)state;
    gvocab *v = test_vocab();
    grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"abc\":{\"type\":\"string\"},"
                                        "\"de\":{\"type\":\"object\",\"properties\":{\"f\":{\"type\":\"integer\"}},"
                                        "\"required\":[\"f\"],\"additionalProperties\":false}},"
                                        "\"required\":[\"abc\",\"de\"],\"additionalProperties\":false}");
    gmatcher *m = gmatcher_new(g, v);
    char out[64];
    assert_true(gmatcher_accept_bytes(m, "{", 1));
    assert_int_equal(gmatcher_forced_bytes(m, NULL, 0, out, sizeof out), 0); /* '{' then '"': not seen yet */
    /* a string's word breaks are no choice of the grammar: not learned, so its 51 pairs of
     * letters do not crowd out the layout's few */
    const char *first = "\n  \"abc\": \"a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J "
                        "K L M N O P Q R S T U V W X Y Z\",";
    assert_true(gmatcher_accept_bytes(m, first, strlen(first)));
    assert_int_equal(gmatcher_forced_bytes(m, NULL, 0, out, sizeof out), 0); /* ',' then '"': not seen yet */
    assert_true(gmatcher_accept_bytes(m, "\n  \"d", 5));
    /* "e", the closing quote, ':' as after "abc" (nothing between), then a choice (':' and
     * '{' were never neighbours) */
    assert_int_equal(gmatcher_forced_bytes(m, NULL, 0, out, sizeof out), 3);
    assert_memory_equal(out, "e\":", 3);
    assert_true(gmatcher_accept_bytes(m, "e\": {", 5));
    /* '{' then '"': a newline and two spaces deeper than the brace's line, as after the
     * first brace; then the only key, and ':' */
    size_t n = gmatcher_forced_bytes(m, NULL, 0, out, sizeof out);
    assert_int_equal(n, 9);
    assert_memory_equal(out, "\n    \"f\":", 9);
    /* after given tokens: "\n" and a space are allowed, and the start of the guess: the
     * run goes on with the rest of it */
    int32_t nl[] = {1 + '\n', 1 + ' '};
    assert_int_equal(gmatcher_forced_bytes(m, nl, 2, out, sizeof out), 7);
    assert_memory_equal(out, "   \"f\":", 7);
    int32_t tab[] = {1 + '\n', 1 + '\t'}; /* not the start of the guess: nothing guessed */
    assert_int_equal(gmatcher_forced_bytes(m, tab, 2, out, sizeof out), 0);
    int32_t bad = 1 + 'x';
    assert_int_equal(gmatcher_forced_bytes(m, &bad, 1, out, sizeof out), 0); /* a token it forbids */
    assert_int_equal(gmatcher_forced_bytes(m, NULL, 0, out, 7), 7);          /* cap */
    assert_int_equal(gmatcher_forced_bytes(m, NULL, 0, out, 5), 0);          /* no room for the guess and its byte */
    /* spelled by the given speller where the grammar allows its tokens, else by the
     * longest tokens ("\n", spaces, " \"" and "\":" among them) */
    int32_t t[8];
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, spell_apart, NULL), 8);
    assert_int_equal(t[6], 1 + '"');
    assert_int_equal(t[7], 1 + ':');
    assert_int_equal(gmatcher_allowed_prefix(m, t, 8), 8);
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, spell_wrong, NULL), 7);
    assert_int_equal(t[0], 1 + '\n');
    assert_int_equal(t[3], 1 + ' ');
    assert_int_equal(t[4], 257 + 12);
    assert_int_equal(t[6], 257 + 1);
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 3, spell_apart, NULL), 3); /* cap */
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, spell_part, NULL), 7);
    assert_int_equal(t[4], 257 + 12); /* the speller's " \"" */
    assert_int_equal(t[5], 1 + 'f');  /* then the longest: "f", "\":" */
    assert_int_equal(t[6], 257 + 1);
    /* a spelling of other bytes the grammar allows: proposed that far, not continued */
    assert_int_equal(gmatcher_extend_forced(m, t, 0, 8, spell_other, NULL), 2);
    gmatcher_free(m);
    grammar_free(g);
    gvocab_free(v);
}

/* A forced tool call: marker pieces take the special token or its text, schema pieces
 * follow their own document ($ref inside one resolves there), and a special token is
 * refused everywhere else. */
static void test_tool_call(void **state) {
    (void)state;
    const char *doc = "{\"alternatives\": ["
                      "[{\"token\": \"<tool_call>\"}, {\"text\": \"{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": \"},"
                      " {\"schema\": {\"$defs\": {\"n\": {\"type\": \"integer\"}}, \"type\": \"object\","
                      "  \"properties\": {\"x\": {\"$ref\": \"#/$defs/n\"}}, \"required\": [\"x\"], "
                      "\"additionalProperties\": false}},"
                      " {\"text\": \"}\"}],"
                      "[{\"token\": \"<tool_call>\"}, {\"text\": \"{\\\"name\\\": \\\"g\\\", \\\"arguments\\\": \"},"
                      " {\"schema\": {\"type\": \"object\", \"properties\": {}, \"additionalProperties\": false}}, "
                      "{\"text\": \"}\"}]]}";
    expect_language(GRAMMAR_TOOL_CALL, doc,
                    L("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 12}}",
                      "<tool_call>{\"name\": \"g\", \"arguments\": {}}"),
                    L("<tool_call>{\"name\": \"f\", \"arguments\": {}}",
                      "<tool_call>{\"name\": \"h\", \"arguments\": {}}", "{\"name\": \"g\", \"arguments\": {}}",
                      "<tool_call>{\"name\": \"g\", \"arguments\": {\"x\": 1}}"));
    gvocab *v = test_vocab();
    grammar *g = compile_ok(GRAMMAR_TOOL_CALL, doc);
    gmatcher *m = gmatcher_new(g, v);
    uint32_t mask[(N_VOCAB + 31) / 32];
    assert_int_equal(gmatcher_mask(m, mask), 2); /* the special token and '<' */
    assert_true(mask[(N_VOCAB - 1) >> 5] >> ((N_VOCAB - 1) & 31) & 1);
    assert_true(mask[(1 + '<') >> 5] >> ((1 + '<') & 31) & 1);
    assert_true(gmatcher_accept(m, N_VOCAB - 1));
    const char *rest = "{\"name\": \"g\", \"arguments\": {}}";
    assert_true(gmatcher_accept_bytes(m, rest, strlen(rest)));
    assert_true(gmatcher_is_done(m));
    assert_true(gmatcher_accept(m, 0));
    gmatcher_free(m);
    /* after the marker the special token is text-illegal again */
    m = gmatcher_new(g, v);
    assert_true(gmatcher_accept(m, N_VOCAB - 1));
    assert_false(gmatcher_accept(m, N_VOCAB - 1));
    gmatcher_free(m);
    grammar_free(g);
    /* compiled for a vocabulary that has the special token: only that token opens it */
    hearth_error err = {0};
    assert_int_equal(grammar_compile(GRAMMAR_TOOL_CALL, doc, strlen(doc), v, &g, &err), HEARTH_OK);
    m = gmatcher_new(g, v);
    assert_int_equal(gmatcher_mask(m, mask), 1);
    assert_false(gmatcher_accept(m, 1 + '<'));
    assert_true(gmatcher_accept(m, N_VOCAB - 1));
    gmatcher_free(m);
    grammar_free(g);
    /* ... and a marker the vocabulary has no special token for is its text */
    const char *plain = "{\"alternatives\": [[{\"token\": \"<|x|>\"}]]}";
    assert_int_equal(grammar_compile(GRAMMAR_TOOL_CALL, plain, strlen(plain), v, &g, &err), HEARTH_OK);
    assert_true(full_match(g, v, "<|x|>"));
    grammar_free(g);
    gvocab_free(v);
    compile_fails(GRAMMAR_TOOL_CALL, "[]", "alternatives");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": []}", "alternatives");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"txt\": \"a\"}]]}", "alternatives[0][0] must be");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"text\": \"a\"}, {\"schema\": {\"uniqueItems\": true}}]]}",
                  "alternatives[0][1]: json schema: keyword 'uniqueItems'");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"schema\": {\"$ref\": \"#/$defs/x\"}}]]}", "$defs/x");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"text\": \"a\"}]], \"parallel\": 1}", "'parallel'");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"text\": \"a\"}]], \"between\": []}", "between");
    /* the list around the calls: one call, or with "parallel" one or more, "between" apart */
    const char *calls = "{\"alternatives\": [[{\"text\": \"f(\"}, {\"schema\": {\"type\": \"integer\"}}, "
                        "{\"text\": \")\"}], [{\"text\": \"g()\"}]], \"before\": [{\"text\": \"[\"}], "
                        "\"between\": [{\"text\": \", \"}], \"after\": [{\"text\": \"]\"}]";
    char one[512], many[512];
    snprintf(one, sizeof one, "%s, \"parallel\": false}", calls);
    snprintf(many, sizeof many, "%s, \"parallel\": true}", calls);
    expect_language(GRAMMAR_TOOL_CALL, one, L("[f(1)]", "[g()]"), L("[f(1), g()]", "[]", "[f(1)", "[g(), g()]"));
    expect_language(GRAMMAR_TOOL_CALL, many, L("[f(1)]", "[f(1), g()]", "[g(), g(), f(-2)]"),
                    L("[]", "[f(1) g()]", "[f(1), ]", "[f(x)]", "[f(1), g()"));
    /* a GBNF literal cannot spell the marker byte */
    compile_fails(GRAMMAR_GBNF, "root ::= \"\xff<tool_call>\"", "0xFF");
}

/* Whether s is, ignoring ASCII case, w. */
static int same_ci(const char *s, const char *w) {
    for (; *s && *w; s++, w++)
        if ((*s | 0x20) != (*w | 0x20)) return 0;
    return !*s && !*w;
}

/* The raw piece against its definition (strstr and a case-blind compare as the oracle),
 * over every string of up to 9 letters from {a, b, N, o} (a self-overlapping excluded
 * string, so the automaton's fallbacks are exercised), then characters it must allow or
 * refuse; and the optional / choice / regex pieces. */
static void test_tool_call_pieces(void **state) {
    (void)state;
    gvocab *v = test_vocab();
    grammar *g = compile_ok(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"text\": \"<\"}, {\"raw\": {\"without\": "
                                               "\"abab\", \"not\": [\"no\", \"nab\"]}}, {\"text\": \">\"}]]}");
    const char letters[] = "abNo";
    char s[16], framed[20];
    size_t checked = 0;
    for (int len = 0; len <= 9; len++) {
        int total = 1;
        for (int k = 0; k < len; k++) total *= 4;
        for (int code = 0; code < total; code++) {
            int c = code;
            for (int k = 0; k < len; k++, c /= 4) s[k] = letters[c % 4];
            s[len] = 0;
            snprintf(framed, sizeof framed, "<%s>", s);
            int want = !strstr(s, "abab") && !same_ci(s, "no") && !same_ci(s, "nab");
            if (full_match(g, v, framed) != want) fail_msg("raw: '%s' should be %s", s, want ? "accepted" : "refused");
            checked++;
        }
    }
    assert_true(checked > 300000);
    static const char *const yes[] = {"<\xc3\xa9t\xc3\xa9\n\t\r ~>", "<noo>", "<x\xf0\x9f\x98\x80>", "<<>"};
    static const char *const no[] = {"<\x01>", "<\x7f>", "<\xc3>", "<\xff>", "<aabab>"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) assert_true(full_match(g, v, yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) assert_false(full_match(g, v, no[i]));
    grammar_free(g);
    gvocab_free(v);
    expect_language(GRAMMAR_TOOL_CALL,
                    "{\"alternatives\": [[{\"text\": \"f(\"}, {\"optional\": [{\"text\": \"x=\"}, {\"choice\": "
                    "[[{\"text\": \"1\"}], [{\"regex\": \"[a-c]{2}\"}, {\"optional\": [{\"text\": \"!\"}]}]]}]}, "
                    "{\"text\": \")\"}]]}",
                    L("f()", "f(x=1)", "f(x=ab)", "f(x=cc!)"), L("f(x=)", "f(x=1!)", "f(x=abc)", "f(1)", "f(x=ad)"));
    /* tool-call numbers stay within +-1e15 (what the parsers read exactly); Python strings
     * (pyschema) take no \/ or \u escapes but control characters' */
    expect_language(
        GRAMMAR_TOOL_CALL,
        "{\"alternatives\": [[{\"schema\": {\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, "
        "{\"type\": \"integer\", \"minimum\": 0}, {\"type\": \"number\", \"maximum\": 1}, {}]}}]]}",
        L("[999999999999999, 1000000000000000, -999999999999999.5, 1e99]"),
        L("[1000000000000000, 0, 0, 0]", "[0, 1000000000000001, 0, 0]", "[0, 0, -1e16, 0]", "[0, 0, 0, 1e100]",
          "[0, 0, 0, 12345678901234567]"));
    expect_language(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"pyschema\": {\"type\": \"string\"}}]]}",
                    L("\"a\\nb\\u001f\\\"\\\\\"", "\"\xc3\xa9/\""), L("\"\\/\"", "\"\\u00e9\"", "\"\\u001F\""));
    expect_language(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"schema\": {\"type\": \"string\"}}]]}",
                    L("\"\\/\"", "\"\\u00e9\""), NULL);
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"raw\": {\"not\": [\"x\"]}}]]}", "raw must be");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"raw\": {\"without\": \"a\", \"not\": [\"\xc3\xa9\"]}}]]}",
                  "must be ASCII");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"choice\": []}]]}", "'choice' must be");
    compile_fails(GRAMMAR_TOOL_CALL, "{\"alternatives\": [[{\"regex\": \"(\"}]]}", "alternatives[0][0]");
    compile_fails(GRAMMAR_TOOL_CALL,
                  "{\"alternatives\": [[{\"optional\": [{\"optional\": [{\"optional\": [{\"optional\": [{\"optional\": "
                  "[{\"optional\": [{\"optional\": [{\"optional\": [{\"optional\": [{\"optional\": [{\"text\": "
                  "\"a\"}]}]}]}]}]}]}]}]}]}]}]]}",
                  "nested deeper");
}

/* gvocab_footprint (what hearth fit counts for constrained decoding) against the C library's
 * own count of the bytes gvocab_new left allocated (mallinfo2: heap chunks in use plus mmapped
 * blocks): never less than the footprint's tables, and above them only by the allocator's
 * rounding (a chunk header per allocation, a page per mmapped block; gvocab_new makes about
 * 50 allocations). A synthetic vocabulary whose tokens share prefixes, with special tokens and
 * a long one. Under ASan the allocator is not glibc's: only the sanity of the numbers. */
static void test_vocab_footprint(void **state) {
    (void)state;
    enum { N = 40000 };
    char **bytes = calloc(N, sizeof *bytes);
    uint32_t *len = calloc(N, sizeof *len);
    uint8_t *special = calloc(N, 1);
    assert_non_null(bytes), assert_non_null(len), assert_non_null(special);
    uint64_t r = 0x243f6a8885a308d3ull;
    for (int i = 0; i < N; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        uint32_t l = i == 7 ? 3000 : 1 + (uint32_t)(r % 12);
        bytes[i] = malloc(l);
        assert_non_null(bytes[i]);
        for (uint32_t k = 0; k < l; k++) bytes[i][k] = "etaoin shrdlu\"\\\n\xc3\xa9"[(r >> (k % 48)) % 18];
        len[i] = l;
        special[i] = i % 1000 == 1;
    }
    int32_t eos = 0;
    size_t tables, temporary;
    assert_true(gvocab_footprint(N, (const char *const *)bytes, len, special, &eos, 1, &tables, &temporary));
    assert_true(tables > (size_t)N * 8 && temporary > 0);
#ifndef __SANITIZE_ADDRESS__
    struct mallinfo2 before = mallinfo2();
#endif
    gvocab *v = gvocab_new(N, (const char *const *)bytes, len, special, &eos, 1);
    assert_non_null(v);
#ifndef __SANITIZE_ADDRESS__
    struct mallinfo2 after = mallinfo2();
    size_t held = (after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd);
    assert_true(held >= tables);
    assert_true(held <= tables + 64 * 4200);
#endif
    gvocab_free(v);
    for (int i = 0; i < N; i++) free(bytes[i]);
    free(bytes), free(len), free(special);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex),
        cmocka_unit_test(test_gbnf),
        cmocka_unit_test(test_schema_types),
        cmocka_unit_test(test_schema_bounds),
        cmocka_unit_test(test_schema_structure),
        cmocka_unit_test(test_shared_matchers),
        cmocka_unit_test(test_unsatisfiable),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_accept_refuses),
        cmocka_unit_test(test_extend_forced),
        cmocka_unit_test(test_forced_through_layout),
        cmocka_unit_test(test_tool_call),
        cmocka_unit_test(test_tool_call_pieces),
        cmocka_unit_test(test_vocab_footprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
