/* memory_changes.c: what synthesis changed (hearth_memory_changes): the last synthesis
 * commits on HEAD's first-parent line, each diffed against its parent by libgit2, as
 * per-file added and removed lines (no context), for the chat page's memory panel and
 * `hearth memory changes`. Reads the repository only. */
#include "base/err.h"
#include "memory/memory.h"
#include <git2.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A synthesis run's commit message starts with this (memory_synth_run.c's publish). */
#define SYNTH_SUMMARY "memory: synthesize"
/* Lines kept per file; the counts stay exact beyond it ("truncated": true). */
#define CHANGES_MAX_LINES 400

typedef struct diff_ctx {
    json_t *files; /* the commit's files, in diff order */
    json_t *file;  /* the one the next lines belong to (borrowed from files) */
} diff_ctx;

static int on_file(const git_diff_delta *d, float progress, void *user) {
    (void)progress;
    diff_ctx *c = user;
    const char *path = d->new_file.path ? d->new_file.path : d->old_file.path;
    const char *status = d->status == GIT_DELTA_ADDED     ? "added"
                         : d->status == GIT_DELTA_DELETED ? "deleted"
                         : d->status == GIT_DELTA_RENAMED ? "renamed"
                                                          : "modified";
    c->file =
        json_pack("{s:s, s:s, s:s, s:i, s:i, s:[], s:b}", "path", path, "kind", memory_kinds[memory_kind_of(path)],
                  "status", status, "added", 0, "removed", 0, "lines", "truncated", 0);
    if (!c->file) return -1;
    json_array_append_new(c->files, c->file);
    return 0;
}

static int on_line(const git_diff_delta *d, const git_diff_hunk *h, const git_diff_line *l, void *user) {
    (void)d, (void)h;
    diff_ctx *c = user;
    if (!c->file || (l->origin != GIT_DIFF_LINE_ADDITION && l->origin != GIT_DIFF_LINE_DELETION)) return 0;
    const char *key = l->origin == GIT_DIFF_LINE_ADDITION ? "added" : "removed";
    json_object_set_new(c->file, key, json_integer(json_integer_value(json_object_get(c->file, key)) + 1));
    json_t *lines = json_object_get(c->file, "lines");
    if (json_array_size(lines) >= CHANGES_MAX_LINES) {
        json_object_set_new(c->file, "truncated", json_true());
        return 0;
    }
    size_t n = l->content_len;
    while (n && (l->content[n - 1] == '\n' || l->content[n - 1] == '\r')) n--;
    json_t *text = json_stringn(l->content, n); /* NULL for bytes that are not UTF-8 */
    char op[2] = {l->origin == GIT_DIFF_LINE_ADDITION ? '+' : '-', 0};
    json_array_append_new(lines, json_pack("{s:s, s:o}", "op", op, "text", text ? text : json_string("(not UTF-8)")));
    return 0;
}

/* {"commit", "time", "message", "files"} of one commit against its first parent. */
static json_t *commit_changes(git_repository *repo, git_commit *commit) {
    git_commit *parent = NULL;
    git_tree *old_tree = NULL, *new_tree = NULL;
    git_diff *diff = NULL;
    git_diff_options opts;
    git_diff_options_init(&opts, GIT_DIFF_OPTIONS_VERSION);
    opts.context_lines = 0;
    diff_ctx c = {json_array(), NULL};
    int failed = !c.files ||
                 (git_commit_parentcount(commit) &&
                  (git_commit_parent(&parent, commit, 0) || git_commit_tree(&old_tree, parent))) ||
                 git_commit_tree(&new_tree, commit) || git_diff_tree_to_tree(&diff, repo, old_tree, new_tree, &opts) ||
                 git_diff_foreach(diff, on_file, NULL, NULL, on_line, &c);
    git_diff_free(diff);
    git_tree_free(old_tree), git_tree_free(new_tree);
    git_commit_free(parent);
    if (failed) {
        json_decref(c.files);
        return NULL;
    }
    char sha[GIT_OID_HEXSZ + 1], when[32];
    git_oid_tostr(sha, sizeof sha, git_commit_id(commit));
    time_t t = (time_t)git_commit_time(commit);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    const char *msg = git_commit_message(commit);
    json_t *message = json_stringn(msg, strcspn(msg, "\n"));
    return json_pack("{s:s, s:s, s:o, s:o}", "commit", sha, "time", when, "message",
                     message ? message : json_string(""), "files", c.files);
}

static hearth_status changes(git_repository *repo, int limit, json_t *out, hearth_error *err) {
    git_revwalk *walk = NULL;
    git_oid oid;
    if (git_revwalk_new(&walk, repo) || git_revwalk_push_head(walk)) {
        git_revwalk_free(walk);
        return HEARTH_OK; /* no commits yet: nothing changed */
    }
    git_revwalk_simplify_first_parent(walk);
    hearth_status st = HEARTH_OK;
    while (!st && (int)json_array_size(out) < limit && git_revwalk_next(&oid, walk) == 0) {
        git_commit *commit = NULL;
        if (git_commit_lookup(&commit, repo, &oid)) {
            st = err_set(err, HEARTH_ERR_IO, "memory: git: %s", git_error_last() ? git_error_last()->message : "?");
            break;
        }
        if (!strncmp(git_commit_message(commit), SYNTH_SUMMARY, strlen(SYNTH_SUMMARY))) {
            json_t *one = commit_changes(repo, commit);
            if (one)
                json_array_append_new(out, one);
            else
                st = err_set(err, HEARTH_ERR_IO, "memory: git diff: %s",
                             git_error_last() ? git_error_last()->message : "out of memory");
        }
        git_commit_free(commit);
    }
    git_revwalk_free(walk);
    return st;
}

hearth_status hearth_memory_changes(hearth_memory *m, int limit, char **out_json, hearth_error *err) {
    *out_json = NULL;
    if (limit < 1 || limit > HEARTH_MEMORY_CHANGES_MAX)
        return err_set(err, HEARTH_ERR_INVALID, "memory: limit must be 1 to %d", HEARTH_MEMORY_CHANGES_MAX);
    git_libgit2_init();
    git_repository *repo = NULL;
    hearth_status st = HEARTH_OK;
    json_t *list = json_array();
    if (!list)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    else if (git_repository_open_ext(&repo, m->root, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL))
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "memory: %s is not a git repository (run `hearth memory init`)",
                     m->root);
    else
        st = changes(repo, limit, list, err);
    git_repository_free(repo);
    git_libgit2_shutdown();
    if (!st && !(*out_json = json_dumps(list, JSON_COMPACT))) st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    json_decref(list);
    return st;
}
