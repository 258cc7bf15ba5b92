/* http_parse.h: HTTP/1.1 request framing as RFC 9112 has it, on bytes already read:
 * the request line and header fields, the body's length (Content-Length or chunked,
 * never both), keep-alive, the chunked body decoder and the query string. No I/O and
 * no allocation besides the decoded body, so tests/fuzz/fuzz_http.c can drive every
 * byte. Strict where leniency lets two parsers disagree (request smuggling). */
#ifndef HEARTH_SERVER_HTTP_PARSE_H
#define HEARTH_SERVER_HTTP_PARSE_H
#include "base/sbuf.h"
#include <stddef.h>

/* More header fields than a client needs; beyond it 431. */
#define HTTP_MAX_FIELDS 100

typedef struct http_field {
    const char *name, *value; /* NUL-terminated, inside the parsed buffer */
} http_field;

typedef struct http_head {
    const char *method;
    const char *path;  /* the target's path, percent-decoded */
    const char *query; /* the raw query after '?' ("" when none) */
    int minor;         /* HTTP/1.<minor>: 0 or 1 */
    http_field fields[HTTP_MAX_FIELDS];
    size_t n_fields;
    int chunked;                       /* Transfer-Encoding: chunked */
    int has_length;                    /* a Content-Length field was given */
    unsigned long long content_length; /* with has_length; saturates at ULLONG_MAX */
    int keep_alive;                    /* the connection may carry another request after this one */
    int expect_continue;               /* Expect: 100-continue */
    int status;                        /* on failure: 400, 417, 431, 501 or 505 */
    const char *error;                 /* on failure: what was wrong, for the error body */
} http_head;

/* The length of the head at the start of buf (request line and fields up to and
 * including the empty line), or 0 while it is incomplete. */
size_t http_head_length(const char *buf, size_t len);

/* Parses a complete head (n bytes from http_head_length) in place: buf is modified
 * and h points into it. Returns 0, or -1 with h->status and h->error set; after a
 * failure the connection must close, since the next request's start is unknown. */
int http_parse_head(char *buf, size_t n, http_head *h);

/* The value of a header field by case-insensitive name, NULL when absent. */
const char *http_field_value(const http_head *h, const char *name);

/* Incremental chunked-body decoder (RFC 9112 section 7.1): chunk extensions and
 * trailer fields are read and dropped. */
typedef struct http_chunked {
    int state;
    unsigned long long remaining; /* data bytes left in the current chunk */
    size_t line;                  /* bytes of the current size, extension or trailer line */
    size_t trailers;              /* bytes of trailer section so far */
    int digits;
} http_chunked;

/* Decodes in[0..n) into out, keeping the whole body at most max_body bytes. Returns
 * the bytes consumed (the rest belongs to the next request once *done is set), or -1
 * with *status 400 (bad framing) or 413 (too large) and *error set. */
long http_chunked_feed(http_chunked *c, const char *in, size_t n, sbuf *out, size_t max_body, int *done, int *status,
                       const char **error);

/* The value of key in a query string ("a=1&b=x+y%21"), '+' and %XX decoded into
 * out[cap]; NULL when key is absent or the value does not fit. */
const char *http_query_value(const char *query, const char *key, char *out, size_t cap);

#endif
