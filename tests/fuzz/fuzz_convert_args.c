/* fuzz_convert_args.c: hearth convert's --candidate-bits and --plan parsers
 * (src/cli/convert_args.c, compiled in here: the CLI is not part of the library) on
 * arbitrary bytes. The first byte picks the parser. A list it accepts must hold MLX widths
 * and group sizes ascending in bits per weight, within the cap; a plan it accepts must
 * give every module an MLX width and group; a refusal must come with a message naming the
 * file. Nothing may crash, hang or leak. */
#include "../../src/cli/convert_args.c"
#include <stdint.h>

static void candidates(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return;
    memcpy(s, data, size);
    s[size] = 0;
    mixed_candidate c[8];
    int n = convert_parse_candidates(s, 64, c, 8);
    if (n < 0 || n > 8) abort();
    for (int i = 0; i < n; i++) {
        if (!mlx_width(c[i].bits) || !mlx_group(c[i].group)) abort();
        if (i && c[i].bits + 32.0 / c[i].group <= c[i - 1].bits + 32.0 / c[i - 1].group) abort();
    }
    free(s);
}

static void plan(const uint8_t *data, size_t size) {
    json_t *q = NULL;
    char msg[512] = "";
    if (convert_parse_plan("plan.json", (const char *)data, size, &q, msg, sizeof msg)) {
        if (q || strncmp(msg, "plan.json: ", 11)) abort();
        return;
    }
    if (!json_is_object(q) || !mlx_width((long)json_integer_value(json_object_get(q, "bits")))) abort();
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (!json_is_object(v)) continue;
        json_t *g = json_object_get(v, "group_size");
        if (!mlx_width((long)json_integer_value(json_object_get(v, "bits"))) ||
            (g && !mlx_group((long)json_integer_value(g))))
            abort();
    }
    json_decref(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    if (data[0] & 1)
        plan(data + 1, size - 1);
    else
        candidates(data + 1, size - 1);
    return 0;
}
