/* tool_choice.c: tool_choice for every API (tool_choice.h). "none" leaves the tools out
 * of the prompt; a forced call ("required", a named tool) becomes a tool-call constraint:
 * the family's call markup around {"name": <a tool>, "arguments": <valid for its
 * parameters schema>}, one call, then the end of the turn. Builds documents only; the
 * grammar module compiles them. */
#include "server/tool_choice.h"
#include <stdlib.h>
#include <string.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory")

/* The forced-call syntax of each format whose arguments are plain JSON: the opening
 * marker (a special token in some vocabularies), the text before the name, the key the
 * arguments go under, the text after them and the closing marker (NULL: none). These are
 * what the families' chat templates show the model and what toolparse.c reads back. */
static const struct {
    ts_tool_type type;
    const char *open, *lead, *key, *tail, *close;
} FORCED[] = {
    {TS_TOOL_JSON_TOOLS, "<tool_call>", "\n{\"name\": ", "arguments", "}\n", "</tool_call>"},
    {TS_TOOL_LLAMA3_JSON, "<|python_tag|>", "{\"name\": ", "parameters", "}", NULL},
    {TS_TOOL_MISTRAL, "[TOOL_CALLS]", "[{\"name\": ", "arguments", "}]", NULL},
};
#define N_FORCED (sizeof FORCED / sizeof *FORCED)

/* tools[i]'s function name, or NULL when it has none. */
static const char *tool_name(const json_t *tools, size_t i) {
    return json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
}

int srv_set_tool_choice(srv_request *r, srv_tools_mode mode, const char *name, const char *field, srv_error *e) {
    if (mode == SRV_TOOLS_AUTO) return 0;
    if (mode == SRV_TOOLS_NONE) { /* the model is not told about the tools */
        json_decref(r->tools);
        r->tools = NULL;
        return 0;
    }
    size_t n = json_array_size(r->tools);
    if (!n) return BAD(e, field, "%s: forcing a tool call needs a non-empty 'tools' list", field);
    if (mode == SRV_TOOLS_NAMED) {
        if (!name) return BAD(e, field, "%s: the tool's name is required", field);
        size_t i = 0;
        while (i < n && (!tool_name(r->tools, i) || strcmp(tool_name(r->tools, i), name))) i++;
        if (i == n) return BAD(e, field, "%s: no tool named '%.64s' in tools", field, name);
        if (!(r->forced_tool = strdup(name))) return OOM(e);
    }
    r->force_tool = 1;
    return 0;
}

int srv_parse_tool_choice(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "tool_choice");
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "auto")) return srv_set_tool_choice(r, SRV_TOOLS_AUTO, NULL, "tool_choice", e);
    if (s && !strcmp(s, "none")) return srv_set_tool_choice(r, SRV_TOOLS_NONE, NULL, "tool_choice", e);
    if (s && !strcmp(s, "required")) return srv_set_tool_choice(r, SRV_TOOLS_REQUIRED, NULL, "tool_choice", e);
    if (s)
        return BAD(e, "tool_choice", "tool_choice must be 'auto', 'none', 'required' or a function (got '%.40s')", s);
    const char *type = json_string_value(json_object_get(v, "type"));
    const char *name = json_string_value(json_object_get(json_object_get(v, "function"), "name"));
    if (!json_is_object(v) || !type || strcmp(type, "function") || !name)
        return BAD(e, "tool_choice",
                   "tool_choice: an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    return srv_set_tool_choice(r, SRV_TOOLS_NAMED, name, "tool_choice", e);
}

#define CLOSE_MAX_DEPTH 64 /* schema nesting followed; deeper objects stay as written */

/* Whether every name in s's "required" is one of its "properties". */
static int required_listed(const json_t *s) {
    const json_t *props = json_object_get(s, "properties"), *v;
    size_t i;
    json_array_foreach(json_object_get(s, "required"), i,
                       v) if (!json_object_get(props, json_string_value(v))) return 0;
    return 1;
}

/* An object schema that lists its properties and says nothing of others takes no others
 * (OpenAI's strict function calling, XGrammar's strict mode): without this a model can
 * invent keys until max_tokens. Every instance still validates against the tool's own
 * schema. Left open: allOf branches (closing each would contradict the others), objects
 * that require a property they do not list, and any with patternProperties. */
static void close_objects(json_t *s, int depth) {
    if (!json_is_object(s) || depth > CLOSE_MAX_DEPTH || json_object_get(s, "allOf")) return;
    if (json_is_object(json_object_get(s, "properties")) && !json_object_get(s, "additionalProperties") &&
        !json_object_get(s, "patternProperties") && required_listed(s))
        json_object_set_new(s, "additionalProperties", json_false());
    static const char *const maps[] = {"properties", "$defs", "definitions"};
    static const char *const lists[] = {"anyOf", "oneOf", "prefixItems", "items"};
    for (size_t k = 0; k < sizeof maps / sizeof *maps; k++) {
        const char *key;
        json_t *v;
        json_t *m = json_object_get(s, maps[k]);
        if (json_is_object(m)) json_object_foreach(m, key, v) close_objects(v, depth + 1);
    }
    for (size_t k = 0; k < sizeof lists / sizeof *lists; k++) {
        size_t i;
        json_t *v;
        json_t *l = json_object_get(s, lists[k]);
        if (json_is_array(l)) json_array_foreach(l, i, v) close_objects(v, depth + 1);
    }
    close_objects(json_object_get(s, "items"), depth + 1);
    close_objects(json_object_get(s, "additionalProperties"), depth + 1);
}

/* Appends {"text": s} / {"token": s} to seq. */
static int add_piece(json_t *seq, const char *kind, const char *s) {
    return json_array_append_new(seq, json_pack("{s:s}", kind, s));
}

/* The pieces of one call to tools[i] in format f; 0, or -1 with e filled. */
static int call_pieces(const json_t *tools, size_t i, size_t f, json_t *alts, srv_error *e) {
    const json_t *fn = json_object_get(json_array_get(tools, i), "function");
    const json_t *params = json_object_get(fn, "parameters");
    if (!tool_name(tools, i)) return BAD(e, "tools", "tools[%zu].function.name: a forced call needs a name", i);
    if (params && !json_is_null(params) && !json_is_object(params))
        return BAD(e, "tools", "tools[%zu].function.parameters must be an object (a JSON schema)", i);
    json_t *schema = json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    close_objects(schema, 0);
    char *src = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    hearth_error err = {0};
    int rc = 0;
    if (!src)
        rc = OOM(e);
    else if (hearth_constraint_check(HEARTH_CONSTRAINT_JSON_SCHEMA, src, strlen(src), &err))
        rc = BAD(e, "tools", "tools[%zu].function.parameters: %s", i, err.message);
    free(src);
    json_t *name = json_string(tool_name(tools, i));
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    size_t cap = strlen(FORCED[f].lead) + (quoted ? strlen(quoted) : 0) + strlen(FORCED[f].key) + 8;
    char *lead = malloc(cap);
    json_t *seq = json_array();
    if (!rc && (!quoted || !lead || !seq)) rc = OOM(e);
    if (!rc) {
        snprintf(lead, cap, "%s%s, \"%s\": ", FORCED[f].lead, quoted, FORCED[f].key);
        if (add_piece(seq, "token", FORCED[f].open) || add_piece(seq, "text", lead) ||
            json_array_append_new(seq, json_pack("{s:O}", "schema", schema)) ||
            add_piece(seq, "text", FORCED[f].tail) || (FORCED[f].close && add_piece(seq, "token", FORCED[f].close)) ||
            json_array_append(alts, seq))
            rc = OOM(e);
    }
    free(quoted), free(lead);
    json_decref(seq);
    json_decref(schema);
    return rc;
}

int srv_tool_constraint(const srv_request *r, const ts_config *forced, char **doc, srv_error *e) {
    *doc = NULL;
    if (r->constraint != HEARTH_CONSTRAINT_NONE)
        return BAD(e, "tool_choice",
                   "tool_choice: a forced tool call cannot be combined with response_format, grammar, regex or "
                   "json_schema");
    size_t f = 0;
    while (f < N_FORCED && FORCED[f].type != forced->tool) f++;
    if (f == N_FORCED)
        return BAD(e, "tool_choice",
                   "tool_choice: forcing a tool call is not supported for this model's tool-call format (%s) yet; "
                   "use 'auto'",
                   forced->tool_name ? forced->tool_name : "unknown");
    json_t *alts = json_array();
    if (!alts) return OOM(e);
    int rc = 0;
    for (size_t i = 0; !rc && i < json_array_size(r->tools); i++)
        if (!r->forced_tool || (tool_name(r->tools, i) && !strcmp(tool_name(r->tools, i), r->forced_tool)))
            rc = call_pieces(r->tools, i, f, alts, e);
    json_t *root = rc ? NULL : json_pack("{s:o}", "alternatives", alts);
    if (rc) json_decref(alts);
    if (!rc && !(root && (*doc = json_dumps(root, JSON_COMPACT)))) rc = OOM(e);
    json_decref(root);
    return rc;
}
