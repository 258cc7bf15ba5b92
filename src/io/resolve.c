/* resolve.c: model name resolution (see resolve.h). Search order for names that are
 * not paths: HF cache repos, then $HEARTH_MODELS folders (colon-separated), then
 * $HEARTH_CACHE/models. An exact name match wins over substring matches. */
#define _GNU_SOURCE
#include "base/user_dirs.h"
#include "io/resolve.h"
#include "base/err.h"
#include "base/file.h"
#include "base/sbuf.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

char *resolve_hf_cache_dir(void) {
    const char *v = user_setting(NULL, "HF_HUB_CACHE");
    if (v) return strdup(v);
    if ((v = user_setting(NULL, "HF_HOME"))) return path_join(v, "hub");
    char *p = user_path("HUGGINGFACE_HUB_CACHE", USER_HOME, ".cache/huggingface/hub");
    return p ? p : strdup(".cache/huggingface/hub");
}

char *resolve_hearth_cache_dir(void) {
    char *p = user_path("HEARTH_CACHE", USER_HOME, ".cache/hearth");
    return p ? p : strdup(".cache/hearth");
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcasecmp(s + a - b, suf);
}

static void list_add(model_list *l, const char *name, const char *path, model_format fmt, const char *source) {
    for (size_t i = 0; i < l->count; i++)
        if (!strcmp(l->items[i].path, path)) return; /* the same model reached twice */
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        model_entry *p = realloc(l->items, cap * sizeof *p);
        if (!p) return;
        l->items = p;
        l->cap = cap;
    }
    model_entry *e = &l->items[l->count++];
    e->name = strdup(name);
    e->path = strdup(path);
    e->format = fmt;
    e->source = source;
}

/* A folder is a model if it has config.json; a folder holding one .gguf and no config
 * is that .gguf. Returns the format or -1. */
static int classify_path(const char *path, char **model_path) {
    *model_path = NULL;
    if (!file_is_dir(path)) {
        if (has_suffix(path, ".gguf") && file_exists(path)) { *model_path = strdup(path); return MODEL_FORMAT_GGUF; }
        return -1;
    }
    char *cfg = path_join(path, "config.json");
    int is_model = cfg && file_exists(cfg);
    free(cfg);
    if (is_model) { *model_path = strdup(path); return MODEL_FORMAT_DIR; }
    DIR *d = opendir(path);
    if (!d) return -1;
    char *found = NULL;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".gguf")) continue;
        n++;
        free(found);
        found = path_join(path, de->d_name);
    }
    closedir(d);
    if (n == 1) { *model_path = found; return MODEL_FORMAT_GGUF; }
    free(found);
    return -1;
}

/* models--org--name/snapshots/<rev>: refs/<ref> names the revision; else the newest. */
static char *hf_snapshot(const char *repo_dir, const char *ref) {
    char rel[512];
    snprintf(rel, sizeof rel, "refs/%s", ref ? ref : "main");
    char *refpath = path_join(repo_dir, rel), *rev = NULL;
    size_t len = 0;
    if (refpath && file_read_all(refpath, &rev, &len, NULL) == HEARTH_OK) {
        while (len && (rev[len - 1] == '\n' || rev[len - 1] == ' ')) rev[--len] = 0;
    }
    free(refpath);
    char *snaps = path_join(repo_dir, "snapshots");
    char *result = NULL;
    if (rev && *rev && !strchr(rev, '/')) {
        result = path_join(snaps, rev);
        if (!file_is_dir(result)) { free(result); result = NULL; }
    } else if (ref) { /* ref may itself be a revision hash */
        result = path_join(snaps, ref);
        if (!file_is_dir(result)) { free(result); result = NULL; }
    }
    free(rev);
    if (!result && !ref) {
        DIR *d = opendir(snaps);
        time_t best = 0;
        for (struct dirent *de; d && (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            char *p = path_join(snaps, de->d_name);
            struct stat st;
            if (p && stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (!result || st.st_mtime > best)) {
                free(result);
                result = p;
                best = st.st_mtime;
                p = NULL;
            }
            free(p);
        }
        if (d) closedir(d);
    }
    free(snaps);
    return result;
}

static void scan_hf_cache(model_list *l) {
    char *hub = resolve_hf_cache_dir();
    DIR *d = hub ? opendir(hub) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (strncmp(de->d_name, "models--", 8)) continue;
        char name[512];
        snprintf(name, sizeof name, "%s", de->d_name + 8);
        char *sep = strstr(name, "--");
        if (!sep) continue;
        *sep = '/';
        memmove(sep + 1, sep + 2, strlen(sep + 2) + 1);
        char *repo = path_join(hub, de->d_name), *snap = repo ? hf_snapshot(repo, NULL) : NULL, *mp = NULL;
        int fmt = snap ? classify_path(snap, &mp) : -1;
        if (fmt >= 0) list_add(l, name, mp, (model_format)fmt, "hf-cache");
        free(mp);
        free(snap);
        free(repo);
    }
    if (d) closedir(d);
    free(hub);
}

/* A folder of models (or itself a model): each child folder with config.json and each
 * .gguf file is one model. */
static void scan_folder(model_list *l, const char *dir, const char *source) {
    char *mp = NULL;
    int fmt = classify_path(dir, &mp);
    if (fmt == MODEL_FORMAT_DIR) {
        const char *base = strrchr(dir, '/');
        list_add(l, base && base[1] ? base + 1 : dir, mp, MODEL_FORMAT_DIR, source);
        free(mp);
        return;
    }
    free(mp);
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char *p = path_join(dir, de->d_name);
        int f = -1;
        if (p && (file_is_dir(p) || has_suffix(de->d_name, ".gguf"))) f = classify_path(p, &mp);
        if (f >= 0) {
            char name[512];
            snprintf(name, sizeof name, "%s", de->d_name);
            if (f == MODEL_FORMAT_GGUF && has_suffix(name, ".gguf") && !file_is_dir(p)) name[strlen(name) - 5] = 0;
            list_add(l, name, mp, (model_format)f, source);
        }
        free(mp);
        mp = NULL;
        free(p);
    }
    if (d) closedir(d);
}

static int entry_cmp(const void *a, const void *b) {
    return strcasecmp(((const model_entry *)a)->name, ((const model_entry *)b)->name);
}

void resolve_list_models(model_list *out) {
    memset(out, 0, sizeof *out);
    scan_hf_cache(out);
    const char *extra = user_setting(NULL, "HEARTH_MODELS");
    if (extra && *extra) {
        char *copy = strdup(extra), *save = NULL;
        for (char *tok = copy ? strtok_r(copy, ":", &save) : NULL; tok; tok = strtok_r(NULL, ":", &save))
            scan_folder(out, tok, "HEARTH_MODELS");
        free(copy);
    }
    char *cache = resolve_hearth_cache_dir(), *models = cache ? path_join(cache, "models") : NULL;
    if (models) scan_folder(out, models, "hearth-cache");
    free(models);
    free(cache);
    if (out->count > 1) qsort(out->items, out->count, sizeof *out->items, entry_cmp);
}

void resolve_entry_free(model_entry *e) {
    free(e->name);
    free(e->path);
    e->name = e->path = NULL;
}

void resolve_list_free(model_list *l) {
    for (size_t i = 0; i < l->count; i++) resolve_entry_free(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static void fill(model_entry *out, const char *name, const char *path, model_format fmt, const char *source) {
    out->name = strdup(name);
    out->path = strdup(path);
    out->format = fmt;
    out->source = source;
}

/* org/name[@revision] looked up directly in the HF cache. */
static int resolve_hf_repo(const char *arg, model_entry *out) {
    const char *slash = strchr(arg, '/');
    if (!slash || slash == arg || strchr(slash + 1, '/')) return 0;
    char repo[512], *at;
    snprintf(repo, sizeof repo, "%s", arg);
    const char *rev = NULL;
    if ((at = strchr(repo, '@'))) { *at = 0; rev = at + 1; }
    sbuf dir;
    sbuf_init(&dir);
    sbuf_puts(&dir, "models--");
    for (const char *p = repo; *p; p++) {
        if (*p == '/') sbuf_puts(&dir, "--");
        else sbuf_putc(&dir, *p);
    }
    char *hub = resolve_hf_cache_dir(), *repo_dir = hub && dir.data ? path_join(hub, dir.data) : NULL;
    char *snap = repo_dir ? hf_snapshot(repo_dir, rev) : NULL, *mp = NULL;
    int fmt = snap ? classify_path(snap, &mp) : -1;
    if (fmt >= 0) fill(out, repo, mp, (model_format)fmt, "hf-cache");
    free(mp);
    free(snap);
    free(repo_dir);
    free(hub);
    sbuf_free(&dir);
    return fmt >= 0;
}

/* An argument written as a path (a model file's extension, or starting with / . ~) is a
 * file the user expected to exist: the error says so first, in the CLI's
 * "<file>: <problem>" form. */
static int names_a_file(const char *arg) {
    return arg[0] == '/' || arg[0] == '.' || arg[0] == '~' || has_suffix(arg, ".gguf") ||
           has_suffix(arg, ".safetensors") || has_suffix(arg, ".json");
}

hearth_status resolve_model(const char *arg, model_entry *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    if (!arg || !*arg) return err_set(err, HEARTH_ERR_INVALID, "no model given");
    char *mp = NULL;
    if (file_exists(arg)) {
        int fmt = classify_path(arg, &mp);
        if (fmt < 0)
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: not a model (expected a folder with config.json, or a .gguf file)", arg);
        fill(out, arg, mp, (model_format)fmt, "path");
        free(mp);
        return HEARTH_OK;
    }
    if (resolve_hf_repo(arg, out)) return HEARTH_OK;

    model_list all;
    resolve_list_models(&all);
    size_t n_match = 0, exact = (size_t)-1, last = 0;
    for (size_t i = 0; i < all.count; i++) {
        if (!strcasecmp(all.items[i].name, arg)) exact = i;
        if (strcasestr(all.items[i].name, arg)) { n_match++; last = i; }
    }
    hearth_status st = HEARTH_OK;
    if (exact != (size_t)-1 || n_match == 1) {
        model_entry *e = &all.items[exact != (size_t)-1 ? exact : last];
        fill(out, e->name, e->path, e->format, e->source);
    } else {
        sbuf msg;
        sbuf_init(&msg);
        int ambiguous = n_match > 1;
        if (ambiguous) sbuf_printf(&msg, "model name '%s' is ambiguous; it matches:", arg);
        else if (names_a_file(arg)) sbuf_printf(&msg, "%s: no such file or directory, and no model's name matches it", arg);
        else sbuf_printf(&msg, "no model matches '%s'", arg);
        if (!ambiguous)
            sbuf_puts(&msg, all.count ? "; known models:" : " and no models were found (searched the HF cache, "
                                                            "$HEARTH_MODELS and $HEARTH_CACHE/models)");
        size_t shown = 0;
        for (size_t i = 0; i < all.count && shown < 20; i++) {
            if (ambiguous && !strcasestr(all.items[i].name, arg)) continue;
            sbuf_printf(&msg, "%s %s", shown ? "," : "", all.items[i].name);
            shown++;
        }
        st = err_set(err, ambiguous ? HEARTH_ERR_AMBIGUOUS : HEARTH_ERR_NOT_FOUND, "%s",
                     msg.data ? msg.data : "model not found");
        sbuf_free(&msg);
    }
    resolve_list_free(&all);
    return st;
}
