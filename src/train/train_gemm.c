/* train_gemm.c: the float32 matrix product under every heavy op of LoRA training
 * (train_ops.h, tr_gemm): A and B packed into register-tile panels, an 8 x 48 outer-product
 * micro-kernel (AVX-512: 24 accumulators) over blocks of K, output panels handed to the
 * thread pool. Any strides on either input, so x W^T, dy W and the attention products
 * run without transposing anything first. Each output is one sum in k order (no split K),
 * whatever the threads. The packed panels live in a per-thread workspace kept between calls
 * (tr_gemm_release frees it). */
#include "train/train_ops.h"
#include "base/cpu_features.h"
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));
#define INL static inline __attribute__((always_inline))

/* The register tile: MR rows of A by NR = 16 * NV columns of B. 8 x 48 is 24 zmm
 * accumulators + 3 B vectors + 1 broadcast of the 32 AVX-512 registers; 48 columns divide
 * SmolLM-class widths (192, 576, 1536) exactly. */
#define MR 8
#define NV 3
#define NR (16 * NV)
/* Rows of K per pass: a packed B block (KC x NR floats, 96 KiB) stays in L2 while every
 * row tile of A runs over it. */
#define KC 512

INL v16 ld16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
INL void st16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

typedef struct gemm {
    int64_t M, N, K, sam, sak, sbk, sbn, ldc;
    const float *a, *b;
    float *c, *ap, *bp; /* ap: A packed, one [K][MR] panel per row tile; bp: KC x NR per thread */
    int flags, mtiles, npanels, mblocks, isa; /* isa: 2 AVX-512, 1 AVX2, 0 baseline */
    int64_t a_bs, b_bs, c_bs, ap_bs; /* batched products: product i reads a + i a_bs, */
    int b_div;                       /* b + (i / b_div) b_bs, writes c + i c_bs */
    int64_t mb; /* row tiles per task */
} gemm;

/* One stage of a block-swap transpose of rows lo, lo + d: lo keeps the elements of each
 * 2d-group's first half and takes the partner's first half; hi the second halves. Four
 * stages (d = 1, 2, 4, 8) transpose 16 x 16; the first three transpose each 8 x 8 half
 * of 8 rows. */
#define SWAP_L(e, d) ((e) & (d) ? 16 + (e) - (d) : (e))
#define SWAP_H(e, d) ((e) & (d) ? 16 + (e) : (e) + (d))
#define SWAP_IDX(F, d)                                                                                         \
    F(0, d), F(1, d), F(2, d), F(3, d), F(4, d), F(5, d), F(6, d), F(7, d), F(8, d), F(9, d), F(10, d), F(11, d), \
        F(12, d), F(13, d), F(14, d), F(15, d)
typedef int32_t vi16 __attribute__((vector_size(64)));
/* Elements of x (0..15) and y (16..31) picked by constant indices: GCC's and clang's
 * builtins for it differ (clang has no __builtin_shuffle; GCC 12 no __builtin_shufflevector). */
#if defined(__clang__)
#define SHUF2(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SHUF2(x, y, ...) __builtin_shuffle(x, y, (vi16){__VA_ARGS__})
#endif
#define SWAP_STAGE(r, n, d)                                                                                    \
    for (int i = 0; i < n; i++)                                                                                \
        if (!(i & d)) {                                                                                        \
            v16 x = r[i], y = r[i + d];                                                                        \
            r[i] = SHUF2(x, y, SWAP_IDX(SWAP_L, d)), r[i + d] = SHUF2(x, y, SWAP_IDX(SWAP_H, d));              \
        }

/* dst[k * ld + j] = src[j * ss + k] for j, k < 16 (16 rows of 16 floats, transposed). */
INL void transpose16(const float *src, int64_t ss, float *dst, int64_t ld) {
    v16 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = ld16(src + i * ss);
    SWAP_STAGE(r, 16, 1) SWAP_STAGE(r, 16, 2) SWAP_STAGE(r, 16, 4) SWAP_STAGE(r, 16, 8)
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) st16(dst + i * ld, r[i]);
}

/* dst[k * 8 + i] = src[i * ss + k] for i < 8, k < 16: 16 values of 8 rows, interleaved. */
INL void transpose8x16(const float *src, int64_t ss, float *dst) {
    v16 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = ld16(src + i * ss);
    SWAP_STAGE(r, 8, 1) SWAP_STAGE(r, 8, 2) SWAP_STAGE(r, 8, 4)
    /* r[i] is now column i (rows 0..7), then column 8 + i */
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        st16(dst + 16 * v, SHUF2(r[2 * v], r[2 * v + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23));
        st16(dst + 64 + 16 * v,
             SHUF2(r[2 * v], r[2 * v + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
    }
}


/* The k range row tile t reads: all of K, or only k <= m (TR_GEMM_K_LE_M) or k >= m
 * (TR_GEMM_K_GE_M) for some row m of the tile. */
static void tile_k_range(const gemm *g, int64_t t, int64_t *kb, int64_t *ke) {
    int64_t m0 = t * MR, m1 = m0 + MR < g->M ? m0 + MR : g->M;
    *kb = g->flags & TR_GEMM_K_GE_M ? m0 : 0;
    *ke = g->flags & TR_GEMM_K_LE_M ? (m1 < g->K ? m1 : g->K) : g->K;
}

/* Row tile t of A as [K][MR] (rows past M are zero; only its k range). */
INL void pack_a_body(const gemm *g, int t) {
    float *dst = g->ap + (int64_t)t * g->K * MR;
    int64_t m0 = (int64_t)t * MR, mr = g->M - m0 < MR ? g->M - m0 : MR, kb, ke;
    tile_k_range(g, t, &kb, &ke);
    if (g->sak == 1 && mr == MR) { /* row-major A: 8 x 16 blocks transposed in registers */
        const float *src = g->a + m0 * g->sam;
        int64_t k = kb;
        for (; k + 16 <= ke; k += 16)
            transpose8x16(src + k, g->sam, dst + k * MR);
        for (; k < ke; k++)
            for (int i = 0; i < MR; i++) dst[k * MR + i] = src[i * g->sam + k];
        return;
    }
    if (g->sak == 1) { /* the last, partial row tile */
        const float *src[MR];
        for (int i = 0; i < MR; i++) src[i] = g->a + (m0 + (i < mr ? i : 0)) * g->sam;
        for (int64_t k = kb; k < ke; k++)
            for (int i = 0; i < MR; i++) dst[k * MR + i] = i < mr ? src[i][k] : 0.0f;
        return;
    }
    if (g->sam == 1 && mr == MR) { /* column-major A (x^T, P^T): a tile's MR rows at one k are adjacent */
        const float *src = g->a + m0;
        for (int64_t k = kb; k < ke; k++) memcpy(dst + k * MR, src + k * g->sak, sizeof(float) * MR);
        return;
    }
    for (int64_t k = kb; k < ke; k++)
        for (int i = 0; i < MR; i++) dst[k * MR + i] = i < mr ? g->a[(m0 + i) * g->sam + k * g->sak] : 0.0f;
}

/* Columns n0 .. n0 + NR of B, rows k0 .. k0 + kc, as [kc][NR] (columns past N are zero). */
INL void pack_b(const gemm *g, int64_t n0, int64_t k0, int64_t kc, float *dst) {
    int64_t nr = g->N - n0 < NR ? g->N - n0 : NR;
    if (g->sbn == 1) { /* rows of B: copies */
        for (int64_t k = 0; k < kc; k++) {
            const float *s = g->b + (k0 + k) * g->sbk + n0;
            float *d = dst + k * NR;
            if (nr == NR) st16(d, ld16(s)), st16(d + 16, ld16(s + 16)), st16(d + 32, ld16(s + 32));
            else memcpy(d, s, sizeof(float) * (size_t)nr), memset(d + nr, 0, sizeof(float) * (size_t)(NR - nr));
        }
        return;
    }
    /* columns of B are rows in memory (x W^T): 16 x 16 blocks transposed in registers */
    int64_t j = 0, k = 0;
    if (g->sbk == 1) {
        for (; j + 16 <= nr; j += 16) {
            const float *s = g->b + (n0 + j) * g->sbn + k0;
            for (k = 0; k + 16 <= kc; k += 16)
                transpose16(s + k, g->sbn, dst + k * NR + j, NR);
            for (; k < kc; k++)
                for (int64_t jj = j; jj < j + 16; jj++) dst[k * NR + jj] = g->b[(n0 + jj) * g->sbn + (k0 + k)];
        }
    }
    for (; j < NR; j++) { /* what the blocks left: columns one by one */
        if (j >= nr) {
            for (k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
            continue;
        }
        const float *s = g->b + (n0 + j) * g->sbn + k0 * g->sbk;
        for (k = 0; k < kc; k++) dst[k * NR + j] = s[k * g->sbk];
    }
}

/* a macro, not a function: a helper built without the caller's target splits the vector */
#define splat(x) ((v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x})

/* The full tile: ct[MR][NR] (row stride lt) = (load ? ct : 0) + pa[kc][MR] . pb[kc][NR], in
 * 24 named accumulators (an array of them stays in memory). */
#define ACC_DECL(i) v16 c##i##0, c##i##1, c##i##2
#define ACC_INIT(i)                                                                                        \
    c##i##0 = load ? ld16(ct + i * lt) : (v16){0}, c##i##1 = load ? ld16(ct + i * lt + 16) : (v16){0},     \
    c##i##2 = load ? ld16(ct + i * lt + 32) : (v16){0}
#define ACC_FMA(i)                                                                                         \
    do {                                                                                                   \
        float ai = a[i];                                                                                  \
        v16 av = splat(ai);                                                                              \
        c##i##0 += av * b0, c##i##1 += av * b1, c##i##2 += av * b2;                                        \
    } while (0)
#define ACC_STORE(i) st16(ct + i * lt, c##i##0), st16(ct + i * lt + 16, c##i##1), st16(ct + i * lt + 32, c##i##2)
INL void tile_8x48(const float *a, const float *b, int64_t kc, float *ct, int64_t lt, int load) {
    ACC_DECL(0); ACC_DECL(1); ACC_DECL(2); ACC_DECL(3); ACC_DECL(4); ACC_DECL(5); ACC_DECL(6); ACC_DECL(7);
    ACC_INIT(0); ACC_INIT(1); ACC_INIT(2); ACC_INIT(3); ACC_INIT(4); ACC_INIT(5); ACC_INIT(6); ACC_INIT(7);
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        v16 b0 = ld16(b), b1 = ld16(b + 16), b2 = ld16(b + 32);
        ACC_FMA(0); ACC_FMA(1); ACC_FMA(2); ACC_FMA(3); ACC_FMA(4); ACC_FMA(5); ACC_FMA(6); ACC_FMA(7);
    }
    ACC_STORE(0); ACC_STORE(1); ACC_STORE(2); ACC_STORE(3); ACC_STORE(4); ACC_STORE(5); ACC_STORE(6); ACC_STORE(7);
}

/* The last panel of a width that 48 does not divide (attention's head_dim 64, a sequence's
 * T): 8 x 16 and 8 x 32 tiles, so the columns past N cost no multiply-adds. */
#define ACC1_INIT(i) v16 c##i##0 = load ? ld16(ct + i * lt) : (v16){0}
#define ACC1_FMA(i)                                                                                            \
    do {                                                                                                       \
        float ai = a[i];                                                                                       \
        c##i##0 += splat(ai) * b0;                                                                             \
    } while (0)
#define ACC1_STORE(i) st16(ct + i * lt, c##i##0)
INL void tile_8x16(const float *a, const float *b, int64_t kc, float *ct, int64_t lt, int load) {
    ACC1_INIT(0); ACC1_INIT(1); ACC1_INIT(2); ACC1_INIT(3); ACC1_INIT(4); ACC1_INIT(5); ACC1_INIT(6); ACC1_INIT(7);
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        v16 b0 = ld16(b);
        ACC1_FMA(0); ACC1_FMA(1); ACC1_FMA(2); ACC1_FMA(3); ACC1_FMA(4); ACC1_FMA(5); ACC1_FMA(6); ACC1_FMA(7);
    }
    ACC1_STORE(0); ACC1_STORE(1); ACC1_STORE(2); ACC1_STORE(3); ACC1_STORE(4); ACC1_STORE(5); ACC1_STORE(6);
    ACC1_STORE(7);
}
#define ACC2_INIT(i)                                                                                           \
    v16 c##i##0 = load ? ld16(ct + i * lt) : (v16){0}, c##i##1 = load ? ld16(ct + i * lt + 16) : (v16){0}
#define ACC2_FMA(i)                                                                                            \
    do {                                                                                                       \
        float ai = a[i];                                                                                       \
        v16 av = splat(ai);                                                                                    \
        c##i##0 += av * b0, c##i##1 += av * b1;                                                                \
    } while (0)
#define ACC2_STORE(i) st16(ct + i * lt, c##i##0), st16(ct + i * lt + 16, c##i##1)
INL void tile_8x32(const float *a, const float *b, int64_t kc, float *ct, int64_t lt, int load) {
    ACC2_INIT(0); ACC2_INIT(1); ACC2_INIT(2); ACC2_INIT(3); ACC2_INIT(4); ACC2_INIT(5); ACC2_INIT(6); ACC2_INIT(7);
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        v16 b0 = ld16(b), b1 = ld16(b + 16);
        ACC2_FMA(0); ACC2_FMA(1); ACC2_FMA(2); ACC2_FMA(3); ACC2_FMA(4); ACC2_FMA(5); ACC2_FMA(6); ACC2_FMA(7);
    }
    ACC2_STORE(0); ACC2_STORE(1); ACC2_STORE(2); ACC2_STORE(3); ACC2_STORE(4); ACC2_STORE(5); ACC2_STORE(6);
    ACC2_STORE(7);
}

/* The same tile as six passes of 4 rows x 16 columns, for 16-register ISAs (a v16 is two
 * AVX2 registers: 8 accumulators). */
INL void tile_8x48_narrow(const float *pa, const float *pb, int64_t kc, float *ct, int64_t lt, int load) {
    for (int i0 = 0; i0 < MR; i0 += 4)
        for (int j0 = 0; j0 < NR; j0 += 16) {
            float *c = ct + i0 * lt + j0;
            v16 c0 = load ? ld16(c) : (v16){0}, c1 = load ? ld16(c + lt) : (v16){0};
            v16 c2 = load ? ld16(c + 2 * lt) : (v16){0}, c3 = load ? ld16(c + 3 * lt) : (v16){0};
            const float *a = pa + i0, *b = pb + j0;
            for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
                v16 bv = ld16(b);
                float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
                c0 += splat(a0) * bv, c1 += splat(a1) * bv, c2 += splat(a2) * bv, c3 += splat(a3) * bv;
            }
            st16(c, c0), st16(c + lt, c1), st16(c + 2 * lt, c2), st16(c + 3 * lt, c3);
        }
}

/* C tile (mr x nr of it valid, row stride ldc) = (load ? C : 0) + pa . pb; partial tiles
 * go through a full one on the stack. */
INL void ukernel(int narrow, const float *pa, const float *pb, int64_t kc, float *c, int64_t ldc, int64_t mr,
                 int64_t nr, int load) {
    float tmp[MR * NR];
    int whole = mr == MR && nr == NR;
    float *ct = whole ? c : tmp;
    int64_t lt = whole ? ldc : NR;
    if (!whole && load)
        for (int64_t i = 0; i < mr; i++) memcpy(tmp + i * NR, c + i * ldc, sizeof(float) * (size_t)nr);
    if (narrow) tile_8x48_narrow(pa, pb, kc, ct, lt, load);
    else if (nr <= 16) tile_8x16(pa, pb, kc, ct, lt, load);
    else if (nr <= 32) tile_8x32(pa, pb, kc, ct, lt, load);
    else tile_8x48(pa, pb, kc, ct, lt, load);
    if (!whole)
        for (int64_t i = 0; i < mr; i++) memcpy(c + i * ldc, tmp + i * NR, sizeof(float) * (size_t)nr);
}

/* Task: one NR-column panel of C over the row tiles of one row block. With causal, tiles
 * wholly above the diagonal (every column past every row) are skipped: the caller ignores
 * them. */
INL void gemm_body(const gemm *g, int task, int thread, const int narrow) {
    int64_t panel = task % g->npanels, blk = task / g->npanels, n0 = panel * NR;
    int64_t nr = g->N - n0 < NR ? g->N - n0 : NR;
    int64_t t0 = blk * g->mb, t1 = t0 + g->mb < g->mtiles ? t0 + g->mb : g->mtiles;
    if (g->flags & TR_GEMM_CAUSAL) { /* rows < n0 see none of these columns */
        int64_t first = n0 / MR;
        t0 = t0 > first ? t0 : first;
    }
    if (t0 >= t1) return;
    int64_t kmin = g->K, kmax = 0;
    for (int64_t t = t0; t < t1; t++) {
        int64_t kb, ke;
        tile_k_range(g, t, &kb, &ke);
        if (kb >= ke && !(g->flags & TR_GEMM_ACC)) /* nothing to add: the tile is zero */
            for (int64_t m = t * MR; m < t * MR + MR && m < g->M; m++)
                memset(g->c + m * g->ldc + n0, 0, sizeof(float) * (size_t)nr);
        kmin = kb < kmin ? kb : kmin, kmax = ke > kmax ? ke : kmax;
    }
    float *bp = g->bp + (int64_t)thread * KC * NR;
    for (int64_t k0 = kmin - kmin % KC; k0 < kmax; k0 += KC) {
        int64_t kc = g->K - k0 < KC ? g->K - k0 : KC;
        pack_b(g, n0, k0, kc, bp);
        for (int64_t t = t0; t < t1; t++) {
            int64_t m0 = t * MR, mr = g->M - m0 < MR ? g->M - m0 : MR, kb, ke;
            tile_k_range(g, t, &kb, &ke);
            int64_t lo = kb > k0 ? kb : k0, hi = ke < k0 + kc ? ke : k0 + kc;
            if (lo >= hi) continue;
            const float *pa = g->ap + t * g->K * MR + lo * MR, *pb = bp + (lo - k0) * NR;
            float *c = g->c + m0 * g->ldc + n0;
            int load = lo > kb || (g->flags & TR_GEMM_ACC);
            ukernel(narrow, pa, pb, hi - lo, c, g->ldc, mr, nr, load);
        }
    }
}

/* Product i of a batch, as a product of its own. */
static inline gemm product_of(const gemm *g, int i) {
    gemm one = *g;
    one.a += i * g->a_bs, one.b += (i / g->b_div) * g->b_bs, one.c += i * g->c_bs, one.ap += i * g->ap_bs;
    return one;
}

/* The packing and product tasks, each built for AVX-512 (one register tile), AVX2+FMA and
 * the baseline (the tile in six narrower passes). */
#define ISA_TASKS(sfx, attr, narrow)                                                                           \
    attr static void pack_a_##sfx(void *vg, int t, int thread) {                                               \
        const gemm *g = vg;                                                                                    \
        gemm one = product_of(g, t / g->mtiles);                                                               \
        pack_a_body(&one, t % g->mtiles);                                                                      \
    }                                                                                                          \
    attr static void gemm_##sfx(void *vg, int task, int thread) {                                              \
        const gemm *g = vg;                                                                                    \
        int per = g->npanels * g->mblocks;                                                                     \
        gemm one = product_of(g, task / per);                                                                  \
        gemm_body(&one, task % per, thread, narrow);                                                           \
    }
ISA_TASKS(avx512, __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma"))), 0)
ISA_TASKS(avx2, __attribute__((target("avx2,fma"))), 1)
ISA_TASKS(base, , 1)

/* Rows of K packed at once: a product with a long K (the LM head's input gradient, K = the
 * vocabulary) runs as slabs of K added in turn, so the packed A that every output panel's
 * task re-reads (about 4 MiB of it) is served from cache instead of memory. A multiple of
 * KC: the sums are the same, in the same order, as one pass. */
#define SLAB_FLOATS ((int64_t)1 << 20)
static int64_t slab_k(int64_t M, int64_t K, int flags) {
    if (flags & (TR_GEMM_CAUSAL | TR_GEMM_K_LE_M | TR_GEMM_K_GE_M)) return K; /* k ranges are per row */
    int64_t rows = (M + MR - 1) / MR * MR, s = SLAB_FLOATS / rows / KC * KC;
    s = s > KC ? s : KC;
    return s < K ? s : K;
}

size_t tr_gemm_workspace_floats(int batch, int64_t M, int64_t K, int threads, int flags) {
    K = slab_k(M, K, flags);
    size_t ap_bs = ((size_t)((M + MR - 1) / MR) * MR * (size_t)K + 15) & ~(size_t)15;
    return ap_bs * (size_t)batch + (size_t)(threads > 0 ? threads : 1) * KC * NR;
}

/* The packed panels of the calling thread's products, kept between calls (a training step
 * makes thousands; fresh large blocks each time cost page faults) and grown as needed. */
static __thread float *workspace;
static __thread size_t workspace_floats;

static float *get_workspace(size_t n) {
    if (n <= workspace_floats) return workspace;
    free(workspace);
    workspace = aligned_alloc(64, sizeof(float) * ((n + 15) & ~(size_t)15));
    workspace_floats = workspace ? n : 0;
    return workspace;
}

void tr_gemm_release(void) {
    free(workspace);
    workspace = NULL, workspace_floats = 0;
}

/* Without memory for the packed panels: the same sums, plainly. */
static void gemm_plain(const gemm *g, int batch) {
    for (int i = 0; i < batch; i++) {
        gemm one = product_of(g, i);
        for (int64_t m = 0; m < one.M; m++)
            for (int64_t n = 0; n < one.N; n++) {
                float s = one.flags & TR_GEMM_ACC ? one.c[m * one.ldc + n] : 0.0f;
                for (int64_t k = 0; k < one.K; k++) s += one.a[m * one.sam + k * one.sak] * one.b[k * one.sbk + n * one.sbn];
                one.c[m * one.ldc + n] = s;
            }
    }
}

void tr_gemm_batch(threadpool *tp, int batch, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam,
                   int64_t sak, int64_t a_bs, const float *b, int64_t sbk, int64_t sbn, int64_t b_bs, int b_div,
                   float *c, int64_t ldc, int64_t c_bs, int flags) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    int64_t ks = slab_k(M, K, flags);
    for (int64_t k0 = 0; ks < K && k0 < K; k0 += ks) /* each slab a product of its own, added to C */
        tr_gemm_batch(tp, batch, M, N, K - k0 < ks ? K - k0 : ks, a + k0 * sak, sam, sak, a_bs, b + k0 * sbk, sbk, sbn,
                      b_bs, b_div, c, ldc, c_bs, k0 ? flags | TR_GEMM_ACC : flags);
    if (ks < K) return;
    int threads = tp_threads(tp);
    if (batch == 1 && N <= NR / 3 && M >= NR && K >= NR &&
        !(flags & (TR_GEMM_CAUSAL | TR_GEMM_K_LE_M | TR_GEMM_K_GE_M))) {
        /* A few columns (LoRA's rank-wide products) would fill a sixth of each register tile:
         * C^T = B^T A^T fills them, into scratch past the product's own workspace (less than
         * tr_gemm_workspace_floats(1, M, K) promises, as K >= NR), then added to C. */
        size_t ws = tr_gemm_workspace_floats(1, N, K, threads, 0);
        float *buf = get_workspace(ws + (size_t)(M * N));
        if (buf) {
            float *ct = buf + ws;
            tr_gemm_batch(tp, 1, N, M, K, b, sbn, sbk, 0, a, sak, sam, 0, 1, ct, M, 0, 0);
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++)
                    c[m * ldc + n] = (flags & TR_GEMM_ACC ? c[m * ldc + n] : 0.0f) + ct[n * M + m];
            return;
        }
    }
    gemm g = {.M = M, .N = N, .K = K, .a = a, .sam = sam, .sak = sak, .b = b, .sbk = sbk, .sbn = sbn, .c = c,
              .ldc = ldc, .flags = flags, .a_bs = a_bs, .b_bs = b_bs, .c_bs = c_bs, .b_div = b_div > 0 ? b_div : 1};
    cpu_level lv = cpu_level_active();
    g.isa = lv >= CPU_LEVEL_AVX512 ? 2 : lv >= CPU_LEVEL_AVX2 ? 1 : 0;
    g.mtiles = (int)((M + MR - 1) / MR), g.npanels = (int)((N + NR - 1) / NR);
    /* Enough tasks to keep every thread busy: whole columns of C when there are many panels
     * (each packs its B block once), else the rows split into blocks too. */
    int want = 4 * (threads > 0 ? threads : 1), have = batch * g.npanels;
    int blocks = have >= want ? 1 : (want + have - 1) / have;
    blocks = blocks < g.mtiles ? blocks : g.mtiles;
    g.mb = (g.mtiles + blocks - 1) / blocks;
    g.mblocks = (int)((g.mtiles + g.mb - 1) / g.mb);
    g.ap_bs = ((int64_t)g.mtiles * MR * K + 15) & ~(int64_t)15;
    size_t na = (size_t)g.ap_bs * (size_t)batch;
    float *buf = get_workspace(tr_gemm_workspace_floats(batch, M, K, threads, flags));
    if (!buf) return gemm_plain(&g, batch);
    g.ap = buf, g.bp = buf + na;
    /* A pool round costs tens of microseconds more than it saves on a small product, and far
     * more when other processes hold the cores (every round waits for its slowest thread):
     * products under 4M multiply-adds (LoRA's rank-wide ones) stay on the calling thread. */
    threadpool *use = (double)M * N * K * batch < 4e6 ? NULL : tp;
    tp_task_fn pack_a = g.isa == 2 ? pack_a_avx512 : g.isa == 1 ? pack_a_avx2 : pack_a_base;
    tp_task_fn product = g.isa == 2 ? gemm_avx512 : g.isa == 1 ? gemm_avx2 : gemm_base;
    tp_run(use, batch * g.mtiles, pack_a, &g);
    tp_run(use, batch * g.npanels * g.mblocks, product, &g);
}

void tr_gemm(threadpool *tp, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam, int64_t sak,
             const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc, int flags) {
    tr_gemm_batch(tp, 1, M, N, K, a, sam, sak, 0, b, sbk, sbn, 0, 1, c, ldc, 0, flags);
}
