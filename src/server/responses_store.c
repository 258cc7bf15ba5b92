/* responses_store.c: the in-memory store behind GET /v1/responses/{id} and
 * previous_response_id: each entry keeps its own copies of a response and of
 * the conversation items it ends, as JSON text, for --responses-ttl seconds and
 * within --responses-max-bytes (oldest evicted first). Thread-safe (one mutex);
 * hands out copies only, so no jansson object is shared between threads. */
#include "server/responses.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct resp_entry {
    struct resp_entry *next; /* newer */
    char id[64];
    char *response, *items; /* JSON text */
    size_t bytes;
    time_t created;
} resp_entry;

struct resp_store {
    pthread_mutex_t mu;
    resp_entry *oldest, *newest;
    size_t entries, bytes, max_bytes;
    unsigned ttl_s;
};

resp_store *resp_store_new(unsigned ttl_s, size_t max_bytes) {
    resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->ttl_s = ttl_s;
    st->max_bytes = max_bytes;
    return st;
}

static void entry_free(resp_entry *en) {
    free(en->response);
    free(en->items);
    free(en);
}

void resp_store_free(resp_store *st) {
    if (!st) return;
    for (resp_entry *en = st->oldest, *next; en; en = next) {
        next = en->next;
        entry_free(en);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static void drop_oldest(resp_store *st) {
    resp_entry *en = st->oldest;
    st->oldest = en->next;
    if (!st->oldest) st->newest = NULL;
    st->entries--;
    st->bytes -= en->bytes;
    entry_free(en);
}

/* Entries are in creation order, so the expired ones are a prefix. Under mu. */
static void expire(resp_store *st) {
    time_t now = time(NULL);
    while (st->oldest && now - st->oldest->created >= (time_t)st->ttl_s) drop_oldest(st);
}

/* Unlinks and returns the entry with this id, or NULL. Under mu. */
static resp_entry *unlink_entry(resp_store *st, const char *id) {
    resp_entry *prev = NULL;
    for (resp_entry *en = st->oldest; en; prev = en, en = en->next) {
        if (strcmp(en->id, id)) continue;
        if (prev)
            prev->next = en->next;
        else
            st->oldest = en->next;
        if (st->newest == en) st->newest = prev;
        st->entries--;
        st->bytes -= en->bytes;
        return en;
    }
    return NULL;
}

static resp_entry *find(resp_store *st, const char *id) {
    expire(st);
    for (resp_entry *en = st->oldest; en; en = en->next)
        if (!strcmp(en->id, id)) return en;
    return NULL;
}

int resp_store_put(resp_store *st, const char *id, const json_t *response, const json_t *items) {
    resp_entry *en = calloc(1, sizeof *en);
    if (!en) return -1;
    snprintf(en->id, sizeof en->id, "%s", id);
    en->response = json_dumps(response, JSON_COMPACT);
    en->items = json_dumps(items, JSON_COMPACT);
    en->created = time(NULL);
    if (!en->response || !en->items) {
        entry_free(en);
        return -1;
    }
    /* the texts plus the bookkeeping: what the cap is meant to bound */
    en->bytes = strlen(en->response) + strlen(en->items) + sizeof *en;
    if (en->bytes > st->max_bytes) {
        entry_free(en);
        return -1;
    }
    pthread_mutex_lock(&st->mu);
    expire(st);
    resp_entry *old = unlink_entry(st, id);
    if (old) entry_free(old);
    while (st->oldest && st->bytes + en->bytes > st->max_bytes) drop_oldest(st);
    if (st->newest)
        st->newest->next = en;
    else
        st->oldest = en;
    st->newest = en;
    st->entries++;
    st->bytes += en->bytes;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

json_t *resp_store_items(resp_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    resp_entry *en = find(st, id);
    json_t *items = en ? json_loads(en->items, 0, NULL) : NULL;
    pthread_mutex_unlock(&st->mu);
    return items;
}

char *resp_store_response(resp_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    resp_entry *en = find(st, id);
    char *text = en ? strdup(en->response) : NULL;
    pthread_mutex_unlock(&st->mu);
    return text;
}

int resp_store_delete(resp_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    expire(st);
    resp_entry *en = unlink_entry(st, id);
    pthread_mutex_unlock(&st->mu);
    if (en) entry_free(en);
    return en != NULL;
}

void resp_store_stats(resp_store *st, size_t *entries, size_t *bytes) {
    pthread_mutex_lock(&st->mu);
    expire(st);
    *entries = st->entries;
    *bytes = st->bytes;
    pthread_mutex_unlock(&st->mu);
}
