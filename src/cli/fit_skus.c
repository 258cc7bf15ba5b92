/* fit_skus.c: the table of `hearth fit --skus` (hearth_fit_skus) and the evals row of
 * `hearth fit --record`; fit.c owns the flags and the single-machine report. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>

void cli_fit_print_skus(const char *report_json) {
    json_t *r = json_loads(report_json, 0, NULL);
    printf("model: %s, context %lld, sequences %lld\n", json_string_value(json_object_get(r, "model")),
           (long long)json_integer_value(json_object_get(r, "context_length")),
           (long long)json_integer_value(json_object_get(r, "max_sequences")));
    printf("%-42s %4s %9s %9s %12s %5s %11s %10s\n", "MACHINE", "KIND", "MEM GB", "GB/s", "PREDICTED GB", "FITS",
           "MAX CONTEXT", "DECODE t/s");
    size_t i;
    const json_t *s;
    json_array_foreach(json_object_get(r, "skus"), i, s) {
        printf("%-42.42s %4s %9.1f %9.1f %12.3f %5s %11lld %10.1f\n", json_string_value(json_object_get(s, "name")),
               json_string_value(json_object_get(s, "kind")),
               (double)json_integer_value(json_object_get(s, "memory_bytes")) / 1e9,
               json_number_value(json_object_get(s, "bandwidth_gbs")),
               (double)json_integer_value(json_object_get(s, "predicted_bytes")) / 1e9,
               json_is_true(json_object_get(s, "fits")) ? "yes" : "NO",
               (long long)json_integer_value(json_object_get(s, "max_context_that_fits")),
               json_number_value(json_object_get(s, "decode_tok_s")));
    }
    printf("\nAll rows are predictions: %s\n", json_string_value(json_object_get(r, "prediction")));
    json_decref(r);
}

int cli_fit_record(const char *report_json) {
    json_t *r = json_loads(report_json, 0, NULL);
    hearth_eval_row row = {.kind = "fit",
                           .model = json_string_value(json_object_get(r, "model")),
                           .context = (int)json_integer_value(json_object_get(r, "context_length")),
                           .predicted_peak_bytes =
                               (long long)json_integer_value(json_object_get(r, "predicted_peak_bytes")),
                           .measured_peak_bytes = -1,
                           .tok_s = -1,
                           .details_json = report_json};
    hearth_error err = {0};
    int rc = row.model && hearth_evals_record(&row, &err) ? cli_fail(&err) : 0;
    json_decref(r);
    return rc;
}
