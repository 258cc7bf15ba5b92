/* ops.c: the parts of a step every backend shares, in plain C: the batch checks and the
 * embedding rows (made on the host with the scalar dequantizer, so every backend starts
 * from the same bits). The ops themselves are the backends'. */
#include "ops/ops.h"
#include "base/cpu_features.h"
#include "base/err.h"
#include "ops/op_exp.h"
#include <math.h>
#include <string.h>

hearth_status op_batch_check(const op_batch *b, const kv_cache *kv, int max_tokens, int max_out, hearth_error *err) {
    if (b->T <= 0 || b->T > max_tokens || b->n_out < 0 || b->n_out > max_out)
        return err_set(err, HEARTH_ERR_INVALID, "batch of %d tokens / %d logits rows exceeds the scratch (%d / %d)",
                       b->T, b->n_out, max_tokens, max_out);
    for (int t = 0; t < b->T; t++)
        if (b->slot[t] < 0 || b->slot[t] >= kv->max_slots || b->pos[t] < 0 || b->pos[t] >= kv->n_tokens[b->slot[t]])
            return err_set(err, HEARTH_ERR_INVALID, "token %d: position %d of slot %d is not reserved", t, b->pos[t],
                           b->slot[t]);
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->T)
            return err_set(err, HEARTH_ERR_INVALID, "logits row %d outside the batch", b->out_rows[i]);
    return HEARTH_OK;
}

typedef struct embed_job {
    const op_embed *e;
    const int32_t *tokens;
    int T;
    float *x;
} embed_job;

/* Rows [EMBED_ROWS * task, +EMBED_ROWS) of a step's embeddings, scaled (Gemma) as a whole
 * pass would: each element is its own dequantization and product, so any split of the rows
 * gives the same bits. */
#define EMBED_ROWS 32
static void embed_task(void *ctx, int task, int thread) {
    (void)thread;
    const embed_job *j = ctx;
    int64_t H = j->e->table->k;
    int t0 = task * EMBED_ROWS, t1 = t0 + EMBED_ROWS < j->T ? t0 + EMBED_ROWS : j->T;
    for (int t = t0; t < t1; t++) {
        float *row = j->x + (size_t)t * H;
        op_weight_dequant_row(j->e->table, j->tokens[t], row);
        if (j->e->scale != 1.0f)
            for (int64_t i = 0; i < H; i++) row[i] *= j->e->scale;
    }
}

hearth_status op_embed_rows(const op_embed *e, const int32_t *tokens, int T, int vocab, float *x, threadpool *tp,
                            hearth_error *err) {
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= vocab)
            return err_set(err, HEARTH_ERR_INVALID, "token id %d is outside the vocabulary (0..%d)", tokens[t],
                           vocab - 1);
    /* A prefill chunk's rows are dequantized across the pool (on the GPU the device waits
     * for them); a decode step's few rows stay on this thread (waking the pool costs more). */
    embed_job j = {.e = e, .tokens = tokens, .T = T, .x = x};
    tp_run(tp, (T + EMBED_ROWS - 1) / EMBED_ROWS, embed_task, &j); /* one task: inline */
    return HEARTH_OK;
}

op_weight op_weight_rows(const op_weight *w, int64_t row0, int64_t rows) {
    op_weight v = *w;
    v.n = rows;
    if (w->data) v.data = (const uint8_t *)w->data + row0 * op_weight_row_bytes(w);
    if (w->dtype == DT_U32 && w->scales) { /* MLX affine: [n, k / group] scales and biases */
        size_t sb = w->sb_dtype == DT_F32 ? 4 : 2, per_row = (size_t)(w->k / w->group_size) * sb;
        v.scales = (const uint8_t *)w->scales + (size_t)row0 * per_row;
        v.biases = (const uint8_t *)w->biases + (size_t)row0 * per_row;
    }
    return v;
}

typedef struct lora_job {
    const op_batch *b;
    int layer;
    op_proj p;
    const float *x;
    int64_t k, n;
    float *y;
    int rows; /* per task */
    /* expert pairs (op_lora_apply_expert): the expert, and row i's token tok[i] of n_rows */
    int expert, n_rows;
    const int32_t *tok;
} lora_job;

/* y += scale * B (A x) for one row and one adapter: A x with eight partial sums per row of A
 * (combined in a fixed order, so the compiler may vectorize), then B's rows (B transposed:
 * contiguous over the outputs) summed over the rank in order, a chunk of outputs at a time. */
#define LORA_CHUNK 256
static void lora_row(const op_lora *l, const float *x, int64_t k, float *y, int64_t n) {
    float u[OP_LORA_MAX_RANK], acc[LORA_CHUNK];
    for (int r = 0; r < l->rank; r++) {
        const float *a = l->a + (size_t)r * k;
        float part[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= k; i += 8)
            for (int j = 0; j < 8; j++) part[j] += a[i + j] * x[i + j];
        for (; i < k; i++) part[0] += a[i] * x[i];
        u[r] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
    for (int64_t j0 = 0; j0 < n; j0 += LORA_CHUNK) {
        int c = (int)(n - j0 < LORA_CHUNK ? n - j0 : LORA_CHUNK);
        memset(acc, 0, (size_t)c * sizeof *acc);
        for (int r = 0; r < l->rank; r++) {
            const float *b = l->b + (size_t)r * n + j0;
            for (int j = 0; j < c; j++) acc[j] += b[j] * u[r];
        }
        for (int j = 0; j < c; j++) y[j0 + j] += l->scale * acc[j];
        if (l->dora)
            for (int j = 0; j < c; j++) y[j0 + j] *= l->dora[j0 + j];
    }
}

/* Rows [rows * task, +rows): each row alone, so any split gives the same bits. */
static void lora_task(void *ctx, int task, int thread) {
    (void)thread;
    const lora_job *j = ctx;
    int t0 = task * j->rows, t1 = t0 + j->rows < j->n_rows ? t0 + j->rows : j->n_rows;
    for (int t = t0; t < t1; t++) {
        const op_adapter_set *set = j->b->row_adapters[j->tok ? j->tok[t] : t];
        for (int i = 0; set && i < set->n; i++) {
            op_lora l = set->a[i]->proj[(size_t)j->layer * OP_N_PROJ + j->p];
            if (!l.a) continue;
            if (l.experts) { /* expert e's pair of the stacked ones */
                if (j->expert < 0 || j->expert >= l.experts) continue;
                l.a += (size_t)j->expert * l.rank * j->k;
                l.b += (size_t)j->expert * l.rank * j->n;
            }
            lora_row(&l, j->x + (size_t)t * j->k, j->k, j->y + (size_t)t * j->n, j->n);
        }
    }
}

static void lora_run(lora_job *j, threadpool *tp) {
    /* about two tasks per thread: a decode step's few rows still spread over the pool */
    int threads = tp ? tp_threads(tp) : 1;
    j->rows = (j->n_rows + 2 * threads - 1) / (2 * threads);
    if (j->n_rows > 0) tp_run(tp, (j->n_rows + j->rows - 1) / j->rows, lora_task, j);
}

void op_lora_apply(const op_batch *b, int layer, op_proj p, const float *x, int64_t k, float *y, int64_t n,
                   threadpool *tp) {
    if (!op_batch_has_adapters(b)) return;
    lora_job j = {.b = b, .layer = layer, .p = p, .x = x, .k = k, .n = n, .y = y, .expert = -1, .n_rows = b->T};
    lora_run(&j, tp);
}

int op_batch_adapts(const op_batch *b, int layer, op_proj p) {
    for (int t = 0; b->row_adapters && t < b->T; t++) {
        const op_adapter_set *set = b->row_adapters[t];
        for (int i = 0; set && i < set->n; i++)
            if (set->a[i]->proj[(size_t)layer * OP_N_PROJ + p].a) return 1;
    }
    return 0;
}

void op_lora_apply_expert(const op_batch *b, int layer, op_proj p, int e, const int32_t *tok, int rows, const float *x,
                          int64_t k, float *y, int64_t n, threadpool *tp) {
    if (!op_batch_has_adapters(b)) return;
    lora_job j = {
        .b = b, .layer = layer, .p = p, .x = x, .k = k, .n = n, .y = y, .expert = e, .n_rows = rows, .tok = tok};
    lora_run(&j, tp);
}

/* op_moe_route's rule (ops.h). op_expf is fmaf calls: on an x86 build without -mfma those are
 * libm calls (about 40x an inlined instruction; prefill routes every token over every
 * expert), so the rule is compiled twice, once with the FMA instruction set, which gives the
 * same bits (a fused multiply-add is one rounding either way), and picked at run time. */
static inline void moe_route_rule(const op_moe *m, float *g, int E, int K, int32_t *sel, float *w) {
    int topk_softmax = m->router_norm != NULL;
    float mx = g[0], sum = 0.0f, total = 0.0f;
    if (!topk_softmax) {
        for (int e = 1; e < E; e++) mx = g[e] > mx ? g[e] : mx;
        for (int e = 0; e < E; e++) sum += (g[e] = op_expf(g[e] - mx));
        for (int e = 0; e < E; e++) g[e] /= sum;
    }
    /* the chosen experts' flags (a pass over the earlier picks where E is past the table) */
    unsigned char taken[1024];
    int flags = E <= (int)sizeof taken;
    if (flags) memset(taken, 0, (size_t)E);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int t = 0;
            if (flags)
                t = taken[e];
            else
                for (int j = 0; j < k; j++) t |= sel[j] == e;
            if (!t && (best < 0 || g[e] > g[best])) best = e;
        }
        sel[k] = best;
        if (flags) taken[best] = 1;
        total += (w[k] = g[best]);
    }
    if (topk_softmax) { /* w[0] is the largest logit */
        float top = w[0], z = 0.0f;
        for (int k = 0; k < K; k++) z += (w[k] = op_expf(w[k] - top));
        for (int k = 0; k < K; k++) w[k] = w[k] / z * m->expert_scale[sel[k]];
    } else if (m->norm_topk)
        for (int k = 0; k < K; k++) w[k] /= total;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"))) static void moe_route_fma(const op_moe *m, float *g, int E, int K, int32_t *sel,
                                                         float *w) {
    moe_route_rule(m, g, E, K, sel, w);
}
#endif

void op_moe_route(const op_moe *m, float *g, int E, int K, int32_t *sel, float *w) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_features_get()->fma) {
        moe_route_fma(m, g, E, K, sel, w);
        return;
    }
#endif
    moe_route_rule(m, g, E, K, sel, w);
}
