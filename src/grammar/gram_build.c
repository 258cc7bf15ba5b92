/* gram_build.c: the expression tree the source compilers build, and its lowering into
 * the flat grammar (rules of alternatives of byte-set / rule elements) that gram_match.c
 * runs. Code-point sets become UTF-8 byte sequences here; nothing here reads a source. */
#include "grammar/gram_flat.h"
#include "grammar/grammar_internal.h"
#include <stdlib.h>
#include <string.h>

#define GROW(arr, n, cap, fail)                                                                                        \
    do {                                                                                                               \
        if ((n) >= (cap)) {                                                                                            \
            int32_t nc_ = (cap) ? (cap)*2 : 64;                                                                        \
            void *p_ = realloc((arr), (size_t)nc_ * sizeof *(arr));                                                    \
            if (!p_) {                                                                                                 \
                fail;                                                                                                  \
            }                                                                                                          \
            (arr) = p_;                                                                                                \
            (cap) = nc_;                                                                                               \
        }                                                                                                              \
    } while (0)

void gr_build_init(gr_build *b) { memset(b, 0, sizeof *b); }

void gr_build_free(gr_build *b) {
    for (int32_t i = 0; i < b->n_rules; i++) free(b->rules[i].name);
    free(b->nodes);
    free(b->pool);
    free(b->ranges);
    free(b->sets);
    free(b->rules);
    memset(b, 0, sizeof *b);
}

static int32_t node_new(gr_build *b, int kind, int32_t a, int32_t bb) {
    if (b->oom || b->n_nodes >= GR_MAX_NODES) {
        b->oom = 1;
        return 0;
    }
    GROW(b->nodes, b->n_nodes, b->cap_nodes, b->oom = 1; return 0);
    gr_node *n = &b->nodes[b->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind, n->a = a, n->b = bb;
    return b->n_nodes++;
}

int32_t gr_empty(gr_build *b) { return node_new(b, GN_EMPTY, 0, 0); }

int32_t gr_byteset_node(gr_build *b, const gr_byteset *s) {
    if (b->oom) return 0;
    GROW(b->sets, b->n_sets, b->cap_sets, b->oom = 1; return 0);
    b->sets[b->n_sets] = *s;
    return node_new(b, GN_BYTES, b->n_sets++, 0);
}

int32_t gr_byte_range(gr_build *b, unsigned lo, unsigned hi) {
    gr_byteset s = {{0}};
    for (unsigned c = lo; c <= hi && c < 256; c++) gr_add(&s, c);
    return gr_byteset_node(b, &s);
}

int32_t gr_byte(gr_build *b, unsigned c) { return gr_byte_range(b, c, c); }

int32_t gr_cpset(gr_build *b, const uint32_t *ranges, int n, int json) {
    if (b->oom) return 0;
    int32_t at = b->n_ranges;
    for (int i = 0; i < n; i++) {
        GROW(b->ranges, b->n_ranges + 1, b->cap_ranges, b->oom = 1; return 0);
        b->ranges[b->n_ranges++] = ranges[2 * i];
        b->ranges[b->n_ranges++] = ranges[2 * i + 1];
    }
    int32_t k = node_new(b, GN_CPSET, at, n);
    if (!b->oom) b->nodes[k].json = (uint8_t)json;
    return k;
}

static int32_t kids_node(gr_build *b, int kind, const int32_t *kids, int n) {
    if (b->oom) return 0;
    int32_t at = b->n_pool;
    for (int i = 0; i < n; i++) {
        GROW(b->pool, b->n_pool, b->cap_pool, b->oom = 1; return 0);
        b->pool[b->n_pool++] = kids[i];
    }
    int32_t k = node_new(b, kind, 0, 0);
    if (!b->oom) b->nodes[k].kids = at, b->nodes[k].n_kids = n;
    return k;
}

int32_t gr_seq(gr_build *b, const int32_t *kids, int n) { return n == 1 ? kids[0] : kids_node(b, GN_SEQ, kids, n); }
int32_t gr_alt(gr_build *b, const int32_t *kids, int n) { return n == 1 ? kids[0] : kids_node(b, GN_ALT, kids, n); }
int32_t gr_seq2(gr_build *b, int32_t x, int32_t y) { return gr_seq(b, (int32_t[]){x, y}, 2); }
int32_t gr_seq3(gr_build *b, int32_t x, int32_t y, int32_t z) { return gr_seq(b, (int32_t[]){x, y, z}, 3); }
int32_t gr_alt2(gr_build *b, int32_t x, int32_t y) { return gr_alt(b, (int32_t[]){x, y}, 2); }

int32_t gr_repeat(gr_build *b, int32_t kid, int32_t min, int32_t max) {
    /* (x+)+, (x*)+, (x+)*, (x*)*: one star or plus; nested ones only multiply the parses */
    if (!b->oom && kid >= 0 && kid < b->n_nodes && max == GR_INF && min <= 1 && b->nodes[kid].kind == GN_REPEAT &&
        b->nodes[kid].b == GR_INF && b->nodes[kid].a <= 1)
        return gr_repeat(b, b->nodes[kid].kids, min * b->nodes[kid].a, GR_INF);
    int32_t k = node_new(b, GN_REPEAT, min, max);
    if (!b->oom) b->nodes[k].kids = kid;
    return k;
}
int32_t gr_opt(gr_build *b, int32_t kid) { return gr_repeat(b, kid, 0, 1); }

int32_t gr_literal(gr_build *b, const char *bytes, size_t n) {
    if (n == 0) return gr_empty(b);
    int32_t *k = malloc(n * sizeof *k);
    if (!k) {
        b->oom = 1;
        return 0;
    }
    for (size_t i = 0; i < n; i++) k[i] = gr_byte(b, (unsigned char)bytes[i]);
    int32_t r = gr_seq(b, k, (int)n);
    free(k);
    return r;
}

int32_t gr_rule_named(gr_build *b, const char *name, size_t len) {
    for (int32_t i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && strlen(b->rules[i].name) == len && !memcmp(b->rules[i].name, name, len)) return i;
    if (b->oom) return -1;
    GROW(b->rules, b->n_rules, b->cap_rules, b->oom = 1; return -1);
    char *nm = malloc(len + 1);
    if (!nm) {
        b->oom = 1;
        return -1;
    }
    memcpy(nm, name, len);
    nm[len] = 0;
    b->rules[b->n_rules] = (gr_rule){nm, -1, 0, 0};
    return b->n_rules++;
}

int32_t gr_rule_new(gr_build *b, int32_t body) {
    if (b->oom) return -1;
    GROW(b->rules, b->n_rules, b->cap_rules, b->oom = 1; return -1);
    b->rules[b->n_rules] = (gr_rule){NULL, body, 0, 0};
    return b->n_rules++;
}

int32_t gr_ref(gr_build *b, int32_t rule) { return node_new(b, GN_RULE, rule, 0); }

/* ---- lowering --------------------------------------------------------------------- */

typedef struct {
    gr_elem *e;
    int32_t n, cap;
} elem_vec;

typedef struct {
    gr_build *b;
    /* output grammar under construction: per flat rule, its alternatives (each an elem_vec) */
    elem_vec **alts;
    int32_t *n_alts;
    int32_t n_flat, cap_flat;
    int32_t *flat_of_rule; /* named/new rule -> flat rule, -1 not yet */
    gr_byteset *sets;
    int32_t n_sets, cap_sets;
    int oom;
    hearth_error *err;
    hearth_status st;
} lower_ctx;

static int32_t flat_new(lower_ctx *c) {
    if (c->oom) return -1;
    if (c->n_flat >= c->cap_flat) {
        int32_t nc = c->cap_flat ? c->cap_flat * 2 : 64;
        elem_vec **a = realloc(c->alts, (size_t)nc * sizeof *a);
        if (a) c->alts = a;
        int32_t *n = realloc(c->n_alts, (size_t)nc * sizeof *n);
        if (n) c->n_alts = n;
        if (!a || !n) {
            c->oom = 1;
            return -1;
        }
        c->cap_flat = nc;
    }
    c->alts[c->n_flat] = NULL;
    c->n_alts[c->n_flat] = 0;
    return c->n_flat++;
}

static elem_vec *alt_new(lower_ctx *c, int32_t r) {
    elem_vec *a = realloc(c->alts[r], (size_t)(c->n_alts[r] + 1) * sizeof *a);
    if (!a) {
        c->oom = 1;
        return NULL;
    }
    c->alts[r] = a;
    memset(&a[c->n_alts[r]], 0, sizeof *a);
    return &a[c->n_alts[r]++];
}

/* Alternatives are stored by index because alt_new may move them. */
static void push_elem(lower_ctx *c, int32_t r, int32_t ai, int kind, int32_t arg) {
    if (c->oom) return;
    elem_vec *v = &c->alts[r][ai];
    GROW(v->e, v->n, v->cap, c->oom = 1; return );
    v->e[v->n++] = (gr_elem){(uint32_t)kind, (uint32_t)arg};
}

static int32_t set_index(lower_ctx *c, const gr_byteset *s) {
    if (c->oom) return 0;
    GROW(c->sets, c->n_sets, c->cap_sets, c->oom = 1; return 0);
    c->sets[c->n_sets] = *s;
    return c->n_sets++;
}

static int32_t lower_anon(lower_ctx *c, int32_t node);
static int32_t lower_rule(lower_ctx *c, int32_t rule);

/* Appends node's elements to alternative ai of flat rule r. */
static void emit(lower_ctx *c, int32_t r, int32_t ai, int32_t node) {
    if (c->oom || c->st) return;
    const gr_node *n = &c->b->nodes[node];
    switch (n->kind) {
    case GN_EMPTY: return;
    case GN_BYTES: push_elem(c, r, ai, GE_BYTES, set_index(c, &c->b->sets[n->a])); return;
    case GN_SEQ:
        for (int32_t i = 0; i < n->n_kids; i++) emit(c, r, ai, c->b->pool[c->b->nodes[node].kids + i]);
        return;
    case GN_RULE: {
        int32_t f = lower_rule(c, n->a);
        if (f >= 0) push_elem(c, r, ai, GE_RULE, f);
        return;
    }
    case GN_REPEAT:
        if (n->a == 1 && n->b == 1) {
            emit(c, r, ai, n->kids);
            return;
        }
        break;
    case GN_CPSET: {
        /* all ASCII (and, in a JSON string, nothing that needs escaping): one byte set */
        gr_byteset s = {{0}};
        int ok = 1;
        for (int32_t i = 0; i < n->b && ok; i++) {
            uint32_t lo = c->b->ranges[n->a + 2 * i], hi = c->b->ranges[n->a + 2 * i + 1];
            if (hi >= 0x80 || (n->json && (lo < 0x20 || (lo <= '"' && hi >= '"') || (lo <= '\\' && hi >= '\\'))))
                ok = 0;
            for (uint32_t x = lo; ok && x <= hi; x++) gr_add(&s, x);
        }
        if (ok) {
            push_elem(c, r, ai, GE_BYTES, set_index(c, &s));
            return;
        }
        break;
    }
    default: break;
    }
    int32_t f = lower_anon(c, node);
    if (f >= 0) push_elem(c, r, ai, GE_RULE, f);
}

/* One alternative of flat rule r made of node. */
static void alt_of(lower_ctx *c, int32_t r, int32_t node) {
    if (!alt_new(c, r)) return;
    emit(c, r, c->n_alts[r] - 1, node);
}

/* UTF-8: appends to flat rule r one alternative per byte-range sequence covering [lo, hi]. */
static void utf8_alts(lower_ctx *c, int32_t r, uint32_t lo, uint32_t hi) {
    if (lo > hi || c->oom) return;
    static const uint32_t limits[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= limits[i] && hi > limits[i]) {
            utf8_alts(c, r, lo, limits[i]);
            utf8_alts(c, r, limits[i] + 1, hi);
            return;
        }
    int len = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_alts(c, r, lo, lo | m);
                utf8_alts(c, r, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_alts(c, r, lo, (hi & ~m) - 1);
                utf8_alts(c, r, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], z[4];
    if (len == 1)
        a[0] = (uint8_t)lo, z[0] = (uint8_t)hi;
    else {
        uint32_t v[2] = {lo, hi};
        uint8_t *o[2] = {a, z};
        for (int k = 0; k < 2; k++) {
            uint32_t x = v[k];
            for (int i = len - 1; i > 0; i--) o[k][i] = (uint8_t)(0x80 | (x & 0x3F)), x >>= 6;
            o[k][0] = (uint8_t)((len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0) | x);
        }
    }
    if (!alt_new(c, r)) return;
    int32_t ai = c->n_alts[r] - 1;
    for (int i = 0; i < len; i++) {
        gr_byteset s = {{0}};
        for (unsigned x = a[i]; x <= z[i]; x++) gr_add(&s, x);
        push_elem(c, r, ai, GE_BYTES, set_index(c, &s));
    }
}

static int cmp_u32pair(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

static void literal_alt(lower_ctx *c, int32_t r, const char *s) {
    if (!alt_new(c, r)) return;
    int32_t ai = c->n_alts[r] - 1;
    for (; *s; s++) {
        gr_byteset bs = {{0}};
        gr_add(&bs, (unsigned char)*s);
        push_elem(c, r, ai, GE_BYTES, set_index(c, &bs));
    }
}

/* The JSON escapes of one code-point set (at most the 32 control characters, quote and
 * backslash), gathered to be written as one trie. */
typedef struct {
    char s[40][8];
    int n;
} esc_list;

/* Alternatives of rule r for the strings s[0..n) from byte depth on, as a byte trie: the
 * strings ending at the next byte share one byte-set alternative, the others one rule per
 * next byte. Escapes all start with a backslash, so a string state holds one stack for
 * them rather than one per escape (the language is the same). */
static void trie_alts(lower_ctx *c, int32_t r, char (*s)[8], int n, int depth) {
    gr_byteset leaf = {{0}}, done = {{0}};
    int any_leaf = 0;
    for (int i = 0; i < n && !c->oom; i++) {
        unsigned x = (unsigned char)s[i][depth];
        if (!x) { /* a string that ends here: the empty alternative */
            alt_new(c, r);
            continue;
        }
        if (gr_has(&done, x)) continue;
        gr_add(&done, x);
        char(*grp)[8] = malloc((size_t)n * sizeof *grp);
        if (!grp) {
            c->oom = 1;
            return;
        }
        int m = 0, longer = 0;
        for (int j = i; j < n; j++)
            if ((unsigned char)s[j][depth] == x) {
                memcpy(grp[m++], s[j], 8);
                longer |= s[j][depth + 1] != 0;
            }
        if (!longer) {
            gr_add(&leaf, x), any_leaf = 1;
        } else if (m == 1) {
            literal_alt(c, r, grp[0] + depth);
        } else {
            int32_t next = flat_new(c);
            if (next >= 0 && alt_new(c, r)) {
                int32_t ai = c->n_alts[r] - 1;
                gr_byteset bs = {{0}};
                gr_add(&bs, x);
                push_elem(c, r, ai, GE_BYTES, set_index(c, &bs));
                push_elem(c, r, ai, GE_RULE, next);
                trie_alts(c, next, grp, m, depth + 1);
            }
        }
        free(grp);
    }
    if (any_leaf && alt_new(c, r)) push_elem(c, r, c->n_alts[r] - 1, GE_BYTES, set_index(c, &leaf));
}

/* One code-point range; in a JSON string control characters, quote and backslash only
 * in their escaped form (the shortest one, as JSON encoders write it), added to esc. */
static void cp_range_alts(lower_ctx *c, int32_t r, uint32_t lo, uint32_t hi, int json, esc_list *esc) {
    if (!json) {
        utf8_alts(c, r, lo, hi);
        return;
    }
    for (uint32_t cp = lo; cp <= hi && cp < 0x20; cp++) {
        static const char *named[0x20] = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r"};
        char *buf = esc->s[esc->n++];
        if (named[cp])
            strcpy(buf, named[cp]);
        else {
            static const char hex[] = "0123456789abcdef";
            memcpy(buf, "\\u00", 4), buf[4] = hex[cp >> 4], buf[5] = hex[cp & 15], buf[6] = 0;
        }
    }
    if (hi < 0x20) return;
    if (lo < 0x20) lo = 0x20;
    static const uint32_t cut[2] = {'"', '\\'};
    for (int j = 0; j < 2; j++)
        if (lo <= cut[j] && hi >= cut[j]) {
            if (lo < cut[j]) utf8_alts(c, r, lo, cut[j] - 1);
            strcpy(esc->s[esc->n++], j ? "\\\\" : "\\\"");
            lo = cut[j] + 1;
        }
    if (lo <= hi) utf8_alts(c, r, lo, hi);
}

/* Code-point set: merged, surrogates cut out, JSON-escaped forms where asked. */
static void cpset_alts(lower_ctx *c, int32_t r, const gr_node *n) {
    int32_t k = n->b;
    uint32_t *v = malloc(((size_t)k + 2) * 2 * sizeof *v);
    if (!v) {
        c->oom = 1;
        return;
    }
    memcpy(v, c->b->ranges + n->a, (size_t)k * 2 * sizeof *v);
    qsort(v, (size_t)k, 2 * sizeof *v, cmp_u32pair);
    int32_t m = 0;
    for (int32_t i = 0; i < k; i++) {
        if (v[2 * i] > v[2 * i + 1]) continue;
        if (m && v[2 * i] <= v[2 * m - 1] + 1) {
            if (v[2 * i + 1] > v[2 * m - 1]) v[2 * m - 1] = v[2 * i + 1];
        } else
            v[2 * m] = v[2 * i], v[2 * m + 1] = v[2 * i + 1], m++;
    }
    esc_list esc = {.n = 0};
    for (int32_t i = 0; i < m; i++) {
        uint32_t lo = v[2 * i], hi = v[2 * i + 1] > 0x10FFFF ? 0x10FFFF : v[2 * i + 1];
        /* surrogates have no UTF-8 form: the range splits around them */
        if (lo <= 0xDFFF && hi >= 0xD800) {
            if (lo < 0xD800) cp_range_alts(c, r, lo, 0xD7FF, n->json, &esc);
            if (hi > 0xDFFF) cp_range_alts(c, r, 0xE000, hi, n->json, &esc);
        } else
            cp_range_alts(c, r, lo, hi, n->json, &esc);
    }
    if (esc.n) trie_alts(c, r, esc.s, esc.n, 0);
    free(v);
}

static int32_t lower_anon(lower_ctx *c, int32_t node) {
    int32_t r = flat_new(c);
    if (r < 0) return -1;
    const gr_node n = c->b->nodes[node];
    switch (n.kind) {
    case GN_ALT:
        for (int32_t i = 0; i < n.n_kids; i++) alt_of(c, r, c->b->pool[n.kids + i]);
        break;
    case GN_CPSET: cpset_alts(c, r, &n); break;
    case GN_REPEAT: {
        int32_t min = n.a, max = n.b;
        if (min < 0 || min > GR_MAX_REPEAT || (max != GR_INF && (max < min || max > GR_MAX_REPEAT))) {
            c->st = err_set(c->err, HEARTH_ERR_UNSUPPORTED, "repetition {%d,%d} is out of range (at most %d)", min, max,
                            GR_MAX_REPEAT);
            return -1;
        }
        /* the repeated item as one element: a rule unless it is a single byte set */
        gr_elem item;
        const gr_node *kid = &c->b->nodes[n.kids];
        if (kid->kind == GN_BYTES)
            item = (gr_elem){GE_BYTES, (uint32_t)set_index(c, &c->b->sets[kid->a])};
        else if (kid->kind == GN_RULE) {
            int32_t f = lower_rule(c, kid->a);
            if (f < 0) return -1;
            item = (gr_elem){GE_RULE, (uint32_t)f};
        } else {
            int32_t f = flat_new(c);
            if (f < 0) return -1;
            alt_of(c, f, n.kids);
            item = (gr_elem){GE_RULE, (uint32_t)f};
        }
        if (!alt_new(c, r)) return -1;
        for (int32_t i = 0; i < min; i++) push_elem(c, r, 0, (int)item.kind, (int32_t)item.arg);
        if (max == GR_INF) {
            /* T ::= item T | "" : right recursion in tail position keeps the stack flat */
            int32_t t = flat_new(c);
            if (t < 0 || !alt_new(c, t) || !alt_new(c, t)) return -1;
            push_elem(c, t, 0, (int)item.kind, (int32_t)item.arg);
            push_elem(c, t, 0, GE_RULE, t);
            push_elem(c, r, 0, GE_RULE, t);
        } else if (max > min) {
            /* O_k ::= item O_(k-1) | "" */
            int32_t prev = -1;
            for (int32_t k = 0; k < max - min; k++) {
                int32_t o = flat_new(c);
                if (o < 0 || !alt_new(c, o) || !alt_new(c, o)) return -1;
                push_elem(c, o, 0, (int)item.kind, (int32_t)item.arg);
                if (prev >= 0) push_elem(c, o, 0, GE_RULE, prev);
                prev = o;
            }
            push_elem(c, r, 0, GE_RULE, prev);
        }
        break;
    }
    default: alt_of(c, r, node); break;
    }
    return c->oom ? -1 : r;
}

static int32_t lower_rule(lower_ctx *c, int32_t rule) {
    if (c->flat_of_rule[rule] >= 0) return c->flat_of_rule[rule];
    gr_rule *ru = &c->b->rules[rule];
    if (ru->body < 0) {
        if (!c->st)
            c->st = err_set(c->err, HEARTH_ERR_FORMAT, "%d:%d: undefined rule '%s'", ru->line, ru->col,
                            ru->name ? ru->name : "?");
        return -1;
    }
    int32_t r = flat_new(c);
    if (r < 0) return -1;
    c->flat_of_rule[rule] = r;
    const gr_node *n = &c->b->nodes[ru->body];
    if (n->kind == GN_ALT) {
        int32_t kids = n->kids, nk = n->n_kids;
        for (int32_t i = 0; i < nk; i++) alt_of(c, r, c->b->pool[kids + i]);
    } else
        alt_of(c, r, ru->body);
    return r;
}

/* Nullable rules, then a left-corner walk: a rule reachable from itself without
 * consuming a byte would make the matcher expand forever. */
static hearth_status check_left_recursion(grammar *g, hearth_error *err) {
    int32_t nr = g->n_rules;
    uint8_t *nullable = calloc((size_t)nr, 1);
    uint8_t *state = calloc((size_t)nr, 1);
    int32_t *stack = malloc(((size_t)nr + 1) * 2 * sizeof *stack);
    if (!nullable || !state || !stack) {
        free(nullable), free(state), free(stack);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < nr; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1] && !nullable[r]; a++) {
                uint32_t p = g->alt_start[a];
                while (g->elems[p].kind == GE_RULE && nullable[g->elems[p].arg]) p++;
                if (g->elems[p].kind == GE_END) nullable[r] = 1, changed = 1;
            }
        }
    }
    hearth_status st = HEARTH_OK;
    /* iterative DFS over left-corner edges; state 1 = on the path, 2 = done */
    for (int32_t s = 0; s < nr && !st; s++) {
        if (state[s]) continue;
        int32_t sp = 0;
        stack[sp++] = s, stack[sp++] = 0;
        state[s] = 1;
        while (sp && !st) {
            int32_t r = stack[sp - 2], *it = &stack[sp - 1];
            /* enumerate left corners of r: (alt, position) flattened into one counter */
            int32_t next = -1;
            int32_t count = 0;
            for (uint32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1] && next < 0; a++) {
                for (uint32_t p = g->alt_start[a]; g->elems[p].kind == GE_RULE; p++) {
                    if (count++ == *it) {
                        next = (int32_t)g->elems[p].arg;
                        break;
                    }
                    if (!nullable[g->elems[p].arg]) break;
                }
            }
            if (next < 0) {
                state[r] = 2;
                sp -= 2;
                continue;
            }
            (*it)++;
            if (state[next] == 1) {
                st = err_set(err, HEARTH_ERR_UNSUPPORTED, "left recursion through rule '%s' is not supported",
                             g->rule_names[next] ? g->rule_names[next] : "(anonymous)");
            } else if (!state[next]) {
                state[next] = 1;
                stack[sp++] = next, stack[sp++] = 0;
            }
        }
    }
    free(nullable), free(state), free(stack);
    return st;
}

void grammar_free(grammar *g) {
    if (!g) return;
    gm_core_free(g->core);
    for (int32_t i = 0; g->rule_names && i < g->n_rules; i++) free(g->rule_names[i]);
    free(g->rule_names);
    free(g->elems);
    free(g->sets);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g);
}

size_t grammar_size(const grammar *g) { return g ? (size_t)g->n_elems : 0; }

/* Whether node k matches at least one string, rules judged by prod_rule (the previous
 * round of the fixpoint below); memo: this round's answers per node (-1: not yet). */
static int node_productive(const gr_build *b, int32_t k, const uint8_t *prod_rule, int8_t *memo) {
    if (memo[k] >= 0) return memo[k];
    const gr_node *n = &b->nodes[k];
    int v = 0;
    switch (n->kind) {
    case GN_EMPTY: v = 1; break;
    case GN_BYTES:
        for (int i = 0; i < 8 && !v; i++) v = b->sets[n->a].w[i] != 0;
        break;
    case GN_CPSET:
        for (int32_t i = 0; i < n->b && !v; i++) v = b->ranges[n->a + 2 * i] <= b->ranges[n->a + 2 * i + 1];
        break;
    case GN_SEQ:
        v = 1;
        for (int32_t i = 0; i < n->n_kids && v; i++) v = node_productive(b, b->pool[n->kids + i], prod_rule, memo);
        break;
    case GN_ALT:
        for (int32_t i = 0; i < n->n_kids && !v; i++) v = node_productive(b, b->pool[n->kids + i], prod_rule, memo);
        break;
    case GN_REPEAT: v = n->a == 0 || node_productive(b, n->kids, prod_rule, memo); break; /* kids: the node itself */
    case GN_RULE: v = prod_rule[n->a]; break;
    default: v = 1; break; /* a kind this check does not know: never the reason to refuse */
    }
    return memo[k] = (int8_t)v;
}

/* Whether rule root matches at least one string: the productive rules as a least fixpoint
 * (a rule is productive once its body is, given the rules found so far). -1: out of memory. */
static int rule_productive(const gr_build *b, int32_t root) {
    uint8_t *prod = calloc((size_t)b->n_rules + 1, 1);
    int8_t *memo = malloc((size_t)b->n_nodes + 1);
    if (!prod || !memo) {
        free(prod), free(memo);
        return -1;
    }
    for (int changed = 1; changed && !prod[root];) {
        changed = 0;
        memset(memo, -1, (size_t)b->n_nodes + 1);
        for (int32_t r = 0; r < b->n_rules; r++)
            if (!prod[r] && b->rules[r].body >= 0 && node_productive(b, b->rules[r].body, prod, memo))
                prod[r] = 1, changed = 1;
    }
    int v = prod[root];
    free(prod), free(memo);
    return v;
}

hearth_status gr_finish(gr_build *b, int32_t root, grammar **out, hearth_error *err) {
    *out = NULL;
    if (b->oom) return err_set(err, HEARTH_ERR_NOMEM, "grammar too large or out of memory");
    lower_ctx c = {.b = b, .err = err};
    c.flat_of_rule = malloc(((size_t)b->n_rules + 1) * sizeof *c.flat_of_rule);
    if (!c.flat_of_rule) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < b->n_rules; i++) c.flat_of_rule[i] = -1;
    lower_rule(&c, root);
    hearth_status st = c.st;
    if (!st && c.oom) st = err_set(err, HEARTH_ERR_NOMEM, "grammar too large or out of memory");
    grammar *g = NULL;
    if (!st) {
        g = calloc(1, sizeof *g);
        int64_t ne = 0, na = 0;
        for (int32_t r = 0; r < c.n_flat; r++) {
            na += c.n_alts[r];
            for (int32_t a = 0; a < c.n_alts[r]; a++) ne += c.alts[r][a].n + 1;
        }
        if (g) {
            g->n_rules = c.n_flat;
            g->n_elems = (int32_t)ne;
            g->elems = malloc((size_t)(ne + 1) * sizeof *g->elems);
            g->alt_start = malloc((size_t)(na + 1) * sizeof *g->alt_start);
            g->rule_alt0 = malloc(((size_t)c.n_flat + 1) * sizeof *g->rule_alt0);
            g->rule_names = calloc((size_t)c.n_flat + 1, sizeof *g->rule_names);
            g->sets = c.sets, c.sets = NULL;
            g->n_sets = c.n_sets;
        }
        if (!g || !g->elems || !g->alt_start || !g->rule_alt0 || !g->rule_names) {
            grammar_free(g), g = NULL;
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        } else {
            uint32_t e = 0, a = 0;
            for (int32_t r = 0; r < c.n_flat; r++) {
                g->rule_alt0[r] = a;
                for (int32_t k = 0; k < c.n_alts[r]; k++) {
                    g->alt_start[a++] = e;
                    if (c.alts[r][k].n) memcpy(g->elems + e, c.alts[r][k].e, (size_t)c.alts[r][k].n * sizeof *g->elems);
                    e += (uint32_t)c.alts[r][k].n;
                    g->elems[e++] = (gr_elem){GE_END, 0};
                }
            }
            g->rule_alt0[c.n_flat] = a;
            for (int32_t i = 0; i < b->n_rules; i++)
                if (c.flat_of_rule[i] >= 0 && b->rules[i].name)
                    g->rule_names[c.flat_of_rule[i]] = strdup(b->rules[i].name);
            g->root = 0; /* the root is lowered first */
            st = check_left_recursion(g, err);
            int productive = st ? 1 : rule_productive(b, root);
            if (productive < 0) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            else if (!productive) /* a JSON schema no value satisfies ({"not": {}}, a required property of schema false) */
                st = err_set(err, HEARTH_ERR_FORMAT, "the constraint accepts no output at all (nothing satisfies it)");
            if (st) grammar_free(g), g = NULL;
        }
    }
    for (int32_t r = 0; r < c.n_flat; r++) {
        for (int32_t a = 0; a < c.n_alts[r]; a++) free(c.alts[r][a].e);
        free(c.alts[r]);
    }
    free(c.alts), free(c.n_alts), free(c.flat_of_rule), free(c.sets);
    *out = g;
    return st;
}
