/* gram_tool.c: the tool-call constraint. Its source is a JSON document
 *   {"alternatives": [[piece, ...], ...]}, piece: {"text": s} | {"token": s} | {"schema": v}
 * and the output is one alternative's pieces in order: literal text, a marker written as
 * the special token whose text is s (or the plain text s where the vocabulary has no such
 * token: grammar_compile), a JSON value valid against
 * schema v. The server writes the alternatives from a model family's tool-call syntax;
 * this file knows no family. */
#include "grammar/grammar_internal.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define GT_MAX_ALTERNATIVES 1024 /* tools in one request: far above what any client sends */
#define GT_MAX_PIECES 64         /* pieces of one alternative */

/* A piece; *at names it in errors. */
static hearth_status piece(gr_build *b, const json_t *p, const char *at, int32_t *out, hearth_error *err) {
    const json_t *text = json_object_get(p, "text"), *token = json_object_get(p, "token");
    const json_t *schema = json_object_get(p, "schema");
    if (!json_is_object(p) || json_object_size(p) != 1 || (!json_is_string(text) && !json_is_string(token) && !schema))
        return err_set(err, HEARTH_ERR_FORMAT, "tool call: %s must be {\"text\": s}, {\"token\": s} or {\"schema\": v}",
                       at);
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
    char *src = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!src) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    int32_t rule = -1;
    hearth_status st = gr_schema(b, src, strlen(src), 0, &rule, err);
    free(src);
    if (st) {
        err_prefix(err, "tool call: %s", at);
        return st;
    }
    *out = gr_ref(b, rule);
    return HEARTH_OK;
}

hearth_status gr_tool_call(gr_build *b, const char *text, size_t len, int32_t *root, hearth_error *err) {
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    if (!doc)
        return err_set(err, HEARTH_ERR_FORMAT, "tool call: invalid JSON at line %d column %d: %s", je.line, je.column,
                       je.text);
    const json_t *alts = json_object_get(doc, "alternatives");
    size_t n = json_array_size(alts);
    hearth_status st = HEARTH_OK;
    int32_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
    if (!json_is_array(alts) || !n || n > GT_MAX_ALTERNATIVES)
        st = err_set(err, HEARTH_ERR_FORMAT, "tool call: 'alternatives' must be a list of 1 to %d piece lists",
                     GT_MAX_ALTERNATIVES);
    else if (!nodes)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        const json_t *seq = json_array_get(alts, i);
        size_t m = json_array_size(seq);
        int32_t kids[GT_MAX_PIECES];
        if (!json_is_array(seq) || !m || m > GT_MAX_PIECES) {
            st = err_set(err, HEARTH_ERR_FORMAT, "tool call: alternatives[%zu] must be a list of 1 to %d pieces", i,
                         GT_MAX_PIECES);
            break;
        }
        for (size_t k = 0; !st && k < m; k++) {
            char at[64];
            snprintf(at, sizeof at, "alternatives[%zu][%zu]", i, k);
            st = piece(b, json_array_get(seq, k), at, &kids[k], err);
        }
        if (!st) nodes[i] = gr_seq(b, kids, (int)m);
    }
    if (!st) *root = gr_rule_new(b, gr_alt(b, nodes, (int)n));
    free(nodes);
    json_decref(doc);
    if (!st && b->oom) st = err_set(err, HEARTH_ERR_NOMEM, "tool call: grammar too large or out of memory");
    return st;
}
