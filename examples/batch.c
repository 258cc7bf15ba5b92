/* batch.c: several prompts served together by continuous batching: one engine with a
 * sequence slot per prompt, every request submitted to a hearth_batch, then one step at a
 * time until all are done; each request collects its own text. deterministic numerics
 * make each answer the same as that prompt generated alone.
 *   cc batch.c $(pkg-config --cflags --libs hearth) -o batch
 *   ./batch <model> <max_tokens> "<prompt>" ["<prompt>" ...] */
#include <hearth.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct request {
    int32_t *ids;
    size_t n_ids;
    char *text; /* what the request generated so far */
    size_t len;
    hearth_generate_params params;
    hearth_generate_result result;
    hearth_status status;
    int done;
} request;

static int on_token(void *user, int32_t token, const char *piece, const hearth_logprobs *lp) {
    (void)token;
    (void)lp;
    request *r = user;
    size_t n = strlen(piece);
    char *grown = realloc(r->text, r->len + n + 1);
    if (!grown) return 1; /* cancels this request only */
    memcpy(grown + r->len, piece, n + 1);
    r->text = grown;
    r->len += n;
    return 0;
}

static void on_done(void *user, hearth_status status, const hearth_error *err) {
    request *r = user;
    r->status = status;
    r->done = 1;
    if (status) fprintf(stderr, "batch: a request failed: %s\n", err->message);
}

static int fail(const hearth_error *err) {
    fprintf(stderr, "batch: %s: %s\n", hearth_status_name(err->status), err->message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <model> <max_tokens> <prompt> [<prompt> ...]\n", argv[0]);
        return 2;
    }
    int n = argc - 3;
    hearth_error err = {0};
    hearth_model *model = NULL;
    if (hearth_model_open(argv[1], &model, &err)) return fail(&err);
    hearth_engine_options eo = {.max_sequences = n, .deterministic = 1};
    hearth_engine *engine = NULL;
    if (hearth_engine_create(model, &eo, &engine, &err)) return fail(&err);
    hearth_batch *batch = NULL;
    if (hearth_batch_create(engine, &batch, &err)) return fail(&err);

    request *reqs = calloc((size_t)n, sizeof *reqs);
    for (int i = 0; i < n; i++) {
        request *r = &reqs[i];
        const char *prompt = argv[3 + i];
        if (hearth_tokenize(model, prompt, strlen(prompt), 1, &r->ids, &r->n_ids, &err)) return fail(&err);
        r->params.max_tokens = atoi(argv[2]);
        hearth_sampling_defaults(model, &r->params.sampling);
        r->params.sampling.temperature = 0;
        r->text = calloc(1, 1);
        hearth_batch_request br = {.prompt = r->ids,
                                   .n_prompt = r->n_ids,
                                   .params = &r->params,
                                   .on_token = on_token,
                                   .on_done = on_done,
                                   .result = &r->result,
                                   .user = r};
        if (hearth_batch_submit(batch, &br, &err)) return fail(&err);
    }
    size_t steps = 0; /* each step: admit, one forward pass, sample; returns the requests still held */
    for (size_t held = 1; held; steps++) held = hearth_batch_step(batch);

    int rc = 0;
    for (int i = 0; i < n; i++) {
        request *r = &reqs[i];
        printf("--- %d\n%s\n", i, r->text);
        fprintf(stderr, "request %d: %zu prompt + %zu generated tokens, finish: %s\n", i, r->result.prompt_tokens,
                r->result.completion_tokens, hearth_finish_name(r->result.finish));
        rc |= !r->done || r->status != HEARTH_OK;
        hearth_free(r->ids);
        free(r->text);
    }
    fprintf(stderr, "%d requests in %zu steps\n", n, steps);
    free(reqs);
    hearth_batch_free(batch);
    hearth_engine_free(engine);
    hearth_model_close(model);
    return rc;
}
