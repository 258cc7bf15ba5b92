/* bench_spec.c: `hearth bench <model> --prompt-file F`: what speculative decoding gains on a
 * prompt that repeats its context. B requests of the file's text (tokens as written, no chat
 * template), greedy, n new tokens, through the batch scheduler on two engines of the same
 * model side by side: one with --speculate none, one with prompt lookup (or --draft-model);
 * runs alternate between them so other load on the machine hits both alike. Reports the
 * median decode tok/s of each, their ratio, and the proposed / accepted token counts. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_bench_spec(hearth_model *m, hearth_engine_options eo, const char *prompt_file, int B, int n, int reps,
                   int num_draft_tokens, int as_json) {
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
    hearth_engine_options on = eo, off = eo;
    if (on.speculate == HEARTH_SPEC_NONE) on.speculate = HEARTH_SPEC_LOOKUP;
    off.speculate = HEARTH_SPEC_NONE;
    off.draft_model = NULL;
    if (!on.context_length) on.context_length = off.context_length = (int)t.n + n + 16;
    if (!on.max_sequences) on.max_sequences = off.max_sequences = B;
    hearth_engine *e[2] = {NULL, NULL}; /* [0]: none, [1]: speculating */
    int rc = hearth_engine_create(m, &off, &e[0], &err) || hearth_engine_create(m, &on, &e[1], &err);
    double *dec[2] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double))}, unused;
    if (!rc && (!dec[0] || !dec[1])) {
        fprintf(stderr, "hearth: bench: out of memory\n");
        rc = 1;
    }
    hearth_batch_stats st[2];
    int vocab = rc ? 0 : hearth_model_vocab_rows(e[0]);
    for (int k = 0; !rc && k < 2; k++) /* warm-up */
        rc = cli_bench_run_batch(e[k], B, 0, 8, vocab, 1, &t, &unused, &unused, NULL, &err);
    for (int r = 0; !rc && r < reps; r++)
        for (int j = 0; !rc && j < 2; j++) {
            int k = r % 2 ? 1 - j : j; /* A B, B A, ... */
            rc = cli_bench_run_batch(e[k], B, 0, n, vocab, 1, &t, &unused, &dec[k][r], &st[k], &err);
            if (!rc && !as_json)
                fprintf(stderr, "run %d/%d %-9s %.1f tok/s (accepted %llu of %llu proposed)\n", r + 1, reps,
                        k ? "speculate" : "none", dec[k][r],
                        st[k].spec_accepted[HEARTH_SPEC_LOOKUP] + st[k].spec_accepted[HEARTH_SPEC_DRAFT],
                        st[k].spec_proposed[HEARTH_SPEC_LOOKUP] + st[k].spec_proposed[HEARTH_SPEC_DRAFT]);
        }
    if (rc) rc = cli_fail(&err);
    if (!rc) {
        qsort(dec[0], (size_t)reps, sizeof(double), cli_cmp_double);
        qsort(dec[1], (size_t)reps, sizeof(double), cli_cmp_double);
        double a = cli_median_sorted(dec[0], reps), b = cli_median_sorted(dec[1], reps);
        int proposer = on.draft_model ? HEARTH_SPEC_DRAFT : HEARTH_SPEC_LOOKUP;
        unsigned long long prop = st[1].spec_proposed[proposer], acc = st[1].spec_accepted[proposer];
        json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:I}", "model",
                              hearth_model_path(m), "proposer", hearth_speculate_name(proposer), "threads",
                              hearth_engine_threads(e[1]), "batch", B, "prompt_tokens", (int)t.n, "gen_tokens", n,
                              "runs", reps, "none_decode_tps", a, "spec_decode_tps", b, "speedup", a > 0 ? b / a : 0.0,
                              "last_run_proposed", (json_int_t)prop, "last_run_accepted", (json_int_t)acc);
        if (as_json) {
            json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
            putchar('\n');
        } else {
            printf("model       %s\nprompt      %s: %zu tokens; %d request(s) x %d new tokens, greedy (median of %d)\n"
                   "none        %.1f tok/s decode\n%-11s %.1f tok/s decode: %.2fx\nacceptance  %llu of %llu "
                   "proposed tokens (last run)\n",
                   hearth_model_path(m), prompt_file, t.n, B, n, reps, a, hearth_speculate_name(proposer), b,
                   a > 0 ? b / a : 0.0, acc, prop);
        }
        json_decref(o);
    }
    hearth_engine_free(e[0]);
    hearth_engine_free(e[1]);
    free(dec[0]);
    free(dec[1]);
    hearth_free(ids);
    return rc;
}
