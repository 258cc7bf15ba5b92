/* memory_tools.c: the read-only memory tools (memory_status, memory_list, memory_search,
 * memory_read, memory_toc, memory_section, memory_links): one table of name, JSON schema
 * and handler, shared by the CLI verbs and the MCP server. No tool writes the vault. */
#include "base/err.h"
#include "base/file.h"
#include "memory/memory.h"
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef hearth_status (*tool_fn)(hearth_memory *m, json_t *args, json_t **out, hearth_error *err);

static const char *arg_str(json_t *args, const char *key) { return json_string_value(json_object_get(args, key)); }

static hearth_status need(json_t *args, const char *key, const char **v, hearth_error *err) {
    *v = arg_str(args, key);
    return *v && **v ? HEARTH_OK : err_set(err, HEARTH_ERR_INVALID, "memory: '%s' (a string) is required", key);
}

static long long count_of(hearth_memory *m, const char *sql, const char *bind) {
    sqlite3_stmt *s;
    long long n = 0;
    if (sqlite3_prepare_v2(m->db, sql, -1, &s, NULL) != SQLITE_OK) return 0;
    if (bind) sqlite3_bind_text(s, 1, bind, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

static hearth_status tool_status(hearth_memory *m, json_t *args, json_t **out, hearth_error *err) {
    int commits = 0;
    char last[512];
    hearth_status st = memory_git_head(m->root, &commits, last, sizeof last, err);
    if (st) return st;
    sbuf p;
    sbuf_init(&p);
    memory_vault_problems(m->root, &p);
    json_t *problems = json_array(), *kinds = json_object();
    for (char *line = p.data ? strtok(p.data, "\n") : NULL; line; line = strtok(NULL, "\n"))
        json_array_append_new(problems, json_string(line));
    sbuf_free(&p);
    for (int k = 0; k < 6; k++)
        json_object_set_new(kinds, memory_kinds[k],
                            json_integer(count_of(m, "SELECT count(*) FROM docs WHERE kind=?1", memory_kinds[k])));
    *out = json_pack("{s:s, s:i, s:s, s:I, s:I, s:o, s:s?, s:o}", "path", m->root, "commits", commits, "last_commit",
                     last, "documents", count_of(m, "SELECT count(*) FROM docs", NULL), "chunks",
                     count_of(m, "SELECT count(*) FROM chunks", NULL), "kinds", kinds, "embedding_model",
                     m->embedder ? m->embed_name : NULL, "problems", problems);
    return HEARTH_OK;
}

static hearth_status tool_list(hearth_memory *m, json_t *args, json_t **out, hearth_error *err) {
    const char *kind = arg_str(args, "kind");
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db, "SELECT path, title, kind FROM docs WHERE ?1 IS NULL OR kind=?1 ORDER BY path", -1,
                           &s, NULL) != SQLITE_OK)
        return err_set(err, HEARTH_ERR_IO, "memory: list: %s", sqlite3_errmsg(m->db));
    if (kind) sqlite3_bind_text(s, 1, kind, -1, SQLITE_STATIC);
    *out = json_array();
    while (sqlite3_step(s) == SQLITE_ROW)
        json_array_append_new(*out, json_pack("{s:s, s:s, s:s}", "path", sqlite3_column_text(s, 0), "title",
                                              sqlite3_column_text(s, 1), "kind", sqlite3_column_text(s, 2)));
    sqlite3_finalize(s);
    return HEARTH_OK;
}

static hearth_status tool_search(hearth_memory *m, json_t *args, json_t **out, hearth_error *err) {
    const char *q;
    hearth_status st = need(args, "query", &q, err);
    json_t *lim = json_object_get(args, "limit");
    if (!st && lim && (!json_is_integer(lim) || json_integer_value(lim) < 1 || json_integer_value(lim) > 1000))
        st = err_set(err, HEARTH_ERR_INVALID, "memory: 'limit' must be an integer from 1 to 1000");
    char *text = NULL;
    if (!st) st = memory_index_search(m, q, lim ? (int)json_integer_value(lim) : 5, arg_str(args, "kind"), &text, err);
    if (!st) *out = json_loads(text, 0, NULL);
    free(text);
    return st;
}

/* The document an argument names: a vault path (with or without .md), a file stem or a
 * title; articles win over other kinds with the same name. */
static hearth_status resolve(hearth_memory *m, const char *name, char *path, size_t cap, hearth_error *err) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(
            m->db,
            "SELECT path FROM docs WHERE path=?1 OR path=?1||'.md' OR lower(title)=lower(?1)"
            " OR path LIKE '%/'||?1||'.md' OR path LIKE '%/'||?1 ORDER BY path=?1 OR path=?1||'.md' DESC,"
            " kind='article' DESC, path LIMIT 1",
            -1, &s, NULL) != SQLITE_OK)
        return err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    hearth_status st = HEARTH_OK;
    if (sqlite3_step(s) == SQLITE_ROW)
        snprintf(path, cap, "%s", sqlite3_column_text(s, 0));
    else
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "memory: no article '%s' (see memory_list)", name);
    sqlite3_finalize(s);
    return st;
}

/* A document a tool reads: its vault path, text and parsed Markdown. */
typedef struct tool_doc {
    char rel[1024];
    char *text;
    size_t len;
    md_doc d;
} tool_doc;

/* Reads and parses the document args["article"] names. */
static hearth_status load(hearth_memory *m, json_t *args, tool_doc *doc, hearth_error *err) {
    const char *name;
    hearth_status st = need(args, "article", &name, err);
    if (!st) st = resolve(m, name, doc->rel, sizeof doc->rel, err);
    char *path = st ? NULL : path_join(m->root, doc->rel);
    if (!st) st = path ? file_read_all(path, &doc->text, &doc->len, err) : HEARTH_ERR_NOMEM;
    free(path);
    if (st) return st;
    const char *base = strrchr(doc->rel, '/');
    char stem[sizeof doc->rel];
    snprintf(stem, sizeof stem, "%s", base ? base + 1 : doc->rel);
    if (strlen(stem) > 3) stem[strlen(stem) - 3] = 0;
    if (md_parse(doc->text, doc->len, stem, &doc->d)) {
        free(doc->text);
        return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    }
    return HEARTH_OK;
}

/* The tools that read one document get it loaded (and freed) by hearth_memory_call. */
typedef hearth_status (*doc_tool_fn)(hearth_memory *m, json_t *args, const tool_doc *doc, json_t **out,
                                     hearth_error *err);

static hearth_status tool_read(hearth_memory *m, json_t *args, const tool_doc *doc, json_t **out, hearth_error *err) {
    (void)m, (void)args, (void)err;
    *out = json_pack("{s:s, s:s, s:s%}", "path", doc->rel, "title", doc->d.title, "text", doc->text, doc->len);
    return HEARTH_OK;
}

static hearth_status tool_toc(hearth_memory *m, json_t *args, const tool_doc *doc, json_t **out, hearth_error *err) {
    (void)m, (void)args, (void)err;
    json_t *h = json_array();
    for (size_t i = 0; i < doc->d.n_headings; i++) {
        const md_heading *hd = &doc->d.headings[i];
        json_array_append_new(h,
                              json_pack("{s:i, s:s, s:s}", "level", hd->level, "text", hd->text, "anchor", hd->anchor));
    }
    *out = json_pack("{s:s, s:s, s:o}", "path", doc->rel, "title", doc->d.title, "headings", h);
    return HEARTH_OK;
}

static hearth_status tool_section(hearth_memory *m, json_t *args, const tool_doc *doc, json_t **out,
                                  hearth_error *err) {
    (void)m;
    const char *anchor;
    hearth_status st = need(args, "anchor", &anchor, err);
    if (st) return st;
    const md_heading *h = md_find_heading(&doc->d, anchor);
    if (!h)
        return err_set(err, HEARTH_ERR_NOT_FOUND, "memory: %s has no section '%s' (see memory_toc)", doc->rel, anchor);
    *out = json_pack("{s:s, s:s, s:s, s:s%}", "path", doc->rel, "heading", h->text, "anchor", h->anchor, "text",
                     doc->text + h->start, h->end - h->start);
    return HEARTH_OK;
}

static void link_out(void *user, const char *target, const char *heading) {
    json_t *arr = user;
    json_array_append_new(arr, json_pack("{s:s, s:s}", "target", target, "heading", heading));
}

static hearth_status tool_links(hearth_memory *m, json_t *args, const tool_doc *doc, json_t **out, hearth_error *err) {
    (void)args, (void)err;
    const char *rel = doc->rel, *text = doc->text;
    size_t len = doc->len;
    const md_doc *d = &doc->d;
    json_t *outgoing = json_array(), *back = json_array();
    md_wikilinks(text + d->body, len - d->body, link_out, outgoing);
    size_t i;
    json_t *l;
    json_array_foreach(outgoing, i, l) { /* a link names a document when resolve finds one */
        char target[1024];
        const char *t = json_string_value(json_object_get(l, "target"));
        int exists = !*t || resolve(m, t, target, sizeof target, NULL) == HEARTH_OK;
        json_object_set_new(l, "path", exists && *t ? json_string(target) : *t ? json_null() : json_string(rel));
        json_object_set_new(l, "exists", json_boolean(exists));
    }
    /* backlinks: documents whose links name this one by path, stem or title */
    char stem[1024];
    const char *base = strrchr(rel, '/');
    snprintf(stem, sizeof stem, "%s", base ? base + 1 : rel);
    stem[strlen(stem) - 3] = 0;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT DISTINCT src FROM links WHERE src<>?1 AND (dst=?1 OR dst||'.md'=?1 OR"
                           " lower(dst)=lower(?2) OR lower(dst)=lower(?3)) ORDER BY src",
                           -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, rel, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, stem, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, d->title, -1, SQLITE_STATIC);
        while (sqlite3_step(s) == SQLITE_ROW)
            json_array_append_new(back, json_string((const char *)sqlite3_column_text(s, 0)));
        sqlite3_finalize(s);
    }
    *out = json_pack("{s:s, s:o, s:o}", "path", rel, "links", outgoing, "backlinks", back);
    return HEARTH_OK;
}

#define ARTICLE "\"article\":{\"type\":\"string\",\"description\":\"a vault path, file name or title\"}"
static const struct {
    const char *name, *description, *schema;
    tool_fn fn;      /* a tool of the whole vault, or */
    doc_tool_fn doc; /* a tool of the one document args["article"] names */
} tools[] = {
    {"memory_status", "The memory vault: where it is, commits, document counts, problems.",
     "{\"type\":\"object\",\"properties\":{}}", tool_status, NULL},
    {"memory_list", "List the vault's documents (path, title, kind), optionally of one kind.",
     "{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\",\"enum\":[\"article\",\"reference\","
     "\"conversation\",\"note\",\"talk\",\"meta\"]}}}",
     tool_list, NULL},
    {"memory_search",
     "Search the personal memory (articles, conversations, notes, hearth's docs): the best passages with "
     "their source.",
     "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\","
     "\"minimum\":1,\"maximum\":1000,\"default\":5},\"kind\":{\"type\":\"string\",\"enum\":[\"article\","
     "\"reference\",\"conversation\",\"note\",\"talk\",\"meta\"]}},\"required\":[\"query\"]}",
     tool_search, NULL},
    {"memory_read", "Read a whole document of the vault.",
     "{\"type\":\"object\",\"properties\":{" ARTICLE "},\"required\":[\"article\"]}", NULL, tool_read},
    {"memory_toc", "The headings of a document (level, text, anchor).",
     "{\"type\":\"object\",\"properties\":{" ARTICLE "},\"required\":[\"article\"]}", NULL, tool_toc},
    {"memory_section", "One section of a document, by heading text or anchor.",
     "{\"type\":\"object\",\"properties\":{" ARTICLE ",\"anchor\":{\"type\":\"string\"}},"
     "\"required\":[\"article\",\"anchor\"]}",
     NULL, tool_section},
    {"memory_links", "A document's [[wikilinks]] (and whether each target exists) and its backlinks.",
     "{\"type\":\"object\",\"properties\":{" ARTICLE "},\"required\":[\"article\"]}", NULL, tool_links},
};
#define N_TOOLS (sizeof tools / sizeof tools[0])

const char *hearth_memory_tools_json(void) {
    static char *text; /* built once; a program calls this from one thread before serving */
    if (text) return text;
    json_t *arr = json_array();
    for (size_t i = 0; i < N_TOOLS; i++)
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:o}", "name", tools[i].name, "description", tools[i].description,
                                        "inputSchema", json_loads(tools[i].schema, 0, NULL)));
    text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return text;
}

hearth_status hearth_memory_call(hearth_memory *m, const char *tool, const char *args_json, char **result_json,
                                 hearth_error *err) {
    *result_json = NULL;
    json_t *args = args_json && *args_json ? json_loads(args_json, 0, NULL) : json_object();
    if (!json_is_object(args)) {
        json_decref(args);
        return err_set(err, HEARTH_ERR_INVALID, "memory: %s: the arguments must be a JSON object", tool);
    }
    hearth_status st = err_set(err, HEARTH_ERR_NOT_FOUND,
                               "memory: no tool '%s' (the memory tools are read-only: memory_status, memory_list, "
                               "memory_search, memory_read, memory_toc, memory_section, memory_links)",
                               tool);
    json_t *out = NULL;
    for (size_t i = 0; i < N_TOOLS; i++) {
        if (strcmp(tool, tools[i].name)) continue;
        if (tools[i].fn) {
            st = tools[i].fn(m, args, &out, err);
            continue;
        }
        tool_doc doc = {0};
        st = load(m, args, &doc, err);
        if (st) continue;
        st = tools[i].doc(m, args, &doc, &out, err);
        md_doc_free(&doc.d);
        free(doc.text);
    }
    json_decref(args);
    if (!st) *result_json = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (!st && !*result_json) st = err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    return st;
}
