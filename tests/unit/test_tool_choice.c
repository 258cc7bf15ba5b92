/* test_tool_choice.c: the forced tool call of every format hearth can force, end to end
 * below HTTP: the constraint document tool_choice.c writes, compiled for a vocabulary
 * whose markers are special tokens (or not), must accept the call the family's chat
 * template shows (hand-written from the templates: hermes/Qwen, Llama 3.1, Mistral v0.3)
 * and refuse a wrong name, an invented key or arguments that break the schema; what it
 * accepts must parse back with toolparse.c into that call. Also tool_choice's shapes and
 * errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// clang-format off: cmocka.h needs the four headers above first
#include <cmocka.h>
// clang-format on
#include <stdlib.h>
#include <string.h>

#include "grammar_vocab.h"
#include "server/tool_choice.h"
#include "server/toolparse.h"

/* eos, every byte, then the markers as special tokens (ids 257, 258) */
static const char *SPECIALS[] = {"<|python_tag|>", "[TOOL_CALLS]"};

static gvocab *vocab(void) { return byte_vocab(SPECIALS, (const uint8_t[]){1, 1}, 2); }

static srv_request request(const char *tools_json) {
    srv_request r;
    memset(&r, 0, sizeof r);
    r.tools = json_loads(tools_json, 0, NULL);
    assert_non_null(r.tools);
    return r;
}

static const char *TOOLS = "[{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {\"type\": "
                           "\"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": "
                           "\"integer\"}}, \"required\": [\"a\", \"b\"]}}},"
                           "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

/* Whether the grammar accepts marker (a special token, or NULL), then body, then close
 * (a special token, or NULL: the body ends the call), then eos. */
static int accepts(const grammar *g, const gvocab *v, int32_t marker, const char *body) {
    gmatcher *m = gmatcher_new(g, v);
    int ok = (marker < 0 || gmatcher_accept(m, marker)) && gmatcher_accept_bytes(m, body, strlen(body)) &&
             gmatcher_accept(m, 0);
    gmatcher_free(m);
    return ok;
}

typedef struct {
    ts_tool_type type;
    int32_t marker;            /* special token id that opens the call, or -1: text */
    const char *good, *parsed; /* accepted text after the marker; the span toolparse gets */
    const char *bad[3];        /* refused: wrong name, invented key, schema broken */
} format_case;

static void test_formats(void **state) {
    (void)state;
    const format_case cases[] = {
        {TS_TOOL_JSON_TOOLS,
         -1,
         "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
         "\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n",
         {"<tool_call>\n{\"name\": \"sub\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
          "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2, \"c\": 3}}\n</tool_call>",
          "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"1\", \"b\": 2}}\n</tool_call>"}},
        {TS_TOOL_LLAMA3_JSON,
         257,
         "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
         "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
         {"{\"name\": \"sub\", \"parameters\": {\"a\": 1, \"b\": 2}}",
          "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2, \"c\": 3}}",
          "{\"name\": \"add\", \"parameters\": {\"a\": 1}}"}},
        {TS_TOOL_MISTRAL,
         258,
         "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
         "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
         {"[{\"name\": \"sub\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
          "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2, \"c\": 3}}]",
          "[{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": 2}}]"}},
    };
    gvocab *v = vocab();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const format_case *c = &cases[i];
        ts_config cfg = {0};
        ts_set_tool(&cfg, c->type);
        srv_request r = request(TOOLS);
        srv_error e = {0};
        assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_NAMED, "add", "tool_choice", &e), 0);
        char *doc = NULL;
        assert_int_equal(srv_tool_constraint(&r, &cfg, &doc, &e), 0);
        grammar *g = NULL;
        hearth_error err = {0};
        assert_int_equal(grammar_compile(GRAMMAR_TOOL_CALL, doc, strlen(doc), v, &g, &err), HEARTH_OK);
        if (!accepts(g, v, c->marker, c->good)) fail_msg("%s: refused %s", cfg.tool_name, c->good);
        for (int k = 0; k < 3; k++)
            if (accepts(g, v, c->marker, c->bad[k])) fail_msg("%s: accepted %s", cfg.tool_name, c->bad[k]);
        /* a special-token marker is that token only, never its text */
        if (c->marker >= 0) {
            char spelled[256];
            snprintf(spelled, sizeof spelled, "%s%s", SPECIALS[c->marker - 257], c->good);
            assert_false(accepts(g, v, -1, spelled));
        }
        /* what the grammar accepts is the call the parser reads */
        json_t *calls = json_array();
        assert_int_equal(tp_parse(c->type, c->parsed, strlen(c->parsed), r.tools, calls, &err), HEARTH_OK);
        assert_int_equal(json_array_size(calls), 1);
        json_t *call = json_array_get(calls, 0);
        assert_string_equal(json_string_value(json_object_get(call, "name")), "add");
        json_t *want = json_pack("{s:i,s:i}", "a", 1, "b", 2);
        assert_true(json_equal(json_object_get(call, "arguments"), want));
        json_decref(want), json_decref(calls);
        grammar_free(g);
        free(doc);
        srv_request_free(&r);
    }
    gvocab_free(v);
}

/* "required" offers every tool; a tool without parameters takes any object */
static void test_required(void **state) {
    (void)state;
    gvocab *v = vocab();
    ts_config cfg = {0};
    ts_set_tool(&cfg, TS_TOOL_JSON_TOOLS);
    srv_request r = request(TOOLS);
    srv_error e = {0};
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", &e), 0);
    assert_null(r.forced_tool);
    char *doc = NULL;
    assert_int_equal(srv_tool_constraint(&r, &cfg, &doc, &e), 0);
    grammar *g = NULL;
    hearth_error err = {0};
    assert_int_equal(grammar_compile(GRAMMAR_TOOL_CALL, doc, strlen(doc), v, &g, &err), HEARTH_OK);
    assert_true(
        accepts(g, v, -1, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"));
    assert_true(accepts(g, v, -1, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"x\": [1]}}\n</tool_call>"));
    assert_false(accepts(g, v, -1, "Sure!<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
    grammar_free(g);
    free(doc);
    srv_request_free(&r);
    gvocab_free(v);
}

static void expect_400(int rc, const srv_error *e, const char *param, const char *needle) {
    assert_int_equal(rc, -1);
    assert_int_equal(e->http_status, 400);
    assert_string_equal(e->param, param);
    if (!strstr(e->message, needle)) fail_msg("'%s' does not name '%s'", e->message, needle);
}

static void test_errors(void **state) {
    (void)state;
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"tool_choice\": \"always\"}", "'auto', 'none', 'required'"},
        {"{\"tool_choice\": {\"type\": \"function\"}}", "an object must be"},
        {"{\"tool_choice\": [1]}", "an object must be"},
        {"{\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}", "no tool named 'nope'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        srv_request r = request(TOOLS);
        srv_error e = {0};
        json_t *root = json_loads(bad[i].body, 0, NULL);
        expect_400(srv_parse_tool_choice(root, &r, &e), &e, "tool_choice", bad[i].needle);
        json_decref(root);
        srv_request_free(&r);
    }
    srv_request r;
    memset(&r, 0, sizeof r);
    srv_error e = {0};
    expect_400(srv_set_tool_choice(&r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", &e), &e, "tool_choice",
               "non-empty 'tools'");
    /* none drops the tools; auto keeps them and forces nothing */
    r = request(TOOLS);
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_AUTO, NULL, "tool_choice", &e), 0);
    assert_non_null(r.tools);
    assert_int_equal(r.force_tool, 0);
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_NONE, NULL, "tool_choice", &e), 0);
    assert_null(r.tools);
    srv_request_free(&r);
    /* a format with no forced syntax, another constraint, a schema that does not compile */
    ts_config cfg = {0};
    ts_set_tool(&cfg, TS_TOOL_GEMMA4);
    r = request(TOOLS);
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", &e), 0);
    char *doc = NULL;
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tool_choice", "(gemma4)");
    ts_set_tool(&cfg, TS_TOOL_JSON_TOOLS);
    r.constraint = HEARTH_CONSTRAINT_JSON_OBJECT;
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tool_choice", "cannot be combined");
    srv_request_free(&r);
    r = request("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"not\": {}}}}]");
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_NAMED, "f", "tool_choice", &e), 0);
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tools", "tools[0].function.parameters: json schema");
    assert_null(doc);
    srv_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
