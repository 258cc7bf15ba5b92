/* anthropic_request.c: turns an Anthropic Messages (or count_tokens) body into
 * the srv_request the OpenAI path generates from: system and text blocks become
 * template messages, tool_use blocks assistant tool_calls, tool_result blocks
 * role "tool" messages, tools OpenAI function tools; plus the Anthropic error
 * body. Must not touch the model or the engine: it is fuzzed on its own. */
#include "server/anthropic.h"
#include "server/tool_choice.h"
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) srv_fail(e, 500, "api_error", NULL, NULL, "out of memory")

const char *anth_error_type(int http_status) {
    switch (http_status) { /* Anthropic's documented status -> type table */
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return http_status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *anth_error_body(const srv_error *e) {
    json_t *inner = json_object();
    json_object_set_new(inner, "type", json_string(anth_error_type(e->http_status)));
    /* a message may quote user bytes cut mid-character: keep the key regardless
     */
    json_t *msg = json_string(e->message);
    json_object_set_new(inner, "message", msg ? msg : json_string("invalid request"));
    json_t *root = json_object();
    json_object_set_new(root, "type", json_string("error"));
    json_object_set_new(root, "error", inner);
    char *s = srv_json_dumps(root);
    json_decref(root);
    return s;
}

void anth_extra_free(anth_extra *x) { memset(x, 0, sizeof *x); }

/* A number in [lo, hi]; booleans are not numbers here (Anthropic validates
 * strictly). */
static int get_unit(const json_t *root, const char *name, float def, float *out, srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return BAD(e, name, "%s: Input should be a valid number", name);
    double x = json_number_value(v);
    if (x < 0 || x > 1) return BAD(e, name, "%s: Input should be between 0 and 1 (got %g)", name, x);
    *out = (float)x;
    return 0;
}

static int parse_sampling(const json_t *root, const srv_defaults *d, int count_only, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "max_tokens");
    if (!v && !count_only) return BAD(e, "max_tokens", "max_tokens: Field required");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX))
        return BAD(e, "max_tokens", "max_tokens: Input should be an integer of at least 1");
    r->max_tokens = v ? (int)json_integer_value(v) : d->max_tokens;
    r->num_draft_tokens = d->num_draft_tokens;
    if (get_unit(root, "temperature", d->temperature, &r->temperature, e) ||
        get_unit(root, "top_p", d->top_p, &r->top_p, e))
        return -1;
    v = json_object_get(root, "top_k");
    if (v && !json_is_null(v) &&
        (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX))
        return BAD(e, "top_k", "top_k: Input should be a non-negative integer");
    r->top_k = v && json_is_integer(v) ? (int)json_integer_value(v) : d->top_k;
    /* the OpenAI path's defaults for what Anthropic has no field for */
    r->min_p = d->min_p;
    r->repetition_context_size = r->presence_context_size = r->frequency_context_size = 20;
    r->xtc_threshold = 0.1f;
    r->top_logprobs = -1;
    return 0;
}

static int parse_stop_sequences(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "stop_sequences");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return BAD(e, "stop_sequences", "stop_sequences: Input should be a valid list");
    size_t n = json_array_size(v);
    if (!n) return 0;
    if (!(r->stop = calloc(n, sizeof *r->stop))) return OOM(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || !json_string_length(s) || strlen(json_string_value(s)) != json_string_length(s))
            return BAD(e, "stop_sequences", "stop_sequences.%zu: Input should be a non-empty string", i);
        if (!(r->stop[r->n_stop++] = strdup(json_string_value(s)))) return OOM(e);
    }
    return 0;
}

/* Joins the text blocks of a system prompt or a tool_result's content into sb.
 * Accepts a string, or a list of {"type": "text", "text"} blocks. */
static int join_text(const json_t *v, const char *where, sbuf *sb, srv_error *e) {
    if (json_is_string(v)) {
        sbuf_append(sb, json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return BAD(e, where, "%s: Input should be a string or a list of text blocks", where);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *b = json_array_get(v, i), *type = json_object_get(b, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (!strcmp(t, "image") || !strcmp(t, "document"))
            return BAD(e, where,
                       "%s.%zu: %s blocks are not supported: the served model has no "
                       "vision input",
                       where, i, t);
        const json_t *text = json_object_get(b, "text");
        if (strcmp(t, "text") || !json_is_string(text))
            return BAD(e, where,
                       "%s.%zu: Input should be a text block ({\"type\": \"text\", "
                       "\"text\": ...})",
                       where, i);
        sbuf_append(sb, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* Appends {"role", "content": sb} (and tool_calls) to out. */
static int push_message(json_t *out, const char *role, sbuf *sb, json_t *tool_calls, srv_error *e) {
    json_t *content = json_stringn(sb->data ? sb->data : "", sb->len);
    json_t *m = json_object();
    if (!content || !m || sb->oom) {
        json_decref(content);
        json_decref(m);
        return OOM(e);
    }
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", content);
    if (tool_calls && json_array_size(tool_calls)) json_object_set(m, "tool_calls", tool_calls);
    json_array_append_new(out, m);
    return 0;
}

/* An assistant tool_use block -> an OpenAI tool_calls item; its id -> name goes
 * into ids so the next user turn's tool_result can be matched. */
static int convert_tool_use(const json_t *b, const char *where, json_t *calls, json_t *ids, srv_error *e) {
    const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
                 *input = json_object_get(b, "input");
    if (!json_is_string(id) || !json_string_length(id)) return BAD(e, where, "%s.id: Field required (a string)", where);
    if (!json_is_string(name) || !json_string_length(name))
        return BAD(e, where, "%s.name: Field required (a string)", where);
    if (!json_is_object(input)) return BAD(e, where, "%s.input: Input should be a valid dictionary", where);
    json_t *fn = json_pack("{s:O,s:O}", "name", name, "arguments", input);
    json_t *call = fn ? json_pack("{s:O,s:s,s:o}", "id", id, "type", "function", "function", fn) : NULL;
    if (!call) return OOM(e);
    json_array_append_new(calls, call);
    json_object_set(ids, json_string_value(id), (json_t *)name);
    return 0;
}

/* A user tool_result block -> {"role": "tool", "tool_call_id", "name",
 * "content"}; the id must name a tool_use of the assistant turn just before. */
static int convert_tool_result(const json_t *b, const char *where, const json_t *prev_ids, json_t *out, srv_error *e) {
    const json_t *id = json_object_get(b, "tool_use_id"), *content = json_object_get(b, "content");
    if (!json_is_string(id)) return BAD(e, where, "%s.tool_use_id: Field required (a string)", where);
    const json_t *name = json_object_get(prev_ids, json_string_value(id));
    if (!name)
        return BAD(e, where,
                   "%s: tool_result block(s) provided when previous message does "
                   "not have a matching tool_use "
                   "block (tool_use_id '%.64s')",
                   where, json_string_value(id));
    sbuf sb;
    sbuf_init(&sb);
    if (content && !json_is_null(content) && join_text(content, where, &sb, e)) {
        sbuf_free(&sb);
        return -1;
    }
    json_t *text = json_stringn(sb.data ? sb.data : "", sb.len);
    sbuf_free(&sb);
    json_t *m =
        text ? json_pack("{s:s,s:O,s:O,s:o}", "role", "tool", "tool_call_id", id, "name", name, "content", text) : NULL;
    if (!m) return OOM(e);
    json_array_append_new(out, m);
    return 0;
}

/* One Anthropic message -> zero or more template messages. prev_ids: the
 * tool_use ids (-> names) of the previous assistant turn; refilled for an
 * assistant turn. */
static int convert_message(const json_t *m, size_t idx, json_t *out, json_t *prev_ids, srv_error *e) {
    char where[64];
    snprintf(where, sizeof where, "messages.%zu", idx);
    if (!json_is_object(m)) return BAD(e, "messages", "%s: Input should be a valid dictionary", where);
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    const char *r = json_is_string(role) ? json_string_value(role) : "";
    int assistant = !strcmp(r, "assistant");
    if (!assistant && strcmp(r, "user"))
        return BAD(e, "messages", "%s.role: Input should be 'user' or 'assistant'", where);
    sbuf text;
    sbuf_init(&text);
    /* a missing or null content is "", as mlx_lm.server's chat endpoint takes it */
    if (!content || json_is_null(content) || json_is_string(content)) {
        if (json_is_string(content)) sbuf_append(&text, json_string_value(content), json_string_length(content));
        int rc = push_message(out, r, &text, NULL, e);
        sbuf_free(&text);
        if (assistant) json_object_clear(prev_ids);
        return rc;
    }
    if (!json_is_array(content))
        return BAD(e, "messages", "%s.content: Input should be a string or a list of content blocks", where);
    json_t *calls = json_array(), *ids = json_object();
    int rc = calls && ids ? 0 : OOM(e), n_text = 0, n_results = 0;
    for (size_t i = 0; !rc && i < json_array_size(content); i++) {
        const json_t *b = json_array_get(content, i), *type = json_object_get(b, "type");
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content.%zu", where, i);
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (!json_is_object(b) || !t[0]) {
            rc = BAD(e, "messages", "%s: Input should be a content block with a \"type\"", bw);
        } else if (!strcmp(t, "text")) {
            const json_t *s = json_object_get(b, "text");
            if (!json_is_string(s))
                rc = BAD(e, "messages", "%s.text: Input should be a valid string", bw);
            else
                sbuf_append(&text, json_string_value(s), json_string_length(s)), n_text++;
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            rc = BAD(e, "messages",
                     "%s: %s blocks are not supported: the served model has no "
                     "vision input",
                     bw, t);
        } else if (!strcmp(t, "tool_use") && assistant) {
            rc = convert_tool_use(b, bw, calls, ids, e);
        } else if (!strcmp(t, "tool_result") && !assistant) {
            rc = convert_tool_result(b, bw, prev_ids, out, e);
            n_results++;
        } else if ((!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) && assistant) {
            /* earlier turns' thinking is not shown to the model again */
        } else {
            rc = BAD(e, "messages", "%s: blocks of type '%.40s' are not accepted in %s messages", bw, t, r);
        }
    }
    /* a user turn of only tool results is complete as its tool messages */
    if (!rc && (assistant || n_text || !n_results)) rc = push_message(out, r, &text, calls, e);
    if (!rc && assistant) {
        json_object_clear(prev_ids);
        json_object_update(prev_ids, ids);
    }
    json_decref(calls);
    json_decref(ids);
    sbuf_free(&text);
    return rc;
}

static int parse_messages(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *msgs = json_object_get(root, "messages"), *system = json_object_get(root, "system");
    if (!msgs) return BAD(e, "messages", "messages: Field required");
    if (!json_is_array(msgs)) return BAD(e, "messages", "messages: Input should be a valid list");
    if (!json_array_size(msgs)) return BAD(e, "messages", "messages: at least one message is required");
    json_t *out = json_array(), *prev_ids = json_object();
    r->messages = out;
    int rc = out && prev_ids ? 0 : OOM(e);
    if (!rc && system && !json_is_null(system)) {
        sbuf sb;
        sbuf_init(&sb);
        rc = join_text(system, "system", &sb, e);
        if (!rc && sb.len) rc = push_message(out, "system", &sb, NULL, e);
        sbuf_free(&sb);
    }
    for (size_t i = 0; !rc && i < json_array_size(msgs); i++)
        rc = convert_message(json_array_get(msgs, i), i, out, prev_ids, e);
    json_decref(prev_ids);
    if (rc) return rc;
    /* the template would open a new assistant turn after it instead of continuing
     * it */
    const char *last = json_string_value(json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "role"));
    if (last && !strcmp(last, "assistant"))
        return BAD(e, "messages",
                   "messages: a final assistant message (prefill) is not "
                   "supported; end with a user message");
    return 0;
}

static int parse_tools(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *tools = json_object_get(root, "tools");
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return BAD(e, "tools", "tools: Input should be a valid list");
    if (!json_array_size(tools)) return 0;
    if (!(r->tools = json_array())) return OOM(e);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name");
        const json_t *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
        if (!json_is_object(t)) return BAD(e, "tools", "tools.%zu: Input should be a valid dictionary", i);
        if (type && !json_is_null(type) && !(json_is_string(type) && !strcmp(json_string_value(type), "custom")))
            return BAD(e, "tools", "tools.%zu.type: only client tools (\"custom\") are supported here", i);
        if (!json_is_string(name) || !json_string_length(name))
            return BAD(e, "tools", "tools.%zu.name: Field required (a non-empty string)", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return BAD(e, "tools", "tools.%zu.description: Input should be a valid string", i);
        if (!json_is_object(schema)) return BAD(e, "tools", "tools.%zu.input_schema: Field required (an object)", i);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        if (fn) json_object_set(fn, "parameters", (json_t *)schema);
        json_t *tool = fn ? json_pack("{s:s,s:o}", "type", "function", "function", fn) : NULL;
        if (!tool) return OOM(e);
        json_array_append_new(r->tools, tool);
    }
    return 0;
}

static int parse_tool_choice(const json_t *root, srv_request *r, anth_extra *x, srv_error *e) {
    const json_t *v = json_object_get(root, "tool_choice");
    if (!v || json_is_null(v)) return 0;
    const json_t *type = json_object_get(v, "type"), *name = json_object_get(v, "name");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!json_is_object(v)) return BAD(e, "tool_choice", "tool_choice: Input should be a valid dictionary");
    const json_t *dp = json_object_get(v, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp))
        return BAD(e, "tool_choice",
                   "tool_choice.disable_parallel_tool_use: Input should be a valid "
                   "boolean");
    r->single_tool_call = json_is_true(dp);
    if (!strcmp(t, "auto"))
        x->tool_choice = ANTH_TOOL_CHOICE_AUTO;
    else if (!strcmp(t, "any"))
        x->tool_choice = ANTH_TOOL_CHOICE_ANY;
    else if (!strcmp(t, "none"))
        x->tool_choice = ANTH_TOOL_CHOICE_NONE;
    else if (!strcmp(t, "tool")) {
        if (!json_is_string(name)) return BAD(e, "tool_choice", "tool_choice.name: Field required");
        x->tool_choice = ANTH_TOOL_CHOICE_TOOL;
    } else
        return BAD(e, "tool_choice", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
    static const srv_tools_mode MODE[] = {[ANTH_TOOL_CHOICE_AUTO] = SRV_TOOLS_AUTO,
                                          [ANTH_TOOL_CHOICE_ANY] = SRV_TOOLS_REQUIRED,
                                          [ANTH_TOOL_CHOICE_TOOL] = SRV_TOOLS_NAMED,
                                          [ANTH_TOOL_CHOICE_NONE] = SRV_TOOLS_NONE};
    return srv_set_tool_choice(r, MODE[x->tool_choice], json_string_value(name), "tool_choice", e);
}

/* metadata, thinking, stream, model: the scalar fields. */
static int parse_misc(const json_t *root, const srv_defaults *d, srv_request *r, anth_extra *x, srv_error *e) {
    const json_t *v = json_object_get(root, "model");
    if (!v) return BAD(e, "model", "model: Field required");
    if (!json_is_string(v)) return BAD(e, "model", "model: Input should be a valid string");
    if (!(r->model = strdup(json_string_value(v)))) return OOM(e);
    v = json_object_get(root, "stream");
    if (v && !json_is_null(v) && !json_is_boolean(v))
        return BAD(e, "stream", "stream: Input should be a valid boolean");
    r->stream = json_is_true(v);
    v = json_object_get(root, "metadata");
    if (v && !json_is_null(v)) {
        const json_t *uid = json_object_get(v, "user_id");
        if (!json_is_object(v)) return BAD(e, "metadata", "metadata: Input should be a valid dictionary");
        if (uid && !json_is_null(uid) && !json_is_string(uid))
            return BAD(e, "metadata", "metadata.user_id: Input should be a valid string");
    }
    if (!(r->template_kwargs = json_object())) return OOM(e);
    if (d->chat_template_args) json_object_update(r->template_kwargs, (json_t *)d->chat_template_args);
    v = json_object_get(root, "thinking");
    if (v && !json_is_null(v)) {
        const json_t *type = json_object_get(v, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (!json_is_object(v) || (strcmp(t, "enabled") && strcmp(t, "disabled")))
            return BAD(e, "thinking", "thinking.type: Input should be 'enabled' or 'disabled'");
        x->thinking = !strcmp(t, "enabled");
        /* templates with a thinking switch (Qwen3) read this variable */
        json_object_set_new(r->template_kwargs, "enable_thinking", json_boolean(x->thinking));
    }
    return 0;
}

/* llama-server's constraint fields (grammar, regex, json_schema), as on the OpenAI
 * endpoints; Anthropic's API has no response_format. */
static int parse_constraint(const json_t *root, srv_request *r, srv_error *e) {
    static const char *const FIELDS[] = {"grammar", "regex", "json_schema"};
    json_t *only = json_object();
    if (!only) return OOM(e);
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        json_t *v = json_object_get(root, FIELDS[i]);
        if (v) json_object_set(only, FIELDS[i], v);
    }
    int rc = srv_parse_constraint(only, NULL, r, e);
    json_decref(only);
    return rc;
}

static int parse_root(const json_t *root, const srv_defaults *d, int count_only, srv_request *r, anth_extra *x,
                      srv_error *e) {
    if (!json_is_object(root)) return BAD(e, NULL, "the request body must be a JSON object");
    if (parse_misc(root, d, r, x, e) || parse_sampling(root, d, count_only, r, e) || srv_parse_lab(root, d, r, e) ||
        parse_stop_sequences(root, r, e) || parse_messages(root, r, e) || parse_tools(root, r, e) ||
        parse_tool_choice(root, r, x, e) || parse_constraint(root, r, e))
        return -1;
    return 0;
}

int anth_request_parse(const char *body, size_t len, const srv_defaults *d, int count_only, srv_request *r,
                       anth_extra *x, srv_error *e) {
    memset(r, 0, sizeof *r);
    memset(x, 0, sizeof *x);
    r->kind = SRV_CHAT;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &je);
    int rc = root ? parse_root(root, d, count_only, r, x, e)
                  : BAD(e, NULL, "Invalid JSON in request body: %s: line %d column %d (char %d)", je.text, je.line,
                        je.column, je.position);
    json_decref(root);
    if (rc) {
        e->anthropic = 1;
        srv_request_free(r);
        anth_extra_free(x);
    }
    return rc;
}
