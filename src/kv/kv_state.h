/* kv_state.h: the recurrent-state pool of hybrid models (Qwen3.5's Gated DeltaNet layers),
 * beside the paged KV pool: per sequence slot and state layer, one fixed record of float32
 * (the causal conv's last inputs, then the delta-rule matrix of every value head). A
 * sequence's state is its slot's; it is overwritten from zero when the sequence's position
 * 0 is computed again (a new request, a preempted one recomputed), so freeing a slot needs
 * no work.
 *
 * Prefix caching on hybrids: the state of a sequence after its first L tokens (L a multiple
 * of KV_BLOCK_SIZE) can be kept as a snapshot named by the chain hash of those tokens
 * (kv_block_hash from 0, block by block), in a fixed set of snapshot records reused least
 * recently used first. A new request whose first L tokens' KV blocks are cached and whose
 * state after them has a snapshot starts at L with that state. A "rolling" snapshot is the
 * one a decoding sequence overwrites at each block boundary (bounded memory: one record per
 * running sequence); it stays findable after the sequence ends until reused.
 *
 * Allocated once at engine start and touched then, so fit counts it exactly. Knows nothing
 * of models or backends. */
#ifndef HEARTH_KV_KV_STATE_H
#define HEARTH_KV_KV_STATE_H
#include "kv/kv_cache.h"

typedef struct kv_snap_meta {
    uint64_t hash, stamp; /* stamp 0: empty */
    int32_t len;          /* tokens the state has seen */
    int32_t roll_slot;    /* the slot whose next rolling snapshot overwrites it, or -1 */
} kv_snap_meta;

typedef struct kv_state {
    int n_layers;        /* state layers */
    size_t layer_floats; /* floats of one (slot, layer) record */
    float *data;         /* [max_slots][n_layers][layer_floats] */
    int n_snaps;
    int n_spec; /* the last n_spec records: speculation's backups (kv_state_reserve_spec), never named */
    kv_snap_meta *snap;
    float *snap_data; /* [n_snaps][n_layers][layer_floats] */
    uint64_t clock;
} kv_state;

/* Records kept back for speculative decoding: a row's state before a step that verifies
 * proposals, put back when some are rejected (at most this many rows speculate in a step). */
#define KV_STATE_SPEC_MAX 4
/* The most tokens of one row a speculating step carries (next and up to 8 proposals): what
 * a backend that journals a speculating row's Gated DeltaNet inputs keeps per record. */
#define KV_STATE_SPEC_TOKENS 9
static inline int kv_state_spec_records(int max_slots) {
    return max_slots < KV_STATE_SPEC_MAX ? max_slots : KV_STATE_SPEC_MAX;
}
/* Snapshot records an engine with max_slots sequences keeps: one rolling and one kept (a
 * prompt's end) per sequence, two more, and speculation's backups. */
static inline int kv_state_default_snaps(int max_slots) { return 2 * max_slots + 2 + kv_state_spec_records(max_slots); }
/* Bytes kv_state_attach allocates for these sizes (0 when n_layers is 0). */
size_t kv_state_bytes(int max_slots, int n_layers, size_t layer_floats, int n_snaps);
/* Gives kv (its max_slots) a state pool of n_layers records of layer_floats per slot and
 * n_snaps snapshot records, zeroed. */
hearth_status kv_state_attach(kv_cache *kv, int n_layers, size_t layer_floats, int n_snaps, hearth_error *err);
void kv_state_free(kv_cache *kv);
/* Keeps the last n of the snapshot records for speculation's backups (kv_state_spec_copy):
 * the prefix cache never names or reuses them. */
void kv_state_reserve_spec(kv_cache *kv, int n);
/* The snapshot record of backup j (< n_spec): its device copy is index max_slots + that. */
static inline int kv_state_spec_record(const kv_cache *kv, int j) { return kv->state->n_snaps - kv->state->n_spec + j; }
/* Copies slot's state into backup record j, or back (to_backup 0), in the host pool. */
void kv_state_spec_copy(kv_cache *kv, int slot, int j, int to_backup);
/* The record of (layer, slot). */
static inline float *kv_state_at(const kv_cache *kv, int layer, int slot) {
    const kv_state *s = kv->state;
    return s->data + ((size_t)slot * s->n_layers + layer) * s->layer_floats;
}
/* The chain hash of tokens[0..n) (n a multiple of KV_BLOCK_SIZE) that names a snapshot,
 * seeded with the prefix cache namespace ns (a request's adapters: kv_prefix_slot_namespace)
 * as the KV blocks' names are, so a state computed with adapters is never another's. */
uint64_t kv_state_chain_hash(uint64_t ns, const int32_t *tokens, int n);
/* Keeps slot's current state as the state after its first len tokens (named hash):
 * rolling overwrites the slot's previous rolling snapshot, else the least recently used
 * record is taken. A snapshot of the same name already kept is only refreshed. Returns the
 * record the state was copied into, or -1 (refreshed only, or no records). */
int kv_state_snap_save(kv_cache *kv, int slot, int len, uint64_t hash, int rolling);
/* Forgets snapshot i (its device copy failed). */
void kv_state_snap_drop(kv_cache *kv, int i);
/* The snapshot named hash after len tokens, or -1. */
int kv_state_snap_find(kv_cache *kv, int len, uint64_t hash);
/* Copies snapshot i into slot's state (and marks it recently used). */
void kv_state_snap_load(kv_cache *kv, int i, int slot);
/* The slot's sequence ended: its rolling snapshot becomes an ordinary one. */
void kv_state_slot_release(kv_cache *kv, int slot);
#endif
