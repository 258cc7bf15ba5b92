/* adapters.c: LoRA adapters over HTTP: GET/POST /v1/adapters, DELETE /v1/adapters/<id>,
 * GET /v1/adapters/available, which adapters a completion request asks for (the `adapter`
 * field, mlx_lm.server's `adapters` path, or a `model` naming an adapter id), and the
 * adapter entries /v1/models and /stats list. Mounting reads the adapter on the HTTP thread
 * that asked (the engine keeps stepping); only the engine's registry lock is shared. */
#define _GNU_SOURCE
#include "server/adapters.h"
#include "server/http_conn.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int respond_json(srv_conn *c, const srv_server *s, int status, json_t *o) {
    char *body = srv_json_dumps(o);
    json_decref(o);
    int rc = srv_respond(c, s, status, body ? body : "{}");
    free(body);
    return rc;
}

static int fail(srv_conn *c, const srv_server *s, int status, const char *code, const char *param, const char *msg) {
    srv_error e = {0};
    srv_fail(&e, status, "invalid_request_error", param, code, "%s", msg);
    return srv_respond_error(c, s, &e);
}

json_t *srv_adapters_list(const srv_server *s) {
    char *j = s->engine ? hearth_adapters_json(s->engine) : NULL;
    json_t *arr = j ? json_loads(j, 0, NULL) : NULL;
    hearth_free(j);
    return arr ? arr : json_array();
}

/* The mounted adapter whose id or path is name (NULL: none); a new reference. */
static json_t *find_adapter(const srv_server *s, const char *name) {
    json_t *arr = srv_adapters_list(s), *found = NULL, *a;
    size_t i;
    json_array_foreach(arr, i, a) {
        const char *id = json_string_value(json_object_get(a, "id")), *path = json_string_value(json_object_get(a, "path"));
        if ((id && !strcmp(id, name)) || (path && !strcmp(path, name))) {
            found = json_incref(a);
            break;
        }
    }
    json_decref(arr);
    return found;
}

/* Whether a mounted adapter has the id or path name; its id into id. */
static int find_id(const srv_server *s, const char *name, char *id, size_t cap) {
    hearth_error err = {0};
    return s->engine && hearth_adapter_find(s->engine, name, id, cap, &err) == HEARTH_OK;
}

int srv_adapter_spec(const srv_server *s, const srv_request *r, char *spec, size_t cap, srv_error *e) {
    spec[0] = 0;
    const char *field = "adapter";
    int by_model = 0, found = 0;
    if (r->adapter) {
        if (strlen(r->adapter) >= cap) return srv_fail(e, 400, "invalid_request_error", field, NULL, "adapter is too long");
        snprintf(spec, cap, "%s", r->adapter);
        found = 1;
    } else if (r->adapters) { /* mlx_lm.server: a path; here it names a mounted adapter by path or id */
        field = "adapters";
        if (!find_id(s, r->adapters, spec, cap))
            return srv_fail(e, 400, "invalid_request_error", "adapters", "adapter_not_found",
                            "adapters '%s' is not mounted: mount it first (POST /v1/adapters {\"id\", \"path\"} or "
                            "serve --adapter id=path)",
                            r->adapters);
        found = 1;
    }
    if (!found && r->model && !srv_model_matches(s, r->model) && find_id(s, r->model, spec, cap))
        found = 1, field = "model", by_model = 1; /* a gateway's model */
    /* mlx_lm.server: --adapter-path belongs to "default_model"; a request naming the served
     * model itself gets the base (unless it names an adapter) */
    if (!found && r->model && strcmp(r->model, "default_model") && srv_model_matches(s, r->model))
        snprintf(spec, cap, "none"), found = 1;
    if (!found) return 1; /* the default */
    hearth_error err = {0};
    if (hearth_adapter_check(s->engine, spec, &err))
        return srv_fail(e, 400, "invalid_request_error", field,
                        err.status == HEARTH_ERR_NOT_FOUND ? "adapter_not_found" : NULL, "%s", err.message);
    return by_model ? 2 : 0;
}

/* POST /v1/adapters {"id", "path"}: mounts, all or nothing. */
int srv_adapters_post(srv_server *s, srv_conn *c, const char *body, size_t len) {
    json_error_t je;
    json_t *j = json_loadb(body, len, 0, &je);
    const json_t *id = json_object_get(j, "id"), *path = json_object_get(j, "path");
    int rc;
    if (!json_is_object(j))
        rc = fail(c, s, 400, NULL, NULL, "the body must be a JSON object {\"id\": ..., \"path\": ...}");
    else if (!json_is_string(path))
        rc = fail(c, s, 400, NULL, "path", "path (the adapter folder) must be a string");
    else if (!json_is_string(id))
        rc = fail(c, s, 400, NULL, "id", "id (the name requests use) must be a string");
    else {
        const char *p = json_string_value(path), *name = json_string_value(id);
        hearth_error err = {0};
        if (hearth_adapter_mount(s->engine, name, p, &err))
            rc = fail(c, s, err.status == HEARTH_ERR_INVALID && strstr(err.message, "mounted already") ? 409 : 400,
                      NULL, "path", err.message);
        else {
            srv_log(s, SRV_LOG_INFO, "adapter %s mounted from %s", name, p);
            json_t *a = find_adapter(s, name);
            if (a) json_object_set_new(a, "object", json_string("adapter"));
            rc = respond_json(c, s, 200, a ? a : json_object());
        }
    }
    json_decref(j);
    return rc;
}

int srv_adapters_get(srv_server *s, srv_conn *c) {
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", srv_adapters_list(s));
    return respond_json(c, s, 200, o);
}

int srv_adapters_delete(srv_server *s, srv_conn *c, const char *id) {
    hearth_error err = {0};
    if (!id || !*id) return fail(c, s, 404, "adapter_not_found", "id", "no adapter id in the path");
    if (hearth_adapter_unmount(s->engine, id, &err))
        return fail(c, s, err.status == HEARTH_ERR_NOT_FOUND ? 404 : 400, "adapter_not_found", "id", err.message);
    srv_log(s, SRV_LOG_INFO, "adapter %s unmounted", id);
    return respond_json(c, s, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "adapter", "deleted", 1));
}

static int has_config(const char *dir) {
    char *p;
    struct stat st;
    if (asprintf(&p, "%s/adapter_config.json", dir) < 0) return 0;
    int ok = !stat(p, &st) && S_ISREG(st.st_mode);
    free(p);
    return ok;
}

/* dir itself and its subfolders that hold an adapter_config.json and fit the served model. */
static void scan(srv_server *s, const char *dir, json_t *out, json_t *seen) {
    DIR *d = opendir(dir);
    struct dirent *ent;
    for (int self = 1; self || (d && (ent = readdir(d))); self = 0) {
        char *path = NULL;
        if (self) path = strdup(dir);
        else if (ent->d_name[0] == '.' || asprintf(&path, "%s/%s", dir, ent->d_name) < 0) continue;
        if (path && has_config(path) && !json_object_get(seen, path)) {
            json_object_set_new(seen, path, json_true());
            hearth_error err = {0};
            int ok = hearth_adapter_probe(s->engine, path, &err) == HEARTH_OK;
            if (ok) json_array_append_new(out, json_pack("{s:s}", "path", path));
        }
        free(path);
    }
    if (d) closedir(d);
}

/* GET /v1/adapters/available: adapter folders on disk the served model could mount: ./adapters
 * (mlx_lm.lora's default output) and its subfolders, and the folders beside every mounted
 * adapter. */
int srv_adapters_available(srv_server *s, srv_conn *c) {
    json_t *out = json_array(), *seen = json_object(), *mounted = srv_adapters_list(s), *a;
    scan(s, "adapters", out, seen);
    size_t i;
    json_array_foreach(mounted, i, a) {
        char *dir = strdup(json_string_value(json_object_get(a, "path")));
        if (!dir) continue;
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = 0;
        else strcpy(dir, ".");
        scan(s, dir, out, seen);
        free(dir);
    }
    json_decref(mounted);
    json_decref(seen);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", out);
    return respond_json(c, s, 200, o);
}
