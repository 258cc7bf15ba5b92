/* embed.c: embedders (public API): decides how a model embeds (encoder or decoder,
 * pooling, normalization, longest input) from config.json and the sentence-transformers
 * files beside it, tokenizes inputs, packs them into ragged batches, runs the encoder
 * (model/bert.c) or the decoder forward pass with its final-normed hidden rows as output (OP_OUT_HIDDEN), then pools
 * and normalizes. Knows nothing of HTTP; one call at a time per embedder. */
#define _GNU_SOURCE
#include "api/model_internal.h"
#include "base/err.h"
#include "base/file.h"
#include "model/bert.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 2048 tokens per pass: eight full 256-token MiniLM inputs, and scratch of a few MiB
 * for small encoders; larger batches gain little on CPU. */
#define EMBED_DEFAULT_BATCH_TOKENS 2048
/* Sequences per decoder pass (KV slots); more inputs run in further passes. */
#define EMBED_DECODER_SLOTS 64

typedef enum embed_pooling { POOL_MEAN, POOL_CLS, POOL_LAST } embed_pooling;

typedef struct embed_plan {
    int encoder; /* 1: BERT family; 0: decoder */
    int is_embedding;
    embed_pooling pooling;
    int normalize;
    int max_seq; /* sentence_bert_config.json max_seq_length, 0 if absent */
} embed_plan;

struct hearth_embedder {
    hearth_model *hm;
    embed_plan plan;
    int dim, max_tokens, batch_tokens, max_seqs;
    threadpool *tp;
    bert_model *bert;
    bert_scratch *bs;
    model *dec;
    kv_cache kv;
    op_backend *be; /* the decoder's CPU backend */
    int32_t *tokens, *seq_start, *pos, *slot, *rows; /* [batch_tokens (+1)] */
    float *pooled;                                   /* [max_seqs, dim]: decoder rows */
};

static json_t *read_json(const char *dir, const char *sub, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, *sub ? "/" : "", name);
    if (!file_exists(path)) return NULL;
    json_t *j = json_load_file(path, 0, NULL);
    if (j && !json_is_object(j) && !json_is_array(j)) {
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* sentence-transformers' modules.json lists Transformer, Pooling (its folder holds the
 * mode), Normalize. Without modules.json an encoder gets mean pooling + L2 (what most
 * sentence embedding BERTs use) and a decoder is not an embedding model. */
static void plan_of(const hearth_model *hm, embed_plan *p) {
    memset(p, 0, sizeof *p);
    p->encoder = hm->entry.format == MODEL_FORMAT_DIR && bert_is_encoder(hm);
    p->pooling = POOL_MEAN;
    p->normalize = p->encoder;
    p->is_embedding = p->encoder;
    if (hm->entry.format != MODEL_FORMAT_DIR) return;
    const char *dir = hm->entry.path;
    json_t *modules = read_json(dir, "", "modules.json");
    size_t i;
    json_t *mod;
    if (json_is_array(modules)) {
        p->normalize = 0;
        json_array_foreach(modules, i, mod) {
            const char *type = json_string_value(json_object_get(mod, "type"));
            const char *path = json_string_value(json_object_get(mod, "path"));
            if (!type) continue;
            if (strstr(type, "Normalize")) p->normalize = 1;
            if (!strstr(type, "Pooling") || !path || strstr(path, "..")) continue;
            json_t *pc = read_json(dir, path, "config.json");
            p->is_embedding = 1;
            if (json_is_true(json_object_get(pc, "pooling_mode_lasttoken")))
                p->pooling = POOL_LAST;
            else if (json_is_true(json_object_get(pc, "pooling_mode_cls_token")))
                p->pooling = POOL_CLS;
            else
                p->pooling = POOL_MEAN;
            json_decref(pc);
        }
    }
    json_decref(modules);
    json_t *sb = read_json(dir, "", "sentence_bert_config.json");
    const json_t *ms = json_object_get(sb, "max_seq_length");
    if (json_is_integer(ms) && json_integer_value(ms) > 0 && json_integer_value(ms) < (1 << 24))
        p->max_seq = (int)json_integer_value(ms);
    json_decref(sb);
}

int hearth_model_is_embedding(const hearth_model *m) {
    embed_plan p;
    plan_of(m, &p);
    return p.is_embedding;
}

static hearth_status create_encoder(hearth_embedder *e, int n_threads, hearth_error *err) {
    hearth_status st = bert_load(e->hm, &e->bert, err);
    if (st) return st;
    e->dim = e->bert->hidden;
    int max = e->bert->max_positions;
    if (e->plan.max_seq > 0 && e->plan.max_seq < max) max = e->plan.max_seq;
    e->max_tokens = max < e->batch_tokens ? max : e->batch_tokens;
    e->max_seqs = e->batch_tokens;
    return bert_scratch_create(e->bert, e->batch_tokens, e->max_tokens, n_threads, &e->bs, err);
}

static hearth_status create_decoder(hearth_embedder *e, int n_threads, hearth_error *err) {
    if (e->plan.pooling == POOL_MEAN)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: mean pooling of a decoder is not supported (last or cls)",
                       e->hm->entry.path);
    hearth_status st = model_load(e->hm, 0, &e->dec, err);
    if (st) return st;
    const model_config *c = &e->dec->cfg;
    e->dim = c->hidden;
    int max = c->context_length;
    if (e->plan.max_seq > 0 && e->plan.max_seq < max) max = e->plan.max_seq;
    e->max_tokens = max < e->batch_tokens ? max : e->batch_tokens;
    e->max_seqs = EMBED_DECODER_SLOTS;
    /* every slot may waste most of one block: the pool holds the batch plus one block a slot */
    int blocks = e->batch_tokens / KV_BLOCK_SIZE + 1 + e->max_seqs;
    if ((st = model_kv_create(c, &e->kv, e->max_seqs, e->max_tokens, blocks, HEARTH_KV_FLOAT, 1, err)))
        return st; /* the model's own pool: per-layer shapes, no layers for shared KV (Gemma 4) */
    if (!(e->pooled = malloc((size_t)e->max_seqs * e->dim * sizeof(float))))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    return cpu_backend_create(model_ops(e->dec), &e->kv, e->batch_tokens, e->max_seqs, n_threads, e->tp, &e->be, err);
}

hearth_status hearth_embedder_create(hearth_model *m, const hearth_embedder_options *o, hearth_embedder **out,
                                     hearth_error *err) {
    *out = NULL;
    hearth_embedder *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    e->hm = m;
    plan_of(m, &e->plan);
    hearth_embedder_options opt = o ? *o : (hearth_embedder_options){0};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = opt.n_threads > 0 ? opt.n_threads : (cores > 0 ? (int)cores : 1);
    e->batch_tokens = opt.max_batch_tokens > 0 ? opt.max_batch_tokens : EMBED_DEFAULT_BATCH_TOKENS;
    hearth_status st = HEARTH_OK;
    if (opt.n_threads < 0 || opt.max_batch_tokens < 0 || e->batch_tokens > (1 << 20) || n_threads > (1 << 16))
        st = err_set(err, HEARTH_ERR_INVALID, "embedder: invalid options (threads %d, batch tokens %d)", n_threads,
                     e->batch_tokens);
    else if (!e->plan.is_embedding)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                     "%s: not an embedding model (an encoder, or a decoder whose sentence-transformers "
                     "modules.json has a Pooling module, e.g. Qwen3-Embedding)",
                     m->entry.path);
    else if (!m->tok)
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: no tokenizer: %s", m->entry.path, m->tok_error);
    if (!st) st = tp_create(n_threads, &e->tp, err);
    if (!st) st = e->plan.encoder ? create_encoder(e, n_threads, err) : create_decoder(e, n_threads, err);
    size_t n = (size_t)e->batch_tokens + 1;
    if (!st && (!(e->tokens = malloc(n * sizeof(int32_t))) || !(e->seq_start = malloc(n * sizeof(int32_t))) ||
                !(e->pos = malloc(n * sizeof(int32_t))) || !(e->slot = malloc(n * sizeof(int32_t))) ||
                !(e->rows = malloc(n * sizeof(int32_t)))))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (st) {
        hearth_embedder_free(e);
        return st;
    }
    *out = e;
    return HEARTH_OK;
}

void hearth_embedder_free(hearth_embedder *e) {
    if (!e) return;
    bert_scratch_free(e->bs);
    bert_free(e->bert);
    if (e->be) e->be->t->free(e->be);
    if (e->dec) kv_destroy(&e->kv);
    model_free(e->dec);
    tp_destroy(e->tp);
    free(e->tokens);
    free(e->seq_start);
    free(e->pos);
    free(e->slot);
    free(e->rows);
    free(e->pooled);
    free(e);
}

int hearth_embedder_dim(const hearth_embedder *e) { return e->dim; }
int hearth_embedder_max_tokens(const hearth_embedder *e) { return e->max_tokens; }
int hearth_embedder_normalizes(const hearth_embedder *e) { return e->plan.normalize; }
const char *hearth_embedder_pooling(const hearth_embedder *e) {
    return e->plan.pooling == POOL_LAST ? "last" : e->plan.pooling == POOL_CLS ? "cls" : "mean";
}

hearth_status embed_tokenize_fit(embed_tokenize_fn tokenize, const void *ctx, const char *text, size_t len,
                                 int max_tokens, int truncate, int32_t **ids, size_t *n_ids, hearth_error *err) {
    hearth_status st = tokenize(ctx, text, len, ids, n_ids, err);
    if (st || *n_ids <= (size_t)max_tokens) return st;
    if (!truncate || max_tokens < 1) {
        st = err_set(err, HEARTH_ERR_INVALID, "input of %zu tokens is longer than the model's maximum of %d tokens",
                     *n_ids, max_tokens);
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
        return st;
    }
    /* the specials the post-processor adds to an empty text are the prefix and suffix;
     * keep the suffix ones ([SEP], <|endoftext|>) after the kept text, as HF truncation does */
    int32_t *sp = NULL;
    size_t n_sp = 0, n_pre = 0;
    if (tokenize(ctx, "", 0, &sp, &n_sp, NULL) == HEARTH_OK)
        while (n_pre < n_sp && n_pre < *n_ids && (*ids)[n_pre] == sp[n_pre]) n_pre++;
    free(sp);
    size_t n_suf = n_sp - n_pre, keep = (size_t)max_tokens;
    if (n_suf >= keep) n_suf = 0;
    memmove(*ids + keep - n_suf, *ids + *n_ids - n_suf, n_suf * sizeof(int32_t));
    *n_ids = keep;
    return HEARTH_OK;
}

static hearth_status model_tokenize(const void *model, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                                    hearth_error *err) {
    return hearth_tokenize(model, text, len, 1, ids, n_ids, err);
}

hearth_status hearth_embed_tokenize(const hearth_embedder *e, const char *text, size_t len, int truncate, int32_t **ids,
                                    size_t *n_ids, hearth_error *err) {
    return embed_tokenize_fit(model_tokenize, e->hm, text, len, e->max_tokens, truncate, ids, n_ids, err);
}

static void l2_normalize(float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i] * v[i];
    /* sentence-transformers' Normalize clamps the norm at 1e-12 (torch F.normalize) */
    double norm = sqrt(s);
    float inv = (float)(1.0 / (norm > 1e-12 ? norm : 1e-12));
    for (int i = 0; i < n; i++) v[i] *= inv;
}

/* Encoder pass over inputs first..first+n-1 (packed in e->tokens / e->seq_start). */
static hearth_status run_encoder(hearth_embedder *e, int n, float *out, hearth_error *err) {
    const float *hidden;
    hearth_status st = bert_forward(e->bert, e->bs, e->tokens, e->seq_start, n, e->tp, &hidden, err);
    if (st) return st;
    for (int s = 0; s < n; s++) {
        int a = e->seq_start[s], b = e->seq_start[s + 1];
        float *o = out + (size_t)s * e->dim;
        if (e->plan.pooling == POOL_MEAN) {
            memset(o, 0, (size_t)e->dim * sizeof *o);
            for (int t = a; t < b; t++)
                for (int c = 0; c < e->dim; c++) o[c] += hidden[(size_t)t * e->dim + c];
            for (int c = 0; c < e->dim; c++) o[c] /= (float)(b - a);
        } else {
            int t = e->plan.pooling == POOL_CLS ? a : b - 1;
            memcpy(o, hidden + (size_t)t * e->dim, (size_t)e->dim * sizeof *o);
        }
    }
    return HEARTH_OK;
}

/* Decoder pass: each input in its own KV slot, causal within itself; the pooled row is the
 * last token (Qwen3-Embedding) or the first (cls). n <= max_seqs. */
static hearth_status run_decoder(hearth_embedder *e, int n, float *out, hearth_error *err) {
    hearth_status st = HEARTH_OK;
    for (int s = 0; s < n && !st; s++) {
        st = kv_reserve(&e->kv, s, e->seq_start[s + 1] - e->seq_start[s], err);
        for (int t = e->seq_start[s]; t < e->seq_start[s + 1]; t++) {
            e->slot[t] = s;
            e->pos[t] = t - e->seq_start[s];
        }
        e->rows[s] = e->plan.pooling == POOL_CLS ? e->seq_start[s] : e->seq_start[s + 1] - 1;
    }
    /* the final-normed hidden rows to pool, instead of logits */
    op_batch b = {.T = e->seq_start[n], .tokens = e->tokens, .pos = e->pos, .slot = e->slot, .n_out = n,
                  .out_rows = e->rows, .logits = out};
    if (!st) st = model_forward(e->dec, e->be, &e->kv, &b, OP_OUT_HIDDEN, NULL, err);
    for (int s = 0; s < n; s++) kv_release(&e->kv, s);
    return st;
}

hearth_status hearth_embed(hearth_embedder *e, const int32_t *const *inputs, const size_t *lens, size_t n_inputs,
                           float *out, hearth_error *err) {
    for (size_t i = 0; i < n_inputs; i++)
        if (lens[i] == 0 || lens[i] > (size_t)e->max_tokens)
            return err_set(err, HEARTH_ERR_INVALID, "input %zu has %zu tokens (1..%d allowed)", i, lens[i],
                           e->max_tokens);
    size_t i = 0;
    while (i < n_inputs) {
        /* pack whole inputs up to the batch's tokens and slots */
        int n = 0, T = 0;
        e->seq_start[0] = 0;
        while (i + n < n_inputs && n < e->max_seqs && T + (int)lens[i + n] <= e->batch_tokens) {
            memcpy(e->tokens + T, inputs[i + n], lens[i + n] * sizeof(int32_t));
            T += (int)lens[i + n];
            e->seq_start[++n] = T;
        }
        float *o = out + i * e->dim;
        hearth_status st = e->plan.encoder ? run_encoder(e, n, o, err) : run_decoder(e, n, o, err);
        if (st) return st;
        for (int s = 0; s < n && e->plan.normalize; s++) l2_normalize(o + (size_t)s * e->dim, e->dim);
        i += n;
    }
    return HEARTH_OK;
}
