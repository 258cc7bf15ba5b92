/* lexer.c: turns template source into tokens the way jinja2's lexer does under
 * transformers' settings (trim_blocks, lstrip_blocks, '-'/'+' whitespace control,
 * one trailing newline dropped, raw blocks). Owns whitespace handling; must not
 * interpret statements (that is parser.c). */
#include "tok/template/tpl_int.h"
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    tpl_state *st;
    const char *s;
    size_t n, pos;
    int line;
    tpl_tok *toks;
    size_t n_toks, cap;
} lexer;

/* Python's str.isspace for the ASCII range (includes the \x1c-\x1f separators). */
static int lx_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }

static tpl_tok *lx_push(lexer *lx, tpl_tok_kind kind, const char *s, size_t n) {
    if (lx->n_toks == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        tpl_tok *t = tpl_alloc(lx->st, cap * sizeof *t);
        if (lx->n_toks) memcpy(t, lx->toks, lx->n_toks * sizeof *t);
        lx->toks = t;
        lx->cap = cap;
    }
    tpl_tok *t = &lx->toks[lx->n_toks++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = lx->line;
    t->s = s;
    t->n = n;
    return t;
}

static void lx_advance(lexer *lx, size_t to) {
    for (size_t i = lx->pos; i < to; i++)
        if (lx->s[i] == '\n') lx->line++;
    lx->pos = to;
}

static int lx_at(lexer *lx, size_t p, const char *lit) {
    size_t k = strlen(lit);
    return p + k <= lx->n && memcmp(lx->s + p, lit, k) == 0;
}

/* Emits text [a, b) applying the strip sign of the tag that follows it. */
static void lx_data(lexer *lx, size_t a, size_t b, char sign, int lstrip_ok, int line_starting) {
    if (sign == '-') {
        while (b > a && lx_space((unsigned char)lx->s[b - 1])) b--;
    } else if (sign != '+' && lstrip_ok) {
        size_t l = b;
        while (l > a && lx->s[l - 1] != '\n') l--;
        if (l > a || line_starting) {
            size_t k = l;
            while (k < b && lx_space((unsigned char)lx->s[k])) k++;
            if (k == b && b > l) b = l;
        }
    }
    if (b > a) lx_push(lx, TK_DATA, lx->s + a, b - a);
}

/* Matches `{%(-|+|)\s*NAME\s*` at p; returns the position after it or 0. */
static size_t lx_match_word_tag(lexer *lx, size_t p, const char *word, char *sign) {
    if (!lx_at(lx, p, "{%")) return 0;
    p += 2;
    *sign = 0;
    if (p < lx->n && (lx->s[p] == '-' || lx->s[p] == '+')) *sign = lx->s[p++];
    while (p < lx->n && lx_space((unsigned char)lx->s[p])) p++;
    if (!lx_at(lx, p, word)) return 0;
    p += strlen(word);
    /* the word must end there: `rawx` is a different name */
    if (p < lx->n && (lx->s[p] == '_' || (lx->s[p] >= '0' && lx->s[p] <= '9') || ((lx->s[p] | 32) >= 'a' && (lx->s[p] | 32) <= 'z')))
        return 0;
    while (p < lx->n && lx_space((unsigned char)lx->s[p])) p++;
    return p;
}

static void lx_raw(lexer *lx, size_t p) {
    /* p is just after `{% raw`'s trailing whitespace; expect -%} or %} */
    if (lx_at(lx, p, "-%}")) {
        p += 3;
        while (p < lx->n && lx_space((unsigned char)lx->s[p])) p++;
    } else if (lx_at(lx, p, "%}")) {
        p += 2;
    } else {
        tpl_fail(lx->st, lx->line, "malformed raw tag");
    }
    lx_advance(lx, p);
    size_t start = p;
    for (size_t q = p; q < lx->n; q++) {
        char sign;
        size_t e = lx_match_word_tag(lx, q, "endraw", &sign);
        if (!e) continue;
        size_t end;
        if (lx_at(lx, e, "+%}")) end = e + 3;
        else if (lx_at(lx, e, "-%}")) {
            end = e + 3;
            while (end < lx->n && lx_space((unsigned char)lx->s[end])) end++;
        } else if (lx_at(lx, e, "%}")) {
            end = e + 2;
            if (end < lx->n && lx->s[end] == '\n') end++;
        } else
            continue;
        int line_starting = start == 0 || lx->s[start - 1] == '\n';
        lx_data(lx, start, q, sign, 1, line_starting);
        lx_advance(lx, end);
        return;
    }
    tpl_fail(lx->st, lx->line, "missing end of raw directive");
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c |= 32;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static void put_utf8(sbuf *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) { t[0] = (char)cp; sbuf_append(b, t, 1); }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 63)); sbuf_append(b, t, 2); }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 63)); t[2] = (char)(0x80 | (cp & 63));
        sbuf_append(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 63));
        t[2] = (char)(0x80 | ((cp >> 6) & 63)); t[3] = (char)(0x80 | (cp & 63));
        sbuf_append(b, t, 4);
    }
}

/* Python's unicode-escape decoding of a string literal body. */
static void lx_string(lexer *lx, size_t a, size_t b) {
    sbuf o;
    sbuf_init(&o);
    for (size_t i = a; i < b; i++) {
        char c = lx->s[i];
        if (c != '\\' || i + 1 >= b) { sbuf_putc(&o, c); continue; }
        char e = lx->s[++i];
        switch (e) {
        case '\n': break;
        case '\\': sbuf_putc(&o, '\\'); break;
        case '\'': sbuf_putc(&o, '\''); break;
        case '"': sbuf_putc(&o, '"'); break;
        case 'a': sbuf_putc(&o, 7); break;
        case 'b': sbuf_putc(&o, 8); break;
        case 'f': sbuf_putc(&o, 12); break;
        case 'n': sbuf_putc(&o, '\n'); break;
        case 'r': sbuf_putc(&o, '\r'); break;
        case 't': sbuf_putc(&o, '\t'); break;
        case 'v': sbuf_putc(&o, 11); break;
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i + 1 + (size_t)k < b ? hexval(lx->s[i + 1 + k]) : -1;
                if (h < 0) { sbuf_free(&o); tpl_fail(lx->st, lx->line, "truncated \\%c escape in string literal", e); }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF) { sbuf_free(&o); tpl_fail(lx->st, lx->line, "illegal Unicode character in string literal"); }
            i += (size_t)digits;
            put_utf8(&o, cp);
            break;
        }
        case 'N': sbuf_free(&o); tpl_fail(lx->st, lx->line, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i + 1 < b && lx->s[i + 1] >= '0' && lx->s[i + 1] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(lx->s[++i] - '0');
                put_utf8(&o, cp);
            } else {
                sbuf_putc(&o, '\\');
                sbuf_putc(&o, e);
            }
        }
    }
    if (o.oom) { sbuf_free(&o); tpl_fail(lx->st, lx->line, "out of memory"); }
    tpl_tok *t = lx_push(lx, TK_STRING, NULL, 0);
    t->s = tpl_strdup(lx->st, o.data ? o.data : "", o.len);
    t->n = o.len;
    sbuf_free(&o);
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name0(char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

/* digits with single '_' separators: (\d+_)*\d+ ; returns end or p when none */
static size_t lx_digits(lexer *lx, size_t p) {
    size_t q = p;
    while (q < lx->n && is_digit(lx->s[q])) {
        q++;
        if (q + 1 < lx->n && lx->s[q] == '_' && is_digit(lx->s[q + 1])) q++;
    }
    return q;
}

/* after_dot: jinja's float rule has a (?<!\.) lookbehind, so `a.0.1` is two subscripts */
static void lx_number(lexer *lx, size_t p, int after_dot) {
    size_t q = lx_digits(lx, p), e = q;
    int is_float = 0;
    /* float: digits ((.digits)? e[+-]?digits | .digits) */
    if (!after_dot && q + 1 < lx->n && lx->s[q] == '.' && is_digit(lx->s[q + 1])) { e = lx_digits(lx, q + 1); is_float = 1; }
    if (!after_dot && e < lx->n && (lx->s[e] | 32) == 'e') {
        size_t x = e + 1;
        if (x < lx->n && (lx->s[x] == '+' || lx->s[x] == '-')) x++;
        if (x < lx->n && is_digit(lx->s[x])) { e = lx_digits(lx, x); is_float = 1; }
    }
    char buf[128];
    size_t k = 0;
    if (is_float) {
        for (size_t i = p; i < e && k + 1 < sizeof buf; i++)
            if (lx->s[i] != '_') buf[k++] = lx->s[i];
        buf[k] = 0;
        tpl_tok *t = lx_push(lx, TK_FLOAT, lx->s + p, e - p);
        t->f = strtod(buf, NULL);
        lx_advance(lx, e);
        return;
    }
    /* integer: 0x / 0o / 0b prefixes, decimal, or zeros */
    int base = 10;
    size_t d = p;
    if (lx->s[p] == '0' && p + 1 < lx->n) {
        char c = (char)(lx->s[p + 1] | 32);
        if (c == 'x') base = 16; else if (c == 'o') base = 8; else if (c == 'b') base = 2;
        if (base != 10) d = p + 2;
    }
    uint64_t v = 0;
    int overflow = 0, any = 0;
    size_t i = d;
    if (base == 10 && lx->s[p] == '0') {
        /* 0(_?0)* */
        i = p + 1;
        while (i < lx->n && (lx->s[i] == '0' || (lx->s[i] == '_' && i + 1 < lx->n && lx->s[i + 1] == '0'))) i++;
        any = 1;
    } else {
        for (; i < lx->n; i++) {
            char c = lx->s[i];
            if (c == '_' && any && i + 1 < lx->n && hexval(lx->s[i + 1]) >= 0 && hexval(lx->s[i + 1]) < base) continue;
            if (base != 10 && c == '_' && !any && i + 1 < lx->n && hexval(lx->s[i + 1]) >= 0 && hexval(lx->s[i + 1]) < base) continue;
            int h = hexval(c);
            if (h < 0 || h >= base || (base == 10 && !is_digit(c))) break;
            if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base) overflow = 1;
            v = v * (uint64_t)base + (uint64_t)h;
            any = 1;
        }
    }
    if (!any) { /* `0x` without digits: jinja lexes `0` then a name */
        i = p + 1;
        v = 0;
    }
    if (overflow || v > (uint64_t)INT64_MAX) tpl_fail(lx->st, lx->line, "integer literal too large");
    tpl_tok *t = lx_push(lx, TK_INT, lx->s + p, i - p);
    t->i = (int64_t)v;
    lx_advance(lx, i);
}

static const char *const lx_ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char lx_ops1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens inside {{ }} or {% %} up to and including the end tag. */
static void lx_tag(lexer *lx, int is_block) {
    char stack[256];
    size_t depth = 0;
    for (;;) {
        size_t p = lx->pos;
        if (p >= lx->n) tpl_fail(lx->st, lx->line, "unexpected end of template, expected end of %s tag", is_block ? "block" : "print");
        const char *end = is_block ? "%}" : "}}";
        if (depth == 0) {
            if (is_block && lx_at(lx, p, "+%}")) { lx_push(lx, TK_BLOCK_END, NULL, 0); lx_advance(lx, p + 3); return; }
            if (lx->s[p] == '-' && lx_at(lx, p + 1, end)) {
                lx_push(lx, is_block ? TK_BLOCK_END : TK_VAR_END, NULL, 0);
                size_t q = p + 3;
                while (q < lx->n && lx_space((unsigned char)lx->s[q])) q++;
                lx_advance(lx, q);
                return;
            }
            if (lx_at(lx, p, end)) {
                lx_push(lx, is_block ? TK_BLOCK_END : TK_VAR_END, NULL, 0);
                size_t q = p + 2;
                if (is_block && q < lx->n && lx->s[q] == '\n') q++; /* trim_blocks */
                lx_advance(lx, q);
                return;
            }
        }
        char c = lx->s[p];
        if (lx_space((unsigned char)c)) { lx_advance(lx, p + 1); continue; }
        if (is_digit(c)) { lx_number(lx, p, p > 0 && lx->s[p - 1] == '.'); continue; }
        if (is_name0(c)) {
            size_t q = p;
            while (q < lx->n && (is_name0(lx->s[q]) || is_digit(lx->s[q]))) q++;
            lx_push(lx, TK_NAME, tpl_strdup(lx->st, lx->s + p, q - p), q - p);
            lx_advance(lx, q);
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < lx->n && lx->s[q] != c) q += lx->s[q] == '\\' ? 2 : 1;
            if (q >= lx->n) tpl_fail(lx->st, lx->line, "unterminated string literal");
            lx_string(lx, p + 1, q);
            lx_advance(lx, q + 1);
            continue;
        }
        size_t oplen = 0;
        for (int k = 0; lx_ops2[k]; k++)
            if (lx_at(lx, p, lx_ops2[k])) oplen = 2;
        if (!oplen && strchr(lx_ops1, c) && c) oplen = 1;
        if (!oplen) tpl_fail(lx->st, lx->line, "unexpected char '%c' in tag", c);
        if (oplen == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth == sizeof stack) tpl_fail(lx->st, lx->line, "brackets nested too deeply");
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (oplen == 1 && (c == ')' || c == ']' || c == '}')) {
            if (!depth) tpl_fail(lx->st, lx->line, "unexpected '%c'", c);
            if (stack[--depth] != c) tpl_fail(lx->st, lx->line, "unexpected '%c', expected '%c'", c, stack[depth]);
        }
        lx_push(lx, TK_OP, lx->s + p, oplen);
        lx_advance(lx, p + oplen);
    }
}

void tpl_lex(tpl_state *st, const char *src, size_t len, tpl_tok **toks, size_t *n_toks) {
    /* jinja normalises \r\n and \r to \n and drops one trailing newline */
    char *s = tpl_alloc(st, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer lx = {.st = st, .s = s, .n = n, .line = 1};
    st->src = s;
    while (lx.pos < lx.n) {
        size_t p = lx.pos, start = p;
        int line_starting = p == 0 || s[p - 1] == '\n';
        size_t tag = 0;
        int kind = 0; /* 1 var, 2 block, 3 comment, 4 raw */
        size_t raw_end = 0;
        char sign = 0;
        for (; p + 1 < n; p++) {
            if (s[p] != '{') continue;
            char c = s[p + 1];
            if (c == '%' && (raw_end = lx_match_word_tag(&lx, p, "raw", &sign)) &&
                (lx_at(&lx, raw_end, "%}") || lx_at(&lx, raw_end, "-%}"))) { kind = 4; break; }
            if (c == '{') kind = 1; else if (c == '%') kind = 2; else if (c == '#') kind = 3;
            if (kind) break;
        }
        if (!kind) { lx_data(&lx, start, n, 0, 0, 0); lx_advance(&lx, n); break; }
        tag = p + 2;
        if (kind != 4) {
            sign = 0;
            if (tag < n && (s[tag] == '-' || s[tag] == '+')) sign = s[tag++];
        }
        lx_data(&lx, start, p, sign, kind != 1, line_starting);
        lx_advance(&lx, p);
        if (kind == 4) { lx_raw(&lx, raw_end); continue; }
        lx_advance(&lx, tag);
        if (kind == 3) {
            const char *q = NULL;
            for (size_t i = tag; i + 1 < n; i++)
                if (s[i] == '#' && s[i + 1] == '}') { q = s + i; break; }
            if (!q) tpl_fail(st, lx.line, "missing end of comment tag");
            size_t e = (size_t)(q - s), after = e + 2;
            if (e > tag && s[e - 1] == '-') {
                while (after < n && lx_space((unsigned char)s[after])) after++;
            } else if (!(e > tag && s[e - 1] == '+')) {
                if (after < n && s[after] == '\n') after++;
            }
            lx_advance(&lx, after);
            continue;
        }
        lx_push(&lx, kind == 1 ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, NULL, 0);
        lx_tag(&lx, kind == 2);
    }
    lx_push(&lx, TK_EOF, NULL, 0);
    *toks = lx.toks;
    *n_toks = lx.n_toks;
}
