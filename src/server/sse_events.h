/* sse_events.h: the event-stream plumbing that the Anthropic Messages
 * (anthropic.c) and OpenAI Responses (responses.c) handlers share: the
 * "event: <type>\ndata: <json>\n\n" framing, the pull loop that hands out
 * buffered event bytes and asks the handler for the next job event, the
 * streaming response's headers, the non-streaming wait for a job's end, and
 * both APIs' usage objects from one job's token counts. Knows no other event
 * of either API. */
#ifndef HEARTH_SERVER_SSE_EVENTS_H
#define HEARTH_SERVER_SSE_EVENTS_H
#include "server/server.h"

/* Appends "event: <type>\ndata: <json>\n\n", type being o's "type" (o is
 * stolen). */
void sse_event(sbuf *out, json_t *o);

/* Event bytes not yet written to the connection. */
typedef struct sse_stream {
    sbuf out;
    size_t out_pos;
    int ended;  /* the last event is in out: once it is sent the stream ends */
    int failed; /* the stream broke: once out is sent the connection closes without its end */
} sse_stream;

/* Turns one job event into events appended to the stream (or sets ended). */
typedef void (*sse_on_event)(void *cls, const srv_event *ev);

/* The body of a stream reader (srv_respond_stream): copies up to max buffered bytes
 * into buf; when none are left, blocks on the job's next event and hands it to
 * on_event (every connection has its own thread). */
long sse_stream_read(sse_stream *ss, srv_job *job, sse_on_event on_event, void *cls, char *buf, size_t max);

/* The non-streaming path: hands each TOKEN event to on_token and returns after
 * the DONE event. */
void sse_wait_done(srv_job *job, sse_on_event on_token, void *cls);

/* Anthropic's usage of a job: input_tokens (the prompt tokens not read from the
 * prefix cache), cache_creation_input_tokens (0), cache_read_input_tokens,
 * output_tokens (0 when input_only). */
json_t *sse_usage_anthropic(const srv_job *job, int input_only);
/* The Responses API's usage of a finished job. */
json_t *sse_usage_responses(const srv_job *job);

#endif
