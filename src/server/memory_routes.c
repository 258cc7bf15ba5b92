/* memory_routes.c: the personal memory over HTTP (`serve --memory`): the read-only tools
 * as OpenAI function tools (GET /v1/memory/tools, POST /v1/memory/tools/{name}), the
 * synthesis run as server-sent progress (GET /v1/memory/synthesize, the served model
 * doing the reading through the ordinary queue) and the conversation log of
 * --memory-log. One lock serialises every use of the shared vault handle; a synthesis run
 * opens its own handle and only one runs at a time. Writes nothing but through
 * hearth_memory_* (the library keeps Reference/ and the gate). */
#include "server/generation.h"
#include "server/sse_events.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t memory_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int synthesis_running;

void srv_memory_log(srv_server *s, const json_t *messages, const char *source) {
    if (!s->cfg.memory_log) return;
    char *text = json_dumps(messages, JSON_COMPACT);
    hearth_error err = {0};
    pthread_mutex_lock(&memory_mu);
    hearth_status st = text ? hearth_memory_log_conversation(s->cfg.memory_log, text, source, &err) : HEARTH_ERR_NOMEM;
    pthread_mutex_unlock(&memory_mu);
    if (st) srv_log(s, SRV_LOG_WARNING, "memory log: %s", st == HEARTH_ERR_NOMEM ? "out of memory" : err.message);
    free(text);
}

static int memory_off(srv_server *s, srv_conn *c) {
    srv_error e = {0};
    srv_fail(&e, 404, "invalid_request_error", NULL, "memory_off",
             "this server has no memory vault: start it with --memory (docs/memory.md)");
    return srv_respond_error(c, s, &e);
}

/* A library error as an HTTP error: a tool or vault that is not there is 404, bad
 * arguments 400, a vault that needs attention 409, the rest 500. */
static int respond_status(srv_server *s, srv_conn *c, hearth_status st, const hearth_error *err, const char *param) {
    srv_error e = {0};
    int http = st == HEARTH_ERR_NOT_FOUND ? 404 : st == HEARTH_ERR_INVALID ? 400 : st == HEARTH_ERR_FORMAT ? 409 : 500;
    srv_fail(&e, http, http == 500 ? "server_error" : "invalid_request_error", param, NULL, "%s", err->message);
    return srv_respond_error(c, s, &e);
}

/* {"object": "list", "data": [{"type": "function", "function": {"name", "description",
 * "parameters"}}]}: the tools as a chat request's "tools" takes them. */
int srv_memory_tools(srv_server *s, srv_conn *c) {
    if (!s->cfg.memory) return memory_off(s, c);
    json_t *mcp = json_loads(hearth_memory_tools_json(), 0, NULL), *data = json_array(), *t;
    size_t i;
    json_array_foreach(mcp, i, t) json_array_append_new(
        data,
        json_pack("{s:s, s:{s:O, s:O, s:O}}", "type", "function", "function", "name", json_object_get(t, "name"),
                  "description", json_object_get(t, "description"), "parameters", json_object_get(t, "inputSchema")));
    json_t *reply = json_pack("{s:s, s:o}", "object", "list", "data", data);
    char *text = srv_json_dumps(reply);
    int rc = srv_respond(c, s, 200, text ? text : "{}");
    free(text);
    json_decref(reply), json_decref(mcp);
    return rc;
}

/* The body is the tool's arguments (a JSON object; empty: none); the reply its result. */
int srv_memory_call(srv_server *s, srv_conn *c, const char *tool, const char *body, size_t len) {
    if (!s->cfg.memory) return memory_off(s, c);
    char *args = strndup(body, len), *result = NULL;
    hearth_error err = {0};
    pthread_mutex_lock(&memory_mu);
    hearth_status st = args ? hearth_memory_call(s->cfg.memory, tool, args, &result, &err) : HEARTH_ERR_NOMEM;
    pthread_mutex_unlock(&memory_mu);
    free(args);
    int rc = st ? respond_status(s, c, st, &err, NULL) : srv_respond(c, s, 200, result);
    hearth_free(result);
    return rc;
}

/* GET /v1/memory/changes?limit=N: what the last N synthesis runs changed (default 1). */
int srv_memory_changes(srv_server *s, srv_conn *c) {
    if (!s->cfg.memory) return memory_off(s, c);
    const char *q = srv_query(c, "limit");
    char *end = NULL;
    long limit = q ? strtol(q, &end, 10) : 1;
    srv_error e = {0};
    if (q && (!*q || *end || limit < 1 || limit > HEARTH_MEMORY_CHANGES_MAX))
        return srv_fail(&e, 400, "invalid_request_error", "limit", NULL, "limit must be a whole number from 1 to %d",
                        HEARTH_MEMORY_CHANGES_MAX),
               srv_respond_error(c, s, &e);
    char *list = NULL;
    hearth_error err = {0};
    pthread_mutex_lock(&memory_mu);
    hearth_status st = hearth_memory_changes(s->cfg.memory, (int)limit, &list, &err);
    pthread_mutex_unlock(&memory_mu);
    if (st) return respond_status(s, c, st, &err, NULL);
    sbuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "{\"object\": \"list\", \"data\": %s}", list);
    hearth_free(list);
    int rc = b.oom ? (srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e))
                   : srv_respond(c, s, 200, b.data);
    sbuf_free(&b);
    return rc;
}

/* ---- synthesis, streamed ---------------------------------------------------------- */

/* Every answer is capped by its schema; this guards a runaway (the context ends it too). */
#define SYNTH_MAX_TOKENS 8192

/* The model behind the run: the served one, greedy, one chat request per question,
 * decoded under the stage's schema. */
static int synth_llm(void *user, const char *stage, const char *prompt, const char *schema, char **answer) {
    (void)stage;
    srv_server *s = user;
    json_t *body =
        json_pack("{s:[{s:s, s:s}], s:i, s:i, s:{s:s, s:{s:s, s:o, s:b}}}", "messages", "role", "user", "content",
                  prompt, "temperature", 0, "max_tokens", SYNTH_MAX_TOKENS, "response_format", "type", "json_schema",
                  "json_schema", "name", "memory", "schema", json_loads(schema, 0, NULL), "strict", 1);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    srv_request r = {0};
    srv_generation g = {0};
    srv_error e = {0};
    srv_gen_options o = {.any_model = 1};
    sbuf out;
    sbuf_init(&out);
    int failed = !text || srv_request_parse(text, strlen(text), SRV_CHAT, &s->cfg.defaults, &r, &e) ||
                 srv_generation_start(s, &r, &o, &g, &e);
    while (!failed) {
        srv_event *ev = srv_job_next_event(g.job);
        srv_event_kind k = ev->kind;
        if (k == SRV_EV_TOKEN) sbuf_append(&out, ev->text, strlen(ev->text));
        free(ev);
        if (k == SRV_EV_DONE) break;
    }
    if (!failed && g.job->status) failed = 1, srv_engine_error(g.job, &e);
    if (failed) srv_log(s, SRV_LOG_WARNING, "memory synthesis: the model failed: %s", e.message);
    srv_generation_free(&g);
    srv_request_free(&r);
    free(text);
    *answer = failed ? NULL : sbuf_steal(&out);
    if (!failed && !*answer) *answer = strdup("");
    sbuf_free(&out);
    return *answer ? 0 : 1;
}

static const char *const synth_stages[] = {"segment", "extract", "route", "synthesize", "link"};
#define N_SYNTH_STAGES 5

/* The run, one item a step: each step is hearth_memory_synthesize of one stage with limit
 * 1, so every step is the library's own resumable unit and the stream reports each. */
typedef struct synth_stream {
    srv_server *s;
    hearth_memory *m;
    sse_stream ss;
    int dry, stage, done;
    char *since;  /* ?since=, or NULL */
    json_t *plan; /* the dry run's counts, worked out before the stream starts */
    int plan_sent;
    int released;     /* synthesis_running cleared by this run */
    json_t *articles; /* the articles the run wrote, for its "done" event */
} synth_stream;

static void synth_event(synth_stream *st, json_t *o) { sse_event(&st->ss.out, o); }

static void synth_fail(synth_stream *st, const hearth_error *err) {
    synth_event(st, json_pack("{s:s, s:s}", "type", "error", "message", err->message));
    st->ss.ended = 1;
}

/* Appends the stream's next event(s): the plan first, then one per item, then "done". */
static void synth_step(synth_stream *st) {
    hearth_error err = {0};
    char *report = NULL;
    if (!st->plan_sent) {
        st->plan_sent = 1;
        json_t *ev = json_deep_copy(st->plan);
        json_object_set_new(ev, "type", json_string("plan"));
        synth_event(st, ev);
        if (st->dry) {
            synth_event(st, json_pack("{s:s, s:b}", "type", "done", "committed", 0));
            st->ss.ended = 1;
        }
        return;
    }
    const char *stage = synth_stages[st->stage];
    int last = st->stage == N_SYNTH_STAGES - 1;
    hearth_memory_synth_options o = {.stage = stage, .since = st->since, .limit = 1, .llm = synth_llm, .user = st->s};
    if (hearth_memory_synthesize(st->m, &o, &report, &err)) return synth_fail(st, &err);
    json_t *r = json_loads(report, 0, NULL);
    hearth_free(report);
    const char *key = strcmp(stage, "link") ? stage : NULL;
    int n = key ? (int)json_integer_value(json_object_get(r, key)) : 0;
    if (last) { /* the link stage publishes and commits: the run's end */
        json_object_set_new(r, "type", json_string("done"));
        json_object_set(r, "articles", st->articles);
        synth_event(st, r);
        st->ss.ended = 1;
        return;
    }
    if (n) {
        st->done += n;
        json_t *a = json_object_get(r, "articles"), *name;
        size_t i;
        json_array_foreach(a, i, name) json_array_append(st->articles, name);
        synth_event(
            st, json_pack("{s:s, s:s, s:i, s:O}", "type", "progress", "stage", stage, "done", st->done, "articles", a));
    } else {
        st->stage++, st->done = 0;
    }
    json_decref(r);
}

/* Lets the next run in: at the stream's end, before the client can see it end (so a client
 * that starts another run as soon as one ends is not refused), else when it is freed. */
static void synth_release(synth_stream *st) {
    if (!st->released) atomic_store(&synthesis_running, 0);
    st->released = 1;
}

static long synth_read(void *cls, char *buf, size_t max) {
    synth_stream *st = cls;
    while (st->ss.out_pos == st->ss.out.len) {
        sbuf_reset(&st->ss.out);
        st->ss.out_pos = 0;
        if (st->ss.ended) {
            synth_release(st);
            return SRV_STREAM_END;
        }
        synth_step(st);
        if (st->ss.out.oom) return SRV_STREAM_ERROR;
    }
    size_t n = st->ss.out.len - st->ss.out_pos;
    if (n > max) n = max;
    memcpy(buf, st->ss.out.data + st->ss.out_pos, n);
    st->ss.out_pos += n;
    return (long)n;
}

static void synth_free(void *cls) {
    synth_stream *st = cls;
    hearth_memory_close(st->m);
    free(st->since);
    json_decref(st->plan), json_decref(st->articles);
    sbuf_free(&st->ss.out);
    synth_release(st);
    free(st);
}

/* The plan (a dry run) is worked out before the stream starts, so a bad ?since= or a vault
 * that needs attention is an HTTP error, not an event. */
static int synth_plan(synth_stream *st, hearth_error *err) {
    char *report = NULL;
    hearth_memory_synth_options o = {.since = st->since, .dry_run = 1};
    hearth_status hs = hearth_memory_synthesize(st->m, &o, &report, err);
    if (!hs && !(st->plan = json_loads(report, 0, NULL))) hs = HEARTH_ERR_NOMEM;
    hearth_free(report);
    return hs;
}

int srv_memory_synthesize(srv_server *s, srv_conn *c) {
    if (!s->cfg.memory) return memory_off(s, c);
    const char *dry = srv_query(c, "dry"), *since = srv_query(c, "since");
    srv_error e = {0};
    if (dry && strcmp(dry, "0") && strcmp(dry, "1"))
        return srv_fail(&e, 400, "invalid_request_error", "dry", NULL, "dry must be 0 or 1"),
               srv_respond_error(c, s, &e);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&synthesis_running, &expected, 1))
        return srv_fail(&e, 409, "invalid_request_error", NULL, "synthesis_running",
                        "a synthesis run is in progress; try again when it ends"),
               srv_respond_error(c, s, &e);
    synth_stream *st = calloc(1, sizeof *st);
    hearth_error err = {0};
    hearth_memory_options mo = {.path = s->cfg.memory_vault};
    hearth_status hs = st && (!since || (st->since = strdup(since))) && (st->articles = json_array())
                           ? hearth_memory_open(&mo, &st->m, &err)
                           : HEARTH_ERR_NOMEM;
    if (!hs) hs = synth_plan(st, &err);
    if (hs) {
        if (st)
            synth_free(st); /* lets the next run in */
        else
            atomic_store(&synthesis_running, 0);
        if (hs == HEARTH_ERR_NOMEM) snprintf(err.message, sizeof err.message, "out of memory");
        return respond_status(s, c, hs, &err, hs == HEARTH_ERR_INVALID ? "since" : NULL);
    }
    st->s = s;
    st->dry = dry && !strcmp(dry, "1");
    sbuf_init(&st->ss.out);
    return srv_respond_stream(c, s, "text/event-stream", synth_read, st, synth_free);
}
