/* library_routes.c: the model library over HTTP: GET /library (hearth ls --json),
 * GET /fit?model=&ctx=&batch=[&device=cuda][&sku=h200][&kv_quant=int8][&skus=1] (hearth fit --json
 * [--device --sku --kv-quant --skus]), GET /downloads and
 * POST /downloads {"model": "org/name", "include"?: "*.gguf"} (a background hearth pull). Reads and starts
 * downloads only; never touches the engine the server is running. */
#include "server/server.h"
#include <stdlib.h>
#include <string.h>

static int respond_owned(srv_conn *c, const srv_server *s, int status, char *body) {
    int rc = srv_respond(c, s, status, body ? body : "{}");
    free(body);
    return rc;
}

static int fail(srv_conn *c, const srv_server *s, int status, const char *param, const char *message) {
    srv_error e = {0};
    srv_fail(&e, status, "invalid_request_error", param, NULL, "%s", message);
    return srv_respond_error(c, s, &e);
}

/* A non-negative integer query parameter; 0 when absent, -1 when malformed. */
static long query_int(srv_conn *c, const char *key) {
    const char *v = srv_query(c, key);
    if (!v || !*v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return *end || n < 0 || n > 1 << 24 ? -1 : n;
}

static int fit(srv_server *s, srv_conn *c) {
    const char *name = srv_query(c, "model");
    hearth_fit_options fo = {0};
    long ctx = query_int(c, "ctx"), batch = query_int(c, "batch");
    if (ctx < 0) return fail(c, s, 400, "ctx", "ctx must be a positive integer");
    if (batch < 0) return fail(c, s, 400, "batch", "batch must be a positive integer");
    fo.engine.context_length = (int)ctx;
    fo.engine.max_sequences = batch ? (int)batch : HEARTH_SERVE_MAX_SEQUENCES; /* as hearth fit: serve's default */
    const char *device = srv_query(c, "device");
    if (device && *device && !hearth_device_parse(device, &fo.engine.device))
        return fail(c, s, 400, "device", "device must be cpu, cuda or auto");
    const char *kvq = srv_query(c, "kv_quant");
    if (kvq && *kvq && !hearth_kv_quant_parse(kvq, &fo.engine.kv_quant))
        return fail(c, s, 400, "kv_quant", "kv_quant must be none, int8, fp8 or f16 (fp8 and f16 on the GPU only)");
    fo.sku = srv_query(c, "sku"); /* a GPU of data/skus.json */
    hearth_model *m = s->model, *opened = NULL;
    hearth_error err = {0};
    if (name && *name && !srv_model_matches(s, name)) {
        if (hearth_model_open(name, &opened, &err))
            return fail(c, s, err.status == HEARTH_ERR_NOT_FOUND || err.status == HEARTH_ERR_AMBIGUOUS ? 404 : 400,
                        "model", err.message);
        m = opened;
    }
    char *report = NULL;
    int rc;
    const char *skus = srv_query(c, "skus");
    int with_skus = skus && strcmp(skus, "0") && strcmp(skus, "false");
    if ((with_skus ? hearth_fit_skus : hearth_fit)(m, &fo, &report, &err))
        rc = fail(c, s, 400, NULL, err.message);
    else
        rc = respond_owned(c, s, 200, report);
    if (opened) hearth_model_close(opened);
    return rc;
}

int srv_library_get(srv_server *s, srv_conn *c, const char *url) {
    if (!strcmp(url, "/fit")) return fit(s, c);
    if (!strcmp(url, "/downloads")) return respond_owned(c, s, 200, hearth_downloads_json());
    hearth_library_options o = {0};
    const char *max = srv_query(c, "max_size");
    o.family = srv_query(c, "family");
    if (max && (o.max_size_bytes = hearth_parse_size(max)) <= 0)
        return fail(c, s, 400, "max_size", "max_size must be a size like 10GB");
    return respond_owned(c, s, 200, hearth_library_json(&o));
}

int srv_library_post(srv_server *s, srv_conn *c, const char *body, size_t len) {
    json_error_t je;
    json_t *req = json_loadb(body, len, 0, &je);
    const char *model = json_string_value(json_object_get(req, "model"));
    const char *include = json_string_value(json_object_get(req, "include"));
    int rc;
    hearth_error err = {0};
    if (!model)
        rc = fail(c, s, 400, "model", "expected a JSON body {\"model\": \"org/name[@revision]\"}");
    else if (hearth_download_start(model, include, &err))
        rc = fail(c, s, 400, "model", err.message);
    else {
        json_t *o = json_pack("{s:s, s:s}", "model", model, "state", "downloading");
        rc = respond_owned(c, s, 202, srv_json_dumps(o));
        json_decref(o);
    }
    json_decref(req);
    return rc;
}
