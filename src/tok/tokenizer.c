/* tokenizer.c: loading tokenizer.json (+ tokenizer_config.json), the added-token
 * table and its longest-first matcher, the encode pipeline (added tokens ->
 * normalizer -> pre-tokenizer -> model -> post-processor) and the accessors.
 * Model, normalizer, pre-tokenizer and decoder details live in tok_*.c. */
#include "base/file.h"
#include "tok/tok_internal.h"
#include "io/json_text.h"
#include <stdlib.h>
#include <string.h>

tok_tokenizer *tok_alloc(void) {
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bos_id = t->eos_id = -1;
    t->model.unk_id = -1;
    for (int b = 0; b < 256; b++) t->model.byte_ids[b] = -1;
    return t;
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_strs; i++) free(t->strs[i]);
    free(t->strs);
    free(t->str_lens);
    free(t->special);
    tok_strmap_free(&t->model.vocab);
    free(t->model.merges);
    free(t->model.prefix);
    free(t->model.suffix);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->added_keys);
    free(t->added_key_lens);
    tok_strmap_free(&t->added_map);
    for (int b = 0; b < 256; b++) free(t->added_lens[b]);
    tok_norm_free(t->norm);
    tok_pre_free(t->pre);
    tok_dec_free(t->dec);
    for (size_t i = 0; i < t->post.n_single; i++) free(t->post.single[i].ids);
    free(t->post.single);
    free(t);
}

int tok_set_str(tok_tokenizer *t, int32_t id, const char *s, size_t n) {
    if (id < 0) return 0;
    if (id >= t->n_strs) {
        int32_t cap = t->n_strs ? t->n_strs : 256;
        while (cap <= id) cap *= 2;
        char **strs = realloc(t->strs, (size_t)cap * sizeof *strs);
        if (!strs) return 0;
        t->strs = strs;
        uint32_t *lens = realloc(t->str_lens, (size_t)cap * sizeof *lens);
        if (!lens) return 0;
        t->str_lens = lens;
        for (int32_t i = t->n_strs; i < cap; i++) { strs[i] = NULL; lens[i] = 0; }
        t->n_strs = cap; /* trimmed to max id + 1 in tok_finish_load */
    }
    char *c = malloc(n + 1);
    if (!c) return 0;
    memcpy(c, s, n);
    c[n] = 0;
    free(t->strs[id]);
    t->strs[id] = c;
    t->str_lens[id] = (uint32_t)n;
    return 1;
}

int tok_add_added(tok_tokenizer *t, int32_t id, const char *s, size_t n, int special, int normalized) {
    if (n == 0) return 1; /* an empty added token can never match */
    tok_added *a = realloc(t->added, (t->n_added + 1) * sizeof *a);
    if (!a) return 0;
    t->added = a;
    tok_added *e = &a[t->n_added];
    memset(e, 0, sizeof *e);
    e->content = malloc(n + 1);
    if (!e->content) return 0;
    memcpy(e->content, s, n);
    e->content[n] = 0;
    e->len = n;
    e->id = id;
    e->special = special;
    e->normalized = normalized;
    t->n_added++;
    /* Added tokens outside the model vocabulary get their own entry in the id table. */
    if (id >= t->n_strs || !t->strs[id]) return tok_set_str(t, id, s, n);
    return 1;
}

hearth_status tok_finish_load(tok_tokenizer *t, hearth_error *err) {
    int32_t n = t->n_strs;
    while (n > 0 && !t->strs[n - 1]) n--;
    t->n_strs = n;
    t->special = calloc((size_t)n + 1, 1);
    t->added_keys = calloc(t->n_added + 1, sizeof *t->added_keys);
    t->added_key_lens = calloc(t->n_added + 1, sizeof *t->added_key_lens);
    if (!t->special || !t->added_keys || !t->added_key_lens || !tok_strmap_init(&t->added_map, t->n_added, t->added_keys, t->added_key_lens))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->id < 0 || a->id >= n) return err_set(err, HEARTH_ERR_FORMAT, "added token '%.60s' has id %d out of range", a->content, a->id);
        t->added_keys[i] = a->content;
        t->added_key_lens[i] = (uint32_t)a->len;
        tok_strmap_put(&t->added_map, (int32_t)i);
        if (a->special) t->special[a->id] = 1;
        if (a->normalized) t->has_normalized_added = 1;
        else t->has_raw_added = 1;
        uint8_t b = (uint8_t)a->content[0];
        uint32_t k = 0;
        while (k < t->n_added_lens[b] && t->added_lens[b][k] != a->len) k++;
        if (k == t->n_added_lens[b]) {
            uint32_t *v = realloc(t->added_lens[b], (k + 1) * sizeof *v);
            if (!v) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            t->added_lens[b] = v;
            uint32_t j = k; /* insertion keeps the lengths longest first */
            while (j > 0 && v[j - 1] < a->len) { v[j] = v[j - 1]; j--; }
            v[j] = (uint32_t)a->len;
            t->n_added_lens[b]++;
        }
    }
    for (size_t i = 0; i < t->post.n_single; i++)
        for (size_t k = 0; k < t->post.single[i].n; k++)
            if (t->post.single[i].ids[k] < 0 || t->post.single[i].ids[k] >= n)
                return err_set(err, HEARTH_ERR_FORMAT, "post_processor: special token id %d out of range", t->post.single[i].ids[k]);
    if (t->bos_id >= n) t->bos_id = -1;
    if (t->eos_id >= n) t->eos_id = -1;
    return HEARTH_OK;
}

/* ---- loading tokenizer.json ----------------------------------------------------- */

static hearth_status parse_added(tok_tokenizer *t, json_t *arr, hearth_error *err) {
    if (!arr || json_is_null(arr)) return HEARTH_OK;
    if (!json_is_array(arr)) return err_set(err, HEARTH_ERR_FORMAT, "added_tokens is not a list");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        json_t *id = json_object_get(e, "id"), *c = json_object_get(e, "content");
        if (!json_is_integer(id) || !json_is_string(c))
            return err_set(err, HEARTH_ERR_FORMAT, "added_tokens[%zu] needs an integer id and a string content", i);
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= (1 << 24)) return err_set(err, HEARTH_ERR_FORMAT, "added_tokens[%zu] id %lld out of range", i, (long long)v);
        if (!tok_add_added(t, (int32_t)v, json_string_value(c), json_string_length(c), json_is_true(json_object_get(e, "special")),
                           json_is_true(json_object_get(e, "normalized"))))
            return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        if (t->n_added && t->added[t->n_added - 1].id == v) {
            tok_added *a = &t->added[t->n_added - 1];
            a->lstrip = json_is_true(json_object_get(e, "lstrip"));
            a->rstrip = json_is_true(json_object_get(e, "rstrip"));
            a->single_word = json_is_true(json_object_get(e, "single_word"));
        }
    }
    return HEARTH_OK;
}

static int tmpl_add(tok_post *p, int is_seq, const int32_t *ids, size_t n) {
    tok_tmpl_piece *v = realloc(p->single, (p->n_single + 1) * sizeof *v);
    if (!v) return 0;
    p->single = v;
    tok_tmpl_piece *e = &v[p->n_single];
    e->is_seq = is_seq;
    e->n = n;
    e->ids = malloc((n + 1) * sizeof *e->ids);
    if (!e->ids) return 0;
    if (n) memcpy(e->ids, ids, n * sizeof *ids);
    p->n_single++;
    p->present = 1;
    return 1;
}

/* A template replaces the current one; a later processor in a Sequence wraps the
 * earlier result, so its sequence slot becomes the previous template. */
static hearth_status parse_post(tok_tokenizer *t, json_t *j, hearth_error *err) {
    if (!j || json_is_null(j)) return HEARTH_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return err_set(err, HEARTH_ERR_FORMAT, "post_processor has no type");
    if (!strcmp(type, "ByteLevel")) return HEARTH_OK; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            hearth_status st = parse_post(t, json_array_get(arr, i), err);
            if (st) return st;
        }
        return HEARTH_OK;
    }
    tok_post old = t->post;
    memset(&t->post, 0, sizeof t->post);
    hearth_status st = HEARTH_OK;
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si) || json_integer_value(ci) < 0 || json_integer_value(si) < 0 ||
            json_integer_value(ci) >= (1 << 24) || json_integer_value(si) >= (1 << 24)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "%s needs cls and sep as [token, id]", type);
        } else {
            int32_t c = (int32_t)json_integer_value(ci), s = (int32_t)json_integer_value(si);
            if (!tmpl_add(&t->post, 0, &c, 1) || !tmpl_add(&t->post, 1, NULL, 0) || !tmpl_add(&t->post, 0, &s, 1))
                st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        }
    } else if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) st = err_set(err, HEARTH_ERR_FORMAT, "TemplateProcessing without a single template");
        for (size_t i = 0; st == HEARTH_OK && i < json_array_size(single); i++) {
            json_t *e = json_array_get(single, i);
            json_t *sp = json_object_get(e, "SpecialToken");
            if (json_object_get(e, "Sequence")) {
                if (!tmpl_add(&t->post, 1, NULL, 0)) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                continue;
            }
            const char *name = json_string_value(json_object_get(sp, "id"));
            json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
            if (!name || !json_is_array(ids)) {
                st = err_set(err, HEARTH_ERR_FORMAT, "TemplateProcessing: special token '%.60s' has no ids", name ? name : "?");
                break;
            }
            size_t n = json_array_size(ids);
            int32_t *v = malloc((n + 1) * sizeof *v);
            if (!v) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); break; }
            for (size_t k = 0; k < n && st == HEARTH_OK; k++) {
                json_int_t x = json_integer_value(json_array_get(ids, k));
                if (!json_is_integer(json_array_get(ids, k)) || x < 0 || x >= (1 << 24))
                    st = err_set(err, HEARTH_ERR_FORMAT, "TemplateProcessing: special token '%.60s' has a bad id", name);
                v[k] = (int32_t)x;
            }
            if (st == HEARTH_OK && !tmpl_add(&t->post, 0, v, n)) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            free(v);
        }
    } else {
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "post_processor type '%.100s' is not supported", type);
    }
    if (st == HEARTH_OK && old.present) {
        /* Splice the previous template into this one's sequence slot. */
        tok_post merged = {0};
        for (size_t i = 0; st == HEARTH_OK && i < t->post.n_single; i++) {
            tok_tmpl_piece *p = &t->post.single[i];
            if (!p->is_seq) { if (!tmpl_add(&merged, 0, p->ids, p->n)) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); continue; }
            for (size_t k = 0; k < old.n_single && st == HEARTH_OK; k++)
                if (!tmpl_add(&merged, old.single[k].is_seq, old.single[k].ids, old.single[k].n)) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        }
        for (size_t i = 0; i < t->post.n_single; i++) free(t->post.single[i].ids);
        free(t->post.single);
        t->post = merged;
    }
    for (size_t i = 0; i < old.n_single; i++) free(old.single[i].ids);
    free(old.single);
    return st;
}

static int uses_byte_level(const tok_pre *p, const tok_dec *d) {
    if (p) {
        if (p->kind == TOK_PRE_BYTELEVEL) return 1;
        for (size_t i = 0; i < p->n_kids; i++)
            if (uses_byte_level(p->kids[i], NULL)) return 1;
    }
    if (d) {
        if (d->kind == TOK_DEC_BYTELEVEL) return 1;
        for (size_t i = 0; i < d->n_kids; i++)
            if (uses_byte_level(NULL, d->kids[i])) return 1;
    }
    return 0;
}

static const char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

static int32_t lookup_any(const tok_tokenizer *t, const char *s) { return s ? tok_token_id(t, s) : -1; }

/* bos/eos from tokenizer_config.json, else from the post-processor's template. */
static hearth_status apply_config(tok_tokenizer *t, json_t *cfg, hearth_error *err) {
    t->bos_id = lookup_any(t, config_token(cfg, "bos_token"));
    t->eos_id = lookup_any(t, config_token(cfg, "eos_token"));
    if (!t->post.present && cfg) {
        int bos = json_is_true(json_object_get(cfg, "add_bos_token")) && t->bos_id >= 0;
        int eos = json_is_true(json_object_get(cfg, "add_eos_token")) && t->eos_id >= 0;
        if ((bos && !tmpl_add(&t->post, 0, &t->bos_id, 1)) || ((bos || eos) && !tmpl_add(&t->post, 1, NULL, 0)) ||
            (eos && !tmpl_add(&t->post, 0, &t->eos_id, 1)))
            return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    if (t->post.n_single) {
        tok_tmpl_piece *f = &t->post.single[0], *l = &t->post.single[t->post.n_single - 1];
        if (t->bos_id < 0 && !f->is_seq && f->n == 1) t->bos_id = f->ids[0];
        if (t->eos_id < 0 && !l->is_seq && l->n == 1 && t->post.n_single > 1) t->eos_id = l->ids[0];
    }
    return HEARTH_OK;
}

hearth_status tok_load_hf_json(const char *json, size_t len, const char *config_json, const char *fname,
                               tok_tokenizer **out, hearth_error *err) {
    *out = NULL;
    if (!fname) fname = "tokenizer.json";
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) return err_set(err, HEARTH_ERR_FORMAT, "%s: invalid JSON at line %d: %s", fname, je.line, je.text);
    json_t *cfg = config_json ? json_loadb_big_ints(config_json, strlen(config_json), 0, &je) : NULL; /* a broken config is ignored */
    hearth_status st = HEARTH_OK;
    tok_tokenizer *t = tok_alloc();
    if (!t) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) { st = err_set(err, HEARTH_ERR_FORMAT, "%s: no model object", fname); goto done; }
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type && json_object_get(model, "merges")) type = "BPE";
    if (!type) { st = err_set(err, HEARTH_ERR_FORMAT, "%s: model has no type", fname); goto done; }
    if (!strcmp(type, "BPE")) st = tok_bpe_load_json(t, model, err);
    else if (!strcmp(type, "WordPiece")) st = tok_wordpiece_load_json(t, model, err);
    else st = err_set(err, HEARTH_ERR_UNSUPPORTED, "model type '%.60s' is not supported (BPE and WordPiece are)", type);
    if (st) goto done;
    if ((st = parse_added(t, json_object_get(root, "added_tokens"), err))) goto done;
    json_t *n = json_object_get(root, "normalizer"), *p = json_object_get(root, "pre_tokenizer"), *d = json_object_get(root, "decoder");
    if (n && !json_is_null(n) && (st = tok_norm_parse(n, &t->norm, err))) goto done;
    if (p && !json_is_null(p) && (st = tok_pre_parse(p, &t->pre, err))) goto done;
    if (d && !json_is_null(d) && (st = tok_dec_parse(d, &t->dec, err))) goto done;
    if ((st = parse_post(t, json_object_get(root, "post_processor"), err))) goto done;
    t->kind_name = t->model.kind == TOK_MODEL_WORDPIECE ? "wordpiece"
                   : uses_byte_level(t->pre, t->dec) && !t->model.byte_fallback ? "bpe-byte-level"
                                                                                 : "bpe-sentencepiece";
    if ((st = tok_finish_load(t, err))) goto done;
    if ((st = apply_config(t, cfg, err))) goto done;
done:
    json_decref(root);
    json_decref(cfg);
    if (st != HEARTH_OK) {
        tok_free(t);
        if (err && strncmp(err->message, fname, strlen(fname))) err_prefix(err, "%s", fname);
        return st;
    }
    *out = t;
    return HEARTH_OK;
}

hearth_status tok_load_hf_dir(const char *dir, tok_tokenizer **out, hearth_error *err) {
    *out = NULL;
    char *path = path_join(dir, "tokenizer.json"), *cpath = path_join(dir, "tokenizer_config.json");
    char *json = NULL, *cfg = NULL;
    size_t len = 0, clen = 0;
    hearth_status st = path && cpath ? file_read_all(path, &json, &len, err) : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (st == HEARTH_OK) {
        if (file_exists(cpath) && file_read_all(cpath, &cfg, &clen, NULL) != HEARTH_OK) cfg = NULL;
        st = tok_load_hf_json(json, len, cfg, path, out, err);
    }
    free(json);
    free(cfg);
    free(path);
    free(cpath);
    return st;
}

/* ---- accessors ------------------------------------------------------------------- */

int32_t tok_vocab_size(const tok_tokenizer *t) { return t->n_strs; }
int32_t tok_token_id(const tok_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t k = tok_strmap_get(&t->added_map, token, n);
    if (k >= 0) return t->added[k].id;
    return tok_strmap_get(&t->model.vocab, token, n);
}
const char *tok_token_str(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_strs ? t->strs[id] : NULL; }
int tok_is_special(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_strs && t->special[id]; }
int32_t tok_bos_id(const tok_tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const tok_tokenizer *t) { return t->eos_id; }
const char *tok_kind(const tok_tokenizer *t) { return t->kind_name; }
