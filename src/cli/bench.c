/* bench.c: `hearth bench`: prefill and decode speed of a model on this machine, median of
 * r runs, next to the memory-bandwidth roofline measured in the same run. */
#include "base/err.h"
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *bench_usage =
    "hearth bench <model> [-p 512] [-n 128] [-t threads] [-r 5] [--kv-quant none|int8|fp8|f16]\n"
    "       [--device cpu|cuda|auto] [--deterministic] [--cuda-exact] [--expert-offload N] [--host-sampler] [--json] "
    "[--batch B[,B...]]  (B requests at once through the\n"
    "        batch scheduler, as hearth serve runs them: aggregate prefill and decode tok/s;\n"
    "        a list runs each count in turn on one engine, one report each)\n"
    "       [--host-argmax]  (logits row to the host every step, as a sampler needing it)\n"
    "       [--temp T] [--top-p P] [--top-k K] [--min-p M] [--seed S]  (decode through the\n"
    "        sampler, as hearth generate: on the GPU the device sampler unless\n"
    "        --host-sampler) [--sampler-ab]  (then the same runs with the host sampler)\n"
    "       [--prompt-file F [--draft-model M] [--num-draft-tokens 3]]  (speculative decoding:\n"
    "        --batch B (1) requests of F's text, greedy, on an engine without speculation and one\n"
    "        with prompt lookup or the draft model, runs alternating; decode tok/s, ratio, acceptance)\n"
    "       [--spec-accept A[,A...]]  (benchmarks only: the draft's proposals (without --draft-model, lookup's) "
    "replaced by\n"
    "        the target's own greedy text, each token kept with probability A (0..1), so acceptance is\n"
    "        known; adds the ideal speedup (1 - A^(K+1)) / (1 - A) and the fraction of it achieved;\n"
    "        lists of --batch, --num-draft-tokens and A run every combination, one report each)";

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A comma-separated list of 1..16 numbers in [lo, hi] (integers only with whole) into v;
 * returns the count, -1 when it does not parse. */
static int parse_list(const char *s, double *v, double lo, double hi, int whole) {
    int n = 0;
    for (;;) {
        char *end;
        double x = strtod(s, &end);
        if (end == s || n == 16 || !(x >= lo && x <= hi) || (whole && x != (double)(long)x)) return -1;
        v[n++] = x;
        if (*end == 0) return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

int cli_cmp_double(const void *a, const void *b) {
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

/* --batch B: B requests with distinct prompts of p tokens (no shared prefix) and n tokens
 * each, submitted at once to one hearth_batch, stepped until all are done. Prefill: B * p
 * tokens over the time until every request has its first token. Decode: the tokens made
 * after that moment over the time until the last request ends (every row decoding; the
 * early finishers' tail is the only part with fewer than B rows), as llama-batched-bench. */
typedef struct bench_batch_req {
    struct bench_batch_run *run;
    int32_t *out; /* NULL, or where its first n tokens go */
    int n;
    int ntok, done;
    hearth_status st;
    hearth_error err;
} bench_batch_req;
typedef struct bench_batch_run {
    int B, started;
    long long tokens, tokens_at_all;
    double t_all, t_end;
} bench_batch_run;

static int bench_batch_token(void *user, int32_t token, const char *text, const hearth_logprobs *lp) {
    (void)token, (void)text, (void)lp;
    bench_batch_req *r = user;
    if (r->out && r->ntok < r->n) r->out[r->ntok] = token;
    r->run->tokens++;
    if (!r->ntok++ && ++r->run->started == r->run->B) {
        r->run->t_all = now_seconds();
        r->run->tokens_at_all = r->run->tokens;
    }
    return 0;
}

static void bench_batch_done(void *user, hearth_status st, const hearth_error *err) {
    bench_batch_req *r = user;
    r->done = 1, r->st = st;
    if (err) r->err = *err;
    r->run->t_end = now_seconds();
}

int cli_bench_run_batch(hearth_engine *e, int B, int p, int n, int vocab, uint64_t seed, const cli_bench_text *text,
                        double *prefill_tps, double *decode_tps, hearth_batch_stats *stats, hearth_error *err) {
    if (text) p = (int)text->n;
    int32_t *prompts = malloc((size_t)B * (size_t)p * sizeof *prompts);
    bench_batch_req *reqs = calloc((size_t)B, sizeof *reqs);
    hearth_generate_result *res = calloc((size_t)B, sizeof *res);
    hearth_batch *b = NULL;
    bench_batch_run run = {.B = B};
    hearth_generate_params gp = {.sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                                 .max_tokens = n,
                                 .ignore_eos = 1,
                                 .num_draft_tokens = text ? text->num_draft_tokens : 0};
    int rc = !prompts || !reqs || !res;
    if (rc) err_set(err, HEARTH_ERR_NOMEM, "bench: out of memory");
    uint64_t x = seed;
    for (size_t i = 0; !rc && i < (size_t)B * (size_t)p; i++) { /* distinct: no prefix-cache hits */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompts[i] = text ? text->ids[i % (size_t)p] : (int32_t)(x % (uint64_t)vocab);
    }
    if (!rc && hearth_batch_create(e, &b, err)) rc = 1;
    double t0 = now_seconds();
    for (int i = 0; !rc && i < B; i++) {
        reqs[i].run = &run;
        reqs[i].out = text && text->out ? text->out + (size_t)i * (size_t)n : NULL, reqs[i].n = n;
        hearth_batch_request r = {.prompt = prompts + (size_t)i * (size_t)p, .n_prompt = (size_t)p, .params = &gp,
                                  .on_token = bench_batch_token, .on_done = bench_batch_done,
                                  .result = &res[i], .user = &reqs[i]};
        if (hearth_batch_submit(b, &r, err)) rc = 1;
    }
    while (!rc && hearth_batch_step(b) > 0) {}
    if (!rc && stats) hearth_batch_stats_get(b, stats);
    for (int i = 0; !rc && i < B; i++)
        if (reqs[i].st) *err = reqs[i].err, rc = 1;
    if (!rc && run.started < B) rc = 1, err_set(err, HEARTH_ERR_INVALID, "bench: %d of %d requests made no token", B - run.started, B);
    if (!rc) {
        *prefill_tps = (double)B * p / (run.t_all - t0);
        double dt = run.t_end - run.t_all;
        *decode_tps = dt > 0 ? (double)(run.tokens - run.tokens_at_all) / dt : 0;
    }
    hearth_batch_free(b);
    free(prompts);
    free(reqs);
    free(res);
    return rc;
}

double cli_median_sorted(const double *v, int n) { return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

/* bench --batch: a warm-up batch, then reps batches; the medians, as one report. */
static int bench_batch_main(hearth_engine *e, hearth_model *m, const hearth_engine_options *eo, int B, int p, int n,
                            int reps, int vocab, int as_json, double load_s) {
    hearth_error err = {0};
    double pre[1000], dec[1000], unused;
    /* warm-up: the whole prompt, as the single-stream bench below does */
    if (cli_bench_run_batch(e, B, p, 4, vocab, 0x51ed27a3ULL, NULL, &unused, &unused, NULL, &err))
        return cli_fail(&err);
    for (int r = 0; r < reps; r++) {
        if (cli_bench_run_batch(e, B, p, n, vocab, 0x9e3779b97f4a7c15ULL + (uint64_t)r * 7919, NULL, &pre[r], &dec[r],
                                NULL, &err))
            return cli_fail(&err);
        if (!as_json)
            fprintf(stderr, "run %d/%d: %d requests: prefill %.1f tok/s, decode %.1f tok/s\n", r + 1, reps, B, pre[r],
                    dec[r]);
    }
    qsort(pre, (size_t)reps, sizeof *pre, cli_cmp_double);
    qsort(dec, (size_t)reps, sizeof *dec, cli_cmp_double);
    double prefill_tps = cli_median_sorted(pre, reps), decode_tps = cli_median_sorted(dec, reps);
    double bw = hearth_engine_measure_bandwidth(e);
    /* one step reads the weights once and each row's KV: B x (bytes at a context) less (B - 1) x the weights */
    double w = hearth_engine_decode_bytes(e, 0), one = hearth_engine_decode_bytes(e, p + n / 2);
    double step_bytes = w + B * (one - w), roof = bw > 0 ? B * bw * 1e9 / step_bytes : 0;
    int on_gpu = hearth_engine_device(e) == HEARTH_DEVICE_CUDA;
    if (as_json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                              "model", hearth_model_path(m), "device", on_gpu ? "cuda" : "cpu", "kv_quant",
                              hearth_kv_quant_name(eo->kv_quant), "deterministic", eo->deterministic, "threads",
                              hearth_engine_threads(e), "batch", B, "prompt_tokens", p, "gen_tokens", n, "runs", reps,
                              "prefill_tps", prefill_tps, "decode_tps", decode_tps, "decode_step_ms",
                              decode_tps > 0 ? 1e3 * B / decode_tps : 0.0, "bandwidth_gbs", bw,
                              "decode_bytes_per_step", step_bytes, "roofline_tps", roof, "roofline_fraction",
                              roof > 0 ? decode_tps / roof : 0.0);
        json_object_set_new(o, "load_s", json_real(load_s));
        json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(o);
    } else {
        printf("model      %s (loaded in %.1f s)\nbatch      %d requests of %d + %d tokens (median of %d)\n"
               "prefill    %.1f tok/s aggregate\ndecode     %.1f tok/s aggregate (%.2f ms per step)\n"
               "bandwidth  %.1f GB/s read, %.1f MB per decode step\nroofline   %.1f tok/s: decode reaches %.2f of it\n",
               hearth_model_path(m), load_s, B, p, n, reps, prefill_tps, decode_tps,
               decode_tps > 0 ? 1e3 * B / decode_tps : 0.0, bw, step_bytes / 1e6, roof,
               roof > 0 ? decode_tps / roof : 0.0);
    }
    return 0;
}

int cli_bench(int argc, char **argv) {
    const char *model = NULL;
    int p = 512, n = 128, reps = 5, as_json = 0, host_argmax = 0;
    hearth_engine_options eo = {0};
    hearth_sampling sp = {.top_p = 1.0f, .repetition_penalty = 1.0f};
    int sampled = 0, sampler_ab = 0, batch = 0, batches[16], n_batches = 0, num_draft[16] = {3}, n_draft = 1;
    double spec_accept[16];
    int n_accept = 0;
    const char *prompt_file = NULL, *draft_name = NULL;
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
        else if (!strcmp(a, "--batch") && has) {
            const char *v = argv[++i];
            for (n_batches = 0; *v && n_batches < 16;) { /* a comma-separated list */
                char *end;
                long b = strtol(v, &end, 10);
                if (end == v || b < 1 || b > 1024) { n_batches = -1; break; }
                batches[n_batches++] = (int)b;
                if (b > batch) batch = (int)b;
                v = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') { n_batches = -1; break; }
            }
            if (n_batches <= 0) return cli_usage_error(bench_usage, "--batch '%s': need 1..16 counts of 1..1024, comma-separated", argv[i]);
        }
        else if (!strcmp(a, "--sampler-ab")) sampler_ab = sampled = 1;
        else if (!strcmp(a, "--prompt-file") && has) prompt_file = argv[++i];
        else if (!strcmp(a, "--draft-model") && has) draft_name = argv[++i];
        else if (!strcmp(a, "--num-draft-tokens") && has) {
            double v[16];
            if ((n_draft = parse_list(argv[++i], v, 0, 64, 1)) <= 0)
                return cli_usage_error(bench_usage, "--num-draft-tokens '%s': need 1..16 counts of 0..64, comma-separated", argv[i]);
            for (int j = 0; j < n_draft; j++) num_draft[j] = (int)v[j];
        }
        else if (!strcmp(a, "--spec-accept") && has) {
            if ((n_accept = parse_list(argv[++i], spec_accept, 0, 1, 0)) <= 0)
                return cli_usage_error(bench_usage, "--spec-accept '%s': need 1..16 probabilities from 0 to 1, comma-separated", argv[i]);
        }
        else if (!strcmp(a, "--temp") && has) sp.temperature = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--top-p") && has) sp.top_p = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--top-k") && has) sp.top_k = atoi(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--min-p") && has) sp.min_p = (float)atof(argv[++i]), sampled = 1;
        else if (!strcmp(a, "--seed") && has) sp.seed = strtoull(argv[++i], NULL, 10), sp.has_seed = 1, sampled = 1;
        else if (a[0] == '-') return cli_usage_error(bench_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else return cli_usage_error(bench_usage, "%s: unexpected argument", a);
    }
    if (!model || p < 1 || n < 1 || reps < 1 || p > 1000000 || n > 1000000 || reps > 1000)
        return cli_usage_error(bench_usage, "%s", "need a model; -p, -n and -r must be positive");
    if (batch && (sampled || host_argmax))
        return cli_usage_error(bench_usage, "%s", "--batch runs greedy requests (no sampler flags)");
    if (batch && n < 2) return cli_usage_error(bench_usage, "%s", "--batch needs -n 2 or more");
    if ((draft_name || n_draft != 1 || num_draft[0] != 3 || n_accept) && !prompt_file)
        return cli_usage_error(bench_usage, "%s", "--draft-model, --num-draft-tokens and --spec-accept go with --prompt-file");
    if (prompt_file && (sampled || host_argmax))
        return cli_usage_error(bench_usage, "%s", "--prompt-file runs greedy requests");
    if (prompt_file && !n_accept && (n_batches > 1 || n_draft > 1))
        return cli_usage_error(bench_usage, "%s",
                               "lists of --batch or --num-draft-tokens counts go with --spec-accept");
    for (int j = 0; n_accept && j < n_draft; j++)
        if (num_draft[j] < 1) return cli_usage_error(bench_usage, "%s", "--spec-accept needs --num-draft-tokens 1 or more");
    hearth_model *m;
    if (cli_open_model(model, &m)) return 1;
    if (prompt_file) {
        hearth_model *dm = NULL;
        if (draft_name && cli_open_model(draft_name, &dm)) return 1;
        eo.draft_model = dm;
        int one = 1;
        int rc = cli_bench_spec(m, eo, prompt_file, n_batches > 0 ? batches : &one, n_batches > 0 ? n_batches : 1, n,
                                reps, num_draft, n_draft, spec_accept, n_accept, as_json);
        hearth_model_close(dm);
        hearth_model_close(m);
        return rc;
    }
    if (!eo.context_length) eo.context_length = p + n + 16;
    if (batch) {
        if (!eo.max_sequences) eo.max_sequences = batch;
        if (!eo.kv_blocks && eo.kv_budget_bytes <= 0) eo.kv_blocks = batch * ((eo.context_length + 15) / 16);
    }
    /* The prefill chunk: 512 tokens on the CPU; on the GPU (--device cuda) up to 4096, so a
     * long prompt is one step: larger GEMMs, a quantized weight dequantized once instead of
     * once per 512-token chunk, and one attention launch over the whole prompt. */
    int chunk = eo.device == HEARTH_DEVICE_CUDA ? 4096 : 512;
    if (!eo.max_step_tokens) eo.max_step_tokens = p < chunk ? p : chunk;
    hearth_engine *e = NULL;
    hearth_error err = {0};
    /* the load: the weights read and made ready where the forward pass runs (on the GPU,
     * uploaded in their device layouts), the pools and scratch made */
    double load_s = now_seconds();
    if (hearth_engine_create(m, &eo, &e, &err)) { hearth_model_close(m); return cli_fail(&err); }
    load_s = now_seconds() - load_s;
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
    /* --batch: its own runs and report; the rest below is the single-stream bench */
    for (int j = 0; !rc && j < n_batches; j++)
        rc = bench_batch_main(e, m, &eo, batches[j], p, n, reps, vocab, as_json, load_s);
    /* warm-up with the whole prompt: the timed runs then find every kernel of these step shapes
     * loaded and tuned (CUDA loads kernels lazily at first launch and cuBLAS picks its GEMM per
     * shape: with a 32-token warm-up the first long prefill paid for that, and the median of
     * -r 1 or 2 was that cold run) */
    if (!batch && (sampled ? run_sampled(e, prompt, p, 4, &sp, &ps, &ds, &err)
                           : run_once(e, prompt, p, 4, logits, host_argmax, &ps, &ds, &err)))
        rc = cli_fail(&err);
    for (int r = 0; !rc && !batch && r < reps; r++) {
        if (sampled ? run_sampled(e, prompt, p, n, &sp, &pre[r], &dec[r], &err)
                    : run_once(e, prompt, p, n, logits, host_argmax, &pre[r], &dec[r], &err))
            rc = cli_fail(&err);
        else if (!as_json) fprintf(stderr, "run %d/%d: prefill %.1f tok/s, decode %.1f tok/s\n", r + 1, reps,
                                   p / pre[r], n / dec[r]);
    }
    if (!rc && !batch && sampler_ab && !eo.host_sampler) {
        /* the same runs through the host sampler: a second engine with host_sampler on the
         * same loaded model (one model load), beside the first, with its own warm-up run */
        double *dec2 = calloc((size_t)reps, sizeof *dec2), unused;
        hearth_engine_options ho = eo;
        ho.host_sampler = 1;
        hearth_engine *he = NULL;
        if (hearth_engine_create(m, &ho, &he, &err)) rc = cli_fail(&err);
        if (!rc && run_sampled(he, prompt, p, n, &sp, &unused, &unused, &err)) rc = cli_fail(&err); /* warm-up */
        for (int r = 0; !rc && r < reps; r++)
            if (run_sampled(he, prompt, p, n, &sp, &unused, &dec2[r], &err)) rc = cli_fail(&err);
        hearth_engine_free(he);
        qsort(dec2, (size_t)reps, sizeof *dec2, cli_cmp_double);
        host_decode_tps = n / cli_median_sorted(dec2, reps);
        free(dec2);
    }
    if (!rc && !batch) {
        qsort(pre, (size_t)reps, sizeof *pre, cli_cmp_double);
        qsort(dec, (size_t)reps, sizeof *dec, cli_cmp_double);
        double prefill_tps = p / cli_median_sorted(pre, reps), decode_tps = n / cli_median_sorted(dec, reps);
        double bw = hearth_engine_measure_bandwidth(e);
        double bytes = hearth_engine_decode_bytes(e, p + n / 2); /* mean context during decode */
        double roof = bw > 0 ? bw * 1e9 / bytes : 0;
        int on_gpu = hearth_engine_device(e) == HEARTH_DEVICE_CUDA;
        json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "model",
                              hearth_model_path(m), "device", on_gpu ? "cuda" : "cpu", "kv_quant",
                              hearth_kv_quant_name(eo.kv_quant),
                              "deterministic", eo.deterministic,
                              "threads", hearth_engine_threads(e), "prompt_tokens", p, "gen_tokens", n,
                              "runs", reps, "prefill_tps", prefill_tps, "decode_tps", decode_tps, "bandwidth_gbs", bw,
                              "decode_bytes_per_token", bytes, "roofline_tps", roof, "roofline_fraction",
                              roof > 0 ? decode_tps / roof : 0.0);
        json_object_set_new(o, "load_s", json_real(load_s));
        /* what bandwidth_gbs is: the roofline's ceiling on the device that ran the model */
        json_object_set_new(o, "bandwidth_source",
                            json_string(on_gpu ? "cuda device-to-device copy, bytes read + written, best of 10 x 1 GiB"
                                               : "cpu read with the engine's threads, 1 GiB"));
        if (sampled) {
            json_object_set_new(o, "sampling", json_pack("{s:f, s:f, s:i, s:f, s:s}", "temperature", sp.temperature,
                                                         "top_p", sp.top_p, "top_k", sp.top_k, "min_p", sp.min_p,
                                                         "sampler", on_gpu && !eo.host_sampler ? "device" : "host"));
            if (sampler_ab)
                json_object_set_new(json_object_get(o, "sampling"), "host_sampler_decode_tps",
                                    json_real(host_decode_tps));
        }
        if (on_gpu) /* the device pool stores keys and values as --kv-quant says */
            json_object_set_new(o, "decode_bytes_note", json_string("weights as stored on the device + KV as --kv-quant"));
        if (as_json) {
            json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
            putchar('\n');
        } else {
            printf("model      %s (loaded in %.1f s)\nprefill    %.1f tok/s (%d tokens, median of %d)\n"
                   "decode     %.1f tok/s (%d tokens)\nbandwidth  %.1f GB/s read, %.1f MB per decode token\n"
                   "roofline   %.1f tok/s: decode reaches %.2f of it\n",
                   hearth_model_path(m), load_s, prefill_tps, p, reps, decode_tps, n, bw, bytes / 1e6, roof,
                   roof > 0 ? decode_tps / roof : 0.0);
            if (sampler_ab) printf("host       %.1f tok/s decode with the host sampler\n", host_decode_tps);
        }
        char *details = json_dumps(o, JSON_PRESERVE_ORDER); /* one evals row per bench run (hearth evals) */
        hearth_process_memory pm;
        hearth_process_memory_get(&pm);
        hearth_eval_row row = {.kind = "bench", .model = hearth_model_path(m), .context = p + n,
                               .predicted_peak_bytes = -1,
                               .measured_peak_bytes = pm.peak_resident_bytes,
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
