/* fit.c: `hearth fit`: whether a model fits this machine (or its GPU: --device cuda, or
 * a named GPU: --sku) at a context / batch / thread count, the predicted peak memory part
 * by part and decode speed (hearth_fit), as a table or JSON; and the --report-memory line other verbs print to check
 * it. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fit_usage =
    "hearth fit <model> [--ctx N] [--max-sequences 8] [--max-step-tokens 256] [--kv-blocks N | --kv-budget 1.5GB|N]\n"
    "       [--threads N] [--mmap | --no-mmap] [--kv-quant none|int8|fp8|f16] [--speculate lookup|suffix|mtp|none] "
    "[--deterministic] "
    "[--cuda-exact] [--expert-offload N]\n"
    "       [--device cpu|cuda|auto]\n"
    "       [--draft-model M] [--measure | --bandwidth GBS] [--sku NAME] [--json] [--skus] [--record]\n"
    "  every flag that sizes `hearth serve`'s memory, with serve's defaults (--batch B: --max-sequences B)\n"
    "hearth fit <model> --train [hearth train's flags] [--json]: the memory `hearth train` would take";

void cli_fit_print_skus(const char *report_json); /* fit_skus.c */
int cli_fit_record(const char *report_json);

void cli_report_memory(const hearth_engine *e) {
    hearth_process_memory pm;
    hearth_process_memory_get(&pm);
    fprintf(stderr, "{\"peak_rss_bytes\": %lld, \"rss_bytes\": %lld, \"engine_bytes\": %zu}\n",
            pm.peak_resident_bytes, pm.resident_bytes, e ? hearth_engine_bytes(e) : (size_t)0);
}

static double mib(const json_t *r, const char *key) {
    return (double)json_integer_value(json_object_get(r, key)) / (1024.0 * 1024.0);
}

/* --device cuda: device memory part by part, then the host side. */
/* A line when the default KV pool was cut to fit free memory (fit.c, engine_plan_room). */
static void print_kv_cut(const json_t *r) {
    long long cut = (long long)json_integer_value(json_object_get(r, "kv_blocks_cut_from"));
    if (cut)
        printf("KV pool: %lld blocks of 16 positions, cut from %lld (every sequence's whole context) to fit free "
               "memory; --kv-budget sets it\n",
               (long long)json_integer_value(json_object_get(r, "kv_blocks")), cut);
}

/* When the grammar tables come: the peak holds them, the start does not. */
static void print_grammar_note(const json_t *r) {
    const json_t *g = json_object_get(r, "grammar");
    if (g && json_integer_value(json_object_get(g, "vocab_tables_bytes")))
        printf("grammar tables: %.1f MiB of the vocabulary's byte tries (+%.1f MiB while they are built), made at the "
               "first constrained request (response_format, a forced tool call)\n",
               mib(g, "vocab_tables_bytes"), mib(g, "build_temporary_bytes"));
}

static void print_cuda_table(const json_t *r) {
    const json_t *h = json_object_get(r, "host");
    printf("model:    %s\n", json_string_value(json_object_get(r, "model")));
    printf("device:   %s (compute capability %s)%s\n", json_string_value(json_object_get(r, "gpu")),
           json_string_value(json_object_get(r, "compute_capability")),
           json_is_true(json_object_get(r, "device_present")) ? ", this machine's GPU"
                                                              : ", a prediction (no such GPU here)");
    printf("settings: context %lld (%s), sequences %lld, step %lld tokens, device KV %s\n\n",
           (long long)json_integer_value(json_object_get(r, "context_length")),
           json_string_value(json_object_get(r, "context_source")),
           (long long)json_integer_value(json_object_get(r, "max_sequences")),
           (long long)json_integer_value(json_object_get(r, "step_tokens")),
           json_string_value(json_object_get(r, "kv_device_dtype")));
    printf("  %-38s %10.1f MiB\n", "device: weights as uploaded", mib(r, "weights_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: KV pool", mib(r, "kv_pool_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: scratch (activations, GEMM)", mib(r, "scratch_bytes"));
    printf("  %-38s %10.1f MiB\n", "device:   of which LoRA adapter rows", mib(r, "lora_scratch_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: sampler (rows, entries, masks)", mib(r, "sampler_bytes"));
    const json_t *d = json_object_get(r, "draft");
    if (d)
        printf("  %-38s %10.1f MiB  (%s: weights %.1f, KV %.1f, scratch and sampler %.1f MiB)\n",
               "device: draft model (added)", mib(r, "draft_bytes"), json_string_value(json_object_get(d, "model")),
               mib(d, "weights_bytes"), mib(d, "kv_pool_bytes"), mib(d, "scratch_bytes") + mib(d, "buffers_bytes"));
    const json_t *hd = json_object_get(r, "mtp");
    if (hd)
        printf(
            "  %-38s %10.1f MiB  (weights with its lm_head %.1f, KV %.1f, scratch, sampler and hidden rows %.1f MiB)\n",
            "device: MTP head (added)", mib(r, "mtp_bytes"), mib(hd, "weights_bytes"), mib(hd, "kv_pool_bytes"),
            mib(r, "mtp_bytes") - mib(hd, "weights_bytes") - mib(hd, "kv_pool_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: CUDA context and cuBLAS", mib(r, "runtime_overhead_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: predicted peak", mib(r, "predicted_peak_bytes"));
    printf("  %-38s %10.1f MiB\n", "device: available", mib(r, "available_bytes"));
    int mapped = json_is_true(json_object_get(h, "weights_mapped"));
    printf("  %-38s %10.1f MiB\n", mapped ? "host: engine (vectors, buffers)" : "host: engine (every weight copied)",
           mib(h, "engine_bytes"));
    if (mapped)
        printf("  %-38s %10.1f MiB\n", "host: mapped weights (tables, in flight)", mib(h, "mapped_pages_bytes"));
    printf("  %-38s %10.1f MiB\n", "host: grammar tables (constrained)", mib(h, "grammar_bytes"));
    printf("  %-38s %10.1f MiB\n\n", "host: predicted peak resident", mib(h, "predicted_peak_bytes"));
    const json_t *x = json_object_get(r, "experts");
    if (x && json_is_true(json_object_get(x, "offloaded")))
        printf("experts:  %.1f MiB pinned on the host (--expert-offload), %lld device slots of %.1f KiB\n\n",
               mib(x, "bytes"), (long long)json_integer_value(json_object_get(x, "device_slots")), mib(x, "slot_bytes") * 1024.0);
    else if (x)
        printf("experts:  %.1f MiB of the device weights (--expert-offload N keeps them on the host)\n\n", mib(x, "bytes"));
    long long expanded = (long long)json_integer_value(json_object_get(r, "weights_expanded_to_f32"));
    if (expanded)
        printf("%lld weights in %s have no CUDA kernel: expanded to f32 on the device (4 bytes per weight)\n", expanded,
               json_string_value(json_object_get(r, "expanded_format")));
    print_kv_cut(r);
    print_grammar_note(json_object_get(r, "host"));
    printf("fits: %s; largest context that fits: %lld (model maximum %lld)\n",
           json_is_true(json_object_get(r, "fits")) ? "yes" : "NO",
           (long long)json_integer_value(json_object_get(r, "max_context_that_fits")),
           (long long)json_integer_value(json_object_get(r, "model_max_context")));
    if (json_object_get(r, "decode_tok_s"))
        printf(
            "decode: %.1f tok/s at a full context, %.1f tok/s at an empty one (%.2f MB read per token, %.1f GB/s %s)\n",
            json_real_value(json_object_get(r, "decode_tok_s")),
            json_real_value(json_object_get(r, "decode_tok_s_empty_cache")),
            json_real_value(json_object_get(r, "decode_bytes_per_token")) / 1e6,
            json_real_value(json_object_get(r, "bandwidth_gbs")),
            json_string_value(json_object_get(r, "bandwidth_source")));
}

static void print_table(const json_t *r) {
    if (json_object_get(r, "device")) {
        print_cuda_table(r);
        return;
    }
    const json_t *ro = json_object_get(r, "runtime_overhead");
    printf("model:    %s\n", json_string_value(json_object_get(r, "model")));
    printf("settings: context %lld (%s), sequences %lld, threads %lld, step %lld tokens\n\n",
           (long long)json_integer_value(json_object_get(r, "context_length")),
           json_string_value(json_object_get(r, "context_source")),
           (long long)json_integer_value(json_object_get(r, "max_sequences")),
           (long long)json_integer_value(json_object_get(r, "threads")),
           (long long)json_integer_value(json_object_get(r, "step_tokens")));
    printf("  %-34s %10.1f MiB\n", "weights", mib(r, "weights_bytes"));
    printf("  %-34s %10.1f MiB\n", "KV pool", mib(r, "kv_pool_bytes"));
    printf("  %-34s %10.1f MiB\n", "scratch", mib(r, "scratch_bytes"));
    printf("  %-34s %10.1f MiB\n", "logits, history, sampler", mib(r, "buffers_bytes"));
    printf("  %-34s %10.1f MiB\n", "grammar tables (constrained)", mib(r, "grammar_bytes"));
    const json_t *d = json_object_get(r, "draft");
    if (d)
        printf("  %-34s %10.1f MiB  (%s: weights %.1f, KV %.1f, scratch and buffers %.1f MiB)\n", "draft model (added)",
               mib(r, "draft_bytes"), json_string_value(json_object_get(d, "model")), mib(d, "weights_bytes"),
               mib(d, "kv_pool_bytes"), mib(d, "scratch_bytes") + mib(d, "buffers_bytes"));
    const json_t *h = json_object_get(r, "mtp");
    if (h)
        printf("  %-34s %10.1f MiB  (weights %.1f, KV %.1f, scratch and buffers %.1f MiB)\n", "MTP head (added)",
               mib(r, "mtp_bytes"), mib(h, "weights_bytes"), mib(h, "kv_pool_bytes"),
               mib(h, "scratch_bytes") + mib(h, "buffers_bytes"));
    printf("  %-34s %10.1f MiB\n", "runtime: process before the engine", mib(ro, "process_resident_bytes"));
    printf("  %-34s %10.1f MiB\n", "runtime: model file pages", mib(ro, "model_file_pages_bytes"));
    printf("  %-34s %10.1f MiB\n", "runtime: thread stacks", mib(ro, "thread_stacks_bytes"));
    printf("  %-34s %10.1f MiB\n", "runtime: engine code pages", mib(ro, "code_pages_bytes"));
    printf("  %-34s %10.1f MiB\n", "predicted peak (KV pool full)", mib(r, "predicted_peak_bytes"));
    printf("  %-34s %10.1f MiB\n", "at start (KV pool reserved, untouched)", mib(r, "predicted_start_bytes"));
    printf("  %-34s %10.1f MiB\n\n", "available now", mib(r, "available_bytes"));
    print_kv_cut(r);
    print_grammar_note(r);
    printf("fits: %s; largest context that fits: %lld (model maximum %lld)\n",
           json_is_true(json_object_get(r, "fits")) ? "yes" : "NO",
           (long long)json_integer_value(json_object_get(r, "max_context_that_fits")),
           (long long)json_integer_value(json_object_get(r, "model_max_context")));
    printf("decode: %.1f tok/s at a full context, %.1f tok/s at an empty one (%.2f MB read per token, %.1f GB/s %s)\n",
           json_real_value(json_object_get(r, "decode_tok_s")),
           json_real_value(json_object_get(r, "decode_tok_s_empty_cache")),
           json_real_value(json_object_get(r, "decode_bytes_per_token")) / 1e6,
           json_real_value(json_object_get(r, "bandwidth_gbs")),
           json_string_value(json_object_get(r, "bandwidth_source")));
}

int cli_fit(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* training's memory: hearth train's flags (train.c) */
        if (!strcmp(argv[i], "--train")) return cli_train_fit(argc, argv);
    const char *model = NULL, *draft = NULL;
    int as_json = 0, skus = 0, record = 0;
    hearth_fit_options fo = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) {
            printf("usage: %s\n", fit_usage);
            return 0;
        }
        if (cli_parse_engine_flag(argc, argv, &i, &fo.engine)) continue;
        int rc;
        if (cli_parse_pool_flag(argc, argv, &i, &fo.engine, fit_usage, &rc)) {
            if (rc) return rc;
            continue;
        }
        if (!strcmp(a, "--batch") && has)
            fo.engine.max_sequences = atoi(argv[++i]);
        else if (!strcmp(a, "--bandwidth") && has)
            fo.bandwidth_gbs = atof(argv[++i]);
        else if (!strcmp(a, "--measure"))
            fo.measure_bandwidth = 1;
        else if (!strcmp(a, "--json"))
            as_json = 1;
        else if (!strcmp(a, "--skus"))
            skus = 1;
        else if (!strcmp(a, "--sku") && has)
            fo.sku = argv[++i];
        else if (!strcmp(a, "--record"))
            record = 1;
        else if (!strcmp(a, "--draft-model") && has)
            draft = argv[++i];
        else if (a[0] == '-')
            return cli_usage_error(fit_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model)
            model = a;
        else
            return cli_usage_error(fit_usage, "%s: unexpected argument", a);
    }
    if (!model) return cli_usage_error(fit_usage, "%s", "need a model");
    if (!fo.engine.max_sequences) fo.engine.max_sequences = HEARTH_SERVE_MAX_SEQUENCES;
    if (fo.engine.device < 0) return cli_usage_error(fit_usage, "%s", "--device takes cpu, cuda or auto");
    if (fo.sku && !*fo.sku) return cli_usage_error(fit_usage, "%s", "--sku needs a GPU name (e.g. h200)");
    for (int i = 1; fo.sku && i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cpu"))
            return cli_usage_error(fit_usage, "%s", "--sku names a GPU: it does not combine with --device cpu");
    if (fo.engine.context_length < 0 || fo.engine.max_sequences < 0 || fo.engine.n_threads < 0 || fo.bandwidth_gbs < 0)
        return cli_usage_error(fit_usage, "%s", "--ctx, --batch, --threads and --bandwidth must be positive");
    hearth_model *m, *dm = NULL;
    if (cli_open_model(model, &m)) return 1;
    if (draft && cli_open_model(draft, &dm)) {
        hearth_model_close(m);
        return 1;
    }
    fo.engine.draft_model = dm;
    hearth_error err = {0};
    char *report = NULL;
    int rc = 0;
    if ((skus ? hearth_fit_skus : hearth_fit)(m, &fo, &report, &err))
        rc = cli_fail(&err);
    else if (skus && !as_json)
        cli_fit_print_skus(report);
    else if (as_json)
        printf("%s\n", report);
    else {
        json_t *r = json_loads(report, 0, NULL);
        if (r) print_table(r);
        json_decref(r);
    }
    if (!rc && record && !skus) rc = cli_fit_record(report); /* a prediction row in the evals db */
    hearth_free(report);
    hearth_model_close(dm);
    hearth_model_close(m);
    return rc;
}
