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
    int max_out;    /* logits rows per step: max(ENGINE_MAX_LOGITS_ROWS, max_seqs) */
    size_t weights; /* the weight arena (model_load) */
    size_t kv;      /* the KV pool and its block tables */
    size_t scratch; /* activations and matmul scratch for the largest step */
    size_t buffers; /* step arrays, logits rows, token history, sequence flags */
    size_t sampler; /* the sampler's vocab-sized buffers */
} engine_plan;

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
