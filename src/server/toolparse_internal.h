/* toolparse_internal.h: what the tool-call parsers share (toolparse.c and
 * toolparse_typed.c): PCRE2 regexes compiled as upstream's `regex` patterns behave
 * (DOTALL, Unicode classes), the call object, and Python's float() / json.loads(strict=False).
 * Not for use outside the tool parsers. */
#ifndef HEARTH_SERVER_TOOLPARSE_INTERNAL_H
#define HEARTH_SERVER_TOOLPARSE_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "server/toolparse.h"

typedef struct {
    pcre2_code *code;
    pcre2_match_data *md;
} tp_rx;

bool tp_rx_open(tp_rx *r, const char *pattern);
void tp_rx_close(tp_rx *r);
/* Match at or after `from` (anchored: exactly at `from`). Returns the ovector or NULL. */
PCRE2_SIZE *tp_rx_match(tp_rx *r, const char *s, size_t n, size_t from, bool anchored);
/* Group g of the last match; unset groups give false. */
bool tp_rx_group(tp_rx *r, int g, size_t *b, size_t *e);

/* {"name": name, "arguments": args}; takes args over; NULL if name is not UTF-8. */
json_t *tp_make_call(const char *name, size_t len, json_t *args);
/* Python float(): surrounding whitespace, digits with '_' separators, inf/nan. */
bool tp_py_float(const char *s, size_t n, double *out);
/* Python json.loads(s, strict=False): raw control characters allowed inside strings. */
json_t *tp_json_load_lax(const char *s, size_t n);

/* MiniCPM5's <function name=...><param name=...>...</param> calls (toolparse_typed.c). */
hearth_status tp_parse_minicpm5(const char *s, size_t n, const json_t *tools, json_t *calls, hearth_error *err);

#endif
