/* test_safetensors.c: unit tests of src/io/safetensors.c: images built in memory for
 * every dtype and every malformed case (status + a message naming file and tensor),
 * sharded and unsharded folders in a temp dir, name lookup, and the writer
 * (safetensors_write.c) read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "io/safetensors_write.h"

/* A safetensors image: LE u64 header length, header, then data_len bytes 0,1,2,... */
static uint8_t *make_image(const char *header, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (uint8_t)i;
    return b;
}

static const tensor_info *find_in_file(const st_file *f, const char *name) {
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static void test_every_dtype(void **state) {
    (void)state;
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"f64\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
        "\"f32\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]},"
        "\"f16\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[32,38]},"
        "\"bf16\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[38,40]},"
        "\"i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[40,48]},"
        "\"i32\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[48,52]},"
        "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[52,56]},"
        "\"i8\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[56,60]},"
        "\"u64\":{\"dtype\":\"U64\",\"shape\":[],\"data_offsets\":[60,68]},"
        "\"u32\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[68,72]},"
        "\"u16\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[72,74]},"
        "\"u8\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[74,76]},"
        "\"bool\":{\"dtype\":\"BOOL\",\"shape\":[2,1],\"data_offsets\":[76,78]},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[78,78]},"
        "\"overlap\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    size_t len;
    uint8_t *img = make_image(hdr, 78, &len);
    st_file f;
    hearth_error e = {0};
    assert_int_equal(st_parse(img, len, "mem.safetensors", &f, &e), HEARTH_OK);
    assert_int_equal(f.n_tensors, 15);
    const size_t data0 = 8 + strlen(hdr);
    static const struct { const char *name; tensor_dtype dt; int ndim; uint64_t off, nbytes; } want[] = {
        {"f64", DT_F64, 1, 0, 16},   {"f32", DT_F32, 2, 16, 16}, {"f16", DT_F16, 1, 32, 6},
        {"bf16", DT_BF16, 2, 38, 2}, {"i64", DT_I64, 1, 40, 8},  {"i32", DT_I32, 1, 48, 4},
        {"i16", DT_I16, 1, 52, 4},   {"i8", DT_I8, 1, 56, 4},    {"u64", DT_U64, 0, 60, 8},
        {"u32", DT_U32, 1, 68, 4},   {"u16", DT_U16, 1, 72, 2},  {"u8", DT_U8, 1, 74, 2},
        {"bool", DT_BOOL, 2, 76, 2}, {"empty", DT_F32, 2, 78, 0}, {"overlap", DT_U8, 1, 0, 4},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const tensor_info *t = find_in_file(&f, want[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, want[i].dt);
        assert_int_equal(t->ndim, want[i].ndim);
        assert_int_equal(t->nbytes, want[i].nbytes);
        assert_ptr_equal(t->data, img + data0 + want[i].off);
        assert_string_equal(t->file, "mem.safetensors");
    }
    assert_int_equal(find_in_file(&f, "f32")->shape[0], 2);
    assert_int_equal(find_in_file(&f, "empty")->shape[1], 5);
    assert_non_null(f.metadata);
    assert_string_equal(json_string_value(json_object_get(f.metadata, "format")), "pt");
    st_close(&f);
    free(img);
}

static void test_metadata_null_and_padding(void **state) {
    (void)state;
    /* mlx writes "__metadata__": null; the spec allows trailing spaces in the header */
    const char *hdr = "{\"__metadata__\":null,\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}    ";
    size_t len;
    uint8_t *img = make_image(hdr, 4, &len);
    st_file f;
    hearth_error e = {0};
    assert_int_equal(st_parse(img, len, "m.safetensors", &f, &e), HEARTH_OK);
    assert_int_equal(f.n_tensors, 1);
    assert_null(f.metadata);
    st_close(&f);
    free(img);
}

/* Parses hdr + data_len bytes and checks status and that the message names the file
 * and (when given) the tensor and another expected fragment. */
static void expect_bad(const char *hdr, size_t data_len, hearth_status want, const char *tensor, const char *frag) {
    size_t len;
    uint8_t *img = make_image(hdr, data_len, &len);
    st_file f;
    hearth_error e = {0};
    hearth_status st = st_parse(img, len, "bad.safetensors", &f, &e);
    if (st != want) fail_msg("header %s: status %d, want %d (%s)", hdr, st, want, e.message);
    assert_int_equal(e.status, want);
    assert_non_null(strstr(e.message, "bad.safetensors"));
    if (tensor) {
        char q[128];
        snprintf(q, sizeof q, "'%s'", tensor);
        if (!strstr(e.message, q)) fail_msg("message '%s' does not name tensor %s", e.message, q);
    }
    if (frag && !strstr(e.message, frag)) fail_msg("message '%s' lacks '%s'", e.message, frag);
    assert_null(f.tensors); /* a failed parse leaves nothing to free */
    free(img);
}

static void test_bad_tensors(void **state) {
    (void)state;
    expect_bad("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, HEARTH_ERR_UNSUPPORTED, "w",
               "F8_E4M3");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, HEARTH_ERR_FORMAT, "w",
               "past the end");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, HEARTH_ERR_FORMAT, "w", NULL);
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, HEARTH_ERR_FORMAT, "w", "need 12");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, HEARTH_ERR_FORMAT, "w", "shape");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, HEARTH_ERR_FORMAT, "w", NULL);
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
               HEARTH_ERR_FORMAT, "w", "overflow");
    expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4,
               HEARTH_ERR_FORMAT, "w", "overflow");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
               HEARTH_ERR_UNSUPPORTED, "w", "dimensions");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, HEARTH_ERR_FORMAT, "w", NULL);
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, HEARTH_ERR_FORMAT, "w", NULL);
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, HEARTH_ERR_FORMAT, "w", "dtype");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, HEARTH_ERR_FORMAT, "w", "shape");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, HEARTH_ERR_FORMAT, "w", "data_offsets");
    expect_bad("{\"w\":[1,2]}", 0, HEARTH_ERR_FORMAT, "w", NULL);
    expect_bad("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, HEARTH_ERR_FORMAT, "w", NULL);
}

static void test_bad_headers(void **state) {
    (void)state;
    expect_bad("{\"a\":1", 0, HEARTH_ERR_FORMAT, NULL, "JSON");
    expect_bad("[1,2]", 0, HEARTH_ERR_FORMAT, NULL, "object");
    expect_bad("{\"__metadata__\":[1]}", 0, HEARTH_ERR_FORMAT, NULL, "__metadata__");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
               1, HEARTH_ERR_FORMAT, NULL, "JSON");

    st_file f;
    hearth_error e = {0};
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    assert_int_equal(st_parse(tiny, sizeof tiny, "short.safetensors", &f, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "short.safetensors"));
    assert_int_equal(st_parse(NULL, 0, "null.safetensors", &f, &e), HEARTH_ERR_FORMAT);

    /* header length past the end, and one so large that 8 + n would wrap */
    uint8_t img[16] = {0};
    img[0] = 9;
    assert_int_equal(st_parse(img, sizeof img, "len.safetensors", &f, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "len.safetensors"));
    assert_non_null(strstr(e.message, "past the end"));
    memset(img, 0xff, 8);
    assert_int_equal(st_parse(img, sizeof img, "wrap.safetensors", &f, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "wrap.safetensors"));
}

/* ---- folders ----------------------------------------------------------------- */

static char tmpdir[256];

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_image(const char *dir, const char *name, const char *hdr, size_t data_len) {
    size_t len;
    uint8_t *img = make_image(hdr, data_len, &len);
    write_file(dir, name, img, len);
    free(img);
}

static void make_dir(const char *sub, char *out, size_t n) {
    snprintf(out, n, "%s/%s", tmpdir, sub);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", out);
    assert_int_equal(system(cmd), 0);
}

static int setup_tmp(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_test_st_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_sharded_set(void **state) {
    (void)state;
    char d[400];
    make_dir("sharded", d, sizeof d);
    write_image(d, "model-00001-of-00002.safetensors",
                "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                3);
    write_image(d, "model-00002-of-00002.safetensors", "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                2);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                      "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}";
    write_file(d, "model.safetensors.index.json", idx, strlen(idx));
    st_set s;
    hearth_error e = {0};
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_OK);
    assert_int_equal(s.n_files, 2);
    assert_int_equal(s.n_tensors, 3);
    const tensor_info *c = st_set_find(&s, "c");
    assert_non_null(c);
    assert_int_equal(c->data[0], 1);
    assert_non_null(strstr(c->file, "model-00002-of-00002.safetensors"));
    assert_int_equal(st_set_find(&s, "a")->shape[0], 2);
    assert_null(st_set_find(&s, "d"));
    st_set_close(&s);

    /* the same name in two shards */
    write_image(d, "model-00002-of-00002.safetensors",
                "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                1);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "'a'"));
    assert_non_null(strstr(e.message, "model-00001-of-00002.safetensors"));
    assert_non_null(strstr(e.message, "model-00002-of-00002.safetensors"));
    assert_int_equal(s.n_files, 0);

    /* index names a tensor its shard does not have */
    write_image(d, "model-00002-of-00002.safetensors", "{\"z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                1);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "'c'"));

    /* a broken shard: the error names it */
    write_image(d, "model-00002-of-00002.safetensors", "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9]}}",
                1);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "model-00002-of-00002.safetensors"));
    assert_non_null(strstr(e.message, "'c'"));

    /* a shard path that leaves the folder, and a missing shard */
    const char *evil = "{\"weight_map\":{\"a\":\"../x.safetensors\"}}";
    write_file(d, "model.safetensors.index.json", evil, strlen(evil));
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "'a'"));
    const char *missing = "{\"weight_map\":{\"a\":\"nope.safetensors\"}}";
    write_file(d, "model.safetensors.index.json", missing, strlen(missing));
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_IO);
    assert_non_null(strstr(e.message, "nope.safetensors"));
    write_file(d, "model.safetensors.index.json", "{\"weight_map\":", 14);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "model.safetensors.index.json"));
}

static void test_unsharded_sets(void **state) {
    (void)state;
    char d[400];
    st_set s;
    hearth_error e = {0};
    /* no index: every *.safetensors in the folder */
    make_dir("glob", d, sizeof d);
    write_image(d, "x.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    write_image(d, "y.safetensors", "{\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    write_file(d, "notes.txt", "hi", 2);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_OK);
    assert_int_equal(s.n_files, 2);
    assert_non_null(st_set_find(&s, "x"));
    assert_non_null(st_set_find(&s, "y"));
    st_set_close(&s);
    /* model.safetensors wins over other files */
    write_image(d, "model.safetensors", "{\"m\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_OK);
    assert_int_equal(s.n_files, 1);
    assert_non_null(st_set_find(&s, "m"));
    assert_null(st_set_find(&s, "x"));
    st_set_close(&s);
    /* nothing there */
    make_dir("empty", d, sizeof d);
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_NOT_FOUND);
    assert_non_null(strstr(e.message, "empty"));
    make_dir("does-not-exist-parent", d, sizeof d);
    strcat(d, "/nope");
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_ERR_IO);
    /* st_open on a missing and an empty file */
    st_file f;
    assert_int_equal(st_open(d, &f, &e), HEARTH_ERR_IO);
    make_dir("zero", d, sizeof d);
    write_file(d, "z.safetensors", "", 0);
    strcat(d, "/z.safetensors");
    assert_int_equal(st_open(d, &f, &e), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(e.message, "z.safetensors"));
}

static void test_lookup_many(void **state) {
    (void)state;
    /* 300 tensors named in an order unrelated to sort order */
    char *hdr = malloc(300 * 80 + 16);
    assert_non_null(hdr);
    size_t k = (size_t)sprintf(hdr, "{");
    for (int i = 0; i < 300; i++)
        k += (size_t)sprintf(hdr + k, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", (i * 7919) % 300, i, i + 1);
    sprintf(hdr + k, "}");
    char d[400];
    make_dir("many", d, sizeof d);
    write_image(d, "model.safetensors", hdr, 300);
    free(hdr);
    st_set s;
    hearth_error e = {0};
    assert_int_equal(st_set_open(d, &s, &e), HEARTH_OK);
    assert_int_equal(s.n_tensors, 300);
    for (int i = 0; i < 300; i++) {
        char n[16];
        snprintf(n, sizeof n, "t%d", (i * 7919) % 300);
        const tensor_info *t = st_set_find(&s, n);
        assert_non_null(t);
        assert_string_equal(t->name, n);
        assert_int_equal(t->data[0], (uint8_t)i);
    }
    assert_null(st_set_find(&s, "t300"));
    assert_null(st_set_find(&s, ""));
    assert_null(st_set_find(&s, "t"));
    st_set_close(&s);
}

/* The writer against the reader: a header written by st_write_header followed by the data
 * parses back with every name, dtype, shape and byte, the data 8-byte aligned. */
static void test_writer_round_trip(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/written.safetensors", tmpdir);
    st_out_tensor t[3] = {{.name = "a.weight", .dtype = DT_U32, .ndim = 2, .shape = {2, 3}},
                          {.name = "a.scales", .dtype = DT_BF16, .ndim = 2, .shape = {2, 1}},
                          {.name = "norm", .dtype = DT_F32, .ndim = 1, .shape = {5}}};
    uint8_t data[24 + 4 + 20];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 13 + 1);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t total = 0;
    hearth_error e = {0};
    assert_int_equal(st_write_header(f, path, t, 3, &total, &e), HEARTH_OK);
    assert_int_equal(total, sizeof data);
    assert_int_equal(fwrite(data, 1, sizeof data, f), sizeof data);
    fclose(f);
    st_file st;
    assert_int_equal(st_open(path, &st, &e), HEARTH_OK);
    assert_int_equal(st.n_tensors, 3);
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        const tensor_info *got = NULL;
        for (size_t j = 0; j < st.n_tensors; j++)
            if (!strcmp(st.tensors[j].name, t[i].name)) got = &st.tensors[j];
        assert_non_null(got);
        assert_int_equal(got->dtype, t[i].dtype);
        assert_int_equal(got->ndim, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++) assert_int_equal(got->shape[d], t[i].shape[d]);
        assert_int_equal(got->nbytes, st_out_nbytes(&t[i]));
        assert_memory_equal(got->data, data + off, got->nbytes);
        off += got->nbytes;
    }
    assert_int_equal(((uintptr_t)st.tensors[0].data - (uintptr_t)st.map.data) % 8, 0);
    assert_non_null(json_object_get(st.metadata, "format"));
    st_close(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_dtype),   cmocka_unit_test(test_metadata_null_and_padding),
        cmocka_unit_test(test_bad_tensors),   cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_sharded_set),   cmocka_unit_test(test_unsharded_sets),
        cmocka_unit_test(test_lookup_many),   cmocka_unit_test(test_writer_round_trip),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
