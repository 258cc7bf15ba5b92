/* pull.c: `hearth pull <org/name>[@revision] [--include P ...] [--exclude P ...]`:
 * downloads a model from the Hugging Face hub (hearth_pull) with a progress bar on
 * stderr: redrawn in place on a terminal, one line per file otherwise (logs, CI). */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *pull_usage = "hearth pull <org/name>[@revision] [--include PATTERN ...] [--exclude PATTERN ...]";

/* --include/--exclude are few; 64 each is far more than a command line needs. */
#define PULL_MAX_PATTERNS 64

typedef struct progress {
    int tty;
    char file[512];
    double start;
    int line_open;
} progress;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fmt_mb(long long n, char *out, size_t cap) {
    if (n < 0)
        snprintf(out, cap, "?");
    else
        snprintf(out, cap, "%.1f MB", (double)n / 1e6);
}

static void on_progress(void *user, const char *file, long long done, long long total) {
    progress *p = user;
    int new_file = strcmp(p->file, file) != 0;
    if (file[0] == '(') { /* a notice, e.g. a dropped connection being resumed */
        if (p->line_open) fputc('\n', stderr);
        p->line_open = 0;
        fprintf(stderr, "  %s\n", file);
        return;
    }
    if (new_file) {
        if (p->line_open) fputc('\n', stderr);
        p->line_open = 0;
        snprintf(p->file, sizeof p->file, "%s", file);
        p->start = now_s();
    }
    char a[32], b[32];
    fmt_mb(done, a, sizeof a);
    fmt_mb(total, b, sizeof b);
    int finished = total >= 0 && done >= total;
    if (p->tty) {
        double el = now_s() - p->start, rate = el > 0 ? (double)done / el / 1e6 : 0;
        int width = 30, fill = total > 0 ? (int)((double)done / (double)total * width) : 0;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r  %-40.40s [%s] %10s / %-10s %6.1f MB/s", file, bar, a, b, rate);
        p->line_open = 1;
        if (finished) {
            fputc('\n', stderr);
            p->line_open = 0;
        }
    } else if (new_file || finished) {
        fprintf(stderr, "  %s %s (%s)\n", file, finished ? "done" : "downloading", finished ? a : b);
    }
    fflush(stderr);
}

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
    progress p = {.tty = isatty(2)};
    hearth_pull_options o = {.include = include,
                             .n_include = n_inc,
                             .exclude = exclude,
                             .n_exclude = n_exc,
                             .on_progress = on_progress,
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
