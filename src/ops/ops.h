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
    float norm_eps;
    int rope_adjacent; /* GGUF llama weights are permuted for adjacent-pair RoPE */
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
} op_item;

/* What a backend is told of a model when it starts: shapes, every item its ops will be
 * passed (in the order a device copy allocates them), and per layer the attention window
 * (0: every position), which bounds what a decode step reads. */
typedef struct op_model {
    op_dims dims;
    const op_item *items;
    int n_items;
    const int *layer_window;
} op_model;

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
} op_attn;

/* A gated MLP: down(act(gate · x) * (up · x)). */
typedef struct op_mlp {
    const op_weight *gate, *up, *down;
    op_act act;
} op_mlp;

/* A mixture-of-experts MLP (Qwen3-MoE, mlx-lm SwitchGLU): router logits = router · x,
 * softmax over the experts, the top_k of them per token (weights renormalized to sum 1
 * when norm_topk), and the weighted sum of those experts' gated MLPs. gate / up / down hold
 * every expert's matrix stacked: expert e is rows [e * rows, (e + 1) * rows) (rows = moe_ffn
 * for gate / up, hidden for down). */
typedef struct op_moe {
    const op_weight *router, *gate, *up, *down;
    int norm_topk;
    op_act act;
} op_moe;

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
    /* x += delta (unless OP_NONE); xn = rmsnorm(x) * (w + shift). next: the weights that
     * will read xn (a backend may prepare xn for them, e.g. quantize it once). */
    hearth_status (*add_norm)(const op_step *s, op_buf delta, const float *w, float shift, const op_weight *const *next,
                              int n_next);
    /* buf = rmsnorm(buf) * (w + shift), in place. */
    hearth_status (*norm)(const op_step *s, op_buf buf, const float *w, float shift);
    /* dst += src. */
    hearth_status (*add)(const op_step *s, op_buf dst, op_buf src);
    /* buf *= factor (each element, one rounding). */
    hearth_status (*scale)(const op_step *s, op_buf buf, float factor);
    /* q, k, v = projections of xn (+ bias, per-head norm, RoPE at each token's position);
     * the keys and values join layer `layer` of the KV pool. */
    hearth_status (*qkv_rope_store)(const op_step *s, int layer, const op_attn *a);
    /* tmp = o · attention(q over the cached keys and values of each token's sequence). */
    hearth_status (*attention)(const op_step *s, int layer, const op_attn *a);
    /* tmp = the gated MLP of xn. */
    hearth_status (*mlp)(const op_step *s, const op_mlp *m);
    /* tmp = the mixture-of-experts MLP of xn (dims.n_experts, top_k_experts, moe_ffn). */
    hearth_status (*moe)(const op_step *s, const op_moe *m);
    /* logits of the step's out_rows: lm_head · (rmsnorm(x[row]) * (w + shift) / div) (div 1:
     * none; OP_OUT_HIDDEN: the normed rows themselves, undivided). */
    hearth_status (*logits)(const op_step *s, const float *w, float shift, float div, const op_weight *lm_head);
    /* The device copy of kv rows (a partial prefix match), ordered before the next step;
     * NULL where the KV pool is the host's own. */
    hearth_status (*kv_copy)(op_backend *be, int32_t src, int32_t dst, int rows, hearth_error *err);
    void (*free)(op_backend *be);
};

/* Every backend instance starts with its table. */
struct op_backend {
    const op_table *t;
};

/* The op calls a forward pass makes, one per table entry. */
static inline hearth_status op_add_norm(const op_step *s, op_buf delta, const float *w, float shift,
                                        const op_weight *const *next, int n_next) {
    return s->t->add_norm(s, delta, w, shift, next, n_next);
}
static inline hearth_status op_norm(const op_step *s, op_buf buf, const float *w, float shift) {
    return s->t->norm(s, buf, w, shift);
}
static inline hearth_status op_add(const op_step *s, op_buf dst, op_buf src) { return s->t->add(s, dst, src); }
static inline hearth_status op_scale(const op_step *s, op_buf buf, float factor) {
    return s->t->scale(s, buf, factor);
}
static inline hearth_status op_qkv_rope_store(const op_step *s, int layer, const op_attn *a) {
    return s->t->qkv_rope_store(s, layer, a);
}
static inline hearth_status op_attention(const op_step *s, int layer, const op_attn *a) {
    return s->t->attention(s, layer, a);
}
static inline hearth_status op_mlp_run(const op_step *s, const op_mlp *m) { return s->t->mlp(s, m); }
static inline hearth_status op_moe_run(const op_step *s, const op_moe *m) { return s->t->moe(s, m); }

/* Expert e's rows of a stacked expert weight (op_moe): a view, no copy. */
op_weight op_weight_rows(const op_weight *w, int64_t row0, int64_t rows);
static inline hearth_status op_logits(const op_step *s, const float *w, float shift, float div,
                                      const op_weight *lm_head) {
    return s->t->logits(s, w, shift, div, lm_head);
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
