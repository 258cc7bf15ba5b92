/* chat.c: `hearth chat`: an interactive terminal conversation through the model's chat
 * template, with history. Ctrl-C stops the answer being generated, not the program;
 * Ctrl-D or /quit leaves. Works with piped input too (one user turn per line). */
#include "cli/cli.h"
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *chat_usage =
    "hearth chat <model> [--system TEXT] [--max-tokens N] [--temp T] [--top-p P] [--seed S] [--threads N] [--ctx N]\n"
    "       [--device cpu|cuda|auto] [--kv-quant none|int8|fp8|f16] [--deterministic] [--cuda-exact] [--expert-offload "
    "N] [--host-sampler]\n"
    "       [--speculate lookup|suffix|mtp|none] [--draft-model M] [--num-draft-tokens N]\n"
    "  in the conversation: /reset forgets it, /system TEXT sets the system prompt, /quit leaves";

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

typedef struct turn_state { char *text; size_t len, cap; } turn_state;

static int on_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    (void)id; (void)lp;
    turn_state *t = user;
    size_t n = strlen(text);
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *p = realloc(t->text, cap);
        if (!p) return 1;
        t->text = p;
        t->cap = cap;
    }
    memcpy(t->text + t->len, text, n + 1);
    t->len += n;
    fputs(text, stdout);
    fflush(stdout);
    return interrupted; /* Ctrl-C: stop this answer */
}

static char *read_line(FILE *in) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    int c;
    while (s && (c = fgetc(in)) != EOF && c != '\n') {
        if (n + 1 >= cap) {
            char *p = realloc(s, cap *= 2);
            if (!p) { free(s); return NULL; }
            s = p;
        }
        s[n++] = (char)c;
    }
    if (!s || (c == EOF && n == 0)) { free(s); return NULL; }
    s[n] = 0;
    return s;
}

static json_t *fresh_history(const char *system) {
    json_t *h = json_array();
    if (system) json_array_append_new(h, json_pack("{s:s, s:s}", "role", "system", "content", system));
    return h;
}

int cli_chat(int argc, char **argv) {
    const char *model = NULL;
    char *system = NULL;
    hearth_engine_options eo = {0};
    cli_spec spec = {0};
    hearth_generate_params gp = {.max_tokens = 1024};
    float temp = -1, top_p = -1;
    long long seed = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) { printf("usage: %s\n", chat_usage); return 0; }
        int flag_rc;
        if (cli_spec_flag(argc, argv, &i, &spec, &eo, chat_usage, &flag_rc)) {
            if (flag_rc) { free(system); return flag_rc; }
            continue;
        }
        if (cli_parse_engine_flag(argc, argv, &i, &eo)) continue;
        if (!strcmp(a, "--system") && has) system = strdup(argv[++i]);
        else if (!strcmp(a, "--max-tokens") && has) gp.max_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--temp") && has) temp = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--top-p") && has) top_p = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--seed") && has) seed = atoll(argv[++i]);
        else if (a[0] == '-') return cli_usage_error(chat_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else return cli_usage_error(chat_usage, "%s: unexpected argument", a);
    }
    if (!model) return cli_usage_error(chat_usage, "%s", "no model given");
    if (gp.max_tokens <= 0) return cli_usage_error(chat_usage, "%s", "--max-tokens must be positive");
    int spec_rc = cli_spec_open(&spec, &eo, NULL, chat_usage);
    if (spec_rc) { free(system); return spec_rc; }
    hearth_model *m;
    if (cli_open_model(model, &m)) { free(system); cli_spec_end(&spec, NULL); return 1; }
    hearth_error err = {0};
    hearth_engine *e = NULL;
    if (hearth_engine_create(m, &eo, &e, &err) || cli_spec_start(&spec, e, &eo)) {
        int fail = e ? 1 : cli_fail(&err);
        free(system);
        cli_spec_end(&spec, e);
        hearth_model_close(m);
        return fail;
    }
    hearth_sampling_defaults(m, &gp.sampling);
    if (temp >= 0) gp.sampling.temperature = temp;
    if (top_p >= 0) gp.sampling.top_p = top_p;
    if (seed >= 0) { gp.sampling.has_seed = 1; gp.sampling.seed = (uint64_t)seed; }
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "hearth chat: %s (Ctrl-C stops an answer, Ctrl-D or /quit leaves)\n", hearth_model_path(m));
    json_t *history = fresh_history(system);
    int rc = 0;
    for (;;) {
        if (tty) { fputs("\n> ", stdout); fflush(stdout); }
        interrupted = 0;
        char *line = read_line(stdin);
        if (!line) break;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) { free(line); break; }
        if (!strcmp(line, "/reset") || !strncmp(line, "/system ", 8)) {
            if (line[1] == 's') { free(system); system = strdup(line + 8); }
            json_decref(history);
            history = fresh_history(system);
            free(line);
            continue;
        }
        if (!line[0]) { free(line); continue; }
        json_array_append_new(history, json_pack("{s:s, s:s}", "role", "user", "content", line));
        free(line);
        char *msgs = json_dumps(history, 0), *prompt = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        turn_state t = {0};
        hearth_generate_result r;
        if (hearth_chat_render(m, msgs, NULL, 1, NULL, &prompt, &err) ||
            hearth_tokenize(m, prompt, strlen(prompt), 0, &ids, &n, &err) ||
            cli_spec_generate(&spec, e, ids, n, &gp, on_token, &t, &r, &err)) {
            fprintf(stderr, "\nhearth: %s\n", err.message); /* the conversation goes on */
            json_array_remove(history, json_array_size(history) - 1);
        } else {
            if (r.finish == HEARTH_FINISH_CANCELLED) fputs(" [stopped]", stdout);
            if (r.finish == HEARTH_FINISH_CONTEXT) fputs(" [context full: /reset to start over]", stdout);
            putchar('\n');
            json_array_append_new(history, json_pack("{s:s, s:s}", "role", "assistant", "content", t.text ? t.text : ""));
        }
        free(t.text);
        free(msgs);
        hearth_free(prompt);
        hearth_free(ids);
    }
    json_decref(history);
    free(system);
    cli_spec_report(&spec); /* over the whole conversation */
    cli_spec_end(&spec, e);
    hearth_model_close(m);
    return rc;
}
