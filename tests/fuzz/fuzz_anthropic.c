/* fuzz_anthropic.c: the Anthropic Messages request translation
 * (anthropic_request.c) on arbitrary bytes, as a messages and a count_tokens
 * body, the Anthropic error body and the Python-style writer on what it
 * produced; then the content-block builder (reply and stream) driven by the
 * same bytes. Must never crash or leak. */
#include "server/anthropic.h"
#include <stdint.h>
#include <stdlib.h>

static void drive_blocks(const uint8_t *data, size_t size, int stream) {
    sbuf out;
    sbuf_init(&out);
    json_t *content = json_array();
    anth_blocks b;
    anth_blocks_init(&b, stream, &out, content);
    json_t *input = json_object();
    /* each byte picks an action; the following bytes (up to 8) are its text */
    for (size_t i = 0; i < size;) {
        uint8_t op = data[i++];
        size_t n = op >> 3 < size - i ? op >> 3 : size - i;
        if (n > 8) n = 8;
        switch (op & 3) {
        case 0: anth_blocks_text(&b, ANTH_BLOCK_TEXT, (const char *)data + i, n); break;
        case 1: anth_blocks_text(&b, ANTH_BLOCK_THINKING, (const char *)data + i, n); break;
        case 2: anth_blocks_tool(&b, "toolu_f", "f", input); break;
        default: anth_blocks_close(&b); break;
        }
        i += n;
    }
    anth_blocks_close(&b);
    free(srv_json_dumps(content));
    json_decref(input);
    json_decref(content);
    anth_blocks_free(&b);
    sbuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *args = json_pack("{s:b}", "enable_thinking", 0);
    srv_defaults d = {.max_tokens = 512, .top_p = 1.0f, .chat_template_args = args};
    for (int count_only = 0; count_only < 2; count_only++) {
        srv_request r;
        anth_extra x;
        srv_error e = {0};
        if (anth_request_parse((const char *)data, size, &d, count_only, &r, &x, &e)) {
            free(srv_error_body(&e));
            continue;
        }
        free(srv_json_dumps(r.messages));
        if (r.tools) free(srv_json_dumps(r.tools));
        free(srv_json_dumps(r.template_kwargs));
        srv_request_free(&r);
        anth_extra_free(&x);
    }
    json_decref(args);
    drive_blocks(data, size, 0);
    drive_blocks(data, size, 1);
    return 0;
}
