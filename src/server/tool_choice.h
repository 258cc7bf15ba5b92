/* tool_choice.h: the tool_choice rules every API shares once it has read its own shape
 * (OpenAI chat, Responses, Anthropic), and the constraint that forces one tool call in
 * the model family's tool-call syntax. No HTTP, no engine: request data in, a
 * HEARTH_CONSTRAINT_TOOL_CALL document out. */
#ifndef HEARTH_SERVER_TOOL_CHOICE_H
#define HEARTH_SERVER_TOOL_CHOICE_H
#include "server/server.h"
#include "server/textstate.h"

typedef enum {
    SRV_TOOLS_AUTO,     /* the model decides (unchanged behaviour) */
    SRV_TOOLS_NONE,     /* the tools are left out of the prompt */
    SRV_TOOLS_REQUIRED, /* one call to any of the tools */
    SRV_TOOLS_NAMED,    /* one call to the named tool */
} srv_tools_mode;

/* Applies a tool_choice to r (r->tools already parsed): NONE drops the tools; REQUIRED
 * needs tools; NAMED needs `name` among them. 0, or -1 with a 400 naming `field`. */
int srv_set_tool_choice(srv_request *r, srv_tools_mode mode, const char *name, const char *field, srv_error *e);

/* OpenAI chat's tool_choice: "auto", "none", "required" or {"type": "function",
 * "function": {"name"}}. 0, or -1 with a 400 naming tool_choice. */
int srv_parse_tool_choice(const json_t *root, srv_request *r, srv_error *e);

/* OpenAI's parallel_tool_calls (chat and Responses): true (the default) or false, which
 * sets r->single_tool_call. 0, or -1 with a 400 naming the field. */
int srv_parse_parallel_tool_calls(const json_t *root, srv_request *r, srv_error *e);

/* For a request that forces a call (r->force_tool): the constraint document (caller
 * frees) for one call (r->single_tool_call) or one or more in the tool format of
 * `forced` (srv_server.forced_text_config).
 * 0, or -1 with a 400: a format with no forced-call syntax yet, a tool schema that does
 * not compile (naming tools[i]), or another output constraint in the same request. */
int srv_tool_constraint(const srv_request *r, const ts_config *forced, char **doc, srv_error *e);

#endif
