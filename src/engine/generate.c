/* generate.c: one request from prompt to finish: prefill, then sample / append one
 * token at a time. The per-token processing (sampling, EOS and stop sequences, streaming
 * text through the detokenizer with stop strings held back until they can no longer
 * match, the finish reason) is gen_stream, shared with the batch scheduler. */
#define _GNU_SOURCE
#include "model/model_handle.h"
#include "base/err.h"
#include "base/sbuf.h"
#include "engine/engine_internal.h"
#include "engine/adapter.h"
#include "engine/engine_device.h"
#include "grammar/grammar.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double gen_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *hearth_finish_name(hearth_finish f) {
    switch (f) {
    case HEARTH_FINISH_EOS: case HEARTH_FINISH_STOP_STRING: return "stop";
    case HEARTH_FINISH_LENGTH: case HEARTH_FINISH_CONTEXT: return "length";
    case HEARTH_FINISH_CANCELLED: return "cancelled";
    case HEARTH_FINISH_NONE: break;
    }
    return "none";
}

void hearth_sampling_defaults(const hearth_model *m, hearth_sampling *s) {
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
    s->repetition_context_size = 20;
    const json_t *g = m ? m->generation_config : NULL;
    if (!g) return;
    const json_t *v;
    if (json_is_true(json_object_get(g, "do_sample"))) { /* HF only samples when do_sample is set */
        s->temperature = 1.0f;
        if (json_is_number(v = json_object_get(g, "temperature"))) s->temperature = (float)json_number_value(v);
        if (json_is_number(v = json_object_get(g, "top_p"))) s->top_p = (float)json_number_value(v);
        if (json_is_integer(v = json_object_get(g, "top_k"))) s->top_k = (int)json_integer_value(v);
        if (json_is_number(v = json_object_get(g, "min_p"))) s->min_p = (float)json_number_value(v);
    }
    if (json_is_number(v = json_object_get(g, "repetition_penalty"))) s->repetition_penalty = (float)json_number_value(v);
}

/* The KMP prefix function of every stop string (pi[k]: the longest proper prefix of
 * s[0..k] that is also its suffix), for stop_feed's held-back tail. */
static int stop_prefix_functions(stop_filter *f) {
    size_t total = 0;
    for (size_t i = 0; i < f->n_stop; i++) total += strlen(f->stop[i]);
    f->prefix = NULL;
    if (!total) return 0;
    if (!(f->prefix = malloc(total * sizeof *f->prefix))) return -1;
    size_t *pi = f->prefix;
    for (size_t i = 0; i < f->n_stop; pi += strlen(f->stop[i]), i++) {
        const char *s = f->stop[i];
        size_t sl = strlen(s), q = 0;
        if (sl) pi[0] = 0;
        for (size_t k = 1; k < sl; k++) {
            while (q && s[q] != s[k]) q = pi[q - 1];
            if (s[q] == s[k]) q++;
            pi[k] = q;
        }
    }
    return 0;
}

/* Appends piece; returns how many leading bytes of pending are final, and sets *hit
 * when a stop string occurs (pending is then cut at its start). */
static size_t stop_feed(stop_filter *f, const char *piece, int *hit) {
    sbuf_puts(&f->pending, piece);
    const char *text = f->pending.data ? f->pending.data : "";
    size_t len = f->pending.len, cut = len;
    *hit = 0;
    for (size_t i = 0; i < f->n_stop; i++) {
        if (!f->stop[i][0]) continue;
        const char *at = memmem(text, len, f->stop[i], strlen(f->stop[i]));
        if (at && (size_t)(at - text) < cut) { cut = (size_t)(at - text); *hit = 1; }
    }
    if (*hit) {
        f->pending.len = cut;
        f->pending.data[cut] = 0;
        return cut;
    }
    /* the longest suffix that is a proper prefix of a stop string: a KMP pass of each
     * string over the text's last bytes, so a token costs the stop strings' length,
     * never its square */
    size_t hold = 0;
    const size_t *pi = f->prefix;
    for (size_t i = 0; i < f->n_stop; pi += strlen(f->stop[i]), i++) {
        const char *s = f->stop[i];
        size_t sl = strlen(s), q = 0;
        if (!pi || sl < 2) continue;
        for (size_t j = len > sl - 1 ? len - (sl - 1) : 0; j < len; j++) {
            while (q && s[q] != text[j]) q = pi[q - 1];
            if (s[q] == text[j]) q++;
        }
        if (q > hold) hold = q;
    }
    return len - hold;
}

/* Emits the first n bytes of pending through the callback (with this token's id). */
static int emit(stop_filter *f, size_t n, hearth_token_fn cb, void *user, int32_t id, const hearth_logprobs *lp) {
    char save = f->pending.data ? f->pending.data[n] : 0;
    if (f->pending.data) f->pending.data[n] = 0;
    int rc = cb ? cb(user, id, f->pending.data ? f->pending.data : "", lp) : 0;
    if (f->pending.data) {
        f->pending.data[n] = save;
        memmove(f->pending.data, f->pending.data + n, f->pending.len - n + 1);
        f->pending.len -= n;
    }
    return rc;
}

/* Appends the prompt; with a progress callback it goes in chunks of the engine's step
 * size (the same chunks hearth_seq_append uses) so the caller can report progress. */
static hearth_status prefill(hearth_engine *e, int seq, const int32_t *prompt, size_t n, float *logits,
                             const hearth_generate_params *p, void *user, hearth_generate_result *res,
                             hearth_error *err) {
    if (!p->on_progress) return hearth_seq_append(e, seq, prompt, n, 1, logits, err);
    size_t step = (size_t)engine_step_tokens(e), done = 0;
    if (p->on_progress(user, 0, n)) { res->finish = HEARTH_FINISH_CANCELLED; return HEARTH_OK; }
    while (done < n) {
        size_t k = n - done < step ? n - done : step;
        int last = done + k == n;
        hearth_status st = hearth_seq_append(e, seq, prompt + done, k, last ? 1 : 0, last ? logits : NULL, err);
        if (st) return st;
        done += k;
        if (p->on_progress(user, done < n ? done : n - 1, n)) { res->finish = HEARTH_FINISH_CANCELLED; break; }
    }
    return HEARTH_OK;
}

/* Whether generated[0..n) followed by id ends with one of the token stop sequences. */
static int ends_with_stop_seq(const hearth_generate_params *p, const int32_t *generated, size_t n, int32_t id) {
    for (size_t i = 0; i < p->n_stop_token_seqs; i++) {
        size_t len = p->stop_token_lens[i];
        const int32_t *seq = p->stop_token_seqs[i];
        if (len == 0 || len > n + 1 || seq[len - 1] != id) continue;
        if (!memcmp(generated + n - (len - 1), seq, (len - 1) * sizeof *seq)) return 1;
    }
    return 0;
}

/* The request's constraint: its grammar, a matcher and the buffers the masked row needs. */
static hearth_status constraint_init(gen_stream *g, hearth_engine *e, const hearth_generate_params *p,
                                     hearth_error *err) {
    if (p->constraint == HEARTH_CONSTRAINT_NONE) return HEARTH_OK;
    gvocab *v = engine_grammar_vocab(e);
    if (!v) return err_set(err, HEARTH_ERR_UNSUPPORTED, "a constraint needs the model's tokenizer");
    hearth_status st = engine_constraint_get(engine_grammars(e), p->constraint, p->constraint_text, p->constraint_len, v,
                                             &g->grammar, err);
    if (st) return st;
    size_t rows = (size_t)hearth_model_vocab_rows(e);
    g->matcher = gmatcher_new(g->grammar, v);
    g->masked = malloc(rows * sizeof *g->masked);
    g->mask = malloc(((size_t)gvocab_size(v) + 31) / 32 * sizeof *g->mask);
    if (!g->matcher || !g->masked || !g->mask) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    return HEARTH_OK;
}

hearth_status gen_stream_init(gen_stream *g, hearth_engine *e, size_t n_prompt, const hearth_generate_params *p,
                              hearth_token_fn on_token, void *user, hearth_generate_result *res, hearth_error *err) {
    memset(g, 0, sizeof *g);
    memset(res, 0, sizeof *res);
    int ctx = hearth_engine_context_length(e);
    if (n_prompt == 0) return err_set(err, HEARTH_ERR_INVALID, "the prompt is empty");
    if (p->max_tokens <= 0) return err_set(err, HEARTH_ERR_INVALID, "max_tokens must be at least 1 (got %d)", p->max_tokens);
    if (n_prompt >= (size_t)ctx)
        return err_set(err, HEARTH_ERR_INVALID,
                       "the prompt has %zu tokens but the context holds %d (prompt and at least one new token)",
                       n_prompt, ctx);
    const hearth_model *hm = engine_model(e);
    g->ds = hearth_detok_stream_new(hm, 0);
    if (!g->ds) return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: no tokenizer to decode the output", hm->entry.path);
    g->e = e;
    g->p = p;
    g->on_token = on_token;
    g->user = user;
    g->res = res;
    g->n_prompt = n_prompt;
    g->f.stop = p->stop;
    g->f.n_stop = p->n_stop;
    sbuf_init(&g->f.pending);
    if (stop_prefix_functions(&g->f)) {
        gen_stream_free(g);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    g->lp.n = p->sampling.top_logprobs;
    g->trim = p->trim_leading_space;
    res->prompt_tokens = n_prompt;
    hearth_status st = adapter_registry_resolve(engine_adapters(e), p->adapter, &g->adapters, err);
    if (!st) st = constraint_init(g, e, p, err);
    if (st) gen_stream_free(g);
    return st;
}

void gen_stream_free(gen_stream *g) {
    if (g->e) adapter_set_release(engine_adapters(g->e), g->adapters);
    gmatcher_free(g->matcher);
    engine_constraint_put(engine_grammars(g->e), g->grammar);
    free(g->masked);
    free(g->mask);
    hearth_detok_stream_free(g->ds);
    sbuf_free(&g->f.pending);
    free(g->f.prefix);
    memset(g, 0, sizeof *g);
}

hearth_logprobs *gen_stream_lp(gen_stream *g) { return g->p->sampling.top_logprobs ? &g->lp : NULL; }

const uint32_t *gen_stream_allow(void *ctx, int32_t *n_out) {
    gen_stream *g = ctx;
    if (!g->matcher) return NULL;
    size_t n = (size_t)gvocab_size(engine_grammar_vocab(g->e));
    if (!gmatcher_mask(g->matcher, g->mask)) {
        /* nothing may follow (the grammar is stuck): only the end of the turn */
        const int32_t *eos;
        int n_eos = engine_eos_ids(g->e, &eos);
        memset(g->mask, 0, (n + 31) / 32 * sizeof *g->mask);
        for (int i = 0; i < n_eos; i++)
            if ((size_t)eos[i] < n) g->mask[eos[i] >> 5] |= 1u << (eos[i] & 31);
    }
    *n_out = (int32_t)n;
    return g->mask;
}

/* The model's tokenizer spelling a grammar's forced bytes the way the model was trained to
 * read them (BPE keeps the last space of a run for the word after it: "\n   " + " \"",
 * where the longest tokens would take "\n    " + "\""). */
static size_t spell_bytes(void *ctx, const char *bytes, size_t n, int32_t *out, size_t cap) {
    const tok_tokenizer *t = ctx;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    hearth_error err = {0};
    if (!t || tok_encode(t, bytes, n, 0, &ids, &n_ids, &err)) return 0;
    if (n_ids > cap) n_ids = cap;
    memcpy(out, ids, n_ids * sizeof *ids);
    free(ids);
    return n_ids;
}

size_t gen_stream_extend_forced(gen_stream *g, int32_t *tokens, size_t n, size_t cap) {
    return gmatcher_extend_forced(g->matcher, tokens, n, cap, spell_bytes, engine_model(g->e)->tok);
}

/* logits with every token the constraint forbids at -inf (into g->masked) */
static const float *constrained_logits(gen_stream *g, const float *logits) {
    size_t rows = (size_t)hearth_model_vocab_rows(g->e);
    int32_t n32 = 0;
    gen_stream_allow(g, &n32);
    size_t n = (size_t)n32;
    /* a word of the mask at a time: in most states a word allows none of its 32 tokens (in
     * structure) or all of them, a fill or a copy; the others a branch-free blend (a bit test
     * and branch per token was ~8% of a 32-stream CPU server's time) */
    size_t whole = n < rows ? n : rows, i = 0;
    for (; i + 32 <= whole; i += 32) {
        uint32_t w = g->mask[i >> 5];
        if (w == 0)
            for (int k = 0; k < 32; k++) g->masked[i + k] = -INFINITY;
        else if (w == UINT32_MAX)
            memcpy(g->masked + i, logits + i, 32 * sizeof *logits);
        else /* the float's bits kept or replaced by -inf's */
            for (int k = 0; k < 32; k++) {
                uint32_t keep = 0u - (w >> k & 1), v;
                memcpy(&v, logits + i + k, sizeof v);
                v = (v & keep) | (0xff800000u & ~keep);
                memcpy(g->masked + i + k, &v, sizeof v);
            }
    }
    for (; i < rows; i++) g->masked[i] = i < n && (g->mask[i >> 5] >> (i & 31) & 1) ? logits[i] : -INFINITY;
    return g->masked;
}

sampler_row gen_stream_row(gen_stream *g, sampler *smp, const float *logits, int seq, int seq_len) {
    if (g->matcher && logits) logits = constrained_logits(g, logits); /* no logits: the device drew it, masked */
    return (sampler_row){.s = smp,
                         .logits = logits,
                         .p = &g->p->sampling,
                         .history = engine_history(g->e, seq),
                         .n_history = (size_t)seq_len,
                         .lp = gen_stream_lp(g),
                         .full_logprobs = g->res->completion_tokens == 0 ? g->p->first_logprobs : NULL,
                         .token = -1};
}

/* Greedy with no logprobs, penalties or bias: the argmax of the raw logits. */
static int plain_greedy(const hearth_sampling *s) {
    return !(s->temperature > 0) && s->n_bias == 0 && s->top_logprobs == 0 &&
           (s->repetition_penalty <= 0 || s->repetition_penalty == 1.0f) && s->presence_penalty == 0 &&
           s->frequency_penalty == 0 && !sampler_lab_active(s);
}

int gen_device_greedy(const hearth_engine *e, const hearth_generate_params *p) {
    if (p->constraint != HEARTH_CONSTRAINT_NONE) return 0; /* the mask is applied on the host */
    if (hearth_engine_device(e) != HEARTH_DEVICE_CUDA || engine_host_sampler(e)) return 0;
    return plain_greedy(&p->sampling) && !p->first_logprobs;
}

int gen_device_sample(const hearth_engine *e, const hearth_generate_params *p) {
    if (hearth_engine_device(e) != HEARTH_DEVICE_CUDA || !engine_has_device_sampler(e) || engine_host_sampler(e))
        return 0;
    /* the lab's stages and the full first-step log-probabilities are the host's */
    if (sampler_lab_active(&p->sampling) || p->first_logprobs) return 0;
    return engine_device_sample_supported(&p->sampling);
}

uint64_t gen_device_seed(const hearth_sampling *s) {
    if (s->has_seed) return s->seed;
    static uint64_t calls; /* distinct keys for requests started in the same nanosecond */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
                 __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finalizer */
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int32_t gen_stream_step(gen_stream *g, sampler *smp, const float *logits, int seq, int seq_len, double t0) {
    sampler_row r = gen_stream_row(g, smp, logits, seq, seq_len);
    sampler_sample_rows(&r, 1, NULL);
    return gen_stream_accept(g, r.token, seq, seq_len, t0);
}

/* mlx-lm drops a leading space of every piece while no text has been shown yet (the
 * held-back text flushed at the end included). */
static const char *trim_leading(gen_stream *g, const char *piece) {
    if (!g->trim) return piece;
    if (piece[0] == ' ') piece++;
    if (piece[0]) g->trim = 0;
    return piece;
}

int32_t gen_stream_accept(gen_stream *g, int32_t id, int seq, int seq_len, double t0) {
    hearth_engine *e = g->e;
    const hearth_generate_params *p = g->p;
    hearth_generate_result *res = g->res;
    const int32_t *eos;
    int n_eos = engine_eos_ids(e, &eos);
    if (res->completion_tokens == 0) {
        res->first_token_seconds = gen_now_seconds() - t0;
        if (p->on_progress && p->on_progress(g->user, g->n_prompt, g->n_prompt)) res->finish = HEARTH_FINISH_CANCELLED;
    }
    res->completion_tokens++;
    int is_eos = 0;
    for (int i = 0; i < n_eos && !p->ignore_eos; i++) is_eos |= eos[i] == id;
    int token_stop = !is_eos && ends_with_stop_seq(p, engine_history(e, seq) + g->n_prompt,
                                                   res->completion_tokens - 1, id);
    is_eos |= token_stop; /* ends like EOS: nothing more of this token is shown */
    /* the constraint follows every token; once the sentence is complete with nothing to
     * follow, its mask holds only the end-of-turn ids, so the next token ends the request
     * the way the model's own end does (and the last token's text is shown) */
    if (g->matcher && !is_eos) gmatcher_accept(g->matcher, id);
    int hit = 0;
    const char *piece = is_eos ? "" : trim_leading(g, hearth_detok_stream_push(g->ds, id));
    size_t ready = is_eos ? 0 : stop_feed(&g->f, piece, &hit);
    if (token_stop) res->finish = HEARTH_FINISH_STOP_STRING;
    else if (is_eos) res->finish = HEARTH_FINISH_EOS;
    else if (hit) res->finish = HEARTH_FINISH_STOP_STRING;
    else if (res->completion_tokens >= (size_t)p->max_tokens) res->finish = HEARTH_FINISH_LENGTH;
    else if (seq_len + 1 > hearth_engine_context_length(e)) res->finish = HEARTH_FINISH_CONTEXT;
    if (res->finish == HEARTH_FINISH_LENGTH || res->finish == HEARTH_FINISH_CONTEXT || is_eos) {
        int h2 = 0; /* flush what the detokenizer held back, still honouring stop strings */
        stop_feed(&g->f, trim_leading(g, hearth_detok_stream_finish(g->ds)), &h2);
        if (h2) res->finish = HEARTH_FINISH_STOP_STRING;
        ready = g->f.pending.len;
    }
    if (emit(&g->f, ready, g->on_token, g->user, id, gen_stream_lp(g)) && !res->finish)
        res->finish = HEARTH_FINISH_CANCELLED;
    return id;
}

hearth_status hearth_generate_seq(hearth_engine *e, int seq, const int32_t *prompt, size_t n_prompt,
                                  const hearth_generate_params *p, hearth_token_fn on_token, void *user,
                                  hearth_generate_result *res, hearth_error *err) {
    hearth_generate_result local;
    if (!res) res = &local;
    if (!engine_seq_is_open(e, seq)) return err_set(err, HEARTH_ERR_INVALID, "sequence %d is not open", seq);
    size_t have = (size_t)engine_seq_length(e, seq);
    if (have >= n_prompt || (have && memcmp(engine_history(e, seq), prompt, have * sizeof *prompt)))
        return err_set(err, HEARTH_ERR_INVALID,
                       "sequence %d holds %zu tokens that are not a proper prefix of the %zu-token prompt", seq, have,
                       n_prompt);
    gen_stream g;
    hearth_status st = gen_stream_init(&g, e, n_prompt, p, on_token, user, res, err);
    if (st) return st;
    res->cached_tokens = have;
    if (engine_seq_use_adapters(e, seq, g.adapters)) {
        gen_stream_free(&g);
        return err_set(err, HEARTH_ERR_INVALID,
                       "sequence %d holds %zu tokens computed with other adapters than the request's: "
                       "adapters are chosen when a sequence is empty",
                       seq, have);
    }
    if (p->sampling.has_seed) sampler_seed(engine_sampler(e), p->sampling.seed);
    float *logits = engine_logits_buffer(e);
    /* plain greedy on the GPU: after the first token only the chosen id leaves the device;
     * any other sampling on the GPU: every token drawn there (the first too, without a
     * progress callback), only ids and requested logprobs come back */
    int dev_greedy = gen_device_greedy(e, p), dev_sample = !dev_greedy && gen_device_sample(e, p);
    engine_sample_row row = {.p = &p->sampling, .seed = gen_device_seed(&p->sampling), .lp = gen_stream_lp(&g),
                             .allow = g.matcher ? gen_stream_allow : NULL, .allow_ctx = &g};
    int32_t next = -1;
    double t0 = gen_now_seconds();
    st = dev_sample && !p->on_progress ? engine_seq_append_sample(e, seq, prompt + have, n_prompt - have, &row, &next, err)
                                       : prefill(e, seq, prompt + have, n_prompt - have, logits, p, user, res, err);
    res->prompt_seconds = gen_now_seconds() - t0;
    double t1 = gen_now_seconds();
    while (!st && !res->finish) {
        int len = engine_seq_length(e, seq);
        int32_t id = next >= 0 ? gen_stream_accept(&g, next, seq, len, t0)
                               : gen_stream_step(&g, engine_sampler(e), logits, seq, len, t0);
        if (res->finish) break;
        st = dev_greedy   ? hearth_seq_append_greedy(e, seq, &id, 1, &next, err)
             : dev_sample ? engine_seq_append_sample(e, seq, &id, 1, &row, &next, err)
                          : hearth_seq_append(e, seq, &id, 1, 1, logits, err);
    }
    res->generate_seconds = gen_now_seconds() - t1;
    gen_stream_free(&g);
    return st;
}

hearth_status hearth_generate(hearth_engine *e, const int32_t *prompt, size_t n_prompt,
                              const hearth_generate_params *p, hearth_token_fn on_token, void *user,
                              hearth_generate_result *res, hearth_error *err) {
    int seq;
    hearth_status st = hearth_seq_open(e, &seq, err);
    if (st) return st;
    st = hearth_generate_seq(e, seq, prompt, n_prompt, p, on_token, user, res, err);
    hearth_seq_close(e, seq);
    return st;
}
