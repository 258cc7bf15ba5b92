/* model_handle.h: the hearth_model struct behind the opaque public handle: what opening a
 * model reads (config, tensor catalog, tokenizer, chat templates) and its summary. Below the
 * engine and the API, so the loader (model/), the engine and api/ share it. */
#ifndef HEARTH_MODEL_MODEL_HANDLE_H
#define HEARTH_MODEL_MODEL_HANDLE_H
#include "hearth.h"
#include "io/gguf.h"
#include "io/mlx_quant.h"
#include "io/resolve.h"
#include "io/safetensors.h"
#include "tok/tokenizer.h"
#include <jansson.h>

typedef struct model_summary {
    char architecture[64];   /* model_type / general.architecture */
    int64_t hidden_size, n_layers, n_heads, n_kv_heads, head_dim, intermediate_size;
    int64_t vocab_size, context_length;
    double rope_theta;
    int tie_word_embeddings;
    uint64_t n_params, tensor_bytes;
} model_summary;

struct hearth_model {
    model_entry entry;
    json_t *config, *generation_config, *tokenizer_config; /* NULL when absent */
    st_set st;      /* MODEL_FORMAT_DIR */
    gguf_file gguf; /* MODEL_FORMAT_GGUF */
    mlxq_config quant;
    tok_tokenizer *tok;
    char tok_error[1024];               /* why the tokenizer did not load, if it did not */
    char *chat_template;               /* default template or NULL */
    char *chat_template_tool_use;      /* named "tool_use" template or NULL */
    const char *chat_template_source;  /* where it came from, for info */
    char *bos_token, *eos_token;       /* strings handed to templates */
    model_summary sum;
};

/* Fills m->sum from config.json / GGUF metadata and checks tensor shapes against it. */
hearth_status model_summarize(hearth_model *m, hearth_error *err);
/* Looks up a tensor by name in whichever format the model has. */
const tensor_info *model_find_tensor(const hearth_model *m, const char *name);
/* The model's tensors in file order, whichever the format. */
size_t model_tensor_count(const hearth_model *m);
const tensor_info *model_tensor_at(const hearth_model *m, size_t i);
/* For an MLX-quantized weight (uint32 with a .scales sibling) gives bits/group and the
 * logical column count; returns 0 for anything else. */
int model_mlx_quantized(const hearth_model *m, const tensor_info *t, int *bits, int *group, int64_t *cols);
#endif
