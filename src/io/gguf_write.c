/* gguf_write.c: the GGUF v3 writer (see gguf_write.h). The reader (gguf.c) and the gguf
 * package are its checks: every file written here must parse in both. */
#include "io/gguf_write.h"
#include "base/err.h"
#include <errno.h>
#include <string.h>

static void put(sbuf *b, const void *p, size_t n) { sbuf_append(b, p, n); }
static void put_u32(sbuf *b, uint32_t v) { put(b, &v, 4); } /* little-endian hosts only, as the reader */
static void put_u64(sbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(sbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_key(gguf_out *o, const char *key, uint32_t type) {
    put_str(&o->kv, key);
    put_u32(&o->kv, type);
    o->n_kv++;
}

void gguf_out_init(gguf_out *o) {
    memset(o, 0, sizeof *o);
    sbuf_init(&o->kv);
    sbuf_init(&o->infos);
}

void gguf_out_free(gguf_out *o) {
    sbuf_free(&o->kv);
    sbuf_free(&o->infos);
}

void gguf_out_str(gguf_out *o, const char *key, const char *value) {
    put_key(o, key, 8);
    put_str(&o->kv, value);
}
void gguf_out_u32(gguf_out *o, const char *key, uint32_t value) {
    put_key(o, key, 4);
    put_u32(&o->kv, value);
}
void gguf_out_f32(gguf_out *o, const char *key, float value) {
    put_key(o, key, 6);
    put(&o->kv, &value, 4);
}
void gguf_out_bool(gguf_out *o, const char *key, int value) {
    put_key(o, key, 7);
    uint8_t v = value != 0;
    put(&o->kv, &v, 1);
}
void gguf_out_strs(gguf_out *o, const char *key, const char *const *values, size_t n) {
    put_key(o, key, 9);
    put_u32(&o->kv, 8);
    put_u64(&o->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&o->kv, values[i]);
}
void gguf_out_i32s(gguf_out *o, const char *key, const int32_t *values, size_t n) {
    put_key(o, key, 9);
    put_u32(&o->kv, 5);
    put_u64(&o->kv, n);
    put(&o->kv, values, n * sizeof *values);
}

static int ggml_type_of(tensor_dtype dt, uint32_t *id) {
    static const struct {
        tensor_dtype dt;
        uint32_t id;
    } map[] = {
        {DT_F32, 0},  {DT_F16, 1},  {DT_Q4_0, 2},  {DT_Q4_1, 3},  {DT_Q5_0, 6},
        {DT_Q5_1, 7}, {DT_Q8_0, 8}, {DT_Q4_K, 12}, {DT_Q6_K, 14}, {DT_BF16, 30},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].dt == dt) return *id = map[i].id, 1;
    return 0;
}

static uint64_t padded(uint64_t n) { return (n + GGUF_OUT_ALIGNMENT - 1) / GGUF_OUT_ALIGNMENT * GGUF_OUT_ALIGNMENT; }

uint64_t gguf_out_tensor(gguf_out *o, const char *name, tensor_dtype dt, int ndim, const int64_t *shape) {
    uint32_t id;
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (uint64_t)shape[d];
    uint64_t nbytes = tensor_dtype_nbytes(dt, n);
    if (!ggml_type_of(dt, &id) || !nbytes) return 0;
    put_str(&o->infos, name);
    put_u32(&o->infos, (uint32_t)ndim);
    for (int d = ndim - 1; d >= 0; d--) put_u64(&o->infos, (uint64_t)shape[d]); /* GGUF's ne[]: innermost first */
    put_u32(&o->infos, id);
    put_u64(&o->infos, o->data_bytes);
    o->data_bytes += padded(nbytes);
    o->n_tensors++;
    return nbytes;
}

hearth_status gguf_out_pad(FILE *f, uint64_t nbytes, const char *fname, hearth_error *err) {
    static const uint8_t zeros[GGUF_OUT_ALIGNMENT];
    size_t k = (size_t)(padded(nbytes) - nbytes);
    if (k && fwrite(zeros, 1, k, f) != k) return err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    return HEARTH_OK;
}

hearth_status gguf_out_write_header(gguf_out *o, FILE *f, const char *fname, hearth_error *err) {
    if (o->kv.oom || o->infos.oom) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory for the header", fname);
    sbuf h;
    sbuf_init(&h);
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, o->n_tensors);
    put_u64(&h, o->n_kv);
    put(&h, o->kv.data, o->kv.len);
    put(&h, o->infos.data, o->infos.len);
    hearth_status st = HEARTH_OK;
    if (h.oom)
        st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory for the header", fname);
    else if (fwrite(h.data, 1, h.len, f) != h.len)
        st = err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    else
        st = gguf_out_pad(f, h.len, fname, err);
    sbuf_free(&h);
    return st;
}
