/* routes.c: the completion endpoints end to end (validate, render, tokenize,
 * queue, then turn engine events into one JSON reply or an SSE stream through
 * the reasoning/tool text state machine), and the bodies of /v1/models and /v1.
 * Runs on HTTP threads; never calls the engine directly (queue.c owns it). */
#include "server/server.h"
#include "server/textstate.h"
#include "server/toolparse.h"
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Everything one completion needs from its first event to its last. */
typedef struct gen_state {
    srv_server *s;
    srv_request req;
    srv_job *job;
    ts_parser *ts;
    char id[64];
    srv_reply reply;         /* header fields shared by every chunk */
    sbuf content, reasoning; /* non-streaming: the whole message */
    json_t *tool_calls;      /* formatted items not yet sent */
    int tool_index;          /* streaming: "index" of the next call */
    json_t *logprobs;        /* non-streaming: logprobs.content entries */
    ts_finish last_finish;
    sbuf out; /* streaming: SSE bytes not yet handed to MHD */
    size_t out_pos;
    int ended, failed;
} gen_state;

static void gen_free(gen_state *g) {
    if (!g) return;
    if (g->job) {
        atomic_store(&g->job->cancel, 1); /* a client that left stops the generation */
        srv_job_release(g->job);
    }
    ts_free(g->ts);
    srv_request_free(&g->req);
    sbuf_free(&g->content);
    sbuf_free(&g->reasoning);
    sbuf_free(&g->out);
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
    ts_pending(g->ts, &v);
    if (v.n_tools && g->req.kind == SRV_CHAT) {
        const ts_config *cfg = g->s->text_config;
        tp_format_calls(cfg->tool, v.tool_texts, v.tool_lens, v.n_tools, g->req.tools, g->req.stream, &g->tool_index,
                        g->tool_calls, warn_tool, g->s);
    }
    sbuf_append(&g->content, v.content ? v.content : "", v.content_len);
    if (g->req.kind == SRV_CHAT) sbuf_append(&g->reasoning, v.reasoning ? v.reasoning : "", v.reasoning_len);
    ts_clear_pending(g->ts);
}

static void emit_event(gen_state *g, json_t *o) {
    sbuf_puts(&g->out, "data: ");
    srv_json_write(&g->out, o);
    sbuf_puts(&g->out, "\n\n");
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

static void on_token_event(gen_state *g, const srv_event *ev) {
    hearth_error err = {0};
    size_t len = strlen(ev->text);
    /* The terminating token's text (an EOS flush, or what preceded a stop string
     * inside the final token) is dropped with the held-back buffer, as upstream's
     * token-level stop does. */
    switch (ev->finish) {
    case HEARTH_FINISH_EOS:
    case HEARTH_FINISH_STOP_STRING:
        g->last_finish = TS_FINISH_STOP;
        ts_feed(g->ts, ev->text, len, TS_FINISH_STOP, &err);
        break;
    case HEARTH_FINISH_LENGTH:
    case HEARTH_FINISH_CONTEXT:
        g->last_finish = TS_FINISH_LENGTH;
        ts_feed(g->ts, ev->text, len, TS_FINISH_LENGTH, &err);
        break;
    default: ts_feed(g->ts, ev->text, len, TS_FINISH_NONE, &err); break;
    }
    if (ev->has_lp && !g->req.stream && (g->req.logprobs || g->req.top_logprobs > 0))
        json_array_append_new(g->logprobs, srv_logprob_entry(g->s->model, ev->token, &ev->lp, g->req.top_logprobs));
    if (g->req.stream && !ts_in_tool(g->ts) && ts_has_pending(g->ts)) {
        take_pending(g);
        if (g->content.len || g->reasoning.len || json_array_size(g->tool_calls)) emit_chunk(g, NULL);
    }
}

/* After the DONE event: the final chunk (stream) or the complete reply. Returns
 * the reply object for non-streaming requests, NULL for streams (bytes are in
 * g->out). */
static json_t *on_done(gen_state *g) {
    srv_job *j = g->job;
    ts_end(g->ts);
    take_pending(g);
    const char *finish = ts_finish_reason(g->ts, g->last_finish);
    srv_reply r = g->reply;
    r.prompt_tokens = j->n_ids;
    r.completion_tokens = j->result.completion_tokens;
    r.cached_tokens = 0; /* no prompt cache yet */
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
    sbuf_puts(&g->out, "data: [DONE]\n\n");
    g->ended = 1;
    return NULL;
}

/* MHD pulls stream bytes here; it blocks on the job's channel between tokens,
 * which is fine because every connection has its own thread. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    gen_state *g = cls;
    (void)pos;
    while (g->out_pos == g->out.len) {
        sbuf_reset(&g->out);
        g->out_pos = 0;
        if (g->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        srv_event *ev = srv_job_next_event(g->job);
        /* upstream's batched path (every request without a seed) reports no 0/T */
        if (ev->kind == SRV_EV_PROGRESS) {
            if (ev->done || g->req.has_seed) sbuf_printf(&g->out, ": keepalive %zu/%zu\n\n", ev->done, ev->total);
        } else if (ev->kind == SRV_EV_TOKEN)
            on_token_event(g, ev);
        else if (g->job->status) { /* mid-stream engine failure: upstream just
                                      closes, no [DONE] */
            srv_log(g->s, SRV_LOG_ERROR, "generation failed: %s", g->job->err.message);
            g->failed = 1;
        } else {
            on_done(g);
        }
        free(ev);
        if (g->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = g->out.len - g->out_pos < max ? g->out.len - g->out_pos : max;
    memcpy(buf, g->out.data + g->out_pos, n);
    g->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { gen_free(cls); }

/* Template (chat) or raw prompt (text) to token ids, under the render lock. */
static int build_prompt(gen_state *g, int32_t **ids, size_t *n, int *opens_think, srv_error *e) {
    srv_server *s = g->s;
    hearth_error err = {0};
    char *prompt = NULL;
    hearth_status st = HEARTH_OK;
    pthread_mutex_lock(&s->render_mu);
    if (g->req.kind == SRV_CHAT) {
        char *msgs = json_dumps(g->req.messages, JSON_COMPACT);
        char *tools = g->req.tools ? json_dumps(g->req.tools, JSON_COMPACT) : NULL;
        char *extra = json_dumps(g->req.template_kwargs, JSON_COMPACT);
        st = hearth_chat_render(s->model, msgs, tools, 1, extra, &prompt, &err);
        free(msgs);
        free(tools);
        free(extra);
        if (!st) st = hearth_tokenize(s->model, prompt, strlen(prompt), 0, ids, n, &err);
        if (!st) *opens_think = ts_prompt_opens_think(s->text_config, prompt, strlen(prompt));
    } else {
        st = hearth_tokenize(s->model, g->req.prompt, strlen(g->req.prompt), 1, ids, n, &err);
    }
    pthread_mutex_unlock(&s->render_mu);
    hearth_free(prompt);
    if (st)
        return srv_fail(e, 400, "invalid_request_error", g->req.kind == SRV_CHAT ? "messages" : "prompt", NULL, "%s",
                        err.message);
    if (*n == 0) return srv_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty");
    /* checked here, not by the engine, so a stream gets a 400 instead of a cut
     * 200 */
    if (*n >= (size_t)s->context_length)
        return srv_fail(e, 400, "invalid_request_error", g->req.kind == SRV_CHAT ? "messages" : "prompt",
                        "context_length_exceeded",
                        "the prompt has %zu tokens but the context holds %d "
                        "(prompt and at least one new token)",
                        *n, s->context_length);
    return 0;
}

static void fill_params(const srv_request *r, hearth_generate_params *p) {
    memset(p, 0, sizeof *p);
    hearth_sampling *sp = &p->sampling;
    sp->temperature = r->temperature;
    sp->top_p = r->top_p;
    sp->top_k = r->top_k;
    sp->min_p = r->min_p;
    sp->repetition_penalty = r->repetition_penalty;
    sp->repetition_context_size = r->repetition_context_size;
    sp->presence_penalty = r->presence_penalty;
    sp->frequency_penalty = r->frequency_penalty;
    sp->has_seed = r->has_seed;
    sp->seed = r->seed;
    sp->bias_ids = r->bias_ids;
    sp->bias_values = r->bias_values;
    sp->n_bias = r->n_bias;
    /* logprobs: true needs the chosen token's logprob, which the engine reports
     * with n >= 1 */
    sp->top_logprobs = r->top_logprobs > 0 ? r->top_logprobs : r->logprobs ? 1 : 0;
    p->max_tokens = r->max_tokens;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
    p->trim_leading_space = 1;
}

/* Validates and queues; on success g->job runs. */
static int start_generation(gen_state *g, const char *body, size_t len, srv_kind kind, srv_error *e) {
    srv_server *s = g->s;
    if (srv_request_parse(body, len, kind, &s->cfg.defaults, &g->req, e)) return -1;
    if (!srv_model_matches(s, g->req.model))
        return srv_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                        "The model '%s' is not served here: this server serves "
                        "'%s' (or use \"default_model\"); "
                        "loading other models per request is not supported",
                        g->req.model, hearth_model_path(s->model));
    if (g->req.xtc_probability > 0) srv_log(s, SRV_LOG_WARNING, "xtc_probability is not supported yet; ignored");
    for (size_t i = 0; i < g->req.n_bias; i++)
        if (g->req.bias_ids[i] >= hearth_vocab_size(s->model))
            return srv_fail(e, 400, "invalid_request_error", "logit_bias", NULL,
                            "logit_bias: token id %d is outside the vocabulary (%d tokens)", g->req.bias_ids[i],
                            hearth_vocab_size(s->model));
    if (g->req.top_k >= hearth_vocab_size(s->model))
        return srv_fail(e, 400, "invalid_request_error", "top_k", NULL,
                        "top_k must be less than the vocabulary size (%d)", hearth_vocab_size(s->model));
    int32_t *ids = NULL;
    size_t n = 0;
    int opens_think = 0;
    if (build_prompt(g, &ids, &n, &opens_think, e)) {
        hearth_free(ids);
        return -1;
    }
    hearth_error err = {0};
    g->ts =
        ts_new(s->text_config, (const char *const *)g->req.stop, g->req.n_stop, kind == SRV_CHAT && opens_think, &err);
    hearth_generate_params p;
    fill_params(&g->req, &p);
    /* upstream stops at token level: each stop string encoded without special tokens
     * and matched against the generated ids; the text state machine strips them from
     * the visible text wherever they appear */
    size_t n_seqs = 0, cap = g->req.n_stop ? g->req.n_stop : 1;
    int32_t **seqs = calloc(cap, sizeof *seqs);
    size_t *lens = calloc(cap, sizeof *lens);
    for (size_t i = 0; seqs && lens && i < g->req.n_stop; i++) {
        int32_t *sid = NULL;
        size_t sn = 0;
        if (hearth_tokenize(s->model, g->req.stop[i], strlen(g->req.stop[i]), 0, &sid, &sn, &err) == HEARTH_OK && sn) {
            seqs[n_seqs] = sid;
            lens[n_seqs++] = sn;
        } else {
            hearth_free(sid);
        }
    }
    p.stop = NULL; /* no text-level stop in the engine: see above */
    p.n_stop = 0;
    p.stop_token_seqs = (const int32_t *const *)seqs;
    p.stop_token_lens = lens;
    p.n_stop_token_seqs = n_seqs;
    /* the job owns ids from here (freed with free(), so copy out of hearth's
     * allocation) */
    int32_t *own = malloc((n ? n : 1) * sizeof *own);
    if (own) memcpy(own, ids, n * sizeof *own);
    hearth_free(ids);
    g->job = g->ts && own ? srv_job_new(own, n, &p) : NULL; /* copies the stop ids */
    for (size_t i = 0; i < n_seqs; i++) hearth_free(seqs[i]);
    free(seqs);
    free(lens);
    if (!g->job) {
        free(own);
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    srv_make_id(g->id, sizeof g->id, kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    g->reply.id = g->id;
    g->reply.fingerprint = s->fingerprint;
    g->reply.model = g->req.model;
    g->reply.kind = kind;
    g->reply.stream = g->req.stream;
    g->reply.object = kind == SRV_TEXT ? "text_completion"
                      : g->req.stream  ? "chat.completion.chunk"
                                       : "chat.completion";
    srv_queue_submit(s->queue, g->job);
    return 0;
}

/* Errors the engine reports before any token (e.g. a prompt longer than the
 * context) are the client's: 400 with the engine's message. */
static int engine_error(const srv_job *j, srv_error *e) {
    int client = j->status == HEARTH_ERR_INVALID;
    return srv_fail(e, client ? 400 : 500, client ? "invalid_request_error" : "server_error", NULL,
                    client ? "context_length_exceeded" : NULL, "%s", j->err.message);
}

int srv_handle_completion(srv_server *s, struct MHD_Connection *c, srv_kind kind, const char *body, size_t len,
                          const char *origin) {
    srv_error e = {0};
    gen_state *g = calloc(1, sizeof *g);
    if (!g) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e, origin);
    g->s = s;
    g->reply.created = (long long)time(NULL);
    g->tool_calls = json_array();
    g->logprobs = json_array();
    sbuf_init(&g->content);
    sbuf_init(&g->reasoning);
    sbuf_init(&g->out);
    if (start_generation(g, body, len, kind, &e)) {
        gen_free(g);
        return srv_respond_error(c, s, &e, origin);
    }
    if (g->req.stream) {
        /* 4 KiB blocks: SSE events are small and each should leave as soon as it
         * exists */
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, g, stream_free);
        if (!resp) {
            gen_free(g);
            return MHD_NO;
        }
        srv_add_headers(resp, s, "text/event-stream", origin);
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        int rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        srv_log(s, SRV_LOG_INFO, "POST %s 200 (stream)", kind == SRV_CHAT ? "chat" : "completions");
        return rc;
    }
    json_t *reply = NULL;
    for (;;) {
        srv_event *ev = srv_job_next_event(g->job);
        srv_event_kind k = ev->kind;
        if (k == SRV_EV_TOKEN) on_token_event(g, ev);
        free(ev);
        if (k == SRV_EV_DONE) break;
    }
    int rc;
    if (g->job->status) {
        engine_error(g->job, &e);
        rc = srv_respond_error(c, s, &e, origin);
    } else {
        reply = on_done(g);
        char *text = reply ? srv_json_dumps(reply) : NULL;
        rc = srv_respond(c, s, 200, text, origin);
        free(text);
        json_decref(reply);
    }
    gen_free(g);
    return rc;
}

char *srv_models_body(const srv_server *s, const char *filter) {
    json_t *data = json_array();
    const char *id = hearth_model_path(s->model);
    if (!filter || !strcmp(filter, id)) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(id));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer((json_int_t)time(NULL)));
        json_array_append_new(data, m);
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}

char *srv_index_body(void) {
    static const char *const endpoints[][3] = {
        {"POST", "/v1/chat/completions", "chat completions (OpenAI), streaming with \"stream\": true"},
        {"POST", "/chat/completions", "alias of /v1/chat/completions"},
        {"POST", "/v1/completions", "text completions (OpenAI legacy)"},
        {"GET", "/v1/models", "the model being served"},
        {"GET", "/v1/models/{id}", "the model list filtered by id"},
        {"GET", "/health", "liveness: {\"status\": \"ok\"}"},
        {"GET", "/v1", "this index"},
        {"OPTIONS", "*", "CORS preflight"},
    };
    json_t *data = json_array();
    for (size_t i = 0; i < sizeof endpoints / sizeof endpoints[0]; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "method", json_string(endpoints[i][0]));
        json_object_set_new(e, "path", json_string(endpoints[i][1]));
        json_object_set_new(e, "description", json_string(endpoints[i][2]));
        json_array_append_new(data, e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}
