/* tok_wordpiece.c: the WordPiece model (BERT): vocabulary from tokenizer.json and
 * greedy longest-match-first over each pre-token with the "##" continuation prefix;
 * a word with any unmatched part, or longer than max_input_chars_per_word, is [UNK]. */
#include "tok/tok_internal.h"
#include <stdlib.h>
#include <string.h>

hearth_status tok_wordpiece_load_json(tok_tokenizer *t, json_t *model, hearth_error *err) {
    tok_model *m = &t->model;
    m->kind = TOK_MODEL_WORDPIECE;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return err_set(err, HEARTH_ERR_FORMAT, "model.vocab is not an object");
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v)) return err_set(err, HEARTH_ERR_FORMAT, "vocab entry '%.60s' has no integer id", k);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= (1 << 24)) /* same bound as BPE: keeps the id table small */
            return err_set(err, HEARTH_ERR_FORMAT, "vocab entry '%.60s' has id %lld out of range", k, (long long)id);
        if (!tok_set_str(t, (int32_t)id, k, strlen(k))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    if (!tok_strmap_init(&m->vocab, json_object_size(vocab), t->strs, t->str_lens))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    json_object_foreach(vocab, k, v) tok_strmap_put(&m->vocab, (int32_t)json_integer_value(v));
    const char *pre = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    m->prefix = strdup(pre ? pre : "##");
    m->suffix = strdup("");
    if (!m->prefix || !m->suffix) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    json_t *mx = json_object_get(model, "max_input_chars_per_word");
    m->max_chars = json_is_integer(mx) ? (int)json_integer_value(mx) : 100;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (!unk) unk = "[UNK]";
    m->unk_id = tok_strmap_get(&m->vocab, unk, strlen(unk));
    if (m->unk_id < 0) return err_set(err, HEARTH_ERR_FORMAT, "WordPiece unk_token '%.60s' is not in the vocabulary", unk);
    return HEARTH_OK;
}

int tok_wordpiece_encode_word(const tok_tokenizer *t, const char *w, size_t n, sbuf *tmp, tok_ids *out) {
    const tok_model *m = &t->model;
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((uint8_t)w[i] & 0xC0) != 0x80;
    if (chars > (size_t)(m->max_chars < 0 ? 0 : m->max_chars)) return tok_ids_push(out, m->unk_id);
    size_t first = out->n, start = 0, pl = strlen(m->prefix);
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (end > start) {
            sbuf_reset(tmp);
            if (start > 0) sbuf_append(tmp, m->prefix, pl);
            sbuf_append(tmp, w + start, end - start);
            if (tmp->oom) return 0;
            found = tok_strmap_get(&m->vocab, tmp->data, tmp->len);
            if (found >= 0) break;
            do end--; while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80); /* back one char */
        }
        if (found < 0) {
            out->n = first;
            return tok_ids_push(out, m->unk_id);
        }
        if (!tok_ids_push(out, found)) return 0;
        start = end;
    }
    return 1;
}
