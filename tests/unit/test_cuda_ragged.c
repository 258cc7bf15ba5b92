/* test_cuda_ragged.c: cuda_attention's split of a ragged step (host_slot given, single_slot
 * 0: decode rows of 40 sequences around a 37-token prefill chunk of another, plus a short
 * 3-token run) into prefill-kernel runs and decode-kernel stretches, against a CPU double
 * softmax attention over the same paged pool. Outputs are NaN-poisoned first. Without a
 * GPU it says loudly that nothing ran. */
/* cmocka.h needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_ragged: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_plan.h"
#include "kv/kv_cache.h"
#include "cuda_test_util.h"

#define LAYERS 2
#define LAYER 1
#define NS 41 /* slots 0..39 decode, slot 40 the prefill chunk */
#define PF_SLOT 40
#define PF_T 37

typedef struct pool {
    int D, HK, n_blocks, mbps;
    const float *k, *v;
    const int32_t *tables; /* [NS][mbps] */
} pool;

/* CPU oracle (ops_attention's contract) in double for token t of query q. */
static void reference(const pool *P, int H, int window, float scale, const float *q, int pos, int slot, double *out) {
    int G = H / P->HK, D = P->D;
    int ps = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    double *s = malloc(sizeof(double) * (size_t)(pos + 1));
    const int32_t *table = P->tables + (size_t)slot * P->mbps;
    for (int h = 0; h < H; h++) {
        int kvh = h / G;
        const float *qr = q + (size_t)h * D;
        double mx = -INFINITY, sum = 0.0;
        for (int p = ps; p <= pos; p++) {
            int b = table[p / KV_BLOCK_SIZE];
            const float *kr =
                P->k + ((((size_t)LAYER * P->n_blocks + b) * P->HK + kvh) * KV_BLOCK_SIZE + p % KV_BLOCK_SIZE) * D;
            double dot = 0.0;
            for (int i = 0; i < D; i++) dot += (double)qr[i] * kr[i];
            s[p] = dot * scale;
            if (s[p] > mx) mx = s[p];
        }
        double *o = out + (size_t)h * D;
        for (int i = 0; i < D; i++) o[i] = 0.0;
        for (int p = ps; p <= pos; p++) {
            double w = exp(s[p] - mx);
            sum += w;
            int b = table[p / KV_BLOCK_SIZE];
            const float *vr =
                P->v + ((((size_t)LAYER * P->n_blocks + b) * P->HK + kvh) * KV_BLOCK_SIZE + p % KV_BLOCK_SIZE) * D;
            for (int i = 0; i < D; i++) o[i] += w * vr[i];
        }
        for (int i = 0; i < D; i++) o[i] /= sum;
    }
    free(s);
}

static int n_checked;

static void check_ragged(int D, int G, int HK, int window) {
    int H = G * HK, len[NS], nb[NS], mbps = 0, total = 0;
    for (int s = 0; s < NS; s++) {
        len[s] = s == PF_SLOT ? (int)(rnd() % 60) + PF_T : 1 + (int)(rnd() % 200);
        if (s == 39 && len[s] < 3) len[s] = 3; /* slot 39 sends a 3-token run */
        nb[s] = (len[s] + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
        if (nb[s] > mbps) mbps = nb[s];
        total += nb[s];
    }
    int n_blocks = total + 2;
    int32_t *perm = malloc(sizeof(int32_t) * n_blocks), *tables = malloc(sizeof(int32_t) * NS * mbps);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int s = 0, used = 0; s < NS; s++)
        for (int b = 0; b < mbps; b++) tables[s * mbps + b] = b < nb[s] ? perm[used++] : -1;
    size_t pool_n = (size_t)LAYERS * n_blocks * HK * KV_BLOCK_SIZE * D;
    float *pk = malloc(pool_n * sizeof(float)), *pv = malloc(pool_n * sizeof(float));
    for (size_t i = 0; i < pool_n; i++) pk[i] = rndf(), pv[i] = rndf();

    /* the batch: decode rows of slots 0..19, the prefill chunk, slots 20..38, a 3-token run of 39 */
    enum { TMAX = 20 + PF_T + 19 + 3 };
    int32_t pos[TMAX], slot[TMAX], is_pf[TMAX];
    int T = 0;
    for (int s = 0; s < 20; s++) slot[T] = s, pos[T] = len[s] - 1, is_pf[T++] = 0;
    for (int t = 0; t < PF_T; t++) slot[T] = PF_SLOT, pos[T] = len[PF_SLOT] - PF_T + t, is_pf[T++] = 1;
    for (int s = 20; s < 39; s++) slot[T] = s, pos[T] = len[s] - 1, is_pf[T++] = 0;
    for (int t = 0; t < 3; t++) slot[T] = 39, pos[T] = len[39] - 3 + t, is_pf[T++] = 0;
    assert_int_equal(T, TMAX);

    size_t nq = (size_t)T * H * D;
    float *q = malloc(nq * sizeof(float)), *got = malloc(nq * sizeof(float)), *poison = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) q[i] = rndf(), poison[i] = NAN;
    float scale = 1.0f / sqrtf((float)D);
    cuda_kv kv = {.n_layers = LAYERS,
                  .n_kv_heads = HK,
                  .head_dim = D,
                  .n_blocks = n_blocks,
                  .max_slots = NS,
                  .max_blocks_per_slot = mbps};
    kv.k = dev_upload(pk, pool_n * sizeof(float));
    kv.v = dev_upload(pv, pool_n * sizeof(float));
    kv.tables = dev_upload(tables, sizeof(int32_t) * NS * mbps);
    float *dq = dev_upload(q, nq * sizeof(float)), *dout = dev_upload(poison, nq * sizeof(float));
    int32_t *dpos = dev_upload(pos, sizeof pos), *dslot = dev_upload(slot, sizeof slot);
    size_t split_floats = cuda_attention_split_floats(CUDA_GRAPH_MAX_T, H, D); /* as cuda_plan.c sizes it */
    float *dsplit = dev_upload(NULL, split_floats * sizeof(float));
    cuda_attention_args a = {.kv = &kv,
                             .layer = LAYER,
                             .q = dq,
                             .out = dout,
                             .T = T,
                             .n_heads = H,
                             .n_kv_heads = HK,
                             .head_dim = D,
                             .pos = dpos,
                             .slot = dslot,
                             .window = window,
                             .scale = scale,
                             .single_slot = 0,
                             .split_scratch = dsplit,
                             .split_scratch_floats = split_floats,
                             .host_slot = slot,
                             .stage_bytes = cuda_attention_stage_bytes(mbps, HK, D)};
    a.stage = a.stage_bytes ? dev_upload(NULL, a.stage_bytes) : NULL; /* the tensor-core prefill runs */
    hearth_error e = {0};
    hearth_status st = cuda_attention(&a, &e);
    if (!st) st = cuda_sync(&e);
    if (st) fail_msg("ragged attention D=%d G=%d HK=%d window=%d: %s", D, G, HK, window, e.message);
    assert_int_equal(cuda_download(got, dout, nq * sizeof(float), &e), HEARTH_OK);

    /* the tensor-core prefill (D 16/32/64/128/256) sees bf16 q, k, v: its oracle too */
    cuda_attention_args pa = a;
    pa.single_slot = 1;
    int tc = cuda_attention_prefill_tc_fits(&pa);
    float *qb = malloc(nq * sizeof(float)), *pkb = malloc(pool_n * sizeof(float)),
          *pvb = malloc(pool_n * sizeof(float));
    for (size_t i = 0; i < nq; i++) qb[i] = bf16_round(q[i]);
    for (size_t i = 0; i < pool_n; i++) pkb[i] = bf16_round(pk[i]), pvb[i] = bf16_round(pv[i]);
    double vmax = 0.0;
    for (size_t r = 0; r < pool_n / (size_t)D; r++) {
        double n2 = 0.0;
        for (int i = 0; i < D; i++) n2 += (double)pvb[r * D + i] * pvb[r * D + i];
        if (sqrt(n2) > vmax) vmax = sqrt(n2);
    }
    pool P = {.D = D, .HK = HK, .n_blocks = n_blocks, .mbps = mbps, .k = pk, .v = pv, .tables = tables};
    pool Pb = P;
    Pb.k = pkb, Pb.v = pvb;
    double *ref = malloc(sizeof(double) * (size_t)H * D);
    for (int t = 0; t < T; t++) {
        int bf = is_pf[t] && tc;
        size_t off = (size_t)t * H * D;
        reference(bf ? &Pb : &P, H, window, scale, (bf ? qb : q) + off, pos[t], slot[t], ref);
        for (int h = 0; h < H; h++) {
            const float *g = got + off + (size_t)h * D;
            const double *r = ref + (size_t)h * D;
            double en = 0.0, rn = 0.0;
            for (int i = 0; i < D; i++) {
                if (!isfinite(g[i]))
                    fail_msg("D=%d G=%d HK=%d window=%d: token %d (slot %d pos %d %s) head %d dim %d = %g "
                             "(unwritten or non-finite)",
                             D, G, HK, window, t, slot[t], pos[t], is_pf[t] ? "prefill" : "decode", h, i, g[i]);
                /* f32 rows: as test_cuda.c's attention test (values a convex combination of
                 * [-1, 1], summation-order error ~d eps relative): 2e-5 absolute */
                if (!bf && !(fabs(g[i] - r[i]) <= 2e-5))
                    fail_msg("D=%d G=%d HK=%d window=%d: token %d (slot %d pos %d %s) head %d dim %d = %.9g, "
                             "reference %.9g",
                             D, G, HK, window, t, slot[t], pos[t], is_pf[t] ? "prefill" : "decode", h, i, g[i], r[i]);
                en += (g[i] - r[i]) * (g[i] - r[i]);
                rn += r[i] * r[i];
            }
            /* tensor-core rows: test_cuda_prefill.c's bound (2e-3 of the row norm plus
             * 1.1 * 2^-9 |v|max, from the bf16 rounding of the softmax weights) */
            if (bf && sqrt(en) > 2e-3 * sqrt(rn) + 1.1 * vmax / 512.0)
                fail_msg("D=%d G=%d HK=%d window=%d: prefill token %d (pos %d) head %d: |out-ref| = %.3g, |ref| = %.3g",
                         D, G, HK, window, t, pos[t], h, sqrt(en), sqrt(rn));
        }
    }
    n_checked++;
    cuda_free(kv.k), cuda_free(kv.v), cuda_free(kv.tables), cuda_free(dq), cuda_free(dout), cuda_free(dpos);
    cuda_free(dslot), cuda_free(dsplit), cuda_free(a.stage);
    free(ref), free(qb), free(pkb), free(pvb), free(perm), free(tables), free(pk), free(pv), free(q), free(got);
    free(poison);
}

static void test_ragged(void **state) {
    (void)state;
    static const struct { int D, G, HK; } cfg[] = {{128, 4, 2}, {64, 8, 1}, {256, 2, 2}, {40, 4, 2}, {128, 3, 2}};
    static const int windows[] = {0, 37};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int w = 0; w < 2; w++) check_ragged(cfg[c].D, cfg[c].G, cfg[c].HK, windows[w]);
    printf("test_cuda_ragged: %d ragged batches checked (decode rows of 40 sequences + a %d-token chunk)\n", n_checked,
           PF_T);
}

int main(void) {
    int n = cuda_device_count();
    if (n == 0) {
        printf("test_cuda_ragged: skipped: no CUDA device. The ragged-batch attention tests did NOT run and "
               "do not count as passed.\n");
        return 0;
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda_ragged: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x2545f4914f6cdd1dull;
    printf("test_cuda_ragged: device 0: %s (sm_%d%d); seed %llx\n", info.name, info.cc_major, info.cc_minor,
           (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ragged)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
