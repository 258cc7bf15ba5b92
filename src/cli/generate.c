/* generate.c: `hearth generate`: one prompt, streamed to stdout as it is produced
 * (stdout carries only the generated text); timings and memory go to stderr. */
#include "cli/cli.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char *gen_usage =
    "hearth generate <model> \"prompt\" [--max-tokens N] [--temp T] [--top-p P] [--top-k K] [--min-p P]\n"
    "       [--repetition-penalty R] [--seed S] [--system TEXT] [--no-chat-template] [--stop STR]...\n"
    "       [--json-schema FILE | --json | --grammar FILE | --regex PATTERN]\n"
    "       [--prompt-cache-file FILE] [--device cpu|cuda|auto] [--threads N] [--ctx N] [--mmap | --no-mmap] "
    "[--kv-quant "
    "none|int8|fp8|f16] [--deterministic] [--cuda-exact] [--expert-offload N] [--host-sampler] [--verbose] "
    "[--report-memory]\n"
    "       [--adapter-path DIR] [--speculate lookup|suffix|mtp|none] [--draft-model M] [--num-draft-tokens N]";

static int on_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    (void)user; (void)id; (void)lp;
    fputs(text, stdout);
    fflush(stdout);
    return 0;
}

/* The prompt as token ids: through the chat template unless told not to. */
static int build_prompt(hearth_model *m, const char *prompt, const char *system, int use_template, int32_t **ids,
                        size_t *n) {
    hearth_error err = {0};
    char *text = NULL;
    int add_special = 1;
    if (use_template) {
        json_t *msgs = json_array();
        if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        char *mj = json_dumps(msgs, 0);
        json_decref(msgs);
        hearth_status st = hearth_chat_render(m, mj, NULL, 1, NULL, &text, &err);
        free(mj);
        if (st) return cli_fail(&err);
        add_special = 0; /* the template already wrote BOS and friends */
    }
    hearth_status st = hearth_tokenize(m, text ? text : prompt, strlen(text ? text : prompt), add_special, ids, n, &err);
    hearth_free(text);
    return st ? cli_fail(&err) : 0;
}

/* Whether --prompt-cache-file can be written (the file, or a new file in its folder),
 * checked before the model loads so that a typo fails at once, not after generating;
 * prints the CLI's error naming the file when not. */
static int cache_file_writable(const char *path) {
    if (access(path, F_OK) == 0) {
        if (access(path, R_OK | W_OK) == 0) return 1;
    } else {
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
        int ok = dir && access(dir, W_OK | X_OK) == 0;
        free(dir);
        if (ok) return 1;
    }
    fprintf(stderr, "hearth: %s: %s (the prompt cache file cannot be written there)\n", path, strerror(errno));
    return 0;
}

/* hearth_generate, through a saved KV file when one is named: the longest prefix of the
 * prompt it holds is loaded instead of prefilled, and afterwards the file holds this
 * prompt and the generated text (so the next turn of a conversation resumes from it). */
static hearth_status generate_cached(hearth_engine *e, cli_spec *spec, const int32_t *ids, size_t n,
                                     hearth_generate_params *gp, const char *cache_file, hearth_generate_result *r,
                                     hearth_error *err) {
    if (!cache_file) return cli_spec_generate(spec, e, ids, n, gp, on_token, NULL, r, err);
    int seq;
    size_t loaded = 0;
    hearth_status st = hearth_seq_open(e, &seq, err);
    if (st) return st;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (access(cache_file, F_OK) == 0) st = hearth_seq_load(e, seq, cache_file, ids, n, &loaded, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!st) {
        fprintf(stderr, "prompt cache: %zu of %zu prompt tokens loaded from %s in %.4f s\n", loaded, n, cache_file,
                (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
        st = hearth_generate_seq(e, seq, ids, n, gp, on_token, NULL, r, err);
    }
    if (!st) st = hearth_seq_save(e, seq, cache_file, err);
    hearth_seq_close(e, seq);
    return st;
}

int cli_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *system = NULL, *cache_file = NULL, *adapter_path = NULL;
    const char *stops[16];
    int use_template = 1, verbose = 0;
    hearth_engine_options eo = {0};
    cli_spec spec = {0};
    hearth_generate_params gp = {.max_tokens = 256};
    int have_sampling[6] = {0};
    float fv[6] = {0};
    int top_k = -1;
    long long seed = -1;
    int report_memory = 0;
    const char *schema_file = NULL, *grammar_file = NULL, *regex = NULL;
    int json_object = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        static const char *fflags[] = {"--temp", "--top-p", "--min-p", "--repetition-penalty"};
        int matched = 0;
        for (int k = 0; k < 4; k++)
            if (!strcmp(a, fflags[k]) && has) { fv[k] = strtof(argv[++i], NULL); have_sampling[k] = matched = 1; }
        if (matched) continue;
        if (cli_is_help(a)) { printf("usage: %s\n", gen_usage); return 0; }
        int flag_rc;
        if (cli_spec_flag(argc, argv, &i, &spec, &eo, gen_usage, &flag_rc)) {
            if (flag_rc) return flag_rc;
            continue;
        }
        if (cli_parse_engine_flag(argc, argv, &i, &eo)) continue;
        if (!strcmp(a, "--max-tokens") && has) gp.max_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--top-k") && has) top_k = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && has) seed = atoll(argv[++i]);
        else if (!strcmp(a, "--system") && has) system = argv[++i];
        else if (!strcmp(a, "--prompt-cache-file") && has) cache_file = argv[++i];
        else if (!strcmp(a, "--adapter-path") && has) adapter_path = argv[++i];
        else if (!strcmp(a, "--stop") && has && gp.n_stop < 16) stops[gp.n_stop++] = argv[++i];
        else if (!strcmp(a, "--json-schema") && has) schema_file = argv[++i];
        else if (!strcmp(a, "--grammar") && has) grammar_file = argv[++i];
        else if (!strcmp(a, "--regex") && has) regex = argv[++i];
        else if (!strcmp(a, "--json")) json_object = 1;
        else if (!strcmp(a, "--no-chat-template")) use_template = 0;
        else if (!strcmp(a, "--verbose")) verbose = 1;
        else if (!strcmp(a, "--report-memory")) report_memory = 1; /* JSON line for tests/parity/test_fit.py */
        else if (a[0] == '-' && a[1]) return cli_usage_error(gen_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else if (!prompt) prompt = a;
        else return cli_usage_error(gen_usage, "%s: unexpected argument", a);
    }
    if (!model || !prompt) return cli_usage_error(gen_usage, "%s", "need a model and a prompt");
    if (gp.max_tokens <= 0 || gp.max_tokens > 1000000)
        return cli_usage_error(gen_usage, "--max-tokens must be between 1 and 1000000 (got %s)", "that");
    if (!!schema_file + !!grammar_file + !!regex + json_object > 1)
        return cli_usage_error(gen_usage, "%s", "--json-schema, --json, --grammar and --regex exclude each other");
    if (cache_file && !cache_file_writable(cache_file)) return 1;
    /* the constraint's source, checked before the model loads: an error names the file */
    char *source = NULL;
    const char *source_file = schema_file ? schema_file : grammar_file;
    if (source_file && !(source = cli_read_file(source_file))) return 1;
    gp.constraint = schema_file ? HEARTH_CONSTRAINT_JSON_SCHEMA
                    : grammar_file ? HEARTH_CONSTRAINT_GBNF
                    : regex        ? HEARTH_CONSTRAINT_REGEX
                    : json_object  ? HEARTH_CONSTRAINT_JSON_OBJECT
                                   : HEARTH_CONSTRAINT_NONE;
    gp.constraint_text = source ? source : regex;
    gp.constraint_len = gp.constraint_text ? strlen(gp.constraint_text) : 0;
    if (gp.constraint) {
        hearth_error cerr = {0};
        if (hearth_constraint_check(gp.constraint, gp.constraint_text, gp.constraint_len, &cerr)) {
            fprintf(stderr, "hearth: %s: %s\n", source_file ? source_file : "--regex", cerr.message);
            free(source);
            return 1;
        }
    }
    int spec_rc = cli_spec_open(&spec, &eo, cache_file ? "--prompt-cache-file" : NULL, gen_usage);
    if (spec_rc) { free(source); return spec_rc; }
    hearth_model *m;
    if (cli_open_model(model, &m)) { free(source); cli_spec_end(&spec, NULL); return 1; }
    hearth_sampling_defaults(m, &gp.sampling);
    if (have_sampling[0]) gp.sampling.temperature = fv[0];
    if (have_sampling[1]) gp.sampling.top_p = fv[1];
    if (have_sampling[2]) gp.sampling.min_p = fv[2];
    if (have_sampling[3]) gp.sampling.repetition_penalty = fv[3];
    if (top_k >= 0) gp.sampling.top_k = top_k;
    if (seed >= 0) { gp.sampling.has_seed = 1; gp.sampling.seed = (uint64_t)seed; }
    gp.stop = stops;
    int32_t *ids = NULL;
    size_t n = 0;
    hearth_engine *e = NULL;
    hearth_error err = {0};
    int rc = build_prompt(m, prompt, system, use_template, &ids, &n);
    if (!rc && hearth_engine_create(m, &eo, &e, &err)) rc = cli_fail(&err);
    if (!rc && adapter_path) rc = cli_mount_adapter(e, adapter_path, 1);
    if (!rc) rc = cli_spec_start(&spec, e, &eo);
    hearth_generate_result r;
    if (!rc && generate_cached(e, &spec, ids, n, &gp, cache_file, &r, &err)) rc = cli_fail(&err);
    if (!rc) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double gen_tps = r.completion_tokens > 1 && r.generate_seconds > 0
                             ? (double)(r.completion_tokens - 1) / r.generate_seconds : 0;
        fprintf(stderr, "\n==========\nprompt: %zu tokens, %.1f tokens/s | generation: %zu tokens, %.1f tokens/s\n"
                        "time to first token: %.3f s | finish: %s | peak memory: %.1f MiB\n",
                r.prompt_tokens, r.prompt_seconds > 0 ? (r.prompt_tokens - r.cached_tokens) / r.prompt_seconds : 0,
                r.completion_tokens,
                gen_tps, r.first_token_seconds, hearth_finish_name(r.finish), ru.ru_maxrss / 1024.0);
        if (cache_file) /* tokens/s above: of the tokens computed, not those loaded */
            fprintf(stderr, "prompt cache: %zu tokens loaded, %zu computed in %.4f s\n", r.cached_tokens,
                    r.prompt_tokens - r.cached_tokens, r.prompt_seconds);
        cli_spec_report(&spec);
        if (report_memory) cli_report_memory(e);
        if (verbose) fprintf(stderr, "engine memory: %.1f MiB\n", hearth_engine_bytes(e) / (1024.0 * 1024.0));
    }
    hearth_free(ids);
    cli_spec_end(&spec, e);
    hearth_model_close(m);
    free(source);
    return rc;
}
