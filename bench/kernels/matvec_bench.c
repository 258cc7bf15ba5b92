/* matvec_bench.c: decode GEMV (T = 1) throughput of the CPU matmul kernels, in GB/s of
 * weight bytes read, next to this machine's streaming read bandwidth measured in the same
 * run (1 and 2 threads); prints the fraction of that roofline. Weights are cycled over
 * copies filling ~1 GiB so they come from DRAM, not cache, as in a real decode step.
 * Usage: matvec_bench [out_dir|-] [MiB] [formats] [shapes] ; writes out_dir/kernels.json and kernels.md
 * (bench/kernels/run.sh packs the two into bench/results/kernels.md with bench/results_file.py).
 * shapes: NxK[,NxK...] (default 2048x2048,8192x2048; N up to 65536 for vocabulary heads, K up to 8192). */
#include "backend/cpu/matmul.h"
#include "base/half.h"
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* First line of /proc/loadavg and the CPU model, so a reader can see how busy the
 * machine was: on a shared machine other processes take cores and bandwidth. */
static void machine_info(char *load, size_t ln, char *model, size_t mn) {
    snprintf(load, ln, "?");
    snprintf(model, mn, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fgets(load, (int)ln, f)) load[strcspn(load, "\n")] = 0;
        fclose(f);
    }
    f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, mn, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rndf(void) { return (float)(rnd64() >> 40) / 16777216.0f * 2.0f - 1.0f; }

/* ---- streaming read roofline ---- */
typedef struct stream_job {
    const uint8_t *buf;
    size_t bytes, chunk;
    uint64_t sums[64];
} stream_job;

__attribute__((target("avx2"))) static void stream_task(void *p, int task, int thread) {
    (void)thread;
    stream_job *j = p;
    const __m256i *a = (const __m256i *)(j->buf + (size_t)task * j->chunk);
    size_t n = j->chunk / 32;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(a + i));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(a + i + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(a + i + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(a + i + 3));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    j->sums[task % 64] += out[0] + out[1] + out[2] + out[3]; /* keeps the loads alive */
}

static double stream_gbs(threadpool *tp, const uint8_t *buf, size_t bytes) {
    stream_job j = {.buf = buf, .bytes = bytes};
    int tasks = tp_threads(tp) * 8;
    j.chunk = bytes / (size_t)tasks / 4096 * 4096;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        tp_run(tp, tasks, stream_task, &j);
        double gbs = (double)j.chunk * tasks / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ---- weights ---- */
typedef struct fmt {
    const char *name;
    tensor_dtype t;
    int bits;
    int f16_off[2]; /* offsets of f16 scale fields in a block, -1 if none */
} fmt;

static const fmt formats[] = {
    {"f32", DT_F32, 0, {-1, -1}},      {"f16", DT_F16, 0, {-1, -1}},     {"bf16", DT_BF16, 0, {-1, -1}},
    {"q8_0", DT_Q8_0, 0, {0, -1}},     {"q4_0", DT_Q4_0, 0, {0, -1}},    {"q4_1", DT_Q4_1, 0, {0, 2}},
    {"q5_0", DT_Q5_0, 0, {0, -1}},     {"q5_1", DT_Q5_1, 0, {0, 2}},     {"q2_k", DT_Q2_K, 0, {80, 82}},
    {"q3_k", DT_Q3_K, 0, {108, -1}},   {"q4_k", DT_Q4_K, 0, {0, 2}},     {"q5_k", DT_Q5_K, 0, {0, 2}},
    {"q6_k", DT_Q6_K, 0, {208, -1}},
    {"mlx4_g64", DT_U32, 4, {-1, -1}}, {"mlx8_g64", DT_U32, 8, {-1, -1}},
    {"mlx2_g64", DT_U32, 2, {-1, -1}}, {"mlx3_g64", DT_U32, 3, {-1, -1}}, {"mlx5_g64", DT_U32, 5, {-1, -1}},
    {"mlx6_g64", DT_U32, 6, {-1, -1}},
};

/* Fills one copy: realistic magnitudes (no denormals, which would make float math slow). */
static void fill_copy(const fmt *f, op_weight *w, uint8_t *p) {
    int64_t rb = op_weight_row_bytes(w), total = rb * w->n;
    if (f->t == DT_F32)
        for (int64_t i = 0; i < w->n * w->k; i++) ((float *)p)[i] = rndf();
    else if (f->t == DT_F16 || f->t == DT_BF16)
        for (int64_t i = 0; i < w->n * w->k; i++)
            ((uint16_t *)p)[i] = f->t == DT_F16 ? f32_to_f16(rndf()) : f32_to_bf16(rndf());
    else
        for (int64_t i = 0; i < total; i += 8) {
            uint64_t v = rnd64();
            memcpy(p + i, &v, total - i < 8 ? (size_t)(total - i) : 8);
        }
    int bb = tensor_dtype_block_bytes(f->t);
    for (int j = 0; j < 2; j++)
        if (f->f16_off[j] >= 0)
            for (int64_t b = 0; b < total / bb; b++) {
                uint16_t h = f32_to_f16(0.01f + 0.01f * rndf());
                memcpy(p + b * bb + f->f16_off[j], &h, 2);
            }
    if (f->t == DT_U32) {
        int64_t ns = w->n * (w->k / w->group_size);
        uint16_t *s = (uint16_t *)(p + total);
        for (int64_t i = 0; i < 2 * ns; i++) s[i] = f32_to_bf16(0.01f * rndf());
    }
}

static int64_t copy_bytes(const fmt *f, op_weight *w) {
    int64_t b = op_weight_row_bytes(w) * w->n;
    if (f->t == DT_U32) b += 2 * w->n * (w->k / w->group_size) * 2; /* bf16 scales + biases */
    return (b + 4095) / 4096 * 4096;
}

typedef struct result {
    const char *fmt;
    int n, k, threads, fast;
    double gbs, us_per_call, frac;
} result;

int main(int argc, char **argv) {
    const char *out_dir = argc > 1 ? argv[1] : NULL;
    size_t arena = (size_t)(argc > 2 ? atoi(argv[2]) : 1024) << 20;
    const char *only = argc > 3 ? argv[3] : NULL; /* e.g. "q4_0,q8_0": run only these formats */
    uint8_t *buf = mmap(NULL, arena, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    memset(buf, 1, arena); /* fault in: resident anonymous memory, as the engine uses */
    threadpool *pools[3] = {0};
    tp_create(1, &pools[1], NULL);
    tp_create(2, &pools[2], NULL);
    char load0[128], load1[128], model[256];
    machine_info(load0, sizeof load0, model, sizeof model);
    double stream[3] = {0, stream_gbs(pools[1], buf, arena), stream_gbs(pools[2], buf, arena)};
    printf("cpu level %s; streaming read of %zu MiB: 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
           cpu_level_name(cpu_matmul_level()), arena >> 20, stream[1], stream[2]);
    int shapes[16][2] = {{2048, 2048}, {8192, 2048}}, nshapes = 2;
    if (argc > 4) { /* e.g. "2048x2048,2048x8192" */
        nshapes = 0;
        for (const char *s = argv[4]; *s && nshapes < 16;) {
            int n, k, used;
            if (sscanf(s, "%dx%d%n", &n, &k, &used) != 2 || n <= 0 || n > 65536 || k <= 0 || k > 8192) {
                fprintf(stderr, "bad shape list '%s' (want NxK,NxK with N <= 65536, K <= 8192)\n", argv[4]);
                return 1;
            }
            shapes[nshapes][0] = n;
            shapes[nshapes++][1] = k;
            s += used;
            if (*s == ',') s++;
        }
    }
    result res[128];
    int nres = 0;
    float *x = malloc(8192 * sizeof *x), *y = malloc(65536 * sizeof *y); /* K <= 8192, N <= 65536 */
    for (int i = 0; i < 8192; i++) x[i] = rndf();
    static uint8_t scratch[1 << 16];
    printf("%-10s %5s %5s %3s %4s %8s %9s %9s\n", "format", "N", "K", "thr", "fast", "GB/s", "us/call", "roofline");
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++)
        for (int si = 0; si < nshapes; si++) {
            const fmt *f = &formats[fi];
            if (only && !strstr(only, f->name)) continue;
            op_weight w = {.dtype = f->t, .n = shapes[si][0], .k = shapes[si][1], .bits = f->bits,
                            .group_size = 64, .sb_dtype = DT_BF16};
            int64_t cb = copy_bytes(f, &w), wbytes = op_weight_row_bytes(&w) * w.n;
            int copies = (int)(arena / (size_t)cb);
            if (copies < 1) continue; /* shape does not fit the arena */
            fill_copy(f, &w, buf);
            for (int c = 1; c < copies; c++) memcpy(buf + c * cb, buf, (size_t)cb);
            int64_t read_bytes = cb; /* weights (+ MLX scales/biases) */
            for (int th = 1; th <= 2; th++) {
                double best = 1e30;
                for (int rep = 0; rep < 3; rep++) {
                    double t0 = now_s();
                    for (int c = 0; c < copies; c++) {
                        w.data = buf + c * cb;
                        w.scales = buf + c * cb + wbytes;
                        w.biases = (const uint8_t *)w.scales + w.n * (w.k / 64) * 2;
                        if (cpu_matmul(&w, x, 1, y, scratch, sizeof scratch, pools[th], NULL)) return 1;
                    }
                    double dt = now_s() - t0;
                    if (dt < best) best = dt;
                }
                result r = {f->name, (int)w.n, (int)w.k, th, cpu_matmul_is_fast(&w),
                            (double)read_bytes * copies / best / 1e9, best / copies * 1e6, 0};
                r.frac = r.gbs / stream[th];
                res[nres++] = r;
                printf("%-10s %5d %5d %3d %4d %8.1f %9.1f %8.2f\n", r.fmt, r.n, r.k, th, r.fast, r.gbs,
                       r.us_per_call, r.frac);
                fflush(stdout);
            }
        }
    machine_info(load1, sizeof load1, model, sizeof model);
    printf("%s, %ld cpus; loadavg before: %s; after: %s\n", model, sysconf(_SC_NPROCESSORS_ONLN), load0, load1);
    if (out_dir && strcmp(out_dir, "-")) {
        char path[1024];
        snprintf(path, sizeof path, "%s/kernels.json", out_dir);
        FILE *j = fopen(path, "w");
        snprintf(path, sizeof path, "%s/kernels.md", out_dir);
        FILE *m = fopen(path, "w");
        if (!j || !m) return 1;
        fprintf(j, "{\n  \"cpu_level\": \"%s\",\n  \"arena_mib\": %zu,\n", cpu_level_name(cpu_matmul_level()),
                arena >> 20);
        fprintf(j, "  \"machine\": \"%s\",\n  \"loadavg_before\": \"%s\",\n  \"loadavg_after\": \"%s\",\n", model,
                load0, load1);
        fprintf(j, "  \"stream_read_gbs\": {\"1\": %.2f, \"2\": %.2f},\n  \"results\": [\n", stream[1], stream[2]);
        fprintf(m, "# CPU decode GEMV (T=1) vs streaming-read roofline\n\n");
        fprintf(m, "Generated by `bench/kernels/run.sh` (cpu level %s). Streaming read of a %zu MiB buffer: "
                   "1 thread %.1f GB/s, 2 threads %.1f GB/s. GB/s counts weight bytes (plus MLX scales/biases) "
                   "read per call; weights cycle over copies filling the buffer so they come from DRAM. "
                   "Formats without a fast kernel (MLX 2/3/6-bit) run the scalar reference at "
                   "about 0.1-0.2 GB/s and are not listed.\n\n",
                cpu_level_name(cpu_matmul_level()), arena >> 20, stream[1], stream[2]);
        fprintf(m, "Machine: %s, %ld cpus. /proc/loadavg before: `%s`, after: `%s` (a load above the cpu "
                   "count means other processes shared the cores and memory bus during the run).\n\n",
                model, sysconf(_SC_NPROCESSORS_ONLN), load0, load1);
        fprintf(m, "| format | N | K | threads | fast | GB/s | us/call | fraction of roofline |\n");
        fprintf(m, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < nres; i++) {
            result *r = &res[i];
            fprintf(j,
                    "    {\"format\": \"%s\", \"n\": %d, \"k\": %d, \"threads\": %d, \"fast\": %d, \"gbs\": %.2f, "
                    "\"us_per_call\": %.1f, \"roofline_fraction\": %.3f}%s\n",
                    r->fmt, r->n, r->k, r->threads, r->fast, r->gbs, r->us_per_call, r->frac, i + 1 < nres ? "," : "");
            fprintf(m, "| %s | %d | %d | %d | %d | %.1f | %.1f | %.2f |\n", r->fmt, r->n, r->k, r->threads, r->fast,
                    r->gbs, r->us_per_call, r->frac);
        }
        fprintf(j, "  ]\n}\n");
        fclose(j);
        fclose(m);
    }
    tp_destroy(pools[1]);
    tp_destroy(pools[2]);
    munmap(buf, arena);
    free(x);
    free(y);
    return 0;
}
