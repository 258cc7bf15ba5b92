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
#endif
