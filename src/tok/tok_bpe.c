/* tok_bpe.c: the BPE model: vocabulary and merges from tokenizer.json, the
 * (left id, right id) -> (rank, merged id) hash map, and the merge loop over one
 * pre-token (linked symbols + a binary heap, scratch reused across words, so no
 * allocation per token). Byte fallback, unk fusing and ignore_merges as in HF. */
#include "tok/tok_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tok_sym { int32_t id; int32_t prev, next; uint32_t len; } tok_sym;
typedef struct tok_heap_item { int32_t rank, pos, new_id; } tok_heap_item;

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
    free(s->syms);
    free(s->heap);
    sbuf_free(&s->tmp);
    memset(s, 0, sizeof *s);
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static uint32_t pair_hash(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; return (uint32_t)k; }

static const tok_merge_slot *merge_get(const tok_model *m, int32_t a, int32_t b) {
    if (!m->merge_cap) return NULL;
    uint64_t k = pair_key(a, b);
    for (uint32_t i = pair_hash(k) & (m->merge_cap - 1);; i = (i + 1) & (m->merge_cap - 1)) {
        if (m->merges[i].key == k) return &m->merges[i];
        if (m->merges[i].key == UINT64_MAX) return NULL;
    }
}

hearth_status tok_bpe_build_merges(tok_tokenizer *t, const int32_t *pairs, size_t n_pairs, hearth_error *err) {
    tok_model *m = &t->model;
    uint32_t cap = 16;
    while (cap < n_pairs * 2 + 16 && cap < (1u << 30)) cap <<= 1;
    if (n_pairs > (1u << 28)) return err_set(err, HEARTH_ERR_FORMAT, "too many merges (%zu)", n_pairs);
    m->merges = malloc((size_t)cap * sizeof *m->merges);
    if (!m->merges) return err_set(err, HEARTH_ERR_NOMEM, "out of memory for %zu merges", n_pairs);
    memset(m->merges, 0xff, (size_t)cap * sizeof *m->merges);
    m->merge_cap = cap;
    sbuf tmp;
    sbuf_init(&tmp);
    size_t pl = strlen(m->prefix);
    for (size_t r = 0; r < n_pairs; r++) {
        int32_t a = pairs[2 * r], b = pairs[2 * r + 1];
        /* The merged token is a + b, where b loses its continuing-subword prefix. */
        const char *bs = t->strs[b];
        size_t bl = t->str_lens[b];
        if (pl && bl >= pl && !memcmp(bs, m->prefix, pl)) { bs += pl; bl -= pl; }
        sbuf_reset(&tmp);
        sbuf_append(&tmp, t->strs[a], t->str_lens[a]);
        sbuf_append(&tmp, bs, bl);
        int32_t id = tmp.oom ? -1 : tok_strmap_get(&m->vocab, tmp.data, tmp.len);
        if (id < 0) {
            hearth_status st = err_set(err, HEARTH_ERR_FORMAT, "merge %zu ('%.60s' '%.60s'): merged token is not in the vocabulary",
                                       r, t->strs[a], t->strs[b]);
            sbuf_free(&tmp);
            return st;
        }
        uint64_t k = pair_key(a, b);
        uint32_t i = pair_hash(k) & (cap - 1);
        while (m->merges[i].key != UINT64_MAX && m->merges[i].key != k) i = (i + 1) & (cap - 1);
        if (m->merges[i].key == k) continue; /* HF keeps the first (best) rank of a repeated pair */
        m->merges[i] = (tok_merge_slot){k, (int32_t)r, id};
    }
    sbuf_free(&tmp);
    return HEARTH_OK;
}

static hearth_status parse_vocab(tok_tokenizer *t, json_t *vocab, hearth_error *err) {
    if (!json_is_object(vocab)) return err_set(err, HEARTH_ERR_FORMAT, "model.vocab is not an object");
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v)) return err_set(err, HEARTH_ERR_FORMAT, "vocab entry '%.60s' has no integer id", k);
        json_int_t id = json_integer_value(v);
        /* 2^24 ids is far beyond any real vocabulary and keeps the id table bounded. */
        if (id < 0 || id >= (1 << 24))
            return err_set(err, HEARTH_ERR_FORMAT, "vocab entry '%.60s' has id %lld out of range", k, (long long)id);
        size_t kl = strlen(k); /* jansson keys cannot hold NUL; the key ends at the first one */
        if (!tok_set_str(t, (int32_t)id, k, kl)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    if (!tok_strmap_init(&t->model.vocab, json_object_size(vocab), t->strs, t->str_lens))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    json_object_foreach(vocab, k, v) tok_strmap_put(&t->model.vocab, (int32_t)json_integer_value(v));
    return HEARTH_OK;
}

static char *dup_opt(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return strdup(s ? s : "");
}

static void find_byte_ids(tok_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->model.byte_ids[b] = tok_strmap_get(&t->model.vocab, name, 6);
    }
}

hearth_status tok_bpe_load_json(tok_tokenizer *t, json_t *model, hearth_error *err) {
    tok_model *m = &t->model;
    m->kind = TOK_MODEL_BPE;
    hearth_status st = parse_vocab(t, json_object_get(model, "vocab"), err);
    if (st) return st;
    m->prefix = dup_opt(model, "continuing_subword_prefix");
    m->suffix = dup_opt(model, "end_of_word_suffix");
    if (!m->prefix || !m->suffix) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "BPE dropout is not supported (it makes encoding random)");
    m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    m->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    m->unk_id = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) m->unk_id = tok_strmap_get(&m->vocab, unk, strlen(unk));
    find_byte_ids(t);

    json_t *merges = json_object_get(model, "merges");
    size_t n = json_array_size(merges);
    if (merges && !json_is_array(merges)) return err_set(err, HEARTH_ERR_FORMAT, "model.merges is not a list");
    int32_t *pairs = malloc((n + 1) * 2 * sizeof *pairs);
    if (!pairs) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            const char *sp = strchr(s, ' ');
            if (sp) { a = s; al = (size_t)(sp - s); b = sp + 1; bl = strlen(b); }
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = strlen(a);
            b = json_string_value(json_array_get(e, 1));
            bl = strlen(b);
        }
        if (!a) { free(pairs); return err_set(err, HEARTH_ERR_FORMAT, "merge %zu is not \"a b\" or [a, b]", i); }
        pairs[2 * i] = tok_strmap_get(&m->vocab, a, al);
        pairs[2 * i + 1] = tok_strmap_get(&m->vocab, b, bl);
        if (pairs[2 * i] < 0 || pairs[2 * i + 1] < 0) {
            free(pairs);
            return err_set(err, HEARTH_ERR_FORMAT, "merge %zu ('%.*s' '%.*s') uses a token not in the vocabulary", i,
                           (int)(al > 60 ? 60 : al), a, (int)(bl > 60 ? 60 : bl), b);
        }
    }
    st = tok_bpe_build_merges(t, pairs, n, err);
    free(pairs);
    return st;
}

/* ---- encoding ---------------------------------------------------------------- */

static int heap_push(tok_bpe_scratch *s, size_t *n, tok_heap_item it) {
    if (*n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        tok_heap_item *h = realloc(s->heap, cap * sizeof *h);
        if (!h) return 0;
        s->heap = h;
        s->heap_cap = cap;
    }
    tok_heap_item *h = s->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < it.rank || (h[p].rank == it.rank && h[p].pos <= it.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
    return 1;
}

static tok_heap_item heap_pop(tok_bpe_scratch *s, size_t *n) {
    tok_heap_item *h = s->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos))) c++;
        if (last.rank < h[c].rank || (last.rank == h[c].rank && last.pos <= h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static int sym_push(tok_bpe_scratch *s, size_t *n, int32_t id, uint32_t len) {
    if (*n == s->syms_cap) {
        size_t cap = s->syms_cap ? s->syms_cap * 2 : 64;
        tok_sym *v = realloc(s->syms, cap * sizeof *v);
        if (!v) return 0;
        s->syms = v;
        s->syms_cap = cap;
    }
    s->syms[*n] = (tok_sym){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
    return 1;
}

int tok_bpe_encode_word(const tok_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *s, tok_ids *out) {
    const tok_model *m = &t->model;
    if (n == 0) return 1;
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&m->vocab, w, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    size_t ns = 0, pl = strlen(m->prefix), sl = strlen(m->suffix);
    int prev_unk = 0;
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_len((const uint8_t *)w + i, n - i);
        if (!l) l = 1; /* input is validated; this only guards the loop */
        int32_t id;
        if (pl || sl) {
            sbuf_reset(&s->tmp);
            if (i > 0) sbuf_append(&s->tmp, m->prefix, pl);
            sbuf_append(&s->tmp, w + i, (size_t)l);
            if (i + (size_t)l == n) sbuf_append(&s->tmp, m->suffix, sl);
            id = s->tmp.oom ? -1 : tok_strmap_get(&m->vocab, s->tmp.data, s->tmp.len);
        } else {
            id = tok_strmap_get(&m->vocab, w + i, (size_t)l);
        }
        if (id >= 0) {
            if (!sym_push(s, &ns, id, (uint32_t)l)) return 0;
            prev_unk = 0;
        } else {
            int all = m->byte_fallback;
            for (int k = 0; all && k < l; k++) all = m->byte_ids[(uint8_t)w[i + k]] >= 0;
            if (all) {
                for (int k = 0; k < l; k++)
                    if (!sym_push(s, &ns, m->byte_ids[(uint8_t)w[i + k]], 1)) return 0;
                prev_unk = 0;
            } else if (m->unk_id >= 0) {
                if (m->fuse_unk && prev_unk) s->syms[ns - 1].len += (uint32_t)l;
                else if (!sym_push(s, &ns, m->unk_id, (uint32_t)l)) return 0;
                prev_unk = 1;
            }
            /* no unk token: HF drops the char */
        }
        i += (size_t)l;
    }
    if (ns == 0) return 1;
    s->syms[ns - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const tok_merge_slot *mg = merge_get(m, s->syms[i].id, s->syms[i + 1].id);
        if (mg && !heap_push(s, &nh, (tok_heap_item){mg->rank, (int32_t)i, mg->new_id})) return 0;
    }
    tok_sym *sy = s->syms;
    while (nh) {
        tok_heap_item top = heap_pop(s, &nh);
        tok_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t nx = cur->next;
        const tok_merge_slot *mg = merge_get(m, cur->id, sy[nx].id);
        if (!mg || mg->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->len += sy[nx].len;
        cur->next = sy[nx].next;
        sy[nx].len = 0;
        if (cur->next >= 0) sy[cur->next].prev = top.pos;
        if (cur->prev >= 0) {
            mg = merge_get(m, sy[cur->prev].id, cur->id);
            if (mg && !heap_push(s, &nh, (tok_heap_item){mg->rank, cur->prev, mg->new_id})) return 0;
            cur = &sy[top.pos];
        }
        if (cur->next >= 0) {
            mg = merge_get(m, cur->id, sy[cur->next].id);
            if (mg && !heap_push(s, &nh, (tok_heap_item){mg->rank, top.pos, mg->new_id})) return 0;
        }
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if (!tok_ids_push(out, sy[i].id)) return 0;
    return 1;
}
