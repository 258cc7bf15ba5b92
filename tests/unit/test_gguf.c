/* test_gguf.c: GGUF reader and ggml (de)quantizer unit tests. GGUF images are built
 * in memory by a small writer below, valid (every metadata type, v2 and v3,
 * alignment) and broken in every way the reader must catch with a clean error that
 * names the file. Bit-exact parity with gguf-py lives in tests/parity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/half.h"
#include "io/ggml_quant.h"
#include "io/gguf.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FNAME "test.gguf"

/* ---- a minimal GGUF writer ---------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static void w_bytes(wbuf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void w_le(wbuf *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        w_bytes(b, &c, 1);
    }
}
static void w_u32(wbuf *b, uint32_t v) { w_le(b, v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_le(b, v, 8); }
static void w_str(wbuf *b, const char *s) {
    w_u64(b, strlen(s));
    w_bytes(b, s, strlen(s));
}
static void w_header(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    w_bytes(b, "GGUF", 4);
    w_u32(b, version);
    w_u64(b, n_tensors);
    w_u64(b, n_kv);
}
static void w_key(wbuf *b, const char *key, gguf_type t) {
    w_str(b, key);
    w_u32(b, t);
}
static void w_kv_u32(wbuf *b, const char *key, uint32_t v) {
    w_key(b, key, GGUF_UINT32);
    w_u32(b, v);
}
static void w_tensor(wbuf *b, const char *name, uint32_t ndims, const uint64_t *ne, uint32_t type, uint64_t off) {
    w_str(b, name);
    w_u32(b, ndims);
    for (uint32_t i = 0; i < ndims; i++) w_u64(b, ne[i]);
    w_u32(b, type);
    w_u64(b, off);
}
static void w_pad(wbuf *b, size_t align) {
    while (b->len % align) w_le(b, 0, 1);
}

static hearth_error err;
static gguf_file g;

static hearth_status parse(const wbuf *b) {
    memset(&err, 0, sizeof err);
    return gguf_parse(b->p, b->len, FNAME, &g, &err);
}

/* Parses b expecting failure with status want and a message containing the file name
 * and needle; the output must be left empty. */
static void expect_fail(const wbuf *b, hearth_status want, const char *needle) {
    hearth_status st = parse(b);
    if (st != want || !strstr(err.message, FNAME) || (needle && !strstr(err.message, needle)))
        print_error("got status %d (want %d), message: %s\n", st, want, err.message);
    assert_int_equal(st, want);
    assert_non_null(strstr(err.message, FNAME));
    if (needle) assert_non_null(strstr(err.message, needle));
    assert_null(g.kv);
    assert_null(g.tensors);
    assert_null(g.path);
}

/* The reference file: every metadata type, arrays of numbers/bools/strings, and two
 * tensors (an F32 [2,3] and a Q8_0 row of 64) placed at the given alignment. */
static void build_valid(wbuf *b, uint32_t version, uint32_t alignment) {
    memset(b, 0, sizeof *b);
    int n_kv = 16 + (alignment ? 1 : 0);
    w_header(b, version, 2, (uint64_t)n_kv);
    w_key(b, "k.u8", GGUF_UINT8), w_le(b, 200, 1);
    w_key(b, "k.i8", GGUF_INT8), w_le(b, (uint8_t)-5, 1);
    w_key(b, "k.u16", GGUF_UINT16), w_le(b, 60000, 2);
    w_key(b, "k.i16", GGUF_INT16), w_le(b, (uint16_t)-300, 2);
    w_kv_u32(b, "k.u32", 4000000000u);
    w_key(b, "k.i32", GGUF_INT32), w_le(b, (uint32_t)-70000, 4);
    float f = 0.25f;
    w_key(b, "k.f32", GGUF_FLOAT32), w_bytes(b, &f, 4);
    w_key(b, "k.bool", GGUF_BOOL), w_le(b, 1, 1);
    w_key(b, "k.str", GGUF_STRING), w_str(b, "h\xc3\xa9llo");
    w_key(b, "k.u64", GGUF_UINT64), w_u64(b, UINT64_MAX);
    w_key(b, "k.i64", GGUF_INT64), w_u64(b, (uint64_t)INT64_MIN);
    double d = -1.5e300;
    w_key(b, "k.f64", GGUF_FLOAT64), w_bytes(b, &d, 8);
    w_key(b, "k.arr_i32", GGUF_ARRAY), w_u32(b, GGUF_INT32), w_u64(b, 3);
    w_u32(b, 7), w_u32(b, (uint32_t)-8), w_u32(b, 9);
    w_key(b, "k.arr_f32", GGUF_ARRAY), w_u32(b, GGUF_FLOAT32), w_u64(b, 2);
    float fa[2] = {1.5f, -2.0f};
    w_bytes(b, fa, 8);
    w_key(b, "k.arr_str", GGUF_ARRAY), w_u32(b, GGUF_STRING), w_u64(b, 3);
    w_str(b, "a"), w_str(b, ""), w_str(b, "xyz");
    w_key(b, "k.arr_bool", GGUF_ARRAY), w_u32(b, GGUF_BOOL), w_u64(b, 2);
    w_le(b, 0, 1), w_le(b, 1, 1);
    if (alignment) w_kv_u32(b, "general.alignment", alignment);
    uint32_t a = alignment ? alignment : 32;
    uint64_t ne0[2] = {3, 2}, ne1[1] = {64};
    uint64_t off1 = (24 + a - 1) / a * a; /* the F32 tensor takes 24 bytes */
    w_tensor(b, "t.f32", 2, ne0, 0, 0);
    w_tensor(b, "t.q8", 1, ne1, 8, off1);
    w_pad(b, a);
    for (int i = 0; i < 6; i++) {
        float v = (float)i - 2.5f;
        w_bytes(b, &v, 4);
    }
    w_pad(b, a);
    for (int blk = 0; blk < 2; blk++) { /* Q8_0 blocks: d = 0.5, q = i - 16 */
        w_le(b, 0x3800, 2);
        for (int i = 0; i < 32; i++) w_le(b, (uint8_t)(int8_t)(i - 16), 1);
    }
}

static void check_valid(uint32_t version, uint32_t alignment) {
    wbuf b;
    build_valid(&b, version, alignment);
    assert_int_equal(parse(&b), HEARTH_OK);
    assert_int_equal(g.version, version);
    assert_int_equal(g.alignment, alignment ? alignment : 32);
    assert_int_equal(g.data_offset % g.alignment, 0);
    int64_t i;
    double f;
    int bo;
    assert_true(gguf_get_i64(&g, "k.u8", &i) && i == 200);
    assert_true(gguf_get_i64(&g, "k.i8", &i) && i == -5);
    assert_true(gguf_get_i64(&g, "k.u16", &i) && i == 60000);
    assert_true(gguf_get_i64(&g, "k.i16", &i) && i == -300);
    assert_true(gguf_get_i64(&g, "k.u32", &i) && i == 4000000000LL);
    assert_true(gguf_get_i64(&g, "k.i32", &i) && i == -70000);
    assert_true(gguf_get_i64(&g, "k.i64", &i) && i == INT64_MIN);
    i = 42; /* u64 max does not fit: the getter refuses and leaves i alone */
    assert_false(gguf_get_i64(&g, "k.u64", &i));
    assert_int_equal(i, 42);
    assert_true(gguf_get_f64(&g, "k.f32", &f) && f == 0.25);
    assert_true(gguf_get_f64(&g, "k.f64", &f) && f == -1.5e300);
    assert_true(gguf_get_f64(&g, "k.i32", &f) && f == -70000.0);
    assert_true(gguf_get_bool(&g, "k.bool", &bo) && bo == 1);
    assert_false(gguf_get_bool(&g, "k.u8", &bo));
    assert_false(gguf_get_i64(&g, "k.str", &i));
    assert_false(gguf_get_i64(&g, "missing", &i));
    char *s = gguf_get_str(&g, "k.str");
    assert_string_equal(s, "h\xc3\xa9llo");
    free(s);
    assert_null(gguf_get_str(&g, "k.u8"));
    const gguf_kv *kv = gguf_find(&g, "k.arr_i32");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_ARRAY);
    assert_int_equal(kv->v.arr.type, GGUF_INT32);
    assert_int_equal(kv->v.arr.n, 3);
    assert_int_equal(gguf_arr_i64(kv, 1), -8);
    assert_true(gguf_arr_f64(kv, 2) == 9.0);
    assert_int_equal(gguf_arr_i64(kv, 3), 0); /* out of range */
    kv = gguf_find(&g, "k.arr_f32");
    assert_true(gguf_arr_f64(kv, 0) == 1.5 && gguf_arr_f64(kv, 1) == -2.0);
    assert_int_equal(gguf_arr_i64(kv, 0), 1);
    kv = gguf_find(&g, "k.arr_str");
    assert_int_equal(kv->v.arr.n, 3);
    assert_int_equal(kv->v.arr.strs[1].len, 0);
    assert_int_equal(kv->v.arr.strs[2].len, 3);
    assert_memory_equal(kv->v.arr.strs[2].ptr, "xyz", 3);
    kv = gguf_find(&g, "k.arr_bool");
    assert_int_equal(gguf_arr_i64(kv, 1), 1);

    assert_int_equal(g.n_tensors, 2);
    const tensor_info *t = gguf_find_tensor(&g, "t.f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, DT_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2); /* ne = [3, 2] reversed */
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->nbytes, 24);
    assert_string_equal(t->file, FNAME);
    float first;
    memcpy(&first, t->data, 4);
    assert_true(first == -2.5f);
    t = gguf_find_tensor(&g, "t.q8");
    assert_int_equal(t->dtype, DT_Q8_0);
    assert_int_equal(t->nbytes, 68);
    assert_int_equal((t->data - b.p) % (long)g.alignment, 0);
    float out[64];
    assert_int_equal(ggml_dequantize(t->dtype, t->data, t->nbytes, out, 64, &err), HEARTH_OK);
    for (int k = 0; k < 64; k++) assert_true(out[k] == 0.5f * (float)(k % 32 - 16));
    assert_null(gguf_find_tensor(&g, "nope"));

    json_t *j = gguf_metadata_json(&g, UINT64_MAX);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "k.i8")), -5);
    assert_string_equal(json_string_value(json_object_get(j, "k.str")), "h\xc3\xa9llo");
    assert_true(json_is_true(json_object_get(j, "k.bool")));
    assert_int_equal(json_array_size(json_object_get(j, "k.arr_str")), 3);
    assert_true(json_real_value(json_array_get(json_object_get(j, "k.arr_f32"), 1)) == -2.0);
    json_decref(j);
    j = gguf_metadata_json(&g, 2); /* longer arrays are summarised */
    json_t *sum = json_object_get(j, "k.arr_i32");
    assert_string_equal(json_string_value(json_object_get(sum, "type")), "INT32");
    assert_int_equal(json_integer_value(json_object_get(sum, "length")), 3);
    assert_true(json_is_array(json_object_get(j, "k.arr_f32")));
    json_decref(j);
    gguf_close(&g);
    assert_null(g.kv);
    free(b.p);
}

static void test_valid_v3(void **state) { check_valid(3, 0); }
static void test_valid_v2(void **state) { check_valid(2, 0); }
static void test_alignment_64(void **state) { check_valid(3, 64); }
static void test_alignment_1(void **state) { check_valid(3, 1); }

/* Every proper prefix of a valid file must fail cleanly (the last tensor ends the file). */
static void test_truncated_every_prefix(void **state) {
    wbuf b;
    build_valid(&b, 3, 64);
    for (size_t n = 0; n < b.len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy so ASan sees any overread */
        memcpy(copy, b.p, n);
        wbuf p = {copy, n, n};
        hearth_status st = parse(&p);
        if (st == HEARTH_OK) print_error("prefix of %zu bytes parsed\n", n);
        assert_int_not_equal(st, HEARTH_OK);
        assert_non_null(strstr(err.message, FNAME));
        assert_null(g.kv);
        free(copy);
    }
    free(b.p);
}

static void test_bad_magic_and_versions(void **state) {
    wbuf b = {0};
    w_bytes(&b, "GGUX", 4), w_u32(&b, 3), w_u64(&b, 0), w_u64(&b, 0);
    expect_fail(&b, HEARTH_ERR_FORMAT, "magic");
    b.len = 0;
    w_header(&b, 1, 0, 0);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "version 1");
    b.len = 0;
    w_header(&b, 4, 0, 0);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "version 4");
    b.len = 0;
    w_bytes(&b, "GGUF", 4), w_le(&b, 0x03000000u, 4), w_u64(&b, 0), w_u64(&b, 0);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "big-endian");
    /* an empty v3 file (no tensors, no metadata) is valid */
    b.len = 0;
    w_header(&b, 3, 0, 0);
    assert_int_equal(parse(&b), HEARTH_OK);
    assert_int_equal(g.n_kv, 0);
    gguf_close(&g);
    free(b.p);
}

static void test_huge_counts(void **state) {
    wbuf b = {0};
    w_header(&b, 3, 1ull << 60, 0);
    expect_fail(&b, HEARTH_ERR_FORMAT, "tensors");
    b.len = 0;
    w_header(&b, 3, 0, 1ull << 60);
    expect_fail(&b, HEARTH_ERR_FORMAT, "metadata");
    b.len = 0;
    w_header(&b, 3, 0, UINT64_MAX);
    expect_fail(&b, HEARTH_ERR_FORMAT, NULL);
    /* array element counts */
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "arr", GGUF_ARRAY), w_u32(&b, GGUF_UINT64), w_u64(&b, 1ull << 61);
    w_u64(&b, 1);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'arr'");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "strs", GGUF_ARRAY), w_u32(&b, GGUF_STRING), w_u64(&b, 1ull << 62);
    w_str(&b, "x");
    expect_fail(&b, HEARTH_ERR_FORMAT, "'strs'");
    free(b.p);
}

static void test_strings_past_end(void **state) {
    wbuf b = {0};
    w_header(&b, 3, 0, 1);
    w_u64(&b, 1ull << 40), w_bytes(&b, "key", 3); /* key length past end */
    expect_fail(&b, HEARTH_ERR_FORMAT, NULL);
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "s", GGUF_STRING), w_u64(&b, UINT64_MAX), w_bytes(&b, "abc", 3);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'s'");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "s", GGUF_STRING), w_u64(&b, 4), w_bytes(&b, "abc", 3);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'s'");
    b.len = 0; /* a string inside a string array */
    w_header(&b, 3, 0, 1);
    w_key(&b, "sa", GGUF_ARRAY), w_u32(&b, GGUF_STRING), w_u64(&b, 2);
    w_str(&b, "ok"), w_u64(&b, 100), w_bytes(&b, "short", 5);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'sa'");
    free(b.p);
}

static void test_bad_keys_and_types(void **state) {
    wbuf b = {0};
    w_header(&b, 3, 0, 1);
    w_key(&b, "v", 13), w_u32(&b, 0);
    expect_fail(&b, HEARTH_ERR_FORMAT, "type 13");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "nest", GGUF_ARRAY), w_u32(&b, GGUF_ARRAY), w_u64(&b, 1);
    w_u32(&b, GGUF_UINT8), w_u64(&b, 1), w_le(&b, 0, 1);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "arrays of arrays");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "el", GGUF_ARRAY), w_u32(&b, 99), w_u64(&b, 0);
    expect_fail(&b, HEARTH_ERR_FORMAT, "element type 99");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_u64(&b, 3), w_bytes(&b, "a\0b", 3), w_u32(&b, GGUF_UINT8), w_le(&b, 0, 1);
    expect_fail(&b, HEARTH_ERR_FORMAT, "NUL");
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_u64(&b, 0), w_u32(&b, GGUF_UINT8), w_le(&b, 0, 1);
    w_u64(&b, 0); /* trailing bytes, so the count check passes and the key is read */
    expect_fail(&b, HEARTH_ERR_FORMAT, "empty");
    b.len = 0;
    w_header(&b, 3, 0, 2);
    w_kv_u32(&b, "dup", 1), w_kv_u32(&b, "dup", 2);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'dup' appears more than once");
    free(b.p);
}

static void test_bad_alignment(void **state) {
    static const uint32_t bad[] = {0, 3, 48};
    wbuf b = {0};
    for (int i = 0; i < 3; i++) {
        b.len = 0;
        w_header(&b, 3, 0, 1);
        w_kv_u32(&b, "general.alignment", bad[i]);
        expect_fail(&b, HEARTH_ERR_FORMAT, "power of two");
    }
    b.len = 0;
    w_header(&b, 3, 0, 1);
    w_key(&b, "general.alignment", GGUF_STRING), w_str(&b, "32");
    expect_fail(&b, HEARTH_ERR_FORMAT, "general.alignment");
    free(b.p);
}

/* A one-tensor file with the given tensor-info fields and data_bytes of data. */
static void one_tensor(wbuf *b, uint32_t ndims, const uint64_t *ne, uint32_t type, uint64_t off, size_t data_bytes) {
    b->len = 0;
    w_header(b, 3, 1, 0);
    w_tensor(b, "blk.0.w", ndims, ne, type, off);
    w_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++) w_le(b, 0, 1);
}

static void test_bad_tensors(void **state) {
    wbuf b = {0};
    uint64_t ne4[1] = {4};
    one_tensor(&b, 1, ne4, 0, 0, 16);
    assert_int_equal(parse(&b), HEARTH_OK); /* the baseline is valid */
    gguf_close(&g);
    one_tensor(&b, 1, ne4, 0, 0, 15);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'blk.0.w'");
    one_tensor(&b, 1, ne4, 0, 32, 40);
    expect_fail(&b, HEARTH_ERR_FORMAT, "past the end");
    one_tensor(&b, 1, ne4, 0, UINT64_MAX / 32 * 32, 16); /* aligned, but offset + size overflows */
    expect_fail(&b, HEARTH_ERR_FORMAT, "'blk.0.w'");
    one_tensor(&b, 1, ne4, 0, 16, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "not aligned");
    one_tensor(&b, 1, ne4, 16, 0, 64);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "type 16 (IQ2_XXS)");
    one_tensor(&b, 1, ne4, 1000, 0, 64);
    expect_fail(&b, HEARTH_ERR_UNSUPPORTED, "'blk.0.w': GGML type 1000");
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    one_tensor(&b, 5, ne5, 0, 0, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "5 dimensions");
    uint64_t big[3] = {1ull << 32, 1ull << 32, 1ull << 32};
    one_tensor(&b, 3, big, 0, 0, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "overflow");
    uint64_t bytes_overflow[2] = {1ull << 32, 1ull << 31}; /* 2^63 elements fit, their bytes do not */
    one_tensor(&b, 2, bytes_overflow, 0, 0, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "overflow");
    uint64_t neg[1] = {1ull << 63};
    one_tensor(&b, 1, neg, 0, 0, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "negative");
    uint64_t row[2] = {48, 2}; /* Q4_0 rows must be whole 32-element blocks */
    one_tensor(&b, 2, row, 2, 0, 64);
    expect_fail(&b, HEARTH_ERR_FORMAT, "block size");
    /* duplicate tensor names */
    b.len = 0;
    w_header(&b, 3, 2, 0);
    w_tensor(&b, "same", 1, ne4, 0, 0);
    w_tensor(&b, "same", 1, ne4, 0, 32);
    w_pad(&b, 32);
    for (int i = 0; i < 64; i++) w_le(&b, 0, 1);
    expect_fail(&b, HEARTH_ERR_FORMAT, "'same' appears more than once");
    free(b.p);
}

static void test_open_file(void **state) {
    wbuf b;
    build_valid(&b, 3, 0);
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);
    assert_int_equal(gguf_open(path, &g, &err), HEARTH_OK);
    assert_string_equal(g.path, path);
    assert_string_equal(g.tensors[0].file, path);
    gguf_close(&g);
    /* a truncated file on disk fails and names the path */
    assert_int_equal(truncate(path, (off_t)b.len - 1), 0);
    assert_int_equal(gguf_open(path, &g, &err), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(err.message, path));
    unlink(path);
    assert_int_not_equal(gguf_open("/nonexistent/x.gguf", &g, &err), HEARTH_OK);
    assert_non_null(strstr(err.message, "/nonexistent/x.gguf"));
    gguf_close(&g); /* closing an empty file struct is harmless */
    free(b.p);
}

/* Metadata strings are raw bytes; the JSON view must stay valid UTF-8. */
static void test_json_invalid_utf8(void **state) {
    wbuf b = {0};
    w_header(&b, 3, 0, 2);
    w_key(&b, "bad\xff", GGUF_STRING), w_str(&b, "a\xc3");
    w_key(&b, "nan", GGUF_FLOAT32), w_le(&b, 0x7fc00000u, 4);
    assert_int_equal(parse(&b), HEARTH_OK);
    json_t *j = gguf_metadata_json(&g, UINT64_MAX);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "bad\xef\xbf\xbd")), "a\xef\xbf\xbd");
    assert_true(json_is_null(json_object_get(j, "nan"))); /* JSON has no NaN */
    json_decref(j);
    gguf_close(&g);
    free(b.p);
}

/* Hand-computed blocks: the expected values follow from the format, not from hearth. */
static void test_dequant_known_blocks(void **state) {
    uint8_t q40[18] = {0x00, 0x3c}; /* d = 1.0 */
    for (int i = 0; i < 16; i++) q40[2 + i] = (uint8_t)(i | ((15 - i) << 4));
    float y[32];
    assert_int_equal(ggml_dequantize(DT_Q4_0, q40, sizeof q40, y, 32, &err), HEARTH_OK);
    for (int i = 0; i < 16; i++) {
        assert_true(y[i] == (float)(i - 8));
        assert_true(y[16 + i] == (float)(7 - i));
    }
    uint8_t q41[20] = {0x00, 0x40, 0x00, 0xbc}; /* d = 2.0, m = -1.0 */
    for (int i = 0; i < 16; i++) q41[4 + i] = (uint8_t)(3 | (i << 4));
    assert_int_equal(ggml_dequantize(DT_Q4_1, q41, sizeof q41, y, 32, &err), HEARTH_OK);
    for (int i = 0; i < 16; i++) {
        assert_true(y[i] == 5.0f);
        assert_true(y[16 + i] == 2.0f * (float)i - 1.0f);
    }
    uint8_t q50[22] = {0x00, 0x3c, 0x01, 0x00, 0x00, 0x80}; /* high bits for elements 0 and 31 */
    assert_int_equal(ggml_dequantize(DT_Q5_0, q50, sizeof q50, y, 32, &err), HEARTH_OK);
    assert_true(y[0] == 0.0f && y[1] == -16.0f && y[31] == 0.0f);
    uint16_t h[3] = {0x3c00, 0xc000, 0x0001}; /* 1, -2, smallest subnormal */
    assert_int_equal(ggml_dequantize(DT_F16, h, sizeof h, y, 3, &err), HEARTH_OK);
    assert_true(y[0] == 1.0f && y[1] == -2.0f && y[2] == ldexpf(1.0f, -24));
    uint16_t bf[2] = {0x3f80, 0xc0a0}; /* 1, -5 */
    assert_int_equal(ggml_dequantize(DT_BF16, bf, sizeof bf, y, 2, &err), HEARTH_OK);
    assert_true(y[0] == 1.0f && y[1] == -5.0f);
}

/* Every F16 bit pattern through ggml_dequantize (the F16C path eight at a time where the CPU
 * has it, groups holding a NaN element by element) against the format's definition, computed
 * here with ldexp: (-1)^s 2^(e-15) (1 + m/1024), subnormals 2^-14 m/1024, infinities, and NaNs
 * keeping their payload (m << 13, as numpy's and the gguf package's conversion does). Also an
 * odd count, so the tail after the last group of eight is covered. */
static void test_f16_every_pattern(void **state) {
    (void)state;
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *y = malloc(N * sizeof *y);
    assert_non_null(h);
    assert_non_null(y);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)(i * 40503u); /* odd multiplier: a permutation */
    for (int n = N; n >= N - 5; n -= 5) {
        hearth_error err = {0};
        memset(y, 0, N * sizeof *y);
        assert_int_equal(ggml_dequantize(DT_F16, h, (uint64_t)n * 2, y, (uint64_t)n, &err), HEARTH_OK);
        for (int i = 0; i < n; i++) {
            uint32_t s = h[i] >> 15, e = (h[i] >> 10) & 31, m = h[i] & 1023, want;
            if (e == 31) {
                want = s << 31 | 0x7f800000u | m << 13;
            } else {
                float v = e ? ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15) : ldexpf((float)m / 1024.0f, -14);
                memcpy(&want, &v, 4);
                want |= s << 31;
            }
            uint32_t got;
            memcpy(&got, &y[i], 4);
            if (got != want) fail_msg("f16 0x%04x: got 0x%08x, want 0x%08x", h[i], got, want);
        }
    }
    free(h);
    free(y);
}

static void test_quant_errors_and_roundtrip(void **state) {
    float x[64], y[64];
    uint8_t q[68] = {0};
    for (int i = 0; i < 64; i++) x[i] = sinf((float)i) * 3.0f;
    assert_int_equal(ggml_dequantize(DT_Q8_0, q, sizeof q, y, 33, &err), HEARTH_ERR_INVALID);
    assert_int_equal(ggml_dequantize(DT_Q8_0, q, 67, y, 64, &err), HEARTH_ERR_FORMAT);
    assert_int_equal(ggml_dequantize(DT_I32, q, sizeof q, y, 4, &err), HEARTH_ERR_UNSUPPORTED);
    assert_int_equal(ggml_quantize(DT_Q5_K, x, 256, q, sizeof q, &err), HEARTH_ERR_UNSUPPORTED);
    assert_int_equal(ggml_quantize(DT_Q8_0, x, 64, q, 60, &err), HEARTH_ERR_FORMAT);
    static const tensor_dtype types[] = {DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1};
    /* error bound: one quantization step (Q4_0/Q5_0 clip the value opposite the
     * largest magnitude by a whole step) plus slack for the f16 rounding of the scale */
    static const float step[] = {3.0f / 127, 3.0f / 8, 6.0f / 15, 3.0f / 16, 6.0f / 31};
    for (int t = 0; t < 5; t++) {
        uint64_t nb = tensor_dtype_nbytes(types[t], 64);
        assert_int_equal(ggml_quantize(types[t], x, 64, q, nb, &err), HEARTH_OK);
        assert_int_equal(ggml_dequantize(types[t], q, nb, y, 64, &err), HEARTH_OK);
        for (int i = 0; i < 64; i++) assert_true(fabsf(x[i] - y[i]) <= step[t] * 1.1f);
    }
    float zeros[32] = {0};
    assert_int_equal(ggml_quantize(DT_Q4_0, zeros, 32, q, 18, &err), HEARTH_OK);
    assert_int_equal(ggml_dequantize(DT_Q4_0, q, 18, y, 32, &err), HEARTH_OK);
    for (int i = 0; i < 32; i++) assert_true(y[i] == 0.0f);
}

/* Q4_K and Q6_K: llama.cpp's own sanity bound (tests/test-quantize-fns.cpp: data
 * 0.1 + 2 cos(i) over 4096 values, sqrt(sum of squared errors) / n below 0.002); an all-zero
 * super-block gives zeros; a block with a NaN, an infinity or huge values is written without
 * a crash (its values are unspecified, as in ggml); sizes are checked. The bytes themselves
 * are checked against llama.cpp in tests/parity/test_convert_gguf_kquant.py. */
static void test_kquant_roundtrip(void **state) {
    enum { N = 32 * 128 };
    static float x[N], y[N];
    static uint8_t q[N];
    static const tensor_dtype types[] = {DT_Q4_K, DT_Q6_K};
    for (int i = 0; i < N; i++) x[i] = 0.1f + 2.0f * cosf((float)i);
    for (int t = 0; t < 2; t++) {
        uint64_t nb = tensor_dtype_nbytes(types[t], N);
        assert_int_equal(ggml_quantize(types[t], x, N, q, nb, &err), HEARTH_OK);
        assert_int_equal(ggml_dequantize(types[t], q, nb, y, N, &err), HEARTH_OK);
        double sum = 0;
        for (int i = 0; i < N; i++) sum += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        assert_true(sqrt(sum) / N < 0.002);
        assert_int_equal(ggml_quantize(types[t], x, 255, q, nb, &err), HEARTH_ERR_INVALID);
        assert_int_equal(ggml_quantize(types[t], x, 256, q, tensor_dtype_nbytes(types[t], 256) - 1, &err),
                         HEARTH_ERR_FORMAT);
        float zeros[256] = {0}, odd[256];
        assert_int_equal(ggml_quantize(types[t], zeros, 256, q, nb, &err), HEARTH_OK);
        assert_int_equal(ggml_dequantize(types[t], q, nb, y, 256, &err), HEARTH_OK);
        for (int i = 0; i < 256; i++) assert_true(y[i] == 0.0f);
        for (int i = 0; i < 256; i++) odd[i] = i == 3 ? NAN : i == 9 ? INFINITY : i % 2 ? 3e38f : -1e-30f;
        assert_int_equal(ggml_quantize(types[t], odd, 256, q, nb, &err), HEARTH_OK);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v3),
        cmocka_unit_test(test_valid_v2),
        cmocka_unit_test(test_alignment_64),
        cmocka_unit_test(test_alignment_1),
        cmocka_unit_test(test_truncated_every_prefix),
        cmocka_unit_test(test_bad_magic_and_versions),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_strings_past_end),
        cmocka_unit_test(test_bad_keys_and_types),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_json_invalid_utf8),
        cmocka_unit_test(test_dequant_known_blocks),
        cmocka_unit_test(test_f16_every_pattern),
        cmocka_unit_test(test_quant_errors_and_roundtrip),
        cmocka_unit_test(test_kquant_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
