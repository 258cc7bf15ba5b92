/* trace.c: `hearth trace`: the logits of a prompt's last positions and of a greedy
 * continuation, as JSON, for parity tests against mlx-lm goldens. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *trace_usage =
    "hearth trace <model> --ids '[1,2,3]' [--last 4] [--top 20] [--steps 32] [--step-top 5] [--threads N]\n"
    "       [--device cpu|cuda|auto] [--cuda-exact] [--expert-offload N] [--adapter-path DIR] [--max-step-tokens 256]";


static json_t *top_json(const float *x, int vocab, int k) {
    json_t *arr = json_array();
    int32_t best[64];
    int have = 0;
    for (int i = 0; i < vocab; i++) { /* insertion into a short sorted list; ties keep the lower id */
        if (have == k && !(x[i] > x[best[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && x[best[j - 1]] < x[i]) { best[j] = best[j - 1]; j--; }
        best[j] = i;
    }
    for (int i = 0; i < have; i++) json_array_append_new(arr, json_pack("[i, f]", best[i], (double)x[best[i]]));
    return arr;
}

int cli_trace(int argc, char **argv) {
    const char *model = NULL, *ids_json = NULL, *adapter_path = NULL;
    int last = 4, top = 20, steps = 32, step_top = 5;
    hearth_engine_options eo = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) { printf("usage: %s\n", trace_usage); return 0; }
        if (cli_parse_engine_flag(argc, argv, &i, &eo)) continue;
        int flag_rc;
        if (cli_parse_pool_flag(argc, argv, &i, &eo, trace_usage, &flag_rc)) {
            if (flag_rc) return flag_rc;
            continue;
        }
        if (!strcmp(a, "--ids") && has) ids_json = argv[++i];
        else if (!strcmp(a, "--adapter-path") && has) adapter_path = argv[++i];
        else if (!strcmp(a, "--last") && has) last = atoi(argv[++i]);
        else if (!strcmp(a, "--top") && has) top = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && has) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--step-top") && has) step_top = atoi(argv[++i]);
        else if (a[0] == '-') return cli_usage_error(trace_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else return cli_usage_error(trace_usage, "%s: unexpected argument", a);
    }
    json_t *ids = ids_json ? json_loads(ids_json, 0, NULL) : NULL;
    size_t n = json_array_size(ids);
    if (!model || !n || last < 1 || last > 8 || (size_t)last > n || top < 1 || top > 64 || step_top < 1 ||
        step_top > 64 || steps < 0) {
        json_decref(ids);
        return cli_usage_error(trace_usage, "%s", "need a model, a non-empty --ids array, 1 <= --last <= 8");
    }
    int32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    json_decref(ids);
    hearth_model *m;
    if (cli_open_model(model, &m)) { free(tok); return 1; }
    if (!eo.context_length) eo.context_length = (int)n + steps + 16;
    hearth_engine *e = NULL;
    hearth_error err = {0};
    int rc = 0, seq = -1;
    float *logits = NULL;
    if (hearth_engine_create(m, &eo, &e, &err)) rc = cli_fail(&err);
    if (!rc && adapter_path) rc = cli_mount_adapter(e, adapter_path, 1);
    if (!rc && (hearth_seq_open(e, &seq, &err) || hearth_seq_set_adapter(e, seq, NULL, &err))) rc = cli_fail(&err);
    int vocab = rc ? 0 : hearth_model_vocab_rows(e);
    if (!rc) logits = malloc((size_t)last * vocab * sizeof *logits);
    json_t *out = json_object(), *pl = json_array(), *st = json_array();
    if (!rc && hearth_seq_append(e, seq, tok, n, (size_t)last, logits, &err)) rc = cli_fail(&err);
    for (int i = 0; !rc && i < last; i++)
        json_array_append_new(pl, json_pack("{s:i, s:o}", "pos", (int)n - last + i, "top",
                                            top_json(logits + (size_t)i * vocab, vocab, top)));
    float *cur = logits ? logits + (size_t)(last - 1) * vocab : NULL;
    for (int s = 0; !rc && s < steps; s++) {
        int32_t next = 0;
        for (int i = 1; i < vocab; i++)
            if (cur[i] > cur[next]) next = i;
        if (hearth_seq_append(e, seq, &next, 1, 1, logits, &err)) { rc = cli_fail(&err); break; }
        cur = logits;
        json_array_append_new(st, json_pack("{s:i, s:o}", "token", next, "top", top_json(cur, vocab, step_top)));
    }
    json_object_set_new(out, "prompt", pl);
    json_object_set_new(out, "steps", st);
    if (!rc) {
        json_dumpf(out, stdout, JSON_COMPACT);
        putchar('\n');
    }
    json_decref(out);
    free(logits);
    free(tok);
    hearth_engine_free(e);
    hearth_model_close(m);
    return rc;
}
