/* engine.c: the generation engine behind the public API: loads the weights, allocates
 * the KV pool and scratch once, runs sequences through model_forward in steps of at most
 * max_step_tokens, and drives sampling, streaming text and stop conditions. Runs on the
 * caller's thread; batching several sequences per step is scheduler.c's job, through
 * engine_forward_rows. */
#define _GNU_SOURCE
#include "model/model_handle.h"
#include "base/err.h"
#include "base/mem_touch.h"
#include "base/sbuf.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec.h"
#include "kv/kv_state.h"
#include "model/model.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include <stdio.h>
#include "backend/cpu/bandwidth.h"
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "grammar/grammar.h"
#include "engine/engine_plan.h"
#include "kv/kv_prefix.h"
#include "engine/engine_device.h"
#include "engine/adapter.h"

struct hearth_engine {
    hearth_model *hm;
    gvocab *gvocab; /* the grammar engine's view of the vocabulary, built on first use */
    pthread_mutex_t gvocab_mu; /* that first use may come from any thread */
    gram_cache *grammars;      /* compiled constraints (constraint.c) */
    model *m;
    kv_cache kv;
    op_backend *be;    /* where the forward pass runs: the CPU backend, or the GPU's (then gpu = 1) */
    int gpu;
    threadpool *tp;
    int n_threads, context, step_tokens, max_seqs, max_out;
    int kv_cut_from;   /* engine_plan.kv_cut_from: the default pool was cut to fit memory */
    int context_cut_from; /* engine_plan.context_cut_from: the default context was cut to fit memory */
    int deterministic; /* op_batch.batch_invariant for every step */
    int host_sampler;  /* hearth_engine_options.host_sampler */
    int no_journal;    /* hearth_engine_options.no_state_journal */
    int append_rows;   /* logits rows one hearth_seq_append may return (max_logits_rows) */
    int speculate;     /* hearth_speculate, for the scheduler */
    spec_cost spec_cost;  /* what a speculating step costs on this engine, measured by its batches */
    hearth_engine *draft; /* hearth_engine_options.draft_model's engine, or NULL */
    hearth_engine *mtp;   /* HEARTH_SPEC_MTP: the model's multi-token-prediction head's engine, or NULL */
    const float *hidden_in; /* op_batch.hidden_in / hidden_out of the next forward (engine_step_hidden) */
    float *hidden_out;
    spec_limits spec;     /* where proposing stops on this engine's backend */
    const hearth_spec_replay *replay; /* hearth_engine_options.spec_replay, or NULL */
    int32_t *greedy_id; /* hearth_seq_append_greedy on the GPU: the device picks the id */
    cuda_sampler *gsmp;                /* the device sampler (with gpu) */
    const engine_sample_row *dev_rows; /* set for a step whose rows it samples (ids into greedy_id) */
    cuda_sample_req *dev_req;          /* [max_out]: those rows' requests */
    int32_t *step_tok, *step_pos, *step_slot, *out_rows; /* [step_tokens] */
    float *logits;                                        /* [max_out, vocab] */
    sampler *slot_smp;                                    /* [max_seqs], for the scheduler */
    int32_t *history;                                     /* [max_seqs, context] */
    uint8_t *seq_open;
    adapter_registry adapters;             /* mounted LoRA adapters (adapter.h) */
    adapter_set **slot_adapters;           /* [max_seqs]: the set each open slot computes with */
    const op_adapter_set **step_adapters;  /* [step_tokens]: a step's rows' sets */
    sampler smp;
    int32_t eos[ENGINE_MAX_EOS];
    int n_eos;
    size_t bytes;
    /* weights put in place by engine_trial_weight, in order: what each replaced and the
     * memory of the replacement (the engine's until engine_trial_restore) */
    struct engine_trial {
        char *tensor;
        op_weight was;
        void *owned;
    } *trials;
    int n_trials;
};


typedef struct eos_list {
    int32_t *ids;
    int n, vocab;
} eos_list;

static void add_eos(eos_list *l, int64_t id) {
    if (id < 0 || id >= l->vocab || l->n == ENGINE_MAX_EOS) return;
    for (int i = 0; i < l->n; i++)
        if (l->ids[i] == id) return;
    l->ids[l->n++] = (int32_t)id;
}

static void add_eos_json(eos_list *l, const json_t *v) {
    if (json_is_integer(v)) add_eos(l, json_integer_value(v));
    size_t i;
    const json_t *x;
    if (json_is_array(v)) json_array_foreach(v, i, x) if (json_is_integer(x)) add_eos(l, json_integer_value(x));
}

/* Every end-of-sequence id the model declares: generation_config.json, config.json and
 * the tokenizer (HF), or the GGUF eos/eot/eom ids plus the end-of-turn specials that
 * chat GGUFs rely on without declaring. */
int engine_model_eos(const hearth_model *hm, int vocab, int32_t ids[ENGINE_MAX_EOS]) {
    eos_list l = {.ids = ids, .vocab = vocab};
    add_eos_json(&l, json_object_get(hm->generation_config, "eos_token_id"));
    add_eos_json(&l, json_object_get(hm->config, "eos_token_id"));
    if (hm->tok) add_eos(&l, tok_eos_id(hm->tok));
    if (hm->entry.format == MODEL_FORMAT_GGUF) {
        static const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                     "tokenizer.ggml.eom_token_id"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            int64_t id;
            if (gguf_get_i64(&hm->gguf, keys[i], &id)) add_eos(&l, id);
        }
        static const char *turn_end[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"};
        for (size_t i = 0; hm->tok && i < sizeof turn_end / sizeof turn_end[0]; i++) {
            int32_t id = tok_token_id(hm->tok, turn_end[i]);
            if (id >= 0 && tok_is_special(hm->tok, id)) add_eos(&l, id);
        }
    }
    return l.n;
}

/* XTC never drops what mlx_lm.server exempts: the encoded "\n" and the end-of-sequence
 * ids (so a paragraph or the answer can still end). */
static void set_xtc_exempt(hearth_engine *e) {
    int32_t ids[SAMPLER_MAX_EXEMPT];
    int n = 0;
    for (int i = 0; i < e->n_eos && n < SAMPLER_MAX_EXEMPT; i++) ids[n++] = e->eos[i];
    int32_t *nl = NULL;
    size_t n_nl = 0;
    hearth_error err = {0};
    if (e->hm->tok && tok_encode(e->hm->tok, "\n", 1, 0, &nl, &n_nl, &err) == HEARTH_OK)
        for (size_t i = 0; i < n_nl && n < SAMPLER_MAX_EXEMPT; i++) ids[n++] = nl[i];
    free(nl);
    sampler_set_xtc_exempt(&e->smp, ids, n);
    for (int i = 0; i < e->max_seqs; i++) sampler_set_xtc_exempt(&e->slot_smp[i], ids, n);
}

void engine_trim_heap(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static spec_limits model_spec_limits(const model *m, int gpu);

hearth_status engine_plan_make(const model *m, const hearth_engine_options *opts, engine_plan *p,
                               hearth_error *err) {
    hearth_engine_options o = opts ? *opts : (hearth_engine_options){0};
    const model_config *c = &m->cfg;
    memset(p, 0, sizeof *p);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    p->n_threads = o.n_threads > 0 ? o.n_threads : (cores > 0 ? (int)cores : 1);
    /* the model's own limit: the pool is reserved, not touched, so a long limit costs memory
     * only when requests use it (engine_plan_room cuts it where even one sequence of it would
     * not fit); model_config_read gives every model one (4096 where the config states none) */
    p->context = o.context_length > 0 ? o.context_length : c->context_length;
    if (!o.context_length && p->context > (1 << 24)) p->context = 1 << 24;
    p->step_tokens = o.max_step_tokens > 0 ? o.max_step_tokens : 256;
    p->max_seqs = o.max_sequences > 0 ? o.max_sequences : 1;
    /* 2^24 positions and 2^16 sequences/threads keep every product below in size_t and
     * every block count in int, far beyond any real deployment */
    if (o.context_length < 0 || o.max_step_tokens < 0 || o.max_sequences < 0 || o.n_threads < 0 ||
        p->context > (1 << 24) || p->max_seqs > (1 << 16) || p->n_threads > (1 << 16) || p->step_tokens > (1 << 16) ||
        (int64_t)(p->context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE * p->max_seqs > INT32_MAX)
        return err_set(err, HEARTH_ERR_INVALID, "engine: invalid options (context %d, sequences %d, threads %d)",
                       p->context, p->max_seqs, p->n_threads);
    /* a scheduler step returns one logits row per running sequence, and one more per
     * token a speculating request proposes; an append up to max_logits_rows */
    if (o.max_logits_rows < 0 || o.max_logits_rows > (1 << 16))
        return err_set(err, HEARTH_ERR_INVALID, "engine: invalid max_logits_rows %d", o.max_logits_rows);
    if (o.speculate != HEARTH_SPEC_LOOKUP && o.speculate != HEARTH_SPEC_NONE && o.speculate != HEARTH_SPEC_SUFFIX &&
        o.speculate != HEARTH_SPEC_MTP)
        return err_set(err, HEARTH_ERR_INVALID, "unknown --speculate mode (it takes lookup, suffix, mtp or none)");
    p->append_rows = o.max_logits_rows > ENGINE_MAX_LOGITS_ROWS ? o.max_logits_rows : ENGINE_MAX_LOGITS_ROWS;
    p->max_out = p->max_seqs > p->append_rows ? p->max_seqs : p->append_rows;
    /* the CPU: SPEC_MAX_DRAFT for its few speculating rows; the GPU: every proposal the
     * step's token limit leaves room for */
    if (o.speculate != HEARTH_SPEC_NONE) {
        int gpu_room = o.device == HEARTH_DEVICE_CUDA ? model_spec_limits(m, 1).max_step_tokens : 0;
        p->max_out += gpu_room > SPEC_MAX_DRAFT ? gpu_room : SPEC_MAX_DRAFT;
    }
    /* default KV pool: every sequence its whole context, so admission never waits on the
     * pool below the sequence limit; engine_plan_room cuts it to what fits in memory */
    if (o.kv_blocks < 0) return err_set(err, HEARTH_ERR_INVALID, "engine: invalid KV pool size %d", o.kv_blocks);
    p->n_blocks = o.kv_blocks > 0 ? o.kv_blocks : (p->context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE * p->max_seqs;
    if (o.kv_blocks == 0 && o.kv_budget_bytes > 0) {
        /* a byte budget: the pool's cost per block (storage and metadata) from its own size
         * function; on the GPU the device bytes of a block (cuda_kv_bytes) when larger */
        double per_block = (double)(model_kv_bytes(c, p->max_seqs, p->context, 2, o.kv_quant) -
                                    model_kv_bytes(c, p->max_seqs, p->context, 1, o.kv_quant));
        double dev_block = (double)engine_device_kv_bytes(c->n_layers, c->n_kv_heads, c->head_dim, 1, o.kv_quant,
                                                          o.device);
        if (dev_block > per_block) per_block = dev_block;
        double blocks = o.kv_budget_bytes / per_block;
        if (blocks < 1 || blocks > INT32_MAX / 2)
            return err_set(err, HEARTH_ERR_INVALID, "engine: a KV budget of %.0f bytes holds %.0f blocks of %.0f bytes",
                           o.kv_budget_bytes, blocks, per_block);
        p->n_blocks = (int)blocks;
    }
    /* the shape cpu_backend_bytes reads (ops_attention_scratch): no memory behind it */
    kv_cache shape = {.n_layers = c->n_kv_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                      .n_blocks = p->n_blocks, .max_slots = p->max_seqs,
                      .max_blocks_per_slot = (p->context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE};
    size_t T = (size_t)p->step_tokens;
    p->weights = model_weight_bytes(m);
    p->weights_load_peak = model_load_peak_bytes(m);
    if (!kv_quant_known(o.kv_quant))
        return err_set(err, HEARTH_ERR_INVALID,
                       "engine: unknown KV quantization %d (--kv-quant takes none, int8, fp8 or f16)", o.kv_quant);
    if (kv_quant_gpu_only(o.kv_quant) && o.device == HEARTH_DEVICE_CPU)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "--kv-quant %s is stored only by the CUDA backend (--device cuda); the CPU engine takes "
                       "--kv-quant none or int8",
                       hearth_kv_quant_name(o.kv_quant));
    p->kv = model_kv_bytes(c, p->max_seqs, p->context, p->n_blocks, o.kv_quant);
    /* hybrid models: the recurrent-state pool beside it (kv_state.h), float32 whatever the KV type */
    p->kv += kv_state_bytes(p->max_seqs, c->n_state_layers, op_gdn_state_floats(&model_ops(m)->dims),
                            kv_state_default_snaps(p->max_seqs));
    /* on the GPU keys and values live in the device pool: the host keeps the tables only */
    if (o.device == HEARTH_DEVICE_CUDA) p->kv -= model_kv_storage_bytes(c, p->n_blocks, o.kv_quant);
    /* the CPU backend's scratch; on the GPU the device holds it (engine_device_plan_bytes) */
    p->scratch = o.device == HEARTH_DEVICE_CUDA ? 0
                                                : cpu_backend_bytes(model_ops(m), &shape, p->step_tokens, p->max_out,
                                                                    p->n_threads);
    p->buffers = sizeof(hearth_engine) + 3 * T * sizeof(int32_t) + (size_t)p->append_rows * sizeof(int32_t) +
                 (size_t)p->max_out * c->vocab * sizeof(float) + (size_t)p->max_seqs * sizeof(sampler) +
                 (size_t)p->max_seqs * p->context * sizeof(int32_t) + (size_t)p->max_seqs +
                 ((size_t)p->max_seqs + T) * sizeof(void *); /* each slot's and each step row's adapter set */
    p->sampler = sampler_bytes(c->vocab) * (size_t)(1 + p->max_seqs); /* the engine's + one per slot */
    return HEARTH_OK;
}

size_t engine_plan_bytes(const engine_plan *p) { return p->weights + p->kv + p->scratch + p->buffers + p->sampler; }

size_t engine_host_room(void) {
    long long avail = hearth_proc_kb_field("/proc/meminfo", "MemAvailable"),
              total = hearth_proc_kb_field("/proc/meminfo", "MemTotal");
    if (avail <= 0 || total <= 0) return 0; /* unknown: no cut */
    long long room = avail - total / ENGINE_HOST_RESERVE_DIV;
    return room > 0 ? (size_t)room * 1024 : 1; /* 1: nothing left, the pool keeps its floor */
}

int engine_plan_is_auto(const hearth_engine_options *o) {
    return !o || (o->kv_blocks == 0 && !(o->kv_budget_bytes > 0));
}

/* The largest n in [lo, hi] with ok(n), given ok is monotone (true up to some n, false
 * above) and lo is the floor (taken whether or not ok holds). */
static int largest_that_fits(int lo, int hi, int (*ok)(int n, void *arg), void *arg, hearth_status *st) {
    while (lo < hi && !*st) { /* invariant: lo is the floor or fits; everything above hi does not */
        int mid = lo + (hi - lo + 1) / 2;
        if (ok(mid, arg)) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef struct room_search {
    const model *m;
    hearth_engine_options o;
    engine_plan_fits_fn fits;
    const void *arg;
    hearth_error *err;
    hearth_status st;
} room_search;

static int blocks_fit(int n_blocks, void *arg) {
    room_search *r = arg;
    hearth_engine_options o = r->o;
    o.kv_blocks = n_blocks;
    engine_plan t;
    return !(r->st = engine_plan_make(r->m, &o, &t, r->err)) && r->fits(r->m, &t, r->arg);
}

/* A context of n positions with a pool of one such context. */
static int context_fits(int n, void *arg) {
    room_search *r = arg;
    hearth_engine_options o = r->o;
    o.context_length = n;
    return blocks_fit((n + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE, &(room_search){r->m, o, r->fits, r->arg, r->err, 0});
}

hearth_status engine_plan_room(const model *m, const hearth_engine_options *opts, engine_plan_fits_fn fits,
                               const void *arg, engine_plan *p, hearth_error *err) {
    hearth_engine_options o = opts ? *opts : (hearth_engine_options){0};
    hearth_status st = engine_plan_make(m, &o, p, err);
    if (st || !engine_plan_is_auto(&o) || !fits || fits(m, p, arg)) return st;
    int full = p->n_blocks, model_context = p->context;
    room_search r = {m, o, fits, arg, err, HEARTH_OK};
    /* the default context (the model's own) when not even one sequence of it fits: the
     * largest that does, from one block up (below that the engine fails at allocation) */
    if (!o.context_length && !context_fits(model_context, &r)) {
        if (r.st) return r.st;
        o.context_length = r.o.context_length =
            largest_that_fits(KV_BLOCK_SIZE, model_context, context_fits, &r, &r.st);
        if (r.st) return r.st;
        if ((st = engine_plan_make(m, &o, p, err))) return st;
        full = p->n_blocks;
    }
    /* the largest pool from one context up that fits: plans allocate nothing, and bytes
     * grow with blocks, so a bisection over the block count (~16 plans) */
    o.kv_blocks = largest_that_fits((p->context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE, p->n_blocks, blocks_fit, &r,
                                    &r.st);
    if (r.st) return r.st;
    if ((st = engine_plan_make(m, &o, p, err))) return st;
    p->kv_cut_from = p->n_blocks < full ? full : 0;
    p->context_cut_from = p->context < model_context ? model_context : 0;
    return HEARTH_OK;
}

size_t engine_device_room(size_t free_bytes, size_t total_bytes) {
    size_t reserve = total_bytes / 20 > ((size_t)1 << 30) ? total_bytes / 20 : (size_t)1 << 30;
    return free_bytes > reserve ? free_bytes - reserve : 1;
}

typedef struct plan_rooms {
    size_t host, dev;
    int kv_quant, cuda_exact, expert_offload;
} plan_rooms;

static int fits_rooms(const model *m, const engine_plan *p, const void *arg) {
    const plan_rooms *r = arg;
    return (!r->host || engine_plan_bytes(p) <= r->host) &&
           (!r->dev || engine_device_plan_bytes(model_ops(m), p, r->kv_quant, r->cuda_exact, r->expert_offload) <= r->dev);
}

hearth_status engine_plan_rooms(const model *m, const hearth_engine_options *o, size_t host_room, size_t dev_room,
                                engine_plan *p, hearth_error *err) {
    plan_rooms r = {host_room, dev_room, o ? o->kv_quant : 0, o ? o->cuda_exact : 0, o ? o->expert_offload : 0};
    return engine_plan_room(m, o, fits_rooms, &r, p, err);
}

hearth_status engine_plan_host(const model *m, const hearth_engine_options *o, size_t room, engine_plan *p,
                               hearth_error *err) {
    return engine_plan_rooms(m, o, room, 0, p, err);
}

static hearth_status engine_draft_open(hearth_engine *e, const hearth_engine_options *o, hearth_error *err);
static hearth_status engine_mtp_open(hearth_engine *e, const hearth_engine_options *o, hearth_error *err);

/* hearth_engine_create, on the model `pre` when given (loaded already: the engine owns it). */
static hearth_status engine_create(hearth_model *hm, model *pre, const hearth_engine_options *opts, hearth_engine **out,
                                   hearth_error *err) {
    *out = NULL;
    hearth_engine_options o = opts ? *opts : (hearth_engine_options){0};
    /* hand freed heap (tokenizer loading's temporaries) back first, so the engine's
     * allocations are fresh pages and the footprint is the sum fit predicts */
    engine_trim_heap();
    hearth_engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    e->hm = hm;
    pthread_mutex_init(&e->gvocab_mu, NULL);
    adapter_registry_init(&e->adapters);
    /* the default KV pool's rooms, read before the weights take their share (as fit reads them) */
    size_t host_room = 0, dev_room = 0;
    engine_gpu_info gi;
    int gpu_here = o.device != HEARTH_DEVICE_CPU && engine_device_query(&gi);
    if (engine_plan_is_auto(&o)) {
        host_room = engine_host_room();
        if (gpu_here) dev_room = engine_device_room(gi.free_bytes, gi.total_bytes);
    }
    /* the plan for where the forward pass will run (auto: the GPU when there is one) */
    hearth_engine_options po = o;
    if (po.device == HEARTH_DEVICE_AUTO) po.device = gpu_here ? HEARTH_DEVICE_CUDA : HEARTH_DEVICE_CPU;
    hearth_status st =
        pre ? (e->m = pre, HEARTH_OK) : model_load(hm, engine_maps_weights(o.use_mmap, po.device), &e->m, err);
    if (st) { free(e); return st; }
    const model_config *c = &e->m->cfg;
    engine_plan p;
    st = engine_plan_rooms(e->m, &po, host_room, dev_room, &p, err);
    e->n_threads = p.n_threads;
    e->context = p.context;
    e->step_tokens = p.step_tokens;
    e->max_seqs = p.max_seqs;
    e->max_out = p.max_out;
    e->append_rows = p.append_rows;
    e->kv_cut_from = p.kv_cut_from;
    e->context_cut_from = p.context_cut_from;
    e->deterministic = o.deterministic != 0;
    e->host_sampler = o.host_sampler != 0;
    e->no_journal = o.no_state_journal != 0;
    e->speculate = o.speculate;
    e->replay = o.spec_replay;
    if (!st) st = tp_create(e->n_threads, &e->tp, err);
    /* host K/V storage only where the CPU runs the forward pass (after the device is open:
     * --device auto falls back to the CPU when the GPU path fails) */
    if (!st)
        st = model_kv_create(c, &e->kv, e->max_seqs, e->context, p.n_blocks, o.kv_quant, po.device != HEARTH_DEVICE_CUDA,
                             err);
    if (!st && c->n_state_layers > 0)
        st = kv_state_attach(&e->kv, c->n_state_layers, op_gdn_state_floats(&model_ops(e->m)->dims),
                             kv_state_default_snaps(e->max_seqs), err);
    if (!st && c->n_state_layers > 0) kv_state_reserve_spec(&e->kv, kv_state_spec_records(e->max_seqs));
    if (!st) st = engine_device_open(model_ops(e->m), &e->kv, o.device, o.cuda_exact, o.expert_offload, e->step_tokens, e->max_out, e->tp, &e->be, err);
    e->gpu = e->be != NULL;
    e->spec = model_spec_limits(e->m, e->gpu);
    if (!st && !e->gpu && po.device == HEARTH_DEVICE_CUDA) st = kv_storage_attach(&e->kv, err);
    if (!st && !e->gpu)
        st = cpu_backend_create(model_ops(e->m), &e->kv, e->step_tokens, e->max_out, e->n_threads, e->tp, &e->be, err);
    if (!st && e->gpu) st = engine_device_sampler_open(e->max_out, c->vocab, &e->gsmp, err);
    if (!st && e->gpu && !(e->dev_req = calloc((size_t)e->max_out, sizeof *e->dev_req)))
        st = err_set(err, HEARTH_ERR_NOMEM, "engine: out of memory");
    if (!st && !e->gpu && kv_quant_gpu_only(o.kv_quant)) /* --device auto chose the CPU */
        st = err_set(err, HEARTH_ERR_UNSUPPORTED,
                     "--kv-quant %s needs the GPU, but the model runs on the CPU here (%s); use --kv-quant int8 "
                     "or none",
                     hearth_kv_quant_name(o.kv_quant),
                     o.device == HEARTH_DEVICE_AUTO ? "--device auto found no usable CUDA device" : "--device cpu");
    if (!st) st = sampler_init(&e->smp, c->vocab, err);
    if (!st && !(e->slot_smp = calloc((size_t)e->max_seqs, sizeof *e->slot_smp)))
        st = err_set(err, HEARTH_ERR_NOMEM, "engine: out of memory");
    for (int i = 0; !st && i < e->max_seqs; i++) {
        st = sampler_init(&e->slot_smp[i], c->vocab, err);
        /* distinct unseeded streams per slot, even when started in the same second */
        if (!st) sampler_seed(&e->slot_smp[i], (uint64_t)time(NULL) ^ ((uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull));
    }
    if (!st) {
        size_t T = (size_t)e->step_tokens;
        size_t logits = (size_t)e->max_out * c->vocab * sizeof(float);
        size_t history = (size_t)e->max_seqs * e->context * sizeof(int32_t);
        e->step_tok = malloc(T * sizeof(int32_t));
        e->step_pos = malloc(T * sizeof(int32_t));
        e->step_slot = malloc(T * sizeof(int32_t));
        e->out_rows = malloc((size_t)e->append_rows * sizeof(int32_t));
        e->logits = malloc(logits);
        e->history = malloc(history);
        e->seq_open = calloc((size_t)e->max_seqs, 1);
        e->slot_adapters = calloc((size_t)e->max_seqs, sizeof *e->slot_adapters);
        e->step_adapters = calloc(T, sizeof *e->step_adapters);
        if (!e->step_tok || !e->step_pos || !e->step_slot || !e->out_rows || !e->logits || !e->history ||
            !e->seq_open || !e->slot_adapters || !e->step_adapters)
            st = err_set(err, HEARTH_ERR_NOMEM, "engine: out of memory");
        else { /* touch now: resident from the start, so the footprint fit predicts is the real one */
            memset(e->logits, 0, logits);
            memset(e->history, 0, history);
            mem_touch(e->logits, logits);
            mem_touch(e->history, history);
        }
    }
    if (st) { hearth_engine_free(e); return st; }
    e->bytes = engine_plan_bytes(&p);
    if (po.device == HEARTH_DEVICE_CUDA && !e->gpu) { /* auto fell back to the CPU: host storage and scratch after all */
        e->bytes += model_kv_storage_bytes(c, p.n_blocks, o.kv_quant);
        e->bytes += cpu_backend_bytes(model_ops(e->m), &e->kv, e->step_tokens, e->max_out, e->n_threads);
    }
    e->n_eos = engine_model_eos(e->hm, c->vocab, e->eos);
    set_xtc_exempt(e);
    if (o.draft_model && o.speculate != HEARTH_SPEC_NONE && (st = engine_draft_open(e, &o, err))) {
        hearth_engine_free(e);
        return st;
    }
    if (o.speculate == HEARTH_SPEC_MTP && (st = engine_mtp_open(e, &o, err))) {
        hearth_engine_free(e);
        return st;
    }
    if (e->draft) e->bytes += e->draft->bytes;
    if (e->mtp) e->bytes += e->mtp->bytes;
    *out = e;
    return HEARTH_OK;
}

hearth_status hearth_engine_create(hearth_model *hm, const hearth_engine_options *opts, hearth_engine **out,
                                   hearth_error *err) {
    return engine_create(hm, NULL, opts, out, err);
}

hearth_status engine_trial_weight(hearth_engine *e, const char *tensor, const op_weight *w, void *owned,
                                  hearth_error *err) {
    struct engine_trial *grown = realloc(e->trials, ((size_t)e->n_trials + 1) * sizeof *grown);
    if (grown) e->trials = grown;
    struct engine_trial t = {strdup(tensor), {0}, owned};
    hearth_status st = HEARTH_OK;
    if (!grown || !t.tensor)
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    else if (e->gpu) /* the device holds its own copy of every weight */
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "weights are swapped in place on the CPU backend only (--device cpu)");
    if (!st) st = cpu_backend_fit_weight(e->be, w, err);
    if (!st) st = model_set_weight(e->m, tensor, w, &t.was, err);
    if (st) {
        free(t.tensor);
        free(owned);
        return st;
    }
    e->trials[e->n_trials++] = t;
    return HEARTH_OK;
}

void engine_trial_restore(hearth_engine *e) {
    while (e->n_trials > 0) { /* the last first: a tensor swapped twice ends as it began */
        struct engine_trial *t = &e->trials[--e->n_trials];
        model_set_weight(e->m, t->tensor, &t->was, NULL, NULL); /* cannot fail: it was there */
        free(t->tensor);
        free(t->owned);
    }
}

const op_weight *engine_weight(const hearth_engine *e, const char *tensor) {
    for (int i = 0; i < e->m->n_named; i++)
        if (!strcmp(e->m->named[i].tensor, tensor)) return e->m->named[i].w;
    return NULL;
}

void hearth_engine_free(hearth_engine *e) {
    if (!e) return;
    if (e->m) engine_trial_restore(e);
    free(e->trials);
    hearth_engine_free(e->draft);
    hearth_engine_free(e->mtp);
    if (e->be) e->be->t->free(e->be);
    kv_destroy(&e->kv);
    tp_destroy(e->tp);
    sampler_free(&e->smp);
    for (int i = 0; e->slot_smp && i < e->max_seqs; i++) sampler_free(&e->slot_smp[i]);
    free(e->slot_smp);
    engine_device_sampler_close(e->gsmp);
    free(e->dev_req);
    model_free(e->m);
    gvocab_free(e->gvocab);
    gram_cache_free(e->grammars);
    pthread_mutex_destroy(&e->gvocab_mu);
    free(e->step_tok);
    free(e->step_pos);
    free(e->step_slot);
    free(e->out_rows);
    free(e->logits);
    free(e->history);
    free(e->seq_open);
    for (int i = 0; e->slot_adapters && i < e->max_seqs; i++) adapter_set_release(&e->adapters, e->slot_adapters[i]);
    free(e->slot_adapters);
    free(e->step_adapters);
    adapter_registry_free(&e->adapters);
    free(e);
}

size_t hearth_engine_bytes(const hearth_engine *e) { return e->bytes; }
int hearth_engine_context_length(const hearth_engine *e) { return e->context; }
int hearth_engine_context_cut_from(const hearth_engine *e) { return e->context_cut_from; }
int hearth_engine_threads(const hearth_engine *e) { return e->n_threads; }

int hearth_engine_kv_blocks(const hearth_engine *e, int *cut_from) {
    if (cut_from) *cut_from = e->kv_cut_from;
    return e->kv.n_blocks;
}
int hearth_engine_kv_blocks_needed(const hearth_engine *e, size_t n_prompt, int max_tokens) {
    return sched_blocks_needed(n_prompt, max_tokens, e->context);
}
int32_t hearth_model_vocab_rows(const hearth_engine *e) { return e->m->cfg.vocab; }

hearth_status hearth_seq_open(hearth_engine *e, int *seq, hearth_error *err) {
    for (int i = 0; i < e->max_seqs; i++)
        if (!e->seq_open[i]) {
            e->seq_open[i] = 1;
            *seq = i;
            return HEARTH_OK;
        }
    return err_set(err, HEARTH_ERR_NOMEM, "all %d sequences are in use", e->max_seqs);
}

void hearth_seq_close(hearth_engine *e, int seq) {
    if (seq < 0 || seq >= e->max_seqs || !e->seq_open[seq]) return;
    kv_release(&e->kv, seq);
    e->seq_open[seq] = 0;
    adapter_set_release(&e->adapters, e->slot_adapters[seq]);
    e->slot_adapters[seq] = NULL;
}

hearth_status engine_seq_use_adapters(hearth_engine *e, int seq, adapter_set *set) {
    if (seq < 0 || seq >= e->max_seqs || !e->seq_open[seq]) return HEARTH_ERR_INVALID;
    if (e->kv.n_tokens[seq] != 0) { /* adapters apply to a sequence's whole KV: set before its first token */
        const adapter_set *have = e->slot_adapters[seq];
        return (have ? have->ns : 0) == (set ? set->ns : 0) ? HEARTH_OK : HEARTH_ERR_INVALID;
    }
    adapter_set_retain(&e->adapters, set);
    adapter_set_release(&e->adapters, e->slot_adapters[seq]);
    e->slot_adapters[seq] = set;
    kv_prefix_slot_namespace(&e->kv, seq, set ? set->ns : 0);
    return HEARTH_OK;
}

adapter_registry *engine_adapters(hearth_engine *e) { return &e->adapters; }
const model *engine_weights(const hearth_engine *e) { return e->m; }

/* One step on whichever backend holds the model: on the GPU, rows sampled there (dev_rows)
 * or greedy ids chosen there (greedy_id) when the step asks, else logits to the host. */
static hearth_status engine_model_forward(hearth_engine *e, const op_batch *batch, hearth_error *err) {
    if (e->be->t->adapter_gone) { /* the device copies of adapters freed since the last step go first */
        uint64_t gone[16];
        for (int n; (n = adapter_registry_take_gone(&e->adapters, gone, 16)) > 0;)
            for (int i = 0; i < n; i++) e->be->t->adapter_gone(e->be, gone[i]);
    }
    op_batch with = *batch, *b = &with; /* each row's adapters: its slot's */
    int adapted = 0;
    for (int t = 0; t < b->T; t++) {
        adapter_set *s = e->slot_adapters[b->slot[t]];
        e->step_adapters[t] = s ? &s->ops : NULL;
        adapted |= s != NULL;
    }
    with.row_adapters = adapted ? e->step_adapters : NULL;
    if (e->gpu && e->dev_rows && b->n_out >= 1) { /* each row's history: its slot's tokens up to its position */
        for (int i = 0; i < b->n_out; i++) {
            int t = b->out_rows[i];
            e->dev_req[i] = (cuda_sample_req){.p = e->dev_rows[i].p, .history = engine_history(e, b->slot[t]),
                                              .n_history = (size_t)b->pos[t] + 1, .seed = e->dev_rows[i].seed,
                                              .lp = e->dev_rows[i].lp};
        }
        hearth_status st = model_forward(e->m, e->be, &e->kv, b, OP_OUT_KEEP, NULL, err);
        /* the forward pass is queued: constrained rows make their masks while it runs */
        for (int i = 0; !st && i < b->n_out; i++)
            if (e->dev_rows[i].allow)
                e->dev_req[i].allow = e->dev_rows[i].allow(e->dev_rows[i].allow_ctx, &e->dev_req[i].allow_n);
        return st ? st : engine_device_sample(e->be, e->gsmp, b->n_out, e->dev_req, e->greedy_id, err);
    }
    if (e->gpu && e->greedy_id && b->n_out >= 1) {
        static int said; /* one line per process: says the device picks greedy ids (tests see it ran) */
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
            fprintf(stderr, "hearth: greedy ids chosen on the device (%d rows)\n", b->n_out);
        }
        return model_forward(e->m, e->be, &e->kv, b, OP_OUT_IDS, e->greedy_id, err);
    }
    return model_forward(e->m, e->be, &e->kv, b, OP_OUT_LOGITS, NULL, err);
}

int engine_host_sampler(const hearth_engine *e) { return e->host_sampler; }
int hearth_engine_device(const hearth_engine *e) { return e->gpu ? HEARTH_DEVICE_CUDA : HEARTH_DEVICE_CPU; }

hearth_status hearth_seq_append(hearth_engine *e, int seq, const int32_t *tokens, size_t n, size_t n_logits,
                                float *logits, hearth_error *err) {
    if (seq < 0 || seq >= e->max_seqs || !e->seq_open[seq])
        return err_set(err, HEARTH_ERR_INVALID, "sequence %d is not open", seq);
    if (n == 0 || n_logits > (size_t)e->append_rows || n_logits > n)
        return err_set(err, HEARTH_ERR_INVALID, "append of %zu tokens with %zu logits rows (at most %d)", n, n_logits,
                       e->append_rows);
    int have = e->kv.n_tokens[seq];
    if ((size_t)have + n > (size_t)e->context)
        return err_set(err, HEARTH_ERR_INVALID, "%zu tokens do not fit the context: %d used of %d", n, have,
                       e->context);
    hearth_status st = kv_reserve(&e->kv, seq, have + (int)n, err);
    if (st) return st;
    int vocab = e->m->cfg.vocab;
    for (size_t done = 0; done < n;) {
        int T = (int)(n - done < (size_t)e->step_tokens ? n - done : (size_t)e->step_tokens);
        for (int t = 0; t < T; t++) {
            e->step_tok[t] = tokens[done + t];
            e->step_pos[t] = have + (int)done + t;
            e->step_slot[t] = seq;
            e->history[(size_t)seq * e->context + have + done + t] = tokens[done + t];
        }
        /* rows that need logits: those among the last n_logits tokens of the append */
        int n_out = 0;
        for (int t = 0; t < T; t++)
            if (done + t >= n - n_logits) e->out_rows[n_out++] = t;
        /* the CPU backend writes the rows (consecutive: the append's last ones) straight into
           the caller's buffer; a device's come through e->logits */
        float *dst = n_out && logits ? logits + (done + (size_t)e->out_rows[0] - (n - n_logits)) * vocab : NULL;
        op_batch b = {.T = T,
                      .tokens = e->step_tok,
                      .pos = e->step_pos,
                      .slot = e->step_slot,
                      .n_out = n_out,
                      .out_rows = e->out_rows,
                      .logits = dst && !e->gpu ? dst : e->logits,
                      .batch_invariant = e->deterministic};
        if ((st = engine_model_forward(e, &b, err))) return st;
        if (!e->greedy_id && !ops_all_finite(b.logits, (size_t)n_out * vocab))
            return err_set(err, HEARTH_ERR_FORMAT,
                           "%s: the model produced non-finite logits; its weights contain NaN or Inf values",
                           e->hm->entry.path);
        if (dst && b.logits != dst) memcpy(dst, b.logits, (size_t)n_out * vocab * sizeof(float));
        done += (size_t)T;
    }
    return HEARTH_OK;
}

hearth_status hearth_seq_append_greedy(hearth_engine *e, int seq, const int32_t *tokens, size_t n, int32_t *next,
                                       hearth_error *err) {
    if (!next) return err_set(err, HEARTH_ERR_INVALID, "hearth_seq_append_greedy: no output");
    int32_t id = -1;
    e->greedy_id = e->gpu ? &id : NULL;
    hearth_status st = hearth_seq_append(e, seq, tokens, n, 1, NULL, err);
    e->greedy_id = NULL;
    if (st) {
        if (st == HEARTH_ERR_FORMAT && e->gpu) err_prefix(err, "%s", e->hm->entry.path);
        return st;
    }
    if (!e->gpu) id = ops_argmax(e->logits, e->m->cfg.vocab); /* the sampler's greedy rule */
    *next = id;
    return HEARTH_OK;
}

hearth_status engine_seq_append_sample(hearth_engine *e, int seq, const int32_t *tokens, size_t n,
                                       const engine_sample_row *row, int32_t *next, hearth_error *err) {
    if (!e->gpu || !e->gsmp || !row || !next)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "engine: device sampling needs the GPU engine");
    int32_t id = -1;
    e->greedy_id = &id;
    e->dev_rows = row;
    hearth_status st = hearth_seq_append(e, seq, tokens, n, 1, NULL, err);
    e->greedy_id = NULL;
    e->dev_rows = NULL;
    if (st == HEARTH_ERR_FORMAT) err_prefix(err, "%s", e->hm->entry.path);
    if (!st) *next = id;
    return st;
}

hearth_status engine_forward_rows(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                  const int32_t *slot, int n_out, const int32_t *out_rows, const float **logits,
                                  hearth_error *err) {
    if (T <= 0 || T > e->step_tokens || n_out < 0 || n_out > e->max_out)
        return err_set(err, HEARTH_ERR_INVALID, "engine step of %d tokens, %d logits rows", T, n_out);
    for (int t = 0; t < T; t++) {
        if (slot[t] < 0 || slot[t] >= e->max_seqs || !e->seq_open[slot[t]] || pos[t] < 0 || pos[t] >= e->context)
            return err_set(err, HEARTH_ERR_INVALID, "engine step: token %d has slot %d position %d", t, slot[t],
                           pos[t]);
        /* prefix caching shares only full blocks and sequences only append, so a write
         * never lands in a shared or cached block; checked since a broken invariant
         * would silently corrupt other requests' KV */
        if (!kv_position_writable(&e->kv, slot[t], pos[t]))
            return err_set(err, HEARTH_ERR_INVALID, "engine step: position %d of slot %d is in a shared KV block",
                           pos[t], slot[t]);
        e->history[(size_t)slot[t] * e->context + pos[t]] = tokens[t];
    }
    op_batch b = {.T = T,
                  .tokens = tokens,
                  .pos = pos,
                  .slot = slot,
                  .n_out = n_out,
                  .out_rows = out_rows,
                  .logits = e->logits,
                  .batch_invariant = e->deterministic,
                  .hidden_in = e->hidden_in,
                  .hidden_out = e->hidden_out};
    hearth_status st = engine_model_forward(e, &b, err);
    if (st) return st;
    int vocab = e->m->cfg.vocab;
    if (!e->greedy_id && !ops_all_finite(e->logits, (size_t)n_out * vocab)) /* greedy ids: the device checked */
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: the model produced non-finite logits; its weights contain NaN or Inf values",
                       e->hm->entry.path);
    *logits = e->logits;
    return HEARTH_OK;
}

hearth_status engine_forward_rows_greedy(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                         const int32_t *slot, int n_out, const int32_t *out_rows, int32_t *ids,
                                         hearth_error *err) {
    if (!e->gpu || !ids) return err_set(err, HEARTH_ERR_UNSUPPORTED, "engine: device greedy ids need the GPU engine");
    const float *unused;
    e->greedy_id = n_out > 0 ? ids : NULL;
    hearth_status st = engine_forward_rows(e, T, tokens, pos, slot, n_out, out_rows, &unused, err);
    e->greedy_id = NULL;
    if (st == HEARTH_ERR_FORMAT) err_prefix(err, "%s", e->hm->entry.path);
    return st;
}

hearth_status engine_forward_rows_sample(hearth_engine *e, int T, const int32_t *tokens, const int32_t *pos,
                                         const int32_t *slot, int n_out, const int32_t *out_rows,
                                         const engine_sample_row *rows, int32_t *ids, hearth_error *err) {
    if (!e->gpu || !e->gsmp || !ids || !rows)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "engine: device sampling needs the GPU engine");
    const float *unused;
    e->greedy_id = n_out > 0 ? ids : NULL;
    e->dev_rows = n_out > 0 ? rows : NULL;
    hearth_status st = engine_forward_rows(e, T, tokens, pos, slot, n_out, out_rows, &unused, err);
    e->greedy_id = NULL;
    e->dev_rows = NULL;
    if (st == HEARTH_ERR_FORMAT) err_prefix(err, "%s", e->hm->entry.path);
    return st;
}

int engine_has_device_sampler(const hearth_engine *e) { return e->gsmp != NULL; }
int engine_max_out_rows(const hearth_engine *e) { return e->max_out; }
int engine_max_sequences(const hearth_engine *e) { return e->max_seqs; }
int engine_speculate(const hearth_engine *e) { return e->speculate; }
spec_cost *engine_spec_cost(hearth_engine *e) { return &e->spec_cost; }
hearth_engine *engine_draft(hearth_engine *e) { return e->draft; }
spec_limits engine_spec_limits(const hearth_engine *e) { return e->spec; }
const hearth_spec_replay *engine_spec_replay(const hearth_engine *e) {
    return e->replay && e->replay->tokens ? e->replay : NULL;
}

/* The draft model's engine: the same options (sequences, context, step, threads, device),
 * no speculation of its own. Refused unless its tokenizer is the model's, token for token. */
hearth_engine_options engine_draft_options(const hearth_engine_options *o, const engine_plan *p) {
    hearth_engine_options dop = *o;
    dop.draft_model = NULL;
    dop.spec_replay = NULL;
    dop.speculate = HEARTH_SPEC_NONE;
    dop.expert_offload = 0; /* the target's experts; a small draft stays resident */
    dop.context_length = p->context;
    dop.max_sequences = p->max_seqs;
    dop.max_step_tokens = p->step_tokens;
    dop.n_threads = p->n_threads;
    return dop;
}

static hearth_status engine_draft_open(hearth_engine *e, const hearth_engine_options *o, hearth_error *err) {
    const hearth_model *t = e->hm, *d = o->draft_model;
    int32_t nt = hearth_vocab_size(t), nd = hearth_vocab_size(d), bad = -1;
    for (int32_t i = 0; nt == nd && bad < 0 && i < nt; i++) {
        const char *a = hearth_token_piece(t, i), *b = hearth_token_piece(d, i);
        if ((a == NULL) != (b == NULL) || (a && strcmp(a, b))) bad = i;
    }
    if (nt != nd)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--draft-model %s: its tokenizer has %d tokens, the model's (%s) %d; the draft model must use "
                       "the model's tokenizer",
                       hearth_model_path(d), nd, hearth_model_path(t), nt);
    if (bad >= 0)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--draft-model %s: token %d is '%s' there but '%s' in the model (%s); the draft model must use "
                       "the model's tokenizer",
                       hearth_model_path(d), bad, hearth_token_piece(d, bad) ? hearth_token_piece(d, bad) : "(none)",
                       hearth_token_piece(t, bad) ? hearth_token_piece(t, bad) : "(none)", hearth_model_path(t));
    engine_plan tp = {
        .context = e->context, .max_seqs = e->max_seqs, .step_tokens = e->step_tokens, .n_threads = e->n_threads};
    hearth_engine_options dop = engine_draft_options(o, &tp);
    hearth_status st = hearth_engine_create(o->draft_model, &dop, &e->draft, err);
    if (st) err_prefix(err, "--draft-model %s", hearth_model_path(d));
    return st;
}

/* The multi-token-prediction head's engine: the model's own head (model_load_mtp) with the
 * draft's options, where the model runs (on the GPU the head holds its own copy of lm_head). */
static hearth_status engine_mtp_open(hearth_engine *e, const hearth_engine_options *o, hearth_error *err) {
    if (o->draft_model)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--speculate mtp proposes with the model's own head: not with "
                       "--draft-model");
    model *head = NULL;
    hearth_status st = model_load_mtp(e->hm, e->m, &head, err);
    if (st) {
        err_prefix(err, "--speculate mtp");
        return st;
    }
    engine_plan tp = {
        .context = e->context, .max_seqs = e->max_seqs, .step_tokens = e->step_tokens, .n_threads = e->n_threads};
    hearth_engine_options dop = engine_draft_options(o, &tp);
    dop.device = e->gpu ? HEARTH_DEVICE_CUDA : HEARTH_DEVICE_CPU; /* where the model runs */
    st = engine_create(e->hm, head, &dop, &e->mtp, err); /* frees the head when it fails */
    if (st) err_prefix(err, "--speculate mtp");
    return st;
}

hearth_engine *engine_mtp(hearth_engine *e) { return e->mtp; }
void engine_step_hidden(hearth_engine *e, const float *in, float *out) { e->hidden_in = in, e->hidden_out = out; }
int engine_hidden_size(const hearth_engine *e) { return e->m->cfg.hidden; }

kv_cache *engine_kv(hearth_engine *e) { return &e->kv; }

hearth_status engine_kv_copy_rows(hearth_engine *e, int32_t src, int32_t dst, int rows, hearth_error *err) {
    if (e->be->t->kv_copy) return e->be->t->kv_copy(e->be, src, dst, rows, err);
    kv_copy_rows(&e->kv, src, dst, rows);
    return HEARTH_OK;
}
hearth_status engine_kv_rows(hearth_engine *e, int layer, int seq, int head, int n, void *keys, void *values,
                             float *k_scale, float *v_scale, int to_host, hearth_error *err) {
    if (e->be->t->kv_rows)
        return e->be->t->kv_rows(e->be, &e->kv, layer, seq, head, n, keys, values, k_scale, v_scale, to_host, err);
    kv_cache view; /* the layer's own shape where layers differ */
    int vl = kv_layer_view(&e->kv, layer, &view);
    if (to_host)
        kv_slot_rows_read(&view, vl, seq, head, n, keys, values, k_scale, v_scale);
    else
        kv_slot_rows_write(&view, vl, seq, head, n, keys, values, k_scale, v_scale);
    return HEARTH_OK;
}

hearth_status engine_state_rows(hearth_engine *e, int seq, void *record, int to_host, hearth_error *err) {
    const kv_state *st = e->kv.state;
    size_t rec = st->layer_floats * sizeof(float);
    if (e->be->t->state_rows) return e->be->t->state_rows(e->be, seq, record, (size_t)st->n_layers * rec, to_host, err);
    for (int l = 0; l < st->n_layers; l++) {
        float *at = kv_state_at(&e->kv, l, seq);
        uint8_t *r = (uint8_t *)record + (size_t)l * rec;
        if (to_host)
            memcpy(r, at, rec);
        else
            memcpy(at, r, rec);
    }
    return HEARTH_OK;
}

void engine_state_snap_save(hearth_engine *e, int slot, int len, uint64_t hash, int rolling) {
    int i = kv_state_snap_save(&e->kv, slot, len, hash, rolling);
    hearth_error err = {0};
    if (i >= 0 && e->be->t->state_copy && e->be->t->state_copy(e->be, slot, e->kv.max_slots + i, &err))
        kv_state_snap_drop(&e->kv, i);
}

/* Where the backend holds the state pool (state_copy) only its copy moves: the host records
 * are not read there, and a backup is made every speculating step. */
hearth_status engine_state_spec_copy(hearth_engine *e, int slot, int j, int to_backup, hearth_error *err) {
    int rec = e->kv.max_slots + kv_state_spec_record(&e->kv, j);
    if (e->be->t->state_copy) return e->be->t->state_copy(e->be, to_backup ? slot : rec, to_backup ? rec : slot, err);
    kv_state_spec_copy(&e->kv, slot, j, to_backup);
    return HEARTH_OK;
}

hearth_status engine_state_journal(hearth_engine *e, int rec, int slot, hearth_error *err) {
    /* no_state_journal: the CPU keeps none either, as the CUDA backend (the GPU's scheduling) */
    if (!e->be->t->state_journal || e->no_journal)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "the backend keeps no journal");
    return e->be->t->state_journal(e->be, rec, slot, err);
}

hearth_status engine_state_replay(hearth_engine *e, int slot, int rec, int n, hearth_error *err) {
    if (!e->be->t->state_replay) return err_set(err, HEARTH_ERR_UNSUPPORTED, "the backend keeps no journal");
    return e->be->t->state_replay(e->be, &e->kv, slot, rec, n, err);
}

hearth_status engine_state_snap_load(hearth_engine *e, int snap, int slot, hearth_error *err) {
    kv_state_snap_load(&e->kv, snap, slot);
    return e->be->t->state_copy ? e->be->t->state_copy(e->be, e->kv.max_slots + snap, slot, err) : HEARTH_OK;
}
threadpool *engine_threads(hearth_engine *e) { return e->tp; }
sampler *engine_slot_sampler(hearth_engine *e, int seq) { return &e->slot_smp[seq]; }

/* made on first use (NULL on out of memory: engine_constraint_get then compiles per request) */
gram_cache *engine_grammars(hearth_engine *e) {
    pthread_mutex_lock(&e->gvocab_mu);
    if (!e->grammars) e->grammars = gram_cache_new();
    pthread_mutex_unlock(&e->gvocab_mu);
    return e->grammars;
}

static void build_grammar_vocab(hearth_engine *e);

gvocab *engine_grammar_vocab(hearth_engine *e) {
    pthread_mutex_lock(&e->gvocab_mu);
    if (!e->gvocab && e->hm->tok) build_grammar_vocab(e);
    pthread_mutex_unlock(&e->gvocab_mu);
    return e->gvocab;
}

/* The tokenizer's tokens as the grammar engine reads them (gvocab_new's arguments): each
 * token's bytes in one block (two passes: the lengths, then the bytes), whether it is
 * special. */
typedef struct grammar_tokens {
    int32_t n;
    char **bytes, *text;
    uint32_t *len;
    uint8_t *special;
} grammar_tokens;

/* Bytes grammar_tokens_make allocates for n tokens of text_bytes bytes in all. */
static size_t grammar_tokens_bytes(int32_t n, size_t text_bytes) {
    return ((size_t)n + 1) * (sizeof(char *) + sizeof(uint32_t) + sizeof(uint8_t)) + text_bytes + 1;
}

static void grammar_tokens_free(grammar_tokens *g) {
    free(g->bytes), free(g->text), free(g->len), free(g->special);
}

static int grammar_tokens_make(const tok_tokenizer *t, grammar_tokens *g, size_t *text_bytes) {
    memset(g, 0, sizeof *g);
    int32_t n = g->n = tok_vocab_size(t);
    g->bytes = calloc((size_t)n + 1, sizeof *g->bytes);
    g->len = calloc((size_t)n + 1, sizeof *g->len);
    g->special = calloc((size_t)n + 1, 1);
    if (!g->bytes || !g->len || !g->special) return 0;
    char buf[1024]; /* longer tokens are cut off here and never match */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        int l = tok_token_bytes(t, i, buf, sizeof buf);
        g->len[i] = l < 0 || l > (int)sizeof buf ? 0 : (uint32_t)l;
        g->special[i] = (uint8_t)tok_is_special(t, i);
        total += g->len[i];
    }
    *text_bytes = total;
    if (!(g->text = malloc(total + 1))) return 0;
    for (size_t i = 0, at = 0; i < (size_t)n; at += g->len[i], i++) {
        g->bytes[i] = g->text + at;
        if (g->len[i]) tok_token_bytes(t, (int32_t)i, buf, sizeof buf), memcpy(g->bytes[i], buf, g->len[i]);
    }
    return 1;
}

static void build_grammar_vocab(hearth_engine *e) {
    grammar_tokens g;
    size_t text_bytes;
    if (grammar_tokens_make(e->hm->tok, &g, &text_bytes))
        e->gvocab = gvocab_new(g.n, (const char *const *)g.bytes, g.len, g.special, e->eos, e->n_eos);
    grammar_tokens_free(&g);
}

int engine_grammar_footprint(const hearth_model *hm, int vocab, size_t *tables, size_t *temporary) {
    *tables = *temporary = 0;
    if (!hm->tok) return 1; /* no tokenizer: no constraint is ever compiled */
    int32_t eos[ENGINE_MAX_EOS];
    int n_eos = engine_model_eos(hm, vocab, eos);
    grammar_tokens g;
    size_t text_bytes;
    int ok = grammar_tokens_make(hm->tok, &g, &text_bytes) &&
             gvocab_footprint(g.n, (const char *const *)g.bytes, g.len, g.special, eos, n_eos, tables, temporary);
    /* the build holds the tokens it was handed until it ends */
    if (ok) *temporary += grammar_tokens_bytes(g.n, text_bytes);
    grammar_tokens_free(&g);
    return ok;
}

int engine_eos_ids(const hearth_engine *e, const int32_t **ids) {
    *ids = e->eos;
    return e->n_eos;
}
sampler *engine_sampler(hearth_engine *e) { return &e->smp; }
const int32_t *engine_history(const hearth_engine *e, int seq) { return e->history + (size_t)seq * e->context; }
void engine_history_write(hearth_engine *e, int seq, const int32_t *tokens, int n) {
    if (seq >= 0 && seq < e->max_seqs && n > 0 && n <= e->context)
        memcpy(e->history + (size_t)seq * e->context, tokens, (size_t)n * sizeof *tokens);
}
void engine_history_set(hearth_engine *e, int seq, int pos, int32_t token) {
    if (seq >= 0 && seq < e->max_seqs && pos >= 0 && pos < e->context) e->history[(size_t)seq * e->context + pos] = token;
}
int engine_seq_length(const hearth_engine *e, int seq) { return e->kv.n_tokens[seq]; }
int engine_seq_is_open(const hearth_engine *e, int seq) { return seq >= 0 && seq < e->max_seqs && e->seq_open[seq]; }
int engine_step_tokens(const hearth_engine *e) { return e->step_tokens; }
float *engine_logits_buffer(hearth_engine *e) { return e->logits + (size_t)(ENGINE_MAX_LOGITS_ROWS - 1) * e->m->cfg.vocab; }
const hearth_model *engine_model(const hearth_engine *e) { return e->hm; }

double hearth_engine_measure_bandwidth(hearth_engine *e) {
    if (e->gpu) return engine_device_bandwidth_gbs(); /* the device's memory feeds the GPU decode */
    return cpu_read_bandwidth_gbs(e->tp, (size_t)1 << 30, 5);
}

static double weight_read_bytes(const op_weight *w) {
    return (double)op_weight_row_bytes(w) * (double)w->n +
           2.0 * (double)op_weight_sb_bytes(w); /* MLX: scales, biases */
}

/* spec_limits_for with the bytes a parameter of the model's projections take as stored
 * (quantized ones with their scales; 2 where it has none). */
static spec_limits model_spec_limits(const model *m, int gpu) {
    double bytes = 0, params = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++)
            bytes += weight_read_bytes(ws[j]), params += (double)ws[j]->n * (double)ws[j]->k;
    }
    return spec_limits_for(gpu, params > 0 ? bytes / params : 2.0);
}

double engine_decode_bytes(const model *m, int context, int kv_quant) {
    const model_config *c = &m->cfg;
    double b = weight_read_bytes(&m->lm_head) + weight_read_bytes(&m->embed) / (double)c->vocab;
    /* Gemma 4's per-layer inputs: a row of their table and the projection of the embedding */
    if (c->per_layer_vocab > 0)
        b += weight_read_bytes(&m->embed_per_layer) / (double)c->per_layer_vocab + weight_read_bytes(&m->per_layer_proj);
    /* a token reads top_k of the experts */
    double active = c->n_experts > 0 ? (double)c->top_k_experts / (double)c->n_experts : 0.0;
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *l = &m->layers[i];
        /* the ones a layer lacks have no rows; a shared expert is read by every token */
        const op_weight *ws[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down, &l->router, &l->pl_gate,
                                 &l->pl_proj, &l->shared_gate, &l->shared_up, &l->shared_down, &l->shared_router};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) b += weight_read_bytes(ws[j]);
        b += active * (weight_read_bytes(&l->experts_gate) + weight_read_bytes(&l->experts_up) +
                       weight_read_bytes(&l->experts_down));
        if (l->linear) { /* a Gated DeltaNet layer: its projections and its state, read and written */
            const op_weight *g[] = {&l->gdn_qkv, &l->gdn_z, &l->gdn_b, &l->gdn_a, &l->gdn_out};
            for (size_t j = 0; j < sizeof g / sizeof g[0]; j++) b += weight_read_bytes(g[j]);
            b += 2.0 * (double)op_gdn_state_floats(&model_ops(m)->dims) * sizeof(float);
            continue;
        }
        int span = l->sliding && c->sliding_window > 0 && c->sliding_window < context ? c->sliding_window : context;
        double row = (double)kv_row_bytes(kv_quant, l->head_dim ? l->head_dim : c->head_dim);
        b += 2.0 * span * (l->n_kv_heads ? l->n_kv_heads : c->n_kv_heads) * row;
    }
    return b;
}

double hearth_engine_decode_bytes(const hearth_engine *e, int context) {
    return engine_decode_bytes(e->m, context, e->kv.quant); /* the GPU pool stores the same quant */
}
