/* gram_schema.c: JSON Schema (draft 2020-12 / 2019-09 / 07 / 04 keywords) to grammar
 * rules. The output is JSON text with object properties in the schema's order, optional
 * spacing (none, one space, or a newline and indentation), and strings in their shortest
 * escaped form. A keyword that constrains values but has no exact grammar here
 * (uniqueItems, if/then/else, a fractional multipleOf, not over a pattern, ...) is refused
 * by name rather than silently ignored: a schema compiles only when every instance the
 * grammar accepts validates. Listed values (const / enum) meet every keyword through an
 * exact validator instead. */
#include "grammar/gram_parse.h"
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_DEPTH 64 /* schema nesting / $ref-merge chains followed */
/* minProperties / maxProperties: rules per (property, count) pair; 100 declared names
 * with maxProperties 1000 is about this many */
#define SC_MAX_COUNT_RULES 100000
#define SC_MAX_PAIRS 256      /* anyOf and anyOf combined: one branch per pair */
#define SC_MAX_PAIRS_ALL 4096 /* in one schema: nested pairings grow as a product */
/* The strings a `not: {enum: [...]}` excludes, as the complement of the enum writes them
 * (a key no JSON Schema vocabulary uses; sc_string and sc_valid read it). */
#define SC_NOT_STRINGS "$hearth-not-strings"

typedef struct {
    json_t *target;
    int32_t rule;
} sc_ref;

typedef struct {
    gr_build *b;
    json_t *root;
    hearth_error *err;
    hearth_status st;
    sc_ref *refs;
    int n_refs, cap_refs;
    int32_t ws, value, string, string_rest, number, integer_any, never;
    json_t *keep;  /* merged schemas, freed with the context */
    int ref_alone; /* drafts 4-7: keywords beside $ref are ignored */
    int64_t pairs; /* anyOf branch pairs made so far (SC_MAX_PAIRS_ALL in all) */
    int frac_max;  /* sc_number under multipleOf 10^-k: k (fraction digits after the k-th are 0); 0: any */
} sc_ctx;

__attribute__((format(printf, 2, 3))) static int32_t sc_fail(sc_ctx *c, const char *fmt, ...) {
    if (!c->st) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        c->st = err_set(c->err, HEARTH_ERR_UNSUPPORTED, "json schema: %s", msg);
    }
    return c->never;
}

static int32_t re_node(sc_ctx *c, const char *re, int json) {
    int32_t n = 0;
    if (!c->st) c->st = gr_regex(c->b, re, strlen(re), json, &n, c->err);
    return n;
}

static int32_t lit(sc_ctx *c, const char *s) { return gr_literal(c->b, s, strlen(s)); }

static int32_t rule_of(sc_ctx *c, int32_t body) {
    int32_t r = gr_rule_new(c->b, body);
    return r < 0 ? c->never : gr_ref(c->b, r);
}

/* The free-JSON rules every schema may use. */
static void sc_base(sc_ctx *c) {
    gr_build *b = c->b;
    gr_byteset none = {{0}};
    c->never = gr_byteset_node(b, &none);
    int32_t tabs = gr_repeat(b, re_node(c, "[ \t]", 0), 0, 20);
    c->ws = rule_of(c, gr_opt(b, gr_alt2(b, lit(c, " "), gr_seq2(b, lit(c, "\n"), tabs))));
    uint32_t all[2] = {0, 0x10FFFF};
    int32_t ch = gr_cpset(b, all, 1, 1);
    if (!b->py_strings) ch = gr_alt2(b, ch, re_node(c, "\\\\([/]|u[0-9a-fA-F]{4})", 0));
    c->string_rest = rule_of(c, gr_seq2(b, gr_repeat(b, ch, 0, GR_INF), lit(c, "\"")));
    c->string = rule_of(c, gr_seq2(b, lit(c, "\""), c->string_rest));
    c->number = rule_of(c, re_node(c,
                                   b->small_numbers ? "-?(0|[1-9][0-9]{0,14})(\\.[0-9]+)?([eE][-+]?[0-9]{1,2})?"
                                                    : "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?",
                                   0));
    c->integer_any = rule_of(c, re_node(c, b->small_numbers ? "-?(0|[1-9][0-9]{0,14})" : "-?(0|[1-9][0-9]*)", 0));
    int32_t vr = gr_rule_new(b, -1);
    c->value = gr_ref(b, vr);
    int32_t member = gr_seq(b, (int32_t[]){c->string, c->ws, lit(c, ":"), c->ws, c->value}, 5);
    int32_t comma = gr_seq3(b, c->ws, lit(c, ","), c->ws);
    int32_t members = gr_seq2(b, member, gr_repeat(b, gr_seq2(b, comma, member), 0, GR_INF));
    int32_t object = gr_seq(b, (int32_t[]){lit(c, "{"), c->ws, gr_opt(b, gr_seq2(b, members, c->ws)), lit(c, "}")}, 4);
    int32_t items = gr_seq2(b, c->value, gr_repeat(b, gr_seq2(b, comma, c->value), 0, GR_INF));
    int32_t array = gr_seq(b, (int32_t[]){lit(c, "["), c->ws, gr_opt(b, gr_seq2(b, items, c->ws)), lit(c, "]")}, 4);
    int32_t alts[] = {object, array, c->string, c->number, lit(c, "true"), lit(c, "false"), lit(c, "null")};
    if (vr >= 0) b->rules[vr].body = gr_alt(b, alts, 7);
}

/* ---- keyword tables ---------------------------------------------------------------- */

/* Keywords that only annotate: ignored. Unknown keywords are annotations too (JSON
 * Schema ignores them); the refused list below names what we cannot enforce. */
static const char *const REFUSED[] = {
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
    "uniqueItems",
};

static int refused_ok(const char *k, json_t *v) {
    /* trivially satisfied forms */
    if (!strcmp(k, "uniqueItems")) return json_is_false(v);
    if (!strcmp(k, "minContains")) return json_is_integer(v) && json_integer_value(v) == 0;
    if (!strcmp(k, "dependencies") || !strcmp(k, "dependentRequired") || !strcmp(k, "dependentSchemas"))
        return json_is_object(v) && json_object_size(v) == 0;
    if (!strcmp(k, "unevaluatedProperties") || !strcmp(k, "unevaluatedItems")) return json_is_true(v);
    if (!strcmp(k, "propertyNames")) return json_is_true(v) || (json_is_object(v) && !json_object_size(v));
    return 0;
}

static int check_keywords(sc_ctx *c, json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        for (size_t i = 0; i < sizeof REFUSED / sizeof *REFUSED; i++)
            if (!strcmp(k, REFUSED[i]) && !refused_ok(k, v)) {
                sc_fail(c, "keyword '%s' is not supported", k);
                return 0;
            }
    }
    return 1;
}

/* ---- $ref ---------------------------------------------------------------------------- */

static json_t *resolve(sc_ctx *c, const char *ref) {
    if (ref[0] != '#') {
        sc_fail(c, "$ref '%.100s': only references inside the document (#...) are supported", ref);
        return NULL;
    }
    json_t *at = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        sc_fail(c, "$ref '%.100s': anchors are not supported", ref);
        return NULL;
    }
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '1')
                tok[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0')
                tok[n++] = '~', p += 2;
            else if (p[0] == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(h, NULL, 16), p += 3;
            } else
                tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(at))
            at = json_object_get(at, tok);
        else if (json_is_array(at)) {
            char *e;
            long i = strtol(tok, &e, 10);
            at = *e || e == tok ? NULL : json_array_get(at, (size_t)i);
        } else
            at = NULL;
        if (!at) {
            sc_fail(c, "$ref '%.100s' points at nothing", ref);
            return NULL;
        }
    }
    return at;
}

static int is_annotation(const char *k) {
    static const char *const ann[] = {
        "title", "description", "default",  "examples",         "example",         "$schema",
        "$id",   "id",          "$comment", "deprecated",       "readOnly",        "writeOnly",
        "$defs", "definitions", "$anchor",  "contentMediaType", "contentEncoding", "$vocabulary"};
    for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
        if (!strcmp(k, ann[i])) return 1;
    return 0;
}

/* Keywords this compiler reads (or refuses, REFUSED): any other keyword is an annotation
 * (JSON Schema ignores unknown keywords: "x-taplo", "help", ...), so two different values
 * of it never stop a merge. */
static int is_assertion(const char *k) {
    static const char *const read[] = {"type",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "items",
                                       "prefixItems",
                                       "additionalItems",
                                       "minItems",
                                       "maxItems",
                                       "enum",
                                       "const",
                                       "anyOf",
                                       "allOf",
                                       "oneOf",
                                       "not",
                                       "$ref",
                                       "minLength",
                                       "maxLength",
                                       "pattern",
                                       "format",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum",
                                       "multipleOf",
                                       "patternProperties",
                                       "minProperties",
                                       "maxProperties",
                                       SC_NOT_STRINGS};
    for (size_t i = 0; i < sizeof read / sizeof *read; i++)
        if (!strcmp(k, read[i])) return 1;
    for (size_t i = 0; i < sizeof REFUSED / sizeof *REFUSED; i++)
        if (!strcmp(k, REFUSED[i])) return 1;
    return 0;
}

/* ---- merging (allOf, and sibling keywords of $ref / anyOf) ----------------------------- */

static json_t *sc_deref(sc_ctx *c, json_t *s, int depth);

static json_t *types_of(json_t *t) {
    json_t *a = json_array();
    if (json_is_string(t))
        json_array_append(a, t);
    else if (json_is_array(t))
        json_array_extend(a, t);
    return a;
}

static int has_type(json_t *arr, const char *t) {
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), t)) return 1;
    return 0;
}

static json_t *merge(sc_ctx *c, json_t *a, json_t *b, int depth);

/* How a key both objects have is combined: the value to store under it in out (the copy
 * being built, which the function may also edit). */
typedef json_t *(*sc_combine_fn)(sc_ctx *c, json_t *out, const char *k, json_t *mine, json_t *theirs, int depth);

/* A copy of object x with y's members added: a key only one side has is taken as it is, a
 * key both have goes through `both`. */
static json_t *merge_members(sc_ctx *c, json_t *x, json_t *y, int depth, sc_combine_fn both) {
    json_t *out = json_copy(x);
    const char *k;
    json_t *v;
    json_object_foreach(y, k, v) {
        json_t *e = json_object_get(out, k);
        json_object_set_new(out, k, e ? both(c, out, k, e, v, depth) : json_incref(v));
    }
    return out;
}

/* properties / $defs members: the same name on both sides is both schemas at once */
static json_t *combine_subschemas(sc_ctx *c, json_t *out, const char *k, json_t *mine, json_t *theirs, int depth) {
    (void)out, (void)k;
    return merge(c, mine, theirs, depth + 1);
}

static json_t *merge_key(sc_ctx *c, const char *k, json_t *x, json_t *y, int depth) {
    if (json_equal(x, y)) return json_incref(x);
    if (!strcmp(k, "type")) {
        json_t *tx = types_of(x), *ty = types_of(y), *out = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(tx, i, v) {
            const char *t = json_string_value(v);
            if (!t) continue;
            if (has_type(ty, t))
                json_array_append(out, v);
            else if (!strcmp(t, "integer") && has_type(ty, "number"))
                json_array_append(out, v);
            else if (!strcmp(t, "number") && has_type(ty, "integer"))
                json_array_append_new(out, json_string("integer"));
        }
        json_decref(tx), json_decref(ty);
        return out;
    }
    if (!strcmp(k, "required")) {
        json_t *out = json_copy(x);
        size_t i;
        json_t *v;
        json_array_foreach(y, i, v) {
            size_t j;
            json_t *w;
            int dup = 0;
            json_array_foreach(out, j, w) dup |= json_equal(v, w);
            if (!dup) json_array_append(out, v);
        }
        return out;
    }
    if (!strcmp(k, "properties") || !strcmp(k, "$defs") || !strcmp(k, "definitions"))
        return merge_members(c, x, y, depth, combine_subschemas);
    static const char *const maxes[] = {"minimum", "exclusiveMinimum", "minLength", "minItems"};
    static const char *const mins[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems"};
    for (int i = 0; i < 4; i++) {
        if (json_is_number(x) && json_is_number(y) && !strcmp(k, maxes[i]))
            return json_incref(json_number_value(x) >= json_number_value(y) ? x : y);
        if (json_is_number(x) && json_is_number(y) && !strcmp(k, mins[i]))
            return json_incref(json_number_value(x) <= json_number_value(y) ? x : y);
    }
    if (!strcmp(k, "enum") && json_is_array(x) && json_is_array(y)) {
        json_t *out = json_array();
        size_t i, j;
        json_t *v, *w;
        json_array_foreach(x, i, v) json_array_foreach(y, j, w) if (json_equal(v, w)) {
            json_array_append(out, v);
            break;
        }
        return out;
    }
    if (!strcmp(k, "items") || !strcmp(k, "additionalProperties") || !strcmp(k, "additionalItems")) {
        if (json_is_true(x) || (json_is_object(x) && !json_object_size(x))) return json_incref(y);
        if (json_is_true(y) || (json_is_object(y) && !json_object_size(y))) return json_incref(x);
        if (json_is_false(x) || json_is_false(y)) return json_false();
        if (json_is_object(x) && json_is_object(y)) return merge(c, x, y, depth + 1);
    }
    if (!strcmp(k, "not")) return json_pack("{s:[O,O]}", "anyOf", x, y); /* not x and not y */
    if (!strcmp(k, SC_NOT_STRINGS) && json_is_array(x) && json_is_array(y)) {
        json_t *out = json_copy(x);
        json_array_extend(out, y);
        return out;
    }
    if (is_annotation(k) || !is_assertion(k)) return json_incref(x);
    sc_fail(c, "cannot combine two different '%s' (allOf or $ref siblings)", k);
    return json_incref(x);
}

/* A keyword both schemas have. Both sides branch (anyOf/oneOf/allOf): keep one side's
 * branches, fold the other into allOf. */
static json_t *combine_keywords(sc_ctx *c, json_t *out, const char *k, json_t *mine, json_t *theirs, int depth) {
    if ((strcmp(k, "anyOf") && strcmp(k, "oneOf") && strcmp(k, "allOf")) || json_equal(mine, theirs))
        return merge_key(c, k, mine, theirs, depth);
    if (!strcmp(k, "anyOf") && json_is_array(mine) && json_is_array(theirs)) {
        /* (a1 or a2) and (b1 or b2): every pair, so no allOf is left to fold again */
        c->pairs += (int64_t)(json_array_size(mine) * json_array_size(theirs));
        if (json_array_size(mine) * json_array_size(theirs) > SC_MAX_PAIRS || c->pairs > SC_MAX_PAIRS_ALL) {
            sc_fail(c, "two anyOf to combine (allOf or $ref siblings) with more than %d branch pairs", SC_MAX_PAIRS);
            return json_incref(mine);
        }
        json_t *pairs = json_array(), *x, *y;
        size_t i, j;
        json_array_foreach(mine, i, x) json_array_foreach(theirs, j, y)
            json_array_append_new(pairs, json_pack("{s:[O,O]}", "allOf", x, y));
        return pairs;
    }
    json_t *all = json_object_get(out, "allOf");
    json_t *folded = all ? json_copy(all) : json_array();
    json_t *w = json_object();
    json_object_set(w, k, theirs);
    json_array_append_new(folded, w);
    if (!strcmp(k, "allOf")) return folded;
    json_object_set_new(out, "allOf", folded);
    return json_incref(mine);
}

/* The intersection of two schemas, for the keywords where it is a schema again. */
static json_t *merge(sc_ctx *c, json_t *a, json_t *b, int depth) {
    if (depth > SC_MAX_DEPTH) {
        sc_fail(c, "schema combination nested too deeply (recursive allOf/$ref?)");
        return json_object();
    }
    if (json_is_true(a)) return json_incref(b);
    if (json_is_true(b)) return json_incref(a);
    if (json_is_false(a) || json_is_false(b)) return json_false();
    a = sc_deref(c, a, depth + 1);
    b = sc_deref(c, b, depth + 1);
    if (!json_is_object(a) || !json_is_object(b)) {
        json_decref(a), json_decref(b);
        return json_object();
    }
    json_t *out = merge_members(c, a, b, depth, combine_keywords);
    /* additionalProperties looks only at its own schema's properties: a side that allows no
     * others keeps the union from naming keys only the other side declares */
    json_t *sides[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        json_t *ap = json_object_get(sides[i], "additionalProperties");
        json_t *mine = json_object_get(sides[i], "properties"), *theirs = json_object_get(sides[1 - i], "properties");
        json_t *outp = json_object_get(out, "properties");
        if (!ap || json_is_true(ap) || (json_is_object(ap) && !json_object_size(ap)) || !json_is_object(outp)) continue;
        const char *key;
        json_t *val, *tmp;
        json_object_foreach_safe(outp, tmp, key, val) {
            if (json_object_get(mine, key)) continue;
            if (json_is_false(ap))
                json_object_del(outp, key);
            else if (json_object_get(theirs, key))
                sc_fail(c, "additionalProperties with a schema beside properties declared in allOf / $ref");
        }
    }
    json_decref(a), json_decref(b);
    return out;
}

/* s with its $ref and allOf folded in (a new reference). Properties come in the order
 * the referenced schema, the allOf items, then s itself declare them. */
static json_t *sc_deref(sc_ctx *c, json_t *s, int depth) {
    if (!json_is_object(s) || depth > SC_MAX_DEPTH) return json_incref(s);
    json_t *ref = json_object_get(s, "$ref"), *all = json_object_get(s, "allOf");
    if (!ref && !all) return json_incref(s);
    json_t *own = json_copy(s);
    json_object_del(own, "$ref");
    json_object_del(own, "allOf");
    if (json_is_string(ref) && c->ref_alone) {
        json_decref(own);
        own = json_object(); /* drafts 4-7: $ref replaces its siblings */
        all = NULL;
    }
    json_t *acc = json_true();
    if (json_is_string(ref)) {
        json_t *t = resolve(c, json_string_value(ref));
        if (t) {
            json_decref(acc);
            acc = sc_deref(c, t, depth + 1);
        }
    }
    if (json_is_array(all)) {
        size_t i;
        json_t *v;
        json_array_foreach(all, i, v) {
            json_t *m = merge(c, acc, v, depth + 1);
            json_decref(acc);
            acc = m;
            if (c->st) break;
        }
    }
    json_t *m = merge(c, acc, own, depth + 1);
    json_decref(acc), json_decref(own);
    return m;
}

/* ---- numbers ----------------------------------------------------------------------------- */

/* digits of v, zero-padded to width */
static void digits(int64_t v, int width, char *out) {
    for (int i = width - 1; i >= 0; i--) out[i] = (char)('0' + v % 10), v /= 10;
    out[width] = 0;
}

/* fixed-width decimal strings lo..hi (same length) */
static int32_t fixed_range(sc_ctx *c, const char *lo, const char *hi, int n) {
    if (n == 0) return gr_empty(c->b);
    gr_build *b = c->b;
    if (lo[0] == hi[0]) return gr_seq2(b, gr_byte(b, (unsigned char)lo[0]), fixed_range(c, lo + 1, hi + 1, n - 1));
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n), memset(zeros, '0', (size_t)n);
    int32_t alts[3];
    int k = 0;
    alts[k++] = gr_seq2(b, gr_byte(b, (unsigned char)lo[0]), fixed_range(c, lo + 1, nines, n - 1));
    if (lo[0] + 1 <= hi[0] - 1)
        alts[k++] = gr_seq2(b, gr_byte_range(b, (unsigned char)lo[0] + 1, (unsigned char)hi[0] - 1),
                            gr_repeat(b, gr_byte_range(b, '0', '9'), n - 1, n - 1));
    alts[k++] = gr_seq2(b, gr_byte(b, (unsigned char)hi[0]), fixed_range(c, zeros, hi + 1, n - 1));
    return gr_alt(b, alts, k);
}

static int ndigits(int64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

/* non-negative integers in [a, b]; b < 0: unbounded */
static int32_t nonneg_range(sc_ctx *c, int64_t a, int64_t b) {
    gr_build *bb = c->b;
    int32_t alts[24];
    int k = 0;
    int la = ndigits(a), lb = b < 0 ? la : ndigits(b);
    int64_t p10 = 1;
    for (int i = 1; i < la; i++) p10 *= 10;
    for (int len = la; len <= lb && len <= 19; len++) {
        int64_t lo = len == 1 ? 0 : p10;
        int64_t hi = len >= 19 ? INT64_MAX : p10 * 10 - 1;
        if (lo < a) lo = a;
        if (b >= 0 && hi > b) hi = b;
        if (lo <= hi) {
            char ls[24], hs[24];
            digits(lo, len, ls), digits(hi, len, hs);
            alts[k++] = fixed_range(c, ls, hs, len);
        }
        if (len < 19) p10 = len == la && len == 1 ? 10 : p10 * 10;
    }
    if (b < 0 && la < 19)
        alts[k++] = gr_seq2(bb, gr_byte_range(bb, '1', '9'), gr_repeat(bb, gr_byte_range(bb, '0', '9'), la, GR_INF));
    return k ? gr_alt(bb, alts, k) : c->never;
}

/* integers in [lo, hi]; has_*: 0 for unbounded */
static int32_t int_range(sc_ctx *c, int has_lo, int64_t lo, int has_hi, int64_t hi) {
    if (!has_lo && !has_hi) return c->integer_any;
    if (has_lo && has_hi && lo > hi) return c->never;
    int32_t alts[2];
    int k = 0;
    if (!has_hi || hi >= 0) alts[k++] = nonneg_range(c, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    if (!has_lo || lo < 0) {
        int64_t a = has_hi && hi < 0 ? -hi : 1, b = has_lo ? -lo : -1;
        alts[k++] = gr_seq2(c->b, lit(c, "-"), nonneg_range(c, a, b));
    }
    return gr_alt(c->b, alts, k);
}

#define SMALL_BOUND 1e15 /* gr_build.small_numbers */

static int num_of(json_t *s, const char *k, double *out) {
    json_t *v = json_object_get(s, k);
    if (!json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

/* A non-negative bound as decimal digits: the integer part and the fraction digits (no
 * trailing zeros), from the shortest decimal that reads back as the same double (a
 * schema's 0.1 is the text 0.1, not 0.1000000000000000055...). 0: beyond 1e18 or finer
 * than 30 fraction digits. */
typedef struct {
    int64_t ip;
    char fp[32];
    int nf, strict;
} sc_dec;

static int dec_of(double v, int strict, sc_dec *d) {
    char buf[40];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    char dig[24];
    int nd = 0;
    const char *s = buf;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') dig[nd++] = *s;
    int e = *s == 'e' ? atoi(s + 1) : 0, ni = e + 1; /* integer digits */
    if (ni > 18) return 0;
    d->ip = 0, d->nf = 0, d->strict = strict;
    for (int i = 0; i < ni; i++) d->ip = d->ip * 10 + (i < nd ? dig[i] - '0' : 0);
    for (int i = ni; i < nd; i++) {
        if (d->nf >= 30) return 0;
        d->fp[d->nf++] = i < 0 ? '0' : dig[i];
    }
    while (d->nf && d->fp[d->nf - 1] == '0') d->nf--;
    d->fp[d->nf] = 0;
    return 1;
}

/* ---- multipleOf ------------------------------------------------------------------------- */

#define SC_MAX_MODULUS 1000     /* multipleOf m: m rules per digit position and phase, of 10 steps each */
#define SC_MAX_LISTED 256       /* bounded multiples written out one by one */
#define SC_MAX_STEP_DECIMALS 15 /* a fractional multipleOf's step: 1e-15 at the finest (what doubles hold) */

/* Multiples of m * 10^-scale between two bounds: the magnitudes (no sign) whose value in
 * units of 10^-scale, N, lies in [lo, hi] (hi < 0: no upper bound) with N % m == 0. A digit
 * automaton over N's digits, the point written `scale` digits from the end: while the digits
 * so far equal a bound's (tight) the next is limited by it; once neither bound binds, a state
 * is (digits left, N's remainder so far, phase), one shared rule each. The text is N's digits
 * with no leading zero ("0" for an integer part of 0), then, when scale > 0, nothing (the
 * fraction all zeros), or a point and one or more fraction digits, trailing zeros allowed
 * ("2.5", "2.50"; N's digits beyond the written ones are zeros). Every alternative kept leads
 * to a complete number: a prefix the grammar takes can always be finished. */
enum { BM_INT, BM_POINT, BM_FRAC_FIRST, BM_FRAC, BM_PHASES };
#define BM_MAX_DIGITS 19 /* N within int64 */
typedef struct {
    sc_ctx *c;
    int64_t m;
    int scale;
    int64_t p10mod[BM_MAX_DIGITS + 2]; /* 10^k % m */
    int32_t *memo;                     /* free states: (digits left, remainder, phase) -> node, -2 not built */
    int32_t zeros;                     /* "0"*: zeros past N's last digit */
    int32_t digit[10];
    char lo[BM_MAX_DIGITS + 1], hi[BM_MAX_DIGITS + 1]; /* the block's bounds, zero-padded to its width */
    int width;
} bm_ctx;

static int32_t bm_state(bm_ctx *x, int p, int lt, int ht, int64_t rem, int phase);

/* N may end here, its remaining k digits zeros: a multiple, and not below lo */
static int bm_can_end(bm_ctx *x, int k, int lt, int64_t rem) {
    if (rem * x->p10mod[k] % x->m) return 0;
    for (int i = x->width - k; lt && i < x->width; i++)
        if (x->lo[i] != '0') return 0;
    return 1;
}

static int32_t bm_build(bm_ctx *x, int p, int lt, int ht, int64_t rem, int phase) {
    sc_ctx *c = x->c;
    gr_build *b = c->b;
    int k = x->width - p; /* N's digits still to come */
    int32_t alts[12];
    int n = 0;
    if (phase == BM_POINT) { /* the integer part is complete */
        if (bm_can_end(x, k, lt, rem)) alts[n++] = gr_empty(b);
        int32_t f = x->scale ? bm_state(x, p, lt, ht, rem, BM_FRAC_FIRST) : c->never;
        if (f != c->never) alts[n++] = gr_seq2(b, lit(c, "."), f);
        return n ? gr_alt(b, alts, n) : c->never;
    }
    if (phase == BM_FRAC && k == 0) return rem ? c->never : x->zeros;
    if (phase == BM_FRAC && bm_can_end(x, k, lt, rem)) alts[n++] = gr_empty(b);
    int d_lo = lt ? x->lo[p] - '0' : 0, d_hi = ht ? x->hi[p] - '0' : 9;
    for (int d = d_lo; d <= d_hi; d++) {
        int nl = lt && d == d_lo, nh = ht && d == d_hi;
        int64_t r = (rem * 10 + d) % x->m;
        int next = phase == BM_INT ? (k - 1 == x->scale ? BM_POINT : BM_INT) : BM_FRAC;
        int32_t t = bm_state(x, p + 1, nl, nh, r, next);
        if (t != c->never) alts[n++] = gr_seq2(b, x->digit[d], t);
    }
    return n ? gr_alt(b, alts, n) : c->never;
}

static int32_t bm_state(bm_ctx *x, int p, int lt, int ht, int64_t rem, int phase) {
    sc_ctx *c = x->c;
    if (lt || ht) return bm_build(x, p, lt, ht, rem, phase); /* on a bound's path: built once */
    int k = x->width - p;
    int32_t *slot = &x->memo[((size_t)k * (size_t)x->m + (size_t)rem) * BM_PHASES + (size_t)phase];
    if (*slot == -2) {
        int32_t body = bm_build(x, p, 0, 0, rem, phase);
        *slot = body == c->never ? c->never : rule_of(c, body);
    }
    return *slot;
}

/* N of BM_MAX_DIGITS digits or more (no upper bound): a first digit 1-9, the integer
 * digits up to that width, then any number more (one rule per remainder), then the point
 * phase. */
static int32_t bm_unbounded_tail(bm_ctx *x) {
    sc_ctx *c = x->c;
    gr_build *b = c->b;
    int64_t m = x->m;
    int32_t *free_rule = malloc((size_t)m * sizeof *free_rule), *point = malloc((size_t)m * sizeof *point);
    uint8_t *prod = calloc((size_t)m, 1);
    if (!free_rule || !point || !prod) {
        free(free_rule), free(point), free(prod);
        return sc_fail(c, "out of memory");
    }
    x->width = BM_MAX_DIGITS + x->scale; /* p = 0 there leaves `scale` digits: the point phase */
    for (int64_t r = 0; r < m; r++) {
        point[r] = bm_state(x, BM_MAX_DIGITS, 0, 0, r, BM_POINT);
        prod[r] = point[r] != c->never;
    }
    /* free(r): more digits or the point; productive when some remainder it reaches is */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int64_t r = 0; r < m; r++)
            for (int d = 0; d < 10 && !prod[r]; d++)
                if (prod[(r * 10 + d) % m]) prod[r] = 1, changed = 1;
    }
    for (int64_t r = 0; r < m; r++) free_rule[r] = prod[r] ? gr_rule_new(b, -1) : -1;
    for (int64_t r = 0; r < m; r++) {
        if (free_rule[r] < 0) continue;
        int32_t alts[11];
        int n = 0;
        if (point[r] != c->never) alts[n++] = point[r];
        for (int d = 0; d < 10; d++)
            if (prod[(r * 10 + d) % m]) alts[n++] = gr_seq2(b, x->digit[d], gr_ref(b, free_rule[(r * 10 + d) % m]));
        b->rules[free_rule[r]].body = gr_alt(b, alts, n);
    }
    /* a first digit, then BM_MAX_DIGITS - 1 - scale integer digits in any case, as a chain of
     * (remainder) rules per count: built from the free rules up */
    int need = BM_MAX_DIGITS - 1 - x->scale;
    int32_t *cur = malloc((size_t)m * sizeof *cur), *nxt = malloc((size_t)m * sizeof *nxt);
    int32_t out = c->never;
    if (cur && nxt) {
        for (int64_t r = 0; r < m; r++) cur[r] = free_rule[r] >= 0 ? gr_ref(b, free_rule[r]) : c->never;
        for (int j = 0; j < need; j++) { /* cur: j more digits required; nxt: j + 1 */
            for (int64_t r = 0; r < m; r++) {
                int32_t alts[10];
                int n = 0;
                for (int d = 0; d < 10; d++)
                    if (cur[(r * 10 + d) % m] != c->never) alts[n++] = gr_seq2(b, x->digit[d], cur[(r * 10 + d) % m]);
                nxt[r] = n ? rule_of(c, gr_alt(b, alts, n)) : c->never;
            }
            int32_t *t = cur;
            cur = nxt, nxt = t;
        }
        int32_t alts[9];
        int n = 0;
        for (int d = 1; d <= 9; d++)
            if (cur[d % m] != c->never) alts[n++] = gr_seq2(b, x->digit[d], cur[d % m]);
        out = n ? gr_alt(b, alts, n) : c->never;
    } else
        sc_fail(c, "out of memory");
    free(cur), free(nxt), free(free_rule), free(point), free(prod);
    return out;
}

/* The magnitudes of N in [lo, hi], each block of one width apart (hi < 0: unbounded;
 * lo >= 0). c->never when there are none. */
static int32_t bounded_multiples(sc_ctx *c, int64_t m, int scale, int64_t lo, int64_t hi) {
    gr_build *b = c->b;
    if (scale > BM_MAX_DIGITS - 1)
        return sc_fail(c, "multipleOf with bounds: more than %d fraction digits", BM_MAX_DIGITS - 1);
    bm_ctx x = {.c = c, .m = m, .scale = scale};
    x.p10mod[0] = 1 % m;
    for (int i = 1; i <= BM_MAX_DIGITS + 1; i++) x.p10mod[i] = x.p10mod[i - 1] * 10 % m;
    size_t n_memo = (size_t)(BM_MAX_DIGITS + 1) * (size_t)m * BM_PHASES;
    x.memo = malloc(n_memo * sizeof *x.memo);
    if (!x.memo) return sc_fail(c, "out of memory");
    for (size_t i = 0; i < n_memo; i++) x.memo[i] = -2;
    x.zeros = gr_repeat(b, gr_byte(b, '0'), 0, GR_INF);
    for (int d = 0; d < 10; d++) x.digit[d] = gr_byte(b, '0' + d);
    int32_t alts[BM_MAX_DIGITS + 2];
    int n = 0;
    int64_t p10 = 1;                                        /* 10^(width - 1) */
    int max_w = hi < 0 ? BM_MAX_DIGITS - 1 : BM_MAX_DIGITS; /* unbounded: the tail takes the rest */
    for (int w = 1; w <= max_w; w++, p10 = w <= BM_MAX_DIGITS ? p10 * 10 : p10) {
        if (w < scale + 1) continue;            /* N's text has at least one integer digit */
        int64_t wlo = w == scale + 1 ? 0 : p10; /* no leading zero but in "0.xx" */
        int64_t whi = w == BM_MAX_DIGITS ? INT64_MAX : p10 * 10 - 1;
        if (wlo < lo) wlo = lo;
        if (hi >= 0 && whi > hi) whi = hi;
        if (wlo > whi) continue;
        snprintf(x.lo, sizeof x.lo, "%0*lld", w, (long long)wlo);
        snprintf(x.hi, sizeof x.hi, "%0*lld", w, (long long)whi);
        x.width = w;
        /* a width's free states are its own: the memo is keyed by digits left, which the
         * widths share, so it holds across them */
        int32_t t = bm_state(&x, 0, 1, 1, 0, BM_INT);
        if (c->st) break;
        if (t != c->never) alts[n++] = t;
    }
    if (hi < 0 && lo > p10 && !c->st) /* the tail would hold numbers below lo */
        sc_fail(c, "multipleOf with a bound of more than %d digits", BM_MAX_DIGITS - 1);
    if (hi < 0 && !c->st) { /* no upper bound: the numbers past the widths above too */
        int32_t t = bm_unbounded_tail(&x);
        if (t != c->never) alts[n++] = t;
    }
    free(x.memo);
    if (c->st) return c->never;
    return n ? gr_alt(b, alts, n) : c->never;
}

/* Signed multiples of m * 10^-scale with N (the value in units of 10^-scale) in [lo, hi]
 * (has_*: bounded; cap >= 0: |N| at most cap besides): the non-negative magnitudes, and a
 * minus sign before the negative ones' (never "-0"). */
static int32_t signed_multiples(sc_ctx *c, int64_t m, int scale, int has_lo, int64_t lo, int has_hi, int64_t hi,
                                int64_t cap) {
    int32_t alts[2];
    int n = 0;
    if (!has_hi || hi >= 0) {
        int64_t b = has_hi ? hi : cap;
        if (cap >= 0 && b > cap) b = cap;
        int32_t t = bounded_multiples(c, m, scale, has_lo && lo > 0 ? lo : 0, b);
        if (t != c->never) alts[n++] = t;
    }
    if ((!has_lo || lo < 0) && !c->st) {
        int64_t b = has_lo ? -lo : cap;
        if (cap >= 0 && b > cap) b = cap;
        int64_t a = has_hi && hi < 0 ? -hi : 1;
        int32_t t = b < 0 || a <= b ? bounded_multiples(c, m, scale, a, b) : c->never;
        if (t != c->never) alts[n++] = gr_seq2(c->b, lit(c, "-"), t);
    }
    if (c->st) return c->never;
    return n ? gr_alt(c->b, alts, n) : c->never;
}

/* Integers in the bounds (has_lo / has_hi: bounded) that are multiples of m (a positive
 * integer; max_digits > 0: at most that many digits): a range of at most SC_MAX_LISTED
 * multiples written out, any other by the digit automaton of signed_multiples. */
static int32_t int_multiples(sc_ctx *c, int64_t m, int has_lo, int64_t lo, int has_hi, int64_t hi, int max_digits) {
    gr_build *b = c->b;
    if (m > SC_MAX_MODULUS)
        return sc_fail(c, "multipleOf %lld: above %d is not supported", (long long)m, SC_MAX_MODULUS);
    /* the bounds moved inwards to multiples of m */
    if (has_lo) lo = lo >= 0 ? (lo + m - 1) / m * m : -((-lo) / m * m);
    if (has_hi) hi = hi >= 0 ? hi / m * m : -((-hi + m - 1) / m * m);
    if (has_lo && has_hi && lo > hi) return c->never;
    if (has_lo && has_hi && (hi - lo) / m < SC_MAX_LISTED) {
        int32_t alts[SC_MAX_LISTED];
        int k = 0;
        for (int64_t v = lo; v <= hi; v += m) {
            char buf[24];
            snprintf(buf, sizeof buf, "%lld", (long long)v);
            alts[k++] = lit(c, buf);
        }
        return gr_alt(b, alts, k);
    }
    int64_t cap = -1; /* at most max_digits digits */
    for (int i = 0; i < max_digits; i++) cap = cap < 0 ? 9 : cap * 10 + 9;
    return signed_multiples(c, m, 0, has_lo, lo, has_hi, hi, cap);
}

/* A fractional step d as *coef * 10^-*scale from its shortest decimal (0.25: 25, 2); 0
 * when that needs more than SC_MAX_STEP_DECIMALS fraction digits or coef is above
 * SC_MAX_MODULUS. */
static int decimal_step(double d, int64_t *coef, int *scale) {
    sc_dec dec;
    if (!dec_of(d, 0, &dec) || dec.nf > SC_MAX_STEP_DECIMALS || dec.ip > SC_MAX_MODULUS) return 0;
    int64_t c = dec.ip;
    for (int i = 0; i < dec.nf; i++) c = c * 10 + (dec.fp[i] - '0');
    *coef = c, *scale = dec.nf;
    return c <= SC_MAX_MODULUS;
}

/* multipleOf as a decimal step coef * 10^-scale (*scale 0: a whole number), from the
 * shortest decimal that reads back as the schema's double (its text 0.01, not
 * 0.01000000000000000020816...), or 0 with c->st set when it is no such step. The
 * step is taken exactly, as a validator that reads decimals exactly decides (a
 * multiple of 0.01 is any number with at most two fraction digits; a validator that
 * divides doubles says 0.07 is not, since 0.07 / 0.01 = 7.000000000000001 there).
 * *float_step: written as a real (1.0), which validators divide as doubles: exact only
 * while the value is (15 digits). */
static int multiple_of(sc_ctx *c, json_t *s, int64_t *m, int *scale, int *float_step) {
    json_t *v = json_object_get(s, "multipleOf");
    double d = json_number_value(v);
    *scale = 0;
    if (!json_is_number(v) || !(d > 0)) {
        sc_fail(c, "multipleOf must be a number above 0");
        return 0;
    }
    if (d > 1e15) {
        sc_fail(c, "multipleOf %g: steps above 1e15 are not supported", d);
        return 0;
    }
    *float_step = json_is_real(v);
    if (d == floor(d)) {
        *m = (int64_t)d;
        return 1;
    }
    if (!decimal_step(d, m, scale)) {
        sc_fail(c,
                "multipleOf %g: a fractional step must be a decimal of at most %d fraction digits whose digits, "
                "read as a whole number, are at most %d (0.01, 0.5, 2.5, 0.125)",
                d, SC_MAX_STEP_DECIMALS, SC_MAX_MODULUS);
        return 0;
    }
    return 1;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

static int32_t sc_integer(sc_ctx *c, json_t *s) {
    double v;
    int has_lo = 0, has_hi = 0;
    double lo = 0, hi = 0;
    if (num_of(s, "minimum", &v)) {
        has_lo = 1, lo = ceil(v);
        if (json_is_true(json_object_get(s, "exclusiveMinimum")) && lo == v) lo += 1; /* draft 4 */
    }
    if (num_of(s, "exclusiveMinimum", &v) && (!has_lo || floor(v) + 1 > lo)) has_lo = 1, lo = floor(v) + 1;
    if (num_of(s, "maximum", &v)) {
        has_hi = 1, hi = floor(v);
        if (json_is_true(json_object_get(s, "exclusiveMaximum")) && hi == v) hi -= 1;
    }
    if (num_of(s, "exclusiveMaximum", &v) && (!has_hi || ceil(v) - 1 < hi)) has_hi = 1, hi = ceil(v) - 1;
    if ((has_lo && fabs(lo) > 1e18) || (has_hi && fabs(hi) > 1e18)) {
        if (has_lo && lo < -1e18) has_lo = 0;
        if (has_hi && hi > 1e18) has_hi = 0;
        if ((has_lo && lo > 1e18) || (has_hi && hi < -1e18)) return sc_fail(c, "integer bound beyond 1e18");
    }
    if (json_object_get(s, "multipleOf")) {
        int64_t m, p10 = 1;
        int float_step, scale;
        if (!multiple_of(c, s, &m, &scale, &float_step)) return c->never;
        /* an integer n is a multiple of m * 10^-scale when n * 10^scale is one of m */
        for (int i = 0; i < scale; i++) p10 *= 10;
        if (scale) m /= gcd64(m, p10), float_step = 1;
        if (m > 1) /* 15 digits: values a double holds exactly */
            return int_multiples(c, m, has_lo, (int64_t)lo, has_hi, (int64_t)hi,
                                 float_step || c->b->small_numbers ? 15 : 0);
    }
    if (c->b->small_numbers && (has_lo || has_hi)) { /* the other side within SMALL_BOUND too */
        if (!has_lo || lo < -SMALL_BOUND) has_lo = 1, lo = -SMALL_BOUND;
        if (!has_hi || hi > SMALL_BOUND) has_hi = 1, hi = SMALL_BOUND;
    }
    return int_range(c, has_lo, (int64_t)lo, has_hi, (int64_t)hi);
}

/* Fraction digits from position pos on, at least min of them: any digits, or under a
 * multipleOf of 10^-k (c->frac_max k) zeros after the k-th. */
static int32_t frac_tail(sc_ctx *c, int pos, int min) {
    gr_build *b = c->b;
    int32_t digit = gr_byte_range(b, '0', '9');
    if (!c->frac_max) return gr_repeat(b, digit, min, GR_INF);
    int n = c->frac_max > pos ? c->frac_max - pos : 0; /* digits still free */
    int free_lo = min < n ? min : n;
    int32_t head = n ? gr_repeat(b, digit, free_lo, n) : gr_empty(b);
    return gr_seq2(b, head, gr_repeat(b, gr_byte(b, '0'), min > n ? min - n : 0, GR_INF));
}

/* Fraction digits d (at least one, after pos digits already read) such that 0.d meets
 * the bounds still tight: lo (0.d >= 0.lo->fp, > when strict) while the digits so far
 * equal lo's, likewise hi; NULL: that bound no longer binds. Under c->frac_max every
 * digit from that position on is 0. */
static int32_t frac_step(sc_ctx *c, const sc_dec *lo, const sc_dec *hi, int pos) {
    gr_build *b = c->b;
    int zeros_only = c->frac_max && pos >= c->frac_max;
    if (lo && pos >= lo->nf && !lo->strict) lo = NULL; /* the rest is >= 0: satisfied */
    if (hi && pos >= hi->nf)                           /* only zeros may follow, and only when equal is allowed */
        return hi->strict || lo ? c->never : gr_repeat(b, gr_byte(b, '0'), 1, GR_INF);
    if (!lo && !hi) return frac_tail(c, pos, 1);
    if (lo && !hi && pos >= lo->nf) { /* strict and exhausted: some nonzero digit, at a free position */
        if (!c->frac_max)
            return gr_seq3(b, gr_repeat(b, gr_byte(b, '0'), 0, GR_INF), gr_byte_range(b, '1', '9'),
                           gr_repeat(b, gr_byte_range(b, '0', '9'), 0, GR_INF));
        int32_t alts[SC_MAX_STEP_DECIMALS + 1];
        int k = 0;
        for (int p = pos; p < c->frac_max && k <= SC_MAX_STEP_DECIMALS; p++)
            alts[k++] = gr_seq3(b, p > pos ? gr_repeat(b, gr_byte(b, '0'), p - pos, p - pos) : gr_empty(b),
                                gr_byte_range(b, '1', '9'), frac_tail(c, p + 1, 0));
        return k ? gr_alt(b, alts, k) : c->never;
    }
    unsigned lc = lo ? (unsigned char)(pos < lo->nf ? lo->fp[pos] : '0') : '0';
    unsigned hc = hi ? (unsigned char)hi->fp[pos] : '9', hc_bound = hc;
    if (zeros_only) { /* the one digit 0: below hi's digit, hi binds no more */
        if (lc != '0') return c->never;
        hc = '0';
    }
    if (lc > hc) return c->never;
    int32_t alts[3];
    int k = 0;
    /* after a digit equal to a bound's, the rest: may be empty when the bound allows */
    const sc_dec *nlo = lo, *nhi = hi;
    for (int side = 0; side < 2; side++) {
        unsigned ch = side ? hc : lc;
        if (side && hc == lc) break;
        const sc_dec *l2 = side ? NULL : nlo, *h2 = side ? nhi : (lc == hc_bound ? nhi : NULL);
        int p = pos + 1;
        int end_ok = (!l2 || (p >= l2->nf && !l2->strict)) && (!h2 || !h2->strict || p < h2->nf);
        int32_t more = frac_step(c, l2, h2, p);
        alts[k++] = gr_seq2(b, gr_byte(b, ch), end_ok ? gr_opt(b, more) : more);
    }
    if (lc + 1 <= hc - 1 && hc > 0) alts[k++] = gr_seq2(b, gr_byte_range(b, lc + 1, hc - 1), frac_tail(c, pos + 1, 0));
    return gr_alt(b, alts, k);
}

/* An optional fraction (".digits") meeting the tight bounds, as frac_step. */
static int32_t frac_part(sc_ctx *c, const sc_dec *lo, const sc_dec *hi) {
    gr_build *b = c->b;
    int end_ok = (!lo || (!lo->nf && !lo->strict)) && (!hi || !hi->strict || hi->nf);
    int32_t f = gr_seq2(b, lit(c, "."), frac_step(c, lo, hi, 0));
    return end_ok ? gr_opt(b, f) : f;
}

/* Decimals (no exponent) in [lo, hi] (hi NULL: unbounded), both non-negative. */
static int32_t mag_range(sc_ctx *c, const sc_dec *lo, const sc_dec *hi) {
    gr_build *b = c->b;
    char buf[24];
    if (hi && lo->ip > hi->ip) return c->never;
    int32_t alts[3];
    int k = 0;
    snprintf(buf, sizeof buf, "%lld", (long long)lo->ip);
    if (hi && lo->ip == hi->ip) return gr_seq2(b, lit(c, buf), frac_part(c, lo, hi));
    alts[k++] = gr_seq2(b, lit(c, buf), frac_part(c, lo, NULL));
    if (!hi || hi->ip - lo->ip >= 2)
        alts[k++] = gr_seq2(b, nonneg_range(c, lo->ip + 1, hi ? hi->ip - 1 : -1), frac_part(c, NULL, NULL));
    if (hi) {
        snprintf(buf, sizeof buf, "%lld", (long long)hi->ip);
        alts[k++] = gr_seq2(b, lit(c, buf), frac_part(c, NULL, hi));
    }
    return gr_alt(b, alts, k);
}

/* The bound v (a schema number) times 10^scale: *floor_u, *ceil_u and whether it is whole
 * (*exact). 0: beyond what int64 holds. */
static int bound_units(double v, int scale, int64_t *floor_u, int64_t *ceil_u, int *exact) {
    sc_dec d;
    int64_t p10 = 1;
    for (int i = 0; i < scale; i++) p10 *= 10;
    if (!dec_of(fabs(v), 0, &d) || d.ip > INT64_MAX / 10 / p10) return 0;
    int64_t u = d.ip;
    for (int i = 0; i < scale; i++) u = u * 10 + (i < d.nf ? d.fp[i] - '0' : 0);
    *exact = d.nf <= scale;
    int64_t up = u + !*exact; /* |v| * 10^scale rounded up */
    if (v >= 0)
        *floor_u = u, *ceil_u = up;
    else
        *floor_u = -up, *ceil_u = -u;
    return 1;
}

/* The number u * 10^-scale as the shortest decimal text. */
static void units_text(int64_t u, int scale, char *out, size_t cap) {
    if (!u) {
        snprintf(out, cap, "0");
        return;
    }
    char digits[32];
    int neg = u < 0;
    snprintf(digits, sizeof digits, "%lld", (long long)(neg ? -u : u));
    int nd = (int)strlen(digits), ni = nd - scale;
    char buf[48];
    int k = 0;
    if (neg) buf[k++] = '-';
    if (ni <= 0) buf[k++] = '0';
    for (int i = 0; i < ni; i++) buf[k++] = digits[i];
    int last = nd - 1;
    while (last >= (ni > 0 ? ni : 0) && digits[last] == '0') last--;
    if (last >= ni) {
        buf[k++] = '.';
        for (int i = ni; i <= last; i++) buf[k++] = i < 0 ? '0' : digits[i];
    }
    buf[k] = 0;
    snprintf(out, cap, "%s", buf);
}

/* A number under a fractional multipleOf m * 10^-scale (m > 1: 0.5, 2.5, 0.25): a range
 * of at most SC_MAX_LISTED multiples written out (their shortest texts), any other bounds
 * (or none) by the digit automaton of signed_multiples. */
static int32_t number_multiples(sc_ctx *c, json_t *s, int64_t m, int scale) {
    gr_build *b = c->b;
    double v, step = json_number_value(json_object_get(s, "multipleOf"));
    int has_lo = 0, has_hi = 0, slo = 0, shi = 0;
    double lo = 0, hi = 0;
    if (num_of(s, "minimum", &v)) has_lo = 1, lo = v, slo = json_is_true(json_object_get(s, "exclusiveMinimum"));
    if (num_of(s, "exclusiveMinimum", &v) && (!has_lo || v >= lo)) has_lo = 1, lo = v, slo = 1;
    if (num_of(s, "maximum", &v)) has_hi = 1, hi = v, shi = json_is_true(json_object_get(s, "exclusiveMaximum"));
    if (num_of(s, "exclusiveMaximum", &v) && (!has_hi || v <= hi)) has_hi = 1, hi = v, shi = 1;
    int max_int = b->small_numbers ? 15 : 0; /* a tool call's +-1e15 */
    int64_t lf, lc, hf, hc;
    int lx, hx;
    if (has_lo && has_hi && bound_units(lo, scale, &lf, &lc, &lx) && bound_units(hi, scale, &hf, &hc, &hx)) {
        int64_t first = lc + (slo && lx), last = hf - (shi && hx); /* in units of 10^-scale */
        int64_t n0 = first >= 0 ? (first + m - 1) / m : -((-first) / m),
                n1 = last >= 0 ? last / m : -((-last + m - 1) / m);
        if (n0 > n1) return c->never;
        if (n1 - n0 < SC_MAX_LISTED) {
            int32_t alts[SC_MAX_LISTED];
            int k = 0;
            for (int64_t n = n0; n <= n1; n++) {
                char buf[48];
                units_text(n * m, scale, buf, sizeof buf);
                alts[k++] = lit(c, buf);
            }
            return gr_alt(b, alts, k);
        }
    }
    /* other bounds: the digit automaton over the value in units of 10^-scale */
    int64_t first = 0, last = 0, cap = -1;
    if ((has_lo && !bound_units(lo, scale, &lf, &lc, &lx)) || (has_hi && !bound_units(hi, scale, &hf, &hc, &hx)))
        return sc_fail(c, "multipleOf %g with a bound beyond what 64-bit units of the step hold", step);
    if (has_lo) first = lc + (slo && lx);
    if (has_hi) last = hf - (shi && hx);
    if (max_int) { /* at most max_int integer digits */
        if (max_int + scale > BM_MAX_DIGITS - 1) return sc_fail(c, "multipleOf %g: too many fraction digits", step);
        for (int i = 0; i < max_int + scale; i++) cap = cap < 0 ? 9 : cap * 10 + 9;
    }
    return signed_multiples(c, m, scale, has_lo, first, has_hi, last, cap);
}

static int32_t sc_number_bounded(sc_ctx *c, json_t *s, int decimal_only);

static int32_t sc_number(sc_ctx *c, json_t *s) {
    if (json_object_get(s, "multipleOf")) {
        int64_t m;
        int scale, float_step;
        if (!multiple_of(c, s, &m, &scale, &float_step)) return c->never;
        if (!scale) /* whole-number steps: integers, written with a zero fraction or not (12.0) */
            return gr_seq2(c->b, sc_integer(c, s), gr_opt(c->b, re_node(c, "\\.0+", 0)));
        if (m > 1) return number_multiples(c, s, m, scale);
        c->frac_max = scale; /* 10^-scale: the decimals with at most `scale` fraction digits */
        int32_t x = sc_number_bounded(c, s, 1);
        c->frac_max = 0;
        return x;
    }
    return sc_number_bounded(c, s, 0);
}

/* Numbers in the schema's bounds; decimal_only: never with an exponent (c->frac_max set). */
static int32_t sc_number_bounded(sc_ctx *c, json_t *s, int decimal_only) {
    double lo = 0, hi = 0, v;
    int has_lo = 0, has_hi = 0, slo = 0, shi = 0;
    if (num_of(s, "minimum", &v)) has_lo = 1, lo = v, slo = json_is_true(json_object_get(s, "exclusiveMinimum"));
    if (num_of(s, "exclusiveMinimum", &v) && (!has_lo || v >= lo)) has_lo = 1, lo = v, slo = 1;
    if (num_of(s, "maximum", &v)) has_hi = 1, hi = v, shi = json_is_true(json_object_get(s, "exclusiveMaximum"));
    if (num_of(s, "exclusiveMaximum", &v) && (!has_hi || v <= hi)) has_hi = 1, hi = v, shi = 1;
    if (has_lo && lo < -1e18) has_lo = 0;
    if (has_hi && hi > 1e18) has_hi = 0;
    if (!has_lo && !has_hi && !decimal_only) return c->number;
    if (c->b->small_numbers) { /* the other side within SMALL_BOUND too: no exponents */
        if (!has_lo || lo < -SMALL_BOUND) has_lo = 1, lo = -SMALL_BOUND, slo = 0;
        if (!has_hi || hi > SMALL_BOUND) has_hi = 1, hi = SMALL_BOUND, shi = 0;
    }
    if ((has_lo && lo > 1e18) || (has_hi && hi < -1e18)) return sc_fail(c, "number bound beyond 1e18");
    if (!has_hi && lo == 0 && !slo && !decimal_only) /* minimum 0: no sign, exponents too */
        return re_node(c, "(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?", 0);
    if (!has_hi && has_lo && lo == 0 && slo && !decimal_only) /* exclusiveMinimum 0: no sign, not zero */
        return re_node(c, "(0\\.[0-9]*[1-9][0-9]*|[1-9][0-9]*(\\.[0-9]+)?)([eE][-+]?[0-9]+)?", 0);
    /* other bounds: plain decimals (no exponent), the non-negative and negative parts apart */
    int32_t alts[2];
    int k = 0;
    sc_dec a, z;
    if (!has_hi || hi > 0 || (hi == 0 && !shi)) { /* x >= 0 */
        int ok = has_lo && lo > 0 ? dec_of(lo, slo, &a) : dec_of(0, 0, &a);
        if (ok && has_hi) ok = dec_of(hi, shi, &z);
        if (!ok) return sc_fail(c, "number bound with more than 30 decimals");
        alts[k++] = mag_range(c, &a, has_hi ? &z : NULL);
    }
    if (!has_lo || lo < 0) { /* x < 0 (and -0): '-' and the magnitude in [max(-hi, 0), -lo] */
        int ok = has_hi && hi < 0 ? dec_of(-hi, shi, &a) : dec_of(0, has_hi && hi == 0 && shi, &a);
        if (ok && has_lo) ok = dec_of(-lo, slo, &z);
        if (!ok) return sc_fail(c, "number bound with more than 30 decimals");
        alts[k++] = gr_seq2(c->b, lit(c, "-"), mag_range(c, &a, has_lo ? &z : NULL));
    }
    return k ? gr_alt(c->b, alts, k) : c->never;
}

/* ---- strings ----------------------------------------------------------------------------- */

#define MONTH_DAY                                                                                                      \
    "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-9]))"
#define TIME_OF_DAY "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define HOST_LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"

/* Formats as validators check them (python-jsonschema's FormatChecker); NULL pattern:
 * a format validators check that has no grammar here (refused); absent: annotation. */
static int format_regex(const char *f, const char **re) {
    static const char *const table[][2] = {
        {"date-time", "^[0-9]{4}-" MONTH_DAY "[Tt]" TIME_OF_DAY "$"},
        {"date", "^[0-9]{4}-" MONTH_DAY "$"},
        {"time", "^" TIME_OF_DAY "$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"email", "^[^@\\s]+@[^@\\s]+$"},
        {"ipv4",
         "^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$"},
        {"hostname", "^" HOST_LABEL "(\\." HOST_LABEL ")*$"},
        {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:[^\\s<>\"{}|\\\\^`]*$"},
        {"uri-reference", "^[^\\s<>\"{}|\\\\^`]*$"},
        {"duration", "^P([0-9]+Y)?([0-9]+M)?([0-9]+W)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\\.[0-9]+)?S)?)?$"},
        {"ipv6", NULL},
        {"iri", NULL},
        {"iri-reference", NULL},
        {"idn-email", NULL},
        {"idn-hostname", NULL},
        {"json-pointer", NULL},
        {"relative-json-pointer", NULL},
        {"regex", NULL},
        {"uri-template", NULL},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(f, table[i][0])) {
            *re = table[i][1];
            return 1;
        }
    *re = NULL;
    return 0;
}

/* ---- pattern with a length ------------------------------------------------------------- */

/* The code-point length range of a regex node ([*lo, *hi], hi GR_INF: unbounded); 0 when
 * a part is not one code point per set (a raw byte set, a rule). */
static int node_len(const gr_build *b, int32_t x, int64_t *lo, int64_t *hi) {
    const gr_node *n = &b->nodes[x];
    switch (n->kind) {
    case GN_EMPTY: *lo = *hi = 0; return 1;
    case GN_CPSET: *lo = *hi = 1; return 1;
    case GN_BYTES:
        for (unsigned c = 0x80; c < 256; c++)
            if (gr_has(&b->sets[n->a], c)) return 0;
        *lo = *hi = 1;
        return 1;
    case GN_SEQ:
    case GN_ALT: {
        int seq = n->kind == GN_SEQ;
        *lo = seq ? 0 : INT64_MAX, *hi = 0;
        for (int32_t i = 0; i < n->n_kids; i++) {
            int64_t a, z;
            if (!node_len(b, b->pool[n->kids + i], &a, &z)) return 0;
            if (seq) {
                *lo += a;
                *hi = *hi == GR_INF || z == GR_INF ? GR_INF : *hi + z;
            } else {
                if (a < *lo) *lo = a;
                if (*hi != GR_INF && (z == GR_INF || z > *hi)) *hi = z;
            }
        }
        return 1;
    }
    case GN_REPEAT: {
        int64_t a, z;
        if (!node_len(b, n->kids, &a, &z)) return 0;
        *lo = a * n->a;
        *hi = n->b == GR_INF ? (z ? GR_INF : 0) : z == GR_INF ? GR_INF : z * n->b;
        return 1;
    }
    default: return 0;
    }
}

/* x restricted to strings of lo..hi code points (hi GR_INF: unbounded), exactly; -1 when
 * that takes more than narrowing one variable-length part (a repeat of a fixed-length
 * piece, or an alternative of such). */
static int32_t limit_len(sc_ctx *c, int32_t x, int64_t lo, int64_t hi) {
    gr_build *b = c->b;
    int64_t a, z;
    if (!node_len(b, x, &a, &z)) return -1;
    if (a >= lo && (hi == GR_INF || (z != GR_INF && z <= hi))) return x;      /* already within */
    if ((hi != GR_INF && a > hi) || (z != GR_INF && z < lo)) return c->never; /* never within */
    gr_node n = b->nodes[x];
    if (n.kind == GN_ALT) {
        int32_t *alts = malloc((size_t)n.n_kids * sizeof *alts);
        if (!alts) return -1;
        for (int32_t i = 0; i < n.n_kids; i++)
            if ((alts[i] = limit_len(c, b->pool[n.kids + i], lo, hi)) < 0) {
                free(alts);
                return -1;
            }
        int32_t r = gr_alt(b, alts, n.n_kids);
        free(alts);
        return r;
    }
    if (n.kind == GN_SEQ) { /* one part of variable length, the others fixed */
        int32_t var = -1;
        int64_t fixed = 0;
        for (int32_t i = 0; i < n.n_kids; i++) {
            int64_t ka, kz;
            node_len(b, b->pool[n.kids + i], &ka, &kz);
            if (ka == kz)
                fixed += ka;
            else if (var >= 0)
                return -1;
            else
                var = i;
        }
        if (var < 0) return -1;
        int32_t part =
            limit_len(c, b->pool[n.kids + var], lo - fixed < 0 ? 0 : lo - fixed, hi == GR_INF ? GR_INF : hi - fixed);
        if (part < 0) return -1;
        int32_t *kids = malloc((size_t)n.n_kids * sizeof *kids);
        if (!kids) return -1;
        for (int32_t i = 0; i < n.n_kids; i++) kids[i] = i == var ? part : b->pool[n.kids + i];
        int32_t r = gr_seq(b, kids, n.n_kids);
        free(kids);
        return r;
    }
    if (n.kind == GN_REPEAT) { /* k code points a copy: count*k within the bounds */
        int64_t ka, kz;
        node_len(b, n.kids, &ka, &kz);
        if (ka != kz || ka == 0) return -1;
        int64_t mn = (lo + ka - 1) / ka, mx = hi == GR_INF ? GR_INF : hi / ka;
        if (mn < n.a) mn = n.a;
        if (n.b != GR_INF && (mx == GR_INF || mx > n.b)) mx = n.b;
        if (mx != GR_INF && mn > mx) return c->never;
        if (mn > GR_MAX_REPEAT || mx > GR_MAX_REPEAT) return -1;
        return gr_repeat(b, n.kids, (int32_t)mn, (int32_t)mx);
    }
    return -1;
}

static int32_t sc_excluded_strings(sc_ctx *c, json_t *list);

static int32_t sc_string(sc_ctx *c, json_t *s) {
    gr_build *b = c->b;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    int64_t min = json_is_number(mn) ? (int64_t)json_number_value(mn) : 0;
    int64_t max = json_is_number(mx) ? (int64_t)json_number_value(mx) : -1;
    const char *re = json_is_string(pat) ? json_string_value(pat) : NULL;
    const char *fre = NULL;
    if (json_is_string(fmt) && format_regex(json_string_value(fmt), &fre) && !fre)
        return sc_fail(c, "format '%.40s' is not supported", json_string_value(fmt));
    if (re && fre) return sc_fail(c, "'pattern' together with 'format' is not supported");
    json_t *excluded = json_object_get(s, SC_NOT_STRINGS);
    if (excluded) {
        if (re || min > 0 || max >= 0)
            return sc_fail(c, "'not' with string values beside pattern, format or a length is not supported");
        return sc_excluded_strings(c, excluded);
    }
    if (!re) re = fre;
    if (re) {
        int32_t body = 0;
        if (!c->st) c->st = gr_regex(b, re, strlen(re), 1, &body, c->err);
        if (c->st && c->err) err_prefix(c->err, "json schema: pattern");
        if (!c->st && (min > 0 || max >= 0) && (body = limit_len(c, body, min, max < 0 ? GR_INF : max)) < 0)
            return sc_fail(c,
                           "'pattern' (or format) %.60s together with min/maxLength: the length does not narrow one "
                           "repeat of the pattern",
                           re);
        return gr_seq3(b, lit(c, "\""), body, lit(c, "\""));
    }
    if (min == 0 && max < 0) return c->string;
    if (min > GR_MAX_REPEAT || max > GR_MAX_REPEAT) return sc_fail(c, "string length bound above %d", GR_MAX_REPEAT);
    if (max >= 0 && max < min) return c->never;
    uint32_t all[2] = {0, 0x10FFFF};
    int32_t ch = gr_cpset(b, all, 1, 1);
    return gr_seq3(b, lit(c, "\""), gr_repeat(b, ch, (int32_t)min, max < 0 ? GR_INF : (int32_t)max), lit(c, "\""));
}

/* ---- constants ------------------------------------------------------------------------- */

static int32_t sc_const(sc_ctx *c, json_t *v, int depth) {
    gr_build *b = c->b;
    if (depth > SC_MAX_DEPTH) return sc_fail(c, "const/enum value nested too deeply");
    if (json_is_object(v)) {
        int32_t parts[1 + 4 * 64];
        int n = 0;
        int32_t seq = lit(c, "{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach(v, k, x) {
            json_t *ks = json_string(k);
            char *enc = json_dumps(ks, JSON_ENCODE_ANY);
            json_decref(ks);
            if (!enc) return sc_fail(c, "out of memory");
            int32_t kv = gr_seq(b,
                                (int32_t[]){first ? c->ws : gr_seq3(b, c->ws, lit(c, ","), c->ws), lit(c, enc), c->ws,
                                            lit(c, ":"), c->ws, sc_const(c, x, depth + 1)},
                                6);
            free(enc);
            seq = gr_seq2(b, seq, kv);
            first = 0;
        }
        (void)parts, (void)n;
        return gr_seq3(b, seq, c->ws, lit(c, "}"));
    }
    if (json_is_array(v)) {
        int32_t seq = gr_seq2(b, lit(c, "["), c->ws);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (i) seq = gr_seq2(b, seq, gr_seq3(b, c->ws, lit(c, ","), c->ws));
            seq = gr_seq2(b, seq, sc_const(c, x, depth + 1));
        }
        return gr_seq3(b, seq, c->ws, lit(c, "]"));
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e15) {
        /* 1.0 and 1 are the same JSON Schema value */
        char buf[64];
        snprintf(buf, sizeof buf, "%.0f", json_real_value(v));
        char buf2[70];
        snprintf(buf2, sizeof buf2, "%s.0", buf);
        return gr_alt2(b, lit(c, buf), lit(c, buf2));
    }
    if (json_is_real(v)) { /* the shortest text that reads back as the value: 0.07, not 0.070000000000000007 */
        char buf[40];
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, json_real_value(v));
            if (strtod(buf, NULL) == json_real_value(v)) break;
        }
        return lit(c, buf);
    }
    char *enc = json_dumps(v, JSON_ENCODE_ANY);
    if (!enc) return sc_fail(c, "out of memory");
    int32_t r = lit(c, enc);
    if (json_is_integer(v)) {
        char buf2[70];
        snprintf(buf2, sizeof buf2, "%s.0", enc);
        r = gr_alt2(b, r, lit(c, buf2));
    }
    free(enc);
    return r;
}

/* ---- arrays ------------------------------------------------------------------------------ */

static int32_t sc_node(sc_ctx *c, json_t *s, int depth);

static int32_t sc_array(sc_ctx *c, json_t *s, int depth) {
    gr_build *b = c->b;
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    json_t *more = NULL;
    if (json_is_array(items))
        prefix = items, more = json_object_get(s, "additionalItems"); /* draft 7 */
    else
        more = items;
    size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    int64_t min = json_is_number(mn) ? (int64_t)json_number_value(mn) : 0;
    int64_t max = json_is_number(mx) ? (int64_t)json_number_value(mx) : -1;
    int more_ok = !json_is_false(more);
    if (!more_ok && (max < 0 || max > (int64_t)np)) max = (int64_t)np;
    if (max >= 0 && min > max) return c->never;
    if (min > 1000 || max > 1000 || np > 1000) return sc_fail(c, "array bounds above 1000 items");
    int32_t item_more = more && !json_is_true(more) ? sc_node(c, more, depth + 1) : c->value;
    int32_t comma = gr_seq3(b, c->ws, lit(c, ","), c->ws);
    /* from the end: tail(i) = what may follow after i items */
    int64_t last = max;
    if (max < 0) last = (int64_t)np > min ? (int64_t)np : min > 1 ? min : 1;
    int32_t tail;
    if (max < 0) {
        int64_t need = min > last ? min - last : 0;
        tail = gr_repeat(b, gr_seq2(b, comma, item_more), (int32_t)need, GR_INF);
    } else
        tail = gr_empty(b);
    for (int64_t i = last - 1; i >= 1; i--) {
        int32_t it = (size_t)i < np ? sc_node(c, json_array_get(prefix, (size_t)i), depth + 1) : item_more;
        int32_t step = gr_seq3(b, comma, it, tail);
        tail = i >= min ? gr_opt(b, step) : step;
        if (c->st) return c->never;
    }
    int32_t body;
    if (last >= 1) {
        int32_t it0 = np ? sc_node(c, json_array_get(prefix, 0), depth + 1) : item_more;
        body = gr_seq3(b, it0, tail, c->ws);
        if (min == 0) body = gr_opt(b, body);
    } else
        body = gr_empty(b);
    return gr_seq(b, (int32_t[]){lit(c, "["), c->ws, body, lit(c, "]")}, 4);
}

/* ---- objects ----------------------------------------------------------------------------- */

/* How a string goes on once it left the trie of names: the rest up to the closing quote,
 * and the escapes that may start that rest. */
typedef struct {
    int32_t rest, escape;
} sc_tail;

/* A JSON string (after its opening quote) whose encoded bytes (closing quote included)
 * differ from every name in the list: the keys an additionalProperties may use. Names
 * are walked as a byte trie; a string leaves the trie at an ASCII byte, a backslash
 * escape, or (where no name has a non-ASCII byte at that point) a non-ASCII character. */
static int32_t not_names(sc_ctx *c, char **names, size_t *lens, int n, size_t depth, const sc_tail *tail) {
    gr_build *b = c->b;
    int32_t alts[300];
    int k = 0;
    gr_byteset kids = {{0}};
    int closes = 0;
    for (int i = 0; i < n; i++)
        if (lens[i] > depth) gr_add(&kids, (unsigned char)names[i][depth]);
    /* diverge at an ASCII byte that no name has here */
    gr_byteset div = {{0}};
    for (unsigned x = 0x20; x < 0x80; x++)
        if (x != '"' && x != '\\' && !gr_has(&kids, x)) gr_add(&div, x);
    int any_div = 0;
    for (int w = 0; w < 8; w++) any_div |= div.w[w] != 0;
    if (any_div) alts[k++] = gr_seq2(b, gr_byteset_node(b, &div), tail->rest);
    if (!gr_has(&kids, '\\')) alts[k++] = gr_seq2(b, tail->escape, tail->rest);
    int non_ascii = 0;
    for (unsigned x = 0x80; x < 0x100; x++) non_ascii |= gr_has(&kids, x);
    if (!non_ascii) {
        uint32_t r[2] = {0x80, 0x10FFFF};
        alts[k++] = gr_seq2(b, gr_cpset(b, r, 1, 1), tail->rest);
    }
    /* a proper prefix of names ends here */
    if (!gr_has(&kids, '"')) alts[k++] = lit(c, "\"");
    (void)closes;
    for (unsigned x = 0; x < 256 && k < 299; x++) {
        if (!gr_has(&kids, x) || x == '"') continue; /* '"' in the trie: that name, excluded */
        char **sub = malloc((size_t)n * sizeof *sub);
        size_t *sl = malloc((size_t)n * sizeof *sl);
        int m = 0;
        if (!sub || !sl) {
            free(sub), free(sl);
            return sc_fail(c, "out of memory");
        }
        for (int i = 0; i < n; i++)
            if (lens[i] > depth && (unsigned char)names[i][depth] == x) sub[m] = names[i], sl[m++] = lens[i];
        alts[k++] = gr_seq2(b, gr_byte(b, x), not_names(c, sub, sl, m, depth + 1, tail));
        free(sub), free(sl);
    }
    if (k >= 299) return sc_fail(c, "too many property names");
    return k ? gr_alt(b, alts, k) : c->never;
}

/* Strings other than the listed ones (printable ASCII without quote or backslash: each
 * has one spelling then, and the string rule spells every other code point one way too,
 * its shortest escape, so a different spelling is a different string). */
static int32_t sc_excluded_strings(sc_ctx *c, json_t *list) {
    gr_build *b = c->b;
    size_t n = json_array_size(list), i;
    json_t *x;
    char **names = calloc(n + 1, sizeof *names);
    size_t *lens = calloc(n + 1, sizeof *lens);
    if (!names || !lens) {
        free(names), free(lens);
        return sc_fail(c, "out of memory");
    }
    int32_t out = c->never;
    json_array_foreach(list, i, x) {
        const char *s = json_string_value(x);
        lens[i] = json_string_length(x);
        for (size_t j = 0; j < lens[i]; j++)
            if (s[j] < 0x20 || s[j] > 0x7e || s[j] == '"' || s[j] == '\\') {
                sc_fail(c, "'not' with a string value holding a quote, backslash, control or non-ASCII character "
                           "is not supported");
                goto done;
            }
        if (!(names[i] = malloc(lens[i] + 2))) {
            sc_fail(c, "out of memory");
            goto done;
        }
        memcpy(names[i], s, lens[i]);
        names[i][lens[i]++] = '"'; /* the closing quote ends a name in the trie */
    }
    uint32_t all[2] = {0, 0x10FFFF}, escaped[6] = {0, 0x1f, '"', '"', '\\', '\\'};
    sc_tail canon = {rule_of(c, gr_seq2(b, gr_repeat(b, gr_cpset(b, all, 1, 1), 0, GR_INF), lit(c, "\""))),
                     gr_cpset(b, escaped, 3, 1)};
    out = gr_seq2(b, lit(c, "\""), not_names(c, names, lens, (int)n, 0, &canon));
done:
    for (size_t j = 0; j < n; j++) free(names[j]);
    free(names), free(lens);
    return out;
}

/* Whether the JSON-encoded string body text[0..n) (no quotes) matches pattern re (searched,
 * as `pattern` is): 1, 0, or -1 when re does not compile (the caller reports it then). */
static int pattern_matches(const char *re, const char *text, size_t n) {
    gr_build b;
    gr_build_init(&b);
    hearth_error e = {0};
    int32_t body = 0;
    grammar *g = NULL;
    int r = -1;
    if (!gr_regex(&b, re, strlen(re), 1, &body, &e) && !gr_finish(&b, gr_rule_new(&b, body), &g, &e)) {
        gmatcher *m = gmatcher_new(g, NULL);
        r = m && gmatcher_accept_bytes(m, text, n) && gmatcher_can_end(m);
        gmatcher_free(m);
    }
    grammar_free(g);
    gr_build_free(&b);
    return r;
}

/* patternProperties: the member (key and value) rule for keys matching one of the
 * patterns, or -1 (with c->st set) when it cannot be exact here. A declared name matching
 * a pattern is refused (the key could then be written twice), and so are patterns with
 * different schemas (a key matching two must meet both). */
static int32_t pattern_members(sc_ctx *c, json_t *pp, char **enc, size_t *enc_len, int n, int depth) {
    gr_build *b = c->b;
    const char *re;
    json_t *ps, *first = NULL;
    int32_t keys = -1;
    json_object_foreach(pp, re, ps) {
        if (first && !json_equal(first, ps)) {
            sc_fail(c, "patternProperties with different schemas per pattern are not supported");
            return -1;
        }
        first = ps;
        for (int i = 0; i < n; i++) {
            int hit = pattern_matches(re, enc[i] + 1, enc_len[i] - 2);
            if (hit) {
                sc_fail(c, "property %s matches patternProperties '%.60s' (or the pattern is not supported)", enc[i],
                        re);
                return -1;
            }
        }
        int32_t body = 0;
        if (!c->st) c->st = gr_regex(b, re, strlen(re), 1, &body, c->err);
        if (c->st) {
            if (c->err) err_prefix(c->err, "json schema: patternProperties");
            return -1;
        }
        int32_t key = gr_seq3(b, lit(c, "\""), body, lit(c, "\""));
        keys = keys < 0 ? key : gr_alt2(b, keys, key);
    }
    int32_t val = sc_node(c, first, depth + 1);
    return rule_of(c, gr_seq(b, (int32_t[]){keys, c->ws, lit(c, ":"), c->ws, val}, 5));
}

static int32_t sc_object(sc_ctx *c, json_t *s, int depth) {
    gr_build *b = c->b;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    int n = 0;
    size_t cap =
        (json_is_object(props) ? json_object_size(props) : 0) + (json_is_array(req) ? json_array_size(req) : 0) + 1;
    const char **names = calloc(cap, sizeof *names);
    json_t **schemas = calloc(cap, sizeof *schemas);
    int *required = calloc(cap, sizeof *required);
    char **enc = calloc(cap, sizeof *enc);
    size_t *enc_len = calloc(cap, sizeof *enc_len);
    int32_t result = c->never;
    if (!names || !schemas || !required || !enc || !enc_len) {
        sc_fail(c, "out of memory");
        goto done;
    }
    const char *k;
    json_t *v;
    json_t *pp = json_object_get(s, "patternProperties");
    int pp_on = json_is_object(pp) && json_object_size(pp);
    if (json_is_object(props)) json_object_foreach(props, k, v) names[n] = k, schemas[n++] = v;
    if (json_is_array(req)) {
        size_t i;
        json_array_foreach(req, i, v) {
            const char *r = json_string_value(v);
            if (!r) continue;
            int found = 0;
            for (int j = 0; j < n; j++)
                if (!strcmp(names[j], r)) required[j] = 1, found = 1;
            if (!found) {
                if (pp_on) {
                    sc_fail(c, "required property '%.60s' beside patternProperties is not declared in properties", r);
                    goto done;
                }
                if (json_is_false(addl)) goto done; /* required but not allowed: nothing validates */
                names[n] = r, schemas[n] = addl && !json_is_true(addl) ? addl : NULL, required[n++] = 1;
            }
        }
    }
    json_t *minp = json_object_get(s, "minProperties"), *maxp = json_object_get(s, "maxProperties");
    int64_t min_p = json_is_number(minp) ? (int64_t)ceil(json_number_value(minp)) : 0;
    int64_t max_p = json_is_number(maxp) ? (int64_t)floor(json_number_value(maxp)) : GR_INF;
    int n_req = 0;
    for (int i = 0; i < n; i++) n_req += required[i];
    if (min_p < 0) min_p = 0;
    if (max_p != GR_INF && (max_p < n_req || max_p < min_p)) goto done; /* nothing validates */
    /* the count of members written, tracked up to max_p (or min_p when unbounded: past it
     * every count is alike), one rule per (member index, count) */
    int64_t top = max_p != GR_INF ? max_p : min_p;
    if (top > n) top = n; /* at most n declared members are ever written */
    if (min_p > GR_MAX_REPEAT || max_p > GR_MAX_REPEAT) {
        sc_fail(c, "minProperties / maxProperties above %d", GR_MAX_REPEAT);
        goto done;
    }
    int has_extra = pp_on || !json_is_false(addl);
    if (min_p > n + has_extra) { /* see rest(i, k) below: one extra member counts */
        if (has_extra)
            sc_fail(c, "minProperties %lld needs more than one property beyond the %d declared: not supported",
                    (long long)min_p, n);
        goto done;
    }
    if ((int64_t)(n + 1) * (top + 1) > SC_MAX_COUNT_RULES) {
        sc_fail(c, "minProperties / maxProperties with %d properties: more than %d rules", n, SC_MAX_COUNT_RULES);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        json_t *ks = json_string(names[i]);
        enc[i] = json_dumps(ks, JSON_ENCODE_ANY);
        json_decref(ks);
        if (!enc[i]) {
            sc_fail(c, "out of memory");
            goto done;
        }
        enc_len[i] = strlen(enc[i]);
    }
    int32_t comma = gr_seq3(b, c->ws, lit(c, ","), c->ws);
    int32_t *member = calloc((size_t)n + 1, sizeof *member);
    if (!member) {
        sc_fail(c, "out of memory");
        goto done;
    }
    for (int i = 0; i < n && !c->st; i++) {
        json_t *ps = schemas[i];
        int32_t val = !ps ? c->value : sc_node(c, ps, depth + 1);
        member[i] = gr_seq(b, (int32_t[]){lit(c, enc[i]), c->ws, lit(c, ":"), c->ws, val}, 5);
    }
    int32_t extra = -1;
    if (pp_on) {
        /* keys matching a pattern only: other keys (where additionalProperties would allow
         * them) are left out, which keeps every output valid */
        extra = pattern_members(c, pp, enc, enc_len, n, depth);
        if (extra < 0) {
            free(member);
            goto done;
        }
    } else if (!json_is_false(addl) && !c->st) {
        char **after_quote = malloc((size_t)n * sizeof *after_quote + 1);
        size_t *al = malloc((size_t)n * sizeof *al + 1);
        if (!after_quote || !al) {
            free(after_quote), free(al), free(member);
            sc_fail(c, "out of memory");
            goto done;
        }
        for (int i = 0; i < n; i++) after_quote[i] = enc[i] + 1, al[i] = enc_len[i] - 1;
        sc_tail any_key = {c->string_rest, re_node(c, "\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F]{4})", 0)};
        int32_t key = gr_seq2(b, lit(c, "\""), n ? not_names(c, after_quote, al, n, 0, &any_key) : c->string_rest);
        free(after_quote), free(al);
        int32_t val = addl && !json_is_true(addl) ? sc_node(c, addl, depth + 1) : c->value;
        extra = rule_of(c, gr_seq(b, (int32_t[]){key, c->ws, lit(c, ":"), c->ws, val}, 5));
    }
    /* rest(i, k): members i.. after k were written (k >= 1), each behind a comma. Extra
     * members (additional or pattern keys) come last; two of them may carry the same key,
     * which a validator counts once, so toward minProperties only the first one counts
     * (it differs from every declared name) while toward maxProperties each one does. */
    int64_t width = top + 1;
    int32_t *rest = calloc((size_t)(n + 1) * (size_t)width, sizeof *rest);
    if (!rest) {
        free(member);
        sc_fail(c, "out of memory");
        goto done;
    }
#define REST(i, k) rest[(size_t)(i) * (size_t)width + (size_t)((k) < top ? (k) : top)]
    for (int64_t k = 0; k <= top; k++) {
        int64_t left = max_p == GR_INF ? GR_INF : max_p - k; /* extras still allowed */
        int32_t more = extra >= 0 && left != 0 ? gr_seq2(b, comma, extra) : -1;
        if (k >= min_p)
            REST(n, k) = more >= 0 ? gr_repeat(b, more, 0, (int32_t)left) : gr_empty(b);
        else
            REST(n, k) = more >= 0 && k + 1 == min_p ? gr_repeat(b, more, 1, (int32_t)left) : c->never;
    }
    for (int i = n - 1; i >= 0; i--)
        for (int64_t k = 0; k <= top; k++) {
            int32_t take = max_p == GR_INF || k < max_p ? gr_seq3(b, comma, member[i], REST(i + 1, k + 1)) : c->never;
            REST(i, k) = rule_of(c, required[i] ? take : gr_alt2(b, take, REST(i + 1, k)));
        }
    /* first(i): the first member written is i or a later one (never past a required one) */
    int32_t first = c->never;
    if (extra >= 0 && max_p != 0 && min_p <= 1)
        first =
            gr_seq2(b, extra, gr_repeat(b, gr_seq2(b, comma, extra), 0, max_p == GR_INF ? GR_INF : (int32_t)max_p - 1));
    if (min_p == 0) first = extra >= 0 && max_p != 0 ? gr_opt(b, first) : gr_empty(b);
    for (int i = n - 1; i >= 0; i--) {
        int32_t here = max_p != 0 ? gr_seq2(b, member[i], REST(i + 1, 1)) : c->never;
        first = required[i] ? here : rule_of(c, gr_alt2(b, here, first));
    }
#undef REST
    result = gr_seq(b, (int32_t[]){lit(c, "{"), c->ws, first, c->ws, lit(c, "}")}, 5);
    free(member), free(rest);
done:
    for (int i = 0; enc && i < n; i++) free(enc[i]);
    free(names), free(schemas), free(required), free(enc), free(enc_len);
    return result;
}

/* ---- oneOf, enum and types ------------------------------------------------------------- */

static int value_is(json_t *v, const char *t) {
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    return 0;
}

/* the values s allows, when it lists them (const / enum); a new array or NULL */
static json_t *listed_values(json_t *s) {
    json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (c) {
        json_t *a = json_array();
        json_array_append(a, c);
        return a;
    }
    return json_is_array(e) ? json_incref(e) : NULL;
}

static int lists_disjoint(json_t *a, json_t *b) {
    size_t i, j;
    json_t *x, *y;
    json_array_foreach(a, i, x) json_array_foreach(b, j, y) if (json_equal(x, y)) return 0;
    return 1;
}

static int types_disjoint(json_t *a, json_t *b) {
    json_t *ta = json_object_get(a, "type"), *tb = json_object_get(b, "type");
    if (!ta || !tb) return 0;
    json_t *xa = types_of(ta), *xb = types_of(tb);
    size_t i;
    json_t *v;
    int overlap = 0;
    json_array_foreach(xa, i, v) {
        const char *t = json_string_value(v);
        if (!t) continue;
        overlap |= has_type(xb, t) || (!strcmp(t, "integer") && has_type(xb, "number")) ||
                   (!strcmp(t, "number") && has_type(xb, "integer"));
    }
    json_decref(xa), json_decref(xb);
    return !overlap;
}

static int is_required(json_t *s, const char *p) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(s, "required"), i,
                       v) if (json_is_string(v) && !strcmp(json_string_value(v), p)) return 1;
    return 0;
}

/* No instance satisfies both (a sufficient test: distinct types, distinct listed values,
 * or a property both require with distinct listed values). */
static int schemas_disjoint(json_t *a, json_t *b) {
    if (!json_is_object(a) || !json_is_object(b)) return json_is_false(a) || json_is_false(b);
    if (types_disjoint(a, b)) return 1;
    json_t *la = listed_values(a), *lb = listed_values(b);
    int d = la && lb && lists_disjoint(la, lb);
    json_decref(la), json_decref(lb);
    if (d) return 1;
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const char *k;
    json_t *v;
    json_object_foreach(pa, k, v) {
        json_t *w = json_object_get(pb, k);
        if (!w || !is_required(a, k) || !is_required(b, k)) continue;
        la = listed_values(v), lb = listed_values(w);
        d = la && lb && lists_disjoint(la, lb);
        json_decref(la), json_decref(lb);
        if (d) return 1;
    }
    return 0;
}

/* ---- listed values: an exact validator ---------------------------------------------------- */

/* A const / enum lists its values: those that meet the schema's other keywords are written
 * out, the others dropped, which makes every keyword exact there (not, multipleOf,
 * uniqueItems...). sc_valid decides one value: 1 valid, 0 not, -1 when a keyword has no
 * exact test here (the schema is then refused naming it). Equality and types follow JSON
 * Schema: 1 and 1.0 are one number, an integer is any whole number. */

static int sc_equal(json_t *a, json_t *b) {
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!sc_equal(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !sc_equal(v, w)) return 0;
        }
        return 1;
    }
    return json_equal(a, b);
}

/* s's code points as the grammar's JSON strings spell them (shortest escapes, \u00xx
 * lowercase): what patterns are matched against. A new string. */
static char *canon_body(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 6 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        static const char *named[0x20] = {[8] = "b", [9] = "t", [10] = "n", [12] = "f", [13] = "r"};
        if (ch == '"' || ch == '\\')
            *p++ = '\\', *p++ = (char)ch;
        else if (ch < 0x20 && named[ch])
            *p++ = '\\', *p++ = named[ch][0];
        else if (ch < 0x20)
            p += sprintf(p, "\\u%04x", ch);
        else
            *p++ = (char)ch;
    }
    *p = 0;
    *out_len = (size_t)(p - o);
    return o;
}

static int sc_valid(sc_ctx *c, json_t *s, json_t *v, int depth);

/* pattern re searched in string v: 1, 0, -1 (not a pattern this engine reads) */
static int string_matches(const char *re, json_t *v) {
    size_t n;
    char *body = canon_body(json_string_value(v), json_string_length(v), &n);
    int r = body ? pattern_matches(re, body, n) : -1;
    free(body);
    return r;
}

static size_t utf8_length(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* all of list's schemas (allOf), at least one (anyOf), exactly one (oneOf) */
static int valid_count(sc_ctx *c, json_t *list, json_t *v, int depth, int *n_valid) {
    size_t i;
    json_t *x;
    *n_valid = 0;
    json_array_foreach(list, i, x) {
        int r = sc_valid(c, x, v, depth + 1);
        if (r < 0) return -1;
        *n_valid += r;
    }
    return 1;
}

/* The JSON Schema number keywords as python-jsonschema evaluates them, but a fractional
 * multipleOf, which is decided exactly as the grammars take it (multiple_of: 0.07 is a
 * multiple of 0.01); other real steps divide in floating point. */
static int valid_number(json_t *s, json_t *v) {
    double x = json_number_value(v), b;
    json_t *emin = json_object_get(s, "exclusiveMinimum"), *emax = json_object_get(s, "exclusiveMaximum");
    if (num_of(s, "minimum", &b) && (json_is_true(emin) ? x <= b : x < b)) return 0;
    if (num_of(s, "maximum", &b) && (json_is_true(emax) ? x >= b : x > b)) return 0;
    if (json_is_number(emin) && x <= json_number_value(emin)) return 0;
    if (json_is_number(emax) && x >= json_number_value(emax)) return 0;
    json_t *m = json_object_get(s, "multipleOf");
    if (json_is_integer(m) && json_is_integer(v) && json_integer_value(m) > 0)
        return json_integer_value(v) % json_integer_value(m) == 0;
    int64_t coef, lo_u, hi_u;
    int scale, whole;
    if (json_is_real(m) && json_real_value(m) > 0 && json_real_value(m) != floor(json_real_value(m)) &&
        decimal_step(json_real_value(m), &coef, &scale)) {
        if (!bound_units(x, scale, &lo_u, &hi_u, &whole)) return -1;
        return whole && lo_u % coef == 0;
    }
    if (json_is_number(m)) {
        double q = json_is_real(m) ? x / json_number_value(m) : fmod(x, json_number_value(m));
        if (!isfinite(q)) return -1;
        return json_is_real(m) ? q == trunc(q) : q == 0;
    }
    return 1;
}

static int valid_string(json_t *s, json_t *v) {
    double b;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(s, SC_NOT_STRINGS), i, x) if (json_equal(x, v)) return 0;
    size_t len = utf8_length(json_string_value(v), json_string_length(v));
    if (num_of(s, "minLength", &b) && (double)len < b) return 0;
    if (num_of(s, "maxLength", &b) && (double)len > b) return 0;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (json_is_string(pat)) {
        int r = string_matches(json_string_value(pat), v);
        if (r <= 0) return r;
    }
    const char *fre;
    if (json_is_string(fmt) && format_regex(json_string_value(fmt), &fre)) {
        if (!fre) return -1;
        return string_matches(fre, v);
    }
    return 1;
}

static int valid_array(sc_ctx *c, json_t *s, json_t *v, int depth) {
    double b;
    size_t n = json_array_size(v);
    if (num_of(s, "minItems", &b) && (double)n < b) return 0;
    if (num_of(s, "maxItems", &b) && (double)n > b) return 0;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems"), *more = items;
    if (json_is_array(items)) prefix = items, more = json_object_get(s, "additionalItems");
    size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
    for (size_t i = 0; i < n; i++) {
        json_t *is = i < np ? json_array_get(prefix, i) : more;
        int r = is ? sc_valid(c, is, json_array_get(v, i), depth + 1) : 1;
        if (r <= 0) return r;
    }
    json_t *u = json_object_get(s, "uniqueItems");
    if (json_is_true(u))
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (sc_equal(json_array_get(v, i), json_array_get(v, j))) return 0;
    json_t *has = json_object_get(s, "contains");
    if (has) {
        double lo = 1, hi = -1;
        num_of(s, "minContains", &lo);
        num_of(s, "maxContains", &hi);
        size_t hits = 0;
        for (size_t i = 0; i < n; i++) {
            int r = sc_valid(c, has, json_array_get(v, i), depth + 1);
            if (r < 0) return r;
            hits += (size_t)r;
        }
        if ((double)hits < lo || (hi >= 0 && (double)hits > hi)) return 0;
    }
    return 1;
}

static int valid_object(sc_ctx *c, json_t *s, json_t *v, int depth) {
    double b;
    if (num_of(s, "minProperties", &b) && (double)json_object_size(v) < b) return 0;
    if (num_of(s, "maxProperties", &b) && (double)json_object_size(v) > b) return 0;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(s, "required"), i,
                       x) if (json_is_string(x) && !json_object_get(v, json_string_value(x))) return 0;
    json_t *props = json_object_get(s, "properties"), *pp = json_object_get(s, "patternProperties");
    json_t *addl = json_object_get(s, "additionalProperties"), *names = json_object_get(s, "propertyNames");
    json_t *deps[2] = {json_object_get(s, "dependencies"), json_object_get(s, "dependentRequired")};
    json_t *dep_schemas = json_object_get(s, "dependentSchemas");
    const char *k;
    json_t *val;
    json_object_foreach(v, k, val) {
        json_t *key = json_string(k);
        int r = names ? sc_valid(c, names, key, depth + 1) : 1, known = 0;
        json_t *ps = json_object_get(props, k);
        if (r > 0 && ps) known = 1, r = sc_valid(c, ps, val, depth + 1);
        const char *re;
        json_t *rs;
        if (json_is_object(pp)) json_object_foreach(pp, re, rs) {
                if (r <= 0) break;
                int hit = string_matches(re, key);
                if (hit < 0) r = -1;
                if (hit > 0) known = 1, r = sc_valid(c, rs, val, depth + 1);
            }
        if (r > 0 && !known && addl) r = sc_valid(c, addl, val, depth + 1);
        for (int d = 0; d < 2 && r > 0; d++) {
            json_t *dep = json_object_get(deps[d], k);
            if (json_is_array(dep)) {
                json_array_foreach(dep, i, x) if (json_is_string(x) && !json_object_get(v, json_string_value(x))) r = 0;
            } else if (dep)
                r = sc_valid(c, dep, v, depth + 1);
        }
        json_t *ds = json_object_get(dep_schemas, k);
        if (r > 0 && ds) r = sc_valid(c, ds, v, depth + 1);
        json_decref(key);
        if (r <= 0) return r;
    }
    return 1;
}

static int sc_valid(sc_ctx *c, json_t *s, json_t *v, int depth) {
    if (json_is_boolean(s)) return json_is_true(s);
    if (!json_is_object(s) || depth > SC_MAX_DEPTH) return -1;
    const char *k;
    json_t *x;
    json_object_foreach(s, k, x) { /* keywords with no test here */
        if (!strcmp(k, "unevaluatedProperties") || !strcmp(k, "unevaluatedItems") || !strcmp(k, "$dynamicRef") ||
            !strcmp(k, "$recursiveRef"))
            if (!refused_ok(k, x)) return -1;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        json_t *t = resolve(c, json_string_value(ref));
        if (!t) return -1;
        int r = sc_valid(c, t, v, depth + 1);
        if (r <= 0 || c->ref_alone) return r;
    }
    json_t *t = json_object_get(s, "type");
    if (t) {
        json_t *ts = types_of(t);
        size_t i;
        int ok = 0;
        json_array_foreach(ts, i, x) ok |= json_is_string(x) && value_is(v, json_string_value(x));
        json_decref(ts);
        if (!ok) return 0;
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst && !sc_equal(cst, v)) return 0;
    if (en) {
        size_t i;
        int ok = 0;
        json_array_foreach(en, i, x) ok |= sc_equal(x, v);
        if (!ok) return 0;
    }
    int n, r;
    json_t *all = json_object_get(s, "allOf"), *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (all && valid_count(c, all, v, depth, &n) < 0) return -1;
    if (all && n != (int)json_array_size(all)) return 0;
    if (any && (r = valid_count(c, any, v, depth, &n)) <= 0) return r;
    if (any && !n) return 0;
    if (one && (r = valid_count(c, one, v, depth, &n)) <= 0) return r;
    if (one && n != 1) return 0;
    json_t *no = json_object_get(s, "not");
    if (no && (r = sc_valid(c, no, v, depth + 1)) != 0) return r < 0 ? -1 : 0;
    json_t *cond = json_object_get(s, "if");
    if (cond) {
        r = sc_valid(c, cond, v, depth + 1);
        if (r < 0) return r;
        json_t *then = json_object_get(s, r ? "then" : "else");
        if (then && (r = sc_valid(c, then, v, depth + 1)) <= 0) return r;
    }
    if (json_is_number(v) && (r = valid_number(s, v)) <= 0) return r;
    if (json_is_string(v) && (r = valid_string(s, v)) <= 0) return r;
    if (json_is_array(v)) return valid_array(c, s, v, depth);
    if (json_is_object(v)) return valid_object(c, s, v, depth);
    return 1;
}

/* const / enum: the listed values that meet every other keyword of s */
static int32_t sc_listed(sc_ctx *c, json_t *s) {
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (en && !json_is_array(en)) return sc_fail(c, "'enum' must be an array");
    json_t *list = cst ? cst : en;
    size_t n = cst ? 1 : json_array_size(en), i;
    if (!n) return c->never;
    int32_t *alts = malloc(n * sizeof *alts);
    if (!alts) return sc_fail(c, "out of memory");
    int k = 0;
    for (i = 0; i < n && !c->st; i++) {
        json_t *v = cst ? list : json_array_get(en, i);
        int r = sc_valid(c, s, v, 0);
        if (r < 0)
            sc_fail(c,
                    "%s value %zu: a keyword beside it has no exact test here (a format or pattern this engine "
                    "does not read, unevaluated*, $dynamicRef)",
                    cst ? "const" : "enum", i);
        else if (r)
            alts[k++] = sc_const(c, v, 0);
    }
    int32_t out = k && !c->st ? gr_alt(c->b, alts, k) : c->never;
    free(alts);
    return out;
}

/* ---- not ------------------------------------------------------------------------------------ */

/* The complement of schema n as a schema again (a new reference), for the forms where it is
 * one: boolean schemas, not, anyOf / allOf (De Morgan), type, required, properties, enum /
 * const of null and booleans, and the bound keywords (a bound's complement is the opposite
 * bound on that type; values of other types meet a bound, so they fail its not). A keyword
 * the complement cannot be written for refuses the schema, naming it. */
static json_t *sc_complement(sc_ctx *c, json_t *n, int depth) {
    if (depth > SC_MAX_DEPTH) {
        sc_fail(c, "'not' nested too deeply");
        return json_false();
    }
    if (json_is_boolean(n)) return json_boolean(!json_is_true(n));
    if (!json_is_object(n)) {
        sc_fail(c, "'not' must hold a schema");
        return json_false();
    }
    json_t *d = sc_deref(c, n, depth + 1); /* $ref and allOf folded in */
    json_t *any = json_array();            /* an instance fails n when it fails one keyword */
    static const char *const all_types[] = {"object", "array", "string", "number", "boolean", "null"};
    /* bound keyword, the type it bounds, its complement */
    static const char *const bounds[][3] = {
        {"minimum", "number", "exclusiveMaximum"},
        {"maximum", "number", "exclusiveMinimum"},
        {"exclusiveMinimum", "number", "maximum"},
        {"exclusiveMaximum", "number", "minimum"},
        {"minLength", "string", "maxLength"},
        {"maxLength", "string", "minLength"},
        {"minItems", "array", "maxItems"},
        {"maxItems", "array", "minItems"},
        {"minProperties", "object", "maxProperties"},
        {"maxProperties", "object", "minProperties"},
    };
    const char *k;
    json_t *v;
    json_object_foreach(json_is_object(d) ? d : NULL, k, v) {
        if (c->st || is_annotation(k)) continue;
        size_t i;
        json_t *x;
        if (!strcmp(k, "not")) {
            json_array_append(any, v);
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
            /* not anyOf: every branch fails; not oneOf: the same when branches exclude each other */
            json_t *each = json_array();
            json_array_foreach(v, i, x) json_array_append_new(each, sc_complement(c, x, depth + 1));
            for (size_t a = 0; !strcmp(k, "oneOf") && a < json_array_size(v); a++)
                for (size_t z = a + 1; z < json_array_size(v); z++)
                    if (!schemas_disjoint(json_array_get(v, a), json_array_get(v, z)))
                        sc_fail(c, "'not' over a oneOf whose branches %zu and %zu may both match", a, z);
            json_array_append_new(any, json_pack("{s:o}", "allOf", each));
        } else if (!strcmp(k, "allOf")) {
            json_array_foreach(v, i, x) json_array_append_new(any, sc_complement(c, x, depth + 1));
        } else if (!strcmp(k, "type")) {
            json_t *ts = types_of(v), *rest = json_array();
            /* not integer: numbers that are not whole have no grammar here, so they are left
             * out (never written), as are all numbers */
            int no_numbers = has_type(ts, "integer");
            for (int t = 0; t < 6; t++)
                if (!has_type(ts, all_types[t]) && (!no_numbers || strcmp(all_types[t], "number")))
                    json_array_append_new(rest, json_string(all_types[t]));
            json_array_append_new(any, json_pack("{s:o}", "type", rest));
            json_decref(ts);
        } else if (!strcmp(k, "required")) {
            json_array_foreach(v, i, x) if (json_is_string(x)) json_array_append_new(
                any, json_pack("{s:s,s:{s:b}}", "type", "object", "properties", json_string_value(x), 0));
        } else if (!strcmp(k, "properties")) {
            const char *p;
            json_object_foreach(v, p, x)
                json_array_append_new(any, json_pack("{s:s,s:[s],s:{s:o}}", "type", "object", "required", p,
                                                     "properties", p, sc_complement(c, x, depth + 1)));
        } else if (!strcmp(k, "enum") || !strcmp(k, "const")) {
            json_t *vals = strcmp(k, "const") ? json_incref(v) : json_pack("[O]", v);
            int has_null = 0, has_true = 0, has_false = 0;
            json_t *strings = NULL;
            json_array_foreach(vals, i, x) {
                has_null |= json_is_null(x), has_true |= json_is_true(x), has_false |= json_is_false(x);
                if (json_is_string(x)) {
                    if (!strings) strings = json_array();
                    json_array_append(strings, x);
                } else if (!json_is_null(x) && !json_is_boolean(x))
                    sc_fail(c, "'not' with enum / const values other than strings, null, true and false is not "
                               "supported");
            }
            json_decref(vals);
            json_t *rest = json_array();
            for (int t = 0; t < 6; t++)
                if (strcmp(all_types[t], "null") && strcmp(all_types[t], "boolean") &&
                    (!strings || strcmp(all_types[t], "string")))
                    json_array_append_new(rest, json_string(all_types[t]));
            if (!has_null) json_array_append_new(rest, json_string("null"));
            json_array_append_new(any, json_pack("{s:o}", "type", rest));
            if (has_true != has_false) json_array_append_new(any, json_pack("{s:b}", "const", has_false));
            if (!has_true && !has_false) json_array_append_new(any, json_pack("{s:s}", "type", "boolean"));
            if (strings) json_array_append_new(any, json_pack("{s:s,s:o}", "type", "string", SC_NOT_STRINGS, strings));
        } else {
            size_t b = 0;
            while (b < sizeof bounds / sizeof *bounds && strcmp(k, bounds[b][0])) b++;
            if (b == sizeof bounds / sizeof *bounds || !json_is_number(v)) {
                sc_fail(c, "keyword '%.40s' inside 'not' is not supported", k);
                break;
            }
            json_t *opp = json_pack("{s:s}", "type", bounds[b][1]);
            double x = json_number_value(v);
            if (bounds[b][1][0] == 'n') /* numbers: the strict / loose opposite */
                json_object_set(opp, bounds[b][2], v);
            else if (k[1] == 'i') /* minLength n: at most n-1 */
                json_object_set_new(opp, bounds[b][2], json_integer((json_int_t)ceil(x) - 1));
            else
                json_object_set_new(opp, bounds[b][2], json_integer((json_int_t)floor(x) + 1));
            if ((!strcmp(k, "minimum") || !strcmp(k, "maximum")) &&
                json_is_boolean(json_object_get(d, k[1] == 'i' ? "exclusiveMinimum" : "exclusiveMaximum")))
                sc_fail(c, "'not' with a draft-4 exclusiveMinimum / exclusiveMaximum is not supported");
            json_array_append_new(any, opp);
        }
    }
    json_decref(d);
    if (!json_array_size(any)) {
        json_decref(any);
        return json_false(); /* n accepts everything */
    }
    return json_pack("{s:o}", "anyOf", any);
}

/* s with its not replaced by the complement, folded in through allOf */
static json_t *sc_without_not(sc_ctx *c, json_t *s) {
    json_t *out = json_copy(s), *all = json_object_get(s, "allOf");
    json_t *folded = json_is_array(all) ? json_copy(all) : json_array();
    json_array_append_new(folded, sc_complement(c, json_object_get(s, "not"), 0));
    json_object_del(out, "not");
    json_object_set_new(out, "allOf", folded);
    return out;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

static int32_t sc_types(sc_ctx *c, json_t *s, int depth) {
    json_t *t = json_object_get(s, "type");
    static const char *const all[] = {"object", "array", "string", "number", "boolean", "null"};
    const char *list[8];
    int n = 0;
    if (!t) {
        for (int i = 0; i < 6; i++) list[n++] = all[i];
    } else if (json_is_string(t))
        list[n++] = json_string_value(t);
    else if (json_is_array(t)) {
        size_t i;
        json_t *v;
        json_array_foreach(t, i, v) if (json_is_string(v) && n < 8) list[n++] = json_string_value(v);
    } else
        return sc_fail(c, "'type' must be a string or an array");
    int has_number = 0;
    for (int i = 0; i < n; i++) has_number |= !strcmp(list[i], "number");
    int32_t alts[8];
    int k = 0;
    for (int i = 0; i < n && !c->st; i++) {
        const char *ty = list[i];
        if (!strcmp(ty, "object"))
            alts[k++] = sc_object(c, s, depth);
        else if (!strcmp(ty, "array"))
            alts[k++] = sc_array(c, s, depth);
        else if (!strcmp(ty, "string"))
            alts[k++] = sc_string(c, s);
        else if (!strcmp(ty, "number"))
            alts[k++] = sc_number(c, s);
        else if (!strcmp(ty, "integer")) {
            if (!has_number) alts[k++] = sc_integer(c, s);
        } else if (!strcmp(ty, "boolean"))
            alts[k++] = gr_alt2(c->b, lit(c, "true"), lit(c, "false"));
        else if (!strcmp(ty, "null"))
            alts[k++] = lit(c, "null");
        else
            return sc_fail(c, "unknown type '%.40s'", ty);
    }
    return k ? gr_alt(c->b, alts, k) : c->never;
}

static int32_t sc_node(sc_ctx *c, json_t *s, int depth) {
    if (c->st) return c->never;
    if (depth > SC_MAX_DEPTH * 4) return sc_fail(c, "schema nested too deeply");
    if (json_is_true(s)) return c->value;
    if (json_is_false(s)) return c->never;
    if (!json_is_object(s)) return sc_fail(c, "a schema must be an object or a boolean");
    /* a bare $ref: one rule per target, so recursive schemas stay finite */
    json_t *ref = json_object_get(s, "$ref");
    int siblings = 0;
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) if (strcmp(k, "$ref") && !is_annotation(k)) siblings = !c->ref_alone;
    if (json_is_string(ref) && !siblings) {
        json_t *t = resolve(c, json_string_value(ref));
        if (!t) return c->never;
        for (int i = 0; i < c->n_refs; i++)
            if (c->refs[i].target == t) return gr_ref(c->b, c->refs[i].rule);
        if (c->n_refs == c->cap_refs) {
            int nc = c->cap_refs ? c->cap_refs * 2 : 16;
            sc_ref *r = realloc(c->refs, (size_t)nc * sizeof *r);
            if (!r) return sc_fail(c, "out of memory");
            c->refs = r, c->cap_refs = nc;
        }
        int32_t rule = gr_rule_new(c->b, -1);
        if (rule < 0) return sc_fail(c, "out of memory");
        c->refs[c->n_refs++] = (sc_ref){t, rule};
        int32_t body = sc_node(c, t, depth + 1);
        c->b->rules[rule].body = body;
        return gr_ref(c->b, rule);
    }
    if (ref || json_object_get(s, "allOf")) {
        json_t *m = sc_deref(c, s, 0);
        json_array_append_new(c->keep, m);
        if (c->st) return c->never;
        if (json_object_get(m, "$ref") || json_object_get(m, "allOf")) return sc_node(c, m, depth + 1);
        return sc_node(c, m, depth + 1);
    }
    if (json_object_get(s, "const") || json_object_get(s, "enum")) return sc_listed(c, s);
    if (json_object_get(s, "not")) {
        json_t *m = sc_without_not(c, s);
        json_array_append_new(c->keep, m);
        return c->st ? c->never : sc_node(c, m, depth + 1);
    }
    if (!check_keywords(c, s)) return c->never;
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    if (json_is_array(any)) {
        /* oneOf is anyOf when no two branches can match one instance, as in the tagged
         * unions schemas use it for; other oneOf are refused */
        json_t *rest = json_copy(s);
        json_object_del(rest, "anyOf");
        json_object_del(rest, "oneOf");
        int rest_empty = 1;
        json_object_foreach(rest, k, v) if (!is_annotation(k)) rest_empty = 0;
        size_t n = json_array_size(any), i;
        if (!n) {
            json_decref(rest);
            return c->never;
        }
        int32_t *alts = malloc(n * sizeof *alts);
        if (!alts) {
            json_decref(rest);
            return sc_fail(c, "out of memory");
        }
        json_t *merged = json_array();
        json_array_foreach(any, i, v) {
            json_t *m = rest_empty ? sc_deref(c, v, 0) : merge(c, rest, v, 0);
            json_array_append_new(merged, m);
        }
        int one_of = !json_object_get(s, "anyOf");
        for (size_t a = 0; one_of && a < n && !c->st; a++)
            for (size_t z = a + 1; z < n && !c->st; z++)
                if (!schemas_disjoint(json_array_get(merged, a), json_array_get(merged, z)))
                    sc_fail(c,
                            "oneOf branches %zu and %zu may both match (oneOf is enforced only when its branches "
                            "exclude each other)",
                            a, z);
        json_array_foreach(any, i, v) alts[i] = sc_node(c, rest_empty ? v : json_array_get(merged, i), depth + 1);
        json_array_append_new(c->keep, merged);
        json_decref(rest);
        int32_t r = gr_alt(c->b, alts, (int)n);
        free(alts);
        return r;
    }
    return sc_types(c, s, depth);
}

hearth_status gr_schema(gr_build *b, const char *text, size_t len, int object_only, int32_t *root, hearth_error *err) {
    sc_ctx c = {.b = b, .err = err};
    json_error_t je;
    c.keep = json_array();
    if (object_only)
        c.root = json_pack("{s:s}", "type", "object");
    else {
        c.root = json_loadb(text, len, JSON_DECODE_ANY, &je);
        if (!c.root) {
            json_decref(c.keep);
            return err_set(err, HEARTH_ERR_FORMAT, "json schema: invalid JSON at line %d column %d: %s", je.line,
                           je.column, je.text);
        }
    }
    const char *draft = json_string_value(json_object_get(c.root, "$schema"));
    c.ref_alone = draft && (strstr(draft, "draft-03") || strstr(draft, "draft-04") || strstr(draft, "draft-06") ||
                            strstr(draft, "draft-07"));
    sc_base(&c);
    int32_t body = 0;
    if (!c.st) body = sc_node(&c, c.root, 0);
    if (!c.st) *root = gr_rule_new(b, body);
    free(c.refs);
    json_decref(c.keep);
    json_decref(c.root);
    if (!c.st && b->oom) return err_set(err, HEARTH_ERR_NOMEM, "json schema: grammar too large or out of memory");
    return c.st;
}

hearth_status grammar_compile(grammar_kind kind, const char *text, size_t len, const gvocab *v, grammar **out,
                              hearth_error *err) {
    *out = NULL;
    gr_build b;
    gr_build_init(&b);
    b.vocab = v;
    int32_t root = -1, node = 0;
    hearth_status st;
    switch (kind) {
    case GRAMMAR_JSON_SCHEMA: st = gr_schema(&b, text, len, 0, &root, err); break;
    case GRAMMAR_JSON_OBJECT: st = gr_schema(&b, text, len, 1, &root, err); break;
    case GRAMMAR_REGEX:
        st = gr_regex(&b, text, len, 0, &node, err);
        if (!st) root = gr_rule_new(&b, node);
        break;
    case GRAMMAR_GBNF: st = gr_gbnf(&b, text, len, &root, err); break;
    case GRAMMAR_TOOL_CALL: st = gr_tool_call(&b, text, len, &root, err); break;
    default: st = err_set(err, HEARTH_ERR_INVALID, "unknown grammar kind %d", (int)kind); break;
    }
    if (!st && root < 0) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!st) st = gr_finish(&b, root, out, err);
    gr_build_free(&b);
    return st;
}
