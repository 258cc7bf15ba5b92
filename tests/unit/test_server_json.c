/* test_server_json.c: the server's Python-json.dumps writer, the request
 * validator's defaults and errors, and the OpenAI error body. Expected bytes
 * were printed by CPython 3.11's json.dumps (the serializer mlx_lm.server
 * uses), not by hearth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static void expect_dump(json_t *v, const char *want) {
    char *got = srv_json_dumps(v);
    assert_string_equal(got, want);
    free(got);
    json_decref(v);
}

static void test_floats_like_python_repr(void **state) {
    (void)state;
    static const struct {
        double v;
        const char *want;
    } cases[] = {
        {0.1, "0.1"},
        {-0.23595237731933594, "-0.23595237731933594"},
        {1e-05, "1e-05"},
        {1.5e-07, "1.5e-07"},
        {1e16, "1e+16"},
        {123.0, "123.0"},
        {1e15, "1000000000000000.0"},
        {0.0001, "0.0001"},
        {-2.5e-300, "-2.5e-300"},
        {3e22, "3e+22"},
        {1.0 / 3, "0.3333333333333333"},
        {0.0, "0.0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_dump(json_real(cases[i].v), cases[i].want);
}

static void test_strings_and_containers(void **state) {
    (void)state;
    json_t *o = json_object();
    json_object_set_new(o, "a", json_string("\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80\n\t\x01\"\\/"));
    json_object_set_new(o, "b", json_pack("[i,n,b,b,{}]", 1, 1, 0));
    json_object_set_new(o, "c", json_array());
    expect_dump(o, "{\"a\": \"\\u00e9\\u2603\\ud83d\\ude00\\n\\t\\u0001\\\"\\\\/\", "
                   "\"b\": [1, null, true, false, {}], "
                   "\"c\": []}");
}

static const srv_defaults defaults = {.max_tokens = 512, .top_p = 1.0f, .num_draft_tokens = 3};

static int parse(const char *body, srv_kind kind, srv_request *r, srv_error *e) {
    return srv_request_parse(body, strlen(body), kind, &defaults, r, e);
}

static void test_request_defaults(void **state) {
    (void)state;
    srv_request r;
    srv_error e = {0};
    assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": null}]}", SRV_CHAT, &r, &e), 0);
    assert_string_equal(r.model, "default_model");
    assert_int_equal(r.max_tokens, 512);
    assert_true(r.top_p == 1.0f && r.temperature == 0.0f && r.top_k == 0 && r.xtc_threshold == 0.1f);
    assert_int_equal(r.top_logprobs, -1);
    assert_int_equal(r.repetition_context_size, 20);
    assert_false(r.stream || r.logprobs || r.has_seed || r.n_stop || r.tools);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 0), "content")), "");
    srv_request_free(&r);
    /* max_completion_tokens wins; true counts as the int 1 as in Python; parts
     * are joined */
    assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": "
                           "[{\"type\": \"text\", \"text\": \"a\"},"
                           " {\"type\": \"text\", \"text\": \"b\"}]}], "
                           "\"max_tokens\": 9, \"max_completion_tokens\": 3,"
                           " \"top_k\": true, \"stop\": \"x\", \"tools\": [], "
                           "\"logit_bias\": {\"5\": -2}}",
                           SRV_CHAT, &r, &e),
                     0);
    assert_int_equal(r.max_tokens, 3);
    assert_int_equal(r.top_k, 1);
    assert_int_equal(r.n_stop, 1);
    assert_null(r.tools);
    assert_int_equal(r.n_bias, 1);
    assert_int_equal(r.bias_ids[0], 5);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 0), "content")), "ab");
    srv_request_free(&r);
}

static void test_request_errors(void **state) {
    (void)state;
    static const struct {
        const char *body;
        srv_kind kind;
        const char *param, *message;
    } cases[] = {
        {"{\"prompt\": \"x\", \"temperature\": \"hot\"}", SRV_TEXT, "temperature",
         "temperature must be of type ('float', 'int')"},
        {"{\"prompt\": \"x\", \"max_tokens\": 0}", SRV_TEXT, "max_tokens", "max_tokens must be at least 1"},
        {"{\"prompt\": \"x\", \"xtc_probability\": 0}", SRV_TEXT, "xtc_probability",
         "xtc_probability must be of type float"},
        {"{\"prompt\": \"x\", \"top_logprobs\": 12}", SRV_TEXT, "top_logprobs", "top_logprobs must be at most 11"},
        {"{\"prompt\": \"x\", \"logprobs\": 1}", SRV_TEXT, "logprobs", "logprobs must be of type bool"},
        {"{\"messages\": []}", SRV_CHAT, "messages", "messages must not be empty"},
        {"{}", SRV_TEXT, "prompt", "Request did not contain a prompt"},
        {"[]", SRV_CHAT, "", "Request should be a JSON dictionary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_request r;
        srv_error e = {0};
        assert_int_equal(parse(cases[i].body, cases[i].kind, &r, &e), -1);
        assert_int_equal(e.http_status, 400);
        assert_string_equal(e.param, cases[i].param);
        assert_string_equal(e.message, cases[i].message);
    }
    srv_error e = {0};
    srv_fail(&e, 401, "authentication_error", NULL, "invalid_api_key", "no key");
    char *body = srv_error_body(&e);
    assert_string_equal(body, "{\"error\": {\"message\": \"no key\", \"type\": "
                              "\"authentication_error\", \"param\": null, "
                              "\"code\": \"invalid_api_key\"}}");
    free(body);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_floats_like_python_repr),
        cmocka_unit_test(test_strings_and_containers),
        cmocka_unit_test(test_request_defaults),
        cmocka_unit_test(test_request_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
