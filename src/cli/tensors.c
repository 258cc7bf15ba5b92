/* tensors.c: `hearth tensors <model> [name --out file]`: lists tensors as JSON, or writes
 * one tensor dequantized to little-endian float32 (for inspection and parity tests). */
#include "cli/cli.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *tensors_usage = "hearth tensors <model> [<tensor-name> --out file.f32]";

int cli_tensors(int argc, char **argv) {
    const char *model = NULL, *name = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf("usage: %s\n", tensors_usage); return 0; }
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] == '-') return cli_usage_error(tensors_usage, "%s: unknown flag, or a flag without its value", argv[i]);
        else if (!model) model = argv[i];
        else if (!name) name = argv[i];
        else return cli_usage_error(tensors_usage, "%s: unexpected argument", argv[i]);
    }
    if (!model || (name && !out)) return cli_usage_error(tensors_usage, "%s", "need a model (and --out with a name)");
    hearth_model *m;
    if (cli_open_model(model, &m)) return 1;
    int rc = 0;
    if (!name) {
        char *j = hearth_model_tensors_json(m);
        printf("%s\n", j);
        hearth_free(j);
    } else {
        hearth_error err = {0};
        float *data;
        size_t n;
        if (hearth_model_tensor_f32(m, name, &data, &n, &err)) rc = cli_fail(&err);
        else {
            FILE *f = fopen(out, "wb");
            int ok = f && fwrite(data, sizeof *data, n, f) == n;
            if (f && fclose(f)) ok = 0;
            if (!ok) {
                fprintf(stderr, "hearth: %s: %s\n", out, strerror(errno));
                rc = 1;
            }
            hearth_free(data);
        }
    }
    hearth_model_close(m);
    return rc;
}
