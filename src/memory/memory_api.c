/* memory_api.c: hearth.h's memory section: where the vault lives, init (git init, the
 * folders, Reference/ from the embedded docs, one commit), open (the index brought up to
 * date, the embedder loaded) and reindex. The tools are in memory_tools.c, ingest in
 * memory_import.c. */
#include "base/user_dirs.h"
#include "base/err.h"
#include "base/file.h"
#include "memory/memory.h"
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *hearth_memory_path(const hearth_memory_options *o) {
    if (o && o->path && *o->path) return strdup(o->path);
    /* HEARTH_WIKI is the documented override (docs/memory.md) */
    char *p = user_path("HEARTH_WIKI", USER_DATA, "hearth/wiki");
    return p ? p : strdup("hearth-wiki");
}

static const char *gitignore = "# hearth's derived index: rebuilt from the files at any time\n.hearth/\n*.tmp*\n";
static const char *meta_index =
    "# Index\n\nThis vault is hearth's personal memory: Markdown under git, written by `hearth memory`.\n\n"
    "- `articles/`: what hearth learned about you, one article per topic\n"
    "- `Conversations/`: imported and logged conversations, one heading per message\n"
    "- `Notes/`: imported Markdown and text\n"
    "- `Talk/`: open questions and contradictions about articles\n"
    "- `Reference/`: hearth's own documentation (read-only)\n"
    "- `Meta/`: this index and the log of changes\n";
static const char *meta_log = "# Log\n\nOne line per change hearth made to this vault.\n";

/* Writes rel when it is absent (keep: leave an existing file alone) or differs. */
static hearth_status put(const char *root, const char *rel, const char *data, size_t len, int keep, int *changed,
                         hearth_error *err) {
    char *path = path_join(root, rel), *old = NULL;
    size_t old_len = 0;
    int same =
        path && !file_read_all(path, &old, &old_len, NULL) && (keep || (old_len == len && !memcmp(old, data, len)));
    free(old);
    free(path);
    if (same) return HEARTH_OK;
    *changed = 1;
    return memory_write_file(root, rel, data, len, 1, err);
}

static hearth_status problems_error(const char *root, hearth_error *err) {
    sbuf p;
    sbuf_init(&p);
    hearth_status st = HEARTH_OK;
    if (memory_vault_problems(root, &p))
        st = err_set(err, HEARTH_ERR_FORMAT, "memory: the vault at %s needs attention, nothing written:\n%s", root,
                     p.data);
    sbuf_free(&p);
    return st;
}

hearth_status hearth_memory_init(const hearth_memory_options *o, char **report_json, hearth_error *err) {
    if (report_json) *report_json = NULL;
    char *root = hearth_memory_path(o);
    if (!root) return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    char git[4200];
    snprintf(git, sizeof git, "%s/.git", root);
    int created = !file_is_dir(git), changed = 0, committed = 0;
    hearth_status st = HEARTH_OK;
    if (file_mkdirs(root))
        st = err_set(err, HEARTH_ERR_IO, "memory: cannot create %s", root);
    else if (!created)
        st = problems_error(root, err);
    if (!st) st = memory_git_init(root, err);
    if (!st) st = put(root, ".gitignore", gitignore, strlen(gitignore), 1, &changed, err);
    if (!st) st = put(root, MEMORY_META "/index.md", meta_index, strlen(meta_index), 1, &changed, err);
    if (!st) st = put(root, MEMORY_META "/log.md", meta_log, strlen(meta_log), 1, &changed, err);
    if (!st) st = put(root, MEMORY_ARTICLES "/.gitkeep", "", 0, 1, &changed, err);
    if (!st) st = put(root, MEMORY_TALK "/.gitkeep", "", 0, 1, &changed, err);
    size_t n_ref = 0;
    const memory_reference_doc *ref = memory_reference_docs(&n_ref);
    for (size_t i = 0; i < n_ref && !st; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, MEMORY_REFERENCE "/%s", ref[i].name);
        st = put(root, rel, ref[i].data, ref[i].len, 0, &changed, err);
    }
    if (!st && changed)
        st = memory_git_commit(root,
                               created ? "memory: create the vault\n\nFolders, Meta/index.md and Reference/ "
                                         "(hearth " HEARTH_VERSION " docs)."
                                       : "memory: refresh Reference/ (hearth " HEARTH_VERSION " docs)",
                               &committed, err);
    if (!st && report_json) {
        json_t *r = json_pack("{s:s, s:b, s:b, s:i}", "path", root, "created", created, "committed", committed,
                              "reference", (int)n_ref);
        *report_json = json_dumps(r, JSON_COMPACT);
        json_decref(r);
    }
    free(root);
    return st;
}

hearth_status hearth_memory_open(const hearth_memory_options *o, hearth_memory **out, hearth_error *err) {
    *out = NULL;
    hearth_memory *m = calloc(1, sizeof *m);
    if (!m || !(m->root = hearth_memory_path(o))) {
        free(m);
        return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    }
    char git[4200];
    snprintf(git, sizeof git, "%s/.git", m->root);
    hearth_status st = HEARTH_OK;
    if (!file_is_dir(git))
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "memory: no vault at %s (run 'hearth memory init')", m->root);
    if (!st) st = memory_index_open(m, err);
    if (!st && o && o->embed_model && *o->embed_model) {
        hearth_embedder_options eo = {.n_threads = o->n_threads};
        st = hearth_model_open(o->embed_model, &m->embed_model, err);
        if (!st) st = hearth_embedder_create(m->embed_model, &eo, &m->embedder, err);
        if (st) err_prefix(err, "memory: embedding model %s: ", o->embed_model);
        snprintf(m->embed_name, sizeof m->embed_name, "%s", o->embed_model);
    }
    if (!st) st = memory_index_sync(m, 0, NULL, NULL, err);
    if (st) {
        hearth_memory_close(m);
        return st;
    }
    *out = m;
    return HEARTH_OK;
}

void hearth_memory_close(hearth_memory *m) {
    if (!m) return;
    if (m->db) sqlite3_close(m->db);
    hearth_embedder_free(m->embedder);
    hearth_model_close(m->embed_model);
    free(m->vecs), free(m->vec_ids), free(m->vec_kinds);
    free(m->root);
    free(m);
}

hearth_status hearth_memory_reindex(hearth_memory *m, char **report_json, hearth_error *err) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long long docs = 0, chunks = 0;
    hearth_status st = memory_index_sync(m, 1, &docs, &chunks, err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (!st && report_json) {
        json_t *r = json_pack("{s:I, s:I, s:f}", "documents", docs, "chunks", chunks, "seconds",
                              (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec));
        *report_json = json_dumps(r, JSON_COMPACT);
        json_decref(r);
    }
    return st;
}
