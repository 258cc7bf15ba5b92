/* qwen3_moe.c: the forward pass of Qwen3-MoE (mlx-lm models/qwen3_moe.py): the Qwen3 block
 * (per-head q/k RMSNorm before RoPE) whose MLP is, on the sparse layers, a mixture of
 * experts: a router picks top-k experts per token and their SiLU-gated MLPs are summed with
 * the router's weights. Op-table calls only: the same code on every backend. */
#include "model/decoder.h"


hearth_status qwen3_moe_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    const model_config *c = &m->cfg;
    const layer_weights *first = &m->layers[0];
    OP_TRY(op_add_norm(s, OP_NONE, first->attn_norm, 0.0f, DECODER_QKV(first)));
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i], *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
        op_attn attn = decoder_attn(m, i);
        OP_TRY(op_qkv_rope_store(s, i, &attn));
        OP_TRY(op_attention(s, i, &attn));
        if (l->moe) {
            const op_weight *router[] = {&l->router};
            op_moe moe = decoder_moe(m, i);
            OP_TRY(op_add_norm(s, OP_TMP, l->ffn_norm, 0.0f, router, 1));
            OP_TRY(op_moe_run(s, &moe)); /* tmp = the experts' weighted sum */
        } else {
            op_mlp mlp = decoder_mlp(m, i, OP_ACT_SILU);
            OP_TRY(op_add_norm(s, OP_TMP, l->ffn_norm, 0.0f, DECODER_GATE_UP(l)));
            OP_TRY(op_mlp_run(s, &mlp));
        }
        OP_TRY(next ? op_add_norm(s, OP_TMP, next->attn_norm, 0.0f, DECODER_QKV(next)) : op_add_norm(s, OP_TMP, NULL, 0.0f, NULL, 0));
    }
    return op_logits(s, m->final_norm, c->norm_shift, 1.0f, &m->lm_head);
}
