/* generation.h: the part of a completion that every HTTP API shares (OpenAI
 * chat and text completions in openai_chat.c, Anthropic messages in anthropic.c):
 * checking a validated request against the model, rendering and tokenizing its
 * prompt, queuing the job, and feeding its token events through the
 * reasoning/tool text state machine. Knows no response shapes. */
#ifndef HEARTH_SERVER_GENERATION_H
#define HEARTH_SERVER_GENERATION_H
#include "server/server.h"
#include "server/textstate.h"

/* One queued generation as seen from the HTTP thread that started it. */
typedef struct srv_generation {
    srv_job *job;
    ts_parser *ts;
    ts_finish last_finish; /* of the last token fed */
    ts_tool_type tool;     /* the tool format its output is parsed with (tool_choice.h) */
} srv_generation;

typedef struct srv_gen_options {
    /* Accept any "model" name and echo it (Anthropic clients send their own model
     * names); otherwise a name that is not the served model is a 404. */
    int any_model;
    /* Stop strings end the generation where they appear in the decoded text, and
     * the text before them in the last token is kept (Anthropic's
     * stop_sequences). Otherwise mlx_lm.server's rule: token-level stop
     * sequences, the text state machine strips the strings from the visible text.
     */
    int text_stops;
    /* The request's names for its stop strings and token limit, for the errors that
     * name them (NULL: "stop", "max_tokens"). */
    const char *stop_field, *max_tokens_field;
    /* Optional (hearth_model_vocab_rows floats, alive until the job is done): the first
     * step's full log-probabilities (the lab's /signal). */
    float *first_logprobs;
} srv_gen_options;

/* Bounds on one request's work (docs/server.md, "Limits"): stop strings are matched
 * on every token, so their count and length bound each token's cost. */
#define SRV_MAX_STOP 64
#define SRV_MAX_STOP_BYTES 1024

/* Validates r against the served model, builds the prompt and queues the job.
 * Returns 0 (g->job and g->ts are set; r must outlive g) or -1 with e filled.
 */
int srv_generation_start(srv_server *s, const srv_request *r, const srv_gen_options *o, srv_generation *g,
                         srv_error *e);
/* Feeds one token event's text to g->ts, mapping the engine's finish reason. */
void srv_generation_feed(srv_generation *g, const srv_event *ev, const srv_gen_options *o);
/* Cancels the job if it still runs (the client went away) and frees g's parts.
 */
void srv_generation_free(srv_generation *g);

/* The token ids of a request's prompt (chat template or raw text), under the
 * render lock; *opens_think: the rendered chat prompt left a think block open.
 * Caller frees *ids with hearth_free. Checks emptiness and the context length.
 */
int srv_prompt_ids(srv_server *s, const srv_request *r, int32_t **ids, size_t *n, int *opens_think, srv_error *e);

/* Turns a job that failed before any token into an error (400 for the client's
 * fault, e.g. a prompt longer than the context; 500 otherwise). */
int srv_engine_error(const srv_job *j, srv_error *e);

#endif
