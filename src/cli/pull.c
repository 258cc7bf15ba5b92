/* pull.c: `hearth pull <org/name>[@revision] [--include P ...] [--exclude P ...]`:
 * downloads a model from the Hugging Face hub (hearth_pull) with a progress bar on
 * stderr: redrawn in place on a terminal, one line per file otherwise (logs, CI). */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *pull_usage = "hearth pull <org/name>[@revision] [--include PATTERN ...] [--exclude PATTERN ...]";

/* --include/--exclude are few; 64 each is far more than a command line needs. */
#define PULL_MAX_PATTERNS 64

int cli_pull(int argc, char **argv) {
    const char *model = NULL, *include[PULL_MAX_PATTERNS], *exclude[PULL_MAX_PATTERNS];
    size_t n_inc = 0, n_exc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            printf("usage: %s\n", pull_usage);
            return 0;
        }
        if ((!strcmp(a, "--include") || !strcmp(a, "--exclude")) && i + 1 < argc) {
            int inc = a[2] == 'i';
            size_t *n = inc ? &n_inc : &n_exc;
            if (*n == PULL_MAX_PATTERNS) return cli_usage_error(pull_usage, "too many %s patterns", a);
            (inc ? include : exclude)[(*n)++] = argv[++i];
        } else if (a[0] == '-')
            return cli_usage_error(pull_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model)
            model = a;
        else
            return cli_usage_error(pull_usage, "%s: unexpected argument", a);
    }
    if (!model) return cli_usage_error(pull_usage, "%s", "need a model id (org/name)");
    cli_progress p = {.tty = isatty(2), .doing = "downloading"};
    hearth_pull_options o = {.include = include,
                             .n_include = n_inc,
                             .exclude = exclude,
                             .n_exclude = n_exc,
                             .on_progress = cli_transfer_progress,
                             .user = &p};
    hearth_error err = {0};
    char *dir = NULL;
    fprintf(stderr, "pull: %s\n", model);
    if (hearth_pull(model, &o, &dir, &err)) {
        if (p.line_open) fputc('\n', stderr);
        return cli_fail(&err);
    }
    printf("%s\n", dir);
    hearth_free(dir);
    return 0;
}
