/* test_cuda_plan.c: the CUDA backend's sizing (cuda_plan.c), which hearth fit --device cuda
 * predicts from and cuda_model_create allocates by: each format's device layout against
 * its GGUF/MLX block definition, the f32 expansion, the KV planes per device dtype and the
 * allocator's page rounding. Pure arithmetic: runs without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_lora_cache.h"
#include "backend/cuda/cuda_plan.h"
#include "backend/cuda/cuda_sample.h"

#define MIB ((size_t)1 << 20)

static size_t total(const op_weight *w, int *expanded) {
    size_t d, s;
    *expanded = cuda_weight_layout(w, &d, &s);
    return d + s;
}

static void test_layouts_keep_the_gguf_bytes(void **state) {
    (void)state;
    int ex;
    /* GGUF blocks: Q8_0 34 bytes per 32 weights, Q6_K 210 per 256, Q4_K 144 per 256 (ggml's
     * block_q8_0 / block_q6_K / block_q4_K): the device planes hold the same bytes */
    op_weight q8 = {.dtype = DT_Q8_0, .n = 6, .k = 96};
    assert_int_equal(total(&q8, &ex), 6 * 3 * 34);
    assert_int_equal(ex, 0);
    op_weight q6 = {.dtype = DT_Q6_K, .n = 3, .k = 512};
    assert_int_equal(total(&q6, &ex), 3 * 2 * 210);
    op_weight q4 = {.dtype = DT_Q4_K, .n = 5, .k = 256};
    assert_int_equal(total(&q4, &ex), 5 * 144);
    op_weight bf = {.dtype = DT_BF16, .n = 7, .k = 33};
    assert_int_equal(total(&bf, &ex), 7 * 33 * 2);
    /* MLX 4-bit, group 64: k/8 words per row plus one (scale, bias) word per group */
    op_weight mlx = {.dtype = DT_U32, .n = 4, .k = 128, .bits = 4, .group_size = 64, .sb_dtype = DT_BF16};
    assert_int_equal(total(&mlx, &ex), 4 * (128 / 8 * 4 + 2 * 4));
    assert_int_equal(ex, 0);
    /* GGUF Q4_0 / Q4_1 as MLX 4-bit with groups of 32: 16 bytes of nibbles and a (scale, bias)
     * word per block of 32 (the GGUF's 18 / 20 bytes) */
    op_weight q40 = {.dtype = DT_Q4_0, .n = 3, .k = 64}, q41 = {.dtype = DT_Q4_1, .n = 3, .k = 64};
    assert_int_equal(total(&q40, &ex), 3 * 2 * (16 + 4));
    assert_int_equal(ex, 0);
    assert_int_equal(total(&q41, &ex), 3 * 2 * (16 + 4));
    assert_int_equal(ex, 0);
}

/* The generic affine layout (cuda_affine.h): b-bit codes, an f32 (scale, bias) pair per group. */
static void test_affine_layout_bits_plus_pairs(void **state) {
    (void)state;
    int ex;
    op_weight q50 = {.dtype = DT_Q5_0, .n = 3, .k = 64}; /* 5 bits, groups of 32 */
    assert_int_equal(total(&q50, &ex), 3 * 64 * 5 / 8 + 3 * 2 * 8);
    assert_int_equal(ex, 0);
    op_weight q3k = {.dtype = DT_Q3_K, .n = 2, .k = 512}; /* 3 bits, groups of 16 */
    assert_int_equal(total(&q3k, &ex), 2 * 512 * 3 / 8 + 2 * 32 * 8);
    op_weight q2k = {.dtype = DT_Q2_K, .n = 2, .k = 256}, q5k = {.dtype = DT_Q5_K, .n = 2, .k = 256};
    assert_int_equal(total(&q2k, &ex), 2 * 256 * 2 / 8 + 2 * 16 * 8);
    assert_int_equal(total(&q5k, &ex), 2 * 256 * 5 / 8 + 2 * 8 * 8);
    op_weight mlx8 = {.dtype = DT_U32, .n = 2, .k = 64, .bits = 8, .group_size = 64, .sb_dtype = DT_F16};
    assert_int_equal(total(&mlx8, &ex), 2 * 64 + 2 * 8);
    assert_int_equal(ex, 0);
    op_weight mlx6 = {.dtype = DT_U32, .n = 2, .k = 128, .bits = 6, .group_size = 32, .sb_dtype = DT_BF16};
    assert_int_equal(total(&mlx6, &ex), 2 * 128 * 6 / 8 + 2 * 4 * 8);
}

static void test_formats_without_a_kernel_expand_to_f32(void **state) {
    (void)state;
    int ex;
    op_weight q5k_odd = {.dtype = DT_Q5_K, .n = 3, .k = 288}; /* not whole super-blocks */
    assert_int_equal(total(&q5k_odd, &ex), 3 * 288 * 4);
    assert_int_equal(ex, 1);
    op_weight mlx8 = {.dtype = DT_U32, .n = 2, .k = 96, .bits = 8, .group_size = 48, .sb_dtype = DT_F16};
    assert_int_equal(total(&mlx8, &ex), 2 * 96 * 4); /* a group the kernels have no instance for */
    assert_int_equal(ex, 1);
    op_weight q8_odd = {.dtype = DT_Q8_0, .n = 2, .k = 48}; /* k not a whole block: no kernel */
    assert_int_equal(total(&q8_odd, &ex), 2 * 48 * 4);
    assert_int_equal(ex, 1);
}

static void test_kv_planes_per_dtype(void **state) {
    (void)state;
    /* 2 layers, 10 blocks of 16 positions, 4 KV heads of 64 */
    size_t rows = 2 * 10 * 16 * 4;
    assert_int_equal(cuda_kv_plane_bytes(2, 10, 4, 64, CUDA_KV_F32), rows * 64 * 4);
    assert_int_equal(cuda_kv_plane_bytes(2, 10, 4, 64, CUDA_KV_INT8), rows * 64 + rows * 4);
    /* the device pool stores what --kv-quant says (cuda_kv.cu) */
    assert_int_equal(cuda_kv_device_dtype(HEARTH_KV_FLOAT), CUDA_KV_F32);
    assert_int_equal(cuda_kv_device_dtype(HEARTH_KV_INT8), CUDA_KV_INT8);
    assert_int_equal(cuda_kv_device_dtype(HEARTH_KV_FP8), CUDA_KV_FP8);
    size_t data, scales;
    cuda_kv_plane_parts(2, 10, 4, 64, CUDA_KV_FP8, &data, &scales);
    assert_int_equal(data, rows * 64);
    assert_int_equal(scales, rows * 4);
    /* both planes, keys and values: the function the KV budget uses */
    assert_int_equal(cuda_kv_bytes(2, 4, 64, 10, HEARTH_KV_INT8), 2 * (rows * 64 + rows * 4));
    assert_int_equal(cuda_kv_bytes(2, 4, 64, 10, 7), 0);
    assert_true(cuda_kv_position_bytes(4, 64, CUDA_KV_F32) == 2.0 * 4 * 64 * 4);
}

static void test_page_rounding(void **state) {
    (void)state;
    cuda_alloc_tally t = {0};
    cuda_tally_add(&t, 2 * MIB);     /* one page */
    cuda_tally_add(&t, 2 * MIB + 1); /* two */
    assert_int_equal(cuda_tally_bytes(&t), 6 * MIB);
    for (int i = 0; i < 100; i++) cuda_tally_add(&t, 1000); /* 100 x 1024 aligned: share one page */
    assert_int_equal(cuda_tally_bytes(&t), 8 * MIB);
    assert_int_equal(t.requested, 4 * MIB + 1 + 100 * 1000);
    assert_int_equal(t.count, 102);
    size_t q, s;
    cuda_gemv_act_layout(33, &q, &s); /* rounded up to whole blocks of 32 */
    assert_int_equal(q, 64);
    assert_int_equal(s, 2 * 8);
}

/* The upload reorders each Q4_K super-block's 12 scale/min bytes at upload
 * (cuda_q4k_pack12, run by the upload kernel); the prefill dequantizer and the GEMVs read
 * them back with cuda_q4k_scale_min(packed = 1): every (scale, min) of random blocks must
 * come back as GGUF's order gives it, and distinct blocks must stay distinct (a bijection). */
static void test_q4k_packed_scales_round_trip(void **state) {
    (void)state;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 20000; it++) {
        uint8_t in[12], out[12];
        for (int i = 0; i < 12; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            in[i] = (uint8_t)(r >> 24);
        }
        cuda_q4k_pack12(in, out);
        for (int j = 0; j < 8; j++) {
            int s0, m0, s1, m1;
            cuda_q4k_scale_min(in, j, 0, &s0, &m0);
            cuda_q4k_scale_min(out, j, 1, &s1, &m1);
            assert_int_equal(s1, s0);
            assert_int_equal(m1, m0);
        }
        uint8_t same[12]; /* in place, as the kernel does it */
        for (int i = 0; i < 12; i++) same[i] = in[i];
        cuda_q4k_pack12(same, same);
        assert_memory_equal(same, out, 12);
    }
}

/* Models whose layers differ (Gemma 4): the KV pool is each layer's own shape summed (as the
 * host pool lays it out), the per-layer inputs add two [T, n_layers * per_layer_dim] device
 * buffers and one pinned staging buffer, and a host-only item (the per-layer embedding table,
 * made into rows on the host) takes no device bytes and is no GEMM scratch candidate. */
static void test_varied_layers_plan(void **state) {
    (void)state;
    int heads[3] = {2, 1, 2}, dims[3] = {256, 512, 256};
    kv_cache kv = {.n_layers = 3, .n_kv_heads = 2, .head_dim = 512, .n_blocks = 10, .max_slots = 2,
                   .max_blocks_per_slot = 4, .layer_heads = heads, .layer_dims = dims};
    size_t data, scales, elems = (size_t)10 * KV_BLOCK_SIZE * (2 * 256 + 1 * 512 + 2 * 256);
    cuda_kv_pool_parts(&kv, CUDA_KV_F32, &data, &scales);
    assert_int_equal(data, elems * 4);
    assert_int_equal(scales, 0);
    cuda_kv_pool_parts(&kv, CUDA_KV_INT8, &data, &scales);
    assert_int_equal(data, elems);
    assert_int_equal(scales, (size_t)10 * KV_BLOCK_SIZE * (2 + 1 + 2) * sizeof(float));
    cuda_kv_pool_parts(&kv, CUDA_KV_F16, &data, &scales);
    assert_int_equal(data, elems * 2);
    /* a uniform pool: the planes of n_layers x n_kv_heads x head_dim */
    kv_cache uni = kv;
    uni.layer_heads = uni.layer_dims = NULL;
    size_t d2, s2;
    cuda_kv_pool_parts(&uni, CUDA_KV_FP8, &data, &scales);
    cuda_kv_plane_parts(3, 10, 2, 512, CUDA_KV_FP8, &d2, &s2);
    assert_int_equal(data, d2);
    assert_int_equal(scales, s2);

    enum { T = 32, L = 3, D = 64, H = 128 };
    op_weight table = {.dtype = DT_BF16, .n = 1000, .k = L * D}, proj = {.dtype = DT_F32, .n = L * D, .k = H};
    op_item items[2] = {{.w = &table, .name = "embed_tokens_per_layer", .layer = -1, .host_only = 1},
                        {.w = &proj, .name = "per_layer_model_projection", .layer = -1}};
    op_model om = {.dims = {.n_layers = L, .hidden = H, .n_heads = 4, .n_kv_heads = 2, .head_dim = 512, .ffn = 256,
                            .vocab = 1000, .norm_eps = 1e-6f, .varied_layers = 1, .per_layer_dim = D},
                   .items = items,
                   .n_items = 2};
    cuda_plan p, q;
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 0, &p);
    assert_int_equal(p.per_layer_floats, (size_t)T * L * D);
    assert_int_equal(p.gemm_max_w, (size_t)L * D * H); /* the projection, not the table */
    /* keys, values and the block tables */
    assert_true(p.kv >= 2 * elems * sizeof(float) && p.kv < 2 * elems * sizeof(float) + 2 * MIB);
    om.items = items + 1, om.n_items = 1; /* the same model without the host-only table */
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 0, &q);
    assert_int_equal(p.weights, q.weights);
    assert_int_equal(p.requested, q.requested);
    om.dims.per_layer_dim = 0; /* no per-layer inputs: two device buffers and their staging less */
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 0, &q);
    assert_int_equal(q.per_layer_floats, 0);
    assert_int_equal(p.requested - q.requested, 2 * (size_t)T * L * D * sizeof(float));
    assert_int_equal(p.pinned_host - q.pinned_host, (size_t)T * L * D * sizeof(float));
    assert_int_equal(p.n_allocs - q.n_allocs, 2);
}

/* --expert-offload (cuda_plan.expert_slots): the expert slices leave the device's weights
 * for pinned host memory, a pool of slots comes in their place, each slot a data plane of
 * the largest slice's data and a scales plane of the largest slice's scales; the numbers
 * written out from each format's layout (Q8_0: k int8 + k/32 f16 per row; F32: 4k per row). */
static void test_expert_offload_plan(void **state) {
    (void)state;
    enum { E = 4, F = 96, H = 64, T = 16 };
    op_weight router = {.dtype = DT_F32, .n = E, .k = H}, gate = {.dtype = DT_Q8_0, .n = E * F, .k = H},
              down = {.dtype = DT_F32, .n = E * H, .k = F};
    op_item items[3] = {{.w = &router, .name = "router", .layer = 0},
                        {.w = &gate, .name = "experts_gate", .layer = 0, .experts = E},
                        {.w = &down, .name = "experts_down", .layer = 0, .experts = E}};
    op_model om = {.dims = {.n_layers = 1, .hidden = H, .n_heads = 1, .n_kv_heads = 1, .head_dim = 32, .ffn = F,
                            .vocab = 100, .norm_eps = 1e-6f, .n_experts = E, .top_k_experts = 2, .moe_ffn = F},
                   .items = items,
                   .n_items = 3};
    kv_cache kv = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .n_blocks = 4, .max_slots = 1,
                   .max_blocks_per_slot = 4};
    size_t gate_data = (size_t)F * H, gate_scales = (size_t)F * (H / 32) * 2, down_data = (size_t)H * F * 4;
    size_t experts = E * (gate_data + gate_scales + down_data);
    cuda_plan r, o;
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 0, &r);
    assert_int_equal(r.expert_slots, 0);
    assert_int_equal(r.expert_bytes, experts);
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 5, &o);
    assert_int_equal(o.expert_slots, 5);
    assert_int_equal(o.expert_bytes, experts);
    assert_int_equal(o.slot_data_bytes, down_data); /* the largest data plane: an f32 down slice */
    assert_int_equal(o.slot_scale_bytes, gate_scales);
    /* requested device bytes: 2E slices' planes (3 allocations per expert) out, 5 x (data + scales) in */
    assert_int_equal(r.requested - experts + 5 * (down_data + gate_scales), o.requested);
    assert_int_equal(r.n_allocs - 3 * E + 2 * 5, o.n_allocs);
    assert_int_equal(o.pinned_host - r.pinned_host, experts);
    assert_int_equal(o.weights_read, r.weights_read); /* the kernels read the same slices */
    /* a model without experts: nothing to offload, the plan unchanged */
    om.dims.n_experts = 0, om.n_items = 1;
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 0, &r);
    cuda_plan_make(&om, &kv, T, 4, CUDA_KV_F32, 1, 5, &o);
    assert_int_equal(o.expert_slots, 0);
    assert_int_equal(o.requested, r.requested);
    assert_int_equal(o.pinned_host, r.pinned_host);
}

/* The device sampler and the LoRA row scratch, which the engine and cuda_model_create make
 * whatever the requests: their sizes written out from the buffers' definitions (cuda_sample.h:
 * a row's parameters and results, CUDA_SAMPLE_MAX_BIAS + CUDA_SAMPLE_MAX_WINDOW (id, value)
 * entries per row, a bit per token per row, a count per token and the bias order on the host;
 * cuda_lora.h: CUDA_LORA_MAX_SET table pointers and a count per row, the serving tier's
 * min(T, 256) x 3 projections x 8 adapters x rank 1024 floats), and the plan (what hearth fit
 * --device cuda reports) holding exactly the allocation code's sizes, for a few shapes. */
static void test_sampler_and_lora_scratch_plan(void **state) {
    (void)state;
    const struct {
        int rows, vocab, tokens;
    } shapes[] = {{1, 1000, 1}, {8, 49152, 256}, {33, 151936, 300}, {264, 262144, 2048}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        size_t R = (size_t)shapes[i].rows, V = (size_t)shapes[i].vocab, T = (size_t)shapes[i].tokens;
        cuda_sampler_sizes z;
        cuda_sampler_sizes_make(shapes[i].rows, shapes[i].vocab, &z);
        /* a result row: token, logprob, then HEARTH_MAX_TOP_LOGPROBS ids and logprobs */
        assert_int_equal(z.results, R * (2 + 2 * HEARTH_MAX_TOP_LOGPROBS) * 4);
        assert_true(z.params >= R * 23 * 4 && z.params <= R * 26 * 4); /* 22 4-byte fields and a double */
        assert_int_equal(z.entry_ids, R * (1024 + 4096) * 4);
        assert_int_equal(z.entry_values, R * (1024 + 4096) * 4);
        assert_int_equal(z.masks, R * ((V + 31) / 32) * 4);
        assert_int_equal(z.counts, V * 4);
        assert_int_equal(z.order, 1024 * 4);
        assert_int_equal(cuda_sampler_sizes_device(&z), z.params + z.entry_ids + z.entry_values + z.results + z.masks);
        cuda_lora_cache_sizes l;
        cuda_lora_cache_sizes_make(shapes[i].tokens, &l);
        assert_int_equal(l.sets, T * 8 * sizeof(void *));
        assert_int_equal(l.counts, T * 4);
        /* the grouped tier's tables: a pointer and two int32 per row (of up to 256), two int32 */
        size_t gT = T < 256 ? T : 256;
        assert_int_equal(l.groups, gT * sizeof(void *) + (2 * gT + 2) * 4);
        /* the fast tier's rank values, then one expert's gathered row tables (sets and counts
         * again), then the group tables */
        assert_int_equal(l.fast, gT * 3 * 8 * 1024 * 4 + l.sets + l.counts + l.groups);

        op_weight w = {.dtype = DT_F32, .n = 64, .k = 64};
        op_item items[1] = {{.w = &w, .name = "q_proj", .layer = 0}};
        op_model om = {.dims = {.n_layers = 1, .hidden = 64, .n_heads = 1, .n_kv_heads = 1, .head_dim = 64, .ffn = 64,
                                .vocab = shapes[i].vocab, .norm_eps = 1e-6f},
                       .items = items,
                       .n_items = 1};
        kv_cache kv = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .n_blocks = 4, .max_slots = 1,
                       .max_blocks_per_slot = 4};
        cuda_plan p;
        cuda_plan_make(&om, &kv, shapes[i].tokens, shapes[i].rows, CUDA_KV_F32, 0, 0, &p);
        /* the sampler's five device buffers, each taken as the allocator takes it */
        cuda_alloc_tally t = {0};
        size_t bufs[] = {z.params, z.entry_ids, z.entry_values, z.results, z.masks};
        for (size_t b = 0; b < 5; b++) cuda_tally_add(&t, bufs[b]);
        assert_int_equal(p.sampler, t.large + t.small);
        assert_int_equal(p.sampler_host, z.counts + z.order);
        assert_int_equal(cuda_plan_bytes(&p), p.weights + p.kv + p.scratch + p.sampler);
        assert_int_equal(p.lora_sets_bytes, l.sets);
        assert_int_equal(p.lora_counts_bytes, l.counts);
        assert_int_equal(p.lora_fast_bytes, l.fast);
        /* the pinned host copies of the sampler's buffers and of the LoRA row tables */
        assert_true(p.pinned_host >= cuda_sampler_sizes_device(&z) + l.sets + l.counts + l.groups);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expert_offload_plan),
        cmocka_unit_test(test_layouts_keep_the_gguf_bytes),
        cmocka_unit_test(test_q4k_packed_scales_round_trip),
        cmocka_unit_test(test_affine_layout_bits_plus_pairs), cmocka_unit_test(test_formats_without_a_kernel_expand_to_f32),
        cmocka_unit_test(test_kv_planes_per_dtype),
        cmocka_unit_test(test_page_rounding),
        cmocka_unit_test(test_varied_layers_plan),
        cmocka_unit_test(test_sampler_and_lora_scratch_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
