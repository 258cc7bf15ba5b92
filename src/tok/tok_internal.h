/* tok_internal.h: the private structures of the tokenizer (vocabulary tables, merge
 * map, normalizer / pre-tokenizer / decoder trees, added tokens) shared by the
 * src/tok/tok_*.c files. Nothing outside src/tok/ may include it. */
#ifndef HEARTH_TOK_INTERNAL_H
#define HEARTH_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/err.h"
#include "base/sbuf.h"
#include "tok/tokenizer.h"
#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>

/* ---- a list of strings in one buffer (pieces, decoded tokens) ---------------------- */
typedef struct tok_strlist {
    sbuf text;
    size_t *off, *len;
    uint8_t *at_start; /* piece starts at offset 0 of the original text (Metaspace "first") */
    size_t n, cap;
} tok_strlist;
void tok_sl_init(tok_strlist *l);
void tok_sl_free(tok_strlist *l);
void tok_sl_reset(tok_strlist *l);
/* Appends a piece; returns 0 on allocation failure. */
int tok_sl_push(tok_strlist *l, const char *s, size_t n, int at_start);
static inline const char *tok_sl_str(const tok_strlist *l, size_t i) { return l->text.data + l->off[i]; }

/* ---- string -> id hash map (open addressing over an id table) ------------------ */
typedef struct tok_strmap {
    int32_t *slots; /* -1 = empty; else an id whose key lives in keys[id] */
    uint32_t cap;   /* power of two */
    char **keys;    /* not owned */
    uint32_t *key_lens;
} tok_strmap;
uint64_t tok_hash_bytes(const char *s, size_t n);
int tok_strmap_init(tok_strmap *m, size_t expected, char **keys, uint32_t *key_lens);
void tok_strmap_free(tok_strmap *m);
/* Maps keys[id] -> id; a later put of an equal key replaces the earlier id. */
void tok_strmap_put(tok_strmap *m, int32_t id);
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n);

/* ---- UTF-8 helpers --------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s (1-4), or 0 if invalid / truncated. */
int tok_utf8_len(const uint8_t *s, size_t avail);
/* Decodes the (valid) char at s; *n gets its length. */
int32_t tok_utf8_decode(const char *s, size_t avail, int *n);
int tok_utf8_encode(int32_t cp, char out[4]);
int tok_utf8_valid(const char *s, size_t n);
/* Rust-style lossy conversion: maximal invalid subparts become U+FFFD. */
void tok_utf8_lossy(sbuf *out, const char *s, size_t n);
int tok_is_whitespace(int32_t cp);  /* Unicode White_Space */
int tok_is_punctuation(int32_t cp); /* ASCII punctuation or general category P* */
int tok_is_alnum(int32_t cp);

/* Byte-level alphabet (GPT-2 bytes_to_unicode). */
extern int32_t tok_byte_to_cp[256];
int tok_cp_to_byte(int32_t cp); /* -1 if cp is not in the alphabet */
void tok_bytelevel_init(void);

/* ---- normalizers ----------------------------------------------------------------- */
typedef enum tok_norm_kind {
    TOK_NORM_SEQUENCE, TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP, TOK_NORM_STRIP_ACCENTS, TOK_NORM_REPLACE, TOK_NORM_PREPEND, TOK_NORM_BERT,
} tok_norm_kind;
typedef struct tok_norm {
    tok_norm_kind kind;
    struct tok_norm **kids;
    size_t n_kids;
    char *pattern, *content; /* Replace (pattern string or regex), Prepend (content) */
    pcre2_code *re;
    int left, right;                                    /* Strip */
    int clean_text, chinese, strip_accents, lowercase; /* Bert */
} tok_norm;
hearth_status tok_norm_parse(json_t *j, tok_norm **out, hearth_error *err);
void tok_norm_free(tok_norm *n);
/* Replaces *s with its normalized form (one heap string per call). */
int tok_norm_apply(const tok_norm *n, sbuf *s);

/* ---- regex helper shared by normalizer, pre-tokenizer and decoder --------------- */
pcre2_code *tok_regex_compile(const char *pattern, hearth_error *err);
/* Collects the match spans of re in s (non-empty only). Returns 0 on failure. */
int tok_regex_spans(const pcre2_code *re, const char *s, size_t n, size_t **spans, size_t *n_spans, size_t *cap);
/* The same with a caller-owned match block, for loops over many pieces. */
int tok_regex_spans_md(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t **spans,
                       size_t *n_spans, size_t *cap);

/* ---- pre-tokenizers -------------------------------------------------------------- */
typedef enum tok_pre_kind {
    TOK_PRE_SEQUENCE, TOK_PRE_BYTELEVEL, TOK_PRE_SPLIT, TOK_PRE_METASPACE, TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT, TOK_PRE_DIGITS, TOK_PRE_PUNCTUATION, TOK_PRE_BERT,
} tok_pre_kind;
typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;
typedef struct tok_pre {
    tok_pre_kind kind;
    struct tok_pre **kids;
    size_t n_kids;
    pcre2_code *re;  /* Split regex, ByteLevel regex */
    char *literal;   /* Split string pattern */
    size_t literal_len;
    tok_split_behavior behavior;
    int invert, add_prefix_space, use_regex, individual_digits, split;
    char replacement[5];
    int prepend; /* 0 never, 1 first, 2 always */
} tok_pre;
hearth_status tok_pre_parse(json_t *j, tok_pre **out, hearth_error *err);
tok_pre *tok_pre_new_bytelevel(int add_prefix_space, int use_regex, hearth_error *err);
tok_pre *tok_pre_new_split_regex(const char *regex, hearth_error *err);
void tok_pre_free(tok_pre *p);
/* Replaces the pieces in *l (swapping with *tmp as scratch). Returns 0 on failure. */
int tok_pre_apply(const tok_pre *p, tok_strlist *l, tok_strlist *tmp);

/* ---- decoders -------------------------------------------------------------------- */
typedef enum tok_dec_kind {
    TOK_DEC_SEQUENCE, TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE,
    TOK_DEC_STRIP, TOK_DEC_REPLACE, TOK_DEC_WORDPIECE, TOK_DEC_BPE,
} tok_dec_kind;
typedef struct tok_dec {
    tok_dec_kind kind;
    struct tok_dec **kids;
    size_t n_kids;
    char *pattern, *content; /* Replace; WordPiece prefix in pattern; BPE suffix in pattern */
    pcre2_code *re;
    int start, stop, cleanup;
    char replacement[5];
    int prepend;
} tok_dec;
hearth_status tok_dec_parse(json_t *j, tok_dec **out, hearth_error *err);
void tok_dec_free(tok_dec *d);
int tok_dec_apply(const tok_dec *d, tok_strlist *l, tok_strlist *tmp);

/* ---- models ---------------------------------------------------------------------- */
typedef enum tok_model_kind { TOK_MODEL_BPE, TOK_MODEL_WORDPIECE } tok_model_kind;
typedef struct tok_merge_slot { uint64_t key; int32_t rank, new_id; } tok_merge_slot;
typedef struct tok_model {
    tok_model_kind kind;
    tok_strmap vocab; /* model vocabulary only (not added tokens) */
    tok_merge_slot *merges;
    uint32_t merge_cap; /* power of two; key UINT64_MAX = empty */
    int32_t unk_id;
    int byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix ("" if none) */
    int32_t byte_ids[256]; /* <0xXX> ids for byte fallback, -1 if absent */
    int max_chars;         /* WordPiece max_input_chars_per_word */
} tok_model;

/* Scratch reused across the pieces of one encode call. */
typedef struct tok_bpe_scratch {
    struct tok_sym *syms;
    size_t syms_cap;
    struct tok_heap_item *heap;
    size_t heap_cap;
    sbuf tmp;
} tok_bpe_scratch;
void tok_bpe_scratch_free(tok_bpe_scratch *s);

typedef struct tok_ids { int32_t *v; size_t n, cap; } tok_ids;
int tok_ids_push(tok_ids *a, int32_t id);

/* ---- added tokens and post-processing ------------------------------------------- */
typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    int special, lstrip, rstrip, normalized, single_word;
} tok_added;

typedef struct tok_tmpl_piece { int is_seq; int32_t *ids; size_t n; } tok_tmpl_piece;
typedef struct tok_post {
    tok_tmpl_piece *single;
    size_t n_single;
    int present;
} tok_post;

struct tok_tokenizer {
    const char *kind_name;
    tok_model model;
    char **strs; /* id -> token string (model vocab and added tokens); NULL holes */
    uint32_t *str_lens;
    int32_t n_strs;
    uint8_t *special; /* per id */
    tok_added *added;
    size_t n_added;
    tok_strmap added_map; /* content -> index into added (keys: added_keys) */
    char **added_keys;
    uint32_t *added_key_lens;
    uint32_t *added_lens[256]; /* per first byte: distinct added-token lengths, longest first */
    uint32_t n_added_lens[256];
    int has_normalized_added, has_raw_added;
    tok_norm *norm;
    tok_pre *pre;
    tok_dec *dec;
    tok_post post;
    int32_t bos_id, eos_id;
};

hearth_status tok_bpe_load_json(tok_tokenizer *t, json_t *model, hearth_error *err);
hearth_status tok_wordpiece_load_json(tok_tokenizer *t, json_t *model, hearth_error *err);
/* Builds the merge map from (left id, right id) pairs in rank order. */
hearth_status tok_bpe_build_merges(tok_tokenizer *t, const int32_t *pairs, size_t n_pairs, hearth_error *err);
int tok_bpe_encode_word(const tok_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *s, tok_ids *out);
int tok_wordpiece_encode_word(const tok_tokenizer *t, const char *w, size_t n, sbuf *tmp, tok_ids *out);

/* Common tail of every loader: id tables sized, added token index, special flags. */
hearth_status tok_finish_load(tok_tokenizer *t, hearth_error *err);
/* Sets id's string in the id table (grows it). */
int tok_set_str(tok_tokenizer *t, int32_t id, const char *s, size_t n);
int tok_add_added(tok_tokenizer *t, int32_t id, const char *s, size_t n, int special, int normalized);
tok_tokenizer *tok_alloc(void);
#endif
