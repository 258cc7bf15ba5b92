/* test_textstate.c: unit tests for src/server/textstate.c and toolparse.c. Expected
 * values are mlx-lm 0.32.2's (TextStateMachine + tool_parsers + ToolCallFormatter), as
 * recorded in tests/api/parser_cases.json; the full replay lives in
 * tests/api/test_parsers.py, these pin the main behaviours in C. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "server/textstate.h"
#include "server/toolparse.h"

static bool qwen_vocab(void *ud, const char *piece) {
    (void)ud;
    return !strcmp(piece, "<think>") || !strcmp(piece, "</think>");
}

static ts_config qwen_cfg(void) {
    ts_config cfg;
    hearth_error err = {0};
    assert_int_equal(ts_infer(&cfg, "<tool_call>{{ tool_call.name }}</tool_call>", NULL,
                              qwen_vocab, NULL, false, &err), HEARTH_OK);
    return cfg;
}

/* Feeds chunks (the last with `fin`), returns the accumulated content/reasoning. */
static ts_parser *feed_all(const ts_config *cfg, const char *const *stops, size_t ns,
                           bool reasoning, const char *const *chunks, size_t n, ts_finish fin) {
    hearth_error err = {0};
    ts_parser *p = ts_new(cfg, stops, ns, reasoning, &err);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ts_feed(p, chunks[i], strlen(chunks[i]), i + 1 == n ? fin : TS_FINISH_NONE, &err), HEARTH_OK);
    ts_end(p);
    return p;
}

static void test_infer(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    assert_string_equal(cfg.think_start, "<think>");
    assert_string_equal(cfg.tool_name, "json_tools");
    assert_string_equal(cfg.tool_end, "</tool_call>");
    hearth_error err = {0};
    assert_int_equal(ts_infer(&cfg, "<tool_call>\n<function=x>", NULL, NULL, NULL, false, &err), HEARTH_OK);
    assert_int_equal(cfg.tool, TS_TOOL_QWEN3_CODER);
    assert_int_equal(ts_infer(&cfg, "x", "no_such_parser", NULL, NULL, false, &err), HEARTH_ERR_FORMAT);
    /* Llama 3.1: mlx-lm has no parser, so the drop-in default leaves tool calls as content. */
    assert_int_equal(ts_infer(&cfg, "<|python_tag|>", NULL, NULL, NULL, false, &err), HEARTH_OK);
    assert_int_equal(cfg.tool, TS_TOOL_NONE);
    assert_int_equal(ts_infer(&cfg, "<|python_tag|>", NULL, NULL, NULL, true, &err), HEARTH_OK);
    assert_int_equal(cfg.tool, TS_TOOL_LLAMA3_JSON);
}

static void test_markers_split(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    const char *chunks[] = {"<thi", "nk>abc</th", "ink>done", "."};
    ts_parser *p = feed_all(&cfg, NULL, 0, false, chunks, 4, TS_FINISH_LENGTH);
    ts_pending_view v;
    ts_pending(p, &v);
    assert_string_equal(v.content, "done.");
    assert_string_equal(v.reasoning, "abc");
    assert_string_equal(ts_finish_reason(p, TS_FINISH_LENGTH), "length");
    ts_free(p);
}

static void test_hold_back_and_discard(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    const char *stops[] = {"END"};
    hearth_error err = {0};
    ts_parser *p = ts_new(&cfg, stops, 1, false, &err);
    ts_feed(p, "abc EN", 6, TS_FINISH_NONE, &err);
    ts_pending_view v;
    ts_pending(p, &v);
    assert_string_equal(v.content, "abc "); /* "EN" may start "END": held back */
    ts_feed(p, "<|im_end|>", 10, TS_FINISH_STOP, &err);
    ts_end(p);
    ts_pending(p, &v);
    assert_string_equal(v.content, "abc ");
    ts_free(p);
    /* the same text flushed on length */
    const char *chunks[] = {"abc EN"};
    p = feed_all(&cfg, stops, 1, false, chunks, 1, TS_FINISH_LENGTH);
    ts_pending(p, &v);
    assert_string_equal(v.content, "abc EN");
    ts_free(p);
}

static void test_initial_reasoning(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    const char *prompt = "<|im_start|>assistant\n<think>\n";
    assert_true(ts_prompt_opens_think(&cfg, prompt, strlen(prompt)));
    const char *closed = "<think>\n\n</think>\n\n";
    assert_false(ts_prompt_opens_think(&cfg, closed, strlen(closed)));
    const char *chunks[] = {"thinking...", "</think>", "\n\nHi", ""};
    ts_parser *p = feed_all(&cfg, NULL, 0, true, chunks, 4, TS_FINISH_STOP);
    ts_pending_view v;
    ts_pending(p, &v);
    assert_string_equal(v.reasoning, "thinking...");
    assert_string_equal(v.content, "\n\nHi");
    ts_free(p);
}

static void test_tool_calls_formatted(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    const char *chunks[] = {"Let me check.", "<tool_call>",
                            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\u00eds\", \"t\": 0.1}}\n",
                            "</tool_call>", "<|im_end|>"};
    hearth_error err = {0};
    ts_parser *p = ts_new(&cfg, NULL, 0, false, &err);
    for (int i = 0; i < 5; i++) {
        ts_feed(p, chunks[i], strlen(chunks[i]), i == 4 ? TS_FINISH_STOP : TS_FINISH_NONE, &err);
        if (i == 2) assert_true(ts_in_tool(p)); /* a streaming server sends nothing now */
    }
    ts_end(p);
    ts_pending_view v;
    ts_pending(p, &v);
    assert_string_equal(v.content, "Let me check.");
    assert_int_equal(v.n_tools, 1);
    json_t *out = json_array();
    int index = 0;
    assert_int_equal(tp_format_calls(cfg.tool, v.tool_texts, v.tool_lens, v.n_tools, NULL, true,
                                     &index, out, NULL, NULL), 1);
    json_t *fn = json_object_get(json_array_get(out, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    /* json.dumps(..., ensure_ascii=False): raw UTF-8, Python float repr */
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                        "{\"city\": \"Par\u00eds\", \"t\": 0.1}");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(out, 0), "index")), 0);
    assert_int_equal(strlen(json_string_value(json_object_get(json_array_get(out, 0), "id"))), 36);
    assert_string_equal(ts_finish_reason(p, TS_FINISH_STOP), "tool_calls");
    json_decref(out);
    ts_free(p);
}

static void test_truncated_tool(void **state) {
    (void)state;
    ts_config cfg = qwen_cfg();
    const char *chunks[] = {"<tool_call>", "\n{\"name\": \"f\"", "<|im_end|>"};
    ts_parser *p = feed_all(&cfg, NULL, 0, false, chunks, 3, TS_FINISH_STOP);
    ts_pending_view v;
    ts_pending(p, &v);
    assert_int_equal(v.n_tools, 1);
    json_t *out = json_array();
    int index = 0;
    assert_int_equal(tp_format_calls(cfg.tool, v.tool_texts, v.tool_lens, 1, NULL, false, &index,
                                     out, NULL, NULL), 0); /* dropped ... */
    assert_string_equal(ts_finish_reason(p, TS_FINISH_STOP), "tool_calls"); /* ... but seen */
    json_decref(out);
    ts_free(p);
}

static void test_parsers(void **state) {
    (void)state;
    hearth_error err = {0};
    json_t *calls = json_array();
    const char *m = "get_weather[ARGS]{\"city\": \"Paris\"}other-fn [ARGS] {\"a\": 1}";
    assert_int_equal(tp_parse(TS_TOOL_MISTRAL, m, strlen(m), NULL, calls, &err), HEARTH_OK);
    assert_int_equal(json_array_size(calls), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 1), "name")), "other-fn");
    json_array_clear(calls);
    const char *py = "[get_weather(city=\"Paris\", days=3), pkg.other(flag=true)]";
    assert_int_equal(tp_parse(TS_TOOL_PYTHONIC, py, strlen(py), NULL, calls, &err), HEARTH_OK);
    assert_int_equal(json_array_size(calls), 2);
    assert_true(json_is_true(json_object_get(json_object_get(json_array_get(calls, 1), "arguments"), "flag")));
    json_array_clear(calls);
    const char *qc = "\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n";
    json_t *tools = json_loads("[{\"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
                               "{\"n\": {\"type\": \"integer\"}}}}}]", 0, NULL);
    assert_int_equal(tp_parse(TS_TOOL_QWEN3_CODER, qc, strlen(qc), tools, calls, &err), HEARTH_OK);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_array_get(calls, 0), "arguments"), "n")), 3);
    json_array_clear(calls);
    const char *ll = "{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
    assert_int_equal(tp_parse(TS_TOOL_LLAMA3_JSON, ll, strlen(ll), NULL, calls, &err), HEARTH_OK);
    assert_int_equal(json_array_size(calls), 1);
    assert_int_equal(tp_parse(TS_TOOL_JSON_TOOLS, "{bad", 4, NULL, calls, &err), HEARTH_ERR_FORMAT);
    json_array_clear(calls);
    /* gemma4: <|"|> strings are atoms (their braces and commas do not count), bare keys */
    const char *g4 = "call:f{s:<|\"|>a}, b<|\"|>,n:{m:[1,2]}}call:g{}";
    assert_int_equal(tp_parse(TS_TOOL_GEMMA4, g4, strlen(g4), NULL, calls, &err), HEARTH_OK);
    assert_int_equal(json_array_size(calls), 2);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "arguments"), "s")),
                        "a}, b");
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 1), "name")), "g");
    assert_int_equal(tp_parse(TS_TOOL_GEMMA4, "x", 1, NULL, calls, &err), HEARTH_ERR_FORMAT);
    json_array_clear(calls);
    /* minicpm5 (markers stripped): CDATA kept verbatim, a value typed by the tool's schema */
    const char *m5 = "\"f\"><param name=\"s\"><![CDATA[ a<b\n]]></param><param name=\"n\"> 3 </param>";
    json_t *m5tools = json_loads("[{\"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
                                 "{\"n\": {\"anyOf\": [{\"type\": \"integer\"}]}}}}}]", 0, NULL);
    assert_int_equal(tp_parse(TS_TOOL_MINICPM5, m5, strlen(m5), m5tools, calls, &err), HEARTH_OK);
    const json_t *m5args = json_object_get(json_array_get(calls, 0), "arguments");
    assert_string_equal(json_string_value(json_object_get(m5args, "s")), " a<b\n");
    assert_int_equal(json_integer_value(json_object_get(m5args, "n")), 3);
    assert_int_equal(tp_parse(TS_TOOL_MINICPM5, ">", 1, NULL, calls, &err), HEARTH_ERR_FORMAT);
    json_decref(m5tools);
    assert_int_equal(tp_parse(TS_TOOL_KIMI_K2, "x", 1, NULL, calls, &err), HEARTH_ERR_UNSUPPORTED);
    json_decref(tools);
    json_decref(calls);
}


/* ts_call_watch: where the first of two calls ends, the text fed in pieces of every size
 * from 1 to 7 bytes (markers split across pieces); the text up to there holds exactly one
 * call for the format's own parser, and a text with no call never ends. */
static void test_call_watch(void **state) {
    (void)state;
    static const struct {
        ts_tool_type type;
        const char *text, *first_end; /* the text ends its first call right after first_end */
    } cases[] = {
        {TS_TOOL_JSON_TOOLS,
         "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"}</tool\"}}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
         "}\n</tool_call>"},
        {TS_TOOL_QWEN3_CODER,
         "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n"
         "<tool_call>\n<function=g>\n</function>\n</tool_call>",
         "</function>\n</tool_call>"},
        {TS_TOOL_MINICPM5, "<function name=\"f\"><param name=\"a\">1</param></function><function name=\"g\"></function>",
         "</param></function>"},
        {TS_TOOL_GEMMA4, "<|tool_call>call:f{a:<|\"|>x}<|\"|>}<tool_call|><|tool_call>call:g{}<tool_call|>",
         "}<tool_call|>"},
        {TS_TOOL_PYTHONIC, "<|tool_call_start|>[f(a=1), g(b=2)]<|tool_call_end|><|tool_call_start|>[h()]<|tool_call_end|>",
         ")]<|tool_call_end|>"},
        {TS_TOOL_LLAMA3_JSON,
         "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"s\": \"a}\\\"{\"}}; {\"name\": \"g\", \"parameters\": {}}",
         "\"}}"},
        {TS_TOOL_MISTRAL, "[TOOL_CALLS] f[ARGS]{\"a\": [1, {\"b\": \"]\"}]}[TOOL_CALLS]g[ARGS]{}", "\"}]}"},
        {TS_TOOL_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}] done",
         "{}}]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_config cfg;
        memset(&cfg, 0, sizeof cfg);
        ts_set_tool(&cfg, cases[c].type);
        const char *text = cases[c].text;
        size_t len = strlen(text), want = (size_t)(strstr(text, cases[c].first_end) - text) + strlen(cases[c].first_end);
        for (size_t piece = 1; piece <= 7; piece++) {
            ts_call_watch w;
            assert_true(ts_call_watch_init(&w, &cfg));
            size_t at = 0, got = 0;
            for (; at < len; at += piece) {
                size_t n = len - at < piece ? len - at : piece;
                long k = ts_call_watch_feed(&w, text + at, n);
                if (k >= 0) {
                    assert_true(k >= 1 && (size_t)k <= n);
                    assert_int_equal(got, 0); /* ends once */
                    got = at + (size_t)k;
                }
            }
            assert_int_equal(got, want);
        }
        /* the text through the end, markers stripped, is one call (two for mistral's list
         * and pythonic's: one call text holding the list) */
        size_t start = (size_t)(strstr(text, cfg.tool_start) - text) + strlen(cfg.tool_start);
        size_t end = want - (cfg.tool_end[0] ? strlen(cfg.tool_end) : 0);
        json_t *calls = json_array();
        hearth_error err = {0};
        assert_int_equal(tp_parse(cases[c].type, text + start, end - start, NULL, calls, &err), HEARTH_OK);
        int list = strstr(text, ", g(") || strstr(text, "[{");
        assert_int_equal(json_array_size(calls), list ? 2 : 1);
        json_decref(calls);
    }
    ts_config none;
    memset(&none, 0, sizeof none);
    ts_call_watch w;
    assert_false(ts_call_watch_init(&w, &none));
    ts_config cfg;
    memset(&cfg, 0, sizeof cfg);
    ts_set_tool(&cfg, TS_TOOL_JSON_TOOLS);
    assert_true(ts_call_watch_init(&w, &cfg));
    const char *plain = "No call: </tool_call> then <tool_call"; /* an end before any start, a partial start */
    assert_int_equal(ts_call_watch_feed(&w, plain, strlen(plain)), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_infer),
        cmocka_unit_test(test_markers_split),
        cmocka_unit_test(test_hold_back_and_discard),
        cmocka_unit_test(test_initial_reasoning),
        cmocka_unit_test(test_tool_calls_formatted),
        cmocka_unit_test(test_truncated_tool),
        cmocka_unit_test(test_parsers),
        cmocka_unit_test(test_call_watch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
