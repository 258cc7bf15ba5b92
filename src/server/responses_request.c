/* responses_request.c: a Responses API body -> resp_request, and Responses
 * input items -> the chat-template messages the OpenAI path renders (message
 * parts flattened to strings, function_call -> assistant tool_calls,
 * function_call_output -> role "tool"). Must not touch the model, the engine or
 * the store: it is fuzzed on its own (tests/fuzz/fuzz_responses.c). */
#include "server/responses.h"
#include "server/tool_choice.h"
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory")

void resp_request_free(resp_request *r) {
    srv_request_free(&r->req);
    json_decref(r->input);
    free(r->instructions);
    free(r->previous_id);
    json_decref(r->tools_echo);
    json_decref(r->tool_choice);
    json_decref(r->text_format);
    json_decref(r->metadata);
    memset(r, 0, sizeof *r);
}

/* A string without NUL bytes (they would cut the C strings downstream). */
static int is_text(const json_t *v) {
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

static int is_nonempty_text(const json_t *v) { return is_text(v) && json_string_length(v) > 0; }

/* ---- items ------------------------------------------------------------------ */

/* Joins a message's content (a string or a list of text parts) into sb. A missing
 * or null content is "", as mlx_lm.server's chat endpoint takes it. */
static int join_parts(const json_t *content, const char *where, sbuf *sb, srv_error *e) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        sbuf_append(sb, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content))
        return BAD(e, "input", "%s: Input should be a string or a list of content parts", where);
    for (size_t i = 0; i < json_array_size(content); i++) {
        const json_t *p = json_array_get(content, i), *type = json_object_get(p, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio"))
            return BAD(e, "input", "%s.%zu: %s parts are not supported: the served model takes text only", where, i, t);
        const json_t *text = json_object_get(p, !strcmp(t, "refusal") ? "refusal" : "text");
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal"))
            return BAD(e, "input", "%s.%zu: Input should be an input_text or output_text part", where, i);
        if (!json_is_string(text)) return BAD(e, "input", "%s.%zu.text: Input should be a valid string", where, i);
        sbuf_append(sb, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* Checks one input item's shape; fills in "type": "message" for the short form
 * ({"role", "content"} without a type). */
static int check_item(json_t *it, size_t i, srv_error *e) {
    char where[48];
    snprintf(where, sizeof where, "input.%zu", i);
    if (!json_is_object(it)) return BAD(e, "input", "%s: Input should be a valid dictionary", where);
    const json_t *type = json_object_get(it, "type");
    if (!type && json_object_get(it, "role")) {
        if (json_object_set_new(it, "type", json_string("message"))) return OOM(e);
        type = json_object_get(it, "type");
    }
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "message")) {
        const json_t *role = json_object_get(it, "role");
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
            return BAD(e, "input", "%s.role: Input should be 'user', 'assistant', 'system' or 'developer'", where);
        sbuf sb;
        sbuf_init(&sb);
        int rc = join_parts(json_object_get(it, "content"), where, &sb, e);
        sbuf_free(&sb);
        return rc;
    }
    if (!strcmp(t, "function_call")) {
        if (!is_nonempty_text(json_object_get(it, "call_id")))
            return BAD(e, "input", "%s.call_id: Field required (a non-empty string)", where);
        if (!is_nonempty_text(json_object_get(it, "name")))
            return BAD(e, "input", "%s.name: Field required (a non-empty string)", where);
        if (!json_is_string(json_object_get(it, "arguments")))
            return BAD(e, "input", "%s.arguments: Field required (a JSON string)", where);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        if (!is_nonempty_text(json_object_get(it, "call_id")))
            return BAD(e, "input", "%s.call_id: Field required (a non-empty string)", where);
        const json_t *out = json_object_get(it, "output");
        if (!out) return BAD(e, "input", "%s.output: Field required", where);
        sbuf sb;
        sbuf_init(&sb);
        int rc = join_parts(out, where, &sb, e);
        sbuf_free(&sb);
        return rc;
    }
    if (!strcmp(t, "reasoning")) return 0; /* earlier turns' reasoning is not shown to the model again */
    return BAD(e, "input",
               "%s.type: items of type '%.40s' are not supported (message, function_call, "
               "function_call_output, reasoning)",
               where, t[0] ? t : "(missing)");
}

/* Appends {"role", "content"} to out. */
static int push(json_t *out, const char *role, const sbuf *text, srv_error *e) {
    json_t *content = json_stringn(text->data ? text->data : "", text->len);
    json_t *m = content ? json_pack("{s:s,s:o}", "role", role, "content", content) : NULL;
    if (!m || text->oom || json_array_append_new(out, m)) return OOM(e);
    return 0;
}

/* A function_call item -> a tool call on the last assistant message (a new
 * one if the last message is not the assistant's): parallel calls stay one
 * turn. */
static int add_call(json_t *out, const json_t *it, json_t *names, srv_error *e) {
    const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    const json_t *args = json_object_get(it, "arguments");
    json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
    if (!json_is_object(parsed)) { /* the model wrote something other than an object: keep its text */
        json_decref(parsed);
        parsed = json_incref((json_t *)args);
    }
    json_t *fn = json_pack("{s:O,s:o}", "name", name, "arguments", parsed);
    json_t *call = fn ? json_pack("{s:O,s:s,s:o}", "id", id, "type", "function", "function", fn) : NULL;
    if (!call) return OOM(e);
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!role || strcmp(role, "assistant")) {
        last = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
        if (!last || json_array_append_new(out, last)) {
            json_decref(call);
            return OOM(e);
        }
    }
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(last, "tool_calls", calls)) {
            json_decref(call);
            return OOM(e);
        }
    }
    if (json_array_append_new(calls, call) || json_object_set(names, json_string_value(id), (json_t *)name))
        return OOM(e);
    return 0;
}

static int add_output(json_t *out, const json_t *it, size_t i, const json_t *names, srv_error *e) {
    const json_t *id = json_object_get(it, "call_id");
    const json_t *name = json_object_get(names, json_string_value(id));
    if (!name)
        return BAD(e, "input", "input.%zu: No tool call found for function call output with call_id '%.64s'", i,
                   json_string_value(id));
    sbuf sb;
    sbuf_init(&sb);
    char where[48];
    snprintf(where, sizeof where, "input.%zu.output", i);
    int rc = join_parts(json_object_get(it, "output"), where, &sb, e);
    json_t *text = rc ? NULL : json_stringn(sb.data ? sb.data : "", sb.len);
    sbuf_free(&sb);
    if (rc) return rc;
    json_t *m =
        text ? json_pack("{s:s,s:O,s:O,s:o}", "role", "tool", "tool_call_id", id, "name", name, "content", text) : NULL;
    if (!m || json_array_append_new(out, m)) return OOM(e);
    return 0;
}

static int convert(const json_t *items, json_t *out, json_t *names, srv_error *e) {
    if (!json_is_array(items)) return BAD(e, "input", "input: Input should be a string or a list of items");
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *it = json_array_get(items, i);
        if (check_item(it, i, e)) return -1;
        const char *t = json_string_value(json_object_get(it, "type"));
        int rc = 0;
        if (!strcmp(t, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            sbuf sb;
            sbuf_init(&sb);
            rc = join_parts(json_object_get(it, "content"), "input", &sb, e);
            if (!rc) rc = push(out, !strcmp(role, "developer") ? "system" : role, &sb, e);
            sbuf_free(&sb);
        } else if (!strcmp(t, "function_call")) {
            rc = add_call(out, it, names, e);
        } else if (!strcmp(t, "function_call_output")) {
            rc = add_output(out, it, i, names, e);
        }
        if (rc) return rc;
    }
    return 0;
}

int resp_items_to_messages(const json_t *items, const char *instructions, json_t **out, srv_error *e) {
    *out = json_array();
    json_t *names = json_object(); /* call_id -> function name */
    int rc = *out && names ? 0 : OOM(e);
    if (!rc && instructions && instructions[0]) {
        sbuf sb;
        sbuf_init(&sb);
        sbuf_puts(&sb, instructions);
        rc = push(*out, "system", &sb, e);
        sbuf_free(&sb);
    }
    /* check_item may add "type" to short-form messages: work on a copy */
    json_t *copy = rc ? NULL : json_deep_copy(items);
    if (!rc && items && !copy) rc = OOM(e);
    if (!rc) rc = convert(copy, *out, names, e);
    json_decref(copy);
    json_decref(names);
    if (!rc && !json_array_size(*out)) rc = BAD(e, "input", "input: at least one item is required");
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- the body ------------------------------------------------------------------ */

static int get_number(const json_t *root, const char *name, double lo, double hi, float def, float *out, srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return BAD(e, name, "%s: Input should be a valid number", name);
    double x = json_number_value(v);
    if (x < lo || x > hi) return BAD(e, name, "%s: Input should be between %g and %g (got %g)", name, lo, hi, x);
    *out = (float)x;
    return 0;
}

static int get_bool(const json_t *root, const char *name, int def, int *out, srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return BAD(e, name, "%s: Input should be a valid boolean", name);
    *out = json_is_true(v);
    return 0;
}

static int get_string(const json_t *root, const char *name, char **out, srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v || json_is_null(v)) return 0;
    if (!is_text(v)) return BAD(e, name, "%s: Input should be a valid string", name);
    if (!(*out = strdup(json_string_value(v)))) return OOM(e);
    return 0;
}

static int parse_scalars(const json_t *root, const srv_defaults *d, resp_request *x, srv_error *e) {
    srv_request *r = &x->req;
    char *model = NULL;
    if (get_string(root, "model", &model, e)) return -1;
    if (!(r->model = model ? model : strdup("default_model"))) return OOM(e);
    const json_t *v = json_object_get(root, "max_output_tokens");
    x->has_max_output = v && !json_is_null(v);
    if (x->has_max_output && (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX))
        return BAD(e, "max_output_tokens", "max_output_tokens: Input should be an integer of at least 1");
    r->max_tokens = x->has_max_output ? (int)json_integer_value(v) : d->max_tokens;
    r->num_draft_tokens = d->num_draft_tokens;
    /* OpenAI's ranges: temperature 0..2, top_p 0..1 */
    if (get_number(root, "temperature", 0, 2, d->temperature, &r->temperature, e) ||
        get_number(root, "top_p", 0, 1, d->top_p, &r->top_p, e) || get_bool(root, "stream", 0, &r->stream, e) ||
        get_bool(root, "store", 1, &x->store, e) || get_string(root, "instructions", &x->instructions, e) ||
        get_string(root, "previous_response_id", &x->previous_id, e))
        return -1;
    if (x->previous_id && !x->previous_id[0])
        return BAD(e, "previous_response_id", "previous_response_id: Input should be a non-empty string");
    /* the OpenAI chat path's defaults for what Responses has no field for */
    r->top_k = d->top_k;
    r->min_p = d->min_p;
    r->repetition_context_size = r->presence_context_size = r->frequency_context_size = 20;
    r->xtc_threshold = 0.1f;
    r->top_logprobs = -1;
    v = json_object_get(root, "metadata");
    if (v && !json_is_null(v) && !json_is_object(v))
        return BAD(e, "metadata", "metadata: Input should be a valid dictionary");
    x->metadata = json_is_object(v) ? json_deep_copy(v) : json_object();
    if (!x->metadata || !(r->template_kwargs = json_object())) return OOM(e);
    if (d->chat_template_args) json_object_update(r->template_kwargs, (json_t *)d->chat_template_args);
    return 0;
}

static int parse_input(const json_t *root, resp_request *x, srv_error *e) {
    const json_t *v = json_object_get(root, "input");
    if (!v || json_is_null(v)) return BAD(e, "input", "input: Field required");
    if (json_is_string(v)) {
        if (!json_string_length(v)) return BAD(e, "input", "input: the input is empty");
        x->input = json_pack("[{s:s,s:s,s:O}]", "type", "message", "role", "user", "content", v);
        return x->input ? 0 : OOM(e);
    }
    if (!json_is_array(v)) return BAD(e, "input", "input: Input should be a string or a list of items");
    if (!json_array_size(v)) return BAD(e, "input", "input: the input is empty");
    if (!(x->input = json_deep_copy(v))) return OOM(e);
    for (size_t i = 0; i < json_array_size(x->input); i++)
        if (check_item(json_array_get(x->input, i), i, e)) return -1;
    return 0;
}

static int parse_tools(const json_t *root, resp_request *x, srv_error *e) {
    const json_t *tools = json_object_get(root, "tools");
    if (!(x->tools_echo = json_array())) return OOM(e);
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return BAD(e, "tools", "tools: Input should be a valid list");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *type = json_object_get(t, "type");
        const json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
        const json_t *params = json_object_get(t, "parameters"), *strict = json_object_get(t, "strict");
        if (!json_is_object(t)) return BAD(e, "tools", "tools.%zu: Input should be a valid dictionary", i);
        if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
            return BAD(e, "tools", "tools.%zu.type: only function tools are supported here", i);
        if (!is_nonempty_text(name)) return BAD(e, "tools", "tools.%zu.name: Field required (a non-empty string)", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return BAD(e, "tools", "tools.%zu.description: Input should be a valid string", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return BAD(e, "tools", "tools.%zu.parameters: Input should be a valid dictionary", i);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return BAD(e, "tools", "tools.%zu.strict: Input should be a valid boolean", i);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        if (fn && json_is_object(params)) json_object_set(fn, "parameters", (json_t *)params);
        json_t *tool = fn ? json_pack("{s:s,s:o}", "type", "function", "function", fn) : NULL;
        json_t *echo = json_pack("{s:s,s:O,s:O,s:O,s:O}", "type", "function", "name", name, "description",
                                 json_is_string(desc) ? desc : json_null(), "parameters",
                                 json_is_object(params) ? params : json_null(), "strict",
                                 json_is_boolean(strict) ? strict : json_null());
        if (!x->req.tools) x->req.tools = json_array();
        if (!tool || !echo || !x->req.tools || json_array_append_new(x->req.tools, tool) ||
            json_array_append_new(x->tools_echo, echo)) {
            json_decref(echo);
            return OOM(e);
        }
    }
    return 0;
}

static int parse_tool_choice(const json_t *root, resp_request *x, srv_error *e) {
    const json_t *v = json_object_get(root, "tool_choice");
    if (!v || json_is_null(v)) {
        x->tool_choice = json_string("auto");
        return x->tool_choice ? 0 : OOM(e);
    }
    const char *s = json_string_value(v);
    if (json_is_string(v) && strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
        return BAD(e, "tool_choice", "tool_choice: Input should be 'auto', 'none', 'required' or a function");
    if (json_is_object(v)) {
        const json_t *type = json_object_get(v, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") ||
            !is_nonempty_text(json_object_get(v, "name")))
            return BAD(e, "tool_choice", "tool_choice: an object must be {\"type\": \"function\", \"name\": ...}");
    } else if (!json_is_string(v)) {
        return BAD(e, "tool_choice", "tool_choice: Input should be a string or an object");
    }
    if (!(x->tool_choice = json_deep_copy(v))) return OOM(e);
    if (json_is_object(v))
        return srv_set_tool_choice(&x->req, SRV_TOOLS_NAMED, json_string_value(json_object_get(v, "name")),
                                   "tool_choice", e);
    return srv_set_tool_choice(&x->req,
                               !strcmp(s, "required") ? SRV_TOOLS_REQUIRED
                               : !strcmp(s, "none")   ? SRV_TOOLS_NONE
                                                      : SRV_TOOLS_AUTO,
                               NULL, "tool_choice", e);
}

int resp_request_parse(const char *body, size_t len, const srv_defaults *d, resp_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    r->req.kind = SRV_CHAT;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &je);
    int rc;
    if (!root)
        rc = BAD(e, NULL, "Invalid JSON in request body: %s: line %d column %d (char %d)", je.text, je.line, je.column,
                 je.position);
    else if (!json_is_object(root))
        rc = BAD(e, NULL, "the request body must be a JSON object");
    else
        rc = parse_scalars(root, d, r, e) || srv_parse_lab(root, d, &r->req, e) || parse_input(root, r, e) ||
                     parse_tools(root, r, e) || parse_tool_choice(root, r, e) ||
                     srv_parse_parallel_tool_calls(root, &r->req, e) ||
                     srv_parse_constraint(root, json_object_get(json_object_get(root, "text"), "format"), &r->req, e)
                 ? -1
                 : 0;
    if (!rc) {
        json_t *f = json_object_get(json_object_get(root, "text"), "format");
        if (json_is_object(f)) r->text_format = json_deep_copy(f);
    }
    json_decref(root);
    if (rc) resp_request_free(r);
    return rc;
}
