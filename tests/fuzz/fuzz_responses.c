/* fuzz_responses.c: the OpenAI Responses request parse (responses_request.c)
 * on arbitrary bytes, then the item translation of what it accepted (with and
 * without instructions), the error body, and a round trip of the accepted
 * input through a tiny response store (responses_store.c). Must never crash or
 * leak. */
#include "server/responses.h"
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *args = json_pack("{s:b}", "enable_thinking", 0);
    srv_defaults d = {.max_tokens = 512, .top_p = 1.0f, .chat_template_args = args};
    resp_request r;
    srv_error e = {0};
    if (resp_request_parse((const char *)data, size, &d, &r, &e) == 0) {
        json_t *msgs = NULL;
        srv_error e2 = {0};
        if (resp_items_to_messages(r.input, r.instructions, &msgs, &e2) == 0)
            free(srv_json_dumps(msgs));
        else
            free(srv_error_body(&e2));
        json_decref(msgs);
        /* stored conversations come back through the same translation */
        resp_store *st = resp_store_new(60, 4096);
        if (st && resp_store_put(st, "resp_f", r.tools_echo, r.input) == 0) {
            json_t *items = resp_store_items(st, "resp_f");
            msgs = NULL;
            if (items && resp_items_to_messages(items, NULL, &msgs, &e2) == 0) json_decref(msgs);
            json_decref(items);
            free(resp_store_response(st, "resp_f"));
            resp_store_delete(st, "resp_f");
        }
        resp_store_free(st);
        resp_request_free(&r);
    } else {
        free(srv_error_body(&e));
    }
    json_decref(args);
    return 0;
}
