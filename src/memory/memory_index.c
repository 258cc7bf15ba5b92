/* memory_index.c: the vault's derived index, <vault>/.hearth/index.sqlite (ignored by
 * git, rebuilt from the files at any time): one row per document, its chunks (the text
 * under each heading, long ones split at paragraphs) in an FTS5 table ranked by BM25,
 * its [[wikilinks]], and an embedding vector per chunk text (cached by content hash, so a
 * rebuild re-embeds only what changed). Search fuses the BM25 and cosine rankings by
 * reciprocal rank. Never writes the vault. */
#include "base/err.h"
#include "base/hash.h"
#include "base/file.h"
#include "memory/memory.h"
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

const char *const memory_kinds[6] = {"article", "reference", "conversation", "note", "talk", "meta"};

int memory_kind_of(const char *rel) {
    static const char *const dirs[6] = {MEMORY_ARTICLES "/", MEMORY_REFERENCE "/", MEMORY_CONVERSATIONS "/",
                                        MEMORY_NOTES "/",    MEMORY_TALK "/",      MEMORY_META "/"};
    for (int k = 0; k < 6; k++)
        if (!strncmp(rel, dirs[k], strlen(dirs[k]))) return k;
    return 3; /* anything else the user put in the vault reads as a note */
}

/* How much a word in the messages before and after a conversation message counts against
 * one in it: a reply's words often answer what the message before it asked (LoCoMo's
 * evidence). */
#define CONTEXT_WEIGHT "0.15"
/* Raised when the schema changes: an index of another version is dropped and rebuilt. */
#define INDEX_VERSION 4
static const char *schema =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE IF NOT EXISTS docs(path TEXT PRIMARY KEY, title TEXT, kind TEXT, source TEXT, mtime INTEGER,"
    " size INTEGER);"
    "CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, path TEXT NOT NULL, anchor TEXT, heading TEXT,"
    " hash TEXT);"
    "CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);"
    "CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(title, heading, body, context, kind UNINDEXED,"
    " tokenize='porter unicode61');"
    /* title and heading words weigh twice the body's: a match there names the topic; the
     * neighbouring sections' words (context) a little */
    "INSERT INTO fts(fts, rank) VALUES('rank', 'bm25(2.0, 2.0, 1.0, " CONTEXT_WEIGHT ")');"
    "CREATE TABLE IF NOT EXISTS links(src TEXT, dst TEXT, heading TEXT);"
    "CREATE INDEX IF NOT EXISTS links_src ON links(src);"
    "CREATE INDEX IF NOT EXISTS links_dst ON links(dst);"
    "CREATE TABLE IF NOT EXISTS vectors(hash TEXT, model TEXT, vec BLOB, PRIMARY KEY(hash, model));";

static hearth_status db_fail(hearth_memory *m, hearth_error *err, const char *what) {
    return err_set(err, HEARTH_ERR_IO, "memory: %s/.hearth/index.sqlite: %s: %s", m->root, what, sqlite3_errmsg(m->db));
}

hearth_status memory_index_open(hearth_memory *m, hearth_error *err) {
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/.hearth", m->root);
    if (file_mkdirs(dir)) return err_set(err, HEARTH_ERR_IO, "memory: cannot create %s", dir);
    snprintf(path, sizeof path, "%s/index.sqlite", dir);
    if (sqlite3_open(path, &m->db) != SQLITE_OK) return db_fail(m, err, "open");
    sqlite3_busy_timeout(m->db, 5000); /* a CLI search while the server logs a conversation */
    char *msg = NULL;
    sqlite3_stmt *v;
    int version = -1;
    if (sqlite3_prepare_v2(m->db, "PRAGMA user_version", -1, &v, NULL) == SQLITE_OK) {
        if (sqlite3_step(v) == SQLITE_ROW) version = sqlite3_column_int(v, 0);
        sqlite3_finalize(v);
    }
    if (version != INDEX_VERSION) { /* derived data: start over (the vectors go too) */
        sqlite3_exec(m->db,
                     "DROP TABLE IF EXISTS docs; DROP TABLE IF EXISTS chunks; DROP TABLE IF EXISTS fts;"
                     "DROP TABLE IF EXISTS links; DROP TABLE IF EXISTS vectors;",
                     NULL, NULL, NULL);
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d", INDEX_VERSION);
        sqlite3_exec(m->db, pragma, NULL, NULL, NULL);
    }
    if (sqlite3_exec(m->db, schema, NULL, NULL, &msg) != SQLITE_OK) {
        hearth_status st = err_set(err, HEARTH_ERR_IO, "memory: %s: %s (delete it to rebuild)", path, msg);
        sqlite3_free(msg);
        return st;
    }
    return HEARTH_OK;
}

static void hash_hex(const char *a, size_t an, const char *b, size_t bn, char out[17]) {
    static const uint8_t sep = 0xff; /* a cache key, not a security boundary */
    uint64_t h = fnv1a64(fnv1a64(fnv1a64(FNV1A64_INIT, a, an), &sep, 1), b, bn);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

typedef struct sync_ctx {
    hearth_memory *m;
    sqlite3_stmt *get_doc, *del_doc, *del_fts, *del_chunks, *del_links, *ins_doc, *ins_chunk, *ins_fts, *ins_link,
        *ins_seen;
    const char *rel;
    hearth_status st;
    hearth_error *err;
} sync_ctx;

/* Chunks longer than this are split at a paragraph break: an embedding model reads about
 * 256 tokens (all-MiniLM-L6-v2's max_seq_length), roughly 1000 bytes of English. */
#define CHUNK_BYTES 1000

/* ctx: the text of the sections around this one (FTS context column only). */
static void add_chunk(sync_ctx *c, const char *title, const md_heading *h, const char *t, size_t len, const char *ctx,
                      size_t ctx_len) {
    while (len && (*t == '\n' || *t == ' ' || *t == '\r')) t++, len--;
    while (len) {
        size_t n = len;
        if (n > CHUNK_BYTES) { /* cut at the last blank line, else newline, else space */
            const char *cut = NULL;
            for (size_t i = CHUNK_BYTES; i > CHUNK_BYTES / 3 && !cut; i--)
                if (t[i] == '\n' && t[i - 1] == '\n') cut = t + i;
            for (size_t i = CHUNK_BYTES; i > CHUNK_BYTES / 3 && !cut; i--)
                if (t[i] == '\n' || t[i] == ' ') cut = t + i;
            n = cut ? (size_t)(cut - t) : CHUNK_BYTES;
            while (n < len && ((unsigned char)t[n] & 0xC0) == 0x80) n++; /* never split a character */
        }
        const char *head = h ? h->text : "";
        char hash[17];
        hash_hex(head, strlen(head), t, n, hash);
        sqlite3_stmt *s = c->ins_chunk;
        sqlite3_bind_text(s, 1, c->rel, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, h ? h->anchor : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, head, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, hash, -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE) c->st = db_fail(c->m, c->err, "insert chunk");
        sqlite3_reset(s);
        s = c->ins_fts;
        sqlite3_bind_int64(s, 1, sqlite3_last_insert_rowid(c->m->db));
        sqlite3_bind_text(s, 2, title, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, head, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, t, (int)n, SQLITE_STATIC);
        sqlite3_bind_text(s, 5, ctx, (int)ctx_len, SQLITE_STATIC);
        sqlite3_bind_text(s, 6, memory_kinds[memory_kind_of(c->rel)], -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE) c->st = db_fail(c->m, c->err, "insert text");
        sqlite3_reset(s);
        t += n, len -= n;
        while (len && (*t == '\n' || *t == ' ')) t++, len--;
    }
}

static void add_link(void *user, const char *target, const char *heading) {
    sync_ctx *c = user;
    sqlite3_stmt *s = c->ins_link;
    sqlite3_bind_text(s, 1, c->rel, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, target[0] ? target : c->rel, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, heading, -1, SQLITE_STATIC);
    sqlite3_step(s);
    sqlite3_reset(s);
}

static void run1(sqlite3_stmt *s, const char *rel) {
    sqlite3_bind_text(s, 1, rel, -1, SQLITE_STATIC);
    sqlite3_step(s);
    sqlite3_reset(s);
}

static void index_file(sync_ctx *c, const char *rel, const struct stat *st) {
    char path[8200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", c->m->root, rel);
    if (file_read_all(path, &text, &len, NULL)) return; /* vanished since the walk */
    char stem[256];
    const char *base = strrchr(rel, '/');
    snprintf(stem, sizeof stem, "%s", base ? base + 1 : rel);
    stem[strlen(stem) - 3] = 0; /* the walk only yields *.md */
    md_doc d;
    if (md_parse(text, len, stem, &d)) {
        free(text);
        c->st = err_set(c->err, HEARTH_ERR_NOMEM, "memory: out of memory");
        return;
    }
    c->rel = rel;
    run1(c->del_fts, rel);
    run1(c->del_chunks, rel);
    run1(c->del_links, rel);
    sqlite3_stmt *s = c->ins_doc;
    sqlite3_bind_text(s, 1, rel, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, d.title, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, memory_kinds[memory_kind_of(rel)], -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, d.source, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec);
    sqlite3_bind_int64(s, 6, (long long)st->st_size);
    if (sqlite3_step(s) != SQLITE_DONE) c->st = db_fail(c->m, c->err, "insert document");
    sqlite3_reset(s);
    size_t first = d.n_headings ? d.headings[0].start : len;
    int conversation = !strcmp(memory_kinds[memory_kind_of(rel)], "conversation");
    add_chunk(c, d.title, NULL, text + d.body, first - d.body, "", 0);
    for (size_t i = 0; i < d.n_headings; i++) {
        const md_heading *h = &d.headings[i];
        size_t end = i + 1 < d.n_headings ? d.headings[i + 1].start : len;
        /* a message's context: from the previous message's heading to the end of the next
         * one (an article's sections stand on their own, and the column would triple what
         * a large vault indexes: search p95 12 -> 50 ms on the 10,000-article vault) */
        size_t from = i ? d.headings[i - 1].start : h->start;
        size_t to = i + 2 < d.n_headings ? d.headings[i + 2].start : len;
        if (!conversation) from = to = 0;
        add_chunk(c, d.title, h, text + h->body, end - h->body, text + from, to - from);
    }
    md_wikilinks(text + d.body, len - d.body, add_link, c);
    md_doc_free(&d);
    free(text);
}

static void sync_file(void *user, const char *rel, const struct stat *st) {
    sync_ctx *c = user;
    if (c->st) return;
    run1(c->ins_seen, rel);
    sqlite3_stmt *s = c->get_doc;
    sqlite3_bind_text(s, 1, rel, -1, SQLITE_STATIC);
    int same = sqlite3_step(s) == SQLITE_ROW &&
               sqlite3_column_int64(s, 0) == (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec &&
               sqlite3_column_int64(s, 1) == (long long)st->st_size;
    sqlite3_reset(s);
    if (!same) index_file(c, rel, st);
}

static hearth_status embed_missing(hearth_memory *m, hearth_error *err);

hearth_status memory_index_sync(hearth_memory *m, int full, long long *docs, long long *chunks, hearth_error *err) {
    static const char *sql[] = {
        "SELECT mtime, size FROM docs WHERE path=?1",
        "DELETE FROM docs WHERE path=?1",
        "DELETE FROM fts WHERE rowid IN (SELECT id FROM chunks WHERE path=?1)",
        "DELETE FROM chunks WHERE path=?1",
        "DELETE FROM links WHERE src=?1",
        "INSERT OR REPLACE INTO docs(path, title, kind, source, mtime, size) VALUES(?1,?2,?3,?4,?5,?6)",
        "INSERT INTO chunks(path, anchor, heading, hash) VALUES(?1,?2,?3,?4)",
        "INSERT INTO fts(rowid, title, heading, body, context, kind) VALUES(?1,?2,?3,?4,?5,?6)",
        "INSERT INTO links(src, dst, heading) VALUES(?1,?2,?3)",
        "INSERT OR IGNORE INTO seen(path) VALUES(?1)",
    };
    sync_ctx c = {.m = m, .err = err};
    sqlite3_stmt **stmts[] = {&c.get_doc, &c.del_doc,   &c.del_fts, &c.del_chunks, &c.del_links,
                              &c.ins_doc, &c.ins_chunk, &c.ins_fts, &c.ins_link,   &c.ins_seen};
    if (sqlite3_exec(m->db,
                     "BEGIN IMMEDIATE; CREATE TEMP TABLE IF NOT EXISTS seen(path TEXT PRIMARY KEY);"
                     "DELETE FROM seen;",
                     NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(m, err, "begin");
    if (full && sqlite3_exec(m->db, "DELETE FROM docs; DELETE FROM chunks; DELETE FROM fts; DELETE FROM links;", NULL,
                             NULL, NULL) != SQLITE_OK)
        c.st = db_fail(m, err, "clear");
    for (size_t i = 0; i < sizeof sql / sizeof sql[0] && !c.st; i++)
        if (sqlite3_prepare_v2(m->db, sql[i], -1, stmts[i], NULL) != SQLITE_OK) c.st = db_fail(m, err, sql[i]);
    if (!c.st) memory_walk(m->root, sync_file, &c);
    if (!c.st &&
        sqlite3_exec(m->db,
                     "DELETE FROM fts WHERE rowid IN (SELECT id FROM chunks WHERE path NOT IN (SELECT path FROM seen));"
                     "DELETE FROM chunks WHERE path NOT IN (SELECT path FROM seen);"
                     "DELETE FROM links WHERE src NOT IN (SELECT path FROM seen);"
                     "DELETE FROM docs WHERE path NOT IN (SELECT path FROM seen);",
                     NULL, NULL, NULL) != SQLITE_OK)
        c.st = db_fail(m, err, "drop removed files");
    for (size_t i = 0; i < sizeof sql / sizeof sql[0]; i++) sqlite3_finalize(*stmts[i]);
    sqlite3_exec(m->db, c.st ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
    if (!c.st && m->embedder) c.st = embed_missing(m, err);
    m->vecs_loaded = 0;
    sqlite3_stmt *s;
    if (docs && sqlite3_prepare_v2(m->db, "SELECT (SELECT count(*) FROM docs), (SELECT count(*) FROM chunks)", -1, &s,
                                   NULL) == SQLITE_OK) {
        if (sqlite3_step(s) == SQLITE_ROW) *docs = sqlite3_column_int64(s, 0), *chunks = sqlite3_column_int64(s, 1);
        sqlite3_finalize(s);
    }
    return c.st;
}

/* Embeds title + heading + text of one chunk, truncated to the model's length. */
static hearth_status embed_texts(hearth_memory *m, char **texts, size_t n, float *out, hearth_error *err) {
    int32_t **ids = calloc(n, sizeof *ids);
    size_t *lens = calloc(n, sizeof *lens);
    hearth_status st = ids && lens ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    for (size_t i = 0; i < n && !st; i++)
        st = hearth_embed_tokenize(m->embedder, texts[i], strlen(texts[i]), 1, &ids[i], &lens[i], err);
    if (!st) st = hearth_embed(m->embedder, (const int32_t *const *)ids, lens, n, out, err);
    for (size_t i = 0; ids && i < n; i++) hearth_free(ids[i]);
    free(ids);
    free(lens);
    return st;
}

/* Embedding runs in batches of this many chunks: the embedder packs them into its steps. */
#define EMBED_BATCH 64

static hearth_status embed_missing(hearth_memory *m, hearth_error *err) {
    sqlite3_stmt *q = NULL, *ins = NULL;
    int dim = hearth_embedder_dim(m->embedder);
    hearth_status st = HEARTH_OK;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT c.hash, f.title, f.heading, f.body, f.kind FROM chunks c JOIN fts f ON f.rowid=c.id"
                           " WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.hash=c.hash AND v.model=?1)"
                           " GROUP BY c.hash",
                           -1, &q, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(m->db, "INSERT OR REPLACE INTO vectors(hash, model, vec) VALUES(?1,?2,?3)", -1, &ins,
                           NULL) != SQLITE_OK)
        st = db_fail(m, err, "embed");
    char *texts[EMBED_BATCH], hashes[EMBED_BATCH][17];
    float *vec = malloc(sizeof(float) * EMBED_BATCH * dim);
    if (!vec) st = err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    sqlite3_bind_text(q, 1, m->embed_name, -1, SQLITE_STATIC);
    sqlite3_exec(m->db, "BEGIN", NULL, NULL, NULL);
    for (int done = 0; !st && !done;) {
        size_t n = 0;
        while (n < EMBED_BATCH && !(done = sqlite3_step(q) != SQLITE_ROW)) {
            snprintf(hashes[n], 17, "%s", (const char *)sqlite3_column_text(q, 0));
            sbuf b;
            sbuf_init(&b);
            const char *body = (const char *)sqlite3_column_text(q, 3), *head = (const char *)sqlite3_column_text(q, 2);
            if (!strcmp((const char *)sqlite3_column_text(q, 4), "conversation") && *head) {
                /* a message: its speaker and words; the conversation's title and the
                 * message's time line are the same for its neighbours and would make all
                 * of a conversation's short messages look alike to the embedding model */
                const char *speaker = strchr(head, ' ');
                if (body[0] == '*' && strchr(body + 1, '\n')) body = strchr(body + 1, '\n') + 1;
                while (*body == '\n') body++;
                sbuf_printf(&b, "%s: %s", speaker ? speaker + 1 : head, body);
            } else
                sbuf_printf(&b, "%s: %s\n%s", sqlite3_column_text(q, 1), head, body);
            texts[n++] = sbuf_steal(&b);
        }
        if (n) st = embed_texts(m, texts, n, vec, err);
        for (size_t i = 0; i < n; i++) {
            if (!st) {
                sqlite3_bind_text(ins, 1, hashes[i], -1, SQLITE_STATIC);
                sqlite3_bind_text(ins, 2, m->embed_name, -1, SQLITE_STATIC);
                sqlite3_bind_blob(ins, 3, vec + i * dim, (int)(sizeof(float) * dim), SQLITE_STATIC);
                if (sqlite3_step(ins) != SQLITE_DONE) st = db_fail(m, err, "store vector");
                sqlite3_reset(ins);
            }
            free(texts[i]);
        }
    }
    sqlite3_exec(m->db, st ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
    free(vec);
    sqlite3_finalize(q);
    sqlite3_finalize(ins);
    return st;
}

static hearth_status load_vectors(hearth_memory *m, hearth_error *err) {
    free(m->vecs), free(m->vec_ids), free(m->vec_kinds);
    m->vecs = NULL, m->vec_ids = NULL, m->vec_kinds = NULL, m->n_vecs = 0;
    m->dim = hearth_embedder_dim(m->embedder);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT c.id, c.path, v.vec FROM chunks c JOIN vectors v ON v.hash=c.hash AND v.model=?1",
                           -1, &s, NULL) != SQLITE_OK)
        return db_fail(m, err, "load vectors");
    sqlite3_bind_text(s, 1, m->embed_name, -1, SQLITE_STATIC);
    size_t cap = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        if (sqlite3_column_bytes(s, 2) != (int)(sizeof(float) * m->dim)) continue;
        if (m->n_vecs == cap) {
            cap = cap ? cap * 2 : 1024;
            float *v = realloc(m->vecs, cap * m->dim * sizeof *v);
            long long *id = realloc(m->vec_ids, cap * sizeof *id);
            unsigned char *k = realloc(m->vec_kinds, cap);
            if (v) m->vecs = v;
            if (id) m->vec_ids = id;
            if (k) m->vec_kinds = k;
            if (!v || !id || !k) {
                sqlite3_finalize(s);
                return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory loading vectors");
            }
        }
        memcpy(m->vecs + m->n_vecs * m->dim, sqlite3_column_blob(s, 2), sizeof(float) * m->dim);
        m->vec_ids[m->n_vecs] = sqlite3_column_int64(s, 0);
        m->vec_kinds[m->n_vecs++] = (unsigned char)memory_kind_of((const char *)sqlite3_column_text(s, 1));
    }
    sqlite3_finalize(s);
    m->vecs_loaded = 1;
    return HEARTH_OK;
}

typedef struct ranked {
    long long id;
    double score;
} ranked;

static int by_score_desc(const void *a, const void *b) {
    double x = ((const ranked *)a)->score, y = ((const ranked *)b)->score;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* How many chunks hold a term (a quoted FTS5 phrase): counting a posting list is cheap,
 * ranking it is not. */
static long long term_chunks(sqlite3_stmt *count, const char *phrase) {
    sqlite3_bind_text(count, 1, phrase, -1, SQLITE_STATIC);
    long long n = sqlite3_step(count) == SQLITE_ROW ? sqlite3_column_int64(count, 0) : 0;
    sqlite3_reset(count);
    return n;
}

/* A term in more than this share of all chunks is left out of the ranking query (unless
 * every term is): its BM25 weight is below ln(1 + 9) against about ln(N) for a rare term,
 * so it hardly moves the order (Lucene's "common terms" reasoning). */
#define COMMON_TERM_SHARE 0.10
/* Ranking costs about 4 us per matching chunk on one core (bench/results/memory_search.md):
 * terms are added rarest first while their matches stay within this many, which keeps a
 * search near 20 ms on a large vault and changes nothing on a vault of fewer chunks. */
#define RANK_BUDGET_CHUNKS 4000
#define MAX_QUERY_TERMS 32

typedef struct query_term {
    char phrase[160];
    long long chunks;
} query_term;

static int by_chunks(const void *a, const void *b) {
    long long x = ((const query_term *)a)->chunks, y = ((const query_term *)b)->chunks;
    return x < y ? -1 : x > y;
}

/* The query as an FTS5 expression: every word quoted (no operator injection), OR-ed, so
 * BM25 ranks chunks by how many rare query words they hold. Stop words, terms common in
 * this vault and terms past the ranking budget are dropped; the rarest term always stays.
 * Returns 0 when the expression is worth no BM25 ranking (see below), else 1. */
static int fts_query(hearth_memory *m, const char *q, sbuf *out) {
    static const char *stop[] = {"a",    "an",   "and",  "are",   "as",    "at",   "be",  "by",   "did",  "do",
                                 "does", "for",  "from", "had",   "has",   "have", "how", "i",    "in",   "is",
                                 "it",   "its",  "of",   "on",    "or",    "that", "the", "this", "to",   "was",
                                 "were", "what", "when", "where", "which", "who",  "why", "will", "with", "you"};
    sqlite3_stmt *count = NULL, *total = NULL;
    long long n_chunks = 0;
    if (sqlite3_prepare_v2(m->db, "SELECT count(*) FROM chunks", -1, &total, NULL) == SQLITE_OK &&
        sqlite3_step(total) == SQLITE_ROW)
        n_chunks = sqlite3_column_int64(total, 0);
    sqlite3_finalize(total);
    if (sqlite3_prepare_v2(m->db, "SELECT count(*) FROM fts WHERE fts MATCH ?1", -1, &count, NULL) != SQLITE_OK)
        return 1;
    query_term terms[MAX_QUERY_TERMS];
    size_t n_terms = 0;
    for (const char *p = q; *p && n_terms < MAX_QUERY_TERMS;) {
        while (*p && !((unsigned char)*p >= 0x80 || isalnum((unsigned char)*p))) p++;
        const char *w = p;
        while (*p && ((unsigned char)*p >= 0x80 || isalnum((unsigned char)*p))) p++;
        size_t n = (size_t)(p - w);
        if (!n || n > 150) continue;
        int skip = 0;
        for (size_t i = 0; i < sizeof stop / sizeof stop[0] && !skip; i++)
            skip = strlen(stop[i]) == n && !strncasecmp(stop[i], w, n);
        query_term *t = &terms[n_terms];
        snprintf(t->phrase, sizeof t->phrase, "\"%.*s\"", (int)n, w);
        for (size_t i = 0; i < n_terms && !skip; i++) skip = !strcasecmp(terms[i].phrase, t->phrase);
        if (skip || !(t->chunks = term_chunks(count, t->phrase))) continue;
        n_terms++;
    }
    qsort(terms, n_terms, sizeof *terms, by_chunks);
    if (n_terms > 1 && terms[0].chunks > RANK_BUDGET_CHUNKS) { /* every term is common: all of them at once */
        for (size_t i = 0; i < n_terms; i++) sbuf_printf(out, "%s%s", i ? " AND " : "", terms[i].phrase);
        long long both = term_chunks(count, out->data);
        if (both > 0 && both < terms[0].chunks) {
            sqlite3_finalize(count);
            return both <= RANK_BUDGET_CHUNKS;
        }
        sbuf_reset(out);
    }
    sqlite3_finalize(count);
    long long ranked = 0;
    for (size_t i = 0; i < n_terms; i++) {
        if (i && ((double)terms[i].chunks > COMMON_TERM_SHARE * (double)n_chunks ||
                  ranked + terms[i].chunks > RANK_BUDGET_CHUNKS))
            break;
        if (i) sbuf_puts(out, " OR ");
        sbuf_puts(out, terms[i].phrase);
        ranked += terms[i].chunks;
    }
    /* no term tells chunks apart (the rarest is in most of them and past the budget): BM25
     * would order them by length and repetition alone, so the matches are taken as they
     * come and the vectors, when there are any, rank them */
    return !(n_terms && (double)ranked > COMMON_TERM_SHARE * (double)n_chunks && ranked > RANK_BUDGET_CHUNKS);
}

/* Reciprocal rank fusion's constant (Cormack et al. 2009): damps the head of each list. */
#define RRF_K 60.0

/* A vector rank counts this much of a BM25 rank in the fusion. On LoCoMo (single chat
 * messages, all-MiniLM-L6-v2) equal weights lost 3 points of recall@5 to BM25 alone, while
 * the vectors still found what multi-hop questions need; at 0.3 they keep most of that and
 * lose little (bench/results/memory_locomo.md). */
#define VECTOR_WEIGHT 0.3

static int add_rank(ranked *r, int n, long long id, int rank, double weight) {
    for (int i = 0; i < n; i++)
        if (r[i].id == id) {
            r[i].score += weight / (RRF_K + rank);
            return n;
        }
    r[n].id = id;
    r[n].score = weight / (RRF_K + rank);
    return n + 1;
}

static hearth_status vector_ranks(hearth_memory *m, const char *query, int kind, int k, ranked *r, int *n,
                                  hearth_error *err) {
    if (!m->vecs_loaded) {
        hearth_status st = load_vectors(m, err);
        if (st) return st;
    }
    float *qv = malloc(sizeof(float) * m->dim);
    char *text = (char *)query;
    hearth_status st = qv ? embed_texts(m, &text, 1, qv, err) : err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    ranked *top = calloc((size_t)k, sizeof *top);
    if (!st && !top) st = err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    int nt = 0;
    for (size_t i = 0; !st && top && i < m->n_vecs; i++) {
        if (kind >= 0 && m->vec_kinds[i] != kind) continue;
        const float *v = m->vecs + i * m->dim;
        double dot = 0;
        for (int d = 0; d < m->dim; d++) dot += v[d] * qv[d];
        if (nt == k && dot <= top[nt - 1].score) continue;
        int j = nt < k ? nt++ : k - 1; /* insertion into the sorted top k */
        while (j > 0 && top[j - 1].score < dot) top[j] = top[j - 1], j--;
        top[j].id = m->vec_ids[i];
        top[j].score = dot;
    }
    for (int i = 0; !st && top && i < nt; i++) *n = add_rank(r, *n, top[i].id, i + 1, VECTOR_WEIGHT);
    free(top);
    free(qv);
    return st;
}

static json_t *result_of(hearth_memory *m, sqlite3_stmt *s, long long id, double score) {
    sqlite3_bind_int64(s, 1, id);
    json_t *o = NULL;
    if (sqlite3_step(s) == SQLITE_ROW) {
        const char *text = (const char *)sqlite3_column_text(s, 5);
        o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:f}", "path", sqlite3_column_text(s, 0), "title",
                      sqlite3_column_text(s, 1), "kind", sqlite3_column_text(s, 2), "anchor", sqlite3_column_text(s, 3),
                      "heading", sqlite3_column_text(s, 4), "text", text ? text : "", "source",
                      sqlite3_column_text(s, 6) ? (const char *)sqlite3_column_text(s, 6) : "", "score", score);
    }
    sqlite3_reset(s);
    return o;
}

hearth_status memory_index_search(hearth_memory *m, const char *query, int limit, const char *kind_name, char **out,
                                  hearth_error *err) {
    *out = NULL;
    int kind = -1;
    for (int k = 0; kind_name && k < 6; k++)
        if (!strcmp(kind_name, memory_kinds[k])) kind = k;
    if (kind_name && kind < 0)
        return err_set(err, HEARTH_ERR_INVALID,
                       "memory: unknown kind '%s' (article, reference, conversation, note, "
                       "talk or meta)",
                       kind_name);
    if (limit < 1) limit = 1;
    int k = limit * 10 < 50 ? 50 : limit * 10; /* candidates per ranking before fusion */
    ranked *r = calloc((size_t)2 * k, sizeof *r);
    if (!r) return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    int n = 0;
    hearth_status st = HEARTH_OK;
    sbuf q;
    sbuf_init(&q);
    int ranked = fts_query(m, query, &q);
    sqlite3_stmt *s = NULL;
    if (q.len) {
        if (sqlite3_prepare_v2(m->db,
                               ranked ? "SELECT rowid FROM fts WHERE fts MATCH ?1 AND (?2 IS NULL OR kind=?2)"
                                        " ORDER BY rank LIMIT ?3"
                                      : "SELECT rowid FROM fts WHERE fts MATCH ?1 AND (?2 IS NULL OR kind=?2) LIMIT ?3",
                               -1, &s, NULL) != SQLITE_OK)
            st = db_fail(m, err, "search");
        else {
            sqlite3_bind_text(s, 1, q.data, -1, SQLITE_STATIC);
            if (kind >= 0) sqlite3_bind_text(s, 2, memory_kinds[kind], -1, SQLITE_STATIC);
            sqlite3_bind_int(s, 3, k);
            for (int rank = 1; sqlite3_step(s) == SQLITE_ROW; rank++)
                n = add_rank(r, n, sqlite3_column_int64(s, 0), rank, 1.0);
        }
        sqlite3_finalize(s);
    }
    sbuf_free(&q);
    if (!st && m->embedder && *query) st = vector_ranks(m, query, kind, k, r, &n, err);
    qsort(r, (size_t)n, sizeof *r, by_score_desc);
    json_t *arr = json_array();
    if (!st && sqlite3_prepare_v2(m->db,
                                  "SELECT c.path, d.title, d.kind, c.anchor, c.heading, f.body, d.source FROM chunks c"
                                  " JOIN docs d ON d.path=c.path JOIN fts f ON f.rowid=c.id WHERE c.id=?1",
                                  -1, &s, NULL) == SQLITE_OK) {
        for (int i = 0; i < n && (int)json_array_size(arr) < limit; i++) {
            json_t *o = result_of(m, s, r[i].id, r[i].score);
            if (o) json_array_append_new(arr, o);
        }
        sqlite3_finalize(s);
    }
    free(r);
    if (!st) *out = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return st;
}
