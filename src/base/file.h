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
/* Joins two path parts with one '/', heap-allocated. */
char *path_join(const char *a, const char *b);
#endif
