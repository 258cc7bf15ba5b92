/* test_sampler_lab.c: the sampling lab's stages against their definitions: the identity
 * curve draws exactly what temperature 1 draws with the same seed; curves and HLG are
 * monotone (argmax kept), map -inf to -inf and go through their points; bad curves are
 * refused with a message naming the problem; XTC drops the right candidates and keeps
 * the exempt ones. The differential against mlx-lm's apply_xtc is
 * tests/parity/test_sampler_lab.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

static hearth_sampling base(void) {
    hearth_sampling p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

static uint64_t rng = 0x1234567;
static double uniform(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void random_logits(float *x, int V, double scale) {
    for (int i = 0; i < V; i++) x[i] = (float)((uniform() * 2 - 1) * scale);
}

/* The designer's identity: points on the diagonal from 1e-4% to 100%. */
static void identity_curve(hearth_curve *c) {
    double pct[] = {1e-4, 1e-2, 1, 10, 50, 100};
    assert_int_equal(hearth_curve_set(c, pct, pct, 6, NULL), HEARTH_OK);
}

static void test_identity_curve_is_temperature_one(void **state) {
    (void)state;
    enum { V = 3000, STEPS = 400 };
    static float x[V];
    sampler a, b;
    assert_int_equal(sampler_init(&a, V, NULL), HEARTH_OK);
    assert_int_equal(sampler_init(&b, V, NULL), HEARTH_OK);
    hearth_sampling t1 = base(), cv = base();
    t1.temperature = 1;
    identity_curve(&cv.curve);
    cv.temperature = 0.3f; /* ignored: the curve replaces temperature */
    sampler_seed(&a, 42), sampler_seed(&b, 42);
    int differ = 0, distinct = 0, last = -1;
    for (int step = 0; step < STEPS; step++) {
        random_logits(x, V, step % 3 == 0 ? 12 : 4); /* peaked and flat rows */
        int32_t ta = sampler_sample(&a, x, &t1, NULL, 0, NULL), tb = sampler_sample(&b, x, &cv, NULL, 0, NULL);
        differ += ta != tb;
        distinct += ta != last;
        last = ta;
    }
    assert_int_equal(differ, 0);
    assert_true(distinct > STEPS / 2); /* it really sampled */
    /* and with top-k / top-p on top: the filters see the same values */
    t1.top_k = cv.top_k = 40, t1.top_p = cv.top_p = 0.9f;
    for (int step = 0; step < 100; step++) {
        random_logits(x, V, 6);
        assert_int_equal(sampler_sample(&a, x, &t1, NULL, 0, NULL), sampler_sample(&b, x, &cv, NULL, 0, NULL));
    }
    sampler_free(&a), sampler_free(&b);
}

static void check_monotone_row(const hearth_sampling *p, int V) {
    float *x = malloc((size_t)V * sizeof *x), *y = malloc((size_t)V * sizeof *y);
    random_logits(x, V, 10);
    x[7] = -INFINITY; /* a masked token */
    x[11] = 25;       /* the argmax */
    assert_int_equal(sampler_shape(x, V, p, y), 1);
    assert_true(y[7] == -INFINITY);
    for (int i = 0; i < V; i++) {
        if (i != 7) assert_true(isfinite(y[i]));
        assert_true(y[i] <= y[11]);
        for (int j = 0; j < 8; j++) { /* order kept (ties allowed on flat pieces) */
            int k = (int)(uniform() * V);
            if (x[i] < x[k]) assert_true(y[i] <= y[k]);
        }
    }
    free(x), free(y);
}

static void test_curves_monotone(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        int n = 2 + (int)(uniform() * 10);
        double xs[HEARTH_CURVE_MAX_POINTS], ys[HEARTH_CURVE_MAX_POINTS];
        /* random non-decreasing y over increasing x, flat stretches included */
        double lx = -14 + uniform() * 4, ly = -14 + uniform() * 8;
        for (int i = 0; i < n; i++) {
            lx += 0.1 + uniform() * 2, ly += uniform() < 0.2 ? 0 : uniform() * 3;
            xs[i] = fmin(exp(lx) * 100, 100), ys[i] = fmin(exp(ly) * 100, 100);
        }
        for (int i = 1; i < n; i++)
            if (xs[i] <= xs[i - 1]) n = i; /* clipped at 100%: keep the strictly increasing head */
        if (n < 2) continue;
        hearth_sampling p = base();
        assert_int_equal(hearth_curve_set(&p.curve, xs, ys, n, NULL), HEARTH_OK);
        double m[HEARTH_CURVE_MAX_POINTS];
        sampler_curve_tangents(&p.curve, m);
        for (int i = 0; i < n; i++) /* through its points */
            assert_true(fabs(sampler_curve_eval(&p.curve, m, p.curve.x[i]) - p.curve.y[i]) < 1e-9);
        double prev = -INFINITY;
        for (double l = -40; l <= 0; l += 0.01) { /* dense: never goes down */
            double v = sampler_curve_eval(&p.curve, m, l);
            assert_true(v >= prev - 1e-12);
            prev = v;
        }
        assert_true(sampler_curve_eval(&p.curve, m, -INFINITY) == -INFINITY);
        check_monotone_row(&p, 500);
    }
}

static void test_bad_curves(void **state) {
    (void)state;
    hearth_curve c;
    hearth_error err = {0};
    double x1[] = {10, 50}, y_down[] = {50, 10};
    assert_int_equal(hearth_curve_set(&c, x1, y_down, 2, &err), HEARTH_ERR_INVALID);
    assert_non_null(strstr(err.message, "not monotone"));
    double x_dup[] = {10, 10, 50}, y3[] = {1, 2, 3};
    assert_int_equal(hearth_curve_set(&c, x_dup, y3, 3, &err), HEARTH_ERR_INVALID);
    assert_non_null(strstr(err.message, "share x"));
    assert_int_equal(hearth_curve_set(&c, x1, y3, 1, &err), HEARTH_ERR_INVALID);
    double x_big[] = {10, 150}, y2[] = {1, 2};
    assert_int_equal(hearth_curve_set(&c, x_big, y2, 2, &err), HEARTH_ERR_INVALID);
    assert_non_null(strstr(err.message, "point 1"));
    double x_nan[] = {10, NAN};
    assert_int_equal(hearth_curve_set(&c, x_nan, y2, 2, &err), HEARTH_ERR_INVALID);
    /* unsorted input is sorted; a falling pair found after sorting is still refused */
    double xu[] = {50, 10}, yu[] = {10, 50};
    assert_int_equal(hearth_curve_set(&c, xu, yu, 2, &err), HEARTH_ERR_INVALID);
    double yok[] = {60, 5};
    assert_int_equal(hearth_curve_set(&c, xu, yok, 2, &err), HEARTH_OK);
    assert_true(c.x[0] < c.x[1] && c.y[0] < c.y[1]);
}

static void test_hlg(void **state) {
    (void)state;
    hearth_hlg g = {.enabled = 1, .width = 4, .shoulder = 4, .toe = 6, .pivot_offset = 6};
    /* C1 at the knees, linear in the middle, strictly increasing everywhere */
    for (int side = -1; side <= 1; side += 2) {
        double k = side * 4.0, e = 1e-7;
        assert_true(fabs(sampler_hlg_eval(&g, 1.5, k + e) - sampler_hlg_eval(&g, 1.5, k - e)) < 1e-6);
        double d_in = (sampler_hlg_eval(&g, 1.5, k - side * e) - sampler_hlg_eval(&g, 1.5, k - side * 2 * e)) / e;
        double d_out = (sampler_hlg_eval(&g, 1.5, k + side * 2 * e) - sampler_hlg_eval(&g, 1.5, k + side * e)) / e;
        assert_true(fabs(fabs(d_in) - fabs(d_out)) < 1e-3);
    }
    assert_true(sampler_hlg_eval(&g, 2, 1.5) == 3);
    double prev = -INFINITY;
    for (double z = -60; z < 30; z += 0.01) {
        double v = sampler_hlg_eval(&g, 1, z);
        assert_true(v > prev);
        prev = v;
    }
    assert_true(sampler_hlg_eval(&g, 1, -INFINITY) == -INFINITY);
    hearth_sampling p = base();
    p.hlg = g;
    p.temperature = 0.8f;
    check_monotone_row(&p, 2000);
    p.temperature = 0; /* greedy without an explicit gain: HLG does not run */
    float x[3] = {1, 2, 3}, y[3];
    assert_int_equal(sampler_shape(x, 3, &p, y), 0);
    p.hlg.gain = 2;
    assert_int_equal(sampler_shape(x, 3, &p, y), 1);
}

static void test_xtc_cut(void **state) {
    (void)state;
    /* probabilities 0.4, 0.3, 0.2, 0.1 (log); threshold 0.15: above it 0.4, 0.3, 0.2; the
     * least of them (0.2) stays, 0.4 and 0.3 go */
    float x[4] = {(float)log(0.4), (float)log(0.3), (float)log(0.2), (float)log(0.1)};
    int32_t cand[4] = {0, 1, 2, 3};
    assert_int_equal(sampler_xtc_cut(x, cand, 4, 0.15f, NULL, 0), 2);
    assert_int_equal(cand[0], 2), assert_int_equal(cand[1], 3);
    int32_t c2[4] = {0, 1, 2, 3}, exempt[1] = {1};
    assert_int_equal(sampler_xtc_cut(x, c2, 4, 0.15f, exempt, 1), 3);
    assert_int_equal(c2[0], 1), assert_int_equal(c2[1], 2), assert_int_equal(c2[2], 3);
    int32_t c3[4] = {0, 1, 2, 3};
    assert_int_equal(sampler_xtc_cut(x, c3, 4, 0.35f, NULL, 0), 4); /* one above: nothing goes */
    assert_int_equal(sampler_xtc_cut(x, c3, 4, 0.5f, NULL, 0), 4);  /* none above */

    /* in the sampler: probability 1 never draws the dropped tokens, 0 draws them */
    sampler s;
    assert_int_equal(sampler_init(&s, 4, NULL), HEARTH_OK);
    sampler_seed(&s, 7);
    hearth_sampling p = base();
    p.temperature = 1, p.xtc_probability = 1, p.xtc_threshold = 0.15f;
    for (int i = 0; i < 300; i++) assert_true(sampler_sample(&s, x, &p, NULL, 0, NULL) >= 2);
    double probs[4];
    assert_int_equal(sampler_distribution(&s, x, &p, NULL, 0, probs), 2);
    assert_true(probs[0] == 0 && probs[1] == 0 && fabs(probs[2] - 2.0 / 3) < 1e-6);
    int32_t ex[1] = {0};
    sampler_set_xtc_exempt(&s, ex, 1);
    assert_int_equal(sampler_distribution(&s, x, &p, NULL, 0, probs), 3);
    assert_true(probs[0] > 0.5);
    sampler_free(&s);
}

/* The reference order of the candidates: value descending, lower id first. */
static const float *order_x;
static int by_value_then_id(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (order_x[i] != order_x[j]) return order_x[i] < order_x[j] ? 1 : -1;
    return i - j;
}

/* The sampler's candidate sort (a radix sort for large sets) gives exactly the comparison
 * sort's order: ties (many equal values, -0 beside +0) by id, negatives, subnormals. */
static void test_candidate_order(void **state) {
    (void)state;
    enum { V = 20000 };
    static float x[V];
    static int32_t want[V];
    sampler s;
    assert_int_equal(sampler_init(&s, V, NULL), HEARTH_OK);
    hearth_sampling p = base();
    p.temperature = 1;
    for (int trial = 0; trial < 6; trial++) {
        for (int i = 0; i < V; i++) {
            double u = uniform();
            x[i] = trial % 2 ? (float)((int)(u * 40) - 20) * 0.5f /* many ties */ : (float)((u * 2 - 1) * 15);
            if (i % 97 == 0) x[i] = (i / 97) % 2 ? -0.0f : 0.0f;
            if (i % 131 == 0) x[i] = 1e-40f * (float)(i % 3); /* subnormals */
        }
        x[5] = 19.5f; /* the best, so everything is within the e^-40 floor */
        int n = sampler_survivors(&s, x, &p, NULL, 0);
        assert_int_equal(n, V);
        for (int i = 0; i < V; i++) want[i] = i;
        order_x = x;
        qsort(want, V, sizeof *want, by_value_then_id);
        assert_memory_equal(s.cand, want, V * sizeof *want);
    }
    sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_curve_is_temperature_one),
        cmocka_unit_test(test_curves_monotone),
        cmocka_unit_test(test_bad_curves),
        cmocka_unit_test(test_hlg),
        cmocka_unit_test(test_xtc_cut),
        cmocka_unit_test(test_candidate_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
