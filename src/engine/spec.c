/* spec.c: prompt lookup and adaptive draft depth (see spec.h). Knows tokens only. */
#include "engine/spec.h"
#include "hearth.h"
#include <stdint.h>
#include <string.h>

/* The tokens after the latest earlier occurrence of hist's last n-gram (longest first),
 * up to max_k; never the tail itself (i + g < n). */
int spec_lookup(const int32_t *hist, int n, int max_k, int32_t *out) {
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
            if (k > 0) return k;
        }
    }
    return 0;
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
    return speculate == HEARTH_SPEC_LOOKUP  ? "lookup"
           : speculate == HEARTH_SPEC_NONE  ? "none"
           : speculate == HEARTH_SPEC_DRAFT ? "draft"
                                            : NULL;
}

int hearth_speculate_parse(const char *name) {
    for (int s = HEARTH_SPEC_LOOKUP; s <= HEARTH_SPEC_NONE; s++)
        if (name && !strcmp(name, hearth_speculate_name(s))) return s;
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
