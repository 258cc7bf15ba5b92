/* test_cuda_moe_offload.c: the mixture-of-experts op on the GPU, in its two forms. Host-
 * routed (--expert-offload through cuda_experts.c, and every step of a model whose slices
 * have no grouped GEMV): a one-layer model (8 experts, top 2, SiLU, F32 router; experts in
 * F32 and in Q8_0, separate gate / up stacks and the fused gate_up stack) runs the same steps
 * (a ragged prefill of three sequences, decode steps of all three, a 64-token chunk) with
 * every expert resident, then offloaded with a pool of 3 slots (misses and slot reuse inside
 * one step), 16 (some kept across steps) and 32 (every slice fits: each is copied at most
 * once): every logit of the offloaded runs must equal the resident run's bit for bit (same
 * kernels, same bytes, only where they live changes). The resident F32 run is also checked
 * against the CPU backend (the oracle the parity tests hold to mlx-lm), so a bug shared by
 * both GPU runs fails too (the Q8_0 resident runs route their decode steps on the device).
 * Device-routed (decode steps of resident Q8_0 / Q4_K / Q6_K / MLX 4-bit / affine experts):
 * the routing kernel against op_moe_route bit for bit, and the same model's logits against
 * the host-routed form bit for bit and the CPU backend within a bound. Prefill steps on the
 * grouped expert GEMM: the kernel against a host oracle (segments, gather, scatter, the gated
 * form), and the same models' logits against the CPU backend within that bound. Where no GPU
 * exists it says loudly that the device tests did NOT run (exit 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_moe_offload: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_model.h"
#include "cuda_test_util.h"
#include "cuda_test_model.h"
#include "io/ggml_quant.h"
#include "kv/kv_cache.h"
#include "ops/ops.h"

/* hidden 64 and expert width 96: multiples of 32 (Q8_0 blocks) with gate / up and down
 * slices of different shapes; 64 tokens per step at most (the last step's chunk). */
enum { M_HID = 64, M_FFN = 96, N_EXP = 8, M_K = 2, M_VOC = 96, M_MT = 64, M_NS = 3, N_STEPS = 11 };
/* the device-routed form's shapes: rows every grouped kernel takes (Q4_K / Q6_K k % 256, MLX
 * 4-bit's int8 kernel k >= 512), and a down stack of n >= 2k, where the host-routed form's
 * Q6_K GEMV is the v2 kernel too (cuda_gemv_v2_takes), so the two forms agree to the bit */
enum { D_HID = 1024, D_FFN = 512 };

typedef struct moe_model {
    op_dims dims;
    op_weight embed, lm_head, router, gate, up, down;
    float *norm_in, *final_norm;
    void *data[6];
    op_item items[8];
    op_model om;
    op_moe moe;
    int window[1];
} moe_model;

static op_weight expert_weight(tensor_dtype dt, int64_t n, int64_t k, void **keep) {
    return dt == DT_U32 ? make_weight_mlx4(n, k, keep) : make_weight(dt, n, k, keep);
}

/* The items, op_model and op_moe of m's weights (fused: gate holds both, up unused). */
static void model_link(moe_model *m, int fused) {
    int n = 0, hid = m->dims.hidden;
    m->items[n++] = (op_item){.w = &m->router, .name = "router", .layer = 0};
    m->items[n++] = (op_item){.w = &m->gate, .name = "experts_gate", .layer = 0, .experts = (fused ? 2 : 1) * N_EXP};
    if (!fused) m->items[n++] = (op_item){.w = &m->up, .name = "experts_up", .layer = 0, .experts = N_EXP};
    m->items[n++] = (op_item){.w = &m->down, .name = "experts_down", .layer = 0, .experts = N_EXP};
    m->items[n++] = (op_item){.w = &m->lm_head, .logits = 1, .name = "lm_head", .layer = -1};
    m->items[n++] = (op_item){.vec = m->norm_in, .n = hid, .name = "norm_in", .layer = 0};
    m->items[n++] = (op_item){.vec = m->final_norm, .n = hid, .name = "final_norm", .layer = -1};
    m->om = (op_model){.dims = m->dims, .items = m->items, .n_items = n, .layer_window = m->window};
    m->moe = (op_moe){.router = &m->router,
                      .gate = &m->gate,
                      .up = fused ? NULL : &m->up,
                      .down = &m->down,
                      .norm_topk = 1,
                      .act = OP_ACT_SILU};
}

/* dt: the gate / up stacks' format (DT_U32: MLX 4-bit), dt_down the down stack's; hid, ffn the
 * widths; fused: one gate_up stack of 2E slices (expert e's gate rows, then its up rows), up NULL. */
static void model_make_as(moe_model *m, tensor_dtype dt, tensor_dtype dt_down, int fused, int hid, int ffn) {
    memset(m, 0, sizeof *m);
    m->dims = (op_dims){.n_layers = 1,
                        .hidden = hid,
                        .n_heads = 1,
                        .n_kv_heads = 1,
                        .head_dim = 32,
                        .ffn = ffn,
                        .vocab = M_VOC,
                        .norm_eps = 1e-6f,
                        .n_experts = N_EXP,
                        .top_k_experts = M_K,
                        .moe_ffn = ffn};
    m->embed = make_weight(DT_F32, M_VOC, hid, &m->data[0]);
    m->lm_head = make_weight(DT_F32, M_VOC, hid, &m->data[1]);
    m->router = make_weight(DT_F32, N_EXP, hid, &m->data[2]); /* F32: both backends route alike */
    m->gate = expert_weight(dt, (int64_t)(fused ? 2 : 1) * N_EXP * ffn, hid, &m->data[3]);
    if (!fused) m->up = expert_weight(dt, (int64_t)N_EXP * ffn, hid, &m->data[4]);
    m->down = expert_weight(dt_down, (int64_t)N_EXP * hid, ffn, &m->data[5]);
    m->norm_in = rnd_floats((size_t)hid, 0.3f, 1.0f);
    m->final_norm = rnd_floats((size_t)hid, 0.3f, 1.0f);
    model_link(m, fused);
}

/* u: the fused model f (a GGUF format: rows without scale planes) with its gate and up rows
 * in stacks of their own, the same bytes; u->data[3] / [4] are u's, the rest f's. */
static void model_unfuse(const moe_model *f, moe_model *u) {
    *u = *f;
    size_t rows = (size_t)f->dims.moe_ffn, rb = (size_t)op_weight_row_bytes(&f->gate);
    uint8_t *g = malloc(N_EXP * rows * rb), *up = malloc(N_EXP * rows * rb);
    const uint8_t *src = f->gate.data;
    for (int e = 0; e < N_EXP; e++) {
        memcpy(g + e * rows * rb, src + 2 * e * rows * rb, rows * rb);
        memcpy(up + e * rows * rb, src + (2 * e + 1) * rows * rb, rows * rb);
    }
    u->up = f->gate;
    u->gate.n = u->up.n = (int64_t)(N_EXP * rows);
    u->gate.data = u->data[3] = g;
    u->up.data = u->data[4] = up;
    model_link(u, 0);
}

static void model_make(moe_model *m, tensor_dtype dt, int fused) { model_make_as(m, dt, dt, fused, M_HID, M_FFN); }

static void model_free(moe_model *m) {
    for (int i = 0; i < 6; i++) free(m->data[i]);
    free(m->norm_in), free(m->final_norm);
}

/* x = embed; tmp = moe(rmsnorm(x)); x += tmp; logits. */
static hearth_status moe_layers(const op_step *s, const void *ctx) {
    const moe_model *m = ctx;
    hearth_status st = op_add_norm(s, OP_NONE, m->norm_in, 0.0f, NULL, 0);
    if (!st) st = op_moe_run(s, &m->moe);
    if (!st) st = op_add_norm(s, OP_TMP, NULL, 0.0f, NULL, 0);
    return st ? st : op_logits(s, m->final_norm, 0.0f, 1.0f, &m->lm_head);
}

/* The steps every backend runs: T tokens each, with their sequence (slot) and position. */
typedef struct step_plan {
    int T;
    int32_t tokens[M_MT], pos[M_MT], slot[M_MT];
} step_plan;

/* Step 0: a ragged prefill of three sequences interleaved (6, 4 and 3 tokens); steps 1-9:
 * decode, one token of each; step 10: a 64-token chunk of sequence 0 (matmuls past the
 * decode sizes: more rows per expert than the GEMV takes). */
static void plan_steps(step_plan *p) {
    static const int32_t pos0[13] = {0, 0, 1, 2, 0, 1, 3, 4, 1, 2, 5, 3, 2};
    static const int32_t slot0[13] = {0, 1, 0, 0, 2, 1, 0, 0, 2, 1, 0, 1, 2};
    int32_t next[M_NS] = {6, 4, 3};
    memset(p, 0, sizeof(step_plan) * N_STEPS);
    p[0].T = 13;
    memcpy(p[0].pos, pos0, sizeof pos0);
    memcpy(p[0].slot, slot0, sizeof slot0);
    for (int s = 1; s < N_STEPS - 1; s++) {
        p[s].T = M_NS;
        for (int i = 0; i < M_NS; i++) {
            p[s].slot[i] = i;
            p[s].pos[i] = next[i]++;
        }
    }
    p[N_STEPS - 1].T = M_MT;
    for (int i = 0; i < M_MT; i++) {
        p[N_STEPS - 1].slot[i] = 0;
        p[N_STEPS - 1].pos[i] = next[0]++;
    }
    for (int s = 0; s < N_STEPS; s++)
        for (int t = 0; t < p[s].T; t++) p[s].tokens[t] = (int32_t)(rnd() % M_VOC);
}

static size_t logits_floats(const step_plan *p) {
    size_t n = 0;
    for (int s = 0; s < N_STEPS; s++) n += (size_t)p[s].T * M_VOC;
    return n;
}

/* Every step of p on backend be (a fresh KV pool each run); the logits of every row, step
 * after step, into out. */
static void run_steps(moe_model *m, op_backend *be, kv_cache *kv, const step_plan *p, float *out) {
    hearth_error e = {0};
    op_embed embed = {.table = &m->embed, .scale = 1.0f};
    for (int s = 0; s < N_STEPS; s++) {
        int32_t rows[M_MT];
        for (int t = 0; t < p[s].T; t++) {
            rows[t] = t;
            assert_int_equal(kv_reserve(kv, p[s].slot[t], p[s].pos[t] + 1, NULL), HEARTH_OK);
        }
        op_batch b = {.T = p[s].T,
                      .tokens = p[s].tokens,
                      .pos = p[s].pos,
                      .slot = p[s].slot,
                      .n_out = p[s].T,
                      .out_rows = rows,
                      .logits = out};
        if (be->t->step(be, kv, &b, &m->dims, &embed, moe_layers, m, OP_OUT_LOGITS, NULL, &e)) {
            printf("%s step %d: %s\n", be->t->name, s, e.message);
            fail();
        }
        out += (size_t)p[s].T * M_VOC;
    }
}

static void kv_make(kv_cache *kv) {
    hearth_error e = {0};
    assert_int_equal(kv_create(kv, 1, 1, 32, M_NS, 256, 64, &e), HEARTH_OK);
}

/* The GPU run with expert_slots (0: resident) in the exact tier (exact 1, --cuda-exact) or
 * the fast one; its logits, hits and misses, device bytes, and the model's note. */
static float *gpu_run_as(moe_model *m, const step_plan *p, int slots, int exact, long long *hits, long long *misses,
                         size_t *dev_bytes, char *note, size_t note_size) {
    kv_cache kv;
    kv_make(&kv);
    op_backend *gpu = NULL;
    hearth_error e = {0};
    if (cuda_model_create(&m->om, &kv, M_MT, M_MT, exact, slots, NULL, &gpu, note, note_size, &e)) {
        printf("cuda_model_create (%d slots): %s\n", slots, e.message);
        fail();
    }
    printf("  %d slots: %s\n", slots, note);
    float *out = malloc(logits_floats(p) * sizeof(float));
    run_steps(m, gpu, &kv, p, out);
    cuda_model_expert_stats(gpu, hits, misses);
    *dev_bytes = cuda_model_device_bytes(gpu);
    gpu->t->free(gpu);
    kv_destroy(&kv);
    return out;
}

static float *gpu_run(moe_model *m, const step_plan *p, int slots, long long *hits, long long *misses,
                      size_t *dev_bytes) {
    char note[256] = "";
    return gpu_run_as(m, p, slots, 1, hits, misses, dev_bytes, note, sizeof note);
}

/* The CPU backend's logits of the steps (one thread). */
static float *cpu_run(moe_model *m, const step_plan *p) {
    kv_cache kv;
    kv_make(&kv);
    op_backend *cpu = NULL;
    hearth_error e = {0};
    assert_int_equal(cpu_backend_create(&m->om, &kv, M_MT, M_MT, 1, NULL, &cpu, &e), HEARTH_OK);
    float *out = malloc(logits_floats(p) * sizeof(float));
    run_steps(m, cpu, &kv, p, out);
    cpu->t->free(cpu);
    kv_destroy(&kv);
    return out;
}

/* Index of the first float that differs bit for bit (-1: none). */
static long first_difference(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) return (long)i;
    return -1;
}

static void check(tensor_dtype dt, int fused) {
    printf("experts %s, %s\n", dt == DT_F32 ? "f32" : "q8_0", fused ? "fused gate_up" : "gate and up");
    moe_model m;
    model_make(&m, dt, fused);
    step_plan *p = malloc(sizeof(step_plan) * N_STEPS);
    plan_steps(p);
    size_t n = logits_floats(p);
    int slices = 3 * N_EXP; /* gate and up (or the 2E fused slices), and down */
    long long hits, misses;
    size_t resident_bytes, bytes;
    float *resident = gpu_run(&m, p, 0, &hits, &misses, &resident_bytes);
    assert_true(hits == 0 && misses == 0); /* no pool without offload */
    static const int pools[3] = {3, 16, 32};
    for (int i = 0; i < 3; i++) {
        int S = pools[i];
        float *got = gpu_run(&m, p, S, &hits, &misses, &bytes);
        printf("  %d slots: %lld hits, %lld misses\n", S, hits, misses);
        /* 3 slots for 24 slices: each expert a step uses evicts the previous one's three
         * slices, and the 11 steps use at least 2 experts each: more copies than slices.
         * 32: every slice fits, so each is copied once at most and reused after. */
        if (S == 3) assert_true(misses > slices && bytes <= resident_bytes); /* the plan's pages: fewer or the same */
        if (S == 32) assert_true(misses <= slices && hits > 0);
        assert_true(misses > 0);
        long diff = first_difference(resident, got, n);
        if (diff >= 0)
            printf("  %d slots: logit %ld differs: resident %.9g offloaded %.9g\n", S, diff, resident[diff], got[diff]);
        free(got);
        assert_int_equal(diff, -1);
    }
    if (dt == DT_F32) { /* the resident run against the CPU reference */
        float *want = cpu_run(&m, p);
        float scale = 0.0f;
        for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(want[i]));
        size_t bad = 0;
        /* f32 weights, f32 GEMMs (gemm_exact): only summation orders differ; 1e-4 of the scale
         * is ~10x what they give (test_cuda_gdn's bound for the same shapes) */
        for (size_t i = 0; i < n; i++) bad += !(fabsf(want[i] - resident[i]) <= 1e-4f * (1.0f + scale));
        if (bad) printf("  cpu vs cuda: %zu of %zu logits differ\n", bad, n);
        assert_int_equal(bad, 0);
        free(want);
    }
    free(resident), free(p);
    model_free(&m);
}

static void test_offload_f32(void **state) {
    (void)state;
    check(DT_F32, 0);
    check(DT_F32, 1);
}

static void test_offload_q8_0(void **state) {
    (void)state;
    check(DT_Q8_0, 0);
    check(DT_Q8_0, 1);
}

/* ---- decode steps routed on the device (cuda_model.c moe_device) ---- */

/* cuda_moe_route against op_moe_route, bit for bit (experts and weights): T tokens of
 * random logits with ties planted, E experts, top K; rule 0 softmax then top K renormalised,
 * 1 without renormalising, 2 Gemma 4's top K then softmax times expert_scale. */
static void route_case(int T, int E, int K, int rule) {
    size_t n = (size_t)T * E, nk = (size_t)T * K;
    float *logits = rnd_floats(n, 4.0f, 0.0f), *scale = rnd_floats((size_t)E, 0.5f, 1.0f);
    for (int t = 0; t < T; t++) { /* ties: the lower expert must win */
        logits[(size_t)t * E + E - 1] = logits[(size_t)t * E + 1];
        logits[(size_t)t * E + E / 2] = logits[(size_t)t * E + E / 3];
    }
    float *d_logits = NULL, *d_w = NULL, *d_scale = NULL;
    int32_t *d_sel = NULL;
    hearth_error e = {0};
    assert_int_equal(cuda_alloc((void **)&d_logits, n * sizeof(float), "logits", &e), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&d_w, nk * sizeof(float), "w", &e), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&d_sel, nk * sizeof(int32_t), "sel", &e), HEARTH_OK);
    assert_int_equal(cuda_alloc((void **)&d_scale, (size_t)E * sizeof(float), "scale", &e), HEARTH_OK);
    assert_int_equal(cuda_upload(d_logits, logits, n * sizeof(float), &e), HEARTH_OK);
    assert_int_equal(cuda_upload(d_scale, scale, (size_t)E * sizeof(float), &e), HEARTH_OK);
    assert_int_equal(cuda_moe_route(d_logits, T, E, K, rule == 2, rule == 0, d_scale, d_sel, d_w, &e), HEARTH_OK);
    assert_int_equal(cuda_sync(&e), HEARTH_OK);
    int32_t *sel = malloc(nk * sizeof(int32_t));
    float *w = malloc(nk * sizeof(float));
    assert_int_equal(cuda_download(sel, d_sel, nk * sizeof(int32_t), &e), HEARTH_OK);
    assert_int_equal(cuda_download(w, d_w, nk * sizeof(float), &e), HEARTH_OK);
    float norm = 1.0f;
    op_moe m = {.norm_topk = rule == 0, .router_norm = rule == 2 ? &norm : NULL, .expert_scale = scale};
    for (int t = 0; t < T; t++) {
        int32_t hs[16];
        float hw[16];
        op_moe_route(&m, logits + (size_t)t * E, E, K, hs, hw);
        for (int k = 0; k < K; k++) { /* the device's pair for host expert hs[k] */
            int at = -1;
            for (int j = 0; j < K; j++)
                if (sel[(size_t)t * K + j] == hs[k]) at = j;
            if (at < 0 || memcmp(&w[(size_t)t * K + at], &hw[k], sizeof(float)))
                printf("  route E %d K %d rule %d token %d: host expert %d (w %.9g) %s\n", E, K, rule, t, hs[k], hw[k],
                       at < 0 ? "not chosen" : "weight differs");
            assert_true(at >= 0);
            assert_memory_equal(&w[(size_t)t * K + at], &hw[k], sizeof(float));
            if (k) assert_true(sel[(size_t)t * K + k] > sel[(size_t)t * K + k - 1]); /* ascending experts */
        }
    }
    cuda_free(d_logits), cuda_free(d_w), cuda_free(d_sel), cuda_free(d_scale);
    free(logits), free(scale), free(sel), free(w);
}

static void test_route_matches_host(void **state) {
    (void)state;
    for (int rule = 0; rule < 3; rule++) {
        route_case(8, 128, 8, rule);  /* Qwen3-30B-A3B, Gemma-4-26B-A4B */
        route_case(5, 256, 8, rule);  /* Qwen3.5-35B-A3B */
        route_case(3, 8, 2, rule);    /* the tiny models */
        route_case(2, 300, 16, rule); /* more experts than threads, the widest K */
        route_case(2, 1100, 4, rule); /* past op_moe_route's table of flags */
    }
}

/* The device-routed form against the host-routed one (the same model with every slice
 * offloaded to a pool that holds them all: the host routes), logit for logit: the prefill
 * steps (13 and 64 tokens) run the host-routed form in both, the decode steps (3 tokens)
 * the device-routed form in the first only. Fast tier (the int8-activation GEMVs). Then the
 * device-routed run against the CPU backend. */
static void check_device(tensor_dtype dt, tensor_dtype dt_down, int fused, const char *what) {
    printf("device routing: %s%s\n", what, fused ? ", fused gate_up" : "");
    moe_model m;
    model_make_as(&m, dt, dt_down, fused, D_HID, D_FFN);
    step_plan *p = malloc(sizeof(step_plan) * N_STEPS);
    plan_steps(p);
    size_t n = logits_floats(p), bytes;
    long long hits, misses;
    char note[256] = "", note_host[256] = "";
    cuda_model_force_moe_grouped(0); /* prefill steps on the per-expert form, as the host-routed run */
    float *dev = gpu_run_as(&m, p, 0, 0, &hits, &misses, &bytes, note, sizeof note);
    cuda_model_force_moe_grouped(1);
    assert_non_null(strstr(note, "routed on the device"));
    float *host = gpu_run_as(&m, p, 3 * N_EXP, 0, &hits, &misses, &bytes, note_host, sizeof note_host);
    assert_non_null(strstr(note_host, "routed on the host"));
    long diff = first_difference(dev, host, n);
    if (diff >= 0) printf("  logit %ld differs: device-routed %.9g host-routed %.9g\n", diff, dev[diff], host[diff]);
    assert_int_equal(diff, -1);
    /* prefill steps (13 and 64 tokens) on the grouped expert GEMM (cuda_moe_gemm) */
    float *grp = gpu_run_as(&m, p, 0, 0, &hits, &misses, &bytes, note, sizeof note);
    assert_non_null(strstr(note, "prefill experts grouped"));
    if (fused && dt != DT_U32) { /* the same slices as two stacks: the same kernels, the same bits */
        moe_model u;
        model_unfuse(&m, &u);
        float *two = gpu_run_as(&u, p, 0, 0, &hits, &misses, &bytes, note, sizeof note);
        diff = first_difference(grp, two, n);
        if (diff >= 0) printf("  logit %ld differs: fused %.9g, gate and up apart %.9g\n", diff, dev[diff], two[diff]);
        float *cpu_two = cpu_run(&u, p), *cpu_one = cpu_run(&m, p), wc = 0.0f;
        for (size_t i = 0; i < n; i++) wc = fmaxf(wc, fabsf(cpu_two[i] - cpu_one[i]));
        printf("  cpu: fused against apart, largest difference %.3g\n", wc);
        free(two), free(cpu_two), free(cpu_one), free(u.data[3]), free(u.data[4]);
        assert_int_equal(diff, -1);
    }
    float *want = cpu_run(&m, p), scale = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(want[i]));
    /* int8 activations on the GPU (blocks of 32) against the CPU's own activation
     * quantization: a few 1e-3 of the scale; 2e-2 is far below a wrong expert or row. A
     * prefill step's token may still route to other experts than on the CPU: its router
     * reads activations the fast tier's bf16 GEMMs rounded, and two experts' logits can be
     * that close (seen: 1 row of 64, 0.84 off, about one seed in three). So each prefill
     * step (0 and the last) may have one such row a form; decode steps none. */
    float tol = 2e-2f * (1.0f + scale);
    int flipped = 0;
    for (int form = 0; form < 2; form++) {
        const float *got = form ? grp : dev;
        printf("  cpu vs cuda (%s), largest difference per step:", form ? "grouped prefill" : "per-expert prefill");
        for (size_t st = 0, at = 0; st < N_STEPS; at += (size_t)p[st].T * M_VOC, st++) {
            float w = 0.0f, second = 0.0f;
            for (int t = 0; t < p[st].T; t++) {
                float rw = 0.0f;
                for (size_t i = at + (size_t)t * M_VOC; i < at + (size_t)(t + 1) * M_VOC; i++)
                    rw = fmaxf(rw, fabsf(want[i] - got[i]));
                if (rw > w)
                    second = w, w = rw;
                else if (rw > second)
                    second = rw;
            }
            printf(" %.3g", w);
            int prefill = st == 0 || st == N_STEPS - 1;
            if (prefill && w > tol && second <= tol) { /* one row off: its routing (counted) */
                flipped++;
                worst = fmaxf(worst, second);
            } else {
                worst = fmaxf(worst, w);
            }
        }
        printf(" (logits up to %.3g)\n", scale);
    }
    if (flipped)
        printf("  %d prefill step(s) with one row past %.3g (a token routed to other experts)\n", flipped, tol);
    if (!(worst <= tol)) { /* which matmul: the per-expert run without the MMQ kernel */
        cuda_mmq_force(0);
        cuda_model_force_moe_grouped(0);
        float *nommq = gpu_run_as(&m, p, 0, 0, &hits, &misses, &bytes, note, sizeof note), w = 0.0f;
        cuda_mmq_force(-1);
        cuda_model_force_moe_grouped(1);
        for (size_t i = 0; i < n; i++) w = fmaxf(w, fabsf(want[i] - nommq[i]));
        printf("  without MMQ: largest difference %.3g\n", w);
        free(nommq);
    }
    assert_true(worst <= tol);
    free(want), free(dev), free(grp), free(host), free(p);
    model_free(&m);
}

static void test_device_routed(void **state) {
    (void)state;
    check_device(DT_Q4_K, DT_Q6_K, 0, "Q4_K gate / up, Q6_K down");
    check_device(DT_Q4_K, DT_Q4_K, 1, "Q4_K");
    check_device(DT_U32, DT_U32, 0, "MLX 4-bit");
    check_device(DT_Q4_K, DT_Q5_0, 0, "Q4_K gate / up, Q5_0 down (the affine layout)");
    check_device(DT_Q8_0, DT_Q8_0, 1, "Q8_0");
}

/* ---- prefill steps: the grouped expert GEMM (cuda_moe_gemm.cu) ---- */

/* cuda_moe_gemm on its own: GE experts of [GN, gk] in format dt (GN = 80: a partial 64-row
 * tile), pairs ordered by expert with expert 0 taking 300 (segments of 128, 128 and 44),
 * expert 1 none and expert 2 five; the inputs gathered through xrow, the outputs scattered
 * through yrow, two tables in one launch (the second must match the first to the bit);
 * then on the gated product (cuda_gated_bf16, SiLU and GELU). Oracle:
 * the CPU reference's dequantization (op_weight_dequant: ggml's, mx.dequantize's order), weights and inputs rounded to
 * bf16 as the kernel rounds them, products summed in double. Allowed: the f32 sums (1e-5 of the sum of |terms|) and a
 * value that rounds to the neighbouring bf16 (the device's fused multiply-add in a dequantizer, its exp in the gated
 * form): 2^-8 of a term each, two of the largest at most. A wrong row, token, expert or segment is off by the size of
 * the whole sum. */
enum { GE = 3, GN = 80, GT = 40 };
static void moe_gemm_case(tensor_dtype dt, int gk) {
    static const int cnt[GE] = {300, 0, 5};
    int P = cnt[0] + cnt[1] + cnt[2], TOK = CUDA_MOE_GEMM_TOKENS;
    void *keep;
    op_weight w = expert_weight(dt, (int64_t)GE * GN, gk, &keep);
    float *wf = malloc((size_t)GE * GN * gk * sizeof(float));
    for (int r = 0; r < GE * GN; r++) op_weight_dequant_row(&w, r, wf + (size_t)r * gk); /* the CPU reference's */
    cuda_weight sl[GE];
    const void *tab[2 * GE];
    hearth_error e = {0};
    for (int x = 0; x < GE; x++) {
        int expanded = 0;
        op_weight slice = op_weight_rows(&w, (int64_t)x * GN, GN);
        assert_int_equal(cuda_weight_upload_any(&sl[x], &slice, "test expert", &expanded, &e), HEARTH_OK);
        tab[x] = sl[x].data, tab[GE + x] = sl[x].scales;
    }
    assert_true(cuda_moe_gemm_takes(&sl[0]));
    const void *const *dtab = dev_upload(tab, sizeof tab);
    cuda_expert_table t = {.proto = &sl[0], .data = dtab, .scales = sl[0].scales ? dtab + GE : NULL};
    /* pairs by expert: expert, token (gathered), destination row (a permutation) */
    int32_t *xrow = malloc((size_t)P * sizeof(int32_t)), *yrow = malloc((size_t)P * sizeof(int32_t)),
            *ex = malloc((size_t)P * sizeof(int32_t)), segs[3 * 8], nseg = 0;
    for (int x = 0, p = 0; x < GE; x++) {
        for (int i = 0; i < cnt[x]; i++, p++) ex[p] = x, xrow[p] = (int32_t)(rnd() % GT), yrow[p] = p;
        for (int i = 0; i < cnt[x]; i += TOK, nseg++) {
            segs[3 * nseg] = x, segs[3 * nseg + 1] = p - cnt[x] + i;
            segs[3 * nseg + 2] = cnt[x] - i < TOK ? cnt[x] - i : TOK;
        }
    }
    assert_int_equal(nseg, 4);
    for (int p = P - 1; p > 0; p--) { /* shuffle the destinations */
        int j = (int)(rnd() % (uint32_t)(p + 1));
        int32_t v = yrow[p];
        yrow[p] = yrow[j], yrow[j] = v;
    }
    float *x = rnd_floats((size_t)GT * gk, 1.0f, 0.0f), *gate = rnd_floats((size_t)P * gk, 3.0f, 0.0f),
          *up = rnd_floats((size_t)P * gk, 1.0f, 0.0f), *got = malloc((size_t)P * GN * sizeof(float)),
          *got2 = malloc((size_t)P * GN * sizeof(float));
    float *dx = dev_upload(x, (size_t)GT * gk * sizeof(float)), *dg = dev_upload(gate, (size_t)P * gk * sizeof(float)),
          *du = dev_upload(up, (size_t)P * gk * sizeof(float)), *dy = dev_upload(NULL, (size_t)P * GN * sizeof(float)),
          *dy2 = dev_upload(NULL, (size_t)P * GN * sizeof(float));
    int32_t *dxrow = dev_upload(xrow, (size_t)P * sizeof(int32_t)),
            *dyrow = dev_upload(yrow, (size_t)P * sizeof(int32_t)), *dsegs = dev_upload(segs, sizeof segs);
    void *dxb = dev_upload(NULL, (size_t)P * gk * 2); /* the bf16 inputs: x's rows, or the gated product */
    enum { PLAIN, SILU, GELU };
    for (int act = PLAIN; act <= GELU; act++) {
        cuda_expert_table two[2] = {t, t};
        float *ys[2] = {dy, dy2};
        if (act == PLAIN) {
            assert_int_equal(cuda_to_bf16(dx, (size_t)GT * gk, dxb, &e), HEARTH_OK);
            assert_int_equal(cuda_moe_gemm(two, 2, ys, dyrow, dsegs, nseg, NULL, dxb, dxrow, &e), HEARTH_OK);
        } else {
            assert_int_equal(cuda_gated_bf16(dg, du, (size_t)P * gk, act == GELU, dxb, &e), HEARTH_OK);
            assert_int_equal(cuda_moe_gemm(&t, 1, ys, dyrow, dsegs, nseg, NULL, dxb, NULL, &e), HEARTH_OK);
        }
        assert_int_equal(cuda_sync(&e), HEARTH_OK);
        assert_int_equal(cuda_download(got, dy, (size_t)P * GN * sizeof(float), &e), HEARTH_OK);
        if (act == PLAIN) {
            assert_int_equal(cuda_download(got2, dy2, (size_t)P * GN * sizeof(float), &e), HEARTH_OK);
            assert_memory_equal(got, got2, (size_t)P * GN * sizeof(float));
        }
        double worst = 0.0;
        for (int p = 0; p < P; p++)
            for (int r = 0; r < GN; r++) {
                const float *wr = wf + ((size_t)ex[p] * GN + r) * gk;
                double sum = 0.0, mag = 0.0, big = 0.0;
                for (int k = 0; k < gk; k++) {
                    float in;
                    if (act == PLAIN)
                        in = x[(size_t)xrow[p] * gk + k];
                    else {
                        float g = gate[(size_t)p * gk + k], u = up[(size_t)p * gk + k];
                        in = act == SILU
                                 ? g / (1.0f + expf(-g)) * u
                                 : 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
                    }
                    double term = (double)bf16_round(wr[k]) * (double)bf16_round(in);
                    sum += term, mag += fabs(term), big = fmax(big, fabs(term));
                }
                /* past the f32 sums' share, in units of the largest term */
                double d = (fabs((double)got[(size_t)yrow[p] * GN + r] - sum) - 1e-5 * mag) / (big + 1e-30);
                if (d > worst) worst = d;
            }
        printf("  moe_gemm %s k %d act %d: worst error past the f32 sums %.3g of the largest term\n",
               tensor_dtype_name(dt), gk, act, worst);
        assert_true(worst <= 1.0 / 128);
    }
    cuda_free(dxb), cuda_free(dx), cuda_free(dg), cuda_free(du), cuda_free(dy), cuda_free(dy2), cuda_free(dxrow),
        cuda_free(dyrow), cuda_free(dsegs), cuda_free((void *)dtab);
    for (int i = 0; i < GE; i++) cuda_weight_free(&sl[i]);
    free(keep), free(wf), free(xrow), free(yrow), free(ex), free(x), free(gate), free(up), free(got), free(got2);
}

/* cuda_moe_sort: T tokens' K distinct experts of E (ascending per token, as the routing
 * writes them); every pair placed once, by expert, its token and slot right, and segments
 * that tile the pairs in order, one expert each, at most tok long. */
static void sort_case(int T, int K, int E, int tok) {
    int P = T * K, smax = P / tok + E;
    int32_t *sel = malloc((size_t)P * sizeof(int32_t)), *rows = malloc((size_t)P * sizeof(int32_t)),
            *dst = malloc((size_t)P * sizeof(int32_t)), *segs = malloc((size_t)smax * 3 * sizeof(int32_t)), nseg = -1;
    for (int t = 0; t < T; t++) /* K distinct experts, skewed towards the low ones (long runs) */
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(rnd() % (uint32_t)E);
                if (rnd() % 2) e %= K + 2;
                dup = 0;
                for (int j = 0; j < k; j++) dup |= sel[t * K + j] == e;
            } while (dup);
            int j = k; /* ascending */
            while (j > 0 && sel[t * K + j - 1] > e) sel[t * K + j] = sel[t * K + j - 1], j--;
            sel[t * K + j] = e;
        }
    int32_t *dsel = dev_upload(sel, (size_t)P * sizeof(int32_t)),
            *drows = dev_upload(NULL, (size_t)P * sizeof(int32_t)),
            *ddst = dev_upload(NULL, (size_t)P * sizeof(int32_t)),
            *dsegs = dev_upload(NULL, (size_t)smax * 3 * sizeof(int32_t)), *dn = dev_upload(NULL, sizeof(int32_t));
    hearth_error e = {0};
    assert_int_equal(cuda_moe_sort(dsel, T, K, E, tok, drows, ddst, dsegs, dn, &e), HEARTH_OK);
    assert_int_equal(cuda_download(rows, drows, (size_t)P * sizeof(int32_t), &e), HEARTH_OK);
    assert_int_equal(cuda_download(dst, ddst, (size_t)P * sizeof(int32_t), &e), HEARTH_OK);
    assert_int_equal(cuda_download(&nseg, dn, sizeof(int32_t), &e), HEARTH_OK);
    assert_true(nseg > 0 && nseg <= smax);
    assert_int_equal(cuda_download(segs, dsegs, (size_t)nseg * 3 * sizeof(int32_t), &e), HEARTH_OK);
    char *seen = calloc((size_t)P, 1);
    for (int c = 0; c < P; c++) {
        assert_true(dst[c] >= 0 && dst[c] < P && !seen[dst[c]]);
        seen[dst[c]] = 1;
        assert_int_equal(rows[c], dst[c] / K);
        if (c) assert_true(sel[dst[c]] >= sel[dst[c - 1]]);
    }
    for (int i = 0, at = 0; i < nseg; i++) {
        int ex = segs[3 * i], p0 = segs[3 * i + 1], n = segs[3 * i + 2];
        assert_int_equal(p0, at);
        assert_true(n >= 1 && n <= tok);
        for (int c = p0; c < p0 + n; c++) assert_int_equal(sel[dst[c]], ex);
        at += n;
        if (i == nseg - 1) assert_int_equal(at, P);
    }
    cuda_free(dsel), cuda_free(drows), cuda_free(ddst), cuda_free(dsegs), cuda_free(dn);
    free(sel), free(rows), free(dst), free(segs), free(seen);
}

static void test_moe_gemm(void **state) {
    (void)state;
    sort_case(4096, 8, 256, CUDA_MOE_GEMM_TOKENS); /* Qwen3.5-35B-A3B's prefill step */
    sort_case(13, 2, 8, CUDA_MOE_GEMM_TOKENS);
    sort_case(300, 4, 1100, 16);
    moe_gemm_case(DT_Q8_0, 96);
    moe_gemm_case(DT_Q4_K, 256);
    moe_gemm_case(DT_Q6_K, 512);
    moe_gemm_case(DT_Q5_0, 96); /* the generic affine layout */
    moe_gemm_case(DT_U32, 512); /* MLX 4-bit in the chunked layout (k % 64 == 0, k >= 512) */
    moe_gemm_case(DT_U32, 128); /* MLX 4-bit in the plain layout */
}

/* The model and steps the device tests run, on the CPU alone (this runs without a GPU too):
 * every logit finite and the rows not all alike, so the comparisons above compare something. */
static void test_model_runs_on_cpu(void **state) {
    (void)state;
    /* the host-routed tests' four models, then the device-routed tests' five */
    static const tensor_dtype gu[5] = {DT_Q4_K, DT_Q4_K, DT_U32, DT_Q4_K, DT_Q8_0},
                              down[5] = {DT_Q6_K, DT_Q4_K, DT_U32, DT_Q5_0, DT_Q8_0};
    for (int v = 0; v < 9; v++) {
        moe_model m;
        if (v < 4)
            model_make(&m, v < 2 ? DT_F32 : DT_Q8_0, v % 2);
        else
            model_make_as(&m, gu[v - 4], down[v - 4], v == 5 || v == 8, D_HID, D_FFN);
        step_plan *p = malloc(sizeof(step_plan) * N_STEPS);
        plan_steps(p);
        size_t n = logits_floats(p);
        float *out = cpu_run(&m, p);
        size_t distinct = 0;
        for (size_t i = 0; i < n; i++) {
            assert_true(isfinite(out[i]));
            distinct += out[i] != out[i % M_VOC];
        }
        assert_true(distinct > n / 2);
        free(out), free(p);
        model_free(&m);
    }
}

/* op_model.release_host (a load that mapped the weights): the upload hands back every byte
 * of every device weight once (each expert slice after its copy, MLX scales and biases too,
 * with offload as well), and never a vector's or anything else's. The recorder keeps the
 * ranges only (the weights here are the test's own memory). */
enum { MAX_RELEASED = 256 };
static struct {
    const uint8_t *p;
    size_t n;
} released[MAX_RELEASED];
static int n_released;

static void record_release(const void *ctx, const void *p, size_t n) {
    assert_true(ctx == (const void *)released);
    assert_true(n_released < MAX_RELEASED);
    released[n_released].p = p, released[n_released++].n = n;
}

/* Bytes of the recorded ranges inside [p, p + n); every range is inside exactly one of the
 * test's spans (checked by the caller's total). */
static size_t released_in(const void *p, size_t n) {
    size_t got = 0;
    for (int i = 0; i < n_released; i++) {
        const uint8_t *a = released[i].p, *lo = p;
        if (a >= lo && a + released[i].n <= lo + n) got += released[i].n;
    }
    return got;
}

static void release_case(tensor_dtype dt, tensor_dtype dt_down, int slots) {
    moe_model m;
    model_make_as(&m, dt, dt_down, 0, M_HID, M_FFN);
    m.om.release_host = record_release, m.om.release_ctx = released;
    n_released = 0;
    kv_cache kv;
    kv_make(&kv);
    op_backend *gpu = NULL;
    hearth_error e = {0};
    assert_int_equal(cuda_model_create(&m.om, &kv, M_MT, M_MT, 1, slots, NULL, &gpu, NULL, 0, &e), HEARTH_OK);
    const op_weight *ws[5] = {&m.router, &m.gate, &m.up, &m.down, &m.lm_head};
    size_t total = 0, all = 0;
    for (int i = 0; i < 5; i++) {
        const op_weight *w = ws[i];
        size_t bytes = (size_t)w->n * (size_t)op_weight_row_bytes(w);
        assert_int_equal(released_in(w->data, bytes), bytes);
        total += bytes;
        if (w->scales) { /* MLX: scales and biases, each [n, k / group] bf16 */
            size_t sb = (size_t)w->n * (size_t)(w->k / w->group_size) * 2;
            assert_int_equal(released_in(w->scales, sb), sb);
            assert_int_equal(released_in(w->biases, sb), sb);
            total += 2 * sb;
        }
    }
    for (int i = 0; i < n_released; i++) all += released[i].n;
    assert_int_equal(all, total); /* each byte once, nothing else (the vectors) */
    assert_int_equal(released_in(m.norm_in, M_HID * sizeof(float)), 0);
    printf("  %s, %d slots: %d ranges released, %zu bytes\n", dt == DT_U32 ? "mlx4" : "q8_0", slots, n_released, all);
    gpu->t->free(gpu);
    kv_destroy(&kv);
    model_free(&m);
}

static void test_release_host(void **state) {
    (void)state;
    release_case(DT_Q8_0, DT_Q8_0, 0);
    release_case(DT_Q8_0, DT_Q8_0, 3);
    release_case(DT_U32, DT_Q8_0, 0); /* MLX 4-bit gate and up (rows of 64: one group), Q8_0 downs */
}

/* A model without experts: expert_slots is ignored (nothing to offload, no pool). */
static void test_no_experts_ignored(void **state) {
    (void)state;
    moe_model m;
    model_make(&m, DT_F32, 0);
    m.om.dims.n_experts = m.om.dims.top_k_experts = m.om.dims.moe_ffn = 0;
    m.om.n_items = 1; /* the router only: a plain matrix */
    kv_cache kv;
    kv_make(&kv);
    op_backend *gpu = NULL;
    hearth_error e = {0};
    assert_int_equal(cuda_model_create(&m.om, &kv, M_MT, M_MT, 1, 3, NULL, &gpu, NULL, 0, &e), HEARTH_OK);
    long long hits = -1, misses = -1;
    cuda_model_expert_stats(gpu, &hits, &misses);
    assert_true(hits == 0 && misses == 0);
    gpu->t->free(gpu);
    kv_destroy(&kv);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest host_only[] = {cmocka_unit_test(test_model_runs_on_cpu)};
    if (cuda_device_count() == 0) {
        printf("test_cuda_moe_offload: skipped: no CUDA device. The --expert-offload device tests did NOT run and "
               "do not count as passed; only the model's CPU run is checked below.\n");
        return cmocka_run_group_tests(host_only, NULL, NULL);
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda_moe_offload: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull; /* fresh random inputs every run */
    printf("test_cuda_moe_offload: device 0: %s; seed %llx\n", info.name, (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_runs_on_cpu),  cmocka_unit_test(test_offload_f32),
        cmocka_unit_test(test_offload_q8_0),       cmocka_unit_test(test_route_matches_host),
        cmocka_unit_test(test_device_routed),      cmocka_unit_test(test_moe_gemm),
        cmocka_unit_test(test_no_experts_ignored), cmocka_unit_test(test_release_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
