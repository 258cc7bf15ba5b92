/* file.h: reading and mapping files with errors that name the file. */
#ifndef HEARTH_BASE_FILE_H
#define HEARTH_BASE_FILE_H
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>

typedef struct file_map {
    uint8_t *data; /* read-only mapping (or NULL for an empty file) */
    size_t size;
} file_map;

hearth_status file_map_open(const char *path, file_map *out, hearth_error *err);
void file_map_close(file_map *m);
/* Reads a whole file into a NUL-terminated heap buffer. */
hearth_status file_read_all(const char *path, char **out, size_t *len, hearth_error *err);
int file_exists(const char *path);
int file_is_dir(const char *path);
/* mkdir -p: creates path and its missing parents (0755); 0, or -1 with errno set. */
int file_mkdirs(const char *path);
/* mkdir -p of the folder path is in (nothing for a bare name); 0, or -1 with errno set. */
int file_mkdirs_parent(const char *path);
/* Writes len bytes to path atomically: into a temporary file beside it (same folder, so
 * the same file system), then renamed over path; a failure leaves path as it was and no
 * temporary behind. The folder must exist. 0, or -1 with errno set. */
int file_write_atomic(const char *path, const void *data, size_t len);
/* Joins two path parts with one '/', heap-allocated. */
char *path_join(const char *a, const char *b);
#endif
