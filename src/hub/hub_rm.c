/* hub_rm.c: hearth_rm: removes snapshots of a repo from the HF cache, the refs that
 * name them and the blobs no remaining snapshot links to (huggingface_hub's own
 * delete_revisions does the same). Touches nothing outside models--org--name/. */
#define _GNU_SOURCE
#include "base/err.h"
#include "base/file.h"
#include "base/sbuf.h"
#include "hub/hub.h"
#include "io/resolve.h"
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* nftw has no user pointer: the walks' state lives here, one walk per thread. */
static __thread json_t *walk_links;    /* blob names linked from kept snapshots */
static __thread json_t *walk_refs;     /* ref names found under refs/ */
static __thread size_t walk_refs_root; /* strlen of "<repo>/refs/" */

static int collect_link(const char *path, const struct stat *st, int type, struct FTW *f) {
    if (type != FTW_SL) return 0;
    char target[4096];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    const char *base = strrchr(target, '/');
    json_object_set_new(walk_links, base ? base + 1 : target, json_true());
    return 0;
}

/* Refs are files under refs/, nested for names with slashes: huggingface_hub writes
 * revision "refs/pr/1" as refs/refs/pr/1. */
static int collect_ref(const char *path, const struct stat *st, int type, struct FTW *f) {
    if (type == FTW_F && strlen(path) > walk_refs_root)
        json_array_append_new(walk_refs, json_string(path + walk_refs_root));
    return 0;
}

static json_t *list_refs(const char *refs) {
    walk_refs = json_array();
    walk_refs_root = strlen(refs) + 1;
    nftw(refs, collect_ref, 16, FTW_PHYS);
    json_t *names = walk_refs;
    walk_refs = NULL;
    return names;
}

/* Removes the ref file refs/<name> and the folders its name made, as they empty. */
static void remove_ref(const char *refs, const char *name) {
    char *p = path_join(refs, name);
    if (!p || unlink(p)) {
        free(p);
        return;
    }
    for (char *slash = strrchr(p, '/'); slash && (size_t)(slash - p) > strlen(refs); slash = strrchr(p, '/')) {
        *slash = 0;
        if (rmdir(p)) break;
    }
    free(p);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *f) {
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

static int remove_tree(const char *dir) { return nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* org/name[@rev] typed by the user, or a name the resolver finds in the HF cache. */
static hearth_status repo_of(const char *model, char repo[HUB_NAME_MAX], char rev[HUB_NAME_MAX], int *has_rev,
                             hearth_error *err) {
    hearth_error ignored = {0};
    if (strchr(model, '/') && !file_exists(model) && !hub_parse_repo_arg(model, repo, rev, &ignored)) {
        *has_rev = strchr(model, '@') != NULL;
        return HEARTH_OK;
    }
    model_entry e;
    hearth_status st = resolve_model(model, &e, err);
    if (st) return st;
    if (strcmp(e.source, "hf-cache"))
        st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                     "%s: not in the Hugging Face cache (it is %s); hearth rm only removes what hearth pull "
                     "manages, delete the file or folder yourself",
                     e.name, e.path);
    else
        st = hub_parse_repo_arg(e.name, repo, rev, err);
    *has_rev = 0;
    resolve_entry_free(&e);
    return st;
}

static char *read_ref(const char *path) {
    char *s = NULL;
    size_t n = 0;
    if (file_read_all(path, &s, &n, NULL)) return NULL;
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) s[--n] = 0;
    return s;
}

static json_t *list_dir(const char *dir) {
    json_t *names = json_array();
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));)
        if (de->d_name[0] != '.') json_array_append_new(names, json_string(de->d_name));
    if (d) closedir(d);
    return names;
}

hearth_status hearth_rm(const char *model, int dry_run, char **report_json, hearth_error *err) {
    if (report_json) *report_json = NULL;
    char repo[HUB_NAME_MAX], rev[HUB_NAME_MAX];
    int has_rev = 0;
    hearth_status st = repo_of(model ? model : "", repo, rev, &has_rev, err);
    if (st) return st;
    char *hub = resolve_hf_cache_dir(), *folder = hub_repo_folder(repo);
    char *dir = hub && folder ? path_join(hub, folder) : NULL;
    char *snaps = dir ? path_join(dir, "snapshots") : NULL, *refs = dir ? path_join(dir, "refs") : NULL;
    char *blobs = dir ? path_join(dir, "blobs") : NULL;
    json_t *removed = json_array(), *all = snaps ? list_dir(snaps) : json_array();
    if (!dir || !file_is_dir(dir)) {
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "%s: not in the Hugging Face cache (%s)", repo, hub ? hub : "?");
        goto done;
    }
    /* which snapshots go: all of them, or the one the revision names */
    char *commit = NULL;
    if (has_rev) {
        sbuf p;
        sbuf_init(&p);
        sbuf_printf(&p, "%s/%s", refs, rev);
        commit = hub_safe_relpath(rev) ? read_ref(p.data) : NULL;
        sbuf_free(&p);
        if (!commit) commit = strdup(rev);
    }
    size_t i;
    json_t *name;
    json_array_foreach(all, i, name) if (!commit || !strcmp(commit, json_string_value(name)))
        json_array_append(removed, name);
    free(commit);
    if (!json_array_size(removed)) {
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "rm: %s has no snapshot for revision '%s'", repo, rev);
        goto done;
    }
    /* blobs still linked from the snapshots that stay */
    walk_links = json_object();
    json_array_foreach(all, i, name) {
        int going = 0;
        size_t j;
        json_t *r;
        json_array_foreach(removed, j, r) going |= json_equal(r, name);
        if (going) continue;
        char *p = path_join(snaps, json_string_value(name));
        if (p) nftw(p, collect_link, 16, FTW_PHYS);
        free(p);
    }
    long long freed = 0;
    int n_blobs = 0;
    json_t *blob_names = list_dir(blobs);
    json_array_foreach(blob_names, i, name) {
        const char *b = json_string_value(name);
        char base[256];
        snprintf(base, sizeof base, "%s", b);
        char *dot = strstr(base, ".incomplete");
        if (dot) *dot = 0;
        if (json_object_get(walk_links, base)) continue;
        char *p = path_join(blobs, b);
        struct stat sb;
        if (p && lstat(p, &sb) == 0) {
            freed += (long long)sb.st_size;
            n_blobs++;
            if (!dry_run) unlink(p);
        }
        free(p);
    }
    json_decref(blob_names);
    json_decref(walk_links);
    walk_links = NULL;
    if (!dry_run) {
        json_array_foreach(removed, i, name) {
            char *p = path_join(snaps, json_string_value(name));
            if (p) remove_tree(p);
            free(p);
        }
        if (json_array_size(removed) == json_array_size(all)) {
            if (remove_tree(dir) && errno != ENOENT)
                st = err_set(err, HEARTH_ERR_IO, "rm: %s: %s", dir, strerror(errno));
        } else { /* refs that named a removed snapshot, nested ones (refs/pr/N) included */
            json_t *ref_names = list_refs(refs);
            json_array_foreach(ref_names, i, name) {
                char *p = path_join(refs, json_string_value(name)), *c = p ? read_ref(p) : NULL;
                size_t j;
                json_t *r;
                int named = 0;
                json_array_foreach(removed, j, r) named |= c && !strcmp(c, json_string_value(r));
                if (named) remove_ref(refs, json_string_value(name));
                free(c);
                free(p);
            }
            json_decref(ref_names);
        }
    }
    if (!st && report_json) {
        json_t *o = json_pack("{s:s, s:s, s:O, s:i, s:I, s:b}", "model", repo, "repo_dir", dir, "snapshots", removed,
                              "blobs", n_blobs, "freed_bytes", (json_int_t)freed, "dry_run", dry_run);
        *report_json = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        json_decref(o);
    }
done:
    json_decref(removed);
    json_decref(all);
    free(blobs);
    free(refs);
    free(snaps);
    free(dir);
    free(folder);
    free(hub);
    return st;
}
