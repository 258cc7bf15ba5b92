/* scheduler.c: continuous batching (hearth_batch_*): requests wait in FIFO order until
 * a sequence slot and the KV blocks for prompt + max_tokens are free, then every step
 * packs one token per decoding request plus prompt chunks under the step budget into a
 * single engine_forward_rows call and samples each row through the request's own
 * gen_stream and slot sampler. Owns no model or text logic; single-threaded by design. */
#include "engine/scheduler.h"
#include "base/err.h"
#include "engine/engine_internal.h"
#include <stdlib.h>
#include <string.h>

typedef struct sched_req {
    hearth_batch_request r;
    gen_stream g;
    int seq;          /* engine slot once admitted */
    size_t prefilled; /* prompt tokens in the KV cache */
    int len;          /* tokens in the KV cache: prompt + generated ones fed back */
    int32_t next;     /* sampled token to feed at the next step (when decoding) */
    int decoding;
    double t0, t1;    /* admitted; prompt done */
    struct sched_req *next_waiting;
} sched_req;

struct hearth_batch {
    hearth_engine *e;
    sched_req *wait_head, *wait_tail;
    size_t n_waiting;
    sched_req **run; /* [max_run], admission order */
    int n_run, max_run, budget;
    int32_t *tok, *pos, *slot, *out_rows; /* [budget] */
    int *out_of;                          /* [max_run]: logits row of each running request, -1 none */
    size_t *remaining;                    /* [max_run] */
    int *take;                            /* [max_run] */
};

int sched_pack(const size_t *remaining, int n, int budget, int *take) {
    int used = 0;
    for (int i = 0; i < n; i++) {
        take[i] = 0;
        if (remaining[i] == 0 && used < budget) take[i] = 1, used++;
    }
    for (int i = 0; i < n && used < budget; i++)
        if (remaining[i] > 0) {
            size_t k = remaining[i] < (size_t)(budget - used) ? remaining[i] : (size_t)(budget - used);
            take[i] = (int)k;
            used += (int)k;
        }
    return used;
}

int sched_blocks_needed(size_t n_prompt, int max_tokens, int context) {
    size_t pos = n_prompt + (size_t)(max_tokens > 0 ? max_tokens : 0);
    if (pos > (size_t)context) pos = (size_t)context;
    return (int)((pos + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
}

hearth_status hearth_batch_create(hearth_engine *e, hearth_batch **out, hearth_error *err) {
    *out = NULL;
    int max_run = engine_max_sequences(e), budget = engine_step_tokens(e);
    if (max_run > budget)
        return err_set(err, HEARTH_ERR_INVALID,
                       "batching: %d sequences need a step budget of at least %d tokens (max_step_tokens is %d)",
                       max_run, max_run, budget);
    if (max_run > engine_max_out_rows(e))
        return err_set(err, HEARTH_ERR_INVALID, "batching: the engine returns %d logits rows, %d sequences need more",
                       engine_max_out_rows(e), max_run);
    hearth_batch *b = calloc(1, sizeof *b);
    if (!b) return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    b->e = e;
    b->max_run = max_run;
    b->budget = budget;
    b->run = calloc((size_t)max_run, sizeof *b->run);
    b->tok = malloc((size_t)budget * sizeof *b->tok);
    b->pos = malloc((size_t)budget * sizeof *b->pos);
    b->slot = malloc((size_t)budget * sizeof *b->slot);
    b->out_rows = malloc((size_t)budget * sizeof *b->out_rows);
    b->out_of = malloc((size_t)max_run * sizeof *b->out_of);
    b->remaining = malloc((size_t)max_run * sizeof *b->remaining);
    b->take = malloc((size_t)max_run * sizeof *b->take);
    if (!b->run || !b->tok || !b->pos || !b->slot || !b->out_rows || !b->out_of || !b->remaining || !b->take) {
        hearth_batch_free(b);
        return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    }
    *out = b;
    return HEARTH_OK;
}

/* Ends a request: its slot and KV blocks go back at once, then the caller hears of it
 * (after which it may free what the request pointed to). */
static void req_done(hearth_batch *b, sched_req *q, hearth_status st, const hearth_error *err) {
    if (q->seq >= 0) {
        hearth_seq_close(b->e, q->seq);
        if (q->t1 > 0) q->r.result->generate_seconds = gen_now_seconds() - q->t1;
    }
    if (q->g.ds) gen_stream_free(&q->g);
    if (q->r.on_done) q->r.on_done(q->r.user, st, err);
    free(q);
}

/* Removes running request i (keeping admission order) and ends it. */
static void run_done(hearth_batch *b, int i, hearth_status st, const hearth_error *err) {
    sched_req *q = b->run[i];
    memmove(b->run + i, b->run + i + 1, (size_t)(b->n_run - i - 1) * sizeof *b->run);
    b->n_run--;
    req_done(b, q, st, err);
}

void hearth_batch_free(hearth_batch *b) {
    if (!b) return;
    while (b->n_run > 0) {
        b->run[b->n_run - 1]->r.result->finish = HEARTH_FINISH_CANCELLED;
        run_done(b, b->n_run - 1, HEARTH_OK, NULL);
    }
    while (b->wait_head) {
        sched_req *q = b->wait_head;
        b->wait_head = q->next_waiting;
        q->r.result->finish = HEARTH_FINISH_CANCELLED;
        req_done(b, q, HEARTH_OK, NULL);
    }
    free(b->run);
    free(b->tok);
    free(b->pos);
    free(b->slot);
    free(b->out_rows);
    free(b->out_of);
    free(b->remaining);
    free(b->take);
    free(b);
}

hearth_status hearth_batch_submit(hearth_batch *b, const hearth_batch_request *r, hearth_error *err) {
    if (!r->prompt || !r->params || !r->result) return err_set(err, HEARTH_ERR_INVALID, "batching: incomplete request");
    sched_req *q = calloc(1, sizeof *q);
    if (!q) return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    q->r = *r;
    q->seq = -1;
    hearth_status st = gen_stream_init(&q->g, b->e, r->n_prompt, r->params, r->on_token, r->user, r->result, err);
    if (st) {
        free(q);
        return st;
    }
    if (b->wait_tail)
        b->wait_tail->next_waiting = q;
    else
        b->wait_head = q;
    b->wait_tail = q;
    b->n_waiting++;
    return HEARTH_OK;
}

size_t hearth_batch_waiting(const hearth_batch *b) { return b->n_waiting; }
size_t hearth_batch_running(const hearth_batch *b) { return (size_t)b->n_run; }

static sched_req *pop_waiting(hearth_batch *b) {
    sched_req *q = b->wait_head;
    b->wait_head = q->next_waiting;
    if (!b->wait_head) b->wait_tail = NULL;
    q->next_waiting = NULL;
    b->n_waiting--;
    return q;
}

static void drop_cancelled(hearth_batch *b) {
    for (sched_req **pp = &b->wait_head, *prev = NULL; *pp;) {
        sched_req *q = *pp;
        if (q->r.is_cancelled && q->r.is_cancelled(q->r.user)) {
            *pp = q->next_waiting;
            if (b->wait_tail == q) b->wait_tail = prev;
            b->n_waiting--;
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            req_done(b, q, HEARTH_OK, NULL);
        } else {
            prev = q;
            pp = &q->next_waiting;
        }
    }
    for (int i = b->n_run - 1; i >= 0; i--) {
        sched_req *q = b->run[i];
        if (q->r.is_cancelled && q->r.is_cancelled(q->r.user)) {
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            run_done(b, i, HEARTH_OK, NULL);
        }
    }
}

/* Admits waiting requests in FIFO order while a slot and their KV blocks are free; the
 * head that does not fit yet blocks the ones behind it (no overtaking, so no starvation). */
static void admit(hearth_batch *b) {
    kv_cache *kv = engine_kv(b->e);
    int ctx = hearth_engine_context_length(b->e);
    while (b->wait_head && b->n_run < b->max_run) {
        sched_req *q = b->wait_head;
        const hearth_generate_params *p = q->r.params;
        int need = sched_blocks_needed(q->r.n_prompt, p->max_tokens, ctx);
        hearth_error err = {0};
        if (need > kv->n_blocks) {
            pop_waiting(b);
            /* the caller's to fix (a smaller max_tokens), so INVALID: the server answers 400 */
            err_set(&err, HEARTH_ERR_INVALID,
                    "the request needs %d KV blocks (%zu prompt tokens + max_tokens %d) but the KV pool holds %d",
                    need, q->r.n_prompt, p->max_tokens, kv->n_blocks);
            req_done(b, q, HEARTH_ERR_INVALID, &err);
            continue;
        }
        if (need > kv->n_free) break;
        hearth_status st = hearth_seq_open(b->e, &q->seq, &err);
        if (!st) {
            int positions = (int)(q->r.n_prompt + (size_t)p->max_tokens < (size_t)ctx
                                      ? q->r.n_prompt + (size_t)p->max_tokens : (size_t)ctx);
            st = kv_reserve(kv, q->seq, positions, &err);
        }
        pop_waiting(b);
        if (st) {
            req_done(b, q, st, &err);
            continue;
        }
        q->t0 = gen_now_seconds();
        if (p->sampling.has_seed) sampler_seed(engine_slot_sampler(b->e, q->seq), p->sampling.seed);
        b->run[b->n_run++] = q;
        if (p->on_progress && p->on_progress(q->r.user, 0, q->r.n_prompt)) {
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            run_done(b, b->n_run - 1, HEARTH_OK, NULL);
        }
    }
}

size_t hearth_batch_step(hearth_batch *b) {
    drop_cancelled(b);
    admit(b);
    if (b->n_run == 0) return b->n_waiting;
    for (int i = 0; i < b->n_run; i++)
        b->remaining[i] = b->run[i]->decoding ? 0 : b->run[i]->r.n_prompt - b->run[i]->prefilled;
    int T = sched_pack(b->remaining, b->n_run, b->budget, b->take), t = 0, n_out = 0;
    for (int i = 0; i < b->n_run; i++) {
        sched_req *q = b->run[i];
        b->out_of[i] = -1;
        if (!b->take[i]) continue;
        if (q->decoding) {
            b->tok[t] = q->next, b->pos[t] = q->len, b->slot[t] = q->seq;
            b->out_of[i] = n_out, b->out_rows[n_out++] = t++;
            continue;
        }
        for (int k = 0; k < b->take[i]; k++, t++)
            b->tok[t] = q->r.prompt[q->prefilled + k], b->pos[t] = (int32_t)q->prefilled + k, b->slot[t] = q->seq;
        if (q->prefilled + b->take[i] == q->r.n_prompt) b->out_of[i] = n_out, b->out_rows[n_out++] = t - 1;
    }
    const float *logits = NULL;
    hearth_error err = {0};
    hearth_status st = engine_forward_rows(b->e, T, b->tok, b->pos, b->slot, n_out, b->out_rows, &logits, &err);
    size_t vocab = (size_t)hearth_model_vocab_rows(b->e);
    /* walk backwards so finishing request i does not move the ones still to visit */
    for (int i = b->n_run - 1; i >= 0; i--) {
        sched_req *q = b->run[i];
        if (!b->take[i]) continue;
        if (st) {
            run_done(b, i, st, &err);
            continue;
        }
        hearth_generate_result *res = q->r.result;
        const hearth_generate_params *p = q->r.params;
        if (!q->decoding) {
            q->prefilled += (size_t)b->take[i];
            q->len += b->take[i];
            size_t n = q->r.n_prompt;
            if (p->on_progress && p->on_progress(q->r.user, q->prefilled < n ? q->prefilled : n - 1, n)) {
                res->finish = HEARTH_FINISH_CANCELLED;
                res->prompt_seconds = gen_now_seconds() - q->t0;
                run_done(b, i, HEARTH_OK, NULL);
                continue;
            }
            if (q->prefilled < n) continue;
            q->t1 = gen_now_seconds();
            res->prompt_seconds = q->t1 - q->t0;
        } else {
            q->len++;
        }
        const float *row = logits + (size_t)b->out_of[i] * vocab;
        q->next = gen_stream_step(&q->g, engine_slot_sampler(b->e, q->seq), row, q->seq, q->len, q->t0);
        q->decoding = 1;
        if (res->finish) run_done(b, i, HEARTH_OK, NULL);
    }
    return b->n_waiting + (size_t)b->n_run;
}
