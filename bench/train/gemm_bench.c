/* gemm_bench.c: tr_gemm (src/train/train_gemm.c), the float32 product under hearth train,
 * on the shapes of a SmolLM2-135M LoRA step at sequence 512: x W^T (forward), dy W
 * (backward) for the q / k / gate / down projections, in GFLOP/s, next to the machine's
 * AVX-512 FMA peak (2 FMA units x 16 lanes x 2 flops a cycle at the clock given) and the
 * rate per CPU second (times the threads: what the cores give while other tenants share
 * them). Each shape is checked against a double
 * reference first. Usage: gemm_bench [threads] [GHz for the peak, default 2.6] */
#include "train/train_ops.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/bench_util.h"

static float *rnd(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
    return p;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double ghz = argc > 2 ? atof(argv[2]) : 2.6, peak = threads * ghz * 2 * 16 * 2;
    threadpool *tp;
    if (tp_create(threads, &tp, NULL)) return 1;
    static const struct { const char *name; int64_t N, K; } w[] = {
        {"q/o 576x576", 576, 576}, {"k/v 192x576", 192, 576}, {"gate/up 1536x576", 1536, 576},
        {"down 576x1536", 576, 1536}};
    int64_t M = 512;
    printf("tr_gemm, %d threads, M = %lld rows; peak %.0f GFLOP/s (%.2f GHz)\n", threads, (long long)M, peak, ghz);
    for (size_t s = 0; s < sizeof w / sizeof w[0]; s++) {
        int64_t N = w[s].N, K = w[s].K;
        float *x = rnd(M * K), *W = rnd(N * K), *y = rnd(M * N), *dx = calloc((size_t)(M * K), sizeof(float));
        tr_matmul_nt(tp, x, M, K, W, N, y, 0);
        tr_matmul_nn(tp, y, M, N, W, K, dx);
        double err = 0;
        for (int64_t m = 0; m < M; m += 97)
            for (int64_t n = 0; n < N; n += 13) {
                double r = 0;
                for (int64_t k = 0; k < K; k++) r += (double)x[m * K + k] * W[n * K + k];
                err = fmax(err, fabs(r - y[m * N + n]) / (1 + fabs(r)));
            }
        for (int dir = 0; dir < 2; dir++) {
            int reps = 0;
            struct timespec c0, c1;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
            double t0 = now_s(), t;
            do {
                if (dir == 0) tr_matmul_nt(tp, x, M, K, W, N, y, 0);
                else tr_matmul_nn(tp, y, M, N, W, K, dx);
                reps++;
            } while ((t = now_s() - t0) < 0.5);
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
            double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
            double gf = 2.0 * M * N * K * reps / t / 1e9, gc = 2.0 * M * N * K * reps / cpu / 1e9 * threads;
            printf("%-18s %s  %6.1f GFLOP/s  %4.0f%% of peak; per CPU second x %d: %6.1f  (max rel err %.1e)\n",
                   w[s].name, dir ? "dy W " : "x W^T", gf, 100 * gf / peak, threads, gc, err);
        }
        free(x), free(W), free(y), free(dx);
    }
    tp_destroy(tp);
    return 0;
}
