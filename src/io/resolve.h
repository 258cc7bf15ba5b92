/* resolve.h: turns what a user typed (a folder, a .gguf file, an HF repo id, or a short
 * name) into the path of a model, by looking in the Hugging Face cache layout, the
 * folders in $HEARTH_MODELS and hearth's own model cache. Finds; never loads. */
#ifndef HEARTH_IO_RESOLVE_H
#define HEARTH_IO_RESOLVE_H
#include "hearth.h"
#include <stddef.h>

typedef enum model_format { MODEL_FORMAT_DIR, MODEL_FORMAT_GGUF } model_format;

typedef struct model_entry {
    char *name;  /* display name: "org/name" for HF repos, file or folder name otherwise */
    char *path;  /* folder (with config.json) or .gguf file */
    model_format format;
    const char *source; /* "hf-cache", "HEARTH_MODELS", "hearth-cache", "path" */
} model_entry;

typedef struct model_list { model_entry *items; size_t count, cap; } model_list;

/* Every model found in the search locations, sorted by name. */
void resolve_list_models(model_list *out);
void resolve_list_free(model_list *l);
/* Resolves a user's model argument. On success *out is filled (caller frees fields
 * with resolve_entry_free). Ambiguous or unknown names list the candidates. */
hearth_status resolve_model(const char *arg, model_entry *out, hearth_error *err);
void resolve_entry_free(model_entry *e);
/* The Hugging Face hub cache folder ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub). */
char *resolve_hf_cache_dir(void);
/* hearth's own cache ($HEARTH_CACHE or ~/.cache/hearth). */
char *resolve_hearth_cache_dir(void);
#endif
