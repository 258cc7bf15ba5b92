/* grammar_internal.h: what the source compilers (schema, regex, GBNF) share: an
 * expression tree over code-point sets and byte sets, named rules, and the lowering of
 * both into the flat byte-level grammar the matcher runs. Not part of the module API. */
#ifndef HEARTH_GRAMMAR_INTERNAL_H
#define HEARTH_GRAMMAR_INTERNAL_H
#include "base/err.h"
#include "grammar/grammar.h"
#include <stdint.h>

#define GR_INF (-1)          /* an unbounded repeat */
#define GR_MAX_REPEAT 100000 /* {m,n} bounds above this are refused: each copy is a rule */
#define GR_MAX_NODES 4000000 /* a source that needs more expression nodes is refused */
/* A special token (other than eos) is spelled in the matcher as this byte and then its
 * text: 0xFF is never a UTF-8 byte, so text grammars can never match one; a tool-call
 * grammar's marker piece writes it on purpose. */
#define GR_SPECIAL_BYTE 0xFF

typedef struct {
    uint32_t w[8];
} gr_byteset;
static inline int gr_has(const gr_byteset *s, unsigned b) { return (s->w[b >> 5] >> (b & 31)) & 1; }
static inline void gr_add(gr_byteset *s, unsigned b) { s->w[b >> 5] |= 1u << (b & 31); }

enum {
    GN_EMPTY,  /* matches "" */
    GN_BYTES,  /* one byte from set a */
    GN_CPSET,  /* one code point from ranges [a, a+b) of the range pool; json flag: JSON-escaped */
    GN_SEQ,    /* kids in order */
    GN_ALT,    /* any kid */
    GN_REPEAT, /* kid repeated min..max (max GR_INF: unbounded) */
    GN_RULE,   /* rule a */
};

typedef struct {
    uint8_t kind, json;
    int32_t a, b;         /* set / ranges / rule; repeat: min, max */
    int32_t kids, n_kids; /* into the kid pool */
} gr_node;

typedef struct {
    char *name;
    int32_t body;      /* node; -1 while undefined */
    int32_t line, col; /* first use, for "undefined rule" errors */
} gr_rule;

typedef struct gr_build {
    gr_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *pool;
    int32_t n_pool, cap_pool;
    uint32_t *ranges; /* lo, hi pairs */
    int32_t n_ranges, cap_ranges;
    gr_byteset *sets;
    int32_t n_sets, cap_sets;
    gr_rule *rules;
    int32_t n_rules, cap_rules;
    int oom;
    /* schema strings take only the escapes Python's literals read the same way (no \/ and
     * no \uXXXX but the shortest forms of control characters): gram_tool.c's pyschema */
    int py_strings;
    /* schema numbers within +-1e15 (free ones: at most 15 integer digits, a 2-digit
     * exponent): what every tool-call parser reads exactly (int64, doubles), gram_tool.c */
    int small_numbers;
    const gvocab *vocab; /* NULL: not known (grammar_compile) */
} gr_build;

void gr_build_init(gr_build *b);
void gr_build_free(gr_build *b);
int32_t gr_empty(gr_build *b);
int32_t gr_byteset_node(gr_build *b, const gr_byteset *s);
int32_t gr_byte(gr_build *b, unsigned c);
int32_t gr_byte_range(gr_build *b, unsigned lo, unsigned hi);
/* ranges: n (lo, hi) code-point pairs, any order; json: match the JSON-escaped form. */
int32_t gr_cpset(gr_build *b, const uint32_t *ranges, int n, int json);
int32_t gr_literal(gr_build *b, const char *bytes, size_t n);
int32_t gr_seq(gr_build *b, const int32_t *kids, int n);
int32_t gr_alt(gr_build *b, const int32_t *kids, int n);
int32_t gr_seq2(gr_build *b, int32_t x, int32_t y);
int32_t gr_seq3(gr_build *b, int32_t x, int32_t y, int32_t z);
int32_t gr_alt2(gr_build *b, int32_t x, int32_t y);
int32_t gr_repeat(gr_build *b, int32_t kid, int32_t min, int32_t max);
int32_t gr_opt(gr_build *b, int32_t kid);
/* A named rule (created undefined on first use); -1 on out of memory. */
int32_t gr_rule_named(gr_build *b, const char *name, size_t len);
/* A fresh unnamed rule with the given body. */
int32_t gr_rule_new(gr_build *b, int32_t body);
int32_t gr_ref(gr_build *b, int32_t rule);
/* Lowers rule `root` and everything it reaches into a grammar (checks undefined rules and
 * left recursion). */
hearth_status gr_finish(gr_build *b, int32_t root, grammar **out, hearth_error *err);

/* Regular expression (the PCRE2 subset in docs) to a node. json: match inside a JSON
 * string (code points in their JSON-escaped form) with search semantics (unanchored
 * ends match anything); otherwise the pattern matches the whole output. */
hearth_status gr_regex(gr_build *b, const char *re, size_t len, int json, int32_t *out, hearth_error *err);
hearth_status gr_gbnf(gr_build *b, const char *text, size_t len, int32_t *root, hearth_error *err);
hearth_status gr_schema(gr_build *b, const char *text, size_t len, int object_only, int32_t *root, hearth_error *err);
hearth_status gr_tool_call(gr_build *b, const char *text, size_t len, int32_t *root, hearth_error *err);
#endif
