/* sampler.h: turns one row of logits into the next token: logit bias, repetition /
 * presence / frequency penalties over a context window, temperature, top-k, top-p,
 * min-p, seeded sampling or greedy argmax, and log-probabilities with the top-N
 * alternatives. Buffers are allocated once per sampler (vocab-sized), never per token. */
#ifndef HEARTH_ENGINE_SAMPLER_H
#define HEARTH_ENGINE_SAMPLER_H
#include "hearth.h"
#include "base/threadpool.h"

typedef struct sampler {
    int vocab;
    float *work;      /* processed logits */
    int32_t *cand;    /* candidate ids */
    int32_t *counts;  /* per-id counts in the penalty window */
    uint64_t rng[4];  /* xoshiro256** state */
} sampler;

hearth_status sampler_init(sampler *s, int vocab, hearth_error *err);
void sampler_free(sampler *s);
/* Bytes sampler_init allocates for this vocabulary (for fit predictions). */
size_t sampler_bytes(int vocab);
void sampler_seed(sampler *s, uint64_t seed);
/* Picks the next token from logits (not modified). history: the sequence so far
 * (prompt + generated) for the penalties. Fills lp (if not NULL) with the chosen
 * token's log-probability and the top lp->n alternatives (n <= HEARTH_MAX_TOP_LOGPROBS). */
int32_t sampler_sample(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                       size_t n_history, hearth_logprobs *lp);

/* The tokens sampler_sample would draw from (every filter applied; the argmax alone at
 * temperature 0): returns n with their ids in s->cand[0..n) in the sampler's order (value
 * descending, lower id first), and the processed logits (bias, penalties) in s->work. For
 * checking other samplers (the GPU's) against this one. */
int sampler_survivors(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                      size_t n_history);

/* One row of a batched sampling pass: sampler_sample's arguments, and its result. */
typedef struct sampler_row {
    sampler *s; /* the row's own: its buffers and its seeded RNG (rows must not share one) */
    const float *logits;
    const hearth_sampling *p;
    const int32_t *history;
    size_t n_history;
    hearth_logprobs *lp; /* may be NULL */
    int32_t token;       /* out */
} sampler_row;
/* Samples every row in one pass, rows spread over the pool's threads when n > 1. Each
 * row's token and log-probabilities are exactly what sampler_sample gives it alone. */
void sampler_sample_rows(sampler_row *rows, int n, threadpool *tp);
#endif
