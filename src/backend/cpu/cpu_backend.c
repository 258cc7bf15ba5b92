/* cpu_backend.c: the op table on the CPU. Each op is the plain sequence of kernels
 * (matmul.h, cpu_ops.h) over float32 activation rows held here; weights are read in place
 * from the model's memory. Scratch is sized once for the largest step; a step allocates
 * nothing. Knows no model family: the forward pass comes from model/ as op calls. */
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul.h"
#include "base/err.h"
#include "kv/kv_state.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_backend {
    op_backend base;
    threadpool *tp;
    int max_tokens, max_out;
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up; /* [max_tokens, width] each */
    float *rows;                                       /* [max_out, hidden]: rows that need logits */
    /* mixture of experts (op_moe): router logits [T, experts]; an expert's tokens' inputs
     * [T, hidden], gate and up [T, moe_ffn], output [T, hidden]; each token's chosen
     * experts and weights [T, top_k]; the tokens of one expert [T] */
    float *moe_logits, *moe_x, *moe_gate, *moe_up, *moe_out, *moe_w;
    int32_t *moe_sel, *moe_tok;
    float *moe_tokw;
    /* per-layer inputs (op_per_layer_inputs) [T, n_layers * per_layer_dim] and their working rows */
    float *pl_in, *pl_tmp;
    float *moe_acc; /* [T, hidden]: the normed MoE form's experts' sum before its norm (moe only) */
    float *attn;                                       /* attention scratch, per thread */
    /* hybrid models: attention's output gates [T, heads*head_dim] (dims.attn_gate); the
     * Gated DeltaNet projections qkv [T, conv_dim], z [T, v_heads*v_dim], a and b
     * [T, v_heads], and its output y [T, v_heads*v_dim] (op_gdn) */
    float *qgate, *gdn_qkv, *gdn_z, *gdn_a, *gdn_b, *gdn_y;
    /* speculation on hybrids (op_table.state_journal): per backup record, per state layer, the
     * journal entries of its row's tokens this step [rec][layer][KV_STATE_SPEC_TOKENS][entry];
     * the step's per-token entry pointers [max_tokens]; which slot each record follows (-1
     * none) and how many of its tokens the last step held */
    float *journal;
    float **jr_ptr;
    float *mtp_in; /* a multi-token-prediction head's [T, 2 hidden] input (op_mtp; dims.mtp only) */
    int jr_slot[KV_STATE_SPEC_MAX], jr_count[KV_STATE_SPEC_MAX];
    const op_dims *dims;
    void *mm;                                          /* matmul scratch (quantized activations) */
    size_t mm_size;
} cpu_backend;

static cpu_backend *cb(const op_step *s) { return (cpu_backend *)s->be; }

static size_t mm_scratch_need(const op_model *om, int T) {
    size_t need = 0;
    for (int i = 0; i < om->n_items; i++) {
        if (!om->items[i].w) continue;
        size_t n = cpu_matmul_scratch_size(om->items[i].w, T);
        if (n > need) need = n;
    }
    return need;
}

/* The sizes of the buffers, in floats (4 bytes) each, in cpu_backend's order. */
enum { CPU_N_ACT = 32 };
_Static_assert(sizeof(float *) <= 2 * sizeof(float), "jr_ptr is sized as 2 floats a pointer");
static void act_sizes(const op_dims *d, const kv_cache *kv, int max_tokens, int max_out, int n_threads,
                      size_t sizes[CPU_N_ACT]) {
    size_t T = (size_t)max_tokens, qd = (size_t)d->n_heads * d->head_dim, kd = (size_t)d->n_kv_heads * d->head_dim;
    size_t ffn = (size_t)(d->shared_ffn > d->ffn ? d->shared_ffn : d->ffn); /* gate, up: the MLP or a shared expert */
    size_t E = (size_t)d->n_experts, K = (size_t)d->top_k_experts, F = (size_t)d->moe_ffn, moe = E > 0;
    size_t per_layer = (size_t)d->n_layers * d->per_layer_dim;
    size_t gate = d->attn_gate != 0, gdn = d->n_state_layers > 0, vd = (size_t)d->gdn_v_heads * d->gdn_v_dim;
    size_t conv = 2 * (size_t)d->gdn_k_heads * d->gdn_k_dim + vd;
    size_t s[CPU_N_ACT] = {T * d->hidden,
                           T * d->hidden,
                           T * qd * (1 + gate),
                           T * kd,
                           T * kd,
                           T * qd,
                           T * d->hidden,
                           T * ffn,
                           T * ffn,
                           (size_t)max_out * d->hidden,
                           (size_t)n_threads * ops_attention_scratch(kv),
                           moe * T * E,
                           moe * T * d->hidden,
                           moe * T * F,
                           moe * T * F,
                           moe * T * d->hidden,
                           moe * T * K,
                           moe * T * K,
                           moe * T,
                           moe * T,
                           gate * T * qd,
                           gdn * T * conv,
                           gdn * T * vd,
                           gdn * T * d->gdn_v_heads,
                           gdn * T * d->gdn_v_heads,
                           gdn * T * vd,
                           T * per_layer,
                           T * per_layer,
                           moe * T * d->hidden,
                           gdn * (size_t)kv_state_spec_records(kv->max_slots) * (size_t)d->n_state_layers *
                               KV_STATE_SPEC_TOKENS *
                               ops_gdn_journal_floats(d->gdn_k_heads, d->gdn_v_heads, d->gdn_k_dim, d->gdn_v_dim),
                           gdn * T * 2 /* pointers: 8 bytes each */,
                           (d->mtp != 0) * T * 2 * d->hidden};
    memcpy(sizes, s, sizeof s);
}

size_t cpu_backend_bytes(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int n_threads) {
    size_t sizes[CPU_N_ACT], total = sizeof(cpu_backend) + mm_scratch_need(om, max_tokens) + 64 * (CPU_N_ACT + 1);
    act_sizes(&om->dims, kv, max_tokens, max_out, n_threads, sizes);
    for (int i = 0; i < CPU_N_ACT; i++) total += sizes[i] * sizeof(float);
    return total;
}

static void cpu_free(op_backend *be) {
    cpu_backend *c = (cpu_backend *)be;
    if (!c) return;
    void *ptrs[] = {c->x,     c->xn,      c->q,       c->k,          c->v,       c->att,      c->tmp,    c->gate,
                    c->up,    c->rows,    c->attn,    c->moe_logits, c->moe_x,   c->moe_gate, c->moe_up, c->moe_out,
                    c->moe_w, c->moe_sel, c->moe_tok, c->moe_tokw,   c->qgate,   c->gdn_qkv,  c->gdn_z,  c->gdn_a,
                    c->gdn_b, c->gdn_y,   c->pl_in,   c->pl_tmp,     c->moe_acc, c->journal,  c->jr_ptr, c->mtp_in};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    free(c->mm);
    free(c);
}

static float *buf(const op_step *s, op_buf b) {
    cpu_backend *c = cb(s);
    return b == OP_X ? c->x : b == OP_XN ? c->xn : b == OP_TMP ? c->tmp : NULL;
}

static hearth_status matmul(const op_step *s, const op_weight *w, const float *x, int T, float *y) {
    cpu_backend *c = cb(s);
    if (s->b->batch_invariant) return cpu_matmul_invariant(w, x, T, y, c->mm, c->mm_size, c->tp, s->err);
    return cpu_matmul(w, x, T, y, c->mm, c->mm_size, c->tp, s->err);
}

/* Weights that read the same input (q/k/v, gate/up) in one thread-pool round: decode of
 * small models is bound by the number of rounds, not by the weights' bytes. */
static hearth_status matmul_fused(const op_step *s, int count, const op_weight *const *ws, float *const *ys,
                                  const float *x) {
    cpu_backend *c = cb(s);
    return cpu_matmul_fused(count, ws, ys, x, s->b->T, c->mm, c->mm_size, c->tp, s->b->batch_invariant, s->err);
}

/* A block's projections: model layer `layer`'s. The last layer's keep float activations
 * (cpu_matmul_precise): its rounding error reaches the logits with no layer after it to damp
 * it, and it is one layer's weights of many (bench/results/cpu_quality.md). */
static hearth_status matmul_layer(const op_step *s, int layer, int count, const op_weight *const *ws,
                                  float *const *ys, const float *x, int T) {
    cpu_backend *c = cb(s);
    if (layer == s->dims->n_layers - 1)
        return cpu_matmul_precise(count, ws, ys, x, T, c->mm, c->mm_size, c->tp, s->b->batch_invariant, s->err);
    return cpu_matmul_fused(count, ws, ys, x, T, c->mm, c->mm_size, c->tp, s->b->batch_invariant, s->err);
}

/* The rows the last layer's o projection and MLP must compute: only the step's output rows
 * reach op_logits, so once the last layer's keys and values are stored every other row's
 * residual is dead. Returns how many rows are live (the output rows, packed to the front of
 * the buffers by pack_rows), or T: every row (not the last layer, every row an output, rows
 * with adapters, every row's hidden row wanted (op_batch.hidden_out), or out_rows not
 * strictly ascending). A live row's values are the same
 * either way: the kernels compute each row alone (batch-invariant). */
static int live_rows(const op_step *s, int layer) {
    const op_batch *b = s->b;
    if (layer != s->dims->n_layers - 1 || b->n_out >= b->T || op_batch_has_adapters(b) || b->hidden_out) return b->T;
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < i || b->out_rows[i] >= b->T || (i && b->out_rows[i] <= b->out_rows[i - 1])) return b->T;
    return b->n_out;
}

/* Rows rows[0..n) of src (width floats each) to rows 0..n of dst (dst may be src: rows[i] >= i). */
static void pack_rows(float *dst, const float *src, size_t width, const int32_t *rows, int n) {
    for (int i = 0; i < n; i++)
        if (dst != src || rows[i] != i) memmove(dst + i * width, src + (size_t)rows[i] * width, width * sizeof(float));
}

/* Row i of buf to row rows[i], last first (rows[i] >= i: nothing is overwritten before it moves). */
static void unpack_rows(float *buf, size_t width, const int32_t *rows, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (rows[i] != i) memcpy(buf + (size_t)rows[i] * width, buf + (size_t)i * width, width * sizeof(float));
}

/* The separate steps in op_residual's order, each over the whole rows: the same roundings
 * as running them as ops one by one. */
static hearth_status cpu_residual(const op_step *s, const op_residual *r) {
    cpu_backend *c = cb(s);
    int T = s->b->T, H = s->dims->hidden;
    size_t n = (size_t)T * H;
    if (r->delta != OP_NONE) {
        float *d = buf(s, r->delta);
        if (r->delta_norm) ops_rmsnorm(d, d, r->delta_norm, r->shift, T, H, s->dims->norm_eps);
        if (r->delta_scale != 1.0f) ops_scale(d, r->delta_scale, n);
        ops_add(c->x, d, n);
    }
    if (r->x_scale != 1.0f) ops_scale(c->x, r->x_scale, n);
    if (r->w) ops_rmsnorm(c->xn, c->x, r->w, r->shift, T, H, s->dims->norm_eps);
    return HEARTH_OK;
}

static hearth_status cpu_norm(const op_step *s, op_buf b, const float *w, float shift) {
    float *x = buf(s, b);
    ops_rmsnorm(x, x, w, shift, s->b->T, s->dims->hidden, s->dims->norm_eps);
    return HEARTH_OK;
}

static void add_bias(float *y, const float *bias, int T, int n) {
    if (!bias) return;
    for (int t = 0; t < T; t++) ops_add(y + (size_t)t * n, bias, (size_t)n);
}

/* This layer's head_dim and KV heads (varied layers differ), else the model's. */
static int attn_head_dim(const op_step *s, const op_attn *a) { return a->head_dim ? a->head_dim : s->dims->head_dim; }
static int attn_kv_heads(const op_step *s, const op_attn *a) {
    return a->n_kv_heads ? a->n_kv_heads : s->dims->n_kv_heads;
}

static hearth_status cpu_qkv_rope_store(const op_step *s, int layer, const op_attn *a) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    int T = s->b->T, hd = attn_head_dim(s, a), nkv = attn_kv_heads(s, a), qd = d->n_heads * hd, kd = nkv * hd;
    const op_weight *qkv[] = {a->q, a->k, a->v};
    float *const qkv_out[] = {c->q, c->k, c->v};
    /* a layer that shares another's keys and values computes its queries only; without v
     * (attention_k_eq_v) the values are the keys as projected */
    hearth_status st = matmul_layer(s, a->layer, a->shared ? 1 : a->v ? 3 : 2, qkv, qkv_out, c->xn, T);
    if (st) return st;
    /* adapters update the projections they have before their biases (the q projection is
     * doubled on gated attention) */
    for (int p = 0; p < (a->shared ? 1 : a->v ? 3 : 2); p++)
        op_lora_apply(s->b, a->layer, OP_PROJ_Q + p, c->xn, d->hidden, qkv_out[p], p ? kd : qd * (a->gated ? 2 : 1),
                      c->tp);
    if (!a->shared && !a->v) memcpy(c->v, c->k, (size_t)T * kd * sizeof(float));
    if (a->gated) /* per head [queries | gates] -> queries into q, gates into qgate */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < d->n_heads; h++) {
                const float *src = c->q + ((size_t)t * d->n_heads + h) * 2 * d->head_dim;
                memcpy(c->qgate + (size_t)t * qd + (size_t)h * d->head_dim, src + d->head_dim,
                       (size_t)d->head_dim * sizeof(float));
                memmove(c->q + (size_t)t * qd + (size_t)h * d->head_dim, src, (size_t)d->head_dim * sizeof(float));
            }
    int rot = a->rope_dims ? a->rope_dims : hd; /* partial RoPE: the first rot dims */
    add_bias(c->q, a->q_bias, T, qd);
    if (a->q_norm) ops_rmsnorm(c->q, c->q, a->q_norm, a->norm_shift, T * d->n_heads, hd, a->norm_eps);
    ops_rope_part(c->q, T, d->n_heads, hd, rot, s->b->pos, a->inv_freq, d->rope_adjacent);
    if (a->shared) return HEARTH_OK;
    add_bias(c->k, a->k_bias, T, kd);
    add_bias(c->v, a->v_bias, T, kd);
    if (a->k_norm) ops_rmsnorm(c->k, c->k, a->k_norm, a->norm_shift, T * nkv, hd, a->norm_eps);
    if (a->v_norm) ops_rmsnorm(c->v, c->v, NULL, 0.0f, T * nkv, hd, a->norm_eps);
    ops_rope_part(c->k, T, nkv, hd, rot, s->b->pos, a->inv_freq, d->rope_adjacent);
    for (int t = 0; t < T; t++) /* the new keys and values join the cache before attending */
        for (int h = 0; h < nkv; h++) {
            size_t off = (size_t)t * kd + (size_t)h * hd;
            kv_store(s->kv, layer, s->b->slot[t], s->b->pos[t], h, c->k + off, c->v + off);
        }
    return HEARTH_OK;
}

static hearth_status cpu_attention(const op_step *s, int layer, const op_attn *a) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    kv_cache view; /* the layer's own shape where layers differ (kv_layer_view) */
    int view_layer = kv_layer_view(s->kv, layer, &view);
    ops_attention_args args = {.kv = &view, .layer = view_layer, .q = c->q, .out = c->att, .T = s->b->T,
                               .n_heads = d->n_heads, .n_kv_heads = attn_kv_heads(s, a),
                               .head_dim = attn_head_dim(s, a), .pos = s->b->pos, .slot = s->b->slot,
                               .window = a->window, .scale = a->scale, .scratch = c->attn};
    ops_attention(&args, c->tp);
    if (a->gated) /* output * sigmoid(gate) */
        for (size_t i = 0, n = (size_t)s->b->T * d->n_heads * d->head_dim; i < n; i++)
            c->att[i] *= 1.0f / (1.0f + expf(-c->qgate[i]));
    /* the attention output is this layer's heads wide (wider on a varied model's full layers) */
    size_t width = (size_t)d->n_heads * attn_head_dim(s, a);
    int live = live_rows(s, a->layer);
    if (live < s->b->T) pack_rows(c->att, c->att, width, s->b->out_rows, live);
    hearth_status st = live ? matmul_layer(s, a->layer, 1, &a->o, &c->tmp, c->att, live) : HEARTH_OK;
    if (live < s->b->T) unpack_rows(c->tmp, (size_t)d->hidden, s->b->out_rows, live);
    else if (!st) op_lora_apply(s->b, a->layer, OP_PROJ_O, c->att, (int64_t)width, c->tmp, d->hidden, c->tp);
    return st;
}

static hearth_status cpu_mlp(const op_step *s, const op_mlp *m) {
    cpu_backend *c = cb(s);
    const op_weight *gate_up[] = {m->gate, m->up};
    float *const gate_up_out[] = {c->gate, c->up};
    int H = s->dims->hidden, F = m->ffn ? m->ffn : s->dims->ffn, T = live_rows(s, m->layer);
    const float *in = c->xn;
    if (T < s->b->T) { /* the live rows' inputs, packed into the logits' row buffer (free until then) */
        pack_rows(c->rows, c->xn, (size_t)H, s->b->out_rows, T);
        in = c->rows;
    }
    hearth_status st = T ? matmul_layer(s, m->layer, 2, gate_up, gate_up_out, in, T) : HEARTH_OK;
    if (st) return st;
    op_lora_apply(s->b, m->layer, OP_PROJ_GATE, c->xn, H, c->gate, F, c->tp); /* none where T < b->T */
    op_lora_apply(s->b, m->layer, OP_PROJ_UP, c->xn, H, c->up, F, c->tp);
    size_t n = (size_t)T * F;
    if (m->act == OP_ACT_SILU) ops_silu_mul(c->gate, c->up, n);
    else ops_gelu_tanh_mul(c->gate, c->up, n);
    if (T && (st = matmul_layer(s, m->layer, 1, &m->down, &c->tmp, c->gate, T))) return st;
    op_lora_apply(s->b, m->layer, OP_PROJ_DOWN, c->gate, F, c->tmp, H, c->tp);
    if (T < s->b->T) unpack_rows(c->tmp, (size_t)H, s->b->out_rows, T);
    return HEARTH_OK;
}

/* The experts of each token by the routing rule every backend shares (op_moe_route). */
static void moe_route(cpu_backend *c, const op_step *s, const op_moe *m) {
    int E = s->dims->n_experts, K = s->dims->top_k_experts;
    for (int t = 0; t < s->b->T; t++)
        op_moe_route(m, c->moe_logits + (size_t)t * E, E, K, c->moe_sel + (size_t)t * K, c->moe_w + (size_t)t * K);
}

/* tmp += sigmoid(shared_router · xn) * shared expert(xn), for every token (the router's
 * logits are spent by then: their buffer takes the gate values). */
static hearth_status moe_shared(const op_step *s, const op_moe *m) {
    cpu_backend *c = cb(s);
    int T = s->b->T, H = s->dims->hidden;
    const op_weight *gu[] = {m->shared_gate, m->shared_up};
    float *const gu_out[] = {c->gate, c->up};
    int SF = s->dims->shared_ffn;
    hearth_status st = matmul_fused(s, 2, gu, gu_out, c->xn);
    if (!st) st = matmul(s, m->shared_router, c->xn, T, c->moe_logits);
    if (st) return st;
    op_lora_apply(s->b, m->layer, OP_PROJ_SHARED_GATE, c->xn, H, c->gate, SF, c->tp);
    op_lora_apply(s->b, m->layer, OP_PROJ_SHARED_UP, c->xn, H, c->up, SF, c->tp);
    op_lora_apply(s->b, m->layer, OP_PROJ_SHARED_ROUTER, c->xn, H, c->moe_logits, 1, c->tp);
    ops_silu_mul(c->gate, c->up, (size_t)T * SF);
    if ((st = matmul(s, m->shared_down, c->gate, T, c->moe_out))) return st;
    op_lora_apply(s->b, m->layer, OP_PROJ_SHARED_DOWN, c->gate, SF, c->moe_out, H, c->tp);
    for (int t = 0; t < T; t++) {
        float g = 1.0f / (1.0f + expf(-c->moe_logits[t]));
        float *y = c->tmp + (size_t)t * H, *o = c->moe_out + (size_t)t * H;
        for (int h = 0; h < H; h++) y[h] += g * o[h];
    }
    return HEARTH_OK;
}

/* out = sum over each token's chosen experts of weight * down_e(act(gate_e x) * up_e x) for
 * the rows x (one per token): the tokens of one expert gathered into one matmul per weight,
 * their outputs added back. */
static hearth_status moe_experts(const op_step *s, const op_moe *m, const float *x, float *out) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    int T = s->b->T, H = d->hidden, E = d->n_experts, K = d->top_k_experts, F = d->moe_ffn;
    hearth_status st;
    memset(out, 0, (size_t)T * H * sizeof(float));
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (c->moe_sel[(size_t)t * K + k] == e) {
                    c->moe_tok[n] = t;
                    c->moe_tokw[n] = c->moe_w[(size_t)t * K + k];
                    memcpy(c->moe_x + (size_t)n * H, x + (size_t)t * H, (size_t)H * sizeof(float));
                    n++;
                }
        if (!n) continue;
        int64_t per = m->up ? F : 2 * (int64_t)F; /* gate rows per expert: with up after them when fused */
        op_weight g = op_weight_rows(m->gate, (int64_t)e * per, F),
                  u = m->up ? op_weight_rows(m->up, (int64_t)e * F, F) : op_weight_rows(m->gate, (int64_t)e * per + F, F),
                  dn = op_weight_rows(m->down, (int64_t)e * H, H);
        const op_weight *gu[] = {&g, &u};
        float *const gu_out[] = {c->moe_gate, c->moe_up};
        if ((st = cpu_matmul_fused(2, gu, gu_out, c->moe_x, n, c->mm, c->mm_size, c->tp, s->b->batch_invariant,
                                   s->err)))
            return st;
        op_lora_apply_expert(s->b, m->layer, OP_PROJ_EXP_GATE, e, c->moe_tok, n, c->moe_x, H, c->moe_gate, F, c->tp);
        op_lora_apply_expert(s->b, m->layer, OP_PROJ_EXP_UP, e, c->moe_tok, n, c->moe_x, H, c->moe_up, F, c->tp);
        if (m->act == OP_ACT_SILU) ops_silu_mul(c->moe_gate, c->moe_up, (size_t)n * F);
        else ops_gelu_tanh_mul(c->moe_gate, c->moe_up, (size_t)n * F);
        if ((st = matmul(s, &dn, c->moe_gate, n, c->moe_out))) return st;
        op_lora_apply_expert(s->b, m->layer, OP_PROJ_EXP_DOWN, e, c->moe_tok, n, c->moe_gate, F, c->moe_out, H, c->tp);
        for (int i = 0; i < n; i++) {
            float *y = out + (size_t)c->moe_tok[i] * H, *o = c->moe_out + (size_t)i * H, w = c->moe_tokw[i];
            for (int h = 0; h < H; h++) y[h] += o[h] * w;
        }
    }
    return m->shared_up ? moe_shared(s, m) : HEARTH_OK;
}

/* Journal rec's entry for the u-th token of its row in state layer l. */
static float *journal_entry(const cpu_backend *c, int rec, int l, int u) {
    const op_dims *d = c->dims;
    size_t E = ops_gdn_journal_floats(d->gdn_k_heads, d->gdn_v_heads, d->gdn_k_dim, d->gdn_v_dim);
    return c->journal + (((size_t)rec * d->n_state_layers + l) * KV_STATE_SPEC_TOKENS + u) * E;
}

/* A Gated DeltaNet layer's op arguments: the pool, its state layer and the heads' geometry. */
static ops_gdn_args gdn_geometry(const kv_cache *kv, int layer, const op_dims *d) {
    return (ops_gdn_args){.kv = kv,
                          .layer = layer,
                          .k_heads = d->gdn_k_heads,
                          .v_heads = d->gdn_v_heads,
                          .k_dim = d->gdn_k_dim,
                          .v_dim = d->gdn_v_dim,
                          .conv_k = d->gdn_conv,
                          .v_tiled = d->gdn_v_tiled};
}

static hearth_status cpu_gated_delta(const op_step *s, const op_gdn *g) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    if (!s->kv->state || g->state_layer < 0 || g->state_layer >= s->kv->state->n_layers)
        return err_set(s->err, HEARTH_ERR_INVALID, "cpu: state layer %d is not in the state pool", g->state_layer);
    const op_weight *ws[] = {g->qkv, g->z, g->b, g->a};
    float *const outs[] = {c->gdn_qkv, c->gdn_z, c->gdn_b, c->gdn_a};
    hearth_status st = matmul_fused(s, 4, ws, outs, c->xn);
    if (st) return st;
    for (int p = 0; p < 4; p++) /* LoRA on the in_proj projections (rows without adapters untouched) */
        op_lora_apply(s->b, g->layer, OP_PROJ_GDN_QKV + p, c->xn, d->hidden, outs[p], ws[p]->n, c->tp);
    /* the journaled rows' tokens (state_journal): their entries for this layer */
    int n_spec = s->kv->state->n_spec < KV_STATE_SPEC_MAX ? s->kv->state->n_spec : KV_STATE_SPEC_MAX, any = 0;
    int idx[KV_STATE_SPEC_MAX] = {0};
    for (int t = 0; t < s->b->T; t++) {
        c->jr_ptr[t] = NULL;
        for (int j = 0; j < n_spec; j++)
            if (c->jr_slot[j] >= 0 && c->jr_slot[j] == s->b->slot[t]) {
                if (idx[j] < KV_STATE_SPEC_TOKENS) c->jr_ptr[t] = journal_entry(c, j, g->state_layer, idx[j]);
                idx[j]++;
                any = 1;
            }
    }
    for (int j = 0; j < n_spec; j++) c->jr_count[j] = idx[j];
    ops_gdn_args args = gdn_geometry(s->kv, g->state_layer, d);
    args.T = s->b->T, args.pos = s->b->pos, args.slot = s->b->slot;
    args.conv = g->conv, args.A_log = g->A_log, args.dt_bias = g->dt_bias, args.norm = g->norm;
    args.norm_eps = g->norm_eps;
    args.qkv = c->gdn_qkv, args.z = c->gdn_z, args.a = c->gdn_a, args.b = c->gdn_b, args.y = c->gdn_y;
    args.journal = any ? c->jr_ptr : NULL;
    ops_gated_delta(&args, c->tp);
    st = matmul(s, g->out, c->gdn_y, s->b->T, c->tmp);
    if (!st) op_lora_apply(s->b, g->layer, OP_PROJ_GDN_OUT, c->gdn_y, g->out->k, c->tmp, d->hidden, c->tp);
    return st;
}

static hearth_status cpu_moe(const op_step *s, const op_moe *m) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    int T = s->b->T, H = d->hidden;
    int E = d->n_experts;
    if (!m->router_norm) {
        hearth_status st = matmul(s, m->router, c->xn, T, c->moe_logits);
        if (st) return st;
        op_lora_apply(s->b, m->layer, OP_PROJ_ROUTER, c->xn, H, c->moe_logits, E, c->tp);
        moe_route(c, s, m);
        return moe_experts(s, m, c->xn, c->tmp);
    }
    /* the normed form (router_norm): xn (free once the dense MLP has read it) holds the router's input, then the experts' */
    ops_rmsnorm(c->xn, c->x, m->router_norm, 0.0f, T, H, d->norm_eps);
    hearth_status st = matmul(s, m->router, c->xn, T, c->moe_logits);
    if (st) return st;
    op_lora_apply(s->b, m->layer, OP_PROJ_ROUTER, c->xn, H, c->moe_logits, E, c->tp);
    moe_route(c, s, m);
    ops_rmsnorm(c->xn, c->x, m->in_norm, 0.0f, T, H, d->norm_eps);
    if ((st = moe_experts(s, m, c->xn, c->moe_acc))) return st;
    ops_rmsnorm(c->moe_acc, c->moe_acc, m->out_norm, 0.0f, T, H, d->norm_eps);
    ops_add(c->tmp, c->moe_acc, (size_t)T * H);
    return HEARTH_OK;
}

static hearth_status cpu_logits(const op_step *s, const float *w, float shift, float div, const op_weight *lm_head) {
    cpu_backend *c = cb(s);
    const op_batch *b = s->b;
    int H = s->dims->hidden;
    /* the hidden rows go straight to the caller; logits rows via the normed copies */
    float *rows = s->out == OP_OUT_HIDDEN ? b->logits : c->rows;
    for (int i = 0; i < b->n_out; i++)
        memcpy(rows + (size_t)i * H, c->x + (size_t)b->out_rows[i] * H, (size_t)H * sizeof(float));
    ops_rmsnorm(rows, rows, w, shift, b->n_out, H, s->dims->norm_eps);
    if (b->hidden_out) ops_rmsnorm(b->hidden_out, c->x, w, shift, b->T, H, s->dims->norm_eps);
    if (s->out == OP_OUT_HIDDEN || b->n_out == 0) return HEARTH_OK;
    if (div != 1.0f) /* a division, not a product by 1/div: the reference's rounding */
        for (size_t i = 0; i < (size_t)b->n_out * H; i++) rows[i] /= div;
    hearth_status st = matmul(s, lm_head, rows, b->n_out, b->logits);
    /* the fast kernels' int8 activations move every logit a little: the largest, which decide
     * a greedy choice and carry nearly all the probability, are recomputed exactly (matmul.h) */
    return st ? st : cpu_matmul_rescore_top(lm_head, rows, b->n_out, b->logits, c->tp, s->err);
}

static hearth_status cpu_per_layer_inputs(const op_step *s, const op_per_layer_inputs *p) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    int T = s->b->T;
    size_t n = (size_t)T * d->n_layers * d->per_layer_dim;
    op_embed table = {.table = p->table, .scale = p->table_scale};
    hearth_status st = op_embed_rows(&table, s->b->tokens, T, p->vocab, c->pl_in, c->tp, s->err);
    if (!st) st = matmul(s, p->proj, c->x, T, c->pl_tmp);
    if (st) return st;
    ops_scale(c->pl_tmp, p->proj_scale, n);
    ops_rmsnorm(c->pl_tmp, c->pl_tmp, p->norm, 0.0f, T * d->n_layers, d->per_layer_dim, d->norm_eps);
    for (size_t i = 0; i < n; i++) c->pl_in[i] = (c->pl_tmp[i] + c->pl_in[i]) * p->input_scale;
    return HEARTH_OK;
}

static hearth_status cpu_per_layer_gate(const op_step *s, int layer, const op_per_layer_gate *g) {
    cpu_backend *c = cb(s);
    const op_dims *d = s->dims;
    int T = s->b->T, D = d->per_layer_dim;
    hearth_status st = matmul(s, g->gate, c->x, T, c->pl_tmp);
    if (st) return st;
    op_lora_apply(s->b, layer, OP_PROJ_PLE_GATE, c->x, d->hidden, c->pl_tmp, D, c->tp);
    for (int t = 0; t < T; t++)
        ops_gelu_tanh_mul(c->pl_tmp + (size_t)t * D, c->pl_in + ((size_t)t * d->n_layers + layer) * D, (size_t)D);
    if ((st = matmul(s, g->proj, c->pl_tmp, T, c->tmp))) return st;
    op_lora_apply(s->b, layer, OP_PROJ_PLE_PROJ, c->pl_tmp, D, c->tmp, d->hidden, c->tp);
    return HEARTH_OK;
}

static hearth_status cpu_softcap(const op_step *s, float cap) {
    if (s->out != OP_OUT_LOGITS) return HEARTH_OK;
    float *l = s->b->logits;
    ops_softcap(l, (size_t)s->b->n_out * s->dims->vocab, cap);
    return HEARTH_OK;
}

static hearth_status cpu_mtp_input(const op_step *s, const op_mtp *m) {
    cpu_backend *c = cb(s);
    int T = s->b->T, H = s->dims->hidden;
    if (!s->dims->mtp || !s->b->hidden_in)
        return err_set(s->err, HEARTH_ERR_INVALID, "cpu: a multi-token-prediction step without its hidden rows");
    for (int t = 0; t < T; t++) {
        float *row = c->mtp_in + (size_t)t * 2 * H;
        ops_rmsnorm(row, c->x + (size_t)t * H, m->norm_embed, m->shift, 1, H, s->dims->norm_eps);
        ops_rmsnorm(row + H, s->b->hidden_in + (size_t)t * H, m->norm_hidden, m->shift, 1, H, s->dims->norm_eps);
    }
    return matmul(s, m->fc, c->mtp_in, T, c->x);
}

static hearth_status cpu_step(op_backend *be, kv_cache *kv, const op_batch *b, const op_dims *dims,
                              const op_embed *embed, op_layers_fn layers, const void *ctx, op_out out, int32_t *ids,
                              hearth_error *err) {
    (void)ids;
    cpu_backend *c = (cpu_backend *)be;
    if (out == OP_OUT_IDS || out == OP_OUT_KEEP)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cpu: the logits of a step always come back to the host");
    hearth_status st = op_batch_check(b, kv, c->max_tokens, c->max_out, err);
    if (!st) st = op_embed_rows(embed, b->tokens, b->T, dims->vocab, c->x, c->tp, err);
    if (st) return st;
    op_step s = {.t = be->t, .be = be, .dims = dims, .kv = kv, .b = b, .out = out, .err = err};
    return layers(&s, ctx);
}

static hearth_status cpu_state_journal(op_backend *be, int rec, int slot, hearth_error *err) {
    cpu_backend *c = (cpu_backend *)be;
    if (rec < 0 || rec >= KV_STATE_SPEC_MAX || !c->journal)
        return err_set(err, HEARTH_ERR_INVALID, "cpu: no journal record %d", rec);
    c->jr_slot[rec] = slot, c->jr_count[rec] = 0;
    return HEARTH_OK;
}

static hearth_status cpu_state_replay(op_backend *be, kv_cache *kv, int slot, int rec, int n, hearth_error *err) {
    cpu_backend *c = (cpu_backend *)be;
    const op_dims *d = c->dims;
    if (rec < 0 || rec >= KV_STATE_SPEC_MAX || !c->journal || c->jr_slot[rec] != slot || n < 0 ||
        n > c->jr_count[rec] || n > KV_STATE_SPEC_TOKENS || !kv->state)
        return err_set(err, HEARTH_ERR_INVALID, "cpu: journal %d does not hold %d tokens of slot %d", rec, n, slot);
    float *entries[KV_STATE_SPEC_TOKENS];
    for (int l = 0; l < d->n_state_layers; l++) {
        for (int u = 0; u < n; u++) entries[u] = journal_entry(c, rec, l, u);
        ops_gdn_args a = gdn_geometry(kv, l, d);
        ops_gdn_replay(&a, slot, entries, n);
    }
    return HEARTH_OK;
}

static const op_table cpu_table = {.name = "cpu",
                                   .step = cpu_step,
                                   .residual = cpu_residual,
                                   .norm = cpu_norm,
                                   .qkv_rope_store = cpu_qkv_rope_store,
                                   .attention = cpu_attention,
                                   .mlp = cpu_mlp,
                                   .moe = cpu_moe,
                                   .gated_delta = cpu_gated_delta,
                                   .logits = cpu_logits,
                                   .per_layer_inputs = cpu_per_layer_inputs,
                                   .per_layer_gate = cpu_per_layer_gate,
                                   .softcap = cpu_softcap,
                                   .mtp_input = cpu_mtp_input,
                                   .kv_copy = NULL,
                                   .state_journal = cpu_state_journal,
                                   .state_replay = cpu_state_replay,
                                   .free = cpu_free};

hearth_status cpu_backend_create(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int n_threads,
                                 threadpool *tp, op_backend **out, hearth_error *err) {
    *out = NULL;
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    c->base.t = &cpu_table;
    c->tp = tp;
    size_t sizes[CPU_N_ACT];
    act_sizes(&om->dims, kv, max_tokens, max_out, n_threads, sizes);
    void **ptrs[CPU_N_ACT] = {
        (void **)&c->x,       (void **)&c->xn,       (void **)&c->q,       (void **)&c->k,
        (void **)&c->v,       (void **)&c->att,      (void **)&c->tmp,     (void **)&c->gate,
        (void **)&c->up,      (void **)&c->rows,     (void **)&c->attn,    (void **)&c->moe_logits,
        (void **)&c->moe_x,   (void **)&c->moe_gate, (void **)&c->moe_up,  (void **)&c->moe_out,
        (void **)&c->moe_w,   (void **)&c->moe_sel,  (void **)&c->moe_tok, (void **)&c->moe_tokw,
        (void **)&c->qgate,   (void **)&c->gdn_qkv,  (void **)&c->gdn_z,   (void **)&c->gdn_a,
        (void **)&c->gdn_b,   (void **)&c->gdn_y,    (void **)&c->pl_in,   (void **)&c->pl_tmp,
        (void **)&c->moe_acc, (void **)&c->journal,  (void **)&c->jr_ptr,  (void **)&c->mtp_in};
    int ok = 1;
    for (int i = 0; i < CPU_N_ACT; i++) {
        if (posix_memalign(ptrs[i], 64, sizes[i] * sizeof(float) + 64)) ok = 0;
        else memset(*ptrs[i], 0, sizes[i] * sizeof(float)); /* resident from the start */
    }
    c->mm_size = mm_scratch_need(om, max_tokens);
    if (ok && c->mm_size && posix_memalign(&c->mm, 64, c->mm_size)) ok = 0;
    else if (ok && c->mm_size) memset(c->mm, 0, c->mm_size); /* resident from the start: fit predicts it */
    c->max_tokens = max_tokens;
    c->max_out = max_out;
    c->dims = &om->dims;
    for (int j = 0; j < KV_STATE_SPEC_MAX; j++) c->jr_slot[j] = -1;
    if (!ok) {
        cpu_free(&c->base);
        return err_set(err, HEARTH_ERR_NOMEM, "cannot allocate scratch for %d tokens", max_tokens);
    }
    *out = &c->base;
    return HEARTH_OK;
}

hearth_status cpu_backend_fit_weight(op_backend *be, const op_weight *w, hearth_error *err) {
    cpu_backend *c = (cpu_backend *)be;
    size_t need = cpu_matmul_scratch_size(w, c->max_tokens);
    if (need <= c->mm_size) return HEARTH_OK;
    void *mm = NULL;
    if (posix_memalign(&mm, 64, need)) return err_set(err, HEARTH_ERR_NOMEM, "cannot allocate matmul scratch");
    memset(mm, 0, need);
    free(c->mm);
    c->mm = mm;
    c->mm_size = need;
    return HEARTH_OK;
}
