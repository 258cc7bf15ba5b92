/* memory_synth_run.c: one synthesis run (hearth_memory_synthesize): the stages in order,
 * then the link stage: staged articles and Talk/ notes written with every dangling
 * [[link]] unwrapped (all articles are checked, not only this run's), Meta/index.md's
 * article list and Meta/log.md brought up to date, and one git commit. The stage is
 * cleared only after the commit, so a run killed while publishing publishes again. */
#include "base/err.h"
#include "base/file.h"
#include "memory/memory_synth.h"
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct publish_ctx {
    hearth_memory *m;
    sqlite3_stmt *exists;
} publish_ctx;

static int target_exists(void *user, const char *target) {
    publish_ctx *c = user;
    sqlite3_bind_text(c->exists, 1, target, -1, SQLITE_STATIC);
    int found = sqlite3_step(c->exists) == SQLITE_ROW;
    sqlite3_reset(c->exists);
    return found;
}

/* Writes rel when its content differs; *changed set when it did. */
static hearth_status put(const char *root, const char *rel, const char *text, int *changed, hearth_error *err) {
    char *path = path_join(root, rel), *old = NULL;
    size_t len = 0;
    int same = path && !file_read_all(path, &old, &len, NULL) && len == strlen(text) && !memcmp(old, text, len);
    free(old), free(path);
    if (same) return HEARTH_OK;
    *changed = 1;
    return memory_write_file(root, rel, text, strlen(text), 0, err);
}

static hearth_status put_linked(publish_ctx *c, const char *rel, const char *text, int *changed, hearth_error *err) {
    int unlinked = 0;
    char *fixed = synth_unlink_dangling(text, target_exists, c, &unlinked);
    hearth_status st =
        fixed ? put(c->m->root, rel, fixed, changed, err) : err_set(err, HEARTH_ERR_NOMEM, "memory: oom");
    free(fixed);
    return st;
}

/* Meta/index.md keeps its text up to "## Articles" and lists every article after it. */
static hearth_status index_articles(publish_ctx *c, int *changed, hearth_error *err) {
    char *path = path_join(c->m->root, MEMORY_META "/index.md"), *old = NULL;
    size_t len = 0;
    if (!path || file_read_all(path, &old, &len, NULL)) old = strdup("# Index\n");
    free(path);
    char *cut = strstr(old, "\n## Articles\n");
    if (cut) *cut = 0;
    size_t keep = strlen(old);
    while (keep && old[keep - 1] == '\n') keep--;
    sbuf b;
    sbuf_init(&b);
    sbuf_append(&b, old, keep);
    free(old);
    sbuf_puts(&b, "\n\n## Articles\n\n");
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(c->m->db,
                           "SELECT substr(path, 10, length(path) - 12) AS n FROM docs WHERE kind='article'"
                           " UNION SELECT article FROM syn_stage WHERE text IS NOT NULL ORDER BY 1",
                           -1, &s, NULL) == SQLITE_OK) {
        while (sqlite3_step(s) == SQLITE_ROW) sbuf_printf(&b, "- [[%s]]\n", sqlite3_column_text(s, 0));
        sqlite3_finalize(s);
    }
    hearth_status st = put(c->m->root, MEMORY_META "/index.md", b.data, changed, err);
    sbuf_free(&b);
    return st;
}

static hearth_status publish(hearth_memory *m, json_t *articles, int rejected, int *committed, hearth_error *err) {
    publish_ctx c = {m, NULL};
    *committed = 0;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT 1 FROM docs WHERE path=?1 OR path=?1||'.md' OR lower(title)=lower(?1) OR"
                           " path LIKE '%/'||?1||'.md' UNION ALL SELECT 1 FROM syn_stage WHERE lower(article)=lower(?1)"
                           " OR 'articles/'||article=?1",
                           -1, &c.exists, NULL) != SQLITE_OK)
        return err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    int changed = 0, n_written = 0;
    hearth_status st = HEARTH_OK;
    sqlite3_stmt *s = NULL;
    sqlite3_prepare_v2(m->db, "SELECT article, text, talk FROM syn_stage ORDER BY article", -1, &s, NULL);
    while (!st && s && sqlite3_step(s) == SQLITE_ROW) {
        char rel[600];
        const char *name = (const char *)sqlite3_column_text(s, 0);
        if (sqlite3_column_text(s, 1)) {
            snprintf(rel, sizeof rel, MEMORY_ARTICLES "/%s.md", name);
            st = put_linked(&c, rel, (const char *)sqlite3_column_text(s, 1), &changed, err);
            n_written++;
        }
        if (!st && sqlite3_column_text(s, 2)) {
            snprintf(rel, sizeof rel, MEMORY_TALK "/%s.md", name);
            st = put(m->root, rel, (const char *)sqlite3_column_text(s, 2), &changed, err);
        }
    }
    sqlite3_finalize(s);
    /* articles edited by hand or by an earlier run: their links are checked too */
    sqlite3_prepare_v2(m->db,
                       "SELECT path FROM docs WHERE kind='article' AND substr(path, 10, length(path) - 12)"
                       " NOT IN (SELECT article FROM syn_stage WHERE text IS NOT NULL)",
                       -1, &s, NULL);
    while (!st && s && sqlite3_step(s) == SQLITE_ROW) {
        const char *rel = (const char *)sqlite3_column_text(s, 0);
        char *path = path_join(m->root, rel), *text = NULL;
        size_t len = 0;
        if (path && !file_read_all(path, &text, &len, NULL)) st = put_linked(&c, rel, text, &changed, err);
        free(text), free(path);
    }
    sqlite3_finalize(s);
    if (!st) st = index_articles(&c, &changed, err);
    sqlite3_finalize(c.exists);
    if (!st && changed) {
        char line[512];
        snprintf(line, sizeof line, "synthesize: %d article(s) written, %d edit(s) refused by the gate (see Talk/)",
                 n_written, rejected);
        st = memory_log_append(m->root, line, err);
        sbuf msg;
        sbuf_init(&msg);
        sbuf_printf(&msg, "memory: %s\n\n", line);
        size_t i;
        json_t *a;
        json_array_foreach(articles, i, a) sbuf_printf(&msg, "- %s\n", json_string_value(a));
        if (!st) st = memory_git_commit(m->root, msg.data, committed, err);
        sbuf_free(&msg);
    }
    if (!st) sqlite3_exec(m->db, "DELETE FROM syn_stage", NULL, NULL, NULL);
    if (!st) st = memory_index_sync(m, 0, NULL, NULL, err);
    return st;
}

/* n digits at s as a number in [lo, hi], else -1. */
static int field(const char *s, int n, int lo, int hi) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v < lo || v > hi ? -1 : v;
}

int synth_since_key(const char *since, char *key, size_t cap) {
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    size_t len = strlen(since);
    if ((len != 10 && len != 16) || cap < 17 || since[4] != '-' || since[7] != '-') return -1;
    int y = field(since, 4, 1, 9999), mo = field(since + 5, 2, 1, 12), d = mo < 0 ? -1 : field(since + 8, 2, 1, 31);
    if (y < 0 || d < 0 || d > mdays[mo - 1] || (mo == 2 && d == 29 && (y % 4 || (y % 100 == 0 && y % 400)))) return -1;
    if (len == 16 && ((since[10] != 'T' && since[10] != ' ') || since[13] != ':' || field(since + 11, 2, 0, 23) < 0 ||
                      field(since + 14, 2, 0, 59) < 0))
        return -1;
    memcpy(key, since, len);
    if (len == 16) key[10] = ' ';
    key[len] = 0;
    return 0;
}

int synth_before(const char *created, const char *key) {
    char c[17] = "";
    size_t n = strnlen(created, 16);
    memcpy(c, created, n);
    c[n] = 0;
    if (n > 10 && c[10] == 'T') c[10] = ' ';
    return strncmp(c, key, strlen(key)) < 0;
}

static const char *const stages[] = {"segment", "extract", "route", "synthesize"};

hearth_status hearth_memory_synthesize(hearth_memory *m, const hearth_memory_synth_options *o, char **report_json,
                                       hearth_error *err) {
    if (report_json) *report_json = NULL;
    const char *only = o->stage;
    int known = !only || !strcmp(only, "link");
    for (int i = 0; i < 4; i++) known |= only && !strcmp(only, stages[i]);
    if (!known)
        return err_set(err, HEARTH_ERR_INVALID, "memory: no stage '%s' (segment, extract, route, synthesize, link)",
                       only);
    char key[32];
    if (o->since && synth_since_key(o->since, key, sizeof key))
        return err_set(err, HEARTH_ERR_INVALID,
                       "memory: since: '%s' is not a date and time YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC)", o->since);
    if (!o->dry_run && !o->llm && (!only || strcmp(only, "link")))
        return err_set(err, HEARTH_ERR_INVALID, "memory: synthesis needs a model");
    sbuf p;
    sbuf_init(&p);
    hearth_status st = HEARTH_OK;
    if (memory_vault_problems(m->root, &p))
        st = err_set(err, HEARTH_ERR_FORMAT, "memory: the vault at %s needs attention, nothing synthesized:\n%s",
                     m->root, p.data);
    sbuf_free(&p);
    if (!st) st = synth_open(m, err);
    int done[4] = {0}, rejected = 0, committed = 0;
    json_t *articles = json_array();
    for (int i = 0; i < 4 && !st; i++)
        if (!only || !strcmp(only, stages[i])) st = synth_stage(m, stages[i], o, &done[i], &rejected, articles, err);
    if (!st && !o->dry_run && (!only || !strcmp(only, "link"))) st = publish(m, articles, rejected, &committed, err);
    if (!st && report_json) {
        json_t *r = json_pack("{s:i, s:i, s:i, s:i, s:O, s:i, s:b, s:b}", "segment", done[0], "extract", done[1],
                              "route", done[2], "synthesize", done[3], "articles", articles, "rejected", rejected,
                              "committed", committed, "dry_run", o->dry_run);
        *report_json = json_dumps(r, JSON_COMPACT);
        json_decref(r);
    }
    json_decref(articles);
    return st;
}
