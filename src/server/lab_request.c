/* lab_request.c: the sampling lab's request fields, shared by every generation API
 * (chat, completions, Responses, Anthropic) and the designer's /generate: `curve` (the
 * designer's transfer curve) and `hlg` (the HLG tone curve, defaults from the
 * --hlg-* flags). Parsing and validation only; must not touch the model or the engine. */
#include "server/server.h"
#include <math.h>
#include <string.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

int srv_parse_curve(const json_t *v, hearth_curve *c, srv_error *e) {
    memset(c, 0, sizeof *c);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return BAD(e, "curve", "curve must be an object {\"space\": \"logprob\", \"points\": [...]}");
    const json_t *space = json_object_get(v, "space");
    if (space && !(json_is_string(space) && !strcmp(json_string_value(space), "logprob")))
        return BAD(e, "curve", "curve.space must be \"logprob\" (the only space there is)");
    const json_t *pts = json_object_get(v, "points");
    if (!json_is_array(pts)) return BAD(e, "curve", "curve.points must be a list of {\"x_pct\", \"y_pct\"}");
    size_t n = json_array_size(pts);
    if (n < 2 || n > HEARTH_CURVE_MAX_POINTS)
        return BAD(e, "curve", "curve.points has %zu points; a curve has 2 to %d", n, HEARTH_CURVE_MAX_POINTS);
    double x[HEARTH_CURVE_MAX_POINTS], y[HEARTH_CURVE_MAX_POINTS];
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_array_get(pts, i), *px = json_object_get(p, "x_pct"), *py = json_object_get(p, "y_pct");
        if (!json_is_number(px) || !json_is_number(py))
            return BAD(e, "curve", "curve.points[%zu] must be {\"x_pct\": number, \"y_pct\": number}", i);
        x[i] = json_number_value(px), y[i] = json_number_value(py);
        if (x[i] < 0 || y[i] < 0)
            return BAD(e, "curve", "curve.points[%zu]: percentages are between 0 and 100 (got %g, %g)", i, x[i], y[i]);
    }
    hearth_error err = {0};
    if (hearth_curve_set(c, x, y, (int)n, &err)) return BAD(e, "curve", "%s", err.message);
    return 0;
}

/* One number of the hlg object in [0, 10000] (absent: keep *out): larger ones make no curve
 * (log-probabilities span a few dozen nats) and would overflow the float they are kept in. */
static int hlg_num(const json_t *o, const char *name, float *out, srv_error *e) {
    const json_t *v = json_object_get(o, name);
    if (!v) return 0;
    if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1e4))
        return BAD(e, "hlg", "hlg.%s must be a number from 0 to 10000 (nats)", name);
    *out = (float)json_number_value(v);
    return 0;
}

static int parse_hlg(const json_t *v, const hearth_hlg *def, hearth_hlg *h, srv_error *e) {
    *h = *def;
    if (!v || json_is_null(v)) return 0;
    if (json_is_boolean(v)) {
        h->enabled = json_is_true(v);
        return 0;
    }
    if (!json_is_object(v)) return BAD(e, "hlg", "hlg must be a boolean or an object");
    static const char *known[] = {"enabled", "width", "shoulder", "toe", "pivot_offset", "gain"};
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(key, known[k])) k++;
        if (k == sizeof known / sizeof known[0])
            return BAD(e, "hlg", "hlg.%s is not a field (enabled, width, shoulder, toe, pivot_offset, gain)", key);
    }
    const json_t *en = json_object_get(v, "enabled");
    if (en && !json_is_boolean(en)) return BAD(e, "hlg", "hlg.enabled must be a boolean");
    h->enabled = en ? json_is_true(en) : 1; /* an object asks for HLG unless it says otherwise */
    return hlg_num(v, "width", &h->width, e) || hlg_num(v, "shoulder", &h->shoulder, e) ||
           hlg_num(v, "toe", &h->toe, e) || hlg_num(v, "pivot_offset", &h->pivot_offset, e) ||
           hlg_num(v, "gain", &h->gain, e);
}

int srv_parse_lab(const json_t *root, const srv_defaults *d, srv_request *r, srv_error *e) {
    return parse_hlg(json_object_get(root, "hlg"), &d->hlg, &r->hlg, e) ||
           srv_parse_curve(json_object_get(root, "curve"), &r->curve, e);
}
