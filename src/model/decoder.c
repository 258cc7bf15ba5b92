/* decoder.c: model_forward's dispatch to the family's forward pass, the op-level view of
 * a model (model_ops: every weight and vector a backend holds, in upload order), and the
 * per-layer op arguments the families share. No arithmetic here. */
#include "model/decoder.h"
#include "base/err.h"
#include <stdlib.h>

op_attn decoder_attn(const model *m, int i) {
    const model_config *c = &m->cfg;
    const layer_weights *l = &m->layers[i];
    return (op_attn){.q = &l->q, .k = &l->k, .v = &l->v, .o = &l->o,
                     .q_bias = l->q_bias, .k_bias = l->k_bias, .v_bias = l->v_bias,
                     .q_norm = l->q_norm, .k_norm = l->k_norm, .norm_shift = c->norm_shift, .norm_eps = c->norm_eps,
                     .inv_freq = l->sliding ? c->inv_freq_local : c->inv_freq_global,
                     .window = l->sliding ? c->sliding_window : 0, .scale = c->attn_scale,
                     .rope_dims = c->rope_dims, .gated = c->attn_gate, .layer = i};
}

op_mlp decoder_mlp(const model *m, int i, op_act act) {
    const layer_weights *l = &m->layers[i];
    return (op_mlp){.gate = &l->gate, .up = &l->up, .down = &l->down, .act = act, .layer = i};
}

op_moe decoder_moe(const model *m, int i) {
    const layer_weights *l = &m->layers[i];
    int sh = m->cfg.shared_ffn > 0;
    return (op_moe){.router = &l->router,
                    .gate = &l->experts_gate,
                    .up = l->experts_up.n ? &l->experts_up : NULL,
                    .down = &l->experts_down,
                    .norm_topk = m->cfg.norm_topk,
                    .act = OP_ACT_SILU,
                    .shared_gate = sh ? &l->shared_gate : NULL,
                    .shared_up = sh ? &l->shared_up : NULL,
                    .shared_down = sh ? &l->shared_down : NULL,
                    .shared_router = sh ? &l->shared_router : NULL,
                    .layer = i};
}

static void add_weight(model *m, const op_weight *w, int logits, const char *name, int layer) {
    if (!w->n) return; /* a weight the layer does not have (Gemma 4's shared-KV layers) */
    m->items[m->ops.n_items++] = (op_item){.w = w, .logits = logits, .name = name, .layer = layer};
}

static void add_vec(model *m, const float *v, int family_has, int64_t n, const char *name, int layer);

/* ---- qwen3_5: a Gated DeltaNet layer's items (op_gdn) ---- */
op_gdn decoder_gdn(const model *m, int i) {
    const layer_weights *l = &m->layers[i];
    return (op_gdn){.qkv = &l->gdn_qkv,
                    .z = &l->gdn_z,
                    .b = &l->gdn_b,
                    .a = &l->gdn_a,
                    .out = &l->gdn_out,
                    .conv = l->gdn_conv,
                    .A_log = l->gdn_A_log,
                    .dt_bias = l->gdn_dt_bias,
                    .norm = l->gdn_norm,
                    .norm_eps = m->cfg.norm_eps,
                    .state_layer = l->state_layer,
                    .layer = i};
}

static void add_gdn_items(model *m, const layer_weights *l, int i) {
    const model_config *c = &m->cfg;
    int64_t conv = 2 * (int64_t)c->gdn_k_heads * c->gdn_k_dim + (int64_t)c->gdn_v_heads * c->gdn_v_dim;
    add_weight(m, &l->gdn_qkv, 0, "linear_attn.in_proj_qkv", i);
    add_weight(m, &l->gdn_z, 0, "linear_attn.in_proj_z", i);
    add_weight(m, &l->gdn_b, 0, "linear_attn.in_proj_b", i);
    add_weight(m, &l->gdn_a, 0, "linear_attn.in_proj_a", i);
    add_weight(m, &l->gdn_out, 0, "linear_attn.out_proj", i);
    add_vec(m, l->gdn_conv, 1, conv * c->gdn_conv, "linear_attn.conv1d", i);
    add_vec(m, l->gdn_A_log, 1, c->gdn_v_heads, "linear_attn.A_log", i);
    add_vec(m, l->gdn_dt_bias, 1, c->gdn_v_heads, "linear_attn.dt_bias", i);
    add_vec(m, l->gdn_norm, 1, c->gdn_v_dim, "linear_attn.norm", i);
}
/* ---- end qwen3_5 ---- */

/* A stack of every expert's matrix, in `slices` equal parts (a backend that keeps one
 * weight per expert splits it so; Hugging Face's fused gate_up stacks are 2 per expert). */
static void add_experts(model *m, const op_weight *w, int slices, const char *name, int layer) {
    if (!w->n) return;
    m->items[m->ops.n_items++] = (op_item){.w = w, .name = name, .layer = layer, .experts = slices};
}

/* A vector the backends hold when the model has it; a planned model (no data yet) lists
 * the ones its family always has, so a device plan sizes them too. */
static void add_vec(model *m, const float *v, int family_has, int64_t n, const char *name, int layer) {
    if (v || family_has) m->items[m->ops.n_items++] = (op_item){.vec = v, .n = n, .name = name, .layer = layer};
}

/* (Re)builds m->ops after model_plan and again after model_load (the vectors' pointers). */
hearth_status model_ops_build(model *m, hearth_error *err) {
    const model_config *c = &m->cfg;
    /* per layer at most 17 matrices (7 + router and 3 expert stacks + a shared expert's 4 +
     * Gemma 4's per-layer gate and projection), 5 of Gated DeltaNet and 16 vectors (3 biases,
     * 6 norms, 7 of Gemma 4's; 4 of Gated DeltaNet); 7 model-level items, 3 more for an MTP head */
    size_t cap = (size_t)c->n_layers * 42 + 10;
    if (!m->items && !(m->items = calloc(cap, sizeof *m->items))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!m->layer_window && !(m->layer_window = calloc((size_t)c->n_layers, sizeof *m->layer_window)))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim, h = c->hidden;
    int gemma = c->family == FAMILY_GEMMA3 || c->family == FAMILY_GEMMA4,
        qk = c->family == FAMILY_QWEN3 || c->family == FAMILY_QWEN3_MOE || gemma || c->family == FAMILY_QWEN3_5;
    m->ops = (op_model){.dims = {.n_layers = c->n_layers,
                                 .hidden = c->hidden,
                                 .n_heads = c->n_heads,
                                 .n_kv_heads = c->n_kv_heads,
                                 .head_dim = c->head_dim,
                                 .ffn = c->ffn,
                                 .vocab = c->vocab,
                                 .norm_eps = c->norm_eps,
                                 .rope_adjacent = c->rope_adjacent,
                                 .n_experts = c->n_experts,
                                 .top_k_experts = c->top_k_experts,
                                 .moe_ffn = c->moe_ffn,
                                 .n_state_layers = c->n_state_layers,
                                 .gdn_k_heads = c->gdn_k_heads,
                                 .gdn_v_heads = c->gdn_v_heads,
                                 .gdn_k_dim = c->gdn_k_dim,
                                 .gdn_v_dim = c->gdn_v_dim,
                                 .gdn_conv = c->gdn_conv,
                                 .gdn_v_tiled = c->gdn_v_tiled,
                                 .attn_gate = c->attn_gate,
                                 .shared_ffn = c->shared_ffn,
                                 .varied_layers = c->family == FAMILY_GEMMA4,
                                 .per_layer_dim = c->per_layer_dim,
                                 .mtp = c->mtp},
                        .items = m->items,
                        .layer_window = m->layer_window,
                        .n_kv_layers = c->n_kv_layers,
                        .kv_heads = c->kv_heads,
                        .kv_dims = c->kv_dims};
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
        static const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        /* none on Qwen3-MoE's sparse layers (add_weight skips weights a layer lacks); a
         * Gated DeltaNet layer has no attention projections */
        for (int j = l->linear ? 4 : 0; j < 7; j++) add_weight(m, ws[j], 0, names[j], i);
        if (l->linear) add_gdn_items(m, l, i);
        if (l->moe) {
            add_weight(m, &l->router, 0, "router", i);
            int E = c->n_experts;
            add_experts(m, &l->experts_gate, l->experts_up.n ? E : 2 * E, "experts.gate_proj", i);
            add_experts(m, &l->experts_up, E, "experts.up_proj", i);
            add_experts(m, &l->experts_down, E, "experts.down_proj", i);
            if (c->shared_ffn > 0) { /* qwen3_5_moe's shared expert and its gate */
                add_weight(m, &l->shared_gate, 0, "shared_expert.gate_proj", i);
                add_weight(m, &l->shared_up, 0, "shared_expert.up_proj", i);
                add_weight(m, &l->shared_down, 0, "shared_expert.down_proj", i);
                add_weight(m, &l->shared_router, 0, "shared_expert_gate", i);
            }
        }
        add_vec(m, l->q_bias, 0, qd, "q_bias", i);
        add_vec(m, l->k_bias, 0, kd, "k_bias", i);
        add_vec(m, l->v_bias, 0, kd, "v_bias", i);
        add_vec(m, l->attn_norm, 1, h, "attn_norm", i);
        add_vec(m, l->ffn_norm, 1, h, "ffn_norm", i);
        add_vec(m, l->post_attn_norm, gemma, h, "post_attn_norm", i);
        add_vec(m, l->post_ffn_norm, gemma, h, "post_ffn_norm", i);
        int hd = l->head_dim ? l->head_dim : c->head_dim, g4 = c->family == FAMILY_GEMMA4;
        add_vec(m, l->q_norm, qk && !l->linear, hd, "q_norm", i);
        add_vec(m, l->k_norm, qk && !l->linear && !l->shares_kv, hd, "k_norm", i);
        if (g4) {
            add_vec(m, l->layer_scalar, 1, 1, "layer_scalar", i);
            add_weight(m, &l->pl_gate, 0, "per_layer_input_gate", i);
            add_weight(m, &l->pl_proj, 0, "per_layer_projection", i);
            add_vec(m, l->pl_norm, c->per_layer_dim > 0, h, "post_per_layer_input_norm", i);
            add_vec(m, l->router_norm, l->moe, h, "router.scale", i);
            add_vec(m, l->expert_scale, l->moe, c->n_experts, "router.per_expert_scale", i);
            add_vec(m, l->ffn_norm_2, l->moe, h, "pre_feedforward_layernorm_2", i);
            add_vec(m, l->post_ffn_norm_1, l->moe, h, "post_feedforward_layernorm_1", i);
            add_vec(m, l->post_ffn_norm_2, l->moe, h, "post_feedforward_layernorm_2", i);
        }
        m->layer_window[i] = l->sliding ? c->sliding_window : 0;
    }
    add_weight(m, &m->lm_head, 1, "lm_head", -1);
    add_vec(m, m->final_norm, 1, h, "final_norm", -1);
    if (c->mtp) { /* a multi-token-prediction head's input */
        add_weight(m, &m->mtp_fc, 0, "mtp.fc", -1);
        add_vec(m, m->mtp_norm_embed, 1, h, "mtp.pre_fc_norm_embedding", -1);
        add_vec(m, m->mtp_norm_hidden, 1, h, "mtp.pre_fc_norm_hidden", -1);
    }
    int g4 = c->family == FAMILY_GEMMA4;
    int64_t n_global = (g4 ? c->full_head_dim : c->rope_dims ? c->rope_dims : c->head_dim) / 2;
    add_vec(m, c->inv_freq_global, 0, n_global, "rope_inv_freq", -1);
    /* one table for both (no sliding layers): its own length, never past a partial RoPE's */
    int64_t n_local = c->inv_freq_local == c->inv_freq_global ? n_global : (g4 ? c->swa_head_dim : c->head_dim) / 2;
    add_vec(m, c->inv_freq_local, 0, n_local, "rope_inv_freq_local", -1);
    if (g4) {
        add_weight(m, &m->embed_per_layer, 0, "embed_tokens_per_layer", -1);
        if (m->embed_per_layer.n) /* its rows are made on the host (op_per_layer_inputs), like the embeddings' */
            m->items[m->ops.n_items - 1].host_only = 1;
        add_weight(m, &m->per_layer_proj, 0, "per_layer_model_projection", -1);
        add_vec(m, m->per_layer_proj_norm, c->per_layer_dim > 0, c->per_layer_dim, "per_layer_projection_norm", -1);
    }
    return HEARTH_OK;
}

const op_model *model_ops(const model *m) { return &m->ops; }

hearth_status model_kv_create(const model_config *c, kv_cache *kv, int max_slots, int max_context, int n_blocks,
                              int quant, int with_storage, hearth_error *err) {
    if (c->kv_heads)
        return kv_create_layers(kv, c->n_kv_layers, c->kv_heads, c->kv_dims, max_slots, max_context, n_blocks, quant,
                                with_storage, err);
    return kv_create_meta(kv, c->n_kv_layers, c->n_kv_heads, c->head_dim, max_slots, max_context, n_blocks, quant,
                          with_storage, err);
}

size_t model_kv_storage_bytes(const model_config *c, int n_blocks, int quant) {
    if (c->kv_heads) return kv_storage_bytes_layers(c->n_kv_layers, c->kv_heads, c->kv_dims, n_blocks, quant);
    return kv_storage_bytes(c->n_kv_layers, c->n_kv_heads, c->head_dim, n_blocks, quant);
}

size_t model_kv_bytes(const model_config *c, int max_slots, int max_context, int n_blocks, int quant) {
    /* the tables and prefix index of kv_bytes_quant, with this model's storage */
    return kv_bytes_quant(c->n_kv_layers, c->n_kv_heads, c->head_dim, max_slots, max_context, n_blocks, quant) -
           kv_storage_bytes(c->n_kv_layers, c->n_kv_heads, c->head_dim, n_blocks, quant) +
           model_kv_storage_bytes(c, n_blocks, quant);
}

hearth_status model_forward(const model *m, op_backend *be, kv_cache *kv, const op_batch *b, op_out out, int32_t *ids,
                            hearth_error *err) {
    static const op_layers_fn layers[] = {[FAMILY_LLAMA] = llama_layers, [FAMILY_QWEN3] = qwen3_layers,
                                          [FAMILY_GEMMA3] = gemma3_layers, [FAMILY_MINICPM] = minicpm_layers,
                                          [FAMILY_QWEN3_MOE] = qwen3_moe_layers, [FAMILY_QWEN3_5] = qwen3_5_layers,
                                          [FAMILY_GEMMA4] = gemma4_layers};
    op_embed embed = {.table = &m->embed, .scale = m->cfg.embed_scale};
    op_layers_fn fn = m->cfg.mtp ? qwen3_5_mtp_layers : layers[m->cfg.family];
    if (m->cfg.mtp && (!be->t->mtp_input || !b->hidden_in))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "a multi-token-prediction head's step needs %s",
                       be->t->mtp_input ? "the model's hidden rows" : "the CPU backend");
    return be->t->step(be, kv, b, &m->ops.dims, &embed, fn, m, out, ids, err);
}
