/* toolparse.c: tool-call body parsers (json_tools, qwen3_coder, mistral, pythonic,
 * llama3_json, gemma4; minicpm5 in toolparse_typed.c) and the OpenAI tool_calls formatter, ported from the behaviour of
 * mlx-lm 0.32.2's tool_parsers/ and server.ToolCallFormatter. Regexes are the
 * upstream ones run through PCRE2 so matching rules agree. No HTTP, no model state. */
#define _GNU_SOURCE /* memmem */
#include "server/toolparse_internal.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/err.h"
#include "base/sbuf.h"
#include "server/pylit.h"
#include "server/server.h"

/* ---- small helpers ---- */

bool tp_rx_open(tp_rx *r, const char *pattern) {
    int ec;
    PCRE2_SIZE eo;
    r->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                            PCRE2_DOTALL | PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                            &ec, &eo, NULL);
    r->md = r->code ? pcre2_match_data_create_from_pattern(r->code, NULL) : NULL;
    return r->md != NULL;
}

void tp_rx_close(tp_rx *r) {
    pcre2_match_data_free(r->md);
    pcre2_code_free(r->code);
}

PCRE2_SIZE *tp_rx_match(tp_rx *r, const char *s, size_t n, size_t from, bool anchored) {
    int rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, from, anchored ? PCRE2_ANCHORED : 0, r->md,
                         NULL);
    return rc > 0 ? pcre2_get_ovector_pointer(r->md) : NULL;
}

bool tp_rx_group(tp_rx *r, int g, size_t *b, size_t *e) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
    if (ov[2 * g] == PCRE2_UNSET) return false;
    *b = ov[2 * g];
    *e = ov[2 * g + 1];
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static json_t *json_parse_any(const char *s, size_t n, hearth_error *err, const char *what) {
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, &je);
    if (!v) err_set(err, HEARTH_ERR_FORMAT, "%s: invalid JSON: %s", what, je.text);
    return v;
}

/* Python truthiness for the `tc.pop("id", None) or uuid4()` choice. */
static bool py_truthy(const json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_NULL: case JSON_FALSE: return false;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return true;
    }
}

json_t *tp_make_call(const char *name, size_t len, json_t *args) {
    json_t *n = json_stringn(name, len), *call = json_object();
    if (!n || !call || !args) {
        json_decref(n);
        json_decref(call);
        json_decref(args);
        return NULL;
    }
    json_object_set_new(call, "name", n);
    json_object_set_new(call, "arguments", args);
    return call;
}

/* ---- json_tools: json.loads(text.strip()); a list means several calls ---- */

static hearth_status parse_json_tools(const char *s, size_t n, json_t *calls, hearth_error *err) {
    json_t *v = json_parse_any(s, n, err, "json_tools tool call");
    if (!v) return HEARTH_ERR_FORMAT;
    json_t *list = json_is_array(v) ? json_incref(v) : json_pack("[O]", v);
    json_decref(v);
    size_t i;
    json_t *tc;
    /* Upstream crashes the request on a non-object item or a missing "arguments";
     * here the whole text is dropped instead. */
    json_array_foreach(list, i, tc) {
        if (!json_is_object(tc) || !json_object_get(tc, "arguments")) {
            json_decref(list);
            return err_set(err, HEARTH_ERR_FORMAT,
                           "json_tools tool call: item %zu is not an object with \"arguments\"", i);
        }
    }
    json_array_foreach(list, i, tc) json_array_append(calls, tc);
    json_decref(list);
    return HEARTH_OK;
}

/* ---- mistral: [{"name","arguments"}...] JSON, else repeated name[ARGS]{...} ---- */

static hearth_status mistral_json(const char *s, size_t n, json_t *calls, bool *done,
                                  hearth_error *err) {
    *done = false;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (!v || !json_is_array(v) || json_array_size(v) == 0) {
        json_decref(v);
        return HEARTH_OK; /* not the JSON form: try the header form */
    }
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(v, i, c) {
        json_t *name = json_is_object(c) ? json_object_get(c, "name") : NULL;
        json_t *args = json_is_object(c) ? json_object_get(c, "arguments") : NULL;
        json_t *own = NULL;
        if (json_is_object(c) && !args) args = own = json_object();
        if (json_is_string(args)) { /* some templates render arguments as a JSON string */
            own = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY,
                             NULL);
            args = own;
        }
        if (!json_is_string(name) || !json_is_object(args)) {
            json_decref(own);
            json_decref(out);
            json_decref(v);
            return err_set(err, HEARTH_ERR_FORMAT, "mistral tool call: item %zu is not a call", i);
        }
        json_t *call = json_pack("{sOsO}", "name", name, "arguments", args);
        json_t *id = json_object_get(c, "id");
        if (json_is_string(id)) json_object_set(call, "id", id);
        json_array_append_new(out, call);
        json_decref(own);
    }
    json_array_extend(calls, out);
    json_decref(out);
    json_decref(v);
    *done = true;
    return HEARTH_OK;
}

static hearth_status parse_mistral(const char *s, size_t n, json_t *calls, hearth_error *err) {
    bool done;
    if (mistral_json(s, n, calls, &done, err) != HEARTH_OK) return HEARTH_ERR_FORMAT;
    if (done) return HEARTH_OK;
    tp_rx hdr;
    if (!tp_rx_open(&hdr, "([\\w-]+)\\s*\\[ARGS\\]\\s*")) {
        tp_rx_close(&hdr);
        return err_set(err, HEARTH_ERR_NOMEM, "mistral tool call: out of memory");
    }
    json_t *out = json_array();
    size_t pos = 0;
    hearth_status st = HEARTH_OK;
    PCRE2_SIZE *ov;
    while (pos <= n && (ov = tp_rx_match(&hdr, s, n, pos, false)) != NULL) {
        size_t nb = ov[2], ne = ov[3];
        pos = ov[1];
        /* raw_decode: exactly one JSON value starting at pos, no leading whitespace. */
        json_error_t je;
        json_t *args = NULL;
        if (pos < n && !is_ws(s[pos]))
            args = json_loadb(s + pos, n - pos, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
        if (!args) {
            st = err_set(err, HEARTH_ERR_FORMAT, "mistral tool call: arguments are not JSON");
            break;
        }
        pos += je.position;
        json_t *call = tp_make_call(s + nb, ne - nb, args);
        if (!call) {
            st = err_set(err, HEARTH_ERR_FORMAT, "mistral tool call: bad function name");
            break;
        }
        json_array_append_new(out, call);
    }
    tp_rx_close(&hdr);
    if (st == HEARTH_OK && json_array_size(out) == 0)
        st = err_set(err, HEARTH_ERR_FORMAT, "mistral tool call: no call found");
    if (st == HEARTH_OK) json_array_extend(calls, out);
    json_decref(out);
    return st;
}

/* ---- qwen3_coder: <function=f>\n<parameter=p>\nv\n</parameter>\n</function> ---- */

static const json_t *qwen_param_config(const json_t *tools, const char *fn) {
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        const json_t *f = json_object_get(tool, "function");
        const json_t *name = json_object_get(f, "name");
        if (!json_is_string(name) || strcmp(json_string_value(name), fn) != 0) continue;
        return json_object_get(json_object_get(f, "parameters"), "properties");
    }
    return NULL;
}

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Python json.loads(s, strict=False): raw control characters are allowed inside strings
 * (a model writes a multi-line string value as is). jansson refuses them, so each one
 * inside a string is rewritten as its \u00XX escape first; outside strings both parsers
 * agree on what is whitespace. */
json_t *tp_json_load_lax(const char *s, size_t n) {
    char *buf = malloc(6 * n + 1);
    if (!buf) return NULL;
    size_t k = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (in_str && c < 0x20 && !esc) { /* after a backslash it stays raw: both refuse it */
            k += (size_t)snprintf(buf + k, 7, "\\u%04x", c);
            continue;
        }
        if (in_str && esc) esc = false;
        else if (in_str && c == '\\') esc = true;
        else if (c == '"') in_str = !in_str;
        buf[k++] = (char)c;
    }
    json_t *j = json_loadb(buf, k, JSON_DECODE_ANY, NULL);
    free(buf);
    return j;
}

/* Python's float(s): any number of digits (a value a model writes with hundreds of
 * fraction digits is still a float). */
bool tp_py_float(const char *s, size_t n, double *out) {
    char small[128];
    size_t k = 0;
    while (n && is_ws(*s)) { s++; n--; }
    while (n && is_ws(s[n - 1])) n--;
    char *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) return false;
    bool ok = n > 0;
    for (size_t i = 0; ok && i < n; i++) {
        if (s[i] == '_') continue;
        if (s[i] == 'x' || s[i] == 'X' || s[i] == 0) ok = false;
        buf[k++] = s[i];
    }
    buf[k] = 0;
    char *end = buf;
    if (ok && k) *out = strtod(buf, &end);
    ok = ok && k && *end == 0;
    if (buf != small) free(buf);
    return ok;
}

static json_t *qwen_convert(const char *v, size_t n, const char *pname, const json_t *cfg) {
    char low[8];
    if (n == 4) {
        for (int i = 0; i < 4; i++) low[i] = (char)(v[i] | 0x20);
        if (!memcmp(low, "null", 4)) return json_null();
    }
    const json_t *param = json_object_get(cfg, pname);
    if (!json_is_object(param) || json_object_size(param) == 0) return json_stringn(v, n);
    const json_t *type = json_object_get(param, "type");
    if (!type) {
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
        if (json_is_object(j) || json_is_array(j)) return j;
        json_decref(j);
        return json_stringn(v, n);
    }
    char t[64] = "";
    if (json_is_string(type)) { /* str(type).strip().lower() */
        const char *ts = json_string_value(type);
        size_t tl = json_string_length(type);
        while (tl && is_ws(*ts)) { ts++; tl--; }
        while (tl && is_ws(ts[tl - 1])) tl--;
        if (tl >= sizeof t) tl = sizeof t - 1;
        for (size_t i = 0; i < tl; i++) t[i] = (char)((ts[i] >= 'A' && ts[i] <= 'Z') ? ts[i] | 0x20 : ts[i]);
        t[tl] = 0;
    }
    static const char *const STR[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < 6; i++)
        if (!strcmp(t, STR[i])) return json_stringn(v, n);
    double d;
    if (starts(t, "int") || starts(t, "uint") || starts(t, "long") || starts(t, "short") ||
        starts(t, "unsigned")) {
        if (!tp_py_float(v, n, &d) || !isfinite(d) || d != trunc(d) || fabs(d) >= 9.2e18) return NULL;
        return json_integer((json_int_t)d);
    }
    if (starts(t, "num") || starts(t, "float")) {
        if (!tp_py_float(v, n, &d) || isnan(d) || isinf(d)) return NULL;
        if (d == trunc(d) && fabs(d) < 9.2e18) return json_integer((json_int_t)d);
        return json_real(d);
    }
    if (!strcmp(t, "boolean") || !strcmp(t, "bool") || !strcmp(t, "binary")) {
        bool yes = n == 4 && (v[0] | 0x20) == 't' && (v[1] | 0x20) == 'r' && (v[2] | 0x20) == 'u' &&
                   (v[3] | 0x20) == 'e';
        return json_boolean(yes);
    }
    if (!strcmp(t, "object") || !strcmp(t, "array") || !strcmp(t, "arr") || starts(t, "dict") ||
        starts(t, "list")) {
        json_t *j = tp_json_load_lax(v, n);
        if (j) return j;
    }
    json_t *lit = pylit_eval(v, n, false);
    return lit ? lit : json_stringn(v, n);
}

static hearth_status parse_qwen3_coder(const char *s, size_t n, const json_t *tools, json_t *calls,
                                       hearth_error *err) {
    tp_rx fn, prm, name;
    bool ok = tp_rx_open(&fn, "<function=(.*?)</function>$");
    ok = tp_rx_open(&prm, "<parameter=(.*?)</parameter>") && ok;
    ok = tp_rx_open(&name, "\\s*([^\\s<>]+)>?") && ok;
    hearth_status st = HEARTH_OK;
    json_t *args = NULL;
    if (!ok) {
        st = err_set(err, HEARTH_ERR_NOMEM, "qwen3_coder tool call: out of memory");
        goto done;
    }
    size_t fb, fe, nb, ne;
    if (!tp_rx_match(&fn, s, n, 0, false) || !tp_rx_group(&fn, 1, &fb, &fe)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "qwen3_coder tool call: no function provided");
        goto done;
    }
    const char *f = s + fb;
    size_t fl = fe - fb;
    if (!tp_rx_match(&name, f, fl, 0, true) || !tp_rx_group(&name, 1, &nb, &ne)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "qwen3_coder tool call: no function name provided");
        goto done;
    }
    char *fname = strndup(f + nb, ne - nb);
    const json_t *cfg = fname ? qwen_param_config(tools, fname) : NULL;
    args = json_object();
    size_t pos = pcre2_get_ovector_pointer(name.md)[1];
    PCRE2_SIZE *ov;
    while (fname && args && pos <= fl && (ov = tp_rx_match(&prm, f, fl, pos, false)) != NULL) {
        size_t mb = ov[2], me = ov[3];
        pos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        const char *m = f + mb;
        size_t ml = me - mb, pb, pe;
        if (!tp_rx_match(&name, m, ml, 0, true) || !tp_rx_group(&name, 1, &pb, &pe)) continue;
        size_t vend = pcre2_get_ovector_pointer(name.md)[1];
        const char *v = m + vend;
        size_t vl = ml - vend;
        if (vl && v[0] == '\n') { v++; vl--; }
        if (vl && v[vl - 1] == '\n') vl--;
        char *pname = strndup(m + pb, pe - pb);
        json_t *val = pname ? qwen_convert(v, vl, pname, cfg) : NULL;
        if (!val) {
            free(pname);
            st = err_set(err, HEARTH_ERR_FORMAT, "qwen3_coder tool call: bad value for a parameter");
            break;
        }
        json_object_set_new(args, pname, val);
        free(pname);
    }
    if (st == HEARTH_OK && fname && args) {
        json_t *c = tp_make_call(fname, strlen(fname), json_incref(args));
        if (c) json_array_append_new(calls, c);
        else st = err_set(err, HEARTH_ERR_FORMAT, "qwen3_coder tool call: bad function name");
    } else if (st == HEARTH_OK) {
        st = err_set(err, HEARTH_ERR_NOMEM, "qwen3_coder tool call: out of memory");
    }
    free(fname);
done:
    json_decref(args);
    tp_rx_close(&fn);
    tp_rx_close(&prm);
    tp_rx_close(&name);
    return st;
}

/* ---- pythonic: [f(a=1), g(b="x")] as Python, else the upstream regex fallback ---- */

static hearth_status parse_pythonic(const char *s, size_t n, json_t *calls, hearth_error *err) {
    const char *lb = memchr(s, '[', n);
    const char *rb = NULL;
    for (size_t i = n; i-- > 0;)
        if (s[i] == ']') { rb = s + i; break; }
    if (lb && rb && rb > lb) {
        json_t *list = pylit_call_list(lb, (size_t)(rb - lb) + 1);
        if (list) {
            json_array_extend(calls, list);
            json_decref(list);
            return HEARTH_OK;
        }
    }
    tp_rx call, arg;
    bool ok = tp_rx_open(&call, "\\[(?P<name>[\\w.]+)\\((?P<args>.*?)\\)\\]");
    ok = tp_rx_open(&arg, "(?J)(?P<key>\\w+)=(?:\"(?P<quoted>[^\"]*)\"|'(?P<quoted>[^']*)'|"
                       "(?P<bare>[^,]+))(?:,\\s*|$)") && ok;
    hearth_status st = HEARTH_OK;
    size_t nb, ne, ab, ae;
    if (!ok) {
        st = err_set(err, HEARTH_ERR_NOMEM, "pythonic tool call: out of memory");
    } else if (!tp_rx_match(&call, s, n, 0, false) || !tp_rx_group(&call, 1, &nb, &ne) ||
               !tp_rx_group(&call, 2, &ab, &ae)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "pythonic tool call: no function provided");
    } else {
        json_t *args = json_object();
        const char *a = s + ab;
        size_t al = ae - ab, pos = 0;
        PCRE2_SIZE *ov;
        while (args && pos <= al && (ov = tp_rx_match(&arg, a, al, pos, false)) != NULL) {
            pos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
            size_t kb = 0, ke = 0, vb, ve;
            if (!tp_rx_group(&arg, 1, &kb, &ke)) continue;
            bool bare = tp_rx_group(&arg, 4, &vb, &ve);
            if (!bare && !tp_rx_group(&arg, 2, &vb, &ve) && !tp_rx_group(&arg, 3, &vb, &ve)) continue;
            if (bare) {
                while (vb < ve && is_ws(a[vb])) vb++;
                while (ve > vb && is_ws(a[ve - 1])) ve--;
            }
            json_t *val = pylit_eval(a + vb, ve - vb, false);
            if (!val) val = json_stringn(a + vb, ve - vb);
            char *key = strndup(a + kb, ke - kb);
            if (key && val) json_object_set_new(args, key, val);
            else json_decref(val);
            free(key);
        }
        json_t *c = tp_make_call(s + nb, ne - nb, args);
        if (c) json_array_append_new(calls, c);
        else st = err_set(err, HEARTH_ERR_FORMAT, "pythonic tool call: bad function name");
    }
    tp_rx_close(&call);
    tp_rx_close(&arg);
    return st;
}

/* ---- llama3_json (hearth extension): {"name", "parameters"} objects, ';'-separated ---- */

static hearth_status parse_llama3(const char *s, size_t n, json_t *calls, hearth_error *err) {
    json_t *out = json_array();
    size_t pos = 0;
    for (;;) {
        while (pos < n && (is_ws(s[pos]) || s[pos] == ';')) pos++;
        if (pos >= n) break;
        json_error_t je;
        json_t *v = json_loadb(s + pos, n - pos, JSON_DISABLE_EOF_CHECK, &je);
        json_t *name = json_object_get(v, "name");
        json_t *args = json_object_get(v, "parameters");
        if (!args) args = json_object_get(v, "arguments");
        if (!json_is_string(name) || !json_is_object(args)) {
            json_decref(v);
            json_decref(out);
            return err_set(err, HEARTH_ERR_FORMAT,
                           "llama3 tool call: expected {\"name\": ..., \"parameters\": {...}}");
        }
        json_array_append_new(out, json_pack("{sOsO}", "name", name, "arguments", args));
        json_decref(v);
        pos += je.position;
    }
    if (json_array_size(out) == 0) {
        json_decref(out);
        return err_set(err, HEARTH_ERR_FORMAT, "llama3 tool call: empty");
    }
    json_array_extend(calls, out);
    json_decref(out);
    return HEARTH_OK;
}

/* ---- gemma4: call:name{key:value,...}, strings between <|"|> delimiters ---- */

#define GEMMA4_QUOTE "<|\"|>"
#define GEMMA4_QUOTE_LEN 5

/* Appends [s, s + n) to the growing buffer *buf (length *len, capacity *cap). */
static bool buf_put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t want = (*len + n + 1) * 2;
        char *b = realloc(*buf, want);
        if (!b) return false;
        *buf = b;
        *cap = want;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* mlx-lm's _gemma4_args_to_json, step by step: each <|"|>...<|"|> string (shortest match)
 * becomes a placeholder, bare keys after '{' or ',' get quotes, the placeholders become JSON
 * strings; then the text is parsed as JSON. */
static json_t *gemma4_args(const char *s, size_t n, tp_rx *key, hearth_error *err) {
    json_t *strings = json_array(), *out = NULL;
    char *a = NULL, *b = NULL, *c = NULL;
    size_t al = 0, acap = 0, bl = 0, bcap = 0, cl = 0, ccap = 0;
    bool ok = strings != NULL;
    for (size_t i = 0; ok && i < n;) { /* 1: strings out */
        const char *q = i + GEMMA4_QUOTE_LEN <= n ? memmem(s + i, n - i, GEMMA4_QUOTE, GEMMA4_QUOTE_LEN) : NULL;
        const char *end = q ? memmem(q + GEMMA4_QUOTE_LEN, (size_t)(s + n - q) - GEMMA4_QUOTE_LEN, GEMMA4_QUOTE,
                                     GEMMA4_QUOTE_LEN)
                            : NULL;
        if (!end) {
            ok = buf_put(&a, &al, &acap, s + i, n - i);
            break;
        }
        char ph[32];
        int phl = snprintf(ph, sizeof ph, "%c%zu%c", 0, json_array_size(strings), 0);
        json_t *str = json_stringn(q + GEMMA4_QUOTE_LEN, (size_t)(end - q) - GEMMA4_QUOTE_LEN);
        ok = str && !json_array_append_new(strings, str) && buf_put(&a, &al, &acap, s + i, (size_t)(q - s) - i) &&
             buf_put(&a, &al, &acap, ph, (size_t)phl);
        i = (size_t)(end - s) + GEMMA4_QUOTE_LEN;
    }
    size_t pos = 0, kb = 0, ke = 0;
    PCRE2_SIZE *ov;
    while (ok && pos <= al && (ov = tp_rx_match(key, a ? a : "", al, pos, false)) != NULL) { /* 2: "key": */
        tp_rx_group(key, 1, &kb, &ke);
        ok = buf_put(&b, &bl, &bcap, a + pos, ov[0] - pos) && buf_put(&b, &bl, &bcap, "\"", 1) &&
             buf_put(&b, &bl, &bcap, a + kb, ke - kb) && buf_put(&b, &bl, &bcap, "\":", 2);
        pos = ov[1];
    }
    if (ok && pos < al) ok = buf_put(&b, &bl, &bcap, a + pos, al - pos);
    for (size_t i = 0; ok && i < bl;) { /* 3: placeholders -> JSON strings */
        size_t j = i + 1, idx = 0;
        while (j < bl && b[j] >= '0' && b[j] <= '9' && j - i <= 9) idx = idx * 10 + (size_t)(b[j++] - '0');
        bool canonical = j > i + 1 && (b[i + 1] != '0' || j == i + 2);
        if (b[i] == '\0' && canonical && j < bl && b[j] == '\0' && idx < json_array_size(strings)) {
            char *dumped = json_dumps(json_array_get(strings, idx), JSON_ENCODE_ANY);
            ok = dumped && buf_put(&c, &cl, &ccap, dumped, strlen(dumped));
            free(dumped);
            i = j + 1;
        } else {
            ok = buf_put(&c, &cl, &ccap, b + i, 1);
            i++;
        }
    }
    if (!ok) err_set(err, HEARTH_ERR_NOMEM, "gemma4 tool call: out of memory");
    else out = json_parse_any(c ? c : "", cl, err, "gemma4 tool call arguments");
    json_decref(strings);
    free(a);
    free(b);
    free(c);
    return out;
}

static hearth_status parse_gemma4(const char *s, size_t n, json_t *calls, hearth_error *err) {
    tp_rx call, key;
    /* mlx-lm's _tool_call_regex: a name, then a brace group balanced by recursion, in which
     * <|"|>...<|"|> strings are atoms (their braces do not count) */
    bool ok = tp_rx_open(&call, "call:([\\w-]+)(\\{(?:[^{}<]|<(?!\\|\"\\|>)|<\\|\"\\|>(?:(?!<\\|\"\\|>)[\\s\\S])*?"
                             "<\\|\"\\|>|(?2))*\\})");
    ok = tp_rx_open(&key, "(?<=[{,])(\\w+):") && ok;
    json_t *found = json_array();
    hearth_status st = HEARTH_OK;
    size_t pos = 0, nb = 0, ne = 0, ab = 0, ae = 0;
    PCRE2_SIZE *ov;
    if (!ok || !found) st = err_set(err, HEARTH_ERR_NOMEM, "gemma4 tool call: out of memory");
    while (!st && pos <= n && (ov = tp_rx_match(&call, s, n, pos, false)) != NULL) {
        pos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        tp_rx_group(&call, 1, &nb, &ne);
        tp_rx_group(&call, 2, &ab, &ae);
        json_t *args = gemma4_args(s + ab, ae - ab, &key, err);
        json_t *c = args ? tp_make_call(s + nb, ne - nb, args) : NULL;
        if (!c) st = args ? err_set(err, HEARTH_ERR_FORMAT, "gemma4 tool call: bad function name") : HEARTH_ERR_FORMAT;
        else json_array_append_new(found, c);
    }
    if (!st && json_array_size(found) == 0) st = err_set(err, HEARTH_ERR_FORMAT, "gemma4 tool call: no function provided");
    if (!st) json_array_extend(calls, found);
    json_decref(found);
    tp_rx_close(&call);
    tp_rx_close(&key);
    return st;
}

hearth_status tp_parse(ts_tool_type type, const char *text, size_t len, const json_t *tools,
                       json_t *calls, hearth_error *err) {
    if (!text) len = 0;
    if (!text) text = "";
    switch (type) {
    case TS_TOOL_JSON_TOOLS: return parse_json_tools(text, len, calls, err);
    case TS_TOOL_QWEN3_CODER: return parse_qwen3_coder(text, len, tools, calls, err);
    case TS_TOOL_MISTRAL: return parse_mistral(text, len, calls, err);
    case TS_TOOL_PYTHONIC: return parse_pythonic(text, len, calls, err);
    case TS_TOOL_LLAMA3_JSON: return parse_llama3(text, len, calls, err);
    case TS_TOOL_GEMMA4: return parse_gemma4(text, len, calls, err);
    case TS_TOOL_MINICPM5: return tp_parse_minicpm5(text, len, tools, calls, err);
    case TS_TOOL_NONE: return err_set(err, HEARTH_ERR_INVALID, "no tool parser");
    default:
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "this tool-call format is recognised but not parsed by hearth yet");
    }
}

/* ---- formatter ---- */

static void uuid4(char out[37]) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)rand();
    b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

/* srv_json_dumps writes ensure_ascii=True; json.dumps(arguments, ensure_ascii=False)
 * differs only in writing characters >= U+007F raw, so undo exactly those escapes. */
static char *dumps_no_ascii(const json_t *v) {
    char *a = srv_json_dumps(v);
    if (!a) return NULL;
    size_t w = 0;
    for (size_t r = 0; a[r];) {
        if (a[r] != '\\') { a[w++] = a[r++]; continue; }
        if (a[r + 1] != 'u') { a[w++] = a[r++]; a[w++] = a[r++]; continue; }
        unsigned cp = (unsigned)strtoul((char[5]){a[r + 2], a[r + 3], a[r + 4], a[r + 5], 0}, NULL, 16);
        size_t used = 6;
        if (cp >= 0xD800 && cp < 0xDC00 && a[r + 6] == '\\' && a[r + 7] == 'u') {
            unsigned lo = (unsigned)strtoul((char[5]){a[r + 8], a[r + 9], a[r + 10], a[r + 11], 0}, NULL, 16);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            used = 12;
        }
        if (cp < 0x7F) { /* control characters stay escaped */
            memmove(a + w, a + r, 6);
            w += 6;
            r += 6;
            continue;
        }
        /* The UTF-8 form is never longer than the escape it replaces. */
        if (cp == 0x7F) a[w++] = 0x7F;
        else if (cp < 0x800) { a[w++] = (char)(0xC0 | (cp >> 6)); a[w++] = (char)(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
            a[w++] = (char)(0xE0 | (cp >> 12)); a[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            a[w++] = (char)(0x80 | (cp & 0x3F));
        } else {
            a[w++] = (char)(0xF0 | (cp >> 18)); a[w++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            a[w++] = (char)(0x80 | ((cp >> 6) & 0x3F)); a[w++] = (char)(0x80 | (cp & 0x3F));
        }
        r += used;
    }
    a[w] = 0;
    return a;
}

size_t tp_format_calls(ts_tool_type type, const char *const *texts, const size_t *lens,
                       size_t n, const json_t *tools, bool streaming, int *next_index,
                       json_t *out, tp_warn_fn warn, void *ud) {
    size_t added = 0;
    for (size_t t = 0; t < n; t++) {
        json_t *calls = json_array();
        hearth_error err = {0};
        if (!calls || tp_parse(type, texts[t], lens[t], tools, calls, &err) != HEARTH_OK) {
            if (warn) {
                char msg[sizeof err.message + 80];
                snprintf(msg, sizeof msg,
                         "failed to parse tool call (%s); tool text was likely truncated",
                         err.message);
                warn(ud, msg);
            }
            json_decref(calls);
            continue;
        }
        size_t i;
        json_t *tc;
        json_array_foreach(calls, i, tc) {
            json_t *fn = json_deep_copy(tc);
            json_t *id = json_incref(json_object_get(fn, "id"));
            json_object_del(fn, "id");
            char *args = dumps_no_ascii(json_object_get(fn, "arguments"));
            json_object_set_new(fn, "arguments", json_string(args ? args : "{}"));
            free(args);
            if (!py_truthy(id)) {
                char u[37];
                uuid4(u);
                json_decref(id);
                id = json_string(u);
            }
            json_t *item = json_pack("{s:o,s:s,s:o}", "function", fn, "type", "function", "id", id);
            if (streaming && item) json_object_set_new(item, "index", json_integer((*next_index)++));
            if (item && !json_array_append_new(out, item)) added++;
        }
        json_decref(calls);
    }
    return added;
}
