/* filters.c: jinja2's builtin filters and tests that chat templates use, with
 * transformers' tojson override (json.dumps, ensure_ascii=False). Unknown names are
 * rejected at parse time via tpl_filter_exists/tpl_test_exists; must not parse. */
#include "tok/template/tpl_int.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fargs {
    tpl_state *st;
    int line;
    const char *name;
    tpl_val *args;
    size_t n_args;
    const char **kwn;
    tpl_val *kwv;
    size_t n_kw;
} fargs;

/* argument idx (0-based, after the filtered value) or keyword kw, else def */
static tpl_val arg(fargs *a, size_t idx, const char *kw, tpl_val def) {
    if (idx < a->n_args) return a->args[idx];
    for (size_t i = 0; i < a->n_kw; i++)
        if (kw && !strcmp(a->kwn[i], kw)) return a->kwv[i];
    return def;
}

static void check_args(fargs *a, size_t max_pos, const char *const *kws) {
    if (a->n_args > max_pos) tpl_fail(a->st, a->line, "filter '%s' got too many arguments", a->name);
    for (size_t i = 0; i < a->n_kw; i++) {
        int ok = 0;
        for (const char *const *k = kws; k && *k; k++)
            if (!strcmp(*k, a->kwn[i])) ok = 1;
        if (!ok) tpl_fail(a->st, a->line, "filter '%s' got an unexpected keyword argument '%s'", a->name, a->kwn[i]);
    }
}

static tpl_val need_str(fargs *a, tpl_val v) {
    if (v.kind == TV_UNDEF) return tv_cstr("");
    return tv_stringify(a->st, v);
}

static int64_t need_int(fargs *a, tpl_val v, const char *what) {
    if (v.kind == TV_INT) return v.u.i;
    if (v.kind == TV_BOOL) return v.u.b;
    tpl_fail(a->st, a->line, "filter '%s': %s must be an integer, got %s", a->name, what, tv_type_name(v));
}

static size_t py_len(tpl_state *st, int line, tpl_val v) {
    switch (v.kind) {
    case TV_STR: return tpl_utf8_len(v.u.s, v.n);
    case TV_LIST: return v.u.l->n;
    case TV_DICT: return v.u.d->n;
    case TV_UNDEF: return 0;
    default: tpl_fail(st, line, "object of type '%s' has no len()", tv_type_name(v));
    }
}

/* attribute lookup for selectattr/map/sort: dotted paths, integer parts index */
static tpl_val attr_path(fargs *a, tpl_val v, tpl_val attr) {
    if (attr.kind == TV_INT) return tpl_getitem(a->st, a->line, v, attr);
    tpl_val s = tv_stringify(a->st, attr);
    size_t start = 0;
    for (size_t i = 0; i <= s.n; i++) {
        if (i < s.n && s.u.s[i] != '.') continue;
        const char *part = s.u.s + start;
        size_t n = i - start;
        char *end;
        char buf[32];
        int is_int = n > 0 && n < sizeof buf;
        if (is_int) {
            memcpy(buf, part, n);
            buf[n] = 0;
            strtoll(buf, &end, 10);
            is_int = *end == 0 && (buf[0] >= '0' && buf[0] <= '9');
        }
        if (v.kind == TV_UNDEF) return v;
        /* environment.getitem: item first, then attribute */
        v = is_int ? tpl_getitem(a->st, a->line, v, tv_int(strtoll(buf, NULL, 10)))
                   : tpl_getitem(a->st, a->line, v, tv_str(a->st, part, n));
        start = i + 1;
    }
    return v;
}

static tpl_val lower_if_str(fargs *a, tpl_val v) { return v.kind == TV_STR ? tpl_str_case(a->st, v, 0) : v; }

/* stable merge sort of items by key (case-insensitive on strings unless cs) */
static void sort_vals(fargs *a, tpl_val *items, tpl_val *keys, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_vals(a, items, keys, h, reverse);
    sort_vals(a, items + h, keys + h, n - h, reverse);
    tpl_val *ti = tpl_alloc(a->st, n * sizeof *ti), *tk = tpl_alloc(a->st, n * sizeof *tk);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = tv_compare(a->st, a->line, keys[j], keys[i]);
        int take_right = reverse ? c > 0 : c < 0;
        if (take_right) { ti[k] = items[j]; tk[k++] = keys[j++]; }
        else { ti[k] = items[i]; tk[k++] = keys[i++]; }
    }
    while (i < h) { ti[k] = items[i]; tk[k++] = keys[i++]; }
    while (j < n) { ti[k] = items[j]; tk[k++] = keys[j++]; }
    memcpy(items, ti, n * sizeof *ti);
    memcpy(keys, tk, n * sizeof *tk);
}

static tpl_val copy_list(tpl_state *st, tpl_list *src) {
    tpl_val l = tv_list(st, src->n);
    for (size_t i = 0; i < src->n; i++) tv_list_push(st, l.u.l, src->items[i]);
    return l;
}

static void json_ascii(sbuf *out, const char *s, size_t n) {
    /* re-escape non-ASCII as \uXXXX (surrogate pairs above the BMP) like ensure_ascii=True */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) { sbuf_putc(out, (char)c); i++; continue; }
        uint32_t cp;
        int k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (i + (size_t)k > n) { i++; continue; }
        cp = c & (k == 4 ? 7 : k == 3 ? 15 : 31);
        for (int j = 1; j < k; j++) cp = (cp << 6) | ((unsigned char)s[i + j] & 63);
        i += (size_t)k;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            sbuf_printf(out, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else
            sbuf_printf(out, "\\u%04x", cp);
    }
}

static tpl_val f_tojson(fargs *a, tpl_val v) {
    static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    check_args(a, 4, kws);
    int ascii = tv_truthy(arg(a, 0, "ensure_ascii", tv_bool(0)));
    tpl_val indent = arg(a, 1, "indent", tv_none());
    tpl_val seps = arg(a, 2, "separators", tv_none());
    int sort_keys = tv_truthy(arg(a, 3, "sort_keys", tv_bool(0)));
    const char *ind = "", *item_sep = ", ", *key_sep = ": ";
    int has_indent = 0;
    if (indent.kind == TV_INT || indent.kind == TV_BOOL) {
        int64_t w = indent.kind == TV_INT ? indent.u.i : indent.u.b;
        if (w > 1024) tpl_fail(a->st, a->line, "tojson: indent too large");
        char *sp = tpl_alloc(a->st, (size_t)(w > 0 ? w : 0) + 1);
        for (int64_t i = 0; i < w; i++) sp[i] = ' ';
        sp[w > 0 ? w : 0] = 0;
        ind = sp;
        has_indent = 1;
    } else if (indent.kind == TV_STR) {
        ind = tpl_strdup(a->st, indent.u.s, indent.n);
        has_indent = 1;
    } else if (indent.kind != TV_NONE && indent.kind != TV_UNDEF)
        tpl_fail(a->st, a->line, "tojson: indent must be an integer or string");
    if (has_indent) item_sep = ",";
    if (seps.kind == TV_LIST) {
        if (seps.u.l->n != 2 || seps.u.l->items[0].kind != TV_STR || seps.u.l->items[1].kind != TV_STR)
            tpl_fail(a->st, a->line, "tojson: separators must be two strings");
        item_sep = tpl_strdup(a->st, seps.u.l->items[0].u.s, seps.u.l->items[0].n);
        key_sep = tpl_strdup(a->st, seps.u.l->items[1].u.s, seps.u.l->items[1].n);
    } else if (seps.kind != TV_NONE && seps.kind != TV_UNDEF)
        tpl_fail(a->st, a->line, "tojson: separators must be a pair of strings");
    sbuf *b = tpl_tmp_begin(a->st);
    if (!tv_tojson(a->st, b, v, ind, has_indent, item_sep, key_sep, sort_keys, 0))
        tpl_fail(a->st, a->line, "Object of type %s is not JSON serializable", tv_type_name(v));
    if (ascii) {
        sbuf *c = tpl_tmp_begin(a->st);
        json_ascii(c, b->data ? b->data : "", b->len);
        tpl_tmp_end(a->st, b);
        return tpl_tmp_finish(a->st, c);
    }
    return tpl_tmp_finish(a->st, b);
}

static int is_line_break(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') { *len = i + 1 < n && s[i + 1] == '\n' ? 2 : 1; return 1; }
    if (c == '\n' || c == 11 || c == 12 || (c >= 0x1c && c <= 0x1e)) { *len = 1; return 1; }
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) { *len = 2; return 1; }
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 && ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9)) {
        *len = 3;
        return 1;
    }
    return 0;
}

/* Python str.splitlines() */
tpl_val tpl_splitlines(tpl_state *st, tpl_val s) {
    tpl_val l = tv_list(st, 0);
    size_t start = 0, len;
    for (size_t i = 0; i < s.n;) {
        if (is_line_break(s.u.s, s.n, i, &len)) {
            tv_list_push(st, l.u.l, (tpl_val){.kind = TV_STR, .n = i - start, .u.s = s.u.s + start});
            i += len;
            start = i;
        } else
            i++;
    }
    if (start < s.n) tv_list_push(st, l.u.l, (tpl_val){.kind = TV_STR, .n = s.n - start, .u.s = s.u.s + start});
    return l;
}

static tpl_val f_indent(fargs *a, tpl_val v) {
    static const char *const kws[] = {"width", "first", "blank", NULL};
    check_args(a, 3, kws);
    tpl_val w = arg(a, 0, "width", tv_int(4));
    int first = tv_truthy(arg(a, 1, "first", tv_bool(0))), blank = tv_truthy(arg(a, 2, "blank", tv_bool(0)));
    tpl_val ind;
    if (w.kind == TV_STR) ind = w;
    else {
        int64_t n = need_int(a, w, "width");
        if (n > 4096) tpl_fail(a->st, a->line, "indent width too large");
        char *sp = tpl_alloc(a->st, (size_t)(n > 0 ? n : 0) + 1);
        memset(sp, ' ', (size_t)(n > 0 ? n : 0));
        ind = (tpl_val){.kind = TV_STR, .n = (size_t)(n > 0 ? n : 0), .u.s = sp};
    }
    /* jinja appends "\n" with +=, which only strings survive */
    if (v.kind != TV_STR) tpl_fail(a->st, a->line, "indent: unsupported operand type(s) for +=: '%s' and 'str'", tv_type_name(v));
    tpl_val s = v;
    sbuf *t = tpl_tmp_begin(a->st);
    sbuf_append(t, s.u.s, s.n);
    sbuf_putc(t, '\n'); /* jinja appends a newline before splitting, deliberately */
    tpl_val lines = tpl_splitlines(a->st, tpl_tmp_finish(a->st, t));
    tpl_list *l = lines.u.l;
    sbuf *o = tpl_tmp_begin(a->st);
    if (first) sbuf_append(o, ind.u.s, ind.n);
    for (size_t i = 0; i < l->n; i++) {
        if (i) {
            sbuf_putc(o, '\n');
            if (blank || l->items[i].n) sbuf_append(o, ind.u.s, ind.n);
        }
        sbuf_append(o, l->items[i].u.s, l->items[i].n);
    }
    return tpl_tmp_finish(a->st, o);
}

static tpl_val f_round(fargs *a, tpl_val v) {
    static const char *const kws[] = {"precision", "method", NULL};
    check_args(a, 2, kws);
    int64_t prec = need_int(a, arg(a, 0, "precision", tv_int(0)), "precision");
    tpl_val method = arg(a, 1, "method", tv_cstr("common"));
    if (v.kind != TV_INT && v.kind != TV_FLOAT && v.kind != TV_BOOL) tpl_fail(a->st, a->line, "round: value must be a number");
    double x = v.kind == TV_FLOAT ? v.u.f : (double)(v.kind == TV_INT ? v.u.i : v.u.b);
    if (method.kind != TV_STR) tpl_fail(a->st, a->line, "round: method must be common, ceil or floor");
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    if (method.n == 6 && !memcmp(method.u.s, "common", 6)) {
        if (v.kind != TV_FLOAT) {
            /* Python's round(int, n) stays an int; n < 0 rounds half to even */
            int64_t i = v.kind == TV_INT ? v.u.i : v.u.b;
            if (prec >= 0) return tv_int(i);
            if (prec < -18) return tv_int(0);
            int64_t p = 1;
            for (int64_t k = 0; k < -prec; k++) p *= 10;
            int64_t q = i / p, r = i % p;
            if (r < 0) { q--; r += p; }
            if (r * 2 > p || (r * 2 == p && (q & 1))) q++;
            int64_t out;
            if (__builtin_mul_overflow(q, p, &out)) tpl_fail(a->st, a->line, "integer overflow in round");
            return tv_int(out);
        }
        if (!isfinite(x)) return tv_float(x);
        if (prec >= 0) {
            /* printf rounds the exact binary value half-to-even, as CPython's round() does */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            return tv_float(strtod(buf, NULL));
        }
        double p = pow(10.0, (double)-prec), y = x / p, r = nearbyint(y);
        return tv_float(r * p);
    }
    double p = pow(10.0, (double)prec);
    if (method.n == 4 && !memcmp(method.u.s, "ceil", 4)) return tv_float(ceil(x * p) / p);
    if (method.n == 5 && !memcmp(method.u.s, "floor", 5)) return tv_float(floor(x * p) / p);
    tpl_fail(a->st, a->line, "round: method must be common, ceil or floor");
}

/* Python int(str, base) with the float() fallback jinja's int filter uses */
static int parse_int_str(tpl_val s, int64_t base, int64_t *out) {
    char buf[128];
    size_t b = 0, e = s.n;
    while (b < e && (s.u.s[b] == ' ' || (s.u.s[b] >= 9 && s.u.s[b] <= 13))) b++;
    while (e > b && (s.u.s[e - 1] == ' ' || (s.u.s[e - 1] >= 9 && s.u.s[e - 1] <= 13))) e--;
    size_t k = 0;
    for (size_t i = b; i < e && k + 1 < sizeof buf; i++)
        if (s.u.s[i] != '_') buf[k++] = s.u.s[i];
    buf[k] = 0;
    if (!k || e - b >= sizeof buf) return 0;
    char *end;
    long long v = strtoll(buf, &end, (int)base);
    if (*end == 0 && !(buf[0] == '0' && (buf[1] | 32) == 'x' && base == 10)) { *out = v; return 1; }
    double d = strtod(buf, &end);
    if (*end == 0 && isfinite(d)) {
        if (fabs(d) >= 9.2e18) return -1; /* Python makes a big integer: refuse */
        *out = (int64_t)d;
        return 1;
    }
    return 0;
}

static int test_apply(fargs *a, tpl_val item, tpl_val *targs, size_t n_targs, int has_test) {
    if (!has_test) return tv_truthy(item);
    tpl_val name = targs[0];
    if (name.kind != TV_STR) tpl_fail(a->st, a->line, "test name must be a string");
    const char *nm = tpl_strdup(a->st, name.u.s, name.n);
    if (!tpl_test_exists(nm)) tpl_fail(a->st, a->line, "no test named '%s'", nm);
    return tpl_test(a->st, a->line, nm, item, targs + 1, n_targs - 1);
}

static tpl_val f_select(fargs *a, tpl_val v, int by_attr, int keep) {
    if (a->n_kw) tpl_fail(a->st, a->line, "filter '%s' takes no keyword arguments", a->name);
    /* jinja checks `if seq:` before iterating, so falsy non-iterables give nothing */
    tpl_list *src = tv_truthy(v) ? tv_iter(a->st, a->line, v) : tv_list(a->st, 0).u.l;
    size_t first_test = by_attr ? 1 : 0;
    if (by_attr && a->n_args < 1) tpl_fail(a->st, a->line, "filter '%s' needs an attribute name", a->name);
    int has_test = a->n_args > first_test;
    tpl_val r = tv_list(a->st, 0);
    for (size_t i = 0; i < src->n; i++) {
        tpl_step(a->st, a->line);
        tpl_val item = src->items[i];
        tpl_val probe = by_attr ? attr_path(a, item, a->args[0]) : item;
        int t = test_apply(a, probe, a->args + first_test, a->n_args - first_test, has_test);
        if (t == keep) tv_list_push(a->st, r.u.l, item);
    }
    return r;
}

static tpl_val f_map(fargs *a, tpl_frame *f, tpl_val v) {
    tpl_list *src = tv_truthy(v) ? tv_iter(a->st, a->line, v) : tv_list(a->st, 0).u.l;
    tpl_val r = tv_list(a->st, src->n);
    tpl_val attr = arg(a, 99, "attribute", tv_undef(NULL));
    if (attr.kind != TV_UNDEF) {
        if (a->n_args) tpl_fail(a->st, a->line, "map: attribute= takes no positional arguments");
        tpl_val def = arg(a, 99, "default", tv_undef(NULL));
        for (size_t i = 0; i < src->n; i++) {
            tpl_val x = attr_path(a, src->items[i], attr);
            if (x.kind == TV_UNDEF && def.kind != TV_UNDEF) x = def;
            tv_list_push(a->st, r.u.l, x);
        }
        return r;
    }
    if (!a->n_args || a->args[0].kind != TV_STR) tpl_fail(a->st, a->line, "map: needs a filter name or attribute=");
    const char *nm = tpl_strdup(a->st, a->args[0].u.s, a->args[0].n);
    if (!tpl_filter_exists(nm)) tpl_fail(a->st, a->line, "no filter named '%s'", nm);
    for (size_t i = 0; i < src->n; i++) {
        tpl_step(a->st, a->line);
        tv_list_push(a->st, r.u.l, tpl_filter(a->st, f, a->line, nm, src->items[i], a->args + 1, a->n_args - 1, a->kwn, a->kwv, a->n_kw));
    }
    return r;
}

static tpl_val f_sortlike(fargs *a, tpl_val v, int mode) {
    /* mode 0 sort, 1 unique, 2 min, 3 max, 4 dictsort */
    static const char *const kws_sort[] = {"reverse", "case_sensitive", "attribute", NULL};
    static const char *const kws_uniq[] = {"case_sensitive", "attribute", NULL};
    static const char *const kws_dict[] = {"case_sensitive", "by", "reverse", NULL};
    int reverse = 0, cs = 0;
    tpl_val attr = tv_undef(NULL);
    tpl_list *src;
    if (mode == 4) {
        check_args(a, 3, kws_dict);
        cs = tv_truthy(arg(a, 0, "case_sensitive", tv_bool(0)));
        tpl_val by = arg(a, 1, "by", tv_cstr("key"));
        reverse = tv_truthy(arg(a, 2, "reverse", tv_bool(0)));
        if (v.kind != TV_DICT) tpl_fail(a->st, a->line, "dictsort: value must be a dict");
        int by_value = by.kind == TV_STR && by.n == 5 && !memcmp(by.u.s, "value", 5);
        if (!by_value && !(by.kind == TV_STR && by.n == 3 && !memcmp(by.u.s, "key", 3)))
            tpl_fail(a->st, a->line, "dictsort: You can only sort by either \"key\" or \"value\"");
        tpl_val l = tv_list(a->st, v.u.d->n), keys = tv_list(a->st, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            tpl_val pair = tv_list(a->st, 2);
            pair.u.l->is_tuple = 1;
            tv_list_push(a->st, pair.u.l, v.u.d->keys[i]);
            tv_list_push(a->st, pair.u.l, v.u.d->vals[i]);
            tv_list_push(a->st, l.u.l, pair);
            tpl_val k = by_value ? v.u.d->vals[i] : v.u.d->keys[i];
            tv_list_push(a->st, keys.u.l, cs ? k : lower_if_str(a, k));
        }
        sort_vals(a, l.u.l->items, keys.u.l->items, l.u.l->n, reverse);
        return l;
    }
    if (mode == 0) {
        check_args(a, 3, kws_sort);
        reverse = tv_truthy(arg(a, 0, "reverse", tv_bool(0)));
        cs = tv_truthy(arg(a, 1, "case_sensitive", tv_bool(0)));
        attr = arg(a, 2, "attribute", tv_undef(NULL));
    } else {
        check_args(a, 2, kws_uniq);
        cs = tv_truthy(arg(a, 0, "case_sensitive", tv_bool(0)));
        attr = arg(a, 1, "attribute", tv_undef(NULL));
    }
    src = tv_iter(a->st, a->line, v);
    tpl_val items = copy_list(a->st, src), keys = tv_list(a->st, src->n);
    for (size_t i = 0; i < src->n; i++) {
        tpl_val k = attr.kind != TV_UNDEF ? attr_path(a, src->items[i], attr) : src->items[i];
        tv_list_push(a->st, keys.u.l, cs ? k : lower_if_str(a, k));
    }
    if (mode == 0) {
        sort_vals(a, items.u.l->items, keys.u.l->items, items.u.l->n, reverse);
        return items;
    }
    if (mode == 1) {
        tpl_val r = tv_list(a->st, 0), seen = tv_list(a->st, 0);
        for (size_t i = 0; i < src->n; i++) {
            tpl_val k = keys.u.l->items[i];
            if ((k.kind == TV_LIST && !k.u.l->is_tuple) || k.kind == TV_DICT || k.kind == TV_NS)
                tpl_fail(a->st, a->line, "unhashable type: '%s'", tv_type_name(k));
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = tv_equal(seen.u.l->items[j], keys.u.l->items[i]);
            if (dup) continue;
            tv_list_push(a->st, seen.u.l, keys.u.l->items[i]);
            tv_list_push(a->st, r.u.l, src->items[i]);
        }
        return r;
    }
    if (!src->n) return tv_undef("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < src->n; i++) {
        int c = tv_compare(a->st, a->line, keys.u.l->items[i], keys.u.l->items[best]);
        if (mode == 2 ? c < 0 : c > 0) best = i;
    }
    return src->items[best];
}

static tpl_val f_join(fargs *a, tpl_val v) {
    static const char *const kws[] = {"d", "attribute", NULL};
    check_args(a, 2, kws);
    tpl_val sep = need_str(a, arg(a, 0, "d", tv_cstr("")));
    tpl_val attr = arg(a, 1, "attribute", tv_undef(NULL));
    tpl_list *l = tv_iter(a->st, a->line, v);
    sbuf *o = tpl_tmp_begin(a->st);
    for (size_t i = 0; i < l->n; i++) {
        if (i) sbuf_append(o, sep.u.s, sep.n);
        tpl_val x = attr.kind != TV_UNDEF ? attr_path(a, l->items[i], attr) : l->items[i];
        tv_to_str(a->st, o, x);
    }
    return tpl_tmp_finish(a->st, o);
}

static tpl_val f_escape(fargs *a, tpl_val v) {
    tpl_val s = need_str(a, v);
    sbuf *o = tpl_tmp_begin(a->st);
    for (size_t i = 0; i < s.n; i++) {
        switch (s.u.s[i]) {
        case '&': sbuf_puts(o, "&amp;"); break;
        case '<': sbuf_puts(o, "&lt;"); break;
        case '>': sbuf_puts(o, "&gt;"); break;
        case '"': sbuf_puts(o, "&#34;"); break;
        case '\'': sbuf_puts(o, "&#39;"); break;
        default: sbuf_putc(o, s.u.s[i]);
        }
    }
    return tpl_tmp_finish(a->st, o);
}

/* jinja's title filter: capitalise each chunk split at runs of [-\s({[<] */
static tpl_val f_title(fargs *a, tpl_val v) {
    tpl_val s = need_str(a, v);
    sbuf *o = tpl_tmp_begin(a->st);
    size_t i = 0;
    while (i < s.n) {
        size_t j = i;
        int sep = strchr("-({[< \t\n\r\v\f", s.u.s[i]) != NULL && s.u.s[i];
        while (j < s.n && ((strchr("-({[< \t\n\r\v\f", s.u.s[j]) != NULL && s.u.s[j]) == sep)) j++;
        tpl_val chunk = {.kind = TV_STR, .n = j - i, .u.s = s.u.s + i};
        tpl_val t = sep ? chunk : tpl_str_case(a->st, chunk, 3);
        sbuf_append(o, t.u.s, t.n);
        i = j;
    }
    return tpl_tmp_finish(a->st, o);
}

static const char *const FILTERS[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
    "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
    "trim", "unique", "upper", "wordcount", "center", "batch", NULL};

int tpl_filter_exists(const char *name) {
    for (const char *const *f = FILTERS; *f; f++)
        if (!strcmp(*f, name)) return 1;
    return 0;
}

tpl_val tpl_filter(tpl_state *st, tpl_frame *f, int line, const char *name, tpl_val v, tpl_val *args, size_t n_args,
                   const char **kwn, tpl_val *kwv, size_t n_kw) {
    fargs a = {st, line, name, args, n_args, kwn, kwv, n_kw};
    fargs *A = &a;
    static const char *const none[] = {NULL};
#define IS(s) (!strcmp(name, s))
    if (IS("default") || IS("d")) {
        static const char *const kws[] = {"default_value", "boolean", NULL};
        check_args(A, 2, kws);
        tpl_val def = arg(A, 0, "default_value", tv_cstr(""));
        int boolean = tv_truthy(arg(A, 1, "boolean", tv_bool(0)));
        if (v.kind == TV_UNDEF || (boolean && !tv_truthy(v))) return def;
        return v;
    }
    if (IS("tojson")) return f_tojson(A, v);
    if (IS("safe")) { check_args(A, 0, none); return v.kind == TV_STR ? v : need_str(A, v); }
    if (IS("string")) { check_args(A, 0, none); return need_str(A, v); }
    if (IS("length") || IS("count")) { check_args(A, 0, none); return tv_int((int64_t)py_len(st, line, v)); }
    if (IS("trim")) {
        static const char *const kws[] = {"chars", NULL};
        check_args(A, 1, kws);
        return tpl_str_strip(st, need_str(A, v), arg(A, 0, "chars", tv_none()), 1, 1);
    }
    if (IS("upper")) { check_args(A, 0, none); return tpl_str_case(st, need_str(A, v), 1); }
    if (IS("lower")) { check_args(A, 0, none); return tpl_str_case(st, need_str(A, v), 0); }
    if (IS("capitalize")) { check_args(A, 0, none); return tpl_str_case(st, need_str(A, v), 3); }
    if (IS("title")) { check_args(A, 0, none); return f_title(A, v); }
    if (IS("replace")) {
        static const char *const kws[] = {"old", "new", "count", NULL};
        check_args(A, 3, kws);
        tpl_val c = arg(A, 2, "count", tv_none());
        return tpl_str_replace(st, need_str(A, v), need_str(A, arg(A, 0, "old", tv_cstr(""))), need_str(A, arg(A, 1, "new", tv_cstr(""))),
                               c.kind == TV_NONE ? -1 : need_int(A, c, "count"));
    }
    if (IS("items")) {
        check_args(A, 0, none);
        if (v.kind == TV_UNDEF) return tv_list(st, 0);
        if (v.kind != TV_DICT) tpl_fail(st, line, "Can only get item pairs from a mapping.");
        tpl_val l = tv_list(st, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            tpl_val p = tv_list(st, 2);
            p.u.l->is_tuple = 1;
            tv_list_push(st, p.u.l, v.u.d->keys[i]);
            tv_list_push(st, p.u.l, v.u.d->vals[i]);
            tv_list_push(st, l.u.l, p);
        }
        return l;
    }
    if (IS("list")) { check_args(A, 0, none); return copy_list(st, tv_iter(st, line, v)); }
    if (IS("first") || IS("last")) {
        check_args(A, 0, none);
        tpl_list *l = tv_iter(st, line, v);
        if (!l->n) return tv_undef(IS("first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        return IS("first") ? l->items[0] : l->items[l->n - 1];
    }
    if (IS("reverse")) {
        check_args(A, 0, none);
        if (v.kind == TV_STR) {
            tpl_list *cps = tv_iter(st, line, v);
            sbuf *o = tpl_tmp_begin(st);
            for (size_t i = cps->n; i-- > 0;) sbuf_append(o, cps->items[i].u.s, cps->items[i].n);
            return tpl_tmp_finish(st, o);
        }
        tpl_list *l = tv_iter(st, line, v);
        tpl_val r = tv_list(st, l->n);
        for (size_t i = l->n; i-- > 0;) tv_list_push(st, r.u.l, l->items[i]);
        return r;
    }
    if (IS("join")) return f_join(A, v);
    if (IS("map")) return f_map(A, f, v);
    if (IS("select")) return f_select(A, v, 0, 1);
    if (IS("reject")) return f_select(A, v, 0, 0);
    if (IS("selectattr")) return f_select(A, v, 1, 1);
    if (IS("rejectattr")) return f_select(A, v, 1, 0);
    if (IS("sort")) return f_sortlike(A, v, 0);
    if (IS("unique")) return f_sortlike(A, v, 1);
    if (IS("min")) return f_sortlike(A, v, 2);
    if (IS("max")) return f_sortlike(A, v, 3);
    if (IS("dictsort")) return f_sortlike(A, v, 4);
    if (IS("indent")) return f_indent(A, v);
    if (IS("round")) return f_round(A, v);
    if (IS("escape") || IS("e")) { check_args(A, 0, none); return f_escape(A, v); }
    if (IS("abs")) {
        check_args(A, 0, none);
        if (v.kind == TV_INT) {
            if (v.u.i == INT64_MIN) tpl_fail(st, line, "integer overflow in abs");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.kind == TV_BOOL) return tv_int(v.u.b);
        if (v.kind == TV_FLOAT) return tv_float(fabs(v.u.f));
        tpl_fail(st, line, "bad operand type for abs(): '%s'", tv_type_name(v));
    }
    if (IS("int")) {
        static const char *const kws[] = {"default", "base", NULL};
        check_args(A, 2, kws);
        tpl_val def = arg(A, 0, "default", tv_int(0));
        int64_t base = need_int(A, arg(A, 1, "base", tv_int(10)), "base");
        if (v.kind == TV_UNDEF) tpl_fail(st, line, "%s", v.u.s ? v.u.s : "undefined value");
        if (base < 2 || base > 36) tpl_fail(st, line, "int: base must be in 2..36");
        if (v.kind == TV_INT) return v;
        if (v.kind == TV_BOOL) return tv_int(v.u.b);
        if (v.kind == TV_FLOAT) {
            if (!isfinite(v.u.f)) return def;
            /* Python would print a big integer here; refuse rather than differ */
            if (fabs(v.u.f) >= 9.2e18) tpl_fail(st, line, "int: %g does not fit in 64 bits", v.u.f);
            return tv_int((int64_t)v.u.f);
        }
        int64_t r;
        int ok = v.kind == TV_STR ? parse_int_str(v, base, &r) : 0;
        if (ok < 0) tpl_fail(st, line, "int: value does not fit in 64 bits");
        return ok ? tv_int(r) : def;
    }
    if (IS("float")) {
        static const char *const kws[] = {"default", NULL};
        check_args(A, 1, kws);
        tpl_val def = arg(A, 0, "default", tv_float(0.0));
        if (v.kind == TV_UNDEF) tpl_fail(st, line, "%s", v.u.s ? v.u.s : "undefined value");
        if (v.kind == TV_FLOAT) return v;
        if (v.kind == TV_INT) return tv_float((double)v.u.i);
        if (v.kind == TV_BOOL) return tv_float(v.u.b);
        if (v.kind == TV_STR && v.n && v.n < 64) {
            char buf[64], *end;
            memcpy(buf, v.u.s, v.n);
            buf[v.n] = 0;
            double d = strtod(buf, &end);
            while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
            if (end != buf && *end == 0 && !(strchr(buf, 'x') || strchr(buf, 'X'))) return tv_float(d);
        }
        return def;
    }
    if (IS("sum")) {
        static const char *const kws[] = {"attribute", "start", NULL};
        check_args(A, 2, kws);
        tpl_val attr = arg(A, 0, "attribute", tv_undef(NULL));
        tpl_val acc = arg(A, 1, "start", tv_int(0));
        tpl_list *l = tv_iter(st, line, v);
        for (size_t i = 0; i < l->n; i++)
            acc = tpl_binop(st, line, OP_ADD, acc, attr.kind != TV_UNDEF ? attr_path(A, l->items[i], attr) : l->items[i]);
        return acc;
    }
    if (IS("attr")) {
        check_args(A, 1, none);
        /* jinja's attr() reads Python attributes only, never items: on our values
         * that leaves the methods */
        tpl_val n = need_str(A, arg(A, 0, NULL, tv_cstr("")));
        const char *nm = tpl_strdup(st, n.u.s, n.n);
        if (v.kind == TV_UNDEF) return tv_undef(NULL);
        if ((v.kind == TV_DICT || v.kind == TV_STR || v.kind == TV_LIST) && tpl_method_exists(v, nm)) return tpl_getattr(st, line, v, nm, n.n);
        return tv_undef("no such attribute");
    }
    if (IS("wordcount")) {
        check_args(A, 0, none);
        tpl_val s = need_str(A, v);
        /* counts runs of \w (letters, numbers, underscore) like jinja's regex */
        tpl_list *cps = tv_iter(st, line, s);
        int64_t words = 0;
        int in = 0;
        for (size_t i = 0; i < cps->n; i++) {
            int w = tpl_is_word_char(cps->items[i].u.s, cps->items[i].n);
            if (w && !in) words++;
            in = w;
        }
        return tv_int(words);
    }
    if (IS("center")) {
        static const char *const kws[] = {"width", NULL};
        check_args(A, 1, kws);
        tpl_val s = need_str(A, v);
        int64_t w = need_int(A, arg(A, 0, "width", tv_int(80)), "width");
        int64_t len = (int64_t)tpl_utf8_len(s.u.s, s.n);
        if (w > 1 << 20) tpl_fail(st, line, "center: width too large");
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        sbuf *o = tpl_tmp_begin(st);
        for (int64_t i = 0; i < left; i++) sbuf_putc(o, ' ');
        sbuf_append(o, s.u.s, s.n);
        for (int64_t i = 0; i < pad - left; i++) sbuf_putc(o, ' ');
        return tpl_tmp_finish(st, o);
    }
    if (IS("batch")) {
        static const char *const kws[] = {"linecount", "fill_with", NULL};
        check_args(A, 2, kws);
        int64_t n = need_int(A, arg(A, 0, "linecount", tv_int(1)), "linecount");
        if (n <= 0) tpl_fail(st, line, "batch: linecount must be positive");
        tpl_val fill = arg(A, 1, "fill_with", tv_none());
        int has_fill = A->n_args > 1 || fill.kind != TV_NONE;
        tpl_list *l = tv_iter(st, line, v);
        tpl_val r = tv_list(st, 0), cur = tv_list(st, 0);
        for (size_t i = 0; i < l->n; i++) {
            if ((int64_t)cur.u.l->n == n) { tv_list_push(st, r.u.l, cur); cur = tv_list(st, 0); }
            tv_list_push(st, cur.u.l, l->items[i]);
        }
        if (cur.u.l->n) {
            if (has_fill)
                while ((int64_t)cur.u.l->n < n) tv_list_push(st, cur.u.l, fill);
            tv_list_push(st, r.u.l, cur);
        }
        return r;
    }
#undef IS
    tpl_fail(st, line, "no filter named '%s'", name);
}

/* ---- tests ---- */
static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "lessthan",
    "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
    "upper", NULL};

int tpl_test_exists(const char *name) {
    for (const char *const *t = TESTS; *t; t++)
        if (!strcmp(*t, name)) return 1;
    return 0;
}

int tpl_test(tpl_state *st, int line, const char *name, tpl_val v, tpl_val *args, size_t n_args) {
#define IS(s) (!strcmp(name, s))
    size_t want = (IS("divisibleby") || IS("eq") || IS("equalto") || IS("==") || IS("ge") || IS(">=") || IS("gt") ||
                   IS("greaterthan") || IS(">") || IS("in") || IS("le") || IS("<=") || IS("lt") || IS("lessthan") ||
                   IS("<") || IS("ne") || IS("!=") || IS("sameas"))
                      ? 1
                      : 0;
    if (n_args != want) tpl_fail(st, line, "test '%s' takes %zu argument(s), got %zu", name, want, n_args);
    tpl_val b = want ? args[0] : tv_none();
    if (IS("defined")) return v.kind != TV_UNDEF;
    if (IS("undefined")) return v.kind == TV_UNDEF;
    if (IS("none")) return v.kind == TV_NONE;
    if (IS("boolean")) return v.kind == TV_BOOL;
    if (IS("false")) return v.kind == TV_BOOL && !v.u.b;
    if (IS("true")) return v.kind == TV_BOOL && v.u.b;
    if (IS("integer")) return v.kind == TV_INT;
    if (IS("float")) return v.kind == TV_FLOAT;
    if (IS("number")) return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL;
    if (IS("string")) return v.kind == TV_STR;
    if (IS("mapping")) return v.kind == TV_DICT;
    if (IS("iterable")) return v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF;
    if (IS("sequence")) return v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF;
    if (IS("callable")) return v.kind == TV_MACRO || v.kind == TV_FUNC || v.kind == TV_METHOD;
    if (IS("escaped")) return 0;
    if (IS("lower") || IS("upper")) {
        tpl_val s = tv_stringify(st, v.kind == TV_UNDEF ? tv_cstr("") : v);
        tpl_val c = tpl_str_case(st, s, IS("lower") ? 0 : 1), o = tpl_str_case(st, s, IS("lower") ? 1 : 0);
        /* str.islower(): at least one cased char and none of the other case */
        return tv_equal(c, s) && !tv_equal(o, s);
    }
    if (IS("filter")) return v.kind == TV_STR && tpl_filter_exists(tpl_strdup(st, v.u.s, v.n));
    if (IS("test")) return v.kind == TV_STR && tpl_test_exists(tpl_strdup(st, v.u.s, v.n));
    if (IS("even") || IS("odd")) {
        tpl_val m = tpl_binop(st, line, OP_MOD, v, tv_int(2));
        return tv_equal(m, tv_int(IS("odd") ? 1 : 0));
    }
    if (IS("divisibleby")) return tv_equal(tpl_binop(st, line, OP_MOD, v, b), tv_int(0));
    if (IS("eq") || IS("equalto") || IS("==")) return tv_equal(v, b);
    if (IS("ne") || IS("!=")) return !tv_equal(v, b);
    if (IS("sameas")) {
        if (v.kind != b.kind) return 0;
        if (v.kind == TV_LIST) return v.u.l == b.u.l;
        if (v.kind == TV_DICT || v.kind == TV_NS) return v.u.d == b.u.d;
        if (v.kind == TV_NONE || v.kind == TV_BOOL) return tv_equal(v, b);
        return 0;
    }
    if (IS("in")) {
        tpl_val r = tv_bool(0);
        if (b.kind == TV_STR) {
            if (v.kind != TV_STR) tpl_fail(st, line, "'in <string>' requires string as left operand");
            for (size_t i = 0; i + v.n <= b.n; i++)
                if (!memcmp(b.u.s + i, v.u.s, v.n)) return 1;
            return 0;
        }
        tpl_list *l = tv_iter(st, line, b);
        if (b.kind == TV_DICT) return tv_dict_find(b.u.d, v) != NULL;
        for (size_t i = 0; i < l->n; i++)
            if (tv_equal(l->items[i], v)) return 1;
        return tv_truthy(r);
    }
    if (v.kind == TV_UNDEF) tpl_fail(st, line, "%s", v.u.s ? v.u.s : "undefined value");
    int c = tv_compare(st, line, v, b);
    if (IS("ge") || IS(">=")) return c >= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return c > 0;
    if (IS("le") || IS("<=")) return c <= 0;
    if (IS("lt") || IS("lessthan") || IS("<")) return c < 0;
#undef IS
    tpl_fail(st, line, "no test named '%s'", name);
}
