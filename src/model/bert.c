/* bert.c: the BERT-family encoder: reads config.json, loads every tensor as float32
 * (names with or without the "bert." prefix of task-head checkpoints), checks shapes,
 * and runs the forward pass as a straight sequence of ops over a ragged batch. The
 * pooler and task heads are not loaded: sentence-transformers pools the last hidden state. */
#define _GNU_SOURCE
#include "model/bert.h"
#include "model/model_handle.h"
#include "base/err.h"
#include "backend/cpu/cpu_ops.h"
#include "ops/ops_encoder.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bert_scratch {
    int max_tokens, max_len;
    float *x, *q, *k, *v, *att, *tmp, *h, *attn;
    void *mm;
    size_t mm_size;
};

int bert_is_encoder(const hearth_model *hm) {
    const char *mt = json_string_value(json_object_get(hm->config, "model_type"));
    return mt && (!strcmp(mt, "bert") || !strcmp(mt, "roberta") || !strcmp(mt, "xlm-roberta"));
}

typedef struct bert_loader {
    const hearth_model *hm;
    bert_model *b;
    const char *prefix; /* "" or "bert." */
    hearth_error *err;
} bert_loader;

/* Tensor `name` (after the prefix) as float32 with exactly rows x cols elements. */
static hearth_status take(bert_loader *L, const char *name, int64_t rows, int64_t cols, float **out) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", L->prefix, name);
    const tensor_info *t = model_find_tensor(L->hm, full);
    if (!t) return err_set(L->err, HEARTH_ERR_FORMAT, "%s: missing tensor '%s'", L->hm->entry.path, full);
    int64_t want0 = cols > 1 || rows > 1 ? rows : 1;
    int shape_ok =
        cols > 0 ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols : t->ndim == 1 && t->shape[0] == rows;
    if (!shape_ok)
        return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' has %d dims [%lld, ...], expected [%lld%s%lld]",
                       L->hm->entry.path, full, t->ndim, (long long)(t->ndim ? t->shape[0] : 0), (long long)want0,
                       cols > 0 ? ", " : "", (long long)(cols > 0 ? cols : 0));
    size_t n;
    hearth_status st = hearth_model_tensor_f32(L->hm, full, out, &n, L->err);
    if (st) return st;
    for (size_t i = 0; i < n; i++)
        if (!isfinite((*out)[i])) {
            free(*out);
            *out = NULL;
            return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at index %zu",
                           L->hm->entry.path, full, i);
        }
    L->b->owned[L->b->n_owned++] = *out;
    L->b->weight_bytes += n * sizeof(float);
    return HEARTH_OK;
}

static hearth_status take_matrix(bert_loader *L, const char *module, int64_t n_out, int64_t n_in, op_weight *w,
                                 float **bias) {
    char name[256];
    float *data;
    snprintf(name, sizeof name, "%s.weight", module);
    hearth_status st = take(L, name, n_out, n_in, &data);
    if (st) return st;
    *w = (op_weight){.dtype = DT_F32, .data = data, .n = n_out, .k = n_in};
    snprintf(name, sizeof name, "%s.bias", module);
    if ((st = take(L, name, n_out, 0, bias))) return st;
    return op_weight_check(w, name, L->err);
}

static hearth_status load_layer(bert_loader *L, int i, bert_layer *l) {
    const bert_model *b = L->b;
    char m[8][128];
    const char *sub[] = {"attention.self.query",       "attention.self.key", "attention.self.value",
                         "attention.output.dense",     "intermediate.dense", "output.dense",
                         "attention.output.LayerNorm", "output.LayerNorm"};
    for (int j = 0; j < 8; j++) snprintf(m[j], sizeof m[j], "encoder.layer.%d.%s", i, sub[j]);
    char lw[2][160], lb[2][160];
    for (int j = 0; j < 2; j++) {
        snprintf(lw[j], sizeof lw[j], "%s.weight", m[6 + j]);
        snprintf(lb[j], sizeof lb[j], "%s.bias", m[6 + j]);
    }
    hearth_status st;
    if ((st = take_matrix(L, m[0], b->hidden, b->hidden, &l->q, &l->q_b)) ||
        (st = take_matrix(L, m[1], b->hidden, b->hidden, &l->k, &l->k_b)) ||
        (st = take_matrix(L, m[2], b->hidden, b->hidden, &l->v, &l->v_b)) ||
        (st = take_matrix(L, m[3], b->hidden, b->hidden, &l->o, &l->o_b)) ||
        (st = take_matrix(L, m[4], b->ffn, b->hidden, &l->up, &l->up_b)) ||
        (st = take_matrix(L, m[5], b->hidden, b->ffn, &l->down, &l->down_b)) ||
        (st = take(L, lw[0], b->hidden, 0, &l->attn_ln_w)) || (st = take(L, lb[0], b->hidden, 0, &l->attn_ln_b)) ||
        (st = take(L, lw[1], b->hidden, 0, &l->out_ln_w)) || (st = take(L, lb[1], b->hidden, 0, &l->out_ln_b)))
        return st;
    return HEARTH_OK;
}

static int cfg_int(const json_t *c, const char *k, int dflt) {
    const json_t *v = json_object_get(c, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

static hearth_status read_config(const hearth_model *hm, bert_model *b, hearth_error *err) {
    const json_t *c = hm->config;
    b->n_layers = cfg_int(c, "num_hidden_layers", 0);
    b->hidden = cfg_int(c, "hidden_size", 0);
    b->n_heads = cfg_int(c, "num_attention_heads", 0);
    b->ffn = cfg_int(c, "intermediate_size", 0);
    b->vocab = cfg_int(c, "vocab_size", 0);
    b->max_positions = cfg_int(c, "max_position_embeddings", 512);
    b->type_vocab = cfg_int(c, "type_vocab_size", 2);
    const json_t *eps = json_object_get(c, "layer_norm_eps");
    b->eps = json_is_number(eps) ? (float)json_number_value(eps) : 1e-12f; /* transformers' BertConfig default */
    const char *act = json_string_value(json_object_get(c, "hidden_act"));
    const char *pet = json_string_value(json_object_get(c, "position_embedding_type"));
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    if (mt && strcmp(mt, "bert"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: encoder '%s' is not supported yet (supported: bert)",
                       hm->entry.path, mt);
    if (act && strcmp(act, "gelu"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (supported: gelu)",
                       hm->entry.path, act);
    if (pet && strcmp(pet, "absolute"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: position_embedding_type '%s' is not supported", hm->entry.path,
                       pet);
    /* 2^16 bounds keep every product in size_t/int far beyond real encoders */
    if (b->n_layers <= 0 || b->hidden <= 0 || b->n_heads <= 0 || b->hidden % b->n_heads || b->ffn <= 0 ||
        b->vocab <= 0 || b->max_positions <= 0 || b->type_vocab <= 0 || b->n_layers > 1024 || b->hidden > 65536 ||
        b->ffn > 1 << 20 || b->max_positions > 1 << 20)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: inconsistent encoder dimensions (layers %d, hidden %d, heads %d, ffn %d, vocab %d)",
                       hm->entry.path, b->n_layers, b->hidden, b->n_heads, b->ffn, b->vocab);
    b->head_dim = b->hidden / b->n_heads;
    return HEARTH_OK;
}

hearth_status bert_load(const hearth_model *hm, bert_model **out, hearth_error *err) {
    *out = NULL;
    bert_model *b = calloc(1, sizeof *b);
    if (!b) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = read_config(hm, b, err);
    size_t max_owned = (size_t)b->n_layers * 16 + 8;
    if (!st && (!(b->layers = calloc((size_t)b->n_layers, sizeof *b->layers)) ||
                !(b->owned = calloc(max_owned, sizeof *b->owned))))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    bert_loader L = {.hm = hm, .b = b, .prefix = "", .err = err};
    if (!st && !model_find_tensor(hm, "embeddings.word_embeddings.weight") &&
        model_find_tensor(hm, "bert.embeddings.word_embeddings.weight"))
        L.prefix = "bert.";
    if (!st && !((st = take(&L, "embeddings.word_embeddings.weight", b->vocab, b->hidden, &b->word)) ||
                 (st = take(&L, "embeddings.position_embeddings.weight", b->max_positions, b->hidden, &b->position)) ||
                 (st = take(&L, "embeddings.token_type_embeddings.weight", b->type_vocab, b->hidden, &b->token_type)) ||
                 (st = take(&L, "embeddings.LayerNorm.weight", b->hidden, 0, &b->emb_ln_w)) ||
                 (st = take(&L, "embeddings.LayerNorm.bias", b->hidden, 0, &b->emb_ln_b))))
        for (int i = 0; i < b->n_layers && !st; i++) st = load_layer(&L, i, &b->layers[i]);
    if (st) {
        bert_free(b);
        return st;
    }
    *out = b;
    return HEARTH_OK;
}

void bert_free(bert_model *b) {
    if (!b) return;
    for (size_t i = 0; i < b->n_owned; i++) free(b->owned[i]);
    free(b->owned);
    free(b->layers);
    free(b);
}

hearth_status bert_scratch_create(const bert_model *b, int max_tokens, int max_len, int n_threads, bert_scratch **out,
                                  hearth_error *err) {
    *out = NULL;
    bert_scratch *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    size_t T = (size_t)max_tokens, H = (size_t)b->hidden;
    size_t sizes[] = {T * H, T * H, T * H, T * H, T * H, T * H, T * b->ffn, (size_t)n_threads * max_len};
    float **ptrs[] = {&s->x, &s->q, &s->k, &s->v, &s->att, &s->tmp, &s->h, &s->attn};
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!(*ptrs[i] = calloc(sizes[i] ? sizes[i] : 1, sizeof(float)))) ok = 0;
    for (int i = 0; i < b->n_layers; i++) {
        const bert_layer *l = &b->layers[i];
        const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->up, &l->down};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) {
            size_t n = cpu_matmul_scratch_size(ws[j], max_tokens);
            if (n > s->mm_size) s->mm_size = n;
        }
    }
    if (ok && s->mm_size && !(s->mm = calloc(1, s->mm_size))) ok = 0;
    s->max_tokens = max_tokens;
    s->max_len = max_len;
    if (!ok) {
        bert_scratch_free(s);
        return err_set(err, HEARTH_ERR_NOMEM, "cannot allocate encoder scratch for %d tokens", max_tokens);
    }
    *out = s;
    return HEARTH_OK;
}

void bert_scratch_free(bert_scratch *s) {
    if (!s) return;
    float *ptrs[] = {s->x, s->q, s->k, s->v, s->att, s->tmp, s->h, s->attn};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    free(s->mm);
    free(s);
}

/* y = x W^T + bias */
static hearth_status linear(bert_scratch *s, const op_weight *w, const float *bias, const float *x, int T, float *y,
                            threadpool *tp, hearth_error *err) {
    hearth_status st = cpu_matmul(w, x, T, y, s->mm, s->mm_size, tp, err);
    if (!st) ops_add_rows(y, bias, T, (int)w->n);
    return st;
}

static hearth_status check_batch(const bert_model *b, const bert_scratch *s, const int32_t *tokens,
                                 const int32_t *seq_start, int n_seqs, hearth_error *err) {
    if (n_seqs <= 0 || seq_start[0] != 0) return err_set(err, HEARTH_ERR_INVALID, "encoder: empty batch");
    for (int i = 0; i < n_seqs; i++) {
        int len = seq_start[i + 1] - seq_start[i];
        if (len <= 0 || len > s->max_len || len > b->max_positions)
            return err_set(err, HEARTH_ERR_INVALID, "encoder: input %d has %d tokens (1..%d allowed)", i, len,
                           s->max_len < b->max_positions ? s->max_len : b->max_positions);
    }
    int T = seq_start[n_seqs];
    if (T > s->max_tokens)
        return err_set(err, HEARTH_ERR_INVALID, "encoder: batch of %d tokens exceeds the scratch (%d)", T,
                       s->max_tokens);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= b->vocab)
            return err_set(err, HEARTH_ERR_INVALID, "token id %d is outside the vocabulary (0..%d)", tokens[t],
                           b->vocab - 1);
    return HEARTH_OK;
}

hearth_status bert_forward(const bert_model *b, bert_scratch *s, const int32_t *tokens, const int32_t *seq_start,
                           int n_seqs, threadpool *tp, const float **hidden, hearth_error *err) {
    hearth_status st = check_batch(b, s, tokens, seq_start, n_seqs, err);
    if (st) return st;
    int T = seq_start[n_seqs], H = b->hidden;
    /* embeddings: word + absolute position (counted within each input) + token type 0 */
    for (int i = 0; i < n_seqs; i++)
        for (int t = seq_start[i]; t < seq_start[i + 1]; t++) {
            float *x = s->x + (size_t)t * H;
            const float *w = b->word + (size_t)tokens[t] * H, *p = b->position + (size_t)(t - seq_start[i]) * H;
            for (int c = 0; c < H; c++) x[c] = w[c] + p[c] + b->token_type[c];
        }
    ops_layernorm(s->x, s->x, b->emb_ln_w, b->emb_ln_b, T, H, b->eps);
    ops_bidir_args a = {.q = s->q,
                        .k = s->k,
                        .v = s->v,
                        .out = s->att,
                        .seq_start = seq_start,
                        .n_seqs = n_seqs,
                        .n_heads = b->n_heads,
                        .head_dim = b->head_dim,
                        .max_len = s->max_len,
                        .scale = 1.0f / sqrtf((float)b->head_dim),
                        .scratch = s->attn};
    size_t n = (size_t)T * H;
    for (int i = 0; i < b->n_layers; i++) {
        const bert_layer *l = &b->layers[i];
        /* self-attention, then post-LN residual */
        if ((st = linear(s, &l->q, l->q_b, s->x, T, s->q, tp, err)) ||
            (st = linear(s, &l->k, l->k_b, s->x, T, s->k, tp, err)) ||
            (st = linear(s, &l->v, l->v_b, s->x, T, s->v, tp, err)))
            return st;
        ops_attention_bidir(&a, tp);
        if ((st = linear(s, &l->o, l->o_b, s->att, T, s->tmp, tp, err))) return st;
        ops_add(s->x, s->tmp, n);
        ops_layernorm(s->x, s->x, l->attn_ln_w, l->attn_ln_b, T, H, b->eps);
        /* feed-forward with erf GELU, then post-LN residual */
        if ((st = linear(s, &l->up, l->up_b, s->x, T, s->h, tp, err))) return st;
        ops_gelu_erf(s->h, (size_t)T * b->ffn);
        if ((st = linear(s, &l->down, l->down_b, s->h, T, s->tmp, tp, err))) return st;
        ops_add(s->x, s->tmp, n);
        ops_layernorm(s->x, s->x, l->out_ln_w, l->out_ln_b, T, H, b->eps);
    }
    *hidden = s->x;
    return HEARTH_OK;
}
