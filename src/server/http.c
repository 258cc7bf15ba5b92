/* http.c: the libmicrohttpd side of `hearth serve`: binding, one thread per
 * connection (keep-alive, header/idle/connection limits), routing by method and
 * path, CORS, the API key, the body gate (Content-Length required, size limit)
 * and the logging. Knows no request fields: completions go to routes.c,
 * Anthropic messages to anthropic.c. */
#define _GNU_SOURCE
#include "server/anthropic.h"
#include "server/embeddings.h"
#include "server/responses.h"
#include "server/web_assets.h"
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum route {
    ROUTE_NONE, /* unknown path: 404 */
    ROUTE_CHAT,
    ROUTE_TEXT,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_INDEX,
    ROUTE_MESSAGES,     /* Anthropic: its errors take Anthropic's shape */
    ROUTE_COUNT_TOKENS, /* Anthropic */
    ROUTE_RESPONSES,    /* OpenAI Responses: POST /v1/responses */
    ROUTE_RESPONSE_ID,  /* GET/DELETE /v1/responses/{id} (the id in *model_filter) */
    ROUTE_STATS,        /* GET /stats: the engine's live numbers (stats.c) */
    ROUTE_LIBRARY,      /* GET /library, /fit, /downloads; POST /downloads (library_routes.c) */
    ROUTE_EMBEDDINGS,   /* OpenAI Embeddings: POST /v1/embeddings (embeddings.c) */
    ROUTE_METRICS,      /* GET /metrics: Prometheus text format (metrics.c) */
} route;

/* One HTTP request on a connection (MHD's per-request context). */
typedef struct conn_ctx {
    route route;
    int body_phase; /* the headers passed the gate; body bytes are arriving */
    sbuf body;
    char origin[512];
    char endpoint[40]; /* its label in /metrics */
} conn_ctx;

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

void srv_add_headers(void *response, const srv_server *s, const char *content_type, const char *origin) {
    struct MHD_Response *r = response;
    if (content_type) MHD_add_response_header(r, "Content-type", content_type);
    if (s->cfg.origins_any) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    } else if (origin && origin[0]) {
        for (size_t i = 0; i < s->cfg.n_origins; i++)
            if (!strcmp(s->cfg.origins[i], origin)) {
                MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
                MHD_add_response_header(r, "Vary", "Origin");
                break;
            }
    }
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "*");
}

static int respond_with(struct MHD_Connection *c, const srv_server *s, int status, const char *body, const char *origin,
                        const char *extra_name, const char *extra_value) {
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    srv_add_headers(r, s, "application/json", origin);
    if (extra_name) MHD_add_response_header(r, extra_name, extra_value);
    int rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

int srv_respond(struct MHD_Connection *c, const srv_server *s, int status, const char *body, const char *origin) {
    return respond_with(c, s, status, body, origin, NULL, NULL);
}

int srv_respond_error(struct MHD_Connection *c, const srv_server *s, const srv_error *e, const char *origin) {
    char *body = srv_error_body(e);
    srv_log(s, e->http_status >= 500 ? SRV_LOG_ERROR : SRV_LOG_INFO, "%d %s", e->http_status, e->message);
    int rc = e->http_status == 401 ? respond_with(c, s, 401, body, origin, "WWW-Authenticate", "Bearer")
                                   : respond_with(c, s, e->http_status, body, origin, NULL, NULL);
    free(body);
    return rc;
}

static route route_of(const char *url, const char **model_filter) {
    *model_filter = NULL;
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions")) return ROUTE_TEXT;
    if (!strcmp(url, "/v1/messages")) return ROUTE_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return ROUTE_COUNT_TOKENS;
    if (!strcmp(url, "/v1/responses")) return ROUTE_RESPONSES;
    if (!strcmp(url, "/v1/embeddings") || !strcmp(url, "/embeddings")) return ROUTE_EMBEDDINGS;
    if (!strncmp(url, "/v1/responses/", 14) && url[14]) {
        *model_filter = url + 14;
        return ROUTE_RESPONSE_ID;
    }
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) {
        *model_filter = url + 11;
        return ROUTE_MODELS;
    }
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/stats") || !strcmp(url, "/v1/stats")) return ROUTE_STATS;
    if (!strcmp(url, "/library") || !strcmp(url, "/fit") || !strcmp(url, "/downloads")) return ROUTE_LIBRARY;
    if (!strcmp(url, "/v1") || !strcmp(url, "/v1/")) return ROUTE_INDEX;
    return ROUTE_NONE;
}

/* Compares without an early exit so the key cannot be guessed byte by byte from
 * timing. */
static int key_equal(const char *given, const char *key) {
    size_t a = strlen(given), b = strlen(key);
    unsigned char diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(given[i < a ? i : 0] ^ key[i]);
    return !diff;
}

/* The key may come as OpenAI's `Authorization: Bearer` or Anthropic's
 * `x-api-key`. */
static int authorized(const srv_server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && key_equal(x, s->cfg.api_key)) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, s->cfg.api_key);
}

static int is_anthropic(route r) { return r == ROUTE_MESSAGES || r == ROUTE_COUNT_TOKENS; }

static int fail(struct MHD_Connection *c, const srv_server *s, const conn_ctx *cc, int status, const char *type,
                const char *code, const char *fmt, const char *arg) {
    srv_error e = {0};
    srv_fail(&e, status, type, NULL, code, fmt, arg);
    e.anthropic = is_anthropic(cc->route);
    return srv_respond_error(c, s, &e, cc->origin);
}

/* Everything that can be answered from the request line and headers alone.
 * Returns -1 when the request goes on to read a body. */
static int answer_headers(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method) {
    const char *filter, *o = cc->origin;
    cc->route = route_of(url, &filter);
    int is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!strcmp(method, "OPTIONS")) return srv_respond(c, s, 204, NULL, o);
    if (cc->route == ROUTE_NONE && is_get) {
        /* the chat page: public, so a browser can load it and then ask for the key */
        int rc = srv_web_respond(c, url);
        if (rc >= 0) return rc;
    }
    if (cc->route == ROUTE_NONE) return fail(c, s, cc, 404, "invalid_request_error", "not_found", "Not Found: %s", url);
    if (cc->route == ROUTE_HEALTH && is_get) return srv_respond(c, s, 200, "{\"status\": \"ok\"}", o);
    int wants_post = cc->route == ROUTE_CHAT || cc->route == ROUTE_TEXT || is_anthropic(cc->route) ||
                     cc->route == ROUTE_RESPONSES || cc->route == ROUTE_EMBEDDINGS;
    if (cc->route == ROUTE_LIBRARY && is_post && !strcmp(url, "/downloads")) wants_post = 1;
    int is_delete = !strcmp(method, "DELETE");
    if (cc->route == ROUTE_RESPONSE_ID ? !is_get && !is_delete : wants_post ? !is_post : !is_get)
        return fail(c, s, cc, 405, "invalid_request_error", "method_not_allowed", "Method %s is not allowed here",
                    method);
    if (!authorized(s, c))
        return fail(c, s, cc, 401, "authentication_error", "invalid_api_key", "%s",
                    "Invalid or missing API key: send 'Authorization: Bearer "
                    "<key>' or 'x-api-key: <key>'");
    /* a server of an embedding-only model has no engine: everything that generates or
     * reports on generation is refused up front */
    if (!s->queue && (wants_post || cc->route == ROUTE_RESPONSE_ID || cc->route == ROUTE_STATS) &&
        cc->route != ROUTE_EMBEDDINGS && cc->route != ROUTE_LIBRARY)
        return fail(c, s, cc, 400, "invalid_request_error", "model_cannot_generate",
                    "model %s is an embedding model and cannot generate text; use POST /v1/embeddings",
                    hearth_model_path(s->model));
    if (cc->route == ROUTE_METRICS) return srv_metrics_respond(s, c, o);
    if (cc->route == ROUTE_RESPONSE_ID) return resp_handle_id(s, c, filter, is_delete, o);
    if (cc->route == ROUTE_LIBRARY && is_get) return srv_library_get(s, c, url, o);
    if (cc->route == ROUTE_MODELS || cc->route == ROUTE_INDEX) {
        char *body = cc->route == ROUTE_MODELS ? srv_models_body(s, filter)
                     : s->queue                ? srv_index_stats_body(s)
                                               : srv_index_body(); /* embedding-only: no engine stats */
        int rc = srv_respond(c, s, 200, body, o);
        free(body);
        return rc;
    }
    if (cc->route == ROUTE_STATS) {
        char *body = srv_stats_body(s);
        int rc = srv_respond(c, s, 200, body, o);
        free(body);
        return rc;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (!cl) return fail(c, s, cc, 411, "invalid_request_error", NULL, "%s", "Content-Length header is required");
    char *end;
    unsigned long long n = strtoull(cl, &end, 10);
    if (end == cl || *end || cl[0] == '-')
        return fail(c, s, cc, 400, "invalid_request_error", NULL, "%s", "Invalid Content-Length header");
    if (n > s->cfg.max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "%llu bytes (the limit is %zu)", n, s->cfg.max_body);
        return fail(c, s, cc, 413, "invalid_request_error", "request_too_large", "Request body too large: %s", msg);
    }
    return -1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    srv_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        sbuf_init(&cc->body);
        *con_cls = cc;
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        snprintf(cc->origin, sizeof cc->origin, "%s", origin ? origin : "");
        srv_log(s, SRV_LOG_DEBUG, "%s %s %s", method, url, version);
        int rc = answer_headers(s, c, cc, url, method);
        srv_metrics_label(cc->endpoint, sizeof cc->endpoint, url, cc->route != ROUTE_NONE);
        if (rc >= 0) return rc ? MHD_YES : MHD_NO;
        cc->body_phase = 1;
        return MHD_YES; /* wait for the body */
    }
    if (*upload_size) {
        /* MHD enforces Content-Length, which the gate already held to max_body */
        sbuf_append(&cc->body, upload_data, *upload_size);
        *upload_size = 0;
        return cc->body.oom ? MHD_NO : MHD_YES;
    }
    const char *body = cc->body.data ? cc->body.data : "";
    int rc;
    if (cc->route == ROUTE_MESSAGES)
        rc = anth_handle_messages(s, c, body, cc->body.len, cc->origin);
    else if (cc->route == ROUTE_RESPONSES)
        rc = resp_handle_create(s, c, body, cc->body.len, cc->origin);
    else if (cc->route == ROUTE_COUNT_TOKENS)
        rc = anth_handle_count_tokens(s, c, body, cc->body.len, cc->origin);
    else if (cc->route == ROUTE_LIBRARY)
        rc = srv_library_post(s, c, body, cc->body.len, cc->origin);
    else if (cc->route == ROUTE_EMBEDDINGS)
        rc = srv_handle_embeddings(s, c, body, cc->body.len, cc->origin);
    else
        rc = srv_handle_completion(s, c, cc->route == ROUTE_CHAT ? SRV_CHAT : SRV_TEXT, body, cc->body.len, cc->origin);
    return rc ? MHD_YES : MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn_ctx *cc = *con_cls;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        srv_log(cls, SRV_LOG_DEBUG, "request ended early (code %d): its generation is cancelled", (int)toe);
    if (!cc) return;
    srv_metrics_request(cc->endpoint, c);
    sbuf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

hearth_status srv_start(srv_server *s, hearth_error *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int gai = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (gai) {
        snprintf(err->message, sizeof err->message, "--host %s: %s", s->cfg.host, gai_strerror(gai));
        return err->status = HEARTH_ERR_INVALID;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6; /* like upstream: the first address's family */
    s->daemon = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg.max_header,
                                 MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                 s->cfg.max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err->message, sizeof err->message, "could not listen on %s port %d (in use, or not permitted)",
                 s->cfg.host, s->cfg.port);
        return err->status = HEARTH_ERR_IO;
    }
    return HEARTH_OK;
}

void srv_stop(srv_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
