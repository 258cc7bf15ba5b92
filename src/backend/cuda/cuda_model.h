/* cuda_model.h: a loaded model resident on the GPU (weights uploaded once, device KV pool
 * and scratch allocated at start) and model_forward's contract run there: one ragged
 * batch step, logits of the requested rows copied back to the host. Declared for every
 * build; the functions exist only when the CUDA backend is compiled in (HEARTH_HAVE_CUDA). */
#ifndef HEARTH_BACKEND_CUDA_MODEL_H
#define HEARTH_BACKEND_CUDA_MODEL_H
#include "model/model.h"

typedef struct cuda_model cuda_model;

/* Uploads m's weights (every format: see cuda_weight_upload_any) and allocates a device
 * KV pool of kv's shape and quant (float32, int8 or fp8: cuda_kv) plus scratch for
 * max_tokens per step and max_out logits rows. HEARTH_CUDA_GEMM=f32 in the environment
 * selects exact f32 prefill GEMMs (parity checks) instead of bf16 tensor cores. *note (may
 * be NULL) gets a one-line summary. */
hearth_status cuda_model_create(const model *m, const kv_cache *kv, int max_tokens, int max_out, cuda_model **out,
                                char *note, size_t note_size, hearth_error *err);
void cuda_model_free(cuda_model *cm);
/* The host threads a step may use for its host work (the embedding rows of a prefill
 * chunk); NULL (the default): the calling thread alone. */
void cuda_model_set_threads(cuda_model *cm, threadpool *tp);
/* model_forward's contract (see model.h) on the device. The host kv supplies the block
 * tables and reserved lengths; keys and values live only in the device pool. */
hearth_status cuda_model_forward(cuda_model *cm, const kv_cache *kv, const model_batch *b, hearth_error *err);
/* The same step for greedy rows: b->logits is not written; ids[i] gets the first index of
 * the largest logit of row i (the sampler's greedy rule), chosen on the device, so only
 * n_out ids cross PCIe. A row with a non-finite logit fails with HEARTH_ERR_FORMAT, as the
 * engine's host-side check does. */
hearth_status cuda_model_forward_ids(cuda_model *cm, const kv_cache *kv, const model_batch *b, int32_t *ids,
                                     hearth_error *err);
/* The step with its n_out logits rows left on the device (cuda_model_device_logits, [n_out,
 * vocab]) and queued, not waited for: the device sampler (cuda_sample.h) runs next on the
 * same stream. b->logits is not written. */
hearth_status cuda_model_forward_keep(cuda_model *cm, const kv_cache *kv, const model_batch *b, hearth_error *err);
float *cuda_model_device_logits(cuda_model *cm);
/* kv_copy_rows in the model's device KV pool (a partial prefix match), ordered before the
 * next step on the backend's stream. */
hearth_status cuda_model_kv_copy(cuda_model *cm, int32_t src, int32_t dst, int rows, hearth_error *err);
/* Device bytes held (weights, KV pool, scratch). */
size_t cuda_model_device_bytes(const cuda_model *cm);
#endif
