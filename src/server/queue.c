/* queue.c: the engine thread and the per-request event channels. HTTP threads
 * submit jobs (FIFO, so requests are admitted in arrival order) and read events;
 * only the engine thread touches the engine: it hands new jobs to a hearth_batch
 * (continuous batching: jobs join at the next step, leave when done) and runs
 * steps while any job is held. Must not format HTTP output. */
#include "server/server.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_queue {
    hearth_engine *engine;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job *head, *tail;
    size_t depth;        /* jobs not yet admitted: in this list or waiting in the batch */
    int stopping;
    hearth_batch *batch; /* engine thread only */
    hearth_batch_stats stats; /* the batch as of its last step, under mu (for /stats) */
};

/* The job outlives the HTTP request when the client leaves mid-generation, so it keeps
 * its own copies of everything the parameters point to (stop strings, stop token
 * sequences, logit bias). */
static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

static void job_free_params(srv_job *j) {
    hearth_generate_params *p = &j->params;
    for (size_t i = 0; p->stop && i < p->n_stop; i++) free((void *)p->stop[i]);
    for (size_t i = 0; p->stop_token_seqs && i < p->n_stop_token_seqs; i++) free((void *)p->stop_token_seqs[i]);
    free((void *)p->stop);
    free((void *)p->stop_token_seqs);
    free((void *)p->stop_token_lens);
    free((void *)p->sampling.bias_ids);
    free((void *)p->sampling.bias_values);
    free((void *)p->adapter);
    free((void *)p->constraint_text);
}

static int job_own_params(srv_job *j) {
    hearth_generate_params *p = &j->params, src = *p;
    p->stop = NULL, p->stop_token_seqs = NULL, p->stop_token_lens = NULL;
    p->sampling.bias_ids = NULL, p->sampling.bias_values = NULL;
    p->adapter = src.adapter ? strdup(src.adapter) : NULL;
    if (src.adapter && !p->adapter) return -1;
    p->constraint_text = NULL;
    if (src.constraint_text && !(p->constraint_text = dup_bytes(src.constraint_text, src.constraint_len + 1))) return -1;
    char **stop = calloc(src.n_stop + 1, sizeof *stop);
    int32_t **seqs = calloc(src.n_stop_token_seqs + 1, sizeof *seqs);
    p->stop = (const char *const *)stop;
    p->stop_token_seqs = (const int32_t *const *)seqs;
    p->stop_token_lens = dup_bytes(src.stop_token_lens, src.n_stop_token_seqs * sizeof(size_t));
    p->sampling.bias_ids = dup_bytes(src.sampling.bias_ids, src.sampling.n_bias * sizeof(int32_t));
    p->sampling.bias_values = dup_bytes(src.sampling.bias_values, src.sampling.n_bias * sizeof(float));
    if (!stop || !seqs || !p->stop_token_lens || !p->sampling.bias_ids || !p->sampling.bias_values) return -1;
    for (size_t i = 0; i < src.n_stop; i++)
        if (!(stop[i] = strdup(src.stop[i]))) return -1;
    for (size_t i = 0; i < src.n_stop_token_seqs; i++)
        if (!(seqs[i] = dup_bytes(src.stop_token_seqs[i], src.stop_token_lens[i] * sizeof(int32_t)))) return -1;
    return 0;
}

srv_job *srv_job_new(int32_t *ids, size_t n_ids, const hearth_generate_params *p) {
    srv_job *j = calloc(1, sizeof *j);
    /* the DONE event is allocated up front so a finished job can always say so */
    srv_event *done = calloc(1, sizeof *done + 1);
    if (!j || !done) {
        free(j);
        free(done);
        return NULL;
    }
    done->kind = SRV_EV_DONE;
    j->done_event = done;
    j->ids = ids;
    j->n_ids = n_ids;
    j->params = *p;
    if (job_own_params(j)) {
        free(done);
        job_free_params(j);
        free(j);
        return NULL;
    }
    j->refs = 2;
    atomic_init(&j->cancel, 0);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    for (srv_event *ev = j->head, *next; ev; ev = next) {
        next = ev->next;
        free(ev);
    }
    free(j->done_event);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->ids);
    job_free_params(j);
    free(j);
}

static void push(srv_job *j, srv_event *ev) {
    pthread_mutex_lock(&j->mu);
    if (j->tail)
        j->tail->next = ev;
    else
        j->head = ev;
    j->tail = ev;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

srv_event *srv_job_next_event(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    while (!j->head) pthread_cond_wait(&j->cv, &j->mu);
    srv_event *ev = j->head;
    j->head = ev->next;
    if (!j->head) j->tail = NULL;
    pthread_mutex_unlock(&j->mu);
    ev->next = NULL;
    return ev;
}

/* The engine's callbacks: copy what the HTTP side needs and report
 * cancellation. When an event cannot be allocated the job is cancelled rather
 * than losing text silently. */
static int on_token(void *user, int32_t token, const char *text, const hearth_logprobs *lp) {
    srv_job *j = user;
    size_t n = strlen(text);
    long call_end = j->watch_calls ? ts_call_watch_feed(&j->call_watch, text, n) : -1;
    if (call_end >= 0) { /* what follows the call's end in this token is not shown */
        n = (size_t)call_end;
        j->result.finish = HEARTH_FINISH_EOS;
    }
    srv_event *ev = calloc(1, sizeof *ev + n + 1);
    if (!ev) return 1;
    ev->kind = SRV_EV_TOKEN;
    ev->token = token;
    ev->finish = j->result.finish; /* hearth_generate decides the finish before emitting */
    ev->call_ended = call_end >= 0;
    if (lp) {
        ev->has_lp = 1;
        ev->lp = *lp;
    }
    memcpy(ev->text, text, n);
    ev->text[n] = 0;
    srv_metrics_token(j);
    push(j, ev);
    return call_end >= 0 || atomic_load(&j->cancel);
}

static int on_progress(void *user, size_t done, size_t total) {
    srv_job *j = user;
    srv_event *ev = calloc(1, sizeof *ev + 1);
    if (!ev) return 1;
    ev->kind = SRV_EV_PROGRESS;
    ev->done = done;
    ev->total = total;
    push(j, ev);
    return atomic_load(&j->cancel);
}

static void finish(srv_job *j) {
    srv_event *ev = j->done_event;
    j->done_event = NULL;
    pthread_mutex_lock(&j->mu);
    j->finished = 1;
    pthread_mutex_unlock(&j->mu);
    push(j, ev);
}

static int is_cancelled(void *user) {
    srv_job *j = user;
    return atomic_load(&j->cancel);
}

/* Jobs the engine thread ended since it last published the batch's statistics, newest
 * first (linked through next_in_queue, free once a job is taken from the queue's list).
 * Their done events go out after the step's statistics are published (publish_done), so a
 * client that reads /stats or /metrics right after its answer sees the step that answered
 * it counted (its tokens streamed as they came; only the end waits for the step's end). */
static _Thread_local srv_job *done_jobs;

static void on_done(void *user, hearth_status st, const hearth_error *err) {
    srv_job *j = user;
    j->status = st;
    if (st && err) j->err = *err;
    j->next_in_queue = done_jobs;
    done_jobs = j;
}

/* The ended jobs' done events, in the order they ended. */
static void publish_done(void) {
    srv_job *rev = NULL;
    for (srv_job *j = done_jobs, *next; j; j = next) next = j->next_in_queue, j->next_in_queue = rev, rev = j;
    done_jobs = NULL;
    for (srv_job *j = rev, *next; j; j = next) {
        next = j->next_in_queue;
        finish(j);
        srv_job_release(j);
    }
}

/* Hands a job to the batch; one the batch refuses at once (invalid) ends here. */
static void admit_job(srv_queue *q, srv_job *j) {
    if (atomic_load(&j->cancel)) {
        j->result.finish = HEARTH_FINISH_CANCELLED;
        on_done(j, HEARTH_OK, NULL);
        return;
    }
    j->params.on_progress = on_progress;
    hearth_batch_request r = {.prompt = j->ids, .n_prompt = j->n_ids, .params = &j->params, .on_token = on_token,
                              .is_cancelled = is_cancelled, .on_done = on_done, .result = &j->result, .user = j};
    hearth_error err = {0};
    hearth_status st = hearth_batch_submit(q->batch, &r, &err);
    if (st) on_done(j, st, &err);
}

/* Taken on the engine thread between steps, copied under mu: /stats never waits for a
 * step, only for this copy. */
static void publish_stats(srv_queue *q) {
    hearth_batch_stats now;
    hearth_batch_stats_get(q->batch, &now);
    pthread_mutex_lock(&q->mu);
    q->stats = now;
    pthread_mutex_unlock(&q->mu);
}

void srv_queue_stats(srv_queue *q, hearth_batch_stats *out) {
    pthread_mutex_lock(&q->mu);
    *out = q->stats;
    pthread_mutex_unlock(&q->mu);
}

static void *engine_main(void *arg) {
    srv_queue *q = arg;
    size_t held = 0; /* jobs in the batch */
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->head && !held && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
        srv_job *jobs = q->head; /* take every new job: they join at the next step */
        q->head = q->tail = NULL;
        int stopping = q->stopping;
        pthread_mutex_unlock(&q->mu);
        for (srv_job *j = jobs, *next; j; j = next) {
            next = j->next_in_queue;
            if (stopping) atomic_store(&j->cancel, 1);
            admit_job(q, j);
        }
        if (stopping) break;
        held = hearth_batch_step(q->batch);
        pthread_mutex_lock(&q->mu);
        /* depth: jobs still waiting, in the list or in the batch */
        size_t listed = 0;
        for (srv_job *j = q->head; j; j = j->next_in_queue) listed++;
        q->depth = listed + hearth_batch_waiting(q->batch);
        pthread_mutex_unlock(&q->mu);
        publish_stats(q);
        publish_done();
    }
    hearth_batch_free(q->batch); /* ends what is still held as cancelled */
    q->batch = NULL;
    publish_done();
    return NULL;
}

hearth_status srv_queue_start(hearth_engine *e, const char *prompt_cache_dir, long long prompt_cache_bytes,
                              hearth_prompt_cache_report *report, srv_queue **out, hearth_error *err) {
    srv_queue *q = calloc(1, sizeof *q);
    if (!q) {
        err->status = HEARTH_ERR_NOMEM;
        snprintf(err->message, sizeof err->message, "out of memory");
        return HEARTH_ERR_NOMEM;
    }
    q->engine = e;
    hearth_status st = hearth_batch_create(e, &q->batch, err);
    if (!st && prompt_cache_dir)
        if ((st = hearth_batch_prompt_cache(q->batch, prompt_cache_dir, prompt_cache_bytes, report, err)))
            hearth_batch_free(q->batch);
    if (st) {
        free(q);
        return st;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    hearth_batch_stats_get(q->batch, &q->stats);
    if (pthread_create(&q->thread, NULL, engine_main, q)) {
        hearth_batch_free(q->batch);
        free(q);
        err->status = HEARTH_ERR_NOMEM;
        snprintf(err->message, sizeof err->message, "could not start the engine thread");
        return HEARTH_ERR_NOMEM;
    }
    *out = q;
    return HEARTH_OK;
}

void srv_queue_submit(srv_queue *q, srv_job *j) {
    srv_metrics_submitted(j);
    pthread_mutex_lock(&q->mu);
    j->next_in_queue = NULL;
    if (q->tail)
        q->tail->next_in_queue = j;
    else
        q->head = j;
    q->tail = j;
    q->depth++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

size_t srv_queue_depth(srv_queue *q) {
    pthread_mutex_lock(&q->mu);
    size_t d = q->depth;
    pthread_mutex_unlock(&q->mu);
    return d;
}

void srv_queue_stop(srv_queue *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}
