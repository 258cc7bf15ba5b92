/* metrics.c: GET /metrics in the Prometheus text format (version 0.0.4): requests by
 * endpoint and status, tokens in and out, time-to-first-token and per-token latency
 * histograms (recorded here as they happen), and the engine's gauges (queue, running
 * sequences, KV blocks, prefix cache) read from the batch snapshot /stats also reads.
 * The counters are process-wide (one server per process, as the process memory it also
 * reports); never waits for the engine. */
#include "server/server.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Upper bounds in seconds. TTFT: from 1 ms (a cached prompt on a tiny model) to 80 s (a
 * long prefill on the CPU); per token: from 1 ms (a tiny model) to 2.5 s (a large model
 * on the CPU). The same ranges as vLLM's, with a finer low end for small models. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75,  1,     2.5,  5,    7.5,  10,   20,   40,  80};
static const double tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                     0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1,     2.5};
#define N_TTFT (sizeof ttft_bounds / sizeof ttft_bounds[0])
#define N_TPOT (sizeof tpot_bounds / sizeof tpot_bounds[0])
_Static_assert(N_TPOT <= N_TTFT, "histogram.counts is sized for the longer bucket list");

typedef struct histogram {
    const double *bounds;
    size_t n_bounds;
    unsigned long long counts[N_TTFT + 1]; /* per bucket (not cumulative); [n_bounds]: above the last */
    double sum;
} histogram;

/* Every route x every status it gives is well under this; past it, a new pair is counted
 * in the last series rather than lost. */
#define MAX_REQUEST_SERIES 256

typedef struct request_series {
    char endpoint[40];
    int status;
    unsigned long long n;
} request_series;

static struct {
    pthread_mutex_t mu;
    request_series requests[MAX_REQUEST_SERIES];
    size_t n_requests;
    unsigned long long prompt_tokens, generation_tokens;
    histogram ttft, tpot;
} metrics = {.mu = PTHREAD_MUTEX_INITIALIZER,
             .ttft = {.bounds = ttft_bounds, .n_bounds = N_TTFT},
             .tpot = {.bounds = tpot_bounds, .n_bounds = N_TPOT}};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void observe(histogram *h, double v) {
    size_t b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
}

void srv_metrics_label(char *out, size_t cap, const char *url, int known_route) {
    /* the label set stays bounded: ids in paths are folded, unknown paths are "other" */
    if (!known_route)
        snprintf(out, cap, "other");
    else if (!strncmp(url, "/v1/responses/", 14))
        snprintf(out, cap, "/v1/responses/{id}");
    else if (!strncmp(url, "/v1/models/", 11))
        snprintf(out, cap, "/v1/models/{model}");
    else
        snprintf(out, cap, "%s", url);
}

void srv_metrics_request(const char *endpoint, int status) {
    pthread_mutex_lock(&metrics.mu);
    request_series *r = NULL;
    for (size_t i = 0; i < metrics.n_requests && !r; i++)
        if (metrics.requests[i].status == status && !strcmp(metrics.requests[i].endpoint, endpoint))
            r = &metrics.requests[i];
    if (!r && metrics.n_requests < MAX_REQUEST_SERIES) {
        r = &metrics.requests[metrics.n_requests++];
        snprintf(r->endpoint, sizeof r->endpoint, "%s", endpoint);
        r->status = status;
    }
    if (!r) r = &metrics.requests[MAX_REQUEST_SERIES - 1];
    r->n++;
    pthread_mutex_unlock(&metrics.mu);
}

void srv_metrics_submitted(srv_job *j) {
    j->submitted_at = now_seconds();
    pthread_mutex_lock(&metrics.mu);
    metrics.prompt_tokens += j->n_ids;
    pthread_mutex_unlock(&metrics.mu);
}

void srv_metrics_token(srv_job *j) {
    double now = now_seconds();
    pthread_mutex_lock(&metrics.mu);
    metrics.generation_tokens++;
    if (j->last_token_at > 0)
        observe(&metrics.tpot, now - j->last_token_at);
    else
        observe(&metrics.ttft, now - j->submitted_at);
    pthread_mutex_unlock(&metrics.mu);
    j->last_token_at = now;
}

static void family(sbuf *b, const char *name, const char *type, const char *help) {
    sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(sbuf *b, const char *name, const char *type, const char *help, double v) {
    family(b, name, type, help);
    sbuf_printf(b, "%s %.17g\n", name, v);
}

static void write_histogram(sbuf *b, const char *name, const char *help, const histogram *h) {
    family(b, name, "histogram", help);
    unsigned long long cumulative = 0;
    for (size_t i = 0; i <= h->n_bounds; i++) {
        cumulative += h->counts[i];
        if (i < h->n_bounds)
            sbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], cumulative);
        else
            sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, cumulative);
    }
    sbuf_printf(b, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, cumulative);
}

/* The endpoint label is a path we matched, so it has no quote or backslash to escape. */
static void write_counters(sbuf *b) {
    pthread_mutex_lock(&metrics.mu);
    family(b, "hearth_requests_total", "counter", "HTTP requests answered, by endpoint and status code");
    for (size_t i = 0; i < metrics.n_requests; i++)
        sbuf_printf(b, "hearth_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", metrics.requests[i].endpoint,
                    metrics.requests[i].status, metrics.requests[i].n);
    scalar(b, "hearth_prompt_tokens_total", "counter", "Prompt tokens of the generations submitted to the engine",
           (double)metrics.prompt_tokens);
    scalar(b, "hearth_generation_tokens_total", "counter", "Tokens generated", (double)metrics.generation_tokens);
    write_histogram(b, "hearth_time_to_first_token_seconds",
                    "From a generation's submission to the engine (queueing included) to its first token",
                    &metrics.ttft);
    write_histogram(b, "hearth_time_per_output_token_seconds", "Time between consecutive tokens of a generation",
                    &metrics.tpot);
    pthread_mutex_unlock(&metrics.mu);
}

static void write_engine(sbuf *b, srv_server *s) {
    hearth_batch_stats st;
    srv_queue_stats(s->queue, &st);
    scalar(b, "hearth_requests_waiting", "gauge", "Generations queued, not yet admitted to the engine",
           (double)srv_queue_depth(s->queue));
    scalar(b, "hearth_requests_running", "gauge", "Sequences the engine holds (prefilling or decoding)",
           (double)st.running);
    scalar(b, "hearth_kv_blocks_total", "gauge", "KV pool size in blocks of 16 positions", st.kv_blocks);
    scalar(b, "hearth_kv_blocks_used", "gauge", "KV blocks held by running sequences", st.kv_blocks_used);
    scalar(b, "hearth_kv_blocks_cached", "gauge", "Free KV blocks that still hold a reusable cached prefix",
           st.kv_blocks_cached);
    scalar(b, "hearth_kv_cache_usage_ratio", "gauge", "hearth_kv_blocks_used / hearth_kv_blocks_total (0 to 1)",
           st.kv_blocks > 0 ? (double)st.kv_blocks_used / st.kv_blocks : 0.0);
    scalar(b, "hearth_prefix_cache_queries_total", "counter",
           "Prompt tokens of admitted requests, looked up in the prefix cache", (double)st.prompt_tokens);
    scalar(b, "hearth_prefix_cache_hits_total", "counter", "Prompt tokens whose KV came from the prefix cache",
           (double)st.cached_tokens);
    scalar(b, "hearth_preemptions_total", "counter", "Running sequences preempted to free KV blocks",
           (double)st.preemptions);
    scalar(b, "hearth_engine_steps_total", "counter", "Forward steps the engine ran", (double)st.steps);
    scalar(b, "hearth_spec_lookup_proposed_tokens_total", "counter",
           "Tokens prompt lookup proposed for speculative verification", (double)st.spec_proposed[HEARTH_SPEC_LOOKUP]);
    scalar(b, "hearth_spec_lookup_accepted_tokens_total", "counter",
           "Proposed tokens that verification accepted (emitted without a step of their own)",
           (double)st.spec_accepted[HEARTH_SPEC_LOOKUP]);
    scalar(b, "hearth_spec_draft_proposed_tokens_total", "counter",
           "Tokens the draft model (--draft-model) proposed for speculative verification",
           (double)st.spec_proposed[HEARTH_SPEC_DRAFT]);
    scalar(b, "hearth_spec_draft_accepted_tokens_total", "counter", "Draft model tokens that verification accepted",
           (double)st.spec_accepted[HEARTH_SPEC_DRAFT]);
    scalar(b, "hearth_spec_suffix_proposed_tokens_total", "counter",
           "Tokens the recent outputs' suffix index (--speculate suffix) proposed for speculative verification",
           (double)st.spec_proposed[HEARTH_SPEC_SUFFIX]);
    scalar(b, "hearth_spec_suffix_accepted_tokens_total", "counter", "Suffix index tokens that verification accepted",
           (double)st.spec_accepted[HEARTH_SPEC_SUFFIX]);
}

int srv_metrics_respond(srv_server *s, srv_conn *c) {
    sbuf b;
    sbuf_init(&b);
    write_counters(&b);
    if (s->queue) write_engine(&b, s); /* an embedding-only server has no generation engine */
    hearth_process_memory pm;
    hearth_process_memory_get(&pm);
    scalar(&b, "process_resident_memory_bytes", "gauge", "Resident memory of the process", (double)pm.resident_bytes);
    scalar(&b, "hearth_process_peak_resident_memory_bytes", "gauge", "The process's resident high-water mark",
           (double)pm.peak_resident_bytes);
    if (s->on_gpu)
        scalar(&b, "hearth_device_peak_memory_bytes", "gauge", "Peak GPU memory in use (every process on the GPU)",
               (double)hearth_device_peak_bytes());
    if (b.oom) {
        sbuf_free(&b);
        return srv_respond(c, s, 500, "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}");
    }
    int rc = srv_respond_bytes(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, NULL);
    sbuf_free(&b);
    return rc;
}
