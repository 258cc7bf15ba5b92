/* train_routes.c: the training view's data (serve --train-dir DIR): hearth train runs as
 * their metrics.jsonl files record them. DIR is one run (it holds metrics.jsonl) or a folder
 * of runs (each direct subfolder that holds one); a run's id is its folder's name.
 *   GET /v1/train/runs            the runs, newest first, each with its latest numbers
 *   GET /v1/train/runs/{id}?from=N the run's records from the N-th on (the page polls with
 *                                 the previous answer's `next`)
 * Records are returned as the run wrote them; a line that is no metrics record
 * (hearth_train_record_kind: what hearth train-watch skips too) is skipped and counted, and a
 * last line the writer has not finished is not read yet. Reads files
 * only; an id is a folder name under DIR, never a path. */
#include "server/server.h"
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRAIN_MAX_RUNS 256
#define TRAIN_MAX_FILE (64L << 20) /* a metrics.jsonl larger than this is read from its tail */

static int fail(srv_conn *c, const srv_server *s, int status, const char *param, const char *code, const char *msg) {
    srv_error e = {0};
    srv_fail(&e, status, status == 404 ? "not_found_error" : "invalid_request_error", param, code, "%s", msg);
    return srv_respond_error(c, s, &e);
}

static int respond_json(srv_conn *c, const srv_server *s, json_t *j) {
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    int rc = srv_respond(c, s, 200, body ? body : "{}");
    free(body);
    return rc;
}

/* <dir>/metrics.jsonl into buf (NUL-terminated; its last TRAIN_MAX_FILE bytes at most);
 * 0 on success. */
static int read_metrics(const char *dir, char **buf, size_t *len, struct stat *st) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/metrics.jsonl", dir) >= (int)sizeof path) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    if (fstat(fileno(f), st) || !S_ISREG(st->st_mode)) {
        fclose(f);
        return -1;
    }
    long size = (long)st->st_size, from = size > TRAIN_MAX_FILE ? size - TRAIN_MAX_FILE : 0;
    char *b = malloc((size_t)(size - from) + 1);
    size_t n = b && !fseek(f, from, SEEK_SET) ? fread(b, 1, (size_t)(size - from), f) : 0;
    fclose(f);
    if (!b) return -1;
    b[n] = 0;
    *buf = b, *len = n;
    return 0;
}

/* The complete lines of buf that are metrics records, as an array; *skipped: the lines that
 * were not. A last line without its newline is still being written: not read yet. */
json_t *srv_train_records(char *buf, size_t len, int *skipped) {
    json_t *arr = json_array();
    *skipped = 0;
    for (char *p = buf, *end = buf + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) break;
        *nl = 0;
        if (nl > p) {
            if (hearth_train_record_kind(p, (size_t)(nl - p)) != HEARTH_TRAIN_RECORD_NONE)
                json_array_append_new(arr, json_loadb(p, (size_t)(nl - p), 0, NULL));
            else
                ++*skipped;
        }
        p = nl + 1;
    }
    return arr;
}

/* A run's summary: the last training and validation numbers, the final record's status. */
static json_t *run_summary(const char *id, const char *dir) {
    char *buf = NULL;
    size_t len = 0;
    struct stat st;
    if (read_metrics(dir, &buf, &len, &st)) return NULL;
    int skipped;
    json_t *recs = srv_train_records(buf, len, &skipped);
    free(buf);
    json_t *r = json_pack("{s:s,s:s,s:I,s:I,s:i,s:i}", "id", id, "object", "train.run", "bytes", (json_int_t)st.st_size,
                          "modified", (json_int_t)st.st_mtime, "records", (int)json_array_size(recs),
                          "skipped_lines", skipped);
    const char *status = "running";
    size_t i;
    json_t *rec;
    json_array_foreach(recs, i, rec) {
        json_t *v;
        json_object_set(r, "step", json_object_get(rec, "step"));
        if ((v = json_object_get(rec, "iters"))) json_object_set(r, "iters", v);
        if ((v = json_object_get(rec, "loss"))) json_object_set(r, "loss", v);
        if ((v = json_object_get(rec, "val_loss"))) json_object_set(r, "val_loss", v);
        if ((v = json_object_get(rec, "tokens_per_second"))) json_object_set(r, "tokens_per_second", v);
        if ((v = json_object_get(rec, "peak_memory_gb"))) json_object_set(r, "peak_memory_gb", v);
        if ((v = json_object_get(rec, "elapsed"))) json_object_set(r, "elapsed", v);
        if (json_is_true(json_object_get(rec, "done"))) {
            json_t *e = json_object_get(rec, "error");
            status = e ? "failed" : "done";
            if (e) json_object_set(r, "error", e);
        }
    }
    json_object_set_new(r, "status", json_string(status));
    json_decref(recs);
    return r;
}

static int has_metrics(const char *dir) {
    char path[4096];
    struct stat st;
    return snprintf(path, sizeof path, "%s/metrics.jsonl", dir) < (int)sizeof path && !stat(path, &st) &&
           S_ISREG(st.st_mode);
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    static __thread char name[256];
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(name, sizeof name, "%.*s", (int)(n - b), path + b);
    return name;
}

/* The folder of run id under the train dir (into out); 0 when there is one. */
static int run_dir(const char *root, const char *id, char *out, size_t n) {
    if (!*id || strchr(id, '/') || !strcmp(id, ".") || !strcmp(id, "..")) return -1;
    if (has_metrics(root)) /* DIR is itself the run */
        return strcmp(id, base_name(root)) || snprintf(out, n, "%s", root) >= (int)n ? -1 : 0;
    if (snprintf(out, n, "%s/%s", root, id) >= (int)n) return -1;
    return has_metrics(out) ? 0 : -1;
}

static int by_modified(const void *a, const void *b) {
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "modified")),
               y = json_integer_value(json_object_get(*(json_t *const *)b, "modified"));
    return x < y ? 1 : x > y ? -1 : strcmp(json_string_value(json_object_get(*(json_t *const *)a, "id")),
                                           json_string_value(json_object_get(*(json_t *const *)b, "id")));
}

int srv_train_runs(srv_server *s, srv_conn *c) {
    const char *root = s->cfg.train_dir;
    json_t *out = json_pack("{s:s,s:o}", "object", "list", "train_dir", root ? json_string(root) : json_null());
    json_t *runs[TRAIN_MAX_RUNS];
    size_t n = 0;
    if (root && has_metrics(root)) {
        runs[n] = run_summary(base_name(root), root);
        n += runs[n] != NULL;
    } else if (root) {
        DIR *d = opendir(root);
        struct dirent *de;
        while (d && n < TRAIN_MAX_RUNS && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char dir[4096];
            if (snprintf(dir, sizeof dir, "%s/%s", root, de->d_name) >= (int)sizeof dir || !has_metrics(dir)) continue;
            runs[n] = run_summary(de->d_name, dir);
            n += runs[n] != NULL;
        }
        if (d) closedir(d);
    }
    qsort(runs, n, sizeof *runs, by_modified);
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(data, runs[i]);
    json_object_set_new(out, "data", data);
    return respond_json(c, s, out);
}

int srv_train_run(srv_server *s, srv_conn *c, const char *id) {
    char dir[4096];
    char msg[400];
    if (!s->cfg.train_dir)
        return fail(c, s, 404, NULL, "train_dir_not_set", "no training runs: start the server with --train-dir DIR");
    if (run_dir(s->cfg.train_dir, id, dir, sizeof dir)) {
        snprintf(msg, sizeof msg, "no training run '%.200s' under the --train-dir folder", id);
        return fail(c, s, 404, "id", "run_not_found", msg);
    }
    const char *from_s = srv_query(c, "from");
    long from = 0;
    if (from_s && *from_s) {
        char *end;
        errno = 0;
        from = strtol(from_s, &end, 10);
        if (*end || errno || from < 0) return fail(c, s, 400, "from", NULL, "from must be a record index (0 or more)");
    }
    char *buf = NULL;
    size_t len = 0;
    struct stat st;
    if (read_metrics(dir, &buf, &len, &st)) {
        snprintf(msg, sizeof msg, "training run '%.200s' has no readable metrics.jsonl", id);
        return fail(c, s, 404, "id", "run_not_found", msg);
    }
    int skipped;
    json_t *recs = srv_train_records(buf, len, &skipped);
    free(buf);
    size_t total = json_array_size(recs);
    /* fewer records than the caller has seen: a new run rewrote the file; all of it again */
    int restarted = (size_t)from > total;
    if (restarted) from = 0;
    json_t *part = json_array();
    for (size_t i = (size_t)from; i < total; i++) json_array_append(part, json_array_get(recs, i));
    json_decref(recs);
    json_t *out = json_pack("{s:s,s:s,s:o,s:I,s:i,s:b}", "id", id, "object", "train.records", "records", part, "next",
                            (json_int_t)total, "skipped_lines", skipped, "restarted", restarted);
    return respond_json(c, s, out);
}
