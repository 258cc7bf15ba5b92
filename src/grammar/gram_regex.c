/* gram_regex.c: a PCRE2-subset regular expression to a grammar node: literals, escapes
 * (\d \w \s and negations, \n \t \r \f \v \xHH \uHHHH), classes, '.', groups ((...),
 * (?:...), (?<name>...)), alternation, quantifiers (* + ? {m} {m,} {m,n}, lazy or
 * possessive suffixes read as greedy: the language is the same) and ^ $ at the ends of a
 * top-level alternative. Anything else (lookaround, backreferences, \b, flags) is refused
 * by name. Shares the class parser with GBNF. */
#include "grammar/gram_parse.h"
#include <stdlib.h>
#include <string.h>

int32_t gr_utf8_next(const char *s, size_t n, size_t *pos) {
    const unsigned char *u = (const unsigned char *)s + *pos;
    size_t left = n - *pos;
    if (!left) return -1;
    uint32_t c = u[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) return -1;
    if (len > 1) {
        c &= (1u << (7 - len)) - 1;
        for (int i = 1; i < len; i++) {
            if ((u[i] & 0xC0) != 0x80) return -1;
            c = (c << 6) | (u[i] & 0x3F);
        }
    }
    *pos += (size_t)len;
    return (int32_t)c;
}

void gr_err_at(gr_parser *p, size_t at, const char *fmt, const char *arg) {
    if (p->st) return;
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->n; i++) {
        if (p->s[i] == '\n')
            line++, col = 1;
        else
            col++;
    }
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    if (p->gbnf)
        p->st = err_set(p->err, HEARTH_ERR_FORMAT, "%d:%d: %s", line, col, msg);
    else
        p->st = err_set(p->err, HEARTH_ERR_FORMAT, "regex /%.*s%s/ at offset %zu: %s", (int)(p->n < 80 ? p->n : 80),
                        p->s, p->n > 80 ? "..." : "", at, msg);
}

static void add_range(uint32_t *r, int *n, uint32_t lo, uint32_t hi) {
    if (*n < GR_MAX_CLASS) r[2 * *n] = lo, r[2 * *n + 1] = hi, (*n)++;
}

/* \d \w \s and their negations as ranges; 0 if c is not a class escape */
static int class_escape(int c, uint32_t *r, int *n) {
    int neg = c == 'D' || c == 'W' || c == 'S';
    uint32_t tmp[2 * 8];
    int k = 0;
    switch (c | 0x20) {
    case 'd': add_range(tmp, &k, '0', '9'); break;
    case 'w':
        add_range(tmp, &k, '0', '9'), add_range(tmp, &k, 'A', 'Z'), add_range(tmp, &k, '_', '_');
        add_range(tmp, &k, 'a', 'z');
        break;
    case 's': add_range(tmp, &k, '\t', '\r'), add_range(tmp, &k, ' ', ' '); break;
    default: return 0;
    }
    if (!neg) {
        for (int i = 0; i < k; i++) add_range(r, n, tmp[2 * i], tmp[2 * i + 1]);
    } else {
        uint32_t lo = 0;
        for (int i = 0; i < k; i++) {
            if (tmp[2 * i] > lo) add_range(r, n, lo, tmp[2 * i] - 1);
            lo = tmp[2 * i + 1] + 1;
        }
        add_range(r, n, lo, 0x10FFFF);
    }
    return 1;
}

/* A single escaped code point after the backslash; -1 (error set) if not supported. */
static int32_t escape_cp(gr_parser *p) {
    size_t at = p->i;
    if (p->i >= p->n) {
        gr_err_at(p, at, "pattern ends after a backslash%s", "");
        return -1;
    }
    char c = p->s[p->i++];
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x':
    case 'u':
    case 'U': {
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        int32_t v = 0;
        if (c == 'x' && p->i < p->n && p->s[p->i] == '{') { /* \x{HHHH} */
            p->i++;
            while (p->i < p->n && gr_hexval(p->s[p->i]) >= 0 && v <= 0x10FFFF) v = v * 16 + gr_hexval(p->s[p->i++]);
            if (p->i >= p->n || p->s[p->i] != '}' || v > 0x10FFFF) {
                gr_err_at(p, at, "bad \\x{...} escape%s", "");
                return -1;
            }
            p->i++;
            return v;
        }
        for (int k = 0; k < digits; k++) {
            if (p->i >= p->n || gr_hexval(p->s[p->i]) < 0) {
                gr_err_at(p, at, "bad \\%s escape", c == 'x' ? "x" : "u");
                return -1;
            }
            v = v * 16 + gr_hexval(p->s[p->i++]);
        }
        if (v > 0x10FFFF) {
            gr_err_at(p, at, "escape beyond U+10FFFF%s", "");
            return -1;
        }
        return v;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
            char what[4] = {'\\', c, 0};
            gr_err_at(p, at, "escape %s is not supported", what);
            return -1;
        }
        p->i--;
        return gr_utf8_next(p->s, p->n, &p->i);
    }
}

int32_t gr_parse_class(gr_parser *p) {
    size_t at = p->i;
    p->i++; /* '[' */
    int neg = 0, n = 0;
    uint32_t *r = p->class_buf;
    if (p->i < p->n && p->s[p->i] == '^') neg = 1, p->i++;
    int first = 1;
    for (;;) {
        if (p->i >= p->n) {
            gr_err_at(p, at, "unterminated character class%s", "");
            return 0;
        }
        char c = p->s[p->i];
        if (c == ']' && !(first && !p->gbnf)) {
            p->i++;
            break;
        }
        first = 0;
        int32_t lo;
        if (c == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            gr_err_at(p, p->i, "POSIX classes [:name:] are not supported%s", "");
            return 0;
        }
        if (c == '\\') {
            p->i++;
            if (p->i < p->n && class_escape(p->s[p->i], r, &n)) {
                p->i++;
                continue;
            }
            if (p->gbnf && p->i < p->n && (p->s[p->i] == ']' || p->s[p->i] == '[' || p->s[p->i] == '-'))
                lo = (unsigned char)p->s[p->i++];
            else if ((lo = escape_cp(p)) < 0)
                return 0;
        } else if ((lo = gr_utf8_next(p->s, p->n, &p->i)) < 0) {
            gr_err_at(p, p->i, "invalid UTF-8%s", "");
            return 0;
        }
        int32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                if ((hi = escape_cp(p)) < 0) return 0;
            } else if ((hi = gr_utf8_next(p->s, p->n, &p->i)) < 0) {
                gr_err_at(p, p->i, "invalid UTF-8%s", "");
                return 0;
            }
            if (hi < lo) {
                gr_err_at(p, at, "class range out of order%s", "");
                return 0;
            }
        }
        add_range(r, &n, (uint32_t)lo, (uint32_t)hi);
    }
    if (n >= GR_MAX_CLASS) {
        gr_err_at(p, at, "character class too long%s", "");
        return 0;
    }
    if (neg) {
        /* complement over all code points */
        uint32_t *c = malloc((size_t)(n + 1) * 2 * sizeof *c);
        if (!c) {
            p->b->oom = 1;
            return 0;
        }
        int m = 0;
        for (uint32_t lo = 0; lo <= 0x10FFFF;) {
            /* smallest range start >= lo that covers lo? find any range containing lo */
            int hit = -1;
            uint32_t next_start = 0x110000;
            for (int i = 0; i < n; i++) {
                if (r[2 * i] <= lo && r[2 * i + 1] >= lo) {
                    hit = i;
                    break;
                }
                if (r[2 * i] > lo && r[2 * i] < next_start) next_start = r[2 * i];
            }
            if (hit >= 0) {
                lo = r[2 * hit + 1] + 1;
                continue;
            }
            c[2 * m] = lo, c[2 * m + 1] = next_start - 1, m++;
            lo = next_start;
        }
        int32_t node = gr_cpset(p->b, c, m, p->json);
        free(c);
        return node;
    }
    return gr_cpset(p->b, r, n, p->json);
}

int32_t gr_any_char(gr_parser *p, int newline_too) {
    uint32_t r[4] = {0, '\n' - 1, '\n' + 1, 0x10FFFF};
    if (newline_too) r[1] = 0x10FFFF;
    return gr_cpset(p->b, r, newline_too ? 1 : 2, p->json);
}

int32_t gr_single_cp(gr_parser *p, uint32_t cp) {
    uint32_t r[2] = {cp, cp};
    return gr_cpset(p->b, r, 1, p->json);
}

/* {m}, {m,}, {m,n}: returns 1 and fills min/max, 0 when the brace is not a quantifier */
int gr_parse_braces(gr_parser *p, int32_t *min, int32_t *max) {
    size_t i = p->i + 1;
    int64_t a = 0, b = -1;
    int digits = 0;
    while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9' && a <= GR_MAX_REPEAT) a = a * 10 + (p->s[i++] - '0'), digits++;
    if (!digits) return 0;
    if (i < p->n && p->s[i] == ',') {
        i++;
        if (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') {
            b = 0;
            while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9' && b <= GR_MAX_REPEAT) b = b * 10 + (p->s[i++] - '0');
        }
    } else
        b = a;
    if (i >= p->n || p->s[i] != '}') return 0;
    p->i = i + 1;
    *min = (int32_t)(a > GR_MAX_REPEAT ? GR_MAX_REPEAT + 1 : a);
    *max = b < 0 ? GR_INF : (int32_t)(b > GR_MAX_REPEAT ? GR_MAX_REPEAT + 1 : b);
    return 1;
}

static int32_t re_alt(gr_parser *p, int depth, int top);

static int32_t re_atom(gr_parser *p, int depth) {
    char c = p->s[p->i];
    size_t at = p->i;
    if (c == '(') {
        if (depth > 200) {
            gr_err_at(p, at, "groups nested too deeply%s", "");
            return 0;
        }
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
                p->i += 2;
            else if (p->i + 1 < p->n && (p->s[p->i + 1] == '<' || p->s[p->i + 1] == 'P') && p->i + 2 < p->n &&
                     p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                p->i++;
            } else {
                gr_err_at(p, at, "group syntax (?%s is not supported (lookaround, flags)",
                          p->i + 1 < p->n ? (char[]){p->s[p->i + 1], 0} : "");
                return 0;
            }
        }
        int32_t x = re_alt(p, depth + 1, 0);
        if (p->st) return 0;
        if (p->i >= p->n || p->s[p->i] != ')') {
            gr_err_at(p, at, "unbalanced '('%s", "");
            return 0;
        }
        p->i++;
        return x;
    }
    if (c == '[') return gr_parse_class(p);
    if (c == '.') {
        p->i++;
        return gr_any_char(p, 0);
    }
    if (c == '\\') {
        p->i++;
        if (p->i < p->n) {
            uint32_t r[2 * 8];
            int n = 0;
            if (class_escape(p->s[p->i], r, &n)) {
                p->i++;
                return gr_cpset(p->b, r, n, p->json);
            }
        }
        int32_t cp = escape_cp(p);
        return cp < 0 ? 0 : gr_single_cp(p, (uint32_t)cp);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (c == '{') {
            int32_t a, b;
            size_t save = p->i;
            if (!gr_parse_braces(p, &a, &b)) {
                p->i++;
                return gr_single_cp(p, '{');
            }
            p->i = save;
        }
        gr_err_at(p, at, "quantifier with nothing to repeat%s", "");
        return 0;
    }
    if (c == '^' || c == '$') {
        gr_err_at(p, at, "anchor inside the pattern is not supported%s", "");
        return 0;
    }
    int32_t cp = gr_utf8_next(p->s, p->n, &p->i);
    if (cp < 0) {
        gr_err_at(p, at, "invalid UTF-8%s", "");
        return 0;
    }
    return gr_single_cp(p, (uint32_t)cp);
}

/* Applies any quantifiers after an atom. */
int32_t gr_quantify(gr_parser *p, int32_t x) {
    for (;;) {
        if (p->i >= p->n || p->st) return x;
        char c = p->s[p->i];
        int32_t min, max;
        if (c == '*')
            min = 0, max = GR_INF, p->i++;
        else if (c == '+')
            min = 1, max = GR_INF, p->i++;
        else if (c == '?')
            min = 0, max = 1, p->i++;
        else if (c == '{' && gr_parse_braces(p, &min, &max)) {
            if (max != GR_INF && max < min) {
                gr_err_at(p, p->i, "repetition {m,n} with n < m%s", "");
                return 0;
            }
        } else
            return x;
        if (!p->gbnf && p->i < p->n && (p->s[p->i] == '?' || p->s[p->i] == '+')) p->i++; /* lazy / possessive */
        x = gr_repeat(p->b, x, min, max);
    }
}

static int32_t re_seq(gr_parser *p, int depth, int top, int *anch_start, int *anch_end) {
    int32_t kids[256];
    int n = 0;
    int32_t acc = -1;
    if (top && p->i < p->n && p->s[p->i] == '^') *anch_start = 1, p->i++;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')' && !p->st) {
        if (top && p->s[p->i] == '$' && (p->i + 1 == p->n || p->s[p->i + 1] == '|')) {
            *anch_end = 1, p->i++;
            break;
        }
        int32_t x = gr_quantify(p, re_atom(p, depth));
        if (p->st) return 0;
        if (n == 256) {
            acc = gr_seq(p->b, kids, n), n = 0, kids[n++] = acc;
        }
        kids[n++] = x;
    }
    return n ? gr_seq(p->b, kids, n) : gr_empty(p->b);
}

static int32_t re_alt(gr_parser *p, int depth, int top) {
    int32_t alts[256];
    int n = 0;
    for (;;) {
        int as = 0, ae = 0;
        int32_t x = re_seq(p, depth, top, &as, &ae);
        if (p->st) return 0;
        if (top && p->json) {
            /* JSON Schema "pattern" is a search: an unanchored end matches anything */
            int32_t any = gr_repeat(p->b, gr_any_char(p, 1), 0, GR_INF);
            x = gr_seq3(p->b, as ? gr_empty(p->b) : any, x, ae ? gr_empty(p->b) : any);
        }
        if (n == 256) {
            int32_t a = gr_alt(p->b, alts, n);
            n = 0, alts[n++] = a;
        }
        alts[n++] = x;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    return gr_alt(p->b, alts, n);
}

hearth_status gr_regex(gr_build *b, const char *re, size_t len, int json, int32_t *out, hearth_error *err) {
    gr_parser p = {.b = b, .s = re, .n = len, .json = json, .err = err};
    p.class_buf = malloc(GR_MAX_CLASS * 2 * sizeof *p.class_buf);
    if (!p.class_buf) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    *out = re_alt(&p, 0, 1);
    if (!p.st && p.i < p.n) gr_err_at(&p, p.i, "unbalanced ')'%s", "");
    free(p.class_buf);
    if (!p.st && b->oom) p.st = err_set(err, HEARTH_ERR_NOMEM, "pattern too large or out of memory");
    return p.st;
}
