/* test_spec.c: speculative decoding in the batch scheduler. Prompt lookup and the
 * adaptive depth on token arrays; KV truncation; then, with the scalar kernels on every
 * tiny model (each family and weight format tools/make_tiny_models.py makes):
 * - lossless: greedy tokens and top logprobs with prompt lookup equal those without
 *   speculation, each request alone and three together;
 * - rollback: a proposer that injects wrong tokens (rejected at the first position, in
 *   the middle, drafts across block boundaries) leaves every later token and its top-5
 *   logprobs exactly as without speculation, and the KV pool's free/cached counts too;
 *   on the hybrids (qwen3_5) the recurrent state goes back to its backup and the accepted
 *   tokens are fed again, and the prompt asked again starts from the state snapshots;
 *   seeded sampling gives the same tokens as well;
 * - the sampled distribution: on the tiny llama at top-k 4, the pair (first token,
 *   token after a verified proposal) over 40000 seeded requests against the model's own
 *   probabilities (chi-squared, p > 0.01): a proposal is accepted exactly as often as the
 *   target would sample it, and a rejection's replacement follows the target too. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "engine/scheduler.h"
#include "engine/spec.h"
#include "kv/kv_cache.h"
#include "kv/kv_prefix.h"
#include "hearth.h"
#include "tiny_model_path.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_lookup(void **st) {
    (void)st;
    int32_t out[SPEC_MAX_DRAFT];
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3};
    assert_int_equal(spec_lookup(a, 11, 8, out), 8); /* "1 2 3" seen at 0: 4 5 6 9 9 1 2 3 follow */
    assert_int_equal(out[0], 4);
    assert_int_equal(out[4], 9);
    assert_int_equal(out[7], 3);
    assert_int_equal(spec_lookup(a, 11, 2, out), 2);
    /* the latest occurrence wins; a 1-gram never proposes */
    const int32_t b[] = {7, 8, 1, 7, 8, 2, 7, 8};
    assert_int_equal(spec_lookup(b, 8, 8, out), 3);
    assert_int_equal(out[0], 2);
    const int32_t c[] = {5, 1, 2, 5};
    assert_int_equal(spec_lookup(c, 4, 8, out), 0);
    assert_int_equal(spec_lookup(c, 0, 8, out), 0);
    assert_int_equal(spec_lookup(a, 11, 0, out), 0);
    /* a run of one token proposes more of it */
    const int32_t d[] = {3, 3, 3, 3};
    assert_int_equal(spec_lookup(d, 4, 8, out), 1);
    assert_int_equal(out[0], 3);
}

/* The brute-force suffix match over the outputs (docs[d][0..len[d])): for each g, longest first
 * (SPEC_SUFFIX_NGRAMS), the latest occurrence of hist's last g tokens inside one output; the up to max_k
 * tokens after it in that output, or (it ends the output) on to a shorter g. */
static int suffix_oracle(int32_t docs[][64], const int *len, int n_docs, const int32_t *hist, int n, int max_k,
                         int32_t *out) {
    static const int lengths[] = SPEC_SUFFIX_NGRAMS;
    for (size_t j = 0; j < sizeof lengths / sizeof *lengths; j++) {
        int g = lengths[j];
        if (n < g) continue;
        int found = 0, k = 0;
        for (int d = n_docs - 1; !found && d >= 0; d--)
            for (int i = len[d] - g; !found && i >= 0; i--) {
                if (memcmp(docs[d] + i, hist + n - g, (size_t)g * sizeof *hist)) continue;
                found = 1;
                while (k < max_k && i + g + k < len[d]) out[k] = docs[d][i + g + k], k++;
            }
        if (k > 0) return k;
    }
    return 0;
}

static void test_suffix(void **st) {
    (void)st;
    spec_suffix *s = spec_suffix_new();
    assert_non_null(s);
    int32_t out[SPEC_MAX_DRAFT], want[SPEC_MAX_DRAFT], hist[32];
    assert_int_equal(spec_suffix_lookup(s, hist, 0, 8, out, NULL), 0);
    const int32_t a[] = {5, 6, 7, 8, 9, 10, 11};
    spec_suffix_add(s, a, 7);
    const int32_t h1[] = {1, 2, 6, 7, 8}; /* "6 7 8" was in an output: 9 10 11 follow, and its end */
    int g;
    assert_int_equal(spec_suffix_lookup(s, h1, 5, 8, out, &g), 3);
    assert_int_equal(g, 3);
    assert_int_equal(out[0], 9), assert_int_equal(out[2], 11);
    const int32_t h2[] = {6, 7}; /* two tokens: too short a match across requests */
    assert_int_equal(spec_suffix_lookup(s, h2, 2, 8, out, NULL), 0);
    const int32_t b[] = {9, 10, 11, 12};
    spec_suffix_add(s, b, 4); /* "9 10 11" now continues with 12 (the latest), never across outputs */
    const int32_t h3[] = {9, 10, 11};
    assert_int_equal(spec_suffix_lookup(s, h3, 3, 8, out, NULL), 1);
    assert_int_equal(out[0], 12);
    const int32_t h4[] = {8, 9, 10, 11}; /* the longer match wins: its end, nothing after it in that output */
    assert_int_equal(spec_suffix_lookup(s, h4, 4, 8, out, NULL), 1);
    spec_suffix_free(s);

    /* against the brute-force search: outputs over a small alphabet (many repeats) */
    static int32_t docs[400][64];
    int len[400];
    uint64_t r = 0x1234;
    s = spec_suffix_new();
    int agree = 0, found = 0, total = 0;
    for (int d = 0; d < 400; d++) {
        len[d] = 8 + (int)((r = r * 6364136223846793005ull + 1442695040888963407ull) >> 59);
        for (int i = 0; i < len[d]; i++) docs[d][i] = (int32_t)((r = r * 6364136223846793005ull + 1) >> 61);
        spec_suffix_add(s, docs[d], len[d]);
        for (int q = 0; q < 20; q++) {
            int n = 1 + (int)((r = r * 6364136223846793005ull + 1) >> 59);
            for (int i = 0; i < n; i++) hist[i] = (int32_t)((r = r * 6364136223846793005ull + 1) >> 61);
            int k = spec_suffix_lookup(s, hist, n, 8, out, NULL),
                kw = suffix_oracle(docs, len, d + 1, hist, n, 8, want);
            total++, found += kw > 0;
            agree += k == kw && !memcmp(out, want, sizeof(int32_t) * (size_t)k);
            /* a proposal is always a true continuation: never a hash collision's */
            if (k > 0) {
                int ok = 0;
                for (int dd = 0; !ok && dd <= d; dd++)
                    for (int i = 0; !ok && i + k <= len[dd]; i++)
                        ok = !memcmp(docs[dd] + i, out, sizeof(int32_t) * (size_t)k);
                assert_true(ok);
            }
        }
        if (d == 19) { /* 20 outputs: a slot taken by another n-gram is rare */
            print_message("suffix index, 20 outputs: %d of %d lookups as the brute force\n", agree, total);
            assert_true(agree >= total * 99 / 100);
        }
    }
    /* 400 (~10,000 tokens, ~40,000 n-gram entries in 2^19 slots): the oldest start to go */
    print_message("suffix index, 400 outputs: %d of %d lookups as the brute force (%d found a match)\n", agree, total,
                  found);
    assert_true(found > total / 2);
    assert_true(agree >= total * 97 / 100);
    spec_suffix_free(s);
}

static void test_cost(void **st) {
    (void)st;
    spec_cost c = {0};
    assert_int_equal(spec_cost_depth(&c, 1, 0.1, 4), 4); /* not measured yet: as the depth policy says */
    for (int i = 0; i < SPEC_COST_WARM; i++) spec_cost_record(&c, 1, 0, 0.010); /* a plain step: 10 ms */
    assert_int_equal(spec_cost_depth(&c, 1, 0.1, 4), 4);
    assert_true(spec_cost_plain_due(&c, 1) == 0 && spec_cost_plain_due(&c, 2) == 1);
    for (int i = 0; i < SPEC_COST_WARM; i++) spec_cost_record(&c, 1, 2, 0.020); /* 2 tokens: 10 ms more */
    assert_true(fabs(c.plain[0] - 0.010) < 1e-12 && fabs(c.extra[0][2] - 0.010) < 1e-12);
    /* tokens per second over a plain step's, E(a, j) * 10 / (10 + 5 j) (other depths scaled from 2's) */
    assert_int_equal(spec_cost_depth(&c, 1, 0.5, 4), 0); /* j = 1: 1.5 * 10 / 15 = 1.0, under the margin */
    assert_int_equal(spec_cost_depth(&c, 1, 0.9, 8), 3); /* 1.267, 1.355, 1.376, 1.365, ... */
    assert_int_equal(spec_cost_depth(&c, 1, 0.9, 2), 2); /* never deeper than asked */
    assert_int_equal(spec_cost_depth(&c, 2, 0.1, 4), 4); /* another row count: its own measurements */
    /* a fixed part (a hybrid's backup): 4 tokens measured at 4 ms over, against 10 ms for 2 */
    for (int i = 0; i < 60; i++) spec_cost_record(&c, 1, 4, 0.014);
    assert_int_equal(spec_cost_depth(&c, 1, 0.5, 8), 4); /* 1.9375 * 10 / 14 = 1.38 beats every other */
    spec_cost_record(&c, 1, 4, 0.001);                   /* faster than a plain step (noise): no negative cost */
    assert_true(c.extra[0][4] >= 0);
    for (int i = 0; i < SPEC_COST_REFRESH; i++) spec_cost_record(&c, 1, 4, 0.014);
    assert_int_equal(spec_cost_plain_due(&c, 1), 1); /* the plain cost is measured again */
    assert_true(fabs(spec_expected_tokens(0.5, 2) - 1.75) < 1e-12 && spec_expected_tokens(1.0, 3) == 4.0);
}

static void test_depth(void **st) {
    (void)st;
    spec_depth d = {0};
    assert_int_equal(spec_depth_next(&d), SPEC_MAX_DRAFT / 2);
    spec_depth_update(&d, 4, 4, 0);
    assert_int_equal(spec_depth_next(&d), SPEC_MAX_DRAFT);
    spec_depth_update(&d, 8, 2, 0);
    assert_int_equal(spec_depth_next(&d), 3);
    spec_depth_update(&d, 3, 0, 0); /* nothing accepted: a pause of 2 steps */
    assert_int_equal(spec_depth_next(&d), 0);
    assert_int_equal(spec_depth_next(&d), 0);
    assert_int_equal(spec_depth_next(&d), 1);
    for (int i = 0; i < 10; i++) spec_depth_update(&d, 1, 0, 0);
    assert_int_equal(d.pause, 64); /* capped */
    spec_depth_update(&d, 1, 1, 0);
    assert_int_equal(d.misses, 0);
    /* strict (a hybrid's row): a partly accepted draft pauses too, at depth accepted + 1 */
    spec_depth_update(&d, 4, 2, 1);
    assert_int_equal(spec_depth_next(&d), 0);
    assert_int_equal(spec_depth_next(&d), 0);
    assert_int_equal(spec_depth_next(&d), 3);
    spec_depth_update(&d, 3, 3, 1); /* all accepted: no pause, twice as deep */
    assert_int_equal(spec_depth_next(&d), 6);
    assert_int_equal(hearth_speculate_parse("lookup"), HEARTH_SPEC_LOOKUP);
    assert_int_equal(hearth_speculate_parse("none"), HEARTH_SPEC_NONE);
    assert_int_equal(hearth_speculate_parse("ngram"), -1);
    assert_null(hearth_speculate_name(7));
}

/* Where proposing stops (spec_step_room): the CPU's few rows whatever the depth; the GPU's
 * step tokens up to the ridge (200 FLOP/byte: 200 tokens of bf16 weights, 56 of 4.5-bit
 * ones), a draft model every row at full depth or none. */
static void test_limits(void **st) {
    (void)st;
    spec_limits cpu = spec_limits_for(0, 2.0), bf16 = spec_limits_for(1, 2.0), q4 = spec_limits_for(1, 0.5625);
    assert_int_equal(cpu.max_decode_rows, 4);
    assert_int_equal(cpu.max_step_tokens, 0);
    for (int n = 1; n <= 4; n++) { /* as before: any depth up to 4 decoding requests, none above */
        assert_int_equal(spec_step_room(cpu, n, 0), INT32_MAX);
        assert_int_equal(spec_step_room(cpu, n, 8), INT32_MAX);
    }
    assert_int_equal(spec_step_room(cpu, 5, 0), 0);
    assert_int_equal(spec_step_room(cpu, 0, 0), 0);
    assert_int_equal(bf16.max_step_tokens, 200);
    assert_int_equal(bf16.max_decode_rows, 199);
    assert_int_equal(q4.max_step_tokens, 56);
    assert_int_equal(spec_step_room(bf16, 1, 8), 199);
    assert_int_equal(spec_step_room(bf16, 32, 4), 168);   /* 32 x 5 = 160 tokens: memory-bound */
    assert_int_equal(spec_step_room(bf16, 32, 8), 0);     /* 32 x 9 = 288: past the ridge */
    assert_int_equal(spec_step_room(bf16, 32, 0), 168);   /* prompt lookup: what is left */
    assert_int_equal(spec_step_room(bf16, 128, 4), 0);    /* 128 streams: never a partial draft */
    assert_int_equal(spec_step_room(bf16, 128, 0), 72);
    assert_int_equal(spec_step_room(bf16, 200, 0), 0);
    assert_int_equal(spec_step_room(q4, 32, 4), 0);
    assert_int_equal(spec_step_room(q4, 8, 4), 48);
    assert_int_equal(spec_limits_for(1, 0.001).max_step_tokens, 2); /* never below one proposal */
}

static void test_truncate(void **st) {
    (void)st;
    kv_cache kv;
    hearth_error err = {0};
    assert_int_equal(kv_create(&kv, 1, 1, 4, 2, 256, 8, &err), HEARTH_OK);
    assert_int_equal(kv_reserve(&kv, 0, 40, &err), HEARTH_OK); /* 3 blocks */
    assert_int_equal(kv.n_free, 5);
    kv_truncate(&kv, 0, 33); /* still 3 blocks */
    assert_int_equal(kv.n_free, 5);
    assert_int_equal(kv.n_tokens[0], 33);
    kv_truncate(&kv, 0, 17);
    assert_int_equal(kv.n_free, 6);
    assert_int_equal(kv.tables[2], -1);
    kv_truncate(&kv, 0, 20); /* never grows */
    assert_int_equal(kv.n_tokens[0], 17);
    assert_int_equal(kv_reserve(&kv, 0, 48, &err), HEARTH_OK);
    assert_int_equal(kv.n_free, 5);
    kv_destroy(&kv);
}

/* ---- on the tiny models ---- */

#define MAX_OUT 96
#define TOP REC_TOP

#define N_PROMPTS 3
/* text that repeats itself, as the edits and quotes speculation is for */
static const char *prompts[N_PROMPTS] = {
    "the cat sat on the mat. the cat sat on the mat. the cat sat on",
    "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3",
};

/* The oracle proposer of the rollback test: the run without speculation's tokens for
 * the request whose prompt starts tokens, with one token made wrong in two steps of
 * three (the first, or the middle one of the draft). */
typedef struct oracle {
    const int32_t *seq[N_PROMPTS];
    size_t n_prompt[N_PROMPTS], n_seq[N_PROMPTS];
    int calls;
} oracle;
static int oracle_propose(void *user, const int32_t *tokens, int n, int max_k, int32_t *out) {
    oracle *o = user;
    for (int r = 0; r < N_PROMPTS; r++) {
        if ((size_t)n < o->n_prompt[r] || memcmp(tokens, o->seq[r], o->n_prompt[r] * sizeof *tokens)) continue;
        int k = 0;
        while (k < max_k && (size_t)(n + k) < o->n_seq[r]) out[k] = o->seq[r][n + k], k++;
        int mode = o->calls++ % 3;
        int32_t *bad = &out[mode == 1 ? 0 : k / 2];
        if (k > 0 && mode) *bad = *bad > 0 ? *bad - 1 : 1;
        return k;
    }
    return 0;
}

typedef struct run_opts {
    int speculate, together, sampled;
    oracle *orc;
    hearth_model *draft; /* a draft model, proposing 3 tokens per step */
} run_opts;

/* Runs every prompt through a batch on a fresh engine (alone one after another, or all
 * submitted together) and records tokens and logprobs; *stats gets the batch's counters. */
static void run_prompts(hearth_model *m, int32_t **ids, size_t *n_ids, run_opts ro, rec *out,
                        hearth_batch_stats *stats) {
    hearth_error err = {0};
    hearth_engine *e = NULL;
    hearth_engine_options o = {.n_threads = 1, .context_length = 512, .max_sequences = 4, .max_step_tokens = 64,
                               .speculate = ro.speculate, .draft_model = ro.draft};
    if (hearth_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.message);
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    if (ro.orc) sched_set_proposer(b, oracle_propose, ro.orc);
    hearth_generate_params p;
    memset(&p, 0, sizeof p);
    hearth_sampling_defaults(NULL, &p.sampling);
    p.sampling.top_logprobs = TOP;
    p.max_tokens = 40;
    p.ignore_eos = 1;
    p.num_draft_tokens = 3;
    if (ro.sampled) {
        p.sampling.temperature = 0.8f, p.sampling.top_p = 0.95f;
        p.sampling.has_seed = 1, p.sampling.seed = 1234;
        p.sampling.repetition_penalty = 1.1f; /* the penalty window sees accepted proposals */
    }
    memset(out, 0, N_PROMPTS * sizeof *out);
    for (int i = 0; i < N_PROMPTS; i++) {
        hearth_batch_request r = {.prompt = ids[i], .n_prompt = n_ids[i], .params = &p, .on_token = rec_token,
                                  .on_done = rec_done, .result = &out[i].res, .user = &out[i]};
        assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
        if (!ro.together)
            while (hearth_batch_step(b)) {}
    }
    /* the first prompt again: its answer's blocks come from the prefix cache */
    rec again;
    memset(&again, 0, sizeof again);
    hearth_batch_request r = {.prompt = ids[0], .n_prompt = n_ids[0], .params = &p, .on_token = rec_token,
                              .on_done = rec_done, .result = &again.res, .user = &again};
    while (hearth_batch_step(b)) {}
    assert_int_equal(hearth_batch_submit(b, &r, &err), HEARTH_OK);
    while (hearth_batch_step(b)) {}
    assert_true(again.res.cached_tokens > 0);
    if (memcmp(again.ids, out[0].ids, sizeof again.ids) || memcmp(again.top_lps, out[0].top_lps, sizeof again.top_lps))
        fail_msg("the first prompt again (%zu tokens cached) answers differently", again.res.cached_tokens);
    while (hearth_batch_step(b)) {}
    hearth_batch_stats_get(b, stats);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(out[i].done, 1);
        assert_int_equal(out[i].status, HEARTH_OK);
        assert_int_equal(out[i].res.completion_tokens, (size_t)p.max_tokens);
        assert_int_equal(out[i].n, p.max_tokens);
    }
    hearth_batch_free(b);
    hearth_engine_free(e);
}

static void assert_same(const rec *a, const rec *b, const char *what, const char *model) {
    for (int i = 0; i < N_PROMPTS; i++) {
        for (int t = 0; t < a[i].n; t++)
            if (a[i].ids[t] != b[i].ids[t] || a[i].lps[t] != b[i].lps[t] ||
                memcmp(a[i].top_ids[t], b[i].top_ids[t], sizeof a[i].top_ids[t]) ||
                memcmp(a[i].top_lps[t], b[i].top_lps[t], sizeof a[i].top_lps[t]))
                fail_msg("%s, %s: prompt %d token %d differs: %d (%g) vs %d (%g)", model, what, i, t, a[i].ids[t],
                         a[i].lps[t], b[i].ids[t], b[i].lps[t]);
        assert_int_equal(a[i].n, b[i].n);
    }
}

/* The sanitizer build runs the speculation paths (proposals, rollback, drafts) on one float
 * model per family (tiny_models): those paths are the same for every weight format. */
static void test_lossless_every_tiny_model(void **st) {
    (void)st;
    char names[64][64];
    int n_models = tiny_models(names, 64);
    if (n_models == 0) {
        print_message("no tiny models (run tools/make_tiny_models.py)\n");
        skip();
    }
    unsigned long long proposed = 0, accepted = 0, h_prop = 0, h_acc = 0;
    for (int mi = 0; mi < n_models; mi++) {
        char path[4400];
        tiny_model_path(path, sizeof path, names[mi]);
        hearth_model *m = NULL;
        hearth_error err = {0};
        if (hearth_model_open(path, &m, &err)) fail_msg("%s: %s", path, err.message);
        hearth_engine *probe = NULL;
        hearth_engine_options po = {.n_threads = 1, .context_length = 64};
        if (hearth_engine_create(m, &po, &probe, &err) == HEARTH_ERR_UNSUPPORTED) { /* a family still to come */
            print_message("%s: not run: %s\n", names[mi], err.message);
            hearth_model_close(m);
            continue;
        }
        hearth_engine_free(probe);
        int32_t *ids[N_PROMPTS];
        size_t n_ids[N_PROMPTS];
        for (int i = 0; i < N_PROMPTS; i++)
            assert_int_equal(hearth_tokenize(m, prompts[i], strlen(prompts[i]), 1, &ids[i], &n_ids[i], &err),
                             HEARTH_OK);
        static rec plain[N_PROMPTS], spec[N_PROMPTS];
        hearth_batch_stats s0, s1;
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_NONE}, plain, &s0);
        assert_int_equal(s0.spec_proposed[0], 0);
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_LOOKUP}, spec, &s1);
        assert_same(plain, spec, "prompt lookup, alone", names[mi]);
        /* hybrid models (a recurrent state, qwen3_5) speculate too: a rejected proposal puts the
         * state back to its backup and the accepted tokens are fed again */
        int hybrid = !strncmp(names[mi], "qwen3_5", 7);
        assert_true(s1.spec_proposed[0] > 0);
        assert_true(s1.steps < s0.steps || s1.spec_accepted[0] == 0);
        proposed += s1.spec_proposed[0], accepted += s1.spec_accepted[0];
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_LOOKUP, .together = 1}, spec, &s1);
        assert_same(plain, spec, "prompt lookup, together", names[mi]);
        /* the suffix index: the first prompt asked again (run_prompts' last request) is proposed
         * its earlier answer */
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_SUFFIX}, spec, &s1);
        assert_same(plain, spec, "suffix index, alone", names[mi]);
        assert_true(s1.spec_accepted[HEARTH_SPEC_SUFFIX] > 0);
        /* a draft model: the model itself (every proposal accepted), then another weight format of
         * its family (proposals rejected too); a hybrid draft (qwen3_5) puts its state back to a
         * backup after a rejection, which its acceptance shows (below) */
        const char *fam_end = strchr(names[mi], '-');
        for (int dj = -1; dj < n_models; dj++) {
            if (dj >= 0 && (dj == mi || !fam_end || strncmp(names[dj], names[mi], (size_t)(fam_end - names[mi] + 1))))
                continue;
            char dpath[4400];
            tiny_model_path(dpath, sizeof dpath, dj < 0 ? names[mi] : names[dj]);
            hearth_model *dm = NULL;
            if (hearth_model_open(dpath, &dm, &err)) fail_msg("%s: %s", dpath, err.message);
            for (int together = 0; together < 2; together++) {
                run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_LOOKUP, .together = together, .draft = dm},
                            spec, &s1);
                assert_same(plain, spec, together ? "draft model, together" : "draft model", names[mi]);
                assert_true(s1.spec_proposed[HEARTH_SPEC_DRAFT] > 0);
                assert_int_equal(s1.spec_proposed[HEARTH_SPEC_LOOKUP], 0);
                if (dj < 0) assert_int_equal(s1.spec_accepted[HEARTH_SPEC_DRAFT], s1.spec_proposed[HEARTH_SPEC_DRAFT]);
                if (hybrid && dj >= 0) /* a hybrid draft backs its state up before its proposals */
                    h_acc += s1.spec_accepted[HEARTH_SPEC_DRAFT], h_prop += s1.spec_proposed[HEARTH_SPEC_DRAFT];
            }
            hearth_model_close(dm);
            if (dj >= 0) break;
        }
        /* rollback: proposals with wrong tokens, alone and together; the pool ends as without */
        oracle orc = {0};
        for (int i = 0; i < N_PROMPTS; i++) {
            int32_t *full = malloc((n_ids[i] + MAX_OUT) * sizeof *full);
            memcpy(full, ids[i], n_ids[i] * sizeof *full);
            memcpy(full + n_ids[i], plain[i].ids, (size_t)plain[i].n * sizeof *full);
            orc.seq[i] = full, orc.n_prompt[i] = n_ids[i], orc.n_seq[i] = n_ids[i] + (size_t)plain[i].n;
        }
        for (int together = 0; together < 2; together++) {
            run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_LOOKUP, .together = together, .orc = &orc},
                        spec, &s1);
            assert_same(plain, spec, together ? "rejected proposals, together" : "rejected proposals", names[mi]);
            assert_true(s1.spec_accepted[0] > 0 && s1.spec_accepted[0] < s1.spec_proposed[0]);
            if (!together) {
                assert_int_equal(s1.kv_blocks_cached, s0.kv_blocks_cached);
                assert_int_equal(s1.kv_blocks_used, 0);
            }
        }
        /* seeded sampling with a repetition penalty: the same draws, so the same tokens */
        static rec splain[N_PROMPTS];
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_NONE, .sampled = 1}, splain, &s0);
        for (int i = 0; i < N_PROMPTS; i++) {
            memcpy((int32_t *)orc.seq[i] + n_ids[i], splain[i].ids, (size_t)splain[i].n * sizeof(int32_t));
            orc.n_seq[i] = n_ids[i] + (size_t)splain[i].n;
        }
        run_prompts(m, ids, n_ids, (run_opts){.speculate = HEARTH_SPEC_LOOKUP, .sampled = 1, .orc = &orc}, spec, &s1);
        assert_same(splain, spec, "seeded sampling, rejected proposals", names[mi]);
        assert_true(s1.spec_accepted[0] > 0);
        for (int i = 0; i < N_PROMPTS; i++) free((void *)orc.seq[i]), hearth_free(ids[i]);
        hearth_model_close(m);
    }
    print_message("%d tiny models; prompt lookup proposed %llu tokens, accepted %llu\n", n_models, proposed,
                  accepted);
    assert_true(accepted > 0);
    /* hybrid drafts of another weight format, greedy, alone and together: 1,332 of 2,110
     * proposals accepted (63%, the scalar tier); a draft whose state kept the rejected
     * proposals (no backup put back) got 1,016 of 2,860 (36%) */
    print_message("hybrid draft models: %llu of %llu proposals accepted\n", h_acc, h_prop);
    if (h_prop) assert_true(2 * h_acc > h_prop);
}

/* ---- the sampled distribution ---- */

#define CHI_K 4 /* top-k of the sampled requests: 4 x 4 cells of (t1, t2) */
typedef struct chi_oracle {
    int32_t first[CHI_K];     /* the top-k ids of the prompt's last row */
    int32_t draft[CHI_K];     /* the proposal after first[i]: the second most likely token there */
    double p1[CHI_K];         /* P(t1 = first[i]) */
    int32_t second[CHI_K][CHI_K];
    double p2[CHI_K][CHI_K];  /* P(t2 = second[i][j] | t1 = first[i]) */
} chi_oracle;
static int chi_propose(void *user, const int32_t *tokens, int n, int max_k, int32_t *out) {
    chi_oracle *o = user;
    for (int i = 0; i < CHI_K && max_k > 0; i++)
        if (tokens[n - 1] == o->first[i]) return out[0] = o->draft[i], 1;
    return 0;
}
/* The top CHI_K ids of a logits row (value descending) and their softmax among themselves
 * (temperature 1), in double: what top-k sampling draws from, computed here directly. */
static void top_probs(const float *logits, int vocab, int32_t *ids, double *p) {
    for (int k = 0; k < CHI_K; k++) {
        int best = -1;
        for (int v = 0; v < vocab; v++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ids[j] == v;
            if (!taken && (best < 0 || logits[v] > logits[best])) best = v;
        }
        ids[k] = best;
    }
    double z = 0;
    for (int k = 0; k < CHI_K; k++) z += p[k] = exp((double)logits[ids[k]] - logits[ids[0]]);
    for (int k = 0; k < CHI_K; k++) p[k] /= z;
}

#if defined(__SANITIZE_ADDRESS__)
#define CHI_DRAWS 8000 /* the sanitizer build checks memory here; the statistics are the plain build's */
#else
#define CHI_DRAWS 40000
#endif
static void test_sampled_distribution(void **st) {
    (void)st;
    char path[1024];
    tiny_model_path(path, sizeof path, "llama-f32");
    hearth_model *m = NULL;
    hearth_error err = {0};
    if (hearth_model_open(path, &m, &err)) {
        print_message("tiny model missing (%s): run tools/make_tiny_models.py\n", path);
        skip();
    }
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(hearth_tokenize(m, "once upon a time", 16, 1, &ids, &n_ids, &err), HEARTH_OK);
    hearth_engine *e = NULL;
    hearth_engine_options o = {.n_threads = 1, .context_length = 64, .max_sequences = 4, .max_step_tokens = 64};
    assert_int_equal(hearth_engine_create(m, &o, &e, &err), HEARTH_OK);
    int vocab = hearth_model_vocab_rows(e);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    chi_oracle orc;
    int seq;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_append(e, seq, ids, n_ids, 1, logits, &err), HEARTH_OK);
    top_probs(logits, vocab, orc.first, orc.p1);
    hearth_seq_close(e, seq);
    for (int i = 0; i < CHI_K; i++) {
        assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
        assert_int_equal(hearth_seq_append(e, seq, ids, n_ids, 0, NULL, &err), HEARTH_OK);
        assert_int_equal(hearth_seq_append(e, seq, &orc.first[i], 1, 1, logits, &err), HEARTH_OK);
        top_probs(logits, vocab, orc.second[i], orc.p2[i]);
        orc.draft[i] = orc.second[i][1];
        hearth_seq_close(e, seq);
    }
    hearth_batch *b = NULL;
    assert_int_equal(hearth_batch_create(e, &b, &err), HEARTH_OK);
    sched_set_proposer(b, chi_propose, &orc);
    static rec r[64];
    hearth_generate_params p;
    memset(&p, 0, sizeof p);
    hearth_sampling_defaults(NULL, &p.sampling);
    p.sampling.temperature = 1.0f, p.sampling.top_k = CHI_K, p.sampling.has_seed = 1;
    p.max_tokens = 3; /* t1 from the prompt, then one step verifies the proposal after it */
    p.ignore_eos = 1;
    hearth_generate_params ps[64];
    long counts[CHI_K][CHI_K] = {{0}}, other = 0;
    for (int base = 0; base < CHI_DRAWS; base += 64) {
        memset(r, 0, sizeof r);
        for (int i = 0; i < 64; i++) {
            ps[i] = p;
            ps[i].sampling.seed = 0x5eed0000ull + (uint64_t)(base + i);
            hearth_batch_request q = {.prompt = ids, .n_prompt = n_ids, .params = &ps[i], .on_token = rec_token,
                                      .on_done = rec_done, .result = &r[i].res, .user = &r[i]};
            assert_int_equal(hearth_batch_submit(b, &q, &err), HEARTH_OK);
        }
        while (hearth_batch_step(b)) {}
        for (int i = 0; i < 64; i++) {
            int a = -1, c = -1;
            for (int k = 0; k < CHI_K; k++) a = r[i].ids[0] == orc.first[k] ? k : a;
            for (int k = 0; a >= 0 && k < CHI_K; k++) c = r[i].ids[1] == orc.second[a][k] ? k : c;
            if (a < 0 || c < 0)
                other++;
            else
                counts[a][c]++;
        }
    }
    hearth_batch_stats s;
    hearth_batch_stats_get(b, &s);
    assert_int_equal(other, 0); /* top-k 4: nothing outside the oracle's cells */
    assert_int_equal(s.spec_proposed[0], (CHI_DRAWS + 63) / 64 * 64);
    /* cells expecting fewer than 5 draws (the chi-squared approximation's usual condition)
     * are pooled into one */
    double chi = 0, n = (double)((CHI_DRAWS + 63) / 64 * 64), pool_expect = 0;
    long pool_count = 0;
    int cells = 0;
    for (int a = 0; a < CHI_K; a++)
        for (int c = 0; c < CHI_K; c++) {
            double expect = n * orc.p1[a] * orc.p2[a][c];
            if (expect < 5) {
                pool_expect += expect, pool_count += counts[a][c];
                continue;
            }
            chi += (counts[a][c] - expect) * (counts[a][c] - expect) / expect;
            cells++;
        }
    if (pool_expect >= 5) chi += (pool_count - pool_expect) * (pool_count - pool_expect) / pool_expect, cells++;
    else assert_true(pool_count <= 20); /* a handful at most where almost none are expected */
    /* the chi-squared distribution's 0.99 quantile for 1..15 degrees of freedom */
    static const double crit[16] = {0,      6.635,  9.210,  11.345, 13.277, 15.086, 16.812, 18.475,
                                    20.090, 21.666, 23.209, 24.725, 26.217, 27.688, 29.141, 30.578};
    assert_true(cells >= 3);
    print_message("chi-squared %.2f over %d cells (critical %.2f at p = 0.01); proposals accepted %llu of %llu\n",
                  chi, cells, crit[cells - 1], s.spec_accepted[0], s.spec_proposed[0]);
    assert_true(chi < crit[cells - 1]);
    hearth_batch_free(b);
    free(logits);
    hearth_free(ids);
    hearth_engine_free(e);
    hearth_model_close(m);
}

int main(void) {
    setenv("HEARTH_CPU", "scalar", 1); /* rows computed independently: bit-identical steps */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_suffix),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_lossless_every_tiny_model),
        cmocka_unit_test(test_sampled_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
