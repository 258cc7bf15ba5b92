/* cuda_model.c: the decoder forward pass on the GPU: the same sequence of named steps as
 * model/llama.c and model/gemma3.c (QK-norm, Gemma's four norms and embed scale, sliding
 * windows with their own RoPE base, GeGLU or SwiGLU, tied lm_head), each step one call
 * into the CUDA kernels. Weights, the KV pool and every scratch buffer are allocated in
 * cuda_model_create; a forward pass allocates nothing, except the first decode step of each
 * batch shape, which captures its CUDA graph once. Host-side C; no kernels here. */
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_plan.h"
#include "base/err.h"
#include "model/decoder.h"
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuda_matmul sends T <= 8 rows to the GEMV kernels (no cuBLAS, no workspace): those
 * steps have fixed launch shapes and are the ones worth a graph. */
#define GRAPH_MAX_T CUDA_GRAPH_MAX_T

typedef struct cuda_layer {
    cuda_weight q, k, v, o, gate, up, down;
    float *q_bias, *k_bias, *v_bias, *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm, *q_norm, *k_norm;
} cuda_layer;

struct cuda_model {
    const model *m;
    cuda_layer *layers;
    cuda_weight lm_head;
    float *final_norm, *inv_global, *inv_local;
    cuda_kv kv;
    cuda_gemm *gemm;
    int max_tokens, max_out;
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up, *rows, *logits; /* device scratch */
    float *att_split; /* decode attention's split-K partials (cuda_attention_split_floats) */
    void *att_stage;  /* prefill attention's bf16 keys and values (cuda_attention_stage_bytes; NULL: none) */
    int8_t *xq;       /* decode: the next GEMV's int8 activations, written by the fused norm / gate */
    float *xs;        /* and their (d, d * sum q) pairs per block of 32 (cuda_gemv_multi_q8) */
    int q8_ready;     /* 1 while xq / xs hold the quantized cm->xn (step-building state, host side) */
    size_t att_split_floats;
    int32_t *ints;      /* device: pos | slot | out_rows, max_tokens each */
    float *host_x;      /* pinned: the step's embeddings, made on the host */
    threadpool *tp;     /* host threads for them (cuda_model_set_threads; NULL: this thread) */
    int32_t *host_ints; /* pinned: staging for ints */
    int32_t *ids_dev;   /* device: greedy ids of the logits rows (cuda_model_forward_ids) */
    int32_t *host_ids;  /* pinned: their copy on the host */
    /* decode steps (T <= GRAPH_MAX_T tokens, n_out <= T rows) replay a captured graph, one
     * per (T, n_out); HEARTH_CUDA_GRAPH=0 runs every step eagerly (A/B benchmarks) */
    cuda_graph *graphs[GRAPH_MAX_T + 1][GRAPH_MAX_T + 1][2]; /* [T][n_out][ids] */
    int graphs_off;
    /* this step is batch-invariant (model_batch.batch_invariant, deterministic mode): every
     * matmul goes to the GEMV kernels whatever T (a row's sums do not depend on how many
     * rows share the launch; cuBLAS's tiling does) and attention to the decode kernels */
    int invariant;
    /* HEARTH_CUDA_FUSED=0: the unfused decode sequence (one rope launch for q, one for k;
     * int8 activations quantized by each GEMV call instead of by the norm / gate before it) */
    int unfused;
    /* HEARTH_CUDA_PROFILE_STEP=N: the N-th step of HEARTH_CUDA_PROFILE_T tokens (default 1;
     * 8: a decode step of 8 rows, as `hearth bench --batch 8` runs) runs between
     * cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`;
     * HEARTH_CUDA_PROFILE_PREFILL=N likewise the N-th step of more than GRAPH_MAX_T tokens */
    int prof_step, prof_t, decode_steps, prof_prefill, prefill_steps;
    cuda_plan plan; /* every buffer's size (cuda_plan.c: what hearth fit predicts) */
};

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        hearth_status s_ = (call);                                                                                     \
        if (s_) return s_;                                                                                             \
    } while (0)

/* A float vector of n values on the device (NULL stays NULL: the step is skipped). */
static hearth_status upload_vec(float **dst, const float *src, size_t n, cuda_model *cm, hearth_error *err) {
    (void)cm;
    *dst = NULL;
    if (!src) return HEARTH_OK;
    TRY(cuda_alloc((void **)dst, n * sizeof(float), "norm/bias vector", err));
    return cuda_upload(*dst, src, n * sizeof(float), err);
}

static hearth_status upload_weight(cuda_weight *dw, const op_weight *w, const char *what, cuda_model *cm,
                                   hearth_error *err) {
    int expanded = 0; /* counted by the plan (cuda_weight_layout) */
    hearth_status s = cuda_weight_upload_any(dw, w, what, &expanded, err);
    /* the exact tier keeps the generic affine GEMV on float activations: the f32 expansion it
     * replaced was exact there, and the tiny models' greedy parity with the CPU reference
     * (tests/parity/test_cuda_device.py) holds only so */
    if (!s && dw->dtype == DT_AFFINE) dw->aff_f32act = cm->plan.gemm_exact;
    return s;
}

static hearth_status upload_layer(cuda_model *cm, int i, hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    const layer_weights *l = &cm->m->layers[i];
    cuda_layer *d = &cm->layers[i];
    const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
    cuda_weight *ds[] = {&d->q, &d->k, &d->v, &d->o, &d->gate, &d->up, &d->down};
    static const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    char what[64];
    for (int j = 0; j < 7; j++) {
        snprintf(what, sizeof what, "layer %d %s", i, names[j]);
        TRY(upload_weight(ds[j], ws[j], what, cm, err));
    }
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim, h = (size_t)c->hidden;
    TRY(upload_vec(&d->q_bias, l->q_bias, qd, cm, err));
    TRY(upload_vec(&d->k_bias, l->k_bias, kd, cm, err));
    TRY(upload_vec(&d->v_bias, l->v_bias, kd, cm, err));
    TRY(upload_vec(&d->attn_norm, l->attn_norm, h, cm, err));
    TRY(upload_vec(&d->ffn_norm, l->ffn_norm, h, cm, err));
    TRY(upload_vec(&d->post_attn_norm, l->post_attn_norm, h, cm, err));
    TRY(upload_vec(&d->post_ffn_norm, l->post_ffn_norm, h, cm, err));
    TRY(upload_vec(&d->q_norm, l->q_norm, (size_t)c->head_dim, cm, err));
    return upload_vec(&d->k_norm, l->k_norm, (size_t)c->head_dim, cm, err);
}

/* The step's device buffers, each of the size the plan gives (cuda_plan.c). */
static hearth_status alloc_scratch(cuda_model *cm, hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    const cuda_plan *p = &cm->plan;
    size_t T = (size_t)cm->max_tokens;
    float **ptrs[CUDA_PLAN_N_ACT] = {&cm->x,   &cm->xn,   &cm->q,  &cm->k,    &cm->v,     &cm->att,
                                     &cm->tmp, &cm->gate, &cm->up, &cm->rows, &cm->logits};
    for (int i = 0; i < CUDA_PLAN_N_ACT; i++)
        TRY(cuda_alloc((void **)ptrs[i], p->act_floats[i] * sizeof(float), "activation scratch", err));
    TRY(cuda_alloc((void **)&cm->ints, p->ints * sizeof(int32_t), "step indices", err));
    cm->att_split_floats = p->att_split_floats;
    TRY(cuda_alloc((void **)&cm->att_split, cm->att_split_floats * sizeof(float), "attention split scratch", err));
    if (p->att_stage_bytes)
        TRY(cuda_alloc(&cm->att_stage, p->att_stage_bytes, "prefill attention stage", err));
    TRY(cuda_alloc((void **)&cm->ids_dev, p->ids * sizeof(int32_t), "greedy ids", err));
    TRY(cuda_gemv_reserve(p->gemv_floats, err)); /* int8 activations of the quantized GEMVs */
    /* decode: the int8 activations the fused norm / gate write for the next GEMV */
    TRY(cuda_alloc((void **)&cm->xq, p->decode_q8_bytes, "decode int8 activations", err));
    TRY(cuda_alloc((void **)&cm->xs, p->decode_q8_scale_bytes, "decode activation scales", err));
    if (cudaMallocHost((void **)&cm->host_x, T * c->hidden * sizeof(float)) != cudaSuccess ||
        cudaMallocHost((void **)&cm->host_ints, 3 * T * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost((void **)&cm->host_ids, (size_t)cm->max_out * sizeof(int32_t)) != cudaSuccess) {
        cudaGetLastError();
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate pinned host buffers for %d tokens",
                       cm->max_tokens);
    }
    return cuda_gemm_create(&cm->gemm, p->gemm_max_w, p->gemm_max_x, p->gemm_exact, err);
}

hearth_status cuda_model_create(const model *m, const kv_cache *kv, int max_tokens, int max_out, cuda_model **out,
                                char *note, size_t note_size, hearth_error *err) {
    *out = NULL;
    const model_config *c = &m->cfg;
    cuda_device_info info;
    TRY(cuda_device_open(0, &info, err));
    if (c->head_dim > 256 || c->head_dim % 2 || kv->head_dim != c->head_dim || kv->n_kv_heads != c->n_kv_heads)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: head_dim %d is not supported (at most 256, even)",
                       c->head_dim);
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm || !(cm->layers = calloc((size_t)c->n_layers, sizeof *cm->layers))) {
        free(cm);
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    }
    cm->m = m;
    cm->max_tokens = max_tokens;
    cm->max_out = max_out;
    const char *graph_env = getenv("HEARTH_CUDA_GRAPH");
    cm->graphs_off = graph_env && !strcmp(graph_env, "0");
    const char *fused_env = getenv("HEARTH_CUDA_FUSED");
    cm->unfused = fused_env && !strcmp(fused_env, "0");
    const char *prof_env = getenv("HEARTH_CUDA_PROFILE_STEP");
    cm->prof_step = prof_env ? atoi(prof_env) : 0;
    const char *prof_t_env = getenv("HEARTH_CUDA_PROFILE_T");
    cm->prof_t = prof_t_env && atoi(prof_t_env) > 0 ? atoi(prof_t_env) : 1;
    const char *prof_pf_env = getenv("HEARTH_CUDA_PROFILE_PREFILL");
    cm->prof_prefill = prof_pf_env ? atoi(prof_pf_env) : 0;
    const char *mode = getenv("HEARTH_CUDA_GEMM");
    cuda_plan_make(m, kv, max_tokens, max_out, cuda_kv_device_dtype(kv->quant), mode && !strcmp(mode, "f32"), &cm->plan);
    hearth_status st = HEARTH_OK;
    for (int i = 0; !st && i < c->n_layers; i++) st = upload_layer(cm, i, err);
    if (!st) st = upload_weight(&cm->lm_head, &m->lm_head, "lm_head", cm, err);
    if (!st) st = upload_vec(&cm->final_norm, m->final_norm, (size_t)c->hidden, cm, err);
    if (!st) st = upload_vec(&cm->inv_global, c->inv_freq_global, (size_t)c->head_dim / 2, cm, err);
    if (!st) st = upload_vec(&cm->inv_local, c->inv_freq_local, (size_t)c->head_dim / 2, cm, err);
    if (!st) st = cuda_kv_alloc(&cm->kv, kv, kv->quant, err);
    if (!st) st = alloc_scratch(cm, err);
    if (!st) st = cuda_sync(err);
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    if (note && note_size) {
        char expanded[96] = "";
        if (cm->plan.n_expanded)
            snprintf(expanded, sizeof expanded, "; %d weights in %s have no CUDA kernel and were expanded to f32",
                     cm->plan.n_expanded, tensor_dtype_name(cm->plan.expanded_from));
        snprintf(note, note_size, "cuda: %s, %.2f GB on the device, decode graphs %s%s", info.name,
                 (double)cuda_plan_bytes(&cm->plan) / 1e9, cm->graphs_off ? "off" : "on", expanded);
    }
    *out = cm;
    return HEARTH_OK;
}

void cuda_model_free(cuda_model *cm) {
    if (!cm) return;
    for (int i = 0; cm->layers && i < cm->m->cfg.n_layers; i++) {
        cuda_layer *l = &cm->layers[i];
        cuda_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
        for (int j = 0; j < 7; j++) cuda_weight_free(ws[j]);
        float *vs[] = {l->q_bias,         l->k_bias,        l->v_bias, l->attn_norm, l->ffn_norm,
                       l->post_attn_norm, l->post_ffn_norm, l->q_norm, l->k_norm};
        for (int j = 0; j < 9; j++) cuda_free(vs[j]);
    }
    free(cm->layers);
    cuda_weight_free(&cm->lm_head);
    float *bufs[] = {cm->final_norm, cm->inv_global, cm->inv_local, cm->x,    cm->xn, cm->q,    cm->k,
                     cm->v,          cm->att,        cm->tmp,       cm->gate, cm->up, cm->rows, cm->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cuda_free(bufs[i]);
    cuda_free(cm->ints);
    cuda_free(cm->ids_dev);
    cuda_free(cm->att_split);
    cuda_free(cm->att_stage);
    cuda_free(cm->xq);
    cuda_free(cm->xs);
    if (cm->host_ids) cudaFreeHost(cm->host_ids);
    if (cm->host_x) cudaFreeHost(cm->host_x);
    if (cm->host_ints) cudaFreeHost(cm->host_ints);
    for (int t = 0; t <= GRAPH_MAX_T; t++)
        for (int r = 0; r <= GRAPH_MAX_T; r++)
            for (int g = 0; g < 2; g++) cuda_graph_free(cm->graphs[t][r][g]);
    cuda_kv_free(&cm->kv);
    cuda_gemm_free(cm->gemm);
    free(cm);
}

size_t cuda_model_device_bytes(const cuda_model *cm) { return cuda_plan_bytes(&cm->plan); }

void cuda_model_set_threads(cuda_model *cm, threadpool *tp) { cm->tp = tp; }

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

/* A fusion switch for A/B runs: on unless the variable is "0"; *cache holds the answer. */
static int fusion_on(const char *var, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(var);
        *cache = !(e && !strcmp(e, "0"));
    }
    return *cache;
}

/* Prefill GEMM inputs converted once per input (q, k, v; gate, up) and the gated product
 * written in the GEMM's type (HEARTH_CUDA_GEMM_SHARED=0: a conversion per weight and an f32
 * gated pass, the path before; the same bits either way). */
static int gemm_shared(const cuda_model *cm) {
    static int on = -1;
    return !cm->invariant && fusion_on("HEARTH_CUDA_GEMM_SHARED", &on);
}

/* ys[i] = x · ws[i]^T for weights that read one input: x converted for the GEMM once when
 * every weight takes the same prefill activation type (cuda_matmul_act), else a matmul each. */
static hearth_status matmul_shared(cuda_model *cm, const cuda_weight *const *ws, float *const *ys, int nw,
                                   const float *x, int T, hearth_error *err) {
    int act = gemm_shared(cm) ? cuda_matmul_act(cm->gemm, ws[0], x, T) : CUDA_ACT_NONE;
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

/* ys[i] = the quantized cm->xn (xq / xs) · ws[i]^T: the GEMVs in a batch-invariant step,
 * else the MMQ kernel for the weights it takes (cuda_mmq_takes: packed Q4_K at 5..64 rows). */
static hearth_status q8_matmul(cuda_model *cm, const cuda_weight *const *ws, float *const *ys, int nw, int T,
                               hearth_error *err) {
    if (cm->invariant) return cuda_gemv_multi_q8(ws, ys, nw, cm->xq, cm->xs, T, err);
    return cuda_matmul_q8(ws, ys, nw, cm->xq, cm->xs, T, err);
}

/* Whether the decode GEMVs of ws (one input) take int8 activations that the kernel making
 * that input can write itself (cuda_add_rmsnorm_q8 / cuda_gated_q8). */
static int q8_fusable(const cuda_model *cm, const cuda_weight *const *ws, int nw, int T) {
    if (cm->unfused || T > GRAPH_MAX_T || ws[0]->k % 32) return 0;
    for (int i = 0; i < nw; i++)
        if (!cuda_gemv_int8_act(ws[i]) || ws[i]->k != ws[0]->k) return 0;
    return 1;
}
static int q8_fusable_qkv(const cuda_model *cm, int i, int T) {
    const cuda_layer *l = &cm->layers[i];
    const cuda_weight *ws[3] = {&l->q, &l->k, &l->v};
    return q8_fusable(cm, ws, 3, T);
}
static int q8_fusable_gate_up(const cuda_model *cm, int i, int T) {
    const cuda_layer *l = &cm->layers[i];
    const cuda_weight *ws[2] = {&l->gate, &l->up};
    return q8_fusable(cm, ws, 2, T);
}

/* cm->xn = rmsnorm(x (+= delta)), and its int8 copy in cm->xq when `quant` (q8_ready says which). */
static hearth_status norm_into_xn(cuda_model *cm, const float *delta, const float *w, float shift, int T, int quant,
                                  hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    cm->q8_ready = quant;
    if (cuda_profile_skip(1)) return HEARTH_OK;
    if (quant)
        return cuda_add_rmsnorm_q8(cm->xn, cm->x, delta, w, shift, T, c->hidden, c->norm_eps, cm->xq, cm->xs, err);
    if (delta) return cuda_add_rmsnorm(cm->xn, cm->x, delta, w, shift, T, c->hidden, c->norm_eps, err);
    return cuda_rmsnorm(cm->xn, cm->x, w, shift, T, c->hidden, c->norm_eps, err);
}

/* RoPE and the KV write in one launch (cuda_rope_kv_write; HEARTH_CUDA_ROPE_KV=0: the two
 * launches; the same bits either way). */
static int rope_kv_fused(void) {
    static int on = -1;
    return fusion_on("HEARTH_CUDA_ROPE_KV", &on);
}

/* The split-attention merge writes the o projection's int8 activations (HEARTH_CUDA_ATT_Q8=0:
 * quantize_x_q8 does, one launch more per layer; the same bits either way). */
static int att_q8_fused(void) {
    static int on = -1;
    return fusion_on("HEARTH_CUDA_ATT_Q8", &on);
}

/* in: cm->xn; out: cm->tmp (decoder_attention's contract). */
static hearth_status attention(cuda_model *cm, int i, int T, const int32_t *pos, const int32_t *slot, int single_slot,
                               hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    const cuda_layer *l = &cm->layers[i];
    int sliding = cm->m->layers[i].sliding, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    const cuda_weight *ws[3] = {&l->q, &l->k, &l->v};
    if (multi_gemv(cm, ws, 3, T)) { /* q, k and v in one GEMV launch where the formats allow */
        float *ys[3] = {cm->q, cm->k, cm->v};
        if (cm->q8_ready)
            TRY(q8_matmul(cm, ws, ys, 3, T, err));
        else
            TRY(cuda_gemv_multi(ws, ys, 3, cm->xn, T, err));
    } else {
        float *ys[3] = {cm->q, cm->k, cm->v};
        TRY(matmul_shared(cm, ws, ys, 3, cm->xn, T, err));
    }
    TRY(cuda_add_bias(cm->q, l->q_bias, T, qd, err));
    TRY(cuda_add_bias(cm->k, l->k_bias, T, kd, err));
    TRY(cuda_add_bias(cm->v, l->v_bias, T, kd, err));
    if (l->q_norm)
        TRY(cuda_rmsnorm_heads(cm->q, cm->q, l->q_norm, c->norm_shift, T * c->n_heads, c->head_dim, c->norm_eps, err));
    if (l->k_norm)
        TRY(cuda_rmsnorm_heads(cm->k, cm->k, l->k_norm, c->norm_shift, T * c->n_kv_heads, c->head_dim, c->norm_eps, err));
    const float *freq = sliding ? cm->inv_local : cm->inv_global;
    /* the new keys join before attending */
    if (cuda_profile_skip(2)) {
        /* timing runs only (HEARTH_CUDA_PROFILE_SKIP): no RoPE, no KV write */
    } else if (cm->unfused) {
        TRY(cuda_rope(cm->q, T, c->n_heads, c->head_dim, pos, freq, c->rope_adjacent, err));
        TRY(cuda_rope(cm->k, T, c->n_kv_heads, c->head_dim, pos, freq, c->rope_adjacent, err));
        TRY(cuda_kv_write(&cm->kv, i, cm->k, cm->v, T, pos, slot, err));
    } else if (!rope_kv_fused()) {
        TRY(cuda_rope_qk(cm->q, cm->k, T, c->n_heads, c->n_kv_heads, c->head_dim, pos, freq, c->rope_adjacent, err));
        TRY(cuda_kv_write(&cm->kv, i, cm->k, cm->v, T, pos, slot, err));
    } else {
        TRY(cuda_rope_kv_write(&cm->kv, i, cm->q, cm->k, cm->v, T, c->n_heads, pos, slot, freq, c->rope_adjacent, err));
    }
    cuda_attention_args a = {.kv = &cm->kv,
                             .layer = i,
                             .q = cm->q,
                             .out = cm->att,
                             .T = T,
                             .n_heads = c->n_heads,
                             .n_kv_heads = c->n_kv_heads,
                             .head_dim = c->head_dim,
                             .pos = pos,
                             .slot = slot,
                             .window = sliding ? c->sliding_window : 0,
                             .scale = c->attn_scale,
                             .single_slot = single_slot,
                             .split_scratch = cm->att_split,
                             .split_scratch_floats = cm->att_split_floats,
                             .stage = cm->att_stage,
                             .stage_bytes = cm->plan.att_stage_bytes,
                             .batch_invariant = cm->invariant,
                             .exact_f32 = cm->plan.gemm_exact,
                             /* eager steps only: host_ints is the step's pinned copy of slot */
                             .host_slot = T > GRAPH_MAX_T && !single_slot ? cm->host_ints + cm->max_tokens : NULL};
    /* decode: the split merge writes o's int8 activations itself (no quantizer launch; the
     * qkv GEMV that read cm->xq has finished before attention starts) */
    const cuda_weight *o = &l->o;
    if (att_q8_fused() && q8_fusable(cm, &o, 1, T)) {
        a.out_xq = cm->xq, a.out_xs = cm->xs;
        cm->q8_ready = 0; /* xq no longer holds xn's copy */
    }
    if (!cuda_profile_skip(4)) TRY(cuda_attention(&a, err));
    if (cuda_attention_writes_q8(&a)) return q8_matmul(cm, &o, &cm->tmp, 1, T, err);
    return matmul(cm, o, cm->att, T, cm->tmp, err);
}

/* in: cm->xn; out: cm->tmp = down(act(gate(xn)) * up(xn)). */
static hearth_status mlp(cuda_model *cm, int i, int T, int gelu, hearth_error *err) {
    const cuda_layer *l = &cm->layers[i];
    size_t n = (size_t)T * cm->m->cfg.ffn;
    /* decode: one launch for 16-bit gate + up, one quantized x for int8 ones */
    const cuda_weight *ws[2] = {&l->gate, &l->up};
    if (multi_gemv(cm, ws, 2, T)) {
        float *ys[2] = {cm->gate, cm->up};
        if (cm->q8_ready)
            TRY(q8_matmul(cm, ws, ys, 2, T, err));
        else
            TRY(cuda_gemv_multi(ws, ys, 2, cm->xn, T, err));
    } else {
        float *ys[2] = {cm->gate, cm->up};
        TRY(matmul_shared(cm, ws, ys, 2, cm->xn, T, err));
    }
    const cuda_weight *down = &l->down;
    if (q8_fusable(cm, &down, 1, T)) { /* the gate writes down's int8 activations itself */
        if (!cuda_profile_skip(16)) TRY(cuda_gated_q8(cm->gate, cm->up, n, gelu, cm->xq, cm->xs, err));
        return q8_matmul(cm, &down, &cm->tmp, 1, T, err);
    }
    int act = gemm_shared(cm) ? cuda_matmul_act(cm->gemm, down, cm->gate, T) : CUDA_ACT_NONE;
    if (act) { /* prefill: the gated product goes to the GEMM's input type directly */
        TRY(cuda_matmul_load_gated(cm->gemm, act, cm->gate, cm->up, T, down->k, gelu, err));
        return cuda_matmul_loaded(cm->gemm, down, act, T, cm->tmp, err);
    }
    if (!cuda_profile_skip(16))
        TRY(gelu ? cuda_gelu_tanh_mul(cm->gate, cm->up, n, err) : cuda_silu_mul(cm->gate, cm->up, n, err));
    return matmul(cm, &l->down, cm->gate, T, cm->tmp, err);
}

/* One block: llama.c's two pre-norms, or gemma3.c's four (1 + weight) norms with GeGLU.
 * On entry cm->xn already holds this block's attention norm of x (made by the previous
 * block's fused residual add, or by run_layers for block 0); each residual add is fused
 * with the norm that follows it, which saves a launch and a pass over x per add. */
static hearth_status block(cuda_model *cm, int i, int T, const int32_t *pos, const int32_t *slot, int single_slot,
                           hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    const cuda_layer *l = &cm->layers[i];
    int gemma = c->family == FAMILY_GEMMA3;
    float shift = gemma ? c->norm_shift : 0.0f;
    TRY(attention(cm, i, T, pos, slot, single_slot, err));
    if (gemma) TRY(cuda_rmsnorm(cm->tmp, cm->tmp, l->post_attn_norm, shift, T, c->hidden, c->norm_eps, err));
    TRY(norm_into_xn(cm, cm->tmp, l->ffn_norm, shift, T, q8_fusable_gate_up(cm, i, T), err));
    TRY(mlp(cm, i, T, gemma, err));
    if (gemma) TRY(cuda_rmsnorm(cm->tmp, cm->tmp, l->post_ffn_norm, shift, T, c->hidden, c->norm_eps, err));
    if (i + 1 < c->n_layers)
        return norm_into_xn(cm, cm->tmp, cm->layers[i + 1].attn_norm, shift, T, q8_fusable_qkv(cm, i + 1, T), err);
    cm->q8_ready = 0;
    return cuda_add(cm->x, cm->tmp, (size_t)T * c->hidden, err);
}

/* Everything of a step after the inputs are on the device: the blocks, then the final
 * norm and lm_head for the n_out requested rows into cm->logits. Only launches (no host
 * sync, no host-dependent launch shapes for T <= GRAPH_MAX_T), so it can be captured. */
static hearth_status run_layers(cuda_model *cm, int T, int n_out, int single_slot, int ids, hearth_error *err) {
    const model_config *c = &cm->m->cfg;
    const int32_t *pos = cm->ints, *slot = cm->ints + cm->max_tokens, *rows = cm->ints + 2 * cm->max_tokens;
    float shift = c->family == FAMILY_GEMMA3 ? c->norm_shift : 0.0f;
    TRY(norm_into_xn(cm, NULL, cm->layers[0].attn_norm, shift, T, q8_fusable_qkv(cm, 0, T), err));
    for (int i = 0; i < c->n_layers; i++) TRY(block(cm, i, T, pos, slot, single_slot, err));
    if (n_out == 0) return HEARTH_OK;
    TRY(cuda_gather_rows(cm->rows, cm->x, rows, n_out, c->hidden, err));
    TRY(cuda_rmsnorm(cm->rows, cm->rows, cm->final_norm, c->norm_shift, n_out, c->hidden, c->norm_eps, err));
    /* few rows: the GEMV reads lm_head once; past 8 rows it would re-read it per 8, so a
     * weight cuBLAS takes as stored (F16 / BF16) goes to the GEMM (its x scratch holds
     * max_tokens rows of the widest k, and n_out <= max_tokens) */
    if (!cm->invariant && n_out <= cm->max_tokens &&
        (n_out > GRAPH_MAX_T ? cuda_matmul_direct(cm->gemm, &cm->lm_head)
                             : cuda_matmul_small_direct(cm->gemm, &cm->lm_head, n_out)))
        TRY(cuda_matmul(cm->gemm, &cm->lm_head, cm->rows, n_out, cm->logits, err));
    else
        TRY(cuda_gemv(&cm->lm_head, cm->rows, n_out, cm->logits, err));
    /* greedy rows: only the ids leave the device (-1 marks a row with a non-finite logit) */
    return ids ? cuda_argmax_checked(cm->logits, n_out, c->vocab, cm->ids_dev, err) : HEARTH_OK;
}

/* A decode step through its graph: captured on the first step of this (T, n_out), then
 * replayed. A capture that fails turns graphs off for this model (eager steps give the
 * same results), with one line on stderr saying why. */
static hearth_status run_graph(cuda_model *cm, int T, int n_out, int ids, hearth_error *err) {
    cuda_graph **g = &cm->graphs[T][n_out][ids];
    if (!*g) {
        hearth_error ce = {0};
        hearth_status st = cuda_capture_begin(&ce);
        if (!st) {
            st = run_layers(cm, T, n_out, 0, ids, &ce);
            hearth_status end = cuda_capture_end(!st, g, st ? NULL : &ce);
            if (!st) st = end;
        }
        if (st) {
            fprintf(stderr, "hearth: cuda: decode graphs off (capture failed: %s)\n", ce.message);
            cm->graphs_off = 1;
            return run_layers(cm, T, n_out, 0, ids, err);
        }
    }
    return cuda_graph_launch(*g, err);
}

/* The checks model_forward makes, plus the pool shape the device copy was made for. */
static hearth_status check_batch(const cuda_model *cm, const kv_cache *kv, const model_batch *b, hearth_error *err) {
    if (b->T <= 0 || b->T > cm->max_tokens || b->n_out < 0 || b->n_out > cm->max_out)
        return err_set(err, HEARTH_ERR_INVALID, "batch of %d tokens / %d logits rows exceeds the scratch (%d / %d)",
                       b->T, b->n_out, cm->max_tokens, cm->max_out);
    if (kv->n_blocks != cm->kv.n_blocks || kv->max_slots != cm->kv.max_slots ||
        kv->max_blocks_per_slot != cm->kv.max_blocks_per_slot)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: the KV pool changed shape after the device copy was made");
    for (int t = 0; t < b->T; t++)
        if (b->slot[t] < 0 || b->slot[t] >= kv->max_slots || b->pos[t] < 0 || b->pos[t] >= kv->n_tokens[b->slot[t]])
            return err_set(err, HEARTH_ERR_INVALID, "token %d: position %d of slot %d is not reserved", t, b->pos[t],
                           b->slot[t]);
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->T)
            return err_set(err, HEARTH_ERR_INVALID, "logits row %d outside the batch", b->out_rows[i]);
    return HEARTH_OK;
}

/* One step: inputs queued, the layers (a replayed graph for decode shapes, else eager),
 * then either the logits rows (ids == NULL) or only their greedy token ids downloaded. */
static hearth_status forward(cuda_model *cm, const kv_cache *kv, const model_batch *b, int32_t *ids, int keep,
                             hearth_error *err) {
    const model *m = cm->m;
    const model_config *c = &m->cfg;
    TRY(check_batch(cm, kv, b, err));
    int T = b->T;
    /* Embeddings are made on the host by the CPU path itself (bit-exact, any format):
     * T rows of hidden floats cross PCIe, not a device copy of the table. */
    model_scratch hs = {.x = cm->host_x};
    decoder_step d = {.m = m, .s = &hs, .b = b, .tp = cm->tp, .err = err};
    TRY(decoder_embed(&d));
    memcpy(cm->host_ints, b->pos, (size_t)T * sizeof(int32_t));
    memcpy(cm->host_ints + cm->max_tokens, b->slot, (size_t)T * sizeof(int32_t));
    memcpy(cm->host_ints + 2 * cm->max_tokens, b->out_rows, (size_t)b->n_out * sizeof(int32_t));
    /* Stream-ordered: a replayed graph reads these same device buffers. The pinned ones
     * are not rewritten before this step's final synchronization below. */
    TRY(cuda_upload_async(cm->x, cm->host_x, (size_t)T * c->hidden * sizeof(float), err));
    TRY(cuda_upload_async(cm->ints, cm->host_ints, 3 * (size_t)cm->max_tokens * sizeof(int32_t), err));
    /* block tables change as sequences grow (kv_reserve on the host): sent every step */
    TRY(cuda_upload_async(cm->kv.tables, kv->tables, (size_t)kv->max_slots * kv->max_blocks_per_slot * sizeof(int32_t),
                          err));
    int single_slot = 1; /* a prefill chunk of one sequence: the tiled attention kernel applies */
    for (int t = 1; t < T; t++) single_slot &= b->slot[t] == b->slot[0];
    int want_ids = ids != NULL && b->n_out > 0;
    /* T <= GRAPH_MAX_T runs the same kernels either way, so decode graphs are shared */
    cm->invariant = b->batch_invariant != 0;
    if (T <= GRAPH_MAX_T && b->n_out <= T && !cm->graphs_off)
        TRY(run_graph(cm, T, b->n_out, want_ids, err));
    else
        TRY(run_layers(cm, T, b->n_out, single_slot, want_ids, err));
    if (b->n_out == 0) return cuda_stream_sync(err);
    if (keep) return HEARTH_OK; /* the logits stay in cm->logits for the device sampler */
    if (want_ids) {
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
    TRY(cuda_download_async(b->logits, cm->logits, (size_t)b->n_out * c->vocab * sizeof(float), err));
    return cuda_stream_sync(err);
}

/* HEARTH_CUDA_PROFILE_STEP / _PREFILL: the chosen step runs inside the profiler range. */
static hearth_status profiled(cuda_model *cm, const kv_cache *kv, const model_batch *b, int32_t *ids, int keep,
                              hearth_error *err) {
    int prof = (b->T == cm->prof_t && cm->prof_step > 0 && ++cm->decode_steps == cm->prof_step) ||
               (b->T > GRAPH_MAX_T && cm->prof_prefill > 0 && ++cm->prefill_steps == cm->prof_prefill);
    if (prof) cudaProfilerStart();
    hearth_status st = forward(cm, kv, b, ids, keep, err);
    if (prof) cudaProfilerStop();
    return st;
}

hearth_status cuda_model_forward(cuda_model *cm, const kv_cache *kv, const model_batch *b, hearth_error *err) {
    return profiled(cm, kv, b, NULL, 0, err);
}

hearth_status cuda_model_forward_keep(cuda_model *cm, const kv_cache *kv, const model_batch *b, hearth_error *err) {
    return profiled(cm, kv, b, NULL, 1, err);
}

float *cuda_model_device_logits(cuda_model *cm) { return cm->logits; }

hearth_status cuda_model_kv_copy(cuda_model *cm, int32_t src, int32_t dst, int rows, hearth_error *err) {
    return cuda_kv_copy_rows(&cm->kv, src, dst, rows, err);
}

hearth_status cuda_model_forward_ids(cuda_model *cm, const kv_cache *kv, const model_batch *b, int32_t *ids,
                                     hearth_error *err) {
    if (!ids) return err_set(err, HEARTH_ERR_INVALID, "cuda_model_forward_ids: no output array");
    return profiled(cm, kv, b, ids, 0, err);
}
#endif
