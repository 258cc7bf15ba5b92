/* test_cuda_kvfile.c: saved KV files (hearth_seq_save / hearth_seq_load) on the CUDA engine
 * (--cuda-exact), on tiny models: a sequence loaded on the GPU continues with the logits of
 * the one that was saved (bit for bit: the same kernels read the same pool bytes) and the
 * greedy tokens of a fresh prefill, for every KV format (float, int8, fp8, f16), layers of
 * different shapes (Gemma 4) and a hybrid's recurrent state (Qwen3.5); a file saved on one
 * device loads on the other (float and int8, the formats both store) with the greedy tokens
 * of that device's own fresh prefill; a GPU-only format (fp8) or another format is refused
 * by name. Where no GPU exists it says loudly that nothing ran (exit 0, like test_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first */
#include <cmocka.h>

#include <stdio.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_kvfile: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "hearth.h"
#include "tiny_model_path.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static hearth_engine *engine(hearth_model *m, int device, int kv_quant) {
    hearth_engine_options o = {.n_threads = 1,
                               .context_length = 256,
                               .max_sequences = 3,
                               .kv_quant = kv_quant,
                               .device = device,
                               .cuda_exact = 1};
    hearth_engine *e = NULL;
    hearth_error err = {0};
    if (hearth_engine_create(m, &o, &e, &err)) fail_msg("engine (device %d): %s", device, err.message);
    return e;
}

#define N_PROMPT 70 /* four full blocks of 16 and a partial one */
#define N_MORE 10   /* prompt tokens after the saved ones: they are prefilled after the load */
#define N_GEN 12
static int32_t ids[N_PROMPT + N_MORE];
static void make_ids(void) {
    for (int i = 0; i < N_PROMPT + N_MORE; i++) ids[i] = 5 + (i * 37) % 200;
}

static char tmp_path[64];

/* Prefills the first N_PROMPT ids into a new sequence and saves it to tmp_path. */
static int prefill_and_save(hearth_engine *e) {
    int seq;
    hearth_error err = {0};
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_append(e, seq, ids, N_PROMPT, 0, NULL, &err), HEARTH_OK);
    if (hearth_seq_save(e, seq, tmp_path, &err)) fail_msg("save: %s", err.message);
    return seq;
}

/* Greedy tokens of the whole prompt on e: a fresh prefill, and a sequence that loads
 * tmp_path first (its N_PROMPT tokens must all load and count as cached). */
static void greedy_fresh_and_loaded(hearth_engine *e, rec *fresh, rec *loaded) {
    hearth_generate_params p = greedy_params(N_GEN, 0);
    hearth_generate_result r;
    hearth_error err = {0};
    memset(fresh, 0, sizeof *fresh);
    memset(loaded, 0, sizeof *loaded);
    assert_int_equal(hearth_generate(e, ids, N_PROMPT + N_MORE, &p, rec_token, fresh, &r, &err), HEARTH_OK);
    int seq;
    size_t n = 0;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    if (hearth_seq_load(e, seq, tmp_path, ids, N_PROMPT + N_MORE, &n, &err)) fail_msg("load: %s", err.message);
    assert_int_equal(n, N_PROMPT);
    assert_int_equal(hearth_generate_seq(e, seq, ids, N_PROMPT + N_MORE, &p, rec_token, loaded, &r, &err), HEARTH_OK);
    assert_int_equal(r.cached_tokens, N_PROMPT);
    hearth_seq_close(e, seq);
    assert_int_equal(fresh->n, N_GEN);
    assert_int_equal(loaded->n, N_GEN);
}

/* On the GPU: save, load into another sequence, the next token's logits equal the saved
 * sequence's exactly; then the loaded prompt's greedy tokens equal a fresh prefill's. */
static void gpu_roundtrip(const char *name, int kv_quant) {
    hearth_model *m = open_tiny(name);
    hearth_engine *e = engine(m, HEARTH_DEVICE_CUDA, kv_quant);
    assert_int_equal(hearth_engine_device(e), HEARTH_DEVICE_CUDA);
    int a = prefill_and_save(e), b;
    hearth_error err = {0};
    size_t n = 0;
    assert_int_equal(hearth_seq_open(e, &b, &err), HEARTH_OK);
    if (hearth_seq_load(e, b, tmp_path, NULL, 0, &n, &err)) fail_msg("%s: load: %s", name, err.message);
    assert_int_equal(n, N_PROMPT);
    int32_t vocab = hearth_model_vocab_rows(e), next = 42;
    float *la = malloc(sizeof(float) * (size_t)vocab), *lb = malloc(sizeof(float) * (size_t)vocab);
    assert_int_equal(hearth_seq_append(e, a, &next, 1, 1, la, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_append(e, b, &next, 1, 1, lb, &err), HEARTH_OK);
    if (memcmp(la, lb, sizeof(float) * (size_t)vocab))
        fail_msg("%s kv %d: logits after the load differ", name, kv_quant);
    hearth_seq_close(e, a);
    hearth_seq_close(e, b);
    free(la);
    free(lb);
    static rec fresh, loaded; /* static: a rec is large for the stack */
    greedy_fresh_and_loaded(e, &fresh, &loaded);
    assert_memory_equal(fresh.ids, loaded.ids, sizeof(int32_t) * N_GEN);
    hearth_engine_free(e);
    hearth_model_close(m);
    unlink(tmp_path);
}

/* Every KV format (llama-f32, and a quantized model), Gemma 4's layers of different shapes
 * (the file pads them to the largest), Qwen3.5's recurrent state (off and back onto the
 * device with the KV). */
static void test_gpu_roundtrip(void **st) {
    (void)st;
    static const struct {
        const char *model;
        int kv_quant;
    } cases[] = {
        {"llama-f32", HEARTH_KV_FLOAT},   {"llama-f32", HEARTH_KV_INT8},    {"llama-f32", HEARTH_KV_FP8},
        {"llama-f32", HEARTH_KV_F16},     {"qwen3-q4g64", HEARTH_KV_FLOAT}, {"gemma4-f32", HEARTH_KV_FLOAT},
        {"gemma4-q4g64", HEARTH_KV_INT8}, {"qwen3_5-f32", HEARTH_KV_FLOAT}, {"qwen3_5_moe-f32", HEARTH_KV_FLOAT}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) gpu_roundtrip(cases[i].model, cases[i].kv_quant);
}

/* A file saved on device `from` loads on device `to`: the greedy tokens there equal that
 * engine's own fresh prefill (the --cuda-exact tier and the CPU agree on tiny models token
 * for token: the parity phase's claim, test_cuda_device.py). */
static void cross(const char *name, int kv_quant, int from, int to) {
    hearth_model *m = open_tiny(name);
    hearth_engine *src = engine(m, from, kv_quant);
    hearth_seq_close(src, prefill_and_save(src));
    hearth_engine_free(src);
    hearth_engine *dst = engine(m, to, kv_quant);
    static rec fresh, loaded;
    greedy_fresh_and_loaded(dst, &fresh, &loaded);
    if (memcmp(fresh.ids, loaded.ids, sizeof(int32_t) * N_GEN))
        fail_msg("%s kv %d: saved on device %d, loaded on %d: tokens differ from a fresh prefill", name, kv_quant, from,
                 to);
    hearth_engine_free(dst);
    hearth_model_close(m);
    unlink(tmp_path);
}
static void test_cross_device(void **st) {
    (void)st;
    static const char *models[] = {"llama-f32", "gemma4-f32", "qwen3_5-f32"};
    for (int i = 0; i < 3; i++) {
        cross(models[i], HEARTH_KV_FLOAT, HEARTH_DEVICE_CUDA, HEARTH_DEVICE_CPU);
        cross(models[i], HEARTH_KV_FLOAT, HEARTH_DEVICE_CPU, HEARTH_DEVICE_CUDA);
    }
    cross("llama-f32", HEARTH_KV_INT8, HEARTH_DEVICE_CUDA, HEARTH_DEVICE_CPU);
    cross("llama-f32", HEARTH_KV_INT8, HEARTH_DEVICE_CPU, HEARTH_DEVICE_CUDA);
}

/* A GPU fp8 file on the CPU engine, and a float file on an int8 GPU engine: refused, naming
 * both formats, the sequence left empty. */
static void refused(hearth_model *m, int device, int kv_quant, const char *saved, const char *engine_uses) {
    hearth_engine *e = engine(m, device, kv_quant);
    hearth_error err = {0};
    int seq;
    size_t n = 99;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    assert_int_equal(hearth_seq_load(e, seq, tmp_path, NULL, 0, &n, &err), HEARTH_ERR_INVALID);
    if (!strstr(err.message, saved) || !strstr(err.message, engine_uses) || !strstr(err.message, tmp_path))
        fail_msg("unclear refusal: %s", err.message);
    assert_int_equal(n, 0);
    assert_int_equal(hearth_seq_length(e, seq), 0);
    hearth_engine_free(e);
}
static void test_format_mismatch_refused(void **st) {
    (void)st;
    hearth_model *m = open_tiny("llama-f32");
    hearth_engine *e = engine(m, HEARTH_DEVICE_CUDA, HEARTH_KV_FP8);
    hearth_seq_close(e, prefill_and_save(e));
    hearth_engine_free(e);
    refused(m, HEARTH_DEVICE_CPU, HEARTH_KV_FLOAT, "fp8", "none");
    e = engine(m, HEARTH_DEVICE_CUDA, HEARTH_KV_FLOAT);
    hearth_seq_close(e, prefill_and_save(e));
    hearth_engine_free(e);
    refused(m, HEARTH_DEVICE_CUDA, HEARTH_KV_INT8, "none", "int8");
    hearth_model_close(m);
    unlink(tmp_path);
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("test_cuda_kvfile: skipped: no CUDA device; the saved-KV-file tests on the GPU did NOT run\n");
        return 0;
    }
    snprintf(tmp_path, sizeof tmp_path, "/tmp/test_cuda_kvfile_%ld.hkv", (long)getpid());
    make_ids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_roundtrip),
        cmocka_unit_test(test_cross_device),
        cmocka_unit_test(test_format_mismatch_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
