/* model_internal.h: the hearth_model struct behind the opaque public handle. Holds what
 * opening a model reads: config, tensor catalog, tokenizer, chat templates. Meant for
 * src/api/ only, but src/model and src/engine read it too (upward includes that a lower
 * model-handle header is to replace: docs/design.md, "Layers"). */
#ifndef HEARTH_API_MODEL_INTERNAL_H
#define HEARTH_API_MODEL_INTERNAL_H
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
/* embed.c: hearth_embed_tokenize on any tokenizer: tokenize(ctx, ...) tokenizes a text
 * with its special tokens (err may be NULL). At most max_tokens ids pass; a longer input
 * fails (HEARTH_ERR_INVALID) unless truncate, which keeps the leading ids and then the
 * trailing specials (those an empty text gets after its leading ones). Fuzzed with a
 * small tokenizer by tests/fuzz/fuzz_embeddings.c. */
typedef hearth_status (*embed_tokenize_fn)(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                                           hearth_error *err);
hearth_status embed_tokenize_fit(embed_tokenize_fn tokenize, const void *ctx, const char *text, size_t len,
                                 int max_tokens, int truncate, int32_t **ids, size_t *n_ids, hearth_error *err);
#endif
