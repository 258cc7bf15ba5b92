/* stats.c: the body of GET /stats (and the "stats" object of GET /v1): the batch
 * snapshot the engine thread publishes after every step, memory high-water mark vs
 * hearth fit's prediction, and the Responses store. Runs on HTTP threads and must never
 * wait for the engine (it reads srv_queue_stats' copy only). */
#include "server/adapters.h"
#include "server/responses.h"
#include "server/server.h"
#include <stdlib.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock the scheduler stamps queue entries with */
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *stats_json(srv_server *s) {
    hearth_batch_stats b;
    srv_queue_stats(s->queue, &b);
    double now = now_seconds();
    json_t *queue = json_array();
    for (size_t i = 0; i < b.n_queued; i++)
        json_array_append_new(queue, json_pack("{s:f,s:I}", "waited_seconds", now - b.queued_since[i], "prompt_tokens",
                                               (json_int_t)b.queued_prompt_tokens[i]));
    size_t entries = 0, bytes = 0;
    if (s->responses) resp_store_stats(s->responses, &entries, &bytes);
    hearth_process_memory pm;
    hearth_process_memory_get(&pm);
    long long hwm = pm.peak_resident_bytes, host_hwm = hwm;
    if (s->on_gpu) hwm = (long long)hearth_device_peak_bytes(); /* device bytes, as fit --device cuda predicts */
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("stats"));
    json_object_set_new(o, "uptime_seconds", json_real(s->started > 0 ? now - s->started : 0));
    json_object_set_new(o, "context_length", json_integer(s->context_length));
    json_object_set_new(o, "context_source", json_string(s->context_source ? s->context_source : ""));
    json_object_set_new(o, "requests_served", json_integer((json_int_t)b.requests_done));
    json_object_set_new(o, "running", json_integer((json_int_t)b.running));
    json_object_set_new(o, "queued", json_integer((json_int_t)b.waiting));
    json_object_set_new(o, "queue", queue);
    json_object_set_new(o, "preemptions", json_integer((json_int_t)b.preemptions));
    json_object_set_new(o, "kv_blocks",
                        json_pack("{s:i,s:i,s:i,s:i,s:i}", "total", b.kv_blocks, "used", b.kv_blocks_used, "free",
                                  b.kv_blocks_free, "cached", b.kv_blocks_cached, "block_tokens", 16));
    json_object_set_new(o, "prefix_cache",
                        json_pack("{s:I,s:I,s:f}", "prompt_tokens", (json_int_t)b.prompt_tokens, "cached_tokens",
                                  (json_int_t)b.cached_tokens, "hit_rate",
                                  b.prompt_tokens ? (double)b.cached_tokens / (double)b.prompt_tokens : 0.0));
    json_object_set_new(o, "steps",
                        json_pack("{s:I,s:f,s:i,s:f,s:f}", "count", (json_int_t)b.steps, "last_seconds",
                                  b.last_step_seconds, "last_tokens", b.last_step_tokens, "decode_tokens_per_second",
                                  b.decode_tok_s, "prefill_tokens_per_second", b.prefill_tok_s));
    json_t *spec = json_object();
    for (int k = HEARTH_SPEC_LOOKUP; k < HEARTH_SPEC_KINDS; k++) /* per proposer */
        if (k != HEARTH_SPEC_NONE)
            json_object_set_new(spec, hearth_speculate_name(k),
                                json_pack("{s:I,s:I,s:f}", "proposed_tokens", (json_int_t)b.spec_proposed[k],
                                          "accepted_tokens", (json_int_t)b.spec_accepted[k], "acceptance",
                                          b.spec_proposed[k] ? (double)b.spec_accepted[k] / (double)b.spec_proposed[k]
                                                             : 0.0));
    json_object_set_new(o, "speculative", spec);
    json_object_set_new(o, "peak_bytes", hwm > 0 ? json_integer((json_int_t)hwm) : json_null());
    json_object_set_new(o, "peak_bytes_of", json_string(s->on_gpu ? "device" : "host"));
    if (s->on_gpu)
        json_object_set_new(o, "host_peak_bytes", host_hwm > 0 ? json_integer((json_int_t)host_hwm) : json_null());
    json_object_set_new(o, "predicted_peak_bytes",
                        s->predicted_peak_bytes ? json_integer((json_int_t)s->predicted_peak_bytes) : json_null());
    json_object_set_new(o, "responses_store",
                        json_pack("{s:I,s:I,s:I,s:I}", "entries", (json_int_t)entries, "bytes", (json_int_t)bytes,
                                  "max_bytes", (json_int_t)s->cfg.responses_max_bytes, "ttl_seconds",
                                  (json_int_t)s->cfg.responses_ttl_s));
    json_object_set_new(o, "adapters", srv_adapters_list(s)); /* the registry's copy: never waits for a step */
    return o;
}

char *srv_stats_body(srv_server *s) {
    json_t *o = stats_json(s);
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}

char *srv_index_stats_body(srv_server *s) {
    char *index = srv_index_body();
    json_t *o = index ? json_loads(index, 0, NULL) : NULL;
    free(index);
    if (!o) return NULL;
    json_object_set_new(o, "stats", stats_json(s));
    char *body = srv_json_dumps(o);
    json_decref(o);
    return body;
}
