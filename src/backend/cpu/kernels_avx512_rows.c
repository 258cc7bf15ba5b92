/* kernels_avx512_rows.c: 512-bit one-row decode (T = 1) kernels (Q8_0, Q5_0/1, Q2_K..Q6_K, MLX),
 * chosen by kernels_avx512.c on CPUs with AVX-512 VNNI. One weight row at a time (one
 * sequential stream per thread, which the hardware prefetcher follows best), 64 weight bytes
 * per zmm, activations staged once per call in the order the weights' nibbles come in. Must
 * not use extensions beyond F/BW/VL/VNNI, like kernels_avx512.c. */
#include "backend/cpu/kernels.h"
#include <immintrin.h>
#include <string.h>

#define R1_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define R1_INLINE __attribute__((target(R1_TARGET), always_inline)) static inline

/* Why these exist: one core streams weights from DRAM faster than the 256-bit one-row
 * kernels compute them (~100 instructions per Q4_K super-block, most of them per 32-element
 * block: a scale shuffle, an activation-scale broadcast, a pair of integer dots, a
 * conversion and an FMA). Here a zmm holds two blocks, and the integer sums of eight blocks
 * are folded into one vector before the float work (bench/results/kernel_choices.md, "CPU decode on AVX-512").
 * The summation order differs from the 256-bit kernels (test_cpu_matmul checks both
 * against the scalar reference). */

/* Super-blocks whose staged activations fit the stack (K <= 16384: 64 x 384 bytes, 24 KiB):
 * larger K keeps the 256-bit rows kernel (cpu_avx512_rows1 returns NULL). */
#define R1_MAX_SB 64

/* Software prefetch distance: about two rows of 1B-class weights ahead, as the 256-bit rows
 * kernels do (a2_prefetch_distance), capped so the lines are still in L1/L2 when used. */
R1_INLINE int64_t r1_prefetch_distance(int64_t row_bytes) {
    int64_t d = 2 * row_bytes;
    return d < 1024 ? 1024 : d > 8192 ? 8192 : d;
}

/* 64 int8 activations of blocks b0 and b1 (b0's 32 in the low half). */
R1_INLINE __m512i r1_pair_q(const cpu_q8_block *b0, const cpu_q8_block *b1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b0->q)),
                              _mm256_loadu_si256((const __m256i *)b1->q), 1);
}

/* A row's result: the 16 lanes of acc plus the 8 of accm (the mins' or biases' term). */
R1_INLINE float r1_total(__m512 acc, __m256 accm) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* ---- Q4_K: 144 bytes per 256 weights: f16 d, f16 dmin, 12 bytes of 6-bit scales sc_c and
 * mins m_c (c = 0..7), then 128 bytes where byte i of 32-byte chunk j holds element i of
 * sub-block 2j (low nibble) and of 2j + 1 (high). w = d * sc_c * q - dmin * m_c.
 * zmm u (0, 1) holds chunks 2u, 2u + 1: its low nibbles are sub-blocks [4u | 4u + 2], its
 * high nibbles [4u + 1 | 4u + 3], so the staged activations come in those four pairs. The
 * four vpdpbusd lane sums are then folded in the integer domain (shuffles and adds, off the
 * multiply pipes) into one vector of per-sub-block sums, and only that one is converted and
 * scaled: lanes [c0 c1 c4 c5 | c0 c1 c4 c5 | c2 c3 c6 c7 | c2 c3 c6 c7], each sub-block's sum
 * split over two lanes (elements 0-15 and 16-31). */
typedef struct r1_q4k_act {
    __m512i q[4]; /* sub-block pairs (0,2) (1,3) (4,6) (5,7) */
    __m512 d;     /* the activation scale of each lane of the folded sums */
    __m512 xs;    /* dx_c * sum(x_c) at the lanes of m_c in g (4-7: c = 0..3, 12-15: c = 4..7), else 0 */
} r1_q4k_act;

/* The folded lane order: sub-block of lane l. */
static const int r1_q4k_lane[16] = {0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7};
/* The same sub-blocks' lanes in the unpacked scale vector [sc0-3 m0-3 | sc4-7 m4-7]. */
static const int r1_q4k_glane[16] = {0, 1, 8, 9, 0, 1, 8, 9, 2, 3, 10, 11, 2, 3, 10, 11};

R1_INLINE void r1_q4k_prepare(const cpu_q8_block *x, int64_t nsb, r1_q4k_act *a) {
    for (int64_t sb = 0; sb < nsb; sb++) {
        const cpu_q8_block *xb = x + sb * 8;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            int c = (i >> 1) * 4 + (i & 1); /* 0, 1, 4, 5 with partner c + 2 */
            a[sb].q[i] = r1_pair_q(&xb[c], &xb[c + 2]);
        }
        float d[16], xs[16] = {0};
        for (int l = 0; l < 16; l++) d[l] = xb[r1_q4k_lane[l]].d;
        for (int c = 0; c < 8; c++) xs[c < 4 ? 4 + c : 8 + c] = xb[c].d * (float)(xb[c].sum16[0] + xb[c].sum16[1]);
        a[sb].d = _mm512_loadu_ps(d);
        a[sb].xs = _mm512_loadu_ps(xs);
    }
}

/* Folds the lane sums of the four pair dots into r1_q4k_lane order (exact: |sum| < 2^17). */
R1_INLINE __m512i r1_fold4(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* Eight consecutive activation blocks staged for kernels whose zmm pairs are blocks (0,1)
 * (2,3) (4,5) (6,7) (Q6_K, Q8_0). Lane 4k + j of r1_fold4 over the four pair dots sums 128-bit
 * lane k of pair j, which is half-block 4j + k (16 values: half (4j + k) % 2 of block
 * (4j + k) / 2), so the offsets and scales are staged in that order. */
typedef struct r1_oct_act {
    __m512i q[4]; /* the pairs' 64 int8 activations */
    __m512i off;  /* -offset * sum(x) of each folded lane's half block */
    __m512 d;     /* the activation scale of each folded lane */
} r1_oct_act;

/* Half-block of folded lane l. */
static const int r1_oct_half[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
/* The block of each folded lane (r1_oct_half[l] / 2). */
static const int r1_fold_blk[16] = {0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7};

/* dx * sum(x) of each block of ng groups of eight, for the mins' or biases' term. */
R1_INLINE void r1_block_xs(const cpu_q8_block *x, int64_t ng, __m256 *xs) {
    for (int64_t g = 0; g < ng; g++) {
        float v[8];
        for (int b = 0; b < 8; b++) v[b] = x[g * 8 + b].d * (float)(x[g * 8 + b].sum16[0] + x[g * 8 + b].sum16[1]);
        xs[g] = _mm256_loadu_ps(v);
    }
}

/* Stages n groups of eight blocks; offset is the weights' stored offset (Q6_K 32, Q8_0 read
 * as unsigned 128). */
R1_INLINE void r1_oct_prepare(const cpu_q8_block *x, int64_t n, int offset, r1_oct_act *a) {
    for (int64_t g = 0; g < n; g++) {
        const cpu_q8_block *xb = x + g * 8;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[g].q[i] = r1_pair_q(&xb[2 * i], &xb[2 * i + 1]);
        int32_t off[16];
        float d[16];
        for (int l = 0; l < 16; l++) {
            int h = r1_oct_half[l];
            off[l] = -offset * xb[h / 2].sum16[h % 2];
            d[l] = xb[h / 2].d;
        }
        a[g].off = _mm512_loadu_si512((const void *)off);
        a[g].d = _mm512_loadu_ps(d);
    }
}

R1_INLINE void r1_rows_q45_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv, float *y, int q5) {
    const int bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16; /* Q5_K: 32 bytes of fifth bits before the nibbles */
    int64_t nsb = w->k / 256, rb = nsb * bytes, pf = r1_prefetch_distance(rb);
    r1_q4k_act a[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_q4k_prepare(xv, nsb, a);
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(0x10);
    const __m512i lane = _mm512_loadu_si512((const void *)r1_q4k_glane);
    const __m512i dsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    /* Q5_K: the qh bit of each byte of the four nibble vectors: vector i (0: low nibbles of
     * chunks 0, 1; 1: their high nibbles; 2, 3: chunks 2, 3) holds sub-blocks [c | c + 2],
     * c = 4 (i / 2) + i % 2 */
    __m512i h5[4];
    for (int i = 0; i < 4; i++) {
        int c = 4 * (i / 2) + i % 2;
        h5[i] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << c)), _mm256_set1_epi8((char)(1 << (c + 2))), 1);
    }
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        __m512 accm = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * bytes;
            _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 128, _MM_HINT_T0);
            /* sc_c and m_c as bytes [sc0-3 m0-3 | sc4-7 m4-7]: cpu_q4k_scales_mins's 6-bit
             * unpack on both words at once, in the integer unit; then 16 float lanes times
             * [d x4, dmin x4, d x4, dmin x4] (g), from which the scales go to r1_q4k_glane
             * order and the mins' products to the zero-padded staged xs */
            uint32_t dm, u2;
            uint64_t w01;
            memcpy(&dm, blk, 4);
            memcpy(&w01, blk + 4, 8);
            memcpy(&u2, blk + 12, 4);
            uint64_t lo = w01 & 0x3f3f3f3f3f3f3f3full;
            uint64_t hi = (((uint64_t)u2 | (uint64_t)u2 << 28) & 0x0f0f0f0f0f0f0f0full) |
                          ((w01 >> 2) & 0x3030303030303030ull);
            __m512 g = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x((long long)hi, (long long)lo)));
            __m512 ddm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dm))); /* d, dmin */
            g = _mm512_mul_ps(g, _mm512_permutexvar_ps(dsel, ddm));
            accm = _mm512_fnmadd_ps(g, a[sb].xs, accm);
            __m512 scale = _mm512_permutexvar_ps(lane, g);
            __m512i raw0 = _mm512_loadu_si512((const void *)(blk + qs));
            __m512i raw1 = _mm512_loadu_si512((const void *)(blk + qs + 64));
            __m512i z = _mm512_setzero_si512();
            __m512i w0 = _mm512_and_si512(raw0, m4), w1 = _mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4);
            __m512i w2 = _mm512_and_si512(raw1, m4), w3 = _mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4);
            if (q5) { /* + 16 where bit c of qh[l] is set, c the sub-block of the byte (lanes as above) */
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
                w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(qh, h5[0]), w0, b16);
                w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(qh, h5[1]), w1, b16);
                w2 = _mm512_mask_add_epi8(w2, _mm512_test_epi8_mask(qh, h5[2]), w2, b16);
                w3 = _mm512_mask_add_epi8(w3, _mm512_test_epi8_mask(qh, h5[3]), w3, b16);
            }
            /* q <= 31, |x| <= 127: a lane's four products < 2^14 */
            __m512i p0 = _mm512_dpbusd_epi32(z, w0, a[sb].q[0]);
            __m512i p1 = _mm512_dpbusd_epi32(z, w1, a[sb].q[1]);
            __m512i p2 = _mm512_dpbusd_epi32(z, w2, a[sb].q[2]);
            __m512i p3 = _mm512_dpbusd_epi32(z, w3, a[sb].q[3]);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(r1_fold4(p0, p1, p2, p3)), _mm512_mul_ps(scale, a[sb].d), acc);
        }
        y[n] = _mm512_reduce_add_ps(_mm512_add_ps(acc, accm));
    }
}

__attribute__((target(R1_TARGET))) static void r1_rows_q4_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    r1_rows_q45_k(w, n0, n1, xv, y, 0);
}

/* Q5_K: Q4_K's layout with 32 bytes qh between the scales and the nibbles; element l of
 * sub-block c gains 16 where bit c of qh[l] is set (ggml's dequantize_row_q5_K). */
__attribute__((target(R1_TARGET))) static void r1_rows_q5_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    r1_rows_q45_k(w, n0, n1, xv, y, 1);
}

/* ---- Q6_K: 210 bytes per 256 weights: ql[128] low nibbles, qh[64] high two bits, 16 int8
 * scales (one per 16 elements), f16 d; stored q + 32. Half h (128 elements) takes ql[64h..+64)
 * as one zmm Z and qh[32h..+32): zmm A = low nibbles of Z with qh bits (<< 4 | << 2) is
 * elements 0..63 of the half (activation blocks 4h, 4h + 1), zmm B = high nibbles with qh
 * bits (>> 0 | >> 2) elements 64..127 (blocks 4h + 2, 4h + 3). Each 128-bit lane of a dot is
 * one 16-element scale group (a half block), so r1_fold4(A0, B0, A1, B1) is the 16 full group
 * sums in r1_oct_half order, no lane wasted. The stored + 32 is taken off in the integer
 * domain (- 32 * the group's activation sum, staged). */
__attribute__((target(R1_TARGET))) static void r1_rows_q6_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    int64_t nsb = w->k / 256, rb = nsb * 210, pf = r1_prefetch_distance(rb);
    r1_oct_act a[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_oct_prepare(xv, nsb, 32, a);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i group = _mm512_loadu_si512((const void *)r1_oct_half);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * 210;
            _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 192, _MM_HINT_T0);
            __m512i p[4];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i z = _mm512_loadu_si512((const void *)(blk + 64 * h));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                /* [qh << 2 | qh]: << 2 puts bits (0,1) (low half) or (2,3) (high) at 4, 5 for A;
                 * >> 2 puts bits (4,5) (low) or (6,7) (high) there for B */
                __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 2)), qh, 1);
                __m512i qa = _mm512_or_si512(_mm512_and_si512(z, m4), _mm512_and_si512(_mm512_slli_epi16(qq, 2), m30));
                __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z, 4), m4),
                                             _mm512_and_si512(_mm512_srli_epi16(qq, 2), m30));
                /* q <= 63, |x| <= 127: a lane's four products < 2^15 */
                p[2 * h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qa, a[sb].q[2 * h]);
                p[2 * h + 1] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qb, a[sb].q[2 * h + 1]);
            }
            /* group sums (< 2^18) less 32 * sum(x): exact in int32 and as floats */
            __m512i g = _mm512_add_epi32(r1_fold4(p[0], p[1], p[2], p[3]), a[sb].off);
            __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
            uint16_t dh;
            memcpy(&dh, blk + 208, 2);
            __m512 dd = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
            __m512 f = _mm512_mul_ps(_mm512_permutexvar_ps(group, _mm512_mul_ps(sc, dd)), a[sb].d);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), f, acc);
        }
        y[n] = _mm512_reduce_add_ps(acc);
    }
}

/* ---- Q3_K: 110 bytes per 256 weights: hmask[32], qs[64], 12 bytes of 6-bit sub-block scales
 * (+ 32), f16 d. Element 128n + 32j + l (n < 2, j < 4, l < 32) has its 2 low bits at bits 2j
 * of qs[32n + l] and its third bit at bit 4n + j of hmask[l]; w = d (s_g - 32) (q - 4), q =
 * low | third << 2 in 0..7, sub-block g = 8n + 2j + l / 16. So zmm j = (qs >> 2j) & 3 holds
 * elements 32j + l in its low half and 128 + 32j + l in its high half (activation blocks j and
 * 4 + j), and the third bits come from hmask in both halves, tested against bit j (low half)
 * and 4 + j (high). The four pair dots fold (r1_fold4) into lane 4k + j = half k % 2 of block
 * j (k < 2) or 4 + j (k >= 2), i.e. sub-block r1_q3k_sub[lane]; the stored + 4 comes off in
 * the integer domain (- 4 * that half-block's activation sum, staged). The 4-row kernels spent
 * a scale permute, a conversion and two float ops per 64 weights and row; here one of each
 * per super-block. */
static const int r1_q3k_sub[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};

/* Stages the activations of the Q2_K / Q3_K one-row kernels: pairs (j, 4 + j), the offset
 * -offset * sum(x) and the activation scale of each folded lane; for Q2_K (xs16 not NULL) also
 * d_x * sum(x) of each sub-block of 16 in natural order, for the mins' term. */
R1_INLINE void r1_q23k_prepare(const cpu_q8_block *x, int64_t nsb, int offset, r1_oct_act *a, __m512 *xs16) {
    for (int64_t sb = 0; sb < nsb; sb++) {
        const cpu_q8_block *xb = x + sb * 8;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) a[sb].q[j] = r1_pair_q(&xb[j], &xb[4 + j]);
        int32_t off[16];
        float d[16], xs[16];
        for (int l = 0; l < 16; l++) {
            int g = r1_q3k_sub[l];
            off[l] = -offset * xb[g / 2].sum16[g % 2];
            d[l] = xb[g / 2].d;
            xs[l] = xb[l / 2].d * (float)xb[l / 2].sum16[l % 2];
        }
        a[sb].off = _mm512_loadu_si512((const void *)off);
        a[sb].d = _mm512_loadu_ps(d);
        if (xs16) xs16[sb] = _mm512_loadu_ps(xs);
    }
}

/* The four pair dots of one Q2_K / Q3_K super-block's 2-bit planes (qs, 64 bytes at q), with
 * Q3_K's third bits (hm: hmask in both halves, tested against hsel[j]) when hsel is given,
 * folded into r1_q3k_sub lane order, plus the staged offsets. */
R1_INLINE __m512i r1_q23k_dots(__m512i qs, __m512i hm, const __m512i *hsel, const r1_oct_act *a) {
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    __m512i p[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i q = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), m3);
        if (hsel) q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hm, hsel[j]), q, four);
        /* q <= 7, |x| <= 127: a lane's four products < 2^12 */
        p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a->q[j]);
    }
    /* sub-block sums (< 2^15) less offset * sum(x): exact in int32 and as floats */
    return _mm512_add_epi32(r1_fold4(p[0], p[1], p[2], p[3]), a->off);
}

__attribute__((target(R1_TARGET))) static void r1_rows_q3_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    int64_t nsb = w->k / 256, rb = nsb * 110, pf = r1_prefetch_distance(rb);
    r1_oct_act a[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_q23k_prepare(xv, nsb, 4, a, NULL);
    const __m512i sub = _mm512_loadu_si512((const void *)r1_q3k_sub);
    __m512i hsel[4];
    for (int j = 0; j < 4; j++)
        hsel[j] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << j)), _mm256_set1_epi8((char)(1 << (4 + j))), 1);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * 110;
            _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
            __m512i qs = _mm512_loadu_si512((const void *)(blk + 32));
            __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
            __m512i g = r1_q23k_dots(qs, hm, hsel, &a[sb]);
            uint32_t sw[4];
            op_q3k_scales(blk, sw);
            __m128i v = _mm_sub_epi8(_mm_set_epi32((int)sw[3], (int)sw[2], (int)sw[1], (int)sw[0]), _mm_set1_epi8(32));
            uint16_t dh;
            memcpy(&dh, blk + 108, 2);
            __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)),
                                      _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh))));
            __m512 f = _mm512_mul_ps(_mm512_permutexvar_ps(sub, sc), a[sb].d);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), f, acc);
        }
        y[n] = _mm512_reduce_add_ps(acc);
    }
}

/* ---- Q2_K: 84 bytes per 256 weights: 16 bytes of sub-block scales (low nibble) and mins
 * (high), qs[64] as Q3_K's, f16 d, f16 dmin; w = d sc_g q - dmin m_g, q in 0..3. The 2-bit
 * planes as Q3_K (no third bit, no offset); the mins' term is one FMA per super-block against
 * the staged d_x * sum(x) of each sub-block, in natural order as the stored mins. */
__attribute__((target(R1_TARGET))) static void r1_rows_q2_k(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    int64_t nsb = w->k / 256, rb = nsb * 84, pf = r1_prefetch_distance(rb);
    r1_oct_act a[R1_MAX_SB];
    __m512 xs16[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_q23k_prepare(xv, nsb, 0, a, xs16);
    const __m512i sub = _mm512_loadu_si512((const void *)r1_q3k_sub), m4 = _mm512_set1_epi32(15);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * 84;
            _mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + pf + 64, _MM_HINT_T0);
            __m512i g = r1_q23k_dots(_mm512_loadu_si512((const void *)(blk + 16)), _mm512_setzero_si512(), NULL, &a[sb]);
            __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
            uint32_t dd;
            memcpy(&dd, blk + 80, 4);
            __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* d, dmin */
            __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sm, m4)), _mm512_broadcastss_ps(dm));
            __m512 mn = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)),
                                      _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
            accm = _mm512_fmadd_ps(mn, xs16[sb], accm);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), _mm512_mul_ps(_mm512_permutexvar_ps(sub, sc), a[sb].d), acc);
        }
        y[n] = _mm512_reduce_add_ps(_mm512_sub_ps(acc, accm));
    }
}

/* ---- Q8_0: 34 bytes per 32 weights: f16 d, then 32 int8. A zmm holds two consecutive blocks
 * in element order, read as unsigned (xor 0x80: offset 128), so a pair is one vpdpbusd
 * against the activations as they come. Eight blocks (four pairs) fold into one vector of
 * half-block sums (r1_fold4, r1_oct_half order), where the offset, the weights' d and the
 * activations' d apply once per lane. Only for K a multiple of 256 (whole groups):
 * with SmolLM2's K = 576 (two groups and two blocks) this measured no faster than the
 * 256-bit rows kernel (~21-24 vs ~25 GB/s from L2, one thread), and the same scheme for Q4_0
 * measured no faster at any K (K = 2048: 13.7-16.7 vs 15.6-22.6 GB/s), so Q4_0 keeps it. */
__attribute__((target(R1_TARGET))) static void r1_rows_q8_0(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    int64_t nb = w->k / 32, ng = nb / 8, rb = nb * 34, pf = r1_prefetch_distance(rb);
    r1_oct_act a[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_oct_prepare(xv, ng, 128, a);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i dup = _mm512_set_epi32(7, 6, 5, 4, 7, 6, 5, 4, 3, 2, 1, 0, 3, 2, 1, 0);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = row + g * 8 * 34;
            for (int off = 0; off < 8 * 34; off += 64) _mm_prefetch((const char *)p + pf + off, _MM_HINT_T0);
            __m512i q[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *p0 = p + 2 * i * 34;
                __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))),
                                               _mm256_loadu_si256((const __m256i *)(p0 + 36)), 1);
                q[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(z, flip), a[g].q[i]);
            }
            /* the weights' d in folded order: [b0 b2 b4 b6 b1 b3 b5 b7] */
            uint16_t dh[8];
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++) memcpy(&dh[(b & 1) * 4 + b / 2], p + b * 34, 2);
            __m512 dw = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)));
            /* half-block sums < 2^20 (16 x 255 x 127), less the offsets: exact, also as floats */
            __m512i s = _mm512_add_epi32(r1_fold4(q[0], q[1], q[2], q[3]), a[g].off);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_permutexvar_ps(dup, dw), a[g].d), acc);
        }
        y[n] = _mm512_reduce_add_ps(acc);
    }
}

/* ---- Q5_0 (22 bytes per 32 weights: f16 d, u32 qh, 16 bytes qs) and Q5_1 (24: f16 d, f16 m,
 * u32 qh, qs): element j is the nibble of qs[j % 16] (low for j < 16) plus 16 if bit j of qh
 * is set; w = d * (q - 16) (Q5_0) or d * q + m (Q5_1). As Q8_0 above: a zmm holds two
 * consecutive blocks in element order (unpacked as the 4-row kernels of kernels_avx512.c
 * do), eight blocks fold into one vector of half-block sums, and the float work is once per
 * eight blocks. Only for K a multiple of 256: at K = 640 (2.5 groups, the last
 * one half empty) it is no faster than the 4-row pair kernels, which keep that K
 * (bench/results/kernel_choices.md, "CPU Q5 one-row kernels"). */
R1_INLINE __m512i r1_q5_pair(const uint8_t *p0, const uint8_t *p1, int qo) {
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p0 + qo)));
    z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128((const __m128i *)(p1 + qo)));
    z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), _mm512_set1_epi8(0x0F));
    uint32_t h0, h1;
    memcpy(&h0, p0 + qo - 4, 4);
    memcpy(&h1, p1 + qo - 4, 4);
    return _mm512_mask_add_epi8(z, _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32), z, _mm512_set1_epi8(0x10));
}

/* Word indices, within the 8 blocks of a group (stride words apart), of the word at +off of
 * block blk[l] for lanes l < n (the rest 0). */
R1_INLINE __m512i r1_word_index(const int *blk, int n, int stride, int off) {
    int16_t idx[32] = {0};
    for (int l = 0; l < n; l++) idx[l] = (int16_t)(blk[l] * stride + off);
    return _mm512_loadu_si512((const void *)idx);
}

/* Lanes of the 16-bit words gathered from the group's 3 zmm (words 0..95): words below 64 by
 * one two-source permute, the rest from z2. */
R1_INLINE __m512i r1_words(__m512i z0, __m512i z1, __m512i z2, __m512i idx) {
    __m512i t = _mm512_permutex2var_epi16(z0, idx, z1);
    __mmask32 hi = _mm512_cmpge_epi16_mask(idx, _mm512_set1_epi16(64));
    return _mm512_mask_permutexvar_epi16(t, hi, _mm512_sub_epi16(idx, _mm512_set1_epi16(64)), z2);
}

R1_INLINE void r1_rows_q5(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, float *y, int with_min) {
    const int bytes = with_min ? 24 : 22, qo = with_min ? 8 : 6;
    int64_t nb = w->k / 32, ng = nb / 8, rb = nb * bytes;
    r1_oct_act a[R1_MAX_SB];
    __m256 xs[R1_MAX_SB]; /* Q5_1: dx * sum(x) of each block, for the mins */
    if (n0 >= n1) return;
    r1_oct_prepare(x, ng, with_min ? 0 : 16, a);
    if (with_min) r1_block_xs(x, ng, xs);
    /* the weights' f16 d in the folded lane order (block of lane l: r1_oct_half[l] / 2), and
     * the Q5_1 mins in block order, gathered from the group's bytes by word permutes (a
     * store-and-reload of eight 16-bit values stalled every group on the failed forwarding) */
    static const int seq[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const __m512i d_idx = r1_word_index(r1_fold_blk, 16, bytes / 2, 0), m_idx = r1_word_index(seq, 8, bytes / 2, 1);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        __m256 accm = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = row + g * 8 * bytes;
            __m512i q[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                q[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                           r1_q5_pair(p + 2 * i * bytes, p + (2 * i + 1) * bytes, qo), a[g].q[i]);
            /* the group's 176 (Q5_0) or 192 bytes; the last load masked to the group, so
             * nothing past the last row is read */
            __m512i z0 = _mm512_loadu_si512((const void *)p), z1 = _mm512_loadu_si512((const void *)(p + 64));
            __m512i z2 = _mm512_maskz_loadu_epi8(with_min ? ~0ull : (1ull << 48) - 1, p + 128);
            __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(r1_words(z0, z1, z2, d_idx)));
            /* half-block sums < 2^16 (16 x 31 x 127), less 16 x sum(x) for Q5_0: exact */
            __m512i s = _mm512_add_epi32(r1_fold4(q[0], q[1], q[2], q[3]), a[g].off);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, a[g].d), acc);
            if (with_min)
                accm = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(r1_words(z0, z1, z2, m_idx))), xs[g], accm);
        }
        y[n] = with_min ? r1_total(acc, accm) : _mm512_reduce_add_ps(acc);
    }
}

__attribute__((target(R1_TARGET))) static void r1_rows_q5_0(const op_weight *w, int64_t n0, int64_t n1, const void *x,
                                                            float *y) {
    r1_rows_q5(w, n0, n1, x, y, 0);
}

__attribute__((target(R1_TARGET))) static void r1_rows_q5_1(const op_weight *w, int64_t n0, int64_t n1, const void *x,
                                                            float *y) {
    r1_rows_q5(w, n0, n1, x, y, 1);
}

/* ---- MLX affine 4-bit (DT_U32, bits 4): 16 bytes per 32 weights (weight e at bits 4e of
 * its little-endian word, so byte j holds weights 2j (low nibble) and 2j + 1), and a (scale,
 * bias) pair per group of 32, 64 or 128 weights in two separate arrays [n][k / group] of
 * f16, bf16 or f32; w = scale * q + bias. The activations come even-odd (CPU_ACT_Q8_EVENODD),
 * so a block's low nibbles then its high ones are its 32 values in activation order: 64
 * weight bytes (four blocks) load as one zmm whose low and high nibbles are two dots against
 * staged activations (r1_mlx_act). Eight blocks fold into one vector of half-block sums,
 * scaled by their groups' scales (one permute of the group's 2-8 scales);
 * the biases meet dx * sum(x) of each block in an 8-lane sum. One row at a time: the 4-row
 * pair kernels read 12 streams (weights, scales, biases of 4 rows). */
R1_INLINE __m256 r1_sb8(tensor_dtype t, const void *base, int64_t i, __mmask8 m) {
    if (t == DT_F32) return _mm256_maskz_loadu_ps(m, (const float *)base + i);
    __m128i h = _mm_maskz_loadu_epi16(m, (const uint16_t *)base + i);
    if (t == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* The per-group (scale, bias) side of the MLX kernels: lane l of the folded sums belongs to
 * block lane_blk[l] of the 8, which lies in group lane_blk[l] / bpg of the window. */
typedef struct r1_mlx_sb {
    __m512i lidx;   /* each folded lane's group in the window */
    __m256i bidx;   /* each block's group in the window */
    __mmask8 gm;    /* the window's groups: 8 / bpg */
    int gpo;        /* groups per 8 blocks */
    int64_t gpr;    /* groups per row */
} r1_mlx_sb;

R1_INLINE r1_mlx_sb r1_mlx_sb_init(const op_weight *w, const int *lane_blk) {
    int bpg = (int)(w->group_size / 32);
    int32_t li[16], bi[8];
    for (int l = 0; l < 16; l++) li[l] = lane_blk[l] / bpg;
    for (int b = 0; b < 8; b++) bi[b] = b / bpg;
    return (r1_mlx_sb){_mm512_loadu_si512((const void *)li), _mm256_loadu_si256((const __m256i *)bi),
                       (__mmask8)((1u << (8 / bpg)) - 1), 8 / bpg, w->k / w->group_size};
}

/* Window g of row n: acc += the folded integer sums (exact) * scale * dx, accm += bias * xs. */
R1_INLINE void r1_mlx_group(const op_weight *w, const r1_mlx_sb *sb, int64_t n, int64_t g, __m512i folded, __m512 dx,
                            __m256 xs, __m512 *acc, __m256 *accm) {
    int64_t gi = n * sb->gpr + g * sb->gpo;
    __m256 s8 = r1_sb8(w->sb_dtype, w->scales, gi, sb->gm), b8 = r1_sb8(w->sb_dtype, w->biases, gi, sb->gm);
    __m512 sc = _mm512_permutexvar_ps(sb->lidx, _mm512_castps256_ps512(s8));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(folded), _mm512_mul_ps(sc, dx), *acc);
    *accm = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(b8, sb->bidx), xs, *accm);
}


/* Eight activation blocks staged for 64-byte weight loads: e[h] / o[h] hold the even / odd
 * 16 values of blocks 4h .. 4h + 3 (the first / second half of each even-odd block), so
 * the low and high nibbles of 64 weight bytes (four blocks) meet them as they load. Lane
 * 4k + j of r1_fold4(e0 dot, o0 dot, e1 dot, o1 dot) is then block 4 (j / 2) + k. */
typedef struct r1_mlx_act {
    __m512i e[2], o[2];
    __m512 d; /* the activation scale of each folded lane's block */
} r1_mlx_act;

R1_INLINE int r1_mlx_blk(int l) { return 4 * ((l % 4) / 2) + l / 4; }

__attribute__((target(R1_TARGET))) static void r1_rows_mlx4(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    const cpu_q8_block *x = xv;
    int64_t ng = w->k / 256, rb = w->k / 2;
    r1_mlx_act a[R1_MAX_SB];
    __m256 xs[R1_MAX_SB];
    if (n0 >= n1) return;
    for (int64_t g = 0; g < ng; g++) {
        const cpu_q8_block *xb = x + g * 8;
        for (int h = 0; h < 2; h++) {
            int8_t e[64], o[64];
            for (int k = 0; k < 4; k++) {
                memcpy(e + 16 * k, xb[4 * h + k].q, 16);
                memcpy(o + 16 * k, xb[4 * h + k].q + 16, 16);
            }
            a[g].e[h] = _mm512_loadu_si512((const void *)e);
            a[g].o[h] = _mm512_loadu_si512((const void *)o);
        }
        float d[16];
        for (int l = 0; l < 16; l++) d[l] = xb[r1_mlx_blk(l)].d;
        a[g].d = _mm512_loadu_ps(d);
    }
    r1_block_xs(x, ng, xs);
    int lane_blk[16];
    for (int l = 0; l < 16; l++) lane_blk[l] = r1_mlx_blk(l);
    const r1_mlx_sb sb = r1_mlx_sb_init(w, lane_blk);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        __m256 accm = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = row + g * 128;
            __m512i z0 = _mm512_loadu_si512((const void *)p), z1 = _mm512_loadu_si512((const void *)(p + 64));
            __m512i zero = _mm512_setzero_si512();
            __m512i q0 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(z0, m4), a[g].e[0]);
            __m512i q1 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4), a[g].o[0]);
            __m512i q2 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(z1, m4), a[g].e[1]);
            __m512i q3 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4), a[g].o[1]);
            /* half-block sums <= 16 x 15 x 127: exact */
            r1_mlx_group(w, &sb, n, g, r1_fold4(q0, q1, q2, q3), a[g].d, xs[g], &acc, &accm);
        }
        y[n] = r1_total(acc, accm);
    }
}

/* MLX affine 2, 3, 5 and 6 bits (the formats with no other fast kernel: before this, the
 * scalar reference at ~0.1-0.2 GB/s). Element j of a row sits at bits [j b, (j + 1) b) of
 * its little-endian bit stream, so the 8 elements 8L .. 8L + 7 of a block are exactly bytes
 * [L b, L b + b) of it: 128-bit lane L of a zmm takes those bytes, one in-lane byte shuffle
 * puts the two bytes holding element i in 16-bit word i (the same control in every lane),
 * a per-word shift and mask leave the element, and vpmovwb packs the block's 32 values in
 * element order; r1_rows_mlx_oct below then runs them as MLX 8-bit. */
R1_INLINE __m256i r1_mlxb_block(const uint8_t *p, int b, __m512i ctl, __m512i sh, __m512i mask) {
    /* only the lane's b bytes (masked loads: nothing read past the row; a word's second
     * byte past them reads 0, whose bits the mask drops) */
    const __mmask16 m = (__mmask16)((1u << b) - 1);
    __m512i z = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(m, p));
    z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, p + b), 1);
    z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, p + 2 * b), 2);
    z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, p + 3 * b), 3);
    return _mm512_cvtepi16_epi8(_mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_epi8(z, ctl), sh), mask));
}

/* MLX affine 8-bit (32 bytes per block, the unsigned q as stored) and 2/3/5/6-bit (unpacked
 * by r1_mlxb_block): a zmm holds two blocks in element order against in-order activations
 * (CPU_ACT_Q8), folded as Q8_0's (r1_oct_act, no offset). */
R1_INLINE void r1_rows_mlx_oct(const op_weight *w, int64_t n0, int64_t n1, const cpu_q8_block *x, float *y) {
    const int b = w->bits;
    int64_t ng = w->k / 256, rb = w->k * b / 8;
    r1_oct_act a[R1_MAX_SB];
    __m256 xs[R1_MAX_SB];
    if (n0 >= n1) return;
    r1_oct_prepare(x, ng, 0, a);
    r1_block_xs(x, ng, xs);
    const r1_mlx_sb sb = r1_mlx_sb_init(w, r1_fold_blk);
    int8_t ctl[64];
    int16_t shv[32];
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 8; i++) {
            ctl[16 * l + 2 * i] = (int8_t)(i * b / 8), ctl[16 * l + 2 * i + 1] = (int8_t)(i * b / 8 + 1);
            shv[8 * l + i] = (int16_t)(i * b % 8);
        }
    const __m512i vctl = _mm512_loadu_si512((const void *)ctl), vsh = _mm512_loadu_si512((const void *)shv);
    const __m512i vmask = _mm512_set1_epi16((short)((1 << b) - 1));
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->data + n * rb;
        __m512 acc = _mm512_setzero_ps();
        __m256 accm = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = row + g * 32 * b; /* 8 blocks of 4 b bytes */
            __m512i q[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512i z;
                if (b == 8) z = _mm512_loadu_si512((const void *)(p + 64 * i));
                else
                    z = _mm512_inserti64x4(_mm512_castsi256_si512(r1_mlxb_block(p + 8 * i * b, b, vctl, vsh, vmask)),
                                           r1_mlxb_block(p + (8 * i + 4) * b, b, vctl, vsh, vmask), 1);
                q[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, a[g].q[i]);
            }
            /* half-block sums <= 16 x 255 x 127 < 2^20: exact */
            r1_mlx_group(w, &sb, n, g, r1_fold4(q[0], q[1], q[2], q[3]), a[g].d, xs[g], &acc, &accm);
        }
        y[n] = r1_total(acc, accm);
    }
}

__attribute__((target(R1_TARGET))) static void r1_rows_mlx8(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    r1_rows_mlx_oct(w, n0, n1, xv, y);
}

__attribute__((target(R1_TARGET))) static void r1_rows_mlxb(const op_weight *w, int64_t n0, int64_t n1, const void *xv,
                                                            float *y) {
    r1_rows_mlx_oct(w, n0, n1, xv, y);
}

/* The one-row MLX kernels take these weights (K in whole groups of 256). */
static int r1_mlx_takes(const op_weight *w) {
    return w->dtype == DT_U32 && op_mlx_bits_ok(w->bits) &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
           (w->sb_dtype == DT_F16 || w->sb_dtype == DT_BF16 || w->sb_dtype == DT_F32);
}

cpu_rows_fn cpu_avx512_rows1(const op_weight *w) {
    if (w->k <= 0 || w->k % 256 || w->k / 256 > R1_MAX_SB) return NULL;
    if (r1_mlx_takes(w)) return w->bits == 4 ? r1_rows_mlx4 : w->bits == 8 ? r1_rows_mlx8 : r1_rows_mlxb;
    if (w->dtype == DT_Q5_0 || w->dtype == DT_Q5_1) return w->dtype == DT_Q5_0 ? r1_rows_q5_0 : r1_rows_q5_1;
    switch (w->dtype) {
    case DT_Q8_0: return r1_rows_q8_0;
    case DT_Q2_K: return r1_rows_q2_k;
    case DT_Q3_K: return r1_rows_q3_k;
    case DT_Q4_K: return r1_rows_q4_k;
    case DT_Q5_K: return r1_rows_q5_k;
    case DT_Q6_K: return r1_rows_q6_k;
    default: return NULL;
    }
}
