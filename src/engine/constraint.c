/* constraint.c: a request's output constraint compiled to a grammar (hearth_constraint_check
 * and the engine's own use in generate.c). Its own file: a caller that only validates a
 * request (the server's parsers) links the grammar module, not the engine. */
#include "base/err.h"
#include "engine/engine_internal.h"
#include "grammar/grammar.h"

static const grammar_kind GRAMMAR_OF[] = {
    [HEARTH_CONSTRAINT_JSON_SCHEMA] = GRAMMAR_JSON_SCHEMA,
    [HEARTH_CONSTRAINT_JSON_OBJECT] = GRAMMAR_JSON_OBJECT,
    [HEARTH_CONSTRAINT_REGEX] = GRAMMAR_REGEX,
    [HEARTH_CONSTRAINT_GBNF] = GRAMMAR_GBNF,
    [HEARTH_CONSTRAINT_TOOL_CALL] = GRAMMAR_TOOL_CALL,
};

hearth_status engine_constraint_compile(hearth_constraint_kind kind, const char *text, size_t len, const gvocab *v,
                                        grammar **out, hearth_error *err) {
    if (kind <= HEARTH_CONSTRAINT_NONE || kind > HEARTH_CONSTRAINT_TOOL_CALL)
        return err_set(err, HEARTH_ERR_INVALID, "unknown constraint kind %d", (int)kind);
    if (!text && kind != HEARTH_CONSTRAINT_JSON_OBJECT)
        return err_set(err, HEARTH_ERR_INVALID, "the constraint has no text");
    hearth_status st = grammar_compile(GRAMMAR_OF[kind], text ? text : "", text ? len : 0, v, out, err);
    if (st == HEARTH_ERR_FORMAT) { /* bad input from the caller */
        st = HEARTH_ERR_INVALID;
        if (err) err->status = st;
    }
    return st;
}

hearth_status hearth_constraint_check(hearth_constraint_kind kind, const char *text, size_t len, hearth_error *err) {
    grammar *g = NULL;
    hearth_status st = engine_constraint_compile(kind, text, len, NULL, &g, err);
    grammar_free(g);
    return st;
}

