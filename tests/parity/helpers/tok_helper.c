/* tok_helper.c: drives the hearth tokenizer for tests/parity/test_tokenizer_parity.py.
 * Usage: tok_helper <model folder with tokenizer.json | file.gguf> < requests.jsonl
 * Each request line is {"text": s, "add_special": 0|1} (encode, then decode and stream
 * the ids back) or {"decode": [ids], "skip_special": 0|1}; one JSON result line each. */
#include "io/gguf.h"
#include "tok/tokenizer.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *stream_text(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip) {
    tok_stream *s = tok_stream_new(t, skip);
    char *acc = calloc(1, 1);
    size_t len = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *c = i < n ? tok_stream_push(s, ids[i]) : tok_stream_finish(s);
        size_t cl = strlen(c);
        acc = realloc(acc, len + cl + 1);
        memcpy(acc + len, c, cl + 1);
        len += cl;
    }
    tok_stream_free(s);
    json_t *r = json_stringn(acc, len);
    free(acc);
    return r;
}

static int flag(json_t *v) { return json_is_true(v) || (json_is_integer(v) && json_integer_value(v) != 0); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: tok_helper <model dir | file.gguf>\n"); return 2; }
    hearth_error err = {0};
    tok_tokenizer *t = NULL;
    gguf_file g;
    int is_gguf = strlen(argv[1]) > 5 && !strcmp(argv[1] + strlen(argv[1]) - 5, ".gguf");
    hearth_status st;
    if (is_gguf) {
        st = gguf_open(argv[1], &g, &err);
        if (st == HEARTH_OK) st = tok_load_gguf(&g, &t, &err);
    } else {
        st = tok_load_hf_dir(argv[1], &t, &err);
    }
    if (st != HEARTH_OK) { fprintf(stderr, "load failed: %s\n", err.message); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *req = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je), *res = json_object();
        json_t *text = json_object_get(req, "text"), *dec = json_object_get(req, "decode");
        if (json_is_string(text)) {
            int32_t *ids = NULL;
            size_t nid = 0;
            int add = flag(json_object_get(req, "add_special"));
            if (tok_encode(t, json_string_value(text), json_string_length(text), add, &ids, &nid, &err) != HEARTH_OK) {
                json_object_set_new(res, "error", json_string(err.message));
            } else {
                json_t *a = json_array();
                for (size_t i = 0; i < nid; i++) json_array_append_new(a, json_integer(ids[i]));
                json_object_set_new(res, "ids", a);
                char *d = NULL;
                if (tok_decode(t, ids, nid, 0, &d, &err) == HEARTH_OK) json_object_set_new(res, "decoded", json_string(d));
                free(d);
                json_object_set_new(res, "streamed", stream_text(t, ids, nid, 0));
            }
            free(ids);
        } else if (json_is_array(dec)) {
            size_t nd = json_array_size(dec);
            int32_t *ids = malloc((nd + 1) * sizeof *ids);
            for (size_t i = 0; i < nd; i++) ids[i] = (int32_t)json_integer_value(json_array_get(dec, i));
            int skip = flag(json_object_get(req, "skip_special"));
            char *d = NULL;
            if (tok_decode(t, ids, nd, skip, &d, &err) == HEARTH_OK) json_object_set_new(res, "decoded", json_string(d));
            else json_object_set_new(res, "error", json_string(err.message));
            free(d);
            json_object_set_new(res, "streamed", stream_text(t, ids, nd, skip));
            free(ids);
        } else {
            json_object_set_new(res, "error", json_string("bad request"));
        }
        char *out = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        printf("%s\n", out);
        free(out);
        json_decref(res);
        json_decref(req);
    }
    free(line);
    tok_free(t);
    if (is_gguf) gguf_close(&g);
    return 0;
}
