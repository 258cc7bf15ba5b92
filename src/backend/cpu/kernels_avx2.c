/* kernels_avx2.c: AVX2+FMA+F16C kernels: the x86 row kernels (kernels_x86.inc) plus
 * multi-row kernels for the formats of common GGUF files (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)
 * and a vectorized activation quantizer. Integer dots use maddubs (u8 x s8 -> saturating
 * i16 pairs) + madd (-> i32); every caller keeps the unsigned operand <= 128 (or the pair
 * sums provably inside i16) so nothing saturates. Must not allocate. */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <immintrin.h>
#include <string.h>

#define KTARGET "avx2,fma,f16c"
#define PFX(name) avx2_##name

__attribute__((target(KTARGET))) static inline __m256i avx2_dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* Signed x signed: move the sign of a onto b so the unsigned operand is |a| <= 128. */
__attribute__((target(KTARGET))) static inline __m256i avx2_dot_s8s8(__m256i a, __m256i b) {
    return avx2_dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}
/* u8 in 0..255 would saturate maddubs: use q - 128 (xor 0x80) as a signed byte. */
__attribute__((target(KTARGET))) static inline __m256i avx2_mlx8_dot(__m256i u, __m256i s) {
    return avx2_dot_s8s8(_mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)), s);
}

#define DOT_U8S8 avx2_dot_u8s8
#define DOT_S8S8 avx2_dot_s8s8
#define MLX8_DOT avx2_mlx8_dot
#define MLX8_OFFSET 128

#define DENSE_TT 2 /* tokens per pass of the dense tile (kernels_x86.inc) */
#include "backend/cpu/kernels_x86.inc"

/* ---- multi-row kernels ----
 * Decode streams every weight once per token, so a row kernel must unpack and dot a block
 * in a few cycles or one core cannot keep up with memory (the single-row kernels above took
 * ~10 cycles per Q4_0 block on Zen 3, about a third of the memory rate). Here R rows share
 * each activation block's load and offset terms, the stored offset (8 for Q4_0, 32 for
 * Q6_K) is taken off in the integer domain instead of a scalar correction per block, and
 * the Q4_K/Q6_K scales are unpacked once per super-block into float vectors. TT tokens
 * (prefill, batched decode) share each unpacked weight block. */
#define A2_ROWS 4
#define A2_TOKENS 2
#define A2_INLINE __attribute__((target(KTARGET), always_inline)) static inline

/* Software prefetch distance along a row range: one pass of A2_ROWS rows ahead (rows are
 * contiguous), at least 1 KiB, at most 16 KiB so lines are still cached when used (nearer
 * is slower, farther the same: bench/results/kernel_choices.md, "CPU prefetch distances"). */
A2_INLINE int64_t a2_prefetch_distance(int64_t row_bytes) {
    int64_t d = A2_ROWS * row_bytes;
    return d < 1024 ? 1024 : d > 16384 ? 16384 : d;
}

A2_INLINE float a2_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

A2_INLINE float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* i32 lane i = sum of bytes 4i..4i+3 of u (unsigned) times s (signed). */
A2_INLINE __m256i a2_dot(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

typedef enum a2_fmt { A2_Q4_0, A2_Q4_1, A2_Q8_0 } a2_fmt;

A2_INLINE uint64_t a2_ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* [sum of v[r]'s lanes 0..3 for r = 0..3 | the same of lanes 4..7]: four rows' dots in one
 * register by unpacks and adds (vphaddd issues at a quarter of an add's rate on Zen 3). */
A2_INLINE __m256i a2_sum4x4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(v0, v1), _mm256_unpackhi_epi32(v0, v1));
    __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(v2, v3), _mm256_unpackhi_epi32(v2, v3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* The f16 field at p of rows 0..3 (rows past R repeat row 0) as floats [r0..r3 | r0..r3]. */
A2_INLINE __m256 a2_f16x4x2(const uint8_t *p, int64_t rb, int R) {
    uint64_t h = a2_ld16(p) | a2_ld16(p + (R > 1 ? rb : 0)) << 16 | a2_ld16(p + (R > 2 ? 2 * rb : 0)) << 32 |
                 a2_ld16(p + (R > 3 ? 3 * rb : 0)) << 48;
    return _mm256_cvtph_ps(_mm_set1_epi64x((long long)h));
}

/* R rows x TT tokens of a 32-element block format (activation row t at x + t * xstride,
 * output y[t * ystride + n]). Each row's block dot (i32 lanes of 4 products) goes through
 * a2_sum4x4 with the other rows', so the offset, scale and min are applied once for four
 * rows: [rows 0..3, elements 0..15 | rows 0..3, elements 16..31]. Per Q8_0 block and row
 * that leaves the sign pair, maddubs, madd and ~3 shared operations instead of a
 * conversion, an FMA and four scalar scale operations (llvm-mca znver3: 9.6 vs 12.2
 * cycles per 4 row-blocks; one thread, CPU time, 8 interleaved rounds: 576 x 576 from L2
 * 28.9 vs 21.4 GB/s, 1536 x 576 26.0 vs 19.2, 1024 x 2048 from L3 about even). Rows past
 * R repeat row 0, so a row's arithmetic is the same in a 4-row pass and alone. */
A2_INLINE void a2_b32_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, int64_t xstride, int T,
                           float *y, int64_t ystride, a2_fmt f, int R, int TT) {
    const int bytes = f == A2_Q4_0 ? 18 : f == A2_Q4_1 ? 20 : 34, qo = f == A2_Q4_1 ? 4 : 2;
    int64_t nb = w->k / 32, rb = nb * bytes, pf = a2_prefetch_distance(rb);
    const __m256i m4 = _mm256_set1_epi8(0x0F), shift = _mm256_set_epi64x(4, 4, 0, 0);
    for (int64_t n = n0; n + R <= n1; n += R) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        for (int t0 = 0; t0 + TT <= T; t0 += TT) {
            __m256 acc[A2_TOKENS];
            #pragma GCC unroll 8
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *pb = row + b * bytes;
                __m256 d8 = a2_f16x4x2(pb, rb, R);
                __m256 m8 = f == A2_Q4_1 ? a2_f16x4x2(pb + 2, rb, R) : _mm256_setzero_ps();
                __m256i v[A2_ROWS][A2_TOKENS];
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *p = pb + r * rb;
                    if (f == A2_Q8_0 || !(b & 1)) _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                    __m256i z, zs = _mm256_setzero_si256();
                    if (f == A2_Q8_0) { /* signed weights: |w| as the unsigned operand, sign onto x */
                        zs = _mm256_loadu_si256((const __m256i *)(p + 2));
                        z = _mm256_sign_epi8(zs, zs);
                    } else { /* [qs, qs] >> [0, 4] per 64-bit lane: low nibbles, then high nibbles */
                        __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + qo)));
                        z = _mm256_and_si256(_mm256_srlv_epi64(raw, shift), m4);
                    }
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) {
                        __m256i q = _mm256_loadu_si256((const __m256i *)x[(t0 + t) * xstride + b].q);
                        v[r][t] = a2_dot(z, f == A2_Q8_0 ? _mm256_sign_epi8(q, zs) : q);
                    }
                }
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    const cpu_q8_block *xb = x + (t0 + t) * xstride + b;
                    __m256i dot = a2_sum4x4(v[0][t], v[R > 1 ? 1 : 0][t], v[R > 2 ? 2 : 0][t], v[R > 3 ? 3 : 0][t]);
                    __m256i hs = _mm256_setr_epi32(xb->sum16[0], xb->sum16[0], xb->sum16[0], xb->sum16[0], xb->sum16[1],
                                                   xb->sum16[1], xb->sum16[1], xb->sum16[1]);
                    if (f == A2_Q4_0) dot = _mm256_sub_epi32(dot, _mm256_slli_epi32(hs, 3)); /* stored q + 8 */
                    __m256 dx = _mm256_set1_ps(xb->d);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d8, dx), acc[t]);
                    if (f == A2_Q4_1) /* w = d * q + m */
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(m8, dx), _mm256_cvtepi32_ps(hs), acc[t]);
                }
            }
            #pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                float s[4];
                _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1)));
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) y[(t0 + t) * ystride + n + r] = s[r];
            }
        }
    }
}

/* ---- Q4_0 / Q4_1 by block pairs ----
 * The 16 packed bytes of blocks b and b + 1 fill one register as [qs_b | qs_b+1]; its low
 * nibbles are elements 0..15 of both blocks and its high nibbles elements 16..31. The
 * activations are rearranged to match once per call (a2_nib_pair, on the stack), so a
 * block pair costs one load, three unpack operations, two maddubs and a madd per row. The
 * four rows' integer dots (lanes 0-3: block b, 4-7: block b + 1) are then summed across
 * lanes by an unpack-and-add transpose into one register [rows 0..3 of b | rows 0..3 of
 * b + 1], which takes the stored offset (-8 * sum(x), exact in i32), one conversion and one
 * FMA by the rows' scales for all four rows: per row and pair that is ~2.5 operations
 * instead of an offset add, a scale permute, a conversion and an FMA (Zen 3: vpermps and
 * vphaddd issue at a half and a quarter of the rate of an add). A row's arithmetic is the
 * same in a 4-row pass and alone (rows past R repeat row 0), so results do not depend on
 * the row split. */
typedef struct a2_nib_pair {
    __m256i lo, hi; /* [x_b[0..15] | x_b+1[0..15]], [x_b[16..31] | x_b+1[16..31]] */
    __m256i off;    /* Q4_0: [8 * sum(x_b) x 4 | 8 * sum(x_b+1) x 4] (the stored offset) */
    __m256 xs;      /* Q4_1: [sum(x_b) x 4 | sum(x_b+1) x 4] as floats (for the min) */
    __m256 dx;      /* [d_b x 4 | d_b+1 x 4]: the activation scales beside 4 rows' weight scales */
} a2_nib_pair;
/* Pairs on the stack per token: K up to 16384 (larger K falls back to the block kernel). */
#define A2_NIB_MAX_PAIRS 256

A2_INLINE void a2_nib_prepare(const cpu_q8_block *x, int64_t nb, a2_fmt f, a2_nib_pair *out) {
    for (int64_t b = 0; b < nb; b += 2) {
        int have2 = b + 1 < nb; /* a lone last block pairs with zero activations */
        __m256i q0 = _mm256_loadu_si256((const __m256i *)x[b].q);
        __m256i q1 = have2 ? _mm256_loadu_si256((const __m256i *)x[b + 1].q) : _mm256_setzero_si256();
        a2_nib_pair *o = &out[b / 2];
        o->lo = _mm256_permute2x128_si256(q0, q1, 0x20);
        o->hi = _mm256_permute2x128_si256(q0, q1, 0x31);
        int s0 = x[b].sum16[0] + x[b].sum16[1], s1 = have2 ? x[b + 1].sum16[0] + x[b + 1].sum16[1] : 0;
        __m256i ls = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);
        o->off = f == A2_Q4_0 ? _mm256_slli_epi32(ls, 3) : _mm256_setzero_si256();
        o->xs = _mm256_cvtepi32_ps(ls);
        float d0 = x[b].d, d1 = have2 ? x[b + 1].d : 0.0f;
        o->dx = _mm256_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1);
    }
}

/* The f16 fields at offset off of blocks b, b + 1 of rows r0..r0+3 (rows past R repeat row 0)
 * as floats [r0 b, r1 b, r2 b, r3 b, r0 b+1, ...]; a lone last block repeats b. */
A2_INLINE __m256 a2_nib_f16x8(const uint8_t *p0, int64_t rb, int bytes, int have2, int R, int off) {
    const uint8_t *p[4];
    #pragma GCC unroll 4
    for (int r = 0; r < 4; r++) p[r] = p0 + (r < R ? r : 0) * rb + off;
    int n1 = have2 ? bytes : 0;
    uint64_t a = a2_ld16(p[0]) | a2_ld16(p[1]) << 16 | a2_ld16(p[2]) << 32 | a2_ld16(p[3]) << 48;
    uint64_t c = a2_ld16(p[0] + n1) | a2_ld16(p[1] + n1) << 16 | a2_ld16(p[2] + n1) << 32 | a2_ld16(p[3] + n1) << 48;
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)c, (long long)a));
}

A2_INLINE void a2_nib_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, int64_t xstride, int T,
                           float *y, int64_t ystride, a2_fmt f, int R, int TT) {
    const int bytes = f == A2_Q4_0 ? 18 : 20, qo = f == A2_Q4_0 ? 2 : 4;
    int64_t nb = w->k / 32, np = (nb + 1) / 2, rb = nb * bytes, pf = a2_prefetch_distance(rb);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    a2_nib_pair xp[A2_TOKENS][A2_NIB_MAX_PAIRS];
    if (n0 + R > n1) return; /* no row group: nothing to prepare */
    for (int t0 = 0; t0 + TT <= T; t0 += TT) {
        #pragma GCC unroll 8
        for (int t = 0; t < TT; t++) a2_nib_prepare(x + (t0 + t) * xstride, nb, f, xp[t]);
        for (int64_t n = n0; n + R <= n1; n += R) {
            const uint8_t *row = (const uint8_t *)w->data + n * rb;
            __m256 acc[A2_TOKENS]; /* [rows 0..3: even blocks | rows 0..3: odd blocks] */
            #pragma GCC unroll 8
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int64_t i = 0; i < np; i++) {
                int64_t b = 2 * i;
                int have2 = b + 1 < nb;
                const uint8_t *p0 = row + b * bytes;
                __m256 d8 = a2_nib_f16x8(p0, rb, bytes, have2, R, 0);
                __m256 m8 = f == A2_Q4_1 ? a2_nib_f16x8(p0, rb, bytes, have2, R, 2) : _mm256_setzero_ps();
                __m256i v[A2_ROWS][A2_TOKENS];
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *p = p0 + r * rb;
                    _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                    const uint8_t *p1 = have2 ? p + bytes : p;
                    __m256i raw = _mm256_loadu2_m128i((const __m128i *)(p1 + qo), (const __m128i *)(p + qo));
                    __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) {
                        const a2_nib_pair *a = &xp[t][i];
                        __m256i s16 =
                            _mm256_add_epi16(_mm256_maddubs_epi16(lo, a->lo), _mm256_maddubs_epi16(hi, a->hi));
                        v[r][t] = _mm256_madd_epi16(s16, ones);
                    }
                }
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    const a2_nib_pair *a = &xp[t][i];
                    __m256i dot = a2_sum4x4(v[0][t], v[R > 1 ? 1 : 0][t], v[R > 2 ? 2 : 0][t], v[R > 3 ? 3 : 0][t]);
                    dot = _mm256_sub_epi32(dot, a->off);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d8, a->dx), acc[t]);
                    if (f == A2_Q4_1) acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(m8, a->dx), a->xs, acc[t]);
                }
            }
            #pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                float s[4];
                _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1)));
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) y[(t0 + t) * ystride + n + r] = s[r];
            }
        }
    }
}

/* Q4_0/Q4_1 entry: the pair kernel where its stack buffer holds K, else the block kernel. */
A2_INLINE void a2_q4_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, int64_t xstride, int T,
                          float *y, int64_t ystride, a2_fmt f, int R, int TT) {
    if ((w->k / 32 + 1) / 2 <= A2_NIB_MAX_PAIRS)
        a2_nib_tile(w, n0, n1, x, xstride, T, y, ystride, f, R, TT);
    else
        a2_b32_tile(w, n0, n1, x, xstride, T, y, ystride, f, R, TT);
}

/* ---- Q4_0 / Q4_1 / Q8_0 decode, one row at a time ----
 * From DRAM one sequential weight stream per thread runs faster than four rows side by side
 * (see the note at the decode entry points below), but the tiles above with R = 1 waste most of a pass on
 * a single row (a transpose of four copies, eight f16 loads per block pair), and measured
 * slower than four rows for Q4_0/Q4_1 (bench/results/kernel_choices.md, "CPU batch-1 decode of Q4_0 / Q4_1 / Q8_0"). Here the transpose
 * takes four consecutive block pairs (Q4) or blocks (Q8_0) of one row instead of four rows:
 * lane j of the summed register is pair (block) j's even (first-half) dot, lane 4 + j its odd
 * (second-half) dot, then the scale products are formed for all four at once. To keep a row's
 * result bit-identical to the tiles' (where lane 0 and lane 4 accumulate the even and odd
 * chains block by block), the FMAs are then applied in the same order, lane j broadcast to
 * lanes 0 and 4 for j = 0..G-1. */

/* acc (+)= lane j of f * p (and of m * xs) for j < G, in that order, within each 128-bit
 * half: lane 0 and lane 4 carry the tiles' two accumulation chains of one row. */
A2_INLINE __m256 a2_chain(__m256 acc, __m256 f, __m256 p, __m256 m, __m256 xs, int has_min, int G) {
#define A2_CHAIN_STEP(IMM)                                                                                             \
    do {                                                                                                               \
        acc = _mm256_fmadd_ps(_mm256_permute_ps(f, IMM), _mm256_permute_ps(p, IMM), acc);                              \
        if (has_min) acc = _mm256_fmadd_ps(_mm256_permute_ps(m, IMM), _mm256_permute_ps(xs, IMM), acc);                \
    } while (0)
    A2_CHAIN_STEP(0x00);
    if (G > 1) A2_CHAIN_STEP(0x55);
    if (G > 2) A2_CHAIN_STEP(0xAA);
    if (G > 3) A2_CHAIN_STEP(0xFF);
#undef A2_CHAIN_STEP
    return acc;
}

/* Activation terms of four consecutive block pairs, laid out for a2_chain; pairs past the
 * row's end are zero (and never reach the chain). */
typedef struct a2_nib_quad {
    __m256i lo[4], hi[4]; /* pair j as a2_nib_pair's lo, hi */
    __m256i off;          /* Q4_0: [8 * sum(x) of pair j's even block, j = 0..3 | of its odd block] */
    __m256 xs, dx;        /* the same layout: sum(x) as floats (Q4_1), the activation scales */
} a2_nib_quad;

A2_INLINE void a2_nib_prepare_quads(const cpu_q8_block *x, int64_t nb, a2_fmt f, a2_nib_quad *out) {
    int64_t np = (nb + 1) / 2;
    for (int64_t q = 0; q < (np + 3) / 4; q++) {
        int s[8] = {0};
        float d[8] = {0};
        a2_nib_quad *o = &out[q];
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int64_t b = 8 * q + 2 * j;
            if (b >= nb) {
                o->lo[j] = o->hi[j] = _mm256_setzero_si256();
                continue;
            }
            int have2 = b + 1 < nb; /* a lone last block pairs with zero activations */
            __m256i q0 = _mm256_loadu_si256((const __m256i *)x[b].q);
            __m256i q1 = have2 ? _mm256_loadu_si256((const __m256i *)x[b + 1].q) : _mm256_setzero_si256();
            o->lo[j] = _mm256_permute2x128_si256(q0, q1, 0x20);
            o->hi[j] = _mm256_permute2x128_si256(q0, q1, 0x31);
            s[j] = x[b].sum16[0] + x[b].sum16[1];
            d[j] = x[b].d;
            if (have2) s[4 + j] = x[b + 1].sum16[0] + x[b + 1].sum16[1], d[4 + j] = x[b + 1].d;
        }
        __m256i ls = _mm256_loadu_si256((const __m256i *)s);
        o->off = f == A2_Q4_0 ? _mm256_slli_epi32(ls, 3) : _mm256_setzero_si256();
        o->xs = _mm256_cvtepi32_ps(ls);
        o->dx = _mm256_loadu_ps(d);
    }
}

/* The lanes 0 + 4 sum of acc, as the tiles store a row's result. */
A2_INLINE float a2_chain_result(__m256 acc) {
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* The one-row Q4_0 / Q4_1 kernel (kernels_avx2_q4rows.inc): maddubs + madd here, and a
 * vpdpbusd copy for CPUs with AVX-512 VNNI (kernels_avx512.c takes it for decode). */
#define Q4R(name) a2_##name
#define Q4R_INLINE A2_INLINE
#define Q4R_DOT2(lo, alo, hi, ahi)                                                                                     \
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi)),                  \
                      _mm256_set1_epi16(1))
#include "backend/cpu/kernels_avx2_q4rows.inc"
#undef Q4R
#undef Q4R_INLINE
#undef Q4R_DOT2
#define A2V_TARGET KTARGET ",avx512f,avx512vl,avx512vnni"
#define Q4R(name) a2v_##name
#define Q4R_INLINE __attribute__((target(A2V_TARGET), always_inline)) static inline
#define Q4R_DOT2(lo, alo, hi, ahi) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, alo), hi, ahi)
#include "backend/cpu/kernels_avx2_q4rows.inc"
#undef Q4R
#undef Q4R_INLINE
#undef Q4R_DOT2

/* acc (+)= the dots of G Q8_0 blocks of one row (at p0) with activation blocks xb, in the
 * b32 tile's order: lanes 0..3 of the sum are the blocks' first halves, 4..7 their second. */
A2_INLINE __m256 a2_q8_quad_dot(const uint8_t *p0, const cpu_q8_block *xb, int64_t pf, __m256 acc, int G) {
    __m256i v[4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_setzero_si256();
        if (j >= G) continue;
        const uint8_t *p = p0 + 34 * j;
        _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
        __m256i zs = _mm256_loadu_si256((const __m256i *)(p + 2));
        __m256i q = _mm256_loadu_si256((const __m256i *)xb[j].q);
        v[j] = a2_dot(_mm256_sign_epi8(zs, zs), _mm256_sign_epi8(q, zs));
    }
    float d0 = xb[0].d, d1 = G > 1 ? xb[1].d : 0, d2 = G > 2 ? xb[2].d : 0, d3 = G > 3 ? xb[3].d : 0;
    __m256 dx = _mm256_setr_ps(d0, d1, d2, d3, d0, d1, d2, d3);
    __m256 p = _mm256_mul_ps(a2_f16x4x2(p0, 34, G), dx);
    __m256 f = _mm256_cvtepi32_ps(a2_sum4x4(v[0], v[1], v[2], v[3]));
    return a2_chain(acc, f, p, p, p, 0, G);
}

/* a2_q8_quad_dot over a row of nb blocks. */
A2_INLINE __m256 a2_q8_quad_row(const uint8_t *row, const cpu_q8_block *x, int64_t nb, int64_t b, int64_t pf,
                                __m256 acc) {
    switch (nb - b) {
    case 1: return a2_q8_quad_dot(row + 34 * b, x + b, pf, acc, 1);
    case 2: return a2_q8_quad_dot(row + 34 * b, x + b, pf, acc, 2);
    case 3: return a2_q8_quad_dot(row + 34 * b, x + b, pf, acc, 3);
    default: return acc;
    }
}

A2_INLINE void a2_q8_rows1(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, float *y) {
    int64_t nb = w->k / 32, rb = nb * 34, pf = a2_prefetch_distance(rb), nb4 = nb / 4 * 4;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb4; b += 4) acc = a2_q8_quad_dot(row + 34 * b, x + b, pf, acc, 4);
        y[n] = a2_chain_result(a2_q8_quad_row(row, x, nb, nb4, pf, acc));
    }
}

/* Super-blocks whose activation terms a k-quant call prepares once on the stack per token:
 * K up to 16384 (larger K forms them per row group and super-block, ~1 vector op per block
 * and row more; Zen 3 L3-resident Q6_K 1024 x 2048, one thread: ~7% faster staged). */
#define A2_K_MAX_SB 64

/* Per super-block activation terms of the k-quants: dx_c and dx_c * sum(x_c) for its
 * eight 32-element blocks c. */
A2_INLINE void a2_k_act(const cpu_q8_block *xb, __m256 *dx, __m256 *xs) {
    *dx = _mm256_set_ps(xb[7].d, xb[6].d, xb[5].d, xb[4].d, xb[3].d, xb[2].d, xb[1].d, xb[0].d);
    __m256i s = _mm256_set_epi32(xb[7].sum16[0] + xb[7].sum16[1], xb[6].sum16[0] + xb[6].sum16[1],
                                 xb[5].sum16[0] + xb[5].sum16[1], xb[4].sum16[0] + xb[4].sum16[1],
                                 xb[3].sum16[0] + xb[3].sum16[1], xb[2].sum16[0] + xb[2].sum16[1],
                                 xb[1].sum16[0] + xb[1].sum16[1], xb[0].sum16[0] + xb[0].sum16[1]);
    *xs = _mm256_mul_ps(*dx, _mm256_cvtepi32_ps(s));
}

/* Q4_K: the 6-bit scales sc_c as i16 [sc_0..sc_7 | sc_0..sc_7] and [dmin * m_c] for
 * c = 0..7 from a super-block header. */
A2_INLINE void a2_q4k_scales(const uint8_t *blk, __m256i *sc16, __m256 *mn) {
    uint64_t sc, mins;
    cpu_q4k_scales_mins(blk, &sc, &mins);
    __m128i v = _mm_set_epi64x((long long)mins, (long long)sc);
    *sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(v, v));
    *mn =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), _mm256_set1_ps(a2_f16(blk + 2)));
}

/* R rows x TT tokens of Q4_K. Per row and super-block: w = d*sc_c*q - dmin*m_c. The 6-bit
 * scale sc_c enters in the integer domain (madd of the maddubs pairs by sc_c, picked by one
 * shuffle from the row's widened scales), so a sub-block's float step is a conversion and
 * an FMA by the activation scale dx_c, which every row shares (a broadcast load); d
 * multiplies each row's super-block sums once. Two sums per super-block (even and odd
 * sub-blocks) keep the FMA chains short. */
A2_INLINE void a2_q4k_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, int64_t xstride, int T,
                           float *y, int64_t ystride, int unused, int R, int TT) {
    (void)unused;
    int64_t nsb = w->k / 256, rb = nsb * 144, pf = a2_prefetch_distance(rb);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int staged = nsb <= A2_K_MAX_SB;
    __m256 xa[A2_TOKENS][A2_K_MAX_SB]; /* per token and super-block: xs of a2_k_act */
    if (n0 + R > n1) return;           /* no row group: nothing to prepare */
    for (int t0 = 0; t0 + TT <= T; t0 += TT) {
        #pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            for (int64_t sb = 0; staged && sb < nsb; sb++) {
                __m256 dx;
                a2_k_act(x + (t0 + t) * xstride + sb * 8, &dx, &xa[t][sb]);
            }
        for (int64_t n = n0; n + R <= n1; n += R) {
            const uint8_t *row = (const uint8_t *)w->data + n * rb;
            __m256 acc[A2_ROWS][A2_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                __m256 xs[A2_TOKENS];
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    if (staged) {
                        xs[t] = xa[t][sb];
                    } else {
                        __m256 dx;
                        a2_k_act(x + (t0 + t) * xstride + sb * 8, &dx, &xs[t]);
                    }
                }
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = row + r * rb + sb * 144, *qs = blk + 16;
                    _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
                    _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
                    _mm_prefetch((const char *)blk + pf + 128, _MM_HINT_T0);
                    __m256i sc16;
                    __m256 mn, sa[2][A2_TOKENS];
                    a2_q4k_scales(blk, &sc16, &mn);
                    #pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) { /* 32 bytes: sub-block 2j (low), 2j+1 (high nibbles) */
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                        __m256i q[2] = {_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)};
                        #pragma GCC unroll 2
                        for (int h = 0; h < 2; h++) {
                            const int c = 2 * j + h;
                            /* i16 sc_c in every lane: q <= 15 and sc_c <= 63 keep the dot < 2^19 */
                            __m256i scv =
                                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(2 * c | (2 * c + 1) << 8)));
                            #pragma GCC unroll 8
                            for (int t = 0; t < TT; t++) {
                                const cpu_q8_block *xb = x + (t0 + t) * xstride + sb * 8 + c;
                                __m256i p16 = _mm256_maddubs_epi16(q[h], _mm256_loadu_si256((const __m256i *)xb->q));
                                __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv));
                                __m256 dx = _mm256_broadcast_ss(&xb->d);
                                sa[h][t] = j == 0 ? _mm256_mul_ps(dot, dx) : _mm256_fmadd_ps(dot, dx, sa[h][t]);
                            }
                        }
                    }
                    __m256 dd = _mm256_set1_ps(a2_f16(blk));
                    #pragma GCC unroll 8
                    for (int t = 0; t < TT; t++) {
                        acc[r][t] = _mm256_fnmadd_ps(mn, xs[t], acc[r][t]);
                        acc[r][t] = _mm256_fmadd_ps(sa[0][t], dd, acc[r][t]);
                        acc[r][t] = _mm256_fmadd_ps(sa[1][t], dd, acc[r][t]);
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = a2_hsum(acc[r][t]);
        }
    }
}

/* R rows x TT tokens of Q6_K: 6-bit values stored as q + 32, 16-element int8 scales, one f16
 * d per super-block. As in Q4_K, the int8 scales enter in the integer domain (madd of the
 * maddubs pairs by [sc_2c x 8 | sc_2c+1 x 8], one shuffle per block from the row's scales
 * widened once), a block's float step is a conversion and an FMA by the activation scale
 * dx that every row shares, and d multiplies each half super-block's sum once. The -32
 * becomes sum_g sc_g * -32 * dx * sum(x_g) per half (the group sums come with the
 * activations, prepared once per call). */
typedef struct a2_q6k_act {
    __m256 xs[2]; /* per half h: -32 * dx * sum(x) of each 16-element scale group */
} a2_q6k_act;

A2_INLINE void a2_q6k_prepare(const cpu_q8_block *xb, a2_q6k_act *o) {
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const cpu_q8_block *b = xb + 4 * h;
        __m256 dx = _mm256_setr_ps(b[0].d, b[0].d, b[1].d, b[1].d, b[2].d, b[2].d, b[3].d, b[3].d);
        __m256 sums = _mm256_cvtepi32_ps(_mm256_setr_epi32(b[0].sum16[0], b[0].sum16[1], b[1].sum16[0], b[1].sum16[1],
                                                           b[2].sum16[0], b[2].sum16[1], b[3].sum16[0], b[3].sum16[1]));
        o->xs[h] = _mm256_mul_ps(_mm256_mul_ps(sums, dx), _mm256_set1_ps(-32.0f)); /* the stored q + 32 */
    }
}

A2_INLINE void a2_q6k_tile(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, int64_t xstride, int T,
                           float *y, int64_t ystride, int unused, int R, int TT) {
    (void)unused;
    int64_t nsb = w->k / 256, rb = nsb * 210, pf = a2_prefetch_distance(rb);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const int staged = nsb <= A2_K_MAX_SB;
    a2_q6k_act xa[A2_TOKENS][A2_K_MAX_SB];
    if (n0 + R > n1) return; /* no row group: nothing to prepare */
    for (int t0 = 0; t0 + TT <= T; t0 += TT) {
        #pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            for (int64_t sb = 0; staged && sb < nsb; sb++) a2_q6k_prepare(x + (t0 + t) * xstride + sb * 8, &xa[t][sb]);
        for (int64_t n = n0; n + R <= n1; n += R) {
            const uint8_t *row = (const uint8_t *)w->data + n * rb;
            __m256 acc[A2_ROWS][A2_TOKENS];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                a2_q6k_act XA[A2_TOKENS];
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    if (staged) {
                        XA[t] = xa[t][sb];
                    } else {
                        a2_q6k_prepare(x + (t0 + t) * xstride + sb * 8, &XA[t]);
                    }
                }
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = row + r * rb + sb * 210;
                    _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
                    _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
                    _mm_prefetch((const char *)blk + pf + 128, _MM_HINT_T0);
                    _mm_prefetch((const char *)blk + pf + 192, _MM_HINT_T0);
                    __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
                    __m256i s16 = _mm256_cvtepi8_epi16(s8); /* [sc_0..7 | sc_8..15] */
                    __m256 dd = _mm256_set1_ps(a2_f16(blk + 208));
                    #pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) { /* two halves of 128: ql 64 bytes, qh 32 bytes each */
                        __m256i sh = h ? _mm256_permute4x64_epi64(s16, 0xEE) /* the half's 8, twice */
                                       : _mm256_permute4x64_epi64(s16, 0x44);
                        __m256 S = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(s8, 8) : s8));
                        __m256 sa[A2_TOKENS];
                        #pragma GCC unroll 8
                        for (int t = 0; t < TT; t++) sa[t] = _mm256_mul_ps(S, XA[t].xs[h]);
                        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                        /* bits 2c, 2c+1 of qh become bits 4, 5 of value c (16-bit shifts: what crosses
                         * into the neighbouring byte is masked off) */
                        __m256i q[4] = {
                            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
                        #pragma GCC unroll 4
                        for (int c = 0; c < 4; c++) { /* activation block 4h + c; scales 8h + 2c, 8h + 2c + 1 */
                            /* i16 scale 2c in the low lane, 2c + 1 in the high lane */
                            const short lo = (short)(4 * c | (4 * c + 1) << 8),
                                        hi = (short)((4 * c + 2) | (4 * c + 3) << 8);
                            __m256i scv = _mm256_shuffle_epi8(
                                sh, _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
                            #pragma GCC unroll 8
                            for (int t = 0; t < TT; t++) {
                                const cpu_q8_block *xb = x + (t0 + t) * xstride + sb * 8 + 4 * h + c;
                                /* q <= 63: maddubs pairs stay inside i16 (<= 16002); times |sc| <= 128, two
                                 * pairs per i32 lane: < 2^23, exact as a float too */
                                __m256i p16 = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)xb->q));
                                __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv));
                                sa[t] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(&xb->d), sa[t]);
                            }
                        }
                        #pragma GCC unroll 8
                        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(sa[t], dd, acc[r][t]);
                    }
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                #pragma GCC unroll 8
                for (int t = 0; t < TT; t++) y[(t0 + t) * ystride + n + r] = a2_hsum(acc[r][t]);
        }
    }
}

/* Prefill (tile) entry point of a multi-row kernel FN(w, n0, n1, x, xstride, T, y, ystride,
 * ARG, rows, tokens): A2_ROWS rows and A2_TOKENS tokens at a time, the remaining rows one by
 * one, a last odd token in A2_ROWS-row tiles of its own (a token's sums are the same
 * operations in every pass: test_small_tiles_every_t). */
#define A2_TILE_KERNEL(TILE_NAME, FN, ARG)                                                                             \
    __attribute__((target(KTARGET))) static void TILE_NAME(const op_weight *w, int64_t n0, int64_t n1,                \
                                                           const void *xv, int64_t xstride, int T, float *y,           \
                                                           int64_t ystride) {                                          \
        const cpu_q8_block *x = xv;                                                                                    \
        int64_t n4 = n0 + (n1 - n0) / A2_ROWS * A2_ROWS;                                                               \
        int T2 = T / A2_TOKENS * A2_TOKENS;                                                                            \
        FN(w, n0, n4, x, xstride, T2, y, ystride, ARG, A2_ROWS, A2_TOKENS);                                            \
        FN(w, n4, n1, x, xstride, T2, y, ystride, ARG, 1, A2_TOKENS);                                                  \
        if (T2 < T) /* a leftover token: one more pass of A2_ROWS-row tiles, then the rows left over */                \
            FN(w, n0, n4, x + T2 * xstride, xstride, 1, y + T2 * ystride, ystride, ARG, A2_ROWS, 1);                   \
        for (int t = T2; t < T; t++)                                                                                   \
            FN(w, n4, n1, x + t * xstride, xstride, 1, y + t * ystride, ystride, ARG, 1, 1);                           \
    }
/* Decode (rows) entry point: CALL on the row range n0..n1-1 of w, activation x, output y. */
#define A2_ROWS_KERNEL(ROWS_NAME, CALL)                                                                                \
    __attribute__((target(KTARGET))) static void ROWS_NAME(const op_weight *w, int64_t n0, int64_t n1, const void *x, \
                                                           float *y) {                                                 \
        CALL;                                                                                                          \
    }

/* Decode one row at a time: from DRAM one sequential stream per thread runs faster than four
 * rows' streams side by side (bench/results/kernel_choices.md, "CPU batch-1 decode of GGUF Q4_K / Q6_K"), though from cache the
 * 1-row form computes ~10% slower.
 * A row's arithmetic is that of a 4-row pass (rows past R repeat row 0; a2_q4_rows1 and
 * a2_q8_rows1 keep the tiles' order), so the results are bit-identical to the tiles'. */
A2_TILE_KERNEL(a2_tile_q4_0, a2_q4_tile, A2_Q4_0)
A2_TILE_KERNEL(a2_tile_q4_1, a2_q4_tile, A2_Q4_1)
A2_TILE_KERNEL(a2_tile_q8_0, a2_b32_tile, A2_Q8_0)
A2_TILE_KERNEL(a2_tile_q4_k, a2_q4k_tile, 0)
A2_TILE_KERNEL(a2_tile_q6_k, a2_q6k_tile, 0)
A2_ROWS_KERNEL(a2_rows_q4_0, a2_q4_rows1(w, n0, n1, x, y, A2_Q4_0))
A2_ROWS_KERNEL(a2_rows_q4_1, a2_q4_rows1(w, n0, n1, x, y, A2_Q4_1))
A2_ROWS_KERNEL(a2_rows_q8_0, a2_q8_rows1(w, n0, n1, x, y))
__attribute__((target(A2V_TARGET))) static void a2v_rows_q4_0(const op_weight *w, int64_t n0, int64_t n1,
                                                               const void *x, float *y) {
    a2v_q4_rows1(w, n0, n1, x, y, A2_Q4_0);
}
__attribute__((target(A2V_TARGET))) static void a2v_rows_q4_1(const op_weight *w, int64_t n0, int64_t n1,
                                                               const void *x, float *y) {
    a2v_q4_rows1(w, n0, n1, x, y, A2_Q4_1);
}

cpu_rows_fn cpu_avx2_vnni_rows(const op_weight *w) {
    return w->dtype == DT_Q4_0 ? a2v_rows_q4_0 : w->dtype == DT_Q4_1 ? a2v_rows_q4_1 : NULL;
}
A2_ROWS_KERNEL(a2_rows_q4_k, a2_q4k_tile(w, n0, n1, x, 0, 1, y, 0, 0, 1, 1))
A2_ROWS_KERNEL(a2_rows_q6_k, a2_q6k_tile(w, n0, n1, x, 0, 1, y, 0, 0, 1, 1))

/* ---- Prefill GEMM on weights repacked per 8-row group (lanes = output rows) ----
 * The tiles above spend ~5 vector ops per 32-element block, row and token (maddubs, madd,
 * conversion, a scale permute, FMA); at 4 rows x 2 tokens the 2 vCPUs ran the 1B Q4_K_M
 * prefill at 0.77x llama.cpp. Here, as in kernels_avx512.c's pk_* kernels, the quants of 8
 * rows x P2_CHUNK blocks are unpacked once per call into a stack buffer where ymm j of
 * block b holds, in 32-bit lane r, quants 4j..4j+3 of row r (unsigned bytes). A token's 32
 * int8 activations enter as eight 4-byte broadcasts; eight maddubs summed in i16 and one
 * madd give the 8 rows' integer dots in 8 lanes, so a block costs ~20 ops for 8 rows
 * instead of ~40, and no horizontal sums are left. The i16 sums stay exact: a maddubs lane
 * is at most 2 * qmax * 127, so chains of 8 (qmax 15), 4 (31) or 2 (63) maddubs fit in
 * 32767 (P2 depth). Stored offsets (8, 16, 32) join the mins as m = -offset * d and enter
 * as m * dx * sum(x), like Q4_1's min. Q6_K has a scale per 16 columns: its block is two
 * halves (j 0..3, 4..7), each with its own scale and offset. Q8_0 is not here: as unsigned
 * bytes (q + 128) its maddubs lanes would saturate. Results differ from the row kernels
 * only in float summation order, and depend on K alone (never on T or the row split). */
#define P2_ROWS 8
#define P2_CHUNK 32 /* blocks of 32 columns per packed chunk */
/* 8-row groups packed per chunk: 8 x 12 KiB (L2), so each token tile's activations
 * (P2_TT x 32 blocks, 5 KiB) are read from L1 by 64 rows */
#define P2_GROUPS 8
#define P2_TT 4 /* tokens per register tile: 4 accumulators + 4 i16 chains + weights */

typedef struct p2_group {
    __m256i q[P2_CHUNK][8];      /* per block: first [8 rows][32 bytes] row-major, then transposed */
    float d[P2_CHUNK][P2_ROWS];  /* scale (Q6_K: of columns 0..15) */
    float d2[P2_CHUNK][P2_ROWS]; /* Q6_K: scale of columns 16..31 */
    float m[P2_CHUNK][P2_ROWS];  /* w = d * q + m, stored offsets folded in (Q6_K: columns 0..15) */
    float m2[P2_CHUNK][P2_ROWS]; /* Q6_K: of columns 16..31 */
} p2_group;

/* 8 rows x 8 dwords -> 8 dwords x 8 rows, in place. */
A2_INLINE void p2_transpose8(__m256i *q) {
    __m256i t[8], u[8];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m256i a = _mm256_load_si256(&q[2 * i]), b = _mm256_load_si256(&q[2 * i + 1]);
        t[2 * i] = _mm256_unpacklo_epi32(a, b);     /* r0d0 r1d0 r0d1 r1d1 | d4, d5 */
        t[2 * i + 1] = _mm256_unpackhi_epi32(a, b); /* d2, d3 | d6, d7 */
    }
    #pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {                                         /* rows 4i..4i+3 */
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);     /* d0 | d4 */
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);     /* d1 | d5 */
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]); /* d2 | d6 */
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]); /* d3 | d7 */
    }
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        _mm256_store_si256(&q[j], _mm256_permute2x128_si256(u[j], u[4 + j], 0x20));
        _mm256_store_si256(&q[j + 4], _mm256_permute2x128_si256(u[j], u[4 + j], 0x31));
    }
}

/* Packs rows g..g+rows-1 (rows <= 8; missing rows become zeros), blocks c0..c0+cb-1. */
A2_INLINE void p2_pack(const op_weight *w, int64_t g, int rows, int64_t c0, int cb, pk_fmt f, p2_group *buf) {
    int64_t rb = op_weight_row_bytes(w);
    float off = (float)pk_offset(f);
    for (int r = 0; r < P2_ROWS; r++) {
        if (r >= rows) {
            for (int b = 0; b < cb; b++) {
                _mm256_store_si256((__m256i *)((uint8_t *)buf->q[b] + 32 * r), _mm256_setzero_si256());
                buf->d[b][r] = buf->d2[b][r] = buf->m[b][r] = buf->m2[b][r] = 0;
            }
            continue;
        }
        const uint8_t *row = (const uint8_t *)w->data + (g + r) * rb;
        for (int b = 0; b < cb; b++) {
            float d, d2, m;
            __m256i q = avx2_pk_unpack(w, row, g + r, c0 + b, f, &d, &d2, &m);
            _mm256_store_si256((__m256i *)((uint8_t *)buf->q[b] + 32 * r), q);
            buf->d[b][r] = d;
            buf->d2[b][r] = d2;
            buf->m[b][r] = m - off * d; /* formats have a min or an offset, never both */
            buf->m2[b][r] = -off * d2;
        }
    }
    for (int b = 0; b < cb; b++) p2_transpose8(buf->q[b]);
}

A2_INLINE __m256i p2_bcast(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* y rows (8 lanes, the first `rows` valid) of TT tokens (+)= the packed chunk times their
 * activations. xs[t][b][h]: dx * sum(x) of block b's half h (HALVES) or of the block ([0]). */
A2_INLINE void p2_compute(const p2_group *buf, int cb, const cpu_q8_block *x, int64_t xstride,
                          const float (*xs)[P2_CHUNK][2], float *y, int64_t ystride, int rows, int accumulate,
                          const int TT, const int depth, const int halves) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 acc[P2_TT];
    #pragma GCC unroll 4
    for (int t = 0; t < TT; t++) acc[t] = accumulate ? _mm256_maskload_ps(y + t * ystride, mask) : _mm256_setzero_ps();
    const int seg = halves ? 4 : 8; /* registers per scale segment */
    for (int b = 0; b < cb; b++) {
        const __m256i *W = buf->q[b];
        __m256i s16[P2_TT], a32[P2_TT];
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i wj = _mm256_load_si256(&W[j]);
            #pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const cpu_q8_block *xb = x + t * xstride + b;
                __m256i p = _mm256_maddubs_epi16(wj, p2_bcast(xb->q + 4 * j));
                s16[t] = j % depth == 0 ? p : _mm256_add_epi16(s16[t], p);
                /* keeps the chain in this order: GCC otherwise reassociates the sums into trees
                 * whose live maddubs results push the accumulators out to the stack */
                __asm__("" : "+x"(s16[t]));
                if (j % depth == depth - 1) {
                    __m256i v = _mm256_madd_epi16(s16[t], ones);
                    a32[t] = j % seg == depth - 1 ? v : _mm256_add_epi32(a32[t], v);
                }
                if (j % seg == seg - 1) { /* a scale segment is complete */
                    __m256 dx = _mm256_set1_ps(xb->d);
                    __m256 d = _mm256_load_ps(halves && j >= 4 ? buf->d2[b] : buf->d[b]);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a32[t]), _mm256_mul_ps(d, dx), acc[t]);
                    __m256 m = _mm256_load_ps(halves && j >= 4 ? buf->m2[b] : buf->m[b]);
                    acc[t] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&xs[t][b][halves && j >= 4]), acc[t]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < TT; t++) _mm256_maskstore_ps(y + t * ystride, mask, acc[t]);
}

typedef void (*p2_compute_fn)(const p2_group *, int, const cpu_q8_block *, int64_t, const float (*)[P2_CHUNK][2],
                              float *, int64_t, int, int);
#define P2_FN(NAME, DEPTH, HALVES, TT)                                                                                 \
    __attribute__((target(KTARGET))) static void p2_compute_##NAME##_##TT(                                             \
        const p2_group *buf, int cb, const cpu_q8_block *x, int64_t xstride, const float(*xs)[P2_CHUNK][2], float *y,  \
        int64_t ystride, int rows, int accumulate) {                                                                   \
        p2_compute(buf, cb, x, xstride, xs, y, ystride, rows, accumulate, TT, DEPTH, HALVES);                          \
    }
#define P2_FNS(NAME, DEPTH, HALVES)                                                                                    \
    P2_FN(NAME, DEPTH, HALVES, 1)                                                                                      \
    P2_FN(NAME, DEPTH, HALVES, 2) P2_FN(NAME, DEPTH, HALVES, 3) P2_FN(NAME, DEPTH, HALVES, 4)
P2_FNS(q4, 8, 0)  /* quants <= 15 */
P2_FNS(q5, 4, 0)  /* quants <= 31 */
P2_FNS(q6k, 2, 1) /* quants <= 63, a scale per 16 columns */
#define P2_ROW(NAME)                                                                                                   \
    { NULL, p2_compute_##NAME##_1, p2_compute_##NAME##_2, p2_compute_##NAME##_3, p2_compute_##NAME##_4 }
static const p2_compute_fn p2_fns_q4[P2_TT + 1] = P2_ROW(q4), p2_fns_q5[P2_TT + 1] = P2_ROW(q5),
                                             p2_fns_q6k[P2_TT + 1] = P2_ROW(q6k);

A2_INLINE void p2_gemm(const op_weight *w, int64_t n0, int64_t n1, const void *xv, int64_t xstride, int T, float *y,
                       int64_t ystride, pk_fmt f) {
    const cpu_q8_block *x = xv;
    int64_t nb = w->k / 32;
    p2_group buf[P2_GROUPS];
    float xs[P2_TT][P2_CHUNK][2];
    int halves = pk_kind(f) == PK_HALVES;
    const p2_compute_fn *fns = p2_fns_q4;
    if (halves)
        fns = p2_fns_q6k;
    else if (f == PK_Q5_0 || f == PK_Q5_1 || f == PK_Q5_K)
        fns = p2_fns_q5;
    for (int64_t g0 = n0; g0 < n1; g0 += P2_ROWS * P2_GROUPS) {
        int groups = (int)((n1 - g0 + P2_ROWS - 1) / P2_ROWS);
        if (groups > P2_GROUPS) groups = P2_GROUPS;
        for (int64_t c0 = 0; c0 < nb; c0 += P2_CHUNK) {
            int cb = nb - c0 < P2_CHUNK ? (int)(nb - c0) : P2_CHUNK;
            for (int gi = 0; gi < groups; gi++) {
                int64_t g = g0 + gi * P2_ROWS;
                p2_pack(w, g, n1 - g < P2_ROWS ? (int)(n1 - g) : P2_ROWS, c0, cb, f, &buf[gi]);
            }
            for (int t0 = 0; t0 < T; t0 += P2_TT) {
                int tt = T - t0 < P2_TT ? T - t0 : P2_TT;
                for (int t = 0; t < tt; t++)
                    for (int b = 0; b < cb; b++) {
                        const cpu_q8_block *xb = x + (t0 + t) * xstride + c0 + b;
                        xs[t][b][0] = xb->d * (float)(halves ? xb->sum16[0] : xb->sum16[0] + xb->sum16[1]);
                        xs[t][b][1] = xb->d * (float)xb->sum16[1];
                        /* the next token tile's blocks (40 bytes each: every line gets one): T
                         * tokens' activations outgrow L2, and this loop stalled on them */
                        if (t0 + P2_TT + t < T) _mm_prefetch((const char *)(xb + P2_TT * xstride), _MM_HINT_T0);
                    }
                for (int gi = 0; gi < groups; gi++) {
                    int64_t g = g0 + gi * P2_ROWS;
                    fns[tt](&buf[gi], cb, x + t0 * xstride + c0, xstride, (const float(*)[P2_CHUNK][2])xs,
                            y + t0 * ystride + g, ystride, n1 - g < P2_ROWS ? (int)(n1 - g) : P2_ROWS, c0 > 0);
                }
            }
        }
    }
}

#define P2_TILE(NAME, FMT)                                                                                             \
    __attribute__((target(KTARGET))) static void NAME(const op_weight *w, int64_t n0, int64_t n1, const void *x,      \
                                                      int64_t xstride, int T, float *y, int64_t ystride) {             \
        p2_gemm(w, n0, n1, x, xstride, T, y, ystride, FMT);                                                            \
    }
P2_TILE(p2_tile_q4_0, PK_Q4_0)
P2_TILE(p2_tile_q4_1, PK_Q4_1)
P2_TILE(p2_tile_q5_0, PK_Q5_0)
P2_TILE(p2_tile_q5_1, PK_Q5_1)
P2_TILE(p2_tile_q4_k, PK_Q4_K)
P2_TILE(p2_tile_q5_k, PK_Q5_K)
P2_TILE(p2_tile_q6_k, PK_Q6_K)
P2_TILE(p2_tile_mlxb, PK_MLXB)

/* cpu_quantize_row_ref, 8 values per instruction: the same amax, d, 1/d and float product,
 * and the conversion rounds to nearest even like lrintf, so the bytes are identical
 * (tests/unit/test_cpu_matmul.c checks it). evenodd: a block's even inputs first, then its
 * odd ones (MLX 4-bit's order): a shuffle and a lane permute per 8. */
__attribute__((target(KTARGET))) void cpu_avx2_quantize_row(const float *x, int64_t k, cpu_q8_block *out,
                                                            int evenodd) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    for (int64_t b = 0; b < k / 32; b++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
        if (evenodd) { /* shuffle: [a0 a2 b0 b2 | a4 a6 b4 b6]; the 64-bit permute puts a's before b's */
            __m256 e0 = _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0));
            __m256 e1 = _mm256_shuffle_ps(v[2], v[3], _MM_SHUFFLE(2, 0, 2, 0));
            __m256 o0 = _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1));
            __m256 o1 = _mm256_shuffle_ps(v[2], v[3], _MM_SHUFFLE(3, 1, 3, 1));
            __m256 *in[4] = {&e0, &e1, &o0, &o1};
            for (int i = 0; i < 4; i++)
                v[i] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(*in[i]), _MM_SHUFFLE(3, 1, 2, 0)));
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid)), hi), lo);
        cpu_q8_block *o = &out[b];
        o->d = d;
        __m256i s0 = _mm256_add_epi32(q[0], q[1]), s1 = _mm256_add_epi32(q[2], q[3]);
        __m256i s = _mm256_hadd_epi32(s0, s1); /* [s0 pairs | s1 pairs] per 128-bit lane */
        s = _mm256_hadd_epi32(s, s);
        int32_t l[8];
        _mm256_storeu_si256((__m256i *)l, s);
        o->sum16[0] = (int16_t)(l[0] + l[4]);
        o->sum16[1] = (int16_t)(l[1] + l[5]);
        /* i32 -> i16 -> i8; packs work per 128-bit lane, the permute restores the order */
        __m256i w16 = _mm256_packs_epi32(q[0], q[1]), w16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i b8 = _mm256_packs_epi16(w16, w16b);
        b8 = _mm256_permutevar8x32_epi32(b8, _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0));
        _mm256_storeu_si256((__m256i *)o->q, b8);
    }
}

int cpu_avx2_kernel(const op_weight *w, cpu_kernel *out) {
    cpu_rows_fn f = NULL;
    cpu_tile_fn tile = NULL, small = NULL;
    switch (w->dtype) { /* small: batched decode, where packing would not pay (see kernels.h) */
    case DT_Q4_0: f = a2_rows_q4_0, tile = p2_tile_q4_0, small = a2_tile_q4_0; break;
    case DT_Q4_1: f = a2_rows_q4_1, tile = p2_tile_q4_1, small = a2_tile_q4_1; break;
    case DT_Q8_0: f = a2_rows_q8_0, tile = a2_tile_q8_0; break;
    case DT_Q4_K: f = a2_rows_q4_k, tile = p2_tile_q4_k, small = a2_tile_q4_k; break;
    case DT_Q6_K: f = a2_rows_q6_k, tile = p2_tile_q6_k, small = a2_tile_q6_k; break;
    default: break;
    }
    if (!f) {
        if (!avx2_select(w, out)) return 0;
        /* Q5 formats: the x86 row kernels for decode, the packed GEMM for every T > 1 (no
         * small tile to fall back on; Q5_0 2048 x 640, one thread, T = 4: ~20 GMAC/s packed,
         * 6-9 with a row pass per token) */
        if (w->dtype == DT_Q5_0) out->tile = p2_tile_q5_0;
        if (w->dtype == DT_Q5_1) out->tile = p2_tile_q5_1;
        if (w->dtype == DT_Q5_K) out->tile = p2_tile_q5_k;
        /* MLX 2/3/5/6, every batch: the packed GEMM beats the row kernel token by token from
         * 2 tokens on (bench/results/kernel_choices.md, "CPU MLX 2/3/5/6-bit") */
        if (w->dtype == DT_U32 && w->bits != 4 && w->bits != 8) out->tile = p2_tile_mlxb;
        return 1;
    }
    *out = (cpu_kernel){f, CPU_ACT_Q8, tile, small, 0};
    return 1;
}

__attribute__((target(KTARGET))) int64_t cpu_avx2_find_above(const float *y, int64_t from, int64_t n, float floor) {
    const __m256 f = _mm256_set1_ps(floor);
    int64_t i = from;
    for (; i + 32 <= n; i += 32) { /* ordered compares: NaN is never above */
        __m256 c0 = _mm256_cmp_ps(_mm256_loadu_ps(y + i), f, _CMP_GT_OQ);
        __m256 c1 = _mm256_cmp_ps(_mm256_loadu_ps(y + i + 8), f, _CMP_GT_OQ);
        __m256 c2 = _mm256_cmp_ps(_mm256_loadu_ps(y + i + 16), f, _CMP_GT_OQ);
        __m256 c3 = _mm256_cmp_ps(_mm256_loadu_ps(y + i + 24), f, _CMP_GT_OQ);
        if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(c0, c1), _mm256_or_ps(c2, c3)))) break;
    }
    for (; i < n; i++)
        if (y[i] > floor) return i;
    return n;
}
