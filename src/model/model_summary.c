/* model_summary.c: what opening a model learns before loading a weight: the summary
 * (architecture, sizes, parameter count, tensor bytes) from config.json or GGUF metadata,
 * the embedding and layer tensors checked against it, and tensor lookup by name in
 * whichever format the model has. Reads metadata only. */
#include "model/model_handle.h"
#include "base/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const tensor_info *model_find_tensor(const hearth_model *m, const char *name) {
    return m->entry.format == MODEL_FORMAT_GGUF ? gguf_find_tensor(&m->gguf, name) : st_set_find(&m->st, name);
}

static int64_t cfg_int(const json_t *c, const char *key, int64_t dflt) {
    const json_t *v = json_object_get(c, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static double cfg_num(const json_t *c, const char *key, double dflt) {
    const json_t *v = json_object_get(c, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

const tensor_info *model_tensor_at(const hearth_model *m, size_t i) {
    return m->entry.format == MODEL_FORMAT_GGUF ? &m->gguf.tensors[i] : m->st.by_name[i];
}
size_t model_tensor_count(const hearth_model *m) {
    return m->entry.format == MODEL_FORMAT_GGUF ? m->gguf.n_tensors : m->st.n_tensors;
}

int model_mlx_quantized(const hearth_model *m, const tensor_info *t, int *bits, int *group, int64_t *cols) {
    size_t n = strlen(t->name);
    if (m->entry.format != MODEL_FORMAT_DIR || !m->quant.present || t->dtype != DT_U32 || t->ndim < 1 || n < 7 ||
        strcmp(t->name + n - 7, ".weight"))
        return 0;
    char module[512], sib[600];
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), t->name);
    snprintf(sib, sizeof sib, "%s.scales", module);
    if (!st_set_find(&m->st, sib) || !mlxq_lookup(&m->quant, module, bits, group) || *bits <= 0) return 0;
    *cols = t->shape[t->ndim - 1] * 32 / *bits;
    return 1;
}

static int is_quant_aux(const hearth_model *m, const tensor_info *t) {
    size_t n = strlen(t->name);
    if (m->entry.format != MODEL_FORMAT_DIR || !m->quant.present) return 0;
    return (n > 7 && !strcmp(t->name + n - 7, ".scales")) || (n > 7 && !strcmp(t->name + n - 7, ".biases"));
}

static hearth_status summarize_dir(hearth_model *m, hearth_error *err) {
    model_summary *s = &m->sum;
    const json_t *c = m->config, *text = json_object_get(c, "text_config");
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    snprintf(s->architecture, sizeof s->architecture, "%s", mt ? mt : "unknown");
    if (json_is_object(text)) c = text; /* multimodal wrappers keep the LM dims here */
    s->hidden_size = cfg_int(c, "hidden_size", 0);
    s->n_layers = cfg_int(c, "num_hidden_layers", 0);
    s->n_heads = cfg_int(c, "num_attention_heads", 0);
    s->n_kv_heads = cfg_int(c, "num_key_value_heads", s->n_heads);
    s->head_dim = cfg_int(c, "head_dim", s->n_heads > 0 ? s->hidden_size / s->n_heads : 0);
    s->intermediate_size = cfg_int(c, "intermediate_size", 0);
    s->vocab_size = cfg_int(c, "vocab_size", 0);
    s->context_length = cfg_int(c, "max_position_embeddings", 0);
    s->rope_theta = cfg_num(c, "rope_theta", 10000.0);
    const char *req[] = {"hidden_size", "num_hidden_layers", "vocab_size"};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        const json_t *v = json_object_get(c, req[i]);
        if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1LL << 31))
            return err_set(err, HEARTH_ERR_FORMAT, "%s/config.json: '%s' is missing or not a positive integer",
                           m->entry.path, req[i]);
    }
    const json_t *tie = json_object_get(c, "tie_word_embeddings");
    s->tie_word_embeddings = json_is_boolean(tie) ? json_is_true(tie) : !st_set_find(&m->st, "lm_head.weight");
    return HEARTH_OK;
}

/* The largest element of a numeric array key (Gemma 4 writes KV heads and FFN widths one
 * per layer), else dflt. */
static int64_t arr_max(const gguf_kv *kv, int64_t dflt) {
    if (!kv || kv->type != GGUF_ARRAY || kv->v.arr.type == GGUF_STRING || kv->v.arr.type == GGUF_ARRAY || !kv->v.arr.n)
        return dflt;
    int64_t best = gguf_arr_i64(kv, 0);
    for (uint64_t i = 1; i < kv->v.arr.n; i++)
        if (gguf_arr_i64(kv, i) > best) best = gguf_arr_i64(kv, i);
    return best;
}

static hearth_status summarize_gguf(hearth_model *m, hearth_error *err) {
    model_summary *s = &m->sum;
    char *arch = gguf_get_str(&m->gguf, "general.architecture");
    if (!arch) return err_set(err, HEARTH_ERR_FORMAT, "%s: missing general.architecture", m->entry.path);
    snprintf(s->architecture, sizeof s->architecture, "%s", arch);
    char key[160];
#define ARCH_INT(field, suffix, dflt)                                                                        \
    do {                                                                                                     \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);                                                    \
        int64_t v_ = (dflt);                                                                                 \
        if (!gguf_get_i64(&m->gguf, key, &v_)) v_ = arr_max(gguf_find(&m->gguf, key), v_);                  \
        s->field = v_;                                                                                       \
    } while (0)
    ARCH_INT(n_layers, "block_count", 0);
    ARCH_INT(hidden_size, "embedding_length", 0);
    ARCH_INT(n_heads, "attention.head_count", 0);
    ARCH_INT(n_kv_heads, "attention.head_count_kv", s->n_heads);
    ARCH_INT(head_dim, "attention.key_length", s->n_heads > 0 ? s->hidden_size / s->n_heads : 0);
    ARCH_INT(intermediate_size, "feed_forward_length", 0);
    ARCH_INT(context_length, "context_length", 0);
#undef ARCH_INT
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    s->rope_theta = 10000.0;
    gguf_get_f64(&m->gguf, key, &s->rope_theta);
    free(arch);
    const gguf_kv *toks = gguf_find(&m->gguf, "tokenizer.ggml.tokens");
    s->vocab_size = toks && toks->type == GGUF_ARRAY ? (int64_t)toks->v.arr.n : 0;
    s->tie_word_embeddings = !gguf_find_tensor(&m->gguf, "output.weight");
    if (s->hidden_size <= 0 || s->n_layers <= 0)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: missing %s.embedding_length or block_count", m->entry.path,
                       s->architecture);
    return HEARTH_OK;
}

/* The token embedding must be [vocab_size, hidden_size] as the config says. */
static hearth_status check_embedding(hearth_model *m, hearth_error *err) {
    static const char *names[] = {"model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                                  "model.language_model.embed_tokens.weight", "embeddings.word_embeddings.weight",
                                  "token_embd.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const tensor_info *t = model_find_tensor(m, names[i]);
        if (!t) continue;
        int bits, group;
        int64_t cols = t->ndim == 2 ? t->shape[1] : -1;
        model_mlx_quantized(m, t, &bits, &group, &cols);
        int64_t rows = t->ndim == 2 ? t->shape[0] : -1;
        int vocab_ok = m->entry.format == MODEL_FORMAT_GGUF && m->sum.vocab_size == 0 ? 1 : rows == m->sum.vocab_size;
        if (t->ndim != 2 || !vocab_ok || cols != m->sum.hidden_size)
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: tensor '%s' shape [%lld,%lld] does not match the config (vocab_size %lld x "
                           "hidden_size %lld)",
                           t->file ? t->file : m->entry.path, t->name, (long long)rows, (long long)cols,
                           (long long)m->sum.vocab_size, (long long)m->sum.hidden_size);
        return HEARTH_OK;
    }
    return HEARTH_OK;
}

/* Layers present in tensor names ("model.layers.N." or "blk.N.") must match the config. */
static hearth_status check_layers(hearth_model *m, hearth_error *err) {
    long max_layer = -1;
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const char *n = model_tensor_at(m, i)->name, *p = NULL;
        if (!strncmp(n, "model.layers.", 13)) p = n + 13;
        else if (!strncmp(n, "blk.", 4)) p = n + 4;
        else if ((p = strstr(n, ".layers.")) || (p = strstr(n, ".layer."))) p = strchr(p + 1, '.') + 1;
        if (!p || *p < '0' || *p > '9') continue;
        long k = strtol(p, NULL, 10);
        if (k > max_layer && k < (1L << 30)) max_layer = k;
    }
    if (max_layer >= 0 && max_layer + 1 != m->sum.n_layers)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: the config says %lld layers but the tensors hold %ld",
                       m->entry.path, (long long)m->sum.n_layers, max_layer + 1);
    return HEARTH_OK;
}

hearth_status model_summarize(hearth_model *m, hearth_error *err) {
    hearth_status st = m->entry.format == MODEL_FORMAT_GGUF ? summarize_gguf(m, err) : summarize_dir(m, err);
    if (st) return st;
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const tensor_info *t = model_tensor_at(m, i);
        int bits, group;
        int64_t cols;
        m->sum.tensor_bytes += t->nbytes;
        if (is_quant_aux(m, t)) continue;
        uint64_t n = tensor_elems(t);
        if (model_mlx_quantized(m, t, &bits, &group, &cols) && t->shape[t->ndim - 1] > 0)
            n = n / (uint64_t)t->shape[t->ndim - 1] * (uint64_t)cols;
        m->sum.n_params += n;
    }
    if ((st = check_embedding(m, err))) return st;
    return check_layers(m, err);
}

