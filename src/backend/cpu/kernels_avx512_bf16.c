/* kernels_avx512_bf16.c: BF16 weights on CPUs with AVX512_BF16 (vdpbf16ps): activations
 * rounded once per call to bf16 (round-to-nearest-even, CPU_ACT_BF16), each instruction 32
 * bf16 products summed pairwise into 16 float lanes. The float kernels (kernels_x86.inc)
 * widen every weight to f32 and spend one FMA per 8 products; here the weights go into the
 * dot as stored, which is what batched decode and prefill of BF16 models are bound by (a
 * 16-row SmolLM2 BF16 decode step spent 63% of its time in the float tile). mlx computes a
 * bf16 model's matmuls on bf16 activations too; llama.cpp does the same on these CPUs.
 *
 * One order for every (row, token) whatever the batch: the 32-element chunks of K alternate
 * between two accumulators (even chunks, odd chunks), then one reduce of their sum. The rows
 * kernel (T = 1) and the tile (1 row x 8 or 2 rows x 4 tokens per pass) run that same sequence, so a
 * token's outputs are bit-identical at every batch size. K must be a multiple of 32 (other
 * shapes keep the float kernels). */
#include "backend/cpu/kernels.h"
#include "base/cpu_features.h"
#include <immintrin.h>

#define BTARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16"
/* Tile passes: 2 rows x 4 tokens (prefill: the weight tile comes from L2 once per 4 tokens,
 * 12 loads per 16 dots), or up to BF_STREAM_T tokens 1 row x 8 tokens (batched decode: one
 * weight stream from memory: two rows side by side stream slower, while prefill loses when
 * every pass is 1 x 8; bench/results/kernel_choices.md, "CPU BF16 tiles").
 * Both are 16 zmm of sums. */
#define BF_TT 8
#define BF_TR 2
#define BF_STREAM_T 16
/* Software prefetch distance of the tile passes, in bytes along a weight row (about two
 * SmolLM2 rows of K = 576). A pass of 8 tokens consumes a row at ~10-16 GB/s per core, too
 * slowly for the hardware prefetcher to keep ahead (half and twice this distance measured
 * about the same: bench/results/kernel_choices.md, "CPU BF16 tiles"). The rows kernel
 * (T = 1) streams at the copy rate without it. */
#define BF_PREFETCH 2304
/* full unrolling of the constant-bound loops, so the sums stay in registers */
#define BF_UNROLL _Pragma("GCC unroll 8")

__attribute__((target(BTARGET))) void cpu_avx512_bf16_row(const float *x, int64_t k, uint16_t *out) {
    for (int64_t i = 0; i < k; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(out + i), (__m512i)v);
    }
}

static inline __attribute__((target(BTARGET), always_inline)) __m512bh bf_load(const uint16_t *p) {
    return (__m512bh)_mm512_loadu_si512((const void *)p);
}

/* The sums of TT <= 8 tokens' pairs (a0[t] + a1[t]), each reduced over its 16 lanes with
 * _mm512_reduce_add_ps's pairing (lane i + lane i + 8, then + 4, then 0 + 2 / 1 + 3, then
 * those two), so every sum has the bits of the one-vector reduce the rows kernel uses; the
 * eight reductions share their shuffles (33 vector operations instead of ~70;
 * bench/results/kernel_choices.md, "CPU BF16 tiles"). */
static inline __attribute__((target(BTARGET), always_inline)) void bf_reduce_tokens(const __m512 *a0, const __m512 *a1,
                                                                                  int TT, float *out, int64_t ys) {
    __m512 s[8], h[4], q[2];
    BF_UNROLL for (int t = 0; t < 8; t++) s[t] = t < TT ? _mm512_add_ps(a0[t], a1[t]) : _mm512_setzero_ps();
    /* [t.c0 + t.c2, t.c1 + t.c3, u.c0 + u.c2, u.c1 + u.c3] in 128-bit chunks, pairs (t, u) */
    BF_UNROLL for (int p = 0; p < 4; p++)
        h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0xEE));
    /* chunk j of q[p] = token 4p + j's four lanes i + (i + 4) */
    BF_UNROLL for (int p = 0; p < 2; p++)
        q[p] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    BF_UNROLL for (int p = 0; p < 2; p++) /* lanes 0 + 2, 1 + 3 */
        q[p] = _mm512_add_ps(q[p], _mm512_permute_ps(q[p], _MM_SHUFFLE(1, 0, 3, 2)));
    /* chunk j: [token j, -, token 4 + j, -] */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    float v[16];
    _mm512_storeu_ps(v, r);
    BF_UNROLL for (int t = 0; t < TT; t++) out[t * ys] = v[(t % 4) * 4 + (t / 4) * 2];
}

/* R rows (r[0..R)) x TT tokens (x[0..TT)) over k: out[t * ys + i] = row i . token t. pf: the
 * software prefetch distance in bytes (0: none), a compile-time constant per caller. */
static inline __attribute__((target(BTARGET), always_inline)) void bf_block(const uint16_t *const *r, int R,
                                                                          const uint16_t *const *x, int TT,
                                                                          int64_t k, float *out, int64_t ys, int pf) {
    __m512 acc[BF_TR][BF_TT][2]; /* R x TT of them used (R * TT <= 8) */
    BF_UNROLL for (int i = 0; i < R; i++)
        BF_UNROLL for (int t = 0; t < TT; t++) acc[i][t][0] = acc[i][t][1] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 64 <= k; c += 64) {
        __m512bh w0[BF_TR], w1[BF_TR];
        if (pf)
            BF_UNROLL for (int i = 0; i < R; i++) {
                _mm_prefetch((const char *)(r[i] + c) + pf, _MM_HINT_T0);
                _mm_prefetch((const char *)(r[i] + c) + pf + 64, _MM_HINT_T0);
            }
        BF_UNROLL for (int i = 0; i < R; i++) w0[i] = bf_load(r[i] + c), w1[i] = bf_load(r[i] + c + 32);
        BF_UNROLL for (int t = 0; t < TT; t++) {
            __m512bh x0 = bf_load(x[t] + c), x1 = bf_load(x[t] + c + 32);
            BF_UNROLL for (int i = 0; i < R; i++) {
                acc[i][t][0] = _mm512_dpbf16_ps(acc[i][t][0], w0[i], x0);
                acc[i][t][1] = _mm512_dpbf16_ps(acc[i][t][1], w1[i], x1);
            }
        }
    }
    if (c < k) /* one last even chunk (k % 64 == 32) */
        BF_UNROLL for (int t = 0; t < TT; t++) {
            __m512bh x0 = bf_load(x[t] + c);
            BF_UNROLL for (int i = 0; i < R; i++) acc[i][t][0] = _mm512_dpbf16_ps(acc[i][t][0], bf_load(r[i] + c), x0);
        }
    if (R == 1 && TT > 1) {
        __m512 a0[BF_TT], a1[BF_TT];
        BF_UNROLL for (int t = 0; t < TT; t++) a0[t] = acc[0][t][0], a1[t] = acc[0][t][1];
        bf_reduce_tokens(a0, a1, TT, out, ys);
        return;
    }
    BF_UNROLL for (int t = 0; t < TT; t++)
        BF_UNROLL for (int i = 0; i < R; i++) out[t * ys + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][t][0], acc[i][t][1]));
}

/* x: one bf16 row (CPU_ACT_BF16). */
__attribute__((target(BTARGET))) static void bf16_rows(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                       float *y) {
    const uint16_t *x = xv, *base = w->data;
    int64_t k = w->k;
    for (int64_t n = n0; n < n1; n++) {
        const uint16_t *r = base + n * k;
        bf_block(&r, 1, &x, 1, k, y + n, 0, 0);
    }
}

/* R rows x tn <= TT tokens, tn a compile-time constant in each case (cases above TT compile
 * to nothing: a 2-row pass never instantiates more than 4 tokens of sums). */
#define BF_B(R, TN) bf_block(r, R, xt, TN, k, yt, ys, BF_PREFETCH)
#define BF_CASES(R, TT)                                                                          \
    switch (tn) {                                                                                \
    case 8: if (TT >= 8) { BF_B(R, 8); break; } /* fallthrough */                                \
    case 7: if (TT >= 7) { BF_B(R, 7); break; } /* fallthrough */                                \
    case 6: if (TT >= 6) { BF_B(R, 6); break; } /* fallthrough */                                \
    case 5: if (TT >= 5) { BF_B(R, 5); break; } /* fallthrough */                                \
    case 4: BF_B(R, 4); break;                                                                   \
    case 3: BF_B(R, 3); break;                                                                   \
    case 2: BF_B(R, 2); break;                                                                   \
    default: BF_B(R, 1); break;                                                                  \
    }

/* x: T bf16 rows, x_stride elements apart; y row t at y + t * ys. */
__attribute__((target(BTARGET))) static void bf16_tile(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                       int64_t xs, int T, float *y, int64_t ys) {
    const uint16_t *x = xv, *base = w->data;
    int64_t k = w->k;
    int stream = T <= BF_STREAM_T, tt = stream ? 8 : 4;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int tn = T - t0 < tt ? T - t0 : tt;
        const uint16_t *xt[BF_TT];
        for (int t = 0; t < tn; t++) xt[t] = x + (int64_t)(t0 + t) * xs;
        int64_t n = n0;
        if (!stream)
            for (; n + 2 <= n1; n += 2) {
                const uint16_t *r[2] = {base + n * k, base + (n + 1) * k};
                float *yt = y + (int64_t)t0 * ys + n;
                BF_CASES(2, 4)
            }
        for (; n < n1; n++) {
            const uint16_t *r[1] = {base + n * k};
            float *yt = y + (int64_t)t0 * ys + n;
            BF_CASES(1, 8) /* tn <= 4 outside the streaming passes */
        }
    }
}

int cpu_avx512_bf16_kernel(const op_weight *w, cpu_kernel *out) {
    if (w->dtype != DT_BF16 || w->k <= 0 || w->k % 32 || !cpu_features_get()->avx512bf16) return 0;
    *out = (cpu_kernel){bf16_rows, CPU_ACT_BF16, bf16_tile, NULL, 0};
    return 1;
}
