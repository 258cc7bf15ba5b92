/* engine_internal.h: what generate.c needs of the engine besides the public API. */
#ifndef HEARTH_ENGINE_ENGINE_INTERNAL_H
#define HEARTH_ENGINE_ENGINE_INTERNAL_H
#include "hearth.h"
#include "base/sbuf.h"
#include "ops/op_weight.h"
#include "base/threadpool.h"
#include "kv/kv_cache.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/fit_internal.h"
#include "backend/cuda/cuda_sample.h"

#define ENGINE_MAX_LOGITS_ROWS 8 /* rows of logits one append may return; decode needs 1 */
#define ENGINE_MAX_EOS 8

/* The model's end-of-sequence ids. */
int engine_eos_ids(const hearth_engine *e, const int32_t **ids);
sampler *engine_sampler(hearth_engine *e);
const int32_t *engine_history(const hearth_engine *e, int seq);
/* Sets the first n tokens of seq's history (a prompt prefix whose KV came from the prefix cache). */
void engine_history_write(hearth_engine *e, int seq, const int32_t *tokens, int n);
int engine_seq_length(const hearth_engine *e, int seq);
int engine_seq_is_open(const hearth_engine *e, int seq);
/* seq_file.c: a 64-bit name of the model's weights and config that saved KV files carry. */
uint64_t engine_model_identity(const hearth_engine *e);
/* hearth_seq_save of seq's first n positions (the scheduler's count of computed ones). */
hearth_status engine_seq_save_n(hearth_engine *e, int seq, int n, const char *path, hearth_error *err);
/* prompt_cache.c: the batch's prefix cache on disk (hearth_batch_prompt_cache): open
 * loads the folder's files into the pool's cache; note remembers a finished request's
 * history (seq's first n tokens; no disk work); flush saves what the pool still holds of
 * the noted histories (errors go to stderr: the server stops anyway). */
typedef struct prompt_cache prompt_cache;
hearth_status prompt_cache_open(hearth_engine *e, const char *dir, long long max_bytes, prompt_cache **out,
                                hearth_prompt_cache_report *rep, hearth_error *err);
void prompt_cache_note(prompt_cache *pc, hearth_engine *e, int seq, int n);
void prompt_cache_flush(prompt_cache *pc, hearth_engine *e);
void prompt_cache_free(prompt_cache *pc);
float *engine_logits_buffer(hearth_engine *e);
/* Tokens per forward step: the prefill chunk size. */
int engine_step_tokens(const hearth_engine *e);
const hearth_model *engine_model(const hearth_engine *e);
/* Weight trials (hearth_engine_quantize_weights): puts w in place of the loaded matrix read
 * from `tensor` (model_set_weight), on the CPU backend only; the engine owns `owned` (w's
 * memory) from now on, even when this fails. Restore puts every replaced matrix back and
 * frees those. */
hearth_status engine_trial_weight(hearth_engine *e, const char *tensor, const op_weight *w, void *owned,
                                  hearth_error *err);
void engine_trial_restore(hearth_engine *e);
/* The loaded matrix read from `tensor` as the forward pass sees it now, or NULL. */
const op_weight *engine_weight(const hearth_engine *e, const char *tensor);
/* Rows of logits one engine_forward_rows may return: max(ENGINE_MAX_LOGITS_ROWS, max_sequences),
 * plus SPEC_MAX_DRAFT when the engine speculates. */
int engine_max_out_rows(const hearth_engine *e);
int engine_max_sequences(const hearth_engine *e);
/* hearth_engine_options.speculate (hearth_speculate). */
int engine_speculate(const hearth_engine *e);
/* The engine's measured speculation cost (spec_cost), kept across its batches. */
struct spec_cost *engine_spec_cost(hearth_engine *e);
/* The draft model's engine (hearth_engine_options.draft_model), or NULL. */
hearth_engine *engine_draft(hearth_engine *e);
/* HEARTH_SPEC_MTP: the engine of the model's multi-token-prediction head (its steps need
 * hidden rows in), or NULL. */
hearth_engine *engine_mtp(hearth_engine *e);
/* The next forward passes' op_batch.hidden_in / hidden_out ([T, hidden] each; NULL: none),
 * until set again. */
void engine_step_hidden(hearth_engine *e, const float *in, float *out);
/* The model's hidden size (the rows of engine_step_hidden). */
int engine_hidden_size(const hearth_engine *e);
/* Where proposing stops on the engine's backend (spec.h: spec_limits_for with the model's
 * bytes a weight). */
spec_limits engine_spec_limits(const hearth_engine *e);
/* hearth_engine_options.spec_replay (benchmarks only), or NULL. */
const hearth_spec_replay *engine_spec_replay(const hearth_engine *e);
/* Sets position pos of seq's history (a proposed token, before the step that scores it). */
void engine_history_set(hearth_engine *e, int seq, int pos, int32_t token);
kv_cache *engine_kv(hearth_engine *e);
/* Copies rows positions of KV block src into block dst wherever the pool lives (host, or
 * the GPU's copy): a partial prefix match (kv_prefix_attach_partial). */
hearth_status engine_kv_copy_rows(hearth_engine *e, int32_t src, int32_t dst, int rows, hearth_error *err);
/* Saved KV files (seq_file.c), wherever the pools live (host, or the GPU's copies): seq's
 * positions [0, n) of (layer, KV head) in kv_slot_rows_read's form (the layer's own
 * head_dim), and seq's recurrent-state record (every state layer, kv_state's layout), to
 * the caller's buffers (to_host) or from them. */
hearth_status engine_kv_rows(hearth_engine *e, int layer, int seq, int head, int n, void *keys, void *values,
                             float *k_scale, float *v_scale, int to_host, hearth_error *err);
hearth_status engine_state_rows(hearth_engine *e, int seq, void *record, int to_host, hearth_error *err);
/* kv_state_snap_save / kv_state_snap_load on the engine's pool, and on the backend's device
 * copy of it where it has one (op_table.state_copy); a snapshot whose device copy failed is
 * forgotten, a failed load returns the error (the slot's state is then unusable). */
void engine_state_snap_save(hearth_engine *e, int slot, int len, uint64_t hash, int rolling);
hearth_status engine_state_snap_load(hearth_engine *e, int snap, int slot, hearth_error *err);
/* Speculation on a hybrid: slot's state into backup record j (< kv_state.n_spec) before a
 * step that verifies proposals (to_backup 1), and back when some are rejected (0); the
 * device copy too. */
hearth_status engine_state_spec_copy(hearth_engine *e, int slot, int j, int to_backup, hearth_error *err);
/* Where the backend has them (op_table.state_journal / state_replay; else
 * HEARTH_ERR_UNSUPPORTED): journal rec follows slot's Gated DeltaNet inputs from the next
 * step on (slot -1: none), and slot's state, put back to the backup, is taken through the
 * first n tokens of the last step again. */
hearth_status engine_state_journal(hearth_engine *e, int rec, int slot, hearth_error *err);
hearth_status engine_state_replay(hearth_engine *e, int slot, int rec, int n, hearth_error *err);
/* The engine's thread pool (for work between steps, e.g. sampling all rows at once). */
threadpool *engine_threads(hearth_engine *e);
/* The per-slot sampler the scheduler gives each running request (own seed, own RNG). */
sampler *engine_slot_sampler(hearth_engine *e, int seq);
/* One ragged step for the scheduler: T tokens (T <= step tokens) of open slots already
 * reserved through pos+1; records them in each slot's history, runs model_forward and
 * checks the n_out logits rows, left in *logits ([n_out, vocab], valid until the next call). */
hearth_status engine_forward_rows(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                  const int32_t *slot, int n_out, const int32_t *out_rows, const float **logits,
                                  hearth_error *err);

/* engine_forward_rows for rows that are all plain greedy, on the GPU engine only: ids[i]
 * gets the first index of the largest logit of row i, chosen on the device (no logits row
 * leaves it; a non-finite row fails with HEARTH_ERR_FORMAT). UNSUPPORTED on the CPU. */
hearth_status engine_forward_rows_greedy(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                         const int32_t *slot, int n_out, const int32_t *out_rows, int32_t *ids,
                                         hearth_error *err);
/* A logits row the device sampler draws (engine_forward_rows_sample): the request's
 * parameters, its Philox key (gen_device_seed) and where its logprobs go (NULL: none). The
 * row's history and position come from the step's slot and position. A constrained row
 * names its token mask's maker (gen_stream_allow with its gen_stream), called once the
 * step's forward pass is queued, so the mask is made while the GPU runs it. */
typedef struct engine_sample_row {
    const hearth_sampling *p;
    uint64_t seed;
    hearth_logprobs *lp;
    const uint32_t *(*allow)(void *ctx, int32_t *n);
    void *allow_ctx;
} engine_sample_row;
/* engine_forward_rows with every logits row's token sampled on the GPU (cuda_sample.cu:
 * sampler.c's semantics, its own draws): ids[i] for row i, logprobs into rows[i].lp; no
 * logits row leaves the device; a non-finite row fails with HEARTH_ERR_FORMAT.
 * UNSUPPORTED on the CPU. */
hearth_status engine_forward_rows_sample(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                         const int32_t *slot, int n_out, const int32_t *out_rows,
                                         const engine_sample_row *rows, int32_t *ids, hearth_error *err);
/* hearth_seq_append_greedy's counterpart for any sampling: *next is drawn on the device. */
hearth_status engine_seq_append_sample(hearth_engine *e, int seq, const int32_t *tokens, size_t n,
                                       const engine_sample_row *row, int32_t *next, hearth_error *err);
int engine_has_device_sampler(const hearth_engine *e);
/* hearth_engine_options.host_sampler: every token is picked on the host */
int engine_host_sampler(const hearth_engine *e);
/* Whether a request's tokens may come from engine_forward_rows_sample /
 * engine_seq_append_sample: the GPU engine with its sampler, parameters the device path
 * takes (cuda_sample_supported), and no host_sampler engine option (A/B: the host sampler). */
int gen_device_sample(const hearth_engine *e, const hearth_generate_params *p);
/* The Philox key of a request's device draws: its seed, or a fresh one when it has none. */
uint64_t gen_device_seed(const hearth_sampling *s);
/* Whether a request's tokens may come from engine_forward_rows_greedy /
 * hearth_seq_append_greedy: the engine runs on the GPU and the sampling is greedy with no
 * logprobs, penalties or logit bias (the sampler would then pick the same first-largest
 * index). The host_sampler engine option turns it off (A/B, parity). */
int gen_device_greedy(const hearth_engine *e, const hearth_generate_params *p);

double gen_now_seconds(void);
/* The tokenizer's vocabulary as the grammar engine reads it (built on first use, kept
 * with the engine); NULL when the model has no tokenizer or memory ran out. */
struct gvocab *engine_grammar_vocab(hearth_engine *e);
/* The end-of-sequence ids model hm declares (below vocab), as the engine collects them;
 * returns how many (at most ENGINE_MAX_EOS). */
int engine_model_eos(const hearth_model *hm, int vocab, int32_t ids[ENGINE_MAX_EOS]);
/* Host bytes engine_grammar_vocab's build takes for hm's tokenizer (vocab: the model's
 * logits rows, as the engine reads its eos ids): *tables, what the engine keeps from the
 * first constrained request on; *temporary, what the build holds besides at its worst (the
 * tokens handed to it, gvocab_footprint's). Both 0 without a tokenizer. 0 on out of memory. */
int engine_grammar_footprint(const hearth_model *hm, int vocab, size_t *tables, size_t *temporary);

struct adapter_set;
struct adapter_registry;
struct model;
/* Seq (open, nothing appended yet) computes with the adapters of set (NULL: the base
 * alone), holding its own reference until the slot closes; its prefix cache namespace
 * follows. HEARTH_ERR_INVALID for a closed or non-empty sequence. */
hearth_status engine_seq_use_adapters(hearth_engine *e, int seq, struct adapter_set *set);
struct adapter_registry *engine_adapters(hearth_engine *e);
const struct model *engine_weights(const hearth_engine *e);

/* Pending output text, held back while its end could still begin a stop string. */
typedef struct stop_filter {
    sbuf pending;
    const char *const *stop;
    size_t n_stop;
    size_t *prefix; /* every stop string's KMP prefix function, one after another */
} stop_filter;

/* The per-request token processing shared by hearth_generate and the scheduler: one
 * sampled token at a time through EOS / stop sequences / the detokenizer / stop strings
 * to the caller's callback, deciding the finish reason before the callback sees it. */
typedef struct gen_stream {
    hearth_engine *e;
    const hearth_generate_params *p;
    hearth_token_fn on_token;
    void *user;
    hearth_generate_result *res;
    hearth_detok_stream *ds;
    stop_filter f;
    hearth_logprobs lp;
    int trim;
    size_t n_prompt;
    struct adapter_set *adapters; /* the request's adapters (NULL: the base), released by gen_stream_free */
    /* the output constraint, when the request has one */
    struct grammar *grammar;
    struct gmatcher *matcher;
    float *masked;   /* logits with the disallowed tokens at -inf */
    uint32_t *mask;
} gen_stream;

/* Validates the request (prompt, max_tokens, context) and zeroes *res. */
hearth_status gen_stream_init(gen_stream *g, hearth_engine *e, size_t n_prompt, const hearth_generate_params *p,
                              hearth_token_fn on_token, void *user, hearth_generate_result *res, hearth_error *err);
/* Samples the next token of seq from logits (seq_len tokens are in its history, all
 * in the KV cache), emits its text and sets res->finish when it ends the request.
 * t0: when the request started (for first_token_seconds). */
int32_t gen_stream_step(gen_stream *g, sampler *smp, const float *logits, int seq, int seq_len, double t0);
/* gen_stream_step in two halves, so a caller can sample many requests' rows in one pass
 * (sampler_sample_rows) between them: the row to sample, then the sampled token's
 * processing (returns id). */
sampler_row gen_stream_row(gen_stream *g, sampler *smp, const float *logits, int seq, int seq_len);
int32_t gen_stream_accept(gen_stream *g, int32_t id, int seq, int seq_len, double t0);
/* Where the sampler leaves the stream's logprobs: g->lp when the request reports them, else
 * NULL (no log-softmax over the vocabulary per token). */
hearth_logprobs *gen_stream_lp(gen_stream *g);
/* A constrained stream's speculative proposal (tokens[0..n), already cut to what its grammar
 * allows) extended by what the grammar forces after it, spelled by the model's tokenizer
 * (gmatcher_extend_forced), up to cap tokens in all; returns the new count. */
size_t gen_stream_extend_forced(gen_stream *g, int32_t *tokens, size_t n, size_t cap);
/* A constrained stream's token mask for its next token (ctx: the gen_stream): bit v % 32 of
 * word v / 32 set where token v may follow, *n tokens covered (the grammar's vocabulary);
 * only the end-of-turn ids when nothing may follow. NULL for a stream without a constraint. */
const uint32_t *gen_stream_allow(void *ctx, int32_t *n);
void gen_stream_free(gen_stream *g);
/* A constraint's source compiled (constraint.c) for vocabulary v (NULL: only checked);
 * bad input is HEARTH_ERR_INVALID. */
struct grammar;
struct gvocab;
hearth_status engine_constraint_compile(hearth_constraint_kind kind, const char *text, size_t len,
                                        const struct gvocab *v, struct grammar **out, hearth_error *err);
/* The engine's compiled constraints (constraint.c): engine_constraint_get gives the grammar
 * of (kind, text) for vocabulary v, compiled once and shared (a reference), released with
 * engine_constraint_put. Any thread. */
typedef struct gram_cache gram_cache;
gram_cache *gram_cache_new(void);
void gram_cache_free(gram_cache *c);
gram_cache *engine_grammars(hearth_engine *e);
hearth_status engine_constraint_get(gram_cache *c, hearth_constraint_kind kind, const char *text, size_t len,
                                    const struct gvocab *v, struct grammar **out, hearth_error *err);
void engine_constraint_put(gram_cache *c, struct grammar *g);
#endif
