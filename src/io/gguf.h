/* gguf.h: GGUF v2/v3 reader: header, metadata of every value type, tensor infos with
 * alignment, all bounds-checked against the mapped file. Reads only; dequantization
 * lives in ggml_quant.h. */
#ifndef HEARTH_IO_GGUF_H
#define HEARTH_IO_GGUF_H
#include "base/file.h"
#include "io/tensor.h"
#include <jansson.h>

typedef enum gguf_type {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4,
    GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9,
    GGUF_UINT64 = 10, GGUF_INT64 = 11, GGUF_FLOAT64 = 12,
} gguf_type;

typedef struct gguf_str { const char *ptr; uint64_t len; } gguf_str; /* points into the file, not NUL-terminated */

typedef struct gguf_kv {
    char *key;             /* NUL-terminated copy */
    gguf_type type;
    union {
        uint64_t u64; int64_t i64; double f64; int b;  /* scalars, widened */
        gguf_str str;
        struct { gguf_type type; uint64_t n; const uint8_t *data; gguf_str *strs; } arr;
        /* arr.data points at the raw little-endian elements for numeric arrays;
         * arr.strs is an allocated index of the strings for string arrays. */
    } v;
} gguf_kv;

typedef struct gguf_file {
    char *path;
    file_map map;          /* empty when parsed from a caller's buffer */
    uint32_t version;
    gguf_kv *kv;
    uint64_t n_kv;
    tensor_info *tensors;  /* shapes reversed to numpy order; data points into the buffer */
    uint64_t n_tensors;
    uint64_t alignment;    /* general.alignment or 32 */
    uint64_t data_offset;
} gguf_file;

/* Parses a GGUF image held in memory (used by gguf_open and the fuzz target). */
hearth_status gguf_parse(const uint8_t *buf, size_t len, const char *fname, gguf_file *out, hearth_error *err);
hearth_status gguf_open(const char *path, gguf_file *out, hearth_error *err);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find(const gguf_file *g, const char *key);
const tensor_info *gguf_find_tensor(const gguf_file *g, const char *name);
/* Typed getters with numeric widening; return 0 and leave *out alone if the key is
 * missing or of an incompatible type. */
int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
int gguf_get_f64(const gguf_file *g, const char *key, double *out);
int gguf_get_bool(const gguf_file *g, const char *key, int *out);
/* Returns a heap copy (NUL-terminated) of a string value, or NULL. */
char *gguf_get_str(const gguf_file *g, const char *key);
/* Numeric array element i widened to double / int64 (0 if out of range). */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);
const char *gguf_type_name(gguf_type t);
/* Metadata as a JSON object; arrays longer than max_array elements are summarised as
 * {"type":..., "length":n} (pass UINT64_MAX for everything). */
json_t *gguf_metadata_json(const gguf_file *g, uint64_t max_array);
#endif
