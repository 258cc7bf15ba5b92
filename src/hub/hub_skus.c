/* hub_skus.c: hearth_fit_skus: the fit report of hearth_fit carried over to the
 * machines of data/skus.json (GPUs by device memory and bandwidth, CPU boxes by RAM and
 * bandwidth). Pure arithmetic on one hearth_fit report: every number it gives for a
 * machine other than this one is a prediction, and the JSON says so. */
#include "base/err.h"
#include "hub/hub.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* KV positions come in blocks of 16 (hearth_engine_options.kv_blocks), so a context
 * that fits is rounded down to a whole block. */
#define SKU_KV_BLOCK 16

static const char *sku_note =
    "predicted, not measured. GPU rows: hearth fit --device cuda --sku for that GPU: weights as uploaded + device KV "
    "pool + scratch + the CUDA context and cuBLAS (data/cuda_runtime.json, by compute capability), with the largest "
    "context from the same sizing. CPU rows: predicted_peak_bytes (the process's resident "
    "high-water mark) against total RAM. CPU rows' max_context_that_fits assumes the KV pool grows linearly with the "
    "context "
    "and everything else stays. decode tok/s: bytes read per token over the spec-sheet bandwidth, a roofline (an upper "
    "bound).";

static long long jint(const json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }

/* A GPU row: the --device cuda prediction for that GPU (its compute capability's CUDA
 * runtime overhead, its memory and bandwidth), from the same sizing the engine uses. */
static json_t *gpu_row(hearth_model *m, const hearth_fit_options *o, const json_t *sku, hearth_error *err) {
    hearth_fit_options g = *o;
    g.engine.device = HEARTH_DEVICE_CUDA;
    g.sku = json_string_value(json_object_get(sku, "name"));
    g.measure_bandwidth = 0;
    g.bandwidth_gbs = 0;
    char *text = NULL;
    if (hearth_fit(m, &g, &text, err)) return NULL;
    json_t *r = json_loads(text, 0, NULL);
    hearth_free(text);
    if (!r) return NULL;
    json_t *row = json_pack(
        "{s:O, s:s, s:O, s:O, s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O}", "name", json_object_get(sku, "name"),
        "kind", "gpu", "memory_bytes", json_object_get(sku, "memory_bytes"), "bandwidth_gbs",
        json_object_get(sku, "bandwidth_gbs"), "predicted", "device_bytes", "predicted_bytes",
        json_object_get(r, "predicted_peak_bytes"), "runtime_overhead_bytes",
        json_object_get(r, "runtime_overhead_bytes"), "fits", json_object_get(r, "fits"), "max_context_that_fits",
        json_object_get(r, "max_context_that_fits"), "decode_tok_s", json_object_get(r, "decode_tok_s"),
        "decode_tok_s_empty_cache", json_object_get(r, "decode_tok_s_empty_cache"), "compute_capability",
        json_object_get(r, "compute_capability"), "source",
        json_object_get(sku, "source") ? json_object_get(sku, "source") : json_null());
    json_decref(r);
    return row;
}

static json_t *sku_row(const json_t *sku, const json_t *r) {
    long long mem = jint(sku, "memory_bytes");
    double bw = json_number_value(json_object_get(sku, "bandwidth_gbs"));
    long long need = jint(r, "predicted_peak_bytes");
    long long kv = jint(r, "kv_pool_bytes"), ctx = jint(r, "context_length"), model_max = jint(r, "model_max_context");
    double kv_per_pos = ctx > 0 ? (double)kv / (double)ctx : 0;
    long long fixed = need - kv, max_ctx = 0;
    if (kv_per_pos > 0 && mem > fixed) {
        double c = (double)(mem - fixed) / kv_per_pos;
        max_ctx = c > (double)model_max ? model_max : (long long)c / SKU_KV_BLOCK * SKU_KV_BLOCK;
    }
    double ref_bw = json_number_value(json_object_get(r, "bandwidth_gbs"));
    double scale = ref_bw > 0 ? bw / ref_bw : 0;
    return json_pack("{s:O, s:O, s:I, s:f, s:s, s:I, s:b, s:I, s:f, s:f, s:O}", "name", json_object_get(sku, "name"),
                     "kind", json_object_get(sku, "kind"), "memory_bytes", (json_int_t)mem, "bandwidth_gbs", bw,
                     "predicted", "peak_rss_bytes", "predicted_bytes", (json_int_t)need, "fits", need <= mem,
                     "max_context_that_fits", (json_int_t)max_ctx, "decode_tok_s",
                     json_number_value(json_object_get(r, "decode_tok_s")) * scale, "decode_tok_s_empty_cache",
                     json_number_value(json_object_get(r, "decode_tok_s_empty_cache")) * scale, "source",
                     json_object_get(sku, "source") ? json_object_get(sku, "source") : json_null());
}

hearth_status hearth_fit_skus(hearth_model *m, const hearth_fit_options *o, char **out, hearth_error *err) {
    *out = NULL;
    char *report = NULL, *table = NULL;
    /* the CPU rows scale the CPU report; this_machine is the report for the options given
     * (the GPU's when there is one and --device asks for it), else the CPU's */
    hearth_fit_options cpu = *o;
    cpu.engine.device = HEARTH_DEVICE_CPU;
    cpu.sku = NULL;
    hearth_status st = hearth_fit(m, &cpu, &report, err);
    if (st) return st;
    char *mine = NULL;
    hearth_error ignore = {0};
    if (o->engine.device != HEARTH_DEVICE_CPU && !o->sku && hearth_fit(m, o, &mine, &ignore)) mine = NULL;
    if (!(table = data_file_load("skus.json", err))) {
        hearth_free(report);
        return err->status ? err->status : HEARTH_ERR_IO;
    }
    json_error_t je;
    json_t *r = json_loads(report, 0, NULL), *t = json_loads(table, 0, &je), *skus = json_object_get(t, "skus");
    if (!r || !json_is_array(skus)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "skus.json: expected {\"skus\": [...]} (%s)", t ? "no skus" : je.text);
    } else {
        json_t *rows = json_array();
        size_t i;
        const json_t *sku;
        json_array_foreach(skus, i, sku) {
            if (!json_is_string(json_object_get(sku, "name")) ||
                !json_is_integer(json_object_get(sku, "memory_bytes")) ||
                !json_is_number(json_object_get(sku, "bandwidth_gbs"))) {
                st = err_set(err, HEARTH_ERR_FORMAT, "skus.json: skus[%zu] needs name, memory_bytes, bandwidth_gbs", i);
                break;
            }
            const char *kind = json_string_value(json_object_get(sku, "kind"));
            if (kind && !strcmp(kind, "gpu")) {
                json_t *row = gpu_row(m, o, sku, err);
                if (!row) {
                    st = err->status ? err->status : HEARTH_ERR_NOMEM;
                    break;
                }
                json_array_append_new(rows, row);
            } else
                json_array_append_new(rows, sku_row(sku, r));
        }
        json_t *o2 =
            json_pack("{s:O, s:O, s:O, s:s, s:o, s:O}", "model", json_object_get(r, "model"), "context_length",
                      json_object_get(r, "context_length"), "max_sequences", json_object_get(r, "max_sequences"),
                      "prediction", sku_note, "skus", rows, "this_machine", r);
        json_t *gpu_here = mine ? json_loads(mine, 0, NULL) : NULL;
        if (o2 && gpu_here)
            json_object_set_new(o2, "this_machine", gpu_here);
        else
            json_decref(gpu_here);
        if (!st && o2) *out = json_dumps(o2, JSON_INDENT(2));
        json_decref(o2);
    }
    json_decref(r);
    json_decref(t);
    free(table);
    hearth_free(report);
    hearth_free(mine);
    return st;
}
