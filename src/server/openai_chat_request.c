/* openai_chat_request.c: turns a POST body into a validated srv_request, with
 * mlx_lm.server's fields, defaults and checks (same messages as its
 * validate_model_parameters), and prepares chat messages for the template
 * (content parts joined, tool-call arguments parsed). Must not touch the model
 * or the engine: it is fuzzed on its own. */
#include "server/server.h"
#include "server/tool_choice.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* Python's bool is an int, so mlx_lm.server accepts `true` wherever it wants an
 * int. */
static int is_int(const json_t *v) { return json_is_integer(v) || json_is_boolean(v); }
static int is_num(const json_t *v) { return is_int(v) || json_is_real(v); }
static double num(const json_t *v) { return json_is_boolean(v) ? (double)json_is_true(v) : json_number_value(v); }
static long long int_of(const json_t *v) { return json_is_boolean(v) ? json_is_true(v) : json_integer_value(v); }

/* An int field: absent -> def; otherwise an int in [lo, hi] (or the one allowed
 * extra). */
static int get_int(const json_t *root, const char *name, const char *label, long long def, long long lo, long long hi,
                   long long *out, srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!is_int(v)) return BAD(e, name, "%s must be of type int", label);
    long long x = int_of(v);
    if (x < lo) return BAD(e, name, "%s must be at least %lld", label, lo);
    if (x > hi) return BAD(e, name, "%s must be at most %lld", label, hi);
    *out = x;
    return 0;
}

/* A number field; float_only mirrors the xtc fields, which reject ints
 * upstream. */
static int get_num(const json_t *root, const char *name, double def, double lo, double hi, int float_only, float *out,
                   srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (float_only ? !json_is_real(v) : !is_num(v))
        return BAD(e, name, "%s must be of type %s", name, float_only ? "float" : "('float', 'int')");
    double x = num(v);
    if (!isnan(lo) && x < lo) return BAD(e, name, "%s must be at least %g", name, lo);
    if (!isnan(hi) && x > hi) return BAD(e, name, "%s must be at most %g", name, hi);
    *out = (float)x;
    return 0;
}

static int parse_sampling(const json_t *root, const srv_defaults *d, srv_request *r, srv_error *e) {
    long long x;
    const json_t *mct = json_object_get(root, "max_completion_tokens");
    /* max_completion_tokens wins when present and not null; errors name
     * max_tokens as upstream */
    const char *mt_field = mct && !json_is_null(mct) ? "max_completion_tokens" : "max_tokens";
    if (get_int(root, mt_field, "max_tokens", d->max_tokens, 1, INT_MAX, &x, e)) return -1;
    r->max_tokens = (int)x;
    if (get_num(root, "temperature", d->temperature, 0, NAN, 0, &r->temperature, e) ||
        get_num(root, "top_p", d->top_p, 0, 1, 0, &r->top_p, e) ||
        get_num(root, "min_p", d->min_p, 0, 1, 0, &r->min_p, e) ||
        get_num(root, "repetition_penalty", 0, 0, NAN, 0, &r->repetition_penalty, e) ||
        get_num(root, "presence_penalty", 0, NAN, NAN, 0, &r->presence_penalty, e) ||
        get_num(root, "frequency_penalty", 0, NAN, NAN, 0, &r->frequency_penalty, e) ||
        get_num(root, "xtc_probability", 0, 0, 1, 1, &r->xtc_probability, e) ||
        get_num(root, "xtc_threshold", 0.1, 0, 1, 1, &r->xtc_threshold, e))
        return -1;
    if (get_int(root, "top_k", "top_k", d->top_k, 0, INT_MAX, &x, e)) return -1;
    r->top_k = (int)x;
    if (get_int(root, "num_draft_tokens", "num_draft_tokens", d->num_draft_tokens, 0, INT_MAX, &x, e)) return -1;
    r->num_draft_tokens = (int)x;
    if (get_int(root, "repetition_context_size", "repetition_context_size", 20, 0, INT_MAX, &x, e)) return -1;
    r->repetition_context_size = (int)x;
    if (get_int(root, "presence_context_size", "presence_context_size", 20, 0, INT_MAX, &x, e)) return -1;
    r->presence_context_size = (int)x;
    if (get_int(root, "frequency_context_size", "frequency_context_size", 20, 0, INT_MAX, &x, e)) return -1;
    r->frequency_context_size = (int)x;
    const json_t *v = json_object_get(root, "logprobs");
    if (v && !json_is_boolean(v)) return BAD(e, "logprobs", "logprobs must be of type bool");
    r->logprobs = json_is_true(v);
    v = json_object_get(root, "top_logprobs");
    if (v && is_int(v) && int_of(v) == -1)
        r->top_logprobs = -1;
    else if (get_int(root, "top_logprobs", "top_logprobs", -1, 0, 11, &x, e))
        return -1;
    else
        r->top_logprobs = (int)x;
    v = json_object_get(root, "seed");
    if (v && !json_is_null(v)) {
        if (!is_int(v)) return BAD(e, "seed", "seed must be of type int");
        r->has_seed = 1;
        r->seed = (uint64_t)int_of(v);
    }
    return 0;
}

/* Sets the constraint once; a second source is a 400 (they would contradict). */
static int set_constraint(srv_request *r, hearth_constraint_kind kind, const char *text, const char *field,
                          srv_error *e) {
    if (r->constraint != HEARTH_CONSTRAINT_NONE)
        return BAD(e, field, "%s: only one of response_format, grammar, regex and json_schema may constrain the output",
                   field);
    hearth_error err = {0};
    if (hearth_constraint_check(kind, text, text ? strlen(text) : 0, &err))
        return BAD(e, field, "%s: %s", field, err.message);
    if (text && !(r->constraint_text = strdup(text)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    r->constraint = kind;
    return 0;
}

static int set_schema(srv_request *r, const json_t *schema, const char *field, srv_error *e) {
    if (!json_is_object(schema) && !json_is_boolean(schema)) return BAD(e, field, "%s must be an object", field);
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = set_constraint(r, HEARTH_CONSTRAINT_JSON_SCHEMA, text, field, e);
    free(text);
    return rc;
}

/* {"type": "text" | "json_object" | "json_schema", ...}: chat/completions'
 * response_format (schema under json_schema.schema) or Responses' text.format (schema
 * beside the type). */
static int parse_format(const json_t *f, int flat, const char *field, srv_request *r, srv_error *e) {
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type) return BAD(e, field, "%s must be an object with a type", field);
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) return set_constraint(r, HEARTH_CONSTRAINT_JSON_OBJECT, NULL, field, e);
    if (strcmp(type, "json_schema"))
        return BAD(e, field, "%s.type must be 'text', 'json_object' or 'json_schema' (got '%.40s')", field, type);
    const json_t *holder = flat ? f : json_object_get(f, "json_schema");
    const json_t *schema = json_object_get(holder, "schema");
    if (!schema) return BAD(e, field, "%s: json_schema.schema is required", field);
    return set_schema(r, schema, field, e);
}

int srv_parse_constraint(const json_t *root, const json_t *format, srv_request *r, srv_error *e) {
    if (parse_format(json_object_get(root, "response_format"), 0, "response_format", r, e)) return -1;
    if (format && parse_format(format, 1, "text.format", r, e)) return -1;
    const json_t *g = json_object_get(root, "grammar"), *re = json_object_get(root, "regex");
    const json_t *js = json_object_get(root, "json_schema");
    if (g && !json_is_null(g)) {
        if (!json_is_string(g)) return BAD(e, "grammar", "grammar must be a string (GBNF)");
        if (json_string_length(g) && set_constraint(r, HEARTH_CONSTRAINT_GBNF, json_string_value(g), "grammar", e))
            return -1;
    }
    if (re && !json_is_null(re)) {
        if (!json_is_string(re)) return BAD(e, "regex", "regex must be a string");
        if (set_constraint(r, HEARTH_CONSTRAINT_REGEX, json_string_value(re), "regex", e)) return -1;
    }
    if (js && !json_is_null(js) && set_schema(r, js, "json_schema", e)) return -1;
    return 0;
}

static int parse_logit_bias(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return BAD(e, "logit_bias", "logit_bias must be of type dict");
    size_t n = json_object_size(v);
    if (!n) return 0;
    r->bias_ids = malloc(n * sizeof *r->bias_ids);
    r->bias_values = malloc(n * sizeof *r->bias_values);
    if (!r->bias_ids || !r->bias_values) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < 0 || id > INT32_MAX || !is_num(val))
            return BAD(e, "logit_bias", "logit_bias must be a dict of int to float");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias++] = (float)num(val);
    }
    return 0;
}

static int parse_stop(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v)) return 0;
        r->stop = calloc(1, sizeof *r->stop);
        if (!r->stop || !(r->stop[0] = strdup(json_string_value(v))))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        r->n_stop = 1;
        return 0;
    }
    if (!json_is_array(v)) return BAD(e, "stop", "stop must be a string or a list of strings");
    size_t n = json_array_size(v);
    if (!n) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) return BAD(e, "stop", "stop must be a string or a list of strings");
        if (!(r->stop[r->n_stop++] = strdup(json_string_value(s))))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* One message's content as the template wants it: a string. A missing or null
 * content is "" as upstream (an assistant turn that only carries tool_calls, what
 * agent loops send back); templates index message.content unconditionally. */
static int prepare_content(json_t *msg, size_t idx, srv_error *e) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c))
        return json_object_set_new(msg, "content", json_string(""))
                   ? srv_fail(e, 500, "server_error", NULL, NULL, "out of memory")
                   : 0;
    if (json_is_string(c)) return 0;
    if (!json_is_array(c))
        return BAD(e, "messages", "messages[%zu].content must be a string, null or a list of text parts", idx);
    sbuf joined;
    sbuf_init(&joined);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *part = json_array_get(c, i);
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text)) {
            sbuf_free(&joined);
            return BAD(e, "messages", "messages[%zu].content[%zu]: Only 'text' content type is supported.", idx, i);
        }
        sbuf_append(&joined, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(joined.data ? joined.data : "", joined.len);
    sbuf_free(&joined);
    if (!s) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_object_set_new(msg, "content", s);
    return 0;
}

/* Assistant tool calls carry arguments as JSON text; templates want the object.
 */
static int prepare_tool_calls(json_t *msg, size_t idx, srv_error *e) {
    json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || json_is_null(calls)) return 0;
    if (!json_is_array(calls)) return BAD(e, "messages", "messages[%zu].tool_calls must be a list", idx);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args) || !json_string_length(args)) continue;
        json_error_t je;
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je);
        if (!obj)
            return BAD(e, "messages",
                       "messages[%zu].tool_calls[%zu].function.arguments is not "
                       "valid JSON: %s",
                       idx, i, je.text);
        json_object_set_new(fn, "arguments", obj);
    }
    return 0;
}

static int parse_chat(json_t *root, srv_request *r, srv_error *e) {
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) return BAD(e, "messages", "Request did not contain messages");
    if (!json_is_array(msgs)) return BAD(e, "messages", "messages must be a list of message objects");
    if (!json_array_size(msgs)) return BAD(e, "messages", "messages must not be empty");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) return BAD(e, "messages", "messages[%zu] must be an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return BAD(e, "messages", "messages[%zu].role must be a string", i);
        if (prepare_content(m, i, e) || prepare_tool_calls(m, i, e)) return -1;
    }
    r->messages = json_incref(msgs);
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BAD(e, "tools", "tools must be a list");
        if (json_array_size(tools)) r->tools = json_incref(tools);
    }
    return 0;
}

static int parse_template_kwargs(const json_t *root, const srv_defaults *d, srv_request *r, srv_error *e) {
    r->template_kwargs = json_object();
    if (!r->template_kwargs) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (d->chat_template_args) json_object_update(r->template_kwargs, (json_t *)d->chat_template_args);
    const json_t *v = json_object_get(root, "chat_template_kwargs");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return BAD(e, "chat_template_kwargs", "chat_template_kwargs must be of type dict");
    json_object_update(r->template_kwargs, (json_t *)v); /* the request wins */
    return 0;
}

static int parse_stream(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "stream");
    if (v && !json_is_boolean(v)) return BAD(e, "stream", "stream must be of type bool");
    r->stream = json_is_true(v);
    v = json_object_get(root, "stream_options");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return BAD(e, "stream_options", "stream_options must be of type dict");
    /* upstream reads stream_options["include_usage"] and fails without it; we
     * treat it as false */
    const json_t *u = json_object_get(v, "include_usage");
    r->include_usage = u && (json_is_true(u) || (json_is_integer(u) && json_integer_value(u)));
    return 0;
}

static int parse_root(json_t *root, srv_kind kind, const srv_defaults *d, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "model");
    if (v && !json_is_string(v)) return BAD(e, "model", "requested_model must be of type str");
    if (!(r->model = strdup(v ? json_string_value(v) : "default_model")))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    v = json_object_get(root, "adapters");
    if (v && !json_is_null(v) && !json_is_string(v)) return BAD(e, "adapters", "adapter must be of type str");
    if (json_is_string(v) && !(r->adapters = strdup(json_string_value(v))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    v = json_object_get(root, "adapter");
    if (v && !json_is_null(v) && !json_is_string(v)) return BAD(e, "adapter", "adapter must be of type str");
    if (json_is_string(v) && !(r->adapter = strdup(json_string_value(v))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (parse_stream(root, r, e) || parse_sampling(root, d, r, e) || srv_parse_lab(root, d, r, e) ||
        parse_logit_bias(root, r, e) || parse_stop(root, r, e) || parse_template_kwargs(root, d, r, e) ||
        srv_parse_constraint(root, NULL, r, e))
        return -1;
    if (kind == SRV_CHAT)
        return parse_chat(root, r, e) || srv_parse_tool_choice(root, r, e) || srv_parse_parallel_tool_calls(root, r, e)
                   ? -1
                   : 0;
    v = json_object_get(root, "prompt");
    if (!v) return BAD(e, "prompt", "Request did not contain a prompt");
    if (!json_is_string(v)) return BAD(e, "prompt", "prompt must be a string");
    if (!(r->prompt = strdup(json_string_value(v))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (strlen(r->prompt) != json_string_length(v)) return BAD(e, "prompt", "prompt must not contain NUL characters");
    return 0;
}

int srv_request_parse(const char *body, size_t len, srv_kind kind, const srv_defaults *d, srv_request *r,
                      srv_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    json_error_t je;
    /* jansson rejects invalid UTF-8 and NUL bytes in strings unless told
     * otherwise */
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &je);
    if (!root)
        return BAD(e, NULL, "Invalid JSON in request body: %s: line %d column %d (char %d)", je.text, je.line,
                   je.column, je.position);
    int rc =
        json_is_object(root) ? parse_root(root, kind, d, r, e) : BAD(e, NULL, "Request should be a JSON dictionary");
    json_decref(root);
    if (rc) srv_request_free(r);
    return rc;
}

void srv_request_free(srv_request *r) {
    free(r->model);
    free(r->adapter);
    free(r->adapters);
    free(r->bias_ids);
    free(r->bias_values);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    json_decref(r->template_kwargs);
    json_decref(r->messages);
    json_decref(r->tools);
    free(r->prompt);
    free(r->constraint_text);
    free(r->forced_tool);
    memset(r, 0, sizeof *r);
}
