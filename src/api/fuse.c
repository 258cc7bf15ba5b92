/* fuse.c: hearth_fuse: a LoRA adapter folded into the weights of its base model (an MLX or
 * Hugging Face safetensors folder), written as a new folder, as mlx_lm.fuse does: each
 * adapted projection becomes W + T(scale * B^T A^T) in the weight's dtype T (for a quantized
 * base: W dequantized in its scales' dtype, the sum re-quantized with the base's own bits
 * and group size); every other tensor is copied byte for byte. Computes on the host, one
 * projection at a time. */
#define _GNU_SOURCE
#include "api/convert_internal.h"
#include "base/err.h"
#include "base/file.h"
#include "base/half.h"
#include "engine/adapter.h"
#include "io/mlx_quant.h"
#include "io/safetensors_write.h"
#include "model/model.h"
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The adapted pair of the projection whose weight is named `name` ("...layers.<i>.<module>.weight"
 * with module one of the projections' paths, adapter_proj_path; `suffix` ".weight", ".scales" or
 * ".biases"); NULL if none. */
static const op_lora *pair_of(const adapter *a, int n_layers, const char *name, const char *suffix) {
    const char *s = strstr(name, "layers.");
    if (!s) return NULL;
    char *end;
    long i = strtol(s + 7, &end, 10);
    if (end == s + 7 || *end != '.' || i < 0 || i >= n_layers) return NULL;
    for (int p = 0; p < OP_N_PROJ; p++)
        for (int alt = 0; alt < 2; alt++) {
            const char *path = adapter_proj_path(p, alt);
            size_t n = path ? strlen(path) : 0;
            if (path && !strncmp(end + 1, path, n) && !strcmp(end + 1 + n, suffix)) {
                const op_lora *l = &a->proj[i * OP_N_PROJ + p];
                return l->a ? l : NULL;
            }
        }
    return NULL;
}

static float round_to(tensor_dtype t, float v) {
    return t == DT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : t == DT_F16 ? f16_to_f32(f32_to_f16(v)) : v;
}

/* w[j, i] = T(w + T(sum_q T32(scale * b[j, q]) * a[q, i])): mlx's float32 product of
 * (scale * lora_b.T) and lora_a.T, summed over the rank in order, then the cast and the add
 * in T (each a float32 operation rounded to T). No fused multiply-add: mlx's float32 matmul
 * rounds each product. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static int add_delta(const op_lora *l, int64_t n, int64_t k, tensor_dtype t, float *w) {
    float *sb = malloc((size_t)l->rank * sizeof *sb);
    if (!sb) return -1;
    for (int64_t j = 0; j < n; j++) {
        for (int q = 0; q < l->rank; q++) sb[q] = l->scale * l->b[(size_t)q * n + j]; /* B is [rank, n] */
        for (int64_t i = 0; i < k; i++) {
            float d = 0.0f;
            for (int q = 0; q < l->rank; q++) d += sb[q] * l->a[(size_t)q * k + i];
            w[j * k + i] = round_to(t, w[j * k + i] + round_to(t, d));
        }
    }
    free(sb);
    return 0;
}

/* One output tensor: bytes to copy (src), or computed ones (owned). */
typedef struct fuse_out {
    const void *src;
    void *owned;
    size_t len;
} fuse_out;

static const tensor_info *sibling(const hearth_model *m, const char *weight_name, const char *suffix) {
    char name[600];
    snprintf(name, sizeof name, "%.*s%s", (int)(strlen(weight_name) - strlen(".weight")), weight_name, suffix);
    return st_set_find(&m->st, name);
}

/* The fused bytes of adapted weight t (and, quantized, its scales and biases: into outs of
 * those tensors, by_name indices is, ib). */
static hearth_status fuse_weight(const hearth_model *m, const tensor_info *t, const op_lora *l, fuse_out *ow,
                                 fuse_out *os, fuse_out *obias, hearth_error *err) {
    int bits, group;
    int64_t cols;
    int quant = model_mlx_quantized(m, t, &bits, &group, &cols);
    const tensor_info *scales = quant ? sibling(m, t->name, ".scales") : NULL;
    tensor_dtype dt = quant ? scales->dtype : t->dtype;
    if (!quant && dt != DT_F32 && dt != DT_F16 && dt != DT_BF16)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; fuse folds into float or MLX weights",
                       t->file, t->name, tensor_dtype_name(dt));
    float *w;
    size_t n;
    hearth_status st = hearth_model_tensor_f32(m, t->name, &w, &n, err);
    if (st) return st;
    /* rows: every dimension but the last (the experts' [E, n, k] is E n rows of k) */
    int64_t rows = 1;
    for (int d = 0; d + 1 < t->ndim; d++) rows *= t->shape[d];
    int64_t k = (int64_t)(n / (size_t)rows), per = l->experts ? rows / l->experts : rows;
    int bad = 0;
    for (int e = 0; e < (l->experts ? l->experts : 1) && !bad; e++) { /* expert e's pair on its rows */
        op_lora le = *l;
        le.a += (size_t)e * le.rank * k;
        le.b += (size_t)e * le.rank * per;
        bad = add_delta(&le, per, k, dt, w + (size_t)e * per * k);
    }
    if (bad) {
        hearth_free(w);
        return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory folding the adapter into '%s'", t->file, t->name);
    }
    size_t es = dt == DT_F32 ? 4 : 2;
    if (!quant) {
        ow->len = n * es;
        if (!(ow->owned = malloc(ow->len))) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        else if (dt == DT_F32) memcpy(ow->owned, w, ow->len);
        else
            for (size_t i = 0; i < n; i++)
                ((uint16_t *)ow->owned)[i] = dt == DT_BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
    } else {
        size_t ng = (size_t)rows * (size_t)(k / group);
        float *sb = malloc(2 * ng * sizeof *sb);
        ow->len = (size_t)rows * (size_t)k * (size_t)bits / 8;
        os->len = obias->len = ng * es;
        ow->owned = malloc(ow->len), os->owned = malloc(os->len), obias->owned = malloc(obias->len);
        if (!sb || !ow->owned || !os->owned || !obias->owned)
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        else {
            mlxq_quantize(w, rows, k, bits, group, ow->owned, sb, sb + ng);
            for (size_t i = 0; i < ng; i++)
                for (int h = 0; h < 2; h++) {
                    float v = sb[h * ng + i];
                    void *dst = h ? obias->owned : os->owned;
                    if (dt == DT_F32) ((float *)dst)[i] = v;
                    else ((uint16_t *)dst)[i] = dt == DT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
                }
        }
        free(sb);
    }
    hearth_free(w);
    return st;
}

/* Every tensor's output, in by_name order. */
static hearth_status plan(const hearth_model *m, const adapter *a, int n_layers, fuse_out *outs,
                          hearth_error *err) {
    size_t nt = m->st.n_tensors;
    int pairs = 0, fused = 0;
    for (size_t i = 0; i < (size_t)n_layers * OP_N_PROJ; i++) pairs += a->proj[i].a != NULL;
    for (size_t i = 0; i < nt; i++) outs[i] = (fuse_out){.src = m->st.by_name[i]->data, .len = m->st.by_name[i]->nbytes};
    for (size_t i = 0; i < nt; i++) {
        const tensor_info *t = m->st.by_name[i];
        const op_lora *l = pair_of(a, n_layers, t->name, ".weight");
        if (!l) continue;
        fuse_out none[2] = {{0}};
        fuse_out *os = &none[0], *ob = &none[1];
        for (size_t j = 0; j < nt; j++) { /* the quantized weight's scales and biases */
            if (m->st.by_name[j] == sibling(m, t->name, ".scales")) os = &outs[j];
            if (m->st.by_name[j] == sibling(m, t->name, ".biases")) ob = &outs[j];
        }
        hearth_status st = fuse_weight(m, t, l, &outs[i], os, ob, err);
        free(none[0].owned), free(none[1].owned);
        if (st) return st;
        fused++;
    }
    /* a pair whose weight the folder names otherwise (Hugging Face's fused expert tensors) */
    if (fused != pairs)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: %d of the adapter's %d pairs adapt weights this folder stores under other names (e.g. "
                       "Hugging Face's fused experts); fuse into the mlx-lm layout of the model",
                       m->entry.path, pairs - fused, pairs);
    return HEARTH_OK;
}

static hearth_status write_weights(const hearth_model *m, const fuse_out *outs, const char *fname, uint64_t *total,
                                   hearth_error *err) {
    size_t nt = m->st.n_tensors;
    st_out_tensor *hdr = calloc(nt ? nt : 1, sizeof *hdr);
    if (!hdr) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) {
        const tensor_info *t = m->st.by_name[i];
        hdr[i] = (st_out_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(hdr[i].shape, t->shape, sizeof hdr[i].shape);
    }
    FILE *f = fopen(fname, "wb");
    hearth_status st = f ? st_write_header(f, fname, hdr, nt, total, err)
                         : err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    for (size_t i = 0; !st && i < nt; i++)
        st = convert_write_all(f, outs[i].owned ? outs[i].owned : outs[i].src, outs[i].len, fname, err);
    if (f && fclose(f) && !st) st = err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    free(hdr);
    return st;
}

static hearth_status write_folder(const hearth_model *m, const fuse_out *outs, const char *dir, hearth_error *err) {
    char *weights = path_join(dir, "model.safetensors");
    uint64_t total = 0;
    hearth_status st = weights ? write_weights(m, outs, weights, &total, err)
                               : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) st = convert_write_json(dir, "config.json", m->config, err);
    if (!st) {
        json_t *index = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
        for (size_t i = 0; i < m->st.n_tensors; i++)
            json_object_set_new(json_object_get(index, "weight_map"), m->st.by_name[i]->name,
                                json_string("model.safetensors"));
        st = convert_write_json(dir, "model.safetensors.index.json", index, err);
        json_decref(index);
    }
    if (!st) st = convert_copy_side_files(m->entry.path, dir, err);
    free(weights);
    return st;
}

hearth_status hearth_fuse(const char *model_name, const char *adapter_path, const char *save_path,
                          hearth_error *err) {
    if (!save_path || !*save_path) return err_set(err, HEARTH_ERR_INVALID, "fuse: no --save-path");
    if (file_exists(save_path))
        return err_set(err, HEARTH_ERR_INVALID, "%s: already exists; fuse writes a new folder", save_path);
    hearth_model *m = NULL;
    model *plan_m = NULL;
    adapter *a = NULL;
    fuse_out *outs = NULL;
    hearth_status st = hearth_model_open(model_name, &m, err);
    if (!st && m->entry.format != MODEL_FORMAT_DIR)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: fuse writes safetensors folders; a GGUF base is not done yet",
                     m->entry.path);
    if (!st) st = model_plan(m, 0, &plan_m, err); /* the shapes the adapter is checked against */
    if (!st) st = adapter_load(plan_m, adapter_path, &a, err);
    if (!st && a->dora)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: fusing a DoRA adapter is not done yet (LoRA only)",
                     adapter_path);
    if (!st && !(outs = calloc(m->st.n_tensors ? m->st.n_tensors : 1, sizeof *outs)))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) st = plan(m, a, plan_m->cfg.n_layers, outs, err);
    int made = 0;
    if (!st && mkdir(save_path, 0755)) st = err_set(err, HEARTH_ERR_IO, "%s: %s", save_path, strerror(errno));
    else if (!st) made = 1;
    if (!st) st = write_folder(m, outs, save_path, err);
    if (st && made) nftw(save_path, convert_remove_entry, 8, FTW_DEPTH | FTW_PHYS); /* no half-written folder */
    for (size_t i = 0; outs && i < m->st.n_tensors; i++) free(outs[i].owned);
    free(outs);
    adapter_free(a);
    model_free(plan_m);
    hearth_model_close(m);
    return st;
}
