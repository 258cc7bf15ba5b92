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
    if (sqlite3_exec(m->db, synth_schema, NULL, NULL, &msg) == SQLITE_OK) {
        /* who a fact is about: added after the first vaults were made (fails when present) */
        sqlite3_exec(m->db, "ALTER TABLE syn_fact ADD COLUMN person TEXT", NULL, NULL, NULL);
        return HEARTH_OK;
    }
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

/* Bounds on what a stage may answer: a small model decoding greedily under a schema can
 * repeat itself until the grammar stops it, so every list and free string is capped well
 * above what a good answer needs and below SYNTH_MAX_TOKENS (src/cli/memory_synth.c). */
#define SYNTH_MAX_SEGMENTS 8
#define SYNTH_MAX_FACTS 8
#define SYNTH_MAX_CITES 4
#define SYNTH_TOPIC_CHARS 80
#define SYNTH_FACT_CHARS 240
#define SYNTH_PERSON_CHARS 60

static json_t *schema_string(int max_chars) {
    return json_pack("{s:s, s:i, s:i}", "type", "string", "minLength", 1, "maxLength", max_chars);
}

/* A list of message ids (ids: stolen): only ids of the input, none when it has none. */
static json_t *schema_ids(json_t *ids, size_t max_items) {
    size_t n = json_array_size(ids);
    json_t *item = n ? json_pack("{s:o}", "enum", ids) : (json_decref(ids), json_pack("{s:s}", "type", "string"));
    return json_pack("{s:s, s:o, s:i, s:i}", "type", "array", "items", item, "minItems", n ? 1 : 0, "maxItems",
                     (int)(n < max_items ? n : max_items));
}

/* [{"<keys[0]>": string, ..., "messages": [ids]}], at most max_items (ids: stolen); keys
 * and their length caps end with NULL. Properties are written in this order. */
static json_t *schema_list(const char *const *keys, const int *chars, json_t *ids, size_t max_ids, int max_items) {
    json_t *props = json_object(), *required = json_array();
    for (size_t k = 0; keys[k]; k++) {
        json_object_set_new(props, keys[k], schema_string(chars[k]));
        json_array_append_new(required, json_string(keys[k]));
    }
    json_object_set_new(props, "messages", schema_ids(ids, max_ids));
    json_array_append_new(required, json_string("messages"));
    json_t *item = json_pack("{s:s, s:o, s:o, s:b}", "type", "object", "properties", props, "required", required,
                             "additionalProperties", 0);
    return json_pack("{s:s, s:o, s:i}", "type", "array", "items", item, "maxItems", max_items);
}

json_t *synth_schema_segments(json_t *ids) {
    static const char *const keys[] = {"topic", NULL};
    static const int chars[] = {SYNTH_TOPIC_CHARS};
    return schema_list(keys, chars, ids, json_array_size(ids), SYNTH_MAX_SEGMENTS);
}

/* "person" first: a small model that names who a fact is about first writes a fact about
 * them instead of copying a message id into "fact" (SmolLM2-135M does both). */
json_t *synth_schema_facts(json_t *ids) {
    static const char *const keys[] = {"person", "fact", NULL};
    static const int chars[] = {SYNTH_PERSON_CHARS, SYNTH_FACT_CHARS};
    size_t n = json_array_size(ids); /* about one fact a message at most: caps a repeating model */
    return schema_list(keys, chars, ids, SYNTH_MAX_CITES, n && n < SYNTH_MAX_FACTS ? (int)n : SYNTH_MAX_FACTS);
}

/* A title is one to four capitalised words of at most 16 letters: free text lets a small
 * model copy the whole fact into the title (SmolLM2-135M does), and unbounded words let it
 * run on inside one. */
#define SYNTH_TITLE_PATTERN "^[A-Z][a-z0-9'-]{1,15}( [A-Za-z][a-z0-9'-]{0,15}){0,3}$"

json_t *synth_schema_route(void) {
    return json_pack("{s:s, s:{s:{s:s, s:s}}, s:[s], s:b}", "type", "object", "properties", "article", "type", "string",
                     "pattern", SYNTH_TITLE_PATTERN, "required", "article", "additionalProperties", 0);
}

json_t *synth_schema_article(size_t max_chars) {
    return json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "text",
                     schema_string((int)max_chars), "required", "text", "additionalProperties", 0);
}

/* msgs as the model reads them: speaker, text, id (the heading is hearth's own). */
static json_t *prompt_messages(json_t *msgs) {
    json_t *out = json_array(), *m;
    size_t i;
    json_array_foreach(msgs, i, m)
        json_array_append_new(out, json_pack("{s:O, s:O, s:O}", "speaker", json_object_get(m, "speaker"), "text",
                                             json_object_get(m, "text"), "id", json_object_get(m, "id")));
    return out;
}

/* The "id" of every message of msgs. */
static json_t *message_ids(json_t *msgs) {
    json_t *ids = json_array(), *m;
    size_t i;
    json_array_foreach(msgs, i, m) json_array_append(ids, json_object_get(m, "id"));
    return ids;
}

/* Asks the model; *out: the parsed JSON answer. Nonzero from the callback stops the run. */
hearth_status synth_ask(const hearth_memory_synth_options *o, const char *stage, const char *instructions,
                        json_t *input, json_t *schema, json_t **out, hearth_error *err) {
    char *in = json_dumps(input, JSON_COMPACT), *answer = NULL;
    char *schema_text = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    sbuf prompt;
    sbuf_init(&prompt);
    sbuf_printf(&prompt, "%s\n\nINPUT:\n%s\n", instructions, in ? in : "{}");
    free(in);
    int rc = o->llm(o->user, stage, prompt.data, schema_text, &answer);
    free(schema_text);
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

/* The model's segments made to cover the conversation: every message in exactly one, in
 * conversation order. A message given twice stays in its first segment; one left out joins
 * the segment of the message before it (the first segment at the start); without any
 * segment the whole conversation is one. Segments left empty are dropped. A small model's
 * segmentation then only groups messages and never loses one from extraction. */
json_t *synth_segments_cover(json_t *ans, json_t *msgs) {
    json_t *topics = json_array(), *lists = json_array(), *owner = json_object(), *seg, *id, *msg;
    size_t i, j;
    json_array_foreach(ans, i, seg) {
        json_t *ids = json_object_get(seg, "messages");
        if (!json_is_array(ids)) continue;
        const char *topic = json_string_value(json_object_get(seg, "topic"));
        json_array_foreach(ids, j, id) {
            if (json_is_string(id) && !json_object_get(owner, json_string_value(id)))
                json_object_set_new(owner, json_string_value(id), json_integer((json_int_t)json_array_size(lists)));
        }
        json_array_append_new(topics, json_string(topic ? topic : ""));
        json_array_append_new(lists, json_array());
    }
    if (!json_array_size(lists)) {
        json_array_append_new(topics, json_string(""));
        json_array_append_new(lists, json_array());
    }
    json_int_t at = 0;
    json_array_foreach(msgs, i, msg) {
        json_t *own = json_object_get(owner, json_string_value(json_object_get(msg, "id")));
        if (own) at = json_integer_value(own);
        json_array_append(json_array_get(lists, (size_t)at), json_object_get(msg, "id"));
    }
    json_t *out = json_array();
    json_array_foreach(lists, i, seg) {
        if (json_array_size(seg))
            json_array_append_new(out, json_pack("{s:O, s:O}", "topic", json_array_get(topics, i), "messages", seg));
    }
    json_decref(topics), json_decref(lists), json_decref(owner);
    return out;
}

/* Conversations in the index that synthesis has not seen (created since o->since). */
static hearth_status stage_segment(hearth_memory *m, const hearth_memory_synth_options *o, int *done,
                                   hearth_error *err) {
    static const char *instructions = "Split this conversation into topic segments: for each, a short topic "
                                      "name and the ids of its messages. Answer with a JSON list.";
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
        char key[32];
        if (o->since && *o->since && synth_since_key(o->since, key, sizeof key) == 0 && synth_before(created, key)) {
            json_decref(msgs);
            continue;
        }
        (*done)++;
        if (o->dry_run) {
            json_decref(msgs);
            continue;
        }
        json_t *schema = synth_schema_segments(message_ids(msgs)), *ans = NULL;
        json_t *input = json_pack("{s:o}", "messages", prompt_messages(msgs));
        st = synth_ask(o, "segment", instructions, input, schema, &ans, err);
        json_decref(input), json_decref(schema);
        json_t *segments = st ? NULL : synth_segments_cover(ans, msgs);
        json_decref(msgs), json_decref(ans);
        if (st) break;
        exec1(m->db, "BEGIN");
        size_t i;
        json_t *seg;
        json_array_foreach(segments, i, seg) {
            char *idtext = json_dumps(json_object_get(seg, "messages"), JSON_COMPACT);
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
        json_decref(segments);
    }
    sqlite3_finalize(q), sqlite3_finalize(ins), sqlite3_finalize(mark);
    return st;
}

/* The messages of msgs whose id is in ids, each once, in conversation order. */
static json_t *pick(json_t *msgs, json_t *ids) {
    json_t *out = json_array(), *m, *id;
    size_t i, j;
    json_array_foreach(msgs, i, m) {
        json_array_foreach(ids, j, id) {
            if (json_is_string(id) && !strcmp(json_string_value(id), json_string_value(json_object_get(m, "id")))) {
                json_array_append(out, m);
                break;
            }
        }
    }
    return out;
}

/* Messages the extract stage shows the model at once: a small model copies ids and repeats
 * itself on a long list, and answers about a few messages at a time (SmolLM2-135M on
 * LoCoMo sessions of 15-30 turns). A segment is still one transaction. */
#define SYNTH_EXTRACT_WINDOW 6

/* Words (runs of letters or digits) in text: a fact is a sentence, and a small model's
 * "fact" that is a message id or a bare name ("D1:12", "Melanie") is not one. */
static int words(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++)
        n += isalnum((unsigned char)*p) && (p == text || !isalnum((unsigned char)p[-1]));
    return n;
}

/* The facts one answer gives about window (its messages), appended to rows as
 * {"fact", "person", "cites", "dropped"}; a fact already in rows is not repeated. */
static void extract_rows(json_t *ans, json_t *window, const char *conv, json_t *rows) {
    size_t i, j;
    json_t *f, *c, *r;
    json_array_foreach(ans, i, f) {
        const char *fact = json_string_value(json_object_get(f, "fact"));
        const char *person = json_string_value(json_object_get(f, "person"));
        if (!fact || !*fact) continue;
        int seen = 0;
        json_array_foreach(rows, j, r) seen |= !strcmp(json_string_value(json_object_get(r, "fact")), fact);
        if (seen) continue;
        json_t *cited = pick(window, json_object_get(f, "messages")), *cites = json_array();
        json_array_foreach(cited, j, c) { /* a citation names the message's heading */
            char link[1200];
            snprintf(link, sizeof link, "%.*s#%s", (int)(strlen(conv) - 3), conv,
                     json_string_value(json_object_get(c, "heading")));
            json_array_append_new(cites, json_string(link));
        }
        json_decref(cited);
        /* the gate's first rules: a fact without a citation or with a secret is not memory */
        int secret = synth_has_secret(fact) || (person && synth_has_secret(person));
        const char *dropped = secret                    ? "secret"
                              : !json_array_size(cites) ? "uncited"
                              : words(fact) < 3         ? "fragment"
                                                        : NULL;
        json_array_append_new(rows, json_pack("{s:s, s:s, s:o, s:s?}", "fact", secret ? "" : fact, "person",
                                              person && !secret ? person : "", "cites", cites, "dropped", dropped));
    }
}

static hearth_status stage_extract(hearth_memory *m, const hearth_memory_synth_options *o, int *done,
                                   hearth_error *err) {
    static const char *instructions =
        "List the facts worth remembering about the people in these messages: their preferences, "
        "family and friends, plans, possessions, and events with dates. Write each fact as one short "
        "sentence that names the person, and give the ids of the messages it comes from. Skip greetings "
        "and small talk; leave out passwords, keys and anything secret. Answer with a JSON list.";
    sqlite3_stmt *q = NULL, *ins = NULL, *mark = NULL;
    sqlite3_prepare_v2(m->db, "SELECT id, conv, topic, messages FROM syn_segment WHERE extracted=0 ORDER BY id", -1, &q,
                       NULL);
    sqlite3_prepare_v2(m->db,
                       "INSERT INTO syn_fact(segment, conv, text, cites, dropped, person) VALUES(?1,?2,?3,?4,?5,?6)",
                       -1, &ins, NULL);
    sqlite3_prepare_v2(m->db, "UPDATE syn_segment SET extracted=1 WHERE id=?1", -1, &mark, NULL);
    hearth_status st = q && ins && mark ? HEARTH_OK : err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db));
    while (!st && (o->limit <= 0 || *done < o->limit) && sqlite3_step(q) == SQLITE_ROW) {
        (*done)++;
        if (o->dry_run) continue;
        long long seg = sqlite3_column_int64(q, 0);
        const char *conv = (const char *)sqlite3_column_text(q, 1);
        json_t *all = synth_conversation(m->root, conv, NULL, 0);
        json_t *ids = json_loads((const char *)sqlite3_column_text(q, 3), 0, NULL);
        json_t *msgs = pick(all, ids), *rows = json_array();
        for (size_t w = 0; !st && w < json_array_size(msgs); w += SYNTH_EXTRACT_WINDOW) {
            json_t *window = json_array(), *ans = NULL;
            for (size_t k = w; k < w + SYNTH_EXTRACT_WINDOW && k < json_array_size(msgs); k++)
                json_array_append(window, json_array_get(msgs, k));
            json_t *input =
                json_pack("{s:s, s:o}", "topic", sqlite3_column_text(q, 2), "messages", prompt_messages(window));
            json_t *schema = synth_schema_facts(message_ids(window));
            st = synth_ask(o, "extract", instructions, input, schema, &ans, err);
            json_decref(input), json_decref(schema);
            if (!st) extract_rows(ans, window, conv, rows);
            json_decref(ans), json_decref(window);
        }
        if (!st) {
            exec1(m->db, "BEGIN");
            size_t i;
            json_t *r;
            json_array_foreach(rows, i, r) {
                char *citetext = json_dumps(json_object_get(r, "cites"), JSON_COMPACT);
                const char *dropped = json_string_value(json_object_get(r, "dropped"));
                sqlite3_bind_int64(ins, 1, seg);
                sqlite3_bind_text(ins, 2, conv, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(ins, 3, json_string_value(json_object_get(r, "fact")), -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(ins, 4, citetext, -1, SQLITE_TRANSIENT);
                if (dropped)
                    sqlite3_bind_text(ins, 5, dropped, -1, SQLITE_TRANSIENT);
                else
                    sqlite3_bind_null(ins, 5);
                sqlite3_bind_text(ins, 6, json_string_value(json_object_get(r, "person")), -1, SQLITE_TRANSIENT);
                sqlite3_step(ins);
                sqlite3_reset(ins);
                free(citetext);
            }
            sqlite3_bind_int64(mark, 1, seg);
            sqlite3_step(mark);
            sqlite3_reset(mark);
            st = exec1(m->db, "COMMIT") ? err_set(err, HEARTH_ERR_IO, "memory: %s", sqlite3_errmsg(m->db)) : HEARTH_OK;
        }
        json_decref(rows), json_decref(msgs), json_decref(ids), json_decref(all);
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
        "Give the title of the article this fact goes in: the person it is about, or else a place, "
        "project or topic. Reuse a title from the list of articles when one fits. Answer with a JSON "
        "object.";
    sqlite3_stmt *q = NULL, *set = NULL, *titles = NULL;
    sqlite3_prepare_v2(m->db,
                       "SELECT id, text, coalesce(person, '') FROM syn_fact WHERE article IS NULL AND dropped IS NULL"
                       " ORDER BY id",
                       -1, &q, NULL);
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
        json_t *input = json_pack("{s:s, s:s, s:o}", "fact", sqlite3_column_text(q, 1), "person",
                                  sqlite3_column_text(q, 2), "articles", list);
        json_t *schema = synth_schema_route();
        st = synth_ask(o, "route", instructions, input, schema, &ans, err);
        json_decref(input), json_decref(schema);
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
