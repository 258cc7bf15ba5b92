/* config.c: the decoder configuration of a model, from config.json (HF/MLX) or GGUF
 * metadata, with mlx-lm's defaults where a key is absent, and the RoPE inverse
 * frequencies (plain, llama3-scaled, linear-scaled, longrope, or GGUF rope_freqs factors). */
#define _GNU_SOURCE
#include "model/model_handle.h"
#include "base/err.h"
#include "base/half.h"
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUPPORTED                                                                                                      \
    "supported: llama (Llama 2/3.x, SmolLM2), qwen3, qwen3_moe, qwen3_5, gemma3_text, gemma4_text, minicpm (GGUF: "    \
    "llama, qwen3, gemma3, gemma4, qwen3moe, qwen35, qwen35moe)"

static double num(const json_t *o, const char *k, double dflt) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* An integer key: `absent` when the key is missing, `other` when it is there but not a
 * number (null), -1 when outside int's range (every caller rejects negatives), so a
 * config's 1e300 is an error, not undefined behaviour. */
static int int_key_or(const json_t *o, const char *k, int absent, int other) {
    const json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) return v ? other : absent;
    double x = json_number_value(v);
    return x >= -1e9 && x <= 1e9 ? (int)x : -1;
}

static int int_key(const json_t *o, const char *k, int dflt) { return int_key_or(o, k, dflt, dflt); }

/* inv_freq[i] = base^(-2i/dims), then the model's scaling rule. */
static float *rope_inv_freq(int head_dim, double base, const json_t *scaling) {
    int half = head_dim / 2;
    if (head_dim <= 0 || head_dim > (1 << 16)) return NULL; /* model_config_read names the bad head_dim */
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return NULL;
    const char *type = json_string_value(json_object_get(scaling, "rope_type"));
    if (!type) type = json_string_value(json_object_get(scaling, "type"));
    double factor = num(scaling, "factor", 1.0);
    for (int i = 0; i < half; i++) {
        double period = pow(base, (2.0 * i) / head_dim); /* mlx-lm's "freqs" */
        if (type && !strcmp(type, "llama3")) {
            double lo = num(scaling, "low_freq_factor", 1.0), hi = num(scaling, "high_freq_factor", 4.0);
            double old_ctx = num(scaling, "original_max_position_embeddings", 8192);
            double wavelen = 2 * M_PI * period, lo_wl = old_ctx / lo, hi_wl = old_ctx / hi;
            if (wavelen > lo_wl) period *= factor;
            else if (wavelen > hi_wl) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                period = period / ((1 - smooth) / factor + smooth);
            }
        } else if (type && !strcmp(type, "linear")) {
            period *= factor;
        } else if (type && !strcmp(type, "longrope")) { /* mlx-lm SuScaledRoPE: long_factor, always */
            const json_t *lf = json_object_get(scaling, "long_factor");
            period *= json_is_number(lf) ? json_number_value(lf) : json_number_value(json_array_get(lf, i));
        }
        f[i] = (float)(1.0 / period);
    }
    return f;
}

/* LongRoPE (MiniCPM4's "longrope" rope_scaling) as mlx-lm's SuScaledRoPE applies it: the
 * frequencies divided by long_factor (a number or one per frequency) at every length, and
 * q and k multiplied by sqrt(1 + ln(f) / ln(original)), f = max_position_embeddings /
 * original_max_position_embeddings when above 1. Both multiply one dot product, so the
 * attention scale takes the square. */
static hearth_status longrope_check(const hearth_model *hm, const json_t *scaling, int head_dim, double max_pos,
                                    double *qk_scale, hearth_error *err) {
    const json_t *lf = json_object_get(scaling, "long_factor");
    double orig = num(scaling, "original_max_position_embeddings", 0);
    if (!json_is_number(lf) && !(json_is_array(lf) && json_array_size(lf) == (size_t)head_dim / 2))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: longrope needs long_factor, a number or %d numbers (head_dim / 2)",
                       hm->entry.path, head_dim / 2);
    for (size_t i = 0; json_is_array(lf) && i < json_array_size(lf); i++)
        if (!(json_number_value(json_array_get(lf, i)) > 0))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: longrope long_factor[%zu] is not a positive number",
                           hm->entry.path, i);
    if (json_is_number(lf) && !(json_number_value(lf) > 0))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: longrope long_factor is not positive", hm->entry.path);
    if (!(orig > 1) || !(max_pos > 0))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: longrope needs max_position_embeddings and original_max_position_embeddings > 1",
                       hm->entry.path);
    double f = max_pos / orig;
    *qk_scale = f <= 1.0 ? 1.0 : sqrt(1.0 + log(f) / log(orig));
    return HEARTH_OK;
}

/* MiniCPM (mlx-lm models/minicpm.py): embeddings times scale_emb, each block's attention
 * and MLP outputs times scale_depth / sqrt(layers) before they join the residual, and (when
 * lm_head is not tied by the config) the normed rows divided by hidden / dim_model_base
 * before lm_head. Python computes these constants in double; mlx applies them as float32. */
static hearth_status read_minicpm(const hearth_model *hm, const json_t *cfg, model_config *c, hearth_error *err) {
    const char *keys[] = {"scale_emb", "scale_depth", "dim_model_base"};
    for (int i = 0; i < 3; i++)
        if (!json_is_number(json_object_get(cfg, keys[i])))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: minicpm needs a number '%s'", hm->entry.path,
                           keys[i]);
    double base = num(cfg, "dim_model_base", 0);
    if (base <= 0) return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: dim_model_base must be positive", hm->entry.path);
    c->embed_scale = (float)num(cfg, "scale_emb", 1);
    c->residual_scale = (float)(num(cfg, "scale_depth", 1) / sqrt((double)c->n_layers));
    c->logits_div = json_is_true(json_object_get(cfg, "tie_word_embeddings")) ? 1.0f : (float)((double)c->hidden / base);
    return HEARTH_OK;
}

/* Qwen3-MoE (mlx-lm models/qwen3_moe.py): which layers are MoE (every decoder_sparse_step-th,
 * not in mlp_only_layers: model_layer_is_moe), the experts and how many a token takes. */
static hearth_status read_qwen3_moe(const hearth_model *hm, const json_t *cfg, model_config *c, hearth_error *err) {
    c->n_experts = int_key(cfg, "num_experts", 0);
    c->top_k_experts = int_key(cfg, "num_experts_per_tok", 0);
    c->moe_ffn = int_key(cfg, "moe_intermediate_size", 0);
    c->norm_topk = json_is_true(json_object_get(cfg, "norm_topk_prob"));
    if (c->n_experts <= 0 || c->n_experts > 4096 || c->top_k_experts <= 0 || c->top_k_experts > c->n_experts ||
        c->moe_ffn <= 0)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: qwen3_moe needs num_experts (1..4096), num_experts_per_tok (1..num_experts) "
                       "and moe_intermediate_size (got %d, %d, %d)",
                       hm->entry.path, c->n_experts, c->top_k_experts, c->moe_ffn);
    return HEARTH_OK;
}

/* ---- qwen3_5 (mlx-lm models/qwen3_5.py): hybrid Gated DeltaNet + gated attention ---- */
/* The Gated DeltaNet geometry, which layers are full attention (every full_attention_interval-th;
 * layer_types, when given, must say the same), partial RoPE (rope_parameters) and the
 * doubled, gated q projection. Defaults are mlx-lm's TextModelArgs'. */
static hearth_status read_qwen3_5(const hearth_model *hm, const json_t *cfg, model_config *c, hearth_error *err) {
    const char *need[] = {"linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                          "linear_value_head_dim"};
    for (int i = 0; i < 4; i++)
        if (!json_is_number(json_object_get(cfg, need[i])))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: qwen3_5 needs a number '%s'", hm->entry.path,
                           need[i]);
    c->gdn_v_heads = int_key(cfg, "linear_num_value_heads", 0);
    c->gdn_k_heads = int_key(cfg, "linear_num_key_heads", 0);
    c->gdn_k_dim = int_key(cfg, "linear_key_head_dim", 0);
    c->gdn_v_dim = int_key(cfg, "linear_value_head_dim", 0);
    c->gdn_conv = int_key(cfg, "linear_conv_kernel_dim", 4);
    c->full_interval = int_key(cfg, "full_attention_interval", 4);
    if (c->gdn_v_heads <= 0 || c->gdn_k_heads <= 0 || c->gdn_v_heads % c->gdn_k_heads || c->gdn_k_dim <= 0 ||
        c->gdn_v_dim <= 0 || c->gdn_k_dim > 4096 || c->gdn_v_dim > 4096 || c->gdn_v_heads > 4096 || c->gdn_conv < 1 ||
        c->gdn_conv > 64 || c->full_interval < 1)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: qwen3_5 linear attention is inconsistent (value heads %d, key heads %d "
                       "(must divide the value heads), key dim %d, value dim %d, conv width %d, "
                       "full_attention_interval %d)",
                       hm->entry.path, c->gdn_v_heads, c->gdn_k_heads, c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv,
                       c->full_interval);
    const json_t *types = json_object_get(cfg, "layer_types");
    if (types && (!json_is_array(types) || (int)json_array_size(types) != c->n_layers))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: layer_types must list %d layer types",
                       hm->entry.path, c->n_layers);
    c->n_state_layers = 0;
    for (int i = 0; i < c->n_layers; i++) {
        int linear = (i + 1) % c->full_interval != 0;
        c->n_state_layers += linear;
        const char *t = types ? json_string_value(json_array_get(types, (size_t)i)) : NULL;
        if (types && (!t || strcmp(t, linear ? "linear_attention" : "full_attention")))
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: config.json: layer_types[%d] is '%s' but full_attention_interval %d makes it %s",
                           hm->entry.path, i, t ? t : "?", c->full_interval,
                           linear ? "linear_attention" : "full_attention");
    }
    if (json_is_true(json_object_get(cfg, "attention_bias")))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: config.json: qwen3_5 with attention_bias is not supported",
                       hm->entry.path);
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    const char *rtype = json_string_value(json_object_get(rp, "type"));
    if (!rtype) rtype = json_string_value(json_object_get(rp, "rope_type"));
    if (rtype && strcmp(rtype, "default") && strcmp(rtype, "linear"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: config.json: qwen3_5 RoPE type '%s' is not supported (default, linear are)",
                       hm->entry.path, rtype);
    double factor = json_is_object(rp) ? num(rp, "partial_rotary_factor", 0.25) : 0.25;
    c->rope_dims = factor > 0 && factor <= 1 ? (int)(c->head_dim * factor) : 0;
    if (c->rope_dims <= 0 || c->rope_dims % 2 || c->rope_dims > c->head_dim)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: partial_rotary_factor %g gives %d RoPE dims of %d",
                       hm->entry.path, factor, c->rope_dims, c->head_dim);
    free(c->inv_freq_global);
    c->inv_freq_global = rope_inv_freq(c->rope_dims, json_is_object(rp) ? num(rp, "rope_theta", 100000.0) : 100000.0,
                                       json_is_object(rp) ? rp : NULL);
    c->attn_gate = 1;
    /* multi-token prediction: the checkpoint's mtp.* layers (Hugging Face's; mlx-lm drops them) */
    c->mtp_layers = int_key(cfg, "mtp_num_hidden_layers", 0);
    if (num(cfg, "num_experts", 0) <= 0) return HEARTH_OK;
    /* qwen3_5_moe: every layer's MLP is routed experts (mlx-lm's defaults: norm_topk_prob true)
     * plus a shared expert */
    hearth_status st = read_qwen3_moe(hm, cfg, c, err);
    if (st) return st;
    const json_t *nt = json_object_get(cfg, "norm_topk_prob");
    c->norm_topk = nt ? json_is_true(nt) : 1;
    c->shared_ffn = int_key(cfg, "shared_expert_intermediate_size", 0);
    if (c->shared_ffn <= 0)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: qwen3_5_moe needs a positive "
                       "'shared_expert_intermediate_size'", hm->entry.path);
    return HEARTH_OK;
}
/* ---- end qwen3_5 ---- */

/* ---- Gemma 4 (mlx-lm models/gemma4_text.py): everything below up to read_dir_config. */

/* A Gemma 4 layer type's RoPE: "default" rotates all head_dim dims with base^(-2i/dims);
 * "proportional" rotates the first partial_rotary_factor of them with 1 / (factor *
 * base^(2i/dims)) (exponents over the whole head_dim) and leaves the rest (inverse
 * frequency 0: cos 1, sin 0). */
static hearth_status gemma4_rope(const hearth_model *hm, const json_t *rp, const char *kind, int head_dim, float **out,
                                 hearth_error *err) {
    const char *type = json_string_value(json_object_get(rp, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rp, "type"));
    if (!type) type = "default";
    double base = num(rp, "rope_theta", 10000.0), factor = num(rp, "factor", 1.0);
    int proportional = !strcmp(type, "proportional");
    if (!proportional && strcmp(type, "default"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: config.json: rope_parameters.%s: RoPE type '%s' is not supported (default, proportional are)",
                       hm->entry.path, kind, type);
    double partial = num(rp, "partial_rotary_factor", 1.0);
    if (!(partial >= 0.0 && partial <= 1.0) || !(factor > 0.0))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: rope_parameters.%s: partial_rotary_factor %g (0..1) or factor %g (> 0) out of range",
                       hm->entry.path, kind, partial, factor);
    int half = head_dim / 2, rotated = proportional ? (int)(head_dim * partial) / 2 : half;
    float *f = *out = malloc((size_t)half * sizeof *f);
    if (!f) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int i = 0; i < half; i++)
        f[i] = i < rotated ? (float)(1.0 / ((proportional ? factor : 1.0) * pow(base, (2.0 * i) / head_dim))) : 0.0f;
    return HEARTH_OK;
}

/* A number of the config; absent: mlx-lm's default (ModelArgs); null: 0, which mlx-lm reads as
 * "none" where it tests the value (global_head_dim, hidden_size_per_layer_input). */
static int gemma4_int(const json_t *cfg, const char *key, int dflt) { return int_key_or(cfg, key, dflt, 0); }

static hearth_status gemma4_kv_map(const hearth_model *hm, model_config *c, int shared, const char *source,
                                   hearth_error *err);

/* The per-layer tables of model_config (freed by model_free); 0: out of memory. */
static int gemma4_alloc_layers(model_config *c) {
    size_t L = (size_t)c->n_layers;
    c->layer_full = calloc(L, 1);
    c->layer_kv = calloc(L, sizeof *c->layer_kv);
    c->kv_heads = calloc(L, sizeof *c->kv_heads);
    c->kv_dims = calloc(L, sizeof *c->kv_dims);
    return c->layer_full && c->layer_kv && c->kv_heads && c->kv_dims;
}

/* Which layers are full attention (layer_types, else every sliding_window_pattern-th), which
 * KV layer each reads (the last layer of its type before first_shared, for the shared ones),
 * and the pool's shape per KV layer. */
static hearth_status gemma4_layers_read(const hearth_model *hm, const json_t *cfg, model_config *c, hearth_error *err) {
    int L = c->n_layers, pattern = gemma4_int(cfg, "sliding_window_pattern", 5);
    const json_t *types = json_object_get(cfg, "layer_types");
    if (!gemma4_alloc_layers(c)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (json_is_array(types) && json_array_size(types) != (size_t)L)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: layer_types lists %zu layers, num_hidden_layers is %d",
                       hm->entry.path, json_array_size(types), L);
    for (int i = 0; i < L; i++) {
        const char *t = json_is_array(types) ? json_string_value(json_array_get(types, (size_t)i)) : NULL;
        if (json_is_array(types) && (!t || (strcmp(t, "full_attention") && strcmp(t, "sliding_attention"))))
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: config.json: layer_types[%d] is '%s' (full_attention or sliding_attention expected)",
                           hm->entry.path, i, t ? t : "?");
        c->layer_full[i] = t ? !strcmp(t, "full_attention") : pattern > 0 && (i % pattern) == pattern - 1;
    }
    int shared = gemma4_int(cfg, "num_kv_shared_layers", 20);
    if (shared < 0 || shared >= L)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: num_kv_shared_layers %d must be in 0..%d",
                       hm->entry.path, shared, L - 1);
    return gemma4_kv_map(hm, c, shared, "config.json", err);
}

/* From layer_full and the number of KV-shared layers: which KV layer each layer stores
 * into or reads (a shared one: the last layer of its type before first_shared, mlx-lm's
 * rule), and the pool's shape per KV layer. `source` names the file part for errors. */
static hearth_status gemma4_kv_map(const hearth_model *hm, model_config *c, int shared, const char *source,
                                   hearth_error *err) {
    int L = c->n_layers;
    c->first_shared = c->n_kv_layers = L - shared;
    for (int i = 0; i < L; i++) {
        int full = c->layer_full[i];
        if (i < c->first_shared) {
            c->layer_kv[i] = i;
            c->kv_heads[i] = full ? c->full_kv_heads : c->swa_kv_heads;
            c->kv_dims[i] = full ? c->full_head_dim : c->swa_head_dim;
            continue;
        }
        c->layer_kv[i] = -1;
        for (int j = c->first_shared - 1; j >= 0 && c->layer_kv[i] < 0; j--)
            if (c->layer_full[j] == full) c->layer_kv[i] = j;
        if (c->layer_kv[i] < 0)
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: %s: layer %d (%s attention) shares KV, but no layer before %d has that type",
                           hm->entry.path, source, i, full ? "full" : "sliding", c->first_shared);
    }
    return HEARTH_OK;
}

static hearth_status read_gemma4(const hearth_model *hm, const json_t *cfg, model_config *c, hearth_error *err) {
    const char *path = hm->entry.path;
    if (json_is_true(json_object_get(cfg, "enable_moe_block"))) { /* every layer: dense MLP + experts */
        c->n_experts = gemma4_int(cfg, "num_experts", 0);
        c->top_k_experts = gemma4_int(cfg, "top_k_experts", 0);
        c->moe_ffn = gemma4_int(cfg, "moe_intermediate_size", 0);
        if (c->n_experts <= 0 || c->n_experts > 4096 || c->top_k_experts <= 0 || c->top_k_experts > c->n_experts ||
            c->moe_ffn <= 0)
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: config.json: enable_moe_block needs num_experts (1..4096), top_k_experts "
                           "(1..num_experts) and moe_intermediate_size (got %d, %d, %d)",
                           path, c->n_experts, c->top_k_experts, c->moe_ffn);
    }
    c->norm_shift = 0.0f; /* plain RMSNorm weights (nn.RMSNorm), not Gemma 3's (1 + w) */
    c->attn_scale = 1.0f; /* q and k are RMS-normed; the reference's softmax scale is 1 */
    c->embed_scale = (float)sqrt((double)c->hidden);
    c->sliding_window = gemma4_int(cfg, "sliding_window", 512);
    c->sliding_pattern = 0; /* layer_full says */
    const json_t *cap = json_object_get(cfg, "final_logit_softcapping");
    c->softcap = json_is_null(cap) ? 0.0f : (float)num(cfg, "final_logit_softcapping", 30.0);
    if (!json_is_number(json_object_get(cfg, "head_dim"))) c->head_dim = 256; /* ModelArgs' default */
    c->swa_head_dim = c->head_dim;
    c->swa_kv_heads = c->n_kv_heads;
    c->full_head_dim = gemma4_int(cfg, "global_head_dim", 512);
    if (c->full_head_dim <= 0) c->full_head_dim = c->head_dim; /* mlx-lm: a 0 / null global_head_dim is head_dim */
    c->k_eq_v = json_is_true(json_object_get(cfg, "attention_k_eq_v"));
    int global_kv = gemma4_int(cfg, "num_global_key_value_heads", 0); /* absent or null: num_key_value_heads */
    c->full_kv_heads = c->k_eq_v && global_kv ? global_kv : c->n_kv_heads;
    c->swa_ffn = c->ffn;
    const json_t *dw = json_object_get(cfg, "use_double_wide_mlp");
    c->double_wide = dw ? json_is_true(dw) : 1;
    c->per_layer_dim = gemma4_int(cfg, "hidden_size_per_layer_input", 256);
    c->per_layer_vocab = gemma4_int(cfg, "vocab_size_per_layer_input", 262144);
    if (c->full_head_dim % 2 || c->full_kv_heads <= 0 || c->n_heads % c->full_kv_heads || c->per_layer_dim < 0 ||
        (c->per_layer_dim && c->per_layer_vocab <= 0) || c->sliding_window <= 0)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: inconsistent gemma4_text sizes (global_head_dim %d, num_global_key_value_heads "
                       "%d for %d heads, hidden_size_per_layer_input %d, vocab_size_per_layer_input %d, sliding_window %d)",
                       path, c->full_head_dim, c->full_kv_heads, c->n_heads, c->per_layer_dim, c->per_layer_vocab,
                       c->sliding_window);
    hearth_status st = gemma4_layers_read(hm, cfg, c, err);
    if (st) return st;
    if (c->double_wide && c->first_shared < c->n_layers && c->first_shared > 0) {
        if (c->ffn <= 0 || c->ffn > (1 << 28)) /* doubled below: kept far from int's range */
            return err_set(err, HEARTH_ERR_FORMAT, "%s: config.json: intermediate_size %d is out of range", path, c->ffn);
        c->ffn *= 2;
    }
    /* RoPE per layer type; rope_parameters absent: mlx-lm's defaults */
    const json_t *rp = json_object_get(cfg, "rope_parameters");
    json_t *dflt = NULL;
    if (!json_is_object(rp))
        rp = dflt = json_pack("{s:{s:f, s:f, s:s}, s:{s:f, s:f, s:s}}", "full_attention", "partial_rotary_factor", 0.25,
                              "rope_theta", 1e6, "rope_type", "proportional", "sliding_attention",
                              "partial_rotary_factor", 1.0, "rope_theta", 1e4, "rope_type", "default");
    st = gemma4_rope(hm, json_object_get(rp, "full_attention"), "full_attention", c->full_head_dim,
                     &c->inv_freq_global, err);
    if (!st)
        st = gemma4_rope(hm, json_object_get(rp, "sliding_attention"), "sliding_attention", c->swa_head_dim,
                         &c->inv_freq_local, err);
    json_decref(dflt);
    if (st) return st;
    c->head_dim = c->full_head_dim > c->swa_head_dim ? c->full_head_dim : c->swa_head_dim;
    c->n_kv_heads = c->full_kv_heads > c->swa_kv_heads ? c->full_kv_heads : c->swa_kv_heads;
    return HEARTH_OK;
}

/* ---- end of Gemma 4 */

static hearth_status read_dir_config(const hearth_model *hm, model_config *c, hearth_error *err) {
    const json_t *cfg = hm->config, *text = json_object_get(cfg, "text_config");
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (json_is_object(text)) cfg = text;
    if (!mt) mt = "?";
    if (!strcmp(mt, "llama")) c->family = FAMILY_LLAMA;
    else if (!strcmp(mt, "qwen3")) c->family = FAMILY_QWEN3;
    else if (!strcmp(mt, "gemma3_text") || !strcmp(mt, "gemma3")) c->family = FAMILY_GEMMA3;
    else if (!strcmp(mt, "minicpm")) c->family = FAMILY_MINICPM;
    else if (!strcmp(mt, "qwen3_moe")) c->family = FAMILY_QWEN3_MOE;
    else if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text") || !strcmp(mt, "qwen3_5_moe") ||
             !strcmp(mt, "qwen3_5_moe_text"))
        c->family = FAMILY_QWEN3_5;
    else if (!strcmp(mt, "gemma4_text") || !strcmp(mt, "gemma4")) c->family = FAMILY_GEMMA4;
    else return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported; " SUPPORTED,
                        hm->entry.path, mt);
    int gemma = c->family == FAMILY_GEMMA3;
    const model_summary *s = &hm->sum;
    c->n_layers = (int)s->n_layers;
    c->hidden = (int)s->hidden_size;
    c->n_heads = (int)s->n_heads;
    c->n_kv_heads = (int)s->n_kv_heads;
    c->head_dim = gemma && !json_object_get(cfg, "head_dim") ? 256 : (int)s->head_dim;
    c->ffn = (int)s->intermediate_size;
    c->vocab = (int)s->vocab_size;
    c->context_length = (int)s->context_length;
    c->norm_eps = (float)num(cfg, "rms_norm_eps", 1e-6);
    /* transformers 5 saves RoPE as "rope_parameters" (theta, type and factors in one
     * object; Gemma 3: one object per layer type) instead of rope_theta + rope_scaling. */
    /* before any table is sized from them (model_config_read checks the rest) */
    if (c->n_layers <= 0 || c->hidden <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->head_dim % 2)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: config.json: inconsistent dimensions (layers %d, hidden %d, heads %d/%d, head_dim %d)",
                       hm->entry.path, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim);
    if (c->family == FAMILY_GEMMA4) return read_gemma4(hm, cfg, c, err);
    const json_t *rp = json_object_get(cfg, "rope_parameters"), *rp_local = NULL;
    if (json_is_object(json_object_get(rp, "full_attention"))) {
        rp_local = json_object_get(rp, "sliding_attention");
        rp = json_object_get(rp, "full_attention");
    }
    if (!json_is_object(rp)) rp = NULL;
    double theta = num(cfg, "rope_theta", num(rp, "rope_theta", gemma ? 1e6 : 10000.0));
    const json_t *scaling = json_object_get(cfg, "rope_scaling");
    if (!json_is_object(scaling)) scaling = rp;
    const char *rtype = json_string_value(json_object_get(scaling, "rope_type"));
    if (!rtype) rtype = json_string_value(json_object_get(scaling, "type"));
    if (rtype && strcmp(rtype, "default") && strcmp(rtype, "llama3") && strcmp(rtype, "linear") &&
        strcmp(rtype, "longrope"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: config.json: RoPE scaling type '%s' is not supported (default, linear, llama3, longrope are)",
                       hm->entry.path, rtype);
    double qk_scale = 1.0;
    if (rtype && !strcmp(rtype, "longrope")) {
        hearth_status st = longrope_check(hm, scaling, c->head_dim, num(cfg, "max_position_embeddings", 0),
                                          &qk_scale, err);
        if (st) return st;
    }
    c->inv_freq_global = rope_inv_freq(c->head_dim, theta, scaling);
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    if (qk_scale != 1.0) c->attn_scale = (float)(qk_scale * qk_scale / sqrt((double)c->head_dim));
    c->embed_scale = 1.0f;
    if (gemma) {
        c->norm_shift = 1.0f;
        c->attn_scale = (float)(1.0 / sqrt(num(cfg, "query_pre_attn_scalar", 256)));
        c->embed_scale = bf16_to_f32(f32_to_bf16(sqrtf((float)c->hidden)));
        c->sliding_window = (int)num(cfg, "sliding_window", 512);
        c->sliding_pattern = (int)num(cfg, "sliding_window_pattern", 6);
        c->inv_freq_local = rope_inv_freq(c->head_dim, num(cfg, "rope_local_base_freq", num(rp_local, "rope_theta", 10000.0)),
                                          NULL);
    }
    if (c->family == FAMILY_MINICPM) return read_minicpm(hm, cfg, c, err);
    if (c->family == FAMILY_QWEN3_MOE) return read_qwen3_moe(hm, cfg, c, err);
    if (c->family == FAMILY_QWEN3_5) return read_qwen3_5(hm, cfg, c, err);
    return HEARTH_OK;
}

/* Qwen3.5 as llama.cpp's converter writes it (arch "qwen35"): the Gated DeltaNet geometry
 * from the ssm.* keys (group_count = key heads, time_step_rank = value heads, state_size =
 * the key / value head size, inner_size = value heads x value head size), which layers are
 * recurrent (full_attention_interval; attention.recurrent_layers, when written, must agree),
 * partial RoPE over rope.dimension_count dims, value heads in the converter's tiled order,
 * norms stored with their 1 added. MTP layers (nextn_predict_layers) follow the trunk's in
 * block_count and are not run. */
static hearth_status read_gguf_qwen35(const hearth_model *hm, model_config *c, hearth_error *err) {
    const gguf_file *g = &hm->gguf;
    const char *arch = hm->sum.architecture; /* qwen35 or qwen35moe */
    char key[128];
    int64_t v[7] = {0, 0, 0, 0, 0, 4, 0};
    static const char *const keys[] = {"ssm.group_count", "ssm.time_step_rank", "ssm.state_size", "ssm.inner_size",
                                       "ssm.conv_kernel", "full_attention_interval", "rope.dimension_count"};
    for (int i = 0; i < 7; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        if (!gguf_get_i64(g, key, &v[i]) && i != 5)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF %s needs the integer key '%s'", hm->entry.path, arch, key);
    }
    int64_t nextn = 0;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    gguf_get_i64(g, key, &nextn);
    if (nextn < 0 || nextn >= c->n_layers)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %s %lld of %d blocks", hm->entry.path, key, (long long)nextn,
                       c->n_layers);
    c->n_layers -= (int)nextn;
    c->gdn_k_heads = (int)v[0], c->gdn_v_heads = (int)v[1], c->gdn_k_dim = (int)v[2], c->gdn_conv = (int)v[4];
    c->gdn_v_dim = v[1] > 0 && v[3] % v[1] == 0 ? (int)(v[3] / v[1]) : 0;
    c->full_interval = (int)v[5], c->rope_dims = (int)v[6];
    if (v[0] <= 0 || v[1] <= 0 || v[1] % v[0] || v[1] > 4096 || v[2] <= 0 || v[2] > 4096 || c->gdn_v_dim <= 0 ||
        c->gdn_v_dim > 4096 || v[4] < 1 || v[4] > 64 || v[5] < 1 || v[5] > 1024 || v[6] <= 0 || v[6] % 2 ||
        v[6] > c->head_dim)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: GGUF %s linear attention is inconsistent (group_count %lld, time_step_rank %lld "
                       "(a multiple of it), state_size %lld, inner_size %lld, conv_kernel %lld, "
                       "full_attention_interval %lld, rope.dimension_count %lld of head size %d)",
                       hm->entry.path, arch, (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
                       (long long)v[4], (long long)v[5], (long long)v[6], c->head_dim);
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    const gguf_kv *rec = gguf_find(g, key);
    if (rec && (rec->type != GGUF_ARRAY || rec->v.arr.type == GGUF_STRING ||
                rec->v.arr.n != (uint64_t)(c->n_layers + nextn)))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %s must list %lld layers", hm->entry.path, key,
                       (long long)(c->n_layers + nextn));
    c->n_state_layers = 0;
    for (int i = 0; i < c->n_layers; i++) {
        int linear = (i + 1) % c->full_interval != 0;
        c->n_state_layers += linear;
        if (rec && (gguf_arr_i64(rec, (uint64_t)i) != 0) != linear)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: %s[%d] disagrees with full_attention_interval %d",
                           hm->entry.path, key, i, c->full_interval);
    }
    free(c->inv_freq_global);
    c->inv_freq_global = rope_inv_freq(c->rope_dims, hm->sum.rope_theta, NULL);
    c->attn_gate = 1, c->gdn_v_tiled = 1;
    return HEARTH_OK;
}

/* The experts of a GGUF MoE (qwen3moe, qwen35moe: llama.cpp's keys). llama.cpp's graphs for
 * both renormalise the top-k router weights, so that is what such a file means. */
static hearth_status read_gguf_moe(const hearth_model *hm, model_config *c, int shared, hearth_error *err) {
    const char *arch = hm->sum.architecture;
    static const char *const keys[] = {"expert_count", "expert_used_count", "expert_feed_forward_length",
                                       "expert_shared_feed_forward_length"};
    int64_t v[4] = {0, 0, 0, 0};
    char key[128];
    for (int i = 0; i < 3 + shared; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        if (!gguf_get_i64(&hm->gguf, key, &v[i]))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF %s needs the integer key '%s'", hm->entry.path, arch, key);
    }
    if (v[0] <= 0 || v[0] > 4096 || v[1] <= 0 || v[1] > v[0] || v[2] <= 0 || v[2] > (1 << 20) || v[3] < 0 ||
        v[3] > (1 << 20) || (shared && !v[3]))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: GGUF %s experts are inconsistent (expert_count %lld, expert_used_count %lld, expert "
                       "feed_forward_length %lld, shared %lld)",
                       hm->entry.path, arch, (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3]);
    c->n_experts = (int)v[0], c->top_k_experts = (int)v[1], c->moe_ffn = (int)v[2], c->shared_ffn = (int)v[3];
    c->norm_topk = 1;
    return HEARTH_OK;
}

/* ---- Gemma 4 as llama.cpp's converter writes it (arch "gemma4", conversion/gemma.py
 * Gemma4Model): key_length / key_length_swa for the full / sliding head dims,
 * head_count_kv and feed_forward_length a number or one per layer (the full layers' KV
 * heads, the double-wide shared layers), sliding_window_pattern one bool per layer (true:
 * sliding), attention.shared_kv_layers, embedding_length_per_layer_input, the sliding
 * layers' rope.freq_base_swa and the full layers' proportional RoPE as rope_freqs factors
 * (1e30 past the rotated part), final_logit_softcapping (absent: 30, llama.cpp's default),
 * the experts' keys. Norms are stored as the model uses them (no offset). */

/* A per-layer integer key: one number for every layer, or an array of L of them. */
static hearth_status gguf_layer_ints(const hearth_model *hm, const char *key, int L, int required, int64_t dflt,
                                     int64_t *out, hearth_error *err) {
    const gguf_kv *kv = gguf_find(&hm->gguf, key);
    int64_t v = dflt;
    if (kv && kv->type == GGUF_ARRAY) {
        if (kv->v.arr.type == GGUF_STRING || kv->v.arr.type == GGUF_ARRAY || kv->v.arr.n != (uint64_t)L)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF key '%s' must be a number or %d numbers (one per layer)",
                           hm->entry.path, key, L);
        for (int i = 0; i < L; i++) out[i] = gguf_arr_i64(kv, (uint64_t)i);
        return HEARTH_OK;
    }
    if (kv && !gguf_get_i64(&hm->gguf, key, &v))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF key '%s' is a %s, not a number", hm->entry.path, key,
                       gguf_type_name(kv->type));
    if (!kv && required)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF gemma4 needs the key '%s'", hm->entry.path, key);
    for (int i = 0; i < L; i++) out[i] = v;
    return HEARTH_OK;
}

/* kv heads and FFN width per layer type from the per-layer arrays, which must agree within a type. */
static hearth_status gemma4_gguf_layers(const hearth_model *hm, model_config *c, const int64_t *kvh, const int64_t *ff,
                                        hearth_error *err) {
    int L = c->n_layers, seen[2] = {0, 0};
    c->swa_ffn = (int)ff[0];
    c->double_wide = 0;
    for (int i = 0; i < L; i++) {
        int full = c->layer_full[i], *heads = full ? &c->full_kv_heads : &c->swa_kv_heads;
        if (!seen[full]) *heads = (int)kvh[i], seen[full] = 1;
        if (kvh[i] != *heads || kvh[i] <= 0 || kvh[i] > 4096 || c->n_heads % kvh[i])
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: gemma4.attention.head_count_kv[%d] is %lld; every %s layer must have the same positive "
                           "count (%d), a divisor of head_count %d",
                           hm->entry.path, i, (long long)kvh[i], full ? "full" : "sliding", *heads, c->n_heads);
        if (i >= c->first_shared && ff[i] == 2 * ff[0] && c->first_shared > 0) c->double_wide = 1;
    }
    for (int i = 0; i < L; i++) {
        int64_t want = i >= c->first_shared && c->double_wide ? 2 * ff[0] : ff[0];
        if (ff[i] != want || ff[i] <= 0 || ff[i] > (1 << 28))
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: gemma4.feed_forward_length[%d] is %lld, expected %lld (the first layer's width, "
                           "doubled on the KV-shared layers of a double-wide model)",
                           hm->entry.path, i, (long long)ff[i], (long long)want);
    }
    c->ffn = c->double_wide ? 2 * c->swa_ffn : c->swa_ffn;
    if (!seen[0]) c->swa_kv_heads = c->full_kv_heads; /* no layer of that type: unused */
    if (!seen[1]) c->full_kv_heads = c->swa_kv_heads;
    return HEARTH_OK;
}

/* The full layers' RoPE: base^(-2i/head_dim) divided by rope_freqs (llama.cpp's freq
 * factors; the converter's 1e30 leaves a pair unrotated), the sliding layers' plain RoPE
 * from rope.freq_base_swa. */
static hearth_status gemma4_gguf_rope(const hearth_model *hm, model_config *c, hearth_error *err) {
    const gguf_file *g = &hm->gguf;
    double base = hm->sum.rope_theta, base_swa = base;
    gguf_get_f64(g, "gemma4.rope.freq_base_swa", &base_swa);
    int64_t rot = c->full_head_dim, rot_swa = c->swa_head_dim;
    gguf_get_i64(g, "gemma4.rope.dimension_count", &rot);
    gguf_get_i64(g, "gemma4.rope.dimension_count_swa", &rot_swa);
    if (rot != c->full_head_dim || rot_swa != c->swa_head_dim)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: gemma4.rope.dimension_count %lld / dimension_count_swa %lld: only RoPE over the whole head "
                       "(%d / %d) is supported (the full layers' partial rotation comes from rope_freqs)",
                       hm->entry.path, (long long)rot, (long long)rot_swa, c->full_head_dim, c->swa_head_dim);
    if (!(base > 0) || !(base_swa > 0))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: gemma4.rope.freq_base %g / freq_base_swa %g must be positive",
                       hm->entry.path, base, base_swa);
    free(c->inv_freq_global);
    c->inv_freq_global = rope_inv_freq(c->full_head_dim, base, NULL);
    c->inv_freq_local = rope_inv_freq(c->swa_head_dim, base_swa, NULL);
    if (!c->inv_freq_global || !c->inv_freq_local) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    int any_full = 0;
    for (int i = 0; i < c->n_layers; i++) any_full |= c->layer_full[i];
    const tensor_info *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (!any_full) return HEARTH_OK;
    if (!rf || rf->dtype != DT_F32 || tensor_elems(rf) != (uint64_t)c->full_head_dim / 2)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor 'rope_freqs.weight' must be %d F32 values (the full layers' RoPE factors)%s",
                       hm->entry.path, c->full_head_dim / 2, rf ? "" : "; it is missing");
    for (int i = 0; i < c->full_head_dim / 2; i++) {
        float f;
        memcpy(&f, rf->data + 4 * i, 4);
        if (!(f > 0.0f) || !isfinite(f))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: rope_freqs.weight[%d] is %g; factors must be positive",
                           hm->entry.path, i, (double)f);
        c->inv_freq_global[i] /= f;
    }
    return HEARTH_OK;
}

static hearth_status read_gguf_gemma4(const hearth_model *hm, model_config *c, hearth_error *err) {
    const gguf_file *g = &hm->gguf;
    const char *path = hm->entry.path;
    int L = c->n_layers;
    if (!gemma4_alloc_layers(c)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    const gguf_kv *pat = gguf_find(g, "gemma4.attention.sliding_window_pattern");
    if (!pat || pat->type != GGUF_ARRAY || pat->v.arr.type == GGUF_STRING || pat->v.arr.type == GGUF_ARRAY ||
        pat->v.arr.n != (uint64_t)L)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: GGUF gemma4 needs 'gemma4.attention.sliding_window_pattern', %d bools (one per layer)",
                       path, L);
    for (int i = 0; i < L; i++) c->layer_full[i] = gguf_arr_i64(pat, (uint64_t)i) == 0;
    int64_t swa_dim = 0, swa_vdim = 0, vdim = c->head_dim, window = 0, shared = 0, pl = 0;
    static const char *const need[] = {"gemma4.attention.key_length_swa", "gemma4.attention.value_length_swa",
                                       "gemma4.attention.sliding_window", "gemma4.embedding_length_per_layer_input"};
    int64_t *dst[] = {&swa_dim, &swa_vdim, &window, &pl};
    for (int i = 0; i < 4; i++)
        if (!gguf_get_i64(g, need[i], dst[i]))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: GGUF gemma4 needs the integer key '%s'", path, need[i]);
    gguf_get_i64(g, "gemma4.attention.value_length", &vdim);
    gguf_get_i64(g, "gemma4.attention.shared_kv_layers", &shared);
    if (vdim != c->head_dim || swa_vdim != swa_dim || swa_dim <= 0 || swa_dim % 2 || swa_dim > 4096 ||
        c->head_dim > 4096 || window <= 0 || window > (1 << 30) || pl < 0 || pl > 65536 || shared < 0 || shared >= L ||
        (shared > 0 && L - shared < 2))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: GGUF gemma4 sizes are inconsistent (key/value_length %d/%lld, key/value_length_swa "
                       "%lld/%lld, sliding_window %lld, embedding_length_per_layer_input %lld, shared_kv_layers %lld "
                       "of %d layers)",
                       path, c->head_dim, (long long)vdim, (long long)swa_dim, (long long)swa_vdim, (long long)window,
                       (long long)pl, (long long)shared, L);
    c->full_head_dim = c->head_dim, c->swa_head_dim = (int)swa_dim;
    c->sliding_window = (int)window, c->sliding_pattern = 0, c->per_layer_dim = (int)pl;
    c->first_shared = L - (int)shared;
    /* llama.cpp's KV-sharing map: a shared sliding layer reads layer first_shared - 2, a full
     * one first_shared - 1; mlx-lm's (the last of the type) agrees when those are of that type */
    if (shared > 0 && (!c->layer_full[c->first_shared - 1] || c->layer_full[c->first_shared - 2]))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: gemma4 with KV-shared layers needs layer %d (the last one with its own KV) full and layer "
                       "%d sliding, as llama.cpp reads them; this file's are not",
                       path, c->first_shared - 1, c->first_shared - 2);
    int64_t *kvh = calloc((size_t)L, sizeof *kvh), *ff = calloc((size_t)L, sizeof *ff);
    hearth_status st = !kvh || !ff ? err_set(err, HEARTH_ERR_NOMEM, "out of memory") : HEARTH_OK;
    if (!st) st = gguf_layer_ints(hm, "gemma4.attention.head_count_kv", L, 1, 0, kvh, err);
    if (!st) st = gguf_layer_ints(hm, "gemma4.feed_forward_length", L, 1, 0, ff, err);
    if (!st) st = gemma4_gguf_layers(hm, c, kvh, ff, err);
    free(kvh);
    free(ff);
    if (st) return st;
    if ((st = gemma4_kv_map(hm, c, (int)shared, "GGUF gemma4.attention.shared_kv_layers", err))) return st;
    if ((st = gemma4_gguf_rope(hm, c, err))) return st;
    const tensor_info *plt = gguf_find_tensor(g, "per_layer_token_embd.weight");
    c->per_layer_vocab = plt && plt->ndim == 2 ? (int)plt->shape[0] : c->vocab; /* the loader names a bad one */
    double cap = 30.0;
    gguf_get_f64(g, "gemma4.final_logit_softcapping", &cap);
    c->softcap = cap > 0 ? (float)cap : 0.0f;
    c->norm_shift = 0.0f, c->attn_scale = 1.0f, c->embed_scale = (float)sqrt((double)c->hidden);
    int64_t experts = 0;
    gguf_get_i64(g, "gemma4.expert_count", &experts);
    if (experts > 0) { /* enable_moe_block: every layer has the experts beside its MLP */
        if ((st = read_gguf_moe(hm, c, 0, err))) return st;
    } else if (gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight"))
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor 'blk.0.ffn_gate_inp.weight' (a router) without the key 'gemma4.expert_count'", path);
    c->n_kv_heads = c->full_kv_heads > c->swa_kv_heads ? c->full_kv_heads : c->swa_kv_heads;
    c->head_dim = c->full_head_dim > c->swa_head_dim ? c->full_head_dim : c->swa_head_dim;
    return HEARTH_OK;
}
/* ---- end of Gemma 4 GGUF */

static hearth_status read_gguf_config(const hearth_model *hm, model_config *c, hearth_error *err) {
    const gguf_file *g = &hm->gguf;
    const char *arch = hm->sum.architecture;
    if (!strcmp(arch, "llama")) c->family = FAMILY_LLAMA, c->rope_adjacent = 1;
    else if (!strcmp(arch, "qwen3")) c->family = FAMILY_QWEN3;
    else if (!strcmp(arch, "gemma3")) c->family = FAMILY_GEMMA3;
    else if (!strcmp(arch, "qwen35") || !strcmp(arch, "qwen35moe")) c->family = FAMILY_QWEN3_5;
    else if (!strcmp(arch, "qwen3moe")) c->family = FAMILY_QWEN3_MOE;
    else if (!strcmp(arch, "gemma4")) c->family = FAMILY_GEMMA4;
    else return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported; " SUPPORTED,
                        hm->entry.path, arch);
    const model_summary *s = &hm->sum;
    c->n_layers = (int)s->n_layers;
    c->hidden = (int)s->hidden_size;
    c->n_heads = (int)s->n_heads;
    c->n_kv_heads = (int)s->n_kv_heads;
    c->head_dim = (int)s->head_dim;
    c->ffn = (int)s->intermediate_size;
    c->vocab = (int)s->vocab_size;
    const tensor_info *emb = gguf_find_tensor(g, "token_embd.weight");
    if (emb && emb->ndim == 2) c->vocab = (int)emb->shape[0];
    c->context_length = (int)s->context_length;
    char key[128];
    double v = 1e-5;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_get_f64(g, key, &v);
    c->norm_eps = (float)v;
    json_t *scaling = NULL;
    char *stype;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((stype = gguf_get_str(g, key))) {
        if (strcmp(stype, "none") && strcmp(stype, "linear")) {
            hearth_status st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                                       "%s: RoPE scaling type '%s' is not supported (none, linear are)",
                                       hm->entry.path, stype);
            free(stype);
            return st;
        }
        double factor = 1.0;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        gguf_get_f64(g, key, &factor);
        scaling = json_pack("{s:s, s:f}", "type", stype, "factor", factor);
        free(stype);
    }
    c->inv_freq_global = rope_inv_freq(c->head_dim, s->rope_theta, scaling);
    json_decref(scaling);
    /* Llama 3.x GGUFs carry the llama3 scaling as per-frequency divisors */
    const tensor_info *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (rf && c->inv_freq_global && rf->dtype == DT_F32 && tensor_elems(rf) == (uint64_t)c->head_dim / 2)
        for (int i = 0; i < c->head_dim / 2; i++) {
            float f;
            memcpy(&f, rf->data + 4 * i, 4);
            c->inv_freq_global[i] /= f;
        }
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->embed_scale = 1.0f;
    if (c->family == FAMILY_GEMMA3) {
        /* llama.cpp's converter stores Gemma norms with the +1 already added */
        c->norm_shift = 0.0f;
        c->embed_scale = bf16_to_f32(f32_to_bf16(sqrtf((float)c->hidden)));
        int64_t w = 512;
        gguf_get_i64(g, "gemma3.attention.sliding_window", &w);
        c->sliding_window = (int)w;
        c->sliding_pattern = 6; /* fixed for Gemma 3; GGUF does not store it */
        c->inv_freq_local = rope_inv_freq(c->head_dim, 10000.0, NULL); /* Gemma 3's local base */
    }
    if (c->family == FAMILY_GEMMA4) return read_gguf_gemma4(hm, c, err);
    int moe = c->family == FAMILY_QWEN3_MOE || !strcmp(arch, "qwen35moe");
    hearth_status st = moe ? read_gguf_moe(hm, c, c->family == FAMILY_QWEN3_5, err) : HEARTH_OK;
    if (!st && c->family == FAMILY_QWEN3_5) st = read_gguf_qwen35(hm, c, err);
    return st;
}

int model_layer_is_moe(const hearth_model *hm, const model_config *c, int i) {
    if (c->family == FAMILY_QWEN3_5) return c->n_experts > 0; /* qwen3_5_moe: every layer */
    if (c->family != FAMILY_QWEN3_MOE || c->n_experts <= 0) return 0;
    if (hm->entry.format == MODEL_FORMAT_GGUF) { /* the layers with a router (a dense one has none) */
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
        return gguf_find_tensor(&hm->gguf, name) != NULL;
    }
    const json_t *cfg = hm->config, *text = json_object_get(cfg, "text_config"), *only;
    if (json_is_object(text)) cfg = text;
    int step = (int)num(cfg, "decoder_sparse_step", 1);
    size_t j;
    json_t *v;
    only = json_object_get(cfg, "mlp_only_layers");
    json_array_foreach(only, j, v) if (json_integer_value(v) == i) return 0;
    return step > 0 && (i + 1) % step == 0;
}

hearth_status model_config_read(const hearth_model *hm, model_config *c, hearth_error *err);
hearth_status model_config_read(const hearth_model *hm, model_config *c, hearth_error *err) {
    memset(c, 0, sizeof *c);
    hearth_status st = hm->entry.format == MODEL_FORMAT_GGUF ? read_gguf_config(hm, c, err)
                                                             : read_dir_config(hm, c, err);
    if (st) return st;
    if (c->n_layers <= 0 || c->hidden <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 ||
        c->head_dim > (1 << 16) || c->head_dim % 2 || c->ffn <= 0 || c->vocab <= 0 || c->n_heads % c->n_kv_heads)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: inconsistent dimensions (layers %d, hidden %d, heads %d/%d, head_dim %d, ffn %d, vocab %d)",
                       hm->entry.path, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn,
                       c->vocab);
    if (!c->inv_freq_global) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!c->inv_freq_local) c->inv_freq_local = c->inv_freq_global;
    if (c->residual_scale == 0.0f) c->residual_scale = 1.0f;
    if (c->logits_div == 0.0f) c->logits_div = 1.0f;
    if (c->context_length <= 0) c->context_length = 4096;
    if (c->family != FAMILY_GEMMA4) c->n_kv_layers = c->n_layers - c->n_state_layers; /* Gemma 4: read_gemma4's */
    if (c->n_kv_layers <= 0)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: no attention layer (%d layers, all linear attention)",
                       hm->entry.path, c->n_layers);
    return HEARTH_OK;
}
