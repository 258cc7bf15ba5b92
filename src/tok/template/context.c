/* context.c: prepares chat messages the way transformers' render_jinja_template does
 * before a template sees them (reasoning fields aliased under every name templates
 * read). Owns nothing else; rendering is eval.c. */
#include "tok/template.h"
#include "base/err.h"
#include <string.h>

/* Names a message's reasoning is passed under, in transformers' order of preference. */
static const char *const REASONING_FIELDS[] = {"reasoning_content", "thinking", "reasoning"};

hearth_status tpl_chat_prepare_messages(json_t *messages, hearth_error *err) {
    if (!json_is_array(messages)) return err_set(err, HEARTH_ERR_INVALID, "messages: expected a JSON array");
    for (size_t i = 0; i < json_array_size(messages); i++) {
        json_t *msg = json_array_get(messages, i);
        if (!json_is_object(msg)) continue;
        json_t *reasoning = NULL;
        for (size_t k = 0; k < 3 && !reasoning; k++) {
            json_t *v = json_object_get(msg, REASONING_FIELDS[k]);
            if (v && !json_is_null(v)) reasoning = v;
        }
        if (!reasoning) continue;
        /* {"thinking": r, **message, "reasoning_content": r}: key order matters to
         * templates that iterate or tojson a message */
        json_t *copy = json_object();
        if (!copy) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        json_object_set(copy, "thinking", reasoning);
        const char *key;
        json_t *val;
        json_object_foreach(msg, key, val) {
            json_object_set(copy, key, val);
        }
        json_object_set(copy, "reasoning_content", reasoning);
        json_array_set_new(messages, i, copy);
    }
    return HEARTH_OK;
}
