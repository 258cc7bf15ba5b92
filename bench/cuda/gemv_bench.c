/* gemv_bench.c: times the CUDA decode GEMV (T = 1) for each supported weight format on
 * Llama-3.1-8B shapes with CUDA events, and reports GB/s against the device-to-device
 * copy bandwidth measured in the same run. Weights are rotated over enough copies to
 * exceed L2 several times, so the numbers are HBM numbers. Usage: gemv_bench [out.json];
 * GEMV_BENCH_FORMATS=Q4_K,Q8_0 (format names) times only those formats
 * (GEMV_BENCH_FORMATS=mlx4: only the MLX 4-bit (U32) shapes). GEMV_BENCH_MLX_BITS=2|3|5|6|8
 * makes the MLX rows that width (the generic affine layout, cuda_affine.h), and
 * GEMV_BENCH_FORMATS=Q5_K times Q5_K (affine too; not in the default list). The int8 rows
 * include their activation quantizer launch, as a decode step's unfused GEMV does.
 * GEMV_BENCH_SHAPES=NxK,... times those shapes instead of the 8B's; GEMV_BENCH_V2=1 adds
 * each int8 format's v2 kernel at T = 1 (from an int8 copy made beforehand). */
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda_backend.h"
#include "base/half.h"
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                                 \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "gemv_bench: %s: %s\n", #call, cudaGetErrorString(e_));                              \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median over 7 batches of 20 back-to-back launches, in ms per launch. */
#define BATCHES 7
#define PER_BATCH 20

static int time_copy(double *gbs) {
    size_t bytes = (size_t)2 << 30; /* 2 GiB: ~35x L2 */
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 0x5a, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[BATCHES];
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); /* warm-up */
    for (int i = 0; i < BATCHES; i++) {
        CK(cudaEventRecord(e0, 0));
        for (int j = 0; j < 5; j++) CK(cudaMemcpyAsync(j % 2 ? a : b, j % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[i], e0, e1));
        ms[i] /= 5;
    }
    qsort(ms, BATCHES, sizeof ms[0], cmp_float);
    *gbs = 2.0 * bytes / (ms[BATCHES / 2] * 1e-3) / 1e9; /* bytes read + bytes written */
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 0;
}

/* One timed GEMV: cuda_gemv from the float input, or (v2) the v2 kernel from an int8 copy. */
typedef struct gemv_call {
    cuda_weight *dw;
    int copies, v2;
    const float *x, *xs;
    const int8_t *xq;
    float *y;
} gemv_call;

static void gemv_once(const gemv_call *c, int it) {
    hearth_error err = {0};
    if (c->v2) cuda_gemv_v2_bench(&c->dw[it % c->copies], c->y, c->xq, c->xs, 1);
    else cuda_gemv(&c->dw[it % c->copies], c->x, 1, c->y, &err);
}

/* ms[BATCHES] sorted: each the mean of PER_BATCH back-to-back launches, rotating the copies. */
static int time_gemv(const gemv_call *c, cudaEvent_t e0, cudaEvent_t e1, float *ms) {
    int it = 0;
    for (int b = 0; b < BATCHES; b++) {
        CK(cudaEventRecord(e0, 0));
        for (int j = 0; j < PER_BATCH; j++, it++) gemv_once(c, it);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        CK(cudaEventElapsedTime(&ms[b], e0, e1));
        ms[b] /= PER_BATCH;
    }
    qsort(ms, BATCHES, sizeof ms[0], cmp_float);
    return 0;
}

static int mlx_bits = 4; /* GEMV_BENCH_MLX_BITS: 2..8 (not 4: the generic affine kernels) */

static void *make_host(tensor_dtype t, int64_t n, int64_t k, size_t *bytes) {
    int64_t bb = tensor_dtype_block_bytes(t), be = tensor_dtype_block_elems(t);
    *bytes = (size_t)(n * (k / be) * bb);
    if (t == DT_U32) { /* MLX, groups of 64: words, then bf16 scales and biases */
        size_t groups = (size_t)(n * (k / 64)), wb = (size_t)(n * k / 8 * mlx_bits);
        uint8_t *d = malloc(wb + 4 * groups);
        if (!d) return NULL;
        for (size_t i = 0; i < wb; i++) d[i] = (uint8_t)rnd();
        uint16_t *sb = (uint16_t *)(d + wb);
        for (size_t g = 0; g < 2 * groups; g++) sb[g] = f32_to_bf16(rndf() * 0.01f);
        *bytes = wb + 4 * groups;
        return d;
    }
    uint8_t *d = malloc(*bytes);
    if (!d) return NULL;
    if (t == DT_F16 || t == DT_BF16) {
        for (int64_t i = 0; i < n * k; i++)
            ((uint16_t *)d)[i] = t == DT_F16 ? f32_to_f16(rndf()) : f32_to_bf16(rndf());
        return d;
    }
    for (size_t i = 0; i + 4 <= *bytes; i += 4) {
        uint32_t r = rnd();
        memcpy(d + i, &r, 4);
    }
    for (size_t b = 0; b < *bytes / (size_t)bb; b++)
        for (int j = 0; j < (t == DT_Q4_K || t == DT_Q5_K ? 2 : 1); j++) { /* Q8_0: d at 0; Q4_K / Q5_K: d, dmin at 0, 2; Q6_K: d at 208 */
            uint16_t h = f32_to_f16(rndf() * 0.05f);
            memcpy(d + b * bb + (t == DT_Q6_K ? 208 : 2 * j), &h, 2);
        }
    return d;
}

int main(int argc, char **argv) {
    cuda_device_info info;
    hearth_error err = {0};
    if (cuda_device_open(0, &info, &err)) {
        printf("gemv_bench: %s\n", err.message);
        return 2;
    }
    double copy_gbs;
    if (time_copy(&copy_gbs)) return 1;
    printf("device: %s (sm_%d%d, %d SMs, L2 %d MiB)\n", info.name, info.cc_major, info.cc_minor, info.n_sms,
           info.l2_bytes >> 20);
    printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
    FILE *js = argc > 1 ? fopen(argv[1], "w") : NULL;
    if (js)
        fprintf(js, "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"copy_gbs\": %.1f,\n  \"rows\": [\n", info.name,
                info.n_sms, copy_gbs);
    struct shape { int64_t n, k; const char *what; };
    static struct shape shapes[16] = {
        {4096, 4096, "attn q/o"},  {1024, 4096, "attn k/v"},      {14336, 4096, "ffn gate/up"},
        {4096, 14336, "ffn down"}, {128256, 4096, "lm_head"}};
    size_t n_shapes = 5;
    const char *cs = getenv("GEMV_BENCH_SHAPES"); /* "NxK,NxK,...": these shapes instead */
    if (cs) {
        n_shapes = 0;
        for (const char *p = cs; *p && n_shapes < 16;) {
            long long n = 0, k = 0;
            if (sscanf(p, "%lldx%lld", &n, &k) != 2 || n <= 0 || k <= 0 || k % 256) {
                fprintf(stderr, "gemv_bench: GEMV_BENCH_SHAPES: '%s' is not NxK (K a multiple of 256)\n", p);
                return 2;
            }
            shapes[n_shapes++] = (struct shape){n, k, "custom"};
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
    }
    /* GEMV_BENCH_V2=1: also each int8-activation format through the v2 kernel at T = 1 from
     * an int8 copy made beforehand (no quantizer launch in the timing) */
    int v2_rows = getenv("GEMV_BENCH_V2") && atoi(getenv("GEMV_BENCH_V2")) == 1;
    const char *only = getenv("GEMV_BENCH_FORMATS");
    static const tensor_dtype formats[] = {DT_BF16, DT_F16, DT_Q8_0, DT_Q4_K, DT_Q6_K, DT_U32, DT_Q5_K};
    const char *mb = getenv("GEMV_BENCH_MLX_BITS");
    if (mb && atoi(mb) >= 2 && atoi(mb) <= 8 && atoi(mb) != 7) mlx_bits = atoi(mb);
    printf("%-6s %-12s %8s %8s %10s %9s %8s\n", "format", "shape", "MB", "copies", "us/gemv", "GB/s",
           "of copy");
    int first = 1;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
        for (size_t s = 0; s < n_shapes; s++) {
            tensor_dtype t = formats[f];
            if (only && !strstr(only, tensor_dtype_name(t)) && !(t == DT_U32 && strstr(only, "mlx"))) continue;
            if (!only && t == DT_Q5_K) continue; /* the generic affine layout: by name only */
            int64_t n = shapes[s].n, k = shapes[s].k;
            size_t hb;
            void *host = make_host(t, n, k, &hb);
            if (!host) return 1;
            op_weight w = {.dtype = t, .data = host, .n = n, .k = k};
            if (t == DT_U32) { /* the MLX fields: make_host's scales and biases follow the words */
                const uint16_t *sb = (const uint16_t *)((const uint8_t *)host + n * k / 8 * mlx_bits);
                w.bits = mlx_bits, w.group_size = 64, w.sb_dtype = DT_BF16;
                w.scales = sb, w.biases = sb + n * (k / 64);
            }
            /* Enough copies that one rotation is >= 512 MB (~8x the 60 MB L2). */
            int copies = (int)((512ull << 20) / hb) + 1;
            if (copies > 16) copies = 16;
            cuda_weight dw[16];
            for (int c = 0; c < copies; c++)
                if (cuda_weight_upload(&dw[c], &w, "bench weight", &err)) {
                    printf("gemv_bench: %s\n", err.message);
                    return 1;
                }
            float *x, *y;
            CK(cudaMalloc((void **)&x, (size_t)k * 4));
            CK(cudaMalloc((void **)&y, (size_t)n * 4));
            float *xh = malloc((size_t)k * 4);
            for (int64_t i = 0; i < k; i++) xh[i] = rndf();
            CK(cudaMemcpy(x, xh, (size_t)k * 4, cudaMemcpyHostToDevice));
            free(xh);
            for (int c = 0; c < copies; c++)
                if (cuda_gemv(&dw[c], x, 1, y, &err)) {
                    printf("gemv_bench: %s\n", err.message);
                    return 1;
                }
            if (cuda_sync(&err)) {
                printf("gemv_bench: %s\n", err.message);
                return 1;
            }
            float ms[BATCHES];
            gemv_call call = {.dw = dw, .copies = copies, .x = x, .y = y};
            if (time_gemv(&call, e0, e1, ms)) return 1;
            double med = ms[BATCHES / 2], spread = ms[BATCHES - 1] - ms[0];
            double bytes = (double)dw[0].bytes + 4.0 * (k + n);
            double gbs = bytes / (med * 1e-3) / 1e9;
            char shp[32];
            snprintf(shp, sizeof shp, "%lldx%lld", (long long)n, (long long)k);
            printf("%-6s %-12s %8.1f %8d %10.2f %9.0f %8.3f\n", tensor_dtype_name(t), shp, bytes / 1e6,
                   copies, med * 1e3, gbs, gbs / copy_gbs);
            if (js)
                fprintf(js,
                        "%s    {\"format\": \"%s\", \"n\": %lld, \"k\": %lld, \"what\": \"%s\", "
                        "\"bytes\": %.0f, "
                        "\"us_median\": %.3f, \"us_spread\": %.3f, \"gbs\": %.1f, \"fraction_of_copy\": %.4f}",
                        first ? "" : ",\n", tensor_dtype_name(t), (long long)n, (long long)k, shapes[s].what,
                        bytes, med * 1e3, spread * 1e3, gbs, gbs / copy_gbs);
            first = 0;
            if (v2_rows && t != DT_BF16 && t != DT_F16) {
                int8_t *xq;
                float *xs, *ones;
                CK(cudaMalloc((void **)&xq, (size_t)k));
                CK(cudaMalloc((void **)&xs, (size_t)k / 32 * 8));
                CK(cudaMalloc((void **)&ones, (size_t)k * 4));
                float *oh = malloc((size_t)k * 4);
                for (int64_t i = 0; i < k; i++) oh[i] = 1.0f;
                CK(cudaMemcpy(ones, oh, (size_t)k * 4, cudaMemcpyHostToDevice));
                free(oh);
                float *xn;
                CK(cudaMalloc((void **)&xn, (size_t)k * 4));
                if (cuda_add_rmsnorm_q8(xn, x, NULL, ones, 0.0f, 1, (int)k, 1e-6f, xq, xs, &err) ||
                    !cuda_gemv_v2_bench(&dw[0], y, xq, xs, 1))
                    printf("%-6s %-12s v2: not taken\n", tensor_dtype_name(t), shp);
                else {
                    gemv_call v2 = {.dw = dw, .copies = copies, .v2 = 1, .xq = xq, .xs = xs, .y = y};
                    if (time_gemv(&v2, e0, e1, ms)) return 1;
                    double m2 = ms[BATCHES / 2], g2 = bytes / (m2 * 1e-3) / 1e9;
                    printf("%-6s %-12s %8s %8s %10.2f %9.0f %8.3f  (v2 kernel, no quantizer)\n", tensor_dtype_name(t),
                           shp, "", "", m2 * 1e3, g2, g2 / copy_gbs);
                }
                cudaFree(xq), cudaFree(xs), cudaFree(ones), cudaFree(xn);
            }
            for (int c = 0; c < copies; c++) cuda_weight_free(&dw[c]);
            cudaFree(x);
            cudaFree(y);
            free(host);
        }
    if (js) {
        fprintf(js, "\n  ]\n}\n");
        fclose(js);
    }
    return 0;
}
