/* sampler.c: next-token selection (see sampler.h). Order as in mlx-lm: logit bias and
 * penalties first, log-probabilities from the processed logits, then top-k, top-p and
 * min-p filters and a temperature-scaled draw (or argmax at temperature 0). */
#define _GNU_SOURCE
#include "engine/sampler.h"
#include "base/err.h"
#include "base/mem_touch.h"
#include "backend/cpu/cpu_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* draw_in_order's buckets: the top 12 bits of the sort key (sign, exponent, 3 mantissa
 * bits: an eighth of a binade each), so the bucket a draw lands in holds few tokens. Below
 * DRAW_MIN_CANDIDATES the full sort is as cheap, and sort_buf may be too small for them. */
#define DRAW_SHIFT 20
#define DRAW_BUCKETS (1 << (32 - DRAW_SHIFT))
#define DRAW_MIN_CANDIDATES DRAW_BUCKETS

hearth_status sampler_init(sampler *s, int vocab, hearth_error *err) {
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->shaped = malloc((size_t)vocab * sizeof *s->shaped);
    s->sort_buf = malloc(3 * (size_t)vocab * sizeof *s->sort_buf);
    if (!s->work || !s->cand || !s->counts || !s->shaped || !s->sort_buf) {
        sampler_free(s);
        return err_set(err, HEARTH_ERR_NOMEM, "sampler: out of memory");
    }
    /* resident from the start, as fit predicts (calloc leaves fresh pages unmapped) */
    memset(s->work, 0, (size_t)vocab * sizeof *s->work);
    memset(s->cand, 0, (size_t)vocab * sizeof *s->cand);
    mem_touch(s->work, (size_t)vocab * sizeof *s->work);
    mem_touch(s->cand, (size_t)vocab * sizeof *s->cand);
    mem_touch(s->counts, (size_t)vocab * sizeof *s->counts);
    memset(s->shaped, 0, (size_t)vocab * sizeof *s->shaped);
    memset(s->sort_buf, 0, 3 * (size_t)vocab * sizeof *s->sort_buf);
    sampler_seed(s, (uint64_t)time(NULL));
    return HEARTH_OK;
}

size_t sampler_bytes(int vocab) {
    sampler s;
    return (size_t)vocab *
           (sizeof *s.work + sizeof *s.cand + sizeof *s.counts + sizeof *s.shaped + 3 * sizeof *s.sort_buf);
}

void sampler_free(sampler *s) {
    free(s->work);
    free(s->shaped);
    free(s->sort_buf);
    free(s->cand);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void sampler_seed(sampler *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**: a uniform double in [0, 1). */
static double next_uniform(sampler *s) {
    uint64_t *r = s->rng, result = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return (double)(result >> 11) * (1.0 / 9007199254740992.0);
}

/* First history index of the window of the last `size` (> 0) tokens. */
static size_t window_start(size_t n, int size) { return n > (size_t)size ? n - (size_t)size : 0; }

/* mlx-lm's three penalties, each over its own window of the history: the repetition
 * factor (sign-aware) once per id in its window, presence once per id in its window,
 * frequency once per occurrence in its window. One subtraction per id (presence +
 * frequency x count), the arithmetic the device sampler does too. */
static void apply_penalties(sampler *s, float *x, const hearth_sampling *p, const int32_t *hist, size_t n) {
    int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
    if (!rep && p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    int rep_size = p->repetition_context_size > 0 ? p->repetition_context_size : 20;
    size_t from_rep = window_start(n, rep_size),
           from_pres = window_start(n, p->presence_context_size > 0 ? p->presence_context_size : rep_size),
           from_freq = window_start(n, p->frequency_context_size > 0 ? p->frequency_context_size : rep_size);
    size_t from = from_rep < from_pres ? from_rep : from_pres;
    if (from_freq < from) from = from_freq;
    /* counts[id]: bit 0 in the repetition window, bit 1 in the presence window, the bits
     * above the occurrences in the frequency window */
    for (size_t i = from; i < n; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab)
            s->counts[hist[i]] =
                (s->counts[hist[i]] | (i >= from_rep) | (i >= from_pres) << 1) + ((i >= from_freq) << 2);
    for (size_t i = from; i < n; i++) {
        int32_t id = hist[i];
        if (id < 0 || id >= s->vocab || s->counts[id] == 0) continue; /* each id once */
        int32_t c = s->counts[id];
        if (rep && (c & 1)) x[id] = x[id] < 0 ? x[id] * p->repetition_penalty : x[id] / p->repetition_penalty;
        x[id] -= ((c & 2) ? p->presence_penalty : 0) + p->frequency_penalty * (float)(c >> 2);
        s->counts[id] = 0;
    }
}

void sampler_set_xtc_exempt(sampler *s, const int32_t *ids, int n) {
    s->n_xtc_exempt = 0;
    for (int i = 0; i < n && s->n_xtc_exempt < SAMPLER_MAX_EXEMPT; i++) s->xtc_exempt[s->n_xtc_exempt++] = ids[i];
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *x = ctx;
    float fa = x[*(const int32_t *)a], fb = x[*(const int32_t *)b];
    if (fa != fb) return fa < fb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* A key whose ascending order is x's descending order (-0 as +0, so they tie as in
 * cmp_desc; NaN never reaches here: the candidate floor drops it). */
static uint32_t desc_key(float f) {
    if (f == 0) f = 0;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending float order as unsigned */
    return ~u;
}

/* Sorts ids[0..n) as qsort_r with cmp_desc does (value descending, lower id first): a
 * stable LSD radix sort of 8-bit digits over ids that arrive in ascending id order, so
 * equal values keep their id order. qsort over a whole vocabulary at temperature 1 was the
 * largest cost of a sampled token (tens of ms at 49k candidates); this is a few passes. */
static void sort_candidates(sampler *s, const float *x, int32_t *ids, int n) {
    if (n < 256) { /* small sets: the comparison sort is as fast */
        qsort_r(ids, (size_t)n, sizeof *ids, cmp_desc, (void *)x);
        return;
    }
    uint32_t *key = s->sort_buf, *key2 = key + s->vocab;
    int32_t *ids2 = (int32_t *)(key2 + s->vocab);
    for (int i = 0; i < n; i++) key[i] = desc_key(x[ids[i]]);
    int32_t *src_id = ids, *dst_id = ids2;
    uint32_t *src_k = key, *dst_k = key2;
    for (int shift = 0; shift < 32; shift += 8) {
        int count[257] = {0};
        for (int i = 0; i < n; i++) count[((src_k[i] >> shift) & 255) + 1]++;
        if (count[((src_k[0] >> shift) & 255) + 1] == n) continue; /* one digit value: nothing moves */
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int i = 0; i < n; i++) {
            int at = count[(src_k[i] >> shift) & 255]++;
            dst_k[at] = src_k[i], dst_id[at] = src_id[i];
        }
        int32_t *ti = src_id;
        src_id = dst_id, dst_id = ti;
        uint32_t *tk = src_k;
        src_k = dst_k, dst_k = tk;
    }
    if (src_id != ids) memcpy(ids, src_id, (size_t)n * sizeof *ids);
}

/* The n highest entries of x (ties: lower id first), in order, into ids. */
static void top_n(const float *x, int vocab, int n, int32_t *ids) {
    int have = 0;
    for (int i = 0; i < vocab; i++) {
        if (have == n && !(x[i] > x[ids[n - 1]])) continue;
        int j = have < n ? have++ : n - 1;
        while (j > 0 && x[ids[j - 1]] < x[i]) { ids[j] = ids[j - 1]; j--; }
        ids[j] = i;
    }
}

/* The processed logits into s->work (bias, penalties); returns the best index. */
static int32_t process(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                       size_t n_history) {
    float *x = s->work;
    int V = s->vocab;
    memcpy(x, logits, (size_t)V * sizeof *x);
    s->work_lse_ok = 0;
    for (size_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < V) x[p->bias_ids[i]] += p->bias_values[i];
    apply_penalties(s, x, p, history, n_history);
    return ops_argmax(x, V);
}

/* Whether the draw needs the candidates in order before it: a top-k, top-p or min-p cut,
 * or XTC (which may fire). Without them the draw finds its token by draw_in_order. */
static int needs_order(const hearth_sampling *p) {
    return p->top_k > 0 || (p->top_p > 0 && p->top_p < 1) || p->min_p > 0 || p->xtc_probability > 0;
}

/* Temperature t > 0: the tokens the draw is made from into s->cand[0..n), sorted by x
 * (s->work, or the lab's shaped values) unless !sorted and no filter needs the order
 * (then in id order, *in_order 0); returns n. */
static int filter(sampler *s, const float *x, const hearth_sampling *p, float t, float mx, int sorted,
                  int *in_order) {
    int V = s->vocab;
    /* candidates: tokens within e^-40 of the best after temperature; the rest cannot
     * carry probability mass that float sampling would see */
    float inv_t = 1.0f / t, floor = mx - 40.0f * t;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (x[i] >= floor) s->cand[n++] = i;
    *in_order = sorted || needs_order(p) || n < DRAW_MIN_CANDIDATES;
    if (!*in_order) return n;
    sort_candidates(s, x, s->cand, n);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double total = 0;
    for (int i = 0; i < n; i++) total += exp((double)(x[s->cand[i]] - mx) * inv_t);
    if (p->top_p > 0 && p->top_p < 1) { /* smallest prefix with mass >= top_p */
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += exp((double)(x[s->cand[i]] - mx) * inv_t) / total;
            if (acc >= p->top_p) { n = i + 1; break; }
        }
    }
    if (p->min_p > 0) { /* drop tokens below min_p times the best's probability */
        double lim = log((double)p->min_p) / inv_t;
        int keep = 1;
        while (keep < n && (double)(x[s->cand[keep]] - mx) >= lim) keep++;
        n = keep;
    }
    return n;
}

/* Everything before the draw: the processed logits, then the lab's curve / HLG, the
 * filters and XTC (xtc: 1 fires, 0 never, -1 draws with p->xtc_probability). *x gets the
 * values the draw uses at temperature *t (0: greedy, s->cand[0] the argmax); returns n. */
static int candidates(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                      size_t n_history, int xtc, const float **x, float *t, int *in_order) {
    int32_t best = process(s, logits, p, history, n_history);
    *x = s->work, *t = p->temperature;
    if (sampler_shape(s->work, s->vocab, p, s->shaped)) *x = s->shaped, *t = 1; /* monotone: best stays best */
    if (!(*t > 0)) {
        s->cand[0] = best;
        *in_order = 1;
        return 1;
    }
    int sorted = *in_order;
    int n = filter(s, *x, p, *t, (*x)[best], sorted, in_order);
    if (xtc < 0 && p->xtc_probability > 0) xtc = next_uniform(s) <= p->xtc_probability; /* mlx-lm: u > p skips */
    if (xtc > 0 && p->xtc_probability > 0)
        n = sampler_xtc_cut(*x, s->cand, n, p->xtc_threshold, s->xtc_exempt, s->n_xtc_exempt);
    return n;
}

int sampler_survivors(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                      size_t n_history) {
    const float *x;
    float t;
    int in_order = 1;
    return candidates(s, logits, p, history, n_history, 0, &x, &t, &in_order);
}

int sampler_distribution(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                         size_t n_history, double *probs) {
    const float *x;
    float t;
    int in_order = 1;
    int n = candidates(s, logits, p, history, n_history, 1, &x, &t, &in_order);
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    if (!(t > 0)) {
        probs[s->cand[0]] = 1;
        return 1;
    }
    double total = 0, mx = x[s->cand[0]];
    for (int i = 0; i < n; i++) total += exp((x[s->cand[i]] - mx) / t);
    for (int i = 0; i < n; i++) probs[s->cand[i]] = exp((x[s->cand[i]] - mx) / t) / total;
    return n;
}

/* The sorted walk's draw without sorting everything: the token at which the mass summed
 * in the sampler's order (value descending, lower id first) passes u * total, for the
 * candidates s->cand[0..n) in id order. One pass sums each bucket of the value order
 * (DRAW_BUCKETS of them, by the sort key's top bits); the walk over the buckets finds the
 * one the draw lands in, and only its members are sorted and walked. Picks what sorting
 * all n and walking them picks, up to the rounding of the sums' order. */
static int32_t draw_in_order(sampler *s, const float *x, int n, float inv_t, double u) {
    double *mass = (double *)s->sort_buf; /* DRAW_BUCKETS doubles: n >= DRAW_MIN_CANDIDATES
                                             makes sort_buf (3 * vocab words) hold them */
    memset(mass, 0, DRAW_BUCKETS * sizeof *mass);
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = fmaxf(mx, x[s->cand[i]]);
    double total = 0;
    for (int i = 0; i < n; i++) {
        float v = x[s->cand[i]];
        double w = exp((double)(v - mx) * inv_t);
        mass[desc_key(v) >> DRAW_SHIFT] += w;
        total += w;
    }
    double r = u * total, acc = 0, before = 0; /* before: the mass of the buckets ahead of b */
    int b = -1;
    for (int k = 0; k < DRAW_BUCKETS; k++) {
        if (mass[k] == 0) continue;
        b = k, before = acc; /* past the end by rounding: the last bucket (its last token) */
        acc += mass[k];
        if (r < acc) break;
    }
    if (b < 0) return s->cand[0];
    acc = before;
    int m = 0; /* the bucket's members, still in id order */
    for (int i = 0; i < n; i++)
        if ((int)(desc_key(x[s->cand[i]]) >> DRAW_SHIFT) == b) s->cand[m++] = s->cand[i];
    sort_candidates(s, x, s->cand, m); /* mass[] is not read after this */
    for (int i = 0; i < m; i++) {
        acc += exp((double)(x[s->cand[i]] - mx) * inv_t);
        if (r < acc) return s->cand[i];
    }
    return s->cand[m - 1];
}

/* logsumexp of the processed logits in s->work: one pass of exp over the vocabulary per
 * token, shared by the chosen token's logprob and the full log-softmax. */
static float work_lse(sampler *s) {
    if (s->work_lse_ok) return s->work_lse;
    const float *w = s->work;
    float mx = w[ops_argmax(w, s->vocab)];
    double sum = 0;
    for (int i = 0; i < s->vocab; i++) sum += exp((double)(w[i] - mx));
    s->work_lse = mx + (float)log(sum);
    s->work_lse_ok = 1;
    return s->work_lse;
}

int32_t sampler_sample(sampler *s, const float *logits, const hearth_sampling *p, const int32_t *history,
                       size_t n_history, hearth_logprobs *lp) {
    const float *x;
    float t;
    int in_order = 0;
    int n = candidates(s, logits, p, history, n_history, -1, &x, &t, &in_order);
    int32_t chosen = s->cand[0];
    if (!in_order) {
        chosen = draw_in_order(s, x, n, 1.0f / t, next_uniform(s));
    } else if (t > 0) {
        /* relative to the best survivor (XTC may have dropped the overall best) */
        float inv_t = 1.0f / t, mx = x[s->cand[0]];
        double total = 0;
        for (int i = 0; i < n; i++) total += exp((double)(x[s->cand[i]] - mx) * inv_t);
        double r = next_uniform(s) * total, acc = 0;
        chosen = s->cand[n - 1];
        for (int i = 0; i < n; i++) {
            acc += exp((double)(x[s->cand[i]] - mx) * inv_t);
            if (r < acc) { chosen = s->cand[i]; break; }
        }
    }
    if (lp) { /* log-softmax only when asked: a pass of exp over the vocabulary per token */
        int V = s->vocab;
        const float *w = s->work;
        float lse = work_lse(s);
        lp->logprob = w[chosen] - lse;
        int k = lp->n < 0 ? 0 : lp->n > HEARTH_MAX_TOP_LOGPROBS ? HEARTH_MAX_TOP_LOGPROBS : lp->n;
        if (k > V) k = V;
        lp->n = k;
        if (k) top_n(w, V, k, lp->top_ids);
        for (int i = 0; i < k; i++) lp->top_logprobs[i] = w[lp->top_ids[i]] - lse;
    }
    return chosen;
}

/* The log-softmax of the processed logits sampler_sample left in s->work. */
static void full_log_softmax(sampler *s, float *out) {
    float lse = work_lse(s);
    for (int i = 0; i < s->vocab; i++) out[i] = s->work[i] - lse;
}

static void sample_row_task(void *ctx, int task, int thread) {
    (void)thread;
    sampler_row *r = (sampler_row *)ctx + task;
    r->token = sampler_sample(r->s, r->logits, r->p, r->history, r->n_history, r->lp);
    if (r->full_logprobs) full_log_softmax(r->s, r->full_logprobs);
}

void sampler_sample_rows(sampler_row *rows, int n, threadpool *tp) {
    if (n <= 0) return;
    /* one row: no fork-join round (a pool wake-up costs about what a small vocabulary's
     * pass does) */
    if (n == 1) sample_row_task(rows, 0, 0);
    else tp_run(tp, n, sample_row_task, rows);
}
