/* model_serve.c: read-only accessors the HTTP server needs beyond the CLI's:
 * the chat template text, tokenizer_config keys and raw vocab pieces. Must not
 * change a model. */
#include "api/model_internal.h"
#include <string.h>

const char *hearth_model_chat_template(const hearth_model *m) { return m ? m->chat_template : NULL; }

const char *hearth_model_tokenizer_config_string(const hearth_model *m, const char *key) {
    const json_t *v = m && m->tokenizer_config ? json_object_get(m->tokenizer_config, key) : NULL;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

const char *hearth_token_piece(const hearth_model *m, int32_t id) {
    return m && m->tok ? tok_token_str(m->tok, id) : NULL;
}
