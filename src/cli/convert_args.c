/* convert_args.c: hearth convert's --candidate-bits and --plan parsers (convert_args.h).
 * Bounds-checked on any input; fuzzed by tests/fuzz/fuzz_convert_args.c. */
#include "cli/convert_args.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mlx_width(long b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static int mlx_group(long g) { return g == 32 || g == 64 || g == 128; }

/* a whole decimal number of at most 4 digits at s (no sign, no space): its value, *end past it; -1 else */
static long small_number(const char *s, const char **end) {
    long v = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9' && p - s < 4) v = v * 10 + (*p++ - '0');
    *end = p;
    return p == s || (*p >= '0' && *p <= '9') ? -1 : v;
}

int convert_parse_candidates(const char *s, int group, mixed_candidate *out, int cap) {
    int n = 0;
    for (;;) {
        const char *end;
        long b = small_number(s, &end), g = group;
        if (*end == ':') g = small_number(end + 1, &end);
        if (!mlx_width(b) || !mlx_group(g) || n == cap ||
            (n && b + 32.0 / g <= out[n - 1].bits + 32.0 / out[n - 1].group))
            return 0;
        out[n++] = (mixed_candidate){(int)b, (int)g};
        if (!*end) return n;
        if (*end != ',') return 0;
        s = end + 1;
    }
}

/* {"bits", "group_size", "mode"} of the section itself (top) or of one module: widths MLX
 * affine takes, "affine" the only mode; a module's object names nothing else */
static int check_entry(const char *path, const char *what, json_t *o, int top, char *msg, size_t cap) {
    json_t *bits = json_object_get(o, "bits"), *group = json_object_get(o, "group_size"),
           *mode = json_object_get(o, "mode");
    if (!json_is_integer(bits) || !mlx_width((long)json_integer_value(bits))) {
        snprintf(msg, cap, "%s: %s: \"bits\" must be 2, 3, 4, 5, 6 or 8", path, what);
        return 1;
    }
    if (group && (!json_is_integer(group) || !mlx_group((long)json_integer_value(group)))) {
        snprintf(msg, cap, "%s: %s: \"group_size\" must be 32, 64 or 128", path, what);
        return 1;
    }
    if (mode && (!json_is_string(mode) || strcmp(json_string_value(mode), "affine"))) {
        snprintf(msg, cap, "%s: %s: \"mode\" must be \"affine\" (convert writes MLX affine)", path, what);
        return 1;
    }
    if (!top && json_object_size(o) != 1u + (group != NULL) + (mode != NULL)) {
        snprintf(msg, cap, "%s: %s: a module takes \"bits\", \"group_size\" and \"mode\" only", path, what);
        return 1;
    }
    return 0;
}

int convert_parse_plan(const char *path, const char *text, size_t len, json_t **out, char *msg, size_t cap) {
    json_error_t je;
    *out = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(msg, cap, "%s: line %d: %s", path, je.line, je.text);
        return 1;
    }
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = root;
    if (!json_is_object(q) || !json_object_get(q, "bits")) {
        snprintf(msg, cap, "%s: no quantization section with \"bits\" (a config.json that convert -q wrote)", path);
        json_decref(root);
        return 1;
    }
    int bad = check_entry(path, "the quantization section", q, 1, msg, cap);
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (bad || !strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode")) continue;
        if (json_is_false(v)) continue;
        char what[160];
        snprintf(what, sizeof what, "module '%.100s'", key);
        if (!json_is_object(v)) {
            snprintf(msg, cap, "%s: %s: expected {\"bits\": N, \"group_size\": G} or false", path, what);
            bad = 1;
        } else
            bad = check_entry(path, what, v, 0, msg, cap);
    }
    if (!bad) *out = json_incref(q);
    json_decref(root);
    return bad;
}
