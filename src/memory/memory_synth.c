/* memory_synth.c: the synthesis pipeline's stages (segment, extract, route, synthesize)
 * over the state tables in the index database (syn_*, never dropped with the derived
 * index): each item's answer is stored in one transaction, so a killed run resumes where
 * it stopped. Articles are staged in the database (syn_stage) and only written into the
 * vault, linked and committed by memory_synth_link.c. The model is the caller's callback;
 * this file builds its prompts and reads its JSON answers leniently (small models wrap
 * JSON in prose or code fences). */
#include "memory/memory_synth.h"
#include "base/err.h"
#include "base/file.h"
#include "memory/memory.h"
#include <ctype.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *synth_schema =
    "CREATE TABLE IF NOT EXISTS syn_conv(path TEXT PRIMARY KEY, segmented INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS syn_segment(id INTEGER PRIMARY KEY, conv TEXT, topic TEXT, messages TEXT,"
    " extracted INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS syn_fact(id INTEGER PRIMARY KEY, segment INTEGER, conv TEXT, text TEXT,"
    " cites TEXT, article TEXT, applied INTEGER NOT NULL DEFAULT 0, dropped TEXT);"
    "CREATE TABLE IF NOT EXISTS syn_stage(article TEXT PRIMARY KEY, text TEXT, talk TEXT);";

hearth_status synth_open(hearth_memory *m, hearth_error *err) {
    char *msg = NULL;
    if (sqlite3_exec(m->db, synth_schema, NULL, NULL, &msg) == SQLITE_OK) return HEARTH_OK;
    hearth_status st = err_set(err, HEARTH_ERR_IO, "memory: synthesis state: %s", msg);
    sqlite3_free(msg);
    return st;
}

/* The first JSON value in text (after any prose or a ``` fence). */
json_t *synth_parse_answer(const char *text) {
    for (const char *p = text; p && *p; p++) {
        if (*p != '{' && *p != '[') continue;
        json_error_t je;
        json_t *v = json_loads(p, JSON_DISABLE_EOF_CHECK, &je);
        if (v) return v;
    }
    return NULL;
}

/* Secrets never enter the vault: API keys, tokens, private keys, passwords. */
int synth_has_secret(const char *t) {
    static const struct {
        const char *prefix;
        int min_tail; /* how many key characters must follow */
    } keys[] = {{"sk-", 20}, {"AKIA", 16}, {"ghp_", 30}, {"xoxb-", 10}, {"xoxp-", 10}, {"AIza", 30}, {"hf_", 30}};
    for (const char *p = t; *p; p++) {
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            size_t n = strlen(keys[k].prefix);
            if (strncmp(p, keys[k].prefix, n) || (p > t && isalnum((unsigned char)p[-1]))) continue;
            int tail = 0;
            while (isalnum((unsigned char)p[n + tail]) || p[n + tail] == '-' || p[n + tail] == '_') tail++;
            if (tail >= keys[k].min_tail) return 1;
        }
        if (!strncmp(p, "-----BEGIN ", 11) && strstr(p, "PRIVATE KEY")) return 1;
        if (!strncasecmp(p, "password", 8)) {
            const char *q = p + 8;
            while (*q == ' ') q++;
            if (*q == ':' || *q == '=' || !strncasecmp(q, "is ", 3)) return 1;
        }
    }
    return 0;
}

/* Messages of a conversation file: each level-2 heading "<id> <speaker>" and its text. */
json_t *synth_conversation(const char *root, const char *rel, char *created, size_t cap) {
    char *path = path_join(root, rel), *text = NULL;
    size_t len = 0;
    if (!path || file_read_all(path, &text, &len, NULL)) {
        free(path);
        return NULL;
    }
    free(path);
    md_doc d;
    json_t *msgs = NULL;
    if (!md_parse(text, len, rel, &d)) {
        msgs = json_array();
        for (size_t i = 0; i < d.n_headings; i++) {
            const md_heading *h = &d.headings[i];
            if (h->level != 2) continue;
            const char *sp = strchr(h->text, ' ');
            size_t end = i + 1 < d.n_headings ? d.headings[i + 1].start : len, b = h->body;
            if (b < end && text[b] == '*')
                b = memchr(text + b, '\n', end - b) ? (size_t)((char *)memchr(text + b, '\n', end - b) - text) + 1
                                                    : end;
            while (b < end && text[b] == '\n') b++;
            while (end > b && (text[end - 1] == '\n' || text[end - 1] == ' ')) end--;
            json_array_append_new(msgs, json_pack("{s:s%, s:s, s:s%, s:s}", "id", h->text,
                                                  sp ? (size_t)(sp - h->text) : strlen(h->text), "speaker",
                                                  sp ? sp + 1 : "", "text", text + b, end - b, "heading", h->text));
        }
        if (created) snprintf(created, cap, "%s", d.created);
        md_doc_free(&d);
    }
    free(text);
    return msgs;
}

/* Asks the model; *out: the parsed JSON answer. Nonzero from the callback stops the run. */
hearth_status synth_ask(const hearth_memory_synth_options *o, const char *stage, const char *instructions,
                        json_t *input, json_t **out, hearth_error *err) {
    char *in = json_dumps(input, JSON_COMPACT), *answer = NULL;
    sbuf prompt;
    sbuf_init(&prompt);
    sbuf_printf(&prompt, "%s\n\nINPUT:\n%s\n", instructions, in ? in : "{}");
    free(in);
    int rc = o->llm(o->user, stage, prompt.data, &answer);
    sbuf_free(&prompt);
    if (rc) {
        free(answer);
        return err_set(err, HEARTH_ERR_IO,
                       "memory: synthesis stopped: the model failed at stage %s (nothing committed)", stage);
    }
    *out = answer ? synth_parse_answer(answer) : NULL;
    free(answer);
    return HEARTH_OK;
}

static int exec1(sqlite3 *db, const char *sql) { return sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK; }

/* Conversations in the index that synthesis has not seen (created since o->since). */
static hearth_status stage_segment(hearth_memory *m, const hearth_memory_synth_options *o, int *done,
                                   hearth_error *err) {
    static const char *instructions = "Split this conversation into topic segments. Answer with JSON only: "
                                      "[{\"topic\": \"short topic\", \"messages\": [\"<message id>\", ...]}].";
    sqlite3_stmt *q = NULL, *ins = NULL, *mark = NULL;
    sqlite3_prepare_v2(m->db,
                       "SELECT d.path FROM docs d WHERE d.kind='conversation' AND NOT EXISTS (SELECT 1 FROM syn_conv"
                       " c WHERE c.path=d.path AND c.segmented=1) ORDER BY d.path",
                       -1, &q, NULL);
    sqlite3_prepare_v2(m->db, "INSERT INTO syn_segment(conv, topic, messages) VALUES(?1,?2,?3)", -1, &ins, NULL);
    sqlite3_prepare_v2(m->db, "INSERT OR REPLACE INTO syn_conv(path, segmented) VALUES(?1, 1)", -1, &mark, NULL);
    hearth_status st = q && ins && mark ? HEARTH_OK : err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    while (!st && (o->limit <= 0 || *done < o->limit) && sqlite3_step(q) == SQLITE_ROW) {
        const char *conv = (const char *)sqlite3_column_text(q, 0);
        char created[64] = "";
        json_t *msgs = synth_conversation(m->root, conv, created, sizeof created);
        if (!msgs) continue;
        if (o->since && *o->since && strncmp(created, o->since, strlen(o->since)) < 0) {
            json_decref(msgs);
            continue;
        }
        (*done)++;
        if (o->dry_run) {
            json_decref(msgs);
            continue;
        }
        json_t *input = json_pack("{s:s, s:o}", "conversation", conv, "messages", msgs), *ans = NULL;
        st = synth_ask(o, "segment", instructions, input, &ans, err);
        json_decref(input);
        if (st) break;
        exec1(m->db, "BEGIN");
        size_t i;
        json_t *seg;
        json_array_foreach(ans, i, seg) {
            json_t *ids = json_object_get(seg, "messages");
            if (!json_is_array(ids)) continue;
            char *idtext = json_dumps(ids, JSON_COMPACT);
            const char *topic = json_string_value(json_object_get(seg, "topic"));
            sqlite3_bind_text(ins, 1, conv, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(ins, 2, topic ? topic : "", -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(ins, 3, idtext, -1, SQLITE_TRANSIENT);
            sqlite3_step(ins);
            sqlite3_reset(ins);
            free(idtext);
        }
        sqlite3_bind_text(mark, 1, conv, -1, SQLITE_TRANSIENT);
        sqlite3_step(mark);
        sqlite3_reset(mark);
        st = exec1(m->db, "COMMIT") ? err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db)) : HEARTH_OK;
        json_decref(ans);
    }
    sqlite3_finalize(q), sqlite3_finalize(ins), sqlite3_finalize(mark);
    return st;
}

/* The messages of msgs whose id is in ids. */
static json_t *pick(json_t *msgs, json_t *ids) {
    json_t *out = json_array(), *m, *id;
    size_t i, j;
    json_array_foreach(msgs, i, m)
        json_array_foreach(ids, j, id) if (json_is_string(id) &&
                                           !strcmp(json_string_value(id), json_string_value(json_object_get(m, "id"))))
            json_array_append(out, m);
    return out;
}

static hearth_status stage_extract(hearth_memory *m, const hearth_memory_synth_options *o, int *done,
                                   hearth_error *err) {
    static const char *instructions =
        "Extract the durable facts about the user from these messages (preferences, people, plans, "
        "possessions, events with dates), each citing the ids of the messages it comes from. Leave out "
        "passwords, keys and anything secret. Answer with JSON only: "
        "[{\"fact\": \"one sentence\", \"messages\": [\"<message id>\"]}].";
    sqlite3_stmt *q = NULL, *ins = NULL, *mark = NULL;
    sqlite3_prepare_v2(m->db, "SELECT id, conv, topic, messages FROM syn_segment WHERE extracted=0 ORDER BY id", -1, &q,
                       NULL);
    sqlite3_prepare_v2(m->db, "INSERT INTO syn_fact(segment, conv, text, cites, dropped) VALUES(?1,?2,?3,?4,?5)", -1,
                       &ins, NULL);
    sqlite3_prepare_v2(m->db, "UPDATE syn_segment SET extracted=1 WHERE id=?1", -1, &mark, NULL);
    hearth_status st = q && ins && mark ? HEARTH_OK : err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    while (!st && (o->limit <= 0 || *done < o->limit) && sqlite3_step(q) == SQLITE_ROW) {
        (*done)++;
        if (o->dry_run) continue;
        long long seg = sqlite3_column_int64(q, 0);
        const char *conv = (const char *)sqlite3_column_text(q, 1);
        json_t *all = synth_conversation(m->root, conv, NULL, 0);
        json_t *ids = json_loads((const char *)sqlite3_column_text(q, 3), 0, NULL);
        json_t *msgs = pick(all, ids), *ans = NULL;
        json_t *input =
            json_pack("{s:s, s:s, s:O}", "conversation", conv, "topic", sqlite3_column_text(q, 2), "messages", msgs);
        st = synth_ask(o, "extract", instructions, input, &ans, err);
        json_decref(input);
        if (!st) {
            exec1(m->db, "BEGIN");
            size_t i;
            json_t *f;
            json_array_foreach(ans, i, f) {
                const char *fact = json_string_value(json_object_get(f, "fact"));
                json_t *cited = pick(msgs, json_object_get(f, "messages")), *cites = json_array(), *c;
                size_t j;
                json_array_foreach(cited, j, c) { /* a citation names the message's heading */
                    char link[1200];
                    snprintf(link, sizeof link, "%.*s#%s", (int)(strlen(conv) - 3), conv,
                             json_string_value(json_object_get(c, "heading")));
                    json_array_append_new(cites, json_string(link));
                }
                json_decref(cited);
                if (!fact || !*fact) {
                    json_decref(cites);
                    continue;
                }
                /* the gate's first rules: a fact without a citation or with a secret is not memory */
                const char *dropped = synth_has_secret(fact) ? "secret" : json_array_size(cites) ? NULL : "uncited";
                char *citetext = json_dumps(cites, JSON_COMPACT);
                sqlite3_bind_int64(ins, 1, seg);
                sqlite3_bind_text(ins, 2, conv, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(ins, 3, dropped && !strcmp(dropped, "secret") ? "" : fact, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(ins, 4, citetext, -1, SQLITE_TRANSIENT);
                if (dropped)
                    sqlite3_bind_text(ins, 5, dropped, -1, SQLITE_STATIC);
                else
                    sqlite3_bind_null(ins, 5);
                sqlite3_step(ins);
                sqlite3_reset(ins);
                free(citetext);
                json_decref(cites);
            }
            sqlite3_bind_int64(mark, 1, seg);
            sqlite3_step(mark);
            sqlite3_reset(mark);
            st = exec1(m->db, "COMMIT") ? err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db)) : HEARTH_OK;
        }
        json_decref(ans), json_decref(msgs), json_decref(ids), json_decref(all);
    }
    sqlite3_finalize(q), sqlite3_finalize(ins), sqlite3_finalize(mark);
    return st;
}

/* Article titles become file names: letters, digits, spaces, '-' and '_' kept. */
void synth_article_name(const char *title, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = title; *p && o + 1 < cap; p++)
        if ((unsigned char)*p >= 0x80 || isalnum((unsigned char)*p) || *p == ' ' || *p == '-' || *p == '_')
            out[o++] = *p;
    while (o && out[o - 1] == ' ') o--;
    out[o] = 0;
    if (!o) snprintf(out, cap, "Untitled");
}

static hearth_status stage_route(hearth_memory *m, const hearth_memory_synth_options *o, int *done, hearth_error *err) {
    static const char *instructions =
        "Choose the article this fact belongs in: one of the existing titles, or a new short title "
        "(a person, place, project or topic). Answer with JSON only: {\"article\": \"Title\"}.";
    sqlite3_stmt *q = NULL, *set = NULL, *titles = NULL;
    sqlite3_prepare_v2(m->db, "SELECT id, text FROM syn_fact WHERE article IS NULL AND dropped IS NULL ORDER BY id", -1,
                       &q, NULL);
    sqlite3_prepare_v2(m->db, "UPDATE syn_fact SET article=?2 WHERE id=?1", -1, &set, NULL);
    sqlite3_prepare_v2(m->db,
                       "SELECT title FROM docs WHERE kind='article' UNION SELECT article FROM syn_stage"
                       " UNION SELECT article FROM syn_fact WHERE article IS NOT NULL AND article<>''",
                       -1, &titles, NULL);
    hearth_status st =
        q && set && titles ? HEARTH_OK : err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    while (!st && (o->limit <= 0 || *done < o->limit) && sqlite3_step(q) == SQLITE_ROW) {
        (*done)++;
        if (o->dry_run) continue;
        json_t *list = json_array(), *ans = NULL;
        while (sqlite3_step(titles) == SQLITE_ROW)
            json_array_append_new(list, json_string((const char *)sqlite3_column_text(titles, 0)));
        sqlite3_reset(titles);
        json_t *input = json_pack("{s:s, s:o}", "fact", sqlite3_column_text(q, 1), "articles", list);
        st = synth_ask(o, "route", instructions, input, &ans, err);
        json_decref(input);
        if (st) break;
        const char *title = json_string_value(json_object_get(ans, "article"));
        char name[200];
        synth_article_name(title ? title : "", name, sizeof name);
        sqlite3_bind_int64(set, 1, sqlite3_column_int64(q, 0));
        sqlite3_bind_text(set, 2, title && *title ? name : "Unsorted", -1, SQLITE_TRANSIENT);
        sqlite3_step(set);
        sqlite3_reset(set);
        json_decref(ans);
    }
    sqlite3_finalize(q), sqlite3_finalize(set), sqlite3_finalize(titles);
    return st;
}

hearth_status synth_stage(hearth_memory *m, const char *stage, const hearth_memory_synth_options *o, int *done,
                          int *rejected, json_t *articles, hearth_error *err) {
    if (!strcmp(stage, "segment")) return stage_segment(m, o, done, err);
    if (!strcmp(stage, "extract")) return stage_extract(m, o, done, err);
    if (!strcmp(stage, "route")) return stage_route(m, o, done, err);
    return stage_synthesize(m, o, done, rejected, articles, err);
}
