/* err.c: error values (see err.h). No allocation: messages live in the caller's struct. */
#include "base/err.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hearth_status err_set(hearth_error *err, hearth_status status, const char *fmt, ...) {
    if (!err) return status;
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

void err_prefix(hearth_error *err, const char *fmt, ...) {
    if (!err) return;
    char head[512], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    size_t hl = strlen(head);
    if (hl > sizeof err->message - 3) hl = sizeof err->message - 3;
    memcpy(err->message, head, hl);
    memcpy(err->message + hl, ": ", 2);
    size_t room = sizeof err->message - hl - 3, ol = strnlen(old, sizeof old);
    if (ol > room) ol = room;
    memcpy(err->message + hl + 2, old, ol);
    err->message[hl + 2 + ol] = 0;
}

const char *hearth_status_name(hearth_status s) {
    switch (s) {
    case HEARTH_OK: return "ok";
    case HEARTH_ERR_IO: return "io_error";
    case HEARTH_ERR_FORMAT: return "format_error";
    case HEARTH_ERR_UNSUPPORTED: return "unsupported";
    case HEARTH_ERR_NOT_FOUND: return "not_found";
    case HEARTH_ERR_AMBIGUOUS: return "ambiguous";
    case HEARTH_ERR_INVALID: return "invalid_argument";
    case HEARTH_ERR_NOMEM: return "out_of_memory";
    case HEARTH_ERR_TEMPLATE: return "template_error";
    }
    return "unknown";
}
