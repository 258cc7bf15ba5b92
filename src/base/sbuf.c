/* sbuf.c: growable string buffer (see sbuf.h). */
#include "base/sbuf.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sbuf_init(sbuf *b) { memset(b, 0, sizeof *b); }
void sbuf_free(sbuf *b) { free(b->data); sbuf_init(b); }
void sbuf_reset(sbuf *b) { b->len = 0; if (b->data) b->data[0] = 0; }

static int sbuf_reserve(sbuf *b, size_t extra) {
    if (b->oom) return 0;
    if (extra > ((size_t)-1) / 2 - b->len) { b->oom = 1; return 0; }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = 1; return 0; }
    b->data = p;
    b->cap = cap;
    return 1;
}

void sbuf_append(sbuf *b, const char *s, size_t n) {
    if (!sbuf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}
void sbuf_puts(sbuf *b, const char *s) { sbuf_append(b, s, strlen(s)); }
void sbuf_putc(sbuf *b, char c) { sbuf_append(b, &c, 1); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0 && sbuf_reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

char *sbuf_steal(sbuf *b) {
    char *p = b->data;
    if (!p) p = calloc(1, 1);
    sbuf_init(b);
    return p;
}
