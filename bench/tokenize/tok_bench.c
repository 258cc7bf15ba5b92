/* tok_bench.c: times hearth's tokenizer encoding (not loading) on one text file, as the
 * tokenizer benchmark's hearth side (bench/tokenize/run.py compiles it against
 * lib/libhearth.a). Prints one JSON line; must not be linked into the library.
 * usage: tok_bench <model dir with tokenizer.json | file.gguf> <text file> <whole|lines> <repeats> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "io/gguf.h"
#include "tok/tokenizer.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Encodes text[0..len) once; adds its token count to *n_tokens. */
static int encode_span(const tok_tokenizer *t, const char *text, size_t len, size_t *n_tokens)
{
    hearth_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, len, 0, &ids, &n, &err) != HEARTH_OK) {
        fprintf(stderr, "tok_bench: encode failed: %s\n", err.message);
        return -1;
    }
    *n_tokens += n;
    free(ids);
    return 0;
}

/* One pass over the text: as a single string, or line by line (each line keeps its '\n',
 * and lines end at "\n" only; run.py splits its side the same way). */
static int encode_pass(const tok_tokenizer *t, const char *text, size_t len, int by_line, size_t *n_tokens)
{
    if (!by_line)
        return encode_span(t, text, len, n_tokens);
    size_t start = 0;
    while (start < len) {
        const char *nl = memchr(text + start, '\n', len - start);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        if (encode_span(t, text + start, end - start, n_tokens) != 0)
            return -1;
        start = end;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[3], "whole") != 0 && strcmp(argv[3], "lines") != 0)) {
        fprintf(stderr, "usage: %s <model dir | file.gguf> <text file> <whole|lines> <repeats>\n", argv[0]);
        return 2;
    }
    int repeats = atoi(argv[4]);
    if (repeats < 1)
        repeats = 1;
    hearth_error err = {0};
    tok_tokenizer *t = NULL;
    gguf_file g;
    int have_gguf = 0;
    if (ends_with(argv[1], ".gguf")) {
        if (gguf_open(argv[1], &g, &err) != HEARTH_OK || (have_gguf = 1, tok_load_gguf(&g, &t, &err)) != HEARTH_OK) {
            fprintf(stderr, "tok_bench: %s\n", err.message);
            return 1;
        }
    } else if (tok_load_hf_dir(argv[1], &t, &err) != HEARTH_OK) {
        fprintf(stderr, "tok_bench: %s\n", err.message);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(argv[2], &text, &len, &err) != HEARTH_OK) {
        fprintf(stderr, "tok_bench: %s\n", err.message);
        return 1;
    }
    int by_line = strcmp(argv[3], "lines") == 0;
    /* Best of `repeats` passes: the least disturbed run on a shared machine. */
    double best = 1e30;
    size_t n_tokens = 0;
    for (int r = 0; r < repeats; r++) {
        size_t n = 0;
        double t0 = now_seconds();
        if (encode_pass(t, text, len, by_line, &n) != 0)
            return 1;
        double dt = now_seconds() - t0;
        if (dt < best)
            best = dt;
        n_tokens = n;
    }
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f}\n", len, n_tokens, best,
           (double)len / 1e6 / best);
    free(text);
    tok_free(t);
    if (have_gguf)
        gguf_close(&g);
    return 0;
}
