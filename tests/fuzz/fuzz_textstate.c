/* fuzz_textstate.c: random chunks, stop strings and tool formats through the text
 * state machine and every tool parser. Input layout: byte 0 picks the tool format,
 * byte 1 the think markers and start state, then NUL-separated fields: up to two stop
 * strings, then chunks whose first byte is the chunk's finish (last chunk only). The
 * first-call watcher (ts_call_watch) is fed the same chunks. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/textstate.h"
#include "server/toolparse.h"

static bool has_think(void *ud, const char *piece) {
    return ud && (!strcmp(piece, "<think>") || !strcmp(piece, "</think>"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    static const char *const FORMATS[] = {NULL, "json_tools", "qwen3_coder", "mistral", "pythonic",
                                          "llama3_json", "gemma4", "kimi_k2", "minicpm5"};
    ts_config cfg;
    hearth_error err = {0};
    if (ts_infer(&cfg, NULL, FORMATS[data[0] % 9], has_think, (data[1] & 1) ? &cfg : NULL, false,
                 &err) != HEARTH_OK)
        return 0;
    char *copy = malloc(size - 1);
    memcpy(copy, data + 2, size - 2);
    copy[size - 2] = 0;
    size_t n = size - 2, pos = 0;
    const char *stops[2];
    size_t ns = 0;
    while (ns < 2 && pos < n) {
        stops[ns++] = copy + pos;
        pos += strlen(copy + pos) + 1;
    }
    ts_parser *p = ts_new(&cfg, stops, ns, (data[1] & 2) != 0, &err);
    json_t *tools = json_loads("[{\"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
                               "{\"n\": {\"type\": \"integer\"}, \"x\": {\"type\": \"number\"}, "
                               "\"o\": {\"type\": \"object\"}, \"b\": {\"type\": \"bool\"}, "
                               "\"e\": {\"enum\": [1, 2.5, \"a\", null, [0]]}, "
                               "\"a\": {\"anyOf\": [{\"type\": \"integer\"}, {\"type\": [\"null\", \"array\"]}]}}}}}]",
                               0, NULL);
    json_t *out = json_array();
    int index = 0;
    ts_call_watch w;
    bool watch = ts_call_watch_init(&w, &cfg);
    int ended = 0;
    while (p && pos < n) {
        size_t len = strlen(copy + pos);
        long k = watch ? ts_call_watch_feed(&w, copy + pos, len) : -1;
        if (k >= 0 && (ended++ || k < 1 || (size_t)k > len)) abort(); /* once, inside the chunk */
        bool last = pos + len + 1 >= n;
        ts_finish fin = last ? (ts_finish)((len ? (uint8_t)copy[pos] : 0) % 3) : TS_FINISH_NONE;
        ts_feed(p, copy + pos, len, fin, &err);
        pos += len + 1;
        if (!ts_in_tool(p) && ts_has_pending(p)) {
            ts_pending_view v;
            ts_pending(p, &v);
            tp_format_calls(cfg.tool, v.tool_texts, v.tool_lens, v.n_tools, tools, true, &index,
                            out, NULL, NULL);
            ts_clear_pending(p);
        }
    }
    if (p) {
        ts_end(p);
        ts_pending_view v;
        ts_pending(p, &v);
        tp_format_calls(cfg.tool, v.tool_texts, v.tool_lens, v.n_tools, tools, false, &index, out,
                        NULL, NULL);
        (void)ts_finish_reason(p, TS_FINISH_STOP);
        ts_free(p);
    }
    /* Every parser on the raw bytes as a single tool text, too. */
    for (int t = TS_TOOL_JSON_TOOLS; t <= TS_TOOL_MINICPM5; t++) { /* the parsed formats (toolparse*.c) */
        if (t > TS_TOOL_LLAMA3_JSON && t != TS_TOOL_GEMMA4 && t != TS_TOOL_MINICPM5) continue;
        json_t *calls = json_array();
        tp_parse((ts_tool_type)t, (const char *)data + 2, size - 2, tools, calls, &err);
        json_decref(calls);
    }
    json_decref(out);
    json_decref(tools);
    free(copy);
    return 0;
}
