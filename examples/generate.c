/* generate.c: the smallest use of libhearth: open a model, make an engine, generate from a
 * raw prompt (no chat template) and print the text and the run's numbers.
 *   cc generate.c $(pkg-config --cflags --libs hearth) -o generate
 *   ./generate <model> "<prompt>" [max_tokens [temperature [seed]]] */
#include <hearth.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Collects the text of every token; returning nonzero would cancel the generation. */
static int on_token(void *user, int32_t token, const char *text, const hearth_logprobs *lp) {
    (void)token;
    (void)lp;
    fputs(text, (FILE *)user);
    return 0;
}

static int fail(const hearth_error *err) {
    fprintf(stderr, "generate: %s: %s\n", hearth_status_name(err->status), err->message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <model> <prompt> [max_tokens [temperature [seed]]]\n", argv[0]);
        return 2;
    }
    hearth_error err = {0};
    hearth_model *model = NULL;
    if (hearth_model_open(argv[1], &model, &err)) return fail(&err);

    /* The prompt as the tokenizer's post-processor would have it (BOS etc. added). */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (hearth_tokenize(model, argv[2], strlen(argv[2]), 1, &ids, &n_ids, &err)) return fail(&err);

    hearth_engine_options eo = {0}; /* all cores, the model's context capped at 8192, one sequence */
    hearth_engine *engine = NULL;
    if (hearth_engine_create(model, &eo, &engine, &err)) return fail(&err);

    hearth_generate_params p = {.max_tokens = argc > 3 ? atoi(argv[3]) : 32};
    hearth_sampling_defaults(model, &p.sampling); /* mlx-lm's defaults + generation_config.json */
    if (argc > 4) p.sampling.temperature = strtof(argv[4], NULL);
    if (argc > 5) {
        p.sampling.has_seed = 1;
        p.sampling.seed = strtoull(argv[5], NULL, 10);
    }

    hearth_generate_result r;
    if (hearth_generate(engine, ids, n_ids, &p, on_token, stdout, &r, &err)) return fail(&err);
    fprintf(stderr, "\nprompt %zu tokens, generated %zu tokens (%.1f tok/s), finish: %s\n", r.prompt_tokens,
            r.completion_tokens, r.generate_seconds > 0 ? r.completion_tokens / r.generate_seconds : 0.0,
            hearth_finish_name(r.finish));

    hearth_free(ids);
    hearth_engine_free(engine);
    hearth_model_close(model);
    return 0;
}
