/* sampler_lab.c: the sampling lab's stages for sampler.c: the designer's transfer curve
 * (monotone PCHIP in log-probability space), the HLG tone curve and XTC. Pure functions
 * over one row; no allocation, no RNG (sampler.c draws XTC's coin). Both shapes are
 * monotone so the argmax and the filters' order survive, and -inf stays -inf. */
#include "backend/cpu/cpu_ops.h"
#include "base/err.h"
#include "engine/sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampler_lab_active(const hearth_sampling *p) {
    return p->curve.n_points > 0 || p->hlg.enabled || p->xtc_probability > 0;
}

/* ---- the curve ---- */

static int cmp_point(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

hearth_status hearth_curve_set(hearth_curve *c, const double *x_pct, const double *y_pct, int n, hearth_error *err) {
    memset(c, 0, sizeof *c);
    if (n < 2 || n > HEARTH_CURVE_MAX_POINTS)
        return err_set(err, HEARTH_ERR_INVALID, "curve: %d points; a curve has 2 to %d", n, HEARTH_CURVE_MAX_POINTS);
    double pts[HEARTH_CURVE_MAX_POINTS][2];
    for (int i = 0; i < n; i++) {
        if (!isfinite(x_pct[i]) || !isfinite(y_pct[i]) || x_pct[i] > 100 || y_pct[i] > 100)
            return err_set(err, HEARTH_ERR_INVALID, "curve: point %d (%g%%, %g%%) is not a percentage in (0, 100]", i,
                           x_pct[i], y_pct[i]);
        /* the spec's floor: 1e-9 percent, so 0 maps to a finite log-probability */
        pts[i][0] = log(fmax(x_pct[i], 1e-9) / 100), pts[i][1] = log(fmax(y_pct[i], 1e-9) / 100);
    }
    qsort(pts, (size_t)n, sizeof pts[0], cmp_point);
    for (int i = 0; i + 1 < n; i++) {
        if (pts[i + 1][0] == pts[i][0])
            return err_set(err, HEARTH_ERR_INVALID, "curve: two points share x = %g%%", exp(pts[i][0]) * 100);
        if (pts[i + 1][1] < pts[i][1])
            return err_set(err, HEARTH_ERR_INVALID,
                           "curve: not monotone: it falls between x = %g%% and x = %g%% (a curve must never go down)",
                           exp(pts[i][0]) * 100, exp(pts[i + 1][0]) * 100);
    }
    for (int i = 0; i < n; i++) c->x[i] = pts[i][0], c->y[i] = pts[i][1];
    c->n_points = n;
    return HEARTH_OK;
}

/* Fritsch-Carlson: end tangents the end secants, interior ones 0 at a local extremum
 * or flat secant, else the weighted harmonic mean of the two secants (keeps every
 * segment monotone: each tangent is at most 3x its secants). */
void sampler_curve_tangents(const hearth_curve *c, double *m) {
    int n = c->n_points;
    double d[HEARTH_CURVE_MAX_POINTS], h[HEARTH_CURVE_MAX_POINTS];
    for (int i = 0; i + 1 < n; i++) h[i] = c->x[i + 1] - c->x[i], d[i] = (c->y[i + 1] - c->y[i]) / h[i];
    m[0] = d[0], m[n - 1] = d[n - 2];
    for (int i = 1; i + 1 < n; i++) {
        if (d[i - 1] * d[i] <= 0) {
            m[i] = 0;
            continue;
        }
        double w1 = 2 * h[i] + h[i - 1], w2 = h[i] + 2 * h[i - 1];
        m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i]);
    }
}

double sampler_curve_eval(const hearth_curve *c, const double *m, double l) {
    int n = c->n_points;
    if (l == -INFINITY) return -INFINITY;
    /* outside the points: straight lines, never flatter than the identity on the left so
     * the tail cannot climb above the drawn range */
    if (l <= c->x[0]) return c->y[0] + fmax(m[0], 1) * (l - c->x[0]);
    if (l >= c->x[n - 1]) return c->y[n - 1] + m[n - 1] * (l - c->x[n - 1]);
    int lo = 0, hi = n - 1; /* x[lo] <= l < x[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (c->x[mid] <= l)
            lo = mid;
        else
            hi = mid;
    }
    double h = c->x[hi] - c->x[lo], t = (l - c->x[lo]) / h, t2 = t * t, t3 = t2 * t;
    return (2 * t3 - 3 * t2 + 1) * c->y[lo] + (t3 - 2 * t2 + t) * h * m[lo] + (-2 * t3 + 3 * t2) * c->y[hi] +
           (t3 - t2) * h * m[hi];
}

/* ---- HLG ---- */

double sampler_hlg_eval(const hearth_hlg *g, double gain, double z) {
    double w = g->width;
    if (z == -INFINITY) return -INFINITY;
    if (z > w && g->shoulder > 0) return gain * w + gain * g->shoulder * log1p((z - w) / g->shoulder);
    if (z < -w && g->toe > 0) return -gain * w - gain * g->toe * log1p((-z - w) / g->toe);
    return gain * z;
}

/* HLG's mid slope: the explicit gain, else 1/temperature (so temperature stays the
 * contrast knob); 0 when it would be greedy. */
static double hlg_gain(const hearth_sampling *p) {
    if (p->hlg.gain > 0) return p->hlg.gain;
    return p->temperature > 0 ? 1.0 / p->temperature : 0;
}

int sampler_shape(const float *x, int V, const hearth_sampling *p, float *out) {
    int curve = p->curve.n_points >= 2;
    double gain = curve ? 0 : p->hlg.enabled ? hlg_gain(p) : 0;
    if (!curve && !(gain > 0)) return 0;
    /* log-probabilities l = x - logsumexp(x), in double so the identity curve gives back
     * x - logsumexp exactly as far as float can hold it */
    double mx = x[ops_argmax(x, V)], sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    if (curve) {
        double m[HEARTH_CURVE_MAX_POINTS];
        sampler_curve_tangents(&p->curve, m);
        for (int i = 0; i < V; i++) out[i] = (float)sampler_curve_eval(&p->curve, m, (double)x[i] - lse);
        return 1;
    }
    double mu = (mx - lse) - p->hlg.pivot_offset; /* pivot: the top log-probability minus the offset */
    for (int i = 0; i < V; i++) out[i] = (float)sampler_hlg_eval(&p->hlg, gain, (double)x[i] - lse - mu);
    return 1;
}

/* ---- XTC ---- */

int sampler_xtc_cut(const float *x, int32_t *cand, int n, float threshold, const int32_t *exempt, int n_exempt) {
    if (n < 2) return n;
    double mx = x[cand[0]], total = 0;
    for (int i = 0; i < n; i++) total += exp((double)x[cand[i]] - mx);
    /* mlx-lm: the smallest probability above the threshold; everything strictly above it
     * goes. Sorted descending, that is a prefix ending before the last such candidate. */
    int last = -1;
    for (int i = 0; i < n && exp((double)x[cand[i]] - mx) / total > threshold; i++) last = i;
    if (last <= 0) return n;
    float lim = x[cand[last]];
    int k = 0;
    for (int i = 0; i < n; i++) {
        int drop = i < last && x[cand[i]] > lim;
        for (int j = 0; drop && j < n_exempt; j++)
            if (exempt[j] == cand[i]) drop = 0;
        if (!drop) cand[k++] = cand[i];
    }
    return k;
}
