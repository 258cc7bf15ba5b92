/* test_responses.c: the OpenAI Responses request (responses_request.c): input
 * items -> chat-template messages, defaults and validation errors; and the
 * response store (responses_store.c): copies, delete, TTL and the byte cap.
 * Expected values are written from OpenAI's Responses item forms and the
 * OpenAI chat-template message forms (assistant tool_calls, role "tool"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/responses.h"

static const srv_defaults defaults = {.max_tokens = 512, .top_p = 1.0f, .temperature = 0.5f};

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

static json_t *translate(const char *items_text, const char *instructions, srv_error *e) {
    json_t *items = json_loads(items_text, 0, NULL), *out = NULL;
    assert_non_null(items);
    int rc = resp_items_to_messages(items, instructions, &out, e);
    json_decref(items);
    assert_true(rc ? out == NULL : out != NULL);
    return out;
}

static void test_messages(void **state) {
    (void)state;
    srv_error e = {0};
    json_t *m = translate("[{\"role\": \"developer\", \"content\": \"D\"},"
                          " {\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", "
                          "\"text\": \"a\"}, {\"type\": \"input_text\", \"text\": \"b\"}]},"
                          " {\"type\": \"message\", \"role\": \"assistant\", \"id\": \"msg_1\", \"status\": "
                          "\"completed\", \"content\": [{\"type\": \"output_text\", \"text\": \"c\", "
                          "\"annotations\": []}]},"
                          " {\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": []}]",
                          "Be brief.", &e);
    expect_json(m, "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"system\", \"content\": \"D\"},"
                   " {\"role\": \"user\", \"content\": \"ab\"}, {\"role\": \"assistant\", \"content\": \"c\"}]");
    json_decref(m);
}

static void test_tool_round_trip(void **state) {
    (void)state;
    srv_error e = {0};
    /* parallel calls join one assistant turn; arguments that are not an object
     * stay text */
    json_t *m = translate("[{\"role\": \"user\", \"content\": \"w?\"},"
                          " {\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": "
                          "\"{\\\"x\\\": 1}\"},"
                          " {\"type\": \"function_call\", \"call_id\": \"c2\", \"name\": \"g\", \"arguments\": "
                          "\"oops\"},"
                          " {\"type\": \"function_call_output\", \"call_id\": \"c2\", \"output\": \"r2\"},"
                          " {\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": [{\"type\": "
                          "\"input_text\", \"text\": \"r1\"}]}]",
                          NULL, &e);
    expect_json(m, "[{\"role\": \"user\", \"content\": \"w?\"},"
                   " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
                   "{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": "
                   "1}}},"
                   " {\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": "
                   "\"oops\"}}]},"
                   " {\"role\": \"tool\", \"tool_call_id\": \"c2\", \"name\": \"g\", \"content\": \"r2\"},"
                   " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"name\": \"f\", \"content\": \"r1\"}]");
    json_decref(m);
}

static void expect_bad(const char *items_text, const char *fragment) {
    srv_error e = {0};
    assert_null(translate(items_text, NULL, &e));
    assert_int_equal(e.http_status, 400);
    if (!strstr(e.message, fragment)) fail_msg("message '%s' lacks '%s'", e.message, fragment);
}

static void test_item_errors(void **state) {
    (void)state;
    expect_bad("[{\"type\": \"function_call_output\", \"call_id\": \"zz\", \"output\": \"x\"}]", "No tool call found");
    expect_bad("[{\"role\": \"robot\", \"content\": \"x\"}]", "role");
    expect_bad("[{\"role\": \"user\", \"content\": [{\"type\": \"input_image\"}]}]", "text only");
    expect_bad("[{\"type\": \"item_reference\", \"id\": \"x\"}]", "not supported");
    expect_bad("[{\"type\": \"function_call\", \"call_id\": \"c\", \"name\": \"f\"}]", "arguments");
    expect_bad("[7]", "dictionary");
    expect_bad("[]", "at least one item");
}

static void test_parse(void **state) {
    (void)state;
    resp_request r;
    srv_error e = {0};
    const char *body = "{\"input\": \"hi\", \"instructions\": \"I\", \"tools\": [{\"type\": \"function\", \"name\": "
                       "\"f\", \"parameters\": {\"type\": \"object\"}}], \"tool_choice\": \"required\", "
                       "\"previous_response_id\": \"resp_x\", \"store\": false, \"max_output_tokens\": 9}";
    assert_int_equal(resp_request_parse(body, strlen(body), &defaults, &r, &e), 0);
    expect_json(r.input, "[{\"type\": \"message\", \"role\": \"user\", \"content\": \"hi\"}]");
    expect_json(r.req.tools, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                             "\"object\"}}}]");
    expect_json(r.tools_echo, "[{\"type\": \"function\", \"name\": \"f\", \"description\": null, \"parameters\": "
                              "{\"type\": \"object\"}, \"strict\": null}]");
    assert_string_equal(r.instructions, "I");
    assert_string_equal(r.previous_id, "resp_x");
    assert_string_equal(r.req.model, "default_model");
    assert_int_equal(r.store, 0);
    assert_int_equal(r.req.force_tool, 1);
    assert_int_equal(r.req.max_tokens, 9);
    assert_true(r.req.temperature == 0.5f); /* the --temp default */
    resp_request_free(&r);
    /* tool_choice none: the model is not told about the tools */
    body = "{\"input\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"name\": "
           "\"f\"}], \"tool_choice\": \"none\"}";
    assert_int_equal(resp_request_parse(body, strlen(body), &defaults, &r, &e), 0);
    assert_null(r.req.tools);
    assert_int_equal(r.store, 1);
    assert_int_equal(r.req.max_tokens, 512);
    resp_request_free(&r);
    static const char *bad[] = {"",
                                "[]",
                                "{}",
                                "{\"input\": \"\"}",
                                "{\"input\": []}",
                                "{\"input\": 3}",
                                "{\"input\": \"x\", \"temperature\": 3}",
                                "{\"input\": \"x\", \"top_p\": \"1\"}",
                                "{\"input\": \"x\", \"max_output_tokens\": 0}",
                                "{\"input\": \"x\", \"previous_response_id\": \"\"}",
                                "{\"input\": \"x\", \"tools\": [{\"type\": \"file_search\"}]}",
                                "{\"input\": \"x\", \"tool_choice\": {\"type\": \"function\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        if (resp_request_parse(bad[i], strlen(bad[i]), &defaults, &r, &e) != -1) fail_msg("accepted: %s", bad[i]);
        assert_int_equal(e.http_status, 400);
        assert_string_equal(e.type, "invalid_request_error");
    }
}

static void test_store(void **state) {
    (void)state;
    json_t *resp = json_pack("{s:s}", "id", "resp_a"), *items = json_pack("[{s:s}]", "type", "message");
    /* each entry costs its JSON text plus bookkeeping; 1 KiB holds a few */
    resp_store *st = resp_store_new(3600, 1024);
    assert_non_null(st);
    assert_int_equal(resp_store_put(st, "resp_a", resp, items), 0);
    json_t *got = resp_store_items(st, "resp_a");
    assert_true(json_equal(got, items));
    json_decref(got);
    char *text = resp_store_response(st, "resp_a");
    assert_string_equal(text, "{\"id\":\"resp_a\"}");
    free(text);
    assert_null(resp_store_items(st, "resp_b"));
    /* the cap evicts the oldest first */
    char id[32];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        assert_int_equal(resp_store_put(st, id, resp, items), 0);
    }
    size_t n, bytes;
    resp_store_stats(st, &n, &bytes);
    assert_true(bytes <= 1024 && n > 1 && n < 21);
    assert_null(resp_store_response(st, "resp_a"));
    assert_non_null(got = resp_store_items(st, "resp_19"));
    json_decref(got);
    /* a response larger than the cap on its own is refused */
    json_t *big = json_object();
    char *blob = calloc(2000, 1);
    memset(blob, 'a', 1999);
    json_object_set_new(big, "x", json_string(blob));
    assert_int_equal(resp_store_put(st, "resp_big", big, items), -1);
    assert_null(resp_store_response(st, "resp_big"));
    assert_int_equal(resp_store_delete(st, "resp_19"), 1);
    assert_int_equal(resp_store_delete(st, "resp_19"), 0);
    resp_store_free(st);
    /* TTL 0: an entry is expired as soon as it is looked up */
    st = resp_store_new(0, 1024);
    assert_int_equal(resp_store_put(st, "resp_a", resp, items), 0);
    assert_null(resp_store_items(st, "resp_a"));
    resp_store_free(st);
    free(blob);
    json_decref(big);
    json_decref(resp);
    json_decref(items);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages), cmocka_unit_test(test_tool_round_trip), cmocka_unit_test(test_item_errors),
        cmocka_unit_test(test_parse),    cmocka_unit_test(test_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
