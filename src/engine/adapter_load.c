/* adapter_load.c: one adapter folder read against a loaded model, all or nothing: the
 * config (MLX's lora_parameters / fine_tune_type / num_layers, or PEFT's r / lora_alpha /
 * target_modules / use_dora / use_rslora), every tensor's name matched to a layer and a
 * projection, its shape to the rank and the base weight, and the pairs stored as float32 in
 * the layout the ops take (A [rank, k], B transposed [rank, n], outputs in the base's order:
 * GGUF llama q/k rows are permuted for adjacent-pair RoPE, and so are B's columns). DoRA magnitudes become one
 * factor per output row here. Never touches the model's weights. */
#define _GNU_SOURCE
#include "base/err.h"
#include "base/file.h"
#include "base/mem.h"
#include "engine/adapter.h"
#include "io/ggml_quant.h"
#include "io/safetensors.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each projection's module inside a decoder layer as mlx-lm and Hugging Face name it (a
 * second spelling where families differ: Qwen's router is mlp.gate, Gemma 4's router.proj;
 * Qwen's experts mlp.switch_mlp, Gemma 4's experts.switch_glu), and the name /v1/adapters
 * lists it by. */
static const struct {
    const char *path[2], *name;
} projs[OP_N_PROJ] = {
    [OP_PROJ_Q] = {{"self_attn.q_proj"}, "q_proj"},
    [OP_PROJ_K] = {{"self_attn.k_proj"}, "k_proj"},
    [OP_PROJ_V] = {{"self_attn.v_proj"}, "v_proj"},
    [OP_PROJ_O] = {{"self_attn.o_proj"}, "o_proj"},
    [OP_PROJ_GATE] = {{"mlp.gate_proj"}, "gate_proj"},
    [OP_PROJ_UP] = {{"mlp.up_proj"}, "up_proj"},
    [OP_PROJ_DOWN] = {{"mlp.down_proj"}, "down_proj"},
    [OP_PROJ_GDN_QKV] = {{"linear_attn.in_proj_qkv"}, "in_proj_qkv"},
    [OP_PROJ_GDN_Z] = {{"linear_attn.in_proj_z"}, "in_proj_z"},
    [OP_PROJ_GDN_B] = {{"linear_attn.in_proj_b"}, "in_proj_b"},
    [OP_PROJ_GDN_A] = {{"linear_attn.in_proj_a"}, "in_proj_a"},
    [OP_PROJ_GDN_OUT] = {{"linear_attn.out_proj"}, "out_proj"},
    [OP_PROJ_PLE_GATE] = {{"per_layer_input_gate"}, "per_layer_input_gate"},
    [OP_PROJ_PLE_PROJ] = {{"per_layer_projection"}, "per_layer_projection"},
    [OP_PROJ_ROUTER] = {{"mlp.gate", "router.proj"}, "router"},
    [OP_PROJ_SHARED_GATE] = {{"mlp.shared_expert.gate_proj"}, "shared_expert.gate_proj"},
    [OP_PROJ_SHARED_UP] = {{"mlp.shared_expert.up_proj"}, "shared_expert.up_proj"},
    [OP_PROJ_SHARED_DOWN] = {{"mlp.shared_expert.down_proj"}, "shared_expert.down_proj"},
    [OP_PROJ_SHARED_ROUTER] = {{"mlp.shared_expert_gate"}, "shared_expert_gate"},
    [OP_PROJ_EXP_GATE] = {{"mlp.switch_mlp.gate_proj", "experts.switch_glu.gate_proj"}, "experts.gate_proj"},
    [OP_PROJ_EXP_UP] = {{"mlp.switch_mlp.up_proj", "experts.switch_glu.up_proj"}, "experts.up_proj"},
    [OP_PROJ_EXP_DOWN] = {{"mlp.switch_mlp.down_proj", "experts.switch_glu.down_proj"}, "experts.down_proj"},
};

const char *adapter_proj_name(int p) { return p >= 0 && p < OP_N_PROJ ? projs[p].name : "?"; }

const char *adapter_proj_path(int p, int alt) {
    return p >= 0 && p < OP_N_PROJ && (alt == 0 || alt == 1) ? projs[p].path[alt] : NULL;
}

static int is_expert(int p) { return p >= OP_PROJ_EXP_GATE && p <= OP_PROJ_EXP_DOWN; }

/* What adapter_config.json says. */
typedef struct adapter_cfg {
    int peft, dora, rank, num_layers;
    float scale;
    unsigned targets; /* PEFT target_modules as op_proj bits (all for MLX: its keys decide) */
} adapter_cfg;

/* The parts of one (layer, projection) pair met in the file. */
typedef struct pair_src {
    const tensor_info *a, *b, *m;
} pair_src;

static const op_weight *base_weight(const model *m, int layer, int p) {
    const layer_weights *l = &m->layers[layer];
    const op_weight *ws[OP_N_PROJ] = {[OP_PROJ_Q] = &l->q,
                                      [OP_PROJ_K] = &l->k,
                                      [OP_PROJ_V] = &l->v,
                                      [OP_PROJ_O] = &l->o,
                                      [OP_PROJ_GATE] = &l->gate,
                                      [OP_PROJ_UP] = &l->up,
                                      [OP_PROJ_DOWN] = &l->down,
                                      [OP_PROJ_GDN_QKV] = &l->gdn_qkv,
                                      [OP_PROJ_GDN_Z] = &l->gdn_z,
                                      [OP_PROJ_GDN_B] = &l->gdn_b,
                                      [OP_PROJ_GDN_A] = &l->gdn_a,
                                      [OP_PROJ_GDN_OUT] = &l->gdn_out,
                                      [OP_PROJ_PLE_GATE] = &l->pl_gate,
                                      [OP_PROJ_PLE_PROJ] = &l->pl_proj,
                                      [OP_PROJ_ROUTER] = &l->router,
                                      [OP_PROJ_SHARED_GATE] = &l->shared_gate,
                                      [OP_PROJ_SHARED_UP] = &l->shared_up,
                                      [OP_PROJ_SHARED_DOWN] = &l->shared_down,
                                      [OP_PROJ_SHARED_ROUTER] = &l->shared_router};
    return ws[p];
}

/* One matrix of projection p in layer `layer` (n outputs, k inputs; one expert's for the
 * stacked experts, *experts their count, else 0); 0 when the layer has no such projection. */
static int proj_dims(const model *m, int layer, int p, int64_t *n, int64_t *k, int *experts) {
    const layer_weights *l = &m->layers[layer];
    *experts = 0;
    if (is_expert(p)) {
        if (!l->moe || !l->experts_gate.n || m->cfg.n_experts <= 0) return 0;
        *experts = m->cfg.n_experts;
        *n = p == OP_PROJ_EXP_DOWN ? m->cfg.hidden : m->cfg.moe_ffn;
        *k = p == OP_PROJ_EXP_DOWN ? m->cfg.moe_ffn : m->cfg.hidden;
        return 1;
    }
    const op_weight *w = base_weight(m, layer, p);
    *n = w->n, *k = w->k;
    return w->n > 0;
}

/* Whether target_modules entry t (PEFT's rule: the module's name or a dotted suffix of it) names projection p. */
static int target_names(const char *t, int p) {
    for (int i = 0; i < 2 && projs[p].path[i]; i++) {
        const char *path = projs[p].path[i];
        size_t lp = strlen(path), lt = strlen(t);
        if (!strcmp(path, t) || (lt < lp && path[lp - lt - 1] == '.' && !strcmp(path + lp - lt, t))) return 1;
    }
    return 0;
}

static hearth_status parse_targets(const json_t *tm, const char *file, unsigned *out, hearth_error *err) {
    *out = 0;
    if (json_is_string(tm)) {
        if (!strcmp(json_string_value(tm), "all-linear")) {
            *out = (1u << OP_N_PROJ) - 1;
            return HEARTH_OK;
        }
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: target_modules \"%s\" (a regex) is not supported: list the modules",
                       file, json_string_value(tm));
    }
    if (!json_is_array(tm) || !json_array_size(tm))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: target_modules must be a non-empty list", file);
    size_t i;
    const json_t *v;
    json_array_foreach(tm, i, v) {
        unsigned bits = 0;
        for (int p = 0; p < OP_N_PROJ && json_is_string(v); p++)
            if (target_names(json_string_value(v), p)) bits |= 1u << p;
        if (!bits)
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "%s: target module %s is not one hearth adapts (q_proj k_proj v_proj o_proj gate_proj "
                           "up_proj down_proj; Qwen3.5's in_proj_qkv in_proj_z in_proj_b in_proj_a out_proj; Gemma "
                           "4's per_layer_input_gate per_layer_projection; a mixture-of-experts layer's gate (router) "
                           "and shared_expert_gate)",
                           file, json_is_string(v) ? json_string_value(v) : "(not a string)");
        *out |= bits;
    }
    return HEARTH_OK;
}

static hearth_status parse_config(const char *path, const char *text, size_t len, int peft, adapter_cfg *c,
                                  hearth_error *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    hearth_status st = HEARTH_OK;
    *c = (adapter_cfg){.peft = peft, .targets = (1u << OP_N_PROJ) - 1, .num_layers = -1};
    if (!json_is_object(j)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: %s", path, j ? "not a JSON object" : je.text);
    } else if (peft) {
        const char *type = json_string_value(json_object_get(j, "peft_type"));
        const json_t *r = json_object_get(j, "r"), *alpha = json_object_get(j, "lora_alpha");
        const json_t *rp = json_object_get(j, "rank_pattern"), *ap = json_object_get(j, "alpha_pattern");
        if (type && strcmp(type, "LORA"))
            st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: peft_type %s is not supported (LORA only)", path, type);
        else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > OP_LORA_MAX_RANK)
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: r must be an integer in 1..%d", path, OP_LORA_MAX_RANK);
        else if (!json_is_number(alpha))
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: lora_alpha must be a number", path);
        else if ((json_object_size(rp) > 0) || (json_object_size(ap) > 0))
            st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: per-module rank_pattern / alpha_pattern are not supported",
                         path);
        else if (json_is_true(json_object_get(j, "fan_in_fan_out")))
            st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: fan_in_fan_out adapters (Conv1D bases) are not supported",
                         path);
        else {
            c->rank = (int)json_integer_value(r);
            double a = json_number_value(alpha);
            /* PEFT's scaling: alpha / r, or alpha / sqrt(r) with rsLoRA */
            c->scale = (float)(json_is_true(json_object_get(j, "use_rslora")) ? a / sqrt(c->rank) : a / c->rank);
            c->dora = json_is_true(json_object_get(j, "use_dora"));
            st = parse_targets(json_object_get(j, "target_modules"), path, &c->targets, err);
        }
    } else {
        const char *type = json_string_value(json_object_get(j, "fine_tune_type"));
        const json_t *lp = json_object_get(j, "lora_parameters");
        const json_t *r = json_object_get(lp, "rank"), *scale = json_object_get(lp, "scale");
        const json_t *nl = json_object_get(j, "num_layers");
        if (type && strcmp(type, "lora") && strcmp(type, "dora"))
            st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: fine_tune_type %s is not an adapter (lora or dora)", path,
                         type);
        else if (!json_is_object(lp))
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: lora_parameters missing", path);
        else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > OP_LORA_MAX_RANK)
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: lora_parameters.rank must be an integer in 1..%d", path,
                         OP_LORA_MAX_RANK);
        else if (!json_is_number(scale))
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: lora_parameters.scale must be a number", path);
        else if (nl && !json_is_integer(nl))
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: num_layers must be an integer", path);
        else {
            c->rank = (int)json_integer_value(r);
            c->scale = (float)json_number_value(scale);
            c->dora = type && !strcmp(type, "dora");
            if (nl) c->num_layers = (int)json_integer_value(nl);
        }
    }
    json_decref(j);
    return st;
}

/* A tensor name's layer, projection and part (0: A, 1: B, 2: DoRA magnitude), from
 * "...layers.<i>.<module>.<lora_a|lora_b|m>" (MLX) or
 * "...layers.<i>.<module>.<lora_A.weight|lora_B.weight|lora_magnitude_vector[.weight]>"
 * (PEFT), module one of projs' paths. Returns the message's reason on failure, NULL on success. */
static const char *parse_name(const char *name, int peft, int *layer, int *proj, int *part) {
    const char *s = strstr(name, "layers.");
    if (!s) return "is not inside a decoder layer";
    char *end;
    long li = strtol(s + 7, &end, 10);
    if (end == s + 7 || *end != '.' || li < 0 || li > 100000) return "has no layer number";
    const char *mod = end + 1, *tail = NULL;
    int p = -1;
    for (int q = 0; q < OP_N_PROJ && p < 0; q++)
        for (int i = 0; i < 2 && projs[q].path[i]; i++) {
            size_t n = strlen(projs[q].path[i]);
            if (!strncmp(mod, projs[q].path[i], n) && mod[n] == '.') {
                p = q, tail = mod + n + 1;
                break;
            }
        }
    if (p < 0) return "targets a module hearth does not adapt (embeddings, lm_head or an unknown projection)";
    static const char *const mlx_parts[] = {"lora_a", "lora_b", "m"};
    static const char *const peft_parts[] = {"lora_A.weight", "lora_B.weight", "lora_magnitude_vector"};
    for (int k = 0; k < 3; k++) {
        const char *want = peft ? peft_parts[k] : mlx_parts[k];
        if (!strcmp(tail, want) || (peft && k == 2 && !strcmp(tail, "lora_magnitude_vector.weight"))) {
            *layer = (int)li, *proj = p, *part = k;
            return NULL;
        }
    }
    return "is not a LoRA tensor (lora_a/lora_b/m or lora_A/lora_B/lora_magnitude_vector)";
}

static hearth_status read_f32(const tensor_info *t, float *out, hearth_error *err) {
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 expected)", t->file,
                       t->name, tensor_dtype_name(t->dtype));
    return ggml_dequantize(t->dtype, t->data, t->nbytes, out, tensor_elems(t), err);
}

/* t's values as float32: where the file maps them when they are float32 already, else
 * converted into tmp (*out: either; read it with memcpy, the mapping may be unaligned). */
static hearth_status tensor_floats(const tensor_info *t, float *tmp, const unsigned char **out, hearth_error *err) {
    *out = t->data;
    if (t->dtype == DT_F32) return HEARTH_OK;
    *out = (const unsigned char *)tmp;
    return read_f32(t, tmp, err);
}

/* Checks a pair's shapes against the rank and the base matrix (n outputs, k inputs): A is
 * [k, r] (MLX) or [r, k] (PEFT), B [r, n] (MLX) or [n, r] (PEFT), the magnitude [n]; the
 * experts' (mlx-lm's LoRASwitchLinear) A [E, r, k] and B [E, n, r]. */
static hearth_status check_pair(const pair_src *s, const adapter_cfg *c, const model *m, int layer, int p,
                                hearth_error *err) {
    const char *what = projs[p].name;
    int64_t wn, wk;
    int E;
    proj_dims(m, layer, p, &wn, &wk, &E);
    if (!s->a || !s->b) {
        const tensor_info *have = s->a ? s->a : s->b ? s->b : s->m;
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has %s but not %s", have->file, layer, what,
                       s->a ? "A" : s->b ? "B" : "a DoRA magnitude", s->a ? "B" : "A");
    }
    if (!c->dora && s->m)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has a DoRA magnitude but the config is plain LoRA",
                       s->m->file, layer, what);
    if (c->dora && E)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: layer %d %s: DoRA on the routed experts is not supported (mlx-lm has no DoRA for them "
                       "either)",
                       s->a->file, layer, what);
    if (c->dora && !s->m)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has no DoRA magnitude but the config says DoRA",
                       s->a->file, layer, what);
    if (E && c->peft)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: layer %d %s: PEFT adapters on the routed experts are not supported (the MLX format's "
                       "stacked expert pairs are)",
                       s->a->file, layer, what);
    int ka = c->peft ? 1 : 0, kb = c->peft ? 0 : 1; /* where k sits in A, n in B */
    int64_t ra, rb, ak, bn;
    if (E) {
        if (s->a->ndim != 3 || s->b->ndim != 3 || s->a->shape[0] != E || s->b->shape[0] != E)
            return err_set(err, HEARTH_ERR_INVALID,
                           "%s: layer %d %s: expert pairs must be [experts, rank, in] and [experts, out, rank] with "
                           "the model's %d experts",
                           s->a->file, layer, what, E);
        ra = s->a->shape[1], rb = s->b->shape[2], ak = s->a->shape[2], bn = s->b->shape[1];
    } else {
        if (s->a->ndim != 2 || s->b->ndim != 2)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s: A and B must be matrices", s->a->file, layer,
                           what);
        ra = s->a->shape[1 - ka], rb = s->b->shape[1 - kb], ak = s->a->shape[ka], bn = s->b->shape[kb];
    }
    if (ra != c->rank || rb != c->rank)
        return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d %s: rank %lld in the tensors, %d in adapter_config.json",
                       s->a->file, layer, what, (long long)(ra != c->rank ? ra : rb), c->rank);
    if (ak != wk || bn != wn)
        return err_set(err, HEARTH_ERR_INVALID,
                       "%s: layer %d %s: the adapter maps %lld -> %lld features but the base weight is [%lld, %lld]",
                       s->a->file, layer, what, (long long)ak, (long long)bn, (long long)wn, (long long)wk);
    if (s->m && (s->m->ndim != 1 || s->m->shape[0] != wn))
        return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d %s: DoRA magnitude has %lld entries, the base %lld rows",
                       s->m->file, layer, what, (long long)s->m->shape[0], (long long)wn);
    return HEARTH_OK;
}

/* GGUF llama q/k rows are in adjacent-pair RoPE order (row (h, i, j) of [heads, half, 2]
 * holds HF row (h, j, i) of [heads, 2, half]): anything indexed by those rows follows them
 * (rows of cols values; cols 1: a vector over the rows). */
static void permute_rows(float *v, float *tmp, int64_t rows, int64_t cols, int heads) {
    int64_t half = rows / heads / 2;
    memcpy(tmp, v, (size_t)(rows * cols) * sizeof *v);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(v + ((h * half + i) * 2 + j) * cols, tmp + ((h * 2 + j) * half + i) * cols,
                       (size_t)cols * sizeof *v);
}

/* The DoRA factor of each output row j: m[j] / |W[j] + scale * (B A)[j]| (as mlx-lm's
 * DoRALinear and PEFT compute it, from the dequantized base row). */
static hearth_status dora_factors(const op_weight *w, const op_lora *l, const float *mag, float *out,
                                  hearth_error *err) {
    float *row = malloc((size_t)w->k * sizeof *row);
    if (!row) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int64_t j = 0; j < w->n; j++) {
        op_weight_dequant_row(w, j, row);
        double sum = 0;
        for (int64_t i = 0; i < w->k; i++) {
            float d = 0.0f;
            for (int r = 0; r < l->rank; r++) d += l->b[(size_t)r * w->n + j] * l->a[(size_t)r * w->k + i];
            float v = row[i] + l->scale * d;
            sum += (double)v * v;
        }
        out[j] = (float)(mag[j] / sqrt(sum));
    }
    free(row);
    return HEARTH_OK;
}

/* Fills pair (layer, p) of a from its tensors (shapes checked). */
static hearth_status fill_pair(const model *m, const adapter_cfg *c, const pair_src *s, int layer, int p, float *dst,
                               op_lora *l, hearth_error *err) {
    int64_t r = c->rank, k, n;
    int E;
    proj_dims(m, layer, p, &n, &k, &E);
    int64_t per = E ? E : 1; /* pairs: one, or one per expert */
    float *tmp = malloc((size_t)(per * ((k > n ? k : n) * r) + n) * sizeof *tmp);
    if (!tmp) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    float *a = dst, *b = a + per * r * k, *mag = b + per * n * r;
    /* a float32 tensor (what mlx_lm.lora writes) is read where the file maps it (through
     * memcpy: any alignment); other dtypes are converted into tmp first */
    const unsigned char *src = NULL;
    hearth_status st = tensor_floats(s->a, tmp, &src, err);
    if (!st) { /* A as [r, k]: MLX stores lora_a as [k, r] (its experts' as [E, r, k]) */
        if (c->peft || E)
            memcpy(a, src, (size_t)(per * r * k) * sizeof *a);
        else /* in blocks of 64 of its rows: r floats each, a cache line at rank 16 */
            for (int64_t i0 = 0; i0 < k; i0 += 64) {
                int64_t i1 = i0 + 64 < k ? i0 + 64 : k;
                for (int64_t q = 0; q < r; q++)
                    for (int64_t i = i0; i < i1; i++) memcpy(&a[q * k + i], src + (size_t)(i * r + q) * 4, 4);
            }
        st = tensor_floats(s->b, tmp, &src, err);
    }
    if (!st) { /* B transposed, [r, n]: MLX's lora_b as it is; PEFT's lora_B and MLX's experts' are [n, r] */
        if (!c->peft && !E)
            memcpy(b, src, (size_t)(n * r) * sizeof *b);
        else
            for (int64_t e = 0; e < per; e++)
                for (int64_t j = 0; j < n; j++)
                    for (int64_t q = 0; q < r; q++)
                        memcpy(&b[(e * r + q) * n + j], src + (size_t)((e * n + j) * r + q) * sizeof *b, sizeof *b);
        if (s->m) st = read_f32(s->m, mag, err);
    }
    int heads = p == OP_PROJ_Q ? m->cfg.n_heads : p == OP_PROJ_K ? m->cfg.n_kv_heads : 0;
    if (!st && m->cfg.rope_adjacent && heads) {
        for (int64_t q = 0; q < r; q++) permute_rows(b + q * n, tmp, n, 1, heads);
        if (s->m) permute_rows(mag, tmp, n, 1, heads);
    }
    *l = (op_lora){.a = a, .b = b, .rank = c->rank, .scale = c->scale, .experts = E};
    const op_weight *w = E ? NULL : base_weight(m, layer, p);
    if (!st && s->m) { /* a planned model (shapes only, hearth_fuse) has no rows to take norms of */
        if (w->data) st = dora_factors(w, l, mag, mag, err);
        l->dora = mag;
    }
    free(tmp);
    return st;
}

static size_t pair_floats(const model *m, const adapter_cfg *c, int layer, int p) {
    int64_t n, k;
    int E;
    proj_dims(m, layer, p, &n, &k, &E);
    return (size_t)(E ? E : 1) * (size_t)c->rank * (size_t)(k + n) + (c->dora ? (size_t)n : 0);
}

/* Matches every tensor of f to a pair of src, checking names against the model and config. */
static hearth_status collect(const model *m, const adapter_cfg *c, const st_file *f, pair_src *src,
                             hearth_error *err) {
    int L = m->cfg.n_layers;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const tensor_info *t = &f->tensors[i];
        int layer, p, part;
        const char *why = parse_name(t->name, c->peft, &layer, &p, &part);
        if (why) return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' %s", f->path, t->name, why);
        if (layer >= L)
            return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' is for layer %d but the model has %d layers",
                           f->path, t->name, layer, L);
        if (!(c->targets & (1u << p)))
            return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' adapts %s, which target_modules does not list",
                           f->path, t->name, projs[p].name);
        int64_t wn, wk;
        int E;
        int has = proj_dims(m, layer, p, &wn, &wk, &E);
        /* a mixture-of-experts layer's MLP projections are its experts' (Gemma 4's layers keep a dense
         * MLP beside them, which adapts as any layer's); their pairs are named switch_mlp / switch_glu */
        if (m->layers[layer].moe && !has && p >= OP_PROJ_GATE && p <= OP_PROJ_DOWN)
            return err_set(err, HEARTH_ERR_INVALID,
                           "%s: tensor '%s' adapts a dense MLP, but layer %d is a mixture-of-experts layer (its "
                           "experts' pairs are named mlp.switch_mlp.*)",
                           f->path, t->name, layer);
        if (p >= OP_PROJ_GDN_QKV && p <= OP_PROJ_GDN_OUT && !has)
            return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' adapts linear_attn.%s, but layer %d is %s",
                           f->path, t->name, projs[p].name, layer,
                           m->layers[layer].linear ? "without it" : "a full-attention layer");
        if (!has)
            return err_set(err, HEARTH_ERR_INVALID,
                           "%s: tensor '%s' adapts %s, which layer %d of this model does not have", f->path, t->name,
                           projs[p].path[0], layer);
        if (p >= OP_PROJ_GDN_QKV && p <= OP_PROJ_GDN_OUT && m->cfg.gdn_v_tiled)
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "%s: tensor '%s' adapts a Gated DeltaNet projection of a GGUF model, whose value heads "
                           "llama.cpp's converter reorders; serve the adapter on the safetensors model",
                           f->path, t->name);
        if (c->num_layers >= 0 && layer < L - c->num_layers)
            return err_set(err, HEARTH_ERR_INVALID,
                           "%s: tensor '%s' is for layer %d but num_layers %d covers only the last layers (%d..%d)",
                           f->path, t->name, layer, c->num_layers, L - c->num_layers, L - 1);
        pair_src *s = &src[(size_t)layer * OP_N_PROJ + p];
        const tensor_info **slot = part == 0 ? &s->a : part == 1 ? &s->b : &s->m;
        if (*slot) return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s' appears twice", f->path, t->name);
        *slot = t;
    }
    return HEARTH_OK;
}

static hearth_status build(const model *m, const adapter_cfg *c, const pair_src *src, adapter *a,
                           hearth_error *err) {
    int L = m->cfg.n_layers;
    size_t total = 0;
    int any = 0;
    for (int i = 0; i < L; i++) {
        int layer_used = 0;
        for (int p = 0; p < OP_N_PROJ; p++) {
            const pair_src *s = &src[(size_t)i * OP_N_PROJ + p];
            if (!s->a && !s->b && !s->m) continue;
            hearth_status st = check_pair(s, c, m, i, p, err);
            if (st) return st;
            total += pair_floats(m, c, i, p);
            a->modules |= 1u << p;
            layer_used = any = 1;
        }
        a->n_layers += layer_used;
    }
    if (!any) return err_set(err, HEARTH_ERR_INVALID, "%s: the adapter holds no LoRA tensors", a->path);
    a->bytes = total * sizeof(float);
    /* resident in one call: a full-model adapter of an 8B model is ~170 MB, whose page
     * faults one by one were a large part of a mount */
    if (!(a->data = mem_alloc_filled(a->bytes))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory for the adapter");
    float *dst = a->data;
    for (int i = 0; i < L; i++)
        for (int p = 0; p < OP_N_PROJ; p++) {
            const pair_src *s = &src[(size_t)i * OP_N_PROJ + p];
            if (!s->a) continue;
            hearth_status st = fill_pair(m, c, s, i, p, dst, &a->proj[(size_t)i * OP_N_PROJ + p], err);
            if (st) return st;
            dst += pair_floats(m, c, i, p);
        }
    return HEARTH_OK;
}

hearth_status adapter_parse(const model *m, const char *path, int peft, const char *config, size_t config_len,
                            const uint8_t *tensors, size_t tensors_len, adapter **out, hearth_error *err) {
    *out = NULL;
    adapter *a = calloc(1, sizeof *a);
    pair_src *src = calloc((size_t)m->cfg.n_layers * OP_N_PROJ, sizeof *src);
    char *cfg_name = path_join(path, "adapter_config.json");
    char *st_name = path_join(path, peft ? "adapter_model.safetensors" : "adapters.safetensors");
    hearth_status st = HEARTH_OK;
    adapter_cfg c = {0};
    st_file f = {0};
    if (!a || !src || !cfg_name || !st_name || !(a->path = strdup(path)) ||
        !(a->proj = calloc((size_t)m->cfg.n_layers * OP_N_PROJ, sizeof *a->proj)))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) st = parse_config(cfg_name, config, config_len, peft, &c, err);
    if (!st) st = st_parse(tensors, tensors_len, st_name, &f, err);
    if (!st) st = collect(m, &c, &f, src, err);
    if (!st) st = build(m, &c, src, a, err);
    st_close(&f);
    free(src);
    free(cfg_name);
    free(st_name);
    if (st) {
        adapter_free(a);
        return st;
    }
    a->format = peft ? "peft" : "mlx";
    a->dora = c.dora, a->rank = c.rank, a->scale = c.scale;
    a->ops.proj = a->proj;
    a->ops.data = a->data;
    a->ops.floats = a->bytes / sizeof(float);
    *out = a;
    return HEARTH_OK;
}

hearth_status adapter_load(const model *m, const char *path, adapter **out, hearth_error *err) {
    *out = NULL;
    if (!file_is_dir(path))
        return err_set(err, HEARTH_ERR_IO, "%s: not a folder (an adapter is a folder with adapter_config.json)", path);
    char *mlx = path_join(path, "adapters.safetensors"), *peft = path_join(path, "adapter_model.safetensors");
    char *cfg = path_join(path, "adapter_config.json"), *text = NULL;
    size_t len = 0;
    file_map map = {0};
    int is_peft = mlx && !file_exists(mlx) && peft && file_exists(peft);
    hearth_status st = HEARTH_OK;
    if (!mlx || !peft || !cfg)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    else if (!file_exists(mlx) && !is_peft)
        st = err_set(err, HEARTH_ERR_IO, "%s: no adapters.safetensors (MLX) or adapter_model.safetensors (PEFT)", path);
    else if (!file_exists(cfg))
        st = err_set(err, HEARTH_ERR_IO, "%s: missing (an adapter folder needs adapter_config.json)", cfg);
    if (!st) st = file_read_all(cfg, &text, &len, err);
    if (!st) st = file_map_open(is_peft ? peft : mlx, &map, err);
    if (!st) st = adapter_parse(m, path, is_peft, text, len, map.data, map.size, out, err);
    file_map_close(&map);
    free(text);
    free(cfg);
    free(mlx);
    free(peft);
    return st;
}

void adapter_free(adapter *a) {
    if (!a) return;
    free(a->id);
    free(a->path);
    free(a->proj);
    mem_free_reserved(a->data, a->bytes);
    free(a);
}
