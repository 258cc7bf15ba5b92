/* test_anthropic.c: the Anthropic Messages request translation
 * (anthropic_request.c) into the chat-template message forms, its validation
 * errors and their Anthropic error body, and the content-block builder's reply
 * and event stream. Expected values are written from Anthropic's published
 * request/stream formats and the OpenAI chat-template message forms (assistant
 * tool_calls, role "tool"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"

static const srv_defaults defaults = {.max_tokens = 512, .top_p = 1.0f, .temperature = 0.0f};

static void expect_json(const json_t *got, const char *want_text) {
    json_error_t je;
    json_t *want = json_loads(want_text, 0, &je);
    assert_non_null(want);
    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT);
        fail_msg("got %s\nwant %s", g, want_text);
    }
    json_decref(want);
}

static int parse(const char *body, int count_only, srv_request *r, anth_extra *x, srv_error *e) {
    memset(e, 0, sizeof *e);
    return anth_request_parse(body, strlen(body), &defaults, count_only, r, x, e);
}

static void test_text_and_system(void **state) {
    (void)state;
    srv_request r;
    anth_extra x;
    srv_error e;
    assert_int_equal(parse("{\"model\": \"m\", \"max_tokens\": 7, \"system\": "
                           "[{\"type\": \"text\", \"text\": \"A\"},"
                           "{\"type\": \"text\", \"text\": \"B\"}], "
                           "\"temperature\": 0.5, \"top_k\": 3,"
                           "\"stop_sequences\": [\"x\", \"yz\"], \"stream\": "
                           "true, \"metadata\": {\"user_id\": \"u\"},"
                           "\"unknown_field\": [1], \"messages\": [{\"role\": "
                           "\"user\", \"content\": [{\"type\": "
                           "\"text\", \"text\": \"hi \"}, {\"type\": \"text\", "
                           "\"text\": \"there\"}]}]}",
                           0, &r, &x, &e),
                     0);
    assert_int_equal(r.kind, SRV_CHAT);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.5f && r.top_p == 1.0f && r.top_k == 3 && r.stream);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yz");
    assert_int_equal(r.top_logprobs, -1);
    assert_null(r.tools);
    expect_json(r.messages, "[{\"role\": \"system\", \"content\": \"AB\"}, "
                            "{\"role\": \"user\", \"content\": \"hi there\"}]");
    srv_request_free(&r);
    anth_extra_free(&x);
}

static void test_tool_round_trip(void **state) {
    (void)state;
    srv_request r;
    anth_extra x;
    srv_error e;
    const char *body = "{\"model\": \"m\", \"max_tokens\": 9, \"tool_choice\": {\"type\": "
                       "\"tool\", \"name\": \"w\"},"
                       "\"tools\": [{\"name\": \"w\", \"description\": \"weather\", "
                       "\"input_schema\": {\"type\": \"object\"}}],"
                       "\"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
                       "{\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", "
                       "\"thinking\": \"t\", \"signature\": \"s\"},"
                       "{\"type\": \"text\", \"text\": \"ok\"}, {\"type\": \"tool_use\", "
                       "\"id\": \"toolu_1\", \"name\": \"w\","
                       "\"input\": {\"city\": \"Paris\"}}]},"
                       "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
                       "\"tool_use_id\": \"toolu_1\", \"content\": "
                       "[{\"type\": \"text\", \"text\": \"18 C\"}]}]}]}";
    assert_int_equal(parse(body, 0, &r, &x, &e), 0);
    expect_json(r.messages, "[{\"role\": \"user\", \"content\": \"q\"},"
                            "{\"role\": \"assistant\", \"content\": \"ok\", "
                            "\"tool_calls\": [{\"id\": \"toolu_1\", \"type\": "
                            "\"function\", \"function\": {\"name\": \"w\", "
                            "\"arguments\": {\"city\": \"Paris\"}}}]},"
                            "{\"role\": \"tool\", \"tool_call_id\": \"toolu_1\", "
                            "\"name\": \"w\", \"content\": \"18 C\"}]");
    expect_json(r.tools, "[{\"type\": \"function\", \"function\": {\"name\": "
                         "\"w\", \"description\": \"weather\","
                         "\"parameters\": {\"type\": \"object\"}}}]");
    assert_int_equal(x.tool_choice, ANTH_TOOL_CHOICE_TOOL);
    assert_int_equal(r.force_tool, 1);
    assert_string_equal(r.forced_tool, "w");
    srv_request_free(&r);
    anth_extra_free(&x);
    /* tool_choice none: the tools are not rendered; count_tokens needs no
     * max_tokens */
    assert_int_equal(parse("{\"model\": \"m\", \"tool_choice\": {\"type\": "
                           "\"none\"}, \"tools\": [{\"name\": \"w\", "
                           "\"input_schema\": {}}], \"messages\": [{\"role\": "
                           "\"user\", \"content\": \"q\"}]}",
                           1, &r, &x, &e),
                     0);
    assert_null(r.tools);
    srv_request_free(&r);
    anth_extra_free(&x);
}

static void test_errors(void **state) {
    (void)state;
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
         "\"q\"}]}",
         "max_tokens: Field required"},
        {"{\"max_tokens\": 1, \"messages\": []}", "model: Field required"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": []}", "at least one message"},
        {"{\"model\": \"m\", \"max_tokens\": true, \"messages\": [{\"role\": "
         "\"user\", \"content\": \"q\"}]}",
         "max_tokens"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": "
         "\"user\", \"content\": [{\"type\": "
         "\"image\", \"source\": {}}]}]}",
         "messages.0.content.0: image blocks are not supported"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": "
         "\"user\", \"content\": [{\"type\": "
         "\"tool_result\", \"tool_use_id\": \"t\"}]}]}",
         "matching tool_use"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": "
         "\"user\", \"content\": [{\"type\": "
         "\"tool_use\", \"id\": \"t\", \"name\": \"f\", \"input\": {}}]}]}",
         "'tool_use' are not accepted in user messages"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": "
         "\"user\", \"content\": \"q\"}, "
         "{\"role\": \"assistant\", \"content\": \"pre\"}]}",
         "prefill"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"top_p\": 2, \"messages\": "
         "[{\"role\": \"user\", \"content\": \"q\"}]}",
         "top_p"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"stop_sequences\": [\"\"], "
         "\"messages\": [{\"role\": \"user\", "
         "\"content\": \"q\"}]}",
         "stop_sequences.0"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"tools\": [{\"type\": "
         "\"bash_20250124\", \"name\": \"bash\"}], "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "tools.0.type"},
        {"[1]", "JSON object"},
        {"{\"model\": ", "Invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_request r;
        anth_extra x;
        srv_error e;
        assert_int_equal(parse(cases[i].body, 0, &r, &x, &e), -1);
        assert_int_equal(e.http_status, 400);
        assert_true(e.anthropic);
        if (!strstr(e.message, cases[i].needle)) fail_msg("case %zu: '%s' lacks '%s'", i, e.message, cases[i].needle);
        char *body = srv_error_body(&e);
        json_t *o = json_loads(body, 0, NULL);
        assert_string_equal(json_string_value(json_object_get(o, "type")), "error");
        json_t *inner = json_object_get(o, "error");
        assert_string_equal(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
        assert_string_equal(json_string_value(json_object_get(inner, "message")), e.message);
        json_decref(o);
        free(body);
    }
    assert_string_equal(anth_error_type(401), "authentication_error");
    assert_string_equal(anth_error_type(404), "not_found_error");
    assert_string_equal(anth_error_type(413), "request_too_large");
    assert_string_equal(anth_error_type(500), "api_error");
}

/* The same block calls, streamed and not. */
static void build(anth_blocks *b) {
    anth_blocks_text(b, ANTH_BLOCK_THINKING, "hm", 2);
    anth_blocks_text(b, ANTH_BLOCK_TEXT, "Hel", 3);
    anth_blocks_text(b, ANTH_BLOCK_TEXT, "", 0);
    anth_blocks_text(b, ANTH_BLOCK_TEXT, "lo", 2);
    json_t *input = json_pack("{s:s}", "city", "Paris");
    anth_blocks_tool(b, "toolu_x", "w", input);
    json_decref(input);
    anth_blocks_close(b);
}

static void test_blocks(void **state) {
    (void)state;
    json_t *content = json_array();
    anth_blocks b;
    anth_blocks_init(&b, 0, NULL, content);
    build(&b);
    expect_json(content, "[{\"type\": \"thinking\", \"thinking\": \"hm\", \"signature\": \"\"},"
                         "{\"type\": \"text\", \"text\": \"Hello\"},"
                         "{\"type\": \"tool_use\", \"id\": \"toolu_x\", \"name\": \"w\", "
                         "\"input\": {\"city\": \"Paris\"}}]");
    assert_int_equal(b.n_tool_use, 1);
    anth_blocks_free(&b);
    json_decref(content);

    sbuf out;
    sbuf_init(&out);
    anth_blocks_init(&b, 1, &out, NULL);
    build(&b);
    const char *want = "event: content_block_start\ndata: {\"type\": \"content_block_start\", "
                       "\"index\": 0, \"content_block\": "
                       "{\"type\": \"thinking\", \"thinking\": \"\", \"signature\": \"\"}}\n\n"
                       "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                       "\"index\": 0, \"delta\": {\"type\": "
                       "\"thinking_delta\", \"thinking\": \"hm\"}}\n\n"
                       "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", "
                       "\"index\": 0}\n\n"
                       "event: content_block_start\ndata: {\"type\": \"content_block_start\", "
                       "\"index\": 1, \"content_block\": "
                       "{\"type\": \"text\", \"text\": \"\"}}\n\n"
                       "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                       "\"index\": 1, \"delta\": {\"type\": "
                       "\"text_delta\", \"text\": \"Hel\"}}\n\n"
                       "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                       "\"index\": 1, \"delta\": {\"type\": "
                       "\"text_delta\", \"text\": \"lo\"}}\n\n"
                       "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", "
                       "\"index\": 1}\n\n"
                       "event: content_block_start\ndata: {\"type\": \"content_block_start\", "
                       "\"index\": 2, \"content_block\": "
                       "{\"type\": \"tool_use\", \"id\": \"toolu_x\", \"name\": \"w\", "
                       "\"input\": {}}}\n\n"
                       "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                       "\"index\": 2, \"delta\": {\"type\": "
                       "\"input_json_delta\", \"partial_json\": \"{\\\"city\\\": "
                       "\\\"Paris\\\"}\"}}\n\n"
                       "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", "
                       "\"index\": 2}\n\n";
    assert_string_equal(out.data, want);
    anth_blocks_free(&b);
    sbuf_free(&out);
}

static void test_ids(void **state) {
    (void)state;
    char a[48], b[48];
    anth_make_id(a, sizeof a, "msg_");
    anth_make_id(b, sizeof b, "msg_");
    assert_int_equal(strlen(a), 4 + 24);
    assert_int_equal(strncmp(a, "msg_", 4), 0);
    assert_string_not_equal(a, b);
    for (const char *p = a + 4; *p; p++)
        assert_true((*p >= '0' && *p <= '9') || (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z'));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_system),
        cmocka_unit_test(test_tool_round_trip),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
