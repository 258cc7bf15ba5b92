/* gram_gbnf.c: llama.cpp's GBNF grammar format to grammar rules. `name ::= alternatives`,
 * "literals" and [classes] with escapes, '.', groups, rule references, quantifiers
 * * + ? {m} {m,} {m,n}, # comments; newlines are spacing (a rule ends where the next
 * `name ::=` starts). The start rule is "root". Errors carry line:col. */
#include "grammar/gram_parse.h"
#include <stdlib.h>
#include <string.h>

static int word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(gr_parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->i++;
        else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else
            break;
    }
}

static size_t word_end(const gr_parser *p, size_t i) {
    while (i < p->n && word_char(p->s[i])) i++;
    return i;
}

/* at a word: is it the head of a new rule ("name ::=")? */
static int at_rule_head(gr_parser *p) {
    size_t e = word_end(p, p->i);
    if (e == p->i) return 0;
    gr_parser q = *p;
    q.i = e;
    skip_space(&q);
    return q.i + 3 <= q.n && !memcmp(q.s + q.i, "::=", 3);
}

static void put_utf8(char *o, size_t *n, uint32_t c) {
    if (c < 0x80)
        o[(*n)++] = (char)c;
    else if (c < 0x800)
        o[(*n)++] = (char)(0xC0 | c >> 6), o[(*n)++] = (char)(0x80 | (c & 63));
    else if (c < 0x10000)
        o[(*n)++] = (char)(0xE0 | c >> 12), o[(*n)++] = (char)(0x80 | (c >> 6 & 63)),
        o[(*n)++] = (char)(0x80 | (c & 63));
    else
        o[(*n)++] = (char)(0xF0 | c >> 18), o[(*n)++] = (char)(0x80 | (c >> 12 & 63)),
        o[(*n)++] = (char)(0x80 | (c >> 6 & 63)), o[(*n)++] = (char)(0x80 | (c & 63));
}

static int32_t literal(gr_parser *p) {
    size_t at = p->i++;
    char *buf = malloc(p->n - p->i + 4);
    size_t n = 0;
    if (!buf) {
        p->b->oom = 1;
        return 0;
    }
    for (;;) {
        if (p->i >= p->n || p->s[p->i] == '\n') {
            gr_err_at(p, at, "unterminated string literal%s", "");
            break;
        }
        char c = p->s[p->i++];
        if (c == '"') break;
        if ((unsigned char)c == GR_SPECIAL_BYTE) { /* not UTF-8; it would reach special tokens */
            gr_err_at(p, p->i - 1, "byte 0xFF in a literal is not UTF-8%s", "");
            break;
        }
        if (c != '\\') {
            buf[n++] = c;
            continue;
        }
        if (p->i >= p->n) continue;
        char e = p->s[p->i++];
        uint32_t v = 0;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            for (int k = 0; k < digits; k++) {
                if (p->i >= p->n || gr_hexval(p->s[p->i]) < 0) {
                    gr_err_at(p, p->i, "bad \\%s escape in literal", (char[]){e, 0});
                    break;
                }
                v = v * 16 + (uint32_t)gr_hexval(p->s[p->i++]);
            }
            if (p->st) break;
            if (v > 0x10FFFF) {
                gr_err_at(p, p->i, "escape beyond U+10FFFF%s", "");
                break;
            }
            put_utf8(buf, &n, v);
            continue;
        }
        switch (e) {
        case 'n': buf[n++] = '\n'; break;
        case 't': buf[n++] = '\t'; break;
        case 'r': buf[n++] = '\r'; break;
        case '\\':
        case '"':
        case '[':
        case ']': buf[n++] = e; break;
        default: gr_err_at(p, p->i - 2, "unknown escape \\%s in literal", (char[]){e, 0}); break;
        }
        if (p->st) break;
    }
    int32_t node = p->st ? 0 : gr_literal(p->b, buf, n);
    free(buf);
    return node;
}

static int32_t alternates(gr_parser *p, int depth);

static int32_t sequence(gr_parser *p, int depth) {
    int32_t *kids = NULL;
    int n = 0, cap = 0;
    for (;;) {
        skip_space(p);
        if (p->i >= p->n || p->st) break;
        char c = p->s[p->i];
        size_t at = p->i;
        int32_t x;
        if (c == '|' || c == ')') break;
        if (c == '"')
            x = literal(p);
        else if (c == '[')
            x = gr_parse_class(p);
        else if (c == '.')
            p->i++, x = gr_any_char(p, 1);
        else if (c == '(') {
            if (depth > 200) {
                gr_err_at(p, at, "groups nested too deeply%s", "");
                break;
            }
            p->i++;
            x = alternates(p, depth + 1);
            skip_space(p);
            if (!p->st && (p->i >= p->n || p->s[p->i] != ')')) gr_err_at(p, at, "unbalanced '('%s", "");
            p->i++;
        } else if (word_char(c)) {
            if (at_rule_head(p)) break;
            size_t e = word_end(p, p->i);
            int32_t r = gr_rule_named(p->b, p->s + p->i, e - p->i);
            if (r < 0) break;
            if (!p->b->rules[r].line) {
                int line = 1, col = 1;
                for (size_t k = 0; k < at; k++) {
                    if (p->s[k] == '\n')
                        line++, col = 1;
                    else
                        col++;
                }
                p->b->rules[r].line = line, p->b->rules[r].col = col;
            }
            p->i = e;
            x = gr_ref(p->b, r);
        } else {
            gr_err_at(p, at, "unexpected character '%s'", (char[]){c, 0});
            break;
        }
        if (p->st) break;
        x = gr_quantify(p, x);
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            int32_t *k = realloc(kids, (size_t)cap * sizeof *k);
            if (!k) {
                p->b->oom = 1;
                break;
            }
            kids = k;
        }
        kids[n++] = x;
    }
    int32_t r = n ? gr_seq(p->b, kids, n) : gr_empty(p->b);
    free(kids);
    return r;
}

static int32_t alternates(gr_parser *p, int depth) {
    int32_t *alts = NULL;
    int n = 0, cap = 0;
    for (;;) {
        int32_t x = sequence(p, depth);
        if (p->st) break;
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            int32_t *k = realloc(alts, (size_t)cap * sizeof *k);
            if (!k) {
                p->b->oom = 1;
                break;
            }
            alts = k;
        }
        alts[n++] = x;
        skip_space(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    int32_t r = n ? gr_alt(p->b, alts, n) : gr_empty(p->b);
    free(alts);
    return r;
}

hearth_status gr_gbnf(gr_build *b, const char *text, size_t len, int32_t *root, hearth_error *err) {
    gr_parser p = {.b = b, .s = text, .n = len, .gbnf = 1, .err = err};
    p.class_buf = malloc(GR_MAX_CLASS * 2 * sizeof *p.class_buf);
    if (!p.class_buf) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (;;) {
        skip_space(&p);
        if (p.i >= p.n || p.st) break;
        size_t at = p.i, e = word_end(&p, p.i);
        if (e == at) {
            gr_err_at(&p, at, "expected a rule name%s", "");
            break;
        }
        int32_t r = gr_rule_named(b, text + at, e - at);
        if (r < 0) break;
        p.i = e;
        skip_space(&p);
        if (p.i + 3 > p.n || memcmp(text + p.i, "::=", 3)) {
            gr_err_at(&p, p.i, "expected '::=' after rule name%s", "");
            break;
        }
        p.i += 3;
        if (b->rules[r].body >= 0) {
            gr_err_at(&p, at, "rule '%s' is defined twice", b->rules[r].name);
            break;
        }
        int32_t body = alternates(&p, 0);
        if (p.st) break;
        skip_space(&p);
        if (p.i < p.n && !word_char(p.s[p.i])) {
            gr_err_at(&p, p.i, "unexpected character '%s'", (char[]){p.s[p.i], 0});
            break;
        }
        b->rules[r].body = body;
    }
    free(p.class_buf);
    if (p.st) return p.st;
    if (b->oom) return err_set(err, HEARTH_ERR_NOMEM, "grammar too large or out of memory");
    int32_t r = -1;
    for (int32_t i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && !strcmp(b->rules[i].name, "root")) r = i;
    if (r < 0 || b->rules[r].body < 0) return err_set(err, HEARTH_ERR_FORMAT, "grammar has no 'root' rule");
    *root = r;
    return HEARTH_OK;
}
