/* gram_tool.c: the tool-call constraint. Its source is a JSON document
 *   {"alternatives": [[piece, ...], ...], "before": [piece, ...], "between": [piece, ...],
 *    "after": [piece, ...], "parallel": bool}   (all but "alternatives" optional)
 *   piece: {"text": s} | {"token": s} | {"schema": v}
 *     | {"optional": [piece, ...]} | {"choice": [[piece, ...], ...]}
 *     | {"raw": {"without": s, "not": [w, ...]}} | {"regex": s} | {"pyschema": v}
 * and the output is "before", one call (one alternative), then with "parallel" true any
 * number of further calls each after "between", then "after". A call is one alternative's
 * pieces in order: literal text, a marker written as
 * the special token whose text is s (or the plain text s where the vocabulary has no such
 * token: grammar_compile), a JSON value valid against schema v (numbers within +-1e15,
 * what every tool-call parser reads exactly), the pieces or nothing,
 * one of the piece lists, free text that never contains s and is none of the words w
 * (ASCII case ignored: a value some formats read as null), text matching a regular
 * expression, a JSON value valid against schema v written so that Python's literal syntax
 * reads the same value (JSON's true/false/null read as Python's: no \/ or \uXXXX string
 * escapes beyond the shortest forms of control characters). The server writes the alternatives from a model family's
 * tool-call syntax; this file knows no family. */
#include "grammar/grammar_internal.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define GT_MAX_ALTERNATIVES 1024 /* tools in one request: far above what any client sends */
#define GT_MAX_PIECES 256        /* pieces of one alternative (or of one nested list) */
#define GT_MAX_DEPTH 8           /* nesting of "optional" / "choice" */
#define GT_RAW_STATES 4096       /* states of one raw-text automaton */
#define GT_RAW_WORDS 32          /* words a raw text may not be */
#define GT_RAW_LEN 64            /* bytes of the excluded string and of each word */

static hearth_status seq_of(gr_build *b, const json_t *seq, const char *at, int depth, int32_t *out, hearth_error *err);

/* One state of the raw-text automaton: k bytes of the excluded string matched (KMP), and
 * the words the text read so far is still a case-blind prefix of (p bytes of them). */
typedef struct {
    int32_t k, p;
    uint32_t words;
} raw_state;

typedef struct {
    const char *w;
    size_t m;
    int32_t fail[GT_RAW_LEN];
    const char *word[GT_RAW_WORDS];
    size_t wlen[GT_RAW_WORDS];
    size_t n_words;
    raw_state *st;
    int32_t *rule;
    int32_t n;
} raw_ctx;

static int lower_ascii(int c) { return c >= 'A' && c <= 'Z' ? c | 0x20 : c; }

/* The state after byte c (an ASCII byte), or k == m when c completes the excluded string. */
static raw_state raw_step(const raw_ctx *r, raw_state s, int c) {
    int32_t k = s.k;
    while (k > 0 && (unsigned char)r->w[k] != c) k = r->fail[k - 1];
    if ((unsigned char)r->w[k] == c) k++;
    uint32_t words = 0;
    for (size_t i = 0; i < r->n_words; i++)
        if ((s.words >> i & 1) && r->wlen[i] > (size_t)s.p &&
            lower_ascii((unsigned char)r->word[i][s.p]) == lower_ascii(c))
            words |= 1u << i;
    return (raw_state){k, words ? s.p + 1 : 0, words};
}

/* The index of state s, added (with a fresh rule) when new; -1 on overflow. */
static int32_t raw_index(gr_build *b, raw_ctx *r, raw_state s) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->st[i].k == s.k && r->st[i].p == s.p && r->st[i].words == s.words) return i;
    if (r->n == GT_RAW_STATES) return -1;
    r->st[r->n] = s;
    r->rule[r->n] = gr_rule_new(b, -1);
    return r->rule[r->n] < 0 ? -1 : r->n++;
}

/* Whether the text read up to state s is exactly one of the words. */
static int raw_is_word(const raw_ctx *r, raw_state s) {
    for (size_t i = 0; i < r->n_words; i++)
        if ((s.words >> i & 1) && r->wlen[i] == (size_t)s.p) return 1;
    return 0;
}

/* {"raw": {"without": S, "not": [w, ...]}}: any text (whole UTF-8 characters, tab, newline,
 * carriage return and printable ones) that never contains S and is none of the words w
 * (ASCII case ignored). One rule per automaton state, each a right-recursive (tail)
 * choice of the next byte, so the matcher's stack stays flat however long the text. */
static hearth_status raw_piece(gr_build *b, const json_t *spec, const char *at, int32_t *out, hearth_error *err) {
    const json_t *without = json_object_get(spec, "without"), *not = json_object_get(spec, "not"), *v;
    raw_ctx r = {0};
    size_t i;
    if (!json_is_object(spec) || !json_is_string(without) || !json_string_length(without) ||
        json_string_length(without) >= GT_RAW_LEN || (not &&!json_is_array(not )) ||
        json_array_size(not ) > GT_RAW_WORDS)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "tool call: %s: raw must be {\"without\": s (1 to %d bytes), \"not\": [up to %d words]}", at,
                       GT_RAW_LEN - 1, GT_RAW_WORDS);
    r.w = json_string_value(without), r.m = json_string_length(without);
    json_array_foreach(not, i, v) {
        if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= GT_RAW_LEN)
            return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s: raw 'not' holds words of 1 to %d bytes", at,
                           GT_RAW_LEN - 1);
        r.word[i] = json_string_value(v), r.wlen[i] = json_string_length(v);
        for (size_t k = 0; k < r.wlen[i]; k++)
            if ((unsigned char)r.word[i][k] >= 0x80)
                return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s: raw 'not' words must be ASCII", at);
    }
    r.n_words = json_array_size(not );
    for (size_t k = 0; k < r.m; k++)
        if ((unsigned char)r.w[k] >= 0x80 || (unsigned char)r.w[k] < 0x20)
            return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s: raw 'without' must be printable ASCII", at);
    for (size_t k = 1, j = 0; k < r.m; k++) { /* KMP failure function */
        while (j > 0 && r.w[k] != r.w[j]) j = (size_t)r.fail[j - 1];
        if (r.w[k] == r.w[j]) j++;
        r.fail[k] = (int32_t)j;
    }
    r.st = malloc(GT_RAW_STATES * sizeof *r.st);
    r.rule = malloc(GT_RAW_STATES * sizeof *r.rule);
    hearth_status st = HEARTH_OK;
    int32_t start = -1, reset = -1;
    if (!r.st || !r.rule)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    else if ((start = raw_index(b, &r, (raw_state){0, 0, r.n_words ? (1u << r.n_words) - 1 : 0})) < 0 ||
             (reset = raw_index(b, &r, (raw_state){0, 0, 0})) < 0)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    static const uint32_t NON_ASCII[] = {0x80, 0xD7FF, 0xE000, 0x10FFFF};
    for (int32_t s = 0; !st && s < r.n; s++) { /* r.n grows as states are found */
        int32_t target[128], kids[130], n_kids = 0;
        for (int c = 0; c < 128; c++) {
            target[c] = -1;
            if (c != '\t' && c != '\n' && c != '\r' && (c < 0x20 || c == 0x7F)) continue;
            raw_state t = raw_step(&r, r.st[s], c);
            if ((size_t)t.k == r.m) continue;
            if ((target[c] = raw_index(b, &r, t)) < 0) {
                st = err_set(err, HEARTH_ERR_UNSUPPORTED, "tool call: %s: raw text needs too many states", at);
                break;
            }
        }
        if (st) break;
        if (!raw_is_word(&r, r.st[s])) kids[n_kids++] = gr_empty(b);
        for (int c = 0; c < 128; c++) { /* one (byte set, next state) branch per target */
            if (target[c] < 0) continue;
            gr_byteset set = {0};
            int32_t t = target[c];
            for (int d = c; d < 128; d++)
                if (target[d] == t) gr_add(&set, (unsigned)d), target[d] = -1;
            kids[n_kids++] = gr_seq2(b, gr_byteset_node(b, &set), gr_ref(b, r.rule[t]));
        }
        kids[n_kids++] = gr_seq2(b, gr_cpset(b, NON_ASCII, 2, 0), gr_ref(b, r.rule[reset]));
        if (!b->oom) b->rules[r.rule[s]].body = gr_alt(b, kids, n_kids);
    }
    if (!st) *out = gr_ref(b, r.rule[start]);
    free(r.st), free(r.rule);
    return st;
}

/* A piece; *at names it in errors. */
static hearth_status piece(gr_build *b, const json_t *p, const char *at, int depth, int32_t *out, hearth_error *err) {
    const json_t *text = json_object_get(p, "text"), *token = json_object_get(p, "token");
    const json_t *schema = json_object_get(p, "schema"), *opt = json_object_get(p, "optional");
    const json_t *choice = json_object_get(p, "choice"), *raw = json_object_get(p, "raw");
    const json_t *regex = json_object_get(p, "regex"), *py = json_object_get(p, "pyschema");
    if (!json_is_object(p) || json_object_size(p) != 1 ||
        (!json_is_string(text) && !json_is_string(token) && !schema && !opt && !choice && !raw &&
         !json_is_string(regex) && !py))
        return err_set(
            err, HEARTH_ERR_FORMAT,
            "tool call: %s must be {\"text\": s}, {\"token\": s}, {\"schema\": v}, {\"optional\": "
            "[pieces]}, {\"choice\": [[pieces], ...]}, {\"raw\": {...}}, {\"regex\": s} or {\"pyschema\": v}",
            at);
    if (depth > GT_MAX_DEPTH)
        return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s: nested deeper than %d", at, GT_MAX_DEPTH);
    if (raw) return raw_piece(b, raw, at, out, err);
    if (regex) {
        hearth_status st = gr_regex(b, json_string_value(regex), json_string_length(regex), 0, out, err);
        if (st) err_prefix(err, "tool call: %s", at);
        return st;
    }
    if (opt) {
        int32_t body;
        hearth_status st = seq_of(b, opt, at, depth + 1, &body, err);
        if (!st) *out = gr_opt(b, body);
        return st;
    }
    if (choice) {
        size_t n = json_array_size(choice);
        if (!json_is_array(choice) || !n || n > GT_MAX_ALTERNATIVES)
            return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s: 'choice' must be a list of 1 to %d piece lists", at,
                           GT_MAX_ALTERNATIVES);
        int32_t *kids = malloc(n * sizeof *kids);
        if (!kids) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        hearth_status st = HEARTH_OK;
        for (size_t i = 0; !st && i < n; i++) {
            char sub[96];
            snprintf(sub, sizeof sub, "%.60s.choice[%zu]", at, i);
            st = seq_of(b, json_array_get(choice, i), sub, depth + 1, &kids[i], err);
        }
        if (!st) *out = gr_alt(b, kids, (int)n);
        free(kids);
        return st;
    }
    if (text) {
        *out = gr_literal(b, json_string_value(text), json_string_length(text));
        return HEARTH_OK;
    }
    if (token) {
        size_t n = json_string_length(token);
        char *marked = malloc(n + 1);
        if (!marked) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        marked[0] = (char)GR_SPECIAL_BYTE;
        memcpy(marked + 1, json_string_value(token), n);
        int32_t special = gr_literal(b, marked, n + 1), plain = gr_literal(b, json_string_value(token), n);
        if (!b->vocab)
            *out = gr_alt2(b, plain, special);
        else
            *out = gvocab_has_special(b->vocab, json_string_value(token), n) ? special : plain;
        free(marked);
        return HEARTH_OK;
    }
    char *src = json_dumps(py ? py : schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!src) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    int32_t rule = -1;
    b->py_strings = py != NULL, b->small_numbers = 1;
    hearth_status st = gr_schema(b, src, strlen(src), 0, &rule, err);
    b->py_strings = 0, b->small_numbers = 0;
    free(src);
    if (st) {
        err_prefix(err, "tool call: %s", at);
        return st;
    }
    *out = gr_ref(b, rule);
    return HEARTH_OK;
}

/* A list of pieces in order. */
static hearth_status seq_of(gr_build *b, const json_t *seq, const char *at, int depth, int32_t *out,
                            hearth_error *err) {
    size_t m = json_array_size(seq);
    int32_t kids[GT_MAX_PIECES];
    if (!json_is_array(seq) || !m || m > GT_MAX_PIECES)
        return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s must be a list of 1 to %d pieces", at, GT_MAX_PIECES);
    for (size_t k = 0; k < m; k++) {
        char sub[96];
        snprintf(sub, sizeof sub, "%.60s[%zu]", at, k);
        hearth_status st = piece(b, json_array_get(seq, k), sub, depth, &kids[k], err);
        if (st) return st;
    }
    *out = gr_seq(b, kids, (int)m);
    return HEARTH_OK;
}

/* The optional piece list `key` of doc (absent: *out = -1). */
static hearth_status envelope(gr_build *b, const json_t *doc, const char *key, int32_t *out, hearth_error *err) {
    const json_t *v = json_object_get(doc, key);
    *out = -1;
    return v ? seq_of(b, v, key, 0, out, err) : HEARTH_OK;
}

hearth_status gr_tool_call(gr_build *b, const char *text, size_t len, int32_t *root, hearth_error *err) {
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    if (!doc)
        return err_set(err, HEARTH_ERR_FORMAT, "tool call: invalid JSON at line %d column %d: %s", je.line, je.column,
                       je.text);
    const json_t *alts = json_object_get(doc, "alternatives"), *parallel = json_object_get(doc, "parallel");
    size_t n = json_array_size(alts);
    hearth_status st = HEARTH_OK;
    int32_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
    if (!json_is_array(alts) || !n || n > GT_MAX_ALTERNATIVES)
        st = err_set(err, HEARTH_ERR_FORMAT, "tool call: 'alternatives' must be a list of 1 to %d piece lists",
                     GT_MAX_ALTERNATIVES);
    else if (parallel && !json_is_boolean(parallel))
        st = err_set(err, HEARTH_ERR_FORMAT, "tool call: 'parallel' must be true or false");
    else if (!nodes)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        char at[64];
        snprintf(at, sizeof at, "alternatives[%zu]", i);
        st = seq_of(b, json_array_get(alts, i), at, 0, &nodes[i], err);
    }
    int32_t before = -1, between = -1, after = -1;
    if (!st) st = envelope(b, doc, "before", &before, err);
    if (!st) st = envelope(b, doc, "between", &between, err);
    if (!st) st = envelope(b, doc, "after", &after, err);
    if (!st) {
        /* one rule for a call, referenced by the first call and by each further one */
        int32_t call = gr_rule_new(b, gr_alt(b, nodes, (int)n)), kids[4];
        int k = 0;
        if (before >= 0) kids[k++] = before;
        kids[k++] = gr_ref(b, call);
        if (json_is_true(parallel)) {
            int32_t more = between >= 0 ? gr_seq2(b, between, gr_ref(b, call)) : gr_ref(b, call);
            kids[k++] = gr_repeat(b, more, 0, GR_INF);
        }
        if (after >= 0) kids[k++] = after;
        *root = gr_rule_new(b, gr_seq(b, kids, k));
    }
    free(nodes);
    json_decref(doc);
    if (!st && b->oom) st = err_set(err, HEARTH_ERR_NOMEM, "tool call: grammar too large or out of memory");
    return st;
}
