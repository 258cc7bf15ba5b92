/* rescore_bench.c: what the fast tier's exact parts cost a decoded token, one token row:
 * 1. the exact rescoring of the logits (cpu_matmul_rescore_top) next to the output
 *    projection it follows, on the output projections of the two real GGUFs (SmolLM2-135M:
 *    49152 x 576 Q8_0; Gemma 3 270M: 262144 x 640 Q8_0): the fast matmul (the threads
 *    given, as decode runs it) and the rescoring of its result;
 * 2. the last layer's projections on float activations (cpu_matmul_precise) against the
 *    int8 kernels, on SmolLM2-135M's layer shapes in Q4_1 (q/k/v fused, o, gate/up fused,
 *    down: the calls a decode step makes).
 * Each the minimum over the rounds. Random weights (f16 scales of 2^-8) and activations.
 * bench/kernels/rescore.sh runs it beside `hearth bench` (the decode time of a token).
 * Usage: rescore_bench [threads] [rounds] */
#include "backend/cpu/matmul.h"
#include "base/half.h"
#include "base/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 200;
    static const struct {
        const char *name;
        long n, k;
    } shapes[] = {{"SmolLM2-135M lm_head", 49152, 576}, {"Gemma 3 270M lm_head", 262144, 640}};
    threadpool *tp;
    if (tp_create(threads, &tp, NULL)) return 1;
    printf("level %s, %d threads for the matmul, rescoring on the calling thread; min of %d rounds\n",
           cpu_level_name(cpu_matmul_level()), threads, rounds);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        op_weight w = {.dtype = DT_Q8_0, .n = shapes[s].n, .k = shapes[s].k};
        size_t bytes = (size_t)op_weight_row_bytes(&w) * (size_t)w.n;
        uint8_t *d = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)next();
        uint16_t scale = f32_to_f16(1.0f / 256);
        for (size_t b = 0; b < bytes; b += 34) memcpy(d + b, &scale, 2); /* Q8_0: f16 scale, 32 int8 */
        w.data = d;
        float *x = malloc((size_t)w.k * sizeof *x), *y = malloc((size_t)w.n * sizeof *y);
        float *y2 = malloc((size_t)w.n * sizeof *y2);
        for (long i = 0; i < w.k; i++) x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
        size_t ss = cpu_matmul_scratch_size(&w, 1);
        void *scratch = malloc(ss ? ss : 1);
        hearth_error err = {0};
        double t_mm = 1e9, t_rs = 1e9;
        for (int r = 0; r < rounds; r++) {
            double t0 = now_s();
            if (cpu_matmul(&w, x, 1, y, scratch, ss, tp, &err)) return fprintf(stderr, "%s\n", err.message), 1;
            double t1 = now_s();
            memcpy(y2, y, (size_t)w.n * sizeof *y2);
            double t2 = now_s();
            if (cpu_matmul_rescore_top(&w, x, 1, y2, tp, &err)) return fprintf(stderr, "%s\n", err.message), 1;
            double t3 = now_s();
            t_mm = t1 - t0 < t_mm ? t1 - t0 : t_mm;
            t_rs = t3 - t2 < t_rs ? t3 - t2 : t_rs;
        }
        printf("%s (%ld x %ld Q8_0): matmul %.1f us, rescoring %.1f us, rescoring / matmul %.3f\n", shapes[s].name, w.n,
               w.k, t_mm * 1e6, t_rs * 1e6, t_rs / t_mm);
        free(d), free(x), free(y), free(y2), free(scratch);
    }
    /* 2. SmolLM2-135M's last layer, Q4_1 (hidden 576, 3 KV heads of 64, ffn 1536) */
    static const struct { int count; long n[3], k; } calls[] = {
        {3, {576, 192, 192}, 576}, {1, {576}, 576}, {2, {1536, 1536}, 576}, {1, {576}, 1536}};
    double t_int8 = 0, t_f32 = 0;
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        op_weight w[3];
        const op_weight *ws[3];
        float *ys[3];
        size_t ss = 0;
        for (int i = 0; i < calls[c].count; i++) {
            w[i] = (op_weight){.dtype = DT_Q4_1, .n = calls[c].n[i], .k = calls[c].k};
            size_t bytes = (size_t)op_weight_row_bytes(&w[i]) * (size_t)w[i].n;
            uint8_t *d = malloc(bytes);
            for (size_t b = 0; b < bytes; b++) d[b] = (uint8_t)next();
            uint16_t scale = f32_to_f16(1.0f / 256), min = f32_to_f16(-1.0f / 32);
            for (size_t b = 0; b < bytes; b += 20) memcpy(d + b, &scale, 2), memcpy(d + b + 2, &min, 2);
            w[i].data = d;
            ws[i] = &w[i];
            ys[i] = malloc((size_t)w[i].n * sizeof(float));
            size_t need = cpu_matmul_scratch_size(&w[i], 1);
            ss = need > ss ? need : ss;
        }
        float *x = malloc((size_t)calls[c].k * sizeof *x);
        for (long i = 0; i < calls[c].k; i++) x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
        void *scratch = malloc(ss ? ss : 1);
        hearth_error err = {0};
        double a = 1e9, b = 1e9;
        for (int r = 0; r < rounds; r++) {
            double t0 = now_s();
            if (cpu_matmul_fused(calls[c].count, ws, ys, x, 1, scratch, ss, tp, 0, &err)) return 1;
            double t1 = now_s();
            if (cpu_matmul_precise(calls[c].count, ws, ys, x, 1, scratch, ss, tp, 0, &err)) return 1;
            double t2 = now_s();
            a = t1 - t0 < a ? t1 - t0 : a;
            b = t2 - t1 < b ? t2 - t1 : b;
        }
        t_int8 += a, t_f32 += b;
        for (int i = 0; i < calls[c].count; i++) free((void *)w[i].data), free(ys[i]);
        free(x), free(scratch);
    }
    printf("SmolLM2-135M last layer (Q4_1, 4 calls): int8 %.1f us, float activations %.1f us, added %.1f us\n",
           t_int8 * 1e6, t_f32 * 1e6, (t_f32 - t_int8) * 1e6);
    tp_destroy(tp);
    return 0;
}
