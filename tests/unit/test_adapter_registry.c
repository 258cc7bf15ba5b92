/* test_adapter_registry.c: the registry of mounted adapters (engine/adapter.c): ids, the
 * default, "a+b" / "none" specs and their errors, DoRA refusing company, and that an adapter
 * unmounted while a request's set still names it stays valid until that set is released
 * (run under ASan it also proves nothing is freed early or leaked), and that only then its
 * mount serial (op_adapter.key) is handed to the engine as gone (a device copy may go). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "engine/adapter.h"

static adapter *fake(const char *id, int dora) {
    adapter *a = calloc(1, sizeof *a);
    a->id = strdup(id);
    a->path = strdup("/nowhere");
    a->format = "mlx";
    a->dora = dora;
    a->rank = 4;
    a->proj = calloc(OP_N_PROJ, sizeof *a->proj);
    a->ops.proj = a->proj;
    return a;
}

static void test_specs(void **state) {
    (void)state;
    adapter_registry r;
    adapter_registry_init(&r);
    hearth_error err = {0};
    assert_int_equal(adapter_registry_add(&r, fake("a", 0), &err), HEARTH_OK);
    assert_int_equal(adapter_registry_add(&r, fake("b", 0), &err), HEARTH_OK);
    assert_int_equal(adapter_registry_add(&r, fake("d", 1), &err), HEARTH_OK);
    adapter *dup = fake("a", 0);
    assert_int_equal(adapter_registry_add(&r, dup, &err), HEARTH_ERR_INVALID);
    adapter_free(dup);
    adapter_set *s;
    assert_int_equal(adapter_registry_resolve(&r, NULL, &s, &err), HEARTH_OK); /* no default: the base */
    assert_null(s);
    assert_int_equal(adapter_registry_resolve(&r, "none", &s, &err), HEARTH_OK);
    assert_null(s);
    assert_int_equal(adapter_registry_resolve(&r, "a+b", &s, &err), HEARTH_OK);
    assert_int_equal(s->ops.n, 2);
    uint64_t ns_ab = s->ns;
    adapter_set_release(&r, s);
    assert_int_equal(adapter_registry_resolve(&r, "b+a", &s, &err), HEARTH_OK);
    assert_true(s->ns != ns_ab); /* another order is another sum order: its own namespace */
    adapter_set_release(&r, s);
    assert_int_equal(adapter_registry_resolve(&r, "a+zz", &s, &err), HEARTH_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "'zz' is not mounted"));
    assert_int_equal(adapter_registry_resolve(&r, "a+a", &s, &err), HEARTH_ERR_INVALID);
    assert_int_equal(adapter_registry_resolve(&r, "a+d", &s, &err), HEARTH_ERR_UNSUPPORTED);
    assert_int_equal(adapter_registry_resolve(&r, "d+a", &s, &err), HEARTH_ERR_UNSUPPORTED);
    assert_int_equal(adapter_registry_resolve(&r, "d", &s, &err), HEARTH_OK);
    adapter_set_release(&r, s);
    assert_int_equal(adapter_registry_set_default(&r, "b", &err), HEARTH_OK);
    assert_int_equal(adapter_registry_resolve(&r, NULL, &s, &err), HEARTH_OK);
    assert_string_equal(s->members[0]->id, "b");
    adapter_set_release(&r, s);
    assert_int_equal(adapter_registry_set_default(&r, "zz", &err), HEARTH_ERR_NOT_FOUND);
    char *json = adapter_registry_json(&r);
    assert_non_null(strstr(json, "\"id\":\"b\""));
    free(json);
    adapter_registry_free(&r);
}

static void test_unmount_while_in_use(void **state) {
    (void)state;
    adapter_registry r;
    adapter_registry_init(&r);
    hearth_error err = {0};
    assert_int_equal(adapter_registry_add(&r, fake("a", 0), &err), HEARTH_OK);
    assert_int_equal(adapter_registry_set_default(&r, "a", &err), HEARTH_OK);
    uint64_t gone[4], key = r.head->ops.key;
    assert_true(key != 0 && key == r.head->serial);
    adapter_set *held, *s;
    assert_int_equal(adapter_registry_resolve(&r, "a", &held, &err), HEARTH_OK);
    adapter_set_retain(&r, held); /* a request and its slot each hold it */
    assert_int_equal(adapter_registry_remove(&r, "a", &err), HEARTH_OK);
    assert_int_equal(adapter_registry_remove(&r, "a", &err), HEARTH_ERR_NOT_FOUND);
    assert_int_equal(adapter_registry_resolve(&r, "a", &s, &err), HEARTH_ERR_NOT_FOUND); /* new requests */
    assert_int_equal(adapter_registry_resolve(&r, NULL, &s, &err), HEARTH_OK);          /* the default went too */
    assert_null(s);
    assert_string_equal(held->members[0]->id, "a"); /* the running request still reads it */
    assert_int_equal(adapter_registry_take_gone(&r, gone, 4), 0); /* not gone while a set holds it */
    assert_true(held->ops.a[0]->proj != NULL);
    /* mounted again under the same id: a new namespace, so no KV of the old one is reused */
    assert_int_equal(adapter_registry_add(&r, fake("a", 0), &err), HEARTH_OK);
    assert_int_equal(adapter_registry_resolve(&r, "a", &s, &err), HEARTH_OK);
    assert_true(s->ns != held->ns);
    adapter_set_release(&r, s);
    adapter_set_release(&r, held);
    adapter_set_release(&r, held); /* the last reference frees the unmounted adapter */
    assert_int_equal(adapter_registry_take_gone(&r, gone, 4), 1);
    assert_true(gone[0] == key);
    assert_int_equal(adapter_registry_take_gone(&r, gone, 4), 0); /* taken once */
    /* more freed adapters than the registry keeps: the newest ADAPTER_GONE_MAX, in order */
    for (int i = 0; i < ADAPTER_GONE_MAX + 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "x%d", i);
        assert_int_equal(adapter_registry_add(&r, fake(id, 0), &err), HEARTH_OK);
        assert_int_equal(adapter_registry_remove(&r, id, &err), HEARTH_OK);
    }
    uint64_t many[ADAPTER_GONE_MAX + 8];
    int n = adapter_registry_take_gone(&r, many, ADAPTER_GONE_MAX + 8);
    assert_int_equal(n, ADAPTER_GONE_MAX);
    for (int i = 1; i < n; i++) assert_true(many[i] == many[i - 1] + 1);
    adapter_registry_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specs),
        cmocka_unit_test(test_unmount_while_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
