/* tiny_model_path.h: the tiny models tools/make_tiny_models.py writes (HEARTH_CACHE, else
 * ~/.cache/hearth, then tiny/<name>) for the unit tests that run one, and what those
 * tests share: opening one, greedy parameters, and a recorder of a request's tokens and
 * end (the callbacks of hearth_generate and hearth_batch). Test code only; include after
 * cmocka.h. */
#ifndef HEARTH_TESTS_TINY_MODEL_PATH_H
#define HEARTH_TESTS_TINY_MODEL_PATH_H
#include "hearth.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void tiny_model_path(char *path, size_t cap, const char *name) {
    const char *cache = getenv("HEARTH_CACHE");
    if (cache)
        snprintf(path, cap, "%s/tiny/%s", cache, name);
    else
        snprintf(path, cap, "%s/.cache/hearth/tiny/%s", getenv("HOME") ? getenv("HOME") : "", name);
}

#ifdef cmocka_unit_test
/* A tiny model by name; fails the test when it is missing. */
static inline hearth_model *open_tiny(const char *name) {
    char path[1024];
    tiny_model_path(path, sizeof path, name);
    hearth_model *m = NULL;
    hearth_error err = {0};
    if (hearth_model_open(path, &m, &err))
        fail_msg("tiny model missing (%s): %s; run tools/make_tiny_models.py", path, err.message);
    return m;
}
#endif

/* Greedy decoding of exactly max_tokens tokens (EOS ignored) with each token's logprob
 * and the top top_logprobs. */
static inline hearth_generate_params greedy_params(int max_tokens, int top_logprobs) {
    hearth_generate_params p;
    memset(&p, 0, sizeof p);
    hearth_sampling_defaults(NULL, &p.sampling);
    p.sampling.top_logprobs = top_logprobs;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    return p;
}

/* What a request produced: its first REC_MAX tokens with their logprobs (and up to REC_TOP
 * top alternatives), how often it ended and how; cancel_after / cancel_now cancel it. */
#define REC_MAX 512
#define REC_TOP 5
typedef struct rec {
    int32_t ids[REC_MAX];
    float lps[REC_MAX];
    int32_t top_ids[REC_MAX][REC_TOP];
    float top_lps[REC_MAX][REC_TOP];
    int n, done, cancel_after, cancel_now;
    hearth_status status;
    hearth_generate_result res;
} rec;

static inline int rec_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    (void)text;
    rec *r = user;
    if (r->n < REC_MAX) {
        r->ids[r->n] = id;
        r->lps[r->n] = lp ? lp->logprob : 0;
        for (int i = 0; lp && i < REC_TOP && i < lp->n; i++)
            r->top_ids[r->n][i] = lp->top_ids[i], r->top_lps[r->n][i] = lp->top_logprobs[i];
        r->n++;
    }
    return 0;
}
static inline int rec_cancelled(void *user) {
    rec *r = user;
    return r->cancel_now || (r->cancel_after && r->n >= r->cancel_after);
}
static inline void rec_done(void *user, hearth_status s, const hearth_error *err) {
    (void)err;
    rec *r = user;
    r->done++;
    r->status = s;
}
#endif
