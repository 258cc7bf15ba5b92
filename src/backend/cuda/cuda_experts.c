/* cuda_experts.c: the expert pool of --expert-offload (cuda_experts.h): pinned host copies
 * of expert slices, a device slot per recently used slice, LRU replacement. Host-side C:
 * allocations and stream-ordered copies only, no kernels, no family logic. */
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_experts.h"
#include "base/err.h"
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        hearth_status s_ = (call);                                                                                     \
        if (s_) return s_;                                                                                             \
    } while (0)

/* One offloaded slice: its pinned planes and the slot holding them (-1: none). */
typedef struct expert_rec {
    void *data, *scales;
    size_t data_bytes, scale_bytes;
    int slot;
} expert_rec;

/* The slices of one cuda_experts_offload call, found by the address of their cuda_weight. */
typedef struct expert_stack {
    const cuda_weight *ws;
    int n;
    expert_rec *recs;
} expert_stack;

struct cuda_experts {
    int n_slots;
    size_t data_bytes, scale_bytes;
    void **slot_data, **slot_scales;
    expert_rec **owner;       /* per slot: the slice it holds (NULL: empty) */
    unsigned long long *used; /* per slot: the tick of its last use (0: never) */
    unsigned long long tick;
    expert_stack *stacks;
    int n_stacks;
    long long hits, misses;
};

hearth_status cuda_experts_create(int slots, size_t data_bytes, size_t scale_bytes, cuda_experts **out,
                                  hearth_error *err) {
    *out = NULL;
    if (slots < 1) return err_set(err, HEARTH_ERR_INVALID, "cuda: an expert pool needs at least one slot");
    cuda_experts *x = calloc(1, sizeof *x);
    if (!x) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    x->n_slots = slots;
    x->data_bytes = data_bytes;
    x->scale_bytes = scale_bytes;
    x->slot_data = calloc((size_t)slots, sizeof *x->slot_data);
    x->slot_scales = calloc((size_t)slots, sizeof *x->slot_scales);
    x->owner = calloc((size_t)slots, sizeof *x->owner);
    x->used = calloc((size_t)slots, sizeof *x->used);
    hearth_status st = x->slot_data && x->slot_scales && x->owner && x->used
                           ? HEARTH_OK
                           : err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    /* each slot's planes in the order cuda_plan.c counts them: data, then scales */
    for (int s = 0; !st && s < slots; s++) {
        st = cuda_alloc(&x->slot_data[s], data_bytes, "expert pool slot", err);
        if (!st && scale_bytes) st = cuda_alloc(&x->slot_scales[s], scale_bytes, "expert pool slot scales", err);
    }
    if (st) {
        cuda_experts_free(x);
        return st;
    }
    *out = x;
    return HEARTH_OK;
}

/* Pinned host memory of `bytes` holding the device bytes at dev (NULL for 0 bytes). */
static hearth_status pin_copy(void **host, const void *dev, size_t bytes, hearth_error *err) {
    *host = NULL;
    if (!bytes) return HEARTH_OK;
    if (cudaMallocHost(host, bytes) != cudaSuccess) {
        cudaGetLastError();
        *host = NULL;
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate %zu bytes of pinned host memory for an expert",
                       bytes);
    }
    return cuda_download(*host, dev, bytes, err);
}

/* The record of slice w (NULL: not an offloaded slice). */
static expert_rec *find(const cuda_experts *x, const cuda_weight *w) {
    for (int i = 0; i < x->n_stacks; i++) {
        const expert_stack *s = &x->stacks[i];
        if ((uintptr_t)w >= (uintptr_t)s->ws && (uintptr_t)w < (uintptr_t)(s->ws + s->n)) return &s->recs[w - s->ws];
    }
    return NULL;
}

hearth_status cuda_experts_register(cuda_experts *x, const cuda_weight *ws, int n, hearth_error *err) {
    expert_stack *grown = realloc(x->stacks, (size_t)(x->n_stacks + 1) * sizeof *grown);
    if (!grown) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    x->stacks = grown;
    expert_rec *recs = calloc((size_t)n, sizeof *recs);
    if (!recs) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
    for (int e = 0; e < n; e++) recs[e].slot = -1;
    x->stacks[x->n_stacks++] = (expert_stack){ws, n, recs};
    return HEARTH_OK;
}

hearth_status cuda_experts_offload(cuda_experts *x, cuda_weight *w, size_t data_bytes, size_t scale_bytes,
                                   const char *what, hearth_error *err) {
    expert_rec *r = find(x, w);
    if (!r || r->data || r->scales) return err_set(err, HEARTH_ERR_INVALID, "cuda: %s: not a registered expert slice", what);
    /* the layout the plan sized the slots by must be what the upload made */
    if (data_bytes > x->data_bytes || scale_bytes > x->scale_bytes || !w->data || (scale_bytes != 0) != (w->scales != NULL) ||
        data_bytes + scale_bytes != w->bytes)
        return err_set(err, HEARTH_ERR_INVALID,
                       "cuda: %s: expert device layout of %zu + %zu bytes does not match the plan's (%zu bytes "
                       "uploaded, slots of %zu + %zu)",
                       what, data_bytes, scale_bytes, w->bytes, x->data_bytes, x->scale_bytes);
    TRY(cuda_sync(err)); /* the upload (and Q4_K's in-place repack) is done */
    r->data_bytes = data_bytes;
    r->scale_bytes = scale_bytes;
    TRY(pin_copy(&r->data, w->data, data_bytes, err));
    TRY(pin_copy(&r->scales, w->scales, scale_bytes, err));
    cuda_free(w->data);
    cuda_free(w->scales);
    w->data = w->scales = NULL;
    return HEARTH_OK;
}

hearth_status cuda_experts_use(cuda_experts *x, const cuda_weight *w, cuda_weight *out, hearth_error *err) {
    expert_rec *r = find(x, w);
    if (!r || !r->data) return err_set(err, HEARTH_ERR_INVALID, "cuda: an expert weight that was not offloaded");
    int s = r->slot;
    if (s >= 0) {
        x->hits++;
    } else { /* the least recently used slot (an empty one first: its tick is 0) */
        s = 0;
        for (int i = 1; i < x->n_slots; i++)
            if (x->used[i] < x->used[s]) s = i;
        if (x->owner[s]) x->owner[s]->slot = -1;
        x->owner[s] = NULL;
        /* queued after every launch already on the stream, so after the matmuls that read
         * the slot's previous slice */
        hearth_status st = cuda_upload_async(x->slot_data[s], r->data, r->data_bytes, err);
        if (!st && r->scale_bytes) st = cuda_upload_async(x->slot_scales[s], r->scales, r->scale_bytes, err);
        if (st) return st;
        x->owner[s] = r;
        r->slot = s;
        x->misses++;
    }
    x->used[s] = ++x->tick;
    *out = *w;
    out->data = x->slot_data[s];
    out->scales = r->scale_bytes ? x->slot_scales[s] : NULL;
    return HEARTH_OK;
}

void cuda_experts_stats(const cuda_experts *x, long long *hits, long long *misses) {
    *hits = x ? x->hits : 0;
    *misses = x ? x->misses : 0;
}

void cuda_experts_free(cuda_experts *x) {
    if (!x) return;
    for (int s = 0; s < x->n_slots; s++) {
        if (x->slot_data) cuda_free(x->slot_data[s]);
        if (x->slot_scales) cuda_free(x->slot_scales[s]);
    }
    for (int i = 0; i < x->n_stacks; i++) {
        for (int e = 0; e < x->stacks[i].n; e++) {
            if (x->stacks[i].recs[e].data) cudaFreeHost(x->stacks[i].recs[e].data);
            if (x->stacks[i].recs[e].scales) cudaFreeHost(x->stacks[i].recs[e].scales);
        }
        free(x->stacks[i].recs);
    }
    free(x->stacks);
    free(x->slot_data);
    free(x->slot_scales);
    free(x->owner);
    free(x->used);
    free(x);
}
#endif
