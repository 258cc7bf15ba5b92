/* fuzz_tool_call.c: random bytes as a tool-call constraint document (gram_tool.c) through
 * grammar_compile and, when it compiles, a matcher and masks (see fuzz_grammar_body.h). */
#include "fuzz_grammar_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_grammar(GRAMMAR_TOOL_CALL, data, size); }
