/* memory_import.c: ingest into the vault. ChatGPT and Claude exports (conversations.json)
 * become Conversations/<content hash>.md, one heading per message (its id and speaker),
 * so a citation can name the message; Markdown and text files become Notes/. The same
 * content imported twice is skipped (the file name is its hash). System messages are
 * never stored. One commit per import, then the index is updated: searchable at once. */
#include "base/err.h"
#include "base/file.h"
#include "memory/memory.h"
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The first 16 hex digits of the SHA-256 of data: a content address. */
static void content_hash(const char *data, size_t len, char out[17]) {
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* One line of front matter: the value on one line, quoted when it needs to be. */
static void fm_line(sbuf *b, const char *key, const char *v) {
    if (!v || !*v) return;
    sbuf_printf(b, "%s: \"", key);
    for (const char *p = v; *p; p++)
        if (*p == '\n' || *p == '\r')
            sbuf_putc(b, ' ');
        else {
            if (*p == '"' || *p == '\\') sbuf_putc(b, '\\');
            sbuf_putc(b, *p);
        }
    sbuf_puts(b, "\"\n");
}

/* A message id is kept in the heading when it is short and plain (LoCoMo's "D1:3"),
 * else the message's position names it (m1, m2, ...). */
static int plain_id(const char *id) {
    if (!id || !*id || strlen(id) > 24) return 0;
    for (const char *p = id; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == ':' || *p == '-' || *p == '_' || *p == '.')) return 0;
    return 1;
}

/* A heading line must not be split or nest: the speaker's name on one line, no '#'. */
static void put_inline(sbuf *b, const char *s) {
    for (; *s; s++) sbuf_putc(b, *s == '\n' || *s == '\r' || *s == '#' ? ' ' : *s);
}

/* The Markdown body of a conversation (one heading per kept message) into body; returns
 * how many messages it kept (system messages and empty ones are not). */
static size_t conversation_body(const memory_message *msgs, size_t n, sbuf *body) {
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].text || !*msgs[i].text || (msgs[i].role && !strcmp(msgs[i].role, "system"))) continue;
        kept++;
        sbuf_puts(body, "\n## ");
        if (plain_id(msgs[i].id))
            sbuf_puts(body, msgs[i].id);
        else
            sbuf_printf(body, "m%zu", kept);
        sbuf_putc(body, ' ');
        put_inline(body, msgs[i].role && *msgs[i].role ? msgs[i].role : "unknown");
        sbuf_putc(body, '\n');
        if (msgs[i].time && *msgs[i].time) sbuf_printf(body, "*%s*\n", msgs[i].time);
        sbuf_printf(body, "\n%s\n", msgs[i].text);
    }
    return kept;
}

/* Where a conversation of these messages lives: Conversations/<content hash>.md. */
static int conversation_rel(const memory_message *msgs, size_t n, char *rel, size_t cap) {
    sbuf body;
    sbuf_init(&body);
    size_t kept = conversation_body(msgs, n, &body);
    char hash[17];
    if (kept) content_hash(body.data, body.len, hash);
    if (kept) snprintf(rel, cap, MEMORY_CONVERSATIONS "/%s.md", hash);
    sbuf_free(&body);
    return kept ? 0 : -1;
}

hearth_status memory_add_conversation(const char *root, const char *title, const char *source, const char *created,
                                      const memory_message *msgs, size_t n, int *added, hearth_error *err) {
    *added = 0;
    sbuf body, doc;
    sbuf_init(&body);
    sbuf_init(&doc);
    if (!conversation_body(msgs, n, &body)) {
        sbuf_free(&body);
        return HEARTH_OK;
    }
    char hash[17], rel[64];
    content_hash(body.data, body.len, hash);
    snprintf(rel, sizeof rel, MEMORY_CONVERSATIONS "/%s.md", hash);
    char *path = path_join(root, rel);
    hearth_status st = HEARTH_OK;
    if (path && !file_exists(path)) {
        sbuf_puts(&doc, "---\n");
        fm_line(&doc, "title", title && *title ? title : "Conversation");
        fm_line(&doc, "source", source);
        fm_line(&doc, "created", created);
        fm_line(&doc, "hash", hash);
        sbuf_puts(&doc, "---\n# ");
        put_inline(&doc, title && *title ? title : "Conversation");
        sbuf_putc(&doc, '\n');
        sbuf_append(&doc, body.data, body.len);
        st = doc.oom ? err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory")
                     : memory_write_file(root, rel, doc.data, doc.len, 0, err);
        *added = !st;
    }
    free(path);
    sbuf_free(&body);
    sbuf_free(&doc);
    return st;
}

static void iso_time(double t, char *out, size_t cap) {
    out[0] = 0;
    if (t <= 0) return;
    time_t s = (time_t)t;
    struct tm tm;
    if (gmtime_r(&s, &tm)) strftime(out, cap, "%Y-%m-%d %H:%M UTC", &tm);
}

typedef struct import_counts {
    int conversations, notes, skipped;
} import_counts;

/* The text of a ChatGPT message: its content.parts that are strings, joined. */
static char *chatgpt_text(json_t *msg) {
    json_t *parts = json_object_get(json_object_get(msg, "content"), "parts");
    sbuf b;
    sbuf_init(&b);
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) if (json_is_string(p) && json_string_length(p)) {
        if (b.len) sbuf_puts(&b, "\n\n");
        sbuf_puts(&b, json_string_value(p));
    }
    return sbuf_steal(&b);
}

/* A ChatGPT conversation is a tree (mapping: id -> {message, parent}); the visible
 * thread is current_node and its parents. */
static hearth_status import_chatgpt(const char *root, json_t *conv, import_counts *c, hearth_error *err) {
    json_t *mapping = json_object_get(conv, "mapping");
    const char *node = json_string_value(json_object_get(conv, "current_node"));
    size_t cap = json_object_size(mapping), n = 0;
    memory_message *msgs = calloc(cap + 1, sizeof *msgs);
    char **texts = calloc(cap + 1, sizeof *texts), (*times)[40] = calloc(cap + 1, sizeof *times);
    hearth_status st = msgs && texts && times ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    while (!st && node && n < cap) { /* n < cap: a parent cycle cannot loop forever */
        json_t *nd = json_object_get(mapping, node), *msg = json_object_get(nd, "message");
        if (!nd) break;
        if (json_is_object(msg)) {
            json_t *author = json_object_get(msg, "author");
            const char *name = json_string_value(json_object_get(author, "name"));
            msgs[n].role = name && *name ? name : json_string_value(json_object_get(author, "role"));
            if (json_string_value(json_object_get(author, "role")) &&
                !strcmp(json_string_value(json_object_get(author, "role")), "system"))
                msgs[n].role = "system";
            texts[n] = chatgpt_text(msg);
            msgs[n].text = texts[n];
            msgs[n].id = node;
            iso_time(json_number_value(json_object_get(msg, "create_time")), times[n], sizeof times[n]);
            msgs[n].time = times[n];
            n++;
        }
        node = json_string_value(json_object_get(nd, "parent"));
    }
    for (size_t i = 0; i < n / 2; i++) { /* parents first */
        memory_message t = msgs[i];
        msgs[i] = msgs[n - 1 - i];
        msgs[n - 1 - i] = t;
    }
    char created[40];
    iso_time(json_number_value(json_object_get(conv, "create_time")), created, sizeof created);
    int added = 0;
    if (!st)
        st = memory_add_conversation(root, json_string_value(json_object_get(conv, "title")), "chatgpt", created, msgs,
                                     n, &added, err);
    added ? c->conversations++ : c->skipped++;
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts), free(times), free(msgs);
    return st;
}

static hearth_status import_claude(const char *root, json_t *conv, import_counts *c, hearth_error *err) {
    json_t *list = json_object_get(conv, "chat_messages");
    size_t n = json_array_size(list);
    memory_message *msgs = calloc(n + 1, sizeof *msgs);
    if (!msgs) return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(list, i);
        const char *sender = json_string_value(json_object_get(m, "sender"));
        msgs[i].role = sender && !strcmp(sender, "human") ? "user" : sender;
        msgs[i].text = json_string_value(json_object_get(m, "text"));
        if (!msgs[i].text || !*msgs[i].text) { /* newer exports: content: [{type: text, text}] */
            json_t *part = json_array_get(json_object_get(m, "content"), 0);
            msgs[i].text = json_string_value(json_object_get(part, "text"));
        }
        msgs[i].time = json_string_value(json_object_get(m, "created_at"));
    }
    int added = 0;
    hearth_status st =
        memory_add_conversation(root, json_string_value(json_object_get(conv, "name")), "claude",
                                json_string_value(json_object_get(conv, "created_at")), msgs, n, &added, err);
    added ? c->conversations++ : c->skipped++;
    free(msgs);
    return st;
}

static hearth_status import_json(const char *root, const char *path, import_counts *c, hearth_error *err) {
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) return err_set(err, HEARTH_ERR_FORMAT, "memory: %s:%d: %s", path, je.line, je.text);
    hearth_status st = HEARTH_OK;
    json_t *first = json_array_get(doc, 0);
    int chatgpt = json_is_object(json_object_get(first, "mapping"));
    int claude = json_is_array(json_object_get(first, "chat_messages"));
    if (!json_is_array(doc) || (json_array_size(doc) && !chatgpt && !claude))
        st = err_set(err, HEARTH_ERR_FORMAT,
                     "memory: %s: not a ChatGPT or Claude export (an array of conversations with 'mapping' or "
                     "'chat_messages')",
                     path);
    size_t i;
    json_t *conv;
    json_array_foreach(doc, i, conv) {
        if (st) break;
        if (!json_is_object(conv)) continue;
        st = chatgpt ? import_chatgpt(root, conv, c, err) : import_claude(root, conv, c, err);
    }
    json_decref(doc);
    return st;
}

/* A Markdown or text file becomes Notes/<name>.md; a text file gets its name as title. */
static hearth_status import_note(const char *root, const char *path, const char *name, import_counts *c,
                                 hearth_error *err) {
    char *text = NULL;
    size_t len = 0;
    hearth_status st = file_read_all(path, &text, &len, err);
    if (st) return st;
    if (!md_valid_utf8(text, len)) {
        free(text);
        return err_set(err, HEARTH_ERR_FORMAT, "memory: %s: not valid UTF-8 text", path);
    }
    size_t nl = strlen(name);
    int md = nl > 3 && !strcmp(name + nl - 3, ".md");
    sbuf doc;
    sbuf_init(&doc);
    if (!md) sbuf_printf(&doc, "# %.*s\n\n", (int)(nl - 4), name);
    sbuf_append(&doc, text, len);
    free(text);
    char hash[17], rel[4200];
    content_hash(doc.data, doc.len, hash);
    snprintf(rel, sizeof rel, MEMORY_NOTES "/%.*s.md", (int)(nl - (md ? 3 : 4)), name);
    for (int attempt = 0; attempt < 2; attempt++) {
        char *target = path_join(root, rel), *old = NULL;
        size_t old_len = 0;
        int exists = target && !file_read_all(target, &old, &old_len, NULL);
        int same = exists && old_len == doc.len && !memcmp(old, doc.data, doc.len);
        free(old);
        free(target);
        if (same) {
            c->skipped++;
            break;
        }
        if (!exists) {
            st = memory_write_file(root, rel, doc.data, doc.len, 0, err);
            if (!st) c->notes++;
            break;
        }
        /* another file by that name: keep both, the new one under its hash */
        snprintf(rel, sizeof rel, MEMORY_NOTES "/%.*s-%.8s.md", (int)(nl - (md ? 3 : 4)), name, hash);
    }
    sbuf_free(&doc);
    return st;
}

static int has_ext(const char *name, const char *ext) {
    size_t n = strlen(name), e = strlen(ext);
    return n > e && !strcmp(name + n - e, ext);
}

static hearth_status import_path(const char *root, const char *path, const char *rel, import_counts *c, int top,
                                 hearth_error *err) {
    struct stat st_;
    if (stat(path, &st_)) return err_set(err, HEARTH_ERR_IO, "memory: %s: no such file or folder", path);
    if (S_ISDIR(st_.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return err_set(err, HEARTH_ERR_IO, "memory: cannot read the folder %s", path);
        struct dirent *e;
        hearth_status st = HEARTH_OK;
        while (!st && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char sub[4096], subrel[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            snprintf(subrel, sizeof subrel, rel[0] ? "%s/%s" : "%s%s", rel, e->d_name);
            st = import_path(root, sub, subrel, c, 0, err);
        }
        closedir(d);
        return st;
    }
    if (has_ext(path, ".json") && (top || has_ext(path, "conversations.json"))) return import_json(root, path, c, err);
    if (has_ext(path, ".md") || has_ext(path, ".txt") || has_ext(path, ".markdown"))
        return import_note(root, path, rel[0] ? rel : strrchr(path, '/') ? strrchr(path, '/') + 1 : path, c, err);
    if (top)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "memory: %s: not an export hearth reads (conversations.json, .md, .txt or a folder)", path);
    return HEARTH_OK; /* other files in a folder (images, attachments) are not memory */
}

hearth_status memory_log_append(const char *root, const char *line, hearth_error *err) {
    char *path = path_join(MEMORY_META, "log.md"), *full = path ? path_join(root, path) : NULL, *old = NULL;
    size_t len = 0;
    sbuf b;
    sbuf_init(&b);
    if (full && !file_read_all(full, &old, &len, NULL))
        sbuf_append(&b, old, len);
    else
        sbuf_puts(&b, "# Log\n\n");
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    sbuf_printf(&b, "- %s %s\n", when, line);
    hearth_status st = memory_write_file(root, path, b.data, b.len, 0, err);
    sbuf_free(&b);
    free(old), free(full), free(path);
    return st;
}

hearth_status hearth_memory_import(hearth_memory *m, const char *path, char **report_json, hearth_error *err) {
    if (report_json) *report_json = NULL;
    sbuf p;
    sbuf_init(&p);
    hearth_status st = HEARTH_OK;
    if (memory_vault_problems(m->root, &p))
        st = err_set(err, HEARTH_ERR_FORMAT, "memory: the vault at %s needs attention, nothing imported:\n%s", m->root,
                     p.data);
    sbuf_free(&p);
    import_counts c = {0};
    if (!st) st = import_path(m->root, path, "", &c, 1, err);
    int committed = 0;
    if (!st && (c.conversations || c.notes)) {
        char line[4400];
        snprintf(line, sizeof line, "import: %d conversation(s), %d note(s) from %s", c.conversations, c.notes, path);
        st = memory_log_append(m->root, line, err);
        char msg[4500];
        snprintf(msg, sizeof msg, "memory: %s", line);
        if (!st) st = memory_git_commit(m->root, msg, &committed, err);
    }
    if (!st) st = memory_index_sync(m, 0, NULL, NULL, err);
    if (!st && report_json) {
        json_t *r = json_pack("{s:i, s:i, s:i, s:b}", "conversations", c.conversations, "notes", c.notes, "skipped",
                              c.skipped, "committed", committed);
        *report_json = json_dumps(r, JSON_COMPACT);
        json_decref(r);
    }
    return st;
}

hearth_status hearth_memory_log_conversation(hearth_memory *m, const char *messages_json, const char *source,
                                             hearth_error *err) {
    json_t *arr = json_loads(messages_json ? messages_json : "", 0, NULL);
    size_t n = json_array_size(arr);
    memory_message *msgs = n ? calloc(n, sizeof *msgs) : NULL;
    hearth_status st =
        json_is_array(arr) && n
            ? (msgs ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory"))
            : err_set(err, HEARTH_ERR_INVALID, "memory: the log takes a non-empty JSON array of messages");
    const char *title = NULL;
    char created[40];
    iso_time((double)time(NULL), created, sizeof created);
    for (size_t i = 0; !st && i < n; i++) {
        json_t *msg = json_array_get(arr, i);
        msgs[i].role = json_string_value(json_object_get(msg, "role"));
        msgs[i].text = json_string_value(json_object_get(msg, "content"));
        if (!title && msgs[i].role && !strcmp(msgs[i].role, "user")) title = msgs[i].text;
    }
    char short_title[80] = "Chat"; /* the first user message, cut at a word, names the conversation */
    if (title) {
        snprintf(short_title, sizeof short_title, "%s", title);
        char *cut = strlen(title) >= sizeof short_title - 1 ? strrchr(short_title, ' ') : NULL;
        if (cut) *cut = 0;
    }
    int added = 0, committed = 0;
    if (!st)
        st = memory_add_conversation(m->root, short_title, source ? source : "hearth", created, msgs, n, &added, err);
    char prev[64]; /* the same chat one turn ago (its request and answer): replaced by this one */
    if (!st && added && n > 2 && !conversation_rel(msgs, n - 2, prev, sizeof prev)) {
        char *path = path_join(m->root, prev);
        if (path) unlink(path);
        free(path);
    }
    if (!st && added)
        st = memory_git_commit(m->root, "memory: log a conversation (hearth serve --memory-log)", &committed, err);
    if (!st && added) st = memory_index_sync(m, 0, NULL, NULL, err);
    free(msgs);
    json_decref(arr);
    return st;
}
