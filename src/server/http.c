/* http.c: the listening side of `hearth serve`: binding, one thread per connection,
 * reading each request's head (within --header-timeout, at most --max-header bytes)
 * and body (Content-Length or chunked, at most --max-body), keep-alive with pipelined
 * requests answered in order, and the connection slots. Framing is http_parse.c's,
 * routing router.c's, answering respond.c's: this file only moves bytes and time.
 *
 * Slots: at --max-connections, a new connection takes the slot of the connection that
 * has waited longest for a request head (idle keep-alive, or a client sending its
 * head slowly), so slow clients cannot lock out new ones; only connections busy with
 * a request are never closed for room. */
#define _GNU_SOURCE
#include "server/http_conn.h"
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct srv_http {
    int listen_fd;
    int wake[2]; /* a byte here ends the accept loop */
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_cond_t gone; /* a connection ended */
    srv_conn *conns;     /* every open connection */
    unsigned n_conns;
} srv_http;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits until fd is readable or the deadline (0: none) passes. Returns 1 readable, 0
 * timed out, -1 error. */
static int wait_readable(int fd, double deadline) {
    for (;;) {
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - now_s();
            if (left <= 0) return 0;
            ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        return r < 0 ? -1 : r > 0;
    }
}

/* Reads what is available into c->in (growing it up to limit bytes). Returns the
 * bytes read, 0 on end of stream or timeout, -1 when the limit is reached. */
static long read_more(srv_conn *c, double deadline, size_t limit) {
    if (c->in_len >= limit) return -1;
    if (c->in_cap - c->in_len < 4096 && c->in_cap < limit) {
        size_t cap = c->in_cap ? c->in_cap * 2 : 16384;
        if (cap > limit) cap = limit;
        char *p = realloc(c->in, cap + 1);
        if (!p) return 0;
        c->in = p;
        c->in_cap = cap;
    }
    if (wait_readable(c->fd, deadline) <= 0) return 0;
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0 && errno == EINTR) return read_more(c, deadline, limit);
    if (n <= 0) return 0;
    c->in_len += (size_t)n;
    return n;
}

static void set_waiting(srv_conn *c, int waiting) {
    srv_http *h = c->s->http;
    pthread_mutex_lock(&h->mu);
    c->waiting = waiting;
    c->since = now_s();
    pthread_mutex_unlock(&h->mu);
}

/* An error before routing (bad framing, limits): the OpenAI shape, then close. */
static void refuse(srv_conn *c, int status, const char *message) {
    srv_error e = {0};
    srv_fail(&e, status, "invalid_request_error", NULL, status == 431 ? "request_header_too_large" : NULL, "%s",
             message);
    c->keep_alive = 0;
    srv_respond_error(c, c->s, &e);
}

/* Reads the next request head: the idle timeout until its first byte, then
 * --header-timeout for all of it. Returns its length, 0 when the connection ends. */
static size_t read_head(srv_conn *c) {
    const srv_config *cfg = &c->s->cfg;
    double idle = cfg->timeout_s ? now_s() + cfg->timeout_s : 0, head_deadline = 0;
    for (;;) {
        size_t n = http_head_length(c->in, c->in_len);
        if (n) return n;
        if (c->in_len && !head_deadline) head_deadline = now_s() + (cfg->header_timeout_s ? cfg->header_timeout_s : 10);
        long got = read_more(c, head_deadline ? head_deadline : idle, cfg->max_header);
        if (got < 0) {
            refuse(c, 431, "the request line and headers exceed --max-header");
            return 0;
        }
        if (!got) {
            if (head_deadline && c->in_len && !c->failed && now_s() >= head_deadline) {
                srv_log(c->s, SRV_LOG_INFO, "408 the request head did not arrive within %us", cfg->header_timeout_s);
                c->keep_alive = 0;
                srv_respond_bytes(c, 408, NULL, NULL, 0, NULL);
            }
            return 0;
        }
    }
}

/* Reads the body into c->body from c->in (where the head is no longer). Returns 0, or
 * -1 when the connection must close (an answer was sent where there was one to send). */
static int read_body(srv_conn *c) {
    const srv_config *cfg = &c->s->cfg;
    const http_head *h = &c->head;
    /* body bytes pass through c->in 64 KiB at a time */
    const size_t window = 65536;
    if (h->chunked) {
        http_chunked ch = {0};
        for (;;) {
            int done = 0, status = 0;
            const char *error = NULL;
            long used = http_chunked_feed(&ch, c->in, c->in_len, &c->body, cfg->max_body, &done, &status, &error);
            if (used < 0) {
                refuse(c, status, error);
                return -1;
            }
            memmove(c->in, c->in + used, c->in_len - (size_t)used);
            c->in_len -= (size_t)used;
            if (done) return 0;
            if (read_more(c, cfg->timeout_s ? now_s() + cfg->timeout_s : 0, window) <= 0) return -1;
        }
    }
    size_t want = (size_t)h->content_length;
    while (c->in_len < want) {
        sbuf_append(&c->body, c->in, c->in_len);
        want -= c->in_len;
        c->in_len = 0;
        if (c->body.oom || read_more(c, cfg->timeout_s ? now_s() + cfg->timeout_s : 0, window) <= 0) return -1;
    }
    sbuf_append(&c->body, c->in, want);
    memmove(c->in, c->in + want, c->in_len - want);
    c->in_len -= want;
    return c->body.oom ? -1 : 0;
}

/* A request that got as far as its head is counted in /metrics under its route's label
 * and the status it was answered with; returns rc. */
static int counted(srv_conn *c, int rc) {
    char label[48];
    srv_metrics_label(label, sizeof label, c->head.path ? c->head.path : "", c->path_known);
    srv_metrics_request(label, c->status);
    return rc;
}

/* One request: head, gate, body, answer. Returns 0 to read the next one. */
static int serve_one(srv_conn *c) {
    srv_server *s = c->s;
    memset(&c->head, 0, sizeof c->head);
    c->head.query = "";
    c->answered = 0;
    c->status = 0;
    c->keep_alive = 0;
    set_waiting(c, 1);
    size_t n = read_head(c);
    if (!n) return -1;
    set_waiting(c, 0);
    /* the head moves to its own buffer (the fields point into it); c->in keeps what
     * follows: the body, then any pipelined request */
    free(c->head_bytes);
    if (!(c->head_bytes = malloc(n + 1))) return -1;
    memcpy(c->head_bytes, c->in, n);
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    c->route = NULL;
    c->route_tail = NULL;
    c->path_known = 0;
    c->wants_body = 0;
    c->cross_origin_limited = 0;
    c->query_used = 0;
    sbuf_reset(&c->body);
    if (http_parse_head(c->head_bytes, n, &c->head)) {
        refuse(c, c->head.status, c->head.error);
        return counted(c, -1);
    }
    const http_head *h = &c->head;
    srv_log(s, SRV_LOG_DEBUG, "%s %s HTTP/1.%d", h->method, h->path, h->minor);
    int has_body = h->chunked || (h->has_length && h->content_length);
    /* an answer at the door leaves the body unread, so the connection closes after it:
     * that answer must say "Connection: close", or a client reusing the connection
     * loses its next request to the close */
    c->keep_alive = h->keep_alive && !has_body;
    if (srv_route_head(s, c) >= 0) {
        c->keep_alive = h->keep_alive;
        if (c->wants_body && !h->chunked && !h->has_length) {
            refuse(c, 411, "Content-Length header is required");
            return counted(c, -1);
        }
        if (h->has_length && h->content_length > s->cfg.max_body) {
            char msg[96];
            snprintf(msg, sizeof msg, "Request body too large: %llu bytes (the limit is %zu)", h->content_length,
                     s->cfg.max_body);
            refuse(c, 413, msg);
            return counted(c, -1);
        }
        /* curl and others wait for this before sending a large body */
        if (has_body && h->expect_continue && srv_conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25)) return -1;
        if (has_body && read_body(c)) return counted(c, -1);
        srv_route_request(s, c);
    }
    if (!c->answered) refuse(c, 500, "no response was produced");
    return counted(c, c->keep_alive && !c->failed ? 0 : -1);
}

/* Closing with unread request bytes makes the kernel send a reset, which can destroy
 * the error response before the client reads it: the write side closes first, and
 * what the client still sends is read and dropped for up to a second. */
static void linger_close(srv_conn *c) {
    shutdown(c->fd, SHUT_WR);
    char sink[4096];
    double deadline = now_s() + 1;
    while (wait_readable(c->fd, deadline) > 0 && recv(c->fd, sink, sizeof sink, 0) > 0) {
    }
}

static void *conn_main(void *arg) {
    srv_conn *c = arg;
    srv_http *h = c->s->http;
    while (!serve_one(c)) {
    }
    if (c->answered && !c->failed) linger_close(c);
    pthread_mutex_lock(&h->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    h->n_conns--;
    pthread_cond_broadcast(&h->gone);
    pthread_mutex_unlock(&h->mu);
    close(c->fd);
    sbuf_free(&c->body);
    free(c->head_bytes);
    free(c->in);
    free(c);
    return NULL;
}

/* At the connection limit: closes the connection that has waited longest for a
 * request head (its thread sees the end of the stream and exits). Returns 0 when one
 * was found. Called with h->mu held. */
static int make_room(srv_http *h) {
    srv_conn *oldest = NULL;
    for (srv_conn *c = h->conns; c; c = c->next)
        if (c->waiting && (!oldest || c->since < oldest->since)) oldest = c;
    if (!oldest) return -1;
    shutdown(oldest->fd, SHUT_RDWR);
    oldest->waiting = 0; /* not chosen twice */
    return 0;
}

static void admit(srv_server *s, int fd) {
    srv_http *h = s->http;
    pthread_mutex_lock(&h->mu);
    if (h->n_conns >= s->cfg.max_connections && make_room(h)) {
        pthread_mutex_unlock(&h->mu);
        /* every slot is busy answering: say so rather than leave the client hanging */
        static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-type: application/json\r\n"
                                   "Content-Length: 115\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
                                   "{\"error\": {\"message\": \"every connection slot is busy\", "
                                   "\"type\": \"server_error\", \"param\": null, \"code\": null}}";
        ssize_t ignored = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)ignored;
        close(fd);
        srv_log(s, SRV_LOG_WARNING, "503: all %u connections are busy with requests", s->cfg.max_connections);
        return;
    }
    srv_conn *c = calloc(1, sizeof *c);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (c) {
        c->s = s;
        c->fd = fd;
        c->waiting = 1;
        c->since = now_s();
        sbuf_init(&c->body);
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        h->n_conns++;
        if (pthread_create(&t, &attr, conn_main, c)) {
            h->conns = c->next;
            if (c->next) c->next->prev = NULL;
            h->n_conns--;
            free(c);
            c = NULL;
        }
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&h->mu);
    if (!c) close(fd);
}

static void *accept_main(void *arg) {
    srv_server *s = arg;
    srv_http *h = s->http;
    for (;;) {
        struct pollfd p[2] = {{.fd = h->listen_fd, .events = POLLIN}, {.fd = h->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        if (!(p[0].revents & POLLIN)) continue;
        int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) usleep(100000); /* out of descriptors: let some close */
            continue;
        }
        admit(s, fd);
    }
    return NULL;
}

static int bind_listener(const srv_config *cfg, hearth_error *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) {
        snprintf(err->message, sizeof err->message, "--host %s: %s", cfg->host, gai_strerror(gai));
        err->status = HEARTH_ERR_INVALID;
        return -1;
    }
    /* like upstream: the first address */
    /* non-blocking: a connection reset between poll and accept must not stall the loop */
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
        if (fd >= 0) close(fd);
        fd = -1;
        snprintf(err->message, sizeof err->message, "could not listen on %s port %d (in use, or not permitted)",
                 cfg->host, cfg->port);
        err->status = HEARTH_ERR_IO;
    }
    freeaddrinfo(ai);
    return fd;
}

hearth_status srv_start(srv_server *s, hearth_error *err) {
    srv_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err->message, sizeof err->message, "out of memory");
        return err->status = HEARTH_ERR_NOMEM;
    }
    h->listen_fd = bind_listener(&s->cfg, err);
    if (h->listen_fd < 0) {
        free(h);
        return err->status;
    }
    if (pipe(h->wake)) {
        close(h->listen_fd);
        free(h);
        snprintf(err->message, sizeof err->message, "pipe: %s", strerror(errno));
        return err->status = HEARTH_ERR_IO;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->gone, NULL);
    s->http = h;
    if (pthread_create(&h->acceptor, NULL, accept_main, s)) {
        srv_stop(s);
        snprintf(err->message, sizeof err->message, "could not start the listener thread");
        return err->status = HEARTH_ERR_IO;
    }
    return HEARTH_OK;
}

void srv_stop(srv_server *s) {
    srv_http *h = s->http;
    if (!h) return;
    if (h->acceptor) {
        ssize_t ignored = write(h->wake[1], "x", 1);
        (void)ignored;
        pthread_join(h->acceptor, NULL);
    }
    close(h->listen_fd);
    pthread_mutex_lock(&h->mu);
    /* connections see the end of their streams; a stream ends at its next write, a
     * non-streaming generation when it is done */
    for (srv_conn *c = h->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
    while (h->n_conns) pthread_cond_wait(&h->gone, &h->mu);
    pthread_mutex_unlock(&h->mu);
    close(h->wake[0]);
    close(h->wake[1]);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->gone);
    free(h);
    s->http = NULL;
}
