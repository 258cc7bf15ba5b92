/* adapter.c: the registry of mounted adapters and the sets requests use. Mount and
 * unmount come from any thread (the HTTP threads) while the engine thread steps, so the
 * list and every reference count live under one mutex; an adapter leaves the list at
 * unmount but its memory stays until the last set naming it (a running request) lets go,
 * so removing an adapter never stalls nor breaks a request. Loads nothing (adapter_load.c). */
#define _GNU_SOURCE
#include "engine/adapter.h"
#include "base/err.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void adapter_registry_init(adapter_registry *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->next_serial = 1;
}

/* Drops one reference (mu held); a freed mounted adapter's serial joins r->gone. */
static void adapter_unref(adapter_registry *r, adapter *a) {
    if (--a->refs) return;
    if (a->serial) {
        if (r->n_gone == ADAPTER_GONE_MAX) memmove(r->gone, r->gone + 1, --r->n_gone * sizeof *r->gone);
        r->gone[r->n_gone++] = a->serial;
    }
    adapter_free(a);
}

int adapter_registry_take_gone(adapter_registry *r, uint64_t *keys, int cap) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_gone < cap ? r->n_gone : cap;
    memcpy(keys, r->gone, (size_t)n * sizeof *keys);
    memmove(r->gone, r->gone + n, (size_t)(r->n_gone - n) * sizeof *r->gone);
    r->n_gone -= n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void adapter_registry_free(adapter_registry *r) {
    for (adapter *a = r->head, *next; a; a = next) {
        next = a->next;
        adapter_unref(r, a);
    }
    free(r->default_id);
    pthread_mutex_destroy(&r->mu);
}

static adapter *find(adapter_registry *r, const char *id, size_t len) {
    for (adapter *a = r->head; a; a = a->next)
        if (strlen(a->id) == len && !memcmp(a->id, id, len)) return a;
    return NULL;
}

hearth_status adapter_registry_add(adapter_registry *r, adapter *a, hearth_error *err) {
    pthread_mutex_lock(&r->mu);
    hearth_status st = HEARTH_OK;
    if (find(r, a->id, strlen(a->id)))
        st = err_set(err, HEARTH_ERR_INVALID, "an adapter with id '%s' is mounted already", a->id);
    else {
        a->serial = r->next_serial++;
        a->ops.key = a->serial; /* a device backend's copy is found by it */
        a->refs = 1;
        adapter **tail = &r->head;
        while (*tail) tail = &(*tail)->next;
        *tail = a;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

hearth_status adapter_registry_remove(adapter_registry *r, const char *id, hearth_error *err) {
    pthread_mutex_lock(&r->mu);
    adapter **pp = &r->head;
    while (*pp && strcmp((*pp)->id, id)) pp = &(*pp)->next;
    adapter *a = *pp;
    if (a) {
        *pp = a->next;
        if (r->default_id && !strcmp(r->default_id, id)) {
            free(r->default_id);
            r->default_id = NULL;
        }
        adapter_unref(r, a);
    }
    pthread_mutex_unlock(&r->mu);
    return a ? HEARTH_OK : err_set(err, HEARTH_ERR_NOT_FOUND, "no adapter with id '%s' is mounted", id);
}

hearth_status adapter_registry_set_default(adapter_registry *r, const char *id, hearth_error *err) {
    pthread_mutex_lock(&r->mu);
    hearth_status st = HEARTH_OK;
    char *copy = NULL;
    if (id && !find(r, id, strlen(id)))
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "no adapter with id '%s' is mounted", id);
    else if (id && !(copy = strdup(id)))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    else {
        free(r->default_id);
        r->default_id = copy;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* The namespace of a combination: the members' mount serials, so a prefix computed with
 * one adapter is never reused with another, nor with a later mount under the same id. */
static uint64_t set_namespace(const adapter_set *s) {
    uint64_t h = 0x51ed270b9e3779b9ull;
    for (int i = 0; i < s->ops.n; i++) {
        h ^= s->members[i]->serial + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ull;
    }
    return h ? h : 1;
}

hearth_status adapter_registry_resolve(adapter_registry *r, const char *spec, adapter_set **out, hearth_error *err) {
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    hearth_status st = HEARTH_OK;
    if (!spec) spec = r->default_id;
    if (!spec || !*spec || !strcmp(spec, "none")) {
        pthread_mutex_unlock(&r->mu);
        return HEARTH_OK;
    }
    adapter_set *s = calloc(1, sizeof *s);
    if (!s) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (const char *p = spec; !st && *p;) {
        const char *plus = strchr(p, '+');
        size_t len = plus ? (size_t)(plus - p) : strlen(p);
        adapter *a = find(r, p, len);
        if (!a)
            st = err_set(err, HEARTH_ERR_NOT_FOUND, "adapter '%.*s' is not mounted (GET /v1/adapters lists them)",
                         (int)len, p);
        else if (s->ops.n == ADAPTER_MAX_SET)
            st = err_set(err, HEARTH_ERR_INVALID, "adapter '%s': at most %d adapters combine", spec, ADAPTER_MAX_SET);
        else {
            for (int i = 0; i < s->ops.n; i++)
                if (s->members[i] == a) st = err_set(err, HEARTH_ERR_INVALID, "adapter '%s' names '%s' twice", spec, a->id);
            if (!st && a->dora && (s->ops.n > 0 || plus))
                st = err_set(err, HEARTH_ERR_UNSUPPORTED, "adapter '%s' is DoRA: it cannot be combined with others",
                             a->id);
            if (!st && s->ops.n > 0 && s->members[0]->dora)
                st = err_set(err, HEARTH_ERR_UNSUPPORTED, "adapter '%s' is DoRA: it cannot be combined with others",
                             s->members[0]->id);
            if (!st) {
                s->members[s->ops.n] = a;
                s->list[s->ops.n++] = &a->ops;
            }
        }
        p = plus ? plus + 1 : p + len;
    }
    if (!st) {
        for (int i = 0; i < s->ops.n; i++) s->members[i]->refs++;
        s->ops.a = s->list;
        s->ns = set_namespace(s);
        s->refs = 1;
        *out = s;
    } else
        free(s);
    pthread_mutex_unlock(&r->mu);
    return st;
}

void adapter_set_retain(adapter_registry *r, adapter_set *s) {
    if (!s) return;
    pthread_mutex_lock(&r->mu);
    s->refs++;
    pthread_mutex_unlock(&r->mu);
}

void adapter_set_release(adapter_registry *r, adapter_set *s) {
    if (!s) return;
    pthread_mutex_lock(&r->mu);
    if (--s->refs == 0) {
        for (int i = 0; i < s->ops.n; i++) adapter_unref(r, s->members[i]);
        free(s);
    }
    pthread_mutex_unlock(&r->mu);
}

int adapter_registry_find_name(adapter_registry *r, const char *name, char *id, size_t cap) {
    int rc = -1;
    pthread_mutex_lock(&r->mu);
    for (adapter *a = r->head; a && rc == -1; a = a->next)
        if (!strcmp(a->id, name) || (a->path && !strcmp(a->path, name)))
            rc = strlen(a->id) < cap ? (snprintf(id, cap, "%s", a->id), 0) : -2;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

char *adapter_registry_json(adapter_registry *r) {
    json_t *arr = json_array();
    pthread_mutex_lock(&r->mu);
    for (adapter *a = r->head; a; a = a->next) {
        json_t *mods = json_array();
        for (int p = 0; p < OP_N_PROJ; p++)
            if (a->modules & (1u << p)) json_array_append_new(mods, json_string(adapter_proj_name(p)));
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:I, s:i, s:o, s:b}", "id", a->id, "path", a->path,
                           "format", a->format, "type", a->dora ? "dora" : "lora", "rank", a->rank, "scale",
                           (double)a->scale, "size_bytes", (json_int_t)a->bytes, "layers", a->n_layers, "modules",
                           mods, "default", r->default_id && !strcmp(r->default_id, a->id)));
    }
    pthread_mutex_unlock(&r->mu);
    char *s = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return s;
}
