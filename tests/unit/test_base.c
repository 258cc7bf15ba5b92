/* test_base.c: unit tests of src/base: error values, string buffers, half floats,
 * file helpers, where a user's files live (the XDG base directory rules). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "base/half.h"
#include "base/mem.h"
#include "base/sbuf.h"
#include "base/user_dirs.h"

static void test_err_set_and_prefix(void **state) {
    (void)state;
    hearth_error e = {0};
    assert_int_equal(err_set(&e, HEARTH_ERR_FORMAT, "tensor '%s' bad", "x"), HEARTH_ERR_FORMAT);
    assert_int_equal(e.status, HEARTH_ERR_FORMAT);
    err_prefix(&e, "%s", "model.safetensors");
    assert_string_equal(e.message, "model.safetensors: tensor 'x' bad");
    assert_int_equal(err_set(NULL, HEARTH_ERR_IO, "ignored"), HEARTH_ERR_IO); /* NULL err is allowed */
    char longp[2000];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    err_prefix(&e, "%s", longp); /* truncates, never overflows */
    assert_true(strlen(e.message) < sizeof e.message);
}

static void test_sbuf(void **state) {
    (void)state;
    sbuf b;
    sbuf_init(&b);
    for (int i = 0; i < 1000; i++) sbuf_printf(&b, "%d,", i);
    assert_int_equal(b.len, strlen(b.data));
    assert_memory_equal(b.data, "0,1,2,", 6);
    sbuf_reset(&b);
    sbuf_append(&b, "ab\0c", 4);
    assert_int_equal(b.len, 4);
    char *s = sbuf_steal(&b);
    assert_memory_equal(s, "ab\0c", 5);
    assert_null(b.data);
    free(s);
}

/* bf16/f16 conversions against exactly known encodings (IEEE 754 tables). */
static void test_half(void **state) {
    (void)state;
    assert_true(f16_to_f32(0x3c00) == 1.0f);
    assert_true(f16_to_f32(0xc000) == -2.0f);
    assert_true(f16_to_f32(0x7bff) == 65504.0f);
    assert_true(f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(isinf(f16_to_f32(0x7c00)));
    assert_true(isnan(f16_to_f32(0x7e00)));
    assert_int_equal(f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(f32_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
    assert_int_equal(f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* ties to even: 0 */
    assert_int_equal(f32_to_f16(ldexpf(3.0f, -25)), 0x0002);
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(f32_to_bf16(1.00390625f), 0x3f80); /* halfway, ties to even */
    assert_int_equal(f32_to_bf16(1.01171875f), 0x3f82); /* halfway, ties to even (up) */
    /* every finite f16 round-trips */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        assert_int_equal(f32_to_f16(f16_to_f32((uint16_t)h)), h);
    }
}

static void test_files(void **state) {
    (void)state;
    char path[] = "/tmp/hearth_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello", 5), 5);
    close(fd);
    char *buf;
    size_t n;
    assert_int_equal(file_read_all(path, &buf, &n, NULL), HEARTH_OK);
    assert_int_equal(n, 5);
    assert_string_equal(buf, "hello");
    free(buf);
    file_map m;
    assert_int_equal(file_map_open(path, &m, NULL), HEARTH_OK);
    assert_int_equal(m.size, 5);
    assert_memory_equal(m.data, "hello", 5);
    file_map_close(&m);
    unlink(path);
    hearth_error e = {0};
    assert_int_equal(file_map_open(path, &m, &e), HEARTH_ERR_IO);
    assert_non_null(strstr(e.message, path)); /* the error names the file */
    /* atomic writes: the whole new text or the old one, never a temporary left behind */
    char dir[64], deep[128];
    snprintf(dir, sizeof dir, "/tmp/test_base_%ld", (long)getpid());
    snprintf(deep, sizeof deep, "%s/x/y/f.txt", dir);
    assert_int_equal(file_mkdirs_parent(deep), 0);
    assert_int_equal(file_write_atomic(deep, "one", 3), 0);
    assert_int_equal(file_write_atomic(deep, "two!", 4), 0);
    char *got = NULL;
    size_t got_len = 0;
    assert_int_equal(file_read_all(deep, &got, &got_len, NULL), HEARTH_OK);
    assert_int_equal(got_len, 4);
    assert_string_equal(got, "two!");
    free(got);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/no/such/folder/f.txt", dir);
    assert_int_equal(file_write_atomic(missing, "x", 1), -1); /* the folder must exist */
    char cmd[200];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s/x/y | wc -l) -eq 1 && rm -rf %s", dir, dir);
    assert_int_equal(system(cmd), 0); /* only f.txt: no temporary left */
    char *j = path_join("/a/", "b");
    assert_string_equal(j, "/a/b");
    free(j);
}

/* The XDG base directory specification's rules: an override wins, then the XDG
 * variable, then the home folder's default; empty variables count as unset. */
static void expect_path(const char *env, user_base base, const char *rel, const char *want) {
    char *p = user_path(env, base, rel);
    assert_non_null(p);
    assert_string_equal(p, want);
    free(p);
}

static void test_user_dirs(void **state) {
    (void)state;
    setenv("HOME", "/h", 1);
    unsetenv("XDG_CONFIG_HOME");
    setenv("XDG_DATA_HOME", "", 1);
    unsetenv("HEARTH_TEST_OVERRIDE");
    expect_path(NULL, USER_HOME, ".cache/hearth", "/h/.cache/hearth");
    expect_path(NULL, USER_HOME, NULL, "/h");
    expect_path(NULL, USER_CONFIG, "systemd/user", "/h/.config/systemd/user");
    expect_path("HEARTH_TEST_OVERRIDE", USER_DATA, "hearth/wiki", "/h/.local/share/hearth/wiki");
    setenv("XDG_CONFIG_HOME", "/cfg", 1);
    setenv("XDG_DATA_HOME", "/data", 1);
    expect_path(NULL, USER_CONFIG, "systemd/user", "/cfg/systemd/user");
    expect_path(NULL, USER_DATA, "hearth/wiki", "/data/hearth/wiki");
    expect_path(NULL, USER_HOME, "x", "/h/x"); /* no XDG variable for the home folder */
    setenv("HEARTH_TEST_OVERRIDE", "/my/wiki", 1);
    expect_path("HEARTH_TEST_OVERRIDE", USER_DATA, "hearth/wiki", "/my/wiki");
    unsetenv("HOME"); /* the password database's home folder then */
    char *p = user_path(NULL, USER_HOME, NULL);
    assert_non_null(p);
    assert_true(p[0] == '/');
    free(p);
    assert_string_equal(user_setting("given", "HEARTH_TEST_OVERRIDE"), "given");
    assert_string_equal(user_setting("", "HEARTH_TEST_OVERRIDE"), "/my/wiki");
    setenv("HEARTH_TEST_OVERRIDE", "", 1);
    assert_null(user_setting(NULL, "HEARTH_TEST_OVERRIDE"));
}

/* mem_copy_wide: the same bytes as memcpy at every size, split over threads from 64 MiB on
 * (an odd length: the last part shorter, not a whole page), nothing written past the end. */
static void test_mem_copy_wide(void **state) {
    (void)state;
    static const size_t sizes[] = {0, 1, 4097, ((size_t)64 << 20) - 1, ((size_t)80 << 20) + 13};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        uint8_t *src = malloc(n + 1), *dst = malloc(n + 1);
        assert_non_null(src);
        assert_non_null(dst);
        uint32_t x = 0x9e3779b9u ^ (uint32_t)n;
        for (size_t j = 0; j < n; j++) x = x * 1664525u + 1013904223u, src[j] = (uint8_t)(x >> 24);
        memset(dst, 0xA5, n + 1);
        mem_copy_wide(dst, src, n);
        assert_true(n == 0 || memcmp(dst, src, n) == 0);
        assert_int_equal(dst[n], 0xA5);
        free(src), free(dst);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_set_and_prefix),
        cmocka_unit_test(test_sbuf),
        cmocka_unit_test(test_half),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_user_dirs),
        cmocka_unit_test(test_mem_copy_wide),
    };
    return cmocka_run_group_tests_name("base", tests, NULL, NULL);
}
