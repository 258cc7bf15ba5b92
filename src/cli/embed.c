/* embed.c: `hearth embed`: embeds texts with an embedding model (hearth_embed*) and
 * prints the vectors, one line of numbers per input or one JSON object with --json.
 * Output only on stdout (scripts and tests read it); no server logic here. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *embed_usage =
    "hearth embed <model> --text TEXT [--text TEXT ...] [--file path|-] [--json] [--truncate] [--threads N]\n"
    "  --file: one input per non-empty line; --truncate: cut inputs longer than the model's\n"
    "  maximum (as sentence-transformers does) instead of failing. See docs/cli.md.";

typedef struct embed_inputs {
    const char **texts;
    size_t n, cap;
} embed_inputs;

static int inputs_add(embed_inputs *in, const char *text) {
    if (in->n == in->cap) {
        size_t cap = in->cap ? in->cap * 2 : 16;
        const char **t = realloc(in->texts, cap * sizeof *t);
        if (!t) return -1;
        in->texts = t;
        in->cap = cap;
    }
    in->texts[in->n++] = text;
    return 0;
}

/* Splits buf in place at newlines; every non-empty line is one input. */
static int inputs_add_lines(embed_inputs *in, char *buf) {
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[len - 1] = 0;
        if (*line && inputs_add(in, line)) return -1;
    }
    return 0;
}

static void print_vectors(const hearth_model *m, const hearth_embedder *e, const float *v, size_t n, size_t tokens,
                          int as_json) {
    int dim = hearth_embedder_dim(e);
    if (!as_json) {
        for (size_t i = 0; i < n; i++)
            for (int c = 0; c < dim; c++) printf(c + 1 < dim ? "%.9g " : "%.9g\n", v[i * dim + c]);
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *vec = json_array();
        for (int c = 0; c < dim; c++) json_array_append_new(vec, json_real(v[i * dim + c]));
        json_array_append_new(data, json_pack("{s:I, s:o}", "index", (json_int_t)i, "embedding", vec));
    }
    json_t *o = json_pack("{s:s, s:i, s:s, s:b, s:I, s:o}", "model", hearth_model_path(m), "dim", dim, "pooling",
                          hearth_embedder_pooling(e), "normalized", hearth_embedder_normalizes(e), "prompt_tokens",
                          (json_int_t)tokens, "data", data);
    json_dumpf(o, stdout, JSON_REAL_PRECISION(9));
    putchar('\n');
    json_decref(o);
}

static int embed_run(const char *model, embed_inputs *in, int as_json, int truncate, int threads) {
    hearth_model *m;
    if (cli_open_model(model, &m)) return 1;
    hearth_error err = {0};
    hearth_embedder *e = NULL;
    hearth_embedder_options o = {.n_threads = threads};
    int32_t **ids = calloc(in->n, sizeof *ids);
    size_t *lens = calloc(in->n, sizeof *lens), tokens = 0;
    float *v = NULL;
    int rc = 0;
    if (!ids || !lens) {
        fprintf(stderr, "hearth: out of memory\n");
        rc = 1;
    } else if (hearth_embedder_create(m, &o, &e, &err)) {
        rc = cli_fail(&err);
    }
    for (size_t i = 0; !rc && i < in->n; i++) {
        if (hearth_embed_tokenize(e, in->texts[i], strlen(in->texts[i]), truncate, &ids[i], &lens[i], &err)) {
            fprintf(stderr, "hearth: input %zu: %s\n", i, err.message);
            rc = 1;
        }
        tokens += lens[i];
    }
    if (!rc && !(v = malloc(in->n * (size_t)hearth_embedder_dim(e) * sizeof *v))) {
        fprintf(stderr, "hearth: out of memory\n");
        rc = 1;
    }
    if (!rc && hearth_embed(e, (const int32_t *const *)ids, lens, in->n, v, &err)) rc = cli_fail(&err);
    if (!rc) print_vectors(m, e, v, in->n, tokens, as_json);
    for (size_t i = 0; ids && i < in->n; i++) hearth_free(ids[i]);
    free(ids);
    free(lens);
    free(v);
    hearth_embedder_free(e);
    hearth_model_close(m);
    return rc;
}

int cli_embed(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int as_json = 0, truncate = 0;
    long threads = 0;
    embed_inputs in = {0};
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: %s\n", embed_usage);
            free(in.texts);
            return 0;
        }
        if (!strcmp(argv[i], "--text") && i + 1 < argc)
            rc = inputs_add(&in, argv[++i]) ? 1 : 0;
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--json"))
            as_json = 1;
        else if (!strcmp(argv[i], "--truncate"))
            truncate = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *end;
            threads = strtol(argv[++i], &end, 10);
            if (*end || threads < 0 || threads > 4096) rc = cli_usage_error(embed_usage, "--threads %s: not a thread count", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1])
            rc = cli_usage_error(embed_usage, "%s: unknown flag", argv[i]);
        else if (!model)
            model = argv[i];
        else
            rc = cli_usage_error(embed_usage, "%s: unexpected argument", argv[i]);
    }
    char *buf = NULL;
    if (!rc && file && (!(buf = cli_read_file(file)) || inputs_add_lines(&in, buf))) rc = 1;
    if (!rc && (!model || !in.n)) rc = cli_usage_error(embed_usage, "%s", "need a model and at least one input");
    if (!rc) rc = embed_run(model, &in, as_json, truncate, (int)threads);
    free(in.texts);
    free(buf);
    return rc;
}
