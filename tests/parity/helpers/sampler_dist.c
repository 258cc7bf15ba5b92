/* sampler_dist.c: the distribution hearth's sampler draws from, for
 * tests/parity/test_sampler_lab.py (the XTC differential against mlx-lm). Reads rows of
 * float32 logits, writes each row's float64 probabilities (0 where filtered out), XTC
 * counted as firing when xtc_probability > 0 (sampler_distribution). Built against
 * libhearth.a: the sampler is internal.
 * usage: sampler_dist <vocab> <logits.f32> <out.f64> <temperature> <top_p> <top_k> <min_p>
 *                     <xtc_probability> <xtc_threshold> [exempt ids, comma-separated] */
#include "engine/sampler.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 10) {
        fprintf(stderr,
                "usage: sampler_dist <vocab> <logits> <out> <temp> <top_p> <top_k> <min_p> <xtc_p> <xtc_t> [ids]\n");
        return 2;
    }
    int V = atoi(argv[1]);
    hearth_sampling p;
    memset(&p, 0, sizeof p);
    p.repetition_penalty = 1;
    p.temperature = strtof(argv[4], NULL), p.top_p = strtof(argv[5], NULL), p.top_k = atoi(argv[6]);
    p.min_p = strtof(argv[7], NULL), p.xtc_probability = strtof(argv[8], NULL), p.xtc_threshold = strtof(argv[9], NULL);
    sampler s;
    if (V <= 0 || sampler_init(&s, V, NULL)) return 1;
    int32_t ids[SAMPLER_MAX_EXEMPT];
    int n_ids = 0;
    for (char *t = argc > 10 ? strtok(argv[10], ",") : NULL; t && n_ids < SAMPLER_MAX_EXEMPT; t = strtok(NULL, ","))
        ids[n_ids++] = atoi(t);
    sampler_set_xtc_exempt(&s, ids, n_ids);
    FILE *in = fopen(argv[2], "rb"), *out = fopen(argv[3], "wb");
    float *x = malloc((size_t)V * sizeof *x);
    double *probs = malloc((size_t)V * sizeof *probs);
    if (!in || !out || !x || !probs) return 1;
    while (fread(x, sizeof *x, (size_t)V, in) == (size_t)V) {
        sampler_distribution(&s, x, &p, NULL, 0, probs);
        fwrite(probs, sizeof *probs, (size_t)V, out);
    }
    fclose(in), fclose(out);
    free(x), free(probs);
    sampler_free(&s);
    return 0;
}
