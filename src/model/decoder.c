/* decoder.c: shared blocks of the decoder forward passes and the scratch they use (see
 * decoder.h), plus model_forward's dispatch to the family. Scratch is sized once for
 * the largest step; a forward pass allocates nothing. */
#include "model/decoder.h"
#include "backend/cpu/kernels.h"
#include "base/err.h"
#include <stdlib.h>
#include <string.h>

static size_t mm_scratch_need(const model *m, int T) {
    size_t need = cpu_matmul_scratch_size(&m->lm_head, T);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) {
            size_t n = cpu_matmul_scratch_size(ws[j], T);
            if (n > need) need = n;
        }
    }
    return need;
}

/* Widths of the per-token buffers, in floats. */
static size_t row_floats(const model_config *c) {
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    return (size_t)c->hidden * 3 + qd * 2 + kd * 2 + (size_t)c->ffn * 2;
}

size_t model_scratch_bytes(const model *m, const kv_cache *kv, int max_tokens, int max_out, int n_threads) {
    return sizeof(model_scratch) + row_floats(&m->cfg) * max_tokens * sizeof(float) +
           (size_t)max_out * m->cfg.hidden * sizeof(float) +
           (size_t)n_threads * ops_attention_scratch(kv) * sizeof(float) + mm_scratch_need(m, max_tokens) + 64 * 12;
}

hearth_status model_scratch_create(const model *m, const kv_cache *kv, int max_tokens, int max_out, int n_threads,
                                   model_scratch **out, hearth_error *err) {
    *out = NULL;
    model_scratch *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    const model_config *c = &m->cfg;
    size_t T = (size_t)max_tokens, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t sizes[] = {T * c->hidden, T * c->hidden, T * qd, T * kd, T * kd, T * qd, T * c->hidden, T * c->ffn,
                      T * c->ffn, (size_t)max_out * c->hidden, (size_t)n_threads * ops_attention_scratch(kv)};
    float **ptrs[] = {&s->x, &s->xn, &s->q, &s->k, &s->v, &s->att, &s->tmp, &s->gate, &s->up, &s->rows, &s->attn};
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (posix_memalign((void **)ptrs[i], 64, sizes[i] * sizeof(float) + 64)) ok = 0;
        else memset(*ptrs[i], 0, sizes[i] * sizeof(float)); /* resident from the start */
    }
    s->mm_size = mm_scratch_need(m, max_tokens);
    if (ok && s->mm_size && posix_memalign(&s->mm, 64, s->mm_size)) ok = 0;
    else if (ok && s->mm_size) memset(s->mm, 0, s->mm_size); /* resident from the start: fit predicts it */
    s->max_tokens = max_tokens;
    s->max_out = max_out;
    if (!ok) {
        model_scratch_free(s);
        return err_set(err, HEARTH_ERR_NOMEM, "cannot allocate scratch for %d tokens", max_tokens);
    }
    *out = s;
    return HEARTH_OK;
}

void model_scratch_free(model_scratch *s) {
    if (!s) return;
    float *ptrs[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->tmp, s->gate, s->up, s->rows, s->attn};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    free(s->mm);
    free(s);
}

static hearth_status matmul(const decoder_step *d, const op_weight *w, const float *x, int T, float *y) {
    if (d->b->batch_invariant) return cpu_matmul_invariant(w, x, T, y, d->s->mm, d->s->mm_size, d->tp, d->err);
    return cpu_matmul(w, x, T, y, d->s->mm, d->s->mm_size, d->tp, d->err);
}

/* Weights that read the same input (q/k/v, gate/up) in one thread-pool round: decode of
 * small models is bound by the number of rounds, not by the weights' bytes. */
static hearth_status matmul_fused(const decoder_step *d, int count, const op_weight *const *ws, float *const *ys,
                                  const float *x) {
    return cpu_matmul_fused(count, ws, ys, x, d->b->T, d->s->mm, d->s->mm_size, d->tp, d->b->batch_invariant,
                            d->err);
}

/* Row `token` of the embedding, dequantized a block at a time. */
static void embed_row(const op_weight *w, int64_t token, float *out) {
    int chunk = w->dtype == DT_U32 ? 32 : tensor_dtype_block_elems(w->dtype);
    if (chunk <= 1) chunk = 256;
    for (int64_t k0 = 0; k0 < w->k; k0 += chunk) {
        int count = (int)(w->k - k0 < chunk ? w->k - k0 : chunk);
        op_weight_dequant(w, token, k0, count, out + k0);
    }
}

/* Rows [EMBED_ROWS * task, +EMBED_ROWS) of a step's embeddings, scaled (Gemma) as a whole
 * pass would: each element is its own dequantization and product, so any split of the rows
 * gives the same bits. */
#define EMBED_ROWS 32
static void embed_task(void *ctx, int task, int thread) {
    (void)thread;
    const decoder_step *d = ctx;
    const model *m = d->m;
    int t0 = task * EMBED_ROWS, t1 = t0 + EMBED_ROWS < d->b->T ? t0 + EMBED_ROWS : d->b->T;
    float *x = d->s->x + (size_t)t0 * m->cfg.hidden;
    for (int t = t0; t < t1; t++) embed_row(&m->embed, d->b->tokens[t], d->s->x + (size_t)t * m->cfg.hidden);
    if (m->cfg.embed_scale != 1.0f) ops_scale(x, m->cfg.embed_scale, (size_t)(t1 - t0) * m->cfg.hidden);
}

hearth_status decoder_embed(const decoder_step *d) {
    const model *m = d->m;
    for (int t = 0; t < d->b->T; t++) {
        int32_t tok = d->b->tokens[t];
        if (tok < 0 || tok >= m->cfg.vocab)
            return err_set(d->err, HEARTH_ERR_INVALID, "token id %d is outside the vocabulary (0..%d)", tok,
                           m->cfg.vocab - 1);
    }
    /* A prefill chunk's rows are dequantized across the pool (on the GPU path the device
     * waits for them: 4096 rows of an 8B model's table took tens of ms on one core); a
     * decode step's few rows stay on this thread (waking the pool costs more). */
    tp_run(d->tp, (d->b->T + EMBED_ROWS - 1) / EMBED_ROWS, embed_task, (void *)d); /* one task: inline */
    return HEARTH_OK;
}

static void add_bias(float *y, const float *bias, int T, int n) {
    if (!bias) return;
    for (int t = 0; t < T; t++) ops_add(y + (size_t)t * n, bias, (size_t)n);
}

hearth_status decoder_attention(const decoder_step *d, int layer) {
    const model_config *c = &d->m->cfg;
    const layer_weights *l = &d->m->layers[layer];
    model_scratch *s = d->s;
    int T = d->b->T, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    hearth_status st;
    const op_weight *qkv[] = {&l->q, &l->k, &l->v};
    float *const qkv_out[] = {s->q, s->k, s->v};
    if ((st = matmul_fused(d, 3, qkv, qkv_out, s->xn))) return st;
    add_bias(s->q, l->q_bias, T, qd);
    add_bias(s->k, l->k_bias, T, kd);
    add_bias(s->v, l->v_bias, T, kd);
    if (l->q_norm) ops_rmsnorm(s->q, s->q, l->q_norm, c->norm_shift, T * c->n_heads, c->head_dim, c->norm_eps);
    if (l->k_norm) ops_rmsnorm(s->k, s->k, l->k_norm, c->norm_shift, T * c->n_kv_heads, c->head_dim, c->norm_eps);
    const float *freq = l->sliding ? c->inv_freq_local : c->inv_freq_global;
    ops_rope(s->q, T, c->n_heads, c->head_dim, d->b->pos, freq, c->rope_adjacent);
    ops_rope(s->k, T, c->n_kv_heads, c->head_dim, d->b->pos, freq, c->rope_adjacent);
    for (int t = 0; t < T; t++) /* the new keys and values join the cache before attending */
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t off = (size_t)t * kd + (size_t)h * c->head_dim;
            kv_store(d->kv, layer, d->b->slot[t], d->b->pos[t], h, s->k + off, s->v + off);
        }
    ops_attention_args a = {.kv = d->kv, .layer = layer, .q = s->q, .out = s->att, .T = T, .n_heads = c->n_heads,
                            .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .pos = d->b->pos,
                            .slot = d->b->slot, .window = l->sliding ? c->sliding_window : 0,
                            .scale = c->attn_scale, .scratch = s->attn};
    ops_attention(&a, d->tp);
    return matmul(d, &l->o, s->att, T, s->tmp);
}

hearth_status decoder_mlp(const decoder_step *d, int layer, decoder_act act) {
    const layer_weights *l = &d->m->layers[layer];
    model_scratch *s = d->s;
    int T = d->b->T;
    hearth_status st;
    const op_weight *gate_up[] = {&l->gate, &l->up};
    float *const gate_up_out[] = {s->gate, s->up};
    if ((st = matmul_fused(d, 2, gate_up, gate_up_out, s->xn))) return st;
    size_t n = (size_t)T * d->m->cfg.ffn;
    if (act == ACT_SILU) ops_silu_mul(s->gate, s->up, n);
    else ops_gelu_tanh_mul(s->gate, s->up, n);
    return matmul(d, &l->down, s->gate, T, s->tmp);
}

hearth_status decoder_logits(const decoder_step *d) {
    const model_config *c = &d->m->cfg;
    const model_batch *b = d->b;
    for (int i = 0; i < b->n_out; i++) {
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->T)
            return err_set(d->err, HEARTH_ERR_INVALID, "logits row %d outside the batch", b->out_rows[i]);
        memcpy(d->s->rows + (size_t)i * c->hidden, d->s->x + (size_t)b->out_rows[i] * c->hidden,
               (size_t)c->hidden * sizeof(float));
    }
    ops_rmsnorm(d->s->rows, d->s->rows, d->m->final_norm, c->norm_shift, b->n_out, c->hidden, c->norm_eps);
    return matmul(d, &d->m->lm_head, d->s->rows, b->n_out, b->logits);
}

hearth_status model_forward(const model *m, kv_cache *kv, model_scratch *s, const model_batch *b, threadpool *tp,
                            hearth_error *err) {
    if (b->T <= 0 || b->T > s->max_tokens || b->n_out < 0 || b->n_out > s->max_out)
        return err_set(err, HEARTH_ERR_INVALID, "batch of %d tokens / %d logits rows exceeds the scratch (%d / %d)",
                       b->T, b->n_out, s->max_tokens, s->max_out);
    for (int t = 0; t < b->T; t++)
        if (b->slot[t] < 0 || b->slot[t] >= kv->max_slots || b->pos[t] < 0 || b->pos[t] >= kv->n_tokens[b->slot[t]])
            return err_set(err, HEARTH_ERR_INVALID, "token %d: position %d of slot %d is not reserved", t, b->pos[t],
                           b->slot[t]);
    decoder_step d = {.m = m, .kv = kv, .s = s, .b = b, .tp = tp, .err = err};
    return m->cfg.family == FAMILY_GEMMA3 ? gemma3_forward(&d) : llama_forward(&d);
}
