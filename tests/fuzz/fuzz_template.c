/* fuzz_template.c: libFuzzer target for the chat-template interpreter: arbitrary
 * bytes as template source, rendered against a fixed chat context (messages with
 * tool calls, tools, kwargs). Must never crash, hang or leak, whatever it renders. */
#include "tok/template.h"
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00fc\\u65e5 <tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>r</think>ok\", \"reasoning_content\": \"r\","
    "  \"tool_calls\": [{\"id\": \"abc123456\", \"type\": \"function\", \"function\": {\"name\": \"f\","
    "  \"arguments\": {\"a\": 1, \"b\": [1.5, null, true], \"c\": \"x\"}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\", \"tool_call_id\": \"abc123456\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false, \"n\": 3, \"f\": 0.5, \"none\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *ctx;
    if (!ctx) ctx = json_loads(CONTEXT, 0, NULL);
    char *out = NULL;
    size_t len = 0;
    hearth_error err = {0};
    if (tpl_render_len((const char *)data, size, ctx, &out, &len, &err) == HEARTH_OK) free(out);
    return 0;
}
