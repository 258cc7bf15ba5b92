/* tokenizer.h: text <-> token ids. Loads HF tokenizer.json (byte-level BPE,
 * SentencePiece-style BPE with byte fallback, WordPiece; normalizers, pre-tokenizers,
 * post-processors, decoders, added tokens) and GGUF vocabularies (gpt2, llama).
 * Output ids are identical to HF `tokenizers`. */
#ifndef HEARTH_TOK_TOKENIZER_H
#define HEARTH_TOK_TOKENIZER_H
#include "hearth.h"
#include "io/gguf.h"

typedef struct tok_tokenizer tok_tokenizer;

/* tokenizer.json text; config_json (tokenizer_config.json text, may be NULL) supplies
 * add_bos_token/add_eos_token and special token names where the model sets them. */
hearth_status tok_load_hf_json(const char *json, size_t len, const char *config_json, const char *fname,
                               tok_tokenizer **out, hearth_error *err);
/* tokenizer.json (+ tokenizer_config.json if present) from a model folder. */
hearth_status tok_load_hf_dir(const char *dir, tok_tokenizer **out, hearth_error *err);
hearth_status tok_load_gguf(const gguf_file *g, tok_tokenizer **out, hearth_error *err);
void tok_free(tok_tokenizer *t);

hearth_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                         size_t *n_ids, hearth_error *err);
hearth_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                         hearth_error *err);

int32_t tok_vocab_size(const tok_tokenizer *t);
int32_t tok_token_id(const tok_tokenizer *t, const char *token); /* -1 if absent */
const char *tok_token_str(const tok_tokenizer *t, int32_t id);   /* vocab string or NULL */
int tok_is_special(const tok_tokenizer *t, int32_t id);
int32_t tok_bos_id(const tok_tokenizer *t); /* -1 if none */
int32_t tok_eos_id(const tok_tokenizer *t); /* -1 if none */
/* "bpe-byte-level", "bpe-sentencepiece", "wordpiece" */
const char *tok_kind(const tok_tokenizer *t);
/* The tokenizer.ggml.pre name under which tok_gguf splits text with split_regex (a
 * tokenizer.json Split pattern followed by a regex-free ByteLevel), or "gpt-2" for NULL (a
 * ByteLevel pre-tokenizer with its own regex); NULL when no name gives that split. */
const char *tok_gguf_pre_name(const char *split_regex);
/* The tokenizer.ggml.pre name of a pre-tokenizer that isolates every numeric character and then
 * splits as GPT-2 (HF's Sequence of Digits(individual_digits) and ByteLevel): "smollm". */
const char *tok_gguf_pre_digits_name(void);
/* The bytes one token stands for inside a longer text (a byte-level BPE symbol mapped
 * back to its byte, SentencePiece's U+2581 as a space, <0xNN> as that byte): what a
 * grammar matches a token against. Returns the length (at most cap bytes are written),
 * or -1 for an unknown id. */
int tok_token_bytes(const tok_tokenizer *t, int32_t id, char *buf, size_t cap);

/* Streaming decode: never returns a broken UTF-8 sequence. */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tok_tokenizer *t, int skip_special);
const char *tok_stream_push(tok_stream *s, int32_t id);
const char *tok_stream_finish(tok_stream *s);
void tok_stream_free(tok_stream *s);
#endif
