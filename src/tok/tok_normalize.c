/* tok_normalize.c: HF normalizers (NFC/NFD/NFKC/NFKD via utf8proc, Lowercase, Strip,
 * StripAccents, Replace, Prepend, BertNormalizer, Sequence): parsing from
 * tokenizer.json and applying them to one text segment. Offsets are not tracked:
 * hearth only needs ids. */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

void tok_norm_free(tok_norm *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) tok_norm_free(n->kids[i]);
    free(n->kids);
    free(n->pattern);
    free(n->content);
    if (n->re) pcre2_code_free(n->re);
    free(n);
}

static int jbool(json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* Reads {"String": s} or {"Regex": r} into pattern / re. */
static hearth_status parse_pattern(json_t *p, char **pattern, pcre2_code **re, const char *what, hearth_error *err) {
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        *pattern = strdup(json_string_value(s));
        return *pattern ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    if (json_is_string(r)) {
        *re = tok_regex_compile(json_string_value(r), err);
        if (!*re) { err_prefix(err, "%s", what); return err->status; }
        return HEARTH_OK;
    }
    return err_set(err, HEARTH_ERR_FORMAT, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", what);
}

hearth_status tok_norm_parse(json_t *j, tok_norm **out, hearth_error *err) {
    *out = NULL;
    if (!json_is_object(j)) return err_set(err, HEARTH_ERR_FORMAT, "normalizer is not an object");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return err_set(err, HEARTH_ERR_FORMAT, "normalizer has no type");
    tok_norm *n = calloc(1, sizeof *n);
    if (!n) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = HEARTH_OK;
    if (!strcmp(type, "Sequence")) {
        n->kind = TOK_NORM_SEQUENCE;
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) { st = err_set(err, HEARTH_ERR_FORMAT, "Sequence normalizer without a list"); goto done; }
        n->kids = calloc(json_array_size(arr) + 1, sizeof *n->kids);
        if (!n->kids) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
        for (size_t i = 0; i < json_array_size(arr) && st == HEARTH_OK; i++) {
            st = tok_norm_parse(json_array_get(arr, i), &n->kids[i], err);
            if (st == HEARTH_OK) n->n_kids++;
        }
    } else if (!strcmp(type, "NFC")) n->kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) n->kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n->kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) n->kind = TOK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        n->kind = TOK_NORM_STRIP;
        n->left = jbool(j, "strip_left", 1);
        n->right = jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Replace")) {
        n->kind = TOK_NORM_REPLACE;
        const char *c = json_string_value(json_object_get(j, "content"));
        n->content = strdup(c ? c : "");
        st = parse_pattern(json_object_get(j, "pattern"), &n->pattern, &n->re, "Replace normalizer", err);
    } else if (!strcmp(type, "Prepend")) {
        n->kind = TOK_NORM_PREPEND;
        const char *c = json_string_value(json_object_get(j, "prepend"));
        if (!c) st = err_set(err, HEARTH_ERR_FORMAT, "Prepend normalizer without 'prepend'");
        else n->content = strdup(c);
    } else if (!strcmp(type, "BertNormalizer")) {
        n->kind = TOK_NORM_BERT;
        n->clean_text = jbool(j, "clean_text", 1);
        n->chinese = jbool(j, "handle_chinese_chars", 1);
        n->lowercase = jbool(j, "lowercase", 1);
        n->strip_accents = jbool(j, "strip_accents", n->lowercase); /* null means "same as lowercase" */
    } else {
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "normalizer type '%.100s' is not supported", type);
    }
done:
    if (st != HEARTH_OK) { tok_norm_free(n); return st; }
    *out = n;
    return HEARTH_OK;
}

static int unicode_form(sbuf *s, utf8proc_option_t opt) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s->data, (utf8proc_ssize_t)s->len, &dst,
                                      opt | UTF8PROC_STABLE);
    if (r < 0) { free(dst); return 0; }
    sbuf_reset(s);
    sbuf_append(s, (const char *)dst, (size_t)r);
    free(dst);
    return !s->oom;
}

static void put_cp(sbuf *o, int32_t cp) { char b[4]; sbuf_append(o, b, (size_t)tok_utf8_encode(cp, b)); }

/* Rust's char::to_lowercase; U+0130 is the one char whose full lowercase is two chars. */
static void lower_cp(sbuf *o, int32_t cp) {
    if (cp == 0x130) { sbuf_append(o, "i\xCC\x87", 3); return; }
    put_cp(o, utf8proc_tolower(cp));
}

static int is_chinese(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int is_other(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

/* One pass over the chars of s; mode picks the per-char rule. */
enum { PASS_LOWER, PASS_STRIP_ACCENTS, PASS_STRIP_MN, PASS_BERT_CLEAN, PASS_CHINESE };
static int char_pass(sbuf *s, int mode) {
    sbuf o;
    sbuf_init(&o);
    for (size_t i = 0; i < s->len;) {
        int l;
        int32_t c = tok_utf8_decode(s->data + i, s->len - i, &l);
        i += (size_t)l;
        switch (mode) {
        case PASS_LOWER: lower_cp(&o, c); break;
        case PASS_STRIP_ACCENTS:
            /* HF's is_combining_mark is the whole Mark category (Mn, Mc, Me). */
            if (utf8proc_category(c) < UTF8PROC_CATEGORY_MN || utf8proc_category(c) > UTF8PROC_CATEGORY_ME) put_cp(&o, c);
            break;
        case PASS_STRIP_MN: /* BertNormalizer drops only nonspacing marks */
            if (utf8proc_category(c) != UTF8PROC_CATEGORY_MN) put_cp(&o, c);
            break;
        case PASS_BERT_CLEAN:
            if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_other(c))) break;
            put_cp(&o, tok_is_whitespace(c) ? ' ' : c);
            break;
        case PASS_CHINESE:
            if (is_chinese(c)) { sbuf_putc(&o, ' '); put_cp(&o, c); sbuf_putc(&o, ' '); }
            else put_cp(&o, c);
            break;
        }
    }
    if (o.oom) { sbuf_free(&o); return 0; }
    sbuf_free(s);
    *s = o;
    return 1;
}

static int replace_all(sbuf *s, const char *pat, const pcre2_code *re, const char *content) {
    sbuf o;
    sbuf_init(&o);
    size_t cl = strlen(content);
    if (re) {
        size_t *spans = NULL, n = 0, cap = 0, prev = 0;
        if (!tok_regex_spans(re, s->data, s->len, &spans, &n, &cap)) { free(spans); sbuf_free(&o); return 0; }
        for (size_t k = 0; k < n; k++) {
            sbuf_append(&o, s->data + prev, spans[2 * k] - prev);
            sbuf_append(&o, content, cl);
            prev = spans[2 * k + 1];
        }
        sbuf_append(&o, s->data + prev, s->len - prev);
        free(spans);
    } else {
        size_t pl = strlen(pat), i = 0;
        if (pl == 0) { sbuf_free(&o); return 1; }
        while (i < s->len) {
            if (i + pl <= s->len && memcmp(s->data + i, pat, pl) == 0) { sbuf_append(&o, content, cl); i += pl; }
            else sbuf_putc(&o, s->data[i++]);
        }
    }
    if (o.oom) { sbuf_free(&o); return 0; }
    sbuf_free(s);
    *s = o;
    return 1;
}

static void strip(sbuf *s, int left, int right) {
    if (!s->len) return;
    size_t a = 0, b = s->len;
    while (left && a < b) {
        int l;
        int32_t c = tok_utf8_decode(s->data + a, b - a, &l);
        if (!tok_is_whitespace(c)) break;
        a += (size_t)l;
    }
    while (right && b > a) {
        size_t k = b - 1;
        while (k > a && ((uint8_t)s->data[k] & 0xC0) == 0x80) k--;
        int l;
        int32_t c = tok_utf8_decode(s->data + k, b - k, &l);
        if (!tok_is_whitespace(c)) break;
        b = k;
    }
    memmove(s->data, s->data + a, b - a);
    s->len = b - a;
    s->data[s->len] = 0;
}

int tok_norm_apply(const tok_norm *n, sbuf *s) {
    if (s->oom) return 0;
    switch (n->kind) {
    case TOK_NORM_SEQUENCE:
        for (size_t i = 0; i < n->n_kids; i++)
            if (!tok_norm_apply(n->kids[i], s)) return 0;
        return 1;
    case TOK_NORM_NFC: return unicode_form(s, UTF8PROC_COMPOSE);
    case TOK_NORM_NFD: return unicode_form(s, UTF8PROC_DECOMPOSE);
    case TOK_NORM_NFKC: return unicode_form(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case TOK_NORM_NFKD: return unicode_form(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    case TOK_NORM_LOWERCASE: return char_pass(s, PASS_LOWER);
    case TOK_NORM_STRIP_ACCENTS: return char_pass(s, PASS_STRIP_ACCENTS);
    case TOK_NORM_STRIP: strip(s, n->left, n->right); return 1;
    case TOK_NORM_REPLACE: return replace_all(s, n->pattern, n->re, n->content);
    case TOK_NORM_PREPEND:
        if (s->len) {
            sbuf o;
            sbuf_init(&o);
            sbuf_puts(&o, n->content);
            sbuf_append(&o, s->data, s->len);
            if (o.oom) { sbuf_free(&o); return 0; }
            sbuf_free(s);
            *s = o;
        }
        return 1;
    case TOK_NORM_BERT:
        if (n->clean_text && !char_pass(s, PASS_BERT_CLEAN)) return 0;
        if (n->chinese && !char_pass(s, PASS_CHINESE)) return 0;
        if (n->strip_accents && (!unicode_form(s, UTF8PROC_DECOMPOSE) || !char_pass(s, PASS_STRIP_MN))) return 0;
        if (n->lowercase && !char_pass(s, PASS_LOWER)) return 0;
        return 1;
    }
    return 0;
}
