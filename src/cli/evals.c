/* evals.c: `hearth evals [--json]`: the runs recorded in the evals database
 * ($HEARTH_CACHE/evals.sqlite): fit predictions (hearth fit --record), fit checks
 * (predicted vs measured peak), benchmarks and perplexity runs. Reads only. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *evals_usage =
    "hearth evals [--json]\n"
    "       hearth evals add --kind K --model M [--ctx N] [--predicted BYTES] [--measured BYTES] [--tok-s X]\n"
    "                        [--details JSON]";

/* `hearth evals add`: one row from a script (tests/parity/test_fit.py records its
 * predicted-vs-measured checks this way, so the schema lives only in hub_evals.c). */
static int evals_add(int argc, char **argv) {
    hearth_eval_row r = {.predicted_peak_bytes = -1, .measured_peak_bytes = -1, .tok_s = -1};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return cli_usage_error(evals_usage, "%s: needs a value", a);
        if (!strcmp(a, "--kind"))
            r.kind = v;
        else if (!strcmp(a, "--model"))
            r.model = v;
        else if (!strcmp(a, "--ctx"))
            r.context = atoi(v);
        else if (!strcmp(a, "--predicted"))
            r.predicted_peak_bytes = atoll(v);
        else if (!strcmp(a, "--measured"))
            r.measured_peak_bytes = atoll(v);
        else if (!strcmp(a, "--tok-s"))
            r.tok_s = atof(v);
        else if (!strcmp(a, "--details"))
            r.details_json = v;
        else
            return cli_usage_error(evals_usage, "%s: unknown flag", a);
        i++;
    }
    if (!r.kind || !r.model) return cli_usage_error(evals_usage, "%s", "add needs --kind and --model");
    hearth_error err = {0};
    return hearth_evals_record(&r, &err) ? cli_fail(&err) : 0;
}

static void mib_or_dash(const json_t *v, char *out, size_t cap) {
    if (json_is_integer(v))
        snprintf(out, cap, "%.1f", (double)json_integer_value(v) / 1048576.0);
    else
        snprintf(out, cap, "-");
}

int cli_evals(int argc, char **argv) {
    int as_json = 0;
    if (argc > 1 && !strcmp(argv[1], "add")) return evals_add(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: %s\n", evals_usage);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            as_json = 1;
        else
            return cli_usage_error(evals_usage, "%s: unexpected argument", argv[i]);
    }
    hearth_error err = {0};
    char *j = NULL;
    if (hearth_evals_json(&j, &err)) return cli_fail(&err);
    if (as_json) {
        printf("%s\n", j);
        hearth_free(j);
        return 0;
    }
    json_t *arr = json_loads(j, 0, NULL);
    hearth_free(j);
    if (!json_array_size(arr))
        printf("no runs recorded yet (hearth fit --record, hearth bench, hearth perplexity, the fit test)\n");
    else
        printf("%5s %-20s %-10s %7s %12s %12s %7s %9s  %s\n", "ID", "TIME", "KIND", "CONTEXT", "PREDICT MiB",
               "MEASURE MiB", "ERROR", "TOK/S", "MODEL");
    size_t i;
    const json_t *r;
    json_array_foreach(arr, i, r) {
        char p[32], m[32], e[16] = "-", t[32] = "-";
        const json_t *pv = json_object_get(r, "predicted_peak_bytes"), *mv = json_object_get(r, "measured_peak_bytes");
        mib_or_dash(pv, p, sizeof p);
        mib_or_dash(mv, m, sizeof m);
        if (json_is_integer(pv) && json_is_integer(mv) && json_integer_value(mv) > 0)
            snprintf(e, sizeof e, "%+.2f%%",
                     100.0 * (double)(json_integer_value(pv) - json_integer_value(mv)) /
                         (double)json_integer_value(mv));
        if (json_is_number(json_object_get(r, "tok_s")))
            snprintf(t, sizeof t, "%.1f", json_number_value(json_object_get(r, "tok_s")));
        printf("%5lld %-20s %-10s %7lld %12s %12s %7s %9s  %s\n",
               (long long)json_integer_value(json_object_get(r, "id")), json_string_value(json_object_get(r, "time")),
               json_string_value(json_object_get(r, "kind")),
               (long long)json_integer_value(json_object_get(r, "context")), p, m, e, t,
               json_string_value(json_object_get(r, "model")));
        const json_t *ppl = json_object_get(json_object_get(r, "details"), "perplexity");
        if (json_is_number(ppl)) /* hearth perplexity: its result under the row */
            printf("      perplexity %.3f \u00b1 %.3f\n", json_number_value(ppl),
                   json_number_value(json_object_get(json_object_get(r, "details"), "standard_error")));
    }
    json_decref(arr);
    return 0;
}
