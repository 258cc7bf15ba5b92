/* err.h: building hearth_error values. Every fallible library function takes a
 * hearth_error * (may be NULL) and returns a hearth_status; err_set fills both. */
#ifndef HEARTH_BASE_ERR_H
#define HEARTH_BASE_ERR_H
#include "hearth.h"

__attribute__((format(printf, 3, 4)))
hearth_status err_set(hearth_error *err, hearth_status status, const char *fmt, ...);
/* Prefixes an existing message with context, e.g. the file name. */
__attribute__((format(printf, 2, 3)))
void err_prefix(hearth_error *err, const char *fmt, ...);
#endif
