/* sbuf.h: a growable byte/string buffer, always NUL-terminated. Used by parsers and
 * renderers that build output of unknown length; not for per-token hot paths. */
#ifndef HEARTH_BASE_SBUF_H
#define HEARTH_BASE_SBUF_H
#include <stddef.h>

typedef struct sbuf {
    char *data;
    size_t len, cap;
    int oom; /* set once an allocation failed; later appends are dropped */
} sbuf;

void sbuf_init(sbuf *b);
void sbuf_free(sbuf *b);
void sbuf_reset(sbuf *b);
void sbuf_append(sbuf *b, const char *s, size_t n);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_putc(sbuf *b, char c);
__attribute__((format(printf, 2, 3))) void sbuf_printf(sbuf *b, const char *fmt, ...);
/* Hands the buffer over to the caller (free with free()); b is left empty. */
char *sbuf_steal(sbuf *b);
#endif
