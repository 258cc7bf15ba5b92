/* cuda_lora_cache.h: the CUDA backend's side of LoRA / DoRA adapters: a device copy of each
 * adapter a step uses (made at its first use, found by op_adapter.key, the least recently
 * used dropped past CUDA_LORA_KEEP), the step's per-row adapter tables on the device, and
 * the launch of the low-rank update after a projection (cuda_lora.cu). Host-side C; knows
 * no model family and no registry (the engine mounts and unmounts). */
#ifndef HEARTH_BACKEND_CUDA_LORA_CACHE_H
#define HEARTH_BACKEND_CUDA_LORA_CACHE_H
#include "ops/ops.h"

/* Device copies kept beyond those the current step uses: the least recently used go first
 * (unmounted adapters' copies go earlier, through cuda_lora_cache_forget). 32 covers the
 * many-adapter serving case of issue 36 (8 adapters over 32 streams) with room to spare. */
#define CUDA_LORA_KEEP 32

typedef struct cuda_lora_cache cuda_lora_cache;

/* The buffers cuda_lora_cache_create makes for steps of up to max_tokens rows, in bytes:
 * each row's adapter table pointers and their count (each on the device and pinned on the
 * host), and the serving tier's rank values (device only). The one sizing the cache
 * allocates by and cuda_plan counts (cuda_plan.c: any build, no device needed). */
typedef struct cuda_lora_cache_sizes {
    size_t sets, counts, fast, groups;
} cuda_lora_cache_sizes;
void cuda_lora_cache_sizes_make(int max_tokens, cuda_lora_cache_sizes *z);

/* Allocates the row tables of steps of up to max_tokens rows and the fast tier's scratch
 * (cuda_plan.c counts them: lora_sets_bytes, lora_counts_bytes, lora_fast_bytes, and the
 * tables' pinned host copies in pinned_host); n_layers: the model's layers. */
hearth_status cuda_lora_cache_create(int n_layers, int max_tokens, cuda_lora_cache **out, hearth_error *err);
void cuda_lora_cache_free(cuda_lora_cache *c);
/* Before a step with adapters (op_batch_has_adapters): copies the adapters its rows use
 * that the device lacks and queues each row's list on the backend's stream from pinned
 * host copies, which the next call rewrites without waiting: call it once the previous
 * step's work is done (cu_step ends each step with a synchronization). */
hearth_status cuda_lora_cache_step(cuda_lora_cache *c, const op_batch *b, hearth_error *err);
/* ys[g][t] += the updates of projection p + g (g < np <= CUDA_LORA_MAX_GROUP: projections
 * that read the same input, q / k / v or gate / up) of model layer `layer` for the rows of
 * the step given to the last cuda_lora_cache_step (x [T, k] on the device, ys[g] [T, ns[g]]).
 * exact: the CPU's bits (cuda_lora_apply per projection, the --cuda-exact tier), else the
 * serving tier's kernels (cuda_lora_apply_fast, one launch pair for the np projections).
 * Launches only (no host wait, no allocation): graphs can hold it. */
hearth_status cuda_lora_cache_apply(const cuda_lora_cache *c, int T, int layer, op_proj p, int np, const float *x,
                                    int64_t k, float *const *ys, const int64_t *ns, int exact, hearth_error *err);
/* y[i] += the updates of expert `expert`'s pairs of projection p (OP_PROJ_EXP_*) of layer
 * `layer` for rows gathered for that expert: row i of x [n, k] / y [n, n_out] belongs to
 * step row rows[i] (device), whose adapters apply. Launches only. */
hearth_status cuda_lora_cache_apply_rows(const cuda_lora_cache *c, const int32_t *rows, int n, int layer, op_proj p,
                                         int expert, const float *x, int64_t k, float *y, int64_t n_out, int exact,
                                         hearth_error *err);
/* Drops the device copy of the adapter of this key, if there is one (after the stream's
 * work that may still read it). */
void cuda_lora_cache_forget(cuda_lora_cache *c, uint64_t key);
/* 1 when the last step given to cuda_lora_cache_step runs the serving tier's grouped
 * kernels (every row has at most one adapter and the step at most CUDA_LORA_FAST_ROWS rows:
 * its launches differ from the row-major ones, so a captured graph keys on it). */
int cuda_lora_cache_grouped(const cuda_lora_cache *c);
/* The adapters copied to the device now, and their device bytes. */
int cuda_lora_cache_count(const cuda_lora_cache *c);
size_t cuda_lora_cache_bytes(const cuda_lora_cache *c);
#endif
