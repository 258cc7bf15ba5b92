/* choose.c: the appliance's model (hearth_choose_model) for `hearth` with no --model:
 * says what it detected and chose, and starts the background pull of a better catalogue
 * model when one is absent and pulling is allowed (an interactive terminal, or
 * HEARTH_AUTO_PULL=1; never with --no-download, HEARTH_AUTO_PULL=0 or HF_HUB_OFFLINE=1),
 * saying what it downloads and how big before it starts. */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int auto_pull_allowed(int no_download) {
    if (no_download) return 0;
    const char *off = getenv("HF_HUB_OFFLINE"), *v = getenv("HEARTH_AUTO_PULL");
    if (off && *off && strcmp(off, "0")) return 0;
    if (v && *v) return strcmp(v, "0") != 0;
    return isatty(0) && isatty(2); /* tests and scripts never download by surprise */
}

const char *cli_choose_model(int argc, char **argv, int no_download) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--model") || !strncmp(argv[i], "--model=", 8)) return NULL;
    static hearth_choice c;
    hearth_error err = {0};
    if (hearth_choose_model(&c, &err)) {
        fprintf(stderr, "hearth: choosing a model: %s; serving the default\n", err.message);
        return NULL;
    }
    fprintf(stderr, "hearth: this machine: %s\nhearth: serving %s (%s)\n", c.machine, c.name,
            c.model[0] ? c.model : "not on disk: serve looks for it");
    if (c.better[0]) {
        const char *inc = c.better_include[0] ? c.better_include : NULL;
        if (auto_pull_allowed(no_download)) {
            fprintf(stderr,
                    "hearth: %s fits this machine better: downloading %s%s%s (about %.1f GB) in the background "
                    "(GET /downloads shows progress; --no-download skips this). It becomes the default next time.\n",
                    c.better_name, c.better, inc ? " " : "", inc ? inc : "", c.better_bytes / 1e9);
            if (hearth_download_start(c.better, inc, &err))
                fprintf(stderr, "hearth: the download did not start: %s\n", err.message);
        } else
            fprintf(stderr, "hearth: %s would fit this machine better (about %.1f GB): hearth pull %s%s%s\n",
                    c.better_name, c.better_bytes / 1e9, c.better, inc ? " --include " : "", inc ? inc : "");
    }
    return c.model[0] ? c.model : NULL;
}
