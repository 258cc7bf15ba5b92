/* json_text.h: JSON of model folders, read as Python's json module reads it. Jansson refuses
 * integers beyond int64 ("too big integer"), which transformers writes into
 * tokenizer_config.json (model_max_length = int(1e30) when a model has no limit); Python
 * reads them as big integers. Here such a literal becomes a real number (1e30), every
 * other value keeps its type. */
#ifndef HEARTH_IO_JSON_TEXT_H
#define HEARTH_IO_JSON_TEXT_H
#include <jansson.h>
#include <stddef.h>

/* json_loadb with the same flags; on an integer too big for int64 the text is read again
 * with those literals as reals. NULL and je filled on any other error. */
json_t *json_loadb_big_ints(const char *text, size_t len, size_t flags, json_error_t *je);

#endif
