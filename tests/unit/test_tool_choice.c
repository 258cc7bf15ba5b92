/* test_tool_choice.c: the forced tool call of every format hearth can force, end to end
 * below HTTP: the constraint document tool_choice.c writes, compiled for a vocabulary
 * whose markers are special tokens (or not), must accept the call the family's chat
 * template shows (hand-written from the templates: hermes/Qwen, Llama 3.1, Mistral v0.3)
 * and refuse a wrong name, an invented key or arguments that break the schema; what it
 * accepts must parse back with toolparse.c into that call. qwen3_coder and pythonic, whose
 * values are not plain JSON, also get 200 random walks over the masks each, every output
 * read back by toolparse.c and checked against the schema. Also tool_choice's shapes and
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

static grammar *forced_grammar(ts_tool_type type, const gvocab *v, srv_request *r, srv_tools_mode mode,
                               const char *name);

/* parallel_tool_calls: two calls in the family's list form are accepted with it on (and
 * read back as two calls) and refused with it off, where one call still is */
static void test_parallel_lists(void **state) {
    (void)state;
    static const struct {
        ts_tool_type type;
        int32_t marker;
        const char *one, *two, *span; /* span: the two calls' text toolparse gets (NULL: one span per call) */
    } cases[] = {
        {TS_TOOL_JSON_TOOLS, -1, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": "
         "\"ping\", \"arguments\": {}}\n</tool_call>",
         NULL},
        {TS_TOOL_LLAMA3_JSON, 257, "{\"name\": \"ping\", \"parameters\": {}}",
         "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}; {\"name\": \"ping\", \"parameters\": {}}",
         "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}; {\"name\": \"ping\", \"parameters\": {}}"},
        {TS_TOOL_MISTRAL, 258, "[{\"name\": \"ping\", \"arguments\": {}}]",
         "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"ping\", \"arguments\": {}}]",
         "[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"ping\", \"arguments\": {}}]"},
    };
    gvocab *v = vocab();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int parallel = 0; parallel < 2; parallel++) {
            srv_request r = request(TOOLS);
            r.single_tool_call = !parallel;
            grammar *g = forced_grammar(cases[i].type, v, &r, SRV_TOOLS_REQUIRED, NULL);
            assert_true(accepts(g, v, cases[i].marker, cases[i].one));
            if (accepts(g, v, cases[i].marker, cases[i].two) != parallel)
                fail_msg("case %zu, parallel %d: %s", i, parallel, cases[i].two);
            if (parallel && cases[i].span) {
                json_t *calls = json_array();
                hearth_error err = {0};
                assert_int_equal(tp_parse(cases[i].type, cases[i].span, strlen(cases[i].span), r.tools, calls, &err),
                                 HEARTH_OK);
                assert_int_equal(json_array_size(calls), 2);
                json_decref(calls);
            }
            grammar_free(g);
            srv_request_free(&r);
        }
    }
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
    ts_set_tool(&cfg, TS_TOOL_KIMI_K2);
    r = request(TOOLS);
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", &e), 0);
    char *doc = NULL;
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tool_choice", "(kimi_k2)");
    ts_set_tool(&cfg, TS_TOOL_JSON_TOOLS);
    r.constraint = HEARTH_CONSTRAINT_JSON_OBJECT;
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tool_choice", "cannot be combined");
    srv_request_free(&r);
    r = request("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"uniqueItems\": true}}}]");
    assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_NAMED, "f", "tool_choice", &e), 0);
    expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tools", "tools[0].function.parameters: json schema");
    assert_null(doc);
    srv_request_free(&r);
}

/* ---- qwen3_coder ---------------------------------------------------------------------- */

static const char *BOOK_TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"book\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, \"unit\": {\"enum\": [\"celsius\", "
    "\"fahrenheit\", \"null\", \"[1]\"]}, \"note\": {\"type\": \"string\"}, \"count\": {\"type\": \"integer\", "
    "\"minimum\": 1, \"maximum\": 20}, \"ratio\": {\"type\": \"number\"}, \"flag\": {\"type\": \"boolean\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 3}, \"when\": {\"type\": "
    "\"string\", \"format\": \"date\"}}, \"required\": [\"city\", \"unit\", \"note\", \"ratio\", \"flag\"]}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

/* ids: 0 eos, 1..256 bytes, then these (the markers special, as in Qwen's vocabulary) */
static const char *QWEN_EXTRA[] = {
    "<tool_call>", "</tool_call>", "\n</parameter>\n", "</parameter>", "<parameter=", "</function>\n", "null",
    "NULL",        "true",         "celsius"};
static const uint8_t QWEN_SPECIAL[] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
#define N_QWEN_EXTRA (sizeof QWEN_EXTRA / sizeof *QWEN_EXTRA)

/* accepts() for a body whose closing marker `close` (at its end) is the special token 258;
 * marker: 257 or -1 (the body spells it) */
static int marked_accepts(const grammar *g, const gvocab *v, int32_t marker, const char *body, const char *close) {
    size_t n = strlen(body), c = strlen(close);
    assert_true(n >= c && !strcmp(body + n - c, close));
    gmatcher *m = gmatcher_new(g, v);
    int ok = (marker < 0 || gmatcher_accept(m, marker)) && gmatcher_accept_bytes(m, body, n - c) &&
             gmatcher_accept(m, 258) && gmatcher_accept(m, 0);
    gmatcher_free(m);
    return ok;
}

static int qwen_accepts(const grammar *g, const gvocab *v, int32_t marker, const char *body) {
    return marked_accepts(g, v, marker, body, "</tool_call>");
}

static grammar *forced_grammar(ts_tool_type type, const gvocab *v, srv_request *r, srv_tools_mode mode,
                               const char *name) {
    ts_config cfg = {0};
    ts_set_tool(&cfg, type);
    srv_error e = {0};
    assert_int_equal(srv_set_tool_choice(r, mode, name, "tool_choice", &e), 0);
    char *doc = NULL;
    if (srv_tool_constraint(r, &cfg, &doc, &e)) fail_msg("constraint: %s", e.message);
    grammar *g = NULL;
    hearth_error err = {0};
    if (grammar_compile(GRAMMAR_TOOL_CALL, doc, strlen(doc), v, &g, &err)) fail_msg("compile: %s", err.message);
    free(doc);
    return g;
}

/* The call toolparse reads from body (the text between the markers): its arguments. */
static json_t *forced_parse(ts_tool_type type, const srv_request *r, const char *body, const char *want_name) {
    json_t *calls = json_array();
    hearth_error err = {0};
    if (tp_parse(type, body, strlen(body), r->tools, calls, &err)) fail_msg("parse of %s: %s", body, err.message);
    assert_int_equal(json_array_size(calls), 1);
    json_t *call = json_array_get(calls, 0);
    assert_string_equal(json_string_value(json_object_get(call, "name")), want_name);
    json_t *args = json_object_get(call, "arguments");
    if (json_is_string(args))
        args = json_loads(json_string_value(args), 0, NULL);
    else
        json_incref(args);
    json_decref(calls);
    assert_non_null(args);
    return args;
}

/* The template's own form is accepted and reads back; a wrong name, a missing required
 * property, a bad value, "null" as a string and the closing tag inside a string are not. */
static void test_qwen3_coder(void **state) {
    (void)state;
    gvocab *v = byte_vocab(QWEN_EXTRA, QWEN_SPECIAL, N_QWEN_EXTRA);
    srv_request r = request(BOOK_TOOLS);
    grammar *g = forced_grammar(TS_TOOL_QWEN3_CODER, v, &r, SRV_TOOLS_NAMED, "book");
    const char *good = "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
                       "</parameter>\n<parameter=note>\nline one\n  <b>two</b> null\n</parameter>\n<parameter=count>\n"
                       "7\n</parameter>\n<parameter=ratio>\n-2.5\n</parameter>\n<parameter=flag>\nfalse\n"
                       "</parameter>\n<parameter=tags>\n[1, 2]\n</parameter>\n</function>\n";
    char text[1024];
    snprintf(text, sizeof text, "%s</tool_call>", good);
    assert_true(qwen_accepts(g, v, 257, text));
    json_t *args = forced_parse(TS_TOOL_QWEN3_CODER, &r, good, "book");
    json_t *want =
        json_loads("{\"city\": \"Paris\", \"unit\": \"celsius\", \"note\": \"line one\\n  <b>two</b> null\", "
                   "\"count\": 7, \"ratio\": -2.5, \"flag\": false, \"tags\": [1, 2]}",
                   0, NULL);
    if (!json_equal(args, want)) fail_msg("read back %s", json_dumps(args, 0));
    json_decref(args), json_decref(want);
    const char *bad[] = {
        "\n<function=ping>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nnull\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
        "<parameter=note>\nx\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\ntrue\n"
        "</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n"
        "<parameter=note>\nx\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\ntrue\n"
        "</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
        "<parameter=note>\nNuLl\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\ntrue\n"
        "</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
        "<parameter=note>\na</parameter>b\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\n"
        "true\n</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
        "<parameter=note>\nx\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\nyes\n"
        "</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis is a long name\n</parameter>\n<parameter=unit>\ncelsius\n"
        "</parameter>\n<parameter=note>\nx\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\n"
        "true\n</parameter>\n</function>\n</tool_call>",
        "\n<function=book>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n[1]\n</parameter>\n"
        "<parameter=note>\nx\n</parameter>\n<parameter=ratio>\n1\n</parameter>\n<parameter=flag>\ntrue\n"
        "</parameter>\n</function>\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (qwen_accepts(g, v, 257, bad[i])) fail_msg("accepted bad[%zu]: %s", i, bad[i]);
    /* the marker is the special token only */
    snprintf(text, sizeof text, "<tool_call>%s</tool_call>", good);
    assert_false(qwen_accepts(g, v, -1, text));
    grammar_free(g);
    srv_request_free(&r);
    /* "required": either tool; ping takes no parameters */
    r = request(BOOK_TOOLS);
    g = forced_grammar(TS_TOOL_QWEN3_CODER, v, &r, SRV_TOOLS_REQUIRED, NULL);
    assert_true(qwen_accepts(g, v, 257, "\n<function=ping>\n</function>\n</tool_call>"));
    assert_true(qwen_accepts(g, v, 257, text + strlen("<tool_call>")));
    grammar_free(g);
    srv_request_free(&r);
    gvocab_free(v);
}

/* Checks args against BOOK_TOOLS' book schema by hand (the API test uses jsonschema). */
static void check_book(const json_t *a, const char *text) {
    static const char *const keys[] = {"city", "unit", "note", "count", "ratio", "flag", "tags", "when"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)a, key, v) {
        size_t k = 0;
        while (k < 8 && strcmp(key, keys[k])) k++;
        if (k == 8) fail_msg("unknown key %s in %s", key, text);
    }
    const json_t *city = json_object_get(a, "city"), *unit = json_object_get(a, "unit");
    const json_t *note = json_object_get(a, "note"), *count = json_object_get(a, "count");
    const json_t *ratio = json_object_get(a, "ratio"), *flag = json_object_get(a, "flag");
    const json_t *tags = json_object_get(a, "tags"), *when = json_object_get(a, "when");
    if (when && (!json_is_string(when) || json_string_length(when) != 10)) fail_msg("bad date in %s", text);
    if (!json_is_string(city) || !json_is_string(note) || !json_is_number(ratio) || !json_is_boolean(flag))
        fail_msg("bad required value in %s", text);
    size_t cps = 0;
    for (const char *c = json_string_value(city); *c; c++) cps += ((unsigned char)*c & 0xC0) != 0x80;
    if (cps > 12) fail_msg("city longer than 12 in %s", text);
    const char *u = json_string_value(unit);
    if (!u || (strcmp(u, "celsius") && strcmp(u, "fahrenheit") && strcmp(u, "null") && strcmp(u, "[1]")))
        fail_msg("bad unit in %s", text);
    if (count && (!json_is_integer(count) || json_integer_value(count) < 1 || json_integer_value(count) > 20))
        fail_msg("bad count in %s", text);
    if (tags) {
        if (!json_is_array(tags) || json_array_size(tags) > 3) fail_msg("bad tags in %s", text);
        size_t i;
        json_array_foreach(tags, i, v) if (!json_is_integer(v)) fail_msg("bad tag in %s", text);
    }
}

/* Random walks at "temperature 1" over the mask (uniform among the allowed tokens; after
 * 60 to 460 steps the longest allowed one with a closing character, so every walk ends) with vocabulary extra (ids
 * 257...; the call's open / close markers among them): each output is one call between the markers that reads back
 * through toolparse into a call to the forced tool whose arguments meet the schema. */
static void walks(ts_tool_type type, const char *const *extra, const uint8_t *special, size_t n_extra, const char *open,
                  const char *close, int parallel) {
    gvocab *v = byte_vocab(extra, special, n_extra);
    int32_t n = gvocab_size(v);
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4);
    int32_t *allowed = calloc((size_t)n, sizeof *allowed);
    srv_request r = request(BOOK_TOOLS);
    r.single_tool_call = !parallel;
    grammar *g = forced_grammar(type, v, &r, SRV_TOOLS_NAMED, "book");
    int seen_optional = 0;
    size_t most = 0;
    for (unsigned seed = 1; seed <= 200; seed++) {
        srand(seed);
        gmatcher *m = gmatcher_new(g, v);
        char text[16384];
        size_t len = 0;
        int steps = 0;
        while (!gmatcher_is_done(m)) {
            assert_true(++steps < 4000);
            gmatcher_mask(m, mask);
            int32_t na = 0, best = -1;
            for (int32_t t = 0; t < n; t++)
                if (mask[t / 32] >> (t % 32) & 1) allowed[na++] = t;
            assert_true(na > 0);
            int32_t pick = allowed[rand() % na];
            if (steps > 60 + 2 * (int)seed && allowed[0] == 0) pick = 0; /* toward the end: the end when allowed */
            if (pick && (steps > 60 + 2 * (int)seed)) { /* else the longest token that closes something */
                size_t best_len = 0;
                for (int32_t k = 0; k < na; k++) {
                    int32_t t = allowed[k];
                    const char *tb = t == 0 ? "" : t <= 256 ? (const char[]){(char)(t - 1), 0} : extra[t - 257];
                    size_t tl = t == 0 ? 0 : t <= 256 ? 1 : strlen(tb);
                    if (t && !strpbrk(tb, "\"])}>")) continue;
                    if (best < 0 || tl > best_len || (tl == best_len && rand() % 2)) best = t, best_len = tl;
                }
                if (best >= 0) pick = best;
            }
            assert_true(gmatcher_accept(m, pick));
            if (pick == 0) break;
            const char *bytes = pick <= 256 ? (const char[]){(char)(pick - 1)} : extra[pick - 257];
            size_t bl = pick <= 256 ? 1 : strlen(bytes);
            assert_true(len + bl < sizeof text);
            memcpy(text + len, bytes, bl), len += bl;
        }
        gmatcher_free(m);
        while (parallel && len && text[len - 1] == '\n') len--; /* a list may end with its separator */
        text[len] = 0;
        if (strncmp(text, open, strlen(open)) || len < strlen(open) + strlen(close) ||
            strcmp(text + len - strlen(close), close))
            fail_msg("seed %u: not one marked call: %s", seed, text);
        text[len - strlen(close)] = 0;
        if (!parallel) {
            json_t *args = forced_parse(type, &r, text + strlen(open), "book");
            check_book(args, text);
            seen_optional |= json_object_get(args, "count") || json_object_get(args, "tags");
            json_decref(args);
            continue;
        }
        /* one or more calls: each span between the markers reads back, as the text state
         * machine hands them to toolparse (a list inside one span for pythonic) */
        json_t *calls = json_array();
        hearth_error err = {0};
        text[len - strlen(close)] = close[0]; /* the last close back: every span ends with one */
        for (char *at = text; *at;) {
            while (*at == '\n') at++;
            char *end = strstr(at, close);
            if (strncmp(at, open, strlen(open)) || !end) fail_msg("seed %u: not marked calls: %s", seed, text);
            if (tp_parse(type, at + strlen(open), (size_t)(end - at) - strlen(open), r.tools, calls, &err))
                fail_msg("seed %u: parse of %s: %s", seed, text, err.message);
            at = end + strlen(close);
        }
        assert_true(json_array_size(calls) >= 1);
        if (json_array_size(calls) > most) most = json_array_size(calls);
        size_t i;
        json_t *call;
        json_array_foreach(calls, i, call) {
            assert_string_equal(json_string_value(json_object_get(call, "name")), "book");
            json_t *args = json_object_get(call, "arguments");
            args = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
            assert_non_null(args);
            check_book(args, text);
            seen_optional |= json_object_get(args, "count") || json_object_get(args, "tags");
            json_decref(args);
        }
        json_decref(calls);
    }
    assert_true(seen_optional);
    if (parallel) assert_true(most >= 2); /* the walks reach lists of several calls */
    grammar_free(g);
    srv_request_free(&r);
    free(mask), free(allowed);
    gvocab_free(v);
}

static void test_qwen3_coder_walks(void **state) {
    (void)state;
    walks(TS_TOOL_QWEN3_CODER, QWEN_EXTRA, QWEN_SPECIAL, N_QWEN_EXTRA, "<tool_call>", "</tool_call>", 0);
    walks(TS_TOOL_QWEN3_CODER, QWEN_EXTRA, QWEN_SPECIAL, N_QWEN_EXTRA, "<tool_call>", "</tool_call>", 1);
}

typedef struct {
    const char *tools, *needle;
} tool_400;

/* Forcing "required" with each tools list in format type is a 400 on tools naming needle. */
static void tool_400s(ts_tool_type type, const tool_400 *bad, size_t n) {
    ts_config cfg = {0};
    ts_set_tool(&cfg, type);
    for (size_t i = 0; i < n; i++) {
        srv_request r = request(bad[i].tools);
        srv_error e = {0};
        assert_int_equal(srv_set_tool_choice(&r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", &e), 0);
        char *doc = NULL;
        expect_400(srv_tool_constraint(&r, &cfg, &doc, &e), &e, "tools", bad[i].needle);
        srv_request_free(&r);
    }
}

/* A property this format cannot force: 400 when required, left out when optional. */
static void test_qwen3_coder_errors(void **state) {
    (void)state;
    ts_tool_type type = TS_TOOL_QWEN3_CODER;
    static const tool_400 bad[] = {
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"d\": {\"type\": \"string\", \"pattern\": \"^a+$\"}}, \"required\": [\"d\"]}}}]",
         "properties.d: forcing a qwen3_coder call supports"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"required\": [\"x\"]}}}]",
         "'x' is required but not in properties"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", "cannot name 'a b'"},
    };
    tool_400s(type, bad, sizeof bad / sizeof *bad);
    gvocab *v = byte_vocab(QWEN_EXTRA, QWEN_SPECIAL, N_QWEN_EXTRA);
    srv_request r = request("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                            "\"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": \"date\"}}}}}]");
    grammar *g = forced_grammar(TS_TOOL_QWEN3_CODER, v, &r, SRV_TOOLS_REQUIRED, NULL);
    assert_true(qwen_accepts(g, v, 257, "\n<function=f>\n</function>\n</tool_call>"));
    assert_false(qwen_accepts(g, v, 257,
                              "\n<function=f>\n<parameter=d>\n2020-01-01\n</parameter>\n</function>\n"
                              "</tool_call>"));
    grammar_free(g);
    srv_request_free(&r);
    gvocab_free(v);
}

/* ---- pythonic ---------------------------------------------------------------------- */

static const char *PY_EXTRA[] = {"<|tool_call_start|>", "<|tool_call_end|>", "true", "null", "\", ", ")]"};
static const uint8_t PY_SPECIAL[] = {1, 1, 0, 0, 0, 0};
#define N_PY_EXTRA (sizeof PY_EXTRA / sizeof *PY_EXTRA)

static int py_accepts(const grammar *g, const gvocab *v, const char *body) {
    return marked_accepts(g, v, 257, body, "<|tool_call_end|>");
}

/* The LFM2 template's form is accepted and reads back; refused: another tool, a missing
 * required argument, a value breaking the schema, an unknown argument, Python-only
 * syntax, the JSON string escapes Python reads differently. */
static void test_pythonic(void **state) {
    (void)state;
    gvocab *v = byte_vocab(PY_EXTRA, PY_SPECIAL, N_PY_EXTRA);
    srv_request r = request(BOOK_TOOLS);
    grammar *g = forced_grammar(TS_TOOL_PYTHONIC, v, &r, SRV_TOOLS_NAMED, "book");
    const char *good =
        "[book(city=\"Paris\", unit=\"celsius\", note=\"a\\nb \\\"q\\\" \\u001f\", ratio=-2.5, flag=false, "
        "count=7, tags=[1, 2], when=\"2024-02-29\")]";
    char text[1024];
    snprintf(text, sizeof text, "%s<|tool_call_end|>", good);
    assert_true(py_accepts(g, v, text));
    json_t *args = forced_parse(TS_TOOL_PYTHONIC, &r, good, "book");
    json_t *want = json_loads("{\"city\": \"Paris\", \"unit\": \"celsius\", \"note\": \"a\\nb \\\"q\\\" \\u001f\", "
                              "\"ratio\": -2.5, \"flag\": false, \"count\": 7, \"tags\": [1, 2], \"when\": "
                              "\"2024-02-29\"}",
                              0, NULL);
    if (!json_equal(args, want)) fail_msg("read back %s", json_dumps(args, 0));
    json_decref(args), json_decref(want);
    /* optional ones may be left out */
    assert_true(
        py_accepts(g, v, "[book(city=\"\", unit=\"fahrenheit\", note=\"\", ratio=0, flag=true)]<|tool_call_end|>"));
    const char *bad[] = {
        "[ping()]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"x\", ratio=1)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"kelvin\", note=\"x\", ratio=1, flag=true)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"x\", ratio=1, flag=True)]<|tool_call_end|>",
        "[book(city='Paris', unit=\"celsius\", note=\"x\", ratio=1, flag=true)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"a\\/b\", ratio=1, flag=true)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"\\u00e9\", ratio=1, flag=true)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"x\", ratio=1, flag=true, extra=1)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"x\", ratio=1, flag=true, count=0)]<|tool_call_end|>",
        "[book(city=\"Paris\", unit=\"celsius\", note=\"x\", ratio=1e999, flag=true)]<|tool_call_end|>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (py_accepts(g, v, bad[i])) fail_msg("accepted bad[%zu]: %s", i, bad[i]);
    /* the marker is the special token only */
    gmatcher *m = gmatcher_new(g, v);
    assert_false(gmatcher_accept_bytes(m, "<|tool_call_start|>", 19));
    gmatcher_free(m);
    grammar_free(g);
    srv_request_free(&r);
    /* "required": either tool; with no required argument, any subset in schema order */
    r = request("[{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}, {\"type\": \"function\", \"function\": "
                "{\"name\": \"pkg.opt\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                "\"integer\"}, \"b\": {\"type\": \"string\"}, \"c\": {\"type\": \"boolean\"}}}}}]");
    g = forced_grammar(TS_TOOL_PYTHONIC, v, &r, SRV_TOOLS_REQUIRED, NULL);
    static const char *const subsets[] = {"[ping()]",
                                          "[pkg.opt()]",
                                          "[pkg.opt(a=1)]",
                                          "[pkg.opt(b=\"x\")]",
                                          "[pkg.opt(c=true)]",
                                          "[pkg.opt(a=1, c=false)]",
                                          "[pkg.opt(b=\"\", c=true)]",
                                          "[pkg.opt(a=-3, b=\"y\", c=false)]"};
    for (size_t i = 0; i < sizeof subsets / sizeof *subsets; i++) {
        snprintf(text, sizeof text, "%s<|tool_call_end|>", subsets[i]);
        if (!py_accepts(g, v, text)) fail_msg("refused %s", subsets[i]);
        json_t *a = forced_parse(TS_TOOL_PYTHONIC, &r, subsets[i], i ? "pkg.opt" : "ping");
        json_decref(a);
    }
    static const char *const wrong[] = {"[pkg.opt(, a=1)]", "[pkg.opt(c=true, a=1)]", "[pkg.opt(a=1,)]",
                                        "[pkg.opt(a=1, a=2)]"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        snprintf(text, sizeof text, "%s<|tool_call_end|>", wrong[i]);
        if (py_accepts(g, v, text)) fail_msg("accepted %s", wrong[i]);
    }
    grammar_free(g);
    srv_request_free(&r);
    gvocab_free(v);
}

/* A number of hundreds of digits is still a number to Python (float()), so to both parsers
 * the forced formats use: the grammars bound integer digits, not fraction digits. */
static void test_long_numbers(void **state) {
    (void)state;
    char digits[320], text[1024];
    memset(digits, '7', sizeof digits - 1);
    digits[sizeof digits - 1] = 0;
    srv_request r = request(BOOK_TOOLS);
    snprintf(text, sizeof text, "[book(ratio=1.%s, count=-0.%s)]", digits, digits);
    json_t *a = forced_parse(TS_TOOL_PYTHONIC, &r, text, "book");
    assert_true(json_is_real(json_object_get(a, "ratio")));
    assert_float_equal(json_real_value(json_object_get(a, "ratio")), 1.7777777777777777, 1e-15);
    assert_float_equal(json_real_value(json_object_get(a, "count")), -0.7777777777777777, 1e-15);
    json_decref(a);
    snprintf(text, sizeof text, "\n<function=book>\n<parameter=ratio>\n2.%s\n</parameter>\n</function>\n", digits);
    a = forced_parse(TS_TOOL_QWEN3_CODER, &r, text, "book");
    assert_float_equal(json_real_value(json_object_get(a, "ratio")), 2.7777777777777777, 1e-15);
    json_decref(a);
    srv_request_free(&r);
}

static void test_pythonic_walks(void **state) {
    (void)state;
    walks(TS_TOOL_PYTHONIC, PY_EXTRA, PY_SPECIAL, N_PY_EXTRA, "<|tool_call_start|>", "<|tool_call_end|>", 0);
    walks(TS_TOOL_PYTHONIC, PY_EXTRA, PY_SPECIAL, N_PY_EXTRA, "<|tool_call_start|>", "<|tool_call_end|>", 1);
}

static void test_pythonic_errors(void **state) {
    (void)state;
    ts_tool_type type = TS_TOOL_PYTHONIC;
    static const tool_400 bad[] = {
        {"[{\"type\": \"function\", \"function\": {\"name\": \"get-weather\"}}]",
         "cannot name 'get-weather' (names: Python"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"a b\": {\"type\": \"string\"}}, \"required\": [\"a b\"]}}}]",
         "properties.a b: a forced pythonic call cannot write this property (names: Python"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"required\": [\"x\"]}}}]",
         "'x' is required but not in properties (a forced pythonic call"},
    };
    tool_400s(type, bad, sizeof bad / sizeof *bad);
}

/* ---- Gemma 4 -------------------------------------------------------------------------- */

/* ids 257.. : the call markers and the string delimiter are special tokens, as in Gemma 4 */
static const char *G4_EXTRA[] = {"<|tool_call>", "<tool_call|>", "<|\"|>", "true", "null", "},"};
static const uint8_t G4_SPECIAL[] = {1, 1, 1, 0, 0, 0};
#define N_G4_EXTRA (sizeof G4_EXTRA / sizeof *G4_EXTRA)
#define Q "\xff" /* where a test text has the <|"|> token (259), spelled out for the parser */

/* Whether g accepts <|tool_call> body <tool_call|> eos, body's Q bytes being token 259. */
static int g4_accepts(const grammar *g, const gvocab *v, const char *body) {
    gmatcher *m = gmatcher_new(g, v);
    int ok = gmatcher_accept(m, 257);
    for (const char *p = body; ok && *p;) {
        const char *q = strchr(p, '\xff');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        ok = (!n || gmatcher_accept_bytes(m, p, n)) && (!q || gmatcher_accept(m, 259));
        p = q ? q + 1 : p + n;
    }
    ok = ok && gmatcher_accept(m, 258) && gmatcher_accept(m, 0);
    gmatcher_free(m);
    return ok;
}

/* body with each Q as the delimiter's text: what the parser reads */
static json_t *g4_parse(const srv_request *r, const char *body, const char *want_name) {
    char text[2048];
    size_t k = 0;
    for (const char *p = body; *p && k + 8 < sizeof text; p++) {
        if (*p == '\xff')
            memcpy(text + k, "<|\"|>", 5), k += 5;
        else
            text[k++] = *p;
    }
    text[k] = 0;
    return forced_parse(TS_TOOL_GEMMA4, r, text, want_name);
}

/* The template's form (format_argument: <|"|> strings, bare keys, no spacing) is accepted
 * and reads back; refused: another tool, a missing required argument, a bad value, the
 * delimiter spelled as text, a quoted key. */
static void test_gemma4(void **state) {
    (void)state;
    gvocab *v = byte_vocab(G4_EXTRA, G4_SPECIAL, N_G4_EXTRA);
    srv_request r = request(BOOK_TOOLS);
    grammar *g = forced_grammar(TS_TOOL_GEMMA4, v, &r, SRV_TOOLS_NAMED, "book");
    const char *good = "call:book{city:" Q "Paris" Q ",unit:" Q "celsius" Q ",note:" Q "a {b}, \"c\"\nd: e" Q
                       ",ratio:-2.5,flag:false,count:7,tags:[1, 2]}";
    assert_true(g4_accepts(g, v, good));
    json_t *args = g4_parse(&r, good, "book");
    json_t *want = json_loads("{\"city\": \"Paris\", \"unit\": \"celsius\", \"note\": \"a {b}, \\\"c\\\"\\nd: e\", "
                              "\"ratio\": -2.5, \"flag\": false, \"count\": 7, \"tags\": [1, 2]}",
                              0, NULL);
    if (!json_equal(args, want)) fail_msg("read back %s", json_dumps(args, 0));
    json_decref(args), json_decref(want);
    assert_true(g4_accepts(g, v, "call:book{city:" Q Q ",unit:" Q "null" Q ",note:" Q "null" Q ",ratio:0,flag:true}"));
    const char *bad[] = {
        "call:ping{}",
        "call:book{city:" Q "Paris" Q ",unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1}",
        "call:book{city:" Q "Paris" Q ",unit:" Q "kelvin" Q ",note:" Q "x" Q ",ratio:1,flag:true}",
        "call:book{city:" Q "Paris" Q ",unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:True}",
        "call:book{city:<|\"|>Paris<|\"|>,unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:true}",
        "call:book{\"city\":" Q "Paris" Q ",unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:true}",
        "call:book{city:" Q "Paris" Q ", unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:true}",
        "call:book{city:" Q "Paris is a long name" Q ",unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:true}",
        "call:book{city:" Q "Paris" Q ",unit:" Q "celsius" Q ",note:" Q "x" Q ",ratio:1,flag:true,when:" Q
        "2024-01-01" Q "}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (g4_accepts(g, v, bad[i])) fail_msg("accepted bad[%zu]: %s", i, bad[i]);
    grammar_free(g);
    srv_request_free(&r);
    gvocab_free(v);
}

static void test_gemma4_walks(void **state) {
    (void)state;
    walks(TS_TOOL_GEMMA4, G4_EXTRA, G4_SPECIAL, N_G4_EXTRA, "<|tool_call>", "<tool_call|>", 0);
    walks(TS_TOOL_GEMMA4, G4_EXTRA, G4_SPECIAL, N_G4_EXTRA, "<|tool_call>", "<tool_call|>", 1);
}

static void test_gemma4_errors(void **state) {
    (void)state;
    static const tool_400 bad[] = {
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"o\": {\"type\": \"object\"}}, \"required\": [\"o\"]}}}]",
         "properties.o: a forced gemma4 call cannot write this property"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"l\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": "
         "[\"l\"]}}}]",
         "properties.l: a forced gemma4 call cannot write this property"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f.g\"}}]", "cannot name 'f.g'"},
    };
    tool_400s(TS_TOOL_GEMMA4, bad, sizeof bad / sizeof *bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_parallel_lists),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_qwen3_coder),
        cmocka_unit_test(test_qwen3_coder_walks),
        cmocka_unit_test(test_qwen3_coder_errors),
        cmocka_unit_test(test_pythonic),
        cmocka_unit_test(test_pythonic_walks),
        cmocka_unit_test(test_long_numbers),
        cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_gemma4_walks),
        cmocka_unit_test(test_gemma4_errors),
        cmocka_unit_test(test_pythonic_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
