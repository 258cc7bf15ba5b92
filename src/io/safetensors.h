/* safetensors.h: safetensors files (single or sharded through
 * model.safetensors.index.json), mapped read-only, header bounds-checked. Reads only. */
#ifndef HEARTH_IO_SAFETENSORS_H
#define HEARTH_IO_SAFETENSORS_H
#include "base/file.h"
#include "io/tensor.h"
#include <jansson.h>

typedef struct st_file {
    char *path;
    file_map map;          /* empty when parsed from a caller's buffer */
    tensor_info *tensors;  /* data points into the buffer */
    size_t n_tensors;
    json_t *metadata;      /* the "__metadata__" object or NULL */
} st_file;

/* Parses a safetensors image held in memory (used by st_open and the fuzz target). */
hearth_status st_parse(const uint8_t *buf, size_t len, const char *fname, st_file *out, hearth_error *err);
hearth_status st_open(const char *path, st_file *out, hearth_error *err);
void st_close(st_file *f);

/* All tensors of a model folder: model.safetensors.index.json shards when present,
 * else model.safetensors, else every *.safetensors in the folder. */
typedef struct st_set {
    st_file *files;
    size_t n_files;
    const tensor_info **by_name; /* sorted by name for lookup */
    size_t n_tensors;
} st_set;

hearth_status st_set_open(const char *dir, st_set *out, hearth_error *err);
void st_set_close(st_set *s);
const tensor_info *st_set_find(const st_set *s, const char *name);
#endif
