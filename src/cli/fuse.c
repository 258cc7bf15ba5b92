/* fuse.c: `hearth fuse`: mlx_lm.fuse's verb: a LoRA adapter folded into its base model,
 * written as a new folder (hearth_fuse does the work). */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>

static const char *fuse_usage = "hearth fuse <model> [--adapter-path adapters] [--save-path fused_model]\n"
                                "  (mlx_lm.fuse's --model M works too; --adapter DIR is --adapter-path)";

int cli_fuse(int argc, char **argv) {
    const char *model = NULL, *adapter = "adapters", *save = "fused_model";
    /* mlx_lm.fuse's flags hearth has no counterpart for: a clear refusal, not a silent skip */
    static const char *const refused[] = {"--dequantize", "--de-quantize", "--export-gguf", "--gguf-path",
                                          "--upload-repo"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) {
            printf("usage: %s\n", fuse_usage);
            return 0;
        }
        for (size_t k = 0; k < sizeof refused / sizeof *refused; k++)
            if (!strcmp(a, refused[k]))
                return cli_usage_error(fuse_usage, "%s is not supported by hearth fuse", a);
        if (!strcmp(a, "--model") && has) model = argv[++i];
        else if ((!strcmp(a, "--adapter-path") || !strcmp(a, "--adapter")) && has) adapter = argv[++i];
        else if (!strcmp(a, "--save-path") && has) save = argv[++i];
        else if (a[0] == '-') return cli_usage_error(fuse_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else return cli_usage_error(fuse_usage, "%s: unexpected argument", a);
    }
    if (!model) return cli_usage_error(fuse_usage, "%s", "need a model");
    hearth_error err = {0};
    if (hearth_fuse(model, adapter, save, &err)) return cli_fail(&err);
    fprintf(stderr, "hearth fuse: wrote %s\n", save);
    return 0;
}
