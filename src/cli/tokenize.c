/* tokenize.c: `hearth tokenize` and `hearth detokenize`: token ids as one JSON array on
 * stdout, text on stdout, nothing else (scripts and tests rely on it). */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *tok_usage = "hearth tokenize <model> <text> [--no-special] [--file path|-]";
static const char *detok_usage = "hearth detokenize <model> <json-array-of-ids> [--skip-special]";

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int add_special = 1;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf("usage: %s\n", tok_usage); return 0; }
        if (!strcmp(argv[i], "--no-special")) add_special = 0;
        else if (!strcmp(argv[i], "--file") && i + 1 < argc) file = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(tok_usage, "%s: unknown flag", argv[i]);
        else if (!model) model = argv[i];
        else if (!text) text = argv[i];
        else return cli_usage_error(tok_usage, "%s: unexpected argument", argv[i]);
    }
    if (!model || (!text && !file)) return cli_usage_error(tok_usage, "%s", "need a model and a text");
    char *buf = NULL;
    if (file && !(buf = cli_read_file(file))) return 1;
    if (buf) text = buf;
    hearth_model *m;
    if (cli_open_model(model, &m)) { free(buf); return 1; }
    hearth_error err = {0};
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (hearth_tokenize(m, text, strlen(text), add_special, &ids, &n, &err)) rc = cli_fail(&err);
    else {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
        hearth_free(ids);
    }
    hearth_model_close(m);
    free(buf);
    return rc;
}

int cli_detokenize(int argc, char **argv) {
    const char *model = NULL, *arr = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf("usage: %s\n", detok_usage); return 0; }
        if (!strcmp(argv[i], "--skip-special")) skip = 1;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(detok_usage, "%s: unknown flag", argv[i]);
        else if (!model) model = argv[i];
        else if (!arr) arr = argv[i];
        else return cli_usage_error(detok_usage, "%s: unexpected argument", argv[i]);
    }
    if (!model || !arr) return cli_usage_error(detok_usage, "%s", "need a model and an id array");
    json_t *j = json_loads(arr, 0, NULL);
    if (!json_is_array(j)) { json_decref(j); return cli_usage_error(detok_usage, "'%s' is not a JSON array", arr); }
    size_t n = json_array_size(j);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        json_t *v = json_array_get(j, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            free(ids);
            json_decref(j);
            return cli_usage_error(detok_usage, "%s", "ids must be non-negative integers");
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(j);
    hearth_model *m;
    if (!ids || cli_open_model(model, &m)) { free(ids); return 1; }
    hearth_error err = {0};
    char *text;
    int rc = 0;
    if (hearth_detokenize(m, ids, n, skip, &text, &err)) rc = cli_fail(&err);
    else { fputs(text, stdout); hearth_free(text); }
    free(ids);
    hearth_model_close(m);
    return rc;
}
