/* bench_spec.c: `hearth bench <model> --prompt-file F`: what speculative decoding gains on a
 * prompt that repeats its context. B requests of the file's text (tokens as written, no chat
 * template), greedy, n new tokens, through the batch scheduler on two engines of the same
 * model side by side: one with --speculate none, one with prompt lookup (or --draft-model, or
 * the model's MTP head with --speculate mtp);
 * runs alternate between them so other load on the machine hits both alike. Reports the
 * median decode tok/s of each, their ratio, and the proposed / accepted token counts.
 *
 * --spec-accept A (with a draft model): for each batch count, a first run without
 * speculation records each request's greedy text; the speculating engine's draft
 * proposals are then replaced by it, each token kept with probability A
 * (hearth_spec_replay), so the acceptance is known. Lists of B, K and A run every
 * combination on one pair of engines (one report each). A report adds the ideal speedup for
 * (A, K), its achieved fraction, the per-token acceptance measured, and whether every
 * speculative run's text equals the replayed one, request by request.
 *
 * Where a verified step rounds differently from a one-token step (the GPU's cuBLAS steps
 * of more than 8 tokens, the SIMD CPU kernels), a greedy near-tie may break the other way
 * than in the recording, after which the recording no longer predicts the text. Before
 * the timed runs, an untimed speculative run checks that: where a text departs from its
 * recording, that run's texts become the recording and the check repeats (the replay is a
 * deterministic function of the recording, so each round moves the first departure later;
 * at most SPEC_RECORDINGS rounds). The report says how many rounds it took and where the
 * final recording departs from the text without speculation (nowhere on the exact CPU
 * tier); a run whose texts still differ from what it replayed fails the command after the
 * reports. */
#include "cli/cli.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Expected tokens a verification step yields when each of K proposed tokens is kept with
 * probability a until the first miss: 1 + a + ... + a^K. */
static double ideal_speedup(double a, int K) { return a >= 1.0 ? K + 1.0 : (1.0 - pow(a, K + 1)) / (1.0 - a); }

/* The first request whose n tokens differ from ref's (ref_stride 0: all against one row;
 * -1: none); *at its first differing token. */
static int first_difference(const int32_t *out, const int32_t *ref, size_t ref_stride, int B, int n, int *at) {
    for (int i = 0; i < B; i++)
        for (int j = 0; j < n; j++)
            if (out[(size_t)i * n + j] != ref[(size_t)i * ref_stride + j]) return *at = j, i;
    return -1;
}

#define SPEC_RECORDINGS 8

typedef struct spec_run {
    hearth_model *m;
    hearth_engine *e[3]; /* [0]: none, [1]: speculating, [2]: the draft model alone (replaying) */
    const char *prompt_file;
    cli_bench_text t;
    int vocab, n, reps, as_json, replaying, proposer;
    double *dec[3];
    int32_t *full;  /* [B, prompt + n]: the replayed texts */
    int32_t *none;  /* [B, n]: the texts without speculation */
    int32_t *outs;  /* [B, n]: a speculative run's */
    hearth_spec_replay *rp;
} spec_run;

/* reps alternating runs of B requests at depth K (and acceptance A when replaying), one
 * report; *differs set when a speculative text differed. */
static int spec_config(spec_run *s, int B, int K, double A, int *differs, hearth_error *err) {
    hearth_batch_stats st[2];
    double unused;
    int mismatch = -1, at = 0, rounds = 0, departs = -1, departs_at = 0;
    size_t w = s->t.n + (size_t)s->n; /* a replayed text's length */
    s->t.num_draft_tokens = K;
    if (s->replaying) { /* the recordings: the texts without speculation, then what the check finds */
        s->rp->accept = A;
        for (int i = 0; i < B; i++) memcpy(s->full + i * w + s->t.n, s->none + (size_t)i * s->n, (size_t)s->n * 4);
        for (; rounds < SPEC_RECORDINGS; rounds++) {
            s->t.out = s->outs;
            int rc = cli_bench_run_batch(s->e[1], B, 0, s->n, s->vocab, 1, &s->t, &unused, &unused, NULL, err);
            s->t.out = NULL;
            if (rc) return rc;
            if (first_difference(s->outs, s->full + s->t.n, w, B, s->n, &at) < 0) break;
            for (int i = 0; i < B; i++) memcpy(s->full + i * w + s->t.n, s->outs + (size_t)i * s->n, (size_t)s->n * 4);
        }
        /* where the final recording departs from the text without speculation */
        for (int i = 0; i < B; i++)
            for (int j = 0; j < s->n; j++)
                if (s->full[i * w + s->t.n + j] != s->none[(size_t)i * s->n + j]) {
                    if (departs < 0 || j < departs_at) departs_at = j;
                    departs = departs < 0 ? 1 : departs + 1;
                    break;
                }
    }
    for (int r = 0; r < s->reps; r++)
        for (int j = 0; j < 2; j++) {
            int k = r % 2 ? 1 - j : j; /* A B, B A, ... */
            s->t.out = s->replaying && k ? s->outs : NULL;
            int rc = cli_bench_run_batch(s->e[k], B, 0, s->n, s->vocab, 1, &s->t, &unused, &s->dec[k][r], &st[k], err);
            s->t.out = NULL;
            if (rc) return rc;
            if (s->replaying && k && mismatch < 0) mismatch = first_difference(s->outs, s->full + s->t.n, w, B, s->n, &at);
            if (!s->as_json)
                fprintf(stderr, "run %d/%d %-9s %.1f tok/s (accepted %llu of %llu proposed)\n", r + 1, s->reps,
                        k ? "speculate" : "none", s->dec[k][r],
                        st[k].spec_accepted[HEARTH_SPEC_LOOKUP] + st[k].spec_accepted[HEARTH_SPEC_DRAFT] +
                            st[k].spec_accepted[HEARTH_SPEC_SUFFIX],
                        st[k].spec_proposed[HEARTH_SPEC_LOOKUP] + st[k].spec_proposed[HEARTH_SPEC_DRAFT] +
                            st[k].spec_proposed[HEARTH_SPEC_SUFFIX]);
        }
    /* the draft model alone, as many runs: what one of its steps costs against the model's */
    for (int r = 0; s->e[2] && r < s->reps; r++) {
        hearth_batch_stats unused_st;
        int rc = cli_bench_run_batch(s->e[2], B, 0, s->n, s->vocab, 1, &s->t, &unused, &s->dec[2][r], &unused_st, err);
        if (rc) return rc;
    }
    for (int k = 0; k < (s->e[2] ? 3 : 2); k++) qsort(s->dec[k], (size_t)s->reps, sizeof(double), cli_cmp_double);
    double a = cli_median_sorted(s->dec[0], s->reps), b = cli_median_sorted(s->dec[1], s->reps);
    double draft_tps = s->e[2] ? cli_median_sorted(s->dec[2], s->reps) : 0.0;
    double speedup = a > 0 ? b / a : 0.0;
    int p = s->proposer;
    unsigned long long prop = st[1].spec_proposed[p], acc = st[1].spec_accepted[p];
    unsigned long long drafts = st[1].spec_drafts[p], rej = st[1].spec_rejected[p];
    /* per proposed token: a draft keeps tokens up to its first miss, so the estimate of A
     * is the kept tokens over the kept and the missed ones */
    double a_hat = acc + rej ? (double)acc / (double)(acc + rej) : 0.0;
    double per_step = drafts ? 1.0 + (double)acc / (double)drafts : 1.0;
    double ideal = s->replaying ? ideal_speedup(A, K) : 0.0;
    /* a verification cycle: one step of the model and K of the draft (the first feeding what
     * was accepted), each about a decode step of its own: the ideal with the draft's cost */
    double ideal_draft = draft_tps > 0 ? ideal / (1.0 + K * a / draft_tps) : 0.0;
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I}", "model",
                          hearth_model_path(s->m), "device",
                          hearth_engine_device(s->e[1]) == HEARTH_DEVICE_CUDA ? "cuda" : "cpu", "proposer",
                          hearth_speculate_name(p), "threads", hearth_engine_threads(s->e[1]), "batch", B,
                          "prompt_tokens", (int)s->t.n, "gen_tokens", s->n, "runs", s->reps, "none_decode_tps", a,
                          "spec_decode_tps", b, "speedup", speedup, "last_run_proposed", (json_int_t)prop,
                          "last_run_accepted", (json_int_t)acc, "last_run_drafts", (json_int_t)drafts);
    if (s->replaying) {
        json_t *x = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:i, s:i, s:i}", "num_draft_tokens",
                              K, "spec_accept", A, "measured_accept", a_hat, "tokens_per_step", per_step,
                              "ideal_speedup", ideal, "fraction_of_ideal", ideal > 0 ? speedup / ideal : 0.0,
                              "draft_decode_tps", draft_tps, "ideal_with_draft_cost", ideal_draft,
                              "fraction_of_ideal_with_draft_cost", ideal_draft > 0 ? speedup / ideal_draft : 0.0,
                              "texts_equal", mismatch < 0, "rerecorded", rounds, "requests_departing_from_none",
                              departs < 0 ? 0 : departs, "first_departure_from_none", departs < 0 ? -1 : departs_at);
        json_object_update(o, x);
        json_decref(x);
    }
    if (s->as_json) {
        json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
        putchar('\n');
    } else {
        printf("model       %s\nprompt      %s: %zu tokens; %d request(s) x %d new tokens, greedy (median of %d)\n"
               "none        %.1f tok/s decode\n%-11s %.1f tok/s decode: %.2fx\nacceptance  %llu of %llu "
               "proposed tokens in %llu drafts (last run)\n",
               hearth_model_path(s->m), s->prompt_file, s->t.n, B, s->n, s->reps, a, hearth_speculate_name(p), b,
               speedup, acc, prop, drafts);
        if (s->replaying)
        {
            printf("replay      A %.2f, K %d: measured A %.3f, %.2f tokens a verified step\n"
                   "ideal       %.2fx (1 - A^(K+1)) / (1 - A): achieved %.2f of it\n",
                   A, K, a_hat, per_step, ideal, ideal > 0 ? speedup / ideal : 0.0);
            if (s->e[2])
                printf(
                    "draft cost  the draft alone %.1f tok/s: ideal with K of its steps a cycle %.2fx, achieved %.2f\n",
                    draft_tps, ideal_draft, ideal_draft > 0 ? speedup / ideal_draft : 0.0);
            printf("text        %s", mismatch >= 0 ? "DIFFERS from the replayed text"
                                     : departs < 0 ? "equal to the run without speculation"
                                                   : "equal to the replayed text, which");
            if (mismatch < 0 && departs >= 0)
                printf(" departs from the run without speculation in %d request(s), first at token %d (%d re-recording(s))",
                       departs, departs_at, rounds);
            putchar('\n');
        }
    }
    fflush(stdout);
    json_decref(o);
    if (mismatch >= 0) {
        fprintf(stderr, "hearth: bench: B %d, K %d, A %.2f: speculative request %d's token %d differs from the text it "
                        "replayed (%d re-recordings)\n", B, K, A, mismatch, at, rounds);
        *differs = 1;
    }
    return 0;
}

int cli_bench_spec(hearth_model *m, hearth_engine_options eo, const char *prompt_file, const int *Bs, int nB, int n,
                   int reps, const int *Ks, int nK, const double *As, int nA, int as_json) {
    hearth_error err = {0};
    char *text = cli_read_file(prompt_file);
    if (!text) return 1;
    spec_run s = {.m = m, .prompt_file = prompt_file, .n = n, .reps = reps, .as_json = as_json};
    int32_t *ids = NULL;
    if (hearth_tokenize(m, text, strlen(text), 1, &ids, &s.t.n, &err)) {
        free(text);
        return cli_fail(&err);
    }
    free(text);
    s.t.ids = ids;
    s.replaying = nA > 0; /* with a draft model its proposals are replaced; else lookup's are */
    s.proposer = eo.draft_model                    ? HEARTH_SPEC_DRAFT
                 : eo.speculate == HEARTH_SPEC_MTP ? HEARTH_SPEC_MTP
                                                   : HEARTH_SPEC_LOOKUP;
    int maxB = 1;
    for (int i = 0; i < nB; i++) maxB = Bs[i] > maxB ? Bs[i] : maxB;
    hearth_spec_replay rp = {.seed = 0x5eed5eedULL};
    s.rp = &rp;
    hearth_engine_options on = eo, off = eo;
    if (on.speculate == HEARTH_SPEC_NONE) on.speculate = HEARTH_SPEC_LOOKUP;
    off.speculate = HEARTH_SPEC_NONE;
    off.draft_model = NULL;
    if (s.replaying) on.spec_replay = &rp; /* tokens NULL until the first recording */
    if (!on.context_length) on.context_length = off.context_length = (int)s.t.n + n + 16;
    if (!on.max_sequences) on.max_sequences = off.max_sequences = maxB;
    for (int k = 0; k < 3; k++) s.dec[k] = calloc((size_t)reps, sizeof(double));
    if (s.replaying) {
        s.full = malloc((size_t)maxB * (s.t.n + (size_t)n) * sizeof *s.full);
        s.none = malloc((size_t)maxB * (size_t)n * sizeof *s.none);
        s.outs = malloc((size_t)maxB * (size_t)n * sizeof *s.outs);
    }
    int rc = 0, differs = 0;
    if (!s.dec[0] || !s.dec[1] || !s.dec[2] || (s.replaying && (!s.full || !s.none || !s.outs))) {
        fprintf(stderr, "hearth: bench: out of memory\n");
        rc = 1;
    }
    if (!rc) rc = hearth_engine_create(m, &off, &s.e[0], &err) || hearth_engine_create(m, &on, &s.e[1], &err);
    if (!rc && s.replaying && eo.draft_model) rc = hearth_engine_create(eo.draft_model, &off, &s.e[2], &err);
    s.vocab = rc ? 0 : hearth_model_vocab_rows(s.e[0]);
    for (int bi = 0; !rc && bi < nB; bi++) {
        int B = Bs[bi], at = 0, who;
        double unused;
        s.t.num_draft_tokens = Ks[0];
        rp.tokens = NULL; /* warm-up with the draft's own proposals */
        for (int k = 0; !rc && k < 3; k++)
            if (s.e[k]) rc = cli_bench_run_batch(s.e[k], B, 0, 8, s.vocab, 1, &s.t, &unused, &unused, NULL, &err);
        if (!rc && s.replaying) { /* the target's greedy texts at this batch count, without speculation */
            s.t.out = s.none;
            rc = cli_bench_run_batch(s.e[0], B, 0, n, s.vocab, 1, &s.t, &unused, &unused, NULL, &err);
            s.t.out = NULL;
            for (int i = 0; i < B; i++) memcpy(s.full + (size_t)i * (s.t.n + n), ids, s.t.n * sizeof *s.full);
            rp.tokens = s.full, rp.n = s.t.n + (size_t)n, rp.n_texts = B;
            if (!rc && !as_json && (who = first_difference(s.none, s.none, 0, B, n, &at)) >= 0)
                fprintf(stderr, "hearth: bench: B %d without speculation: request %d's token %d differs from request "
                                "0's (same prompt: the step's rounding); each request replays its own\n", B, who, at);
        }
        for (int ki = 0; !rc && ki < nK; ki++)
            for (int ai = 0; !rc && ai < (s.replaying ? nA : 1); ai++)
                rc = spec_config(&s, B, Ks[ki], s.replaying ? As[ai] : -1.0, &differs, &err);
    }
    if (rc) rc = err.status ? cli_fail(&err) : 1;
    for (int k = 0; k < 3; k++) hearth_engine_free(s.e[k]), free(s.dec[k]);
    free(s.full);
    free(s.none);
    free(s.outs);
    hearth_free(ids);
    return rc ? rc : differs;
}
