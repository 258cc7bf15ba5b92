/* scheduler.c: continuous batching (hearth_batch_*): requests wait in FIFO order until
 * a sequence slot and the KV blocks for their prompt (less what the prefix cache holds)
 * are free, then every step packs one token per decoding request plus prompt chunks under
 * the step budget into a single engine_forward_rows call and samples each row through the
 * request's own gen_stream and slot sampler. A decoding request takes its next block when
 * it needs one; when the pool is out, the youngest request is preempted (recompute: its
 * blocks go back, it waits at the front of the queue with its tokens so far, and resumes
 * where it stopped). A request whose long prefix another running request is prefilling
 * right now waits for those blocks instead of computing them too (see
 * SCHED_SHARE_MIN_BLOCKS). A new request reuses the longest token prefix the cache holds:
 * whole shared blocks, then a copy of the leading rows of the block after them (a prompt
 * that diverges inside a block, or the last partial block a finished request left).
 * Speculative decoding (spec.h's prompt lookup or the engine's draft model proposes): a
 * decoding request may carry proposed tokens
 * after its next one; the step scores them all, the request samples each position in
 * turn with its own sampler and keeps them while the sample equals the proposal, and
 * the KV of the rest is cut off (never named in the prefix cache).
 * Owns no model or text logic; single-threaded by design. */
#include "engine/scheduler.h"
#include "base/cpu_features.h"
#include "base/err.h"
#include "engine/adapter.h"
#include "engine/engine_internal.h"
#include "engine/spec.h"
#include "grammar/grammar.h"
#include "kv/kv_prefix.h"
#include "kv/kv_state.h"
#include <stdlib.h>
#include <string.h>

/* steps the tokens/s figures of /stats average over: about a second of decoding at
 * small batch, so the numbers move with the load without jumping at every step */
#define SCHED_STATS_WINDOW 32

_Static_assert(SPEC_MAX_DRAFT + 1 <= KV_STATE_SPEC_TOKENS, "a journal holds a speculating row's step");

typedef struct sched_req {
    hearth_batch_request r;
    gen_stream g;
    int seq;          /* engine slot once admitted */
    size_t prefilled; /* prompt tokens in the KV cache */
    size_t attached;  /* of those, taken from the prefix cache at admission */
    int len;          /* tokens in the KV cache: prompt + generated ones fed back */
    int32_t next;     /* sampled token to feed at the next step (when decoding) */
    int decoding;
    double t0, t1;   /* admitted; prompt done */
    double t_submit; /* queued (for the wait /stats shows) */
    size_t n_fill;   /* tokens to prefill: the prompt's, or the resume buffer's */
    int32_t *resume; /* preempted while decoding: prompt + generated tokens to compute again */
    int admitted;    /* admitted before (so a readmission is a resume, not a new request) */
    uint64_t rng[4]; /* preempted: the slot sampler's state, restored on readmission */
    uint64_t dev_seed; /* the device sampler's key (gen_device_seed), fixed at first admission */
    int32_t draft[SPEC_MAX_DRAFT]; /* tokens proposed after next for this step */
    int n_draft;
    int proposer;     /* hearth_speculate of this step's proposal (lookup or draft) */
    spec_depth depth;
    double accept;    /* moving average of the per-token acceptance of its proposals (spec_cost_depth) */
    int n_accept;     /* verified proposals in it (0: none yet) */
    int cost_stops;   /* proposals the step cost stopped in a row (SPEC_COST_PROBE) */
    int dseq, dlen;   /* the draft model's slot (-1: none) and the positions of its KV that hold this request's tokens */
    /* a hybrid draft model: the backup record of its state from before this step's fed
     * proposals (-1: none) and the positions the state held then */
    int drec, dstart;
    /* hybrids (a recurrent state): the backup record of this step's proposal (-1: none), and
     * the tokens before len the state has not taken (a partly rejected proposal's: the state
     * went back to the backup, and the next step feeds them again before next) */
    int spec_rec, n_replay;
    int journaled; /* the backend journals this step's inputs for spec_rec: a rejection replays them there */
    /* multi-token prediction (mtp_catch_up): the head's slot (-1: none), the position its
     * pairs start at and the first not fed; this step's first row (-1: none) and its
     * position; the len whose first proposal (mtp_first) the head made (-1: none) */
    int mseq, mstart, mlen, hrow, hpos, mtp_at, mo;
    int32_t mtp_first;
    struct sched_req *next_waiting;
} sched_req;

/* Greedy ids one head step returns at most (its rows with logits: one per request). */
#define SCHED_MTP_IDS 256

struct hearth_batch {
    hearth_engine *e;
    sched_req *wait_head, *wait_tail;
    size_t n_waiting;
    sched_req **run; /* [max_run], admission order */
    int n_run, max_run, budget;
    int32_t *tok, *pos, *slot, *out_rows; /* [budget] */
    int *out_of;                          /* [max_run]: logits row of each running request, -1 none */
    size_t *remaining;                    /* [max_run] */
    int *take;                            /* [max_run] */
    sampler_row *rows;                    /* [max_run]: this step's rows to sample */
    struct sched_req **row_req;           /* [max_run]: the request of each row */
    int32_t *greedy_ids;                  /* [max out rows]: rows' ids chosen on the GPU (greedy or sampled there) */
    engine_sample_row *dev_rows;          /* [max out rows]: rows for the device sampler */
    prompt_cache *disk; /* hearth_batch_prompt_cache: finished requests saved there; NULL: none */
    /* monitoring (hearth_batch_stats_get) */
    unsigned long long prompt_tokens, cached_tokens, requests_done, steps, preemptions;
    unsigned long long spec_proposed[HEARTH_SPEC_KINDS], spec_accepted[HEARTH_SPEC_KINDS]; /* by hearth_speculate */
    unsigned long long spec_drafts[HEARTH_SPEC_KINDS], spec_rejected[HEARTH_SPEC_KINDS];
    spec_suffix *suffix;          /* --speculate suffix: the recent outputs' index (NULL: none) */
    int cost_gate;                /* the measured cost caps lookup's depth (spec_cost_depth): hybrid models only, whose
                                     speculating step carries a state backup and restore; not on the exact CPU tier */
    /* multi-token prediction: the step's final-normed hidden rows [budget, hidden]; the head's
     * step inputs and outputs [head step tokens, hidden]; each slot's last head output row
     * [max_run, hidden] (the chain's next input) */
    float *mhid, *mhin, *mhout, *mown;
    sched_proposer_fn propose_fn; /* NULL: prompt lookup */
    void *propose_user;
    double last_step_seconds;
    int last_step_tokens;
    double win_seconds[SCHED_STATS_WINDOW];
    int win_decode[SCHED_STATS_WINDOW], win_prefill[SCHED_STATS_WINDOW];
};

int sched_pack(const size_t *remaining, int n, int budget, int *take) {
    int used = 0;
    for (int i = 0; i < n; i++) {
        take[i] = 0;
        if (remaining[i] == 0 && used < budget) take[i] = 1, used++;
    }
    for (int i = 0; i < n && used < budget; i++)
        if (remaining[i] > 0) {
            size_t k = remaining[i] < (size_t)(budget - used) ? remaining[i] : (size_t)(budget - used);
            take[i] = (int)k;
            used += (int)k;
        }
    return used;
}

int sched_blocks_needed(size_t n_prompt, int max_tokens, int context) {
    size_t pos = n_prompt + (size_t)(max_tokens > 0 ? max_tokens : 0);
    if (pos > (size_t)context) pos = (size_t)context;
    return (int)((pos + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
}

size_t sched_shared_tokens(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b) {
    size_t lim = n_a > 0 ? n_a - 1 : 0, i = 0;
    if (n_b < lim) lim = n_b;
    while (i < lim && a[i] == b[i]) i++;
    return i;
}

int sched_shared_blocks(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b) {
    return (int)(sched_shared_tokens(a, n_a, b, n_b) / KV_BLOCK_SIZE);
}

hearth_status hearth_batch_create(hearth_engine *e, hearth_batch **out, hearth_error *err) {
    *out = NULL;
    int max_run = engine_max_sequences(e), budget = engine_step_tokens(e);
    if (max_run > budget)
        return err_set(err, HEARTH_ERR_INVALID,
                       "batching: %d sequences need a step budget of at least %d tokens (max_step_tokens is %d)",
                       max_run, max_run, budget);
    if (max_run > engine_max_out_rows(e))
        return err_set(err, HEARTH_ERR_INVALID, "batching: the engine returns %d logits rows, %d sequences need more",
                       engine_max_out_rows(e), max_run);
    hearth_batch *b = calloc(1, sizeof *b);
    if (!b) return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    b->e = e;
    b->max_run = max_run;
    b->budget = budget;
    b->run = calloc((size_t)max_run, sizeof *b->run);
    b->tok = malloc((size_t)budget * sizeof *b->tok);
    b->pos = malloc((size_t)budget * sizeof *b->pos);
    b->slot = malloc((size_t)budget * sizeof *b->slot);
    b->out_rows = malloc((size_t)budget * sizeof *b->out_rows);
    b->out_of = malloc((size_t)max_run * sizeof *b->out_of);
    b->remaining = malloc((size_t)max_run * sizeof *b->remaining);
    b->take = malloc((size_t)max_run * sizeof *b->take);
    b->rows = malloc((size_t)max_run * sizeof *b->rows);
    b->row_req = malloc((size_t)max_run * sizeof *b->row_req);
    b->greedy_ids = malloc((size_t)engine_max_out_rows(e) * sizeof *b->greedy_ids);
    b->dev_rows = malloc((size_t)engine_max_out_rows(e) * sizeof *b->dev_rows);
    int suffix_ok = engine_speculate(e) != HEARTH_SPEC_SUFFIX || (b->suffix = spec_suffix_new());
    hearth_engine *mtp = engine_mtp(e);
    if (mtp) {
        size_t H = (size_t)engine_hidden_size(e), mt = (size_t)engine_step_tokens(mtp);
        b->mhid = malloc((size_t)budget * H * sizeof(float));
        b->mhin = malloc(mt * H * sizeof(float));
        b->mhout = malloc(mt * H * sizeof(float));
        b->mown = malloc((size_t)max_run * H * sizeof(float));
        suffix_ok = suffix_ok && b->mhid && b->mhin && b->mhout && b->mown;
    }
    b->cost_gate =
        engine_kv(e)->state && (engine_spec_limits(e).max_step_tokens > 0 || cpu_level_active() != CPU_LEVEL_SCALAR);
    if (!b->run || !b->tok || !b->pos || !b->slot || !b->out_rows || !b->out_of || !b->remaining || !b->take ||
        !b->rows || !b->row_req || !b->greedy_ids || !b->dev_rows || !suffix_ok) {
        hearth_batch_free(b);
        return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    }
    *out = b;
    return HEARTH_OK;
}

hearth_status hearth_batch_prompt_cache(hearth_batch *b, const char *dir, long long max_bytes,
                                        hearth_prompt_cache_report *report, hearth_error *err) {
    hearth_prompt_cache_report local;
    if (b->disk || b->n_run || b->wait_head)
        return err_set(err, HEARTH_ERR_INVALID, "the prompt cache folder is set once, before any request");
    return prompt_cache_open(b->e, dir, max_bytes, &b->disk, report ? report : &local, err);
}

/* A request's MTP head sequence closed (none open: nothing); the head starts over. */
static void mtp_drop(hearth_batch *b, sched_req *q) {
    if (q->mseq >= 0) hearth_seq_close(engine_mtp(b->e), q->mseq);
    q->mseq = -1, q->mtp_at = -1, q->hrow = -1;
}

/* Ends a request: its slot and KV blocks go back at once, then the caller hears of it
 * (after which it may free what the request pointed to). */
/* Closes q's slot, keeping the KV it computed findable: its full blocks are named
 * already, its last partial block is kept for a later request that starts the same way. */
static void close_slot(hearth_batch *b, sched_req *q) {
    kv_prefix_commit_tail(engine_kv(b->e), q->seq, engine_history(b->e, q->seq), q->len);
    hearth_seq_close(b->e, q->seq);
    if (q->dseq >= 0) hearth_seq_close(engine_draft(b->e), q->dseq);
    q->dseq = -1, q->dlen = 0, q->drec = -1;
    mtp_drop(b, q);
}

static void req_done(hearth_batch *b, sched_req *q, hearth_status st, const hearth_error *err) {
    b->requests_done++;
    if (q->seq >= 0) {
        /* a hybrid's file can hold only a state the prefix cache kept, and the one every
         * later turn can use is at its prompt's end: its prompt only is noted */
        int keep = engine_kv(b->e)->state && (size_t)q->len > q->r.n_prompt ? (int)q->r.n_prompt : q->len;
        if (b->disk && st == HEARTH_OK) prompt_cache_note(b->disk, b->e, q->seq, keep);
        if (b->suffix && st == HEARTH_OK && (size_t)q->len > q->r.n_prompt) /* its output, for later requests */
            spec_suffix_add(b->suffix, engine_history(b->e, q->seq) + q->r.n_prompt, q->len - (int)q->r.n_prompt);
        close_slot(b, q);
        if (q->t1 > 0) q->r.result->generate_seconds = gen_now_seconds() - q->t1;
    }
    if (q->g.ds) gen_stream_free(&q->g);
    if (q->r.on_done) q->r.on_done(q->r.user, st, err);
    free(q->resume);
    free(q);
}

/* Removes running request i (keeping admission order) and ends it. */
static void run_done(hearth_batch *b, int i, hearth_status st, const hearth_error *err) {
    sched_req *q = b->run[i];
    memmove(b->run + i, b->run + i + 1, (size_t)(b->n_run - i - 1) * sizeof *b->run);
    b->n_run--;
    req_done(b, q, st, err);
}

void hearth_batch_free(hearth_batch *b) {
    if (!b) return;
    while (b->n_run > 0) {
        b->run[b->n_run - 1]->r.result->finish = HEARTH_FINISH_CANCELLED;
        run_done(b, b->n_run - 1, HEARTH_OK, NULL);
    }
    while (b->wait_head) {
        sched_req *q = b->wait_head;
        b->wait_head = q->next_waiting;
        q->r.result->finish = HEARTH_FINISH_CANCELLED;
        req_done(b, q, HEARTH_OK, NULL);
    }
    if (b->disk) prompt_cache_flush(b->disk, b->e); /* every slot is free now */
    prompt_cache_free(b->disk);
    spec_suffix_free(b->suffix);
    free(b->run);
    free(b->tok);
    free(b->pos);
    free(b->slot);
    free(b->out_rows);
    free(b->out_of);
    free(b->remaining);
    free(b->take);
    free(b->rows);
    free(b->row_req);
    free(b->greedy_ids);
    free(b->dev_rows);
    free(b->mhid);
    free(b->mhin);
    free(b->mhout);
    free(b->mown);
    free(b);
}

hearth_status hearth_batch_submit(hearth_batch *b, const hearth_batch_request *r, hearth_error *err) {
    if (!r->prompt || !r->params || !r->result) return err_set(err, HEARTH_ERR_INVALID, "batching: incomplete request");
    sched_req *q = calloc(1, sizeof *q);
    if (!q) return err_set(err, HEARTH_ERR_NOMEM, "batching: out of memory");
    q->r = *r;
    q->seq = -1;
    q->dseq = -1;
    q->spec_rec = -1, q->drec = -1;
    q->mseq = -1, q->hrow = -1, q->mtp_at = -1;
    q->t_submit = gen_now_seconds();
    q->n_fill = r->n_prompt;
    hearth_status st = gen_stream_init(&q->g, b->e, r->n_prompt, r->params, r->on_token, r->user, r->result, err);
    if (st) {
        free(q);
        return st;
    }
    if (b->wait_tail)
        b->wait_tail->next_waiting = q;
    else
        b->wait_head = q;
    b->wait_tail = q;
    b->n_waiting++;
    return HEARTH_OK;
}

size_t hearth_batch_waiting(const hearth_batch *b) { return b->n_waiting; }
size_t hearth_batch_running(const hearth_batch *b) { return (size_t)b->n_run; }

/* Unlinks waiting request *pp (prev: the one before it, NULL at the head). */
static sched_req *unlink_waiting(hearth_batch *b, sched_req **pp, sched_req *prev) {
    sched_req *q = *pp;
    *pp = q->next_waiting;
    if (b->wait_tail == q) b->wait_tail = prev;
    q->next_waiting = NULL;
    b->n_waiting--;
    return q;
}

static void drop_cancelled(hearth_batch *b) {
    for (sched_req **pp = &b->wait_head, *prev = NULL; *pp;) {
        sched_req *q = *pp;
        if (q->r.is_cancelled && q->r.is_cancelled(q->r.user)) {
            *pp = q->next_waiting;
            if (b->wait_tail == q) b->wait_tail = prev;
            b->n_waiting--;
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            req_done(b, q, HEARTH_OK, NULL);
        } else {
            prev = q;
            pp = &q->next_waiting;
        }
    }
    for (int i = b->n_run - 1; i >= 0; i--) {
        sched_req *q = b->run[i];
        if (q->r.is_cancelled && q->r.is_cancelled(q->r.user)) {
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            run_done(b, i, HEARTH_OK, NULL);
        }
    }
}

/* Whether two requests compute with the same adapters (their KV can be shared). */
/* The prefix cache namespace of a request's KV and state: its adapters' (0: the base). */
static uint64_t sched_namespace(const sched_req *q) { return q->g.adapters ? q->g.adapters->ns : 0; }

static int sched_same_adapters(const sched_req *a, const sched_req *b) { return sched_namespace(a) == sched_namespace(b); }

static const int32_t *fill_tokens(const sched_req *q) { return q->resume ? q->resume : q->r.prompt; }

/* Whether waiting request q should wait for a running request that is computing at
 * least SCHED_SHARE_MIN_BLOCKS blocks q shares (beyond those it took from the cache) and
 * has not computed all of them yet.
 * Only running requests are waited for, and every running prefill advances each step
 * (admission order is packing order), so this cannot deadlock: once the leader has
 * committed the shared blocks, or is cancelled, preempted or fails, q goes ahead
 * (attaching whatever the leader committed, computing the rest). */
/* The longest L <= limit (a multiple of KV_BLOCK_SIZE) whose state snapshot after
 * tokens[0..L) in namespace ns is kept (kv_state.h), or 0; *snap its record. */
static int snapshot_before(kv_cache *kv, uint64_t ns, const int32_t *tokens, int limit, int *snap) {
    uint64_t h = ns, hs[1024]; /* chain hashes, a window at a time */
    int best = 0, n = limit / KV_BLOCK_SIZE, cap = (int)(sizeof hs / sizeof hs[0]);
    *snap = -1;
    for (int k0 = 0; k0 < n; k0 += cap) {
        int m = n - k0 < cap ? n - k0 : cap;
        for (int k = 0; k < m; k++) hs[k] = h = kv_block_hash(h, tokens + (size_t)(k0 + k) * KV_BLOCK_SIZE);
        for (int k = m - 1; k >= 0; k--) {
            int s = kv_state_snap_find(kv, (k0 + k + 1) * KV_BLOCK_SIZE, hs[k]);
            if (s >= 0 && (k0 + k + 1) * KV_BLOCK_SIZE > best) {
                best = (k0 + k + 1) * KV_BLOCK_SIZE, *snap = s;
                break;
            }
        }
    }
    return best;
}

/* The cached prefix a new request starts from: every cached full block of it. On a hybrid
 * model (a recurrent-state pool) only as far as a state snapshot reaches: the blocks up to
 * the longest prefix whose state is kept, that state loaded into the slot. */
static int hybrid_attach(hearth_batch *b, sched_req *q) {
    kv_cache *kv = engine_kv(b->e);
    const int32_t *tokens = fill_tokens(q);
    if (!kv->state) return kv_prefix_attach(kv, q->seq, tokens, (int)q->n_fill);
    int snap, limit = (int)q->n_fill - 1; /* never the last token */
    uint64_t ns = sched_namespace(q);
    while (limit >= KV_BLOCK_SIZE) {
        int want = snapshot_before(kv, ns, tokens, limit, &snap);
        if (want == 0) return 0;
        int got = kv_prefix_attach(kv, q->seq, tokens, want + 1);
        hearth_error err = {0};
        if (got == want && !engine_state_snap_load(b->e, snap, q->seq, &err)) return got;
        kv_release(kv, q->seq); /* fewer blocks cached than the snapshot covers: try below them */
        kv_prefix_slot_namespace(kv, q->seq, ns); /* the release reset the slot's namespace */
        limit = got == want ? 0 : got; /* the snapshot's device copy failed: the prompt is computed whole */
    }
    return 0;
}

/* A hybrid sequence whose first len tokens end a block keeps its state there (kv_state.h):
 * the end of its prompt's last full block (the prefill stops there) in a record of its own;
 * any other block boundary a step ends on (a prefill chunk's, each one of its decode) in one
 * rolling record, overwritten by the next. */
static void hybrid_snapshot(hearth_batch *b, const sched_req *q) {
    kv_cache *kv = engine_kv(b->e);
    if (!kv->state || q->len <= 0 || q->len % KV_BLOCK_SIZE) return;
    const int32_t *hist = engine_history(b->e, q->seq);
    int prompt_end = !q->decoding && (size_t)q->len == q->n_fill / KV_BLOCK_SIZE * KV_BLOCK_SIZE;
    engine_state_snap_save(b->e, q->seq, (int)q->len, kv_state_chain_hash(sched_namespace(q), hist, (int)q->len),
                           !prompt_end);
}

static int waits_for_shared_prefix(const hearth_batch *b, const sched_req *q) {
    for (int i = 0; i < b->n_run; i++) {
        const sched_req *l = b->run[i];
        if (l->decoding || l->prefilled >= l->n_fill || !sched_same_adapters(l, q)) continue;
        size_t common = sched_shared_tokens(fill_tokens(q), q->n_fill, fill_tokens(l), l->n_fill);
        size_t full = common / KV_BLOCK_SIZE * KV_BLOCK_SIZE;
        /* the leader's block holding the last shared token, once it is full and committed */
        size_t end = (common + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE * KV_BLOCK_SIZE;
        if (end > l->n_fill) end = full;
        if (full >= l->attached + SCHED_SHARE_MIN_BLOCKS * KV_BLOCK_SIZE && l->prefilled < end) return 1;
    }
    return 0;
}

/* Admits waiting requests in FIFO order while a slot and the KV blocks for their prompt
 * and first generated token are free (cached blocks of their prefix need none); the first
 * that does not fit yet blocks the ones behind it (no overtaking, so no starvation). One
 * block per running request is kept back so that admitting does not force a preemption
 * at the next step. A request that could never fit the pool alone is refused. A request
 * waiting for a shared prefix another one is computing (waits_for_shared_prefix) is
 * passed over for now: it holds nothing, and the ones behind it may go ahead. */
static void admit(hearth_batch *b) {
    kv_cache *kv = engine_kv(b->e);
    int ctx = hearth_engine_context_length(b->e);
    sched_req **pp = &b->wait_head, *prev = NULL;
    while (*pp && b->n_run < b->max_run) {
        sched_req *q = *pp;
        const hearth_generate_params *p = q->r.params;
        int worst = sched_blocks_needed(q->r.n_prompt, p->max_tokens, ctx);
        hearth_error err = {0};
        if (worst > kv->n_blocks) {
            unlink_waiting(b, pp, prev);
            /* the caller's to fix (a smaller max_tokens), so INVALID: the server answers 400 */
            err_set(&err, HEARTH_ERR_INVALID,
                    "the request needs %d KV blocks (%zu prompt tokens + max_tokens %d) but the KV pool holds %d",
                    worst, q->r.n_prompt, p->max_tokens, kv->n_blocks);
            req_done(b, q, HEARTH_ERR_INVALID, &err);
            continue;
        }
        if (waits_for_shared_prefix(b, q)) {
            prev = q;
            pp = &q->next_waiting;
            continue;
        }
        int positions = (int)(q->n_fill + 1 < (size_t)ctx ? q->n_fill + 1 : (size_t)ctx);
        int need = sched_blocks_needed((size_t)positions, 0, ctx);
        hearth_status st = hearth_seq_open(b->e, &q->seq, &err);
        int reused = 0;
        if (!st) {
            engine_seq_use_adapters(b->e, q->seq, q->g.adapters); /* its prefix cache namespace too */
            /* the cached blocks of its prefix first: they need no new blocks (and no longer
             * count as available once held) */
            reused = hybrid_attach(b, q);
            kv_block_copy cp = {.src = -1};
            int part = kv->state ? 0 : kv_prefix_attach_partial(kv, q->seq, fill_tokens(q), (int)q->n_fill, &cp);
            if (part) { /* the next block's leading rows, copied before src may be evicted */
                st = engine_kv_copy_rows(b->e, cp.src, cp.dst, cp.rows, &err);
                kv_block_drop(kv, cp.src);
                reused += part;
            }
            int held = (reused + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
            if (!st && need - held + b->n_run > kv_blocks_available(kv)) {
                hearth_seq_close(b->e, q->seq); /* the attached blocks go back to the cache */
                q->seq = -1;
                break;
            }
            if (!st) st = kv_reserve(kv, q->seq, positions, &err);
        }
        unlink_waiting(b, pp, prev);
        if (st) {
            req_done(b, q, st, &err);
            continue;
        }
        engine_history_write(b->e, q->seq, fill_tokens(q), reused);
        q->prefilled = q->attached = (size_t)reused;
        q->len = reused;
        b->run[b->n_run++] = q;
        if (q->admitted) { /* a preempted request resumes: same sampler state, no new events */
            memcpy(engine_slot_sampler(b->e, q->seq)->rng, q->rng, sizeof q->rng);
            continue;
        }
        q->admitted = 1;
        q->r.result->cached_tokens = (size_t)reused;
        b->prompt_tokens += q->r.n_prompt;
        b->cached_tokens += (unsigned long long)reused;
        q->t0 = gen_now_seconds();
        q->dev_seed = gen_device_seed(&p->sampling);
        if (p->sampling.has_seed) sampler_seed(engine_slot_sampler(b->e, q->seq), p->sampling.seed);
        if (p->on_progress && p->on_progress(q->r.user, 0, q->r.n_prompt)) {
            q->r.result->finish = HEARTH_FINISH_CANCELLED;
            run_done(b, b->n_run - 1, HEARTH_OK, NULL);
        }
    }
}

/* Preempts running request i by recompute: its tokens so far are kept, its blocks go back
 * (into the prefix cache, its last partial block too, so a resume soon after recomputes
 * little), and it waits at the front of the queue. Swapping KV to host memory would save the recompute
 * but on CPU the pool already is host memory: recompute is the only choice that frees
 * anything. */
static void preempt(hearth_batch *b, int i) {
    sched_req *q = b->run[i];
    if (q->decoding) { /* a request still in its prompt just starts that over */
        int32_t *keep = malloc((size_t)q->len * sizeof *keep);
        if (!keep) {
            hearth_error err = {0};
            run_done(b, i, err_set(&err, HEARTH_ERR_NOMEM, "batching: out of memory preempting a request"), &err);
            return;
        }
        memcpy(keep, engine_history(b->e, q->seq), (size_t)q->len * sizeof *keep);
        free(q->resume);
        q->resume = keep;
        q->n_fill = (size_t)q->len;
        q->decoding = 0;
    }
    memcpy(q->rng, engine_slot_sampler(b->e, q->seq)->rng, sizeof q->rng);
    close_slot(b, q);
    q->seq = -1;
    q->prefilled = 0;
    q->len = 0;
    q->n_replay = 0, q->spec_rec = -1; /* the state is computed again from position 0 */
    memmove(b->run + i, b->run + i + 1, (size_t)(b->n_run - i - 1) * sizeof *b->run);
    b->n_run--;
    q->next_waiting = b->wait_head;
    b->wait_head = q;
    if (!b->wait_tail) b->wait_tail = q;
    b->n_waiting++;
    b->preemptions++;
}

/* Gives every decoding request the block its next token needs, oldest first; when the
 * pool is out, the youngest running request is preempted (possibly the one growing). */
static void grow(hearth_batch *b) {
    kv_cache *kv = engine_kv(b->e);
    for (int i = 0; i < b->n_run; i++) {
        sched_req *q = b->run[i];
        if (!q->decoding) continue;
        hearth_error err = {0};
        hearth_status st;
        while ((st = kv_reserve(kv, q->seq, q->len + 1, &err)) == HEARTH_ERR_NOMEM) {
            int youngest = b->n_run - 1;
            preempt(b, youngest);
            if (youngest == i) break;
        }
        if (st && st != HEARTH_ERR_NOMEM) run_done(b, i--, st, &err);
    }
}

/* Step time and token mix for /stats; decode rows are the running requests that decode. */
static void record_step(hearth_batch *b, int T, double seconds) {
    int decode = 0;
    for (int i = 0; i < b->n_run; i++) decode += b->run[i]->decoding ? b->take[i] : 0;
    int k = (int)(b->steps++ % SCHED_STATS_WINDOW);
    b->win_seconds[k] = seconds, b->win_decode[k] = decode, b->win_prefill[k] = T - decode;
    b->last_step_seconds = seconds, b->last_step_tokens = T;
}

void hearth_batch_stats_get(const hearth_batch *b, hearth_batch_stats *out) {
    memset(out, 0, sizeof *out);
    out->running = (size_t)b->n_run;
    out->waiting = b->n_waiting;
    for (const sched_req *q = b->wait_head; q && out->n_queued < HEARTH_STATS_MAX_QUEUED; q = q->next_waiting) {
        out->queued_since[out->n_queued] = q->t_submit;
        out->queued_prompt_tokens[out->n_queued++] = q->r.n_prompt;
    }
    const kv_cache *kv = engine_kv(b->e);
    out->kv_blocks = kv->n_blocks;
    out->kv_blocks_free = kv->n_free;
    out->kv_blocks_cached = kv_blocks_cached(kv);
    out->kv_blocks_used = kv->n_blocks - kv->n_free - out->kv_blocks_cached;
    out->prompt_tokens = b->prompt_tokens, out->cached_tokens = b->cached_tokens;
    out->requests_done = b->requests_done, out->steps = b->steps, out->preemptions = b->preemptions;
    out->last_step_seconds = b->last_step_seconds, out->last_step_tokens = b->last_step_tokens;
    /* a mixed step's time is split between its decode and prefill tokens by count */
    double dsec = 0, psec = 0;
    long decode = 0, prefill = 0;
    for (int k = 0; k < SCHED_STATS_WINDOW && (unsigned long long)k < b->steps; k++) {
        int T = b->win_decode[k] + b->win_prefill[k];
        if (T <= 0) continue;
        dsec += b->win_seconds[k] * b->win_decode[k] / T, psec += b->win_seconds[k] * b->win_prefill[k] / T;
        decode += b->win_decode[k], prefill += b->win_prefill[k];
    }
    memcpy(out->spec_proposed, b->spec_proposed, sizeof out->spec_proposed);
    memcpy(out->spec_accepted, b->spec_accepted, sizeof out->spec_accepted);
    memcpy(out->spec_drafts, b->spec_drafts, sizeof out->spec_drafts);
    memcpy(out->spec_rejected, b->spec_rejected, sizeof out->spec_rejected);
    if (dsec > 0) out->decode_tok_s = decode / dsec;
    if (psec > 0) out->prefill_tok_s = prefill / psec;
}

/* Samples every row of the step in one pass (sampler_sample_rows: each request with its
 * own parameters, history and seeded sampler), then hands each token to its request. */
static void sample_and_accept(hearth_batch *b, int n_rows, int sampled) {
    if (!sampled) sampler_sample_rows(b->rows, n_rows, engine_threads(b->e));
    for (int k = 0; k < n_rows; k++) {
        sched_req *q = b->row_req[k];
        q->next = gen_stream_accept(&q->g, b->rows[k].token, q->seq, q->len, q->t0);
        q->decoding = 1;
        if (!q->r.result->finish) continue;
        for (int i = 0; i < b->n_run; i++)
            if (b->run[i] == q) {
                run_done(b, i, HEARTH_OK, NULL);
                break;
            }
    }
}

static int32_t argmax_row(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One draft step: ids[i] = the greedy pick of out_rows[i]. On the GPU the pick is made on
 * the device (no logits row leaves it: 32 requests' rows of a 128k vocabulary are 16 MB a
 * step to copy and scan on the host); on the CPU from the logits the step leaves. */
static hearth_status draft_step(hearth_engine *d, int T, const int32_t *tok, const int32_t *pos,
                                const int32_t *slot, int n_out, const int32_t *out_rows, int32_t *ids,
                                hearth_error *err) {
    if (hearth_engine_device(d) == HEARTH_DEVICE_CUDA)
        return engine_forward_rows_greedy(d, T, tok, pos, slot, n_out, out_rows, ids, err);
    const float *logits;
    hearth_status st = engine_forward_rows(d, T, tok, pos, slot, n_out, out_rows, &logits, err);
    int vocab = hearth_model_vocab_rows(d);
    for (int i = 0; !st && i < n_out; i++) ids[i] = argmax_row(logits + (size_t)i * vocab, vocab);
    return st;
}

/* Benchmarks' controlled acceptance (hearth_spec_replay): q's draft proposals replaced by
 * the first recorded text that holds q's tokens so far, each kept with probability accept,
 * else made to differ from it (the draft's own KV keeps what the draft computed: its
 * proposals are discarded anyway, and it pays the cost a draft of that acceptance would). */
static void replay(hearth_batch *b, const hearth_spec_replay *rp, sched_req *q, int vocab) {
    const int32_t *hist = engine_history(b->e, q->seq), *text = NULL;
    size_t have = (size_t)q->len + 1; /* next is at q->len */
    for (int t = 0; !text && t < rp->n_texts && have < rp->n; t++)
        if (!memcmp(rp->tokens + (size_t)t * rp->n, hist, have * sizeof *hist)) text = rp->tokens + (size_t)t * rp->n;
    for (int j = 0; text && j < q->n_draft && have + (size_t)j < rp->n; j++) {
        uint64_t pos = have + (uint64_t)j; /* splitmix64 of (seed, slot, position) */
        uint64_t z = rp->seed ^ ((uint64_t)q->seq * 0xd1b54a32d192ed03ULL) ^ (pos * 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        int keep = (double)(z >> 11) * 0x1.0p-53 < rp->accept;
        q->draft[j] = keep ? text[pos] : (text[pos] + 1) % vocab;
    }
}

/* The draft model's proposals for the n requests in b->row_req (n_draft: how many each
 * may take): each first feeds the draft what it has not seen of its tokens (prompt and
 * output up to next, in chunks of the step budget; all requests in the same steps), whose
 * last row gives the first proposal, then k - 1 steps of one token per request, each the
 * greedy pick of the row before. A request whose draft KV cannot grow proposes nothing.
 * Returns the proposed tokens given back (budgets not used). Uses b->tok/pos/slot/out_rows
 * before the step packs them. */
/* A draft model's or MTP head's proposals for rows [0, n): a benchmark's known acceptance
 * applied (hearth_spec_replay), then each row's proposals reserved in the target's KV as
 * lookup's are (a row that gets no room proposes nothing). Returns the tokens dropped. */
static int proposals_reserve(hearth_batch *b, int n) {
    const hearth_spec_replay *rp = engine_spec_replay(b->e);
    int unused = 0;
    hearth_error err = {0};
    for (int r = 0; rp && r < n; r++) replay(b, rp, b->row_req[r], hearth_model_vocab_rows(b->e));
    for (int r = 0; r < n; r++) {
        sched_req *q = b->row_req[r];
        if (q->n_draft && kv_reserve(engine_kv(b->e), q->seq, q->len + 1 + q->n_draft, &err))
            unused += q->n_draft, q->n_draft = 0;
    }
    return unused;
}

static int draft_propose(hearth_batch *b, hearth_engine *d, int n) {
    kv_cache *dkv = engine_kv(d);
    int budget = engine_step_tokens(d), unused = 0;
    /* a step's greedy picks: at most its rows, which the step budget and the requests bound */
    int32_t *ids = malloc((size_t)(budget > n ? budget : n) * sizeof *ids);
    hearth_error err = {0};
    if (!ids) {
        for (int r = 0; r < n; r++) unused += b->row_req[r]->n_draft, b->row_req[r]->n_draft = 0;
        return unused;
    }
    for (int r = 0; r < n; r++) {
        sched_req *q = b->row_req[r];
        int k = q->n_draft;
        if ((q->dseq < 0 && hearth_seq_open(d, &q->dseq, &err)) || kv_reserve(dkv, q->dseq, q->len + k, &err)) {
            unused += k, q->n_draft = 0; /* positions len .. len + k - 1 are fed */
            continue;
        }
    }
    for (int more = 1; more;) { /* catch-up steps */
        int T = 0, n_out = 0;
        more = 0;
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (!q->n_draft || q->dlen > q->len) continue;
            const int32_t *hist = engine_history(b->e, q->seq);
            while (q->dlen <= q->len && T < budget) b->tok[T] = hist[q->dlen], b->pos[T] = q->dlen++, b->slot[T++] = q->dseq;
            if (q->dlen > q->len) b->out_rows[n_out++] = T - 1;
            else more = 1;
        }
        if (T == 0) break;
        if (draft_step(d, T, b->tok, b->pos, b->slot, n_out, b->out_rows, ids, &err)) goto fail;
        for (int r = 0, o = 0; r < n && o < n_out; r++) { /* rows in request order */
            sched_req *q = b->row_req[r];
            if (q->n_draft && q->dlen == q->len + 1 && b->slot[b->out_rows[o]] == q->dseq) q->draft[0] = ids[o++];
        }
    }
    if (dkv->state) { /* a hybrid draft: its state takes the proposals fed next; each row backs it up
                       * first (the draft's speculation records), so a rejection can go back */
        int jrec = 0;
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->n_draft <= 1) continue; /* the first proposal feeds nothing past next */
            if (jrec < dkv->state->n_spec && !engine_state_spec_copy(d, q->dseq, jrec, 1, &err))
                q->drec = jrec++, q->dstart = q->dlen;
            else
                unused += q->n_draft - 1, q->n_draft = 1;
        }
    }
    for (int j = 1; j < SPEC_MAX_DRAFT; j++) { /* one token per request per step */
        int T = 0;
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->n_draft <= j) continue;
            b->tok[T] = q->draft[j - 1], b->pos[T] = q->len + j, b->slot[T] = q->dseq, b->out_rows[T] = T, T++;
            q->dlen = q->len + j + 1;
        }
        if (T == 0) break;
        if (draft_step(d, T, b->tok, b->pos, b->slot, T, b->out_rows, ids, &err)) goto fail;
        for (int r = 0, o = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->n_draft > j) q->draft[j] = ids[o++];
        }
    }
    free(ids);
    return unused + proposals_reserve(b, n);
fail: /* a failing draft step: no proposals this step, the draft starts over for these requests */
    for (int r = 0; r < n; r++) {
        sched_req *q = b->row_req[r];
        unused += q->n_draft, q->n_draft = 0;
        if (q->dseq >= 0) hearth_seq_close(d, q->dseq);
        q->dseq = -1, q->dlen = 0, q->drec = -1;
    }
    free(ids);
    return unused;
}

/* ---- multi-token prediction (HEARTH_SPEC_MTP; vLLM's Qwen3.5 MTP proposer) ----
 * The head (engine_mtp) reads, at the request's position i, the token at i + 1 and the
 * model's final-normed hidden row of position i; its output predicts the token at i + 2.
 * Every step hands out its hidden rows (b->mhid); right after it each request feeds the head
 * the pairs its new rows complete (mtp_catch_up), whose last output is the next step's first
 * proposal; mtp_chain adds the others, each from the head's own hidden row before it. The
 * head's positions count from the request's first computed row (a prefix taken from the
 * cache has no hidden rows; RoPE is relative): head position = i - mstart. What the chain
 * wrote past len is written again by the next catch-up. */

/* The head's step over T pairs of b->tok/pos/slot and b->mhin; n_out rows b->out_rows come
 * back as greedy ids (ids) and hidden rows (b->mhout, every row). */
static hearth_status mtp_step(hearth_batch *b, hearth_engine *d, int T, int n_out, int32_t *ids, hearth_error *err) {
    engine_step_hidden(d, b->mhin, b->mhout);
    hearth_status st = draft_step(d, T, b->tok, b->pos, b->slot, n_out, b->out_rows, ids, err);
    engine_step_hidden(d, NULL, NULL);
    return st;
}

/* A draft model's or MTP head's depth this step: the deepest decoding request's
 * num_draft_tokens, at most SPEC_MAX_DRAFT. */
static int draft_depth(const hearth_batch *b) {
    int depth = 0;
    for (int i = 0; i < b->n_run; i++)
        if (b->run[i]->decoding && b->run[i]->r.params->num_draft_tokens > depth)
            depth = b->run[i]->r.params->num_draft_tokens;
    return depth > SPEC_MAX_DRAFT ? SPEC_MAX_DRAFT : depth;
}

static void mtp_catch_up(hearth_batch *b) {
    hearth_engine *d = engine_mtp(b->e);
    kv_cache *dkv = engine_kv(d);
    int H = engine_hidden_size(b->e), budget = engine_step_tokens(d), ctx = hearth_engine_context_length(d), n = 0;
    size_t row = (size_t)H * sizeof(float);
    hearth_error err = {0};
    for (int i = 0; i < b->n_run; i++) {
        sched_req *q = b->run[i];
        if (q->hrow < 0) continue;
        q->mtp_at = -1, q->mo = -1;
        if (q->mseq >= 0 && (q->mlen < q->hpos || q->mlen > q->len)) /* rows missing between: start again here */
            kv_truncate(dkv, q->mseq, 0), q->mstart = q->mlen = q->hpos;
        if (q->mseq < 0) {
            if (hearth_seq_open(d, &q->mseq, &err)) {
                q->mseq = -1, q->hrow = -1;
                continue;
            }
            q->mstart = q->mlen = q->hpos;
        }
        int want = q->len - q->mstart + SPEC_MAX_DRAFT;
        kv_truncate(dkv, q->mseq, q->mlen - q->mstart); /* the last chain's guesses */
        if (kv_reserve(dkv, q->mseq, want < ctx ? want : ctx, &err)) {
            mtp_drop(b, q);
            continue;
        }
        b->row_req[n++] = q;
    }
    /* proposals next step only where the step may carry them (propose's spec_step_room, at
     * this step's decoding rows): past that the head takes the rows into its KV, to propose
     * again when the batch shrinks, but skips its lm_head (as costly as the model's) */
    int n_dec = 0, depth = draft_depth(b);
    for (int i = 0; i < b->n_run; i++) n_dec += b->run[i]->decoding;
    int outputs = spec_step_room(engine_spec_limits(b->e), n_dec, depth) > 0;
    int32_t ids[SCHED_MTP_IDS];
    for (int more = n > 0; more;) {
        int T = 0, n_out = 0;
        more = 0;
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->mseq < 0 || q->mlen >= q->len) continue;
            const int32_t *hist = engine_history(b->e, q->seq), *fill = fill_tokens(q);
            while (q->mlen < q->len && T < budget) {
                int i = q->mlen++;
                b->tok[T] = i + 1 < q->len ? hist[i + 1] : q->decoding ? q->next : fill[i + 1];
                b->pos[T] = i - q->mstart, b->slot[T] = q->mseq;
                memcpy(b->mhin + (size_t)T * H, b->mhid + (size_t)(q->hrow + i - q->hpos) * H, row);
                T++;
            }
            if (q->mlen < q->len)
                more = 1;
            else if (q->decoding && outputs && n_out < SCHED_MTP_IDS)
                q->mo = n_out, b->out_rows[n_out++] = T - 1;
        }
        if (T == 0) break;
        if (mtp_step(b, d, T, n_out, ids, &err)) {
            for (int r = 0; r < n; r++) mtp_drop(b, b->row_req[r]);
            return;
        }
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->mo < 0) continue;
            q->mtp_first = ids[q->mo], q->mtp_at = q->len;
            memcpy(b->mown + (size_t)q->seq * H, b->mhout + (size_t)b->out_rows[q->mo] * H, row);
            q->mo = -1;
        }
    }
    for (int r = 0; r < n; r++) b->row_req[r]->hrow = -1;
}

/* The proposals of the n requests in b->row_req (n_draft: how many each may take): the first
 * from the catch-up, then one head step per further token for all of them. Returns the
 * proposed tokens given back. */
static int mtp_chain(hearth_batch *b, hearth_engine *d, int n) {
    int H = engine_hidden_size(b->e), unused = 0;
    size_t row = (size_t)H * sizeof(float);
    int32_t ids[SCHED_MTP_IDS];
    hearth_error err = {0};
    for (int r = 0; r < n; r++) b->row_req[r]->draft[0] = b->row_req[r]->mtp_first, b->row_req[r]->mo = -1;
    for (int j = 1; j < SPEC_MAX_DRAFT; j++) {
        int T = 0;
        for (int r = 0; r < n && T < SCHED_MTP_IDS; r++) {
            sched_req *q = b->row_req[r];
            if (q->n_draft <= j) continue;
            b->tok[T] = q->draft[j - 1], b->pos[T] = q->len + j - 1 - q->mstart, b->slot[T] = q->mseq;
            memcpy(b->mhin + (size_t)T * H, b->mown + (size_t)q->seq * H, row);
            b->out_rows[T] = T, q->mo = T++;
        }
        if (T == 0) break;
        hearth_status st = mtp_step(b, d, T, T, ids, &err);
        for (int r = 0; r < n; r++) {
            sched_req *q = b->row_req[r];
            if (q->n_draft <= j) continue;
            if (st || q->mo < 0) { /* no head step for it: the proposal ends here */
                unused += q->n_draft - j, q->n_draft = j;
            } else {
                q->draft[j] = ids[q->mo];
                memcpy(b->mown + (size_t)q->seq * H, b->mhout + (size_t)q->mo * H, row);
            }
            q->mo = -1;
        }
    }
    return unused + proposals_reserve(b, n);
}

/* Proposes tokens for decoding requests (the draft model's num_draft_tokens when the
 * engine has one, else prompt lookup over each one's own tokens, as deep as its acceptance
 * allows) while the step has spare logits rows and tokens, within the backend's limits
 * (spec_step_room: none with more decoding than the CPU's few rows, or past the GPU's
 * memory-bound token count; a draft model all rows or none), none for rows the GPU
 * samples (their draws are not the host sampler's sequence), and only into KV blocks that
 * are free now (a guess never evicts cached prefixes or preempts a request). Returns the
 * tokens proposed. */
static int propose(hearth_batch *b) {
    hearth_engine *e = b->e;
    int n_dec = 0, total = 0;
    for (int i = 0; i < b->n_run; i++) b->run[i]->n_draft = 0, n_dec += b->run[i]->decoding;
    kv_cache *kv = engine_kv(e);
    /* a hybrid's recurrent state runs through every token of the step: a row speculates with a
     * backup of its state (kv_state_spec_records of them) and, when a proposal is rejected,
     * goes back to it, then through the accepted tokens again: from the backend's journal of
     * the step (state_journal, the CPU), else fed again at the next step (n_replay, at most a
     * block's worth: a step never crosses the block boundary after the state's position, so
     * every boundary's snapshot is still taken). The step budget keeps room for the replays. */
    int n_spec = kv->state ? kv->state->n_spec : 0, replays = 0, candidates = 0;
    if (kv->state && b->budget - b->max_run < n_spec * (KV_BLOCK_SIZE - 1)) n_spec = 0;
    for (int i = 0; i < b->n_run; i++) replays += b->run[i]->decoding ? b->run[i]->n_replay : 0;
    hearth_engine *draft = engine_draft(e), *mtp = engine_mtp(e);
    int depth = draft || mtp ? draft_depth(b) : 0; /* a draft model's or MTP head's */
    if (engine_speculate(e) == HEARTH_SPEC_NONE || (kv->state && n_spec == 0)) return 0;
    int reach = spec_step_room(engine_spec_limits(e), n_dec, depth);
    if (reach <= 0) return 0;
    if (!draft && !mtp && b->cost_gate && spec_cost_plain_due(engine_spec_cost(b->e), n_dec))
        return 0; /* a plain step, measured */
    int rows = engine_max_out_rows(e) - b->n_run, tokens = b->budget - b->n_run - replays;
    if (reach < tokens) tokens = reach;
    int ctx = hearth_engine_context_length(e), n_drafting = 0;
    for (int i = 0; i < b->n_run; i++) {
        sched_req *q = b->run[i];
        const hearth_generate_params *p = q->r.params;
        if (!q->decoding || (gen_device_sample(e, p) && !gen_device_greedy(e, p))) continue;
        /* a hybrid row feeding a rejected proposal's tokens again proposes nothing this step:
         * a second rejection would stack more tokens to feed again on the next one */
        if (kv->state && (q->n_replay > 0 || candidates++ >= n_spec)) continue;
        /* the head proposes from the catch-up after this request's last step only */
        if (mtp && q->mtp_at != q->len) continue;
        q->proposer = draft ? HEARTH_SPEC_DRAFT : mtp ? HEARTH_SPEC_MTP : HEARTH_SPEC_LOOKUP;
        /* a benchmark replaying recorded text (hearth_spec_replay) in lookup's place: lookup's
         * adaptive depth, at most num_draft_tokens */
        const hearth_spec_replay *rp = draft || mtp ? NULL : engine_spec_replay(e);
        int k = draft || mtp ? p->num_draft_tokens : spec_depth_next(&q->depth);
        if (rp && rp->tokens && k > p->num_draft_tokens) k = p->num_draft_tokens;
        if (k > SPEC_MAX_DRAFT) k = SPEC_MAX_DRAFT;
        if (!draft && !mtp && k > 0 && b->cost_gate) { /* no deeper than the measured step cost repays */
            int kc = spec_cost_depth(engine_spec_cost(b->e), n_dec, q->n_accept ? q->accept : 0.5, k);
            if (kc > 0) {
                q->cost_stops = 0;
            } else if (++q->cost_stops > SPEC_COST_PROBE) { /* a probe at depth 1: the estimate moves */
                kc = 1, q->cost_stops = 0;
            } else { /* as a draft with nothing accepted: a pause, longer each time (2 .. 64 steps) */
                spec_depth_update(&q->depth, 1, 0, 0);
                continue;
            }
            k = kc;
        }
        int left = p->max_tokens - (int)q->r.result->completion_tokens - 1; /* the step emits up to k + 1 */
        int room = (kv->n_tokens[q->seq] + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE * KV_BLOCK_SIZE +
                   kv->n_free * KV_BLOCK_SIZE - (q->len + 1);
        /* a hybrid: up to the block boundary after its state's position */
        int edge = kv->state ? ((q->len - q->n_replay) / KV_BLOCK_SIZE + 1) * KV_BLOCK_SIZE - (q->len + 1) : k;
        int lim[] = {rows - total, tokens - total, left, ctx - 1 - q->len, room, edge};
        for (size_t j = 0; j < sizeof lim / sizeof lim[0]; j++) k = lim[j] < k ? lim[j] : k;
        if (k <= 0) continue;
        engine_history_set(e, q->seq, q->len, q->next);
        if (draft || mtp) { /* the draft model or head proposes for all of them at once, below */
            q->n_draft = k; /* its budget, until draft_propose fills it */
            b->row_req[n_drafting++] = q;
            total += k;
            continue;
        }
        const int32_t *hist = engine_history(e, q->seq);
        int most = k;
        if (rp && rp->tokens) { /* the recorded text's next tokens, each kept with the replay's probability */
            q->n_draft = k;
            replay(b, rp, q, hearth_model_vocab_rows(e));
            q->n_draft = 0;
        } else if (b->propose_fn) {
            k = b->propose_fn(b->propose_user, hist, q->len + 1, k, q->draft);
        } else {
            /* the request's own context, or the recent outputs' index where it matches longer */
            int own, other, ks = 0;
            int32_t alt[SPEC_MAX_DRAFT];
            int kl = spec_lookup_match(hist, q->len + 1, k, q->draft, &own);
            if (b->suffix) ks = spec_suffix_lookup(b->suffix, hist, q->len + 1, k, alt, &other);
            if (ks > 0 && other > own) {
                memcpy(q->draft, alt, sizeof(int32_t) * (size_t)ks);
                q->proposer = HEARTH_SPEC_SUFFIX;
            }
            k = ks > 0 && other > own ? ks : kl;
        }
        /* lookup proposes only the request's own tokens: proposals from other requests'
         * answers make a request's text depend on what the server answered before (on the
         * SIMD kernels a verified step rounds as one matrix product), so the same request
         * could answer differently the second time. --speculate suffix takes that on, by
         * choice; the exact and deterministic tiers answer the same either way. */
        hearth_error err = {0};
        if (k > most) k = most;
        /* a constrained row: the proposal up to the first token its grammar forbids (the
         * verified sample there is masked, so it could never match; its rows are spared),
         * then what the grammar forces after it (a required key's letters, the closing of a
         * fixed structure, through optional whitespace as the output laid it out before),
         * spelled by the model's tokenizer */
        if (q->g.matcher) {
            if (k > 0) k = (int)gmatcher_allowed_prefix(q->g.matcher, q->draft, (size_t)k);
            k = (int)gen_stream_extend_forced(&q->g, q->draft, (size_t)k, (size_t)most);
        }
        if (k <= 0 || kv_reserve(kv, q->seq, q->len + 1 + k, &err)) continue;
        q->n_draft = k;
        total += k;
    }
    if (n_drafting) total -= mtp ? mtp_chain(b, mtp, n_drafting) : draft_propose(b, draft, n_drafting);
    hearth_error jerr = {0};
    for (int j = 0; kv->state && j < n_spec; j++) engine_state_journal(e, j, -1, &jerr); /* none left over */
    for (int i = 0, j = 0; kv->state && i < b->n_run; i++) { /* the hybrids' backups, and journals where kept */
        sched_req *q = b->run[i];
        hearth_error err = {0};
        if (!q->n_draft) continue;
        if (j < n_spec && !engine_state_spec_copy(e, q->seq, j, 1, &err)) {
            q->spec_rec = j++;
            q->journaled = !engine_state_journal(e, q->spec_rec, q->seq, &err);
        } else {
            total -= q->n_draft, q->n_draft = 0;
        }
    }
    return total;
}

/* Verifies decoding request i's proposal after the step: position j's token is sampled
 * from logits row out_of[i] + j (or taken from the device's greedy ids) exactly as a step
 * of its own would sample it, emitted, and kept; the walk stops at the first sample that
 * differs from the proposal (that sample is the request's next token), or when the
 * request finishes. Sampling each position with the same draws as without speculation
 * makes the output identical, and its distribution the target's: a proposed token is
 * accepted with the target's probability of it, and a rejection's replacement follows
 * the target's distribution without it. The KV of the rejected positions is cut off. */
static void verify(hearth_batch *b, int i, const float *logits, int on_device) {
    sched_req *q = b->run[i];
    kv_cache *kv = engine_kv(b->e);
    size_t vocab = (size_t)hearth_model_vocab_rows(b->e);
    int k = q->n_draft, first = b->out_of[i], j = 0, accepted, state_len = q->len - q->n_replay;
    int32_t id;
    for (;; j++) {
        q->len++; /* the token fed at row j (next, then the accepted proposals) is in the KV */
        sampler_row r = gen_stream_row(&q->g, engine_slot_sampler(b->e, q->seq),
                                       on_device ? NULL : logits + (size_t)(first + j) * vocab, q->seq, q->len);
        if (on_device)
            r.token = b->greedy_ids[first + j];
        else
            sampler_sample_rows(&r, 1, NULL);
        id = gen_stream_accept(&q->g, r.token, q->seq, q->len, q->t0);
        if (q->r.result->finish || j == k || id != q->draft[j]) break;
    }
    accepted = j < k && id == q->draft[j] ? j + 1 : j;
    b->spec_proposed[q->proposer] += (unsigned long long)k, b->spec_accepted[q->proposer] += (unsigned long long)accepted;
    b->spec_drafts[q->proposer]++;
    b->spec_rejected[q->proposer] += accepted < k && !q->r.result->finish;
    if (!q->r.result->finish) { /* the per-token acceptance: kept over kept and missed */
        double a = (double)accepted / (double)(accepted + (accepted < k));
        q->accept = q->n_accept++ ? 0.7 * q->accept + 0.3 * a : a;
    }
    if (q->proposer != HEARTH_SPEC_DRAFT && q->proposer != HEARTH_SPEC_MTP) /* strict: a hybrid row fed again */
        spec_depth_update(&q->depth, k, accepted, q->spec_rec >= 0 && !q->journaled);
    if (q->dseq >= 0) { /* the draft's KV holds next and the proposals before the last: keep the accepted */
        hearth_engine *d = engine_draft(b->e);
        hearth_error err = {0};
        if (q->drec >= 0 && accepted < k - 1) { /* a hybrid draft's state took a rejected proposal: back */
            if (engine_state_spec_copy(d, q->dseq, q->drec, 0, &err)) {
                hearth_seq_close(d, q->dseq); /* it starts over: fed everything again */
                q->dseq = -1, q->dlen = 0;
            } else {
                q->dlen = q->dstart; /* the accepted tokens are fed again with the next proposal's catch-up */
            }
        }
        q->drec = -1;
        if (q->dseq >= 0) {
            if (q->dlen > q->len) q->dlen = q->len;
            kv_truncate(engine_kv(d), q->dseq, q->dlen);
        }
    }
    q->next = id;
    q->n_draft = 0;
    kv_truncate(kv, q->seq, q->len);
    kv_prefix_commit(kv, q->seq, engine_history(b->e, q->seq), q->len);
    if (q->spec_rec >= 0) { /* a hybrid: its state took every proposal; back to before them if one failed */
        hearth_error err = {0};
        int rec = q->spec_rec, journaled = q->journaled;
        q->n_replay = 0, q->spec_rec = -1, q->journaled = 0;
        if (accepted < k && !q->r.result->finish) {
            if (engine_state_spec_copy(b->e, q->seq, rec, 0, &err)) {
                run_done(b, i, HEARTH_ERR_IO, &err);
                return;
            }
            /* the kept tokens: through the backend's journal, else fed again at the next step */
            if (!journaled || engine_state_replay(b->e, q->seq, rec, q->len - state_len, &err))
                q->n_replay = q->len - state_len;
        }
        if (journaled) engine_state_journal(b->e, rec, -1, &err);
        hybrid_snapshot(b, q);
    }
    if (q->r.result->finish) run_done(b, i, HEARTH_OK, NULL);
}

void sched_set_proposer(hearth_batch *b, sched_proposer_fn fn, void *user) {
    b->propose_fn = fn;
    b->propose_user = user;
}

size_t hearth_batch_step(hearth_batch *b) {
    drop_cancelled(b);
    grow(b); /* running requests before new ones */
    admit(b);
    if (b->n_run == 0) return b->n_waiting;
    double t_begin = gen_now_seconds(); /* the whole step, proposing and verifying included: spec_cost */
    int drafted = propose(b), replayed = 0;
    for (int i = 0; i < b->n_run; i++)
    {
        sched_req *q = b->run[i];
        replayed += q->decoding ? q->n_replay : 0;
        b->remaining[i] = q->decoding ? 0 : q->n_fill - q->prefilled;
        /* hybrids: a prefill chunk stops at the prompt's last block boundary, whose state is kept */
        size_t edge = q->n_fill / KV_BLOCK_SIZE * KV_BLOCK_SIZE;
        if (engine_kv(b->e)->state && !q->decoding && q->prefilled < edge && edge < q->n_fill)
            b->remaining[i] = edge - q->prefilled;
    }
    /* proposed tokens come out of the prompts' share (propose left a token for every row) */
    int T = sched_pack(b->remaining, b->n_run, b->budget - drafted - replayed, b->take) + drafted + replayed, t = 0,
        n_out = 0;
    int n_dec_taken = 0; /* decoding rows in this step */
    for (int i = 0; i < b->n_run; i++) n_dec_taken += b->run[i]->decoding && b->take[i];
    for (int i = 0; i < b->n_run; i++) {
        sched_req *q = b->run[i];
        b->out_of[i] = -1;
        q->hrow = -1;
        if (!b->take[i]) continue;
        q->hrow = t, q->hpos = q->decoding ? q->len - q->n_replay : (int)q->prefilled; /* its rows' hidden rows */
        if (q->decoding) {
            const int32_t *hist = engine_history(b->e, q->seq);
            b->take[i] += q->n_draft + q->n_replay;
            for (int j = q->n_replay; j > 0; j--, t++) /* a hybrid's tokens its state goes through again */
                b->tok[t] = hist[q->len - j], b->pos[t] = q->len - j, b->slot[t] = q->seq;
            b->out_of[i] = n_out;
            for (int j = 0; j <= q->n_draft; j++, t++) {
                b->tok[t] = j ? q->draft[j - 1] : q->next, b->pos[t] = q->len + j, b->slot[t] = q->seq;
                b->out_rows[n_out++] = t;
            }
            continue;
        }
        const int32_t *fill = fill_tokens(q);
        for (int k = 0; k < b->take[i]; k++, t++)
            b->tok[t] = fill[q->prefilled + k], b->pos[t] = (int32_t)q->prefilled + k, b->slot[t] = q->seq;
        /* a resumed request already sampled its next token: no logits at the end */
        if (q->prefilled + b->take[i] == q->n_fill && !q->resume)
            b->out_of[i] = n_out, b->out_rows[n_out++] = t - 1;
    }
    const float *logits = NULL;
    hearth_error err = {0};
    int n_rows = 0; /* requests whose next token this step samples: b->rows, b->row_req */
    double t_step = gen_now_seconds();
    /* every row plain greedy on the GPU: the device picks the ids, no logits row comes back;
     * else every row within the device sampler's reach: it draws them all in one pass */
    int greedy = n_out > 0, dev = n_out > 0;
    for (int i = 0; (greedy || dev) && i < b->n_run; i++) {
        if (b->out_of[i] < 0) continue;
        const hearth_generate_params *p = b->run[i]->r.params;
        greedy = greedy && gen_device_greedy(b->e, p);
        /* a constrained row's mask follows its own tokens: the device masks its one row, a
         * proposal's rows (none on the GPU: propose skips device-sampled rows) the host */
        dev = dev && gen_device_sample(b->e, p) && !(b->run[i]->g.matcher && b->run[i]->n_draft);
        for (int j = 0; j <= b->run[i]->n_draft; j++) /* a proposal's rows: plain greedy ones only */
            b->dev_rows[b->out_of[i] + j] = (engine_sample_row){
                .p = &p->sampling, .seed = b->run[i]->dev_seed, .lp = gen_stream_lp(&b->run[i]->g),
                .allow = j == 0 && b->run[i]->g.matcher ? gen_stream_allow : NULL, .allow_ctx = &b->run[i]->g};
    }
    hearth_engine *mtp = engine_mtp(b->e);
    if (mtp) engine_step_hidden(b->e, NULL, b->mhid); /* the head reads the step's hidden rows */
    hearth_status st =
        greedy ? engine_forward_rows_greedy(b->e, T, b->tok, b->pos, b->slot, n_out, b->out_rows, b->greedy_ids, &err)
        : dev  ? engine_forward_rows_sample(b->e, T, b->tok, b->pos, b->slot, n_out, b->out_rows, b->dev_rows,
                                            b->greedy_ids, &err)
               : engine_forward_rows(b->e, T, b->tok, b->pos, b->slot, n_out, b->out_rows, &logits, &err);
    greedy |= dev; /* either way the ids are in b->greedy_ids */
    if (mtp) engine_step_hidden(b->e, NULL, NULL);
    record_step(b, T, gen_now_seconds() - t_step);
    size_t vocab = (size_t)hearth_model_vocab_rows(b->e);
    kv_cache *kv = engine_kv(b->e);
    /* walk backwards so finishing request i does not move the ones still to visit */
    for (int i = b->n_run - 1; i >= 0; i--) {
        sched_req *q = b->run[i];
        if (!b->take[i]) continue;
        if (st) {
            run_done(b, i, st, &err);
            continue;
        }
        hearth_generate_result *res = q->r.result;
        const hearth_generate_params *p = q->r.params;
        if (!q->decoding) {
            q->prefilled += (size_t)b->take[i];
            q->len += b->take[i];
            kv_prefix_commit(kv, q->seq, engine_history(b->e, q->seq), q->len); /* reusable from now on */
            hybrid_snapshot(b, q);
            if (q->resume) { /* recomputed what it had: decoding goes on with its pending token */
                if (q->prefilled == q->n_fill) free(q->resume), q->resume = NULL, q->decoding = 1;
                continue;
            }
            size_t n = q->r.n_prompt;
            if (p->on_progress && p->on_progress(q->r.user, q->prefilled < n ? q->prefilled : n - 1, n)) {
                res->finish = HEARTH_FINISH_CANCELLED;
                res->prompt_seconds = gen_now_seconds() - q->t0;
                run_done(b, i, HEARTH_OK, NULL);
                continue;
            }
            if (q->prefilled < n) continue;
            q->t1 = gen_now_seconds();
            res->prompt_seconds = q->t1 - q->t0;
        } else if (q->n_draft) {
            verify(b, i, logits, greedy);
            continue;
        } else {
            q->len++;
            q->n_replay = 0;                                                    /* fed again this step, with next */
            kv_prefix_commit(kv, q->seq, engine_history(b->e, q->seq), q->len); /* a later turn reuses it */
            hybrid_snapshot(b, q);
        }
        const float *row = greedy ? NULL : logits + (size_t)b->out_of[i] * vocab;
        b->row_req[n_rows] = q;
        b->rows[n_rows] = gen_stream_row(&q->g, engine_slot_sampler(b->e, q->seq), row, q->seq, q->len);
        if (greedy) b->rows[n_rows].token = b->greedy_ids[b->out_of[i]];
        n_rows++;
    }
    sample_and_accept(b, n_rows, greedy);
    if (mtp && !st) mtp_catch_up(b); /* the head takes the step's rows: the next step's first proposals */
    if (!st && T == n_dec_taken + drafted + replayed && n_dec_taken > 0) /* decode rows only */
        spec_cost_record(engine_spec_cost(b->e), n_dec_taken, drafted + replayed, gen_now_seconds() - t_begin);
    return b->n_waiting + (size_t)b->n_run;
}
