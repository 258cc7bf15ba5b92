/* test_http_parse.c: the HTTP/1.1 framing of src/server/http_parse.c against RFC 9112's
 * own rules and examples: the chunked body of section 7.1 decoded to its known text
 * whatever the split of the bytes, a body over the limit refused, request heads with
 * their fields, keep-alive and length, and the heads the RFC says to refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

/* Decodes body fed in pieces of `piece` bytes; returns the decoded text (caller frees)
 * or NULL with *status set. *rest: bytes after the body's end. */
static char *decode(const char *body, size_t piece, size_t max_body, int *status, size_t *rest) {
    http_chunked c = {0};
    sbuf out;
    sbuf_init(&out);
    size_t len = strlen(body), pos = 0;
    int done = 0;
    const char *error = NULL;
    while (pos < len && !done) {
        size_t k = len - pos < piece ? len - pos : piece;
        long used = http_chunked_feed(&c, body + pos, k, &out, max_body, &done, status, &error);
        if (used < 0) {
            assert_non_null(error);
            sbuf_free(&out);
            return NULL;
        }
        pos += (size_t)used;
    }
    *status = done ? 200 : 0;
    *rest = len - pos;
    sbuf_putc(&out, 0);
    return out.data;
}

static void test_chunked_every_split(void **state) {
    (void)state;
    /* a body with an extension, a trailer field, and the next request's first bytes */
    const char *body = "4\r\nWiki\r\n7;name=\"v\"\r\npedia i\r\nB\r\nn \r\nchunks.\r\n0\r\nExpires: never\r\n\r\nGET";
    for (size_t piece = 1; piece <= strlen(body); piece++) {
        int status;
        size_t rest;
        char *text = decode(body, piece, 1 << 20, &status, &rest);
        assert_non_null(text);
        assert_int_equal(status, 200);
        assert_string_equal(text, "Wikipedia in \r\nchunks.");
        assert_int_equal(rest, 3); /* "GET" is left for the next request */
        free(text);
    }
}

static void test_chunked_refusals(void **state) {
    (void)state;
    static const struct {
        const char *body;
        size_t max_body;
        int status;
    } cases[] = {
        {"5\r\nhello\r\n0\r\n\r\n", 4, 413},           /* over the limit: refused before it is read */
        {"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", 5, 413}, /* the sum over the limit */
        {"fffffffffffffffff\r\n", 1 << 20, 413},       /* a size that would overflow */
        {"x\r\n", 1 << 20, 400},                       /* not hex */
        {" 5\r\nhello\r\n", 1 << 20, 400},             /* leading space */
        {"5\nhello\r\n", 1 << 20, 400},                /* bare LF */
        {"5\r\nhelloX\r\n", 1 << 20, 400},             /* data longer than its size */
        {"0\r\nBad\x01Field\r\n\r\n", 1 << 20, 400},   /* a control byte in a trailer */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int status = 0;
        size_t rest;
        char *text = decode(cases[i].body, 64, cases[i].max_body, &status, &rest);
        assert_null(text);
        assert_int_equal(status, cases[i].status);
    }
}

/* Parses a head given as a C string; returns its status (0: accepted). */
static int parse(const char *head, http_head *h, char *buf) {
    strcpy(buf, head);
    size_t n = http_head_length(buf, strlen(buf));
    assert_int_equal(n, strlen(head));
    return http_parse_head(buf, n, h) ? h->status : 0;
}

static void test_heads(void **state) {
    (void)state;
    char buf[512];
    http_head h;
    assert_int_equal(parse("\r\nPOST /v1/models/a%2Fb?x=1+2&y=%21 HTTP/1.1\r\nHost: x\r\n"
                           "content-length:  12 \r\nX-Empty:\r\n\r\n",
                           &h, buf),
                     0);
    assert_string_equal(h.method, "POST");
    assert_string_equal(h.path, "/v1/models/a/b");
    assert_int_equal(h.has_length, 1);
    assert_int_equal(h.content_length, 12);
    assert_int_equal(h.keep_alive, 1);
    assert_string_equal(http_field_value(&h, "CONTENT-LENGTH"), "12");
    assert_string_equal(http_field_value(&h, "x-empty"), "");
    char v[16];
    assert_string_equal(http_query_value(h.query, "x", v, sizeof v), "1 2");
    assert_string_equal(http_query_value(h.query, "y", v, sizeof v), "!");
    assert_null(http_query_value(h.query, "z", v, sizeof v));
    /* the same length twice (or as a list) is one length */
    assert_int_equal(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3, 3\r\n\r\n", &h, buf),
                     0);
    assert_int_equal(h.content_length, 3);
    assert_int_equal(parse("GET http://example.com HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n", &h, buf), 0);
    assert_string_equal(h.path, "/");
    assert_int_equal(h.keep_alive, 0);
    assert_int_equal(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &h, buf), 0);
    assert_int_equal(h.keep_alive, 1);
    assert_int_equal(parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n", &h, buf), 0);
    assert_int_equal(h.chunked, 1);
    static const struct {
        const char *head;
        int status;
    } bad[] = {
        {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1 2\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
        {"GET / HTTP/1.1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\n continued\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nA\rB: c\r\n\r\n", 400},
        {"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505},
        {"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
        {"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400},
        {"GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
        {"GET x HTTP/1.1\r\nHost: x\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", 417},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = parse(bad[i].head, &h, buf);
        if (status != bad[i].status) fail_msg("case %zu: %d, expected %d", i, status, bad[i].status);
    }
    /* a bare LF never ends a head */
    assert_int_equal(http_head_length("GET / HTTP/1.1\nHost: x\n\n", 25), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_every_split),
        cmocka_unit_test(test_chunked_refusals),
        cmocka_unit_test(test_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
