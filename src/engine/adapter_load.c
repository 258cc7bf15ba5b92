/* adapter_load.c: one adapter folder read against a loaded model, all or nothing: the
 * config (MLX's lora_parameters / fine_tune_type / num_layers, or PEFT's r / lora_alpha /
 * target_modules / use_dora / use_rslora), every tensor's name matched to a layer and a
 * projection, its shape to the rank and the base weight, and the pairs stored as float32 in
 * the layout the ops take (A [rank, k], B transposed [rank, n], outputs in the base's order:
 * GGUF llama q/k rows are permuted for adjacent-pair RoPE, and so are B's columns). DoRA magnitudes become one
 * factor per output row here. Never touches the model's weights. */
#define _GNU_SOURCE
#include "engine/adapter.h"
#include "base/err.h"
#include "base/file.h"
#include "io/ggml_quant.h"
#include "io/safetensors.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const proj_names[OP_N_PROJ] = {"q_proj",    "k_proj",    "v_proj",    "o_proj",
                                                  "gate_proj", "up_proj",   "down_proj", "in_proj_qkv",
                                                  "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
static const char *const proj_parent[OP_N_PROJ] = {"self_attn",   "self_attn",   "self_attn",   "self_attn",
                                                   "mlp",         "mlp",         "mlp",         "linear_attn",
                                                   "linear_attn", "linear_attn", "linear_attn", "linear_attn"};

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
    const op_weight *ws[OP_N_PROJ] = {&l->q,    &l->k,       &l->v,     &l->o,     &l->gate,  &l->up,
                                      &l->down, &l->gdn_qkv, &l->gdn_z, &l->gdn_b, &l->gdn_a, &l->gdn_out};
    return ws[p];
}

static int proj_index(const char *name) {
    for (int p = 0; p < OP_N_PROJ; p++)
        if (!strcmp(name, proj_names[p])) return p;
    return -1;
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
        int p = json_is_string(v) ? proj_index(json_string_value(v)) : -1;
        if (p < 0)
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "%s: target module %s is not one hearth adapts (q_proj k_proj v_proj o_proj gate_proj "
                           "up_proj down_proj, and Qwen3.5's in_proj_qkv in_proj_z in_proj_b in_proj_a out_proj)",
                           file, json_is_string(v) ? json_string_value(v) : "(not a string)");
        *out |= 1u << p;
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
 * "...layers.<i>.<self_attn|mlp>.<proj>.<lora_a|lora_b|m>" (MLX) or
 * "...layers.<i>.<...>.<proj>.<lora_A.weight|lora_B.weight|lora_magnitude_vector[.weight]>"
 * (PEFT). Returns the message's reason on failure, NULL on success. */
static const char *parse_name(const char *name, int peft, int *layer, int *proj, int *part) {
    const char *s = strstr(name, "layers.");
    if (!s) return "is not inside a decoder layer";
    char *end;
    long li = strtol(s + 7, &end, 10);
    if (end == s + 7 || *end != '.' || li < 0 || li > 100000) return "has no layer number";
    const char *mod = end + 1, *dot = strchr(mod, '.');
    if (!dot) return "names no module";
    const char *pname = dot + 1, *pdot = strchr(pname, '.');
    if (!pdot) return "names no projection";
    char buf[64];
    size_t n = (size_t)(pdot - pname);
    if (n >= sizeof buf) return "names an unknown projection";
    memcpy(buf, pname, n);
    buf[n] = 0;
    int p = proj_index(buf);
    if (p < 0 || strncmp(mod, proj_parent[p], (size_t)(dot - mod)) || strlen(proj_parent[p]) != (size_t)(dot - mod))
        return "targets a module hearth does not adapt (experts, router, embeddings or lm_head)";
    const char *tail = pdot + 1;
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

/* Checks a pair's shapes against the rank and the base weight w: A is [k, r] (MLX) or
 * [r, k] (PEFT), B [r, n] (MLX) or [n, r] (PEFT), the magnitude [n]. */
static hearth_status check_pair(const pair_src *s, const adapter_cfg *c, const op_weight *w, int layer, int p,
                                hearth_error *err) {
    const char *what = proj_names[p];
    if (!s->a || !s->b) {
        const tensor_info *have = s->a ? s->a : s->b ? s->b : s->m;
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has %s but not %s", have->file, layer, what,
                       s->a ? "A" : s->b ? "B" : "a DoRA magnitude", s->a ? "B" : "A");
    }
    if (!c->dora && s->m)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has a DoRA magnitude but the config is plain LoRA",
                       s->m->file, layer, what);
    if (c->dora && !s->m)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s has no DoRA magnitude but the config says DoRA",
                       s->a->file, layer, what);
    int ka = c->peft ? 1 : 0, kb = c->peft ? 0 : 1; /* where k sits in A, n in B */
    if (s->a->ndim != 2 || s->b->ndim != 2)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: layer %d %s: A and B must be matrices", s->a->file, layer, what);
    int64_t ra = s->a->shape[1 - ka], rb = s->b->shape[1 - kb];
    if (ra != c->rank || rb != c->rank)
        return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d %s: rank %lld in the tensors, %d in adapter_config.json",
                       s->a->file, layer, what, (long long)(ra != c->rank ? ra : rb), c->rank);
    if (s->a->shape[ka] != w->k || s->b->shape[kb] != w->n)
        return err_set(err, HEARTH_ERR_INVALID,
                       "%s: layer %d %s: the adapter maps %lld -> %lld features but the base weight is [%lld, %lld]",
                       s->a->file, layer, what, (long long)s->a->shape[ka], (long long)s->b->shape[kb],
                       (long long)w->n, (long long)w->k);
    if (s->m && (s->m->ndim != 1 || s->m->shape[0] != w->n))
        return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d %s: DoRA magnitude has %lld entries, the base %lld rows",
                       s->m->file, layer, what, (long long)s->m->shape[0], (long long)w->n);
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
    const op_weight *w = base_weight(m, layer, p);
    int64_t r = c->rank, k = w->k, n = w->n;
    float *tmp = malloc((size_t)((k > n ? k : n) * r + n) * sizeof *tmp);
    if (!tmp) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    float *a = dst, *b = a + r * k, *mag = b + n * r;
    hearth_status st = read_f32(s->a, tmp, err);
    if (!st) { /* A as [r, k]: MLX stores lora_a as [k, r] */
        if (c->peft) memcpy(a, tmp, (size_t)(r * k) * sizeof *a);
        else
            for (int64_t i = 0; i < k; i++)
                for (int64_t q = 0; q < r; q++) a[q * k + i] = tmp[i * r + q];
        st = read_f32(s->b, tmp, err);
    }
    if (!st) { /* B transposed, [r, n]: MLX's lora_b as it is; PEFT's lora_B is [n, r] */
        if (!c->peft) memcpy(b, tmp, (size_t)(n * r) * sizeof *b);
        else
            for (int64_t j = 0; j < n; j++)
                for (int64_t q = 0; q < r; q++) b[q * n + j] = tmp[j * r + q];
        if (s->m) st = read_f32(s->m, mag, err);
    }
    int heads = p == OP_PROJ_Q ? m->cfg.n_heads : p == OP_PROJ_K ? m->cfg.n_kv_heads : 0;
    if (!st && m->cfg.rope_adjacent && heads) {
        for (int64_t q = 0; q < r; q++) permute_rows(b + q * n, tmp, n, 1, heads);
        if (s->m) permute_rows(mag, tmp, n, 1, heads);
    }
    *l = (op_lora){.a = a, .b = b, .rank = c->rank, .scale = c->scale};
    if (!st && s->m) { /* a planned model (shapes only, hearth_fuse) has no rows to take norms of */
        if (w->data) st = dora_factors(w, l, mag, mag, err);
        l->dora = mag;
    }
    free(tmp);
    return st;
}

static size_t pair_floats(const model *m, const adapter_cfg *c, int layer, int p) {
    const op_weight *w = base_weight(m, layer, p);
    return (size_t)c->rank * (size_t)(w->k + w->n) + (c->dora ? (size_t)w->n : 0);
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
                           f->path, t->name, proj_names[p]);
        /* a mixture-of-experts layer's MLP projections are its experts' (Gemma 4's layers keep a dense
         * MLP beside them, which adapts as any layer's) */
        if (m->layers[layer].moe && !m->layers[layer].gate.n && p >= OP_PROJ_GATE)
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "%s: tensor '%s' adapts the MLP of a mixture-of-experts layer (experts are not supported)",
                           f->path, t->name);
        if (p >= OP_PROJ_GDN_QKV && !base_weight(m, layer, p)->n)
            return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' adapts linear_attn.%s, but layer %d is %s",
                           f->path, t->name, proj_names[p], layer,
                           m->layers[layer].linear ? "without it" : "a full-attention layer");
        if (p >= OP_PROJ_GDN_QKV && m->cfg.gdn_v_tiled)
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
            hearth_status st = check_pair(s, c, base_weight(m, i, p), i, p, err);
            if (st) return st;
            total += pair_floats(m, c, i, p);
            a->modules |= 1u << p;
            layer_used = any = 1;
        }
        a->n_layers += layer_used;
    }
    if (!any) return err_set(err, HEARTH_ERR_INVALID, "%s: the adapter holds no LoRA tensors", a->path);
    a->bytes = total * sizeof(float);
    if (!(a->data = malloc(a->bytes))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory for the adapter");
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
    free(a->data);
    free(a);
}
