/* openai_chat.c: the OpenAI completion endpoints (validate with openai_chat_request.c, start the
 * shared generation of generation.c, then turn engine events into one JSON reply
 * or an SSE stream through the reasoning/tool text state machine), and the
 * body of /v1/models.
 * Runs on HTTP threads; never calls the engine directly (queue.c owns it). */
#include "server/adapters.h"
#include "server/embeddings.h"
#include "server/generation.h"
#include "server/sse_events.h"
#include "server/toolparse.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Everything one completion needs from its first event to its last. */
typedef struct gen_state {
    srv_server *s;
    srv_request req;
    srv_generation gen;
    char id[64];
    srv_reply reply;         /* header fields shared by every chunk */
    sbuf content, reasoning; /* non-streaming: the whole message */
    json_t *tool_calls;      /* formatted items not yet sent */
    int tool_index;          /* streaming: "index" of the next call */
    size_t n_calls;          /* calls formatted so far (single_tool_call keeps the first) */
    json_t *logprobs;        /* non-streaming: logprobs.content entries */
    sse_stream ss;           /* streaming: SSE bytes not yet written */
    sbuf answer;             /* --memory-log: the whole answer, streamed or not */
} gen_state;

static void gen_free(gen_state *g) {
    if (!g) return;
    srv_generation_free(&g->gen);
    srv_request_free(&g->req);
    sbuf_free(&g->content);
    sbuf_free(&g->reasoning);
    sbuf_free(&g->ss.out);
    sbuf_free(&g->answer);
    json_decref(g->tool_calls);
    json_decref(g->logprobs);
    free(g);
}

int srv_model_matches(const srv_server *s, const char *name) {
    if (!strcmp(name, "default_model")) return 1;
    const char *path = hearth_model_path(s->model);
    if (s->cfg.model_arg && !strcmp(name, s->cfg.model_arg)) return 1;
    if (!strcmp(name, path)) return 1;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(name);
    /* the file or folder name, with or without ".gguf" */
    return !strcmp(name, base) || (!strncmp(name, base, n) && !strcmp(base + n, ".gguf"));
}

static void warn_tool(void *ud, const char *message) { srv_log(ud, SRV_LOG_WARNING, "tool call dropped: %s", message); }

/* Moves what the state machine has produced into the reply fields (or, for a
 * non-streaming reply, into the accumulators). */
static void take_pending(gen_state *g) {
    ts_pending_view v;
    ts_pending(g->gen.ts, &v);
    if (v.n_tools && g->req.kind == SRV_CHAT) {
        size_t added = tp_format_calls(g->gen.tool, v.tool_texts, v.tool_lens, v.n_tools, g->req.tools, g->req.stream,
                                       &g->tool_index, g->tool_calls, warn_tool, g->s);
        /* parallel_tool_calls false: the calls after the model's first are dropped */
        for (; g->req.single_tool_call && added && g->n_calls + added > 1; added--) {
            json_array_remove(g->tool_calls, json_array_size(g->tool_calls) - 1);
            if (g->req.stream) g->tool_index--;
        }
        g->n_calls += added;
    }
    sbuf_append(&g->content, v.content ? v.content : "", v.content_len);
    if (g->s->cfg.memory_log) sbuf_append(&g->answer, v.content ? v.content : "", v.content_len);
    if (g->req.kind == SRV_CHAT) sbuf_append(&g->reasoning, v.reasoning ? v.reasoning : "", v.reasoning_len);
    ts_clear_pending(g->gen.ts);
}

static void emit_event(gen_state *g, json_t *o) {
    sbuf_puts(&g->ss.out, "data: ");
    srv_json_write(&g->ss.out, o);
    sbuf_puts(&g->ss.out, "\n\n");
    json_decref(o);
}

/* A streaming chunk from what was accumulated since the last one. */
static void emit_chunk(gen_state *g, const char *finish_reason) {
    srv_reply r = g->reply;
    r.finish_reason = finish_reason;
    r.text = g->content.data ? g->content.data : "";
    r.reasoning = g->reasoning.data;
    r.tool_calls = g->tool_calls;
    emit_event(g, srv_reply_json(&r));
    sbuf_reset(&g->content);
    sbuf_reset(&g->reasoning);
    json_array_clear(g->tool_calls);
}

static const srv_gen_options openai_options = {0};

static void on_token_event(gen_state *g, const srv_event *ev) {
    srv_generation_feed(&g->gen, ev, &openai_options);
    if (ev->has_lp && !g->req.stream && (g->req.logprobs || g->req.top_logprobs > 0))
        json_array_append_new(g->logprobs, srv_logprob_entry(g->s->model, ev->token, &ev->lp, g->req.top_logprobs));
    if (g->req.stream && !ts_in_tool(g->gen.ts) && ts_has_pending(g->gen.ts)) {
        take_pending(g);
        if (g->content.len || g->reasoning.len || json_array_size(g->tool_calls)) emit_chunk(g, NULL);
    }
}

/* --memory-log: the request's messages and the answer go into the vault, one chat one
 * file (srv_memory_log). */
static void memory_log(gen_state *g) {
    if (!g->s->cfg.memory_log || g->req.kind != SRV_CHAT || !json_is_array(g->req.messages)) return;
    json_t *msgs = json_copy(g->req.messages);
    json_array_append_new(
        msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", g->answer.data ? g->answer.data : ""));
    srv_memory_log(g->s, msgs, "hearth serve");
    json_decref(msgs);
}

/* After the DONE event: the final chunk (stream) or the complete reply. Returns
 * the reply object for non-streaming requests, NULL for streams (bytes are in
 * g->ss.out). */
static json_t *on_done(gen_state *g) {
    srv_job *j = g->gen.job;
    ts_end(g->gen.ts);
    take_pending(g);
    const char *finish = ts_finish_reason(g->gen.ts, g->gen.last_finish);
    memory_log(g);
    srv_reply r = g->reply;
    r.prompt_tokens = j->n_ids;
    r.completion_tokens = j->result.completion_tokens;
    r.cached_tokens = j->result.cached_tokens; /* served from the prefix cache */
    if (!g->req.stream) {
        r.finish_reason = finish;
        r.text = g->content.data ? g->content.data : "";
        r.reasoning = g->reasoning.data;
        r.tool_calls = g->tool_calls;
        if (json_array_size(g->logprobs)) {
            r.logprobs = json_object();
            json_object_set(r.logprobs, "content", g->logprobs);
        }
        r.with_usage = 1;
        return srv_reply_json(&r);
    }
    emit_chunk(g, finish);
    if (g->req.include_usage) emit_event(g, srv_usage_json(&r));
    sbuf_puts(&g->ss.out, "data: [DONE]\n\n");
    g->ss.ended = 1;
    return NULL;
}

/* One job event of a stream: progress comments, token chunks, the end. */
static void stream_event(void *cls, const srv_event *ev) {
    gen_state *g = cls;
    /* upstream's batched path (every request without a seed) reports no 0/T */
    if (ev->kind == SRV_EV_PROGRESS) {
        if (ev->done || g->req.has_seed) sbuf_printf(&g->ss.out, ": keepalive %zu/%zu\n\n", ev->done, ev->total);
    } else if (ev->kind == SRV_EV_TOKEN) {
        on_token_event(g, ev);
    } else if (g->gen.job->status) { /* mid-stream engine failure: upstream just closes, no [DONE] */
        srv_log(g->s, SRV_LOG_ERROR, "generation failed: %s", g->gen.job->err.message);
        g->ss.failed = 1;
    } else {
        on_done(g);
    }
}

/* respond.c pulls stream bytes here; it blocks on the job's channel between tokens,
 * which is fine because every connection has its own thread. */
static long stream_reader(void *cls, char *buf, size_t max) {
    gen_state *g = cls;
    return sse_stream_read(&g->ss, g->gen.job, stream_event, g, buf, max);
}

static void stream_free(void *cls) { gen_free(cls); }

/* Validates and queues; on success g->gen.job runs. */
static int start_generation(gen_state *g, const char *body, size_t len, srv_kind kind, srv_error *e) {
    srv_server *s = g->s;
    if (srv_request_parse(body, len, kind, &s->cfg.defaults, &g->req, e)) return -1;
    if (srv_generation_start(s, &g->req, &openai_options, &g->gen, e)) return -1;
    srv_make_id(g->id, sizeof g->id, kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    g->reply.id = g->id;
    g->reply.fingerprint = s->fingerprint;
    g->reply.model = g->req.model;
    g->reply.kind = kind;
    g->reply.stream = g->req.stream;
    g->reply.object = kind == SRV_TEXT ? "text_completion"
                      : g->req.stream  ? "chat.completion.chunk"
                                       : "chat.completion";
    return 0;
}

int srv_handle_completion(srv_server *s, srv_conn *c, srv_kind kind, const char *body, size_t len) {
    srv_error e = {0};
    gen_state *g = calloc(1, sizeof *g);
    if (!g) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e);
    g->s = s;
    g->reply.created = (long long)time(NULL);
    g->tool_calls = json_array();
    g->logprobs = json_array();
    sbuf_init(&g->content);
    sbuf_init(&g->reasoning);
    sbuf_init(&g->ss.out);
    if (start_generation(g, body, len, kind, &e)) {
        gen_free(g);
        return srv_respond_error(c, s, &e);
    }
    if (g->req.stream) return srv_respond_stream(c, s, "text/event-stream", stream_reader, g, stream_free);
    json_t *reply = NULL;
    for (;;) {
        srv_event *ev = srv_job_next_event(g->gen.job);
        srv_event_kind k = ev->kind;
        if (k == SRV_EV_TOKEN) on_token_event(g, ev);
        free(ev);
        if (k == SRV_EV_DONE) break;
    }
    int rc;
    if (g->gen.job->status) {
        srv_engine_error(g->gen.job, &e);
        rc = srv_respond_error(c, s, &e);
    } else {
        reply = on_done(g);
        char *text = reply ? srv_json_dumps(reply) : NULL;
        rc = srv_respond(c, s, 200, text);
        free(text);
        json_decref(reply);
    }
    gen_free(g);
    return rc;
}

char *srv_models_body(const srv_server *s, const char *filter) {
    json_t *data = json_array();
    /* the served model, then a --embedding-model beside it */
    const char *ids[2] = {hearth_model_path(s->model), srv_embed_model_path(s->embed)};
    for (int i = 0; i < 2; i++) {
        const char *id = ids[i];
        if (!id || (i && !strcmp(id, ids[0])) || (filter && strcmp(filter, id))) continue;
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(id));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer((json_int_t)time(NULL)));
        json_array_append_new(data, m);
    }
    /* mounted adapters: a request's "model" may name one (what gateway routers send) */
    json_t *ads = srv_adapters_list(s), *a;
    size_t i;
    json_array_foreach(ads, i, a) {
        const char *id = json_string_value(json_object_get(a, "id"));
        if (!id || (filter && strcmp(filter, id))) continue;
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object", "model", "created",
                                              (json_int_t)time(NULL), "owned_by", "adapter", "parent",
                                              hearth_model_path(s->model)));
    }
    json_decref(ads);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}
