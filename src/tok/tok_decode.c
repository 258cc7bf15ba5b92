/* tok_decode.c: HF decoders (ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
 * Replace, WordPiece, BPEDecoder, Sequence) and tok_decode: ids -> token strings ->
 * decoder chain -> one UTF-8 string. Output is always valid UTF-8 (lossy, as HF). */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>

void tok_dec_free(tok_dec *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) tok_dec_free(d->kids[i]);
    free(d->kids);
    free(d->pattern);
    free(d->content);
    if (d->re) pcre2_code_free(d->re);
    free(d);
}

static int one_char(const char *s, char out[5]) {
    size_t l = s ? strlen(s) : 0;
    if (l == 0 || l > 4 || tok_utf8_len((const uint8_t *)s, l) != (int)l) return 0;
    memcpy(out, s, l + 1);
    return 1;
}

hearth_status tok_dec_parse(json_t *j, tok_dec **out, hearth_error *err) {
    *out = NULL;
    if (!json_is_object(j)) return err_set(err, HEARTH_ERR_FORMAT, "decoder is not an object");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return err_set(err, HEARTH_ERR_FORMAT, "decoder has no type");
    tok_dec *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = HEARTH_OK;
    if (!strcmp(type, "Sequence")) {
        d->kind = TOK_DEC_SEQUENCE;
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) { st = err_set(err, HEARTH_ERR_FORMAT, "Sequence decoder without a list"); goto done; }
        d->kids = calloc(json_array_size(arr) + 1, sizeof *d->kids);
        if (!d->kids) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
        for (size_t i = 0; i < json_array_size(arr) && st == HEARTH_OK; i++) {
            st = tok_dec_parse(json_array_get(arr, i), &d->kids[i], err);
            if (st == HEARTH_OK) d->n_kids++;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        d->kind = TOK_DEC_BYTELEVEL;
        tok_bytelevel_init();
    } else if (!strcmp(type, "ByteFallback")) d->kind = TOK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = TOK_DEC_METASPACE;
        const char *r = json_string_value(json_object_get(j, "replacement"));
        if (!one_char(r ? r : "\xE2\x96\x81", d->replacement)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "Metaspace decoder replacement must be one character");
            goto done;
        }
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        json_t *aps = json_object_get(j, "add_prefix_space");
        d->prepend = ps ? strcmp(ps, "never") != 0 : (json_is_boolean(aps) ? json_is_true(aps) : 1);
    } else if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        if (!one_char(json_string_value(json_object_get(j, "content")), d->replacement)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "Strip decoder content must be one character");
            goto done;
        }
        json_int_t a = json_integer_value(json_object_get(j, "start")), b = json_integer_value(json_object_get(j, "stop"));
        d->start = a < 0 ? 0 : a > 1000000 ? 1000000 : (int)a;
        d->stop = b < 0 ? 0 : b > 1000000 ? 1000000 : (int)b;
    } else if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        const char *c = json_string_value(json_object_get(j, "content"));
        d->content = strdup(c ? c : "");
        json_t *p = json_object_get(j, "pattern");
        json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
        if (json_is_string(s)) d->pattern = strdup(json_string_value(s));
        else if (json_is_string(r)) { if (!(d->re = tok_regex_compile(json_string_value(r), err))) st = err->status; }
        else st = err_set(err, HEARTH_ERR_FORMAT, "Replace decoder: pattern must be String or Regex");
    } else if (!strcmp(type, "WordPiece")) {
        d->kind = TOK_DEC_WORDPIECE;
        const char *p = json_string_value(json_object_get(j, "prefix"));
        d->pattern = strdup(p ? p : "##");
        json_t *c = json_object_get(j, "cleanup");
        d->cleanup = json_is_boolean(c) ? json_is_true(c) : 1;
    } else if (!strcmp(type, "BPEDecoder")) {
        d->kind = TOK_DEC_BPE;
        const char *p = json_string_value(json_object_get(j, "suffix"));
        d->pattern = strdup(p ? p : "</w>");
    } else {
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "decoder type '%.100s' is not supported", type);
    }
done:
    if (st != HEARTH_OK) { tok_dec_free(d); return st; }
    *out = d;
    return HEARTH_OK;
}

/* Appends s with every occurrence of pat replaced by rep (pat non-empty). */
static void replace_into(sbuf *o, const char *s, size_t n, const char *pat, const char *rep) {
    size_t pl = strlen(pat), rl = strlen(rep);
    for (size_t i = 0; i < n;) {
        if (pl && i + pl <= n && !memcmp(s + i, pat, pl)) { sbuf_append(o, rep, rl); i += pl; }
        else sbuf_putc(o, s[i++]);
    }
}

static const char *CLEANUP[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
                                   {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int dec_one(const tok_dec *d, tok_strlist *l, tok_strlist *o) {
    sbuf t;
    sbuf_init(&t);
    int ok = 1;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: {
        sbuf bytes;
        sbuf_init(&bytes);
        for (size_t i = 0; i < l->n; i++) {
            const char *s = tok_sl_str(l, i);
            size_t mark = bytes.len, k = 0;
            int all = 1;
            while (k < l->len[i]) {
                int cl;
                int b = tok_cp_to_byte(tok_utf8_decode(s + k, l->len[i] - k, &cl));
                if (b < 0) { all = 0; break; }
                sbuf_putc(&bytes, (char)b);
                k += (size_t)cl;
            }
            if (!all) { bytes.len = mark; sbuf_append(&bytes, s, l->len[i]); } /* token kept as written */
        }
        tok_utf8_lossy(&t, bytes.data ? bytes.data : "", bytes.len);
        ok = !bytes.oom && !t.oom && tok_sl_push(o, t.data ? t.data : "", t.len, 0);
        sbuf_free(&bytes);
        break;
    }
    case TOK_DEC_BYTEFALLBACK: {
        sbuf bytes;
        sbuf_init(&bytes);
        for (size_t i = 0; ok && i <= l->n; i++) {
            int b = i < l->n ? byte_token(tok_sl_str(l, i), l->len[i]) : -1;
            if (b >= 0) { sbuf_putc(&bytes, (char)b); continue; }
            if (bytes.len) {
                sbuf_reset(&t);
                if (tok_utf8_valid(bytes.data, bytes.len)) sbuf_append(&t, bytes.data, bytes.len);
                else for (size_t k = 0; k < bytes.len; k++) sbuf_append(&t, "\xEF\xBF\xBD", 3);
                ok = !t.oom && tok_sl_push(o, t.data, t.len, 0);
                sbuf_reset(&bytes);
            }
            if (ok && i < l->n) ok = tok_sl_push(o, tok_sl_str(l, i), l->len[i], l->at_start[i]);
        }
        ok = ok && !bytes.oom;
        sbuf_free(&bytes);
        break;
    }
    case TOK_DEC_FUSE:
        for (size_t i = 0; i < l->n; i++) sbuf_append(&t, tok_sl_str(l, i), l->len[i]);
        ok = !t.oom && tok_sl_push(o, t.data ? t.data : "", t.len, 0);
        break;
    default:
        for (size_t i = 0; ok && i < l->n; i++) {
            const char *s = tok_sl_str(l, i);
            size_t n = l->len[i];
            sbuf_reset(&t);
            if (d->kind == TOK_DEC_METASPACE) {
                size_t rl = strlen(d->replacement);
                int drop = i == 0 && d->prepend; /* HF drops every replacement char of the first token */
                for (size_t k = 0; k < n;) {
                    if (k + rl <= n && !memcmp(s + k, d->replacement, rl)) {
                        if (!drop) sbuf_putc(&t, ' ');
                        k += rl;
                    } else sbuf_putc(&t, s[k++]);
                }
            } else if (d->kind == TOK_DEC_STRIP) {
                size_t rl = strlen(d->replacement), a = 0, b = n;
                for (int k = 0; k < d->start && a + rl <= b && !memcmp(s + a, d->replacement, rl); k++) a += rl;
                for (int k = 0; k < d->stop && b >= a + rl && !memcmp(s + b - rl, d->replacement, rl); k++) b -= rl;
                sbuf_append(&t, s + a, b - a);
            } else if (d->kind == TOK_DEC_REPLACE) {
                if (d->re) {
                    size_t *sp = NULL, nsp = 0, cap = 0, prev = 0;
                    ok = tok_regex_spans(d->re, s, n, &sp, &nsp, &cap);
                    for (size_t k = 0; ok && k < nsp; k++) {
                        sbuf_append(&t, s + prev, sp[2 * k] - prev);
                        sbuf_puts(&t, d->content);
                        prev = sp[2 * k + 1];
                    }
                    sbuf_append(&t, s + prev, n - prev);
                    free(sp);
                } else replace_into(&t, s, n, d->pattern, d->content);
            } else if (d->kind == TOK_DEC_WORDPIECE) {
                size_t pl = strlen(d->pattern);
                if (i != 0 && pl <= n && !memcmp(s, d->pattern, pl)) { s += pl; n -= pl; }
                else if (i != 0) sbuf_putc(&t, ' ');
                sbuf_append(&t, s, n);
                for (size_t c = 0; d->cleanup && c < sizeof CLEANUP / sizeof *CLEANUP && !t.oom; c++) {
                    sbuf u;
                    sbuf_init(&u);
                    replace_into(&u, t.data ? t.data : "", t.len, CLEANUP[c][0], CLEANUP[c][1]);
                    sbuf_free(&t);
                    t = u;
                }
            } else if (d->kind == TOK_DEC_BPE) {
                replace_into(&t, s, n, d->pattern, i + 1 == l->n ? "" : " ");
            }
            ok = ok && !t.oom && tok_sl_push(o, t.data ? t.data : "", t.len, l->at_start[i]);
        }
        break;
    }
    sbuf_free(&t);
    return ok;
}

int tok_dec_apply(const tok_dec *d, tok_strlist *l, tok_strlist *tmp) {
    if (d->kind == TOK_DEC_SEQUENCE) {
        for (size_t i = 0; i < d->n_kids; i++)
            if (!tok_dec_apply(d->kids[i], l, tmp)) return 0;
        return 1;
    }
    tok_sl_reset(tmp);
    if (!dec_one(d, l, tmp)) return 0;
    tok_strlist t = *l;
    *l = *tmp;
    *tmp = t;
    return 1;
}

hearth_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                         hearth_error *err) {
    *out = NULL;
    tok_strlist l, tmp;
    tok_sl_init(&l);
    tok_sl_init(&tmp);
    int ok = 1;
    for (size_t i = 0; ok && i < n; i++) {
        int32_t id = ids[i];
        /* Unknown ids are skipped, as HF does. */
        if (id < 0 || id >= t->n_strs || !t->strs[id]) continue;
        if (skip_special && t->special[id]) continue;
        ok = tok_sl_push(&l, t->strs[id], t->str_lens[id], i == 0);
    }
    sbuf res;
    sbuf_init(&res);
    if (ok && t->dec) ok = tok_dec_apply(t->dec, &l, &tmp);
    for (size_t i = 0; ok && i < l.n; i++) {
        if (!t->dec && i) sbuf_putc(&res, ' '); /* no decoder: HF joins tokens with spaces */
        sbuf_append(&res, tok_sl_str(&l, i), l.len[i]);
    }
    tok_sl_free(&l);
    tok_sl_free(&tmp);
    if (!ok || res.oom) {
        sbuf_free(&res);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory while decoding %zu ids", n);
    }
    if (!res.data) sbuf_putc(&res, 0), res.len = 0;
    /* GGUF tokens are validated and JSON strings are UTF-8, so this is a no-op guard. */
    if (!tok_utf8_valid(res.data, res.len)) {
        sbuf fixed;
        sbuf_init(&fixed);
        tok_utf8_lossy(&fixed, res.data, res.len);
        sbuf_free(&res);
        res = fixed;
        if (!res.data) sbuf_putc(&res, 0), res.len = 0;
    }
    *out = sbuf_steal(&res);
    return *out ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
}

int tok_token_bytes(const tok_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_strs || !t->strs[id]) return -1;
    const char *s = t->strs[id];
    size_t n = t->str_lens[id], o = 0;
    /* Added tokens are stored as the text they stand for, in every vocabulary kind. */
    int raw = tok_strmap_get(&t->added_map, s, n) >= 0;
    int byte_level = !strcmp(t->kind_name, "bpe-byte-level");
    int b = raw || byte_level ? -1 : byte_token(s, n);
    if (b >= 0) {
        if (cap) buf[0] = (char)b;
        return 1;
    }
    for (size_t k = 0; k < n;) {
        int cl = 1, c = s[k];
        if (!raw && byte_level) {
            int v = tok_cp_to_byte(tok_utf8_decode(s + k, n - k, &cl));
            if (v >= 0) c = v;
            else cl = 1; /* not in the byte alphabet: the byte as written */
        } else if (!raw && k + 3 <= n && !memcmp(s + k, "\xE2\x96\x81", 3)) {
            c = ' ', cl = 3; /* SentencePiece's word-boundary mark */
        }
        if (o < cap) buf[o] = (char)c;
        o++;
        k += (size_t)(cl > 0 ? cl : 1);
    }
    return (int)o;
}
