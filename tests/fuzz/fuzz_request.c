/* fuzz_request.c: the server's request parser/validator (src/server/openai_chat_request.c,
 * with the sampling lab's fields from lab_request.c)
 * on arbitrary bytes, as both a chat and a text completion body, plus the
 * error-body and Python-style JSON writers on whatever it produced. Must never
 * crash or leak. */
#include "server/server.h"
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *args = json_pack("{s:b}", "enable_thinking", 0);
    srv_defaults d = {.max_tokens = 512, .top_p = 1.0f, .num_draft_tokens = 3, .chat_template_args = args};
    for (int kind = 0; kind < 2; kind++) {
        srv_request r;
        srv_error e = {0};
        if (srv_request_parse((const char *)data, size, kind ? SRV_TEXT : SRV_CHAT, &d, &r, &e)) {
            free(srv_error_body(&e));
            continue;
        }
        if (r.messages) free(srv_json_dumps(r.messages));
        free(srv_json_dumps(r.template_kwargs));
        srv_request_free(&r);
    }
    json_decref(args);
    return 0;
}
