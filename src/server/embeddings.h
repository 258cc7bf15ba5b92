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
int srv_handle_embeddings(srv_server *s, struct MHD_Connection *c, const char *body, size_t len, const char *origin);
/* The embedding model's path (the id /v1/models lists), or NULL without one. */
const char *srv_embed_model_path(const srv_embed *e);
#endif
