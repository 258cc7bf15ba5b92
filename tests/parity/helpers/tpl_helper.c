/* tpl_helper.c: batch driver for the template parity test. Reads JSON lines
 * {"template": str, "context": object, "chat": bool} on stdin ("chat": first apply
 * tpl_chat_prepare_messages to context.messages) and writes one JSON line per case:
 * {"ok": true, "out": str} or {"ok": false, "status": str, "error": str}. */
#include "tok/template.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t jerr;
        json_t *req = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &jerr), *resp = json_object();
        const char *src = req ? json_string_value(json_object_get(req, "template")) : NULL;
        if (!src) {
            json_object_set_new(resp, "ok", json_false());
            json_object_set_new(resp, "status", json_string("bad_request"));
            json_object_set_new(resp, "error", json_string(req ? "missing template" : jerr.text));
        } else {
            size_t len = json_string_length(json_object_get(req, "template"));
            char *out = NULL;
            size_t out_len = 0;
            hearth_error err = {0};
            hearth_status st = HEARTH_OK;
            json_t *ctx = json_object_get(req, "context");
            if (json_is_true(json_object_get(req, "chat")) && json_object_get(ctx, "messages"))
                st = tpl_chat_prepare_messages(json_object_get(ctx, "messages"), &err);
            if (st == HEARTH_OK) st = tpl_render_len(src, len, ctx, &out, &out_len, &err);
            if (st == HEARTH_OK) {
                json_t *s = json_stringn(out, out_len);
                json_object_set_new(resp, "ok", s ? json_true() : json_false());
                if (s) json_object_set_new(resp, "out", s);
                else json_object_set_new(resp, "error", json_string("output is not valid UTF-8"));
            } else {
                json_object_set_new(resp, "ok", json_false());
                json_object_set_new(resp, "status", json_string(hearth_status_name(st)));
                json_object_set_new(resp, "error", json_string(err.message));
            }
            free(out);
        }
        char *text = json_dumps(resp, JSON_COMPACT);
        printf("%s\n", text);
        fflush(stdout);
        free(text);
        json_decref(resp);
        json_decref(req);
    }
    free(line);
    return 0;
}
