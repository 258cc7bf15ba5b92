/* embeddings.h: the OpenAI Embeddings endpoint (POST /v1/embeddings) and the embedding
 * model it serves, beside or instead of the generation engine. */
#ifndef HEARTH_SERVER_EMBEDDINGS_H
#define HEARTH_SERVER_EMBEDDINGS_H
#include "server/server.h"

/* OpenAI's own limit on inputs per request. */
#define EMB_MAX_INPUTS 2048

typedef struct srv_embed srv_embed;

/* Creates the embedder of m (n_threads 0: all cores). owns_model: srv_embed_close closes m. */
hearth_status srv_embed_open(hearth_model *m, int owns_model, int n_threads, srv_embed **out, hearth_error *err);
void srv_embed_close(srv_embed *e);

/* Parses, validates, embeds and answers one request (errors in OpenAI's shape). */
int srv_handle_embeddings(srv_server *s, srv_conn *c, const char *body, size_t len);
/* ---- the request validator: pure, fuzzed (tests/fuzz/fuzz_embeddings.c) ---- */

/* What validating a request needs of the embedding model. */
typedef struct emb_limits {
    int32_t vocab;  /* token ids must be 0..vocab-1 */
    int max_tokens; /* the longest input */
    int dim;        /* the vector size: the largest 'dimensions' */
    /* Tokenizes one text as hearth_embed_tokenize does (specials added; longer than
     * max_tokens: HEARTH_ERR_INVALID unless truncate). */
    hearth_status (*tokenize)(void *ctx, const char *text, size_t len, int truncate, int32_t **ids, size_t *n_ids,
                              hearth_error *err);
    void *ctx;
} emb_limits;

/* A validated request: inputs as token ids (texts tokenized), the output options. */
typedef struct emb_request {
    int32_t **ids; /* n inputs, lens[i] ids each (freed with hearth_free) */
    size_t *lens, n, tokens;
    int base64, dims;
    const char *model; /* borrowed from the body; NULL: none given */
} emb_request;

/* Validates a parsed body against m into r. Returns 0, or -1 with e filled (400, or
 * 500 when out of memory). r must be freed with emb_request_free either way. */
int emb_request_parse(const json_t *body, const emb_limits *m, emb_request *r, srv_error *e);
void emb_request_free(emb_request *r);

/* The embedding model's path (the id /v1/models lists), or NULL without one. */
const char *srv_embed_model_path(const srv_embed *e);
#endif
