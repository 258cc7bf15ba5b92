/* toolparse_typed.c: MiniCPM5's tool calls, `<function name="f"><param name="p">v</param>
 * </function>`, as mlx-lm 0.32.2's tool_parsers/minicpm5.py reads them: values in CDATA
 * kept verbatim, others stripped, then typed by the request's JSON Schema for that
 * parameter the way minimax_m2's _convert_param_value_with_types does (integer > number >
 * boolean > object/array > string, from "type", "enum", anyOf/oneOf/allOf). No HTTP. */
#include "server/toolparse_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "server/pylit.h"

enum { T_STR = 1, T_INT = 2, T_NUM = 4, T_BOOL = 8, T_OBJ = 16, T_NULL = 32 };

/* One type name, lowercased as upstream does before matching its priority list. */
static int type_bit(const char *t) {
    static const struct {
        const char *name;
        int bit;
    } names[] = {{"integer", T_INT},  {"int", T_INT},   {"number", T_NUM}, {"float", T_NUM},
                 {"boolean", T_BOOL}, {"bool", T_BOOL}, {"object", T_OBJ}, {"array", T_OBJ},
                 {"string", T_STR},   {"str", T_STR},   {"text", T_STR},   {"null", T_NULL}};
    char low[16];
    size_t n = strlen(t);
    if (n >= sizeof low) return 0;
    for (size_t i = 0; i <= n; i++) low[i] = (char)(t[i] >= 'A' && t[i] <= 'Z' ? t[i] | 0x20 : t[i]);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(low, names[i].name)) return names[i].bit;
    return 0; /* a type upstream lists but never converts to (it still counts as one found) */
}

/* _extract_types_from_schema: a bit set; 0 would mean none found (upstream: string). */
static int schema_types(const json_t *schema) {
    if (!json_is_object(schema)) return T_STR;
    int bits = 0, found = 0;
    const json_t *type = json_object_get(schema, "type"), *v;
    size_t i;
    if (json_is_string(type)) found = 1, bits |= type_bit(json_string_value(type));
    json_array_foreach(json_is_array(type) ? type : NULL, i, v) {
        if (json_is_string(v)) found = 1, bits |= type_bit(json_string_value(v));
    }
    json_array_foreach(json_object_get(schema, "enum"), i, v) {
        found = 1;
        bits |= json_is_null(v)      ? T_NULL
                : json_is_boolean(v) ? T_BOOL
                : json_is_integer(v) ? T_INT
                : json_is_real(v)    ? T_NUM
                : json_is_string(v)  ? T_STR
                                     : T_OBJ;
    }
    static const char *const choices[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++) {
        json_array_foreach(json_object_get(schema, choices[c]), i, v) {
            found = 1;
            bits |= schema_types(v);
        }
    }
    return found ? bits : T_STR;
}

/* Python's str.strip() for the whitespace a model writes (ASCII, the separators
 * U+001C..U+001F, NEL and NBSP as their UTF-8 bytes are not stripped: rare in values). */
static void strip(const char **s, size_t *n) {
    while (*n && ((**s >= '\t' && **s <= '\r') || **s == ' ' || (**s >= 0x1c && **s <= 0x1f))) (*s)++, (*n)--;
    while (*n && (((*s)[*n - 1] >= '\t' && (*s)[*n - 1] <= '\r') || (*s)[*n - 1] == ' ' ||
                  ((*s)[*n - 1] >= 0x1c && (*s)[*n - 1] <= 0x1f)))
        (*n)--;
}

static bool word_is(const char *s, size_t n, const char *w) {
    if (n != strlen(w)) return false;
    for (size_t i = 0; i < n; i++)
        if ((char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] | 0x20 : s[i]) != w[i]) return false;
    return true;
}

/* Python int(str): whitespace around, a sign, digits with single '_' between them. */
static bool py_int(const char *s, size_t n, long long *out) {
    char buf[32];
    size_t k = 0, i = 0;
    strip(&s, &n);
    if (i < n && (s[i] == '+' || s[i] == '-')) buf[k++] = s[i++];
    if (i == n) return false;
    for (; i < n; i++) {
        bool digit = s[i] >= '0' && s[i] <= '9';
        if (s[i] == '_' && i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9' && i + 1 < n && s[i + 1] >= '0' &&
            s[i + 1] <= '9')
            continue;
        if (!digit || k + 1 >= sizeof buf) return false;
        buf[k++] = s[i];
    }
    buf[k] = 0;
    errno = 0;
    *out = strtoll(buf, NULL, 10);
    return errno == 0; /* beyond 64 bits Python keeps going; hearth gives the value up */
}

/* _convert_param_value_with_types. NULL with *fatal when upstream raises past its own
 * handlers (int() of an infinite float): the whole call is dropped there too. */
static json_t *convert(const char *v, size_t n, int types, bool *fatal) {
    if (word_is(v, n, "null")) return json_null();
    if ((types & T_NULL) && (word_is(v, n, "none") || word_is(v, n, "nil"))) return json_null();
    long long i;
    double d;
    if ((types & T_INT) && py_int(v, n, &i)) return json_integer(i);
    if ((types & T_NUM) && tp_py_float(v, n, &d) && !isnan(d)) { /* int(nan) fails: next type */
        /* int(inf) raises past upstream's handler; a whole float past 64 bits would be a
         * Python int that jansson cannot hold: both drop the call */
        if (isinf(d) || (d == trunc(d) && fabs(d) >= 9.2e18)) return *fatal = true, NULL;
        return d == trunc(d) ? json_integer((json_int_t)d) : json_real(d);
    }
    if (types & T_BOOL) {
        const char *s = v;
        size_t m = n;
        strip(&s, &m);
        static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no", "off"};
        for (int k = 0; k < 4; k++) {
            if (word_is(s, m, yes[k])) return json_true();
            if (word_is(s, m, no[k])) return json_false();
        }
    }
    if (types & T_OBJ) {
        json_t *j = tp_json_load_lax(v, n);
        if (!j) j = pylit_eval(v, n, false);
        if (j) return j;
    }
    if (types & T_STR) return json_stringn(v, n);
    json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
    return j ? j : json_stringn(v, n);
}

/* _extract_name: the name without one pair of matching quotes. */
static json_t *name_string(const char *s, size_t n) {
    strip(&s, &n);
    if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0])
        s++, n -= 2;
    else if (n == 1 && (s[0] == '"' || s[0] == '\''))
        n = 0;
    return json_stringn(s, n);
}

/* The function's parameter schemas: the last tool of that name (upstream fills a dict). */
static const json_t *param_schemas(const json_t *tools, const json_t *name) {
    const json_t *found = NULL, *tool;
    size_t i;
    json_array_foreach(tools, i, tool) {
        const json_t *f = json_object_get(tool, "function"), *params = json_object_get(f, "parameters");
        if (json_equal(json_object_get(f, "name"), (json_t *)name) && json_is_object(params) &&
            json_object_size(params))
            found = json_object_get(params, "properties");
    }
    return found;
}

hearth_status tp_parse_minicpm5(const char *s, size_t n, const json_t *tools, json_t *calls, hearth_error *err) {
    tp_rx fn, prm, cdata;
    bool ok = tp_rx_open(&fn, "(?:<function\\s+)?(?:name\\s*=\\s*)?(?P<name>\"[^\"]*\"|'[^']*'|[^\\s\"'<>]+)\\s*>"
                              "(?P<body>.*?)(?:</function>|$)");
    ok = tp_rx_open(&prm,
                    "<param\\s+name\\s*=\\s*(?P<name>\"[^\"]*\"|'[^']*'|[^\\s\"'<>]+)\\s*>(?P<value>.*?)</param>") &&
         ok;
    ok = tp_rx_open(&cdata, "^\\s*<!\\[CDATA\\[(.*?)\\]\\]>\\s*$") && ok;
    hearth_status st = ok ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "minicpm5 tool call: out of memory");
    json_t *found = json_array();
    size_t pos = 0;
    PCRE2_SIZE *ov;
    while (!st && found && pos <= n && (ov = tp_rx_match(&fn, s, n, pos, false)) != NULL) {
        pos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        size_t nb, ne, bb, be;
        tp_rx_group(&fn, 1, &nb, &ne);
        tp_rx_group(&fn, 2, &bb, &be);
        json_t *name = name_string(s + nb, ne - nb), *args = json_object();
        const json_t *schemas = name ? param_schemas(tools, name) : NULL;
        const char *body = s + bb;
        size_t blen = be - bb, ppos = 0;
        while (name && args && ppos <= blen && (ov = tp_rx_match(&prm, body, blen, ppos, false)) != NULL) {
            ppos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
            size_t pb, pe, vb, ve, cb, ce;
            tp_rx_group(&prm, 1, &pb, &pe);
            tp_rx_group(&prm, 2, &vb, &ve);
            const char *v = body + vb;
            size_t vl = ve - vb;
            if (tp_rx_match(&cdata, v, vl, 0, true) && tp_rx_group(&cdata, 1, &cb, &ce))
                v += cb, vl = ce - cb;
            else
                strip(&v, &vl);
            json_t *pname = name_string(body + pb, pe - pb);
            const char *key = json_string_value(pname);
            bool fatal = false;
            const json_t *schema = key ? json_object_get(schemas, key) : NULL;
            json_t *val = key ? convert(v, vl, schema ? schema_types(schema) : T_STR, &fatal) : NULL;
            if (val)
                json_object_set_new(args, key, val);
            else
                st =
                    err_set(err, HEARTH_ERR_FORMAT, "minicpm5 tool call: parameter %s has a value upstream cannot type",
                            key ? key : "(not UTF-8)");
            json_decref(pname);
            if (st) break;
        }
        json_t *call = !st && name && args
                           ? tp_make_call(json_string_value(name), json_string_length(name), json_incref(args))
                           : NULL;
        if (call)
            json_array_append_new(found, call);
        else if (!st)
            st = err_set(err, HEARTH_ERR_FORMAT, "minicpm5 tool call: bad function name");
        json_decref(name);
        json_decref(args);
    }
    if (!st && !json_array_size(found))
        st = err_set(err, HEARTH_ERR_FORMAT, "minicpm5 tool call: no function provided");
    if (!st) json_array_extend(calls, found);
    json_decref(found);
    tp_rx_close(&fn);
    tp_rx_close(&prm);
    tp_rx_close(&cdata);
    return st;
}
