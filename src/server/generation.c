/* generation.c: what every completion-style endpoint shares between a validated
 * request and its token events: model and vocabulary checks, prompt rendering
 * and tokenizing, sampling parameters, stop handling, queuing, and feeding
 * tokens to the text state machine. Runs on HTTP threads; builds no response
 * bodies. */
#include "server/generation.h"
#include "server/adapters.h"
#include "server/tool_choice.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int srv_prompt_ids(srv_server *s, const srv_request *r, int32_t **ids, size_t *n, int *opens_think, srv_error *e) {
    hearth_error err = {0};
    char *prompt = NULL;
    hearth_status st = HEARTH_OK;
    *ids = NULL;
    *n = 0;
    *opens_think = 0;
    pthread_mutex_lock(&s->render_mu);
    if (r->kind == SRV_CHAT) {
        char *msgs = json_dumps(r->messages, JSON_COMPACT);
        char *tools = r->tools ? json_dumps(r->tools, JSON_COMPACT) : NULL;
        /* mlx-lm's TokenizerWrapper.apply_chat_template: enable_thinking, unless given, is
         * whether the model has thinking markers (Gemma 4's template reads it) */
        json_t *kwargs = json_copy(r->template_kwargs);
        if (kwargs && !json_object_get(kwargs, "enable_thinking"))
            json_object_set_new(kwargs, "enable_thinking", json_boolean(((const ts_config *)s->text_config)->think_start[0] != 0));
        char *extra = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL;
        json_decref(kwargs);
        st = hearth_chat_render(s->model, msgs, tools, 1, extra, &prompt, &err);
        free(msgs);
        free(tools);
        free(extra);
        if (!st) st = hearth_tokenize(s->model, prompt, strlen(prompt), 0, ids, n, &err);
        if (!st) *opens_think = ts_prompt_opens_think(s->text_config, prompt, strlen(prompt));
    } else {
        st = hearth_tokenize(s->model, r->prompt, strlen(r->prompt), 1, ids, n, &err);
    }
    pthread_mutex_unlock(&s->render_mu);
    hearth_free(prompt);
    const char *field = r->kind == SRV_CHAT ? "messages" : "prompt";
    if (st) return srv_fail(e, 400, "invalid_request_error", field, NULL, "%s", err.message);
    if (*n == 0) return srv_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty");
    /* checked here, not by the engine, so a stream gets a 400 instead of a cut
     * 200 */
    if (*n >= (size_t)s->context_length)
        return srv_fail(e, 400, "invalid_request_error", field, "context_length_exceeded",
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
    /* a window of 0 is every token so far upstream (Python's tokens[-0:]) */
    sp->repetition_context_size = r->repetition_context_size ? r->repetition_context_size : INT_MAX;
    sp->presence_context_size = r->presence_context_size ? r->presence_context_size : INT_MAX;
    sp->frequency_context_size = r->frequency_context_size ? r->frequency_context_size : INT_MAX;
    sp->presence_penalty = r->presence_penalty;
    sp->frequency_penalty = r->frequency_penalty;
    sp->has_seed = r->has_seed;
    sp->seed = r->seed;
    sp->bias_ids = r->bias_ids;
    sp->bias_values = r->bias_values;
    sp->n_bias = r->n_bias;
    sp->xtc_probability = r->xtc_probability;
    sp->xtc_threshold = r->xtc_threshold;
    sp->hlg = r->hlg;
    sp->curve = r->curve;
    /* logprobs: true needs the chosen token's logprob, which the engine reports
     * with n >= 1 */
    sp->top_logprobs = r->top_logprobs > 0 ? r->top_logprobs : r->logprobs ? 1 : 0;
    p->max_tokens = r->max_tokens;
    p->num_draft_tokens = r->num_draft_tokens;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
    p->trim_leading_space = 1;
    p->constraint = r->constraint;
    p->constraint_text = r->constraint_text;
    p->constraint_len = r->constraint_text ? strlen(r->constraint_text) : 0;
}

/* The limits on a request's work, each refused with a 400 that names it. */
static int check_limits(srv_server *s, const srv_request *r, const srv_gen_options *o, srv_error *e) {
    const char *stop = o->stop_field ? o->stop_field : "stop";
    if (r->n_stop > SRV_MAX_STOP)
        return srv_fail(e, 400, "invalid_request_error", stop, "too_many_stop_strings",
                        "%s has %zu strings; the limit is %d", stop, r->n_stop, SRV_MAX_STOP);
    for (size_t i = 0; i < r->n_stop; i++)
        if (strlen(r->stop[i]) > SRV_MAX_STOP_BYTES)
            return srv_fail(e, 400, "invalid_request_error", stop, "stop_string_too_long",
                            "%s[%zu] is %zu bytes long; the limit is %d bytes", stop, i, strlen(r->stop[i]),
                            SRV_MAX_STOP_BYTES);
    /* ids are checked against the vocabulary below; "1" and "01" are two keys for one id */
    if (r->n_bias > (size_t)hearth_vocab_size(s->model))
        return srv_fail(e, 400, "invalid_request_error", "logit_bias", "logit_bias_too_large",
                        "logit_bias has %zu entries; the limit is the vocabulary size (%d)", r->n_bias,
                        hearth_vocab_size(s->model));
    return 0;
}

/* A request that could never run: its prompt and max_tokens need more KV blocks than
 * the whole pool has. Refused here, before any stream starts, instead of when its turn
 * in the queue comes. */
static int check_fits(srv_server *s, size_t n_prompt, int max_tokens, const srv_gen_options *o, srv_error *e) {
    int need = hearth_engine_kv_blocks_needed(s->engine, n_prompt, max_tokens);
    int have = hearth_engine_kv_blocks(s->engine, NULL);
    if (need <= have) return 0;
    const char *field = o->max_tokens_field ? o->max_tokens_field : "max_tokens";
    /* max_tokens is the asked-for value; the blocks count what the context lets it use */
    return srv_fail(e, 400, "invalid_request_error", field, "kv_pool_exceeded",
                    "the request needs %d KV blocks (%zu prompt tokens + %s %d, within the %d-token context) but the "
                    "KV pool holds %d (%d positions): lower %s, or start the server with a larger --kv-blocks / "
                    "--kv-budget",
                    need, n_prompt, field, max_tokens, s->context_length, have, have * 16, field);
}

static int check_request(srv_server *s, const srv_request *r, const srv_gen_options *o, char *spec, size_t cap,
                         srv_error *e) {
    int named = srv_adapter_spec(s, r, spec, cap, e); /* first: a model may name an adapter */
    if (named < 0) return -1;
    if (!o->any_model && named != 2 && !srv_model_matches(s, r->model))
        return srv_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                        "The model '%s' is not served here: this server serves "
                        "'%s' (or use \"default_model\"); "
                        "loading other models per request is not supported",
                        r->model, hearth_model_path(s->model));
    /* mlx-lm validates the threshold inside apply_xtc (a failed generation there); a 400 here */
    if (r->xtc_probability > 0 && r->xtc_threshold > 0.5f)
        return srv_fail(e, 400, "invalid_request_error", "xtc_threshold", NULL,
                        "xtc_threshold must be at most 0.5 when xtc_probability is above 0 (got %g)",
                        (double)r->xtc_threshold);
    for (size_t i = 0; i < r->n_bias; i++)
        if (r->bias_ids[i] >= hearth_vocab_size(s->model))
            return srv_fail(e, 400, "invalid_request_error", "logit_bias", NULL,
                            "logit_bias: token id %d is outside the vocabulary (%d tokens)", r->bias_ids[i],
                            hearth_vocab_size(s->model));
    if (check_limits(s, r, o, e)) return -1;
    if (r->top_k >= hearth_vocab_size(s->model))
        return srv_fail(e, 400, "invalid_request_error", "top_k", NULL,
                        "top_k must be less than the vocabulary size (%d)", hearth_vocab_size(s->model));
    return 0;
}

/* mlx_lm.server stops at token level: each stop string encoded without special
 * tokens and matched against the generated ids. Fills seqs/lens (caller frees).
 */
static size_t stop_token_seqs(srv_server *s, const srv_request *r, int32_t **seqs, size_t *lens) {
    size_t n_seqs = 0;
    for (size_t i = 0; i < r->n_stop; i++) {
        hearth_error err = {0};
        int32_t *sid = NULL;
        size_t sn = 0;
        if (hearth_tokenize(s->model, r->stop[i], strlen(r->stop[i]), 0, &sid, &sn, &err) == HEARTH_OK && sn) {
            seqs[n_seqs] = sid;
            lens[n_seqs++] = sn;
        } else {
            hearth_free(sid);
        }
    }
    return n_seqs;
}

int srv_generation_start(srv_server *s, const srv_request *r, const srv_gen_options *o, srv_generation *g,
                         srv_error *e) {
    memset(g, 0, sizeof *g);
    char spec[512];
    if (check_request(s, r, o, spec, sizeof spec, e)) return -1;
    int32_t *ids = NULL;
    size_t n = 0;
    int opens_think = 0;
    if (srv_prompt_ids(s, r, &ids, &n, &opens_think, e) || check_fits(s, n, r->max_tokens, o, e)) {
        hearth_free(ids);
        return -1;
    }
    /* a forced tool call: its constraint, and the tool format its output is parsed with */
    const ts_config *text_config = r->force_tool ? s->forced_text_config : s->text_config;
    char *tool_doc = NULL;
    if (r->force_tool && srv_tool_constraint(r, text_config, &tool_doc, e)) {
        hearth_free(ids);
        return -1;
    }
    hearth_error err = {0};
    /* with engine-level text stops the strings never reach the text, so the state
     * machine need not hold anything back for them */
    g->ts = ts_new(text_config, o->text_stops ? NULL : (const char *const *)r->stop, o->text_stops ? 0 : r->n_stop,
                   r->kind == SRV_CHAT && opens_think, &err);
    g->tool = text_config->tool;
    hearth_generate_params p;
    fill_params(r, &p);
    if (tool_doc) {
        p.constraint = HEARTH_CONSTRAINT_TOOL_CALL;
        p.constraint_text = tool_doc;
        p.constraint_len = strlen(tool_doc);
    }
    /* the constraint compiled here, on this request's thread, into the engine's cache: the
     * engine thread finds it ready instead of compiling it between two steps */
    if (p.constraint != HEARTH_CONSTRAINT_NONE && s->engine &&
        hearth_constraint_prepare(s->engine, p.constraint, p.constraint_text, p.constraint_len, &err)) {
        free(tool_doc);
        hearth_free(ids);
        srv_generation_free(g);
        int oom = err.status == HEARTH_ERR_NOMEM;
        return srv_fail(e, oom ? 500 : 400, oom ? "server_error" : "invalid_request_error",
                        r->force_tool ? "tool_choice" : NULL, NULL, "%s", err.message);
    }
    p.first_logprobs = o->first_logprobs;
    p.adapter = spec[0] ? spec : NULL;
    size_t n_seqs = 0, cap = r->n_stop ? r->n_stop : 1;
    int32_t **seqs = calloc(cap, sizeof *seqs);
    size_t *lens = calloc(cap, sizeof *lens);
    if (!o->text_stops) {
        if (seqs && lens) n_seqs = stop_token_seqs(s, r, seqs, lens);
        p.stop = NULL; /* no text-level stop in the engine: the state machine strips
                          them */
        p.n_stop = 0;
    }
    p.stop_token_seqs = (const int32_t *const *)seqs;
    p.stop_token_lens = lens;
    p.n_stop_token_seqs = n_seqs;
    /* the job owns ids from here (freed with free(), so copy out of hearth's
     * allocation) */
    int32_t *own = malloc((n ? n : 1) * sizeof *own);
    if (own) memcpy(own, ids, n * sizeof *own);
    hearth_free(ids);
    /* no more than the context leaves after the prompt (srv_prompt_ids checked it has room) */
    if (p.max_tokens > s->context_length - (int)n) p.max_tokens = s->context_length - (int)n;
    g->job = g->ts && own && seqs && lens ? srv_job_new(own, n, &p) : NULL; /* copies the stop ids */
    free(tool_doc);
    for (size_t i = 0; i < n_seqs; i++) hearth_free(seqs[i]);
    free(seqs);
    free(lens);
    if (!g->job) {
        free(own);
        srv_generation_free(g);
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    /* parallel calls off, the model free to call or not: its first call ends the turn */
    if (r->single_tool_call && !r->force_tool && r->tools)
        g->job->watch_calls = ts_call_watch_init(&g->job->call_watch, text_config);
    srv_queue_submit(s->queue, g->job);
    return 0;
}

void srv_generation_feed(srv_generation *g, const srv_event *ev, const srv_gen_options *o) {
    hearth_error err = {0};
    size_t len = strlen(ev->text);
    if (ev->call_ended) { /* the text closes the first tool call: all of it counts */
        ts_feed(g->ts, ev->text, len, TS_FINISH_NONE, &err);
        g->last_finish = TS_FINISH_STOP;
        ts_feed(g->ts, "", 0, TS_FINISH_STOP, &err);
        return;
    }
    switch (ev->finish) {
    case HEARTH_FINISH_STOP_STRING:
        if (o->text_stops) { /* the text before the stop string is part of the
                                answer */
            ts_feed(g->ts, ev->text, len, TS_FINISH_NONE, &err);
            len = 0;
        }
        /* fall through */
    case HEARTH_FINISH_EOS:
        /* Otherwise the terminating token's text (an EOS flush, or what preceded a
         * stop string inside the final token) is dropped with the held-back buffer,
         * as upstream's token-level stop does. */
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
}

void srv_generation_free(srv_generation *g) {
    if (g->job) {
        atomic_store(&g->job->cancel, 1); /* a client that left stops the generation */
        srv_job_release(g->job);
    }
    ts_free(g->ts);
    memset(g, 0, sizeof *g);
}

int srv_engine_error(const srv_job *j, srv_error *e) {
    /* NOT_FOUND: its adapter was unmounted between the request's check and its turn */
    if (j->status == HEARTH_ERR_NOT_FOUND)
        return srv_fail(e, 400, "invalid_request_error", "adapter", "adapter_not_found", "%s", j->err.message);
    int client = j->status == HEARTH_ERR_INVALID;
    return srv_fail(e, client ? 400 : 500, client ? "invalid_request_error" : "server_error", NULL,
                    client ? "context_length_exceeded" : NULL, "%s", j->err.message);
}
