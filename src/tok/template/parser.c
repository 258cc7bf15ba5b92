/* parser.c: builds the template AST from lexer tokens, following jinja2's grammar
 * (operator precedence, tests, filters, tuples, statements). Owns syntax errors,
 * which name the line and construct; must not evaluate anything. */
#include "tok/template/tpl_int.h"
#include <string.h>

typedef struct parser {
    tpl_state *st;
    tpl_tok *t;
    size_t n, i;
    int loop_depth;
    int depth;
} parser;

static tpl_tok *cur(parser *p) { return &p->t[p->i < p->n ? p->i : p->n - 1]; }
static tpl_tok *peek(parser *p, size_t k) { return &p->t[p->i + k < p->n ? p->i + k : p->n - 1]; }
static tpl_tok *next(parser *p) {
    tpl_tok *t = cur(p);
    if (p->i < p->n - 1) p->i++;
    return t;
}
static int is_op(tpl_tok *t, const char *op) { return t->kind == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(tpl_tok *t, const char *nm) { return t->kind == TK_NAME && !strcmp(t->s, nm); }

static const char *tok_desc(tpl_tok *t) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: return t->s;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_OP: return "operator";
    }
    return "token";
}

__attribute__((noreturn)) static void unexpected(parser *p, const char *want) {
    tpl_tok *t = cur(p);
    if (t->kind == TK_OP)
        tpl_fail(p->st, t->line, "syntax error: unexpected '%.*s'%s%s", (int)t->n, t->s, want ? ", expected " : "", want ? want : "");
    tpl_fail(p->st, t->line, "syntax error: unexpected %s%s%s", tok_desc(t), want ? ", expected " : "", want ? want : "");
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char w[16];
        w[0] = '\'';
        size_t k = strlen(op);
        memcpy(w + 1, op, k);
        w[k + 1] = '\'';
        w[k + 2] = 0;
        unexpected(p, w);
    }
    next(p);
}
static void expect_kind(parser *p, tpl_tok_kind k, const char *desc) {
    if (cur(p)->kind != k) unexpected(p, desc);
    next(p);
}
static const char *expect_name(parser *p) {
    if (cur(p)->kind != TK_NAME) unexpected(p, "a name");
    return next(p)->s;
}

static tpl_node *mk(parser *p, tpl_node_kind k, int line) {
    tpl_node *n = tpl_alloc(p->st, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}
static void push(parser *p, tpl_nodes *l, tpl_node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tpl_node **it = tpl_alloc(p->st, cap * sizeof *it);
        if (l->n) memcpy(it, l->items, l->n * sizeof *it);
        l->items = it;
        l->cap = cap;
    }
    l->items[l->n++] = n;
}
static void push_name(parser *p, const char ***names, size_t n, const char *s) {
    /* grows by copying each time; argument lists are tiny */
    const char **nn = tpl_alloc(p->st, (n + 1) * sizeof *nn);
    if (n) memcpy(nn, *names, n * sizeof *nn);
    nn[n] = s;
    *names = nn;
}

static void enter(parser *p) {
    if (++p->depth > TPL_MAX_DEPTH) tpl_fail(p->st, cur(p)->line, "template nested too deeply");
}

static tpl_node *parse_expression(parser *p, int with_condexpr);
static tpl_node *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
static tpl_node *parse_unary(parser *p, int with_filter);
static tpl_node *parse_postfix(parser *p, tpl_node *node);
static tpl_node *parse_filter_expr(parser *p, tpl_node *node);

static tpl_node *parse_or(parser *p);

static tpl_node *parse_expression(parser *p, int with_condexpr) {
    enter(p);
    tpl_node *e = parse_or(p);
    if (with_condexpr) {
        while (is_name(cur(p), "if")) {
            int line = next(p)->line;
            tpl_node *c = mk(p, N_COND, line);
            c->b = e;
            c->a = parse_or(p);
            if (is_name(cur(p), "else")) {
                next(p);
                c->c = parse_expression(p, 1);
            }
            e = c;
        }
    }
    p->depth--;
    return e;
}

static tpl_node *parse_not(parser *p);
static tpl_node *parse_and(parser *p) {
    tpl_node *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        tpl_node *n = mk(p, N_AND, next(p)->line);
        n->a = l;
        n->b = parse_not(p);
        l = n;
    }
    return l;
}
static tpl_node *parse_or(parser *p) {
    tpl_node *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        tpl_node *n = mk(p, N_OR, next(p)->line);
        n->a = l;
        n->b = parse_and(p);
        l = n;
    }
    return l;
}

static tpl_node *parse_math1(parser *p);
static tpl_node *parse_compare(parser *p) {
    tpl_node *e = parse_math1(p);
    tpl_node *c = NULL;
    int ops[64];
    for (;;) {
        tpl_tok *t = cur(p);
        int op = 0;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) { next(p); op = OP_NOTIN; }
        if (!op) break;
        next(p);
        if (!c) { c = mk(p, N_COMPARE, t->line); c->a = e; }
        if (c->ops.n == 64) tpl_fail(p->st, t->line, "comparison chain too long");
        ops[c->ops.n] = op;
        push(p, &c->ops, parse_math1(p));
    }
    if (!c) return e;
    c->cmp_ops = tpl_alloc(p->st, c->ops.n * sizeof(int));
    memcpy(c->cmp_ops, ops, c->ops.n * sizeof(int));
    return c;
}

static tpl_node *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        tpl_node *n = mk(p, N_NOT, next(p)->line);
        enter(p);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static tpl_node *binop(parser *p, int op, int line, tpl_node *a, tpl_node *b) {
    tpl_node *n = mk(p, N_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static tpl_node *parse_pow(parser *p) {
    tpl_node *l = parse_unary(p, 1);
    while (is_op(cur(p), "**")) {
        int line = next(p)->line;
        l = binop(p, OP_POW, line, l, parse_unary(p, 1));
    }
    return l;
}
static tpl_node *parse_math2(parser *p) {
    tpl_node *l = parse_pow(p);
    for (;;) {
        tpl_tok *t = cur(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : 0;
        if (!op) return l;
        next(p);
        l = binop(p, op, t->line, l, parse_pow(p));
    }
}
static tpl_node *parse_concat(parser *p) {
    tpl_node *l = parse_math2(p);
    if (!is_op(cur(p), "~")) return l;
    tpl_node *c = mk(p, N_CONCAT, cur(p)->line);
    push(p, &c->args, l);
    while (is_op(cur(p), "~")) {
        next(p);
        push(p, &c->args, parse_math2(p));
    }
    return c;
}
static tpl_node *parse_math1(parser *p) {
    tpl_node *l = parse_concat(p);
    for (;;) {
        tpl_tok *t = cur(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : 0;
        if (!op) return l;
        next(p);
        l = binop(p, op, t->line, l, parse_concat(p));
    }
}

static tpl_node *parse_primary(parser *p) {
    tpl_tok *t = cur(p);
    tpl_node *n;
    enter(p);
    if (t->kind == TK_NAME) {
        next(p);
        n = mk(p, N_CONST, t->line);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->value = tv_bool(1);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->value = tv_bool(0);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->value = tv_none();
        else { n->kind = N_NAME; n->name = t->s; }
    } else if (t->kind == TK_STRING) {
        /* adjacent string literals concatenate */
        sbuf b;
        sbuf_init(&b);
        while (cur(p)->kind == TK_STRING) { sbuf_append(&b, cur(p)->s, cur(p)->n); next(p); }
        n = mk(p, N_CONST, t->line);
        n->value = tv_str(p->st, b.data ? b.data : "", b.len);
        sbuf_free(&b);
    } else if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        next(p);
        n = mk(p, N_CONST, t->line);
        n->value = t->kind == TK_INT ? tv_int(t->i) : tv_float(t->f);
    } else if (is_op(t, "(")) {
        next(p);
        n = parse_tuple(p, 0, 1, NULL, 1);
        expect_op(p, ")");
    } else if (is_op(t, "[")) {
        next(p);
        n = mk(p, N_LIST, t->line);
        while (!is_op(cur(p), "]")) {
            if (n->args.n) expect_op(p, ",");
            if (is_op(cur(p), "]")) break;
            push(p, &n->args, parse_expression(p, 1));
        }
        expect_op(p, "]");
    } else if (is_op(t, "{")) {
        next(p);
        n = mk(p, N_DICT, t->line);
        while (!is_op(cur(p), "}")) {
            if (n->args.n) expect_op(p, ",");
            if (is_op(cur(p), "}")) break;
            push(p, &n->args, parse_expression(p, 1));
            expect_op(p, ":");
            push(p, &n->kwvals, parse_expression(p, 1));
        }
        expect_op(p, "}");
    } else {
        unexpected(p, "an expression");
    }
    p->depth--;
    return n;
}

static int tuple_end(parser *p, const char *extra_end) {
    tpl_tok *t = cur(p);
    if (t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || t->kind == TK_EOF || is_op(t, ")")) return 1;
    return extra_end && is_name(t, extra_end);
}

static tpl_node *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens) {
    int line = cur(p)->line;
    tpl_node *tup = mk(p, N_TUPLE, line);
    int is_tuple = 0;
    enter(p);
    for (;;) {
        if (tup->args.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        push(p, &tup->args, simplified ? parse_primary(p) : parse_expression(p, with_condexpr));
        if (is_op(cur(p), ",")) is_tuple = 1;
        else break;
    }
    p->depth--;
    if (!is_tuple) {
        if (tup->args.n) return tup->args.items[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    return tup;
}

static void parse_call_args(parser *p, tpl_node *n) {
    expect_op(p, "(");
    int first = 1;
    while (!is_op(cur(p), ")")) {
        if (!first) expect_op(p, ",");
        first = 0;
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            tpl_fail(p->st, cur(p)->line, "unsupported construct: *args/**kwargs in call");
        if (cur(p)->kind == TK_NAME && is_op(peek(p, 1), "=")) {
            const char *k = next(p)->s;
            next(p);
            push_name(p, &n->kwnames, n->kwvals.n, k);
            push(p, &n->kwvals, parse_expression(p, 1));
        } else {
            if (n->kwvals.n) tpl_fail(p->st, cur(p)->line, "syntax error: positional argument after keyword argument");
            push(p, &n->args, parse_expression(p, 1));
        }
    }
    expect_op(p, ")");
}

static tpl_node *parse_subscribed(parser *p) {
    int line = cur(p)->line;
    tpl_node *start = NULL, *stop = NULL, *step = NULL;
    if (!is_op(cur(p), ":")) {
        start = parse_expression(p, 1);
        if (!is_op(cur(p), ":")) return start;
    }
    next(p); /* ':' */
    if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":")) stop = parse_expression(p, 1);
    if (is_op(cur(p), ":")) {
        next(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) step = parse_expression(p, 1);
    }
    tpl_node *s = mk(p, N_SLICE, line);
    s->a = start;
    s->b = stop;
    s->c = step;
    return s;
}

static tpl_node *parse_postfix(parser *p, tpl_node *node) {
    for (;;) {
        tpl_tok *t = cur(p);
        if (is_op(t, ".")) {
            next(p);
            tpl_tok *a = cur(p);
            if (a->kind == TK_NAME) {
                next(p);
                tpl_node *g = mk(p, N_GETATTR, t->line);
                g->a = node;
                g->name = a->s;
                node = g;
            } else if (a->kind == TK_INT) {
                next(p);
                tpl_node *g = mk(p, N_GETITEM, t->line), *k = mk(p, N_CONST, t->line);
                k->value = tv_int(a->i);
                g->a = node;
                g->b = k;
                node = g;
            } else
                unexpected(p, "an attribute name");
        } else if (is_op(t, "[")) {
            next(p);
            tpl_node *g = mk(p, N_GETITEM, t->line);
            g->a = node;
            tpl_node *tup = NULL;
            tpl_node *first = NULL;
            while (!is_op(cur(p), "]")) {
                if (first) {
                    expect_op(p, ",");
                    if (is_op(cur(p), "]")) break;
                }
                tpl_node *s = parse_subscribed(p);
                if (!first) first = s;
                else {
                    if (!tup) { tup = mk(p, N_TUPLE, t->line); push(p, &tup->args, first); }
                    push(p, &tup->args, s);
                }
                if (!is_op(cur(p), ",")) break;
                if (!tup) { tup = mk(p, N_TUPLE, t->line); push(p, &tup->args, first); }
            }
            expect_op(p, "]");
            if (!first) tup = mk(p, N_TUPLE, t->line); /* x[] subscripts with () */
            g->b = tup ? tup : first;
            node = g;
        } else if (is_op(t, "(")) {
            tpl_node *c = mk(p, N_CALL, t->line);
            c->a = node;
            parse_call_args(p, c);
            node = c;
        } else
            return node;
    }
}

static const char *dotted_name(parser *p) {
    const char *nm = expect_name(p);
    while (is_op(cur(p), ".")) {
        next(p);
        const char *more = expect_name(p);
        size_t a = strlen(nm), b = strlen(more);
        char *j = tpl_alloc(p->st, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, more, b + 1);
        nm = j;
    }
    return nm;
}

static tpl_node *parse_filter(parser *p, tpl_node *node, int start_inline) {
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline) next(p);
        start_inline = 0;
        int line = cur(p)->line;
        tpl_node *f = mk(p, N_FILTER, line);
        f->name = dotted_name(p);
        if (!tpl_filter_exists(f->name)) tpl_fail(p->st, line, "no filter named '%s'", f->name);
        f->a = node;
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        node = f;
    }
    return node;
}

static tpl_node *parse_test(parser *p, tpl_node *node) {
    int line = next(p)->line; /* 'is' */
    int negated = 0;
    if (is_name(cur(p), "not")) { next(p); negated = 1; }
    tpl_node *t = mk(p, N_TEST, line);
    t->name = dotted_name(p);
    if (!tpl_test_exists(t->name)) tpl_fail(p->st, line, "no test named '%s'", t->name);
    t->a = node;
    t->negated = negated;
    tpl_tok *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, t);
    } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT || c->kind == TK_FLOAT || is_op(c, "[") ||
                is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) tpl_fail(p->st, c->line, "syntax error: cannot chain multiple tests with is");
        push(p, &t->args, parse_postfix(p, parse_primary(p)));
    }
    return t;
}

static tpl_node *parse_filter_expr(parser *p, tpl_node *node) {
    for (;;) {
        if (is_op(cur(p), "|")) node = parse_filter(p, node, 0);
        else if (is_name(cur(p), "is")) node = parse_test(p, node);
        else if (is_op(cur(p), "(")) {
            tpl_node *c = mk(p, N_CALL, cur(p)->line);
            c->a = node;
            parse_call_args(p, c);
            node = c;
        } else
            return node;
    }
}

static tpl_node *parse_unary(parser *p, int with_filter) {
    tpl_tok *t = cur(p);
    tpl_node *node;
    enter(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        node = mk(p, N_UNARY, t->line);
        node->op = is_op(t, "-") ? OP_NEG : OP_POS;
        node->a = parse_unary(p, 0);
    } else
        node = parse_primary(p);
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

/* ---- statements ---- */
static tpl_node *subparse(parser *p, const char *const *ends);
static int uses_caller(tpl_node *n, int depth);

static void block_end(parser *p) { expect_kind(p, TK_BLOCK_END, "end of statement block"); }

/* assignment target: name, ns.attr (with_ns), or a tuple of names */
static tpl_node *parse_target(parser *p, const char *extra_end, int with_ns) {
    int line = cur(p)->line;
    tpl_node *tgt;
    if (with_ns && cur(p)->kind == TK_NAME && is_op(peek(p, 1), ".") && peek(p, 2)->kind == TK_NAME) {
        tpl_node *base = mk(p, N_NAME, line);
        base->name = next(p)->s;
        next(p);
        tgt = mk(p, N_GETATTR, line);
        tgt->a = base;
        tgt->name = next(p)->s;
        return tgt;
    }
    tgt = parse_tuple(p, 1, 1, extra_end, 0);
    if (tgt->kind == N_NAME) return tgt;
    if (tgt->kind == N_TUPLE) {
        for (size_t i = 0; i < tgt->args.n; i++)
            if (tgt->args.items[i]->kind != N_NAME) tpl_fail(p->st, line, "syntax error: cannot assign to %s", "expression");
        return tgt;
    }
    tpl_fail(p->st, line, "syntax error: cannot assign to expression");
}

static void parse_signature(parser *p, tpl_node *m) {
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (m->n_params) expect_op(p, ",");
        const char *nm = expect_name(p);
        push_name(p, &m->kwnames, m->n_params, nm);
        m->n_params++;
        tpl_node *def = NULL;
        if (is_op(cur(p), "=")) { next(p); def = parse_expression(p, 1); }
        else if (m->kwvals.n && m->kwvals.items[m->kwvals.n - 1])
            tpl_fail(p->st, cur(p)->line, "syntax error: non-default argument follows default argument");
        push(p, &m->kwvals, def);
    }
    expect_op(p, ")");
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};

static tpl_node *parse_if(parser *p, int line) {
    tpl_node *n = mk(p, N_IF, line);
    n->a = parse_tuple(p, 0, 0, NULL, 0);
    block_end(p);
    n->body = subparse(p, END_IF);
    tpl_tok *t = next(p);
    if (!strcmp(t->s, "elif")) {
        tpl_node *b = mk(p, N_BODY, t->line);
        enter(p);
        push(p, &b->args, parse_if(p, t->line));
        p->depth--;
        n->else_body = b;
        return n;
    }
    if (!strcmp(t->s, "else")) {
        block_end(p);
        n->else_body = subparse(p, END_ENDIF);
        next(p);
    }
    block_end(p);
    return n;
}

static tpl_node *parse_statement(parser *p) {
    tpl_tok *t = cur(p);
    if (t->kind != TK_NAME) unexpected(p, "a statement name");
    int line = t->line;
    const char *nm = next(p)->s;
    tpl_node *n;
    if (!strcmp(nm, "if")) return parse_if(p, line);
    if (!strcmp(nm, "for")) {
        n = mk(p, N_FOR, line);
        n->a = parse_target(p, "in", 0);
        if (!is_name(cur(p), "in")) unexpected(p, "'in'");
        next(p);
        n->b = parse_tuple(p, 0, 0, "recursive", 0);
        if (is_name(cur(p), "if")) { next(p); n->c = parse_expression(p, 1); }
        if (is_name(cur(p), "recursive")) tpl_fail(p->st, line, "unsupported construct: recursive for loops");
        block_end(p);
        p->loop_depth++;
        n->body = subparse(p, END_FOR);
        p->loop_depth--;
        if (!strcmp(next(p)->s, "else")) {
            block_end(p);
            n->else_body = subparse(p, END_ENDFOR);
            next(p);
        }
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "set")) {
        tpl_node *tgt = parse_target(p, NULL, 1);
        if (is_op(cur(p), "=")) {
            next(p);
            n = mk(p, N_SET, line);
            n->a = tgt;
            n->b = parse_tuple(p, 0, 1, NULL, 0);
            block_end(p);
            return n;
        }
        n = mk(p, N_SET_BLOCK, line);
        n->a = tgt;
        if (is_op(cur(p), "|")) n->c = parse_filter(p, NULL, 0);
        block_end(p);
        static const char *const ends[] = {"endset", NULL};
        n->body = subparse(p, ends);
        next(p);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "macro")) {
        n = mk(p, N_MACRO, line);
        n->name = expect_name(p);
        parse_signature(p, n);
        block_end(p);
        static const char *const ends[] = {"endmacro", NULL};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        n->body = subparse(p, ends);
        p->loop_depth = saved;
        n->negated = uses_caller(n->body, 0);
        next(p);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "call")) {
        n = mk(p, N_CALL_BLOCK, line);
        if (is_op(cur(p), "(")) parse_signature(p, n);
        n->a = parse_expression(p, 1);
        if (n->a->kind != N_CALL) tpl_fail(p->st, line, "syntax error: expected call");
        block_end(p);
        static const char *const ends[] = {"endcall", NULL};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        n->body = subparse(p, ends);
        p->loop_depth = saved;
        next(p);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "filter")) {
        n = mk(p, N_FILTER_BLOCK, line);
        n->c = parse_filter(p, NULL, 1);
        block_end(p);
        static const char *const ends[] = {"endfilter", NULL};
        n->body = subparse(p, ends);
        next(p);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        if (!p->loop_depth) tpl_fail(p->st, line, "'%s' outside of a loop", nm);
        n = mk(p, nm[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "generation")) {
        /* transformers' AssistantTracker tag: renders its body unchanged */
        block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        n = subparse(p, ends);
        next(p);
        block_end(p);
        return n;
    }
    if (!strcmp(nm, "with")) {
        n = mk(p, N_WITH, line);
        while (!(cur(p)->kind == TK_BLOCK_END)) {
            if (n->args.n) expect_op(p, ",");
            push(p, &n->args, parse_target(p, NULL, 0));
            expect_op(p, "=");
            push(p, &n->kwvals, parse_expression(p, 1));
        }
        block_end(p);
        static const char *const ends[] = {"endwith", NULL};
        n->body = subparse(p, ends);
        next(p);
        block_end(p);
        return n;
    }
    tpl_fail(p->st, line, "unknown tag '%s'", nm);
}

/* does the subtree read the name `caller` (jinja2's accesses_caller)? */
static int uses_caller(tpl_node *n, int depth) {
    if (!n || depth > TPL_MAX_DEPTH * 4) return 0;
    if (n->kind == N_NAME && !strcmp(n->name, "caller")) return 1;
    tpl_node *kids[] = {n->a, n->b, n->c, n->body, n->else_body};
    for (size_t i = 0; i < sizeof kids / sizeof kids[0]; i++)
        if (uses_caller(kids[i], depth + 1)) return 1;
    const tpl_nodes *lists[] = {&n->args, &n->kwvals, &n->ops};
    for (size_t i = 0; i < 3; i++)
        for (size_t k = 0; k < lists[i]->n; k++)
            if (uses_caller(lists[i]->items[k], depth + 1)) return 1;
    return 0;
}

static int in_list(const char *s, const char *const *l) {
    for (; l && *l; l++)
        if (!strcmp(s, *l)) return 1;
    return 0;
}

/* Parses statements until a block whose first name is in ends; leaves the parser at
 * that name (the caller consumes it). */
static tpl_node *subparse(parser *p, const char *const *ends) {
    enter(p);
    tpl_node *body = mk(p, N_BODY, cur(p)->line);
    for (;;) {
        tpl_tok *t = cur(p);
        if (t->kind == TK_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (const char *const *e = ends; *e; e++)
                    if (!strncmp(*e, "end", 3)) want = *e;
                tpl_fail(p->st, t->line, "unexpected end of template, expected '%s'", want);
            }
            break;
        }
        if (t->kind == TK_DATA) {
            tpl_node *d = mk(p, N_DATA, t->line);
            d->value = tv_str(p->st, t->s, t->n);
            push(p, &body->args, d);
            next(p);
        } else if (t->kind == TK_VAR_BEGIN) {
            next(p);
            tpl_node *o = mk(p, N_OUTPUT, t->line);
            o->a = parse_tuple(p, 0, 1, NULL, 0);
            expect_kind(p, TK_VAR_END, "end of print statement");
            push(p, &body->args, o);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            next(p);
            tpl_tok *nm = cur(p);
            if (nm->kind == TK_NAME && in_list(nm->s, ends)) break;
            if (nm->kind == TK_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else")))
                tpl_fail(p->st, nm->line, "unexpected '%s' tag", nm->s);
            push(p, &body->args, parse_statement(p));
        } else
            unexpected(p, NULL);
    }
    p->depth--;
    return body;
}

tpl_node *tpl_parse(tpl_state *st, tpl_tok *toks, size_t n_toks) {
    parser p = {.st = st, .t = toks, .n = n_toks};
    return subparse(&p, NULL);
}
