/* test_cuda_prefill.c: the tensor-core prefill attention (cuda_attn_prefill.cu) against a
 * CPU double-precision softmax attention over the same paged pool, on random inputs:
 * odd chunk lengths, head_dim 16/32/64/128/256/512, GQA groups 1/4/8, sliding windows starting
 * mid-block, chunks after earlier context, shuffled block tables with an unmapped block.
 * Outputs are NaN-poisoned first. Without a GPU it says loudly that nothing ran. */
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
    printf("test_cuda_prefill: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "kv/kv_cache.h"
#include "cuda_test_util.h"

#define LAYERS 2
#define LAYER 1 /* the layer under test: offsets must include the layer stride */
#define SLOT 1  /* the sequence under test: offsets must include the slot's table row */

typedef struct pf_case {
    int T, D, G, HK, window, p0, hole; /* hole: block 0 of the slot is unmapped (-1) */
} pf_case;

static int n_checked;

/* CPU oracle: ops_attention's contract (keys [max(0, pos - window + 1), pos] of the slot
 * whose blocks are mapped, scores scaled, max-subtracted softmax) in double. */
static void reference(const pf_case *c, const float *pk, const float *pv, const int32_t *table, int n_blocks,
                      const float *q, const int32_t *pos, float scale, double *out) {
    int H = c->G * c->HK, D = c->D;
    double *s = malloc(sizeof(double) * (size_t)(c->p0 + c->T));
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < H; h++) {
            int kvh = h / c->G, pe = pos[t], ps = c->window > 0 && pe - c->window + 1 > 0 ? pe - c->window + 1 : 0;
            const float *qr = q + ((size_t)t * H + h) * D;
            double mx = -INFINITY, sum = 0.0;
            for (int p = ps; p <= pe; p++) {
                int b = table[p / KV_BLOCK_SIZE];
                s[p] = -INFINITY;
                if (b < 0 || b >= n_blocks) continue;
                const float *kr =
                    pk + ((((size_t)LAYER * n_blocks + b) * c->HK + kvh) * KV_BLOCK_SIZE + p % KV_BLOCK_SIZE) * D;
                double dot = 0.0;
                for (int i = 0; i < D; i++) dot += (double)qr[i] * kr[i];
                s[p] = dot * scale;
                if (s[p] > mx) mx = s[p];
            }
            double *o = out + ((size_t)t * H + h) * D;
            for (int i = 0; i < D; i++) o[i] = 0.0;
            for (int p = ps; p <= pe; p++) {
                if (s[p] == -INFINITY) continue;
                double w = exp(s[p] - mx);
                sum += w;
                const float *vr =
                    pv + ((((size_t)LAYER * n_blocks + table[p / KV_BLOCK_SIZE]) * c->HK + kvh) * KV_BLOCK_SIZE +
                          p % KV_BLOCK_SIZE) *
                             D;
                for (int i = 0; i < D; i++) o[i] += w * vr[i];
            }
            for (int i = 0; i < D; i++) o[i] = sum > 0.0 ? o[i] / sum : 0.0;
        }
    free(s);
}

static void check_case(const pf_case *c, int via_dispatch) {
    int H = c->G * c->HK, D = c->D, T = c->T, len = c->p0 + T;
    int nbs = (len + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE, n_blocks = 2 * nbs + 3;
    /* tables: slot SLOT gets a shuffled set of the blocks, slot 0 the rest (never read) */
    int32_t *perm = malloc(sizeof(int32_t) * n_blocks), *tables = malloc(sizeof(int32_t) * 2 * nbs);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (int i = 0; i < 2 * nbs; i++) tables[i] = perm[i];
    if (c->hole) tables[SLOT * nbs] = -1;
    size_t pool = (size_t)LAYERS * n_blocks * c->HK * KV_BLOCK_SIZE * D;
    float *pk = malloc(pool * sizeof(float)), *pv = malloc(pool * sizeof(float));
    for (size_t i = 0; i < pool; i++) pk[i] = rndf(), pv[i] = rndf();
    size_t nq = (size_t)T * H * D;
    float *q = malloc(nq * sizeof(float)), *got = malloc(nq * sizeof(float)), *poison = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) q[i] = 2.5f * rndf(), poison[i] = NAN; /* peaky enough to move the max */
    int32_t *pos = malloc(sizeof(int32_t) * T), *slot = malloc(sizeof(int32_t) * T);
    for (int t = 0; t < T; t++) pos[t] = c->p0 + t, slot[t] = SLOT;
    float scale = 1.0f / sqrtf((float)D);

    cuda_kv kv = {.n_layers = LAYERS,
                  .n_kv_heads = c->HK,
                  .head_dim = D,
                  .n_blocks = n_blocks,
                  .max_slots = 2,
                  .max_blocks_per_slot = nbs};
    kv.k = dev_upload(pk, pool * sizeof(float));
    kv.v = dev_upload(pv, pool * sizeof(float));
    kv.tables = dev_upload(tables, sizeof(int32_t) * 2 * nbs);
    float *dq = dev_upload(q, nq * sizeof(float)), *dout = dev_upload(poison, nq * sizeof(float));
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * T), *dslot = dev_upload(slot, sizeof(int32_t) * T);
    cuda_attention_args a = {.kv = &kv,
                             .layer = LAYER,
                             .q = dq,
                             .out = dout,
                             .T = T,
                             .n_heads = H,
                             .n_kv_heads = c->HK,
                             .head_dim = D,
                             .pos = dpos,
                             .slot = dslot,
                             .window = c->window,
                             .scale = scale,
                             .single_slot = 1,
                             .stage_bytes = cuda_attention_stage_bytes(nbs, c->HK, D)};
    a.stage = dev_upload(NULL, a.stage_bytes);
    hearth_error e = {0};
    hearth_status s = via_dispatch ? cuda_attention(&a, &e) : cuda_attention_prefill_tc(&a, &e);
    if (s == HEARTH_OK) s = cuda_sync(&e);
    if (s) fail_msg("attention_prefill_tc T=%d D=%d G=%d: %s", T, D, c->G, e.message);
    assert_int_equal(cuda_download(got, dout, nq * sizeof(float), &e), HEARTH_OK);

    /* the oracle sees the kernel's bf16 operands (q, k, v rounded), computed in double */
    float *qb = malloc(nq * sizeof(float)), *pkb = malloc(pool * sizeof(float)), *pvb = malloc(pool * sizeof(float));
    double vmax = 0.0; /* the largest value row norm in the pool */
    for (size_t i = 0; i < nq; i++) qb[i] = bf16_round(q[i]);
    for (size_t i = 0; i < pool; i++) pkb[i] = bf16_round(pk[i]), pvb[i] = bf16_round(pv[i]);
    for (size_t r = 0; r < pool / (size_t)D; r++) {
        double n2 = 0.0;
        for (int i = 0; i < D; i++) n2 += (double)pvb[r * D + i] * pvb[r * D + i];
        if (sqrt(n2) > vmax) vmax = sqrt(n2);
    }
    double *ref = malloc(nq * sizeof(double));
    reference(c, pkb, pvb, tables + SLOT * nbs, n_blocks, qb, pos, scale, ref);
    /* Tolerance, per (token, head) row. The oracle already uses the bf16 q, k, v, so what is
     * left is the kernel's rounding of the softmax weights p to bf16 before P.V (relative
     * 2^-9 each; the output moves by at most 2^-9 of the largest value row, |v|max, and
     * the f32 normaliser sums the unrounded p) and f32 accumulation (~1e-6). Bound:
     * 2e-3 of the row's norm plus 1.1 * 2^-9 |v|max (the worst case of the p rounding,
     * 10% over). A wrong key, mask or block moves rows by O(|v|/keys) or more. */
    const double tol = 2e-3, tol_abs = 1.1 * vmax / 512.0;
    double worst = 0.0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *g = got + ((size_t)t * H + h) * D;
            const double *r = ref + ((size_t)t * H + h) * D;
            double en = 0.0, rn = 0.0;
            for (int i = 0; i < D; i++) {
                if (!isfinite(g[i]))
                    fail_msg("T=%d D=%d G=%d HK=%d window=%d p0=%d hole=%d: out[t=%d h=%d i=%d] = %g (unwritten "
                             "or non-finite), reference %.6g",
                             T, D, c->G, c->HK, c->window, c->p0, c->hole, t, h, i, g[i], r[i]);
                en += (g[i] - r[i]) * (g[i] - r[i]);
                rn += r[i] * r[i];
            }
            double rel = sqrt(en) / (sqrt(rn) + 1e-30);
            if (rel > worst) worst = rel;
            if (sqrt(en) > tol * sqrt(rn) + tol_abs)
                fail_msg("T=%d D=%d G=%d HK=%d window=%d p0=%d hole=%d: row t=%d h=%d: |out-ref| = %.3g, "
                         "|ref| = %.3g (rel %.3g > %.1g + %.3g abs); out[0] %.6g ref[0] %.6g",
                         T, D, c->G, c->HK, c->window, c->p0, c->hole, t, h, sqrt(en), sqrt(rn), rel, tol, tol_abs, g[0], r[0]);
        }
    if (T == 333 && c->window == 0 && c->p0 > 0)
        printf("  T=%d D=%d G=%d HK=%d p0=%d hole=%d: worst row rel err %.2e\n", T, D, c->G, c->HK, c->p0, c->hole,
               worst);
    n_checked++;
    cuda_free(kv.k);
    cuda_free(kv.v);
    cuda_free(kv.tables);
    cuda_free(dq);
    cuda_free(dout);
    cuda_free(dpos);
    cuda_free(dslot);
    cuda_free(a.stage);
    free(ref), free(qb), free(pkb), free(pvb), free(perm), free(tables), free(pk), free(pv), free(q), free(got), free(poison), free(pos), free(slot);
}

static void test_prefill_attention(void **state) {
    (void)state;
    static const int Ts[] = {9, 17, 64, 100, 333}, Ds[] = {16, 32, 64, 128, 256, 512}, Gs[] = {1, 4, 8};
    static const int windows[] = {0, 37, 5}, p0s[] = {0, 23};
    for (size_t ti = 0; ti < 5; ti++)
        for (size_t di = 0; di < 6; di++)
            for (size_t gi = 0; gi < 3; gi++)
                for (size_t wi = 0; wi < 3; wi++)
                    for (size_t pi = 0; pi < 2; pi++) {
                        if (windows[wi] == 5 && Ts[ti] != 100) continue; /* a window shorter than a block */
                        pf_case c = {.T = Ts[ti],
                                     .D = Ds[di],
                                     .G = Gs[gi],
                                     .HK = Gs[gi] == 8 ? 1 : 2,
                                     .window = windows[wi],
                                     .p0 = p0s[pi]};
                        c.hole = c.p0 >= KV_BLOCK_SIZE && c.window == 0; /* block 0 unmapped: its keys skipped */
                        check_case(&c, 0);
                    }
    /* odd group sizes (tile rows not a multiple of G) and the dispatch in cuda_attention */
    pf_case odd = {.T = 77, .D = 128, .G = 3, .HK = 2, .window = 0, .p0 = 40};
    check_case(&odd, 0);
    pf_case disp = {.T = 65, .D = 128, .G = 4, .HK = 2, .window = 0, .p0 = 7};
    check_case(&disp, 1);
    pf_case wide = {.T = 129, .D = 512, .G = 4, .HK = 2, .window = 0, .p0 = 40}; /* Gemma 4's full layers */
    check_case(&wide, 1);
    printf("test_cuda_prefill: %d cases checked\n", n_checked);
}

static void test_fits(void **state) {
    (void)state;
    cuda_kv kv = {.head_dim = 80};
    cuda_attention_args a = {.kv = &kv, .T = 64, .n_heads = 8, .n_kv_heads = 2, .head_dim = 80, .single_slot = 1};
    assert_false(cuda_attention_prefill_tc_fits(&a)); /* head_dim 80: the f32 kernel keeps it */
    a.head_dim = 128;
    a.single_slot = 0;
    assert_false(cuda_attention_prefill_tc_fits(&a)); /* ragged batches: the f32 kernels */
}

int main(void) {
    int n = cuda_device_count();
    if (n == 0) {
        printf("test_cuda_prefill: skipped: no CUDA device. The tensor-core prefill attention tests did NOT "
               "run and do not count as passed.\n");
        return 0;
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda_prefill: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x2545f4914f6cdd1dull;
    printf("test_cuda_prefill: device 0: %s (sm_%d%d); seed %llx\n", info.name, info.cc_major, info.cc_minor,
           (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fits), cmocka_unit_test(test_prefill_attention)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
