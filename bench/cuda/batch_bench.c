/* batch_bench.c: times the CUDA paths of a batched serve step (issue #6), wall clock
 * around back-to-back launches with a device sync either side, on Llama-3.1-8B shapes: cuda_matmul vs cuda_gemv on the
 * ffn gate weight (14336 x 4096) for T = 1..128 rows in F16 / Q8_0 / Q4_K / Q6_K / MLX 4-bit (with an mmq column
 * where the int8 tensor-core kernel takes the weight at 2..64 rows, against the weight read once at this run's copy
 * bandwidth), and the attention of a ragged step
 * (decode rows of 127 sequences of 600 positions + a 37-token chunk of another) with and without the run split
 * (host_slot). Random data; timing only. Usage: batch_bench */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_plan.h"
#include "base/half.h"
#include "kv/kv_cache.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

static void *dev(const void *host, size_t bytes) {
    void *d = NULL;
    if (cuda_alloc(&d, bytes, "bench", NULL)) exit(1);
    if (host && cuda_upload(d, host, bytes, NULL)) exit(1);
    return d;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
#define REPS 10
#define ROT 4 /* weight copies rotated: > L2 for every format */

enum { PATH_MATMUL, PATH_GEMV, PATH_MMQ };

static hearth_status run_path(int path, cuda_gemm *g, cuda_weight *w, const float *x, int T, float *y,
                              hearth_error *err) {
    if (path == PATH_GEMV) return cuda_gemv(w, x, T, y, err);
    if (path == PATH_MMQ) return cuda_gemv_mmq(w, x, T, y, err);
    return cuda_matmul(g, w, x, T, y, err);
}

static double time_mm(int path, cuda_gemm *g, cuda_weight *w, const float *x, int T, float *y) {
    hearth_error err = {0};
    for (int i = 0; i < ROT; i++) /* warm-up (cuBLAS heuristics, scratch) */
        if (run_path(path, g, &w[i], x, T, y, &err)) {
            printf("batch_bench: %s\n", err.message);
            exit(1);
        }
    cuda_sync(NULL);
    double t0 = now_us();
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < ROT; i++) run_path(path, g, &w[i], x, T, y, &err);
    cuda_sync(NULL);
    return (now_us() - t0) / (REPS * ROT);
}

static void bench_matmul(void) {
    const int64_t n = 14336, k = 4096;
    static const tensor_dtype fmts[] = {DT_F16, DT_Q8_0, DT_Q4_K, DT_Q6_K, DT_U32}; /* U32: MLX 4-bit, g64 */
    static const int Ts[] = {1, 2, 4, 8, 9, 16, 24, 32, 48, 64, 128};
    /* the weight-streaming roofline of the MMQ column: device copy bandwidth, this run */
    double copy_gbs = cuda_copy_bandwidth_gbs((size_t)256 << 20, 5);
    printf("matmul [%lld x %lld], us per call\n", (long long)n, (long long)k);
    printf("  device copy bandwidth %.0f GB/s (read + write)\n", copy_gbs);
    cuda_gemm *g = NULL;
    if (cuda_gemm_create(&g, (size_t)(n * k), (size_t)128 * k, 0, NULL)) exit(1);
    float *hx = malloc(sizeof(float) * 128 * k);
    for (int64_t i = 0; i < 128 * k; i++) hx[i] = rndf();
    float *x = dev(hx, sizeof(float) * 128 * k), *y = dev(NULL, sizeof(float) * 128 * n);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        tensor_dtype t = fmts[f];
        int64_t bb = tensor_dtype_block_bytes(t), be = t == DT_Q8_0 ? 32 : t == DT_Q4_K || t == DT_Q6_K ? 256 : 1;
        /* MLX 4-bit: packed words, then bf16 scales and biases per group of 64 */
        size_t groups = (size_t)(n * (k / 64)), bytes = t == DT_U32 ? (size_t)(n * k / 2) + 4 * groups
                                                                     : (size_t)(n * (k / be) * bb);
        uint8_t *h = malloc(bytes);
        if (t == DT_U32) {
            for (size_t i = 0; i < (size_t)(n * k / 2); i++) h[i] = (uint8_t)rnd();
            uint16_t *sb = (uint16_t *)(h + n * k / 2);
            for (size_t i = 0; i < 2 * groups; i++) sb[i] = f32_to_bf16(rndf() * 0.05f);
        } else if (t == DT_F16)
            for (int64_t i = 0; i < n * k; i++) ((uint16_t *)h)[i] = f32_to_f16(rndf());
        else {
            for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)rnd();
            for (size_t b = 0; b < bytes / (size_t)bb; b++)
                for (int j = 0; j < (t == DT_Q4_K ? 2 : 1); j++) { /* Q6_K: d at 208 */
                    uint16_t hv = f32_to_f16(rndf() * 0.05f);
                    memcpy(h + b * bb + (t == DT_Q6_K ? 208 : 2 * j), &hv, 2);
                }
        }
        op_weight cw = {.dtype = t, .data = h, .n = n, .k = k};
        if (t == DT_U32) {
            cw.bits = 4, cw.group_size = 64, cw.sb_dtype = DT_BF16;
            cw.scales = h + n * k / 2, cw.biases = (uint16_t *)cw.scales + groups;
        }
        cuda_weight w[ROT];
        for (int i = 0; i < ROT; i++)
            if (cuda_weight_upload(&w[i], &cw, "bench weight", NULL)) exit(1);
        if (t != DT_F16) { /* the prefill dequantizer alone: weight bytes read + bf16 bytes written */
            void *out = dev(NULL, (size_t)(n * k) * 2);
            for (int i = 0; i < ROT; i++) cuda_dequant_bf16(&w[i], out, NULL);
            cuda_sync(NULL);
            double t0 = now_us();
            for (int r = 0; r < REPS; r++)
                for (int i = 0; i < ROT; i++) cuda_dequant_bf16(&w[i], out, NULL);
            cuda_sync(NULL);
            double us = (now_us() - t0) / (REPS * ROT);
            printf("  %-5s dequant to bf16: %8.1f us, %.0f GB/s (read + write)\n", tensor_dtype_name(t), us,
                   ((double)w[0].bytes + (double)(n * k) * 2) / us * 1e-3);
            cuda_free(out);
        }
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            cuda_mmq_force(0); /* the matmul column: the paths before MMQ */
            double us_gemv = time_mm(PATH_GEMV, g, w, x, T, y), us_mm = time_mm(PATH_MATMUL, g, w, x, T, y);
            const char *pick = cuda_matmul_uses_gemv(g, &w[0], T) ? "picks gemv" : "gemm";
            cuda_mmq_force(1); /* the mmq column from 2 rows (the product takes it from 5) */
            if (cuda_mmq_takes(&w[0], T)) {
                double us_mmq = time_mm(PATH_MMQ, g, w, x, T, y);
                /* the weight read once at copy bandwidth (copy_gbs counts read + write: half of it reads) */
                double stream_us = (double)w[0].bytes / (copy_gbs * 0.5e3);
                printf("  %-5s T=%3d: gemv %8.1f us  matmul %8.1f us (%s)  mmq %8.1f us (%.2fx the weight-stream "
                       "time %.1f us)\n",
                       tensor_dtype_name(t), T, us_gemv, us_mm, pick, us_mmq, us_mmq / stream_us, stream_us);
            } else {
                printf("  %-5s T=%3d: gemv %8.1f us  matmul %8.1f us (%s)\n", tensor_dtype_name(t), T, us_gemv, us_mm,
                       pick);
            }
            cuda_mmq_force(-1); /* the default */
        }
        for (int i = 0; i < ROT; i++) cuda_weight_free(&w[i]);
        free(h);
    }
    cuda_free(x), cuda_free(y), free(hx);
    cuda_gemm_free(g);
}

static void bench_attention(void) {
    enum { NSEQ = 128, LEN = 600, CH = 37, H = 32, HK = 8, D = 128 };
    int nbs = (LEN + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE, n_blocks = NSEQ * nbs;
    size_t pool = (size_t)n_blocks * HK * KV_BLOCK_SIZE * D;
    float *hp = malloc(sizeof(float) * pool);
    for (size_t i = 0; i < pool; i++) hp[i] = rndf();
    int32_t *tables = malloc(sizeof(int32_t) * NSEQ * nbs);
    for (int i = 0; i < NSEQ * nbs; i++) tables[i] = i;
    cuda_kv kv = {.n_layers = 1,
                  .n_kv_heads = HK,
                  .head_dim = D,
                  .n_blocks = n_blocks,
                  .max_slots = NSEQ,
                  .max_blocks_per_slot = nbs};
    kv.k = dev(hp, sizeof(float) * pool);
    kv.v = dev(hp, sizeof(float) * pool);
    kv.tables = dev(tables, sizeof(int32_t) * NSEQ * nbs);
    int32_t pos[NSEQ - 1 + CH], slot[NSEQ - 1 + CH];
    int T = 0;
    for (int s = 0; s < NSEQ / 2; s++) slot[T] = s, pos[T++] = LEN - 1;
    for (int t = 0; t < CH; t++) slot[T] = NSEQ - 1, pos[T++] = LEN - CH + t;
    for (int s = NSEQ / 2; s < NSEQ - 1; s++) slot[T] = s, pos[T++] = LEN - 1;
    size_t nq = (size_t)T * H * D;
    float *hq = malloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) hq[i] = rndf();
    float *q = dev(hq, sizeof(float) * nq), *out = dev(NULL, sizeof(float) * nq);
    int32_t *dpos = dev(pos, sizeof pos), *dslot = dev(slot, sizeof slot);
    size_t sf = cuda_attention_split_floats(CUDA_GRAPH_MAX_T, H, D);
    float *split = dev(NULL, sizeof(float) * sf);
    cuda_attention_args a = {.kv = &kv,
                             .q = q,
                             .out = out,
                             .T = T,
                             .n_heads = H,
                             .n_kv_heads = HK,
                             .head_dim = D,
                             .pos = dpos,
                             .slot = dslot,
                             .scale = 0.088f,
                             .split_scratch = split,
                             .split_scratch_floats = sf};
    for (int mode = 0; mode < 2; mode++) {
        a.host_slot = mode ? slot : NULL;
        hearth_error err = {0};
        if (cuda_attention(&a, &err)) {
            printf("batch_bench: attention: %s\n", err.message);
            exit(1);
        }
        cuda_sync(NULL);
        double t0 = now_us();
        for (int r = 0; r < REPS; r++) cuda_attention(&a, &err);
        cuda_sync(NULL);
        double ms = (now_us() - t0) / 1000.0;
        printf("attention ragged T=%d (%d decode rows x %d pos + %d-token chunk), one layer: %s %.1f us\n", T, NSEQ - 1,
               LEN, CH, mode ? "split runs (new)" : "one generic launch (old)", 1000.0 * ms / REPS);
    }
    cuda_free(kv.k), cuda_free(kv.v), cuda_free(kv.tables), cuda_free(q), cuda_free(out), cuda_free(dpos);
    cuda_free(dslot), cuda_free(split), free(hp), free(hq), free(tables);
}

int main(void) {
    cuda_device_info info;
    hearth_error err = {0};
    if (cuda_device_open(0, &info, &err)) {
        printf("batch_bench: skipped: %s\n", err.message);
        return 2;
    }
    const char *what = getenv("BATCH_BENCH");
    if (!what || strstr(what, "matmul")) bench_matmul();
    if (!what || strstr(what, "attention")) bench_attention();
    return 0;
}
