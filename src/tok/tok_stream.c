/* tok_stream.c: incremental detokenization. Each push re-decodes a short window of
 * recent ids and emits only text that is final: nothing while the window's text ends
 * in U+FFFD (an incomplete UTF-8 sequence may still be completed by the next id).
 * With a ByteLevel decoder a lone-space token is held back until the next id, as
 * mlx-lm's BPEStreamingDetokenizer does, and the SentencePiece decoder chain streams
 * as its SPMStreamingDetokenizer (spm_push), so streamed chunks split where upstream's do.
 * The window restarts at the last id after each clean emit, so the work per id stays
 * small and the concatenated output equals tok_decode of the whole sequence (SPM: where
 * that is valid UTF-8). */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>

struct tok_stream {
    const tok_tokenizer *t;
    int skip_special;
    tok_ids win;       /* ids since the window start */
    size_t prefix_len; /* bytes of decode(win) already emitted (or owned by the prefix) */
    int byte_runs;     /* the decoder chain has ByteFallback */
    int byte_level;    /* the decoder is ByteLevel (GPT-2 style: a space is the piece "\u0120") */
    int spm, spm_strip; /* the SentencePiece chain (spm_chain); it strips the first space */
    sbuf spm_bytes;     /* spm: bytes not emitted yet */
    int spm_started;    /* spm: some text was emitted (or stripped) */
    char *out;          /* last returned chunk */
};

static int has_byte_fallback(const tok_dec *d) {
    if (!d) return 0;
    if (d->kind == TOK_DEC_BYTEFALLBACK) return 1;
    for (size_t i = 0; i < d->n_kids; i++)
        if (has_byte_fallback(d->kids[i])) return 1;
    return 0;
}

/* mlx-lm's test for its SPM detokenizer: the chain is exactly Replace("\u2581" -> " "),
 * ByteFallback, Fuse, and optionally Strip(" ", 1, 0) (*strip). */
static int spm_chain(const tok_dec *d, int *strip) {
    if (!d || d->kind != TOK_DEC_SEQUENCE || (d->n_kids != 3 && d->n_kids != 4)) return 0;
    tok_dec *const *k = d->kids;
    if (k[0]->kind != TOK_DEC_REPLACE || !k[0]->pattern || strcmp(k[0]->pattern, "\xE2\x96\x81") ||
        strcmp(k[0]->content, " ") || k[1]->kind != TOK_DEC_BYTEFALLBACK || k[2]->kind != TOK_DEC_FUSE)
        return 0;
    *strip = d->n_kids == 4;
    return !*strip ||
           (k[3]->kind == TOK_DEC_STRIP && !strcmp(k[3]->replacement, " ") && k[3]->start == 1 && k[3]->stop == 0);
}

tok_stream *tok_stream_new(const tok_tokenizer *t, int skip_special) {
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    s->byte_runs = has_byte_fallback(t->dec);
    s->byte_level = t->dec && t->dec->kind == TOK_DEC_BYTELEVEL; /* mlx-lm's test: the top decoder's type */
    s->spm = spm_chain(t->dec, &s->spm_strip);
    sbuf_init(&s->spm_bytes);
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->win.v);
    sbuf_free(&s->spm_bytes);
    free(s->out);
    free(s);
}

static const char *emit(tok_stream *s, const char *text, size_t n) {
    free(s->out);
    s->out = malloc(n + 1);
    if (!s->out) return "";
    memcpy(s->out, text, n);
    s->out[n] = 0;
    return s->out;
}

static int is_byte_token(const tok_tokenizer *t, int32_t id) {
    const char *s = t->strs[id];
    return t->str_lens[id] == 6 && !memcmp(s, "<0x", 3) && s[5] == '>';
}

static int ends_incomplete(const char *s, size_t n) {
    return n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3);
}

/* Decodes the window; when final, emits the new part and restarts the window. */
static const char *step(tok_stream *s, int final) {
    char *text = NULL;
    if (tok_decode(s->t, s->win.v, s->win.n, s->skip_special, &text, NULL) != HEARTH_OK) return "";
    size_t n = strlen(text);
    const char *r = "";
    /* ByteFallback judges a whole run of byte tokens at once (one invalid byte turns
     * the run into U+FFFDs), so nothing of a run is final until a non-byte token. */
    int in_run = s->byte_runs && is_byte_token(s->t, s->win.v[s->win.n - 1]);
    if (final || (!in_run && !ends_incomplete(text, n))) {
        size_t from = s->prefix_len <= n ? s->prefix_len : n;
        r = emit(s, text + from, n - from);
        /* Keep the last id as context: decoders treat the first token specially
         * (Metaspace, Strip), and the next id must not be the window's first. */
        if (s->win.n > 1) {
            s->win.v[0] = s->win.v[s->win.n - 1];
            s->win.n = 1;
        }
        free(text);
        text = NULL;
        if (tok_decode(s->t, s->win.v, s->win.n, s->skip_special, &text, NULL) != HEARTH_OK) { s->prefix_len = 0; return r; }
        s->prefix_len = strlen(text);
    }
    free(text);
    return r;
}

/* SPMStreamingDetokenizer: the pending bytes grow by the id's bytes (a byte token's
 * own byte, other pieces with "\u2581" as a space; id < 0: none) and are emitted, decoded
 * lossily as Python's "replace", unless they end in an incomplete character (final:
 * always). The joined text differs from tok_decode only where bytes are invalid UTF-8:
 * ByteFallback turns a whole invalid run into U+FFFDs, upstream each bad subsequence. */
static const char *spm_push(tok_stream *s, int32_t id, int final) {
    sbuf *b = &s->spm_bytes;
    if (id >= 0 && is_byte_token(s->t, id)) {
        sbuf_putc(b, (char)strtol(s->t->strs[id] + 3, NULL, 16));
    } else if (id >= 0) {
        const char *p = s->t->strs[id];
        for (size_t i = 0, n = s->t->str_lens[id]; i < n; i++) {
            int space = n - i >= 3 && !memcmp(p + i, "\xE2\x96\x81", 3);
            sbuf_putc(b, space ? ' ' : p[i]);
            i += space ? 2 : 0;
        }
    }
    sbuf text;
    sbuf_init(&text);
    tok_utf8_lossy(&text, b->data ? b->data : "", b->len);
    const char *r = "";
    if (!text.oom && (final || !ends_incomplete(text.data ? text.data : "", text.len))) {
        /* Strip drops the text's first space; upstream drops a leading space for as long
         * as it has emitted nothing, which hearth_generate's trim_leading_space does */
        size_t from = s->spm_strip && !s->spm_started && text.len && text.data[0] == ' ';
        r = emit(s, text.data ? text.data + from : "", text.len - from);
        s->spm_started |= text.len > 0;
        sbuf_reset(b);
    }
    sbuf_free(&text);
    return r;
}

/* The piece "\u0120" alone: one space, which upstream holds back in case the next
 * token's decoding cleans it up. */
static int is_lone_space(const tok_tokenizer *t, int32_t id) {
    return t->str_lens[id] == 2 && !memcmp(t->strs[id], "\xC4\xA0", 2);
}

const char *tok_stream_push(tok_stream *s, int32_t id) {
    if (s->skip_special && tok_is_special(s->t, id)) return "";
    if (id < 0 || id >= s->t->n_strs || !s->t->strs[id]) return ""; /* tok_decode skips these too */
    if (s->spm) return spm_push(s, id, 0);
    if (!tok_ids_push(&s->win, id)) return "";
    if (s->byte_level && is_lone_space(s->t, id)) return "";
    return step(s, 0);
}

const char *tok_stream_finish(tok_stream *s) {
    if (s->spm) return spm_push(s, -1, 1);
    if (s->win.n == 0) return "";
    return step(s, 1);
}
