/* harness.c: `hearth harness pi|claude|codex [--base-url URL] [--model M] [--remove]`:
 * points a coding agent at a hearth server by editing the configuration file it reads,
 * and takes the edit back. Everything else in the user's file is kept: JSON files are
 * rewritten with their keys in order (2-space indent), Codex's TOML is edited as text
 * inside marker lines. What a write replaced is kept in $HOME/.config/hearth/harness.json
 * so --remove restores it. The context offered to the agent comes from hearth_fit. */
#define _GNU_SOURCE
#include "base/file.h"
#include "base/user_dirs.h"
#include "cli/cli.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *harness_usage =
    "hearth harness pi|claude|codex [--base-url http://127.0.0.1:8080] [--model M] [--ctx N] [--remove]";

#define HARNESS_DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1" /* serve's default */
/* Agents send long system prompts and tool lists; below this they fail early. */
#define AGENT_MIN_CONTEXT 32768
#define TOML_BEGIN "# >>> hearth harness (hearth harness codex --remove takes this block out) >>>\n"
#define TOML_END "# <<< hearth harness <<<\n"

typedef struct harness {
    const char *agent, *base_url, *model_id;
    int ctx;
    char path[4096];  /* the agent's config file */
    char state[4096]; /* $HOME/.config/hearth/harness.json */
} harness;

static int fail_msg(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "hearth harness: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

/* The JSON object in path ({} when the file does not exist: *existed 0); NULL after
 * saying why. */
static json_t *load_object(const char *path, int *existed) {
    FILE *f = fopen(path, "r");
    if (existed) *existed = f != NULL;
    if (!f) {
        if (errno == ENOENT) return json_object();
        fail_msg("%s: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadf(f, 0, &je);
    fclose(f);
    if (!json_is_object(j)) {
        char where[64];
        snprintf(where, sizeof where, "line %d", je.line);
        fail_msg(j ? "%s: not a JSON object; left unchanged (%s)" : "%s: not valid JSON, left unchanged (%s)", path,
                 j ? "top level" : where);
        json_decref(j);
        return NULL;
    }
    return j;
}

/* path's new text, written whole or not at all (its folder made first) */
static int write_text(const char *path, const char *text) {
    if (file_mkdirs_parent(path)) return fail_msg("%s: cannot create its folder (%s)", path, strerror(errno));
    if (file_write_atomic(path, text, strlen(text))) return fail_msg("%s: cannot write (%s)", path, strerror(errno));
    return 0;
}

static int save_object(const char *path, json_t *j) {
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *line = NULL;
    int rc = text && asprintf(&line, "%s\n", text) >= 0 ? write_text(path, line) : fail_msg("%s: %s", path, "out of memory");
    free(text);
    free(line);
    return rc;
}

static int remove_file(const char *path) {
    return remove(path) && errno != ENOENT ? fail_msg("%s: cannot remove (%s)", path, strerror(errno)) : 0;
}

/* The saved previous values of one agent: state[agent] (created when create). */
static json_t *agent_state(json_t *state, const char *agent, int create) {
    json_t *a = json_object_get(state, agent);
    if (!a && create) json_object_set_new(state, agent, a = json_object());
    return a;
}

/* Sets obj[key] = value, remembering in saved[key] what was there (null: nothing) unless
 * an earlier write remembered it already. Steals value. */
static void set_remembering(json_t *obj, const char *key, json_t *value, json_t *saved) {
    if (!json_object_get(saved, key)) {
        json_t *old = json_object_get(obj, key);
        json_object_set_new(saved, key, old ? json_deep_copy(old) : json_null());
    }
    json_object_set_new(obj, key, value);
}

/* Puts back every remembered key of obj (deleting those that were absent). */
static void restore(json_t *obj, json_t *saved) {
    const char *key;
    json_t *old;
    json_object_foreach(saved, key, old) {
        if (json_is_null(old))
            json_object_del(obj, key);
        else
            json_object_set(obj, key, old);
    }
}

/* ---- pi: a provider in ~/.pi/agent/models.json ------------------------------------ */

static json_t *pi_provider(const harness *h) {
    char url[1024], name[512];
    snprintf(url, sizeof url, "%s/v1", h->base_url);
    snprintf(name, sizeof name, "%s (hearth)", h->model_id);
    return json_pack("{s:s, s:s, s:s, s:{s:b, s:b}, s:[{s:s, s:s, s:b, s:[s], s:i, s:i, s:{s:i, s:i, s:i, s:i}}]}",
                     "baseUrl", url, "api", "openai-completions", "apiKey", "hearth", "compat", "supportsDeveloperRole",
                     0, "supportsReasoningEffort", 0, "models", "id", h->model_id, "name", name, "reasoning", 0,
                     "input", "text", "contextWindow", h->ctx, "maxTokens", h->ctx / 4 < 16384 ? h->ctx / 4 : 16384,
                     "cost", "input", 0, "output", 0, "cacheRead", 0, "cacheWrite", 0);
}

static int edit_pi(const harness *h, json_t *cfg, json_t *saved, int take_back) {
    json_t *providers = json_object_get(cfg, "providers");
    if (take_back) {
        json_t *was = json_object_get(saved, "providers");
        if (providers) restore(providers, json_object_get(saved, "provider_entries"));
        if (providers && json_object_size(providers) == 0 && json_is_null(was)) json_object_del(cfg, "providers");
        return 0;
    }
    if (providers && !json_is_object(providers)) return fail_msg("%s: \"providers\" is not an object%s", h->path, "");
    if (!json_object_get(saved, "providers"))
        json_object_set_new(saved, "providers", providers ? json_true() : json_null());
    if (!providers) json_object_set_new(cfg, "providers", providers = json_object());
    json_t *entries = json_object_get(saved, "provider_entries");
    if (!entries) json_object_set_new(saved, "provider_entries", entries = json_object());
    set_remembering(providers, "hearth", pi_provider(h), entries);
    return 0;
}

/* ---- Claude Code: env variables in ~/.claude/settings.json ------------------------- */

static int edit_claude(const harness *h, json_t *cfg, json_t *saved, int take_back) {
    json_t *env = json_object_get(cfg, "env");
    if (take_back) {
        if (env) restore(env, json_object_get(saved, "env_entries"));
        if (env && json_object_size(env) == 0 && json_is_null(json_object_get(saved, "env")))
            json_object_del(cfg, "env");
        return 0;
    }
    if (env && !json_is_object(env)) return fail_msg("%s: \"env\" is not an object%s", h->path, "");
    if (!json_object_get(saved, "env")) json_object_set_new(saved, "env", env ? json_true() : json_null());
    if (!env) json_object_set_new(cfg, "env", env = json_object());
    json_t *entries = json_object_get(saved, "env_entries");
    if (!entries) json_object_set_new(saved, "env_entries", entries = json_object());
    /* the SDK appends /v1/messages itself; a token must be present (any value without --api-key) */
    set_remembering(env, "ANTHROPIC_BASE_URL", json_string(h->base_url), entries);
    set_remembering(env, "ANTHROPIC_AUTH_TOKEN", json_string("hearth"), entries);
    static const char *model_vars[] = {"ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                                       "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                       "ANTHROPIC_SMALL_FAST_MODEL"};
    for (size_t i = 0; i < sizeof model_vars / sizeof *model_vars; i++)
        set_remembering(env, model_vars[i], json_string(h->model_id), entries);
    set_remembering(env, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", json_string("1"), entries);
    return 0;
}

/* ---- Codex: TOML tables inside marker lines in ~/.codex/config.toml ---------------- */

/* the file's text ("" when it does not exist), NULL when it cannot be read */
static char *read_text(const char *path) {
    if (!file_exists(path)) return strdup("");
    char *buf = NULL;
    size_t n;
    return file_read_all(path, &buf, &n, NULL) ? NULL : buf;
}

/* text without our marked block (a copy) */
static char *without_block(const char *text) {
    const char *b = strstr(text, TOML_BEGIN), *e = b ? strstr(b, TOML_END) : NULL;
    if (!b || !e) return strdup(text);
    e += strlen(TOML_END);
    char *out = NULL;
    /* the blank line the write put before the block goes too */
    size_t head = (size_t)(b - text);
    if (head >= 1 && text[head - 1] == '\n' && (head == 1 || text[head - 2] == '\n')) head--;
    if (asprintf(&out, "%.*s%s", (int)head, text, e) < 0) return NULL;
    return out;
}

/* Whether text (outside our block) defines one of our tables already. */
static const char *user_table(const char *text) {
    static const char *tables[] = {"[model_providers.hearth]", "[profiles.hearth]"};
    for (size_t i = 0; i < 2; i++)
        for (const char *p = strstr(text, tables[i]); p; p = strstr(p + 1, tables[i]))
            if (p == text || p[-1] == '\n') return tables[i];
    return NULL;
}

static int edit_codex(const harness *h, int take_back, int created) {
    char *text = read_text(h->path);
    if (!text) return fail_msg("%s: %s", h->path, strerror(errno));
    char *rest = without_block(text);
    free(text);
    if (!rest) return fail_msg("%s: %s", h->path, "out of memory");
    const char *clash = take_back ? NULL : user_table(rest);
    if (clash) {
        free(rest);
        return fail_msg("%s: already defines %s outside hearth's block; left unchanged", h->path, clash);
    }
    if (take_back && created && !rest[0]) { /* the write created the file: it goes again */
        free(rest);
        return remove_file(h->path);
    }
    char *out = NULL;
    size_t n = strlen(rest);
    int ok = take_back ? (out = strdup(rest)) != NULL
                       : asprintf(&out,
                                  "%s%s%s" TOML_BEGIN "[model_providers.hearth]\nname = \"hearth\"\nbase_url = \"%s/v1\"\n"
                                  "wire_api = \"responses\"\n\n"
                                  "# codex --profile hearth\n[profiles.hearth]\nmodel_provider = \"hearth\"\n"
                                  "model = \"%s\"\nmodel_context_window = %d\n" TOML_END,
                                  rest, n && rest[n - 1] != '\n' ? "\n" : "", n ? "\n" : "", h->base_url, h->model_id,
                                  h->ctx) >= 0;
    free(rest);
    int rc = ok ? write_text(h->path, out) : fail_msg("%s: %s", h->path, "out of memory");
    free(out);
    return rc;
}

/* ---- the context to offer: fit's largest that fits, capped by the model ------------- */

static int choose_context(hearth_model *m, int asked, int *ctx) {
    if (asked > 0) {
        *ctx = asked;
        return 0;
    }
    /* an agent and its side requests (titles, summaries): two sequences at once */
    hearth_fit_options fo = {.engine = {.max_sequences = 2, .context_length = 1 << 20}};
    char *report = NULL;
    hearth_error err = {0};
    if (hearth_fit(m, &fo, &report, &err)) return cli_fail(&err);
    json_t *j = json_loads(report, 0, NULL);
    hearth_free(report);
    int model_max = (int)json_integer_value(json_object_get(j, "model_max_context"));
    int fits = (int)json_integer_value(json_object_get(j, "max_context_that_fits"));
    json_decref(j);
    *ctx = fits > 0 && (model_max <= 0 || fits < model_max) ? fits : model_max;
    if (*ctx <= 0) *ctx = AGENT_MIN_CONTEXT;
    return 0;
}

int cli_harness(int argc, char **argv) {
    harness h = {.base_url = "http://127.0.0.1:8080"};
    const char *model = NULL;
    int take_back = 0;
    long ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) {
            printf("usage: %s\n", harness_usage);
            return 0;
        }
        if (!strcmp(a, "--remove"))
            take_back = 1;
        else if (!strcmp(a, "--base-url") && has)
            h.base_url = argv[++i];
        else if (!strcmp(a, "--model") && has)
            model = argv[++i];
        else if (!strcmp(a, "--ctx") && has) {
            if (cli_parse_long(argv[++i], 1024, 1 << 24, &ctx))
                return cli_usage_error(harness_usage, "--ctx %s: a number of tokens, at least 1024", argv[i]);
        } else if (a[0] == '-')
            return cli_usage_error(harness_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!h.agent)
            h.agent = a;
        else
            return cli_usage_error(harness_usage, "%s: unexpected argument", a);
    }
    if (!h.agent || (strcmp(h.agent, "pi") && strcmp(h.agent, "claude") && strcmp(h.agent, "codex")))
        return cli_usage_error(harness_usage, "%s: the agent is pi, claude or codex", h.agent ? h.agent : "(none)");
    char url[1024];
    snprintf(url, sizeof url, "%s", h.base_url); /* no trailing slash, no /v1: each agent adds its own path */
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') url[--n] = 0;
    if (n >= 3 && !strcmp(url + n - 3, "/v1")) url[n -= 3] = 0;
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return cli_usage_error(harness_usage, "--base-url %s: an http:// or https:// URL", h.base_url);
    h.base_url = url;
    char *home_path = user_path(NULL, USER_HOME, NULL);
    if (!home_path) return fail_msg("%s%s", "HOME is not set", "");
    char home[2048];
    snprintf(home, sizeof home, "%s", home_path);
    free(home_path);
    snprintf(h.path, sizeof h.path, "%s/%s", home,
             !strcmp(h.agent, "pi")       ? ".pi/agent/models.json"
             : !strcmp(h.agent, "claude") ? ".claude/settings.json"
                                          : ".codex/config.toml");
    snprintf(h.state, sizeof h.state, "%s/.config/hearth/harness.json", home);
    json_t *state = load_object(h.state, NULL);
    if (!state) return 1;
    char model_id[512] = "";
    hearth_model *m = NULL;
    if (!take_back) {
        if (cli_open_model(model ? model : HARNESS_DEFAULT_MODEL, &m)) {
            json_decref(state);
            return 1;
        }
        const char *path = hearth_model_path(m), *base = strrchr(path, '/');
        snprintf(model_id, sizeof model_id, "%s", base ? base + 1 : path); /* what the server matches */
        size_t k = strlen(model_id);
        if (k > 5 && !strcmp(model_id + k - 5, ".gguf")) model_id[k - 5] = 0;
        h.model_id = model_id;
        int rc = choose_context(m, (int)ctx, &h.ctx);
        if (rc) {
            hearth_model_close(m);
            json_decref(state);
            return rc;
        }
    }
    int rc = 0;
    if (!strcmp(h.agent, "codex")) {
        json_t *was = json_object_get(state, "codex");
        struct stat sb;
        int created =
            was ? json_is_object(was) && json_is_false(json_object_get(was, "file_existed")) : stat(h.path, &sb) != 0;
        rc = edit_codex(&h, take_back, created);
        if (!rc && !take_back && !was)
            json_object_set_new(state, "codex", json_pack("{s:b}", "file_existed", !created));
    } else {
        int existed;
        json_t *cfg = load_object(h.path, &existed);
        if (!cfg)
            rc = 1;
        else if (take_back && !json_object_get(state, h.agent))
            rc = 0; /* nothing of ours to take back */
        else {
            json_t *saved = agent_state(state, h.agent, !take_back);
            if (!take_back && !json_object_get(saved, "file_existed"))
                json_object_set_new(saved, "file_existed", json_boolean(existed));
            rc = !strcmp(h.agent, "pi") ? edit_pi(&h, cfg, saved, take_back) : edit_claude(&h, cfg, saved, take_back);
            /* a file the write created goes again when nothing else was put in it since */
            if (!rc && take_back && json_object_size(cfg) == 0 && json_is_false(json_object_get(saved, "file_existed")))
                rc = remove_file(h.path);
            else if (!rc)
                rc = save_object(h.path, cfg);
        }
        json_decref(cfg);
    }
    if (!rc) {
        if (take_back) json_object_del(state, h.agent);
        rc = save_object(h.state, state);
    }
    if (!rc && take_back)
        printf("%s: hearth's settings removed\n", h.path);
    else if (!rc) {
        printf("%s: %s now uses hearth at %s (model %s, context %d)\n", h.path, h.agent, h.base_url, model_id, h.ctx);
        if (h.ctx < AGENT_MIN_CONTEXT)
            printf("warning: a context of %d tokens (%s); agents need %d or more\n", h.ctx,
                   "the most this model and machine allow", AGENT_MIN_CONTEXT);
        printf("start the server with:  hearth serve --model %s --ctx %d --max-sequences 2\n",
               model ? model : HARNESS_DEFAULT_MODEL, h.ctx);
        if (!strcmp(h.agent, "codex")) printf("then run:  codex --profile hearth\n");
        /* pi's models.json holds a fixed list (no live /v1/models query for such providers) */
        if (!strcmp(h.agent, "pi"))
            printf("note: pi keeps a fixed model list (%s); after serving another model run:  hearth harness pi "
                   "--model M\n",
                   model_id);
    }
    hearth_model_close(m);
    json_decref(state);
    return rc;
}
