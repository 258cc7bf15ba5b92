/* convert_args.h: the parsers of hearth convert's --candidate-bits list and --plan file,
 * apart from the verb so that a fuzz target (tests/fuzz/fuzz_convert_args.c) reaches them.
 * They print nothing but through their messages; they never read a model. */
#ifndef HEARTH_CLI_CONVERT_ARGS_H
#define HEARTH_CLI_CONVERT_ARGS_H
#include "cli/cli.h"
#include <jansson.h>
#include <stddef.h>

/* "3,4,4:32,5" -> MLX widths (2, 3, 4, 5, 6, 8), each with its group size (32, 64 or 128
 * after a colon; else `group`), strictly ascending in bits per weight with 16-bit scales
 * and biases (bits + 32 / group); at most cap of them. The count, or 0 for a bad list. */
int convert_parse_candidates(const char *s, int group, mixed_candidate *out, int cap);

/* A --plan file's text (len bytes; path names it in messages): its "quantization" object,
 * or the whole object when it has none, as config.json records one: "bits" (required) and
 * "group_size" (optional) the widths of modules it does not name, "mode" "affine"; each
 * other key a module path with {"bits", optional "group_size", optional "mode"} or false
 * (kept float). *out: that section (a new reference: json_decref it). 0, or 1 after
 * putting "<path>: <problem>" in msg (cap bytes). */
int convert_parse_plan(const char *path, const char *text, size_t len, json_t **out, char *msg, size_t cap);
#endif
