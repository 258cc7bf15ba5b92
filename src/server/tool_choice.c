/* tool_choice.c: tool_choice for every API (tool_choice.h). "none" leaves the tools out
 * of the prompt; a forced call ("required", a named tool) becomes a tool-call constraint:
 * the family's call markup around the tool's name and arguments valid for its
 * parameters schema: one call, or with parallel_tool_calls one or more in the family's
 * list form, then the end of the turn. JSON-argument formats (hermes,
 * Llama 3, Mistral) put one JSON value there; qwen3_coder, pythonic and Gemma 4 write one
 * key / value per property, each value in the form that format's parser in toolparse.c
 * reads back. Builds documents only; the grammar module compiles them. */
#include "server/tool_choice.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory")

/* The forced-call syntax of each format whose arguments are plain JSON: the opening
 * marker (a special token in some vocabularies), the text before the name, the key the
 * arguments go under, the text after them and the closing marker (NULL: none); shared:
 * the markers open and close the whole list of calls (else each call), the calls written
 * between list_open and list_close, `between` apart. These are what the families' chat
 * templates show the model and what toolparse.c reads back (hermes: one <tool_call> per
 * call; Llama 3: ';'-separated objects; Mistral: a JSON list). */
static const struct {
    ts_tool_type type;
    const char *open, *lead, *key, *tail, *close;
    int shared;
    const char *list_open, *between, *list_close;
} FORCED[] = {
    {TS_TOOL_JSON_TOOLS, "<tool_call>", "\n{\"name\": ", "arguments", "}\n", "</tool_call>", 0, NULL, "\n", NULL},
    {TS_TOOL_LLAMA3_JSON, "<|python_tag|>", "{\"name\": ", "parameters", "}", NULL, 1, NULL, "; ", NULL},
    {TS_TOOL_MISTRAL, "[TOOL_CALLS]", "{\"name\": ", "arguments", "}", NULL, 1, "[", ", ", "]"},
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

/* tools[i]'s parameters schema, its objects closed (close_objects), checked to compile:
 * 0 with *out set (caller frees), or -1 with e filled. */
static int tool_schema(const json_t *tools, size_t i, json_t **out, srv_error *e) {
    const json_t *fn = json_object_get(json_array_get(tools, i), "function");
    const json_t *params = json_object_get(fn, "parameters");
    *out = NULL;
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
    if (rc)
        json_decref(schema);
    else
        *out = schema;
    return rc;
}

/* The pieces of one call to tools[i] in format f; 0, or -1 with e filled. */
static int call_pieces(const json_t *tools, size_t i, size_t f, json_t *alts, srv_error *e) {
    json_t *schema = NULL;
    int rc = tool_schema(tools, i, &schema, e);
    if (rc) return rc;
    json_t *name = json_string(tool_name(tools, i));
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    size_t cap = strlen(FORCED[f].lead) + (quoted ? strlen(quoted) : 0) + strlen(FORCED[f].key) + 8;
    char *lead = malloc(cap);
    json_t *seq = json_array();
    if (!quoted || !lead || !seq) rc = OOM(e);
    if (!rc) {
        snprintf(lead, cap, "%s%s, \"%s\": ", FORCED[f].lead, quoted, FORCED[f].key);
        int wrap = !FORCED[f].shared; /* the markers around each call */
        if ((wrap && add_piece(seq, "token", FORCED[f].open)) || add_piece(seq, "text", lead) ||
            json_array_append_new(seq, json_pack("{s:O}", "schema", schema)) ||
            add_piece(seq, "text", FORCED[f].tail) ||
            (wrap && FORCED[f].close && add_piece(seq, "token", FORCED[f].close)) || json_array_append(alts, seq))
            rc = OOM(e);
    }
    free(quoted), free(lead);
    json_decref(seq);
    json_decref(schema);
    return rc;
}

/* ---- qwen3_coder: <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n...
 * </function>\n</tool_call>. toolparse.c (after mlx-lm's parser) reads a value by its
 * property's schema type: a string is the raw text between the newlines, "null" in any
 * case is null whatever the type, an untyped value is JSON when it is an object or array
 * text and else a string, other types are JSON text. So a string value is free text that
 * cannot contain the closing tag and is not "null"; every other value is JSON valid for
 * its sub-schema. Required properties come in schema order; each optional one may be
 * written or left out; one that cannot be forced this way is left out (required: 400). */

#define QWEN_CLOSE "</parameter>"
/* a string with length bounds: code points but '<' and control characters (tab, newline,
 * carriage return allowed), the first not 'n' / 'N' (so never "null") */
#define QWEN_CH "[^<\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]"
#define QWEN_CH0 "[^<nN\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]"

/* A name the qwen3_coder parser reads back whole: no whitespace, '<' or '>'. */
static int qwen_name_ok(const char *s) {
    if (!s || !*s) return 0;
    for (; *s; s++)
        if (strchr(" \t\n\r\f\v<>", *s)) return 0;
    return 1;
}

/* Whether string v, written raw, reads back as itself (untyped: as a string). */
static int qwen_raw_ok(const json_t *v, int untyped) {
    if (!json_is_string(v)) return 0;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if ((n == 4 && !strncasecmp(s, "null", 4)) || strstr(s, QWEN_CLOSE) || memchr(s, 0, n)) return 0;
    if (untyped) {
        json_t *j = json_loadb(s, n, JSON_DECODE_ANY, NULL);
        int as_json = json_is_object(j) || json_is_array(j);
        json_decref(j);
        if (as_json) return 0;
    }
    return 1;
}

/* Property schema p of root as a document of its own (root's $defs beside it, for its
 * $refs); NULL: out of memory. */
static json_t *param_schema(const json_t *root, const json_t *p) {
    json_t *sub = json_deep_copy(p);
    if (!sub) return NULL;
    static const char *const DEFS[] = {"$defs", "definitions"};
    for (size_t d = 0; d < 2; d++)
        if (json_object_get(root, DEFS[d]) && !json_object_get(sub, DEFS[d]))
            json_object_set(sub, DEFS[d], json_object_get(root, DEFS[d]));
    return sub;
}

/* 400 unless every name in schema's "required" is one of its properties (the markups
 * that write one key=value per property write listed ones only). */
static int required_listed_or_400(const json_t *schema, size_t i, const char *format, srv_error *e) {
    size_t k;
    json_t *v;
    json_array_foreach(json_object_get(schema, "required"), k, v) {
        if (!json_object_get(json_object_get(schema, "properties"), json_string_value(v)))
            return BAD(e, "tools",
                       "tools[%zu].function.parameters: '%.64s' is required but not in properties (a forced %s "
                       "call writes listed properties only)",
                       i, json_string_value(v), format);
    }
    return 0;
}

/* How a markup whose values are not all JSON writes one: a string raw (between quote
 * tokens, or bare), never containing `without` nor being `not_word` (ASCII case
 * ignored); a length-bounded one from character classes first / rest; nested_json: object
 * and array values as JSON (else only arrays of numbers / booleans, whose JSON is the same
 * text there). */
typedef struct {
    const char *quote, *without, *not_word, *first, *rest;
    int (*raw_ok)(const json_t *v, int untyped);
    int nested_json;
} text_fmt;

/* Appends s (a piece list) to seq between f's quote tokens. */
static int quoted(const text_fmt *f, json_t *seq, json_t *s) {
    int bad = (f->quote && add_piece(seq, "token", f->quote)) || json_array_extend(seq, s) ||
              (f->quote && add_piece(seq, "token", f->quote));
    json_decref(s);
    return !bad;
}

/* A schema whose JSON is written the same in Gemma 4's call syntax: numbers, booleans,
 * null, arrays of them. */
static int plain_json(const json_t *p, int depth) {
    const char *t = json_string_value(json_object_get(p, "type"));
    if (!t || depth > 8) return 0;
    if (!strcmp(t, "integer") || !strcmp(t, "number") || !strcmp(t, "boolean") || !strcmp(t, "null")) return 1;
    return !strcmp(t, "array") && !json_object_get(p, "prefixItems") &&
           plain_json(json_object_get(p, "items"), depth + 1);
}

/* Appends to seq the pieces of a value valid for property schema p (of root, whose $defs
 * its $refs name) in format f; 0 when f cannot force one (or out of memory). */
static int text_value(const text_fmt *f, const json_t *root, const json_t *p, json_t *seq) {
    if (!json_is_object(p)) return 0;
    const json_t *type = json_object_get(p, "type"), *en = json_object_get(p, "enum");
    const json_t *cn = json_object_get(p, "const");
    const char *t = json_string_value(type);
    static const char *const COMPOSED[] = {"pattern", "format", "anyOf", "oneOf", "allOf", "not", "$ref", "if"};
    for (size_t k = 0; (!type || (t && !strcmp(t, "string"))) && k < sizeof COMPOSED / sizeof *COMPOSED; k++)
        if (json_object_get(p, COMPOSED[k]) && !en && !cn) return 0;
    if (!json_object_size(p) || (t && !strcmp(t, "string") && !en && !cn)) {
        const json_t *lo = json_object_get(p, "minLength"), *hi = json_object_get(p, "maxLength");
        if (!lo && !hi)
            return quoted(f, seq,
                          f->not_word ? json_pack("[{s:{s:s,s:[s]}}]", "raw", "without", f->without, "not", f->not_word)
                                      : json_pack("[{s:{s:s}}]", "raw", "without", f->without));
        json_int_t a = json_integer_value(lo), b = hi ? json_integer_value(hi) : -1;
        if (a < 0 || (hi && (b < a || !json_is_integer(hi))) || (lo && !json_is_integer(lo)) || a > 10000 || b > 10000)
            return 0;
        if (b == 0) return quoted(f, seq, json_pack("[{s:s}]", "text", ""));
        char re[256], rest[32];
        if (b < 0)
            snprintf(rest, sizeof rest, "{%lld,}", (long long)(a > 1 ? a - 1 : 0));
        else
            snprintf(rest, sizeof rest, "{%lld,%lld}", (long long)(a > 1 ? a - 1 : 0), (long long)b - 1);
        snprintf(re, sizeof re, "(?:%s%s%s)%s", f->first, f->rest, rest, a ? "" : "?");
        return quoted(f, seq, json_pack("[{s:s}]", "regex", re));
    }
    if (!type || (t && !strcmp(t, "string"))) { /* enum / const: the listed strings, raw */
        json_t *alts = json_array(), *v;
        size_t i;
        if (cn && f->raw_ok(cn, !type)) json_array_append_new(alts, json_pack("[{s:O}]", "text", cn));
        json_array_foreach(en, i, v) if (!cn && f->raw_ok(v, !type))
            json_array_append_new(alts, json_pack("[{s:O}]", "text", v));
        if (!json_array_size(alts)) {
            json_decref(alts);
            return 0;
        }
        return quoted(f, seq, json_pack("[{s:o}]", "choice", alts));
    }
    if (t && !strcmp(t, "null")) return !json_array_append_new(seq, json_pack("{s:s}", "text", "null"));
    static const char *const JSON_TYPES[] = {"integer", "number", "boolean", "object", "array"};
    size_t k = 0;
    while (t && k < sizeof JSON_TYPES / sizeof *JSON_TYPES && strcmp(t, JSON_TYPES[k])) k++;
    if (!t || k == sizeof JSON_TYPES / sizeof *JSON_TYPES || (!f->nested_json && !plain_json(p, 0))) return 0;
    json_t *sub = param_schema(root, p);
    return sub && !json_array_append_new(seq, json_pack("{s:o}", "schema", sub));
}

static const text_fmt QWEN = {NULL, QWEN_CLOSE, "null", QWEN_CH0, QWEN_CH, qwen_raw_ok, 1};

/* Whether name is in the schema's "required". */
static int is_required(const json_t *schema, const char *name) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(schema, "required"), i,
                       v) if (json_is_string(v) && !strcmp(json_string_value(v), name)) return 1;
    return 0;
}

/* The pieces of one qwen3_coder call to tools[i]; 0, or -1 with e filled. */
static int qwen_call(const json_t *tools, size_t i, json_t *alts, srv_error *e) {
    json_t *schema = NULL;
    if (tool_schema(tools, i, &schema, e)) return -1;
    const char *name = tool_name(tools, i);
    int rc = 0;
    json_t *seq = json_array(), *p;
    char *head = malloc(strlen(name) + 16);
    const char *key;
    if (!seq || !head)
        rc = OOM(e);
    else if (!qwen_name_ok(name))
        rc = BAD(e, "tools",
                 "tools[%zu].function.name: a forced qwen3_coder call cannot name '%.64s' (whitespace, "
                 "'<' or '>')",
                 i, name);
    if (!rc) rc = required_listed_or_400(schema, i, "qwen3_coder", e);
    if (!rc) {
        sprintf(head, "\n<function=%s>\n", name);
        add_piece(seq, "token", "<tool_call>"), add_piece(seq, "text", head);
    }
    json_object_foreach(json_object_get(schema, "properties"), key, p) {
        if (rc) break;
        int req = is_required(schema, key);
        json_t *part = json_array();
        char *open = malloc(strlen(key) + 16);
        if (!part || !open) {
            rc = OOM(e);
        } else {
            sprintf(open, "<parameter=%s>\n", key);
            add_piece(part, "text", open);
            if (qwen_name_ok(key) && text_value(&QWEN, schema, p, part)) {
                add_piece(part, "text", "\n" QWEN_CLOSE "\n");
                if (req)
                    json_array_extend(seq, part);
                else
                    json_array_append_new(seq, json_pack("{s:O}", "optional", part));
            } else if (req) {
                rc = BAD(e, "tools",
                         "tools[%zu].function.parameters.properties.%.64s: forcing a qwen3_coder call supports a "
                         "property of type string (without pattern or format), integer, number, boolean, object, "
                         "array or null, or an enum of strings",
                         i, key);
            }
        }
        free(open);
        json_decref(part);
    }
    if (!rc) {
        add_piece(seq, "text", "</function>\n"), add_piece(seq, "token", "</tool_call>");
        if (json_array_append(alts, seq)) rc = OOM(e);
    }
    free(head);
    json_decref(seq);
    json_decref(schema);
    return rc;
}

/* ---- pythonic (LFM2, Llama 3.2 / 4 style): <|tool_call_start|>[f(a=1, b="x")]<|tool_call_end|>,
 * several calls in the one list ([f(a=1), g(b=2)]).
 * toolparse.c reads the list as Python literals (JSON's true / false / null too), so each
 * value is JSON valid for its property's schema with only the string escapes Python reads
 * the same way (pyschema). Required properties first, in schema order; then each
 * optional one or nothing. */

#define KW_MAX_OPTIONAL 16 /* optional properties offered (with none required the choice is quadratic) */

/* A Python identifier (ASCII), or with dots a dotted name of them. */
static int py_name_ok(const char *s, int dots) {
    int start = 1;
    if (!s || !*s) return 0;
    for (; *s; s++) {
        int alpha = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_';
        if (dots && *s == '.' && !start)
            start = 1;
        else if (alpha || (!start && *s >= '0' && *s <= '9'))
            start = 0;
        else
            return 0;
    }
    return !start;
}

/* Appends to dst the pieces of list src (dst, src: arrays), each after an optional
 * separator text sep. */
static int extend_after(json_t *dst, const char *sep, const json_t *src) {
    return (sep && add_piece(dst, "text", sep)) || json_array_extend(dst, (json_t *)src);
}

/* A markup of keyword arguments: open token, text, name, text, key eq value [sep key eq
 * value ...], tail text, close token; shared: the tokens open and close the whole list of
 * calls (list_open call between call ... list_close), else each call. */
typedef struct {
    const char *format, *open, *before_name, *after_name, *eq, *sep, *tail, *close;
    int shared;
    const char *list_open, *between, *list_close;
    int (*name_ok)(const char *name, int dots); /* dots: the tool's name (else an argument's) */
    const char *names;                          /* what name_ok wants, for errors */
    const text_fmt *text;                       /* NULL: every value a pyschema piece */
    const char *values;                         /* the values text can force, for errors */
} kw_format;

static int pyschema_value(const json_t *root, const json_t *p, json_t *part) {
    json_t *sub = param_schema(root, p);
    return sub && !json_array_append_new(part, json_pack("{s:o}", "pyschema", sub));
}

/* The pieces of one call to tools[i] in keyword markup f; 0, or -1 with e filled. */
static int kw_call(const kw_format *f, const json_t *tools, size_t i, json_t *alts, srv_error *e) {
    json_t *schema = NULL;
    if (tool_schema(tools, i, &schema, e)) return -1;
    const char *name = tool_name(tools, i), *key;
    int rc = f->name_ok(name, 1)
                 ? required_listed_or_400(schema, i, f->format, e)
                 : BAD(e, "tools", "tools[%zu].function.name: a forced %s call cannot name '%.64s' (names: %s)", i,
                       f->format, name, f->names);
    json_t *req = json_array(), *opt = json_array(), *seq = json_array(), *p;
    if (!rc && (!req || !opt || !seq)) rc = OOM(e);
    json_object_foreach(json_object_get(schema, "properties"), key, p) {
        if (rc) break;
        int required = is_required(schema, key);
        if (!required && json_array_size(opt) == KW_MAX_OPTIONAL) continue;
        char *eq = malloc(strlen(key) + strlen(f->eq) + 1);
        json_t *part = json_array();
        if (!eq || !part) {
            rc = OOM(e);
        } else {
            sprintf(eq, "%s%s", key, f->eq);
            add_piece(part, "text", eq);
            int ok = f->name_ok(key, 0) &&
                     (f->text ? text_value(f->text, schema, p, part) : pyschema_value(schema, p, part));
            if (ok && json_array_append(required ? req : opt, part))
                rc = OOM(e);
            else if (!ok && required)
                rc = BAD(e, "tools",
                         "tools[%zu].function.parameters.properties.%.64s: a forced %s call cannot write this property "
                         "(names: %s%s%s)",
                         i, key, f->format, f->names, f->values ? "; values: " : "", f->values ? f->values : "");
        }
        free(eq);
        json_decref(part);
    }
    if (!rc) {
        size_t n_req = json_array_size(req), n_opt = json_array_size(opt), k, j;
        json_t *part, *choice = n_req || !n_opt ? NULL : json_array();
        if (!f->shared) add_piece(seq, "token", f->open);
        json_array_append_new(seq, json_pack("{s:s++}", "text", f->before_name, name, f->after_name));
        json_array_foreach(req, k, part) extend_after(seq, k ? f->sep : NULL, part);
        /* after a required one, each optional one with its separator; with none required,
         * the first one written is any of them and the later ones follow it */
        json_array_foreach(opt, k, part) {
            json_t *tail = n_req ? seq : json_array();
            if (!n_req) json_array_extend(tail, part);
            for (j = n_req ? k : k + 1; j < n_opt; j++) {
                json_t *later = json_array();
                extend_after(later, f->sep, json_array_get(opt, j));
                json_array_append_new(tail, json_pack("{s:o}", "optional", later));
                if (n_req) break;
            }
            if (!n_req) json_array_append_new(choice, tail);
        }
        if (choice) json_array_append_new(seq, json_pack("{s:[{s:o}]}", "optional", "choice", choice));
        add_piece(seq, "text", f->tail);
        if (!f->shared) add_piece(seq, "token", f->close);
        if (json_array_append(alts, seq)) rc = OOM(e);
    }
    json_decref(req), json_decref(opt), json_decref(seq);
    json_decref(schema);
    return rc;
}

static const kw_format PYTHONIC = {.format = "pythonic",
                                   .open = "<|tool_call_start|>",
                                   .before_name = "",
                                   .after_name = "(",
                                   .eq = "=",
                                   .sep = ", ",
                                   .tail = ")",
                                   .close = "<|tool_call_end|>",
                                   .shared = 1,
                                   .list_open = "[",
                                   .between = ", ",
                                   .list_close = "]",
                                   .name_ok = py_name_ok,
                                   .names = "Python identifiers, dotted for the tool"};

/* ---- Gemma 4: <|tool_call>call:f{a:1,b:<|"|>x<|"|>}<tool_call|>. toolparse.c (mlx-lm's
 * parser) takes each <|"|>...<|"|> as a string whatever it holds, quotes the bare keys
 * that follow '{' or ',' and reads the rest as JSON: strings are free text without the
 * delimiter, numbers, booleans, null and arrays of them are JSON (the same text); nested
 * objects and strings inside arrays (bare keys, no spacing) are not forced yet. Several
 * calls follow one another, each in its own markers. */

#define GEMMA4_QUOTE "<|\"|>"

/* The parser's \w+ (ASCII): a key; with dots, a tool name ([\w-]+). */
static int gemma4_name_ok(const char *s, int dots) {
    if (!s || !*s) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              (dots && *s == '-')))
            return 0;
    return 1;
}

static int gemma4_raw_ok(const json_t *v, int untyped) {
    (void)untyped;
    return json_is_string(v) && !strstr(json_string_value(v), GEMMA4_QUOTE) &&
           !memchr(json_string_value(v), 0, json_string_length(v));
}

static const text_fmt GEMMA4_TEXT = {GEMMA4_QUOTE, GEMMA4_QUOTE, NULL, QWEN_CH, QWEN_CH, gemma4_raw_ok, 0};
static const kw_format GEMMA4 = {
    .format = "gemma4",
    .open = "<|tool_call>",
    .before_name = "call:",
    .after_name = "{",
    .eq = ":",
    .sep = ",",
    .tail = "}",
    .close = "<tool_call|>",
    .name_ok = gemma4_name_ok,
    .names = "ASCII letters, digits and '_', '-' too for the tool",
    .text = &GEMMA4_TEXT,
    .values = "a string (without pattern or format), an enum of strings, integer, number, boolean, null or an "
              "array of those but strings"};

int srv_tool_constraint(const srv_request *r, const ts_config *forced, char **doc, srv_error *e) {
    *doc = NULL;
    if (r->constraint != HEARTH_CONSTRAINT_NONE)
        return BAD(e, "tool_choice",
                   "tool_choice: a forced tool call cannot be combined with response_format, grammar, regex or "
                   "json_schema");
    size_t f = 0;
    while (f < N_FORCED && FORCED[f].type != forced->tool) f++;
    int qwen = forced->tool == TS_TOOL_QWEN3_CODER;
    const kw_format *kw = forced->tool == TS_TOOL_PYTHONIC ? &PYTHONIC
                          : forced->tool == TS_TOOL_GEMMA4 ? &GEMMA4
                                                           : NULL;
    if (f == N_FORCED && !qwen && !kw)
        return BAD(e, "tool_choice",
                   "tool_choice: forcing a tool call is not supported for this model's tool-call format (%s) yet; "
                   "use 'auto'",
                   forced->tool_name ? forced->tool_name : "unknown");
    json_t *alts = json_array();
    if (!alts) return OOM(e);
    int rc = 0;
    for (size_t i = 0; !rc && i < json_array_size(r->tools); i++)
        if (!r->forced_tool || (tool_name(r->tools, i) && !strcmp(tool_name(r->tools, i), r->forced_tool)))
            rc = qwen ? qwen_call(r->tools, i, alts, e)
                 : kw ? kw_call(kw, r->tools, i, alts, e)
                      : call_pieces(r->tools, i, f, alts, e);
    /* the list around the calls: markers once for the formats that share them, and what
     * comes between two calls when parallel calls are allowed */
    int shared = kw ? kw->shared : f < N_FORCED && FORCED[f].shared;
    const char *open = kw ? kw->open : f < N_FORCED ? FORCED[f].open : NULL;
    const char *close = kw ? kw->close : f < N_FORCED ? FORCED[f].close : NULL;
    const char *list_open = kw ? kw->list_open : f < N_FORCED ? FORCED[f].list_open : NULL;
    const char *list_close = kw ? kw->list_close : f < N_FORCED ? FORCED[f].list_close : NULL;
    const char *between = qwen ? "\n" : kw ? kw->between : FORCED[f].between;
    json_t *root = rc ? NULL : json_pack("{s:o,s:b}", "alternatives", alts, "parallel", !r->single_tool_call);
    if (rc) json_decref(alts);
    json_t *before = json_array(), *after = json_array(), *sep = json_array();
    if (root && before && after && sep) {
        if (shared && open) add_piece(before, "token", open);
        if (shared && list_open) add_piece(before, "text", list_open);
        if (shared && list_close) add_piece(after, "text", list_close);
        if (shared && close) add_piece(after, "token", close);
        if (between) add_piece(sep, "text", between);
        /* calls each in their own markers, parallel: the separator may also end the list (a
         * model that writes a newline after a call may still end its turn there) */
        if (!shared && between && !r->single_tool_call)
            json_array_append_new(after, json_pack("{s:[{s:s}]}", "optional", "text", between));
        if (json_array_size(before)) json_object_set(root, "before", before);
        if (json_array_size(after)) json_object_set(root, "after", after);
        if (json_array_size(sep)) json_object_set(root, "between", sep);
    }
    json_decref(before), json_decref(after), json_decref(sep);
    if (!rc && !(root && (*doc = json_dumps(root, JSON_COMPACT)))) rc = OOM(e);
    json_decref(root);
    return rc;
}

int srv_parse_parallel_tool_calls(const json_t *root, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(root, "parallel_tool_calls");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return BAD(e, "parallel_tool_calls", "parallel_tool_calls must be a boolean (true or false)");
    r->single_tool_call = json_is_false(v);
    return 0;
}
