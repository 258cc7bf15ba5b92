/* template.h: a Jinja subset interpreter for chat templates, rendering exactly as
 * Python jinja2 does under transformers' apply_chat_template settings
 * (trim_blocks, lstrip_blocks, tojson, raise_exception, strftime_now). */
#ifndef HEARTH_TOK_TEMPLATE_H
#define HEARTH_TOK_TEMPLATE_H
#include "hearth.h"
#include <jansson.h>

/* Renders template source src with the variables of the JSON object context.
 * Errors name the template line and the construct. */
hearth_status tpl_render(const char *src, size_t len, const json_t *context, char **out, hearth_error *err);
/* As tpl_render, and also reports the output length (the text may contain NUL bytes
 * when the context does). out_len may be NULL. */
hearth_status tpl_render_len(const char *src, size_t len, const json_t *context, char **out, size_t *out_len,
                             hearth_error *err);
/* Rewrites chat messages in place as transformers does before rendering: a message
 * with reasoning under reasoning_content, thinking or reasoning gets it under
 * "thinking" (first key) and "reasoning_content" too. Call on the messages array
 * before putting it in the render context. */
hearth_status tpl_chat_prepare_messages(json_t *messages, hearth_error *err);
#endif
