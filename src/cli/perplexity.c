/* perplexity.c: `hearth perplexity`: mlx_lm.perplexity's method (numpy's seeded shuffle of
 * the dataset rows, concatenate, non-overlapping rows of --sequence-length, the mean token
 * cross-entropy, perplexity with its standard error) and, with --kl-divergence,
 * llama-perplexity's statistics against a reference model's log-probabilities saved to a
 * file. A consumer of hearth.h only; each run is recorded in the evals database. */
#include "cli/ppl.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *ppl_usage =
    "hearth perplexity <model> --data-path <file.jsonl|file.txt> [--sequence-length 512] [--num-samples 256]\n"
    "       [--batch-size 8] [--seed 123] [--save-logits FILE] [--kl-divergence (--reference MODEL |\n"
    "       --reference-logits FILE)] [--second-half] [--json] [--threads N] [--device cpu|cuda|auto]";

/* ---- numpy's legacy generator: np.random.seed(s); np.random.permutation(n) ---------- */

typedef struct mt19937 {
    uint32_t key[624];
    int pos;
} mt19937;

static void mt_seed(mt19937 *s, uint32_t seed) { /* numpy mt19937_seed (init_genrand) */
    for (int i = 0; i < 624; i++) {
        s->key[i] = seed;
        seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)i + 1;
    }
    s->pos = 624;
}

static uint32_t mt_next(mt19937 *s) {
    if (s->pos == 624) {
        for (int i = 0; i < 624; i++) {
            uint32_t y = (s->key[i] & 0x80000000u) | (s->key[(i + 1) % 624] & 0x7fffffffu);
            s->key[i] = s->key[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        s->pos = 0;
    }
    uint32_t y = s->key[s->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* RandomState.permutation(n): arange(n), then the legacy shuffle (Fisher-Yates from the
 * end, each j drawn by random_interval: the smallest all-ones mask >= i, rejection). */
static void numpy_permutation(uint32_t seed, size_t n, size_t *perm) {
    mt19937 s;
    mt_seed(&s, seed);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n; i-- > 1;) {
        uint32_t mask = (uint32_t)i, j;
        for (int sh = 1; sh <= 16; sh <<= 1) mask |= mask >> sh;
        while ((j = mt_next(&s) & mask) > i) {
        }
        size_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- the dataset: mlx_lm.tuner.datasets' three jsonl shapes, or one text row a line ---- */

int ppl_dataset_load(const char *path, char *buf, dataset *d) {
    size_t len = strlen(path);
    d->path = path;
    d->jsonl = len >= 6 && !strcmp(path + len - 6, ".jsonl");
    if (!d->jsonl && !(len >= 4 && !strcmp(path + len - 4, ".txt"))) {
        fprintf(stderr, "hearth: %s: expected a .jsonl or .txt file\n", path);
        return 1;
    }
    size_t cap = 0;
    for (char *p = buf; *p;) {
        char *nl = strchr(p, '\n');
        char *end = nl ? nl : p + strlen(p);
        if (end > p && end[-1] == '\r') end[-1] = 0; /* Python's splitlines takes \r\n whole */
        *end = 0;
        int blank = strspn(p, " \t\r") == strlen(p);
        if (!(d->jsonl && blank)) { /* a .txt row may be empty; a blank jsonl line is no row */
            if (d->n == cap) {
                char **nb = realloc(d->lines, (cap = cap ? 2 * cap : 1024) * sizeof *nb);
                if (!nb) {
                    fprintf(stderr, "hearth: %s: out of memory\n", path);
                    return 1;
                }
                d->lines = nb;
            }
            d->lines[d->n++] = p;
        }
        if (!nl) break;
        p = nl + 1;
    }
    if (!d->n) {
        fprintf(stderr, "hearth: %s: no rows\n", path);
        return 1;
    }
    if (!d->jsonl) {
        d->kind = ROWS_TEXT;
        return 0;
    }
    json_error_t je;
    json_t *first = json_loads(d->lines[0], 0, &je);
    int rc = 0;
    if (!json_is_object(first)) {
        fprintf(stderr, "hearth: %s: line 1: not a JSON object (%s)\n", path, je.text);
        rc = 1;
    } else if (json_object_get(first, "prompt") && json_object_get(first, "completion"))
        d->kind = ROWS_COMPLETION;
    else if (json_object_get(first, "messages"))
        d->kind = ROWS_CHAT;
    else if (json_object_get(first, "text"))
        d->kind = ROWS_TEXT;
    else {
        fprintf(stderr, "hearth: %s: rows need \"text\", \"messages\" or \"prompt\" and \"completion\"\n", path);
        rc = 1;
    }
    json_decref(first);
    return rc;
}

/* The tokens of row r, as the dataset's process() makes them: text gets the tokenizer's
 * special tokens and an EOS unless it already ends with one; chat rows are the rendered
 * template (no generation prompt) tokenized without special tokens. */
static int dataset_row_tokens(const hearth_model *m, const dataset *d, size_t r, int32_t eos, int32_t **ids,
                              size_t *n) {
    hearth_error err = {0};
    json_t *row = NULL;
    const char *text = d->lines[r];
    char *rendered = NULL;
    if (d->jsonl) {
        json_error_t je;
        row = json_loads(d->lines[r], 0, &je);
        const char *want = d->kind == ROWS_TEXT ? "text" : d->kind == ROWS_CHAT ? "messages" : "prompt";
        if (!json_is_object(row) || !json_object_get(row, want)) {
            fprintf(stderr, "hearth: %s: row %zu: not a JSON object with \"%s\"\n", d->path, r + 1, want);
            json_decref(row);
            return 1;
        }
        if (d->kind == ROWS_TEXT) {
            text = json_string_value(json_object_get(row, "text"));
            if (!text) {
                fprintf(stderr, "hearth: %s: row %zu: \"text\" is not a string\n", d->path, r + 1);
                json_decref(row);
                return 1;
            }
        } else {
            json_t *msgs = d->kind == ROWS_CHAT ? json_incref(json_object_get(row, "messages"))
                                                : json_pack("[{s:s, s:O}, {s:s, s:O}]", "role", "user", "content",
                                                            json_object_get(row, "prompt"), "role", "assistant",
                                                            "content", json_object_get(row, "completion"));
            json_t *tools = json_object_get(row, "tools");
            char *mj = msgs ? json_dumps(msgs, 0) : NULL, *tj = json_is_array(tools) ? json_dumps(tools, 0) : NULL;
            json_decref(msgs);
            hearth_status st =
                mj ? hearth_chat_render(m, mj, tj, 0, NULL, &rendered, &err) : (err.status = HEARTH_ERR_FORMAT);
            free(mj);
            free(tj);
            if (st) {
                fprintf(stderr, "hearth: %s: row %zu: %s\n", d->path, r + 1,
                        err.message[0] ? err.message : "\"completion\" is missing");
                json_decref(row);
                return 1;
            }
            text = rendered;
        }
    }
    hearth_status st = hearth_tokenize(m, text, strlen(text), d->kind == ROWS_TEXT, ids, n, &err);
    hearth_free(rendered);
    json_decref(row);
    if (st) return cli_fail(&err);
    if (d->kind == ROWS_TEXT && (*n == 0 || (*ids)[*n - 1] != eos)) {
        int32_t *grown = realloc(*ids, (*n + 1) * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "hearth: out of memory\n");
            return 1;
        }
        (*ids = grown)[(*n)++] = eos;
    }
    return 0;
}

/* load_data: rows in the seeded order, concatenated until num_samples x L tokens (or all of
 * them), cut to whole rows of L. *out: rows x L tokens. */
int ppl_load_tokens(const hearth_model *m, const dataset *d, int seed, int num_samples, int L, int32_t **out,
                    size_t *rows) {
    /* the tokenizer's eos_token: tokenizer_config.json's, or the GGUF vocabulary's */
    char *info = hearth_model_info_json(m);
    json_t *ij = info ? json_loads(info, 0, NULL) : NULL;
    const char *eos_s = json_string_value(json_object_get(json_object_get(ij, "tokenizer"), "eos_token"));
    int32_t eos = eos_s ? hearth_token_id(m, eos_s) : -1;
    json_decref(ij);
    hearth_free(info);
    if (d->kind == ROWS_TEXT && eos < 0) {
        fprintf(stderr, "hearth: %s: the tokenizer has no eos_token to end each text row with\n", hearth_model_path(m));
        return 1;
    }
    size_t *perm = malloc(d->n * sizeof *perm), want = num_samples > 0 ? (size_t)num_samples * L : SIZE_MAX;
    size_t have = 0, cap = 0;
    int32_t *all = NULL;
    int rc = perm ? 0 : 1;
    if (perm) numpy_permutation((uint32_t)seed, d->n, perm);
    for (size_t i = 0; !rc && have < want && i < d->n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if ((rc = dataset_row_tokens(m, d, perm[i], eos, &ids, &n))) break;
        if (have + n > cap) {
            cap = 2 * (have + n);
            int32_t *nb = realloc(all, cap * sizeof *nb);
            if (!nb) {
                rc = 1;
                hearth_free(ids);
                break;
            }
            all = nb;
        }
        memcpy(all + have, ids, n * sizeof *ids);
        have += n;
        hearth_free(ids);
    }
    free(perm);
    *rows = have / (size_t)L;
    if (num_samples > 0 && *rows > (size_t)num_samples) *rows = (size_t)num_samples;
    if (!rc && *rows == 0) {
        fprintf(stderr, "hearth: %s: %zu tokens, fewer than one row of --sequence-length %d\n", d->path, have, L);
        rc = 1;
    }
    if (rc)
        free(all);
    else
        *out = all;
    return rc;
}

/* ---- scoring -------------------------------------------------------------------------- */

/* The reference log-probabilities file: a header naming the tokens it was computed on and
 * the first scored position of each row, then float32 log-softmax rows, one per scored
 * position (rows x (L-1-first) x vocab). */
static const char LOGITS_MAGIC[8] = {'H', 'R', 'T', 'H', 'L', 'P', '0', '2'};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Writes or checks the file header: vocab, rows, L and the tokens themselves, so saved
 * log-probs are never compared with other data. */
static int logits_header(score_run *r, int vocab, const char *path, FILE *f, int writing) {
    int32_t h[4] = {vocab, (int32_t)r->rows, r->L, r->first};
    size_t nt = r->rows * (size_t)r->L;
    if (writing)
        return fwrite(LOGITS_MAGIC, 8, 1, f) != 1 || fwrite(h, sizeof h, 1, f) != 1 ||
               fwrite(r->tokens, sizeof(int32_t), nt, f) != nt;
    char magic[8];
    int32_t got[4];
    if (fread(magic, 8, 1, f) != 1 || memcmp(magic, LOGITS_MAGIC, 8) || fread(got, sizeof got, 1, f) != 1) {
        fprintf(stderr, "hearth: %s: not a hearth log-probabilities file (--save-logits writes one)\n", path);
        return 1;
    }
    if (got[0] != vocab) {
        fprintf(stderr, "hearth: %s: saved for a vocabulary of %d rows, this model has %d\n", path, got[0], vocab);
        return 1;
    }
    int32_t *saved = malloc(nt * sizeof *saved);
    int same = saved && got[1] == h[1] && got[2] == h[2] && got[3] == h[3] &&
               fread(saved, sizeof *saved, nt, f) == nt && !memcmp(saved, r->tokens, nt * sizeof *saved);
    free(saved);
    if (!same)
        fprintf(stderr,
                "hearth: %s: saved for other tokens (%d rows of %d, scored from position %d); use the same "
                "--data-path, --seed, --num-samples, --sequence-length, --second-half and tokenizer\n",
                path, got[1], got[2], got[3]);
    return !same;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The row scorers: GCC vector extensions, 8 floats a vector, so each step of these loops
 * is a handful of vector instructions (AVX2 where the CPU has it, a pair of SSE2 ones where
 * not: target_clones picks at load time); they read every logit once or twice, where a
 * plain loop with libm's expf and a running argmax, on one thread, took about 15% of
 * `hearth perplexity`'s time (bench/results/perplexity.md has the rates before and after). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));
#define SCORER __attribute__((target_clones("avx2", "default")))
#define VINLINE static inline __attribute__((always_inline))

/* 8 floats from any address */
#define V8F_LOAD(dst, src) memcpy(&(dst), (src), sizeof(v8f))

/* mask ? a : b, lane by lane (C has no ?: on vectors) */
#define V8F_SELECT(mask, a, b) ((v8f)(((v8i)(a) & (mask)) | ((v8i)(b) & ~(mask))))

/* e^x for x <= 0 (below -87 it gives e^-87, about 1.6e-38: what such a term adds to a sum
 * of values >= 1 is far below float's resolution): 2^(x log2 e) split as 2^n 2^f with n the
 * nearest integer (the 1.5 * 2^23 rounding trick) and |f| <= 1/2, 2^f by its degree-6
 * Taylor polynomial (error below 2e-7 relative), 2^n put into the exponent bits. */
VINLINE void v8f_exp_nonpositive(v8f *inout) {
    const v8f lo = (v8f){0} - 87.0f, magic = (v8f){0} + 12582912.0f;
    v8f x = V8F_SELECT(*inout < lo, lo, *inout);
    v8f t = x * 1.44269504f, n = (t + magic) - magic, f = (t - n) * 0.693147181f;
    v8f p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720))))));
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    *inout = p * (v8f)bits;
}

VINLINE float exp_nonpositive(float x) {
    v8f v = (v8f){0} + x;
    v8f_exp_nonpositive(&v);
    return v[0];
}

/* The largest of x[0..n) and (in *at) the first index holding it. */
SCORER static float row_max(const float *x, int n, int *at) {
    v8f lane = (v8f){0} - INFINITY;
    int v = 0;
    for (; v + 8 <= n; v += 8) {
        v8f y;
        V8F_LOAD(y, x + v);
        lane = V8F_SELECT(y > lane, y, lane);
    }
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++) mx = lane[l] > mx ? lane[l] : mx;
    for (; v < n; v++) mx = x[v] > mx ? x[v] : mx;
    int i = 0;
    while (i < n - 1 && x[i] != mx) i++; /* the first occurrence: what a running argmax keeps */
    *at = i;
    return mx;
}

/* sum over v of exp(x[v] - mx), mx >= every x[v]: each block's lanes in float (every term
 * is at most 1, so a block of 256 terms keeps ~7 digits), the blocks in double: the loss's
 * error stays near 1e-7 relative, far inside the 1e-4 the oracle test allows. */
SCORER static double sum_exp(const float *x, int n, float mx) {
    double total = 0;
    int v = 0;
    while (v + 8 <= n) {
        v8f lane = {0};
        for (int b = 0; b < 32 && v + 8 <= n; b++, v += 8) {
            v8f d;
            V8F_LOAD(d, x + v);
            d -= mx;
            v8f_exp_nonpositive(&d);
            lane += d;
        }
        for (int l = 0; l < 8; l++) total += lane[l];
    }
    for (; v < n; v++) total += exp_nonpositive(x[v] - mx);
    return total;
}

/* KL(reference || model) at one position: sum over v of p_ref(v) (log p_ref(v) - log p(v)),
 * log p(v) = x[v] - lse. p_ref by the float exp above (as exact as the float32 log-probs it
 * comes from), each term and the lanes' sums in double: the terms cancel to a small KL, so
 * their sum keeps full width (the statistics match numpy's on the saved files to 1e-6). */
SCORER static double kl_row(const float *ref, const float *x, double lse, int n) {
    v8d lane = {0};
    int v = 0;
    for (; v + 8 <= n; v += 8) {
        v8f r, y;
        V8F_LOAD(r, ref + v);
        V8F_LOAD(y, x + v);
        v8d rd = __builtin_convertvector(r, v8d), xd = __builtin_convertvector(y, v8d);
        v8f_exp_nonpositive(&r);
        lane += __builtin_convertvector(r, v8d) * (rd - (xd - lse));
    }
    double kl = 0;
    for (int l = 0; l < 8; l++) kl += lane[l];
    for (; v < n; v++) kl += (double)exp_nonpositive(ref[v]) * ((double)ref[v] - ((double)x[v] - lse));
    return kl;
}

/* Logits rows per append: a whole prefill step's (the engine's max_logits_rows), at most
 * 256 MiB of logits for the largest vocabularies. */
static int ppl_chunk(int32_t vocab, int L) {
    long long cap = (256ll << 20) / ((long long)(vocab > 0 ? vocab : 1) * (long long)sizeof(float));
    int rows = L - 1 < 256 ? L - 1 : 256;
    if (rows > cap) rows = (int)cap;
    return rows < 8 ? 8 : rows;
}

/* The scored positions [begin, end) of one append's logits, on one thread: each one's loss,
 * its log-sum-exp (for --save-logits, written afterwards in order), and against the
 * reference rows its KL and whether the top tokens agree. */
typedef struct score_slice {
    const score_run *r;
    const float *logits, *ref;        /* the append's rows; the reference's rows for the same positions */
    const int32_t *tok;               /* the row's tokens from the append's first */
    double *lse;                      /* per position of the append */
    size_t begin, end, at, ref_first; /* at: the index of position begin in r->loss; ref_first: ref's first position */
    int vocab;
    size_t same_top;
} score_slice;

static void *score_positions(void *arg) {
    score_slice *s = arg;
    const score_run *r = s->r;
    for (size_t j = s->begin; j < s->end; j++) {
        const float *x = s->logits + j * (size_t)s->vocab;
        size_t at = s->at + j - s->begin;
        int top, ref_top;
        double mx = row_max(x, s->vocab, &top), lse = mx + log(sum_exp(x, s->vocab, (float)mx));
        s->lse[j] = lse;
        r->loss[at] = lse - (double)x[s->tok[j + 1]];
        if (s->ref) {
            const float *ref = s->ref + (j - s->ref_first) * (size_t)s->vocab;
            r->kl.kl[at] = kl_row(ref, x, lse, s->vocab);
            row_max(ref, s->vocab, &ref_top);
            s->same_top += ref_top == top;
        }
    }
    return NULL;
}

/* Scores positions [begin, k) of one append over up to `threads` threads (the engine's own
 * count: its workers are idle while the caller scores). */
#define SCORE_MAX_THREADS 16
static void score_append(score_slice base, size_t k, int threads) {
    score_slice sl[SCORE_MAX_THREADS];
    pthread_t th[SCORE_MAX_THREADS];
    size_t n = k - base.begin;
    if (threads > SCORE_MAX_THREADS) threads = SCORE_MAX_THREADS;
    if ((size_t)threads > n) threads = n ? (int)n : 1;
    int started = 0;
    for (int t = 0; t < threads; t++) {
        sl[t] = base;
        sl[t].begin = base.begin + n * (size_t)t / (size_t)threads;
        sl[t].end = base.begin + n * (size_t)(t + 1) / (size_t)threads;
        sl[t].at = base.at + sl[t].begin - base.begin;
        sl[t].same_top = 0;
        if (t && !pthread_create(&th[t], NULL, score_positions, &sl[t])) started |= 1 << t;
    }
    score_positions(&sl[0]);
    for (int t = 1; t < threads; t++) {
        if (started & (1 << t))
            pthread_join(th[t], NULL);
        else
            score_positions(&sl[t]); /* no thread to be had: score it here */
        sl[0].same_top += sl[t].same_top;
    }
    ((score_run *)base.r)->kl.same_top += sl[0].same_top;
}

/* One model over every row: each row is a fresh sequence given its first L-1 tokens, and
 * position t >= first is scored on token t+1 (mlx-lm's batch[:, :-1] against batch[:, 1:];
 * llama-perplexity's from first = L/2 on), in appends of CHUNK tokens that return every
 * position's logits. */
static int score_model(hearth_engine *e, score_run *r) {
    int vocab = hearth_model_vocab_rows(e), L = r->L, rc = 0;
    const size_t CHUNK = (size_t)ppl_chunk(vocab, L);
    size_t per_row = (size_t)L - 1, first = (size_t)r->first, scored = per_row - first, n = r->rows * scored;
    float *logits = malloc((size_t)CHUNK * vocab * sizeof *logits);
    float *lpf = malloc((size_t)vocab * sizeof *lpf),
          *ref = r->ref ? malloc((size_t)CHUNK * vocab * sizeof *ref) : NULL;
    double *lse = malloc(CHUNK * sizeof *lse);
    r->loss = malloc(n * sizeof *r->loss);
    if (r->ref) r->kl.kl = malloc(n * sizeof *r->kl.kl);
    if (!logits || !lpf || !lse || !r->loss || (r->ref && (!r->kl.kl || !ref))) {
        fprintf(stderr, "hearth: out of memory for %zu scored tokens\n", n);
        rc = 1;
    }
    if (!rc && r->save) rc = logits_header(r, vocab, r->save_path, r->save, 1);
    if (!rc && r->ref) rc = logits_header(r, vocab, r->ref_path, r->ref, 0);
    hearth_error err = {0};
    double t0 = now_seconds();
    for (size_t row = 0; !rc && row < r->rows; row++) {
        const int32_t *tok = r->tokens + row * (size_t)L;
        int seq;
        if (hearth_seq_open(e, &seq, &err)) {
            rc = cli_fail(&err);
            break;
        }
        for (size_t done = 0; !rc && done < per_row; done += CHUNK) {
            size_t k = per_row - done < CHUNK ? per_row - done : CHUNK, j0 = done < first ? first - done : 0;
            if (hearth_seq_append(e, seq, tok + done, k, k, logits, &err)) {
                rc = cli_fail(&err);
                break;
            }
            if (j0 >= k) continue;
            if (r->ref && fread(ref, sizeof *ref * (size_t)vocab, k - j0, r->ref) != k - j0) {
                fprintf(stderr, "hearth: %s: truncated\n", r->ref_path);
                rc = 1;
                break;
            }
            score_slice base = {.r = r,
                                .logits = logits,
                                .ref = r->ref ? ref : NULL,
                                .tok = tok + done,
                                .lse = lse,
                                .begin = j0,
                                .at = row * scored + done + j0 - first,
                                .ref_first = j0,
                                .vocab = vocab};
            score_append(base, k, hearth_engine_threads(e));
            for (size_t j = j0; r->save && !rc && j < k; j++) { /* the full log-probabilities only when kept */
                const float *x = logits + j * (size_t)vocab;
                for (int v = 0; v < vocab; v++) lpf[v] = (float)((double)x[v] - lse[j]);
                if (fwrite(lpf, sizeof *lpf, (size_t)vocab, r->save) != (size_t)vocab) {
                    fprintf(stderr, "hearth: cannot write the log-probabilities: %s\n", strerror(errno));
                    rc = 1;
                }
            }
        }
        hearth_seq_close(e, seq);
        if (!rc && !r->quiet && isatty(2)) fprintf(stderr, "  scored %zu/%zu rows\r", row + 1, r->rows);
    }
    if (!r->quiet && isatty(2)) fprintf(stderr, "\n");
    r->seconds = now_seconds() - t0;
    r->kl.n = n;
    free(logits);
    free(lpf);
    free(ref);
    free(lse);
    return rc;
}

/* mean and its standard error (the sample standard deviation, ddof=1, over sqrt(n)) */
void ppl_mean_se(const double *x, size_t n, double *mean, double *se) {
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    *mean = s / (double)n;
    for (size_t i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *se = n > 1 ? sqrt(ss / (double)(n - 1)) / sqrt((double)n) : 0;
}

/* numpy.percentile's default (linear between the closest ranks), as llama-perplexity's */
static double percentile(const double *sorted, size_t n, double q) {
    double p = q * (double)(n - 1);
    size_t i = (size_t)p;
    return i + 1 < n ? sorted[i] + (p - (double)i) * (sorted[i + 1] - sorted[i]) : sorted[n - 1];
}

static json_t *kl_report(kl_stats *k) {
    double mean, se;
    ppl_mean_se(k->kl, k->n, &mean, &se);
    qsort(k->kl, k->n, sizeof *k->kl, cmp_double);
    double top = (double)k->same_top / (double)k->n;
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "mean", mean, "standard_error", se, "median",
                     percentile(k->kl, k->n, 0.5), "p99", percentile(k->kl, k->n, 0.99), "max", k->kl[k->n - 1],
                     "top1_agreement", top, "top1_standard_error",
                     k->n > 1 ? sqrt(top * (1 - top) / (double)(k->n - 1)) : 0.0);
}

/* Opens `name`, builds an engine for rows of L tokens and scores it. */
int ppl_engine_open(hearth_model *m, hearth_engine_options eo, int L, hearth_engine **e) {
    hearth_error err = {0};
    if (!eo.context_length) eo.context_length = L;
    /* the vocabulary rows are known once the engine exists: the tokenizer's size is a
     * lower bound of them, and an embedding table larger than it is rare and small */
    eo.max_logits_rows = ppl_chunk(hearth_vocab_size(m), L);
    return hearth_engine_create(m, &eo, e, &err) ? cli_fail(&err) : 0;
}

int ppl_score(hearth_engine *e, score_run *r) { return score_model(e, r); }

int ppl_run_model(const char *name, hearth_engine_options eo, score_run *r) {
    hearth_model *m;
    if (cli_open_model(name, &m)) return 1;
    hearth_engine *e = NULL;
    int rc = ppl_engine_open(m, eo, r->L, &e) || score_model(e, r);
    hearth_engine_free(e);
    hearth_model_close(m);
    return rc;
}

typedef struct ppl_args {
    const char *model, *data, *save, *reference, *ref_logits;
    int L, num_samples, batch_size, seed, kl, as_json, second_half;
    hearth_engine_options eo;
} ppl_args;

static int parse_args(int argc, char **argv, ppl_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(f)) {
            printf("usage: %s\n", ppl_usage);
            return -1;
        }
        if (cli_parse_engine_flag(argc, argv, &i, &a->eo)) continue;
        if (!strcmp(f, "--kl-divergence")) {
            a->kl = 1;
            continue;
        }
        if (!strcmp(f, "--json")) {
            a->as_json = 1;
            continue;
        }
        if (!strcmp(f, "--second-half")) {
            a->second_half = 1;
            continue;
        }
        const char **str = !strcmp(f, "--data-path")          ? &a->data
                           : !strcmp(f, "--save-logits")      ? &a->save
                           : !strcmp(f, "--reference")        ? &a->reference
                           : !strcmp(f, "--reference-logits") ? &a->ref_logits
                                                              : NULL;
        int *num = !strcmp(f, "--sequence-length") ? &a->L
                   : !strcmp(f, "--num-samples")   ? &a->num_samples
                   : !strcmp(f, "--batch-size")    ? &a->batch_size
                   : !strcmp(f, "--seed")          ? &a->seed
                                                   : NULL;
        if ((str || num) && !v) return cli_usage_error(ppl_usage, "flag '%s' needs a value", f);
        if (str)
            *str = argv[++i];
        else if (num) {
            char *end;
            long x = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || x < -1 || x > 1 << 30)
                return cli_usage_error(ppl_usage, "%s: needs a whole number (-1 or more)", f);
            *num = (int)x;
        } else if (f[0] == '-')
            return cli_usage_error(ppl_usage, "%s: unknown flag, or a flag without its value", f);
        else if (!a->model)
            a->model = f;
        else
            return cli_usage_error(ppl_usage, "unexpected argument '%s'", f);
    }
    if (!a->model || !a->data) return cli_usage_error(ppl_usage, "%s", "need a model and --data-path");
    if (a->L < 2) return cli_usage_error(ppl_usage, "%s", "--sequence-length must be at least 2");
    if (a->batch_size < 1 || a->seed < 0)
        return cli_usage_error(ppl_usage, "%s", "--batch-size and --seed must be >= 1 and >= 0");
    if (a->kl && !a->reference && !a->ref_logits)
        return cli_usage_error(ppl_usage, "%s", "--kl-divergence needs --reference or --reference-logits");
    if (!a->kl && (a->reference || a->ref_logits))
        return cli_usage_error(ppl_usage, "%s", "--reference and --reference-logits go with --kl-divergence");
    return 0;
}

static void record(const ppl_args *a, const char *model_path, double tok_s, json_t *report) {
    json_t *details = json_deep_copy(report);
    json_object_set_new(details, "data_path", json_string(a->data));
    json_object_set_new(details, "seed", json_integer(a->seed));
    json_object_set_new(details, "num_samples", json_integer(a->num_samples));
    char *dj = json_dumps(details, JSON_COMPACT);
    hearth_eval_row row = {.kind = "perplexity",
                           .model = model_path,
                           .context = a->L,
                           .predicted_peak_bytes = -1,
                           .measured_peak_bytes = -1,
                           .tok_s = tok_s,
                           .details_json = dj};
    hearth_error err = {0};
    if (hearth_evals_record(&row, &err)) fprintf(stderr, "hearth: not recorded: %s\n", err.message);
    free(dj);
    json_decref(details);
}

/* Opens `path` for the pass that writes (mode "wb") or reads ("rb") log-probs. */
static FILE *open_logits(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) fprintf(stderr, "hearth: %s: %s\n", path, strerror(errno));
    return f;
}

static int close_logits(FILE *f, const char *path) {
    if (f && fclose(f)) {
        fprintf(stderr, "hearth: %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* The reference pass: its log-probs go to --reference-logits, else to a temporary file
 * that the model's pass reads back and that is removed afterwards. */
static int run_reference(const ppl_args *a, score_run *r, char *tmp_path, const char **ref_path) {
    score_run ref = {.tokens = r->tokens, .rows = r->rows, .L = r->L, .first = r->first};
    *ref_path = a->ref_logits;
    if (!*ref_path) {
        int fd = mkstemp(tmp_path);
        if (fd < 0) {
            fprintf(stderr, "hearth: %s: %s\n", tmp_path, strerror(errno));
            return 1;
        }
        close(fd);
        *ref_path = tmp_path;
    }
    ref.save_path = *ref_path;
    if (!(ref.save = open_logits(*ref_path, "wb"))) return 1;
    int rc = ppl_run_model(a->reference, a->eo, &ref);
    rc |= close_logits(ref.save, *ref_path);
    free(ref.loss);
    return rc;
}

int cli_perplexity(int argc, char **argv) {
    ppl_args a = {.L = 512, .num_samples = 256, .batch_size = 8, .seed = 123};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    if (access(a.data, R_OK)) { /* cli_read_file's perror lacks the "hearth: " prefix */
        fprintf(stderr, "hearth: %s: %s\n", a.data, strerror(errno));
        return 1;
    }
    char *buf = cli_read_file(a.data);
    if (!buf) return 1;
    dataset d = {0};
    hearth_model *m = NULL;
    score_run r = {.L = a.L, .first = a.second_half ? a.L / 2 : 0};
    int32_t *tokens = NULL;
    char *model_path = NULL, tmp_path[] = "/tmp/hearth-reference-XXXXXX";
    const char *ref_path = NULL;
    rc = ppl_dataset_load(a.data, buf, &d) || cli_open_model(a.model, &m) ||
         ppl_load_tokens(m, &d, a.seed, a.num_samples, a.L, &tokens, &r.rows);
    if (m) model_path = strdup(hearth_model_path(m));
    hearth_model_close(m);
    r.tokens = tokens;
    if (!rc && a.reference)
        rc = run_reference(&a, &r, tmp_path, &ref_path);
    else
        ref_path = a.ref_logits;
    if (!rc && a.kl && !(r.ref = open_logits(ref_path, "rb"))) rc = 1;
    r.ref_path = ref_path;
    r.save_path = a.save;
    if (!rc && a.save && !(r.save = open_logits(a.save, "wb"))) rc = 1;
    if (!rc) rc = ppl_run_model(a.model, a.eo, &r);
    rc |= close_logits(r.save, a.save);
    if (r.ref) fclose(r.ref);
    if (ref_path == tmp_path) unlink(tmp_path);
    if (!rc) {
        size_t n = r.rows * (size_t)(a.L - 1 - r.first);
        double mean, se;
        ppl_mean_se(r.loss, n, &mean, &se);
        double ppl = exp(mean), tok_s = (double)n / r.seconds;
        /* tok_s: the tokens through the engine (every position is computed, scored or not) */
        tok_s = (double)(r.rows * (size_t)(a.L - 1)) / r.seconds;
        json_t *rep = json_pack("{s:s, s:f, s:f, s:f, s:I, s:I, s:i, s:i, s:f, s:f}", "model", model_path, "perplexity",
                                ppl, "standard_error", ppl * se, "mean_loss", mean, "rows", (json_int_t)r.rows,
                                "tokens", (json_int_t)n, "sequence_length", a.L, "first_scored", r.first, "seconds",
                                r.seconds, "tok_s", tok_s);
        if (a.kl) json_object_set_new(rep, "kl_divergence", kl_report(&r.kl));
        if (a.as_json) {
            json_dumpf(rep, stdout, JSON_COMPACT | JSON_REAL_PRECISION(17));
            putchar('\n');
        } else {
            printf("Model: %s\nPerplexity: %.3f \u00b1 %.3f\n", model_path, ppl, ppl * se);
            printf("Tokens: %zu (%zu rows of %d)\nTokens per second: %.0f\n", n, r.rows, a.L, tok_s);
            json_t *k = json_object_get(rep, "kl_divergence");
            if (k)
                printf("KL divergence: mean %.6f \u00b1 %.6f, median %.6f, p99 %.6f, max %.6f\n"
                       "Same top token: %.3f%% \u00b1 %.3f%%\n",
                       json_real_value(json_object_get(k, "mean")),
                       json_real_value(json_object_get(k, "standard_error")),
                       json_real_value(json_object_get(k, "median")), json_real_value(json_object_get(k, "p99")),
                       json_real_value(json_object_get(k, "max")),
                       100 * json_real_value(json_object_get(k, "top1_agreement")),
                       100 * json_real_value(json_object_get(k, "top1_standard_error")));
        }
        record(&a, model_path, tok_s, rep);
        json_decref(rep);
    }
    free(r.loss);
    free(r.kl.kl);
    free(tokens);
    free(model_path);
    free(d.lines);
    free(buf);
    return rc;
}
