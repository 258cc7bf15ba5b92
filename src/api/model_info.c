/* model_info.c: what a model is (architecture, sizes, quantization, tokenizer,
 * template) from config.json or GGUF metadata, checked against the tensor shapes;
 * and tensor listing/dequantization for inspection. Computes nothing else. */
#define _GNU_SOURCE
#include "api/model_internal.h"
#include "base/err.h"
#include "base/half.h"
#include "io/ggml_quant.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t cfg_int(const json_t *c, const char *key, int64_t dflt) {
    const json_t *v = json_object_get(c, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static double cfg_num(const json_t *c, const char *key, double dflt) {
    const json_t *v = json_object_get(c, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static const tensor_info *tensor_at(const hearth_model *m, size_t i) {
    return m->entry.format == MODEL_FORMAT_GGUF ? &m->gguf.tensors[i] : m->st.by_name[i];
}
static size_t tensor_count(const hearth_model *m) {
    return m->entry.format == MODEL_FORMAT_GGUF ? m->gguf.n_tensors : m->st.n_tensors;
}

/* For an MLX-quantized weight (uint32 with a .scales sibling) gives bits/group and the
 * logical column count; returns 0 for anything else. */
static int mlx_quantized(const hearth_model *m, const tensor_info *t, int *bits, int *group, int64_t *cols) {
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
        gguf_get_i64(&m->gguf, key, &v_);                                                                    \
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
        mlx_quantized(m, t, &bits, &group, &cols);
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
    for (size_t i = 0; i < tensor_count(m); i++) {
        const char *n = tensor_at(m, i)->name, *p = NULL;
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
    for (size_t i = 0; i < tensor_count(m); i++) {
        const tensor_info *t = tensor_at(m, i);
        int bits, group;
        int64_t cols;
        m->sum.tensor_bytes += t->nbytes;
        if (is_quant_aux(m, t)) continue;
        uint64_t n = tensor_elems(t);
        if (mlx_quantized(m, t, &bits, &group, &cols) && t->shape[t->ndim - 1] > 0)
            n = n / (uint64_t)t->shape[t->ndim - 1] * (uint64_t)cols;
        m->sum.n_params += n;
    }
    if ((st = check_embedding(m, err))) return st;
    return check_layers(m, err);
}

static json_t *quant_json(const hearth_model *m) {
    json_t *hist = json_object();
    for (size_t i = 0; i < tensor_count(m); i++) {
        const char *dn = tensor_dtype_name(tensor_at(m, i)->dtype);
        json_object_set_new(hist, dn, json_integer(json_integer_value(json_object_get(hist, dn)) + 1));
    }
    if (m->entry.format == MODEL_FORMAT_GGUF) {
        int64_t ft = -1;
        gguf_get_i64(&m->gguf, "general.file_type", &ft);
        return json_pack("{s:s, s:I, s:o}", "format", "gguf", "file_type", (json_int_t)ft, "tensor_types", hist);
    }
    if (m->quant.present)
        return json_pack("{s:s, s:s, s:i, s:i, s:I, s:o}", "format", "mlx", "mode",
                         m->quant.mode ? m->quant.mode : "affine", "bits", m->quant.bits, "group_size",
                         m->quant.group_size, "overrides", (json_int_t)m->quant.n_overrides, "tensor_types", hist);
    return json_pack("{s:s, s:o}", "format", "none", "tensor_types", hist);
}

char *hearth_model_info_json(const hearth_model *m) {
    const model_summary *s = &m->sum;
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(m->entry.name));
    json_object_set_new(o, "path", json_string(m->entry.path));
    json_object_set_new(o, "format", json_string(m->entry.format == MODEL_FORMAT_GGUF ? "gguf" : "safetensors"));
    json_object_set_new(o, "architecture", json_string(s->architecture));
    json_object_set_new(o, "parameters", json_integer((json_int_t)s->n_params));
    json_object_set_new(o, "tensor_bytes", json_integer((json_int_t)s->tensor_bytes));
    json_object_set_new(o, "tensors", json_integer((json_int_t)tensor_count(m)));
    json_object_set_new(o, "hidden_size", json_integer(s->hidden_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(s->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(s->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(s->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(s->head_dim));
    json_object_set_new(o, "intermediate_size", json_integer(s->intermediate_size));
    json_object_set_new(o, "vocab_size", json_integer(s->vocab_size));
    json_object_set_new(o, "context_length", json_integer(s->context_length));
    json_object_set_new(o, "rope_theta", json_real(s->rope_theta));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(s->tie_word_embeddings));
    json_object_set_new(o, "quantization", quant_json(m));
    json_t *tok = json_object();
    if (m->tok) {
        json_object_set_new(tok, "kind", json_string(tok_kind(m->tok)));
        json_object_set_new(tok, "vocab_size", json_integer(tok_vocab_size(m->tok)));
        json_object_set_new(tok, "bos_token", m->bos_token ? json_string(m->bos_token) : json_null());
        json_object_set_new(tok, "eos_token", m->eos_token ? json_string(m->eos_token) : json_null());
    } else {
        json_object_set_new(tok, "error", json_string(m->tok_error));
    }
    json_object_set_new(o, "tokenizer", tok);
    json_t *tpl = json_object();
    json_object_set_new(tpl, "present", json_boolean(m->chat_template != NULL));
    json_object_set_new(tpl, "source", m->chat_template_source ? json_string(m->chat_template_source) : json_null());
    json_object_set_new(tpl, "length", json_integer(m->chat_template ? (json_int_t)strlen(m->chat_template) : 0));
    json_object_set_new(tpl, "tool_use_variant", json_boolean(m->chat_template_tool_use != NULL));
    json_object_set_new(o, "chat_template", tpl);
    char *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return out;
}

char *hearth_model_tensors_json(const hearth_model *m) {
    json_t *arr = json_array();
    for (size_t i = 0; i < tensor_count(m); i++) {
        const tensor_info *t = tensor_at(m, i);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *o = json_pack("{s:s, s:s, s:o, s:I}", "name", t->name, "dtype", tensor_dtype_name(t->dtype), "shape",
                              shape, "bytes", (json_int_t)t->nbytes);
        int bits, group;
        int64_t cols;
        if (mlx_quantized(m, t, &bits, &group, &cols)) {
            json_t *ls = json_deep_copy(shape);
            json_array_set_new(ls, (size_t)t->ndim - 1, json_integer(cols));
            json_object_set_new(o, "bits", json_integer(bits));
            json_object_set_new(o, "group_size", json_integer(group));
            json_object_set_new(o, "logical_shape", ls);
        }
        json_array_append_new(arr, o);
    }
    char *s = json_dumps(arr, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(arr);
    return s;
}

static hearth_status plain_to_f32(const tensor_info *t, float *out, uint64_t n, hearth_error *err) {
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case DT_F32: { float v; memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
        case DT_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = f16_to_f32(v); break; }
        case DT_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = bf16_to_f32(v); break; }
        case DT_F64: { double v; memcpy(&v, p + 8 * i, 8); out[i] = (float)v; break; }
        case DT_I8: out[i] = (int8_t)p[i]; break;
        case DT_U8: case DT_BOOL: out[i] = p[i]; break;
        case DT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); out[i] = v; break; }
        case DT_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = v; break; }
        case DT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (float)v; break; }
        case DT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (float)v; break; }
        case DT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (float)v; break; }
        case DT_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (float)v; break; }
        default: return err_set(err, HEARTH_ERR_UNSUPPORTED, "tensor '%s': dtype %s", t->name, tensor_dtype_name(t->dtype));
        }
    }
    return HEARTH_OK;
}

hearth_status hearth_model_tensor_f32(const hearth_model *m, const char *name, float **data, size_t *n_elems,
                                      hearth_error *err) {
    *data = NULL;
    *n_elems = 0;
    const tensor_info *t = model_find_tensor(m, name);
    if (!t) return err_set(err, HEARTH_ERR_NOT_FOUND, "%s: no tensor named '%s'", m->entry.path, name);
    int bits, group;
    int64_t cols;
    int quant = mlx_quantized(m, t, &bits, &group, &cols);
    uint64_t n = tensor_elems(t);
    if (quant && t->shape[t->ndim - 1] > 0) n = n / (uint64_t)t->shape[t->ndim - 1] * (uint64_t)cols;
    if (n > (1ULL << 34)) return err_set(err, HEARTH_ERR_INVALID, "tensor '%s' is too large to dump", name);
    float *out = malloc((n ? n : 1) * sizeof *out);
    if (!out) return err_set(err, HEARTH_ERR_NOMEM, "out of memory for tensor '%s'", name);
    hearth_status st;
    if (quant) {
        size_t len = strlen(name);
        char sname[600], bname[600];
        snprintf(sname, sizeof sname, "%.*s.scales", (int)(len - 7), name);
        snprintf(bname, sizeof bname, "%.*s.biases", (int)(len - 7), name);
        st = mlxq_dequantize(t, st_set_find(&m->st, sname), st_set_find(&m->st, bname), bits, group, out, n, err);
    } else if (tensor_dtype_block_elems(t->dtype) > 1) {
        st = ggml_dequantize(t->dtype, t->data, t->nbytes, out, n, err);
    } else {
        st = plain_to_f32(t, out, n, err);
    }
    if (st) { free(out); return st; }
    *data = out;
    *n_elems = n;
    return HEARTH_OK;
}
