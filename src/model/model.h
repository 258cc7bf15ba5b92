/* model.h: a loaded decoder-only transformer: its configuration and its weights,
 * resident in anonymous memory in their native formats, plus the per-family forward
 * passes (llama.c, qwen3.c, qwen3_moe.c, gemma3.c, gemma4.c, minicpm.c) over a ragged batch. Contains no kernels: a forward
 * pass is a sequence of op-table calls (ops/ops.h), the same code on every backend. */
#ifndef HEARTH_MODEL_MODEL_H
#define HEARTH_MODEL_MODEL_H
#include "kv/kv_cache.h"
#include "ops/ops.h"
#include "hearth.h"

typedef enum model_family {
    FAMILY_LLAMA, FAMILY_QWEN3, FAMILY_GEMMA3, FAMILY_MINICPM, FAMILY_QWEN3_MOE,
    FAMILY_QWEN3_5, /* hybrid Gated DeltaNet + gated attention (qwen3_5.c) */
    FAMILY_GEMMA4,  /* gemma4_text (gemma4.c) */
} model_family;

typedef struct model_config {
    model_family family;
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, context_length;
    int n_kv_layers; /* layers with keys and values in the KV pool: n_layers less the Gated DeltaNet
                        ones (Qwen3.5), or the layers before the shared-KV ones (Gemma 4) */
    float norm_eps;
    float norm_shift;       /* 1 where norms scale by (1 + weight): Gemma in HF/MLX form */
    float attn_scale;       /* softmax scale: head_dim^-0.5, or query_pre_attn_scalar^-0.5 */
    float embed_scale;      /* Gemma multiplies embeddings by sqrt(hidden) (rounded to bf16 like mlx-lm), MiniCPM by scale_emb */
    float residual_scale;   /* MiniCPM: each block's output joins the residual times scale_depth / sqrt(layers); else 1 */
    float logits_div;       /* MiniCPM (untied lm_head): the normed rows are divided by hidden / dim_model_base; else 1 */
    int rope_adjacent;      /* GGUF llama weights are permuted for adjacent-pair RoPE */
    int sliding_window;     /* 0: none */
    int sliding_pattern;    /* Gemma: every pattern-th layer is global, the rest slide */
    int n_experts, top_k_experts, moe_ffn, norm_topk; /* Qwen3-MoE: experts per MoE layer, chosen per token, their width */
    int shared_ffn; /* Qwen3.5-MoE: the shared expert's width (0: none) */
    /* Qwen3.5 (qwen3_5.c): layer i is full attention when (i + 1) % full_interval == 0, else
     * a Gated DeltaNet layer of gdn_* (op_dims); attention's q projection carries output gates
     * and RoPE turns the first rope_dims of each head */
    int full_interval, n_state_layers, gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim, gdn_conv, attn_gate, rope_dims;
    int gdn_v_tiled; /* value heads in llama.cpp's tiled order (GGUF), op_dims.gdn_v_tiled */
    /* multi-token prediction (Qwen3.5's mtp.*): the layers the config declares
     * (mtp_num_hidden_layers; the weights may still be absent), and mtp: this model is that
     * head (model_load_mtp) */
    int mtp_layers, mtp;
    float *inv_freq_global; /* head_dim/2 RoPE inverse frequencies (rope_dims/2 when partial) */
    float *inv_freq_local;  /* for sliding layers (Gemma's local base), else = global */
    /* Gemma 4 (config.c read_gemma4; gemma4.c). head_dim, n_kv_heads and ffn above are the
     * maxima over the layers; inv_freq_global is the full layers' table (global_head_dim / 2
     * entries, proportional RoPE: zero past the rotated part), inv_freq_local the sliding
     * layers'. */
    int swa_head_dim, swa_kv_heads, full_head_dim, full_kv_heads, swa_ffn;
    int k_eq_v;              /* full layers' values are their keys (attention_k_eq_v) */
    int first_shared;        /* layers from here on read an earlier layer's KV (n_layers: none) */
    int double_wide;         /* those shared layers' MLP is twice intermediate_size wide */
    int per_layer_dim, per_layer_vocab; /* per-layer inputs (0: none) */
    float softcap;           /* final logit softcap (0: none) */
    unsigned char *layer_full; /* per layer: a full-attention layer (else sliding) */
    int *layer_kv;           /* per layer: the KV layer it stores into or reads */
    int *kv_heads, *kv_dims; /* per KV layer: KV heads and head_dim (NULL: uniform) */
} model_config;

typedef struct layer_weights {
    op_weight q, k, v, o, gate, up, down;
    const float *q_bias, *k_bias, *v_bias; /* NULL when absent */
    const float *attn_norm, *ffn_norm;     /* before attention / before the MLP */
    const float *post_attn_norm, *post_ffn_norm; /* Gemma's extra norms, else NULL */
    const float *q_norm, *k_norm;          /* per-head QK norms (qwen3, gemma3), else NULL */
    int sliding;                           /* attends within cfg.sliding_window */
    int moe;                               /* a mixture-of-experts MLP: router and stacked experts, no gate/up/down */
    op_weight router, experts_gate, experts_up, experts_down;
    /* Qwen3.5 Gated DeltaNet layer (linear): its projections, conv, decay and norm (op_gdn);
     * state_layer: its index in the state pool */
    int linear, state_layer;
    int kv_layer; /* this layer's index in the KV pool (= its own index but on hybrids; -1: none) */
    op_weight gdn_qkv, gdn_z, gdn_b, gdn_a, gdn_out;
    const float *gdn_conv, *gdn_A_log, *gdn_dt_bias, *gdn_norm;
    /* Qwen3.5-MoE: the shared expert's gated MLP and its one-row gate (moe layers) */
    op_weight shared_gate, shared_up, shared_down, shared_router;
    /* Gemma 4 (0 / NULL elsewhere) */
    int head_dim, n_kv_heads, ffn, shares_kv; /* kv_layer: above */
    const float *layer_scalar;          /* one value: the block's output is multiplied by it */
    op_weight pl_gate, pl_proj;          /* per_layer_input_gate, per_layer_projection */
    const float *pl_norm;                /* post_per_layer_input_norm */
    /* Gemma 4's MoE block beside the dense MLP: router.scale * hidden^-0.5, per_expert_scale,
     * pre_feedforward_layernorm_2, post_feedforward_layernorm_1 / _2 */
    const float *router_norm, *expert_scale, *ffn_norm_2, *post_ffn_norm_1, *post_ffn_norm_2;
} layer_weights;

/* A loaded matrix and the tensor it came from ("model.layers.3.mlp.down_proj.weight"). */
typedef struct model_named_weight {
    char *tensor;
    op_weight *w;
} model_named_weight;

typedef struct model {
    model_config cfg;
    layer_weights *layers;
    op_weight embed, lm_head; /* lm_head = embed when tied */
    const float *final_norm;
    /* Gemma 4's per-layer inputs: embed_tokens_per_layer, per_layer_model_projection and
     * per_layer_projection_norm (absent: data NULL) */
    op_weight embed_per_layer, per_layer_proj;
    const float *per_layer_proj_norm;
    /* a multi-token-prediction head (model_load_mtp): mtp.fc and its two input norms */
    op_weight mtp_fc;
    const float *mtp_norm_embed, *mtp_norm_hidden;
    op_model ops;              /* shapes and every item the backends hold (model_ops) */
    op_item *items;
    int *layer_window;
    uint8_t *arena;            /* every weight byte, resident */
    size_t arena_bytes;
    size_t load_peak_bytes;    /* model_load_peak_bytes */
    model_named_weight *named; /* every matrix model_load read, by tensor name */
    int n_named;
} model;

/* Loads the weights of an open model (folder or GGUF) into resident anonymous memory
 * and checks every shape against the config. use_mmap: weight matrices are used in place
 * in the file mapping instead (for models larger than RAM; on VMs whose memory daemon
 * evicts clean file pages, decode slows down badly). */
hearth_status model_load(const hearth_model *hm, int use_mmap, model **out, hearth_error *err);
/* Drops the tensor pages of the model's file mappings from this process (model_load does,
 * once the weights are copied; fit does before it measures this process, so both start the
 * engine from the same resident set). Metadata pages stay; a later read faults pages back. */
void model_drop_file_pages(const struct hearth_model *hm);
/* Reads the config and sizes every weight (names and shapes checked) without
 * allocating or copying them: m->arena is NULL, model_weight_bytes is what model_load
 * would allocate, weights carry format and shape but no data. For fit predictions. */
hearth_status model_plan(const hearth_model *hm, int use_mmap, model **out, hearth_error *err);
void model_free(model *m);
/* The multi-token-prediction head of a loaded Qwen3.5 model (vLLM's Qwen3.5 / Qwen3-Next MTP):
 * a model of one full-attention layer (mtp.layers.0.*) whose input is
 * mtp.fc · [rmsnorm(embedding of token t + 1); rmsnorm(the model's final-normed hidden row of
 * token t)] (op_mtp) and whose output is mtp.norm and the model's lm_head; it shares the
 * model's embedding and lm_head, so `target` must outlive it. Fails, naming what is missing,
 * when the checkpoint has no mtp.* weights (mlx-lm's conversions drop them) or the family
 * has none hearth runs. */
hearth_status model_load_mtp(const struct hearth_model *hm, const model *target, model **out, hearth_error *err);
/* model_plan of that head (fit), beside the plan of its model. */
hearth_status model_plan_mtp(const struct hearth_model *hm, const model *target, model **out, hearth_error *err);
/* Points the loaded matrix read from `tensor` (and its other views: a tied lm_head) at w
 * instead, of the same shape in any format the backends run; *old (optional) gets what it
 * was, so a second call with it restores the matrix. w's memory stays the caller's. A CPU
 * backend reads the new weight at its next op; one that copied the weights (CUDA) does not
 * see the change. */
hearth_status model_set_weight(model *m, const char *tensor, const op_weight *w, op_weight *old, hearth_error *err);
/* Bytes model_load will allocate for this model (for fit predictions). */
size_t model_weight_bytes(const model *m);
/* The weights' part of the load's peak resident memory: the largest (arena bytes written so
 * far + the file pages of the tensor being copied) over the load, since each tensor's file
 * pages leave the process once copied (without --mmap). Known from model_plan too. */
size_t model_load_peak_bytes(const model *m);

/* The KV pool of a model: a layer per layer that stores keys and values (Gemma 4: the
 * layers before first_shared, each of its own shape), else n_layers alike; and its bytes
 * (kv_bytes_quant / kv_storage_bytes for this model). */
hearth_status model_kv_create(const model_config *c, kv_cache *kv, int max_slots, int max_context, int n_blocks,
                              int quant, int with_storage, hearth_error *err);
size_t model_kv_bytes(const model_config *c, int max_slots, int max_context, int n_blocks, int quant);
size_t model_kv_storage_bytes(const model_config *c, int n_blocks, int quant);

/* What a backend must hold of m (op_model: shapes, every weight and vector in upload
 * order, each layer's attention window); valid while m lives. */
const op_model *model_ops(const model *m);

/* One step over a ragged batch (op_batch): the tokens' K/V join the cache (slots must be
 * reserved through max(pos)+1), then the logits of the n_out rows listed in out_rows go
 * where `out` says (OP_OUT_LOGITS: b->logits [n_out, vocab]; OP_OUT_IDS: their greedy ids
 * into ids; OP_OUT_KEEP: left in the backend for its sampler; OP_OUT_HIDDEN: the
 * final-normed hidden rows into b->logits [n_out, hidden], for embedding models). Runs the
 * family's forward pass on backend be. */
hearth_status model_forward(const model *m, op_backend *be, kv_cache *kv, const op_batch *b, op_out out, int32_t *ids,
                            hearth_error *err);
#endif
