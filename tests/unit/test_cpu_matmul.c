/* test_cpu_matmul.c: the CPU matmul kernels. (1) the scalar reference dequantizer is
 * bit-exact against fixtures made by gguf/mlx (tools/make_cpu_quant_fixtures.py);
 * (2) every format at every ISA level the machine has (scalar/avx2/avx512), T in
 * {1, 3, 17}, 1 and 2 threads, matches the reference within the bound stated below;
 * (3) invalid weights and short scratch fail with an error instead of crashing;
 * (4) the exact rescoring of each row's largest outputs gives the reference's bits there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64*: deterministic across runs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* ---------- (1) reference dequantizer vs gguf / mlx fixtures ---------- */

static const struct { const char *file; tensor_dtype t; } fixtures[] = {
    {"q4_0", DT_Q4_0}, {"q4_1", DT_Q4_1}, {"q5_0", DT_Q5_0}, {"q5_1", DT_Q5_1}, {"q8_0", DT_Q8_0},
    {"q2_k", DT_Q2_K}, {"q3_k", DT_Q3_K}, {"q4_k", DT_Q4_K}, {"q5_k", DT_Q5_K}, {"q6_k", DT_Q6_K},
    {"mlx2_g32", DT_U32}, {"mlx3_g64", DT_U32}, {"mlx4_g32", DT_U32}, {"mlx4_g128", DT_U32},
    {"mlx6_g64", DT_U32}, {"mlx8_g64", DT_U32},
};

static uint8_t *read_file(const char *name, size_t *len) {
    const char *dir = getenv("HEARTH_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/cpu_quant/%s.bin", dir ? dir : "tests/data", name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("missing fixture %s (run tools/make_cpu_quant_fixtures.py)", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*len);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static uint32_t u32_at(const uint8_t *buf, size_t len, size_t *pos) {
    assert_true(*pos + 4 <= len);
    uint32_t v;
    memcpy(&v, buf + *pos, 4);
    *pos += 4;
    return v;
}

static void test_reference_dequant_matches_fixtures(void **state) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        size_t len, pos = 0;
        uint8_t *buf = read_file(fixtures[f].file, &len);
        op_weight w = {.dtype = fixtures[f].t};
        w.n = u32_at(buf, len, &pos);
        w.k = u32_at(buf, len, &pos);
        uint32_t data_bytes = u32_at(buf, len, &pos);
        w.data = buf + pos;
        pos += data_bytes;
        w.bits = (int)u32_at(buf, len, &pos);
        w.group_size = (int)u32_at(buf, len, &pos);
        uint32_t sbt = u32_at(buf, len, &pos), sb_bytes = u32_at(buf, len, &pos);
        w.sb_dtype = sbt == 0 ? DT_F32 : sbt == 1 ? DT_F16 : DT_BF16;
        w.scales = buf + pos;
        w.biases = buf + pos + sb_bytes;
        pos += 2 * (size_t)sb_bytes;
        assert_true(pos + (size_t)(w.n * w.k) * 4 == len);
        assert_int_equal(op_weight_check(&w, fixtures[f].file, NULL), HEARTH_OK);
        assert_int_equal(op_weight_row_bytes(&w) * w.n, data_bytes);
        const float *expected = (const float *)(buf + pos);
        float out[256];
        int step = w.dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w.dtype);
        for (int64_t n = 0; n < w.n; n++)
            for (int64_t k0 = 0; k0 < w.k; k0 += step) {
                op_weight_dequant(&w, n, k0, step, out);
                for (int j = 0; j < step; j++) {
                    float e;
                    memcpy(&e, expected + n * w.k + k0 + j, 4);
                    /* Bit-exact: same operations in the same order as the oracle. */
                    if (memcmp(&e, &out[j], 4))
                        fail_msg("%s row %lld col %lld: got %.9g want %.9g", fixtures[f].file, (long long)n,
                                 (long long)(k0 + j), out[j], e);
                }
            }
        free(buf);
    }
}

/* ---------- (2) fast kernels vs reference ---------- */

typedef struct wcase {
    const char *name;
    tensor_dtype t;
    int bits, group;
    tensor_dtype sbt;
} wcase;

/* Fills a weight with random bytes (so every bit pattern of the quants occurs) and finite
 * random f16 scales at the format's scale offsets. */
static void *make_weight(const wcase *c, int64_t n, int64_t k, op_weight *w, void **sb) {
    *w = (op_weight){.dtype = c->t, .n = n, .k = k, .bits = c->bits, .group_size = c->group, .sb_dtype = c->sbt};
    int64_t rb = op_weight_row_bytes(w);
    uint8_t *d = malloc((size_t)(rb * n));
    for (int64_t i = 0; i < rb * n; i++) d[i] = (uint8_t)rnd();
    static const struct { tensor_dtype t; int off[2]; } f16_fields[] = {
        {DT_Q4_0, {0, -1}}, {DT_Q4_1, {0, 2}}, {DT_Q5_0, {0, -1}}, {DT_Q5_1, {0, 2}}, {DT_Q8_0, {0, -1}},
        {DT_Q2_K, {80, 82}}, {DT_Q3_K, {108, -1}}, {DT_Q4_K, {0, 2}}, {DT_Q5_K, {0, 2}}, {DT_Q6_K, {208, -1}},
    };
    int bb = tensor_dtype_block_bytes(c->t);
    for (size_t i = 0; i < sizeof f16_fields / sizeof f16_fields[0]; i++) {
        if (f16_fields[i].t != c->t) continue;
        for (int64_t b = 0; b < rb * n / bb; b++)
            for (int j = 0; j < 2; j++)
                if (f16_fields[i].off[j] >= 0) {
                    uint16_t h = f32_to_f16(rndf() * 0.05f);
                    memcpy(d + b * bb + f16_fields[i].off[j], &h, 2);
                }
    }
    if (c->t == DT_F32)
        for (int64_t i = 0; i < n * k; i++) ((float *)d)[i] = rndf();
    if (c->t == DT_F16 || c->t == DT_BF16)
        for (int64_t i = 0; i < n * k; i++)
            ((uint16_t *)d)[i] = c->t == DT_F16 ? f32_to_f16(rndf()) : f32_to_bf16(rndf());
    *sb = NULL;
    if (c->t == DT_U32) {
        int64_t ns = n * (k / c->group);
        int es = c->sbt == DT_F32 ? 4 : 2;
        uint8_t *s = malloc((size_t)(2 * ns * es));
        for (int64_t i = 0; i < 2 * ns; i++) {
            float v = rndf() * 0.1f;
            if (es == 4) memcpy(s + i * 4, &v, 4);
            else {
                uint16_t h = c->sbt == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
                memcpy(s + i * 2, &h, 2);
            }
        }
        w->scales = s;
        w->biases = s + ns * es;
        *sb = s;
    }
    w->data = d;
    return d;
}

/* Error bound of a kernel against the double-accumulated reference, for output row n of
 * activation row x:
 *  - integer-dot kernels quantize x per 32 values to int8 with d = amax/127 and round to
 *    nearest, so each x moves by at most amax_b/254: |err| <= sum_b amax_b/254 *
 *    sum_{i in b} |w_i| (1% slack for the rounding of d and 1/d); plus float rounding of
 *    the per-block products and offset terms, 1e-5 * sum_b max|w_b| * sum_{i in b} |x_i|
 *    (K <= 512 here: at most 16 block terms per lane of ~6e-8 each, with margin);
 *  - f32 FMA kernels (F32/F16/BF16): only summation order differs: 32 partial sums of
 *    <= K/32 terms plus a tree: <= (K/32 + 8) * 2^-24 * sum|w x|, below 1e-5 * sum|w x|. */
static double error_bound(const float *wrow, const float *x, int64_t k, int int8_act) {
    double b_act = 0, b_float = 0, sum_abs = 0;
    for (int64_t b0 = 0; b0 < k; b0 += 32) {
        double ax = 0, aw = 0, sw = 0, sx = 0;
        for (int64_t i = b0; i < b0 + 32 && i < k; i++) {
            ax = fmax(ax, fabs(x[i]));
            aw = fmax(aw, fabs(wrow[i]));
            sw += fabs(wrow[i]);
            sx += fabs(x[i]);
            sum_abs += fabs((double)wrow[i] * x[i]);
        }
        b_act += ax / 254.0 * sw * 1.01;
        b_float += 2 * aw * sx;
    }
    if (!int8_act) return 1e-5 * sum_abs + 1e-30;
    return b_act + 1e-5 * b_float + 1e-30;
}

/* Expected squared error of an int8-activation dot: rounding errors are close to
 * independent and uniform in [-d_b/2, d_b/2] (d_b = amax_b/127), variance d_b^2/12 each. */
static double int8_error_variance(const float *wrow, const float *x, int64_t k) {
    double v = 0;
    for (int64_t b0 = 0; b0 < k; b0 += 32) {
        double ax = 0, sw2 = 0;
        for (int64_t i = b0; i < b0 + 32 && i < k; i++) {
            ax = fmax(ax, fabs(x[i]));
            sw2 += (double)wrow[i] * wrow[i];
        }
        v += (ax / 127) * (ax / 127) / 12 * sw2;
    }
    return v;
}

static threadpool *pools[3]; /* [1] one thread, [2] two threads */

static int group_setup(void **state) {
    assert_int_equal(tp_create(1, &pools[1], NULL), HEARTH_OK);
    assert_int_equal(tp_create(2, &pools[2], NULL), HEARTH_OK);
    return 0;
}
static int group_teardown(void **state) {
    tp_destroy(pools[1]);
    tp_destroy(pools[2]);
    return 0;
}

/* Checks every level and 1/2 threads against the reference for the token counts Ts. */
static void check_case_ts(const wcase *c, int64_t n, int64_t k, const int *Ts, size_t nT) {
    op_weight w;
    void *sb;
    void *data = make_weight(c, n, k, &w, &sb);
    assert_int_equal(op_weight_check(&w, c->name, NULL), HEARTH_OK);
    float *wf = malloc((size_t)(n * k) * sizeof *wf);
    int step = w.dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w.dtype) == 1 ? 1 : tensor_dtype_block_elems(w.dtype);
    for (int64_t r = 0; r < n; r++)
        for (int64_t k0 = 0; k0 < k; k0 += step) op_weight_dequant(&w, r, k0, step, wf + r * k + k0);
    for (size_t ti = 0; ti < nT; ti++) {
        int T = Ts[ti];
        float *x = malloc((size_t)(T * k) * sizeof *x), *ref = malloc((size_t)(T * n) * sizeof *ref);
        float *y = malloc((size_t)(T * n) * sizeof *y);
        for (int64_t i = 0; i < T * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f); /* some outliers */
        for (int t = 0; t < T; t++) cpu_ref_rows(&w, 0, n, x + t * k, ref + t * n);
        /* BF16 weights with vdpbf16ps round the activations to bf16 first: their oracle is the
         * double-accumulated reference on those rounded activations, which leaves only the
         * kernel's float summation order (bound 1e-5 * sum |w x|, as for the FMA kernels). */
        float *xb = malloc((size_t)(T * k) * sizeof *xb), *refb = malloc((size_t)(T * n) * sizeof *refb);
        for (int64_t i = 0; i < T * k; i++) xb[i] = bf16_to_f32(f32_to_bf16(x[i]));
        for (int t = 0; t < T; t++) cpu_ref_rows(&w, 0, n, xb + t * k, refb + t * n);
        for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
            cpu_matmul_set_level((cpu_level)lv);
            int fast = cpu_matmul_is_fast(&w);
            cpu_kernel kern = {.rows = cpu_ref_rows, .act = CPU_ACT_F32};
            if (lv == CPU_LEVEL_AVX512 && !cpu_avx512_kernel(&w, &kern)) cpu_avx2_kernel(&w, &kern);
            else if (lv == CPU_LEVEL_AVX2) cpu_avx2_kernel(&w, &kern);
            int bf16_act = fast && kern.act == CPU_ACT_BF16;
            int int8_act = fast && kern.act != CPU_ACT_F32 && !bf16_act;
            size_t ss = cpu_matmul_scratch_size(&w, T);
            void *scratch = ss ? malloc(ss) : NULL;
            /* Formats with a fast kernel at this level must not fall back to the reference. */
            int want_fast = lv > CPU_LEVEL_SCALAR;
            assert_int_equal(fast, want_fast);
            for (int th = 1; th <= 2; th++) {
                double sq_err = 0, sq_expected = 0;
                for (int64_t i = 0; i < T * n; i++) y[i] = NAN;
                hearth_error err = {0};
                assert_int_equal(cpu_matmul(&w, x, T, y, scratch, ss, pools[th], &err), HEARTH_OK);
                for (int t = 0; t < T; t++)
                    for (int64_t r = 0; r < n; r++) {
                        double got = y[t * n + r], want = bf16_act ? refb[t * n + r] : ref[t * n + r];
                        /* Scalar level runs the reference itself: identical results. */
                        double bound = fast ? error_bound(wf + r * k, (bf16_act ? xb : x) + t * k, k, int8_act) : 0;
                        if (!(fabs(got - want) <= bound))
                            fail_msg("%s level %s threads %d N %lld K %lld T %d: y[%d][%lld] = %.7g, ref %.7g, "
                                     "bound %.3g",
                                     c->name, cpu_level_name((cpu_level)lv), th, (long long)n, (long long)k, T, t,
                                     (long long)r, got, want, bound);
                        if (int8_act) {
                            sq_err += (got - want) * (got - want);
                            sq_expected += int8_error_variance(wf + r * k, x + t * k, k);
                        }
                    }
                /* The worst-case bound above is loose; this catches systematic errors (a wrong
                 * offset or scale) it could miss: the summed squared error over all T*N outputs
                 * must stay within 4x its expectation (+ float rounding slack). */
                if (int8_act && !(sq_err <= 4 * sq_expected + 1e-10))
                    fail_msg("%s level %s threads %d T %d: squared error %.3g, expected about %.3g", c->name,
                             cpu_level_name((cpu_level)lv), th, T, sq_err, sq_expected);
            }
            free(scratch);
        }
        free(x);
        free(ref);
        free(xb);
        free(refb);
        free(y);
    }
    cpu_matmul_set_level(cpu_level_hardware());
    free(wf);
    free(data);
    free(sb);
}

static void check_case(const wcase *c, int64_t n, int64_t k) {
    /* 1: decode kernels; 3: prefill, one partial token tile; 17: two 8-token tiles + 1 */
    static const int Ts[] = {1, 3, 17};
    check_case_ts(c, n, k, Ts, 3);
}

static int64_t odd_n(void) { return 1 + 2 * (int64_t)(rnd() % 45); } /* 1..89, odd */

static void test_gguf_and_dense_formats(void **state) {
    static const wcase cases[] = {
        {"f32", DT_F32, 0, 0, 0},   {"f16", DT_F16, 0, 0, 0},   {"bf16", DT_BF16, 0, 0, 0},
        {"q4_0", DT_Q4_0, 0, 0, 0}, {"q4_1", DT_Q4_1, 0, 0, 0}, {"q5_0", DT_Q5_0, 0, 0, 0},
        {"q5_1", DT_Q5_1, 0, 0, 0}, {"q8_0", DT_Q8_0, 0, 0, 0}, {"q2_k", DT_Q2_K, 0, 0, 0},
        {"q3_k", DT_Q3_K, 0, 0, 0}, {"q4_k", DT_Q4_K, 0, 0, 0}, {"q5_k", DT_Q5_K, 0, 0, 0},
        {"q6_k", DT_Q6_K, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int be = tensor_dtype_block_elems(cases[i].t);
        /* dense: odd K too (tails of the 32/8-wide loops); blocks: 1..3 blocks (k-quants 1..2) */
        int64_t k = be == 1 ? 1 + (int64_t)(rnd() % 300) : be * (1 + (int64_t)(rnd() % (be == 256 ? 2 : 10)));
        check_case(&cases[i], odd_n(), k);
        check_case(&cases[i], 100, be == 1 ? 64 : be); /* >= 2 tasks per thread */
        /* the 512-bit one-row decode kernels (kernels_avx512_rows.c) take K in whole groups of
         * 256: Q5_0, Q5_1 and Q8_0 blocks never reach them at the K above */
        if (be == 32) check_case(&cases[i], odd_n(), 256 * (1 + (int64_t)(rnd() % 3)));
    }
}

static void test_mlx_affine(void **state) {
    static const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    static const tensor_dtype sbts[] = {DT_F16, DT_BF16, DT_F32};
    int i = 0;
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++, i++) {
            char name[32];
            snprintf(name, sizeof name, "mlx%d_g%d_%s", bits[b], groups[g], tensor_dtype_name(sbts[i % 3]));
            wcase c = {name, DT_U32, bits[b], groups[g], sbts[i % 3]};
            check_case(&c, odd_n(), groups[g] * (1 + (int64_t)(rnd() % 3)));
        }
    /* K in whole groups of 256, every width, group size and scale type: the one-row decode
     * kernels of kernels_avx512_rows.c */
    static const int kbits[] = {2, 3, 4, 5, 6, 8};
    for (int bi = 0; bi < 6; bi++)
        for (int g = 0, b = kbits[bi]; g < 3; g++)
            for (int t = 0; t < 3; t++) {
                char name[32];
                snprintf(name, sizeof name, "mlx%d_g%d_%s_k256", b, groups[g], tensor_dtype_name(sbts[t]));
                wcase c = {name, DT_U32, b, groups[g], sbts[t]};
                check_case(&c, odd_n(), 256 * (1 + (int64_t)(rnd() % 3)));
            }
}

/* The prefill kernels pack weight rows x up to 32 blocks of 32 columns (AVX-512: 16 rows, 8
 * tokens per register tile; AVX2: 8-row groups, up to 8 per chunk, 4 tokens per tile): K of
 * several packed chunks (partial last chunk), N not a multiple of 16 (partial row group,
 * several groups and tasks per thread), T with every partial last token tile (9, 10, 23:
 * 1, 2 and 3 tokens past a multiple of 4 and 8), for every format that has such a kernel. */
static void test_prefill_tiles_long_k(void **state) {
    static const wcase cases[] = {
        {"q4_0", DT_Q4_0, 0, 0, 0}, {"q4_1", DT_Q4_1, 0, 0, 0},  {"q5_0", DT_Q5_0, 0, 0, 0},
        {"q5_1", DT_Q5_1, 0, 0, 0}, {"q8_0", DT_Q8_0, 0, 0, 0},  {"q4_k", DT_Q4_K, 0, 0, 0},
        {"q5_k", DT_Q5_K, 0, 0, 0}, {"q6_k", DT_Q6_K, 0, 0, 0},  {"q3_k", DT_Q3_K, 0, 0, 0},
        {"mlx4_g64", DT_U32, 4, 64, DT_F16},
        {"mlx8_g32", DT_U32, 8, 32, DT_BF16}, {"mlx4_g128", DT_U32, 4, 128, DT_F32},
    };
    static const int Ts[] = {2, 9, 10, 23};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int be = cases[i].t == DT_U32 ? cases[i].group : tensor_dtype_block_elems(cases[i].t);
        /* 65..~90 blocks of 32: two full chunks of 32 blocks and a partial one */
        int64_t k = (2080 + (int64_t)(rnd() % 800)) / be * be + be;
        check_case_ts(&cases[i], 37 + 2 * (int64_t)(rnd() % 20), k, Ts, 4);
    }
    /* MLX 2/3/5/6-bit: fast only at K in groups of 256 (the one-row kernel below 17 tokens,
     * the packed GEMM from there): 72-96 blocks, a partial last chunk */
    static const wcase narrow[] = {{"mlx3_g64", DT_U32, 3, 64, DT_F16},
                                   {"mlx6_g32", DT_U32, 6, 32, DT_BF16},
                                   {"mlx2_g128", DT_U32, 2, 128, DT_F32},
                                   {"mlx5_g64", DT_U32, 5, 64, DT_BF16}};
    for (size_t i = 0; i < sizeof narrow / sizeof narrow[0]; i++)
        check_case_ts(&narrow[i], 37 + 2 * (int64_t)(rnd() % 20), 256 * (9 + (int64_t)(rnd() % 4)), Ts, 4);
}

/* The AVX2 k-quant kernels stage per-call activation terms on the stack for K up to 64
 * super-blocks (kernels_avx2.c A2_K_MAX_SB) and form them per row group beyond: K of 65
 * super-blocks, N of a 4-row pass and 3 lone rows. */
static void test_k_quants_beyond_staged_k(void **state) {
    static const wcase cases[] = {{"q4_k", DT_Q4_K, 0, 0, 0}, {"q6_k", DT_Q6_K, 0, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 7, 65 * 256);
}

/* The 512-bit one-row decode kernels (kernels_avx512_rows.c) stage one call's activations
 * for K up to 64 x 256. Q2_K..Q6_K: K of 1, 3, 9, 33 and exactly 64 super-blocks (the last
 * staged one). Q8_0 takes K in groups of eight blocks of 32: 8, 16, 24 blocks, 64 and 512
 * (the largest staged); at other K it keeps the 256-bit kernel. Odd N, so two threads
 * split unevenly; decode only (T = 1), where they run. Without AVX-512 this checks the AVX2
 * kernels at these shapes instead. */
static void test_avx512_decode_rows_staged_k(void **state) {
    static const struct { wcase c; int64_t blocks[5]; } cases[] = {
        {{"q4_k", DT_Q4_K, 0, 0, 0}, {8, 24, 72, 264, 512}},
        {{"q6_k", DT_Q6_K, 0, 0, 0}, {8, 24, 72, 264, 512}},
        {{"q3_k", DT_Q3_K, 0, 0, 0}, {8, 24, 72, 264, 512}},
        {{"q2_k", DT_Q2_K, 0, 0, 0}, {8, 24, 72, 264, 512}},
        {{"q8_0", DT_Q8_0, 0, 0, 0}, {8, 16, 24, 64, 512}},
    };
    static const int Ts[] = {1};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t j = 0; j < 5; j++) {
            int64_t k = cases[i].blocks[j] * 32;
            op_weight w = {.dtype = cases[i].c.t, .n = 1, .k = k, .data = ""};
            if (cpu_level_hardware() >= CPU_LEVEL_AVX512) assert_non_null(cpu_avx512_rows1(&w));
            check_case_ts(&cases[i].c, k >= 8192 ? 19 : odd_n(), k, Ts, 1);
        }
}

/* The AVX2 decode kernels of Q4_0/Q4_1/Q8_0/Q4_K/Q6_K read one row at a time; their per-row
 * arithmetic is that of the 4-row x 2-token tiles used for small batches (kernels_avx2.c),
 * so a token's outputs must be bit-identical to the tile's. K of 1..17 blocks covers every
 * tail of the decode kernels' groups of four blocks (Q8_0) or block pairs (Q4, an odd last
 * block alone), 104 blocks full groups only, 513 blocks the Q4 fallback past the staged
 * pairs; N = 11: two 4-row passes and 3 lone rows in the tile. */
static void test_avx2_decode_rows_match_tiles(void **state) {
    if (cpu_level_hardware() < CPU_LEVEL_AVX2) {
        print_message("no AVX2 here: skipped\n");
        return;
    }
    static const wcase cases[] = {{"q4_0", DT_Q4_0, 0, 0, 0},
                                  {"q4_1", DT_Q4_1, 0, 0, 0},
                                  {"q8_0", DT_Q8_0, 0, 0, 0},
                                  {"q4_k", DT_Q4_K, 0, 0, 0},
                                  {"q6_k", DT_Q6_K, 0, 0, 0}};
    static const int64_t blocks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 104, 513};
    const int64_t n = 11;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            int be = tensor_dtype_block_elems(cases[ci].t);
            int64_t k = blocks[bi] * 32;
            if (be == 256 && (k % 256 || blocks[bi] > 104)) continue; /* k-quants: whole super-blocks */
            op_weight w;
            void *sb;
            void *data = make_weight(&cases[ci], n, k, &w, &sb);
            cpu_kernel kern = {0};
            assert_true(cpu_avx2_kernel(&w, &kern));
            cpu_tile_fn tile = kern.tile_small ? kern.tile_small : kern.tile;
            assert_true(kern.act == CPU_ACT_Q8 && tile);
            float *x = malloc((size_t)(2 * k) * sizeof *x), y1[2 * 11], y2[2 * 11];
            cpu_q8_block *xq = malloc((size_t)(2 * k / 32) * sizeof *xq);
            for (int64_t i = 0; i < 2 * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
            for (int t = 0; t < 2; t++) cpu_quantize_row_ref(x + t * k, k, xq + t * (k / 32), 0);
            for (int t = 0; t < 2; t++) kern.rows(&w, 0, n, xq + t * (k / 32), y1 + t * n);
            tile(&w, 0, n, xq, k / 32, 2, y2, n);
            for (int64_t i = 0; i < 2 * n; i++)
                if (memcmp(&y1[i], &y2[i], sizeof(float)))
                    fail_msg("%s K %lld: decode y[%lld] = %.9g, 4-row tile %.9g", cases[ci].name, (long long)k,
                             (long long)i, y1[i], y2[i]);
            /* AVX-512 machines decode with these one-row kernels too (Q4_0 / Q4_1 with VNNI
             * dots): the same bits; except where a 512-bit one-row kernel takes the format
             * (test_avx512_decode_rows_staged_k checks those against the reference) */
            kern = (cpu_kernel){0};
            if (cpu_level_hardware() >= CPU_LEVEL_AVX512 && !cpu_avx512_rows1(&w) && cpu_avx512_kernel(&w, &kern)) {
                for (int t = 0; t < 2; t++) kern.rows(&w, 0, n, xq + t * (k / 32), y1 + t * n);
                for (int64_t i = 0; i < 2 * n; i++)
                    if (memcmp(&y1[i], &y2[i], sizeof(float)))
                        fail_msg("%s K %lld: AVX-512 decode y[%lld] = %.9g, AVX2 4-row tile %.9g", cases[ci].name,
                                 (long long)k, (long long)i, y1[i], y2[i]);
            }
            free(x);
            free(xq);
            free(data);
            free(sb);
        }
}

/* The small tiles (batched decode and speculative verify steps below each format's
 * packed-GEMM threshold) run T tokens as passes of several tokens (AVX-512: 4, AVX2: 2) over
 * multi-row tiles, then the tokens left over as one more pass of those row tiles, then the
 * rows left over token by token. A token's sums are the same operations in the same order in
 * every pass, so each output must be bit-identical to the tile run on that token alone
 * (T = 1), for every T up to 9 and N with rows left over, on AVX2 and AVX-512; and every T
 * against the reference (check_case_ts). Skipped, and said so, without AVX2. */
static void test_small_tiles_every_t(void **state) {
    (void)state;
    if (cpu_level_hardware() < CPU_LEVEL_AVX2) {
        print_message("no AVX2 here: the small tiles did NOT run\n");
        return;
    }
    static const wcase cases[] = {
        {"q4_0", DT_Q4_0, 0, 0, 0}, {"q4_1", DT_Q4_1, 0, 0, 0}, {"q5_0", DT_Q5_0, 0, 0, 0},
        {"q5_1", DT_Q5_1, 0, 0, 0}, {"q8_0", DT_Q8_0, 0, 0, 0}, {"q4_k", DT_Q4_K, 0, 0, 0},
        {"q5_k", DT_Q5_K, 0, 0, 0}, {"q6_k", DT_Q6_K, 0, 0, 0}, {"q3_k", DT_Q3_K, 0, 0, 0},
        {"q2_k", DT_Q2_K, 0, 0, 0}, {"mlx4_g64", DT_U32, 4, 64, DT_F16}, {"mlx8_g32", DT_U32, 8, 32, DT_BF16},
    };
    const int64_t n = 23; /* five 4-row tiles and 3 rows left over */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t k = 768; /* 24 blocks of 32, 3 super-blocks of 256 */
        op_weight w;
        void *sb;
        void *data = make_weight(&cases[ci], n, k, &w, &sb);
        for (int isa = 0; isa < 2; isa++) {
            cpu_kernel kern = {0};
            if (isa == 1 && cpu_level_hardware() < CPU_LEVEL_AVX512) continue;
            if (!(isa ? cpu_avx512_kernel(&w, &kern) : cpu_avx2_kernel(&w, &kern))) continue;
            cpu_tile_fn tile = kern.tile_small ? kern.tile_small : kern.tile;
            if (kern.act == CPU_ACT_F32 || !tile) continue; /* AVX2 formats without an int8 tile */
            const int tmax = 9;
            float *x = malloc((size_t)(tmax * k) * sizeof *x), y1[9 * 23], y2[9 * 23];
            cpu_q8_block *xq = malloc((size_t)(tmax * k / 32) * sizeof *xq);
            for (int64_t i = 0; i < tmax * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
            for (int t = 0; t < tmax; t++)
                cpu_quantize_row(x + t * k, k, xq + t * (k / 32), kern.act == CPU_ACT_Q8_EVENODD);
            for (int t = 0; t < tmax; t++) tile(&w, 0, n, xq + t * (k / 32), k / 32, 1, y1 + t * n, n);
            for (int T = 1; T <= tmax; T++) {
                memset(y2, 0xff, sizeof y2);
                tile(&w, 0, n, xq, k / 32, T, y2, n);
                for (int64_t i = 0; i < T * n; i++)
                    if (memcmp(&y1[i], &y2[i], sizeof(float)))
                        fail_msg("%s %s T %d: y[%lld] = %.9g, alone %.9g", isa ? "avx512" : "avx2", cases[ci].name, T,
                                 (long long)i, y2[i], y1[i]);
            }
            free(x);
            free(xq);
        }
        free(data);
        free(sb);
        static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8};
        check_case_ts(&cases[ci], n, k, Ts, sizeof Ts / sizeof Ts[0]);
    }
}

/* BF16 weights on AVX512_BF16 CPUs (vdpbf16ps on bf16-rounded activations): K with an odd
 * number of 32-chunks (the last chunk alone in the even accumulator), rows left over by the
 * 2-row tile passes and tokens by the 4-token ones, against the reference on the rounded
 * activations (check_case_ts). Skipped, and said so, where the CPU lacks the instruction. */
static void test_bf16_dot_kernels(void **state) {
    (void)state;
    if (!cpu_features_get()->avx512bf16 || cpu_level_hardware() < CPU_LEVEL_AVX512) {
        print_message("no AVX512_BF16 here: the vdpbf16ps kernels did NOT run\n");
        return;
    }
    static const wcase bf = {"bf16", DT_BF16, 0, 0, 0};
    static const int Ts[] = {1, 2, 5, 8, 17};
    static const int64_t ks[] = {32, 96, 576, 1568};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        op_weight w = {.dtype = DT_BF16, .n = 3, .k = ks[i]};
        cpu_kernel kern;
        assert_true(cpu_avx512_kernel(&w, &kern) && kern.act == CPU_ACT_BF16);
        check_case_ts(&bf, 37, ks[i], Ts, sizeof Ts / sizeof Ts[0]);
    }
}

/* The dense tiles (F32 / F16 / BF16, T tokens per weight pass) keep each token's
 * arithmetic that of the rows kernel: four 8-wide sums over 32-weight chunks, then 8-wide
 * chunks, then single weights. So every output must be bit-identical to the rows kernel of
 * the same ISA, for any T (a partial last token group included) and any K (every tail). */
static void test_dense_tiles_match_rows(void **state) {
    (void)state;
    if (cpu_level_hardware() < CPU_LEVEL_AVX2) {
        print_message("no AVX2 here: skipped\n");
        return;
    }
    static const wcase cases[] = {{"f32", DT_F32, 0, 0, 0}, {"f16", DT_F16, 0, 0, 0}, {"bf16", DT_BF16, 0, 0, 0}};
    static const int64_t ks[] = {1, 7, 8, 31, 32, 33, 40, 71, 576, 1539};
    /* 17 and 21: past the BF16 tile's 16-token streaming pass, into its 2-row passes */
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 9, 17, 21};
    const int64_t n = 5;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int64_t k = ks[ki];
            op_weight w;
            void *sb;
            void *data = make_weight(&cases[ci], n, k, &w, &sb);
            float *x = malloc((size_t)(21 * k) * sizeof *x), y1[21 * 5], y2[21 * 5];
            for (int64_t i = 0; i < 21 * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
            for (int isa = 0; isa < 2; isa++) {
                cpu_kernel kern = {0};
                if (isa == 0) assert_true(cpu_avx2_kernel(&w, &kern));
                else if (cpu_level_hardware() < CPU_LEVEL_AVX512 || !cpu_avx512_kernel(&w, &kern)) continue;
                /* BF16 on AVX512_BF16 CPUs (k % 32 == 0): the vdpbf16ps kernels on bf16 rows */
                int bf = kern.act == CPU_ACT_BF16;
                assert_true((kern.act == CPU_ACT_F32 || (bf && w.dtype == DT_BF16 && k % 32 == 0)) && kern.tile);
                uint16_t *xh = malloc((size_t)(21 * k) * sizeof *xh);
                for (int t = 0; bf && t < 21; t++) cpu_avx512_bf16_row(x + t * k, k, xh + t * k);
                const void *xa = bf ? (const void *)xh : (const void *)x;
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    int T = Ts[ti];
                    for (int t = 0; t < T; t++)
                        kern.rows(&w, 0, n, bf ? (const void *)(xh + t * k) : (const void *)(x + t * k), y1 + t * n);
                    memset(y2, 0xff, sizeof y2);
                    kern.tile(&w, 0, n, xa, k, T, y2, n);
                    for (int64_t i = 0; i < T * n; i++)
                        if (memcmp(&y1[i], &y2[i], sizeof(float)))
                            fail_msg("%s %s K %lld T %d: rows y[%lld] = %.9g, tile %.9g", isa ? "avx512" : "avx2",
                                     cases[ci].name, (long long)k, T, (long long)i, y1[i], y2[i]);
                }
                free(xh);
            }
            free(x);
            free(data);
            free(sb);
        }
}

/* ---------- (2b) fused calls (q/k/v, gate/up in one pool round) ---------- */

/* cpu_matmul_fused must give every output row bit-identical to a separate call on its
 * weight (same kernel, same activation preparation, rows split differently only), in both
 * modes, on 1 and 2 threads, for weights that share the prepared x (same K and
 * preparation) and for ones that fall back to separate calls (MLX 4-bit's even/odd x). */
static void check_fused(const wcase *cs, int count, const int64_t *ns, int64_t k) {
    op_weight w[4];
    void *data[4], *sb[4];
    float *y[4], *want[4];
    const op_weight *wp[4];
    static const int Ts[] = {1, 5};
    for (int i = 0; i < count; i++) {
        data[i] = make_weight(&cs[i], ns[i], k, &w[i], &sb[i]);
        wp[i] = &w[i];
    }
    for (size_t ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        float *x = malloc((size_t)(T * k) * sizeof *x);
        for (int64_t i = 0; i < T * k; i++) x[i] = rndf();
        size_t ss = 0;
        for (int i = 0; i < count; i++) {
            size_t n = cpu_matmul_scratch_size(&w[i], T);
            if (n > ss) ss = n;
            y[i] = malloc((size_t)(T * ns[i]) * sizeof(float));
            want[i] = malloc((size_t)(T * ns[i]) * sizeof(float));
        }
        void *scratch = ss ? malloc(ss) : NULL;
        for (int inv = 0; inv <= 1; inv++)
            for (int th = 1; th <= 2; th++) {
                for (int i = 0; i < count; i++) {
                    hearth_status st = inv ? cpu_matmul_invariant(&w[i], x, T, want[i], scratch, ss, pools[th], NULL)
                                           : cpu_matmul(&w[i], x, T, want[i], scratch, ss, pools[th], NULL);
                    assert_int_equal(st, HEARTH_OK);
                    for (int64_t j = 0; j < T * ns[i]; j++) y[i][j] = NAN;
                }
                assert_int_equal(cpu_matmul_fused(count, wp, y, x, T, scratch, ss, pools[th], inv, NULL), HEARTH_OK);
                for (int i = 0; i < count; i++)
                    if (memcmp(y[i], want[i], (size_t)(T * ns[i]) * sizeof(float)))
                        fail_msg("fused %s (part %d of %d) T %d threads %d invariant %d differs from a separate call",
                                 cs[i].name, i, count, T, th, inv);
            }
        free(scratch);
        free(x);
        for (int i = 0; i < count; i++) {
            free(y[i]);
            free(want[i]);
        }
    }
    for (int i = 0; i < count; i++) {
        free(data[i]);
        free(sb[i]);
    }
}

static void test_fused_matches_separate(void **state) {
    cpu_matmul_set_level(cpu_level_hardware());
    const wcase q41 = {"q4_1", DT_Q4_1, 0, 0, 0}, q50 = {"q5_0", DT_Q5_0, 0, 0, 0}, q80 = {"q8_0", DT_Q8_0, 0, 0, 0};
    const wcase q4k = {"q4_k", DT_Q4_K, 0, 0, 0}, q6k = {"q6_k", DT_Q6_K, 0, 0, 0};
    const wcase f32 = {"f32", DT_F32, 0, 0, 0}, f16 = {"f16", DT_F16, 0, 0, 0};
    const wcase mlx4 = {"mlx4", DT_U32, 4, 64, DT_F16};
    /* sizes above the inline threshold (64 KiB) so both pool paths run; odd N for tails */
    const wcase qkv[] = {q41, q41, q41}, gemma[] = {q50, q50, q80}, kq[] = {q4k, q6k};
    const wcase dense[] = {f32, f16}, mixed[] = {mlx4, q80}, four[] = {q80, q41, q80, q50};
    check_fused(qkv, 3, (const int64_t[]){301, 97, 97}, 512);
    check_fused(gemma, 3, (const int64_t[]){257, 129, 129}, 512);
    check_fused(kq, 2, (const int64_t[]){181, 93}, 512);
    check_fused(dense, 2, (const int64_t[]){67, 33}, 160);
    check_fused(mixed, 2, (const int64_t[]){200, 41}, 512);
    check_fused(four, 4, (const int64_t[]){1, 17, 300, 5}, 256);
    float x[64] = {0}, *ys[5] = {0};
    const op_weight *ws[5] = {0};
    hearth_error err = {0};
    assert_int_equal(cpu_matmul_fused(0, ws, ys, x, 1, NULL, 0, NULL, 0, &err), HEARTH_ERR_INVALID);
    assert_int_equal(cpu_matmul_fused(5, ws, ys, x, 1, NULL, 0, NULL, 0, &err), HEARTH_ERR_INVALID);
}

/* The vectorized activation quantizer must produce the reference's bytes exactly (the
 * kernels' error bounds assume the reference rounding), including all-zero blocks, ties
 * at .5 after scaling and values that hit the clamp. */
static void test_quantize_row_matches_reference(void **state) {
    if (cpu_level_hardware() < CPU_LEVEL_AVX2) {
        print_message("no AVX2 here: only the reference quantizer runs\n");
        return;
    }
    enum { K = 32 * 40 };
    float x[K];
    cpu_q8_block a[K / 32], b[K / 32];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < K; i++) x[i] = rndf() * (rep % 5 == 0 ? 1e-30f : rep % 7 == 0 ? 1e6f : 3.0f);
        for (int i = 0; i < 32; i++) x[i] = 0.0f;                        /* block 0: all zero */
        for (int i = 32; i < 64; i++) x[i] = (float)(i - 48) * 0.5f;     /* block 1: exact halves */
        for (int i = 64; i < 96; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * 127; /* block 2: +-amax */
        for (int i = 96; i < 128; i++) x[i] = i == 100 ? -5.0f : 0.01f * (float)(i - 112); /* amax negative */
        for (int eo = 0; eo < 2; eo++) { /* in order, and MLX 4-bit's evens-then-odds order */
            memset(a, 0x55, sizeof a);
            cpu_quantize_row_ref(x, K, a, eo);
            if (eo) { /* the order itself: the in-order quantizer on the permuted input gives the same bytes */
                float xp[K];
                cpu_q8_block c[K / 32];
                for (int i = 0; i < K; i++) xp[i] = x[i / 32 * 32 + (i % 32 < 16 ? 2 * (i % 32) : 2 * (i % 32 - 16) + 1)];
                memset(c, 0x55, sizeof c);
                cpu_quantize_row_ref(xp, K, c, 0);
                if (memcmp(a, c, sizeof a)) fail_msg("rep %d: even/odd reference is not the permuted row", rep);
            }
            memset(b, 0x55, sizeof b);
            cpu_avx2_quantize_row(x, K, b, eo);
            if (memcmp(a, b, sizeof a)) fail_msg("rep %d evenodd %d: AVX2 quantizer differs from the reference", rep, eo);
            if (cpu_level_hardware() < CPU_LEVEL_AVX512) continue;
            memset(b, 0x55, sizeof b);
            cpu_avx512_quantize_row(x, K, b, eo);
            if (memcmp(a, b, sizeof a)) fail_msg("rep %d evenodd %d: AVX-512 quantizer differs from the reference", rep, eo);
        }
    }
    if (cpu_level_hardware() < CPU_LEVEL_AVX512) print_message("no AVX-512 here: AVX2 quantizer checked only\n");
}

/* ---------- (3) errors ---------- */

static void test_invalid_weights_fail_cleanly(void **state) {
    uint8_t buf[1024] = {0};
    float x[256] = {0}, y[4];
    hearth_error err = {0};
    op_weight w = {.dtype = DT_Q4_K, .data = buf, .n = 1, .k = 100};
    assert_int_equal(op_weight_check(&w, "blk.0.ffn_up.weight", &err), HEARTH_ERR_FORMAT);
    assert_non_null(strstr(err.message, "blk.0.ffn_up.weight"));
    w = (op_weight){.dtype = DT_U32, .data = buf, .n = 1, .k = 64, .bits = 7, .group_size = 64, .sb_dtype = DT_F16,
                     .scales = buf, .biases = buf};
    assert_int_equal(cpu_matmul(&w, x, 1, y, NULL, 0, NULL, &err), HEARTH_ERR_UNSUPPORTED);
    w.bits = 4;
    w.group_size = 48;
    assert_int_equal(op_weight_check(&w, NULL, &err), HEARTH_ERR_UNSUPPORTED);
    w.group_size = 64;
    w.scales = NULL;
    assert_int_equal(op_weight_check(&w, NULL, &err), HEARTH_ERR_INVALID);
    w = (op_weight){.dtype = DT_I32, .data = buf, .n = 1, .k = 4};
    assert_int_equal(op_weight_check(&w, NULL, &err), HEARTH_ERR_UNSUPPORTED);
    w = (op_weight){.dtype = DT_F32, .data = NULL, .n = 1, .k = 4};
    assert_int_equal(op_weight_check(&w, NULL, &err), HEARTH_ERR_INVALID);
    w = (op_weight){.dtype = DT_F32, .data = buf, .n = -1, .k = 4};
    assert_int_equal(op_weight_check(&w, NULL, &err), HEARTH_ERR_INVALID);
    /* Too little scratch for the int8 activations is an error, not an overflow. */
    cpu_matmul_set_level(cpu_level_hardware());
    w = (op_weight){.dtype = DT_Q8_0, .data = buf, .n = 2, .k = 64};
    size_t need = cpu_matmul_scratch_size(&w, 2);
    if (need) {
        uint8_t scratch[512];
        assert_true(need <= sizeof scratch);
        assert_int_equal(cpu_matmul(&w, x, 2, y, scratch, need - 1, NULL, &err), HEARTH_ERR_INVALID);
        assert_int_equal(cpu_matmul(&w, x, 2, y, scratch, need, NULL, &err), HEARTH_OK);
    }
    assert_int_equal(cpu_matmul(&w, x, 0, y, NULL, 0, NULL, &err), HEARTH_OK);
    assert_int_equal(cpu_matmul(&w, x, -1, y, NULL, 0, NULL, &err), HEARTH_ERR_INVALID);
}

/* ---------- (4) the exact rescoring of the largest outputs (cpu_matmul_rescore_top) ---------- */

/* Whether row r is among the 16 largest of y[0..n) (ties broken towards the lower index,
 * as any choice among equal values gives the same rescored result only up to which one
 * is picked: the data here has none). */
static int in_top16(const float *y, int64_t n, int64_t r) {
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++) above += y[i] > y[r] || (y[i] == y[r] && i < r);
    return above < 16;
}

/* After the fast matmul, the 16 largest outputs of each row must be the reference kernel's
 * own bits (float activations, double sums) and every other output the fast value, for
 * each format whose kernel rounds the activations, at every fast level, T = 1 (decode: the
 * calling thread) and T = 5 (rows over the pool), N below and above 16; at the scalar level
 * and for float-activation kernels nothing changes. */
static void test_rescore_top_is_reference_exact(void **state) {
    static const wcase cases[] = {
        {"q8_0", DT_Q8_0, 0, 0, 0}, {"q4_1", DT_Q4_1, 0, 0, 0}, {"q4_k", DT_Q4_K, 0, 0, 0},
        {"q6_k", DT_Q6_K, 0, 0, 0}, {"bf16", DT_BF16, 0, 0, 0}, {"f32", DT_F32, 0, 0, 0},
        {"mlx4", DT_U32, 4, 64, DT_F16},
    };
    static const int64_t ns[] = {300, 9};
    static const int Ts[] = {1, 5};
    const int64_t k = 512;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t ni = 0; ni < 2; ni++)
            for (size_t ti = 0; ti < 2; ti++) {
                int64_t n = ns[ni];
                int T = Ts[ti];
                op_weight w;
                void *sb, *data = make_weight(&cases[ci], n, k, &w, &sb);
                float *x = malloc((size_t)(T * k) * sizeof *x), *ref = malloc((size_t)(T * n) * sizeof *ref);
                float *fast = malloc((size_t)(T * n) * sizeof *fast), *y = malloc((size_t)(T * n) * sizeof *y);
                for (int64_t i = 0; i < T * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
                for (int t = 0; t < T; t++) cpu_ref_rows(&w, 0, n, x + t * k, ref + t * n);
                for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
                    cpu_matmul_set_level((cpu_level)lv);
                    size_t ss = cpu_matmul_scratch_size(&w, T);
                    void *scratch = ss ? malloc(ss) : NULL;
                    hearth_error err = {0};
                    assert_int_equal(cpu_matmul(&w, x, T, fast, scratch, ss, pools[2], &err), HEARTH_OK);
                    memcpy(y, fast, (size_t)(T * n) * sizeof *y);
                    assert_int_equal(cpu_matmul_rescore_top(&w, x, T, y, pools[2], &err), HEARTH_OK);
                    int rounds_x = ss > 0; /* the kernel rounds the activations (int8 or bf16) */
                    int changed = 0;
                    for (int t = 0; t < T; t++)
                        for (int64_t r = 0; r < n; r++) {
                            int64_t i = t * n + r;
                            int exact = rounds_x && in_top16(fast + t * n, n, r);
                            float want = exact ? ref[i] : fast[i];
                            if (memcmp(&y[i], &want, sizeof want))
                                fail_msg("%s level %s N %lld T %d: y[%d][%lld] = %.9g, want the %s value %.9g (fast "
                                         "%.9g, reference %.9g)",
                                         cases[ci].name, cpu_level_name((cpu_level)lv), (long long)n, T, t,
                                         (long long)r, y[i], exact ? "reference" : "fast", want, fast[i], ref[i]);
                            changed += exact && fast[i] != ref[i];
                        }
                    /* the case must exercise something: the int8 kernels' values differ from the
                     * reference's in the last bits at least */
                    if (rounds_x && cases[ci].t != DT_BF16) assert_true(changed > 0);
                    free(scratch);
                }
                free(x), free(ref), free(fast), free(y), free(data), free(sb);
            }
    /* an invalid weight is an error, not a crash */
    hearth_error err = {0};
    float x[64] = {0}, y[2] = {0};
    op_weight bad = {.dtype = DT_Q4_K, .data = x, .n = 2, .k = 64};
    assert_int_equal(cpu_matmul_rescore_top(&bad, x, 1, y, NULL, &err), HEARTH_ERR_FORMAT);
}

/* cpu_matmul_precise (float activations for Q4_0 / Q4_1 / Q8_0): against the double-summed
 * reference within the float-summation bound (no int8 term: error_bound without it), and
 * far closer than the int8 kernel where the activations' rounding dominates; each token's
 * row the same bits at every T (1, 3, 9), invariant or not, one or two threads; the other
 * formats (Q4_K here) as cpu_matmul_fused gives them; the scalar tier the reference. */
static void test_precise_float_activations(void **state) {
    static const wcase cases[] = {{"q4_0", DT_Q4_0, 0, 0, 0}, {"q4_1", DT_Q4_1, 0, 0, 0}, {"q8_0", DT_Q8_0, 0, 0, 0},
                                  {"q4_k", DT_Q4_K, 0, 0, 0}};
    static const int Ts[] = {1, 3, 9};
    const int64_t n = 67, k = 512;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        op_weight w;
        void *sb, *data = make_weight(&cases[ci], n, k, &w, &sb);
        int has = cases[ci].t != DT_Q4_K;
        float *x = malloc((size_t)(9 * k) * sizeof *x), *ref = malloc((size_t)(9 * n) * sizeof *ref);
        float *y = malloc((size_t)(9 * n) * sizeof *y), *y1 = malloc((size_t)(9 * n) * sizeof *y1);
        float *f = malloc((size_t)(9 * n) * sizeof *f), *wrow = malloc((size_t)k * sizeof *wrow);
        for (int64_t i = 0; i < 9 * k; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
        for (int t = 0; t < 9; t++) cpu_ref_rows(&w, 0, n, x + t * k, ref + t * n);
        for (int lv = CPU_LEVEL_SCALAR; lv <= (int)cpu_level_hardware(); lv++) {
            cpu_matmul_set_level((cpu_level)lv);
            size_t ss = cpu_matmul_scratch_size(&w, 9);
            void *scratch = ss ? malloc(ss) : NULL;
            hearth_error err = {0};
            const op_weight *ws[1] = {&w};
            double err_precise = 0, err_int8 = 0;
            for (size_t ti = 0; ti < 3; ti++)
                for (int inv = 0; inv < 2; inv++)
                    for (int th = 1; th <= 2; th++) {
                        int T = Ts[ti];
                        float *ys[1] = {y};
                        assert_int_equal(cpu_matmul_precise(1, ws, ys, x, T, scratch, ss, pools[th], inv, &err),
                                         HEARTH_OK);
                        if (ti == 0 && inv == 0 && th == 1) memcpy(y1, y, (size_t)n * sizeof *y);
                        else if (has && memcmp(y, y1, (size_t)n * sizeof *y)) /* token 0 at every T, mode, pool */
                            fail_msg("%s %s T %d invariant %d threads %d: token 0 differs from T = 1",
                                     cases[ci].name, cpu_level_name((cpu_level)lv), T, inv, th);
                        if (!has || lv == CPU_LEVEL_SCALAR) { /* as the plain call */
                            float *fs[1] = {f};
                            assert_int_equal(cpu_matmul_fused(1, ws, fs, x, T, scratch, ss, pools[th], inv, &err),
                                             HEARTH_OK);
                            if (memcmp(y, f, (size_t)(T * n) * sizeof *y))
                                fail_msg("%s %s: differs from cpu_matmul_fused", cases[ci].name,
                                         cpu_level_name((cpu_level)lv));
                            continue;
                        }
                        for (int t = 0; t < T; t++)
                            for (int64_t r = 0; r < n; r++) {
                                op_weight_dequant(&w, r, 0, k, wrow);
                                double b = error_bound(wrow, x + t * k, k, 0), e = fabs(y[t * n + r] - ref[t * n + r]);
                                if (!(e <= b))
                                    fail_msg("%s %s T %d: y[%d][%lld] = %.9g, reference %.9g (bound %.3g)",
                                             cases[ci].name, cpu_level_name((cpu_level)lv), T, t, (long long)r,
                                             y[t * n + r], ref[t * n + r], b);
                                err_precise += e * e;
                            }
                    }
            if (has && lv > CPU_LEVEL_SCALAR) { /* the int8 kernel's error is far larger */
                assert_int_equal(cpu_matmul(&w, x, 9, f, scratch, ss, pools[2], &err), HEARTH_OK);
                for (int64_t i = 0; i < 9 * n; i++) err_int8 += (double)(f[i] - ref[i]) * (f[i] - ref[i]);
                /* mean squared error per token row: 52 precise rows (T 1 + 3 + 9, 4 modes), 9 int8 rows */
                if (!(err_precise / 52 * 10 < err_int8 / 9))
                    fail_msg("%s %s: precise squared error %.3g not far below int8's %.3g", cases[ci].name,
                             cpu_level_name((cpu_level)lv), err_precise, err_int8);
            }
            free(scratch);
        }
        free(x), free(ref), free(y), free(y1), free(f), free(wrow), free(data), free(sb);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_dequant_matches_fixtures),
        cmocka_unit_test(test_gguf_and_dense_formats),
        cmocka_unit_test(test_mlx_affine),
        cmocka_unit_test(test_prefill_tiles_long_k),
        cmocka_unit_test(test_k_quants_beyond_staged_k),
        cmocka_unit_test(test_avx512_decode_rows_staged_k),
        cmocka_unit_test(test_avx2_decode_rows_match_tiles),
        cmocka_unit_test(test_small_tiles_every_t),
        cmocka_unit_test(test_bf16_dot_kernels),
        cmocka_unit_test(test_dense_tiles_match_rows),
        cmocka_unit_test(test_fused_matches_separate),
        cmocka_unit_test(test_quantize_row_matches_reference),
        cmocka_unit_test(test_invalid_weights_fail_cleanly),
        cmocka_unit_test(test_rescore_top_is_reference_exact),
        cmocka_unit_test(test_precise_float_activations),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
