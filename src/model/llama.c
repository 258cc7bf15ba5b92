/* llama.c: the forward pass of the llama family (Llama 2/3.x, SmolLM2; Qwen3 too, qwen3.c): pre-norm blocks,
 * RMSNorm, attention with RoPE (q/k/v biases where a checkpoint has them), SiLU-gated
 * MLP. Op-table calls only: the same code on every backend. */
#include "model/decoder.h"

hearth_status llama_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    const model_config *c = &m->cfg;
    OP_TRY(op_add_norm(s, OP_NONE, m->layers[0].attn_norm, 0.0f, DECODER_QKV(&m->layers[0])));
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        op_attn attn = decoder_attn(m, i);
        op_mlp mlp = decoder_mlp(m, i, OP_ACT_SILU);
        OP_TRY(op_qkv_rope_store(s, i, &attn));
        OP_TRY(op_attention(s, i, &attn));                                     /* tmp = attention(xn) */
        OP_TRY(op_add_norm(s, OP_TMP, l->ffn_norm, 0.0f, DECODER_GATE_UP(l))); /* x += tmp; xn = norm(x) */
        OP_TRY(op_mlp_run(s, &mlp));                                            /* tmp = mlp(xn) */
        if (i + 1 < c->n_layers)
            OP_TRY(op_add_norm(s, OP_TMP, m->layers[i + 1].attn_norm, 0.0f, DECODER_QKV(&m->layers[i + 1])));
        else
            OP_TRY(op_add_norm(s, OP_TMP, NULL, 0.0f, NULL, 0));
    }
    return op_logits(s, m->final_norm, c->norm_shift, 1.0f, &m->lm_head);
}
