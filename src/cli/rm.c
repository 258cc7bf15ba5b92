/* rm.c: `hearth rm <model>[@revision] [-y] [--dry-run] [--json]`: removes a model from
 * the HF cache (hearth_rm). Asks before deleting on a terminal; without a terminal it
 * deletes only with -y, so a script never removes a model by accident. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *rm_usage = "hearth rm <model>[@revision] [-y|--yes] [--dry-run] [--json]";

static void print_report(const char *report, int dry_run) {
    json_t *r = json_loads(report, 0, NULL);
    printf("%s %s: %zu snapshot(s), %lld blob(s), %.1f MB%s\n", dry_run ? "would remove" : "removed",
           json_string_value(json_object_get(r, "model")), json_array_size(json_object_get(r, "snapshots")),
           (long long)json_integer_value(json_object_get(r, "blobs")),
           (double)json_integer_value(json_object_get(r, "freed_bytes")) / 1e6, dry_run ? "" : " freed");
    json_decref(r);
}

int cli_rm(int argc, char **argv) {
    const char *model = NULL;
    int yes = 0, dry = 0, as_json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            printf("usage: %s\n", rm_usage);
            return 0;
        }
        if (!strcmp(a, "-y") || !strcmp(a, "--yes"))
            yes = 1;
        else if (!strcmp(a, "--dry-run"))
            dry = 1;
        else if (!strcmp(a, "--json"))
            as_json = 1;
        else if (a[0] == '-')
            return cli_usage_error(rm_usage, "%s: unknown flag", a);
        else if (!model)
            model = a;
        else
            return cli_usage_error(rm_usage, "%s: unexpected argument", a);
    }
    if (!model) return cli_usage_error(rm_usage, "%s", "need a model");
    hearth_error err = {0};
    char *report = NULL;
    if (!yes && !dry) { /* show what would go, then ask */
        if (hearth_rm(model, 1, &report, &err)) return cli_fail(&err);
        print_report(report, 1);
        hearth_free(report);
        report = NULL;
        if (!isatty(0)) {
            fprintf(stderr, "hearth: rm: not a terminal, so nothing was removed; pass -y to remove without asking\n");
            return 1;
        }
        fprintf(stderr, "remove it? [y/N] ");
        char line[16];
        if (!fgets(line, sizeof line, stdin) || (line[0] != 'y' && line[0] != 'Y')) {
            fprintf(stderr, "nothing removed\n");
            return 1;
        }
    }
    if (hearth_rm(model, dry, &report, &err)) return cli_fail(&err);
    if (as_json)
        printf("%s\n", report);
    else
        print_report(report, dry);
    hearth_free(report);
    return 0;
}
