/* anthropic.c: POST /v1/messages and /v1/messages/count_tokens. A translated
 * request (anthropic_request.c) runs through the shared generation path
 * (generation.h); the model's text, reasoning and parsed tool calls become
 * content blocks, written as one Message or as Anthropic's event stream by the
 * same block builder, so both carry the same blocks. Runs on HTTP threads;
 * never calls the engine directly. */
#define _GNU_SOURCE /* memmem */
#include "server/anthropic.h"
#include "server/generation.h"
#include "server/sse_events.h"
#include "server/toolparse.h"
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---- ids and events ----------------------------------------------------- */

void anth_make_id(char *out, size_t cap, const char *prefix) {
    static const char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    unsigned char b[24];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) { /* ids need only be unique-ish */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)((ts.tv_nsec >> (i % 4 * 8)) ^ (i * 131));
    }
    size_t n = strlen(prefix);
    snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && n + i + 1 < cap; i++) {
        out[n + i] = alphabet[b[i] % (sizeof alphabet - 1)];
        out[n + i + 1] = 0;
    }
}

/* ---- the block builder -------------------------------------------------- */

void anth_blocks_init(anth_blocks *b, int stream, sbuf *out, json_t *content) {
    memset(b, 0, sizeof *b);
    b->stream = stream;
    b->out = out;
    b->content = content;
    b->index = -1;
    sbuf_init(&b->text);
}

void anth_blocks_free(anth_blocks *b) { sbuf_free(&b->text); }

static const char *field_of(anth_block_kind k) { return k == ANTH_BLOCK_THINKING ? "thinking" : "text"; }

static void block_start(anth_blocks *b, json_t *block) {
    b->index++;
    if (!b->stream) {
        json_array_append_new(b->content, block);
        return;
    }
    json_t *ev = json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", b->index, "content_block", block);
    if (ev) sse_event(b->out, ev);
}

static void block_delta(anth_blocks *b, json_t *delta) {
    json_t *ev = json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", b->index, "delta", delta);
    if (ev) sse_event(b->out, ev);
}

void anth_blocks_close(anth_blocks *b) {
    if (b->open == ANTH_BLOCK_NONE) return;
    if (b->stream) {
        sse_event(b->out, json_pack("{s:s,s:i}", "type", "content_block_stop", "index", b->index));
    } else {
        json_t *s = json_stringn(b->text.data ? b->text.data : "", b->text.len);
        json_object_set_new(json_array_get(b->content, (size_t)b->index), field_of(b->open), s ? s : json_string(""));
        sbuf_reset(&b->text);
    }
    b->open = ANTH_BLOCK_NONE;
}

void anth_blocks_text(anth_blocks *b, anth_block_kind kind, const char *text, size_t len) {
    if (!len) return;
    if (b->open != kind) {
        anth_blocks_close(b);
        json_t *block = kind == ANTH_BLOCK_THINKING
                            ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                            : json_pack("{s:s,s:s}", "type", "text", "text", "");
        block_start(b, block);
        b->open = kind;
    }
    if (!b->stream) {
        sbuf_append(&b->text, text, len);
        return;
    }
    json_t *s = json_stringn(text, len); /* the detokenizer emits whole UTF-8 sequences only */
    if (!s) return;
    block_delta(b, json_pack("{s:s,s:o}", "type", kind == ANTH_BLOCK_THINKING ? "thinking_delta" : "text_delta",
                             field_of(kind), s));
}

void anth_blocks_tool(anth_blocks *b, const char *id, const char *name, const json_t *input) {
    anth_blocks_close(b);
    b->n_tool_use++;
    if (!b->stream) {
        block_start(b, json_pack("{s:s,s:s,s:s,s:O}", "type", "tool_use", "id", id, "name", name, "input", input));
        return;
    }
    block_start(b, json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", id, "name", name, "input"));
    char *args = srv_json_dumps(input);
    if (args) block_delta(b, json_pack("{s:s,s:s}", "type", "input_json_delta", "partial_json", args));
    free(args);
    b->open = ANTH_BLOCK_TOOL;
    anth_blocks_close(b);
}

/* ---- one request -------------------------------------------------------- */

static const srv_gen_options anth_options = {.any_model = 1, .text_stops = 1, .stop_field = "stop_sequences"};

typedef struct anth_state {
    srv_server *s;
    srv_request req;
    anth_extra x;
    srv_generation gen;
    char id[48];
    json_t *content; /* non-streaming: the blocks */
    anth_blocks blocks;
    int32_t *ids; /* generated tokens, to tell which stop sequence matched */
    size_t n_ids, cap_ids;
    sse_stream ss; /* streaming: event bytes not yet written */
    int started;   /* streaming: message_start was written */
} anth_state;

static void state_free(anth_state *st) {
    if (!st) return;
    srv_generation_free(&st->gen);
    srv_request_free(&st->req);
    anth_extra_free(&st->x);
    anth_blocks_free(&st->blocks);
    json_decref(st->content);
    free(st->ids);
    sbuf_free(&st->ss.out);
    free(st);
}

/* A parsed call's input must be an object; models sometimes write it as JSON
 * text. */
static json_t *tool_input(json_t *args) {
    if (json_is_object(args)) return json_incref(args);
    if (!json_is_string(args)) return NULL;
    json_t *o = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
    if (json_is_object(o)) return o;
    json_decref(o);
    return NULL;
}

static void add_tool_calls(anth_state *st, const char *text, size_t len) {
    json_t *calls = json_array();
    hearth_error err = {0};
    if (tp_parse(st->gen.tool, text, len, st->req.tools, calls, &err)) {
        srv_log(st->s, SRV_LOG_WARNING, "tool call dropped: %s", err.message);
        json_decref(calls);
        return;
    }
    /* disable_parallel_tool_use: the calls after the model's first are dropped */
    for (size_t i = 0; i < json_array_size(calls) && !(st->req.single_tool_call && st->blocks.n_tool_use); i++) {
        json_t *call = json_array_get(calls, i), *input = tool_input(json_object_get(call, "arguments"));
        const char *name = json_string_value(json_object_get(call, "name"));
        if (!input || !name) {
            srv_log(st->s, SRV_LOG_WARNING, "tool call dropped: its arguments are not a JSON object");
            json_decref(input);
            continue;
        }
        char id[40];
        anth_make_id(id, sizeof id, "toolu_");
        anth_blocks_tool(&st->blocks, id, name, input);
        json_decref(input);
    }
    json_decref(calls);
}

/* Moves what the text state machine produced into blocks. */
static void take_pending(anth_state *st) {
    ts_pending_view v;
    ts_pending(st->gen.ts, &v);
    if (st->x.thinking) anth_blocks_text(&st->blocks, ANTH_BLOCK_THINKING, v.reasoning, v.reasoning_len);
    anth_blocks_text(&st->blocks, ANTH_BLOCK_TEXT, v.content, v.content_len);
    for (size_t i = 0; i < v.n_tools; i++) add_tool_calls(st, v.tool_texts[i], v.tool_lens[i]);
    ts_clear_pending(st->gen.ts);
}

static void on_token(anth_state *st, const srv_event *ev) {
    if (st->req.n_stop) {
        if (st->n_ids == st->cap_ids) {
            size_t cap = st->cap_ids ? 2 * st->cap_ids : 64;
            int32_t *p = realloc(st->ids, cap * sizeof *p);
            if (p) st->ids = p, st->cap_ids = cap;
        }
        if (st->n_ids < st->cap_ids) st->ids[st->n_ids++] = ev->token;
    }
    srv_generation_feed(&st->gen, ev, &anth_options);
    /* the OpenAI path's rule: nothing leaves while a tool call is being written
     */
    if (!ts_in_tool(st->gen.ts) && ts_has_pending(st->gen.ts)) take_pending(st);
}

static void token_event(void *cls, const srv_event *ev) { on_token(cls, ev); }

/* The stop sequence that ended the generation: the earliest one in the decoded
 * output, as the engine's text stop finds it. NULL if it cannot be told. */
static const char *matched_stop(anth_state *st) {
    char *text = NULL;
    hearth_error err = {0};
    if (hearth_detokenize(st->s->model, st->ids, st->n_ids, 0, &text, &err)) return NULL;
    const char *best = NULL;
    size_t best_at = (size_t)-1, len = strlen(text);
    for (size_t i = 0; i < st->req.n_stop; i++) {
        const char *at = memmem(text, len, st->req.stop[i], strlen(st->req.stop[i]));
        if (at && (size_t)(at - text) < best_at) best_at = (size_t)(at - text), best = st->req.stop[i];
    }
    hearth_free(text);
    return best;
}

/* stop_reason and stop_sequence of a finished job. */
static const char *stop_reason(anth_state *st, const char **stop_sequence) {
    *stop_sequence = NULL;
    switch (st->gen.job->result.finish) {
    case HEARTH_FINISH_STOP_STRING: *stop_sequence = matched_stop(st); return "stop_sequence";
    case HEARTH_FINISH_LENGTH:
    case HEARTH_FINISH_CONTEXT: return "max_tokens";
    default: return st->blocks.n_tool_use ? "tool_use" : "end_turn";
    }
}

static json_t *message_json(anth_state *st, json_t *content, const char *reason, const char *stop_seq, int input_only) {
    json_t *model = json_string(st->req.model);
    return json_pack("{s:s,s:s,s:s,s:o,s:o,s:o,s:o,s:o}", "id", st->id, "type", "message", "role", "assistant", "model",
                     model ? model : json_string(""), "content", content, "stop_reason",
                     reason ? json_string(reason) : json_null(), "stop_sequence",
                     stop_seq ? json_string(stop_seq) : json_null(), "usage",
                     sse_usage_anthropic(st->gen.job, input_only));
}

/* After the DONE event: closes the blocks and writes the stream's last events.
 * Returns the Message for non-streaming requests. */
static json_t *on_done(anth_state *st) {
    ts_end(st->gen.ts);
    take_pending(st);
    anth_blocks_close(&st->blocks);
    const char *seq, *reason = stop_reason(st, &seq);
    if (!st->req.stream) return message_json(st, json_incref(st->content), reason, seq, 0);
    json_t *delta =
        json_pack("{s:s,s:o}", "stop_reason", reason, "stop_sequence", seq ? json_string(seq) : json_null());
    sse_event(&st->ss.out, json_pack("{s:s,s:o,s:o}", "type", "message_delta", "delta", delta, "usage",
                                     sse_usage_anthropic(st->gen.job, 0)));
    sse_event(&st->ss.out, json_pack("{s:s}", "type", "message_stop"));
    st->ss.ended = 1;
    return NULL;
}

/* One job event of a stream. message_start waits for the first event: the batch
 * has admitted the job by then, so its usage says how much of the prompt the
 * prefix cache held. */
static void stream_event(void *cls, const srv_event *ev) {
    anth_state *st = cls;
    if (!st->started) {
        st->started = 1;
        sse_event(&st->ss.out, json_pack("{s:s,s:o}", "type", "message_start", "message",
                                         message_json(st, json_array(), NULL, NULL, 1)));
        sse_event(&st->ss.out, json_pack("{s:s}", "type", "ping"));
    }
    if (ev->kind == SRV_EV_PROGRESS) {
        /* Anthropic's keep-alive while the prompt is processed */
        if (ev->done) sse_event(&st->ss.out, json_pack("{s:s}", "type", "ping"));
    } else if (ev->kind == SRV_EV_TOKEN) {
        on_token(st, ev);
    } else if (st->gen.job->status) { /* mid-stream failure: an error event ends the stream */
        srv_log(st->s, SRV_LOG_ERROR, "generation failed: %s", st->gen.job->err.message);
        srv_error e = {0};
        srv_engine_error(st->gen.job, &e);
        sse_event(&st->ss.out, json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                                         anth_error_type(e.http_status), "message", e.message));
        st->ss.ended = 1;
    } else {
        on_done(st);
    }
}

static long stream_reader(void *cls, char *buf, size_t max) {
    anth_state *st = cls;
    return sse_stream_read(&st->ss, st->gen.job, stream_event, st, buf, max);
}

static void stream_free(void *cls) { state_free(cls); }

static int respond_error(srv_server *s, srv_conn *c, srv_error *e) {
    e->anthropic = 1;
    return srv_respond_error(c, s, e);
}

int anth_handle_messages(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_error e = {0};
    anth_state *st = calloc(1, sizeof *st);
    if (!st) return srv_fail(&e, 500, "api_error", NULL, NULL, "out of memory"), respond_error(s, c, &e);
    st->s = s;
    sbuf_init(&st->ss.out);
    st->content = json_array();
    if (anth_request_parse(body, len, &s->cfg.defaults, 0, &st->req, &st->x, &e) ||
        srv_generation_start(s, &st->req, &anth_options, &st->gen, &e)) {
        anth_blocks_init(&st->blocks, 0, NULL, NULL);
        state_free(st);
        return respond_error(s, c, &e);
    }
    anth_make_id(st->id, sizeof st->id, "msg_");
    anth_blocks_init(&st->blocks, st->req.stream, &st->ss.out, st->content);
    if (st->req.stream) return srv_respond_stream(c, s, "text/event-stream", stream_reader, st, stream_free);
    sse_wait_done(st->gen.job, token_event, st);
    int rc;
    if (st->gen.job->status) {
        srv_engine_error(st->gen.job, &e);
        rc = respond_error(s, c, &e);
    } else {
        json_t *reply = on_done(st);
        char *text = reply ? srv_json_dumps(reply) : NULL;
        json_decref(reply);
        if (text) {
            rc = srv_respond(c, s, 200, text);
        } else {
            srv_fail(&e, 500, "api_error", NULL, NULL, "out of memory");
            rc = respond_error(s, c, &e);
        }
        free(text);
    }
    state_free(st);
    return rc;
}

int anth_handle_count_tokens(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_error e = {0};
    srv_request r;
    anth_extra x;
    if (anth_request_parse(body, len, &s->cfg.defaults, 1, &r, &x, &e)) return respond_error(s, c, &e);
    int32_t *ids = NULL;
    size_t n = 0;
    int opens_think = 0, rc;
    /* a prompt longer than the context still has a count */
    if (srv_prompt_ids(s, &r, &ids, &n, &opens_think, &e) &&
        !(n && e.code && !strcmp(e.code, "context_length_exceeded"))) {
        rc = respond_error(s, c, &e);
    } else {
        char out[64];
        snprintf(out, sizeof out, "{\"input_tokens\": %zu}", n);
        rc = srv_respond(c, s, 200, out);
    }
    hearth_free(ids);
    srv_request_free(&r);
    anth_extra_free(&x);
    return rc;
}
