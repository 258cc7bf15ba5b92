/* adapter_api.c: the public adapter calls of hearth.h (mount, unmount, default, check,
 * list) on an engine's registry. Any thread: the registry locks. */
#define _GNU_SOURCE
#include "base/err.h"
#include "engine/adapter.h"
#include "engine/engine_internal.h"
#include <string.h>

/* An id a URL path and an "a+b" spec can carry. */
static int id_ok(const char *id) {
    if (!id || !*id || strlen(id) > 128 || !strcmp(id, "none")) return 0;
    for (const char *p = id; *p; p++)
        if (!(*p == '-' || *p == '_' || *p == '.' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return 0;
    return 1;
}

hearth_status hearth_adapter_mount(hearth_engine *e, const char *id, const char *path, hearth_error *err) {
    if (!id_ok(id))
        return err_set(err, HEARTH_ERR_INVALID,
                       "adapter id '%s' must be 1-128 characters of letters, digits, '-', '_' or '.' (not \"none\")",
                       id ? id : "");
    if (!path || !*path) return err_set(err, HEARTH_ERR_INVALID, "adapter '%s': no path", id);
    adapter *a;
    hearth_status st = adapter_load(engine_weights(e), path, &a, err);
    if (st) return st;
    if (!(a->id = strdup(id))) {
        adapter_free(a);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    if ((st = adapter_registry_add(engine_adapters(e), a, err))) adapter_free(a);
    return st;
}

hearth_status hearth_adapter_unmount(hearth_engine *e, const char *id, hearth_error *err) {
    return adapter_registry_remove(engine_adapters(e), id ? id : "", err);
}

hearth_status hearth_adapter_set_default(hearth_engine *e, const char *id, hearth_error *err) {
    return adapter_registry_set_default(engine_adapters(e), id, err);
}

hearth_status hearth_adapter_check(hearth_engine *e, const char *spec, hearth_error *err) {
    adapter_set *s;
    hearth_status st = adapter_registry_resolve(engine_adapters(e), spec, &s, err);
    adapter_set_release(engine_adapters(e), s);
    return st;
}

hearth_status hearth_adapter_probe(hearth_engine *e, const char *path, hearth_error *err) {
    adapter *a;
    hearth_status st = adapter_load(engine_weights(e), path, &a, err);
    adapter_free(a);
    return st;
}

char *hearth_adapters_json(hearth_engine *e) { return adapter_registry_json(engine_adapters(e)); }

hearth_status hearth_adapter_find(hearth_engine *e, const char *name, char *id, size_t cap, hearth_error *err) {
    if (!name || !id || !cap) return err_set(err, HEARTH_ERR_INVALID, "hearth_adapter_find: no name or no room for the id");
    int rc = adapter_registry_find_name(engine_adapters(e), name, id, cap);
    if (rc == -2) return err_set(err, HEARTH_ERR_INVALID, "the id of adapter '%s' is longer than %zu bytes", name, cap - 1);
    return rc ? err_set(err, HEARTH_ERR_NOT_FOUND, "no mounted adapter has the id or path '%s'", name) : HEARTH_OK;
}

hearth_status hearth_seq_set_adapter(hearth_engine *e, int seq, const char *spec, hearth_error *err) {
    adapter_set *s;
    hearth_status st = adapter_registry_resolve(engine_adapters(e), spec, &s, err);
    if (st) return st;
    if (engine_seq_use_adapters(e, seq, s))
        st = err_set(err, HEARTH_ERR_INVALID, "sequence %d: adapters are set on an open, empty sequence", seq);
    adapter_set_release(engine_adapters(e), s);
    return st;
}
