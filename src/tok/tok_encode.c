/* tok_encode.c: the encode pipeline: added tokens matched longest-first (raw ones on
 * the input, normalized ones on normalized text), then normalizer -> pre-tokenizer ->
 * model per piece, then the post-processor template. Scratch buffers live for one
 * call; nothing is allocated per token. */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>

typedef struct enc_ctx {
    const tok_tokenizer *t;
    tok_ids ids;
    tok_strlist pieces, tmp;
    tok_bpe_scratch bpe;
    sbuf norm;
} enc_ctx;

static int32_t char_before(const char *s, size_t i) {
    size_t k = i;
    while (k > 0 && ((uint8_t)s[k - 1] & 0xC0) == 0x80) k--;
    if (k == 0 && i == 0) return -1;
    if (k > 0) k--;
    while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
    int l;
    return tok_utf8_decode(s + k, i - k, &l);
}

static int is_word_char(int32_t c) { return c >= 0 && (tok_is_alnum(c) || c == '_'); }

/* Finds the leftmost-longest added token (of the wanted normalized flag) at or after
 * `from`. Returns the added index or -1; [*ms, *me) is the span it claims, widened by
 * lstrip/rstrip. */
static long find_added(const tok_tokenizer *t, const char *s, size_t n, size_t from, int want_norm, size_t *ms, size_t *me) {
    for (size_t i = from; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        if (((b & 0xC0) == 0x80) || !t->n_added_lens[b]) continue;
        for (uint32_t k = 0; k < t->n_added_lens[b]; k++) {
            size_t L = t->added_lens[b][k];
            if (L > n - i) continue;
            int32_t a = tok_strmap_get(&t->added_map, s + i, L);
            if (a < 0 || t->added[a].normalized != want_norm) continue;
            const tok_added *ad = &t->added[a];
            if (ad->single_word) {
                int l;
                int32_t after = i + L < n ? tok_utf8_decode(s + i + L, n - i - L, &l) : -1;
                if (is_word_char(char_before(s, i)) || is_word_char(after)) continue;
            }
            size_t a0 = i, a1 = i + L;
            if (ad->lstrip)
                while (a0 > from) {
                    size_t k2 = a0 - 1;
                    while (k2 > from && ((uint8_t)s[k2] & 0xC0) == 0x80) k2--;
                    int l;
                    if (!tok_is_whitespace(tok_utf8_decode(s + k2, a0 - k2, &l))) break;
                    a0 = k2;
                }
            if (ad->rstrip)
                while (a1 < n) {
                    int l;
                    if (!tok_is_whitespace(tok_utf8_decode(s + a1, n - a1, &l))) break;
                    a1 += (size_t)l;
                }
            *ms = a0;
            *me = a1;
            return a;
        }
    }
    return -1;
}

static int run_model(enc_ctx *c, const char *s, size_t n, int at_start) {
    const tok_tokenizer *t = c->t;
    tok_sl_reset(&c->pieces);
    if (n == 0) return 1;
    if (!tok_sl_push(&c->pieces, s, n, at_start)) return 0;
    if (t->pre && !tok_pre_apply(t->pre, &c->pieces, &c->tmp)) return 0;
    for (size_t i = 0; i < c->pieces.n; i++) {
        const char *p = tok_sl_str(&c->pieces, i);
        int ok = t->model.kind == TOK_MODEL_BPE ? tok_bpe_encode_word(t, p, c->pieces.len[i], &c->bpe, &c->ids)
                                                 : tok_wordpiece_encode_word(t, p, c->pieces.len[i], &c->bpe.tmp, &c->ids);
        if (!ok) return 0;
    }
    return 1;
}

/* A stretch of input between raw added tokens: normalize, then split on normalized
 * added tokens. */
static int encode_text(enc_ctx *c, const char *s, size_t n, int at_start) {
    const tok_tokenizer *t = c->t;
    if (n == 0) return 1;
    sbuf_reset(&c->norm);
    sbuf_append(&c->norm, s, n);
    if (c->norm.oom || (t->norm && !tok_norm_apply(t->norm, &c->norm))) return 0;
    if (c->norm.len == 0) return 1;
    /* run_model reuses pieces, so the normalized text is copied out of c->norm once. */
    char *ns = malloc(c->norm.len + 1);
    if (!ns) return 0;
    size_t nn = c->norm.len;
    memcpy(ns, c->norm.data, nn);
    int ok = 1;
    size_t pos = 0;
    while (ok && t->has_normalized_added) {
        size_t ms, me;
        long a = find_added(t, ns, nn, pos, 1, &ms, &me);
        if (a < 0) break;
        ok = run_model(c, ns + pos, ms - pos, at_start && pos == 0) && tok_ids_push(&c->ids, t->added[a].id);
        pos = me;
    }
    if (ok) ok = run_model(c, ns + pos, nn - pos, at_start && pos == 0);
    free(ns);
    return ok;
}

hearth_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                         size_t *n_ids, hearth_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return err_set(err, HEARTH_ERR_INVALID, "tok_encode: NULL text");
    if (len && !tok_utf8_valid(text, len)) return err_set(err, HEARTH_ERR_INVALID, "tok_encode: text is not valid UTF-8");
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    tok_sl_init(&c.pieces);
    tok_sl_init(&c.tmp);
    sbuf_init(&c.norm);
    sbuf_init(&c.bpe.tmp);
    int ok = 1;
    size_t pos = 0;
    while (ok && t->has_raw_added) {
        size_t ms, me;
        long a = find_added(t, text, len, pos, 0, &ms, &me);
        if (a < 0) break;
        ok = encode_text(&c, text + pos, ms - pos, pos == 0) && tok_ids_push(&c.ids, t->added[a].id);
        pos = me;
    }
    if (ok) ok = encode_text(&c, text + pos, len - pos, pos == 0);
    tok_ids res = {0};
    if (ok && add_special && t->post.present) {
        for (size_t i = 0; ok && i < t->post.n_single; i++) {
            const tok_tmpl_piece *p = &t->post.single[i];
            const int32_t *v = p->is_seq ? c.ids.v : p->ids;
            size_t n = p->is_seq ? c.ids.n : p->n;
            for (size_t k = 0; ok && k < n; k++) ok = tok_ids_push(&res, v[k]);
        }
        free(c.ids.v);
    } else {
        res = c.ids;
    }
    tok_sl_free(&c.pieces);
    tok_sl_free(&c.tmp);
    sbuf_free(&c.norm);
    tok_bpe_scratch_free(&c.bpe);
    if (!ok) {
        free(res.v);
        return err_set(err, HEARTH_ERR_NOMEM, "encoding %zu bytes failed: out of memory or a pre-tokenizer regex hit its match limit", len);
    }
    if (!res.v) res.v = malloc(sizeof(int32_t)); /* callers may free a non-NULL empty array */
    *ids = res.v;
    *n_ids = res.n;
    return HEARTH_OK;
}
