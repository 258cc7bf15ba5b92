/* info.c: `hearth info <model> [--json]`: what a model is (`hearth ls` lives in ls.c). */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <string.h>

static const char *info_usage = "hearth info <model> [--json]";

static void print_human(const char *json_text) {
    json_t *o = json_loads(json_text, 0, NULL);
    if (!o) return;
    const json_t *q = json_object_get(o, "quantization"), *t = json_object_get(o, "tokenizer"),
                 *c = json_object_get(o, "chat_template");
    printf("model         %s\n", json_string_value(json_object_get(o, "name")));
    printf("path          %s\n", json_string_value(json_object_get(o, "path")));
    printf("format        %s\n", json_string_value(json_object_get(o, "format")));
    printf("architecture  %s\n", json_string_value(json_object_get(o, "architecture")));
    double params = (double)json_integer_value(json_object_get(o, "parameters"));
    printf("parameters    %.1fM\n", params / 1e6);
    printf("size          %.1f MiB in %lld tensors\n",
           (double)json_integer_value(json_object_get(o, "tensor_bytes")) / (1024.0 * 1024.0),
           (long long)json_integer_value(json_object_get(o, "tensors")));
    printf("layers        %lld, hidden %lld, heads %lld (kv %lld, dim %lld), ffn %lld\n",
           (long long)json_integer_value(json_object_get(o, "num_hidden_layers")),
           (long long)json_integer_value(json_object_get(o, "hidden_size")),
           (long long)json_integer_value(json_object_get(o, "num_attention_heads")),
           (long long)json_integer_value(json_object_get(o, "num_key_value_heads")),
           (long long)json_integer_value(json_object_get(o, "head_dim")),
           (long long)json_integer_value(json_object_get(o, "intermediate_size")));
    printf("vocab         %lld\ncontext       %lld\n", (long long)json_integer_value(json_object_get(o, "vocab_size")),
           (long long)json_integer_value(json_object_get(o, "context_length")));
    const char *qf = json_string_value(json_object_get(q, "format"));
    printf("quantization  %s", qf);
    if (qf && !strcmp(qf, "mlx"))
        printf(" affine %lld-bit, group %lld", (long long)json_integer_value(json_object_get(q, "bits")),
               (long long)json_integer_value(json_object_get(q, "group_size")));
    const char *k;
    json_t *v;
    printf(" (");
    int first = 1;
    json_object_foreach((json_t *)json_object_get(q, "tensor_types"), k, v) {
        printf("%s%s x%lld", first ? "" : ", ", k, (long long)json_integer_value(v));
        first = 0;
    }
    printf(")\n");
    if (json_object_get(t, "error")) printf("tokenizer     unavailable: %s\n", json_string_value(json_object_get(t, "error")));
    else
        printf("tokenizer     %s, %lld tokens, bos %s, eos %s\n", json_string_value(json_object_get(t, "kind")),
               (long long)json_integer_value(json_object_get(t, "vocab_size")),
               json_string_value(json_object_get(t, "bos_token")) ? json_string_value(json_object_get(t, "bos_token")) : "-",
               json_string_value(json_object_get(t, "eos_token")) ? json_string_value(json_object_get(t, "eos_token")) : "-");
    const json_t *unloaded = json_object_get(o, "not_loaded");
    if (json_array_size(unloaded)) {
        printf("not loaded   ");
        size_t i;
        json_t *v;
        json_array_foreach(unloaded, i, v) printf(" %s", json_string_value(v));
        printf(" (the text model runs without them)\n");
    }
    if (json_is_true(json_object_get(o, "mtp_head")))
        printf("MTP head      yes (mtp.*: hearth serve/generate --speculate mtp proposes with it)\n");
    if (json_is_true(json_object_get(c, "present")))
        printf("chat template %lld chars from %s\n", (long long)json_integer_value(json_object_get(c, "length")),
               json_string_value(json_object_get(c, "source")));
    else printf("chat template none\n");
    json_decref(o);
}

int cli_info(int argc, char **argv) {
    const char *model = NULL;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf("usage: %s\n", info_usage); return 0; }
        if (!strcmp(argv[i], "--json")) as_json = 1;
        else if (argv[i][0] == '-') return cli_usage_error(info_usage, "%s: unknown flag", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error(info_usage, "%s: unexpected argument", argv[i]);
    }
    if (!model) return cli_usage_error(info_usage, "%s", "no model given");
    hearth_model *m;
    if (cli_open_model(model, &m)) return 1;
    char *j = hearth_model_info_json(m);
    if (as_json) printf("%s\n", j);
    else print_human(j);
    hearth_free(j);
    hearth_model_close(m);
    return 0;
}
