/* ops.h: the op table: the fixed set of (fused) operations a forward pass is written in,
 * their argument structs, and the dispatch to the backend that runs them. Every backend
 * (backend/cpu, backend/cuda) implements every op; a family's forward pass
 * (model/<family>.c) is a straight sequence of these calls and never sees a kernel, a
 * device pointer or which backend runs it. No SIMD or CUDA code here. */
#ifndef HEARTH_OPS_OPS_H
#define HEARTH_OPS_OPS_H
#include "base/threadpool.h"
#include "hearth.h"
#include "kv/kv_cache.h"
#include "ops/op_weight.h"
#include <stddef.h>
#include <stdint.h>

/* The shapes every op of a decoder model needs. */
typedef struct op_dims {
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab;
    int n_experts, top_k_experts, moe_ffn; /* mixture-of-experts layers (0 experts: none) */
    int shared_ffn; /* the width of a shared expert beside the routed ones (Qwen3.5-MoE), else 0 */
    float norm_eps;
    int rope_adjacent; /* GGUF llama weights are permuted for adjacent-pair RoPE */
    /* Hybrid models (Qwen3.5): n_state_layers Gated DeltaNet layers (op_gdn) with gdn_k_heads
     * query/key heads of gdn_k_dim, gdn_v_heads value heads of gdn_v_dim and a causal conv1d of
     * gdn_conv taps; their per-sequence state lives in the KV pool's state pool (kv_state). */
    int n_state_layers, gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim, gdn_conv;
    /* value head h reads key head h / (v_heads / k_heads) (grouped, Hugging Face's order), or
     * with gdn_v_tiled h % k_heads (llama.cpp's GGUF stores the value heads tiled) */
    int gdn_v_tiled;
    int attn_gate; /* attention's q projection is doubled: per head, head_dim queries then head_dim output gates */
    /* Gemma 4: layers of their own head_dim / KV heads / MLP width (head_dim, n_kv_heads and
     * ffn above are then the maxima), KV shared between layers, per-layer inputs of
     * per_layer_dim values per layer (0: none). A backend that cannot run such a model
     * refuses it when it starts. */
    int varied_layers, per_layer_dim;
    int mtp; /* a multi-token-prediction head (op_mtp): its step starts from the embedding and a hidden row */
} op_dims;

/* One item a backend must hold a copy of (weights and vectors that ops are passed): a
 * matrix, or a float vector of n values. A planned model (sized, not loaded) has vector
 * data NULL and weight data NULL. logits marks the output projection (sized apart: it is
 * not a layer weight). */
typedef struct op_item {
    const op_weight *w; /* a matrix, or NULL for a vector */
    const float *vec;
    int64_t n;
    int logits;
    const char *name; /* for messages: "q_proj", "attn_norm", ... */
    int layer;        /* -1: not in a layer */
    int experts;      /* > 0: w stacks this many experts' matrices (n / experts rows each) */
    int host_only;    /* read on the host only (an embedding table, op_embed_rows): a device backend keeps no copy */
} op_item;

/* What a backend is told of a model when it starts: shapes, every item its ops will be
 * passed (in the order a device copy allocates them), and per layer the attention window
 * (0: every position), which bounds what a decode step reads. */
typedef struct op_model {
    op_dims dims;
    const op_item *items;
    int n_items;
    const int *layer_window;
    /* The KV pool's layers where they have their own shapes (Gemma 4: n_kv_layers, kv_heads[l]
     * x kv_dims[l], shared-KV layers storing none); NULL: one n_kv_heads x head_dim layer per
     * attention layer. What a device plan sizes the pool by before there is one. */
    int n_kv_layers;
    const int *kv_heads, *kv_dims;
    /* Set where the matrices' host bytes are pages of the model file (the load mapped them):
     * a device backend hands each weight's pages back once its device copy is made
     * (release_host(release_ctx, p, n) for its data, scales and biases). The page cache keeps
     * them and a later host read faults them in again, so nothing is lost: the process just
     * stops holding a second copy of what the device holds. NULL: the host copy is the
     * engine's own memory, kept. */
    void (*release_host)(const void *ctx, const void *p, size_t n);
    const void *release_ctx;
} op_model;

/* The projections of a layer a LoRA adapter may update. */
typedef enum op_proj {
    OP_PROJ_Q,
    OP_PROJ_K,
    OP_PROJ_V,
    OP_PROJ_O,
    OP_PROJ_GATE,
    OP_PROJ_UP,
    OP_PROJ_DOWN,
    /* a Gated DeltaNet layer's (op_gdn): in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj */
    OP_PROJ_GDN_QKV,
    OP_PROJ_GDN_Z,
    OP_PROJ_GDN_B,
    OP_PROJ_GDN_A,
    OP_PROJ_GDN_OUT,
    /* Gemma 4's per-layer input path (op_per_layer_gate): per_layer_input_gate, per_layer_projection */
    OP_PROJ_PLE_GATE,
    OP_PROJ_PLE_PROJ,
    /* a mixture-of-experts layer (op_moe): the router (Qwen's mlp.gate, Gemma 4's router.proj), the
     * shared expert's gate / up / down and its one-row gate (Qwen3.5-MoE) */
    OP_PROJ_ROUTER,
    OP_PROJ_SHARED_GATE,
    OP_PROJ_SHARED_UP,
    OP_PROJ_SHARED_DOWN,
    OP_PROJ_SHARED_ROUTER,
    /* the routed experts' gate / up / down (mlx-lm's SwitchLinear: one pair per expert, op_lora.experts) */
    OP_PROJ_EXP_GATE,
    OP_PROJ_EXP_UP,
    OP_PROJ_EXP_DOWN,
    OP_N_PROJ
} op_proj;

/* One adapter's low-rank update of one projection (LoRA): y += scale * B (A x), with A
 * [rank, k] and B transposed, [rank, n], in float32 (outputs in the base weight's own row
 * order). DoRA also
 * rescales each output before the bias: y[j] *= dora[j] (the magnitude over the norm of the
 * adapted row, fixed once the adapter is loaded). a NULL: the projection is left alone. */
typedef struct op_lora {
    const float *a, *b;
    const float *dora; /* NULL: plain LoRA */
    int rank;
    float scale;
    /* > 0: one pair per expert of a stacked expert weight (OP_PROJ_EXP_*): expert e's A is
     * [rank, k] at a + e rank k, its B [rank, n] at b + e rank n (n, k: one expert's matrix);
     * never DoRA */
    int experts;
} op_lora;

/* An adapter as the ops see it: its update of every projection, [n_layers * OP_N_PROJ]
 * (layer i, projection p at i * OP_N_PROJ + p). A device backend copies it whole: every
 * a / b / dora of proj points into data (floats of them), and key names this adapter
 * uniquely for the backend's life (the registry's mount serial; 0: no device copy). */
typedef struct op_adapter {
    const op_lora *proj;
    const float *data;
    size_t floats;
    uint64_t key;
} op_adapter;

/* The adapters one token's row applies, their updates summed ("a+b"; a DoRA adapter is
 * always alone: its rescaling is its own). */
typedef struct op_adapter_set {
    int n;
    const op_adapter *const *a;
} op_adapter_set;

/* The widest adapter rank the ops take (op_lora_apply keeps A x on its stack). */
#define OP_LORA_MAX_RANK 1024

/* One step over a ragged batch of T tokens: tokens[t] of sequence slot[t] at position
 * pos[t]; logits for the n_out rows listed in out_rows (into logits [n_out, vocab] when
 * the step's output goes to the host). batch_invariant: deterministic mode, every row
 * computed as if it were alone. */
typedef struct op_batch {
    int T;
    const int32_t *tokens, *pos, *slot;
    int n_out;
    const int32_t *out_rows;
    float *logits;
    int batch_invariant;
    /* [T]: each token's adapters (NULL entry: the base alone); NULL: no token has any */
    const op_adapter_set *const *row_adapters;
    /* multi-token prediction: hidden_in [T, hidden], each token's hidden row for op_mtp (a
     * head's step); hidden_out [T, hidden] (NULL: not wanted), every token's final-normed row,
     * written by op_logits whatever `out` says (the model's rows a head reads next) */
    const float *hidden_in;
    float *hidden_out;
} op_batch;

/* The activation buffers ops name, [T, hidden] each, owned by the backend: the residual
 * stream x, its normalized copy xn (the input of attention and the MLP), and tmp (their
 * output, added back into x). */
typedef enum op_buf { OP_NONE = -1, OP_X = 0, OP_XN, OP_TMP } op_buf;

typedef enum op_act { OP_ACT_SILU, OP_ACT_GELU_TANH } op_act;

/* One attention layer: q/k/v/o projections, optional biases, optional per-head RMSNorms of
 * queries and keys (scaled by w + norm_shift), RoPE with inv_freq (head_dim/2 entries), a
 * window (0: causal over every position) and the softmax scale. */
typedef struct op_attn {
    const op_weight *q, *k, *v, *o;
    const float *q_bias, *k_bias, *v_bias; /* NULL when absent */
    const float *q_norm, *k_norm;          /* NULL when absent */
    float norm_shift, norm_eps;
    const float *inv_freq;
    int window;
    float scale;
    int rope_dims; /* RoPE on the first rope_dims of each head only (pairs i, i + rope_dims/2); 0: all */
    int gated;     /* output *= sigmoid(gate) before o (the gates from the doubled q projection, dims.attn_gate) */
    /* Gemma 4 (0 / NULL elsewhere): this layer's head_dim and KV heads (0: the dims'); values
     * RMS-normed without a scale (v_norm); v NULL: the values are the keys before their norm
     * and RoPE (attention_k_eq_v); shared: the layer reads the keys and values another layer
     * stored at the KV layer it is given, so only its queries are computed. */
    int head_dim, n_kv_heads, v_norm, shared;
    /* which model layer this is (its adapters' updates): the ops' own layer argument is
     * the KV layer, which differs on hybrids and shared-KV layers */
    int layer;
} op_attn;

/* A gated MLP: down(act(gate · x) * (up · x)). */
typedef struct op_mlp {
    const op_weight *gate, *up, *down;
    op_act act;
    int layer; /* which layer (its adapters' updates) */
    int ffn; /* this layer's width (0: dims.ffn) */
} op_mlp;

/* Gemma 4's per-layer inputs (mlx-lm gemma4_text.py), for every token of the step, made
 * once after the embedding: table[token] * table_scale (a row of n_layers * per_layer_dim)
 * plus rmsnorm(proj · x * proj_scale) per layer (weight norm), both times input_scale; x is
 * the scaled embedding. */
typedef struct op_per_layer_inputs {
    const op_weight *table, *proj;
    const float *norm;
    float table_scale, proj_scale, input_scale;
    int vocab;
} op_per_layer_inputs;

/* Layer `layer`'s use of them: tmp = proj · (gelu_tanh(gate · x) * input[layer]) (the
 * forward pass then adds rmsnorm(tmp) * its norm to x with op_residual). */
typedef struct op_per_layer_gate {
    const op_weight *gate, *proj;
} op_per_layer_gate;

/* The residual join between blocks, one op so that a backend runs it as one pass over the
 * rows: d = delta (after, in this order, its own norm rmsnorm(delta) * (delta_norm + shift)
 * when delta_norm is given, and times delta_scale); x = (x + d) * x_scale; then, when w is
 * given, xn = rmsnorm(x) * (w + shift) for the weights in next (a backend may prepare xn for
 * them, e.g. quantize it once; without w, next are the weights that read x itself). Each step rounds to float as the separate ops would (norm,
 * scale, add, scale, norm), so fusing them changes no bits. delta OP_NONE: no add (delta_norm
 * and delta_scale unused); delta is clobbered when delta_norm or delta_scale is used. */
typedef struct op_residual {
    op_buf delta;
    const float *delta_norm;
    float delta_scale, x_scale; /* 1: none */
    const float *w;             /* NULL: x only, no xn */
    float shift;
    const op_weight *const *next;
    int n_next;
} op_residual;

/* A mixture-of-experts MLP (Qwen3-MoE, mlx-lm SwitchGLU): router logits = router · x,
 * softmax over the experts, the top_k of them per token (weights renormalized to sum 1
 * when norm_topk), and the weighted sum of those experts' gated MLPs. gate / up / down hold
 * every expert's matrix stacked: expert e is rows [e * rows, (e + 1) * rows) (rows = moe_ffn
 * for gate / up, hidden for down). */
typedef struct op_moe {
    const op_weight *router, *gate, *up, *down;
    int norm_topk;
    op_act act;
    /* a shared expert (NULL: none; Qwen3.5-MoE): every token's gated MLP of width
     * dims.shared_ffn, times sigmoid(shared_router · x) (one row), added to the sum */
    const op_weight *shared_gate, *shared_up, *shared_down, *shared_router;
    /* Gemma 4 (router_norm non-NULL; mlx-lm gemma4_text.py Router / Experts): the op reads x
     * (the residual), not xn. Router logits = router · rmsnorm(x) * router_norm; the top_k by
     * logit, their softmax times expert_scale[e]; the experts read rmsnorm(x) * in_norm; their
     * weighted sum, rmsnorm'd * out_norm, is added to tmp (which holds the dense MLP's output). */
    const float *router_norm, *in_norm, *out_norm, *expert_scale;
    /* up NULL: gate holds each expert's gate rows and then its up rows (Hugging Face's fused
     * gate_up_proj): expert e's gate is rows [2e moe_ffn, (2e + 1) moe_ffn), its up the next */
    int layer; /* which layer (its adapters' updates) */
} op_moe;

/* A Gated DeltaNet layer (mlx-lm models/qwen3_5.py GatedDeltaNet, gated_delta.py): from xn,
 * qkv = in_proj_qkv · x through a causal depthwise conv1d (width dims.gdn_conv, the last
 * gdn_conv - 1 inputs of the sequence kept in its state) and SiLU; q and k L2-normalised
 * (eps 1e-6; q also times gdn_k_dim^-1/2); per value head, decay g = exp(-exp(A_log) *
 * softplus(a + dt_bias)) and beta = sigmoid(b); the delta rule on the [v_dim, k_dim] state
 * S: S *= g, S += k (beta (v - S k))^T, y = S q; then y = rmsnorm(y) * norm * silu(z) and
 * tmp = out · y. Tokens run in batch order, each on its sequence's state (layer
 * state_layer of the state pool); a token at position 0 starts from a zero state. */
typedef struct op_gdn {
    const op_weight *qkv, *z, *b, *a, *out;
    const float *conv;            /* [conv_dim, gdn_conv], conv_dim = 2 k_heads k_dim + v_heads v_dim */
    const float *A_log, *dt_bias; /* [v_heads] */
    const float *norm;            /* [v_dim] */
    float norm_eps;
    int state_layer;
    int layer; /* which model layer this is (its adapters' updates) */
} op_gdn;

/* A multi-token-prediction head's input (vLLM's Qwen3.5 MTP): x = fc · [rmsnorm(x) * (norm_embed +
 * shift); rmsnorm(hidden_in) * (norm_hidden + shift)], fc [hidden, 2 hidden], x the step's
 * embedded tokens (each the token after its hidden row's). */
typedef struct op_mtp {
    const op_weight *fc;
    const float *norm_embed, *norm_hidden;
    float shift;
} op_mtp;

/* How the step's logits leave it: to the host (batch.logits), only each row's greedy id
 * (ids; the first index of the largest logit), kept where the backend computed them for a
 * sampler that runs there, or (embedding models) the final-normed hidden rows instead of
 * logits, to the host (batch.logits as [n_out, hidden]). */
typedef enum op_out { OP_OUT_LOGITS, OP_OUT_IDS, OP_OUT_KEEP, OP_OUT_HIDDEN } op_out;

typedef struct op_backend op_backend; /* a backend instance: its buffers, its copy of the items */
typedef struct op_table op_table;

/* What every op of one step sees. */
typedef struct op_step {
    const op_table *t;
    op_backend *be;
    const op_dims *dims;
    kv_cache *kv;
    const op_batch *b;
    op_out out;
    hearth_error *err;
} op_step;

/* The part of a forward pass after the embedding (the blocks and the logits): the backend
 * calls it once per step, or once per captured graph that it then replays. */
typedef hearth_status (*op_layers_fn)(const op_step *s, const void *ctx);

/* x = table[token] * scale for every token of the step. */
typedef struct op_embed {
    const op_weight *table;
    float scale;
} op_embed;

struct op_table {
    const char *name;
    /* One step: embeds b's tokens into x, runs layers(s, ctx), and delivers the logits as
     * `out` says (ids: n_out entries). Checks b against the sizes the backend was made for. */
    hearth_status (*step)(op_backend *be, kv_cache *kv, const op_batch *b, const op_dims *dims, const op_embed *embed,
                          op_layers_fn layers, const void *ctx, op_out out, int32_t *ids, hearth_error *err);
    /* The residual join (op_residual). */
    hearth_status (*residual)(const op_step *s, const op_residual *r);
    /* buf = rmsnorm(buf) * (w + shift), in place. */
    hearth_status (*norm)(const op_step *s, op_buf buf, const float *w, float shift);
    /* q, k, v = projections of xn (+ bias, per-head norm, RoPE at each token's position);
     * the keys and values join layer `layer` of the KV pool. */
    hearth_status (*qkv_rope_store)(const op_step *s, int layer, const op_attn *a);
    /* tmp = o · attention(q over the cached keys and values of each token's sequence). */
    hearth_status (*attention)(const op_step *s, int layer, const op_attn *a);
    /* tmp = the gated MLP of xn. */
    hearth_status (*mlp)(const op_step *s, const op_mlp *m);
    /* tmp = the mixture-of-experts MLP of xn (dims.n_experts, top_k_experts, moe_ffn); Gemma 4's
     * form (op_moe.router_norm): tmp += its experts' normed output, from x. */
    hearth_status (*moe)(const op_step *s, const op_moe *m);
    /* tmp = the Gated DeltaNet layer of xn (op_gdn), updating each sequence's state. NULL in
     * a backend that does not run hybrid models (it refuses them at create). */
    hearth_status (*gated_delta)(const op_step *s, const op_gdn *g);
    /* logits of the step's out_rows: lm_head · (rmsnorm(x[row]) * (w + shift) / div) (div 1:
     * none; OP_OUT_HIDDEN: the normed rows themselves, undivided); and b->hidden_out when set. */
    hearth_status (*logits)(const op_step *s, const float *w, float shift, float div, const op_weight *lm_head);
    /* Gemma 4 (NULL in a backend that refuses varied_layers models): the step's per-layer
     * inputs, a layer's per-layer gate, and logits = tanh(logits / cap) * cap for the rows
     * op_logits delivered. */
    hearth_status (*per_layer_inputs)(const op_step *s, const op_per_layer_inputs *p);
    hearth_status (*per_layer_gate)(const op_step *s, int layer, const op_per_layer_gate *g);
    hearth_status (*softcap)(const op_step *s, float cap);
    /* A multi-token-prediction head's input (op_mtp), from b->hidden_in; NULL in a backend that
     * runs no such head (the engine refuses them there). */
    hearth_status (*mtp_input)(const op_step *s, const op_mtp *m);
    /* The device copy of kv rows (a partial prefix match), ordered before the next step;
     * NULL where the KV pool is the host's own. */
    hearth_status (*kv_copy)(op_backend *be, int32_t src, int32_t dst, int rows, hearth_error *err);
    /* The adapter of this op_adapter.key is gone (unmounted, no row uses it): its device
     * copy may go. NULL where the backend reads the host's own copy. */
    void (*adapter_gone)(op_backend *be, uint64_t key);
    /* Hybrids: the device copy of a recurrent-state record into another, ordered before the
     * next step (a snapshot kept or loaded, kv_state.h): record r < kv->max_slots is slot r's
     * (every state layer), else snapshot r - max_slots. NULL where the state pool is the
     * host's own. */
    hearth_status (*state_copy)(op_backend *be, int src, int dst, hearth_error *err);
    /* Hybrids, speculation (NULL: the scheduler feeds a rejected proposal's accepted tokens
     * again instead): from the next step on, journal `rec` (< kv_state.n_spec) keeps slot's
     * Gated DeltaNet inputs of each step (slot -1: none); state_replay takes slot's state
     * (put back to the step's start by the caller) through the first n tokens journaled in
     * the last step, bit for bit as the step took them. */
    hearth_status (*state_journal)(op_backend *be, int rec, int slot, hearth_error *err);
    hearth_status (*state_replay)(op_backend *be, kv_cache *kv, int slot, int rec, int n, hearth_error *err);
    /* Saved KV files (engine/seq_file.c) on a device pool: positions [0, n) of slot's
     * (layer, KV head) rows in kv_slot_rows_read's form (the layer's own head_dim, the
     * pool's element type, scales for int8 / fp8), to the host (to_host) or from it; and
     * slot's recurrent-state record (every state layer, `bytes`) likewise. Done when they
     * return. NULL where the pools are the host's own. */
    hearth_status (*kv_rows)(op_backend *be, const kv_cache *kv, int layer, int slot, int head, int n, void *keys,
                             void *values, float *k_scale, float *v_scale, int to_host, hearth_error *err);
    hearth_status (*state_rows)(op_backend *be, int slot, void *record, size_t bytes, int to_host, hearth_error *err);
    void (*free)(op_backend *be);
};

/* Every backend instance starts with its table. */
struct op_backend {
    const op_table *t;
};

/* The op calls a forward pass makes, one per table entry. */
static inline hearth_status op_residual_run(const op_step *s, const op_residual *r) { return s->t->residual(s, r); }
/* x += delta (unless OP_NONE); xn = rmsnorm(x) * (w + shift) unless w is NULL; next: the
 * weights that read xn. */
static inline hearth_status op_add_norm(const op_step *s, op_buf delta, const float *w, float shift,
                                        const op_weight *const *next, int n_next) {
    op_residual r = {.delta = delta, .delta_scale = 1.0f, .x_scale = 1.0f, .w = w, .shift = shift, .next = next,
                     .n_next = n_next};
    return s->t->residual(s, &r);
}
static inline hearth_status op_norm(const op_step *s, op_buf buf, const float *w, float shift) {
    return s->t->norm(s, buf, w, shift);
}
static inline hearth_status op_qkv_rope_store(const op_step *s, int layer, const op_attn *a) {
    return s->t->qkv_rope_store(s, layer, a);
}
static inline hearth_status op_attention(const op_step *s, int layer, const op_attn *a) {
    return s->t->attention(s, layer, a);
}
static inline hearth_status op_mlp_run(const op_step *s, const op_mlp *m) { return s->t->mlp(s, m); }
static inline hearth_status op_moe_run(const op_step *s, const op_moe *m) { return s->t->moe(s, m); }
static inline hearth_status op_gated_delta(const op_step *s, const op_gdn *g) { return s->t->gated_delta(s, g); }

/* y[t] += every adapter update of projection p of layer `layer` for each token t of the
 * step whose row has adapters (x [T, k] the projection's input, y [T, n] its output before
 * any bias); DoRA rows are then rescaled. Rows without adapters are not touched, so they
 * stay bit-identical to the base. Scalar, on the host, rows spread over tp; a backend calls
 * it right after the projection's matmul. */
void op_lora_apply(const op_batch *b, int layer, op_proj p, const float *x, int64_t k, float *y, int64_t n,
                   threadpool *tp);
/* The same for expert e's pairs (OP_PROJ_EXP_*) on rows gathered for that expert: row i of x
 * [rows, k] and y [rows, n] is token tok[i]'s (whose adapters apply). */
void op_lora_apply_expert(const op_batch *b, int layer, op_proj p, int e, const int32_t *tok, int rows, const float *x,
                          int64_t k, float *y, int64_t n, threadpool *tp);
/* Whether any token's adapters update projection p of layer `layer`. */
int op_batch_adapts(const op_batch *b, int layer, op_proj p);
/* Whether any token of the step has adapters. */
static inline int op_batch_has_adapters(const op_batch *b) {
    if (!b->row_adapters) return 0;
    for (int t = 0; t < b->T; t++)
        if (b->row_adapters[t]) return 1;
    return 0;
}
static inline hearth_status op_per_layer_inputs_run(const op_step *s, const op_per_layer_inputs *p) {
    return s->t->per_layer_inputs(s, p);
}
static inline hearth_status op_per_layer_gate_run(const op_step *s, int layer, const op_per_layer_gate *g) {
    return s->t->per_layer_gate(s, layer, g);
}
static inline hearth_status op_softcap(const op_step *s, float cap) { return s->t->softcap(s, cap); }
static inline hearth_status op_mtp_input(const op_step *s, const op_mtp *m) { return s->t->mtp_input(s, m); }

/* One token's experts from its router logits g [E] (overwritten): softmax over the experts
 * (in float, max first, as mlx's precise softmax), the top K by weight (ties: the lower
 * expert index), renormalized to sum 1 when m->norm_topk. Gemma 4 (m->router_norm): the
 * top K by logit, then the softmax of those K logits times m->expert_scale of each. Every
 * backend routes by this one rule, so they pick the same experts; its exp is op_expf (op_exp.h),
 * which cuda_moe.cu's routing kernel computes to the same bits. */
void op_moe_route(const op_moe *m, float *g, int E, int K, int32_t *sel, float *w);
/* Expert e's rows of a stacked expert weight (op_moe): a view, no copy. */
op_weight op_weight_rows(const op_weight *w, int64_t row0, int64_t rows);
static inline hearth_status op_logits(const op_step *s, const float *w, float shift, float div,
                                      const op_weight *lm_head) {
    return s->t->logits(s, w, shift, div, lm_head);
}

/* Floats of one sequence's recurrent state in one Gated DeltaNet layer (the conv's last
 * gdn_conv - 1 inputs, then every value head's [v_dim, k_dim] delta-rule state); 0 without. */
static inline size_t op_gdn_state_floats(const op_dims *d) {
    if (d->n_state_layers <= 0) return 0;
    size_t conv = 2 * (size_t)d->gdn_k_heads * d->gdn_k_dim + (size_t)d->gdn_v_heads * d->gdn_v_dim;
    return (size_t)(d->gdn_conv - 1) * conv + (size_t)d->gdn_v_heads * d->gdn_v_dim * d->gdn_k_dim;
}

/* The checks every backend's step makes before it runs: T and n_out within its sizes,
 * every position reserved in kv, every out_row inside the batch. */
hearth_status op_batch_check(const op_batch *b, const kv_cache *kv, int max_tokens, int max_out, hearth_error *err);
/* x[t] = e->table[tokens[t]] * e->scale for T tokens (hidden floats each), made with the
 * scalar dequantizer on the host (bit-exact, every format), rows spread over tp; fails on
 * a token outside [0, vocab). Every backend's step starts with it. */
hearth_status op_embed_rows(const op_embed *e, const int32_t *tokens, int T, int vocab, float *x, threadpool *tp,
                            hearth_error *err);
#endif
