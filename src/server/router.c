/* router.c: the route table of `hearth serve` and everything it drives: which handler
 * answers a method and path, 404 / 405 (with Allow), the API key, the refusal of
 * generating routes by an embedding-only server, the cross-origin rule for routes
 * that change state, the CORS preflight and the /v1 index. A new endpoint is one row
 * here; the handlers live in their dialect's file. */
#include "server/adapters.h"
#include "server/anthropic.h"
#include "server/embeddings.h"
#include "server/http_conn.h"
#include "server/responses.h"
#include "server/web_assets.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    R_ENGINE = 1 << 0,    /* needs the generating engine: refused by an embedding-only server */
    R_PUBLIC = 1 << 1,    /* answered without the API key */
    R_STATE = 1 << 2,     /* changes state on this machine: cross-origin only from listed origins */
    R_ANTHROPIC = 1 << 3, /* errors in Anthropic's shape */
    R_BODY = 1 << 4,      /* reads a request body */
    R_PREFIX = 1 << 5,    /* path is a prefix; the rest is the handler's argument */
    R_PAGE = 1 << 6,      /* the chat page's paths (web_assets.c) */
    R_ANY_PATH = 1 << 7,  /* every path (the CORS preflight) */
};

typedef struct srv_route {
    const char *method; /* GET also answers HEAD */
    const char *path;
    unsigned flags;
    int (*handle)(srv_server *s, srv_conn *c);
    const char *index_path;  /* as the /v1 index shows it (NULL: path) */
    const char *description; /* the /v1 index's line */
} srv_route;

static int body_handler(srv_server *s, srv_conn *c, int (*f)(srv_server *, srv_conn *, const char *, size_t)) {
    return f(s, c, c->body.data ? c->body.data : "", c->body.len);
}

static int chat(srv_server *s, srv_conn *c) {
    return srv_handle_completion(s, c, SRV_CHAT, c->body.data ? c->body.data : "", c->body.len);
}
static int text(srv_server *s, srv_conn *c) {
    return srv_handle_completion(s, c, SRV_TEXT, c->body.data ? c->body.data : "", c->body.len);
}
static int messages(srv_server *s, srv_conn *c) { return body_handler(s, c, anth_handle_messages); }
static int count_tokens(srv_server *s, srv_conn *c) { return body_handler(s, c, anth_handle_count_tokens); }
static int responses(srv_server *s, srv_conn *c) { return body_handler(s, c, resp_handle_create); }
static int response_get(srv_server *s, srv_conn *c) { return resp_handle_id(s, c, c->route_tail, 0); }
static int response_delete(srv_server *s, srv_conn *c) { return resp_handle_id(s, c, c->route_tail, 1); }
static int embeddings(srv_server *s, srv_conn *c) { return body_handler(s, c, srv_handle_embeddings); }
static int lab_signal(srv_server *s, srv_conn *c) { return body_handler(s, c, srv_lab_signal); }
static int lab_generate(srv_server *s, srv_conn *c) { return body_handler(s, c, srv_lab_generate); }
static int download(srv_server *s, srv_conn *c) { return body_handler(s, c, srv_library_post); }
static int library(srv_server *s, srv_conn *c) { return srv_library_get(s, c, c->head.path); }
static int page(srv_server *s, srv_conn *c) { return srv_web_respond(c, c->head.path); }
static int metrics(srv_server *s, srv_conn *c) { return srv_metrics_respond(s, c); }
static int memory_tools(srv_server *s, srv_conn *c) { return srv_memory_tools(s, c); }
static int memory_call(srv_server *s, srv_conn *c) {
    return srv_memory_call(s, c, c->route_tail, c->body.data ? c->body.data : "", c->body.len);
}
static int memory_synthesize(srv_server *s, srv_conn *c) { return srv_memory_synthesize(s, c); }
static int memory_changes(srv_server *s, srv_conn *c) { return srv_memory_changes(s, c); }
static int train_runs(srv_server *s, srv_conn *c) { return srv_train_runs(s, c); }
static int train_run(srv_server *s, srv_conn *c) { return srv_train_run(s, c, c->route_tail); }
static int health(srv_server *s, srv_conn *c) { return srv_respond(c, s, 200, "{\"status\": \"ok\"}"); }
static int preflight(srv_server *s, srv_conn *c) { return srv_respond_bytes(c, 204, "application/json", "", 0, NULL); }

static int respond_owned(srv_server *s, srv_conn *c, char *body) {
    int rc = srv_respond(c, s, 200, body ? body : "{}");
    free(body);
    return rc;
}
static int adapters_get(srv_server *s, srv_conn *c) { return srv_adapters_get(s, c); }
static int adapters_post(srv_server *s, srv_conn *c) { return body_handler(s, c, srv_adapters_post); }
static int adapters_delete(srv_server *s, srv_conn *c) { return srv_adapters_delete(s, c, c->route_tail); }
static int adapters_available(srv_server *s, srv_conn *c) { return srv_adapters_available(s, c); }
static int models(srv_server *s, srv_conn *c) { return respond_owned(s, c, srv_models_body(s, c->route_tail)); }
static int stats(srv_server *s, srv_conn *c) { return respond_owned(s, c, srv_stats_body(s)); }
/* an embedding-only server has no engine numbers to add */
static int index_page(srv_server *s, srv_conn *c) {
    return respond_owned(s, c, s->queue ? srv_index_stats_body(s) : srv_index_body());
}

#define GEN (R_ENGINE | R_BODY)
static const srv_route routes[] = {
    {"POST", "/v1/chat/completions", GEN, chat, NULL, "chat completions (OpenAI), streaming with \"stream\": true"},
    {"POST", "/chat/completions", GEN, chat, NULL, "alias of /v1/chat/completions"},
    {"POST", "/v1/completions", GEN, text, NULL, "text completions (OpenAI legacy)"},
    {"POST", "/v1/messages", GEN | R_ANTHROPIC, messages, NULL, "Anthropic Messages, streaming with \"stream\": true"},
    {"POST", "/v1/messages/count_tokens", GEN | R_ANTHROPIC, count_tokens, NULL,
     "Anthropic token count of a Messages request"},
    {"POST", "/v1/responses", GEN, responses, NULL, "OpenAI Responses, streaming with \"stream\": true"},
    {"GET", "/v1/responses/", R_ENGINE | R_PREFIX, response_get, "/v1/responses/{id}", "a stored response"},
    {"DELETE", "/v1/responses/", R_ENGINE | R_PREFIX | R_STATE, response_delete, "/v1/responses/{id}",
     "deletes a stored response"},
    {"POST", "/v1/embeddings", R_BODY, embeddings, NULL,
     "embeddings (OpenAI) of an embedding model (hearth serve <it>, or --embedding-model)"},
    {"POST", "/embeddings", R_BODY, embeddings, NULL, "alias of /v1/embeddings"},
    {"GET", "/v1/models", 0, models, NULL, "the model being served (and its mounted adapters)"},
    {"GET", "/v1/adapters", R_ENGINE, adapters_get, NULL, "the mounted LoRA adapters"},
    {"POST", "/v1/adapters", R_ENGINE | R_BODY | R_STATE, adapters_post, NULL,
     "{\"id\", \"path\"} mounts a LoRA adapter folder (MLX or PEFT)"},
    {"GET", "/v1/adapters/available", R_ENGINE, adapters_available, NULL,
     "adapter folders on disk the served model could mount"},
    {"DELETE", "/v1/adapters/", R_ENGINE | R_PREFIX | R_STATE, adapters_delete, "/v1/adapters/{id}",
     "unmounts an adapter (requests using it finish with it)"},
    {"GET", "/v1/models/", R_PREFIX, models, "/v1/models/{id}", "the model list filtered by id"},
    {"GET", "/v1/memory/tools", 0, memory_tools, NULL,
     "the memory vault's read-only tools as chat function tools (serve --memory)"},
    {"POST", "/v1/memory/tools/", R_BODY | R_PREFIX, memory_call, "/v1/memory/tools/{name}",
     "runs one memory tool; the body is its arguments, the reply its result"},
    {"GET", "/v1/memory/synthesize", R_ENGINE | R_STATE, memory_synthesize, NULL,
     "a synthesis run by the served model, as server-sent progress (?dry=1: the plan only, ?since=YYYY-MM-DD)"},
    {"GET", "/v1/memory/changes", 0, memory_changes, NULL,
     "what the last synthesis runs changed in the vault (?limit=N commits), per file added and removed lines"},
    {"GET", "/v1/train/runs", 0, train_runs, NULL,
     "hearth train runs under serve --train-dir, newest first, with their latest numbers"},
    {"GET", "/v1/train/runs/", R_PREFIX, train_run, "/v1/train/runs/{id}",
     "a training run's metrics.jsonl records (?from=N: from the N-th on)"},
    {"GET", "/health", R_PUBLIC, health, NULL, "liveness: {\"status\": \"ok\"}"},
    {"GET", "/library", 0, library, NULL,
     "every model hearth can find: size, parameters, quantization, fit (hearth ls --json)"},
    {"GET", "/fit", 0, library, NULL, "?model=&ctx=&batch=: the memory prediction of hearth fit --json"},
    {"GET", "/downloads", 0, library, NULL, "hub downloads of this process"},
    {"POST", "/downloads", R_BODY | R_STATE, download, NULL, "{\"model\": \"org/name\"} starts a hub download"},
    {"GET", "/stats", R_ENGINE, stats, NULL,
     "live engine numbers: rows, queue, KV blocks, prefix cache, tokens/s, memory"},
    {"GET", "/v1/stats", R_ENGINE, stats, NULL, "alias of /stats"},
    {"GET", "/metrics", 0, metrics, NULL,
     "Prometheus text format: requests, tokens, latency histograms, queue, KV blocks, memory"},
    {"GET", "/v1", 0, index_page, NULL, "this index"},
    {"GET", "/v1/", 0, index_page, NULL, "alias of /v1"},
    {"GET", "/", R_PUBLIC | R_PAGE, page, "/, /chat, /curves, /train",
     "the chat page (index.html, app.js, style.css), the sampling lab's curve designer (curves.*) and the "
     "training view (train.*)"},
    {"POST", "/signal", GEN, lab_signal, NULL, "{\"prompt\"}: the next-token log-probability histogram (80 bins)"},
    {"POST", "/generate", GEN, lab_generate, NULL,
     "{\"prompt\", \"curve\", \"n\"}: n samples under a drawn curve, as one batch"},
    {"OPTIONS", "*", R_PUBLIC | R_ANY_PATH, preflight, NULL, "CORS preflight"},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

static int path_matches(const srv_route *r, const char *path, const char **tail) {
    srv_web_asset_view v;
    *tail = NULL;
    if (r->flags & R_ANY_PATH) return 1;
    if (r->flags & R_PAGE) return srv_web_find(path, &v) != NULL;
    if (r->flags & R_PREFIX) {
        size_t n = strlen(r->path);
        if (strncmp(path, r->path, n)) return 0;
        *tail = path + n;
        return 1;
    }
    return !strcmp(path, r->path);
}

static int method_matches(const srv_route *r, const char *method) {
    return !strcmp(r->method, method) || (!strcmp(r->method, "GET") && !strcmp(method, "HEAD"));
}

/* Compares without an early exit so the key cannot be guessed byte by byte from
 * timing. */
static int key_equal(const char *given, const char *key) {
    size_t a = strlen(given), b = strlen(key);
    unsigned char diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(given[i < a ? i : 0] ^ key[i]);
    return !diff;
}

/* The key may come as OpenAI's `Authorization: Bearer` or Anthropic's `x-api-key`. */
static int authorized(const srv_server *s, const srv_conn *c) {
    if (!s->cfg.api_key) return 1;
    const char *x = srv_header(c, "x-api-key");
    if (x && key_equal(x, s->cfg.api_key)) return 1;
    const char *h = srv_header(c, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, s->cfg.api_key);
}

/* The chat page served by this very server: Origin is http://<Host>, and Host names
 * this machine (a page elsewhere that rebinds its DNS name to 127.0.0.1 has its own
 * name in Host, so it does not pass). */
static int same_origin(const srv_server *s, const srv_conn *c, const char *origin) {
    const char *host = srv_header(c, "Host");
    if (!host || strncmp(origin, "http://", 7) || strcmp(origin + 7, host)) return 0;
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]"};
    size_t n = strcspn(host, host[0] == '[' ? "]" : ":") + (host[0] == '[');
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        if (strlen(local[i]) == n && !strncmp(host, local[i], n)) return 1;
    return strlen(s->cfg.host) == n && !strncmp(host, s->cfg.host, n);
}

static int origin_listed(const srv_server *s, const char *origin) {
    for (size_t i = 0; i < s->cfg.n_origins; i++)
        if (!strcmp(s->cfg.origins[i], origin)) return 1;
    return 0;
}

static int fail(srv_server *s, srv_conn *c, int anthropic, int status, const char *type, const char *code,
                const char *message, const char *arg) {
    srv_error e = {0};
    srv_fail(&e, status, type, NULL, code, message, arg);
    e.anthropic = anthropic;
    srv_respond_error(c, s, &e);
    return -1;
}

/* Whether a route that changes state matches path (for the preflight's headers). */
static int path_changes_state(const char *path) {
    const char *tail;
    for (size_t i = 0; i < N_ROUTES; i++)
        if ((routes[i].flags & R_STATE) && path_matches(&routes[i], path, &tail)) return 1;
    return 0;
}

int srv_route_head(srv_server *s, srv_conn *c) {
    const char *path = c->head.path, *method = c->head.method, *tail = NULL;
    int path_known = 0, anthropic = 0;
    char allow[64] = "";
    for (size_t i = 0; i < N_ROUTES && !c->route; i++) {
        const srv_route *r = &routes[i];
        if (!path_matches(r, path, &tail) || (r->flags & R_ANY_PATH && strcmp(method, r->method))) continue;
        anthropic |= (r->flags & R_ANTHROPIC) != 0;
        if (method_matches(r, method)) {
            c->route = r;
            c->route_tail = tail;
        } else if (!(r->flags & R_ANY_PATH)) {
            path_known = 1;
            if (!strstr(allow, r->method) && strlen(allow) + strlen(r->method) + 3 < sizeof allow)
                strcat(strcat(allow, allow[0] ? ", " : ""), r->method);
        }
    }
    const srv_route *r = c->route;
    c->path_known = (r && !(r->flags & R_ANY_PATH)) || path_known; /* a preflight of any path: "other" */
    c->cross_origin_limited = r && (r->flags & R_ANY_PATH) ? path_changes_state(path) : r && (r->flags & R_STATE);
    if (!r && !path_known)
        return fail(s, c, anthropic, 404, "invalid_request_error", "not_found", "Not Found: %s", path);
    if (!r) {
        srv_error e = {0};
        srv_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "Method %s is not allowed here", method);
        e.anthropic = anthropic;
        const char *extra[] = {"Allow", allow, NULL};
        char *body = srv_error_body(&e);
        srv_log(s, SRV_LOG_INFO, "405 %s", e.message);
        srv_respond_bytes(c, 405, "application/json", body ? body : "", body ? strlen(body) : 0, extra);
        free(body);
        return -1;
    }
    if (!(r->flags & R_PUBLIC) && !authorized(s, c))
        return fail(s, c, anthropic, 401, "authentication_error", "invalid_api_key", "%s",
                    "Invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
    const char *origin = srv_header(c, "Origin");
    /* a browser sends some cross-origin requests without asking first (a form's POST):
     * refusing it here, before it runs, is what protects the machine */
    if ((r->flags & R_STATE) && origin && !origin_listed(s, origin) && !same_origin(s, c, origin))
        return fail(s, c, anthropic, 403, "permission_error", "origin_not_allowed",
                    "cross-origin request from %.200s refused: this endpoint changes state on the machine; "
                    "start hearth serve with --allowed-origins naming that origin to allow it",
                    origin);
    if ((r->flags & R_ENGINE) && !s->queue)
        return fail(s, c, anthropic, 400, "invalid_request_error", "model_cannot_generate",
                    "model %s is an embedding model and cannot generate text; use POST /v1/embeddings",
                    hearth_model_path(s->model));
    c->wants_body = (r->flags & R_BODY) != 0;
    return 0;
}

void srv_route_request(srv_server *s, srv_conn *c) { c->route->handle(s, c); }

char *srv_index_body(void) {
    json_t *data = json_array();
    for (size_t i = 0; i < N_ROUTES; i++) {
        const srv_route *r = &routes[i];
        json_array_append_new(data, json_pack("{s:s,s:s,s:s}", "method", r->method, "path",
                                              r->index_path ? r->index_path : r->path, "description", r->description));
    }
    json_t *o = json_pack("{s:s,s:o}", "object", "list", "data", data);
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}
