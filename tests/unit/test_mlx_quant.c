/* test_mlx_quant.c: unit tests of src/io/mlx_quant.c: the quantization section of
 * config.json (mlx-lm's conventions), per-layer lookup, shape inference, and the
 * dequantizer's packing and error paths, the quantizers (mx.quantize's rule and the
 * error-minimising fit) against the dequantizer.
 * Bit-exactness against mx.dequantize is checked by tests/parity/test_mlx_dequant.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "io/mlx_quant.h"

static json_t *parse(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) fail_msg("bad test JSON: %s", je.text);
    return j;
}

static hearth_status parse_config(const char *text, mlxq_config *c, hearth_error *e) {
    json_t *j = parse(text);
    hearth_status st = mlxq_config_parse(j, "cfg.json", c, e);
    json_decref(j);
    return st;
}

static void test_config_quantization(void **state) {
    (void)state;
    mlxq_config c;
    hearth_error e = {0};
    /* what mlx_lm.convert writes: both keys, overrides as module paths */
    const char *cfg = "{\"model_type\":\"llama\",\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
                      "\"model.layers.0.mlp.down_proj\":{\"group_size\":32,\"bits\":8},"
                      "\"lm_head\":false,\"model.embed_tokens\":true,"
                      "\"model.layers.1.self_attn.v_proj\":{\"bits\":6}},"
                      "\"quantization_config\":{\"group_size\":128,\"bits\":2}}";
    assert_int_equal(parse_config(cfg, &c, &e), HEARTH_OK);
    assert_true(c.present);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.group_size, 64);
    assert_string_equal(c.mode, "affine");
    assert_int_equal(c.n_overrides, 4);
    int b = 0, g = 0;
    assert_int_equal(mlxq_lookup(&c, "model.layers.0.mlp.down_proj", &b, &g), 1);
    assert_int_equal(b, 8);
    assert_int_equal(g, 32);
    assert_int_equal(mlxq_lookup(&c, "lm_head", &b, &g), 0);
    assert_int_equal(mlxq_lookup(&c, "model.embed_tokens", &b, &g), 1);
    assert_int_equal(b, 4);
    assert_int_equal(g, 64);
    /* a layer dict without group_size gets to_quantized's default (64), as in mlx */
    assert_int_equal(mlxq_lookup(&c, "model.layers.1.self_attn.v_proj", &b, &g), 1);
    assert_int_equal(b, 6);
    assert_int_equal(g, 64);
    assert_int_equal(mlxq_lookup(&c, "model.layers.3.mlp.up_proj", &b, &g), 1);
    assert_int_equal(b, 4);
    assert_int_equal(g, 64);
    /* exact path match only: a prefix is not an override */
    assert_int_equal(mlxq_lookup(&c, "model.layers.0.mlp", &b, &g), 1);
    assert_int_equal(mlxq_lookup(&c, "model.layers.0.mlp.down_proj.x", &b, &g), 1);
    assert_int_equal(b, 4);
    mlxq_config_free(&c);
    assert_null(c.overrides);
}

static void test_config_quantization_config_only(void **state) {
    (void)state;
    mlxq_config c;
    hearth_error e = {0};
    assert_int_equal(parse_config("{\"quantization_config\":{\"group_size\":32,\"bits\":3,"
                                  "\"model.layers.0.mlp.gate_proj\":false}}",
                                  &c, &e),
                     HEARTH_OK);
    assert_true(c.present);
    assert_int_equal(c.bits, 3);
    assert_int_equal(c.group_size, 32);
    int b = 0, g = 0;
    assert_int_equal(mlxq_lookup(&c, "model.layers.0.mlp.gate_proj", &b, &g), 0);
    assert_int_equal(mlxq_lookup(&c, "model.layers.0.mlp.up_proj", &b, &g), 1);
    assert_int_equal(b, 3);
    mlxq_config_free(&c);

    assert_int_equal(parse_config("{\"text_config\":{\"quantization_config\":{\"group_size\":128,\"bits\":5}}}", &c, &e),
                     HEARTH_OK);
    assert_true(c.present);
    assert_int_equal(c.bits, 5);
    assert_int_equal(c.group_size, 128);
    mlxq_config_free(&c);

    assert_int_equal(parse_config("{\"model_type\":\"llama\",\"quantization\":null}", &c, &e), HEARTH_OK);
    assert_false(c.present);
    assert_int_equal(mlxq_lookup(&c, "lm_head", &b, &g), 0);
    mlxq_config_free(&c);
}

static void expect_config_error(const char *cfg, hearth_status want, const char *frag) {
    mlxq_config c;
    hearth_error e = {0};
    hearth_status st = parse_config(cfg, &c, &e);
    if (st != want) fail_msg("%s: status %d want %d (%s)", cfg, st, want, e.message);
    assert_non_null(strstr(e.message, "cfg.json"));
    if (frag && !strstr(e.message, frag)) fail_msg("message '%s' lacks '%s'", e.message, frag);
    assert_false(c.present);
    assert_null(c.overrides);
}

static void test_config_errors(void **state) {
    (void)state;
    expect_config_error("{\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"mxfp4\"}}", HEARTH_ERR_UNSUPPORTED,
                        "mxfp4");
    expect_config_error("{\"quantization\":{\"group_size\":64,\"bits\":7}}", HEARTH_ERR_UNSUPPORTED, "7-bit");
    expect_config_error("{\"quantization\":{\"group_size\":16,\"bits\":4}}", HEARTH_ERR_UNSUPPORTED, "16");
    expect_config_error("{\"quantization\":{\"bits\":4}}", HEARTH_ERR_FORMAT, "group_size");
    expect_config_error("{\"quantization\":{\"group_size\":\"64\",\"bits\":4}}", HEARTH_ERR_FORMAT, NULL);
    expect_config_error("{\"quantization\":[64,4]}", HEARTH_ERR_FORMAT, "quantization");
    expect_config_error("{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128}}",
                        HEARTH_ERR_UNSUPPORTED, "awq");
    expect_config_error("{\"quantization\":{\"group_size\":64,\"bits\":4,\"model.layers.2.mlp.up_proj\":{\"bits\":9}}}",
                        HEARTH_ERR_UNSUPPORTED, "model.layers.2.mlp.up_proj");
    expect_config_error("{\"quantization\":{\"group_size\":64,\"bits\":4,"
                        "\"lm_head\":{\"bits\":4,\"group_size\":32,\"mode\":\"nvfp4\"}}}",
                        HEARTH_ERR_UNSUPPORTED, "lm_head");
    mlxq_config c;
    hearth_error e = {0};
    json_t *arr = json_array();
    assert_int_equal(mlxq_config_parse(arr, "cfg.json", &c, &e), HEARTH_ERR_INVALID);
    json_decref(arr);
}

/* ---- dequantization --------------------------------------------------------- */

/* Packs q values little-endian-bit-stream style: element j at bit j*bits. */
static void pack(const uint8_t *q, int n, int bits, uint32_t *words) {
    memset(words, 0, (size_t)n * (size_t)bits / 8);
    for (int j = 0; j < n; j++)
        for (int k = 0; k < bits; k++)
            if (q[j] >> k & 1) words[(j * bits + k) / 32] |= 1u << ((j * bits + k) % 32);
}

static tensor_info mk(const char *name, tensor_dtype dt, int ndim, const int64_t *shape, const void *data) {
    tensor_info t = {0};
    t.name = (char *)name;
    t.file = "q.safetensors";
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    t.data = data;
    t.nbytes = tensor_dtype_nbytes(dt, tensor_elems(&t));
    return t;
}

static void test_dequant_known_values(void **state) {
    (void)state;
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    for (size_t bi = 0; bi < sizeof bitss / sizeof bitss[0]; bi++) {
        int bits = bitss[bi];
        enum { ROWS = 3, COLS = 64, G = 32 };
        uint8_t q[ROWS * COLS];
        uint32_t words[ROWS * COLS * 8 / 32];
        for (int i = 0; i < ROWS * COLS; i++) q[i] = (uint8_t)((i * 37 + 11) % (1 << bits));
        int wpr = COLS * bits / 32;
        for (int r = 0; r < ROWS; r++) pack(q + r * COLS, COLS, bits, words + r * wpr);
        float scales[ROWS * 2] = {0.5f, -0.25f, 2.0f, 1.0f, 0.125f, 3.0f};
        float biases[ROWS * 2] = {-1.0f, 4.0f, 0.0f, -8.0f, 0.5f, 1.0f};
        int64_t ws[] = {ROWS, wpr}, ss[] = {ROWS, 2};
        tensor_info w = mk("l.weight", DT_U32, 2, ws, words), s = mk("l.scales", DT_F32, 2, ss, scales),
                    b = mk("l.biases", DT_F32, 2, ss, biases);
        float out[ROWS * COLS];
        hearth_error e = {0};
        assert_int_equal(mlxq_dequantize(&w, &s, &b, bits, G, out, ROWS * COLS, &e), HEARTH_OK);
        for (int i = 0; i < ROWS * COLS; i++) {
            int gi = i / G; /* rows are whole groups */
            /* values are exact in float: small ints times powers of two */
            assert_true(out[i] == scales[gi] * (float)q[i] + biases[gi]);
        }
    }
}

static void test_dequant_half_scales_and_3d(void **state) {
    (void)state;
    /* [2 experts, 1 row, 32 cols] at 8 bits, bf16 and f16 scales: the result is
     * rounded to the scale dtype after the multiply and after the add */
    uint8_t q[64];
    for (int i = 0; i < 64; i++) q[i] = (uint8_t)(i * 3);
    uint32_t words[16];
    pack(q, 32, 8, words);
    pack(q + 32, 32, 8, words + 8);
    int64_t ws[] = {2, 1, 8}, ss[] = {2, 1, 1};
    uint16_t sb[2] = {f32_to_bf16(0.1f), f32_to_bf16(-0.3f)}, bb[2] = {f32_to_bf16(1.7f), f32_to_bf16(0.01f)};
    tensor_info w = mk("e.weight", DT_U32, 3, ws, words), s = mk("e.scales", DT_BF16, 3, ss, sb),
                b = mk("e.biases", DT_BF16, 3, ss, bb);
    float out[64];
    hearth_error e = {0};
    assert_int_equal(mlxq_dequantize(&w, &s, &b, 8, 32, out, 64, &e), HEARTH_OK);
    for (int i = 0; i < 64; i++) {
        float p = bf16_to_f32(f32_to_bf16(bf16_to_f32(sb[i / 32]) * (float)q[i]));
        float want = bf16_to_f32(f32_to_bf16(p + bf16_to_f32(bb[i / 32])));
        assert_true(out[i] == want);
        assert_true(out[i] == bf16_to_f32(f32_to_bf16(out[i]))); /* representable in bf16 */
    }
    uint16_t sh[2] = {f32_to_f16(0.1f), f32_to_f16(-0.3f)}, bh[2] = {f32_to_f16(1.7f), f32_to_f16(0.01f)};
    s = mk("e.scales", DT_F16, 3, ss, sh);
    b = mk("e.biases", DT_F16, 3, ss, bh);
    assert_int_equal(mlxq_dequantize(&w, &s, &b, 8, 32, out, 64, &e), HEARTH_OK);
    for (int i = 0; i < 64; i++) assert_true(out[i] == f16_to_f32(f32_to_f16(out[i])));
}

static void expect_dequant_error(const tensor_info *w, const tensor_info *s, const tensor_info *b, int bits,
                                 int group, uint64_t n, hearth_status want, const char *names) {
    float out[256];
    hearth_error e = {0};
    hearth_status st = mlxq_dequantize(w, s, b, bits, group, out, n, &e);
    if (st != want) fail_msg("status %d want %d (%s)", st, want, e.message);
    if (names && !strstr(e.message, names)) fail_msg("message '%s' does not name %s", e.message, names);
}

static void test_dequant_errors(void **state) {
    (void)state;
    uint32_t words[8] = {0};
    float sc[4] = {1, 1, 1, 1};
    uint16_t sh[4] = {0};
    int64_t ws[] = {2, 4}, ss[] = {2, 1}, bad_ss[] = {2, 2}, one[] = {4};
    tensor_info w = mk("m.weight", DT_U32, 2, ws, words), s = mk("m.scales", DT_F32, 2, ss, sc),
                b = mk("m.biases", DT_F32, 2, ss, sc);
    /* 2 rows x 4 words x 4 bits = 2 x 32 */
    expect_dequant_error(&w, &s, &b, 4, 32, 64, HEARTH_OK, NULL);
    expect_dequant_error(&w, &s, &b, 4, 32, 63, HEARTH_ERR_INVALID, "'m.weight'");
    expect_dequant_error(&w, &s, &b, 4, 64, 64, HEARTH_ERR_FORMAT, "'m.weight'"); /* 32 cols < one group */
    expect_dequant_error(&w, &s, &b, 7, 32, 64, HEARTH_ERR_INVALID, "'m.weight'");
    expect_dequant_error(&w, &s, &b, 4, 16, 64, HEARTH_ERR_INVALID, "'m.weight'");
    expect_dequant_error(&w, &s, &b, 3, 32, 64, HEARTH_ERR_FORMAT, "'m.weight'"); /* 128 bits not whole 3-bit groups */
    tensor_info wf = mk("m.weight", DT_F32, 2, ws, words);
    expect_dequant_error(&wf, &s, &b, 4, 32, 64, HEARTH_ERR_FORMAT, "U32");
    tensor_info s2 = mk("m.scales", DT_F32, 2, bad_ss, sc);
    expect_dequant_error(&w, &s2, &b, 4, 32, 64, HEARTH_ERR_FORMAT, "'m.scales'");
    tensor_info b1 = mk("m.biases", DT_F32, 1, one, sc);
    expect_dequant_error(&w, &s, &b1, 4, 32, 64, HEARTH_ERR_FORMAT, "'m.biases'");
    tensor_info bh = mk("m.biases", DT_F16, 2, ss, sh);
    expect_dequant_error(&w, &s, &bh, 4, 32, 64, HEARTH_ERR_FORMAT, "'m.biases'");
    tensor_info si = mk("m.scales", DT_I32, 2, ss, sc);
    expect_dequant_error(&w, &si, &b, 4, 32, 64, HEARTH_ERR_UNSUPPORTED, "'m.scales'");
    tensor_info wshort = w;
    wshort.nbytes = 16;
    expect_dequant_error(&wshort, &s, &b, 4, 32, 64, HEARTH_ERR_FORMAT, "'m.weight'");
    tensor_info wnull = w;
    wnull.data = NULL;
    expect_dequant_error(&wnull, &s, &b, 4, 32, 64, HEARTH_ERR_FORMAT, "'m.weight'");
    expect_dequant_error(&w, &s, NULL, 4, 32, 64, HEARTH_ERR_INVALID, NULL);
}

static void test_infer(void **state) {
    (void)state;
    int64_t ws[] = {8, 96}, ss[] = {8, 4};
    tensor_info w = mk("x.weight", DT_U32, 2, ws, NULL), s = mk("x.scales", DT_F16, 2, ss, NULL);
    int b = 0, g = 0;
    hearth_error e = {0};
    assert_int_equal(mlxq_infer(&w, &s, 512, &b, &g, &e), HEARTH_OK); /* 96*32/512 = 6 bits, 512/4 = 128 */
    assert_int_equal(b, 6);
    assert_int_equal(g, 128);
    assert_int_equal(mlxq_infer(&w, &s, 500, &b, &g, &e), HEARTH_ERR_FORMAT);
    assert_int_equal(mlxq_infer(&w, &s, 1024, &b, &g, &e), HEARTH_ERR_UNSUPPORTED); /* 3 bits, group 256 */
    assert_non_null(strstr(e.message, "x.weight"));
}

/* mlxq_quantize against mlxq_dequantize: every value within half a step of its group's
 * scale (or the refit's shortfall at the far end), the larger-magnitude edge of each group exact (mlx refits the scale so it is), a
 * constant group exact, and the packing read back by the dequantizer for every width.
 * Bit-exactness against mx.quantize is tests/parity/test_convert.py's. */
static void test_quantize_round_trip(void **state) {
    (void)state;
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    enum { ROWS = 4, COLS = 128, G = 32, NG = ROWS * COLS / G };
    float w[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f + 0.001f * (float)(i % 7);
    for (int j = 0; j < G; j++) w[G + j] = 0.75f; /* a constant group */
    for (size_t bi = 0; bi < sizeof bitss / sizeof bitss[0]; bi++) {
        int bits = bitss[bi];
        uint8_t packed[ROWS * COLS]; /* 8 bits per value at most */
        float scales[NG], biases[NG], back[ROWS * COLS];
        mlxq_quantize(w, ROWS, COLS, bits, G, packed, scales, biases);
        int64_t ws[] = {ROWS, COLS * bits / 32}, ss[] = {ROWS, COLS / G};
        tensor_info tw = mk("l.weight", DT_U32, 2, ws, packed), ts = mk("l.scales", DT_F32, 2, ss, scales),
                    tb = mk("l.biases", DT_F32, 2, ss, biases);
        hearth_error e = {0};
        assert_int_equal(mlxq_dequantize(&tw, &ts, &tb, bits, G, back, ROWS * COLS, &e), HEARTH_OK);
        for (int g = 0; g < NG; g++) {
            int edge = g * G;
            const float *x = w + g * G;
            float hi = x[0], lo = x[0];
            for (int j = 0; j < G; j++) {
                hi = fmaxf(hi, x[j]);
                lo = fminf(lo, x[j]);
            }
            /* half a step, or what the refit scale (edge / q0, a little shorter than the
             * range / (2^bits - 1)) leaves beyond the last code at the far end */
            float span = fabsf(scales[g]) * (float)((1 << bits) - 1);
            float bound = fmaxf(fabsf(scales[g]) * 0.5f, (hi - lo) - span) + 1e-5f;
            for (int j = 0; j < G; j++) {
                assert_true(fabsf(back[g * G + j] - x[j]) <= bound);
                if (fabsf(x[j]) > fabsf(w[edge])) edge = g * G + j;
            }
            assert_true(back[edge] == w[edge]);
        }
        for (int j = 0; j < G; j++) assert_true(back[G + j] == 0.75f);
    }
}

/* Squared error of one [rows, cols] quantization, read back through mlxq_dequantize with
 * float32 scales and biases; per group into err (NG entries). */
static double fit_sse(const float *w, int rows, int cols, int bits, int G, const uint8_t *packed, const float *scales,
                      const float *biases, double *err) {
    int64_t ws[] = {rows, cols * bits / 32}, ss[] = {rows, cols / G};
    tensor_info tw = mk("l.weight", DT_U32, 2, ws, packed), ts = mk("l.scales", DT_F32, 2, ss, scales),
                tb = mk("l.biases", DT_F32, 2, ss, biases);
    float *back = malloc((size_t)rows * cols * sizeof *back);
    hearth_error e = {0};
    assert_int_equal(mlxq_dequantize(&tw, &ts, &tb, bits, G, back, (uint64_t)rows * cols, &e), HEARTH_OK);
    double total = 0;
    for (int g = 0; g < rows * cols / G; g++) {
        err[g] = 0;
        for (int j = 0; j < G; j++)
            err[g] += ((double)back[g * G + j] - w[g * G + j]) * (back[g * G + j] - w[g * G + j]);
        total += err[g];
    }
    free(back);
    return total;
}

/* mlxq_quantize_fit against mlxq_quantize on bell-shaped weights with outliers (as trained
 * weights are): no group's error larger (the fit tries mx.quantize's pair first), the total
 * at least 5% smaller at every width and group size (measured: 0.71-0.90 of it), scales and biases already in the
 * stored dtype (F16 here: rounding them again changes nothing), a group already on an affine grid that does not hold
 * zero recovered exactly (mx.quantize's zero-anchored grid cannot), a constant group exact. */
static void test_quantize_fit(void **state) {
    (void)state;
    enum { ROWS = 8, COLS = 256, MAXG = ROWS * COLS / 32 };
    static const int bitss[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    float *w = malloc(ROWS * COLS * sizeof *w);
    unsigned seed = 12345;
    for (int i = 0; i < ROWS * COLS; i++) { /* sum of 4 uniforms: bell-shaped; every 37th value an outlier */
        float u = 0;
        for (int k = 0; k < 4; k++) u += (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0f - 0.5f;
        w[i] = 0.02f * u * (i % 37 == 0 ? 6.0f : 1.0f);
    }
    for (int j = 0; j < 32; j++) w[32 + j] = -0.375f; /* a constant group (group 32) */
    uint8_t packed[ROWS * COLS];
    float scales[MAXG], biases[MAXG], fs[MAXG], fb[MAXG];
    double err_mlx[MAXG], err_fit[MAXG];
    for (size_t bi = 0; bi < sizeof bitss / sizeof bitss[0]; bi++)
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            int bits = bitss[bi], G = groups[gi], NG = ROWS * COLS / G;
            mlxq_quantize(w, ROWS, COLS, bits, G, packed, scales, biases);
            for (int g = 0; g < NG; g++) /* as convert stores them */
                scales[g] = f16_to_f32(f32_to_f16(scales[g])), biases[g] = f16_to_f32(f32_to_f16(biases[g]));
            double mlx = fit_sse(w, ROWS, COLS, bits, G, packed, scales, biases, err_mlx);
            mlxq_quantize_fit(w, ROWS, COLS, bits, G, DT_F16, packed, fs, fb);
            double fit = fit_sse(w, ROWS, COLS, bits, G, packed, fs, fb, err_fit);
            for (int g = 0; g < NG; g++) {
                /* mx.quantize's pair (rounded to F16 as stored) is the fit's first candidate;
                 * the fit sums its errors in double, the dequantizer rounds each value to
                 * float: 1e-5 relative covers that */
                assert_true(err_fit[g] <= err_mlx[g] * (1 + 1e-5) + 1e-15);
                assert_true(f16_to_f32(f32_to_f16(fs[g])) == fs[g] && f16_to_f32(f32_to_f16(fb[g])) == fb[g]);
            }
            assert_true(fit <= 0.95 * mlx);
            if (G == 32) assert_true(err_fit[1] == 0); /* the constant group */
        }
    /* values on the grid 0.0078125 * q + 0.0400390625 (exact in F16, zero not on it) */
    for (int j = 0; j < 64; j++) w[j] = 0.0078125f * (float)((j * 7) % 16) + 0.0400390625f;
    mlxq_quantize(w, 1, 64, 4, 64, packed, scales, biases);
    assert_true(fit_sse(w, 1, 64, 4, 64, packed, scales, biases, err_mlx) > 1e-6);
    mlxq_quantize_fit(w, 1, 64, 4, 64, DT_F16, packed, fs, fb);
    assert_true(fit_sse(w, 1, 64, 4, 64, packed, fs, fb, err_fit) == 0);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_quantization),
        cmocka_unit_test(test_config_quantization_config_only),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_dequant_known_values),
        cmocka_unit_test(test_dequant_half_scales_and_3d),
        cmocka_unit_test(test_dequant_errors),
        cmocka_unit_test(test_infer),
        cmocka_unit_test(test_quantize_round_trip),
        cmocka_unit_test(test_quantize_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
