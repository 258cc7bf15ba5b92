/* convert_mixed.c: `hearth convert -q --target-bpw B`: mixed precision by measured
 * sensitivity. The quantizable modules form units (every module of one transformer layer,
 * or one module outside the layers: the embeddings, lm_head); each unit is quantized alone
 * at each candidate (a width and a group size, with fitted scales: fit_scales) and scored by
 * the KL divergence it adds at the logits (against the float model, on calibration rows
 * made as `hearth perplexity` makes them); then a knapsack picks the candidates with the
 * least summed KL under the bit budget; the report lists every measurement and choice.
 * Each candidate is measured in memory: one CPU engine holds the float model, the unit's
 * weights are quantized to the bytes the final convert writes and swapped in
 * (hearth_engine_quantize_weights), scored, and swapped back; nothing is written per
 * candidate. Uses hearth.h and the perplexity scorer (ppl.h). */
#define _XOPEN_SOURCE 700
#include "cli/ppl.h"
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_CANDIDATES 8

typedef struct mixed_module {
    char *path;         /* a unit: "model.layers.3" or "model.embed_tokens" */
    double params;      /* its weights' rows x cols, summed */
    double scale_width; /* bits of one group's scale + bias, in the weights' dtype */
    double kl[MAX_CANDIDATES];
    unsigned avail; /* bit j: candidate j's group size divides every module's input width */
    int choice;     /* index into the candidates */
} mixed_module;

typedef struct mixed_plan {
    mixed_module *mods;
    size_t n;
    const mixed_candidate *cand; /* ascending in bits per weight */
    int n_cand;
    const char *only; /* while measuring: the one module quantized */
    int only_cand;
    size_t fixed; /* allocate: this unit (p->n: none) takes candidate fixed_cand */
    int fixed_cand;
} mixed_plan;

/* The length of the unit name that starts module's path: through the layer number for
 * "<prefix>layers.<N>.<rest>" (one transformer layer measures as one unit: 7x fewer
 * conversions and scoring passes than module by module), else the whole path. */
static size_t unit_len(const char *module) {
    for (const char *s = strstr(module, "layers."); s; s = strstr(s + 1, "layers.")) {
        if (s != module && s[-1] != '.') continue;
        const char *d = s + 7, *e = d;
        while (*e >= '0' && *e <= '9') e++;
        if (e > d && *e == '.') return (size_t)(e - module);
    }
    return strlen(module);
}

static int in_unit(const char *module, const char *unit) {
    size_t n = unit_len(module);
    return strlen(unit) == n && !strncmp(module, unit, n);
}

static int choose_measured(void *user, const char *module, int *group) {
    const mixed_plan *p = user;
    if (!in_unit(module, p->only)) return 0;
    *group = p->cand[p->only_cand].group;
    return p->cand[p->only_cand].bits;
}

static int choose_final(void *user, const char *module, int *group) {
    const mixed_plan *p = user;
    for (size_t i = 0; i < p->n; i++)
        if (in_unit(module, p->mods[i].path)) {
            *group = p->cand[p->mods[i].choice].group;
            return p->cand[p->mods[i].choice].bits;
        }
    return 0;
}

/* A unit's stored bits at candidate j: its weights at that width plus one scale and one
 * bias per group (whole numbers: every weight row is whole groups). */
static double unit_bits(const mixed_module *mod, mixed_candidate c) {
    return mod->params * c.bits + mod->params / c.group * mod->scale_width;
}

static int has(const mixed_module *mod, int j) { return (mod->avail >> j) & 1u; }

/* The unit's cheapest candidate it can take (the candidates ascend in cost): the knapsack's
 * base for it. */
static int unit_base(const mixed_module *mod) {
    int j = 0;
    while (!has(mod, j)) j++;
    return j;
}

/* The bits candidate j stores above the unit's base: the knapsack's cost of choosing it. */
static double extra_bits(const mixed_plan *p, const mixed_module *mod, int j) {
    return unit_bits(mod, p->cand[j]) - unit_bits(mod, p->cand[unit_base(mod)]);
}

/* The units of the modules convert quantizes (2-D float ".weight" tensors whose rows are
 * whole groups of some candidate), in the order their first module comes. A candidate is
 * open to a unit when its group size divides the input width of every module in it
 * (SmolLM2's 576 columns take groups of 32 and 64, not 128). */
static int list_modules(hearth_model *m, mixed_plan *p) {
    char *tj = hearth_model_tensors_json(m);
    json_t *arr = tj ? json_loads(tj, 0, NULL) : NULL;
    hearth_free(tj);
    size_t i;
    json_t *t;
    p->mods = calloc(json_array_size(arr) + 1, sizeof *p->mods);
    json_array_foreach(arr, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        json_t *shape = json_object_get(t, "shape");
        size_t len = name ? strlen(name) : 0;
        if (!p->mods || !dt || len < 8 || strcmp(name + len - 7, ".weight") || json_array_size(shape) != 2) continue;
        double rows = (double)json_integer_value(json_array_get(shape, 0));
        json_int_t cols = json_integer_value(json_array_get(shape, 1));
        unsigned fits = 0;
        for (int j = 0; j < p->n_cand; j++) fits |= (unsigned)(cols % p->cand[j].group == 0) << j;
        if (!fits || (strcmp(dt, "F32") && strcmp(dt, "F16") && strcmp(dt, "BF16"))) continue;
        size_t u = 0, ul = unit_len(name) < len - 7 ? unit_len(name) : len - 7;
        while (u < p->n && !(strlen(p->mods[u].path) == ul && !strncmp(p->mods[u].path, name, ul))) u++;
        mixed_module *mod = &p->mods[u];
        if (u == p->n) p->n++, mod->path = strndup(name, ul), mod->avail = ~0u;
        mod->avail &= fits;
        double params = rows * (double)cols, sw = 2.0 * (strcmp(dt, "F32") ? 16 : 32);
        mod->scale_width = (mod->scale_width * mod->params + sw * params) / (mod->params + params);
        mod->params += params;
    }
    json_decref(arr);
    for (size_t i = 0; i < p->n; i++)
        if (!p->mods[i].avail) { /* modules of one layer with no group size in common: none of them */
            fprintf(stderr, "hearth: %s: %s: no candidate's group size divides the input width of all its modules\n",
                    hearth_model_path(m), p->mods[i].path);
            return 1;
        }
    if (!p->n) fprintf(stderr, "hearth: %s: no weights to quantize\n", hearth_model_path(m));
    return p->n == 0;
}

/* Mean KL of the engine's model as it stands against the reference log-probs in ref_path. */
static int mean_kl(hearth_engine *e, const int32_t *tokens, size_t rows, int L, const char *ref_path, double *out) {
    score_run r = {.tokens = tokens, .rows = rows, .L = L, .ref_path = ref_path, .quiet = 1};
    if (!(r.ref = fopen(ref_path, "rb"))) return 1;
    int rc = ppl_score(e, &r);
    fclose(r.ref);
    double se;
    if (!rc) ppl_mean_se(r.kl.kl, r.kl.n, out, &se);
    free(r.loss);
    free(r.kl.kl);
    return rc;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "1 min 05 s", "42 s" */
static const char *duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 60)
        snprintf(buf, n, "%ld min %02ld s", t / 60, t % 60);
    else
        snprintf(buf, n, "%ld s", t);
    return buf;
}

/* Every unit at every candidate, in the one engine e: quantized in place, scored against
 * the reference, restored. A progress line (a line per unit when stderr is not a terminal)
 * with the time so far and an estimate of the time left. */
static int measure_all(hearth_engine *e, mixed_plan *p, hearth_convert_options o, const int32_t *tokens, size_t rows,
                       int L, const char *ref_path) {
    size_t total = 0, done = 0;
    for (size_t i = 0; i < p->n; i++)
        for (int j = 0; j < p->n_cand; j++) total += has(&p->mods[i], j);
    double t0 = seconds_now();
    int tty = isatty(2), rc = 0;
    hearth_error err = {0};
    o.choose_bits = choose_measured, o.choose_user = p, o.quant_recipe = NULL;
    for (size_t i = 0; !rc && i < p->n; i++) {
        for (int j = 0; !rc && j < p->n_cand; j++) {
            if (!has(&p->mods[i], j)) { /* not open to this unit: never chosen */
                p->mods[i].kl[j] = INFINITY;
                continue;
            }
            p->only = p->mods[i].path, p->only_cand = j;
            if (hearth_engine_quantize_weights(e, &o, &err)) rc = cli_fail(&err);
            if (!rc) rc = mean_kl(e, tokens, rows, L, ref_path, &p->mods[i].kl[j]);
            hearth_engine_restore_weights(e);
            done++;
            double spent = seconds_now() - t0, left = spent / (double)done * (double)(total - done);
            char a[32], b[32];
            int last = j;
            while (last + 1 < p->n_cand && !has(&p->mods[i], last + 1)) last++;
            if (!rc && (tty || last == p->n_cand - 1))
                fprintf(stderr, "%s  measured %zu/%zu candidates (%s at %d-bit/%d), %s, about %s left%s",
                        tty ? "\r\033[K" : "", done, total, p->mods[i].path, p->cand[j].bits, p->cand[j].group,
                        duration(spent, a, sizeof a), duration(left, b, sizeof b), tty ? "" : "\n");
        }
    }
    if (tty) fprintf(stderr, "\n");
    return rc;
}

/* The multiple-choice knapsack, solved exactly by dynamic programming over the budget:
 * each module takes one candidate, its cost is the bits above the smallest width, the sum
 * of the measured KLs is minimized. The budget is counted in units of the costs' greatest
 * common divisor (whole rows of whole groups make it large), or, past MAX_STEPS units, on
 * a grid of MAX_STEPS with costs rounded up (never over the budget, possibly a little
 * short of the optimum). Returns the bits per weight of the plan. */
#define MAX_STEPS (1 << 16) /* the choices table is modules x MAX_STEPS bytes */
static unsigned long long gcd_u64(unsigned long long a, unsigned long long b) {
    while (b) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static double allocate(mixed_plan *p, double target_bpw) {
    double params = 0, base = 0;
    for (size_t i = 0; i < p->n; i++) {
        params += p->mods[i].params;
        base += unit_bits(&p->mods[i], p->cand[unit_base(&p->mods[i])]);
    }
    double spare = target_bpw * params - base;
    unsigned long long g = 0;
    for (size_t i = 0; i < p->n; i++)
        for (int j = unit_base(&p->mods[i]) + 1; j < p->n_cand; j++)
            if (has(&p->mods[i], j)) g = gcd_u64(g, (unsigned long long)extra_bits(p, &p->mods[i], j));
    double unit = g ? (double)g : 1.0;
    if (spare / unit > MAX_STEPS) unit = spare / MAX_STEPS;
    size_t steps = spare > 0 ? (size_t)floor(spare / unit) : 0, W = steps + 1;
    double *best = malloc(2 * W * sizeof *best); /* the previous module's row and this one's */
    unsigned char *pick = malloc(p->n * W);
    if (!best || !pick || spare < 0) { /* no room above the smallest width: keep it */
        free(best);
        free(pick);
        for (size_t i = 0; i < p->n; i++) p->mods[i].choice = unit_base(&p->mods[i]);
        return p->fixed < p->n && p->fixed_cand != unit_base(&p->mods[p->fixed]) ? -1 : base / params;
    }
    for (size_t w = 0; w < W; w++) best[w] = 0;
    for (size_t i = 0; i < p->n; i++) {
        const mixed_module *mod = &p->mods[i];
        for (size_t w = 0; w < W; w++) {
            double b = INFINITY;
            for (int j = 0; j < p->n_cand; j++) {
                if ((i == p->fixed && j != p->fixed_cand) || !has(mod, j)) continue;
                double extra = extra_bits(p, mod, j);
                double c = ceil(extra / unit - 1e-9); /* whole units */
                if (c > (double)w) continue;
                double v = best[(i & 1) * W + w - (size_t)c] + mod->kl[j];
                if (v < b) b = v, pick[i * W + w] = (unsigned char)j;
            }
            best[((i + 1) & 1) * W + w] = b;
        }
    }
    if (isinf(best[(p->n & 1) * W + steps])) { /* the fixed unit's candidate alone is over the budget */
        free(best);
        free(pick);
        return -1;
    }
    double used = base;
    for (size_t i = p->n, w = steps; i-- > 0;) { /* walk the choices back */
        int j = pick[i * W + w];
        double extra = extra_bits(p, &p->mods[i], j);
        p->mods[i].choice = j;
        used += extra;
        w -= (size_t)ceil(extra / unit - 1e-9);
    }
    free(best);
    free(pick);
    return used / params;
}

/* The knapsack adds the KLs of units measured alone. Where one unit is most of the weights
 * (a tied embedding: 63% of Gemma 3 270M's), its candidate moves the budget of every other
 * unit at once and that sum can rank whole plans wrongly (Gemma 3: the embedding at 3 bits
 * and every layer at 5 summed least, but measured whole added more KL than uniform 4-bit
 * with fitted scales). So the plan is solved once per candidate of the largest unit (that
 * unit fixed to it), each plan within the budget is measured whole in the engine, and the
 * least measured KL wins; the lines of *whole report each. */
static int choose_plan(hearth_engine *e, mixed_plan *p, hearth_convert_options o, double target_bpw,
                       const int32_t *tokens, size_t rows, int L, const char *ref_path, double *bpw, char *whole,
                       size_t cap) {
    size_t big = 0, at = 0;
    for (size_t i = 1; i < p->n; i++)
        if (p->mods[i].params > p->mods[big].params) big = i;
    int *best = malloc(p->n * sizeof *best), rc = !best, found = 0;
    double best_kl = INFINITY;
    hearth_error err = {0};
    o.choose_bits = choose_final, o.choose_user = p, o.quant_recipe = NULL;
    for (int c = 0; !rc && c < p->n_cand; c++) {
        if (!has(&p->mods[big], c)) continue;
        p->fixed = big, p->fixed_cand = c;
        double b = allocate(p, target_bpw), kl = 0;
        if (b < 0) continue; /* over the budget with the largest unit there */
        if (hearth_engine_quantize_weights(e, &o, &err)) rc = cli_fail(&err);
        if (!rc) rc = mean_kl(e, tokens, rows, L, ref_path, &kl);
        hearth_engine_restore_weights(e);
        if (rc) break;
        at += (size_t)snprintf(whole + at, at < cap ? cap - at : 0,
                               "plan with %s at %d-bit/%d: %.4f bits per weight, mean KL measured whole %.6f\n",
                               p->mods[big].path, p->cand[c].bits, p->cand[c].group, b, kl);
        if (at >= cap) at = cap - 1;
        if (kl < best_kl) {
            best_kl = kl, *bpw = b, found = 1;
            for (size_t i = 0; i < p->n; i++) best[i] = p->mods[i].choice;
        }
    }
    for (size_t i = 0; found && i < p->n; i++) p->mods[i].choice = best[i];
    if (!rc && !found) { /* cannot happen: the cheapest candidate fits (checked before measuring) */
        fprintf(stderr, "hearth: --target-bpw %.3g: no plan fits\n", target_bpw);
        rc = 1;
    }
    p->fixed = p->n;
    free(best);
    return rc;
}

int cli_convert_mixed(const char *model, hearth_convert_options o, double target_bpw, const mixed_candidate *cand,
                      int n_cand, const char *calib_path, int n_calib, int calib_len) {
    hearth_model *m = NULL;
    mixed_plan p = {.cand = cand, .n_cand = n_cand};
    dataset d = {0};
    int32_t *tokens = NULL;
    size_t rows = 0;
    char *buf = cli_read_file(calib_path);
    char tmp[] = "/tmp/hearth-mixed-XXXXXX", ref_path[64];
    int rc = !buf || cli_open_model(model, &m) || list_modules(m, &p) || ppl_dataset_load(calib_path, buf, &d) ||
             ppl_load_tokens(m, &d, 123, n_calib, calib_len, &tokens, &rows);
    if (!rc && target_bpw * p.mods[0].params < unit_bits(&p.mods[0], cand[unit_base(&p.mods[0])])) {
        fprintf(stderr, "hearth: --target-bpw %.3g is below the cheapest candidate (%d bits + scales)\n", target_bpw,
                cand[0].bits);
        rc = 1;
    }
    for (size_t i = 0; !rc && i < p.n; i++) /* the knapsack counts costs above the first candidate's */
        for (int j = 1; !rc && j < n_cand; j++)
            if (unit_bits(&p.mods[i], cand[j]) < unit_bits(&p.mods[i], cand[j - 1])) {
                fprintf(stderr, "hearth: --candidate-bits: %d:%d costs %s than %d:%d with %s's scales\n", cand[j].bits,
                        cand[j].group, "less", cand[j - 1].bits, cand[j - 1].group, p.mods[i].path);
                rc = 1;
            }
    o.fit_scales = 1; /* error-minimising scales: bench/results/convert_mixed.md measures what they win */
    if (!rc && !mkdtemp(tmp)) rc = 1, perror(tmp);
    snprintf(ref_path, sizeof ref_path, "%s/reference.logprobs", tmp);
    /* one engine on the float model for the reference and every candidate: the CPU backend,
     * whose weights can be swapped in place */
    hearth_engine_options eo = {.device = HEARTH_DEVICE_CPU};
    hearth_engine *e = NULL;
    if (!rc && n_cand > 1) rc = ppl_engine_open(m, eo, calib_len, &e);
    if (!rc && n_cand > 1) { /* the float model's log-probs: the reference every candidate is scored against */
        score_run ref = {.tokens = tokens, .rows = rows, .L = calib_len, .save_path = ref_path, .quiet = 1};
        rc = !(ref.save = fopen(ref_path, "wb")) || ppl_score(e, &ref);
        if (ref.save) fclose(ref.save);
        free(ref.loss);
    }
    /* one candidate: nothing to choose, nothing to measure */
    if (!rc && n_cand > 1) rc = measure_all(e, &p, o, tokens, rows, calib_len, ref_path);
    char whole[2048] = "";
    double bpw = 0;
    p.fixed = p.n;
    if (!rc && n_cand == 1) bpw = allocate(&p, target_bpw);
    if (!rc && n_cand > 1)
        rc = choose_plan(e, &p, o, target_bpw, tokens, rows, calib_len, ref_path, &bpw, whole, sizeof whole);
    hearth_engine_free(e);
    hearth_error err = {0};
    if (!rc) {
        o.choose_bits = choose_final, o.choose_user = &p;
        if (hearth_convert(model, &o, &err)) rc = cli_fail(&err);
    }
    if (!rc) {
        printf("%-48s %10s", "unit", "params");
        for (int j = 0; j < n_cand; j++) printf("  KL@%d-bit/%-3d", cand[j].bits, cand[j].group);
        printf("  bits/group\n");
        double predicted = 0;
        for (size_t i = 0; i < p.n; i++) {
            printf("%-48s %10.0f", p.mods[i].path, p.mods[i].params);
            for (int j = 0; j < n_cand; j++)
                if (has(&p.mods[i], j)) printf(" %13.6f", p.mods[i].kl[j]);
                else printf(" %13s", "-"); /* its group size does not divide a module's width */
            printf("  %d/%d\n", cand[p.mods[i].choice].bits, cand[p.mods[i].choice].group);
            predicted += p.mods[i].kl[p.mods[i].choice];
        }
        printf("bits per weight (quantized modules, scales and biases included): %.4f of %.4f\n", bpw, target_bpw);
        printf("sum of the chosen units' KL (each measured alone): %.6f\n%s%s\n", predicted, whole, o.out_dir);
    }
    unlink(ref_path);
    rmdir(tmp);
    for (size_t i = 0; i < p.n; i++) free(p.mods[i].path);
    free(p.mods);
    free(tokens);
    free(d.lines);
    free(buf);
    hearth_model_close(m);
    return rc;
}
