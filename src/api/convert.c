/* convert.c: hearth_convert: a float safetensors model folder to an MLX folder that
 * mlx-lm and hearth load as is: each Linear/Embedding weight quantized (mx.quantize's
 * affine scheme, io/mlx_quant.c) or copied, streamed one tensor at a time into one
 * model.safetensors, config.json given its "quantization" section, the tokenizer and
 * chat template files copied. Does not modify the input. */
#define _GNU_SOURCE
#include "api/convert_internal.h"
#include "base/err.h"
#include "base/half.h"
#include "engine/engine_internal.h"
#include "io/safetensors_write.h"
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct convert_item {
    const tensor_info *src;
    int bits;  /* > 0: quantized to this width (three outputs: weight, scales, biases) */
    int group; /* and this group size */
} convert_item;

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* mlx_lm.convert's --quant-predicate recipes: low bits everywhere, high bits for lm_head
 * and for v_proj / down_proj in the first and last eighth of the layers and every third
 * layer between (mixed_quant_predicate_builder, after llama.cpp's Q4_K_M choices). */
static const struct {
    const char *name;
    int low, high;
} recipes[] = {{"mixed_2_6", 2, 6}, {"mixed_3_4", 3, 4}, {"mixed_3_6", 3, 6}, {"mixed_4_6", 4, 6}};

static int recipe_index(const char *name) {
    for (int i = 0; name && i < (int)(sizeof recipes / sizeof recipes[0]); i++)
        if (!strcmp(recipes[i].name, name)) return i;
    return -1;
}

static int recipe_bits(const hearth_model *m, const char *name, int recipe) {
    int layer = 0, n = (int)m->sum.n_layers;
    if (sscanf(name, "model.layers.%d.", &layer) != 1) layer = 0;
    int third = ((layer - n / 8) % 3 + 3) % 3; /* Python's modulo: never negative */
    int more = layer < n / 8 || layer >= 7 * n / 8 || third == 2;
    if (more && (strstr(name, "v_proj") || strstr(name, "v_a_proj") || strstr(name, "v_b_proj")))
        return recipes[recipe].high;
    if (more && strstr(name, "down_proj")) return recipes[recipe].high;
    if (strstr(name, "lm_head")) return recipes[recipe].high;
    return recipes[recipe].low;
}

/* The width the module of weight t is quantized to (and *group its group size), 0 to keep
 * it float. mlx-lm quantizes the modules that have to_quantized (Linear, Embedding: the 2-D
 * ".weight" tensors of these families) whose input width is a multiple of the group. */
static int module_bits(const hearth_model *m, const tensor_info *t, const hearth_convert_options *o, int *group) {
    *group = o->group_size;
    if (!o->quantize || t->ndim != 2 || !ends_with(t->name, ".weight") || t->shape[1] % o->group_size) return 0;
    int r = recipe_index(o->quant_recipe), bits = o->bits;
    if (r >= 0)
        bits = recipe_bits(m, t->name, r);
    else if (o->choose_bits) {
        char path[512];
        snprintf(path, sizeof path, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        bits = o->choose_bits(o->choose_user, path, group);
        if (*group != 32 && *group != 64 && *group != 128) *group = o->group_size;
    }
    return bits > 0 && (t->shape[1] * bits) % 32 == 0 && t->shape[1] % *group == 0 ? bits : 0;
}

int convert_dropped(const hearth_model *m, const tensor_info *t) {
    if (ends_with(t->name, ".rotary_emb.inv_freq")) return 1;
    return !strcmp(t->name, "lm_head.weight") && json_is_true(json_object_get(m->config, "tie_word_embeddings"));
}

hearth_status convert_write_all(FILE *f, const void *p, size_t n, const char *fname, hearth_error *err) {
    if (n && fwrite(p, 1, n, f) != n) return err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    return HEARTH_OK;
}

/* n float values as dt (F32, F16 or BF16) into out */
static void encode_values(const float *v, size_t n, tensor_dtype dt, void *out) {
    if (dt == DT_F32) {
        memcpy(out, v, n * sizeof *v);
        return;
    }
    uint16_t *h = out;
    for (size_t i = 0; i < n; i++) h[i] = dt == DT_BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
}

/* scales/biases leave as the weight's dtype, as mx.quantize returns them */
hearth_status convert_write_values(FILE *f, const float *v, size_t n, tensor_dtype dt, const char *fname,
                                  hearth_error *err) {
    void *h = malloc(n * (size_t)tensor_dtype_block_bytes(dt));
    if (!h) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    encode_values(v, n, dt, h);
    hearth_status st = convert_write_all(f, h, n * (size_t)tensor_dtype_block_bytes(dt), fname, err);
    free(h);
    return st;
}

/* Rows of one weight quantized in slices of QUANT_ROWS (each row is quantized on its own),
 * spread over a thread pool. */
#define QUANT_ROWS 64
typedef struct quant_job {
    const float *w;
    int64_t rows, cols;
    int bits, group, fit;
    tensor_dtype dt;
    uint8_t *packed;
    float *scales, *biases;
} quant_job;

static void quant_task(void *ctx, int task, int thread) {
    (void)thread;
    const quant_job *j = ctx;
    int64_t r0 = (int64_t)task * QUANT_ROWS, n = j->rows - r0 < QUANT_ROWS ? j->rows - r0 : QUANT_ROWS;
    size_t g0 = (size_t)r0 * (size_t)(j->cols / j->group);
    uint8_t *packed = j->packed + (size_t)r0 * (size_t)j->cols * (size_t)j->bits / 8;
    if (j->fit)
        mlxq_quantize_fit(j->w + r0 * j->cols, n, j->cols, j->bits, j->group, j->dt, packed, j->scales + g0,
                          j->biases + g0);
    else
        mlxq_quantize(j->w + r0 * j->cols, n, j->cols, j->bits, j->group, packed, j->scales + g0, j->biases + g0);
}

/* A weight's MLX affine form, the bytes the file holds, in one buffer (*out, malloc'd): the
 * packed words, then the scales and the biases in the weight's dtype (*sb_bytes each). tp:
 * the threads to quantize on (NULL: this one). */
static hearth_status quantize_weight(const hearth_model *m, const tensor_info *t, int bits, int group, int fit_scales,
                                     threadpool *tp, uint8_t **out, size_t *packed_bytes, size_t *sb_bytes,
                                     hearth_error *err) {
    float *w = NULL;
    size_t n = 0;
    *out = NULL;
    hearth_status st = hearth_model_tensor_f32(m, t->name, &w, &n, err);
    if (st) return st;
    int64_t rows = t->shape[0], cols = t->shape[1], groups = cols / group;
    size_t ng = (size_t)rows * (size_t)groups;
    *packed_bytes = (size_t)rows * (size_t)cols * (size_t)bits / 8;
    *sb_bytes = ng * (size_t)tensor_dtype_block_bytes(t->dtype);
    uint8_t *bytes = malloc(*packed_bytes + 2 * *sb_bytes);
    float *sb = malloc(2 * ng * sizeof *sb);
    if (!bytes || !sb)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory quantizing '%s'", t->name);
    else {
        quant_job j = {w, rows, cols, bits, group, fit_scales, t->dtype, bytes, sb, sb + ng};
        tp_run(tp, (int)((rows + QUANT_ROWS - 1) / QUANT_ROWS), quant_task, &j);
        encode_values(sb, ng, t->dtype, bytes + *packed_bytes);
        encode_values(sb + ng, ng, t->dtype, bytes + *packed_bytes + *sb_bytes);
        *out = bytes, bytes = NULL;
    }
    hearth_free(w);
    free(bytes);
    free(sb);
    return st;
}

static hearth_status write_quantized(const hearth_model *m, const tensor_info *t, int bits, int group,
                                     const hearth_convert_options *o, FILE *f, const char *fname, hearth_error *err) {
    uint8_t *bytes;
    size_t packed_bytes, sb_bytes;
    hearth_status st = quantize_weight(m, t, bits, group, o->fit_scales, NULL, &bytes, &packed_bytes, &sb_bytes, err);
    if (!st) st = convert_write_all(f, bytes, packed_bytes + 2 * sb_bytes, fname, err);
    free(bytes);
    return st;
}

static st_out_tensor out_tensor(const char *name, const char *suffix, tensor_dtype dt, int64_t rows, int64_t cols) {
    st_out_tensor o = {.dtype = dt, .ndim = 2, .shape = {rows, cols}};
    if (asprintf(&o.name, "%.*s%s", (int)(strlen(name) - strlen(".weight")), name, suffix) < 0) o.name = NULL;
    return o;
}

/* The output catalogue in write order: for a quantized weight its packed words, scales
 * and biases; else the tensor as it is. */
static hearth_status plan_outputs(const hearth_model *m, const hearth_convert_options *o, convert_item *items,
                                  size_t *n_items, st_out_tensor *outs, size_t *n_outs, hearth_error *err) {
    *n_items = *n_outs = 0;
    for (size_t i = 0; i < m->st.n_tensors; i++) {
        const tensor_info *t = m->st.by_name[i];
        if (convert_dropped(m, t)) continue;
        if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; convert reads float tensors", t->file,
                           t->name, tensor_dtype_name(t->dtype));
        if (o->quantize && t->ndim == 3 && ends_with(t->name, ".weight"))
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "%s: tensor '%s' is a stack of expert weights; quantizing MoE models is not done yet",
                           t->file, t->name);
        int group, bits = module_bits(m, t, o, &group);
        items[(*n_items)++] = (convert_item){t, bits, group};
        if (bits) {
            int64_t rows = t->shape[0], cols = t->shape[1];
            outs[(*n_outs)++] = out_tensor(t->name, ".weight", DT_U32, rows, cols * bits / 32);
            outs[(*n_outs)++] = out_tensor(t->name, ".scales", t->dtype, rows, cols / group);
            outs[(*n_outs)++] = out_tensor(t->name, ".biases", t->dtype, rows, cols / group);
        } else {
            st_out_tensor c = {.name = strdup(t->name), .dtype = t->dtype, .ndim = t->ndim};
            memcpy(c.shape, t->shape, sizeof c.shape);
            outs[(*n_outs)++] = c;
        }
        if (!outs[*n_outs - 1].name) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    return HEARTH_OK;
}

static hearth_status write_weights(const hearth_model *m, const hearth_convert_options *o, const char *fname,
                                   uint64_t *total, hearth_error *err) {
    size_t n = m->st.n_tensors, n_items, n_outs;
    convert_item *items = calloc(n ? n : 1, sizeof *items);
    st_out_tensor *outs = calloc(3 * n + 1, sizeof *outs);
    FILE *f = NULL;
    hearth_status st = items && outs ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) st = plan_outputs(m, o, items, &n_items, outs, &n_outs, err);
    if (!st && !(f = fopen(fname, "wb"))) st = err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    if (!st) st = st_write_header(f, fname, outs, n_outs, total, err);
    for (size_t i = 0; !st && i < n_items; i++) {
        const tensor_info *t = items[i].src;
        st = items[i].bits ? write_quantized(m, t, items[i].bits, items[i].group, o, f, fname, err)
                           : convert_write_all(f, t->data, t->nbytes, fname, err);
        if (!st && o->progress) o->progress(o->user, i + 1, n_items, t->name);
    }
    if (f && fclose(f) && !st) st = err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    for (size_t i = 0; outs && i < 3 * n + 1; i++) free(outs[i].name);
    free(outs);
    free(items);
    return st;
}

hearth_status convert_write_json(const char *dir, const char *name, json_t *j, hearth_error *err) {
    char *path = path_join(dir, name);
    int bad = !path || json_dump_file(j, path, JSON_INDENT(4) | JSON_PRESERVE_ORDER);
    hearth_status st = bad ? err_set(err, HEARTH_ERR_IO, "%s/%s: cannot write", dir, name) : HEARTH_OK;
    free(path);
    return st;
}

static hearth_status copy_file(const char *from, const char *to, hearth_error *err) {
    file_map fm;
    hearth_status st = file_map_open(from, &fm, err);
    if (st) return st;
    FILE *f = fopen(to, "wb");
    if (!f)
        st = err_set(err, HEARTH_ERR_IO, "%s: %s", to, strerror(errno));
    else {
        st = convert_write_all(f, fm.data, fm.size, to, err);
        if (fclose(f) && !st) st = err_set(err, HEARTH_ERR_IO, "%s: %s", to, strerror(errno));
    }
    file_map_close(&fm);
    return st;
}

/* Everything beside the weights and config.json: tokenizer files, chat templates,
 * generation_config.json, the model card. */
hearth_status convert_copy_side_files(const char *src, const char *dst, hearth_error *err) {
    DIR *d = opendir(src);
    if (!d) return err_set(err, HEARTH_ERR_IO, "%s: %s", src, strerror(errno));
    hearth_status st = HEARTH_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] == '.' || ends_with(n, ".safetensors") || !strcmp(n, "model.safetensors.index.json") ||
            !strcmp(n, "config.json"))
            continue;
        char *from = path_join(src, n), *to = path_join(dst, n);
        if (!from || !to)
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        else if (!file_is_dir(from))
            st = copy_file(from, to, err);
        free(from);
        free(to);
    }
    closedir(d);
    return st;
}

static hearth_status check_options(const hearth_convert_options *o, hearth_error *err) {
    if (!o || !o->out_dir || !o->out_dir[0]) return err_set(err, HEARTH_ERR_INVALID, "convert: no output folder");
    if (o->quantize && o->bits != 2 && o->bits != 3 && o->bits != 4 && o->bits != 5 && o->bits != 6 && o->bits != 8)
        return err_set(err, HEARTH_ERR_INVALID, "convert: --q-bits %d: MLX affine takes 2, 3, 4, 5, 6 or 8", o->bits);
    if (o->quant_recipe && (!o->quantize || recipe_index(o->quant_recipe) < 0))
        return err_set(err, HEARTH_ERR_INVALID,
                       "convert: --quant-predicate %s: with -q, one of mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6",
                       o->quant_recipe);
    if (o->quantize && o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
        return err_set(err, HEARTH_ERR_INVALID, "convert: --q-group-size %d: MLX affine takes 32, 64 or 128",
                       o->group_size);
    if (file_exists(o->out_dir))
        return err_set(err, HEARTH_ERR_INVALID, "%s: already exists; convert writes a new one", o->out_dir);
    return HEARTH_OK;
}

/* --outtype names (llama.cpp's) of the GGUF types written */
static int gguf_type_parse(const char *name, tensor_dtype *out) {
    static const struct {
        const char *name;
        tensor_dtype dt;
    } types[] = {
        {"f32", DT_F32},   {"f16", DT_F16},   {"bf16", DT_BF16}, {"q8_0", DT_Q8_0},
        {"q4_0", DT_Q4_0}, {"q4_1", DT_Q4_1}, {"q5_0", DT_Q5_0}, {"q5_1", DT_Q5_1},
        {"q6_k", DT_Q6_K}, {"q4_k_m", DT_Q4_K}, /* q4_k_m: llama.cpp's Q4_K_M mix, base Q4_K */
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i].name, name)) return *out = types[i].dt, 1;
    return 0;
}

int convert_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

hearth_status hearth_convert(const char *model, const hearth_convert_options *o, hearth_error *err) {
    hearth_status st = check_options(o, err);
    if (st) return st;
    tensor_dtype gguf_dt = DT_F32;
    if (o->gguf_type && !gguf_type_parse(o->gguf_type, &gguf_dt))
        return err_set(err, HEARTH_ERR_INVALID,
                       "convert: --outtype %s: one of f32, f16, bf16, q8_0, q4_0, q4_1, "
                       "q5_0, q5_1, q6_k, q4_k_m",
                       o->gguf_type);
    hearth_model *m = NULL;
    if ((st = hearth_model_open(model, &m, err))) return st;
    if (m->entry.format != MODEL_FORMAT_DIR)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: convert reads safetensors folders (GGUF input is not done yet)",
                     m->entry.path);
    else if (m->quant.present)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: already quantized; convert reads float weights", m->entry.path);
    else if (o->gguf_type) {
        st = convert_to_gguf(m, o, gguf_dt, err);
        hearth_model_close(m);
        return st;
    } else if (mkdir(o->out_dir, 0755))
        st = err_set(err, HEARTH_ERR_IO, "%s: %s", o->out_dir, strerror(errno));
    int made = !st;
    char *weights = st ? NULL : path_join(o->out_dir, "model.safetensors");
    uint64_t total = 0;
    if (!st) st = write_weights(m, o, weights, &total, err);
    json_t *config = st ? NULL : json_deep_copy(m->config);
    /* mlx-lm's load puts generation_config's eos_token_id into the config it saves */
    json_t *gen_eos = m->generation_config ? json_object_get(m->generation_config, "eos_token_id") : NULL;
    if (config && gen_eos && !json_is_false(gen_eos)) json_object_set(config, "eos_token_id", gen_eos);
    if (config && o->quantize) {
        json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", o->group_size, "bits", o->bits, "mode", "affine");
        /* a recipe or a chooser names every quantized module with its own parameters, as
           mlx-lm records them */
        for (size_t i = 0; (recipe_index(o->quant_recipe) >= 0 || o->choose_bits) && i < m->st.n_tensors; i++) {
            const tensor_info *t = m->st.by_name[i];
            int group, bits = convert_dropped(m, t) ? 0 : module_bits(m, t, o, &group);
            if (!bits) continue;
            char path[512];
            snprintf(path, sizeof path, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
            json_object_set_new(q, path,
                                json_pack("{s:i, s:i, s:s}", "group_size", group, "bits", bits, "mode", "affine"));
        }
        json_object_set(config, "quantization", q);
        json_object_set_new(config, "quantization_config", q);
    }
    if (config) st = convert_write_json(o->out_dir, "config.json", config, err);
    json_decref(config);
    if (!st) {
        json_t *index = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
        st_file out;
        /* the index names every tensor of the file just written, read back through the reader */
        if (!(st = st_open(weights, &out, err))) {
            for (size_t i = 0; i < out.n_tensors; i++)
                json_object_set_new(json_object_get(index, "weight_map"), out.tensors[i].name,
                                    json_string("model.safetensors"));
            st_close(&out);
            st = convert_write_json(o->out_dir, "model.safetensors.index.json", index, err);
        }
        json_decref(index);
    }
    if (!st) st = convert_copy_side_files(m->entry.path, o->out_dir, err);
    /* a failed conversion leaves no half-written folder behind (it did not exist before) */
    if (st && made) nftw(o->out_dir, convert_remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    free(weights);
    hearth_model_close(m);
    return st;
}

/* The modules hearth_convert would quantize, quantized to its bytes and put in place in the
 * engine's loaded float weights (engine_trial_weight), none written anywhere. */
hearth_status hearth_engine_quantize_weights(hearth_engine *e, const hearth_convert_options *o, hearth_error *err) {
    const hearth_model *m = engine_model(e);
    hearth_convert_options q = *o;
    q.quantize = 1, q.gguf_type = NULL;
    if (m->entry.format != MODEL_FORMAT_DIR || m->quant.present)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: weight trials take a float safetensors folder", m->entry.path);
    if (q.bits != 2 && q.bits != 3 && q.bits != 4 && q.bits != 5 && q.bits != 6 && q.bits != 8)
        return err_set(err, HEARTH_ERR_INVALID, "quantize weights: %d bits: MLX affine takes 2, 3, 4, 5, 6 or 8",
                       q.bits);
    if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
        return err_set(err, HEARTH_ERR_INVALID, "quantize weights: group size %d: MLX affine takes 32, 64 or 128",
                       q.group_size);
    hearth_status st = HEARTH_OK;
    for (size_t i = 0; !st && i < m->st.n_tensors; i++) {
        const tensor_info *t = m->st.by_name[i];
        int group, bits = convert_dropped(m, t) ? 0 : module_bits(m, t, &q, &group);
        if (!bits) continue;
        uint8_t *bytes;
        size_t packed_bytes, sb_bytes;
        if ((st = quantize_weight(m, t, bits, group, q.fit_scales, engine_threads(e), &bytes, &packed_bytes, &sb_bytes,
                                  err)))
            break;
        op_weight w = {.dtype = DT_U32, .data = bytes, .n = t->shape[0], .k = t->shape[1], .bits = bits,
                       .group_size = group, .sb_dtype = t->dtype, .scales = bytes + packed_bytes,
                       .biases = bytes + packed_bytes + sb_bytes};
        st = engine_trial_weight(e, t->name, &w, bytes, err);
    }
    if (st) engine_trial_restore(e);
    return st;
}

void hearth_engine_restore_weights(hearth_engine *e) { engine_trial_restore(e); }