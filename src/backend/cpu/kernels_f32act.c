/* kernels_f32act.c: matmul kernels for quantized weights that take the activations as floats
 * (CPU_ACT_F32): each weight block is dequantized in registers (w = d q, or d q + m) and
 * multiplied with the float row in single-precision FMAs, with no int8 rounding of the
 * activations. matmul.c uses them where that rounding costs the most quality for the least
 * time (cpu_matmul_precise: the last layer's projections). One FMA chain per (output row,
 * token), over the blocks and then their four 8-wide groups in order, so the tile kernel gives
 * the rows kernel's bits for every token (batch invariance holds). AVX2+FMA+F16C, and the
 * same 16 wide on AVX-512 (its own summation order: each ISA level rounds its own way, as
 * the int8 kernels do); formats Q4_0, Q4_1, Q8_0. Must not allocate. */
#include "backend/cpu/kernels.h"
#include <immintrin.h>
#include <string.h>

#define KT __attribute__((target("avx2,fma,f16c")))
#define KT_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

KT_INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The 8 bytes at q (low 8 of an xmm) as floats. */
KT_INLINE __m256 bytes_f(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)); }
KT_INLINE __m256 sbytes_f(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)); }

/* Block b of a row as 4 x 8 floats, elements 0..31 in order. */
KT_INLINE void block_f32(tensor_dtype t, const uint8_t *b, __m256 w[4]) {
    if (t == DT_Q8_0) { /* f16 d, 32 int8 */
        __m256 d = _mm256_set1_ps(f16_at(b));
        __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2)), q1 = _mm_loadu_si128((const __m128i *)(b + 18));
        w[0] = _mm256_mul_ps(d, sbytes_f(q0));
        w[1] = _mm256_mul_ps(d, sbytes_f(_mm_srli_si128(q0, 8)));
        w[2] = _mm256_mul_ps(d, sbytes_f(q1));
        w[3] = _mm256_mul_ps(d, sbytes_f(_mm_srli_si128(q1, 8)));
        return;
    }
    /* Q4_0: f16 d, 16 bytes (element l the low nibble of byte l, l + 16 the high), q - 8;
     * Q4_1: f16 d, f16 m, the same nibbles, d q + m */
    int q41 = t == DT_Q4_1;
    __m256 d = _mm256_set1_ps(f16_at(b)), m = _mm256_set1_ps(q41 ? f16_at(b + 2) : -8.0f * f16_at(b));
    __m128i q = _mm_loadu_si128((const __m128i *)(b + (q41 ? 4 : 2))), mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    w[0] = _mm256_fmadd_ps(d, bytes_f(lo), m);
    w[1] = _mm256_fmadd_ps(d, bytes_f(_mm_srli_si128(lo, 8)), m);
    w[2] = _mm256_fmadd_ps(d, bytes_f(hi), m);
    w[3] = _mm256_fmadd_ps(d, bytes_f(_mm_srli_si128(hi, 8)), m);
}

/* acc += w . x over one block (x: 32 floats). */
KT_INLINE __m256 block_fma(const __m256 w[4], const float *x, __m256 acc) {
    acc = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc);
    acc = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc);
    acc = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc);
}

KT_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The two kernels of one ISA level: VEC a register of floats, a block NV of them, BLOCK its
 * dequantization, FMA acc += block . x, HSUM the chain's final sum.
 * ROWS: one token, four rows at a time (four independent chains).
 * TILE: T tokens, each block dequantized once per four tokens; row t of x at x + t * x_stride. */
#define F32ACT_KERNELS(ATTR, VEC, NV, ZERO, BLOCK, FMA, HSUM, ROWS, TILE)                                          \
    ATTR static void ROWS(const op_weight *w, int64_t n0, int64_t n1, const void *xv, float *y) {                  \
        const float *x = xv;                                                                                       \
        int64_t nb = w->k / 32, bb = tensor_dtype_block_bytes(w->dtype), rb = nb * bb;                             \
        const uint8_t *base = w->data;                                                                             \
        for (int64_t n = n0; n < n1; n += 4) {                                                                     \
            int nr = n1 - n < 4 ? (int)(n1 - n) : 4;                                                               \
            VEC acc[4] = {ZERO(), ZERO(), ZERO(), ZERO()};                                                         \
            for (int64_t b = 0; b < nb; b++)                                                                       \
                for (int r = 0; r < nr; r++) {                                                                     \
                    VEC wv[NV];                                                                                    \
                    BLOCK(w->dtype, base + (n + r) * rb + b * bb, wv);                                             \
                    acc[r] = FMA(wv, x + 32 * b, acc[r]);                                                          \
                }                                                                                                  \
            for (int r = 0; r < nr; r++) y[n + r] = HSUM(acc[r]);                                                  \
        }                                                                                                          \
    }                                                                                                              \
    ATTR static void TILE(const op_weight *w, int64_t n0, int64_t n1, const void *xv, int64_t x_stride, int T,     \
                          float *y, int64_t y_stride) {                                                            \
        const float *x = xv;                                                                                       \
        int64_t nb = w->k / 32, bb = tensor_dtype_block_bytes(w->dtype), rb = nb * bb;                             \
        const uint8_t *base = w->data;                                                                             \
        for (int64_t n = n0; n < n1; n++)                                                                          \
            for (int t0 = 0; t0 < T; t0 += 4) {                                                                    \
                int nt = T - t0 < 4 ? T - t0 : 4;                                                                  \
                VEC acc[4] = {ZERO(), ZERO(), ZERO(), ZERO()};                                                     \
                for (int64_t b = 0; b < nb; b++) {                                                                 \
                    VEC wv[NV];                                                                                    \
                    BLOCK(w->dtype, base + n * rb + b * bb, wv);                                                   \
                    for (int t = 0; t < nt; t++) acc[t] = FMA(wv, x + (int64_t)(t0 + t) * x_stride + 32 * b, acc[t]); \
                }                                                                                                  \
                for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * y_stride + n] = HSUM(acc[t]);                  \
            }                                                                                                      \
    }

F32ACT_KERNELS(KT, __m256, 4, _mm256_setzero_ps, block_f32, block_fma, hsum, f32act_rows, f32act_tile)

/* ---------- AVX-512: the same arithmetic 16 wide (a block is two vectors) ---------- */

#define KT5 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define KT5_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"), always_inline)) static inline

/* Block b of a row as 2 x 16 floats, elements 0..31 in order. */
KT5_INLINE void block_f32_512(tensor_dtype t, const uint8_t *b, __m512 w[2]) {
    if (t == DT_Q8_0) {
        __m512 d = _mm512_set1_ps(f16_at(b));
        w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))));
        w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))));
        return;
    }
    int q41 = t == DT_Q4_1;
    __m512 d = _mm512_set1_ps(f16_at(b)), m = _mm512_set1_ps(q41 ? f16_at(b + 2) : -8.0f * f16_at(b));
    __m128i q = _mm_loadu_si128((const __m128i *)(b + (q41 ? 4 : 2))), mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    w[0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m);
    w[1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m);
}

KT5_INLINE __m512 block_fma_512(const __m512 w[2], const float *x, __m512 acc) {
    acc = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x), acc);
    return _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + 16), acc);
}

KT5_INLINE float hsum_512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

F32ACT_KERNELS(KT5, __m512, 2, _mm512_setzero_ps, block_f32_512, block_fma_512, hsum_512, f32act_rows_512,
               f32act_tile_512)

int cpu_f32act_kernel(const op_weight *w, cpu_level level, cpu_kernel *out) {
    if ((w->dtype != DT_Q4_0 && w->dtype != DT_Q4_1 && w->dtype != DT_Q8_0) || w->k % 32) return 0;
    if (level >= CPU_LEVEL_AVX512) *out = (cpu_kernel){f32act_rows_512, CPU_ACT_F32, f32act_tile_512, NULL, 0};
    else *out = (cpu_kernel){f32act_rows, CPU_ACT_F32, f32act_tile, NULL, 0};
    return 1;
}
