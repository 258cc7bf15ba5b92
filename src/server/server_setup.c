/* server_setup.c: what a server holds besides the engine and the HTTP daemon, made before
 * it listens and freed after it stops: the model's text configuration (thinking markers,
 * tool parser), the render lock, the Responses store and the embedding model. The CLI
 * assembles a server through these and server.h alone; nothing here parses flags. */
#include "base/err.h"
#include "server/embeddings.h"
#include "server/responses.h"
#include "server/textstate.h"
#include <stdlib.h>

static bool has_token(void *ud, const char *piece) { return hearth_token_id(ud, piece) >= 0; }

hearth_status srv_setup(srv_server *s, hearth_error *err) {
    ts_config *tsc = calloc(1, sizeof *tsc);
    if (!tsc) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st =
        ts_infer(tsc, hearth_model_chat_template(s->model),
                 hearth_model_tokenizer_config_string(s->model, "tool_parser_type"), has_token, s->model, false, err);
    if (st) {
        free(tsc);
        return st;
    }
    if (!(s->responses = resp_store_new(s->cfg.responses_ttl_s, s->cfg.responses_max_bytes))) {
        free(tsc);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    s->text_config = tsc;
    pthread_mutex_init(&s->render_mu, NULL);
    return HEARTH_OK;
}

const char *srv_tool_parser_name(const srv_server *s) {
    const ts_config *tsc = s->text_config;
    return tsc ? tsc->tool_name : NULL;
}

void srv_teardown(srv_server *s) {
    srv_embed_close(s->embed);
    s->embed = NULL;
    resp_store_free(s->responses);
    s->responses = NULL;
    if (s->text_config) pthread_mutex_destroy(&s->render_mu);
    free(s->text_config);
    s->text_config = NULL;
}
