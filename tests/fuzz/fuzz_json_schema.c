/* fuzz_json_schema.c: random bytes as a json schema source through grammar_compile and, when it
 * compiles, a matcher and masks (see fuzz_grammar_body.h). */
#include "fuzz_grammar_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_grammar(GRAMMAR_JSON_SCHEMA, data, size); }
