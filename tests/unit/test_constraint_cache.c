/* test_constraint_cache.c: the engine's compiled constraints (engine/constraint.c): one
 * compilation per distinct (kind, text), shared by every holder; the least recently used
 * entry nobody holds makes room; with every entry held a request gets its own copy, freed
 * when it lets go (ASan checks the frees); concurrent getters of one text all get the one
 * grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// clang-format off: cmocka.h needs the four headers above first
#include <cmocka.h>
// clang-format on
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "grammar_vocab.h"

enum { CAP = 32 }; /* GRAM_CACHE_CAP */

static grammar *get(gram_cache *c, const gvocab *v, hearth_constraint_kind k, const char *text) {
    grammar *g = NULL;
    hearth_error err = {0};
    assert_int_equal(engine_constraint_get(c, k, text, text ? strlen(text) : 0, v, &g, &err), HEARTH_OK);
    assert_non_null(g);
    return g;
}

static void test_same_text_shares_one_grammar(void **state) {
    (void)state;
    gvocab *v = byte_vocab(NULL, NULL, 0);
    gram_cache *c = gram_cache_new();
    grammar *a = get(c, v, HEARTH_CONSTRAINT_REGEX, "[a-z]+"), *b = get(c, v, HEARTH_CONSTRAINT_REGEX, "[a-z]+");
    assert_ptr_equal(a, b);
    grammar *other = get(c, v, HEARTH_CONSTRAINT_REGEX, "[a-z]*");
    assert_ptr_not_equal(a, other);
    grammar *gbnf = get(c, v, HEARTH_CONSTRAINT_GBNF, "root ::= [a-z]+"); /* another kind */
    grammar *obj = get(c, v, HEARTH_CONSTRAINT_JSON_OBJECT, NULL), *obj2 = get(c, v, HEARTH_CONSTRAINT_JSON_OBJECT, NULL);
    assert_ptr_equal(obj, obj2);
    engine_constraint_put(c, a), engine_constraint_put(c, b), engine_constraint_put(c, other);
    engine_constraint_put(c, gbnf), engine_constraint_put(c, obj), engine_constraint_put(c, obj2);
    /* released, still kept: the next request finds it */
    grammar *again = get(c, v, HEARTH_CONSTRAINT_REGEX, "[a-z]+");
    assert_ptr_equal(again, a);
    engine_constraint_put(c, again);
    /* a bad source is an error and nothing is kept */
    grammar *bad = NULL;
    hearth_error err = {0};
    assert_int_equal(engine_constraint_get(c, HEARTH_CONSTRAINT_REGEX, "[a-", 3, v, &bad, &err), HEARTH_ERR_INVALID);
    assert_null(bad);
    gram_cache_free(c);
    gvocab_free(v);
}

static void test_full_cache_evicts_only_what_nobody_holds(void **state) {
    (void)state;
    gvocab *v = byte_vocab(NULL, NULL, 0);
    gram_cache *c = gram_cache_new();
    grammar *held[CAP];
    char text[32];
    for (int i = 0; i < CAP; i++) {
        snprintf(text, sizeof text, "x{%d}", i + 1);
        held[i] = get(c, v, HEARTH_CONSTRAINT_REGEX, text);
    }
    /* every slot held: the 33rd is compiled for its request alone and freed by its put */
    grammar *extra = get(c, v, HEARTH_CONSTRAINT_REGEX, "y+");
    grammar *extra2 = get(c, v, HEARTH_CONSTRAINT_REGEX, "y+");
    assert_ptr_not_equal(extra, extra2); /* not kept: two requests, two copies */
    engine_constraint_put(c, extra), engine_constraint_put(c, extra2);
    /* release one in the middle: the next new text takes its place, the others stay */
    engine_constraint_put(c, held[5]);
    grammar *z = get(c, v, HEARTH_CONSTRAINT_REGEX, "z+");
    assert_ptr_equal(get(c, v, HEARTH_CONSTRAINT_REGEX, "z+"), z); /* kept now */
    engine_constraint_put(c, z), engine_constraint_put(c, z);
    for (int i = 0; i < CAP; i++) {
        if (i == 5) continue;
        snprintf(text, sizeof text, "x{%d}", i + 1);
        grammar *g = get(c, v, HEARTH_CONSTRAINT_REGEX, text);
        assert_ptr_equal(g, held[i]);
        engine_constraint_put(c, g);
        engine_constraint_put(c, held[i]);
    }
    /* a NULL cache (out of memory at creation) compiles per request */
    grammar *own = get(NULL, v, HEARTH_CONSTRAINT_REGEX, "q");
    engine_constraint_put(NULL, own);
    gram_cache_free(c);
    gvocab_free(v);
}

typedef struct {
    gram_cache *c;
    const gvocab *v;
    grammar *seen[50];
} worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int i = 0; i < 50; i++) {
        grammar *g = NULL;
        hearth_error err = {0};
        if (engine_constraint_get(w->c, HEARTH_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"integer\"}", 18, w->v, &g, &err))
            return NULL;
        w->seen[i] = g;
        engine_constraint_put(w->c, g);
    }
    return w;
}

static void test_concurrent_getters_share(void **state) {
    (void)state;
    gvocab *v = byte_vocab(NULL, NULL, 0);
    gram_cache *c = gram_cache_new();
    grammar *pin = get(c, v, HEARTH_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"integer\"}"); /* kept while they run */
    worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){.c = c, .v = v};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_non_null(r);
        for (int k = 0; k < 50; k++) assert_ptr_equal(w[i].seen[k], pin);
    }
    engine_constraint_put(c, pin);
    gram_cache_free(c);
    gvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_text_shares_one_grammar),
        cmocka_unit_test(test_full_cache_evicts_only_what_nobody_holds),
        cmocka_unit_test(test_concurrent_getters_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
