/* pylit.h: reads the subset of Python literal syntax that tool-call parsers meet
 * (what ast.literal_eval accepts and json.dumps can write: str, int, float, bool,
 * None, list, tuple, dict) into jansson values, and the pythonic tool-call list
 * `[f(a=1), g.h(b="x")]`. Anything outside the subset is a failure, never a guess. */
#ifndef HEARTH_SERVER_PYLIT_H
#define HEARTH_SERVER_PYLIT_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* ast.literal_eval(text): leading spaces/tabs skipped, one literal, then only
 * whitespace. json_names: also read true/false/null (the pythonic parser's
 * _JSONLiterals transform). Returns a new reference or NULL if not a literal. */
json_t *pylit_eval(const char *text, size_t len, bool json_names);

/* Parses text that must be exactly a Python list of keyword-only calls, e.g.
 * `[f(a=1), pkg.g(b=[1, true])]`, into a JSON array of {"name", "arguments"}.
 * NULL when text is anything else (empty list, positional args, non-literal values). */
json_t *pylit_call_list(const char *text, size_t len);

#endif
