/* gguf.c: parses GGUF v2/v3 images (header, metadata, tensor infos) into a gguf_file.
 * Every count, length and offset is checked against the bytes that remain before it
 * is used or allocated for, so any input fails cleanly. Never computes on tensor
 * data; metadata getters and the JSON view live in gguf_meta.c. */
#include "io/gguf.h"
#include "base/err.h"
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32 /* the GGUF spec's default for general.alignment */
#define GGUF_MAX_DIMS 4           /* GGML_MAX_DIMS: tensor infos have at most 4 ne[] */
/* Smallest possible encodings, used to reject absurd counts before allocating:
 * a kv is key length (8) + at least one key byte + type (4) + at least one value byte;
 * a tensor info is name length (8) + one name byte + n_dims (4) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 14
#define GGUF_MIN_TENSOR_BYTES 25

/* A cursor over the image; fails instead of reading past the end. */
typedef struct reader {
    const uint8_t *buf;
    size_t len, pos;
} reader;

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int take(reader *r, uint64_t n, const uint8_t **p) {
    if (n > r->len - r->pos) return 0;
    *p = r->buf + r->pos;
    r->pos += (size_t)n;
    return 1;
}

static int take_u32(reader *r, uint32_t *v) {
    const uint8_t *p;
    if (!take(r, 4, &p)) return 0;
    *v = (uint32_t)rd_le(p, 4);
    return 1;
}

static int take_u64(reader *r, uint64_t *v) {
    const uint8_t *p;
    if (!take(r, 8, &p)) return 0;
    *v = rd_le(p, 8);
    return 1;
}

static int take_str(reader *r, gguf_str *s) {
    uint64_t n;
    const uint8_t *p;
    size_t at = r->pos;
    if (!take_u64(r, &n) || !take(r, n, &p)) {
        r->pos = at;
        return 0;
    }
    s->ptr = (const char *)p;
    s->len = n;
    return 1;
}

static size_t remaining(const reader *r) { return r->len - r->pos; }

/* Names in messages come from untrusted bytes: keep them short and printable. */
static const char *printable(const gguf_str *s, char out[80]) {
    size_t n = s->len < 72 ? (size_t)s->len : 72, j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s->ptr[i];
        out[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (s->len > n) out[j++] = '.', out[j++] = '.', out[j++] = '.';
    out[j] = 0;
    return out;
}

/* Copies a key or tensor name; names with NUL bytes are rejected because callers
 * look them up as C strings. */
static char *dup_name(const gguf_str *s) {
    if (s->len == 0 || memchr(s->ptr, 0, (size_t)s->len)) return NULL;
    char *c = malloc((size_t)s->len + 1);
    if (!c) return NULL;
    memcpy(c, s->ptr, (size_t)s->len);
    c[s->len] = 0;
    return c;
}

/* Size in bytes of one element of a fixed-size metadata type, 0 for STRING/ARRAY. */
static int scalar_size(gguf_type t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int valid_type(uint32_t t) { return t <= GGUF_FLOAT64; }

/* Widens one little-endian scalar into the kv's union. */
static void decode_scalar(gguf_kv *kv, const uint8_t *p) {
    uint64_t raw = rd_le(p, scalar_size(kv->type));
    switch (kv->type) {
    case GGUF_UINT8: case GGUF_UINT16: case GGUF_UINT32: case GGUF_UINT64: kv->v.u64 = raw; break;
    case GGUF_INT8: kv->v.i64 = (int8_t)raw; break;
    case GGUF_INT16: kv->v.i64 = (int16_t)raw; break;
    case GGUF_INT32: kv->v.i64 = (int32_t)raw; break;
    case GGUF_INT64: kv->v.i64 = (int64_t)raw; break;
    case GGUF_FLOAT32: {
        uint32_t b = (uint32_t)raw;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f64 = f;
        break;
    }
    case GGUF_FLOAT64: memcpy(&kv->v.f64, &raw, 8); break;
    case GGUF_BOOL: kv->v.b = raw != 0; break;
    default: break;
    }
}

static hearth_status parse_array(reader *r, const char *fname, const char *key, gguf_kv *kv,
                                 hearth_error *err) {
    uint32_t et;
    uint64_t n;
    if (!take_u32(r, &et) || !take_u64(r, &n))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': array header truncated", fname, key);
    if (et == GGUF_ARRAY)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: key '%s': arrays of arrays are not supported",
                       fname, key);
    if (!valid_type(et))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': unknown array element type %u", fname, key, et);
    kv->v.arr.type = (gguf_type)et;
    kv->v.arr.n = n;
    kv->v.arr.data = r->buf + r->pos;
    int es = scalar_size((gguf_type)et);
    if (es) {
        const uint8_t *p;
        if (n > remaining(r) / (uint64_t)es || !take(r, n * (uint64_t)es, &p))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': array of %llu %s runs past end of file",
                           fname, key, (unsigned long long)n, gguf_type_name((gguf_type)et));
        return HEARTH_OK;
    }
    /* strings: each takes at least its 8-byte length, so n is bounded before allocating */
    if (n > remaining(r) / 8)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': array of %llu strings runs past end of file",
                       fname, key, (unsigned long long)n);
    kv->v.arr.strs = calloc(n ? (size_t)n : 1, sizeof *kv->v.arr.strs);
    if (!kv->v.arr.strs) return err_set(err, HEARTH_ERR_NOMEM, "%s: key '%s': out of memory", fname, key);
    for (uint64_t i = 0; i < n; i++)
        if (!take_str(r, &kv->v.arr.strs[i]))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': string %llu of %llu runs past end of file",
                           fname, key, (unsigned long long)i, (unsigned long long)n);
    return HEARTH_OK;
}

static hearth_status parse_kv(reader *r, const char *fname, uint64_t index, gguf_kv *kv, hearth_error *err) {
    gguf_str k;
    char shown[80];
    if (!take_str(r, &k))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: metadata key %llu: name runs past end of file", fname,
                       (unsigned long long)index);
    kv->key = dup_name(&k);
    if (!kv->key) {
        if (k.len && !memchr(k.ptr, 0, (size_t)k.len))
            return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
        return err_set(err, HEARTH_ERR_FORMAT, "%s: metadata key %llu ('%s'): empty or contains a NUL byte",
                       fname, (unsigned long long)index, printable(&k, shown));
    }
    const char *key = printable(&k, shown);
    uint32_t t;
    if (!take_u32(r, &t))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': value type truncated", fname, key);
    if (!valid_type(t))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': unknown value type %u", fname, key, t);
    kv->type = (gguf_type)t;
    if (t == GGUF_ARRAY) return parse_array(r, fname, key, kv, err);
    if (t == GGUF_STRING) {
        if (!take_str(r, &kv->v.str))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': string runs past end of file", fname, key);
        return HEARTH_OK;
    }
    const uint8_t *p;
    if (!take(r, (uint64_t)scalar_size(kv->type), &p))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key '%s': %s value truncated", fname, key,
                       gguf_type_name(kv->type));
    decode_scalar(kv, p);
    return HEARTH_OK;
}

/* GGML type ids (gguf constants.py GGMLQuantizationType) that hearth can hold. */
static int dtype_from_ggml(uint32_t id, tensor_dtype *out) {
    static const struct { uint32_t id; tensor_dtype dt; } map[] = {
        {0, DT_F32},   {1, DT_F16},   {2, DT_Q4_0},  {3, DT_Q4_1}, {6, DT_Q5_0}, {7, DT_Q5_1},
        {8, DT_Q8_0},  {10, DT_Q2_K}, {11, DT_Q3_K}, {12, DT_Q4_K}, {13, DT_Q5_K}, {14, DT_Q6_K},
        {24, DT_I8},   {25, DT_I16},  {26, DT_I32},  {27, DT_I64}, {28, DT_F64}, {30, DT_BF16},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].id == id) {
            *out = map[i].dt;
            return 1;
        }
    return 0;
}

/* Names of the GGML types hearth does not read, so the error says what the file has. */
static const char *unsupported_ggml_name(uint32_t id) {
    switch (id) {
    case 9: return "Q8_1";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return "unknown";
    }
}

/* Reads one tensor info; the data pointer is fixed up once the data section is known. */
static hearth_status parse_tensor(reader *r, const char *fname, uint64_t index, tensor_info *t,
                                  uint64_t *offset, hearth_error *err) {
    gguf_str s;
    char shown[80];
    if (!take_str(r, &s))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor %llu: name runs past end of file", fname,
                       (unsigned long long)index);
    t->name = dup_name(&s);
    const char *name = printable(&s, shown);
    if (!t->name) {
        if (s.len && !memchr(s.ptr, 0, (size_t)s.len))
            return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor %llu ('%s'): name is empty or contains a NUL byte",
                       fname, (unsigned long long)index, name);
    }
    uint32_t ndims, type;
    if (!take_u32(r, &ndims))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': n_dims truncated", fname, name);
    if (ndims > GGUF_MAX_DIMS)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': %u dimensions (at most %d)", fname, name, ndims,
                       GGUF_MAX_DIMS);
    uint64_t ne[GGUF_MAX_DIMS];
    for (uint32_t i = 0; i < ndims; i++) {
        if (!take_u64(r, &ne[i]))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': dimensions truncated", fname, name);
        if (ne[i] > INT64_MAX)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': dimension %u is %llu (negative as int64)",
                           fname, name, i, (unsigned long long)ne[i]);
    }
    if (!take_u32(r, &type) || !take_u64(r, offset))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': type/offset truncated", fname, name);
    if (!dtype_from_ggml(type, &t->dtype))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s': GGML type %u (%s) is not supported", fname,
                       name, type, unsupported_ggml_name(type));
    t->ndim = (int)ndims;
    for (uint32_t i = 0; i < ndims; i++) t->shape[i] = (int64_t)ne[ndims - 1 - i]; /* numpy order */
    int be = tensor_dtype_block_elems(t->dtype);
    uint64_t row = ndims ? ne[0] : 1; /* a 0-d tensor is one element */
    if (row % (uint64_t)be)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor '%s': row of %llu elements is not a multiple of the %s block size %d", fname, name,
                       (unsigned long long)row, tensor_dtype_name(t->dtype), be);
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndims; i++) {
        if (ne[i] && n > UINT64_MAX / ne[i])
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': element count overflows", fname, name);
        n *= ne[i];
    }
    /* a zero dimension anywhere makes the tensor empty, even if the others overflowed */
    for (uint32_t i = 0; i < ndims; i++)
        if (!ne[i]) n = 0;
    t->nbytes = tensor_dtype_nbytes(t->dtype, n);
    if (n && !t->nbytes)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': byte size overflows", fname, name);
    return HEARTH_OK;
}

static int cmp_cstr_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Finds a repeated name among n strings (sorted copy of the pointers), or NULL. */
static const char *find_duplicate(const char **names, uint64_t n) {
    qsort(names, (size_t)n, sizeof *names, cmp_cstr_ptr);
    for (uint64_t i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) return names[i];
    return NULL;
}

static hearth_status check_duplicates(const gguf_file *g, const char *fname, hearth_error *err) {
    uint64_t most = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    const char **names = malloc((most ? (size_t)most : 1) * sizeof *names);
    if (!names) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    for (uint64_t i = 0; i < g->n_kv; i++) names[i] = g->kv[i].key;
    const char *dup = find_duplicate(names, g->n_kv);
    hearth_status st = HEARTH_OK;
    if (dup) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: key '%.200s' appears more than once", fname, dup);
    } else {
        for (uint64_t i = 0; i < g->n_tensors; i++) names[i] = g->tensors[i].name;
        dup = find_duplicate(names, g->n_tensors);
        if (dup) st = err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%.200s' appears more than once", fname, dup);
    }
    free(names);
    return st;
}

static hearth_status read_alignment(gguf_file *g, const char *fname, hearth_error *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(g, "general.alignment");
    if (!kv) return HEARTH_OK;
    int64_t a;
    if (!gguf_get_i64(g, "general.alignment", &a))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key 'general.alignment': expected an integer, got %s", fname,
                       gguf_type_name(kv->type));
    if (a <= 0 || (a & (a - 1)))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: key 'general.alignment': %lld is not a power of two", fname,
                       (long long)a);
    g->alignment = (uint64_t)a;
    return HEARTH_OK;
}

/* Places every tensor in the data section and checks it lies inside the image. */
static hearth_status place_tensors(gguf_file *g, const uint8_t *buf, size_t len, size_t header_end,
                                   const uint64_t *offsets, const char *fname, hearth_error *err) {
    uint64_t pad = (g->alignment - header_end % g->alignment) % g->alignment;
    if (pad > UINT64_MAX - header_end)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: data section offset overflows", fname);
    g->data_offset = header_end + pad;
    if (!g->n_tensors) return HEARTH_OK;
    if (g->data_offset > len)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: data section starts at %llu, past the end of the %zu-byte file",
                       fname, (unsigned long long)g->data_offset, len);
    uint64_t avail = len - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tensor_info *t = &g->tensors[i];
        if (offsets[i] % g->alignment)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%.200s': offset %llu is not aligned to %llu", fname,
                           t->name, (unsigned long long)offsets[i], (unsigned long long)g->alignment);
        if (offsets[i] > avail || t->nbytes > avail - offsets[i])
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: tensor '%.200s': %llu bytes at data offset %llu run past the end of the file (%llu data bytes)",
                           fname, t->name, (unsigned long long)t->nbytes, (unsigned long long)offsets[i],
                           (unsigned long long)avail);
        t->data = buf + g->data_offset + offsets[i];
        t->file = g->path;
    }
    return HEARTH_OK;
}

static hearth_status parse_header(reader *r, const char *fname, gguf_file *out, uint64_t *n_tensors,
                                  uint64_t *n_kv, hearth_error *err) {
    const uint8_t *magic;
    if (!take(r, 4, &magic) || memcmp(magic, "GGUF", 4))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: not a GGUF file (bad magic)", fname);
    if (!take_u32(r, &out->version))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: header truncated (version)", fname);
    /* a big-endian file's small version number reads as a multiple of 2^16 here */
    if (out->version && !(out->version & 0xffff))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: big-endian GGUF files are not supported", fname);
    if (out->version == 1)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (convert to v3)", fname);
    if (out->version != 2 && out->version != 3)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (only 2 and 3)", fname,
                       out->version);
    if (!take_u64(r, n_tensors) || !take_u64(r, n_kv))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: header truncated (counts)", fname);
    if (*n_kv > remaining(r) / GGUF_MIN_KV_BYTES)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: header claims %llu metadata entries, more than the file can hold",
                       fname, (unsigned long long)*n_kv);
    if (*n_tensors > remaining(r) / GGUF_MIN_TENSOR_BYTES)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: header claims %llu tensors, more than the file can hold", fname,
                       (unsigned long long)*n_tensors);
    return HEARTH_OK;
}

static hearth_status parse_body(reader *r, const char *fname, gguf_file *out, uint64_t n_tensors, uint64_t n_kv,
                                hearth_error *err) {
    hearth_status st;
    out->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *out->kv);
    out->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *out->tensors);
    uint64_t *offsets = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *offsets);
    if (!out->kv || !out->tensors || !offsets) {
        free(offsets);
        return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    }
    /* counts grow as entries are read so gguf_close frees exactly what was made */
    for (uint64_t i = 0; i < n_kv; i++) {
        out->n_kv = i + 1;
        if ((st = parse_kv(r, fname, i, &out->kv[i], err))) goto done;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        out->n_tensors = i + 1;
        if ((st = parse_tensor(r, fname, i, &out->tensors[i], &offsets[i], err))) goto done;
    }
    if ((st = check_duplicates(out, fname, err))) goto done;
    if ((st = read_alignment(out, fname, err))) goto done;
    st = place_tensors(out, r->buf, r->len, r->pos, offsets, fname, err);
done:
    free(offsets);
    return st;
}

hearth_status gguf_parse(const uint8_t *buf, size_t len, const char *fname, gguf_file *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    if (!fname) fname = "<buffer>";
    out->path = strdup(fname);
    if (!out->path) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    reader r = {buf, buf ? len : 0, 0};
    uint64_t n_tensors = 0, n_kv = 0;
    hearth_status st = parse_header(&r, fname, out, &n_tensors, &n_kv, err);
    if (!st) st = parse_body(&r, fname, out, n_tensors, n_kv, err);
    if (st) gguf_close(out);
    return st;
}

hearth_status gguf_open(const char *path, gguf_file *out, hearth_error *err) {
    file_map m;
    memset(out, 0, sizeof *out);
    hearth_status st = file_map_open(path, &m, err);
    if (st) return st;
    st = gguf_parse(m.data, m.size, path, out, err);
    if (st) {
        file_map_close(&m);
        return st;
    }
    out->map = m;
    return HEARTH_OK;
}

void gguf_close(gguf_file *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        if (g->kv[i].type == GGUF_ARRAY) free(g->kv[i].v.arr.strs);
    }
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    file_map_close(&g->map);
    memset(g, 0, sizeof *g);
}
