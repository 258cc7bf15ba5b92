/* engine_plan.h: the engine's sizing, one function shared by hearth_engine_create (which
 * allocates exactly what the plan says) and hearth_fit (which only predicts it), so the
 * two cannot drift apart. Allocates nothing. */
#ifndef HEARTH_ENGINE_ENGINE_PLAN_H
#define HEARTH_ENGINE_ENGINE_PLAN_H
#include "hearth.h"
#include <stddef.h>

struct model;

typedef struct engine_plan {
    int n_threads, context, step_tokens, max_seqs, n_blocks;
    int max_out;    /* logits rows per step: max(append_rows, max_seqs) */
    int append_rows; /* logits rows per hearth_seq_append: max(ENGINE_MAX_LOGITS_ROWS, max_logits_rows) */
    size_t weights; /* the weight arena (model_load) */
    size_t weights_load_peak; /* the arena + one tensor's file pages at the load's worst (model_load_peak_bytes) */
    size_t kv;      /* the KV pool and its block tables */
    size_t scratch; /* activations and matmul scratch for the largest step */
    size_t buffers; /* step arrays, logits rows, token history, sequence flags */
    size_t sampler; /* the sampler's vocab-sized buffers */
    int kv_cut_from; /* the default pool was cut from this many blocks to fit memory; 0: not cut */
    int context_cut_from; /* the default context (the model's) was cut from this to fit memory; 0: not cut */
} engine_plan;

/* The default KV pool (neither kv_blocks nor kv_budget_bytes given) holds every sequence's
 * whole context, cut where the engine would not fit in memory: on the host, to
 * engine_host_room() (MemAvailable less a tenth of MemTotal, read before the weights load);
 * on the GPU also to the device's free memory (engine_device_room). Never below one
 * context. The default context (context_length 0) is the model's own limit; where not even
 * one sequence of it fits, the largest context that does (the pool is then one context).
 * A model that does not fit with one block fails at allocation, and `hearth fit` says so
 * first. */
#define ENGINE_HOST_RESERVE_DIV 10
size_t engine_host_room(void); /* bytes; 0 when unknown (no cut) */
/* The options a draft model's engine is created with (--draft-model), beside a target
 * engine of plan p made from o: the target's context, sequences, step tokens and threads,
 * no speculation of its own, no expert offload. */
hearth_engine_options engine_draft_options(const hearth_engine_options *o, const engine_plan *p);
int engine_plan_is_auto(const hearth_engine_options *o);
/* Whether the weight matrices are used in place in the file mapping (use_mmap: 1 always, -1
 * never, 0 where the forward pass runs on the GPU, `device`: the device copy is the one the
 * steps read, so the host keeps no second one; each weight's file pages leave the process
 * once uploaded, op_model.release_host). */
static inline int engine_maps_weights(int use_mmap, int device) {
    return use_mmap > 0 || (use_mmap == 0 && device == HEARTH_DEVICE_CUDA);
}
typedef int (*engine_plan_fits_fn)(const struct model *m, const engine_plan *p, const void *arg);
/* engine_plan_make, then for the default pool the largest block count (one context at
 * least) whose plan `fits` says fits. */
hearth_status engine_plan_room(const struct model *m, const hearth_engine_options *o, engine_plan_fits_fn fits,
                               const void *arg, engine_plan *p, hearth_error *err);
/* engine_plan_room with the host rule: the plan's bytes within room (0: no cut). */
hearth_status engine_plan_host(const struct model *m, const hearth_engine_options *o, size_t room, engine_plan *p,
                               hearth_error *err);
/* The device's share: free bytes (with this process's CUDA context made) less a reserve
 * for cuBLAS workspaces, graphs and other processes: max(1 GiB, a twentieth of the total). */
size_t engine_device_room(size_t free_bytes, size_t total_bytes);
/* engine_plan_room with both rules: host bytes within host_room and the GPU's
 * (engine_device_plan_bytes) within dev_room; a room of 0 does not cut. */
hearth_status engine_plan_rooms(const struct model *m, const hearth_engine_options *o, size_t host_room,
                                size_t dev_room, engine_plan *p, hearth_error *err);

/* Resolves the options against the model (defaults, limits) and sizes every allocation
 * hearth_engine_create makes. m may come from model_plan (no weights loaded). */
hearth_status engine_plan_make(const struct model *m, const hearth_engine_options *o, engine_plan *p,
                               hearth_error *err);
/* Returns freed heap pages to the system (glibc), as engine creation does first: fit
 * calls it before reading the process's resident size so both start from the same state. */
void engine_trim_heap(void);
/* Sum of the plan's parts: what hearth_engine_bytes reports. */
size_t engine_plan_bytes(const engine_plan *p);
/* Bytes one decode step reads with `context` tokens cached (see hearth_engine_decode_bytes). */
double engine_decode_bytes(const struct model *m, int context, int kv_quant);
#endif
