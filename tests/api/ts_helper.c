/* ts_helper.c: replays tests/api/parser_cases.json through hearth's textstate and
 * toolparse (the same per-token loop the server runs) and prints the results as JSON
 * for tests/api/test_parsers.py to compare with mlx-lm's. Test tool only.
 * Build: cc -Iinclude -Isrc tests/api/ts_helper.c <libhearth.a> $(pkg-config ...) */
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "server/textstate.h"
#include "server/toolparse.h"

static bool vocab_has(void *ud, const char *piece) {
    size_t i;
    json_t *v;
    json_array_foreach((json_t *)ud, i, v) if (!strcmp(json_string_value(v), piece)) return true;
    return false;
}

static bool think_has(void *ud, const char *piece) {
    json_t *think = ud;
    const char *start = json_string_value(json_array_get(think, 0)), *end = json_string_value(json_array_get(think, 1));
    /* a multi-token start marker (Gemma 4's <|channel>thought) has its first token in the vocab */
    return json_is_array(think) && (!strcmp(piece, end) || !strncmp(start, piece, strlen(piece)));
}

/* Random uuid4 ids are replaced like the Python side does. */
static json_t *scrub(json_t *calls) {
    regex_t re;
    regcomp(&re, "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
            REG_EXTENDED | REG_NOSUB);
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *id = json_object_get(c, "id");
        if (json_is_string(id) && regexec(&re, json_string_value(id), 0, NULL, 0) == 0)
            json_object_set_new(c, "id", json_string("<uuid>"));
    }
    regfree(&re);
    return calls;
}

static json_t *event(ts_parser *p, const ts_config *cfg, const json_t *tools, bool streaming,
                     int *index) {
    ts_pending_view v;
    ts_pending(p, &v);
    json_t *calls = json_array();
    tp_format_calls(cfg->tool, v.tool_texts, v.tool_lens, v.n_tools, tools, streaming, index,
                    calls, NULL, NULL);
    json_t *e = json_pack("{s:s%,s:s%,s:o}", "content", v.content, v.content_len, "reasoning",
                          v.reasoning, v.reasoning_len, "tool_calls", scrub(calls));
    ts_clear_pending(p);
    return e;
}

static json_t *run(json_t *c, bool streaming) {
    ts_config cfg;
    json_t *think = json_object_get(c, "think");
    const char *tool = json_string_value(json_object_get(c, "tool"));
    hearth_error err = {0};
    if (ts_infer(&cfg, NULL, tool, think_has, think, false, &err) != HEARTH_OK) {
        fprintf(stderr, "ts_infer: %s\n", err.message);
        exit(2);
    }
    json_t *stops = json_object_get(c, "stops");
    const char *sv[16];
    size_t ns = 0;
    for (; ns < json_array_size(stops) && ns < 16; ns++)
        sv[ns] = json_string_value(json_array_get(stops, ns));
    const char *initial = json_string_value(json_object_get(c, "initial"));
    ts_parser *p = ts_new(&cfg, sv, ns, initial && !strcmp(initial, "reasoning"), &err);
    json_t *tools = json_object_get(c, "tools");
    const char *fin = json_string_value(json_object_get(c, "finish"));
    ts_finish finish = !strcmp(fin, "stop") ? TS_FINISH_STOP : TS_FINISH_LENGTH;
    json_t *chunks = json_object_get(c, "chunks"), *events = json_array();
    int index = 0;
    for (size_t i = 0; i < json_array_size(chunks); i++) {
        json_t *ch = json_array_get(chunks, i);
        bool last = i + 1 == json_array_size(chunks);
        ts_feed(p, json_string_value(ch), json_string_length(ch), last ? finish : TS_FINISH_NONE,
                &err);
        if (streaming && !ts_in_tool(p) && ts_has_pending(p))
            json_array_append_new(events, event(p, &cfg, tools, streaming, &index));
    }
    ts_end(p);
    json_t *final = event(p, &cfg, tools, streaming, &index);
    json_object_set_new(final, "finish_reason", json_string(ts_finish_reason(p, finish)));
    ts_free(p);
    if (!streaming) {
        json_decref(events);
        return final;
    }
    json_array_append_new(events, final);
    return events;
}

int main(int argc, char **argv) {
    json_error_t je;
    json_t *doc = json_load_file(argc > 1 ? argv[1] : "tests/api/parser_cases.json", 0, &je);
    if (!doc) {
        fprintf(stderr, "ts_helper: %s\n", je.text);
        return 2;
    }
    json_t *out = json_object(), *cases = json_object(), *inf = json_object();
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        json_t *r = json_object();
        json_object_set_new(r, "stream", run(c, true));
        json_object_set_new(r, "full", run(c, false));
        json_object_set(cases, json_string_value(json_object_get(c, "name")), r);
        json_decref(r);
    }
    json_array_foreach(json_object_get(doc, "inference"), i, c) {
        ts_config cfg;
        hearth_error err = {0};
        ts_infer(&cfg, json_string_value(json_object_get(c, "template")), NULL, vocab_has,
                 json_object_get(c, "vocab"), false, &err);
        json_t *think = cfg.think_start[0] ? json_pack("[ss]", cfg.think_start, cfg.think_end)
                                           : json_null();
        json_object_set_new(inf, json_string_value(json_object_get(c, "name")),
                            json_pack("{s:o,s:o}", "tool",
                                      cfg.tool_name ? json_string(cfg.tool_name) : json_null(),
                                      "think", think));
    }
    json_object_set_new(out, "cases", cases);
    json_object_set_new(out, "inference", inf);
    char *s = json_dumps(out, JSON_INDENT(1));
    puts(s);
    free(s);
    json_decref(out);
    json_decref(doc);
    return 0;
}
