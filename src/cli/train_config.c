/* train_config.c: mlx_lm.lora's YAML config for `hearth train -c` (see train_config.h). */
#include "cli/train_config.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the YAML reader ----------------------------------------------------------------- */

typedef struct yline {
    int indent, lineno;
    char *s; /* the line after its indentation, comment and trailing blanks cut */
} yline;

#define YAML_MAX_DEPTH 64 /* collections inside collections, block and flow together */

typedef struct yparser {
    yline *l;
    int n, i;
    int depth; /* block collections open now */
    char *msg;
    size_t msg_len;
    int failed;
} yparser;

static void yfail(yparser *p, int lineno, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    int k = snprintf(p->msg, p->msg_len, "line %d: ", lineno);
    if (k < 0 || (size_t)k >= p->msg_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg + k, p->msg_len - (size_t)k, fmt, ap);
    va_end(ap);
}

/* Where a quoted scalar may start: the line's start, or after ": ", "- ", "[", "{", ",". */
static int scalar_start(const char *s, const char *at) {
    while (at > s && (at[-1] == ' ' || at[-1] == '\t')) at--;
    return at == s || strchr(":-[{,", at[-1]) != NULL;
}

/* The end of the quoted scalar starting at q (its closing quote), or NULL when the line ends
 * first. */
static const char *quote_end(const char *q) {
    char c = *q;
    for (const char *t = q + 1; *t; t++) {
        if (c == '"' && *t == '\\') {
            if (!t[1]) return NULL;
            t++;
        } else if (*t == c) {
            if (c == '\'' && t[1] == '\'') {
                t++;
                continue;
            }
            return t;
        }
    }
    return NULL;
}

/* Cuts a comment (a # at the start or after a blank, outside quotes) and trailing blanks;
 * adds the line's [ { minus ] } to *depth. -1: a quote left open. */
static int clean_line(char *s, int *depth) {
    for (char *t = s; *t; t++) {
        if ((*t == '"' || *t == '\'') && scalar_start(s, t)) {
            const char *e = quote_end(t);
            if (!e) return -1;
            t = (char *)e;
        } else if (*t == '#' && (t == s || t[-1] == ' ' || t[-1] == '\t')) {
            *t = 0;
            break;
        } else if (*t == '[' || *t == '{') {
            ++*depth;
        } else if (*t == ']' || *t == '}') {
            --*depth;
        }
    }
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    return 0;
}

/* Splits text into yparser lines (blank and comment lines dropped; a flow collection left
 * open joins the lines that close it). 0 or -1 (p->msg). */
static int split_lines(yparser *p, const char *text, size_t n) {
    int lineno = 0, cap = 0;
    size_t at = 0;
    while (at < n) {
        size_t e = at;
        while (e < n && text[e] != '\n') e++;
        lineno++;
        char *s = malloc(e - at + 1);
        if (!s) return yfail(p, lineno, "out of memory"), -1;
        memcpy(s, text + at, e - at);
        s[e - at] = 0;
        at = e + 1;
        int ind = 0;
        while (s[ind] == ' ') ind++;
        if (s[ind] == '\t') {
            free(s);
            return yfail(p, lineno, "a tab in the indentation (YAML indents with spaces)"), -1;
        }
        int depth = 0;
        if (clean_line(s + ind, &depth)) {
            free(s);
            return yfail(p, lineno, "a quoted string is not closed on its line"), -1;
        }
        int first = lineno;
        /* a flow collection over several lines: join them, blank-separated */
        while (depth > 0 && at < n) {
            size_t e2 = at;
            while (e2 < n && text[e2] != '\n') e2++;
            lineno++;
            char *more = malloc(e2 - at + 1);
            if (!more) {
                free(s);
                return yfail(p, lineno, "out of memory"), -1;
            }
            memcpy(more, text + at, e2 - at);
            more[e2 - at] = 0;
            at = e2 + 1;
            char *m = more;
            while (*m == ' ' || *m == '\t') m++;
            if (clean_line(m, &depth)) {
                free(more), free(s);
                return yfail(p, lineno, "a quoted string is not closed on its line"), -1;
            }
            size_t a = strlen(s), b = strlen(m);
            char *j = realloc(s, a + b + 2);
            if (!j) {
                free(more), free(s);
                return yfail(p, lineno, "out of memory"), -1;
            }
            s = j;
            s[a] = ' ';
            memcpy(s + a + 1, m, b + 1);
            free(more);
        }
        if (depth > 0) {
            free(s);
            return yfail(p, first, "a [ or { is never closed"), -1;
        }
        const char *c = s + ind;
        if (!*c || !strcmp(c, "---") || !strncmp(c, "--- ", 4) || (ind == 0 && !strcmp(c, "..."))) {
            free(s);
            continue;
        }
        if (*c == '%') {
            free(s);
            return yfail(p, first, "YAML directives (%%) are not supported"), -1;
        }
        if (p->n == cap) {
            cap = cap ? cap * 2 : 32;
            yline *nl = realloc(p->l, (size_t)cap * sizeof *nl);
            if (!nl) {
                free(s);
                return yfail(p, first, "out of memory"), -1;
            }
            p->l = nl;
        }
        memmove(s, s + ind, strlen(s + ind) + 1);
        p->l[p->n++] = (yline){.indent = ind, .lineno = first, .s = s};
    }
    return 0;
}

/* Decodes the quoted scalar at q (closing quote at e) into a new string. */
static char *unquote(const char *q, const char *e) {
    char *out = malloc((size_t)(e - q) * 2 + 8), *w = out; /* \u escapes never grow past 6 bytes for 6 */
    if (!out) return NULL;
    for (const char *t = q + 1; t < e; t++) {
        if (*q == '\'') {
            *w++ = *t;
            if (*t == '\'') t++; /* '' is one quote */
            continue;
        }
        if (*t != '\\') {
            *w++ = *t;
            continue;
        }
        t++;
        switch (*t) {
        case 'n': *w++ = '\n'; break;
        case 't': *w++ = '\t'; break;
        case 'r': *w++ = '\r'; break;
        case '0': *w++ = '\0'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case '/': *w++ = '/'; break;
        case 'u': {
            unsigned v = 0;
            int k = 0;
            for (; k < 4 && t + 1 < e && isxdigit((unsigned char)t[1]); k++, t++)
                v = v * 16 + (unsigned)(isdigit((unsigned char)*(t + 1)) ? t[1] - '0'
                                                                         : (tolower((unsigned char)t[1]) - 'a' + 10));
            if (k < 4 || v == 0 || (v >= 0xd800 && v < 0xe000)) {
                free(out);
                return NULL;
            }
            if (v < 0x80)
                *w++ = (char)v;
            else if (v < 0x800)
                *w++ = (char)(0xc0 | v >> 6), *w++ = (char)(0x80 | (v & 63));
            else
                *w++ = (char)(0xe0 | v >> 12), *w++ = (char)(0x80 | (v >> 6 & 63)), *w++ = (char)(0x80 | (v & 63));
            break;
        }
        default: *w++ = *t; break; /* \" \\ and the rest as themselves */
        }
    }
    *w = 0;
    if (memchr(out, 0, (size_t)(w - out))) { /* a \0 inside: not a C string */
        free(out);
        return NULL;
    }
    return out;
}

static int all_of(const char *s, const char *set) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!strchr(set, *s)) return 0;
    return 1;
}

/* s without its underscores (YAML 1.1 numbers may group digits with them). */
static void strip_underscores(const char *s, char *out, size_t cap) {
    size_t w = 0;
    for (; *s && w + 1 < cap; s++)
        if (*s != '_') out[w++] = *s;
    out[w] = 0;
}

/* A float as mlx-lm's loader resolves one (PyYAML's rule plus exponents without a dot). */
static int is_float(const char *s) {
    const char *t = s;
    if (*t == '+' || *t == '-') t++;
    if (!strcmp(t, ".inf") || !strcmp(t, ".Inf") || !strcmp(t, ".INF")) return 1;
    if (t == s && (!strcmp(t, ".nan") || !strcmp(t, ".NaN") || !strcmp(t, ".NAN"))) return 1;
    int digits = 0, dot = 0;
    if (isdigit((unsigned char)*t)) {
        while (isdigit((unsigned char)*t) || *t == '_') t++;
        digits = 1;
    } else if (*t != '.' || t != s) {
        return 0;
    }
    if (*t == '.') {
        dot = 1;
        t++;
        if (!digits && !isdigit((unsigned char)*t)) return 0;
        while (isdigit((unsigned char)*t) || *t == '_') t++;
    }
    if (*t == 'e' || *t == 'E') {
        t++;
        if (*t == '+' || *t == '-')
            t++;
        else if (!digits)
            return 0; /* .5e-3 needs the sign in PyYAML's rule */
        if (!isdigit((unsigned char)*t)) return 0;
        while (isdigit((unsigned char)*t)) t++;
    } else if (!dot) {
        return 0;
    }
    return *t == 0;
}

/* A plain scalar typed as PyYAML's SafeLoader (with mlx-lm's float rule) types it. */
static json_t *plain_scalar(yparser *p, int lineno, const char *s) {
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    static const char *const trues[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const falses[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof nulls / sizeof *nulls; i++)
        if (!strcmp(s, nulls[i])) return json_null();
    for (size_t i = 0; i < sizeof trues / sizeof *trues; i++)
        if (!strcmp(s, trues[i])) return json_true();
    for (size_t i = 0; i < sizeof falses / sizeof *falses; i++)
        if (!strcmp(s, falses[i])) return json_false();
    if (*s == '&' || *s == '*' || *s == '!') {
        yfail(p, lineno, "'%.40s': YAML anchors, aliases and tags are not supported", s);
        return NULL;
    }
    if (*s == '|' || *s == '>') {
        yfail(p, lineno, "block scalars (| and >) are not supported");
        return NULL;
    }
    char b[128];
    const char *t = s + (*s == '+' || *s == '-');
    if (strlen(s) < sizeof b) {
        strip_underscores(s, b, sizeof b);
        int neg = *s == '-';
        /* ints: 0b.., 0x.., 0.. (octal), decimal */
        int base = 0;
        const char *d = b + (*b == '+' || *b == '-');
        if (t[0] == '0' && t[1] == 'b' && all_of(t + 2, "01_"))
            base = 2, d += 2;
        else if (t[0] == '0' && t[1] == 'x' && all_of(t + 2, "0123456789abcdefABCDEF_"))
            base = 16, d += 2;
        else if (t[0] == '0' && t[1] && all_of(t + 1, "01234567_"))
            base = 8, d += 1;
        else if (all_of(t, "0123456789_") && isdigit((unsigned char)*t) && (t[0] != '0' || !t[1]))
            base = 10;
        if (base && *d) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(d, &end, base);
            if (*end || errno || v > (unsigned long long)INT64_MAX) {
                yfail(p, lineno, "'%s': a whole number out of range", s);
                return NULL;
            }
            return json_integer(neg ? -(json_int_t)v : (json_int_t)v);
        }
        if (is_float(s)) {
            double v = strtod(b, NULL);
            if (!isfinite(v) || strstr(s, "inf") || strstr(s, "Inf") || strstr(s, "INF") || strstr(s, "nan") ||
                strstr(s, "NaN") || strstr(s, "NAN")) {
                yfail(p, lineno, "'%s': infinite and NaN numbers are not supported", s);
                return NULL;
            }
            return json_real(v);
        }
    }
    json_t *j = json_string(s);
    if (!j) yfail(p, lineno, "not UTF-8 text");
    return j;
}

/* ---- flow collections and scalars on one (joined) line ---- */

typedef struct flow {
    yparser *p;
    const char *s;
    int lineno, depth;
} flow;

static void fskip(flow *f) {
    while (*f->s == ' ' || *f->s == '\t') f->s++;
}

static json_t *flow_value(flow *f, int in_flow, int as_key);

/* A plain scalar inside a flow collection (in_flow) or as a whole line's value: ends at , ] }
 * (in a collection) or at ": " / ":" before an end (a key). */
static json_t *flow_plain(flow *f, int in_flow, int as_key) {
    const char *a = f->s, *t = a;
    for (; *t; t++) {
        if (in_flow && (*t == ',' || *t == ']' || *t == '}')) break;
        if (as_key && *t == ':' && (t[1] == ' ' || t[1] == 0 || (in_flow && strchr(",]}", t[1])))) break;
    }
    const char *e = t;
    while (e > a && (e[-1] == ' ' || e[-1] == '\t')) e--;
    char *s = malloc((size_t)(e - a) + 1);
    if (!s) return yfail(f->p, f->lineno, "out of memory"), NULL;
    memcpy(s, a, (size_t)(e - a));
    s[e - a] = 0;
    f->s = t;
    json_t *j = plain_scalar(f->p, f->lineno, s);
    free(s);
    return j;
}

static json_t *flow_quoted(flow *f) {
    const char *e = quote_end(f->s);
    if (!e) return yfail(f->p, f->lineno, "a quoted string is not closed"), NULL;
    char *s = unquote(f->s, e);
    if (!s) return yfail(f->p, f->lineno, "a bad escape in a quoted string"), NULL;
    f->s = e + 1;
    json_t *j = json_string(s);
    free(s);
    if (!j) yfail(f->p, f->lineno, "not UTF-8 text");
    return j;
}

static json_t *flow_seq(flow *f) {
    json_t *a = json_array();
    f->s++;
    for (;;) {
        fskip(f);
        if (*f->s == ']') {
            f->s++;
            return a;
        }
        json_t *v = flow_value(f, 1, 0);
        if (!v) break;
        json_array_append_new(a, v);
        fskip(f);
        if (*f->s == ',') {
            f->s++;
            continue;
        }
        if (*f->s == ']') continue;
        yfail(f->p, f->lineno, "expected , or ] in a [ ] list");
        break;
    }
    json_decref(a);
    return NULL;
}

static char *key_text(yparser *p, int lineno, json_t *k) {
    if (json_is_string(k)) return strdup(json_string_value(k));
    if (json_is_null(k)) return strdup("null");
    char *d = json_dumps(k, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!d) yfail(p, lineno, "out of memory");
    return d;
}

static json_t *flow_map(flow *f) {
    json_t *m = json_object();
    f->s++;
    for (;;) {
        fskip(f);
        if (*f->s == '}') {
            f->s++;
            return m;
        }
        json_t *k = flow_value(f, 1, 1);
        if (!k) break;
        if (json_is_array(k) || json_is_object(k)) {
            json_decref(k);
            yfail(f->p, f->lineno, "a list or mapping as a key is not supported");
            break;
        }
        char *ks = key_text(f->p, f->lineno, k);
        json_decref(k);
        if (!ks) break;
        fskip(f);
        json_t *v;
        if (*f->s == ':') {
            f->s++;
            fskip(f);
            v = *f->s == ',' || *f->s == '}' ? json_null() : flow_value(f, 1, 0);
        } else {
            v = json_null();
        }
        if (!v) {
            free(ks);
            break;
        }
        if (json_object_get(m, ks)) {
            yfail(f->p, f->lineno, "duplicate key '%.60s'", ks);
            free(ks), json_decref(v);
            break;
        }
        json_object_set_new(m, ks, v);
        free(ks);
        fskip(f);
        if (*f->s == ',') {
            f->s++;
            continue;
        }
        if (*f->s == '}') continue;
        yfail(f->p, f->lineno, "expected , or } in a { } mapping");
        break;
    }
    json_decref(m);
    return NULL;
}

static json_t *flow_value(flow *f, int in_flow, int as_key) {
    fskip(f);
    if (*f->s != '[' && *f->s != '{')
        return *f->s == '"' || *f->s == '\'' ? flow_quoted(f) : flow_plain(f, in_flow, as_key);
    if (++f->depth > YAML_MAX_DEPTH) return yfail(f->p, f->lineno, "nested too deeply"), NULL;
    json_t *v = *f->s == '[' ? flow_seq(f) : flow_map(f);
    f->depth--;
    return v;
}

/* A whole value written on the line after a key or a dash: all of s must be used. */
static json_t *line_value(yparser *p, int lineno, const char *s) {
    flow f = {.p = p, .s = s, .lineno = lineno, .depth = p->depth};
    json_t *v = *s == '[' || *s == '{' || *s == '"' || *s == '\'' ? flow_value(&f, 0, 0) : flow_plain(&f, 0, 0);
    if (!v) return NULL;
    fskip(&f);
    if (*f.s) {
        json_decref(v);
        yfail(p, lineno, "unexpected text after the value: '%.40s'", f.s);
        return NULL;
    }
    return v;
}

/* Whether line s is a mapping entry: its key in *key (malloc'd) and the text after ": " in
 * *rest. 0: not an entry, -1: failed. */
static int map_entry(yparser *p, int lineno, const char *s, char **key, const char **rest) {
    if ((s[0] == '-' && (s[1] == ' ' || !s[1])) || s[0] == '[' || s[0] == '{') return 0;
    if (s[0] == '?' && (s[1] == ' ' || !s[1])) return yfail(p, lineno, "complex keys (?) are not supported"), -1;
    flow f = {.p = p, .s = s, .lineno = lineno, .depth = p->depth};
    const char *t;
    if (*s == '"' || *s == '\'') {
        const char *e = quote_end(s);
        if (!e) return 0;
        t = e + 1;
        while (*t == ' ') t++;
        if (*t != ':' || (t[1] && t[1] != ' ')) return 0;
    } else {
        for (t = s; *t && !(*t == ':' && (t[1] == ' ' || !t[1])); t++) {
        }
        if (!*t) return 0;
    }
    json_t *k = flow_value(&f, 0, 1);
    if (!k) return -1;
    *key = key_text(p, lineno, k);
    json_decref(k);
    if (!*key) return -1;
    *rest = t + 1;
    while (**rest == ' ') ++*rest;
    return 1;
}

static json_t *block_node(yparser *p, int indent);

/* The value of an entry whose text after the key or dash was empty: a nested block below it,
 * a sequence at the key's own indent (mapping values only), or null. */
static json_t *nested_value(yparser *p, int indent, int allow_same_seq) {
    if (p->i < p->n) {
        const yline *nx = &p->l[p->i];
        if (nx->indent > indent) return block_node(p, nx->indent);
        if (allow_same_seq && nx->indent == indent && nx->s[0] == '-' && (nx->s[1] == ' ' || !nx->s[1]))
            return block_node(p, indent);
    }
    return json_null();
}

static json_t *block_map(yparser *p, int indent) {
    json_t *m = json_object();
    while (!p->failed && p->i < p->n && p->l[p->i].indent == indent) {
        yline *ln = &p->l[p->i];
        char *key = NULL;
        const char *rest = NULL;
        int r = map_entry(p, ln->lineno, ln->s, &key, &rest);
        if (r <= 0) {
            if (!r) yfail(p, ln->lineno, "expected 'key: value' here: '%.40s'", ln->s);
            break;
        }
        p->i++;
        json_t *v = *rest ? line_value(p, ln->lineno, rest) : nested_value(p, indent, 1);
        if (!v) {
            free(key);
            break;
        }
        if (json_object_get(m, key)) {
            yfail(p, ln->lineno, "duplicate key '%.60s'", key);
            free(key), json_decref(v);
            break;
        }
        json_object_set_new(m, key, v);
        free(key);
    }
    if (!p->failed && p->i < p->n && p->l[p->i].indent > indent) yfail(p, p->l[p->i].lineno, "unexpected indentation");
    if (p->failed) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static json_t *block_seq(yparser *p, int indent) {
    json_t *a = json_array();
    while (!p->failed && p->i < p->n && p->l[p->i].indent == indent) {
        yline *ln = &p->l[p->i];
        if (!(ln->s[0] == '-' && (ln->s[1] == ' ' || !ln->s[1]))) {
            yfail(p, ln->lineno, "expected a '- ' list item here");
            break;
        }
        const char *item = ln->s + 1;
        int off = 1;
        while (*item == ' ') item++, off++;
        json_t *v;
        if (!*item) {
            p->i++;
            v = nested_value(p, indent, 0);
        } else {
            char *key = NULL;
            const char *rest = NULL;
            int r = map_entry(p, ln->lineno, item, &key, &rest);
            free(key);
            if (r < 0) break;
            if (r > 0 || (item[0] == '-' && (item[1] == ' ' || !item[1]))) {
                /* "- key: value" or "- - x": a block starting at the item's own column */
                memmove(ln->s, item, strlen(item) + 1);
                ln->indent = indent + off;
                v = block_node(p, ln->indent);
            } else {
                p->i++;
                v = line_value(p, ln->lineno, item);
            }
        }
        if (!v) break;
        json_array_append_new(a, v);
    }
    if (!p->failed && p->i < p->n && p->l[p->i].indent > indent) yfail(p, p->l[p->i].lineno, "unexpected indentation");
    if (p->failed) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static json_t *block_node(yparser *p, int indent) {
    yline *ln = &p->l[p->i];
    char *key = NULL;
    const char *rest;
    int seq = ln->s[0] == '-' && (ln->s[1] == ' ' || !ln->s[1]);
    int r = seq ? 0 : map_entry(p, ln->lineno, ln->s, &key, &rest);
    free(key);
    if (r < 0) return NULL;
    if (seq || r > 0) {
        if (++p->depth > YAML_MAX_DEPTH) return yfail(p, ln->lineno, "nested too deeply"), NULL;
        json_t *v = seq ? block_seq(p, indent) : block_map(p, indent);
        p->depth--;
        return v;
    }
    p->i++;
    json_t *v = line_value(p, ln->lineno, ln->s);
    if (v && p->i < p->n && p->l[p->i].indent >= indent) {
        json_decref(v);
        yfail(p, p->l[p->i].lineno, "a plain value over several lines is not supported");
        return NULL;
    }
    return v;
}

json_t *yaml_parse(const char *text, size_t n, char *msg, size_t msg_len) {
    yparser p = {.msg = msg, .msg_len = msg_len};
    if (msg_len) msg[0] = 0;
    json_t *v = NULL;
    if (memchr(text, 0, n)) {
        yfail(&p, 1, "a NUL byte in the file");
    } else if (!split_lines(&p, text, n)) {
        v = p.n ? block_node(&p, p.l[0].indent) : json_null();
        if (v && p.i < p.n) {
            json_decref(v);
            v = NULL;
            yfail(&p, p.l[p.i].lineno, "unexpected text after the document's end");
        }
    }
    for (int i = 0; i < p.n; i++) free(p.l[i].s);
    free(p.l);
    if (p.failed) {
        json_decref(v);
        return NULL;
    }
    return v;
}

/* ---- mlx_lm.lora's keys into hearth_train_options ------------------------------------ */

typedef struct capply {
    char *warn, *msg;
    size_t warn_len, msg_len;
} capply;

static int cfail(capply *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->msg_len, fmt, ap);
    va_end(ap);
    return -1;
}

static void cwarn(capply *c, const char *fmt, ...) {
    size_t used = strlen(c->warn);
    if (used + 1 >= c->warn_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->warn + used, c->warn_len - used, fmt, ap);
    va_end(ap);
    used = strlen(c->warn);
    if (used + 1 < c->warn_len) c->warn[used] = '\n', c->warn[used + 1] = 0;
}

/* A whole number in [lo, hi] (an integral float too, as Python would take it), or -1 with
 * "opt_name: problem". */
static int cint(capply *c, const char *name, const json_t *v, long lo, long hi, int *out) {
    double x = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
    if (!(x >= (double)lo && x <= (double)hi) || x != floor(x))
        return cfail(c, "%s: need a whole number from %ld to %ld", name, lo, hi);
    *out = (int)x;
    return 0;
}

static int cnum(capply *c, const char *name, const json_t *v, double *out) {
    if (!json_is_number(v) || !(json_number_value(v) >= 0)) return cfail(c, "%s: need a non-negative number", name);
    *out = json_number_value(v);
    return 0;
}

static int cbool(capply *c, const char *name, const json_t *v, int *out) {
    if (!json_is_boolean(v)) return cfail(c, "%s: need true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int cstr(capply *c, const char *name, const json_t *v, const char **out) {
    if (!json_is_string(v)) return cfail(c, "%s: need a string", name);
    *out = json_string_value(v);
    return 0;
}

static int lr_schedule(capply *c, const json_t *v, hearth_train_options *o) {
    if (json_is_null(v)) {
        o->lr_schedule = NULL;
        return 0;
    }
    if (!json_is_object(v)) return cfail(c, "lr_schedule: need a mapping (name, arguments, warmup, warmup_init)");
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!strcmp(k, "name")) {
            if (cstr(c, "lr_schedule.name", x, &o->lr_schedule)) return -1;
        } else if (!strcmp(k, "arguments")) {
            size_t n = json_array_size(x);
            if (!json_is_array(x) || n < 1 || n > 3)
                return cfail(c, "lr_schedule.arguments: need a list of 1 to 3 numbers");
            for (size_t i = 0; i < n; i++) {
                const json_t *a = json_array_get(x, i);
                if (!json_is_number(a)) return cfail(c, "lr_schedule.arguments[%zu]: need a number", i);
                o->lr_schedule_args[i] = json_number_value(a);
            }
            o->n_lr_schedule_args = (int)n;
        } else if (!strcmp(k, "warmup")) {
            if (cint(c, "lr_schedule.warmup", x, 0, 1L << 30, &o->warmup)) return -1;
        } else if (!strcmp(k, "warmup_init")) {
            if (cnum(c, "lr_schedule.warmup_init", x, &o->warmup_init)) return -1;
        } else {
            return cfail(c, "lr_schedule.%s: unknown key (name, arguments, warmup, warmup_init)", k);
        }
    }
    if (!o->lr_schedule) return cfail(c, "lr_schedule: needs a name");
    if (!o->n_lr_schedule_args) return cfail(c, "lr_schedule: needs its arguments");
    return 0;
}

static int lora_parameters(capply *c, const json_t *v, hearth_train_options *o) {
    if (!json_is_object(v)) return cfail(c, "lora_parameters: need a mapping (rank, scale, dropout, keys)");
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!strcmp(k, "rank")) {
            if (cint(c, "lora_parameters.rank", x, 1, 1L << 20, &o->lora_rank)) return -1;
        } else if (!strcmp(k, "scale")) {
            if (cnum(c, "lora_parameters.scale", x, &o->lora_scale)) return -1;
        } else if (!strcmp(k, "dropout")) {
            if (!json_is_number(x) || json_number_value(x) != 0)
                return cfail(c, "lora_parameters.dropout: hearth trains without LoRA dropout (set it to 0)");
        } else if (!strcmp(k, "keys")) { /* the modules to adapt (null: every linear layer of the block) */
            size_t i;
            const json_t *e;
            o->n_lora_keys = 0;
            if (json_is_null(x)) continue;
            if (!json_is_array(x) || !json_array_size(x))
                return cfail(c, "lora_parameters.keys: need a list of module paths (e.g. [self_attn.q_proj, "
                                "self_attn.v_proj])");
            if (json_array_size(x) > HEARTH_TRAIN_MAX_KEYS)
                return cfail(c, "lora_parameters.keys: at most %d modules", HEARTH_TRAIN_MAX_KEYS);
            json_array_foreach(x, i, e) {
                if (!json_is_string(e) || !*json_string_value(e))
                    return cfail(c, "lora_parameters.keys: entry %zu is not a module path", i + 1);
                o->lora_keys[o->n_lora_keys++] = json_string_value(e);
            }
        } else {
            return cfail(c, "lora_parameters.%s: unknown key (rank, scale, dropout, keys)", k);
        }
    }
    return 0;
}

int train_config_apply(const json_t *cfg, hearth_train_options *o, const char **model, char *warn, size_t warn_len,
                       char *msg, size_t msg_len) {
    capply c = {.warn = warn, .msg = msg, .warn_len = warn_len, .msg_len = msg_len};
    if (warn_len) warn[0] = 0;
    if (msg_len) msg[0] = 0;
    if (json_is_null(cfg)) return 0; /* an empty file */
    if (!json_is_object(cfg)) return cfail(&c, "the file must be a mapping of mlx_lm.lora's options (key: value)");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)cfg, k, v) {
        int bad = 0, flag;
        if (!strcmp(k, "model")) {
            const char *m = NULL;
            bad = cstr(&c, k, v, &m);
            if (!bad && !*model) *model = m;
        } else if (!strcmp(k, "data"))
            bad = cstr(&c, k, v, &o->data);
        else if (!strcmp(k, "adapter_path"))
            bad = cstr(&c, k, v, &o->adapter_path);
        else if (!strcmp(k, "resume_adapter_file")) {
            if (json_is_null(v))
                o->resume_adapter_file = NULL;
            else
                bad = cstr(&c, k, v, &o->resume_adapter_file);
        } else if (!strcmp(k, "method"))
            bad = cstr(&c, k, v, &o->method); /* hearth's own, as --method */
        else if (!strcmp(k, "optimizer"))
            bad = cstr(&c, k, v, &o->optimizer);
        else if (!strcmp(k, "optimizer_config")) { /* read once the optimizer is known: train_config_optimizer */
            if (!json_is_object(v)) bad = cfail(&c, "optimizer_config: need a mapping of optimizer names");
        } else if (!strcmp(k, "fine_tune_type")) {
            const char *t = NULL;
            bad = cstr(&c, k, v, &t);
            if (!bad && strcmp(t, "lora") && strcmp(t, "dora"))
                bad = cfail(&c, "fine_tune_type: %s is not supported (hearth trains lora or dora adapters)", t);
            if (!bad) o->dora = !strcmp(t, "dora");
        } else if (!strcmp(k, "iters"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->iters);
        else if (!strcmp(k, "batch_size"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->batch_size);
        else if (!strcmp(k, "max_seq_length"))
            bad = cint(&c, k, v, 2, 1L << 30, &o->max_seq_length);
        else if (!strcmp(k, "steps_per_report"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->steps_per_report);
        else if (!strcmp(k, "steps_per_eval"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->steps_per_eval);
        else if (!strcmp(k, "save_every"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->save_every);
        else if (!strcmp(k, "grad_accumulation_steps"))
            bad = cint(&c, k, v, 1, 1L << 30, &o->grad_accumulation_steps);
        else if (!strcmp(k, "threads"))
            bad = cint(&c, k, v, 1, 4096, &o->threads);
        else if (!strcmp(k, "num_layers") || !strcmp(k, "val_batches")) {
            int *dst = k[0] == 'n' ? &o->num_layers : &o->val_batches;
            if (json_is_integer(v) && json_integer_value(v) == -1)
                *dst = -1;
            else
                bad = cint(&c, k, v, 1, 1L << 30, dst);
        } else if (!strcmp(k, "seed")) {
            bad = cint(&c, k, v, 0, 1L << 30, &flag);
            o->seed = (unsigned long long)flag;
        } else if (!strcmp(k, "learning_rate"))
            bad = cnum(&c, k, v, &o->learning_rate);
        else if (!strcmp(k, "beta"))
            bad = cnum(&c, k, v, &o->beta);
        else if (!strcmp(k, "lambda"))
            bad = cnum(&c, k, v, &o->orpo_lambda);
        else if (!strcmp(k, "mask_prompt"))
            bad = cbool(&c, k, v, &o->mask_prompt);
        else if (!strcmp(k, "grad_checkpoint"))
            bad = cbool(&c, k, v, &o->grad_checkpoint);
        else if (!strcmp(k, "lr_schedule"))
            bad = lr_schedule(&c, v, o);
        else if (!strcmp(k, "lora_parameters"))
            bad = lora_parameters(&c, v, o);
        else if (!strcmp(k, "train")) {
            if (json_is_false(v)) cwarn(&c, "train: false is ignored (hearth train always trains)");
        } else if (!strcmp(k, "test")) {
            if (json_is_true(v)) cwarn(&c, "test: true is ignored (hearth train has no test-set pass)");
        } else if (!strcmp(k, "report_to") || !strcmp(k, "project_name")) {
            if (!json_is_null(v)) cwarn(&c, "%s: ignored (hearth train logs to metrics.jsonl: hearth train-watch)", k);
        } else if (strcmp(k, "test_batches") && strcmp(k, "config") && strcmp(k, "clear_cache_threshold") &&
                   strcmp(k, "trust_remote_code") && strcmp(k, "wandb")) {
            cwarn(&c, "%s: unknown key, ignored", k);
        }
        if (bad) return -1;
    }
    return 0;
}

int train_config_optimizer(const json_t *cfg, hearth_train_options *o, char *msg, size_t msg_len) {
    capply c = {.msg = msg, .msg_len = msg_len};
    const json_t *oc = json_object_get(cfg, "optimizer_config");
    const char *name = o->optimizer ? o->optimizer : "adam";
    const json_t *mine = json_object_get(oc, name);
    if (!mine || json_is_null(mine)) return 0;
    if (!json_is_object(mine)) return cfail(&c, "optimizer_config.%s: need a mapping", name);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)mine, k, v) {
        if (!strcmp(k, "weight_decay")) {
            double wd = 0;
            if (cnum(&c, "optimizer_config.weight_decay", v, &wd)) return -1;
            if (o->weight_decay < 0) o->weight_decay = wd; /* --weight-decay on the command line wins */
        } else {
            return cfail(&c,
                         "optimizer_config.%s.%s: not supported (hearth takes weight_decay; Adam's betas are "
                         "0.9, 0.999 and eps 1e-8, as MLX's defaults)",
                         name, k);
        }
    }
    return 0;
}
