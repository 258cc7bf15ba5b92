/* kvq_helper.c: measures what quantized KV (--kv-quant int8, or fp8 on the GPU) does to a
 * model's predictions, for tests/parity/test_kv_quant.py, tools/cuda_kv_quality.sh and
 * docs/server.md: one engine with float KV, one with the quantized KV, on the same device,
 * the same text teacher-forced through both (8 positions per append, every position's
 * logits), then greedy continuations from a few prompts. Public API only.
 * usage: kvq_helper <model> <text file> <max tokens> <greedy steps> <threads> [int8|fp8 [cpu|cuda]]
 * prints JSON: KL(float || quant) mean / p99 / max per position, argmax agreement,
 * greedy agreement, engine bytes of both. */
#include "hearth.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 8 /* positions per append: hearth_seq_append returns at most 8 logits rows */

static int die(const char *what, const hearth_error *err) {
    fprintf(stderr, "kvq_helper: %s: %s\n", what, err ? err->message : "");
    return 1;
}

/* log-softmax of x into out (double), returns the argmax. */
static int log_softmax(const float *x, int n, double *out) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - x[best]);
    double lse = x[best] + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - lse;
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Greedy continuation of prompt[0..n) for steps tokens into out. */
static hearth_status greedy(hearth_engine *e, const int32_t *prompt, size_t n, int steps, float *logits, int vocab,
                            int32_t *out, hearth_error *err) {
    int seq;
    hearth_status st = hearth_seq_open(e, &seq, err);
    if (st) return st;
    st = hearth_seq_append(e, seq, prompt, n, 1, logits, err);
    for (int i = 0; !st && i < steps; i++) {
        int32_t best = 0;
        for (int v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        out[i] = best;
        st = hearth_seq_append(e, seq, &best, 1, 1, logits, err);
    }
    hearth_seq_close(e, seq);
    return st;
}

int main(int argc, char **argv) {
    int quant = HEARTH_KV_INT8, device = HEARTH_DEVICE_CPU;
    if (argc < 6 || argc > 8 || (argc > 6 && !hearth_kv_quant_parse(argv[6], &quant)) ||
        (argc > 7 && !hearth_device_parse(argv[7], &device))) {
        fprintf(stderr, "usage: kvq_helper <model> <text file> <max tokens> <greedy steps> <threads> "
                        "[int8|fp8 [cpu|cuda]]\n");
        return 2;
    }
    int max_tokens = atoi(argv[3]), steps = atoi(argv[4]), threads = atoi(argv[5]);
    hearth_error err = {0};
    hearth_model *m;
    if (hearth_model_open(argv[1], &m, &err)) return die("open", &err);
    FILE *f = fopen(argv[2], "rb");
    if (!f) return die("cannot read the text file", NULL);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    int32_t *ids;
    size_t n;
    if (hearth_tokenize(m, text, len, 1, &ids, &n, &err)) return die("tokenize", &err);
    if (n > (size_t)max_tokens) n = (size_t)max_tokens;
    n -= n % CHUNK;
    hearth_engine *e[2];
    for (int q = 0; q < 2; q++) {
        hearth_engine_options o = {.n_threads = threads, .context_length = (int)n + steps + 64,
                                   .max_step_tokens = 64, .kv_quant = q ? quant : HEARTH_KV_FLOAT,
                                   .device = device};
        if (hearth_engine_create(m, &o, &e[q], &err)) return die("engine", &err);
    }
    int vocab = hearth_model_vocab_rows(e[0]);
    float *logits[2] = {malloc((size_t)CHUNK * vocab * sizeof(float)), malloc((size_t)CHUNK * vocab * sizeof(float))};
    double *lp[2] = {malloc((size_t)vocab * sizeof(double)), malloc((size_t)vocab * sizeof(double))};
    double *kl = malloc(n * sizeof(double));
    int seq[2], agree = 0;
    for (int q = 0; q < 2; q++)
        if (hearth_seq_open(e[q], &seq[q], &err)) return die("seq", &err);
    for (size_t done = 0; done < n; done += CHUNK) {
        for (int q = 0; q < 2; q++)
            if (hearth_seq_append(e[q], seq[q], ids + done, CHUNK, CHUNK, logits[q], &err)) return die("append", &err);
        for (int r = 0; r < CHUNK; r++) {
            int b0 = log_softmax(logits[0] + (size_t)r * vocab, vocab, lp[0]);
            int b1 = log_softmax(logits[1] + (size_t)r * vocab, vocab, lp[1]);
            double d = 0;
            for (int i = 0; i < vocab; i++) d += exp(lp[0][i]) * (lp[0][i] - lp[1][i]);
            kl[done + r] = d > 0 ? d : 0; /* rounding can leave -1e-17 where both agree */
            agree += b0 == b1;
        }
    }
    for (int q = 0; q < 2; q++) hearth_seq_close(e[q], seq[q]);
    double mean = 0;
    for (size_t i = 0; i < n; i++) mean += kl[i];
    mean /= (double)n;
    qsort(kl, n, sizeof *kl, cmp_double);
    /* greedy: 4 prompts (the text's first 32, 128, 256, 512 tokens, where it has them) */
    int32_t *g[2] = {malloc((size_t)steps * sizeof(int32_t)), malloc((size_t)steps * sizeof(int32_t))};
    size_t cuts[] = {32, 128, 256, 512};
    int same_prefix = 0, same_pos = 0, total = 0, prompts = 0;
    printf("{\"quant\": \"%s\", \"device\": \"%s\", \"tokens\": %zu, \"kl_mean\": %.6g, \"kl_p50\": %.6g, \"kl_p99\": %.6g, \"kl_max\": %.6g, "
           "\"argmax_agreement\": %.6f, \"greedy\": [",
           hearth_kv_quant_name(quant), device == HEARTH_DEVICE_CUDA ? "cuda" : "cpu", n, mean, kl[n / 2], kl[(size_t)(n * 0.99)], kl[n - 1], (double)agree / (double)n);
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        if (cuts[c] > n) break;
        for (int q = 0; q < 2; q++)
            if (greedy(e[q], ids, cuts[c], steps, logits[q], vocab, g[q], &err)) return die("greedy", &err);
        int prefix = 0, pos = 0;
        while (prefix < steps && g[0][prefix] == g[1][prefix]) prefix++;
        for (int i = 0; i < steps; i++) pos += g[0][i] == g[1][i];
        printf("%s{\"prompt_tokens\": %zu, \"identical_prefix\": %d, \"same_position\": %d}", prompts ? ", " : "",
               cuts[c], prefix, pos);
        same_prefix += prefix, same_pos += pos, total += steps, prompts++;
    }
    printf("], \"greedy_steps\": %d, \"greedy_identical_prefix_fraction\": %.4f, "
           "\"greedy_same_position_fraction\": %.4f, \"engine_bytes_float\": %zu, \"engine_bytes_quant\": %zu}\n",
           steps, total ? (double)same_prefix / total : 0.0, total ? (double)same_pos / total : 0.0,
           hearth_engine_bytes(e[0]), hearth_engine_bytes(e[1]));
    for (int q = 0; q < 2; q++) {
        hearth_engine_free(e[q]);
        free(logits[q]);
        free(lp[q]);
        free(g[q]);
    }
    free(kl);
    hearth_free(ids);
    hearth_model_close(m);
    return 0;
}
