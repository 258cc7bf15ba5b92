/* convert.c: `hearth convert`: a float safetensors model to an MLX folder, optionally
 * quantized (hearth_convert does the work), with a progress line on a terminal. */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *convert_usage =
    "hearth convert <model> --out <dir> [-q|--quantize] [--q-bits 4] [--q-group-size 64]\n"
    "       [--quant-predicate mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]\n"
    "       hearth convert <model> --out <file.gguf> --outtype f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1";

static void on_progress(void *user, size_t done, size_t total, const char *tensor) {
    (void)user;
    fprintf(stderr, "\r  %zu/%zu tensors  %-60.60s", done, total, tensor);
    if (done == total) fprintf(stderr, "\n");
}

int cli_convert(int argc, char **argv) {
    const char *model = NULL;
    hearth_convert_options o = {.bits = 4, .group_size = 64};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            printf("usage: %s\n", convert_usage);
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quantize")) {
            o.quantize = 1;
            continue;
        }
        int *num = !strcmp(a, "--q-bits") ? &o.bits : !strcmp(a, "--q-group-size") ? &o.group_size : NULL;
        if ((num || !strcmp(a, "--out") || !strcmp(a, "--outtype") || !strcmp(a, "--quant-predicate")) && !v)
            return cli_usage_error(convert_usage, "flag '%s' needs a value", a);
        if (num) {
            char *end;
            long x = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || x < 1 || x > 1024)
                return cli_usage_error(convert_usage, "'%s' is not a usable number", argv[i]);
            *num = (int)x;
        } else if (!strcmp(a, "--out"))
            o.out_dir = argv[++i];
        else if (!strcmp(a, "--outtype"))
            o.gguf_type = argv[++i];
        else if (!strcmp(a, "--quant-predicate"))
            o.quant_recipe = argv[++i];
        else if (a[0] == '-')
            return cli_usage_error(convert_usage, "unknown flag '%s'", a);
        else if (!model)
            model = a;
        else
            return cli_usage_error(convert_usage, "unexpected argument '%s'", a);
    }
    if (!model || !o.out_dir) return cli_usage_error(convert_usage, "%s", "need a model and --out");
    if (o.gguf_type && o.quantize)
        return cli_usage_error(convert_usage, "%s", "-q makes MLX output; GGUF output takes --outtype");
    if (isatty(2)) o.progress = on_progress;
    hearth_error err = {0};
    if (hearth_convert(model, &o, &err)) return cli_fail(&err);
    printf("%s\n", o.out_dir);
    return 0;
}
