/* minicpm.c: the forward pass of MiniCPM (mlx-lm models/minicpm.py): the llama block
 * (RMSNorm, RoPE attention, SiLU-gated MLP) with embeddings times scale_emb (the step's
 * embed scale), each block output times scale_depth / sqrt(layers) before it joins the
 * residual, and, when lm_head is not tied by the config, the final normed rows divided by
 * hidden / dim_model_base. Op-table calls only: the same code on every backend. */
#include "model/decoder.h"

hearth_status minicpm_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    const model_config *c = &m->cfg;
    const layer_weights *first = &m->layers[0];
    OP_TRY(op_add_norm(s, OP_NONE, first->attn_norm, 0.0f, DECODER_QKV(first)));
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i], *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
        op_attn attn = decoder_attn(m, i);
        op_mlp mlp = decoder_mlp(m, i, OP_ACT_SILU);
        OP_TRY(op_qkv_rope_store(s, i, &attn));
        OP_TRY(op_attention(s, i, &attn));
        const op_weight *gate_up[2] = {&l->gate, &l->up};
        /* h = x + r * scale_depth / sqrt(layers) */
        op_residual ra = {.delta = OP_TMP, .delta_scale = c->residual_scale, .x_scale = 1.0f, .w = l->ffn_norm,
                          .next = gate_up, .n_next = 2};
        OP_TRY(op_residual_run(s, &ra));
        OP_TRY(op_mlp_run(s, &mlp));
        op_residual rf = {.delta = OP_TMP, .delta_scale = c->residual_scale, .x_scale = 1.0f};
        const op_weight *qkv[3] = {next ? &next->q : NULL, next ? &next->k : NULL, next ? &next->v : NULL};
        if (next) rf.w = next->attn_norm, rf.next = qkv, rf.n_next = 3;
        OP_TRY(op_residual_run(s, &rf));
    }
    return op_logits(s, m->final_norm, c->norm_shift, c->logits_div, &m->lm_head);
}
