/* hub_upload.c: hearth_upload, a folder pushed to a Hugging Face hub repo over the hub's
 * HTTP API: create the repo (an existing one is fine), ask the preupload endpoint which
 * files go through LFS, hand the LFS objects to the LFS batch endpoint (sha256 oids; basic
 * PUT or multipart parts plus a completion call; verify when asked), then one commit
 * (NDJSON: a header, regular files inline in base64, LFS files by oid). Objects the hub
 * already holds come back from the batch call without actions and are not sent again, so
 * re-running an interrupted upload sends only what is missing. */
#include "base/err.h"
#include "base/sbuf.h"
#include "hub/hub.h"
#include "base/user_dirs.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define UP_BATCH 256 /* files per preupload call (the hub's chunk) */

typedef struct up_file {
    char *path; /* relative to the folder, '/'-separated */
    char *full;
    long long size;
    char sha256[65];
    int lfs;
} up_file;

typedef struct up_ctx {
    const hearth_upload_options *o;
    char endpoint[512];
    char repo[HUB_NAME_MAX], rev[HUB_NAME_MAX];
    struct curl_slist *auth; /* Authorization: Bearer */
    up_file *files;
    size_t n, cap;
} up_ctx;

/* ---- the folder ---- */

static hearth_status add_file(up_ctx *c, const char *rel, const char *full, long long size, hearth_error *err) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        up_file *f = realloc(c->files, cap * sizeof *f);
        if (!f) return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
        c->files = f, c->cap = cap;
    }
    up_file *f = &c->files[c->n];
    memset(f, 0, sizeof *f);
    f->path = strdup(rel), f->full = strdup(full), f->size = size;
    if (!f->path || !f->full) {
        free(f->path), free(f->full);
        return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    }
    c->n++;
    return HEARTH_OK;
}

/* What huggingface_hub's upload_folder leaves out by default: git's own folder and its
 * download cache. */
static int skipped_dir(const char *rel) {
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    return !strcmp(base, ".git") || !strcmp(rel, ".cache/huggingface") || strstr(rel, "/.cache/huggingface") != NULL;
}

static hearth_status walk(up_ctx *c, const char *dir, const char *rel, int depth, hearth_error *err) {
    if (depth > 32) return err_set(err, HEARTH_ERR_INVALID, "%s: folders nested too deeply", dir);
    DIR *d = opendir(dir);
    if (!d) return err_set(err, HEARTH_ERR_IO, "%s: %s", dir, strerror(errno));
    hearth_status st = HEARTH_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        sbuf full, r;
        sbuf_init(&full), sbuf_init(&r);
        sbuf_printf(&full, "%s/%s", dir, e->d_name);
        sbuf_printf(&r, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        struct stat sb;
        if (full.oom || r.oom) st = err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
        else if (stat(full.data, &sb)) /* follows links: HF cache snapshots are links to blobs */
            st = err_set(err, HEARTH_ERR_IO, "%s: %s", full.data, strerror(errno));
        else if (S_ISDIR(sb.st_mode)) {
            if (!skipped_dir(r.data)) st = walk(c, full.data, r.data, depth + 1, err);
        } else if (S_ISREG(sb.st_mode)) {
            if (!hub_safe_relpath(r.data))
                st = err_set(err, HEARTH_ERR_INVALID, "%s: a file name the hub cannot hold", full.data);
            else
                st = add_file(c, r.data, full.data, (long long)sb.st_size, err);
        }
        sbuf_free(&full), sbuf_free(&r);
    }
    closedir(d);
    return st;
}

static int cmp_file(const void *a, const void *b) {
    return strcmp(((const up_file *)a)->path, ((const up_file *)b)->path);
}

/* sha256 of the file (hex) and its first 512 bytes (base64). */
static hearth_status digest(up_file *f, char *sample_b64, size_t b64_cap, hearth_error *err) {
    unsigned char sample[512];
    FILE *fp = fopen(f->full, "rb");
    if (!fp) return err_set(err, HEARTH_ERR_IO, "%s: %s", f->full, strerror(errno));
    size_t n_sample = fread(sample, 1, sizeof sample, fp);
    int rerr = ferror(fp);
    fclose(fp);
    if (rerr || hub_file_digest(f->full, 0, f->sha256, sizeof f->sha256))
        return err_set(err, HEARTH_ERR_IO, "%s: read error", f->full);
    if (b64_cap < 4 * ((sizeof sample + 2) / 3) + 1) return err_set(err, HEARTH_ERR_INVALID, "upload: sample buffer");
    EVP_EncodeBlock((unsigned char *)sample_b64, sample, (int)n_sample);
    return HEARTH_OK;
}

/* ---- HTTP ---- */

typedef struct up_resp {
    long status;
    sbuf body;
    char etag[256];
} up_resp;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    sbuf *b = user;
    if (b->len + size * nmemb > ((size_t)64 << 20)) return 0; /* no answer of the hub is this large */
    sbuf_append(b, data, size * nmemb);
    return b->oom ? 0 : size * nmemb;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *user) {
    up_resp *r = user;
    size_t n = size * nitems;
    if (n > 5 && !strncasecmp(buf, "etag:", 5)) {
        size_t i = 5;
        while (i < n && (buf[i] == ' ' || buf[i] == '\t')) i++;
        size_t j = n;
        while (j > i && (buf[j - 1] == '\r' || buf[j - 1] == '\n' || buf[j - 1] == ' ')) j--;
        size_t k = j - i < sizeof r->etag - 1 ? j - i : sizeof r->etag - 1;
        memcpy(r->etag, buf + i, k);
        r->etag[k] = 0;
    }
    return n;
}

typedef struct put_src {
    FILE *fp;
    long long left;
    up_ctx *c;
    const char *name;
    long long done, size; /* the file's bytes sent (earlier parts included) and its size */
} put_src;

static size_t on_read(char *dst, size_t size, size_t nitems, void *user) {
    put_src *s = user;
    size_t want = size * nitems;
    if ((long long)want > s->left) want = (size_t)s->left;
    size_t n = want ? fread(dst, 1, want, s->fp) : 0;
    if (n < want && ferror(s->fp)) return CURL_READFUNC_ABORT;
    s->left -= (long long)n;
    s->done += (long long)n;
    const hearth_upload_options *o = s->c->o;
    if (o && o->on_progress && n) o->on_progress(o->user, s->name, s->done, s->size);
    return n;
}

/* One request. body/len: a request body (POST), or src: a file range (PUT). */
static hearth_status request(up_ctx *c, const char *method, const char *url, const char *content_type,
                             const char *accept, const char *body, size_t len, put_src *src, int with_auth,
                             up_resp *r, hearth_error *err) {
    CURL *h = curl_easy_init();
    if (!h) return err_set(err, HEARTH_ERR_NOMEM, "upload: cannot start an HTTP request");
    struct curl_slist *hd = NULL;
    if (with_auth)
        for (struct curl_slist *a = c->auth; a; a = a->next) hd = curl_slist_append(hd, a->data);
    char line[256];
    if (content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", content_type);
        hd = curl_slist_append(hd, line);
    }
    if (accept) {
        snprintf(line, sizeof line, "Accept: %s", accept);
        hd = curl_slist_append(hd, line);
    }
    hd = curl_slist_append(hd, "Expect:"); /* no 100-continue round trip */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "hearth/" HEARTH_VERSION);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    if (src) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, src);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)src->left);
    } else {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK) return err_set(err, HEARTH_ERR_IO, "upload: %s %s: %s", method, url, curl_easy_strerror(rc));
    return HEARTH_OK;
}

/* A status outside 2xx as an error naming the step, with the hub's own message. */
static hearth_status status_error(const up_ctx *c, const up_resp *r, const char *what, hearth_error *err) {
    const char *msg = NULL;
    json_t *j = r->body.data ? json_loadb(r->body.data, r->body.len, 0, NULL) : NULL;
    if (j) msg = json_string_value(json_object_get(j, "error"));
    char text[300];
    snprintf(text, sizeof text, "%s", msg ? msg : r->body.data && r->body.len < 200 ? r->body.data : "");
    json_decref(j);
    if (r->status == 401 || r->status == 403)
        return err_set(err, HEARTH_ERR_INVALID, "upload: %s: %s: HTTP %ld%s%s (HF_TOKEN must be a write token for %s)",
                       c->repo, what, r->status, *text ? ": " : "", text, c->repo);
    return err_set(err, HEARTH_ERR_IO, "upload: %s: %s: HTTP %ld%s%s", c->repo, what, r->status, *text ? ": " : "",
                   text);
}

/* {endpoint}/api/models/{repo}/{what}/{revision} (malloc'd). */
static char *api_url(const up_ctx *c, const char *what) { return hub_api_url(c->endpoint, c->repo, what, c->rev); }

static json_t *parse_json(const up_resp *r) {
    return r->body.data ? json_loadb(r->body.data, r->body.len, 0, NULL) : NULL;
}

/* ---- the steps ---- */

static hearth_status create_repo(up_ctx *c, hearth_error *err) {
    const char *slash = strchr(c->repo, '/');
    char org[HUB_NAME_MAX];
    snprintf(org, sizeof org, "%.*s", (int)(slash - c->repo), c->repo);
    json_t *j = json_pack("{s:s, s:s, s:s}", "name", slash + 1, "organization", org, "type", "model");
    if (j && c->o && c->o->private_repo) json_object_set_new(j, "visibility", json_string("private"));
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    sbuf url;
    sbuf_init(&url);
    sbuf_printf(&url, "%s/api/repos/create", c->endpoint);
    up_resp r = {0};
    sbuf_init(&r.body);
    hearth_status st = request(c, "POST", url.data, "application/json", NULL, body, strlen(body), NULL, 1, &r, err);
    /* 409: the repo exists already (yours: the commit below says whether you may write) */
    if (!st && r.status != 409 && (r.status < 200 || r.status > 299)) st = status_error(c, &r, "create repo", err);
    sbuf_free(&r.body), sbuf_free(&url);
    free(body);
    return st;
}

static hearth_status preupload(up_ctx *c, size_t from, size_t to, char (*samples)[700], hearth_error *err) {
    json_t *files = json_array();
    for (size_t i = from; i < to; i++)
        json_array_append_new(files, json_pack("{s:s, s:s, s:I}", "path", c->files[i].path, "sample", samples[i - from],
                                               "size", (json_int_t)c->files[i].size));
    json_t *j = json_pack("{s:o}", "files", files);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    char *url = api_url(c, "preupload");
    up_resp r = {0};
    sbuf_init(&r.body);
    hearth_status st = url ? request(c, "POST", url, "application/json", NULL, body, strlen(body), NULL, 1, &r, err)
                           : err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    if (!st && (r.status < 200 || r.status > 299)) st = status_error(c, &r, "preupload", err);
    json_t *ans = st ? NULL : parse_json(&r);
    json_t *list = json_object_get(ans, "files");
    if (!st && !json_is_array(list)) st = err_set(err, HEARTH_ERR_IO, "upload: %s: preupload: not the hub's answer", c->repo);
    size_t k;
    json_t *f;
    json_array_foreach(st ? NULL : list, k, f) {
        const char *p = json_string_value(json_object_get(f, "path"));
        const char *mode = json_string_value(json_object_get(f, "uploadMode"));
        for (size_t i = from; p && mode && i < to; i++)
            if (!strcmp(c->files[i].path, p)) c->files[i].lfs = !strcmp(mode, "lfs");
    }
    /* the hub cannot take an empty file through LFS */
    for (size_t i = from; i < to; i++)
        if (c->files[i].size == 0) c->files[i].lfs = 0;
    json_decref(ans);
    sbuf_free(&r.body);
    free(body), free(url);
    return st;
}

static hearth_status put_range(up_ctx *c, const up_file *f, const char *url, long long off, long long len, char *etag,
                               size_t etag_cap, hearth_error *err) {
    FILE *fp = fopen(f->full, "rb");
    if (!fp) return err_set(err, HEARTH_ERR_IO, "%s: %s", f->full, strerror(errno));
    if (off && fseeko(fp, (off_t)off, SEEK_SET)) {
        fclose(fp);
        return err_set(err, HEARTH_ERR_IO, "%s: %s", f->full, strerror(errno));
    }
    put_src src = {.fp = fp, .left = len, .c = c, .name = f->path, .done = off, .size = f->size};
    up_resp r = {0};
    sbuf_init(&r.body);
    /* the upload URLs are pre-signed: no Authorization header goes to them */
    hearth_status st = request(c, "PUT", url, NULL, NULL, NULL, 0, &src, 0, &r, err);
    fclose(fp);
    if (st) {
        err_set(err, HEARTH_ERR_IO, "upload: %s: sending %s was cut off (%s); run the same command again to resume",
                c->repo, f->path, err->message);
    } else if (r.status < 200 || r.status > 299) {
        char what[600];
        snprintf(what, sizeof what, "sending %s", f->path);
        st = status_error(c, &r, what, err);
    }
    if (!st && etag) {
        hub_normalize_etag(r.etag, etag, etag_cap);
        if (!*etag) snprintf(etag, etag_cap, "%s", r.etag);
    }
    sbuf_free(&r.body);
    return st;
}

static hearth_status post_json(up_ctx *c, const char *url, json_t *j, const char *what, int lfs_type,
                               hearth_error *err) {
    char *body = json_dumps(j, JSON_COMPACT);
    if (!body) return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    up_resp r = {0};
    sbuf_init(&r.body);
    const char *ct = lfs_type ? "application/vnd.git-lfs+json" : "application/json";
    hearth_status st = request(c, "POST", url, ct, lfs_type ? ct : NULL, body, strlen(body), NULL, 1, &r, err);
    if (!st && (r.status < 200 || r.status > 299)) st = status_error(c, &r, what, err);
    sbuf_free(&r.body);
    free(body);
    return st;
}

/* One LFS object's actions from the batch answer: nothing (the hub has it), a basic PUT,
 * or multipart (header.chunk_size and one URL per part, "00001"...), then verify. */
static hearth_status lfs_send(up_ctx *c, const up_file *f, json_t *actions, hearth_error *err) {
    json_t *up = json_object_get(actions, "upload"), *verify = json_object_get(actions, "verify");
    const char *href = json_string_value(json_object_get(up, "href"));
    if (!href) return err_set(err, HEARTH_ERR_IO, "upload: %s: the LFS batch answer for %s has no upload URL", c->repo,
                              f->path);
    json_t *header = json_object_get(up, "header");
    json_t *cs = json_object_get(header, "chunk_size");
    hearth_status st = HEARTH_OK;
    if (!cs) {
        st = put_range(c, f, href, 0, f->size, NULL, 0, err);
    } else {
        long long chunk = json_is_string(cs) ? atoll(json_string_value(cs)) : json_integer_value(cs);
        long long parts = chunk > 0 ? (f->size + chunk - 1) / chunk : 0;
        if (chunk <= 0 || parts <= 0 || parts > 100000)
            return err_set(err, HEARTH_ERR_IO, "upload: %s: bad multipart chunk_size for %s", c->repo, f->path);
        json_t *done = json_array();
        for (long long p = 1; !st && p <= parts; p++) {
            char key[16], etag[256];
            snprintf(key, sizeof key, "%05lld", p);
            const char *purl = json_string_value(json_object_get(header, key));
            if (!purl) {
                st = err_set(err, HEARTH_ERR_IO, "upload: %s: %s: no URL for part %lld of %lld", c->repo, f->path, p,
                             parts);
                break;
            }
            long long off = (p - 1) * chunk, len = f->size - off < chunk ? f->size - off : chunk;
            st = put_range(c, f, purl, off, len, etag, sizeof etag, err);
            if (!st) json_array_append_new(done, json_pack("{s:I, s:s}", "partNumber", (json_int_t)p, "etag", etag));
        }
        json_t *j = json_pack("{s:s, s:o}", "oid", f->sha256, "parts", done);
        if (!st) st = post_json(c, href, j, "multipart completion", 1, err);
        json_decref(j);
    }
    const char *vhref = json_string_value(json_object_get(verify, "href"));
    if (!st && vhref) {
        json_t *j = json_pack("{s:s, s:I}", "oid", f->sha256, "size", (json_int_t)f->size);
        st = post_json(c, vhref, j, "LFS verify", 1, err);
        json_decref(j);
    }
    return st;
}

static hearth_status lfs_upload(up_ctx *c, hearth_error *err) {
    json_t *objs = json_array();
    for (size_t i = 0; i < c->n; i++)
        if (c->files[i].lfs)
            json_array_append_new(objs, json_pack("{s:s, s:I}", "oid", c->files[i].sha256, "size",
                                                  (json_int_t)c->files[i].size));
    if (!json_array_size(objs)) {
        json_decref(objs);
        return HEARTH_OK;
    }
    json_t *j = json_pack("{s:s, s:[s,s], s:o, s:s, s:{s:s}}", "operation", "upload", "transfers", "basic", "multipart",
                          "objects", objs, "hash_algo", "sha256", "ref", "name", c->rev);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    sbuf url;
    sbuf_init(&url);
    sbuf_printf(&url, "%s/%s.git/info/lfs/objects/batch", c->endpoint, c->repo);
    up_resp r = {0};
    sbuf_init(&r.body);
    const char *ct = "application/vnd.git-lfs+json";
    hearth_status st = request(c, "POST", url.data, ct, ct, body, strlen(body), NULL, 1, &r, err);
    if (!st && (r.status < 200 || r.status > 299)) st = status_error(c, &r, "LFS batch", err);
    json_t *ans = st ? NULL : parse_json(&r);
    json_t *list = json_object_get(ans, "objects");
    if (!st && !json_is_array(list)) st = err_set(err, HEARTH_ERR_IO, "upload: %s: LFS batch: not the hub's answer", c->repo);
    for (size_t i = 0; !st && i < c->n; i++) {
        up_file *f = &c->files[i];
        if (!f->lfs) continue;
        json_t *o = NULL, *x;
        size_t k;
        json_array_foreach(list, k, x) {
            const char *oid = json_string_value(json_object_get(x, "oid"));
            if (oid && !strcmp(oid, f->sha256)) o = x;
        }
        if (!o) {
            st = err_set(err, HEARTH_ERR_IO, "upload: %s: the LFS batch answer leaves out %s", c->repo, f->path);
            break;
        }
        json_t *oe = json_object_get(o, "error");
        if (oe)
            st = err_set(err, HEARTH_ERR_IO, "upload: %s: LFS refused %s: %s", c->repo, f->path,
                         json_string_value(json_object_get(oe, "message")) ? json_string_value(json_object_get(oe, "message"))
                                                                          : "error");
        else if (json_object_get(o, "actions"))
            st = lfs_send(c, f, json_object_get(o, "actions"), err);
        else if (c->o && c->o->on_progress) /* the hub has it: nothing to send (a resumed upload) */
            c->o->on_progress(c->o->user, f->path, f->size, f->size);
    }
    json_decref(ans);
    sbuf_free(&r.body), sbuf_free(&url);
    free(body);
    return st;
}

static hearth_status append_b64_file(sbuf *out, const up_file *f, hearth_error *err) {
    FILE *fp = fopen(f->full, "rb");
    if (!fp) return err_set(err, HEARTH_ERR_IO, "%s: %s", f->full, strerror(errno));
    unsigned char in[3 * 4096];
    char enc[4 * 4096 + 1];
    size_t n;
    while ((n = fread(in, 1, sizeof in, fp)) > 0) {
        int k = EVP_EncodeBlock((unsigned char *)enc, in, (int)n);
        sbuf_append(out, enc, (size_t)k);
    }
    int bad = ferror(fp);
    fclose(fp);
    return bad ? err_set(err, HEARTH_ERR_IO, "%s: read error", f->full) : HEARTH_OK;
}

static hearth_status commit(up_ctx *c, char **commit_url, hearth_error *err) {
    sbuf nd;
    sbuf_init(&nd);
    char summary[512];
    if (c->o && c->o->message && *c->o->message) snprintf(summary, sizeof summary, "%s", c->o->message);
    else snprintf(summary, sizeof summary, "Upload %zu file%s with hearth", c->n, c->n == 1 ? "" : "s");
    json_t *h = json_pack("{s:s, s:{s:s, s:s}}", "key", "header", "value", "summary", summary, "description", "");
    char *line = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (line) sbuf_printf(&nd, "%s\n", line);
    free(line);
    hearth_status st = HEARTH_OK;
    for (size_t i = 0; !st && i < c->n; i++) {
        const up_file *f = &c->files[i];
        if (f->lfs) {
            json_t *j = json_pack("{s:s, s:{s:s, s:s, s:s, s:I}}", "key", "lfsFile", "value", "path", f->path, "algo",
                                  "sha256", "oid", f->sha256, "size", (json_int_t)f->size);
            line = j ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            if (line) sbuf_printf(&nd, "%s\n", line);
            free(line);
        } else { /* {"key":"file","value":{"content":<base64>,"path":...,"encoding":"base64"}} */
            char *p = NULL;
            json_t *js = json_string(f->path);
            p = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
            json_decref(js);
            sbuf_puts(&nd, "{\"key\":\"file\",\"value\":{\"content\":\"");
            st = append_b64_file(&nd, f, err);
            sbuf_printf(&nd, "\",\"path\":%s,\"encoding\":\"base64\"}}\n", p ? p : "\"\"");
            free(p);
        }
    }
    if (!st && nd.oom) st = err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    char *url = api_url(c, "commit");
    up_resp r = {0};
    sbuf_init(&r.body);
    if (!st && !url) st = err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    if (!st) st = request(c, "POST", url, "application/x-ndjson", NULL, nd.data, nd.len, NULL, 1, &r, err);
    if (!st && (r.status < 200 || r.status > 299)) st = status_error(c, &r, "commit", err);
    json_t *ans = st ? NULL : parse_json(&r);
    const char *cu = json_string_value(json_object_get(ans, "commitUrl"));
    if (!st && commit_url) *commit_url = strdup(cu ? cu : "");
    json_decref(ans);
    sbuf_free(&r.body), sbuf_free(&nd);
    free(url);
    return st;
}

hearth_status hearth_upload(const char *dir, const char *repo_arg, const hearth_upload_options *o, char **commit_url,
                            hearth_error *err) {
    hearth_error local = {0};
    if (!err) err = &local;
    if (commit_url) *commit_url = NULL;
    hub_curl_init();
    up_ctx c = {.o = o};
    struct stat sb;
    if (!dir || stat(dir, &sb)) return err_set(err, HEARTH_ERR_NOT_FOUND, "%s: %s", dir ? dir : "(null)",
                                               dir ? strerror(errno) : "no folder");
    if (!S_ISDIR(sb.st_mode)) return err_set(err, HEARTH_ERR_INVALID, "%s: not a folder", dir);
    hearth_status st = hub_parse_repo_arg(repo_arg ? repo_arg : "", c.repo, c.rev, err);
    if (st) return st;
    if (!strchr(c.repo, '/')) return err_set(err, HEARTH_ERR_INVALID, "upload: '%s': the repo must be org/name", c.repo);
    if (o && o->revision && *o->revision) snprintf(c.rev, sizeof c.rev, "%s", o->revision);
    const char *ep = user_setting(o ? o->endpoint : NULL, "HF_ENDPOINT");
    snprintf(c.endpoint, sizeof c.endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    size_t el = strlen(c.endpoint);
    while (el && c.endpoint[el - 1] == '/') c.endpoint[--el] = 0;
    const char *token = user_setting(o ? o->token : NULL, "HF_TOKEN");
    if (!token || !*token)
        return err_set(err, HEARTH_ERR_INVALID,
                       "upload: HF_TOKEN is not set: the hub needs a write token (huggingface.co/settings/tokens)");
    sbuf auth;
    sbuf_init(&auth);
    sbuf_printf(&auth, "Authorization: Bearer %s", token);
    c.auth = auth.data ? curl_slist_append(NULL, auth.data) : NULL;
    sbuf_free(&auth);
    st = walk(&c, dir, "", 0, err);
    if (!st && !c.n) st = err_set(err, HEARTH_ERR_INVALID, "upload: %s: no files to upload", dir);
    if (!st) qsort(c.files, c.n, sizeof *c.files, cmp_file);
    if (!st) st = create_repo(&c, err);
    char (*samples)[700] = st ? NULL : malloc(UP_BATCH * sizeof *samples);
    if (!st && !samples) st = err_set(err, HEARTH_ERR_NOMEM, "upload: out of memory");
    for (size_t from = 0; !st && from < c.n; from += UP_BATCH) {
        size_t to = from + UP_BATCH < c.n ? from + UP_BATCH : c.n;
        for (size_t i = from; !st && i < to; i++) st = digest(&c.files[i], samples[i - from], sizeof samples[0], err);
        if (!st) st = preupload(&c, from, to, samples, err);
    }
    free(samples);
    if (!st) st = lfs_upload(&c, err);
    if (!st) st = commit(&c, commit_url, err);
    for (size_t i = 0; i < c.n; i++) free(c.files[i].path), free(c.files[i].full);
    free(c.files);
    curl_slist_free_all(c.auth);
    return st;
}
