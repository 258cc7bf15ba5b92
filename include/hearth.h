/* hearth.h: the public C API of libhearth, a local LLM runtime.
 * Everything a consumer (the CLI, the server, an embedding app) may call lives here;
 * internal structs stay opaque. Functions that can fail return a hearth_status and
 * fill a caller-owned hearth_error with a message a user can act on. */
#ifndef HEARTH_H
#define HEARTH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HEARTH_VERSION "0.1.0"

typedef enum hearth_status {
    HEARTH_OK = 0,
    HEARTH_ERR_IO,          /* a file could not be opened or read */
    HEARTH_ERR_FORMAT,      /* a file or input is malformed */
    HEARTH_ERR_UNSUPPORTED, /* valid, but not something hearth handles (yet) */
    HEARTH_ERR_NOT_FOUND,   /* a model, tensor or key does not exist */
    HEARTH_ERR_AMBIGUOUS,   /* a short model name matched several models */
    HEARTH_ERR_INVALID,     /* bad argument from the caller */
    HEARTH_ERR_NOMEM,       /* out of memory */
    HEARTH_ERR_TEMPLATE,    /* a chat template failed to render (incl. raise_exception) */
} hearth_status;

typedef struct hearth_error {
    hearth_status status;
    char message[1024];
} hearth_error;

/* Frees memory returned by any hearth_* function (strings, id arrays). */
void hearth_free(void *p);
const char *hearth_status_name(hearth_status s);

/* ---- models ------------------------------------------------------------ */

typedef struct hearth_model hearth_model;

/* Opens a model without loading weights for compute: parses config.json or GGUF
 * metadata, maps the tensor index, loads the tokenizer and chat template.
 * name_or_path: a model folder, a .gguf file, a Hugging Face repo id present in the
 * HF cache (org/name), or an unambiguous substring of a known model's name
 * (searched in the HF cache and in the folders listed in $HEARTH_MODELS). */
hearth_status hearth_model_open(const char *name_or_path, hearth_model **out, hearth_error *err);
void hearth_model_close(hearth_model *m);

/* A JSON object describing the model: architecture, sizes, quantization, tokenizer,
 * chat template, files. Caller frees with hearth_free. */
char *hearth_model_info_json(const hearth_model *m);
/* The resolved path of the model (folder or .gguf file). */
const char *hearth_model_path(const hearth_model *m);

/* The model's tensors as a JSON array of {name, dtype, shape, bytes}; MLX-quantized
 * weights also carry {"bits", "group_size"} and their logical (unpacked) shape. */
char *hearth_model_tensors_json(const hearth_model *m);
/* Dequantizes one tensor to float32 (caller frees *data with hearth_free). */
hearth_status hearth_model_tensor_f32(const hearth_model *m, const char *name, float **data, size_t *n_elems,
                                      hearth_error *err);

/* Lists every model hearth can find, as a JSON array of {name, path, format}. */
char *hearth_model_list_json(void);

/* ---- tokenizer --------------------------------------------------------- */

/* Encodes UTF-8 text to token ids. add_special: add BOS/EOS etc. the way the
 * tokenizer's post-processor does; special-token strings inside the text are
 * recognised either way. *ids is allocated; caller frees with hearth_free. */
hearth_status hearth_tokenize(const hearth_model *m, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids, hearth_error *err);
/* Decodes ids to UTF-8 text (NUL-terminated, caller frees). skip_special drops
 * special tokens from the output. */
hearth_status hearth_detokenize(const hearth_model *m, const int32_t *ids, size_t n_ids, int skip_special,
                                char **text, hearth_error *err);

/* Incremental decoding for streaming: feed one id at a time, receive the text that
 * became final. Never emits a broken UTF-8 sequence. */
typedef struct hearth_detok_stream hearth_detok_stream;
hearth_detok_stream *hearth_detok_stream_new(const hearth_model *m, int skip_special);
/* Returns the newly final text (valid until the next call), possibly "". */
const char *hearth_detok_stream_push(hearth_detok_stream *s, int32_t id);
/* Flushes what is held back at the end of generation. */
const char *hearth_detok_stream_finish(hearth_detok_stream *s);
void hearth_detok_stream_free(hearth_detok_stream *s);

int32_t hearth_vocab_size(const hearth_model *m);
/* The id of a token string or -1. */
int32_t hearth_token_id(const hearth_model *m, const char *token);

/* ---- chat templates ---------------------------------------------------- */

/* Renders the model's chat template. messages_json: a JSON array of OpenAI-style
 * messages; tools_json: a JSON array of tools or NULL; extra_json: a JSON object of
 * extra template variables (e.g. {"enable_thinking": false}) or NULL.
 * Caller frees *out with hearth_free. */
hearth_status hearth_chat_render(const hearth_model *m, const char *messages_json, const char *tools_json,
                                 int add_generation_prompt, const char *extra_json, char **out,
                                 hearth_error *err);

/* Replaces the model's chat template (e.g. from --chat-template); NULL restores none. */
hearth_status hearth_model_set_chat_template(hearth_model *m, const char *template_src, hearth_error *err);

/* Renders an arbitrary template source with a JSON context object (for tests and
 * --chat-template overrides). */
hearth_status hearth_template_render(const char *template_src, const char *context_json, char **out,
                                     hearth_error *err);

#ifdef __cplusplus
}
#endif
#endif
