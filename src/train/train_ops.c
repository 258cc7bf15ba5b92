/* train_ops.c: the float32 forward and backward kernels of LoRA training (train_ops.h).
 * Portable C with GCC vector types, the small loops also built for AVX2+FMA and picked by
 * what the CPU has; the products that carry nearly all the work go to tr_gemm
 * (train_gemm.c). */
#include "train/train_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* v8 helpers are always inlined: the AVX ABI note for vector returns does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8 __attribute__((vector_size(32)));
#define INL static inline __attribute__((always_inline))
/* The small loops are bodies inlined twice: built for AVX2+FMA and for the baseline, picked
 * once per call by what the CPU has. */
#define AVX2 __attribute__((target("avx2,fma")))
static int have_avx2(void) {
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return v;
}

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

/* ---- linear with LoRA ----------------------------------------------------- */

INL void lora_fwd_body(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, float *xa, float *y) {
    int r = l->r;
    for (int64_t m = 0; m < M; m++) {
        float *xr = xa + m * r;
        memset(xr, 0, sizeof(float) * (size_t)r);
        for (int64_t k = 0; k < K; k++) axpyf(xr, x[m * K + k], l->a + k * r, r);
        for (int j = 0; j < r; j++) axpyf(y + m * N, l->scale * xr[j], l->b + (int64_t)j * N, N);
    }
}
AVX2 static void lora_fwd_avx2(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, float *xa,
                               float *y) {
    lora_fwd_body(x, M, K, N, l, xa, y);
}
static void lora_fwd_base(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, float *xa, float *y) {
    lora_fwd_body(x, M, K, N, l, xa, y);
}

INL void lora_bwd_body(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, const float *xa,
                       const float *dy, float *dx, float *scratch) {
    int r = l->r;
    for (int64_t m = 0; m < M; m++) {
        const float *g = dy + m * N;
        float *dxa = scratch + m * r;
        for (int j = 0; j < r; j++) {
            dxa[j] = l->scale * dotf(g, l->b + (int64_t)j * N, N);
            axpyf(l->gb + (int64_t)j * N, l->scale * xa[m * r + j], g, N);
        }
        for (int64_t k = 0; k < K; k++) {
            axpyf(l->ga + k * r, x[m * K + k], dxa, r);
            if (dx) dx[m * K + k] += dotf(dxa, l->a + k * r, r);
        }
    }
}
AVX2 static void lora_bwd_avx2(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, const float *xa,
                               const float *dy, float *dx, float *scratch) {
    lora_bwd_body(x, M, K, N, l, xa, dy, dx, scratch);
}
static void lora_bwd_base(const float *x, int64_t M, int64_t K, int64_t N, const tr_lora *l, const float *xa,
                          const float *dy, float *dx, float *scratch) {
    lora_bwd_body(x, M, K, N, l, xa, dy, dx, scratch);
}

void tr_linear_fwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                   const tr_lora *l, float *xa, float *y) {
    tr_matmul_nt(tp, x, M, K, w, N, y, 0);
    if (bias)
        for (int64_t m = 0; m < M; m++) axpyf(y + m * N, 1.0f, bias, N);
    if (!l) return;
    if (have_avx2()) lora_fwd_avx2(x, M, K, N, l, xa, y);
    else lora_fwd_base(x, M, K, N, l, xa, y);
}

void tr_linear_bwd(threadpool *tp, const float *x, int64_t M, int64_t K, const float *w, int64_t N, const tr_lora *l,
                   const float *xa, const float *dy, float *dx, float *scratch) {
    if (dx) tr_matmul_nn(tp, dy, M, N, w, K, dx);
    if (!l) return;
    if (have_avx2()) lora_bwd_avx2(x, M, K, N, l, xa, dy, dx, scratch);
    else lora_bwd_base(x, M, K, N, l, xa, dy, dx, scratch);
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

void tr_rope(float *x, int64_t T, int H, int hd, int pos0, const float *inv_freq, int adjacent, int sign) {
    int half = hd / 2;
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

/* ---- causal attention ---------------------------------------------------- */

typedef struct attn_ctx {
    const float *q, *k, *v, *p, *dout;
    float *pw, *out, *dq, *dk, *dv;
    int64_t T;
    int Hq, Hkv, hd;
    float scale;
} attn_ctx;

INL void attn_fwd_body(void *vctx, int g) {
    const attn_ctx *c = vctx;
    int64_t T = c->T, qs = (int64_t)c->Hq * c->hd, ks = (int64_t)c->Hkv * c->hd;
    int per = c->Hq / c->Hkv;
    for (int h = g * per; h < (g + 1) * per; h++)
        for (int64_t i = 0; i < T; i++) {
            float *p = c->pw + ((int64_t)h * T + i) * T;
            const float *qi = c->q + i * qs + (int64_t)h * c->hd;
            float mx = -INFINITY;
            for (int64_t j = 0; j <= i; j++) {
                p[j] = c->scale * dotf(qi, c->k + j * ks + (int64_t)g * c->hd, c->hd);
                if (p[j] > mx) mx = p[j];
            }
            float sum = 0;
            for (int64_t j = 0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
            float inv = 1.0f / sum;
            float *o = c->out + i * qs + (int64_t)h * c->hd;
            memset(o, 0, sizeof(float) * (size_t)c->hd);
            for (int64_t j = 0; j <= i; j++) {
                p[j] *= inv;
                axpyf(o, p[j], c->v + j * ks + (int64_t)g * c->hd, c->hd);
            }
            for (int64_t j = i + 1; j < T; j++) p[j] = 0;
        }
}

AVX2 static void attn_fwd_avx2(void *c, int g, int thread) { attn_fwd_body(c, g); }
static void attn_fwd_task(void *c, int g, int thread) { attn_fwd_body(c, g); }

void tr_attn_fwd(threadpool *tp, const float *q, const float *k, const float *v, int64_t T, int Hq, int Hkv, int hd,
                 float scale, float *p, float *out) {
    attn_ctx c = {.q = q, .k = k, .v = v, .pw = p, .out = out, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd, .scale = scale};
    tp_run(tp, Hkv, have_avx2() ? attn_fwd_avx2 : attn_fwd_task, &c);
}

INL void attn_bwd_body(void *vctx, int g) {
    const attn_ctx *c = vctx;
    int64_t T = c->T, qs = (int64_t)c->Hq * c->hd, ks = (int64_t)c->Hkv * c->hd, hd = c->hd;
    int per = c->Hq / c->Hkv;
    float *ds = malloc(sizeof(float) * (size_t)T);
    for (int64_t j = 0; j < T; j++) {
        memset(c->dk + j * ks + g * hd, 0, sizeof(float) * (size_t)hd);
        memset(c->dv + j * ks + g * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int h = g * per; h < (g + 1) * per; h++)
        for (int64_t i = 0; i < T; i++) {
            const float *p = c->p + ((int64_t)h * T + i) * T;
            const float *doi = c->dout + i * qs + h * hd, *qi = c->q + i * qs + h * hd;
            float dot = 0;
            for (int64_t j = 0; j <= i; j++) {
                ds[j] = dotf(doi, c->v + j * ks + g * hd, hd);
                dot += p[j] * ds[j];
                axpyf(c->dv + j * ks + g * hd, p[j], doi, hd);
            }
            float *dqi = c->dq + i * qs + h * hd;
            memset(dqi, 0, sizeof(float) * (size_t)hd);
            for (int64_t j = 0; j <= i; j++) {
                float s = c->scale * p[j] * (ds[j] - dot);
                axpyf(dqi, s, c->k + j * ks + g * hd, hd);
                axpyf(c->dk + j * ks + g * hd, s, qi, hd);
            }
        }
    free(ds);
}

AVX2 static void attn_bwd_avx2(void *c, int g, int thread) { attn_bwd_body(c, g); }
static void attn_bwd_task(void *c, int g, int thread) { attn_bwd_body(c, g); }

void tr_attn_bwd(threadpool *tp, const float *q, const float *k, const float *v, const float *p, const float *dout,
                 int64_t T, int Hq, int Hkv, int hd, float scale, float *dq, float *dk, float *dv) {
    attn_ctx c = {.q = q, .k = k, .v = v, .p = p, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .T = T, .Hq = Hq,
                  .Hkv = Hkv, .hd = hd, .scale = scale};
    tp_run(tp, Hkv, have_avx2() ? attn_bwd_avx2 : attn_bwd_task, &c);
}

/* ---- SiLU-gated product ---------------------------------------------------- */

void tr_silu_mul_fwd(const float *g, const float *u, int64_t n, float *h) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void tr_silu_mul_bwd(const float *g, const float *u, const float *dh, int64_t n, float *dg, float *du) {
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        du[i] = dh[i] * g[i] * s;
        dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

/* ---- cross-entropy --------------------------------------------------------- */

double tr_xent(threadpool *tp, const float *h, int64_t M, int64_t D, const float *w, int64_t V,
               const int32_t *targets, const float *weight, float *dh, float *ce, float *scratch) {
    float *z = scratch, *hc = scratch + (int64_t)TR_XENT_ROWS * V, *dc = hc + (int64_t)TR_XENT_ROWS * D;
    int64_t rows[TR_XENT_ROWS];
    double total = 0;
    memset(dh, 0, sizeof(float) * (size_t)(M * D));
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
        tr_matmul_nt(tp, hc, n, D, w, V, z, 0);
        for (int r = 0; r < n; r++) {
            float *zr = z + (int64_t)r * V, mx = -INFINITY;
            for (int64_t j = 0; j < V; j++) mx = zr[j] > mx ? zr[j] : mx;
            double sum = 0;
            for (int64_t j = 0; j < V; j++) sum += expf(zr[j] - mx);
            float lse = mx + (float)log(sum), wt = weight[rows[r]];
            int32_t t = targets[rows[r]];
            total += (double)wt * (lse - zr[t]);
            if (ce) ce[rows[r]] = lse - zr[t];
            for (int64_t j = 0; j < V; j++) zr[j] = wt * expf(zr[j] - lse);
            zr[t] -= wt;
        }
        memset(dc, 0, sizeof(float) * (size_t)(n * D));
        tr_matmul_nn(tp, z, n, V, w, D, dc);
        for (int r = 0; r < n; r++) memcpy(dh + rows[r] * D, dc + (int64_t)r * D, sizeof(float) * (size_t)D);
    }
    return total;
}
