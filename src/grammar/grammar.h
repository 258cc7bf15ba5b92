/* grammar.h: token-level constraints for decoding. A source (JSON Schema, free JSON,
 * a regular expression, a GBNF grammar) compiles to one byte-level context-free grammar;
 * a matcher follows the bytes generated so far and says which vocabulary tokens may come
 * next. Knows nothing of models or tokenizers: a vocabulary is handed in as byte strings. */
#ifndef HEARTH_GRAMMAR_H
#define HEARTH_GRAMMAR_H
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GRAMMAR_JSON_SCHEMA, /* text is a JSON Schema document */
    GRAMMAR_JSON_OBJECT, /* any JSON object (response_format json_object); text ignored */
    GRAMMAR_REGEX,       /* the whole output matches the pattern */
    GRAMMAR_GBNF,        /* llama.cpp grammar; rule "root" is the start */
    GRAMMAR_TOOL_CALL,   /* pieces of text, special-token markers and JSON schemas (gram_tool.c) */
} grammar_kind;

typedef struct grammar grammar;
typedef struct gvocab gvocab;
typedef struct gmatcher gmatcher;

/* Compiles a source. Errors name the problem (an unsupported keyword and where it is, a
 * bad $ref, a GBNF syntax error with line:col). v (may be NULL) is the vocabulary the
 * grammar will run on: a tool-call marker is then the special token with that text when v
 * has one (what the model was trained to write), else the text; with v NULL, either. */
hearth_status grammar_compile(grammar_kind kind, const char *text, size_t len, const gvocab *v, grammar **out,
                              hearth_error *err);
void grammar_free(grammar *g);
/* Rules and elements: a size for logs and tests. */
size_t grammar_size(const grammar *g);

/* A vocabulary: bytes[i] (len[i] bytes) is what token i stands for; special tokens (chat
 * markup, control ids) are never allowed as text, only where a tool-call grammar asks for
 * that marker; eos ids end a finished output. Built
 * once per tokenizer and shared by every matcher (read-only after creation). */
gvocab *gvocab_new(int32_t n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *special,
                   const int32_t *eos_ids, int n_eos);
void gvocab_free(gvocab *v);
/* The bytes gvocab_new with these arguments allocates, from the layout it builds the tries
 * on (the tokens copied and sorted, each trie's node count), without building them:
 * *tables, what the vocabulary keeps; *temporary, what its build holds besides at the worst
 * moment. hearth fit counts them (a server builds the vocabulary at its first constrained
 * request). Allocates the layout meanwhile; returns 0 (both 0) on out of memory. */
int gvocab_footprint(int32_t n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *special,
                     const int32_t *eos_ids, int n_eos, size_t *tables, size_t *temporary);
int32_t gvocab_size(const gvocab *v);
/* Whether v has a special token (not eos) whose text is text[0..n). */
int gvocab_has_special(const gvocab *v, const char *text, size_t n);

/* A matcher follows one output. The grammar must outlive it. */
gmatcher *gmatcher_new(const grammar *g, const gvocab *v);
void gmatcher_free(gmatcher *m);
/* Fills bitmask (ceil(n_tokens/32) words, bit i of word i/32 for token i) with the tokens
 * allowed next; returns the number allowed (0: nothing can follow, the output is stuck). */
size_t gmatcher_mask(gmatcher *m, uint32_t *bitmask);
/* Advances over one token; returns 0 (and changes nothing) when the token is not allowed. */
int gmatcher_accept(gmatcher *m, int32_t token);
/* How many of tokens[0..n), taken in order from m's state, the grammar allows (m itself
 * does not move): speculative proposals are cut at the first one it forbids. */
size_t gmatcher_allowed_prefix(const gmatcher *m, const int32_t *tokens, size_t n);
/* The bytes the grammar forces after tokens[0..n) from m's state (0 when it forbids one of
 * them): while exactly one byte may follow and the output cannot end, and through a choice
 * between optional whitespace and exactly one other byte, where the whitespace is guessed
 * as this output laid it out after the same byte before (a newline keeps the indentation
 * relative to that byte's line; nothing learned yet: the run stops). At most cap bytes into
 * out. m does not move. */
size_t gmatcher_forced_bytes(const gmatcher *m, const int32_t *tokens, size_t n, char *out, size_t cap);
/* Spells bytes[0..n) as tokens (the model's tokenizer), at most cap into out; returns how many. */
typedef size_t (*gm_spell_fn)(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap);
/* Speculative proposals from the grammar itself: gmatcher_forced_bytes after tokens[0..n)
 * (which m must allow; else n comes back), spelled by spell (NULL: none) as far as the
 * grammar allows its tokens, the rest (no speller, a token of its spelling the grammar
 * forbids, a special token's marker) greedily by the vocabulary's longest tokens, appended to
 * tokens up to cap in all. Returns the new count. */
size_t gmatcher_extend_forced(const gmatcher *m, int32_t *tokens, size_t n, size_t cap, gm_spell_fn spell,
                              void *spell_ctx);
/* Advances over raw bytes (a forced prefix, a test instance); 0 when they do not match. */
int gmatcher_accept_bytes(gmatcher *m, const char *bytes, size_t n);
/* The output so far is a complete sentence of the grammar. */
int gmatcher_can_end(const gmatcher *m);
/* Complete and nothing may follow (or an eos id was accepted): generation should stop. */
int gmatcher_is_done(const gmatcher *m);
#endif
