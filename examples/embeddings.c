/* embeddings.c: sentence vectors from an embedding model (a BERT-family encoder such as
 * all-MiniLM-L6-v2, or a Qwen3-Embedding style decoder): every text embedded in one call,
 * each vector printed on a line, then their cosine similarities.
 *   cc embeddings.c $(pkg-config --cflags --libs hearth) -lm -o embeddings
 *   ./embeddings <model> "<text>" ["<text>" ...] */
#include <hearth.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const hearth_error *err) {
    fprintf(stderr, "embeddings: %s: %s\n", hearth_status_name(err->status), err->message);
    return 1;
}

static double dot(const float *a, const float *b, int dim) {
    double s = 0;
    for (int k = 0; k < dim; k++) s += (double)a[k] * b[k];
    return s;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <model> <text> [<text> ...]\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)argc - 2;
    hearth_error err = {0};
    hearth_model *model = NULL;
    if (hearth_model_open(argv[1], &model, &err)) return fail(&err);
    if (!hearth_model_is_embedding(model)) {
        fprintf(stderr, "embeddings: %s is not an embedding model\n", argv[1]);
        return 1;
    }
    hearth_embedder_options o = {0}; /* all cores, 2048 tokens per forward pass */
    hearth_embedder *emb = NULL;
    if (hearth_embedder_create(model, &o, &emb, &err)) return fail(&err);
    int dim = hearth_embedder_dim(emb);

    int32_t **ids = calloc(n, sizeof *ids);
    size_t *lens = calloc(n, sizeof *lens);
    float *vecs = malloc(n * (size_t)dim * sizeof *vecs);
    for (size_t i = 0; i < n; i++) /* truncate: long texts keep their first max_tokens tokens */
        if (hearth_embed_tokenize(emb, argv[2 + i], strlen(argv[2 + i]), 1, &ids[i], &lens[i], &err)) return fail(&err);
    if (hearth_embed(emb, (const int32_t *const *)ids, lens, n, vecs, &err)) return fail(&err);

    printf("dim %d pooling %s normalized %d\n", dim, hearth_embedder_pooling(emb), hearth_embedder_normalizes(emb));
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < dim; k++) printf(k ? " %.8g" : "%.8g", vecs[i * dim + k]);
        printf("\n");
    }
    printf("cosine similarity\n");
    for (size_t i = 0; i < n; i++) {
        const float *a = vecs + i * dim;
        for (size_t j = 0; j < n; j++) {
            const float *b = vecs + j * dim;
            printf(j ? " %.4f" : "%.4f", dot(a, b, dim) / sqrt(dot(a, a, dim) * dot(b, b, dim)));
        }
        printf("\n");
    }
    for (size_t i = 0; i < n; i++) hearth_free(ids[i]);
    free(ids);
    free(lens);
    free(vecs);
    hearth_embedder_free(emb);
    hearth_model_close(model);
    return 0;
}
