/* kernels_ref.c: the scalar reference matmul: dequantize one block of a weight row to
 * float (GGUF formats through io/ggml_quant.c, MLX affine here in mx.dequantize's order,
 * so values are bit-identical to the oracles) and accumulate x·w in double. Slow on
 * purpose; the fast kernels are tested against it. */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include "io/ggml_quant.h"
#include <string.h>

/* Elements dequantized per call: whole 256-element runs (8 blocks of 32 or one k-quant
 * super-block), one group for MLX affine. Only the call overhead depends on this: every
 * output is the same double sum over k in order, whatever the step. */
static int ref_step(const op_weight *w) { return w->dtype == DT_U32 ? w->group_size : 256; }

/* Four rows at a time: four independent accumulation chains instead of one (each row's
 * sum is still its own, in k order). rows[0..nr) (nr <= REF_ROWS) are any rows of w; their
 * sums go to out[0..nr). */
#define REF_ROWS 4
static void ref_rows_group(const op_weight *w, const int64_t *rows, int nr, const float *x, float *out) {
    int step = ref_step(w);
    float buf[REF_ROWS][256];
    double acc[REF_ROWS] = {0};
    for (int64_t k0 = 0; k0 < w->k; k0 += step) {
        int count = w->k - k0 < step ? (int)(w->k - k0) : step;
        for (int r = 0; r < nr; r++) op_weight_dequant(w, rows[r], k0, count, buf[r]);
        const float *xk = x + k0;
        if (nr == REF_ROWS)
            for (int j = 0; j < count; j++) {
                double xj = (double)xk[j];
                acc[0] += (double)buf[0][j] * xj;
                acc[1] += (double)buf[1][j] * xj;
                acc[2] += (double)buf[2][j] * xj;
                acc[3] += (double)buf[3][j] * xj;
            }
        else
            for (int r = 0; r < nr; r++)
                for (int j = 0; j < count; j++) acc[r] += (double)buf[r][j] * (double)xk[j];
    }
    for (int r = 0; r < nr; r++) out[r] = (float)acc[r];
}

void cpu_ref_rows(const op_weight *w, int64_t n0, int64_t n1, const void *xv, float *y) {
    for (int64_t n = n0; n < n1; n += REF_ROWS) {
        int nr = n1 - n < REF_ROWS ? (int)(n1 - n) : REF_ROWS;
        int64_t rows[REF_ROWS] = {n, n + 1, n + 2, n + 3};
        ref_rows_group(w, rows, nr, xv, y + n);
    }
}

void cpu_ref_rows_at(const op_weight *w, const int64_t *rows, int count, const float *x, float *out) {
    for (int i = 0; i < count; i += REF_ROWS)
        ref_rows_group(w, rows + i, count - i < REF_ROWS ? count - i : REF_ROWS, x, out + i);
}

/* cpu_ref_rows for T activation rows at once (prefill under HEARTH_CPU=scalar): each block
 * of weights is dequantized once per group of REF_TILE_T tokens instead of once per token.
 * Every output is the same double sum in the same order as cpu_ref_rows, so the results
 * are bit-identical; only the repeated dequantization is saved. x row t starts at
 * x + t * x_stride floats; y[t * y_stride + n] receives row n. */
#define REF_TILE_T 16
void cpu_ref_tile(const op_weight *w, int64_t n0, int64_t n1, const float *x, int64_t x_stride, int T, float *y,
                  int64_t y_stride) {
    int step = ref_step(w);
    float buf[256];
    for (int64_t n = n0; n < n1; n++)
        for (int t0 = 0; t0 < T; t0 += REF_TILE_T) {
            int nt = T - t0 < REF_TILE_T ? T - t0 : REF_TILE_T;
            double acc[REF_TILE_T] = {0};
            for (int64_t k0 = 0; k0 < w->k; k0 += step) {
                int count = w->k - k0 < step ? (int)(w->k - k0) : step;
                op_weight_dequant(w, n, k0, count, buf);
                int t = 0;
                for (; t + 4 <= nt; t += 4) { /* four independent chains */
                    const float *x0 = x + (int64_t)(t0 + t) * x_stride + k0, *x1 = x0 + x_stride,
                                *x2 = x1 + x_stride, *x3 = x2 + x_stride;
                    double a0 = acc[t], a1 = acc[t + 1], a2 = acc[t + 2], a3 = acc[t + 3];
                    for (int j = 0; j < count; j++) {
                        double b = (double)buf[j];
                        a0 += b * (double)x0[j];
                        a1 += b * (double)x1[j];
                        a2 += b * (double)x2[j];
                        a3 += b * (double)x3[j];
                    }
                    acc[t] = a0, acc[t + 1] = a1, acc[t + 2] = a2, acc[t + 3] = a3;
                }
                for (; t < nt; t++) {
                    const float *xt = x + (int64_t)(t0 + t) * x_stride + k0;
                    double a = acc[t];
                    for (int j = 0; j < count; j++) a += (double)buf[j] * (double)xt[j];
                    acc[t] = a;
                }
            }
            for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * y_stride + n] = (float)acc[t];
        }
}
