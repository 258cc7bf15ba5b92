/* choose.c: the appliance's model (hearth_choose_model) for `hearth` with no --model:
 * says what it detected and chose, and starts the background pull of a better catalogue
 * model when one is absent and pulling is allowed (an interactive terminal, or
 * HEARTH_AUTO_PULL=1; never with HEARTH_AUTO_PULL=0 or HF_HUB_OFFLINE=1). */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int auto_pull_allowed(void) {
    const char *off = getenv("HF_HUB_OFFLINE"), *v = getenv("HEARTH_AUTO_PULL");
    if (off && *off && strcmp(off, "0")) return 0;
    if (v && *v) return strcmp(v, "0") != 0;
    return isatty(0) && isatty(2); /* tests and scripts never download by surprise */
}

const char *cli_choose_model(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--model") || !strncmp(argv[i], "--model=", 8)) return NULL;
    static hearth_choice c;
    hearth_error err = {0};
    if (hearth_choose_model(&c, &err)) {
        fprintf(stderr, "hearth: choosing a model: %s; serving the default\n", err.message);
        return NULL;
    }
    fprintf(stderr, "hearth: this machine: %s\nhearth: serving %s (%s)\n", c.machine, c.name, c.model);
    if (c.better[0]) {
        if (auto_pull_allowed() &&
            !hearth_download_start(c.better, c.better_include[0] ? c.better_include : NULL, &err))
            fprintf(stderr,
                    "hearth: %s fits this machine better; downloading it in the background (GET /downloads shows "
                    "progress). It becomes the default next time.\n",
                    c.better_name);
        else
            fprintf(stderr, "hearth: %s would fit this machine better: hearth pull %s%s%s\n", c.better_name, c.better,
                    c.better_include[0] ? " --include " : "", c.better_include);
    }
    return c.model[0] ? c.model : NULL;
}
