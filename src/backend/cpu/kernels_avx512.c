/* kernels_avx512.c: AVX-512 (F/BW/VL/VNNI) kernels: the 256-bit x86 row kernels
 * (kernels_x86.inc) built with vpdpbusd, and 512-bit kernels that replace them for Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K and MLX 4/8-bit: 4 rows x 1 token (decode) or, for
 * prefill, 16 rows x 8 tokens on weights repacked per call into a row-interleaved stack
 * buffer (Q4_0..Q8_0, Q3_K..Q6_K, MLX 2-8 bits; Q2_K keeps 4 rows x 4 tokens). Must not
 * use extensions beyond F/BW/VL/VNNI (the level cpu_features checks: no VBMI, no DQ). */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define KTARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define PFX(name) avx512_##name

__attribute__((target(KTARGET))) static inline __m256i avx512_dot_u8s8(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}
__attribute__((target(KTARGET))) static inline __m256i avx512_dot_s8s8(__m256i a, __m256i b) {
    return avx512_dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

#define DOT_U8S8 avx512_dot_u8s8
#define DOT_S8S8 avx512_dot_s8s8
#define MLX8_DOT avx512_dot_u8s8
#define MLX8_OFFSET 0

#define DENSE_TT 4 /* tokens per pass of the dense tile (kernels_x86.inc) */
#include "backend/cpu/kernels_x86.inc"

/* ---- 512-bit kernels for the 32-element GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) ----
 * Two blocks per zmm and four output rows per pass: the activation pair (64 int8 values,
 * their scales and lane sums) is prepared once and reused by the four rows, so per row
 * and block pair only the weight unpacking, one vpdpbusd and two float ops remain. The
 * stored offset (8, 16, or 128 for Q8_0 read as unsigned) is folded into the vpdpbusd
 * accumulator's start value (-offset * lane sums of x), so no per-block correction. */

/* PAIR_Q3_K / PAIR_Q6_K: only the activation side (offset 4 / 32) is used, by the
 * k-quant kernels. */
typedef enum pair_fmt { PAIR_Q4_0, PAIR_Q4_1, PAIR_Q5_0, PAIR_Q5_1, PAIR_Q8_0, PAIR_Q3_K, PAIR_Q6_K } pair_fmt;

#define TILE_ROWS 4
#define AVX512_INLINE __attribute__((target(KTARGET), always_inline)) static inline
/* Software prefetch along the weight rows, one pass of TILE_ROWS rows ahead (the same
 * column of the next rows, which are contiguous). Measured on 1B-class rows (1-2 KiB): the
 * hardware prefetcher alone reached ~0.6 of the streaming roofline for 4-bit formats; a
 * distance of one pass (4-9 KiB) ~0.85, 1 KiB ~0.7. Capped so prefetched lines of very
 * long rows are still in L1/L2 when used. */
AVX512_INLINE int64_t avx512_prefetch_distance(int64_t row_bytes) {
    int64_t d = TILE_ROWS * row_bytes;
    return d < 1024 ? 1024 : d > 16384 ? 16384 : d;
}

/* Prefetches the cache lines of [p, p + span) ahead bytes further on. */
AVX512_INLINE void avx512_prefetch(const uint8_t *p, int64_t ahead, int span) {
    for (int off = 0; off < span; off += 64) _mm_prefetch((const char *)p + ahead + off, _MM_HINT_T0);
}

/* One activation block pair, shared by the rows of a pass. */
typedef struct pair_act {
    __m512i q;    /* 64 int8 values: block b then block b + 1 */
    __m512i init; /* -offset * (sum of the 4 x bytes of each lane) */
    __m512 dx;    /* activation scale of each lane's block */
    __m512 xs;    /* dx * lane sum (for formats with a min) */
} pair_act;

AVX512_INLINE pair_act avx512_pair_act(const cpu_q8_block *x, int64_t b, int have2, pair_fmt f) {
    pair_act a;
    __m256i q0 = _mm256_loadu_si256((const __m256i *)x[b].q);
    __m256i q1 = have2 ? _mm256_loadu_si256((const __m256i *)x[b + 1].q) : _mm256_setzero_si256();
    a.q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    __m256d d1 = _mm256_castps_pd(_mm256_set1_ps(have2 ? x[b + 1].d : 0.0f)); /* insertf32x8 needs DQ */
    a.dx = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(x[b].d)), d1, 1));
    int off = f == PAIR_Q4_0   ? 8
              : f == PAIR_Q5_0 ? 16
              : f == PAIR_Q3_K ? 4
              : f == PAIR_Q6_K ? 32
              : f == PAIR_Q8_0 ? 128
                               : 0;
    if (off)
        a.init = _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)off), a.q));
    else
        a.init = _mm512_setzero_si512();
    if (f == PAIR_Q4_1 || f == PAIR_Q5_1)
        a.xs = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), a.q)), a.dx);
    else
        a.xs = _mm512_setzero_ps();
    return a;
}

/* Unpacks blocks p0 and p1 (p1 == p0 for a lone last block, whose activations are zero)
 * to 64 unsigned quants in element order. */
AVX512_INLINE __m512i avx512_pair_quants(const uint8_t *p0, const uint8_t *p1, pair_fmt f) {
    if (f == PAIR_Q8_0) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + 2)), b = _mm256_loadu_si256((const __m256i *)(p1 + 2));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1), _mm512_set1_epi8((char)0x80));
    }
    int qo = f == PAIR_Q4_0 ? 2 : f == PAIR_Q4_1 ? 4 : f == PAIR_Q5_0 ? 6 : 8;
    /* [qs0, qs0, qs1, qs1]; the second copy of each is shifted to its high nibbles */
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p0 + qo)));
    z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128((const __m128i *)(p1 + qo)));
    z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), _mm512_set1_epi8(0x0F));
    if (f == PAIR_Q5_0 || f == PAIR_Q5_1) { /* bit j of the u32 before qs = fifth bit of element j */
        uint32_t h0, h1;
        memcpy(&h0, p0 + qo - 4, 4);
        memcpy(&h1, p1 + qo - 4, 4);
        __mmask64 k = _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32);
        z = _mm512_mask_add_epi8(z, k, z, _mm512_set1_epi8(0x10));
    }
    return z;
}

/* The two blocks' f16 scale d as a lane vector (lanes 0-7: p0, 8-15: p1), or with_min:
 * d and the min m interleaved (even lanes d, odd lanes m). */
AVX512_INLINE __m512 avx512_pair_f16(const uint8_t *p0, const uint8_t *p1, int with_min) {
    if (with_min) {
        int32_t a, b;
        memcpy(&a, p0, 4);
        memcpy(&b, p1, 4);
        return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi32(b), _mm_set1_epi32(a)));
    }
    int16_t a, b;
    memcpy(&a, p0, 2);
    memcpy(&b, p1, 2);
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a)));
}

/* Decode (rows) and prefill (tile) entry points of a 512-bit row-tile kernel FN(w, n0, n1,
 * x, xstride, T, y, ystride, ARG, rows, tokens). */
#define TILED_KERNELS(ROWS_NAME, TILE_NAME, FN, ARG, R)                                                 \
    __attribute__((target(KTARGET))) static void ROWS_NAME(const op_weight *w, int64_t n0, int64_t n1, \
                                                           const void *x, float *y) {                  \
        int64_t n4 = n0 + (n1 - n0) / (R) * (R);                                                       \
        FN(w, n0, n4, x, 0, 1, y, 0, ARG, R, 1);                                                       \
        FN(w, n4, n1, x, 0, 1, y, 0, ARG, 1, 1);                                                       \
    }                                                                                                  \
    __attribute__((target(KTARGET), unused)) static void TILE_NAME(                                    \
        const op_weight *w, int64_t n0, int64_t n1, const void *xv, int64_t xstride, int T, float *y,  \
        int64_t ystride) {                                                                             \
        const cpu_q8_block *x = xv;                                                                    \
        int64_t n4 = n0 + (n1 - n0) / (R) * (R);                                                       \
        int T4 = T / TILE_TOKENS * TILE_TOKENS;                                                        \
        FN(w, n0, n4, x, xstride, T4, y, ystride, ARG, R, TILE_TOKENS);                                \
        FN(w, n4, n1, x, xstride, T4, y, ystride, ARG, 1, TILE_TOKENS);                                \
        /* the 1-3 leftover tokens in one more pass of R-row tiles (each weight pair unpacked   \
         * once for all of them; a token's sums are the same operations in the same order),     \
         * the leftover rows token by token */                                                   \
        const cpu_q8_block *xr = x + T4 * xstride;                                                     \
        float *yr = y + T4 * ystride;                                                                  \
        if (T - T4 == 3) FN(w, n0, n4, xr, xstride, 3, yr, ystride, ARG, R, 3);                        \
        else if (T - T4 == 2) FN(w, n0, n4, xr, xstride, 2, yr, ystride, ARG, R, 2);                   \
        else if (T - T4 == 1) FN(w, n0, n4, xr, xstride, 1, yr, ystride, ARG, R, 1);                   \
        for (int t = T4; t < T; t++)                                                                   \
            FN(w, n4, n1, x + t * xstride, xstride, 1, y + t * ystride, ystride, ARG, 1, 1);           \
    }

/* R rows x TT tokens: each unpacked weight pair feeds TT vpdpbusd (TT = 1 for decode,
 * TILE_TOKENS for prefill). */
#define TILE_TOKENS 4

AVX512_INLINE void avx512_pair_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x,
                                    int64_t xstride, int T, float *y, int64_t ystride, pair_fmt f, int R, int TT) {
    const int bytes = f == PAIR_Q4_0 ? 18 : f == PAIR_Q4_1 ? 20 : f == PAIR_Q5_0 ? 22 : f == PAIR_Q5_1 ? 24 : 34;
    const int with_min = f == PAIR_Q4_1 || f == PAIR_Q5_1;
    int64_t nb = w->k / 32, rb = nb * bytes, pf = avx512_prefetch_distance(rb);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m512 acc[TILE_ROWS][TILE_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b += 2) {
                int have2 = b + 1 < nb;
                pair_act a[TILE_TOKENS];
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) a[t] = avx512_pair_act(x + (t0 + t) * xstride, b, have2, f);
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *p0 = row + r * rb + b * bytes, *p1 = have2 ? p0 + bytes : p0;
                    avx512_prefetch(p0, pf, 2 * bytes);
                    __m512i z = avx512_pair_quants(p0, p1, f);
                    __m512 dm = avx512_pair_f16(p0, p1, with_min);
                    __m512 d = with_min ? _mm512_moveldup_ps(dm) : dm, m = _mm512_movehdup_ps(dm);
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) {
                        __m512i p = _mm512_dpbusd_epi32(a[t].init, z, a[t].q);
                        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, a[t].dx), acc[r][t]);
                        if (with_min) acc[r][t] = _mm512_fmadd_ps(m, a[t].xs, acc[r][t]);
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

TILED_KERNELS(avx512_rows2_q4_0, avx512_tile2_q4_0, avx512_pair_tile, PAIR_Q4_0, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q4_1, avx512_tile2_q4_1, avx512_pair_tile, PAIR_Q4_1, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q5_0, avx512_tile2_q5_0, avx512_pair_tile, PAIR_Q5_0, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q5_1, avx512_tile2_q5_1, avx512_pair_tile, PAIR_Q5_1, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q8_0, avx512_tile2_q8_0, avx512_pair_tile, PAIR_Q8_0, TILE_ROWS)

/* ---- 512-bit Q4_K / Q5_K: four rows per pass, two 32-element sub-blocks per zmm ----
 * Per super-block and row the eight 6-bit scales and mins are unpacked at once into one
 * float vector [d*sc_0..7, dmin*m_0..7]; the mins then cost a single FMA against the
 * activation vector [0 x8, dx_c * sum(x_c) for c = 0..7], shared by the four rows. */


/* [d*sc_c for c = 0..7, dmin*m_c for c = 0..7] from a Q4_K/Q5_K super-block header. */
AVX512_INLINE __m512 avx512_k45_scales(const uint8_t *blk) {
    uint64_t sc, mn;
    cpu_q4k_scales_mins(blk, &sc, &mn);
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x((long long)mn, (long long)sc)));
    return _mm512_mul_ps(v, avx512_pair_f16(blk, blk + 2, 0)); /* [d x8, dmin x8] */
}

/* R rows x TT tokens (activation row t at x + t * xstride, output at y + t * ystride). */
AVX512_INLINE void avx512_k45_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x,
                                   int64_t xstride, int T, float *y, int64_t ystride, int high, int R, int TT) {
    const int bytes = high ? 176 : 144;
    int64_t nsb = w->k / 256, rb = nsb * bytes, pf = avx512_prefetch_distance(rb);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m512 acc[TILE_ROWS][TILE_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                __m512 ds[TILE_ROWS];
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = row + r * rb + sb * bytes;
                    avx512_prefetch(blk, pf, bytes);
                    ds[r] = avx512_k45_scales(blk);
                }
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) { /* the mins: - dmin * m_c * dx_c * sum(x_c) */
                    const cpu_q8_block *xb = x + (t0 + t) * xstride + sb * 8;
                    float xs[8];
                    #pragma GCC unroll 8
                    for (int c = 0; c < 8; c++) xs[c] = xb[c].d * (float)(xb[c].sum16[0] + xb[c].sum16[1]);
                    __m512 xs16 = _mm512_castpd_ps(
                        _mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(_mm256_loadu_ps(xs)), 1));
                    #pragma GCC unroll 8
                    for (int r = 0; r < R; r++) acc[r][t] = _mm512_fnmadd_ps(ds[r], xs16, acc[r][t]);
                }
                #pragma GCC unroll 4
                for (int j = 0; j < 4; j++) { /* sub-blocks 2j (low nibbles) and 2j+1 (high) */
                    pair_act a[TILE_TOKENS];
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) /* no offset: init 0 */
                        a[t] = avx512_pair_act(x + (t0 + t) * xstride + sb * 8, 2 * j, 1, PAIR_Q4_1);
                    const __m512i idx = _mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                         2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j,
                                                         2 * j, 2 * j, 2 * j, 2 * j);
                    const __m512i hsel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * j))),
                                                            _mm256_set1_epi8((char)(1 << (2 * j + 1))), 1);
                    #pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const uint8_t *blk = row + r * rb + sb * bytes, *qs = blk + (high ? 48 : 16);
                        __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * j)));
                        z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 4), m4);
                        if (high) {
                            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
                            z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(qh, hsel), z, _mm512_set1_epi8(0x10));
                        }
                        __m512 sc = _mm512_permutexvar_ps(idx, ds[r]);
                        #pragma GCC unroll 8
                        for (int t = 0; t < TT; t++) {
                            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, a[t].q);
                            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc, a[t].dx), acc[r][t]);
                        }
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

TILED_KERNELS(avx512_rows2_q4_k, avx512_tile2_q4_k, avx512_k45_tile, 0, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q5_k, avx512_tile2_q5_k, avx512_k45_tile, 1, TILE_ROWS)

/* ---- 512-bit Q6_K: four rows per pass, 64 elements (4 sub-blocks of 16) per zmm ----
 * The stored value is q + 32: the -32 is folded into the vpdpbusd start value, and each
 * 4-lane group takes its sub-block's d * scale from one per-row vector of 16 scales. */

AVX512_INLINE void avx512_q6k_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x,
                                   int64_t xstride, int T, float *y, int64_t ystride, int unused, int R, int TT) {
    (void)unused;
    int64_t nsb = w->k / 256, rb = nsb * 210, pf = avx512_prefetch_distance(rb);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m512 acc[TILE_ROWS][TILE_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                __m512 sc[TILE_ROWS];
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = row + r * rb + sb * 210;
                    avx512_prefetch(blk, pf, 210);
                    __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
                    uint16_t h;
                    memcpy(&h, blk + 208, 2);
                    sc[r] = _mm512_mul_ps(s, _mm512_set1_ps(_cvtsh_ss(h)));
                }
                #pragma GCC unroll 2
                for (int k = 0; k < 4; k++) { /* sub-blocks 4k..4k+3 = activation blocks 2k, 2k+1 */
                    int h = k / 2, half = k % 2;
                    pair_act a[TILE_TOKENS];
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++)
                        a[t] = avx512_pair_act(x + (t0 + t) * xstride + sb * 8, 2 * k, 1, PAIR_Q6_K);
                    const __m512i idx = _mm512_set_epi32(4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 2,
                                                         4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 1, 4 * k + 1,
                                                         4 * k + 1, 4 * k + 1, 4 * k, 4 * k, 4 * k, 4 * k);
                    #pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const uint8_t *blk = row + r * rb + sb * 210;
                        /* 64 low-nibble bytes of this half (elements 0..63 low, 64..127 high nibbles) and its
                         * 32 high-bit bytes: bits 0-1, 2-3 for elements 0..63, bits 4-5, 6-7 for 64..127 */
                        __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
                        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                        qh = _mm512_mask_srli_epi16(qh, 0xFFFF0000u, qh, 2); /* [qh, qh >> 2] */
                        __m512i lo = half ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
                        __m512i hi = half ? _mm512_srli_epi16(qh, 4) : qh;
                        __m512i q = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(hi, m3), 4));
                        __m512 s = _mm512_permutexvar_ps(idx, sc[r]);
                        #pragma GCC unroll 8
                        for (int t = 0; t < TT; t++) {
                            __m512i p = _mm512_dpbusd_epi32(a[t].init, q, a[t].q);
                            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s, a[t].dx), acc[r][t]);
                        }
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

TILED_KERNELS(avx512_rows2_q6_k, avx512_tile2_q6_k, avx512_q6k_tile, 0, TILE_ROWS)

/* ---- 512-bit Q2_K / Q3_K: four rows per pass, 64 elements (4 sub-blocks of 16) per zmm.
 * 2-bit low parts: element 128h + 32s + l at bits 2s of qs[32h + l]. Q3_K adds bit
 * (4h + s) of hmask[l] as +4 (stored q + 4 = low | high << 2, in 0..7; the -4 goes into
 * the vpdpbusd start value) and has 6-bit signed sub-scales; Q2_K has 4-bit scales and
 * mins, whose term costs one FMA per super-block as in Q4_K. */

/* d * scale of the 16 sub-blocks; for Q2_K also dmin * min (*mins). */
AVX512_INLINE __m512 avx512_q23k_scales(const uint8_t *blk, int three, __m512 *mins) {
    if (three) {
        uint32_t sw[4];
        op_q3k_scales(blk, sw); /* into a vector from registers (a 16-byte load of the four
                                  * words just stored would stall on store forwarding) */
        __m128i v = _mm_sub_epi8(_mm_set_epi32((int)sw[3], (int)sw[2], (int)sw[1], (int)sw[0]), _mm_set1_epi8(32));
        uint16_t h;
        memcpy(&h, blk + 108, 2);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), _mm512_set1_ps(_cvtsh_ss(h)));
    }
    __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
    uint16_t d, dmin;
    memcpy(&d, blk + 80, 2);
    memcpy(&dmin, blk + 82, 2);
    *mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)), _mm512_set1_ps(_cvtsh_ss(dmin)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15))),
                         _mm512_set1_ps(_cvtsh_ss(d)));
}

AVX512_INLINE void avx512_q23k_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x,
                                    int64_t xstride, int T, float *y, int64_t ystride, int three, int R, int TT) {
    const int bytes = three ? 110 : 84, qso = three ? 32 : 16;
    int64_t nsb = w->k / 256, rb = nsb * bytes, pf = avx512_prefetch_distance(rb);
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m512 acc[TILE_ROWS][TILE_TOKENS];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                __m512 sc[TILE_ROWS], mins[TILE_ROWS];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = row + r * rb + sb * bytes;
                    avx512_prefetch(blk, pf, bytes);
                    sc[r] = avx512_q23k_scales(blk, three, &mins[r]);
                }
                if (!three) {
#pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) { /* the mins: - dmin * m_g * dx * sum(x over g) */
                        const cpu_q8_block *xb = x + (t0 + t) * xstride + sb * 8;
                        float xs[16];
#pragma GCC unroll 16
                        for (int g = 0; g < 16; g++) xs[g] = xb[g / 2].d * (float)xb[g / 2].sum16[g % 2];
                        __m512 xs16 = _mm512_loadu_ps(xs);
#pragma GCC unroll 8
                        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fnmadd_ps(mins[r], xs16, acc[r][t]);
                    }
                }
#pragma GCC unroll 2
                for (int k = 0; k < 4; k++) { /* sub-blocks 4k..4k+3 = activation blocks 2k, 2k+1 */
                    int h = k / 2, s0 = 2 * (k % 2);
                    pair_act a[TILE_TOKENS];
#pragma GCC unroll 8
                    for (int t = 0; t < TT; t++)
                        a[t] = avx512_pair_act(x + (t0 + t) * xstride + sb * 8, 2 * k, 1,
                                               three ? PAIR_Q3_K : PAIR_Q4_1);
                    const __m512i idx = _mm512_set_epi32(4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 2,
                                                         4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 1, 4 * k + 1,
                                                         4 * k + 1, 4 * k + 1, 4 * k, 4 * k, 4 * k, 4 * k);
                    const __m512i hsel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h + s0))),
                                                            _mm256_set1_epi8((char)(1 << (4 * h + s0 + 1))), 1);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const uint8_t *blk = row + r * rb + sb * bytes;
                        /* [qs_h >> 2 s0, qs_h >> 2 (s0 + 1)] & 3 */
                        __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + qso + 32 * h)));
                        q = _mm512_srli_epi16(q, 2 * s0);
                        q = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 2), m3);
                        if (three) {
                            __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
                            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hm, hsel), q, _mm512_set1_epi8(4));
                        }
                        __m512 s = _mm512_permutexvar_ps(idx, sc[r]);
#pragma GCC unroll 8
                        for (int t = 0; t < TT; t++) {
                            __m512i p = _mm512_dpbusd_epi32(a[t].init, q, a[t].q);
                            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s, a[t].dx), acc[r][t]);
                        }
                    }
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

TILED_KERNELS(avx512_rows2_q2_k, avx512_tile2_q2_k, avx512_q23k_tile, 0, TILE_ROWS)
TILED_KERNELS(avx512_rows2_q3_k, avx512_tile2_q3_k, avx512_q23k_tile, 1, TILE_ROWS)

/* ---- 512-bit MLX affine 4 and 8 bit: w = s * q + bias per group; same scheme as Q4_1
 * (two 32-element blocks per zmm, four rows per pass). MLX 4-bit takes CPU_ACT_Q8_EVENODD
 * activations, whose order matches the low/high nibble unpacking. */

AVX512_INLINE __m512 avx512_lanes2(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

AVX512_INLINE void avx512_mlx_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x,
                                   int64_t xstride, int T, float *y, int64_t ystride, int bits, int R, int TT) {
    int64_t nb = w->k / 32, rb = w->k * bits / 8, ng = w->k / w->group_size, bpg = w->group_size / 32;
    int64_t pf = avx512_prefetch_distance(rb);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m512 acc[TILE_ROWS][TILE_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b += 2) {
                int have2 = b + 1 < nb;
                pair_act a[TILE_TOKENS];
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) /* init 0, xs = dx * lane sums */
                    a[t] = avx512_pair_act(x + (t0 + t) * xstride, b, have2, PAIR_Q4_1);
                int64_t g0 = b / bpg, g1 = have2 ? (b + 1) / bpg : g0;
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *p0 = row + r * rb + b * (bits * 4), *p1 = have2 ? p0 + bits * 4 : p0;
                    avx512_prefetch(p0, pf, bits * 8);
                    __m512i z;
                    if (bits == 8) {
                        z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                                               _mm256_loadu_si256((const __m256i *)p1), 1);
                    } else {
                        z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p0));
                        z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128((const __m128i *)p1));
                        z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), _mm512_set1_epi8(0x0F));
                    }
                    int64_t gi = (n + r) * ng;
                    __m512 s, bias;
                    if (g0 == g1) { /* group size >= 64: one group covers the pair */
                        s = _mm512_set1_ps(PFX(sb)(w->sb_dtype, w->scales, gi + g0));
                        bias = _mm512_set1_ps(PFX(sb)(w->sb_dtype, w->biases, gi + g0));
                    } else {
                        s = avx512_lanes2(PFX(sb)(w->sb_dtype, w->scales, gi + g0),
                                          PFX(sb)(w->sb_dtype, w->scales, gi + g1));
                        bias = avx512_lanes2(PFX(sb)(w->sb_dtype, w->biases, gi + g0),
                                             PFX(sb)(w->sb_dtype, w->biases, gi + g1));
                    }
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) {
                        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, a[t].q);
                        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s, a[t].dx), acc[r][t]);
                        acc[r][t] = _mm512_fmadd_ps(bias, a[t].xs, acc[r][t]);
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

TILED_KERNELS(avx512_rows2_mlx4, avx512_tile2_mlx4, avx512_mlx_tile, 4, TILE_ROWS)
TILED_KERNELS(avx512_rows2_mlx8, avx512_tile2_mlx8, avx512_mlx_tile, 8, TILE_ROWS)

/* ---- Prefill GEMM on weights repacked per 16-row group (lanes = output rows) ----
 * For T > 1 the tile kernels above spend ~3 float ops per vpdpbusd (each 64-element
 * product is converted and scaled on its own). Here the weights of 16 rows and up to
 * PK_CHUNK blocks of 32 are unpacked once per call into a stack buffer laid out so that
 * zmm j of block b holds, in lane r, quants 4j..4j+3 of row r (unsigned bytes). A token's
 * 32 int8 activations then enter as eight 4-byte broadcasts; one block costs 8 vpdpbusd
 * and ~3 float ops for 16 rows x 32 columns, and the unpacked block is reused by every
 * token (PK_TT tokens per register tile, all T tokens per packed chunk). The per-block
 * float scale is a 16-lane vector (one value per row); formats with a min (Q4_1, Q5_1,
 * Q4_K, Q5_K, MLX) add min * dx * sum(x); stored offsets (Q4_0 8, Q5_0 16, Q8_0 128 as
 * unsigned, Q6_K 32) start the vpdpbusd chain at -offset * sum(x); Q6_K has a scale per 16
 * columns, so its chain is split in two halves (HALVES). Results differ from the row
 * kernels only in float summation order. */

#define PK_ROWS 16
#define PK_CHUNK 32 /* blocks of 32 columns per packed chunk: 22.5 KiB of buffer, L1-sized */
#define PK_TT 8     /* tokens per register tile */

typedef struct pk_buf {
    __m512i q[PK_CHUNK][8];  /* per block: first [16 rows][32 bytes] row-major, then transposed */
    float d[PK_CHUNK][PK_ROWS];  /* scale (Q6_K: of columns 0..15 of the block) */
    float d2[PK_CHUNK][PK_ROWS]; /* Q6_K: scale of columns 16..31 */
    float m[PK_CHUNK][PK_ROWS];  /* min (w = d * q + m) */
} pk_buf;

/* r * stride in lane r: the byte offsets of 16 rows, for gathers. */
AVX512_INLINE __m512i pk_lane_offsets(int stride) {
    return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32(stride));
}

/* Touches p + r * rb for the 16 rows (the direct packs' row streams, ahead of their loads). */
AVX512_INLINE void pk_prefetch16(const uint8_t *p, int64_t rb) {
    for (int r = 0; r < PK_ROWS; r++) _mm_prefetch((const char *)(p + r * rb), _MM_HINT_T0);
}

/* 16 rows' 16 bytes at p + r * rb (r = 0..15) as four vectors: vector j holds dword j of row
 * r in lane r. Loads place rows k, 4 + k, 8 + k, 12 + k in the 128-bit lanes of a[k]; an
 * in-lane 4x4 dword transpose then leaves rows 4L..4L+3 in lane group L, in order. */
AVX512_INLINE void pk_load16x4(const uint8_t *p, int64_t rb, __m512i out[4]) {
    __m512i a[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + k * rb)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (4 + k) * rb)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (8 + k) * rb)), 2);
        a[k] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (12 + k) * rb)), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Blocks ahead that pk_pack_direct prefetches each of its 16 row streams (one touch per two
 * blocks): the hardware prefetchers do not follow 16 streams rb bytes apart (4 and 16 blocks
 * ahead measured the same as 8: bench/results/kernel_choices.md, "CPU prefetch distances"). */
#define PK_PREFETCH 8

/* Block b of the packed layout from the 16 rows' quant bytes at p (rows rb apart): 4-bit
 * (nib): 16 bytes whose low nibbles are dwords 0..3 and high nibbles 4..7; else 32 bytes,
 * xor flip (Q8_0's signed bytes read as unsigned; 0 for MLX 8-bit). */
AVX512_INLINE void pk_pack_quads(pk_buf *buf, int b, const uint8_t *p, int64_t rb, int nib, __m512i flip) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i q[4];
    pk_load16x4(p, rb, q);
    if (!nib) {
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_store_si512(&buf->q[b][j], _mm512_xor_si512(q[j], flip));
        pk_load16x4(p + 16, rb, q);
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_store_si512(&buf->q[b][j + 4], _mm512_xor_si512(q[j], flip));
        return;
    }
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        _mm512_store_si512(&buf->q[b][j], _mm512_and_si512(q[j], m4));
        _mm512_store_si512(&buf->q[b][j + 4], _mm512_and_si512(_mm512_srli_epi32(q[j], 4), m4));
    }
}

/* Q4_0, Q4_1 and Q8_0 with all 16 rows present: the packed layout straight from the
 * weights. The 16 rows' quant bytes load and transpose as 16 x 4 dwords (pk_load16x4), so
 * dword j of the block arrives with row r in lane r: Q4_0 / Q4_1 nibbles 4j.. (low) and
 * 16 + 4j.. (high), Q8_0 bytes 4j.. (two such loads). One 16-lane gather brings the f16
 * scales (and the Q4_1 mins beside them). Bytes and scales are those of pk_unpack + the
 * transpose below, so results are bit-identical; the cost is what changes: ~60 simple
 * instructions per 16 rows x 32 columns instead of 16 row unpacks, 16 stores and 8
 * gathers. It is paid once per call for all T tokens, so it decides batched-decode speed
 * (on Zen 4, 1B Q4_0, T = 16: the old pack took twice the time of the dot products, and a
 * version gathering every dword was still slower than the pair tiles). 0: other formats. */
AVX512_INLINE int pk_pack_direct(const op_weight *w, int64_t g, int64_t c0, int cb, pk_fmt f, pk_buf *buf) {
    int bytes = f == PK_Q4_0 ? 18 : f == PK_Q4_1 ? 20 : f == PK_Q8_0 ? 34 : 0;
    int64_t rb = op_weight_row_bytes(w);
    if (!bytes) return 0;
    const int qoff = f == PK_Q4_1 ? 4 : 2;
    const __m512i vidx = pk_lane_offsets((int)rb);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const uint8_t *base = (const uint8_t *)w->data + g * rb + c0 * bytes;
    for (int b = 0; b < cb; b++, base += bytes) {
        if (!(b & 1))
            pk_prefetch16(base + PK_PREFETCH * bytes, rb);
        __m512i dm = _mm512_i32gather_epi32(vidx, base, 1); /* d (low half), Q4_1 m (high half) */
        _mm512_store_ps(buf->d[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        if (f == PK_Q4_1) _mm512_store_ps(buf->m[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
        pk_pack_quads(buf, b, base + qoff, rb, f != PK_Q8_0, flip);
    }
    return 1;
}

/* Q6_K the same way, a 256-column super-block (8 blocks of 32) per step: its 128 bytes of
 * low nibbles and 64 bytes of high bit pairs load and transpose as 12 x (16 x 4 dwords), and
 * block c = 4h + s of the super-block takes the low (s < 2) or high nibbles of ql half
 * 64h + 32(s & 1) and bits 2s, 2s + 1 of qh half 32h (as pk_unpack); the 16 int8 scales
 * load and transpose once, the f16 d comes by one gather. Bit-identical to pk_unpack + the
 * transpose. c0 and cb are whole super-blocks (PK_CHUNK is a multiple of 8, K of 256). */
AVX512_INLINE int pk_pack_direct_q6k(const op_weight *w, int64_t g, int64_t c0, int cb, pk_fmt f, pk_buf *buf) {
    int64_t rb = op_weight_row_bytes(w);
    if (f != PK_Q6_K || (c0 | cb) % 8) return 0;
    const __m512i vidx = pk_lane_offsets((int)rb);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    const uint8_t *blk = (const uint8_t *)w->data + g * rb + c0 / 8 * 210;
    for (int sb = 0; sb < cb / 8; sb++, blk += 210) {
        pk_prefetch16(blk + 2 * 210, rb);
        /* d: the f16 in the high half of the dword at 206 (reading past 210 could leave the tensor) */
        __m512 dd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_i32gather_epi32(vidx, blk + 206, 1), 16)));
        __m512i sc[4];
        pk_load16x4(blk + 192, rb, sc); /* dword j: scales 4j..4j+3, row r in lane r */
        for (int h = 0; h < 2; h++) {
            __m512i qh[8];
            pk_load16x4(blk + 128 + 32 * h, rb, qh);
            pk_load16x4(blk + 128 + 32 * h + 16, rb, qh + 4);
            for (int half = 0; half < 2; half++) { /* ql bytes 64h + 32 half .. + 31 */
                __m512i ql[8];
                pk_load16x4(blk + 64 * h + 32 * half, rb, ql);
                pk_load16x4(blk + 64 * h + 32 * half + 16, rb, ql + 4);
                for (int hi = 0; hi < 2; hi++) { /* s = 2 hi + half */
                    int s = 2 * hi + half, c = 4 * h + s, b = sb * 8 + c;
                    #pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) {
                        __m512i lo = _mm512_and_si512(hi ? _mm512_srli_epi32(ql[j], 4) : ql[j], m4);
                        __m512i top = _mm512_and_si512(_mm512_srlv_epi32(qh[j], _mm512_set1_epi32(2 * s)), m2);
                        _mm512_store_si512(&buf->q[b][j], _mm512_or_si512(lo, _mm512_slli_epi32(top, 4)));
                    }
                    /* scales 2c and 2c + 1: bytes (2c) % 4 and + 1 of dword c / 2, sign-extended */
                    int k = (2 * c) % 4;
                    __m512i v = sc[c / 2];
                    __m512i s0 = _mm512_srai_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * k)), 24);
                    __m512i s1 = _mm512_srai_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi32(16 - 8 * k)), 24);
                    _mm512_store_ps(buf->d[b], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(s0)));
                    _mm512_store_ps(buf->d2[b], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(s1)));
                }
            }
        }
    }
    return 1;
}

/* Byte i (0..11) of 16 rows' Q4_K scale bytes, lane r = row r, from their dword transpose. */
AVX512_INLINE __m512i pk_q4k_byte(const __m512i s[4], int i) {
    return _mm512_and_si512(_mm512_srlv_epi32(s[i / 4], _mm512_set1_epi32(8 * (i % 4))), _mm512_set1_epi32(0xFF));
}

/* Q4_K the same way, a 256-column super-block per step: d and dmin by one gather, the 12
 * scale bytes by one load-transpose and unpacked to the 6-bit scale and min of each block
 * in the lanes (as pk_unpack: d = d * sc, m = -dmin * mn), the 128 bytes of nibbles by
 * 8 load-transposes, block 2p taking the low and 2p + 1 the high nibbles of bytes 32p...
 * Bit-identical to pk_unpack + the transpose. */
AVX512_INLINE int pk_pack_direct_q4k(const op_weight *w, int64_t g, int64_t c0, int cb, pk_fmt f, pk_buf *buf) {
    int64_t rb = op_weight_row_bytes(w);
    if (f != PK_Q4_K || (c0 | cb) % 8) return 0;
    const __m512i vidx = pk_lane_offsets((int)rb);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const uint8_t *blk = (const uint8_t *)w->data + g * rb + c0 / 8 * 144;
    for (int sb = 0; sb < cb / 8; sb++, blk += 144) {
        pk_prefetch16(blk + 2 * 144, rb);
        __m512i dm = _mm512_i32gather_epi32(vidx, blk, 1);
        __m512 dd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        __m512 ndmin = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)))), sign));
        __m512i sc4[4];
        pk_load16x4(blk + 4, rb, sc4); /* dwords 0..2: the 12 scale bytes */
        for (int c = 0; c < 8; c++) {
            __m512i sc, mn;
            if (c < 4) {
                sc = _mm512_and_si512(pk_q4k_byte(sc4, c), m63);
                mn = _mm512_and_si512(pk_q4k_byte(sc4, c + 4), m63);
            } else {
                __m512i hi = pk_q4k_byte(sc4, c + 4);
                sc = _mm512_or_si512(_mm512_and_si512(hi, m15),
                                     _mm512_slli_epi32(_mm512_srli_epi32(pk_q4k_byte(sc4, c - 4), 6), 4));
                mn = _mm512_or_si512(_mm512_srli_epi32(hi, 4),
                                     _mm512_slli_epi32(_mm512_srli_epi32(pk_q4k_byte(sc4, c), 6), 4));
            }
            int b = sb * 8 + c;
            _mm512_store_ps(buf->d[b], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(sc)));
            _mm512_store_ps(buf->m[b], _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(mn)));
        }
        for (int p = 0; p < 4; p++) {
            __m512i q[8];
            pk_load16x4(blk + 16 + 32 * p, rb, q);
            pk_load16x4(blk + 16 + 32 * p + 16, rb, q + 4);
            int b = sb * 8 + 2 * p;
            #pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                _mm512_store_si512(&buf->q[b][j], _mm512_and_si512(q[j], m4));
                _mm512_store_si512(&buf->q[b + 1][j], _mm512_and_si512(_mm512_srli_epi32(q[j], 4), m4));
            }
        }
    }
    return 1;
}

/* Packs rows g..g+rows-1 (rows <= 16; missing rows become zeros), blocks c0..c0+cb-1. */
/* MLX affine 4- and 8-bit the same way: a block's 16 nibble bytes (4-bit: low nibbles are
 * the even-odd activations' first 16, high ones the last 16, as Q4_0's in-order halves) or
 * 32 bytes load and transpose as Q4_0's / Q8_0's (without Q8_0's sign flip: MLX 8-bit
 * bytes are unsigned already); each row's (scale, bias) of the block's group, from the
 * separate scale and bias arrays, once per group. Bit-identical to pk_unpack. */
AVX512_INLINE int pk_pack_direct_mlx(const op_weight *w, int64_t g, int64_t c0, int cb, pk_fmt f, pk_buf *buf) {
    if (f != PK_MLX4 && f != PK_MLX8) return 0;
    const int bytes = f == PK_MLX4 ? 16 : 32;
    int64_t rb = op_weight_row_bytes(w), ng = w->k / w->group_size, bpg = w->group_size / 32;
    const uint8_t *base = (const uint8_t *)w->data + g * rb + c0 * bytes;
    float sc[PK_ROWS], bi[PK_ROWS];
    for (int b = 0; b < cb; b++, base += bytes) {
        if (!(b & 1)) pk_prefetch16(base + PK_PREFETCH * bytes, rb);
        int64_t grp = (c0 + b) / bpg;
        if (b == 0 || (c0 + b) % bpg == 0)
            for (int r = 0; r < PK_ROWS; r++) {
                sc[r] = PFX(sb)(w->sb_dtype, w->scales, (g + r) * ng + grp);
                bi[r] = PFX(sb)(w->sb_dtype, w->biases, (g + r) * ng + grp);
            }
        _mm512_store_ps(buf->d[b], _mm512_loadu_ps(sc));
        _mm512_store_ps(buf->m[b], _mm512_loadu_ps(bi));
        pk_pack_quads(buf, b, base, rb, f == PK_MLX4, _mm512_setzero_si512());
    }
    return 1;
}

AVX512_INLINE void pk_pack(const op_weight *w, int64_t g, int rows, int64_t c0, int cb, pk_fmt f, pk_buf *buf) {
    int64_t rb = op_weight_row_bytes(w);
    /* all 16 rows, lane offsets in int32: straight from the weights where the format has a direct pack */
    if (rows == PK_ROWS && rb <= INT32_MAX / PK_ROWS &&
        (pk_pack_direct(w, g, c0, cb, f, buf) || pk_pack_direct_q6k(w, g, c0, cb, f, buf) ||
         pk_pack_direct_q4k(w, g, c0, cb, f, buf) || pk_pack_direct_mlx(w, g, c0, cb, f, buf)))
        return;
    for (int r = 0; r < PK_ROWS; r++) {
        if (r >= rows) {
            for (int b = 0; b < cb; b++) {
                _mm256_store_si256((__m256i *)((uint8_t *)buf->q[b] + 32 * r), _mm256_setzero_si256());
                buf->d[b][r] = buf->d2[b][r] = buf->m[b][r] = 0;
            }
            continue;
        }
        const uint8_t *row = (const uint8_t *)w->data + (g + r) * rb;
        for (int b = 0; b < cb; b++) {
            __m256i q = PFX(pk_unpack)(w, row, g + r, c0 + b, f, &buf->d[b][r], &buf->d2[b][r], &buf->m[b][r]);
            _mm256_store_si256((__m256i *)((uint8_t *)buf->q[b] + 32 * r), q);
        }
    }
    /* [16 rows][8 dwords] -> [8 dwords][16 rows], in place per block */
    const __m512i vidx = pk_lane_offsets(32);
    for (int b = 0; b < cb; b++) {
        const int *base = (const int *)buf->q[b];
        __m512i t[8];
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) t[j] = _mm512_i32gather_epi32(vidx, base + j, 1);
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) _mm512_store_si512(&buf->q[b][j], t[j]);
    }
}

AVX512_INLINE __m512i pk_bcast(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* y rows (16 lanes, mask: valid rows) of TT tokens += the packed chunk times their activations. */
AVX512_INLINE void pk_compute(const pk_buf *buf, int cb, const cpu_q8_block *x, int64_t xstride, float *y,
                              int64_t ystride, __mmask16 mask, int accumulate, int off, const int TT,
                              const int kind) {
    __m512 acc[PK_TT];
    #pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = accumulate ? _mm512_maskz_loadu_ps(mask, y + t * ystride) : _mm512_setzero_ps();
    for (int b = 0; b < cb; b++) {
        const __m512i *W = buf->q[b];
        __m512 d = _mm512_load_ps(buf->d[b]);
        __m512 d2 = kind == PK_HALVES ? _mm512_load_ps(buf->d2[b]) : d;
        __m512 mn = kind == PK_MIN ? _mm512_load_ps(buf->m[b]) : d;
        #pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const cpu_q8_block *xb = x + t * xstride + b;
            int s0 = xb->sum16[0], s1 = xb->sum16[1];
            __m512i a0, a1;
            if (kind == PK_HALVES) {
                a0 = _mm512_set1_epi32(-off * s0);
                a1 = _mm512_set1_epi32(-off * s1);
            } else {
                a0 = _mm512_set1_epi32(-off * (s0 + s1));
                a1 = _mm512_setzero_si512();
            }
            #pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                a0 = _mm512_dpbusd_epi32(a0, W[j], pk_bcast(xb->q + 4 * j));
                a1 = _mm512_dpbusd_epi32(a1, W[j + 4], pk_bcast(xb->q + 16 + 4 * j));
            }
            __m512 dx = _mm512_set1_ps(xb->d);
            if (kind == PK_HALVES) {
                __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), d, _mm512_mul_ps(_mm512_cvtepi32_ps(a1), d2));
                acc[t] = _mm512_fmadd_ps(f, dx, acc[t]);
            } else {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_mul_ps(d, dx), acc[t]);
                if (kind == PK_MIN) acc[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xb->d * (float)(s0 + s1)), acc[t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < TT; t++) _mm512_mask_storeu_ps(y + t * ystride, mask, acc[t]);
}

typedef void (*pk_compute_fn)(const pk_buf *, int, const cpu_q8_block *, int64_t, float *, int64_t, __mmask16, int,
                              int);
#define PK_FN(KIND, TT)                                                                                     \
    __attribute__((target(KTARGET))) static void pk_compute_##KIND##_##TT(                                 \
        const pk_buf *buf, int cb, const cpu_q8_block *x, int64_t xs, float *y, int64_t ys, __mmask16 mask, \
        int accumulate, int off) {                                                                          \
        pk_compute(buf, cb, x, xs, y, ys, mask, accumulate, off, TT, KIND);                                 \
    }
#define PK_FNS(KIND) \
    PK_FN(KIND, 1) PK_FN(KIND, 2) PK_FN(KIND, 3) PK_FN(KIND, 4) PK_FN(KIND, 5) PK_FN(KIND, 6) PK_FN(KIND, 7) PK_FN(KIND, 8)
PK_FNS(PK_PLAIN)
PK_FNS(PK_MIN)
PK_FNS(PK_HALVES)
#define PK_ROW(KIND)                                                                                             \
    {NULL, pk_compute_##KIND##_1, pk_compute_##KIND##_2, pk_compute_##KIND##_3, pk_compute_##KIND##_4,           \
     pk_compute_##KIND##_5, pk_compute_##KIND##_6, pk_compute_##KIND##_7, pk_compute_##KIND##_8}
static const pk_compute_fn pk_fns[3][PK_TT + 1] = {PK_ROW(PK_PLAIN), PK_ROW(PK_MIN), PK_ROW(PK_HALVES)};

AVX512_INLINE void pk_gemm(const op_weight *w, int64_t n0, int64_t n1, const void *xv, int64_t xstride, int T,
                           float *y, int64_t ystride, pk_fmt f) {
    const cpu_q8_block *x = xv;
    int64_t nb = w->k / 32;
    pk_buf buf;
    const pk_compute_fn *fns = pk_fns[pk_kind(f)];
    int off = pk_offset(f);
    for (int64_t g = n0; g < n1; g += PK_ROWS) {
        int rows = n1 - g < PK_ROWS ? (int)(n1 - g) : PK_ROWS;
        __mmask16 mask = (__mmask16)((1u << rows) - 1);
        for (int64_t c0 = 0; c0 < nb; c0 += PK_CHUNK) {
            int cb = nb - c0 < PK_CHUNK ? (int)(nb - c0) : PK_CHUNK;
            pk_pack(w, g, rows, c0, cb, f, &buf);
            for (int t0 = 0; t0 < T; t0 += PK_TT) {
                int tt = T - t0 < PK_TT ? T - t0 : PK_TT;
                fns[tt](&buf, cb, x + t0 * xstride + c0, xstride, y + t0 * ystride + g, ystride, mask, c0 > 0, off);
            }
        }
    }
}

#define PK_TILE(NAME, FMT)                                                                                     \
    __attribute__((target(KTARGET))) static void NAME(const op_weight *w, int64_t n0, int64_t n1,           \
                                                      const void *x, int64_t xstride, int T, float *y,       \
                                                      int64_t ystride) {                                     \
        pk_gemm(w, n0, n1, x, xstride, T, y, ystride, FMT);                                                  \
    }
PK_TILE(avx512_pk_q4_0, PK_Q4_0)
PK_TILE(avx512_pk_q4_1, PK_Q4_1)
PK_TILE(avx512_pk_q5_0, PK_Q5_0)
PK_TILE(avx512_pk_q5_1, PK_Q5_1)
PK_TILE(avx512_pk_q8_0, PK_Q8_0)
PK_TILE(avx512_pk_q4_k, PK_Q4_K)
PK_TILE(avx512_pk_q5_k, PK_Q5_K)
PK_TILE(avx512_pk_q6_k, PK_Q6_K)
PK_TILE(avx512_pk_q3_k, PK_Q3_K)
PK_TILE(avx512_pk_mlx4, PK_MLX4)
PK_TILE(avx512_pk_mlx8, PK_MLX8)
PK_TILE(avx512_pk_mlxb, PK_MLXB)
/* From how many tokens MLX 2/3/5/6-bit take the packed GEMM: with the shuffle/multiply
 * unpack (mlxb_unpack) it wins from 3 tokens on, and loses at 2 to the one-row kernel token
 * by token (bench/results/kernel_choices.md, "CPU MLX 2/3/5/6-bit"). */
#define MLXB_PACKED_FROM 3

/* MLX 2/3/5/6-bit below the packed GEMM's threshold: the one-row kernel token by token (the
 * packed GEMM unpacks their bit streams with scalar code, paid back only by many tokens). */
__attribute__((target(KTARGET))) static void avx512_mlxb_tokens(const op_weight *w, int64_t n0, int64_t n1,
                                                                const void *xv, int64_t xstride, int T, float *y,
                                                                int64_t ystride) {
    cpu_rows_fn r = cpu_avx512_rows1(w);
    const cpu_q8_block *x = xv;
    for (int t = 0; t < T; t++) r(w, n0, n1, x + t * xstride, y + t * ystride);
}

/* cpu_quantize_row_ref 16 values per instruction: the same amax, d, 1/d and float product,
 * and the conversion rounds to nearest even like lrintf, so the bytes are identical
 * (tests/unit/test_cpu_matmul.c checks it). evenodd: a block's even inputs first, then its odd
 * ones (MLX 4-bit's order), one permute per half; the scalar form of it took ~5% of an MLX
 * 4-bit prefill. */
__attribute__((target(KTARGET))) void cpu_avx512_quantize_row(const float *x, int64_t k, cpu_q8_block *out,
                                                              int evenodd) {
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t b = 0; b < k / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        if (evenodd) {
            __m512 e = _mm512_permutex2var_ps(v0, even, v1);
            v1 = _mm512_permutex2var_ps(v0, odd, v1);
            v0 = e;
        }
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), lo);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), lo);
        cpu_q8_block *o = &out[b];
        o->d = d;
        o->sum16[0] = (int16_t)_mm512_reduce_add_epi32(q0);
        o->sum16[1] = (int16_t)_mm512_reduce_add_epi32(q1);
        _mm_storeu_si128((__m128i *)o->q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(o->q + 16), _mm512_cvtepi32_epi8(q1));
    }
}

int cpu_avx512_kernel(const op_weight *w, cpu_kernel *out) {
    if (w->dtype == DT_BF16 && cpu_avx512_bf16_kernel(w, out)) return 1; /* where the CPU has vdpbf16ps */
    /* decode: the 512-bit one-row kernel (kernels_avx512_rows.c) wherever it takes w */
    cpu_rows_fn r1 = cpu_avx512_rows1(w);
    cpu_rows_fn f = NULL;
    cpu_tile_fn tile = NULL, small = NULL;
    switch (w->dtype) {
    case DT_Q4_0: f = avx512_rows2_q4_0, tile = avx512_pk_q4_0, small = avx512_tile2_q4_0; break;
    case DT_Q4_1: f = avx512_rows2_q4_1, tile = avx512_pk_q4_1, small = avx512_tile2_q4_1; break;
    case DT_Q5_0: f = avx512_rows2_q5_0, tile = avx512_pk_q5_0, small = avx512_tile2_q5_0; break;
    case DT_Q5_1: f = avx512_rows2_q5_1, tile = avx512_pk_q5_1, small = avx512_tile2_q5_1; break;
    case DT_Q8_0: f = avx512_rows2_q8_0, tile = avx512_pk_q8_0, small = avx512_tile2_q8_0; break;
    case DT_Q2_K: f = avx512_rows2_q2_k, tile = avx512_tile2_q2_k; break;
    case DT_Q3_K: f = avx512_rows2_q3_k, tile = avx512_pk_q3_k, small = avx512_tile2_q3_k; break;
    case DT_Q4_K: f = avx512_rows2_q4_k, tile = avx512_pk_q4_k, small = avx512_tile2_q4_k; break;
    case DT_Q5_K: f = avx512_rows2_q5_k, tile = avx512_pk_q5_k, small = avx512_tile2_q5_k; break;
    case DT_Q6_K: f = avx512_rows2_q6_k, tile = avx512_pk_q6_k, small = avx512_tile2_q6_k; break;
    case DT_U32:
        if (w->bits == 4) {
            /* decode: the one-row kernel where it takes the weights (kernels_avx512_rows.c); the
             * packed GEMM from T = 6, as Q4_0's, since it packs straight from the weights
             * (pk_pack_direct_mlx; bench/results/kernel_choices.md, "CPU MLX 4-bit") */
            *out = (cpu_kernel){r1 ? r1 : avx512_rows2_mlx4, CPU_ACT_Q8_EVENODD, avx512_pk_mlx4, avx512_tile2_mlx4, 6};
            return 1;
        }
        if (w->bits == 8) f = avx512_rows2_mlx8, tile = avx512_pk_mlx8, small = avx512_tile2_mlx8;
        else { /* 2, 3, 5, 6 bits: the one-row kernel, the packed GEMM from 17 tokens */
            cpu_rows_fn r = cpu_avx512_rows1(w);
            if (r) {
                *out = (cpu_kernel){r, CPU_ACT_Q8, avx512_pk_mlxb, avx512_mlxb_tokens, MLXB_PACKED_FROM};
                return 1;
            }
            /* K not in whole 256-weight slots: the 256-bit row kernel (kernels_x86.inc rows_mlxb)
             * for one token, the packed GEMM for batches */
            if (!avx512_select(w, out)) return 0;
            out->tile = avx512_pk_mlxb;
            return 1;
        }
        break;
    default: break;
    }
    if (!f) return avx512_select(w, out);
    /* Decode (the rows kernel): the AVX2 kernels that stream one weight row at a time, for
     * the formats that have them: the four side-by-side row streams of a 4-row pass lose
     * from DRAM, as on Zen 3 (kernels_avx2.c). Prefill keeps the 512-bit tiles, which are
     * faster there (bench/results/kernel_choices.md, "CPU AVX-512 decode rows").
     * Where kernels_avx512_rows.c has a 512-bit one-row kernel (r1), that one; else the AVX2
     * one-row kernel with VNNI dots where it has them. */
    cpu_kernel a2;
    if (r1) f = r1;
    else if ((w->dtype == DT_Q4_0 || w->dtype == DT_Q4_1 || w->dtype == DT_Q8_0 ||
                                      w->dtype == DT_Q4_K || w->dtype == DT_Q6_K) &&
             cpu_avx2_kernel(w, &a2) && a2.act == CPU_ACT_Q8) {
        cpu_rows_fn r = cpu_avx2_vnni_rows(w);
        f = r ? r : a2.rows;
    }
    /* Q4_0 / Q4_1 / Q8_0 pack 16 rows straight from the weights (pk_pack_direct), so the
     * packed GEMM takes over from the pair tiles at a smaller T; each format's T below is
     * its crossover in bench/kernels/gemm_small_bench (bench/results/kernel_choices.md,
     * "CPU packed GEMM crossovers"). */
    int below = w->dtype == DT_Q4_0 || w->dtype == DT_Q4_K ? 6
                : w->dtype == DT_Q4_1                        ? 5
                : w->dtype == DT_Q8_0                        ? 9
                : w->dtype == DT_Q6_K                        ? 10
                                                             : CPU_TILE_SMALL_T_AVX512;
    *out = (cpu_kernel){f, CPU_ACT_Q8, tile, small, below};
    return 1;
}
