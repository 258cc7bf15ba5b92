/* hub_pull.c: hearth_pull: downloads a Hugging Face repo snapshot with libcurl into the
 * HF cache layout that huggingface_hub itself writes (blobs/, snapshots/, refs/), so
 * both tools share one cache. Resumes partial blobs with Range, verifies each blob
 * against its ETag (sha256 for LFS files, git blob sha1 otherwise) before linking it.
 * Never leaves an unverified file in snapshots/. */
#define _GNU_SOURCE
#include "base/err.h"
#include "base/file.h"
#include "base/sbuf.h"
#include "hub/hub.h"
#include "base/user_dirs.h"
#include "io/resolve.h"
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* The hub's file list is a few KB even for repos with hundreds of files; anything past
 * 16 MiB is not a model listing. */
#define PULL_MAX_JSON (16u << 20)
/* Dropped connections are retried (resuming) this many times per file. */
#define PULL_ATTEMPTS 4

typedef struct pull_ctx {
    const hearth_pull_options *o;
    char endpoint[1024], repo[HUB_NAME_MAX], rev[HUB_NAME_MAX];
    struct curl_slist *headers;
    int has_token, dl_id;
    char *repo_dir;
    char *locks_dir; /* <hub>/.locks/models--org--name, huggingface_hub's lock folder */
} pull_ctx;

/* What one response told us. Header values come from the last response of a redirect
 * chain for the fields curl follows, so HEAD is made without following. */
typedef struct http_meta {
    long status;
    char commit[64], etag[160], linked_etag[160], error_code[64];
    char redirect[2048]; /* an unfollowed redirect's Location, made absolute by curl */
    long long linked_size, content_length;
} http_meta;

typedef struct sink {
    sbuf *body;      /* JSON answers */
    FILE *file;      /* blob downloads */
    long long have;  /* bytes already in the file when the request started */
    int write_errno; /* set when fwrite failed (ENOSPC: disk full) */
    int restarted;   /* server ignored Range: the file was truncated */
    CURL *curl;
    pull_ctx *ctx;
    const char *file_name;
    long long total;
    double last_report;
} sink;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }
void hub_curl_init(void) { pthread_once(&curl_once, curl_init_once); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void copy_header_value(char *dst, size_t cap, const char *v, size_t n) {
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    while (n && *v == ' ') v++, n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *user) {
    http_meta *m = user;
    size_t n = size * nitems;
    const char *colon = memchr(buf, ':', n);
    if (!strncasecmp(buf, "HTTP/", 5)) { /* a new response of a chain starts */
        memset(m, 0, sizeof *m);
        m->linked_size = m->content_length = -1;
        return n;
    }
    if (!colon) return n;
    size_t kn = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vn = n - kn - 1;
    char num[32];
#define IS(name) (kn == strlen(name) && !strncasecmp(buf, name, kn))
    if (IS("X-Repo-Commit"))
        copy_header_value(m->commit, sizeof m->commit, v, vn);
    else if (IS("ETag"))
        copy_header_value(m->etag, sizeof m->etag, v, vn);
    else if (IS("X-Linked-Etag"))
        copy_header_value(m->linked_etag, sizeof m->linked_etag, v, vn);
    else if (IS("X-Error-Code"))
        copy_header_value(m->error_code, sizeof m->error_code, v, vn);
    else if (IS("X-Linked-Size") || IS("Content-Length")) {
        copy_header_value(num, sizeof num, v, vn);
        char *end;
        long long x = strtoll(num, &end, 10);
        if (end != num && *end == 0 && x >= 0) *(IS("X-Linked-Size") ? &m->linked_size : &m->content_length) = x;
    }
#undef IS
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    sink *s = user;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 300) return n; /* an error page or a redirect's body: not content */
    if (s->body) {
        if (s->body->len + n > PULL_MAX_JSON) return 0;
        sbuf_append(s->body, data, n);
        return s->body->oom ? 0 : n;
    }
    if (status == 200 && s->have > 0 && !s->restarted) { /* Range ignored: start over */
        s->restarted = 1;
        s->have = 0;
        if (ftruncate(fileno(s->file), 0) || fseek(s->file, 0, SEEK_SET)) {
            s->write_errno = errno;
            return 0;
        }
    }
    if (fwrite(data, 1, n, s->file) != n) {
        s->write_errno = errno ? errno : EIO;
        return 0;
    }
    return n;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    sink *s = user;
    double t = now_s();
    if (!s->file || t - s->last_report < 0.1) return 0;
    s->last_report = t;
    long long done = s->have + (long long)dlnow;
    if (s->ctx->o && s->ctx->o->on_progress) s->ctx->o->on_progress(s->ctx->o->user, s->file_name, done, s->total);
    hub_downloads_file(s->ctx->dl_id, s->file_name, done, s->total);
    return 0;
}

/* One request. range_from > 0 asks for the rest of a file. Returns the curl code;
 * m->status holds the HTTP status. */
static CURLcode http_do(pull_ctx *c, const char *url, int head, int follow, sink *s, long long range_from,
                        http_meta *m) {
    CURL *h = curl_easy_init();
    if (!h) return CURLE_OUT_OF_MEMORY;
    memset(m, 0, sizeof *m);
    m->linked_size = m->content_length = -1;
    char range[64];
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "hearth/" HEARTH_VERSION);
    curl_easy_setopt(h, CURLOPT_NOBODY, head ? 1L : 0L);
    /* curl sends a CURLOPT_HTTPHEADER Authorization only to the first host, so the
     * token never reaches a CDN the hub redirects to */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    /* a stalled transfer (under 1 byte/s for 30 s) fails and is resumed */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, m);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (s) {
        s->curl = h;
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    if (range_from > 0) {
        snprintf(range, sizeof range, "%lld-", range_from);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &m->status);
    char *loc = NULL;
    if (curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK && loc)
        snprintf(m->redirect, sizeof m->redirect, "%s", loc);
    curl_easy_cleanup(h);
    return rc;
}

static hearth_status transport_error(pull_ctx *c, CURLcode rc, const char *url, hearth_error *err) {
    if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
        rc == CURLE_COULDNT_RESOLVE_PROXY)
        return err_set(err, HEARTH_ERR_IO,
                       "pull: cannot reach the hub at %s (%s): are you offline? (set HF_ENDPOINT for a mirror)",
                       c->endpoint, curl_easy_strerror(rc));
    return err_set(err, HEARTH_ERR_IO, "pull: %s: %s", url, curl_easy_strerror(rc));
}

static hearth_status status_error(pull_ctx *c, const http_meta *m, const char *what, hearth_error *err) {
    if (m->status == 401 || m->status == 403) {
        if (c->has_token)
            return err_set(err, HEARTH_ERR_IO,
                           "pull: %s: access denied (HTTP %ld): the HF_TOKEN sent has no access to %s; for a gated "
                           "model accept its terms on the model page first",
                           what, m->status, c->repo);
        return err_set(err, HEARTH_ERR_IO,
                       "pull: %s: access denied (HTTP %ld): %s is gated or private; set HF_TOKEN to a token that "
                       "has access (https://huggingface.co/settings/tokens)",
                       what, m->status, c->repo);
    }
    if (m->status == 404) {
        if (!strcmp(m->error_code, "RevisionNotFound"))
            return err_set(err, HEARTH_ERR_NOT_FOUND, "pull: %s has no revision '%s' on %s", c->repo, c->rev,
                           c->endpoint);
        if (!strcmp(m->error_code, "EntryNotFound"))
            return err_set(err, HEARTH_ERR_NOT_FOUND, "pull: %s: no such file in %s@%s", what, c->repo, c->rev);
        return err_set(err, HEARTH_ERR_NOT_FOUND,
                       "pull: %s: not found (HTTP 404): no repo '%s' or no revision '%s' on %s (or it is private: "
                       "set HF_TOKEN)",
                       what, c->repo, c->rev, c->endpoint);
    }
    return err_set(err, HEARTH_ERR_IO, "pull: %s: the hub answered HTTP %ld", what, m->status);
}

int hub_file_digest(const char *path, int git_sha1, char *hex, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = md && EVP_DigestInit_ex(md, git_sha1 ? EVP_sha1() : EVP_sha256(), NULL);
    if (ok && git_sha1) {
        struct stat st;
        char hdr[64];
        ok = fstat(fileno(f), &st) == 0;
        int n = snprintf(hdr, sizeof hdr, "blob %lld", (long long)st.st_size);
        ok = ok && EVP_DigestUpdate(md, hdr, (size_t)n + 1); /* with the NUL */
    }
    static unsigned char buf[1 << 16];
    static pthread_mutex_t buf_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&buf_lock);
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, f)) > 0;) ok = EVP_DigestUpdate(md, buf, n);
    pthread_mutex_unlock(&buf_lock);
    ok = ok && !ferror(f);
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    ok = ok && EVP_DigestFinal_ex(md, out, &len) && cap > 2 * len;
    for (unsigned i = 0; ok && i < len; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
    EVP_MD_CTX_free(md);
    fclose(f);
    return ok ? 0 : -1;
}

static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static hearth_status check_space(const char *dir, const char *file, long long need, hearth_error *err) {
    struct statvfs v;
    if (need <= 0 || statvfs(dir, &v)) return HEARTH_OK;
    long long free_bytes = (long long)v.f_bavail * (long long)v.f_frsize;
    if (free_bytes >= need) return HEARTH_OK;
    char a[32], b[32];
    hub_format_bytes(need, a, sizeof a);
    hub_format_bytes(free_bytes, b, sizeof b);
    return err_set(err, HEARTH_ERR_IO,
                   "pull: %s: disk full: it needs %s more in %s but only %s is free (free some space and run pull "
                   "again; it resumes)",
                   file, a, dir, b);
}

/* Downloads url into blob (via blob.incomplete), resuming and retrying. */
static hearth_status fetch_blob(pull_ctx *c, const char *url, const char *file, const char *blob, long long size,
                                hearth_error *err) {
    char *inc = malloc(strlen(blob) + 16);
    if (!inc) return err_set(err, HEARTH_ERR_NOMEM, "pull: out of memory");
    sprintf(inc, "%s.incomplete", blob);
    hearth_status st = HEARTH_OK;
    for (int attempt = 0;; attempt++) {
        long long have = file_size(inc);
        if (have < 0) have = 0;
        if (size >= 0 && have > size) { /* not this blob's prefix: start over */
            unlink(inc);
            have = 0;
        }
        if (size >= 0 && have == size) break;
        if ((st = check_space(c->repo_dir, file, size >= 0 ? size - have : 0, err))) break;
        FILE *f = fopen(inc, "ab");
        if (!f) {
            st = err_set(err, HEARTH_ERR_IO, "pull: %s: %s", inc, strerror(errno));
            break;
        }
        sink s = {.file = f, .have = have, .ctx = c, .file_name = file, .total = size};
        http_meta m;
        CURLcode rc = http_do(c, url, 0, 1, &s, have, &m);
        if (fclose(f) && !s.write_errno) s.write_errno = errno;
        if (s.write_errno) {
            /* EFBIG: a file size limit (ulimit -f, a quota) stops the write as a full disk does; what
             * was written stays as the .incomplete prefix that the next pull resumes from */
            int full = s.write_errno == ENOSPC || s.write_errno == EDQUOT || s.write_errno == EFBIG;
            st = err_set(err, HEARTH_ERR_IO, "pull: %s: writing %s: %s%s", file, inc, strerror(s.write_errno),
                         full ? " (disk full or over a size limit: free some space and run pull again; it resumes)"
                              : "");
            break;
        }
        if (rc == CURLE_OK && m.status == 416) break; /* nothing left to send: check below */
        if (rc == CURLE_OK && m.status >= 400) {
            st = status_error(c, &m, file, err);
            break;
        }
        if (rc == CURLE_OK) break;
        int transient = rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_OPERATION_TIMEDOUT ||
                        rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR;
        if (!transient || attempt + 1 >= PULL_ATTEMPTS) {
            st = transport_error(c, rc, url, err);
            break;
        }
        if (c->o && c->o->on_progress) /* a line the progress printer shows as it is */
            c->o->on_progress(c->o->user, "(connection dropped; resuming)", file_size(inc), size);
    }
    if (!st) {
        long long got = file_size(inc);
        if (size >= 0 && got != size)
            st = err_set(err, HEARTH_ERR_IO, "pull: %s: got %lld bytes, the hub said %lld; run pull again to resume",
                         file, got, size);
        else if (rename(inc, blob))
            st = err_set(err, HEARTH_ERR_IO, "pull: %s: %s", blob, strerror(errno));
    }
    free(inc);
    return st;
}

/* Checks blob against its etag (and the listing's LFS sha256); removes it when wrong. */
static hearth_status verify_blob(const char *blob, const char *file, const char *etag, const char *lfs_sha256,
                                 hearth_error *err) {
    const char *want = lfs_sha256 ? lfs_sha256 : hub_is_hex(etag, 64) ? etag : hub_is_hex(etag, 40) ? etag : NULL;
    if (!want) return HEARTH_OK; /* an opaque ETag (a mirror's): size was checked */
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    int sha1 = strlen(want) == 40;
    if (hub_file_digest(blob, sha1, hex, sizeof hex))
        return err_set(err, HEARTH_ERR_IO, "pull: %s: cannot read back to verify", blob);
    if (!strcasecmp(hex, want)) return HEARTH_OK;
    unlink(blob);
    return err_set(err, HEARTH_ERR_FORMAT,
                   "pull: %s: %s mismatch (expected %s, got %s): the download is corrupt and was deleted; run pull "
                   "again",
                   file, sha1 ? "git sha1" : "sha256", want, hex);
}

static hearth_status link_snapshot(pull_ctx *c, const char *commit, const char *file, const char *etag,
                                   hearth_error *err) {
    sbuf p, tmp;
    sbuf_init(&p);
    sbuf_init(&tmp);
    sbuf_printf(&p, "%s/snapshots/%s/%s", c->repo_dir, commit, file);
    sbuf_printf(&tmp, "%s.tmp%d", p.data ? p.data : "", (int)getpid());
    char *target = hub_symlink_target(file, etag);
    hearth_status st = HEARTH_OK;
    /* made under a private name and renamed over the final one: two pulls of the same repo
     * at once both succeed (unlink-then-symlink raced: the second symlink found EEXIST) */
    if (!p.data || !tmp.data || !target || file_mkdirs_parent(p.data) || (unlink(tmp.data) && errno != ENOENT) ||
        symlink(target, tmp.data) || rename(tmp.data, p.data)) {
        st = err_set(err, HEARTH_ERR_IO, "pull: linking %s: %s", p.data ? p.data : file, strerror(errno));
        if (tmp.data) unlink(tmp.data);
    }
    free(target);
    sbuf_free(&p);
    sbuf_free(&tmp);
    return st;
}

static hearth_status write_ref(pull_ctx *c, const char *commit, hearth_error *err) {
    if (!strcmp(c->rev, commit)) return HEARTH_OK; /* a commit needs no ref */
    sbuf p, tmp;
    sbuf_init(&p);
    sbuf_init(&tmp);
    sbuf_printf(&p, "%s/refs/%s", c->repo_dir, c->rev);
    sbuf_printf(&tmp, "%s.tmp%d", p.data ? p.data : "", (int)getpid());
    hearth_status st = HEARTH_OK;
    FILE *f = p.data && tmp.data && !file_mkdirs_parent(p.data) ? fopen(tmp.data, "w") : NULL;
    if (!f || fputs(commit, f) < 0 || fclose(f) || rename(tmp.data, p.data))
        st = err_set(err, HEARTH_ERR_IO, "pull: writing %s: %s", p.data ? p.data : "refs", strerror(errno));
    sbuf_free(&p);
    sbuf_free(&tmp);
    return st;
}

/* HEAD resolve/{commit}/{file}: the blob's etag and size, without following the
 * redirect to a CDN (its headers would replace the hub's); a relative redirect (a
 * renamed repo) is followed by hand. */
static hearth_status file_meta(pull_ctx *c, const char *url, const char *file, http_meta *m, hearth_error *err) {
    char *u = strdup(url);
    hearth_status st = HEARTH_OK;
    for (int hop = 0; u; hop++) {
        CURLcode rc = http_do(c, u, 1, 0, NULL, 0, m);
        if (rc != CURLE_OK) {
            st = transport_error(c, rc, u, err);
            break;
        }
        if (m->status >= 300 && m->status < 400 && !m->etag[0] && !m->linked_etag[0] && hop < 5) {
            free(u);
            u = m->redirect[0] ? strdup(m->redirect) : NULL;
            continue;
        }
        if (m->status >= 400)
            st = status_error(c, m, file, err);
        else if (m->status >= 300 && !m->linked_etag[0] && !m->etag[0])
            st = err_set(err, HEARTH_ERR_IO, "pull: %s: too many redirects", file);
        break;
    }
    if (!u && !st) st = err_set(err, HEARTH_ERR_IO, "pull: %s: a redirect without a usable Location", file);
    free(u);
    return st;
}

static hearth_status pull_file(pull_ctx *c, const hub_file_list *l, const hub_file *f, hearth_error *err) {
    char *url = hub_resolve_url(c->endpoint, c->repo, l->commit, f->name);
    http_meta m;
    hearth_status st = url ? file_meta(c, url, f->name, &m, err) : err_set(err, HEARTH_ERR_NOMEM, "pull: oom");
    char etag[160];
    hub_normalize_etag(m.linked_etag[0] ? m.linked_etag : m.etag, etag, sizeof etag);
    if (!st && !etag[0])
        st = err_set(err, HEARTH_ERR_FORMAT, "pull: %s: the hub sent no usable ETag for this file", f->name);
    if (!st && m.commit[0] && strcmp(m.commit, l->commit))
        st = err_set(err, HEARTH_ERR_IO, "pull: %s: the hub served commit %s, expected %s", f->name, m.commit,
                     l->commit);
    long long size = m.linked_size >= 0 ? m.linked_size : m.content_length >= 0 ? m.content_length : f->size;
    if (!st && f->size >= 0 && size != f->size)
        st = err_set(err, HEARTH_ERR_FORMAT, "pull: %s: the hub lists %lld bytes but serves %lld", f->name, f->size,
                     size);
    sbuf blob;
    sbuf_init(&blob);
    sbuf_printf(&blob, "%s/blobs/%s", c->repo_dir, etag);
    if (!st && file_mkdirs_parent(blob.data)) st = err_set(err, HEARTH_ERR_IO, "pull: %s: %s", c->repo_dir, strerror(errno));
    /* One writer per blob: huggingface_hub's filelock takes flock on the same
     * .locks/<repo>/<etag>.lock, so a hearth pull, a background pull and a Python
     * download of the same file wait for each other instead of interleaving bytes. */
    int lock = -1;
    if (!st) {
        sbuf lp;
        sbuf_init(&lp);
        sbuf_printf(&lp, "%s/%s.lock", c->locks_dir, etag);
        if (lp.data && !file_mkdirs_parent(lp.data)) lock = open(lp.data, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock >= 0) flock(lock, LOCK_EX);
        sbuf_free(&lp);
    }
    if (!st && (file_size(blob.data) < 0 || (size >= 0 && file_size(blob.data) != size))) {
        st = fetch_blob(c, url, f->name, blob.data, size, err);
        if (!st) st = verify_blob(blob.data, f->name, etag, f->lfs_sha256, err);
    }
    if (lock >= 0) close(lock); /* releases the flock */
    if (!st) {
        if (c->o && c->o->on_progress) c->o->on_progress(c->o->user, f->name, size, size);
        st = link_snapshot(c, l->commit, f->name, etag, err);
    }
    sbuf_free(&blob);
    free(url);
    return st;
}

static hearth_status list_files(pull_ctx *c, hub_file_list *l, hearth_error *err) {
    char *url = hub_api_url(c->endpoint, c->repo, "revision", c->rev);
    sbuf body;
    sbuf_init(&body);
    sink s = {.body = &body, .ctx = c};
    http_meta m;
    CURLcode rc = url ? http_do(c, url, 0, 1, &s, 0, &m) : CURLE_OUT_OF_MEMORY;
    hearth_status st;
    if (rc != CURLE_OK)
        st = transport_error(c, rc, url ? url : c->endpoint, err);
    else if (m.status != 200)
        st = status_error(c, &m, c->repo, err);
    else
        st = hub_parse_file_list(body.data ? body.data : "", body.len, l, err);
    sbuf_free(&body);
    free(url);
    return st;
}

hearth_status hearth_pull(const char *repo_arg, const hearth_pull_options *o, char **snapshot_dir, hearth_error *err) {
    return hub_pull(repo_arg, o, -2, snapshot_dir, err);
}

hearth_status hub_pull(const char *repo_arg, const hearth_pull_options *o, int dl_id, char **snapshot_dir,
                       hearth_error *err) {
    if (snapshot_dir) *snapshot_dir = NULL;
    hearth_error local = {0};
    if (!err) err = &local;
    hub_curl_init();
    pull_ctx c = {.o = o, .dl_id = dl_id};
    hearth_status st = hub_parse_repo_arg(repo_arg, c.repo, c.rev, err);
    if (st) return st;
    const char *ep = user_setting(o ? o->endpoint : NULL, "HF_ENDPOINT");
    snprintf(c.endpoint, sizeof c.endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    const char *token = user_setting(o ? o->token : NULL, "HF_TOKEN");
    if (token && *token) {
        sbuf auth;
        sbuf_init(&auth);
        sbuf_printf(&auth, "Authorization: Bearer %s", token);
        c.headers = auth.data ? curl_slist_append(NULL, auth.data) : NULL;
        c.has_token = 1;
        sbuf_free(&auth);
    }
    char *hub = resolve_hf_cache_dir(), *folder = hub_repo_folder(c.repo);
    c.repo_dir = hub && folder ? path_join(hub, folder) : NULL;
    char *locks = hub ? path_join(hub, ".locks") : NULL;
    c.locks_dir = locks && folder ? path_join(locks, folder) : NULL;
    free(locks);
    if (c.dl_id == -2) c.dl_id = hub_downloads_begin(c.repo);
    hub_file_list l = {0};
    if (!c.repo_dir || !c.locks_dir) st = err_set(err, HEARTH_ERR_NOMEM, "pull: out of memory");
    if (!st) st = list_files(&c, &l, err);
    if (!st && file_mkdirs(c.repo_dir)) st = err_set(err, HEARTH_ERR_IO, "pull: %s: %s", c.repo_dir, strerror(errno));
    size_t wanted = 0;
    for (size_t i = 0; !st && i < l.count; i++) {
        const hub_file *f = &l.files[i];
        if (!hub_wanted(f->name, o ? o->include : NULL, o ? o->n_include : 0, o ? o->exclude : NULL,
                        o ? o->n_exclude : 0))
            continue;
        wanted++;
        st = pull_file(&c, &l, f, err);
    }
    if (!st && !wanted)
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "pull: %s@%s: no file matches the --include/--exclude patterns", c.repo,
                     c.rev);
    if (!st) st = write_ref(&c, l.commit, err);
    if (!st && snapshot_dir) {
        sbuf p;
        sbuf_init(&p);
        sbuf_printf(&p, "%s/snapshots/%s", c.repo_dir, l.commit);
        *snapshot_dir = sbuf_steal(&p);
    }
    hub_downloads_end(c.dl_id, st, st ? err->message : NULL);
    hub_file_list_free(&l);
    curl_slist_free_all(c.headers);
    free(c.repo_dir);
    free(c.locks_dir);
    free(folder);
    free(hub);
    return st;
}
