/* common.c: helpers shared by the CLI verbs: flag matching, reading files, printing
 * errors in one consistent form. */
#include "cli/cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
        fprintf(stderr, "hearth: %s: %s\n", path, strerror(errno));
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

/* --kv-budget: "1.5GB" (bytes; K/M/G/T binary) or "4096" (blocks). */
static int parse_kv_budget(const char *s, hearth_engine_options *eo) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || s[0] == '-') return -1;
    if (!*end) {
        if (v != (double)(long)v || v > (1 << 26)) return -1;
        eo->kv_blocks = (int)v;
        return 0;
    }
    static const char units[] = "KMGT";
    const char *u = strchr(units, *end >= 'a' ? *end - 32 : *end);
    if (!u || !*u) return -1;
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    eo->kv_budget_bytes = v * (double)(1ull << (10 * (u - units + 1)));
    return 0;
}

int cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_count(const char *s, long lo, long hi, int *out) {
    long v;
    if (cli_parse_long(s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_pool_flag(int argc, char **argv, int *i, hearth_engine_options *eo, const char *usage, int *rc) {
    static const char *const names[] = {"--max-sequences", "--max-step-tokens", "--prefill-step-size", "--kv-blocks",
                                        "--kv-budget"};
    const char *a = argv[*i], *eq = strchr(a, '='), *v = NULL;
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    int k = 0, n = (int)(sizeof names / sizeof *names);
    while (k < n && !(strlen(names[k]) == len && !strncmp(a, names[k], len))) k++;
    if (k == n) return 0;
    if (eq) v = eq + 1;
    else if (*i + 1 < argc) v = argv[++*i];
    int bad;
    if (!v) bad = 1;
    else if (k == 0) bad = parse_count(v, 1, 4096, &eo->max_sequences); /* requests generating at once */
    else if (k <= 2) bad = parse_count(v, 1, 1 << 20, &eo->max_step_tokens); /* tokens per batched step */
    else if (k == 3) bad = parse_count(v, 1, 1 << 26, &eo->kv_blocks);      /* blocks of 16 positions */
    else bad = parse_kv_budget(v, eo);
    *rc = 0;
    if (bad) {
        char fmt[96];
        snprintf(fmt, sizeof fmt, "%s: invalid value '%%s'", names[k]);
        *rc = cli_usage_error(usage, fmt, v ? v : "");
    }
    return 1;
}

/* --threads, --ctx, --mmap, --no-mmap, --kv-quant, --speculate, --device, --deterministic, --cuda-exact,
 * --expert-offload,
 * --host-sampler and --no-state-journal, shared by the verbs that run
 * the engine. An unknown --kv-quant name leaves -1, which the engine rejects by name. */
int cli_parse_engine_flag(int argc, char **argv, int *i, hearth_engine_options *o) {
    if (!strcmp(argv[*i], "--mmap")) return o->use_mmap = 1;
    if (!strcmp(argv[*i], "--no-mmap")) return o->use_mmap = -1, 1;
    if (!strcmp(argv[*i], "--cuda-exact")) return o->cuda_exact = 1;
    if (!strcmp(argv[*i], "--host-sampler")) return o->host_sampler = 1;
    if (!strcmp(argv[*i], "--no-state-journal")) return o->no_state_journal = 1;
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
    } else if (!strcmp(argv[*i],
                       "--speculate")) /* lookup|suffix|mtp|none; an unknown name: -1, refused at engine start */
        o->speculate = hearth_speculate_parse(argv[++*i]);
    else if (!strcmp(argv[*i], "--expert-offload")) { /* device slots; not a count: -1, refused at engine start */
        long v;
        o->expert_offload = cli_parse_long(argv[++*i], 0, 1 << 20, &v) ? -1 : (int)v;
    } else return 0;
    return 1;
}

/* ---- transfer progress (pull, upload) ---- */

static double progress_now(void) {
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

void cli_transfer_progress(void *user, const char *file, long long done, long long total) {
    cli_progress *p = user;
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
        p->start = progress_now();
    }
    char a[32], b[32];
    fmt_mb(done, a, sizeof a);
    fmt_mb(total, b, sizeof b);
    int finished = total >= 0 && done >= total;
    if (p->tty) {
        double el = progress_now() - p->start, rate = el > 0 ? (double)done / el / 1e6 : 0;
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
        fprintf(stderr, "  %s %s (%s)\n", file, finished ? "done" : p->doing ? p->doing : "", finished ? a : b);
    }
    fflush(stderr);
}

const char *cli_adapter_id(const char *arg, char *id, size_t cap) {
    const char *eq = strchr(arg, '='), *path = eq ? eq + 1 : arg;
    if (eq) snprintf(id, cap, "%.*s", (int)(eq - arg), arg);
    else { /* the folder's name ("adapters" for mlx_lm.lora's default output) */
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/') len--;
        const char *base = path + len;
        while (base > path && base[-1] != '/') base--;
        snprintf(id, cap, "%.*s", (int)(path + len - base), base);
    }
    return path;
}

int cli_mount_adapter(hearth_engine *e, const char *arg, int make_default) {
    hearth_error err = {0};
    char id[256];
    const char *path = cli_adapter_id(arg, id, sizeof id);
    if (hearth_adapter_mount(e, id, path, &err) || (make_default && hearth_adapter_set_default(e, id, &err)))
        return cli_fail(&err);
    return 0;
}
