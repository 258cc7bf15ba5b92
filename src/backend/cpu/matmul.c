/* matmul.c: the CPU matmul entry point: validates the weight, picks the kernel for the
 * active ISA level, prepares activations (int8 blocks for integer-dot kernels) and splits
 * the output rows over the thread pool in contiguous chunks. Kernels live in kernels_*.c;
 * this file must not contain format-specific arithmetic. */
#include "backend/cpu/kernels.h"
#include "base/err.h"
#include <math.h>
#include <pthread.h>
#include <string.h>

/* Rows per task are a multiple of 16 so that no two threads write the same 64-byte line
 * of y (16 floats), and each thread reads a contiguous stretch of weights. */
#define CPU_ROW_ALIGN 16
/* Tasks per thread: a few, so a thread slowed by another process does not hold up the
 * rest, but few enough that each task streams a long contiguous run of weights. */
#define CPU_TASKS_PER_THREAD 4
/* For T > 1, rows are processed in tiles of about this many weight bytes so a tile stays
 * in L1/L2 while every activation row passes over it (weight reuse for prefill). */
#define CPU_TILE_BYTES (32 * 1024)
/* ...but at least this many rows: the packed prefill GEMMs (kernels_avx2.c p2_*,
 * kernels_avx512.c pk_*) re-read every token's activations once per tile pass, so a tile of
 * 16 long rows (K = 8192) streamed T x 10 KiB of activations per 16 rows from L3. */
#define CPU_TILE_MIN_ROWS 64
/* Below this many weight bytes per call a matmul runs on the calling thread alone. */
#define CPU_INLINE_BYTES (64 * 1024)

static cpu_level g_level;
static pthread_once_t g_level_once = PTHREAD_ONCE_INIT;
static void level_init(void) { g_level = cpu_level_active(); }

cpu_level cpu_matmul_level(void) {
    pthread_once(&g_level_once, level_init);
    return g_level;
}

cpu_level cpu_matmul_set_level(cpu_level level) {
    pthread_once(&g_level_once, level_init);
    cpu_level hw = cpu_level_hardware();
    g_level = level < hw ? level : hw;
    return g_level;
}

/* precise: the float-activation kernel where the format has one (kernels_f32act.c), on the
 * fast tiers; the scalar tier is already exact. */
static cpu_kernel pick_kernel_for(const op_weight *w, int precise) {
    cpu_kernel k = {cpu_ref_rows, CPU_ACT_F32, NULL, NULL, 0};
    cpu_level level = cpu_matmul_level();
    if (precise && level >= CPU_LEVEL_AVX2 && cpu_f32act_kernel(w, level, &k)) return k;
    if (level >= CPU_LEVEL_AVX512 && cpu_avx512_kernel(w, &k)) return k;
    if (level >= CPU_LEVEL_AVX2 && cpu_avx2_kernel(w, &k)) return k;
    return k;
}

static cpu_kernel pick_kernel(const op_weight *w) { return pick_kernel_for(w, 0); }

int cpu_matmul_is_fast(const op_weight *w) { return pick_kernel(w).rows != cpu_ref_rows; }

size_t cpu_matmul_scratch_size(const op_weight *w, int T) {
    if (T <= 0 || w->k <= 0 || w->k % 32) return 0;
    cpu_act act = pick_kernel(w).act;
    if (act == CPU_ACT_F32) return 0;
    if (act == CPU_ACT_BF16) return (size_t)T * (size_t)w->k * sizeof(uint16_t);
    return (size_t)T * (size_t)(w->k / 32) * sizeof(cpu_q8_block);
}

/* Quantizes one row of k floats (k a multiple of 32) into int8 blocks. */
void cpu_quantize_row_ref(const float *x, int64_t k, cpu_q8_block *out, int evenodd) {
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        cpu_q8_block *o = &out[b];
        o->d = d;
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 32; j++) {
            int src = evenodd ? (j < 16 ? 2 * j : 2 * (j - 16) + 1) : j;
            int q = (int)lrintf(xb[src] * id); /* |x * id| <= 127 (+ rounding) */
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            o->q[j] = (int8_t)q;
            if (j < 16) s0 += q;
            else s1 += q;
        }
        o->sum16[0] = (int16_t)s0;
        o->sum16[1] = (int16_t)s1;
    }
}

void cpu_quantize_row(const float *x, int64_t k, cpu_q8_block *out, int evenodd) {
    /* the scalar loop took ~4% of prefill and sits between pool rounds in decode */
    cpu_level level = cpu_matmul_level();
    if (level >= CPU_LEVEL_AVX512) cpu_avx512_quantize_row(x, k, out, evenodd);
    else if (level >= CPU_LEVEL_AVX2) cpu_avx2_quantize_row(x, k, out, evenodd);
    else cpu_quantize_row_ref(x, k, out, evenodd);
}

/* One weight of a (possibly fused) matmul call: its kernel, output and row split. */
typedef struct mm_part {
    const op_weight *w;
    cpu_kernel kern;
    float *y;
    int64_t rows_per_task, tile_rows;
    int first_task; /* tasks first_task.. of the job belong to this part */
} mm_part;

typedef struct mm_job {
    mm_part part[CPU_MATMUL_MAX_FUSED];
    int n_parts;
    const float *x;
    cpu_q8_block *xq; /* the activations quantized once for every part */
    uint16_t *xb;     /* or rounded to bf16 once (CPU_ACT_BF16), k per row */
    int64_t k;
    cpu_act act;
    int T;
    int invariant; /* cpu_matmul_invariant: never the multi-token tile kernel */
} mm_job;

static void quantize_task(void *ctx, int t, int thread) {
    mm_job *j = ctx;
    int64_t nb = j->k / 32;
    if (j->act == CPU_ACT_BF16) {
        cpu_avx512_bf16_row(j->x + (int64_t)t * j->k, j->k, j->xb + (int64_t)t * j->k);
        return;
    }
    cpu_quantize_row(j->x + (int64_t)t * j->k, j->k, j->xq + t * nb, j->act == CPU_ACT_Q8_EVENODD);
}

static void rows_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    const mm_part *p = &j->part[0];
    for (int i = 1; i < j->n_parts && task >= j->part[i].first_task; i++) p = &j->part[i];
    int64_t n0 = (task - p->first_task) * p->rows_per_task, n1 = n0 + p->rows_per_task;
    if (n1 > p->w->n) n1 = p->w->n;
    int64_t nb = j->k / 32;
    for (int64_t r0 = n0; r0 < n1; r0 += p->tile_rows) {
        int64_t r1 = r0 + p->tile_rows < n1 ? r0 + p->tile_rows : n1;
        if (p->kern.tile && j->T > 1 && !j->invariant) {
            int below = p->kern.small_below ? p->kern.small_below : CPU_TILE_SMALL_T;
            cpu_tile_fn tile = j->T < below && p->kern.tile_small ? p->kern.tile_small : p->kern.tile;
            if (j->act == CPU_ACT_F32) /* dense formats: the float rows, k floats apart */
                tile(p->w, r0, r1, j->x, j->k, j->T, p->y, p->w->n);
            else if (j->act == CPU_ACT_BF16) /* or their bf16 copies, k values apart */
                tile(p->w, r0, r1, j->xb, j->k, j->T, p->y, p->w->n);
            else
                tile(p->w, r0, r1, j->xq, nb, j->T, p->y, p->w->n);
            continue;
        }
        if (p->kern.rows == cpu_ref_rows && j->T > 1) { /* bit-identical to the loop below */
            cpu_ref_tile(p->w, r0, r1, j->x, j->k, j->T, p->y, p->w->n);
            continue;
        }
        for (int t = 0; t < j->T; t++) {
            const void *xt = j->act == CPU_ACT_F32    ? (const void *)(j->x + (int64_t)t * j->k)
                             : j->act == CPU_ACT_BF16 ? (const void *)(j->xb + (int64_t)t * j->k)
                                                      : (const void *)(j->xq + t * nb);
            p->kern.rows(p->w, r0, r1, xt, p->y + (int64_t)t * p->w->n);
        }
    }
}

/* invariant (deterministic mode, hearth_engine_options.deterministic): every token row is
 * computed exactly as a T = 1 call would: the rows kernel (never the tile kernel, whose
 * reduction may group differently). How output rows are split over threads and fused
 * calls never changes a row's arithmetic (each output row is one kernel's full K loop,
 * the same whether it runs in a 4-row pass or alone). Threads never split K in either mode.
 * Note for kernel work: keep this flag's promise when changing kernels or splits. */
static hearth_status matmul_run(int count, const op_weight *const *ws, float *const *ys, const float *x, int T,
                                void *scratch, size_t scratch_size, threadpool *tp, int invariant, int precise,
                                hearth_error *err) {
    if (count < 1 || count > CPU_MATMUL_MAX_FUSED)
        return err_set(err, HEARTH_ERR_INVALID, "matmul: %d fused weights (want 1..%d)", count,
                       CPU_MATMUL_MAX_FUSED);
    hearth_status st;
    for (int i = 0; i < count; i++)
        if ((st = op_weight_check(ws[i], "matmul weight", err))) return st;
    if (T <= 0) return T == 0 ? HEARTH_OK : err_set(err, HEARTH_ERR_INVALID, "matmul: T = %d", T);
    mm_job j = {.n_parts = count, .x = x, .k = ws[0]->k, .T = T, .invariant = invariant};
    int64_t bytes = 0;
    for (int i = 0; i < count; i++) {
        j.part[i] = (mm_part){.w = ws[i], .kern = pick_kernel_for(ws[i], precise), .y = ys[i]};
        bytes += op_weight_row_bytes(ws[i]) * ws[i]->n;
    }
    j.act = j.part[0].kern.act;
    for (int i = 1; i < count; i++) /* one shared activation: same K and the same preparation */
        if (ws[i]->k != j.k || j.part[i].kern.act != j.act) {
            for (int p = 0; p < count && !st; p++)
                st = matmul_run(1, &ws[p], &ys[p], x, T, scratch, scratch_size, tp, invariant, precise, err);
            return st;
        }
    if (j.act != CPU_ACT_F32) {
        size_t need = cpu_matmul_scratch_size(ws[0], T); /* never more than a precise call's kernel needs */
        if (!scratch || scratch_size < need)
            return err_set(err, HEARTH_ERR_INVALID, "matmul: scratch of %zu bytes, need %zu", scratch_size, need);
        j.xq = scratch;
        j.xb = scratch;
        /* One row takes well under a microsecond: a fork-join round of the pool would cost
         * more than it saves (decode calls this for every weight, every token). */
        if (T == 1) quantize_task(&j, 0, 0);
        else tp_run(tp, T, quantize_task, &j);
    }
    int threads = tp_threads(tp);
    /* Small work stays on the calling thread: waking the pool costs a few microseconds,
     * about what one core needs to stream 64 KiB (tiny models ran 20x slower with two
     * threads than with one before this). */
    if (bytes * (invariant ? 1 : T) < CPU_INLINE_BYTES) threads = 1;
    int tasks_total = 0;
    for (int i = 0; i < count; i++) {
        mm_part *p = &j.part[i];
        int64_t rb = op_weight_row_bytes(p->w), n = p->w->n;
        int64_t groups = (n + CPU_ROW_ALIGN - 1) / CPU_ROW_ALIGN;
        int64_t tasks = (int64_t)threads * CPU_TASKS_PER_THREAD;
        if (threads == 1) tasks = 1;
        if (tasks > groups) tasks = groups;
        p->rows_per_task = (groups + tasks - 1) / tasks * CPU_ROW_ALIGN;
        /* Tiles of whole 16-row groups: the AVX-512 prefill kernels pack 16 rows at a time. */
        int64_t tile = (CPU_TILE_BYTES / rb + CPU_ROW_ALIGN - 1) / CPU_ROW_ALIGN * CPU_ROW_ALIGN;
        if (tile < CPU_TILE_MIN_ROWS) tile = CPU_TILE_MIN_ROWS;
        p->tile_rows = T == 1 || invariant ? p->rows_per_task : tile > 0 ? tile : CPU_ROW_ALIGN;
        p->first_task = tasks_total;
        tasks_total += (int)((n + p->rows_per_task - 1) / p->rows_per_task);
    }
    if (threads == 1)
        for (int t = 0; t < tasks_total; t++) rows_task(&j, t, 0);
    else tp_run(tp, tasks_total, rows_task, &j);
    return HEARTH_OK;
}

hearth_status cpu_matmul(const op_weight *w, const float *x, int T, float *y, void *scratch,
                         size_t scratch_size, threadpool *tp, hearth_error *err) {
    return matmul_run(1, &w, &y, x, T, scratch, scratch_size, tp, 0, 0, err);
}

hearth_status cpu_matmul_invariant(const op_weight *w, const float *x, int T, float *y, void *scratch,
                                   size_t scratch_size, threadpool *tp, hearth_error *err) {
    return matmul_run(1, &w, &y, x, T, scratch, scratch_size, tp, 1, 0, err);
}

hearth_status cpu_matmul_fused(int count, const op_weight *const *ws, float *const *ys, const float *x, int T,
                               void *scratch, size_t scratch_size, threadpool *tp, int invariant,
                               hearth_error *err) {
    return matmul_run(count, ws, ys, x, T, scratch, scratch_size, tp, invariant, 0, err);
}

hearth_status cpu_matmul_precise(int count, const op_weight *const *ws, float *const *ys, const float *x, int T,
                                 void *scratch, size_t scratch_size, threadpool *tp, int invariant,
                                 hearth_error *err) {
    return matmul_run(count, ws, ys, x, T, scratch, scratch_size, tp, invariant, 1, err);
}

/* Output rows rescored per activation row: the largest values of the fast result. The
 * quality benchmark's top-1 and p99 KL did not move between 4 and all 49152 logits of
 * SmolLM2 rescored; 16 keeps the whole probable head of the distribution exact. */
#define CPU_RESCORE_TOP 16

/* The indices of the k largest values of y[0..n) (k <= n; any order among them); NaN and
 * -inf are never kept, so fewer than k come back only where y has fewer other values. One
 * pass keeping the k best seen: the vector scan skips every value not above the smallest
 * kept (nearly all of a vocabulary). AVX2 is there: rescoring runs only after a fast kernel. */
static int top_indices(const float *y, int64_t n, int k, int64_t *idx) {
    float val[CPU_RESCORE_TOP];
    int kept = 0, low = 0;
    float floor = -INFINITY;
    for (int64_t i = 0; (i = cpu_avx2_find_above(y, i, n, floor)) < n; i++) {
        if (kept < k) {
            val[kept] = y[i], idx[kept++] = i;
            if (kept < k) continue;
        } else
            val[low] = y[i], idx[low] = i;
        low = 0; /* the smallest kept: the next to be replaced */
        for (int j = 1; j < k; j++) low = val[j] < val[low] ? j : low;
        floor = val[low];
    }
    return kept;
}

typedef struct rescore_job {
    const op_weight *w;
    const float *x;
    float *y;
    int k;
} rescore_job;

static void rescore_task(void *ctx, int t, int thread) {
    const rescore_job *j = ctx;
    float *y = j->y + (int64_t)t * j->w->n, exact[CPU_RESCORE_TOP];
    int64_t idx[CPU_RESCORE_TOP] = {0};
    int kept = top_indices(y, j->w->n, j->k, idx);
    cpu_ref_rows_at(j->w, idx, kept, j->x + (int64_t)t * j->w->k, exact);
    for (int i = 0; i < kept; i++) y[idx[i]] = exact[i];
}

hearth_status cpu_matmul_rescore_top(const op_weight *w, const float *x, int T, float *y, threadpool *tp,
                                     hearth_error *err) {
    hearth_status st = op_weight_check(w, "rescored weight", err);
    if (st || T <= 0 || pick_kernel(w).act == CPU_ACT_F32) return st; /* the activations were not rounded */
    rescore_job j = {.w = w, .x = x, .y = y, .k = w->n < CPU_RESCORE_TOP ? (int)w->n : CPU_RESCORE_TOP};
    /* one row is ~20 microseconds: a pool round is not worth it for one */
    if (T == 1) rescore_task(&j, 0, 0);
    else tp_run(tp, T, rescore_task, &j);
    return HEARTH_OK;
}
