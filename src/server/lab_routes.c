/* lab_routes.c: the sampling lab's endpoints beside the curve designer page (web/curves.*):
 * POST /signal (the next-token log-probability histogram of a chat prompt) and POST
 * /generate (n samples under a drawn curve or the model's default recipe, queued together
 * so the engine runs them as one batch). Requests go through the ordinary chat request
 * path (srv_request_parse, srv_generation_start); no engine access of its own. */
#include "base/sbuf.h"
#include "server/generation.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define SIGNAL_BINS 80                     /* the spec's histogram: 80 bins over [ln 1e-6, 0] */
#define SIGNAL_FLOOR (-13.815510557964274) /* ln 1e-6 */
#define LAB_MAX_N 8
#define LAB_MAX_TOKENS 256

typedef struct lab_recipe {
    float temperature, top_p;
    int top_k;
} lab_recipe;

/* An int field in [lo, hi] (absent: def). */
static int lab_int(const json_t *root, const char *name, long long def, long long lo, long long hi, long long *out,
                   srv_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return BAD(e, name, "%s must be an integer from %lld to %lld", name, lo, hi);
    *out = json_integer_value(v);
    return 0;
}

/* The body as a JSON object with a non-empty string `prompt`; caller decrefs *root. */
static int lab_body(const char *body, size_t len, json_t **root, const char **prompt, srv_error *e) {
    json_error_t je;
    *root = json_loadb(body, len, 0, &je);
    if (!*root) return BAD(e, NULL, "Invalid JSON in request body: %s", je.text);
    if (!json_is_object(*root)) return BAD(e, NULL, "the request body must be a JSON object");
    const json_t *p = json_object_get(*root, "prompt");
    if (!json_is_string(p) || !json_string_length(p)) return BAD(e, "prompt", "prompt must be a non-empty string");
    if (strlen(json_string_value(p)) != json_string_length(p))
        return BAD(e, "prompt", "prompt must not contain NUL characters");
    *prompt = json_string_value(p);
    return 0;
}

/* A chat request for prompt as one user message, through the ordinary parser. */
static int lab_request(srv_server *s, const char *prompt, int max_tokens, const lab_recipe *rc, int has_seed,
                       long long seed, srv_request *r, srv_error *e) {
    json_t *b =
        json_pack("{s:[{s:s,s:s}],s:i,s:f,s:f,s:i}", "messages", "role", "user", "content", prompt, "max_tokens",
                  max_tokens, "temperature", (double)rc->temperature, "top_p", (double)rc->top_p, "top_k", rc->top_k);
    if (!b) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (has_seed) json_object_set_new(b, "seed", json_integer(seed));
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (!text) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc2 = srv_request_parse(text, strlen(text), SRV_CHAT, &s->cfg.defaults, r, e);
    free(text);
    return rc2;
}

/* Waits for the job's end, appending its text to out (NULL: dropped). */
static void lab_collect(srv_generation *g, sbuf *out) {
    for (;;) {
        srv_event *ev = srv_job_next_event(g->job);
        srv_event_kind k = ev->kind;
        if (k == SRV_EV_TOKEN && out) sbuf_append(out, ev->text, strlen(ev->text));
        free(ev);
        if (k == SRV_EV_DONE) break;
    }
}

int srv_lab_signal(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_error e = {0};
    json_t *root = NULL;
    const char *prompt;
    srv_request r = {0};
    srv_generation g = {0};
    size_t rows = (size_t)hearth_model_vocab_rows(s->engine);
    int vocab = hearth_vocab_size(s->model);
    float *lp = malloc(rows * sizeof *lp);
    lab_recipe greedy = {0, 1, 0};
    srv_gen_options o = {.any_model = 1, .first_logprobs = lp};
    int rc;
    if (!lp) {
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    if (lab_body(body, len, &root, &prompt, &e) || lab_request(s, prompt, 1, &greedy, 0, 0, &r, &e) ||
        srv_generation_start(s, &r, &o, &g, &e))
        goto fail;
    lab_collect(&g, NULL);
    if (g.job->status) {
        srv_engine_error(g.job, &e);
        goto fail;
    }
    long long bins[SIGNAL_BINS] = {0};
    for (int i = 0; i < vocab && (size_t)i < rows; i++) {
        /* clamped into range: -inf and everything below 1e-6 in the first bin */
        double x = lp[i] > SIGNAL_FLOOR ? lp[i] : SIGNAL_FLOOR;
        int b = (int)floor((x - SIGNAL_FLOOR) / -SIGNAL_FLOOR * SIGNAL_BINS);
        bins[b < 0 ? 0 : b >= SIGNAL_BINS ? SIGNAL_BINS - 1 : b]++;
    }
    json_t *jb = json_array();
    for (int i = 0; i < SIGNAL_BINS; i++) json_array_append_new(jb, json_integer(bins[i]));
    json_t *reply = json_pack("{s:o,s:i}", "bins", jb, "vocab", vocab);
    char *text = reply ? srv_json_dumps(reply) : NULL;
    rc = text ? srv_respond(c, s, 200, text)
              : (srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e));
    free(text);
    json_decref(reply);
    goto done;
fail:
    rc = srv_respond_error(c, s, &e);
done:
    srv_generation_free(&g);
    srv_request_free(&r);
    json_decref(root);
    free(lp);
    return rc;
}

/* Degenerate text: empty, broken UTF-8 (U+FFFD), one character run of 16 or more, or
 * one word making up over 40% of at least 8 words. A hint for the page, not a filter. */
int srv_lab_junk(const char *t) {
    size_t n = strlen(t), run = 1, words = 0, best = 0;
    size_t lead = strspn(t, " \t\r\n");
    if (lead == n || strstr(t, "\xEF\xBF\xBD")) return 1;
    for (size_t i = 1; i < n; i++) {
        run = t[i] == t[i - 1] && t[i] != ' ' ? run + 1 : 1;
        if (run >= 16) return 1;
    }
    /* the commonest word by brute force: the texts are at most 256 tokens */
    const char *sep = " \t\r\n.,;:!?\"'()";
    for (const char *w = t + strspn(t, sep); *w; w += strcspn(w, sep), w += strspn(w, sep)) {
        size_t wl = strcspn(w, sep), same = 0;
        words++;
        for (const char *v = t + strspn(t, sep); *v; v += strcspn(v, sep), v += strspn(v, sep))
            same += strcspn(v, sep) == wl && !strncmp(v, w, wl);
        if (same > best) best = same;
    }
    return words >= 8 && best * 10 > words * 4;
}

/* A float flag value as people wrote it (0.7, not 0.699999988). */
static double short_float(float x) { return round((double)x * 1e6) / 1e6; }

/* The model's default recipe: generation_config.json's when it samples, else the seed's
 * built-in (temperature 0.7, top-p and top-k off). */
static lab_recipe default_recipe(const srv_server *s) {
    hearth_sampling d;
    hearth_sampling_defaults(s->model, &d);
    if (d.temperature > 0) return (lab_recipe){d.temperature, d.top_p, d.top_k};
    return (lab_recipe){0.7f, 1.0f, 0};
}

int srv_lab_generate(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_error e = {0};
    json_t *root = NULL;
    const char *prompt;
    long long n = 0, max_tokens = 0, seed = 0;
    hearth_curve curve;
    srv_request r[LAB_MAX_N];
    srv_generation g[LAB_MAX_N];
    sbuf text[LAB_MAX_N];
    memset(r, 0, sizeof r), memset(g, 0, sizeof g);
    for (int i = 0; i < LAB_MAX_N; i++) sbuf_init(&text[i]);
    int started = 0, rc;
    if (lab_body(body, len, &root, &prompt, &e) || lab_int(root, "n", 3, 1, LAB_MAX_N, &n, &e) ||
        lab_int(root, "max_tokens", 80, 1, LAB_MAX_TOKENS, &max_tokens, &e) ||
        lab_int(root, "seed", (long long)(time(NULL) & 0x7fffffff), 0, (1ll << 53) - LAB_MAX_N, &seed, &e) ||
        srv_parse_curve(json_object_get(root, "curve"), &curve, &e))
        goto fail;
    const json_t *dv = json_object_get(root, "default");
    if (dv && !json_is_null(dv) && !json_is_boolean(dv)) {
        BAD(&e, "default", "default must be a boolean");
        goto fail;
    }
    int use_default = json_is_true(dv) || !curve.n_points;
    lab_recipe recipe = use_default ? default_recipe(s) : (lab_recipe){1, 1, 0}; /* the curve replaces them */
    srv_gen_options o = {.any_model = 1};
    /* every sample queued before the first is read: the engine takes them into one batch */
    for (; started < n; started++) {
        if (lab_request(s, prompt, (int)max_tokens, &recipe, 1, seed + started, &r[started], &e)) goto fail;
        if (!use_default) r[started].curve = curve;
        if (srv_generation_start(s, &r[started], &o, &g[started], &e)) {
            srv_request_free(&r[started]);
            goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        lab_collect(&g[i], &text[i]);
        if (g[i].job->status) {
            srv_engine_error(g[i].job, &e);
            goto fail;
        }
    }
    json_t *samples = json_array();
    for (int i = 0; i < n; i++) {
        const char *t = text[i].data ? text[i].data : "";
        json_array_append_new(samples, json_pack("{s:s,s:b}", "text", t, "junk", srv_lab_junk(t)));
    }
    json_t *reply = json_pack("{s:s}", "mode", use_default ? "default" : "curve");
    if (use_default)
        json_object_set_new(reply, "recipe",
                            json_pack("{s:f,s:f,s:i}", "temperature", short_float(recipe.temperature), "top_p",
                                      short_float(recipe.top_p), "top_k", recipe.top_k));
    json_object_set_new(reply, "n", json_integer(n));
    json_object_set_new(reply, "seed", json_integer(seed));
    json_object_set_new(reply, "samples", samples);
    char *out = srv_json_dumps(reply);
    json_decref(reply);
    rc = out ? srv_respond(c, s, 200, out)
             : (srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, s, &e));
    free(out);
    goto done;
fail:
    rc = srv_respond_error(c, s, &e);
done:
    for (int i = 0; i < started; i++) {
        srv_generation_free(&g[i]);
        srv_request_free(&r[i]);
    }
    for (int i = 0; i < LAB_MAX_N; i++) sbuf_free(&text[i]);
    json_decref(root);
    return rc;
}
