/* gemma3.c: the forward pass of Gemma 3 (text): embeddings scaled by sqrt(hidden),
 * four norms per block (before and after attention, before and after the MLP),
 * (1 + weight) RMSNorms in HF/MLX form, GELU(tanh)-gated MLP, QK-norm, and sliding-window
 * layers with their own RoPE base interleaved with global ones. */
#include "model/decoder.h"

hearth_status gemma3_forward(const decoder_step *d) {
    const model_config *c = &d->m->cfg;
    model_scratch *s = d->s;
    int T = d->b->T;
    size_t n = (size_t)T * c->hidden;
    float shift = c->norm_shift;
    hearth_status st = decoder_embed(d);
    for (int i = 0; !st && i < c->n_layers; i++) {
        const layer_weights *l = &d->m->layers[i];
        ops_rmsnorm(s->xn, s->x, l->attn_norm, shift, T, c->hidden, c->norm_eps);
        if ((st = decoder_attention(d, i))) break;
        ops_rmsnorm(s->tmp, s->tmp, l->post_attn_norm, shift, T, c->hidden, c->norm_eps);
        ops_add(s->x, s->tmp, n);
        ops_rmsnorm(s->xn, s->x, l->ffn_norm, shift, T, c->hidden, c->norm_eps);
        if ((st = decoder_mlp(d, i, ACT_GELU_TANH))) break;
        ops_rmsnorm(s->tmp, s->tmp, l->post_ffn_norm, shift, T, c->hidden, c->norm_eps);
        ops_add(s->x, s->tmp, n);
    }
    return st ? st : decoder_logits(d);
}
