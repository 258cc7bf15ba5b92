/* gemm_bench.c: tr_gemm (src/train/train_gemm.c), the float32 product under hearth train,
 * on the shapes of a SmolLM2-135M LoRA step at sequence 512: x W^T (forward), dy W
 * (backward) for the q / k / gate / down projections, and a 2048^3 square product, in
 * GFLOP/s, next to the machine's AVX-512 FMA peak measured in the same run (each thread an
 * FMA loop of 12 independent 16-wide accumulators: the issue rate, nothing loaded) and the
 * rate per CPU second (times the threads: what the cores give while other tenants share
 * them). Each projection shape is checked against a double reference first. Prints a json
 * line last (bench/train/train_ceiling.py reads it). Usage: gemm_bench [threads] */
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

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));
#define FMA_ITERS 20000000L
static double fma_sink[64];

/* FMA_ITERS rounds of 12 dependent-chain FMAs (12 chains hide the latency of 2 pipes); the
 * empty asm makes every round's values opaque, so the compiler keeps each FMA */
#define FMA12(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define FMA_DECL(i) v16 a##i = (v16){0} + (float)(i + 1);
#define FMA_STEP(i) a##i = a##i * x + y;
#define FMA_SUM(i) s += a##i[0];
__attribute__((target("avx512f,fma"))) static void fma_loop(void *ctx, int task, int thread) {
    (void)ctx, (void)thread;
    v16 x = (v16){0} + 0.999f, y = (v16){0} + 0.001f;
    FMA12(FMA_DECL)
    for (long it = 0; it < FMA_ITERS; it++) {
        FMA12(FMA_STEP)
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                         "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    float s = 0;
    FMA12(FMA_SUM)
    fma_sink[task & 63] = s;
}

/* the FMA issue rate of `threads` threads at once, GFLOP/s (best of 3) */
static double fma_peak(threadpool *tp, int threads) {
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        tp_run(tp, threads, fma_loop, NULL);
        double gf = 2.0 * 16 * 12 * FMA_ITERS * threads / (now_s() - t0) / 1e9;
        best = gf > best ? gf : best;
    }
    return best;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    threadpool *tp;
    if (tp_create(threads, &tp, NULL)) return 1;
    double peak = fma_peak(tp, threads);
    static const struct { const char *name; int64_t N, K; } w[] = {
        {"q/o 576x576", 576, 576}, {"k/v 192x576", 192, 576}, {"gate/up 1536x576", 1536, 576},
        {"down 576x1536", 576, 1536}};
    int64_t M = 512;
    printf("tr_gemm, %d threads, M = %lld rows; AVX-512 FMA peak measured %.0f GFLOP/s\n", threads, (long long)M, peak);
    double best_shape = 0;
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
            best_shape = gf > best_shape ? gf : best_shape;
        }
        free(x), free(W), free(y), free(dx);
    }
    int64_t n = 2048; /* a square product, large enough that no operand stays in L2 */
    float *a = rnd(n * n), *b = rnd(n * n), *c = rnd(n * n);
    tr_gemm(tp, n, n, n, a, n, 1, b, n, 1, c, n, 0);
    double sq = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        tr_gemm(tp, n, n, n, a, n, 1, b, n, 1, c, n, 0);
        double gf = 2.0 * n * n * n / (now_s() - t0) / 1e9;
        sq = gf > sq ? gf : sq;
    }
    printf("square 2048^3      A B    %6.1f GFLOP/s  %4.0f%% of peak (best of 3)\n", sq, 100 * sq / peak);
    printf("{\"threads\": %d, \"fma_peak_gflops\": %.1f, \"square_2048_gflops\": %.1f, "
           "\"best_projection_gflops\": %.1f}\n", threads, peak, sq, best_shape);
    free(a), free(b), free(c);
    tp_destroy(tp);
    return 0;
}
