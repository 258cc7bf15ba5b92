/* gram_parse.h: the text-reading pieces the regex and GBNF parsers share (UTF-8,
 * character classes, escapes, {m,n} braces, positioned errors). */
#ifndef HEARTH_GRAM_PARSE_H
#define HEARTH_GRAM_PARSE_H
#include "grammar/grammar_internal.h"
#include <stdio.h>

#define GR_MAX_CLASS 4096 /* ranges in one character class */

typedef struct {
    gr_build *b;
    const char *s;
    size_t n, i;
    int json; /* code points in their JSON-escaped form */
    int gbnf; /* errors as line:col; GBNF class escapes */
    uint32_t *class_buf;
    hearth_error *err;
    hearth_status st;
} gr_parser;

static inline int gr_hexval(int c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}
int32_t gr_utf8_next(const char *s, size_t n, size_t *pos); /* -1: invalid or at end */
void gr_err_at(gr_parser *p, size_t at, const char *fmt, const char *arg);
int32_t gr_parse_class(gr_parser *p); /* at '[' */
int32_t gr_any_char(gr_parser *p, int newline_too);
int32_t gr_single_cp(gr_parser *p, uint32_t cp);
int gr_parse_braces(gr_parser *p, int32_t *min, int32_t *max); /* at '{' */
int32_t gr_quantify(gr_parser *p, int32_t x);
#endif
