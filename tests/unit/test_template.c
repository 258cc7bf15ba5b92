/* test_template.c: error paths and limits of the chat-template interpreter
 * (src/tok/template). Rendering parity with jinja2 lives in
 * tests/parity/test_template_parity.py; here: messages name the line and the
 * construct, raise_exception passes its text through, and hostile templates
 * (deep nesting, endless loops, huge output, recursion) fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/template.h"

static hearth_status render(const char *src, const char *ctx_json, char **out, hearth_error *err) {
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    hearth_status st = tpl_render(src, strlen(src), ctx, out, err);
    json_decref(ctx);
    return st;
}

static void expect_ok(const char *src, const char *ctx, const char *want) {
    char *out = NULL;
    hearth_error err = {0};
    hearth_status st = render(src, ctx, &out, &err);
    if (st != HEARTH_OK) fail_msg("render failed: %s", err.message);
    assert_string_equal(out, want);
    free(out);
}

/* renders src, expects a template error whose message contains every needle */
static void expect_err(const char *src, const char *needle1, const char *needle2) {
    char *out = (char *)1;
    hearth_error err = {0};
    hearth_status st = render(src, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &out, &err);
    assert_int_equal(st, HEARTH_ERR_TEMPLATE);
    assert_int_equal(err.status, HEARTH_ERR_TEMPLATE);
    assert_null(out);
    if (needle1 && !strstr(err.message, needle1)) fail_msg("message '%s' lacks '%s'", err.message, needle1);
    if (needle2 && !strstr(err.message, needle2)) fail_msg("message '%s' lacks '%s'", err.message, needle2);
}

static void test_basic_render(void **state) {
    (void)state;
    expect_ok("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
              "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "<user>hi");
    expect_ok("", NULL, "");
    expect_ok("{{ x }}", NULL, ""); /* undefined prints nothing */
}

static void test_unknown_filter_names_line(void **state) {
    (void)state;
    expect_err("line one\n{{ x | frobnicate }}", "line 2", "frobnicate");
    expect_err("\n\n{{ x is frobbed }}", "line 3", "frobbed");
    expect_err("a\n{% frobtag %}", "line 2", "frobtag");
    expect_err("{% include 'x' %}", "line 1", "include");
}

static void test_syntax_errors(void **state) {
    (void)state;
    expect_err("{% if x %}never closed", "line 1", "endif");
    expect_err("{% for x in y %}\n", "endfor", NULL);
    expect_err("{{ 'unterminated }}", "unterminated string", NULL);
    expect_err("text\n{# comment", "line 2", "comment");
    expect_err("{{ x ", "end of", NULL);
    expect_err("{% endif %}", "endif", NULL);
    expect_err("{{ (1 }}", "line 1", NULL);
    expect_err("{% break %}", "loop", NULL);
    expect_err("{{ @ }}", "unexpected char", NULL);
}

static void test_runtime_errors(void **state) {
    (void)state;
    expect_err("{{ 1 / 0 }}", "division by zero", NULL);
    expect_err("{{ missing.attr }}", "'missing' is undefined", NULL);
    expect_err("x\ny\n{{ 'a' + 1 }}", "line 3", "unsupported operand");
    expect_err("{% set l = [] %}{{ l.append(1) }}", NULL, NULL);
    expect_err("{{ 9223372036854775807 + 1 }}", "overflow", NULL);
    expect_err("{{ {} | tojson(indent=100000) }}", "indent", NULL);
}

static void test_raise_exception_message(void **state) {
    (void)state;
    char *out = NULL;
    hearth_error err = {0};
    assert_int_equal(render("{{ raise_exception('Conversation roles must alternate') }}", NULL, &out, &err),
                     HEARTH_ERR_TEMPLATE);
    assert_string_equal(err.message, "Conversation roles must alternate");
    assert_null(out);
}

static void test_limits(void **state) {
    (void)state;
    /* deep expression nesting is refused by the parser, not the C stack */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    strcpy(deep, "{{ ");
    size_t n = 3;
    for (size_t i = 0; i < depth; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (size_t i = 0; i < depth; i++) deep[n++] = ')';
    strcpy(deep + n, " }}");
    expect_err(deep, "nested too deeply", NULL);
    n = 0;
    for (size_t i = 0; i < depth; i++) { memcpy(deep + n, "[", 1); n++; }
    deep[n] = 0;
    char *wrapped = malloc(n + 16);
    snprintf(wrapped, n + 16, "{{ %s }}", deep);
    expect_err(wrapped, NULL, NULL);
    free(wrapped);
    free(deep);
    /* unbounded recursion, nested loops that would run for hours, giant output */
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "too deep", NULL);
    expect_err("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "loop iterations", NULL);
    expect_err("{% for a in range(100000) %}{% for b in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}{% endfor %}",
               "output longer", NULL);
    expect_err("{{ range(10000000) | length }}", "MAX_RANGE", NULL);
    expect_err("{{ 'x' * 1000000000 }}", "too large", NULL);
    expect_err("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, NULL);
}

static void test_no_crash_on_garbage(void **state) {
    (void)state;
    static const char *const inputs[] = {
        "{%", "{{", "{#", "{%-", "-%}", "{{ }}", "{% %}", "{% if %}", "{% for in %}", "{% set %}", "{% macro %}",
        "{{ a[ }}", "{{ a. }}", "{{ a | }}", "{{ a is }}", "{% raw %}", "{{ '\\x' }}", "{{ '\\u12' }}",
        "{{ 0x }}", "{{ 1e }}", "{{ 99999999999999999999 }}", "{% call %}{% endcall %}", "{% filter %}{% endfilter %}",
        "{{ x[1:2:0] }}", "{{ [1,2][1:2:0] }}", "\xff\xfe{{ '\xc3' }}", "{% for a, in x %}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        char *out = NULL;
        hearth_error err = {0};
        hearth_status st = tpl_render(inputs[i], strlen(inputs[i]), NULL, &out, &err);
        if (st == HEARTH_OK) free(out);
        else {
            assert_null(out);
            assert_true(err.message[0] != 0);
        }
    }
    /* NUL bytes inside source and a NULL error pointer are both fine */
    char *out = NULL;
    assert_int_equal(tpl_render("a\0b{{ 1 }}", 10, NULL, &out, NULL), HEARTH_OK);
    size_t len = 0;
    free(out);
    assert_int_equal(tpl_render_len("a\0b{{ 1 }}", 10, NULL, &out, &len, NULL), HEARTH_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(out, "a\0b1", 4);
    free(out);
    assert_int_equal(tpl_render("{{ 1 / 0 }}", 11, NULL, &out, NULL), HEARTH_ERR_TEMPLATE);
    /* a context that is not an object is a caller error */
    json_t *arr = json_array();
    hearth_error err = {0};
    assert_int_equal(tpl_render("x", 1, arr, &out, &err), HEARTH_ERR_INVALID);
    json_decref(arr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_render),
        cmocka_unit_test(test_unknown_filter_names_line),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_raise_exception_message),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_no_crash_on_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
