/* sse_events.c: the event-stream plumbing shared by the Anthropic Messages and
 * OpenAI Responses handlers (see sse_events.h): event framing, the pull loop
 * of a stream, the wait for a job's end and the usage
 * objects. Runs on HTTP threads; never calls the engine directly. */
#include "server/sse_events.h"
#include <stdlib.h>
#include <string.h>

void sse_event(sbuf *out, json_t *o) {
    if (!o) return;
    const char *type = json_string_value(json_object_get(o, "type"));
    sbuf_printf(out, "event: %s\ndata: ", type ? type : "message");
    srv_json_write(out, o);
    sbuf_puts(out, "\n\n");
    json_decref(o);
}

long sse_stream_read(sse_stream *ss, srv_job *job, sse_on_event on_event, void *cls, char *buf, size_t max) {
    while (ss->out_pos == ss->out.len) {
        sbuf_reset(&ss->out);
        ss->out_pos = 0;
        if (ss->ended) return SRV_STREAM_END;
        if (ss->failed) return SRV_STREAM_ERROR;
        srv_event *ev = srv_job_next_event(job);
        on_event(cls, ev);
        free(ev);
        if (ss->out.oom) return SRV_STREAM_ERROR;
    }
    size_t n = ss->out.len - ss->out_pos < max ? ss->out.len - ss->out_pos : max;
    memcpy(buf, ss->out.data + ss->out_pos, n);
    ss->out_pos += n;
    return (long)n;
}

void sse_wait_done(srv_job *job, sse_on_event on_token, void *cls) {
    for (;;) {
        srv_event *ev = srv_job_next_event(job);
        srv_event_kind k = ev->kind;
        if (k == SRV_EV_TOKEN) on_token(cls, ev);
        free(ev);
        if (k == SRV_EV_DONE) return;
    }
}

/* ---- usage ------------------------------------------------------------------ */

/* cached_tokens is set when the batch admits the job, before its first event:
 * read after any event (or DONE), it is final. Never more than the prompt. */
static json_int_t cached_of(const srv_job *job) {
    size_t cached = job->result.cached_tokens;
    return (json_int_t)(cached < job->n_ids ? cached : job->n_ids);
}

json_t *sse_usage_anthropic(const srv_job *job, int input_only) {
    json_int_t cached = cached_of(job), out = input_only ? 0 : (json_int_t)job->result.completion_tokens;
    /* Anthropic splits the prompt: input_tokens is what was not read from the cache and
     * input_tokens + cache_creation_input_tokens + cache_read_input_tokens is the whole
     * prompt (count_tokens' number). hearth's prefix cache is automatic and costs no
     * explicit write, so nothing is reported as cache creation. */
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)job->n_ids - cached,
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens", cached, "output_tokens",
                     out);
}

json_t *sse_usage_responses(const srv_job *job) {
    /* OpenAI's input_tokens is the whole prompt; cached_tokens is the prefix cache's part of it */
    json_int_t in = (json_int_t)job->n_ids, out = (json_int_t)job->result.completion_tokens;
    return json_pack("{s:I,s:{s:I,s:i},s:I,s:{s:i},s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     cached_of(job), "cache_write_tokens", 0, "output_tokens", out, "output_tokens_details",
                     "reasoning_tokens", 0, "total_tokens", in + out);
}
