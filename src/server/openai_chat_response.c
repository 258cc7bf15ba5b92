/* openai_chat_response.c: the OpenAI response objects in mlx_lm.server's exact shapes and
 * key order (contract §4): completions, stream chunks, the usage event,
 * logprobs entries, request ids. Builds jansson values only; writing bytes is
 * json_out.c's job. */
#include "server/server.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void srv_make_id(char *out, size_t cap, const char *prefix) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) { /* fall back to the clock: ids need only be
                                                             unique-ish */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)((ts.tv_nsec >> (i % 4 * 8)) ^ (ts.tv_sec >> i) ^ i * 131);
    }
    b[6] = (b[6] & 0x0F) | 0x40; /* RFC 4122 version 4 */
    b[8] = (b[8] & 0x3F) | 0x80; /* variant 10 */
    snprintf(out, cap, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static json_t *usage_object(const srv_reply *r) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)r->prompt_tokens));
    json_object_set_new(u, "completion_tokens", json_integer((json_int_t)r->completion_tokens));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)(r->prompt_tokens + r->completion_tokens)));
    json_t *details = json_object();
    json_object_set_new(details, "cached_tokens", json_integer((json_int_t)r->cached_tokens));
    json_object_set_new(u, "prompt_tokens_details", details);
    return u;
}

static json_t *header(const srv_reply *r, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "system_fingerprint", json_string(r->fingerprint));
    json_object_set_new(o, "object", json_string(object));
    /* the model string came from a validated request, but may be any UTF-8 */
    json_t *model = json_string(r->model);
    json_object_set_new(o, "model", model ? model : json_string("default_model"));
    json_object_set_new(o, "created", json_integer(r->created));
    return o;
}

json_t *srv_reply_json(const srv_reply *r) {
    json_t *o = header(r, r->object);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "finish_reason", r->finish_reason ? json_string(r->finish_reason) : json_null());
    if (r->logprobs) json_object_set_new(choice, "logprobs", r->logprobs);
    const char *text = r->text ? r->text : "";
    if (r->kind == SRV_CHAT) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        if (!r->stream)
            json_object_set_new(m, "content", text[0] ? json_string(text) : json_null());
        else if (text[0])
            json_object_set_new(m, "content", json_string(text));
        if (r->reasoning && r->reasoning[0]) json_object_set_new(m, "reasoning", json_string(r->reasoning));
        if (r->tool_calls && json_array_size(r->tool_calls)) json_object_set(m, "tool_calls", r->tool_calls);
        json_object_set_new(choice, r->stream ? "delta" : "message", m);
    } else {
        json_object_set_new(choice, "text", json_string(text));
    }
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    if (r->with_usage) json_object_set_new(o, "usage", usage_object(r));
    return o;
}

json_t *srv_usage_json(const srv_reply *r) {
    json_t *o = header(r, "chat.completion"); /* upstream uses this object even
                                                 for text completions */
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_object(r));
    return o;
}

static json_t *piece_string(const hearth_model *m, int32_t id) {
    const char *p = hearth_token_piece(m, id);
    json_t *s = p ? json_string(p) : NULL;
    return s ? s : json_string(""); /* pieces that are not valid UTF-8 on their own */
}

/* jansson cannot hold non-finite reals; a -inf logprob (a token banned by
 * logit_bias) is reported as the lowest finite double instead of Python's
 * -Infinity. */
static json_t *logprob_real(float v) {
    return json_real(isfinite(v) ? (double)v : v < 0 ? -1.7976931348623157e308 : 0.0);
}

json_t *srv_logprob_entry(const hearth_model *m, int32_t token, const hearth_logprobs *lp, int top_n) {
    json_t *o = json_object();
    if (top_n <= 0) { /* logprobs: true: the sampled token's id and logprob only */
        json_object_set_new(o, "id", json_integer(token));
        json_object_set_new(o, "logprob", logprob_real(lp->logprob));
        return o;
    }
    int n = top_n < lp->n ? top_n : lp->n;
    json_t *top = json_array();
    for (int i = 0; i < n; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "id", json_integer(lp->top_ids[i]));
        json_object_set_new(t, "token", piece_string(m, lp->top_ids[i]));
        json_object_set_new(t, "logprob", logprob_real(lp->top_logprobs[i]));
        json_array_append_new(top, t);
    }
    /* the entry is the emitted token (upstream copies its first alternative, which is
     * another token whenever sampling did not pick the top one) */
    json_object_set_new(o, "id", json_integer(token));
    json_object_set_new(o, "token", piece_string(m, token));
    json_object_set_new(o, "logprob", logprob_real(lp->logprob));
    json_object_set_new(o, "top_logprobs", top);
    return o;
}
