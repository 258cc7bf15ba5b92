/* gdn_bench.c: the CPU Gated DeltaNet op's middle (ops_gated_delta: conv, q/k norm, the
 * gated delta rule on each sequence's state, gated RMSNorm) at Qwen3.5-0.8B's shape (16 key
 * and 16 value heads of 128, conv width 4), for batch-1 decode (T = 1: the state is read and
 * written once per token, memory-bound; the caches are flushed before each run) and a 512-token prefill chunk (compute-bound). Prints
 * the state bytes per decode token, the time, and the fraction of this machine's measured
 * read bandwidth the decode reaches (counting the state's read and write). The projections
 * around it are ordinary matmuls (matvec_bench). Usage: gdn_bench [threads] [layers]. */
#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_ops.h"
#include "kv/kv_state.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *randv(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = scale * ((float)rand() / RAND_MAX - 0.5f);
    return v;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, layers = argc > 2 ? atoi(argv[2]) : 18;
    enum { HK = 16, HV = 16, DK = 128, DV = 128, CW = 4, TP = 512 };
    int C = 2 * HK * DK + HV * DV;
    threadpool *tp = NULL;
    hearth_error err = {0};
    if (tp_create(threads, &tp, &err)) return 1;
    kv_cache kv = {.max_slots = 1};
    size_t layer_floats = (size_t)(CW - 1) * C + (size_t)HV * DV * DK;
    if (kv_state_attach(&kv, layers, layer_floats, 0, &err)) return 1;
    float *conv = randv((size_t)C * CW, 1.0f), *A = randv(HV, 1.0f), *dt = randv(HV, 1.0f), *nw = randv(DV, 2.0f);
    float *qkv = randv((size_t)TP * C, 2.0f), *z = randv((size_t)TP * HV * DV, 2.0f), *a = randv((size_t)TP * HV, 2.0f),
          *b = randv((size_t)TP * HV, 2.0f), *y = malloc((size_t)TP * HV * DV * sizeof(float));
    int32_t pos[TP], slot[TP];
    for (int t = 0; t < TP; t++) pos[t] = t + 1, slot[t] = 0; /* never position 0: the state is kept */
    ops_gdn_args g = {.kv = &kv, .T = 1, .pos = pos, .slot = slot, .k_heads = HK, .v_heads = HV, .k_dim = DK,
                      .v_dim = DV, .conv_k = CW, .conv = conv, .A_log = A, .dt_bias = dt, .norm = nw,
                      .norm_eps = 1e-6f, .qkv = qkv, .z = z, .a = a, .b = b, .y = y};
    /* between decode runs a 256 MiB stream evicts the state from the caches, as a real decode
     * step's weights do: the state comes from memory */
    size_t flush_n = (size_t)64 << 20;
    float *flush = calloc(flush_n, sizeof *flush);
    volatile float sink = 0;
    double best = 1e9;
    for (int r = 0; r < 20; r++) { /* decode: one token through every layer */
        for (size_t i = 0; i < flush_n; i += 16) flush[i] += 1.0f;
        sink += flush[r];
        double t0 = now();
        for (int l = 0; l < layers; l++) g.layer = l, ops_gated_delta(&g, tp);
        double dt_s = now() - t0;
        if (dt_s < best) best = dt_s;
    }
    double bytes = 2.0 * layers * layer_floats * sizeof(float); /* state read + written */
    double gbs = cpu_read_bandwidth_gbs(tp, (size_t)1 << 30, 3);
    printf("machine     %d threads, read bandwidth %.1f GB/s\n", threads, gbs);
    printf("decode      %d layers: %.3f ms per token, state %.1f MB read + written: %.1f GB/s = %.2f of the "
           "read roofline\n", layers, best * 1e3, bytes / 1e6, bytes / best / 1e9, bytes / best / 1e9 / gbs);
    g.T = TP;
    best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        g.layer = 0, ops_gated_delta(&g, tp);
        double dt_s = now() - t0;
        if (dt_s < best) best = dt_s;
    }
    double flops = 4.0 * TP * HV * DV * DK; /* two passes of a multiply-add over each state row */
    printf("prefill     %d tokens, one layer: %.2f ms, %.0f tokens/s, %.1f GFLOP/s in the recurrence\n", TP,
           best * 1e3, TP / best, flops / best / 1e9);
    kv_state_free(&kv);
    free(flush);
    tp_destroy(tp);
    return 0;
}
