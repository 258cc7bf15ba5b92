/* test_cuda_gemma4.c: the CUDA pieces of models whose layers differ in shape (Gemma 4:
 * op_dims.varied_layers) against the CPU backend's ops (backend/cpu/cpu_ops.c, the oracle the
 * parity tests hold to mlx-lm) on fresh random inputs: a KV pool whose layers have their own
 * KV heads and head_dim (cuda_kv_layer_view), the RoPE + KV write and attention per layer at
 * head_dim 32, 64 and 512 (the wide kernel), values equal to the keys (attention_k_eq_v) and
 * RMS-normed without a scale (v_norm), proportional partial RoPE (zero inverse frequencies),
 * a shared-KV layer reading another layer's keys and values, a ragged prefill step of three
 * sequences then a decode step; and the per-layer input combine and gate, and the logit
 * softcap. Outputs are poisoned with NaN first so an unwritten element fails. Where no GPU
 * exists it says loudly that the device tests did NOT run (exit 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef HEARTH_HAVE_CUDA
int main(void) {
    printf("test_cuda_gemma4: skipped: CUDA backend not compiled in (no nvcc at build time); "
           "NO CUDA test ran and none counts as passed\n");
    return 0;
}
#else
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "kv/kv_cache.h"

/* Device buffer of n floats from host (NaN-poisoned when host is NULL). */
static float *dev_floats(const float *host, size_t n) {
    float *d = dev_upload(NULL, n * sizeof(float) + 4);
    float *src = (float *)host, *nan = NULL;
    if (!src) {
        nan = malloc(n * sizeof(float) + 4);
        for (size_t i = 0; i < n; i++) nan[i] = NAN;
        src = nan;
    }
    assert_int_equal(cuda_upload(d, src, n * sizeof(float), NULL), HEARTH_OK);
    free(nan);
    return d;
}

static float *download(const void *d, size_t n) {
    float *h = malloc(n * sizeof *h + 4);
    hearth_error e = {0};
    assert_int_equal(cuda_sync(&e), HEARTH_OK);
    assert_int_equal(cuda_download(h, d, n * sizeof *h, &e), HEARTH_OK);
    return h;
}

static float *rand_floats(size_t n) {
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) x[i] = rndf();
    return x;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n, float tol) {
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i]))))
            fail_msg("%s: [%zu] = %.9g, CPU reference %.9g", what, i, got[i], want[i]);
}

/* ---- per-layer inputs, gate, softcap, plain norm ---- */

static void test_elementwise(void **state) {
    (void)state;
    hearth_error e = {0};
    /* the per-layer inputs' sum: in = (proj + in) * s, the CPU's loop exactly */
    size_t n = 3 * 5 * 48 + 7;
    float *in = rand_floats(n), *proj = rand_floats(n), *ref = malloc(n * sizeof *ref);
    float s = (float)(1.0 / sqrt(2.0));
    for (size_t i = 0; i < n; i++) ref[i] = (proj[i] + in[i]) * s;
    float *din = dev_floats(in, n), *dproj = dev_floats(proj, n);
    assert_int_equal(cuda_per_layer_combine(din, dproj, s, n, &e), HEARTH_OK);
    float *got = download(din, n);
    expect_close("per_layer_combine", got, ref, n, 0.0f);
    free(got);

    /* a layer's slice of the per-layer inputs: gate[t] = gelu_tanh(gate[t]) * in[t][layer] */
    int T = 5, L = 3, D = 48, layer = 2;
    float *gate = rand_floats((size_t)T * D), *gref = malloc((size_t)T * D * sizeof *gref);
    memcpy(gref, gate, (size_t)T * D * sizeof *gref);
    for (int t = 0; t < T; t++) /* ops_gelu_tanh_mul's scalar formula (its AVX2 form rounds otherwise) */
        for (int i = 0; i < D; i++) {
            float g = gref[(size_t)t * D + i], u = in[((size_t)t * L + layer) * D + i];
            gref[(size_t)t * D + i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
        }
    float *dgate = dev_floats(gate, (size_t)T * D);
    assert_int_equal(cuda_upload(din, in, n * sizeof(float), &e), HEARTH_OK); /* din held the sum: the inputs again */
    assert_int_equal(cuda_gelu_tanh_mul_rows(dgate, din + (size_t)layer * D, T, D, (size_t)L * D, &e), HEARTH_OK);
    got = download(dgate, (size_t)T * D);
    expect_close("gelu_tanh_mul_rows", got, gref, (size_t)T * D, 2e-6f); /* tanhf: device vs libm, ~1 ulp */
    free(got);

    /* logit softcap: tanh(x / cap) * cap, logits of either sign and up to several caps */
    size_t nl = 2 * 1003;
    float *lg = malloc(nl * sizeof *lg), *lref = malloc(nl * sizeof *lref), cap = 30.0f;
    for (size_t i = 0; i < nl; i++) lg[i] = rndf() * 120.0f, lref[i] = tanhf(lg[i] / cap) * cap;
    float *dl = dev_floats(lg, nl);
    assert_int_equal(cuda_softcap(dl, cap, nl, &e), HEARTH_OK);
    got = download(dl, nl);
    expect_close("softcap", got, lref, nl, 2e-6f);
    free(got);

    /* values normed without a scale (v_norm), rows of 64 and of 512 */
    for (int dim = 64; dim <= 512; dim *= 8) {
        int rows = 7;
        float *x = rand_floats((size_t)rows * dim), *xr = malloc((size_t)rows * dim * sizeof *xr);
        ops_rmsnorm(xr, x, NULL, 0.0f, rows, dim, 1e-6f);
        float *dx = dev_floats(x, (size_t)rows * dim);
        assert_int_equal(cuda_rmsnorm_plain(dx, rows, dim, 1e-6f, &e), HEARTH_OK);
        got = download(dx, (size_t)rows * dim);
        expect_close("rmsnorm_plain", got, xr, (size_t)rows * dim, 1e-5f); /* sums in another order */
        free(got);
        free(x);
        free(xr);
        cuda_free(dx);
    }
    /* a device copy (the values of attention_k_eq_v) */
    float *dc = dev_floats(NULL, n);
    assert_int_equal(cuda_copy_f32(dc, dproj, n, &e), HEARTH_OK);
    got = download(dc, n);
    expect_close("copy_f32", got, proj, n, 0.0f);
    free(got);
    cuda_free(dc);
    cuda_free(din);
    cuda_free(dproj);
    cuda_free(dgate);
    cuda_free(dl);
    free(in);
    free(proj);
    free(ref);
    free(gate);
    free(gref);
    free(lg);
    free(lref);
}

/* ---- a pool of varied layers: store and attend, layer by layer ---- */

#define HEADS 4
#define NL 3 /* KV layers */
#define SEQS 3
static const int layer_heads[NL] = {2, 1, 2}, layer_dims[NL] = {32, 512, 64};
static const int layer_window[NL] = {8, 0, 0}; /* layer 0 sliding */

/* RoPE frequencies of a layer: proportional partial (layer 1: the first quarter of the
 * pairs rotate, the rest have inverse frequency 0) or default. */
static float *inv_freq_for(int l) {
    int d = layer_dims[l], half = d / 2, rotated = l == 1 ? half / 4 : half;
    float *f = malloc((size_t)half * sizeof *f);
    for (int i = 0; i < half; i++) f[i] = i < rotated ? (float)(1.0 / pow(10000.0, 2.0 * i / d)) : 0.0f;
    return f;
}

typedef struct layer_case {
    int l;      /* KV layer */
    int k_eq_v; /* values = the keys before their norm and RoPE, then RMS-normed without scale */
    int shared; /* queries only; attend over KV layer l as stored */
} layer_case;

/* One step of T tokens (pos/slot) through one layer: host (kv_layer_view, ops_*) and device
 * (cuda_kv_layer_view, the same entry points cuda_model.c calls) side by side. */
static void run_layer(kv_cache *kv, cuda_kv *dkv, const layer_case *lc, int T, const int32_t *pos, const int32_t *slot,
                      const int32_t *dpos, const int32_t *dslot, const char *step) {
    hearth_error e = {0};
    kv_cache hv;
    cuda_kv dv;
    int hl = kv_layer_view(kv, lc->l, &hv), dl = cuda_kv_layer_view(dkv, lc->l, &dv);
    assert_int_equal(hl, 0);
    assert_int_equal(dl, 0);
    int d = layer_dims[lc->l], nkv = layer_heads[lc->l];
    assert_int_equal(dv.head_dim, d);
    assert_int_equal(dv.n_kv_heads, nkv);
    size_t nq = (size_t)T * HEADS * d, nk = (size_t)T * nkv * d;
    float *q = rand_floats(nq), *k = rand_floats(nk), *v = rand_floats(nk), *freq = inv_freq_for(lc->l);
    float *dq = dev_floats(q, nq), *dk = dev_floats(k, nk), *dvv = dev_floats(v, nk), *dfreq = dev_floats(freq, d / 2);
    float scale = 1.0f / sqrtf((float)d); /* scores of O(1): the summation orders' difference stays ~1e-6 */
    /* host: cpu_qkv_rope_store's order */
    ops_rope_part(q, T, HEADS, d, d, pos, freq, 0);
    if (!lc->shared) {
        if (lc->k_eq_v) {
            memcpy(v, k, nk * sizeof *v);
            ops_rmsnorm(v, v, NULL, 0.0f, T * nkv, d, 1e-6f);
        }
        ops_rope_part(k, T, nkv, d, d, pos, freq, 0);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nkv; h++) {
                size_t off = ((size_t)t * nkv + h) * d;
                kv_store(kv, lc->l, slot[t], pos[t], h, k + off, v + off);
            }
    }
    /* device: cu_qkv_rope_store_varied's calls */
    if (lc->shared) {
        assert_int_equal(cuda_rope(dq, T, HEADS, d, dpos, dfreq, 0, &e), HEARTH_OK);
    } else {
        if (lc->k_eq_v) {
            assert_int_equal(cuda_copy_f32(dvv, dk, nk, &e), HEARTH_OK);
            assert_int_equal(cuda_rmsnorm_plain(dvv, T * nkv, d, 1e-6f, &e), HEARTH_OK);
        }
        assert_int_equal(cuda_rope_kv_write(&dv, dl, dq, dk, dvv, T, HEADS, dpos, dslot, dfreq, 0, 0, &e), HEARTH_OK);
    }
    float *gq = download(dq, nq);
    char what[128];
    snprintf(what, sizeof what, "%s layer %d (d %d) rotated q", step, lc->l, d);
    expect_close(what, gq, q, nq, 1e-5f);
    free(gq);
    /* attention over the layer's pool (the wide kernel at d 512) */
    float *ref = malloc(nq * sizeof *ref), *scratch = malloc(ops_attention_scratch(&hv) * sizeof(float));
    ops_attention_args ca = {.kv = &hv,
                             .layer = hl,
                             .q = q,
                             .out = ref,
                             .T = T,
                             .n_heads = HEADS,
                             .n_kv_heads = nkv,
                             .head_dim = d,
                             .pos = pos,
                             .slot = slot,
                             .window = layer_window[lc->l],
                             .scale = scale,
                             .scratch = scratch};
    ops_attention(&ca, NULL);
    float *dout = dev_floats(NULL, nq);
    cuda_attention_args ga = {.kv = &dv,
                              .layer = dl,
                              .q = dq,
                              .out = dout,
                              .T = T,
                              .n_heads = HEADS,
                              .n_kv_heads = nkv,
                              .head_dim = d,
                              .pos = dpos,
                              .slot = dslot,
                              .window = layer_window[lc->l],
                              .scale = scale,
                              .host_slot = slot};
    assert_int_equal(cuda_attention(&ga, &e), HEARTH_OK);
    float *out = download(dout, nq);
    snprintf(what, sizeof what, "%s layer %d (d %d%s%s) attention", step, lc->l, d, lc->k_eq_v ? ", k_eq_v" : "",
             lc->shared ? ", shared" : "");
    /* a convex combination of values of magnitude <= ~1 (normed values: <= sqrt(d)); the
     * scores' summation order differs (~d eps): 5e-5 relative catches any wrong row */
    expect_close(what, out, ref, nq, 5e-5f);
    free(out);
    free(ref);
    free(scratch);
    free(q);
    free(k);
    free(v);
    free(freq);
    cuda_free(dq);
    cuda_free(dk);
    cuda_free(dvv);
    cuda_free(dfreq);
    cuda_free(dout);
}

static void test_varied_pool(void **state) {
    (void)state;
    hearth_error e = {0};
    kv_cache kv;
    int max_context = 64, n_blocks = 24;
    assert_int_equal(
        kv_create_layers(&kv, NL, layer_heads, layer_dims, SEQS, max_context, n_blocks, HEARTH_KV_FLOAT, 1, &e),
        HEARTH_OK);
    cuda_kv dkv;
    assert_int_equal(cuda_kv_alloc(&dkv, &kv, HEARTH_KV_FLOAT, &e), HEARTH_OK);
    /* a ragged prefill step of three sequences (20, 13 and 5 tokens), then one decode token each */
    int lens[SEQS] = {20, 13, 5};
    int32_t pos[64], slot[64];
    int T = 0;
    for (int s = 0; s < SEQS; s++) {
        assert_int_equal(kv_reserve(&kv, s, lens[s] + 1, &e), HEARTH_OK);
        for (int p = 0; p < lens[s]; p++) pos[T] = p, slot[T] = s, T++;
    }
    size_t tb = (size_t)kv.max_slots * kv.max_blocks_per_slot * sizeof(int32_t);
    assert_int_equal(cuda_upload(dkv.tables, kv.tables, tb, &e), HEARTH_OK);
    /* every layer's cases: layer 1 has values = keys (normed), and a shared-KV layer reads it */
    const layer_case cases[] = {{0, 0, 0}, {1, 1, 0}, {2, 0, 0}, {1, 0, 1}, {0, 0, 1}};
    for (int step = 0; step < 2; step++) {
        if (step == 1) { /* decode: each sequence's next position */
            T = SEQS;
            for (int s = 0; s < SEQS; s++) pos[s] = lens[s], slot[s] = s;
        }
        int32_t *dpos = dev_upload(pos, (size_t)T * sizeof(int32_t)),
                *dslot = dev_upload(slot, (size_t)T * sizeof(int32_t));
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            run_layer(&kv, &dkv, &cases[c], T, pos, slot, dpos, dslot, step ? "decode" : "ragged prefill");
        cuda_free(dpos);
        cuda_free(dslot);
    }
    /* the whole device pool equals the host pool, layer after layer (offsets and strides of
     * every view; positions never written are zero on both) */
    size_t elems = 0;
    for (int l = 0; l < NL; l++) elems += (size_t)n_blocks * KV_BLOCK_SIZE * layer_heads[l] * layer_dims[l];
    float *gk = download(dkv.k, elems), *gv = download(dkv.v, elems);
    expect_close("pool keys", gk, kv.k, elems, 1e-5f);
    expect_close("pool values", gv, kv.v, elems, 1e-5f);
    free(gk);
    free(gv);
    /* a partial prefix copy (kv_copy_rows) moves every layer's rows alike */
    int32_t src = kv.tables[0], dst = kv.free_list[kv.n_free - 1]; /* slot 0's first block -> a free one */
    kv_copy_rows(&kv, src, dst, 5);
    assert_int_equal(cuda_kv_copy_rows(&dkv, src, dst, 5, &e), HEARTH_OK);
    gk = download(dkv.k, elems);
    gv = download(dkv.v, elems);
    expect_close("pool keys after copy_rows", gk, kv.k, elems, 1e-5f);
    expect_close("pool values after copy_rows", gv, kv.v, elems, 1e-5f);
    free(gk);
    free(gv);
    cuda_kv_free(&dkv);
    kv_destroy(&kv);
}

/* The wide kernel alone at head_dim 512 on a uniform pool (cuda_kv_upload), grouped heads,
 * a window, a mid-sequence token and batch-invariant mode (which takes it too); with a split
 * scratch (as the model gives it) a decode step splits the positions (a context of 512: 8
 * splits of ceil(len / 8) positions, merged by attention_combine), without one it does not. */
static void test_attention_512(void **state) {
    (void)state;
    hearth_error e = {0};
    enum { D = 512, KVH = 2, H = 8, SL = 3, T = 4 };
    kv_cache kv;
    assert_int_equal(kv_create(&kv, 2, KVH, D, SL, 512, 20, &e), HEARTH_OK);
    size_t split_floats = (size_t)T * H * 32 * (D + 4);
    float *dsplit = dev_floats(NULL, split_floats);
    int lens[SL] = {70, 33, 9};
    for (int s = 0; s < SL; s++) assert_int_equal(kv_reserve(&kv, s, lens[s], &e), HEARTH_OK);
    size_t nf = (size_t)2 * kv.n_blocks * kv.block_floats;
    for (size_t i = 0; i < nf; i++) kv.k[i] = rndf(), kv.v[i] = rndf();
    int32_t slot[T] = {0, 1, 2, 0}, pos[T] = {69, 32, 8, 40};
    for (int split = 0; split < 2; split++)
    for (int window = 0; window <= 16; window += 16)
        for (int inv = 0; inv < 2; inv++) {
            size_t nq = (size_t)T * H * D;
            float *q = rand_floats(nq), *ref = malloc(nq * 4), *scratch = malloc(ops_attention_scratch(&kv) * 4);
            ops_attention_args ca = {.kv = &kv,
                                     .layer = 1,
                                     .q = q,
                                     .out = ref,
                                     .T = T,
                                     .n_heads = H,
                                     .n_kv_heads = KVH,
                                     .head_dim = D,
                                     .pos = pos,
                                     .slot = slot,
                                     .window = window,
                                     .scale = 1.0f / sqrtf((float)D),
                                     .scratch = scratch};
            ops_attention(&ca, NULL);
            cuda_kv dkv;
            assert_int_equal(cuda_kv_upload(&dkv, &kv, &e), HEARTH_OK);
            float *dq = dev_floats(q, nq), *dout = dev_floats(NULL, nq);
            int32_t *dpos = dev_upload(pos, sizeof pos), *dslot = dev_upload(slot, sizeof slot);
            cuda_attention_args ga = {.kv = &dkv,
                                      .layer = 1,
                                      .q = dq,
                                      .out = dout,
                                      .T = T,
                                      .n_heads = H,
                                      .n_kv_heads = KVH,
                                      .head_dim = D,
                                      .pos = dpos,
                                      .slot = dslot,
                                      .window = window,
                                      .scale = ca.scale,
                                      .batch_invariant = inv,
                                      .split_scratch = split ? dsplit : NULL,
                                      .split_scratch_floats = split ? split_floats : 0};
            assert_int_equal(cuda_attention(&ga, &e), HEARTH_OK);
            float *out = download(dout, nq);
            char what[96];
            snprintf(what, sizeof what, "attention d=512 window=%d invariant=%d split scratch=%d", window, inv, split);
            expect_close(what, out, ref, nq, 3e-5f); /* 512 products per score: a little more than d 256's 2e-5 */
            free(out);
            free(q);
            free(ref);
            free(scratch);
            cuda_free(dq);
            cuda_free(dout);
            cuda_free(dpos);
            cuda_free(dslot);
            cuda_kv_free(&dkv);
        }
    cuda_free(dsplit);
    /* wider than the kernel takes: a clear error, nothing launched */
    cuda_kv dkv = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 640};
    cuda_attention_args ga = {.kv = &dkv, .T = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 640};
    assert_int_equal(cuda_attention(&ga, &e), HEARTH_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "640"));
    kv_destroy(&kv);
}

int main(void) {
    int n = cuda_device_count();
    if (n == 0) {
        printf("test_cuda_gemma4: skipped: no CUDA device. The CUDA tests of varied layers did NOT run and do not "
               "count as passed.\n");
        return 0;
    }
    cuda_device_info info;
    hearth_error e = {0};
    if (cuda_device_open(0, &info, &e)) {
        printf("test_cuda_gemma4: cannot open device 0: %s\n", e.message);
        return 1;
    }
    rng_state ^= (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
    printf("test_cuda_gemma4: device 0: %s; seed %llx\n", info.name, (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_varied_pool),
        cmocka_unit_test(test_attention_512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
