/* bench_spec.c: `hearth bench <model> --prompt-file F`: what speculative decoding gains on a
 * prompt that repeats its context. B requests of the file's text (tokens as written, no chat
 * template), greedy, n new tokens, through the batch scheduler on two engines of the same
 * model side by side: one with --speculate none, one with prompt lookup (or --draft-model);
 * runs alternate between them so other load on the machine hits both alike. Reports the
 * median decode tok/s of each, their ratio, and the proposed / accepted token counts.
 *
 * --spec-accept A (with a draft model): a first run without speculation records the greedy
 * text; the speculating engine's draft proposals are then replaced by it, each token kept
 * with probability A (hearth_spec_replay), so the acceptance is known. The report adds the
 * ideal speedup for (A, K), its achieved fraction, the per-token acceptance measured, and
 * whether every speculative run's text equals the recorded one (the verifier's output must
 * not change: a difference fails the command). */
#include "cli/cli.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Expected tokens a verification step yields when each of K proposed tokens is kept with
 * probability a until the first miss: 1 + a + ... + a^K. */
static double ideal_speedup(double a, int K) { return a >= 1.0 ? K + 1.0 : (1.0 - pow(a, K + 1)) / (1.0 - a); }

/* The first request whose tokens differ from ref (-1: none); *at its first differing token. */
static int first_difference(const int32_t *out, const int32_t *ref, int B, int n, int *at) {
    for (int i = 0; i < B; i++)
        for (int j = 0; j < n; j++)
            if (out[(size_t)i * n + j] != ref[j]) return *at = j, i;
    return -1;
}

int cli_bench_spec(hearth_model *m, hearth_engine_options eo, const char *prompt_file, int B, int n, int reps,
                   int num_draft_tokens, double accept, int as_json) {
    hearth_error err = {0};
    char *text = cli_read_file(prompt_file);
    if (!text) return 1;
    cli_bench_text t = {.num_draft_tokens = num_draft_tokens};
    int32_t *ids = NULL;
    if (hearth_tokenize(m, text, strlen(text), 1, &ids, &t.n, &err)) {
        free(text);
        return cli_fail(&err);
    }
    free(text);
    t.ids = ids;
    int replaying = accept >= 0 && eo.draft_model;
    hearth_engine_options on = eo, off = eo;
    if (on.speculate == HEARTH_SPEC_NONE) on.speculate = HEARTH_SPEC_LOOKUP;
    off.speculate = HEARTH_SPEC_NONE;
    off.draft_model = NULL;
    if (!on.context_length) on.context_length = off.context_length = (int)t.n + n + 16;
    if (!on.max_sequences) on.max_sequences = off.max_sequences = B;
    hearth_engine *e[2] = {NULL, NULL}; /* [0]: none, [1]: speculating */
    double *dec[2] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double))}, unused;
    /* replaying: the recorded text (prompt + request 0's output) and every run's outputs */
    int32_t *full = replaying ? malloc((t.n + (size_t)n) * sizeof *full) : NULL;
    int32_t *outs = replaying ? malloc((size_t)B * (size_t)n * sizeof *outs) : NULL;
    hearth_spec_replay rp = {.accept = accept, .seed = 0x5eed5eedULL};
    int rc = hearth_engine_create(m, &off, &e[0], &err), mismatch = -1, mismatch_at = 0;
    if (!rc && (!dec[0] || !dec[1] || (replaying && (!full || !outs)))) {
        fprintf(stderr, "hearth: bench: out of memory\n");
        rc = 1;
    }
    hearth_batch_stats st[2];
    int vocab = rc ? 0 : hearth_model_vocab_rows(e[0]);
    if (!rc && replaying) { /* the target's greedy text, without speculation */
        t.out = outs;
        rc = cli_bench_run_batch(e[0], B, 0, n, vocab, 1, &t, &unused, &unused, NULL, &err);
        t.out = NULL;
        if (!rc) {
            memcpy(full, ids, t.n * sizeof *full);
            memcpy(full + t.n, outs, (size_t)n * sizeof *full);
            rp.tokens = full, rp.n = t.n + (size_t)n;
            on.spec_replay = &rp;
            if ((mismatch = first_difference(outs, outs, B, n, &mismatch_at)) >= 0)
                fprintf(stderr, "hearth: bench: without speculation, request %d's token %d differs from request 0's "
                                "(same prompt): the replay follows request 0\n", mismatch, mismatch_at);
            mismatch = -1;
        }
    }
    if (!rc) rc = hearth_engine_create(m, &on, &e[1], &err);
    for (int k = 0; !rc && k < 2; k++) /* warm-up */
        rc = cli_bench_run_batch(e[k], B, 0, 8, vocab, 1, &t, &unused, &unused, NULL, &err);
    for (int r = 0; !rc && r < reps; r++)
        for (int j = 0; !rc && j < 2; j++) {
            int k = r % 2 ? 1 - j : j; /* A B, B A, ... */
            t.out = replaying && k ? outs : NULL;
            rc = cli_bench_run_batch(e[k], B, 0, n, vocab, 1, &t, &unused, &dec[k][r], &st[k], &err);
            if (!rc && t.out && mismatch < 0) mismatch = first_difference(outs, full + t.n, B, n, &mismatch_at);
            if (!rc && !as_json)
                fprintf(stderr, "run %d/%d %-9s %.1f tok/s (accepted %llu of %llu proposed)\n", r + 1, reps,
                        k ? "speculate" : "none", dec[k][r],
                        st[k].spec_accepted[HEARTH_SPEC_LOOKUP] + st[k].spec_accepted[HEARTH_SPEC_DRAFT],
                        st[k].spec_proposed[HEARTH_SPEC_LOOKUP] + st[k].spec_proposed[HEARTH_SPEC_DRAFT]);
        }
    t.out = NULL;
    if (rc) rc = err.status ? cli_fail(&err) : 1;
    if (!rc) {
        qsort(dec[0], (size_t)reps, sizeof(double), cli_cmp_double);
        qsort(dec[1], (size_t)reps, sizeof(double), cli_cmp_double);
        double a = cli_median_sorted(dec[0], reps), b = cli_median_sorted(dec[1], reps), speedup = a > 0 ? b / a : 0.0;
        int proposer = on.draft_model ? HEARTH_SPEC_DRAFT : HEARTH_SPEC_LOOKUP;
        unsigned long long prop = st[1].spec_proposed[proposer], acc = st[1].spec_accepted[proposer];
        unsigned long long drafts = st[1].spec_drafts[proposer], rej = st[1].spec_rejected[proposer];
        /* per proposed token: each draft is kept tokens up to the first miss, so the
         * estimate of A is the kept tokens over the kept and missed ones */
        double a_hat = acc + rej ? (double)acc / (double)(acc + rej) : 0.0;
        double per_step = drafts ? 1.0 + (double)acc / (double)drafts : 1.0;
        double ideal = replaying ? ideal_speedup(accept, num_draft_tokens) : 0.0;
        json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I}", "model",
                              hearth_model_path(m), "device",
                              hearth_engine_device(e[1]) == HEARTH_DEVICE_CUDA ? "cuda" : "cpu", "proposer",
                              hearth_speculate_name(proposer), "threads", hearth_engine_threads(e[1]), "batch", B,
                              "prompt_tokens", (int)t.n, "gen_tokens", n, "runs", reps, "none_decode_tps", a,
                              "spec_decode_tps", b, "speedup", speedup, "last_run_proposed", (json_int_t)prop,
                              "last_run_accepted", (json_int_t)acc, "last_run_drafts", (json_int_t)drafts);
        if (replaying) {
            json_t *x = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:b}", "num_draft_tokens",
                                            num_draft_tokens, "spec_accept", accept, "measured_accept", a_hat,
                                            "tokens_per_step", per_step, "ideal_speedup", ideal,
                                            "fraction_of_ideal", ideal > 0 ? speedup / ideal : 0.0,
                                            "texts_equal", mismatch < 0);
            json_object_update(o, x);
            json_decref(x);
        }
        if (as_json) {
            json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
            putchar('\n');
        } else {
            printf("model       %s\nprompt      %s: %zu tokens; %d request(s) x %d new tokens, greedy (median of %d)\n"
                   "none        %.1f tok/s decode\n%-11s %.1f tok/s decode: %.2fx\nacceptance  %llu of %llu "
                   "proposed tokens in %llu drafts (last run)\n",
                   hearth_model_path(m), prompt_file, t.n, B, n, reps, a, hearth_speculate_name(proposer), b, speedup,
                   acc, prop, drafts);
            if (replaying)
                printf("replay      A %.2f, K %d: measured A %.3f, %.2f tokens a verified step\n"
                       "ideal       %.2fx (1 - A^(K+1)) / (1 - A): achieved %.2f of it\ntext        %s\n",
                       accept, num_draft_tokens, a_hat, per_step, ideal, ideal > 0 ? speedup / ideal : 0.0,
                       mismatch < 0 ? "equal to the run without speculation" : "DIFFERS from the run without speculation");
        }
        json_decref(o);
        if (mismatch >= 0) {
            fprintf(stderr, "hearth: bench: speculative request %d's token %d differs from the text without speculation\n",
                    mismatch, mismatch_at);
            rc = 1;
        }
    }
    hearth_engine_free(e[0]);
    hearth_engine_free(e[1]);
    free(dec[0]);
    free(dec[1]);
    free(full);
    free(outs);
    hearth_free(ids);
    return rc;
}
