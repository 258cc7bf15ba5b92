/* cuda_model.h: the CUDA backend of the op table (ops/ops.h): a model's items uploaded
 * once, a device KV pool and scratch allocated at start, and each step run on the GPU
 * (decode shapes through CUDA graphs). Declared for every build; the functions exist only
 * when the CUDA backend is compiled in (HEARTH_HAVE_CUDA). */
#ifndef HEARTH_BACKEND_CUDA_MODEL_H
#define HEARTH_BACKEND_CUDA_MODEL_H
#include "ops/ops.h"

/* Uploads every item of om (weights in every format: see cuda_weight_upload_any) and
 * allocates a device KV pool of kv's shape and quant (float32, f16, int8 or fp8: cuda_kv)
 * plus scratch for max_tokens per step and max_out logits rows. gemm_exact: f32 prefill
 * GEMMs and attention (the exact parity tier) instead of bf16 tensor cores. tp: host threads
 * for a step's host work (the embedding rows of a prefill chunk; NULL: the caller's).
 * expert_slots > 0 (--expert-offload): a mixture-of-experts model's expert slices are kept
 * in pinned host memory and copied into a device pool of that many slots as steps use
 * them (cuda_experts.h); ignored for a model without experts; 0: every slice resident.
 * *note (may be NULL) gets a one-line summary. */
hearth_status cuda_model_create(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int gemm_exact,
                                int expert_slots, threadpool *tp, op_backend **out, char *note, size_t note_size, hearth_error *err);
void cuda_model_free(op_backend *be);
/* After a step with OP_OUT_KEEP: its [n_out, vocab] logits on the device, queued (not
 * waited for), for the device sampler (cuda_sample.h) on the same stream. */
float *cuda_model_device_logits(op_backend *be);
/* With --expert-offload: slices the pool already held when a step used them (hits) and
 * copies to the device (misses), since creation; 0 and 0 without. */
void cuda_model_expert_stats(const op_backend *be, long long *hits, long long *misses);
/* Tests: 0 keeps every prefill step of a mixture of experts on the per-expert form, 1 (the
 * default) lets steps of more than CUDA_GRAPH_MAX_T tokens take the grouped expert GEMM. */
void cuda_model_force_moe_grouped(int on);
/* Device bytes held (weights, KV pool, scratch). */
size_t cuda_model_device_bytes(const op_backend *be);
#endif
