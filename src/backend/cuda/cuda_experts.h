/* cuda_experts.h: --expert-offload on the GPU: expert weight slices kept in pinned host
 * memory in their device layout, and a device pool of slots that a step's experts are
 * copied into before their matmuls (least recently used slot first). Every copy is queued
 * on the backend's one stream, so a slot is rewritten only after the matmuls already
 * queued on it. Knows weights, not models: no family logic. Exists with the CUDA backend
 * only (HEARTH_HAVE_CUDA). */
#ifndef HEARTH_BACKEND_CUDA_EXPERTS_H
#define HEARTH_BACKEND_CUDA_EXPERTS_H
#include "backend/cuda/cuda_backend.h"
#include <stddef.h>

typedef struct cuda_experts cuda_experts;

/* A pool of `slots` slots (at least 1), each with a data plane of data_bytes and, when
 * scale_bytes > 0, a scales plane of scale_bytes (cuda_plan.slot_*_bytes). */
hearth_status cuda_experts_create(int slots, size_t data_bytes, size_t scale_bytes, cuda_experts **out,
                                  hearth_error *err);
/* Registers the n slices ws[0..n) of one stacked-experts item (ws must outlive the pool);
 * each is then moved to the host by cuda_experts_offload right after its upload. */
hearth_status cuda_experts_register(cuda_experts *x, const cuda_weight *ws, int n, hearth_error *err);
/* Moves the uploaded slice w (registered) to the host: its device planes (data_bytes and
 * scale_bytes long: its device layout, cuda_weight_layout) copied into pinned host memory
 * and freed. w keeps its shape and layout flags with data and scales NULL. */
hearth_status cuda_experts_offload(cuda_experts *x, cuda_weight *w, size_t data_bytes, size_t scale_bytes,
                                   const char *what, hearth_error *err);
/* *out = w (a slice cuda_experts_offload moved) with data / scales in a slot, its bytes
 * copied there first unless the slot still holds them (queued, not waited for). */
hearth_status cuda_experts_use(cuda_experts *x, const cuda_weight *w, cuda_weight *out, hearth_error *err);
/* Slots found holding the slice (hits) and copies made (misses) since creation. */
void cuda_experts_stats(const cuda_experts *x, long long *hits, long long *misses);
void cuda_experts_free(cuda_experts *x);
#endif
