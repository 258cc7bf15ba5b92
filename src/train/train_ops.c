/* train_ops.c: the float32 forward and backward kernels of LoRA training (train_ops.h).
 * Portable C with GCC vector types; the products that carry nearly all the work go to
 * tr_gemm (train_gemm.c), the exponentials to a 16-wide exp built for AVX-512 and the
 * baseline. */
#include "train/train_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* v8 helpers are always inlined: the AVX ABI note for vector returns does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8 __attribute__((vector_size(32)));
#define INL static inline __attribute__((always_inline))

INL v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
INL void st8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
INL float hsum(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

INL float dotf(const float *a, const float *b, int64_t n) {
    v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += ld8(a + i) * ld8(b + i);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
INL void axpyf(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
    v8 av = {a, a, a, a, a, a, a, a};
    for (; i + 8 <= n; i += 8) st8(y + i, ld8(y + i) + av * ld8(x + i));
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---- the two products of a frozen linear ------------------------------------ */

void tr_matmul_nt(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, float *y, int acc) {
    tr_gemm(tp, M, N, K, x, K, 1, w, 1, K, y, N, acc ? TR_GEMM_ACC : 0);
}

void tr_matmul_nn(threadpool *tp, const float *dy, int64_t M, int64_t N, const float *w, int64_t K, float *dx) {
    tr_gemm(tp, M, K, N, dy, N, 1, w, K, 1, dx, K, TR_GEMM_ACC);
}

/* ---- linear with LoRA ----------------------------------------------------- *
 * The low-rank products are thin (r columns) but go to tr_gemm too; a [K, r] and b [r, N]
 * are read in place. */

static void scale_rows(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* DoRA's denom: the row norms of w + scale (a b)^T, in float32 as MLX computes them. */
static void dora_denom(const float *w, int64_t K, int64_t N, const tr_lora *l) {
    int64_t r = l->r;
    for (int64_t n = 0; n < N; n++) {
        float bcol[64], acc = 0;
        for (int64_t j = 0; j < r && j < 64; j++) bcol[j] = l->scale * l->b[j * N + n];
        for (int64_t k = 0; k < K; k++) {
            float v = w[n * K + k];
            for (int64_t j = 0; j < r && j < 64; j++) v += l->a[k * r + j] * bcol[j];
            acc += v * v;
        }
        l->denom[n] = sqrtf(acc);
    }
}

void tr_linear_fwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                   const tr_lora *l, float *xa, float *y) {
    if (w) tr_matmul_nt(tp, x, M, K, w, N, y, 0);
    if (bias && !(l && l->m))
        for (int64_t m = 0; m < M; m++) axpyf(y + m * N, 1.0f, bias, N);
    if (!l) return;
    int64_t r = l->r;
    tr_gemm(tp, M, r, K, x, K, 1, l->a, r, 1, xa, r, 0); /* xa = scale x a */
    scale_rows(xa, M * r, l->scale);
    tr_gemm(tp, M, N, r, xa, r, 1, l->b, N, 1, y, N, TR_GEMM_ACC); /* y += xa b */
    if (!l->m) return;
    dora_denom(w, K, N, l);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) y[m * N + n] = y[m * N + n] * (l->m[n] / l->denom[n]) + (bias ? bias[n] : 0.0f);
}

void tr_linear_bwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const tr_lora *l,
                   const float *xa, const float *dy, float *dx, float *scratch) {
    if (l && l->m) { /* DoRA: gm from the output before its scale (computed again), then dy scaled */
        float *pre = l->work;
        tr_matmul_nt(tp, x, M, K, w, N, pre, 0);
        tr_gemm(tp, M, N, l->r, xa, l->r, 1, l->b, N, 1, pre, N, TR_GEMM_ACC);
        for (int64_t n = 0; n < N; n++) {
            float acc = 0;
            for (int64_t m = 0; m < M; m++) acc += dy[m * N + n] * pre[m * N + n];
            l->gm[n] += acc / l->denom[n];
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) pre[m * N + n] = dy[m * N + n] * (l->m[n] / l->denom[n]);
        dy = pre;
    }
    if (dx && w) tr_matmul_nn(tp, dy, M, N, w, K, dx);
    if (!l) return;
    int64_t r = l->r;
    tr_gemm(tp, r, N, M, xa, 1, r, dy, N, 1, l->gb, N, TR_GEMM_ACC);  /* gb += (scale x a)^T dy */
    tr_gemm(tp, M, r, N, dy, N, 1, l->b, 1, N, scratch, r, 0);       /* dxa = scale dy b^T */
    scale_rows(scratch, M * r, l->scale);
    tr_gemm(tp, K, r, M, x, 1, K, scratch, r, 1, l->ga, r, TR_GEMM_ACC); /* ga += x^T dxa */
    if (dx) tr_gemm(tp, M, K, r, scratch, r, 1, l->a, 1, r, dx, K, TR_GEMM_ACC); /* dx += dxa a^T */
}

/* ---- RMSNorm ------------------------------------------------------------- */

void tr_rmsnorm_fwd(const float *x, int64_t M, int64_t D, const float *w, float eps, float *y, float *rstd) {
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * D;
        float s = dotf(xr, xr, D) / (float)D;
        float rs = 1.0f / sqrtf(s + eps);
        rstd[m] = rs;
        for (int64_t i = 0; i < D; i++) y[m * D + i] = xr[i] * rs * (w ? w[i] : 1.0f);
    }
}

void tr_rmsnorm_bwd(const float *x, int64_t M, int64_t D, const float *w, const float *rstd, const float *dy,
                    float *dx) {
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * D, *g = dy + m * D;
        float rs = rstd[m], dot = 0;
        for (int64_t i = 0; i < D; i++) dot += g[i] * (w ? w[i] : 1.0f) * xr[i];
        float c = dot * rs * rs / (float)D;
        for (int64_t i = 0; i < D; i++) dx[m * D + i] += rs * (g[i] * (w ? w[i] : 1.0f) - xr[i] * c);
    }
}

/* ---- RoPE ---------------------------------------------------------------- */

void tr_rope(float *x, int64_t T, int H, int hd, int rd, int pos0, const float *inv_freq, int adjacent, int sign) {
    int half = rd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float th = (float)(pos0 + t) * inv_freq[i];
            float c = cosf(th), s = sign * sinf(th);
            for (int h = 0; h < H; h++) {
                float *v = x + (t * H + h) * hd;
                float *a = adjacent ? v + 2 * i : v + i, *b = adjacent ? v + 2 * i + 1 : v + i + half;
                float x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
}

/* ---- exp over rows --------------------------------------------------------- */

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

/* exp of 16 floats: 2^n e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts)
 * and Cephes' degree-6 polynomial for e^r; within 2 ulp over [-87.3, 88.3] (x is clamped
 * there: below it the result is ~1e-38, not 0). */
INL v16 vexp(v16 x) {
    const v16 lo = (v16){0} - 87.3f, hi = (v16){0} + 88.3f;
    vi16 m = x < lo;
    x = (v16)(((vi16)x & ~m) | ((vi16)lo & m));
    m = x > hi;
    x = (v16)(((vi16)x & ~m) | ((vi16)hi & m));
    v16 t = x * 1.44269504088896341f + 0.5f;
    vi16 n = __builtin_convertvector(t, vi16);
    n += (vi16)(__builtin_convertvector(n, v16) > t); /* truncation to floor: -1 where it rounded up */
    v16 nf = __builtin_convertvector(n, v16);
    v16 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v16 p = (v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (v16)((n + 127) << 23);
}

INL float hsum16(v16 v) {
    return ((v[0] + v[8]) + (v[4] + v[12])) + ((v[2] + v[10]) + (v[6] + v[14])) +
           (((v[1] + v[9]) + (v[5] + v[13])) + ((v[3] + v[11]) + (v[7] + v[15])));
}

/* y[i] = exp(mul * x[i] - sub), returning their sum: 16 float lanes over runs of 256
 * values, each run's total added in double (a horizontal sum per vector would cost more
 * than the exp). y may be x. */
INL double exp_sum_body(const float *x, int64_t n, float mul, float sub, float *y) {
    double s = 0;
    int64_t i = 0;
    v16 acc = {0};
    for (; i + 16 <= n; i += 16) {
        v16 v;
        memcpy(&v, x + i, sizeof v);
        v = vexp(v * mul - sub);
        memcpy(y + i, &v, sizeof v);
        acc += v;
        if ((i & 255) == 240) s += hsum16(acc), acc = (v16){0};
    }
    s += hsum16(acc);
    if (i < n) { /* the tail through a zero-padded vector */
        v16 v = {0};
        memcpy(&v, x + i, sizeof(float) * (size_t)(n - i));
        v = vexp(v * mul - sub);
        memcpy(y + i, &v, sizeof(float) * (size_t)(n - i));
        for (int64_t j = 0; j < n - i; j++) s += v[j];
    }
    return s;
}

/* x = wt * softmax(mul * x) over n values (mul > 0); returns the log-sum-exp of mul * x. */
INL double softmax_body(float *x, int64_t n, float mul, float wt) {
    v16 m = (v16){0} - INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16 v;
        memcpy(&v, x + i, sizeof v);
        vi16 gt = v > m;
        m = (v16)(((vi16)v & gt) | ((vi16)m & ~gt));
    }
    float mx = -INFINITY;
    for (int j = 0; j < 16; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = exp_sum_body(x, n, mul, mul * mx, x);
    v16 f = (v16){0} + (float)(wt / sum);
    for (i = 0; i + 16 <= n; i += 16) {
        v16 v;
        memcpy(&v, x + i, sizeof v);
        v *= f;
        memcpy(x + i, &v, sizeof v);
    }
    for (; i < n; i++) x[i] *= f[0];
    return (double)(mul * mx) + log(sum);
}

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,fma")))
AVX512 static double exp_sum_avx512(const float *x, int64_t n, float mul, float sub, float *y) {
    return exp_sum_body(x, n, mul, sub, y);
}
static double exp_sum_base(const float *x, int64_t n, float mul, float sub, float *y) {
    return exp_sum_body(x, n, mul, sub, y);
}
AVX512 static double softmax_avx512(float *x, int64_t n, float mul, float wt) { return softmax_body(x, n, mul, wt); }
static double softmax_base(float *x, int64_t n, float mul, float wt) { return softmax_body(x, n, mul, wt); }
static int have_avx512(void) {
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return v;
}
static double exp_sum(const float *x, int64_t n, float mul, float sub, float *y) {
    return have_avx512() ? exp_sum_avx512(x, n, mul, sub, y) : exp_sum_base(x, n, mul, sub, y);
}
static double softmax(float *x, int64_t n, float mul, float wt) {
    return have_avx512() ? softmax_avx512(x, n, mul, wt) : softmax_base(x, n, mul, wt);
}

/* ---- rows over the pool --------------------------------------------------------- */

/* fn(ctx, row) for rows 0..n, in blocks handed to the pool: the row-wise steps between the
 * products (softmaxes, SiLU) would otherwise run on one core while the others wait. */
typedef void (*row_fn)(void *ctx, int64_t row);
typedef struct rows_job {
    row_fn fn;
    void *ctx;
    int64_t n, per;
} rows_job;

static void rows_task(void *vj, int task, int thread) {
    const rows_job *j = vj;
    int64_t r1 = ((int64_t)task + 1) * j->per < j->n ? ((int64_t)task + 1) * j->per : j->n;
    for (int64_t r = (int64_t)task * j->per; r < r1; r++) j->fn(j->ctx, r);
}

static void for_rows(threadpool *tp, int64_t n, row_fn fn, void *ctx) {
    int64_t tasks = 8 * (int64_t)tp_threads(tp);
    rows_job j = {.fn = fn, .ctx = ctx, .n = n, .per = (n + tasks - 1) / tasks};
    if (j.per < 1) j.per = 1;
    tp_run(tp, (int)((n + j.per - 1) / j.per), rows_task, &j);
}

/* ---- causal attention ----------------------------------------------------- *
 * Per query head h (group g = h / (Hq / Hkv)), with S = scale Q K^T and P its causal
 * softmax, every product goes to tr_gemm_batch (all heads in one call) with the causal
 * flags (half the work):
 * forward S = Q K^T, O = P V; backward dP = dO V^T, dS = P (dP - rowsum(P dP)),
 * dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO. */

typedef struct attn_rows {
    const float *p;
    float *s;
    int64_t T;
    float scale;
    int window;
} attn_rows;

/* row r (head r / T, query r % T) of S: its causal softmax (the masked tail zero), over the
 * last `window` keys only when window > 0 (the keys before them zero too) */
static void softmax_row(void *vc, int64_t r) {
    const attn_rows *c = vc;
    int64_t i = r % c->T, j0 = c->window > 0 && i + 1 > c->window ? i + 1 - c->window : 0;
    float *row = c->s + r * c->T;
    softmax(row + j0, i + 1 - j0, c->scale, 1.0f);
    memset(row, 0, sizeof(float) * (size_t)j0);
    memset(row + i + 1, 0, sizeof(float) * (size_t)(c->T - i - 1));
}

/* r[0..n) = scale p (r - sum_j p_j r_j): the softmax's backward over one row, in 16-wide
 * partial sums (the tail through zero-padded vectors: zeros add nothing). */
INL void dsoftmax_body(const float *p, float *r, int64_t n, float scale) {
    v16 acc = {0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        v16 a, b;
        memcpy(&a, p + j, sizeof a), memcpy(&b, r + j, sizeof b);
        acc += a * b;
    }
    v16 a = {0}, b = {0};
    memcpy(&a, p + j, sizeof(float) * (size_t)(n - j)), memcpy(&b, r + j, sizeof(float) * (size_t)(n - j));
    acc += a * b;
    float dot = hsum16(acc);
    for (j = 0; j + 16 <= n; j += 16) {
        memcpy(&a, p + j, sizeof a), memcpy(&b, r + j, sizeof b);
        b = scale * a * (b - dot);
        memcpy(r + j, &b, sizeof b);
    }
    for (; j < n; j++) r[j] = scale * p[j] * (r[j] - dot);
}
AVX512 static void dsoftmax_avx512(const float *p, float *r, int64_t n, float scale) { dsoftmax_body(p, r, n, scale); }
static void dsoftmax_base(const float *p, float *r, int64_t n, float scale) { dsoftmax_body(p, r, n, scale); }

/* row r of dP becomes dS = scale P (dP - sum_j P dP) (the masked tail zero; keys outside a
 * sliding window have P = 0, so their dS is zero too) */
static void dsoftmax_row(void *vc, int64_t row) {
    const attn_rows *c = vc;
    int64_t i = row % c->T;
    const float *pr = c->p + row * c->T;
    float *r = c->s + row * c->T;
    (have_avx512() ? dsoftmax_avx512 : dsoftmax_base)(pr, r, i + 1, c->scale);
    memset(r + i + 1, 0, sizeof(float) * (size_t)(c->T - i - 1));
}

void tr_attn_fwd(threadpool *tp, const float *q, const float *k, const float *v, int64_t T, int Hq, int Hkv, int hd,
                 float scale, int window, float *p, float *out) {
    int64_t qs = (int64_t)Hq * hd, ks = (int64_t)Hkv * hd, TT = T * T;
    int per = Hq / Hkv;
    tr_gemm_batch(tp, Hq, T, T, hd, q, qs, 1, hd, k, 1, ks, hd, per, p, T, TT, TR_GEMM_CAUSAL);
    attn_rows c = {.s = p, .T = T, .scale = scale, .window = window};
    for_rows(tp, Hq * T, softmax_row, &c);
    tr_gemm_batch(tp, Hq, T, hd, T, p, T, 1, TT, v, ks, 1, hd, per, out, qs, hd, TR_GEMM_K_LE_M);
}

void tr_attn_bwd(threadpool *tp, const float *q, const float *k, const float *v, const float *p, const float *dout,
                 int64_t T, int Hq, int Hkv, int hd, float scale, float *dq, float *dk, float *dv, float *ds) {
    int64_t qs = (int64_t)Hq * hd, ks = (int64_t)Hkv * hd, TT = T * T;
    int per = Hq / Hkv;
    tr_gemm_batch(tp, Hq, T, T, hd, dout, qs, 1, hd, v, 1, ks, hd, per, ds, T, TT, TR_GEMM_CAUSAL); /* dP */
    attn_rows c = {.p = p, .s = ds, .T = T, .scale = scale};
    for_rows(tp, Hq * T, dsoftmax_row, &c);
    tr_gemm_batch(tp, Hq, T, hd, T, ds, T, 1, TT, k, ks, 1, hd, per, dq, qs, hd, TR_GEMM_K_LE_M);
    /* dK, dV: a sum over each group's heads, so one batch (one head of every group) at a time */
    for (int j = 0; j < per; j++) {
        int flags = TR_GEMM_K_GE_M | (j ? TR_GEMM_ACC : 0);
        tr_gemm_batch(tp, Hkv, T, hd, T, ds + j * TT, 1, T, per * TT, q + j * hd, qs, 1, per * hd, 1, dk, ks, hd,
                      flags);
        tr_gemm_batch(tp, Hkv, T, hd, T, p + j * TT, 1, T, per * TT, dout + j * hd, qs, 1, per * hd, 1, dv, ks, hd,
                      flags);
    }
}

/* ---- SiLU-gated product ---------------------------------------------------- */

#define SILU_ROW 4096 /* values per row of the pool's work */
typedef struct silu_job {
    const float *g, *u, *dh;
    float *h, *dg, *du;
    int64_t n;
} silu_job;

static void silu_fwd_row(void *vc, int64_t r) {
    const silu_job *c = vc;
    int64_t i0 = r * SILU_ROW, n = c->n - i0 < SILU_ROW ? c->n - i0 : SILU_ROW;
    const float *g = c->g + i0, *u = c->u + i0;
    float *h = c->h + i0;
    exp_sum(g, n, -1.0f, 0.0f, h); /* exp(-g), for the sigmoid */
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + h[i]) * u[i];
}

static void silu_bwd_row(void *vc, int64_t r) {
    const silu_job *c = vc;
    int64_t i0 = r * SILU_ROW, n = c->n - i0 < SILU_ROW ? c->n - i0 : SILU_ROW;
    const float *g = c->g + i0, *u = c->u + i0, *dh = c->dh + i0;
    float *dg = c->dg + i0, *du = c->du + i0;
    exp_sum(g, n, -1.0f, 0.0f, dg);
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + dg[i]);
        du[i] = dh[i] * g[i] * s;
        dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

void tr_silu_mul_fwd(threadpool *tp, const float *g, const float *u, int64_t n, float *h) {
    silu_job c = {.g = g, .u = u, .h = h, .n = n};
    for_rows(tp, (n + SILU_ROW - 1) / SILU_ROW, silu_fwd_row, &c);
}

void tr_silu_mul_bwd(threadpool *tp, const float *g, const float *u, const float *dh, int64_t n, float *dg,
                     float *du) {
    silu_job c = {.g = g, .u = u, .dh = dh, .dg = dg, .du = du, .n = n};
    for_rows(tp, (n + SILU_ROW - 1) / SILU_ROW, silu_bwd_row, &c);
}

/* ---- GELU(tanh)-gated product (Gemma) --------------------------------------
 * h = gelu(g) u, gelu(g) = g (1 + tanh(c (g + 0.044715 g^3))) / 2, c = sqrt(2 / pi): MLX's
 * gelu_approx. gelu'(g) = (1 + t) / 2 + g (1 - t^2) c (1 + 3 0.044715 g^2) / 2. */

#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f

static void gelu_fwd_row(void *vc, int64_t r) {
    const silu_job *c = vc;
    int64_t i0 = r * SILU_ROW, n = c->n - i0 < SILU_ROW ? c->n - i0 : SILU_ROW;
    for (int64_t i = i0; i < i0 + n; i++) {
        float g = c->g[i];
        c->h[i] = 0.5f * g * (1.0f + tanhf(GELU_C * (g + GELU_A * g * g * g))) * c->u[i];
    }
}

static void gelu_bwd_row(void *vc, int64_t r) {
    const silu_job *c = vc;
    int64_t i0 = r * SILU_ROW, n = c->n - i0 < SILU_ROW ? c->n - i0 : SILU_ROW;
    for (int64_t i = i0; i < i0 + n; i++) {
        float g = c->g[i], th = tanhf(GELU_C * (g + GELU_A * g * g * g));
        float d = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * GELU_C * (1.0f + 3.0f * GELU_A * g * g);
        c->du[i] = c->dh[i] * 0.5f * g * (1.0f + th);
        c->dg[i] = c->dh[i] * c->u[i] * d;
    }
}

void tr_gelu_mul_fwd(threadpool *tp, const float *g, const float *u, int64_t n, float *h) {
    silu_job c = {.g = g, .u = u, .h = h, .n = n};
    for_rows(tp, (n + SILU_ROW - 1) / SILU_ROW, gelu_fwd_row, &c);
}

void tr_gelu_mul_bwd(threadpool *tp, const float *g, const float *u, const float *dh, int64_t n, float *dg, float *du) {
    silu_job c = {.g = g, .u = u, .dh = dh, .dg = dg, .du = du, .n = n};
    for_rows(tp, (n + SILU_ROW - 1) / SILU_ROW, gelu_bwd_row, &c);
}

/* ---- the gated delta rule (Qwen3.5's Gated DeltaNet) ------------------------ */

INL void delta_step_body(float *S, const float *k, const float *q, const float *v, int Dv, int Dk, float g, float beta,
                         float *y) {
    const v8 gv = {g, g, g, g, g, g, g, g};
    for (int r = 0; r < Dv; r++) {
        float *row = S + (int64_t)r * Dk;
        v8 m = {0};
        int d = 0;
        for (; d + 8 <= Dk; d += 8) {
            v8 x = ld8(row + d) * gv;
            st8(row + d, x);
            m += x * ld8(k + d);
        }
        float mem = hsum(m);
        for (; d < Dk; d++) mem += (row[d] *= g) * k[d];
        float delta = (v[r] - mem) * beta;
        v8 dl = {delta, delta, delta, delta, delta, delta, delta, delta}, o = {0};
        for (d = 0; d + 8 <= Dk; d += 8) {
            v8 x = ld8(row + d) + ld8(k + d) * dl;
            st8(row + d, x);
            if (y) o += x * ld8(q + d);
        }
        float out = hsum(o);
        for (; d < Dk; d++) {
            row[d] += k[d] * delta;
            if (y) out += row[d] * q[d];
        }
        if (y) y[r] = out;
    }
}

INL void delta_bwd_body(const float *prev, const float *now, const float *k, const float *q, const float *v, int Dv,
                        int Dk, float g, float beta, const float *dy, float *dS, float *dq, float *dk, float *dv,
                        float *dg, float *dbeta, float *sp) {
    const v8 gv = {g, g, g, g, g, g, g, g};
    float dgs = 0, dbs = 0;
    memset(dq, 0, sizeof(float) * (size_t)Dk), memset(dk, 0, sizeof(float) * (size_t)Dk);
    for (int r = 0; r < Dv; r++) {
        const float *pr = prev + (int64_t)r * Dk, *nw = now + (int64_t)r * Dk;
        float *ds = dS + (int64_t)r * Dk, y = dy[r];
        v8 yv = {y, y, y, y, y, y, y, y}, pv = {0}, ddv = {0};
        int d = 0;
        for (; d + 8 <= Dk; d += 8) { /* S' = g S_prev; pred = S' k; dS += dy q^T; dq += dy S_new; d delta */
            v8 s8 = ld8(pr + d) * gv, k8 = ld8(k + d), d8 = ld8(ds + d) + yv * ld8(q + d);
            st8(sp + d, s8), st8(ds + d, d8), st8(dq + d, ld8(dq + d) + yv * ld8(nw + d));
            pv += s8 * k8, ddv += d8 * k8;
        }
        float pred = hsum(pv), dd = hsum(ddv);
        for (; d < Dk; d++) {
            sp[d] = pr[d] * g, pred += sp[d] * k[d];
            ds[d] += y * q[d], dq[d] += y * nw[d], dd += ds[d] * k[d];
        }
        float delta = (v[r] - pred) * beta, dpred = -beta * dd;
        dv[r] = beta * dd, dbs += (v[r] - pred) * dd;
        v8 de = {delta, delta, delta, delta, delta, delta, delta, delta};
        v8 dp = {dpred, dpred, dpred, dpred, dpred, dpred, dpred, dpred}, gacc = {0};
        for (d = 0; d + 8 <= Dk; d += 8) { /* dk; dS' = dS + dpred k^T; dg += dS' . S_prev; dS_prev = g dS' */
            v8 d8 = ld8(ds + d), k8 = ld8(k + d);
            st8(dk + d, ld8(dk + d) + de * d8 + dp * ld8(sp + d));
            d8 += dp * k8;
            gacc += d8 * ld8(pr + d);
            st8(ds + d, d8 * gv);
        }
        float gs = hsum(gacc);
        for (; d < Dk; d++) {
            dk[d] += delta * ds[d] + dpred * sp[d];
            ds[d] += dpred * k[d];
            gs += ds[d] * pr[d];
            ds[d] *= g;
        }
        dgs += gs;
    }
    *dg = dgs, *dbeta = dbs;
}

AVX512 static void delta_step_avx512(float *S, const float *k, const float *q, const float *v, int Dv, int Dk, float g,
                                     float beta, float *y) {
    delta_step_body(S, k, q, v, Dv, Dk, g, beta, y);
}
static void delta_step_base(float *S, const float *k, const float *q, const float *v, int Dv, int Dk, float g,
                            float beta, float *y) {
    delta_step_body(S, k, q, v, Dv, Dk, g, beta, y);
}
void tr_delta_step(float *S, const float *k, const float *q, const float *v, int Dv, int Dk, float g, float beta,
                   float *y) {
    (have_avx512() ? delta_step_avx512 : delta_step_base)(S, k, q, v, Dv, Dk, g, beta, y);
}

AVX512 static void delta_bwd_avx512(const float *prev, const float *now, const float *k, const float *q, const float *v,
                                    int Dv, int Dk, float g, float beta, const float *dy, float *dS, float *dq,
                                    float *dk, float *dv, float *dg, float *dbeta, float *work) {
    delta_bwd_body(prev, now, k, q, v, Dv, Dk, g, beta, dy, dS, dq, dk, dv, dg, dbeta, work);
}
static void delta_bwd_base(const float *prev, const float *now, const float *k, const float *q, const float *v, int Dv,
                           int Dk, float g, float beta, const float *dy, float *dS, float *dq, float *dk, float *dv,
                           float *dg, float *dbeta, float *work) {
    delta_bwd_body(prev, now, k, q, v, Dv, Dk, g, beta, dy, dS, dq, dk, dv, dg, dbeta, work);
}
void tr_delta_step_bwd(const float *prev, const float *now, const float *k, const float *q, const float *v, int Dv,
                       int Dk, float g, float beta, const float *dy, float *dS, float *dq, float *dk, float *dv,
                       float *dg, float *dbeta, float *work) {
    (have_avx512() ? delta_bwd_avx512 : delta_bwd_base)(prev, now, k, q, v, Dv, Dk, g, beta, dy, dS, dq, dk, dv, dg,
                                                        dbeta, work);
}

/* ---- cross-entropy --------------------------------------------------------- */

typedef struct xent_rows {
    float *z;
    int64_t V, ldz;
    const int64_t *rows;
    const int32_t *targets;
    const float *weight;
    float *ce;
    float softcap;
} xent_rows;

/* logits row r becomes weight (softmax - onehot(target)); ce[r] its cross-entropy. With a
 * softcap c the logits are c tanh(z / c) first (Gemma 4's final_logit_softcapping), and
 * the row becomes the gradient wrt z: times 1 - tanh^2. */
static void xent_row(void *vc, int64_t r) {
    const xent_rows *c = vc;
    float *zr = c->z + r * c->ldz, wt = c->weight[c->rows[r]], cap = c->softcap;
    int32_t t = c->targets[c->rows[r]];
    if (cap > 0) { /* zr holds tanh(z / c) until the last pass */
        float mx = -INFINITY;
        for (int64_t j = 0; j < c->V; j++) {
            zr[j] = tanhf(zr[j] / cap);
            mx = zr[j] > mx ? zr[j] : mx;
        }
        double sum = 0;
        for (int64_t j = 0; j < c->V; j++) sum += expf(cap * (zr[j] - mx));
        double lse = (double)(cap * mx) + log(sum);
        c->ce[r] = (float)(lse - (double)(cap * zr[t]));
        for (int64_t j = 0; j < c->V; j++) {
            float th = zr[j], p = (float)exp((double)(cap * th) - lse) * wt;
            zr[j] = (j == t ? p - wt : p) * (1.0f - th * th);
        }
        return;
    }
    float zt = zr[t];
    c->ce[r] = (float)softmax(zr, c->V, 1.0f, wt) - zt;
    zr[t] -= wt;
}

double tr_xent(threadpool *tp, const float *h, int64_t M, int64_t D, const float *w, int64_t V, float softcap,
               const int32_t *targets, const float *weight, float *dh, float *ce, float *scratch) {
    int64_t ldz = V + 16; /* TR_XENT_ROW_FLOATS */
    float *z = scratch, *hc = scratch + (int64_t)TR_XENT_ROWS * ldz, *dc = hc + (int64_t)TR_XENT_ROWS * D;
    int64_t rows[TR_XENT_ROWS];
    float row_ce[TR_XENT_ROWS];
    double total = 0;
    if (dh) memset(dh, 0, sizeof(float) * (size_t)(M * D));
    if (ce) memset(ce, 0, sizeof(float) * (size_t)M);
    for (int64_t m0 = 0; m0 < M;) {
        int n = 0; /* the next rows that count, gathered */
        for (; m0 < M && n < TR_XENT_ROWS; m0++)
            if (weight[m0] != 0.0f) {
                rows[n] = m0;
                memcpy(hc + (int64_t)n * D, h + m0 * D, sizeof(float) * (size_t)D);
                n++;
            }
        if (!n) break;
        tr_gemm(tp, n, V, D, hc, D, 1, w, 1, D, z, ldz, 0); /* z = hc w^T */
        xent_rows c = {.z = z, .V = V, .ldz = ldz, .rows = rows, .targets = targets, .weight = weight, .ce = row_ce};
        c.softcap = softcap;
        for_rows(tp, n, xent_row, &c);
        for (int r = 0; r < n; r++) { /* in row order: the same sum whatever the threads */
            total += (double)weight[rows[r]] * row_ce[r];
            if (ce) ce[rows[r]] = row_ce[r];
        }
        if (!dh) continue;
        memset(dc, 0, sizeof(float) * (size_t)(n * D));
        tr_gemm(tp, n, D, V, z, ldz, 1, w, D, 1, dc, D, TR_GEMM_ACC); /* dc += z w */
        for (int r = 0; r < n; r++) memcpy(dh + rows[r] * D, dc + (int64_t)r * D, sizeof(float) * (size_t)D);
    }
    return total;
}
