/* decoder.h: the building blocks shared by the family forward passes (llama.c,
 * gemma3.c): embedding, the attention block over the paged cache, the gated MLP, the
 * logits. Internal to src/model. */
#ifndef HEARTH_MODEL_DECODER_H
#define HEARTH_MODEL_DECODER_H
#include "model/model.h"
#include "ops/ops.h"

struct model_scratch {
    int max_tokens, max_out;
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up; /* [max_tokens, width] each */
    float *rows;                                       /* [max_out, hidden]: rows that need logits */
    float *attn;                                       /* attention scratch, per thread */
    void *mm;                                          /* matmul scratch (quantized activations) */
    size_t mm_size;
};

typedef enum decoder_act { ACT_SILU, ACT_GELU_TANH } decoder_act;

/* The step's context: everything the blocks need besides the layer. */
typedef struct decoder_step {
    const model *m;
    kv_cache *kv;
    model_scratch *s;
    const model_batch *b;
    threadpool *tp;
    hearth_error *err;
} decoder_step;

hearth_status decoder_embed(const decoder_step *d);
/* in: normalized hidden [T, hidden] in s->xn; out: attention output [T, hidden] in s->tmp. */
hearth_status decoder_attention(const decoder_step *d, int layer);
/* in: s->xn; out: s->tmp = down(act(gate(xn)) * up(xn)). */
hearth_status decoder_mlp(const decoder_step *d, int layer, decoder_act act);
/* Final norm of the requested rows of s->x and the logits into b->logits. */
hearth_status decoder_logits(const decoder_step *d);

hearth_status llama_forward(const decoder_step *d);
hearth_status gemma3_forward(const decoder_step *d);
#endif
