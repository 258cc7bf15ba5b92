/* qwen3_5.c: the forward pass of Qwen3.5 (mlx-lm models/qwen3_5.py; qwen3_5_moe.py: every MLP
 * routed experts plus a shared expert behind a sigmoid gate, op_moe): a hybrid of
 * Gated DeltaNet layers (op_gdn: causal conv, L2-normalised q/k, the gated delta rule on
 * each sequence's recurrent state, gated RMSNorm) and, every full_attention_interval-th
 * layer, gated attention (q projection doubled with per-head output gates, q/k RMSNorm,
 * RoPE on the first rope_dims of each head). Pre-norm blocks with a SiLU-gated MLP. The
 * norms are plain RMSNorms of mlx-lm's sanitized weights (norm_shift 1 for an unsanitized
 * HF checkpoint, whose weights are offsets from 1). Op-table calls only. */
#include "model/decoder.h"

static hearth_status blocks(const op_step *s, const model *m) {
    const model_config *c = &m->cfg;
    float shift = c->norm_shift;
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i], *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
        if (i == 0) OP_TRY(op_add_norm(s, OP_NONE, l->attn_norm, shift, NULL, 0));
        if (l->linear) {
            op_gdn g = decoder_gdn(m, i);
            OP_TRY(op_gated_delta(s, &g)); /* tmp = linear attention(xn) */
        } else {
            op_attn attn = decoder_attn(m, i);
            OP_TRY(op_qkv_rope_store(s, l->kv_layer, &attn)); /* the KV pool holds attention layers only */
            OP_TRY(op_attention(s, l->kv_layer, &attn));
        }
        if (l->moe) { /* qwen3_5_moe: routed experts + the gated shared expert */
            const op_weight *router[] = {&l->router};
            op_moe moe = decoder_moe(m, i);
            OP_TRY(op_add_norm(s, OP_TMP, l->ffn_norm, shift, router, 1));
            OP_TRY(op_moe_run(s, &moe));
        } else {
            op_mlp mlp = decoder_mlp(m, i, OP_ACT_SILU);
            OP_TRY(op_add_norm(s, OP_TMP, l->ffn_norm, shift, DECODER_GATE_UP(l)));
            OP_TRY(op_mlp_run(s, &mlp));
        }
        OP_TRY(next ? op_add_norm(s, OP_TMP, next->attn_norm, shift, NULL, 0) : op_add_norm(s, OP_TMP, NULL, 0.0f, NULL, 0));
    }
    return op_logits(s, m->final_norm, c->norm_shift, 1.0f, &m->lm_head);
}

hearth_status qwen3_5_layers(const op_step *s, const void *ctx) { return blocks(s, ctx); }

/* The MTP head (vLLM's Qwen3.5 / Qwen3-Next multi-token predictor): its input from the token's
 * embedding and the model's hidden row, then its one full-attention layer and mtp.norm. */
hearth_status qwen3_5_mtp_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    op_mtp in = {.fc = &m->mtp_fc,
                 .norm_embed = m->mtp_norm_embed,
                 .norm_hidden = m->mtp_norm_hidden,
                 .shift = m->cfg.norm_shift};
    OP_TRY(op_mtp_input(s, &in));
    return blocks(s, m);
}
