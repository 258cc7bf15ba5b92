/* pylit.c: a recursive-descent reader for Python literals and keyword-only call lists
 * (see pylit.h). Bounds-checked on every byte; depth-limited so hostile nesting
 * cannot exhaust the stack. It must not evaluate anything: names other than the
 * literal constants are failures, as in ast.literal_eval. */
#include "server/pylit.h"

#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/sbuf.h"

/* Python's own parser gives up near 200 nested brackets; 64 is plenty for arguments. */
#define PYLIT_MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t n, i;
    bool json_names;
    int depth;
} rd;

static void skip_ws(rd *r) {
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') r->i++;
        else if (c == '\\' && r->i + 1 < r->n && r->s[r->i + 1] == '\n') r->i += 2;
        else break;
    }
}

static bool ident_start(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}
static bool ident_char(unsigned char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

static size_t read_ident(rd *r) {
    size_t st = r->i;
    if (r->i < r->n && ident_start((unsigned char)r->s[r->i]))
        while (r->i < r->n && ident_char((unsigned char)r->s[r->i])) r->i++;
    return r->i - st;
}

static void put_utf8(sbuf *b, uint32_t cp) {
    char o[4];
    if (cp < 0x80) { o[0] = (char)cp; sbuf_append(b, o, 1); }
    else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F));
        sbuf_append(b, o, 2);
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        sbuf_append(b, o, 3);
    } else {
        o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
        sbuf_append(b, o, 4);
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One backslash escape of a non-raw string; r->i is just past the backslash. */
static bool read_escape(rd *r, sbuf *b) {
    if (r->i >= r->n) return false;
    char c = r->s[r->i++];
    switch (c) {
    case '\n': return true; /* line continuation */
    case '\\': sbuf_putc(b, '\\'); return true;
    case '\'': sbuf_putc(b, '\''); return true;
    case '"': sbuf_putc(b, '"'); return true;
    case 'a': sbuf_putc(b, '\a'); return true;
    case 'b': sbuf_putc(b, '\b'); return true;
    case 'f': sbuf_putc(b, '\f'); return true;
    case 'n': sbuf_putc(b, '\n'); return true;
    case 'r': sbuf_putc(b, '\r'); return true;
    case 't': sbuf_putc(b, '\t'); return true;
    case 'v': sbuf_putc(b, '\v'); return true;
    case 'x': case 'u': case 'U': {
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < digits; k++) {
            if (r->i >= r->n || hexval(r->s[r->i]) < 0) return false;
            cp = cp * 16 + (uint32_t)hexval(r->s[r->i++]);
        }
        /* Lone surrogates cannot become valid UTF-8 for JSON. */
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        put_utf8(b, cp);
        return true;
    }
    default:
        if (c >= '0' && c <= '7') {
            uint32_t cp = (uint32_t)(c - '0');
            for (int k = 0; k < 2 && r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '7'; k++)
                cp = cp * 8 + (uint32_t)(r->s[r->i++] - '0');
            put_utf8(b, cp);
            return true;
        }
        if (c == 'N') return false; /* \N{name} needs the Unicode name table */
        /* Unknown escapes keep their backslash in Python. */
        sbuf_putc(b, '\\');
        sbuf_putc(b, c);
        return true;
    }
}

/* One string literal (with optional r/u prefix) appended to b. */
static bool read_string_part(rd *r, sbuf *b) {
    bool raw = false;
    if (r->i < r->n && (r->s[r->i] == 'r' || r->s[r->i] == 'R' || r->s[r->i] == 'u' ||
                        r->s[r->i] == 'U')) {
        raw = r->s[r->i] == 'r' || r->s[r->i] == 'R';
        r->i++;
    }
    if (r->i >= r->n || (r->s[r->i] != '\'' && r->s[r->i] != '"')) return false;
    char q = r->s[r->i];
    bool triple = r->i + 2 < r->n && r->s[r->i + 1] == q && r->s[r->i + 2] == q;
    r->i += triple ? 3 : 1;
    for (;;) {
        if (r->i >= r->n) return false;
        char c = r->s[r->i];
        if (c == q) {
            if (!triple) { r->i++; return true; }
            if (r->i + 2 < r->n && r->s[r->i + 1] == q && r->s[r->i + 2] == q) {
                r->i += 3;
                return true;
            }
        }
        if (c == '\n' && !triple) return false;
        if (c == '\\') {
            r->i++;
            if (raw) {
                if (r->i >= r->n) return false;
                sbuf_putc(b, '\\');
                sbuf_putc(b, r->s[r->i++]);
            } else if (!read_escape(r, b)) {
                return false;
            }
            continue;
        }
        sbuf_putc(b, c);
        r->i++;
    }
}

static bool at_string(const rd *r) {
    size_t i = r->i;
    if (i < r->n && strchr("rRuU", r->s[i]) && r->s[i]) i++;
    return i < r->n && (r->s[i] == '\'' || r->s[i] == '"');
}

/* Adjacent literals concatenate ("a" 'b' == "ab"). */
static json_t *read_string(rd *r) {
    sbuf b;
    sbuf_init(&b);
    do {
        if (!read_string_part(r, &b)) { sbuf_free(&b); return NULL; }
        skip_ws(r);
    } while (at_string(r));
    json_t *v = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
    sbuf_free(&b);
    return v;
}

static json_t *read_number(rd *r, bool neg) {
    char buf[128];
    size_t k = 0;
    bool is_float = false, hex = false;
    size_t st = r->i;
    if (r->i + 1 < r->n && r->s[r->i] == '0' && strchr("xXoObB", r->s[r->i + 1]) &&
        r->s[r->i + 1]) {
        char kind = (char)(r->s[r->i + 1] | 0x20);
        int base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
        hex = true;
        r->i += 2;
        uint64_t v = 0;
        size_t nd = 0;
        while (r->i < r->n) {
            char c = r->s[r->i];
            if (c == '_') { r->i++; continue; }
            int d = hexval(c);
            if (d < 0 || d >= base) break;
            if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return NULL;
            v = v * (uint64_t)base + (uint64_t)d;
            nd++;
            r->i++;
        }
        if (!nd || v > (uint64_t)INT64_MAX) return NULL;
        (void)hex;
        return json_integer(neg ? -(json_int_t)v : (json_int_t)v);
    }
    /* as many digits as Python reads (a float of hundreds of digits is still a float) */
    size_t room = r->n - r->i + 2;
    char *num = room <= sizeof buf ? buf : malloc(room);
    if (!num) return NULL;
    json_t *out = NULL;
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c >= '0' && c <= '9') num[k++] = c;
        else if (c == '_') { /* digit separator */ }
        else if (c == '.' || c == 'e' || c == 'E') { num[k++] = c; is_float = true; }
        else if ((c == '+' || c == '-') && k > 0 && (num[k - 1] == 'e' || num[k - 1] == 'E'))
            num[k++] = c;
        else break;
        r->i++;
    }
    if (r->i == st || k == 0) goto done;
    if (r->i < r->n && (r->s[r->i] == 'j' || r->s[r->i] == 'J' || ident_char((unsigned char)r->s[r->i])))
        goto done; /* complex numbers and 1abc are not JSON-able literals */
    num[k] = 0;
    char *end;
    errno = 0;
    if (is_float) {
        double d = strtod(num, &end);
        if (!*end && !(num[0] == '.' && k == 1)) out = json_real(neg ? -d : d);
        goto done;
    }
    if (k > 1 && num[0] == '0') { /* Python 3 rejects 007 but allows 000 */
        for (size_t j = 0; j < k; j++)
            if (num[j] != '0') goto done;
    }
    long long v = strtoll(num, &end, 10);
    if (!*end && errno != ERANGE) out = json_integer(neg ? -v : v);
done:
    if (num != buf) free(num);
    return out;
}

static json_t *read_value(rd *r);

/* Items until `close`; tuples and lists both become JSON arrays. *count_commas tells
 * "(1)" (a parenthesized value) from "(1,)" (a tuple). */
static json_t *read_seq(rd *r, char close, bool *had_comma) {
    json_t *arr = json_array();
    if (!arr) return NULL;
    *had_comma = false;
    skip_ws(r);
    while (r->i < r->n && r->s[r->i] != close) {
        json_t *v = read_value(r);
        if (!v || json_array_append_new(arr, v)) goto fail;
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            *had_comma = true;
            r->i++;
            skip_ws(r);
        } else {
            break;
        }
    }
    if (r->i >= r->n || r->s[r->i] != close) goto fail;
    r->i++;
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

static json_t *read_dict(rd *r) {
    json_t *obj = json_object();
    if (!obj) return NULL;
    skip_ws(r);
    while (r->i < r->n && r->s[r->i] != '}') {
        json_t *k = read_value(r);
        char numkey[32];
        const char *key = NULL;
        /* json.dumps writes str and int keys; other key types are not JSON-able here. */
        if (k && json_is_string(k)) key = json_string_value(k);
        else if (k && json_is_integer(k)) {
            snprintf(numkey, sizeof numkey, "%lld", (long long)json_integer_value(k));
            key = numkey;
        }
        skip_ws(r);
        if (!key || r->i >= r->n || r->s[r->i] != ':') { json_decref(k); goto fail; }
        r->i++;
        skip_ws(r);
        json_t *v = read_value(r);
        if (!v || json_object_set_new(obj, key, v)) { json_decref(k); goto fail; }
        json_decref(k);
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; skip_ws(r); }
        else break;
    }
    if (r->i >= r->n || r->s[r->i] != '}') goto fail;
    r->i++;
    return obj;
fail:
    json_decref(obj);
    return NULL;
}

static json_t *read_value_inner(rd *r) {
    skip_ws(r);
    if (r->i >= r->n) return NULL;
    char c = r->s[r->i];
    if (at_string(r)) return read_string(r);
    if (c == '-' || c == '+') {
        r->i++;
        skip_ws(r);
        if (r->i < r->n && ((r->s[r->i] >= '0' && r->s[r->i] <= '9') || r->s[r->i] == '.'))
            return read_number(r, c == '-');
        return NULL;
    }
    if ((c >= '0' && c <= '9') || c == '.') return read_number(r, false);
    if (c == '[') {
        r->i++;
        bool comma;
        return read_seq(r, ']', &comma);
    }
    if (c == '(') {
        r->i++;
        bool comma;
        json_t *arr = read_seq(r, ')', &comma);
        if (arr && json_array_size(arr) == 1 && !comma) { /* (x) is just x */
            json_t *v = json_incref(json_array_get(arr, 0));
            json_decref(arr);
            return v;
        }
        return arr;
    }
    if (c == '{') {
        r->i++;
        return read_dict(r);
    }
    size_t st = r->i, n = read_ident(r);
    const char *w = r->s + st;
    if (n == 4 && !memcmp(w, "True", 4)) return json_true();
    if (n == 5 && !memcmp(w, "False", 5)) return json_false();
    if (n == 4 && !memcmp(w, "None", 4)) return json_null();
    if (r->json_names && n == 4 && !memcmp(w, "true", 4)) return json_true();
    if (r->json_names && n == 5 && !memcmp(w, "false", 5)) return json_false();
    if (r->json_names && n == 4 && !memcmp(w, "null", 4)) return json_null();
    return NULL;
}

static json_t *read_value(rd *r) {
    if (++r->depth > PYLIT_MAX_DEPTH) return NULL;
    json_t *v = read_value_inner(r);
    r->depth--;
    return v;
}

json_t *pylit_eval(const char *text, size_t len, bool json_names) {
    rd r = {text, len, 0, json_names, 0};
    while (r.i < r.n && (text[r.i] == ' ' || text[r.i] == '\t')) r.i++;
    json_t *v = read_value(&r);
    skip_ws(&r);
    if (v && r.i != r.n) {
        json_decref(v);
        return NULL;
    }
    return v;
}

/* name(.name)*(kw=literal, ...) -> {"name", "arguments"}. */
static json_t *read_call(rd *r) {
    skip_ws(r);
    sbuf name;
    sbuf_init(&name);
    json_t *args = NULL, *call = NULL;
    for (;;) {
        size_t st = r->i, n = read_ident(r);
        if (!n) goto fail;
        sbuf_append(&name, r->s + st, n);
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == '.') {
            sbuf_putc(&name, '.');
            r->i++;
            skip_ws(r);
            continue;
        }
        break;
    }
    if (r->i >= r->n || r->s[r->i] != '(') goto fail;
    r->i++;
    args = json_object();
    skip_ws(r);
    while (args && r->i < r->n && r->s[r->i] != ')') {
        size_t st = r->i, n = read_ident(r);
        if (!n || n >= 256) goto fail;
        char key[256];
        memcpy(key, r->s + st, n);
        key[n] = 0;
        skip_ws(r);
        if (r->i >= r->n || r->s[r->i] != '=' || json_object_get(args, key)) goto fail;
        r->i++; /* a repeated keyword is a SyntaxError in Python */
        if (r->i < r->n && r->s[r->i] == '=') goto fail; /* k==v is a comparison */
        json_t *v = read_value(r);
        if (!v || json_object_set_new(args, key, v)) goto fail;
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; skip_ws(r); }
        else break;
    }
    if (!args || r->i >= r->n || r->s[r->i] != ')' || name.oom) goto fail;
    r->i++;
    json_t *nm = json_stringn(name.data, name.len); /* NULL for invalid UTF-8 */
    call = nm ? json_object() : NULL;
    if (!call) {
        json_decref(nm);
        goto fail;
    }
    json_object_set_new(call, "name", nm);
    json_object_set_new(call, "arguments", args);
    sbuf_free(&name);
    return call;
fail:
    json_decref(args);
    sbuf_free(&name);
    return NULL;
}

json_t *pylit_call_list(const char *text, size_t len) {
    rd r = {text, len, 0, true, 0};
    skip_ws(&r);
    if (r.i >= r.n || text[r.i] != '[') return NULL;
    r.i++;
    json_t *arr = json_array();
    skip_ws(&r);
    while (arr && r.i < r.n && text[r.i] != ']') {
        json_t *c = read_call(&r);
        if (!c || json_array_append_new(arr, c)) goto fail;
        skip_ws(&r);
        if (r.i < r.n && text[r.i] == ',') { r.i++; skip_ws(&r); }
        else break;
    }
    if (!arr || r.i >= r.n || text[r.i] != ']' || json_array_size(arr) == 0) goto fail;
    r.i++;
    skip_ws(&r);
    if (r.i != r.n) goto fail;
    return arr;
fail:
    json_decref(arr);
    return NULL;
}
