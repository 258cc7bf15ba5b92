/* llama.c: the forward pass of the llama family (Llama 2/3.x, SmolLM2) and of qwen3,
 * which is llama plus per-head RMSNorm of queries and keys (loaded when present and
 * applied inside decoder_attention). Pre-norm blocks, SiLU-gated MLP, RMSNorm. */
#include "model/decoder.h"

hearth_status llama_forward(const decoder_step *d) {
    const model_config *c = &d->m->cfg;
    model_scratch *s = d->s;
    int T = d->b->T;
    size_t n = (size_t)T * c->hidden;
    hearth_status st = decoder_embed(d);
    for (int i = 0; !st && i < c->n_layers; i++) {
        const layer_weights *l = &d->m->layers[i];
        ops_rmsnorm(s->xn, s->x, l->attn_norm, 0.0f, T, c->hidden, c->norm_eps);
        if ((st = decoder_attention(d, i))) break;
        ops_add(s->x, s->tmp, n);
        ops_rmsnorm(s->xn, s->x, l->ffn_norm, 0.0f, T, c->hidden, c->norm_eps);
        if ((st = decoder_mlp(d, i, ACT_SILU))) break;
        ops_add(s->x, s->tmp, n);
    }
    return st ? st : decoder_logits(d);
}
