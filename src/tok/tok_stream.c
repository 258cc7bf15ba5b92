/* tok_stream.c: incremental detokenization. Each push re-decodes a short window of
 * recent ids and emits only text that is final: nothing while the window's text ends
 * in U+FFFD (an incomplete UTF-8 sequence may still be completed by the next id).
 * With a ByteLevel decoder a lone-space token is held back until the next id, as
 * mlx-lm's BPEStreamingDetokenizer does, so streamed chunks split where upstream's do.
 * The window restarts at the last id after each clean emit, so the work per id stays
 * small and the concatenated output equals tok_decode of the whole sequence. */
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
    char *out;         /* last returned chunk */
};

static int has_byte_fallback(const tok_dec *d) {
    if (!d) return 0;
    if (d->kind == TOK_DEC_BYTEFALLBACK) return 1;
    for (size_t i = 0; i < d->n_kids; i++)
        if (has_byte_fallback(d->kids[i])) return 1;
    return 0;
}

tok_stream *tok_stream_new(const tok_tokenizer *t, int skip_special) {
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    s->byte_runs = has_byte_fallback(t->dec);
    s->byte_level = t->dec && t->dec->kind == TOK_DEC_BYTELEVEL; /* mlx-lm's test: the top decoder's type */
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->win.v);
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

/* The piece "\u0120" alone: one space, which upstream holds back in case the next
 * token's decoding cleans it up. */
static int is_lone_space(const tok_tokenizer *t, int32_t id) {
    return t->str_lens[id] == 2 && !memcmp(t->strs[id], "\xC4\xA0", 2);
}

const char *tok_stream_push(tok_stream *s, int32_t id) {
    if (s->skip_special && tok_is_special(s->t, id)) return "";
    if (id < 0 || id >= s->t->n_strs || !s->t->strs[id]) return ""; /* tok_decode skips these too */
    if (!tok_ids_push(&s->win, id)) return "";
    if (s->byte_level && is_lone_space(s->t, id)) return "";
    return step(s, 0);
}

const char *tok_stream_finish(tok_stream *s) {
    if (s->win.n == 0) return "";
    return step(s, 1);
}
