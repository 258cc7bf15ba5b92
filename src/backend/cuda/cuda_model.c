/* cuda_model.c: the op table (ops/ops.h) on an NVIDIA GPU. At start it uploads every item
 * of the model's op_model (weights in their device layout, norm vectors, RoPE tables) and
 * allocates the KV pool and every scratch buffer (sizes from cuda_plan.c); a step embeds
 * its tokens on the host, uploads them and runs the family's forward pass (model/) as op
 * calls, each one or a few kernel launches: eagerly, or for decode shapes through a CUDA
 * graph captured once per (T, n_out). Host-side C; no kernels, no family logic here. */
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_experts.h"
#include "backend/cuda/cuda_kv_rows.h"
#include "backend/cuda/cuda_lora_cache.h"
#include "backend/cuda/cuda_plan.h"
#include "base/err.h"
#include "kv/kv_state.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuda_matmul sends T <= 8 rows to the GEMV kernels (no cuBLAS, no workspace): those
 * steps have fixed launch shapes and are the ones worth a graph. */
#define GRAPH_MAX_T CUDA_GRAPH_MAX_T

/* The device copy of each item, found by the host address the forward pass passes to an
 * op (the op_weight, or the vector's floats): open addressing, sized at start. */
typedef struct dev_entry {
    const void *host;
    void *dev; /* cuda_weight * or float * */
} dev_entry;

typedef struct cuda_model {
    op_backend base;
    op_dims dims;
    cuda_weight *weights; /* one per matrix item */
    cuda_weight **experts; /* per stacked-experts item: one weight per slice (NULL: none) */
    int *n_slices;         /* and how many slices (op_item.experts) */
    cuda_experts *xp;      /* --expert-offload: the slices live on the host, used through this pool (NULL: resident) */
    /* per stacked-experts item, resident: a device table of its slices' data then scale
     * planes (a fused gate_up stack's gate slices first, then its up slices), found by the
     * slices' address in the map; NULL where a slice's format has no grouped GEMV */
    void **xtabs;
    int moe_dev;          /* every stack has its table: decode steps route and run the experts on the device */
    float **vecs;         /* one per vector item */
    int n_items;
    dev_entry *map;
    size_t map_cap;
    cuda_kv kv;
    cuda_gemm *gemm;
    int max_tokens, max_out;
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up, *rows, *logits; /* device scratch */
    float *att_split; /* decode attention's split-K partials (cuda_attention_split_floats) */
    void *att_stage;  /* prefill attention's bf16 keys and values (cuda_attention_stage_bytes; NULL: none) */
    float *pl_in, *pl_tmp; /* per-layer inputs [T, n_layers * per_layer_dim] and their working rows (NULL: none) */
    float *host_pl;        /* pinned: the per-layer table's rows of the step, made on the host */
    /* the per-layer table as the op first named it (pl_known): from then on each step makes
     * and queues its rows before the layers (pl_staged), so a decode graph holds only the
     * device part of cu_per_layer_inputs */
    op_per_layer_inputs pl_table;
    int pl_known, pl_staged;
    float *qgate;     /* gated attention: the doubled q projection (queries and gates per head) */
    float *gdn[5];    /* Gated DeltaNet: qkv, z, b, a, y of the step (cuda_gdn_args) */
    float *state;     /* hybrids: the device state pool, slots' records then snapshots' (kv_state.h) */
    cuda_rows_stage rows_stage; /* saved KV files: the host stage of cu_kv_rows (cuda_kv_rows.h) */
    size_t state_record; /* floats of one slot's (or snapshot's) records, every state layer */
    int32_t *run_last;   /* host scratch of cuda_gdn_runs, max_slots */
    int8_t *xq;       /* decode: the next GEMV's int8 activations, written by the fused norm / gate */
    float *xs;        /* and their (d, d * sum q) pairs per block of 32 (cuda_gemv_multi_q8) */
    int q8_ready;     /* 1 while xq / xs hold the quantized xn, 2 the quantized x (step-building state, host side) */
    size_t att_split_floats;
    int32_t *ints;      /* device: pos | slot | out_rows (| run_first | run_next), max_tokens each */
    float *host_x;      /* pinned: the step's embeddings, made on the host */
    /* multi-token prediction (op_batch.hidden_in / hidden_out): the step's hidden rows on the
     * device [max_tokens, hidden] and pinned on the host, and an MTP head's joined input
     * [max_tokens, 2 hidden] (the head's: planned, mtp_floats; a model's own hidden rows for
     * its head: made at the first step that asks) */
    float *hid_dev, *mtp_cat, *host_hid;
    threadpool *tp;     /* host threads for them (NULL: this thread) */
    int32_t *host_ints; /* pinned: staging for ints */
    int32_t *ids_dev;   /* device: greedy ids of the logits rows */
    int32_t *host_ids;  /* pinned: their copy on the host */
    /* decode steps (T <= GRAPH_MAX_T tokens, n_out <= T rows) replay a captured graph, one
     * per (T, n_out, greedy ids or not, adapters or not): the adapter kernels' shapes depend
     * on T alone and they read the step's row tables from fixed device buffers */
    cuda_graph *graphs[GRAPH_MAX_T + 1][GRAPH_MAX_T + 1][2][3];
    int graphs_off; /* a capture failed: every step eager from then on */
    /* this step is batch-invariant (deterministic mode): every matmul goes to the GEMV
     * kernels whatever T (a row's sums do not depend on how many rows share the launch;
     * cuBLAS's tiling does) and attention to the decode kernels */
    int invariant;
    int single_slot; /* this step's tokens are one sequence's (a prefill chunk) */
    /* and the fast tier may run its Gated DeltaNet layers' chunked delta rule: consecutive
     * positions, not exact, not batch-invariant, at least CUDA_GDN_CHUNK_MIN_T tokens (the
     * plan sized the gate rows for its scratch) */
    int gdn_chunked;
    op_layers_fn layers; /* the step's forward pass (the same for every step of a model) */
    const void *layers_ctx;
    cuda_plan plan; /* every buffer's size (cuda_plan.c: what hearth fit predicts) */
    /* mixture of experts (dims.n_experts > 0): router logits, the tokens of each expert in
     * expert order with their weights, an expert's input / gate / up / output rows; the
     * routing itself runs on the host (pinned copies) */
    float *moe_logits, *moe_w, *moe_x, *moe_gate, *moe_up, *moe_out, *moe_acc;
    int32_t *moe_rows, *moe_idx;                       /* moe_idx: the grouped form's tables (moe_grouped) */
    uint16_t *moe_xb, *moe_actb;                       /* the grouped form's bf16 inputs: xn, the gated product */
    float *host_moe_logits, *host_moe_w, *host_moe_tw; /* [T, E]; [T K] by expert; [T, K] by token */
    int32_t *host_moe_rows, *host_moe_sel;             /* [T K] by expert; [T, K] by token */
    int moe_grouped; /* moe_dev and every stack in a format cuda_moe_gemm takes: prefill steps take moe_grouped */
    /* LoRA / DoRA adapters: their device copies and the step's row tables; lora_step: this
     * step has rows with adapters (each adapted projection is then followed by the low-rank
     * update; decode shapes use graphs of their own), 2 when they run the grouped kernels
     * (cuda_lora_cache_grouped) */
    cuda_lora_cache *lora;
    int lora_step;
} cuda_model;

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        hearth_status s_ = (call);                                                                                     \
        if (s_) return s_;                                                                                             \
    } while (0)

static size_t map_slot(const cuda_model *cm, const void *host) {
    uintptr_t h = (uintptr_t)host;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cm->map_cap - 1);
}

static void map_put(cuda_model *cm, const void *host, void *dev) {
    size_t i = map_slot(cm, host);
    while (cm->map[i].host && cm->map[i].host != host) i = (i + 1) & (cm->map_cap - 1);
    cm->map[i] = (dev_entry){host, dev};
}

static void *map_get(const cuda_model *cm, const void *host) {
    if (!host) return NULL;
    for (size_t i = map_slot(cm, host); cm->map[i].host; i = (i + 1) & (cm->map_cap - 1))
        if (cm->map[i].host == host) return cm->map[i].dev;
    return NULL;
}

/* The device copies of what an op was passed (a pointer the model never listed in its
 * op_model is a bug in model/: NULL here, and the launch fails on it loudly). */
static const cuda_weight *dw(const cuda_model *cm, const op_weight *w) { return map_get(cm, w); }
static const float *dv(const cuda_model *cm, const float *v) { return map_get(cm, v); }

static const op_table cuda_table;

static cuda_model *cmod(const op_step *s) { return (cuda_model *)s->be; }

static float *dbuf(const cuda_model *cm, op_buf b) {
    return b == OP_X ? cm->x : b == OP_XN ? cm->xn : b == OP_TMP ? cm->tmp : NULL;
}

/* ys[g] += the step's adapter updates of projections p, p + 1, ... (np of them, all reading
 * x [T, k]; ys[g] [T, ns[g]] their outputs before any bias) of model layer `layer`; nothing
 * in steps without adapters. */
static hearth_status lora_group(const op_step *s, int layer, op_proj p, int np, const float *x, int64_t k,
                                float *const *ys, const int64_t *ns) {
    cuda_model *cm = cmod(s);
    if (!cm->lora_step) return HEARTH_OK;
    return cuda_lora_cache_apply(cm->lora, s->b->T, layer, p, np, x, k, ys, ns, cm->plan.gemm_exact, s->err);
}

/* The same for one projection p: y [T, n]. */
static hearth_status lora(const op_step *s, int layer, op_proj p, const float *x, int64_t k, float *y, int64_t n) {
    return lora_group(s, layer, p, 1, x, k, &y, &n);
}

/* The device table of stacked item i's resident slices (cuda_model.xtabs), when every slice
 * takes the grouped GEMV and all share one layout; none otherwise. */
static hearth_status expert_table(cuda_model *cm, int i, hearth_error *err) {
    const cuda_weight *w = cm->experts[i];
    int n = cm->n_slices[i], E = cm->dims.n_experts, fused = n == 2 * E;
    for (int e = 0; e < n; e++)
        if (!cuda_gemv_experts_takes(&w[e]) || w[e].dtype != w[0].dtype || w[e].n != w[0].n || w[e].k != w[0].k ||
            w[e].group_size != w[0].group_size || w[e].aff_bits != w[0].aff_bits || w[e].sb_bf16 != w[0].sb_bf16 ||
            w[e].mlx_tiled != w[0].mlx_tiled || w[e].q4k_packed != w[0].q4k_packed || !w[e].scales != !w[0].scales)
            return HEARTH_OK;
    const void **host = malloc((size_t)n * 2 * sizeof *host);
    if (!host) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    for (int j = 0; j < n; j++) { /* fused: table entry j < E is expert j's gate (slice 2j), then the ups */
        int e = fused ? (j < E ? 2 * j : 2 * (j - E) + 1) : j;
        host[j] = w[e].data;
        host[n + j] = w[e].scales;
    }
    hearth_status st = cuda_alloc(&cm->xtabs[i], (size_t)n * 2 * sizeof *host, "expert table", err);
    if (!st) st = cuda_upload(cm->xtabs[i], host, (size_t)n * 2 * sizeof *host, err);
    free(host);
    if (!st) map_put(cm, w, cm->xtabs[i]);
    return st;
}

/* Uploads item i: a weight in its device layout, or a vector of floats. */
/* Once w's device copy is made: its host pages leave the process where the load mapped them
 * (op_model.release_host; the page cache keeps them, a host read faults them back). */
static void release_host(const op_model *om, const op_weight *w) {
    if (!om->release_host || !w->data) return;
    om->release_host(om->release_ctx, w->data, (size_t)w->n * (size_t)op_weight_row_bytes(w));
    size_t sb = op_weight_sb_bytes(w);
    if (w->scales) om->release_host(om->release_ctx, w->scales, sb);
    if (w->biases) om->release_host(om->release_ctx, w->biases, sb);
}

static hearth_status upload_item(cuda_model *cm, const op_model *om, const op_item *it, int i, hearth_error *err) {
    char what[64];
    if (it->host_only) return HEARTH_OK; /* read on the host (op_embed_rows), never on the device */
    if (it->layer >= 0) snprintf(what, sizeof what, "layer %d %s", it->layer, it->name ? it->name : "?");
    else snprintf(what, sizeof what, "%s", it->name ? it->name : "?");
    if (it->w && it->experts > 0) { /* one device weight per expert: every layout slices so */
        int64_t rows = it->w->n / it->experts;
        if (rows * it->experts != it->w->n)
            return err_set(err, HEARTH_ERR_FORMAT, "cuda: %s: %lld rows do not split into %d experts", what,
                           (long long)it->w->n, it->experts);
        if (!(cm->experts[i] = calloc((size_t)it->experts, sizeof **cm->experts)))
            return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
        cm->n_slices[i] = it->experts;
        if (cm->xp) TRY(cuda_experts_register(cm->xp, cm->experts[i], it->experts, err));
        for (int e = 0; e < it->experts; e++) {
            int expanded = 0;
            op_weight slice = op_weight_rows(it->w, (int64_t)e * rows, rows);
            cuda_weight *d = &cm->experts[i][e];
            TRY(cuda_weight_upload_any_mt(d, &slice, what, &expanded, cm->tp, err));
            if (d->dtype == DT_AFFINE) d->aff_f32act = cm->plan.gemm_exact;
            if (cm->xp) { /* to pinned host memory now, so the device holds at most one slice besides the pool */
                size_t data, scales;
                cuda_weight_layout(&slice, &data, &scales);
                TRY(cuda_experts_offload(cm->xp, d, data, scales, what, err));
            }
            release_host(om, &slice);
        }
        map_put(cm, it->w, cm->experts[i]);
        return cm->xp ? HEARTH_OK : expert_table(cm, i, err);
    }
    if (it->w) {
        int expanded = 0; /* counted by the plan (cuda_weight_layout) */
        cuda_weight *d = &cm->weights[i];
        TRY(cuda_weight_upload_any_mt(d, it->w, what, &expanded, cm->tp, err));
        /* the exact tier keeps the generic affine GEMV on float activations: the f32
         * expansion it replaced was exact there, and the tiny models' greedy parity with
         * the CPU reference (tests/parity/test_cuda_device.py) holds only so */
        if (d->dtype == DT_AFFINE) d->aff_f32act = cm->plan.gemm_exact;
        map_put(cm, it->w, d);
        release_host(om, it->w);
        return HEARTH_OK;
    }
    if (!it->vec) return err_set(err, HEARTH_ERR_INVALID, "cuda: %s has no data (a planned model, not a loaded one)", what);
    TRY(cuda_alloc((void **)&cm->vecs[i], (size_t)it->n * sizeof(float), what, err));
    TRY(cuda_upload(cm->vecs[i], it->vec, (size_t)it->n * sizeof(float), err));
    map_put(cm, it->vec, cm->vecs[i]);
    return HEARTH_OK;
}

/* Whether the fused multi-weight GEMV takes these weights at T rows: decode-sized T (or a
 * batch-invariant step), unless they are all F16 / BF16 at 2..8 rows, which cuBLAS reads
 * once as stored (cuda_matmul_small_direct) while the GEMV pays its dot products per row. */
static int multi_gemv(const cuda_model *cm, const cuda_weight *const *ws, int n, int T) {
    if (cm->invariant) return 1;
    if (T > GRAPH_MAX_T) return 0;
    for (int i = 0; i < n; i++)
        if (!cuda_matmul_small_direct(cm->gemm, ws[i], T)) return 1;
    return 0;
}

/* y = x · W^T: cuBLAS for prefill-sized T, except in a batch-invariant step. */
static hearth_status matmul(cuda_model *cm, const cuda_weight *w, const float *x, int T, float *y, hearth_error *err) {
    return cm->invariant ? cuda_gemv(w, x, T, y, err) : cuda_matmul(cm->gemm, w, x, T, y, err);
}

/* ys[i] = x · ws[i]^T for weights that read one input: x converted for the GEMM once when
 * every weight takes the same prefill activation type (cuda_matmul_act), else a matmul each. */
static hearth_status matmul_shared(cuda_model *cm, const cuda_weight *const *ws, float *const *ys, int nw,
                                   const float *x, int T, hearth_error *err) {
    int act = cm->invariant ? CUDA_ACT_NONE : cuda_matmul_act(cm->gemm, ws[0], x, T);
    for (int i = 1; i < nw; i++)
        if (cuda_matmul_act(cm->gemm, ws[i], x, T) != act || ws[i]->k != ws[0]->k) act = CUDA_ACT_NONE;
    if (!act) {
        for (int i = 0; i < nw; i++) TRY(matmul(cm, ws[i], x, T, ys[i], err));
        return HEARTH_OK;
    }
    TRY(cuda_matmul_load_x(cm->gemm, act, x, T, ws[0]->k, err));
    for (int i = 0; i < nw; i++) TRY(cuda_matmul_loaded(cm->gemm, ws[i], act, T, ys[i], err));
    return HEARTH_OK;
}

/* ys[i] = the quantized xn (xq / xs) · ws[i]^T: the GEMVs in a batch-invariant step, else
 * the MMQ kernel for the weights it takes (cuda_mmq_takes: packed Q4_K at 5..64 rows). */
static hearth_status q8_matmul(cuda_model *cm, const cuda_weight *const *ws, float *const *ys, int nw, int T,
                               hearth_error *err) {
    if (cm->invariant) return cuda_gemv_multi_q8(ws, ys, nw, cm->xq, cm->xs, T, err);
    return cuda_matmul_q8(ws, ys, nw, cm->xq, cm->xs, T, err);
}

/* Weights that read one input, through the one-launch GEMV (from xn's int8 copy when the
 * norm made one) at decode sizes, else the GEMM with the input converted once. */
static hearth_status matmul_input(cuda_model *cm, const cuda_weight *const *ws, float *const *ys, int nw, int T,
                                  hearth_error *err) {
    if (!multi_gemv(cm, ws, nw, T)) return matmul_shared(cm, ws, ys, nw, cm->xn, T, err);
    if (cm->q8_ready == 1) return q8_matmul(cm, ws, ys, nw, T, err);
    return cuda_gemv_multi(ws, ys, nw, cm->xn, T, err);
}

/* Whether the decode GEMVs of ws (one input) take int8 activations that the kernel making
 * that input can write itself (cuda_add_rmsnorm_q8 / cuda_gated_q8). */
static int q8_fusable(const cuda_model *cm, const cuda_weight *const *ws, int nw, int T) {
    if (T > GRAPH_MAX_T || nw == 0 || !ws[0] || ws[0]->k % 32) return 0;
    for (int i = 0; i < nw; i++)
        if (!ws[i] || !cuda_gemv_int8_act(ws[i]) || ws[i]->k != ws[0]->k) return 0;
    return 1;
}

#define MAX_NEXT 4

/* op_residual in one launch; the int8 copy of xn (or, without a norm, of x) in xq too when
 * the weights that read it next take int8 activations (q8_ready says which). */
static hearth_status cu_residual(const op_step *s, const op_residual *r) {
    cuda_model *cm = cmod(s);
    const op_dims *c = s->dims;
    int T = s->b->T;
    const cuda_weight *ws[MAX_NEXT];
    int nw = r->n_next < MAX_NEXT ? r->n_next : 0;
    for (int i = 0; i < nw; i++) ws[i] = dw(cm, r->next[i]);
    int quant = q8_fusable(cm, ws, nw, T) && ws[0]->k == c->hidden;
    cuda_residual_args a = {.x = cm->x,
                            .delta = r->delta == OP_NONE ? NULL : dbuf(cm, r->delta),
                            .delta_norm = dv(cm, r->delta_norm),
                            .delta_scale = r->delta_scale,
                            .x_scale = r->x_scale,
                            .w = dv(cm, r->w),
                            .shift = r->shift,
                            .out = cm->xn,
                            .xq = quant ? cm->xq : NULL,
                            .xs = quant ? cm->xs : NULL,
                            .T = T,
                            .n = c->hidden,
                            .eps = c->norm_eps};
    if ((r->delta_norm && !a.delta_norm) || (r->w && !a.w))
        return err_set(s->err, HEARTH_ERR_INVALID, "cuda: a residual's norm weight has no device copy");
    cm->q8_ready = quant ? (r->w ? 1 : 2) : 0;
    return cuda_residual(&a, s->err);
}

static hearth_status cu_norm(const op_step *s, op_buf b, const float *w, float shift) {
    cuda_model *cm = cmod(s);
    float *x = dbuf(cm, b);
    return cuda_rmsnorm(x, x, dv(cm, w), shift, s->b->T, s->dims->hidden, s->dims->norm_eps, s->err);
}

static hearth_status cu_qkv_rope_store_varied(const op_step *s, int layer, const op_attn *a);

/* The heads' norms (hn), RoPE and the KV write: one launch where the heads are at most 256
 * wide (cuda_norm_rope_kv_write), else the norms' own launches first. q_only: a layer that
 * reads another layer's KV. */
static hearth_status norm_rope_kv_write(const cuda_kv *kv, int layer, cuda_model *cm, int T, int n_heads, int hd,
                                        int nkv, int adjacent, const op_attn *a, const cuda_head_norms *hn,
                                        int q_only, hearth_error *err) {
    const int32_t *pos = cm->ints, *slot = cm->ints + cm->max_tokens;
    if (hd > 256) { /* rows over 256 take the row kernels */
        if (hn->q) TRY(cuda_rmsnorm_heads(cm->q, cm->q, hn->q, hn->shift, T * n_heads, hd, hn->eps, err));
        if (!q_only && hn->k) TRY(cuda_rmsnorm_heads(cm->k, cm->k, hn->k, hn->shift, T * nkv, hd, hn->eps, err));
        if (!q_only && hn->v) TRY(cuda_rmsnorm_plain(cm->v, T * nkv, hd, hn->eps, err));
        if (q_only) return cuda_rope(cm->q, T, n_heads, hd, pos, dv(cm, a->inv_freq), adjacent, err);
        return cuda_rope_kv_write(kv, layer, cm->q, cm->k, cm->v, T, n_heads, pos, slot, dv(cm, a->inv_freq),
                                  adjacent, a->rope_dims, err);
    }
    return cuda_norm_rope_kv_write(kv, layer, cm->q, cm->k, cm->v, T, n_heads, pos, slot, dv(cm, a->inv_freq),
                                   adjacent, q_only ? 0 : a->rope_dims, hn, q_only, err);
}

/* in: xn; out: q, and the layer's keys and values in the pool (RoPE and the KV write in
 * one launch). */
static hearth_status cu_qkv_rope_store(const op_step *s, int layer, const op_attn *a) {
    cuda_model *cm = cmod(s);
    const op_dims *c = s->dims;
    hearth_error *err = s->err;
    if (c->varied_layers) return cu_qkv_rope_store_varied(s, layer, a);
    int T = s->b->T, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    const cuda_weight *ws[3] = {dw(cm, a->q), dw(cm, a->k), dw(cm, a->v)};
    float *ys[3] = {a->gated ? cm->qgate : cm->q, cm->k, cm->v};
    TRY(matmul_input(cm, ws, ys, 3, T, err));
    /* adapters update the projections before their biases (q doubled on gated attention) */
    const int64_t ns[3] = {(int64_t)qd * (a->gated ? 2 : 1), kd, kd};
    TRY(lora_group(s, a->layer, OP_PROJ_Q, 3, cm->xn, c->hidden, ys, ns));
    if (a->gated) TRY(cuda_attn_gate_split(cm->qgate, cm->q, T, c->n_heads, c->head_dim, err));
    TRY(cuda_add_bias(cm->q, dv(cm, a->q_bias), T, qd, err));
    TRY(cuda_add_bias(cm->k, dv(cm, a->k_bias), T, kd, err));
    TRY(cuda_add_bias(cm->v, dv(cm, a->v_bias), T, kd, err));
    cuda_head_norms hn = {.q = dv(cm, a->q_norm), .k = dv(cm, a->k_norm), .shift = a->norm_shift, .eps = a->norm_eps};
    return norm_rope_kv_write(&cm->kv, layer, cm, T, c->n_heads, c->head_dim, c->n_kv_heads, c->rope_adjacent, a, &hn, 0,
                              err);
}

/* in: q; out: tmp = o · attention. At decode sizes the split merge writes o's int8
 * activations itself (no quantizer launch; the qkv GEMV that read xq has finished). */
static hearth_status cu_attention(const op_step *s, int layer, const op_attn *a) {
    cuda_model *cm = cmod(s);
    const op_dims *c = s->dims;
    int T = s->b->T;
    cuda_kv view; /* the layer's own shape where layers differ (cuda_kv_layer_view) */
    int view_layer = cuda_kv_layer_view(&cm->kv, layer, &view);
    cuda_attention_args args = {.kv = &view,
                                .layer = view_layer,
                                .q = cm->q,
                                .out = cm->att,
                                .T = T,
                                .n_heads = c->n_heads,
                                .n_kv_heads = view.n_kv_heads,
                                .head_dim = view.head_dim,
                                .pos = cm->ints,
                                .slot = cm->ints + cm->max_tokens,
                                .window = a->window,
                                .scale = a->scale,
                                .single_slot = cm->single_slot,
                                .split_scratch = cm->att_split,
                                .split_scratch_floats = cm->att_split_floats,
                                .stage = cm->att_stage,
                                .stage_bytes = cm->plan.att_stage_bytes,
                                .batch_invariant = cm->invariant,
                                .exact_f32 = cm->plan.gemm_exact,
                                /* eager steps only: host_ints is the step's pinned copy of slot */
                                .host_slot = T > GRAPH_MAX_T && !cm->single_slot ? cm->host_ints + cm->max_tokens : NULL};
    const cuda_weight *o = dw(cm, a->o);
    if (!a->gated && q8_fusable(cm, &o, 1, T)) { /* gated: the gates apply to the float output first */
        args.out_xq = cm->xq, args.out_xs = cm->xs;
        cm->q8_ready = 0; /* xq no longer holds xn's copy */
    }
    TRY(cuda_attention(&args, s->err));
    if (a->gated) TRY(cuda_attn_gate_apply(cm->att, cm->qgate, T, c->n_heads, c->head_dim, s->err));
    /* the merge that writes o's int8 activations writes att as floats too: the adapters' input */
    if (cuda_attention_writes_q8(&args)) TRY(q8_matmul(cm, &o, &cm->tmp, 1, T, s->err));
    else TRY(matmul(cm, o, cm->att, T, cm->tmp, s->err));
    /* the attention output is this layer's heads wide (wider on a varied model's full layers) */
    return lora(s, a->layer, OP_PROJ_O, cm->att, (int64_t)c->n_heads * view.head_dim, cm->tmp, c->hidden);
}

/* in: xn; out: tmp = down(act(gate(xn)) * up(xn)). */
static hearth_status cu_mlp(const op_step *s, const op_mlp *m) {
    cuda_model *cm = cmod(s);
    hearth_error *err = s->err;
    int T = s->b->T, gelu = m->act == OP_ACT_GELU_TANH;
    int H = s->dims->hidden, F = m->ffn ? m->ffn : s->dims->ffn; /* this layer's width (varied layers differ) */
    size_t n = (size_t)T * F;
    const cuda_weight *ws[2] = {dw(cm, m->gate), dw(cm, m->up)};
    float *ys[2] = {cm->gate, cm->up};
    TRY(matmul_input(cm, ws, ys, 2, T, err));
    const int64_t fs[2] = {F, F};
    TRY(lora_group(s, m->layer, OP_PROJ_GATE, 2, cm->xn, H, ys, fs));
    const cuda_weight *down = dw(cm, m->down);
    if (q8_fusable(cm, &down, 1, T)) { /* the gate writes down's int8 activations itself (and the product to gate) */
        TRY(cuda_gated_q8(cm->gate, cm->up, n, gelu, cm->xq, cm->xs, err));
        TRY(q8_matmul(cm, &down, &cm->tmp, 1, T, err));
        return lora(s, m->layer, OP_PROJ_DOWN, cm->gate, F, cm->tmp, H);
    }
    int act = cm->invariant ? CUDA_ACT_NONE : cuda_matmul_act(cm->gemm, down, cm->gate, T);
    if (act) { /* prefill: the gated product goes to the GEMM's input type directly */
        TRY(cuda_matmul_load_gated(cm->gemm, act, cm->gate, cm->up, T, down->k, gelu, err));
        TRY(cuda_matmul_loaded(cm->gemm, down, act, T, cm->tmp, err));
        if (!cm->lora_step) return HEARTH_OK;
        /* the adapters' input: the same product as floats (gate is free once the GEMM read it) */
        TRY(gelu ? cuda_gelu_tanh_mul(cm->gate, cm->up, n, err) : cuda_silu_mul(cm->gate, cm->up, n, err));
        return lora(s, m->layer, OP_PROJ_DOWN, cm->gate, F, cm->tmp, H);
    }
    TRY(gelu ? cuda_gelu_tanh_mul(cm->gate, cm->up, n, err) : cuda_silu_mul(cm->gate, cm->up, n, err));
    TRY(matmul(cm, down, cm->gate, T, cm->tmp, err));
    return lora(s, m->layer, OP_PROJ_DOWN, cm->gate, F, cm->tmp, H);
}

/* out = the sum over each token's chosen experts (host_moe_sel / host_moe_tw, [T, K]) of
 * weight * down_e(act(gate_e x) * up_e x) for the rows x: each expert's tokens gathered
 * into one matmul per weight, its output rows added back in expert order (the CPU
 * backend's order: one rounding for each product and each sum). */
static hearth_status moe_shared(cuda_model *cm, const op_step *s, const op_moe *m, const float *x, float *out);

/* The routed experts' adapter pairs (op_lora.experts) on expert e's gathered rows (rows: their step rows, on the
 * device). */
static hearth_status lora_expert(cuda_model *cm, const op_step *s, int layer, op_proj p, int e, const int32_t *rows,
                                 int n, const float *x, int64_t k, float *y, int64_t n_out) {
    if (!cm->lora_step || !op_batch_adapts(s->b, layer, p)) return HEARTH_OK;
    return cuda_lora_cache_apply_rows(cm->lora, rows, n, layer, p, e, x, k, y, n_out, cm->plan.gemm_exact, s->err);
}

/* Whether any row's adapters update the routed experts of layer `layer` (-1: of any layer of
 * n_layers): cu_moe then routes that layer on the host, and the step runs without a graph. */
static int expert_adapters(const op_batch *b, int layer, int n_layers) {
    for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? n_layers : layer + 1); l++)
        for (int p = OP_PROJ_EXP_GATE; p <= OP_PROJ_EXP_DOWN; p++)
            if (op_batch_adapts(b, l, (op_proj)p)) return 1;
    return 0;
}

static hearth_status moe_experts(cuda_model *cm, const op_step *s, const op_moe *m, const float *x, float *out) {
    const op_dims *d = s->dims;
    hearth_error *err = s->err;
    int T = s->b->T, H = d->hidden, E = d->n_experts, K = d->top_k_experts, F = d->moe_ffn;
    const cuda_weight *g = dw(cm, m->gate), *u = m->up ? dw(cm, m->up) : NULL, *dn = dw(cm, m->down);
    if (!g || (m->up && !u) || !dn)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a mixture-of-experts layer without its device weights");
    /* the (token, weight) pairs ordered by expert, tokens ascending within one */
    int count[E + 1], start[E + 1];
    for (int e = 0; e <= E; e++) count[e] = 0;
    for (int i = 0; i < T * K; i++) count[cm->host_moe_sel[i]]++;
    start[0] = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + count[e];
    for (int e = 0; e < E; e++) count[e] = start[e];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = cm->host_moe_sel[(size_t)t * K + k], at = count[e]++;
            cm->host_moe_rows[at] = t;
            cm->host_moe_w[at] = cm->host_moe_tw[(size_t)t * K + k];
        }
    TRY(cuda_upload_async(cm->moe_rows, cm->host_moe_rows, (size_t)T * K * sizeof(int32_t), err));
    TRY(cuda_upload_async(cm->moe_w, cm->host_moe_w, (size_t)T * K * sizeof(float), err));
    TRY(cuda_zero(out, (size_t)T * H, err));
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        if (!n) continue;
        const int32_t *rows = cm->moe_rows + start[e];
        /* a fused gate_up stack (up NULL) was uploaded as 2E slices: expert e's gate, then its up */
        const cuda_weight *ge = u ? &g[e] : &g[2 * e], *ue = u ? &u[e] : &g[2 * e + 1], *de = &dn[e];
        cuda_weight slot[3]; /* offloaded: the three slices' copies in the pool (queued on the stream) */
        if (cm->xp) {
            TRY(cuda_experts_use(cm->xp, ge, &slot[0], err));
            TRY(cuda_experts_use(cm->xp, ue, &slot[1], err));
            TRY(cuda_experts_use(cm->xp, de, &slot[2], err));
            ge = &slot[0], ue = &slot[1], de = &slot[2];
        }
        TRY(cuda_gather_rows(cm->moe_x, x, rows, n, H, err));
        TRY(matmul(cm, ge, cm->moe_x, n, cm->moe_gate, err));
        TRY(matmul(cm, ue, cm->moe_x, n, cm->moe_up, err));
        TRY(lora_expert(cm, s, m->layer, OP_PROJ_EXP_GATE, e, rows, n, cm->moe_x, H, cm->moe_gate, F));
        TRY(lora_expert(cm, s, m->layer, OP_PROJ_EXP_UP, e, rows, n, cm->moe_x, H, cm->moe_up, F));
        TRY(m->act == OP_ACT_SILU ? cuda_silu_mul(cm->moe_gate, cm->moe_up, (size_t)n * F, err)
                                  : cuda_gelu_tanh_mul(cm->moe_gate, cm->moe_up, (size_t)n * F, err));
        TRY(matmul(cm, de, cm->moe_gate, n, cm->moe_out, err));
        TRY(lora_expert(cm, s, m->layer, OP_PROJ_EXP_DOWN, e, rows, n, cm->moe_gate, F, cm->moe_out, H));
        TRY(cuda_scatter_add_rows(out, cm->moe_out, rows, cm->moe_w + start[e], n, H, err));
    }
    return moe_shared(cm, s, m, x, out);
}

/* out += the shared expert (none: nothing): sigmoid(shared_router · x) * down(silu(gate x) * up x). */
static hearth_status moe_shared(cuda_model *cm, const op_step *s, const op_moe *m, const float *x, float *out) {
    const op_dims *d = s->dims;
    hearth_error *err = s->err;
    int T = s->b->T, H = d->hidden;
    if (!m->shared_up) return HEARTH_OK;
    const cuda_weight *sg = dw(cm, m->shared_gate), *su = dw(cm, m->shared_up), *sd = dw(cm, m->shared_down),
                      *sr = dw(cm, m->shared_router);
    if (!sg || !su || !sd || !sr)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a shared expert without its device weights");
    size_t n = (size_t)T * d->shared_ffn;
    TRY(matmul(cm, sg, x, T, cm->moe_gate, err));
    TRY(matmul(cm, su, x, T, cm->moe_up, err));
    TRY(matmul(cm, sr, x, T, cm->moe_logits, err));
    float *ys[2] = {cm->moe_gate, cm->moe_up};
    int64_t ns[2] = {d->shared_ffn, d->shared_ffn};
    TRY(lora_group(s, m->layer, OP_PROJ_SHARED_GATE, 2, x, H, ys, ns));
    TRY(lora(s, m->layer, OP_PROJ_SHARED_ROUTER, x, H, cm->moe_logits, 1));
    TRY(cuda_silu_mul(cm->moe_gate, cm->moe_up, n, err));
    TRY(matmul(cm, sd, cm->moe_gate, T, cm->moe_out, err));
    TRY(lora(s, m->layer, OP_PROJ_SHARED_DOWN, cm->moe_gate, d->shared_ffn, cm->moe_out, H));
    return cuda_add_sigmoid_scaled(out, cm->moe_out, cm->moe_logits, T, H, err);
}

/* The router's logits of rows x to the host and each token's experts by the rule every
 * backend shares (op_moe_route): a synchronisation mid-step, so MoE models run without
 * decode graphs. */
static hearth_status moe_route(cuda_model *cm, const op_step *s, const op_moe *m, const float *x) {
    const op_dims *d = s->dims;
    int T = s->b->T, E = d->n_experts, K = d->top_k_experts;
    const cuda_weight *router = dw(cm, m->router);
    if (!router || E <= 0 || K <= 0 || K > E)
        return err_set(s->err, HEARTH_ERR_INVALID, "cuda: a mixture-of-experts layer without its router");
    TRY(matmul(cm, router, x, T, cm->moe_logits, s->err));
    TRY(lora(s, m->layer, OP_PROJ_ROUTER, x, d->hidden, cm->moe_logits, E));
    TRY(cuda_download_async(cm->host_moe_logits, cm->moe_logits, (size_t)T * E * sizeof(float), s->err));
    TRY(cuda_stream_sync(s->err));
    for (int t = 0; t < T; t++)
        op_moe_route(m, cm->host_moe_logits + (size_t)t * E, E, K, cm->host_moe_sel + (size_t)t * K,
                     cm->host_moe_tw + (size_t)t * K);
    return HEARTH_OK;
}

/* The grouped-GEMV table of one expert stack (the slices of w; off: a fused stack's up half). */
static cuda_expert_table expert_tab(const cuda_model *cm, const cuda_weight *w, int n, int off) {
    const void *const *tab = map_get(cm, w);
    return (cuda_expert_table){
        .proto = &w[off ? 1 : 0], .data = tab + off, .scales = w[0].scales ? tab + n + off : NULL};
}

/* The gate and up tables of a stack pair, or of a fused gate_up stack (u NULL: its 2E
 * slices, each expert's gate then its up; the table lists the gates first). */
static void gate_up_tabs(const cuda_model *cm, const cuda_weight *g, const cuda_weight *u, int E,
                         cuda_expert_table gu[2]) {
    gu[0] = u ? expert_tab(cm, g, E, 0) : expert_tab(cm, g, 2 * E, 0);
    gu[1] = u ? expert_tab(cm, u, E, 0) : expert_tab(cm, g, 2 * E, E);
}

/* The device-routed form for decode steps (cm->moe_dev, T <= GRAPH_MAX_T, not batch-
 * invariant): the router's logits routed on the device (moe_rows / moe_w: each token's
 * experts and weights), the T K chosen (expert, token) pairs' gate and up GEMVs in one launch
 * through the slices' tables, their down GEMVs in another, the weighted sum: no host round
 * trip, so the step is a graph. The bits of moe_route and moe_experts: the same routing rule, the
 * same kernels per row, the same summation order. The router reads xn; in the normed form
 * xn then becomes the experts' input, rmsnorm(x) * in_norm. */
static hearth_status moe_device(cuda_model *cm, const op_step *s, const op_moe *m, float *out) {
    const op_dims *d = s->dims;
    hearth_error *err = s->err;
    int T = s->b->T, E = d->n_experts, K = d->top_k_experts, F = d->moe_ffn, P = T * K;
    const cuda_weight *router = dw(cm, m->router), *g = dw(cm, m->gate), *u = m->up ? dw(cm, m->up) : NULL,
                      *dn = dw(cm, m->down);
    if (!router || !g || (m->up && !u) || !dn)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a mixture-of-experts layer without its device weights");
    TRY(matmul(cm, router, cm->xn, T, cm->moe_logits, err));
    TRY(lora(s, m->layer, OP_PROJ_ROUTER, cm->xn, d->hidden, cm->moe_logits, E));
    TRY(cuda_moe_route(cm->moe_logits, T, E, K, m->router_norm != NULL, m->norm_topk,
                       m->router_norm ? dv(cm, m->expert_scale) : NULL, cm->moe_rows, cm->moe_w, err));
    if (m->router_norm) TRY(cuda_rmsnorm(cm->xn, cm->x, dv(cm, m->in_norm), 0.0f, T, d->hidden, d->norm_eps, err));
    cuda_expert_table gu[2];
    gate_up_tabs(cm, g, u, E, gu);
    float *ys[2] = {cm->moe_gate, cm->moe_up};
    if (gu[0].proto->dtype == gu[1].proto->dtype && gu[0].proto->k == gu[1].proto->k)
        TRY(cuda_gemv_experts(gu, 2, ys, cm->moe_rows, P, K, cm->xn, err));
    else
        for (int i = 0; i < 2; i++) TRY(cuda_gemv_experts(&gu[i], 1, &ys[i], cm->moe_rows, P, K, cm->xn, err));
    TRY(m->act == OP_ACT_SILU ? cuda_silu_mul(cm->moe_gate, cm->moe_up, (size_t)P * F, err)
                              : cuda_gelu_tanh_mul(cm->moe_gate, cm->moe_up, (size_t)P * F, err));
    cuda_expert_table down = expert_tab(cm, dn, E, 0);
    TRY(cuda_gemv_experts(&down, 1, &cm->moe_out, cm->moe_rows, P, 1, cm->moe_gate, err));
    TRY(cuda_moe_combine(out, cm->moe_out, cm->moe_w, T, K, d->hidden, err));
    return moe_shared(cm, s, m, cm->xn, out);
}

/* Tests: 0 keeps prefill steps on the per-expert form (moe_experts), 1 (the default) lets
 * them take the grouped form where it applies. */
static int g_moe_grouped = 1;
void cuda_model_force_moe_grouped(int on) { g_moe_grouped = on != 0; }

/* The grouped form for prefill steps (cm->moe_grouped, T > GRAPH_MAX_T, not batch-invariant,
 * fast tier), without the host: the router's logits routed on the device (moe_device's
 * kernel: moe_rows / moe_w, each token's experts and weights), then per run of at most
 * plan.moe_group_pairs pairs their tables (cuda_moe_sort: pairs by expert, segments),
 * every active expert's gate and up rows in one launch (cuda_moe_gemm on xn's bf16 copy,
 * gathered by token), the gated product in bf16, the downs in another launch (each row
 * written to its token's slot), and the weighted sum in expert order (cuda_moe_combine). The
 * router reads xn; in the normed form xn then becomes the experts' input. */
static hearth_status moe_grouped(cuda_model *cm, const op_step *s, const op_moe *m, float *out) {
    const op_dims *d = s->dims;
    hearth_error *err = s->err;
    int T = s->b->T, H = d->hidden, E = d->n_experts, K = d->top_k_experts, TOK = CUDA_MOE_GEMM_TOKENS;
    const cuda_weight *router = dw(cm, m->router), *g = dw(cm, m->gate), *u = m->up ? dw(cm, m->up) : NULL,
                      *dn = dw(cm, m->down);
    if (!router || !g || (m->up && !u) || !dn)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a mixture-of-experts layer without its device weights");
    int Tc = (int)(cm->plan.moe_group_pairs / (size_t)K), smax = Tc * K / TOK + E;
    if (Tc <= 0) return err_set(err, HEARTH_ERR_INVALID, "cuda: no room for the grouped experts");
    TRY(matmul(cm, router, cm->xn, T, cm->moe_logits, err));
    TRY(lora(s, m->layer, OP_PROJ_ROUTER, cm->xn, d->hidden, cm->moe_logits, E));
    TRY(cuda_moe_route(cm->moe_logits, T, E, K, m->router_norm != NULL, m->norm_topk,
                       m->router_norm ? dv(cm, m->expert_scale) : NULL, cm->moe_rows, cm->moe_w, err));
    if (m->router_norm) TRY(cuda_rmsnorm(cm->xn, cm->x, dv(cm, m->in_norm), 0.0f, T, H, d->norm_eps, err));
    cuda_expert_table gu[2], down = expert_tab(cm, dn, E, 0);
    gate_up_tabs(cm, g, u, E, gu);
    int together = gu[0].proto->dtype == gu[1].proto->dtype && gu[0].proto->n == gu[1].proto->n &&
                   gu[0].proto->k == gu[1].proto->k;
    int gelu = m->act != OP_ACT_SILU;
    /* each run's tables: rows and dst [P], segments [smax][3], their count */
    int32_t *rows = cm->moe_idx, *dst = rows + Tc * K, *segs = dst + Tc * K, *nseg = segs + 3 * smax;
    TRY(cuda_to_bf16(cm->xn, (size_t)T * H, cm->moe_xb, err)); /* the experts' input, once */
    for (int t0 = 0; t0 < T; t0 += Tc) {
        int n = T - t0 < Tc ? T - t0 : Tc, F = (int)gu[0].proto->n;
        TRY(cuda_moe_sort(cm->moe_rows + (size_t)t0 * K, n, K, E, TOK, rows, dst, segs, nseg, err));
        float *ys[2] = {cm->moe_gate, cm->moe_up};
        const uint16_t *xr = cm->moe_xb + (size_t)t0 * H;
        if (together) {
            TRY(cuda_moe_gemm(gu, 2, ys, NULL, segs, smax, nseg, xr, rows, err));
        } else {
            for (int i = 0; i < 2; i++) TRY(cuda_moe_gemm(&gu[i], 1, &ys[i], NULL, segs, smax, nseg, xr, rows, err));
        }
        TRY(cuda_gated_bf16(cm->moe_gate, cm->moe_up, (size_t)n * K * F, gelu, cm->moe_actb, err));
        TRY(cuda_moe_gemm(&down, 1, &cm->moe_out, dst, segs, smax, nseg, cm->moe_actb, NULL, err));
        TRY(cuda_moe_combine(out + (size_t)t0 * H, cm->moe_out, cm->moe_w + (size_t)t0 * K, n, K, H, err));
    }
    return moe_shared(cm, s, m, cm->xn, out);
}

/* tmp = the mixture-of-experts MLP of xn (plus the shared expert); the normed form (op_moe.router_norm): router
 * and experts read rmsnorm(x) with their own norms, and their normed sum is added to tmp. */
static hearth_status cu_moe(const op_step *s, const op_moe *m) {
    cuda_model *cm = cmod(s);
    const op_dims *d = s->dims;
    int T = s->b->T, H = d->hidden;
    /* adapters on the routed experts: the host-routed form, whose per-expert rows they update */
    int exp_lora = cm->lora_step && expert_adapters(s->b, m->layer, 0);
    int on_device = cm->moe_dev && T <= GRAPH_MAX_T && !cm->invariant && !exp_lora;
    int grouped = cm->moe_grouped && g_moe_grouped && T > GRAPH_MAX_T && !cm->invariant && !exp_lora;
    cm->q8_ready = 0;
    if (!m->router_norm) {
        if (on_device) return moe_device(cm, s, m, cm->tmp);
        if (grouped) return moe_grouped(cm, s, m, cm->tmp);
        TRY(moe_route(cm, s, m, cm->xn));
        return moe_experts(cm, s, m, cm->xn, cm->tmp);
    }
    /* xn (free once the dense MLP has read it) holds the router's input, then the experts' */
    TRY(cuda_rmsnorm(cm->xn, cm->x, dv(cm, m->router_norm), 0.0f, T, H, d->norm_eps, s->err));
    if (on_device) {
        TRY(moe_device(cm, s, m, cm->moe_acc));
    } else if (grouped) {
        TRY(moe_grouped(cm, s, m, cm->moe_acc));
    } else {
        TRY(moe_route(cm, s, m, cm->xn));
        TRY(cuda_rmsnorm(cm->xn, cm->x, dv(cm, m->in_norm), 0.0f, T, H, d->norm_eps, s->err));
        TRY(moe_experts(cm, s, m, cm->xn, cm->moe_acc));
    }
    TRY(cuda_rmsnorm(cm->moe_acc, cm->moe_acc, dv(cm, m->out_norm), 0.0f, T, H, d->norm_eps, s->err));
    return cuda_add(cm->tmp, cm->moe_acc, (size_t)T * H, s->err);
}

/* ---- Models whose layers differ (op_dims.varied_layers) ---- */

/* cu_qkv_rope_store for a layer of its own head_dim and KV heads (a->head_dim / n_kv_heads,
 * on its view of the pool), as cpu_qkv_rope_store does it: a shared-KV layer (a->shared)
 * computes and rotates its queries only; without v (attention_k_eq_v) the values are the
 * keys as projected, before their norm and RoPE; v_norm: the values RMS-normed without a
 * scale. */
static hearth_status cu_qkv_rope_store_varied(const op_step *s, int layer, const op_attn *a) {
    cuda_model *cm = cmod(s);
    const op_dims *c = s->dims;
    hearth_error *err = s->err;
    cuda_kv view;
    int view_layer = cuda_kv_layer_view(&cm->kv, layer, &view);
    int T = s->b->T, hd = view.head_dim, nkv = view.n_kv_heads, qd = c->n_heads * hd, kd = nkv * hd;
    if ((a->head_dim && a->head_dim != hd) || (a->n_kv_heads && a->n_kv_heads != nkv))
        return err_set(err, HEARTH_ERR_INVALID, "cuda: layer of head_dim %d x %d KV heads on KV layer %d of %d x %d",
                       a->head_dim, a->n_kv_heads, layer, hd, nkv);
    const cuda_weight *ws[3] = {dw(cm, a->q), dw(cm, a->k), dw(cm, a->v)};
    float *ys[3] = {cm->q, cm->k, cm->v};
    int np = a->shared ? 1 : a->v ? 3 : 2; /* the projections this layer has */
    TRY(matmul_input(cm, ws, ys, np, T, err));
    const int64_t ns[3] = {qd, kd, kd};
    TRY(lora_group(s, a->layer, OP_PROJ_Q, np, cm->xn, c->hidden, ys, ns)); /* before the biases */
    if (!a->shared && !a->v) TRY(cuda_copy_f32(cm->v, cm->k, (size_t)T * kd, err));
    TRY(cuda_add_bias(cm->q, dv(cm, a->q_bias), T, qd, err));
    cuda_head_norms hn = {.q = dv(cm, a->q_norm), .shift = a->norm_shift, .eps = a->norm_eps};
    if (a->shared) { /* queries only: RoPE on every pair (partial RoPE of a shared layer has no launch here) */
        if (a->rope_dims && a->rope_dims != hd)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: partial RoPE (%d of %d dims) on a shared-KV layer",
                           a->rope_dims, hd);
        return norm_rope_kv_write(&view, view_layer, cm, T, c->n_heads, hd, nkv, c->rope_adjacent, a, &hn, 1, err);
    }
    TRY(cuda_add_bias(cm->k, dv(cm, a->k_bias), T, kd, err));
    TRY(cuda_add_bias(cm->v, dv(cm, a->v_bias), T, kd, err));
    hn.k = dv(cm, a->k_norm), hn.v = a->v_norm;
    return norm_rope_kv_write(&view, view_layer, cm, T, c->n_heads, hd, nkv, c->rope_adjacent, a, &hn, 0, err);
}

/* The per-layer table's rows of b's tokens (times its scale) into pl_in: made on the host
 * with the scalar dequantizer, as the embeddings are, and queued for upload. */
static hearth_status stage_per_layer_rows(cuda_model *cm, const op_per_layer_inputs *p, const op_batch *b,
                                          const op_dims *d, hearth_error *err) {
    op_embed table = {.table = p->table, .scale = p->table_scale};
    TRY(op_embed_rows(&table, b->tokens, b->T, p->vocab, cm->host_pl, cm->tp, err));
    TRY(cuda_upload_async(cm->pl_in, cm->host_pl, (size_t)b->T * d->n_layers * d->per_layer_dim * sizeof(float), err));
    cm->pl_staged = 1;
    return HEARTH_OK;
}

/* The step's per-layer inputs (cpu_per_layer_inputs): the table's rows (staged by cu_step
 * before the layers once the table is known; the first step stages them here, eagerly),
 * then on the device the projection of x, its scale and norm, and the sum. */
static hearth_status cu_per_layer_inputs(const op_step *s, const op_per_layer_inputs *p) {
    cuda_model *cm = cmod(s);
    const op_dims *d = s->dims;
    int T = s->b->T;
    size_t n = (size_t)T * d->n_layers * d->per_layer_dim;
    if (!cm->pl_staged) { /* a step before the table was known: never inside a graph (cu_step) */
        cm->pl_table = *p;
        cm->pl_known = 1;
        TRY(stage_per_layer_rows(cm, p, s->b, d, s->err));
    }
    TRY(matmul(cm, dw(cm, p->proj), cm->x, T, cm->pl_tmp, s->err));
    TRY(cuda_scale(cm->pl_tmp, p->proj_scale, 0, n, s->err));
    TRY(cuda_rmsnorm(cm->pl_tmp, cm->pl_tmp, dv(cm, p->norm), 0.0f, T * d->n_layers, d->per_layer_dim, d->norm_eps,
                     s->err));
    return cuda_per_layer_combine(cm->pl_in, cm->pl_tmp, p->input_scale, n, s->err);
}

/* tmp = proj · (gelu_tanh(gate · x) * input[layer]) (cpu_per_layer_gate). */
static hearth_status cu_per_layer_gate(const op_step *s, int layer, const op_per_layer_gate *g) {
    cuda_model *cm = cmod(s);
    const op_dims *d = s->dims;
    int T = s->b->T, D = d->per_layer_dim;
    const cuda_weight *gate = dw(cm, g->gate), *proj = dw(cm, g->proj);
    /* x's int8 copy when the residual before made one for this gate (op_residual's next) */
    if (cm->q8_ready == 2 && q8_fusable(cm, &gate, 1, T)) TRY(q8_matmul(cm, &gate, &cm->pl_tmp, 1, T, s->err));
    else TRY(matmul(cm, gate, cm->x, T, cm->pl_tmp, s->err));
    cm->q8_ready = 0;
    TRY(lora(s, layer, OP_PROJ_PLE_GATE, cm->x, d->hidden, cm->pl_tmp, D));
    const float *in = cm->pl_in + (size_t)layer * D;
    size_t stride = (size_t)d->n_layers * D;
    if (!cm->lora_step && q8_fusable(cm, &proj, 1, T)) { /* the product writes proj's int8 input itself */
        TRY(cuda_gelu_tanh_mul_rows_q8(cm->pl_tmp, in, T, D, stride, cm->xq, cm->xs, s->err));
        return q8_matmul(cm, &proj, &cm->tmp, 1, T, s->err);
    }
    TRY(cuda_gelu_tanh_mul_rows(cm->pl_tmp, in, T, D, stride, s->err));
    TRY(matmul(cm, proj, cm->pl_tmp, T, cm->tmp, s->err));
    return lora(s, layer, OP_PROJ_PLE_PROJ, cm->pl_tmp, D, cm->tmp, d->hidden);
}

/* The hidden-row buffers (hid_dev, host_hid, mtp_cat), made at the first step that needs them
 * where the plan did not (a model's own rows for its head). */
static hearth_status hid_buffers(cuda_model *cm, hearth_error *err) {
    size_t n = (size_t)cm->max_tokens * cm->dims.hidden;
    if (!cm->hid_dev) TRY(cuda_alloc((void **)&cm->hid_dev, n * sizeof(float), "hidden rows", err));
    if (!cm->host_hid && cudaMallocHost((void **)&cm->host_hid, n * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        cm->host_hid = NULL;
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot pin %zu bytes for the hidden rows", n * sizeof(float));
    }
    if (cm->dims.mtp && !cm->mtp_cat) TRY(cuda_alloc((void **)&cm->mtp_cat, 2 * n * sizeof(float), "MTP input", err));
    return HEARTH_OK;
}

/* An MTP head's input (op_mtp, cpu_mtp_input): the normed embeddings and the normed hidden
 * rows side by side in mtp_cat, then x = fc · them. */
static hearth_status cu_mtp_input(const op_step *s, const op_mtp *m) {
    cuda_model *cm = cmod(s);
    const op_dims *d = s->dims;
    int T = s->b->T, H = d->hidden;
    size_t row = (size_t)H * sizeof(float);
    if (!cm->mtp_cat || !s->b->hidden_in)
        return err_set(s->err, HEARTH_ERR_INVALID, "cuda: a multi-token-prediction step without its hidden rows");
    TRY(cuda_rmsnorm(cm->tmp, cm->x, dv(cm, m->norm_embed), m->shift, T, H, d->norm_eps, s->err));
    TRY(cuda_copy_rows_2d(cm->mtp_cat, 2 * row, cm->tmp, row, row, (size_t)T, s->err));
    TRY(cuda_rmsnorm(cm->tmp, cm->hid_dev, dv(cm, m->norm_hidden), m->shift, T, H, d->norm_eps, s->err));
    TRY(cuda_copy_rows_2d(cm->mtp_cat + H, 2 * row, cm->tmp, row, row, (size_t)T, s->err));
    cm->q8_ready = 0;
    return matmul(cm, dw(cm, m->fc), cm->mtp_cat, T, cm->x, s->err);
}

/* logits = tanh(logits / cap) * cap for the rows cu_logits made (every output but hidden
 * rows: the host's, the device sampler's); greedy ids are taken again from the capped
 * logits, as the host would take them (tanh may round neighbouring logits to one value). */
static hearth_status cu_softcap(const op_step *s, float cap) {
    cuda_model *cm = cmod(s);
    int n_out = s->b->n_out, vocab = s->dims->vocab;
    if (n_out == 0 || s->out == OP_OUT_HIDDEN) return HEARTH_OK;
    TRY(cuda_softcap(cm->logits, cap, (size_t)n_out * vocab, s->err));
    return s->out == OP_OUT_IDS ? cuda_argmax_checked(cm->logits, n_out, vocab, cm->ids_dev, s->err) : HEARTH_OK;
}

/* in: xn; out: tmp = out · the Gated DeltaNet middle (cuda_gated_delta) of the in_proj
 * projections, each token on its sequence's device state record. */
static hearth_status cu_gated_delta(const op_step *s, const op_gdn *g) {
    cuda_model *cm = cmod(s);
    const op_dims *d = s->dims;
    int T = s->b->T;
    if (!cm->state || g->state_layer < 0 || g->state_layer >= d->n_state_layers)
        return err_set(s->err, HEARTH_ERR_INVALID, "cuda: state layer %d is not in the state pool", g->state_layer);
    const cuda_weight *ws[4] = {dw(cm, g->qkv), dw(cm, g->z), dw(cm, g->b), dw(cm, g->a)};
    float *ys[4] = {cm->gdn[0], cm->gdn[1], cm->gdn[2], cm->gdn[3]};
    /* the decode GEMV takes at most 3 weights per launch: qkv, z, b, then a */
    TRY(matmul_input(cm, ws, ys, 3, T, s->err));
    TRY(matmul_input(cm, ws + 3, ys + 3, 1, T, s->err));
    cm->q8_ready = 0;
    int64_t ns[4] = {g->qkv->n, g->z->n, g->b->n, g->a->n}; /* adapters on in_proj (groups of at most 3) */
    TRY(lora_group(s, g->layer, OP_PROJ_GDN_QKV, 3, cm->xn, d->hidden, ys, ns));
    TRY(lora(s, g->layer, OP_PROJ_GDN_A, cm->xn, d->hidden, ys[3], ns[3]));
    cuda_gdn_args args = {.state = cm->state,
                          .n_layers = d->n_state_layers,
                          .layer = g->state_layer,
                          .layer_floats = op_gdn_state_floats(d),
                          .T = T,
                          .pos = cm->ints,
                          .slot = cm->ints + cm->max_tokens,
                          .run_first = cm->ints + 3 * cm->max_tokens,
                          .run_next = cm->ints + 4 * cm->max_tokens,
                          .k_heads = d->gdn_k_heads,
                          .v_heads = d->gdn_v_heads,
                          .k_dim = d->gdn_k_dim,
                          .v_dim = d->gdn_v_dim,
                          .conv_k = d->gdn_conv,
                          .v_tiled = d->gdn_v_tiled,
                          .single_run = cm->single_slot,
                          .chunked = cm->gdn_chunked,
                          .scratch = cm->gate,
                          .conv = dv(cm, g->conv),
                          .A_log = dv(cm, g->A_log),
                          .dt_bias = dv(cm, g->dt_bias),
                          .norm = dv(cm, g->norm),
                          .norm_eps = g->norm_eps,
                          .qkv = cm->gdn[0],
                          .z = cm->gdn[1],
                          .b = cm->gdn[2],
                          .a = cm->gdn[3],
                          .y = cm->gdn[4]};
    TRY(cuda_gated_delta(&args, s->err));
    TRY(matmul(cm, dw(cm, g->out), cm->gdn[4], T, cm->tmp, s->err));
    return lora(s, g->layer, OP_PROJ_GDN_OUT, cm->gdn[4], g->out->k, cm->tmp, d->hidden);
}

/* The final norm of the out_rows and lm_head into logits (and, for greedy steps, the ids). */
static hearth_status cu_logits(const op_step *s, const float *w, float shift, float div, const op_weight *lm_head) {
    cuda_model *cm = cmod(s);
    const op_dims *c = s->dims;
    hearth_error *err = s->err;
    int n_out = s->b->n_out;
    cm->q8_ready = 0;
    if (s->b->hidden_out) /* every row's, for the model's MTP head (downloaded by cu_step) */
        TRY(cuda_rmsnorm(cm->hid_dev, cm->x, dv(cm, w), shift, s->b->T, c->hidden, c->norm_eps, err));
    if (n_out == 0) return HEARTH_OK;
    TRY(cuda_gather_rows(cm->rows, cm->x, cm->ints + 2 * cm->max_tokens, n_out, c->hidden, err));
    TRY(cuda_rmsnorm(cm->rows, cm->rows, dv(cm, w), shift, n_out, c->hidden, c->norm_eps, err));
    if (s->out == OP_OUT_HIDDEN) return HEARTH_OK;
    if (div != 1.0f) TRY(cuda_scale(cm->rows, div, 1, (size_t)n_out * c->hidden, err));
    const cuda_weight *head = dw(cm, lm_head);
    /* few rows: the GEMV reads lm_head once; past 8 rows it would re-read it per 8, so a
     * weight cuBLAS takes as stored (F16 / BF16) goes to the GEMM (its x scratch holds
     * max_tokens rows of the widest k, and n_out <= max_tokens) */
    if (!cm->invariant && n_out <= cm->max_tokens &&
        (n_out > GRAPH_MAX_T ? cuda_matmul_direct(cm->gemm, head) : cuda_matmul_small_direct(cm->gemm, head, n_out)))
        TRY(cuda_matmul(cm->gemm, head, cm->rows, n_out, cm->logits, err));
    else
        TRY(cuda_gemv(head, cm->rows, n_out, cm->logits, err));
    /* greedy rows: only the ids leave the device (-1 marks a row with a non-finite logit) */
    return s->out == OP_OUT_IDS ? cuda_argmax_checked(cm->logits, n_out, c->vocab, cm->ids_dev, err) : HEARTH_OK;
}

/* Everything of a step after the inputs are on the device: the family's forward pass.
 * Only launches (no host sync, no host-dependent launch shapes for T <= GRAPH_MAX_T), so
 * it can be captured. */
static hearth_status run_layers(cuda_model *cm, const op_step *s) {
    cm->q8_ready = 0;
    return cm->layers(s, cm->layers_ctx);
}

/* A decode step through its graph: captured on the first step of this (T, n_out), then
 * replayed. A capture that fails turns graphs off for this model (eager steps give the
 * same results), with one line on stderr saying why. */
static hearth_status run_graph(cuda_model *cm, const op_step *s) {
    cuda_graph **g = &cm->graphs[s->b->T][s->b->n_out][s->out == OP_OUT_IDS][cm->lora_step];
    if (!*g) {
        hearth_error ce = {0};
        op_step cs = *s;
        cs.err = &ce;
        hearth_status st = cuda_capture_begin(&ce);
        if (!st) {
            st = run_layers(cm, &cs);
            hearth_status end = cuda_capture_end(!st, g, st ? NULL : &ce);
            if (!st) st = end;
        }
        if (st) {
            fprintf(stderr, "hearth: cuda: decode graphs off (capture failed: %s)\n", ce.message);
            cm->graphs_off = 1;
            return run_layers(cm, s);
        }
    }
    return cuda_graph_launch(*g, s->err);
}

/* One step: embeddings made on the host and queued with the step's indices, the layers
 * (a replayed graph for decode shapes, else eager), then the logits rows, their greedy ids
 * or nothing (kept for the device sampler) downloaded. */
static hearth_status cu_step(op_backend *be, kv_cache *kv, const op_batch *b, const op_dims *dims,
                             const op_embed *embed, op_layers_fn layers, const void *ctx, op_out out, int32_t *ids,
                             hearth_error *err) {
    cuda_model *cm = (cuda_model *)be;
    TRY(op_batch_check(b, kv, cm->max_tokens, cm->max_out, err));
    if (kv->n_blocks != cm->kv.n_blocks || kv->max_slots != cm->kv.max_slots ||
        kv->max_blocks_per_slot != cm->kv.max_blocks_per_slot)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: the KV pool changed shape after the device copy was made");
    if (out == OP_OUT_IDS && !ids) return err_set(err, HEARTH_ERR_INVALID, "cuda: greedy ids asked with no output array");
    int T = b->T;
    /* T rows of hidden floats cross PCIe, not a device copy of the table */
    TRY(op_embed_rows(embed, b->tokens, T, dims->vocab, cm->host_x, cm->tp, err));
    memcpy(cm->host_ints, b->pos, (size_t)T * sizeof(int32_t));
    memcpy(cm->host_ints + cm->max_tokens, b->slot, (size_t)T * sizeof(int32_t));
    memcpy(cm->host_ints + 2 * cm->max_tokens, b->out_rows, (size_t)b->n_out * sizeof(int32_t));
    if (cm->state) /* each sequence's tokens of the step, for the Gated DeltaNet kernels */
        cuda_gdn_runs(b->slot, T, cm->kv.max_slots, cm->run_last, cm->host_ints + 3 * cm->max_tokens,
                      cm->host_ints + 4 * cm->max_tokens);
    /* Stream-ordered: a replayed graph reads these same device buffers. The pinned ones
     * are not rewritten before this step's final synchronization below. */
    TRY(cuda_upload_async(cm->x, cm->host_x, (size_t)T * dims->hidden * sizeof(float), err));
    int hid = b->hidden_in || b->hidden_out; /* an MTP head's step, or its model's: eager */
    if (hid) TRY(hid_buffers(cm, err));
    if (b->hidden_in) {
        memcpy(cm->host_hid, b->hidden_in, (size_t)T * dims->hidden * sizeof(float));
        TRY(cuda_upload_async(cm->hid_dev, cm->host_hid, (size_t)T * dims->hidden * sizeof(float), err));
    }
    TRY(cuda_upload_async(cm->ints, cm->host_ints, cm->plan.ints * sizeof(int32_t), err));
    /* block tables change as sequences grow (kv_reserve on the host): sent every step */
    TRY(cuda_upload_async(cm->kv.tables, kv->tables, (size_t)kv->max_slots * kv->max_blocks_per_slot * sizeof(int32_t),
                          err));
    cm->single_slot = 1; /* a prefill chunk of one sequence: the tiled attention kernel applies */
    for (int t = 1; t < T; t++) cm->single_slot &= b->slot[t] == b->slot[0];
    if (b->n_out == 0 && out == OP_OUT_IDS) out = OP_OUT_LOGITS;
    cm->invariant = b->batch_invariant != 0;
    cm->gdn_chunked = dims->n_state_layers > 0 && cm->single_slot && !cm->plan.gemm_exact && !cm->invariant &&
                      T >= CUDA_GDN_CHUNK_MIN_T;
    for (int t = 1; cm->gdn_chunked && t < T; t++) cm->gdn_chunked = b->pos[t] == b->pos[0] + t;
    cm->layers = layers;
    cm->layers_ctx = ctx;
    op_step s = {.t = be->t, .be = be, .dims = dims, .kv = kv, .b = b, .out = out, .err = err};
    /* a step with adapters: their device copies and row tables first (queued, no wait);
     * decode shapes then replay their own graphs, captured with the adapters' launches */
    cm->lora_step = op_batch_has_adapters(b);
    if (cm->lora_step) TRY(cuda_lora_cache_step(cm->lora, b, err));
    if (cm->lora_step && cuda_lora_cache_grouped(cm->lora)) cm->lora_step = 2; /* other launches: other graphs */
    /* per-layer inputs: the table's rows queued like the embeddings (the table is known
     * from the model's first step, which runs eagerly and stages them itself) */
    cm->pl_staged = 0;
    if (dims->per_layer_dim && cm->pl_known) TRY(stage_per_layer_rows(cm, &cm->pl_table, b, dims, err));
    int pl_ready = !dims->per_layer_dim || cm->pl_known;
    /* T <= GRAPH_MAX_T runs the same kernels either way, so decode graphs are shared */
    /* a batch-invariant step of a mixture of experts routes on the host (cu_moe): eager */
    int host_sync = dims->n_experts > 0 && (cm->invariant || (cm->lora_step && expert_adapters(b, -1, dims->n_layers)));
    if (T <= GRAPH_MAX_T && b->n_out <= T && !cm->graphs_off && pl_ready && out != OP_OUT_HIDDEN && !host_sync && !hid)
        TRY(run_graph(cm, &s));
    else
        TRY(run_layers(cm, &s));
    if (b->hidden_out) { /* the host uses them before the next step: waited for here */
        TRY(cuda_download_async(cm->host_hid, cm->hid_dev, (size_t)T * dims->hidden * sizeof(float), err));
        TRY(cuda_stream_sync(err));
        memcpy(b->hidden_out, cm->host_hid, (size_t)T * dims->hidden * sizeof(float));
    }
    if (b->n_out == 0) return cuda_stream_sync(err);
    if (out == OP_OUT_KEEP) return HEARTH_OK; /* the logits stay in cm->logits for the device sampler */
    if (out == OP_OUT_IDS) {
        TRY(cuda_download_async(cm->host_ids, cm->ids_dev, (size_t)b->n_out * sizeof(int32_t), err));
        TRY(cuda_stream_sync(err));
        for (int i = 0; i < b->n_out; i++) {
            if (cm->host_ids[i] < 0)
                return err_set(err, HEARTH_ERR_FORMAT,
                               "the model produced non-finite logits; its weights contain NaN or Inf values");
            ids[i] = cm->host_ids[i];
        }
        return HEARTH_OK;
    }
    size_t width = out == OP_OUT_HIDDEN ? (size_t)dims->hidden : (size_t)dims->vocab;
    TRY(cuda_download_async(b->logits, out == OP_OUT_HIDDEN ? cm->rows : cm->logits,
                            (size_t)b->n_out * width * sizeof(float), err));
    return cuda_stream_sync(err);
}

static hearth_status cu_kv_copy(op_backend *be, int32_t src, int32_t dst, int rows, hearth_error *err) {
    return cuda_kv_copy_rows(&((cuda_model *)be)->kv, src, dst, rows, err);
}

static void cu_adapter_gone(op_backend *be, uint64_t key) { cuda_lora_cache_forget(((cuda_model *)be)->lora, key); }

static hearth_status cu_state_copy(op_backend *be, int src, int dst, hearth_error *err) {
    cuda_model *cm = (cuda_model *)be;
    int records = cm->kv.max_slots + cm->plan.state_snaps;
    if (!cm->state || src < 0 || dst < 0 || src >= records || dst >= records)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: state records %d -> %d of %d", src, dst, records);
    return cuda_state_copy(cm->state + (size_t)dst * cm->state_record, cm->state + (size_t)src * cm->state_record,
                           cm->state_record, err);
}

static hearth_status cu_kv_rows(op_backend *be, const kv_cache *kv, int layer, int slot, int head, int n, void *keys,
                                void *values, float *k_scale, float *v_scale, int to_host, hearth_error *err) {
    cuda_model *cm = (cuda_model *)be;
    return cuda_kv_rows(&cm->kv, &cm->rows_stage, kv->tables, layer, slot, head, n, keys, values, k_scale, v_scale,
                        to_host, err);
}

/* slot's record (every state layer) of the device state pool: the host kv_state's layout */
static hearth_status cu_state_rows(op_backend *be, int slot, void *record, size_t bytes, int to_host,
                                   hearth_error *err) {
    cuda_model *cm = (cuda_model *)be;
    if (!cm->state || slot < 0 || slot >= cm->kv.max_slots || bytes != cm->state_record * sizeof(float))
        return err_set(err, HEARTH_ERR_INVALID, "cuda: state record of slot %d (%zu bytes) is not in the state pool",
                       slot, bytes);
    float *dev = cm->state + (size_t)slot * cm->state_record;
    hearth_status st = to_host ? cuda_download_async(record, dev, bytes, err) : cuda_upload_async(dev, record, bytes, err);
    return st ? st : cuda_stream_sync(err);
}

static const op_table cuda_table = {.name = "cuda",
                                    .step = cu_step,
                                    .residual = cu_residual,
                                    .norm = cu_norm,
                                    .qkv_rope_store = cu_qkv_rope_store,
                                    .attention = cu_attention,
                                    .mlp = cu_mlp,
                                    .moe = cu_moe,
                                    .gated_delta = cu_gated_delta,
                                    .logits = cu_logits,
                                    .per_layer_inputs = cu_per_layer_inputs,
                                    .per_layer_gate = cu_per_layer_gate,
                                    .softcap = cu_softcap,
                                    .mtp_input = cu_mtp_input,
                                    .kv_copy = cu_kv_copy,
                                    .adapter_gone = cu_adapter_gone,
                                    .state_copy = cu_state_copy,
                                    .kv_rows = cu_kv_rows,
                                    .state_rows = cu_state_rows,
                                    .free = cuda_model_free};

/* The step's device buffers, each of the size the plan gives (cuda_plan.c). */
static hearth_status alloc_scratch(cuda_model *cm, hearth_error *err) {
    const op_dims *c = &cm->dims;
    const cuda_plan *p = &cm->plan;
    size_t T = (size_t)cm->max_tokens;
    float **ptrs[CUDA_PLAN_N_ACT] = {&cm->x,   &cm->xn,   &cm->q,  &cm->k,    &cm->v,     &cm->att,
                                     &cm->tmp, &cm->gate, &cm->up, &cm->rows, &cm->logits};
    for (int i = 0; i < CUDA_PLAN_N_ACT; i++)
        TRY(cuda_alloc((void **)ptrs[i], p->act_floats[i] * sizeof(float), "activation scratch", err));
    TRY(cuda_alloc((void **)&cm->ints, p->ints * sizeof(int32_t), "step indices", err));
    if (p->qgate_floats) TRY(cuda_alloc((void **)&cm->qgate, p->qgate_floats * sizeof(float), "attention gates", err));
    for (int i = 0; i < 5 && p->gdn_floats[0]; i++)
        TRY(cuda_alloc((void **)&cm->gdn[i], p->gdn_floats[i] * sizeof(float), "Gated DeltaNet scratch", err));
    cm->att_split_floats = p->att_split_floats;
    TRY(cuda_alloc((void **)&cm->att_split, cm->att_split_floats * sizeof(float), "attention split scratch", err));
    if (p->att_stage_bytes)
        TRY(cuda_alloc(&cm->att_stage, p->att_stage_bytes, "prefill attention stage", err));
    TRY(cuda_alloc((void **)&cm->ids_dev, p->ids * sizeof(int32_t), "greedy ids", err));
    if (p->mtp_floats) { /* an MTP head: its hidden rows and joined input */
        TRY(cuda_alloc((void **)&cm->hid_dev, p->mtp_floats / 3 * sizeof(float), "hidden rows", err));
        TRY(cuda_alloc((void **)&cm->mtp_cat, p->mtp_floats / 3 * 2 * sizeof(float), "MTP input", err));
    }
    if (p->per_layer_floats) {
        TRY(cuda_alloc((void **)&cm->pl_in, p->per_layer_floats * sizeof(float), "per-layer inputs", err));
        TRY(cuda_alloc((void **)&cm->pl_tmp, p->per_layer_floats * sizeof(float), "per-layer input rows", err));
        if (cudaMallocHost((void **)&cm->host_pl, p->per_layer_floats * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate pinned host buffers for %d tokens",
                           cm->max_tokens);
        }
    }
    TRY(cuda_gemv_reserve(p->gemv_floats, err)); /* int8 activations of the quantized GEMVs */
    /* decode: the int8 activations the fused norm / gate write for the next GEMV */
    TRY(cuda_alloc((void **)&cm->xq, p->decode_q8_bytes, "decode int8 activations", err));
    TRY(cuda_alloc((void **)&cm->xs, p->decode_q8_scale_bytes, "decode activation scales", err));
    if (cudaMallocHost((void **)&cm->host_x, T * c->hidden * sizeof(float)) != cudaSuccess ||
        cudaMallocHost((void **)&cm->host_ints, p->ints * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost((void **)&cm->host_ids, (size_t)cm->max_out * sizeof(int32_t)) != cudaSuccess) {
        cudaGetLastError();
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate pinned host buffers for %d tokens",
                       cm->max_tokens);
    }
    if (c->n_experts > 0) { /* cu_moe's buffers (sizes and order: cuda_plan.c) */
        size_t P = p->moe_pairs;
        TRY(cuda_alloc((void **)&cm->moe_logits, p->moe_logits * sizeof(float), "router logits", err));
        TRY(cuda_alloc((void **)&cm->moe_rows, P * sizeof(int32_t), "expert rows", err));
        TRY(cuda_alloc((void **)&cm->moe_w, P * sizeof(float), "expert weights", err));
        TRY(cuda_alloc((void **)&cm->moe_x, p->moe_hidden_floats * sizeof(float), "expert inputs", err));
        TRY(cuda_alloc((void **)&cm->moe_gate, p->moe_ffn_floats * sizeof(float), "expert gate", err));
        TRY(cuda_alloc((void **)&cm->moe_up, p->moe_ffn_floats * sizeof(float), "expert up", err));
        TRY(cuda_alloc((void **)&cm->moe_out, p->moe_out_floats * sizeof(float), "expert outputs", err));
        if (p->moe_acc_floats)
            TRY(cuda_alloc((void **)&cm->moe_acc, p->moe_acc_floats * sizeof(float), "expert sums", err));
        if (p->moe_idx_ints) {
            TRY(cuda_alloc((void **)&cm->moe_idx, p->moe_idx_ints * sizeof(int32_t), "expert tables", err));
            TRY(cuda_alloc((void **)&cm->moe_xb, p->moe_xb_elems * sizeof(uint16_t), "expert inputs (bf16)", err));
            TRY(cuda_alloc((void **)&cm->moe_actb, p->moe_actb_elems * sizeof(uint16_t), "expert products (bf16)",
                           err));
        }
        if (cudaMallocHost((void **)&cm->host_moe_logits, p->moe_logits * sizeof(float)) != cudaSuccess ||
            cudaMallocHost((void **)&cm->host_moe_rows, P * sizeof(int32_t)) != cudaSuccess ||
            cudaMallocHost((void **)&cm->host_moe_sel, P * sizeof(int32_t)) != cudaSuccess ||
            cudaMallocHost((void **)&cm->host_moe_w, P * sizeof(float)) != cudaSuccess ||
            cudaMallocHost((void **)&cm->host_moe_tw, P * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate pinned host buffers for the experts");
        }
    }
    TRY(cuda_lora_cache_create(c->n_layers, cm->max_tokens, &cm->lora, err));
    return cuda_gemm_create(&cm->gemm, p->gemm_max_w, p->gemm_max_x, p->gemm_exact, err);
}

hearth_status cuda_model_create(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int gemm_exact,
                                int expert_slots, threadpool *tp, op_backend **out, char *note, size_t note_size, hearth_error *err) {
    *out = NULL;
    const op_dims *c = &om->dims;
    cuda_device_info info;
    TRY(cuda_device_open(0, &info, err));
    /* layers of their own shape (varied_layers): heads up to the wide attention kernel's 512 */
    int max_hd = c->varied_layers ? CUDA_ATT_WIDE_DMAX : 256;
    if (c->head_dim > max_hd || c->head_dim % 2 || kv->head_dim != c->head_dim || kv->n_kv_heads != c->n_kv_heads)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: head_dim %d is not supported (at most %d, even)",
                       c->head_dim, max_hd);
    if (!c->varied_layers && kv->layer_heads)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: the KV pool has per-layer shapes but the model does not");
    for (int l = 0; kv->layer_dims && l < kv->n_layers; l++)
        if (kv->layer_dims[l] % 2 || kv->layer_dims[l] > max_hd)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: KV layer %d has head_dim %d (at most %d, even)", l,
                           kv->layer_dims[l], max_hd);
    if (c->n_state_layers > 0 && !cuda_gdn_supported(c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "cuda: Gated DeltaNet heads of key dim %d / value dim %d with a conv of %d taps are not "
                       "supported (at most 256 and 8); use --device cpu",
                       c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv);
    if (c->n_state_layers > 0 && (!kv->state || kv->state->n_layers != c->n_state_layers ||
                                  kv->state->layer_floats != op_gdn_state_floats(c) ||
                                  kv->state->n_snaps > kv_state_default_snaps(kv->max_slots)))
        return err_set(err, HEARTH_ERR_INVALID,
                       "cuda: a hybrid model needs the KV pool's recurrent-state pool attached first (kv_state_attach "
                       "with %d layers of %zu floats and at most %d snapshots)",
                       c->n_state_layers, op_gdn_state_floats(c), kv_state_default_snaps(kv->max_slots));
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    cm->base.t = &cuda_table;
    cm->dims = *c;
    cm->n_items = om->n_items;
    cm->tp = tp;
    /* each item's entry and each expert stack's table: at most half full */
    for (cm->map_cap = 16; cm->map_cap < (size_t)om->n_items * 4; cm->map_cap *= 2) {
    }
    cm->weights = calloc((size_t)om->n_items, sizeof *cm->weights);
    cm->experts = calloc((size_t)om->n_items, sizeof *cm->experts);
    cm->n_slices = calloc((size_t)om->n_items, sizeof *cm->n_slices);
    cm->xtabs = calloc((size_t)om->n_items, sizeof *cm->xtabs);
    cm->vecs = calloc((size_t)om->n_items, sizeof *cm->vecs);
    cm->map = calloc(cm->map_cap, sizeof *cm->map);
    if (!cm->weights || !cm->experts || !cm->n_slices || !cm->xtabs || !cm->vecs || !cm->map) {
        cuda_model_free(&cm->base);
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    }
    cm->max_tokens = max_tokens;
    cm->max_out = max_out;
    cuda_plan_make(om, kv, max_tokens, max_out, cuda_kv_device_dtype(kv->quant), gemm_exact, expert_slots, &cm->plan);
    hearth_status st = HEARTH_OK;
    if (cm->plan.expert_slots) /* the pool first: the slices pass through the device one at a time */
        st = cuda_experts_create(cm->plan.expert_slots, cm->plan.slot_data_bytes, cm->plan.slot_scale_bytes, &cm->xp,
                                 err);
    for (int i = 0; !st && i < om->n_items; i++) st = upload_item(cm, om, &om->items[i], i, err);
    /* every expert stack resident with its table: decode steps route on the device and are
     * graphs; otherwise routing reads the router's logits on the host mid-step: no graphs */
    cm->moe_dev = c->n_experts > 0 && !cm->xp;
    for (int i = 0; i < om->n_items; i++) cm->moe_dev &= !cm->experts[i] || cm->xtabs[i] != NULL;
    cm->graphs_off = c->n_experts > 0 && !cm->moe_dev;
    cm->moe_grouped = cm->moe_dev && cm->plan.moe_group_pairs > 0;
    for (int i = 0; i < om->n_items; i++)
        if (cm->experts[i]) cm->moe_grouped &= cuda_moe_gemm_takes(&cm->experts[i][0]);
    if (!st) st = cuda_kv_alloc(&cm->kv, kv, kv->quant, err);
    if (!st && cm->plan.state_floats) { /* zeroed: every sequence starts from position 0's zero state anyway */
        cm->state_record = (size_t)c->n_state_layers * op_gdn_state_floats(c);
        st = cuda_alloc((void **)&cm->state, cm->plan.state_floats * sizeof(float), "recurrent state", err);
        if (!st && cudaMemset(cm->state, 0, cm->plan.state_floats * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            st = err_set(err, HEARTH_ERR_IO, "cuda: cannot zero the recurrent state");
        }
        if (!st && !(cm->run_last = malloc((size_t)kv->max_slots * sizeof(int32_t))))
            st = err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    }
    if (!st) st = alloc_scratch(cm, err);
    if (!st) st = cuda_sync(err);
    if (st) {
        cuda_model_free(&cm->base);
        return st;
    }
    if (note && note_size) {
        char expanded[96] = "";
        if (cm->plan.n_expanded)
            snprintf(expanded, sizeof expanded, "; %d weights in %s have no CUDA kernel and were expanded to f32",
                     cm->plan.n_expanded, tensor_dtype_name(cm->plan.expanded_from));
        char offload[96] = "";
        if (cm->xp)
            snprintf(offload, sizeof offload, "; experts offloaded: %.2f GB pinned on the host, %d device slots",
                     (double)cm->plan.expert_bytes / 1e9, cm->plan.expert_slots);
        snprintf(note, note_size, "cuda: %s, %.2f GB on the device, decode graphs %s%s%s; %s", info.name,
                 (double)cuda_plan_bytes(&cm->plan) / 1e9,
                 cm->graphs_off    ? "off (mixture of experts: routed on the host)"
                 : cm->moe_grouped ? "on (mixture of experts: routed on the device; prefill experts grouped)"
                 : cm->moe_dev     ? "on (mixture of experts: routed on the device)"
                                   : "on",
                 expanded, offload,
                 om->release_host ? "weights mapped from the file, host pages released once uploaded"
                                  : "the host keeps its own copy of the weights (--no-mmap)");
    }
    *out = &cm->base;
    return HEARTH_OK;
}

void cuda_model_free(op_backend *be) {
    cuda_model *cm = (cuda_model *)be;
    if (!cm) return;
    for (int i = 0; i < cm->n_items; i++) {
        if (cm->weights) cuda_weight_free(&cm->weights[i]);
        if (cm->vecs) cuda_free(cm->vecs[i]);
        if (cm->experts && cm->experts[i]) {
            for (int e = 0; e < cm->n_slices[i]; e++) cuda_weight_free(&cm->experts[i][e]);
            free(cm->experts[i]);
        }
        if (cm->xtabs) cuda_free(cm->xtabs[i]);
    }
    cuda_experts_free(cm->xp);
    cuda_rows_stage_free(&cm->rows_stage);
    free(cm->experts);
    free(cm->n_slices);
    free(cm->xtabs);
    free(cm->weights);
    free(cm->vecs);
    free(cm->map);
    float *bufs[] = {cm->x, cm->xn, cm->q, cm->k, cm->v, cm->att, cm->tmp, cm->gate, cm->up, cm->rows, cm->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cuda_free(bufs[i]);
    cuda_free(cm->ints);
    cuda_free(cm->ids_dev);
    cuda_free(cm->att_split);
    cuda_free(cm->att_stage);
    cuda_free(cm->xq);
    cuda_free(cm->xs);
    cuda_free(cm->pl_in);
    cuda_free(cm->pl_tmp);
    if (cm->host_pl) cudaFreeHost(cm->host_pl);
    float *moe[] = {cm->moe_logits, cm->moe_w, cm->moe_x, cm->moe_gate, cm->moe_up, cm->moe_out, cm->moe_acc};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) cuda_free(moe[i]);
    cuda_free(cm->moe_rows);
    cuda_free(cm->moe_idx);
    cuda_free(cm->moe_xb);
    cuda_free(cm->moe_actb);
    void *pinned[] = {cm->host_moe_logits, cm->host_moe_rows, cm->host_moe_sel, cm->host_moe_w, cm->host_moe_tw};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        if (pinned[i]) cudaFreeHost(pinned[i]);
    cuda_free(cm->qgate);
    for (int i = 0; i < 5; i++) cuda_free(cm->gdn[i]);
    cuda_free(cm->state);
    free(cm->run_last);
    if (cm->host_ids) cudaFreeHost(cm->host_ids);
    if (cm->host_x) cudaFreeHost(cm->host_x);
    if (cm->host_hid) cudaFreeHost(cm->host_hid);
    cuda_free(cm->hid_dev);
    cuda_free(cm->mtp_cat);
    if (cm->host_ints) cudaFreeHost(cm->host_ints);
    for (int t = 0; t <= GRAPH_MAX_T; t++)
        for (int r = 0; r <= GRAPH_MAX_T; r++)
            for (int g = 0; g < 2; g++)
                for (int l = 0; l < 3; l++) cuda_graph_free(cm->graphs[t][r][g][l]);
    cuda_kv_free(&cm->kv);
    cuda_lora_cache_free(cm->lora);
    cuda_gemm_free(cm->gemm);
    free(cm);
}

size_t cuda_model_device_bytes(const op_backend *be) { return cuda_plan_bytes(&((const cuda_model *)be)->plan); }

void cuda_model_expert_stats(const op_backend *be, long long *hits, long long *misses) {
    cuda_experts_stats(((const cuda_model *)be)->xp, hits, misses);
}

float *cuda_model_device_logits(op_backend *be) { return ((cuda_model *)be)->logits; }

#endif
