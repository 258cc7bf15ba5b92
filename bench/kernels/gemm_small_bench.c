/* gemm_small_bench.c: the CPU matmul at small T (batched decode: T = 2..32 token rows
 * against one weight matrix, as a scheduler step of T running sequences), in G
 * multiply-adds per second, for GGUF block formats. Weights are random quants with f16
 * scales of 2^-8, cycled over copies filling ~256 MiB so they do not sit in the caches.
 * A/B: run it with two builds (before and after a kernel change) and compare the lines.
 * Usage: gemm_small_bench [threads] [formats: q4_0,q4_1,q8_0,q6_k,q4_k,bf16] [NxK] [T,T,...] */
#include "backend/cpu/matmul.h"
#include "base/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    const char *formats = argc > 2 ? argv[2] : "q4_0,q4_1,q8_0";
    long n = 8192, k = 2048;
    if (argc > 3 && sscanf(argv[3], "%ldx%ld", &n, &k) != 2) return fprintf(stderr, "bad shape %s\n", argv[3]), 2;
    const char *ts = argc > 4 ? argv[4] : "1,4,8,12,16,24,32";
    threadpool *tp;
    if (tp_create(threads, &tp, NULL)) return 1;
    char fl[256];
    snprintf(fl, sizeof fl, "%s", formats);
    for (char *f = strtok(fl, ","); f; f = strtok(NULL, ",")) {
        tensor_dtype dt = !strcmp(f, "q4_0")   ? DT_Q4_0
                          : !strcmp(f, "q4_1") ? DT_Q4_1
                          : !strcmp(f, "q8_0") ? DT_Q8_0
                          : !strcmp(f, "q6_k") ? DT_Q6_K
                          : !strcmp(f, "q4_k") ? DT_Q4_K
                          : !strcmp(f, "bf16") ? DT_BF16
                                               : -1;
        if ((int)dt < 0) return fprintf(stderr, "unknown format %s\n", f), 2;
        int bb = tensor_dtype_block_bytes(dt), be = tensor_dtype_block_elems(dt), scales = dt == DT_Q4_1 || dt == DT_Q4_K ? 2 : 1;
        int d_at = dt == DT_Q6_K ? 208 : 0; /* where the f16 scale sits in a block */
        size_t bytes = (size_t)n * (k / be) * bb;
        int copies = (int)((256u << 20) / bytes) + 1;
        uint8_t *w = malloc(bytes * copies);
        for (size_t i = 0; i < bytes * copies; i++) w[i] = (uint8_t)next();
        if (dt == DT_BF16) /* finite values in +-[2^-8, 2^-7): sign and mantissa random */
            for (size_t i = 0; i < bytes * copies; i += 2) w[i + 1] = (uint8_t)((w[i + 1] & 0x80) | 0x3B);
        else for (size_t b = 0; b < (size_t)n * (k / be) * copies; b++)
            for (int s = 0; s < scales; s++) { /* f16 2^-8 (and a min of -2^-8 for Q4_1) */
                uint16_t h = s ? 0x9C00 : 0x1C00;
                memcpy(w + b * bb + d_at + 2 * s, &h, 2);
            }
        int tmax = 64;
        float *x = malloc(sizeof(float) * tmax * k), *y = malloc(sizeof(float) * tmax * n);
        for (long i = 0; i < tmax * k; i++) x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
        char tl[256];
        snprintf(tl, sizeof tl, "%s", ts);
        char *save = NULL;
        for (char *t = strtok_r(tl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int T = atoi(t);
            if (T < 1 || T > tmax) continue;
            op_weight cw = {.dtype = dt, .n = n, .k = k};
            size_t sz = cpu_matmul_scratch_size(&cw, T);
            void *scratch = malloc(sz ? sz : 1);
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = now_s();
                int calls = 0;
                for (int c = 0; c < copies * 2; c++, calls++) {
                    cw.data = w + (size_t)(c % copies) * bytes;
                    if (cpu_matmul(&cw, x, T, y, scratch, sz, tp, NULL)) return 1;
                }
                double dt_s = (now_s() - t0) / calls;
                if (dt_s < best) best = dt_s;
            }
            printf("%s %ldx%ld T=%-2d threads=%d: %7.2f GMAC/s  %7.1f GB/s of weights  %.3f ms/call\n", f, n, k, T,
                   threads, (double)n * k * T / best / 1e9, bytes / best / 1e9, best * 1e3);
            free(scratch);
        }
        free(w), free(x), free(y);
    }
    tp_destroy(tp);
    return 0;
}
