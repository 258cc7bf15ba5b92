/* memory.h: the personal memory's internals: the vault (a git repository of Markdown
 * written through libgit2), its Markdown reading (front matter, headings, wikilinks),
 * the derived SQLite index (FTS5 BM25 + embedding vectors) and the read-only tools.
 * The public face is the memory section of hearth.h; nothing here parses HTTP. */
#ifndef HEARTH_MEMORY_H
#define HEARTH_MEMORY_H
#include "base/sbuf.h"
#include "hearth.h"
#include <stddef.h>

struct sqlite3;

/* ---- Markdown (memory_md.c) ---- */
typedef struct md_heading {
    int level;         /* 1..6 */
    char text[256];    /* the heading's text, trimmed */
    char anchor[256];  /* its slug: lower case, spaces to '-', punctuation dropped */
    size_t start, end; /* byte range of the section: heading line up to the next heading of level <= this */
    size_t body;       /* where the section's text starts (after the heading line) */
} md_heading;

typedef struct md_doc {
    char title[256];      /* front matter title, else the first level-1 heading, else the file stem */
    char source[256];     /* front matter source (conversations), or "" */
    char created[64];     /* front matter created, or "" */
    size_t body;          /* first byte after the front matter */
    md_heading *headings; /* in order */
    size_t n_headings;
} md_doc;

/* Parses text (len bytes): front matter, headings outside code fences. stem: the file name
 * without .md, the title when nothing better is there. Returns 0, -1 on out of memory. */
int md_parse(const char *text, size_t len, const char *stem, md_doc *out);
void md_doc_free(md_doc *d);
/* The slug of a heading text into out (cap bytes). */
void md_slug(const char *text, size_t len, char *out, size_t cap);
/* The heading whose text or slug matches anchor (case-insensitive), or NULL. */
const md_heading *md_find_heading(const md_doc *d, const char *anchor);
/* Calls fn for every [[target]], [[target|alias]], [[target#heading]] outside code:
 * target and heading are NUL-terminated copies. Returns how many. */
typedef void (*md_link_fn)(void *user, const char *target, const char *heading);
size_t md_wikilinks(const char *text, size_t len, md_link_fn fn, void *user);
/* 1 when text holds a line starting with a git conflict marker (<<<<<<<, =======, >>>>>>>). */
int md_has_conflict_markers(const char *text, size_t len);
/* 1 when text is valid UTF-8. */
int md_valid_utf8(const char *text, size_t len);

/* ---- the vault (memory_vault.c) ---- */
struct hearth_memory {
    char *root;         /* the vault folder */
    struct sqlite3 *db; /* root/.hearth/index.sqlite */
    hearth_model *embed_model;
    hearth_embedder *embedder; /* NULL: BM25 only */
    char embed_name[256];
    float *vecs; /* cached vectors of every chunk, n_vecs x dim, loaded on first search */
    long long *vec_ids;
    unsigned char *vec_kinds; /* memory_kind_of of each vector's document */
    size_t n_vecs;
    int vecs_loaded;
    int dim;
};

/* Folders of a vault. Reference/ holds hearth's docs and is never written but by init. */
#define MEMORY_ARTICLES "articles"
#define MEMORY_REFERENCE "Reference"
#define MEMORY_META "Meta"
#define MEMORY_TALK "Talk"
#define MEMORY_CONVERSATIONS "Conversations"
#define MEMORY_NOTES "Notes"

/* Everything wrong with the vault that makes writing unsafe (conflict markers, non-UTF-8
 * Markdown, a detached HEAD, a locked git index), one problem per line into problems;
 * returns how many. */
int memory_vault_problems(const char *root, sbuf *problems);
/* Stages every change in the vault and commits it with message when the tree differs
 * from HEAD's; *committed: 1 when a commit was made. Refuses a vault with problems. */
hearth_status memory_git_commit(const char *root, const char *message, int *committed, hearth_error *err);
/* The number of commits on HEAD and the last commit's one-line summary. */
hearth_status memory_git_head(const char *root, int *n_commits, char *summary, size_t cap, hearth_error *err);
/* Writes a file inside the vault (rel: a vault-relative path), creating its folders.
 * Refuses paths under Reference/ unless allow_reference, and paths leaving the vault. */
hearth_status memory_write_file(const char *root, const char *rel, const char *data, size_t len, int allow_reference,
                                hearth_error *err);
/* Calls fn for every Markdown file of the vault (vault-relative path), skipping dot folders. */
struct stat;
typedef void (*memory_walk_fn)(void *user, const char *rel, const struct stat *st);
void memory_walk(const char *root, memory_walk_fn fn, void *user);
/* git init when root is not a repository yet. */
hearth_status memory_git_init(const char *root, hearth_error *err);

/* ---- hearth's docs embedded in the binary, for Reference/ (memory_reference.c) ---- */
typedef struct memory_reference_doc {
    const char *name; /* the file name under Reference/ */
    const char *data;
    size_t len;
} memory_reference_doc;
const memory_reference_doc *memory_reference_docs(size_t *n);

/* ---- the index (memory_index.c) ---- */
hearth_status memory_index_open(hearth_memory *m, hearth_error *err);
/* Brings the index in line with the vault's files (changed size or mtime re-read);
 * full: forget everything first. Counts of documents and chunks in *docs, *chunks. */
hearth_status memory_index_sync(hearth_memory *m, int full, long long *docs, long long *chunks, hearth_error *err);
/* The kind of a vault-relative path: "article", "reference", "conversation", "note",
 * "talk" or "meta" (its index in memory_kinds). */
extern const char *const memory_kinds[6];
int memory_kind_of(const char *rel);
/* The best chunks for query (hybrid BM25 + vector ranking, reciprocal rank fusion) as a
 * JSON array text (*out, caller frees): [{"path", "title", "kind", "anchor", "heading",
 * "text", "source", "score"}]. kind: NULL or one of memory_kinds. */
hearth_status memory_index_search(hearth_memory *m, const char *query, int limit, const char *kind, char **out,
                                  hearth_error *err);

/* ---- ingest (memory_import.c) ---- */
/* Writes one conversation as Conversations/<hash>.md unless one with the same content
 * is there; *added: 1 when new. roles/texts/ids: n messages (ids may hold NULLs). */
typedef struct memory_message {
    const char *role, *text, *id, *time;
} memory_message;
/* Appends "- <UTC time> <line>" to Meta/log.md. */
hearth_status memory_log_append(const char *root, const char *line, hearth_error *err);
hearth_status memory_add_conversation(const char *root, const char *title, const char *source, const char *created,
                                      const memory_message *msgs, size_t n, int *added, hearth_error *err);
#endif
