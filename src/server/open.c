/* open.c: a whole server from a model and its configuration, in one call for the CLI
 * (srv_open) and one to end it (srv_close): the tool and reasoning parser of the
 * chat template, the engine and its queue, the embedder, the Responses store, the
 * fingerprint, then the listener. Owns the order of start and shutdown; handles no
 * requests. */
#include "server/embeddings.h"
#include "server/responses.h"
#include "server/textstate.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

/* mlx_lm.server's shape (version-platform-accelerator); the last part names the device the
 * engine computes on. */
static void make_fingerprint(char *out, size_t cap, int on_gpu) {
    struct utsname u;
    const char *dev = on_gpu ? "cuda" : "cpu";
    if (uname(&u))
        snprintf(out, cap, "hearth-%s-%s", HEARTH_VERSION, dev);
    else
        snprintf(out, cap, "hearth-%s-%s-%s-%s-%s", HEARTH_VERSION, u.sysname, u.release, u.machine, dev);
}

/* hearth fit's predicted peak for these options (shown by /stats next to the real
 * high-water mark); asked before the engine exists, as fit itself does. 0: unknown. */
static size_t predicted_peak(hearth_model *m, const hearth_engine_options *eo) {
    hearth_fit_options fo = {.engine = *eo, .bandwidth_gbs = 1}; /* any rate: no bandwidth probe on the GPU */
    char *report = NULL;
    hearth_error err = {0};
    if (hearth_fit(m, &fo, &report, &err)) return 0;
    json_t *r = json_loads(report, 0, NULL);
    hearth_free(report);
    json_int_t peak = json_integer_value(json_object_get(r, "predicted_peak_bytes"));
    json_decref(r);
    return peak > 0 ? (size_t)peak : 0;
}

static bool has_token(void *ud, const char *piece) { return hearth_token_id(ud, piece) >= 0; }

static hearth_status fail(hearth_error *err, hearth_status st, const char *message) {
    snprintf(err->message, sizeof err->message, "%s", message);
    return err->status = st;
}

hearth_status srv_open(const srv_config *cfg, hearth_model *model, hearth_model *embedding_model,
                       const hearth_engine_options *eo, srv_server **out, hearth_error *err) {
    *out = NULL;
    srv_server *s = calloc(1, sizeof *s);
    ts_config *tsc = calloc(1, sizeof *tsc), *forced = calloc(1, sizeof *forced);
    if (!s || !tsc || !forced) {
        free(s);
        free(tsc);
        free(forced);
        hearth_model_close(model);
        if (embedding_model) hearth_model_close(embedding_model);
        return fail(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    s->cfg = *cfg;
    s->model = model;
    s->text_config = tsc;
    s->forced_text_config = forced;
    pthread_mutex_init(&s->render_mu, NULL);
    *out = s; /* from here srv_close frees whatever was made */
    hearth_status st =
        ts_infer(tsc, hearth_model_chat_template(model),
                 hearth_model_tokenizer_config_string(model, "tool_parser_type"), has_token, model, false, err);
    if (!st)
        st = ts_infer(forced, hearth_model_chat_template(model),
                      hearth_model_tokenizer_config_string(model, "tool_parser_type"), has_token, model, true, err);
    if (st) return st;
    if (forced->tool == TS_TOOL_NONE) ts_set_tool(forced, TS_TOOL_JSON_TOOLS);
    /* an embedding model (BERT, Qwen3-Embedding) gets no engine: /v1/embeddings only */
    int embed_only = hearth_model_is_embedding(model);
    if (embed_only && embedding_model) {
        hearth_model_close(embedding_model);
        return fail(err, HEARTH_ERR_INVALID, "the model already serves embeddings: drop --embedding-model");
    }
    if (embed_only && (st = srv_embed_open(model, 0, eo->n_threads, &s->embed, err))) return st;
    if (embedding_model && (st = srv_embed_open(embedding_model, 1, eo->n_threads, &s->embed, err))) return st;
    if (!embed_only) {
        s->predicted_peak_bytes = predicted_peak(model, eo);
        if ((st = hearth_engine_create(model, eo, &s->engine, err))) return st;
        s->context_length = hearth_engine_context_length(s->engine);
        if (eo->context_length)
            snprintf(s->context_source_text, sizeof s->context_source_text, "--ctx");
        else if (hearth_engine_context_cut_from(s->engine))
            snprintf(s->context_source_text, sizeof s->context_source_text,
                     "the largest that fits free memory (the model allows %d)",
                     hearth_engine_context_cut_from(s->engine));
        else
            snprintf(s->context_source_text, sizeof s->context_source_text, "the model's own limit");
        s->context_source = s->context_source_text;
        int cut, blocks = hearth_engine_kv_blocks(s->engine, &cut);
        if (cut)
            fprintf(stderr,
                    "hearth serve: KV pool cut to %d blocks (%d positions) to fit free memory; %d sequences x %d "
                    "positions would take %d blocks: long requests wait for blocks (--kv-budget sets the pool)\n",
                    blocks, blocks * 16, eo->max_sequences, s->context_length, cut);
        s->on_gpu = hearth_engine_device(s->engine) == HEARTH_DEVICE_CUDA;
    }
    for (size_t i = 0; s->engine && i < cfg->n_adapters; i++) { /* a bad adapter ends the start */
        const char *a = cfg->adapters[i], *eq = strchr(a, '=');
        char id[129];
        snprintf(id, sizeof id, "%.*s", eq ? (int)(eq - a) : 0, a);
        if ((st = hearth_adapter_mount(s->engine, id, eq ? eq + 1 : a, err))) return st;
        srv_log(s, SRV_LOG_INFO, "adapter %s mounted from %s", id, eq ? eq + 1 : a);
    }
    if (s->engine && cfg->default_adapter && (st = hearth_adapter_set_default(s->engine, cfg->default_adapter, err)))
        return st;
    make_fingerprint(s->fingerprint, sizeof s->fingerprint, s->on_gpu);
    if (!(s->responses = resp_store_new(cfg->responses_ttl_s, cfg->responses_max_bytes)))
        return fail(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_prompt_cache_report pc = {0};
    if (s->engine && (st = srv_queue_start(s->engine, cfg->prompt_cache_dir, (long long)cfg->prompt_cache_bytes, &pc,
                                           &s->queue, err)))
        return st;
    if (cfg->prompt_cache_dir) {
        srv_log(s, SRV_LOG_INFO, "prompt cache %s: %zu files (%zu tokens) loaded, %zu skipped (KV pool full)",
                cfg->prompt_cache_dir, pc.files_loaded, pc.tokens_loaded, pc.files_skipped);
        if (pc.files_refused)
            srv_log(s, SRV_LOG_WARNING, "prompt cache %s: %zu files refused, the first: %s", cfg->prompt_cache_dir,
                    pc.files_refused, pc.first_refusal);
    }
    if ((st = srv_start(s, err))) return st;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    s->started = (double)t.tv_sec + t.tv_nsec * 1e-9;
    srv_log(s, SRV_LOG_INFO, "model %s (%s tool parser, context %d: %s)", hearth_model_path(model),
            tsc->tool_name ? tsc->tool_name : "no", s->context_length, s->context_source ? s->context_source : "none");
    srv_log(s, SRV_LOG_INFO, "Starting httpd at %s on port %d...", cfg->host, cfg->port);
    return HEARTH_OK;
}

void srv_close(srv_server *s) {
    if (!s) return;
    srv_stop(s); /* every connection has ended: no request holds a job */
    if (s->queue) srv_queue_stop(s->queue);
    hearth_engine_free(s->engine);
    srv_embed_close(s->embed);
    hearth_model_close(s->model);
    pthread_mutex_destroy(&s->render_mu);
    resp_store_free(s->responses);
    free(s->text_config);
    free(s->forced_text_config);
    free(s);
}
