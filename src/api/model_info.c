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

static json_t *quant_json(const hearth_model *m) {
    json_t *hist = json_object();
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const char *dn = tensor_dtype_name(model_tensor_at(m, i)->dtype);
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

/* The parts of a multimodal checkpoint hearth does not load (Gemma 4's vision and audio
 * towers and their projections: mlx-lm's gemma4.py drops the same prefixes), in the order
 * first seen; NULL when there are none. */
static json_t *unloaded_parts(const hearth_model *m) {
    static const char *const parts[] = {"vision_tower", "audio_tower", "multi_modal_projector", "embed_vision",
                                        "embed_audio", "vision_embedder"};
    json_t *out = json_array();
    for (size_t i = 0; out && i < model_tensor_count(m); i++) {
        const char *name = model_tensor_at(m, i)->name;
        if (!strncmp(name, "model.", 6)) name += 6;
        for (size_t j = 0; j < sizeof parts / sizeof parts[0]; j++) {
            size_t n = strlen(parts[j]), k;
            json_t *v;
            int seen = 0;
            if (strncmp(name, parts[j], n) || (name[n] && name[n] != '.')) continue;
            json_array_foreach(out, k, v) seen |= !strcmp(json_string_value(v), parts[j]);
            if (!seen) json_array_append_new(out, json_string(parts[j]));
        }
    }
    if (out && !json_array_size(out)) json_decref(out), out = NULL;
    return out;
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
    json_object_set_new(o, "tensors", json_integer((json_int_t)model_tensor_count(m)));
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
    json_t *unloaded = unloaded_parts(m);
    if (unloaded) json_object_set_new(o, "not_loaded", unloaded); /* the text model runs without them */
    /* a multi-token-prediction head (Qwen3.5's mtp.*, as Hugging Face ships it): --speculate mtp */
    json_object_set_new(o, "mtp_head", json_boolean(model_find_tensor(m, "mtp.fc.weight") != NULL));
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
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        const tensor_info *t = model_tensor_at(m, i);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *o = json_pack("{s:s, s:s, s:o, s:I}", "name", t->name, "dtype", tensor_dtype_name(t->dtype), "shape",
                              shape, "bytes", (json_int_t)t->nbytes);
        int bits, group;
        int64_t cols;
        if (model_mlx_quantized(m, t, &bits, &group, &cols)) {
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
    int quant = model_mlx_quantized(m, t, &bits, &group, &cols);
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
