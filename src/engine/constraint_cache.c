/* constraint_cache.c: compiled constraints kept per engine (see below). Its own file, apart
 * from constraint.c: a caller that only validates a request (the server's parsers, their
 * test helpers) links the grammar module through constraint.c, not the engine. */
#include "base/err.h"
#include "engine/engine_internal.h"
#include "grammar/grammar.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Requests of an agent repeat the same schema or tool set: each distinct (kind, text) is
 * compiled once for the engine's vocabulary and shared by every request using it (a
 * compiled grammar is read-only but for its own locked caches of parse states and masks,
 * which the requests then share too). The server compiles on its HTTP thread
 * (hearth_constraint_prepare), so the engine thread finds the grammar ready instead of
 * stalling a step to compile it. Least recently used entries nobody holds make room. */
enum { GRAM_CACHE_CAP = 32 };

typedef struct {
    hearth_constraint_kind kind;
    char *text;
    size_t len;
    grammar *g;
    int refs;
    uint64_t used;
} gram_slot;

struct gram_cache {
    pthread_mutex_t mu;
    gram_slot slot[GRAM_CACHE_CAP];
    int n;
    uint64_t tick;
};

gram_cache *gram_cache_new(void) {
    gram_cache *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->mu, NULL);
    return c;
}

void gram_cache_free(gram_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) grammar_free(c->slot[i].g), free(c->slot[i].text);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int slot_is(const gram_slot *s, hearth_constraint_kind kind, const char *text, size_t len) {
    return s->kind == kind && s->len == len && (!len || !memcmp(s->text, text, len));
}

/* Under the lock: the slot holding (kind, text) with one more reference, or NULL. */
static grammar *take(gram_cache *c, hearth_constraint_kind kind, const char *text, size_t len) {
    for (int i = 0; i < c->n; i++)
        if (slot_is(&c->slot[i], kind, text, len)) {
            c->slot[i].refs++;
            c->slot[i].used = ++c->tick;
            return c->slot[i].g;
        }
    return NULL;
}

hearth_status engine_constraint_get(gram_cache *c, hearth_constraint_kind kind, const char *text, size_t len,
                                    const gvocab *v, grammar **out, hearth_error *err) {
    if (!text) len = 0;
    if (!c) return engine_constraint_compile(kind, text, len, v, out, err);
    pthread_mutex_lock(&c->mu);
    *out = take(c, kind, text, len);
    pthread_mutex_unlock(&c->mu);
    if (*out) return HEARTH_OK;
    grammar *g = NULL; /* compiled outside the lock: other requests' lookups go on */
    hearth_status st = engine_constraint_compile(kind, text, len, v, &g, err);
    if (st) return st;
    char *copy = malloc(len + 1);
    pthread_mutex_lock(&c->mu);
    if ((*out = take(c, kind, text, len))) { /* another thread compiled it meanwhile */
        pthread_mutex_unlock(&c->mu);
        grammar_free(g);
        free(copy);
        return HEARTH_OK;
    }
    int at = c->n < GRAM_CACHE_CAP ? c->n : -1;
    for (int i = 0; at < 0 && i < c->n; i++) /* else the least recently used one nobody holds */
        if (!c->slot[i].refs && (at < 0 || c->slot[i].used < c->slot[at].used)) at = i;
    if (at >= 0 && copy) {
        gram_slot *s = &c->slot[at];
        if (at < c->n) grammar_free(s->g), free(s->text);
        else c->n++;
        if (len) memcpy(copy, text, len);
        copy[len] = 0;
        *s = (gram_slot){.kind = kind, .text = copy, .len = len, .g = g, .refs = 1, .used = ++c->tick};
        copy = NULL;
    } /* else every slot is in use: this request keeps its own copy, freed by its put */
    pthread_mutex_unlock(&c->mu);
    free(copy);
    *out = g;
    return HEARTH_OK;
}

void engine_constraint_put(gram_cache *c, grammar *g) {
    if (!g) return;
    if (!c) {
        grammar_free(g);
        return;
    }
    pthread_mutex_lock(&c->mu);
    int found = 0;
    for (int i = 0; i < c->n && !found; i++)
        if (c->slot[i].g == g) c->slot[i].refs--, found = 1;
    pthread_mutex_unlock(&c->mu);
    if (!found) grammar_free(g);
}

hearth_status hearth_constraint_prepare(hearth_engine *e, hearth_constraint_kind kind, const char *text, size_t len,
                                        hearth_error *err) {
    if (kind == HEARTH_CONSTRAINT_NONE) return HEARTH_OK;
    gvocab *v = engine_grammar_vocab(e);
    if (!v) return err_set(err, HEARTH_ERR_UNSUPPORTED, "a constraint needs the model's tokenizer");
    grammar *g = NULL;
    hearth_status st = engine_constraint_get(engine_grammars(e), kind, text, len, v, &g, err);
    engine_constraint_put(engine_grammars(e), g);
    return st;
}
