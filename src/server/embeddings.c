/* embeddings.c: POST /v1/embeddings in OpenAI's shape: input as a string, a list of
 * strings, a list of token ids or a list of token-id lists; encoding_format float or
 * base64 (little-endian float32); dimensions (truncate, then renormalize when the model
 * normalizes). Requests run on their HTTP thread, one at a time per embedder (a mutex):
 * the embedder has its own weights, scratch and threads, so it never touches the
 * generation engine or its running requests. */
#include "server/embeddings.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_embed {
    hearth_model *m;
    int owns_model;
    hearth_embedder *e;
    pthread_mutex_t mu;
    char name[256]; /* the folder or file name, echoed when a request names no model */
};

hearth_status srv_embed_open(hearth_model *m, int owns_model, int n_threads, srv_embed **out, hearth_error *err) {
    *out = NULL;
    srv_embed *se = calloc(1, sizeof *se);
    if (!se) {
        snprintf(err->message, sizeof err->message, "out of memory");
        return err->status = HEARTH_ERR_NOMEM;
    }
    hearth_embedder_options o = {.n_threads = n_threads};
    hearth_status st = hearth_embedder_create(m, &o, &se->e, err);
    if (st) {
        free(se);
        return st;
    }
    se->m = m;
    se->owns_model = owns_model;
    const char *path = hearth_model_path(m), *base = strrchr(path, '/');
    snprintf(se->name, sizeof se->name, "%s", base && base[1] ? base + 1 : path);
    pthread_mutex_init(&se->mu, NULL);
    *out = se;
    return HEARTH_OK;
}

void srv_embed_close(srv_embed *se) {
    if (!se) return;
    hearth_embedder_free(se->e);
    if (se->owns_model) hearth_model_close(se->m);
    pthread_mutex_destroy(&se->mu);
    free(se);
}

const char *srv_embed_model_path(const srv_embed *se) { return se ? hearth_model_path(se->m) : NULL; }

void emb_request_free(emb_request *r) {
    for (size_t i = 0; r->ids && i < r->n; i++) hearth_free(r->ids[i]);
    free(r->ids);
    free(r->lens);
}

static int bad(srv_error *e, const char *param, const char *fmt, const char *arg) {
    return srv_fail(e, 400, "invalid_request_error", param, NULL, fmt, arg);
}

/* One list of token ids; checked against the vocabulary and the longest input. */
static int take_ids(const emb_limits *m, const json_t *arr, emb_request *r, size_t k, srv_error *e) {
    size_t n = json_array_size(arr), i;
    const json_t *v;
    char where[48];
    snprintf(where, sizeof where, "%zu", k);
    if (!n) return bad(e, "input", "'$.input' is invalid: token list %s is empty", where);
    if (n > (size_t)m->max_tokens)
        return srv_fail(e, 400, "invalid_request_error", "input", "context_length_exceeded",
                        "input %zu has %zu tokens; this model's maximum is %d tokens", k, n, m->max_tokens);
    if (!(r->ids[k] = malloc(n * sizeof(int32_t))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int32_t vocab = m->vocab;
    json_array_foreach(arr, i, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= vocab)
            return srv_fail(e, 400, "invalid_request_error", "input", NULL,
                            "'$.input' is invalid: token %zu of input %zu is not a token id (0..%d)", i, k,
                            (int)vocab - 1);
        r->ids[k][i] = (int32_t)id;
    }
    r->lens[k] = n;
    return 0;
}

static int take_text(const emb_limits *m, const json_t *s, int truncate, emb_request *r, size_t k, srv_error *e) {
    if (!json_string_length(s)) return bad(e, "input", "%s", "'$.input' is invalid: an input string must not be empty");
    hearth_error err = {0};
    if (m->tokenize(m->ctx, json_string_value(s), json_string_length(s), truncate, &r->ids[k], &r->lens[k], &err))
        return srv_fail(e, 400, "invalid_request_error", "input",
                        err.status == HEARTH_ERR_INVALID ? "context_length_exceeded" : NULL, "input %zu: %s", k,
                        err.message);
    return 0;
}

/* Classifies `input`: a string, a list of strings, a list of ids, a list of id lists. */
static int parse_inputs(const emb_limits *m, const json_t *in, int truncate, emb_request *r, srv_error *e) {
    const json_t *list = in;
    int one_ids = 0;
    if (json_is_string(in))
        list = NULL;
    else if (!json_is_array(in))
        return bad(e, "input", "%s", "'input' must be a string or an array");
    else if (!json_array_size(in))
        return bad(e, "input", "%s", "'$.input' is invalid: the input list is empty");
    else if (json_is_integer(json_array_get(in, 0)))
        one_ids = 1;
    r->n = list && !one_ids ? json_array_size(list) : 1;
    if (r->n > EMB_MAX_INPUTS) {
        char n[32];
        snprintf(n, sizeof n, "%zu", r->n);
        return srv_fail(e, 400, "invalid_request_error", "input", NULL,
                        "'$.input' is invalid: %s inputs; at most %d per request", n, EMB_MAX_INPUTS);
    }
    if (!(r->ids = calloc(r->n, sizeof *r->ids)) || !(r->lens = calloc(r->n, sizeof *r->lens)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!list) return take_text(m, in, truncate, r, 0, e);
    if (one_ids) return take_ids(m, in, r, 0, e);
    for (size_t k = 0; k < r->n; k++) {
        const json_t *item = json_array_get(list, k);
        int rc = json_is_string(item) ? take_text(m, item, truncate, r, k, e)
                 : json_is_array(item)
                     ? take_ids(m, item, r, k, e)
                     : bad(e, "input", "%s", "'$.input' is invalid: items must all be strings or all token-id lists");
        if (rc) return rc;
        if (json_is_string(item) != json_is_string(json_array_get(list, 0)))
            return bad(e, "input", "%s", "'$.input' is invalid: items must all be strings or all token-id lists");
    }
    return 0;
}

int emb_request_parse(const json_t *body, const emb_limits *m, emb_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    if (!json_is_object(body)) return bad(e, NULL, "%s", "the request body must be a JSON object");
    const json_t *in = json_object_get(body, "input"), *fmt = json_object_get(body, "encoding_format");
    const json_t *dims = json_object_get(body, "dimensions"), *model = json_object_get(body, "model");
    const json_t *trunc = json_object_get(body, "truncate"); /* hearth's extension */
    if (!in) return bad(e, "input", "%s", "'input' is required");
    if (model && !json_is_string(model)) return bad(e, "model", "%s", "'model' must be a string");
    r->model = json_string_value(model);
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return bad(e, "encoding_format", "%s", "'encoding_format' must be 'float' or 'base64'");
        r->base64 = !strcmp(f, "base64");
    }
    int dim = m->dim;
    r->dims = dim;
    if (dims && !json_is_null(dims)) {
        json_int_t d = json_integer_value(dims);
        char msg[32];
        snprintf(msg, sizeof msg, "%d", dim);
        if (!json_is_integer(dims) || d < 1 || d > dim)
            return bad(e, "dimensions", "'dimensions' must be an integer from 1 to the model's %s", msg);
        r->dims = (int)d;
    }
    if (trunc && !json_is_boolean(trunc)) return bad(e, "truncate", "%s", "'truncate' must be true or false");
    return parse_inputs(m, in, json_is_true(trunc), r, e);
}

static hearth_status embedder_tokenize(void *ctx, const char *text, size_t len, int truncate, int32_t **ids,
                                       size_t *n_ids, hearth_error *err) {
    return hearth_embed_tokenize(ctx, text, len, truncate, ids, n_ids, err);
}

static void put_base64(sbuf *b, const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
                     i + 2 < n ? tab[v & 63] : '='};
        sbuf_append(b, q, 4);
    }
}

/* Writes one vector, first truncated to dims and renormalized when the model normalizes. */
static void put_vector(sbuf *b, const float *v, int dims, int renormalize, int base64) {
    float buf[dims];
    double s = 0;
    for (int c = 0; c < dims; c++) s += (double)v[c] * v[c];
    float inv = renormalize && s > 0 ? (float)(1.0 / sqrt(s)) : 1.0f;
    for (int c = 0; c < dims; c++) buf[c] = v[c] * inv;
    if (base64) {
        unsigned char le[4 * (size_t)dims]; /* little-endian float32, as OpenAI's base64 */
        for (int c = 0; c < dims; c++) {
            uint32_t u;
            memcpy(&u, &buf[c], 4);
            for (int k = 0; k < 4; k++) le[4 * c + k] = (unsigned char)(u >> (8 * k));
        }
        sbuf_putc(b, '"');
        put_base64(b, le, sizeof le);
        sbuf_putc(b, '"');
        return;
    }
    sbuf_putc(b, '[');
    for (int c = 0; c < dims; c++) sbuf_printf(b, c ? ", %.9g" : "%.9g", buf[c]); /* 9 digits round-trip float32 */
    sbuf_putc(b, ']');
}

static char *reply_body(srv_embed *se, const emb_request *r, const float *v) {
    int dim = hearth_embedder_dim(se->e), renorm = r->dims < dim && hearth_embedder_normalizes(se->e);
    sbuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "{\"object\": \"list\", \"data\": [");
    for (size_t i = 0; i < r->n; i++) {
        sbuf_printf(&b, "%s{\"object\": \"embedding\", \"index\": %zu, \"embedding\": ", i ? ", " : "", i);
        put_vector(&b, v + i * dim, r->dims, renorm, r->base64);
        sbuf_putc(&b, '}');
    }
    json_t *model = json_string(r->model ? r->model : se->name);
    sbuf_puts(&b, "], \"model\": ");
    srv_json_write(&b, model);
    json_decref(model);
    sbuf_printf(&b, ", \"usage\": {\"prompt_tokens\": %zu, \"total_tokens\": %zu}}", r->tokens, r->tokens);
    if (b.oom) {
        sbuf_free(&b);
        return NULL;
    }
    return sbuf_steal(&b);
}

int srv_handle_embeddings(srv_server *s, srv_conn *c, const char *body, size_t len) {
    srv_embed *se = s->embed;
    srv_error e = {0};
    if (!se) {
        srv_fail(&e, 400, "invalid_request_error", "model", "model_not_embedding",
                 "%s is not an embedding model: start hearth serve with an embedding model, or add "
                 "--embedding-model <model>",
                 hearth_model_path(s->model));
        return srv_respond_error(c, s, &e);
    }
    json_error_t je;
    json_t *j = json_loadb(body, len, 0, &je);
    if (!j) {
        srv_fail(&e, 400, "invalid_request_error", NULL, NULL, "invalid JSON body: %s", je.text);
        return srv_respond_error(c, s, &e);
    }
    emb_request r = {0};
    float *v = NULL;
    char *out = NULL;
    pthread_mutex_lock(&se->mu); /* one embedding request at a time: the embedder is not thread-safe */
    emb_limits limits = {.vocab = hearth_vocab_size(se->m),
                         .max_tokens = hearth_embedder_max_tokens(se->e),
                         .dim = hearth_embedder_dim(se->e),
                         .tokenize = embedder_tokenize,
                         .ctx = se->e};
    int rc = emb_request_parse(j, &limits, &r, &e);
    if (!rc && !(v = malloc(r.n * (size_t)hearth_embedder_dim(se->e) * sizeof *v)))
        rc = srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
    hearth_error err = {0};
    if (!rc && hearth_embed(se->e, (const int32_t *const *)r.ids, r.lens, r.n, v, &err))
        rc = srv_fail(&e, err.status == HEARTH_ERR_INVALID ? 400 : 500,
                      err.status == HEARTH_ERR_INVALID ? "invalid_request_error" : "server_error", NULL, NULL, "%s",
                      err.message);
    pthread_mutex_unlock(&se->mu);
    for (size_t i = 0; !rc && i < r.n; i++) r.tokens += r.lens[i];
    if (!rc && !(out = reply_body(se, &r, v))) rc = srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
    int result;
    if (rc) {
        result = srv_respond_error(c, s, &e);
    } else {
        srv_log(s, SRV_LOG_INFO, "POST /v1/embeddings 200 (%zu inputs, %zu tokens)", r.n, r.tokens);
        result = srv_respond(c, s, 200, out);
    }
    free(out);
    free(v);
    emb_request_free(&r);
    json_decref(j);
    return result;
}
