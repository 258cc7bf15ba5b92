/* hub.h: the model library's internals: hub names, URLs and cache paths (hub_path.c),
 * the hub's file-list JSON (hub_api.c), downloads (hub_pull.c) and their registry
 * (hub_downloads.c), removal (hub_rm.c); hub_library.c, hub_evals.c, hub_skus.c,
 * hub_catalogue.c implements the rest of hearth.h's library section.
 * Nothing in this folder serves HTTP; the pure helpers here are unit-tested. */
#ifndef HEARTH_HUB_HUB_H
#define HEARTH_HUB_HUB_H
#include "hearth.h"
#include "io/data_files.h"
#include <stddef.h>

/* Hub repo ids are at most 96 characters per part (the hub's own limit); revisions
 * (branch, tag, "refs/pr/N" or a 40-hex commit) are kept under 256. */
#define HUB_NAME_MAX 256

/* "org/name[@revision]" -> repo "org/name" and revision ("main" when absent). Rejects
 * ids the hub would reject (characters outside [A-Za-z0-9._-], "--" or "..", empty
 * parts) and revisions that could escape refs/ (".." parts, a leading '/'). */
hearth_status hub_parse_repo_arg(const char *arg, char repo[HUB_NAME_MAX], char rev[HUB_NAME_MAX], hearth_error *err);
/* "org/name" -> "models--org--name" (malloc'd). */
char *hub_repo_folder(const char *repo);
/* An ETag header value without W/ and quotes ("\"abc\"" -> "abc"); out is empty when
 * the result is not a safe file name. */
void hub_normalize_etag(const char *header_value, char *out, size_t cap);
/* 1 when s is exactly n lowercase-or-uppercase hex digits. */
int hub_is_hex(const char *s, size_t n);
/* 1 when a repo file name is safe to create under snapshots/<commit>/: relative, no
 * empty, "." or ".." parts, no backslashes or control characters. */
int hub_safe_relpath(const char *name);
/* The relative target of snapshots/<commit>/<filename> -> blobs/<etag>, one "../" per
 * directory level (malloc'd): "a/b.bin" -> "../../../blobs/<etag>". */
char *hub_symlink_target(const char *filename, const char *etag);
/* Percent-encodes everything but RFC 3986 unreserved characters (and '/' when
 * keep_slash). malloc'd. */
char *hub_url_escape(const char *s, int keep_slash);
/* {endpoint}/api/models/{repo}/{what}/{rev} (what: "revision", "preupload", "commit") and
 * {endpoint}/{repo}/resolve/{rev}/{file}. */
char *hub_api_url(const char *endpoint, const char *repo, const char *what, const char *rev);
char *hub_resolve_url(const char *endpoint, const char *repo, const char *rev, const char *file);
/* Whether a repo file is wanted: matches one include pattern (all when none) and no
 * exclude pattern; shell globs where '*' also crosses '/', and "dir/" means "dir/ *". */
int hub_wanted(const char *name, const char *const *include, size_t n_include, const char *const *exclude,
               size_t n_exclude);
/* "1.2 GB"-style text for byte counts (decimal units, like the hub's web pages). */
void hub_format_bytes(long long n, char *out, size_t cap);

/* One file of a repo, from the hub's api/models answer. */
typedef struct hub_file {
    char *name;       /* rfilename */
    long long size;   /* -1 when the listing had none */
    char *lfs_sha256; /* 64 hex for LFS files, else NULL */
} hub_file;

typedef struct hub_file_list {
    char *commit; /* the "sha" the revision points to */
    hub_file *files;
    size_t count;
} hub_file_list;

/* Parses GET api/models/{repo}/revision/{rev}: {"sha": "...", "siblings": [{"rfilename":
 * ..., "size"?: n, "lfs"?: {"sha256": ..., "size": n}}]}. Files with unsafe names are an
 * error (a hostile endpoint must not write outside the snapshot). */
hearth_status hub_parse_file_list(const char *json, size_t len, hub_file_list *out, hearth_error *err);
void hub_file_list_free(hub_file_list *l);

/* hearth_pull reporting into registry slot dl_id (from hub_downloads_begin; -2: take
 * one itself, -1: none). */
hearth_status hub_pull(const char *repo_arg, const hearth_pull_options *o, int dl_id, char **snapshot_dir,
                       hearth_error *err);

/* The registry of downloads in progress in this process (hub_downloads.c), which
 * hub_pull.c reports into and GET /downloads reads. */
int hub_downloads_begin(const char *repo); /* returns a slot id, -1 when full */
void hub_downloads_file(int id, const char *file, long long done, long long total);
void hub_downloads_end(int id, hearth_status st, const char *message);
/* curl_global_init once per process (it is not thread-safe): before any hub transfer. */
void hub_curl_init(void);
/* The file's hash in hex into hex[cap]: sha256 of the content, or git's blob sha1 ("blob
 * <n>\0" + content), which is what the hub's ETag is for files not stored in LFS. 0 or -1. */
int hub_file_digest(const char *path, int git_sha1, char *hex, size_t cap);
#endif
