/* memory_synth_article.c: the synthesis pipeline's article end: the synthesize stage (the
 * model rewrites an article with its new facts; the gate keeps the old article and notes
 * the refused edit on its Talk/ page unless at least 70% of the old prose and every old
 * citation survive and no secret enters), the deterministic link stage (no dangling
 * [[links]], Meta/index.md's article list), publishing the staged articles and the run's
 * one commit. Writes only articles/, Talk/ and Meta/. */
#include "base/err.h"
#include "base/file.h"
#include "memory/memory_synth.h"
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Sentences of a text: split at newlines and at ". ", "! ", "? "; headings, footnote
 * definitions and blanks are not prose. */
static void each_sentence(const char *t, void (*fn)(void *, const char *, size_t), void *user) {
    const char *p = t;
    while (*p) {
        const char *e = p;
        while (*e && *e != '\n' && !((*e == '.' || *e == '!' || *e == '?') && (e[1] == ' ' || e[1] == '\n' || !e[1])))
            e++;
        size_t n = (size_t)(e - p) + (*e && *e != '\n' ? 1 : 0);
        while (n && *p == ' ') p++, n--;
        if (n && *p != '#' && strncmp(p, "[^", 2) && strncmp(p, "---", 3)) fn(user, p, n);
        p += n;
        while (*p == ' ' || *p == '\n') p++;
        if (p == e && *p) p++;
    }
}

typedef struct kept_ctx {
    const char *new_text;
    size_t total, kept;
} kept_ctx;

static void count_kept(void *user, const char *s, size_t n) {
    kept_ctx *k = user;
    k->total += n;
    char *dup = strndup(s, n);
    if (dup && strstr(k->new_text, dup)) k->kept += n;
    free(dup);
}

double synth_prose_kept(const char *old, const char *new_text) {
    kept_ctx k = {new_text, 0, 0};
    each_sentence(old, count_kept, &k);
    return k.total ? (double)k.kept / (double)k.total : 1.0;
}

int synth_citations_kept(const char *old, const char *new_text) {
    for (const char *p = strstr(old, "[^"); p; p = strstr(p + 2, "[^")) {
        const char *e = strchr(p, ']');
        if (!e || e - p > 40) continue;
        char marker[48];
        snprintf(marker, sizeof marker, "%.*s", (int)(e - p + 1), p);
        if (!strstr(new_text, marker)) return 0;
    }
    return 1;
}

char *synth_unlink_dangling(const char *t, synth_exists_fn exists, void *user, int *changed) {
    sbuf b;
    sbuf_init(&b);
    int fenced = 0;
    for (const char *line = t; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        const char *s = line;
        while (*s == ' ') s++;
        if (!strncmp(s, "```", 3) || !strncmp(s, "~~~", 3)) fenced = !fenced;
        for (size_t i = 0; i < n;) {
            const char *close =
                !fenced && i + 1 < n && line[i] == '[' && line[i + 1] == '[' ? strstr(line + i + 2, "]]") : NULL;
            if (!close || close >= line + n) {
                sbuf_putc(&b, line[i++]);
                continue;
            }
            const char *in = line + i + 2, *bar = memchr(in, '|', (size_t)(close - in)),
                       *hash = memchr(in, '#', (size_t)(close - in));
            size_t tlen = (size_t)((hash && (!bar || hash < bar) ? hash : bar ? bar : close) - in);
            char target[512];
            snprintf(target, sizeof target, "%.*s", (int)(tlen < 511 ? tlen : 511), in);
            if (!tlen || exists(user, target))
                sbuf_append(&b, line + i, (size_t)(close + 2 - (line + i)));
            else { /* the link's text stays, without the link */
                *changed = 1;
                if (bar)
                    sbuf_append(&b, bar + 1, (size_t)(close - bar - 1));
                else
                    sbuf_append(&b, in, (size_t)(close - in));
            }
            i = (size_t)(close + 2 - line);
        }
        line += n;
    }
    return sbuf_steal(&b);
}

/* An article file split into its body (after the front matter) and footnote definitions. */
typedef struct article {
    char *body;      /* prose with markers */
    char *footnotes; /* "[^n]: ..." lines */
    int max_note;
} article;

static void article_split(const char *text, article *a) {
    memset(a, 0, sizeof *a);
    const char *p = text;
    if (!strncmp(p, "---\n", 4)) {
        const char *e = strstr(p + 4, "\n---\n");
        if (e) p = e + 5;
    }
    sbuf body, notes;
    sbuf_init(&body);
    sbuf_init(&notes);
    for (const char *line = p; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        int num = 0;
        if (sscanf(line, "[^%d]:", &num) == 1) {
            sbuf_append(&notes, line, n);
            if (num > a->max_note) a->max_note = num;
        } else
            sbuf_append(&body, line, n);
        line += n;
    }
    while (body.len && body.data[body.len - 1] == '\n') body.data[--body.len] = 0;
    a->body = sbuf_steal(&body);
    a->footnotes = sbuf_steal(&notes);
    if (!a->body) a->body = strdup("");
    if (!a->footnotes) a->footnotes = strdup("");
}

static char *read_rel(const char *root, const char *rel) {
    char *path = path_join(root, rel), *text = NULL;
    size_t len = 0;
    if (path && file_read_all(path, &text, &len, NULL)) text = NULL;
    free(path);
    return text;
}

static char *staged(hearth_memory *m, const char *name, int col) {
    sqlite3_stmt *s;
    char *out = NULL;
    if (sqlite3_prepare_v2(m->db, "SELECT text, talk FROM syn_stage WHERE article=?1", -1, &s, NULL) != SQLITE_OK)
        return NULL;
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, col))
        out = strdup((const char *)sqlite3_column_text(s, col));
    sqlite3_finalize(s);
    return out;
}

/* The article's current text: staged by this run, else on disk, else "". */
static char *current(hearth_memory *m, const char *name, int talk) {
    char *t = staged(m, name, talk);
    if (t) return t;
    char rel[600];
    snprintf(rel, sizeof rel, "%s/%s.md", talk ? MEMORY_TALK : MEMORY_ARTICLES, name);
    t = read_rel(m->root, rel);
    return t ? t : strdup("");
}

static const char *instructions =
    "Write the Markdown article with its new facts: keep its current text and every footnote marker "
    "such as [^1], and add each new fact where it fits, followed by its marker. Answer with a JSON "
    "object holding the whole article body.";

/* The longest body a rewrite may have: the old one, each new fact twice over (room for the
 * model's own wording around it) and a few sentences more. The cap is what ends a model that
 * repeats itself inside the string. */
#define SYNTH_ARTICLE_SLACK 600

/* One article: ask, gate, stage. */
static hearth_status synth_article(hearth_memory *m, const hearth_memory_synth_options *o, const char *name,
                                   int *rejected, hearth_error *err) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT id, text, cites FROM syn_fact WHERE article=?1 AND applied=0 AND dropped IS NULL"
                           " ORDER BY id",
                           -1, &q, NULL) != SQLITE_OK)
        return err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    char *old = current(m, name, 0);
    article a;
    article_split(old, &a);
    json_t *facts = json_array();
    sbuf notes, waiting;
    sbuf_init(&notes);
    sbuf_init(&waiting);
    sbuf_puts(&notes, a.footnotes);
    int k = a.max_note;
    while (sqlite3_step(q) == SQLITE_ROW) {
        char marker[32];
        snprintf(marker, sizeof marker, "[^%d]", ++k);
        json_t *cites = json_loads((const char *)sqlite3_column_text(q, 2), 0, NULL), *c;
        size_t i;
        sbuf_printf(&notes, "%s:", marker);
        json_array_foreach(cites, i, c) sbuf_printf(&notes, "%s [[%s]]", i ? "," : "", json_string_value(c));
        sbuf_putc(&notes, '\n');
        json_decref(cites);
        json_array_append_new(facts, json_pack("{s:s, s:s, s:I}", "fact", sqlite3_column_text(q, 1), "marker", marker,
                                               "id", sqlite3_column_int64(q, 0)));
        sbuf_printf(&waiting, "- %s %s\n", sqlite3_column_text(q, 1), marker);
    }
    sqlite3_finalize(q);
    json_t *input = json_pack("{s:s, s:s, s:O}", "article", name, "text", a.body, "facts", facts), *ans = NULL;
    size_t max_chars = strlen(a.body) + 2 * waiting.len + SYNTH_ARTICLE_SLACK;
    json_t *schema = synth_schema_article(max_chars);
    hearth_status st = synth_ask(o, "synthesize", instructions, input, schema, &ans, err);
    json_decref(input), json_decref(schema);
    const char *text = json_string_value(json_object_get(ans, "text"));
    char reason[256] = "";
    double kept = text ? synth_prose_kept(a.body, text) : 0;
    if (st)
        ;
    else if (!text)
        snprintf(reason, sizeof reason, "the model gave no article text");
    else if (kept < SYNTH_KEEP_PROSE)
        snprintf(reason, sizeof reason, "it kept %.0f%% of the existing prose (at least %.0f%% must stay)", 100 * kept,
                 100 * SYNTH_KEEP_PROSE);
    else if (!synth_citations_kept(a.body, text))
        snprintf(reason, sizeof reason, "it dropped an existing citation");
    else if (synth_has_secret(text))
        snprintf(reason, sizeof reason, "it holds what looks like a secret (a key, token or password)");
    sbuf out, talk;
    sbuf_init(&out);
    sbuf_init(&talk);
    if (!st && !reason[0]) {
        sbuf_printf(&out, "---\ntitle: \"%s\"\n---\n", name);
        if (text[0] != '#') sbuf_printf(&out, "# %s\n\n", name);
        sbuf_puts(&out, text);
        size_t i;
        json_t *f;
        json_array_foreach(facts, i, f) { /* a fact the model left out still gets its sentence and marker */
            const char *marker = json_string_value(json_object_get(f, "marker"));
            if (!strstr(text, marker))
                sbuf_printf(&out, "\n\n%s %s", json_string_value(json_object_get(f, "fact")), marker);
        }
        sbuf_printf(&out, "\n\n%s", notes.data);
    } else if (!st) {
        (*rejected)++;
        char *old_talk = current(m, name, 1);
        time_t now = time(NULL);
        struct tm tm;
        char when[32];
        gmtime_r(&now, &tm);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
        sbuf_puts(&talk, *old_talk ? old_talk : "");
        if (!*old_talk) sbuf_printf(&talk, "# Talk: %s\n", name);
        sbuf_printf(&talk,
                    "\n## %s: an edit was not applied\n\nSynthesis proposed a rewrite of [[%s]], but %s. "
                    "The facts it wanted to add, for a person to reconcile:\n\n%s",
                    when, name, reason, waiting.data ? waiting.data : "");
        sbuf_printf(&talk, "\n%s", notes.data + strlen(a.footnotes));
        free(old_talk);
    }
    if (!st) { /* stage the result and mark the facts in one transaction: a kill leaves neither or both */
        sqlite3_stmt *ins, *mark;
        sqlite3_exec(m->db, "BEGIN", NULL, NULL, NULL);
        sqlite3_prepare_v2(m->db, "INSERT OR REPLACE INTO syn_stage(article, text, talk) VALUES(?1,?2,?3)", -1, &ins,
                           NULL);
        sqlite3_prepare_v2(m->db, "UPDATE syn_fact SET applied=1, dropped=?2 WHERE id=?1", -1, &mark, NULL);
        char *keep_text = out.len ? NULL : staged(m, name, 0), *keep_talk = talk.len ? NULL : staged(m, name, 1);
        sqlite3_bind_text(ins, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 2, out.len ? out.data : keep_text, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 3, talk.len ? talk.data : keep_talk, -1, SQLITE_STATIC);
        sqlite3_step(ins);
        size_t i;
        json_t *f;
        json_array_foreach(facts, i, f) {
            sqlite3_bind_int64(mark, 1, json_integer_value(json_object_get(f, "id")));
            if (reason[0])
                sqlite3_bind_text(mark, 2, "gate", -1, SQLITE_STATIC);
            else
                sqlite3_bind_null(mark, 2);
            sqlite3_step(mark);
            sqlite3_reset(mark);
        }
        sqlite3_finalize(ins), sqlite3_finalize(mark);
        if (sqlite3_exec(m->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
            st = err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
        free(keep_text), free(keep_talk);
    }
    sbuf_free(&out), sbuf_free(&talk), sbuf_free(&notes), sbuf_free(&waiting);
    json_decref(facts), json_decref(ans);
    free(a.body), free(a.footnotes), free(old);
    return st;
}

hearth_status stage_synthesize(hearth_memory *m, const hearth_memory_synth_options *o, int *done, int *rejected,
                               json_t *articles, hearth_error *err) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT DISTINCT article FROM syn_fact WHERE article IS NOT NULL AND applied=0 AND"
                           " dropped IS NULL ORDER BY article",
                           -1, &q, NULL) != SQLITE_OK)
        return err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    json_t *names = json_array();
    while (sqlite3_step(q) == SQLITE_ROW)
        json_array_append_new(names, json_string((const char *)sqlite3_column_text(q, 0)));
    sqlite3_finalize(q);
    hearth_status st = HEARTH_OK;
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n) {
        if (st || (o->limit > 0 && *done >= o->limit)) break;
        (*done)++;
        json_array_append(articles, n);
        if (!o->dry_run) st = synth_article(m, o, json_string_value(n), rejected, err);
    }
    json_decref(names);
    return st;
}
