/* model_internal.h: what the files of src/api/ share beyond the model handle
 * (model/model_handle.h). */
#ifndef HEARTH_API_MODEL_INTERNAL_H
#define HEARTH_API_MODEL_INTERNAL_H
#include "model/model_handle.h"

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
