/* memory_vault.c: the vault on disk: a git repository written through libgit2. Files are
 * written whole (temp file + rename) and only inside the vault; Reference/ only by init.
 * Before any write the vault is checked (conflict markers, non-UTF-8 Markdown, a detached
 * HEAD, a locked index, a merge in progress): a vault with problems is reported, never
 * overwritten. Knows nothing of the index or of search. */
#include "base/err.h"
#include "base/file.h"
#include "memory/memory.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <git2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int rel_is_safe(const char *rel) {
    if (!rel[0] || rel[0] == '/') return 0;
    for (const char *p = rel; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 2 && !strncmp(p, "..", 2)) || (n == 1 && *p == '.') || (n == 4 && !strncmp(p, ".git", 4)) ||
            (n == 7 && !strncmp(p, ".hearth", 7)))
            return 0;
        p += n + (e ? 1 : 0);
    }
    return 1;
}

hearth_status memory_write_file(const char *root, const char *rel, const char *data, size_t len, int allow_reference,
                                hearth_error *err) {
    if (!rel_is_safe(rel)) return err_set(err, HEARTH_ERR_INVALID, "memory: '%s' is not a path inside the vault", rel);
    if (!allow_reference && !strncmp(rel, MEMORY_REFERENCE "/", strlen(MEMORY_REFERENCE) + 1))
        return err_set(err, HEARTH_ERR_INVALID, "memory: %s is read-only (Reference/ holds hearth's docs)", rel);
    char *path = path_join(root, rel);
    hearth_status st = HEARTH_OK;
    if (!path) return err_set(err, HEARTH_ERR_NOMEM, "memory: out of memory");
    if (file_mkdirs_parent(path))
        st = err_set(err, HEARTH_ERR_IO, "memory: cannot create the folder of %s: %s", path, strerror(errno));
    else if (file_write_atomic(path, data, len))
        st = err_set(err, HEARTH_ERR_IO, "memory: cannot write %s: %s", path, strerror(errno));
    free(path);
    return st;
}

/* Every Markdown file of the vault (not .git/ nor .hearth/), vault-relative. */
static void walk(const char *root, const char *rel, memory_walk_fn fn, void *user) {
    char dir[4096];
    snprintf(dir, sizeof dir, rel[0] ? "%s/%s" : "%s", root, rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ., .., .git, .hearth, .obsidian */
        char sub[4096];
        snprintf(sub, sizeof sub, rel[0] ? "%s/%s" : "%s%s", rel, e->d_name);
        char full[8200];
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (stat(full, &st)) continue;
        if (S_ISDIR(st.st_mode))
            walk(root, sub, fn, user);
        else if (S_ISREG(st.st_mode)) {
            size_t n = strlen(sub);
            if (n > 3 && !strcmp(sub + n - 3, ".md")) fn(user, sub, &st);
        }
    }
    closedir(d);
}

void memory_walk(const char *root, memory_walk_fn fn, void *user) { walk(root, "", fn, user); }

typedef struct problem_walk {
    const char *root;
    sbuf *out;
    int n;
} problem_walk;

static void check_file(void *user, const char *rel, const struct stat *st) {
    problem_walk *w = user;
    char path[8200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", w->root, rel);
    if (file_read_all(path, &text, &len, NULL)) return;
    if (md_has_conflict_markers(text, len)) {
        sbuf_printf(w->out, "%s: merge conflict markers (resolve the conflict, then commit)\n", rel);
        w->n++;
    } else if (!md_valid_utf8(text, len)) {
        sbuf_printf(w->out, "%s: not valid UTF-8\n", rel);
        w->n++;
    }
    free(text);
}

int memory_vault_problems(const char *root, sbuf *out) {
    problem_walk w = {root, out, 0};
    git_libgit2_init();
    git_repository *repo = NULL;
    if (git_repository_open_ext(&repo, root, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL)) {
        const git_error *ge = git_error_last();
        sbuf_printf(out, "%s: not a git repository (%s); run 'hearth memory init'\n", root, ge ? ge->message : "?");
        git_libgit2_shutdown();
        return 1;
    }
    if (git_repository_head_detached(repo) == 1) {
        sbuf_printf(out, "%s: HEAD is detached (check out a branch first)\n", root);
        w.n++;
    }
    if (git_repository_state(repo) != GIT_REPOSITORY_STATE_NONE) {
        sbuf_printf(out, "%s: a merge, rebase or cherry-pick is in progress\n", root);
        w.n++;
    }
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/index.lock", git_repository_path(repo));
    if (file_exists(lock)) {
        sbuf_printf(out, "%s: the git index is locked (another git is running, or remove %s)\n", root, lock);
        w.n++;
    }
    git_repository_free(repo);
    git_libgit2_shutdown();
    memory_walk(root, check_file, &w);
    return w.n;
}

static hearth_status git_fail(hearth_error *err, const char *root, const char *what) {
    const git_error *ge = git_error_last();
    return err_set(err, HEARTH_ERR_IO, "memory: %s: %s: %s", root, what, ge && ge->message ? ge->message : "failed");
}

/* The tree HEAD points at, or NULL on an unborn branch. */
static git_commit *head_commit(git_repository *repo) {
    git_oid oid;
    git_commit *c = NULL;
    if (git_reference_name_to_id(&oid, repo, "HEAD") == 0) git_commit_lookup(&c, repo, &oid);
    return c;
}

hearth_status memory_git_commit(const char *root, const char *message, int *committed, hearth_error *err) {
    *committed = 0;
    sbuf problems;
    sbuf_init(&problems);
    if (memory_vault_problems(root, &problems)) {
        hearth_status st =
            err_set(err, HEARTH_ERR_FORMAT, "memory: the vault needs attention, nothing written:\n%s", problems.data);
        sbuf_free(&problems);
        return st;
    }
    sbuf_free(&problems);
    git_libgit2_init();
    hearth_status st = HEARTH_OK;
    git_repository *repo = NULL;
    git_index *index = NULL;
    git_tree *tree = NULL;
    git_commit *parent = NULL;
    git_signature *sig = NULL;
    git_oid tree_id, commit_id;
    const char *all = "*";
    git_strarray spec = {(char **)&all, 1};
    if (git_repository_open_ext(&repo, root, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL)) {
        st = git_fail(err, root, "open");
        goto done;
    }
    if (git_repository_index(&index, repo) || git_index_add_all(index, &spec, GIT_INDEX_ADD_DEFAULT, NULL, NULL) ||
        git_index_update_all(index, &spec, NULL, NULL) || git_index_write(index) ||
        git_index_write_tree(&tree_id, index)) {
        st = git_fail(err, root, "stage");
        goto done;
    }
    parent = head_commit(repo);
    if (parent && git_oid_equal(git_commit_tree_id(parent), &tree_id)) goto done; /* nothing changed */
    if (git_tree_lookup(&tree, repo, &tree_id) ||
        (git_signature_default(&sig, repo) && git_signature_now(&sig, "hearth", "hearth@localhost"))) {
        st = git_fail(err, root, "commit");
        goto done;
    }
    const git_commit *parents[1] = {parent};
    if (git_commit_create(&commit_id, repo, "HEAD", sig, sig, NULL, message, tree, parent ? 1 : 0, parents)) {
        st = git_fail(err, root, "commit");
        goto done;
    }
    *committed = 1;
done:
    git_signature_free(sig);
    git_commit_free(parent);
    git_tree_free(tree);
    git_index_free(index);
    git_repository_free(repo);
    git_libgit2_shutdown();
    return st;
}

hearth_status memory_git_init(const char *root, hearth_error *err) {
    git_libgit2_init();
    git_repository *repo = NULL;
    hearth_status st = HEARTH_OK;
    if (git_repository_open_ext(&repo, root, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL) &&
        git_repository_init(&repo, root, 0))
        st = git_fail(err, root, "git init");
    git_repository_free(repo);
    git_libgit2_shutdown();
    return st;
}

hearth_status memory_git_head(const char *root, int *n_commits, char *summary, size_t cap, hearth_error *err) {
    *n_commits = 0;
    if (cap) summary[0] = 0;
    git_libgit2_init();
    git_repository *repo = NULL;
    git_revwalk *walker = NULL;
    hearth_status st = HEARTH_OK;
    if (git_repository_open_ext(&repo, root, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL)) {
        st = git_fail(err, root, "open");
        goto done;
    }
    git_commit *c = head_commit(repo);
    if (c) {
        snprintf(summary, cap, "%s", git_commit_summary(c) ? git_commit_summary(c) : "");
        git_commit_free(c);
        git_oid oid;
        if (!git_revwalk_new(&walker, repo) && !git_revwalk_push_head(walker))
            while (!git_revwalk_next(&oid, walker)) (*n_commits)++;
    }
done:
    git_revwalk_free(walker);
    git_repository_free(repo);
    git_libgit2_shutdown();
    return st;
}
