/* train_data.c: the training data of hearth train as mlx_lm.lora 0.32.2 reads it
 * (tuner/datasets.py, tuner/trainer.py iterate_batches): JSONL lines of one of three
 * formats, tokenized with the model's tokenizer and chat template, and numpy's legacy
 * generator for the batch order. */
#include "train/train_internal.h"
#include "base/err.h"
#include "model/model_handle.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { FMT_TEXT, FMT_COMPLETION, FMT_CHAT, FMT_PREF } tr_format;

/* extra: the template's keyword arguments (a JSON object) or NULL */
static hearth_status render_text(const hearth_model *m, json_t *messages, json_t *tools, int add_gen, const char *extra,
                                 char **text, hearth_error *err) {
    char *mj = json_dumps(messages, JSON_COMPACT), *tj = tools && !json_is_null(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
    hearth_status st =
        mj ? hearth_chat_render(m, mj, tj, add_gen, extra, text, err) : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    free(mj), free(tj);
    return st;
}

/* Whether the vocabulary has thinking markers as mlx-lm's tokenizer_utils._infer_thinking
 * finds them (a pair of think tokens, Gemma 4's channel tokens, or the xtml markers). */
static int has_thinking(const hearth_model *m) {
    static const char *const pairs[][2] = {{"<think>", "</think>"},
                                           {"<longcat_think>", "</longcat_think>"},
                                           {"<|think:start|>", "<|think:end|>"},
                                           {"<|channel>", "<channel|>"},
                                           {"<|open|>", "<|close|>"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        if (hearth_token_id(m, pairs[i][0]) >= 0 && hearth_token_id(m, pairs[i][1]) >= 0 &&
            (i < 4 || (hearth_token_id(m, "<|sep|>") >= 0 && hearth_token_id(m, "<|end_of_msg|>") >= 0)))
            return 1;
    return 0;
}

/* An sft row's render: mlx_lm.lora's tokenizer (mlx-lm's TokenizerWrapper) passes the
 * template enable_thinking, true when the vocabulary has thinking markers (Gemma 4's
 * template then opens with a thinking system turn). */
static hearth_status render_ids(const hearth_model *m, json_t *messages, json_t *tools, int add_gen, int32_t **ids,
                                size_t *n, hearth_error *err) {
    char *text = NULL;
    hearth_status st =
        render_text(m, messages, tools, add_gen,
                    has_thinking(m) ? "{\"enable_thinking\": true}" : "{\"enable_thinking\": false}", &text, err);
    /* transformers' apply_chat_template tokenizes the rendered text without adding specials */
    if (!st) st = hearth_tokenize(m, text, strlen(text), 0, ids, n, err);
    hearth_free(text);
    return st;
}

/* prompt + response (+ EOS) as one sequence of ids, each part tokenized alone */
static hearth_status pref_ids(const hearth_model *m, const char *prompt, const char *resp, int32_t eos, int32_t **out,
                              int *n_out, int *n_prompt, hearth_error *err) {
    int32_t *p = NULL, *r = NULL;
    size_t pn = 0, rn = 0;
    hearth_status st = hearth_tokenize(m, prompt, strlen(prompt), 0, &p, &pn, err);
    if (!st) st = hearth_tokenize(m, resp, strlen(resp), 0, &r, &rn, err);
    int32_t *ids = st ? NULL : malloc(sizeof(int32_t) * (pn + rn + 1));
    if (!st && !ids) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) {
        if (pn) memcpy(ids, p, sizeof(int32_t) * pn);
        if (rn) memcpy(ids + pn, r, sizeof(int32_t) * rn);
        if (eos >= 0) ids[pn + rn++] = eos; /* TRL appends EOS to each response */
        *out = ids, *n_out = (int)(pn + rn), *n_prompt = (int)pn;
    }
    hearth_free(p), hearth_free(r);
    return st;
}

/* the text of a conversational response: the render of prompt + response minus the
 * prompt's render with the generation prompt (TRL's maybe_apply_chat_template) */
static hearth_status pref_response_text(const hearth_model *m, json_t *prompt, json_t *resp, json_t *tools,
                                        const char *ptext, const char *key, char **out, const char *where,
                                        hearth_error *err) {
    json_t *all = json_array();
    json_array_extend(all, prompt);
    json_array_extend(all, resp);
    char *full = NULL;
    hearth_status st = render_text(m, all, tools, 0, NULL, &full, err);
    json_decref(all);
    if (st) return st;
    size_t pl = strlen(ptext);
    if (strncmp(full, ptext, pl))
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: the chat template's render of prompt + %s does not start with the "
                     "prompt's render", where, key);
    else if (!(*out = strdup(full + pl))) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_free(full);
    return st;
}

static hearth_status pref_example(const hearth_model *m, json_t *j, int32_t eos, tr_example *ex, const char *where,
                                  hearth_error *err) {
    json_t *p = json_object_get(j, "prompt"), *c = json_object_get(j, "chosen"), *r = json_object_get(j, "rejected");
    json_t *tools = json_object_get(j, "tools");
    char *ptext = NULL, *ctext = NULL, *rtext = NULL;
    hearth_status st = HEARTH_OK;
    int keys = ex->keys;
    if (json_is_string(p) && json_is_string(c) && json_is_string(r)) {
        if (!(ptext = strdup(json_string_value(p))) || !(ctext = strdup(json_string_value(c))) ||
            !(rtext = strdup(json_string_value(r))))
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    } else if (json_is_array(p) && json_is_array(c) && json_is_array(r) && json_array_size(p) && json_array_size(c) &&
               json_array_size(r)) {
        char *rendered = NULL;
        st = render_text(m, p, tools, 1, NULL, &rendered, err);
        if (!st && !(ptext = strdup(rendered))) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        hearth_free(rendered);
        if (!st) st = pref_response_text(m, p, c, tools, ptext, "chosen", &ctext, where, err);
        if (!st) st = pref_response_text(m, p, r, tools, ptext, "rejected", &rtext, where, err);
        if (st && !err->message[0]) st = err_set(err, st, "%s: could not render the chat template", where);
    } else {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: \"prompt\", \"chosen\" and \"rejected\" must be all strings or all "
                     "non-empty message lists", where);
    }
    int pn = 0, pn2 = 0;
    *ex = (tr_example){.keys = keys};
    if (!st) st = pref_ids(m, ptext, ctext, eos, &ex->ids, &ex->n, &pn, err);
    if (!st) st = pref_ids(m, ptext, rtext, eos, &ex->ids2, &ex->n2, &pn2, err);
    if (st) free(ex->ids), free(ex->ids2), ex->ids = ex->ids2 = NULL;
    ex->offset = pn;
    free(ptext), free(ctext), free(rtext);
    return st;
}

static hearth_status example_of(const hearth_model *m, json_t *j, tr_format fmt, int mask_prompt, int32_t eos,
                                tr_example *ex, const char *where, hearth_error *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    hearth_status st = HEARTH_OK;
    ex->keys = (int)json_object_size(j);
    if (fmt == FMT_PREF) return pref_example(m, j, eos, ex, where, err);
    if (fmt == FMT_TEXT) {
        const char *text = json_string_value(json_object_get(j, "text"));
        if (!text) return err_set(err, HEARTH_ERR_FORMAT, "%s: \"text\" must be a string", where);
        if ((st = hearth_tokenize(m, text, strlen(text), 1, &ids, &n, err))) return st;
        if ((n == 0 || ids[n - 1] != eos) && eos >= 0) { /* mlx-lm ends each text with EOS */
            int32_t *g = realloc(ids, (n + 1) * sizeof *ids);
            if (!g) return hearth_free(ids), err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            ids = g;
            ids[n++] = eos;
        }
        *ex = (tr_example){.ids = ids, .n = (int)n, .keys = ex->keys};
        return HEARTH_OK;
    }
    json_t *messages, *tools = json_object_get(j, "tools");
    if (fmt == FMT_COMPLETION) {
        json_t *p = json_object_get(j, "prompt"), *c = json_object_get(j, "completion");
        if (!json_is_string(p) || !json_is_string(c))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: \"prompt\" and \"completion\" must be strings", where);
        messages = json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "user", "content", p, "role", "assistant", "content", c);
    } else {
        messages = json_incref(json_object_get(j, "messages"));
        if (!json_is_array(messages) || !json_array_size(messages)) {
            json_decref(messages);
            return err_set(err, HEARTH_ERR_FORMAT, "%s: \"messages\" must be a non-empty array", where);
        }
    }
    st = render_ids(m, messages, tools, 0, &ids, &n, err);
    int offset = 0;
    if (!st && mask_prompt) {
        size_t k = json_array_size(messages);
        json_t *last = json_array_get(messages, k - 1);
        const char *role = json_string_value(json_object_get(last, "role"));
        int add_gen = fmt == FMT_COMPLETION || (role && !strcmp(role, "assistant"));
        json_t *head = json_array();
        for (size_t i = 0; i + 1 < k; i++) json_array_append(head, json_array_get(messages, i));
        int32_t *hid = NULL;
        size_t hn = 0;
        st = render_ids(m, head, tools, add_gen, &hid, &hn, err);
        json_decref(head);
        hearth_free(hid);
        offset = (int)hn;
    }
    json_decref(messages);
    if (st) {
        hearth_free(ids);
        return err->message[0] ? st : err_set(err, st, "%s: could not render the chat template", where);
    }
    *ex = (tr_example){.ids = ids, .n = (int)n, .offset = offset, .keys = ex->keys};
    return HEARTH_OK;
}

hearth_status tr_dataset_parse(const hearth_model *m, const char *buf, size_t len, const char *name, int mask_prompt,
                               tr_dataset *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    const char *eos_s = m->eos_token; /* tokenizer_config.json's eos_token, or the GGUF's */
    int32_t eos = eos_s ? hearth_token_id(m, eos_s) : -1;
    int lineno = 0, cap_ex = 0;
    tr_format fmt = FMT_TEXT;
    hearth_status st = HEARTH_OK;
    for (size_t pos = 0; !st && pos < len;) {
        const char *line = buf + pos, *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl != NULL);
        lineno++;
        char where[600];
        snprintf(where, sizeof where, "%s:%d", name, lineno);
        json_error_t je;
        json_t *j = json_loadb(line, n, 0, &je);
        if (!j || !json_is_object(j)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: not a JSON object (%s)", where, j ? "another JSON value" : je.text);
            json_decref(j);
            break;
        }
        if (out->n == 0) { /* the first line decides, as mlx-lm's create_dataset does */
            if (json_object_get(j, "chosen") && json_object_get(j, "rejected")) fmt = FMT_PREF;
            else if (json_object_get(j, "prompt") && json_object_get(j, "completion")) fmt = FMT_COMPLETION;
            else if (json_object_get(j, "messages")) fmt = FMT_CHAT;
            else if (json_object_get(j, "text")) fmt = FMT_TEXT;
            else st = err_set(err, HEARTH_ERR_FORMAT,
                              "%s: unsupported data format: each line needs \"text\", \"prompt\" and "
                              "\"completion\", \"messages\", or \"prompt\", \"chosen\" and \"rejected\"",
                              where);
            out->pref = fmt == FMT_PREF;
            if (!st && fmt == FMT_TEXT && mask_prompt)
                st = err_set(err, HEARTH_ERR_INVALID, "%s: --mask-prompt needs prompt/completion or messages data", name);
        }
        if (!st && out->n == cap_ex) {
            cap_ex = cap_ex ? 2 * cap_ex : 64;
            tr_example *g = realloc(out->ex, (size_t)cap_ex * sizeof *g);
            if (!g) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            else out->ex = g;
        }
        if (!st) st = example_of(m, j, fmt, mask_prompt, eos, &out->ex[out->n], where, err);
        if (!st) out->n++;
        json_decref(j);
    }
    if (st) tr_dataset_free(out);
    return st;
}

hearth_status tr_dataset_load(const hearth_model *m, const char *path, int optional, int mask_prompt,
                              tr_dataset *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT) return HEARTH_OK;
        return err_set(err, HEARTH_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    hearth_status st = HEARTH_OK;
    do {
        if (len + 65536 > cap) {
            char *g = realloc(buf, cap = 2 * cap + 65536);
            if (!g) {
                st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                break;
            }
            buf = g;
        }
        len += got = fread(buf + len, 1, cap - len, f);
    } while (got);
    if (!st && ferror(f)) st = err_set(err, HEARTH_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (!st) st = tr_dataset_parse(m, buf, len, path, mask_prompt, out, err);
    free(buf);
    if (!st && !out->n && !optional) st = err_set(err, HEARTH_ERR_INVALID, "%s: no examples", path);
    return st;
}

void tr_dataset_free(tr_dataset *d) {
    for (int i = 0; d->ex && i < d->n; i++) hearth_free(d->ex[i].ids), free(d->ex[i].ids2);
    free(d->ex);
    memset(d, 0, sizeof *d);
}

hearth_status tr_batches(const tr_dataset *d, int batch_size, const char *what, int **idx, int *n_batches,
                         hearth_error *err) {
    if (d->n < batch_size)
        return err_set(err, HEARTH_ERR_INVALID, "%s has %d examples, fewer than --batch-size %d", what, d->n,
                       batch_size);
    int *ix = malloc(sizeof(int) * (size_t)d->n);
    if (!ix) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int i = 0; i < d->n; i++) ix[i] = i;
    for (int i = 1; i < d->n; i++) /* stable insertion sort by key count */
        for (int j = i; j > 0 && d->ex[ix[j - 1]].keys > d->ex[ix[j]].keys; j--) {
            int t = ix[j];
            ix[j] = ix[j - 1], ix[j - 1] = t;
        }
    *idx = ix;
    *n_batches = d->n / batch_size;
    return HEARTH_OK;
}

void tr_mt_seed(tr_mt *r, uint32_t seed) {
    r->mt[0] = seed;
    for (int i = 1; i < 624; i++) r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->i = 624;
}

uint32_t tr_mt_u32(tr_mt *r) {
    if (r->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (r->mt[k] & 0x80000000u) | (r->mt[(k + 1) % 624] & 0x7fffffffu);
            r->mt[k] = r->mt[(k + 397) % 624] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
        }
        r->i = 0;
    }
    uint32_t y = r->mt[r->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

void tr_mt_permutation(tr_mt *r, int *out, int n) {
    for (int i = 0; i < n; i++) out[i] = i;
    for (int i = n - 1; i > 0; i--) {
        uint32_t max = (uint32_t)i, mask = max, v;
        for (int s = 1; s <= 16; s <<= 1) mask |= mask >> s;
        while ((v = tr_mt_u32(r) & mask) > max) {}
        int t = out[i];
        out[i] = out[v], out[v] = t;
    }
}
