/* text.c: the text layer of the public API: tokenize, detokenize, streaming detokenize
 * and chat-template rendering over an open model. Thin: the work is in src/tok/. */
#include "api/model_internal.h"
#include "base/err.h"
#include "tok/template.h"
#include <stdlib.h>
#include <string.h>

static hearth_status need_tokenizer(const hearth_model *m, hearth_error *err) {
    if (m->tok) return HEARTH_OK;
    return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: no usable tokenizer: %s", m->entry.path,
                   m->tok_error[0] ? m->tok_error : "none found");
}

hearth_status hearth_tokenize(const hearth_model *m, const char *text, size_t len, int add_special, int32_t **ids,
                              size_t *n_ids, hearth_error *err) {
    *ids = NULL;
    *n_ids = 0;
    hearth_status st = need_tokenizer(m, err);
    return st ? st : tok_encode(m->tok, text, len, add_special, ids, n_ids, err);
}

hearth_status hearth_detokenize(const hearth_model *m, const int32_t *ids, size_t n_ids, int skip_special,
                                char **text, hearth_error *err) {
    *text = NULL;
    hearth_status st = need_tokenizer(m, err);
    if (st) return st;
    int32_t vocab = tok_vocab_size(m->tok);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return err_set(err, HEARTH_ERR_INVALID, "token id %d at position %zu is outside the vocabulary (0..%d)",
                           ids[i], i, vocab - 1);
    return tok_decode(m->tok, ids, n_ids, skip_special, text, err);
}

struct hearth_detok_stream { tok_stream *s; };

hearth_detok_stream *hearth_detok_stream_new(const hearth_model *m, int skip_special) {
    if (!m->tok) return NULL;
    hearth_detok_stream *d = calloc(1, sizeof *d);
    if (d && !(d->s = tok_stream_new(m->tok, skip_special))) { free(d); d = NULL; }
    return d;
}
const char *hearth_detok_stream_push(hearth_detok_stream *s, int32_t id) { return tok_stream_push(s->s, id); }
const char *hearth_detok_stream_finish(hearth_detok_stream *s) { return tok_stream_finish(s->s); }
void hearth_detok_stream_free(hearth_detok_stream *s) {
    if (!s) return;
    tok_stream_free(s->s);
    free(s);
}

int32_t hearth_vocab_size(const hearth_model *m) { return m->tok ? tok_vocab_size(m->tok) : 0; }
int32_t hearth_token_id(const hearth_model *m, const char *token) { return m->tok ? tok_token_id(m->tok, token) : -1; }

static hearth_status parse_json_arg(const char *what, const char *text, json_t **out, int want_array,
                                    hearth_error *err) {
    json_error_t je;
    *out = json_loads(text, JSON_DECODE_ANY, &je);
    if (!*out) return err_set(err, HEARTH_ERR_INVALID, "%s: invalid JSON at line %d: %s", what, je.line, je.text);
    if (want_array ? !json_is_array(*out) : !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return err_set(err, HEARTH_ERR_INVALID, "%s: expected a JSON %s", what, want_array ? "array" : "object");
    }
    return HEARTH_OK;
}

/* The variables transformers' apply_chat_template hands to the template: messages,
 * tools (None when absent), documents, add_generation_prompt, the special tokens, and
 * any extra keyword arguments. */
hearth_status hearth_chat_render(const hearth_model *m, const char *messages_json, const char *tools_json,
                                 int add_generation_prompt, const char *extra_json, char **out,
                                 hearth_error *err) {
    *out = NULL;
    json_t *messages = NULL, *tools = NULL, *extra = NULL;
    hearth_status st = parse_json_arg("messages", messages_json, &messages, 1, err);
    if (!st && tools_json) st = parse_json_arg("tools", tools_json, &tools, 1, err);
    if (!st && extra_json) st = parse_json_arg("template arguments", extra_json, &extra, 0, err);
    const char *tpl = m->chat_template;
    if (tools && json_array_size(tools) && m->chat_template_tool_use) tpl = m->chat_template_tool_use;
    if (!st && !tpl)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                     "%s: the model has no chat template (pass --chat-template or use --no-chat-template)",
                     m->entry.path);
    if (!st) st = tpl_chat_prepare_messages(messages, err); /* reasoning under both names, as transformers */
    if (!st) {
        json_t *ctx = json_object();
        json_object_set_new(ctx, "bos_token", json_string(m->bos_token ? m->bos_token : ""));
        json_object_set_new(ctx, "eos_token", json_string(m->eos_token ? m->eos_token : ""));
        if (extra) json_object_update(ctx, extra);
        json_object_set(ctx, "messages", messages);
        json_object_set(ctx, "tools", tools ? tools : json_null());
        if (!json_object_get(ctx, "documents")) json_object_set_new(ctx, "documents", json_null());
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
        st = tpl_render(tpl, strlen(tpl), ctx, out, err);
        json_decref(ctx);
    }
    json_decref(messages);
    json_decref(tools);
    json_decref(extra);
    return st;
}

hearth_status hearth_model_set_chat_template(hearth_model *m, const char *template_src, hearth_error *err) {
    char *copy = NULL;
    if (template_src && !(copy = strdup(template_src))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    free(m->chat_template);
    free(m->chat_template_tool_use);
    m->chat_template = copy;
    m->chat_template_tool_use = NULL;
    m->chat_template_source = copy ? "override" : NULL;
    return HEARTH_OK;
}
