/* kv_state.c: the recurrent-state pool and its snapshots (see kv_state.h). */
#include "kv/kv_state.h"
#include "base/err.h"
#include "kv/kv_prefix.h"
#include <stdlib.h>
#include <string.h>

static size_t slot_floats(const kv_state *s) { return (size_t)s->n_layers * s->layer_floats; }

/* The records the prefix cache names and reuses: all but speculation's backups. */
static int named(const kv_state *s) { return s->n_snaps - s->n_spec; }

size_t kv_state_bytes(int max_slots, int n_layers, size_t layer_floats, int n_snaps) {
    if (n_layers <= 0) return 0;
    size_t per = (size_t)n_layers * layer_floats * sizeof(float);
    return sizeof(kv_state) + (size_t)max_slots * per + (size_t)n_snaps * (per + sizeof(kv_snap_meta));
}

hearth_status kv_state_attach(kv_cache *kv, int n_layers, size_t layer_floats, int n_snaps, hearth_error *err) {
    if (n_layers <= 0 || !layer_floats || n_snaps < 0) return err_set(err, HEARTH_ERR_INVALID, "kv state: invalid sizes");
    kv_state *s = calloc(1, sizeof *s);
    size_t per = (size_t)n_layers * layer_floats;
    if (s) {
        s->data = calloc((size_t)kv->max_slots * per, sizeof(float));
        s->snap = calloc((size_t)n_snaps + 1, sizeof *s->snap);
        s->snap_data = calloc((size_t)n_snaps * per + 1, sizeof(float));
    }
    if (!s || !s->data || !s->snap || !s->snap_data) {
        if (s) free(s->data), free(s->snap), free(s->snap_data);
        free(s);
        return err_set(err, HEARTH_ERR_NOMEM, "kv state: cannot allocate %.1f MiB",
                       (double)kv_state_bytes(kv->max_slots, n_layers, layer_floats, n_snaps) / (1024.0 * 1024.0));
    }
    /* resident from the start, as fit counts it */
    memset(s->data, 0, (size_t)kv->max_slots * per * sizeof(float));
    memset(s->snap_data, 0, (size_t)n_snaps * per * sizeof(float));
    s->n_layers = n_layers;
    s->layer_floats = layer_floats;
    s->n_snaps = n_snaps;
    for (int i = 0; i < n_snaps; i++) s->snap[i].roll_slot = -1;
    kv->state = s;
    return HEARTH_OK;
}

void kv_state_free(kv_cache *kv) {
    if (!kv->state) return;
    free(kv->state->data);
    free(kv->state->snap);
    free(kv->state->snap_data);
    free(kv->state);
    kv->state = NULL;
}

uint64_t kv_state_chain_hash(uint64_t ns, const int32_t *tokens, int n) {
    uint64_t h = ns;
    for (int i = 0; i + KV_BLOCK_SIZE <= n; i += KV_BLOCK_SIZE) h = kv_block_hash(h, tokens + i);
    return h;
}

int kv_state_snap_find(kv_cache *kv, int len, uint64_t hash) {
    kv_state *s = kv->state;
    for (int i = 0; s && i < named(s); i++)
        if (s->snap[i].stamp && s->snap[i].len == len && s->snap[i].hash == hash) return i;
    return -1;
}

int kv_state_snap_save(kv_cache *kv, int slot, int len, uint64_t hash, int rolling) {
    kv_state *s = kv->state;
    if (!s || named(s) <= 0) return -1;
    int i = kv_state_snap_find(kv, len, hash);
    if (i >= 0) { /* the same tokens give the same state: keep it, newer */
        s->snap[i].stamp = ++s->clock;
        return -1;
    }
    if (rolling)
        for (int j = 0; j < named(s) && i < 0; j++)
            if (s->snap[j].roll_slot == slot) i = j;
    int lru = -1;
    for (int j = 0; i < 0 && j < named(s); j++) /* least recently used, never another's rolling one */
        if (s->snap[j].roll_slot < 0 && (lru < 0 || s->snap[j].stamp < s->snap[lru].stamp)) lru = j;
    for (int j = 0; i < 0 && lru < 0 && j < named(s); j++)
        if (lru < 0 || s->snap[j].stamp < s->snap[lru].stamp) lru = j;
    if (i < 0) i = lru;
    if (i < 0) return -1;
    for (int j = 0; rolling && j < named(s); j++)
        if (s->snap[j].roll_slot == slot) s->snap[j].roll_slot = -1;
    memcpy(s->snap_data + (size_t)i * slot_floats(s), s->data + (size_t)slot * slot_floats(s),
           slot_floats(s) * sizeof(float));
    s->snap[i] = (kv_snap_meta){.hash = hash, .stamp = ++s->clock, .len = len, .roll_slot = rolling ? slot : -1};
    return i;
}

void kv_state_snap_drop(kv_cache *kv, int i) {
    kv->state->snap[i] = (kv_snap_meta){.roll_slot = -1};
}

void kv_state_snap_load(kv_cache *kv, int i, int slot) {
    kv_state *s = kv->state;
    memcpy(s->data + (size_t)slot * slot_floats(s), s->snap_data + (size_t)i * slot_floats(s),
           slot_floats(s) * sizeof(float));
    s->snap[i].stamp = ++s->clock;
}

void kv_state_reserve_spec(kv_cache *kv, int n) {
    kv_state *s = kv->state;
    if (s) s->n_spec = n < 0 ? 0 : n > s->n_snaps ? s->n_snaps : n;
}

void kv_state_spec_copy(kv_cache *kv, int slot, int j, int to_backup) {
    kv_state *s = kv->state;
    float *rec = s->snap_data + (size_t)kv_state_spec_record(kv, j) * slot_floats(s);
    float *at = s->data + (size_t)slot * slot_floats(s);
    memcpy(to_backup ? rec : at, to_backup ? at : rec, slot_floats(s) * sizeof(float));
}

void kv_state_slot_release(kv_cache *kv, int slot) {
    kv_state *s = kv->state;
    for (int i = 0; s && i < s->n_snaps; i++)
        if (s->snap[i].roll_slot == slot) s->snap[i].roll_slot = -1;
}
