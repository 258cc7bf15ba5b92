/* bench.c: `hearth bench`: prefill and decode speed of a model on this machine, median of
 * r runs, next to the memory-bandwidth roofline measured in the same run. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *bench_usage = "hearth bench <model> [-p 512] [-n 128] [-t threads] [-r 5] [--kv-quant none|int8|fp8|f16]\n"
                                "       [--deterministic] [--json]\n"
                                "       [--host-argmax]  (logits row to the host every step, as a sampler needing it)\n"
                                "       [--temp T] [--top-p P] [--top-k K] [--min-p M] [--seed S]  (decode through the\n"
                                "        sampler, as hearth generate: on the GPU the device sampler unless\n"
                                "        HEARTH_DEVICE_SAMPLER=0) [--sampler-ab]  (then the same runs with the host sampler)";

int cli_parse_engine_flag(int argc, char **argv, int *i, hearth_engine_options *o);

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One run: prefill p tokens, then decode n tokens one at a time (greedy, EOS ignored). */
/* host_argmax: the logits row comes back every step and the argmax runs here (the path
 * of a sampler that needs logits); else hearth_seq_append_greedy (on the GPU only the id
 * leaves the device). */
static int run_once(hearth_engine *e, const int32_t *prompt, int p, int n, float *logits, int host_argmax,
                    double *prefill_s, double *decode_s, hearth_error *err) {
    int seq, vocab = hearth_model_vocab_rows(e);
    if (hearth_seq_open(e, &seq, err)) return 1;
    double t0 = now_seconds();
    int32_t next = 0;
    int rc = (host_argmax ? hearth_seq_append(e, seq, prompt, (size_t)p, 1, logits, err)
                          : hearth_seq_append_greedy(e, seq, prompt, (size_t)p, &next, err)) != HEARTH_OK;
    double t1 = now_seconds();
    for (int i = 0; !rc && i < n; i++) {
        if (host_argmax) {
            next = 0;
            for (int v = 1; v < vocab; v++)
                if (logits[v] > logits[next]) next = v;
            rc = hearth_seq_append(e, seq, &next, 1, 1, logits, err) != HEARTH_OK;
        } else {
            rc = hearth_seq_append_greedy(e, seq, &next, 1, &next, err) != HEARTH_OK;
        }
    }
    *prefill_s = t1 - t0;
    *decode_s = now_seconds() - t1;
    hearth_seq_close(e, seq);
    return rc;
}

/* A run through hearth_generate with sampling parameters (the serving path's sampler):
 * decode time is its generate_seconds over the completion_tokens - 1 appended tokens. */
static int run_sampled(hearth_engine *e, const int32_t *prompt, int p, int n, const hearth_sampling *sp,
                       double *prefill_s, double *decode_s, hearth_error *err) {
    hearth_generate_params gp = {.sampling = *sp, .max_tokens = n + 1, .ignore_eos = 1};
    hearth_generate_result res;
    if (hearth_generate(e, prompt, (size_t)p, &gp, NULL, NULL, &res, err)) return 1;
    *prefill_s = res.prompt_seconds;
    *decode_s = res.generate_seconds * (double)n / (double)(res.completion_tokens > 1 ? res.completion_tokens - 1 : 1);
    return 0;
}

int cli_bench(int argc, char **argv) {
    const char *model = NULL;
    int p = 512, n = 128, reps = 5, as_json = 0, host_argmax = 0;
    hearth_engine_options eo = {0};
    hearth_sampling sp = {.top_p = 1.0f, .repetition_penalty = 1.0f};
    int sampled = 0, sampler_ab = 0;
    double host_decode_tps = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) { printf("usage: %s\n", bench_usage); return 0; }
        if (cli_parse_engine_flag(argc, argv, &i, &eo)) continue;
        if (!strcmp(a, "-p") && has) p = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && has) n = atoi(argv[++i]);
        else if (!strcmp(a, "-r") && has) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) as_json = 1;
        else if (!strcmp(a, "--host-argmax")) host_argmax = 1;
        else if (!strcmp(a, "--sampler-ab")) sampler_ab = sampled = 1;
        else if (!strcmp(a, "--temp") && has) sp.temperature = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--top-p") && has) sp.top_p = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--top-k") && has) sp.top_k = atoi(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--min-p") && has) sp.min_p = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--seed") && has) sp.seed = strtoull(argv[++i], NULL, 10), sp.has_seed = 1, sampled = 1;
        else if (a[0] == '-') return cli_usage_error(bench_usage, "unknown or incomplete flag '%s'", a);
        else if (!model) model = a;
        else return cli_usage_error(bench_usage, "unexpected argument '%s'", a);
    }
    if (!model || p < 1 || n < 1 || reps < 1 || p > 1000000 || n > 1000000 || reps > 1000)
        return cli_usage_error(bench_usage, "%s", "need a model; -p, -n and -r must be positive");
    hearth_model *m;
    if (cli_open_model(model, &m)) return 1;
    if (!eo.context_length) eo.context_length = p + n + 16;
    /* The prefill chunk: 512 tokens on the CPU; on the GPU (--device cuda) up to 4096, so a
     * long prompt is one step: larger GEMMs, a quantized weight dequantized once instead of
     * once per 512-token chunk, and one attention launch over the whole prompt. */
    int chunk = eo.device == HEARTH_DEVICE_CUDA ? 4096 : 512;
    if (!eo.max_step_tokens) eo.max_step_tokens = p < chunk ? p : chunk;
    hearth_engine *e = NULL;
    hearth_error err = {0};
    if (hearth_engine_create(m, &eo, &e, &err)) { hearth_model_close(m); return cli_fail(&err); }
    int vocab = hearth_model_vocab_rows(e);
    int32_t *prompt = malloc((size_t)p * sizeof *prompt);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    double *pre = calloc((size_t)reps, sizeof *pre), *dec = calloc((size_t)reps, sizeof *dec);
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* fixed pseudo-random prompt: same work every run */
    for (int i = 0; i < p; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)vocab);
    }
    int rc = 0;
    double ps, ds;
    if (sampled ? run_sampled(e, prompt, p < 32 ? p : 32, 4, &sp, &ps, &ds, &err)
                : run_once(e, prompt, p < 32 ? p : 32, 4, logits, host_argmax, &ps, &ds, &err))
        rc = cli_fail(&err); /* warm-up */
    for (int r = 0; !rc && r < reps; r++) {
        if (sampled ? run_sampled(e, prompt, p, n, &sp, &pre[r], &dec[r], &err)
                    : run_once(e, prompt, p, n, logits, host_argmax, &pre[r], &dec[r], &err))
            rc = cli_fail(&err);
        else if (!as_json) fprintf(stderr, "run %d/%d: prefill %.1f tok/s, decode %.1f tok/s\n", r + 1, reps,
                                   p / pre[r], n / dec[r]);
    }
    if (!rc && sampler_ab) { /* the same runs through the host sampler, same engine (A/B in one load) */
        double *dec2 = calloc((size_t)reps, sizeof *dec2), unused;
        const char *was = getenv("HEARTH_DEVICE_SAMPLER");
        char *keep = was ? strdup(was) : NULL;
        setenv("HEARTH_DEVICE_SAMPLER", "0", 1); /* gen_device_sample reads it per request */
        for (int r = 0; !rc && r < reps; r++)
            if (run_sampled(e, prompt, p, n, &sp, &unused, &dec2[r], &err)) rc = cli_fail(&err);
        if (keep) setenv("HEARTH_DEVICE_SAMPLER", keep, 1);
        else unsetenv("HEARTH_DEVICE_SAMPLER");
        free(keep);
        qsort(dec2, (size_t)reps, sizeof *dec2, cmp_double);
        host_decode_tps = n / dec2[reps / 2];
        free(dec2);
    }
    if (!rc) {
        qsort(pre, (size_t)reps, sizeof *pre, cmp_double);
        qsort(dec, (size_t)reps, sizeof *dec, cmp_double);
        double prefill_tps = p / pre[reps / 2], decode_tps = n / dec[reps / 2];
        double bw = hearth_engine_measure_bandwidth(e);
        double bytes = hearth_engine_decode_bytes(e, p + n / 2); /* mean context during decode */
        double roof = bw > 0 ? bw * 1e9 / bytes : 0;
        int on_gpu = hearth_engine_device(e) == HEARTH_DEVICE_CUDA;
        json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "model",
                              hearth_model_path(m), "device", on_gpu ? "cuda" : "cpu", "kv_quant",
                              hearth_kv_quant_name(eo.kv_quant),
                              "deterministic", eo.deterministic,
                              "threads", eo.n_threads, "prompt_tokens", p, "gen_tokens", n,
                              "runs", reps, "prefill_tps", prefill_tps, "decode_tps", decode_tps, "bandwidth_gbs", bw,
                              "decode_bytes_per_token", bytes, "roofline_tps", roof, "roofline_fraction",
                              roof > 0 ? decode_tps / roof : 0.0);
        /* what bandwidth_gbs is: the roofline's ceiling on the device that ran the model */
        json_object_set_new(o, "bandwidth_source",
                            json_string(on_gpu ? "cuda device-to-device copy, bytes read + written, best of 10 x 1 GiB"
                                               : "cpu read with the engine's threads, 1 GiB"));
        if (sampled) {
            const char *env = getenv("HEARTH_DEVICE_SAMPLER");
            json_object_set_new(o, "sampling", json_pack("{s:f, s:f, s:i, s:f, s:s}", "temperature", sp.temperature,
                                                         "top_p", sp.top_p, "top_k", sp.top_k, "min_p", sp.min_p,
                                                         "sampler", on_gpu && !(env && env[0] == '0') ? "device" : "host"));
            if (sampler_ab)
                json_object_set_new(json_object_get(o, "sampling"), "host_sampler_decode_tps",
                                    json_real(host_decode_tps));
        }
        if (on_gpu) /* the device pool stores keys and values as --kv-quant says */
            json_object_set_new(o, "decode_bytes_note", json_string("weights as stored on the device + KV as --kv-quant"));
        if (as_json) {
            char *s = json_dumps(o, JSON_PRESERVE_ORDER);
            printf("%s\n", s);
            free(s);
        } else {
            printf("model      %s\nprefill    %.1f tok/s (%d tokens, median of %d)\n"
                   "decode     %.1f tok/s (%d tokens)\nbandwidth  %.1f GB/s read, %.1f MB per decode token\n"
                   "roofline   %.1f tok/s: decode reaches %.2f of it\n",
                   hearth_model_path(m), prefill_tps, p, reps, decode_tps, n, bw, bytes / 1e6, roof,
                   roof > 0 ? decode_tps / roof : 0.0);
            if (sampler_ab) printf("host       %.1f tok/s decode with the host sampler\n", host_decode_tps);
        }
        char *details = json_dumps(o, JSON_PRESERVE_ORDER); /* one evals row per bench run (hearth evals) */
        hearth_eval_row row = {.kind = "bench", .model = hearth_model_path(m), .context = p + n,
                               .predicted_peak_bytes = -1,
                               .measured_peak_bytes = hearth_proc_kb_field("/proc/self/status", "VmHWM"),
                               .tok_s = decode_tps, .details_json = details};
        if (hearth_evals_record(&row, &err)) fprintf(stderr, "hearth: bench: not recorded: %s\n", err.message);
        free(details);
        json_decref(o);
    }
    free(prompt);
    free(logits);
    free(pre);
    free(dec);
    hearth_engine_free(e);
    hearth_model_close(m);
    return rc;
}
