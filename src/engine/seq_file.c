/* seq_file.c: hearth_seq_save / hearth_seq_load: one sequence's KV (and, for hybrid
 * models, its recurrent state) to a file and back, in kv_file.h's format, tied to the
 * model by engine_model_identity. Loading maps the file, checks it whole and copies the
 * rows into freshly reserved blocks; nothing is read before the checks pass. */
#define _GNU_SOURCE
#include "base/err.h"
#include "base/hash.h"
#include "base/file.h"
#include "engine/engine_internal.h"
#include "kv/kv_file.h"
#include "kv/kv_state.h"
#include "model/model_handle.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Recurrent state (hybrid models: the Gated DeltaNet layers' records in the pool's
 * kv_state, or its device copy: engine_state_rows) travels after the KV rows: the
 * sequence's record of every state layer. It is the state after all the saved tokens, so a
 * file with state is loaded whole or not at all. A file whose state size differs is refused
 * (check_shape). */
static uint64_t seq_state_bytes(const hearth_engine *e) {
    const kv_state *st = engine_kv((hearth_engine *)e)->state;
    return st ? (uint64_t)st->n_layers * st->layer_floats * sizeof(float) : 0;
}

/* Layers of different shapes (Gemma 4's sliding and full layers) are stored in the file's
 * uniform layout (the pool's largest KV heads x head_dim): each layer's rows padded with
 * zeros to the largest head_dim and its missing heads all zeros. Copies n rows of
 * `from` (elements of `from_row` bytes) into rows of `to_row` bytes, or back. */
static void repad(uint8_t *to, size_t to_row, const uint8_t *from, size_t from_row, int n) {
    size_t take = from_row < to_row ? from_row : to_row;
    for (int t = n - 1; t >= 0; t--) { /* backwards: to and from may be one buffer, to_row >= from_row */
        memmove(to + (size_t)t * to_row, from + (size_t)t * from_row, take);
        if (to_row > take) memset(to + (size_t)t * to_row + take, 0, to_row - take);
    }
}

/* A 64-bit name of the weights and config: the architecture, the sizes, every tensor's
 * name, type and shape, and up to 256 bytes from the middle of each tensor's data (two
 * models of one shape with different weights differ there; hashing every byte of a
 * multi-GB model would cost seconds per save). */
uint64_t engine_model_identity(const hearth_engine *e) {
    const hearth_model *hm = engine_model(e);
    const model_summary *s = &hm->sum;
    uint64_t h = FNV1A64_INIT;
    h = fnv1a64(h, s->architecture, strlen(s->architecture));
    int64_t dims[] = {s->hidden_size, s->n_layers,          s->n_heads,   s->n_kv_heads,
                      s->head_dim,    s->intermediate_size, s->vocab_size};
    h = fnv1a64(h, dims, sizeof dims);
    size_t n = model_tensor_count(hm);
    for (size_t i = 0; i < n; i++) {
        const tensor_info *t = model_tensor_at(hm, i);
        h = fnv1a64(h, t->name, strlen(t->name) + 1);
        h = fnv1a64(h, &t->dtype, sizeof t->dtype);
        h = fnv1a64(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (t->data && t->nbytes) {
            uint64_t take = t->nbytes < 256 ? t->nbytes : 256;
            h = fnv1a64(h, t->data + (t->nbytes - take) / 2, take);
        }
    }
    return h;
}

static kv_file_shape engine_shape(hearth_engine *e, int n_tokens) {
    const kv_cache *kv = engine_kv(e);
    return (kv_file_shape){.model_id = engine_model_identity(e),
                           .kv_quant = (uint32_t)kv->quant,
                           .n_layers = (uint32_t)kv->n_layers,
                           .n_kv_heads = (uint32_t)kv->n_kv_heads,
                           .head_dim = (uint32_t)kv->head_dim,
                           .n_tokens = (uint32_t)n_tokens,
                           .state_bytes = seq_state_bytes(e)};
}

static hearth_status check_seq(hearth_engine *e, int seq, const char *what, hearth_error *err) {
    if (!engine_seq_is_open(e, seq)) return err_set(err, HEARTH_ERR_INVALID, "%s: sequence %d is not open", what, seq);
    return HEARTH_OK;
}

hearth_status hearth_seq_save(hearth_engine *e, int seq, const char *path, hearth_error *err) {
    return engine_seq_save_n(e, seq, engine_seq_is_open(e, seq) ? engine_seq_length(e, seq) : 0, path, err);
}

hearth_status engine_seq_save_n(hearth_engine *e, int seq, int n, const char *path, hearth_error *err) {
    hearth_status st = check_seq(e, seq, path, err);
    if (st) return st;
    if (n > engine_seq_length(e, seq)) n = engine_seq_length(e, seq);
    if (n <= 0) return err_set(err, HEARTH_ERR_INVALID, "%s: sequence %d holds no tokens to save", path, seq);
    kv_cache *kv = engine_kv(e);
    kv_file_shape s = engine_shape(e, n);
    size_t row = (size_t)kv->head_dim * kv_elem_bytes(kv->quant), scaled = kv_quant_scaled(kv->quant);
    uint8_t *keys = malloc((size_t)n * row), *values = malloc((size_t)n * row);
    float *scales = scaled ? malloc(2 * (size_t)n * sizeof(float)) : NULL;
    uint8_t *state = s.state_bytes ? malloc(s.state_bytes) : NULL;
    char *tmp = NULL;
    if (!keys || !values || (scaled && !scales) || (s.state_bytes && !state) ||
        asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) {
        tmp = NULL;
        st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = err_set(err, HEARTH_ERR_IO, "%s: cannot create: %m", path); /* the user's name, not the temporary one */
        goto done;
    }
    kv_file_writer w;
    kv_file_begin(&w, f, &s);
    kv_file_put(&w, engine_history(e, seq), (size_t)n * sizeof(int32_t));
    for (int l = 0; l < kv->n_layers && !st; l++) {
        kv_cache view; /* the layer's own shape where layers differ */
        kv_layer_view(kv, l, &view);
        size_t vrow = (size_t)view.head_dim * kv_elem_bytes(kv->quant);
        for (int h = 0; h < kv->n_kv_heads && !st; h++) {
            if (h < view.n_kv_heads) {
                st = engine_kv_rows(e, l, seq, h, n, keys, values, scales, scales ? scales + n : NULL, 1, err);
                repad(keys, row, keys, vrow, n);
                repad(values, row, values, vrow, n);
            } else {
                memset(keys, 0, (size_t)n * row);
                memset(values, 0, (size_t)n * row);
                if (scales) memset(scales, 0, 2 * (size_t)n * sizeof(float));
            }
            kv_file_put(&w, keys, (size_t)n * row);
            kv_file_put(&w, values, (size_t)n * row);
            if (scales) kv_file_put(&w, scales, 2 * (size_t)n * sizeof(float));
        }
    }
    if (state && !st) st = engine_state_rows(e, seq, state, 1, err);
    if (state && !st) kv_file_put(&w, state, s.state_bytes);
    int bad = kv_file_end(&w);
    if (fclose(f)) bad = 1;
    if (st) { /* the device copy failed (its error is in err): no file */
        err_prefix(err, "%s", path);
        unlink(tmp);
    } else if (bad || rename(tmp, path)) {
        st = err_set(err, HEARTH_ERR_IO, "%s: cannot write the KV file (disk full or not writable?)", path);
        unlink(tmp);
    }
done:
    free(tmp);
    free(keys);
    free(values);
    free(scales);
    free(state);
    return st;
}

/* The file's layout must be the engine's: same weights, same KV format and shape. */
static hearth_status check_shape(hearth_engine *e, const kv_file_shape *got, const char *path, hearth_error *err) {
    kv_file_shape want = engine_shape(e, (int)got->n_tokens);
    if (got->model_id != want.model_id)
        return err_set(err, HEARTH_ERR_INVALID,
                       "%s: the KV file was saved with another model (identity %016llx, "
                       "this model is %016llx)",
                       path, (unsigned long long)got->model_id, (unsigned long long)want.model_id);
    if (got->kv_quant != want.kv_quant)
        return err_set(err, HEARTH_ERR_INVALID, "%s: the KV file stores --kv-quant %s, the engine uses %s", path,
                       hearth_kv_quant_name((int)got->kv_quant), hearth_kv_quant_name((int)want.kv_quant));
    if (got->n_layers != want.n_layers || got->n_kv_heads != want.n_kv_heads || got->head_dim != want.head_dim ||
        got->state_bytes != want.state_bytes)
        return err_set(err, HEARTH_ERR_INVALID,
                       "%s: the KV file's layout (%u layers, %u KV heads of %u, %llu state "
                       "bytes) is not the engine's",
                       path, got->n_layers, got->n_kv_heads, got->head_dim, (unsigned long long)got->state_bytes);
    return HEARTH_OK;
}

hearth_status hearth_seq_load(hearth_engine *e, int seq, const char *path, const int32_t *prompt, size_t n_prompt,
                              size_t *n_loaded, hearth_error *err) {
    if (n_loaded) *n_loaded = 0;
    hearth_status st = check_seq(e, seq, path, err);
    if (st) return st;
    if (engine_seq_length(e, seq) != 0)
        return err_set(err, HEARTH_ERR_INVALID, "%s: load into an empty sequence (sequence %d holds %d tokens)", path,
                       seq, engine_seq_length(e, seq));
    file_map fm;
    if ((st = file_map_open(path, &fm, err))) return st;
    kv_file_view v;
    st = kv_file_parse(fm.data, fm.size, path, &v, err);
    if (!st) st = check_shape(e, &v.shape, path, err);
    size_t n = v.shape.n_tokens;
    int32_t *tokens = st ? NULL : malloc(n * sizeof(int32_t));
    if (!st && !tokens) st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", path);
    if (!st) {
        memcpy(tokens, v.tokens_unaligned, n * sizeof(int32_t));
        if (prompt) { /* the longest common prefix, leaving the prompt's last token to compute */
            size_t k = 0;
            while (k < n && k + 1 < n_prompt && tokens[k] == prompt[k]) k++;
            n = k;
        }
        /* recurrent state is that of the whole file: it cannot be cut to a prefix */
        if (v.shape.state_bytes && n != v.shape.n_tokens) n = 0;
        if (n > (size_t)hearth_engine_context_length(e))
            st = err_set(err, HEARTH_ERR_INVALID, "%s: %zu saved tokens do not fit the context of %d", path, n,
                         hearth_engine_context_length(e));
    }
    kv_cache *kv = engine_kv(e);
    size_t row = (size_t)kv->head_dim * kv_elem_bytes(kv->quant);
    /* layers of different shapes: each layer's rows unpadded here before they enter the pool */
    int varied = kv->layer_heads != NULL && !st && n > 0;
    uint8_t *kbuf = varied ? malloc(n * row) : NULL, *vbuf = varied ? malloc(n * row) : NULL;
    if (varied && (!kbuf || !vbuf)) st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", path);
    if (!st && n > 0 && (st = kv_reserve(kv, seq, (int)n, err)))
        err_prefix(err, "%s", path);
    else if (!st && n > 0) {
        size_t all = v.shape.n_tokens, scale = kv_quant_scaled(kv->quant) ? all * sizeof(float) : 0;
        const uint8_t *p = v.kv;
        for (int l = 0; l < kv->n_layers && !st; l++) {
            kv_cache view; /* the layer's own shape where layers differ: rows unpadded */
            kv_layer_view(kv, l, &view);
            size_t vrow = (size_t)view.head_dim * kv_elem_bytes(kv->quant);
            for (int h = 0; h < kv->n_kv_heads && !st; h++, p += 2 * (all * row + scale)) {
                if (h >= view.n_kv_heads) continue;
                const float *ks = scale ? (const float *)(const void *)(p + 2 * all * row) : NULL;
                const uint8_t *pk = p, *pv = p + all * row;
                if (kbuf) { /* the file's rows are the largest head_dim wide */
                    for (size_t t = 0; t < n; t++) {
                        memcpy(kbuf + t * vrow, pk + t * row, vrow);
                        memcpy(vbuf + t * vrow, pv + t * row, vrow);
                    }
                    pk = kbuf, pv = vbuf;
                }
                /* the rows' bytes are only read: the mapping stays read-only */
                st = engine_kv_rows(e, l, seq, h, (int)n, (void *)pk, (void *)pv, (float *)ks,
                                    ks ? (float *)ks + all : NULL, 0, err);
            }
        }
        if (!st && v.shape.state_bytes) st = engine_state_rows(e, seq, (void *)v.state, 0, err);
        if (st) { /* a failed device copy: the reserved blocks go back, the sequence stays empty */
            err_prefix(err, "%s", path);
            kv_release(kv, seq);
        } else {
            engine_history_write(e, seq, tokens, (int)n);
            if (n_loaded) *n_loaded = n;
        }
    }
    free(kbuf);
    free(vbuf);
    free(tokens);
    file_map_close(&fm);
    return st;
}

size_t hearth_seq_length(const hearth_engine *e, int seq) {
    return engine_seq_is_open(e, seq) ? (size_t)engine_seq_length(e, seq) : 0;
}
