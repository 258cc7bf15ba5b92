/* sampler.h: turns one row of logits into the next token: logit bias, repetition /
 * presence / frequency penalties over a context window, temperature, top-k, top-p,
 * min-p, seeded sampling or greedy argmax, and log-probabilities with the top-N
 * alternatives. Buffers are allocated once per sampler (vocab-sized), never per token. */
#ifndef HEARTH_ENGINE_SAMPLER_H
#define HEARTH_ENGINE_SAMPLER_H
#include "hearth.h"
#include "base/threadpool.h"

#define SAMPLER_MAX_EXEMPT 16 /* the engine's end-of-sequence ids (at most 8) and a newline's */

typedef struct sampler {
    int vocab;
    float *work;      /* processed logits */
    float work_lse;   /* their logsumexp, once work_lse_ok (reset when work changes) */
    int work_lse_ok;
    int32_t *cand;    /* candidate ids */
    int32_t *counts;  /* per-id counts in the penalty window */
    float *shaped;    /* the lab's curve / HLG output (sampler_lab.c) */
    uint32_t *sort_buf; /* [3 * vocab]: the candidate sort's keys, their copy and an id copy */
    uint64_t rng[4];  /* xoshiro256** state */
    int32_t xtc_exempt[SAMPLER_MAX_EXEMPT]; /* ids XTC never drops (newline, end of sequence) */
    int n_xtc_exempt;
} sampler;

hearth_status sampler_init(sampler *s, int vocab, hearth_error *err);
void sampler_free(sampler *s);
/* Bytes sampler_init allocates for this vocabulary (for fit predictions). */
size_t sampler_bytes(int vocab);
void sampler_seed(sampler *s, uint64_t seed);
/* The ids XTC must keep (mlx_lm.server: the encoded "\n" and the end-of-sequence ids);
 * ids beyond SAMPLER_MAX_EXEMPT are ignored. */
void sampler_set_xtc_exempt(sampler *s, const int32_t *ids, int n);
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

/* The distribution sampler_sample draws from, with XTC counted as firing whenever
 * p->xtc_probability > 0: probs[0..vocab) gets each token's probability (0 when filtered
 * out); returns the number kept. For checking the lab's stages against mlx-lm. */
int sampler_distribution(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                         size_t n_history, double *probs);

/* ---- the sampling lab's stages (sampler_lab.c) ---- */
/* Whether p uses a stage the device sampler lacks (curve, HLG, XTC). */
int sampler_lab_active(const hearth_sampling *p);
/* Curve or HLG on the log-probabilities of x[0..V) into out (monotone: order kept, -inf
 * stays -inf); returns 1 when a stage ran (the draw is then at temperature 1), else 0
 * (out untouched). */
int sampler_shape(const float *x, int V, const hearth_sampling *p, float *out);
/* PCHIP tangents of c (m[c->n_points]) and the curve's value at l (nats). */
void sampler_curve_tangents(const hearth_curve *c, double *m);
double sampler_curve_eval(const hearth_curve *c, const double *m, double l);
/* The HLG tone curve g(z) at centred log-probability z with mid slope gain. */
double sampler_hlg_eval(const hearth_hlg *h, double gain, double z);
/* XTC on the candidates cand[0..n) (sorted by x descending, x at temperature 1): drops
 * every candidate whose renormalised probability exceeds that of the least likely one
 * above threshold, exempt ids kept; compacts cand, returns the new n. */
int sampler_xtc_cut(const float *x, int32_t *cand, int n, float threshold, const int32_t *exempt, int n_exempt);

/* One row of a batched sampling pass: sampler_sample's arguments, and its result. */
typedef struct sampler_row {
    sampler *s; /* the row's own: its buffers and its seeded RNG (rows must not share one) */
    const float *logits;
    const hearth_sampling *p;
    const int32_t *history;
    size_t n_history;
    hearth_logprobs *lp; /* may be NULL */
    float *full_logprobs; /* may be NULL: gets the log-softmax of the processed logits */
    int32_t token;       /* out */
} sampler_row;
/* Samples every row in one pass, rows spread over the pool's threads when n > 1. Each
 * row's token and log-probabilities are exactly what sampler_sample gives it alone. */
void sampler_sample_rows(sampler_row *rows, int n, threadpool *tp);
#endif
