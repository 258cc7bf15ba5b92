/* memory_synth.c: the model behind `hearth memory synthesize` and its stage workers: a
 * local model run by hearth (greedy, through its chat template, decoding under the stage's
 * JSON Schema so even a small model answers valid JSON), or `cmd:<command>`, an external
 * program that gets the prompt on stdin, the stage as its last argument and the schema's
 * file in HEARTH_MEMORY_SCHEMA, and answers on stdout (any other LLM runner; the tests'
 * scripted model). */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every answer's length is capped by its schema (lists and strings have maximums), so the
 * grammar ends it; this only guards against a runaway (the context's end stops it too). */
#define SYNTH_MAX_TOKENS 8192

typedef struct synth_model {
    const char *cmd; /* cmd: runner, else NULL */
    hearth_model *model;
    hearth_engine *engine;
} synth_model;

/* A temporary file holding text; its path in path (a mkstemp template). */
static int temp_file(char *path, const char *text) {
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    if (!ok) unlink(path);
    return !ok;
}

static char *run_cmd(const char *cmd, const char *stage, const char *prompt, const char *schema) {
    char tmp[] = "/tmp/hearth-memory-prompt-XXXXXX", schema_tmp[] = "/tmp/hearth-memory-schema-XXXXXX";
    if (temp_file(tmp, prompt)) return NULL;
    if (temp_file(schema_tmp, schema)) {
        unlink(tmp);
        return NULL;
    }
    size_t n = strlen(cmd) + strlen(tmp) + strlen(schema_tmp) + strlen(stage) + 48;
    char *full = malloc(n);
    FILE *p = NULL;
    if (full) {
        snprintf(full, n, "HEARTH_MEMORY_SCHEMA='%s' %s %s < '%s'", schema_tmp, cmd, stage, tmp);
        p = popen(full, "r");
    }
    char *out = NULL;
    if (p) {
        size_t cap = 0, got = 0;
        char buf[4096];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, p)) > 0) {
            if (got + r + 1 > cap) {
                cap = (got + r + 1) * 2;
                char *grown = realloc(out, cap);
                if (!grown) break;
                out = grown;
            }
            memcpy(out + got, buf, r);
            got += r;
            out[got] = 0;
        }
        if (pclose(p) != 0) { /* the runner failed: the run stops */
            free(out);
            out = NULL;
        } else if (!out)
            out = strdup("");
    }
    unlink(tmp);
    unlink(schema_tmp);
    free(full);
    return out;
}

typedef struct collect {
    char *text;
    size_t len;
} collect;

static int on_token(void *user, int32_t token, const char *text, const hearth_logprobs *lp) {
    collect *c = user;
    size_t n = strlen(text);
    char *grown = realloc(c->text, c->len + n + 1);
    if (!grown) return 1;
    c->text = grown;
    memcpy(c->text + c->len, text, n + 1);
    c->len += n;
    return 0;
}

static char *run_model(synth_model *s, const char *prompt, const char *schema) {
    char *messages = NULL, *rendered = NULL;
    hearth_error err = {0};
    /* the prompt as one user message: escaped through the JSON writer hearth.h has */
    size_t n = strlen(prompt) * 6 + 64;
    messages = malloc(n);
    if (!messages) return NULL;
    size_t o = (size_t)snprintf(messages, n, "[{\"role\":\"user\",\"content\":\"");
    for (const char *p = prompt; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(messages + o, n - o, "\\%c", c);
        else if (c < 0x20)
            o += (size_t)snprintf(messages + o, n - o, "\\u%04x", c);
        else
            messages[o++] = (char)c;
    }
    snprintf(messages + o, n - o, "\"}]");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    collect c = {NULL, 0};
    hearth_generate_params gp = {.max_tokens = SYNTH_MAX_TOKENS,
                                 .constraint = HEARTH_CONSTRAINT_JSON_SCHEMA,
                                 .constraint_text = schema,
                                 .constraint_len = strlen(schema)}; /* zeroed sampling: greedy */
    hearth_generate_result res;
    if (hearth_chat_render(s->model, messages, NULL, 1, NULL, &rendered, &err) ||
        hearth_tokenize(s->model, rendered, strlen(rendered), 0, &ids, &n_ids, &err) ||
        hearth_generate(s->engine, ids, n_ids, &gp, on_token, &c, &res, &err)) {
        fprintf(stderr, "hearth: memory: the model failed: %s\n", err.message);
        free(c.text);
        c.text = NULL;
    }
    free(messages);
    hearth_free(rendered);
    hearth_free(ids);
    return c.text ? c.text : NULL;
}

static int llm(void *user, const char *stage, const char *prompt, const char *schema, char **answer) {
    synth_model *s = user;
    *answer = s->cmd ? run_cmd(s->cmd, stage, prompt, schema) : run_model(s, prompt, schema);
    return *answer ? 0 : 1;
}

int cli_memory_synthesize(hearth_memory *m, const char *stage, const char *model, const char *since, int limit,
                          int dry_run, int threads) {
    synth_model s = {0};
    hearth_error err = {0};
    if (!dry_run && model && !strncmp(model, "cmd:", 4))
        s.cmd = model + 4;
    else if (!dry_run && (!stage || strcmp(stage, "link"))) {
        if (!model) {
            fprintf(stderr, "hearth: memory: synthesis needs --model (a local model, or cmd:<program>)\n");
            return 2;
        }
        hearth_engine_options eo = {0};
        eo.n_threads = threads;
        if (cli_open_model(model, &s.model)) return 1;
        if (hearth_engine_create(s.model, &eo, &s.engine, &err)) {
            hearth_model_close(s.model);
            return cli_fail(&err);
        }
    }
    hearth_memory_synth_options o = {
        .stage = stage, .since = since, .limit = limit, .dry_run = dry_run, .llm = llm, .user = &s};
    char *report = NULL;
    hearth_status st = hearth_memory_synthesize(m, &o, &report, &err);
    hearth_engine_free(s.engine);
    hearth_model_close(s.model);
    if (st) return cli_fail(&err);
    puts(report);
    hearth_free(report);
    return 0;
}
