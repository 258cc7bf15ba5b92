/* server.h: how the parts of `hearth serve` meet: the server config, a
 * validated request, the engine queue with its per-request event channel, the
 * Python-compatible JSON writer and the OpenAI response shapes. Consumers of
 * include/hearth.h only: nothing here touches tensors or engine internals. */
#ifndef HEARTH_SERVER_SERVER_H
#define HEARTH_SERVER_SERVER_H
#include "base/sbuf.h"
#include "hearth.h"
#include "server/textstate.h"
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

/* ---- errors: an OpenAI error object with its HTTP status ---------------- */

typedef struct srv_error {
    int http_status;  /* 400, 401, 404, ... */
    const char *type; /* "invalid_request_error", "authentication_error", ... */
    const char *code; /* NULL or a short code ("model_not_found") */
    char param[64];   /* the offending request field, "" if none */
    char message[512];
    int anthropic; /* written in Anthropic's shape (anthropic.h) */
} srv_error;

/* Fills e and returns -1, so parsers can `return srv_fail(...)`. */
__attribute__((format(printf, 6, 7))) int srv_fail(srv_error *e, int http_status, const char *type, const char *param,
                                                   const char *code, const char *fmt, ...);
/* {"error": {"message", "type", "param", "code"}} in Python json.dumps form
 * (or the Anthropic shape when e->anthropic); caller frees. */
char *srv_error_body(const srv_error *e);

/* ---- JSON output exactly like Python's json.dumps defaults -------------- */

/* Appends v with separators ", " and ": ", non-ASCII as \uXXXX, floats as
 * Python's repr (shortest round-trip), keys in insertion order. */
void srv_json_write(sbuf *out, const json_t *v);
char *srv_json_dumps(const json_t *v); /* malloc'd, NULL on allocation failure */

/* ---- requests ----------------------------------------------------------- */

typedef enum srv_kind { SRV_CHAT, SRV_TEXT } srv_kind;

/* Request-field defaults that come from command-line flags (mlx_lm.server's
 * names). */
typedef struct srv_defaults {
    int max_tokens;
    float temperature, top_p, min_p;
    int top_k;
    int num_draft_tokens;
    const json_t *chat_template_args; /* object or NULL */
    hearth_hlg hlg;                   /* --hlg-sampling and its --hlg-* shape */
} srv_defaults;

/* A request body after validation; every field has its default filled in. */
typedef struct srv_request {
    srv_kind kind;
    char *model; /* echoed back verbatim; "default_model" when absent */
    char *adapter;  /* "adapter": "id", "a+b" or "none"; NULL when absent */
    char *adapters; /* mlx_lm.server's "adapters" (an adapter path); NULL when absent */
    int max_tokens;
    int num_draft_tokens; /* with --draft-model: tokens it proposes per step */
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int repetition_context_size, presence_context_size, frequency_context_size;
    float xtc_probability, xtc_threshold;
    hearth_hlg hlg; /* the sampling lab (lab_request.c) */
    hearth_curve curve;
    int32_t *bias_ids;
    float *bias_values;
    size_t n_bias;
    int logprobs;     /* bool */
    int top_logprobs; /* -1: off */
    int has_seed;
    uint64_t seed;
    char **stop;
    size_t n_stop;
    int stream, include_usage;
    json_t *template_kwargs; /* --chat-template-args merged with
                                chat_template_kwargs */
    json_t *messages;        /* chat: content flattened to strings, tool arguments parsed */
    json_t *tools;           /* chat: NULL when absent or empty */
    char *prompt;            /* text completions */
    /* response_format / grammar / regex / json_schema: the output constraint */
    hearth_constraint_kind constraint;
    char *constraint_text; /* NUL-terminated; NULL for json_object */
    /* tool_choice that forces a call (tool_choice.h): "required" / a named function
     * (OpenAI), "any" / "tool" (Anthropic); the output is then one or more calls */
    int force_tool;
    char *forced_tool; /* the named tool; NULL: any of tools */
    /* parallel_tool_calls false (OpenAI) / disable_parallel_tool_use (Anthropic): a forced
     * call is exactly one; with "auto", calls after the model's first are dropped */
    int single_tool_call;
} srv_request;

/* The output constraint of a request body (OpenAI response_format json_schema /
 * json_object, llama-server's grammar / regex / json_schema fields), compiled once to
 * check it: 0, or -1 with a 400 naming the field and the problem. format: the Responses
 * API's text.format object (NULL elsewhere). */
int srv_parse_constraint(const json_t *root, const json_t *format, srv_request *r, srv_error *e);

/* Parses and validates a body. Returns 0, or -1 with e filled (the request is
 * freed). */
int srv_request_parse(const char *body, size_t len, srv_kind kind, const srv_defaults *d, srv_request *r, srv_error *e);
void srv_request_free(srv_request *r);
/* The sampling lab's fields of any generation request (lab_request.c): `hlg` (true,
 * false or an object; absent: the --hlg-* defaults) and `curve`. 0, or -1 with e filled. */
int srv_parse_lab(const json_t *root, const srv_defaults *d, srv_request *r, srv_error *e);
/* A `curve` object into c (absent or null: off). */
int srv_parse_curve(const json_t *v, hearth_curve *c, srv_error *e);

/* ---- the engine queue: one thread owns the engine ----------------------- */

typedef enum srv_event_kind { SRV_EV_PROGRESS, SRV_EV_TOKEN, SRV_EV_DONE } srv_event_kind;

typedef struct srv_event {
    struct srv_event *next;
    srv_event_kind kind;
    size_t done, total;   /* PROGRESS */
    int32_t token;        /* TOKEN */
    hearth_finish finish; /* TOKEN: set on the last token (the engine sets it
                             before the callback) */
    int call_ended;       /* TOKEN: the first tool call ended in text (the job's
                             call_watch); the generation stops here */
    int has_lp;
    hearth_logprobs lp;
    char text[]; /* TOKEN: the text that became final (may be "") */
} srv_event;

/* One queued generation; shared by an HTTP thread and the engine thread
 * (refcounted). */
typedef struct srv_job {
    struct srv_job *next_in_queue;
    int32_t *ids;
    size_t n_ids;
    hearth_generate_params params; /* owns copies of its stop strings, stop ids and bias */
    atomic_int cancel;             /* set by the HTTP side when the client went away */
    /* parallel tool calls off with tool_choice "auto": the engine thread ends the job where
     * the model's first call ends (finish EOS: the turn is over) */
    int watch_calls;
    ts_call_watch call_watch;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_event *head, *tail; /* events not yet taken by the HTTP side */
    srv_event *done_event;  /* preallocated DONE marker */
    int finished;           /* the DONE event was pushed */
    hearth_status status;
    hearth_error err;
    hearth_generate_result result;
    double submitted_at, last_token_at; /* CLOCK_MONOTONIC seconds, for the latency metrics */
    int refs;
} srv_job;

typedef struct srv_queue srv_queue;

/* Starts the engine thread. The engine stays owned by the caller. prompt_cache_dir (NULL:
 * none): the batch's prefix cache is kept there (hearth_batch_prompt_cache, bounded by
 * prompt_cache_bytes); *report gets what was loaded from it. */
hearth_status srv_queue_start(hearth_engine *e, const char *prompt_cache_dir, long long prompt_cache_bytes,
                              hearth_prompt_cache_report *report, srv_queue **out, hearth_error *err);
/* Stops the engine thread: running and queued jobs finish as cancelled. */
void srv_queue_stop(srv_queue *q);
/* Creates a job holding two references (HTTP side and engine side); takes ids.
 */
srv_job *srv_job_new(int32_t *ids, size_t n_ids, const hearth_generate_params *p);
void srv_job_release(srv_job *j);
void srv_queue_submit(srv_queue *q, srv_job *j);
/* Jobs waiting (not counting the running one). */
size_t srv_queue_depth(srv_queue *q);
/* The batch's state as of the engine's last step (never waits for a step). */
void srv_queue_stats(srv_queue *q, hearth_batch_stats *out);
/* Blocks until an event is available; the caller frees it with free(). */
srv_event *srv_job_next_event(srv_job *j);

/* ---- response shapes (OpenAI, as mlx_lm.server emits them) --------------- */

/* What one response carries besides the fixed header fields. */
typedef struct srv_reply {
    const char *id, *fingerprint, *object, *model;
    long long created;
    srv_kind kind;
    int stream;
    const char *finish_reason; /* NULL for intermediate chunks */
    const char *text, *reasoning;
    json_t *tool_calls; /* formatted items (tp_format_calls) or NULL; borrowed */
    json_t *logprobs;   /* the "logprobs" value or NULL (stolen) */
    int with_usage;
    size_t prompt_tokens, completion_tokens, cached_tokens;
} srv_reply;

/* Builds the response object in mlx_lm.server's key order. */
json_t *srv_reply_json(const srv_reply *r);
/* The usage-only stream event (object "chat.completion", choices []). */
json_t *srv_usage_json(const srv_reply *r);
/* One logprobs.content entry; vocab pieces come from the model. */
json_t *srv_logprob_entry(const hearth_model *m, int32_t token, const hearth_logprobs *lp, int top_n);
/* "chatcmpl-<uuid4>" style ids. */
void srv_make_id(char *out, size_t cap, const char *prefix);

/* ---- the server -----------------------------------------------------------
 */

typedef enum srv_log_level {
    SRV_LOG_DEBUG,
    SRV_LOG_INFO,
    SRV_LOG_WARNING,
    SRV_LOG_ERROR,
    SRV_LOG_CRITICAL
} srv_log_level;

typedef struct srv_config {
    const char *host;
    int port;
    const char *api_key;       /* NULL: no auth */
    size_t max_body;           /* bytes; larger bodies get 413 */
    size_t max_header;         /* bytes of request line + headers; larger heads get 431 */
    unsigned timeout_s;        /* idle connection timeout */
    unsigned header_timeout_s; /* a request head must arrive whole within this (slow clients) */
    unsigned max_connections;
    char **origins; /* --allowed-origins */
    size_t n_origins;
    int origins_any; /* "*" was in the list */
    srv_log_level log_level;
    const char *model_arg; /* --model as given (NULL: the default model) */
    srv_defaults defaults;
    const char *const *adapters; /* --adapter id=path / --adapter-path: mounted at start */
    size_t n_adapters;
    const char *default_adapter; /* the id requests naming none use (NULL: the base) */
    unsigned responses_ttl_s;   /* --responses-ttl: how long stored responses live */
    size_t responses_max_bytes; /* --responses-max-bytes: the store's cap */
    hearth_memory *memory;      /* --memory / --memory-log: the vault the /v1/memory routes read
                                   (owned by the caller); NULL: those routes answer 404 */
    const char *memory_vault;   /* its path as given (NULL: hearth memory's default), for the
                                   synthesis run's own handle */
    hearth_memory *memory_log;  /* --memory-log: chat completions and stored Responses are logged
                                   into this vault (the same handle); NULL: nothing is logged */
    const char *prompt_cache_dir; /* --prompt-cache-dir: the prefix cache kept on disk (NULL: not kept) */
    size_t prompt_cache_bytes;    /* --prompt-cache-bytes: that folder's bound */
    const char *train_dir;        /* --train-dir: hearth train runs the training view lists (NULL: none) */
} srv_config;

typedef struct srv_server {
    srv_config cfg;
    hearth_model *model;
    hearth_engine *engine; /* the generating engine (owned by the caller, run by queue); NULL: embed only */
    srv_queue *queue;
    int context_length; /* of the engine */
    const char *context_source; /* why that context: "--ctx", "the model's own limit", or a cut */
    char context_source_text[96];
    char fingerprint[400];
    void *text_config;            /* ts_config of the model (textstate.h) */
    /* ts_config of a forced tool call (tool_choice.h): the model's, or where it has no tool
     * format Llama 3's JSON (a template with <|python_tag|>) or the hermes <tool_call> one */
    void *forced_text_config;
    pthread_mutex_t render_mu;    /* template rendering and tokenizing, one HTTP
                                     thread at a time */
    struct srv_http *http;        /* the listener and its connections (http.c) */
    struct resp_store *responses; /* the Responses API store (responses.h); NULL: none */
    double started;               /* CLOCK_MONOTONIC seconds when serving began (/stats uptime) */
    size_t predicted_peak_bytes;  /* hearth fit's prediction for this configuration; 0: unknown */
    int on_gpu;                   /* the engine runs on the GPU: /stats peak_bytes is device memory */
    struct srv_embed *embed;      /* POST /v1/embeddings (embeddings.h); NULL: none. queue is NULL
                                     when the served model only embeds */
} srv_server;

/* One request on its HTTP connection (http_conn.h); handlers answer it through
 * respond.c, exactly once. */
typedef struct srv_conn srv_conn;

/* ---- respond.c: answering and logging, for every endpoint ------------------ */

void srv_log(const srv_server *s, srv_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A complete JSON (or empty) response with the common and CORS headers. Returns 1,
 * or 0 when the connection failed (it closes). */
int srv_respond(srv_conn *c, const srv_server *s, int status, const char *body);
int srv_respond_error(srv_conn *c, const srv_server *s, const srv_error *e);
/* Any complete response: extra holds name, value pairs ending in NULL. */
int srv_respond_bytes(srv_conn *c, int status, const char *content_type, const void *body, size_t len,
                      const char *const *extra);
/* What a stream reader returns instead of a byte count. */
#define SRV_STREAM_END (-1)
#define SRV_STREAM_ERROR (-2) /* the connection closes without the stream's end */
/* A 200 response whose body reader(cls, buf, max) writes piece by piece as it comes
 * (chunked, or until close for HTTP/1.0); free_cls(cls) runs at the end, also when
 * the client went away. */
int srv_respond_stream(srv_conn *c, const srv_server *s, const char *content_type,
                       long (*reader)(void *cls, char *buf, size_t max), void *cls, void (*free_cls)(void *));
/* A request header field or a query parameter (decoded); NULL when absent. The query
 * value lives as long as the request. */
const char *srv_header(const srv_conn *c, const char *name);
const char *srv_query(srv_conn *c, const char *key);

/* ---- the server: http.c listens, router.c dispatches ------------------------ */

/* open.c: builds the whole server of a model (takes model and embedding_model, which
 * may be NULL) and starts listening; returns at once. On failure *out (when not NULL)
 * still needs srv_close. */
hearth_status srv_open(const srv_config *cfg, hearth_model *model, hearth_model *embedding_model,
                       const hearth_engine_options *eo, srv_server **out, hearth_error *err);
/* Stops listening, waits for every connection, stops the engine, frees it all. */
void srv_close(srv_server *s);
/* http.c: binds and starts serving (returns at once); srv_stop ends it. */
hearth_status srv_start(srv_server *s, hearth_error *err);
void srv_stop(srv_server *s);
/* router.c: answers one request whose head (and body, when it has one) is read. */
void srv_route_request(srv_server *s, srv_conn *c);
/* router.c: whether a request for this method and path would read a body (the body
 * gate runs before it is read). Sets c's route. Returns -1 when it was answered
 * already (an error), 0 to read the body, 1 when there is none to read. */
int srv_route_head(srv_server *s, srv_conn *c);

/* openai_chat.c */
int srv_handle_completion(srv_server *s, srv_conn *c, srv_kind kind, const char *body, size_t len);
/* The sampling lab (lab_routes.c): POST /signal, POST /generate, and its junk test. */
int srv_lab_signal(srv_server *s, srv_conn *c, const char *body, size_t len);
int srv_lab_generate(srv_server *s, srv_conn *c, const char *body, size_t len);
int srv_lab_junk(const char *text);
/* ---- memory_routes.c: the personal memory over HTTP (docs/memory.md) ---- */
int srv_memory_tools(srv_server *s, srv_conn *c);
int srv_memory_call(srv_server *s, srv_conn *c, const char *tool, const char *body, size_t len);
int srv_memory_synthesize(srv_server *s, srv_conn *c);
int srv_memory_changes(srv_server *s, srv_conn *c);
/* train_routes.c: GET /v1/train/runs and /v1/train/runs/{id} (serve --train-dir). */
int srv_train_runs(srv_server *s, srv_conn *c);
int srv_train_run(srv_server *s, srv_conn *c, const char *id);
/* The complete lines of buf (len bytes, NUL-terminated; its newlines are overwritten) that are
 * metrics records (hearth_train_record_kind), as a new array; *skipped counts the complete
 * lines that are not. A last line without its newline is not read. */
json_t *srv_train_records(char *buf, size_t len, int *skipped);
/* Logs one conversation ([{"role", "content"}], the answer last) into cfg.memory_log when
 * it is set (one writer at a time; failures are logged, never the request's). */
void srv_memory_log(srv_server *s, const json_t *messages, const char *source);
char *srv_models_body(const srv_server *s, const char *filter); /* filter NULL: all */
/* router.c: the /v1 index, from the route table. */
char *srv_index_body(void);
/* stats.c: GET /stats: the engine's last snapshot, memory, the Responses store. */
char *srv_stats_body(srv_server *s);
/* The /v1 index (srv_index_body) with the same numbers under "stats". */
char *srv_index_stats_body(srv_server *s);
/* Whether a request's "model" names the model being served. */
int srv_model_matches(const srv_server *s, const char *name);
/* metrics.c: GET /metrics (Prometheus text format). The counters are process-wide. */
int srv_metrics_respond(srv_server *s, srv_conn *c);
/* The endpoint label of a request path: the path of a known route with ids folded
 * ("/v1/responses/{id}"), else "other". */
void srv_metrics_label(char *out, size_t cap, const char *url, int known_route);
/* Counts a finished HTTP request under its label and the status it was answered with. */
void srv_metrics_request(const char *endpoint, int status);
/* A job enters the queue: its prompt tokens count, its time-to-first-token starts. */
void srv_metrics_submitted(srv_job *j);
/* The engine emitted one token of j: counted, and timed since the submission or the last. */
void srv_metrics_token(srv_job *j);
/* library_routes.c: GET /library, /fit, /downloads; POST /downloads. */
int srv_library_get(srv_server *s, srv_conn *c, const char *url);
int srv_library_post(srv_server *s, srv_conn *c, const char *body, size_t len);

#endif
