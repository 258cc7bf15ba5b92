/* kv_state.h: the recurrent-state pool of hybrid models (Qwen3.5's Gated DeltaNet layers),
 * beside the paged KV pool: per sequence slot and state layer, one fixed record of float32
 * (the causal conv's last inputs, then the delta-rule matrix of every value head). A
 * sequence's state is its slot's; it is overwritten from zero when the sequence's position
 * 0 is computed again (a new request, a preempted one recomputed), so freeing a slot needs
 * no work. Allocated once at engine start and touched then, so fit counts it exactly.
 * Knows nothing of models or backends. */
#ifndef HEARTH_KV_KV_STATE_H
#define HEARTH_KV_KV_STATE_H
#include "kv/kv_cache.h"

typedef struct kv_state {
    int n_layers;        /* state layers */
    size_t layer_floats; /* floats of one (slot, layer) record */
    float *data;         /* [max_slots][n_layers][layer_floats] */
} kv_state;

/* Bytes kv_state_attach allocates for these sizes (0 when n_layers is 0). */
size_t kv_state_bytes(int max_slots, int n_layers, size_t layer_floats);
/* Gives kv (its max_slots) a state pool of n_layers records of layer_floats per slot, zeroed. */
hearth_status kv_state_attach(kv_cache *kv, int n_layers, size_t layer_floats, hearth_error *err);
void kv_state_free(kv_cache *kv);
/* The record of (layer, slot). */
static inline float *kv_state_at(const kv_cache *kv, int layer, int slot) {
    const kv_state *s = kv->state;
    return s->data + ((size_t)slot * s->n_layers + layer) * s->layer_floats;
}
#endif
