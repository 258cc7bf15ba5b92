/* test_hub.c: the hub helpers of src/hub/hub_path.c and hub_api.c: repo ids and
 * revisions, the cache folder name, ETag normalisation, symlink targets, URL escaping,
 * include/exclude globs, size strings, and the api/models file-list parser on good and
 * hostile input. Expected values follow huggingface_hub's behaviour (its
 * repo_folder_name, _normalize_etag and relative symlinks), written out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

static void test_repo_arg(void **state) {
    (void)state;
    char repo[HUB_NAME_MAX], rev[HUB_NAME_MAX];
    hearth_error err = {0};
    assert_int_equal(hub_parse_repo_arg("Qwen/Qwen3-0.6B", repo, rev, &err), HEARTH_OK);
    assert_string_equal(repo, "Qwen/Qwen3-0.6B");
    assert_string_equal(rev, "main");
    assert_int_equal(hub_parse_repo_arg("org/name@refs/pr/1", repo, rev, &err), HEARTH_OK);
    assert_string_equal(repo, "org/name");
    assert_string_equal(rev, "refs/pr/1");
    static const char *const bad[] = {"",
                                      "noslash",
                                      "a/b/c",
                                      "../x",
                                      "a/..",
                                      "org/na--me",
                                      "org/.hidden",
                                      "org/x-",
                                      "org/name@../../etc",
                                      "org/name@/abs",
                                      "org/name@",
                                      "org/a b",
                                      "/name"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(hub_parse_repo_arg(bad[i], repo, rev, &err), HEARTH_ERR_INVALID);
    char *f = hub_repo_folder("HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_string_equal(f, "models--HuggingFaceTB--SmolLM2-135M-Instruct");
    free(f);
}

static void test_etag_and_paths(void **state) {
    (void)state;
    char e[160];
    hub_normalize_etag("\"abc123\"", e, sizeof e);
    assert_string_equal(e, "abc123");
    hub_normalize_etag("W/\"abc123\"\r\n", e, sizeof e);
    assert_string_equal(e, "abc123");
    hub_normalize_etag("plain", e, sizeof e);
    assert_string_equal(e, "plain");
    hub_normalize_etag("\"../../etc\"", e, sizeof e); /* never a path */
    assert_string_equal(e, "");
    hub_normalize_etag("\"\"", e, sizeof e);
    assert_string_equal(e, "");
    assert_true(hub_is_hex("0123456789abcdefABCDEF0123456789abcdef01", 40));
    assert_false(hub_is_hex("0123", 40));
    assert_false(hub_is_hex("g123456789abcdef0123456789abcdef01234567", 40));
    assert_true(hub_safe_relpath("model.safetensors"));
    assert_true(hub_safe_relpath("onnx/model.onnx"));
    static const char *const unsafe[] = {"", "/etc/passwd", "a/../b", "..", ".", "a//b", "a/", "a\\b", "a\nb"};
    for (size_t i = 0; i < sizeof unsafe / sizeof unsafe[0]; i++) assert_false(hub_safe_relpath(unsafe[i]));
    char *t = hub_symlink_target("config.json", "abc");
    assert_string_equal(t, "../../blobs/abc");
    free(t);
    t = hub_symlink_target("a/b/c.bin", "abc");
    assert_string_equal(t, "../../../../blobs/abc");
    free(t);
}

static void test_urls(void **state) {
    (void)state;
    char *u = hub_api_url("https://huggingface.co/", "org/name", "revision", "refs/pr/1");
    assert_string_equal(u, "https://huggingface.co/api/models/org/name/revision/refs%2Fpr%2F1");
    free(u);
    u = hub_resolve_url("http://h:1", "org/name", "main", "dir/a b+c.json");
    assert_string_equal(u, "http://h:1/org/name/resolve/main/dir/a%20b%2Bc.json");
    free(u);
}

static void test_globs_and_sizes(void **state) {
    (void)state;
    const char *inc[] = {"*.json", "onnx/"}, *exc[] = {"tokenizer*"};
    assert_true(hub_wanted("config.json", inc, 2, exc, 1));
    assert_true(hub_wanted("sub/config.json", inc, 2, exc, 1)); /* '*' crosses '/', like fnmatch in Python */
    assert_true(hub_wanted("onnx/model.onnx", inc, 2, exc, 1));
    assert_false(hub_wanted("tokenizer.json", inc, 2, exc, 1));
    assert_false(hub_wanted("model.safetensors", inc, 2, exc, 1));
    assert_true(hub_wanted("anything", NULL, 0, NULL, 0));
    assert_int_equal(hearth_parse_size("10GB"), 10000000000LL);
    assert_int_equal(hearth_parse_size("512MiB"), 512LL << 20);
    assert_int_equal(hearth_parse_size("1.5G"), 3LL << 29);
    assert_int_equal(hearth_parse_size("1000"), 1000);
    assert_int_equal(hearth_parse_size("10 kb"), 10000);
    assert_int_equal(hearth_parse_size("GB"), -1);
    assert_int_equal(hearth_parse_size("-1GB"), -1);
    assert_int_equal(hearth_parse_size("5 parsecs"), -1);
}

static void test_file_list(void **state) {
    (void)state;
    hub_file_list l;
    hearth_error err = {0};
    const char *ok = "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\", \"siblings\": ["
                     "{\"rfilename\": \"config.json\", \"size\": 12},"
                     "{\"rfilename\": \"m.safetensors\", \"lfs\": {\"sha256\": "
                     "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", \"size\": 99}},"
                     "{\"rfilename\": \"sub/readme.md\"}]}";
    assert_int_equal(hub_parse_file_list(ok, strlen(ok), &l, &err), HEARTH_OK);
    assert_int_equal(l.count, 3);
    assert_string_equal(l.commit, "0123456789abcdef0123456789abcdef01234567");
    assert_int_equal(l.files[0].size, 12);
    assert_null(l.files[0].lfs_sha256);
    assert_int_equal(l.files[1].size, 99);
    assert_non_null(l.files[1].lfs_sha256);
    assert_int_equal(l.files[2].size, -1);
    hub_file_list_free(&l);
    static const char *const bad[] = {
        "not json",
        "{\"siblings\": []}",
        "{\"sha\": \"short\", \"siblings\": []}",
        "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\"}",
        "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\", \"siblings\": [{\"size\": 1}]}",
        "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\", \"siblings\": [{\"rfilename\": \"../x\"}]}",
        "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\", \"siblings\": [{\"rfilename\": \"/etc/x\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(hub_parse_file_list(bad[i], strlen(bad[i]), &l, &err), HEARTH_OK);
        assert_int_equal(l.count, 0);
        assert_null(l.files);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repo_arg),        cmocka_unit_test(test_etag_and_paths), cmocka_unit_test(test_urls),
        cmocka_unit_test(test_globs_and_sizes), cmocka_unit_test(test_file_list),
    };
    return cmocka_run_group_tests_name("hub", tests, NULL, NULL);
}
