/* test_web_assets.c: the embedded chat page: every path the page uses is found with
 * the right Content-Type and the bytes of web/, anything else is not, and the ETag
 * follows the content. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/web_assets.h"

/* The test runs from the repository root (make unit), where web/ is. */
static void check_same_as_file(const srv_web_asset_view *v, const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    assert_int_equal(v->size, (size_t)n);
    assert_memory_equal(v->data, buf, (size_t)n);
    free(buf);
}

static void test_known_paths(void **state) {
    (void)state;
    srv_web_asset_view v;
    assert_non_null(srv_web_find("/", &v));
    assert_string_equal(v.content_type, "text/html; charset=utf-8");
    check_same_as_file(&v, "web/index.html");
    assert_non_null(srv_web_find("/index.html", &v));
    check_same_as_file(&v, "web/index.html");
    assert_non_null(srv_web_find("/app.js", &v));
    assert_string_equal(v.content_type, "text/javascript; charset=utf-8");
    check_same_as_file(&v, "web/app.js");
    assert_non_null(srv_web_find("/style.css", &v));
    assert_string_equal(v.content_type, "text/css; charset=utf-8");
    check_same_as_file(&v, "web/style.css");
}

static void test_unknown_paths(void **state) {
    (void)state;
    srv_web_asset_view v;
    const char *bad[] = {"", "/app.js/", "/APP.JS", "/web/app.js", "/../web/app.js", "//", "/app.js?x", "app.js"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_null(srv_web_find(bad[i], &v));
    assert_null(srv_web_find(NULL, &v));
}

static void test_etags(void **state) {
    (void)state;
    srv_web_asset_view a, b, c;
    srv_web_find("/app.js", &a);
    srv_web_find("/app.js", &b);
    srv_web_find("/style.css", &c);
    assert_int_equal(strlen(a.etag), 18); /* quoted 16 hex digits */
    assert_true(a.etag[0] == '"' && a.etag[17] == '"');
    assert_string_equal(a.etag, b.etag);
    assert_string_not_equal(a.etag, c.etag);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_paths),
        cmocka_unit_test(test_unknown_paths),
        cmocka_unit_test(test_etags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
