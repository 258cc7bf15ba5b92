/* ls.c: `hearth ls [--max-size 10GB] [--family F] [--json]`: the model library
 * (hearth_library_json) as a table or JSON: size on disk, parameters, quantization,
 * context, capabilities and whether each fits this machine. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *ls_usage = "hearth ls [--max-size SIZE] [--family F] [--json]";

static void human(long long n, char *out, size_t cap) {
    if (n < 0)
        snprintf(out, cap, "?");
    else if (n >= 1000000000)
        snprintf(out, cap, "%.1f GB", (double)n / 1e9);
    else
        snprintf(out, cap, "%.0f MB", (double)n / 1e6);
}

static void print_table(const json_t *arr) {
    printf("%-44s %-8s %8s %8s %-10s %7s %-17s %s\n", "NAME", "FAMILY", "SIZE", "PARAMS", "QUANT", "CONTEXT",
           "CAPABILITIES", "FITS");
    size_t i;
    const json_t *e;
    json_array_foreach(arr, i, e) {
        char size[32], caps[64] = "", params[32] = "?";
        human((long long)json_integer_value(json_object_get(e, "size_bytes")), size, sizeof size);
        const json_t *p = json_object_get(e, "parameters");
        if (json_is_integer(p)) {
            double n = (double)json_integer_value(p);
            snprintf(params, sizeof params,
                     n >= 1e9   ? "%.1fB"
                     : n >= 1e6 ? "%.0fM"
                                : "%.2fM",
                     n >= 1e9 ? n / 1e9 : n / 1e6);
        }
        size_t j;
        const json_t *c;
        json_array_foreach(json_object_get(e, "capabilities"), j, c) {
            if (j) strncat(caps, ",", sizeof caps - strlen(caps) - 1);
            strncat(caps, json_string_value(c), sizeof caps - strlen(caps) - 1);
        }
        const json_t *fits = json_object_get(e, "fits"), *err = json_object_get(e, "error");
        const char *fam = json_string_value(json_object_get(e, "family"));
        const char *q = json_string_value(json_object_get(e, "quantization"));
        printf("%-44s %-8s %8s %8s %-10s %7lld %-17s %s\n", json_string_value(json_object_get(e, "name")),
               fam ? fam : "?", size, params, q ? q : "?",
               (long long)json_integer_value(json_object_get(e, "context_length")), caps[0] ? caps : "-",
               err                   ? "error"
               : json_is_true(fits)  ? "yes"
               : json_is_false(fits) ? "NO"
                                     : "-");
        if (err) printf("    %s\n", json_string_value(err));
    }
}

int cli_ls(int argc, char **argv) {
    int as_json = 0;
    hearth_library_options o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            printf("usage: %s\n", ls_usage);
            return 0;
        }
        if (!strcmp(a, "--json"))
            as_json = 1;
        else if (!strcmp(a, "--max-size") && i + 1 < argc) {
            o.max_size_bytes = hearth_parse_size(argv[++i]);
            if (o.max_size_bytes <= 0)
                return cli_usage_error(ls_usage, "--max-size: '%s' is not a size like 10GB", argv[i]);
        } else if (!strcmp(a, "--family") && i + 1 < argc)
            o.family = argv[++i];
        else
            return cli_usage_error(ls_usage, "%s: unexpected argument", a);
    }
    char *j = hearth_library_json(&o);
    if (!j) {
        fprintf(stderr, "hearth: ls: out of memory\n");
        return 1;
    }
    if (as_json) {
        printf("%s\n", j);
    } else {
        json_t *arr = json_loads(j, 0, NULL);
        if (!json_array_size(arr))
            printf("no models found (searched the HF cache, $HEARTH_MODELS and $HEARTH_CACHE/models)\n");
        else
            print_table(arr);
        json_decref(arr);
    }
    hearth_free(j);
    return 0;
}
