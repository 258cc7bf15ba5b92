/* toolparse.h: parses the tool-call text spans that textstate.h cut out of the model
 * output into OpenAI tool_calls items, as mlx-lm's tool_parsers/ and server.py's
 * ToolCallFormatter do (contract §4 "tool_calls item"). No HTTP, no state: one span
 * in, zero or more calls out. Text that does not parse is reported, never fatal. */
#ifndef HEARTH_SERVER_TOOLPARSE_H
#define HEARTH_SERVER_TOOLPARSE_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include "hearth.h"
#include "server/textstate.h"

/* Parses one tool text of the given format. On success appends one object per call
 * to `calls` (a JSON array): {"name": str, "arguments": <any JSON value>} plus "id"
 * when the model supplied one (mistral). `tools` is the request's tools array (or
 * NULL); qwen3_coder uses it to type parameter values. On failure returns
 * HEARTH_ERR_FORMAT with the reason, and `calls` is unchanged. */
hearth_status tp_parse(ts_tool_type type, const char *text, size_t len, const json_t *tools,
                       json_t *calls, hearth_error *err);

/* Called for each tool text that fails to parse (upstream logs a warning and drops
 * it). May be NULL. */
typedef void (*tp_warn_fn)(void *ud, const char *message);

/* The ToolCallFormatter: parses each text, drops failures (warn), and appends to
 * `out` (a JSON array) per call
 *   {"function": {"name", "arguments": <JSON text, Python json.dumps style,
 *    ensure_ascii=False>, ...other keys the model wrote}, "type": "function",
 *    "id": <model id or a random uuid4>}
 * and, when streaming, "index": *next_index (incremented; keep one counter per
 * response so indices run 0,1,2,... across chunks). Returns the number appended. */
size_t tp_format_calls(ts_tool_type type, const char *const *texts, const size_t *lens,
                       size_t n, const json_t *tools, bool streaming, int *next_index,
                       json_t *out, tp_warn_fn warn, void *ud);

#endif
