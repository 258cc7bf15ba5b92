/* json_text.c: see json_text.h. */
#include "io/json_text.h"
#include <stdlib.h>
#include <string.h>

/* A copy of text where every integer literal (outside strings) too long for int64 gets
 * ".0" appended, which makes it a real; NULL on out of memory. */
static char *widen_big_ints(const char *text, size_t len, size_t *out_len) {
    char *out = malloc(len * 2 + 1); /* at most ".0" per three input bytes: "-9" + digits */
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (c == '"') { /* a string: copied as is, escapes included */
            out[o++] = text[i++];
            while (i < len && text[i] != '"') {
                if (text[i] == '\\' && i + 1 < len) out[o++] = text[i++];
                out[o++] = text[i++];
            }
            if (i < len) out[o++] = text[i++];
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t s = i, digits = 0;
            if (text[i] == '-') i++;
            while (i < len && text[i] >= '0' && text[i] <= '9') i++, digits++;
            int integer = !(i < len && (text[i] == '.' || text[i] == 'e' || text[i] == 'E'));
            while (i < len && strchr("0123456789.eE+-", text[i])) i++; /* the rest of a real */
            memcpy(out + o, text + s, i - s);
            o += i - s;
            if (integer && digits >= 19) out[o++] = '.', out[o++] = '0';
            continue;
        }
        out[o++] = text[i++];
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

json_t *json_loadb_big_ints(const char *text, size_t len, size_t flags, json_error_t *je) {
    json_t *j = json_loadb(text, len, flags, je);
    if (j || json_error_code(je) != json_error_numeric_overflow) return j;
    size_t wlen = 0;
    char *wide = widen_big_ints(text, len, &wlen);
    if (!wide) return NULL;
    j = json_loadb(wide, wlen, flags, je);
    free(wide);
    return j;
}
