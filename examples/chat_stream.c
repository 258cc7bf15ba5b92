/* chat_stream.c: a chat turn streamed as it is generated: the model's chat template renders
 * the conversation, each token's text is printed the moment it is final, and the callback
 * stops the generation early when the caller's limit on characters is reached.
 *   cc chat_stream.c $(pkg-config --cflags --libs hearth) -o chat_stream
 *   ./chat_stream <model> "<user message>" [max_tokens [max_chars]] */
#include <hearth.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stream {
    size_t chars, max_chars; /* max_chars 0: no limit */
} stream;

/* Prints each piece at once (never a broken UTF-8 sequence, never part of a stop string);
 * a nonzero return cancels, and the result's finish says "cancelled". */
static int on_token(void *user, int32_t token, const char *text, const hearth_logprobs *lp) {
    (void)token;
    (void)lp;
    stream *s = user;
    fputs(text, stdout);
    fflush(stdout);
    s->chars += strlen(text);
    return s->max_chars && s->chars >= s->max_chars;
}

/* messages_json wants a JSON string: escape quotes, backslashes and control characters. */
static void json_string(char *out, const char *s) {
    *out++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            *out++ = '\\', *out++ = (char)c;
        else if (c < 0x20)
            out += sprintf(out, "\\u%04x", c);
        else
            *out++ = (char)c;
    }
    *out++ = '"';
    *out = 0;
}

static int fail(const hearth_error *err) {
    fprintf(stderr, "chat_stream: %s: %s\n", hearth_status_name(err->status), err->message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <model> <user message> [max_tokens [max_chars]]\n", argv[0]);
        return 2;
    }
    hearth_error err = {0};
    hearth_model *model = NULL;
    if (hearth_model_open(argv[1], &model, &err)) return fail(&err);

    char *content = malloc(6 * strlen(argv[2]) + 3), *messages = malloc(6 * strlen(argv[2]) + 64);
    json_string(content, argv[2]);
    sprintf(messages, "[{\"role\": \"user\", \"content\": %s}]", content);
    char *prompt = NULL;
    if (hearth_chat_render(model, messages, NULL, 1, NULL, &prompt, &err)) return fail(&err);

    /* The template already wrote BOS and the role markers: no special tokens added. */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (hearth_tokenize(model, prompt, strlen(prompt), 0, &ids, &n_ids, &err)) return fail(&err);

    hearth_engine_options eo = {0};
    hearth_engine *engine = NULL;
    if (hearth_engine_create(model, &eo, &engine, &err)) return fail(&err);

    hearth_generate_params p = {.max_tokens = argc > 3 ? atoi(argv[3]) : 64};
    hearth_sampling_defaults(model, &p.sampling);
    p.sampling.temperature = 0; /* greedy: the same answer every run */
    stream s = {.max_chars = argc > 4 ? strtoul(argv[4], NULL, 10) : 0};
    hearth_generate_result r;
    if (hearth_generate(engine, ids, n_ids, &p, on_token, &s, &r, &err)) return fail(&err);
    fprintf(stderr, "\n[%zu tokens, first after %.3f s, finish: %s]\n", r.completion_tokens, r.first_token_seconds,
            hearth_finish_name(r.finish));

    hearth_free(ids);
    hearth_free(prompt);
    free(messages);
    free(content);
    hearth_engine_free(engine);
    hearth_model_close(model);
    return 0;
}
