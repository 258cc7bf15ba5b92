/* train_watch.c: `hearth train-watch`: follows <adapter-dir>/metrics.jsonl while hearth train
 * appends to it and shows the run in the terminal (step, train and validation loss, speed,
 * learning rate, peak memory, ETA, a loss sparkline), once (--once) or as JSON (--json).
 * It only reads the file: a half-written last line waits for its newline, a line that is no
 * metrics record is skipped with a warning, and the run's final record ends the watch. */
#include "cli/cli.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *watch_usage =
    "hearth train-watch [adapter-dir | metrics.jsonl] [--adapter DIR] [--once] [--json] [--wait]\n"
    "  follows DIR/metrics.jsonl (default: adapters, hearth train's --adapter-path) until the run ends;\n"
    "  --once prints the current state and exits, --json prints JSON (a line per update),\n"
    "  --wait waits for a file that does not exist yet";

enum { SPARK_WIDTH = 40, MAX_PENDING = 1 << 20 /* a longer line without a newline is no record */ };

typedef struct watch_point {
    int step;
    double value;
} watch_point;

typedef struct watch {
    const char *path;
    FILE *warn; /* where skipped lines are reported (stderr) */
    /* the file as read so far */
    long long offset;
    ino_t ino;
    char *pending; /* the bytes after the last newline */
    size_t n_pending;
    int line, skipped, discarding;
    unsigned long updates; /* lines taken and restarts: kept across watch_reset */
    /* the run */
    json_t *last_train, *last_val, *final;
    int step, iters;
    double elapsed;
    watch_point *losses, *val_losses;
    int n_losses, n_val;
} watch;

static void watch_reset(watch *w) {
    json_decref(w->last_train), json_decref(w->last_val), json_decref(w->final);
    free(w->pending), free(w->losses), free(w->val_losses);
    *w = (watch){.path = w->path, .warn = w->warn, .updates = w->updates + 1};
}

static int push_point(watch_point **v, int *n, int step, double value) {
    watch_point *p = realloc(*v, sizeof **v * (size_t)(*n + 1));
    if (!p) return -1;
    *v = p;
    p[(*n)++] = (watch_point){step, value};
    return 0;
}

static int num(const json_t *j, const char *key, double *out) {
    const json_t *v = json_object_get(j, key);
    if (!json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

/* One complete line of the file: a training, validation or final record. */
static void take_line(watch *w, const char *s, size_t n) {
    w->line++, w->updates++;
    while (n && (s[n - 1] == '\r' || s[n - 1] == ' ')) n--;
    if (!n) return;
    hearth_train_record kind = hearth_train_record_kind(s, n);
    if (kind == HEARTH_TRAIN_RECORD_NONE) {
        w->skipped++;
        fprintf(w->warn, "hearth train-watch: %s:%d: not a hearth train metrics record (skipped)\n", w->path, w->line);
        return;
    }
    json_t *j = json_loadb(s, n, 0, NULL);
    double step = 0, loss = 0, iters, elapsed;
    int is_final = kind == HEARTH_TRAIN_RECORD_FINAL, is_train = kind == HEARTH_TRAIN_RECORD_TRAIN,
        is_val = kind == HEARTH_TRAIN_RECORD_VAL;
    num(j, "step", &step);
    num(j, is_val ? "val_loss" : "loss", &loss);
    if (num(j, "iters", &iters)) w->iters = (int)iters;
    if (num(j, "elapsed", &elapsed)) w->elapsed = elapsed;
    if (is_final || is_train) w->step = (int)step;
    json_t **slot = is_final ? &w->final : is_train ? &w->last_train : &w->last_val;
    json_decref(*slot);
    *slot = j;
    if (is_train) push_point(&w->losses, &w->n_losses, (int)step, loss);
    if (is_val) push_point(&w->val_losses, &w->n_val, (int)step, loss);
}

/* Reads what was appended since the last call. -1: the file is not there. A file that
 * shrank or was replaced is a new run: read from its start. */
static int watch_poll(watch *w) {
    struct stat sb;
    if (stat(w->path, &sb)) return -1;
    if (sb.st_ino != w->ino || (long long)sb.st_size < w->offset) {
        watch_reset(w);
        w->ino = sb.st_ino;
    }
    if ((long long)sb.st_size == w->offset) return 0;
    FILE *f = fopen(w->path, "rb");
    if (!f) return -1;
    char buf[65536];
    size_t got;
    if (!fseeko(f, (off_t)w->offset, SEEK_SET))
        while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
            w->offset += (long long)got;
            char *p = realloc(w->pending, w->n_pending + got);
            if (!p) break;
            w->pending = p;
            memcpy(w->pending + w->n_pending, buf, got);
            w->n_pending += got;
            size_t start = 0;
            for (size_t i = 0; i < w->n_pending; i++)
                if (w->pending[i] == '\n') {
                    if (!w->discarding)
                        take_line(w, w->pending + start, i - start);
                    else
                        w->line++, w->discarding = 0;
                    start = i + 1;
                }
            memmove(w->pending, w->pending + start, w->n_pending - start);
            w->n_pending -= start;
            if (w->discarding)
                w->n_pending = 0; /* the rest of a line already skipped */
            else if (w->n_pending > MAX_PENDING) {
                w->skipped++, w->discarding = 1, w->n_pending = 0;
                fprintf(w->warn, "hearth train-watch: %s:%d: a line of over 1 MiB is no metrics record (skipped)\n",
                        w->path, w->line + 1);
            }
        }
    fclose(f);
    return 0;
}

static const char *status_of(const watch *w) {
    if (!w->final) return "running";
    return json_object_get(w->final, "error") ? "failed" : "done";
}

/* Seconds left: the run's pace so far (validation included) over the steps left. */
static double eta(const watch *w) {
    if (w->final) return 0;
    if (w->iters > 0 && w->step > 0 && w->elapsed > 0) return w->elapsed / w->step * (w->iters - w->step);
    double its;
    if (w->iters > 0 && w->last_train && num(w->last_train, "iterations_per_second", &its) && its > 0)
        return (w->iters - w->step) / its;
    return -1;
}

static json_t *points_json(const watch_point *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_pack("[i,f]", v[i].step, v[i].value));
    return a;
}

static json_t *field(const json_t *rec, const char *key) {
    json_t *v = rec ? json_object_get(rec, key) : NULL;
    return v ? json_incref(v) : json_null();
}

static void print_json(const watch *w) {
    const json_t *t = w->last_train, *fin = w->final;
    double e = eta(w);
    json_t *j = json_object();
    json_object_set_new(j, "file", json_string(w->path));
    json_object_set_new(j, "status", json_string(status_of(w)));
    json_object_set_new(j, "step", json_integer(w->step));
    json_object_set_new(j, "iters", w->iters ? json_integer(w->iters) : json_null());
    json_object_set_new(j, "loss", field(t, "loss"));
    json_object_set_new(j, "loss_step", field(t, "step"));
    json_object_set_new(j, "val_loss", field(w->last_val, "val_loss"));
    json_object_set_new(j, "val_step", field(w->last_val, "step"));
    json_object_set_new(j, "learning_rate", field(t, "learning_rate"));
    json_object_set_new(j, "tokens_per_second", field(t, "tokens_per_second"));
    json_object_set_new(j, "iterations_per_second", field(t, "iterations_per_second"));
    json_object_set_new(j, "trained_tokens", field(fin ? fin : t, "trained_tokens"));
    json_object_set_new(j, "peak_memory_gb", field(fin ? fin : t, "peak_memory_gb"));
    json_object_set_new(j, "elapsed", w->elapsed > 0 ? json_real(w->elapsed) : json_null());
    json_object_set_new(j, "eta_seconds", e >= 0 ? json_real(e) : json_null());
    json_object_set_new(j, "losses", points_json(w->losses, w->n_losses));
    json_object_set_new(j, "val_losses", points_json(w->val_losses, w->n_val));
    json_object_set_new(j, "last_train", t ? json_incref(w->last_train) : json_null());
    json_object_set_new(j, "last_val", w->last_val ? json_incref(w->last_val) : json_null());
    json_object_set_new(j, "error", field(fin, "error"));
    json_object_set_new(j, "skipped_lines", json_integer(w->skipped));
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* The last SPARK_WIDTH reports' losses (earlier ones averaged into as many buckets) as
 * eighth-blocks between their minimum and maximum. */
static void print_sparkline(const watch *w) {
    static const char *const bars[8] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
    int n = w->n_losses, cols = n < SPARK_WIDTH ? n : SPARK_WIDTH;
    double v[SPARK_WIDTH], lo = 0, hi = 0;
    for (int c = 0; c < cols; c++) {
        int a = (int)((long long)c * n / cols), b = (int)((long long)(c + 1) * n / cols);
        double s = 0;
        for (int i = a; i < b; i++) s += w->losses[i].value;
        v[c] = s / (b - a);
        if (!c || v[c] < lo) lo = v[c];
        if (!c || v[c] > hi) hi = v[c];
    }
    printf("loss       ");
    for (int c = 0; c < cols; c++) printf("%s", bars[hi > lo ? (int)((v[c] - lo) / (hi - lo) * 7 + 0.5) : 3]);
    if (n) printf("  %.4g -> %.4g over %d reports", w->losses[0].value, w->losses[n - 1].value, n);
    printf("\n");
}

static void print_duration(const char *label, double s) {
    if (s < 0)
        printf("%s?", label);
    else if (s < 60)
        printf("%s%.0fs", label, s);
    else if (s < 3600)
        printf("%s%dm%02ds", label, (int)s / 60, (int)s % 60);
    else
        printf("%s%dh%02dm", label, (int)s / 3600, (int)s / 60 % 60);
}

static void print_text(const watch *w) {
    const json_t *t = w->last_train;
    double x;
    printf("hearth train-watch  %s  [%s]\n", w->path, status_of(w));
    if (w->final && json_object_get(w->final, "error"))
        printf("error      %s\n", json_string_value(json_object_get(w->final, "error")));
    if (w->iters > 0) {
        int done = (int)(20.0 * w->step / w->iters + 0.5);
        printf("step       %d / %d  [", w->step, w->iters);
        for (int i = 0; i < 20; i++) putchar(i < done ? '#' : '-');
        printf("] %3.0f%%\n", 100.0 * w->step / w->iters);
    } else {
        printf("step       %d\n", w->step);
    }
    if (t && num(t, "loss", &x))
        printf("train loss %.4f  (step %lld)\n", x, (long long)json_number_value(json_object_get(t, "step")));
    if (w->last_val && num(w->last_val, "val_loss", &x))
        printf("val loss   %.4f  (step %lld)\n", x, (long long)json_number_value(json_object_get(w->last_val, "step")));
    if (t && num(t, "rewards/accuracies", &x)) {
        double m = 0;
        num(t, "rewards/margins", &m);
        printf("rewards    accuracy %.3f  margin %.4f\n", x, m);
    }
    if (t && num(t, "tokens_per_second", &x)) {
        double its = 0;
        num(t, "iterations_per_second", &its);
        printf("speed      %.1f tok/s  %.3f it/s\n", x, its);
    }
    if (t && num(t, "learning_rate", &x)) printf("lr         %.3e\n", x);
    if ((w->final && num(w->final, "peak_memory_gb", &x)) || (t && num(t, "peak_memory_gb", &x)))
        printf("peak mem   %.3f GB\n", x);
    print_duration("time       ", w->elapsed);
    if (!w->final) print_duration("  ETA ", eta(w));
    printf("\n");
    if (w->n_losses) print_sparkline(w);
    if (w->skipped) printf("skipped    %d line%s that are no metrics records\n", w->skipped, w->skipped > 1 ? "s" : "");
}

static void show(const watch *w, int as_json, int redraw) {
    if (as_json)
        print_json(w);
    else {
        if (redraw) printf("\033[H\033[J"); /* a terminal: draw over the last frame */
        print_text(w);
        if (!redraw) printf("\n");
    }
    fflush(stdout);
}

int cli_train_watch(int argc, char **argv) {
    const char *dir = NULL;
    int once = 0, as_json = 0, wait = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            printf("usage: %s\n", watch_usage);
            return 0;
        }
        if (!strcmp(a, "--once"))
            once = 1;
        else if (!strcmp(a, "--json"))
            as_json = 1;
        else if (!strcmp(a, "--wait"))
            wait = 1;
        else if (!strcmp(a, "--adapter") || !strcmp(a, "--adapter-path")) {
            if (i + 1 >= argc) return cli_usage_error(watch_usage, "%s needs a folder", a);
            if (dir) return cli_usage_error(watch_usage, "%s: a second folder", argv[i + 1]);
            dir = argv[++i];
        } else if (a[0] == '-')
            return cli_usage_error(watch_usage, "%s: unknown flag", a);
        else if (dir)
            return cli_usage_error(watch_usage, "%s: a second folder", a);
        else
            dir = a;
    }
    if (!dir) dir = "adapters"; /* hearth train's default --adapter-path */
    struct stat sb;
    char *path = NULL;
    size_t len = strlen(dir);
    if (!stat(dir, &sb) && S_ISREG(sb.st_mode))
        path = strdup(dir); /* the metrics file itself */
    else if ((path = malloc(len + sizeof "/metrics.jsonl")))
        snprintf(path, len + sizeof "/metrics.jsonl", "%s/metrics.jsonl", dir);
    if (!path) return fprintf(stderr, "hearth train-watch: out of memory\n"), 1;
    watch w = {.path = path, .warn = stderr};
    int rc = 0, redraw = !as_json && isatty(1), told = 0, shown = 0;
    const struct timespec pause = {0, 250 * 1000 * 1000}; /* a quarter second: reports come seconds apart */
    for (;;) {
        unsigned long before = w.updates;
        if (watch_poll(&w)) {
            if (!wait) {
                fprintf(stderr,
                        "hearth train-watch: %s: %s (hearth train --adapter-path %s writes it; --wait waits for it)\n",
                        path, strerror(errno ? errno : ENOENT), dir);
                rc = 1;
                break;
            }
            if (!told++) fprintf(stderr, "hearth train-watch: waiting for %s\n", path);
            nanosleep(&pause, NULL);
            continue;
        }
        if (once || !shown || w.updates != before) show(&w, as_json, redraw), shown = 1;
        if (once || w.final) {
            rc = w.final && json_object_get(w.final, "error") ? 1 : 0;
            break;
        }
        nanosleep(&pause, NULL);
    }
    watch_reset(&w);
    free(path);
    return rc;
}
