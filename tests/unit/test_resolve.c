/* test_resolve.c: model name resolution over a fake HF cache, $HEARTH_MODELS folders
 * and hearth's cache: paths, repo ids with revisions, short names, ambiguity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/resolve.h"

static char root[256];

static void put(const char *rel, const char *content) {
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/hearth_resolve_%d", (int)getpid());
    /* HF layout: refs/main names the snapshot; an older snapshot exists too. */
    put("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/refs/main", "abc123\n");
    put("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/abc123/config.json", "{}");
    put("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/old999/config.json", "{}");
    put("hub/models--Qwen--Qwen3-0.6B/snapshots/fff/config.json", "{}");
    put("hub/models--Qwen--Qwen3-0.6B/refs/main", "fff");
    put("hub/models--unsloth--gemma-GGUF/snapshots/r1/gemma-3-270m-Q4_K_M.gguf", "GGUF");
    put("extra/llama-tiny/config.json", "{}");
    put("extra/qwen3-tiny/config.json", "{}");
    put("extra/notamodel/readme.txt", "x");
    put("cache/models/smollm2-135m-instruct-q4_1.gguf", "GGUF");
    char buf[512];
    snprintf(buf, sizeof buf, "%s/hub", root);
    setenv("HF_HUB_CACHE", buf, 1);
    snprintf(buf, sizeof buf, "%s/extra", root);
    setenv("HEARTH_MODELS", buf, 1);
    snprintf(buf, sizeof buf, "%s/cache", root);
    setenv("HEARTH_CACHE", buf, 1);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd);
}

static void test_list(void **state) {
    (void)state;
    model_list l;
    resolve_list_models(&l);
    assert_int_equal(l.count, 6);
    int seen_gguf = 0;
    for (size_t i = 0; i < l.count; i++) {
        if (!strcmp(l.items[i].name, "unsloth/gemma-GGUF")) {
            seen_gguf = 1;
            assert_int_equal(l.items[i].format, MODEL_FORMAT_GGUF);
            assert_non_null(strstr(l.items[i].path, "gemma-3-270m-Q4_K_M.gguf"));
        }
        assert_null(strstr(l.items[i].name, "notamodel"));
    }
    assert_true(seen_gguf);
    resolve_list_free(&l);
}

static void test_repo_id_and_revision(void **state) {
    (void)state;
    model_entry e;
    assert_int_equal(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", &e, NULL), HEARTH_OK);
    assert_non_null(strstr(e.path, "snapshots/abc123")); /* refs/main wins over other snapshots */
    resolve_entry_free(&e);
    assert_int_equal(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct@old999", &e, NULL), HEARTH_OK);
    assert_non_null(strstr(e.path, "snapshots/old999"));
    resolve_entry_free(&e);
}

static void test_short_names(void **state) {
    (void)state;
    model_entry e;
    hearth_error err = {0};
    assert_int_equal(resolve_model("qwen3-0.6", &e, &err), HEARTH_OK); /* case-insensitive substring */
    assert_string_equal(e.name, "Qwen/Qwen3-0.6B");
    resolve_entry_free(&e);
    assert_int_equal(resolve_model("llama-tiny", &e, &err), HEARTH_OK);
    assert_int_equal(e.format, MODEL_FORMAT_DIR);
    resolve_entry_free(&e);
    assert_int_equal(resolve_model("q4_1", &e, &err), HEARTH_OK);
    assert_int_equal(e.format, MODEL_FORMAT_GGUF);
    resolve_entry_free(&e);
    /* "smollm2" matches the HF repo and the cached GGUF: ambiguous, both listed */
    assert_int_equal(resolve_model("smollm2", &e, &err), HEARTH_ERR_AMBIGUOUS);
    assert_non_null(strstr(err.message, "HuggingFaceTB/SmolLM2-135M-Instruct"));
    assert_non_null(strstr(err.message, "smollm2-135m-instruct-q4_1"));
    assert_int_equal(resolve_model("mistral", &e, &err), HEARTH_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "qwen3-tiny")); /* unknown names list what exists */
}

static void test_paths(void **state) {
    (void)state;
    model_entry e;
    hearth_error err = {0};
    char p[512];
    snprintf(p, sizeof p, "%s/extra/llama-tiny", root);
    assert_int_equal(resolve_model(p, &e, &err), HEARTH_OK);
    assert_string_equal(e.path, p);
    resolve_entry_free(&e);
    snprintf(p, sizeof p, "%s/extra/notamodel", root);
    assert_int_equal(resolve_model(p, &e, &err), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(err.message, "notamodel"));
    assert_int_equal(resolve_model("", &e, &err), HEARTH_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_repo_id_and_revision),
        cmocka_unit_test(test_short_names),
        cmocka_unit_test(test_paths),
    };
    return cmocka_run_group_tests_name("resolve", tests, setup, teardown);
}
