/* test_convert_trial.c: weight trials (hearth_engine_quantize_weights), what convert
 * --target-bpw measures each candidate with. The oracle is the converted folder: the same
 * options given to hearth_convert write a file whose packed words, scales and biases must
 * be byte for byte the ones the engine swapped in (and config.json's bits / group size
 * theirs), and an engine on that file must give bit-identical logits; restoring must give
 * back the float model's logits bit for bit. Tiny float models (f32: a tied embedding;
 * bf16: 16-bit scales and biases). */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/engine_internal.h"
#include "tiny_model_path.h"
#include "model/model_handle.h"
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOKENS 24

/* layer 0 at 4 bits / group 32, layer 1 at 8 / 64, the embeddings at 3 / 64, the rest float */
static int choose(void *user, const char *module, int *group) {
    (void)user;
    if (!strncmp(module, "model.layers.0.", 15)) return *group = 32, 4;
    if (!strncmp(module, "model.layers.1.", 15)) return 8;
    return strstr(module, "embed_tokens") ? 3 : 0;
}

static hearth_engine *cpu_engine(hearth_model *m) {
    hearth_engine_options eo = {.device = HEARTH_DEVICE_CPU, .context_length = 64, .max_logits_rows = N_TOKENS,
                                .n_threads = 2};
    hearth_engine *e = NULL;
    hearth_error err = {0};
    if (hearth_engine_create(m, &eo, &e, &err)) fail_msg("engine: %s", err.message);
    return e;
}

/* every position's logits of one fixed row of tokens, in a fresh sequence */
static float *row_logits(hearth_engine *e, int vocab) {
    int32_t toks[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++) toks[i] = (int32_t)((i * 37 + 5) % vocab);
    float *logits = malloc((size_t)N_TOKENS * vocab * sizeof *logits);
    hearth_error err = {0};
    int seq;
    assert_int_equal(hearth_seq_open(e, &seq, &err), HEARTH_OK);
    if (hearth_seq_append(e, seq, toks, N_TOKENS, N_TOKENS, logits, &err)) fail_msg("append: %s", err.message);
    hearth_seq_close(e, seq);
    return logits;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void trial_equals_converted(const char *name) {
    hearth_model *m = open_tiny(name);
    hearth_engine *e = cpu_engine(m);
    int vocab = hearth_model_vocab_rows(e);
    size_t bytes = (size_t)N_TOKENS * vocab * sizeof(float);
    float *before = row_logits(e, vocab);

    hearth_convert_options o = {.quantize = 1, .bits = 4, .group_size = 64, .choose_bits = choose, .fit_scales = 1};
    hearth_error err = {0};
    if (hearth_engine_quantize_weights(e, &o, &err)) fail_msg("%s: %s", name, err.message);
    float *trial = row_logits(e, vocab);
    assert_true(memcmp(trial, before, bytes) != 0); /* the swap reached the forward pass */

    char dir[] = "/tmp/hearth-trial-XXXXXX", out[64];
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/q", dir);
    o.out_dir = out;
    if (hearth_convert(hearth_model_path(m), &o, &err)) fail_msg("convert: %s", err.message);
    hearth_model *q = NULL;
    if (hearth_model_open(out, &q, &err)) fail_msg("%s: %s", out, err.message);

    /* every quantized module of the file, against the engine's weight of that name */
    int seen = 0, groups32 = 0, widths[9] = {0};
    for (size_t i = 0; i < model_tensor_count(q); i++) {
        const tensor_info *t = model_tensor_at(q, i);
        int bits, group;
        int64_t cols;
        if (!model_mlx_quantized(q, t, &bits, &group, &cols)) continue;
        const op_weight *w = engine_weight(e, t->name);
        assert_non_null(w);
        char mod[512], sn[560], bn[560];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        snprintf(sn, sizeof sn, "%s.scales", mod);
        snprintf(bn, sizeof bn, "%s.biases", mod);
        const tensor_info *s = model_find_tensor(q, sn), *b = model_find_tensor(q, bn);
        assert_non_null(s);
        assert_non_null(b);
        assert_int_equal(w->dtype, DT_U32);
        assert_int_equal(w->bits, bits);
        assert_int_equal(w->group_size, group);
        assert_int_equal(w->sb_dtype, s->dtype);
        assert_int_equal(w->k, cols);
        assert_int_equal(w->n, t->shape[0]);
        assert_memory_equal(w->data, t->data, t->nbytes);
        assert_memory_equal(w->scales, s->data, s->nbytes);
        assert_memory_equal(w->biases, b->data, b->nbytes);
        seen++, groups32 += group == 32, widths[bits]++;
    }
    /* layer 0 (4/32), layer 1 (8/64) and the embeddings (3/64) came through */
    assert_true(seen >= 15 && groups32 >= 7 && widths[3] >= 1 && widths[8] >= 7);

    hearth_engine *f = cpu_engine(q);
    float *file = row_logits(f, vocab);
    assert_memory_equal(trial, file, bytes); /* the same kernels over the same bytes */

    hearth_engine_restore_weights(e);
    float *after = row_logits(e, vocab);
    assert_memory_equal(after, before, bytes);
    const op_weight *w0 = engine_weight(e, "model.layers.0.mlp.down_proj.weight");
    assert_non_null(w0);
    assert_int_not_equal(w0->dtype, DT_U32);

    /* a quantized model has no float weights to try: refused, nothing swapped */
    assert_int_equal(hearth_engine_quantize_weights(f, &o, &err), HEARTH_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "float"));
    o.bits = 7;
    assert_int_equal(hearth_engine_quantize_weights(e, &o, &err), HEARTH_ERR_INVALID);
    float *again = row_logits(e, vocab);
    assert_memory_equal(again, before, bytes);

    free(before), free(trial), free(file), free(after), free(again);
    hearth_engine_free(f);
    hearth_model_close(q);
    nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    hearth_engine_free(e);
    hearth_model_close(m);
}

static void test_trial_llama_f32(void **state) {
    (void)state;
    trial_equals_converted("llama-f32");
}

static void test_trial_qwen3_bf16(void **state) {
    (void)state;
    trial_equals_converted("qwen3-bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trial_llama_f32),
        cmocka_unit_test(test_trial_qwen3_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
