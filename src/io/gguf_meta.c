/* gguf_meta.c: lookups on a parsed gguf_file: keys, tensors, typed getters with
 * numeric widening, array element access and the metadata-as-JSON view. Reads only
 * what gguf.c already bounds-checked; never parses the image itself. */
#include "base/sbuf.h"
#include "io/gguf.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

const char *gguf_type_name(gguf_type t) {
    /* the names gguf-py's GGUFValueType uses */
    static const char *const names[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
    return (unsigned)t <= GGUF_FLOAT64 ? names[t] : "UNKNOWN";
}

const gguf_kv *gguf_find(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const tensor_info *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_unsigned(gguf_type t) {
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}
static int is_signed(gguf_type t) {
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}
static int is_float(gguf_type t) { return t == GGUF_FLOAT32 || t == GGUF_FLOAT64; }

int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return 1;
    }
    if (is_unsigned(kv->type) && kv->v.u64 <= INT64_MAX) {
        *out = (int64_t)kv->v.u64;
        return 1;
    }
    return 0;
}

int gguf_get_f64(const gguf_file *g, const char *key, double *out) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (is_float(kv->type)) *out = kv->v.f64;
    else if (is_signed(kv->type)) *out = (double)kv->v.i64;
    else if (is_unsigned(kv->type)) *out = (double)kv->v.u64;
    else return 0;
    return 1;
}

int gguf_get_bool(const gguf_file *g, const char *key, int *out) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_BOOL) return 0;
    *out = kv->v.b;
    return 1;
}

char *gguf_get_str(const gguf_file *g, const char *key) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_STRING) return NULL;
    char *s = malloc((size_t)kv->v.str.len + 1);
    if (!s) return NULL;
    memcpy(s, kv->v.str.ptr, (size_t)kv->v.str.len);
    s[kv->v.str.len] = 0;
    return s;
}

/* Element i of a numeric array, decoded into exactly one of the three outputs. */
typedef enum { ELEM_NONE, ELEM_U64, ELEM_I64, ELEM_F64 } elem_kind;

static elem_kind arr_elem(const gguf_kv *kv, uint64_t i, uint64_t *u, int64_t *s, double *f) {
    if (!kv || kv->type != GGUF_ARRAY || i >= kv->v.arr.n) return ELEM_NONE;
    const uint8_t *p = kv->v.arr.data;
    switch (kv->v.arr.type) {
    case GGUF_UINT8: *u = p[i]; return ELEM_U64;
    case GGUF_BOOL: *u = p[i] != 0; return ELEM_U64;
    case GGUF_INT8: *s = (int8_t)p[i]; return ELEM_I64;
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p + 2 * i, 2); *u = v; return ELEM_U64; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p + 2 * i, 2); *s = v; return ELEM_I64; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p + 4 * i, 4); *u = v; return ELEM_U64; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p + 4 * i, 4); *s = v; return ELEM_I64; }
    case GGUF_UINT64: memcpy(u, p + 8 * i, 8); return ELEM_U64;
    case GGUF_INT64: memcpy(s, p + 8 * i, 8); return ELEM_I64;
    case GGUF_FLOAT32: { float v; memcpy(&v, p + 4 * i, 4); *f = v; return ELEM_F64; }
    case GGUF_FLOAT64: memcpy(f, p + 8 * i, 8); return ELEM_F64;
    default: return ELEM_NONE;
    }
}

double gguf_arr_f64(const gguf_kv *kv, uint64_t i) {
    uint64_t u = 0;
    int64_t s = 0;
    double f = 0;
    switch (arr_elem(kv, i, &u, &s, &f)) {
    case ELEM_U64: return (double)u;
    case ELEM_I64: return (double)s;
    case ELEM_F64: return f;
    default: return 0;
    }
}

/* Floats are truncated toward zero; values int64 cannot hold saturate instead of
 * being undefined behaviour (NaN gives 0). */
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i) {
    uint64_t u = 0;
    int64_t s = 0;
    double f = 0;
    switch (arr_elem(kv, i, &u, &s, &f)) {
    case ELEM_U64: return u > INT64_MAX ? INT64_MAX : (int64_t)u;
    case ELEM_I64: return s;
    case ELEM_F64:
        if (f != f) return 0;
        if (f >= 9223372036854775808.0) return INT64_MAX;
        if (f < -9223372036854775808.0) return INT64_MIN;
        return (int64_t)f;
    default: return 0;
    }
}

/* JSON strings must be valid UTF-8: invalid bytes become U+FFFD, one per byte. */
static json_t *json_text(const char *p, uint64_t len) {
    sbuf b;
    sbuf_init(&b);
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)p;
    uint64_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        uint64_t left = len - i;
        utf8proc_ssize_t n = utf8proc_iterate(s + i, left > 4 ? 4 : (utf8proc_ssize_t)left, &cp);
        if (n > 0) {
            sbuf_append(&b, p + i, (size_t)n);
            i += (uint64_t)n;
        } else {
            sbuf_append(&b, "\xef\xbf\xbd", 3);
            i++;
        }
    }
    json_t *j = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
    sbuf_free(&b);
    return j;
}

static json_t *json_number(elem_kind k, uint64_t u, int64_t s, double f) {
    switch (k) {
    case ELEM_U64: return u <= INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    case ELEM_I64: return json_integer((json_int_t)s);
    case ELEM_F64: return isfinite(f) ? json_real(f) : json_null(); /* JSON has no NaN/inf */
    default: return json_null();
    }
}

static json_t *kv_json(const gguf_kv *kv, uint64_t max_array) {
    switch (kv->type) {
    case GGUF_STRING: return json_text(kv->v.str.ptr, kv->v.str.len);
    case GGUF_BOOL: return json_boolean(kv->v.b);
    case GGUF_FLOAT32: case GGUF_FLOAT64: return json_number(ELEM_F64, 0, 0, kv->v.f64);
    case GGUF_ARRAY: break;
    default: return is_signed(kv->type) ? json_integer(kv->v.i64) : json_number(ELEM_U64, kv->v.u64, 0, 0);
    }
    if (kv->v.arr.n > max_array)
        return json_pack("{s:s, s:I}", "type", gguf_type_name(kv->v.arr.type), "length",
                         (json_int_t)(kv->v.arr.n > INT64_MAX ? INT64_MAX : kv->v.arr.n));
    json_t *a = json_array();
    for (uint64_t i = 0; a && i < kv->v.arr.n; i++) {
        json_t *e;
        if (kv->v.arr.type == GGUF_STRING) {
            e = json_text(kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len);
        } else if (kv->v.arr.type == GGUF_BOOL) {
            e = json_boolean(kv->v.arr.data[i] != 0);
        } else {
            uint64_t u = 0;
            int64_t s = 0;
            double f = 0;
            elem_kind k = arr_elem(kv, i, &u, &s, &f);
            e = json_number(k, u, s, f);
        }
        if (!e || json_array_append_new(a, e)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

json_t *gguf_metadata_json(const gguf_file *g, uint64_t max_array) {
    json_t *o = json_object();
    for (uint64_t i = 0; o && i < g->n_kv; i++) {
        json_t *v = kv_json(&g->kv[i], max_array);
        if (!v) goto fail;
        /* keys are raw bytes from the file; jansson refuses invalid UTF-8 ones */
        int rc = json_object_set(o, g->kv[i].key, v);
        if (rc) {
            json_t *k = json_text(g->kv[i].key, strlen(g->kv[i].key));
            rc = !k || json_object_set(o, json_string_value(k), v);
            json_decref(k);
        }
        json_decref(v);
        if (rc) goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}
