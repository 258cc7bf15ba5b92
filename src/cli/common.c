/* common.c: helpers shared by the CLI verbs: flag matching, reading files, printing
 * errors in one consistent form. */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const hearth_error *err) {
    fprintf(stderr, "hearth: %s\n", err->message[0] ? err->message : hearth_status_name(err->status));
    return 1;
}

int cli_usage_error(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "hearth: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: %s\n", usage);
    return 2;
}

int cli_is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

char *cli_read_file(const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        perror(path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n + 1 < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    if (f != stdin) fclose(f);
    if (buf) buf[n] = 0;
    else fprintf(stderr, "hearth: %s: out of memory\n", path);
    return buf;
}

int cli_open_model(const char *name, hearth_model **m) {
    hearth_error err = {0};
    if (hearth_model_open(name, m, &err)) return cli_fail(&err);
    return 0;
}

/* --threads, --ctx, --mmap, --kv-quant and --deterministic, shared by the verbs that run
 * the engine. An unknown --kv-quant name leaves -1, which the engine rejects by name. */
int cli_parse_engine_flag(int argc, char **argv, int *i, hearth_engine_options *o) {
    if (!strcmp(argv[*i], "--mmap")) return o->use_mmap = 1;
    if (!strcmp(argv[*i], "--deterministic")) return o->deterministic = 1;
    if (*i + 1 >= argc) return 0;
    if (!strcmp(argv[*i], "--device")) { /* cpu|cuda|auto; an unknown name is caught at engine start */
        if (!hearth_device_parse(argv[++*i], &o->device)) o->device = -1;
        return 1;
    }
    if (!strcmp(argv[*i], "--threads") || !strcmp(argv[*i], "-t")) o->n_threads = atoi(argv[++*i]);
    else if (!strcmp(argv[*i], "--ctx")) o->context_length = atoi(argv[++*i]);
    else if (!strcmp(argv[*i], "--kv-quant")) {
        if (!hearth_kv_quant_parse(argv[++*i], &o->kv_quant)) o->kv_quant = -1;
    } else return 0;
    return 1;
}
