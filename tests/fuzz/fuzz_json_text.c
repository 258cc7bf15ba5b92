/* fuzz_json_text.c: libFuzzer target for io/json_text.c (model folders' JSON with integers
 * beyond int64 read as reals). Must never crash or read out of bounds; text that jansson
 * reads as it is must give the same value, and no input may turn from an error other than
 * a numeric overflow into a value. */
#include "io/json_text.h"
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t je, je2;
    json_t *plain = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    json_t *wide = json_loadb_big_ints((const char *)data, size, JSON_DECODE_ANY, &je2);
    if (plain && (!wide || !json_equal(plain, wide))) abort();
    if (!plain && wide && json_error_code(&je) != json_error_numeric_overflow) abort();
    json_decref(plain);
    json_decref(wide);
    return 0;
}
