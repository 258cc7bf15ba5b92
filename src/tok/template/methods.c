/* methods.c: the Python methods templates call on strings, dicts and lists
 * (s.startswith, d.items(), ...), Python string helpers shared with filters, and
 * the globals transformers provides (range, namespace, dict, raise_exception,
 * strftime_now). Mutating methods (list.append, dict.update) are absent on purpose:
 * jinja2's ImmutableSandboxedEnvironment refuses them too. */
#include "tok/template/tpl_int.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

static int32_t cp_at(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { cp = (unsigned char)s[*i]; k = 1; }
    *i += (size_t)k;
    return cp;
}

static void put_cp(sbuf *b, int32_t cp) {
    utf8proc_uint8_t t[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, t);
    sbuf_append(b, (const char *)t, (size_t)k);
}

/* Python str.isspace for one code point */
static int py_space(int32_t cp) {
    if (cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) return 1;
    if (cp < 0x80) return 0;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

static int cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

tpl_val tpl_str_case(tpl_state *st, tpl_val s, int mode) {
    sbuf *o = tpl_tmp_begin(st);
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s.n;) {
        int32_t cp = cp_at(s.u.s, s.n, &i), r;
        switch (mode) {
        case 0: r = utf8proc_tolower(cp); break;
        case 1: r = utf8proc_toupper(cp); break;
        case 2: r = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp); break;
        default: r = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        }
        prev_cased = cased(cp);
        first = 0;
        put_cp(o, r);
    }
    return tpl_tmp_finish(st, o);
}

static int in_chars(int32_t cp, tpl_val chars) {
    for (size_t i = 0; i < chars.n;)
        if (cp_at(chars.u.s, chars.n, &i) == cp) return 1;
    return 0;
}

tpl_val tpl_str_strip(tpl_state *st, tpl_val s, tpl_val chars, int left, int right) {
    int ws = chars.kind == TV_NONE || chars.kind == TV_UNDEF;
    if (!ws && chars.kind != TV_STR) tpl_fail(st, 0, "strip arg must be None or str");
    size_t a = 0, b = s.n;
    if (left)
        while (a < b) {
            size_t j = a;
            int32_t cp = cp_at(s.u.s, b, &j);
            if (ws ? !py_space(cp) : !in_chars(cp, chars)) break;
            a = j;
        }
    if (right)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s.u.s[j] & 0xC0) == 0x80) j--;
            size_t k = j;
            int32_t cp = cp_at(s.u.s, b, &k);
            if (ws ? !py_space(cp) : !in_chars(cp, chars)) break;
            b = j;
        }
    return (tpl_val){.kind = TV_STR, .n = b - a, .u.s = s.u.s + a};
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

tpl_val tpl_str_replace(tpl_state *st, tpl_val s, tpl_val old, tpl_val new_, int64_t count) {
    if (old.kind != TV_STR || new_.kind != TV_STR) tpl_fail(st, 0, "replace arguments must be strings");
    sbuf *o = tpl_tmp_begin(st);
    if (old.n == 0) {
        /* Python inserts `new` before every code point and at the end */
        int64_t done = 0;
        size_t i = 0;
        while (i < s.n) {
            if (count < 0 || done < count) { sbuf_append(o, new_.u.s, new_.n); done++; }
            size_t j = i;
            cp_at(s.u.s, s.n, &j);
            sbuf_append(o, s.u.s + i, j - i);
            i = j;
            if (o->len > TPL_MAX_OUTPUT) break;
        }
        if (count < 0 || done < count) sbuf_append(o, new_.u.s, new_.n);
        return tpl_tmp_finish(st, o);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < s.n) {
        const char *hit = (count < 0 || done < count) ? find_bytes(s.u.s + i, s.n - i, old.u.s, old.n) : NULL;
        if (!hit) { sbuf_append(o, s.u.s + i, s.n - i); break; }
        sbuf_append(o, s.u.s + i, (size_t)(hit - (s.u.s + i)));
        sbuf_append(o, new_.u.s, new_.n);
        i = (size_t)(hit - s.u.s) + old.n;
        done++;
        if (o->len > TPL_MAX_OUTPUT) break;
    }
    return tpl_tmp_finish(st, o);
}

static tpl_val sub(tpl_val s, size_t a, size_t b) { return (tpl_val){.kind = TV_STR, .n = b - a, .u.s = s.u.s + a}; }

tpl_val tpl_str_split(tpl_state *st, int line, tpl_val s, tpl_val sep, int64_t maxsplit) {
    tpl_val l = tv_list(st, 0);
    if (sep.kind == TV_NONE || sep.kind == TV_UNDEF) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            while (i < s.n) { size_t j = i; if (!py_space(cp_at(s.u.s, s.n, &j))) break; i = j; }
            if (i >= s.n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                /* the rest, with trailing whitespace stripped */
                tpl_val rest = tpl_str_strip(st, sub(s, i, s.n), tv_none(), 0, 1);
                tv_list_push(st, l.u.l, rest);
                break;
            }
            size_t start = i;
            while (i < s.n) { size_t j = i; if (py_space(cp_at(s.u.s, s.n, &j))) break; i = j; }
            tv_list_push(st, l.u.l, sub(s, start, i));
            splits++;
        }
        return l;
    }
    if (sep.kind != TV_STR) tpl_fail(st, line, "must be str or None, not %s", tv_type_name(sep));
    if (!sep.n) tpl_fail(st, line, "empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *hit = (maxsplit < 0 || splits < maxsplit) ? find_bytes(s.u.s + i, s.n - i, sep.u.s, sep.n) : NULL;
        if (!hit) { tv_list_push(st, l.u.l, sub(s, i, s.n)); break; }
        size_t h = (size_t)(hit - s.u.s);
        tv_list_push(st, l.u.l, sub(s, i, h));
        i = h + sep.n;
        splits++;
    }
    return l;
}

static tpl_val str_rsplit(tpl_state *st, int line, tpl_val s, tpl_val sep, int64_t maxsplit) {
    if (maxsplit < 0) return tpl_str_split(st, line, s, sep, -1);
    if (sep.kind == TV_NONE || sep.kind == TV_UNDEF) {
        tpl_val all = tpl_str_split(st, line, s, sep, -1);
        if ((int64_t)all.u.l->n <= maxsplit + 1) return all;
        /* keep the last maxsplit words, the head joined as in the source text */
        size_t keep = (size_t)maxsplit, first_kept = all.u.l->n - keep;
        tpl_val head_end = all.u.l->items[first_kept - 1];
        size_t hend = (size_t)(head_end.u.s + head_end.n - s.u.s);
        tpl_val head = tpl_str_strip(st, sub(s, 0, hend), tv_none(), 1, 0);
        tpl_val l = tv_list(st, keep + 1);
        tv_list_push(st, l.u.l, head);
        for (size_t i = first_kept; i < all.u.l->n; i++) tv_list_push(st, l.u.l, all.u.l->items[i]);
        return l;
    }
    if (sep.kind != TV_STR) tpl_fail(st, line, "must be str or None, not %s", tv_type_name(sep));
    if (!sep.n) tpl_fail(st, line, "empty separator");
    tpl_val parts = tv_list(st, 0);
    size_t end = s.n;
    int64_t splits = 0;
    while (splits < maxsplit) {
        size_t h = (size_t)-1;
        for (size_t i = end; i-- > 0;)
            if (i + sep.n <= end && !memcmp(s.u.s + i, sep.u.s, sep.n)) { h = i; break; }
        if (h == (size_t)-1) break;
        tv_list_push(st, parts.u.l, sub(s, h + sep.n, end));
        end = h;
        splits++;
    }
    tpl_val l = tv_list(st, parts.u.l->n + 1);
    tv_list_push(st, l.u.l, sub(s, 0, end));
    for (size_t i = parts.u.l->n; i-- > 0;) tv_list_push(st, l.u.l, parts.u.l->items[i]);
    return l;
}


static const char *const STR_METHODS[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "upper", "lower", "title", "capitalize",
    "replace", "find", "rfind", "count", "join", "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower",
    "isupper", "index", "rindex", "format", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};

static int in_set(const char *name, const char *const *set) {
    for (; *set; set++)
        if (!strcmp(*set, name)) return 1;
    return 0;
}

int tpl_method_exists(tpl_val self, const char *name) {
    switch (self.kind) {
    case TV_STR: return in_set(name, STR_METHODS);
    case TV_DICT: return in_set(name, DICT_METHODS);
    case TV_LIST: return in_set(name, LIST_METHODS);
    default: return 0;
    }
}

static void nargs(tpl_state *st, int line, const char *name, size_t n_args, size_t n_kw, size_t lo, size_t hi) {
    if (n_kw) tpl_fail(st, line, "%s() takes no keyword arguments", name);
    if (n_args < lo || n_args > hi) tpl_fail(st, line, "%s() takes %zu to %zu arguments (%zu given)", name, lo, hi, n_args);
}

static tpl_val str_arg(tpl_state *st, int line, const char *name, tpl_val v) {
    if (v.kind != TV_STR) tpl_fail(st, line, "%s() argument must be str, not %s", name, tv_type_name(v));
    return v;
}

static int64_t int_arg(tpl_state *st, int line, const char *name, tpl_val v) {
    if (v.kind == TV_INT) return v.u.i;
    if (v.kind == TV_BOOL) return v.u.b;
    tpl_fail(st, line, "%s() argument must be int, not %s", name, tv_type_name(v));
}

static int affix(tpl_state *st, int line, const char *name, tpl_val s, tpl_val p, int end) {
    if (p.kind == TV_LIST && p.u.l->is_tuple) {
        for (size_t i = 0; i < p.u.l->n; i++)
            if (affix(st, line, name, s, p.u.l->items[i], end)) return 1;
        return 0;
    }
    str_arg(st, line, name, p);
    if (p.n > s.n) return 0;
    return !memcmp(s.u.s + (end ? s.n - p.n : 0), p.u.s, p.n);
}

static int all_cp(tpl_val s, int (*pred)(int32_t)) {
    if (!s.n) return 0;
    for (size_t i = 0; i < s.n;)
        if (!pred(cp_at(s.u.s, s.n, &i))) return 0;
    return 1;
}
static int p_digit(int32_t c) { return utf8proc_category(c) == UTF8PROC_CATEGORY_ND; }
static int p_alpha(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int p_alnum(int32_t c) { return p_alpha(c) || p_digit(c); }

int tpl_is_word_char(const char *s, size_t n) {
    size_t i = 0;
    int32_t c = cp_at(s, n, &i);
    if (c == '_') return 1;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}
static int p_space(int32_t c) { return py_space(c); }

static tpl_val str_method(tpl_state *st, int line, tpl_val s, const char *name, tpl_val *args, size_t n, size_t n_kw) {
#define IS(x) (!strcmp(name, x))
    if (IS("startswith") || IS("endswith")) {
        nargs(st, line, name, n, n_kw, 1, 1);
        return tv_bool(affix(st, line, name, s, args[0], IS("endswith")));
    }
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        nargs(st, line, name, n, n_kw, 0, 1);
        return tpl_str_strip(st, s, n ? args[0] : tv_none(), name[0] != 'r', name[0] != 'l');
    }
    if (IS("split") || IS("rsplit")) {
        if (n_kw) tpl_fail(st, line, "%s(): keyword arguments are not supported", name);
        nargs(st, line, name, n, 0, 0, 2);
        int64_t maxsplit = n > 1 ? int_arg(st, line, name, args[1]) : -1;
        tpl_val sep = n ? args[0] : tv_none();
        return IS("split") ? tpl_str_split(st, line, s, sep, maxsplit) : str_rsplit(st, line, s, sep, maxsplit);
    }
    if (IS("upper")) { nargs(st, line, name, n, n_kw, 0, 0); return tpl_str_case(st, s, 1); }
    if (IS("lower")) { nargs(st, line, name, n, n_kw, 0, 0); return tpl_str_case(st, s, 0); }
    if (IS("title")) { nargs(st, line, name, n, n_kw, 0, 0); return tpl_str_case(st, s, 2); }
    if (IS("capitalize")) { nargs(st, line, name, n, n_kw, 0, 0); return tpl_str_case(st, s, 3); }
    if (IS("replace")) {
        nargs(st, line, name, n, n_kw, 2, 3);
        return tpl_str_replace(st, s, str_arg(st, line, name, args[0]), str_arg(st, line, name, args[1]),
                               n > 2 ? int_arg(st, line, name, args[2]) : -1);
    }
    if (IS("find") || IS("rfind") || IS("index") || IS("rindex") || IS("count")) {
        nargs(st, line, name, n, n_kw, 1, 1);
        tpl_val x = str_arg(st, line, name, args[0]);
        if (IS("count")) {
            if (!x.n) return tv_int((int64_t)tpl_utf8_len(s.u.s, s.n) + 1);
            int64_t c = 0;
            for (size_t i = 0; i + x.n <= s.n;) {
                if (!memcmp(s.u.s + i, x.u.s, x.n)) { c++; i += x.n; }
                else i++;
            }
            return tv_int(c);
        }
        int64_t pos = -1;
        if (name[0] == 'r') {
            for (size_t i = s.n + 1; i-- > 0;)
                if (i + x.n <= s.n && !memcmp(s.u.s + i, x.u.s, x.n)) { pos = (int64_t)i; break; }
        } else {
            const char *h = find_bytes(s.u.s, s.n, x.u.s, x.n);
            if (h) pos = h - s.u.s;
        }
        if (pos < 0) {
            if (strstr(name, "index")) tpl_fail(st, line, "substring not found");
            return tv_int(-1);
        }
        return tv_int((int64_t)tpl_utf8_len(s.u.s, (size_t)pos));
    }
    if (IS("join")) {
        nargs(st, line, name, n, n_kw, 1, 1);
        tpl_list *l = tv_iter(st, line, args[0]);
        sbuf *o = tpl_tmp_begin(st);
        for (size_t i = 0; i < l->n; i++) {
            if (l->items[i].kind != TV_STR) tpl_fail(st, line, "sequence item %zu: expected str instance, %s found", i, tv_type_name(l->items[i]));
            if (i) sbuf_append(o, s.u.s, s.n);
            sbuf_append(o, l->items[i].u.s, l->items[i].n);
        }
        return tpl_tmp_finish(st, o);
    }
    if (IS("splitlines")) { nargs(st, line, name, n, n_kw, 0, 0); return tpl_splitlines(st, s); }
    nargs(st, line, name, n, n_kw, 0, 0);
    if (IS("isdigit")) return tv_bool(all_cp(s, p_digit));
    if (IS("isalpha")) return tv_bool(all_cp(s, p_alpha));
    if (IS("isalnum")) return tv_bool(all_cp(s, p_alnum));
    if (IS("isspace")) return tv_bool(all_cp(s, p_space));
    if (IS("islower") || IS("isupper")) {
        tpl_val c = tpl_str_case(st, s, IS("islower") ? 0 : 1), o = tpl_str_case(st, s, IS("islower") ? 1 : 0);
        return tv_bool(tv_equal(c, s) && !tv_equal(o, s));
    }
#undef IS
    tpl_fail(st, line, "unsupported string method '%s'", name);
}

/* str.format with plain fields ({}, {0}, {name}, optional !r/!s); format specs are
 * not supported and fail loudly rather than render differently */
static tpl_val str_format(tpl_state *st, int line, tpl_val s, tpl_val *args, size_t n_args, const char **kwn, tpl_val *kwv,
                          size_t n_kw) {
    sbuf *o = tpl_tmp_begin(st);
    size_t auto_idx = 0;
    int used_auto = 0, used_manual = 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        if (c == '}') {
            if (i + 1 < s.n && s.u.s[i + 1] == '}') { sbuf_putc(o, '}'); i++; continue; }
            tpl_fail(st, line, "Single '}' encountered in format string");
        }
        if (c != '{') { sbuf_putc(o, c); continue; }
        if (i + 1 < s.n && s.u.s[i + 1] == '{') { sbuf_putc(o, '{'); i++; continue; }
        size_t j = i + 1;
        while (j < s.n && s.u.s[j] != '}' && s.u.s[j] != '!' && s.u.s[j] != ':' && s.u.s[j] != '{') j++;
        size_t fa = i + 1, fb = j;
        char conv = 's';
        if (j < s.n && s.u.s[j] == '!') {
            if (j + 2 >= s.n || (s.u.s[j + 1] != 'r' && s.u.s[j + 1] != 's')) tpl_fail(st, line, "unsupported format conversion");
            conv = s.u.s[j + 1];
            j += 2;
        }
        if (j >= s.n || s.u.s[j] != '}') tpl_fail(st, line, "unsupported construct: format spec or unterminated field in str.format");
        tpl_val v;
        if (fa == fb) {
            if (used_manual) tpl_fail(st, line, "cannot switch from manual field specification to automatic field numbering");
            used_auto = 1;
            if (auto_idx >= n_args) tpl_fail(st, line, "Replacement index %zu out of range for positional args tuple", auto_idx);
            v = args[auto_idx++];
        } else if (s.u.s[fa] >= '0' && s.u.s[fa] <= '9') {
            if (used_auto) tpl_fail(st, line, "cannot switch from automatic field numbering to manual field specification");
            used_manual = 1;
            size_t k = 0;
            for (size_t q = fa; q < fb; q++) {
                if (s.u.s[q] < '0' || s.u.s[q] > '9' || k > 1000000) tpl_fail(st, line, "unsupported format field");
                k = k * 10 + (size_t)(s.u.s[q] - '0');
            }
            if (k >= n_args) tpl_fail(st, line, "Replacement index %zu out of range for positional args tuple", k);
            v = args[k];
        } else {
            size_t k;
            for (k = 0; k < n_kw; k++)
                if (strlen(kwn[k]) == fb - fa && !memcmp(kwn[k], s.u.s + fa, fb - fa)) break;
            if (k == n_kw) tpl_fail(st, line, "KeyError in str.format: '%.*s'", (int)(fb - fa), s.u.s + fa);
            v = kwv[k];
        }
        if (conv == 'r') tv_repr(st, o, v);
        else tv_to_str(st, o, v);
        i = j;
    }
    return tpl_tmp_finish(st, o);
}

tpl_val tpl_str_percent(tpl_state *st, int line, tpl_val fmt, tpl_val args) {
    int is_tuple = args.kind == TV_LIST && args.u.l->is_tuple;
    /* Python treats any non-tuple, non-str value with __getitem__ as a mapping and
     * then tolerates unused arguments */
    int mapping_like = !is_tuple && (args.kind == TV_LIST || args.kind == TV_DICT || args.kind == TV_UNDEF);
    size_t n = is_tuple ? args.u.l->n : 1, next = 0;
    sbuf *o = tpl_tmp_begin(st);
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c != '%') { sbuf_putc(o, c); continue; }
        if (++i >= fmt.n) tpl_fail(st, line, "incomplete format");
        c = fmt.u.s[i];
        if (c == '%') { sbuf_putc(o, '%'); continue; }
        tpl_val v;
        if (c == '(') {
            size_t j = i + 1;
            while (j < fmt.n && fmt.u.s[j] != ')') j++;
            if (j >= fmt.n) tpl_fail(st, line, "incomplete format key");
            if (args.kind != TV_DICT) tpl_fail(st, line, "format requires a mapping");
            tpl_val *found = tv_dict_find_str(args.u.d, fmt.u.s + i + 1, j - i - 1);
            if (!found) tpl_fail(st, line, "KeyError in %%-format: '%.*s'", (int)(j - i - 1), fmt.u.s + i + 1);
            v = *found;
            i = j + 1;
            if (i >= fmt.n) tpl_fail(st, line, "incomplete format");
            c = fmt.u.s[i];
            next = n; /* mapping keys consume no positional arguments */
        } else {
            if (next >= n) tpl_fail(st, line, "not enough arguments for format string");
            v = is_tuple ? args.u.l->items[next] : args;
            next++;
        }
        if (c == 's') tv_to_str(st, o, v);
        else if (c == 'r') tv_repr(st, o, v);
        else if (c == 'd' || c == 'i') {
            if (v.kind == TV_INT || v.kind == TV_BOOL) sbuf_printf(o, "%lld", (long long)(v.kind == TV_INT ? v.u.i : v.u.b));
            else if (v.kind == TV_FLOAT && v.u.f > -9.2e18 && v.u.f < 9.2e18) sbuf_printf(o, "%lld", (long long)v.u.f);
            else tpl_fail(st, line, "%%%c format: a real number is required, not %s", c, tv_type_name(v));
        } else
            tpl_fail(st, line, "unsupported construct: %%-format spec '%c'", c);
    }
    if (next < n && !mapping_like) tpl_fail(st, line, "not all arguments converted during string formatting");
    return tpl_tmp_finish(st, o);
}

tpl_val tpl_method_call(tpl_state *st, int line, tpl_val self, const char *name, tpl_val *args, size_t n_args,
                        const char **kwn, tpl_val *kwv, size_t n_kw) {
    tpl_step(st, line);
    if (self.kind == TV_STR && !strcmp(name, "format")) return str_format(st, line, self, args, n_args, kwn, kwv, n_kw);
    if (self.kind == TV_STR) return str_method(st, line, self, name, args, n_args, n_kw);
    if (self.kind == TV_LOOP && !strcmp(name, "cycle")) {
        if (!n_args) tpl_fail(st, line, "no items for cycling given");
        return args[self.u.loop->index0 % n_args];
    }
    if (self.kind == TV_DICT) {
        tpl_dict *d = self.u.d;
        if (!strcmp(name, "get")) {
            nargs(st, line, name, n_args, n_kw, 1, 2);
            tpl_val *v = tv_dict_find(d, args[0]);
            return v ? *v : n_args > 1 ? args[1] : tv_none();
        }
        nargs(st, line, name, n_args, n_kw, 0, 0);
        if (!strcmp(name, "copy")) {
            tpl_val r = tv_dict(st, d->n);
            for (size_t i = 0; i < d->n; i++) tv_dict_set(st, r.u.d, d->keys[i], d->vals[i]);
            return r;
        }
        tpl_val l = tv_list(st, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (!strcmp(name, "keys")) tv_list_push(st, l.u.l, d->keys[i]);
            else if (!strcmp(name, "values")) tv_list_push(st, l.u.l, d->vals[i]);
            else {
                tpl_val p = tv_list(st, 2);
                p.u.l->is_tuple = 1;
                tv_list_push(st, p.u.l, d->keys[i]);
                tv_list_push(st, p.u.l, d->vals[i]);
                tv_list_push(st, l.u.l, p);
            }
        }
        return l;
    }
    if (self.kind == TV_LIST) {
        tpl_list *l = self.u.l;
        if (!strcmp(name, "copy")) {
            nargs(st, line, name, n_args, n_kw, 0, 0);
            tpl_val r = tv_list(st, l->n);
            for (size_t i = 0; i < l->n; i++) tv_list_push(st, r.u.l, l->items[i]);
            return r;
        }
        nargs(st, line, name, n_args, n_kw, 1, 1);
        int64_t c = 0;
        for (size_t i = 0; i < l->n; i++)
            if (tv_equal(l->items[i], args[0])) {
                if (!strcmp(name, "index")) return tv_int((int64_t)i);
                c++;
            }
        if (!strcmp(name, "index")) tpl_fail(st, line, "value is not in list");
        return tv_int(c);
    }
    tpl_fail(st, line, "'%s' object has no method '%s'", tv_type_name(self), name);
}

/* dict(*args, **kwargs) as Python builds it */
static tpl_val build_dict(tpl_state *st, int line, const char *fn, tpl_val *args, size_t n_args, const char **kwn,
                          tpl_val *kwv, size_t n_kw) {
    tpl_val d = tv_dict(st, n_kw);
    if (n_args > 1) tpl_fail(st, line, "%s expected at most 1 argument, got %zu", fn, n_args);
    if (n_args == 1) {
        tpl_val a = args[0];
        if (a.kind == TV_DICT || a.kind == TV_NS) {
            for (size_t i = 0; i < a.u.d->n; i++) tv_dict_set(st, d.u.d, a.u.d->keys[i], a.u.d->vals[i]);
        } else {
            tpl_list *l = tv_iter(st, line, a);
            for (size_t i = 0; i < l->n; i++) {
                tpl_list *pair = tv_iter(st, line, l->items[i]);
                if (pair->n != 2) tpl_fail(st, line, "dictionary update sequence element #%zu has length %zu; 2 is required", i, pair->n);
                tv_dict_set(st, d.u.d, pair->items[0], pair->items[1]);
            }
        }
    }
    for (size_t i = 0; i < n_kw; i++) tv_dict_set(st, d.u.d, tv_cstr(kwn[i]), kwv[i]);
    return d;
}

tpl_val tpl_global_call(tpl_state *st, int line, int fn, tpl_val *args, size_t n_args, const char **kwn, tpl_val *kwv,
                        size_t n_kw) {
    tpl_step(st, line);
    switch (fn) {
    case FN_RANGE: {
        nargs(st, line, "range", n_args, n_kw, 1, 3);
        int64_t a = 0, b, step = 1;
        if (n_args == 1) b = int_arg(st, line, "range", args[0]);
        else {
            a = int_arg(st, line, "range", args[0]);
            b = int_arg(st, line, "range", args[1]);
            if (n_args == 3) step = int_arg(st, line, "range", args[2]);
        }
        if (step == 0) tpl_fail(st, line, "range() arg 3 must not be zero");
        /* count without overflow: the sandbox refuses more than MAX_RANGE items */
        double count = step > 0 ? ((double)b - (double)a) / (double)step : ((double)a - (double)b) / (double)-step;
        if (count > TPL_MAX_RANGE) tpl_fail(st, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", TPL_MAX_RANGE);
        tpl_val l = tv_list(st, count > 0 ? (size_t)count + 1 : 0);
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
            tv_list_push(st, l.u.l, tv_int(i));
            if (__builtin_add_overflow(i, step, &(int64_t){0})) break;
        }
        return l;
    }
    case FN_NAMESPACE: {
        tpl_val d = build_dict(st, line, "namespace", args, n_args, kwn, kwv, n_kw);
        for (size_t i = 0; i < d.u.d->n; i++)
            if (d.u.d->keys[i].kind == TV_STR && d.u.d->keys[i].n && d.u.d->keys[i].u.s[0] == '_')
                tpl_fail(st, line, "chat templates cannot store underscore-prefixed attributes on a namespace");
        d.kind = TV_NS;
        return d;
    }
    case FN_DICT: return build_dict(st, line, "dict", args, n_args, kwn, kwv, n_kw);
    case FN_RAISE: {
        tpl_val msg = n_args ? tv_stringify(st, args[0]) : tv_cstr("raise_exception called");
        /* the template's own words, verbatim: servers show them to the user */
        err_set(st->err, HEARTH_ERR_TEMPLATE, "%.*s", (int)(msg.n > 480 ? 480 : msg.n), msg.u.s);
        longjmp(st->fail, 1);
    }
    case FN_STRFTIME: {
        nargs(st, line, "strftime_now", n_args, n_kw, 1, 1);
        tpl_val f = str_arg(st, line, "strftime_now", args[0]);
        char fmt[256], buf[1024];
        if (f.n >= sizeof fmt) tpl_fail(st, line, "strftime_now: format too long");
        memcpy(fmt, f.u.s, f.n);
        fmt[f.n] = 0;
        if (memchr(f.u.s, 0, f.n)) tpl_fail(st, line, "strftime_now: embedded null character");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = f.n ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        return tv_str(st, buf, k);
    }
    }
    tpl_fail(st, line, "unknown function");
}
