/* json_out.c: writes jansson values byte-for-byte the way Python's json.dumps
 * does by default (", " / ": " separators, ensure_ascii, float repr,
 * Infinity/NaN), because mlx_lm.server clients may compare raw bytes; plus the
 * OpenAI error body. Must not reorder keys: jansson keeps insertion order and
 * mlx_lm.server's order is part of the contract. */
#include "server/anthropic.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_fail(srv_error *e, int http_status, const char *type, const char *param, const char *code, const char *fmt,
             ...) {
    if (!e) return -1;
    e->http_status = http_status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *srv_error_body(const srv_error *e) {
    if (e->anthropic) return anth_error_body(e);
    json_t *inner = json_object();
    /* messages may quote user bytes cut at a buffer edge: json_string refuses
     * invalid UTF-8, so fall back to a generic text rather than dropping the
     * message key */
    json_t *msg = json_string(e->message);
    json_object_set_new(inner, "message", msg ? msg : json_string("invalid request"));
    json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(inner, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", inner);
    char *s = srv_json_dumps(root);
    json_decref(root);
    return s;
}

/* Python's repr(float): the shortest digits that round-trip, fixed notation
 * when the decimal exponent is in [-4, 16), otherwise d.ddde[+-]XX. */
static void write_float(sbuf *out, double v) {
    if (isnan(v)) {
        sbuf_puts(out, "NaN");
        return;
    }
    if (isinf(v)) {
        sbuf_puts(out, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char buf[40];
    for (int p = 0; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* buf is [-]d[.ddd]e[+-]XX: split into sign, digits and exponent */
    char *s = buf, digits[24];
    int nd = 0, neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < 20) digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--; /* %.*e may pad when p hit the cap */
    digits[nd] = 0;
    if (neg) sbuf_putc(out, '-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            sbuf_puts(out, "0.");
            for (int i = 0; i < -exp - 1; i++) sbuf_putc(out, '0');
            sbuf_puts(out, digits);
        } else {
            for (int i = 0; i <= exp; i++) sbuf_putc(out, i < nd ? digits[i] : '0');
            sbuf_putc(out, '.');
            if (nd > exp + 1)
                sbuf_puts(out, digits + exp + 1);
            else
                sbuf_putc(out, '0');
        }
    } else {
        sbuf_putc(out, digits[0]);
        if (nd > 1) {
            sbuf_putc(out, '.');
            sbuf_puts(out, digits + 1);
        }
        sbuf_printf(out, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* Decodes one UTF-8 sequence (jansson strings are valid UTF-8); returns its
 * length. */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    if (len == 1) {
        *cp = c;
        return 1;
    }
    unsigned v = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) v = (v << 6) | (s[i] & 0x3F);
    *cp = v;
    return len;
}

static void write_string(sbuf *out, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    sbuf_putc(out, '"');
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
            sbuf_putc(out, (char)c);
            i++;
            continue;
        }
        i++;
        switch (c) {
        case '"': sbuf_puts(out, "\\\""); continue;
        case '\\': sbuf_puts(out, "\\\\"); continue;
        case '\n': sbuf_puts(out, "\\n"); continue;
        case '\r': sbuf_puts(out, "\\r"); continue;
        case '\t': sbuf_puts(out, "\\t"); continue;
        case '\b': sbuf_puts(out, "\\b"); continue;
        case '\f': sbuf_puts(out, "\\f"); continue;
        }
        unsigned cp = c;
        if (c >= 0x80) i += utf8_decode(s + i - 1, n - (i - 1), &cp) - 1;
        if (cp >= 0x10000) { /* a surrogate pair, as Python writes astral characters */
            cp -= 0x10000;
            sbuf_printf(out, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
            sbuf_printf(out, "\\u%04x", cp);
        }
    }
    sbuf_putc(out, '"');
}

void srv_json_write(sbuf *out, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        int first = 1;
        sbuf_putc(out, '{');
        json_object_foreach((json_t *)v, key, val) {
            if (!first) sbuf_puts(out, ", ");
            first = 0;
            write_string(out, key, strlen(key));
            sbuf_puts(out, ": ");
            srv_json_write(out, val);
        }
        sbuf_putc(out, '}');
        break;
    }
    case JSON_ARRAY:
        sbuf_putc(out, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sbuf_puts(out, ", ");
            srv_json_write(out, json_array_get(v, i));
        }
        sbuf_putc(out, ']');
        break;
    case JSON_STRING: write_string(out, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: sbuf_printf(out, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: write_float(out, json_real_value(v)); break;
    case JSON_TRUE: sbuf_puts(out, "true"); break;
    case JSON_FALSE: sbuf_puts(out, "false"); break;
    case JSON_NULL: sbuf_puts(out, "null"); break;
    }
}

char *srv_json_dumps(const json_t *v) {
    sbuf b;
    sbuf_init(&b);
    srv_json_write(&b, v);
    if (b.oom) {
        sbuf_free(&b);
        return NULL;
    }
    return sbuf_steal(&b);
}
