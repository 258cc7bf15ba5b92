/* tiny_model_path.h: the tiny models tools/make_tiny_models.py writes (HEARTH_CACHE, else
 * ~/.cache/hearth, then tiny/<name>) for the unit tests that run one, and what those
 * tests share: opening one, greedy parameters, and a recorder of a request's tokens and
 * end (the callbacks of hearth_generate and hearth_batch). Test code only; include after
 * cmocka.h. */
#ifndef HEARTH_TESTS_TINY_MODEL_PATH_H
#define HEARTH_TESTS_TINY_MODEL_PATH_H
#include "hearth.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dir/name inside hearth's cache (HEARTH_CACHE, else ~/.cache/hearth): where
 * tools/get_models.sh puts the real models (models/<file>) and the tiny ones (tiny/<name>). */
static inline void hearth_cache_path(char *path, size_t cap, const char *dir, const char *name) {
    const char *cache = getenv("HEARTH_CACHE");
    if (cache)
        snprintf(path, cap, "%s/%s/%s", cache, dir, name);
    else
        snprintf(path, cap, "%s/.cache/hearth/%s/%s", getenv("HOME") ? getenv("HOME") : "", dir, name);
}

static inline void tiny_model_path(char *path, size_t cap, const char *name) {
    hearth_cache_path(path, cap, "tiny", name);
}

/* The names of the tiny models there (folders with a config.json), at most cap; 0 when none.
 * The sanitizer build takes one float model per family (the weight formats' kernels are the
 * sanitized matmul tests'); the full set runs unsanitized. */
static inline int tiny_models(char names[][64], int cap) {
    char root[4400];
    tiny_model_path(root, sizeof root, "");
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < cap) {
        char cfg[4700];
        snprintf(cfg, sizeof cfg, "%s/%s/config.json", root, de->d_name);
        size_t len = strlen(de->d_name);
#if defined(__SANITIZE_ADDRESS__)
        if (len < 4 || strcmp(de->d_name + len - 4, "-f32")) continue;
#endif
        FILE *f = de->d_name[0] != '.' ? fopen(cfg, "r") : NULL;
        if (f && len < 64) memcpy(names[n++], de->d_name, len + 1);
        if (f) fclose(f);
    }
    closedir(d);
    return n;
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
