/* responses.c: POST /v1/responses and GET/DELETE /v1/responses/{id}. A parsed
 * request (responses_request.c), prefixed with the stored conversation of its
 * previous_response_id, runs through the shared generation path
 * (generation.h); the model's text and parsed tool calls become output items,
 * written as one Response or as the Responses event stream by the same item
 * builder. Runs on HTTP threads; never calls the engine directly. */
#include "server/responses.h"
#include "server/anthropic.h" /* anth_make_id: the same random-suffix ids */
#include "server/generation.h"
#include "server/sse_events.h"
#include "server/toolparse.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const srv_gen_options resp_options = {.any_model = 0, .text_stops = 0, .max_tokens_field = "max_output_tokens"};

typedef struct resp_state {
    srv_server *s;
    resp_request rq;
    srv_generation gen;
    char id[48];
    long long created;
    json_t *context; /* the conversation items before this output */
    json_t *output;  /* the output items so far */
    int stream, seq; /* seq: the next event's sequence_number */
    sse_stream ss;   /* streaming: event bytes not yet written */
    int msg_open;    /* an output message item is being written */
    char msg_id[48];
    sbuf text;   /* the open message's text so far */
    int n_calls; /* function_call items so far (single_tool_call keeps the first) */
} resp_state;

static void state_free(resp_state *st) {
    if (!st) return;
    srv_generation_free(&st->gen);
    resp_request_free(&st->rq);
    json_decref(st->context);
    json_decref(st->output);
    sbuf_free(&st->ss.out);
    sbuf_free(&st->text);
    free(st);
}

/* Appends the event with the next sequence_number (o is stolen). */
static void emit(resp_state *st, json_t *o) {
    if (!o) return;
    json_object_set_new(o, "sequence_number", json_integer(st->seq++));
    sse_event(&st->ss.out, o);
}

/* ---- the output item builder ---------------------------------------------------- */

static json_t *text_part(const char *text, size_t len) {
    json_t *t = json_stringn(text ? text : "", len);
    return json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text", t ? t : json_string(""), "annotations");
}

static json_t *message_item(resp_state *st, const char *status, json_t *content) {
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", st->msg_id, "type", "message", "status", status, "role",
                     "assistant", "content", content);
}

static void message_open(resp_state *st) {
    anth_make_id(st->msg_id, sizeof st->msg_id, "msg_");
    st->msg_open = 1;
    sbuf_reset(&st->text);
    if (!st->stream) return;
    int index = (int)json_array_size(st->output);
    emit(st, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index", index, "item",
                       message_item(st, "in_progress", json_array())));
    emit(st, json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.content_part.added", "item_id", st->msg_id,
                       "output_index", index, "content_index", 0, "part", text_part("", 0)));
}

static void message_text(resp_state *st, const char *text, size_t len) {
    if (!len) return;
    if (!st->msg_open) message_open(st);
    sbuf_append(&st->text, text, len);
    if (!st->stream) return;
    json_t *delta = json_stringn(text, len); /* the detokenizer emits whole UTF-8 sequences only */
    if (!delta) return;
    emit(st,
         json_pack("{s:s,s:s,s:i,s:i,s:o,s:[]}", "type", "response.output_text.delta", "item_id", st->msg_id,
                   "output_index", (int)json_array_size(st->output), "content_index", 0, "delta", delta, "logprobs"));
}

/* status: "completed", or "incomplete" when the token limit cut the message. */
static void message_close(resp_state *st, const char *status) {
    if (!st->msg_open) return;
    st->msg_open = 0;
    int index = (int)json_array_size(st->output);
    const char *t = st->text.data ? st->text.data : "";
    if (st->stream) {
        json_t *text = json_stringn(t, st->text.len);
        emit(st,
             json_pack("{s:s,s:s,s:i,s:i,s:o,s:[]}", "type", "response.output_text.done", "item_id", st->msg_id,
                       "output_index", index, "content_index", 0, "text", text ? text : json_string(""), "logprobs"));
        emit(st, json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.content_part.done", "item_id", st->msg_id,
                           "output_index", index, "content_index", 0, "part", text_part(t, st->text.len)));
    }
    json_t *item = message_item(st, status, json_pack("[o]", text_part(t, st->text.len)));
    if (st->stream)
        emit(st, json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index", index, "item", item));
    json_array_append_new(st->output, item);
}

static void function_call(resp_state *st, const char *name, const char *args) {
    message_close(st, "completed");
    char fc_id[48], call_id[48];
    anth_make_id(fc_id, sizeof fc_id, "fc_");
    anth_make_id(call_id, sizeof call_id, "call_");
    int index = (int)json_array_size(st->output);
    json_t *item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", fc_id, "type", "function_call", "status", "completed",
                             "call_id", call_id, "name", name, "arguments", args);
    if (!item) return;
    if (st->stream) {
        emit(st, json_pack("{s:s,s:i,s:{s:s,s:s,s:s,s:s,s:s,s:s}}", "type", "response.output_item.added",
                           "output_index", index, "item", "id", fc_id, "type", "function_call", "status", "in_progress",
                           "call_id", call_id, "name", name, "arguments", ""));
        emit(st, json_pack("{s:s,s:s,s:i,s:s}", "type", "response.function_call_arguments.delta", "item_id", fc_id,
                           "output_index", index, "delta", args));
        emit(st, json_pack("{s:s,s:s,s:i,s:s,s:s}", "type", "response.function_call_arguments.done", "item_id", fc_id,
                           "output_index", index, "name", name, "arguments", args));
        emit(st, json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index", index, "item", item));
    }
    json_array_append_new(st->output, item);
}

/* The model's tool-call text -> function_call items with JSON-text arguments. */
static void add_tool_calls(resp_state *st, const char *text, size_t len) {
    json_t *calls = json_array();
    hearth_error err = {0};
    if (!calls || tp_parse(st->gen.tool, text, len, st->rq.req.tools, calls, &err)) {
        srv_log(st->s, SRV_LOG_WARNING, "tool call dropped: %s", err.message);
        json_decref(calls);
        return;
    }
    for (size_t i = 0; i < json_array_size(calls) && !(st->rq.req.single_tool_call && st->n_calls); i++) {
        json_t *call = json_array_get(calls, i), *args = json_object_get(call, "arguments");
        const char *name = json_string_value(json_object_get(call, "name"));
        char *text_args = json_is_string(args) ? strdup(json_string_value(args))
                          : args               ? srv_json_dumps(args)
                                               : strdup("{}");
        if (name && text_args) function_call(st, name, text_args), st->n_calls++;
        free(text_args);
    }
    json_decref(calls);
}

/* Moves what the text state machine produced into items. Reasoning text is not
 * part of the output (no reasoning items yet). */
static void take_pending(resp_state *st) {
    ts_pending_view v;
    ts_pending(st->gen.ts, &v);
    message_text(st, v.content, v.content_len);
    for (size_t i = 0; i < v.n_tools; i++) add_tool_calls(st, v.tool_texts[i], v.tool_lens[i]);
    ts_clear_pending(st->gen.ts);
}

static void on_token(resp_state *st, const srv_event *ev) {
    srv_generation_feed(&st->gen, ev, &resp_options);
    /* the OpenAI path's rule: nothing leaves while a tool call is being written */
    if (!ts_in_tool(st->gen.ts) && ts_has_pending(st->gen.ts)) take_pending(st);
}

static void token_event(void *cls, const srv_event *ev) { on_token(cls, ev); }

/* ---- the Response object ----------------------------------------------------------- */

static json_t *nullable_string(const char *s) { return s ? json_string(s) : json_null(); }

/* status: "in_progress" (no usage yet), "completed" or "incomplete". */
static json_t *response_json(resp_state *st, const char *status) {
    const resp_request *rq = &st->rq;
    int done = strcmp(status, "in_progress") != 0;
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "id", json_string(st->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(st->created));
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "background", json_false());
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details",
                        strcmp(status, "incomplete") ? json_null() : json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(o, "instructions", nullable_string(rq->instructions));
    json_object_set_new(o, "max_output_tokens", rq->has_max_output ? json_integer(rq->req.max_tokens) : json_null());
    json_object_set_new(o, "model", json_string(rq->req.model));
    json_object_set_new(o, "output", done ? json_deep_copy(st->output) : json_array());
    json_object_set_new(o, "parallel_tool_calls", json_boolean(!rq->req.single_tool_call));
    json_object_set_new(o, "previous_response_id", nullable_string(rq->previous_id));
    json_object_set_new(o, "reasoning", json_pack("{s:n,s:n}", "effort", "summary"));
    json_object_set_new(o, "store", json_boolean(rq->store));
    json_object_set_new(o, "temperature", json_real(rq->req.temperature));
    json_object_set_new(o, "text",
                        rq->text_format ? json_pack("{s:O}", "format", rq->text_format)
                                        : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(o, "tool_choice", json_deep_copy(rq->tool_choice));
    json_object_set_new(o, "tools", json_deep_copy(rq->tools_echo));
    json_object_set_new(o, "top_p", json_real(rq->req.top_p));
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "usage", done ? sse_usage_responses(st->gen.job) : json_null());
    json_object_set_new(o, "user", json_null());
    json_object_set_new(o, "metadata", json_deep_copy(rq->metadata));
    return o;
}

/* Keeps the finished response and its conversation for previous_response_id. */
static void store_response(resp_state *st, const json_t *response) {
    if (!st->rq.store || !st->s->responses) return;
    json_t *items = json_deep_copy(st->context), *msgs = NULL;
    if (!items || json_array_extend(items, st->output) || resp_store_put(st->s->responses, st->id, response, items))
        srv_log(st->s, SRV_LOG_WARNING, "response %s not stored: larger than --responses-max-bytes (or out of memory)",
                st->id);
    srv_error e = {0};
    /* --memory-log: a stored conversation feeds the memory too (its messages as a chat) */
    if (items && st->s->cfg.memory_log && !resp_items_to_messages(items, NULL, &msgs, &e))
        srv_memory_log(st->s, msgs, "hearth serve /v1/responses");
    json_decref(msgs);
    json_decref(items);
}

/* After the DONE event: closes the items, stores the response and, streaming,
 * writes the last event. Returns the Response. */
static json_t *on_done(resp_state *st) {
    ts_end(st->gen.ts);
    take_pending(st);
    hearth_finish f = st->gen.job->result.finish;
    const char *status = f == HEARTH_FINISH_LENGTH || f == HEARTH_FINISH_CONTEXT ? "incomplete" : "completed";
    message_close(st, status);
    json_t *response = response_json(st, status);
    if (response) store_response(st, response);
    if (st->stream) {
        emit(st,
             json_pack("{s:s,s:O}", "type", strcmp(status, "completed") ? "response.incomplete" : "response.completed",
                       "response", response));
        st->ss.ended = 1;
    }
    return response;
}

/* ---- HTTP ------------------------------------------------------------------------- */

/* One job event of a stream. */
static void stream_event(void *cls, const srv_event *ev) {
    resp_state *st = cls;
    if (ev->kind == SRV_EV_TOKEN) {
        on_token(st, ev);
    } else if (ev->kind == SRV_EV_DONE && st->gen.job->status) { /* mid-stream failure: an error event */
        srv_log(st->s, SRV_LOG_ERROR, "generation failed: %s", st->gen.job->err.message);
        srv_error e = {0};
        srv_engine_error(st->gen.job, &e);
        emit(st, json_pack("{s:s,s:s,s:s,s:n}", "type", "error", "code", e.code ? e.code : e.type, "message", e.message,
                           "param"));
        st->ss.ended = 1;
    } else if (ev->kind == SRV_EV_DONE) {
        json_decref(on_done(st));
    }
}

static long stream_reader(void *cls, char *buf, size_t max) {
    resp_state *st = cls;
    return sse_stream_read(&st->ss, st->gen.job, stream_event, st, buf, max);
}

static void stream_free(void *cls) { state_free(cls); }

static int respond_stream(srv_server *s, srv_conn *c, resp_state *st) {
    emit(st, json_pack("{s:s,s:o}", "type", "response.created", "response", response_json(st, "in_progress")));
    emit(st, json_pack("{s:s,s:o}", "type", "response.in_progress", "response", response_json(st, "in_progress")));
    return srv_respond_stream(c, s, "text/event-stream", stream_reader, st, stream_free);
}

static int respond_json(srv_server *s, srv_conn *c, json_t *o) {
    char *text = o ? srv_json_dumps(o) : NULL;
    json_decref(o);
    srv_error e = {0};
    int rc = text ? srv_respond(c, s, 200, text)
                  : (srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e));
    free(text);
    return rc;
}

/* The conversation before the output: the stored items of previous_response_id
 * (404 if unknown or expired) and this input; then the template messages. */
static int build_context(srv_server *s, resp_state *st, srv_error *e) {
    resp_request *rq = &st->rq;
    if (rq->previous_id) {
        st->context = s->responses ? resp_store_items(s->responses, rq->previous_id) : NULL;
        if (!st->context)
            return srv_fail(e, 404, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                            "Previous response with id '%.80s' not found.", rq->previous_id);
    } else if (!(st->context = json_array())) {
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (json_array_extend(st->context, rq->input)) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return resp_items_to_messages(st->context, rq->instructions, &rq->req.messages, e);
}

int resp_handle_create(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_error e = {0};
    resp_state *st = calloc(1, sizeof *st);
    if (!st) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e);
    st->s = s;
    sbuf_init(&st->ss.out);
    sbuf_init(&st->text);
    st->output = json_array();
    if (resp_request_parse(body, len, &s->cfg.defaults, &st->rq, &e) || build_context(s, st, &e) ||
        srv_generation_start(s, &st->rq.req, &resp_options, &st->gen, &e)) {
        state_free(st);
        return srv_respond_error(c, s, &e);
    }
    anth_make_id(st->id, sizeof st->id, "resp_");
    st->created = (long long)time(NULL);
    st->stream = st->rq.req.stream;
    if (st->stream) return respond_stream(s, c, st);
    sse_wait_done(st->gen.job, token_event, st);
    int rc;
    if (st->gen.job->status) {
        srv_engine_error(st->gen.job, &e);
        rc = srv_respond_error(c, s, &e);
    } else {
        rc = respond_json(s, c, on_done(st));
    }
    state_free(st);
    return rc;
}

int resp_handle_id(srv_server *s, srv_conn *c, const char *id, int is_delete) {
    srv_error e = {0};
    int found = 0, rc;
    char *text = NULL;
    if (s->responses && is_delete)
        found = resp_store_delete(s->responses, id);
    else if (s->responses)
        found = (text = resp_store_response(s->responses, id)) != NULL;
    if (!found) {
        srv_fail(&e, 404, "invalid_request_error", NULL, "not_found", "Response with id '%.80s' not found.", id);
        return srv_respond_error(c, s, &e);
    }
    if (is_delete) {
        json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response.deleted", "deleted", 1);
        rc = respond_json(s, c, o);
    } else {
        rc = srv_respond(c, s, 200, text);
    }
    free(text);
    return rc;
}
