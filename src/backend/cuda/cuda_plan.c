/* cuda_plan.c: sizes of every device buffer of cuda_model (cuda_plan.h): the device layout
 * of each weight format, the KV pool per device dtype, the scratch of one step, the device
 * sampler and the LoRA row tables (cuda_sampler_sizes_make, cuda_lora_cache_sizes_make), and
 * the allocator's page rounding. Shared by the allocating code (cuda_model_create,
 * cuda_sampler_create, cuda_lora_cache_create) and hearth fit --device cuda (which predicts
 * from them). Pure arithmetic: no CUDA calls. */
#include "backend/cuda/cuda_plan.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_affine.h"
#include "backend/cuda/cuda_lora.h"
#include "backend/cuda/cuda_lora_cache.h"
#include "backend/cuda/cuda_sample_rows.h"
#include "kv/kv_cache.h"
#include "kv/kv_state.h"
#include <string.h>

/* The device allocator (cudaMalloc on Linux drivers since Pascal) backs memory with 2 MiB
 * pages: an allocation of a page or more takes whole pages, smaller ones are packed into
 * shared pages at 512-byte alignment. tools/gpu_round.d/gpu-fit.sh probes this on the
 * device (cudaMemGetInfo before/after cudaMalloc of chosen sizes) and prints what it saw. */
#define CUDA_ALLOC_PAGE ((size_t)2 << 20)
#define CUDA_ALLOC_SMALL CUDA_ALLOC_PAGE
#define CUDA_ALLOC_ALIGN ((size_t)512)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void cuda_tally_add(cuda_alloc_tally *t, size_t bytes) {
    if (!bytes) bytes = 1; /* cuda_alloc asks for at least one byte */
    t->requested += bytes;
    t->count++;
    if (bytes >= CUDA_ALLOC_SMALL)
        t->large += round_up(bytes, CUDA_ALLOC_PAGE);
    else
        t->small += round_up(bytes, CUDA_ALLOC_ALIGN);
}

size_t cuda_tally_bytes(const cuda_alloc_tally *t) { return t->large + round_up(t->small, CUDA_ALLOC_PAGE); }

int cuda_kv_device_dtype(int kv_quant) {
    /* the device pool stores what --kv-quant asks (cuda_kv.cu); the enums share values */
    return kv_quant == HEARTH_KV_INT8  ? CUDA_KV_INT8
           : kv_quant == HEARTH_KV_FP8 ? CUDA_KV_FP8
           : kv_quant == HEARTH_KV_F16 ? CUDA_KV_F16
                                       : CUDA_KV_F32;
}

const char *cuda_kv_dtype_name(int dtype) {
    return dtype == CUDA_KV_INT8 ? "int8" : dtype == CUDA_KV_FP8 ? "fp8" : dtype == CUDA_KV_F16 ? "f16" : "f32";
}

void cuda_kv_plane_parts(int n_layers, int n_blocks, int n_kv_heads, int head_dim, int dtype, size_t *data,
                         size_t *scales) {
    size_t rows = (size_t)n_layers * n_blocks * KV_BLOCK_SIZE * n_kv_heads;
    *data = rows * head_dim * (dtype == CUDA_KV_F32 ? sizeof(float) : dtype == CUDA_KV_F16 ? 2 : 1);
    /* one float scale per row for the 8-bit formats */
    *scales = dtype == CUDA_KV_F32 || dtype == CUDA_KV_F16 ? 0 : rows * sizeof(float);
}

void cuda_kv_pool_parts(const kv_cache *kv, int dtype, size_t *data, size_t *scales) {
    if (!kv->layer_heads) {
        cuda_kv_plane_parts(kv->n_layers, kv->n_blocks, kv->n_kv_heads, kv->head_dim, dtype, data, scales);
        return;
    }
    *data = *scales = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t d, sc;
        cuda_kv_plane_parts(1, kv->n_blocks, kv->layer_heads[l], kv->layer_dims[l], dtype, &d, &sc);
        *data += d;
        *scales += sc;
    }
}

size_t cuda_kv_plane_bytes(int n_layers, int n_blocks, int n_kv_heads, int head_dim, int dtype) {
    size_t data, scales;
    cuda_kv_plane_parts(n_layers, n_blocks, n_kv_heads, head_dim, dtype, &data, &scales);
    return data + scales;
}

size_t cuda_kv_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant) {
    if (!kv_quant_known(quant)) return 0;
    return 2 * cuda_kv_plane_bytes(n_layers, n_blocks, n_kv_heads, head_dim, cuda_kv_device_dtype(quant));
}

double cuda_kv_position_bytes(int n_kv_heads, int head_dim, int dtype) {
    double row = dtype == CUDA_KV_F32   ? (double)head_dim * sizeof(float)
                 : dtype == CUDA_KV_F16 ? (double)head_dim * 2.0
                                        : (double)head_dim + sizeof(float);
    return 2.0 * n_kv_heads * row;
}

/* The formats with kernels of their own (the rest that cuda_affine_takes go to DT_AFFINE). */
static int format_own(const op_weight *w) {
    if (!w || w->n <= 0 || w->k <= 0) return 0;
    switch (w->dtype) {
    case DT_F32:
    case DT_F16:
    case DT_BF16: return 1;
    case DT_Q8_0: return w->k % 32 == 0;
    case DT_Q4_0:
    case DT_Q4_1: return w->k % 32 == 0; /* uploaded as MLX 4-bit, groups of 32 (cuda_device.cu) */
    case DT_Q4_K:
    case DT_Q6_K: return w->k % 256 == 0;
    case DT_U32: /* MLX affine: the 4-bit kernel reads 32 weights (16 bytes) of one group per load */
        return w->bits == 4 && w->group_size >= 32 && w->group_size % 32 == 0 && w->k % w->group_size == 0 &&
               (w->sb_dtype == DT_F16 || w->sb_dtype == DT_BF16);
    default: return 0;
    }
}

int cuda_weight_format_native(const op_weight *w) { return format_own(w) || cuda_affine_takes(w, NULL, NULL); }

int cuda_weight_goes_affine(const op_weight *w) { return !format_own(w) && cuda_affine_takes(w, NULL, NULL); }

int cuda_weight_layout(const op_weight *w, size_t *data_bytes, size_t *scale_bytes) {
    size_t nk = (size_t)w->n * (size_t)w->k;
    *scale_bytes = 0;
    if (!cuda_weight_format_native(w)) {
        *data_bytes = nk * sizeof(float); /* expanded to F32 on the host */
        return 1;
    }
    int bits, group;
    if (!format_own(w) && cuda_affine_takes(w, &bits, &group)) { /* code planes + (scale, bias) f32 pairs */
        *data_bytes = cuda_affine_code_bytes(w->n, w->k, bits);
        *scale_bytes = cuda_affine_pair_bytes(w->n, w->k, group);
        return 0;
    }
    switch (w->dtype) {
    case DT_Q8_0: /* int8 plane [n][k] + f16 scale plane [n][k/32] */
        *data_bytes = nk;
        *scale_bytes = nk / 32 * 2;
        break;
    case DT_Q6_K: /* ql + qh planes; int8 sub-block scales + f16 d per 256 */
        *data_bytes = nk / 2 + nk / 4;
        *scale_bytes = nk / 16 + nk / 256 * 2;
        break;
    case DT_Q4_K: /* GGUF super-blocks; the packed order (default) only reorders their scale bytes (same size) */
        *data_bytes = (size_t)w->n * (size_t)(w->k / 256) * 144;
        break;
    case DT_U32: /* packed words + one (scale, bias) word per group */
        *data_bytes = nk / 8 * 4;
        *scale_bytes = (size_t)w->n * (size_t)(w->k / w->group_size) * 4;
        break;
    case DT_Q4_0: /* as MLX 4-bit with groups of 32: the nibbles, one (d, bias) word per block */
    case DT_Q4_1:
        *data_bytes = nk / 2;
        *scale_bytes = nk / 32 * 4;
        break;
    default: *data_bytes = nk * (w->dtype == DT_F32 ? 4 : 2); break;
    }
    return 0;
}

int cuda_gdn_chunk_takes(int k_dim, int v_dim) {
    return k_dim > 0 && k_dim <= CUDA_GDN_CHUNK_DIM && k_dim % 4 == 0 && v_dim > 0 && v_dim <= CUDA_GDN_CHUNK_DIM &&
           v_dim % 4 == 0;
}

size_t cuda_gdn_chunk_floats(int T, int v_heads, int k_dim) {
    return (size_t)T * v_heads * (size_t)(k_dim + CUDA_GDN_CHUNK);
}

size_t cuda_attention_split_floats(int max_T, int n_heads, int head_dim) {
    return (size_t)max_T * n_heads * CUDA_ATT_SPLITS_MAX * (size_t)(head_dim + 4); /* (m, l, pad, pad, o[d]) each */
}

/* Every position of a sequence, rounded up to the widest key tile (64) so the last tile's
 * rows past the sequence lie inside it. */
size_t cuda_attention_stage_rows(int max_blocks_per_slot) {
    return round_up((size_t)max_blocks_per_slot * KV_BLOCK_SIZE, 64);
}

size_t cuda_attention_stage_bytes(int max_blocks_per_slot, int n_kv_heads, int head_dim) {
    if (head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256 && head_dim != 512)
        return 0;
    size_t rows = cuda_attention_stage_rows(max_blocks_per_slot);
    return 2 * (size_t)n_kv_heads * rows * (size_t)head_dim * 2 + rows; /* bf16 K and V planes, a flag per row */
}

void cuda_gemv_act_layout(size_t floats, size_t *quant_bytes, size_t *scale_bytes) {
    size_t f = round_up(floats, 32);
    *quant_bytes = f;
    *scale_bytes = f / 32 * 2 * sizeof(float);
}

/* The host buffer cuda_weight_upload(_any) needs while it repacks or expands w. */
static size_t upload_host_bytes(const op_weight *w, size_t data, size_t scales, int expanded) {
    if (expanded) return data;
    if (cuda_weight_goes_affine(w)) return data + scales + (size_t)w->k; /* the planes, the pairs, one row's codes */
    if (w->dtype == DT_Q8_0 || w->dtype == DT_Q6_K) return data + scales;
    if (w->dtype == DT_U32) return scales + (cuda_mlx4_layout(w->k, (int)w->group_size) ? data : 0);
    /* Q4_0 / Q4_1: the MLX-order words and f16 scale and bias arrays, then what the MLX upload needs */
    if (w->dtype == DT_Q4_0 || w->dtype == DT_Q4_1) return data + scales + scales + (cuda_mlx4_layout(w->k, 32) ? data : 0);
    return 0;
}

/* w's device layout; its upload's temporary host buffer counted, and how often F32 expansion happens. */
static void weight_layout(cuda_plan *p, const op_weight *w, size_t *data, size_t *scales) {
    int expanded = cuda_weight_layout(w, data, scales);
    size_t host = upload_host_bytes(w, *data, *scales, expanded);
    if (host > p->upload_host) p->upload_host = host;
    if (expanded) {
        p->n_expanded++;
        p->expanded_from = w->dtype;
    }
}

static void add_weight(cuda_plan *p, cuda_alloc_tally *t, const op_weight *w) {
    size_t data, scales;
    weight_layout(p, w, &data, &scales);
    cuda_tally_add(t, data);
    if (scales) cuda_tally_add(t, scales);
    p->weights_read += data + scales;
}

/* An expert slice: on the device (tallied) or, offloaded, in pinned host memory with the
 * pool's slots sized for the largest. */
static void add_expert(cuda_plan *p, cuda_alloc_tally *t, const op_weight *w) {
    size_t data, scales;
    weight_layout(p, w, &data, &scales);
    p->expert_bytes += data + scales;
    p->weights_read += data + scales;
    if (!p->expert_slots) {
        cuda_tally_add(t, data);
        if (scales) cuda_tally_add(t, scales);
    }
    if (data > p->slot_data_bytes) p->slot_data_bytes = data;
    if (scales > p->slot_scale_bytes) p->slot_scale_bytes = scales;
}

/* Every item of the model in cuda_model_create's order: the expert pool's slots (offload),
 * then the weights in their device layout, vectors as floats (a planned model lists the
 * vectors its family has, without data). */
static void plan_weights(cuda_plan *p, const op_model *om, cuda_alloc_tally *t) {
    const op_dims *c = &om->dims;
    for (int i = 0; i < om->n_items; i++) {
        const op_item *it = &om->items[i];
        if (it->host_only) continue; /* read on the host only, never copied to the device */
        if (it->w && it->experts > 0) { /* one device weight per expert slice (cuda_model.c) */
            int64_t rows = it->w->n / it->experts;
            size_t read0 = p->weights_read;
            for (int e = 0; e < it->experts; e++) {
                op_weight slice = op_weight_rows(it->w, (int64_t)e * rows, rows);
                add_expert(p, t, &slice);
            }
            /* a decode step of one token reads only its top_k experts' slices */
            if (c->n_experts > 0)
                p->weights_read = read0 + (p->weights_read - read0) / (size_t)c->n_experts * (size_t)c->top_k_experts;
        } else if (it->w) add_weight(p, t, it->w);
        else cuda_tally_add(t, (size_t)it->n * sizeof(float));
    }
    /* the pool (cuda_model.c allocates it before the uploads; the tally's sum does not depend on the order) */
    for (int s = 0; s < p->expert_slots; s++) {
        cuda_tally_add(t, p->slot_data_bytes);
        if (p->slot_scale_bytes) cuda_tally_add(t, p->slot_scale_bytes);
    }
    if (p->expert_slots) p->pinned_host += p->expert_bytes;
}

static void plan_scratch(cuda_plan *p, const op_model *om, const kv_cache *kv, int max_tokens, int max_out,
                         cuda_alloc_tally *t) {
    const op_dims *c = &om->dims;
    size_t T = (size_t)max_tokens, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t acts[CUDA_PLAN_N_ACT] = {T * c->hidden,
                                    T * c->hidden,
                                    T * qd,
                                    T * kd,
                                    T * kd,
                                    T * qd,
                                    T * c->hidden,
                                    T * c->ffn,
                                    T * c->ffn,
                                    (size_t)max_out * c->hidden,
                                    (size_t)max_out * c->vocab};
    /* the fast tier's chunked Gated DeltaNet prefill keeps its scratch in the MLP's gate rows
     * (idle during that op): they grow to hold it */
    if (c->n_state_layers > 0 && !p->gemm_exact && cuda_gdn_chunk_takes(c->gdn_k_dim, c->gdn_v_dim)) {
        size_t chunk = cuda_gdn_chunk_floats(max_tokens, c->gdn_v_heads, c->gdn_k_dim);
        if (chunk > acts[7]) acts[7] = chunk;
    }
    memcpy(p->act_floats, acts, sizeof acts);
    for (int i = 0; i < CUDA_PLAN_N_ACT; i++) cuda_tally_add(t, acts[i] * sizeof(float));
    int hybrid = c->n_state_layers > 0;
    p->ints = (hybrid ? 5 : 3) * T;
    cuda_tally_add(t, p->ints * sizeof(int32_t));
    size_t vd = (size_t)c->gdn_v_heads * c->gdn_v_dim;
    p->qgate_floats = c->attn_gate ? 2 * T * qd : 0;
    if (p->qgate_floats) cuda_tally_add(t, p->qgate_floats * sizeof(float));
    if (hybrid) {
        size_t conv = 2 * (size_t)c->gdn_k_heads * c->gdn_k_dim + vd, hv = (size_t)c->gdn_v_heads;
        size_t gdn[5] = {T * conv, T * vd, T * hv, T * hv, T * vd};
        memcpy(p->gdn_floats, gdn, sizeof gdn);
        for (int i = 0; i < 5; i++) cuda_tally_add(t, gdn[i] * sizeof(float));
    }
    size_t decode_T = T < CUDA_GRAPH_MAX_T ? T : CUDA_GRAPH_MAX_T;
    p->att_split_floats = cuda_attention_split_floats((int)decode_T, c->n_heads, c->head_dim);
    cuda_tally_add(t, p->att_split_floats * sizeof(float));
    /* the tensor-core prefill attention's staged keys and values (not in exact mode, where
     * prefill attention stays in f32) */
    p->att_stage_bytes = 0;
    for (int l = 0; !p->gemm_exact && l < (kv->layer_heads ? kv->n_layers : 1); l++) { /* the widest layer's */
        int heads = kv->layer_heads ? kv->layer_heads[l] : c->n_kv_heads;
        int dim = kv->layer_heads ? kv->layer_dims[l] : c->head_dim;
        size_t b = cuda_attention_stage_bytes(kv->max_blocks_per_slot, heads, dim);
        if (b > p->att_stage_bytes) p->att_stage_bytes = b;
    }
    if (p->att_stage_bytes) cuda_tally_add(t, p->att_stage_bytes);
    p->ids = (size_t)max_out;
    cuda_tally_add(t, p->ids * sizeof(int32_t));
    /* int8 activations of the quantized GEMVs: decode steps and the logits rows, widest k */
    size_t rows = decode_T > (size_t)max_out ? decode_T : (size_t)max_out, kmax = (size_t)c->hidden;
    size_t gemv_T = T < CUDA_MATMUL_GEMV_MAX_T ? T : CUDA_MATMUL_GEMV_MAX_T; /* cuda_matmul's GEMV rows */
    if (gemv_T > rows) rows = gemv_T;
    if ((size_t)c->ffn > kmax) kmax = (size_t)c->ffn;
    if (qd > kmax) kmax = qd;
    if (vd > kmax) kmax = vd; /* a Gated DeltaNet layer's out projection reads its value heads */
    if (c->mtp && 2 * (size_t)c->hidden > kmax) kmax = 2 * (size_t)c->hidden; /* an MTP head's fc */
    p->mtp_floats = c->mtp ? 3 * T * (size_t)c->hidden : 0;
    if (p->mtp_floats) cuda_tally_add(t, p->mtp_floats * sizeof(float));
    p->gemv_floats = rows * kmax;
    /* the device-routed experts' down GEMV: a row of moe_ffn per (token, expert) pair */
    size_t pairs = decode_T * (size_t)(c->n_experts > 0 ? c->top_k_experts : 0);
    if (pairs * (size_t)c->moe_ffn > p->gemv_floats) p->gemv_floats = pairs * (size_t)c->moe_ffn;
    size_t gq, gs;
    cuda_gemv_act_layout(p->gemv_floats, &gq, &gs);
    cuda_tally_add(t, gq);
    cuda_tally_add(t, gs);
    /* decode: the int8 copy of a norm's, gate's or attention merge's output for the next
     * GEMV (cuda_model.c xq, xs) */
    size_t dk = (size_t)c->hidden > (size_t)c->ffn ? (size_t)c->hidden : (size_t)c->ffn;
    if (qd > dk) dk = qd;
    p->decode_q8_bytes = decode_T * dk;
    p->decode_q8_scale_bytes = decode_T * dk / 32 * 2 * sizeof(float);
    cuda_tally_add(t, p->decode_q8_bytes);
    cuda_tally_add(t, p->decode_q8_scale_bytes);
    /* the GEMM scratch: the largest layer weight dequantized and the widest input */
    size_t max_w = 0, max_k = kmax;
    for (int i = 0; i < om->n_items; i++) { /* the layers' weights (not lm_head: it never goes to the GEMM scratch) */
        const op_weight *w = om->items[i].w;
        size_t rows = w ? (size_t)w->n / (size_t)(om->items[i].experts > 0 ? om->items[i].experts : 1) : 0;
        if (w && !om->items[i].logits && !om->items[i].host_only && rows * (size_t)w->k > max_w)
            max_w = rows * (size_t)w->k;
    }
    p->gemm_max_w = max_w;
    p->gemm_max_x = max_k * T;
    size_t e = p->gemm_exact ? 4 : 2;
    cuda_tally_add(t, p->gemm_max_w * e);
    cuda_tally_add(t, p->gemm_max_x * e);
    cuda_tally_add(t, CUDA_GEMM_WORKSPACE_BYTES);
    /* the MMQ split-k scratch (cuda_mmq.cu), allocated once per process at model creation */
    cuda_tally_add(t, CUDA_MMQ_PART_FLOATS * sizeof(float));
    cuda_tally_add(t, CUDA_MMQ_TILES_MAX * sizeof(unsigned));
    /* per-layer inputs (op_per_layer_inputs): the step's rows and their working copy on the device */
    p->per_layer_floats = T * (size_t)c->n_layers * (size_t)c->per_layer_dim;
    if (p->per_layer_floats) {
        cuda_tally_add(t, p->per_layer_floats * sizeof(float));
        cuda_tally_add(t, p->per_layer_floats * sizeof(float));
    }
    /* each row's adapters (cuda_lora_cache_create, whatever adapters are mounted: the device
     * pointers of up to CUDA_LORA_MAX_SET adapter tables per row, the rows' counts, then the
     * fast tier's rank values and group tables) */
    cuda_lora_cache_sizes lora;
    cuda_lora_cache_sizes_make(max_tokens, &lora);
    p->lora_sets_bytes = lora.sets;
    p->lora_counts_bytes = lora.counts;
    p->lora_fast_bytes = lora.fast;
    cuda_tally_add(t, p->lora_sets_bytes);
    cuda_tally_add(t, p->lora_counts_bytes);
    cuda_tally_add(t, p->lora_fast_bytes);
    /* pinned host staging: the step's embeddings (and per-layer rows), its indices, the greedy
     * ids, the adapter row tables */
    p->pinned_host += T * c->hidden * sizeof(float) + p->per_layer_floats * sizeof(float) + p->ints * sizeof(int32_t) +
                      (size_t)max_out * sizeof(int32_t) + p->lora_sets_bytes + p->lora_counts_bytes + lora.groups;
    if (c->n_experts > 0) { /* cuda_model.c alloc_scratch, in its order */
        size_t ffn = (size_t)(c->moe_ffn > c->shared_ffn ? c->moe_ffn : c->shared_ffn);
        p->moe_logits = T * (size_t)c->n_experts;
        p->moe_pairs = T * (size_t)c->top_k_experts;
        /* a decode step routed on the device (cuda_model.c moe_device) has a row per (token,
         * expert) pair: min(T, CUDA_GRAPH_MAX_T) top_k of them */
        size_t rows = T < CUDA_GRAPH_MAX_T ? T : CUDA_GRAPH_MAX_T;
        rows *= (size_t)c->top_k_experts;
        if (rows < T) rows = T;
        p->moe_hidden_floats = rows * (size_t)c->hidden;
        /* the grouped prefill form: runs of up to CUDA_MOE_GROUP_PAIRS pairs, their rows and
         * slots, at most one segment per active expert plus one per CUDA_MOE_GEMM_TOKENS pairs,
         * and the segments' count (cuda_model.c moe_grouped, in that order) */
        if (!p->gemm_exact && T > CUDA_GRAPH_MAX_T) {
            size_t K = (size_t)c->top_k_experts,
                   gp = p->moe_pairs < CUDA_MOE_GROUP_PAIRS ? p->moe_pairs : CUDA_MOE_GROUP_PAIRS;
            gp -= gp % K;
            p->moe_group_pairs = gp;
            p->moe_idx_ints = 2 * gp + 3 * (gp / CUDA_MOE_GEMM_TOKENS + (size_t)c->n_experts) + 1;
            p->moe_xb_elems = T * (size_t)c->hidden;
            p->moe_actb_elems = gp * (size_t)c->moe_ffn;
            if (gp > rows) rows = gp;
        }
        p->moe_ffn_floats = rows * ffn;
        p->moe_out_floats = rows * (size_t)c->hidden;
        p->moe_acc_floats = c->varied_layers ? T * (size_t)c->hidden : 0;
        size_t parts[] = {p->moe_logits * sizeof(float),
                          p->moe_pairs * sizeof(int32_t),
                          p->moe_pairs * sizeof(float),
                          p->moe_hidden_floats * sizeof(float),
                          p->moe_ffn_floats * sizeof(float),
                          p->moe_ffn_floats * sizeof(float),
                          p->moe_out_floats * sizeof(float),
                          p->moe_acc_floats * sizeof(float),
                          p->moe_idx_ints * sizeof(int32_t),
                          p->moe_xb_elems * 2,
                          p->moe_actb_elems * 2};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (parts[i]) cuda_tally_add(t, parts[i]);
        /* the router's logits, and the pairs by expert and by token (rows and weights each) */
        p->pinned_host += p->moe_logits * sizeof(float) + 2 * p->moe_pairs * (sizeof(int32_t) + sizeof(float));
    }
}

void cuda_plan_make(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int kv_dtype, int gemm_exact,
                    int expert_slots, cuda_plan *p) {
    memset(p, 0, sizeof *p);
    p->kv_dtype = kv_dtype;
    p->expert_slots = om->dims.n_experts > 0 && expert_slots > 0 ? expert_slots : 0;
    p->gemm_exact = gemm_exact;
    /* one tally (the small allocations of all parts share pages); each part gets its own
     * pages and aligned small bytes, the shared pages' rounding goes to scratch */
    cuda_alloc_tally t = {0};
    plan_weights(p, om, &t);
    p->weights = t.large + t.small;
    size_t data, scales; /* cuda_kv.cu allocates keys, values, then their scales */
    cuda_kv_pool_parts(kv, kv_dtype, &data, &scales);
    cuda_tally_add(&t, data);
    cuda_tally_add(&t, data);
    if (scales) cuda_tally_add(&t, scales), cuda_tally_add(&t, scales);
    cuda_tally_add(&t, (size_t)kv->max_slots * kv->max_blocks_per_slot * sizeof(int32_t));
    /* hybrids: the recurrent state of every slot and the prefix cache's snapshots of it, in
     * float32 (kv_state.h: the engine keeps kv_state_default_snaps records) */
    if (om->dims.n_state_layers > 0) {
        p->state_snaps = kv_state_default_snaps(kv->max_slots);
        p->state_floats = (size_t)(kv->max_slots + p->state_snaps) * om->dims.n_state_layers *
                          op_gdn_state_floats(&om->dims);
        cuda_tally_add(&t, p->state_floats * sizeof(float));
    }
    p->kv = t.large + t.small - p->weights;
    /* the device sampler (engine_device_sampler_open, made with the model: max_out rows) */
    cuda_sampler_sizes smp;
    cuda_sampler_sizes_make(max_out, om->dims.vocab, &smp);
    size_t smp_bufs[] = {smp.params, smp.entry_ids, smp.entry_values, smp.results, smp.masks};
    for (size_t i = 0; i < sizeof smp_bufs / sizeof *smp_bufs; i++) cuda_tally_add(&t, smp_bufs[i]);
    p->sampler = t.large + t.small - p->weights - p->kv;
    p->pinned_host += cuda_sampler_sizes_device(&smp);
    p->sampler_host = smp.counts + smp.order;
    plan_scratch(p, om, kv, max_tokens, max_out, &t);
    p->scratch = cuda_tally_bytes(&t) - p->weights - p->kv - p->sampler;
    p->requested = t.requested;
    p->n_allocs = t.count;
}

size_t cuda_plan_bytes(const cuda_plan *p) { return p->weights + p->kv + p->scratch + p->sampler; }

void cuda_sampler_sizes_make(int max_rows, int vocab, cuda_sampler_sizes *z) {
    size_t R = max_rows > 0 ? (size_t)max_rows : 0, E = R * CUDA_SAMPLE_ROW_ENTRIES;
    size_t words = vocab > 0 ? ((size_t)vocab + 31) / 32 : 0; /* a bit per token */
    z->params = R * sizeof(cuda_sample_row_params);
    z->entry_ids = E * sizeof(int32_t);
    z->entry_values = E * sizeof(float);
    z->results = R * sizeof(cuda_sample_row_out);
    z->masks = R * words * sizeof(uint32_t);
    z->counts = (vocab > 0 ? (size_t)vocab : 0) * sizeof(int32_t);
    z->order = CUDA_SAMPLE_MAX_BIAS * sizeof(int32_t);
}

size_t cuda_sampler_sizes_device(const cuda_sampler_sizes *z) {
    return z->params + z->entry_ids + z->entry_values + z->results + z->masks;
}

void cuda_lora_cache_sizes_make(int max_tokens, cuda_lora_cache_sizes *z) {
    size_t T = max_tokens > 0 ? (size_t)max_tokens : 0;
    z->sets = T * CUDA_LORA_MAX_SET * sizeof(void *);
    z->counts = T * sizeof(int32_t);
    /* the grouped tier's tables (steps of up to CUDA_LORA_FAST_ROWS rows) */
    z->groups = CUDA_LORA_GROUP_BYTES(T < CUDA_LORA_FAST_ROWS ? T : CUDA_LORA_FAST_ROWS);
    /* the fast tier's rank values, one expert's gathered row tables (sets and counts again),
     * the group tables */
    z->fast = CUDA_LORA_FAST_FLOATS(T) * sizeof(float) + z->sets + z->counts + z->groups;
}

double cuda_plan_decode_bytes(const cuda_plan *p, const op_model *om, int context) {
    const op_dims *c = &om->dims;
    double b = (double)p->weights_read, per_pos = cuda_kv_position_bytes(c->n_kv_heads, c->head_dim, p->kv_dtype);
    for (int i = 0; i < c->n_layers; i++) {
        int w = om->layer_window[i], span = w > 0 && w < context ? w : context;
        b += span * per_pos;
    }
    return b;
}
