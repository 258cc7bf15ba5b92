/* serve.c: `hearth serve`: mlx_lm.server's flags (same names and defaults; the
 * ones hearth cannot honour yet are accepted with a warning), hearth's own
 * limits and API key, then the model, the engine, and the HTTP server until
 * SIGINT/SIGTERM. All request handling lives in src/server/. */
#define _GNU_SOURCE
#include "cli/cli.h"
#include "server/server.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The model `make run` uses; hearth_model_open finds it in
 * $HEARTH_CACHE/models. */
#define SERVE_DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1"

static const char *serve_usage =
    "hearth serve [--model M] [--host 127.0.0.1] [--port 8080] [--max-tokens "
    "512] [--temp 0] [--top-p 1]\n"
    "             [--top-k 0] [--min-p 0] [--chat-template TEXT] "
    "[--chat-template-args JSON]\n"
    "             [--allowed-origins a,b|*] [--log-level INFO] [--api-key KEY] "
    "[--max-body 16M]\n"
    "             [--max-header 64K] [--timeout 300] [--max-connections 256] "
    "[--threads N] [--ctx N] [--mmap | --no-mmap]\n"
    "             [--responses-ttl 3600] [--responses-max-bytes 64M] [--prompt-cache-dir DIR] "
    "[--prompt-cache-bytes 4G] [--train-dir DIR]\n"
    "             [--prefill-step-size 2048] [--max-step-tokens 256] [--max-sequences 8] "
    "[--kv-blocks N] [--kv-budget 1.5GB|N]\n"
    "             [--device cpu|cuda|auto] [--kv-quant none|int8|fp8|f16] [--deterministic] [--cuda-exact] "
    "[--expert-offload N] [--host-sampler] "
    "[--speculate lookup|suffix|mtp|none]\n"
    "             [--kv-bits 8 (= --kv-quant int8; 2-6 also take int8)] "
    "[--kv-group-size 64] [--quantized-kv-start 5000]\n"
    "             (KV pool default: --max-sequences x --ctx positions, cut to fit "
    "free memory)\n"
    "             [--open|--no-open (the chat page in a browser)] [--embedding-model M]\n"
    "             [--draft-model M] [--num-draft-tokens 3]\n"
    "             [--memory] [--memory-log] [--memory-vault PATH] (serve the memory vault; "
    "log chats into it)\n"
    "             [--hlg-sampling on|off] [--hlg-width 4] [--hlg-shoulder 4] [--hlg-toe 6] "
    "[--hlg-pivot-offset 6]\n"
    "             [--adapter-path DIR] [--adapter id=DIR]... (LoRA adapters)\n"
    "  accepted but not supported yet (a warning says so):\n"
    "  --trust-remote-code --use-default-chat-template --decode-concurrency "
    "--prompt-concurrency\n"
    "  --prompt-cache-size --pipeline\n"
    "  See docs/server.md.";

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

/* "16M", "64K", "1G", "1048576": bytes (binary units, as limits usually are).
 */
static int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || s[0] == '-') return -1;
    unsigned long long mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1ull << 30, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end || v > SIZE_MAX / mult) return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end) return -1;
    *out = v;
    return 0;
}

/* An HLG shape value: a number of nats from 0 to 10000. */
static int parse_nats(const char *s, float *out) {
    return parse_float(s, out) || !(*out >= 0 && *out <= 1e4) ? -1 : 0;
}

static int parse_origins(const char *list, srv_config *c) {
    char *copy = strdup(list);
    if (!copy) return -1;
    size_t n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    c->origins = calloc(n, sizeof *c->origins);
    c->n_origins = 0;
    c->origins_any = 0;
    for (char *tok = strtok(copy, ","); tok && c->origins; tok = strtok(NULL, ",")) {
        while (*tok == ' ') tok++;
        if (!strcmp(tok, "*")) c->origins_any = 1;
        c->origins[c->n_origins++] = strdup(tok);
    }
    free(copy);
    return c->origins ? 0 : -1;
}

static int parse_log_level(const char *s, srv_log_level *out) {
    static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"};
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(s, names[i])) {
            *out = (srv_log_level)i;
            return 0;
        }
    return -1;
}

/* Flags of mlx_lm.server that take a value and that hearth accepts without acting on
 * them: why, for the warning. */
#define NOT_YET "is not supported yet"
static const struct {
    const char *flag, *why;
} unsupported_valued[] = {
    {"--decode-concurrency", NOT_YET},
    {"--prompt-concurrency", NOT_YET},
    {"--prompt-cache-size", NOT_YET},
    {"--kv-group-size", "has no use: the int8 KV cache keeps one scale per position and KV head"},
    {"--quantized-kv-start", "has no use: a quantized KV cache (--kv-bits, --kv-quant) quantizes every position"},
};
static const char *const unsupported_switches[] = {"--trust-remote-code", "--use-default-chat-template", "--pipeline"};

typedef struct serve_opts {
    srv_config cfg;
    hearth_engine_options eo;
    const char *chat_template;
    const char *template_args;
    int open_browser;            /* --open (what `hearth` with no arguments passes); --no-open wins */
    const char *embedding_model; /* --embedding-model: served at /v1/embeddings beside the chat model */
    const char *draft_model;     /* --draft-model: speculative decoding's draft */
    int memory;                  /* --memory: the /v1/memory routes and the chat page's memory panel */
    int memory_log;              /* --memory-log: chats are logged into the memory vault (implies --memory) */
    const char *memory_vault;    /* --memory-vault: that vault (default: hearth memory's) */
    int prompt_cache_bytes_set;
    char *adapters[64];          /* --adapter / --adapter-path as "id=path" */
    char adapter_default[256];   /* --adapter-path's id, or a bare --adapter DIR's */
} serve_opts;

/* --adapter-path DIR (the default adapter, mlx_lm.server's flag), --adapter DIR (the same),
 * --adapter id=DIR (mounted, requests name it): kept as "id=path". */
static int add_adapter(serve_opts *o, const char *v, int make_default) {
    size_t n = o->cfg.n_adapters;
    char id[256];
    const char *path = cli_adapter_id(v, id, sizeof id);
    if (n == sizeof o->adapters / sizeof *o->adapters)
        return cli_usage_error(serve_usage, "too many adapters (at most 64 at start): '%s'", v);
    if (asprintf(&o->adapters[n], "%s=%s", id, path) < 0) return 1;
    if (make_default || !strchr(v, '=')) snprintf(o->adapter_default, sizeof o->adapter_default, "%s", id);
    o->cfg.n_adapters = n + 1;
    return 0;
}

/* Splits --name=value so both argparse spellings work; returns the value or
 * NULL. */
static const char *flag_value(int argc, char **argv, int *i, const char *name, char *namebuf, size_t cap) {
    const char *a = argv[*i], *eq = strchr(a, '=');
    if (eq && (size_t)(eq - a) < cap) {
        memcpy(namebuf, a, (size_t)(eq - a));
        namebuf[eq - a] = 0;
        return strcmp(namebuf, name) ? NULL : eq + 1;
    }
    if (strcmp(a, name) || *i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int parse_args(int argc, char **argv, serve_opts *o) {
    srv_config *c = &o->cfg;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        char nb[64];
        long n;
        if (cli_is_help(a)) {
            printf("usage: %s\n", serve_usage);
            exit(0);
        }
        if (cli_parse_engine_flag(argc, argv, &i, &o->eo)) continue;
        int rc;
        if (cli_parse_pool_flag(argc, argv, &i, &o->eo, serve_usage, &rc)) {
            if (rc) return rc;
            continue;
        }
#define VAL(name) (v = flag_value(argc, argv, &i, name, nb, sizeof nb))
#define BADV(name) return cli_usage_error(serve_usage, name ": invalid value '%s'", v)
        if (!strcmp(a, "--open") || !strcmp(a, "--no-open"))
            o->open_browser = a[2] == 'o';
        else if (VAL("--model"))
            c->model_arg = v;
        else if (a[0] != '-' && !c->model_arg) /* hearth serve <model> */
            c->model_arg = a;
        else if (VAL("--embedding-model"))
            o->embedding_model = v;
        else if (VAL("--draft-model"))
            o->draft_model = v;
        else if (VAL("--num-draft-tokens")) {
            if (cli_parse_long(v, 0, INT_MAX, &n)) BADV("--num-draft-tokens");
            c->defaults.num_draft_tokens = (int)n;
        }
        else if (!strcmp(a, "--memory-log"))
            o->memory_log = 1;
        else if (!strcmp(a, "--memory"))
            o->memory = 1;
        else if (VAL("--memory-vault"))
            o->memory_vault = v;
        else if (VAL("--adapter-path") || VAL("--adapter")) {
            if (add_adapter(o, v, !strncmp(a, "--adapter-path", 14))) return 1;
        }
        else if (VAL("--host"))
            c->host = v;
        else if (VAL("--port")) {
            if (cli_parse_long(v, 0, 65535, &n)) BADV("--port");
            c->port = (int)n;
        } else if (VAL("--max-tokens")) {
            if (cli_parse_long(v, 0, INT_MAX, &n)) BADV("--max-tokens");
            c->defaults.max_tokens = (int)n;
        } else if (VAL("--temp")) {
            if (parse_float(v, &c->defaults.temperature)) BADV("--temp");
        } else if (VAL("--top-p")) {
            if (parse_float(v, &c->defaults.top_p)) BADV("--top-p");
        } else if (VAL("--min-p")) {
            if (parse_float(v, &c->defaults.min_p)) BADV("--min-p");
        } else if (VAL("--top-k")) {
            if (cli_parse_long(v, 0, INT_MAX, &n)) BADV("--top-k");
            c->defaults.top_k = (int)n;
        } else if (VAL("--hlg-sampling")) {
            if (strcmp(v, "on") && strcmp(v, "off")) BADV("--hlg-sampling");
            c->defaults.hlg.enabled = !strcmp(v, "on");
        } else if (VAL("--hlg-width")) {
            if (parse_nats(v, &c->defaults.hlg.width)) BADV("--hlg-width");
        } else if (VAL("--hlg-shoulder")) {
            if (parse_nats(v, &c->defaults.hlg.shoulder)) BADV("--hlg-shoulder");
        } else if (VAL("--hlg-toe")) {
            if (parse_nats(v, &c->defaults.hlg.toe)) BADV("--hlg-toe");
        } else if (VAL("--hlg-pivot-offset")) {
            if (parse_nats(v, &c->defaults.hlg.pivot_offset)) BADV("--hlg-pivot-offset");
        } else if (VAL("--chat-template"))
            o->chat_template = v;
        else if (VAL("--chat-template-args"))
            o->template_args = v;
        else if (VAL("--allowed-origins")) {
            if (parse_origins(v, c)) BADV("--allowed-origins");
        } else if (VAL("--log-level")) {
            if (parse_log_level(v, &c->log_level)) BADV("--log-level");
        } else if (VAL("--api-key"))
            c->api_key = v[0] ? v : NULL;
        else if (VAL("--max-body")) {
            if (parse_size(v, &c->max_body)) BADV("--max-body");
        } else if (VAL("--max-header")) {
            if (parse_size(v, &c->max_header) || c->max_header < 4096) BADV("--max-header");
        } else if (VAL("--timeout")) {
            if (cli_parse_long(v, 0, INT_MAX, &n)) BADV("--timeout");
            c->timeout_s = (unsigned)n;
        } else if (VAL("--header-timeout")) {
            if (cli_parse_long(v, 1, INT_MAX, &n)) BADV("--header-timeout");
            c->header_timeout_s = (unsigned)n;
        } else if (VAL("--max-connections")) {
            if (cli_parse_long(v, 1, 65535, &n)) BADV("--max-connections");
            c->max_connections = (unsigned)n;
        } else if (VAL("--responses-ttl")) {
            if (cli_parse_long(v, 0, INT_MAX, &n)) BADV("--responses-ttl");
            c->responses_ttl_s = (unsigned)n;
        } else if (VAL("--responses-max-bytes")) {
            if (parse_size(v, &c->responses_max_bytes)) BADV("--responses-max-bytes");
        } else if (VAL("--prompt-cache-dir")) {
            c->prompt_cache_dir = v;
        } else if (VAL("--train-dir")) {
            c->train_dir = v;
        } else if (VAL("--prompt-cache-bytes")) {
            if (parse_size(v, &c->prompt_cache_bytes) || !c->prompt_cache_bytes) BADV("--prompt-cache-bytes");
            o->prompt_cache_bytes_set = 1;
        } else if (VAL("--kv-bits")) { /* mlx-lm's quantized KV: int8 is the nearest hearth has */
            if (cli_parse_long(v, 2, 8, &n) || n == 7) BADV("--kv-bits");
            o->eo.kv_quant = HEARTH_KV_INT8;
            if (n < 8)
                fprintf(stderr,
                        "hearth serve: warning: no %ld-bit KV cache in hearth; --kv-bits %ld stores int8 "
                        "(--kv-quant int8), the nearest it has\n",
                        n, n);
        } else {
            int known = 0;
            for (size_t k = 0; k < sizeof unsupported_valued / sizeof *unsupported_valued && !known; k++)
                if (VAL(unsupported_valued[k].flag)) {
                    fprintf(stderr, "hearth serve: warning: %s %s; '%s' is ignored\n", unsupported_valued[k].flag,
                            unsupported_valued[k].why, v);
                    known = 1;
                }
            for (size_t k = 0; k < sizeof unsupported_switches / sizeof *unsupported_switches && !known; k++)
                if (!strcmp(a, unsupported_switches[k])) {
                    fprintf(stderr, "hearth serve: warning: %s is not supported yet; ignored\n", a);
                    known = 1;
                }
            if (!known) return cli_usage_error(serve_usage, "%s: unknown flag, or a flag without its value", a);
        }
#undef VAL
#undef BADV
    }
    return 0;
}

int cli_serve_check_args(int argc, char **argv) {
    serve_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    for (size_t i = 0; i < o.cfg.n_adapters; i++) free(o.adapters[i]);
    return rc;
}

int cli_serve(int argc, char **argv) {
    serve_opts o = {.cfg = {.host = "127.0.0.1",
                            .port = 8080,
                            .max_body = 16u << 20,
                            .max_header = 64u << 10,
                            .timeout_s = 300,
                            .header_timeout_s = 10, /* a client sends its head in one go: seconds are plenty */
                            .max_connections = 256,
                            .log_level = SRV_LOG_INFO,
                            .responses_ttl_s = 3600,          /* an hour: long enough for an agent's session */
                            .responses_max_bytes = 64u << 20, /* bounds the store on a small machine */
                            /* a few hundred long conversations of a small model's float KV */
                            .prompt_cache_bytes = 4ull << 30,
                            .defaults = {.max_tokens = 512, .top_p = 1.0f, .num_draft_tokens = 3,
                                         /* the seed's HLG shape (nats), off until --hlg-sampling on */
                                         .hlg = {.width = 4, .shoulder = 4, .toe = 6, .pivot_offset = 6}}}};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    if (!o.eo.max_sequences) o.eo.max_sequences = HEARTH_SERVE_MAX_SEQUENCES;
    srv_config *c = &o.cfg;
    if (o.prompt_cache_bytes_set && !c->prompt_cache_dir)
        fprintf(stderr, "hearth serve: warning: --prompt-cache-bytes bounds the --prompt-cache-dir folder and is "
                        "ignored without it (the in-memory prefix cache is the KV pool: --kv-blocks, --kv-budget)\n");
    c->adapters = (const char *const *)o.adapters;
    if (o.adapter_default[0]) c->default_adapter = o.adapter_default;
    if (!c->origins && parse_origins("*", c)) return 1;
    json_t *targs = NULL;
    if (o.template_args) {
        json_error_t je;
        targs = json_loads(o.template_args, 0, &je);
        if (!json_is_object(targs))
            return cli_usage_error(serve_usage, "--chat-template-args must be a JSON object: '%s'", o.template_args);
    }
    c->defaults.chat_template_args = targs;
    hearth_error err = {0};
    const char *name = c->model_arg ? c->model_arg : SERVE_DEFAULT_MODEL;
    hearth_model *model, *embedding_model = NULL;
    if (cli_open_model(name, &model)) return 1;
    if (o.chat_template && o.chat_template[0] && hearth_model_set_chat_template(model, o.chat_template, &err))
        return cli_fail(&err);
    if (o.embedding_model && cli_open_model(o.embedding_model, &embedding_model)) return 1;
    hearth_model *draft_model = NULL;
    if (o.draft_model && cli_open_model(o.draft_model, &draft_model)) return 1;
    o.eo.draft_model = draft_model;
    if (o.memory || o.memory_log) { /* BM25 only: serve keeps its cores for the model */
        hearth_memory_options mo = {.path = o.memory_vault};
        if (hearth_memory_open(&mo, &c->memory, &err)) return cli_fail(&err);
        c->memory_vault = o.memory_vault;
        if (o.memory_log) c->memory_log = c->memory;
    }
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up must not end the server */
    srv_server *s;
    if (srv_open(c, model, embedding_model, &o.eo, &s, &err)) {
        srv_close(s);
        return cli_fail(&err);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fprintf(stderr, "hearth serve: listening on http://%s%s%s:%d/v1\n", strchr(c->host, ':') ? "[" : "", c->host,
            strchr(c->host, ':') ? "]" : "", c->port);
    /* 0.0.0.0 and :: are not addresses a browser can open; loopback reaches them */
    const char *page_host = !strcmp(c->host, "0.0.0.0") ? "127.0.0.1" : !strcmp(c->host, "::") ? "::1" : c->host;
    char page[320];
    snprintf(page, sizeof page, "http://%s%s%s:%d/#/chat", strchr(page_host, ':') ? "[" : "", page_host,
             strchr(page_host, ':') ? "]" : "", c->port);
    fprintf(stderr, "hearth serve: chat page at %s\n", page);
    if (o.open_browser) cli_open_browser(page);
    while (!stop_requested) pause();
    srv_log(s, SRV_LOG_INFO, "shutting down");
    srv_close(s);
    hearth_memory_close(c->memory);
    json_decref(targs);
    for (size_t i = 0; i < c->n_origins; i++) free(c->origins[i]);
    free(c->origins);
    for (size_t i = 0; i < c->n_adapters; i++) free(o.adapters[i]);
    return 0;
}
