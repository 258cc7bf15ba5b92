/* decoder.h: what the family forward passes (llama.c, qwen3.c, gemma3.c, minicpm.c) share: a
 * layer's attention and MLP as op-table arguments, and each family's layers function.
 * Internal to src/model. */
#ifndef HEARTH_MODEL_DECODER_H
#define HEARTH_MODEL_DECODER_H
#include "model/model.h"

/* Layer i's attention as the ops take it (its window and RoPE table from the config). */
op_attn decoder_attn(const model *m, int i);
/* Layer i's gated MLP with activation act. */
op_mlp decoder_mlp(const model *m, int i, op_act act);

/* Returns on a failed op. */
#define OP_TRY(call)                                                                                                   \
    do {                                                                                                               \
        hearth_status st_ = (call);                                                                                    \
        if (st_) return st_;                                                                                           \
    } while (0)

/* The weights that read a layer's attention input (q, k, v) and its MLP input (gate, up):
 * what add_norm is told will consume xn. */
#define DECODER_QKV(l) ((const op_weight *const[]){&(l)->q, &(l)->k, &(l)->v}), 3
#define DECODER_GATE_UP(l) ((const op_weight *const[]){&(l)->gate, &(l)->up}), 2

/* Whether layer i of a Qwen3-MoE model has the mixture-of-experts MLP (config.c). */
int model_layer_is_moe(const hearth_model *hm, const model_config *c, int i);
/* Layer i's mixture-of-experts MLP. */
op_moe decoder_moe(const model *m, int i);

/* Builds m->ops (model_ops); model_plan and model_load call it. */
hearth_status model_ops_build(model *m, hearth_error *err);

/* Everything after the embedding, for ctx = the model: op_layers_fn. */
hearth_status llama_layers(const op_step *s, const void *ctx);
hearth_status qwen3_layers(const op_step *s, const void *ctx);
hearth_status gemma3_layers(const op_step *s, const void *ctx);
hearth_status minicpm_layers(const op_step *s, const void *ctx);
hearth_status qwen3_moe_layers(const op_step *s, const void *ctx);
hearth_status qwen3_5_layers(const op_step *s, const void *ctx);
/* A Qwen3.5 multi-token-prediction head's step (model_load_mtp): op_mtp, its layer, mtp.norm, logits. */
hearth_status qwen3_5_mtp_layers(const op_step *s, const void *ctx);

/* Layer i's Gated DeltaNet arguments (a Qwen3.5 linear layer). */
op_gdn decoder_gdn(const model *m, int i);

hearth_status gemma4_layers(const op_step *s, const void *ctx);
#endif
