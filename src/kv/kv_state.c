/* kv_state.c: the recurrent-state pool (see kv_state.h). */
#include "kv/kv_state.h"
#include "base/err.h"
#include <stdlib.h>
#include <string.h>

size_t kv_state_bytes(int max_slots, int n_layers, size_t layer_floats) {
    if (n_layers <= 0) return 0;
    return sizeof(kv_state) + (size_t)max_slots * n_layers * layer_floats * sizeof(float);
}

hearth_status kv_state_attach(kv_cache *kv, int n_layers, size_t layer_floats, hearth_error *err) {
    if (n_layers <= 0 || !layer_floats) return err_set(err, HEARTH_ERR_INVALID, "kv state: invalid sizes");
    kv_state *s = calloc(1, sizeof *s);
    size_t n = (size_t)kv->max_slots * n_layers * layer_floats;
    if (s) s->data = calloc(n, sizeof(float)); /* calloc'd pages are touched below: resident, as fit counts */
    if (!s || !s->data) {
        free(s);
        return err_set(err, HEARTH_ERR_NOMEM, "kv state: cannot allocate %.1f MiB",
                       (double)n * sizeof(float) / (1024.0 * 1024.0));
    }
    memset(s->data, 0, n * sizeof(float));
    s->n_layers = n_layers;
    s->layer_floats = layer_floats;
    kv->state = s;
    return HEARTH_OK;
}

void kv_state_free(kv_cache *kv) {
    if (!kv->state) return;
    free(kv->state->data);
    free(kv->state);
    kv->state = NULL;
}
