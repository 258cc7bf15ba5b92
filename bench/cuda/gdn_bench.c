/* gdn_bench.c: times one Gated DeltaNet layer's middle (cuda_gated_delta: conv, q/k norm, the
 * delta rule, gated norm) on a prefill of one sequence with CUDA events, the token walk
 * (cuda_gdn_args.chunked = 0: what the exact tier and batch-invariant steps run) against the
 * chunked form (the fast tier's prefill) in the same run, on the Qwen3.5 shapes, and checks
 * that both give the same outputs and state (the unit test test_cuda_gdn holds them to the CPU).
 * Also prints the traffic floor: the bytes the op must move (read qkv, z, a, b and the state,
 * write y and the state) over the device-to-device copy bandwidth measured here.
 * Usage: gdn_bench [out.json]; GDN_BENCH_T=512,4096 (the step lengths). */
#include "backend/cuda/cuda_backend.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "gdn_bench: %s: %s\n", #call, cudaGetErrorString(e_));                                     \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rndf(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define REPS 15

typedef struct shape {
    const char *name;
    int k_heads, v_heads, dim;
} shape;

/* One (shape, T): both forms REPS times from the same inputs (restored before each run, outside
 * the timed span); ms: the medians; diff: the largest |y or state difference| over the
 * largest |value|. */
static int run(const shape *sh, int T, double ms[2], double *rel_diff, double *floor_bytes) {
    const int Dk = sh->dim, Dv = sh->dim, Hk = sh->k_heads, Hv = sh->v_heads, K = 4;
    const int C = 2 * Hk * Dk + Hv * Dv, vd = Hv * Dv;
    const size_t rec = (size_t)(K - 1) * C + (size_t)Hv * Dv * Dk; /* one layer's record of one slot */
    size_t nq = (size_t)T * C, nz = (size_t)T * vd, nab = (size_t)T * Hv;
    float *h_qkv = malloc(nq * 4), *h_z = malloc(nz * 4), *h_a = malloc(nab * 4), *h_b = malloc(nab * 4);
    float *h_state = malloc(rec * 4), *h_conv = malloc((size_t)C * K * 4), h_A[64], h_dt[64], h_norm[256];
    for (size_t i = 0; i < nq; i++) h_qkv[i] = rndf();
    for (size_t i = 0; i < nz; i++) h_z[i] = rndf();
    for (size_t i = 0; i < nab; i++) h_a[i] = 2.0f * rndf(), h_b[i] = 2.0f * rndf();
    for (size_t i = 0; i < rec; i++) h_state[i] = 0.1f * rndf();
    for (int i = 0; i < C * K; i++) h_conv[i] = 0.5f * rndf();
    for (int i = 0; i < Hv; i++) h_A[i] = rndf(), h_dt[i] = rndf();
    for (int i = 0; i < Dv; i++) h_norm[i] = 1.0f + 0.2f * rndf();
    int32_t *h_ints = malloc((size_t)4 * T * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        h_ints[t] = 100 + t;                        /* pos: mid-sequence (the state is used) */
        h_ints[T + t] = 0;                          /* slot */
        h_ints[2 * T + t] = t == 0;                 /* run_first */
        h_ints[3 * T + t] = t + 1 < T ? t + 1 : -1; /* run_next */
    }
    float *d_q0, *d_a0, *d_b0, *d_s0, *d_qkv, *d_z, *d_a, *d_b, *d_y, *d_state, *d_conv, *d_A, *d_dt, *d_norm, *d_scr;
    int32_t *d_ints;
    size_t scr = cuda_gdn_chunk_floats(T, Hv, Dk);
    float **bufs[] = {&d_q0, &d_a0,    &d_b0,   &d_s0, &d_qkv, &d_z,    &d_a,  &d_b,
                      &d_y,  &d_state, &d_conv, &d_A,  &d_dt,  &d_norm, &d_scr};
    size_t sizes[] = {nq, nab, nab, rec, nq, nz, nab, nab, nz, rec, (size_t)C * K, 64, 64, 256, scr};
    for (int i = 0; i < 15; i++) CK(cudaMalloc((void **)bufs[i], sizes[i] * 4));
    CK(cudaMalloc((void **)&d_ints, (size_t)4 * T * sizeof(int32_t)));
    CK(cudaMemcpy(d_q0, h_qkv, nq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_z, h_z, nz * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_a0, h_a, nab * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_b0, h_b, nab * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_s0, h_state, rec * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_conv, h_conv, (size_t)C * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_A, h_A, sizeof h_A, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dt, h_dt, sizeof h_dt, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_norm, h_norm, sizeof h_norm, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ints, h_ints, (size_t)4 * T * sizeof(int32_t), cudaMemcpyHostToDevice));
    cuda_gdn_args ga = {.state = d_state,
                        .n_layers = 1,
                        .layer = 0,
                        .layer_floats = rec,
                        .T = T,
                        .pos = d_ints,
                        .slot = d_ints + T,
                        .run_first = d_ints + 2 * T,
                        .run_next = d_ints + 3 * T,
                        .k_heads = Hk,
                        .v_heads = Hv,
                        .k_dim = Dk,
                        .v_dim = Dv,
                        .conv_k = K,
                        .single_run = 1,
                        .scratch = d_scr,
                        .conv = d_conv,
                        .A_log = d_A,
                        .dt_bias = d_dt,
                        .norm = d_norm,
                        .norm_eps = 1e-6f,
                        .qkv = d_qkv,
                        .z = d_z,
                        .a = d_a,
                        .b = d_b,
                        .y = d_y};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *out[2][2]; /* [form][y, state] */
    for (int form = 0; form < 2; form++) {
        ga.chunked = form;
        float t_ms[REPS];
        for (int r = 0; r < REPS + 1; r++) { /* the first run warms up (and opts the kernels in) */
            CK(cudaMemcpy(d_qkv, d_q0, nq * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(d_a, d_a0, nab * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(d_b, d_b0, nab * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(d_state, d_s0, rec * 4, cudaMemcpyDeviceToDevice));
            CK(cudaDeviceSynchronize());
            hearth_error err = {0};
            CK(cudaEventRecord(e0, 0));
            if (cuda_gated_delta(&ga, &err)) {
                fprintf(stderr, "gdn_bench: %s\n", err.message);
                return 1;
            }
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            if (r) t_ms[r - 1] = m;
        }
        qsort(t_ms, REPS, sizeof(float), cmp_float);
        ms[form] = t_ms[REPS / 2];
        out[form][0] = malloc(nz * 4), out[form][1] = malloc(rec * 4);
        CK(cudaMemcpy(out[form][0], d_y, nz * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(out[form][1], d_state, rec * 4, cudaMemcpyDeviceToHost));
    }
    double worst = 0.0, scale = 0.0;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0, n = k ? rec : nz; i < n; i++) {
            double w = out[0][k][i], g = out[1][k][i];
            if (fabs(w) > scale) scale = fabs(w);
            if (!(fabs(w - g) <= worst)) worst = isnan(g) || isnan(w) ? INFINITY : fabs(w - g);
        }
    *rel_diff = worst / (scale > 0 ? scale : 1);
    *floor_bytes = 4.0 * ((double)nq + nz + 2.0 * nab + 2.0 * rec + nz);
    for (int i = 0; i < 15; i++) CK(cudaFree(*bufs[i]));
    CK(cudaFree(d_ints));
    for (int f = 0; f < 2; f++) free(out[f][0]), free(out[f][1]);
    free(h_qkv), free(h_z), free(h_a), free(h_b), free(h_state), free(h_conv), free(h_ints);
    return 0;
}

int main(int argc, char **argv) {
    cuda_device_info info;
    hearth_error err = {0};
    if (cuda_device_count() == 0 || cuda_device_open(0, &info, &err)) {
        fprintf(stderr, "gdn_bench: no CUDA device: nothing measured\n");
        return 2;
    }
    if (!cuda_gdn_chunk_device()) {
        fprintf(stderr, "gdn_bench: %s does not give the chunked kernels their shared memory: nothing to compare\n",
                info.name);
        return 2;
    }
    double gbs = cuda_copy_bandwidth_gbs((size_t)1 << 30, 5); /* read + write, best of 5 */
    if (gbs <= 0) {
        fprintf(stderr, "gdn_bench: the copy bandwidth could not be measured\n");
        return 1;
    }
    const shape shapes[] = {{"Qwen3.5-9B / 35B-A3B", 16, 32, 128}, {"Qwen3.5-0.8B / 2B", 16, 16, 128}};
    int Ts[8], nT = 0;
    const char *env = getenv("GDN_BENCH_T");
    for (const char *p = env && *env ? env : "512,4096"; *p && nT < 8;) {
        Ts[nT++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    FILE *js = argc > 1 ? fopen(argv[1], "w") : NULL;
    printf("gdn_bench: %s, copy %.0f GB/s; one layer's cuda_gated_delta on a prefill step of one sequence, "
           "median of %d\n",
           info.name, gbs, REPS);
    printf(
        "| shape | T | token walk ms | chunked ms | walk / chunked | chunked of traffic floor | max |diff| / scale |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    if (js) fprintf(js, "{\"device\": \"%s\", \"copy_gbs\": %.1f, \"rows\": [", info.name, gbs);
    int first = 1, bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int i = 0; i < nT; i++) {
            double ms[2], diff, bytes;
            if (run(&shapes[s], Ts[i], ms, &diff, &bytes)) return 1;
            double floor_ms = bytes / (gbs * 1e9) * 1e3;
            printf("| %s | %d | %.3f | %.3f | %.2f | %.2f | %.1e |\n", shapes[s].name, Ts[i], ms[0], ms[1],
                   ms[0] / ms[1], floor_ms / ms[1], diff);
            if (js)
                fprintf(js,
                        "%s{\"shape\": \"%s\", \"T\": %d, \"walk_ms\": %.4f, \"chunked_ms\": %.4f, \"floor_ms\": %.4f, "
                        "\"rel_diff\": %.3g}",
                        first ? "" : ", ", shapes[s].name, Ts[i], ms[0], ms[1], floor_ms, diff);
            first = 0;
            bad |= !(diff < 1e-3);
        }
    if (js) fprintf(js, "]}\n"), fclose(js);
    if (bad) fprintf(stderr, "gdn_bench: the two forms differ by more than 1e-3 of the scale\n");
    return bad;
}
