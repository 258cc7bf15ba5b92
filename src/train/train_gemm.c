/* train_gemm.c: the float32 matrix product under every heavy op of LoRA training
 * (train_ops.h, tr_gemm): A and B packed into register-tile panels, an 8 x 48 outer-product
 * micro-kernel (AVX-512: 24 accumulators) over blocks of K, output panels handed to the
 * thread pool. Any strides on either input, so x W^T, dy W and the attention products
 * run without transposing anything first. Each output is one sum in k order (no split K),
 * whatever the threads. Must not allocate per task or read the environment itself. */
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
    int acc, mtiles, npanels, mblocks, avx512, causal;
    int64_t mb; /* row tiles per task */
} gemm;

/* Row tile t of A as [K][MR] (rows past M are zero). */
static void pack_a_task(void *vctx, int t, int thread) {
    const gemm *g = vctx;
    float *dst = g->ap + (int64_t)t * g->K * MR;
    int64_t m0 = (int64_t)t * MR, mr = g->M - m0 < MR ? g->M - m0 : MR;
    if (g->sak == 1) { /* row-major A: MR rows read side by side */
        const float *src[MR];
        for (int i = 0; i < MR; i++) src[i] = g->a + (m0 + (i < mr ? i : 0)) * g->sam;
        for (int64_t k = 0; k < g->K; k++)
            for (int i = 0; i < MR; i++) dst[k * MR + i] = i < mr ? src[i][k] : 0.0f;
        return;
    }
    for (int64_t k = 0; k < g->K; k++)
        for (int i = 0; i < MR; i++) dst[k * MR + i] = i < mr ? g->a[(m0 + i) * g->sam + k * g->sak] : 0.0f;
}

/* Columns n0 .. n0 + NR of B, rows k0 .. k0 + kc, as [kc][NR] (columns past N are zero). */
static void pack_b(const gemm *g, int64_t n0, int64_t k0, int64_t kc, float *dst) {
    int64_t nr = g->N - n0 < NR ? g->N - n0 : NR;
    if (g->sbn == 1) { /* rows of B: copies */
        for (int64_t k = 0; k < kc; k++) {
            const float *s = g->b + (k0 + k) * g->sbk + n0;
            memcpy(dst + k * NR, s, sizeof(float) * (size_t)nr);
            if (nr < NR) memset(dst + k * NR + nr, 0, sizeof(float) * (size_t)(NR - nr));
        }
        return;
    }
    for (int64_t j = 0; j < NR; j++) { /* columns of B are rows in memory (x W^T): a transpose */
        if (j >= nr) {
            for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
            continue;
        }
        const float *s = g->b + (n0 + j) * g->sbn + k0 * g->sbk;
        for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = s[k * g->sbk];
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
    else tile_8x48(pa, pb, kc, ct, lt, load);
    if (!whole)
        for (int64_t i = 0; i < mr; i++) memcpy(c + i * ldc, tmp + i * NR, sizeof(float) * (size_t)nr);
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma"))) static void ukernel_avx512(const float *pa, const float *pb, int64_t kc,
                                                              float *c, int64_t ldc, int64_t mr, int64_t nr,
                                                              int load) {
    ukernel(0, pa, pb, kc, c, ldc, mr, nr, load);
}
__attribute__((target("avx2,fma"))) static void ukernel_avx2(const float *pa, const float *pb, int64_t kc, float *c,
                                                            int64_t ldc, int64_t mr, int64_t nr, int load) {
    ukernel(1, pa, pb, kc, c, ldc, mr, nr, load);
}
static void ukernel_base(const float *pa, const float *pb, int64_t kc, float *c, int64_t ldc, int64_t mr, int64_t nr,
                         int load) {
    ukernel(1, pa, pb, kc, c, ldc, mr, nr, load);
}

/* Task: one NR-column panel of C over the row tiles of one row block. With causal, tiles
 * wholly above the diagonal (every column past every row) are skipped: the caller ignores
 * them. */
static void gemm_task(void *vctx, int task, int thread) {
    const gemm *g = vctx;
    int64_t panel = task % g->npanels, blk = task / g->npanels, n0 = panel * NR;
    int64_t nr = g->N - n0 < NR ? g->N - n0 : NR;
    int64_t t0 = blk * g->mb, t1 = t0 + g->mb < g->mtiles ? t0 + g->mb : g->mtiles;
    if (g->causal) { /* rows < n0 see none of these columns */
        int64_t first = n0 / MR;
        t0 = t0 > first ? t0 : first;
    }
    if (t0 >= t1) return;
    float *bp = g->bp + (int64_t)thread * KC * NR;
    for (int64_t k0 = 0; k0 < g->K; k0 += KC) {
        int64_t kc = g->K - k0 < KC ? g->K - k0 : KC;
        pack_b(g, n0, k0, kc, bp);
        for (int64_t t = t0; t < t1; t++) {
            int64_t m0 = t * MR, mr = g->M - m0 < MR ? g->M - m0 : MR;
            const float *pa = g->ap + t * g->K * MR + k0 * MR;
            float *c = g->c + m0 * g->ldc + n0;
            int load = k0 > 0 || g->acc;
            if (g->avx512 == 2) ukernel_avx512(pa, bp, kc, c, g->ldc, mr, nr, load);
            else if (g->avx512 == 1) ukernel_avx2(pa, bp, kc, c, g->ldc, mr, nr, load);
            else ukernel_base(pa, bp, kc, c, g->ldc, mr, nr, load);
        }
    }
}

/* Without memory for the packed panels: the same sums, plainly. */
static void gemm_plain(const gemm *g) {
    for (int64_t m = 0; m < g->M; m++)
        for (int64_t n = 0; n < g->N; n++) {
            float s = g->acc ? g->c[m * g->ldc + n] : 0.0f;
            for (int64_t k = 0; k < g->K; k++) s += g->a[m * g->sam + k * g->sak] * g->b[k * g->sbk + n * g->sbn];
            g->c[m * g->ldc + n] = s;
        }
}

void tr_gemm(threadpool *tp, int64_t M, int64_t N, int64_t K, const float *a, int64_t sam, int64_t sak,
             const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc, int flags) {
    if (M <= 0 || N <= 0) return;
    int threads = tp_threads(tp);
    gemm g = {.M = M, .N = N, .K = K, .a = a, .sam = sam, .sak = sak, .b = b, .sbk = sbk, .sbn = sbn, .c = c,
              .ldc = ldc, .acc = !!(flags & TR_GEMM_ACC), .causal = !!(flags & TR_GEMM_CAUSAL)};
    cpu_level lv = cpu_level_active();
    g.avx512 = lv >= CPU_LEVEL_AVX512 ? 2 : lv >= CPU_LEVEL_AVX2 ? 1 : 0;
    g.mtiles = (int)((M + MR - 1) / MR), g.npanels = (int)((N + NR - 1) / NR);
    /* Enough tasks to keep every thread busy: whole columns of C when there are many panels
     * (each packs its B block once), else the rows split into blocks too. */
    int want = 4 * (threads > 0 ? threads : 1), blocks = g.npanels >= want ? 1 : (want + g.npanels - 1) / g.npanels;
    blocks = blocks < g.mtiles ? blocks : g.mtiles;
    g.mb = (g.mtiles + blocks - 1) / blocks;
    g.mblocks = (int)((g.mtiles + g.mb - 1) / g.mb);
    size_t na = ((size_t)g.mtiles * MR * (size_t)K + 15) & ~(size_t)15, nb = (size_t)(threads > 0 ? threads : 1) * KC * NR;
    float *buf = aligned_alloc(64, sizeof(float) * (na + nb));
    if (!buf) return gemm_plain(&g);
    g.ap = buf, g.bp = buf + na;
    threadpool *use = M * N * K < 65536 ? NULL : tp; /* a pool round costs more than a small product */
    tp_run(use, g.mtiles, pack_a_task, &g);
    tp_run(use, g.npanels * g.mblocks, gemm_task, &g);
    free(buf);
}
