/* test_cuda.c: every CUDA kernel against its CPU reference (backend/cpu scalar matmul
 * reference, backend/cpu/cpu_ops.c) on fresh random inputs with odd shapes; outputs are poisoned
 * with NaN first so an unwritten element fails. Where no GPU exists it says loudly that
 * the device tests did NOT run (exit 0 so `make test` stays green on GPU-less CI) and
 * only checks that the no-device paths fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_affine.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_plan.h"
#include "base/half.h"
#include "base/threadpool.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { /* xorshift64*, reseeded from the clock in main: fresh inputs each run */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* Device buffer from host floats (or NaN-poisoned when host is NULL). */
static void *dev_from(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cuda_alloc(&d, bytes, "test buffer", NULL), HEARTH_OK);
    if (host) {
        assert_int_equal(cuda_upload(d, host, bytes, NULL), HEARTH_OK);
    } else {
        float *nan = malloc(bytes);
        for (size_t i = 0; i < bytes / sizeof(float); i++) nan[i] = NAN;
        assert_int_equal(cuda_upload(d, nan, bytes, NULL), HEARTH_OK);
        free(nan);
    }
    return d;
}
static float *download(const void *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    hearth_error e = {0};
    assert_int_equal(cuda_sync(&e), HEARTH_OK);
    assert_int_equal(cuda_download(h, d, n * sizeof *h, &e), HEARTH_OK);
    return h;
}

/* ---------- GEMV ---------- */

/* Random bytes for the quant fields (every nibble/byte pattern occurs) with finite f16
 * scales written at the format's scale offsets, as test_cpu_matmul does. */
static int mlx_bits = 4;                /* MLX weights (DT_U32): the bits, */
static int mlx_group = 64;              /* the group size and */
static tensor_dtype mlx_sb = DT_BF16;    /* scale/bias type the next make_weight uses */
static float mlx_bias_max;               /* max |bias| of the last MLX weight made */
static int aff_f32act;                  /* check_matmul: DT_AFFINE weights on their float kernel */

/* MLX affine (mlx_bits): random words, scales in [0, 0.05) and biases in [-0.4, 0.4) in
 * mlx_sb (f16, bf16 or f32), all in one allocation (words, then scales, then biases). */
static void *make_mlx4(int64_t n, int64_t k, op_weight *w) {
    size_t words = (size_t)(n * k / 32 * mlx_bits), groups = (size_t)(n * (k / mlx_group));
    size_t es = mlx_sb == DT_F32 ? 4 : 2;
    uint8_t *d = malloc(words * 4 + 2 * es * groups);
    for (size_t i = 0; i < words * 4; i++) d[i] = (uint8_t)rnd();
    uint8_t *sc = d + words * 4, *bi = sc + es * groups;
    mlx_bias_max = 0.0f;
    for (size_t g = 0; g < groups; g++) {
        float s = (rndf() + 1.0f) * 0.025f, b = rndf() * 0.4f;
        if (mlx_sb == DT_F32) {
            memcpy(sc + 4 * g, &s, 4);
            memcpy(bi + 4 * g, &b, 4);
        } else {
            uint16_t hs = mlx_sb == DT_F16 ? f32_to_f16(s) : f32_to_bf16(s);
            uint16_t hb = mlx_sb == DT_F16 ? f32_to_f16(b) : f32_to_bf16(b);
            memcpy(sc + 2 * g, &hs, 2);
            memcpy(bi + 2 * g, &hb, 2);
        }
        mlx_bias_max = fmaxf(mlx_bias_max, fabsf(b) * 1.01f); /* 1.01: the 16-bit rounding */
    }
    *w = (op_weight){.dtype = DT_U32, .data = d, .n = n, .k = k, .bits = mlx_bits, .group_size = mlx_group,
                      .sb_dtype = mlx_sb, .scales = sc, .biases = bi};
    return d;
}

static void *make_weight(tensor_dtype t, int64_t n, int64_t k, op_weight *w) {
    if (t == DT_U32) return make_mlx4(n, k, w);
    *w = (op_weight){.dtype = t, .n = n, .k = k};
    int64_t bb = tensor_dtype_block_bytes(t),
            be = tensor_dtype_block_elems(t);
    size_t bytes = (size_t)(n * (k / be) * bb);
    uint8_t *d = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)rnd();
    if (t == DT_F32)
        for (int64_t i = 0; i < n * k; i++) ((float *)d)[i] = rndf();
    if (t == DT_F16 || t == DT_BF16)
        for (int64_t i = 0; i < n * k; i++)
            ((uint16_t *)d)[i] = t == DT_F16 ? f32_to_f16(rndf()) : f32_to_bf16(rndf());
    for (size_t b = 0; (t == DT_Q8_0 || t == DT_Q4_K) && b < bytes / (size_t)bb; b++)
        for (int j = 0; j < (t == DT_Q4_K ? 2 : 1); j++) { /* Q8_0: d at 0; Q4_K: d at 0, dmin at 2 */
            uint16_t h = f32_to_f16(rndf() * 0.05f);
            memcpy(d + b * bb + 2 * j, &h, 2);
        }
    if (t == DT_Q4_0 || t == DT_Q4_1) mlx_bias_max = 0.0f; /* the bias of the MLX form they are uploaded in */
    for (size_t b = 0; (t == DT_Q4_0 || t == DT_Q4_1) && b < bytes / (size_t)bb; b++) {
        float dv = rndf() * 0.05f, mv = rndf() * 0.4f; /* Q4_0: d at 0 (bias -8 d); Q4_1: d at 0, m at 2 */
        uint16_t h = f32_to_f16(dv), hm = f32_to_f16(mv);
        memcpy(d + b * bb, &h, 2);
        if (t == DT_Q4_1) memcpy(d + b * bb + 2, &hm, 2);
        mlx_bias_max = fmaxf(mlx_bias_max, t == DT_Q4_1 ? fabsf(f16_to_f32(hm)) : 8.0f * fabsf(f16_to_f32(h)));
    }
    /* the formats of the generic affine layout: d (and dmin / m) at these offsets */
    static const int aff_off[][2] = {[DT_Q5_0] = {0, -1}, [DT_Q5_1] = {0, 2}, [DT_Q2_K] = {80, 82},
                                     [DT_Q3_K] = {108, -1}, [DT_Q5_K] = {0, 2}};
    int aff = t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q2_K || t == DT_Q3_K || t == DT_Q5_K;
    for (size_t b = 0; aff && b < bytes / (size_t)bb; b++)
        for (int j = 0; j < 2; j++)
            if (aff_off[t][j] >= 0) {
                uint16_t h = f32_to_f16(rndf() * 0.05f);
                memcpy(d + b * bb + aff_off[t][j], &h, 2);
            }
    for (size_t b = 0; t == DT_Q6_K && b < bytes / (size_t)bb; b++) { /* Q6_K: d at 208 (scales: random int8) */
        uint16_t h = f32_to_f16(rndf() * 0.05f);
        memcpy(d + b * bb + 208, &h, 2);
    }
    w->data = d;
    return d;
}

/* max |bias| of a weight the device keeps in the generic affine layout (the kernels sum
 * scale · codes and bias · x apart, so the summation error scales with it), or 0. */
static float affine_bias_max(const op_weight *w) {
    int bits, group;
    if (!cuda_affine_takes(w, &bits, &group) || (w->dtype == DT_U32 && w->bits == 4)) return 0.0f;
    uint8_t *codes = malloc((size_t)w->k);
    float *sb = malloc((size_t)(w->k / group) * 2 * sizeof(float)), m = 0.0f;
    for (int64_t r = 0; r < w->n; r++) {
        cuda_affine_row(w, r, bits, group, codes, sb);
        for (int64_t g = 0; g < w->k / group; g++) m = fmaxf(m, fabsf(sb[2 * g + 1]));
    }
    free(codes), free(sb);
    return m;
}

/* The int8-activation GEMVs (cuda_gemv_int8_act: Q8_0, Q4_K, Q6_K) compute W · x̂, x̂ = d·q
 * per block of 32 by the CPU fast path's own quantizer, cpu_quantize_row_ref: the
 * reference is the scalar CPU reference applied to that x̂ (xh). The device rounds with the
 * same IEEE operations (max|x|/127, 1/d, x·(1/d), round half even), so every q should
 * agree; *dmax (the largest block d) lets the tolerance absorb two elements off by one step
 * anyway. A wrong block, scale or nibble errs by far more (about |w|·|x| per element). */
static void int8_act_ref(const float *x, int64_t k, float *xh, float *dmax) {
    cpu_q8_block *b = malloc((size_t)(k / 32) * sizeof *b);
    cpu_quantize_row_ref(x, k, b, 0);
    for (int64_t i = 0; i < k; i++) {
        xh[i] = b[i / 32].d * (float)b[i / 32].q[i % 32];
        *dmax = fmaxf(*dmax, b[i / 32].d);
    }
    free(b);
}

/* gemm: NULL tests cuda_gemv; else cuda_matmul through it (cuBLAS for T >= 9). bf16: the
 * GEMM rounds its operands to bf16. */
static void check_matmul(tensor_dtype t, int64_t n, int64_t k, int T, cuda_gemm *gemm, int bf16);
static void check_gemv(tensor_dtype t, int64_t n, int64_t k, int T) { check_matmul(t, n, k, T, NULL, 0); }

/* y[T][n] of weight w (format t) against ref (the CPU reference on the activations x the
 * kernel multiplied), with the tolerance derived below. dmax >= 0: int8 activations with
 * that largest block scale; bf16: the GEMM rounded its operands to bf16. */
static void verify_gemv(tensor_dtype t, const op_weight *w, int64_t n, int64_t k, int T, const float *x,
                        const float *ref, const float *y, float dmax, int bf16, const char *what) {
    int i8 = dmax >= 0.0f;
    float *row = malloc((size_t)k * sizeof *row), abias = affine_bias_max(w);
    for (int64_t r = 0; r < n; r++) {
        float wmax = 0.0f;
        int step = t == DT_U32 ? 16 : 256; /* one op_weight_dequant call stays inside one MLX group */
        for (int64_t k0 = 0; k0 < k; k0 += step) {
            int cnt = k - k0 < step ? (int)(k - k0) : step;
            if (t == DT_F32) {
                memcpy(row + k0, (const float *)w->data + r * k + k0, (size_t)cnt * sizeof(float));
            } else if (t == DT_F16 || t == DT_BF16) {
                for (int i = 0; i < cnt; i++) {
                    uint16_t h = ((const uint16_t *)w->data)[r * k + k0 + i];
                    row[k0 + i] = t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
                }
            } else {
                op_weight_dequant(w, r, k0, cnt, row + k0);
            }
        }
        for (int64_t i = 0; i < k; i++) wmax = fmaxf(wmax, fabsf(row[i]));
        for (int tt = 0; tt < T; tt++) {
            double sx = 0;
            for (int64_t i = 0; i < k; i++) sx += fabs(x[tt * k + i]);
            /* Serial float32 summation of m terms errs by at most m·eps·Σ|terms|. Each GPU
             * lane sums about k/32 partial dots of <= 32 products, then a 5-level warp tree;
             * the terms (including Q4_K's d·sc·q and dmin·m parts) are each <= 2·max|w|·|x|.
             * The CPU reference sums in double, so its own error is negligible. */
            /* MLX: the kernel sums s·q·x and b·x apart, each term <= (max|w| + max|b|)·|x|. */
            /* GGUF Q4_0 / Q4_1 go to the device as MLX 4-bit (bias -8 d / m): the same. */
            /* The generic affine layout (cuda_affine.h): the same, with its biases. */
            double wt = t == DT_U32 || t == DT_Q4_0 || t == DT_Q4_1 ? wmax + mlx_bias_max : wmax + abias;
            double tol = (double)(k / 32 + 32 + 5) * FLT_EPSILON * 2.0 * wt * sx + 1e-30;
            /* bf16 GEMM: each operand is rounded to bf16 (relative 2^-9 each), so each
             * product errs by <= 2^-8 of |w||x|; cuBLAS accumulates in f32 (k·eps, as above). */
            if (bf16) tol += (1.0 / 256.0) * wmax * sx;
            if (i8) tol += 2.0 * wmax * dmax;
            float g = y[tt * n + r], c = ref[tt * n + r];
            if (!(fabs((double)g - c) <= tol))
                fail_msg("%s %s n=%lld k=%lld T=%d: y[%d][%lld] = %.9g, reference %.9g (tol %.3g)",
                         what, tensor_dtype_name(t), (long long)n, (long long)k, T, tt, (long long)r, g, c, tol);
        }
    }
    free(row);
}

static void check_matmul(tensor_dtype t, int64_t n, int64_t k, int T, cuda_gemm *gemm, int bf16) {
    op_weight w;
    void *host = make_weight(t, n, k, &w);
    float *x = malloc((size_t)(T * k) * sizeof *x), *ref = malloc((size_t)(T * n) * sizeof *ref);
    for (int64_t i = 0; i < T * k; i++) x[i] = rndf();

    cuda_weight dw;
    hearth_error e = {0};
    assert_int_equal(cuda_weight_upload(&dw, &w, "test weight", &e), HEARTH_OK);
    if (dw.dtype == DT_AFFINE) dw.aff_f32act = aff_f32act;
    float *dx = dev_from(x, (size_t)(T * k) * sizeof *x), *dy = dev_from(NULL, (size_t)(T * n) * sizeof(float));
    /* MMQ: the tensor-core kernel, int8 x as the GEMV */
    int mmq = gemm && cuda_matmul_uses_mmq(gemm, &dw, T);
    int via_gemv = !mmq && (!gemm || cuda_matmul_uses_gemv(gemm, &dw, T)); /* T < 9, or the byte model's pick */
    int i8 = cuda_gemv_int8_act(&dw) && (via_gemv || mmq);
    if (via_gemv || mmq) bf16 = 0; /* the GEMV multiplies the stored weight (int8 x where i8) */
    unsigned long mmq_before = cuda_mmq_launch_count();
    float dmax = 0.0f;
    if (i8) /* the reference sees the activations the kernel multiplies (int8_act_ref) */
        for (int tt = 0; tt < T; tt++) int8_act_ref(x + tt * k, k, x + tt * k, &dmax);
    for (int tt = 0; tt < T; tt++) cpu_ref_rows(&w, 0, n, x + tt * k, ref + tt * n);
    if (gemm) assert_int_equal(cuda_matmul(gemm, &dw, dx, T, dy, &e), HEARTH_OK);
    else assert_int_equal(cuda_gemv(&dw, dx, T, dy, &e), HEARTH_OK);
    float *y = download(dy, (size_t)(T * n));
    /* cuda_matmul_uses_mmq promised the MMQ kernel: exactly one launch of it, no fallback */
    if (mmq) assert_int_equal(cuda_mmq_launch_count() - mmq_before, 1);

    verify_gemv(t, &w, n, k, T, x, ref, y, i8 ? dmax : -1.0f, bf16, mmq ? "mmq" : "gemv");
    free(y);
    cuda_free(dx);
    cuda_free(dy);
    cuda_weight_free(&dw);
    free(x);
    free(ref);
    free(host);
}

static void test_gemv(void **state) {
    (void)state;
    static const int Ts[] = {1, 2, 3, 5, 8, 11};
    static const struct { tensor_dtype t; int64_t n, k; } shapes[] = {
        {DT_BF16, 37, 200}, {DT_BF16, 19, 77},   {DT_BF16, 301, 4096}, /* 77: unaligned rows, scalar path */
        {DT_F16, 37, 200},  {DT_F16, 19, 77},    {DT_F16, 129, 2048},
        {DT_Q8_0, 37, 96},  {DT_Q8_0, 301, 4096}, {DT_Q8_0, 5, 32},
        {DT_Q4_K, 37, 256}, {DT_Q4_K, 129, 2304}, {DT_Q4_K, 3, 1280},
        {DT_Q6_K, 37, 256}, {DT_Q6_K, 129, 2304}, {DT_Q6_K, 3, 1280}, {DT_Q6_K, 5, 4096},
        /* int8-activation kernels: k = 14336 (an 8B's ffn), and n large enough for 2 and 4
         * rows per warp (4229: 2 rows, 8467 / 8461: 4 rows, with a partial last warp) */
        {DT_Q8_0, 37, 14336}, {DT_Q4_K, 129, 14336}, {DT_Q6_K, 37, 14336},
        {DT_Q8_0, 4229, 256},  {DT_Q4_K, 8467, 512},  {DT_Q6_K, 8461, 256},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) check_gemv(shapes[s].t, shapes[s].n, shapes[s].k, Ts[i]);
    /* MLX affine 4-bit: groups of 32, 64 and 128, bf16 and f16 scales, rows of one group
     * up to 4096 columns (past the kernel's four-loads-in-flight loop) */
    static const struct { int gs; tensor_dtype sb; int64_t n, k; } mlx[] = {
        {64, DT_BF16, 37, 64}, {64, DT_BF16, 301, 4096}, {32, DT_F16, 19, 96}, {128, DT_F16, 129, 2048},
        {64, DT_F16, 5, 4160},
    };
    for (size_t s = 0; s < sizeof mlx / sizeof mlx[0]; s++) {
        mlx_group = mlx[s].gs;
        mlx_sb = mlx[s].sb;
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) check_gemv(DT_U32, mlx[s].n, mlx[s].k, Ts[i]);
    }
    mlx_group = 64;
    mlx_sb = DT_BF16;
}

/* Q4_K uploaded with the packed scale order (every upload) and decoded by the int8 GEMVs
 * (gemv_v2_q4_k; gemv_q4_k_i8p (4 lanes per super-block, rows per warp by
 * q4k_rows). Same oracle and tolerance as test_gemv's Q4_K rows (verify_gemv: int8
 * activations by cpu_quantize_row_ref, float summation bound + 2·max|w|·max d); shapes
 * cover n = 1 (one partial warp), 37, 1024 (the 8B's k/v), 4229 (odd, 2 rows per warp at
 * k = 4096), k = 256 (one super-block, R = 4 rows), 4096 (2 slot steps) and 14336 (7).
 * Also the prefill path (cuda_matmul, T = 11: the dequantizer must read the packed order). */
static void test_gemv_q4k_new(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 37, 1024, 4229}, ks[] = {256, 4096, 14336};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++)
            for (int T = 1; T <= 8; T++) {
                if (ns[a] * ks[b] > 4096 * 4096 && T != 1 && T != 2 && T != 5 && T != 8) continue; /* CPU time */
                check_gemv(DT_Q4_K, ns[a], ks[b], T);
            }
    op_weight w;
    void *host = make_weight(DT_Q4_K, 3, 512, &w);
    cuda_weight dw;
    hearth_error e = {0};
    assert_int_equal(cuda_weight_upload(&dw, &w, "q4k", &e), HEARTH_OK);
    assert_int_equal(dw.q4k_packed, 1);              /* the order the int8 kernels read */
    assert_int_equal(dw.bytes, (size_t)3 * 2 * 144); /* same bytes as GGUF (cuda_plan.c) */
    cuda_weight_free(&dw);
    free(host);
    cuda_gemm *g = NULL;
    assert_int_equal(cuda_gemm_create(&g, (size_t)301 * 4096, (size_t)16 * 4096, 1, &e), HEARTH_OK);
    check_matmul(DT_Q4_K, 301, 4096, 11, g, 0);
    check_matmul(DT_Q4_K, 37, 256, 9, g, 0);
    cuda_gemm_free(g);
}

/* The prefill dequantizers (cuda_dequant_bf16: the flat eight-per-thread kernels of Q8_0,
 * Q4_K (packed scale order) and Q6_K; the chunked MLX 4-bit kernel; the generic kernel for
 * MLX 4-bit in MLX's order) against the CPU reference dequantizer rounded to
 * bf16. Tolerance: one bf16 step of the value (2^-8 relative) plus 2^-24, because the
 * device may fuse d*s*q - dmin*m into one FMA where the reference rounds twice; a wrong
 * block, sub-block scale or nibble is off by a whole quant step (about 6% of the range). */
static void check_dequant(tensor_dtype t, int64_t n, int64_t k, int mlx_tiled) {
    op_weight w;
    void *host = make_weight(t, n, k, &w);
    cuda_weight dw;
    hearth_error e = {0};
    assert_int_equal(cuda_weight_upload(&dw, &w, "dequant weight", &e), HEARTH_OK);
    if (t == DT_Q4_K) assert_int_equal(dw.q4k_packed, 1);
    if (t == DT_U32) assert_int_equal(dw.mlx_tiled, mlx_tiled); /* the layout (and kernel) under test */
    size_t nk = (size_t)(n * k);
    void *dout = dev_from(NULL, nk * 2);
    assert_int_equal(cuda_dequant_bf16(&dw, dout, &e), HEARTH_OK);
    uint16_t *got = malloc(nk * 2);
    assert_int_equal(cuda_download(got, dout, nk * 2, &e), HEARTH_OK);
    float *ref = malloc((size_t)k * sizeof *ref);
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        int step = t == DT_U32 ? 16 : 256; /* one op_weight_dequant call stays inside one MLX group */
        for (int64_t c0 = 0; c0 < k; c0 += step) op_weight_dequant(&w, r, c0, (int)(k - c0 < step ? k - c0 : step), ref + c0);
        for (int64_t c = 0; c < k; c++) {
            uint32_t u = (uint32_t)got[r * k + c] << 16;
            float g, want = bf16_to_f32(f32_to_bf16(ref[c]));
            memcpy(&g, &u, 4);
            if (fabsf(g - want) > fabsf(want) * 0x1p-8f + 0x1p-24f && bad++ < 5)
                print_error("dequant %s [%lld x %lld]: (%lld, %lld) = %g, reference %g\n", tensor_dtype_name(t),
                            (long long)n, (long long)k, (long long)r, (long long)c, g, want);
        }
    }
    assert_int_equal(bad, 0);
    free(ref);
    free(got);
    cuda_free(dout);
    cuda_weight_free(&dw);
    free(host);
}

static void test_dequant(void **state) {
    (void)state;
    check_dequant(DT_Q8_0, 37, 96, 0);
    check_dequant(DT_Q8_0, 3, 4128, 0);
    check_dequant(DT_Q4_K, 37, 256, 0);
    check_dequant(DT_Q4_K, 5, 2304, 0);
    check_dequant(DT_Q6_K, 37, 512, 0);
    check_dequant(DT_Q6_K, 3, 4352, 0);
    /* MLX 4-bit: k % 64 == 0 and k >= 512 in the chunked layout (its own kernel, a partial
     * last slot at 640) and shorter rows in MLX's order; groups 64, 32 and 128; bf16 and f16
     * scales */
    static const int groups[] = {64, 32, 128};
    static const tensor_dtype sbs[] = {DT_BF16, DT_F16, DT_BF16};
    for (int gi = 0; gi < 3; gi++) {
        mlx_group = groups[gi], mlx_sb = sbs[gi];
        check_dequant(DT_U32, 37, 2048, 2);
        check_dequant(DT_U32, 5, 3072, 2);
        check_dequant(DT_U32, 3, 640, 2);
        check_dequant(DT_U32, 3, 384, 0);
    }
    mlx_group = 64, mlx_sb = DT_BF16;
}

/* F16 / BF16 weights at 2..8 rows: cuBLAS as stored
 * (cuda_matmul_small_direct), not the multi-row GEMV; checked against the CPU reference
 * like the prefill sizes. */
static void test_matmul_small_direct(void **state) {
    (void)state;
    cuda_gemm *g = NULL;
    assert_int_equal(cuda_gemm_create(&g, 300 * 4096, 8 * 4096, 0, NULL), HEARTH_OK);
    static const int Ts[] = {2, 3, 5, 8};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        cuda_weight probe = {.dtype = DT_F16};
        assert_true(cuda_matmul_small_direct(g, &probe, Ts[i])); /* else this tested the GEMV */
        check_matmul(DT_F16, 129, 2048, Ts[i], g, 1);
        check_matmul(DT_BF16, 37, 200, Ts[i], g, 1);
        check_matmul(DT_BF16, 300, 4096, Ts[i], g, 1);
    }
    cuda_gemm_free(g);
}

/* Programmatic Dependent Launch (the decode GEMVs may start before the kernel before them
 * ends): ITERS rounds of add_rmsnorm -> GEMV W1 -> GEMV W2 (W2's input is W1's output)
 * enqueued with no host sync, every intermediate in its own NaN-poisoned buffer, so a GEMV
 * reading its input early (or a quantize_x overwriting activations still in use) shows as
 * NaN or a wrong row. Each GEMV is checked against the CPU reference on the input the GPU
 * produced (check_matmul's tolerance), the norm against ops_rmsnorm (test_rmsnorm's). */
static void check_chain(tensor_dtype t, int64_t n1, int64_t k, int T, int pdl) {
    enum { ITERS = 2 };
    const int64_t n2 = 37;
    op_weight w1, w2;
    void *h1 = make_weight(t, n1, k, &w1);
    float bias1 = mlx_bias_max; /* verify_gemv reads one bound for both MLX weights */
    void *h2 = make_weight(t, n2, n1, &w2);
    mlx_bias_max = fmaxf(mlx_bias_max, bias1);
    cuda_weight d1, d2;
    hearth_error e = {0};
    assert_int_equal(cuda_weight_upload(&d1, &w1, "chain w1", &e), HEARTH_OK);
    assert_int_equal(cuda_weight_upload(&d2, &w2, "chain w2", &e), HEARTH_OK);
    size_t nx = (size_t)T * k;
    float *x = malloc(nx * 4), *g = malloc((size_t)k * 4), *delta[ITERS], *dd[ITERS], *dxn[ITERS], *dy1[ITERS],
          *dy2[ITERS];
    for (size_t i = 0; i < nx; i++) x[i] = rndf();
    for (int64_t i = 0; i < k; i++) g[i] = rndf();
    float *dx = dev_from(x, nx * 4), *dg = dev_from(g, (size_t)k * 4);
    for (int it = 0; it < ITERS; it++) {
        delta[it] = malloc(nx * 4);
        for (size_t i = 0; i < nx; i++) delta[it][i] = rndf();
        dd[it] = dev_from(delta[it], nx * 4);
        dxn[it] = dev_from(NULL, nx * 4);
        dy1[it] = dev_from(NULL, (size_t)T * n1 * 4);
        dy2[it] = dev_from(NULL, (size_t)T * n2 * 4);
    }
    cuda_gemv_force_pdl(pdl);
    for (int it = 0; it < ITERS; it++) {
        assert_int_equal(cuda_add_rmsnorm(dxn[it], dx, dd[it], dg, 0.0f, T, (int)k, 1e-6f, &e), HEARTH_OK);
        assert_int_equal(cuda_gemv(&d1, dxn[it], T, dy1[it], &e), HEARTH_OK);
        assert_int_equal(cuda_gemv(&d2, dy1[it], T, dy2[it], &e), HEARTH_OK);
    }
    cuda_gemv_force_pdl(-1);
    char what[64];
    float *ref = malloc((size_t)T * (n1 > k ? n1 : k) * 4);
    for (int it = 0; it < ITERS; it++) {
        for (size_t i = 0; i < nx; i++) x[i] += delta[it][i]; /* the same float add as the kernel */
        float *xn = download(dxn[it], nx), *y1 = download(dy1[it], (size_t)T * n1),
              *y2 = download(dy2[it], (size_t)T * n2);
        ops_rmsnorm(ref, x, g, 0.0f, T, (int)k, 1e-6f);
        for (size_t i = 0; i < nx; i++)
            if (!(fabsf(xn[i] - ref[i]) <= 1e-4f * fabsf(ref[i]) + 1e-7f)) /* test_rmsnorm's bound */
                fail_msg("chain %s pdl=%d round %d: xn[%zu] = %.9g, reference %.9g", tensor_dtype_name(t), pdl, it, i,
                         xn[i], ref[i]);
        const cuda_weight *dws[2] = {&d1, &d2};
        const op_weight *ws[2] = {&w1, &w2};
        float *ins[2] = {xn, y1}, *outs[2] = {y1, y2};
        int64_t ns[2] = {n1, n2}, ks[2] = {k, n1};
        for (int s = 0; s < 2; s++) {
            float dmax = -1.0f;
            if (cuda_gemv_int8_act(dws[s])) {
                dmax = 0.0f;
                for (int tt = 0; tt < T; tt++) int8_act_ref(ins[s] + tt * ks[s], ks[s], ins[s] + tt * ks[s], &dmax);
            }
            for (int tt = 0; tt < T; tt++) cpu_ref_rows(ws[s], 0, ns[s], ins[s] + tt * ks[s], ref + tt * ns[s]);
            snprintf(what, sizeof what, "chain pdl=%d round %d gemv %d", pdl, it, s + 1);
            verify_gemv(t, ws[s], ns[s], ks[s], T, ins[s], ref, outs[s], dmax, 0, what);
        }
        free(xn);
        free(y1);
        free(y2);
        free(delta[it]);
        cuda_free(dd[it]);
        cuda_free(dxn[it]);
        cuda_free(dy1[it]);
        cuda_free(dy2[it]);
    }
    free(ref);
    cuda_free(dx);
    cuda_free(dg);
    cuda_weight_free(&d1);
    cuda_weight_free(&d2);
    free(x);
    free(g);
    free(h1);
    free(h2);
}

static int pdl_capable; /* device 0 is sm_90+ (set in main) */

static void test_gemv_pdl_chain(void **state) {
    (void)state;
    static const int Ts[] = {1, 8, 3}; /* PDL on: T = 1 and 8; off (and on pre-sm_90 GPUs): T = 3 */
    for (int pdl = pdl_capable; pdl >= 0; pdl--)
        for (size_t i = pdl ? 0 : 2; i < (pdl ? 2u : 3u); i++) {
            check_chain(DT_BF16, 1280, 4096, Ts[i], pdl);
            check_chain(DT_Q8_0, 1280, 4096, Ts[i], pdl);
            check_chain(DT_Q4_K, 1280, 4096, Ts[i], pdl);
            check_chain(DT_Q6_K, 1280, 4096, Ts[i], pdl);
            check_chain(DT_U32, 2048, 4096, Ts[i], pdl); /* MLX 4-bit, group 64, tiled kernel (k % 1024) */
        }
}

/* cuda_gemv_multi: q/k/v-like weights of one input in one launch (BF16 and F16, rows of
 * 4096 and odd counts) and the per-weight fallback (mixed formats), against the CPU
 * reference with check_matmul's tolerance. */
static void check_multi(tensor_dtype t0, tensor_dtype t2, int64_t k, int T) {
    const int64_t ns[3] = {37, 9, 11};
    op_weight w[3];
    void *host[3];
    cuda_weight dw[3];
    hearth_error e = {0};
    float *x = malloc((size_t)(T * k) * sizeof *x), *dy[3];
    for (int64_t i = 0; i < T * k; i++) x[i] = rndf();
    for (int i = 0; i < 3; i++) {
        host[i] = make_weight(i == 2 ? t2 : t0, ns[i], k, &w[i]);
        assert_int_equal(cuda_weight_upload(&dw[i], &w[i], "multi", &e), HEARTH_OK);
        dy[i] = dev_from(NULL, (size_t)(T * ns[i]) * sizeof(float));
    }
    float *dx = dev_from(x, (size_t)(T * k) * sizeof *x);
    const cuda_weight *ws[3] = {&dw[0], &dw[1], &dw[2]};
    assert_int_equal(cuda_gemv_multi(ws, dy, 3, dx, T, &e), HEARTH_OK);
    /* Weights of one format share a launch (rows numbered across them): each output must be
     * bit for bit what the weight gives in a launch of its own (the same per-row arithmetic),
     * so a wrong segment boundary, pointer or output stride shows as a differing bit. */
    for (int i = 0; i < 3; i++) {
        float *alone = dev_from(NULL, (size_t)(T * ns[i]) * sizeof(float));
        assert_int_equal(cuda_gemv(&dw[i], dx, T, alone, &e), HEARTH_OK);
        float *a = download(dy[i], (size_t)(T * ns[i])), *b = download(alone, (size_t)(T * ns[i]));
        for (int64_t j = 0; j < T * ns[i]; j++)
            if (memcmp(&a[j], &b[j], 4))
                fail_msg("gemv_multi %s/%s k=%lld T=%d weight %d: y[%lld] = %.9g, alone %.9g", tensor_dtype_name(t0),
                         tensor_dtype_name(t2), (long long)k, T, i, (long long)j, a[j], b[j]);
        free(a);
        free(b);
        cuda_free(alone);
    }
    int i8 = cuda_gemv_int8_act(&dw[0]) && cuda_gemv_int8_act(&dw[2]); /* as check_matmul */
    float dmax = 0.0f;
    if (i8)
        for (int tt = 0; tt < T; tt++) int8_act_ref(x + tt * k, k, x + tt * k, &dmax);
    float *row = malloc((size_t)k * sizeof *row), *ref = malloc((size_t)T * 64 * sizeof *ref);
    for (int i = 0; i < 3; i++) {
        float *y = download(dy[i], (size_t)(T * ns[i]));
        for (int tt = 0; tt < T; tt++) cpu_ref_rows(&w[i], 0, ns[i], x + tt * k, ref + tt * ns[i]);
        for (int64_t r = 0; r < ns[i]; r++) {
            float wmax = 0.0f;
            for (int64_t k0 = 0; k0 < k; k0 += 256) op_weight_dequant(&w[i], r, k0, k - k0 < 256 ? (int)(k - k0) : 256, row + k0);
            for (int64_t c = 0; c < k; c++) wmax = fmaxf(wmax, fabsf(row[c]));
            for (int tt = 0; tt < T; tt++) {
                double sx = 0;
                for (int64_t c = 0; c < k; c++) sx += fabs(x[tt * k + c]);
                double tol = (double)(k / 32 + 32 + 5) * FLT_EPSILON * 2.0 * wmax * sx + 1e-30;
                if (i8) tol += 2.0 * wmax * dmax;
                float g = y[tt * ns[i] + r], c = ref[tt * ns[i] + r];
                if (!(fabs((double)g - c) <= tol))
                    fail_msg("gemv_multi %s/%s k=%lld T=%d weight %d row %lld: %.9g, reference %.9g", tensor_dtype_name(t0),
                             tensor_dtype_name(t2), (long long)k, T, i, (long long)r, g, c);
            }
        }
        free(y);
        cuda_free(dy[i]);
        cuda_weight_free(&dw[i]);
        free(host[i]);
    }
    free(row);
    free(ref);
    cuda_free(dx);
    free(x);
}

static void test_gemv_multi(void **state) {
    (void)state;
    static const int Ts[] = {1, 3, 8, 11};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        check_multi(DT_BF16, DT_BF16, 4096, Ts[i]);
        check_multi(DT_F16, DT_F16, 200, Ts[i]);
        check_multi(DT_Q4_K, DT_Q6_K, 512, Ts[i]);  /* Q4_K_M's mixed q/k/v: q and k share a launch, v its own */
        check_multi(DT_Q4_K, DT_Q4_K, 4096, Ts[i]); /* all three in one v2 launch */
        check_multi(DT_U32, DT_U32, 4096, Ts[i]);   /* MLX 4-bit, tiled: one v2 launch */
        mlx_group = 32;
        check_multi(DT_U32, DT_U32, 2048, Ts[i]);
        mlx_group = 64;
        check_multi(DT_Q8_0, DT_Q8_0, 1024, Ts[i]);
        check_multi(DT_Q6_K, DT_Q6_K, 512, Ts[i]);
    }
}

/* Deterministic mode runs every matmul through cuda_gemv (and q/k/v, gate/up through
 * cuda_gemv_multi) whatever the step's T: a row's output must not depend on how many rows
 * share the launch (chunks of 8, 4, 3, 2, 1), so 13 rows together equal each row alone, bit
 * for bit, in every weight format. The oracle is the same kernel on one row: any batch
 * dependence (another accumulation order, another int8 block split) shows up as a bit. */
static void check_gemv_invariant(tensor_dtype t, int64_t n, int64_t k, int multi) {
    enum { T = 13 };
    op_weight w[3];
    void *host[3];
    cuda_weight dw[3];
    hearth_error e = {0};
    int nw = multi ? 3 : 1;
    float *x = malloc((size_t)(T * k) * sizeof *x), *dy_all[3], *dy_one[3];
    for (int64_t i = 0; i < T * k; i++) x[i] = rndf();
    for (int i = 0; i < nw; i++) {
        host[i] = make_weight(t, n + i, k, &w[i]);
        assert_int_equal(cuda_weight_upload(&dw[i], &w[i], "invariant", &e), HEARTH_OK);
        dy_all[i] = dev_from(NULL, (size_t)(T * (n + i)) * sizeof(float));
        dy_one[i] = dev_from(NULL, (size_t)(T * (n + i)) * sizeof(float));
    }
    float *dx = dev_from(x, (size_t)(T * k) * sizeof *x);
    const cuda_weight *ws[3] = {&dw[0], &dw[1], &dw[2]};
    if (multi) assert_int_equal(cuda_gemv_multi(ws, dy_all, 3, dx, T, &e), HEARTH_OK);
    else assert_int_equal(cuda_gemv(&dw[0], dx, T, dy_all[0], &e), HEARTH_OK);
    for (int tt = 0; tt < T; tt++) {
        float *ys[3];
        for (int i = 0; i < nw; i++) ys[i] = dy_one[i] + (size_t)tt * (n + i);
        if (multi) assert_int_equal(cuda_gemv_multi(ws, ys, 3, dx + (size_t)tt * k, 1, &e), HEARTH_OK);
        else assert_int_equal(cuda_gemv(&dw[0], dx + (size_t)tt * k, 1, ys[0], &e), HEARTH_OK);
    }
    for (int i = 0; i < nw; i++) {
        size_t m = (size_t)T * (n + i);
        float *a = download(dy_all[i], m), *b = download(dy_one[i], m);
        for (size_t j = 0; j < m; j++)
            if (memcmp(&a[j], &b[j], 4))
                fail_msg("gemv%s %s n=%lld k=%lld: row %zu col %zu among %d = %.9g, alone %.9g", multi ? "_multi" : "",
                         tensor_dtype_name(t), (long long)(n + i), (long long)k, j / (n + i), j % (n + i), T, a[j],
                         b[j]);
        free(a);
        free(b);
        cuda_free(dy_all[i]);
        cuda_free(dy_one[i]);
        cuda_weight_free(&dw[i]);
        free(host[i]);
    }
    cuda_free(dx);
    free(x);
}

static void test_gemv_batch_invariant(void **state) {
    (void)state;
    static const struct { tensor_dtype t; int64_t n, k; } shapes[] = {
        {DT_F32, 37, 200}, {DT_BF16, 301, 4096}, {DT_BF16, 19, 77}, {DT_F16, 129, 2048}, {DT_Q8_0, 4229, 256},
        {DT_Q8_0, 37, 14336}, {DT_Q4_K, 8467, 512}, {DT_Q4_K, 129, 2304}, {DT_Q6_K, 37, 4096},
        {DT_U32, 301, 4096}, {DT_U32, 19, 96}, {DT_U32, 37, 2560},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mlx_group = shapes[s].k % 64 ? 32 : 64;
        check_gemv_invariant(shapes[s].t, shapes[s].n, shapes[s].k, 0);
    }
    mlx_group = 64;
    check_gemv_invariant(DT_BF16, 300, 4096, 1); /* the fused q/k/v launch */
    check_gemv_invariant(DT_Q4_K, 300, 512, 1);  /* x quantized once for all three */
}

/* The v2 int8-activation GEMVs of Q4_K (packed scales, every shape) and Q6_K (n >= 2k at
 * one row; every shape at 2..8 rows outside batch-invariant steps) against the CPU
 * reference with test_gemv's oracle and tolerance (verify_gemv: activations by
 * cpu_quantize_row_ref, float summation bound + 2·max|w|·max d). Shapes: n = 1, odd n (37;
 * 1023: a partial last block of 4 rows), the smallest k (256), k with a partial
 * 4096-weight step (2304, 4352, 768), exactly one step (4096) and 3.5 steps (14336); T = 5
 * and 11 run as chunks (4 + 1, 8 + 3); 8448 (33 super-blocks: two full steps and one
 * super-block). Then the multi-weight, batch-invariance and PDL-chain checks (Q8_0 there
 * on cuda_gemv.cu's kernel). */
static void test_gemv_v2(void **state) {
    (void)state;
    static const struct { tensor_dtype t; int64_t n, k; } shapes[] = {
        {DT_Q4_K, 1, 256},   {DT_Q4_K, 37, 2304},  {DT_Q4_K, 6, 4352},    {DT_Q4_K, 1023, 4096}, {DT_Q4_K, 37, 14336},
        {DT_Q6_K, 1, 256},   {DT_Q6_K, 37, 2304},  {DT_Q6_K, 6, 768},     {DT_Q6_K, 1023, 4096}, {DT_Q6_K, 37, 14336},
        {DT_Q4_K, 5, 8448},  {DT_Q6_K, 5, 8448},
    };
    static const int Ts[] = {1, 2, 3, 4, 5, 8, 11};
    hearth_error e = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        op_weight w;
        void *host = make_weight(shapes[s].t, shapes[s].n, shapes[s].k, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "v2", &e), HEARTH_OK);
        /* one row: Q6_K on v2 only for n >= 2k */
        assert_int_equal(cuda_gemv_v2_takes(&dw), shapes[s].t == DT_Q4_K || shapes[s].n >= 2 * shapes[s].k);
        if (shapes[s].t == DT_Q4_K) assert_int_equal(dw.bytes, (size_t)shapes[s].n * (shapes[s].k / 256) * 144);
        cuda_weight_free(&dw);
        free(host);
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            if (shapes[s].n * shapes[s].k > 1 << 20 && Ts[i] != 1 && Ts[i] != 5 && Ts[i] != 8) continue; /* CPU time */
            check_gemv(shapes[s].t, shapes[s].n, shapes[s].k, Ts[i]);
        }
    }
    static const int mTs[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof mTs / sizeof mTs[0]; i++) check_multi(DT_Q4_K, DT_Q6_K, 512, mTs[i]);
    static const struct { tensor_dtype t; int64_t n, k; } inv[] = {
        {DT_Q8_0, 4229, 256}, {DT_Q8_0, 37, 14336}, {DT_Q4_K, 8467, 512},
        {DT_Q4_K, 129, 2304}, {DT_Q6_K, 37, 4096},  {DT_Q6_K, 301, 14336}, {DT_Q4_K, 301, 14336},
    };
    for (size_t s = 0; s < sizeof inv / sizeof inv[0]; s++) check_gemv_invariant(inv[s].t, inv[s].n, inv[s].k, 0);
    check_gemv_invariant(DT_Q4_K, 300, 512, 1);
    for (int pdl = pdl_capable; pdl >= 0; pdl--) { /* PDL on: T = 1; off: T = 3 */
        check_chain(DT_Q8_0, 1280, 4096, pdl ? 1 : 3, pdl);
        check_chain(DT_Q4_K, 1280, 4096, pdl ? 1 : 3, pdl);
        check_chain(DT_Q6_K, 1280, 4096, pdl ? 1 : 3, pdl);
        /* W2 [37, 8448]: a row of three load steps (the wait sits in the first) */
        check_chain(DT_Q4_K, 8448, 1024, pdl ? 1 : 3, pdl);
        check_chain(DT_Q6_K, 8448, 1024, pdl ? 1 : 3, pdl);
    }
}

/* MMQ (forced from 2 rows with cuda_mmq_force): cuda_matmul of packed-scale Q4_K at 2..64 rows
 * goes to the int8 tensor-core kernel (one launch, counted) and matches the CPU reference of
 * the int8-activation semantics with test_gemv's tolerance (verify_gemv: activations by
 * cpu_quantize_row_ref, plus 2·max|w|·max d for a q off by one step). The kernel's float error
 * is within that bound's summation term: each lane sums the k/32 sub-block terms d·sc·dx·C -
 * dmin·m·(dx·Σq) serially (C an exact int32 mma sum, each term a few roundings of <=
 * 2·max|w|·|x| parts), no warp tree at all. Shapes: n = 129 and 1000 (partial last block of 64
 * rows), k = 256 (one super-block: fewer than the pipeline's stages), 512 (n = 1000 splits it
 * in two: one super-block per split), 4096, 4352 (17 super-blocks: the stage ring wraps
 * unevenly); T covers one to eight n-tiles of 8 tokens with ragged last tiles. Outside 2..64,
 * without the force, or in exact mode the old paths take the call. */
static void test_mmq(void **state) {
    (void)state;
    cuda_mmq_force(1);
    cuda_gemm *g = NULL, *gx = NULL;
    assert_int_equal(cuda_gemm_create(&g, 1000 * 4352, 65 * 4352, 0, NULL), HEARTH_OK);
    assert_int_equal(cuda_gemm_create(&gx, 16, 16, 1, NULL), HEARTH_OK);
    static const int64_t ns[] = {129, 1000}, ks[] = {256, 512, 4096, 4352};
    static const int Ts[] = {2, 3, 7, 8, 9, 16, 33, 64};
    hearth_error e = {0};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            op_weight w;
            void *host = make_weight(DT_Q4_K, ns[a], ks[b], &w);
            cuda_weight dw;
            assert_int_equal(cuda_weight_upload(&dw, &w, "mmq", &e), HEARTH_OK);
            assert_int_equal(dw.q4k_packed, 1); /* the default upload; the kernel reads only this order */
            for (int T = 1; T <= 65; T++) assert_int_equal(cuda_matmul_uses_mmq(g, &dw, T), T >= 2 && T <= 64);
            assert_int_equal(cuda_matmul_uses_mmq(gx, &dw, 8), 0);
            cuda_mmq_force(0);
            assert_int_equal(cuda_matmul_uses_mmq(g, &dw, 8), 0);
            cuda_mmq_force(1);
            cuda_weight_free(&dw);
            free(host);
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                int few = Ts[i] == 3 || Ts[i] == 8 || Ts[i] == 33 || Ts[i] == 64;
                if (ns[a] * ks[b] > 1 << 20 && !few) continue; /* CPU time */
                check_matmul(DT_Q4_K, ns[a], ks[b], Ts[i], g, 1);
            }
        }
    cuda_gemm_free(g);
    cuda_gemm_free(gx);
    /* split-k (n = 1000: 16 row tiles, so k = 4096 splits 16 ways): each split's partials
     * are summed in split order by the tile's last block, which resets its arrival count;
     * so a second launch (a graph replay) gives the very same bits */
    {
        op_weight w;
        void *host = make_weight(DT_Q4_K, 1000, 4096, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "mmq", &e), HEARTH_OK);
        enum { T = 8 };
        float *x = malloc(sizeof(float) * T * 4096), *y1 = malloc(sizeof(float) * T * 1000),
              *y2 = malloc(sizeof(float) * T * 1000);
        for (int i = 0; i < T * 4096; i++) x[i] = rndf();
        float *dx = dev_from(x, sizeof(float) * T * 4096), *dy = dev_from(NULL, sizeof(float) * T * 1000);
        unsigned long before = cuda_mmq_launch_count();
        assert_int_equal(cuda_gemv_mmq(&dw, dx, T, dy, &e), HEARTH_OK);
        assert_int_equal(cuda_download(y1, dy, sizeof(float) * T * 1000, NULL), HEARTH_OK);
        memset(y2, 0, sizeof(float) * T * 1000);
        assert_int_equal(cuda_upload(dy, y2, sizeof(float) * T * 1000, NULL), HEARTH_OK);
        assert_int_equal(cuda_gemv_mmq(&dw, dx, T, dy, &e), HEARTH_OK);
        assert_int_equal(cuda_download(y2, dy, sizeof(float) * T * 1000, NULL), HEARTH_OK);
        assert_int_equal(cuda_mmq_launch_count() - before, 2);
        assert_memory_equal(y1, y2, sizeof(float) * T * 1000);
        cuda_free(dx), cuda_free(dy);
        cuda_weight_free(&dw);
        free(x), free(y1), free(y2), free(host);
    }
    cuda_mmq_force(-1); /* back to the default */
}

/* MLX 4-bit weights with k % 64 == 0, k >= 512 and power-of-two groups >= 32, in the chunked
 * layout, take int8 activations and gemv_v3_mlx4 (cuda_gemv_mlx4.cu). Oracle and tolerance are test_gemv's for int8 activations (verify_gemv: x̂ by
 * cpu_quantize_row_ref and the scalar CPU reference on it, float summation bound with
 * max|w| + max|bias| per term, plus 2·max|w|·max d for an element one int8 step off).
 * Shapes: n = 1, odd n (37; 1023: a partial last block of 4 rows), k = 1024 (one tile: a
 * quarter of the lanes), 4096 (one step), 5120 (a partial step), 14336 (3.5 steps); groups
 * of 32 and 64 (and 128, which it takes too), bf16 and f16 pairs; T = 1..9 (5, 6, 7, 9 run
 * as chunks 4 + 1, 4 + 2, 4 + 3, 8 + 1); rows that end in a partial slot (576: SmolLM2's
 * hidden size, 704, 2560: Gemma 4 E4B's, 2816). Then: k < 512 keeps the float kernels, a row
 * among 13 equals itself alone bit for bit (also at k = 2560), and the PDL chain. */
static void test_gemv_mlx4_v2(void **state) {
    (void)state;
    static const struct { int gs; tensor_dtype sb; int64_t n, k; } shapes[] = {
        {64, DT_BF16, 1, 1024},   {64, DT_BF16, 37, 4096},  {64, DT_F16, 1023, 4096}, {64, DT_BF16, 37, 14336},
        {32, DT_BF16, 37, 1024},  {32, DT_F16, 37, 5120},   {32, DT_BF16, 1023, 4096}, {32, DT_F16, 5, 14336},
        {128, DT_BF16, 37, 4096}, {128, DT_F16, 3, 2048},
        {64, DT_BF16, 37, 2560},  {32, DT_F16, 19, 576},    {64, DT_F16, 129, 704},   {128, DT_BF16, 5, 2816},
    };
    hearth_error e = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mlx_group = shapes[s].gs;
        mlx_sb = shapes[s].sb;
        op_weight w;
        void *host = make_weight(DT_U32, shapes[s].n, shapes[s].k, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "mlx4 int8", &e), HEARTH_OK);
        assert_int_equal(cuda_mlx4_int8_takes(&dw), 1); /* else the checks below test the float kernels */
        assert_int_equal(dw.mlx_tiled, 2);              /* the chunked layout the kernel reads */
        assert_int_equal(cuda_gemv_int8_act(&dw), 1);
        cuda_weight_free(&dw);
        free(host);
        for (int T = 1; T <= 9; T++) {
            if (shapes[s].n * shapes[s].k > 1 << 20 && T != 1 && T != 5 && T != 8) continue; /* CPU time */
            check_gemv(DT_U32, shapes[s].n, shapes[s].k, T);
        }
    }
    mlx_group = 64;
    mlx_sb = DT_BF16;
    op_weight w;
    void *host = make_weight(DT_U32, 19, 128, &w); /* not tiled: the float kernel, float activations */
    cuda_weight dw;
    assert_int_equal(cuda_weight_upload(&dw, &w, "mlx4 plain", &e), HEARTH_OK);
    assert_int_equal(cuda_mlx4_int8_takes(&dw), 0);
    assert_int_equal(cuda_gemv_int8_act(&dw), 0);
    cuda_weight_free(&dw);
    free(host);
    check_gemv(DT_U32, 19, 128, 3);
    static const struct { int gs; int64_t n, k; } inv[] = {
        {64, 301, 4096}, {64, 37, 14336}, {32, 129, 5120}, {64, 37, 2560}};
    for (size_t s = 0; s < sizeof inv / sizeof inv[0]; s++) {
        mlx_group = inv[s].gs;
        check_gemv_invariant(DT_U32, inv[s].n, inv[s].k, 0);
    }
    mlx_group = 64;
    for (int pdl = pdl_capable; pdl >= 0; pdl--) /* PDL on: T = 1; off: T = 3 */
        check_chain(DT_U32, 2048, 4096, pdl ? 1 : 3, pdl);
}

/* GGUF Q4_0 and Q4_1 are uploaded as MLX 4-bit with groups of 32 and f16 (scale, bias)
 * (cuda_device.cu): the CPU scalar reference on the GGUF bytes is the oracle. k % 64 == 0 and
 * k >= 512 take the v3 int8 GEMV on the chunked layout, other k the float MLX kernel; T >= 9 the
 * dequantizer and cuBLAS (bf16 and exact f32 modes). Also: the device weight is U32 of the
 * MLX size (16 bytes of nibbles + 4 of scale and bias per 32 weights). */
static void test_gemv_q4_legacy(void **state) {
    (void)state;
    static const tensor_dtype ts[] = {DT_Q4_0, DT_Q4_1};
    static const struct { int64_t n, k; } shapes[] = {{37, 1024}, {1023, 4096}, {5, 14336}, {19, 96}, {33, 2080},
                                                      {19, 576}};
    static const int Ts[] = {1, 2, 5, 8};
    hearth_error e = {0};
    for (int i = 0; i < 2; i++) {
        op_weight w;
        void *host = make_weight(ts[i], 3, 1024, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "q4 legacy", &e), HEARTH_OK);
        assert_int_equal(dw.dtype, DT_U32);
        assert_int_equal((long long)dw.bytes, 3LL * 1024 / 32 * 20);
        assert_int_equal(cuda_gemv_int8_act(&dw), 1);
        cuda_weight_free(&dw);
        free(host);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) check_gemv(ts[i], shapes[s].n, shapes[s].k, Ts[j]);
        for (int exact = 0; exact < 2; exact++) {
            cuda_gemm *g = NULL;
            assert_int_equal(cuda_gemm_create(&g, 1023 * 4096, 40 * 14336, exact, NULL), HEARTH_OK);
            check_matmul(ts[i], 1023, 4096, 17, g, !exact);
            check_matmul(ts[i], 33, 2080, 40, g, !exact);
            cuda_gemm_free(g);
        }
    }
}

/* The generic affine layout (cuda_affine.h): MLX 2/3/5/6/8-bit (and 4-bit in groups of 16)
 * and GGUF Q5_0/Q5_1/Q2_K/Q3_K/Q5_K are uploaded as DT_AFFINE with b-bit codes, take int8
 * activations (verify_gemv's int8 oracle and bound), and go through the decode GEMV (T up to
 * 8 per launch, chunks above; also its float-activation kernel, aff_f32act, which the exact
 * tier uses), the bf16 dequantizer (check_dequant) and the prefill GEMM
 * (bf16 and exact f32 operands) against the CPU reference. Shapes: one chunk per lane or
 * fewer (k = 256, 384), past the four-chunk load batch (4096, 14336), odd row counts. */
/* The host repacks at load spread over a thread pool (cuda_weight_upload_any_mt, what the
 * engine uses) give the device the same bytes as one thread: every format with a repack
 * (Q8_0, Q6_K, Q4_0 / Q4_1 as MLX 4-bit, MLX 4-bit in the chunked and the tiled layout, the
 * generic affine layout from Q5_0, Q3_K and MLX 6-bit), with rows enough that the pool splits
 * them (tasks of 256 K weights). */
static void test_upload_threads(void **state) {
    (void)state;
    static const struct {
        tensor_dtype t;
        int64_t n, k;
        int bits, group;
    } fs[] = {
        {DT_Q8_0, 300, 4096, 0, 0}, {DT_Q6_K, 129, 4096, 0, 0}, {DT_Q4_0, 300, 4096, 0, 0},
        {DT_Q4_1, 77, 4096, 0, 0},  {DT_U32, 300, 4096, 4, 64}, {DT_U32, 130, 3072, 4, 96} /* tiled: groups of 96 */,
        {DT_Q5_0, 301, 2816, 0, 0}, {DT_Q3_K, 97, 4096, 0, 0},  {DT_U32, 101, 4096, 6, 64}};
    threadpool *tp = NULL;
    assert_int_equal(tp_create(4, &tp, NULL), HEARTH_OK);
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        op_weight w;
        mlx_bits = fs[f].bits ? fs[f].bits : 4;
        mlx_group = fs[f].group ? fs[f].group : 64;
        void *host = make_weight(fs[f].t, fs[f].n, fs[f].k, &w);
        cuda_weight one, many;
        assert_int_equal(cuda_weight_upload_mt(&one, &w, "test", NULL, NULL), HEARTH_OK);
        assert_int_equal(cuda_weight_upload_mt(&many, &w, "test", tp, NULL), HEARTH_OK);
        assert_int_equal(one.dtype, many.dtype);
        assert_int_equal(one.mlx_tiled, many.mlx_tiled);
        if (fs[f].t == DT_U32 && fs[f].bits == 4) assert_int_equal(one.mlx_tiled, fs[f].group == 96 ? 1 : 2);
        size_t data = 0, scales = 0;
        op_weight as = w;
        if (fs[f].t == DT_Q4_0 || fs[f].t == DT_Q4_1) /* kept as MLX 4-bit, groups of 32 */
            as = (op_weight){.dtype = DT_U32, .n = w.n, .k = w.k, .bits = 4, .group_size = 32, .sb_dtype = DT_F16};
        cuda_weight_layout(&as, &data, &scales);
        assert_true(data > 0 && data % 4 == 0 && scales % 4 == 0);
        float *a = download(one.data, data / 4), *b = download(many.data, data / 4);
        assert_memory_equal(a, b, data);
        free(a), free(b);
        if (scales) {
            a = download(one.scales, scales / 4), b = download(many.scales, scales / 4);
            assert_memory_equal(a, b, scales);
            free(a), free(b);
        }
        printf("  upload with 4 threads: %s [%lld x %lld]: %zu + %zu bytes, the same\n", tensor_dtype_name(fs[f].t),
               (long long)w.n, (long long)w.k, data, scales);
        cuda_weight_free(&one), cuda_weight_free(&many);
        free(host);
    }
    mlx_bits = 4, mlx_group = 64;
    tp_destroy(tp);
}

static void test_gemv_affine(void **state) {
    (void)state;
    static const struct { tensor_dtype t; int bits, gs; tensor_dtype sb; } fs[] = {
        {DT_U32, 8, 64, DT_BF16}, {DT_U32, 8, 32, DT_F16}, {DT_U32, 6, 64, DT_BF16}, {DT_U32, 5, 32, DT_F16},
        {DT_U32, 3, 128, DT_BF16}, {DT_U32, 2, 64, DT_F16}, {DT_U32, 4, 16, DT_F32}, {DT_U32, 8, 16, DT_BF16},
        {DT_Q5_0, 0, 0, DT_F16},   {DT_Q5_1, 0, 0, DT_F16}, {DT_Q2_K, 0, 0, DT_F16}, {DT_Q3_K, 0, 0, DT_F16},
        {DT_Q5_K, 0, 0, DT_F16},
    };
    static const struct { int64_t n, k; } shapes[] = {{37, 256}, {129, 4096}, {5, 14336}, {19, 768}};
    static const int Ts[] = {1, 2, 3, 5, 8, 11};
    hearth_error e = {0};
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        mlx_bits = fs[f].bits ? fs[f].bits : 4, mlx_group = fs[f].gs ? fs[f].gs : 64, mlx_sb = fs[f].sb;
        op_weight w;
        void *host = make_weight(fs[f].t, 3, 256, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "affine", &e), HEARTH_OK);
        int bits, group;
        assert_true(cuda_affine_takes(&w, &bits, &group));
        assert_int_equal(dw.dtype, DT_AFFINE);
        assert_int_equal(dw.aff_bits, bits);
        assert_int_equal((long long)dw.bytes, 3LL * 256 * bits / 8 + 3LL * (256 / group) * 8);
        assert_int_equal(cuda_gemv_int8_act(&dw), 1);
        cuda_weight_free(&dw);
        free(host);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (fs[f].t >= DT_Q2_K && shapes[s].k % 256) continue;
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) check_gemv(fs[f].t, shapes[s].n, shapes[s].k, Ts[i]);
            aff_f32act = 1; /* the float kernel (the exact tier): float oracle, no int8 term */
            check_gemv(fs[f].t, shapes[s].n, shapes[s].k, 1);
            check_gemv(fs[f].t, shapes[s].n, shapes[s].k, 3);
            check_gemv(fs[f].t, shapes[s].n, shapes[s].k, 8);
            aff_f32act = 0;
        }
        check_dequant(fs[f].t, 19, 768, 0);
        for (int exact = 0; exact < 2; exact++) {
            cuda_gemm *g = NULL;
            assert_int_equal(cuda_gemm_create(&g, 129 * 4096, 40 * 4096, exact, NULL), HEARTH_OK);
            check_matmul(fs[f].t, 129, 4096, 40, g, !exact);
            check_matmul(fs[f].t, 37, 256, 17, g, !exact);
            cuda_gemm_free(g);
        }
    }
    mlx_bits = 4, mlx_group = 64, mlx_sb = DT_BF16;
}

/* The prefill path: cuda_matmul with T >= 9 dequantizes into the GEMM scratch and calls
 * cuBLAS; checked in both operand modes on the same odd shapes. */
static void test_gemm(void **state) {
    (void)state;
    static const int Ts[] = {9, 17, 40};
    static const struct { tensor_dtype t; int64_t n, k; } shapes[] = {
        {DT_BF16, 37, 200}, {DT_BF16, 19, 77}, {DT_F16, 129, 2048}, {DT_Q8_0, 37, 96},
        {DT_Q8_0, 301, 4096}, {DT_Q4_K, 37, 256}, {DT_Q4_K, 129, 2304}, {DT_F32, 33, 100}, {DT_Q6_K, 37, 512},
        {DT_U32, 37, 128},    {DT_U32, 129, 2048}, /* MLX 4-bit, groups of 64, bf16 scales */
    };
    for (int exact = 0; exact < 2; exact++) {
        cuda_gemm *g = NULL;
        assert_int_equal(cuda_gemm_create(&g, 301 * 4096, 40 * 4096, exact, NULL), HEARTH_OK);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
                check_matmul(shapes[s].t, shapes[s].n, shapes[s].k, Ts[i], g, !exact);
        cuda_gemm_free(g);
    }
    /* F16 weights at ragged-batch sizes: cuBLAS on the stored f16 weight with f16
     * activations (x rounded to f16: relative 2^-11, inside the bf16 bound of verify_gemv) */
    static const int Tf[] = {9, 33, 128};
    cuda_gemm *g = NULL;
    assert_int_equal(cuda_gemm_create(&g, 300 * 4096, 128 * 4096, 0, NULL), HEARTH_OK);
    for (size_t i = 0; i < sizeof Tf / sizeof Tf[0]; i++) {
        check_matmul(DT_F16, 129, 2048, Tf[i], g, 1);
        check_matmul(DT_F16, 300, 4096, Tf[i], g, 1);
        check_matmul(DT_Q4_K, 129, 2304, Tf[i], g, 1); /* GEMV or GEMM, as the byte model picks */
        check_matmul(DT_Q8_0, 300, 4096, Tf[i], g, 1);
    }
    cuda_gemm_free(g);
}

/* ---------- element-wise ops ---------- */

/* heads: cuda_rmsnorm_heads (a warp per row up to 256, in place as the q / k norms run). */
static void check_rmsnorm(int n, int T, int shift, int heads) {
    float *x = malloc((size_t)T * n * 4), *w = malloc((size_t)n * 4), *ref = malloc((size_t)T * n * 4);
    for (int i = 0; i < T * n; i++) x[i] = rndf() * 3.0f;
    for (int i = 0; i < n; i++) w[i] = rndf();
    ops_rmsnorm(ref, x, w, (float)shift, T, n, 1e-6f);
    float *dx = dev_from(x, (size_t)T * n * 4), *dw = dev_from(w, (size_t)n * 4),
          *dout = heads ? dx : dev_from(NULL, (size_t)T * n * 4);
    if (heads) assert_int_equal(cuda_rmsnorm_heads(dout, dx, dw, (float)shift, T, n, 1e-6f, NULL), HEARTH_OK);
    else assert_int_equal(cuda_rmsnorm(dout, dx, dw, (float)shift, T, n, 1e-6f, NULL), HEARTH_OK);
    float *out = download(dout, (size_t)T * n);
    for (int i = 0; i < T * n; i++)
        /* Both sum n positive squares (CPU in order, GPU in a 256-way tree), so they
         * differ by <= n·eps relative in the worst case, ~sqrt(n)·eps in practice;
         * 1e-4 covers n = 4097's worst case (4.9e-4 is not reachable with random
         * signs of rounding) and is far below any indexing error. */
        if (!(fabsf(out[i] - ref[i]) <= 1e-4f * fabsf(ref[i]) + 1e-7f))
            fail_msg("rmsnorm%s n=%d T=%d shift=%d: out[%d] = %.9g, reference %.9g", heads ? "_heads" : "", n, T,
                     shift, i, out[i], ref[i]);
    free(out);
    cuda_free(dx);
    cuda_free(dw);
    if (!heads) cuda_free(dout);
    free(x);
    free(w);
    free(ref);
}

static void test_rmsnorm(void **state) {
    (void)state;
    static const int ns[] = {1, 1000, 4097}, hn[] = {1, 77, 128, 256, 300};
    for (int shift = 0; shift < 2; shift++) {
        for (size_t c = 0; c < 3; c++) check_rmsnorm(ns[c], 3, shift, 0);
        for (size_t c = 0; c < 5; c++) check_rmsnorm(hn[c], 37, shift, 1); /* 37 rows: a partial block of 8 */
    }
}

static void test_rope(void **state) {
    (void)state;
    static const int dims[] = {64, 6, 128};
    for (size_t c = 0; c < 3; c++)
        for (int adjacent = 0; adjacent < 2; adjacent++) {
            int T = 4, H = 5, d = dims[c];
            size_t nx = (size_t)T * H * d;
            float *x = malloc(nx * 4), *ref = malloc(nx * 4), *inv = malloc((size_t)d / 2 * 4);
            int32_t pos[4];
            for (size_t i = 0; i < nx; i++) ref[i] = x[i] = rndf();
            for (int i = 0; i < d / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / d);
            for (int t = 0; t < T; t++) pos[t] = (int32_t)(rnd() % 9000);
            ops_rope(ref, T, H, d, pos, inv, adjacent);
            float *dx = dev_from(x, nx * 4), *dinv = dev_from(inv, (size_t)d / 2 * 4);
            int32_t *dpos = dev_from(pos, sizeof pos);
            assert_int_equal(cuda_rope(dx, T, H, d, dpos, dinv, adjacent, NULL), HEARTH_OK);
            float *out = download(dx, nx);
            for (size_t i = 0; i < nx; i++)
                /* Same float theta on both sides; CUDA's cosf/sinf are within 2 ulp and
                 * glibc's within 1, so each output differs by a few ulp of |x0| + |x1| <= 2. */
                if (!(fabsf(out[i] - ref[i]) <= 8.0f * FLT_EPSILON * 2.0f))
                    fail_msg("rope d=%d adjacent=%d: x[%zu] = %.9g, reference %.9g", d, adjacent, i, out[i], ref[i]);
            free(out);
            cuda_free(dx);
            cuda_free(dinv);
            cuda_free(dpos);
            free(x);
            free(ref);
            free(inv);
        }
}

/* cuda_rope_qk (q and k in one launch) against ops_rope on each, and bit-identical to
 * cuda_rope (the same per-pair arithmetic): head counts that are not multiples of
 * anything, T = 1..8, head dims 6 / 64 / 128 / 256, both pair layouts. */
static void test_rope_qk(void **state) {
    (void)state;
    static const int dims[] = {6, 64, 128, 256};
    static const int Ts[] = {1, 2, 5, 8};
    for (size_t c = 0; c < 4; c++)
        for (size_t ti = 0; ti < 4; ti++)
            for (int adjacent = 0; adjacent < 2; adjacent++) {
                int T = Ts[ti], H = 7, KH = 3, d = dims[c];
                size_t nq = (size_t)T * H * d, nk = (size_t)T * KH * d;
                float *q = malloc(nq * 4), *k = malloc(nk * 4), *rq = malloc(nq * 4), *rk = malloc(nk * 4);
                float *inv = malloc((size_t)d / 2 * 4);
                int32_t pos[8];
                for (size_t i = 0; i < nq; i++) rq[i] = q[i] = rndf();
                for (size_t i = 0; i < nk; i++) rk[i] = k[i] = rndf();
                for (int i = 0; i < d / 2; i++) inv[i] = powf(500000.0f, -2.0f * i / d);
                for (int t = 0; t < T; t++) pos[t] = (int32_t)(rnd() % 131072);
                ops_rope(rq, T, H, d, pos, inv, adjacent);
                ops_rope(rk, T, KH, d, pos, inv, adjacent);
                float *dq = dev_from(q, nq * 4), *dk = dev_from(k, nk * 4), *dq1 = dev_from(q, nq * 4),
                      *dk1 = dev_from(k, nk * 4), *dinv = dev_from(inv, (size_t)d / 2 * 4);
                int32_t *dpos = dev_from(pos, sizeof pos);
                assert_int_equal(cuda_rope_qk(dq, dk, T, H, KH, d, dpos, dinv, adjacent, NULL), HEARTH_OK);
                assert_int_equal(cuda_rope(dq1, T, H, d, dpos, dinv, adjacent, NULL), HEARTH_OK);
                assert_int_equal(cuda_rope(dk1, T, KH, d, dpos, dinv, adjacent, NULL), HEARTH_OK);
                float *oq = download(dq, nq), *ok = download(dk, nk), *oq1 = download(dq1, nq), *ok1 = download(dk1, nk);
                for (size_t i = 0; i < nq + nk; i++) {
                    float o = i < nq ? oq[i] : ok[i - nq], r = i < nq ? rq[i] : rk[i - nq];
                    float u = i < nq ? oq1[i] : ok1[i - nq];
                    /* test_rope's bound (cosf/sinf within 2 ulp on the GPU, 1 in glibc; at
                     * positions up to 2^17 theta itself is the same float on both sides) */
                    if (!(fabsf(o - r) <= 8.0f * FLT_EPSILON * 2.0f) || memcmp(&o, &u, 4))
                        fail_msg("rope_qk d=%d T=%d adjacent=%d: %s[%zu] = %.9g, reference %.9g, cuda_rope %.9g", d, T,
                                 adjacent, i < nq ? "q" : "k", i < nq ? i : i - nq, o, r, u);
                }
                free(oq);
                free(ok);
                free(oq1);
                free(ok1);
                cuda_free(dq);
                cuda_free(dk);
                cuda_free(dq1);
                cuda_free(dk1);
                cuda_free(dinv);
                cuda_free(dpos);
                free(q);
                free(k);
                free(rq);
                free(rk);
                free(inv);
            }
}

static void test_gated_activations(void **state) {
    (void)state;
    size_t n = 10007;
    for (int gelu = 0; gelu < 2; gelu++) {
        float *g = malloc(n * 4), *u = malloc(n * 4), *ref = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            ref[i] = g[i] = rndf() * 8.0f;
            u[i] = rndf() * 2.0f;
        }
        if (gelu) ops_gelu_tanh_mul(ref, u, n);
        else ops_silu_mul(ref, u, n);
        float *dg = dev_from(g, n * 4), *du = dev_from(u, n * 4);
        assert_int_equal(gelu ? cuda_gelu_tanh_mul(dg, du, n, NULL) : cuda_silu_mul(dg, du, n, NULL), HEARTH_OK);
        float *out = download(dg, n);
        for (size_t i = 0; i < n; i++)
            /* expf/tanhf differ by <= 2 ulp between CUDA and glibc: 1e-5 relative, plus an
             * absolute term for GELU where 1 + tanh cancels (a few eps of |g·up|). */
            if (!(fabsf(out[i] - ref[i]) <= 1e-5f * fabsf(ref[i]) + 4.0f * FLT_EPSILON * fabsf(g[i] * u[i])))
                fail_msg("%s: out[%zu] = %.9g, reference %.9g (g %.6g)", gelu ? "gelu" : "silu", i, out[i], ref[i],
                         g[i]);
        free(out);
        cuda_free(dg);
        cuda_free(du);
        free(g);
        free(u);
        free(ref);
    }
}

/* cuda_matmul in halves (the prefill path that converts one input for q, k and v, and feeds
 * the gated MLP product to the down GEMM without an f32 pass): load_x + loaded equals
 * cuda_matmul, and load_gated + loaded equals cuda_silu_mul / cuda_gelu_tanh_mul then
 * cuda_matmul, bit for bit (the same conversions and the same cuBLAS call), for a bf16, an
 * F16 (f16 activations), a Q4_K and a Q8_0 weight at 80 rows (past the GEMV and MMQ rows). */
static void test_matmul_loaded(void **state) {
    (void)state;
    enum { N = 96, K = 512, T = 80 };
    static const tensor_dtype types[] = {DT_BF16, DT_F16, DT_Q4_K, DT_Q8_0};
    cuda_gemm *g = NULL;
    hearth_error e = {0};
    assert_int_equal(cuda_gemm_create(&g, (size_t)N * K, (size_t)T * K, 0, &e), HEARTH_OK);
    float *x = malloc(sizeof(float) * T * K), *u = malloc(sizeof(float) * T * K);
    for (int i = 0; i < T * K; i++) x[i] = rndf() * 4.0f, u[i] = rndf();
    float *dx = dev_from(x, sizeof(float) * T * K), *du = dev_from(u, sizeof(float) * T * K);
    float *dg = dev_from(NULL, sizeof(float) * T * K), *y1 = dev_from(NULL, sizeof(float) * T * N),
          *y2 = dev_from(NULL, sizeof(float) * T * N);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        op_weight w;
        void *host = make_weight(types[ti], N, K, &w);
        cuda_weight dw;
        assert_int_equal(cuda_weight_upload(&dw, &w, "loaded", &e), HEARTH_OK);
        int act = cuda_matmul_act(g, &dw, dx, T);
        assert_int_equal(act, types[ti] == DT_F16 ? CUDA_ACT_F16 : CUDA_ACT_BF16);
        assert_int_equal(cuda_matmul_act(g, &dw, dx, 1), CUDA_ACT_NONE); /* one row: the GEMV */
        assert_int_equal(cuda_matmul(g, &dw, dx, T, y1, &e), HEARTH_OK);
        assert_int_equal(cuda_matmul_load_x(g, act, dx, T, K, &e), HEARTH_OK);
        assert_int_equal(cuda_matmul_loaded(g, &dw, act, T, y2, &e), HEARTH_OK);
        float *a = download(y1, (size_t)T * N), *b = download(y2, (size_t)T * N);
        if (memcmp(a, b, sizeof(float) * T * N))
            fail_msg("%s: load_x + loaded differs from cuda_matmul", tensor_dtype_name(types[ti]));
        free(a), free(b);
        for (int gelu = 0; gelu < 2; gelu++) {
            assert_int_equal(cuda_upload(dg, x, sizeof(float) * T * K, &e), HEARTH_OK);
            assert_int_equal(gelu ? cuda_gelu_tanh_mul(dg, du, (size_t)T * K, &e) : cuda_silu_mul(dg, du, (size_t)T * K, &e),
                             HEARTH_OK);
            assert_int_equal(cuda_matmul(g, &dw, dg, T, y1, &e), HEARTH_OK);
            assert_int_equal(cuda_matmul_load_gated(g, act, dx, du, T, K, gelu, &e), HEARTH_OK);
            assert_int_equal(cuda_matmul_loaded(g, &dw, act, T, y2, &e), HEARTH_OK);
            a = download(y1, (size_t)T * N), b = download(y2, (size_t)T * N);
            if (memcmp(a, b, sizeof(float) * T * N))
                fail_msg("%s %s: load_gated + loaded differs from the gated kernel + cuda_matmul",
                         tensor_dtype_name(types[ti]), gelu ? "gelu" : "silu");
            free(a), free(b);
        }
        assert_int_not_equal(cuda_matmul_loaded(g, &dw, CUDA_ACT_NONE, T, y2, &e), HEARTH_OK);
        assert_int_not_equal(cuda_matmul_load_x(g, act, dx, T + 1, K, &e), HEARTH_OK); /* past the scratch */
        cuda_weight_free(&dw);
        free(host);
    }
    cuda_free(dx), cuda_free(du), cuda_free(dg), cuda_free(y1), cuda_free(y2);
    free(x), free(u);
    cuda_gemm_free(g);
}

/* ---------- paged decode attention ---------- */

/* prefill: 45 consecutive tokens of slot 1 ending at its last position (the tiled
 * prefill kernel, with a partial last tile and chunks crossing KV blocks); else 4 tokens of
 * three slots (the decode kernel). */
/* Decode runs with and without the split-K scratch; heads: 6 (3 per KV head), or 8 / 16. */
static int att_heads = 6, att_split = 0;

static void check_attention(int head_dim, int window, int prefill) {
    enum { LAYERS = 2, KVH = 2, SLOTS = 3, TMAX = 45 };
    int HEADS = att_heads;
    int T = prefill ? TMAX : 4;
    kv_cache kv;
    hearth_error e = {0};
    assert_int_equal(kv_create(&kv, LAYERS, KVH, head_dim, SLOTS, 300, 64, &e), HEARTH_OK);
    /* Slot lengths straddle block boundaries (16) and one sequence is a single token. */
    int lens[SLOTS] = {1 + (int)(rnd() % 40), 150 + (int)(rnd() % 100), 17};
    for (int s = 0; s < SLOTS; s++) assert_int_equal(kv_reserve(&kv, s, lens[s], &e), HEARTH_OK);
    size_t nf = (size_t)LAYERS * kv.n_blocks * kv.block_floats;
    for (size_t i = 0; i < nf; i++) {
        kv.k[i] = rndf();
        kv.v[i] = rndf();
    }
    int32_t slot[TMAX] = {0, 1, 2, 1}, pos[TMAX] = {0};
    for (int t = 0; t < T; t++) {
        if (prefill) slot[t] = 1;
        pos[t] = prefill ? lens[1] - T + t : lens[slot[t]] - 1 - (t == 3 ? 20 : 0); /* t=3: mid-sequence */
    }
    size_t nq = (size_t)T * HEADS * head_dim;
    float *q = malloc(nq * 4), *ref = malloc(nq * 4), *scratch = malloc(ops_attention_scratch(&kv) * 4);
    for (size_t i = 0; i < nq; i++) q[i] = rndf();
    ops_attention_args ca = {.kv = &kv, .layer = 1, .q = q, .out = ref, .T = T, .n_heads = HEADS,
                             .n_kv_heads = KVH, .head_dim = head_dim, .pos = pos, .slot = slot,
                             .window = window, .scale = 1.0f / sqrtf((float)head_dim), .scratch = scratch};
    ops_attention(&ca, NULL);

    cuda_kv dkv;
    assert_int_equal(cuda_kv_upload(&dkv, &kv, &e), HEARTH_OK);
    float *dq = dev_from(q, nq * 4), *dout = dev_from(NULL, nq * 4);
    int32_t *dpos = dev_from(pos, sizeof pos), *dslot = dev_from(slot, sizeof slot);
    cuda_attention_args ga = {.kv = &dkv, .layer = 1, .q = dq, .out = dout, .T = T, .n_heads = HEADS,
                              .n_kv_heads = KVH, .head_dim = head_dim, .pos = dpos, .slot = dslot,
                              .window = window, .scale = ca.scale, .single_slot = prefill};
    float *dsplit = NULL;
    if (att_split) {
        ga.split_scratch_floats = cuda_attention_split_floats(T, HEADS, head_dim);
        dsplit = dev_from(NULL, ga.split_scratch_floats * sizeof(float));
        ga.split_scratch = dsplit;
    }
    assert_int_equal(cuda_attention(&ga, &e), HEARTH_OK);
    float *out = download(dout, nq);
    if (dsplit) cuda_free(dsplit);
    for (size_t i = 0; i < nq; i++)
        /* out is a convex combination of values in [-1, 1]; scores (<= head_dim products,
         * scaled by 1/sqrt(d)) differ by ~d·eps between summation orders, which moves the
         * weights by ~1e-6 relative; 2e-5 absolute leaves room and catches any wrong
         * position, head or block. */
        if (!(fabsf(out[i] - ref[i]) <= 2e-5f))
            fail_msg("attention d=%d window=%d prefill=%d heads=%d split=%d: out[%zu] = %.9g, reference %.9g",
                     head_dim, window, prefill, HEADS, att_split, i, out[i], ref[i]);
    free(out);
    cuda_free(dq);
    cuda_free(dout);
    cuda_free(dpos);
    cuda_free(dslot);
    cuda_kv_free(&dkv);
    free(q);
    free(ref);
    free(scratch);
    kv_destroy(&kv);
}

static void test_attention(void **state) {
    (void)state;
    static const int dims[] = {64, 40, 128, 256};
    for (int i = 0; i < 4; i++) {
        for (int prefill = 0; prefill < 2; prefill++) {
            check_attention(dims[i], 0, prefill);
            check_attention(dims[i], 37, prefill);
            check_attention(dims[i], 5, prefill); /* windows shorter than the tile and a chunk */
        }
    }
    /* decode: the GQA split-K kernel with 3, 4 and 8 query heads per KV head (8 x 256 and
     * head_dim 40... fall back to the per-head kernel), with and without split scratch */
    static const int heads[] = {6, 8, 16};
    for (int sp = 0; sp < 2; sp++)
        for (int hh = 0; hh < 3; hh++)
            for (int i = 0; i < 4; i++) {
                att_split = sp;
                att_heads = heads[hh];
                check_attention(dims[i], 0, 0);
                check_attention(dims[i], 37, 0);
                check_attention(dims[i], 5, 0);
            }
    att_split = 0;
    att_heads = 6;
}

/* ---------- errors ---------- */

static void test_errors(void **state) {
    (void)state;
    hearth_error e = {0};
    cuda_weight dw;
    uint8_t buf[96 * 4] = {0}; /* MLX 8-bit in groups of 48: no kernel (cuda_weight_upload_any expands it) */
    op_weight q8 = {.dtype = DT_U32, .data = buf, .n = 4, .k = 96, .bits = 8, .group_size = 48, .sb_dtype = DT_F16,
                     .scales = buf, .biases = buf};
    assert_int_equal(cuda_weight_upload(&dw, &q8, "blk.0.ffn_down.weight", &e), HEARTH_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "blk.0.ffn_down.weight"));
    assert_int_equal(cuda_device_open(1000, NULL, &e), cuda_device_count() ? HEARTH_ERR_INVALID : HEARTH_ERR_UNSUPPORTED);
}

int main(void) {
    /* test_attention checks the f32 kernels at f32 tolerance (its arguments have no stage,
     * so no chunk goes to the bf16 tensor-core prefill kernel, which has its own test,
     * test_cuda_prefill.c, against a bf16-aware oracle) */
    const struct CMUnitTest no_device[] = {cmocka_unit_test(test_errors)};
    int n = cuda_device_count();
    if (n == 0) {
        hearth_error e = {0};
        hearth_status s = cuda_device_open(0, NULL, &e);
        printf("test_cuda: skipped: no CUDA device (cudaGetDeviceCount reports none; open says: %s). "
               "The CUDA kernel tests did NOT run and do not count as passed; only the no-device error "
               "paths are checked below.\n",
               s ? e.message : "?");
        return cmocka_run_group_tests(no_device, NULL, NULL);
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda: cannot open device 0: %s\n", e.message);
        return 1;
    }
    pdl_capable = info.cc_major >= 9;
    rng_state ^= (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull; /* fresh random inputs every run */
    printf("test_cuda: device 0: %s (sm_%d%d, %d SMs, %.1f GiB); seed %llx\n", info.name, info.cc_major,
           info.cc_minor, info.n_sms, info.total_mem / 1073741824.0, (unsigned long long)rng_state);
    const char *only = getenv("HEARTH_TEST_FILTER"); /* e.g. test_gemv_batch_invariant: one test (device rounds) */
    if (only) cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv),
        cmocka_unit_test(test_gemv_q4k_new),
        cmocka_unit_test(test_gemv_multi),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_matmul_small_direct),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_qk),
        cmocka_unit_test(test_gemv_pdl_chain),
        cmocka_unit_test(test_gemv_batch_invariant),
        cmocka_unit_test(test_gemv_v2),
        cmocka_unit_test(test_mmq),
        cmocka_unit_test(test_gemv_mlx4_v2),
        cmocka_unit_test(test_gemv_q4_legacy),
        cmocka_unit_test(test_gemv_affine),
        cmocka_unit_test(test_upload_threads),
        cmocka_unit_test(test_gated_activations),
        cmocka_unit_test(test_matmul_loaded),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
