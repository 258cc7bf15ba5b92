/* respond.c: the bottom of the server that every endpoint calls: writing a response
 * (status line, Date, CORS, framing, keep-alive or close), streams in chunked
 * encoding, the request's header fields and query parameters, and the log in
 * mlx_lm.server's format. Knows no routes and no request fields. */
#define _GNU_SOURCE
#include "server/http_conn.h"
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

void srv_log(const srv_server *s, srv_log_level level, const char *fmt, ...) {
    if (level < s->cfg.log_level) return;
    static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"};
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s - %s - %s\n", stamp, names[level], line); /* mlx_lm.server's log format */
}

int srv_conn_write(srv_conn *c, const char *buf, size_t len) {
    unsigned timeout = c->s->cfg.timeout_s;
    while (len && !c->failed) {
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        int ready = poll(&p, 1, timeout ? (int)(timeout * 1000) : -1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) break;
        /* never blocks: a client that stops reading is bounded by the poll above */
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;
        buf += n;
        len -= (size_t)n;
    }
    if (len) c->failed = 1;
    return len ? -1 : 0;
}

static const char *reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* Whether origin was named in --allowed-origins (the "*" entry does not count). */
static int origin_listed(const srv_server *s, const char *origin) {
    for (size_t i = 0; i < s->cfg.n_origins; i++)
        if (!strcmp(s->cfg.origins[i], origin)) return 1;
    return 0;
}

/* Access-Control-*: any origin with "*" (mlx_lm.server's default) except on routes
 * that change state, where only a listed origin is named. */
static void cors_headers(sbuf *h, const srv_conn *c) {
    const srv_server *s = c->s;
    const char *origin = srv_header(c, "Origin");
    if (s->cfg.origins_any && !c->cross_origin_limited) {
        sbuf_puts(h, "Access-Control-Allow-Origin: *\r\n");
    } else if (origin && origin[0] && origin_listed(s, origin)) {
        sbuf_printf(h, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", origin);
    }
    sbuf_puts(h, "Access-Control-Allow-Methods: *\r\nAccess-Control-Allow-Headers: *\r\n");
}

/* The status line and the headers every response carries; length < 0: a stream. */
static void head_of(sbuf *h, srv_conn *c, int status, const char *content_type, long long length,
                    const char *const *extra) {
    c->status = status;
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    sbuf_printf(h, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, reason(status), date);
    if (content_type) sbuf_printf(h, "Content-type: %s\r\n", content_type);
    cors_headers(h, c);
    for (size_t i = 0; extra && extra[i]; i += 2) sbuf_printf(h, "%s: %s\r\n", extra[i], extra[i + 1]);
    /* a stream without chunked encoding (HTTP/1.0) ends where the connection does */
    if (length < 0 && c->head.minor == 0) c->keep_alive = 0;
    /* 204 and 304 carry no body and no length (RFC 9110 sections 8.6 and 15.4.5) */
    if (length >= 0 && status != 204 && status != 304)
        sbuf_printf(h, "Content-Length: %lld\r\n", length);
    else if (length < 0 && c->head.minor == 1)
        sbuf_puts(h, "Transfer-Encoding: chunked\r\n");
    if (!c->keep_alive)
        sbuf_puts(h, "Connection: close\r\n");
    else if (c->head.minor == 0)
        sbuf_puts(h, "Connection: keep-alive\r\n");
    sbuf_puts(h, "\r\n");
}

int srv_respond_bytes(srv_conn *c, int status, const char *content_type, const void *body, size_t len,
                      const char *const *extra) {
    if (c->answered) return !c->failed; /* one response per request */
    c->answered = 1;
    sbuf h;
    sbuf_init(&h);
    head_of(&h, c, status, content_type, (long long)len, extra);
    int head_only = c->head.method && !strcmp(c->head.method, "HEAD");
    if (!head_only && len) sbuf_append(&h, body, len);
    int rc = h.oom ? (c->failed = 1, -1) : srv_conn_write(c, h.data, h.len);
    sbuf_free(&h);
    return rc == 0;
}

int srv_respond(srv_conn *c, const srv_server *s, int status, const char *body) {
    (void)s;
    return srv_respond_bytes(c, status, "application/json", body ? body : "", body ? strlen(body) : 0, NULL);
}

int srv_respond_error(srv_conn *c, const srv_server *s, const srv_error *e) {
    char *body = srv_error_body(e);
    srv_log(s, e->http_status >= 500 ? SRV_LOG_ERROR : SRV_LOG_INFO, "%d %s", e->http_status, e->message);
    static const char *const bearer[] = {"WWW-Authenticate", "Bearer", NULL};
    int rc = srv_respond_bytes(c, e->http_status, "application/json", body ? body : "", body ? strlen(body) : 0,
                               e->http_status == 401 ? bearer : NULL);
    free(body);
    return rc;
}

int srv_respond_stream(srv_conn *c, const srv_server *s, const char *content_type,
                       long (*reader)(void *cls, char *buf, size_t max), void *cls, void (*free_cls)(void *)) {
    if (c->answered) {
        free_cls(cls);
        return !c->failed;
    }
    c->answered = 1;
    sbuf h;
    sbuf_init(&h);
    static const char *const no_cache[] = {"Cache-Control", "no-cache", NULL};
    head_of(&h, c, 200, content_type, -1, no_cache);
    int chunked = c->head.minor == 1;
    srv_log(s, SRV_LOG_INFO, "%s %s 200 (stream)", c->head.method, c->head.path);
    int ok = !h.oom && !srv_conn_write(c, h.data, h.len);
    /* 4 KiB pieces: events are small and each should leave as soon as it exists */
    char buf[4096 + 16];
    while (ok) {
        long n = reader(cls, buf + 10, 4096);
        if (n == SRV_STREAM_END) {
            ok = !chunked || !srv_conn_write(c, "0\r\n\r\n", 5);
            break;
        }
        if (n < 0) { /* the stream broke: close without its end, so the client sees it */
            c->failed = 1;
            break;
        }
        if (!n) continue;
        if (!chunked) {
            ok = !srv_conn_write(c, buf + 10, (size_t)n);
            continue;
        }
        /* the chunk's size line goes right before its data, in one write */
        char size[12];
        int k = snprintf(size, sizeof size, "%lx\r\n", (unsigned long)n);
        memcpy(buf + 10 - k, size, (size_t)k);
        memcpy(buf + 10 + n, "\r\n", 2);
        ok = !srv_conn_write(c, buf + 10 - k, (size_t)(k + n + 2));
    }
    sbuf_free(&h);
    if (!ok) srv_log(s, SRV_LOG_DEBUG, "request ended early (the client went away): its generation is cancelled");
    free_cls(cls); /* cancels a generation the client no longer reads */
    return ok;
}

const char *srv_header(const srv_conn *c, const char *name) { return http_field_value(&c->head, name); }

const char *srv_query(srv_conn *c, const char *key) {
    char *out = c->query_space + c->query_used;
    size_t cap = sizeof c->query_space - c->query_used;
    const char *v = http_query_value(c->head.query, key, out, cap);
    if (v) c->query_used += strlen(v) + 1;
    return v;
}
