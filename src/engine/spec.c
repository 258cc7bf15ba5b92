/* spec.c: prompt lookup and adaptive draft depth (see spec.h). Knows tokens only. */
#include "engine/spec.h"
#include "hearth.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The tokens after the latest earlier occurrence of hist's last n-gram (longest first),
 * up to max_k; never the tail itself (i + g < n). */
int spec_lookup(const int32_t *hist, int n, int max_k, int32_t *out) {
    return spec_lookup_match(hist, n, max_k, out, NULL);
}

int spec_lookup_match(const int32_t *hist, int n, int max_k, int32_t *out, int *matched) {
    if (matched) *matched = 0;
    if (max_k <= 0) return 0;
    if (max_k > SPEC_MAX_DRAFT) max_k = SPEC_MAX_DRAFT;
    for (int g = SPEC_NGRAM_MAX; g >= SPEC_NGRAM_MIN; g--) {
        if (n < g) continue;
        const int32_t *tail = hist + n - g;
        /* latest first: text being copied right now continues where it was last seen */
        for (int i = n - g - 1; i >= 0; i--) {
            if (hist[i] != tail[0] || memcmp(hist + i, tail, (size_t)g * sizeof *hist)) continue;
            int k = 0;
            while (k < max_k && i + g + k < n) out[k] = hist[i + g + k], k++;
            if (k > 0 && matched) *matched = g;
            if (k > 0) return k;
        }
    }
    return 0;
}

spec_suffix *spec_suffix_new(void) {
    spec_suffix *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ring = malloc(sizeof *s->ring * SPEC_SUFFIX_TOKENS);
    s->slot = calloc(SPEC_SUFFIX_SLOTS, sizeof *s->slot);
    if (!s->ring || !s->slot) {
        spec_suffix_free(s);
        return NULL;
    }
    return s;
}

void spec_suffix_free(spec_suffix *s) {
    if (!s) return;
    free(s->ring);
    free(s->slot);
    free(s);
}

/* The slot of the g tokens t[0..g) (FNV-1a over the ids, g mixed in). */
static size_t suffix_hash(const int32_t *t, int g) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)g;
    for (int i = 0; i < g; i++) h = (h ^ (uint32_t)t[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (size_t)(h & (SPEC_SUFFIX_SLOTS - 1));
}

static const int suffix_ngrams[SPEC_SUFFIX_N_NGRAMS] = SPEC_SUFFIX_NGRAMS;

static int32_t suffix_at(const spec_suffix *s, uint32_t t) { return s->ring[t % SPEC_SUFFIX_TOKENS]; }

void spec_suffix_add(spec_suffix *s, const int32_t *tokens, int n) {
    for (int i = 0; i <= n; i++) {
        int32_t t = i < n ? tokens[i] : -1;
        s->ring[s->n % SPEC_SUFFIX_TOKENS] = t;
        if (++s->n == 0) s->n = SPEC_SUFFIX_TOKENS; /* 0 means an empty slot: skip it on wrapping */
        if (t < 0) continue;
        for (int j = 0; j < SPEC_SUFFIX_N_NGRAMS; j++) { /* each n-gram of this output ending here */
            int g = suffix_ngrams[j];
            if (i + 1 >= g) s->slot[suffix_hash(tokens + i + 1 - g, g)] = s->n;
        }
    }
}

int spec_suffix_lookup(const spec_suffix *s, const int32_t *hist, int n, int max_k, int32_t *out, int *matched) {
    if (matched) *matched = 0;
    if (!s || max_k <= 0) return 0;
    if (max_k > SPEC_MAX_DRAFT) max_k = SPEC_MAX_DRAFT;
    for (int j = 0; j < SPEC_SUFFIX_N_NGRAMS; j++) {
        int g = suffix_ngrams[j];
        if (n < g) continue;
        const int32_t *tail = hist + n - g;
        uint32_t at = s->slot[suffix_hash(tail, g)]; /* the index after the n-gram's end */
        uint32_t back = s->n - at;                   /* tokens appended since (mod 2^32) */
        /* still in the ring with the n-gram itself, and not another n-gram of the slot */
        if (!at || back == 0 || back + (uint32_t)g > SPEC_SUFFIX_TOKENS) continue;
        int same = 1;
        for (int i = 0; same && i < g; i++) same = suffix_at(s, at - (uint32_t)g + (uint32_t)i) == tail[i];
        if (!same) continue;
        int k = 0;
        while (k < max_k && (uint32_t)k < back && suffix_at(s, at + (uint32_t)k) >= 0)
            out[k] = suffix_at(s, at + (uint32_t)k), k++;
        if (k > 0 && matched) *matched = g;
        if (k > 0) return k;
    }
    return 0;
}

static int cost_bucket(int n_dec) {
    return n_dec < 1 ? 0 : n_dec > SPEC_COST_BUCKETS ? SPEC_COST_BUCKETS - 1 : n_dec - 1;
}

void spec_cost_record(spec_cost *c, int n_dec, int extra, double seconds) {
    int b = cost_bucket(n_dec);
    if (!(seconds > 0)) return;
    if (extra <= 0) {
        c->plain[b] = c->n_plain[b]++ ? 0.9 * c->plain[b] + 0.1 * seconds : seconds;
        c->since_plain[b] = 0;
        return;
    }
    c->since_plain[b]++;
    if (!c->n_plain[b]) return; /* the extra is measured against a plain step */
    int k = extra > SPEC_COST_TOKENS ? SPEC_COST_TOKENS : extra;
    double over = seconds - c->plain[b];
    if (over < 0) over = 0;
    c->extra[b][k] = c->n_extra[b][k]++ ? 0.8 * c->extra[b][k] + 0.2 * over : over;
    c->n_spec[b]++;
}

int spec_cost_plain_due(const spec_cost *c, int n_dec) {
    int b = cost_bucket(n_dec);
    return c->n_plain[b] < SPEC_COST_WARM || c->since_plain[b] >= SPEC_COST_REFRESH;
}

double spec_expected_tokens(double a, int k) {
    if (a >= 0.999) return k + 1.0;
    if (a <= 0) return 1.0;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

int spec_cost_depth(const spec_cost *c, int n_dec, double a, int k) {
    int b = cost_bucket(n_dec);
    if (k <= 0 || c->n_plain[b] < SPEC_COST_WARM || c->n_spec[b] < SPEC_COST_WARM) return k;
    if (k > SPEC_COST_TOKENS) k = SPEC_COST_TOKENS;
    double t = c->plain[b], best = 0;
    int best_k = 0;
    for (int j = 1; j <= k; j++) {
        int m = 0; /* the nearest measured token count */
        for (int d = 0; !m && d < SPEC_COST_TOKENS; d++)
            m = j - d >= 1 && c->n_extra[b][j - d]                  ? j - d
                : j + d <= SPEC_COST_TOKENS && c->n_extra[b][j + d] ? j + d
                                                                    : 0;
        double over = c->extra[b][m] * (double)j / (double)m;
        double gain = spec_expected_tokens(a, j) * t / (t + over); /* tokens per second, over a plain step's */
        if (gain > best) best = gain, best_k = j;
    }
    return best >= SPEC_COST_MARGIN ? best_k : 0;
}

int spec_depth_next(spec_depth *d) {
    if (d->depth == 0) d->depth = SPEC_MAX_DRAFT / 2;
    if (d->pause > 0) {
        d->pause--;
        return 0;
    }
    return d->depth;
}

void spec_depth_update(spec_depth *d, int proposed, int accepted, int strict) {
    if (proposed <= 0) return;
    if (accepted >= proposed) {
        d->depth = d->depth * 2 > SPEC_MAX_DRAFT ? SPEC_MAX_DRAFT : d->depth * 2;
        d->misses = 0;
        return;
    }
    d->depth = accepted + 1;
    if (accepted > 0 && !strict) {
        d->misses = 0;
        return;
    }
    if (d->misses < 6) d->misses++;
    d->pause = 1 << d->misses; /* 2 .. 64 steps */
}

const char *hearth_speculate_name(int speculate) {
    return speculate == HEARTH_SPEC_LOOKUP   ? "lookup"
           : speculate == HEARTH_SPEC_NONE   ? "none"
           : speculate == HEARTH_SPEC_DRAFT  ? "draft"
           : speculate == HEARTH_SPEC_SUFFIX ? "suffix"
           : speculate == HEARTH_SPEC_MTP    ? "mtp"
                                             : NULL;
}

int hearth_speculate_parse(const char *name) {
    for (int s = HEARTH_SPEC_LOOKUP; s < HEARTH_SPEC_KINDS; s++) /* draft is named by --draft-model */
        if (s != HEARTH_SPEC_DRAFT && name && !strcmp(name, hearth_speculate_name(s))) return s;
    return -1;
}

spec_limits spec_limits_for(int gpu, double bytes_per_weight) {
    if (!gpu) return (spec_limits){.max_decode_rows = SPEC_CPU_DECODE_ROWS, .max_step_tokens = 0};
    double ridge = SPEC_GPU_FLOP_PER_BYTE * bytes_per_weight / 2.0;
    int t = ridge < 2.0 ? 2 : ridge > 65536.0 ? 65536 : (int)ridge;
    return (spec_limits){.max_decode_rows = t - 1, .max_step_tokens = t};
}

int spec_step_room(spec_limits l, int n_dec, int draft_depth) {
    if (n_dec <= 0 || n_dec > l.max_decode_rows) return 0;
    if (l.max_step_tokens <= 0) return INT32_MAX;
    int room = l.max_step_tokens - n_dec;
    if (room <= 0) return 0;
    if (draft_depth > 0 && (long long)n_dec * draft_depth > room) return 0;
    return room;
}
