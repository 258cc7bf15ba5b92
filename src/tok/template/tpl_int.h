/* tpl_int.h: private types of the chat-template interpreter (lexer, parser,
 * values, evaluator, filters). Everything a render allocates lives in one arena
 * freed at the end, so values are plain structs copied by value and never freed
 * one by one. Nothing here is visible outside src/tok/template/. */
#ifndef HEARTH_TOK_TEMPLATE_INT_H
#define HEARTH_TOK_TEMPLATE_INT_H
#include "base/err.h"
#include "base/sbuf.h"
#include "hearth.h"
#include <jansson.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep hostile templates from hanging or exhausting memory. */
#define TPL_MAX_OUTPUT ((size_t)64 << 20)     /* rendered text cap, 64 MiB */
#define TPL_MAX_ARENA ((size_t)512 << 20)     /* all values of one render */
#define TPL_MAX_DEPTH 256                     /* parser nesting; also JSON/value nesting */
#define TPL_MAX_RUN_DEPTH 1500                /* evaluator recursion */
#define TPL_MAX_MACRO_DEPTH 64                /* nested macro calls */
#define TPL_MAX_RANGE 100000                  /* jinja2 sandbox's MAX_RANGE */
#define TPL_MAX_TEMPS 256
#define TPL_MAX_STEPS ((uint64_t)5000000)     /* loop iterations + calls per render; real
                                                 templates need well under 1e5 */

/* ---- arena ---- */
typedef struct tpl_chunk tpl_chunk;
typedef struct tpl_arena {
    tpl_chunk *head;
    size_t used; /* bytes handed out in total, checked against TPL_MAX_ARENA */
} tpl_arena;

/* ---- values ---- */
typedef enum tpl_kind {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT,
    TV_NS,     /* namespace(): a dict whose attributes may be assigned */
    TV_MACRO,  /* macro or caller() */
    TV_FUNC,   /* builtin global function */
    TV_METHOD, /* bound method of a str/dict/list/loop, e.g. s.startswith */
    TV_LOOP,   /* the loop variable inside for */
} tpl_kind;

typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
typedef struct tpl_macro tpl_macro;
typedef struct tpl_loop tpl_loop;
typedef struct tpl_method tpl_method;

typedef struct tpl_val {
    tpl_kind kind;
    size_t n; /* string length in bytes */
    union {
        int b;
        int64_t i;
        double f;
        const char *s;  /* TV_STR; TV_UNDEF: the reason it is undefined (may be NULL) */
        tpl_list *l;
        tpl_dict *d;
        tpl_macro *m;
        int fn;
        tpl_method *meth;
        tpl_loop *loop;
    } u;
} tpl_val;

struct tpl_list {
    size_t n, cap;
    tpl_val *items;
    int is_tuple;
};
struct tpl_dict {
    size_t n, cap;
    tpl_val *keys, *vals;
};
struct tpl_method {
    tpl_val self;
    const char *name;
};

/* ---- lexer ---- */
typedef enum tpl_tok_kind {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
} tpl_tok_kind;

typedef struct tpl_tok {
    tpl_tok_kind kind;
    int line;
    const char *s; /* DATA/NAME/STRING(unescaped)/OP text, arena-owned */
    size_t n;
    int64_t i;
    double f;
} tpl_tok;

/* ---- AST ---- */
typedef enum tpl_node_kind {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL,
    N_FILTER, N_TEST, N_BINOP, N_UNARY, N_AND, N_OR, N_NOT, N_COMPARE, N_COND, N_CONCAT,
    /* statements */
    N_BODY, N_OUTPUT, N_DATA, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK,
    N_FILTER_BLOCK, N_BREAK, N_CONTINUE, N_WITH,
} tpl_node_kind;

typedef struct tpl_node tpl_node;
typedef struct tpl_nodes {
    size_t n, cap;
    tpl_node **items;
} tpl_nodes;

struct tpl_node {
    tpl_node_kind kind;
    int line;
    int op;             /* BINOP/UNARY/COMPARE operator token (see tpl_op) */
    int negated;        /* TEST: `is not`; MACRO: the body reads `caller` */
    const char *name;   /* NAME, GETATTR attribute, FILTER/TEST/MACRO name */
    tpl_val value;      /* CONST */
    tpl_node *a, *b, *c; /* operands; IF: a=cond b=then c=else; FOR: a=target b=iter c=filter */
    tpl_nodes args;     /* CALL/FILTER/TEST positional args, LIST/TUPLE items, DICT keys */
    tpl_nodes kwvals;   /* DICT values, CALL kwargs values, MACRO defaults */
    const char **kwnames; /* CALL/FILTER/TEST kwarg names (kwvals.n of them), MACRO params */
    size_t n_params;
    tpl_nodes ops;      /* COMPARE: operands after the first; op codes in cmp_ops */
    int *cmp_ops;
    tpl_node *body, *else_body;
};

enum tpl_op {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN, OP_NEG, OP_POS,
};

/* ---- render state ---- */
typedef struct tpl_frame tpl_frame;
struct tpl_frame {
    tpl_frame *parent;
    int captured; /* a macro closes over it: must not be recycled */
    size_t n, cap;
    const char **names;
    tpl_val *vals;
};

struct tpl_macro {
    tpl_node *def;      /* N_MACRO, or the N_CALL_BLOCK for caller() */
    tpl_frame *closure;
    tpl_val caller;     /* the caller() visible inside a macro invoked by {% call %} */
};

struct tpl_loop {
    tpl_list *items;
    size_t index0;
};

typedef struct tpl_state {
    tpl_arena arena;
    hearth_error *err;
    jmp_buf fail;   /* every error longjmps here once err is filled */
    sbuf *out;      /* current output (swapped for block set / macros) */
    int depth;
    uint64_t steps;
    int loop_ctl;   /* 1 break, 2 continue pending */
    const char *src; /* for parse errors */
    int macro_depth;
    sbuf *temps[TPL_MAX_TEMPS]; /* heap buffers in use, freed if a render fails */
    int n_temps;
} tpl_state;

/* temporary heap string buffers that are released even when an error longjmps */
sbuf *tpl_tmp_begin(tpl_state *st);
void tpl_tmp_end(tpl_state *st, sbuf *b);
/* copies the buffer into the arena as a string value and ends it */
tpl_val tpl_tmp_finish(tpl_state *st, sbuf *b);

/* arena.c-ish helpers (value.c) */
void *tpl_alloc(tpl_state *st, size_t n);
void tpl_arena_free(tpl_arena *a);
__attribute__((noreturn, format(printf, 3, 4))) void tpl_fail(tpl_state *st, int line, const char *fmt, ...);
const char *tpl_strdup(tpl_state *st, const char *s, size_t n);

/* lexer.c / parser.c */
void tpl_lex(tpl_state *st, const char *src, size_t len, tpl_tok **toks, size_t *n_toks);
tpl_node *tpl_parse(tpl_state *st, tpl_tok *toks, size_t n_toks);

/* value.c */
tpl_val tv_undef(const char *why);
tpl_val tv_none(void);
tpl_val tv_bool(int b);
tpl_val tv_int(int64_t i);
tpl_val tv_float(double f);
tpl_val tv_str(tpl_state *st, const char *s, size_t n); /* copies */
tpl_val tv_cstr(const char *s);                          /* static text, no copy */
tpl_val tv_list(tpl_state *st, size_t cap);
tpl_val tv_dict(tpl_state *st, size_t cap);
void tv_list_push(tpl_state *st, tpl_list *l, tpl_val v);
void tv_dict_set(tpl_state *st, tpl_dict *d, tpl_val k, tpl_val v);
tpl_val *tv_dict_find(tpl_dict *d, tpl_val k);
tpl_val *tv_dict_find_str(tpl_dict *d, const char *s, size_t n);
tpl_val tv_from_json(tpl_state *st, const json_t *j, int depth);
int tv_truthy(tpl_val v);
int tv_equal(tpl_val a, tpl_val b);
/* <0, 0, >0; fails on types Python cannot order */
int tv_compare(tpl_state *st, int line, tpl_val a, tpl_val b);
void tv_to_str(tpl_state *st, sbuf *b, tpl_val v);  /* Python str() */
void tv_repr(tpl_state *st, sbuf *b, tpl_val v);    /* Python repr() */
tpl_val tv_stringify(tpl_state *st, tpl_val v);     /* str() as a value */
const char *tv_type_name(tpl_val v);
void tv_float_repr(sbuf *b, double f);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys); returns 0 on unserializable */
int tv_tojson(tpl_state *st, sbuf *b, tpl_val v, const char *indent, int has_indent, const char *item_sep,
              const char *key_sep, int sort_keys, int level);
/* the values to iterate for `for`, `in`, filters: list items, dict keys, string chars */
tpl_list *tv_iter(tpl_state *st, int line, tpl_val v);
int tv_is_seq(tpl_val v);
size_t tpl_utf8_len(const char *s, size_t n);
/* byte offset of the code point index ci (clamped to n) */
size_t tpl_utf8_offset(const char *s, size_t n, size_t ci);

/* eval.c */
tpl_val tpl_eval(tpl_state *st, tpl_frame *f, tpl_node *e);
void tpl_exec(tpl_state *st, tpl_frame *f, tpl_node *s);
tpl_val tpl_call_value(tpl_state *st, tpl_frame *f, int line, tpl_val fn, tpl_val *args, size_t n_args,
                       const char **kwn, tpl_val *kwv, size_t n_kw);
tpl_val tpl_getattr(tpl_state *st, int line, tpl_val obj, const char *name, size_t n);
tpl_val tpl_getitem(tpl_state *st, int line, tpl_val obj, tpl_val key);
tpl_val tpl_binop(tpl_state *st, int line, int op, tpl_val a, tpl_val b);
void tpl_step(tpl_state *st, int line);

/* filters.c */
tpl_val tpl_filter(tpl_state *st, tpl_frame *f, int line, const char *name, tpl_val v, tpl_val *args, size_t n_args,
                   const char **kwn, tpl_val *kwv, size_t n_kw);
int tpl_test(tpl_state *st, int line, const char *name, tpl_val v, tpl_val *args, size_t n_args);
int tpl_filter_exists(const char *name);
int tpl_test_exists(const char *name);

/* methods.c: str/dict/list methods and global functions */
int tpl_method_exists(tpl_val self, const char *name);
tpl_val tpl_method_call(tpl_state *st, int line, tpl_val self, const char *name, tpl_val *args, size_t n_args,
                        const char **kwn, tpl_val *kwv, size_t n_kw);
enum { FN_RANGE = 1, FN_NAMESPACE, FN_RAISE, FN_STRFTIME, FN_DICT };
tpl_val tpl_global_call(tpl_state *st, int line, int fn, tpl_val *args, size_t n_args, const char **kwn, tpl_val *kwv,
                        size_t n_kw);
/* python str helpers shared by filters and methods */
tpl_val tpl_str_strip(tpl_state *st, tpl_val s, tpl_val chars, int left, int right);
tpl_val tpl_str_case(tpl_state *st, tpl_val s, int mode); /* 0 lower 1 upper 2 title 3 capitalize */
tpl_val tpl_str_replace(tpl_state *st, tpl_val s, tpl_val old, tpl_val new_, int64_t count);
tpl_val tpl_str_split(tpl_state *st, int line, tpl_val s, tpl_val sep, int64_t maxsplit);
tpl_val tpl_splitlines(tpl_state *st, tpl_val s);
/* Python's `fmt % args` for %s %r %d %i %% and %(key)s; other specs fail */
tpl_val tpl_str_percent(tpl_state *st, int line, tpl_val fmt, tpl_val args);
/* Python's \w for the code point starting at s */
int tpl_is_word_char(const char *s, size_t n);
#endif
