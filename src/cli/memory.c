/* memory.c: `hearth memory`: the personal memory's verbs (init, status, open, list,
 * search, toc, section, links, read, import, reindex) and `hearth memory mcp`, the same
 * read-only tools served over MCP (JSON-RPC 2.0 on stdio) to coding agents. Every verb
 * is a thin printer over hearth_memory_call; the logic lives in the library. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *memory_usage =
    "hearth memory [init|status|open|list|search|toc|section|links|read|import|reindex|synthesize|changes|mcp]\n"
    "  init                         create the vault (or refresh Reference/); idempotent\n"
    "  status                       where the vault is, commits, counts, problems (the default)\n"
    "  open [article]               open the vault (or an article) in Obsidian, else print its path\n"
    "  list [--kind K]              documents: article, conversation, note, reference, talk, meta\n"
    "  search <query> [--limit N] [--kind K]   the best passages and their source\n"
    "  toc <a> | section <a> <anchor> | links <a> | read <a>\n"
    "  import <file|folder>         ChatGPT/Claude conversations.json, Markdown or text files\n"
    "  reindex                      rebuild the search index from the vault's files\n"
    "  synthesize [--model M] [--since YYYY-MM-DD[THH:MM]] [--dry-run] [--limit N]   conversations -> articles\n"
    "  segment|extract|route|synthesize-stage|link [--limit N]   one stage of it (link commits)\n"
    "  changes [--limit N]          what the last N synthesis runs changed (default 1), line by line\n"
    "  schedule --model M [--at 03:00] | unschedule   nightly synthesis (systemd user timer, else cron)\n"
    "  mcp                          serve the read-only memory tools over MCP on stdio\n"
    "flags: --vault PATH (default $HEARTH_WIKI, else $XDG_DATA_HOME/hearth/wiki), --json,\n"
    "  --embed-model M (hybrid search; default all-MiniLM-L6-v2 when found, 'none': BM25 only),\n"
    "  --threads N. See docs/memory.md.";

/* The embedding model hybrid search uses when --embed-model is not given. */
#define MEMORY_DEFAULT_EMBED "all-MiniLM-L6-v2"

typedef struct memory_args {
    const char *verb, *pos[2], *kind, *vault, *embed, *model, *since, *at;
    int n_pos, limit, limit_given, json, threads, embed_given, dry_run;
} memory_args;

static int parse(int argc, char **argv, memory_args *a) {
    memset(a, 0, sizeof *a);
    a->limit = 5;
    a->embed = MEMORY_DEFAULT_EMBED;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        long v;
        if (cli_is_help(s)) {
            puts(memory_usage);
            return 0;
        }
        if (!strcmp(s, "--json"))
            a->json = 1;
        else if (!strcmp(s, "--dry-run"))
            a->dry_run = 1;
        else if ((!strcmp(s, "--limit") || !strcmp(s, "--kind") || !strcmp(s, "--vault") ||
                  !strcmp(s, "--embed-model") || !strcmp(s, "--threads") || !strcmp(s, "--model") ||
                  !strcmp(s, "--since") || !strcmp(s, "--at")) &&
                 i + 1 >= argc)
            return cli_usage_error(memory_usage, "%s needs a value", s);
        else if (!strcmp(s, "--limit")) {
            if (cli_parse_long(argv[++i], 1, 1000, &v))
                return cli_usage_error(memory_usage, "bad --limit '%s'", argv[i]);
            a->limit = (int)v;
            a->limit_given = 1;
        } else if (!strcmp(s, "--model"))
            a->model = argv[++i];
        else if (!strcmp(s, "--since"))
            a->since = argv[++i];
        else if (!strcmp(s, "--at"))
            a->at = argv[++i];
        else if (!strcmp(s, "--threads")) {
            if (cli_parse_long(argv[++i], 0, 1024, &v))
                return cli_usage_error(memory_usage, "%s: needs a whole number of threads", "--threads");
            a->threads = (int)v;
        } else if (!strcmp(s, "--kind"))
            a->kind = argv[++i];
        else if (!strcmp(s, "--vault"))
            a->vault = argv[++i];
        else if (!strcmp(s, "--embed-model")) {
            a->embed = argv[++i];
            a->embed_given = 1;
            if (!strcmp(a->embed, "none")) a->embed = NULL;
        } else if (s[0] == '-' && s[1])
            return cli_usage_error(memory_usage, "%s: unknown flag, or a flag without its value", s);
        else if (!a->verb)
            a->verb = s;
        else if (a->n_pos < 2)
            a->pos[a->n_pos++] = s;
        else
            return cli_usage_error(memory_usage, "unexpected argument '%s'", s);
    }
    if (!a->verb) a->verb = "status";
    return -1;
}

static int open_vault(const memory_args *a, hearth_memory **m) {
    hearth_memory_options o = {.path = a->vault, .embed_model = a->embed, .n_threads = a->threads};
    hearth_error err = {0};
    hearth_status st = hearth_memory_open(&o, m, &err);
    if (st && !a->embed_given && a->embed && strstr(err.message, "embedding model")) {
        o.embed_model = NULL; /* the default model is not on this machine: BM25 alone */
        st = hearth_memory_open(&o, m, &err);
    }
    return st ? cli_fail(&err) : 0;
}

/* Runs one tool; prints its JSON (--json) or hands it to show. */
static int call(hearth_memory *m, const char *tool, json_t *args, const memory_args *a,
                void (*show)(json_t *r, const memory_args *a)) {
    char *argtext = json_dumps(args, JSON_COMPACT), *result = NULL;
    json_decref(args);
    hearth_error err = {0};
    hearth_status st = hearth_memory_call(m, tool, argtext, &result, &err);
    free(argtext);
    if (st) return cli_fail(&err);
    json_t *r = json_loads(result, 0, NULL);
    if (a->json || !show)
        puts(result);
    else
        show(r, a);
    json_decref(r);
    hearth_free(result);
    return 0;
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void show_status(json_t *r, const memory_args *a) {
    printf("vault:     %s\ncommits:   %lld (last: %s)\ndocuments: %lld (%lld chunks)\n", str(r, "path"),
           json_integer_value(json_object_get(r, "commits")), str(r, "last_commit"),
           json_integer_value(json_object_get(r, "documents")), json_integer_value(json_object_get(r, "chunks")));
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(r, "kinds"), k, v) printf("  %-13s %lld\n", k, json_integer_value(v));
    const char *model = json_string_value(json_object_get(r, "embedding_model"));
    printf("search:    BM25%s%s\n", model ? " + vectors of " : " only (no embedding model)", model ? model : "");
    size_t i;
    json_array_foreach(json_object_get(r, "problems"), i, v) printf("problem:   %s\n", json_string_value(v));
}

static void show_list(json_t *r, const memory_args *a) {
    size_t i;
    json_t *v;
    json_array_foreach(r, i, v) printf("%-13s %s  (%s)\n", str(v, "kind"), str(v, "path"), str(v, "title"));
}

static void show_search(json_t *r, const memory_args *a) {
    size_t i;
    json_t *v;
    if (!json_array_size(r)) puts("no matches");
    json_array_foreach(r, i, v) {
        const char *anchor = str(v, "anchor");
        printf("%zu. %s%s%s  %s (%s%s%s)\n   ", i + 1, str(v, "path"), *anchor ? "#" : "", anchor, str(v, "title"),
               str(v, "kind"), *str(v, "source") ? ", " : "", str(v, "source"));
        const char *t = str(v, "text");
        int n = 0; /* the passage on one line, cut at about 240 bytes on a character boundary */
        for (const char *p = t; *p && (n < 240 || ((unsigned char)*p & 0xC0) == 0x80); p++, n++)
            putchar(*p == '\n' ? ' ' : *p);
        puts(strlen(t) > (size_t)n ? "..." : "");
    }
}

static void show_toc(json_t *r, const memory_args *a) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(r, "headings"), i, v) {
        int level = (int)json_integer_value(json_object_get(v, "level"));
        printf("%*s%s  #%s\n", 2 * (level - 1), "", str(v, "text"), str(v, "anchor"));
    }
}

static void show_text(json_t *r, const memory_args *a) { fputs(str(r, "text"), stdout); }

static void show_links(json_t *r, const memory_args *a) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(r, "links"), i, v) {
        printf("-> [[%s%s%s]]%s%s\n", str(v, "target"), *str(v, "heading") ? "#" : "", str(v, "heading"),
               json_is_true(json_object_get(v, "exists")) ? "  " : "  (missing)", str(v, "path"));
    }
    json_array_foreach(json_object_get(r, "backlinks"), i, v) printf("<- %s\n", json_string_value(v));
}

static int verb_open(hearth_memory *m, const memory_args *a) {
    char *result = NULL;
    hearth_error err = {0};
    if (hearth_memory_call(m, "memory_status", NULL, &result, &err)) return cli_fail(&err);
    json_t *s = json_loads(result, 0, NULL);
    hearth_free(result);
    char path[8192];
    snprintf(path, sizeof path, "%s", str(s, "path"));
    json_decref(s);
    if (a->pos[0]) {
        char *args = NULL;
        json_t *o = json_pack("{s:s}", "article", a->pos[0]);
        args = json_dumps(o, 0);
        json_decref(o);
        hearth_status st = hearth_memory_call(m, "memory_toc", args, &result, &err);
        free(args);
        if (st) return cli_fail(&err);
        json_t *t = json_loads(result, 0, NULL);
        hearth_free(result);
        size_t n = strlen(path);
        snprintf(path + n, sizeof path - n, "/%s", str(t, "path"));
        json_decref(t);
    }
    printf("%s\n", path);
    char url[9000]; /* Obsidian opens a vault or a file by path; without it, the folder opens */
    snprintf(url, sizeof url, "obsidian://open?path=%s", path);
    if (!cli_open_browser(url)) cli_open_browser(path);
    return 0;
}

static int verb_simple(hearth_memory *m, const memory_args *a, const char *tool, int n_pos,
                       void (*show)(json_t *, const memory_args *)) {
    if (a->n_pos < n_pos) return cli_usage_error(memory_usage, "'%s' needs an article", a->verb);
    json_t *args = json_object();
    if (n_pos >= 1) json_object_set_new(args, "article", json_string(a->pos[0]));
    if (n_pos >= 2) json_object_set_new(args, "anchor", json_string(a->pos[1]));
    return call(m, tool, args, a, show);
}

/* changes: what the last synthesis runs changed, as a short diff (--json: the library's list). */
static int verb_changes(hearth_memory *m, const memory_args *a) {
    char *text = NULL;
    hearth_error err = {0};
    if (hearth_memory_changes(m, a->limit_given ? a->limit : 1, &text, &err)) return cli_fail(&err);
    json_t *list = a->json ? NULL : json_loads(text, 0, NULL), *commit, *file, *line;
    size_t i, j, k;
    if (a->json) puts(text);
    if (!a->json && !json_array_size(list)) puts("no synthesis run has changed the vault yet");
    json_array_foreach(list, i, commit) {
        printf("%.10s %s %s\n", str(commit, "commit"), str(commit, "time"), str(commit, "message"));
        json_array_foreach(json_object_get(commit, "files"), j, file) {
            printf("  %s (%s, +%lld -%lld)\n", str(file, "path"), str(file, "status"),
                   (long long)json_integer_value(json_object_get(file, "added")),
                   (long long)json_integer_value(json_object_get(file, "removed")));
            json_array_foreach(json_object_get(file, "lines"), k, line)
                printf("    %s %s\n", str(line, "op"), str(line, "text"));
            if (json_is_true(json_object_get(file, "truncated"))) puts("    ...");
        }
    }
    json_decref(list);
    hearth_free(text);
    return 0;
}

static int verb_report(hearth_status st, char *report, hearth_error *err) {
    if (st) return cli_fail(err);
    puts(report ? report : "{}");
    hearth_free(report);
    return 0;
}

int cli_memory_mcp(hearth_memory *m);                                          /* memory_mcp.c */
int cli_memory_schedule(const char *at, const char *model, const char *vault); /* memory_schedule.c */
int cli_memory_unschedule(void);
int cli_memory_synthesize(hearth_memory *m, const char *stage, const char *model, const char *since, int limit,
                          int dry_run, int threads); /* memory_synth.c */

/* synthesize (and its aliases) runs every stage; the workers run one (NULL: all). */
static const struct {
    const char *verb, *stage;
} synth_verbs[] = {{"synthesize", NULL},
                   {"pipeline", NULL},
                   {"all", NULL},
                   {"segment", "segment"},
                   {"extract", "extract"},
                   {"route", "route"},
                   {"synthesize-stage", "synthesize"},
                   {"link", "link"}};

int cli_memory(int argc, char **argv) {
    memory_args a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0) return rc;
    hearth_error err = {0};
    char *report = NULL;
    if (!strcmp(a.verb, "init") || !strcmp(a.verb, "setup")) {
        hearth_memory_options o = {.path = a.vault};
        hearth_status st = hearth_memory_init(&o, &report, &err);
        return verb_report(st, report, &err);
    }
    if (!strcmp(a.verb, "schedule")) return cli_memory_schedule(a.at ? a.at : "03:00", a.model, a.vault);
    if (!strcmp(a.verb, "unschedule")) return cli_memory_unschedule();
    static const char *verbs[] = {"status", "open", "browse", "list",    "search", "toc",    "section",
                                  "links",  "read", "import", "reindex", "mcp",    "changes"};
    int known = 0, synth = -1;
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) known |= !strcmp(a.verb, verbs[i]);
    for (size_t i = 0; i < sizeof synth_verbs / sizeof synth_verbs[0]; i++)
        if (!strcmp(a.verb, synth_verbs[i].verb)) known = 1, synth = (int)i;
    if (!known) return cli_usage_error(memory_usage, "unknown memory command '%s'", a.verb);
    if ((!strcmp(a.verb, "search") || !strcmp(a.verb, "import")) && !a.n_pos)
        return cli_usage_error(memory_usage, "'%s' needs an argument", a.verb);
    hearth_memory *m = NULL;
    if (open_vault(&a, &m)) return 1;
    if (synth >= 0)
        rc = cli_memory_synthesize(m, synth_verbs[synth].stage, a.model, a.since, a.limit_given ? a.limit : 0,
                                   a.dry_run, a.threads);
    else if (!strcmp(a.verb, "status"))
        rc = call(m, "memory_status", json_object(), &a, show_status);
    else if (!strcmp(a.verb, "open") || !strcmp(a.verb, "browse"))
        rc = verb_open(m, &a);
    else if (!strcmp(a.verb, "list"))
        rc = call(m, "memory_list", a.kind ? json_pack("{s:s}", "kind", a.kind) : json_object(), &a, show_list);
    else if (!strcmp(a.verb, "search")) {
        json_t *args = json_pack("{s:s, s:i}", "query", a.pos[0], "limit", a.limit);
        if (a.kind) json_object_set_new(args, "kind", json_string(a.kind));
        rc = call(m, "memory_search", args, &a, show_search);
    } else if (!strcmp(a.verb, "toc"))
        rc = verb_simple(m, &a, "memory_toc", 1, show_toc);
    else if (!strcmp(a.verb, "section"))
        rc = a.n_pos < 2 ? cli_usage_error(memory_usage, "'%s' needs an article and an anchor", a.verb)
                         : verb_simple(m, &a, "memory_section", 2, show_text);
    else if (!strcmp(a.verb, "links"))
        rc = verb_simple(m, &a, "memory_links", 1, show_links);
    else if (!strcmp(a.verb, "read"))
        rc = verb_simple(m, &a, "memory_read", 1, show_text);
    else if (!strcmp(a.verb, "import")) {
        hearth_status st = hearth_memory_import(m, a.pos[0], &report, &err);
        rc = verb_report(st, report, &err);
    } else if (!strcmp(a.verb, "changes")) {
        rc = verb_changes(m, &a);
    } else if (!strcmp(a.verb, "reindex")) {
        hearth_status st = hearth_memory_reindex(m, &report, &err);
        rc = verb_report(st, report, &err);
    } else
        rc = cli_memory_mcp(m);
    hearth_memory_close(m);
    return rc;
}
