/* http_parse.c: the request head, chunked body and query string parsers of
 * http_parse.h. Lines end in CRLF only; field names are tokens followed directly by
 * ':'; a body length that two readers could read differently (Content-Length with
 * Transfer-Encoding, differing lengths, a coding other than a final "chunked") is an
 * error, never a guess. Works on bytes only: no sockets, no server state. */
#include "server/http_parse.h"
#include <limits.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 section 5.6.2: tchar */
static int is_tchar(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* field-vchar, SP and HTAB (obs-text allowed as RFC 9110 section 5.5 does) */
static int is_field_char(unsigned char ch) { return ch == '\t' || (ch >= 0x20 && ch != 0x7f); }

static int fail(http_head *h, int status, const char *error) {
    h->status = status;
    h->error = error;
    return -1;
}

size_t http_head_length(const char *buf, size_t len) {
    /* clients may send an empty line before the request line (RFC 9112 section 2.2) */
    size_t start = 0;
    while (start + 1 < len && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
    for (size_t i = start; i + 3 < len; i++)
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') return i + 4;
    return 0;
}

static int hex_value(unsigned char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decodes %XX in place; plus_space: '+' is a space (query strings). Returns -1 on a
 * malformed escape or an encoded NUL. */
static int percent_decode(char *s, int plus_space) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hex_value((unsigned char)r[1]), lo = hi < 0 ? -1 : hex_value((unsigned char)r[2]);
            if (lo < 0 || (hi == 0 && lo == 0)) return -1;
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = plus_space && *r == '+' ? ' ' : *r;
        }
    }
    *w = 0;
    return 0;
}

/* The request line "METHOD SP request-target SP HTTP/1.x", NUL-terminated. */
static int parse_request_line(char *line, http_head *h) {
    char *p = line;
    while (is_tchar((unsigned char)*p)) p++;
    if (p == line || *p != ' ') return fail(h, 400, "malformed request line");
    *p++ = 0;
    h->method = line;
    char *target = p;
    while ((unsigned char)*p > 0x20 && *p != 0x7f) p++;
    if (p == target || *p != ' ') return fail(h, 400, "malformed request line");
    *p++ = 0;
    if (strncmp(p, "HTTP/", 5) || !(p[5] >= '0' && p[5] <= '9') || p[6] != '.' || !(p[7] >= '0' && p[7] <= '9') || p[8])
        return fail(h, 400, "malformed HTTP version");
    if (p[5] != '1') return fail(h, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
    h->minor = p[7] - '0';
    /* absolute-form (RFC 9112 section 3.2.2): the path is what follows the authority */
    if (!strncasecmp(target, "http://", 7) || !strncasecmp(target, "https://", 8)) {
        char *slash = strchr(strstr(target, "//") + 2, '/');
        if (slash) {
            target = slash;
        } else { /* no path: "/" (written over the scheme, the buffer must stay writable) */
            target[0] = '/';
            target[1] = 0;
        }
    }
    if (target[0] != '/' && strcmp(target, "*")) return fail(h, 400, "malformed request target");
    char *q = strchr(target, '?');
    if (q) *q++ = 0;
    h->query = q ? q : "";
    if (strchr(target, '#') || percent_decode(target, 0)) return fail(h, 400, "malformed request target");
    h->path = target;
    return 0;
}

/* Whether a comma-separated field value holds token (case-insensitive). */
static int list_has(const char *v, const char *token) {
    size_t n = strlen(token);
    while (*v) {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        const char *start = v;
        while (*v && *v != ',') v++;
        const char *end = v;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if ((size_t)(end - start) == n && !strncasecmp(start, token, n)) return 1;
    }
    return 0;
}

/* Content-Length: 1*DIGIT, or a list of the same value repeated (RFC 9112 section
 * 6.3 lets a recipient take that as the one value). */
static int parse_length(const char *v, int *seen, unsigned long long *out) {
    while (*v) {
        while (*v == ' ' || *v == '\t') v++;
        if (!(*v >= '0' && *v <= '9')) return -1;
        unsigned long long x = 0;
        for (; *v >= '0' && *v <= '9'; v++)
            x = x > (ULLONG_MAX - 9) / 10 ? ULLONG_MAX : x * 10 + (unsigned long long)(*v - '0');
        while (*v == ' ' || *v == '\t') v++;
        if (*v == ',')
            v++;
        else if (*v)
            return -1;
        if (*seen && x != *out) return -1;
        *seen = 1;
        *out = x;
    }
    return 0;
}

/* Transfer-Encoding: the only coding understood is chunked, once, last. */
static int parse_transfer_encoding(const http_head *h, http_head *out) {
    int n_codings = 0, last_chunked = 0, chunked_count = 0;
    for (size_t i = 0; i < h->n_fields; i++) {
        if (strcasecmp(h->fields[i].name, "Transfer-Encoding")) continue;
        const char *v = h->fields[i].value;
        while (*v) {
            while (*v == ' ' || *v == '\t' || *v == ',') v++;
            if (!*v) break;
            const char *start = v;
            while (*v && *v != ',') v++;
            const char *end = v;
            while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
            n_codings++;
            last_chunked = end - start == 7 && !strncasecmp(start, "chunked", 7);
            chunked_count += last_chunked;
        }
    }
    if (!n_codings) return fail(out, 400, "empty Transfer-Encoding");
    /* RFC 9112 section 6.3: chunked not last means the length cannot be known: 400 */
    if (!last_chunked || chunked_count > 1) return fail(out, 400, "Transfer-Encoding must end in a single chunked");
    if (n_codings > 1) return fail(out, 501, "transfer codings other than chunked are not supported");
    out->chunked = 1;
    return 0;
}

/* The body's length and the connection's persistence from the fields. */
static int parse_framing(http_head *h) {
    int has_te = 0, has_cl = 0, hosts = 0;
    for (size_t i = 0; i < h->n_fields; i++) {
        const char *name = h->fields[i].name, *v = h->fields[i].value;
        if (!strcasecmp(name, "Content-Length")) {
            if (parse_length(v, &has_cl, &h->content_length)) return fail(h, 400, "invalid Content-Length");
        } else if (!strcasecmp(name, "Transfer-Encoding")) {
            has_te = 1;
        } else if (!strcasecmp(name, "Host")) {
            hosts++;
        } else if (!strcasecmp(name, "Expect")) {
            if (strcasecmp(v, "100-continue")) return fail(h, 417, "only Expect: 100-continue is supported");
            h->expect_continue = 1;
        }
    }
    /* RFC 9112 section 3.2: exactly one Host in HTTP/1.1, at most one in 1.0 */
    if (hosts > 1 || (h->minor == 1 && !hosts)) return fail(h, 400, "HTTP/1.1 requires exactly one Host field");
    if (has_te && has_cl) return fail(h, 400, "Content-Length and Transfer-Encoding together");
    if (has_te && h->minor == 0) return fail(h, 400, "Transfer-Encoding in an HTTP/1.0 request");
    if (has_te && parse_transfer_encoding(h, h)) return -1;
    h->has_length = has_cl;
    const char *conn = http_field_value(h, "Connection");
    h->keep_alive = h->minor == 1 ? !(conn && list_has(conn, "close")) : conn && list_has(conn, "keep-alive");
    return 0;
}

int http_parse_head(char *buf, size_t n, http_head *h) {
    memset(h, 0, sizeof *h);
    h->query = "";
    size_t pos = 0;
    while (pos + 1 < n && buf[pos] == '\r' && buf[pos + 1] == '\n') pos += 2;
    int first = 1;
    while (pos < n) {
        char *line = buf + pos;
        size_t len = 0;
        /* every line ends in CRLF; a bare CR or LF anywhere is refused */
        while (pos + len < n && buf[pos + len] != '\r' && buf[pos + len] != '\n') len++;
        if (pos + len + 1 >= n || buf[pos + len] != '\r' || buf[pos + len + 1] != '\n')
            return fail(h, 400, "lines must end in CRLF");
        line[len] = 0;
        pos += len + 2;
        if (first) {
            if (memchr(line, 0, len)) return fail(h, 400, "NUL in request line");
            if (parse_request_line(line, h)) return -1;
            first = 0;
            continue;
        }
        if (!len) return parse_framing(h); /* the empty line ends the head */
        if (line[0] == ' ' || line[0] == '\t') return fail(h, 400, "obsolete line folding");
        char *p = line;
        while (is_tchar((unsigned char)*p)) p++;
        /* no whitespace between the name and the colon (RFC 9112 section 5.1) */
        if (p == line || *p != ':') return fail(h, 400, "malformed header field");
        *p++ = 0;
        for (char *c = p; c < line + len; c++)
            if (!is_field_char((unsigned char)*c)) return fail(h, 400, "invalid character in header field");
        while (*p == ' ' || *p == '\t') p++;
        char *end = line + len;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t')) end--;
        *end = 0;
        if (h->n_fields == HTTP_MAX_FIELDS) return fail(h, 431, "too many header fields");
        h->fields[h->n_fields].name = line;
        h->fields[h->n_fields++].value = p;
    }
    return fail(h, 400, "incomplete request head");
}

const char *http_field_value(const http_head *h, const char *name) {
    for (size_t i = 0; i < h->n_fields; i++)
        if (!strcasecmp(h->fields[i].name, name)) return h->fields[i].value;
    return NULL;
}

/* ---- chunked bodies ----------------------------------------------------------- */

enum { CH_SIZE, CH_EXT, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF, CH_TRAILER, CH_TRAILER_LF, CH_END_LF, CH_DONE };

/* Bounds on what is read and dropped: a chunk-size line with its extensions, and the
 * whole trailer section. Far above what any client sends. */
#define CH_MAX_LINE 4096
#define CH_MAX_TRAILERS 16384

static long chunk_fail(int *status, const char **error, int code, const char *why) {
    *status = code;
    *error = why;
    return -1;
}

long http_chunked_feed(http_chunked *c, const char *in, size_t n, sbuf *out, size_t max_body, int *done, int *status,
                       const char **error) {
    size_t i = 0;
    *done = 0;
    while (i < n && c->state != CH_DONE) {
        unsigned char ch = (unsigned char)in[i];
        switch (c->state) {
        case CH_SIZE: {
            int v = hex_value(ch);
            if (v >= 0) {
                /* 15 hex digits already exceed any body limit; more would overflow */
                if (++c->digits > 15) return chunk_fail(status, error, 413, "chunk size too large");
                c->remaining = c->remaining * 16 + (unsigned)v;
            } else if (!c->digits) {
                return chunk_fail(status, error, 400, "malformed chunk size");
            } else if (ch == ';' || ch == ' ' || ch == '\t') {
                c->state = CH_EXT;
            } else if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else {
                return chunk_fail(status, error, 400, "malformed chunk size");
            }
            if (++c->line > CH_MAX_LINE) return chunk_fail(status, error, 400, "chunk size line too long");
            i++;
            break;
        }
        case CH_EXT:
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (!is_field_char(ch))
                return chunk_fail(status, error, 400, "malformed chunk extension");
            if (++c->line > CH_MAX_LINE) return chunk_fail(status, error, 400, "chunk size line too long");
            i++;
            break;
        case CH_SIZE_LF:
            if (ch != '\n') return chunk_fail(status, error, 400, "chunk size line must end in CRLF");
            i++;
            c->line = 0;
            c->digits = 0;
            if (!c->remaining) {
                c->state = CH_TRAILER;
            } else {
                if (c->remaining > max_body || out->len > max_body - c->remaining)
                    return chunk_fail(status, error, 413, "request body too large");
                c->state = CH_DATA;
            }
            break;
        case CH_DATA: {
            size_t take = n - i < c->remaining ? n - i : (size_t)c->remaining;
            sbuf_append(out, in + i, take);
            if (out->oom) return chunk_fail(status, error, 413, "request body too large");
            c->remaining -= take;
            i += take;
            if (!c->remaining) c->state = CH_DATA_CR;
            break;
        }
        case CH_TRAILER: /* at the start of a trailer line, or of the final CRLF */
            if (ch == '\r' && !c->line) {
                c->state = CH_END_LF;
            } else if (ch == '\r') {
                c->state = CH_TRAILER_LF;
            } else if (!is_field_char(ch)) {
                return chunk_fail(status, error, 400, "malformed trailer field");
            } else {
                c->line++;
            }
            if (++c->trailers > CH_MAX_TRAILERS) return chunk_fail(status, error, 400, "trailer section too long");
            i++;
            break;
        case CH_DATA_CR:
        case CH_DATA_LF:
        case CH_TRAILER_LF:
        case CH_END_LF: { /* one byte of a CRLF, then the next part */
            static const char want[] = {
                [CH_DATA_CR] = '\r', [CH_DATA_LF] = '\n', [CH_TRAILER_LF] = '\n', [CH_END_LF] = '\n'};
            static const int next[] = {
                [CH_DATA_CR] = CH_DATA_LF, [CH_DATA_LF] = CH_SIZE, [CH_TRAILER_LF] = CH_TRAILER, [CH_END_LF] = CH_DONE};
            if (ch != want[c->state]) return chunk_fail(status, error, 400, "chunked body lines must end in CRLF");
            c->state = next[c->state];
            c->line = 0;
            i++;
            break;
        }
        }
    }
    *done = c->state == CH_DONE;
    return (long)i;
}

/* ---- query strings ------------------------------------------------------------ */

const char *http_query_value(const char *query, const char *key, char *out, size_t cap) {
    size_t klen = strlen(key);
    for (const char *p = query; p && *p;) {
        const char *amp = strchr(p, '&'), *end = amp ? amp : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        const char *name_end = eq ? eq : end;
        char name[128];
        size_t nlen = (size_t)(name_end - p);
        if (nlen < sizeof name) {
            memcpy(name, p, nlen);
            name[nlen] = 0;
            if (!percent_decode(name, 1) && strlen(name) == klen && !memcmp(name, key, klen)) {
                const char *v = eq ? eq + 1 : end;
                size_t vlen = (size_t)(end - v);
                if (vlen >= cap) return NULL;
                memcpy(out, v, vlen);
                out[vlen] = 0;
                return percent_decode(out, 1) ? NULL : out;
            }
        }
        p = amp ? amp + 1 : NULL;
    }
    return NULL;
}
