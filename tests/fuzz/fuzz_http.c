/* fuzz_http.c: the HTTP layer's own parsing (src/server/http_parse.c) on arbitrary
 * bytes: the head finder and parser, the chunked-body decoder fed in pieces whose
 * sizes come from the input (so every split point is tried), and query lookups. Must
 * never crash, read out of bounds, leak, or decode more than the body limit. */
#include "server/http_parse.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    /* the first byte picks the chunked decoder's piece size and body limit */
    size_t piece = (size_t)(data[0] % 17) + 1, max_body = (size_t)(data[0] >> 4) * 64;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    size_t head_len = http_head_length(in, n);
    char *copy = malloc(n + 1);
    if (!copy) return 0;
    memcpy(copy, in, n);
    copy[n] = 0;
    http_head h;
    if (head_len && !http_parse_head(copy, head_len, &h)) {
        char value[64];
        for (size_t i = 0; i < h.n_fields; i++) (void)strlen(h.fields[i].name), (void)strlen(h.fields[i].value);
        (void)http_field_value(&h, "Content-Length");
        (void)http_query_value(h.query, "model", value, sizeof value);
        (void)http_query_value(h.query, "", value, sizeof value);
    }
    /* what follows the head (or everything) as a chunked body */
    http_chunked c = {0};
    sbuf out;
    sbuf_init(&out);
    const char *body = in + head_len;
    size_t left = n - head_len;
    int done = 0, status = 0;
    const char *error = NULL;
    while (left && !done) {
        size_t k = left < piece ? left : piece;
        long used = http_chunked_feed(&c, body, k, &out, max_body, &done, &status, &error);
        if (used < 0) break;
        if ((size_t)used > k || out.len > max_body) __builtin_trap();
        body += used;
        left -= (size_t)used;
        if (!used && !done) break;
    }
    sbuf_free(&out);
    free(copy);
    return 0;
}
