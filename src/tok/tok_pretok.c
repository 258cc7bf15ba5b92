/* tok_pretok.c: HF pre-tokenizers (ByteLevel, Split with the five delimiter
 * behaviors, Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation,
 * BertPreTokenizer, Sequence): parsing and cutting a segment into model pieces.
 * Pieces only; the model never runs here. */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* GPT-2's split regex, as the HF ByteLevel pre-tokenizer uses it with use_regex. */
static const char *BYTELEVEL_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* HF Whitespace: \w+|[^\w\s]+, keeping the matches. HF runs it in Oniguruma, whose
 * Unicode \w is the Word property (letters, marks, Nd, Nl, Pc, ZWNJ/ZWJ); PCRE2's \w
 * is narrower, so the class is spelled out. */
#define TOK_WORD_CLASS "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}"
static const char *WHITESPACE_RE = "[" TOK_WORD_CLASS "]+|[^" TOK_WORD_CLASS "\\s]+";

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) tok_pre_free(p->kids[i]);
    free(p->kids);
    free(p->literal);
    if (p->re) pcre2_code_free(p->re);
    free(p);
}

tok_pre *tok_pre_new_bytelevel(int add_prefix_space, int use_regex, hearth_error *err) {
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) { err_set(err, HEARTH_ERR_NOMEM, "out of memory"); return NULL; }
    tok_bytelevel_init();
    p->kind = TOK_PRE_BYTELEVEL;
    p->add_prefix_space = add_prefix_space;
    p->use_regex = use_regex;
    if (use_regex && !(p->re = tok_regex_compile(BYTELEVEL_RE, err))) { free(p); return NULL; }
    return p;
}

tok_pre *tok_pre_new_split_regex(const char *regex, hearth_error *err) {
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) { err_set(err, HEARTH_ERR_NOMEM, "out of memory"); return NULL; }
    p->kind = TOK_PRE_SPLIT;
    p->behavior = TOK_SPLIT_ISOLATED;
    if (!(p->re = tok_regex_compile(regex, err))) { free(p); return NULL; }
    return p;
}

static int parse_behavior(const char *b, tok_split_behavior *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (b && !strcmp(b, names[i])) { *out = (tok_split_behavior)i; return 1; }
    return 0;
}

static int jbool(json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static hearth_status parse_metaspace(json_t *j, tok_pre_kind kind, char rep[5], int *prepend, int *split,
                                     hearth_error *err) {
    const char *r = json_string_value(json_object_get(j, "replacement"));
    if (!r) r = "\xE2\x96\x81";
    size_t rl = strlen(r);
    if (rl == 0 || rl > 4 || tok_utf8_len((const uint8_t *)r, rl) != (int)rl)
        return err_set(err, HEARTH_ERR_FORMAT, "Metaspace replacement must be one character");
    memcpy(rep, r, rl + 1);
    const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
    if (ps) {
        if (!strcmp(ps, "never")) *prepend = 0;
        else if (!strcmp(ps, "first")) *prepend = 1;
        else if (!strcmp(ps, "always")) *prepend = 2;
        else return err_set(err, HEARTH_ERR_FORMAT, "Metaspace prepend_scheme '%.50s' is unknown", ps);
    } else {
        *prepend = jbool(j, "add_prefix_space", 1) ? 2 : 0;
    }
    if (split) *split = jbool(j, "split", 1);
    (void)kind;
    return HEARTH_OK;
}

hearth_status tok_pre_parse(json_t *j, tok_pre **out, hearth_error *err) {
    *out = NULL;
    if (!json_is_object(j)) return err_set(err, HEARTH_ERR_FORMAT, "pre_tokenizer is not an object");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return err_set(err, HEARTH_ERR_FORMAT, "pre_tokenizer has no type");
    if (!strcmp(type, "ByteLevel")) {
        tok_pre *p = tok_pre_new_bytelevel(jbool(j, "add_prefix_space", 1), jbool(j, "use_regex", 1), err);
        *out = p;
        return p ? HEARTH_OK : err->status;
    }
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = HEARTH_OK;
    if (!strcmp(type, "Sequence")) {
        p->kind = TOK_PRE_SEQUENCE;
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) { st = err_set(err, HEARTH_ERR_FORMAT, "Sequence pre_tokenizer without a list"); goto done; }
        p->kids = calloc(json_array_size(arr) + 1, sizeof *p->kids);
        if (!p->kids) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
        for (size_t i = 0; i < json_array_size(arr) && st == HEARTH_OK; i++) {
            st = tok_pre_parse(json_array_get(arr, i), &p->kids[i], err);
            if (st == HEARTH_OK) p->n_kids++;
        }
    } else if (!strcmp(type, "Split")) {
        p->kind = TOK_PRE_SPLIT;
        json_t *pat = json_object_get(j, "pattern");
        json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
        if (json_is_string(s)) {
            p->literal_len = json_string_length(s);
            p->literal = malloc(p->literal_len + 1);
            if (!p->literal) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
            memcpy(p->literal, json_string_value(s), p->literal_len + 1);
        } else if (json_is_string(r)) {
            if (!(p->re = tok_regex_compile(json_string_value(r), err))) { st = err->status; goto done; }
        } else {
            st = err_set(err, HEARTH_ERR_FORMAT, "Split pre_tokenizer: pattern must be String or Regex");
            goto done;
        }
        if (!parse_behavior(json_string_value(json_object_get(j, "behavior")), &p->behavior)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "Split pre_tokenizer: unknown behavior");
            goto done;
        }
        p->invert = jbool(j, "invert", 0);
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        st = parse_metaspace(j, p->kind, p->replacement, &p->prepend, &p->split, err);
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = TOK_PRE_WHITESPACE;
        if (!(p->re = tok_regex_compile(WHITESPACE_RE, err))) st = err->status;
    } else if (!strcmp(type, "WhitespaceSplit")) p->kind = TOK_PRE_WHITESPACE_SPLIT;
    else if (!strcmp(type, "BertPreTokenizer")) p->kind = TOK_PRE_BERT;
    else if (!strcmp(type, "Digits")) {
        p->kind = TOK_PRE_DIGITS;
        p->individual_digits = jbool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = TOK_PRE_PUNCTUATION;
        p->behavior = TOK_SPLIT_ISOLATED;
        const char *b = json_string_value(json_object_get(j, "behavior"));
        if (b && !parse_behavior(b, &p->behavior)) st = err_set(err, HEARTH_ERR_FORMAT, "Punctuation: unknown behavior");
    } else {
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "pre_tokenizer type '%.100s' is not supported", type);
    }
done:
    if (st != HEARTH_OK) { tok_pre_free(p); return st; }
    *out = p;
    return HEARTH_OK;
}

/* A span of a piece and whether the pattern matched it. */
typedef struct seg { size_t a, b; int m; } seg;
typedef struct segs { seg *v; size_t n, cap; } segs;

static int seg_push(segs *s, size_t a, size_t b, int m) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return 0;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){a, b, m};
    return 1;
}

/* Turns match spans into a full cover of [0,n) of matches and gaps. */
static int cover_from_spans(segs *out, const size_t *sp, size_t n_sp, size_t n) {
    size_t prev = 0;
    out->n = 0;
    for (size_t k = 0; k < n_sp; k++) {
        if (sp[2 * k] != prev && !seg_push(out, prev, sp[2 * k], 0)) return 0;
        if (!seg_push(out, sp[2 * k], sp[2 * k + 1], 1)) return 0;
        prev = sp[2 * k + 1];
    }
    return prev == n || seg_push(out, prev, n, 0);
}

enum { CHAR_WS, CHAR_PUNCT, CHAR_DIGIT };
static int char_class(int32_t c, int cls) {
    if (cls == CHAR_WS) return tok_is_whitespace(c);
    if (cls == CHAR_PUNCT) return tok_is_punctuation(c);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

/* Each char of the class is one match (HF's char-predicate patterns). */
static int cover_from_chars(segs *out, const char *s, size_t n, int cls) {
    size_t prev = 0;
    out->n = 0;
    for (size_t i = 0; i < n;) {
        int l;
        int32_t c = tok_utf8_decode(s + i, n - i, &l);
        if (char_class(c, cls)) {
            if (i != prev && !seg_push(out, prev, i, 0)) return 0;
            if (!seg_push(out, i, i + (size_t)l, 1)) return 0;
            prev = i + (size_t)l;
        }
        i += (size_t)l;
    }
    return prev == n || seg_push(out, prev, n, 0);
}

static int cover_from_literal(segs *out, const char *s, size_t n, const char *lit, size_t ll) {
    size_t prev = 0;
    out->n = 0;
    if (ll) {
        for (size_t i = 0; i + ll <= n;) {
            if (memcmp(s + i, lit, ll) == 0) {
                if (i != prev && !seg_push(out, prev, i, 0)) return 0;
                if (!seg_push(out, i, i + ll, 1)) return 0;
                i += ll;
                prev = i;
            } else i++;
        }
    }
    return prev == n || seg_push(out, prev, n, 0);
}

/* Applies a delimiter behavior to a cover and pushes the non-empty results. */
static int emit_behavior(segs *c, tok_split_behavior b, int invert, const char *s, int at_start, tok_strlist *out) {
    if (invert)
        for (size_t i = 0; i < c->n; i++) c->v[i].m = !c->v[i].m;
    size_t w = 0;
    if (b == TOK_SPLIT_CONTIGUOUS) {
        for (size_t i = 0; i < c->n; i++) {
            if (w && c->v[i].m && c->v[w - 1].m) c->v[w - 1].b = c->v[i].b;
            else c->v[w++] = c->v[i];
        }
        c->n = w;
    } else if (b == TOK_SPLIT_MERGED_PREV) {
        int prev_match = 0;
        for (size_t i = 0; i < c->n; i++) {
            int m = c->v[i].m;
            if (m && !prev_match && w) c->v[w - 1].b = c->v[i].b;
            else c->v[w++] = c->v[i];
            prev_match = m;
        }
        c->n = w;
    } else if (b == TOK_SPLIT_MERGED_NEXT) {
        int prev_match = 0;
        size_t k = c->n; /* build from the end, in place at the top */
        for (size_t i = c->n; i-- > 0;) {
            int m = c->v[i].m;
            if (m && !prev_match && k < c->n) c->v[k].a = c->v[i].a;
            else c->v[--k] = c->v[i];
            prev_match = m;
        }
        memmove(c->v, c->v + k, (c->n - k) * sizeof *c->v);
        c->n -= k;
    }
    for (size_t i = 0; i < c->n; i++) {
        seg g = c->v[i];
        if (b == TOK_SPLIT_REMOVED && g.m) continue;
        if (g.b > g.a && !tok_sl_push(out, s + g.a, g.b - g.a, at_start && g.a == 0)) return 0;
    }
    return 1;
}

static int bytelevel_map(const char *s, size_t n, int at_start, tok_strlist *out, sbuf *tmp) {
    sbuf_reset(tmp);
    for (size_t i = 0; i < n; i++) {
        char b[4];
        sbuf_append(tmp, b, (size_t)tok_utf8_encode(tok_byte_to_cp[(uint8_t)s[i]], b));
    }
    return !tmp->oom && tok_sl_push(out, tmp->data, tmp->len, at_start);
}

/* Buffers reused across the pieces of one tok_pre_apply call, so cutting a segment
 * allocates per call, not per piece. */
typedef struct pre_scratch {
    segs c;
    sbuf tmp, src;
    size_t *sp, sp_cap;
    tok_strlist mid;
    pcre2_match_data *md;
} pre_scratch;

static int spans(const tok_pre *p, pre_scratch *x, const char *s, size_t n, size_t *n_sp) {
    return tok_regex_spans_md(p->re, x->md, s, n, &x->sp, n_sp, &x->sp_cap);
}

/* Pre-tokenizes one piece into out. */
static int apply_piece(const tok_pre *p, const char *s, size_t n, int at_start, tok_strlist *out, pre_scratch *x) {
    size_t n_sp = 0;
    segs *c = &x->c;
    sbuf *tmp = &x->tmp;
    switch (p->kind) {
    case TOK_PRE_BYTELEVEL: {
        sbuf *src = &x->src;
        sbuf_reset(src);
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) sbuf_putc(src, ' ');
        sbuf_append(src, s, n);
        int ok = !src->oom;
        if (ok && p->use_regex) {
            ok = spans(p, x, src->data, src->len, &n_sp) && cover_from_spans(c, x->sp, n_sp, src->len);
            for (size_t i = 0; ok && i < c->n; i++)
                if (c->v[i].b > c->v[i].a)
                    ok = bytelevel_map(src->data + c->v[i].a, c->v[i].b - c->v[i].a, at_start && c->v[i].a == 0, out, tmp);
        } else if (ok && src->len) {
            ok = bytelevel_map(src->data, src->len, at_start, out, tmp);
        }
        return ok;
    }
    case TOK_PRE_SPLIT:
        if (p->re) {
            if (!spans(p, x, s, n, &n_sp) || !cover_from_spans(c, x->sp, n_sp, n)) return 0;
        } else if (!cover_from_literal(c, s, n, p->literal, p->literal_len)) return 0;
        return emit_behavior(c, p->behavior, p->invert, s, at_start, out);
    case TOK_PRE_WHITESPACE:
        if (!spans(p, x, s, n, &n_sp) || !cover_from_spans(c, x->sp, n_sp, n)) return 0;
        return emit_behavior(c, TOK_SPLIT_REMOVED, 1, s, at_start, out);
    case TOK_PRE_WHITESPACE_SPLIT:
        return cover_from_chars(c, s, n, CHAR_WS) && emit_behavior(c, TOK_SPLIT_REMOVED, 0, s, at_start, out);
    case TOK_PRE_PUNCTUATION:
        return cover_from_chars(c, s, n, CHAR_PUNCT) && emit_behavior(c, p->behavior, 0, s, at_start, out);
    case TOK_PRE_DIGITS:
        return cover_from_chars(c, s, n, CHAR_DIGIT) &&
               emit_behavior(c, p->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0, s, at_start, out);
    case TOK_PRE_BERT: {
        tok_strlist *mid = &x->mid;
        tok_sl_reset(mid);
        int ok = cover_from_chars(c, s, n, CHAR_WS) && emit_behavior(c, TOK_SPLIT_REMOVED, 0, s, at_start, mid);
        for (size_t i = 0; ok && i < mid->n; i++)
            ok = cover_from_chars(c, tok_sl_str(mid, i), mid->len[i], CHAR_PUNCT) &&
                 emit_behavior(c, TOK_SPLIT_ISOLATED, 0, tok_sl_str(mid, i), mid->at_start[i], out);
        return ok;
    }
    case TOK_PRE_METASPACE: {
        size_t rl = strlen(p->replacement);
        sbuf *body = &x->src;
        sbuf_reset(body);
        int starts = n >= rl && memcmp(s, p->replacement, rl) == 0;
        /* Replacing spaces first means a leading space already counts as the prefix. */
        if (n > 0 && s[0] == ' ') starts = 1;
        if (!starts && (p->prepend == 2 || (p->prepend == 1 && at_start))) sbuf_append(body, p->replacement, rl);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') sbuf_append(body, p->replacement, rl);
            else sbuf_putc(body, s[i]);
        }
        if (body->oom) return 0;
        if (body->len == 0) return 1;
        if (!p->split) return tok_sl_push(out, body->data, body->len, at_start);
        return cover_from_literal(c, body->data, body->len, p->replacement, rl) &&
               emit_behavior(c, TOK_SPLIT_MERGED_NEXT, 0, body->data, at_start, out);
    }
    case TOK_PRE_SEQUENCE: break;
    }
    return 0;
}

int tok_pre_apply(const tok_pre *p, tok_strlist *l, tok_strlist *tmp) {
    if (p->kind == TOK_PRE_SEQUENCE) {
        for (size_t i = 0; i < p->n_kids; i++)
            if (!tok_pre_apply(p->kids[i], l, tmp)) return 0;
        return 1;
    }
    pre_scratch x;
    memset(&x, 0, sizeof x);
    sbuf_init(&x.tmp);
    sbuf_init(&x.src);
    tok_sl_init(&x.mid);
    int ok = 1;
    if (p->re && !(x.md = pcre2_match_data_create_from_pattern(p->re, NULL))) ok = 0;
    tok_sl_reset(tmp);
    for (size_t i = 0; ok && i < l->n; i++) ok = apply_piece(p, tok_sl_str(l, i), l->len[i], l->at_start[i], tmp, &x);
    free(x.c.v);
    free(x.sp);
    sbuf_free(&x.tmp);
    sbuf_free(&x.src);
    tok_sl_free(&x.mid);
    if (x.md) pcre2_match_data_free(x.md);
    if (ok) {
        tok_strlist t = *l;
        *l = *tmp;
        *tmp = t;
    }
    return ok;
}
