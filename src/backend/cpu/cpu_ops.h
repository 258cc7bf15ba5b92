/* cpu_ops.h: the CPU backend's element-wise and attention kernels over float32 rows of a
 * ragged batch (matmul lives in matmul.h); cpu_backend.c composes them into the op table
 * (ops/ops.h). Every kernel writes into caller-owned buffers and allocates nothing. */
#ifndef HEARTH_BACKEND_CPU_OPS_H
#define HEARTH_BACKEND_CPU_OPS_H
#include "base/threadpool.h"
#include "kv/kv_cache.h"
#include <stddef.h>
#include <stdint.h>

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * (w + shift), for T rows of n. shift is 1 for
 * (1 + weight) norms, else 0; w NULL: no scale (a value norm). out may equal x. */
void ops_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps);
/* Applies RoPE in place to n_heads heads of head_dim in each of T rows at positions pos.
 * inv_freq has head_dim/2 entries (theta_i = pos * inv_freq[i]). adjacent: rotate pairs
 * (2i, 2i+1) as llama.cpp-permuted GGUF weights expect; else pairs (i, i + head_dim/2) as HF/MLX do. */
void ops_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq, int adjacent);
/* The same on the first rot_dims of each head only (pairs i, i + rot_dims/2; inv_freq has
 * rot_dims/2 entries), the rest unchanged: partial RoPE. */
void ops_rope_part(float *x, int T, int n_heads, int head_dim, int rot_dims, const int32_t *pos, const float *inv_freq,
                   int adjacent);
/* x[i] = act(gate[i]) * up[i]: SiLU or tanh-approximated GELU (op_act). */
void ops_silu_mul(float *gate, const float *up, size_t n);
void ops_gelu_tanh_mul(float *gate, const float *up, size_t n);
/* x = cap tanh(x / cap) (a final logit softcap); vectorized above the scalar level. */
void ops_softcap(float *x, size_t n, float cap);
/* The first index of the largest of x[0..n), NaN never above anything (x[0] NaN: 0): the
 * greedy rule, as the loop `if (x[i] > x[best]) best = i` gives it. */
int ops_argmax(const float *x, int n);
/* 1 when no value of x[0..n) is Inf or NaN (the engine's check of every logits row). */
int ops_all_finite(const float *x, size_t n);
void ops_add(float *x, const float *y, size_t n);
void ops_scale(float *x, float s, size_t n);

/* Causal attention over the paged cache for one layer (float or int8 KV: int8 rows are
 * dequantized inside the dot products, never into a buffer). For each token t (of sequence
 * slot[t] at position pos[t]) and query head h, attends to that sequence's cached
 * positions max(0, pos[t] - window + 1) .. pos[t] (window 0 = unlimited), with grouped
 * KV heads (n_heads / n_kv_heads queries per KV head). q: [T, n_heads*head_dim];
 * out: same shape. scratch holds ops_attention_scratch floats per thread. */
typedef struct ops_attention_args {
    const kv_cache *kv;
    int layer;
    const float *q;
    float *out;
    int T, n_heads, n_kv_heads, head_dim;
    const int32_t *pos, *slot;
    int window;
    float scale;
    float *scratch; /* tp_threads(tp) * ops_attention_scratch(kv) floats */
    const struct ops_attention_kernels *kernels; /* set by ops_attention (ISA level, KV storage) */
    int heads_per_task; /* set by ops_attention: query heads of one KV head that a task takes */
    /* set by ops_attention when the rows' splits run as tasks of their own (few rows): the
     * shared partials and arrival counts (in thread 0's scratch) and the scores' room */
    float *split_part;
    int *split_count;
    size_t split_cap;
} ops_attention_args;
size_t ops_attention_scratch(const kv_cache *kv);

/* The middle of a Gated DeltaNet layer (op_gdn in ops/ops.h) for the T tokens of a ragged
 * batch, in order, on the state pool's layer `layer` (kv_state.h): qkv [T, conv_dim] holds
 * the in_proj_qkv rows (overwritten: conv, SiLU, q/k normalised), z [T, v_heads*v_dim] and
 * a, b [T, v_heads] the other projections; y [T, v_heads*v_dim] gets the gated-normed
 * outputs. Heads run as tasks on tp. */
typedef struct ops_gdn_args {
    const kv_cache *kv;
    int layer, T;
    const int32_t *pos, *slot;
    int k_heads, v_heads, k_dim, v_dim, conv_k, v_tiled;
    const float *conv, *A_log, *dt_bias, *norm;
    float norm_eps;
    float *qkv;
    const float *z, *a, *b;
    float *y;
    /* NULL, or per token NULL or its journal entry (ops_gdn_journal_floats): the conv's input,
     * the normalised q / k / v it gave, and each value head's g and beta, for ops_gdn_replay */
    float *const *journal;
} ops_gdn_args;
void ops_gated_delta(const ops_gdn_args *a, threadpool *tp);
/* Floats of one token's journal entry: 2 conv_dim + 2 v_heads. */
size_t ops_gdn_journal_floats(int k_heads, int v_heads, int k_dim, int v_dim);
/* Layer a->layer of slot's state (a's geometry and kv; no weights, no token arrays) taken
 * through n journaled tokens again, entries[0..n): the same conv shifts and delta-rule row
 * updates as ops_gated_delta made for them, so the state is bit for bit the one after them. */
void ops_gdn_replay(const ops_gdn_args *a, int slot, float *const *entries, int n);
void ops_attention(const ops_attention_args *a, threadpool *tp);
#endif
