/* file.c: file mapping and reading (see file.h). */
#include "base/file.h"
#include "base/err.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

hearth_status file_map_open(const char *path, file_map *out, hearth_error *err) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, HEARTH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, HEARTH_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return err_set(err, HEARTH_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return HEARTH_OK;
}

void file_map_close(file_map *m) {
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

hearth_status file_read_all(const char *path, char **out, size_t *len, hearth_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, HEARTH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory reading file", path);
    if (bad) { free(buf); return err_set(err, HEARTH_ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return HEARTH_OK;
}

int file_exists(const char *path) { struct stat st; return stat(path, &st) == 0; }
int file_is_dir(const char *path) { struct stat st; return stat(path, &st) == 0 && S_ISDIR(st.st_mode); }

char *path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    size_t k = la;
    if (k && p[k - 1] != '/') p[k++] = '/';
    memcpy(p + k, b, lb + 1);
    return p;
}

int file_mkdirs_parent(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = 0;
    return file_mkdirs(buf);
}

int file_write_atomic(const char *path, const void *data, size_t len) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return -1;
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f) ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path)) ok = 0;
    if (!ok) {
        int e = errno;
        if (f) unlink(tmp);
        errno = e;
    }
    free(tmp);
    return ok ? 0 : -1;
}

int file_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}
