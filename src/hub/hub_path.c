/* hub_path.c: the Hugging Face hub's names and the cache layout's paths: repo ids,
 * revisions, ETags, symlink targets, URLs, include/exclude globs and size strings.
 * Pure string functions: no I/O, so every case is unit-tested (tests/unit/test_hub.c). */
#include "base/err.h"
#include "base/sbuf.h"
#include "hub/hub.h"
#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The hub's rule for a repo id part: [A-Za-z0-9._-], at most 96 characters, no "--" or
 * ".." (they would be ambiguous in models--org--name), not starting or ending with - or . */
static int valid_id_part(const char *s, size_t n) {
    if (n == 0 || n > 96) return 0;
    if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '-' && c != '_' && c != '.') return 0;
        if (i && (c == '-' || c == '.') && s[i - 1] == c) return 0;
    }
    return 1;
}

int hub_safe_relpath(const char *name) {
    if (!name || !*name || name[0] == '/') return 0;
    const char *part = name;
    for (const char *p = name;; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '/' || c == 0) {
            size_t n = (size_t)(p - part);
            if (n == 0 || (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.')) return 0;
            if (!c) return 1;
            part = p + 1;
        } else if (c < 0x20 || c == 0x7f || c == '\\') {
            return 0;
        }
    }
}

hearth_status hub_parse_repo_arg(const char *arg, char repo[HUB_NAME_MAX], char rev[HUB_NAME_MAX], hearth_error *err) {
    if (!arg || !*arg) return err_set(err, HEARTH_ERR_INVALID, "pull: need a model id such as org/name[@revision]");
    const char *at = strchr(arg, '@');
    size_t repo_len = at ? (size_t)(at - arg) : strlen(arg);
    const char *slash = memchr(arg, '/', repo_len);
    if (!slash || repo_len >= HUB_NAME_MAX || !valid_id_part(arg, (size_t)(slash - arg)) ||
        !valid_id_part(slash + 1, repo_len - (size_t)(slash - arg) - 1))
        return err_set(err, HEARTH_ERR_INVALID,
                       "'%s' is not a Hugging Face model id (expected org/name[@revision], each part letters, "
                       "digits, '.', '_' or '-')",
                       arg);
    memcpy(repo, arg, repo_len);
    repo[repo_len] = 0;
    const char *r = at ? at + 1 : "main";
    if (strlen(r) >= HUB_NAME_MAX || !hub_safe_relpath(r))
        return err_set(err, HEARTH_ERR_INVALID, "'%s': revision '%s' is not a branch, tag or commit name", arg, r);
    snprintf(rev, HUB_NAME_MAX, "%s", r);
    return HEARTH_OK;
}

char *hub_repo_folder(const char *repo) {
    sbuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "models--");
    for (const char *p = repo; *p; p++)
        if (*p == '/')
            sbuf_puts(&b, "--");
        else
            sbuf_putc(&b, *p);
    return sbuf_steal(&b);
}

int hub_is_hex(const char *s, size_t n) {
    if (!s || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

void hub_normalize_etag(const char *v, char *out, size_t cap) {
    out[0] = 0;
    if (!v || cap == 0) return;
    while (*v == ' ' || *v == '\t') v++;
    if (!strncmp(v, "W/", 2)) v += 2;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' || v[n - 1] == '\n')) n--;
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v++;
        n -= 2;
    }
    if (n == 0 || n >= cap) return;
    for (size_t i = 0; i < n; i++) /* the etag becomes a file name in blobs/ */
        if (!isalnum((unsigned char)v[i]) && v[i] != '-' && v[i] != '_' && v[i] != '.') return;
    if (v[0] == '.') return;
    memcpy(out, v, n);
    out[n] = 0;
}

char *hub_symlink_target(const char *filename, const char *etag) {
    sbuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "../../"); /* out of snapshots/<commit>/ */
    for (const char *p = filename; *p; p++)
        if (*p == '/') sbuf_puts(&b, "../");
    sbuf_puts(&b, "blobs/");
    sbuf_puts(&b, etag);
    return sbuf_steal(&b);
}

char *hub_url_escape(const char *s, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    sbuf b;
    sbuf_init(&b);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' || (keep_slash && *p == '/')) {
            sbuf_putc(&b, (char)*p);
        } else {
            sbuf_putc(&b, '%');
            sbuf_putc(&b, hex[*p >> 4]);
            sbuf_putc(&b, hex[*p & 15]);
        }
    }
    if (!b.data) sbuf_puts(&b, "");
    return sbuf_steal(&b);
}

static const char *trim_endpoint(const char *endpoint, size_t *n) {
    *n = strlen(endpoint);
    while (*n && endpoint[*n - 1] == '/') (*n)--;
    return endpoint;
}

char *hub_api_url(const char *endpoint, const char *repo, const char *what, const char *rev) {
    size_t n;
    trim_endpoint(endpoint, &n);
    char *r = hub_url_escape(rev, 0);
    sbuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "%.*s/api/models/%s/%s/%s", (int)n, endpoint, repo, what, r ? r : "");
    free(r);
    return sbuf_steal(&b);
}

char *hub_resolve_url(const char *endpoint, const char *repo, const char *rev, const char *file) {
    size_t n;
    trim_endpoint(endpoint, &n);
    char *r = hub_url_escape(rev, 0), *f = hub_url_escape(file, 1);
    sbuf b;
    sbuf_init(&b);
    sbuf_printf(&b, "%.*s/%s/resolve/%s/%s", (int)n, endpoint, repo, r ? r : "", f ? f : "");
    free(r);
    free(f);
    return sbuf_steal(&b);
}

static int glob_match(const char *pattern, const char *name) {
    size_t n = strlen(pattern);
    if (n && pattern[n - 1] == '/') { /* "dir/" names everything under dir */
        char buf[1024];
        if (n + 2 > sizeof buf) return 0;
        memcpy(buf, pattern, n);
        buf[n] = '*';
        buf[n + 1] = 0;
        return fnmatch(buf, name, 0) == 0;
    }
    return fnmatch(pattern, name, 0) == 0;
}

int hub_wanted(const char *name, const char *const *include, size_t n_include, const char *const *exclude,
               size_t n_exclude) {
    int in = n_include == 0;
    for (size_t i = 0; i < n_include && !in; i++) in = glob_match(include[i], name);
    for (size_t i = 0; i < n_exclude && in; i++)
        if (glob_match(exclude[i], name)) in = 0;
    return in;
}

long long hearth_parse_size(const char *s) {
    if (!s || !*s) return -1;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    while (*end == ' ') end++;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"kb", 1e3},
        {"mb", 1e6},
        {"gb", 1e9},
        {"tb", 1e12},
        {"k", 1024.0},
        {"m", 1048576.0},
        {"g", 1073741824.0},
        {"t", 1099511627776.0},
        {"kib", 1024.0},
        {"mib", 1048576.0},
        {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].unit)) {
            double bytes = v * units[i].mult;
            return bytes > 9e18 ? -1 : (long long)bytes;
        }
    return -1;
}

void hub_format_bytes(long long n, char *out, size_t cap) {
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%lld B", n);
    else
        snprintf(out, cap, "%.1f %s", v, units[u]);
}
