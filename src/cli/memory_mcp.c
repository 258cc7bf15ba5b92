/* memory_mcp.c: `hearth memory mcp`: the read-only memory tools over the Model Context
 * Protocol on stdio: newline-delimited JSON-RPC 2.0 (initialize, tools/list, tools/call,
 * ping), so coding agents (pi, Claude Code, Codex) can read the vault. Logs nothing on
 * stdout but responses; the tools come from hearth_memory_tools_json. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The MCP revision answered when the client does not ask for one. */
#define MCP_PROTOCOL "2025-06-18"

static void reply(json_t *id, json_t *result, int code, const char *message) {
    json_t *r = json_pack("{s:s, s:O}", "jsonrpc", "2.0", "id", id ? id : json_null());
    if (result)
        json_object_set_new(r, "result", result);
    else
        json_object_set_new(r, "error", json_pack("{s:i, s:s}", "code", code, "message", message));
    char *text = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    if (text) {
        fputs(text, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    free(text);
}

static json_t *tools_call(hearth_memory *m, json_t *params) {
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    char *argtext = args ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY) : NULL, *result = NULL;
    hearth_error err = {0};
    hearth_status st = name ? hearth_memory_call(m, name, argtext, &result, &err) : HEARTH_ERR_INVALID;
    if (!name) snprintf(err.message, sizeof err.message, "tools/call needs params.name");
    free(argtext);
    /* a tool's own failure is a result with isError (the model reads it), not a protocol error */
    json_t *out = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", st ? err.message : result,
                            "isError", st != HEARTH_OK);
    hearth_free(result);
    return out;
}

static void handle(hearth_memory *m, json_t *req) {
    json_t *id = json_object_get(req, "id");
    const char *method = json_string_value(json_object_get(req, "method"));
    json_t *params = json_object_get(req, "params");
    if (!method) {
        if (id) reply(id, NULL, -32600, "invalid request: no method");
        return;
    }
    if (!id) return; /* a notification (notifications/initialized, cancelled): no answer */
    if (!strcmp(method, "initialize")) {
        const char *v = json_string_value(json_object_get(params, "protocolVersion"));
        reply(id,
              json_pack("{s:s, s:{s:{}}, s:{s:s, s:s}, s:s}", "protocolVersion", v ? v : MCP_PROTOCOL, "capabilities",
                        "tools", "serverInfo", "name", "hearth-memory", "version", HEARTH_VERSION, "instructions",
                        "Read-only tools over the user's personal memory (a Markdown wiki): search first, then "
                        "read, toc or section the articles it names."),
              0, NULL);
    } else if (!strcmp(method, "ping"))
        reply(id, json_object(), 0, NULL);
    else if (!strcmp(method, "tools/list"))
        reply(id, json_pack("{s:o}", "tools", json_loads(hearth_memory_tools_json(), 0, NULL)), 0, NULL);
    else if (!strcmp(method, "tools/call"))
        reply(id, tools_call(m, params), 0, NULL);
    else
        reply(id, NULL, -32601, "method not found");
}

int cli_memory_mcp(hearth_memory *m) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (n == 1 && line[0] == '\n') continue;
        json_error_t je;
        json_t *req = json_loadb(line, (size_t)n, 0, &je);
        if (!json_is_object(req))
            reply(NULL, NULL, req ? -32600 : -32700, req ? "invalid request: not an object" : "parse error");
        else
            handle(m, req);
        json_decref(req);
    }
    free(line);
    return 0;
}
