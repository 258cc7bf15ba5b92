/* value.c: the render arena and template values — construction from JSON, Python
 * truthiness/equality/ordering, str()/repr() printing and json.dumps, all matching
 * CPython's output byte for byte. Must not know about the AST or the evaluator. */
#include "tok/template/tpl_int.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct tpl_chunk {
    tpl_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void *tpl_alloc(tpl_state *st, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tpl_arena *a = &st->arena;
    if (n > TPL_MAX_ARENA || a->used + n > TPL_MAX_ARENA) tpl_fail(st, 0, "template used more than %zu MiB of memory", TPL_MAX_ARENA >> 20);
    tpl_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > (64 << 10) ? n : (64 << 10);
        c = malloc(sizeof *c + size);
        if (!c) tpl_fail(st, 0, "out of memory");
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used = 0;
}

void tpl_fail(tpl_state *st, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) err_set(st->err, HEARTH_ERR_TEMPLATE, "chat template line %d: %s", line, msg);
    else err_set(st->err, HEARTH_ERR_TEMPLATE, "chat template: %s", msg);
    longjmp(st->fail, 1);
}

const char *tpl_strdup(tpl_state *st, const char *s, size_t n) {
    char *p = tpl_alloc(st, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

tpl_val tv_undef(const char *why) { return (tpl_val){.kind = TV_UNDEF, .u.s = why}; }
tpl_val tv_none(void) { return (tpl_val){.kind = TV_NONE}; }
tpl_val tv_bool(int b) { return (tpl_val){.kind = TV_BOOL, .u.b = !!b}; }
tpl_val tv_int(int64_t i) { return (tpl_val){.kind = TV_INT, .u.i = i}; }
tpl_val tv_float(double f) { return (tpl_val){.kind = TV_FLOAT, .u.f = f}; }
tpl_val tv_str(tpl_state *st, const char *s, size_t n) { return (tpl_val){.kind = TV_STR, .n = n, .u.s = tpl_strdup(st, s, n)}; }
tpl_val tv_cstr(const char *s) { return (tpl_val){.kind = TV_STR, .n = strlen(s), .u.s = s}; }

tpl_val tv_list(tpl_state *st, size_t cap) {
    tpl_list *l = tpl_alloc(st, sizeof *l);
    memset(l, 0, sizeof *l);
    if (cap) { l->items = tpl_alloc(st, cap * sizeof(tpl_val)); l->cap = cap; }
    return (tpl_val){.kind = TV_LIST, .u.l = l};
}
tpl_val tv_dict(tpl_state *st, size_t cap) {
    tpl_dict *d = tpl_alloc(st, sizeof *d);
    memset(d, 0, sizeof *d);
    if (cap) {
        d->keys = tpl_alloc(st, cap * sizeof(tpl_val));
        d->vals = tpl_alloc(st, cap * sizeof(tpl_val));
        d->cap = cap;
    }
    return (tpl_val){.kind = TV_DICT, .u.d = d};
}

void tv_list_push(tpl_state *st, tpl_list *l, tpl_val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tpl_val *it = tpl_alloc(st, cap * sizeof *it);
        if (l->n) memcpy(it, l->items, l->n * sizeof *it);
        l->items = it;
        l->cap = cap;
    }
    l->items[l->n++] = v;
}

tpl_val *tv_dict_find(tpl_dict *d, tpl_val k) {
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(d->keys[i], k)) return &d->vals[i];
    return NULL;
}
tpl_val *tv_dict_find_str(tpl_dict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].kind == TV_STR && d->keys[i].n == n && !memcmp(d->keys[i].u.s, s, n)) return &d->vals[i];
    return NULL;
}

void tv_dict_set(tpl_state *st, tpl_dict *d, tpl_val k, tpl_val v) {
    tpl_val *slot = tv_dict_find(d, k);
    if (slot) { *slot = v; return; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        tpl_val *nk = tpl_alloc(st, cap * sizeof *nk), *nv = tpl_alloc(st, cap * sizeof *nv);
        if (d->n) { memcpy(nk, d->keys, d->n * sizeof *nk); memcpy(nv, d->vals, d->n * sizeof *nv); }
        d->keys = nk;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n++] = v;
}

tpl_val tv_from_json(tpl_state *st, const json_t *j, int depth) {
    if (depth > TPL_MAX_DEPTH) tpl_fail(st, 0, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tpl_val d = tv_dict(st, json_object_size(j));
        const char *k;
        json_t *v;
        /* jansson keeps insertion order, which is the order Python's dict has */
        json_object_foreach((json_t *)j, k, v) {
            tv_dict_set(st, d.u.d, tv_str(st, k, strlen(k)), tv_from_json(st, v, depth + 1));
        }
        return d;
    }
    case JSON_ARRAY: {
        tpl_val l = tv_list(st, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) tv_list_push(st, l.u.l, tv_from_json(st, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING: return tv_str(st, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_TRUE: return tv_bool(1);
    case JSON_FALSE: return tv_bool(0);
    default: return tv_none();
    }
}

int tv_truthy(tpl_val v) {
    switch (v.kind) {
    case TV_UNDEF: case TV_NONE: return 0;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.n != 0;
    case TV_LIST: return v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(tpl_val v) { return v.kind == TV_BOOL || v.kind == TV_INT || v.kind == TV_FLOAT; }
static double num_f(tpl_val v) { return v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t num_i(tpl_val v) { return v.kind == TV_INT ? v.u.i : v.u.b; }

int tv_equal(tpl_val a, tpl_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.kind == TV_FLOAT || b.kind == TV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.kind == TV_NS && b.kind == TV_NS) return a.u.d == b.u.d;
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR: return a.n == b.n && !memcmp(a.u.s, b.u.s, a.n);
    case TV_LIST:
        if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tv_equal(a.u.l->items[i], b.u.l->items[i])) return 0;
        return 1;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tpl_val *o = tv_dict_find(b.u.d, a.u.d->keys[i]);
            if (!o || !tv_equal(a.u.d->vals[i], *o)) return 0;
        }
        return 1;
    case TV_MACRO: return a.u.m == b.u.m;
    case TV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

const char *tv_type_name(tpl_val v) {
    switch (v.kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.u.l->is_tuple ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return "function";
    case TV_METHOD: return "builtin_function_or_method";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

int tv_compare(tpl_state *st, int line, tpl_val a, tpl_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.kind == TV_FLOAT || b.kind == TV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == TV_STR && b.kind == TV_STR) {
        /* UTF-8 byte order equals code point order */
        size_t n = a.n < b.n ? a.n : b.n;
        int c = memcmp(a.u.s, b.u.s, n);
        if (c) return c < 0 ? -1 : 1;
        return a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
    }
    if (a.kind == TV_LIST && b.kind == TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return tv_compare(st, line, a.u.l->items[i], b.u.l->items[i]);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
    }
    tpl_fail(st, line, "'<' not supported between instances of '%s' and '%s'", tv_type_name(a), tv_type_name(b));
}

/* CPython float repr: shortest digits that round-trip, fixed notation for
 * exponents in [-4, 16), otherwise d.ddde+XX. */
void tv_float_repr(sbuf *b, double f) {
    if (isnan(f)) { sbuf_puts(b, "nan"); return; }
    if (isinf(f)) { sbuf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* split "-d.ddde±xx" into sign, digits, exponent */
    char digits[32];
    int nd = 0, neg = 0, exp10;
    const char *p = buf;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) sbuf_putc(b, '-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            sbuf_puts(b, "0.");
            for (int i = 0; i < -exp10 - 1; i++) sbuf_putc(b, '0');
            sbuf_puts(b, digits);
        } else {
            for (int i = 0; i <= exp10; i++) sbuf_putc(b, i < nd ? digits[i] : '0');
            sbuf_putc(b, '.');
            if (nd > exp10 + 1) sbuf_puts(b, digits + exp10 + 1);
            else sbuf_putc(b, '0');
        }
    } else {
        sbuf_putc(b, digits[0]);
        if (nd > 1) { sbuf_putc(b, '.'); sbuf_puts(b, digits + 1); }
        sbuf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { cp = (unsigned char)s[*i]; k = 1; }
    *i += (size_t)k;
    return cp;
}

static int py_printable(int32_t cp) {
    if (cp == ' ') return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

static void str_repr(sbuf *b, const char *s, size_t n) {
    char q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n)) q = '"';
    sbuf_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t start = i;
        int32_t cp = next_cp(s, n, &i);
        if (cp == q || cp == '\\') { sbuf_putc(b, '\\'); sbuf_putc(b, (char)cp); }
        else if (cp == '\t') sbuf_puts(b, "\\t");
        else if (cp == '\n') sbuf_puts(b, "\\n");
        else if (cp == '\r') sbuf_puts(b, "\\r");
        else if (cp < 0x20 || cp == 0x7f) sbuf_printf(b, "\\x%02x", cp);
        else if (cp < 0x80 || py_printable(cp)) sbuf_append(b, s + start, i - start);
        else if (cp < 0x100) sbuf_printf(b, "\\x%02x", cp);
        else if (cp < 0x10000) sbuf_printf(b, "\\u%04x", cp);
        else sbuf_printf(b, "\\U%08x", cp);
    }
    sbuf_putc(b, q);
}

static void repr_depth(tpl_state *st, sbuf *b, tpl_val v, int depth);

static void str_depth(tpl_state *st, sbuf *b, tpl_val v, int depth) {
    switch (v.kind) {
    case TV_UNDEF: return;
    case TV_NONE: sbuf_puts(b, "None"); return;
    case TV_BOOL: sbuf_puts(b, v.u.b ? "True" : "False"); return;
    case TV_INT: sbuf_printf(b, "%lld", (long long)v.u.i); return;
    case TV_FLOAT: tv_float_repr(b, v.u.f); return;
    case TV_STR: sbuf_append(b, v.u.s, v.n); return;
    default: repr_depth(st, b, v, depth);
    }
}

static void repr_depth(tpl_state *st, sbuf *b, tpl_val v, int depth) {
    if (depth > TPL_MAX_DEPTH) tpl_fail(st, 0, "value nested too deeply to print");
    switch (v.kind) {
    case TV_STR: str_repr(b, v.u.s, v.n); return;
    case TV_UNDEF: sbuf_puts(b, "Undefined"); return;
    case TV_LIST: {
        int tup = v.u.l->is_tuple;
        sbuf_putc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sbuf_puts(b, ", ");
            repr_depth(st, b, v.u.l->items[i], depth + 1);
        }
        if (tup && v.u.l->n == 1) sbuf_putc(b, ',');
        sbuf_putc(b, tup ? ')' : ']');
        return;
    }
    case TV_DICT: case TV_NS: {
        if (v.kind == TV_NS) sbuf_puts(b, "<Namespace ");
        sbuf_putc(b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sbuf_puts(b, ", ");
            repr_depth(st, b, v.u.d->keys[i], depth + 1);
            sbuf_puts(b, ": ");
            repr_depth(st, b, v.u.d->vals[i], depth + 1);
        }
        sbuf_putc(b, '}');
        if (v.kind == TV_NS) sbuf_putc(b, '>');
        return;
    }
    case TV_MACRO: sbuf_puts(b, "<Macro>"); return;
    case TV_FUNC: sbuf_puts(b, "<function>"); return;
    case TV_METHOD: sbuf_printf(b, "<built-in method %s>", v.u.meth->name); return;
    case TV_LOOP: sbuf_puts(b, "<LoopContext>"); return;
    default: str_depth(st, b, v, depth);
    }
}

void tv_to_str(tpl_state *st, sbuf *b, tpl_val v) { str_depth(st, b, v, 0); }
void tv_repr(tpl_state *st, sbuf *b, tpl_val v) { repr_depth(st, b, v, 0); }

sbuf *tpl_tmp_begin(tpl_state *st) {
    if (st->n_temps == TPL_MAX_TEMPS) tpl_fail(st, 0, "template nested too deeply");
    sbuf *b = tpl_alloc(st, sizeof *b);
    sbuf_init(b);
    st->temps[st->n_temps++] = b;
    return b;
}

void tpl_tmp_end(tpl_state *st, sbuf *b) {
    for (int i = st->n_temps - 1; i >= 0; i--)
        if (st->temps[i] == b) {
            memmove(&st->temps[i], &st->temps[i + 1], (size_t)(st->n_temps - i - 1) * sizeof(sbuf *));
            st->n_temps--;
            break;
        }
    sbuf_free(b);
}

tpl_val tpl_tmp_finish(tpl_state *st, sbuf *b) {
    if (b->oom) tpl_fail(st, 0, "out of memory");
    if (b->len > TPL_MAX_OUTPUT) tpl_fail(st, 0, "string longer than %zu MiB", TPL_MAX_OUTPUT >> 20);
    tpl_val r = tv_str(st, b->data ? b->data : "", b->len);
    tpl_tmp_end(st, b);
    return r;
}

tpl_val tv_stringify(tpl_state *st, tpl_val v) {
    if (v.kind == TV_STR) return v;
    sbuf *b = tpl_tmp_begin(st);
    tv_to_str(st, b, v);
    return tpl_tmp_finish(st, b);
}

static void json_str(sbuf *b, const char *s, size_t n) {
    sbuf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': sbuf_puts(b, "\\\""); break;
        case '\\': sbuf_puts(b, "\\\\"); break;
        case '\n': sbuf_puts(b, "\\n"); break;
        case '\r': sbuf_puts(b, "\\r"); break;
        case '\t': sbuf_puts(b, "\\t"); break;
        case '\b': sbuf_puts(b, "\\b"); break;
        case '\f': sbuf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) sbuf_printf(b, "\\u%04x", c);
            else sbuf_putc(b, (char)c);
        }
    }
    sbuf_putc(b, '"');
}

static void json_newline(sbuf *b, const char *indent, int level) {
    sbuf_putc(b, '\n');
    for (int i = 0; i < level; i++) sbuf_puts(b, indent);
}

/* json.dumps encodes dict keys that are not strings as their JSON scalar text */
static int json_key(tpl_state *st, sbuf *b, tpl_val k) {
    sbuf t;
    sbuf_init(&t);
    switch (k.kind) {
    case TV_STR: json_str(b, k.u.s, k.n); return 1;
    case TV_INT: sbuf_printf(&t, "%lld", (long long)k.u.i); break;
    case TV_FLOAT:
        if (isnan(k.u.f)) sbuf_puts(&t, "NaN");
        else if (isinf(k.u.f)) sbuf_puts(&t, k.u.f < 0 ? "-Infinity" : "Infinity");
        else tv_float_repr(&t, k.u.f);
        break;
    case TV_BOOL: sbuf_puts(&t, k.u.b ? "true" : "false"); break;
    case TV_NONE: sbuf_puts(&t, "null"); break;
    default: sbuf_free(&t); return 0;
    }
    json_str(b, t.data, t.len);
    sbuf_free(&t);
    return 1;
}

int tv_tojson(tpl_state *st, sbuf *b, tpl_val v, const char *indent, int has_indent, const char *item_sep,
              const char *key_sep, int sort_keys, int level) {
    if (level > TPL_MAX_DEPTH) tpl_fail(st, 0, "value nested too deeply for tojson");
    switch (v.kind) {
    case TV_NONE: sbuf_puts(b, "null"); return 1;
    case TV_BOOL: sbuf_puts(b, v.u.b ? "true" : "false"); return 1;
    case TV_INT: sbuf_printf(b, "%lld", (long long)v.u.i); return 1;
    case TV_FLOAT:
        if (isnan(v.u.f)) sbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) sbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else tv_float_repr(b, v.u.f);
        return 1;
    case TV_STR: json_str(b, v.u.s, v.n); return 1;
    case TV_LIST: {
        tpl_list *l = v.u.l;
        if (!l->n) { sbuf_puts(b, "[]"); return 1; }
        sbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) sbuf_puts(b, item_sep);
            if (has_indent) json_newline(b, indent, level + 1);
            if (!tv_tojson(st, b, l->items[i], indent, has_indent, item_sep, key_sep, sort_keys, level + 1)) return 0;
        }
        if (has_indent) json_newline(b, indent, level);
        sbuf_putc(b, ']');
        return 1;
    }
    case TV_DICT: {
        tpl_dict *d = v.u.d;
        if (!d->n) { sbuf_puts(b, "{}"); return 1; }
        size_t *order = tpl_alloc(st, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) {
            /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < d->n; i++) {
                size_t k = order[i], j = i;
                while (j > 0 && tv_compare(st, 0, d->keys[order[j - 1]], d->keys[k]) > 0) { order[j] = order[j - 1]; j--; }
                order[j] = k;
            }
        }
        sbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) sbuf_puts(b, item_sep);
            if (has_indent) json_newline(b, indent, level + 1);
            if (!json_key(st, b, d->keys[order[i]])) return 0;
            sbuf_puts(b, key_sep);
            if (!tv_tojson(st, b, d->vals[order[i]], indent, has_indent, item_sep, key_sep, sort_keys, level + 1)) return 0;
        }
        if (has_indent) json_newline(b, indent, level);
        sbuf_putc(b, '}');
        return 1;
    }
    default: return 0;
    }
}

int tv_is_seq(tpl_val v) { return v.kind == TV_LIST || v.kind == TV_STR || v.kind == TV_DICT; }

size_t tpl_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n;) { next_cp(s, n, &i); k++; }
    return k;
}

size_t tpl_utf8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0;
    while (ci-- && i < n) next_cp(s, n, &i);
    return i;
}

tpl_list *tv_iter(tpl_state *st, int line, tpl_val v) {
    switch (v.kind) {
    case TV_LIST: return v.u.l;
    case TV_UNDEF: return tv_list(st, 0).u.l;
    case TV_DICT: {
        tpl_val l = tv_list(st, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) tv_list_push(st, l.u.l, v.u.d->keys[i]);
        return l.u.l;
    }
    case TV_STR: {
        tpl_val l = tv_list(st, v.n);
        for (size_t i = 0; i < v.n;) {
            size_t s = i;
            next_cp(v.u.s, v.n, &i);
            tv_list_push(st, l.u.l, (tpl_val){.kind = TV_STR, .n = i - s, .u.s = v.u.s + s});
        }
        return l.u.l;
    }
    default: tpl_fail(st, line, "'%s' object is not iterable", tv_type_name(v));
    }
}
