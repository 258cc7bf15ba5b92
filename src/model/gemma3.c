/* gemma3.c: the forward pass of Gemma 3 (text): embeddings scaled by sqrt(hidden) (the
 * step's embed scale), four norms per block (before and after attention, before and after
 * the MLP), (1 + weight) RMSNorms in HF/MLX form, QK-norm, GELU(tanh)-gated MLP, and
 * sliding-window layers with their own RoPE base interleaved with global ones (in each
 * layer's attention arguments). Op-table calls only: the same code on every backend. */
#include "model/decoder.h"

hearth_status gemma3_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    const model_config *c = &m->cfg;
    float shift = c->norm_shift;
    OP_TRY(op_add_norm(s, OP_NONE, m->layers[0].attn_norm, shift, DECODER_QKV(&m->layers[0])));
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        op_attn attn = decoder_attn(m, i);
        op_mlp mlp = decoder_mlp(m, i, OP_ACT_GELU_TANH);
        OP_TRY(op_qkv_rope_store(s, i, &attn));
        OP_TRY(op_attention(s, i, &attn));
        const op_weight *gate_up[2] = {&l->gate, &l->up};
        /* x += post_attn(tmp); xn = ffn_norm(x) */
        op_residual ra = {.delta = OP_TMP, .delta_norm = l->post_attn_norm, .delta_scale = 1.0f, .x_scale = 1.0f,
                          .w = l->ffn_norm, .shift = shift, .next = gate_up, .n_next = 2};
        OP_TRY(op_residual_run(s, &ra));
        OP_TRY(op_mlp_run(s, &mlp));
        /* x += post_ffn(tmp); xn = the next layer's attn_norm(x) */
        const layer_weights *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
        op_residual rf = {.delta = OP_TMP, .delta_norm = l->post_ffn_norm, .delta_scale = 1.0f, .x_scale = 1.0f,
                          .shift = shift};
        const op_weight *qkv[3] = {next ? &next->q : NULL, next ? &next->k : NULL, next ? &next->v : NULL};
        if (next) rf.w = next->attn_norm, rf.next = qkv, rf.n_next = 3;
        OP_TRY(op_residual_run(s, &rf));
    }
    return op_logits(s, m->final_norm, shift, 1.0f, &m->lm_head);
}
