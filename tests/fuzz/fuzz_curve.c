/* fuzz_curve.c: the sampling lab's `curve` and `hlg` fields (src/server/lab_request.c) on
 * arbitrary bytes, and every curve they accept evaluated across the log-probability range
 * (src/engine/sampler_lab.c): never NaN, never going down, -inf kept. Must never crash,
 * leak or abort. */
#include "engine/sampler.h"
#include "server/server.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!root) return 0;
    srv_defaults d = {.hlg = {.width = 4, .shoulder = 4, .toe = 6, .pivot_offset = 6}};
    srv_request r = {0};
    srv_error e = {0};
    if (json_is_object(root) && !srv_parse_lab(root, &d, &r, &e)) {
        if (r.curve.n_points) {
            double m[HEARTH_CURVE_MAX_POINTS], prev = -INFINITY;
            sampler_curve_tangents(&r.curve, m);
            for (double l = -60; l <= 1; l += 0.125) {
                double y = sampler_curve_eval(&r.curve, m, l);
                /* rounding may dip an ulp or so on a flat piece */
                if (isnan(y) || y < prev - 1e-9 * (1 + fabs(prev))) abort();
                prev = y;
            }
            if (sampler_curve_eval(&r.curve, m, -INFINITY) != -INFINITY) abort();
        }
        if (r.hlg.enabled) {
            double prev = -INFINITY;
            for (double z = -60; z <= 20; z += 0.125) {
                double y = sampler_hlg_eval(&r.hlg, r.hlg.gain > 0 ? r.hlg.gain : 1, z);
                if (isnan(y) || y < prev) abort();
                prev = y;
            }
        }
    } else {
        free(srv_error_body(&e));
    }
    json_decref(root);
    return 0;
}
