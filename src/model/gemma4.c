/* gemma4.c: the forward pass of Gemma 4 text (mlx-lm models/gemma4_text.py): embeddings
 * times sqrt(hidden); per-layer inputs (a second embedding table plus a projection of the
 * embeddings, one slice per layer) made once per step; blocks with four plain-weight
 * RMSNorms, q/k norms, values normed without a scale, softmax scale 1, sliding layers
 * (their head_dim, KV heads, default RoPE) and full layers (global_head_dim, proportional
 * partial RoPE, optionally values = keys) in layer_types order; the last layers read an
 * earlier layer's KV instead of storing their own; GeGLU MLPs (double-wide on the shared
 * layers where configured) and, with enable_moe_block, a mixture of experts beside them (its
 * own router and norms, mlx-lm's Router / Experts); after each block the per-layer input gate and the layer
 * scalar; tanh softcap of the logits. Op-table calls only: the same code on every backend. */
#include "model/decoder.h"
#include <math.h>

static op_attn gemma4_attn(const model *m, int i) {
    const layer_weights *l = &m->layers[i];
    op_attn a = decoder_attn(m, i);
    a.k = l->shares_kv ? NULL : &l->k;
    a.v = l->v.n ? &l->v : NULL; /* none: attention_k_eq_v, or a layer that shares KV */
    a.head_dim = l->head_dim;
    a.n_kv_heads = l->n_kv_heads;
    a.v_norm = 1;
    a.shared = l->shares_kv;
    return a;
}

/* The weights of layer l's attention that read xn (a shared-KV layer: q only; no v:
 * values are the keys). */
static int attention_inputs(const layer_weights *l, const op_weight **next) {
    next[0] = &l->q, next[1] = &l->k, next[2] = &l->v;
    return l->shares_kv ? 1 : l->v.n ? 3 : 2;
}

hearth_status gemma4_layers(const op_step *s, const void *ctx) {
    const model *m = ctx;
    const model_config *c = &m->cfg;
    if (c->per_layer_dim) { /* the constants are Python floats applied to float32 arrays */
        op_per_layer_inputs in = {.table = &m->embed_per_layer, .proj = &m->per_layer_proj,
                                  .norm = m->per_layer_proj_norm, .table_scale = (float)sqrt((double)c->per_layer_dim),
                                  .proj_scale = (float)(1.0 / sqrt((double)c->hidden)),
                                  .input_scale = (float)(1.0 / sqrt(2.0)), .vocab = c->per_layer_vocab};
        OP_TRY(op_per_layer_inputs_run(s, &in));
    }
    const op_weight *first[3];
    int n_first = attention_inputs(&m->layers[0], first);
    OP_TRY(op_add_norm(s, OP_NONE, m->layers[0].attn_norm, 0.0f, first, n_first));
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i], *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
        op_attn attn = gemma4_attn(m, i);
        op_mlp mlp = decoder_mlp(m, i, OP_ACT_GELU_TANH);
        mlp.ffn = l->ffn;
        OP_TRY(op_qkv_rope_store(s, l->kv_layer, &attn)); /* a shared layer: its queries only */
        OP_TRY(op_attention(s, l->kv_layer, &attn));
        /* x += post_attn(tmp); xn = ffn_norm(x) */
        const op_weight *gate_up[2] = {&l->gate, &l->up};
        op_residual ra = {.delta = OP_TMP, .delta_norm = l->post_attn_norm, .delta_scale = 1.0f, .x_scale = 1.0f,
                          .w = l->ffn_norm, .next = gate_up, .n_next = 2};
        OP_TRY(op_residual_run(s, &ra));
        OP_TRY(op_mlp_run(s, &mlp));
        if (l->moe) { /* tmp = post_1(mlp) + post_2(experts(pre_2(x))), routed from x */
            op_moe moe = decoder_moe(m, i);
            moe.act = OP_ACT_GELU_TANH;
            moe.router_norm = l->router_norm;
            moe.in_norm = l->ffn_norm_2;
            moe.out_norm = l->post_ffn_norm_2;
            moe.expert_scale = l->expert_scale;
            OP_TRY(op_norm(s, OP_TMP, l->post_ffn_norm_1, 0.0f));
            OP_TRY(op_moe_run(s, &moe));
        }
        /* x += post_ffn(tmp); then, with per-layer inputs, x += pl_norm(their gate's tmp); x
         * *= the layer scalar; xn = the next layer's attn_norm(x) */
        op_residual rf = {.delta = OP_TMP, .delta_norm = l->post_ffn_norm, .delta_scale = 1.0f, .x_scale = 1.0f};
        if (c->per_layer_dim) {
            const op_weight *pl_gate[1] = {&l->pl_gate}; /* it reads x itself */
            rf.next = pl_gate, rf.n_next = 1;
            OP_TRY(op_residual_run(s, &rf));
            rf.next = NULL, rf.n_next = 0;
            op_per_layer_gate gate = {.gate = &l->pl_gate, .proj = &l->pl_proj};
            OP_TRY(op_per_layer_gate_run(s, i, &gate));
            rf.delta_norm = l->pl_norm;
        }
        const op_weight *qkv[3];
        rf.x_scale = l->layer_scalar[0];
        if (next) rf.w = next->attn_norm, rf.n_next = attention_inputs(next, qkv), rf.next = qkv;
        OP_TRY(op_residual_run(s, &rf));
    }
    OP_TRY(op_logits(s, m->final_norm, 0.0f, 1.0f, &m->lm_head));
    return c->softcap > 0.0f ? op_softcap(s, c->softcap) : HEARTH_OK;
}
