/* http_conn.h: one request on its connection, as http.c reads it and respond.c and
 * router.c answer it. Private to those three files: endpoints see srv_conn only
 * through the functions of server.h. */
#ifndef HEARTH_SERVER_HTTP_CONN_H
#define HEARTH_SERVER_HTTP_CONN_H
#include "server/http_parse.h"
#include "server/server.h"

struct srv_route;

struct srv_conn {
    srv_server *s;
    int fd;
    http_head head;                /* of the request being answered; points into in */
    sbuf body;                     /* its body, decoded */
    int keep_alive;                /* the connection may carry another request after this response */
    int answered;                  /* a response was sent (or sending it failed) */
    int status;                    /* the status it was answered with (0: none yet), for /metrics */
    int failed;                    /* the connection broke or must close: no further request */
    const struct srv_route *route; /* router.c's match; NULL before routing */
    const char *route_tail;        /* the path after a prefix route's prefix */
    int path_known;                /* some route has this path (a 405 too): /metrics labels it by path */
    int wants_body;                /* the route reads a body: 411 without a length */
    int cross_origin_limited;      /* the route changes state: only listed origins get CORS */
    char query_space[4096];        /* decoded query values handed out by srv_query */
    size_t query_used;
    /* http.c's bookkeeping */
    char *head_bytes; /* the request head that head points into */
    char *in;         /* bytes read and not yet consumed (the head, then pipelined requests) */
    size_t in_len, in_cap;
    int waiting;  /* between requests or inside a head: may be closed to make room */
    double since; /* when it started waiting */
    struct srv_conn *prev, *next;
};

/* respond.c: writes all of buf, waiting at most the idle timeout for the socket.
 * Returns 0, or -1 (c->failed is set). */
int srv_conn_write(srv_conn *c, const char *buf, size_t len);

#endif
