/* convert_gguf.c: hearth_convert's GGUF output: one .gguf file from a float safetensors
 * folder, named and described the way llama.cpp's convert_hf_to_gguf.py writes it
 * (tensor names, hyperparameters, the byte-level BPE vocabulary with merges, token types,
 * the chat template), 2-D weights in the chosen type (io/ggml_quant.c's reference
 * quantizers, each tensor split over a thread pool; for the K-quant file types llama.cpp's
 * per-tensor type choice), everything else F32. Families: qwen3 and llama (others refused
 * by name). */
#define _GNU_SOURCE
#include "api/convert_internal.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "io/ggml_quant.h"
#include "io/gguf_write.h"
#include "tok/tokenizer.h"
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* HF module names -> GGUF names inside blk.N (llama.cpp's tensor map for these families) */
static const char *const layer_names[][2] = {
    {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"},
    {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

/* The GGUF name of an HF tensor, or 0 when it has none here. */
static int gguf_name(const char *hf, char *out, size_t cap) {
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, cap, "token_embd.weight") > 0;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, cap, "output_norm.weight") > 0;
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, cap, "output.weight") > 0;
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || !used) return 0;
    const char *rest = hf + used;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        size_t n = strlen(layer_names[i][0]);
        if (!strncmp(rest, layer_names[i][0], n) && rest[n] == '.')
            return snprintf(out, cap, "blk.%d.%s%s", layer, layer_names[i][1], rest + n) > 0;
    }
    return 0;
}

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) of an output type */
static uint32_t file_type_of(tensor_dtype dt) {
    switch (dt) {
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 15; /* the Q4_K_M mix (the only Q4_K output) */
    case DT_Q6_K: return 18;
    case DT_BF16: return 32;
    default: return 0;
    }
}

/* From the model's summary (config.json as the loader read it); the norm epsilon is not
 * in the summary, so it comes from config.json directly. */
static void put_hparams(gguf_out *g, const hearth_model *m, const char *arch, tensor_dtype dt) {
    const model_summary *s = &m->sum;
    char key[128];
    gguf_out_str(g, "general.architecture", arch);
    gguf_out_u32(g, "general.file_type", file_type_of(dt));
    if (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16) gguf_out_u32(g, "general.quantization_version", 2);
    const struct {
        const char *suffix;
        int64_t value;
    } ints[] = {
        {"block_count", s->n_layers},          {"context_length", s->context_length},
        {"embedding_length", s->hidden_size},  {"feed_forward_length", s->intermediate_size},
        {"attention.head_count", s->n_heads},  {"attention.head_count_kv", s->n_kv_heads},
        {"attention.key_length", s->head_dim}, {"attention.value_length", s->head_dim},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, ints[i].suffix);
        gguf_out_u32(g, key, (uint32_t)ints[i].value);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    gguf_out_f32(g, key, (float)s->rope_theta);
    const json_t *eps = json_object_get(m->config, "rms_norm_eps");
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_out_f32(g, key, json_is_number(eps) ? (float)json_number_value(eps) : 1e-6f);
}

/* The byte-level BPE vocabulary of tokenizer.json: tokens by id (ids the file does not
 * name, up to the config's vocab_size, become "[PAD<id>]" of type unused, as llama.cpp
 * pads), token types (1 normal, 3 control for special added tokens, 4 user-defined for
 * the other added ones, 5 unused), merges as "a b". */
/* tokenizer.ggml.pre for a tokenizer.json pre-tokenizer: ByteLevel with its regex ("gpt-2"),
 * a Sequence of one Split regex and a regex-free ByteLevel (the name whose split is that
 * regex), or of Digits(individual) and ByteLevel with its regex ("smollm"); NULL for anything else. The family's name alone is not enough: SmolLM2 is a llama
 * whose tokenizer splits as GPT-2 does, and "llama-bpe" tokenized its text differently. */
static const char *gguf_pre(const json_t *tj) {
    const json_t *pt = json_object_get(tj, "pre_tokenizer");
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        const json_t *re = json_object_get(pt, "use_regex");
        return !re || json_is_true(re) ? tok_gguf_pre_name(NULL) : NULL;
    }
    const json_t *kids = json_object_get(pt, "pretokenizers");
    if (!type || strcmp(type, "Sequence") || json_array_size(kids) != 2) return NULL;
    const json_t *split = json_array_get(kids, 0), *bl = json_array_get(kids, 1);
    const char *st = json_string_value(json_object_get(split, "type")), *bt = json_string_value(json_object_get(bl, "type"));
    const json_t *bre = json_object_get(bl, "use_regex"), *bpre = json_object_get(bl, "add_prefix_space");
    if (st && !strcmp(st, "Digits") && json_is_true(json_object_get(split, "individual_digits")) && bt &&
        !strcmp(bt, "ByteLevel") && (!bre || json_is_true(bre)) && json_is_false(bpre))
        return tok_gguf_pre_digits_name(); /* SmolLM2's own tokenizer.json */
    const char *re = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    if (!st || strcmp(st, "Split") || !bt || strcmp(bt, "ByteLevel") || !re ||
        json_is_true(json_object_get(bl, "use_regex")))
        return NULL;
    return tok_gguf_pre_name(re);
}

static hearth_status put_vocab(gguf_out *g, const hearth_model *m, hearth_error *err) {
    char *path = path_join(m->entry.path, "tokenizer.json");
    json_error_t je;
    json_t *tj = path ? json_load_file(path, 0, &je) : NULL;
    const char *pre = gguf_pre(tj);
    const json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
    hearth_status st = HEARTH_OK;
    const char *kind = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(vocab) || !kind || strcmp(kind, "BPE"))
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: GGUF output needs a BPE tokenizer.json", path ? path : "");
    else if (!pre)
        st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                     "%s: GGUF output: the pre-tokenizer is neither ByteLevel nor one split regex that a "
                     "tokenizer.ggml.pre name gives (llama-bpe, qwen2, gpt-4o, tekken)",
                     path);
    size_t n = m->sum.vocab_size > 0 ? (size_t)m->sum.vocab_size : 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) if (json_integer_value(v) >= (json_int_t)n) n =
        json_integer_value(v) + 1;
    const json_t *added = json_object_get(tj, "added_tokens");
    size_t i;
    json_array_foreach(added, i, v) if (json_integer_value(json_object_get(v, "id")) >= (json_int_t)n) n =
        json_integer_value(json_object_get(v, "id")) + 1;
    char **tokens = calloc(n ? n : 1, sizeof *tokens);
    int32_t *types = calloc(n ? n : 1, sizeof *types);
    if (!st && (!tokens || !types)) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory for the vocabulary");
    if (!st) {
        json_object_foreach((json_t *)vocab, key, v) {
            json_int_t id = json_integer_value(v);
            if (id >= 0 && (size_t)id < n && !tokens[id]) tokens[id] = strdup(key), types[id] = 1;
        }
        json_array_foreach(added, i, v) {
            json_int_t id = json_integer_value(json_object_get(v, "id"));
            const char *content = json_string_value(json_object_get(v, "content"));
            if (id < 0 || (size_t)id >= n || !content) continue;
            free(tokens[id]);
            tokens[id] = strdup(content);
            types[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
        }
        for (size_t t = 0; t < n; t++)
            if (!tokens[t] && asprintf(&tokens[t], "[PAD%zu]", t) >= 0) types[t] = 5;
        const json_t *merges = json_object_get(model, "merges");
        size_t nm = json_array_size(merges);
        char **ms = calloc(nm ? nm : 1, sizeof *ms);
        for (size_t k = 0; ms && k < nm; k++) {
            const json_t *e = json_array_get(merges, k);
            if (json_is_string(e))
                ms[k] = strdup(json_string_value(e));
            else if (!json_is_string(json_array_get(e, 0)) || !json_is_string(json_array_get(e, 1)) ||
                     asprintf(&ms[k], "%s %s", json_string_value(json_array_get(e, 0)),
                              json_string_value(json_array_get(e, 1))) < 0)
                ms[k] = NULL;
        }
        int whole = ms != NULL;
        for (size_t t = 0; whole && t < n; t++) whole = tokens[t] != NULL;
        for (size_t k = 0; whole && k < nm; k++) whole = ms[k] != NULL;
        if (!whole)
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory for the vocabulary");
        else {
            gguf_out_str(g, "tokenizer.ggml.model", "gpt2");
            gguf_out_str(g, "tokenizer.ggml.pre", pre);
            gguf_out_strs(g, "tokenizer.ggml.tokens", (const char *const *)tokens, n);
            gguf_out_i32s(g, "tokenizer.ggml.token_type", types, n);
            gguf_out_strs(g, "tokenizer.ggml.merges", (const char *const *)ms, nm);
        }
        for (size_t k = 0; ms && k < nm; k++) free(ms[k]);
        free(ms);
    }
    for (size_t t = 0; tokens && t < n; t++) free(tokens[t]);
    free(tokens);
    free(types);
    json_decref(tj);
    free(path);
    return st;
}

/* Special tokens as the tokenizer itself uses them: EOS from tokenizer_config's eos_token,
 * BOS (and whether it is added) from what encoding an empty text with specials gives. */
static void put_specials(gguf_out *g, hearth_model *m) {
    int32_t eos = m->eos_token ? hearth_token_id(m, m->eos_token) : -1;
    if (eos >= 0) gguf_out_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    int32_t *ids = NULL;
    size_t n = 0;
    hearth_error e = {0};
    int add_bos = 0;
    if (!hearth_tokenize(m, "", 0, 1, &ids, &n, &e) && n > 0 && ids[0] != eos) {
        gguf_out_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)ids[0]);
        add_bos = 1;
    }
    hearth_free(ids);
    gguf_out_bool(g, "tokenizer.ggml.add_bos_token", add_bos);
    if (m->chat_template) gguf_out_str(g, "tokenizer.chat_template", m->chat_template);
}

/* The families written, and whether llama.cpp's converter
 * permutes q/k rows (HF's rotate-half RoPE layout to ggml's adjacent pairs). */
typedef struct gguf_family {
    const char *model_type;
    int permute_qk;
} gguf_family;
static const gguf_family families[] = {{"qwen3", 0}, {"llama", 1}};

typedef struct gguf_item {
    const tensor_info *src; /* NULL: a generated tensor (data) */
    const float *data;
    tensor_dtype dt;
    uint64_t nbytes;
    int permute_heads; /* > 0: q/k rows of this many heads to permute */
} gguf_item;

/* llama.cpp's LlamaModel.permute: rows (heads, 2, half, cols) -> (heads, half, 2, cols). */
static void permute_rows(const float *in, float *out, int64_t rows, int64_t cols, int heads) {
    int64_t half = rows / heads / 2;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(out + ((h * half + i) * 2 + j) * cols, in + ((h * 2 + j) * half + i) * cols,
                       (size_t)cols * sizeof *out);
}

/* Llama 3's RoPE scaling as llama.cpp stores it: one divisor per frequency (the
 * rope_freqs tensor), from config.json's rope_scaling. NULL when there is none. */
static float *llama3_rope_factors(const hearth_model *m) {
    const json_t *rs = json_object_get(m->config, "rope_scaling");
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!type || strcmp(type, "llama3")) return NULL;
    const json_t *v;
    double factor = json_is_number(v = json_object_get(rs, "factor")) ? json_number_value(v) : 8.0;
    double lo = json_is_number(v = json_object_get(rs, "low_freq_factor")) ? json_number_value(v) : 1.0;
    double hi = json_is_number(v = json_object_get(rs, "high_freq_factor")) ? json_number_value(v) : 4.0;
    double old =
        json_is_number(v = json_object_get(rs, "original_max_position_embeddings")) ? json_number_value(v) : 8192.0;
    int dim = (int)m->sum.head_dim;
    float *f = malloc((size_t)(dim / 2) * sizeof *f);
    for (int i = 0; f && i < dim / 2; i++) {
        float freq = 1.0f / powf((float)m->sum.rope_theta, (float)(2 * i) / (float)dim);
        double wavelen = 2 * M_PI / freq;
        if (wavelen < old / hi)
            f[i] = 1.0f;
        else if (wavelen > old / lo)
            f[i] = (float)factor;
        else {
            double smooth = (old / wavelen - lo) / (hi - lo);
            f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
    return f;
}

/* One tensor's quantization split over the pool: blocks are independent, so any split gives
 * the same bytes. A task is a run of whole blocks; the first failing task's error wins. */
typedef struct quant_job {
    tensor_dtype dt;
    const float *x;
    uint8_t *out;
    uint64_t blocks, blocks_per_task;
    hearth_status st;
    hearth_error err;
} quant_job;

static void quant_task(void *ctx, int task, int thread) {
    (void)thread;
    quant_job *j = ctx;
    uint64_t first = (uint64_t)task * j->blocks_per_task, n = j->blocks - first;
    if (n > j->blocks_per_task) n = j->blocks_per_task;
    uint64_t be = (uint64_t)tensor_dtype_block_elems(j->dt), bb = tensor_dtype_nbytes(j->dt, be);
    hearth_error e = {0};
    hearth_status st = ggml_quantize(j->dt, j->x + first * be, n * be, j->out + first * bb, n * bb, &e);
    if (st && __atomic_exchange_n(&j->st, st, __ATOMIC_ACQ_REL) == HEARTH_OK) j->err = e;
}

static hearth_status quantize_parallel(threadpool *tp, tensor_dtype dt, const float *x, uint64_t n, void *out,
                                       uint64_t nbytes, hearth_error *err) {
    uint64_t be = (uint64_t)tensor_dtype_block_elems(dt);
    if (tp_threads(tp) < 2 || n % be || nbytes < tensor_dtype_nbytes(dt, n) || n / be < 64)
        return ggml_quantize(dt, x, n, out, nbytes, err);
    /* a few tasks per thread so a slow core does not hold the rest up */
    uint64_t blocks = n / be, tasks = (uint64_t)tp_threads(tp) * 4;
    quant_job j = {.dt = dt, .x = x, .out = out, .blocks = blocks, .blocks_per_task = (blocks + tasks - 1) / tasks};
    tp_run(tp, (int)((blocks + j.blocks_per_task - 1) / j.blocks_per_task), quant_task, &j);
    if (j.st) *err = j.err;
    return j.st;
}

/* The file is written by a thread of its own, one tensor behind: while tensor i goes to the
 * file, tensor i+1 is read, converted to float and quantized (reading and writing were
 * single-threaded phases that left a core idle). One buffer in flight. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    FILE *f;
    const char *fname;
    void *buf; /* the tensor waiting to be written (freed by the writer); NULL: none */
    uint64_t n;
    int quit;
    hearth_status st; /* the first write error */
    hearth_error err;
} tensor_writer;

static void *writer_main(void *arg) {
    tensor_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->buf && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->buf) break;
        void *buf = w->buf;
        uint64_t n = w->n;
        pthread_mutex_unlock(&w->mu);
        hearth_error e = {0};
        hearth_status st = fwrite(buf, 1, n, w->f) == n ? HEARTH_OK
                                                        : err_set(&e, HEARTH_ERR_IO, "%s: %s", w->fname, strerror(errno));
        if (!st) st = gguf_out_pad(w->f, n, w->fname, &e);
        free(buf);
        pthread_mutex_lock(&w->mu);
        if (st && !w->st) w->st = st, w->err = e;
        w->buf = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Hands buf (n bytes; the writer frees it) over once the previous tensor is written; the
 * first write error so far, if any (then buf is freed here). */
static hearth_status writer_put(tensor_writer *w, void *buf, uint64_t n, hearth_error *err) {
    pthread_mutex_lock(&w->mu);
    while (w->buf) pthread_cond_wait(&w->cv, &w->mu);
    hearth_status st = w->st;
    if (st) {
        if (err) *err = w->err;
        free(buf);
    } else {
        w->buf = buf, w->n = n;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* Waits for the last tensor, stops the thread; its first error, if any. */
static hearth_status writer_finish(tensor_writer *w, pthread_t th, hearth_error *err) {
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(th, NULL);
    if (w->st && err) *err = w->err;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->st;
}

static hearth_status write_tensor(const hearth_model *m, const gguf_item *it, threadpool *tp, tensor_writer *wr,
                                  hearth_error *err) {
    float *w = NULL;
    size_t n = it->src ? 0 : it->nbytes / sizeof(float);
    const char *name = it->src ? it->src->name : "rope_freqs.weight";
    hearth_status st = it->src ? hearth_model_tensor_f32(m, name, &w, &n, err) : HEARTH_OK;
    const float *x = it->src ? w : it->data;
    float *permuted = NULL;
    if (!st && it->permute_heads) {
        if (!(permuted = malloc(n * sizeof *permuted)))
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory converting '%s'", name);
        else
            permute_rows(w, permuted, it->src->shape[0], it->src->shape[1], it->permute_heads);
        x = permuted;
    }
    void *out = st ? NULL : malloc(it->nbytes);
    if (!st && !out) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory converting '%s'", name);
    if (!st) st = quantize_parallel(tp, it->dt, x, n, out, it->nbytes, err);
    hearth_free(w);
    free(permuted);
    if (st) {
        free(out);
        return st;
    }
    return writer_put(wr, out, it->nbytes, err);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third in
 * between get the larger type in the _M mixes. */
static int use_more_bits(int layer, int n_layers) {
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

/* The type of a 2-D weight (GGUF name, cols per row) for a k-quant output type, as
 * llama.cpp's llama_model_quantize picks it without an importance matrix: the output
 * matrix (or the token embedding when it is tied to the output) in Q6_K, Q8_0 when its
 * rows do not hold whole 256-blocks; for Q4_K_M (base Q4_K) also attn_v and ffn_down of
 * the use_more_bits layers in Q6_K; then a row that does not hold whole blocks falls back
 * to Q5_0 (from Q4_K) or Q8_0 (from Q6_K), and F16 when even 32 does not divide it.
 * llama.cpp counts attn_v and ffn_down tensors in (layer, name) order, one per layer
 * here, so the count is the layer number. */
static tensor_dtype kquant_type(const char *name, int64_t cols, tensor_dtype base, int tied, int n_layers) {
    tensor_dtype t = base;
    int layer = -1;
    sscanf(name, "blk.%d.", &layer);
    if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight")))
        return cols % 256 ? DT_Q8_0 : DT_Q6_K;
    if (base == DT_Q4_K && layer >= 0 && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) &&
        use_more_bits(layer, n_layers))
        t = DT_Q6_K;
    if (cols % 256) t = t == DT_Q4_K ? DT_Q5_0 : DT_Q8_0;
    return cols % 32 ? DT_F16 : t;
}

hearth_status convert_to_gguf(hearth_model *m, const hearth_convert_options *o, tensor_dtype dt, hearth_error *err) {
    const char *arch = json_string_value(json_object_get(m->config, "model_type"));
    const gguf_family *fam = NULL;
    for (size_t i = 0; arch && i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(arch, families[i].model_type)) fam = &families[i];
    if (!fam)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: GGUF output supports qwen3 and llama so far, not '%s'",
                       m->entry.path, arch ? arch : "?");
    gguf_out g;
    gguf_out_init(&g);
    put_hparams(&g, m, arch, dt);
    hearth_status st = put_vocab(&g, m, err);
    if (!st) put_specials(&g, m);
    gguf_item *items = calloc(m->st.n_tensors + 1, sizeof *items);
    size_t n_items = 0;
    if (!st && !items) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    float *rope = fam->permute_qk ? llama3_rope_factors(m) : NULL;
    if (!st && rope) {
        int64_t shape[1] = {m->sum.head_dim / 2};
        uint64_t nb = gguf_out_tensor(&g, "rope_freqs.weight", DT_F32, 1, shape);
        items[n_items++] = (gguf_item){.data = rope, .dt = DT_F32, .nbytes = nb};
    }
    int tied = 1; /* no output matrix: the token embedding is the output, as llama.cpp sees it */
    for (size_t i = 0; i < m->st.n_tensors; i++)
        if (!strcmp(m->st.by_name[i]->name, "lm_head.weight") && !convert_dropped(m, m->st.by_name[i])) tied = 0;
    int kquant = dt == DT_Q4_K || dt == DT_Q6_K;
    for (size_t i = 0; !st && i < m->st.n_tensors; i++) {
        const tensor_info *t = m->st.by_name[i];
        char name[256];
        if (convert_dropped(m, t)) continue;
        if (!gguf_name(t->name, name, sizeof name))
            st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF name here", t->file, t->name);
        else {
            /* weights take the chosen type where whole blocks fit a row (k-quants: llama.cpp's
             * per-tensor choice); norms stay F32 */
            tensor_dtype want = t->ndim != 2 ? DT_F32
                                : kquant     ? kquant_type(name, t->shape[1], dt, tied, (int)m->sum.n_layers)
                                : t->shape[1] % tensor_dtype_block_elems(dt) == 0 ? dt
                                                                                  : DT_F32;
            uint64_t nb = gguf_out_tensor(&g, name, want, t->ndim, t->shape);
            if (!nb) st = err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s' cannot be stored", t->file, t->name);
            int heads = !fam->permute_qk                                ? 0
                        : ends_with(t->name, "self_attn.q_proj.weight") ? (int)m->sum.n_heads
                        : ends_with(t->name, "self_attn.k_proj.weight") ? (int)m->sum.n_kv_heads
                                                                        : 0;
            items[n_items++] = (gguf_item){.src = t, .dt = want, .nbytes = nb, .permute_heads = heads};
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threadpool *tp = NULL;
    if (!st) st = tp_create(o->n_threads > 0 ? o->n_threads : cores > 0 ? (int)cores : 1, &tp, err);
    FILE *f = NULL;
    if (!st && !(f = fopen(o->out_dir, "wb"))) st = err_set(err, HEARTH_ERR_IO, "%s: %s", o->out_dir, strerror(errno));
    if (!st) st = gguf_out_write_header(&g, f, o->out_dir, err);
    tensor_writer wr = {.f = f, .fname = o->out_dir};
    pthread_t wth;
    int writing = 0;
    if (!st) {
        pthread_mutex_init(&wr.mu, NULL);
        pthread_cond_init(&wr.cv, NULL);
        if (pthread_create(&wth, NULL, writer_main, &wr))
            st = err_set(err, HEARTH_ERR_NOMEM, "cannot start the writer thread");
        else
            writing = 1;
    }
    for (size_t i = 0; !st && i < n_items; i++) {
        st = write_tensor(m, &items[i], tp, &wr, err);
        if (!st && o->progress)
            o->progress(o->user, i + 1, n_items, items[i].src ? items[i].src->name : "rope_freqs.weight");
    }
    if (writing) {
        hearth_error werr = {0};
        hearth_status ws = writer_finish(&wr, wth, &werr);
        if (ws && !st) {
            st = ws;
            if (err) *err = werr;
        }
    }
    if (f && fclose(f) && !st) st = err_set(err, HEARTH_ERR_IO, "%s: %s", o->out_dir, strerror(errno));
    struct stat sb; /* a failed file goes; a device or pipe named as --out is never unlinked */
    if (st && f && lstat(o->out_dir, &sb) == 0 && S_ISREG(sb.st_mode)) remove(o->out_dir);
    tp_destroy(tp);
    free(rope);
    free(items);
    gguf_out_free(&g);
    return st;
}
