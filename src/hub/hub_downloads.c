/* hub_downloads.c: the downloads of this process (hearth_pull reports into it), for
 * GET /downloads and the appliance's background pull, and hearth_download_start, which
 * runs a pull on a detached thread. A fixed table under one mutex: no allocation while
 * a transfer reports progress. */
#include "base/err.h"
#include "hub/hub.h"
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A server rarely pulls more than a handful of models in its lifetime; the oldest
 * finished entries are reused once the table is full. */
#define DOWNLOADS_MAX 32

typedef struct download {
    int used, state; /* 0 downloading, 1 done, 2 failed */
    unsigned long long seq;
    char model[HUB_NAME_MAX], file[512], error[512];
    long long done, total;
} download;

static download table[DOWNLOADS_MAX];
static unsigned long long next_seq;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

int hub_downloads_begin(const char *repo) {
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < DOWNLOADS_MAX && slot < 0; i++)
        if (!table[i].used) slot = i;
    if (slot < 0) /* else the oldest finished one */
        for (int i = 0; i < DOWNLOADS_MAX; i++)
            if (table[i].state && (slot < 0 || table[i].seq < table[slot].seq)) slot = i;
    if (slot >= 0) {
        download *d = &table[slot];
        memset(d, 0, sizeof *d);
        d->used = 1;
        d->seq = ++next_seq;
        d->total = -1;
        snprintf(d->model, sizeof d->model, "%s", repo);
    }
    pthread_mutex_unlock(&lock);
    return slot;
}

void hub_downloads_file(int id, const char *file, long long done, long long total) {
    if (id < 0 || id >= DOWNLOADS_MAX) return;
    pthread_mutex_lock(&lock);
    snprintf(table[id].file, sizeof table[id].file, "%s", file);
    table[id].done = done;
    table[id].total = total;
    pthread_mutex_unlock(&lock);
}

void hub_downloads_end(int id, hearth_status st, const char *message) {
    if (id < 0 || id >= DOWNLOADS_MAX) return;
    pthread_mutex_lock(&lock);
    table[id].state = st ? 2 : 1;
    if (st) snprintf(table[id].error, sizeof table[id].error, "%s", message ? message : "failed");
    pthread_mutex_unlock(&lock);
}

char *hearth_downloads_json(void) {
    json_t *arr = json_array();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < DOWNLOADS_MAX; i++) {
        const download *d = &table[i];
        if (!d->used) continue;
        static const char *const states[] = {"downloading", "done", "failed"};
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I}", "model", d->model, "state", states[d->state], "file",
                              d->file, "done_bytes", (json_int_t)d->done, "total_bytes", (json_int_t)d->total);
        if (o && d->state == 2) json_object_set_new(o, "error", json_string(d->error));
        if (o) json_array_append_new(arr, o);
    }
    pthread_mutex_unlock(&lock);
    char *s = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    return s;
}

typedef struct pull_job {
    char *repo, *include;
    int slot; /* taken before the thread starts, so GET /downloads lists it at once */
} pull_job;

static void *pull_thread(void *arg) {
    pull_job *j = arg;
    const char *inc[1] = {j->include};
    hearth_pull_options o = {.include = inc, .n_include = j->include ? 1 : 0};
    hub_pull(j->repo, &o, j->slot, NULL, NULL); /* the outcome lands in the table */
    free(j->repo);
    free(j->include);
    free(j);
    return NULL;
}

hearth_status hearth_download_start(const char *repo_arg, const char *include, hearth_error *err) {
    char repo[HUB_NAME_MAX], rev[HUB_NAME_MAX];
    hearth_status st = hub_parse_repo_arg(repo_arg, repo, rev, err);
    if (st) return st;
    pull_job *copy = calloc(1, sizeof *copy);
    if (copy) {
        copy->repo = strdup(repo_arg);
        copy->include = include ? strdup(include) : NULL;
    }
    pthread_t t;
    pthread_attr_t a;
    if (!copy || !copy->repo || (include && !copy->include)) {
        if (copy) free(copy->repo), free(copy->include);
        free(copy);
        return err_set(err, HEARTH_ERR_NOMEM, "download: out of memory");
    }
    copy->slot = hub_downloads_begin(repo);
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, pull_thread, copy);
    pthread_attr_destroy(&a);
    if (rc) {
        hub_downloads_end(copy->slot, HEARTH_ERR_IO, "could not start a thread");
        free(copy->repo);
        free(copy->include);
        free(copy);
        return err_set(err, HEARTH_ERR_IO, "download: cannot start a thread for %s", repo_arg);
    }
    return HEARTH_OK;
}
